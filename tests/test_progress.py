"""Progress that never goes silent: ``progress.json`` (harness/rundir/progress.py) rewritten
atomically on every event, ticks while a blocking call runs, a cap on the events kept; every stage
of a real group's set-up and timing recorded as an event by ``run_sweep`` (in process and under
``--isolate``); ``routerbench status`` printing the stage now. No assertion reads a time value."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time

import pytest
import torch
from click.testing import CliRunner

from harness.cli import main
from harness.rundir.progress import PROGRESS_FILE, Progress, age_text, describe, read_progress
from harness.rundir.writer import RunWriter
from harness.sweep.cases import Case
from harness.sweep.options import SweepOptions
from harness.sweep.run import run_sweep
from harness.timing.timer import TimingPolicy
from workloads.config import DecoderConfig

CPU = torch.device("cpu")
#: One layer at d=16: a compile of it takes seconds.
TINY = DecoderConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=2, seq_len=8, batch_size=2)
ROUNDS = 4
QUICK = SweepOptions(flops=False, timing=TimingPolicy(warmup_min_count=1, warmup_min_s=0.0, repeats=ROUNDS),
                     paired=True, max_attempts=1)


def _doc(d) -> dict:
    return json.loads((d / PROGRESS_FILE).read_text())


# --- Progress --------------------------------------------------------------------------------

def test_every_event_rewrites_a_whole_file_with_its_fields(tmp_path):
    seen = []
    with Progress(tmp_path, tick_s=None, on_event=seen.append) as p:
        p.event("build", "building model 1 of 2 (prenorm naive eager)", case="prenorm|x", k=1, n=2, extra=[1, 2])
        doc = _doc(tmp_path)
        assert doc["schema"] == 1 and doc["pid"] == os.getpid() and doc["finished"] is None
        assert {"started", "started_t", "updated", "updated_t", "host", "tick_s"} <= set(doc)
        ev = doc["latest"]
        assert ev == doc["events"][-1] and ev["stage"] == "build" and ev["case"] == "prenorm|x"
        assert (ev["k"], ev["n"], ev["extra"]) == (1, 2, [1, 2]) and ev["text"].startswith("building")
        assert isinstance(ev["t"], float) and ev["time"].endswith("+00:00")
        p.beat("compile", 3, text="compiling model 2 of 2", case="haares|y", k=2, n=2, widest=float("nan"))
        latest = _doc(tmp_path)["latest"]
        assert latest["weight"] == 3 and latest["widest"] is None  # strict JSON: no NaN
    doc = _doc(tmp_path)
    assert [e["stage"] for e in doc["events"]] == ["start", "build", "compile", "done"]
    assert doc["finished"] == "done" and doc["count"] == 4 and doc["dropped"] == 0
    assert [e["stage"] for e in seen] == ["start", "build", "compile", "done"]
    assert sorted(f.name for f in tmp_path.iterdir()) == [PROGRESS_FILE]  # no temporary file left


def test_the_file_is_always_valid_json_while_it_is_rewritten(tmp_path):
    """A reader polling the file while two threads write events (as the sweep and the ticker do)
    never sees a torn or partial file."""
    p = Progress(tmp_path, tick_s=None, max_events=200)
    p.start()
    stop, reads, bad = threading.Event(), [0], []

    def read():
        while not stop.is_set():
            try:
                text = (tmp_path / PROGRESS_FILE).read_text()
            except FileNotFoundError:  # never: the file is replaced, not removed
                bad.append("missing")
                continue
            try:
                json.loads(text)
                reads[0] += 1
            except ValueError as exc:
                bad.append(str(exc))

    def write(name):
        for i in range(150):
            p.event("timing", f"{name} round {i}", k=i, padding="x" * (i % 7) * 50)

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write, args=(n,)) for n in "ab"]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    p.stop()
    stop.set()
    reader.join()
    assert not bad and reads[0] > 0
    doc = _doc(tmp_path)
    assert doc["count"] == 302 and doc["finished"] == "done"


def test_the_ticker_fills_a_silent_stretch_with_ticks_of_the_stage_now(tmp_path):
    with Progress(tmp_path, tick_s=0.05) as p:
        p.event("compile", "compiling model 3 of 14 (haares two_phase compile)", case="haares|x", k=3, n=14)
        deadline = time.monotonic() + 10
        while sum(e["stage"] == "tick" for e in p.document()["events"]) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)  # a blocking call: no event of its own
        doc = _doc(tmp_path)
    ticks = [e for e in doc["events"] if e["stage"] == "tick"]
    assert len(ticks) >= 3, doc["events"]
    for t in ticks:
        assert t["text"].startswith("still compiling model 3 of 14 (haares two_phase compile), ")
        assert (t["of"], t["case"], t["k"], t["n"]) == ("compile", "haares|x", 3, 14)
        assert "since" in t and "elapsed" in t
    assert doc["latest"]["stage"] == "compile"  # a tick never replaces the stage now
    final = _doc(tmp_path)
    assert final["events"][-1]["stage"] == "done" and final["latest"]["stage"] == "done"
    n = len(final["events"])
    time.sleep(0.2)
    assert len(_doc(tmp_path)["events"]) == n  # stopped: no tick after the final event


def test_the_events_are_capped_and_the_dropped_counted(tmp_path):
    with Progress(tmp_path, tick_s=None, max_events=10) as p:
        for i in range(25):
            p.event("timing", f"round {i}", round=i)
    doc = _doc(tmp_path)
    assert len(doc["events"]) == 10 and doc["count"] == 27 and doc["dropped"] == 17
    assert [e.get("round") for e in doc["events"][:9]] == list(range(16, 25))
    assert doc["events"][-1]["stage"] == "done"


def test_an_exception_ends_the_progress_interrupted(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with Progress(tmp_path, tick_s=0.05) as p:
            p.event("warmup", "warming up model 1 of 1")
            raise KeyboardInterrupt
    doc = _doc(tmp_path)
    assert doc["finished"] == "interrupted" and doc["latest"]["text"] == "interrupted (KeyboardInterrupt)"


def test_a_failing_write_never_stops_the_run_and_no_dir_writes_nothing(tmp_path):
    p = Progress(tmp_path / "gone", tick_s=None)  # a directory that is not there
    ev = p.event("build", "building")
    assert ev["stage"] == "build" and p.write_error and not (tmp_path / "gone").exists()
    mem = Progress(None, tick_s=None)
    with mem:
        mem.event("build", "building")
    assert [e["stage"] for e in mem.events] == ["start", "build", "done"] and mem.write_error is None


def test_describe_says_the_stage_its_age_and_whether_its_writer_runs():
    doc = {"pid": 41, "tick_s": 10, "finished": None, "updated_t": 1000.0,
           "latest": {"t": 988.0, "stage": "compile", "text": "compiling model 3 of 14", "case": "haares|{}|x",
                      "router": "haares"}}
    line = describe(doc, {"pid": 41}, now=1000.0)
    assert line == "compiling model 3 of 14 (haares|…), 12 s ago (pid 41 running)"
    assert "no update for" in describe(doc, {"pid": 41}, now=1100.0)
    assert describe(doc, None, now=1000.0).endswith("(pid 41 not running: the run stopped without a final event)")
    assert "held by pid 7" in describe(doc, {"pid": 7}, now=1000.0)
    done = {**doc, "finished": "done", "latest": {"t": 990.0, "stage": "done", "text": "cost sweep done: ok 2"}}
    assert describe(done, None, now=1000.0) == "cost sweep done: ok 2, 10 s ago (finished: done)"
    assert age_text(5) == "5 s" and age_text(600) == "10 min" and age_text(3 * 86400) == "3.0 d"
    assert "no event yet" in describe({"pid": 1}, None)


# --- a real group ----------------------------------------------------------------------------

def _stages(events: list[dict], key: str) -> list[str]:
    return [e["stage"] for e in events if e.get("case") == key and e["stage"] != "tick"]


def _check_sweep(run_dir, cases: list[Case], expect: dict[str, list[str]]) -> list[dict]:
    """Every stage of every case's set-up, the unit's start and end, and the timing's beats."""
    doc = _doc(run_dir)
    events = doc["events"]
    assert doc["finished"] == "done" and doc["dropped"] == 0
    stages = [e["stage"] for e in events if e["stage"] != "tick"]
    assert stages[:3] == ["start", "sweep", "unit"] and stages[-2:] == ["unit_done", "done"]
    unit = events[[e["stage"] for e in events].index("unit")]
    assert (unit["k"], unit["n"]) == (1, 1) and unit["text"].startswith("group 1 of 1: 2 cases d=16 L=1")
    for k, case in enumerate(cases, 1):
        got = _stages(events, case.key)
        assert got == ["case", *expect[case.key], "prepared"], (case.key, got)
        mine = [e for e in events if e.get("case") == case.key]
        assert all((e["k"], e["n"]) == (k, 2) and e["text"] for e in mine)
    compiled = [e for e in events if e["stage"] == "compile"]
    assert all(e["text"].startswith("compiling model ") for e in compiled)
    # the timing: its start, then (harness/sweep/timed.py time_group) a beat every 2 rounds
    timing = [e for e in events if e["stage"] == "timing"]
    assert timing and timing[0]["n"] == 2 and timing[0]["weight"] == 2
    rounds = [e["round"] for e in timing if "round" in e]
    assert set(range(2, ROUNDS + 1, 2)) <= set(rounds), timing
    assert all(b - a <= 2 for a, b in zip(rounds, rounds[1:])), rounds
    last_setup = max(i for i, e in enumerate(events) if e["stage"] == "prepared")
    assert all(i > last_setup for i, e in enumerate(events) if e["stage"] == "timing")
    done = [e for e in events if e["stage"] == "unit_done"][0]
    assert done["statuses"] == {"ok": 2}
    return events


def test_every_stage_of_every_case_of_a_group_is_a_progress_event(tmp_path):
    a = Case("prenorm", TINY, "fwd_bwd")
    b = Case("haares", TINY, "fwd_bwd", impl="two_phase")
    with RunWriter(tmp_path, "run", "s", base={"device": "cpu"}) as w:
        assert run_sweep([a, b], CPU, w, QUICK, progress=False) == {"resumed": 0, "ok": 2}
    _check_sweep(tmp_path, [a, b], {
        a.key: ["build", "count", "saved_activation", "warmup"],
        b.key: ["parity", "build", "count", "saved_activation", "warmup"]})


@pytest.mark.compile
@pytest.mark.slow
def test_a_compiled_case_tells_its_compile(tmp_path):
    a = Case("prenorm", TINY, "fwd_bwd", backend="compile", compile_mode="default", compile_scope="model")
    b = Case("haares", TINY, "fwd_bwd", impl="two_phase")
    with RunWriter(tmp_path, "run", "s", base={"device": "cpu"}) as w:
        assert run_sweep([a, b], CPU, w, QUICK, progress=False) == {"resumed": 0, "ok": 2}
    events = _check_sweep(tmp_path, [a, b], {
        a.key: ["build", "count", "compile", "warmup"],
        b.key: ["parity", "build", "count", "saved_activation", "warmup"]})
    compiled = [e for e in events if e["stage"] == "compile"]
    assert len(compiled) == 1 and compiled[0]["text"] == ("compiling model 1 of 2 (prenorm naive compile, "
                                                          "model scope)")


@pytest.mark.slow
def test_under_isolate_the_parent_records_the_childs_beats(tmp_path):
    a = Case("prenorm", TINY, "fwd")
    b = Case("haares", TINY, "fwd", impl="two_phase")
    opts = SweepOptions(flops=False, timing=QUICK.timing, paired=True, max_attempts=1, isolate=True,
                        case_timeout=300.0)
    with RunWriter(tmp_path, "run", "s", base={"device": "cpu"}) as w:
        assert run_sweep([a, b], CPU, w, opts, progress=False) == {"resumed": 0, "ok": 2}
    events = _check_sweep(tmp_path, [a, b], {a.key: ["build", "count", "warmup"],
                                             b.key: ["parity", "build", "count", "warmup"]})
    stages = [e["stage"] for e in events]
    assert stages.index("spawn") < stages.index("case")
    assert {e["pid"] for e in events if e["stage"] == "start"} == {os.getpid()}  # the parent wrote it


# --- routerbench status ----------------------------------------------------------------------

def _run_dir(tmp_path):
    d = tmp_path / "cpu" / "r"
    w = RunWriter(d, "r", "s", base={"device": "cpu"})
    case = Case("prenorm", TINY, "fwd")
    with w.unit([case.key], kind="case") as u:
        u.write(**case.columns(), metric="step_time", value=1.0, unit="ms", repeat=0)
        u.commit({case.key: "ok"})
    return d, w


def test_status_prints_the_stage_now_and_survives_a_copy_without_lock_or_file(tmp_path):
    d, w = _run_dir(tmp_path)
    p = Progress(d, tick_s=None)
    p.start()
    p.event("compile", "compiling model 3 of 14 (haares two_phase compile, model scope)",
            case="haares|{}|two_phase", k=3, n=14)
    out = CliRunner().invoke(main, ["status", str(d)])
    assert out.exit_code == 0, out.output
    line = [ln for ln in out.output.splitlines() if ln.startswith("progress:")]
    assert len(line) == 1, out.output
    assert line[0].startswith("progress:  compiling model 3 of 14 (haares two_phase compile, model scope), ")
    assert line[0].endswith(f" ago (pid {os.getpid()} running)")
    # a copy elsewhere: no lock held, no pid running there
    copy = tmp_path / "copy"
    shutil.copytree(d, copy, ignore=shutil.ignore_patterns(".lock"))
    out = CliRunner().invoke(main, ["status", str(copy)])
    assert out.exit_code == 0, out.output
    assert "progress:  compiling model 3 of 14" in out.output and "not running" in out.output
    (copy / PROGRESS_FILE).write_text('{"torn')  # unreadable: no line, no failure
    out = CliRunner().invoke(main, ["status", str(copy)])
    assert out.exit_code == 0 and "progress:" not in out.output and "running:   no" in out.output
    (copy / PROGRESS_FILE).unlink()
    out = CliRunner().invoke(main, ["status", str(copy)])
    assert out.exit_code == 0 and "progress:" not in out.output
    assert read_progress(copy) is None
    p.stop()
    w.close()
    out = CliRunner().invoke(main, ["status", str(d)])
    assert "progress:  done" in out.output and "(finished: done)" in out.output
