#!/usr/bin/env bash
# GPU check: the CUDA-only tests, then a small GPU sweep, then a short table of step times.
#
# For a CUDA machine that has PyTorch but maybe no network: it uses the python3 (and torch) that
# is already there, installs nothing, and runs the project from this checkout (PYTHONPATH).
# Needs pytest, pandas, click, tqdm, tabulate; fvcore and tomli-w are optional (FLOP rows become `skipped`).
# Budget: under 6 minutes on one GPU (one shape, 7 routers; compile only for fwd_bwd; no
# max-autotune). Usage: bash scripts/gpu_check.sh [results-root]   (default /tmp/routerbench-gpu)
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

# One shape large enough to be GPU-bound: d=1024, 4 layers, T=512, B=8, bf16.
shape=(--widths 1024 --depths 4 --n-heads 8 --seq-len 512 --batch-size 8 --dtype bfloat16)
common=(--routers prenorm,rezero,layerscale,full_attnres,block_attnres,haares,wav_v1 --impls two_phase
        --no-train --no-report --quiet --repeats 20 --warmup-s 1 --out "$OUT")
# Two runs (a run directory holds one spec): eager + cudagraph, then compile.
echo "== sweep: eager and cudagraph x fwd_bwd, train_step"
timeout 200 "$PY" -m harness.cli run "${shape[@]}" "${common[@]}" --run-id gpu-check-graph \
  --backends eager,cudagraph --modes fwd_bwd,train_step
echo "== sweep: compile (default mode) x fwd_bwd"
timeout 200 "$PY" -m harness.cli run "${shape[@]}" "${common[@]}" --run-id gpu-check-compile \
  --backends compile --modes fwd_bwd

run_dirs=$(ls -d "$OUT"/*/gpu-check-graph "$OUT"/*/gpu-check-compile 2>/dev/null)
echo "== summary: median step, overhead vs prenorm, ratio to eager, compile/capture s"
"$PY" -m harness.cli summary $run_dirs
"$PY" -m harness.cli status $(echo "$run_dirs" | head -n 1) | head -n 8
exit $tests_rc
