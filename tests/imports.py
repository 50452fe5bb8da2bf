"""The project's import graph, read from the source (no module is imported), and the checks on it
that keep the layers of DESIGN.md ("Layout") true: no circles, every edge allowed by the
``MAY_IMPORT`` of the package it leaves, no file past :data:`MAX_LINES` lines.

An edge goes to the module actually imported: ``from pkg import sub`` points at ``pkg.sub`` when
``pkg/sub.py`` (or ``pkg/sub/``) exists, else at ``pkg`` (its ``__init__``); ``import a.b.c`` at
``a.b.c``. Every ``import`` statement counts wherever it stands (inside functions, under ``if
TYPE_CHECKING:``), and so does ``importlib.import_module("a.b")`` with a constant name.
Third-party and standard-library imports are not edges.

The checks take a root folder, so the tests run them on the real tree and on small planted trees.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

#: The project's top-level packages (DESIGN.md, "Layout").
PACKAGES = ("routers", "workloads", "harness", "reports")
#: Folders of plain modules (no package): in the graph, out of the layer and length checks. A
#: bare ``import paths`` from one of them names ``tests/paths.py``.
LOOSE = ("tests",)
#: Longest module outside ``tests/``, in lines.
MAX_LINES = 400


@dataclass(frozen=True)
class Edge:
    """``src`` imports ``dst`` at ``file:line``."""

    src: str
    dst: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.src} -> {self.dst} ({self.file}:{self.line})"


def module_files(root: Path, packages=PACKAGES, loose=()) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of ``packages`` (and of the ``loose``
    folders, named ``folder.module``) under ``root``."""
    out = {}
    for pkg in (*packages, *loose):
        for path in sorted((root / pkg).rglob("*.py")) if (root / pkg).is_dir() else ():
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _is_package(name: str, files: dict[str, Path]) -> bool:
    return name in files and files[name].name == "__init__.py"


def _resolve(name: str, files: dict[str, Path], importer: str = "") -> str | None:
    """The project module ``name`` names, or its longest project prefix (``a.b.attr`` -> ``a.b``);
    from a loose folder's module, a module of that folder first."""
    folder = importer.split(".")[0]
    if folder in LOOSE and f"{folder}.{name}" in files:
        return f"{folder}.{name}"
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in files:
            return candidate
    return None


def _imports(tree: ast.AST, module: str, files: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported module, line) for every import in ``tree``, a module named ``module``."""
    package = module if _is_package(module, files) else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            for a in node.names:
                sub = f"{prefix}.{a.name}"
                found.append((sub if sub in files else prefix, node.lineno))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id == "import_module"))):
            found.append((node.args[0].value, node.lineno))
    return found


def import_graph(root: Path, packages=PACKAGES, loose=LOOSE) -> list[Edge]:
    """Every import edge between the project's modules under ``root`` (one per importing line)."""
    files = module_files(root, packages, loose)
    edges: dict[Edge, None] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for name, line in _imports(tree, module, files):
            dst = _resolve(name, files, module)
            if dst is not None and dst != module:
                edges[Edge(module, dst, str(path.relative_to(root)), line)] = None
    return list(edges)


def circles(edges: list[Edge]) -> list[list[Edge]]:
    """Each set of modules that import each other in a loop (a strongly connected component of
    two or more modules), as the edges inside it (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.src, set()).add(e.dst)
        graph.setdefault(e.dst, set())
    index, low, on, stack, comps, counter = {}, {}, set(), [], [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [sorted((e for e in edges if e.src in c and e.dst in c), key=str) for c in comps]


def declarations(root: Path, packages=PACKAGES) -> dict[str, tuple[str, ...] | None]:
    """Package -> its ``MAY_IMPORT`` tuple (read from its ``__init__.py``), None where it has none."""
    out = {}
    for name, path in module_files(root, packages).items():
        if path.name != "__init__.py":
            continue
        value = None
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AnnAssign) else [])
            if any(isinstance(t, ast.Name) and t.id == "MAY_IMPORT" for t in targets):
                value = tuple(ast.literal_eval(node.value))
        out[name] = value
    return out


def owner(module: str, decl: dict[str, object]) -> str:
    """The innermost declared package that holds ``module``."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in decl:
            return ".".join(parts[:n])
    return parts[0]


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layer_violations(root: Path, packages=PACKAGES) -> list[str]:
    """Each import edge that leaves its package for one its ``MAY_IMPORT`` does not name, and each
    package that declares nothing; one line each, naming the edge."""
    decl = declarations(root, packages)
    out = [f"{pkg}: its __init__.py declares no MAY_IMPORT" for pkg, v in sorted(decl.items()) if v is None]
    for e in import_graph(root, packages, loose=()):
        src_pkg = owner(e.src, decl)
        if _within(e.dst, src_pkg):
            continue
        allowed = decl.get(src_pkg) or ()
        if not any(_within(e.dst, a) for a in allowed):
            out.append(f"{e} leaves {src_pkg} for {owner(e.dst, decl)}, which {src_pkg}'s MAY_IMPORT "
                       f"{tuple(allowed)} does not name")
    return out


def long_files(root: Path, packages=PACKAGES, limit: int = MAX_LINES) -> list[str]:
    """Each module past ``limit`` lines, with its length."""
    return [f"{path.relative_to(root)}: {n} lines (at most {limit}: split it by purpose)"
            for path in module_files(root, packages).values()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > limit]
