"""The one test hook for faults a CPU cannot produce: ``ROUTERBENCH_FAULT``.

A CUDA out-of-memory error, a crash inside a compiled or captured graph, a hang and a full disk
cannot be produced on demand on a CPU test machine, so tests name them in an environment variable
instead of patching the code under test::

    ROUTERBENCH_FAULT="oom:haares|*;crash:wav_v1|*|two_phase|*;hang:rezero|*"

Each entry is ``KIND:GLOB``; ``GLOB`` is a shell-style pattern (:mod:`fnmatch`) over a case key
(``router|options|impl|backend|compile_mode|compile_scope|mode|workload|vocab|d_model|n_layers|
n_heads|mlp|seq_len|batch_size|dtype|grad_checkpoint|seed``, as ``routerbench status`` lists
them). Kinds:

- ``oom``: the case's set-up raises ``torch.cuda.OutOfMemoryError`` (an ``oom`` row);
- ``crash``: the process running the case dies by ``SIGSEGV`` (under ``--isolate`` the child dies
  and the case becomes an ``error`` row; without it the whole command dies, as it would);
- ``hang``: the case's set-up sleeps forever (``--isolate`` with ``--case-timeout`` ends it);
- ``device_error``: the case's set-up raises a sticky CUDA error ("an illegal memory access was
  encountered", as ``torch.AcceleratorError``), and from then on so does the set-up of every other
  case in this process, as a poisoned CUDA context fails every later call: the case becomes an
  ``error`` row and the rest of the run goes on in a new process (``--supervise``;
  :mod:`harness.step.device_errors`);
- ``disk_full``: committing the unit that holds the case writes half its bytes, then fails with
  ``ENOSPC``, exercising the roll-back of a partial unit;
- ``nan_loss``: a training run's loss is made non-finite from the first step after its first
  evaluation (``--lr`` applies to every router of a command, so divergence of one named run cannot
  be provoked otherwise); the run must end with a ``diverged`` row while the others go on;
- ``kill_after_eval=N``: a training run's process kills itself with ``SIGKILL`` right after the
  N-th evaluation after step 0 is recorded and checkpointed (the test of resume);
- ``kill_in_eval=N``: the same, but after the N-th evaluation's checkpoint is written and its rows
  are staged, before they are committed (the test of a checkpoint without its rows: resume goes
  back to the checkpoint before, and the staged rows go to ``aborted/``).
- ``kill_in_unit=N``: the process kills itself with ``SIGKILL`` when the unit of resume holding the
  case (a cost group) has staged its N-th row, before it is committed (the test of resume after a
  kill mid-group: the staged rows go to ``aborted/``, the group is measured again);
- ``kill_after_commit``: the process kills itself with ``SIGKILL`` right after the unit holding the
  case is appended to ``records.jsonl`` and before its pending file is removed (the test that a
  committed unit's leftover pending file is dropped on resume, never moved to ``aborted/``).
- ``slow=MS``: every call of the case's step first spins for MS milliseconds of wall time (a
  planted slowdown for the CI gate's tests, ``routerbench gate``: a regression that needs no code
  change); on a training run, every training step spins MS ms after its work (a run held long
  enough for a test to act on it mid-run). It spins rather than sleeps so the process stays on the CPU as real work does, and the
  noise probe (:mod:`harness.timing.noise`, CPU utilisation) does not read the delay as an idle machine.

- ``jitter=MS``: every call of the case's step first spins for MS milliseconds or not at all, at
  random: of each two calls in a row one spins, which one by a coin seeded by the case key (so any
  four steps in a row spread by MS), a planted noisy case: its step times spread, so its timing is
  flagged noisy and re-timed (MEASUREMENT.md, "Noise on shared machines"), while the other cases of
  its group are not.
- ``busy=PCT``: when the sweep asks whether the machine is still busy before it times a noisy
  case of the matched case key again, the CPU pressure reads PCT % (0–100) instead of
  ``/proc/pressure/cpu``'s avg10 (a planted load for the test that a group is left noisy, not
  re-timed, while the load lasts; ``busy=0`` plants a quiet machine); on a training run's key, the
  CPU pressure it records over its own steps (``train_cpu_pressure``) reads PCT % (the test that a
  race whose sides met different loads is flagged);
- ``checkpoint_replaced=N``: the first N times ``routerbench diagnose`` is about to read the
  run's checkpoint, it is replaced first, as a training run in progress does at its next
  evaluation: renamed to the next step's name (``step-<N+1>.pt``), so the path chosen is gone
  (the test that diagnose reads the newest checkpoint, or says in one line that the run is in
  progress when the replacements outlast its retries).

- ``lock_refused``: matched against a run directory's **path**, not a case key: opening it finds
  ``flock`` refused, as on a network file system without locks (the test of the one-line refusal
  that names ``--lock-free``).

Training runs are matched by their case key, ``train|router|options|backend|…|seed|corpus`` (or
``pilot|…`` for the pilot), e.g. ``ROUTERBENCH_FAULT="nan_loss:train|haares|*"``.

Unset, the hook costs one environment lookup per case and does nothing.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import signal
import time
from pathlib import Path
from typing import Iterable

ENV = "ROUTERBENCH_FAULT"
KINDS = ("oom", "crash", "hang", "device_error", "disk_full", "nan_loss", "kill_after_eval", "kill_in_eval", "kill_in_unit",
         "kill_after_commit", "slow", "jitter", "busy", "checkpoint_replaced", "lock_refused")


#: Kinds whose entry carries a number > 0: kind -> (what the number is, its name in messages).
NEEDS_ARG = {"slow": ("its delay", "MS"), "jitter": ("its delay", "MS"), "kill_in_unit": ("its row count", "N"),
             "checkpoint_replaced": ("its count of reads", "N")}


def parse(spec: str | None) -> list[tuple[str, str, int | None]]:
    """``[(kind, glob, argument), …]`` of a ``ROUTERBENCH_FAULT`` value (``KIND[=N]:GLOB``).

    Raises:
        ValueError: an entry without ``:``, of an unknown kind, or with a non-integer argument.
    """
    out = []
    for entry in (spec or "").split(";"):
        entry = entry.strip()
        if not entry:
            continue
        kind, sep, glob = entry.partition(":")
        kind, eq, arg = kind.partition("=")
        if not sep or kind not in KINDS or (eq and not arg.isdigit()):
            raise ValueError(f"{ENV}: entry {entry!r} must be KIND[=N]:GLOB with KIND one of {', '.join(KINDS)}")
        if kind in NEEDS_ARG and not (eq and int(arg) > 0):
            what, n = NEEDS_ARG[kind]
            raise ValueError(f"{ENV}: entry {entry!r}: {kind} needs {what}, {kind}={n}:GLOB with {n} > 0")
        if kind == "busy" and not (eq and int(arg) <= 100):
            raise ValueError(f"{ENV}: entry {entry!r}: busy needs its CPU pressure, busy=PCT:GLOB with 0 <= PCT <= 100")
        out.append((kind, glob, int(arg) if eq else None))
    return out


def fault_entry(case_key: str) -> tuple[str, int | None] | None:
    """``(kind, argument)`` of the fault injected into ``case_key``, or None (first match wins)."""
    spec = os.environ.get(ENV)
    if not spec:
        return None
    for kind, glob, arg in parse(spec):
        if fnmatch.fnmatchcase(case_key, glob):
            return kind, arg
    return None


def planted_pressure(case_key: str) -> float | None:
    """The CPU pressure (a ratio) planted for ``case_key`` by the first matching ``busy=PCT`` entry
    (beside any other fault of the case), or None."""
    for kind, glob, arg in parse(os.environ.get(ENV)):
        if kind == "busy" and fnmatch.fnmatchcase(case_key, glob):
            return arg / 100.0
    return None


def fault_for(case_key: str) -> str | None:
    """The kind of fault injected into ``case_key``, or None (the first matching entry wins)."""
    entry = fault_entry(case_key)
    return entry[0] if entry else None


#: The text of the sticky device error injected in this process (``device_error``), once raised.
_device_lost: str | None = None


def maybe_inject(case_key: str) -> None:
    """Raise, crash or hang here if ``ROUTERBENCH_FAULT`` names this case (``disk_full`` acts at
    commit time, :func:`maybe_disk_full`), or raise the sticky device error again if a
    ``device_error`` was injected earlier in this process."""
    global _device_lost
    kind = fault_for(case_key)
    if kind == "device_error" or _device_lost is not None:
        import torch
        if _device_lost is None:
            # the text and its hint lines as torch gives them; the case is named by who records it
            _device_lost = (f"CUDA error: an illegal memory access was encountered (injected by {ENV})\n"
                            "CUDA kernel errors might be asynchronously reported at some other API call, so the "
                            "stacktrace below might be incorrect.\n"
                            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1")
        raise getattr(torch, "AcceleratorError", RuntimeError)(_device_lost)  # torch >= 2.8 has it
    if kind == "oom":
        import torch
        raise torch.cuda.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate 2.00 GiB (injected by {ENV})")
    if kind == "crash":
        signal.signal(signal.SIGSEGV, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(60)  # the signal is delivered before this returns
    if kind == "hang":
        while True:
            time.sleep(3600)


def maybe_slow(case_key: str, step):
    """``step`` itself, or, when ``ROUTERBENCH_FAULT`` names this case ``slow=MS`` (``jitter=MS``),
    a step that spins for MS milliseconds (``jitter``: MS or 0 at random) and then calls it (a host-side delay,
    timed like any other work)."""
    entry = fault_entry(case_key)
    if not entry or entry[0] not in ("slow", "jitter"):
        return step
    delay = entry[1] / 1e3
    spins = iter(lambda: True, None)  # slow: every call
    if entry[0] == "jitter":
        import itertools
        import random
        import zlib
        rng = random.Random(zlib.crc32(case_key.encode()))
        spins = itertools.chain.from_iterable((c, not c) for c in iter(lambda: rng.random() < 0.5, None))

    def slowed():
        end = time.perf_counter() + delay * next(spins)
        while time.perf_counter() < end:  # spin: see the module doc
            pass
        return step()
    return slowed


def in_training_step(entry: tuple[str, int | None] | None, step: int, eval_every: int, loss):
    """What the fault ``entry`` of a training run (:func:`fault_entry` of its key) does to step
    ``step`` (0-based), after its work: ``nan_loss`` makes the loss non-finite from the first step
    after the first evaluation; ``slow=MS`` spins MS milliseconds (a run held long enough for a test
    to act on it mid-run, e.g. a scheduler's requeue). Returns the loss."""
    if entry and entry[0] == "nan_loss" and step >= eval_every:
        return loss * float("nan")
    if entry and entry[0] == "slow":
        end = time.perf_counter() + entry[1] / 1e3
        while time.perf_counter() < end:  # spin: see the module doc
            pass
    return loss


def unit_kill_point(case_keys: Iterable[str], kind: str) -> int | None:
    """For a unit of resume covering ``case_keys``: the argument of the first ``kind`` fault
    (``kill_in_unit``: the row count to die at; ``kill_after_commit``: 0) naming one of its
    cases, or None."""
    for k in case_keys:
        entry = fault_entry(k)
        if entry and entry[0] == kind:
            return entry[1] or 0
    return None


def kill_now() -> None:
    """Die here by ``SIGKILL``, as a killed process does (no handler, no clean-up)."""
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # the signal is delivered before this returns


_replaced: dict[str, int] = {}


def maybe_replace_checkpoint(case_key: str, path: Path) -> None:
    """Replace the checkpoint at ``path`` as a trainer's next evaluation would (rename it to the
    next step's name, ``…step-<N+1>.pt``) if ``ROUTERBENCH_FAULT`` names this run
    ``checkpoint_replaced=N`` and it has done so fewer than N times in this process for this
    checkpoint folder."""
    entry = fault_entry(case_key)
    folder = str(path.parent)
    if not entry or entry[0] != "checkpoint_replaced" or _replaced.get(folder, 0) >= entry[1]:
        return
    _replaced[folder] = _replaced.get(folder, 0) + 1
    head, sep, tail = path.name.rpartition("step-")
    step = int(tail.split(".")[0])
    os.replace(path, path.with_name(f"{head}{sep}{step + 1:08d}.pt"))


def maybe_disk_full(case_keys: Iterable[str], path: Path, data: bytes) -> None:
    """Write half of ``data`` to ``path`` and raise ``ENOSPC`` if a case of the unit is named
    ``disk_full`` (the caller must roll the partial write back)."""
    if not any(fault_for(k) == "disk_full" for k in case_keys):
        return
    with open(path, "ab") as fh:
        fh.write(data[: len(data) // 2])
    raise OSError(errno.ENOSPC, f"No space left on device (injected by {ENV})")
