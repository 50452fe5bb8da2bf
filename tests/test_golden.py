"""Behaviour that a change of layout must not move: a tiny CPU eager sweep and a tiny training run
through the ``routerbench`` command, compared with ``tests/golden/behaviour.json``.

What is compared: every case key with its metrics, units, statuses and row counts, the record
columns (and which of them each metric fills), the end markers' kinds, and the file list of each
run directory and of a report of both. What is not: any measured value (times,
FLOPs, losses), which vary by machine (DESIGN.md, "Results"). No compile and no fvcore, so it runs
in seconds. Noise readings that a machine may lack (``cpu_pressure`` needs ``/proc/pressure``) are
dropped from both sides where this machine has no such file (and so is a training run's
``train_cpu_pressure``).

Regenerate after an intended change, and read the diff before committing it::

    make golden        # = .venv/bin/python -m pytest tests/test_golden.py --update-golden -q
    git diff tests/golden/behaviour.json
"""

from __future__ import annotations

import difflib
import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from harness.cli import main

GOLDEN = Path(__file__).with_name("golden") / "behaviour.json"
PRESSURE = Path("/proc/pressure/cpu")
#: Readings that exist only where the machine offers them.
OPTIONAL_METRICS = {"cpu_pressure", "train_cpu_pressure"} if not PRESSURE.exists() else set()
#: A fixed text (a corpus's sha256 is part of a training case key).
TEXT = ("It is a truth universally acknowledged, that a single man in possession of a good "
        "fortune, must be in want of a wife. However little known the feelings or views of such "
        "a man may be on his first entering a neighbourhood, this truth is so well fixed in the "
        "minds of the surrounding families, that he is considered the rightful property of some "
        "one or other of their daughters.\n") * 40
SWEEP = ["run", "--routers", "prenorm,rezero,block_attnres", "--impls", "naive,two_phase",
         "--widths", "16", "--depths", "2", "--n-heads", "2", "--seq-len", "8", "--batch-size", "2",
         "--modes", "fwd,fwd_bwd", "--backends", "eager", "--smallest-backends", "", "--no-flops",
         "--repeats", "6", "--max-attempts", "1", "--warmup-s", "0", "--no-train", "--quiet"]
TRAIN = ["train", "--routers", "prenorm,haares", "--d-model", "16", "--n-layers", "2", "--n-heads", "2",
         "--seq-len", "8", "--batch-size", "4", "--max-steps", "4", "--eval-every", "2", "--seeds", "1",
         "--target-loss", "0.01", "--quiet"]


def _invoke(*args) -> None:
    res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code == 0, res.output


def _records(run_dir: Path) -> dict:
    """What a run directory's records say, less the measured values."""
    rows, markers = [], []
    for line in (run_dir / "records.jsonl").read_text().splitlines():
        r = json.loads(line)
        (markers if "end_of_unit" in r else rows).append(r)
    cases: dict[str, Counter] = {}
    filled: dict[str, set] = {}
    for r in rows:
        if r["metric"] in OPTIONAL_METRICS:
            continue
        cases.setdefault(r["case_key"] or "(run-level)", Counter())[
            f"{r['metric']} [{r['unit']}] {r['status']}"] += 1
        filled.setdefault(r["metric"], set()).update(k for k, v in r.items() if v is not None)
    return {"columns": sorted({k for r in rows for k in r}),
            "filled_columns": {m: " ".join(sorted(v)) for m, v in sorted(filled.items())},
            "units": sorted({m["kind"] for m in markers}),
            "cases": {k: sorted(f"{m} x{n}" for m, n in v.items()) for k, v in sorted(cases.items())}}


def _files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.is_file() and not p.name.startswith("."))


def behaviour(tmp: Path) -> dict:
    """Run the tiny sweep, the tiny training run and a report of both; what they wrote."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        text = tmp / "text.txt"
        text.write_text(TEXT)
        _invoke("data", "prepare", "--text", text, "--out", tmp / "corpus")
        _invoke(*SWEEP, "--out", tmp / "results", "--run-id", "sweep")
        _invoke(*TRAIN, "--data", tmp / "corpus", "--out", tmp / "results", "--run-id", "train")
        sweep, train = (next((tmp / "results").glob(f"*/{name}")) for name in ("sweep", "train"))
        _invoke("report", sweep, train, "--out", tmp / "report")
    finally:
        torch.set_num_threads(threads)
    return {"sweep": {"records": _records(sweep), "files": _files(sweep)},
            "train": {"records": _records(train), "files": _files(train)},
            "report_of_both": _files(tmp / "report")}


def test_behaviour_matches_the_golden_file(tmp_path, request):
    got = behaviour(tmp_path)
    if request.config.getoption("--update-golden"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        pytest.skip(f"wrote {GOLDEN}; read `git diff {GOLDEN}` before committing it")
    assert GOLDEN.exists(), f"{GOLDEN} is missing: make golden"
    want = json.loads(GOLDEN.read_text())
    for part in ("sweep", "train"):
        rec = want[part]["records"]
        for case in rec["cases"].values():
            case[:] = [m for m in case if m.split(" ")[0] not in OPTIONAL_METRICS]
        for m in OPTIONAL_METRICS:
            rec["filled_columns"].pop(m, None)
    if got != want:
        diff = "\n".join(difflib.unified_diff(
            json.dumps(want, indent=1, sort_keys=True).splitlines(),
            json.dumps(got, indent=1, sort_keys=True).splitlines(), "golden", "this tree", lineterm="", n=1))
        pytest.fail("what the tiny sweep and training run record moved (- golden, + this tree):\n"
                    f"{diff}\nIf the change is intended, rewrite the golden file with `make golden` (= "
                    "python -m pytest tests/test_golden.py --update-golden) and commit it with the change.",
                    pytrace=False)
