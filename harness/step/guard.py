"""Capture safety, checked on any device (MEASUREMENT.md, "CUDA graphs"): one step run under a
``TorchFunctionMode`` and a ``TorchDispatchMode`` that report what would make it block on the host
or break a CUDA-graph capture, by the project's file and line, before any GPU is involved.

Kinds of :class:`Finding`:

- ``list_index``: a tensor indexed with a Python list (``t[[0, 1]]``, ``t[:, [0, 1]]``, also
  assigned to): the list is copied from the host at every call (a blocking copy on CUDA, refused
  by a capture). Seen on ``Tensor.__getitem__`` / ``Tensor.__setitem__``. The ``aten.lift_fresh``
  the list's conversion dispatches is folded into this finding (no ``host_tensor`` of its own).
- ``host_tensor``: a tensor made from host data inside the step (``aten.lift_fresh`` /
  ``aten.lift_fresh_copy``: ``torch.tensor(...)``, ``torch.from_numpy``, ...), or a factory
  (``torch.zeros``, ``torch.arange``, ``torch.full``, ...) whose ``device`` is missing or is not the
  step's device. ``x.new_zeros(...)``, ``torch.zeros_like(x)`` and a factory with ``out=`` inherit
  their device and are fine.
- ``host_sync``: a value the host waits for: ``Tensor.item`` / ``tolist`` / ``numpy`` / ``cpu``,
  Python control flow on a tensor (``__bool__``, ``__int__``, ...), ``aten._local_scalar_dense``,
  ops whose output shape depends on the data (``nonzero``, ``masked_select``, ``unique``,
  ``repeat_interleave`` without ``output_size``), ``equal``, and boolean-mask indexing (``index``
  / ``index_put_`` with a bool or uint8 index).

A finding is placed at the innermost frame of the stack that belongs to the project (a file under
the repository root, outside hidden folders such as ``.venv/``, and not this module), path relative
to the root, or to a script of the caller's outside the checkout (any file outside Python's library
folders and site-packages), its absolute path, or to a loaded plugin (:data:`routers.plugins.LOADED`:
its file, and every file of its package's folder), its absolute path even when it is installed
in site-packages; the stack is walked only for a suspicious op. An op of the backward is seen too (the
dispatch mode sees the ops of autograd's backward and of custom ``autograd.Function`` s) and says
which backward node ran it; an autograd-made backward has no frame of its own, so it is placed at
the project line that called ``backward()``. Ops of ``torch.optim`` are left out
(:data:`OPAQUE`): a non-capturable optimizer keeps its step counts on the host by design, and the
captured ``train_step`` uses a capturable one (:func:`harness.step.modes.make_optimizer`).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

#: The kinds of :class:`Finding` (module doc).
KINDS = ("list_index", "host_tensor", "host_sync")
#: The repository root: findings are placed in files under it, paths relative to it.
ROOT = Path(__file__).resolve().parents[2]
#: Folders of libraries whose ops are not the project's (module doc): ``torch/optim``.
OPAQUE = (os.path.dirname(os.path.abspath(torch.optim.__file__)) + os.sep,)
#: Where a finding goes when no frame of the stack is the project's.
NO_FRAME = "<no project frame>"

_SELF = os.path.abspath(__file__)
_ROOT = str(ROOT) + os.sep
#: Python's own library folders: a frame there is never the project's nor a user's script
_LIBRARY = tuple(sorted({os.path.abspath(p) + os.sep for k, p in sysconfig.get_paths().items()
                         if k in ("stdlib", "platstdlib", "purelib", "platlib")}))
_aten = torch.ops.aten
_INDEXING = {torch.Tensor.__getitem__: "__getitem__", torch.Tensor.__setitem__: "__setitem__"}
_FACTORIES = {f: n for n in ("tensor", "as_tensor", "asarray", "from_numpy", "frombuffer", "arange", "range",
                             "zeros", "ones", "full", "empty", "empty_strided", "eye", "linspace", "logspace",
                             "rand", "randn", "randint", "randperm", "scalar_tensor", "tril_indices",
                             "triu_indices") if (f := getattr(torch, n, None)) is not None}
_SYNC_METHODS = {getattr(torch.Tensor, n): why for n, why in (
    ("item", "Tensor.item copies a value to the host"),
    ("tolist", "Tensor.tolist copies the tensor to the host"),
    ("numpy", "Tensor.numpy copies the tensor to the host"),
    ("cpu", "Tensor.cpu copies the tensor to the host"),
    ("__bool__", "Tensor.__bool__: Python control flow on a tensor's value"),
    ("__int__", "Tensor.__int__ copies a value to the host"),
    ("__float__", "Tensor.__float__ copies a value to the host"),
    ("__index__", "Tensor.__index__ copies a value to the host"))}
_LIFT = {_aten.lift_fresh, _aten.lift_fresh_copy}
_SHAPED = "an output shaped by the data"
_SYNC_OPS = {_aten._local_scalar_dense: "a value copied to the host", _aten.equal: "a bool returned to the host",
             _aten.nonzero: _SHAPED, _aten.masked_select: _SHAPED, _aten._unique2: _SHAPED,
             _aten.unique_dim: _SHAPED, _aten.unique_consecutive: _SHAPED}
_MASK_INDEX = {_aten.index, _aten.index_put, _aten.index_put_, _aten._index_put_impl_}


@dataclass(frozen=True)
class Finding:
    """What would break a capture, and where.

    Attributes:
        kind: one of :data:`KINDS`.
        file: the project file, relative to the repository root (``routers/multires.py``), or
            :data:`NO_FRAME`.
        line: its line number (0 with :data:`NO_FRAME`).
        detail: what the op was (``Tensor.__getitem__ with a Python list``).
    """

    kind: str
    file: str
    line: int
    detail: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.kind.replace('_', ' ')}: {self.detail}"


def format_findings(findings: Iterable[Finding]) -> str:
    """One line per finding (:meth:`Finding.__str__`); the empty string for none."""
    return "\n".join(str(f) for f in findings)


_paths: dict[str, str | None] = {}
#: (the plugins' files, their package folders) of :func:`plugin_paths`' last look
_plugins: tuple[frozenset, tuple] = (frozenset(), ())


def plugin_paths() -> tuple[frozenset, tuple]:
    """(absolute files, absolute folders ending in a separator) of the loaded plugins
    (:data:`routers.plugins.LOADED`): a plugin module's file; for a module of a package (a dotted
    name, or a package's ``__init__.py``), every file under its top package's folder too."""
    loader = sys.modules.get("routers.plugins")
    files, folders = set(), set()
    for plugin in (getattr(loader, "LOADED", {}) or {}).values():
        if not plugin.file:
            continue
        path = os.path.abspath(plugin.file)
        files.add(path)
        top = Path(path).parent
        depth = plugin.module.count(".") + (os.path.basename(path) == "__init__.py")
        if depth:
            for _ in range(depth - 1):
                top = top.parent
            folders.add(str(top) + os.sep)
    return frozenset(files), tuple(sorted(folders))


def _project_path(filename: str) -> str | None:
    """``filename`` relative to :data:`ROOT` when it is a project file (module doc), a plugin's
    file by its absolute path, else None."""
    try:
        return _paths[filename]
    except KeyError:
        pass
    rel = None
    path = os.path.abspath(filename)
    if not filename.startswith("<") and path != _SELF:
        parts = path.split(os.sep)
        library = "site-packages" in parts or "dist-packages" in parts or path.startswith(_LIBRARY)
        if path in _plugins[0] or path.startswith(_plugins[1]):
            rel = "/".join(path[len(_ROOT):].split(os.sep)) if path.startswith(_ROOT) else path
        elif path.startswith(_ROOT):
            inside = path[len(_ROOT):].split(os.sep)
            if not inside[0].startswith(".") and not library:
                rel = "/".join(inside)
        elif not library:  # a researcher's own script outside the checkout: its absolute path
            rel = path
    _paths[filename] = rel
    return rel


def _refresh() -> None:
    global _plugins
    if (now := plugin_paths()) != _plugins:  # a plugin loaded since: its files are the project's
        _plugins = now
        _paths.clear()


def project_frame(frames: Iterable[tuple[str, int]]) -> tuple[str, int] | None:
    """The innermost (file, line) of ``frames`` (outermost first, e.g. a traceback's
    ``(filename, lineno)`` pairs) that is the project's or a plugin's (module doc), its path as a
    finding gives it; None when none is."""
    _refresh()
    found = None
    for filename, line in frames:
        rel = _project_path(filename)
        if rel is not None:
            found = (rel, line)
    return found


def _origin() -> tuple[str, int] | None:
    """(file, line) of the innermost project frame of the stack; None inside :data:`OPAQUE`."""
    _refresh()
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(OPAQUE):
            return None
        rel = _project_path(filename)
        if rel is not None:
            return rel, frame.f_lineno
        frame = frame.f_back
    return NO_FRAME, 0


def _has_list(index: Any) -> bool:
    """A Python list in an index (or in a tuple index) that is not a list of tensors only."""
    if isinstance(index, tuple):
        return any(_has_list(i) for i in index)
    return isinstance(index, list) and not all(isinstance(i, torch.Tensor) for i in index)


def _same_device(given: Any, device: torch.device) -> bool:
    d = torch.device(given)
    return d.type == device.type and (d.index is None or device.index is None or d.index == device.index)


class _Guard:
    """The findings of one step, shared by the two modes."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.found: dict[tuple[str, str, int], Finding] = {}
        self.list_index = 0  # inside Tensor.__getitem__/__setitem__ with a list: its lift_fresh is folded

    def report(self, kind: str, detail: str) -> None:
        where = _origin()
        if where is None:
            return
        node = torch._C._current_autograd_node()
        if node is not None:
            detail += f" (in the backward: {node.name()})"
        key = (kind, *where)
        if key not in self.found:
            self.found[key] = Finding(kind, where[0], where[1], detail)

    def factory(self, name: str, args: tuple, kwargs: dict) -> None:
        if kwargs.get("out") is not None:
            return
        if name in ("as_tensor", "asarray") and args and isinstance(args[0], torch.Tensor) \
                and "device" not in kwargs:
            return  # an existing tensor, where it is
        device = kwargs.get("device")
        if device is None:
            self.report("host_tensor", f"torch.{name} without a device")
        elif not _same_device(device, self.device):
            self.report("host_tensor", f"torch.{name} on {torch.device(device)}, not the step's {self.device}")


class _FunctionMode(TorchFunctionMode):
    def __init__(self, guard: _Guard) -> None:
        super().__init__()
        self.guard = guard

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        g = self.guard
        try:
            indexing = _INDEXING.get(func)
            factory = _FACTORIES.get(func)
            sync = _SYNC_METHODS.get(func)
        except TypeError:  # an unhashable callable: none of ours
            indexing = factory = sync = None
        if indexing is not None and len(args) > 1 and _has_list(args[1]):
            g.report("list_index", f"Tensor.{indexing} with a Python list")
            g.list_index += 1
            try:
                return func(*args, **kwargs)
            finally:
                g.list_index -= 1
        if factory is not None:
            g.factory(factory, args, kwargs)
        elif sync is not None:
            g.report("host_sync", sync)
        return func(*args, **kwargs)


class _DispatchMode(TorchDispatchMode):
    def __init__(self, guard: _Guard) -> None:
        super().__init__()
        self.guard = guard

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        g, packet = self.guard, func.overloadpacket
        if packet in _LIFT:
            if not g.list_index:
                g.report("host_tensor", f"aten.{func.__name__}: a tensor made from host data")
        elif packet in _SYNC_OPS:
            g.report("host_sync", f"aten.{func.__name__}: {_SYNC_OPS[packet]}")
        elif func is _aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
            g.report("host_sync", f"aten.{func.__name__} without output_size: {_SHAPED}")
        elif packet in _MASK_INDEX and len(args) > 1 and any(
                isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1]):
            g.report("host_sync", f"aten.{func.__name__} with a boolean mask: {_SHAPED}")
        return func(*args, **kwargs)


def capture_findings(step: Callable[[], object], device: torch.device | str = "cpu") -> list[Finding]:
    """Run ``step()`` once under both modes and return what would break its capture (module doc).

    Args:
        step: a zero-argument step (:func:`harness.step.modes.make_step`); a ``fwd_bwd`` or
            ``train_step`` step runs its backward inside, and that is checked too.
        device: the device the step is meant for: a factory on another device, or without one, is
            a ``host_tensor`` finding.

    Returns:
        the findings, one per (kind, file, line), in the order they first occurred; empty for a
        capture-safe step.

    Raises:
        whatever ``step`` raises (the modes are left on the way out).
    """
    guard = _Guard(torch.device(device))
    with _DispatchMode(guard), _FunctionMode(guard):
        step()
    return list(guard.found.values())
