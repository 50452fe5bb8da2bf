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


# --- the docs cannot drift from the code: commands, make targets, links, section citations -------

#: Fenced blocks whose lines are shell commands a reader may paste.
SHELL_LANGS = ("bash", "sh", "shell", "console")
#: What a reader fills in: ``<dir>``, ``$OUT``, ``${TAG}``.
PLACEHOLDER = re.compile(r"^(?:<[^<>]*>.*|.*\$\{?\w+\}?.*|.*<[^<>]*>)$")
MD_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _fences(path: Path) -> list[tuple[str, int, list[str]]]:
    """(language, line of the first body line, body lines) of each fenced block of a markdown file."""
    out, lang, start, body = [], None, 0, []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            if lang is None:
                lang, start, body = line.strip()[3:].strip() or "-", i + 1, []
            else:
                out.append((lang, start, body))
                lang = None
        elif lang is not None:
            body.append(line)
    return out


def shell_lines(path: Path) -> list[tuple[int, str]]:
    """(line, command) of every command of the fenced shell blocks of ``path``: continuation lines
    joined, a ``$ `` prompt and a trailing ``# comment`` dropped, ``&&``/``;``/``|`` split."""
    out = []
    for lang, start, body in _fences(path):
        if lang not in SHELL_LANGS:
            continue
        k = 0
        while k < len(body):
            first, text = start + k, body[k]
            while text.rstrip().endswith("\\") and k + 1 < len(body):
                k += 1
                text = text.rstrip()[:-1] + " " + body[k].strip()
            k += 1
            text = re.sub(r"^\s*\$ ", "", text)
            text = re.sub(r"\s+#\s.*$", "", text) if not text.lstrip().startswith("#") else ""
            for part in re.split(r"\s*(?:&&|;|\|\|?)\s*", text.replace("$(which routerbench)", "routerbench")):
                if part.strip():
                    out.append((first, part.strip()))
    return out


def make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


def _dummy(param) -> str:
    """A value that ``param``'s click type accepts, for a placeholder in a documented command."""
    import click
    t = param.type
    if isinstance(t, click.Choice):
        return str(t.choices[0])
    return {"integer": "1", "float": "1.0", "boolean": "true"}.get(t.name, "x")


def check_command(tokens: list[str]) -> str | None:
    """Parse one documented ``routerbench`` command line (its arguments) with the CLI's own click
    context and, for a command with a run spec, the spec's own value checks, without running it:
    None when it parses, else why not. A placeholder value (``<dir>``, ``$OUT``) stands for any
    value of its option."""
    import click

    from harness.cli import main
    from harness.spec.base import load
    from routers.errors import ConfigError
    cmd, args, path = main, list(tokens), ["routerbench"]
    while isinstance(cmd, click.Group) and args and not args[0].startswith("-"):
        sub = cmd.get_command(click.Context(cmd), args[0])
        if sub is None:
            return f"no command {' '.join(path + args[:1])!r}"
        path.append(args.pop(0))
        cmd = sub
    if isinstance(cmd, click.Group):
        return None if not args or args[0] in ("-h", "--help") else f"{' '.join(path)} needs a command"
    by_flag = {o: p for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
    placeheld, fixed = set(), []
    for i, a in enumerate(args):
        flag_, _, inline = a.partition("=")
        if PLACEHOLDER.match(a) and i and args[i - 1] in by_flag and not by_flag[args[i - 1]].is_flag:
            placeheld.add(by_flag[args[i - 1]].name)
            fixed.append(_dummy(by_flag[args[i - 1]]))
        elif inline and flag_ in by_flag and PLACEHOLDER.match(inline):
            placeheld.add(by_flag[flag_].name)
            fixed.append(f"{flag_}={_dummy(by_flag[flag_])}")
        elif PLACEHOLDER.match(a):
            fixed.append("x")
        else:
            fixed.append(a)
    try:
        ctx = cmd.make_context(" ".join(path), fixed)
    except click.exceptions.Exit:
        return None  # --help
    except click.ClickException as exc:
        return exc.format_message()
    spec_cls = getattr(cmd.callback, "spec_class", None)
    if spec_cls is not None:
        given = {k: v for k, v in ctx.params.items() if k not in placeheld and k not in ("config", "dry_run")}
        try:
            load(spec_cls, given, None)
        except ConfigError as exc:
            return str(exc)
    return None


def documented_commands(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, command, why it does not parse or None) of every routerbench command and make
    target of the fenced shell blocks of ``path`` (``make run ARGS="…"``: its ARGS as run options)."""
    import shlex
    out = []
    for line, text in shell_lines(path):
        try:
            words = shlex.split(text)
        except ValueError as exc:
            out.append((line, text, f"cannot be split as shell words: {exc}"))
            continue
        while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # VAR=value before the command
            words.pop(0)
        if not words:
            continue
        head = words[0]
        if head.endswith("routerbench") or head == "torchrun":
            at = next((i for i, w in enumerate(words) if w.endswith("routerbench")), None)
            if at is not None:
                out.append((line, text, check_command(words[at + 1:])))
        elif (head.endswith("python") or head.endswith("python3")) and words[1:3] == ["-m", "harness.cli"]:
            out.append((line, text, check_command(words[3:])))
        elif head == "make":
            targets = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
            why = next((f"no make target {t!r}" for t in targets if t not in make_targets()), None)
            extra = next((w.split("=", 1)[1] for w in words[1:] if w.startswith("ARGS=")), None)
            if why is None and targets[:1] == ["run"] and extra is not None:
                why = check_command(["run", *shlex.split(extra)])
            out.append((line, text, why))
    return out


def test_every_documented_command_parses_with_todays_cli():
    """Each routerbench command and make target in a fenced shell block of README.md or docs/ names
    options that exist, with values that parse (placeholders allowed), and targets the Makefile has."""
    found, bad = 0, []
    for f in MD_FILES:
        for line, text, why in documented_commands(f):
            found += 1
            if why is not None:
                bad.append(f"{f.relative_to(ROOT)}:{line}: {text}\n      {why}")
    assert found > 20, "no documented command found: the scan is broken"
    assert not bad, "documented commands that today's CLI refuses:\n" + "\n".join("  " + b for b in bad)


def test_a_planted_stale_option_fails_with_its_file_and_line(tmp_path):
    doc = tmp_path / "PAGE.md"
    doc.write_text("# A page\n\nintro\n\n```bash\nrouterbench run --widths 64 \\\n  --no-such-option 3\n"
                   "make run ARGS=\"--depths 4,8\"\nmake no-such-target\nrouterbench run --widths many\n```\n")
    got = documented_commands(doc)
    assert [(line, why is None) for line, _, why in got] == [(6, False), (8, True), (9, False), (10, False)]
    assert "No such option '--no-such-option'" in got[0][2]
    assert got[2][2] == "no make target 'no-such-target'"
    assert "--widths takes an integer, got 'many'" in got[3][2]
    assert check_command(["run", "--out", "<dir>", "--run-id", "$ID", "--config", "<run dir>/spec.toml"]) is None
    assert check_command(["stuyd", "depth"]) == "no command 'routerbench stuyd'"


def _slug(text: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*?|_(?=\w)|(?<=\w)_", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def headings(path: Path) -> list[str]:
    """The headings of a markdown file (outside fenced blocks), as written."""
    out, fence = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"^#{1,6}\s+(.+?)\s*#*\s*$", line)):
            out.append(m.group(1))
    return out


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in headings(path):
        s = _slug(h)
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


def test_every_relative_link_and_anchor_of_the_docs_resolves():
    bad, n = [], 0
    for f in MD_FILES:
        text = f.read_text(encoding="utf-8")
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            target = m.group(1)
            if re.match(r"^[a-z]+:", target):
                continue
            n += 1
            line = text.count("\n", 0, m.start()) + 1
            file_, _, anchor = target.partition("#")
            dest = (f.parent / file_).resolve() if file_ else f
            if not dest.exists():
                bad.append(f"{f.relative_to(ROOT)}:{line}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{f.relative_to(ROOT)}:{line}: {target}: no heading with anchor #{anchor}")
    assert n > 10, "no relative link found: the scan is broken"
    assert not bad, "broken links:\n" + "\n".join("  " + b for b in bad)


#: A section cited in code, help text or docs: ``README, "Suites"``, ``docs/GPU.md, "…"``,
#: ``MEASUREMENT.md, "Timing"`` (a docs page named without its folder).
CITATION = re.compile(r"\b(README(?:\.md)?|(?:docs/)?[A-Z][A-Z_]+\.md)[,:]?\s+\"([^\"]{1,80})\"")


def _cites(files: list[Path]) -> list[tuple[str, str, str]]:
    """(file:line, page, section) of each citation; a citation may wrap over lines."""
    out = []
    for f in files:
        if not f.is_file() or f.name == "test_paths.py":
            continue
        chunks = _prose(f) if f.suffix == ".py" else [(1, f.read_text(encoding="utf-8", errors="replace"))]
        for i, text in chunks:
            for m in CITATION.finditer(text.replace('\\"', '"')):
                line = i + text.count("\n", 0, m.start())
                out.append((f"{f.relative_to(ROOT)}:{line}", m.group(1), " ".join(m.group(2).split())))
    return out


def _heading_named(path: Path, name: str) -> bool:
    """Whether ``path`` has a heading ``name`` (its text without markup, or that text up to a colon
    or an opening parenthesis)."""
    name = re.sub(r"`|\*\*?", "", name).strip()
    for h in headings(path):
        plain = re.sub(r"`|\*\*?", "", h).strip()
        if name in (plain, re.split(r":\s|\s\(", plain)[0]) or h.startswith(name + " `"):
            return True
    return False


def test_every_cited_section_is_a_heading_of_the_page_it_names():
    """A citation like README, "Compile scopes" or docs/GPU.md, "What each GPU number means" in the
    code, its help texts, the scripts or the docs names a heading that exists on that page."""
    cites = _cites([*CODE_FILES, *DOC_FILES])
    assert len(cites) > 20, "no citation found: the scan is broken"
    bad = []
    for where, page, name in cites:
        path = ROOT / "README.md" if page.startswith("README") else ROOT / "docs" / Path(page).name
        if not path.exists():
            bad.append(f"{where}: {page} does not exist")
        elif not _heading_named(path, name):
            bad.append(f"{where}: {page} has no heading \"{name}\"")
    assert not bad, "citations of sections that do not exist:\n" + "\n".join("  " + b for b in bad)


#: Where every measured figure must say where it was measured.
PROVENANCE_FILES = [ROOT / "README.md", ROOT / "docs" / "GPU.md"]
#: "(2-core CPU, 783645d, `make run`, 2026-12-05)": the machine, the commit, the command, the date.
PROVENANCE = re.compile(r"\(([^(),`]+), ([0-9a-f]{7,40}), `([^`]+)`, (\d{4}-\d{2}-\d{2})\)")
#: A measured figure: a duration, a rate, a size or a percentage, in a block that says it was measured.
FIGURE = re.compile(r"\d(?:[\d.,]*)\s?(?:ms|s|min|h|GB/s|TB/s|GiB|MiB|GB|%)(?![\w/])")
MEASURED = re.compile(r"\b(?:measured|took|ran in)\b", re.I)
#: What says a figure was not measured ("not yet measured", "no GPU time has been measured").
NOT_MEASURED = re.compile(r"\b(?:not|no|never|nothing)\b[^.;|\n]{0,60}?\bmeasured\b|\bunmeasured\b", re.I)


def _blocks(path: Path) -> list[tuple[int, str]]:
    """(first line, text) of each paragraph, list or table of a markdown file; a fenced block is
    one block of its own."""
    out, cur, start, fence = [], [], 0, False
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            if not fence and cur:
                out.append((start, "\n".join(cur)))
                cur = []
            fence = not fence
            cur.append(line)
            start = start if len(cur) > 1 else i
            if not fence:
                out.append((start, "\n".join(cur)))
                cur = []
            continue
        if not fence and not line.strip():
            if cur:
                out.append((start, "\n".join(cur)))
            cur = []
            continue
        if not cur:
            start = i
        cur.append(line)
    if cur:
        out.append((start, "\n".join(cur)))
    return out


def unproven_figures(path: Path) -> list[str]:
    """Where ``path`` quotes a measured figure with no provenance in its block or the block before
    (a table's or a pasted output's caption), and each provenance whose commit is not in this
    repository's history or whose command does not parse."""
    import subprocess
    bad = []
    blocks = _blocks(path)
    for k, (line, text) in enumerate(blocks):
        for m in PROVENANCE.finditer(text):
            sha, cmd = m.group(2), m.group(3)
            if (ROOT / ".git").exists() and subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{sha}^{{commit}}"],
                                                           capture_output=True).returncode:
                bad.append(f"{path.relative_to(ROOT)}:{line}: commit {sha} of {m.group(0)} is not in this repository")
            words = cmd.split()
            if words and words[0].endswith("routerbench") and (why := check_command(words[1:])):
                bad.append(f"{path.relative_to(ROOT)}:{line}: {cmd}: {why}")
        fence = text.split("\n", 1)[0].strip("` ") if text.startswith("```") else None
        if fence in SHELL_LANGS:
            continue  # commands, not figures
        said = NOT_MEASURED.sub("", text)
        if (FIGURE.search(said) and (MEASURED.search(said) or fence is not None)
                and not PROVENANCE.search(text) and not (k and PROVENANCE.search(blocks[k - 1][1]))):
            bad.append(f"{path.relative_to(ROOT)}:{line}: a measured figure without its provenance "
                       "(machine, commit, `command`, date)")
    return bad


def test_measured_figures_carry_their_provenance(tmp_path):
    """Every measured figure of README.md and docs/GPU.md says on what machine, at what commit, by
    which command and on what date it was measured, in one form; a planted figure without one fails."""
    bad = [b for f in PROVENANCE_FILES for b in unproven_figures(f)]
    assert not bad, "\n".join(bad)
    page = ROOT / "docs" / "_planted.md"
    try:
        page.write_text("# P\n\nThe sweep took 4 min 31 s here.\n\nIt took 5 min (2-core CPU, 783645d, `routerbench "
                        "run --no-such`, 2026-12-05).\n\nAnd 3 s (2-core CPU, 0000000, `make run`, 2026-12-05).\n")
        got = unproven_figures(page)
    finally:
        page.unlink()
    assert got[0] == "docs/_planted.md:3: a measured figure without its provenance (machine, commit, `command`, date)"
    assert any("routerbench run --no-such: No such option" in g for g in got)
    assert any("commit 0000000" in g for g in got) or not (ROOT / ".git").exists()


def _summary_header(tmp_path: Path) -> list[str]:
    """The header of the paired table ``routerbench summary`` prints today for a run like the
    seeds suite's (prenorm, block_attnres and a multi-resolution router, eager and compiled)."""
    from click.testing import CliRunner

    from harness.cli import main
    from harness.rundir.writer import RunWriter
    with RunWriter(tmp_path, "r", "s", base={"device": "cpu"}) as w:
        with w.unit(["x"], kind="group") as u:
            for backend in ("eager", "compile"):
                for router, k in (("prenorm", 1.0), ("block_attnres", 1.5), ("haares", 1.7)):
                    for i in range(6):
                        u.write(case_key=f"{router}|{backend}", router=router, impl="two_phase" if k > 1 else "naive",
                                backend=backend, compile_mode="default" if backend == "compile" else None,
                                compile_scope="model" if backend == "compile" else None, mode="fwd_bwd",
                                workload="decoder", d_model=64, n_layers=4, n_heads=4, seq_len=64, batch_size=8,
                                dtype="float32", seed=0, metric="step_time", value=k * (1 + 0.01 * i), unit="ms",
                                repeat=i, pair=i, attempt=1)
    out = CliRunner().invoke(main, ["summary", str(tmp_path)]).output
    return next(ln for ln in out.splitlines() if "vs prenorm [CI]" in ln).split()


def test_the_readmes_pasted_summary_has_todays_header(tmp_path):
    """README's sample of a `make run` is real output: its table's header is the one `summary`
    prints today (a renamed or added column fails here until the sample is pasted again)."""
    readme = ROOT / "README.md"
    pasted = [ln for _, _, body in _fences(readme) for ln in body if "vs prenorm [CI]" in ln]
    assert len(pasted) == 1, "README has no pasted summary table (a fenced block with its header)"
    assert pasted[0].split() == _summary_header(tmp_path)
