"""How many CPUs other work holds now: the machine's busy CPU time over a window, less this
process tree's own (MEASUREMENT.md, "Noise on shared machines").

The 1-minute load average cannot tell other work from the tail of the command that just ended: a
command started right after another read the previous one's load for a minute and warned that the
machine was busy. This reading can: over a window that starts when the command starts
(:func:`mark`, called by the ``routerbench`` entry point) it takes the CPU seconds every task ran
(``/proc/stat``'s first ``cpu`` line: user, nice, system, irq, softirq and steal ticks) and
subtracts this process's own and its waited-for children's (:func:`os.times`), so a process
that ended before the window does not count, and one that runs beside the command does. No torch
import: the entry point marks the start before it loads anything heavy.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

#: The kernel's CPU accounting (Linux); absent elsewhere, where :func:`held_by_others` says None.
STAT_FILE = Path("/proc/stat")
#: The shortest window read: a reading over less waits for the rest (a command's start is
#: seconds before its first reading, so only an in-process call waits).
MIN_WINDOW_S = 0.2

_mark: tuple[float, float, float] | None = None


def busy_seconds(text: str | None = None) -> float | None:
    """CPU seconds every task has run since boot (``/proc/stat``'s aggregate ``cpu`` line, all
    but idle and iowait, over ``SC_CLK_TCK``), from ``text`` or :data:`STAT_FILE`; None when
    unreadable."""
    try:
        text = STAT_FILE.read_text() if text is None else text
        line = next(x for x in text.splitlines() if x.startswith("cpu "))
        ticks = [int(v) for v in line.split()[1:]]
        busy = sum(ticks[i] for i in (0, 1, 2, 5, 6, 7) if i < len(ticks))
        return busy / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def own_seconds() -> float:
    """CPU seconds of this process and of its children it has waited for (user + system)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def mark() -> None:
    """Start the window of :func:`held_by_others` now (the entry point calls it first thing)."""
    global _mark
    _mark = (time.monotonic(), busy_seconds() or 0.0, own_seconds())


def held_by_others() -> float | None:
    """CPUs held by work outside this process tree since :func:`mark` (or over a fresh window
    of :data:`MIN_WINDOW_S` when none was marked): (busy seconds − own seconds) / wall seconds,
    never below 0; None where ``/proc/stat`` cannot be read."""
    if _mark is None or busy_seconds() is None:
        if busy_seconds() is None:
            return None
        mark()
    t0, busy0, own0 = _mark
    wait = MIN_WINDOW_S - (time.monotonic() - t0)
    if wait > 0:
        time.sleep(wait)
    busy1, own1, wall = busy_seconds(), own_seconds(), time.monotonic() - t0
    return max(0.0, ((busy1 or 0.0) - busy0 - (own1 - own0)) / wall)
