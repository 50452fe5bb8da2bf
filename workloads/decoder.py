"""The decoder-only Transformer with a router slot between sublayers (DESIGN.md, "Workloads").

Token embedding → 2L sublayers (causal attention with rotary positions at even k, SwiGLU MLP at
odd k), each with its own input RMSNorm; the router (``routers``) owns everything between them;
final RMSNorm → LM head. Non-embedding matrix parameters: 4d² (attention) + 12d² (SwiGLU, hidden
4d) = 16·d² per layer, the shape of the HAARES paper's 201M / 453M models.
"""

from __future__ import annotations

import contextlib
import math
import types
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from routers import Router, build_router

from .config import DecoderConfig

NORM_EPS = 1e-6


def _label(name: str, on: bool):
    """A ``torch.profiler.record_function`` label where ``on`` (:attr:`Decoder.profile_labels`)."""
    return torch.profiler.record_function(name) if on else contextlib.nullcontext()


def rotary_tables(seq_len: int, head_dim: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos and sin tables of rotary positions (Su et al., RoFormer), each (T, head_dim/2), float32."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate channel pairs (i, i + hs/2) of x (B, nh, T, hs) by the position angles (T, hs/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Attention(nn.Module):
    """Causal self-attention sublayer: u = W_o · SDPA(rope(q), rope(k), v) of RMSNorm(h)."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.n_heads = cfg.n_heads
        self.norm = nn.RMSNorm(d, eps=NORM_EPS)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        cos, sin = rotary_tables(cfg.seq_len, cfg.head_dim)
        self.register_buffer("cos", cos.to(cfg.torch_dtype), persistent=False)
        self.register_buffer("sin", sin.to(cfg.torch_dtype), persistent=False)
        self.register_buffer("positions", torch.arange(cfg.seq_len), persistent=False)
        self.register_buffer("k_cache", None, persistent=False)
        self.register_buffer("v_cache", None, persistent=False)

    def setup_kv_cache(self, batch_size: int) -> None:
        """Allocate a static KV cache (B, nh, seq_len, hs) on this module's device and dtype."""
        hs = self.proj.in_features // self.n_heads
        shape = (batch_size, self.n_heads, self.positions.numel(), hs)
        w = self.proj.weight
        self.k_cache = torch.zeros(shape, device=w.device, dtype=w.dtype)
        self.v_cache = torch.zeros(shape, device=w.device, dtype=w.dtype)

    def forward(self, h: Tensor, pos: Tensor | None = None) -> Tensor:
        """h (B, T, d) → u (B, T, d). With ``pos`` (T,) int64 the T tokens sit at those positions
        and attend to the KV cache (decode); otherwise positions are 0..T-1 (a full causal
        forward, which also fills the cache when one is set up)."""
        B, T, d = h.shape
        qkv = self.qkv(self.norm(h)).view(B, T, 3, self.n_heads, d // self.n_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)                  # each (B, nh, T, hs)
        if pos is None:
            cos, sin = self.cos[:T], self.sin[:T]
        else:
            cos, sin = self.cos[pos], self.sin[pos]
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if pos is not None:
            # In place on static buffers, so a decode step can be captured in a CUDA graph.
            self.k_cache.index_copy_(2, pos, k.detach())
            self.v_cache.index_copy_(2, pos, v.detach())
            mask = self.positions.unsqueeze(0) <= pos.unsqueeze(1)      # (T, seq_len)
            y = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask)
        else:
            if self.k_cache is not None:
                self.k_cache[:, :, :T].copy_(k.detach())
                self.v_cache[:, :, :T].copy_(v.detach())
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, d))


class SwiGLU(nn.Module):
    """MLP sublayer: u = W_down (silu(W_gate x) ⊙ W_up x), x = RMSNorm(h), hidden 4d (12d²)."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.norm = nn.RMSNorm(d, eps=NORM_EPS)
        self.gate = nn.Linear(d, 4 * d, bias=False)
        self.up = nn.Linear(d, 4 * d, bias=False)
        self.down = nn.Linear(4 * d, d, bias=False)

    def forward(self, h: Tensor, pos: Tensor | None = None) -> Tensor:
        x = self.norm(h)
        return self.down(F.silu(self.gate(x)) * self.up(x))


class GeluMLP(nn.Module):
    """MLP sublayer: u = W_2 gelu(W_1 RMSNorm(h)), hidden 4d (8d²)."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.norm = nn.RMSNorm(d, eps=NORM_EPS)
        self.fc = nn.Linear(d, 4 * d, bias=False)
        self.down = nn.Linear(4 * d, d, bias=False)

    def forward(self, h: Tensor, pos: Tensor | None = None) -> Tensor:
        return self.down(F.gelu(self.fc(self.norm(h))))


class NormOnly(nn.Module):
    """``router_only`` sublayer: u = RMSNorm(h) with no weights, to isolate the routing cost."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.d = cfg.d_model

    def forward(self, h: Tensor, pos: Tensor | None = None) -> Tensor:
        return F.rms_norm(h, (self.d,), eps=NORM_EPS)


class Decoder(nn.Module):
    """Decoder-only Transformer hosting a residual router.

    Args:
        cfg: the shape.
        router: a router instance, or a registered router name (built with ``router_options``).
        router_options: options of a router given by name.
        init_seed: when given, the weights every router shares (embedding, sublayers, LM head) are
            drawn from a generator seeded with it, in a fixed order, so two decoders with different
            routers start from the same shared weights (training runs are paired by seed); the
            router's own parameters still come from the global RNG. ``None``: the global RNG.

    Forward: token ids (B, T) int64 → logits (B, T, vocab_size) in ``cfg.dtype``.

    Raises:
        ConfigError: from the router (unknown name or option) before any weight is allocated.
        ValueError: a router built for another width or depth.
    """

    def __init__(self, cfg: DecoderConfig, router: Router | str = "prenorm",
                 router_options: dict | None = None, init_seed: int | None = None) -> None:
        super().__init__()
        if isinstance(router, str):
            router = build_router(router, cfg.d_model, cfg.n_layers, **(router_options or {}))
        if (router.d_model, router.n_layers) != (cfg.d_model, cfg.n_layers):
            raise ValueError("router was built for d_model/n_layers "
                             f"{router.d_model}/{router.n_layers}, config has {cfg.d_model}/{cfg.n_layers}")
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.workload == "router_only":
            kinds = (NormOnly, NormOnly)
        else:
            kinds = (Attention, SwiGLU if cfg.mlp == "swiglu" else GeluMLP)
        self.sublayers = nn.ModuleList(kinds[k % 2](cfg) for k in range(2 * cfg.n_layers))
        self.router = router
        self.norm = nn.RMSNorm(cfg.d_model, eps=NORM_EPS)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self._init_weights(None if init_seed is None else torch.Generator().manual_seed(init_seed))
        self.to(cfg.torch_dtype)
        #: the layer compile scope's regions (:class:`Regions`), or None: the functions run as they are
        self.regions: Regions | None = None
        #: wrap the router's and sublayers' calls of an eager forward in ``record_function`` labels
        #: (``router.init/params/read/write/output``, ``sublayer.attn/mlp``); off by default, switched on by
        #: ``harness.sweep.trace`` while it traces an eager step: with no profiler running a label
        #: still costs a few µs of dispatch, 6·L+2 of them per forward, which moves a small CPU step
        self.profile_labels = False

    def _init_weights(self, generator: torch.Generator | None = None) -> None:
        # GPT-2 init; the output projections are scaled by 1/sqrt(2L) so the residual stream's
        # variance at init does not grow with depth.
        for name, p in self.named_parameters():
            if name.startswith("router.") or p.ndim < 2:
                continue
            std = 0.02
            if name.endswith(("proj.weight", "down.weight")):
                std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
            nn.init.normal_(p, mean=0.0, std=std, generator=generator)

    def setup_kv_cache(self, batch_size: int) -> None:
        """Give every attention sublayer a static KV cache of ``cfg.seq_len`` positions."""
        for f in self.sublayers:
            if isinstance(f, Attention):
                f.setup_kv_cache(batch_size)

    def forward(self, idx: Tensor, pos: Tensor | None = None) -> Tensor:
        """Token ids (B, T) → logits (B, T, V). ``pos`` (T,) int64 decodes the T tokens at those
        positions against the KV cache (:meth:`setup_kv_cache`, filled by a forward without
        ``pos``); the router mixes depth per token, so it needs no cache of its own.

        One loop whatever the backend and scope (the router contract, ``routers/base.py``): the
        embedding and the router's state, then per slot its read, sublayer and write, then the
        readout and the head. With :attr:`regions` set (the layer compile scope) each of those
        steps is a compiled region (:class:`Regions`) and the router's state is laid out for a
        fixed length; otherwise the same functions run as they are."""
        r, reg = self.router, self.regions
        region = reg is not None
        labels = self.profile_labels and not region
        ckpt = self.cfg.grad_checkpoint and self.training and torch.is_grad_enabled()
        state = (reg.init if region else init_region)(r, self.embed, idx, region, labels)
        if region:  # the state crosses every region boundary packed (Router.pack: no NamedTuple)
            r.check_region_form()
            state = r.pack(r.begin(r.unpack(state)))
        for slot, f in zip(r.slots, self.sublayers):
            role = region_key(r, slot)
            with _label("router.params", labels):
                params = r.params(r.unpack(state), slot, region)
            step = reg.sublayer(role) if region else sublayer_region
            state = step(role, r, f, state, params, pos, ckpt, labels)
        return (reg.head if region else head_region)(r, self.norm, self.lm_head, state,
                                                     r.output_params(region), labels)

    @contextlib.contextmanager
    def without_regions(self):
        """Run the plain forward inside the block (an evaluation off a compiled run's clock)."""
        regions, self.regions = self.regions, None
        try:
            yield self
        finally:
            self.regions = regions


# --- regions: the layer compile scope (DESIGN.md, "Backends and modes") ------------------------

def region_key(router: Router, slot) -> tuple:
    """The role of ``slot``'s region: its sublayer kind and :meth:`Router.role`."""
    return (slot.kind, *router.role(slot))


def init_region(router: Router, embed: nn.Embedding, idx: Tensor, region: bool, labels: bool):
    """Region 1: the embedding and the router's state (packed)."""
    e = embed(idx)
    with _label("router.init", labels):
        return router.pack(router.init_state(e, region))


def sublayer_region(role: tuple, router: Router, f: nn.Module, state, params: tuple, pos: Tensor | None,
                    ckpt: bool, labels: bool):
    """One region per role: the router's read, the sublayer, the router's write (the state in
    and out packed, :meth:`Router.pack`)."""
    state = router.unpack(state)
    with _label("router.read", labels):
        h = router.read(state, role[1:], params)
    with _label(f"sublayer.{role[0]}", labels):
        u = checkpoint(f, h, use_reentrant=False) if ckpt else f(h, pos)
    with _label("router.write", labels):
        return router.pack(router.write(state, role[1:], params, u))


def head_region(router: Router, norm: nn.Module, lm_head: nn.Module, state, params: tuple,
                labels: bool) -> Tensor:
    """The last region: the router's readout, the final RMSNorm and the LM head."""
    with _label("router.output", labels):
        h_out = router.output(router.unpack(state), params)
    return lm_head(norm(h_out))


def _own_code(fn: Callable, name: str) -> Callable:
    """``fn`` with a code object of its own: dynamo caches compiled code per code object, so each
    region compiles once and a recompile of one is its own, never another role's entry."""
    code = fn.__code__.replace(co_name=name, co_qualname=name) if hasattr(fn.__code__, "co_qualname") \
        else fn.__code__.replace(co_name=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


class Regions:
    """The regions of a decoder under the layer compile scope: the embedding and the router's
    state (:func:`init_region`), one region per sublayer role (:func:`sublayer_region`, made on
    first use), the readout and head (:func:`head_region`). Each is ``compile_fn`` of a function
    with its own code object; the identity runs them eagerly.

    Args:
        compile_fn: e.g. ``lambda f: torch.compile(f, fullgraph=True)``.
    """

    def __init__(self, compile_fn: Callable[[Callable], Callable] = lambda f: f) -> None:
        self.compile_fn = compile_fn
        self.init = compile_fn(_own_code(init_region, "init_region"))
        self.head = compile_fn(_own_code(head_region, "head_region"))
        self._roles: dict[tuple, Callable] = {}

    def sublayer(self, role: tuple) -> Callable:
        """The compiled region of ``role``."""
        if role not in self._roles:
            self._roles[role] = self.compile_fn(_own_code(sublayer_region, f"sublayer_region_{len(self._roles)}"))
        return self._roles[role]

    @property
    def roles(self) -> list[tuple]:
        """The sublayer roles run so far, in order of first use."""
        return list(self._roles)


def region_count(router: Router) -> int:
    """Regions the layer scope compiles for ``router``: one per distinct sublayer role
    (:func:`region_key` over its slots), plus the init and the head region."""
    return len({region_key(router, s) for s in router.slots}) + 2


def parameter_counts(model: Decoder) -> dict[str, int]:
    """Parameters by group (each tensor counted once, tied weights too).

    Returns:
        ``matrix``: non-embedding matrix parameters of the sublayers (16·d²·L with SwiGLU),
        ``embedding``, ``lm_head`` (0 when tied), ``norm`` (RMSNorm gains), ``router``, ``total``.
    """
    counts = dict.fromkeys(("matrix", "embedding", "lm_head", "norm", "router"), 0)
    for name, p in model.named_parameters():  # named_parameters yields a tied tensor once
        if name.startswith("router."):
            group = "router"
        elif name.startswith("embed."):
            group = "embedding"
        elif name.startswith("lm_head."):
            group = "lm_head"
        elif p.ndim == 1:
            group = "norm"
        else:
            group = "matrix"
        counts[group] += p.numel()
    counts["total"] = sum(counts.values())
    return counts


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW parameter groups: weight decay on weight matrices only, never on router parameters
    (pseudo-queries, detail biases, α, γ), norm gains or biases (MEASUREMENT.md)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.ndim >= 2 and not name.startswith("router.") else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]
