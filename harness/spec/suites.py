"""Named suites of ``routerbench run`` (``--suite``): what a run measures where its options do not
say (docs/SWEEPS.md, "Suites").

The default, ``seeds``, answers the question the multi-resolution routers were built for first:
what HAARES and WAV v1 cost against Block AttnRes and the plain residual, here, in each backend,
in a few minutes. The others are the longer sweeps a researcher names when that answer raises a
question. Every option given on the command line or in ``--config`` overrides its suite's value.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The routers of the seeds' question: the plain residual, Block AttnRes, and the two
#: multi-resolution block routers (arXiv:2603.15031, arXiv:2606.06564).
SEED_ROUTERS = ("prenorm", "block_attnres", "haares", "wav_v1")


@dataclass(frozen=True)
class Suite:
    """What one suite sets.

    Attributes:
        what: one line for ``--help`` and docs/SWEEPS.md ("Suites").
        routers: the routers, or None for every registered router.
        impls: the implementations (each router runs those it offers, naive where it offers none of
            them), or None for naive and two_phase.
        modes: the step modes.
        grid: device type (``cpu``, ``cuda``) -> widths and depths, or None for the device grid
            (:data:`workloads.config.GRIDS`).
        backends: device type -> the backends run at every shape.
        smallest: backends run only at the smallest width and depth (when ``--backends`` is not
            given; ``--smallest-backends`` overrides).
    """

    what: str
    routers: tuple[str, ...] | None
    impls: tuple[str, ...] | None
    modes: tuple[str, ...]
    grid: dict[str, dict[str, tuple[int, ...]]] | None
    backends: dict[str, tuple[str, ...]]
    smallest: tuple[str, ...]

    def grid_for(self, device_type: str) -> dict[str, tuple[int, ...]] | None:
        return None if self.grid is None else self.grid.get(device_type, self.grid["cpu"])

    def backends_for(self, device_type: str) -> tuple[str, ...]:
        return self.backends.get(device_type, self.backends["cpu"])


SUITES: dict[str, Suite] = {
    "seeds": Suite(
        "prenorm, block_attnres, haares, wav_v1 (two_phase where offered), fwd_bwd, one width and two depths "
        "(CPU: d=64 at 4 and 8 layers; CUDA: d=1024 at 4 and 12), eager (CUDA: and graph replay) at both, "
        "compiled at the smaller; the smoke race",
        SEED_ROUTERS, ("two_phase",), ("fwd_bwd",),
        {"cpu": {"d_model": (64,), "n_layers": (4, 8)}, "cuda": {"d_model": (1024,), "n_layers": (4, 12)}},
        {"cpu": ("eager",), "cuda": ("eager", "cudagraph")}, ("compile",)),
    "full": Suite(
        "every router, naive and two_phase, fwd and fwd_bwd, the device grid (CPU: d=64,128 x 4,8 layers; "
        "CUDA: d=512,1024 x 12,24), eager, compiled at the smallest shape; the smoke race",
        None, None, ("fwd", "fwd_bwd"), None, {"cpu": ("eager",)}, ("compile",)),
    "baselines": Suite(
        "prenorm and the field's other residuals (rezero, layerscale, full_attnres, block_attnres, shc, dhc, "
        "mhc, denseformer), fwd and fwd_bwd, the device grid, eager, compiled at the smallest shape; the "
        "smoke race",
        ("prenorm", "rezero", "layerscale", "full_attnres", "block_attnres", "shc", "dhc", "mhc", "denseformer"),
        None, ("fwd", "fwd_bwd"), None, {"cpu": ("eager",)}, ("compile",)),
}
DEFAULT_SUITE = "seeds"

__all__ = ["DEFAULT_SUITE", "SEED_ROUTERS", "SUITES", "Suite"]
