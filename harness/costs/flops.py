"""Forward FLOP counting: fvcore ``FlopCountAnalysis`` with this project's handles (docs/FLOPS.md).

Units: every handle returns **FMA** (fvcore's unit: one multiply-add of a contraction); reported
FLOP = 2·FMA. Elementwise ops, reductions, norms and softmax are counted in FLOP per element by the
table of docs/FLOPS.md and converted to FMA as FLOP/2, so handles return floats (multiples of 0.5,
exact in float64). Only the forward pass is counted: no backward, no recompute.

fvcore traces with ``torch.jit.trace`` (TorchScript, deprecated since PyTorch 2.11), so the model
must be an uncompiled ``nn.Module``. fvcore ignores ``aten::clamp``, ``aten::cat``, ``aten::max`` …
silently (``_IGNORED_OPS``); here that list is emptied and every aten op needs a handle in
:data:`HANDLES`, shape ops included (cost 0), so nothing is dropped without notice.
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor, nn

from routers import route

with warnings.catch_warnings():  # fvcore's import calls torch.jit.script (deprecated since 2.11)
    warnings.simplefilter("ignore", DeprecationWarning)
    from fvcore.nn import FlopCountAnalysis
    from fvcore.nn.jit_handles import get_shape

#: fvcore handle: (input values, output values) of one traced node → FMA.
Handle = Callable[[list, list], float]


class UnsupportedOpError(RuntimeError):
    """The traced model emits aten ops that have no handle in :data:`HANDLES`."""


# --- helpers on traced values -------------------------------------------------------------------
def _shape(value: Any) -> list[int]:
    shape = get_shape(value)
    if shape is None:
        raise ValueError(f"no static shape for traced value {value.debugName()!r} "
                         f"({value.node().kind()}); count with concrete tensor inputs")
    return list(shape)


def _numel(value: Any) -> int:
    return math.prod(_shape(value))


def _is_none(value: Any) -> bool:
    return value.type().kind() == "NoneType"


def _static(value: Any, depth: int = 0) -> bool:
    """True when a traced value derives only from constants and tensor sizes (shape arithmetic).

    A tensor with a dimension is data, never a size; the search stops there and after 8 levels,
    so the check stays O(1) per op on deep residual chains."""
    node = value.node()
    kind = node.kind()
    if kind in ("prim::Constant", "prim::NumToTensor"):
        return True
    if depth > 8 or not kind.startswith("aten::") or get_shape(value):
        return False
    return all(_static(v, depth + 1) for v in node.inputs())


def _list_len(value: Any) -> int:
    """Length of a traced list argument (a constant, or a ``prim::ListConstruct`` of sizes)."""
    ival = value.toIValue()
    return len(ival) if ival is not None else len(list(value.node().inputs()))


# --- handle factories ---------------------------------------------------------------------------
def _free(inputs: list, outputs: list) -> float:
    """Copies, views, casts, concatenation, indexing, lookups and size queries: 0."""
    return 0.0


def _elementwise(flop_per_element: float) -> Handle:
    """``flop_per_element`` FLOP per output element; 0 for shape arithmetic (sizes, constants)."""
    def handle(inputs: list, outputs: list) -> float:
        if all(_static(v) for v in inputs):
            return 0.0
        return 0.5 * flop_per_element * _numel(outputs[0])
    return handle


def _add_sub(inputs: list, outputs: list) -> float:
    """a ± b: 1 FLOP per element; a ± alpha·b with alpha ≠ 1: 2."""
    alpha = inputs[2].toIValue() if len(inputs) > 2 else 1
    per_element = 1 if alpha in (1, None) else 2
    return _elementwise(per_element)(inputs, outputs)


def _clamp(inputs: list, outputs: list) -> float:
    """1 FLOP per element and per bound given (min, max)."""
    bounds = sum(not _is_none(v) for v in inputs[1:3])
    return _elementwise(bounds)(inputs, outputs)


def _reduction(inputs: list, outputs: list) -> float:
    """sum / mean / max over n elements: n FLOP per output value, i.e. one per input element."""
    return 0.5 * _numel(inputs[0])


def _min_max(inputs: list, outputs: list) -> float:
    """max / min of two tensors: 1 FLOP per output element; as a reduction: 1 per input element."""
    if len(inputs) > 1 and inputs[1].type().kind() == "TensorType":
        return _elementwise(1)(inputs, outputs)
    return _reduction(inputs, outputs)


def _vector_norm(inputs: list, outputs: list) -> float:
    """2-norm over a dim: square and accumulate (2 FLOP per input element) + sqrt per output."""
    return 0.5 * (2 * _numel(inputs[0]) + _numel(outputs[0]))


def _rms_norm(inputs: list, outputs: list) -> float:
    """Per row of d: square d, mean d, +ε 1, rsqrt 1, scale d (+ gain d) = 3d+2 (4d+2 with gain)."""
    shape = _shape(inputs[0])
    numel = math.prod(shape)
    rows = math.prod(shape[:len(shape) - _list_len(inputs[1])])
    per_element = 3 if _is_none(inputs[2]) else 4
    return 0.5 * (per_element * numel + 2 * rows)


def _layer_norm(inputs: list, outputs: list) -> float:
    """Per row of d: mean d, subtract d, variance (square d, mean d), +ε 1, rsqrt 1, scale d =
    5d + 2, + d with a gain, + d with a bias."""
    shape = _shape(inputs[0])
    numel = math.prod(shape)
    rows = math.prod(shape[:len(shape) - _list_len(inputs[1])])
    per_element = 5 + (not _is_none(inputs[2])) + (not _is_none(inputs[3]))
    return 0.5 * (per_element * numel + 2 * rows)


def _gelu(inputs: list, outputs: list) -> float:
    """erf form 0.5·x·(1+erf(x/√2)): 5 FLOP per element; tanh form: 9."""
    approximate = inputs[1].toIValue() if len(inputs) > 1 else "none"
    return _elementwise(9 if approximate == "tanh" else 5)(inputs, outputs)


def _contraction(inputs: list, outputs: list) -> float:
    """mm / bmm / matmul (any rank, broadcasting): output elements × contracted length K."""
    return float(_numel(outputs[0]) * _shape(inputs[0])[-1])


def _linear(inputs: list, outputs: list) -> float:
    """x (…, K) · Wᵀ (K, N): M·N·K FMA; a bias adds 1 FLOP per output element."""
    out = _numel(outputs[0])
    bias = 0.0 if _is_none(inputs[2]) else 0.5 * out
    return out * _shape(inputs[0])[-1] + bias


def _einsum(inputs: list, outputs: list) -> float:
    """Two operands, no ellipsis: one FMA per point of the full index space (Π of all sizes).

    Raises:
        ValueError: another einsum form (this project emits none).
    """
    equation = inputs[0].toIValue().replace(" ", "")
    operands = [_shape(v) for v in inputs[1].node().inputs()]
    terms = equation.split("->")[0].split(",")
    if len(operands) != 2 or "." in equation:
        raise ValueError(f"einsum {equation!r} with {len(operands)} operands has no FLOP rule")
    sizes = {c: n for term, shape in zip(terms, operands) for c, n in zip(term, shape)}
    return float(math.prod(sizes.values()))


def _sdpa(inputs: list, outputs: list) -> float:
    """SDPA, q (…, T, E), k (…, S, E), v (…, S, Ev): QKᵀ and AV contractions (…·T·S·E and
    …·T·S·Ev FMA) plus per score: scale 1, softmax 5, a float mask 1 FLOP. Causal = dense: the
    mask is applied to the full T×S score matrix (not halved); a bool mask or is_causal costs 0."""
    q, v = _shape(inputs[0]), _shape(inputs[2])
    scores = math.prod(q[:-1]) * _shape(inputs[1])[-2]
    mask = inputs[3]
    per_score = 6 + (0 if _is_none(mask) or mask.type().dtype() == torch.bool else 1)
    return float(scores * q[-1] + scores * v[-1]) + 0.5 * per_score * scores


_FREE_OPS = (
    "Int", "ScalarImplicit", "size", "embedding", "view", "view_as", "reshape", "reshape_as",
    "permute", "transpose", "t", "contiguous", "expand", "expand_as", "unsqueeze", "squeeze",
    "flatten", "unflatten", "unbind", "chunk", "split", "split_with_sizes", "narrow", "slice",
    "select", "index", "index_select", "pad", "constant_pad_nd", "cat", "stack", "to", "type_as",
    "detach", "clone", "dropout", "mT", "movedim",
    "new_zeros", "new_ones", "new_empty", "zeros", "zeros_like", "ones", "ones_like", "arange")

#: aten op → handle returning FMA, per docs/FLOPS.md. Every op the traced Decoder emits has one.
HANDLES: dict[str, Handle] = {
    **{f"aten::{op}": _free for op in _FREE_OPS},
    **{f"aten::{op}": _elementwise(1) for op in (
        "mul", "div", "neg", "square", "pow", "sqrt", "rsqrt", "exp", "log", "floor_divide",
        "maximum", "minimum")},
    "aten::add": _add_sub, "aten::sub": _add_sub, "aten::rsub": _add_sub,
    "aten::clamp": _clamp, "aten::clamp_min": _elementwise(1), "aten::clamp_max": _elementwise(1),
    "aten::sum": _reduction, "aten::mean": _reduction, "aten::amax": _reduction,
    "aten::max": _min_max, "aten::min": _min_max,
    "aten::rms_norm": _rms_norm, "aten::layer_norm": _layer_norm,
    "aten::softmax": _elementwise(5),
    "aten::linalg_vector_norm": _vector_norm,
    "aten::lerp": _elementwise(3), "aten::addcmul": _elementwise(2),
    "aten::silu": _elementwise(4), "aten::sigmoid": _elementwise(4), "aten::gelu": _gelu,
    "aten::tanh": _elementwise(1),
    "aten::linear": _linear, "aten::matmul": _contraction, "aten::mm": _contraction,
    "aten::bmm": _contraction, "aten::einsum": _einsum,
    "aten::scaled_dot_product_attention": _sdpa,
}


@dataclass(frozen=True)
class FlopCount:
    """Forward-pass count of one model on one input shape (units: FMA; FLOP = 2·FMA).

    Attributes:
        total_fma: FMA of the whole forward pass.
        by_operator: FMA per op name (``"linear"``, ``"rms_norm"`` …); zero-cost ops are absent.
        by_module: FMA per module name (``""`` is the whole model), fvcore's ``by_module()``.
        unsupported: aten ops without a handle → occurrences (empty for this project's models).
        router_fma: FMA of the ops run in the root module's own ``forward``, outside any call of a
            child module. In :class:`~workloads.decoder.Decoder` that is exactly the router's work
            (init_state, reads, writes, readout), which runs in ``Decoder.forward`` itself.
    """

    total_fma: float
    by_operator: dict[str, float]
    by_module: dict[str, float]
    unsupported: dict[str, int]
    router_fma: float

    @property
    def flops(self) -> float:
        """Forward FLOP = 2·FMA."""
        return 2.0 * self.total_fma


def count_fwd_flops(model: nn.Module, inputs: tuple | Tensor, *, strict: bool = True) -> FlopCount:
    """Count the forward FMA of ``model(*inputs)`` with fvcore and :data:`HANDLES`.

    Runs in eval mode under ``torch.no_grad()`` (the training flag is restored afterwards) with
    fvcore's and the tracer's warnings silenced. A ``torch.compile`` wrapper is unwrapped to its
    original module (fvcore cannot trace a compiled module).

    Args:
        model: the module; inputs must be concrete tensors (shapes are read from the trace).
        inputs: positional inputs of ``forward`` (a single tensor is accepted).
        strict: raise when an op has no handle; otherwise report it in ``unsupported``.

    Returns:
        A :class:`FlopCount` in FMA.

    Raises:
        UnsupportedOpError: ``strict`` and some traced aten op has no handle (all are listed).
        ValueError: an op whose arguments fall outside its FLOP rule (e.g. a 3-operand einsum).
    """
    model = getattr(model, "_orig_mod", model)  # torch.compile's OptimizedModule
    inputs = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            analysis = FlopCountAnalysis(model, inputs).clear_op_handles()
            analysis._ignored_ops = set()  # fvcore would drop clamp, cat, max … without a word
            analysis.set_op_handle(**HANDLES)
            analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
            analysis.tracer_warnings("none")
            by_module = {k: float(v) for k, v in analysis.by_module().items()}
            by_operator = {k: float(v) for k, v in analysis.by_operator().items()}
            unsupported = dict(analysis.unsupported_ops())
            children = {analysis.canonical_module_name(n) for n, _ in model.named_children()}
    finally:
        model.train(was_training)
    if strict and unsupported:
        raise UnsupportedOpError(
            f"{type(model).__name__}: no FLOP handle for {sorted(unsupported)}; add them to "
            "harness.costs.flops.HANDLES following docs/FLOPS.md")
    router_fma = by_module[""] - sum(by_module.get(n, 0.0) for n in children)
    return FlopCount(by_module[""], by_operator, by_module, unsupported, router_fma)


class _RouterProbe(nn.Module):
    """Runs a router alone: forward(e, u_0, …, u_{2L-1}) → (h_0, …, h_{2L-1}, h_out)."""

    def __init__(self, router: nn.Module) -> None:
        super().__init__()
        self.router = router

    def forward(self, e: Tensor, *updates: Tensor) -> tuple[Tensor, ...]:
        if len(updates) != len(self.router.slots):
            raise ValueError(f"{len(updates)} updates for {len(self.router.slots)} sublayers")
        reads, h_out, _ = route(self.router, e, lambda slot, h: updates[slot.index])
        return (*reads, h_out)


def count_router_fma(router: nn.Module, batch_size: int, seq_len: int,
                     dtype: torch.dtype = torch.float32) -> float:
    """Forward FMA of a router's mixing alone (every read, write and the readout), counted on a
    probe that takes e and the 2L updates as inputs, with the same handles as the decoder.

    Equals ``count_fwd_flops(decoder, …).router_fma`` for the same shape.

    Args:
        router: a :class:`routers.Router` (not modified; a copy is cast to ``dtype``).
        batch_size: B.
        seq_len: T.
        dtype: dtype of e, the updates and the router copy.

    Returns:
        FMA (float; FLOP = 2·FMA).

    Raises:
        UnsupportedOpError: the router emits an op without a handle.
    """
    probe = _RouterProbe(copy.deepcopy(router).to(dtype))
    shape = (batch_size, seq_len, router.d_model)
    inputs = tuple(torch.zeros(shape, dtype=dtype) for _ in range(len(router.slots) + 1))
    return count_fwd_flops(probe, inputs).total_fma
