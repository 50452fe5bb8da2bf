"""Decoder shapes: :class:`DecoderConfig` and the named presets (DESIGN.md, "Workloads")."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch

from routers.errors import ConfigError  # re-exported: the error of every bad option

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
#: d=512 → 201.3M, d=768 → 453.0M non-embedding matrix parameters); ``char-48L`` is the WAV v1
#: char-level setting; ``cpu-*`` are small enough for a 2-core CPU.
PRESETS: dict[str, DecoderConfig] = {
    "cpu-quick": DecoderConfig(d_model=64, n_layers=4, n_heads=4, seq_len=64, batch_size=8),
    "cpu-train": DecoderConfig(d_model=128, n_layers=4, n_heads=4, seq_len=128, batch_size=16),
    "char-12L": DecoderConfig(d_model=512, n_layers=12, n_heads=8, seq_len=256, batch_size=32),
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


def preset(name: str) -> DecoderConfig:
    """Look up a preset by name.

    Raises:
        ConfigError: unknown name (the message lists the known presets and names ``--preset``).
    """
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"--preset {name!r} is unknown; known presets: {', '.join(PRESETS)}") from None
