"""Decoder shapes: :class:`DecoderConfig` and the named presets (DESIGN.md, "Workloads")."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch

from routers.errors import ConfigError

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16}
MLPS = ("swiglu", "gelu")
WORKLOADS = ("decoder", "router_only")


@dataclass(frozen=True)
class DecoderConfig:
    """Shape of the decoder-only Transformer that hosts a router.

    Attributes:
        vocab_size: number of token ids.
        d_model: residual width d.
        n_layers: transformer layers L (2L sublayers: attention at even k, MLP at odd k).
        n_heads: attention heads; ``d_model`` must be divisible by it and the head size even
            (rotary positions rotate pairs of channels).
        mlp: ``"swiglu"`` (hidden 4d, three matrices: 12d² per layer, so 16d² per layer with
            attention) or ``"gelu"`` (hidden 4d, two matrices: 8d²).
        seq_len: tokens per sequence T.
        batch_size: sequences per step B.
        dtype: parameter and activation dtype name (a key of :data:`DTYPES`).
        tie_embeddings: share the token embedding with the LM head.
        workload: ``"decoder"`` or ``"router_only"`` (every sublayer is its input RMSNorm alone).
        grad_checkpoint: recompute each sublayer in backward instead of saving its activations.
    """

    vocab_size: int = 96
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    mlp: str = "swiglu"
    seq_len: int = 128
    batch_size: int = 8
    dtype: str = "float32"
    tie_embeddings: bool = False
    workload: str = "decoder"
    grad_checkpoint: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the option when a value is out of range."""
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "seq_len", "batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {v!r}")
        if self.d_model % self.n_heads:
            raise ConfigError(f"--d-model {self.d_model} is not divisible by --n-heads {self.n_heads}")
        if (self.d_model // self.n_heads) % 2:
            raise ConfigError(f"head size --d-model/--n-heads = {self.d_model // self.n_heads} must be "
                              "even for rotary positions; change --n-heads")
        if self.mlp not in MLPS:
            raise ConfigError(f"--mlp must be one of {MLPS}, got {self.mlp!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"--dtype must be one of {tuple(DTYPES)}, got {self.dtype!r}")
        if self.workload not in WORKLOADS:
            raise ConfigError(f"--workload must be one of {WORKLOADS}, got {self.workload!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def replace(self, **changes) -> "DecoderConfig":
        """A copy with ``changes`` applied (validated)."""
        return replace(self, **changes)

    def shape_columns(self) -> dict:
        """The workload columns of a result row."""
        d = asdict(self)
        return {k: d[k] for k in ("workload", "d_model", "n_layers", "n_heads", "seq_len",
                                  "batch_size", "dtype")}


#: Named shapes. The ``haares-*`` presets are the HAARES paper's sizes (48 layers, 16·d² per layer:
#: d=512 → 201.3M, d=768 → 453.0M non-embedding matrix parameters); ``char-12L``/``char-24L``/
#: ``char-48L`` are the WAV v1 char-level depths (same width, only depth changes); ``cpu-*`` are
#: small enough for a 2-core CPU. Their training settings and the source of every value:
#: :data:`TRAINING_PRESETS`.
PRESETS: dict[str, DecoderConfig] = {
    "cpu-quick": DecoderConfig(d_model=64, n_layers=4, n_heads=4, seq_len=64, batch_size=8),
    "cpu-train": DecoderConfig(d_model=128, n_layers=4, n_heads=4, seq_len=128, batch_size=16),
    "char-12L": DecoderConfig(d_model=512, n_layers=12, n_heads=8, seq_len=256, batch_size=32),
    "char-24L": DecoderConfig(d_model=512, n_layers=24, n_heads=8, seq_len=256, batch_size=32),
    "char-48L": DecoderConfig(d_model=512, n_layers=48, n_heads=8, seq_len=256, batch_size=32),
    "haares-201m": DecoderConfig(vocab_size=50304, d_model=512, n_layers=48, n_heads=8,
                                 seq_len=1024, batch_size=8, dtype="bfloat16"),
    "haares-453m": DecoderConfig(vocab_size=50304, d_model=768, n_layers=48, n_heads=12,
                                 seq_len=1024, batch_size=8, dtype="bfloat16"),
}

#: Width × depth grids swept by ``routerbench run`` (per device class).
GRIDS: dict[str, dict] = {
    "cpu-default": {"base": PRESETS["cpu-quick"], "d_model": (64, 128), "n_layers": (4, 8)},
    "cuda-default": {"base": DecoderConfig(d_model=512, n_layers=12, n_heads=8, seq_len=512,
                                           batch_size=8, dtype="bfloat16"),
                     "d_model": (512, 1024), "n_layers": (12, 24)},
}


PAPER = "paper"
OURS = "ours"
#: Where a value of ours comes from when the paper's is unknown to us: our sources of
#: arXiv:2606.06564 (its abstract and ROUTERS.md) do not state it.
NOT_IN_OUR_SOURCES = "not stated in our sources of arXiv:2606.06564"


@dataclass(frozen=True)
class Sourced:
    """One setting and where it comes from.

    Attributes:
        value: the number.
        source: ``"paper: <where>"`` (a value arXiv:2606.06564 states, as our sources quote it)
            or ``"ours: <why>"`` (a value of this project, never presented as the paper's).
    """

    value: Any
    source: str

    def __post_init__(self) -> None:
        if self.source.split(":", 1)[0] not in (PAPER, OURS):
            raise ValueError(f"source must start with 'paper:' or 'ours:', got {self.source!r}")

    @property
    def origin(self) -> str:
        """``"paper"`` or ``"ours"``."""
        return self.source.split(":", 1)[0]


def _ours(value: Any, why: str = NOT_IN_OUR_SOURCES) -> Sourced:
    return Sourced(value, f"{OURS}: {why}")


def _paper(value: Any, where: str) -> Sourced:
    return Sourced(value, f"{PAPER}: {where}")


@dataclass(frozen=True)
class TrainingPreset:
    """The training settings that go with the shape preset ``shape``, each value :class:`Sourced`.

    ``d_model``, ``n_layers`` and ``seq_len`` repeat the shape's own values (checked equal at
    import) so their source is stated beside them. ``global_batch`` is the number of sequences per
    optimizer step; the shape's ``batch_size`` is a micro-batch of it (``grad_accum`` of them).
    The learning rate follows ``harness.training.config.TrainConfig``'s schedule: linear warm-up over
    ``warmup_steps``, then cosine decay to 10 % at ``max_steps``.

    Raises:
        ValueError: a repeated shape value that differs from the preset's, or a global batch that
            is not a multiple of the shape's batch size.
    """

    shape: str
    d_model: Sourced
    n_layers: Sourced
    global_batch: Sourced
    seq_len: Sourced
    lr: Sourced
    warmup_steps: Sourced
    max_steps: Sourced
    seeds: Sourced

    def __post_init__(self) -> None:
        cfg = PRESETS[self.shape]
        for name in ("d_model", "n_layers", "seq_len"):
            if getattr(self, name).value != getattr(cfg, name):
                raise ValueError(f"training preset {self.shape}: {name} {getattr(self, name).value} "
                                 f"differs from the shape's {getattr(cfg, name)}")
        if self.global_batch.value % cfg.batch_size:
            raise ValueError(f"training preset {self.shape}: global batch {self.global_batch.value} "
                             f"is not a multiple of the shape's batch size {cfg.batch_size}")

    @property
    def grad_accum(self) -> int:
        """Micro-batches (of the shape's ``batch_size``) per optimizer step."""
        return self.global_batch.value // PRESETS[self.shape].batch_size

    @property
    def token_budget(self) -> int:
        """Tokens seen over the run: ``global_batch · seq_len · max_steps``."""
        return self.global_batch.value * self.seq_len.value * self.max_steps.value

    def settings(self) -> list[tuple[str, Any, str]]:
        """``(name, value, source)`` of every setting, in declaration order."""
        return [(f.name, getattr(self, f.name).value, getattr(self, f.name).source)
                for f in fields(self) if f.name != "shape"]

    def describe(self) -> str:
        """One line: the settings, each tagged (paper) or (ours), and the token budget."""
        tags = ", ".join(f"{n}={v:g} ({s.split(':', 1)[0]})" for n, v, s in self.settings())
        return f"{self.shape}: {tags}; token budget {self.token_budget:,}"


_CHAR_DEPTHS = ("WAV v1 (arXiv:2606.06564 v1) trains char-level models at 12, 24 and 48 layers "
                "on TinyStories and Text8")
_CHAR_SAME = "same at every char-* depth, so that only depth changes"


def _char(depth: int) -> TrainingPreset:
    return TrainingPreset(
        f"char-{depth}L",
        d_model=_ours(512, f"{NOT_IN_OUR_SOURCES}; {_CHAR_SAME}"),
        n_layers=_paper(depth, _CHAR_DEPTHS),
        global_batch=_ours(32, _CHAR_SAME),
        seq_len=_ours(256, _CHAR_SAME),
        lr=_ours(1e-3, _CHAR_SAME),
        warmup_steps=_ours(200, _CHAR_SAME),
        max_steps=_ours(5000, f"{_CHAR_SAME}: 32 x 256 x 5000 = 41M tokens"),
        seeds=_ours(3, "MEASUREMENT.md asks for at least 3 seeds"))


def _haares(name: str, d_model: int, params: str, seeds: int, seeds_where: str,
            max_steps: int) -> TrainingPreset:
    return TrainingPreset(
        name,
        d_model=_ours(d_model, f"inferred: 48 layers x 16·d² gives the paper's {params} "
                               "non-embedding parameters"),
        n_layers=_paper(48, f"HAARES (arXiv:2606.06564 v2): the {params} model has 48 layers"),
        global_batch=_ours(64, "64 x 1024 = 65,536 tokens per step; the shape's batch 8 is a "
                               "micro-batch (grad-accum 8)"),
        seq_len=_ours(1024, NOT_IN_OUR_SOURCES),
        lr=_ours(6e-4, f"{NOT_IN_OUR_SOURCES}; nanoGPT's GPT-2 small value"),
        warmup_steps=_ours(2000, f"{NOT_IN_OUR_SOURCES}; nanoGPT's GPT-2 small value"),
        max_steps=_ours(max_steps, f"{NOT_IN_OUR_SOURCES}; about 20 tokens per parameter "
                                   "(Hoffmann et al. 2022) at 65,536 tokens per step"),
        seeds=_paper(seeds, seeds_where))


#: Training settings beside the shapes of the papers' runs (and of the CPU study). Every value is
#: tagged ``paper`` (arXiv:2606.06564 states it, as quoted by ROUTERS.md and the abstract) or
#: ``ours``; where we do not know the paper's value it is ours, and says so.
TRAINING_PRESETS: dict[str, TrainingPreset] = {
    "cpu-quick": TrainingPreset(
        "cpu-quick", d_model=_ours(64, "a 2-core CPU"), n_layers=_ours(4, "a 2-core CPU"),
        global_batch=_ours(8, "a 2-core CPU"), seq_len=_ours(64, "a 2-core CPU"),
        lr=_ours(3e-3, "routerbench train's default"), warmup_steps=_ours(20, "TrainConfig's default"),
        max_steps=_ours(200, "a plumbing smoke test in minutes on a 2-core CPU"),
        seeds=_ours(1, "a plumbing smoke test")),
    **{f"char-{d}L": _char(d) for d in (12, 24, 48)},
    "haares-201m": _haares("haares-201m", 512, "201M", 3,
                           "HAARES improves over Block AttnRes across all three seeds at 201M",
                           61_500),
    "haares-453m": _haares("haares-453m", 768, "453M", 2, "a 453M two-seed probe", 138_500),
}


def preset(name: str) -> DecoderConfig:
    """Look up a preset by name.

    Raises:
        ConfigError: unknown name (the message lists the known presets and names ``--preset``).
    """
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"--preset {name!r} is unknown; known presets: {', '.join(PRESETS)}") from None
