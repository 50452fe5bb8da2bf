"""``scripts/gpu_check.sh`` and ``scripts/gpu_wheels.sh`` without a GPU: they parse (and pass
shellcheck where it is installed); the check's ``--dry-run`` plans every stage with budgets that add
up to the total (default 300 s, and 600 s), runs no interpreter, writes nothing, and prints
``routerbench`` command lines that ``routerbench ... --dry-run`` accepts here (CUDA-only backends
included: the dry run plans them on a CPU); bad input and a machine without CUDA exit 2 with one
line. The wheels script lists what it fetches without the network."""

from __future__ import annotations


import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "scripts" / "gpu_check.sh"
WHEELS = ROOT / "scripts" / "gpu_wheels.sh"
STAGES = ["setup", "tests", "graph", "compile", "impls", "lean", "train", "results"]
#: No such interpreter: a dry run that needed Python (or torch) would fail with it.
NO_PYTHON = "/nonexistent/python3"
PLAN_ROW = re.compile(r"^  (\d)\s+(\w+)\s+(\d+) s\s+(\d+) %\s+(\d+) s  \S")


def _run(script: Path, *args: str, python: str = NO_PYTHON, timeout: int = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": python}
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


def _plan(stdout: str) -> list[tuple[str, int, int]]:
    """(stage, budget s, ends at s) of each row of the plan table, in order."""
    rows = [PLAN_ROW.match(line) for line in stdout.splitlines()]
    return [(m.group(2), int(m.group(3)), int(m.group(5))) for m in rows if m]


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    """Dry runs, keyed by their arguments; each timed; `out` must stay absent."""
    out = tmp_path_factory.mktemp("gpu") / "out"
    runs = {}
    for args in ((), ("--budget", "600"), ("600",), ("--no-flops",)):
        t0 = time.perf_counter()
        res = _run(CHECK, "--dry-run", "--out", str(out), *args)
        runs[args] = (res, time.perf_counter() - t0)
    assert not out.exists()  # a dry run writes nothing
    return runs


def test_the_scripts_parse_and_pass_shellcheck():
    for script in (CHECK, WHEELS):
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0, script
        if shutil.which("shellcheck"):
            res = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
            assert res.returncode == 0, res.stdout


@pytest.mark.parametrize("args,budget", [((), 300), (("--budget", "600"), 600)])
def test_dry_run_plans_every_stage_with_budgets_that_add_up(dry, args, budget):
    res, took = dry[args]
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    assert took < 5  # no interpreter, no torch: bash alone
    plan = _plan(res.stdout)
    assert [name for name, _, _ in plan] == STAGES
    assert sum(b for _, b, _ in plan) == budget
    assert all(b > 0 for _, b, _ in plan)
    ends = [e for _, _, e in plan]
    assert ends == [sum(b for _, b, _ in plan[:i + 1]) for i in range(len(plan))] and ends[-1] == budget
    assert f"  total    {budget} s" in res.stdout
    assert f"budget {budget} s ({budget // 60} min 0 s), dry run: nothing runs" in res.stdout
    for name, b, end in plan:  # each stage's section, with its commands
        assert f"[{name}] {b} s, until {end} s: " in res.stdout
    shares = dict((n, b) for n, b, _ in plan)
    assert shares["results"] >= 40  # summary, tables, report and archive always have their time
    assert max(shares, key=shares.get) == "graph"


def test_the_default_plan_and_a_longer_budget(dry):
    five, ten = _plan(dry[()][0].stdout), _plan(dry[("--budget", "600")][0].stdout)
    assert [b for _, b, _ in five] == [13, 54, 62, 46, 49, 18, 18, 40]
    assert [b for _, b, _ in ten] == [26, 110, 125, 95, 100, 36, 36, 72]
    assert _plan(dry[("600",)][0].stdout) == ten  # a positional budget is the same as --budget
    minutes = subprocess.run(["bash", str(CHECK), "--dry-run", "--budget", "10m"], capture_output=True, text=True)
    assert minutes.returncode == 0 and _plan(minutes.stdout) == ten  # 10m = 600 s


def _commands(stdout: str) -> list[list[str]]:
    """The routerbench command lines of a dry run, as argument lists after ``-m harness.cli``."""
    prefix = f"  $ {NO_PYTHON} -m harness.cli "
    return [shlex.split(line[len(prefix):]) for line in stdout.splitlines()
            if line.startswith(prefix) and line.split()[4] in ("run", "train")]


def _option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_dry_run_prints_each_stage_s_commands(dry):
    out = dry[()][0].stdout
    cmds = _commands(out)
    ids = [_option(c, "--run-id").split("-", 4)[-1] for c in cmds]
    assert ids == ["graph", "compile-block_attnres", "compile-haares", "compile-wav_v1", "compile-full_attnres",
                   "impls", "impls-router", "impls-compiled", "lean", "train"]
    graph, *compiles, impls, impls_router, impls_compiled, lean, train = cmds
    assert _option(graph, "--backends") == "eager,cudagraph" and "--no-flops" not in graph
    assert _option(graph, "--routers") == "prenorm,block_attnres,haares,wav_v1,full_attnres"
    for c in (graph, *compiles):
        assert [_option(c, o) for o in ("--widths", "--depths", "--seq-len", "--batch-size", "--dtype", "--modes")] \
            == ["1024", "4", "512", "8", "bfloat16", "fwd_bwd"]
    assert [_option(c, "--impls") for c in (graph, *compiles)] == ["two_phase"] * 4 + ["naive"]  # full_attnres: naive
    for c in compiles:
        assert _option(c, "--backends") == "compile" and _option(c, "--compile-scope") == "model"
        assert "--no-flops" in c
    every = "naive,two_phase,lean,fused,fla,liger,flash_attn_res,fast_attnres"
    for c in (impls, impls_router):
        assert _option(c, "--impls") == every and _option(c, "--backends") == "eager,cudagraph"
        assert _option(c, "--routers") == "prenorm,block_attnres,haares,wav_v1" and _option(c, "--widths") == "1024"
    assert _option(impls_router, "--workload") == "router_only" and "--workload" not in impls
    assert _option(impls_compiled, "--impls") == "two_phase,lean,fused"
    assert _option(impls_compiled, "--backends") == "compile"
    assert _option(lean, "--impls") == "two_phase,lean,fused" and _option(lean, "--routers") == "prenorm,haares,wav_v1"
    assert train[0] == "train" and _option(train, "--backend") == "cudagraph"
    kernels = f"  $ {NO_PYTHON} -m harness.cli kernels --repeats 20"  # each fused kernel alone, first of impls
    assert kernels in out and out.index(kernels) < out.index("-m harness.cli run --routers prenorm,block_attnres,"
                                                             "haares,wav_v1 --impls")
    assert f"  $ {NO_PYTHON} -m pytest -q -p no:cacheprovider -m cuda --tb=short --durations=10 tests/" in out
    # --no-flops reaches the one stage that counts FLOPs
    assert "--no-flops" in _commands(dry[("--no-flops",)][0].stdout)[0]


def test_every_routerbench_command_of_the_plan_passes_its_own_dry_run(dry):
    """Each stage's command line, run as ``routerbench ... --dry-run`` on this CPU: every option
    exists and the plan has the cases the stage means to time (cudagraph is planned on a CPU too;
    the peer impls unavailable here would be skipped rows, and the GPU check keeps only those
    `routerbench list` shows available)."""
    from click.testing import CliRunner

    from harness.cli import main
    groups = r"in \d+ groups? \(paired\)"  # a group too large for this machine's memory is split
    want = [rf"plan: 10 cost cases {groups}, 0 models",  # 5 routers x eager, cudagraph
            *[rf"plan: 2 cost cases {groups}, 2 models to compile"] * 4,
            # (prenorm + 8 impls of block_attnres + 4 of haares + 4 of wav_v1) x eager, cudagraph
            *[rf"plan: 34 cost cases {groups}, 0 models"] * 2,
            # prenorm + haares x 3 impls; where fused cannot run (no CUDA, no Triton) its case is skipped, not compiled
            rf"plan: 4 cost cases {groups}, [34] models to compile",
            rf"plan: 7 cost cases {groups}, 0 models",  # prenorm + 2 routers x 3 impls
            r"plan: 2 training runs \(2 routers x 1 seed\), 240 steps"]
    cmds = _commands(dry[()][0].stdout)
    assert len(cmds) == len(want)
    runner = CliRunner()
    for args, plan in zip(cmds, want):
        res = runner.invoke(main, [*args, "--dry-run"])
        assert res.exit_code == 0, (args, res.output)
        assert re.search(plan, res.output) and "dry run: no model built, no run directory created" in res.output, \
            res.output
    assert not Path(_option(cmds[0], "--out")).parent.exists()  # nor did any of them write
    res = runner.invoke(main, ["kernels", "--repeats", "20", "--dry-run"])  # the impls stage's first command
    assert res.exit_code == 0 and "dry run: no kernel run" in res.output, res.output


@pytest.mark.parametrize("args", [("--budget", "abc"), ("--budget", "0"), ("--budget", "1.5"), ("--budget=-60",),
                                  ("--budget", "119"), ("--budget", "86401"), ("abc",), ("--budget",)])
def test_a_bad_budget_exits_2_with_one_line_naming_budget(tmp_path, args):
    res = _run(CHECK, "--out", str(tmp_path / "out"), *args)
    assert res.returncode == 2
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: ") and "--budget" in lines[0], res.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args,word", [(("--frobnicate",), "--frobnicate"), (("--wheels", "/nonexistent"), "--wheels"),
                                       (("100", "200"), "--budget")])
def test_other_bad_input_exits_2_with_one_line(args, word):
    res = _run(CHECK, "--dry-run", *args)
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and word in lines[0], res.stderr


def test_without_cuda_it_exits_2_with_one_line_and_writes_nothing(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the check would run")
    res = _run(CHECK, "--out", str(tmp_path / "out"), python=sys.executable)
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device visible to torch" in lines[0], res.stderr
    assert not (tmp_path / "out").exists()


def test_a_wheels_folder_is_installed_into_out_site_without_an_index(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    res = _run(CHECK, "--dry-run", "--out", str(tmp_path / "out"), "--wheels", str(wheels))
    assert res.returncode == 0, res.stderr
    assert (f"  $ {NO_PYTHON} -m pip install -q --no-index --no-deps --no-compile --upgrade "
            f"--target {tmp_path / 'out' / 'site'} '{wheels}/*.whl'") in res.stdout
    assert not (tmp_path / "out").exists()


def test_the_wheels_script_lists_what_it_fetches_and_never_torch():
    res = _run(WHEELS, "--list")
    assert res.returncode == 0, res.stderr
    names = [re.split(r"[<>=]", line)[0] for line in res.stdout.split()]
    assert names == ["iopath", "yacs", "termcolor", "portalocker", "tabulate", "tomli-w", "nvidia-ml-py",
                     "pytest-benchmark", "py-cpuinfo", "fla-core", "liger-kernel", "flash-attn-res", "fast-attnres",
                     "einops", "fvcore"]
    bad = _run(WHEELS, "--frobnicate")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
