"""``python -m harness.cli.study_budget``: the sizing step of ``scripts/gpu_study.sh BUDGET``.

``--check`` checks the budget and prints its whole seconds (or one line and exit 2) without
importing torch. Otherwise it prints the plan of the depth study sized to the budget
(:func:`harness.spec.study_budget.size_study`), writes the ``study depth`` arguments it chose, one
a line (``--args-file``), and the plan as JSON (``--plan-json``). ``--probe`` first runs the
study's own timed estimate (:func:`harness.training.study.estimate_cost`) of every router at every
depth on this machine's GPU, on the graphed step; without it the plan uses the H100-class
assumptions and says so. ``--versions`` prints python, torch, triton, CUDA and the device first.
Not a ``routerbench`` command: the script's helper.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import sys
import time
from pathlib import Path

import click

from routers.errors import ConfigError

_UNITS = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}
#: The least budget taken at all: the probe, the study's start-up and set-up, its report and the
#: archive alone take about this long (a budget above it may still buy too few steps: the plan says).
MIN_BUDGET_S = 120


def parse_budget(text: str, label: str = "BUDGET") -> float:
    """Seconds of ``"360"``, ``"360s"``, ``"6m"``, ``"6min"``, ``"1.5h"`` or ``"1h30m"``.

    Raises:
        ConfigError: anything else, or a budget that is not positive (naming ``label``).
    """
    t = str(text).strip().lower().replace(" ", "")
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|min|m|sec|s|)", t)
    if not t or not parts or "".join(n + u for n, u in parts) != t or (len(parts) > 1 and
                                                                     any(u == "" for _, u in parts)):
        raise ConfigError(f"{label} {text!r}: give seconds or a duration with a unit, e.g. 360, 6m, 1.5h, 1h30m")
    seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not (seconds >= 1 and math.isfinite(seconds)):
        raise ConfigError(f"{label} {text!r}: the budget must be at least 1 second")
    return seconds


def versions() -> str:
    """``python 3.x | torch … | triton … | CUDA … | device …`` (triton and the device as absent
    where they are)."""
    import platform

    import torch
    try:
        import triton
        tv = triton.__version__
    except Exception as exc:  # noqa: BLE001 - any failure to import says the same
        tv = f"not importable ({type(exc).__name__})"
    dev = (f"{torch.cuda.get_device_name(0)} ({torch.cuda.device_count()} visible)" if torch.cuda.is_available()
           else "none (no CUDA device visible)")
    return (f"python {platform.python_version()} | torch {torch.__version__} | triton {tv} | CUDA "
            f"{torch.version.cuda} | device {dev}")


def probe(data: str | None = None, precision: str | None = None, scale: str = "char", backend: str | None = None,
          depths=None, routers=None, steps: int | None = None, device: str = "cuda", echo=click.echo):
    """Time every router at every depth with the study's own estimate (a run set up, its capture
    included; one evaluation; ``steps`` steps one by one, their median): a list of
    :class:`harness.spec.study_budget.Case` (the defaults: the script's study)."""
    import torch

    from harness.costs.estimate import decoder_parameter_count
    from harness.spec import study_budget as sb
    from harness.spec.base import load
    from harness.spec.study import StudySpec
    from harness.training.config import train_options
    from harness.training.study import estimate_cost

    from .train import load_corpus
    depths, routers = tuple(depths or sb.DEPTHS), tuple(routers or sb.ALL)
    cli = {"scale": scale, "routers": ",".join(routers), "depths": ",".join(map(str, depths)), "seeds": "1",
           "backend": backend or sb.BACKEND, "precision": precision or sb.PRECISION, "device": device,
           "estimate_steps": str(steps or sb.PROBE_STEPS), "data": data,
           "router_options": json.dumps({r: {"impl": sb.IMPL} for r in routers})}
    spec, labels = load(StudySpec, {k: v for k, v in cli.items() if v is not None}, None)
    spec = spec.resolve(labels)
    corpus = load_corpus(spec.study.data, labels("study.data"))
    dev = torch.device(spec.output.device)
    echo(f"probe: timing {spec.study.estimate_steps} steps of {len(routers)} routers at depths "
         f"{', '.join(map(str, depths))} (backend {spec.study.backend}, {spec.study.precision}) ...")
    est = estimate_cost(spec, corpus, dev, {(d, r): 1 for d in depths for r in routers}, echo=echo)
    cases = []
    for c in est["cases"]:
        cfg = spec.decoder_config(c["depth"]).replace(vocab_size=corpus.vocab_size)
        opts = train_options(c["router"], spec.options_at(c["depth"])[c["router"]])
        cases.append(sb.Case(c["depth"], c["router"], c["step_s"], c["setup_s"], c["eval_s"],
                             decoder_parameter_count(cfg, c["router"], opts)))
    return cases


@click.command()
@click.option("--budget", required=True, help="Seconds, or a duration with a unit: 360, 6m, 1.5h, 1h30m.")
@click.option("--check", is_flag=True, help="Only check the budget: print its whole seconds.")
@click.option("--versions", "show_versions", is_flag=True, help="Print python, torch, triton, CUDA, device first.")
@click.option("--probe", "do_probe", is_flag=True, help="Time the steps on this machine's GPU first.")
@click.option("--data", default=None, help="Corpus dir (default: the embedded one).")
@click.option("--seeds", type=int, default=None, help="Seeds (default: 5).")
@click.option("--precision", default=None, help="bf16-mixed (default) or fp32.")
@click.option("--started-at", type=float, default=None, help="Unix time the session began (what was spent).")
@click.option("--args-file", default=None, help="Write the study depth arguments here, one a line.")
@click.option("--plan-json", default=None, help="Write the plan here as JSON.")
def main(budget, check, show_versions, do_probe, data, seeds, precision, started_at, args_file, plan_json) -> None:
    """The sizing step of scripts/gpu_study.sh (see the module docstring)."""
    budget_s = parse_budget(budget)
    if budget_s < MIN_BUDGET_S:
        raise ConfigError(f"BUDGET {budget!r} is {budget_s:g} s, less than the {MIN_BUDGET_S} s that the probe, "
                          "set-up, report and archive alone take; give at least 2m")
    if check:
        click.echo(f"{math.ceil(budget_s)}")
        return
    if precision not in (None, "bf16-mixed", "fp32"):
        raise ConfigError(f"--precision {precision!r}: one of bf16-mixed, fp32")
    if seeds is not None and seeds < 2:
        raise ConfigError(f"--seeds {seeds}: a paired interval needs at least 2 seeds")
    if show_versions:
        click.echo(f"gpu_study: {versions()}")
    from harness.spec import study_budget as sb
    precision, seeds = precision or sb.PRECISION, seeds or sb.SEEDS
    if do_probe:
        cases = probe(data, precision)
        spent = time.time() - started_at if started_at else sb.probe_seconds(cases)
        plan = sb.size_study(budget_s, cases, spent, "spent so far (set-up and probe)", seeds, True, precision)
    else:
        cases = sb.assumed_cases(precision=precision)
        plan = sb.size_study(budget_s, cases, sb.probe_seconds(cases), "probe (assumed)", seeds, False, precision)
    for line in plan.lines():
        click.echo(line)
    args = plan.args() + (["--data", data] if data else [])
    click.echo("study: routerbench study depth " + shlex.join(args))
    if args_file:
        Path(args_file).write_text("".join(a + "\n" for a in args), encoding="utf-8")
    if plan_json:
        Path(plan_json).write_text(json.dumps({
            "budget_s": plan.budget_s, "spent_s": plan.spent_s, "measured": plan.measured,
            "assumption": None if plan.measured else sb.ASSUMPTION, "routers": list(plan.routers),
            "depths": list(plan.depths), "seeds": plan.seeds, "max_steps": plan.steps,
            "eval_every": sb.eval_every(plan.steps), "warmup_steps": sb.warmup(plan.steps),
            "three_router_steps": plan.three_router_steps, "parts_s": plan.parts, "estimate_s": plan.total_s,
            "full_study_s": plan.full_s, "buys": plan.buys(), "study_args": args,
            "cases": [vars(c) for c in cases], "summary": plan.lines()}, indent=2), encoding="utf-8")


def run(argv: list[str] | None = None) -> None:
    """One line ``gpu_study: error: …`` and exit 2 on a bad budget or option."""
    try:
        main.main(argv, standalone_mode=False)
    except ConfigError as exc:
        click.echo(f"gpu_study: error: {exc}", err=True)
        sys.exit(2)
    except click.UsageError as exc:
        click.echo(f"gpu_study: error: {exc.format_message()}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    run()
