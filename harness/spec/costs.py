"""The spec of ``routerbench costs``: what a step of each router and impl dispatches and moves,
counted on the meta device, nothing timed (docs/MEASUREMENT.md, "The byte rule")."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from routers import ROUTERS
from routers.errors import ConfigError

from .base import Labels, option

#: The byte rule's reference shape (docs/MEASUREMENT.md, "The byte rule"): d, L, tokens B·T, dtype.
REFERENCE = {"widths": (1024,), "depths": (12,), "tokens": 8192, "dtype": "bfloat16"}
#: The routers counted when none are named: the seeds suite's (docs/SWEEPS.md, "Suites").
DEFAULT_ROUTERS = ("prenorm", "block_attnres", "haares", "wav_v1")
#: The impls counted where a router offers them, when none are named.
DEFAULT_IMPLS = ("naive", "two_phase", "lean", "fused")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Counting:
    """What is counted (``[costs]``)."""

    routers: tuple[str, ...] | None = option("strs", "Routers (default: prenorm,block_attnres,haares,wav_v1; "
                                             "prenorm is always counted, the baseline of every ratio).",
                                             choices=lambda: tuple(sorted(ROUTERS)))
    impls: tuple[str, ...] | None = option("strs", "Implementations, each where a router offers it (default: "
                                           "naive,two_phase,lean,fused).")
    widths: tuple[int, ...] | None = option("ints", "d_model values (default: 1024).", min=8)
    depths: tuple[int, ...] | None = option("ints", "Transformer layers (default: 12).", min=1)
    tokens: int | None = option("int", "Tokens of the step, B·T (default: 8192).", min=1)
    dtype: str | None = option("str", "Element type (default: bfloat16).", choices=DTYPES)
    scopes: tuple[str, ...] | None = option("strs", "model (the state eager and the model scope run) and/or "
                                            "layer (the layer scope's padded pool) (default: model,layer).",
                                            choices=("model", "layer"))
    forward_only: bool | None = option("bool", "Count the forward alone (default: the forward and its backward).")
    json: bool | None = option("bool", "Print the rows as JSON lines instead of the table.")


@dataclass(frozen=True)
class CostsSpec:
    """Everything ``routerbench costs`` needs; :meth:`resolve` checks it and fills in defaults."""

    COMMAND: ClassVar[str] = "costs"
    NOT_IN_FILE: ClassVar[tuple[str, ...]] = ("costs.json",)

    costs: Counting = Counting()

    def resolve(self, L: Labels) -> "CostsSpec":
        """Check every option and fill in the defaults.

        Raises:
            ConfigError: a width not divisible by anything the routers need is left to the routers;
                here, an impl no router of the list offers.
        """
        from harness.sweep.cases import offered_impls
        c = self.costs
        routers = tuple(dict.fromkeys(("prenorm", *(c.routers or DEFAULT_ROUTERS))))
        impls = c.impls or DEFAULT_IMPLS
        if c.impls is not None:
            offered = {i for r in routers for i in offered_impls(r)}
            unknown = [i for i in impls if i not in offered]
            if unknown:
                raise ConfigError(f"{L('costs.impls')}: {', '.join(unknown)} is offered by none of "
                                  f"{', '.join(routers)}; they offer {', '.join(sorted(offered))}")
        return replace(self, costs=replace(
            c, routers=routers, impls=tuple(impls), widths=c.widths or REFERENCE["widths"],
            depths=c.depths or REFERENCE["depths"], tokens=c.tokens or REFERENCE["tokens"],
            dtype=c.dtype or REFERENCE["dtype"], scopes=c.scopes or ("model", "layer"),
            forward_only=bool(c.forward_only), json=bool(c.json)))
