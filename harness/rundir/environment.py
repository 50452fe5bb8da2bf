"""The environment of a run: device slug, ``manifest.json`` (DESIGN.md, "Results")."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch


def device_name(device: torch.device | str) -> str:
    """Human name of the device: the GPU's name on CUDA, else the CPU model."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def cpu_model() -> str:
    """The CPU model string from /proc/cpuinfo (Linux) or ``platform.processor()``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown-cpu"


def slugify(text: str) -> str:
    """Lower-case, alphanumerics and dashes only: ``"NVIDIA H100 80GB HBM3"`` → ``nvidia-h100-80gb-hbm3``."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def device_slug(device: torch.device | str) -> str:
    """Folder name of a device under ``results/``: ``cpu-<model>`` or ``cuda-<gpu name>``."""
    device = torch.device(device)
    return f"{device.type}-{slugify(device_name(device))}"[:80]


def git_sha(cwd: Path | None = None) -> str | None:
    """The HEAD commit of the checkout holding this package (with ``-dirty``), or None."""
    cwd = cwd or Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: torch.device | str) -> dict[str, Any]:
    """Everything a reader needs to place a number: hardware, software, precision policy."""
    device = torch.device(device)
    env: dict[str, Any] = {
        "device": str(device),
        "device_name": device_name(device),
        "device_slug": device_slug(device),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "matmul_precision": torch.get_float32_matmul_precision(),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu_memory_bytes=props.total_memory, sm_count=props.multi_processor_count,
                   capability=f"{props.major}.{props.minor}", driver=_nvidia_driver())
    # set, Triton kernels ran in Triton's CPU interpreter: their times are not kernel times
    env["triton_interpret"] = os.environ.get("TRITON_INTERPRET")
    for pkg in ("fvcore", "pandas", "seaborn", "numpy", "triton"):
        try:
            env[pkg] = __import__(pkg).__version__
        except Exception:  # optional on some machines (e.g. fvcore on a bare GPU box)
            env[pkg] = None
    return env


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        return out.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def new_run_id() -> str:
    """A sortable run id that two processes cannot share: UTC time to the second, then the pid."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def write_manifest(run_dir: Path, device: torch.device | str, extra: dict[str, Any]) -> Path:
    """Write (or extend, on resume) ``run_dir/manifest.json``.

    A resumed run keeps the first manifest and appends this invocation to its ``sessions`` list.
    """
    path = Path(run_dir) / "manifest.json"
    session = {"started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
               "argv": sys.argv, "git_sha": git_sha(), **extra}
    if path.exists():
        manifest = json.loads(path.read_text())
        manifest.setdefault("sessions", []).append(session)
    else:
        manifest = {"environment": environment(device), "git_sha": session["git_sha"],
                    "command_line": " ".join(sys.argv), "sessions": [session], **extra}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, default=str))
    tmp.replace(path)
    return path
