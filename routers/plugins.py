"""Routers and impls that live in a researcher's own code: finding, loading and checking them
(docs/PLUGINS.md).

A **plugin** is a Python module that registers routers (``routers.api.register_router``) or impls
(``routers.api.register_impl``) when imported, and says which contract it was written for with a
module-level ``ROUTERBENCH_API_VERSION`` (:data:`routers.api.API_VERSION`). It is found by:

- the entry-point groups ``routerbench.routers`` and ``routerbench.impls`` of installed
  distributions (a package's ``pyproject.toml``; ``routerbench new router`` writes one);
- ``routerbench --plugin MODULE_OR_FILE[,…]``, a module name or a ``.py`` file's path;
- the environment variable ``ROUTERBENCH_PLUGINS`` (the same list; ``none`` loads no plugin, entry
  points included);
- a ``plugins = [...]`` key at the top of a ``--config`` file.

Only the command line, ``routerbench check`` and the pytest plugin load plugins: a process that
asks for none (``make test``, ``import routers``) holds the built-ins only. A loaded plugin is
recorded (:func:`records`) in spec.toml and the manifest, so that the commands reading a run
(``report``, ``summary``, ``compare``, ``gate``, ``diagnose``) load it again (:func:`load_recorded`).

Every fault of a plugin is a :class:`PluginError`: one line naming the plugin, what is wrong and
the fix, raised before any model is built.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from .errors import ConfigError

#: The environment variable that lists plugins (comma-separated; ``none``: no plugin at all).
ENV = "ROUTERBENCH_PLUGINS"
#: The entry-point groups read for routers and for impls.
GROUPS = ("routerbench.routers", "routerbench.impls")
#: The module attribute a plugin declares its contract version with.
VERSION_ATTR = "ROUTERBENCH_API_VERSION"
#: What every plugin error ends with.
DISABLE = f"(or run with {ENV}=none to load no plugin)"


class PluginError(ConfigError):
    """A plugin that cannot be used: one line naming it, what is wrong and the fix."""


@dataclass
class Plugin:
    """One loaded plugin.

    Attributes:
        spec: how it was asked for (a module name, a file path, ``group:name`` of an entry point).
        module: the module's name (``sys.modules`` key).
        file: the module's source file (absolute), or None.
        dist: the distribution it comes from (entry points, or a module installed with pip), or None.
        version: that distribution's version, or None.
        sha256: the source file's sha256 when it was loaded from a file path, else None.
        routers: the router names it registered.
        impls: the impl names it registered.
    """

    spec: str
    module: str
    file: str | None = None
    dist: str | None = None
    version: str | None = None
    sha256: str | None = None
    routers: list[str] = field(default_factory=list)
    impls: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """Where it comes from, for ``routerbench list`` and reports: ``dist version`` or the file."""
        if self.dist:
            return f"{self.dist} {self.version or '?'}"
        return f"file {self.file}" if self.sha256 else f"module {self.module}"

    def record(self) -> dict[str, Any]:
        """What spec.toml and the manifest keep of it (no None values: TOML has no null)."""
        rec = {"spec": self.spec, "module": self.module, "file": self.file, "dist": self.dist,
               "version": self.version, "sha256": self.sha256, "routers": list(self.routers),
               "impls": list(self.impls)}
        return {k: v for k, v in rec.items() if v is not None}


#: Plugins loaded in this process, by spec (in load order).
LOADED: dict[str, Plugin] = {}
#: The specs this process was asked for and loaded (what a child process is handed, :func:`child_env`).
_asked: list[str] = []


def _split(value: str | Iterable[str] | None) -> list[str]:
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    return [s.strip() for s in items if s and s.strip()]


def disabled(env: dict[str, str] | None = None) -> bool:
    """Whether ``ROUTERBENCH_PLUGINS=none`` turns every plugin off."""
    return (env if env is not None else os.environ).get(ENV, "").strip().lower() == "none"


def _is_file(spec: str) -> bool:
    return spec.endswith(".py") or os.sep in spec or "/" in spec


def _dist_of(module_file: str | None, top: str) -> tuple[str | None, str | None]:
    """The installed distribution holding top-level package ``top`` and its version, if any."""
    try:
        names = importlib.metadata.packages_distributions().get(top, [])
    except Exception:  # noqa: BLE001 - broken metadata of some other distribution: no name
        names = []
    for name in names:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None, None


@contextlib.contextmanager
def loading(label: str) -> Iterator[None]:
    """Registrations inside the body are attributed to ``label`` (:data:`routers.registry.ORIGINS`)."""
    from . import registry
    registry._plugin.append(label)
    try:
        yield
    finally:
        registry._plugin.pop()


def _import(spec: str, plugin: Plugin) -> Any:
    """Import the plugin's module (a file path or a module name)."""
    if _is_file(spec):
        path = Path(spec).expanduser().resolve()
        if not path.is_file():
            raise PluginError(f"plugin {spec}: no such file; give a .py file or an importable module name "
                              f"in --plugin / {ENV} / plugins {DISABLE}")
        name = "routerbench_plugin_" + "".join(c if c.isalnum() else "_" for c in path.stem)
        plugin.module, plugin.file = name, str(path)
        plugin.sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
        mod_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module
        try:
            mod_spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return module
    return importlib.import_module(spec)


def _check_module(plugin: Plugin, module: Any) -> None:
    from .api import API_VERSION
    declared = getattr(module, VERSION_ATTR, None)
    if declared is None:
        raise PluginError(f"plugin {plugin.spec}: its module {plugin.module} declares no {VERSION_ATTR}; add "
                          f"`{VERSION_ATTR} = {API_VERSION}` after checking it against docs/PLUGINS.md {DISABLE}")
    if declared != API_VERSION:
        raise PluginError(f"plugin {plugin.spec}: written for routerbench's plugin API {declared!r}, this routerbench "
                          f"has API {API_VERSION}; update the plugin to API {API_VERSION} (docs/PLUGINS.md) or install "
                          f"the routerbench it was written for {DISABLE}")


def _check_routers(plugin: Plugin) -> None:
    from .registry import ROUTERS
    for name in plugin.routers:
        cls = ROUTERS[name]
        missing = sorted(getattr(cls, "__abstractmethods__", ()))
        if missing:
            raise PluginError(f"plugin {plugin.spec}: router {name} ({cls.__module__}.{cls.__qualname__}) does not "
                              f"define {', '.join(missing)}; give every method of the contract in docs/PLUGINS.md "
                              f"{DISABLE}")
        if not (cls.__doc__ or "").strip():
            raise PluginError(f"plugin {plugin.spec}: router {name} has no docstring; its first line is the "
                              f"description `routerbench list` and the reports show {DISABLE}")
        if not callable(getattr(cls, "reference", None)):
            raise PluginError(f"plugin {plugin.spec}: router {name} has no float64 reference; define "
                              f"`reference(self, embedding, updates) -> (reads, h_out)` (docs/PLUGINS.md) {DISABLE}")


def load(spec: str, *, entry_point: Any = None) -> Plugin:
    """Load one plugin and check what it registered (module doc). Loading one twice is a no-op.

    Args:
        spec: a module name or a ``.py`` file's path; for an entry point, ``group:name``.
        entry_point: the ``importlib.metadata.EntryPoint`` to load instead of importing ``spec``.

    Returns:
        the :class:`Plugin`.

    Raises:
        PluginError: it fails to import, declares no or another ``ROUTERBENCH_API_VERSION``,
            registers nothing, registers a router lacking a method of the contract, or a name
            taken by a built-in or another plugin.
    """
    if spec in LOADED:
        return LOADED[spec]
    from . import impls, registry
    registry.load_routers()
    impls.names()  # built-in impls and peers first: a plugin's clash is found at its own register
    plugin = Plugin(spec=spec, module=spec)
    if entry_point is not None:
        plugin.module = entry_point.value.split(":")[0]
        if entry_point.dist is not None:
            plugin.dist, plugin.version = entry_point.dist.name, entry_point.dist.version
    routers_before, impls_before = set(registry.ROUTERS), set(impls.IMPLS)
    label = plugin.label if plugin.dist else f"plugin {spec}"
    try:
        with loading(label):
            module = entry_point.load() if entry_point is not None else _import(spec, plugin)
            if inspect.ismodule(module):
                plugin.module, plugin.file = module.__name__, plugin.file or getattr(module, "__file__", None)
            else:  # an entry point naming an attribute: the module it is in declares the version
                module = sys.modules[plugin.module]
                plugin.file = getattr(module, "__file__", None)
    except BaseException:  # what it registered before it failed is undone
        plugin.routers = sorted(set(registry.ROUTERS) - routers_before)
        plugin.impls = sorted(set(impls.IMPLS) - impls_before)
        _forget(plugin)
        _refuse(spec, plugin, sys.exc_info()[1])
    if not plugin.dist and plugin.file and not plugin.sha256:
        plugin.dist, plugin.version = _dist_of(plugin.file, plugin.module.split(".")[0])
    plugin.routers = sorted(set(registry.ROUTERS) - routers_before)
    plugin.impls = sorted(set(impls.IMPLS) - impls_before)
    for name in plugin.routers:
        registry.ORIGINS[name] = plugin.label
    try:
        _check_module(plugin, module)
        if not plugin.routers and not plugin.impls:
            raise PluginError(f"plugin {spec}: imported, but it registered no router and no impl; decorate its "
                              f"router class with @register_router(\"name\") or call register_impl(...) at import "
                              f"(routers.api) {DISABLE}")
        _check_routers(plugin)
    except PluginError:
        _forget(plugin)
        raise
    LOADED[spec] = plugin
    return plugin


def _refuse(spec: str, plugin: Plugin, exc: BaseException) -> None:
    """Raise the one line of a plugin that failed to import (``exc``); an interrupt or exit is
    re-raised as it is."""
    if isinstance(exc, PluginError) or not isinstance(exc, Exception):
        raise exc
    if isinstance(exc, ValueError) and _raised_in(exc, ("registry.py", "impls.py")):
        # register_router / register_impl refused it (a name clash, a bad declaration): its own words
        raise PluginError(f"plugin {spec}: {exc} {DISABLE}") from None
    if isinstance(exc, ModuleNotFoundError) and exc.name == spec.split(".")[0]:
        raise PluginError(f"plugin {spec}: no module named {spec!r} is installed; pip install the package that "
                          f"provides it, or give a .py file's path {DISABLE}") from None
    where = _where(exc, plugin.file or _origin(plugin.module))
    raise PluginError(f"plugin {spec}: failed to import: {type(exc).__name__}: "
                      f"{' '.join(str(exc).split())}{where}; fix the plugin {DISABLE}") from None


def _raised_in(exc: BaseException, names: tuple[str, ...]) -> bool:
    """Whether ``exc`` was raised in one of this package's modules ``names``."""
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb.tb_frame.f_code.co_filename, tb.tb_next
    here = os.path.dirname(os.path.abspath(__file__))
    return last is not None and os.path.dirname(os.path.abspath(last)) == here and os.path.basename(last) in names


def _origin(module: str) -> str | None:
    """The source file of an importable module, without importing it (None if not found)."""
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return getattr(found, "origin", None)


def _where(exc: BaseException, file: str | None) -> str:
    """`` at FILE:LINE`` of the plugin's line that failed: a syntax error's own location, else the
    deepest frame in the plugin's file (``file``), else the deepest frame outside importlib."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" at {exc.filename}:{exc.lineno}"
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not name.startswith("<frozen "):
            frames.append((name, tb.tb_lineno))
        tb = tb.tb_next
    own = [f for f in frames if file and os.path.abspath(f[0]) == os.path.abspath(file)]
    name, line = (own or frames or [(None, None)])[-1]
    return f" at {name}:{line}" if name else ""


def _forget(plugin: Plugin) -> None:
    """Undo what a refused plugin registered."""
    from . import impls, registry
    for name in plugin.routers:
        registry.ROUTERS.pop(name, None)
        registry.ORIGINS.pop(name, None)
    for name in plugin.impls:
        impls.unregister(name)


def entry_points() -> list[Any]:
    """The installed entry points of :data:`GROUPS`, in a stable order."""
    eps = []
    for group in GROUPS:
        eps.extend(sorted(importlib.metadata.entry_points(group=group), key=lambda e: e.name))
    return eps


def activate(cli: str | Iterable[str] | None = None, config: Iterable[str] | None = None, *,
             entry: bool = True, env: dict[str, str] | None = None) -> list[Plugin]:
    """Load every plugin this process is asked for: installed entry points (``entry``), then
    ``ROUTERBENCH_PLUGINS``, ``--plugin`` and a ``--config`` file's ``plugins``. With
    ``ROUTERBENCH_PLUGINS=none`` nothing is loaded (and ``--plugin`` is refused).

    Returns:
        the plugins loaded (every one loaded in this process, in load order).

    Raises:
        PluginError: the first plugin that cannot be used (:func:`load`), or ``--plugin`` given
            while plugins are turned off.
    """
    env = os.environ if env is None else env
    asked = _split(cli) + _split(config)
    if disabled(env):
        if asked:
            raise PluginError(f"--plugin {','.join(asked)}: plugins are turned off by {ENV}=none; unset it to load them")
        return []
    if entry:
        for ep in entry_points():
            load(f"{ep.group}:{ep.name}", entry_point=ep)
    for spec in _split(env.get(ENV)) + asked:
        spec = str(Path(spec).expanduser().resolve()) if _is_file(spec) else spec
        load(spec)
        if spec not in _asked:
            _asked.append(spec)
    return list(LOADED.values())


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default ``os.environ``) with ``ROUTERBENCH_PLUGINS`` naming every plugin this process
    loaded by name or file, so a child process (``--supervise``, ``--isolate``) loads the same."""
    out = dict(os.environ if env is None else env)
    if _asked and not disabled(out):
        out[ENV] = ",".join(_asked)
    return out


def impl_origin(name: str) -> str:
    """Where impl ``name`` comes from: the label of the plugin that registered it, else
    ``"built-in"`` (routerbench's own impls and the peer adapters of ``routers/peers/``)."""
    return next((p.label for p in LOADED.values() if name in p.impls), "built-in")


def records() -> list[dict[str, Any]]:
    """The loaded plugins as spec.toml and the manifest keep them (:meth:`Plugin.record`)."""
    return [p.record() for p in LOADED.values()]


def load_recorded(recs: Iterable[dict[str, Any]] | None) -> list[str]:
    """Load the plugins a run recorded (:func:`records`), for a command reading that run.

    Returns:
        one sentence per plugin that could not be loaded here ("plugin X not loaded: …"), for the
        report to say; never raises for a missing plugin.
    """
    said = []
    if disabled():
        return [f"plugin {r.get('dist') or r.get('spec')} not loaded: {ENV}=none; its routers' floors are not declared"
                for r in recs or ()]
    for rec in recs or ():
        spec = rec.get("spec", "")
        if spec in LOADED or any(p.module == rec.get("module") for p in LOADED.values()):
            continue
        try:
            if ":" in spec and spec.split(":")[0] in GROUPS:
                group, name = spec.split(":", 1)
                eps = [e for e in importlib.metadata.entry_points(group=group) if e.name == name]
                if not eps:
                    raise PluginError(f"{rec.get('dist') or spec} is not installed here")
                load(spec, entry_point=eps[0])
            else:
                load(spec)
        except PluginError as exc:
            what = ", ".join(rec.get("routers", []) + rec.get("impls", [])) or "its routers"
            said.append(f"plugin {rec.get('dist') or spec} not loaded ({' '.join(str(exc).split())}): "
                        f"{what}: floor and cost models not declared")
    return said
