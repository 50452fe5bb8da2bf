"""Time to a target loss (MEASUREMENT.md, "Time to target loss").

Protocol, modelled on MLPerf Training and the modded-nanogpt speedrun:

1. Untimed initialisation and warm-up steps (allocator, kernels), then weights, optimizer and data
   order are reset to their seeded initial state, so the warm-up cannot help the timed run.
2. AdamW (weight decay on matrices only), linear LR warm-up then cosine decay to 10 %.
3. Every ``eval_every`` steps (and at step 0 and the last step) the mean loss on fixed validation
   batches is computed **off the clock** (the clock is paused and resumed around it).
4. The first evaluation with ``val_loss <= target`` stops the target clock: wall time, steps and
   tokens to target are recorded. Training goes on to the step budget (unless
   ``stop_at_target``) so the loss at the fixed token budget, the papers' own metric, is known.
5. A run that never reaches the target is a ``not_converged`` row, never dropped; a non-finite
   loss ends the run as ``diverged``.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch
from tqdm import tqdm

from routers import router_options as _router_options
from routers.errors import ConfigError
from workloads.config import DecoderConfig
from workloads.data import CharCorpus, fixed_val_batches, random_batches
from workloads.decoder import Decoder, decay_groups

from .modes import lm_loss
from .rundir import StagingWriter
from .timing import synchronize


@dataclass(frozen=True)
class TrainConfig:
    """One training race.

    Attributes:
        cfg: decoder shape (``vocab_size`` is taken from the corpus).
        target_loss: validation loss (nats) that stops the target clock.
        max_steps: step budget; the token budget is ``max_steps · batch_size · seq_len``.
        eval_every: evaluation cadence in optimizer steps.
        eval_batches: fixed validation batches per evaluation.
        lr: peak learning rate; ``warmup_steps`` of linear warm-up, then cosine to ``0.1·lr``.
        weight_decay: AdamW decay on weight matrices (never on router parameters or gains).
        grad_clip: global gradient-norm clip (0 disables).
        untimed_warmup: steps run before the clock starts, then undone.
        stop_at_target: end the run when the target is reached.
    """

    cfg: DecoderConfig
    target_loss: float
    max_steps: int = 300
    eval_every: int = 25
    eval_batches: int = 4
    lr: float = 3e-3
    warmup_steps: int = 20
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    untimed_warmup: int = 3
    stop_at_target: bool = False

    def __post_init__(self) -> None:
        if not (self.target_loss > 0 and math.isfinite(self.target_loss)):
            raise ConfigError(f"--target-loss must be a positive number of nats, got {self.target_loss!r}")
        for name in ("max_steps", "eval_every", "eval_batches"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ConfigError(f"--lr must be > 0, got {self.lr}")

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step ``step`` (0-based)."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(1, self.max_steps - self.warmup_steps)
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def train_options(router: str, options: dict) -> dict:
    """The options a training run of ``router`` is built with (``impl`` dropped where the router
    has a single implementation)."""
    if "impl" not in _router_options(router):
        return {k: v for k, v in options.items() if k != "impl"}
    return dict(options)


def train_case_key(router: str, options: dict, tc: TrainConfig, seed: int, corpus_sha: str) -> str:
    """Identity of one training run inside a results directory (the unit of resume)."""
    options = train_options(router, options)
    fields = {k: v for k, v in asdict(tc).items() if k != "cfg"}
    return f"train|{router}|{sorted(options.items())}|{tc.cfg}|{sorted(fields.items())}|{seed}|{corpus_sha[:12]}"


@torch.no_grad()
def evaluate(model: Decoder, batches: list, device: torch.device) -> float:
    """Mean loss in nats over fixed validation batches (eval mode, no grad)."""
    model.eval()
    total = torch.zeros((), device=device)
    for x, y in batches:
        total += lm_loss(model(x.to(device)), y.to(device))
    model.train()
    return float(total) / len(batches)


def run_training(router: str, options: dict, corpus: CharCorpus, tc: TrainConfig, seed: int,
                 device: torch.device, w: StagingWriter, progress: bool = True) -> dict:
    """Train ``router`` on ``corpus`` to ``tc.target_loss``; append its rows to ``w``.

    Returns:
        summary dict: ``status`` (``ok``, ``not_converged`` or ``diverged``), ``time_to_target``
        (s or None), ``steps_to_target``, ``final_val_loss``.
    """
    cfg = tc.cfg.replace(vocab_size=corpus.vocab_size)
    options = train_options(router, options)
    key = train_case_key(router, options, tc, seed, corpus.sha256)
    cols = {"case_key": key, "router": router, "router_options": options,
            "impl": options.get("impl", "naive"), "backend": "eager", "mode": "train", "seed": seed,
            **cfg.shape_columns()}
    torch.manual_seed(seed)
    model = Decoder(cfg, router, options).to(device)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    val = fixed_val_batches(corpus.val, cfg.batch_size, cfg.seq_len, tc.eval_batches)
    tokens_per_step = cfg.batch_size * cfg.seq_len

    def fresh():
        model.load_state_dict(initial)
        opt = torch.optim.AdamW(decay_groups(model, tc.weight_decay), lr=tc.lr, betas=(0.9, 0.95),
                                fused=device.type == "cuda")
        return opt, torch.Generator().manual_seed(seed)

    def step(opt, gen, i: int) -> torch.Tensor:
        x, y = random_batches(corpus.train, cfg.batch_size, cfg.seq_len, gen)
        for g in opt.param_groups:
            g["lr"] = tc.lr_at(i)
        loss = lm_loss(model(x.to(device, non_blocking=True)), y.to(device, non_blocking=True))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if tc.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        return loss.detach()

    model.train()
    opt, gen = fresh()
    for i in range(tc.untimed_warmup):  # untimed; undone by fresh() below
        step(opt, gen, i)
    opt, gen = fresh()

    w.write(**cols, metric="target_loss", value=tc.target_loss, unit="nats")
    w.write(**cols, metric="token_budget", value=tc.max_steps * tokens_per_step, unit="tokens")
    elapsed, reached, status, val_loss = 0.0, None, "ok", float("nan")
    train_sum = torch.zeros((), device=device)
    bar = tqdm(total=tc.max_steps, desc=f"train {router} seed {seed}", unit="step", disable=not progress)

    def record_eval(s: int) -> float:
        loss = evaluate(model, val, device)
        for metric, value, unit in (("val_loss", loss, "nats"), ("elapsed", elapsed, "s"),
                                    ("tokens", s * tokens_per_step, "tokens")):
            w.write(**cols, metric=metric, value=value, unit=unit, repeat=s)
        return loss

    val_loss = record_eval(0)
    for s in range(1, tc.max_steps + 1):
        synchronize(device)
        t0 = time.perf_counter()
        train_sum += step(opt, gen, s - 1)
        if s % tc.eval_every and s != tc.max_steps:
            synchronize(device)
            elapsed += time.perf_counter() - t0
            bar.update()
            continue
        synchronize(device)
        elapsed += time.perf_counter() - t0  # the clock stops here: evaluation is off the clock
        n_since = tc.eval_every if s % tc.eval_every == 0 else s % tc.eval_every
        train_loss = float(train_sum) / n_since
        train_sum.zero_()
        w.write(**cols, metric="train_loss", value=train_loss, unit="nats", repeat=s)
        val_loss = record_eval(s)
        bar.update()
        bar.set_postfix(val_loss=f"{val_loss:.3f}")
        if not math.isfinite(val_loss) or not math.isfinite(train_loss):
            status = "diverged"
            w.write(**cols, metric="time_to_target", unit="s", status="diverged",
                    error=f"non-finite loss at step {s}")
            break
        if reached is None and val_loss <= tc.target_loss:
            reached = (elapsed, s)
            w.write(**cols, metric="time_to_target", value=elapsed, unit="s")
            w.write(**cols, metric="steps_to_target", value=s, unit="steps")
            w.write(**cols, metric="tokens_to_target", value=s * tokens_per_step, unit="tokens")
            if tc.stop_at_target:
                break
    bar.close()
    if status != "diverged":
        if reached is None:
            status = "not_converged"
            msg = f"val loss {val_loss:.4f} > target {tc.target_loss} after {tc.max_steps} steps"
            for metric, unit in (("time_to_target", "s"), ("steps_to_target", "steps"),
                                 ("tokens_to_target", "tokens")):
                w.write(**cols, metric=metric, unit=unit, status="not_converged", error=msg)
        if s == tc.max_steps:
            w.write(**cols, metric="loss_at_token_budget", value=val_loss, unit="nats")
        else:
            w.write(**cols, metric="loss_at_token_budget", unit="nats", status="skipped",
                    error="stopped at target before the token budget (--stop-at-target)")
    return {"status": status, "time_to_target": reached[0] if reached else None,
            "steps_to_target": reached[1] if reached else None, "final_val_loss": val_loss}
