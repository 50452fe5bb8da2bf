"""Nothing breaks out of sight (DESIGN.md, "Layout"): every dotted ``harness.*`` / ``reports.*`` /
``routers.*`` / ``workloads.*`` path and every ``harness/…py`` file path named in the scripts, the
workflow, the README, the docs and the code's own docstrings resolves to what exists today; and
every ``monkeypatch.setattr`` of the tests patches a name that no other module copied by name (a
copy bound with ``from M import name`` would not see the patch)."""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from pathlib import Path

import imports
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = imports.PACKAGES
DOTTED = re.compile(rf"(?<![\w./\[-])((?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
#: Spec paths that look like modules: the ``[routers]`` section's keys (``routers.router_options``).
SPEC_KEYS = ("routers.routers", "routers.router_options")
FILE = re.compile(rf"(?<![\w./-])((?:{'|'.join(PACKAGES)}|tests|scripts)/[\w/]+\.(?:py|sh))\b")
#: Where the user and the developer read paths: scripts, the workflow, README, docs; and the code.
DOC_FILES = [*sorted((ROOT / "scripts").glob("*")), *sorted((ROOT / ".github").rglob("*.y*ml")),
             ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "Makefile",
             *sorted((ROOT / ".ci").glob("*"))]
CODE_FILES = [p for pkg in (*PACKAGES, "tests") for p in sorted((ROOT / pkg).rglob("*.py"))
              if "__pycache__" not in p.parts]


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or a module followed by attributes that exist."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:n]))
        except ImportError:
            continue
        try:
            for attr in parts[n:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def _prose(f: Path) -> list[tuple[int, str]]:
    """(line, text) of what a reader reads in ``f``: every line of a document or script; of a
    Python file only its strings and comments (``routers.split(",")`` in code is a variable)."""
    text = f.read_text(encoding="utf-8", errors="replace")
    if f.suffix != ".py":
        return list(enumerate(text.splitlines(), 1))
    return [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(text).readline)
            if t.type in (tokenize.STRING, tokenize.COMMENT)]


def named_paths(files: list[Path]) -> list[tuple[str, str]]:
    """(where, dotted or file path) for every path named in ``files``."""
    out = []
    for f in files:
        if not f.is_file():
            continue
        for i, line in _prose(f):
            out += [(f"{f.relative_to(ROOT)}:{i}", m) for m in DOTTED.findall(line) if not m.startswith(SPEC_KEYS)]
            out += [(f"{f.relative_to(ROOT)}:{i}", m) for m in FILE.findall(line)]
    return out


def _broken(found: list[tuple[str, str]]) -> list[str]:
    bad = []
    for where, path in found:
        ok = (ROOT / path).exists() if "/" in path else resolves(path)
        if not ok:
            bad.append(f"{where}: {path}")
    return bad


def test_paths_in_scripts_workflow_readme_and_docs_resolve():
    found = named_paths(DOC_FILES)
    assert ("harness.rundir.environment" in {p for w, p in found if w.startswith(".github")}
            and "harness.rundir.records" in {p for w, p in found if w.startswith("scripts")})
    bad = _broken(found)
    assert not bad, "paths that no longer exist:\n" + "\n".join("  " + b for b in bad)


def test_paths_in_the_code_and_its_docstrings_resolve():
    bad = _broken(named_paths([p for p in CODE_FILES if p.name not in ("test_layers.py", "test_paths.py")]))
    assert not bad, "paths that no longer exist:\n" + "\n".join("  " + b for b in bad)


def _patched() -> list[tuple[str, str, str]]:
    """(test file:line, module, name) of each ``monkeypatch.setattr(module, "name", …)`` whose
    first argument is a module the test file imported."""
    out = []
    for f in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(f.read_text())
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "setattr"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "monkeypatch"
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
                target = node.args[0]
                dotted = ast.unparse(target)
                head = dotted.split(".")[0]
                if head in aliases:
                    module = ".".join([aliases[head], *dotted.split(".")[1:]])
                    if module.split(".")[0] in PACKAGES:
                        out.append((f"{f.relative_to(ROOT)}:{node.lineno}", module, node.args[1].value))
    return out


def test_every_monkeypatch_patches_the_module_where_the_name_is_looked_up():
    patched = _patched()
    assert patched, "no monkeypatch of a project module found: the scan is broken"
    edges = imports.import_graph(ROOT, loose=())
    copies = {}
    for f in imports.module_files(ROOT).values():
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    copies.setdefault((node.module, a.name), []).append(f"{f.relative_to(ROOT)}:{node.lineno}")
    bad = []
    for where, module, name in patched:
        try:
            obj = importlib.import_module(module)
        except ImportError:  # a class: the attribute is looked up on it
            continue
        assert hasattr(obj, name), f"{where}: {module} has no {name}"
        for site in copies.get((module, name), []):
            bad.append(f"{where}: patches {module}.{name}, but {site} copied it by name (from {module} "
                       f"import {name}); patch it there, or look it up as {module.rpartition('.')[2]}.{name}")
    assert edges  # the graph the copies were read from is the real one
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("text, ok", [("harness.sweep.prepare.prepare_group", True),
                                      ("harness.sweep.prepare.no_such_name", False),
                                      ("harness.paired", False), ("reports.frame.load_frame", True)])
def test_the_path_check_tells_a_live_path_from_a_dead_one(text, ok):
    assert resolves(text) is ok


def _design_metrics() -> set[str]:
    """The metric names of DESIGN.md's "Metrics" table (first column; ``(+ _a, _b)`` suffixes
    expand)."""
    text = (ROOT / "docs" / "DESIGN.md").read_text()
    table = text.split("### Metrics", 1)[1].split("\n\n", 2)[2].split("\n\n", 1)[0]
    names: set[str] = set()
    for line in table.splitlines()[2:]:
        cell = line.split("|")[1]
        base = re.findall(r"`(\w+)`", cell.split("(+")[0])
        suffixes = re.findall(r"`(_\w+)`", cell.split("(+")[1]) if "(+" in cell else []
        names |= set(base) | {b + s for b in base for s in suffixes}
    return names


def _written_metrics() -> set[str]:
    """Metric names the code writes: every ``metric="…"`` keyword of harness/, the noise readings,
    the CUDA memory readings, the bandwidth rows, and every metric of the golden run."""
    import json

    from harness.costs import bandwidth
    from harness.timing import noise
    out = set(noise.UNITS) | {"peak_allocated", "peak_reserved", "alloc_retries", "ooms",
                              bandwidth.METRIC, bandwidth.NOMINAL_METRIC}
    for f in sorted((ROOT / "harness").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if (isinstance(node, ast.keyword) and node.arg == "metric" and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, str)):
                out.add(node.value.value)
    golden = json.loads((ROOT / "tests" / "golden" / "behaviour.json").read_text())
    for part in ("sweep", "train"):
        for metrics in golden[part]["records"]["cases"].values():
            out |= {m.split(" ")[0] for m in metrics}
    return out


def test_every_metric_written_is_in_design_md():
    missing = sorted(_written_metrics() - _design_metrics())
    assert not missing, f"metrics written but not in DESIGN.md's \"Metrics\" table: {missing}"
    assert {"step_time", "val_loss", "router_share_paired_difference"} <= _design_metrics()
