"""No code path branches on an impl's name: what a caller would ask of an impl by its name is an
attribute of its declared :class:`routers.impls.Impl` (docs/IMPLS.md, "Adding an impl"). Names
appear only as data (the family's ``REFERENCE``, defaults, suites' lists, fitted constants).

:func:`name_comparisons` finds, in a module's source, every comparison (``==``, ``!=``, ``in``,
``not in``) of an expression with a literal impl name or a literal collection holding one. A
comparison of a ``schedule`` with a schedule name of a family (``routers.impls.FAMILIES``) is the
family's data, not an impl's name, and is allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from routers import impls

ROOT = Path(__file__).resolve().parents[1]
#: The packages whose sources are checked (tests are not).
PACKAGES = ("harness", "reports", "routers", "workloads")
SCHEDULES = {s for f in impls.FAMILIES.values() for s in f.points}


def _literal_names(node: ast.expr, names: set[str]) -> set[str]:
    """The impl names ``node`` spells as a literal: a string, or a tuple / list / set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & names
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_literal_names(e, names) for e in node.elts)) if node.elts else set()
    return set()


def _is_schedule(node: ast.expr) -> bool:
    """Whether ``node`` is a schedule: a name or attribute called ``schedule``."""
    return (isinstance(node, ast.Name) and node.id == "schedule") or \
        (isinstance(node, ast.Attribute) and node.attr == "schedule")


def name_comparisons(source: str, names: set[str]) -> list[tuple[int, str]]:
    """Every comparison in ``source`` (Python text) with a literal of ``names``, as (line, the
    comparison's text); a ``schedule`` compared with schedule names only is not one.

    Raises:
        SyntaxError: ``source`` is not Python.
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        spelled = set().union(*(_literal_names(o, names) for o in operands))
        if not spelled:
            continue
        if spelled <= SCHEDULES and any(_is_schedule(o) for o in operands):
            continue
        found.append((node.lineno, ast.get_source_segment(source, node) or ""))
    return found


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


NAMES = set(impls.names())


def test_no_source_compares_an_impl_name():
    bad = [f"{p.relative_to(ROOT)}:{line}: {text}" for p in _sources()
           for line, text in name_comparisons(p.read_text(encoding="utf-8"), NAMES)]
    assert bad == [], "branch on an Impl attribute, not on its name:\n" + "\n".join(bad)


def test_the_sources_are_checked_and_every_builtin_is_a_name():
    assert len(_sources()) > 50
    assert {"naive", "two_phase"} <= NAMES and impls.REFERENCE in NAMES


@pytest.mark.parametrize("planted, line", [
    ('if impl == "fused":\n    pass\n', 1),
    ('x = 1\nok = r.impl != "naive"\n', 2),
    ('two = impl in ("two_phase", "other")\n', 1),
    ('keep = ["lean"] == names\n', 1),
    ('if "two_phase" in router.impls:\n    pass\n', 1),
    ('if self.schedule == "lean":\n    pass\n', 1),   # lean is no schedule: a name
])
def test_a_planted_comparison_is_found(planted, line):
    names = {"naive", "two_phase", "lean", "fused"}
    got = name_comparisons(planted, names)
    assert [ln for ln, _ in got] == [line]


@pytest.mark.parametrize("fine", [
    'if self.schedule == "two_phase":\n    pass\n',       # the family's schedules are data
    'DEFAULT = ("naive", "two_phase")\n',               # names as data
    'w = WEIGHTS.get(impl, 1.0)\n',
    'ok = impl == REFERENCE\n',
    'x = "fused" + suffix\n',
])
def test_data_and_schedules_are_not_comparisons(fine):
    assert name_comparisons(fine, {"naive", "two_phase", "lean", "fused"}) == []
