"""A plugin impl plugs into a built-in family: the block family's naive schedule takes its depth
mixer (docs/PLUGINS.md, docs/IMPLS.md). Loaded from a file outside the repository, it is listed
with its origin, checked against the family's reference impl, and refused where it is wrong."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: A depth mixer written apart from routers/mixer.py: softmax over the RMS-normed sources, plain ops.
MIX = '''
import torch
from routers.api import Impl, register_impl

ROUTERBENCH_API_VERSION = 1


def mix(sources, query, bias, key_gain, eps):
    """softmax_j(<rmsnorm(V_j) * g, w> + b_j) V_j over the stacked sources."""
    if len(sources) == 1:
        return sources[0]
    v = torch.stack(tuple(sources))
    acc = torch.float32 if v.dtype.itemsize < 4 else v.dtype
    v32 = v.to(acc)
    keys = v32 / torch.sqrt(v32.pow(2).mean(-1, keepdim=True) + eps)
    if key_gain is not None:
        keys = keys * key_gain.to(acc)
    logits = (keys * query.to(acc)).sum(-1)
    if bias is not None:
        logits = logits + bias.to(acc)[:, None, None]
    alpha = torch.softmax(logits, dim=0)
    return (alpha.unsqueeze(-1) * v32).sum(0).to(v.dtype)

SCALE

register_impl(Impl("my_mix", ("block_attnres", "full_attnres"), "naive", mix=mix,
                   conventions="a plugin's depth mixer in plain torch ops"))
'''


def _plugin(tmp_path: Path, scale: str = "") -> Path:
    f = tmp_path / "my_mix.py"
    f.write_text(textwrap.dedent(MIX).replace("SCALE", scale))
    return f


def _cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_plugin_impl_is_listed_with_its_origin(tmp_path):
    f = _plugin(tmp_path)
    out = _cli("--plugin", str(f), "list")
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.strip().startswith("my_mix"))
    assert f"[file {f}]" in line and "block " in line and "naive" in line
    router_line = next(x for x in out.stdout.splitlines() if x.strip().startswith("block_attnres"))
    assert "my_mix" in router_line.split("impls=")[1].split()[0]
    assert "[built-in]" in next(x for x in out.stdout.splitlines() if x.strip().startswith("two_phase"))


@pytest.mark.slow
def test_plugin_impl_passes_check_against_naive(tmp_path):
    out = _cli("--plugin", str(_plugin(tmp_path)), "check", "block_attnres", "--impl", "my_mix")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "reference" in out.stdout and "FAIL" not in out.stdout.upper().replace("FAILURE", "")


@pytest.mark.slow
def test_a_wrong_plugin_impl_fails_check(tmp_path):
    # a planted bug: the mix scales its output by 1.01 (a wrong normalisation)
    bad = _plugin(tmp_path, scale="_mix = mix\nmix = lambda *a: _mix(*a) * 1.01")
    out = _cli("--plugin", str(bad), "check", "my_mix")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "reference" in out.stdout


def test_plugin_impl_of_no_family_is_refused(tmp_path):
    f = tmp_path / "bad_impl.py"
    f.write_text(textwrap.dedent(MIX).replace("SCALE", "").replace('("block_attnres", "full_attnres")', '("prenorm",)'))
    out = _cli("--plugin", str(f), "list")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"plugin {f}" in lines[0] and "family" in lines[0]
    assert "ROUTERBENCH_PLUGINS=none" in lines[0]
