"""What every command shares: options from a spec, opening a run directory, clean interrupts."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import click

from harness.rundir.environment import device_slug, new_run_id, write_manifest
from harness.rundir.records import SPEC_FILE
from harness.rundir.writer import RunWriter
from routers.errors import ConfigError

from ..spec import load, to_toml, write_toml
from ..spec.base import flag, leaves, tomllib

#: How each kind of option is shown in ``--help``.
METAVAR = {"int": "N", "float": "X", "str": "TEXT", "ints": "N,N", "strs": "A,B", "table": "JSON"}
DEFAULT_OUT = "results"


def spec_options(spec_cls: type) -> Callable:
    """Decorate a command with one click option per field of ``spec_cls`` plus ``--config``.

    Every option defaults to ``None`` ("not given") and is parsed by the spec (:mod:`harness.spec`),
    not by click, so the command line and ``--config`` are checked by the same code and every
    error is one line.
    """
    def deco(f: Callable) -> Callable:
        f.spec_class = spec_cls  # what a command's options load into (the docs' command check reads it)
        for _, name, fld in reversed(list(leaves(spec_cls))):
            o = fld.metadata["opt"]
            if not o.cli:
                continue
            dash = name.replace("_", "-")
            if o.kind == "bool":
                f = click.option(f"--{dash}/--no-{dash}", name, default=None, help=o.help)(f)
            else:
                short = (o.kind == "str" and isinstance(o.choices, tuple) and len(o.choices) <= 4)
                metavar = o.metavar or ("[" + "|".join(o.choices) + "]" if short else METAVAR[o.kind])
                f = click.option(flag(name), name, default=None, help=o.help, metavar=metavar)(f)
        return click.option("--config", default=None, metavar="FILE.toml",
                            help="Options as TOML (sections as in spec.toml); the command line overrides it.")(f)
    return deco


def load_spec(spec_cls: type, cli: dict[str, Any], config: str | None):
    """Load, check and resolve a spec: ``(resolved spec, labels)``.

    Raises:
        ConfigError: the first bad option, named.
    """
    spec, labels = load(spec_cls, cli, config)
    return spec.resolve(labels), labels


class Interrupted(KeyboardInterrupt):
    """The first SIGINT or SIGTERM of a long command (a ``KeyboardInterrupt``, so no
    ``except Exception`` of the measuring code swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` once; a second one exits at once (status
    128 + signal) without cleaning up (what was pending is moved to ``aborted/`` on resume)."""
    hits = []

    def handler(signum, frame):
        if hits:
            os.write(2, b"\ninterrupted again: exiting now; the unit in progress moves to aborted/ on resume\n")
            os._exit(128 + signum)
        hits.append(signum)
        raise Interrupted(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def program() -> str:
    """How to call this program again: ``routerbench`` when that is what runs, else the path it
    was run by, else ``python -m harness.cli``."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    exe = shutil.which("routerbench")
    if argv0 and Path(argv0).name == "routerbench":
        if exe and Path(exe).resolve() == Path(argv0).resolve():
            return "routerbench"
        return shlex.quote(argv0)
    return f"{shlex.quote(sys.executable)} -m harness.cli"


class Run:
    """An open run directory of one command: its writer (locked), spec file and manifest.

    Args:
        command: ``run``, ``train`` or ``profile``.
        spec: the resolved spec (``output.out``/``output.run_id`` say where).
        prefix: run-id prefix (``profile-``).
        run_id: instead of ``--run-id`` (a study's unit: ``STUDY-L{depth}-s{seed}``).
        lock: False with ``--lock-free`` (:func:`harness.rundir.lock.take_lock`).

    Raises:
        ConfigError: ``--out`` unusable, the directory locked by another process, or a resumed
            run whose ``spec.toml`` differs from the options given.
    """

    def __init__(self, command: str, spec: Any, prefix: str = "", run_id: str | None = None,
                 lock: bool = True) -> None:
        import torch
        out = spec.output.out or DEFAULT_OUT
        given = run_id or spec.output.run_id or new_run_id()
        self.run_id = given if given.startswith(prefix) else prefix + given
        self.device = torch.device(spec.output.device)
        self.dir = Path(out) / device_slug(self.device) / self.run_id
        self.command, self.spec, self.out = command, spec, out
        self.resumed = (self.dir / SPEC_FILE).exists() or (self.dir / "records.jsonl").exists()
        if os.environ.get("RANK", "0") != "0":  # torchrun: rank 0 alone writes and locks
            from harness.rundir.writer import NullRunWriter
            self.writer = NullRunWriter(self.dir, self.run_id)
            return
        self.writer = RunWriter(self.dir, self.run_id, new_run_id(),
                                base={"device": str(self.device)}, out_option=f"--out {out}", lock=lock)
        try:
            self._check_spec()
        except BaseException:
            self.writer.close()
            raise

    @property
    def spec_path(self) -> Path:
        return self.dir / SPEC_FILE

    def _check_spec(self) -> None:
        """A resumed run must be resumed with the spec it was started with."""
        if not self.spec_path.exists() and (self.dir / "records.jsonl").exists():
            raise ConfigError(f"--run-id {self.run_id}: {self.dir} holds records but no {SPEC_FILE}, so "
                              "what it measured cannot be checked against these options; choose another --run-id")
        if self.spec_path.exists():
            try:
                text = self.spec_path.read_text(encoding="utf-8")
                command = tomllib.loads(text).get("command")
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
                raise ConfigError(f"--run-id {self.run_id}: {self.spec_path} is unreadable, so this run "
                                  "cannot be resumed safely; choose another --run-id") from None
            if not isinstance(command, str):
                raise ConfigError(f"--run-id {self.run_id}: {self.spec_path} names no command, so this run "
                                  "cannot be resumed safely; choose another --run-id")
            if command != self.command:
                raise ConfigError(f"--run-id {self.run_id}: {self.dir} holds a `routerbench {command}` run; "
                                  f"choose another --run-id for `routerbench {self.command}`")
            try:
                diff = spec_difference(self.spec, self.spec_path)
            except ConfigError as exc:
                raise ConfigError(f"--run-id {self.run_id}: its {SPEC_FILE} no longer loads ({exc}); "
                                  "choose another --run-id") from None
            if diff:
                raise ConfigError(f"--run-id {self.run_id}: this run was started with {diff[0]} = "
                                  f"{_show(diff[1])}, not {_show(diff[2])}; resume it with "
                                  f"--config {self.spec_path} or choose another --run-id")
            _check_plugins(self.run_id, self.spec_path, tomllib.loads(text).get("plugins") or [])
        from routers import plugins
        write_toml(self.spec, self.spec_path, f"routerbench {self.command} spec, resolved; repeat with:\n"
                   f"  routerbench {self.command} --config <this file> --out <results root> --run-id NEW",
                   self.spec.NOT_IN_FILE, plugins.records())

    def announce(self, what: str = "") -> None:
        """Say where the run goes, whether it resumes, and what was recovered from a dead writer,
        and warn on stderr when the machine is already busy (:func:`harness.timing.noise.busy_warning`)."""
        rec = self.writer.recovered
        if rec["pending_units"] or rec["torn_tail_bytes"]:
            torn = f" and a torn tail of records.jsonl ({rec['torn_tail_bytes']} bytes)" if rec["torn_tail_bytes"] else ""
            click.echo(f"recovered: {rec['pending_units']} unfinished unit(s){torn} of an earlier process, "
                       f"moved to {self.dir / 'aborted'}")
        click.echo(f"{'resuming' if self.resumed else 'writing'} {self.dir}{what}")
        from harness.timing.noise import busy_warning
        if (busy := busy_warning()) is not None:
            click.echo(busy, err=True)

    def manifest(self, extra: dict[str, Any]) -> None:
        """Write (or extend, on resume) ``manifest.json``; rank 0 only under torchrun. Each session
        records ``cpu_pressure_start`` (the machine's CPU pressure as it began, a ratio, None
        without PSI), ``others_start`` (the CPUs other work held as it began), ``load_avg_start``
        and ``cpus`` (:func:`harness.timing.noise.machine_load`), which later plans read to leave
        busy runs out of their calibration."""
        if not isinstance(self.writer, RunWriter):
            return
        from harness.timing.noise import machine_load
        m = machine_load()
        from routers import plugins
        write_manifest(self.dir, self.device, {"run_id": self.run_id, "command": self.command,
                                               "spec": SPEC_FILE, "cpu_pressure_start": m["pressure"],
                                               "others_start": m["others"], "load_avg_start": m["load_avg"], "cpus": m["cpus"],
                                               "plugins": plugins.records(), **extra})

    def finish(self, started: float) -> None:
        """Write the command's wall time since ``started`` (``time.perf_counter``) beside its plan:
        ``actual_s`` of this session in ``manifest.json`` (and at the top for a first session),
        which later runs calibrate their estimate on (:mod:`harness.cli.forecast`). Only a command
        that finished calls it: an interrupted one leaves no ``actual_s``."""
        self.note_session(actual_s=round(time.perf_counter() - started, 1))

    def note_session(self, **fields: Any) -> None:
        """Set ``fields`` on this session in ``manifest.json`` (and at the top for a first session);
        nothing without a manifest (ranks ≠ 0) or when it cannot be read."""
        path = self.dir / "manifest.json"
        if not isinstance(self.writer, RunWriter) or not path.exists():
            return
        try:
            m = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        sessions = m.get("sessions") or []
        if sessions:
            sessions[-1].update(fields)
        if len(sessions) <= 1:
            m.update(fields)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(m, indent=2, default=str))
        tmp.replace(path)

    def resume_command(self) -> str:
        """The exact command that resumes this run."""
        return resume_command(self.command, self.dir, self.out)

    @contextlib.contextmanager
    def guarded(self, keys: Callable[[], Iterable[str]]) -> Iterator[None]:
        """Run the body with clean interrupts and failure exits.

        ``keys`` gives the case keys the command will complete (to say "N of M done"). An
        interrupt prints ``interrupted: N of M done; resume with: <command>`` and exits 130
        (SIGINT) or 143 (SIGTERM); a full disk exits 1 with one ``routerbench: error:`` line; a
        sticky device error (:class:`harness.step.device_errors.DeviceContextLost`, its case already
        an ``error`` row) exits 75 (:data:`harness.cli.supervise.EXIT_DEVICE_LOST`), for the
        supervisor to resume the run in a new process.
        """
        from harness.rundir.writer import DiskFullError
        from harness.step.device_errors import DeviceContextLost
        try:
            with interruptible():
                yield
        except Interrupted as exc:
            self._stop("interrupted", keys, 128 + exc.signum)
        except DiskFullError as exc:
            self._stop(f"routerbench: error: {exc.strerror}", keys, 1)
        except DeviceContextLost as exc:  # the case is an error row; nothing more can run here
            from .supervise import EXIT_DEVICE_LOST, supervised_child
            self._stop(f"routerbench: a sticky device error: {exc}", keys, EXIT_DEVICE_LOST,
                       then="the supervisor resumes the run in a new process" if supervised_child() else None)
        finally:
            self.writer.close()

    def _stop(self, what: str, keys: Callable[[], Iterable[str]], code: int, then: str | None = None) -> None:
        try:
            k = list(keys())
            done = sum(1 for c in k if c in self.writer.completed)
            counts = f"{done} of {len(k)} done"
        except Exception:  # noqa: BLE001 - the message must come out whatever
            counts = "progress unknown"
        # on a fresh line: a progress bar may hold the current one; under torchrun rank 0 alone
        # speaks (another rank's run id, made up from its own pid, names no directory)
        if os.environ.get("RANK", "0") == "0":
            click.echo(f"\n{what}: {counts}; {then or 'resume with: ' + self.resume_command()}", err=True)
        sys.exit(code)


def resume_command(command: str, run_dir: Path, out: str | None = None) -> str:
    """``<program> <command> --config <run_dir>/spec.toml --out <root> --run-id <id>``."""
    run_dir = Path(run_dir)
    out = out if out is not None else str(run_dir.parent.parent)
    return (f"{program()} {command} --config {shlex.quote(str(run_dir / SPEC_FILE))} "
            f"--out {shlex.quote(str(out))} --run-id {shlex.quote(run_dir.name)}")


def _check_plugins(run_id: str, spec_path: Path, recorded: list) -> None:
    """A resumed run must measure the plugin code it started with: each plugin its ``spec.toml``
    records from a file must have the same sha256 now, one from a distribution the same version.

    Raises:
        ConfigError: a plugin's file or version changed since the run started (naming both).
    """
    from routers import plugins
    now = {p.spec: p for p in plugins.LOADED.values()}
    for rec in recorded:
        p = now.get(rec.get("spec")) if isinstance(rec, dict) else None
        if p is None:
            continue
        for key, what in (("sha256", "its file's sha256"), ("version", "its version")):
            if rec.get(key) and getattr(p, key) and rec[key] != getattr(p, key):
                raise ConfigError(f"--run-id {run_id}: this run was started with plugin {p.label}, "
                                  f"{what} {str(rec[key])[:12]}, now {str(getattr(p, key))[:12]}; restore "
                                  f"that plugin to resume it ({spec_path}) or choose another --run-id")


def spec_difference(spec: Any, path: Path) -> tuple[str, Any, Any] | None:
    """The first option on which the spec file at ``path`` (resolved as ``spec`` is: a key the file
    predates takes its default) differs from ``spec``: ``(dotted key, file's value, spec's value)``,
    or None when they agree on everything that changes a result.

    Raises:
        ConfigError: the file no longer loads or resolves.
    """
    mine = _comparable(to_toml(spec, spec.NOT_IN_FILE))
    # a file this version wrote from an equal spec is equal as it stands; resolving it could need a
    # device this machine does not see (a study's spec on a SLURM login node)
    try:
        if _comparable(Path(path).read_text(encoding="utf-8")) == mine:
            return None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        pass
    stored, labels = load(type(spec), {}, str(path))
    theirs = _comparable(to_toml(stored.resolve(labels), spec.NOT_IN_FILE))
    if theirs == mine:
        return None
    keys = list(theirs) + [k for k in mine if k not in theirs]
    diff = next(k for k in keys if mine.get(k) != theirs.get(k))
    return diff, theirs.get(diff), mine.get(diff)


def _show(value: Any) -> str:
    return "(not set)" if value is None else json.dumps(value)


def _comparable(text: str) -> dict[str, Any]:
    """A spec file's values by dotted key, without the output options that do not change results."""
    flat = {}
    for part, table in tomllib.loads(text).items():
        if isinstance(table, dict):
            for k, v in table.items():
                if part == "output" and k in ("quiet", "report"):
                    continue
                flat[f"{part}.{k}"] = v
        else:
            flat[part] = table
    return flat
