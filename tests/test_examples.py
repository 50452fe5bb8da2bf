"""A router of one's own, as a researcher meets it (docs/PLUGINS.md): the example package
``examples/gated_residual`` and what ``routerbench new router NAME`` writes, installed (pip
``--target`` a temporary folder, never the project's environment) and found through their
``routerbench.routers`` entry point by ``list`` and ``run``; installing one changes nothing the
project's own tests collect; and routerbench's opt-in pytest plugin (``harness.ci.pairplugin``)
benchmarks a router paired with prenorm in a test outside the project, judged by ``gate``.

Every command runs in a subprocess with ``PYTHONPATH=TARGET:repo``, as an installed package is seen.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.cli.template import class_name, dist_name, render

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "gated_residual"
#: What pip or Python leave in a package's source folder (git-ignored): not part of the example.
BUILD_LEFTOVERS = ("build", "*.egg-info", "__pycache__")
#: The smallest `run` (one group of prenorm and the router, eager fwd, 5 pairs), with its report.
TINY_RUN = ["--widths", "16", "--depths", "2", "--n-heads", "2", "--seq-len", "8", "--batch-size", "2",
            "--modes", "fwd", "--backends", "eager", "--smallest-backends", "", "--impls", "naive",
            "--no-train", "--no-flops", "--repeats", "5", "--max-attempts", "1", "--warmup-s", "0",
            "--remeasure-s", "0", "--quiet"]


def _env(*paths: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ROUTERBENCH_PLUGINS", "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(ROOT)])
    env["OMP_NUM_THREADS"] = "1"
    return {**env, **extra}


def _run(args: list[str], *paths: Path, cwd: Path = ROOT, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=_env(*paths, **extra), capture_output=True,
                          text=True, timeout=300)


def install(src: Path, target: Path) -> Path:
    """``pip install --no-deps --no-build-isolation --no-index --target target`` of a copy of ``src``
    (pip builds in its source folder: the copy keeps ``src`` clean). Offline, seconds."""
    copy = target.parent / f"{target.name}-src"
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns(*BUILD_LEFTOVERS))
    res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--no-index", "--disable-pip-version-check", "--target", str(target), str(copy)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return target


@pytest.fixture(scope="session")
def example_target(tmp_path_factory) -> Path:
    """The example package installed into a temporary folder (put it on PYTHONPATH to see it)."""
    return install(EXAMPLE, tmp_path_factory.mktemp("examples") / "site")


def _files(root: Path) -> dict[str, str]:
    skip = {"build", "__pycache__"}
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*"))
            if p.is_file() and not skip & set(p.relative_to(root).parts)
            and not any(part.endswith(".egg-info") for part in p.relative_to(root).parts)}


def test_the_example_is_what_new_router_writes():
    """examples/gated_residual is the template rendered for gated_residual, file for file, so the
    example that CI checks is the package `routerbench new router` gives a researcher."""
    assert _files(EXAMPLE) == render("gated_residual")
    assert class_name("gated_residual") == "GatedResidual" and dist_name("my_gate") == "routerbench-my-gate"
    assert class_name("x2_y") == "X2Y" and class_name("a__b") == "AB"
    text = (EXAMPLE / "pyproject.toml").read_text()
    assert 'name = "routerbench-gated-residual"' in text and 'version = "0.1.0"' in text
    assert '[project.entry-points."routerbench.routers"]\ngated_residual = "gated_residual.router"' in text


def test_the_example_router_keeps_its_contract_and_cost_models(tmp_path):
    """Loaded as a plugin file, the router equals its float64 reference, and each cost model it
    declares is the project's number: the dispatch-counted FLOPs, rezero's ideal I/O."""
    import torch

    from harness.costs.flops import count_router_fma
    from routers import api, build_router, plugins, registry
    plugin = plugins.load(str(EXAMPLE / "gated_residual" / "router.py"))
    try:
        r = build_router("gated_residual", 8, 2)
        assert [m for m in api.MAY_GIVE if api.declares(r, m)] == list(api.MAY_GIVE)
        assert r.analytic_fwd_flops(2, 3) == 2 * count_router_fma(r, 2, 3) == 4 * (2 * 8 * 6 + 4)
        assert r.live_state_bytes(2, 3) == 2 * 3 * 8 * 4 and r.live_state_bytes(2, 3, torch.bfloat16) == 2 * 3 * 8 * 2
        assert (r.ideal_io_per_token(), r.ideal_io_fwd_bwd_per_token()) == (3.0, 8.0)
        assert torch.sigmoid(r.gate).tolist() == pytest.approx([0.8808] * 4, abs=1e-4)  # gate_init 2.0
        r = r.double()
        with torch.no_grad():
            r.gate.copy_(torch.tensor([-2.0, 0.0, 1.0, 3.0]))
        e = torch.randn(2, 3, 8, dtype=torch.float64)
        ups = [torch.randn_like(e) for _ in r.slots]
        reads, out, _ = api.route(r, e, lambda slot, h: ups[slot.index])
        ref_reads, ref_out = r.reference(e, ups)
        want = e + sum(torch.sigmoid(g) * u for g, u in zip(r.gate.detach(), ups))
        torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ref_out, want, rtol=1e-12, atol=1e-12)
        for got, ref in zip(reads, ref_reads, strict=True):
            torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    finally:
        plugins._forget(plugin)
        plugins.LOADED.pop(plugin.spec, None)
    assert "gated_residual" not in registry.ROUTERS


def test_list_shows_the_installed_example_with_its_distribution(example_target):
    res = _run(["-m", "harness.cli", "list"], example_target)
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("  gated_residual "))
    assert "[routerbench-gated-residual 0.1.0]" in line and "Gated residual: h_{k+1} = h_k + sigmoid(g_k)" in line
    bare = _run(["-m", "harness.cli", "list"], example_target, ROUTERBENCH_PLUGINS="none")
    assert bare.returncode == 0 and "gated_residual" not in bare.stdout  # turned off: built-ins only


def _check_paired_run(out: Path, router: str) -> None:
    """The run in ``out`` timed ``router`` in prenorm's group, pair for pair, and its report says it."""
    run_dir = next(out.glob("*/r"))
    rows = [json.loads(ln) for ln in (run_dir / "records.jsonl").read_text().splitlines() if ln.strip()]
    pairs = {}
    for r in rows:
        if r.get("metric") == "step_time" and r.get("status") == "ok":
            pairs.setdefault(r["router"], set()).add((r["resume_unit"], r["pair"]))
    assert set(pairs) == {"prenorm", router}
    assert pairs[router] == pairs["prenorm"] and len(pairs[router]) == 5  # same group, same rounds
    report = (run_dir / "report.md").read_text()
    assert f"{router} naive over prenorm at d=16, 2 layers" in report
    assert re.search(rf"^\| {router} +\|", report, re.M)  # a row of its own in the report's tables


@pytest.mark.slow
def test_run_pairs_the_installed_example_with_prenorm(example_target, tmp_path):
    res = _run(["-m", "harness.cli", "run", "--routers", "prenorm,gated_residual", *TINY_RUN, "--out",
                str(tmp_path), "--run-id", "r"], example_target)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    _check_paired_run(tmp_path, "gated_residual")


COLLECT = """
import importlib.metadata, sys, pytest, routers
rc = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "tests/test_routers.py", "tests/benchmarks"])
print("ENTRY", sorted(e.name for e in importlib.metadata.entry_points(group="routerbench.routers")))
print("ROUTERS", sorted(routers.ROUTERS))
sys.exit(rc)
"""


@pytest.mark.slow
def test_installing_the_example_changes_nothing_the_project_collects(example_target):
    """`make test` and `make bench` ask for no plugin: the same node ids and the built-in routers
    only, whether or not the example is installed (and it is: its entry point is seen)."""
    def collect(*paths):
        res = _run(["-c", COLLECT], *paths)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
        lines = res.stdout.splitlines()
        ids = sorted(ln for ln in lines if "::" in ln)
        said = {ln.split(" ", 1)[0]: ln.split(" ", 1)[1] for ln in lines if ln.startswith(("ENTRY ", "ROUTERS "))}
        return ids, said
    ids, said = collect()
    ids_with, said_with = collect(example_target)
    assert "gated_residual" in said_with["ENTRY"] and "gated_residual" not in said["ENTRY"]
    assert len(ids) > 20 and any("benchmarks" in i for i in ids) and ids_with == ids
    assert said_with["ROUTERS"] == said["ROUTERS"] and "gated_residual" not in said["ROUTERS"]


def _new(*args: str):
    return CliRunner().invoke(main, ["new", "router", *args])


def test_new_router_refuses_a_taken_name_a_bad_name_and_a_used_dir(tmp_path):
    used = tmp_path / "used"
    used.mkdir()
    (used / "x.txt").write_text("mine")
    for args, said in ((["rezero", "--dir", str(tmp_path / "a")], "NAME 'rezero': taken by the built-in router"),
                       (["my-gate", "--dir", str(tmp_path / "b")], "NAME 'my-gate': a router name must be a Python identifier"),
                       (["class", "--dir", str(tmp_path / "c")], "NAME 'class': a Python keyword"),
                       (["json", "--dir", str(tmp_path / "d")], "NAME 'json': a module of that name is importable"),
                       (["my_gate", "--dir", str(used)], f"--dir {used}: a directory that is not empty")):
        res = _new(*args)
        assert res.exit_code == 2, (args, res.output)
        assert res.stderr.startswith("routerbench: error: " + said) and res.stderr.count("\n") == 1, res.stderr
    assert [p.name for p in used.iterdir()] == ["x.txt"] and not (tmp_path / "a").exists()


def test_new_router_refuses_a_name_a_loaded_plugin_took(example_target, tmp_path):
    res = _run(["-m", "harness.cli", "new", "router", "gated_residual", "--dir", str(tmp_path / "g")], example_target)
    assert res.returncode == 2 and not (tmp_path / "g").exists()
    assert "taken by the routerbench-gated-residual 0.1.0 router gated_residual.router.GatedResidual" in res.stderr


@pytest.mark.slow
def test_new_router_installs_lists_and_runs_beside_prenorm(tmp_path):
    pkg = tmp_path / "pkg"
    res = _new("my_gate", "--dir", str(pkg))
    assert res.exit_code == 0, res.output
    name = "my_gate"
    assert sorted(_files(pkg)) == ["README.md", f"{name}/__init__.py", f"{name}/router.py", "pyproject.toml",
                                   f"tests/test_{name}.py"]
    router = (pkg / "my_gate" / "router.py").read_text()
    assert '@register_router("my_gate")\nclass MyGate(Router):' in router and "gated_residual" not in router
    readme = (pkg / "README.md").read_text()
    assert len(readme.splitlines()) <= 10
    for cmd in ("pip install --no-build-isolation -e .", "routerbench check my_gate",
                "routerbench run --routers prenorm,my_gate"):
        assert cmd in readme
    target = install(pkg, tmp_path / "site")
    listed = _run(["-m", "harness.cli", "list"], target)
    assert listed.returncode == 0, listed.stderr
    assert any(ln.startswith("  my_gate ") and "[routerbench-my-gate 0.1.0]" in ln for ln in listed.stdout.splitlines())
    out = tmp_path / "out"
    res = _run(["-m", "harness.cli", "run", "--routers", "prenorm,my_gate", *TINY_RUN, "--out", str(out),
                "--run-id", "r"], target)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    _check_paired_run(out, "my_gate")


SLOW = '''
import time
from routers.api import register_router
from routers.fixed import PreNorm
ROUTERBENCH_API_VERSION = 1

@register_router("slow_residual")
class Slow(PreNorm):
    """PreNorm with a 2 ms host sleep in every write: a planted slow router."""
    def write(self, state, role, params, update):
        time.sleep(0.002)
        return state + update
    def reference(self, embedding, updates):
        h, reads = embedding.double(), []
        for u in updates:
            reads.append(h)
            h = h + u.double()
        return reads, h
'''

PAIR_TESTS = '''
SHAPE = {"d_model": 16, "n_layers": 2, "n_heads": 2, "seq_len": 8, "batch_size": 2}

def test_gated(routerbench_pair):
    info = routerbench_pair(router="gated_residual", backend="eager", shape=SHAPE, rounds=8)
    assert info["pairs"] == 8 and info["router"] == "gated_residual"

def test_slow(routerbench_pair):
    routerbench_pair(router="slow_residual", shape=SHAPE, mode="fwd", rounds=8)
'''


@pytest.mark.slow
def test_pair_plugin_benchmarks_a_router_and_the_gate_judges_it(example_target, tmp_path):
    """A test outside the project uses the fixture under `pytest -p harness.ci.pairplugin
    --benchmark-only`; the JSON holds each pair in the suite's group naming with its paired ratio,
    and `routerbench gate` passes a generous rule (exit 0) and fails an impossible one (exit 1,
    certain: the planted slow router sleeps 8 ms a step)."""
    (tmp_path / "slow.py").write_text(SLOW)
    (tmp_path / "test_mine.py").write_text(PAIR_TESTS)
    plug = {"ROUTERBENCH_PLUGINS": str(tmp_path / "slow.py")}
    res = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "harness.ci.pairplugin", "--benchmark-only",
                "--benchmark-json", "out.json", "test_mine.py"], example_target, cwd=tmp_path, **plug)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    data = json.loads((tmp_path / "out.json").read_text())
    by = {b["extra_info"]["router"]: b for b in data["benchmarks"]}
    assert set(by) == {"gated_residual", "slow_residual"}
    assert by["gated_residual"]["group"] == "fwd_bwd-d16-L2-T8-B2-vs-prenorm"
    assert by["slow_residual"]["group"] == "fwd-d16-L2-T8-B2-vs-prenorm"
    assert by["gated_residual"]["stats"]["rounds"] == 8 and by["gated_residual"]["extra_info"]["pairs"] == 8
    assert by["slow_residual"]["extra_info"]["ratio_lo"] > 2  # 4 sleeps of 2 ms against a step of ~1 ms
    assert data["machine_info"]["routerbench"] == 2  # the plugin's machine_info, not pytest-benchmark's
    quiet = ["--noise-thresholds", json.dumps({"cpu_pressure_max": 1.0, "cpu_util_min": 0.0,
                                               "iqr_rel_max": 100.0, "ci_width_rel_max": 100.0})]
    (tmp_path / "ok.toml").write_text('[[rule]]\nname = "ceiling"\nmetric = "overhead_vs_prenorm"\n'
                                      'max_pct = 1000\nrouters = ["gated_residual"]\n')
    (tmp_path / "impossible.toml").write_text('[[rule]]\nname = "never-slower"\nmetric = "overhead_vs_prenorm"\n'
                                              'max_pct = 0\n')
    ok = _run(["-m", "harness.cli", "gate", "out.json", "--rules", "ok.toml", *quiet], example_target,
              cwd=tmp_path, **plug)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "gated_residual [naive] · eager · fwd_bwd · d16 L2 T8 B2" in ok.stdout and "1 pass, 0 fail" in ok.stdout
    bad = _run(["-m", "harness.cli", "gate", "out.json", "--rules", "impossible.toml", *quiet], example_target,
               cwd=tmp_path, **plug)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "FAIL never-slower: slow_residual [naive] · eager · fwd" in bad.stdout


def test_pair_plugin_refuses_bad_arguments_with_one_line():
    from harness.ci.pairplugin import pair_case, resolve_shape
    assert resolve_shape("cpu-quick").d_model == 64 and resolve_shape({"d_model": 16, "n_heads": 2}).d_model == 16
    for kw, said in (({"router": "nope"}, "router='nope': not registered"),
                     ({"router": "prenorm"}, "router='prenorm': prenorm is the baseline"),
                     ({"router": "rezero", "backend": "jit"}, "backend='jit'"),
                     ({"router": "rezero", "shape": "tiny"}, "shape='tiny': unknown preset"),
                     ({"router": "rezero", "shape": {"width": 8}}, "shape: unknown field 'width'"),
                     ({"router": "rezero", "rounds": 2}, "rounds=2: a paired interval needs at least 5"),
                     ({"router": "rezero", "impl": "fused"}, "impl='fused': rezero offers naive")):
        with pytest.raises(ValueError, match="^" + said.replace("(", r"\(").replace("[", r"\[")):
            pair_case(**kw)
    p = pair_case("rezero", backend="compile", shape={"d_model": 16, "n_layers": 2, "n_heads": 2})
    assert (p.a.router, p.b.router, p.b.compile_mode, p.b.compile_scope) == ("prenorm", "rezero", "default", "model")
    assert p.group.endswith("-vs-prenorm") and p.kind == "vs_prenorm"
