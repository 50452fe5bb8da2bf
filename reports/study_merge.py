"""One depth-study report from several run directories: the units of a study (``routerbench study
depth --unit``, each one seed at one depth in its own directory, :mod:`harness.training.units`),
whole one-process studies of other seeds, or both (``routerbench study report``).

- :func:`find_study_dirs`: the ``study depth`` run directories named by the arguments (each a run
  directory, a study root with ``study.json``, or a results root holding them);
- :func:`merge_check`: refuses, in one line naming both directories and what differs, runs that
  are no one study (another corpus, protocol, decoder shape, block layout or router option at a
  shared depth, or a unit held twice), and returns the merged manifest and the warnings (other
  torch/triton/CUDA/routerbench versions or git commits: the losses are pooled all the same);
- :func:`write_merged`: the report of :func:`reports.study.write_report` from the rows of all of
  them. Losses at the token budget are pooled (the table, the paired seed intervals, both
  figures); wall-clock figures never across devices (each run names its device; the estimate and
  the clocks are summed per device). Units that were planned (``study.json``, each manifest's
  seeds × depths) but hold no finished run of every router are listed, never filled.
"""

from __future__ import annotations

import ast
import copy
import json
import re
import tomllib
from pathlib import Path

import pandas as pd

from harness.rundir.records import MANIFEST_FILE, SPEC_FILE, completed_cases, load_rows
from harness.training.units import STUDY_SPEC, read_index, unit_dirs
from routers.errors import ConfigError

from .study import missing_units, run_source, study_grid, study_runs, write_report

COMMAND = "study depth"
#: Manifest entries every directory of one study shares (the protocol).
PROTOCOL = ("scale", "max_steps", "eval_every", "precision", "backend", "compile_scope", "metric")
#: ``[study]`` keys of ``spec.toml`` that may differ between the directories of one study: which
#: units it holds (depths, seeds), where the corpus lies (its hash is compared), how the runs of a
#: unit are scheduled and timed, and the block setting (its layout is compared per depth).
FREE_STUDY_KEYS = ("data", "depths", "seeds", "seed_list", "blocks", "block_length", "schedule", "estimate_steps")
#: ``spec.toml`` sections left out of the comparison (the router set may differ: its options are
#: compared per depth; output and launch change no result).
FREE_SECTIONS = ("routers", "output", "launch", "command")
#: Entries of the manifest's ``environment`` whose difference is warned of, not refused.
VERSION_KEYS = ("torch", "triton", "cuda", "routerbench")
#: Settings compared only between directories that record them (a directory without runs has no
#: training settings; one without block routers no block layout; an old manifest no corpus hash).
OPTIONAL = ("training setting", "corpus", "block layout")


def _spec(d: Path) -> dict | None:
    try:
        return tomllib.loads((Path(d) / SPEC_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def is_study_dir(path: Path | str) -> bool:
    """Whether ``path`` is a run directory of ``study depth`` (its ``spec.toml`` says so)."""
    spec = _spec(Path(path))
    return spec is not None and spec.get("command") == COMMAND


def find_study_dirs(paths: list[Path]) -> list[Path]:
    """The ``study depth`` run directories the arguments name, in their order: an argument that is
    one is itself; a study root (``study.json``) gives its units' directories in unit order, then
    any other study directory below it; any other directory the study directories at
    ``ARG/*/<run>`` and ``ARG/<run>``. A directory named twice is kept twice (:func:`merge_check`
    refuses it).

    Raises:
        ConfigError: an argument that does not exist, or is neither a study run directory nor holds
            any (one line naming it and what to give instead).
    """
    out: list[Path] = []
    for arg in map(Path, paths):
        if not arg.exists():
            raise ConfigError(f"{arg}: no such file or directory; give a `study depth` run directory or the "
                              "--out root of a study")
        if is_study_dir(arg):
            out.append(arg)
            continue
        found: list[Path] = []
        index = read_index(arg)
        for unit in (index or {}).get("units", ()):
            found += unit_dirs(arg, unit)
        found += [p for p in sorted(arg.glob("*/*")) + sorted(arg.glob("*")) if p.is_dir() and is_study_dir(p)]
        found = list(dict.fromkeys(found))
        if not found:
            spec = _spec(arg) if (arg / SPEC_FILE).is_file() else None
            what = (f"a run directory of `routerbench {spec.get('command')}`, not of `{COMMAND}`" if spec else
                    f"neither a `{COMMAND}` run directory (spec.toml with command = \"{COMMAND}\") nor a "
                    "directory holding any")
            raise ConfigError(f"{arg}: {what}; give the run directory of `routerbench study depth` or the --out "
                              "root of its units")
        out += found
    return out


def _read_manifest(d: Path) -> dict:
    try:
        return json.loads((d / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{d / MANIFEST_FILE}: unreadable ({exc}); repair it or leave {d} out") from None


def _case_parts(key: str) -> tuple[dict, dict]:
    """``(decoder shape, training settings)`` of a study case key (``…|DecoderConfig(…)|[(…)]|…``);
    empty dicts where the key does not hold them."""
    shape, train = {}, {}
    for part in str(key).split("|"):
        if part.startswith("DecoderConfig("):
            shape = dict(re.findall(r"(\w+)=('[^']*'|[^,)]+)", part))
            shape.pop("n_layers", None)
        elif part.startswith("[("):
            try:
                train = dict(ast.literal_eval(part))
            except (ValueError, SyntaxError, TypeError):
                train = {}
    return shape, train


class _Dir:
    """What :func:`merge_check` reads of one directory."""

    def __init__(self, d: Path) -> None:
        self.dir, self.manifest, self.spec = d, _read_manifest(d), _spec(d) or {}
        self.runs = study_runs(load_rows([d]), run_source(d, self.manifest)["device"])
        self.done = {k for k in completed_cases(d) if k.startswith("study|")}
        self.shape: dict[int, dict] = {}
        self.train: dict = {}
        for r in self.runs.itertuples():
            shape, train = _case_parts(r.case_key)
            self.shape.setdefault(int(r.depth), shape)
            self.train = self.train or train

    def protocol(self) -> dict[str, object]:
        """Every setting that must be equal across the study, by the name the message gives it."""
        m, out = self.manifest, {}
        out["corpus sha256 (manifest.json corpus)"] = (m.get("corpus") or {}).get("sha256")
        out.update({f"{k} (manifest.json)": m.get(k) for k in PROTOCOL})
        lay = m.get("layout") or {}
        held = f"{lay.get('held')} {lay.get('value')}, {lay.get('block_unit')}"
        out["block layout (manifest.json layout)"] = held if lay.get("routers") else None
        for sect, body in self.spec.items():
            if sect in FREE_SECTIONS:
                continue
            for k, v in (body.items() if isinstance(body, dict) else [("", body)]):
                if not (sect == "study" and k in FREE_STUDY_KEYS):
                    out[f"{sect}.{k} (spec.toml)" if k else f"{sect} (spec.toml)"] = v
        out.update({f"training setting {k} (records' case keys)": v for k, v in self.train.items()})
        return out

    def per_depth(self) -> dict[tuple[int, str], object]:
        """Settings compared at the depths two directories share: layout, router options, shape."""
        m, out = self.manifest, {}
        for d, v in ((m.get("layout") or {}).get("per_depth") or {}).items():
            out[(int(d), "block layout (manifest.json layout.per_depth)")] = v
        for d, opts in (m.get("router_options") or {}).items():
            for r, o in opts.items():
                out[(int(d), f"{r}'s router options (manifest.json router_options)")] = o
        for d, shape in self.shape.items():
            for k, v in shape.items():
                out[(d, f"decoder {k} (records' case keys)")] = v
        return out


def _refuse(a: Path, b: Path, what: str, va, vb, fix: str) -> ConfigError:
    return ConfigError(f"cannot merge {a} and {b}: {what}: {va!r} vs {vb!r}; {fix}")


def _check(dirs: list[Path]) -> tuple[dict, list[str], list[_Dir]]:
    seen: dict[Path, Path] = {}
    for d in map(Path, dirs):
        if d.resolve() in seen:
            raise ConfigError(f"cannot merge {seen[d.resolve()]} and {d}: the same run directory is given twice; "
                              "give it once")
        seen[d.resolve()] = d
    warnings: list[str] = []
    infos = []
    for d in map(Path, dirs):
        if (d / MANIFEST_FILE).is_file():
            infos.append(_Dir(d))
        else:
            warnings.append(f"{d}: no manifest.json (nothing trained there yet): left out")
    if not infos:
        raise ConfigError(f"{', '.join(map(str, dirs))}: no study directory holds a manifest.json (nothing "
                          "trained yet); run the study first")
    ref = infos[0]
    fix = "report only runs of one study protocol (or report them apart)"
    protos = [i.protocol() for i in infos]
    for what in dict.fromkeys(k for p in protos for k in p):
        vals = [(i.dir, p.get(what)) for i, p in zip(infos, protos)
                if not (what.startswith(OPTIONAL) and p.get(what) is None)]
        for d, v in vals[1:]:
            if v != vals[0][1]:
                raise _refuse(vals[0][0], d, what, vals[0][1], v, fix)
    depth_firsts: dict[tuple[int, str], tuple[Path, object]] = {}
    for info in infos:
        for (depth, what), v in info.per_depth().items():
            a, va = depth_firsts.setdefault((depth, what), (info.dir, v))
            if v != va:
                raise _refuse(a, info.dir, f"{what} at depth {depth}", va, v, fix)
    by_case: dict[str, Path] = {}
    by_unit: dict[tuple[int, int], Path] = {}
    for info in infos:
        where = {r.case_key: r for r in info.runs.itertuples()}
        for key in sorted(info.done):
            if key in by_case:
                r = where.get(key)
                run = f"{r.router} at depth {r.depth}, seed {r.seed}" if r is not None else key
                raise ConfigError(f"cannot merge {by_case[key]} and {info.dir}: both hold the finished run {run} "
                                  "(one run trained twice); give only one of the two directories")
        by_case.update(dict.fromkeys(info.done, info.dir))
        units = sorted({(int(r.depth), int(r.seed)) for r in info.runs.itertuples()})
        for u in units:
            if u in by_unit:
                raise ConfigError(f"cannot merge {by_unit[u]} and {info.dir}: both hold runs of depth {u[0]}, "
                                  f"seed {u[1]} (one unit in two directories); give only one of them (move the "
                                  "other away)")
        by_unit.update(dict.fromkeys(units, info.dir))
    for info in infos[1:]:
        for key in VERSION_KEYS + ("git_sha",):
            env = info.manifest if key == "git_sha" else info.manifest.get("environment") or {}
            env0 = ref.manifest if key == "git_sha" else ref.manifest.get("environment") or {}
            va, vb = env0.get(key), env.get(key)
            if va != vb and not (key == "cuda" and None in (va, vb)):
                warnings.append(f"{ref.dir} and {info.dir} ran {key} {va} vs {vb}: their losses are pooled; check "
                                "that these versions give the same numbers")
    return _merged(infos), list(dict.fromkeys(warnings)), infos


def merge_check(dirs: list[Path]) -> tuple[dict, list[str]]:
    """Check that the run directories ``dirs`` (:func:`find_study_dirs`) hold one study and merge
    their manifests.

    Returns:
        ``(merged manifest, warnings)``: the first manifest's scale, labels, budget note, step and
        token budget; ``routers`` the union in first-seen order; ``depths``/``seeds`` sorted
        unions; ``layout.per_depth``, ``router_options`` and ``schedule`` merged per depth;
        ``estimate`` only of a single directory; ``sources``: per directory its ``dir``,
        ``device``, ``estimate``, ``routers``, planned ``grid`` ((depth, seed) pairs) and
        ``study_id``. Warnings (one line each): a directory without a manifest (left out), other
        torch/triton/CUDA/routerbench versions or git commits than the first directory's.

    Raises:
        ConfigError: one line naming both directories and what differs: a directory given twice;
            another corpus hash, protocol (the manifest's max_steps, eval_every, precision,
            backend, compile_scope, scale; spec.toml's lr, warmup_steps, ...; the training
            settings in the case keys); block layout, router option or decoder shape at a depth
            both hold; a run or a (depth, seed) unit held by both.
    """
    merged, warnings, _ = _check(dirs)
    return merged, warnings


def _seed_words(seeds: list[int]) -> str:
    """As the study's scale label says its seeds: ``2 seeds`` (0..1), ``seeds 0,3``."""
    if list(seeds) == list(range(len(seeds))):
        return f"{len(seeds)} seed{'s' * (len(seeds) != 1)}"
    return f"seed{'s' * (len(seeds) != 1)} {','.join(map(str, seeds))}"


def _by_depth(dicts: list[dict]) -> dict:
    out: dict = {}
    for d in dicts:
        for k, v in (d or {}).items():
            out.setdefault(str(k), v)
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def _merged(infos: list[_Dir]) -> dict:
    ms = [i.manifest for i in infos]
    merged = copy.deepcopy({k: v for k, v in ms[0].items() if k not in ("sessions", "plan", "command_line")})
    routers = list(dict.fromkeys(r for m in ms for r in m.get("routers") or ()))
    depths = sorted({int(d) for m in ms for d in m.get("depths") or ()})
    seeds = sorted({int(s) for m in ms for s in m.get("seeds") or ()})
    lay = merged.get("layout") or {}
    if lay:
        lay["routers"] = list(dict.fromkeys(r for m in ms for r in (m.get("layout") or {}).get("routers") or ()))
        lay["per_depth"] = _by_depth([(m.get("layout") or {}).get("per_depth") for m in ms])
    label, first = merged.get("scale_label") or "", ms[0]
    old = f"{_seed_words(first.get('seeds') or [])}, depths {','.join(map(str, first.get('depths') or []))}"
    new = f"{_seed_words(seeds)}, depths {','.join(map(str, depths))}"
    sources = []
    for i in infos:
        unit = i.manifest.get("unit") or {}
        sources.append({**run_source(i.dir, i.manifest), "routers": list(i.manifest.get("routers") or ()),
                        "grid": sorted(study_grid(i.manifest)), "unit_of": unit.get("study_id"),
                        "study_id": unit.get("study_id") or i.dir.name})
    merged.update(routers=routers, depths=depths, seeds=seeds, scale_label=label.replace(old, new),
                  router_options=_by_depth([m.get("router_options") for m in ms]),
                  schedule=_by_depth([m.get("schedule") for m in ms]), unit=None, sources=sources,
                  estimate=ms[0].get("estimate") if len(ms) == 1 else None,
                  devices=list(dict.fromkeys(s["device"] for s in sources)))
    return merged


def expected_units(paths: list[Path], merged: dict) -> dict[tuple[int, int], set[str]]:
    """``(depth, seed)`` -> routers of every unit planned: each directory's seeds × depths with its
    routers, and every unit of each ``study.json`` (of a root argument, or the root of a unit
    directory of that study) with the routers of that root's ``study.toml`` (else the merged
    routers)."""
    out: dict[tuple[int, int], set[str]] = {}
    roots = [(Path(p).resolve(), None) for p in paths] + [
        (Path(s["dir"]).resolve().parent.parent, s["unit_of"]) for s in merged["sources"] if s["unit_of"]]
    for s in merged["sources"]:
        for d, seed in s["grid"]:
            out.setdefault((int(d), int(seed)), set()).update(s["routers"])
    for root, study_id in dict.fromkeys(roots):
        index = read_index(root)
        if not index or study_id not in (None, index.get("study_id")):
            continue
        try:
            routers = tomllib.loads((root / STUDY_SPEC).read_text(encoding="utf-8"))["routers"]["routers"]
        except (OSError, ValueError, KeyError, TypeError):
            routers = merged["routers"]
        for u in index["units"]:
            out.setdefault((int(u.depth), int(u.seed)), set()).update(routers)
    return out


def write_merged(paths: list[Path], out_dir: Path | str,
                 warnings: list[str] | None = None) -> tuple[dict[str, Path], str]:
    """Write the report of the study runs under ``paths`` (:func:`find_study_dirs`, checked by
    :func:`merge_check`) into ``out_dir`` (created): ``study.md``, ``study.html``,
    ``study_table.csv``, ``study_runs.csv`` (with each run's ``device``) and the figures, as
    :func:`reports.study.write_study` writes them; the missing units listed in the report and the
    text. ``warnings``, when a list, gets :func:`merge_check`'s warnings (they are in the report too).

    Returns:
        ``(paths by file name, the text the command prints)``.

    Raises:
        ConfigError: as :func:`find_study_dirs` and :func:`merge_check`.
    """
    merged, warns, infos = _check(find_study_dirs([Path(p) for p in paths]))
    if warnings is not None:
        warnings.extend(warns)
    runs = pd.concat([i.runs for i in infos], ignore_index=True) if len(infos) > 1 else infos[0].runs
    order = merged["routers"] or list(dict.fromkeys(runs["router"]))
    if len(infos) > 1:  # seeds outermost, then depths, then routers: the order a study trains them in
        rank = runs["router"].map({r: n for n, r in enumerate(order)}).fillna(len(order))
        runs = runs.assign(_rank=rank).sort_values(["seed", "depth", "_rank"], kind="stable")
        runs = runs.drop(columns="_rank").reset_index(drop=True)
    missing = missing_units(runs, expected_units(paths, merged), order)
    ids = list(dict.fromkeys(s["study_id"] for s in merged["sources"]))
    name = Path(infos[0].dir).name if len(infos) == 1 else ", ".join(ids[:4]) + (", …" if len(ids) > 4 else "")
    return write_report(out_dir, merged, runs, merged["sources"], missing, name, warns)
