"""The ``routerbench`` command: an end-to-end mini run with resume, and ``data prepare`` + ``train``
on a slice of real text (bad options: tests/test_spec.py)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from click.testing import CliRunner
from paths import SHAKESPEARE

from harness.cli import main
from harness.rundir.records import END, LEGACY_DONE_FILE, load_rows, read_jsonl
from routers import ROUTERS


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_list_shows_every_router():
    out = invoke("list").output
    for name in ROUTERS:
        assert f"  {name} " in out
    assert "partial_details='always'" in out and "haares-201m" in out
    fused = next(line for line in out.splitlines() if line.startswith("  fused "))
    assert "routers=block_attnres,haares,wav_v1" in fused and "dtypes=float32,bfloat16" in fused


def test_run_end_to_end_and_resume(tmp_path, monkeypatch):
    args = ["run", "--routers", "prenorm,haares", "--widths", "16,32", "--depths", "2", "--modes", "fwd,fwd_bwd",
            "--repeats", "2", "--max-attempts", "1", "--warmup-s", "0", "--backends", "eager", "--impls", "naive", "--no-train",
            "--out", tmp_path, "--run-id", "r1", "--quiet"]
    res = invoke(*args)
    assert res.exit_code == 0, res.output
    run_dir = next(tmp_path.glob("*/r1"))
    for name in ("records.jsonl", "manifest.json", "report.html", "report.md", "spec.toml"):
        assert (run_dir / name).exists(), name
    assert not (run_dir / LEGACY_DONE_FILE).exists()
    assert END in read_jsonl(run_dir / "records.jsonl")[-1]  # the records end in an end marker
    df = pd.DataFrame(load_rows([run_dir]))
    st = df[df.metric == "step_time"]
    assert len(st) == 2 * 2 * 2 * 2  # routers x widths x modes x repeats
    assert set(df[df.metric == "fwd_flops_fvcore"].d_model) == {16, 32}
    n_lines = len(read_jsonl(run_dir / "records.jsonl"))
    from harness.timing import noise  # a busy machine at the start is said on stderr, once
    busy = tmp_path / "pressure"
    busy.write_text("some avg10=52.00 avg60=10.00 avg300=3.00 total=1\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    monkeypatch.setattr(noise, "PRESSURE_FILE", busy)
    res = invoke(*args)
    assert res.exit_code == 0, res.output
    assert "resuming" in res.output and "cost sweep: 8 resumed" in res.output
    assert res.stderr.count("warning: this machine is busy") == 1 and "CPU 52 % of the last 10 s" in res.stderr
    import json
    sessions = json.loads((run_dir / "manifest.json").read_text())["sessions"]
    assert len(sessions) == 2 and sessions[1]["cpu_pressure_start"] == pytest.approx(0.52)
    assert len(pd.DataFrame(load_rows([run_dir])).query("metric == 'step_time'")) == len(st)
    lines = read_jsonl(run_dir / "records.jsonl")
    assert len(lines) == n_lines and END in lines[-1]  # nothing appended, still ends in a marker
    assert not (run_dir / LEGACY_DONE_FILE).exists()


def test_run_ends_with_the_verdict_and_summary_then_the_report_path(tmp_path):
    """What a run measured is on the terminal at its end, as `routerbench summary` prints it
    (haares also against block_attnres from the same rounds), then where the report is."""
    args = ["run", "--routers", "prenorm,block_attnres,haares", "--widths", "16", "--depths", "2", "--modes",
            "fwd_bwd", "--repeats", "5", "--max-attempts", "1", "--warmup-s", "0", "--backends", "eager",
            "--impls", "naive", "--no-train", "--no-flops", "--out", tmp_path, "--run-id", "r1"]
    res = invoke(*args)
    assert res.exit_code == 0, res.output
    out = [ln for ln in res.stdout.splitlines() if ln.strip()]
    run_dir = next(tmp_path.glob("*/r1"))
    summary = invoke("summary", run_dir)
    said = [ln for ln in summary.stdout.splitlines() if ln.strip()]
    k = 1 if said[0].startswith("Verdict: ") else 0  # a tiny timing on a shared machine may be noisy
    assert said[k].startswith("block_attnres naive over prenorm at d=16, 2 layers")
    assert "over block_attnres naive (same rounds): " in said[k + 1] and said[k + 1].startswith("haares naive")
    assert "vs block_attnres [CI]" in said[k + 2]
    start = out.index(said[0])
    assert out[start:start + len(said)] == said  # the same text, in the run's output
    assert out[start + len(said)].startswith(f"report: {run_dir / 'report.html'}")


def test_summary_leaves_vs_eager_blank_on_eager_rows(tmp_path):
    from harness.rundir.writer import RunWriter
    shape = dict(router="prenorm", impl="naive", mode="fwd", workload="decoder", d_model=16, n_layers=2,
                 n_heads=2, seq_len=8, batch_size=2, dtype="float32", seed=0)
    with RunWriter(tmp_path, "s", "s1") as w:
        for backend, cm, ms in (("eager", None, 2.0), ("compile", "default", 1.0)):
            with w.unit([backend]) as u:
                for i in range(3):
                    u.write(case_key=backend, backend=backend, compile_mode=cm, **shape, repeat=i,
                            metric="step_time", value=ms, unit="ms")
    res = invoke("summary", "--unpaired", tmp_path)
    assert res.exit_code == 0, res.output
    header, *lines = res.output.strip().splitlines()
    names = header.split()
    cells = [ln.split()[:1] + ln.split()[4:] for ln in lines]  # the shape "d16 L2 T8 B2" is 4 words
    by = {c[names.index("backend")]: dict(zip(names, c)) for c in cells}
    assert by["eager"]["vs_eager"] == "–"  # not the constant 1.00
    assert by["compile[default]"]["vs_eager"] == "0.50"


@pytest.mark.skipif(not SHAKESPEARE.exists(), reason=f"real text absent: {SHAKESPEARE}")
def test_prepare_real_text_then_train_to_target(tmp_path):
    text = tmp_path / "slice.txt"
    text.write_text(SHAKESPEARE.read_text()[:60_000])
    data = tmp_path / "corpus"
    res = invoke("data", "prepare", "--text", text, "--out", data)
    assert res.exit_code == 0 and "vocab" in res.output, res.output
    res = invoke("train", "--data", data, "--preset", "cpu-quick", "--routers", "prenorm",
                 "--target-loss", "3.2", "--max-steps", "40", "--eval-every", "10", "--seeds", "1", "--out",
                 tmp_path / "res", "--no-report", "--quiet")
    assert res.exit_code == 0, res.output
    df = pd.DataFrame(load_rows(list((tmp_path / "res").glob("*/*"))))
    vocab = len(set(text.read_text()))
    v0 = df[(df.metric == "val_loss") & (df.repeat == 0)].value.iloc[0]
    # At init the logits are near zero, so the loss is that of a uniform guess: ln(vocab).
    assert abs(v0 - math.log(vocab)) < 0.05
    ttt = df[df.metric == "time_to_target"].iloc[0]
    assert ttt.status == "ok" and ttt.value > 0
    steps = df[df.metric == "steps_to_target_eval"].value.iloc[0]
    assert steps % 10 == 0 and 10 <= steps <= 40
    val = df[df.metric == "val_loss"].set_index("repeat").value
    hit, before = val[steps], val[steps - 10]
    assert hit <= 3.2 < before
    # The clock is read between the two evaluations around the crossing, linearly on the loss.
    f = (before - 3.2) / (before - hit)
    assert df[df.metric == "steps_to_target"].value.iloc[0] == pytest.approx(steps - 10 + 10 * f)
    clock = df[df.metric == "elapsed"].set_index("repeat").value
    assert ttt.value == pytest.approx(clock[steps - 10] + f * (clock[steps] - clock[steps - 10]))
    assert df[df.metric == "time_to_target_eval"].value.iloc[0] == clock[steps]
    assert df[df.metric == "loss_at_token_budget"].value.iloc[0] == \
        df[(df.metric == "val_loss") & (df.repeat == 40)].value.iloc[0]


def test_the_command_table_is_every_modules_commands_with_their_lines():
    """``routerbench --help`` lists the commands from a static table (so that it loads no module
    of a command): the table must name each command of every module, with the line it shows."""
    import importlib
    import pkgutil

    import harness.cli as cli
    found = {}
    for m in pkgutil.iter_modules(cli.__path__):
        if m.name == "__main__":
            continue
        mod = importlib.import_module(f"harness.cli.{m.name}")
        for cmd in getattr(mod, "COMMANDS", ()):
            attr = next(k for k, v in vars(mod).items() if v is cmd)
            found[cmd.name] = (m.name, attr, cmd.short_help)
    assert found == cli.COMMANDS
    ctx = main.make_context("routerbench", [], resilient_parsing=True)
    assert [main.get_command(ctx, n).name for n in main.list_commands(ctx)] == sorted(found)
    assert main.get_command(ctx, "bogus") is None


def test_top_level_help_loads_no_heavy_library():
    """``routerbench --help`` (every command's line) imports neither torch, pandas, scipy nor
    matplotlib; ``routerbench list`` does (it needs the routers)."""
    import subprocess
    import sys
    probe = ("import sys\nfrom harness.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
             "print('LOADED', sorted(m for m in ('torch', 'pandas', 'scipy', 'matplotlib') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120).stdout
    assert "LOADED []" in out, out
    for name in ("compare", "diagnose", "train", "summary"):
        assert f"  {name} " in out
    assert invoke("list").exit_code == 0


def test_a_malformed_fault_hook_value_or_a_mistyped_command_is_one_line(monkeypatch, tmp_path):
    """ROUTERBENCH_FAULT is checked before any command works: a bad entry is one line naming it,
    exit 2, whatever the command; a mistyped command is offered the closest names."""
    for value, says in [("checkpoint_replaced:train|*", "checkpoint_replaced needs its count of reads"),
                        ("checkpoint_replaced=0:train|*", "checkpoint_replaced=N:GLOB with N > 0"),
                        ("checkpoint_replace=2:train|*", "KIND one of"),
                        ("slow:x", "slow needs its delay, slow=MS:GLOB")]:
        monkeypatch.setenv("ROUTERBENCH_FAULT", value)
        res = CliRunner().invoke(main, ["status", str(tmp_path)])
        assert res.exit_code == 2, res.output
        assert res.stderr.count("\n") == 1 and res.stderr.startswith("routerbench: error: ROUTERBENCH_FAULT: ")
        assert says in res.stderr and "Traceback" not in res.output
    monkeypatch.delenv("ROUTERBENCH_FAULT")
    res = CliRunner().invoke(main, ["trian"])
    assert res.exit_code == 2 and "No such command 'trian'. Did you mean 'train'?" in res.stderr
    res = CliRunner().invoke(main, ["xyzzy"])
    assert res.exit_code == 2 and "Did you mean" not in res.stderr


@pytest.mark.parametrize("args,needle", [
    (["--widths", "64", "--widths", "128"], "--widths is given twice; give it once (a list is one comma-separated value"),
    (["--widths=64", "--widths", "128"], "--widths is given twice"),
    (["--quiet", "--no-quiet"], "--quiet and --no-quiet are both given; give one of them"),
])
def test_an_option_given_twice_is_refused_in_one_line(args, needle):
    res = CliRunner().invoke(main, ["run", "--dry-run", "--no-train", *args])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("routerbench: error: ")
    assert needle in lines[0], lines[0]
