"""pytest-benchmark as its users drive it (harness/ci/benchplugin.py, harness/ci/pairbench.py):
``--benchmark-compare`` warns only on a hardware or software change, ``--benchmark-compare-fail``
sees the router's own time, and the round options apply only when given.

Each test runs pytest in a subprocess against a benchmark storage in ``tmp_path``. Hostname and CPU
model are changed by a plugin loaded with ``-p`` (the patched machine info these checks need); the
slowdowns are planted through the fault hook (``ROUTERBENCH_FAULT=slow=MS:GLOB``). A timing decides
nothing finer than a planted delay of many times the step's median.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.ci.benchplugin import bench_rounds, check_options, given
from harness.stats.bootstrap import MIN_PAIRS_FOR_CI

ROOT = Path(__file__).resolve().parents[1]
WARNING = "machine_info is different"
REZERO = "fwd-d64L4-eager-rezero-vs-prenorm"
LAYERSCALE = "fwd-d64L4-eager-layerscale-vs-prenorm"

PATCH = textwrap.dedent('''
    """Patched machine: RB_HOST names the host, RB_CPU the CPU model, RB_CLOCK the SM clock."""
    import os, platform, socket
    if os.environ.get("RB_HOST"):
        socket.gethostname = platform.node = lambda: os.environ["RB_HOST"]
    if os.environ.get("RB_CPU"):
        import harness.ci.benchplugin as bp
        bp.cpu_model = lambda: os.environ["RB_CPU"]
    if os.environ.get("RB_CLOCK"):
        from harness.timing import noise
        noise.sm_clock_mhz = lambda device: float(os.environ["RB_CLOCK"])
''')


def _pytest(args, cwd, env=None, timeout=600):
    e = {k: v for k, v in os.environ.items() if k not in ("ROUTERBENCH_FAULT", "PYTEST_ADDOPTS")}
    e.update(PYTHONPATH=os.pathsep.join([str(cwd), str(ROOT)]), **(env or {}))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd, env=e,
                          capture_output=True, text=True, timeout=timeout)


def test_compare_warns_on_a_cpu_change_only(tmp_path):
    (tmp_path / "rbpatch.py").write_text(PATCH)
    (tmp_path / "test_tiny.py").write_text("def test_tiny(benchmark):\n    benchmark(sum, range(10))\n")
    store = ["--benchmark-storage", f"file://{tmp_path / 'store'}", "-p", "harness.ci.benchplugin", "-p", "rbpatch"]
    saved = _pytest(["test_tiny.py", "--benchmark-save", "base", *store], tmp_path,
                    {"RB_HOST": "host-a", "RB_CLOCK": "1500"})
    assert saved.returncode == 0, saved.stdout[-2000:] + saved.stderr[-2000:]
    stored = json.loads(next((tmp_path / "store").rglob("0001_base.json")).read_text())
    assert stored["machine_info"]["routerbench"] == 2 and "node" not in stored["machine_info"]
    # another host, another command line, another clock: the same machine for the comparison
    same = _pytest(["test_tiny.py", "-v", "--benchmark-compare", "0001", "--benchmark-disable-gc", *store],
                   tmp_path, {"RB_HOST": "host-b", "RB_CLOCK": "1980"})
    assert same.returncode == 0, same.stdout[-2000:]
    assert "0001_base" in same.stdout and WARNING not in same.stdout + same.stderr
    other = _pytest(["test_tiny.py", "--benchmark-compare", "0001", *store], tmp_path,
                    {"RB_HOST": "host-a", "RB_CPU": "Another CPU 9000"})
    assert other.returncode == 0 and WARNING in other.stdout + other.stderr
    assert "Another CPU 9000" in other.stdout + other.stderr


def _medians(path: Path) -> dict[str, tuple[float, float, float]]:
    """Benchmark name -> (recorded median ms, a_ms, b_ms)."""
    data = json.loads(path.read_text())
    return {b["name"].split("[")[1].rstrip("]"): (b["stats"]["median"] * 1e3, b["extra_info"]["a_ms"],
                                                  b["extra_info"]["b_ms"]) for b in data["benchmarks"]}


@pytest.mark.slow
def test_compare_fail_sees_the_router_alone_and_the_round_options_apply(tmp_path):
    store = ["tests/benchmarks", "--benchmark-only", "--bench-suite", "cpu", "-q",
             "--benchmark-storage", f"file://{tmp_path / 'store'}", "-k", f"{REZERO} or {LAYERSCALE}"]
    base = _pytest([*store, "--benchmark-save", "base", "--benchmark-json", str(tmp_path / "base.json"),
                    "--benchmark-min-rounds", "7", "--benchmark-max-time", "0.000001"], ROOT)
    assert base.returncode == 0, base.stdout[-3000:]
    data = json.loads((tmp_path / "base.json").read_text())
    assert [b["stats"]["rounds"] for b in data["benchmarks"]] == [7, 7]  # the given rounds, not the suite's
    assert all(b["extra_info"]["pairs"] == 7 for b in data["benchmarks"])
    med = _medians(tmp_path / "base.json")
    # the recorded time is the router's side: its median is the router's median of the pairs
    for name, (recorded, _, b_ms) in med.items():
        assert recorded == pytest.approx(b_ms, rel=0.5), name
    slow = max(1, round(3 * med[REZERO][0]))
    fail = ["--benchmark-compare", "0001", "--benchmark-compare-fail=median:100%"]
    out = _pytest([*store, *fail], ROOT, {"ROUTERBENCH_FAULT": f"slow={slow}:rezero|*"})
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "Performance has regressed" in text, text[-3000:]
    regressed = text.split("Performance has regressed:")[1].split("\n\n")[0]
    assert REZERO in regressed and LAYERSCALE not in regressed, regressed
    planted = 200  # ms, many times prenorm's step: timed untimed-by-pytest-benchmark in setup/teardown
    out = _pytest([*store, "--benchmark-json", str(tmp_path / "slow_prenorm.json")], ROOT,
                  {"ROUTERBENCH_FAULT": f"slow={planted}:prenorm|*"})
    assert out.returncode == 0, out.stdout[-3000:]
    moved = _medians(tmp_path / "slow_prenorm.json")
    for name, (recorded, a_ms, b_ms) in moved.items():
        assert a_ms > planted  # the fault was live on prenorm's side of every pair
        # within this run (two runs' medians are unpaired: a busy machine moves one by 50x): the
        # recorded time is the router's own, and holds none of prenorm's planted time
        assert abs(recorded - b_ms) < planted / 2, (name, recorded, b_ms)
        assert recorded < a_ms - planted / 2, (name, recorded, a_ms)


def test_round_options_below_the_pairs_a_ci_needs_are_refused_in_one_line():
    out = _pytest(["tests/benchmarks", "--benchmark-only", "--collect-only", "-q",
                   "--benchmark-min-rounds", str(MIN_PAIRS_FOR_CI - 1)], ROOT)
    assert out.returncode != 0
    err = [ln for ln in (out.stdout + out.stderr).splitlines() if "--benchmark-min-rounds" in ln]
    assert len(err) == 1 and f"at least {MIN_PAIRS_FOR_CI} pairs" in err[0], out.stdout + out.stderr


def _config(args, min_rounds=5, max_time=1.0, addopts=()):
    opts = {"benchmark_min_rounds": min_rounds, "benchmark_max_time": max_time}
    return SimpleNamespace(invocation_params=SimpleNamespace(args=tuple(args)), getini=lambda k: list(addopts),
                           getoption=lambda k: opts[k])


def test_bench_rounds_follow_pytest_benchmark_only_when_an_option_is_given(monkeypatch):
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    assert bench_rounds(_config(["tests/benchmarks"]), 15, 0.01) == 15  # defaults: the suite's rounds
    assert bench_rounds(_config(["--benchmark-max-time=2"], max_time=2.0), 15, 0.01) == 200
    assert bench_rounds(_config(["--benchmark-max-time", "0.001"], max_time=0.001), 15, 0.01) == MIN_PAIRS_FOR_CI
    assert bench_rounds(_config(["--benchmark-min-rounds", "40"], min_rounds=40), 15, 0.1) == 40
    assert bench_rounds(_config([], min_rounds=9, addopts=["--benchmark-min-rounds=9"]), 15, 1.0) == 9
    monkeypatch.setenv("PYTEST_ADDOPTS", "--benchmark-max-time 0.5")
    assert given(_config([]), "--benchmark-max-time") and not given(_config([]), "--benchmark-min-rounds")
    with pytest.raises(pytest.UsageError, match="--benchmark-min-rounds 2: .* at least"):
        check_options(_config(["--benchmark-min-rounds", "2"], min_rounds=2))
