"""Compile every kernel of routers/block/fused_kernels*.py, in every autotune config of
``routers.block.fused_launch.configs`` at every width of ``fused_launch.WIDTHS``, for an H100/H200 (``GPUTarget("cuda", 90, 32)``) with Triton's
bundled ptxas, no GPU needed, and print one JSON line per compile: kernel, num_warps, dtype, d,
shared memory (bytes), registers, stack frame and local memory (``cuobjdump -res-usage``).

Run without ``TRITON_INTERPRET`` (the interpreter replaces the kernels by Python functions):
``python tests/fused_compile.py [--d 1024 2048] [--dtypes bf16]``; tests/test_fused_compile.py runs it.

The shapes are the largest the kernels specialise on: a pool of n = 19 sources (wav_v1 at 12
layers in 6 blocks: 1 + 6·(1 + 2)), m = 8 queries, K = 2 detail kinds, 7 updates, every optional
input present (bias, valid mask, every query's gradients).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

N, M, K, U = 19, 8, 2, 7
#: every per-query tensor given (the most code a kernel specialises on)
ALL = (1 << M) - 1


def pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def signatures(dt: str, d: int) -> dict[str, tuple[dict, dict]]:
    """kernel → (signature, constexprs) at width d, dtype ``dt`` ("bf16" or "fp32")."""
    p, f = "*" + dt, "*fp32"
    bd, bk = pow2(d), pow2(max(K, 2))
    i32 = "i32"
    bm = max(1, min(pow2(M), 4096 // bd))  # routers.block.fused_launch.query_block
    rms = {"R": i32, "d": i32}
    return {
        "rms_match": ({"D": p, "C": p, "out": p, "scale": p, **rms, "eps": "fp32", "max_scale": "fp32", "R_BUCKET": i32,
                       "BLOCK_R": "constexpr", "BLOCK_D": "constexpr"}, {"BLOCK_R": max(1, min(16, 4096 // bd)), "BLOCK_D": bd}),
        "phase2_fwd": ({"o": p, "mx": f, "s": f, "q": f, "P": p, "u": p, "P_out": p, "details": (p,) * K,
                        "d_out": (p,) * K, "bias": f, "h": p, **rms, "eps": "fp32", "max_scale": "fp32",
                        "R_BUCKET": i32, "K": "constexpr", "CHAIN": "constexpr", "KD": "constexpr", "KLO": "constexpr",
                        "CSIGN": "constexpr", "HAS_BIAS": "constexpr", "BLOCK_K": "constexpr", "BLOCK_D": "constexpr"},
                       {"K": K, "CHAIN": True, "KD": K, "KLO": 0, "CSIGN": 1, "HAS_BIAS": True, "BLOCK_K": bk,
                        "BLOCK_D": bd}),
        "phase2_bwd": ({"g": p, "g_pn": p, "g_dn": (p,) * K, "h": p, "mx": f, "s": f, "q": f, "bias": f,
                        "updates": (p,) * U, "coef_t": p, "bits": "i64", "k_lo": i32, "n_kinds": i32, "g_o": p,
                        "g_s": f, "g_p": p, "g_d": p, "g_u": p, "part": f, **rms, "eps": "fp32", "max_scale": "fp32",
                        "rows_per_prog": i32, "boff": i32, "KT": i32, "R_BUCKET": i32, "K": "constexpr",
                        "U": "constexpr", "HAS_GPN": "constexpr", "KD": "constexpr", "KLO": "constexpr",
                        "CSIGN": "constexpr", "GD_BITS": "constexpr", "HAS_BIAS": "constexpr", "HAS_COEF_T": "constexpr",
                        "BLOCK_K": "constexpr", "BLOCK_KT": "constexpr", "BLOCK_D": "constexpr"},
                       {"K": K, "U": U, "HAS_GPN": True, "KD": K, "KLO": 0, "CSIGN": 1, "GD_BITS": (1 << K) - 1,
                        "HAS_BIAS": True, "HAS_COEF_T": True, "BLOCK_K": bk, "BLOCK_KT": bk, "BLOCK_D": bd}),
        "phase1_fwd": ({"values": (p,) * N, "q": p, "bias": p, "codes": "*i64", "valid": "*u8", "o": (p,) * M,
                        "mx": (f,) * M, "s": (f,) * M, "qc": (f,) * M, "inv": f, **rms, "eps": "fp32", "n_q": i32,
                        "KB": i32, "R_BUCKET": i32, "N": "constexpr", "NQ": "constexpr", "HAS_BIAS": "constexpr",
                        "QB": "constexpr", "HAS_VALID": "constexpr", "WRITE_O": "constexpr", "WRITE_Q": "constexpr",
                        "BLOCK_M": "constexpr", "BLOCK_D": "constexpr", "BLOCK_KB": "constexpr"},
                       {"N": N, "NQ": M, "HAS_BIAS": True, "QB": True, "HAS_VALID": True, "WRITE_O": True,
                        "WRITE_Q": True, "BLOCK_M": bm, "BLOCK_D": bd, "BLOCK_KB": bk}),
        "phase1_bwd_dot": ({"values": (p,) * N, "inv": f, "q": p, "bias": p, "codes": "*i64", "valid": "*u8",
                            "mx": (f,) * M, "s": (f,) * M, "g_o": (p,) * M, "g_dot": f, **rms, "n_q": i32, "KB": i32,
                            "R_BUCKET": i32, "N": "constexpr", "NQ": "constexpr", "HAS_BIAS": "constexpr",
                            "HAS_VALID": "constexpr", "GO_BITS": "constexpr", "BLOCK_M": "constexpr",
                            "BLOCK_D": "constexpr"},
                           {"N": N, "NQ": M, "HAS_BIAS": True, "HAS_VALID": True, "GO_BITS": ALL, "BLOCK_M": bm,
                            "BLOCK_D": bd}),
        "phase1_bwd": ({"values": (p,) * N, "inv": f, "q": p, "bias": p, "codes": "*i64", "valid": "*u8",
                        "mx": (f,) * M, "s": (f,) * M, "g_o": (p,) * M, "g_s": (f,) * M, "g_dot": f, "g_v": p,
                        "g_l": f, **rms, "n_q": i32, "KB": i32, "row0": i32, "RC": i32, "R_BUCKET": i32,
                        "N": "constexpr", "NQ": "constexpr", "HAS_BIAS": "constexpr", "HAS_VALID": "constexpr",
                        "GO_BITS": "constexpr", "GS_BITS": "constexpr", "BLOCK_M": "constexpr", "BLOCK_D": "constexpr"},
                       {"N": N, "NQ": M, "HAS_BIAS": True, "HAS_VALID": True, "GO_BITS": ALL, "GS_BITS": ALL,
                        "BLOCK_M": bm, "BLOCK_D": bd}),
        "phase1_bwd_q": ({"values": (p,) * N, "inv": f, "g_l": f, "g_qc": (f,) * M, "codes": "*i64", "part": f, **rms,
                          "n_q": i32, "KB": i32, "width": i32, "rows_per_prog": i32, "R_BUCKET": i32, "N": "constexpr",
                          "NQ": "constexpr", "GQ_BITS": "constexpr", "HAS_BIAS": "constexpr", "QB": "constexpr",
                          "BLOCK_M": "constexpr", "BLOCK_D": "constexpr", "BLOCK_KB": "constexpr"},
                         {"N": N, "NQ": M, "GQ_BITS": ALL, "HAS_BIAS": True, "QB": True, "BLOCK_M": bm, "BLOCK_D": bd,
                          "BLOCK_KB": bk}),
    }


def resources(cubin: bytes, cuobjdump: Path) -> dict[str, int]:
    """REG, STACK, SHARED and LOCAL of the one function in ``cubin`` (``cuobjdump -res-usage``)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        out = subprocess.run([str(cuobjdump), "-res-usage", fh.name], capture_output=True, text=True, check=True).stdout
    return {k.lower(): int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", out)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, nargs="+", default=None, help="widths (default: fused_launch.WIDTHS)")
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"])
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("fused_compile: unset TRITON_INTERPRET (the interpreter has no compiler)", file=sys.stderr)
        return 2
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from routers.block import fused_launch
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    target = GPUTarget("cuda", 90, 32)
    for d in args.d or fused_launch.WIDTHS:
        for dt in args.dtypes:
            for name, (sig, const) in signatures(dt, d).items():
                for warps in fused_launch.configs(name, d):
                    src = ASTSource(fn=getattr(fused_launch.kernels(), name), signature=sig, constexprs=const)
                    cc = triton.compile(src, target=target, options={"num_warps": warps, "num_stages": fused_launch.NUM_STAGES})
                    row = {"triton": triton.__version__, "kernel": name, "num_warps": warps, "dtype": dt, "d": d,
                           "shared_meta": cc.metadata.shared, **resources(cc.asm["cubin"], cuobjdump)}
                    print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
