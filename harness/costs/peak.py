"""Peak FLOP/s by device name, model FLOPs per step, tokens/s and MFU (MEASUREMENT.md, "FLOPs";
conventions in docs/FLOPS.md, "MFU").

The peak table follows torchtitan's ``get_peak_flops`` (``torchtitan/tools/utils.py``): dense
(non-sparse) BF16 tensor-core throughput looked up by the device's name, from the vendors'
datasheets. Unlike torchtitan, which falls back to the A100 figure, an unknown device (and every
CPU) has no peak here, and its MFU stays blank. The BF16 peak is the denominator whatever the
run's dtype, so a float32 run shows the utilisation of the chip's BF16 capability.
"""

from __future__ import annotations

import re

#: (regex searched case-insensitively in the device name, dense BF16 FLOP/s, source). First match
#: wins, so a specific name comes before a name it contains ("GB200" before "B200", "H100 PCIe"
#: before "H100", "A100" before "A10").
PEAK_BF16_FLOPS: tuple[tuple[str, float, str], ...] = (
    (r"gb200", 2.5e15, "NVIDIA GB200 NVL72 datasheet, per GPU"),
    (r"b200", 2.25e15, "NVIDIA Blackwell datasheet (HGX B200); torchtitan"),
    (r"h200.*\b(nvl|pcie)\b", 836e12, "NVIDIA H200 NVL datasheet"),
    (r"h200", 989e12, "NVIDIA H200 SXM datasheet; torchtitan"),
    (r"h100.*\bnvl\b", 835e12, "NVIDIA H100 NVL datasheet; torchtitan"),
    (r"h100.*\bpcie\b", 756e12, "NVIDIA H100 PCIe datasheet; torchtitan"),
    (r"h100", 989e12, "NVIDIA H100 SXM datasheet (e.g. 'NVIDIA H100 80GB HBM3'); torchtitan"),
    (r"a100", 312e12, "NVIDIA A100 datasheet; torchtitan"),
    (r"\ba10g\b", 125e12, "no public A10G datasheet: taken equal to the A10"),
    (r"\ba10\b", 125e12, "NVIDIA A10 datasheet"),
    (r"\bl40s\b", 362e12, "NVIDIA L40S datasheet (733 TFLOPS with sparsity); torchtitan"),
    (r"\bl4\b", 121e12, "NVIDIA L4 datasheet (242 TFLOPS with sparsity)"),
    (r"rtx 4090", 165.2e12, "NVIDIA Ada GPU architecture whitepaper, FP32 accumulate"),
    (r"mi300x", 1307.4e12, "AMD Instinct MI300X datasheet; torchtitan"),
)


def peak_flops(device_name: str | None, device_type: str | None = None) -> float | None:
    """Dense BF16 peak of a device, in FLOP/s.

    Args:
        device_name: e.g. ``"NVIDIA H100 80GB HBM3"`` (``torch.cuda.get_device_name``, the
            ``environment.device_name`` of a run's manifest.json).
        device_type: ``"cpu"``, ``"cuda"`` … when known; a CPU has no peak here.

    Returns:
        FLOP/s, or None for a CPU, an empty name or a device not in :data:`PEAK_BF16_FLOPS`.
    """
    if not device_name or (device_type or "").split(":")[0] == "cpu":
        return None
    for pattern, flops, _ in PEAK_BF16_FLOPS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return flops
    return None


#: Modes whose step is a forward and a backward (model FLOP = 3 × forward).
TRAINING_MODES = ("fwd_bwd", "train_step")


def tokens_per_step(mode: str, batch_size: int, seq_len: int) -> int:
    """Tokens one step processes: B·T, or B for ``decode`` (one new token per sequence)."""
    return batch_size if mode == "decode" else batch_size * seq_len


def model_flops_per_step(mode: str, *, n_matrix: float, n_layers: int, d_model: int,
                         seq_len: int, batch_size: int, router_fwd_flops: float | None,
                         attention: bool = True) -> float:
    """Model FLOP of one step, the numerator of MFU (docs/FLOPS.md, "MFU").

    Per token, forward: 2·N (N = ``n_matrix``, the sublayers' weight matrices; embedding, LM
    head, norm gains and router parameters excluded) + 4·L·d·T (QKᵀ and AV over T positions,
    causal not halved; only with ``attention``) + the router's analytic mixing. A training step
    (:data:`TRAINING_MODES`) is 3 × forward: 6·N + 12·L·d·T per token (PaLM, Chowdhery et al.
    2022, App. B; nanoGPT) + 3 × the router term. ``decode`` processes B tokens against a cache of
    T positions (forward only).

    Args:
        mode: ``fwd``, ``fwd_bwd``, ``train_step`` or ``decode``.
        n_matrix: N, parameter count.
        router_fwd_flops: the router's analytic forward FLOP for B·T tokens
            (``Router.analytic_fwd_flops(B, T)``); scaled by tokens for ``decode``; None (or NaN)
            where the router declares none.
        attention: False for the ``router_only`` workload (no attention sublayers).

    Returns:
        FLOP per step; NaN where the router's FLOPs are not declared (never a count without them).

    Raises:
        ValueError: unknown mode.
    """
    if mode not in ("fwd", "decode", *TRAINING_MODES):
        raise ValueError(f"unknown mode {mode!r}: one of fwd, fwd_bwd, train_step, decode")
    if router_fwd_flops is None:
        return float("nan")
    tokens = tokens_per_step(mode, batch_size, seq_len)
    per_token = 2 * n_matrix + (4 * n_layers * d_model * seq_len if attention else 0)
    router = router_fwd_flops * tokens / (batch_size * seq_len)
    factor = 3 if mode in TRAINING_MODES else 1
    return factor * (per_token * tokens + router)


def mfu(flops_per_step: float, step_s: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation, a fraction: (FLOP per step / step time in s) / peak FLOP/s;
    None when the peak is unknown."""
    if peak is None or not step_s > 0:
        return None
    return flops_per_step / step_s / peak
