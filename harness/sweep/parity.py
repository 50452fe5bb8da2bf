"""Parity before timing: an implementation of a router (any router of a family of
``routers/impls.py``: the block routers and the stream routers) is checked against ``naive`` on the
case it is about to be timed on, and never timed when it disagrees.

A benchmark that times a wrong kernel publishes a wrong winner; the peers' trackers show how
kernels go wrong (sources past 32 silently dropped and a backward reading uninitialised memory,
Liger-Kernel#1344; a wrong single-source read, FLA#883; outputs in bf16 whatever the input
dtype). So, for the case's router, options, width, depth, batch, sequence length, dtype and
device, :func:`router_parity`:

1. builds the router twice, ``naive`` and the impl under test, with the case's options (which
   carry the conventions the peer declares, ``routers.impls.case_options``) and the same
   **random** parameters (:func:`_randomise`: far from the init, where a wrong convention could
   hide: zero pseudo-queries make every mix uniform, mHC's A.6 bias makes H_res nearly I, so H_res
   and H_resᵀ would agree);
2. runs the router contract (``init_state``, then ``read`` / ``write`` per sublayer with a fixed
   random nonlinear sublayer ``u = tanh(h W_k)``, then ``output``) on a fresh random embedding,
   forward and, for modes with a backward, backward of a fixed random projection of the output;
3. compares the output, its dtype, and the gradients of the embedding, the pseudo-queries (and
   key gains and detail biases where the router has them) with a tolerance per dtype
   (:data:`TOLERANCES`; ‖test − naive‖ / ‖naive‖ per quantity; in float16 and bfloat16 both
   sides are compared with naive in float64 and the impl may err by three times naive's own
   error plus a floor, so a 3 % error, one source of 33 dropped, cannot hide in bfloat16 rounding), checks
   that the inputs are unchanged after the call and that nothing is NaN;
4. on CUDA runs the impl twice with uninitialised memory filled with NaN
   (``torch.utils.deterministic.fill_uninitialized_memory`` under deterministic algorithms), so an
   output or gradient the kernel never writes cannot pass.

:func:`check_parity` calls it before an impl other than ``naive`` is timed
(:func:`harness.sweep.prepare.prepare_case`): the
result is a ``parity_error`` row (the largest relative error), and a failure an ``error`` row
``parity failed: …`` instead of any timing.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Iterator

import torch

from harness.rundir.writer import StagingWriter
from routers import build_router, impls, route

from .cases import Case

#: Units of the dtype's rounding (the unit roundoff ``torch.finfo(dtype).eps / 2``: 2⁻⁸ in bfloat16,
#: 2⁻¹¹ in float16) in the low-precision floor.
FLOOR_UNITS = 3
#: Largest relative error (‖test − naive‖ / ‖naive‖ per quantity) allowed per dtype. For
#: float16 and bfloat16 the value is a floor (:data:`FLOOR_UNITS` units of the dtype's rounding,
#: 1.2e-2 in bfloat16, 1.5e-3 in float16; at 2.3e-2 a kernel dropping one source of 33 passed a
#: forward check at d=32, T=8): both the impl and naive are compared with naive in
#: float64, and the impl may err by at most :data:`LOW_PRECISION_FACTOR` times naive's own error
#: plus this floor. Naive computes each read in float32 (``routers.mixer.depth_mix``), so its own
#: error is about the rounding of its outputs.
TOLERANCES: dict[torch.dtype, float] = {torch.float64: 1e-9, torch.float32: 1e-4,
                                        torch.float16: FLOOR_UNITS * torch.finfo(torch.float16).eps / 2,
                                        torch.bfloat16: FLOOR_UNITS * torch.finfo(torch.bfloat16).eps / 2}
#: In float16 and bfloat16 an impl may err by this many times naive's own error (against float64)
#: plus the floor: a schedule that keeps intermediates in the low dtype (two_phase's partial
#: outputs) rounds more often than naive, by up to about 3x on this project's checks.
LOW_PRECISION_FACTOR = 3.0
LOW_PRECISION = (torch.float16, torch.bfloat16)
#: Modes whose step runs a backward (their parity checks the gradients too).
BACKWARD_MODES = ("fwd_bwd", "train_step")


@dataclass
class ParityResult:
    """The outcome of one parity check.

    Attributes:
        impl: the implementation checked.
        max_rel_err: the largest relative error over every compared quantity (NaN when a
            quantity is NaN).
        worst: the quantity where it is largest (``output``, ``grad embedding``, …).
        tolerance: what ``worst`` was allowed (:data:`TOLERANCES`; in float16 and bfloat16
            :data:`LOW_PRECISION_FACTOR` times naive's own error against float64 plus the floor).
        problems: everything wrong besides the error size (dtype, changed inputs, NaN).
    """

    impl: str
    max_rel_err: float
    worst: str
    tolerance: float
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and self.max_rel_err <= self.tolerance

    def message(self) -> str:
        """``parity failed: max rel err 3.1e-01 (output) > 1e-04 …`` (or ``parity ok: …``)."""
        head = (f"max rel err {self.max_rel_err:.2e} ({self.worst}) "
                f"{'>' if self.max_rel_err > self.tolerance or math.isnan(self.max_rel_err) else '<='} "
                f"{self.tolerance:.1e} against naive")
        return ("parity ok: " if self.ok else "parity failed: ") + "; ".join([head, *self.problems])


#: Random parameter values of the parity check, by parameter name: noise N(0, 1) of the
#: parameter's shape and the width d → value. Block routers: pseudo-queries N(0, 4/d), key gains
#: 1 + N(0, 0.04), detail biases N(−1, 1). Stream routers: mHC's φ N(0, 1/(nd)) (logits of order 1),
#: b N(0, 1) (H_res far from I), α 0.5 + N(0, 0.01); HC's α⁰ and B their init + N(0, 0.25), the
#: dynamic projections N(0, 1/d), their scales 0.3 + N(0, 0.01). Any other: its value + N(0, 0.01).
RANDOM = {
    "pseudo_query": lambda z, d: z * (2 / math.sqrt(d)),
    "key_gain": lambda z, d: 1 + 0.2 * z,
    "detail_bias": lambda z, d: z - 1,
    "phi": lambda z, d: z / math.sqrt(z.shape[-2]),
    "bias": lambda z, d: z,
    "alpha": lambda z, d: 0.5 + 0.1 * z,
    "dynamic_alpha_fn": lambda z, d: z / math.sqrt(d),
    "dynamic_beta_fn": lambda z, d: z / math.sqrt(d),
    "dynamic_alpha_scale": lambda z, d: 0.3 + 0.1 * z,
    "dynamic_beta_scale": lambda z, d: 0.3 + 0.1 * z,
}
#: Parameters randomised around their init (HC's static coefficients: the home stream stays visible).
AROUND_INIT = {"static_alpha": 0.5, "static_beta": 0.5}


def _randomise(router: torch.nn.Module, d: int, gen: torch.Generator) -> None:
    """Random parameters (:data:`RANDOM`, :data:`AROUND_INIT`), in place."""
    with torch.no_grad():
        for name, p in router.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            key = name.rsplit(".", 1)[-1]
            if key in RANDOM:
                value = RANDOM[key](noise, d)
            else:
                value = p.detach().double() + AROUND_INIT.get(name, 0.1) * noise
            p.copy_(value.to(p.dtype))


@contextlib.contextmanager
def _nan_filled_memory(device: torch.device) -> Iterator[None]:
    """On CUDA: deterministic algorithms with uninitialised memory filled with NaN (restored after)."""
    if device.type != "cuda":
        yield
        return
    import torch.utils.deterministic as det
    was_det, was_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = det.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    det.fill_uninitialized_memory = True
    try:
        yield
    finally:
        det.fill_uninitialized_memory = was_fill
        torch.use_deterministic_algorithms(was_det, warn_only=was_warn)


def _run(router, e: torch.Tensor, weights: list[torch.Tensor], probe: torch.Tensor,
         backward: bool) -> dict[str, torch.Tensor]:
    """The router contract on ``e`` with sublayers ``tanh(h W_k)``; output and gradients."""
    e = e.detach().clone().requires_grad_(backward)
    before = e.detach().clone()
    params = {n: p for n, p in router.named_parameters()}
    for p in params.values():
        p.grad = None
    _, out, _ = route(router, e, lambda slot, h: torch.tanh(h @ weights[slot.index]))
    got = {"output": out.detach().clone(), "inputs changed": torch.tensor(not torch.equal(e.detach(), before))}
    if backward:
        (out.float() * probe).sum().backward()
        got["grad embedding"] = e.grad.detach().clone()
        for n, p in params.items():
            if p.grad is not None:
                got[f"grad {n}"] = p.grad.detach().clone()
    return got


def router_parity(router: str, options: dict, impl: str, d_model: int, n_layers: int,
                  batch_size: int, seq_len: int, dtype: torch.dtype, device: torch.device | str,
                  backward: bool = True, seed: int = 0) -> ParityResult:
    """Check ``impl`` of ``router`` against ``naive`` (module doc).

    Args:
        router, options: the router and its options (without ``impl``).
        impl: the implementation under test.
        d_model, n_layers, batch_size, seq_len: the case's shape (B, T, d; 2L sublayers).
        dtype, device: the case's.
        backward: compare gradients too (modes ``fwd_bwd``, ``train_step``).
        seed: of the random parameters and inputs.

    Returns:
        the :class:`ParityResult`.

    Raises:
        ConfigError: an unknown router, option or impl (from ``build_router``).
    """
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    opts = {k: v for k, v in options.items() if k != "impl"}
    ref = build_router(router, d_model, n_layers, **opts, impl=impls.REFERENCE)
    test = build_router(router, d_model, n_layers, **opts, impl=impl)
    _randomise(ref, d_model, gen)
    test.load_state_dict(ref.state_dict())
    ref, test = ref.to(device=device, dtype=dtype), test.to(device=device, dtype=dtype)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(device=device, dtype=dtype)
    e = rnd(batch_size, seq_len, d_model)
    weights = [rnd(d_model, d_model, scale=1 / math.sqrt(d_model)) for _ in range(2 * n_layers)]
    probe = rnd(batch_size, seq_len, d_model).float()
    keep = [e.clone(), *(w.clone() for w in weights)]
    want = _run(ref, e, weights, probe, backward)
    want.pop("inputs changed")
    allowed = {name: TOLERANCES.get(dtype, 1e-4) for name in want}
    want_dtype = want["output"].dtype
    if dtype in LOW_PRECISION:  # judge both against naive in float64 on the same values
        ref64 = ref.to(torch.float64)
        naive = want
        want = _run(ref64, e.double(), [w.double() for w in weights], probe.double(), backward)
        want.pop("inputs changed")
        for name, t in naive.items():
            allowed[name] = LOW_PRECISION_FACTOR * _rel(t, want[name]) + TOLERANCES[dtype]
    tries = 2 if device.type == "cuda" else 1
    problems: list[str] = []
    worst, err, tol = "output", 0.0, allowed["output"]
    with _nan_filled_memory(device):
        runs = [_run(test, e, weights, probe, backward) for _ in range(tries)]
    if not all(torch.equal(a, b) for a, b in zip(keep, [e, *weights])):
        problems.append("the impl changed its inputs")
    for got in runs:
        if bool(got.pop("inputs changed")):
            problems.append("the impl changed its inputs")
        if got["output"].dtype != want_dtype:
            problems.append(f"output dtype {got['output'].dtype}, naive gives {want_dtype}")
        for name, ref_t in want.items():
            t = got.get(name)
            if t is None:
                problems.append(f"no {name}")
                continue
            a, b = t.double(), ref_t.double()
            if not torch.isfinite(a).all():
                problems.append(f"non-finite {name}")
                e_q = float("nan")
            else:
                e_q = _rel(a, b)
            # the worst quantity is the one nearest (or furthest past) its allowance
            if math.isnan(e_q) or e_q / allowed[name] > err / tol:
                worst, err, tol = name, e_q, allowed[name]
                if math.isnan(e_q):
                    break
    return ParityResult(impl, err, worst, tol, list(dict.fromkeys(problems)))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ (Frobenius, float64; 0 when both are 0): the error of the whole tensor, not
    of its single worst element, so low-precision rounding of a few elements does not decide."""
    a, b = a.double(), b.double()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30))


#: Tokens of the one sequence a parity check runs (the case's width, depth and dtype).
PARITY_TOKENS = 128


#: Parity results of this process, per router, options, impl, shape, dtype, device and backward.
_PARITY: dict[tuple, object] = {}


def parity_tokens(case: Case, device: torch.device) -> int:
    """Tokens of the one sequence ``case``'s parity check runs: :data:`PARITY_TOKENS` at most, as a
    router mixes over depth per token; but ``fused`` on CUDA at the case's own B·T, and at least
    2 × ``MAX_PROGRAMS`` + 1 rows, so its kernels run the row loop and the tuned configs they will
    be timed with (``routers.block.fused_launch``: phase 2's backward takes several rows per
    program past ``MAX_PROGRAMS`` rows, and the autotuner keys on the row bucket)."""
    cfg = case.cfg
    own = impls.attribute(case.impl, "parity_tokens")  # fused on CUDA (routers.impls.Impl.parity_tokens)
    tokens = own(cfg.batch_size * cfg.seq_len, device.type) if own is not None else None
    return tokens if tokens is not None else min(cfg.seq_len, PARITY_TOKENS)


def needs_parity(case: Case) -> bool:
    """Whether :func:`check_parity` checks ``case``: an impl other than ``naive`` of a router of a
    family (``routers.impls.FAMILIES``)."""
    return impls.family_of(case.router) is not None and case.impl != impls.REFERENCE


def check_parity(case: Case, device: torch.device, w: StagingWriter) -> str | None:
    """Before an impl other than ``naive`` of a router with impls is timed, check it against ``naive``
    at the case's width, depth, dtype and device on one sequence of :func:`parity_tokens` tokens (at
    most :data:`PARITY_TOKENS`, but ``fused`` on CUDA at its own rows) (:func:`router_parity`; once per router, options,
    impl, shape, dtype, device and backward in a process). Writes a ``parity_error`` row (the largest
    relative error; unit ``rel``) and, on failure, the case's ``error`` row ``parity failed: …``.

    Returns:
        None when the case may be timed, else why not (``parity failed: …``).
    """
    if not needs_parity(case):
        return None
    cfg, backward = case.cfg, case.mode in BACKWARD_MODES
    # The router mixes over depth per token: one sequence of at most PARITY_TOKENS tokens has every
    # source count, width and dtype of the case at a fraction of its memory (naive runs in float64);
    # fused on CUDA runs at the case's own rows (parity_tokens)
    tokens = parity_tokens(case, device)
    key = (case.router, case.options_json, case.impl, cfg.d_model, cfg.n_layers, tokens,
           cfg.dtype, str(device), backward)
    if key not in _PARITY:
        _PARITY[key] = router_parity(case.router, case.options, case.impl, cfg.d_model, cfg.n_layers,
                                     1, tokens, cfg.torch_dtype, device, backward)
    res = _PARITY[key]
    cols = case.columns()
    w.write(**cols, metric="parity_error", value=res.max_rel_err if res.max_rel_err == res.max_rel_err else None,
            unit="rel", status="ok" if res.ok else "error", error=None if res.ok else res.message())
    if not res.ok:
        w.write(**cols, metric="step_time", unit="ms", status="error", error=res.message())
    return None if res.ok else res.message()
