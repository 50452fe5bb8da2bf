"""The plugins a run used (:mod:`routers.plugins`), read back from its run directory and loaded
again: plugins follow the run.

A command that writes a run directory records every plugin it had loaded
(:func:`routers.plugins.records`: its spec, module, file and sha256, or distribution and
version, and the routers and impls it registered) in ``manifest.json`` (``plugins``, at the top and
in each session) and in ``spec.toml`` (the ``plugins`` key, which ``--config`` loads). The
commands that read runs (``report``, ``summary``, ``compare``, ``gate``, ``diagnose``) load them
with :func:`load_for`, so a plugin router's floor, cost models and description are there without
``--plugin``. A plugin that cannot be loaded here is a sentence for the report, never an error;
a run directory written before plugins existed records none and reads as before.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from pathlib import Path
from typing import Any, Iterable

from .records import MANIFEST_FILE, SPEC_FILE


def recorded(run_dir: Path | str) -> list[dict[str, Any]]:
    """The plugin records of one run directory: those of ``manifest.json`` (its first session's
    at the top, then each resumed session's), else those of ``spec.toml``; each once (by spec
    and sha256 or version), in order. ``[]`` for a run that used none, an older run, or
    unreadable files.

    Returns:
        dicts with ``spec`` and ``module``, and ``file``, ``sha256``, ``dist``, ``version``,
        ``routers``, ``impls`` where recorded.
    """
    d = Path(run_dir)
    recs: list[Any] = []
    try:
        manifest = json.loads((d / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        manifest = None
    if isinstance(manifest, dict):
        recs += manifest.get("plugins") or []
        for session in manifest.get("sessions") or []:
            recs += (session.get("plugins") or []) if isinstance(session, dict) else []
    if not recs and (d / SPEC_FILE).is_file():
        recs = _from_spec(d / SPEC_FILE)
    out, seen = [], set()
    for r in recs:
        if not isinstance(r, dict) or not isinstance(r.get("spec"), str):
            continue
        key = (r["spec"], r.get("sha256"), r.get("version"))
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def _from_spec(path: Path) -> list[Any]:
    import sys
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        plugins = tomllib.loads(path.read_text(encoding="utf-8")).get("plugins") or []
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return []
    return plugins if isinstance(plugins, list) else []


def changed(rec: dict[str, Any]) -> str | None:
    """Why the plugin of ``rec`` here is not the code the run measured, or None: its file's sha256
    or its distribution's installed version differs from the record (it is loaded all the same)."""
    label = rec.get("dist") or rec.get("file") or rec.get("spec")
    if rec.get("file") and rec.get("sha256"):
        try:
            now = hashlib.sha256(Path(rec["file"]).read_bytes()).hexdigest()
        except OSError:
            return None  # missing: load_recorded says so
        if now != rec["sha256"]:
            return (f"plugin {label} changed since the run (sha256 {rec['sha256'][:12]} recorded, "
                    f"{now[:12]} now): its routers' cost models and floor are today's code's")
    elif rec.get("dist") and rec.get("version"):
        try:
            now = importlib.metadata.version(rec["dist"])
        except importlib.metadata.PackageNotFoundError:
            return None
        if now != rec["version"]:
            return (f"plugin {label} {rec['version']} made the run, {now} is installed: its routers' "
                    "cost models and floor are those of the installed version")
    return None


def load_for(run_dirs: Iterable[Path | str]) -> list[str]:
    """Load the plugins the runs of ``run_dirs`` recorded (:func:`recorded`,
    :func:`routers.plugins.load_recorded`); never raises for a plugin that cannot be loaded.

    Returns:
        one sentence per plugin that could not be loaded here ("plugin X not loaded (…): its
        routers: floor and cost models not declared") or is not the code the run measured
        (:func:`changed`), each once, for the report to say; ``[]`` when every one loaded.
    """
    from routers import plugins
    recs: list[dict[str, Any]] = []
    for d in run_dirs:
        recs += [r for r in recorded(d) if r not in recs]
    said = [why for r in recs if (why := changed(r)) is not None]
    said += plugins.load_recorded(recs)
    return list(dict.fromkeys(said))


__all__ = ["changed", "load_for", "recorded"]
