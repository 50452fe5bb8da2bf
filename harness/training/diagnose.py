"""What a trained router learned: depth-softmax weights, detail share, detail biases and the
hidden-state RMS by depth, from the last checkpoint of each training run of a run directory
(``routerbench diagnose``; figures and CSVs in :mod:`reports.diagnose`).

Each run's decoder is rebuilt with its router and options but the ``naive`` implementation (the
one whose softmax weights are visible, through ``BlockRouter.weight_recorder``), its checkpoint
loaded, and run in eval mode without grad on fixed validation batches of the run's corpus
(:func:`workloads.batches.fixed_val_batches`, the batches its evaluations used when ``batches``
equals its ``eval_batches``), in float32 (a ``bf16-mixed`` run is diagnosed without autocast).

- **Depth weights** (Attention Residuals, arXiv:2603.15031; WAV v1 / HAARES, arXiv:2606.06564):
  for each read (sublayer k = 0..2L−1, then the readout, read 2L) the softmax weight α_j of each
  source, averaged over batches, sequences and positions. Sources are named as in ROUTERS.md:
  ``e`` (embedding), ``C1``..``CN`` (completed-block summaries; the paper's b_0 is ``e``), ``P``
  (partial block), ``D<b>.<kind>`` / ``P.<kind>`` (RMS-matched detail bases, kind ``split`` or
  ``phase``) and, for ``full_attnres``, ``u0``..``u{2L−1}`` (each earlier sublayer's update).
- **Hidden-state RMS** (the AttnRes paper's view of PreNorm dilution): per token
  ``sqrt(mean_d h²)`` of the input h_k of each sublayer (before its own RMSNorm), of h_out (the
  input of the final norm, depth 2L), and of each update u_k, averaged over tokens; for
  ``prenorm`` h_{k+1} = h_k + u_k is the residual stream after sublayer k.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from harness.rundir.records import MANIFEST_FILE, RECORDS_FILE, load_rows
from routers import impls, router_options
from routers.attnres import FullAttnRes
from routers.block.router import BlockRouter
from routers.errors import ConfigError
from workloads.batches import fixed_val_batches
from workloads.config import DecoderConfig
from workloads.data import CharCorpus, default_corpus
from workloads.decoder import Decoder

from .checkpoint import CHECKPOINT_DIR, RunInProgress, checkpoint_dir, newest_checkpoint, read_checkpoint
from .config import TRAIN_MODES


@dataclasses.dataclass(frozen=True)
class TrainedRun:
    """One training run of a run directory and its latest checkpoint.

    Attributes:
        key: the run's case key (``harness.training.config.train_case_key``), also stored in the checkpoint.
        label: short unique name for files and legends (``haares-seed0``, ``prenorm-seed10000-pilot``).
        mode, router, options, seed: from its records rows.
        cfg: the decoder shape it was built with (parsed from the key, checked against the rows).
        checkpoint: ``checkpoints/<run hash>/final-step-N.pt`` (the weights a finished run ended
            with), else the resume checkpoint ``step-N.pt`` of a run in progress with the largest
            N; ``step`` is N.
    """

    key: str
    label: str
    mode: str
    router: str
    options: dict
    seed: int
    cfg: DecoderConfig
    checkpoint: Path
    step: int


def _decoder_config(key: str) -> DecoderConfig:
    """The ``DecoderConfig(...)`` field of a case key, read back with ``ast.literal_eval`` per field.

    Raises:
        ConfigError: the key holds no readable decoder shape.
    """
    part = next((p for p in key.split("|") if p.startswith("DecoderConfig(")), None)
    try:
        call = ast.parse(part, mode="eval").body
        return DecoderConfig(**{kw.arg: ast.literal_eval(kw.value) for kw in call.keywords})
    except (SyntaxError, ValueError, TypeError, AttributeError) as exc:
        raise ConfigError(f"RUN_DIR: run {key[:60]}…: its case key holds no readable decoder shape "
                          f"({exc})") from None


def find_trained_runs(run_dir: Path | str, notes: list[str] | None = None) -> list[TrainedRun]:
    """The training runs of ``run_dir`` (rows of mode ``train`` or ``pilot``) that have a checkpoint.

    Args:
        run_dir: a run directory of ``routerbench train`` (or of ``run`` with a smoke race).
        notes: when a list, one line per run without a checkpoint is appended to it, and one for
            the runs whose checkpoint has no committed evaluation yet (a run in progress).

    Returns:
        one :class:`TrainedRun` per run with a checkpoint, in records order.

    Raises:
        ConfigError: ``run_dir`` is not a directory, holds no training runs, or none of them has a
            checkpoint (one line naming ``run_dir``); :class:`RunInProgress` when it holds
            checkpoints but no evaluation committed yet.
    """
    d = Path(run_dir)
    if not d.is_dir():
        raise ConfigError(f"RUN_DIR: {d} is not a directory; give results/<device>/<run-id>")
    first: dict[str, dict[str, Any]] = {}
    for r in load_rows([d]):
        key = r.get("case_key") or ""
        if r.get("mode") in TRAIN_MODES and key.startswith(f"{r['mode']}|"):
            first.setdefault(key, r)
    known = {checkpoint_dir(d, key).name for key in first}
    early = [p for p in sorted((d / CHECKPOINT_DIR).glob("*")) if p.name not in known and newest_checkpoint(p)]
    if not first and early:
        raise RunInProgress(f"RUN_DIR: {d} is in progress: {len(early)} training run(s) have a checkpoint but "
                            "no evaluation committed yet; diagnose again after their first evaluation")
    if not first:
        what = f"no rows of mode train, pilot or study in its {RECORDS_FILE}" if (d / RECORDS_FILE).exists() \
            else f"it has no {RECORDS_FILE}"
        raise ConfigError(f"RUN_DIR: {d} holds no training runs ({what}); give the run dir of `routerbench train`")
    if early and notes is not None:
        notes.append(f"{len(early)} more run(s) have a checkpoint but no evaluation committed yet "
                     "(in progress), skipped")
    depths = {r.get("n_layers") for r in first.values()}
    labels = {k: f"{r['router']}" + (f"-L{r['n_layers']}" if len(depths) > 1 else "") + f"-seed{r['seed']}"
              + ("-pilot" if r["mode"] == "pilot" else "") for k, r in first.items()}
    counts = {lab: list(labels.values()).count(lab) for lab in labels.values()}
    runs = []
    for key, r in first.items():
        label = labels[key] + (f"-{hashlib.sha1(key.encode()).hexdigest()[:6]}" if counts[labels[key]] > 1 else "")
        found = newest_checkpoint(checkpoint_dir(d, key))
        if found is None:
            if notes is not None:
                notes.append(f"{label}: no checkpoint, skipped")
            continue
        step, path = found
        cfg = _decoder_config(key)
        if (cfg.d_model, cfg.n_layers) != (r.get("d_model"), r.get("n_layers")):
            raise ConfigError(f"RUN_DIR: run {label}: its case key says d_model/n_layers "
                              f"{cfg.d_model}/{cfg.n_layers}, its rows {r.get('d_model')}/{r.get('n_layers')}")
        options = r.get("router_options") or {}
        options = json.loads(options) if isinstance(options, str) else dict(options)
        runs.append(TrainedRun(key, label, r["mode"], r["router"], options, int(r["seed"]), cfg, path, step))
    if not runs:
        raise ConfigError(f"RUN_DIR: {d} holds {len(first)} training run(s) but no checkpoint "
                          f"({CHECKPOINT_DIR}/<run>/final-step-N.pt or step-N.pt; a diverged run keeps none) to diagnose")
    return runs


def run_corpus(run_dir: Path | str, run: TrainedRun, data: str | Path | None = None) -> CharCorpus:
    """The corpus ``run`` trained on: ``data`` when given, else the one its manifest records
    (rebuilt from the stdlib when that was the embedded corpus and its cache is gone).

    Raises:
        ConfigError: the corpus cannot be opened, or its sha256 is not the run's (naming ``--data``).
    """
    want = run.key.rsplit("|", 1)[-1]
    if data is not None:
        corpus = CharCorpus.open(data, "--data")
        if not corpus.sha256.startswith(want):
            raise ConfigError(f"--data {data}: corpus sha256 {corpus.sha256[:12]} is not that of run "
                              f"{run.label} ({want}); give the corpus it trained on")
        return corpus
    path = Path(run_dir) / MANIFEST_FILE
    manifest = json.loads(path.read_text()) if path.exists() else {}
    infos = [s.get("corpus") for s in manifest.get("sessions", [])] + [manifest.get("corpus")]
    info = next((c for c in infos if c and str(c.get("sha256", "")).startswith(want)), None)
    if info is not None and Path(info.get("path", "")).is_dir():
        return CharCorpus.open(info["path"], f"the corpus of {MANIFEST_FILE}")
    if info is not None and str(info.get("source", "")).startswith("python stdlib"):
        corpus = default_corpus(Path.home() / ".cache" / "routerbench")
        if corpus.sha256.startswith(want):
            return corpus
    where = f" ({info.get('path')})" if info else ""
    raise ConfigError(f"RUN_DIR: the corpus of run {run.label}{where}, sha256 {want}, cannot be found "
                      "here; give it with --data DIR")


def load_model(run: TrainedRun, device: torch.device | str = "cpu",
               state: dict[str, Any] | None = None) -> Decoder:
    """The decoder of ``run`` with its checkpoint's weights (``state``, else read by
    :func:`read_checkpoint`), ``impl`` forced to ``naive``, in eval mode on ``device``.

    Raises:
        ConfigError: the checkpoint belongs to another run or does not fit the rebuilt model;
            :class:`RunInProgress` from :func:`read_checkpoint`.
    """
    options = dict(run.options)
    if "impl" in router_options(run.router):
        options["impl"] = impls.REFERENCE
    model = Decoder(run.cfg, run.router, options)
    if state is None:
        run, state = read_checkpoint(run)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise ConfigError(f"RUN_DIR: checkpoint {run.checkpoint} does not fit {run.router} ({first})") from None
    return model.to(device).eval()


def source_labels(router: BlockRouter, read: int, kinds: tuple) -> list[tuple[str, str, int]]:
    """``(name, kind, order)`` of each source of one read, in pool order; kind is ``state`` or
    ``detail``; order is the sort key of the heatmap's columns: e, then each block's summary and
    its details in block order (``u0``, ``u1``… for ``full_attnres``), then P and its details.

    Args:
        router: a router of the Attention Residuals family (``block_attnres``, ``full_attnres``,
            ``haares``, ``wav_v1``).
        read: the pseudo-query index, sublayer k or 2L for the readout.
        kinds: the pool's source kinds as the router reports them (``weight_recorder``).
    """
    n_done = router.n_blocks if read == len(router.slots) else router.slots[read].block - 1
    full = isinstance(router, FullAttnRes)
    width = 1 + len(router.detail_kinds)  # a block's summary and its details
    last = len(router.slots) + 2  # P's place: after every block
    out, block, partial = [("e", "state", 0)], 0, False
    for k in kinds[1:]:
        if k is None:
            partial = block >= n_done
            block += 0 if partial else 1
            name = "P" if partial else f"u{block - 1}" if full else f"C{block}"
            out.append((name, "state", (last if partial else block) * width))
        else:
            kind = router.detail_kinds[k]
            name = f"P.{kind}" if partial else f"D{block}.{kind}"
            out.append((name, "detail", (last if partial else block) * width + 1 + k))
    return out


def read_label(read: int, n_sublayers: int) -> str:
    """``"3 mlp"`` for sublayer 3, ``"out"`` for the readout (read 2L)."""
    return "out" if read == n_sublayers else f"{read} {'attn' if read % 2 == 0 else 'mlp'}"


def _token_rms(x: Tensor) -> float:
    """Per-token RMS over d of x (B, T, d), averaged over the B·T tokens (float64)."""
    return float(x.detach().double().square().mean(dim=-1).sqrt().mean())


@torch.no_grad()
def diagnose_model(model: Decoder, batches: list, device: torch.device | str = "cpu") -> dict[str, list[dict]]:
    """Depth weights, detail biases and hidden-state RMS of ``model`` on ``batches``.

    Args:
        model: a decoder whose router, if of the AttnRes family, runs the ``naive`` path.
        batches: ``[(x, y), …]`` token ids (B, T) (``y`` unused); every batch the same shape.
        device: where the batches go.

    Returns:
        ``{"weights": […], "bias": […], "rms": […]}``, lists of row dicts:
        weights ``read, read_label, source, source_kind, order, weight`` (mean softmax weight,
        unitless, summing to 1 over a read's sources); bias ``read, read_label, kind, bias, init,
        used`` (the stored logit bias of each detail kind, whether that read's pool holds a detail
        of that kind); rms ``depth, depth_label, quantity (read_input | update), rms``. Lists are
        empty where the router has no such thing (no softmax: no weights; no details: no bias).

    Raises:
        ValueError: the router is an AttnRes router on its ``two_phase`` path (no weights visible).
    """
    model.eval()
    r = model.router
    n = len(r.slots)
    mixing = isinstance(r, BlockRouter)
    if mixing and r.impl != impls.REFERENCE:
        raise ValueError(f"{r.name}: impl {r.impl!r} hides its weights; rebuild it with impl='naive'")
    sums: dict[int, list] = {}          # read -> [kinds, Σ over batches of mean α (n,), batches]
    rms_in, rms_up = [0.0] * (n + 1), [0.0] * n

    def record(read: int, kinds: tuple, alpha: Tensor) -> None:
        mean = alpha.double().mean(dim=(1, 2)).cpu()                   # (n_sources,)
        entry = sums.setdefault(read, [kinds, torch.zeros_like(mean), 0])
        entry[1] += mean
        entry[2] += 1

    def pre(k: int) -> Callable:
        def hook(module, args):
            rms_in[k] += _token_rms(args[0])
        return hook

    def post(k: int) -> Callable:
        def hook(module, args, output):
            rms_up[k] += _token_rms(output)
        return hook

    handles = [f.register_forward_pre_hook(pre(k)) for k, f in enumerate(model.sublayers)]
    handles += [f.register_forward_hook(post(k)) for k, f in enumerate(model.sublayers)]
    handles.append(model.norm.register_forward_pre_hook(pre(n)))
    if mixing:
        r.weight_recorder = record
    try:
        for x, _ in batches:
            model(x.to(device))
    finally:
        for h in handles:
            h.remove()
        if mixing:
            del r.weight_recorder                                      # back to the class's None
    nb = len(batches)
    out: dict[str, list[dict]] = {"weights": [], "bias": [], "rms": []}
    for read in sorted(sums):
        kinds, total, count = sums[read]
        for (name, kind, order), w in zip(source_labels(r, read, kinds), (total / count).tolist()):
            out["weights"].append({"read": read, "read_label": read_label(read, n), "source": name,
                                   "source_kind": kind, "order": order, "weight": w})
    if mixing and r.detail_kinds:
        seen = {read: {k for k in kinds if k is not None} for read, (kinds, _, _) in sums.items()}
        for read, row in enumerate(r.detail_bias.detach().double().cpu().tolist()):
            for j, (kind, b) in enumerate(zip(r.detail_kinds, row)):
                out["bias"].append({"read": read, "read_label": read_label(read, n), "kind": kind,
                                    "bias": b, "init": r.detail_bias_init, "used": j in seen.get(read, ())})
    for k in range(n + 1):
        out["rms"].append({"depth": k, "depth_label": read_label(k, n), "quantity": "read_input",
                           "rms": rms_in[k] / nb})
        if k < n:
            out["rms"].append({"depth": k, "depth_label": read_label(k, n), "quantity": "update",
                               "rms": rms_up[k] / nb})
    return out


def diagnose_run_dir(run_dir: Path | str, batches: int = 4, data: str | Path | None = None,
                     device: torch.device | str = "cpu",
                     notes: list[str] | None = None) -> list[tuple[TrainedRun, dict[str, list[dict]]]]:
    """:func:`diagnose_model` for every training run of ``run_dir`` with a checkpoint.

    Args:
        run_dir: the run directory.
        batches: fixed validation batches per run (of the run's batch size and sequence length).
        data: the corpus dir, when the one the manifest records is not here.
        device: where the models run.
        notes: receives one line per run skipped (without a checkpoint, in progress: its
            checkpoints replaced while being read, :func:`read_checkpoint`, or of a router whose
            plugin, recorded by the run, cannot be loaded here: :func:`harness.rundir.plugins.load_for`)
            and per run read from a resume checkpoint (``step-N.pt``: the run has not finished),
            naming its step.

    Returns:
        ``[(run, diagnosis), …]``, one per run, in records order (a run read from a newer
        checkpoint than :func:`find_trained_runs` chose carries that one and its step).

    Raises:
        ConfigError: from :func:`find_trained_runs`, :func:`run_corpus` or :func:`load_model`,
            ``batches`` < 1, or every run of a router not loaded here; :class:`RunInProgress` when every run with a checkpoint is in progress.
    """
    if batches < 1:
        raise ConfigError(f"--batches must be >= 1, got {batches}")
    out, corpora = [], {}
    in_progress: list[RunInProgress] = []
    notes = [] if notes is None else notes
    from harness.rundir.plugins import load_for
    from routers import ROUTERS
    notes += [f"Plugins: {n}" for n in load_for([run_dir])]  # the plugins the run recorded
    missing = []
    for run in find_trained_runs(run_dir, notes):
        if run.router not in ROUTERS:  # its plugin is not loaded here (said above)
            missing.append(run.router)
            notes.append(f"{run.label}: router {run.router} is not loaded here (its plugin is missing), skipped")
            continue
        try:
            run, state = read_checkpoint(run)
        except RunInProgress as exc:
            in_progress.append(exc)
            notes.append(f"{run.label}: in progress (its checkpoint was replaced while being read), skipped")
            continue
        if not state.get("final"):
            notes.append(f"{run.label}: read at step {run.step}, from its resume checkpoint (the run has "
                         "not finished: in progress or stopped)")
        sha = run.key.rsplit("|", 1)[-1]
        if sha not in corpora:
            corpora[sha] = run_corpus(run_dir, run, data)
        val = fixed_val_batches(corpora[sha].val, run.cfg.batch_size, run.cfg.seq_len, batches)
        out.append((run, diagnose_model(load_model(run, device, state), val, device)))
    if not out and in_progress:
        raise in_progress[0] if len(in_progress) == 1 else RunInProgress(
            f"RUN_DIR: {Path(run_dir)}: all {len(in_progress)} runs with a checkpoint are in progress "
            "(their checkpoints were replaced while being read); diagnose again when they end")
    if not out and missing:
        raise ConfigError(f"RUN_DIR: {Path(run_dir)}: every run with a checkpoint is of a router not loaded "
                          f"here ({', '.join(sorted(set(missing)))}): install or give its plugin (--plugin)")
    return out
