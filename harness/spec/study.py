"""The spec of ``routerbench study depth``: the papers' depth study, routers × depths × seeds.

Depth must not be confounded with the block layout of the block routers (``block_attnres``,
``haares``, ``wav_v1``): either the block **count** is held fixed across depths (``--blocks N``,
default 4, which divides 12, 24 and 48) or the block **length** (``--block-length L``: L whole
layers, i.e. 2L sublayers, per block; ``n_blocks`` = depth / L). The blocks are runs of whole
layers (``block_unit="layer"``, the AttnRes paper's rule), so the setting must divide every depth:
a remainder would give the last block another length at one depth than at the others.

Two scales: ``char`` (default) takes the shape and training settings of the ``char-*`` presets
(``workloads.config.TRAINING_PRESETS``: d=512, T=256, B=32, 5,000 steps, 3 seeds; the same at
every depth); ``tiny`` takes ``cpu-quick``'s (d=64, T=64, B=8, 200 steps, one seed, depths 4, 8,
16), a plumbing smoke test that is labelled so in every output, never evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from harness.step.backends import COMPILE_SCOPES, DEFAULT_COMPILE_SCOPE, compiles, of
from harness.training.config import PRECISIONS, TRAIN_BACKENDS, default_eval_every
from harness.training.schedule import SCHEDULES
from routers import check_router_options
from routers import router_options as _router_options
from routers.errors import ConfigError
from workloads.config import NOT_IN_OUR_SOURCES, PRESETS, TRAINING_PRESETS, DecoderConfig

from .base import Labels, given, option
from .parts import (MAX_DEPTH, NOT_IN_FILE, Output, RouterSet, absolute, check_output, check_router_set,
                    resolve_device)

DEFAULT_ROUTERS = ("prenorm", "rezero", "layerscale", "block_attnres", "haares", "wav_v1", "mhc")
DEFAULT_BLOCKS = 4
SCALES = ("char", "tiny")
#: Said wherever a tiny study's numbers appear (terminal, table caption, report).
TINY_LABEL = "plumbing smoke test, not evidence"
#: Per scale: default depths, the training preset of each depth (else ``base``), eval cadence.
SCALE_DEFAULTS = {
    "char": {"depths": (12, 24, 48), "base": "char-12L"},
    "tiny": {"depths": (4, 8, 16), "base": "cpu-quick"},
}
#: Below this fraction of the full step budget a study is called a smoke test, above it a
#: shortened study (:func:`budget_words`).
SMOKE_FRACTION = 0.2
#: Router options the study sets itself (the layout held fixed across depths).
LAYOUT_OPTIONS = ("n_blocks", "block_unit")


def takes_blocks(router: str) -> bool:
    """Whether ``router`` has a block layout (an ``n_blocks`` option)."""
    return "n_blocks" in _router_options(router)


@dataclass(frozen=True)
class Study:
    """The depth study (``[study]``)."""

    data: str | None = option("str", "Corpus dir (`routerbench data prepare`); default: the embedded "
                              "stdlib corpus.", metavar="DIR", path=True)
    scale: str | None = option("str", "char (default): the char-* presets' shape and training settings; "
                               f"tiny: d=64, T=64, B=8, 200 steps, one seed, depths 4,8,16 ({TINY_LABEL}).",
                               choices=SCALES)
    depths: tuple[int, ...] | None = option("ints", "Comma-separated depths in layers (default: 12,24,48; "
                                            "tiny: 4,8,16).", min=1, max=MAX_DEPTH)
    seeds: int | None = option("int", "Seeds 0..N-1; every router trains once per seed and depth, paired "
                               "by seed (default: 3; tiny: 1).", min=1)
    seed_list: tuple[int, ...] | None = option("ints", "Instead of --seeds: the seeds themselves, e.g. 0,3,7 "
                                               "(each once, ≥ 0).", min=0, metavar="S,S")
    blocks: int | None = option("int", "Block count of the block routers, held fixed across depths; must "
                                f"divide every depth (default: {DEFAULT_BLOCKS}).", min=1)
    block_length: int | None = option("int", "Instead of --blocks: layers per block (2L sublayers), held "
                                      "fixed across depths; n_blocks = depth / L.", min=1, metavar="L")
    max_steps: int | None = option("int", "Step budget of every run (default: the scale's preset: 5000; "
                                   "tiny: 200).", min=1)
    eval_every: int | None = option("int", "Evaluation cadence in steps, also the resume granularity "
                                    "(default: 2.5 % of the budget; tiny: a quarter of it).", min=1)
    lr: float | None = option("float", "Peak learning rate (default: the scale's preset).", min=0, min_open=True)
    warmup_steps: int | None = option("int", "Linear LR warm-up steps (default: the scale's preset).", min=0)
    precision: str | None = option("str", "fp32 (default) or bf16-mixed.", choices=PRECISIONS)
    backend: str | None = option("str", "eager (default), compile, or cudagraph: every run's training step, "
                                 "as `train --backend` (cudagraph: forward, backward, clip and AdamW "
                                 "captured in one CUDA graph; CUDA only, refused elsewhere).",
                                 choices=TRAIN_BACKENDS)
    compile_scope: str | None = option("str", "With --backend compile: layer (one region per sublayer role) "
                                       f"or model (the whole forward; default: {DEFAULT_COMPILE_SCOPE}).",
                                       choices=COMPILE_SCOPES)
    schedule: str | None = option("str", "How the routers of one depth and seed advance: interleaved, "
                                  "sequential or auto (default).", choices=SCHEDULES)
    estimate_steps: int | None = option("int", "Steps timed per router and depth for the cost estimate "
                                        "printed before training (default: 3, after 3 untimed).", min=1)


#: How a study is cut into units and run (``[launch]``): none of it changes a result, so none of it
#: is written to ``spec.toml`` and a unit resumes under any of it (harness/training/units.py).
LAUNCHERS = ("local", "slurm")
UNITS_FORMATS = ("json", "commands")


@dataclass(frozen=True)
class Launch:
    """The study as units (``[launch]``): one seed at one depth with every router of the study."""

    unit: tuple[int, ...] | None = option("ints", "Run only these units (indices of --units; seeds outermost, "
                                          "then depths), each in its own run directory "
                                          "<out>/<device>/<run-id>-L<depth>-s<seed>; needs --run-id.",
                                          min=0, metavar="INDEX")
    units: str | None = option("str", "Print every unit (json or commands: its exact command, its directory, "
                               "its share of the estimate) and exit, after writing <out>/study.toml and "
                               "study.json, which those commands read.", choices=UNITS_FORMATS)
    launcher: str | None = option("str", "local: run the units in parallel worker processes on this machine "
                                  "(one per visible GPU, or --workers CPU workers).", choices=LAUNCHERS)
    workers: int | None = option("int", "Worker processes of --launcher local (default: the visible GPUs, else "
                                 "2); implies --launcher local.", min=1)
    threads: int | None = option("int", "CPU threads of each unit (torch and OMP; default: this machine's CPUs, "
                                 "shared among --workers); recorded in the manifest.", min=1)
    lock_free: bool | None = option("bool", "Do not flock the run directory (a file system that refuses "
                                    "flock): rely on one writer per unit, as the launchers keep it.")
    submit: bool | None = option("bool", "With --launcher slurm: submit ROOT/study.sbatch after `sbatch "
                                 "--test-only` accepts it (default); --no-submit only writes and checks it.")
    wait: bool | None = option("bool", "With --launcher slurm: wait for the array to end, then write the "
                               "merged study report (default: return once submitted).")
    slurm_partition: str | None = option("str", "sbatch --partition (default: the cluster's).", metavar="NAME")
    slurm_gpus_per_task: int | None = option("int", "sbatch --gpus-per-task (default: none; 1 with --device "
                                             "cuda).", min=0)
    slurm_cpus_per_task: int | None = option("int", "sbatch --cpus-per-task (default: --threads, else 1); "
                                             "every task's --threads.", min=1)
    slurm_time: str | None = option("str", "sbatch --time per unit, e.g. 2:00:00 (default: the partition's).",
                                    metavar="TIME")
    slurm_account: str | None = option("str", "sbatch --account.", metavar="NAME")
    slurm_qos: str | None = option("str", "sbatch --qos.", metavar="NAME")
    slurm_array_parallelism: int | None = option("int", "At most K tasks of the array at once (--array=…%K).",
                                                 min=1, metavar="K")
    slurm_extra: str | None = option("str", "More sbatch options, each its own #SBATCH line, e.g. "
                                     "'--constraint=h100 --mail-type=END,FAIL'.", metavar="OPTS")


@dataclass(frozen=True)
class StudySpec:
    """Everything ``routerbench study depth`` needs; :meth:`resolve` checks it and fills in defaults."""

    COMMAND: ClassVar[str] = "study depth"
    #: ``--estimate-steps`` changes no result, so a study resumes whatever it is.
    NOT_IN_FILE: ClassVar[tuple[str, ...]] = NOT_IN_FILE + ("study.estimate_steps",) + tuple(
        f"launch.{k}" for k in ("unit", "units", "launcher", "workers", "threads", "lock_free", "submit", "wait")) + tuple(
        f"launch.slurm_{k}" for k in ("partition", "gpus_per_task", "cpus_per_task", "time", "account", "qos",
                                      "array_parallelism", "extra"))

    routers: RouterSet = RouterSet()
    study: Study = Study()
    launch: Launch = Launch()
    output: Output = Output()

    def resolve(self, L: Labels) -> "StudySpec":
        """Check every option and fill in defaults; nothing heavier than a router is built.

        Raises:
            ConfigError: ``--blocks`` with ``--block-length``; a block count or length that does not
                divide a depth (naming the option and the depth); ``n_blocks``/``block_unit`` in
                ``--router-options``; a bad router option at some depth; ``--eval-every`` above the
                budget; an unreadable corpus or one whose validation split is shorter than a sequence.
        """
        from harness.training.distributed import env_world_size
        if env_world_size() > 1:
            raise ConfigError("study depth runs in one process, not under torchrun (its runs are not "
                              "trained with DDP yet): run it without torchrun, or train each depth with "
                              "`routerbench train --preset char-<L>L` under torchrun")
        st, out = self.study, self.output
        check_output(out, L)
        remote = (self.launch.launcher == "slurm" and (out.device or "").startswith("cuda")
                  and not torch.cuda.is_available())  # a login node: the GPUs are the nodes'
        dev = torch.device(out.device) if remote else resolve_device(out.device, L("output.device"))
        scale = st.scale or "char"
        defaults = SCALE_DEFAULTS[scale]
        depths = tuple(st.depths or defaults["depths"])
        if st.blocks is not None and st.block_length is not None:
            raise ConfigError(f"{L('study.blocks')} and {L('study.block_length')} exclude each other: hold "
                              "either the block count or the block length fixed across depths")
        seed_list = self._seed_list(L)
        routers = self.routers.routers or DEFAULT_ROUTERS
        for name, opts in (self.routers.router_options or {}).items():
            clash = sorted(set(opts) & set(LAYOUT_OPTIONS)) if isinstance(opts, dict) else []
            if clash:
                raise ConfigError(f"{L('routers.router_options')}: {name}.{clash[0]} is set by the study "
                                  f"({L('study.blocks')} or {L('study.block_length')}, held fixed across "
                                  "depths); drop it")
        blocks = None if st.block_length is not None else (st.blocks or DEFAULT_BLOCKS)
        if any(takes_blocks(r) for r in routers):
            for d in depths:
                if blocks is not None and d % blocks:
                    raise ConfigError(f"{L('study.blocks')} {blocks} does not divide depth {d} "
                                      f"({L('study.depths')}): the block layout would change with depth; "
                                      "choose a block count that divides every depth, or --block-length")
                if st.block_length is not None and d % st.block_length:
                    raise ConfigError(f"{L('study.block_length')} {st.block_length} does not divide depth "
                                      f"{d} ({L('study.depths')}): the blocks would differ in length; choose "
                                      "a length that divides every depth, or --blocks")
        if given(st, "compile_scope") and not compiles(st.backend):
            raise ConfigError(f"{L('study.compile_scope')} has no effect without {L('study.backend')} "
                              "compile; drop it or add --backend compile")
        backend = st.backend or "eager"
        tp = TRAINING_PRESETS[defaults["base"]]
        seed_list = seed_list or tuple(range(st.seeds or tp.seeds.value))
        launch = self._launch(L, len(seed_list) * len(depths))
        max_steps = st.max_steps or tp.max_steps.value
        eval_every = st.eval_every or (max(1, max_steps // 4) if scale == "tiny"
                                       else default_eval_every(max_steps))
        if eval_every > max_steps:
            raise ConfigError(f"{L('study.eval_every')} {eval_every} is more than {L('study.max_steps')} "
                              f"{max_steps}; lower it")
        resolved = replace(
            self, routers=replace(self.routers, routers=routers,
                                  router_options=self.routers.router_options or None),
            study=replace(st, data=absolute(st.data), scale=scale, depths=depths,
                          seeds=len(seed_list), seed_list=seed_list, blocks=blocks, max_steps=max_steps,
                          eval_every=eval_every, lr=st.lr or tp.lr.value,
                          warmup_steps=tp.warmup_steps.value if st.warmup_steps is None else st.warmup_steps,
                          precision=st.precision or "fp32", schedule=st.schedule or "auto",
                          backend=backend, compile_scope=(st.compile_scope or DEFAULT_COMPILE_SCOPE)
                          if compiles(backend) else None,
                          estimate_steps=st.estimate_steps or 3),
            launch=launch, output=replace(out, device=str(dev), report=out.report is not False, quiet=bool(out.quiet)))
        cfg0 = resolved.decoder_config(depths[0])
        check_router_set(self.routers, routers, [], cfg0.d_model, L)
        for d in depths:  # the options each router is built with, at every depth
            for r, opts in resolved.options_at(d).items():
                check_router_options(r, opts, cfg0.d_model, d, L("routers.router_options"))
        if st.data is not None:
            from workloads.data import CharCorpus
            corpus = CharCorpus.open(st.data, L("study.data"))
            if len(corpus.val) < cfg0.seq_len + 1:
                raise ConfigError(f"{L('study.data')} {st.data}: its validation split has only "
                                  f"{len(corpus.val)} tokens, fewer than a sequence of {cfg0.seq_len} + 1")
        return resolved

    def _seed_list(self, L: Labels) -> tuple[int, ...]:
        """``--seed-list`` checked (each seed once; with ``--seeds`` only when it counts them), or ()."""
        st = self.study
        if st.seed_list is None:
            return ()
        seen = set()
        for s in st.seed_list:
            if s in seen:
                raise ConfigError(f"{L('study.seed_list')} {','.join(map(str, st.seed_list))}: seed {s} is given "
                                  "twice; give each seed once")
            seen.add(s)
        if st.seeds is not None and st.seeds != len(st.seed_list):
            raise ConfigError(f"{L('study.seeds')} {st.seeds} and {L('study.seed_list')} "
                              f"{','.join(map(str, st.seed_list))} disagree; give one of them")
        return tuple(st.seed_list)

    def _launch(self, L: Labels, n_units: int) -> Launch:
        """The launch options checked against the study's unit count (before anything is built)."""
        la = self.launch
        if la.unit is not None:
            for i in la.unit:
                if i >= n_units:
                    raise ConfigError(f"{L('launch.unit')} {i}: the study has {n_units} unit"
                                      f"{'s' * (n_units != 1)} (0..{n_units - 1}: seeds outermost, then depths); "
                                      "see --units commands")
            if len(set(la.unit)) != len(la.unit):
                raise ConfigError(f"{L('launch.unit')} {','.join(map(str, la.unit))}: a unit is given twice; "
                                  "give each once")
            if not self.output.run_id:
                raise ConfigError(f"{L('launch.unit')} needs {L('output.run_id')} STUDY: the units of one study "
                                  "share it (each goes to <out>/<device>/STUDY-L<depth>-s<seed>)")
        launcher = la.launcher or ("local" if la.workers is not None else None)
        if la.units is not None and (launcher or la.unit is not None):
            raise ConfigError(f"{L('launch.units')} prints the units and exits; drop "
                              f"{L('launch.launcher') if launcher else L('launch.unit')}")
        slurm = [k for k in ("slurm_partition", "slurm_gpus_per_task", "slurm_cpus_per_task", "slurm_time",
                             "slurm_account", "slurm_qos", "slurm_array_parallelism", "slurm_extra", "submit", "wait")
                 if getattr(la, k) is not None]
        if slurm and launcher != "slurm":
            raise ConfigError(f"{L('launch.' + slurm[0])} has no effect without {L('launch.launcher')} slurm; "
                              f"drop it or add {L('launch.launcher')} slurm")
        if launcher == "slurm":
            if la.workers is not None:
                raise ConfigError(f"{L('launch.workers')} is the local launcher's; with {L('launch.launcher')} "
                                  f"slurm give {L('launch.slurm_array_parallelism')}")
            if self.output.device is None:
                raise ConfigError(f"{L('launch.launcher')} slurm needs {L('output.device')} cuda or cpu: the "
                                  "nodes' devices cannot be seen from here")
            if la.threads and la.slurm_cpus_per_task and la.threads != la.slurm_cpus_per_task:
                raise ConfigError(f"{L('launch.threads')} {la.threads} and {L('launch.slurm_cpus_per_task')} "
                                  f"{la.slurm_cpus_per_task} disagree: each task's threads are its CPUs; give one")
            if la.wait and la.submit is False:
                raise ConfigError(f"{L('launch.wait')} with {L('launch.submit')} off waits for nothing; drop one")
        return replace(la, launcher=launcher, lock_free=bool(la.lock_free))

    def unit_mode(self) -> bool:
        """Whether the study runs as units (``--unit``, ``--units``, ``--launcher``), each in its own
        run directory, rather than in one run directory as a whole."""
        la = self.launch
        return la.unit is not None or la.units is not None or la.launcher is not None

    # --- what a resolved spec builds ------------------------------------------------------------
    def decoder_config(self, depth: int) -> DecoderConfig:
        """The shape at ``depth``: the scale's preset of that depth (``char-{depth}L``) if there is
        one, else the scale's base preset with ``n_layers = depth`` (same width)."""
        scale = SCALE_DEFAULTS[self.study.scale]
        name = f"char-{depth}L" if self.study.scale == "char" and f"char-{depth}L" in PRESETS else scale["base"]
        return PRESETS[name].replace(n_layers=depth, dtype="float32")

    def train_config(self, depth: int):
        """The :class:`harness.training.config.TrainConfig` of every run at ``depth`` (no target: the study's
        result is the loss at the token budget)."""
        from harness.training.config import TrainConfig
        st = self.study
        return TrainConfig(self.decoder_config(depth), target_loss=None, max_steps=st.max_steps,
                           eval_every=st.eval_every, lr=st.lr, warmup_steps=st.warmup_steps,
                           precision=st.precision, backend=st.backend, compile_scope=st.compile_scope)

    def n_blocks_at(self, depth: int) -> int:
        """The block count at ``depth``: ``--blocks``, or depth / ``--block-length``."""
        st = self.study
        return st.blocks if st.blocks is not None else depth // st.block_length

    def options_at(self, depth: int) -> dict[str, dict]:
        """Router -> the options it is built with at ``depth`` (the layout added to block routers)."""
        set_by_user = self.routers.router_options or {}
        out = {}
        for r in self.routers.routers:
            opts = dict(set_by_user.get(r, {}))
            if takes_blocks(r):
                opts.update(n_blocks=self.n_blocks_at(depth), block_unit="layer")
            out[r] = opts
        return out

    def layout(self) -> dict:
        """What the study holds fixed across depths, for the manifest and the report: ``held``
        (``"block count"`` or ``"block length"``), ``value``, and per depth ``n_blocks`` and
        ``layers_per_block``; ``routers``: the routers it applies to."""
        st = self.study
        held = ("block count", st.blocks) if st.blocks is not None else ("block length", st.block_length)
        return {"held": held[0], "value": held[1], "block_unit": "layer",
                "routers": [r for r in self.routers.routers if takes_blocks(r)],
                "per_depth": {str(d): {"n_blocks": self.n_blocks_at(d),
                                       "layers_per_block": d // self.n_blocks_at(d)}
                              for d in st.depths}}

    def scale_label(self) -> str:
        """How the scale is named in every output; the tiny one says it is no evidence. A backend
        other than eager and a precision other than fp32 are named in it."""
        st = self.study
        cfg = self.decoder_config(st.depths[0])
        how = "".join(f", {w}" for w in (f"backend {st.backend}" if not of(st.backend).plain else "",
                                         st.precision if st.precision not in (None, "fp32") else "") if w)
        what = (f"d={cfg.d_model}, T={cfg.seq_len}, B={cfg.batch_size}, {st.max_steps} steps, "
                f"{_seed_words(st)}, depths {','.join(map(str, st.depths))}{how}")
        return f"scale tiny: {TINY_LABEL} ({what})" if st.scale == "tiny" else f"scale {st.scale} ({what})"

    def full_steps(self) -> int:
        """The step budget of the full study at this scale (the scale's preset: 5,000 for char)."""
        return TRAINING_PRESETS[SCALE_DEFAULTS[self.study.scale]["base"]].max_steps.value

    def budget_note(self) -> str | None:
        """What a step budget below the full study's is (:func:`budget_words`), else None; None at
        the tiny scale too, which says it is a plumbing smoke test already."""
        if self.study.scale == "tiny":
            return None
        cfg = self.decoder_config(self.study.depths[0])
        return budget_words(self.study.max_steps, self.full_steps(), cfg.batch_size * cfg.seq_len,
                            self.study.scale)


def budget_words(steps: int, full_steps: int, tokens_per_step: int, scale: str = "char") -> str | None:
    """``"500 steps per run (4.1M tokens): a smoke test; the full study trains 5,000 steps (41M
    tokens) per run, 10x more (...)"``, said by the study's plan, report and ``scripts/gpu_study.sh``
    when ``steps`` is below the full budget (below :data:`SMOKE_FRACTION` of it: "a smoke test";
    more: "a shortened study"); None at or above it. The char preset's 5,000 steps are ours: our
    sources do not give the papers' char-level step budget, and the sentence says so."""
    if steps >= full_steps:
        return None
    what = "a smoke test" if steps < SMOKE_FRACTION * full_steps else "a shortened study"
    whose = ("the char-* presets' budget, ours: the papers' char-level step budget is "
             f"{NOT_IN_OUR_SOURCES}" if scale == "char" else f"the {scale} scale's preset")
    return (f"{steps:,} steps per run ({_tokens(steps * tokens_per_step)} tokens): {what}; the full "
            f"study trains {full_steps:,} steps ({_tokens(full_steps * tokens_per_step)} tokens) per run, "
            f"{full_steps / steps:.3g}x more ({whose})")


def _tokens(n: int) -> str:
    return f"{n / 1e6:.3g}M" if n >= 1e6 else f"{n / 1e3:.3g}k" if n >= 1e3 else str(n)


def _seed_words(st: Study) -> str:
    """``3 seeds`` for seeds 0..2, ``seeds 0,3,7`` otherwise."""
    seeds = tuple(st.seed_list or range(st.seeds))
    if seeds == tuple(range(len(seeds))):
        return f"{len(seeds)} seed{'s' * (len(seeds) != 1)}"
    return f"seed{'s' * (len(seeds) != 1)} {','.join(map(str, seeds))}"
