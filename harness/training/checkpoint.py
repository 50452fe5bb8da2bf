"""Checkpoints of a training run (MEASUREMENT.md, "Time to target loss", step 5).

At every evaluation the state after it (weights, optimizer, every RNG state, the data generator,
the clock, the evaluations so far) is written atomically (temp file, fsync, rename, fsync of the
folder) to ``checkpoints/<run hash>/step-<step>.pt``, before the evaluation's rows are committed;
a killed run resumes from the checkpoint of its last committed evaluation. A finished run keeps
only its final weights (``final-step-<step>.pt``) for ``routerbench diagnose``. Under DDP rank 0
alone writes, with the underlying module's weights (no ``module.`` prefix), which every rank loads
on resume, whatever the world size then. ``routerbench diagnose`` reads a run's newest checkpoint
with :func:`read_checkpoint`, which looks again when a run in progress replaced it meanwhile.

The functions take a :class:`harness.training.run.TrainRun` (its ``key``, ``step``, ``clock``,
``evals``, ``model``, ``opt``, ``gen``, ``graphed`` and ``device``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.rundir.faults import maybe_replace_checkpoint
from routers.errors import ConfigError

#: The folder of a run directory that holds every run's checkpoints.
CHECKPOINT_DIR = "checkpoints"
#: Version of the checkpoint layout.
FORMAT = 1
_STEP = re.compile(r"step-(\d+)\.pt$")
#: How often a run's newest checkpoint is looked for again when the one chosen is gone before it
#: is read: a run in progress writes a new checkpoint at each evaluation and then removes the old.
CHECKPOINT_RETRIES = 3


class RunInProgress(ConfigError):
    """A run's checkpoints were replaced more than :data:`CHECKPOINT_RETRIES` times while being
    read, or all removed meanwhile: the run is in progress (its label and the retries in the message)."""


def newest_checkpoint(folder: Path) -> tuple[int, Path] | None:
    """``(N, path)`` of the checkpoint of largest step N in a run's checkpoint folder
    (``final-step-N.pt`` or ``step-N.pt``; a ``.tmp`` file being written is never read), or None."""
    found = [(int(m.group(1)), p) for p in folder.glob("*step-*.pt") if (m := _STEP.search(p.name))]
    return max(found) if found else None


def checkpoint_dir(run_dir: Path | str, key: str) -> Path:
    """Where the checkpoints of the run with case key ``key`` live: ``checkpoints/<run hash>``
    (the first 16 hex digits of the key's SHA-1)."""
    return Path(run_dir) / CHECKPOINT_DIR / hashlib.sha1(key.encode()).hexdigest()[:16]


def _write_atomically(path: Path, state: dict[str, Any]) -> Path:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def save_checkpoint(run, run_dir: Path) -> Path:
    """Write ``run``'s state after its last evaluation.

    Returns:
        the checkpoint path, ``checkpoints/<run hash>/step-<step>.pt``.
    """
    d = checkpoint_dir(run_dir, run.key)
    d.mkdir(parents=True, exist_ok=True)
    state = {"format": FORMAT, "key": run.key, "step": run.step, "clock": run.clock,
             "evals": [asdict(e) for e in run.evals], "model": run.model.state_dict(),
             "optimizer": run.opt.state_dict(), "data_rng": run.gen.get_state(),
             "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(),
             "numpy_rng": np.random.get_state(),
             "cuda_rng": torch.cuda.get_rng_state_all() if run.device.type == "cuda" else None}
    path = _write_atomically(d / f"step-{run.step:08d}.pt", state)
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def save_final_weights(run, run_dir: Path) -> Path:
    """Write the weights a finished run ended with (no optimizer or RNG state: a finished run
    never resumes).

    Returns:
        ``checkpoints/<run hash>/final-step-<step>.pt``.
    """
    d = checkpoint_dir(run_dir, run.key)
    d.mkdir(parents=True, exist_ok=True)
    return _write_atomically(d / f"final-step-{run.step:08d}.pt",
                             {"format": FORMAT, "key": run.key, "step": run.step, "final": True,
                              "model": run.model.state_dict()})


def restore(run, path: Path) -> dict[str, Any]:
    """Load the checkpoint at ``path`` into ``run`` (built and set up): weights, optimizer state
    (in place under a CUDA graph, whose capture holds the state's addresses), the data generator
    and every RNG.

    Returns:
        the checkpoint's ``step``, ``clock`` and ``evals`` (dicts of :class:`Evaluation` fields),
        which the run takes over.

    Raises:
        ConfigError: the checkpoint belongs to another run (its key differs).
    """
    state = torch.load(path, map_location="cpu", weights_only=False)  # our own file
    if state.get("key") != run.key:
        raise ConfigError(f"checkpoint {path} belongs to another run; remove it or choose another --run-id")
    with torch.no_grad():
        for k, v in run.model.state_dict().items():
            v.copy_(state["model"][k])
    if run.graphed is None:
        run.opt.load_state_dict(state["optimizer"])
    else:  # in place: the captured graph holds the addresses of the optimizer state
        saved = state["optimizer"]["state"]
        for i, st in enumerate(run.opt.state[p] for g in run.opt.param_groups for p in g["params"]):
            for name, v in st.items():
                if torch.is_tensor(v):
                    v.copy_(saved[i][name])
    run.gen.set_state(state["data_rng"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    np.random.set_state(state["numpy_rng"])
    if state.get("cuda_rng") is not None and run.device.type == "cuda":
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    return {"step": state["step"], "clock": state["clock"], "evals": state["evals"]}


def read_checkpoint(run: Any) -> tuple[Any, dict[str, Any]]:
    """The state saved in the checkpoint of ``run`` (a :class:`harness.training.diagnose.TrainedRun`:
    its ``key``, ``label`` and ``checkpoint``), or in its newest one when a run in progress
    replaced the chosen checkpoint before it was read (at most :data:`CHECKPOINT_RETRIES` times
    again; a rename is atomic, so a checkpoint found is whole).

    Returns:
        ``(run, state)``: ``run`` with the checkpoint read and its step, and the loaded dict.

    Raises:
        RunInProgress: the run's checkpoints kept being replaced, or were all removed meanwhile.
        ConfigError: the checkpoint belongs to another run.
    """
    for _ in range(CHECKPOINT_RETRIES + 1):
        maybe_replace_checkpoint(run.key, run.checkpoint)  # the test hook: a trainer's next evaluation
        try:
            state = torch.load(run.checkpoint, map_location="cpu", weights_only=False)  # our own file
        except FileNotFoundError:
            found = newest_checkpoint(run.checkpoint.parent)
            if found is None:
                raise RunInProgress(f"RUN_DIR: run {run.label} is in progress: its checkpoints were "
                                    "removed while being read (it ended or diverged); diagnose again") from None
            run = dataclasses.replace(run, step=found[0], checkpoint=found[1])
            continue
        if state.get("key") != run.key:
            raise ConfigError(f"RUN_DIR: checkpoint {run.checkpoint} belongs to another run")
        return run, state
    raise RunInProgress(f"RUN_DIR: run {run.label} is in progress: its checkpoint was replaced "
                        f"{CHECKPOINT_RETRIES + 1} times while being read; diagnose again when it ends")
