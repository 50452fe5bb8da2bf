"""The layout of DESIGN.md ("Layout", "Layers") checked on the code, not promised: no import
circle, every edge allowed by its package's ``MAY_IMPORT``, no module past 400 lines, and every
planted violation of each caught (tests/imports.py reads the source; nothing is imported)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import imports

ROOT = Path(__file__).resolve().parents[1]


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root


# --- the real tree ----------------------------------------------------------------------------

def test_the_tree_has_no_import_circle():
    found = imports.circles(imports.import_graph(ROOT))
    assert not found, "import circles:\n" + "\n".join(
        "  circle of " + ", ".join(sorted({e.src for e in c})) + ":\n" + "\n".join(f"    {e}" for e in c)
        for c in found)


def test_every_import_edge_is_declared_by_its_package():
    bad = imports.layer_violations(ROOT)
    assert not bad, "undeclared imports:\n" + "\n".join("  " + b for b in bad)


def test_no_module_outside_tests_is_past_400_lines():
    assert not imports.long_files(ROOT), "\n".join(imports.long_files(ROOT))


def test_every_module_sits_in_a_declared_package():
    decl = imports.declarations(ROOT)
    loose = [m for m in imports.module_files(ROOT) if m.count(".") == 1 and m.split(".")[0] == "harness"
             and m not in decl]
    assert not loose, f"modules directly in harness/ (put each in its stage's subpackage): {loose}"


# --- the checks catch what they are for -------------------------------------------------------

PLANTED = {
    "routers/__init__.py": "MAY_IMPORT = ()\n",
    "routers/base.py": "X = 1\n",
    "workloads/__init__.py": "MAY_IMPORT = ('routers',)\n",
    "workloads/a.py": """
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from workloads.b import B
        """,
    "workloads/b.py": """
        def f():
            from . import a  # inside a function: still an edge
        """,
    "harness/__init__.py": "MAY_IMPORT = ()\n",
    "harness/low/__init__.py": "MAY_IMPORT = ('routers',)\n",
    "harness/low/m.py": "from harness.high import top\n",
    "harness/high/__init__.py": "MAY_IMPORT = ('harness.low', 'routers')\n",
    "harness/high/top.py": "from harness.low import m\nimport routers.base\n",
    "reports/__init__.py": "",
    "reports/long.py": "x = 1\n" * 401,
}


def test_a_planted_circle_is_named_with_its_edges(tmp_path):
    found = imports.circles(imports.import_graph(_tree(tmp_path, PLANTED)))
    names = sorted(sorted({e.src for e in c}) for c in found)
    assert names == [["harness.high.top", "harness.low.m"], ["workloads.a", "workloads.b"]]
    text = [str(e) for c in found for e in c]
    assert "workloads.a -> workloads.b (workloads/a.py:4)" in text  # under TYPE_CHECKING
    assert "workloads.b -> workloads.a (workloads/b.py:3)" in text  # inside a function, from . import a


def test_a_planted_undeclared_edge_and_a_silent_package_are_named(tmp_path):
    bad = imports.layer_violations(_tree(tmp_path, PLANTED))
    assert any(b.startswith("harness.low.m -> harness.high.top (harness/low/m.py:1) leaves harness.low")
               for b in bad), bad
    assert "reports: its __init__.py declares no MAY_IMPORT" in bad
    # declared edges pass: harness.high -> harness.low and -> routers
    assert not any(b.startswith("harness.high.top") for b in bad), bad


def test_a_planted_long_file_is_named(tmp_path):
    assert imports.long_files(_tree(tmp_path, PLANTED)) == [
        "reports/long.py: 401 lines (at most 400: split it by purpose)"]


@pytest.mark.parametrize("line, dst", [
    ("from harness import low", "harness.low"),            # a subpackage: the subpackage
    ("from harness.low import m", "harness.low.m"),        # a module: the module
    ("from harness.low.m import name", "harness.low.m"),   # a name: its module
    ("import harness.low.m as mm", "harness.low.m"),
    ("from routers import X", "routers"),                  # a name of a package: its __init__
    ("importlib.import_module('harness.low.m')", "harness.low.m"),
])
def test_an_edge_points_at_the_module_actually_imported(tmp_path, line, dst):
    files = dict(PLANTED, **{"harness/high/top.py": "import importlib\n" + line + "\n"})
    edges = [e for e in imports.import_graph(_tree(tmp_path, files)) if e.src == "harness.high.top"]
    assert [e.dst for e in edges] == [dst]
