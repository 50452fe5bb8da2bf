"""What a conformance check returns: one :class:`Finding` per thing it looked at."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    """One result of a conformance check.

    Attributes:
        check: the check's name (:data:`harness.conformance.run.CHECKS`), e.g. ``reference``.
        passed: True when nothing is wrong (an information line is always True).
        line: for a failure, one line saying what is wrong, where (``file:line`` where known) and
            what to change; for a pass, a short note (may be empty).
        figure: what was measured, as text (``max rel err 3.1e-15``, ``0 breaks``).
        info: an information line (never a failure): e.g. which cost models are declared.
    """

    check: str
    passed: bool
    line: str = ""
    figure: str = ""
    info: bool = False


def rel_err(got, want) -> float:
    """‖got − want‖ / ‖want‖ over the whole tensor, float64 (0 when both are 0; inf when
    ``want`` is 0 and ``got`` is not; NaN when either has a NaN)."""
    import torch
    a, b = got.detach().double(), want.detach().double()
    if a.shape != b.shape:
        return float("inf")
    num = torch.linalg.vector_norm(a - b)
    den = torch.linalg.vector_norm(b)
    if float(den) == 0.0:
        return 0.0 if float(num) == 0.0 else float("inf")
    return float(num / den)
