"""The environment of each run, from its ``manifest.json`` (:func:`harness.rundir.environment.
write_manifest`), as the report's table."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from harness.rundir.records import MANIFEST_FILE

#: Rows of the environment table: (label, shown when no manifest has it, candidate keys of the
#: manifest, each a dotted path or its last component; harness.rundir.environment nests most under "environment").
_ENV_FIELDS = (
    ("device", True, ("gpu_name", "device_name", "gpu.name", "device")),
    ("torch", True, ("torch_version", "torch")),
    ("CPU", True, ("cpu_model", "cpu.model", "processor")),
    ("threads", True, ("torch_threads", "cpu_threads", "num_threads", "threads")),
    ("git sha", True, ("git_sha", "git.sha", "commit")),
    ("command line", True, ("command_line", "command", "argv")),
    ("corpus sha256", True, ("corpus.sha256", "corpus_sha256", "corpus_hash")),
    ("GPU count", False, ("gpu_count",)), ("CPU count", False, ("cpu_count",)),
    ("CUDA", False, ("cuda_version", "cuda")), ("driver", False, ("driver",)),
    ("Python", False, ("python_version", "python")),
    ("float32 matmul precision", False, ("precision_policy", "matmul_precision")),
)


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _lookup(flat: dict[str, Any], candidates: Iterable[str]) -> str | None:
    for c in candidates:
        hits = [v for k, v in flat.items() if k == c] or \
               [v for k, v in flat.items() if k.rsplit(".", 1)[-1] == c]
        for v in hits:
            if isinstance(v, (list, tuple)):
                return shlex.join(str(x) for x in v)
            if v not in (None, ""):
                return str(v)
    return None


def environment_table(run_dirs: Iterable[Path | str]) -> pd.DataFrame:
    """The environment of each run from its ``manifest.json``.

    Returns:
        ``field`` plus one column per run with a manifest (named by its ``run_id`` or directory
        name); empty when no run has a manifest. Long hashes are shortened.
    """
    manifests = {}
    for d in map(Path, run_dirs):
        try:
            manifests[d] = json.loads((d / MANIFEST_FILE).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue  # a run without a (readable) manifest: the report says so
    if not manifests:
        return pd.DataFrame(columns=["field"])
    flats = {str(m.get("run_id") or d.name): _flatten(m) for d, m in manifests.items()}
    rows = []
    for label, always, cands in _ENV_FIELDS:
        vals = {run: _lookup(f, cands) for run, f in flats.items()}
        if not always and all(v is None for v in vals.values()):
            continue
        if label in ("git sha", "corpus sha256"):  # 12 hex digits name a commit or a corpus
            vals = {r: v and v[:12] + ("-dirty" if v.endswith("-dirty") else "")
                    for r, v in vals.items()}
        rows.append({"field": label, **{r: "–" if v is None else v for r, v in vals.items()}})
    return pd.DataFrame(rows)
