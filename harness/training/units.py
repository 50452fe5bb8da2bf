"""The depth study as units (``routerbench study depth --unit/--units/--launcher``).

A **unit** is one seed at one depth with every router of the study: the routers of a unit are
paired by seed (shared weights and data order come from the seed), so pairing never crosses units
and units can run anywhere, in any order, in parallel. Unit ``i`` of a study with seeds
``S`` and depths ``D`` is ``(S[i // len(D)], D[i % len(D)])``: seeds outermost, then depths, the
order the one-process study trains them in.

Layout of a study root ``ROOT`` (``--out ROOT --run-id STUDY``)::

    ROOT/study.toml                    the study's spec (``--config`` of every unit)
    ROOT/study.json                    the study id and its units (index, depth, seed, run id)
    ROOT/<device-slug>/STUDY-L{depth}-s{seed}/   one run directory per unit, written by its process
        unit.log                       every attempt's output, each begun by an ``attempt`` line

A unit's directory is an ordinary run directory (``spec.toml`` equal to ``study.toml``, records,
checkpoints, ``manifest.json`` with a ``unit`` entry), so it resumes after a kill from its last
committed evaluation like any run. Units on different GPU models land under their own slugs.

A unit's state (:func:`unit_state`) comes from its directory alone: **done** (every router's
final rows committed), **running** (its lock is held), **failed** (attempts made, not done, not
running), **not started**.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from harness.rundir.records import completed_cases, lock_holder

STUDY_SPEC = "study.toml"
STUDY_INDEX = "study.json"
UNIT_LOG = "unit.log"
#: The first line of each attempt in ``unit.log``.
ATTEMPT_MARK = "=== routerbench unit attempt"
#: A unit that failed this many times is left out of the command that runs what is missing,
#: unless ``--retry-failed``.
MAX_ATTEMPTS = 2


@dataclass(frozen=True)
class Unit:
    """One unit: its index in the study, its depth (layers) and seed, and its run id."""

    index: int
    depth: int
    seed: int
    run_id: str

    def label(self) -> str:
        """``unit 3 (L8, seed 1)``."""
        return f"unit {self.index} (L{self.depth}, seed {self.seed})"


def unit_run_id(study_id: str, depth: int, seed: int) -> str:
    """``STUDY-L{depth}-s{seed}``."""
    return f"{study_id}-L{depth}-s{seed}"


def study_units(seeds: tuple[int, ...] | list[int], depths: tuple[int, ...] | list[int],
                study_id: str) -> list[Unit]:
    """Every unit of a study, seeds outermost, then depths (see the module doc)."""
    return [Unit(i, d, s, unit_run_id(study_id, d, s))
            for i, (s, d) in enumerate((s, d) for s in seeds for d in depths)]


def default_threads(workers: int = 1) -> int:
    """This machine's CPUs for one of ``workers`` processes: ``OMP_NUM_THREADS`` when set, else the
    CPUs this process may run on (a SLURM task's allocation included), divided among the workers;
    at least 1."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return max(1, int(env) // max(1, workers))
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, cpus // max(1, workers))


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the body with ``n`` intra-op threads in torch and ``OMP_NUM_THREADS``/``MKL_NUM_THREADS``
    set to ``n`` (for any process it starts); both restored after."""
    import torch
    old_torch = torch.get_num_threads()
    old_env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    torch.set_num_threads(n)
    os.environ.update({k: str(n) for k in old_env})
    try:
        yield
    finally:
        torch.set_num_threads(old_torch)
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _Tee:
    """A text stream that writes to ``stream`` and appends to ``log`` (flushed per write, so a
    killed process leaves its last line in the log)."""

    def __init__(self, stream, log) -> None:
        self._stream, self._log = stream, log

    def write(self, text: str) -> int:
        self._log.write(text)
        self._log.flush()
        return self._stream.write(text)

    def flush(self) -> None:
        self._log.flush()
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def unit_log(run_dir: Path, unit: Unit, threads: int) -> Iterator[Path]:
    """Append this attempt's stdout and stderr to ``run_dir/unit.log`` (beside the terminal),
    begun by an :data:`ATTEMPT_MARK` line naming the pid, host, time and thread count."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / UNIT_LOG
    n = attempts(run_dir)[0] + 1
    with open(path, "a", encoding="utf-8") as log:
        log.write(f"{ATTEMPT_MARK} {n} of unit {unit.index} (L{unit.depth}, seed {unit.seed}): pid {os.getpid()} on "
                  f"{socket.gethostname()} at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, "
                  f"{threads} thread{'s' * (threads != 1)}\n")
        log.flush()
        out, err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(out, log), _Tee(err, log)
        try:
            yield path
        except SystemExit:
            raise
        except BaseException as exc:  # the line the command's caller prints, kept in the log too
            log.write(f"routerbench: error: {exc}\n" if type(exc).__name__ == "ConfigError"
                      else f"{type(exc).__name__}: {exc}\n")
            raise
        finally:
            sys.stdout, sys.stderr = out, err


def attempts(run_dir: Path) -> tuple[int, str]:
    """``(attempts made, the last non-blank line of unit.log)`` of a unit directory."""
    path = Path(run_dir) / UNIT_LOG
    if not path.exists():
        return 0, ""
    n, last = 0, ""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if line.startswith(ATTEMPT_MARK):
                n += 1
            if line.strip():
                last = line.strip()
    return n, last


def unit_state(run_dir: Path | None, n_routers: int) -> dict[str, Any]:
    """What a unit's directory says of it: ``state`` (``done``, ``running``, ``failed``, ``not
    started``), ``attempts``, ``last_line`` (of ``unit.log``), ``holder`` (the lock's pid, host,
    start, when running), ``done_runs`` (routers with their final rows committed)."""
    if run_dir is None or not Path(run_dir).is_dir():
        return {"state": "not started", "attempts": 0, "last_line": "", "holder": None, "done_runs": 0}
    n, last = attempts(run_dir)
    done = sum(1 for k in completed_cases(run_dir) if k.startswith("study|"))
    holder = lock_holder(run_dir)
    if holder:
        state = "running"
    elif done >= n_routers:
        state = "done"
    elif n or done:
        state = "failed"
    else:
        state = "not started"
    return {"state": state, "attempts": n, "last_line": last, "holder": holder, "done_runs": done}


def write_index(root: Path, study_id: str, units: list[Unit], flags: list[str] | None = None) -> Path:
    """Write ``ROOT/study.json`` atomically: the study id, its units and ``unit_flags`` (options
    every unit's command carries that no file holds, e.g. ``--lock-free``)."""
    path = Path(root) / STUDY_INDEX
    tmp = path.with_suffix(f".json.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"study_id": study_id, "command": "study depth", "spec": STUDY_SPEC,
                               "unit_flags": list(flags or []), "units": [u.__dict__ for u in units]}, indent=2))
    tmp.replace(path)
    return path


def read_index(root: Path) -> dict[str, Any] | None:
    """``ROOT/study.json`` as written by :func:`write_index`, its units as :class:`Unit`; None when
    ``root`` is no study root."""
    path = Path(root) / STUDY_INDEX
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        data["units"] = [Unit(**u) for u in data["units"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return data


def unit_dirs(root: Path, unit: Unit) -> list[Path]:
    """The directories of ``unit`` under a study root, one per device slug it ran on."""
    return sorted(p for p in Path(root).glob(f"*/{unit.run_id}") if p.is_dir())
