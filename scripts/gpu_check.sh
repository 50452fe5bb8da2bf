#!/usr/bin/env bash
# GPU check: the CUDA-only tests, then a small GPU sweep, then a short table of step times.
#
# For a CUDA machine that has PyTorch but maybe no network: it uses the python3 (and torch) that
# is already there, installs nothing, and runs the project from this checkout (PYTHONPATH).
# Needs pytest, pandas, click, tqdm, tabulate; fvcore and tomli-w are optional (FLOP rows become `skipped`).
# Budget: under 8 minutes on one GPU (one shape, 7 routers; compile only for fwd_bwd; no
# max-autotune; lean against two_phase; then three short training runs to a target, one per backend). Usage: bash scripts/gpu_check.sh [results-root]   (default /tmp/routerbench-gpu)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${1:-/tmp/routerbench-gpu}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no CUDA device visible to $PY; nothing to check" >&2
  exit 2
fi
"$PY" -c "import torch; print('gpu_check:', torch.cuda.get_device_name(0), '| torch', torch.__version__, '| CUDA', torch.version.cuda)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null || true

echo "== CUDA-only tests"
timeout 150 "$PY" -m pytest -q -p no:cacheprovider -m cuda tests/
tests_rc=$?

# Three benchmarks of the GPU suite (the pytest-benchmark path: CUDA-event times, extra_info),
# then the gate on their JSON (exit 3, inconclusive, is only a warning here).
echo "== benchmarks: 3 pairs of the GPU suite, then routerbench gate"
if "$PY" -c "import pytest_benchmark" 2>/dev/null; then
  timeout 120 "$PY" -m pytest -q -p no:cacheprovider tests/benchmarks --benchmark-only --bench-suite gpu \
    -k "d256L12 and fwd_bwd and (eager-haares[two_phase] or cudagraph-prenorm or compile-prenorm-vs-eager)" \
    --benchmark-json "$OUT/bench.json" --benchmark-columns=median,iqr,rounds
  "$PY" -m harness.cli gate "$OUT/bench.json" --rules .ci/gate.toml
  echo "gate exit status: $? (0 pass, 1 fail, 2 bad input, 3 inconclusive)"
else
  echo "pytest-benchmark is not installed: benchmarks skipped"
fi

# One shape large enough to be GPU-bound: d=1024, 4 layers, T=512, B=8, bf16.
shape=(--widths 1024 --depths 4 --n-heads 8 --seq-len 512 --batch-size 8 --dtype bfloat16)
common=(--routers prenorm,rezero,layerscale,full_attnres,block_attnres,haares,wav_v1 --impls two_phase
        --no-train --no-report --quiet --repeats 20 --warmup-s 1 --remeasure-s 10 --out "$OUT")
# Two runs (a run directory holds one spec): eager + cudagraph, then compile.
echo "== sweep: eager and cudagraph x fwd_bwd, train_step"
timeout 200 "$PY" -m harness.cli run "${shape[@]}" "${common[@]}" --run-id gpu-check-graph \
  --backends eager,cudagraph --modes fwd_bwd,train_step
echo "== sweep: compile (default mode) x fwd_bwd, layer and model scope in one paired group"
timeout 240 "$PY" -m harness.cli run "${shape[@]}" "${common[@]}" --run-id gpu-check-compile \
  --backends compile --compile-scope layer,model --modes fwd_bwd

# Implementations of block_attnres at one shape, bf16, fwd_bwd (at most ~3 minutes): every impl
# available here eager (naive, two_phase and each peer kernel, each checked against naive before it
# is timed: harness/sweep/parity.py), two_phase compiled, on the decoder and the router_only workload.
# The machine has no network: to have the peers, build their wheels where there is one
#   pip download 'fla-core>=0.6' 'liger-kernel>=0.8.5' 'flash-attn-res>=0.1.12' 'fast-attnres>=2.1' \
#       'triton==3.7.1' einops --no-deps -d shared/wheels
# (shared/ travels with the working tree), then here: pip install --no-index --no-deps shared/wheels/*.whl
if [ -d shared/wheels ] && ls shared/wheels/*.whl >/dev/null 2>&1; then
  echo "== installing the peer kernels from shared/wheels (no index)"
  "$PY" -m pip install -q --no-index --no-deps shared/wheels/*.whl || echo "peer wheels did not install"
fi
"$PY" -m harness.cli list | sed -n '/^implementations/,/^backends/p' | sed '$d'
impl_shape=(--routers block_attnres --widths 1024 --depths 8 --n-heads 8 --seq-len 1024 --batch-size 4
            --dtype bfloat16 --modes fwd_bwd --no-train --no-report --quiet --repeats 10 --warmup-s 0.5
            --remeasure-s 5 --out "$OUT")
for wl in decoder router_only; do
  echo "== impls: block_attnres, $wl, every impl eager"
  timeout 60 "$PY" -m harness.cli run "${impl_shape[@]}" --workload $wl --backends eager \
    --impls naive,two_phase,fla,liger,flash_attn_res,fast_attnres --run-id gpu-check-impls-$wl
done
echo "== impls: block_attnres two_phase compiled (decoder)"
timeout 60 "$PY" -m harness.cli run "${impl_shape[@]}" --workload decoder --backends compile --impls two_phase \
  --run-id gpu-check-impls-compile
impl_dirs=$(ls -d "$OUT"/*/gpu-check-impls-* 2>/dev/null)
[ -n "$impl_dirs" ] && "$PY" -m harness.cli report $impl_dirs --out "$OUT/impls-report" >/dev/null \
  && sed -n '/^## Implementations/,/^## /p' "$OUT/impls-report/report.md" | head -n 30

# lean against two_phase (routers/lean.py): CUDA peak memory and step time of the memory-lean
# backward, eager and compiled (model scope), bf16, fwd_bwd, one paired group per backend.
echo "== lean vs two_phase: CUDA peak memory and step time (haares, wav_v1; bf16 fwd_bwd)"
timeout 150 "$PY" -m harness.cli run --routers prenorm,haares,wav_v1 --impls two_phase,lean --widths 1024 --depths 8 \
  --n-heads 8 --seq-len 1024 --batch-size 4 --dtype bfloat16 --modes fwd_bwd --backends eager,compile \
  --no-train --no-report --quiet --repeats 10 --warmup-s 0.5 --remeasure-s 5 --out "$OUT" --run-id gpu-check-lean
"$PY" - "$OUT" <<'PYEOF'
import sys
from pathlib import Path
from harness.rundir.records import load_rows
rows = load_rows(sorted(Path(sys.argv[1]).glob("*/gpu-check-lean")))
get = {(r["router"], r["impl"], r["backend"], r["metric"]): r["value"] for r in rows if r.get("value") is not None}
base = {b: get.get(("prenorm", "naive", b, "peak_allocated")) for b in ("eager", "compile")}
print("router   impl       backend  peak_alloc_MiB  x_prenorm  saved_act_MiB")
for (router, impl, backend, metric), v in sorted(get.items()):
    if metric == "peak_allocated":
        saved = get.get((router, impl, backend, "saved_activation"))
        print(f"{router:<8} {impl:<10} {backend:<8} {v / 2**20:14.1f} {v / base[backend] if base[backend] else float('nan'):10.3f}"
              f"  {'-' if saved is None else format(saved / 2**20, '.1f')}")
PYEOF

# Training to a target on every backend (120 steps of the cpu-train shape, 2 seeds, given target;
# the CUDA-graph run captures forward, backward, clip and AdamW in one graph).
train=(--preset cpu-train --max-steps 120 --seeds 2 --target-loss 3.0 --no-report --quiet --out "$OUT")
for b in eager cudagraph compile; do
  routers=prenorm,haares; [ "$b" = compile ] && routers=prenorm
  echo "== train: $b ($routers)"
  timeout 150 "$PY" -m harness.cli train "${train[@]}" --routers $routers --backend $b --run-id gpu-check-train-$b
done
"$PY" - "$OUT" <<'PYEOF'
import sys
from pathlib import Path
from harness.rundir.records import load_rows
rows = load_rows(sorted(Path(sys.argv[1]).glob("*/gpu-check-train-*")))
print("backend     router   seed status         time_to_target_s  steps  train_time_s  loss@budget")
for r in sorted((r for r in rows if r["metric"] == "time_to_target"), key=lambda r: (r["backend"], r["router"], r["seed"])):
    get = lambda m: next((x["value"] for x in rows if x["case_key"] == r["case_key"] and x["metric"] == m), None)
    fmt = lambda v, f: format(v, f) if isinstance(v, (int, float)) else "-"
    print(f"{r['backend']:<11} {r['router']:<8} {r['seed']:>4} {r['status']:<14} {fmt(r['value'], '16.2f')} "
          f"{fmt(get('steps_to_target'), '6.1f')} {fmt(get('train_time'), '13.2f')} {fmt(get('loss_at_token_budget'), '11.4f')}"
          + (f"  {r['error']}" if r.get("error") else ""))
PYEOF

run_dirs=$(ls -d "$OUT"/*/gpu-check-graph "$OUT"/*/gpu-check-compile 2>/dev/null)
echo "== summary: median step, overhead vs prenorm, ratio to eager, compile/capture s"
"$PY" -m harness.cli summary $run_dirs
"$PY" -m harness.cli status $(echo "$run_dirs" | head -n 1) | head -n 8
exit $tests_rc
