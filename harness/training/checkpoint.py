"""Checkpoints of a training run (MEASUREMENT.md, "Time to target loss", step 5).

At every evaluation the state after it (weights, optimizer, every RNG state, the data generator,
the clock, the evaluations so far) is written atomically (temp file, fsync, rename, fsync of the
folder) to ``checkpoints/<run hash>/step-<step>.pt``, before the evaluation's rows are committed;
a killed run resumes from the checkpoint of its last committed evaluation. A finished run keeps
only its final weights (``final-step-<step>.pt``) for ``routerbench diagnose``. Under DDP rank 0
alone writes, with the underlying module's weights (no ``module.`` prefix), which every rank loads
on resume, whatever the world size then.

The functions take a :class:`harness.training.run.TrainRun` (its ``key``, ``step``, ``clock``,
``evals``, ``model``, ``opt``, ``gen``, ``graphed`` and ``device``).
"""

from __future__ import annotations

import hashlib
import os
import random
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from routers.errors import ConfigError

#: The folder of a run directory that holds every run's checkpoints.
CHECKPOINT_DIR = "checkpoints"
#: Version of the checkpoint layout.
FORMAT = 1


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
