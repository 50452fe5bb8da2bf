"""Device errors that poison the process: after one of them, every later CUDA call of the process
fails, so the sweep records the case that raised it and the rest of the run goes on in a new
process (:mod:`harness.cli.supervise`; docs/GPU.md, "Supervision: a device error costs one case").

A sticky CUDA error (an illegal memory access, a launch failure, a device-side assert, …) leaves
the process's CUDA context unusable: freeing memory, synchronising, even emptying the cache raise
the same error again, and only a new process gets a new context. An ordinary error of a case (a
shape the router refuses, an out-of-memory error) does not, and stays one ``error`` or ``oom`` row
of a sweep that goes on in the same process.

CUDA reports errors asynchronously: the call that raises is the first one to synchronise after the
faulty kernel, which is usually the faulty step's own timing (a CUDA event wait) but may be the next
step's. ``CUDA_LAUNCH_BLOCKING=1`` makes every launch synchronous and pins the error on its step.
"""

from __future__ import annotations

import torch

#: Texts of the CUDA runtime's sticky errors (``cudaGetErrorString``), which poison the context:
#: cudaErrorIllegalAddress (700), cudaErrorLaunchTimeout (702), cudaErrorAssert (710),
#: cudaErrorHardwareStackError (714), cudaErrorIllegalInstruction (715), cudaErrorMisalignedAddress
#: (716), cudaErrorInvalidAddressSpace (717), cudaErrorInvalidPc (718), cudaErrorLaunchFailure (719),
#: cudaErrorECCUncorrectable (214), and the driver's names of the same.
STICKY_ERRORS = (
    "an illegal memory access was encountered",
    "the launch timed out and was terminated",
    "device-side assert triggered",
    "hardware stack error",
    "an illegal instruction was encountered",
    "misaligned address",
    "operation not supported on global/shared address space",
    "invalid program counter",
    "unspecified launch failure",
    "uncorrectable ecc error encountered",
    "cuda_error_illegal_address",
    "cuda_error_launch_failed",
    "cuda_error_assert",
)


#: The words that open the note :func:`harness.sweep.unit.record_lost` adds to the error row of a
#: case lost to a sticky device error (the supervisor counts those rows by them).
LOST_MARK = "[a sticky device error:"


class DeviceContextLost(RuntimeError):
    """A case raised a sticky device error: the process's CUDA context is unusable.

    Args:
        case_key: the case whose call raised it (see the module doc on asynchronous errors).
        error: the error's text, as the case's ``error`` row holds it.
    """

    def __init__(self, case_key: str, error: str) -> None:
        # a CUDA error's text runs over several lines (its hints): the message keeps the first
        first = next((ln.strip() for ln in str(error).splitlines() if ln.strip()), "")
        super().__init__(f"{first} (case {case_key}: the device context of this process is lost)")
        self.case_key, self.error = case_key, error


def poisons_context(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from or during) is a sticky device error
    (:data:`STICKY_ERRORS`), after which this process can run nothing more on its device.

    ``torch.AcceleratorError`` (torch ≥ 2.8) is raised for every CUDA error, sticky or not, so the
    text decides; ``torch.cuda.OutOfMemoryError`` never poisons.
    """
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, torch.cuda.OutOfMemoryError):
            return False
        text = str(e).lower()
        if any(s in text for s in STICKY_ERRORS):
            return True
        e = e.__cause__ or e.__context__
    return False
