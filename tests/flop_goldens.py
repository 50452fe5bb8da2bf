"""Each router's forward mixing FLOPs at L = 2, d = 8, B = 1, T = 2, derived by hand from
docs/FLOPS.md (FLOP = 2·FMA) and written out as arithmetic. One entry per registered router:
``tests/test_flops.py`` checks them against fvcore and ``tests/test_costs.py`` against each
router's ``analytic_fwd_flops``, and both fail for a router without one (DESIGN.md, "Where does it
go")."""

D = 8


# --- router mixing at L=2 (two blocks of one layer = 2 sublayers), d=8, T=2, B=1 ---------------
RM = 1 * 2                                    # tokens


def read(n, bias=False, gain=False):
    """FLOP of one depth-mix read over n sources (docs/FLOPS.md): keys 3d+2, logits 2d, softmax 5,
    weighted sum 2d per source and token; + d with a key gain; + 1 with a bias; n = 1 is free."""
    if n == 1:
        return 0
    return n * RM * (3 * D + 2 + 2 * D + 5 + 2 * D + (D if gain else 0) + (1 if bias else 0))


ADD = RM * D                                  # one (B, T, d) add / sub
MATCH = RM * (2 * (2 * D + 1) + 1 + 1 + 1 + D)  # rms_match: two rms, +ε, ÷, clamp, scale = 90

GOLDEN = {
    "prenorm": 4 * ADD,
    "rezero": 4 * 2 * ADD,
    "layerscale": 4 * 2 * ADD,
    # reads k0 [e], k1 [e,P], k2 [e,C1], k3 [e,C1,P], out [e,C1,C2]; writes P+=u at k1, k3
    "block_attnres": read(1) + read(2) + read(2) + read(3) + read(3) + 2 * ADD,
    # reads over [e], [e,u0], [e,u0,u1], …; one sublayer per block, so no add
    "full_attnres": read(1) + read(2) + read(3) + read(4) + read(5),
    # k1 read [e,P,P̃] (+match), k2 [e,C1,D̃1], k3 [e,C1,D̃1,P,P̃] (+match), out [e,C1,C2];
    # writes at k1: P+u, D−u, match; at k3: P+u only — its D−u and match are dead (no one
    # reads the last block's detail with the conservative readout) and the trace drops them.
    "haares": (read(3, bias=True) + MATCH + read(3, bias=True) + read(5, bias=True) + MATCH
               + read(3) + (ADD + ADD + MATCH) + ADD),
    # as haares with two detail kinds (phase, split)
    "wav_v1": (read(4, bias=True) + 2 * MATCH + read(4, bias=True) + read(7, bias=True) + 2 * MATCH
               + read(3) + (ADD + 2 * ADD + 2 * MATCH) + ADD),
    # n = 4 streams (docs/BASELINES.md "Cost per token"): per sublayer read 2nd, mix 2n²d, c⊗u and
    # the add 2nd; readout nd. dhc adds per sublayer LayerNorm n(7d+2), projection 2n(n+2)d,
    # tanh, scale n(n+2) each, + α⁰ n(n+1), + B n; mhc r 2nd+2, x̃φ 2n²(n+2)d, 3(n²+2n), two
    # sigmoids and ·post_mult 9n, Sinkhorn 3n² + 20(4n²+2n).
    "shc": RM * (4 * (2 * 16 + 16) * D + 4 * D),
    "dhc": RM * (4 * ((2 * 16 + 16) * D + 4 * (7 * D + 2) + 2 * 4 * 6 * D + 24 + 24 + 20 + 4) + 4 * D),
    "mhc": RM * (4 * ((2 * 16 + 16) * D + 2 * 4 * D + 2 + 2 * 16 * 6 * D + 3 * 24 + 36
                      + 3 * 16 + 20 * (4 * 16 + 8)) + 4 * D),
    # every write's add (4d) and DWAs over [x0, x1] (2·2d) and [x0, x1, x2] (2·3d)
    "denseformer": RM * (4 * D + 4 * D + 6 * D),
}
