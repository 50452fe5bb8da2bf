"""Training with DistributedDataParallel under torchrun (harness/training/distributed.py, harness/training/run.py,
harness/training/schedule.py, ``routerbench train``): 2 processes with gloo on the CPU, one thread each, at a
tiny shape (d 32, 2 layers, T 16, global batch 4).

The per-step training loss is the ``train_loss`` row of each evaluation (the mean since the
previous one), so ``--eval-every 1`` records it at every step: the curves of a 2-process run must
equal a single process's on the same global batches to 1e-5.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from harness.rundir.records import load_rows
from harness.step.backends import one_dynamo_cache, recompile_guard
from harness.training import distributed
from harness.training.config import TrainConfig, train_unavailable_reason
from harness.training.run import TrainRun
from workloads.config import DecoderConfig
from workloads.data import CharCorpus, prepare_corpus_from_text, stdlib_text

ROOT = Path(__file__).resolve().parents[1]
STEPS = 5
TINY = DecoderConfig(d_model=32, n_layers=2, n_heads=2, seq_len=16, batch_size=4)
ARGS = ["--device", "cpu", "--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--seq-len", "16",
        "--batch-size", "4", "--max-steps", str(STEPS), "--eval-every", "1", "--seeds", "1", "--lr", "0.01",
        "--routers", "prenorm,haares", "--schedule", "interleaved", "--chunk", "2", "--target-loss", "3.9",
        "--no-report", "--quiet"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return prepare_corpus_from_text(stdlib_text(300_000), tmp_path_factory.mktemp("corpus") / "c")


def _env(fault: str | None = None, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k != "ROUTERBENCH_FAULT" and k not in distributed.ENV_VARS and not k.startswith("TORCHELASTIC")}
    env.update(OMP_NUM_THREADS="1", **extra)
    if fault:
        env["ROUTERBENCH_FAULT"] = fault
    return env


def _routerbench() -> list[str]:
    """The ``routerbench`` script beside this Python (what ``$(which routerbench)`` names), else the
    module."""
    script = Path(sys.executable).parent / "routerbench"
    return [str(script)] if script.exists() else ["-m", "harness.cli"]


def _with(args: list[str], *pairs: str) -> list[str]:
    """``args`` with each ``FLAG VALUE`` of ``pairs`` replacing that flag's value, or appended (an
    option may be given once)."""
    out = list(args)
    for flag, value in zip(pairs[::2], pairs[1::2]):
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return out


def train(out: Path, run_id: str, corpus, nproc: int = 1, fault: str | None = None,
          extra: list[str] = ()) -> subprocess.CompletedProcess:
    """``routerbench train`` in one process, or under torchrun (``python -m torch.distributed.run``,
    ``--standalone``: a free port, so concurrent tests do not collide) with ``nproc`` processes."""
    args = ["train", "--data", str(corpus.path), "--out", str(out), "--run-id", run_id, *_with(ARGS, *extra)]
    if nproc == 1:
        cmd = [sys.executable, "-m", "harness.cli", *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               *_routerbench(), *args]
    return subprocess.run(cmd, cwd=ROOT, env=_env(fault), capture_output=True, text=True, timeout=300)


def run_dir(out: Path, run_id: str) -> Path:
    return next(out.glob(f"*/{run_id}"))


def curves(d: Path) -> dict:
    """(router, metric, step) -> value of the evaluation rows."""
    return {(r["router"], r["metric"], r["repeat"]): r["value"] for r in load_rows([d])
            if r["metric"] in ("train_loss", "val_loss", "tokens")}


def assert_close(a: dict, b: dict, tol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    bad = {k: (a[k], b[k]) for k in a if abs(a[k] - b[k]) > tol * max(1.0, abs(b[k]))}
    assert not bad, bad


@pytest.fixture(scope="module")
def single(tmp_path_factory, corpus) -> Path:
    """The single-process run every DDP run is compared with."""
    out = tmp_path_factory.mktemp("single")
    res = train(out, "one", corpus)
    assert res.returncode == 0, res.stderr[-3000:]
    return run_dir(out, "one")


def test_two_processes_train_like_one_and_only_rank_0_writes(tmp_path, corpus, single):
    res = train(tmp_path, "two", corpus, nproc=2)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    d = run_dir(tmp_path, "two")
    a, b = curves(d), curves(single)
    # Every step's training loss (eval_every 1) and validation loss, both routers (two DDP models
    # interleaved in each process); tokens are global: 4 rows x 16 per step.
    assert len([k for k in a if k[1] == "train_loss"]) == 2 * STEPS
    assert a[("prenorm", "tokens", STEPS)] == STEPS * 4 * 16
    assert_close(a, b)
    # One writer: every row of one session, nothing left pending, one manifest saying world size 2.
    rows = load_rows([d])
    assert len({r["session"] for r in rows}) == 1
    assert not list((d / "pending").glob("*")) and not (d / "aborted").exists()
    assert {f.name[:11] for f in (d / "checkpoints").rglob("*.pt")} == {"final-step-"}  # weights only
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["ddp_backend"] == "gloo"
    assert len(manifest["sessions"]) == 1
    assert [p.name for p in d.parent.iterdir()] == ["two"]  # rank 1 opened no directory of its own
    # Rank 0 alone speaks.
    assert res.stdout.count("train prenorm seed 0: time to target") == 1
    assert "DDP over 2 processes (gloo), global batch 4" in res.stdout


def test_a_killed_two_process_run_resumes_in_one_process(tmp_path, corpus, single):
    killed = train(tmp_path, "k", corpus, nproc=2, fault="kill_after_eval=2:train|prenorm|*")
    assert killed.returncode != 0
    d = run_dir(tmp_path, "k")
    assert list((d / "checkpoints").rglob("step-00000002.pt"))  # rank 0's checkpoint of evaluation 2
    resumed = train(tmp_path, "k", corpus)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "prenorm seed 0: resumed at step 2" in resumed.stdout
    assert_close(curves(d), curves(single))
    keys = [(r["case_key"], r["metric"], r["repeat"]) for r in load_rows([d])]
    assert len(keys) == len(set(keys))  # nothing doubled
    sessions = json.loads((d / "manifest.json").read_text())["sessions"]
    assert [s["world_size"] for s in sessions] == [2, 1]


def test_an_indivisible_batch_exits_2_with_one_line_before_any_model(tmp_path, corpus):
    # As rank 0 of a torchrun of 2 processes sees it (the check needs no process group).
    env = _env(WORLD_SIZE="2", RANK="0", LOCAL_RANK="0")
    res = subprocess.run([sys.executable, "-m", "harness.cli", "train", "--data", str(corpus.path), "--out",
                          str(tmp_path), "--run-id", "x", *_with(ARGS, "--batch-size", "6", "--grad-accum", "2")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "routerbench: error: --grad-accum 2 does not divide the 3 rows of each process (--batch-size 6 over "
        "world size 2); change one of them"]
    res = subprocess.run([sys.executable, "-m", "harness.cli", "train", "--preset", "haares-453m", "--out",
                          str(tmp_path), "--run-id", "x", "--device", "cpu"],
                         cwd=ROOT, env=_env(WORLD_SIZE="3", RANK="0", LOCAL_RANK="0"), capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "--batch-size 64 of --preset haares-453m (the global batch) does not split over world size 3" in res.stderr
    # Under the real torchrun: one line for both processes, each exiting 2, no directory made.
    res = train(tmp_path, "x", corpus, nproc=2, extra=["--batch-size", "5"])
    assert res.returncode != 0
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("routerbench: error:")]
    assert lines == ["routerbench: error: --batch-size 5 (the global batch) does not split over world size 2 "
                     "(torchrun --nproc_per_node 2): give a multiple of 2"], res.stderr[-3000:]
    assert "exitcode  : 2" in res.stderr
    assert not list(tmp_path.glob("*/x"))


# --- the gradient itself: torch.multiprocessing.spawn, no CLI ------------------------------------
def _tc(backend: str) -> TrainConfig:
    return TrainConfig(TINY, max_steps=STEPS, eval_every=1, untimed_warmup=2, warmup_steps=1, lr=1e-2,
                       grad_clip=0.05, grad_accum=2, backend=backend)


def _steps(corpus_path: str, backend: str, n: int = 3) -> dict:
    """Set a run up (warm-up, then reset) and take ``n`` steps: the losses (averaged over ranks),
    the gradient norms before clipping, the weights after (a recompile after the reset raises)."""
    run = TrainRun("haares", {}, CharCorpus.open(corpus_path), _tc(backend), 0, torch.device("cpu"))
    with one_dynamo_cache():
        run.setup()
        losses, norms = [], []
        with recompile_guard(backend):
            for i in range(n):
                losses.append(distributed.mean_over_ranks(float(run._one_step(i))))
                norms.append(float(run.grad_norm))
    return {"losses": losses, "norms": norms, "world": run.world_size, "rows": (run.rows.start, run.rows.stop),
            "weights": torch.cat([p.detach().flatten() for p in run.model.parameters()]),
            "cudagraph": train_unavailable_reason("cudagraph", torch.device("cuda"))}


def _worker(rank: int, world: int, init_file: str, corpus_path: str, backend: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.save(_steps(corpus_path, backend), f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("backend", ["eager", pytest.param("compile", marks=pytest.mark.compile)])
def test_ddp_gradient_and_clipped_norm_equal_a_single_process(tmp_path, corpus, backend):
    """The global batch split over 2 ranks (and each slice into 2 micro-batches), DDP's averaged
    gradient, the norm clipped after the all-reduce, after a warm-up and reset: the same steps as
    one process (compiled: DDP around the compiled module, no recompile after the reset)."""
    out = str(tmp_path / "res")
    mp.spawn(_worker, args=(2, str(tmp_path / "rdzv"), str(corpus.path), backend, out), nprocs=2, join=True)
    r0, r1 = torch.load(f"{out}.0"), torch.load(f"{out}.1")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = _steps(str(corpus.path), backend)
    finally:
        torch.set_num_threads(n)
    assert (r0["world"], r0["rows"], r1["rows"], ref["rows"]) == (2, (0, 2), (2, 4), (0, 4))
    assert ref["cudagraph"] is None and "DistributedDataParallel" in r0["cudagraph"]
    assert torch.equal(r0["weights"], r1["weights"])  # the replicas stay identical
    assert min(ref["norms"]) > _tc(backend).grad_clip  # clipping acted at every step
    for k in ("losses", "norms"):
        assert r0[k] == r1[k] and r0[k] == pytest.approx(ref[k], rel=1e-5), k
    # AdamW divides by the root of the second moment: where a gradient is ~0 its float rounding
    # moves the update (lr 1e-2) by a few 1e-6.
    torch.testing.assert_close(r0["weights"], ref["weights"], rtol=1e-5, atol=1e-5)
