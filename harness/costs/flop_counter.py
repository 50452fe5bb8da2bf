"""Second FLOP-counting path: ``torch.utils.flop_counter.FlopCounterMode`` with this project's
formulas (docs/FLOPS.md, "Second path"). Needs no TorchScript and no fvcore, so it runs on any
device and counts the backward pass too.

Units: **FLOP** (integers; FLOP = 2·FMA). A forward count equals 2 × the FMA of
``harness.costs.flops`` (fvcore) up to two exactly known terms (docs/FLOPS.md, "Relation to fvcore").
FlopCounterMode sees dispatcher-level ops after autograd's decompositions (``F.rms_norm`` arrives
as pow, mean, add_, rsqrt, mul; ``nn.Linear`` as ``mm``; einsum as ``bmm``); each needs an entry
in :data:`FORMULAS` or :data:`FREE_OPS`, else :class:`UnsupportedOpError` is raised (upstream, an
op without a formula silently counts 0, pytorch/pytorch#131041).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Callable

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

aten = torch.ops.aten
#: FlopCounterMode formula in raw form: (*args, out_val, **kwargs) of one op call → FLOP.
Formula = Callable[..., int]


class UnsupportedOpError(RuntimeError):
    """The model executes aten ops that have no rule in :data:`FORMULAS` or :data:`FREE_OPS`."""


def _raw(fn: Formula) -> Formula:
    fn._get_raw = True  # FlopCounterMode passes tensors, not shapes
    return fn


def _first(out: Any) -> Tensor:
    return out if isinstance(out, Tensor) else next(t for t in tree_flatten(out)[0]
                                                     if isinstance(t, Tensor))


def _elementwise(flop: int) -> Formula:
    """``flop`` FLOP per output element (per element of the first output)."""
    return _raw(lambda *a, out_val=None, **k: flop * _first(out_val).numel())


@_raw
def _add_sub(*args, out_val=None, **kwargs) -> int:
    """a ± b: 1 per element; a ± alpha·b with alpha ≠ 1: 2."""
    alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
    return (1 if alpha == 1 else 2) * out_val.numel()


@_raw
def _clamp(self, min=None, max=None, *, out_val=None) -> int:
    """1 per element and per bound given."""
    return ((min is not None) + (max is not None)) * out_val.numel()


@_raw
def _reduction(self, *args, out_val=None, **kwargs) -> int:
    """sum / mean / amax over n: n per output value, i.e. 1 per input element."""
    return self.numel()


@_raw
def _min_max(self, *args, out_val=None, **kwargs) -> int:
    """max / min of two tensors: 1 per output element; over a dim: 1 per input element."""
    return _first(out_val).numel() if args and isinstance(args[0], Tensor) else self.numel()


@_raw
def _vector_norm(self, ord=2, *args, out_val=None, **kwargs) -> int:
    """2-norm: square and accumulate (2 per input element) + sqrt per output value."""
    if ord != 2:
        raise ValueError(f"linalg_vector_norm with ord={ord!r} has no FLOP rule (docs/FLOPS.md)")
    return 2 * self.numel() + out_val.numel()


def _rows(x: Tensor, normalized_shape) -> tuple[int, int]:
    d = math.prod(normalized_shape)
    return x.numel() // d, d


@_raw
def _fused_rms_norm(x, normalized_shape, weight=None, eps=None, *, out_val=None) -> int:
    """Per row of d: 3d + 2 without gain, 4d + 2 with gain (as ``rms_norm`` in docs/FLOPS.md)."""
    rows, d = _rows(x, normalized_shape)
    return rows * ((3 if weight is None else 4) * d + 2)


@_raw
def _fused_rms_norm_backward(grad, x, normalized_shape, rstd, weight, mask, *, out_val=None) -> int:
    """Per row: dx = r·g⊙dy − (Σ g⊙dy⊙x)·r³/d·x: 5d + 4 (+ d for g⊙dy with a gain);
    d(gain) = Σ_rows dy⊙x·r: 3d. See docs/FLOPS.md."""
    rows, d = _rows(x, normalized_shape)
    gain = weight is not None
    dx = (5 * d + 4 + (d if gain else 0)) if mask[0] else 0
    dw = 3 * d if gain and mask[1] else 0
    return rows * (dx + dw)


@_raw
def _native_layer_norm(x, normalized_shape, weight=None, bias=None, eps=None, *, out_val=None) -> int:
    """Per row of d: 5d + 2, + d with a gain, + d with a bias (as ``layer_norm`` in docs/FLOPS.md)."""
    rows, d = _rows(x, normalized_shape)
    return rows * ((5 + (weight is not None) + (bias is not None)) * d + 2)


@_raw
def _native_layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias, mask, *,
                                out_val=None) -> int:
    """Per row: x̂ = (x − μ)·r 2d; dx = r·(g⊙dy − mean(g⊙dy) − x̂·mean(g⊙dy⊙x̂)) 7d (+ d for
    g⊙dy with a gain); d(gain) = Σ_rows dy⊙x̂ 2d; d(bias) = Σ_rows dy d. See docs/FLOPS.md."""
    rows, d = _rows(x, normalized_shape)
    dx = (7 * d + (d if weight is not None else 0)) if mask[0] else 0
    dw = 2 * d if weight is not None and mask[1] else 0
    db = d if bias is not None and mask[2] else 0
    return rows * (2 * d + dx + dw + db)


def _gelu(erf: int, tanh: int) -> Formula:
    """``erf`` FLOP per element for the default (erf) form, ``tanh`` for ``approximate="tanh"``."""
    return _raw(lambda *a, out_val=None, approximate="none", **k:
                (tanh if approximate == "tanh" else erf) * out_val.numel())


@_raw
def _embedding_backward(grad, *args, out_val=None, **kwargs) -> int:
    """Scatter-add of the output gradient into the table: 1 per gradient element."""
    return grad.numel()


@_raw
def _index_put(self, indices, values, accumulate=False, *args, out_val=None, **kwargs) -> int:
    """A write (0), or with ``accumulate`` an add per value element (1)."""
    return values.numel() if accumulate else 0


@_raw
def _index_add(self, dim, index, source, *args, out_val=None, **kwargs) -> int:
    """index_add (the backward of index_select, e.g. a read's detail bias): an add per source
    element (1)."""
    return source.numel()


# --- contractions ------------------------------------------------------------------------------
def _mm(a, b, *, out_val=None, **kw) -> int:
    """mm / bmm: 2 · output elements · K."""
    return 2 * out_val.numel() * a.shape[-1]


def _mv(a, b, *, out_val=None, **kw) -> int:
    """mv (M×K)·(K), dot: 2 · M·K."""
    return 2 * a.numel()


def _addmm(bias, a, b, *, out_val=None, **kw) -> int:
    return _mm(a, b, out_val=out_val)


def _bias_add(*args, out_val=None, **kw) -> int:
    return out_val.numel()  # + bias: 1 per output element


def _sdpa_parts(q: Tensor, k: Tensor, v: Tensor) -> tuple[int, int]:
    """(QKᵀ + AV contraction FLOP, scores) of q (…, T, E), k (…, S, E), v (…, S, Ev)."""
    scores = q.numel() // q.shape[-1] * k.shape[-2]
    return 2 * scores * q.shape[-1] + 2 * scores * v.shape[-1], scores


def _float_mask(args: tuple, kwargs: dict) -> bool:
    mask = kwargs.get("attn_mask", kwargs.get("attn_bias"))
    if mask is None and len(args) > 3 and isinstance(args[3], Tensor):
        mask = args[3]  # efficient / cudnn / overrideable: attn_bias is the 4th argument
    return mask is not None and mask.dtype != torch.bool


def _sdpa(contraction_factor: int, per_score: int, backward: bool):
    """(contraction part, per-score part) of an SDPA kernel. Forward: QKᵀ and AV, per score scale
    1 + softmax 5 (+ 1 with a float mask), causal not halved. Backward (args start with dO):
    dV = PᵀdO, dP = dO·Vᵀ, dQ = dS·K, dK = dSᵀQ (2 × forward, a kernel's recompute of QKᵀ not
    counted), per score softmax backward 4 + scale 1."""
    def qkv(args):
        return args[1:4] if backward else args[:3]

    def contraction(*args, out_val=None, **kwargs) -> int:
        return contraction_factor * _sdpa_parts(*qkv(args))[0]

    def scores(*args, out_val=None, **kwargs) -> int:
        mask = 0 if backward else _float_mask(args, kwargs)
        return (per_score + mask) * _sdpa_parts(*qkv(args))[1]
    return contraction, scores


_SDPA_FWD = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
             "_scaled_dot_product_fused_attention_overrideable")

#: op → (contraction part, remaining part); the total is their sum. The contraction part is the
#: "matmul part" of :func:`count_flops_dispatch`.
CONTRACTIONS: dict[Any, tuple[Callable[..., int], Callable[..., int] | None]] = {
    aten.mm: (_mm, None), aten.bmm: (_mm, None), aten.mv: (_mv, None), aten.dot: (_mv, None),
    aten.addmm: (_addmm, _bias_add), aten.baddbmm: (_addmm, _bias_add),
    **{getattr(aten, n): _sdpa(1, 6, backward=False) for n in _SDPA_FWD},
    **{getattr(aten, n + "_backward"): _sdpa(2, 5, backward=True) for n in _SDPA_FWD},
}


def _contraction(op) -> Formula:
    part, rest = CONTRACTIONS[op]
    return _raw(lambda *a, out_val=None, **k: part(*a, out_val=out_val, **k)
                + (rest(*a, out_val=out_val, **k) if rest else 0))


def _ops(names: str) -> list:
    return [getattr(aten, n) for n in names.split() if hasattr(aten, n)]


#: aten op (packet) → raw FlopCounterMode formula returning FLOP, per docs/FLOPS.md.
FORMULAS: dict[Any, Formula] = {
    **{op: _elementwise(1) for op in _ops(
        "mul mul_ div div_ neg pow sqrt rsqrt exp log reciprocal maximum minimum floor_divide "
        "eq ne lt le gt ge logical_not")},
    **{op: _add_sub for op in _ops("add add_ sub sub_ rsub")},
    aten.clamp: _clamp, aten.clamp_min: _elementwise(1), aten.clamp_max: _elementwise(1),
    **{op: _reduction for op in _ops("sum mean amax amin")},
    aten.max: _min_max, aten.min: _min_max,
    aten.linalg_vector_norm: _vector_norm,
    aten._fused_rms_norm: _fused_rms_norm,
    aten._fused_rms_norm_backward: _fused_rms_norm_backward,
    aten.native_layer_norm: _native_layer_norm,
    aten.native_layer_norm_backward: _native_layer_norm_backward,
    aten.tanh: _elementwise(1), aten.tanh_backward: _elementwise(3),
    aten._softmax: _elementwise(5), aten._softmax_backward_data: _elementwise(4),
    aten.lerp: _elementwise(3), aten.addcmul: _elementwise(2), aten.addcmul_: _elementwise(2),
    aten.silu: _elementwise(4), aten.sigmoid: _elementwise(4), aten.gelu: _gelu(5, 9),
    aten.silu_backward: _elementwise(9), aten.sigmoid_backward: _elementwise(3),
    aten.gelu_backward: _gelu(11, 18),
    aten.embedding_dense_backward: _embedding_backward,
    **{op: _index_put for op in _ops("index_put index_put_ _index_put_impl_")},
    **{op: _index_add for op in _ops("index_add index_add_")},
    **{op: _contraction(op) for op in CONTRACTIONS},
}

#: Ops that cost 0: views, copies, casts, concatenation, indexing, lookups, selections
#: (``where``, ``masked_fill``), allocation and metadata queries.
FREE_OPS = frozenset(_ops(
    "embedding view _unsafe_view reshape _reshape_alias view_as permute transpose t expand "
    "expand_as unsqueeze squeeze flatten unflatten unbind chunk split split_with_sizes "
    "unsafe_split narrow slice select index index_select gather cat stack constant_pad_nd as_strided alias "
    "detach clone contiguous _to_copy to _copy_from copy copy_ lift_fresh lift_fresh_copy "
    "new_zeros new_ones new_empty new_empty_strided new_full zeros zeros_like ones ones_like "
    "empty empty_like empty_strided full full_like fill fill_ zero_ arange scalar_tensor "
    "_local_scalar_dense masked_fill masked_fill_ where select_backward slice_backward "
    "select_scatter slice_scatter index_copy index_copy_ sym_size sym_stride sym_numel "
    "is_contiguous"))


class _OpRecorder(TorchDispatchMode):
    """Counts the ops that reach the dispatcher below FlopCounterMode (after its decompositions)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func._overloadpacket] += 1
        return func(*args, **(kwargs or {}))


def _name(op: Any) -> str:
    return str(op).removeprefix("aten.")


def _counted_forward(model: nn.Module, inputs: tuple, backward: bool) -> tuple[dict, ...]:
    """(forward counts, total counts, forward and total contraction FLOP, ops seen)."""
    tally = [0]

    def tallied(op):
        part = CONTRACTIONS[op][0]

        def formula(*a, out_val=None, **k):
            tally[0] += part(*a, out_val=out_val, **k)
            return FORMULAS[op](*a, out_val=out_val, **k)
        return _raw(formula)

    mapping = {**FORMULAS, **{op: tallied(op) for op in CONTRACTIONS}}
    if backward:  # the module tracker's grad hooks refuse a leaf under autograd.grad: pass views
        inputs = tuple(x.view_as(x) if isinstance(x, Tensor) and x.requires_grad else x
                       for x in inputs)
    recorder = _OpRecorder()
    # pytorch/pytorch#126268: FlopCounterMode counts 0 under inference_mode; leave it.
    with torch.inference_mode(False), recorder, \
            FlopCounterMode(display=False, custom_mapping=mapping) as fcm:
        with torch.set_grad_enabled(backward):
            out = model(*inputs)
        fwd, fwd_mm = fcm.get_flop_counts(), tally[0]
        if backward:
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, Tensor) and t.requires_grad]
            wrt = [p for p in model.parameters() if p.requires_grad]
            wrt += [x for x in inputs if isinstance(x, Tensor) and x.requires_grad]
            if outs and wrt:  # autograd.grad: leaves every .grad untouched
                torch.autograd.grad(outs, wrt, [torch.ones_like(t) for t in outs],
                                    allow_unused=True)
        total = fcm.get_flop_counts()
    return fwd, total, fwd_mm, tally[0], recorder.ops


def recompute_counter() -> FlopCounterMode:
    """A FlopCounterMode with this project's formulas, to nest inside :func:`count_flops_dispatch`
    around part of a computation (a block router's ``recompute_scope``): an op inside both counts
    in both (modes stack)."""
    return FlopCounterMode(display=False, custom_mapping=FORMULAS)


def count_flops_dispatch(model: nn.Module, inputs: tuple | Tensor, backward: bool = False, *,
                         strict: bool = True) -> dict[str, Any]:
    """FLOP of ``model(*inputs)`` (and its backward) counted op by op in eager mode.

    The model runs in eval mode (restored afterwards; no dropout, no checkpoint recompute), under
    ``torch.no_grad()`` for a forward-only count, also when called inside ``inference_mode``.
    The backward is ``torch.autograd.grad`` of every output w.r.t. every parameter (and input)
    that requires grad, with gradient 1, so no loss is counted and no ``.grad`` is touched.
    A ``torch.compile`` wrapper is unwrapped to its ``_orig_mod``.

    Returns:
        A dict, all counts in FLOP (int): ``fwd_flops``, ``bwd_flops`` (None without backward),
        ``total_flops``; ``fwd_matmul_flops`` / ``bwd_matmul_flops`` (contractions: mm, bmm, mv,
        addmm/baddbmm products, SDPA's QKᵀ and AV and their gradients); ``router_fwd_flops``
        (forward ops run in the root module's own ``forward`` outside any child module call:
        the router's mixing in a Decoder); ``fwd_by_op`` / ``bwd_by_op`` (op name → FLOP);
        ``fwd_by_module`` (``""`` = root, ``"sublayers.0.qkv"`` …); ``ops`` (op name → calls,
        forward and backward); ``unsupported`` (op name → calls of ops without a rule).

    Raises:
        UnsupportedOpError: ``strict`` and an executed op has no rule (all are listed).
    """
    model = getattr(model, "_orig_mod", model)
    inputs = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
    was_training = model.training
    model.eval()
    try:
        fwd, total, fwd_mm, total_mm, ops = _counted_forward(model, inputs, backward)
    finally:
        model.train(was_training)
    unsupported = {_name(op): n for op, n in ops.items()
                   if op not in FORMULAS and op not in FREE_OPS}
    if strict and unsupported:
        raise UnsupportedOpError(f"{type(model).__name__}: no FLOP rule for {sorted(unsupported)}; "
                                 "add them to harness.costs.flop_counter following docs/FLOPS.md")
    fwd_g, all_g = fwd.get("Global", {}), total.get("Global", {})
    root = type(model).__name__
    by_module = {("" if k == root else k[len(root) + 1:]): sum(v.values())
                 for k, v in fwd.items() if k == root or k.startswith(root + ".")}
    children = [m for m in by_module if m and not any(
        p and m.startswith(p + ".") for p in by_module)]
    fwd_flops = sum(fwd_g.values())
    bwd_flops = sum(all_g.values()) - fwd_flops if backward else None
    return {
        "fwd_flops": fwd_flops, "bwd_flops": bwd_flops,
        "total_flops": fwd_flops + (bwd_flops or 0),
        "fwd_matmul_flops": fwd_mm, "bwd_matmul_flops": total_mm - fwd_mm if backward else None,
        "router_fwd_flops": by_module.get("", 0) - sum(by_module[m] for m in children),
        "fwd_by_op": {_name(k): v for k, v in fwd_g.items() if v},
        "bwd_by_op": {_name(k): v - fwd_g.get(k, 0) for k, v in all_g.items()
                      if v - fwd_g.get(k, 0)} if backward else {},
        "fwd_by_module": by_module,
        "ops": {_name(k): n for k, n in sorted(ops.items(), key=lambda kv: _name(kv[0]))},
        "unsupported": unsupported,
    }
