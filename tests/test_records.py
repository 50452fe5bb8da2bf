"""The record format: units committed whole with an end marker, abandoned units kept in
``aborted/``, torn tails and dead writers' leftovers recovered, one writer per directory, a full disk
leaving nothing partial, and the torchrun rule (rank 0 alone writes)."""

from __future__ import annotations

import json

import pytest

from harness.rundir import faults
from harness.rundir.lock import RunLockedError
from harness.rundir.records import (ABORTED_DIR, END, LOCK_FILE, MANIFEST_FILE, PENDING_DIR, RECORDS_FILE,
                                    SCHEMA_VERSION, RecordsWarning, aborted_summary, completed_cases,
                                    iter_units, load_rows, lock_holder, read_jsonl, scan_records)
from harness.rundir.writer import DiskFullError, RunWriter
from routers.errors import ConfigError


def rows_of(w, key, n, metric="step_time"):
    for i in range(n):
        w.write(case_key=key, router=key, metric=metric, value=float(i), unit="ms", repeat=i)


def test_a_unit_is_committed_whole_with_its_marker(tmp_path):
    with RunWriter(tmp_path, "r", "s1", base={"device": "cpu"}) as w:
        with w.unit(["a", "b"], kind="group") as u:
            rows_of(u, "a", 3)
            rows_of(u, "b", 2)
            # staged, not yet visible in the records
            assert load_rows([tmp_path]) == [] and len(read_jsonl(u.path)) == 5
        assert w.completed == {"a": "ok", "b": "ok"}
    lines = [json.loads(ln) for ln in (tmp_path / RECORDS_FILE).read_text().splitlines()]
    assert len(lines) == 6 and END in lines[-1] and lines[-1]["rows"] == 5
    assert lines[-1]["cases"] == ["a", "b"] and lines[-1]["kind"] == "group"
    rows = load_rows([tmp_path])
    assert len(rows) == 5 and {r["schema"] for r in rows} == {SCHEMA_VERSION}
    assert {r["resume_unit"] for r in rows} == {lines[-1][END]} and rows[0]["device"] == "cpu"
    assert not list((tmp_path / PENDING_DIR).glob("*.jsonl"))


def test_an_exception_abandons_the_unit_into_aborted(tmp_path):
    (tmp_path / MANIFEST_FILE).write_text(json.dumps({"run_id": "r"}))
    with RunWriter(tmp_path, "r", "s1") as w:
        with w.unit(["a"]) as u:
            rows_of(u, "a", 2)
        with pytest.raises(KeyboardInterrupt):
            with w.unit(["b"]) as u:
                rows_of(u, "b", 4)
                raise KeyboardInterrupt
        assert "b" not in w.completed
    assert [r["case_key"] for r in load_rows([tmp_path])] == ["a", "a"]
    aborted = list((tmp_path / ABORTED_DIR).glob("s1-*.jsonl"))
    assert len(aborted) == 1 and len(read_jsonl(aborted[0])) == 4
    assert aborted_summary(tmp_path) == {"units": 1, "rows": 4}
    assert json.loads((tmp_path / MANIFEST_FILE).read_text())["aborted"] == {"units": 1, "rows": 4}
    assert read_jsonl(tmp_path / ABORTED_DIR / "index.jsonl")[0]["reason"] == "KeyboardInterrupt"


def test_a_dead_writers_pending_unit_and_torn_tail_are_recovered(tmp_path):
    w = RunWriter(tmp_path, "r", "s1")
    with w.unit(["a"]) as u:
        rows_of(u, "a", 2)
    good = (tmp_path / RECORDS_FILE).read_bytes()
    u = w.unit(["b"])
    rows_of(u, "b", 3)  # the process "dies" here: its unit stays pending
    w.close()
    with open(tmp_path / RECORDS_FILE, "ab") as fh:  # and a commit torn half-way
        fh.write(b'{"case_key": "c", "schema": 2, "resume_unit": "x"}\n{"case_key": "c", "sch')
    with pytest.warns(RecordsWarning, match=r"lines 4–5 after the last end marker: an unfinished unit "
                      r"\(1 row, 1 unparsable\), not read as results"):
        assert [r["case_key"] for r in load_rows([tmp_path])] == ["a", "a"]  # the tail is not results
    w2 = RunWriter(tmp_path, "r", "s2")
    assert w2.recovered == {"torn_tail_bytes": len(b'{"case_key": "c", "schema": 2, "resume_unit": "x"}\n'
                                                   b'{"case_key": "c", "sch'), "pending_units": 1}
    assert (tmp_path / RECORDS_FILE).read_bytes() == good  # cut back to the last end marker
    assert w2.completed == {"a": "ok"}
    moved = {p.name for p in (tmp_path / ABORTED_DIR).glob("*.jsonl")} - {"index.jsonl"}
    assert moved == {u.path.name, "s2-torn-tail.jsonl"}
    with w2.unit(["b"]) as u2:  # the next commit starts on a clean line
        rows_of(u2, "b", 1)
    w2.close()
    assert [r["case_key"] for r in load_rows([tmp_path])] == ["a", "a", "b"]


def test_a_unit_that_does_not_match_its_marker_loads_with_a_problem_and_counts_as_done(tmp_path):
    with RunWriter(tmp_path, "r", "s1") as w:
        with w.unit(["a"]) as u:
            rows_of(u, "a", 2)
    path = tmp_path / RECORDS_FILE
    lines = path.read_text().splitlines()
    marker = json.loads(lines[-1])
    marker["rows"] = 3  # a count that the unit does not hold
    path.write_text("\n".join(lines[:-1] + [json.dumps(marker)]) + "\n")
    problems = []
    with pytest.warns(RecordsWarning, match="line 3: the end marker of unit s1-0001 counts 3 rows but 2"):
        assert [r["repeat"] for r in load_rows([tmp_path], problems=problems)] == [0, 1]
    assert len(problems) == 1 and problems[0].startswith(f"{path} line 3: ")
    assert completed_cases(tmp_path) == {"a": "ok"}  # a resume does not measure it twice
    assert [len(rows) for _, rows in iter_units(path)] == [2]
    before = path.read_bytes()
    with RunWriter(tmp_path, "r", "s2") as w:  # the writer agrees: nothing to cut
        assert w.recovered["torn_tail_bytes"] == 0 and w.completed == {"a": "ok"}
    assert path.read_bytes() == before
    row = json.loads(lines[0])
    row["resume_unit"] = "elsewhere"  # a row under another unit's marker
    path.write_text("\n".join([json.dumps(row)] + lines[1:]) + "\n")
    units_, problems = scan_records(path)
    assert [len(rows) for _, rows in units_] == [2]
    assert problems == [f"{path} line 1: rows of resume_unit elsewhere before the end marker of unit "
                        "s1-0001 (line 3); loaded with that unit"]


def test_unparsable_and_truncated_lines_are_reported_by_line_and_no_valid_row_is_lost(tmp_path):
    with RunWriter(tmp_path, "r", "s1") as w:
        with w.unit(["a"]) as u:
            rows_of(u, "a", 3)
        with w.unit(["b"]) as u:
            rows_of(u, "b", 2)
    path = tmp_path / RECORDS_FILE
    lines = path.read_text().splitlines()  # 1-3 rows of a, 4 its marker, 5-6 rows of b, 7 its marker
    lines[1] = lines[1][:25]  # a row garbled in the middle of the file
    path.write_text("\n".join(lines) + "\n" + '{"case_key": "c", "sche')  # and a truncated last line
    problems = []
    with pytest.warns(RecordsWarning) as caught:
        rows = load_rows([tmp_path], problems=problems)
    assert [(r["case_key"], r["repeat"]) for r in rows] == [("a", 0), ("a", 2), ("b", 0), ("b", 1)]
    assert problems == [
        f"{path} line 2: unparsable, skipped (unit s1-0001: 2 of 3 rows loaded)",
        f"{path} line 8 after the last end marker: an unfinished unit (0 rows, 1 unparsable), not read as "
        f"results; the next writer moves them to {ABORTED_DIR}/"]
    assert [str(c.message) for c in caught if c.category is RecordsWarning] == problems  # each once
    assert completed_cases(tmp_path) == {"a": "ok", "b": "ok"}
    from reports.frame import load_frame
    with pytest.warns(RecordsWarning):
        df = load_frame([tmp_path])
    assert len(df) == 4 and df.attrs["record_problems"] == problems
    with RunWriter(tmp_path, "r", "s2") as w:  # the writer cuts exactly the tail the reader skipped
        assert w.recovered["torn_tail_bytes"] == len('{"case_key": "c", "sche')
    assert scan_records(path)[1] == problems[:1]


def test_one_writer_per_run_directory(tmp_path):
    w = RunWriter(tmp_path, "same", "s1")
    holder = lock_holder(tmp_path)
    assert holder["pid"] > 0 and holder["host"]
    with pytest.raises(RunLockedError) as exc:
        RunWriter(tmp_path, "same", "s2")
    msg = str(exc.value)
    assert f"pid {holder['pid']}" in msg and "--run-id same" in msg and "\n" not in msg
    w.close()
    assert lock_holder(tmp_path) is None
    RunWriter(tmp_path, "same", "s3").close()
    assert (tmp_path / LOCK_FILE).exists()


def test_a_full_disk_leaves_no_partial_unit(tmp_path, monkeypatch):
    with RunWriter(tmp_path, "r", "s1") as w:
        with w.unit(["a|x"]) as u:
            rows_of(u, "a|x", 2)
        before = (tmp_path / RECORDS_FILE).read_bytes()
        monkeypatch.setenv(faults.ENV, "disk_full:b|*")
        with pytest.raises(DiskFullError, match="no space left"):
            with w.unit(["b|x"]) as u:
                rows_of(u, "b|x", 5)
        # the injected fault wrote half the unit before failing: it was cut back
        assert (tmp_path / RECORDS_FILE).read_bytes() == before
        assert "b|x" not in w.completed
        monkeypatch.delenv(faults.ENV)
        with w.unit(["c|x"]) as u:
            rows_of(u, "c|x", 1)
    assert [r["case_key"] for r in load_rows([tmp_path])] == ["a|x", "a|x", "c|x"]
    assert aborted_summary(tmp_path) == {"units": 1, "rows": 5}


def test_out_errors_name_the_option(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigError, match=r"^--out .*a part of that path is a file"):
        RunWriter(f / "dev" / "r", "r", "s", out_option=f"--out {f}")


def test_schema_1_directories_are_still_read(tmp_path):
    old = [{"case_key": "a", "session": "s1", "metric": "step_time", "value": 1.0},
           {"case_key": "a", "session": "s2", "metric": "step_time", "value": 2.0},
           {"case_key": "b", "session": "s2", "metric": "step_time", "value": 3.0}]
    (tmp_path / RECORDS_FILE).write_text("".join(json.dumps(r) + "\n" for r in old))
    (tmp_path / "done.jsonl").write_text(json.dumps({"case_key": "a", "session": "s2"}) + "\n")
    problems = []
    with pytest.warns(RecordsWarning, match=r"schema 1 records \(an older routerbench\): read, never"):
        rows = load_rows([tmp_path], problems=problems)
    assert [(r["case_key"], r["value"]) for r in rows] == [("a", 2.0), ("b", 3.0)]
    assert problems == [f"{tmp_path / RECORDS_FILE}: schema 1 records (an older routerbench): read, "
                        "never extended"]
    assert completed_cases(tmp_path) == {"a": "ok"}
    with pytest.raises(ConfigError, match="--run-id r: .* schema 1 .* choose another --run-id"):
        RunWriter(tmp_path, "r", "s3")  # read, never extended: old and new rows would mix
    assert len(read_jsonl(tmp_path / RECORDS_FILE)) == 3


def test_records_of_a_newer_schema_are_refused_not_read_as_this_one(tmp_path):
    """A records.jsonl of a schema this version does not know (written by a newer routerbench) is
    neither read nor extended: one line naming the file, its line, both schemas and the upgrade.
    Older schemas are read as before."""
    from harness.rundir.records import NewerSchemaError
    rows = [{"schema": SCHEMA_VERSION + 5, "case_key": "a", "resume_unit": "u", "metric": "step_time", "value": 1.0},
            {"end_of_unit": "u", "schema": SCHEMA_VERSION + 5, "rows": 1, "cases": ["a"]}]
    (tmp_path / RECORDS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    msg = (rf"line 1: records of schema {SCHEMA_VERSION + 5}, newer than this routerbench reads \(schema "
           rf"{SCHEMA_VERSION}\): upgrade routerbench")
    with pytest.raises(NewerSchemaError, match=msg):
        load_rows([tmp_path])
    with pytest.raises(ConfigError, match=msg):
        RunWriter(tmp_path, "r", "s")
    (tmp_path / RECORDS_FILE).write_text("".join(json.dumps({**r, "schema": SCHEMA_VERSION}) + "\n" for r in rows)
                                         + json.dumps({**rows[0], "schema": SCHEMA_VERSION + 1}) + "\n")
    with pytest.raises(NewerSchemaError, match=r"line 3: records of schema"):  # a newer writer's rows after ours
        load_rows([tmp_path])
    (tmp_path / RECORDS_FILE).write_text("".join(json.dumps({**r, "schema": 3}) + "\n" for r in rows))
    assert [r["value"] for r in load_rows([tmp_path])] == [1.0]


def test_only_rank_0_writes_under_torchrun(tmp_path, monkeypatch):
    from harness.cli.common import Run
    from harness.rundir.writer import NullRunWriter
    from harness.spec import RunSpec, load
    spec, labels = load(RunSpec, {"widths": "16", "depths": "2", "out": str(tmp_path), "run_id": "x"}, None)
    spec = spec.resolve(labels)
    monkeypatch.setenv("RANK", "1")
    run = Run("run", spec)
    assert isinstance(run.writer, NullRunWriter)
    with run.writer.unit(["a"]) as u:
        u.write(case_key="a", metric="step_time", value=1.0, unit="ms")
        u.commit()
    assert list(tmp_path.iterdir()) == []  # nothing created, no lock taken
    monkeypatch.setenv("RANK", "0")
    run = Run("run", spec)
    assert isinstance(run.writer, RunWriter) and (run.dir / "spec.toml").exists()
    run.writer.close()


def test_fault_hook_parsing():
    assert faults.parse("oom:haares|*; crash:rezero|*") == [("oom", "haares|*", None), ("crash", "rezero|*", None)]
    assert faults.parse("kill_after_eval=2:train|*") == [("kill_after_eval", "train|*", 2)]
    with pytest.raises(ValueError, match=r"KIND\[=N\]:GLOB"):
        faults.parse("explode:x")
    with pytest.raises(ValueError, match="checkpoint_replaced needs"):
        faults.parse("checkpoint_replaced:train|*")


def test_every_fault_kind_is_documented_in_the_hook_and_the_docs():
    """The one hook's kinds are those its module docstring and the fault list of
    docs/DEVELOPING.md ("Fault injection") name."""
    from pathlib import Path
    page = (Path(__file__).resolve().parents[1] / "docs" / "DEVELOPING.md").read_text()
    listed = page[page.index("**Fault injection**"):][:2000]
    for kind in faults.KINDS:
        assert f"``{kind}" in faults.__doc__, kind
        assert f"`{kind}" in listed, kind


def test_a_torn_staged_row_is_not_committed(tmp_path):
    """A fragment in a pending file (a child killed while writing a row) never reaches the records."""
    with RunWriter(tmp_path, "r", "s1") as w:
        with w.unit(["a"]) as u:
            rows_of(u, "a", 2)
            with open(u.path, "a") as fh:
                fh.write('{"case_key": "a", "met')
    assert [m["rows"] for m in iter_units_of(tmp_path)] == [2]
    assert len(load_rows([tmp_path])) == 2


def iter_units_of(d):
    return [m for m, _ in iter_units(d / RECORDS_FILE)]
