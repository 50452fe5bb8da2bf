"""How an option is declared, read from the command line or a TOML file, and checked.

A spec is a frozen dataclass of **parts** (``shape``, ``routers``, ``timing``, ``output``, …), each
a frozen dataclass of fields declared with :func:`option`. One declaration gives:

- the command-line option ``--<field-name>`` (``--<name>/--no-<name>`` for a boolean) and its help;
- the TOML key ``<part>.<field>`` of ``--config FILE.toml`` (``[shape]`` then ``widths = [64]``);
- the type, the allowed values and the range every source is checked against.

Every field defaults to ``None``, meaning "not given": a spec as loaded says exactly what the user
set, so contradictory options can be told apart from defaults, and ``resolve()`` (per command)
fills in the effective values. The command line overrides the file. A bad value raises
:class:`ConfigError` with one line naming the option (``--widths``) or the key
(``shape.widths in run.toml``) and what is allowed; nothing heavier than a dictionary is touched.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from routers.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: Kinds of value an option takes.
KINDS = ("int", "float", "str", "bool", "ints", "strs", "table")


@dataclass(frozen=True)
class Opt:
    """Declaration of one option (the ``metadata["opt"]`` of a spec field).

    Attributes:
        kind: one of :data:`KINDS` (``ints``/``strs``: comma-separated on the command line, a
            list in TOML; ``table``: JSON on the command line, a table in TOML).
        help: the command-line help; the effective default is stated in it.
        choices: allowed values (of each element for a list), or a callable returning them.
        min: smallest allowed number (of each element for a list).
        min_open: the bound ``min`` itself is not allowed.
        max: largest allowed number (of each element for a list).
        cli: whether the option is offered on the command line (always in TOML).
        metavar: how ``--help`` shows the value (default: by kind, ``N,N`` for ``ints``).
        empty_ok: a list option may be empty (``[]`` in TOML, ``''`` on the command line).
        path: a path; a relative one in a ``--config`` file is relative to that file's folder.
    """

    kind: str
    help: str
    choices: tuple | Callable[[], Any] | None = None
    min: float | None = None
    min_open: bool = False
    max: float | None = None
    cli: bool = True
    metavar: str | None = None
    empty_ok: bool = False
    path: bool = False

    def allowed(self) -> tuple | None:
        c = self.choices() if callable(self.choices) else self.choices
        return tuple(c) if c is not None else None


def option(kind: str, help: str, **kw: Any) -> Any:
    """A spec field: ``None`` ("not given") by default, declared by :class:`Opt`."""
    if kind not in KINDS:
        raise ValueError(f"unknown option kind {kind!r}")
    return field(default=None, metadata={"opt": Opt(kind, help, **kw)})


def flag(name: str) -> str:
    """The command-line flag of field ``name``: ``--warmup-s``."""
    return "--" + name.replace("_", "-")


def leaves(spec_cls: type) -> Iterator[tuple[str, str, dataclasses.Field]]:
    """``(part, field name, field)`` of every option of a spec class, in declaration order
    (the shared options a command does not take, its ``EXCLUDE``, left out)."""
    exclude = getattr(spec_cls, "EXCLUDE", ())
    for part in dataclasses.fields(spec_cls):
        for f in dataclasses.fields(_part_type(spec_cls, part)):
            if "opt" in f.metadata and f"{part.name}.{f.name}" not in exclude:
                yield part.name, f.name, f


def _part_type(spec_cls: type, part: dataclasses.Field) -> type:
    import typing
    return typing.get_type_hints(spec_cls)[part.name]


class Labels:
    """How to name each option in an error: its flag when it came from the command line (or was
    not given), its TOML key and file when it came from ``--config``."""

    def __init__(self, config: str | None = None) -> None:
        self.config = config
        self.from_file: set[str] = set()

    def __call__(self, path: str) -> str:
        if path in self.from_file:
            return f"{path} in {self.config}"
        return flag(path.split(".", 1)[1])


def _describe(v: Any) -> str:
    return f"{v!r} ({type(v).__name__})"


#: How a number option is parsed from the command line and what it is called in a message.
_NUMBERS: dict[str, tuple[Callable[[Any], Any], str]] = {"int": (int, "an integer"),
                                                         "float": (float, "a finite number")}


def _is_number(value: Any, kind: str) -> bool:
    if isinstance(value, bool):
        return False
    if kind == "int":
        return isinstance(value, int)
    return isinstance(value, (int, float)) and math.isfinite(value)


def coerce(value: Any, o: Opt, label: str, from_cli: bool) -> Any:
    """``value`` of one option as its kind, checked against choices and range.

    Raises:
        ConfigError: naming ``label``.
    """
    k = o.kind
    if k == "table":
        if from_cli:
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{label} must be a JSON object like "
                                  f"'{{\"haares\": {{\"n_blocks\": 2}}}}': {exc}") from None
        if not isinstance(value, dict):
            raise ConfigError(f"{label} must be a {'JSON object' if from_cli else 'table'}, got {_describe(value)}")
        return value
    if k in ("ints", "strs"):
        if from_cli:
            items = [v.strip() for v in str(value).split(",")] if str(value).strip() else []
            if "" in items:
                raise ConfigError(f"{label} takes comma-separated values without empty ones, got {value!r}")
            if not items and not o.empty_ok:
                raise ConfigError(f"{label} needs at least one value, got {value!r}")
        elif isinstance(value, list):
            items = value
            if not items and not o.empty_ok:
                raise ConfigError(f"{label} needs at least one value, got []")
        else:
            raise ConfigError(f"{label} must be a list of {'integers' if k == 'ints' else 'strings'}, "
                              f"got {_describe(value)}")
        one = Opt("int" if k == "ints" else "str", o.help, o.choices, o.min, o.min_open, o.max)
        out = tuple(coerce(v, one, label, from_cli) for v in items)
        if len(set(out)) != len(out):
            raise ConfigError(f"{label} lists a value twice: {list(out)}")
        return out
    if k == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{label} must be true or false, got {_describe(value)}")
        return value
    if k in _NUMBERS:
        parse, what = _NUMBERS[k]
        if from_cli and isinstance(value, str):
            try:
                value = parse(value)
            except ValueError:
                raise ConfigError(f"{label} takes {what}, got {value!r}") from None
        if not _is_number(value, k):
            raise ConfigError(f"{label} must be {what}, got {_describe(value)}")
        value = parse(value)
    elif k == "str" and not isinstance(value, str):
        raise ConfigError(f"{label} must be a string, got {_describe(value)}")
    allowed = o.allowed()
    if allowed is not None and value not in allowed:
        raise ConfigError(f"{label}: {value!r} is not one of {', '.join(map(str, allowed))}")
    if o.min is not None and (value < o.min or (o.min_open and value == o.min)):
        raise ConfigError(f"{label} must be {'>' if o.min_open else '>='} {o.min:g}, got {value!r}")
    if o.max is not None and value > o.max:
        raise ConfigError(f"{label} must be <= {o.max:g}, got {value!r}")
    return value


def read_toml(path: str, command: str) -> dict[str, Any]:
    """The tables of a ``--config`` file.

    Raises:
        ConfigError: unreadable file, invalid TOML, or a ``command`` key naming another command.
    """
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"--config {path}: is a directory; give a .toml file") from None
    except OSError as exc:
        raise ConfigError(f"--config {path}: cannot read it ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config {path}: not valid TOML ({exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--config {path}: not valid TOML (not UTF-8 text)") from None
    plugins = data.pop("plugins", None)
    if plugins is not None:
        if not isinstance(plugins, list) or not all(_plugin_entry(x) for x in plugins):
            raise ConfigError(f"--config {path}: plugins must be a list of module names or .py paths, "
                              f"got {_describe(plugins)}")
        from routers import plugins as loader
        base = Path(path).parent
        # a spec.toml records each plugin as a table (routers.plugins.records): its spec; an
        # entry point's is loaded by the command itself when its distribution is installed
        names = [x if isinstance(x, str) else x["spec"] for x in plugins]
        names = [x for x in names if x.split(":")[0] not in loader.GROUPS]
        loader.activate(config=[str(base / x) if loader._is_file(x) and not Path(x).expanduser().is_absolute()
                                else x for x in names], entry=False)
    cmd = data.pop("command", command)
    if not isinstance(cmd, str):
        raise ConfigError(f"--config {path}: command must be a string naming the command, got {_describe(cmd)}")
    if cmd != command:
        raise ConfigError(f"--config {path}: command = {cmd!r}, but this is `routerbench {command}`; "
                          f"use `routerbench {cmd} --config {path}`")
    return data


def _plugin_entry(x: Any) -> bool:
    """A ``plugins`` entry: a module name or path, or a plugin's record (a table with ``spec``)."""
    return isinstance(x, str) or (isinstance(x, dict) and isinstance(x.get("spec"), str))


def load(spec_cls: type, cli: dict[str, Any], config: str | None = None):
    """Build ``spec_cls`` from ``--config`` and the command line (which overrides the file).

    Args:
        spec_cls: a spec dataclass with a ``COMMAND`` name.
        cli: field name -> the command line's raw value (``None`` when not given).
        config: path of a TOML file, or None.

    Returns:
        ``(spec, labels)``; ``labels(path)`` names an option for an error message.

    Raises:
        ConfigError: an unknown key, a value of the wrong type, not allowed, or out of range.
    """
    labels = Labels(config)
    decl = {(p, n): f for p, n, f in leaves(spec_cls)}
    parts = {p for p, _ in decl}
    values: dict[tuple[str, str], Any] = {}
    if config:
        data = read_toml(config, spec_cls.COMMAND)
        for part, table in data.items():
            if part not in parts:
                raise ConfigError(f"{config}: unknown key {part!r}; the keys of `routerbench "
                                  f"{spec_cls.COMMAND}` are: command, {', '.join(sorted(parts))}")
            if not isinstance(table, dict):
                raise ConfigError(f"{config}: {part} must be a table ([{part}]), got {_describe(table)}")
            for name, value in table.items():
                if (part, name) not in decl:
                    known = sorted(n for p, n in decl if p == part)
                    raise ConfigError(f"{config}: unknown key {part}.{name}; the keys of [{part}] are: "
                                      f"{', '.join(known)}")
                labels.from_file.add(f"{part}.{name}")
                o = decl[(part, name)].metadata["opt"]
                value = coerce(value, o, labels(f"{part}.{name}"), from_cli=False)
                if o.path and not Path(value).expanduser().is_absolute():
                    value = str(Path(config).parent / value)
                values[(part, name)] = value
    for (part, name), f in decl.items():
        raw = cli.get(name)
        if raw is None:
            continue
        labels.from_file.discard(f"{part}.{name}")
        values[(part, name)] = coerce(raw, f.metadata["opt"], labels(f"{part}.{name}"), from_cli=True)
    kwargs = {}
    for part in dataclasses.fields(spec_cls):
        ptype = _part_type(spec_cls, part)
        kwargs[part.name] = ptype(**{n: v for (p, n), v in values.items() if p == part.name})
    return spec_cls(**kwargs), labels


def to_toml(spec: Any, skip: tuple[str, ...] = (), plugins: list[dict[str, Any]] | None = None) -> str:
    """The spec as TOML (fields that are ``None`` and the paths in ``skip`` left out), with the
    plugins the run loaded (``plugins``: :func:`routers.plugins.records`, written as the
    ``plugins`` key a ``--config`` file loads; left out when None or empty)."""
    doc: dict[str, Any] = {"command": spec.COMMAND}
    if plugins:
        doc["plugins"] = [dict(p) for p in plugins]
    for part in dataclasses.fields(spec):
        table = {}
        for f in dataclasses.fields(getattr(spec, part.name)):
            v = getattr(getattr(spec, part.name), f.name)
            if v is None or f"{part.name}.{f.name}" in skip:
                continue
            table[f.name] = list(v) if isinstance(v, tuple) else v
        if table:
            doc[part.name] = table
    try:
        import tomli_w
    except ImportError:  # a bare GPU box (scripts/gpu_check.sh installs nothing): the subset we write
        return _dumps_subset(doc)
    return tomli_w.dumps(doc)


def _dumps_subset(doc: dict[str, Any]) -> str:
    """TOML of a spec document (scalars, lists of scalars, tables nested to any depth), for when
    ``tomli_w`` is not installed; ``tests/test_spec.py`` checks it parses to the same document."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)  # a JSON string is a valid TOML basic string
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):  # an inline table (a plugin's record)
            return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"
        raise TypeError(f"cannot write {type(v).__name__} to a spec file")

    def table(name: str, t: dict[str, Any]) -> list[str]:
        lines = [f"[{name}]"] if name else []
        lines += [f"{json.dumps(k) if not k.isidentifier() else k} = {value(v)}"
                  for k, v in t.items() if not isinstance(v, dict)]
        for k, v in t.items():
            if isinstance(v, dict):
                sub = f"{name}.{k}" if name else k
                lines += [""] + table(sub if k.isidentifier() else f"{name}.{json.dumps(k)}", v)
        return lines

    return "\n".join(table("", doc)) + "\n"


def write_toml(spec: Any, path: Path, header: str, skip: tuple[str, ...] = (),
               plugins: list[dict[str, Any]] | None = None) -> Path:
    """Write :func:`to_toml` of ``spec`` (and ``plugins``) to ``path`` atomically, ``header`` as
    comment lines."""
    text = "".join(f"# {ln}\n" for ln in header.splitlines()) + to_toml(spec, skip, plugins)
    tmp = Path(path).with_suffix(".toml.tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return Path(path)


def given(part: Any, name: str) -> bool:
    """Whether field ``name`` of a loaded spec part was set (by the file or the command line)."""
    return getattr(part, name) is not None
