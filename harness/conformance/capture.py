"""No host synchronisation: one ``fwd_bwd`` step of a tiny decoder with the router, under the
model scope and under the layer scope's region forms (run eagerly), checked by the capture guard
(:func:`harness.step.guard.capture_findings`). Each guard finding is one failed line at the file
and line that did it (a plugin's own file, even installed in site-packages)."""

from __future__ import annotations

import torch

from harness.step.guard import capture_findings
from harness.step.modes import make_step
from workloads.config import DecoderConfig
from workloads.decoder import Decoder, Regions

from .findings import Finding

#: The tiny decoder of the step checks (2 layers, d = 16, B = 2, T = 8).
CFG = DecoderConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, seq_len=8, batch_size=2)
#: What to change, per guard finding kind.
FIX = {"list_index": "index with a tensor made once in __init__ (a buffer) or with slices, not a Python list",
       "host_tensor": "make it once in __init__ (register_buffer) or with x.new_*/torch.*_like on the step's device",
       "host_sync": "keep the value on the device (no .item()/.tolist()/.cpu(), no Python if on a tensor; "
                    "torch.where for a branch)"}


def tiny_model(name: str, options: dict | None = None, cfg: DecoderConfig = CFG, device: str = "cpu",
               seed: int = 0) -> Decoder:
    """A decoder with router ``name`` and its router's parameters moved by 0.3·N(0, 1) (seeded)."""
    torch.manual_seed(seed)
    model = Decoder(cfg, name, dict(options or {}))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.router.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))
    return model.to(device)


def tokens(cfg: DecoderConfig = CFG, device: str = "cpu", seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y): random token ids (B, T) and the targets (x shifted by one)."""
    x = torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.seq_len), generator=torch.Generator().manual_seed(seed))
    x = x.to(device)
    return x, torch.roll(x, -1, 1)


def capture_safety(name: str, options: dict | None = None, device: str = "cpu") -> list[Finding]:
    """The guard's findings over a ``fwd_bwd`` step under each compile scope (module doc).

    Returns:
        one passed ``capture`` finding, or one failed finding per (kind, file, line) found.
    """
    found, scopes = {}, []
    for scope in ("model", "layer"):
        model = tiny_model(name, options, device=device)
        if scope == "layer":
            model.regions = Regions()
        x, y = tokens(device=device)
        try:
            for f in capture_findings(make_step(model, "fwd_bwd", x, y), device):
                found.setdefault((f.kind, f.file, f.line), (f, scope))
        except NotImplementedError:  # no region form: the graphs check says so
            continue
        scopes.append(scope)
    if not found:
        return [Finding("capture", True, "", f"0 host syncs (fwd_bwd, {' and '.join(scopes)} scope)")]
    return [Finding("capture", False, f"{f}; {FIX[f.kind]}", f"{scope} scope") for f, scope in found.values()]
