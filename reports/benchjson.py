"""A pytest-benchmark JSON (``--benchmark-json``) of the routerbench suite as a run directory.

Each benchmark of :mod:`harness.ci.pairbench` stores every record row of its pair in
``extra_info["rows"]``. :func:`to_run_dir` writes them into an ordinary run directory
(``records.jsonl`` with one unit of resume per benchmark, ``manifest.json`` from the environment
the benchmarks recorded), so ``routerbench report``, ``summary``, ``compare`` and ``gate`` read a
benchmark run exactly as they read ``routerbench run``'s results. Each benchmark becomes its own
session (``b0001``, …): its prenorm (or eager) rounds pair only with its own router's rounds.
Benchmarks of the JSON that are not routerbench's (no ``extra_info["routerbench"]``) are skipped.

Both layouts read (:data:`LAYOUTS`): ``extra_info["routerbench"] == 2`` keeps the environment and
the command line in each benchmark's ``extra_info`` (``environment``, ``argv``;
``machine_info`` holds only stable identity keys, :func:`harness.ci.benchplugin.machine_info`);
layout 1 (stored baselines of earlier versions) kept them in ``machine_info``
(``routerbench_environment``, ``routerbench_argv``).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import Any

from harness.rundir.records import MANIFEST_FILE, RECORDS_FILE
from harness.rundir.writer import RunWriter
from harness.timing import noise
from routers.errors import ConfigError

__all__ = ["is_bench_json", "to_run_dir", "default_out", "LAYOUTS"]

#: The ``extra_info["routerbench"]`` layouts this module reads.
LAYOUTS = (1, 2)

#: Rows of a timing (:func:`harness.sweep.timed.record_attempt`): each benchmark's own. Every other
#: row of a case is of its set-up (parameters, FLOPs, memory, compile or capture time), kept from
#: the first benchmark that set the case up, so a new set-up metric needs no entry here.
TIMING_METRICS = ("step_time", "sm_clock_mhz", *noise.UNITS)
#: Columns a unit writer sets itself (not taken from a stored row).
_UNIT_COLUMNS = ("run_id", "session", "resume_unit", "schema", "device")


def is_bench_json(path: Path | str) -> bool:
    """Whether ``path`` is a file that looks like a pytest-benchmark JSON (``*.json``)."""
    p = Path(path)
    return p.is_file() and p.suffix == ".json"


def default_out(path: Path | str) -> Path:
    """Where ``routerbench report bench.json`` writes: ``bench/`` beside the file."""
    p = Path(path)
    return p.with_name(p.stem)


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise ConfigError(f"{path}: benchmarks: missing; not a pytest-benchmark JSON "
                          "(pytest tests/benchmarks --benchmark-only --benchmark-json FILE)")
    return data


def _environment(data: dict[str, Any], benches: list[dict[str, Any]]) -> tuple[dict[str, Any], list | None]:
    """The run's environment and command line: the first benchmark's ``extra_info`` (layout 2),
    else ``machine_info``'s ``routerbench_*`` keys (layout 1), else what pytest-benchmark's own
    ``machine_info`` tells (a JSON written without routerbench's hooks)."""
    mi = data.get("machine_info") or {}
    for b in benches:
        ei = b["extra_info"]
        if isinstance(ei.get("environment"), dict):
            return dict(ei["environment"]), ei.get("argv")
    env = dict(mi.get("routerbench_environment") or {})
    if not env:
        cpu = mi.get("cpu") or {}
        name = mi.get("device_name") or mi.get("cpu_model") or cpu.get("brand_raw") or mi.get("processor")
        env = {"device": mi.get("device") or "cpu", "device_name": name or "unknown"}
    return env, mi.get("routerbench_argv")


def plugin_records(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The plugins the benchmarks of a pytest-benchmark JSON (``data``, parsed) recorded in their
    ``extra_info`` (:func:`harness.ci.benchplugin.run_info`), each once; ``[]`` for none or an
    older layout."""
    out: list[dict[str, Any]] = []
    for b in data.get("benchmarks") or []:
        ei = b.get("extra_info") if isinstance(b, dict) else None
        for rec in (ei.get("plugins") or []) if isinstance(ei, dict) else []:
            if isinstance(rec, dict) and isinstance(rec.get("spec"), str) and rec not in out:
                out.append(rec)
    return out


def to_run_dir(path: Path | str, out_dir: Path | str) -> Path:
    """Write the routerbench benchmarks of the JSON at ``path`` as a run directory ``out_dir``.

    ``out_dir`` must not exist, be empty, or be an earlier conversion (its manifest names a
    pytest-benchmark source), which is replaced.

    Returns:
        ``out_dir``.

    Raises:
        ConfigError: unreadable or malformed JSON, a benchmark of a layout newer than
            :data:`LAYOUTS` (naming it), a benchmark whose ``extra_info.rows`` is not a
            list of rows (naming the benchmark), no routerbench benchmark in the file, or an
            ``out_dir`` holding something else (naming ``--out``).
    """
    src, out = Path(path), Path(out_dir)
    data = _load(src)
    benches = [b for b in data["benchmarks"] if isinstance(b, dict)
               and isinstance(b.get("extra_info"), dict) and "routerbench" in b["extra_info"]]
    if not benches:
        raise ConfigError(f"{src}: benchmarks: no routerbench benchmark in it (their extra_info has no "
                          "'routerbench' key): run pytest tests/benchmarks --benchmark-only --benchmark-json FILE")
    for i, b in enumerate(benches):
        layout = b["extra_info"]["routerbench"]
        if layout not in LAYOUTS:
            raise ConfigError(f"{src}: benchmarks[{i}] ({b.get('name')}): extra_info layout {layout!r}; this "
                              f"routerbench reads layouts {', '.join(map(str, LAYOUTS))}: update routerbench")
        rows = b["extra_info"].get("rows")
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ConfigError(f"{src}: benchmarks[{i}] ({b.get('name')}): extra_info.rows is not a list of rows")
    if out.exists() and any(out.iterdir()):
        try:
            old = json.loads((out / MANIFEST_FILE).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            old = {}
        if "pytest_benchmark" not in old:
            raise ConfigError(f"--out {out}: exists and is not a converted benchmark JSON; give another --out")
        shutil.rmtree(out)
    env, argv = _environment(data, benches)
    stamp = str(data.get("datetime") or "")[:19].replace(":", "").replace("-", "").replace("T", "-")
    run_id = f"bench-{stamp or src.stem}"
    device = env.get("device") or "cpu"
    seen: set[tuple] = set()
    for i, b in enumerate(benches, 1):
        rows = b["extra_info"]["rows"]
        with RunWriter(out, run_id, f"b{i:04d}", base={"device": device}) as run:
            keys = list(dict.fromkeys(r.get("case_key") for r in rows if r.get("case_key")))
            with run.unit(keys, kind="benchmark") as u:
                statuses: dict[str, str] = {}
                for r in rows:
                    if r.get("metric") not in TIMING_METRICS:
                        # a case set up in several benchmarks: its first set-up only (a later
                        # compile hits the compile cache and would halve its compile time)
                        if (r.get("case_key"), r["metric"], r.get("repeat")) in seen:
                            continue
                        seen.add((r.get("case_key"), r["metric"], r.get("repeat")))
                    u.write(**{k: v for k, v in r.items() if k not in _UNIT_COLUMNS})
                    if r.get("metric") == "step_time":
                        statuses[r["case_key"]] = r.get("status", "ok")
                u.commit(statuses, extra={"benchmark": b.get("fullname") or b.get("name")})
    commit = data.get("commit_info") or {}
    with contextlib.suppress(OSError):
        (out / "pending").rmdir()  # empty: every unit was committed
    manifest = {"run_id": run_id, "environment": env, "git_sha": commit.get("id"), "plugins": plugin_records(data),
                "command_line": " ".join(argv) if argv else "pytest tests/benchmarks --benchmark-only",
                "converted_by": "routerbench (reports/benchjson.py)",
                "pytest_benchmark": {"source": str(src.resolve()), "datetime": data.get("datetime"),
                                     "version": data.get("version"), "benchmarks": len(benches),
                                     "layouts": sorted({b["extra_info"]["routerbench"] for b in benches}),
                                     "commit_info": commit}}
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, default=str), encoding="utf-8")
    assert (out / RECORDS_FILE).is_file()
    return out
