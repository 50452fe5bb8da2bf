"""The cost models and measured costs of every router × impl, held to the values they had when
they were recorded: a change of how a router is written must not move what it costs. They were
first recorded before the routers were rewritten in one form (issue 39).

Per router × impl (ours, default options) at two shapes: analytic forward FLOP, live router state
(float32 and bfloat16), ideal I/O per token and sublayer, measured traffic per token and sublayer,
the saved activations of one decoder forward, and the layer scope's region count at 4 and 8
layers. Compared with ``tests/golden/router_costs.json``. One figure moved, on purpose: the
measured traffic of ``dhc`` and ``mhc`` (48.75 → 48.41 and 139.10 → 139.07 units of d at the
first shape), whose eager read and write each built the next sublayer's parameters (a
``torch.cat``) before the one form; a slot's params are now made once, for both.

A new router (or impl) records its own entry, leaving every other as it is::

    .venv/bin/python tests/test_router_costs.py --add

Rewrite them all only after a change that is meant to move a cost, and read the diff::

    .venv/bin/python tests/test_router_costs.py > tests/golden/router_costs.json
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from harness.costs.memory import model_tensors, saved_activation_bytes
from harness.costs.traffic import router_bytes_moved
from routers import ROUTERS, build_router
from workloads.config import DecoderConfig
from workloads.decoder import Decoder, region_count

GOLDEN = Path(__file__).with_name("golden") / "router_costs.json"
#: (d, L, T, B): two shapes, the second with more blocks than the first.
SHAPES = ((32, 4, 16, 2), (48, 8, 8, 3))


def cases() -> list[tuple[str, str]]:
    return [(name, impl) for name in sorted(ROUTERS) for impl in ROUTERS[name].impls]


def opts(name: str, impl: str) -> dict:
    """The options that select ``impl`` (a router with one impl takes no ``impl`` option)."""
    takes = len(ROUTERS[name].impls) > 1 or "impl" in ROUTERS[name].__init__.__code__.co_varnames
    return {"impl": impl} if takes else {}


def costs(name: str, impl: str) -> dict:
    """Every figure compared, keyed by ``d,L,T,B``."""
    out, o = {}, opts(name, impl)
    for d, L, T, B in SHAPES:
        r = build_router(name, d, L, **o)
        cfg = DecoderConfig(d_model=d, n_layers=L, n_heads=2, seq_len=T, batch_size=B)
        torch.manual_seed(0)
        model = Decoder(cfg, build_router(name, d, L, **o))
        idx = torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
        out[f"{d},{L},{T},{B}"] = {
            "analytic_fwd_flops": r.analytic_fwd_flops(B, T),
            "live_state_fp32": r.live_state_bytes(B, T, torch.float32),
            "live_state_bf16": r.live_state_bytes(B, T, torch.bfloat16),
            "ideal_io": r.ideal_io_per_token(),
            "io_measured": round(router_bytes_moved(r, B, T), 9),
            "saved_activation": saved_activation_bytes(lambda: model(idx), exclude=model_tensors(model)),
        }
    out["regions"] = {str(L): region_count(build_router(name, 32, L, **o)) for L in (4, 8)}
    return out


@pytest.mark.parametrize("name,impl", cases())
def test_costs_equal_the_values_before_the_one_form(name: str, impl: str) -> None:
    golden = json.loads(GOLDEN.read_text())
    key = f"{name}/{impl}"
    assert key in golden, (f"{key} has no recorded costs: record them with "
                           "`.venv/bin/python tests/test_router_costs.py --add` (the others stay as they are)")
    assert costs(name, impl) == golden[key]


def test_the_snapshot_covers_every_router_and_impl() -> None:
    golden = json.loads(GOLDEN.read_text())
    assert sorted(golden) == sorted(f"{n}/{i}" for n, i in cases()), \
        "a router or impl was added or removed: `.venv/bin/python tests/test_router_costs.py --add` (module doc)"


if __name__ == "__main__":
    import sys
    if sys.argv[1:] == ["--add"]:  # record the missing entries, drop the removed ones, keep the rest
        old = json.loads(GOLDEN.read_text())
        new = {f"{n}/{i}": old.get(f"{n}/{i}") or costs(n, i) for n, i in cases()}
        GOLDEN.write_text(json.dumps(new, indent=1, sort_keys=True) + "\n")
        print(f"{GOLDEN}: added {sorted(set(new) - set(old))}, dropped {sorted(set(old) - set(new))}")
    else:
        print(json.dumps({f"{n}/{i}": costs(n, i) for n, i in cases()}, indent=1, sort_keys=True))
