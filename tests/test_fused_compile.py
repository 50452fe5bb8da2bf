"""The ``fused`` kernels compile for sm_90 (H100/H200) on a machine without a GPU, in every
autotune config at every width they are offered for, within the SM's shared memory and without a
stack frame (no register spill): tests/fused_compile.py compiles them with Triton's bundled ptxas
in a subprocess without ``TRITON_INTERPRET`` (the interpreter has no compiler), reading each
kernel's resources back with ``cuobjdump -res-usage``.

``make test-kernels`` runs this under the kernels extra's triton (3.7.1), ``make test-torch`` under
the triton that torch 2.11 brings (3.6.0).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed: make test-kernels installs the kernels extra and runs this",
                allow_module_level=True)

from routers.block import fused_launch  # noqa: E402

#: shared memory an sm_90 block may use (227 KiB)
SM90_SHARED = 232_448
SCRIPT = Path(__file__).with_name("fused_compile.py")


@pytest.fixture(scope="module")
def compiled() -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_every_config_compiles_for_sm90_without_spills(compiled):
    want = {(k, w, dt, d) for d in fused_launch.WIDTHS for k, _ in fused_launch.CONFIGS.items() for w in fused_launch.configs(k, d)
            for dt in ("bf16", "fp32")}
    got = {(r["kernel"], r["num_warps"], r["dtype"], r["d"]) for r in compiled}
    assert got == want
    bad = [r for r in compiled if r["stack"] or r["local"] or r["shared_meta"] + r["shared"] > SM90_SHARED]
    assert not bad, "\n".join(json.dumps(r) for r in bad)
    assert all(len(fused_launch.configs(k, d)) <= 4 for k in fused_launch.CONFIGS for d in fused_launch.WIDTHS)


def test_a_width_past_the_checked_ones_is_refused_with_the_option_to_change():
    from routers import build_router
    from routers.errors import ConfigError
    with pytest.raises(ConfigError, match="--impls"):
        build_router("haares", 2 * fused_launch.MAX_D, 2, impl="fused")
