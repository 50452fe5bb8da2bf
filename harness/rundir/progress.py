"""What a run is doing now: ``progress.json`` in the run directory, rewritten on every progress
event, so that a run never goes silent (DESIGN.md, "Results").

Written by :func:`harness.sweep.run.run_sweep` (the start and end of each unit, each stage of a
case's set-up and the timing's looks: :data:`harness.sweep.prepare.Heartbeat`); read by
``routerbench status RUN_DIR`` (:func:`read_progress`, :func:`describe`) or by anyone (``jq
.latest progress.json``). It is a view of the run, never a record: nothing resumes from it, and a
run directory without it (an older run, a copy) is complete.

The file is one JSON object (``schema`` 1)::

    schema      1
    pid, host   the process that writes it and its host
    started     when the :class:`Progress` started: ISO 8601 UTC; started_t: unix seconds
    updated     when the file was last written (an event or a tick); updated_t: unix seconds
    tick_s      the ticker's period: with the writer alive, updated_t is never older than about this
    finished    null while running, then "done" or "interrupted" (the final event's stage)
    latest      the latest event that is not a tick: the stage now (ticks never replace it)
    count       events so far; dropped: how many of the oldest were dropped to keep the cap
    events      the last max_events events (5000 by default), oldest first, one a line

An event: ``t`` (unix seconds, to the millisecond), ``time`` (ISO 8601 UTC), ``stage`` (a short
name: ``sweep``, ``unit``, ``case``, ``parity``, ``build``, ``count``, ``saved_activation``,
``compile``, ``capture``, ``peak_memory``, ``warmup``, ``device_busy``, ``prepared``, ``timing``, ``unit_done``,
``tick``, and the final ``done`` or ``interrupted``), ``text`` (a sentence for a person:
``compiling model 3 of 14 (haares two_phase)``), and where known ``case`` (the case key) with
``router`` (its router), ``k`` and ``n`` (the k-th of n: a model of its group, a group of the
sweep), ``weight`` (a heartbeat's: how many cases' time the next phase may take), and every other
field its caller gave (JSON-able).

A **tick** (stage ``tick``) is added by a daemon thread whenever no event came for ``tick_s``
seconds (10 by default): its ``text`` says what is still running and for how long (``still
compiling model 3 of 14 (haares two_phase), 85 s``), ``of`` names that stage, ``since`` its ``t``
and ``elapsed`` the seconds since, and it repeats ``case``, ``router``, ``k`` and ``n``. So while
one blocking call runs (a compile of minutes, a long FLOP count) the file is still rewritten every
``tick_s``.

Atomic rewrite: every write goes to a temporary file in the same directory (``.progress.json.<pid>
.tmp``), is fsync-ed and renamed over ``progress.json`` (``os.replace``), so a reader sees the
previous file or the next, whole, never a torn one. A write that fails (a full disk) is skipped and
never stops the run (:attr:`Progress.write_error`); the next event writes everything again.
"""

from __future__ import annotations

import collections
import datetime as _dt
import json
import math
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable

PROGRESS_FILE = "progress.json"
SCHEMA = 1
#: Events kept in the file (the oldest are dropped first and counted in ``dropped``).
MAX_EVENTS = 5000
#: Seconds without an event after which the ticker adds a ``tick``.
TICK_S = 10.0
#: Stages that end a run's progress (the ``finished`` field).
FINAL_STAGES = ("done", "interrupted")


def _iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="milliseconds")


def _finite(value: Any) -> Any:
    """``value``, or None for a NaN or infinite float (which strict JSON has no word for)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _gerund(text: str) -> bool:
    first = text.split(" ", 1)[0]
    return first.endswith("ing") and first.islower()


class Progress:
    """The progress events of one run directory and the file that shows them (module doc).

    Used as a context manager: entering starts the ticker and writes a ``start`` event, a normal
    exit writes ``done``, an exception (an interrupt included) ``interrupted`` naming it.

    Args:
        run_dir: where ``progress.json`` goes; None: keep the events in memory only (a writer that
            must not write, such as a ``torchrun`` rank other than 0).
        tick_s: seconds without an event before a ``tick``; 0 or None: no ticker.
        max_events: events kept in the file (and in :attr:`events`).
        on_event: called with every event (ticks included) after it is written, e.g. to show it
            in a progress bar; its errors are swallowed.

    Attributes:
        events: the last ``max_events`` events, oldest first; ``latest``: the stage now (the latest
            event that is not a tick); ``count``: events so far; ``finished``: None, ``done`` or
            ``interrupted``; ``write_error``: why the last write failed, or None.
    """

    def __init__(self, run_dir: Path | str | None, tick_s: float | None = TICK_S,
                 max_events: int = MAX_EVENTS, on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.path = Path(run_dir) / PROGRESS_FILE if run_dir is not None else None
        self.tick_s, self.on_event = tick_s, on_event
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=max(1, max_events))
        self._lines: collections.deque[str] = collections.deque(maxlen=max(1, max_events))
        self.count = 0
        self.latest: dict[str, Any] | None = None
        self.finished: str | None = None
        self.write_error: str | None = None
        self.started_t = time.time()
        self._last = time.monotonic()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- events ------------------------------------------------------------------------------
    def event(self, stage: str, text: str | None = None, *, case: str | None = None, router: str | None = None,
              k: int | None = None, n: int | None = None, **extra: Any) -> dict[str, Any]:
        """Add one event and rewrite the file; returns the event (module doc: its fields)."""
        t = round(time.time(), 3)
        ev: dict[str, Any] = {"t": t, "time": _iso(t), "stage": stage, "text": text or stage}
        ev.update({name: v for name, v in (("case", case), ("router", router), ("k", k), ("n", n))
                   if v is not None})
        ev.update({name: _finite(v) for name, v in extra.items() if name not in ("t", "time", "stage")})
        with self._lock:
            self.events.append(ev)
            self._lines.append(json.dumps(ev, default=str))
            self.count += 1
            if stage != "tick":
                self.latest = ev
            if stage in FINAL_STAGES:
                self.finished = stage
            self._last = time.monotonic()
            self._write()
        if self.on_event is not None:
            try:
                self.on_event(ev)
            except Exception:  # noqa: BLE001 - a display must never stop a run
                pass
        return ev

    def beat(self, stage: str, weight: int = 1, **info: Any) -> None:
        """A :data:`harness.sweep.prepare.Heartbeat`: the event ``stage`` with ``weight`` and
        ``info`` (``text``, ``case``, ``router``, ``k``, ``n``, anything JSON-able)."""
        self.event(stage, weight=weight, **info)

    def tick(self) -> dict[str, Any]:
        """Add a ``tick`` for the stage now (what the ticker does when nothing else came)."""
        with self._lock:
            latest = self.latest
        if latest is None:
            return self.event("tick", "still starting")
        elapsed = time.time() - latest["t"]
        what = latest["text"] if _gerund(latest["text"]) else f"at {latest['stage']}: {latest['text']}"
        info = {f: latest[f] for f in ("case", "router", "k", "n") if f in latest}
        return self.event("tick", f"still {what}, {elapsed:.0f} s", of=latest["stage"], since=latest["t"],
                          elapsed=round(elapsed, 1), **info)

    # --- the file ----------------------------------------------------------------------------
    def document(self) -> dict[str, Any]:
        """What the file holds now (module doc), as a dict."""
        with self._lock:
            now = time.time()
            return {"schema": SCHEMA, "pid": os.getpid(), "host": socket.gethostname(),
                    "started": _iso(self.started_t), "started_t": round(self.started_t, 3),
                    "updated": _iso(now), "updated_t": round(now, 3), "tick_s": self.tick_s,
                    "finished": self.finished, "latest": self.latest, "count": self.count,
                    "dropped": self.count - len(self.events), "events": list(self.events)}

    def _write(self) -> None:
        """Rewrite the file atomically (module doc); called under the lock."""
        if self.path is None:
            return
        head = self.document()
        del head["events"]
        text = (json.dumps(head, default=str)[:-1] + ',\n "events": [\n'
                + ",\n".join(self._lines) + "\n]}\n")
        tmp = self.path.with_name(f".{PROGRESS_FILE}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view = memoryview(text.encode())
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            self.write_error = None
        except OSError as exc:  # a full disk must not stop the run: the next event tries again
            self.write_error = f"{type(exc).__name__}: {exc}"
            try:
                tmp.unlink()
            except OSError:
                pass

    # --- the ticker --------------------------------------------------------------------------
    def start(self, text: str | None = None) -> "Progress":
        """Write a ``start`` event and start the ticker (a daemon thread)."""
        self.event("start", text or "started", pid=os.getpid())
        if self.tick_s and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._tick_loop, name="progress-ticker", daemon=True)
            self._thread.start()
        return self

    def stop(self, final: str = "done", text: str | None = None) -> None:
        """Stop the ticker and write the final event (``done`` or ``interrupted``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self.finished is None:
            self.event(final, text or final)

    def _tick_loop(self) -> None:
        try:  # SIGINT and SIGTERM go to the main thread alone, so that a unit's commit, which holds
            # them there (harness/rundir/writer.py), is never interrupted through this thread
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        except (AttributeError, ValueError, OSError):
            pass
        while True:
            with self._lock:
                wait = self.tick_s - (time.monotonic() - self._last)
            if wait > 0:
                if self._stop.wait(wait):
                    return
                continue
            if self._stop.is_set():
                return
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the ticker must never die of one bad event
                self._last = time.monotonic()

    def __enter__(self) -> "Progress":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.stop("done")
        else:
            why = f"{exc_type.__name__}: {exc}".strip().rstrip(":")
            self.stop("interrupted", f"interrupted ({why})")


# --- reading ---------------------------------------------------------------------------------

def read_progress(run_dir: Path | str) -> dict[str, Any] | None:
    """The progress file of ``run_dir`` as a dict, or None when there is none or it cannot be read."""
    path = Path(run_dir) / PROGRESS_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def age_text(seconds: float) -> str:
    """``12 s``, ``4 min``, ``3.2 h``, ``2.0 d``."""
    s = max(0.0, seconds)
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def describe(doc: dict[str, Any], holder: dict[str, Any] | None, now: float | None = None) -> str:
    """One line for ``routerbench status``: the stage now, its age, and whether its writer still
    holds the run (``holder``: :func:`harness.rundir.records.lock_holder`'s answer)."""
    now = time.time() if now is None else now
    latest = doc.get("latest") or {}
    text = latest.get("text") or latest.get("stage") or "no event yet"
    router = latest.get("router")
    if router and str(router) not in text:
        text += f" ({router}|…)"
    try:
        ago = f", {age_text(now - float(latest['t']))} ago" if "t" in latest else ""
    except (TypeError, ValueError):
        ago = ""
    pid = doc.get("pid")
    if doc.get("finished"):
        who = f"finished: {doc['finished']}"
    elif holder and holder.get("pid") == pid:
        who = f"pid {pid} running"
        try:
            quiet = now - float(doc.get("updated_t"))
            if quiet > 3 * float(doc.get("tick_s") or 10):
                who += f", but no update for {age_text(quiet)}"
        except (TypeError, ValueError):
            pass
    elif holder:
        who = f"written by pid {pid}; the run is held by pid {holder.get('pid')}"
    else:
        who = f"pid {pid} not running: the run stopped without a final event"
    return f"{text}{ago} ({who})"
