"""The rules file of ``routerbench gate`` (``[[rule]]`` tables in TOML; the project's own are
``.ci/gate.toml``): which ratio (:data:`METRICS`), for which routers, modes and backends, may exceed
1 by at most ``max_pct`` percent. The verdicts are :mod:`harness.ci.gate`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from harness.spec.base import tomllib
from harness.step.backends import BACKENDS
from harness.step.modes import MODES
from routers import BASELINE, ROUTERS
from routers.errors import ConfigError

METRICS = ("compile_vs_eager", "cudagraph_vs_eager", "overhead_vs_prenorm", "overhead_growth")


RULE_KEYS = ("name", "metric", "max_pct", "routers", "modes", "backends")


@dataclass(frozen=True)
class Rule:
    """One ``[[rule]]`` of the rules file; ``None`` filters mean every value present."""

    name: str
    metric: str
    max_pct: float
    routers: tuple[str, ...] | None = None
    modes: tuple[str, ...] | None = None
    backends: tuple[str, ...] | None = None

    @property
    def limit(self) -> float:
        return 1.0 + self.max_pct / 100.0


def _names(v, where: str, known) -> tuple[str, ...]:
    if isinstance(v, str) or not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
        raise ConfigError(f"{where}: must be a non-empty list of names, e.g. [\"{list(known)[0]}\"], "
                          f"got {v!r}")
    for x in v:
        if x not in known:
            raise ConfigError(f"{where}: unknown name {x!r} (known: {', '.join(known)})")
    return tuple(v)


def load_rules(path: str | Path) -> list[Rule]:
    """The rules of a TOML rules file, every field checked before any result is read.

    Args:
        path: the file (``--rules``): one ``[[rule]]`` table per rule with ``metric`` (one of
            :data:`METRICS`), ``max_pct`` (a finite number >= 0) and optionally ``name``
            (default: the metric), ``routers`` (``routers.ROUTERS``), ``modes``
            (``harness.step.modes.MODES``) and ``backends`` (``harness.step.backends.BACKENDS``; for the
            overhead metrics, the backend both sides ran; the vs-eager metrics take none).

    Returns:
        The rules in file order.

    Raises:
        ConfigError: one line naming the file and the field, rules counted from 1
            (``rules.toml: rule[2].metric: unknown metric 'foo' (known: …)``): an unreadable or
            non-TOML file, no ``[[rule]]``, an unknown key, metric, router, mode or backend, a bad
            ``max_pct``, a rule of prenorm alone against prenorm, backends on a vs-eager metric.
    """

    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the rules file ({exc.strerror or exc}); give --rules "
                          "a TOML file of [[rule]] tables") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    extra = sorted(set(data) - {"rule"})
    if extra:
        raise ConfigError(f"{path}: {extra[0]}: unknown top-level key (known: rule, as [[rule]] tables)")
    tables = data.get("rule")
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{path}: no [[rule]] table; each rule needs metric and max_pct")
    rules = []
    for i, t in enumerate(tables, 1):
        where = f"{path}: rule[{i}]"
        for key in t:
            if key not in RULE_KEYS:
                raise ConfigError(f"{where}.{key}: unknown key (known: {', '.join(RULE_KEYS)})")
        metric = t.get("metric")
        if metric not in METRICS:
            got = "missing" if metric is None else f"unknown metric {metric!r}"
            raise ConfigError(f"{where}.metric: {got} (known: {', '.join(METRICS)})")
        pct = t.get("max_pct")
        if isinstance(pct, bool) or not isinstance(pct, (int, float)) or not (math.isfinite(pct) and pct >= 0):
            raise ConfigError(f"{where}.max_pct: {'missing' if pct is None else repr(pct)}; give a finite "
                              "number >= 0, the % a ratio may exceed 1 by")
        name = t.get("name", metric)
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{where}.name: must be a non-empty string, got {name!r}")
        routers = _names(t["routers"], f"{where}.routers", ROUTERS) if "routers" in t else None
        if metric.startswith("overhead") and routers == (BASELINE,):
            raise ConfigError(f"{where}.routers: {BASELINE} is the reference of {metric}; name other routers")
        modes = _names(t["modes"], f"{where}.modes", MODES) if "modes" in t else None
        backends = None
        if "backends" in t:
            if metric.endswith("_vs_eager"):
                raise ConfigError(f"{where}.backends: {metric} takes no backends (its sides are "
                                  f"{metric.split('_vs_')[0]} and eager)")
            backends = _names(t["backends"], f"{where}.backends", BACKENDS)
        if any(r.name == name.strip() for r in rules):
            raise ConfigError(f"{where}.name: {name.strip()!r} names an earlier rule too; give each rule "
                              "its own name (the verdicts are reported by name)")
        rules.append(Rule(name.strip(), metric, float(pct), routers, modes, backends))
    return rules
