"""Token batches: random training windows and fixed validation windows of a corpus split, and
synthetic tokens for pure cost runs. Every batch is drawn on the CPU from a seeded generator, so
a seed gives the same batches on every device."""

from __future__ import annotations

import numpy as np
import torch


def _check_split(data: np.ndarray, batch_size: int, seq_len: int) -> int:
    if seq_len < 1:
        raise ValueError(f"--seq-len must be >= 1, got {seq_len}")
    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
    if len(data) < seq_len + 1:
        raise ValueError(f"--seq-len {seq_len} needs at least {seq_len + 1} tokens in the split, which "
                         f"has {len(data)}; use a smaller --seq-len or a larger corpus")
    return len(data)


def _windows(data: np.ndarray, offsets: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    chunk = torch.from_numpy(np.asarray(data[offsets[:, None] + np.arange(seq_len + 1)], np.int64))
    return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


def random_batches(data: np.ndarray, batch_size: int, seq_len: int,
                   generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of random windows of ``data`` (1-D token ids), offsets drawn with ``generator``.

    Returns (x, y), CPU int64 tensors of shape (batch_size, seq_len) with y[:, t] == x[:, t+1] for
    t < seq_len-1 (y is x shifted by one token). A seeded CPU generator fixes the sequence of batches.
    Raises ValueError naming ``--seq-len`` when ``data`` has fewer than seq_len+1 tokens.
    """
    n = _check_split(data, batch_size, seq_len)
    offsets = torch.randint(0, n - seq_len, (batch_size,), generator=generator).numpy()
    return _windows(data, offsets, seq_len)


def fixed_val_batches(data: np.ndarray, batch_size: int, seq_len: int,
                      n_batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n_batches`` evaluation batches at evenly spaced offsets over ``data``; identical every call.

    Returns a list of (x, y) CPU int64 tensors of shape (batch_size, seq_len), y being x shifted by
    one. Windows overlap when the split is short. Raises ValueError naming ``--seq-len`` when
    ``data`` has fewer than seq_len+1 tokens, or naming ``n_batches`` when it is < 1.
    """
    n = _check_split(data, batch_size, seq_len)
    if n_batches < 1:
        raise ValueError(f"n_batches must be >= 1, got {n_batches}")
    offsets = np.linspace(0, n - seq_len - 1, batch_size * n_batches).round().astype(np.int64)
    return [_windows(data, o, seq_len) for o in offsets.reshape(n_batches, batch_size)]


def synthetic_batch(vocab_size: int, batch_size: int, seq_len: int, seed: int = 0,
                    device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform random tokens for pure cost runs, drawn on the CPU so a seed gives the same batch on
    every device.

    Returns (x, y), int64 tensors on ``device`` of shape (batch_size, seq_len), ids in
    [0, vocab_size), y being x shifted by one. Raises ValueError for a non-positive size.
    """
    for name, v in (("vocab_size", vocab_size), ("--batch-size", batch_size), ("--seq-len", seq_len)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=g)
    return tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)
