"""``routerbench new router NAME [--dir DIR]``: a package for a router of your own, ready to install,
check and run beside prenorm (docs/PLUGINS.md, "Write your own router"; the files:
:mod:`harness.cli.template`)."""

from __future__ import annotations

import keyword
from pathlib import Path

import click

from routers.errors import ConfigError

from . import SHORT_HELP
from .template import render


@click.group("new", short_help=SHORT_HELP["new"])
def new_group() -> None:
    """Start something of your own that routerbench measures (`new router NAME`)."""


def check_target(name: str, directory: Path) -> None:
    """Refuse a router name or a directory ``new router`` cannot use, before anything is written.

    Raises:
        ConfigError: ``name`` is not a Python identifier (or is a keyword, or starts with ``_``),
            is taken by a built-in router or a loaded plugin's, or is the name of an importable
            module (the package would shadow it or be shadowed); ``directory`` is a file or a
            non-empty directory.
    """
    from routers import ROUTERS
    from routers.registry import origin
    if keyword.iskeyword(name):
        raise ConfigError(f"NAME {name!r}: a Python keyword cannot name a package; choose another name")
    if not name.isidentifier() or name.startswith("_"):
        raise ConfigError(f"NAME {name!r}: a router name must be a Python identifier (letters, digits and _, "
                          "not first a digit or _), e.g. gated_residual")
    if name != name.lower():
        raise ConfigError(f"NAME {name!r}: use lower case (it is also the package's name), e.g. {name.lower()}")
    if name in ROUTERS:
        raise ConfigError(f"NAME {name!r}: taken by the {origin(name)} router "
                          f"{ROUTERS[name].__module__}.{ROUTERS[name].__qualname__}; choose another name")
    import importlib.util
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        found = None
    if found is not None:
        raise ConfigError(f"NAME {name!r}: a module of that name is importable here ({found.origin or name}) and "
                          "the package would clash with it; choose another name")
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        what = "a file" if not directory.is_dir() else "a directory that is not empty"
        raise ConfigError(f"--dir {directory}: {what}; give a new or empty directory")


@new_group.command("router", short_help="Write a package for router NAME: install, check and run it.")
@click.argument("name")
@click.option("--dir", "directory", type=click.Path(path_type=Path), default=None,
              help="Where to write the package (default: ./NAME); must be new or empty.")
def new_router_cmd(name: str, directory: Path | None) -> None:
    """Write a package with router NAME: a gated residual h + sigmoid(g_k) * u to start from, its
    float64 reference and cost models, a pyproject.toml with the routerbench.routers entry point,
    a test using routerbench's pytest plugin and a README. Then:

        pip install --no-build-isolation -e DIR && routerbench check NAME &&
        routerbench run --routers prenorm,NAME
    """
    directory = Path(directory) if directory is not None else Path(name)
    check_target(name, directory)
    files = render(name)
    for rel, text in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    click.echo(f"wrote {len(files)} files of router {name} in {directory}:")
    for rel in files:
        click.echo(f"  {directory / rel}")
    click.echo("next:")
    click.echo(f"  pip install --no-build-isolation -e {directory}")
    click.echo(f"  routerbench check {name}")
    click.echo(f"  routerbench run --routers prenorm,{name} --widths 64 --depths 4 --seq-len 64 --batch-size 8 "
               f"--modes fwd_bwd --backends eager --no-train --precision-target 0.03")


COMMANDS = (new_group,)
