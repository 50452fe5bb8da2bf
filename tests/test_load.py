"""The documented loading API (reports.load, reports/loading.py) and ``routerbench export``: a run
with end-of-unit markers, a re-timed group (two attempts) and a torn tail reads as exactly its
cases' last-attempt rows, through ``reports.load`` and through an exported Parquet or CSV file read
by DuckDB and pandas; run-level rows and damaged lines are kept apart, never raised."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from click.testing import CliRunner

import reports
from harness.cli import main
from harness.rundir.records import RECORDS_FILE, RecordsWarning
from harness.rundir.writer import RunWriter

SHAPE = {"d_model": 32, "n_layers": 2, "n_heads": 2, "seq_len": 16, "batch_size": 2, "dtype": "float32"}
#: attempt -> case -> its step times (ms): prenorm timed twice in attempt 1 is busy, "a" re-timed.
TIMES = {1: {"p": [238.7, 240.1], "a": [999.8, 996.0]}, 2: {"p": [230.0, 231.0], "a": [301.0, 302.0]}}
#: The case rows ``reports.load`` must give: (case_key, metric, repeat, attempt, value).
WANT = sorted([("p", "params", None, None, 1000.0), ("a", "params", None, None, 1100.0),
               ("p", "step_time", 0, 1, 238.7), ("p", "step_time", 1, 1, 240.1),
               ("p", "cpu_util", None, 1, 0.9),
               ("a", "step_time", 0, 2, 301.0), ("a", "step_time", 1, 2, 302.0),
               ("a", "cpu_util", None, 2, 0.95)])
TORN = b'{"case_key": "b", "schema": 4, "metric": "step_ti'


def _case(key: str) -> dict:
    return {"case_key": key, "router": "prenorm" if key == "p" else "haares", "impl": "naive",
            "backend": "eager", "mode": "fwd_bwd", "workload": "synthetic", **SHAPE}


def _attempt(u, n: int, keys=("p", "a"), retimed: str | None = None) -> None:
    for k in keys:
        partner = retimed if retimed and k != retimed else None
        for i, ms in enumerate(TIMES[n][k]):
            u.write(**_case(k), metric="step_time", value=ms, unit="ms", repeat=i, pair=i, attempt=n,
                    n_pairs=2, stop="fixed", pairs_with=partner)
        if not partner:
            u.write(**_case(k), metric="cpu_util", value=0.9 if k == "p" else 0.95 - 0.1 * (n == 1),
                    unit="ratio", attempt=n)


def make_run(path, run_id="r1", retime=True, torn=True):
    """A run directory: a bandwidth unit (run-level rows), a group of prenorm ``p`` and router
    ``a`` whose ``a`` is timed twice (attempt 2 with ``p`` as its partner), and a torn tail."""
    with RunWriter(path, run_id, "s1", base={"device": "cpu"}) as w:
        with w.unit([], kind="bandwidth") as u:
            for i, gbs in enumerate((10.0, 11.0)):
                u.write(case_key="bandwidth|cpu", metric="mem_bandwidth", value=gbs, unit="GB/s", repeat=i)
            u.commit(extra={"status": "ok"})
        with w.unit(["p", "a"], kind="group") as u:
            u.write(**_case("p"), metric="params", value=1000, unit="count")
            u.write(**_case("a"), metric="params", value=1100, unit="count")
            _attempt(u, 1)
            if retime:
                _attempt(u, 2, retimed="a")
    if torn:
        with open(path / RECORDS_FILE, "ab") as fh:
            fh.write(TORN)
    return path


def _none(v):
    return None if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA else v


def cases(df, run=False) -> list[tuple]:
    cols = ["case_key", "metric", "repeat", "attempt", "value"] + (["run_id"] if run else [])
    return sorted(tuple(_none(v) if c != "value" else float(v) for c, v in zip(cols, r))
                  for r in df[cols].itertuples(index=False))


def _load(*a, **kw):
    with pytest.warns(RecordsWarning, match="after the last end marker"):
        return reports.load(*a, **kw)


def test_load_gives_each_cases_last_attempt_and_no_markers(tmp_path):
    run = make_run(tmp_path / "r1")
    lines = [json.loads(ln) for ln in (run / RECORDS_FILE).read_text().splitlines()[:-1]]
    assert sum("end_of_unit" in ln for ln in lines) == 2  # what read_json would read as rows
    df = _load(run)
    assert cases(df) == WANT
    assert (df["metric"] != "").all() and df["value"].notna().all() and (df["status"] == "ok").all()
    assert not df["metric"].str.startswith("mem_bandwidth").any()
    assert set(df.loc[df["case_key"] == "a", "attempts"]) == {2}
    assert not df["partner_only"].any()
    assert (df["run_id"] == "r1").all() and df["d_model"].dtype == "int64"


def test_run_level_rows_and_damage_are_kept_apart(tmp_path):
    run = make_run(tmp_path / "r1")
    df = _load(tmp_path)  # a folder holding the run directory
    rr = reports.run_rows(df)
    assert list(zip(rr["metric"], rr["value"])) == [("mem_bandwidth", 10.0), ("mem_bandwidth", 11.0)]
    dmg = reports.damaged(df)
    n = len((run / RECORDS_FILE).read_text().splitlines())
    assert dmg[["file", "line", "last_line"]].values.tolist() == [[str(run / RECORDS_FILE), n, n]]
    assert dmg["reason"][0].startswith("after the last end marker: an unfinished unit (0 rows, 1 unparsable)")
    with pytest.raises(ValueError):  # pandas itself trips on the torn tail
        pd.read_json(run / RECORDS_FILE, lines=True)
    whole = reports.load(make_run(tmp_path / "whole", torn=False))
    assert reports.damaged(whole).empty and cases(whole) == WANT


def test_all_attempts_and_partner_rows_on_request(tmp_path):
    run = make_run(tmp_path / "r1")
    df = _load(run, attempts="all")
    steps = df[df["metric"] == "step_time"]
    assert sorted(steps.loc[steps["case_key"] == "a", "value"]) == [301.0, 302.0, 996.0, 999.8]
    assert sorted(steps.loc[steps["superseded"], "value"]) == [230.0, 231.0, 996.0, 999.8]
    assert cases(df[~df["superseded"]]) == WANT and len(df) == len(WANT) + 5  # a's cpu_util of attempt 1
    with_partners = _load(run, partners=True)
    extra = with_partners[with_partners["partner_only"]]  # the pairs of each case's last timing
    assert sorted(zip(extra["case_key"], extra["attempt"], extra["value"])) == [
        ("a", 1, 996.0), ("a", 1, 999.8), ("p", 2, 230.0), ("p", 2, 231.0)]
    assert set(extra.loc[extra["case_key"] == "p", "pairs_with"]) == {"a"}
    assert cases(with_partners[~with_partners["partner_only"]]) == WANT
    with pytest.raises(ValueError, match="attempts"):
        reports.load(run, attempts="first")


def test_two_runs_read_together_keep_every_row_of_both(tmp_path):
    make_run(tmp_path / "r1", run_id="r1")
    make_run(tmp_path / "r2", run_id="r2", retime=False, torn=False)  # same session and case keys
    df = _load(tmp_path / "r1", tmp_path / "r2")
    once = [("p", "params", None, None, 1000.0), ("a", "params", None, None, 1100.0),
            ("p", "step_time", 0, 1, 238.7), ("p", "step_time", 1, 1, 240.1), ("p", "cpu_util", None, 1, 0.9),
            ("a", "step_time", 0, 1, 999.8), ("a", "step_time", 1, 1, 996.0), ("a", "cpu_util", None, 1, 0.85)]
    want = sorted([w + ("r1",) for w in WANT] + [w + ("r2",) for w in once])
    assert [c[:4] + (round(c[4], 6),) + c[5:] for c in cases(df, run=True)] == \
        [w[:4] + (round(w[4], 6),) + w[5:] for w in want]
    assert reports.run_rows(df)["run_id"].tolist() == ["r1", "r1", "r2", "r2"]


def _invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _exported(tmp_path, fmt):
    run = make_run(tmp_path / "r1")
    out = tmp_path / f"out.{fmt}"
    with pytest.warns(RecordsWarning, match="after the last end marker"):
        res = _invoke("export", run, "--format", fmt, "--out", out)
    assert res.exit_code == 0, res.output
    assert f"export: {out} (8 case rows of 1 run, 2 run rows, 1 damaged)" in res.output
    return run, out, _load(run)


def test_parquet_export_read_by_duckdb_gives_the_same_case_rows(tmp_path):
    pytest.importorskip("pyarrow")
    duckdb = pytest.importorskip("duckdb")
    run, out, df = _exported(tmp_path, "parquet")
    sql = f"select case_key, metric, repeat, attempt, value from read_parquet('{out}') where row_kind='case'"
    got = sorted(tuple(_none(v) for v in r[:4]) + (float(r[4]),) for r in duckdb.sql(sql).fetchall())
    assert got == cases(df) == WANT
    kinds = duckdb.sql(f"select row_kind, count(*) from read_parquet('{out}') group by 1 order by 1").fetchall()
    assert kinds == [("case", 8), ("damaged", 1), ("run", 2)]
    line, reason = duckdb.sql(f"select line, reason from read_parquet('{out}') where row_kind='damaged'").fetchall()[0]
    assert line == len((run / RECORDS_FILE).read_text().splitlines()) and "unfinished unit" in reason
    back = pd.read_parquet(out)
    assert cases(back[back["row_kind"] == "case"]) == WANT


def test_csv_export_reads_back_in_pandas_and_duckdb(tmp_path):
    run, out, df = _exported(tmp_path, "csv")
    back = pd.read_csv(out)
    assert cases(back[back["row_kind"] == "case"]) == WANT
    assert back.loc[back["row_kind"] == "run", "value"].tolist() == [10.0, 11.0]
    duckdb = pytest.importorskip("duckdb")
    sql = f"select case_key, metric, repeat, attempt, value from read_csv_auto('{out}') where row_kind='case'"
    assert sorted(tuple(_none(v) for v in r[:4]) + (float(r[4]),) for r in duckdb.sql(sql).fetchall()) == WANT


def test_export_refuses_bad_input_in_one_line_before_reading(tmp_path):
    run = make_run(tmp_path / "r1", torn=False)
    for args, msg in [(("--format", "xlsx", "--out", tmp_path / "x"), "--format xlsx: unknown"),
                      (("--out", tmp_path / "x.txt"), "give --format parquet or csv"),
                      (("--format", "csv", "--out", tmp_path), "is a directory"),
                      (("--format", "csv", "--out", tmp_path / "x.parquet"), "--format csv contradicts --out"),
                      ]:
        res = _invoke("export", run, *args)
        assert res.exit_code == 2 and msg in res.output and len(res.output.strip().splitlines()) == 1
    res = _invoke("export", tmp_path / "missing", "--out", tmp_path / "x.csv")
    assert res.exit_code == 2 and "does not exist" in res.output and not (tmp_path / "x.csv").exists()
    res = _invoke("export", "--out", tmp_path / "x.csv")
    assert res.exit_code == 2 and "Missing argument" in res.output


def test_parquet_without_pyarrow_names_the_install(tmp_path, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else real(name, *a))
    res = _invoke("export", make_run(tmp_path / "r1", torn=False), "--out", tmp_path / "x.parquet")
    assert res.exit_code == 2 and "pip install pyarrow" in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_a_benchmark_json_loads_as_its_run(tmp_path):
    rows = [{**_case(k), "metric": "step_time", "value": ms, "unit": "ms", "repeat": i, "pair": i,
             "attempt": 1, "status": "ok"} for k in ("p", "a") for i, ms in enumerate(TIMES[2][k])]
    bench = {"machine_info": {}, "datetime": "2026-01-02T03:04:05", "version": "5.1.0",
             "benchmarks": [{"name": "test_pair[a]", "extra_info": {"routerbench": 2, "rows": rows,
                                                                     "environment": {"device": "cpu"}}}]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    df = reports.load(path)
    assert sorted(df["value"]) == [230.0, 231.0, 301.0, 302.0] and set(df["run_id"]) == {"bench-20260102-030405"}
    assert not (tmp_path / "bench").exists()  # converted into a temporary directory
