#!/usr/bin/env bash
# GPU check: what routerbench measures on this CUDA machine, within a wall-time budget.
#
# For a CUDA machine that has PyTorch (and pandas, click, tqdm, pytest, matplotlib, seaborn) but
# maybe no network: it uses the python3 (and torch) already there, runs the project from this
# checkout (PYTHONPATH), and installs nothing but the wheels of a wheels folder
# (scripts/gpu_wheels.sh fills one where there is network) into <out>/site.
#
# Stages, in order of value, each with its share of the budget (--dry-run prints them in seconds
# with their commands); a stage may also use what the stages before it left unused, and one that
# fails or runs out of time is reported and the next one runs:
#   setup    wheels, versions, optional packages, `routerbench list` (which peer impls run here)
#   tests    the CUDA-only tests (pytest -m cuda; interrupted with SIGINT, so pytest prints its summary)
#   graph    prenorm and the block routers (two_phase; full_attnres has only naive), eager and
#            CUDA-graph replay, bf16 fwd_bwd, d=1024 L=4 T=512 B=8: ratio to prenorm, x floor, vs eager
#   compile  the same routers compiled (model scope), one run per router (prenorm + it), so each
#            one that compiles in time is kept
#   impls    each fused kernel alone (routerbench kernels), then fused (Triton kernels) against naive,
#            two_phase, lean and, for block_attnres, the peer
#            kernels available here: eager and CUDA-graph replay on the decoder, then on the
#            router_only workload (routing cost alone), then two_phase, lean and fused compiled
#            (model scope) for haares; the check's shape, paired with prenorm, x floor
#   lean     two_phase vs lean (and fused): CUDA peak memory and saved activations (haares, wav_v1)
#   train    a short training run with the whole step CUDA-graphed (cpu-train preset)
#   results  `routerbench summary`, the x-floor, lean-memory and training tables, the report of
#            the cost runs (if time is left) and ONE archive <out>/<tag>.tar.gz
# `routerbench run` is stopped with SIGTERM (`timeout --signal=TERM --kill-after=15`): it prints
# its interrupt line and keeps every committed paired group in its run directory. A SIGTERM or
# Ctrl-C of this script stops the running stage the same way and still writes the archive.
#
# Usage: bash scripts/gpu_check.sh [--budget SECONDS | SECONDS] [--out DIR] [--wheels DIR]
#                                  [--no-flops] [--dry-run]
#   --budget S   total wall time: seconds, or 5m / 1h (120 s to 24 h; default 300)
#   --out DIR    output root (default results/gpu-check in the checkout); this check writes
#                DIR/<tag>/ (run directories under runs/, report/, gpu_check.log) and DIR/<tag>.tar.gz
#   --wheels DIR wheels to install into DIR/site with --no-index --no-deps (default: wheels/ in the
#                checkout when it exists, else shared/wheels)
#   --no-flops   no FLOP counting in any stage (it is counted only in `graph` otherwise)
#   --dry-run    print the stages, their budgets and commands, and exit 0 (no GPU, no torch import)
#   PYTHON=...   the interpreter (default python3)
# Exit status: 0 every stage ok, 1 a stage failed, timed out or was skipped for time, 2 bad usage
# or no CUDA device, 128+N stopped by signal N (the archive is written all the same).
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 2
PY=${PYTHON:-python3}

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "gpu_check: $*" >&2; exit 2; }

# ---------------------------------------------------------------- arguments (before any work)
BUDGET=300 BUDGET_SET=0 OUT_ROOT=$REPO/results/gpu-check WHEELS="" DRY=0 FLOPS=1
set_budget() {
  ((BUDGET_SET)) && die "--budget given twice"
  BUDGET=$1 BUDGET_SET=1
}
need_value() { (($2 >= 2)) || die "$1 needs a value"; }
while (($#)); do
  case $1 in
    --budget) need_value "$1" $#; set_budget "$2"; shift 2 ;;
    --budget=*) set_budget "${1#*=}"; shift ;;
    --out) need_value "$1" $#; OUT_ROOT=$2; shift 2 ;;
    --out=*) OUT_ROOT=${1#*=}; shift ;;
    --wheels) need_value "$1" $#; WHEELS=$2; shift 2 ;;
    --wheels=*) WHEELS=${1#*=}; shift ;;
    --no-flops) FLOPS=0; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) set_budget "$1"; shift ;;
  esac
done
if [[ ! $BUDGET =~ ^([0-9]{1,6})(s|m|h)?$ ]]; then
  die "--budget must be whole seconds, or minutes or hours with m or h (300, 5m, 1h), from 120 s to 24 h, not '$BUDGET'"
fi
case ${BASH_REMATCH[2]} in m) BUDGET=$((10#${BASH_REMATCH[1]} * 60)) ;; h) BUDGET=$((10#${BASH_REMATCH[1]} * 3600)) ;;
  *) BUDGET=$((10#${BASH_REMATCH[1]})) ;; esac
((BUDGET >= 120 && BUDGET <= 86400)) || die "--budget must be from 120 s to 24 h (86400 s), not $BUDGET s"
[ -n "$OUT_ROOT" ] || die "--out needs a folder"
if [ -n "$WHEELS" ]; then
  [ -d "$WHEELS" ] || die "--wheels $WHEELS is not a folder"
elif [ -d "$REPO/wheels" ]; then
  WHEELS=$REPO/wheels
elif [ -d "$REPO/shared/wheels" ]; then
  WHEELS=$REPO/shared/wheels
fi
command -v timeout >/dev/null || die "needs \`timeout\` (GNU coreutils)"

# ---------------------------------------------------------------- the plan
# Stage budgets: `results` gets 12 % (at least 40 s: summary and tables ~10 s, the report 10-30 s,
# the archive ~1 s); the other stages share the rest by WEIGHTS (rounding goes to `graph`). The
# weights follow the one GPU log there is (H200, torch 2.11, 2026-12-04, the previous version of
# this script): the CUDA tests took 61 s; an eager group of 7 routers at this shape 42 s (12 s of
# it fvcore's first FLOP count, ~3 s set-up per router, 5 s per timing of 20 rounds); a cold
# compile (model scope, L=4) 10-12 s for prenorm, 30-42 s for a block router. So 5 min covers
# setup, tests, graph and about one compiled router; by the same numbers (an estimate, not
# measured) every stage fits in about 10 min with a cold compile cache: --budget 600 to 900.
# NEED: seconds a stage's command needs at the least to be worth starting (less: skipped, and its
# time goes on to the next stage); for compile, per router.
STAGES=(setup tests graph compile impls lean train results)
WEIGHTS=(5 21 23 18 19 7 7)
NEED=(0 20 40 45 25 20 20 0)
WHAT=("wheels, versions, optional packages, routerbench list"
      "CUDA-only tests (pytest -m cuda)"
      "eager + CUDA-graph replay: block routers vs prenorm, x floor"
      "compiled (model scope), one run per router vs prenorm"
      "fused vs naive, two_phase, lean and the peers: eager + graph replay, decoder and router_only; compiled"
      "two_phase vs lean (and fused): peak memory, saved activations"
      "short training run, whole step CUDA-graphed"
      "summary, tables, report, archive")
RESULTS_S=$((BUDGET * 12 / 100)); ((RESULTS_S >= 40)) || RESULTS_S=40
rest=$((BUDGET - RESULTS_S)) given=0
SHARE=()
for i in "${!WEIGHTS[@]}"; do
  SHARE[i]=$((rest * WEIGHTS[i] / 100)); given=$((given + SHARE[i]))
done
SHARE[2]=$((SHARE[2] + rest - given))
SHARE[7]=$RESULTS_S
END=() acc=0
for i in "${!STAGES[@]}"; do acc=$((acc + SHARE[i])); END[i]=$acc; done

TAG=gpu-check-$(date -u +%Y%m%d-%H%M%S)
CHECK=$OUT_ROOT/$TAG          # everything of this check
RES=$CHECK/runs               # routerbench results root (runs/<device-slug>/<run-id>)
SITE=$OUT_ROOT/site
ARCHIVE=$OUT_ROOT/$TAG.tar.gz
CLI=("$PY" -m harness.cli)
FLOPS_ARG=(); ((FLOPS)) || FLOPS_ARG=(--no-flops)

# The cost shape: large enough to be GPU-bound (d=1024, 4 layers, T=512, B=8, bf16, fwd_bwd).
SHAPE=(--widths 1024 --depths 4 --n-heads 8 --seq-len 512 --batch-size 8 --dtype bfloat16 --modes fwd_bwd)
# A deeper, longer shape for the implementations and the memory of the lean backward.
SHAPE_L8=(--widths 1024 --depths 8 --n-heads 8 --seq-len 1024 --batch-size 4 --dtype bfloat16 --modes fwd_bwd)
QUIET=(--no-train --no-report --quiet --warmup-s 0.5 --remeasure-s 5 --max-attempts 2 --out "$RES")
BLOCK_ROUTERS=(block_attnres haares wav_v1 full_attnres)
WANT_IMPLS=(naive two_phase lean fused fla liger flash_attn_res fast_attnres)
OPTIONAL=(fvcore tomli_w pytest_benchmark pynvml fla liger_kernel flash_attn_res attnres einops)

# ---------------------------------------------------------------- helpers
STAGE=setup STAGE_END=0 CHILD="" FAILED=0 OUTCOMES=()
exec 3>&1   # the check's own lines (fd 3): never redirected with a command's output
note() { echo "gpu_check: $*" >&3; }
outcome() { OUTCOMES+=("$1"); echo "gpu_check: $1" >&3; }
elapsed() { echo "$((SECONDS))"; }

stage() {   # stage I: begin stage I (its deadline: the end of its cumulative share)
  STAGE=${STAGES[$1]} STAGE_END=${END[$1]}
  if ((DRY)); then
    local short=""
    ((SHARE[$1] < NEED[$1])) && short=" (below the ${NEED[$1]} s it needs: runs only on time earlier stages leave)"
    [[ $STAGE == compile ]] && ((SHARE[$1] >= NEED[$1])) && short=" (at ${NEED[$1]} s a router, about $((SHARE[$1] / NEED[$1])) of ${#BLOCK_ROUTERS[@]} routers fit unless earlier stages leave time)"
    echo; echo "[${STAGE}] ${SHARE[$1]} s, until ${STAGE_END} s: ${WHAT[$1]}${short}"
  else
    echo; echo "== stage ${STAGE}: ${WHAT[$1]} (at $(elapsed) s; until ${STAGE_END} s of ${BUDGET} s)"
  fi
}

q() {   # q ARG...: the arguments as a shell would read them back (quoted only where needed)
  local a out=() sq="'" esc="'\\''"
  for a in "$@"; do
    if [[ $a == *$'\n'* ]]; then a="<${a%%$'\n'*} ...>"; fi    # python code: its first line
    if [[ $a =~ ^[A-Za-z0-9_./=:,@%+-]+$ ]]; then out+=("$a"); else out+=("'${a//$sq/$esc}'"); fi
  done
  echo "${out[*]}"
}
show() { echo "  \$ $(q "$@")"; }

# run_timed LABEL SIGNAL NEED CMD...: CMD under `timeout` until the stage's deadline. NEED > 0:
# skipped unless NEED seconds are left; NEED < 0: given at least -NEED seconds even past the
# deadline (setup and results, which the rest needs). Prints and records "stage LABEL: ok / timed
# out / failed, exit N / skipped"; returns CMD's status (124 or 137 timed out, 125 skipped).
# `setsid` puts CMD in a session of its own: GNU timeout signals its child and then its own
# process group, so without it the command could get the signal twice, and routerbench takes a
# second SIGTERM as "exit now" (the 2026-12-04 H200 log: "interrupted again: exiting now").
SETSID=(); command -v setsid >/dev/null && SETSID=(setsid)
run_timed() {
  local label=$1 sig=$2 need=$3; shift 3
  if ((DRY)); then show "$@"; return 0; fi
  local left=$((STAGE_END - SECONDS))
  if ((need < 0 && left < -need)); then left=$((-need)); fi
  if ((left < (need > 0 ? need : 5))); then
    outcome "stage $label: skipped, ${left} s left, it needs ${need#-} s"; FAILED=1; return 125
  fi
  local t0=$SECONDS rc
  echo "-- [$label] timeout ${left} s: $(q "$@")" >&3
  timeout --signal="$sig" --kill-after=15 "$left" "${SETSID[@]}" "$@" &
  CHILD=$!
  wait "$CHILD"; rc=$?
  CHILD=""
  local took=$((SECONDS - t0))
  if ((rc == 0)); then
    outcome "stage $label: ok in ${took} s"
  elif ((rc == 124 || (rc == 137 && took >= left))); then
    outcome "stage $label: timed out after ${took} s"; FAILED=1
  else
    outcome "stage $label: failed, exit $rc after ${took} s"; FAILED=1
  fi
  return "$rc"
}

run_dirs() {   # run_dirs SUFFIX...: existing run directories of this check, in order
  local s d
  for s in "$@"; do
    for d in "$RES"/*/"$TAG-$s"; do [ -d "$d" ] && echo "$d"; done
  done
}

make_archive() {
  [ -d "$CHECK" ] || return 0
  if tar -czf "$ARCHIVE" -C "$OUT_ROOT" --exclude=checkpoints "$TAG" 2>/dev/null; then
    note "archive: $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1); run directories, report, log; training checkpoints left out)"
  else
    note "archive: tar failed; the results are in $CHECK"
  fi
}

# shellcheck disable=SC2317  # run by the traps below
on_signal() {   # on_signal NAME NUMBER: stop the stage's command cleanly, archive, exit 128+N
  trap - TERM INT HUP
  echo; note "got SIG$1 in stage $STAGE at $(elapsed) s: stopping it (SIGTERM), then the archive"
  if [ -n "$CHILD" ]; then kill -TERM "$CHILD" 2>/dev/null; wait "$CHILD"; fi
  make_archive
  note "the tables later: $(q "${CLI[@]}") summary $(q "$RES")"
  exit $((128 + $2))
}

# CUDA first, before any output or folder: one line and exit 2 without it.
if ((!DRY)); then
  cuda=$("$PY" -c '
import sys
try:
    import torch
except Exception as exc:
    print(f"cannot import torch ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else exc!r})")
    sys.exit(1)
if not torch.cuda.is_available():
    print(f"no CUDA device visible to torch {torch.__version__} (CUDA build {torch.version.cuda}); nothing to check")
    sys.exit(1)
' 2>/dev/null) || { echo "gpu_check: $PY: ${cuda:-cannot run}" >&2; exit 2; }
fi

if ((!DRY)); then
  mkdir -p "$RES" || die "cannot create $RES"
  LOG=$CHECK/gpu_check.log
  exec 4>&1 5>&2   # the terminal, for the lines after the log is closed
  exec > >(trap '' INT TERM HUP; exec tee -a "$LOG") 2>&1 3>&1   # tee outlives a Ctrl-C
  TEE_PID=$!
  trap 'on_signal TERM 15' TERM
  trap 'on_signal INT 2' INT
  trap 'on_signal HUP 1' HUP
fi

# ---------------------------------------------------------------- plan output
echo "gpu_check: budget ${BUDGET} s ($((BUDGET / 60)) min $((BUDGET % 60)) s)$( ((DRY)) && echo ', dry run: nothing runs')"
echo "gpu_check: output $CHECK/ and $ARCHIVE"
echo "gpu_check: wheels ${WHEELS:-none (no --wheels, no wheels/ or shared/wheels in the checkout)}"
printf '  %-2s %-8s %6s %6s %9s  %s\n' "#" stage budget share "ends at" what
for i in "${!STAGES[@]}"; do
  printf '  %-2s %-8s %4d s %4d %% %7d s  %s\n' "$i" "${STAGES[i]}" "${SHARE[i]}" \
    "$(( (SHARE[i] * 100 + BUDGET / 2) / BUDGET ))" "${END[i]}" "${WHAT[i]}"
done
echo "  total    $BUDGET s"

export PYTHONUNBUFFERED=1
export PYTHONPATH="$REPO:$SITE${PYTHONPATH:+:$PYTHONPATH}"

# ---------------------------------------------------------------- 0 setup
stage 0
if [ -n "$WHEELS" ]; then
  shopt -s nullglob; wheels=("$WHEELS"/*.whl); shopt -u nullglob
  if ((DRY)) || ((${#wheels[@]})); then
    ((DRY)) && wheels=("$WHEELS/*.whl")
    run_timed "setup (wheels)" TERM -60 "$PY" -m pip install -q --no-index --no-deps --no-compile \
      --upgrade --target "$SITE" "${wheels[@]}"
  else
    note "no *.whl in $WHEELS: nothing installed"
  fi
fi
read -r -d '' env_py <<'PYEOF'
import importlib.metadata as md, importlib.util, os, platform, sys, torch
site = os.environ.get("GPU_CHECK_SITE", "")
p = torch.cuda.get_device_properties(0)
print(f"python {platform.python_version()} | torch {torch.__version__} | CUDA {torch.version.cuda} | "
      f"cuDNN {torch.backends.cudnn.version()}")
try:
    import triton
    print(f"triton {triton.__version__}")
except Exception as exc:
    print(f"triton: not importable ({type(exc).__name__})")
print(f"device {torch.cuda.get_device_name(0)} | sm_{p.major}{p.minor} | {p.total_memory / 2**30:.1f} GiB | "
      f"{torch.cuda.device_count()} visible")
def where(mod):
    spec = importlib.util.find_spec(mod)
    if spec is None:
        return None
    origin = spec.origin or (list(spec.submodule_search_locations or [""])[0])
    return "wheels" if site and origin.startswith(site) else "installed"
dists = {"fvcore": "fvcore", "tomli_w": "tomli-w", "pytest_benchmark": "pytest-benchmark", "pynvml": "nvidia-ml-py",
         "fla": "fla-core", "liger_kernel": "liger-kernel", "flash_attn_res": "flash-attn-res", "attnres": "fast-attnres",
         "einops": "einops"}
print("optional packages:")
for mod in sys.argv[1:]:
    w = where(mod)
    try:
        ver = md.version(dists.get(mod, mod))
    except Exception:
        ver = "?"
    label = f"{mod} ({dists[mod]})" if mod in dists and dists[mod].replace("-", "_") != mod else mod
    print(f"  {label:<28} " + (f"yes  {ver} ({w})" if w else "no"))
need = ["click", "numpy", "pandas", "scipy", "tqdm", "pytest", "matplotlib", "seaborn"]
missing = [m for m in need if importlib.util.find_spec(m) is None]
if missing:
    print("MISSING required packages: " + ", ".join(missing))
    sys.exit(3 if {"click", "numpy", "pandas"} & set(missing) else 0)
PYEOF
if ((DRY)); then
  show "$PY" -c "<print python, torch, CUDA, triton, device; which optional packages import>" "${OPTIONAL[@]}"
else
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null || true
  GPU_CHECK_SITE=$SITE run_timed "setup (versions)" TERM -60 "$PY" -c "$env_py" "${OPTIONAL[@]}"
  if (($? == 3)); then
    echo "gpu_check: click, numpy or pandas is missing: routerbench cannot run here" >&2
    make_archive
    exit 2
  fi
fi
impls=("${WANT_IMPLS[@]:0:3}")
if ((DRY)); then
  show "${CLI[@]}" list
  impls=("${WANT_IMPLS[@]}")
  note "(impls: ${WANT_IMPLS[*]}; at run time only those \`routerbench list\` shows available for block_attnres)"
else
  run_timed "setup (list)" TERM -60 "${CLI[@]}" list >"$CHECK/list.txt" 2>&1
  sed -n '/^implementations/,/^backends/p' "$CHECK/list.txt" | sed '$d'
  mapfile -t avail < <(awk '/^implementations/ {on = 1; next} /^backends/ {on = 0}
    on && /routers=[^ ]*block_attnres/ && !/unavailable/ && / available/ {print $1}' "$CHECK/list.txt")
  if ((${#avail[@]})); then
    impls=()
    for i in "${WANT_IMPLS[@]}"; do
      for a in "${avail[@]}"; do [ "$i" = "$a" ] && impls+=("$i"); done
    done
  fi
  note "block_attnres impls to time: ${impls[*]}"
fi

# ---------------------------------------------------------------- 1 tests
stage 1
run_timed tests INT "${NEED[1]}" "$PY" -m pytest -q -p no:cacheprovider -m cuda --tb=short --durations=10 tests/

# ---------------------------------------------------------------- 2 graph
stage 2
run_timed graph TERM "${NEED[2]}" "${CLI[@]}" run --routers "prenorm,$(IFS=,; echo "${BLOCK_ROUTERS[*]}")" --impls two_phase \
  "${SHAPE[@]}" --backends eager,cudagraph --repeats 20 "${QUIET[@]}" "${FLOPS_ARG[@]}" --run-id "$TAG-graph"

# ---------------------------------------------------------------- 3 compile
stage 3
# One run per router (prenorm + it): a paired group is one unit of resume, so each router that
# compiles in time keeps its rows. --no-supervise: one process (our own routers, no peer kernels).
for i in "${!BLOCK_ROUTERS[@]}"; do
  r=${BLOCK_ROUTERS[i]}
  if ((!DRY && STAGE_END - SECONDS < NEED[3])); then
    outcome "stage compile: $((STAGE_END - SECONDS)) s left, not enough for ${BLOCK_ROUTERS[*]:i}"; FAILED=1; break
  fi
  impl=two_phase; [ "$r" = full_attnres ] && impl=naive   # full_attnres has no two_phase (refused)
  run_timed "compile ($r)" TERM "${NEED[3]}" "${CLI[@]}" run --routers "prenorm,$r" --impls "$impl" "${SHAPE[@]}" \
    --backends compile --compile-scope model --no-supervise --repeats 20 "${QUIET[@]}" --no-flops \
    --run-id "$TAG-compile-$r"
done

# ---------------------------------------------------------------- 4 impls
stage 4
# every impl of the three two-phase routers (each runs those it offers; the peers are block_attnres's),
# on the decoder, then on the router_only workload, then compiled; each run keeps what it measured
IMPL_ROUTERS=prenorm,block_attnres,haares,wav_v1
# each fused kernel alone at the byte rule's shape (d=1024, 12 layers, 8,192 rows, bf16): time warm and
# after an L2 flush, GB/s, share of the copy bandwidth, the autotuner's config; each peer per op
[[ " ${impls[*]} " == *" fused "* ]] && run_timed "impls (kernels)" TERM "${NEED[4]}" "${CLI[@]}" kernels --repeats 20
run_timed impls TERM "${NEED[4]}" "${CLI[@]}" run --routers "$IMPL_ROUTERS" --impls "$(IFS=,; echo "${impls[*]}")" \
  "${SHAPE[@]}" --backends eager,cudagraph --repeats 10 "${QUIET[@]}" --no-flops --run-id "$TAG-impls"
run_timed "impls (router_only)" TERM "${NEED[4]}" "${CLI[@]}" run --workload router_only --routers "$IMPL_ROUTERS" \
  --impls "$(IFS=,; echo "${impls[*]}")" "${SHAPE[@]}" --backends eager,cudagraph --repeats 10 "${QUIET[@]}" \
  --no-flops --run-id "$TAG-impls-router"
compiled=(two_phase lean); [[ " ${impls[*]} " == *" fused "* ]] && compiled+=(fused)
run_timed "impls (compiled)" TERM "${NEED[3]}" "${CLI[@]}" run --routers prenorm,haares \
  --impls "$(IFS=,; echo "${compiled[*]}")" "${SHAPE[@]}" --backends compile --compile-scope model --no-supervise \
  --repeats 10 "${QUIET[@]}" --no-flops --run-id "$TAG-impls-compiled"

# ---------------------------------------------------------------- 5 lean
stage 5
memory=(two_phase lean); [[ " ${impls[*]} " == *" fused "* ]] && memory+=(fused)
run_timed lean TERM "${NEED[5]}" "${CLI[@]}" run --routers prenorm,haares,wav_v1 --impls "$(IFS=,; echo "${memory[*]}")" \
  "${SHAPE_L8[@]}" --backends eager --repeats 5 "${QUIET[@]}" --no-flops --run-id "$TAG-lean"

# ---------------------------------------------------------------- 6 train
stage 6
run_timed train TERM "${NEED[6]}" "${CLI[@]}" train --preset cpu-train --routers prenorm,haares --backend cudagraph \
  --max-steps 120 --eval-every 20 --seeds 1 --target-loss 3.0 --no-report --quiet --out "$RES" --run-id "$TAG-train"

# ---------------------------------------------------------------- 7 results
stage 7
read -r -d '' tables_py <<'PYEOF'
import math, sys
from pathlib import Path

def num(v, spec, width):
    ok = isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v))
    return format(format(v, spec) if ok else "-", f">{width}")

cost = [Path(p) for p in sys.argv[1].split("\n") if p]
lean = [Path(p) for p in sys.argv[2].split("\n") if p]
train = [Path(p) for p in sys.argv[3].split("\n") if p]

print("\n== cost vs prenorm, with x floor (paired ratio; x floor = overhead / the memory-traffic floor)")
try:
    from reports.frame import load_frame
    from reports.summary import cost_summary
    s = cost_summary(load_frame(cost)) if cost else None
    if s is None or s.empty:
        print("(no router timed against prenorm)")
    else:
        keys = [k for k in ("eager", "compile", "cudagraph") if f"{k}_ratio" in s]
        print(f"{'run':<16} {'router':<13} {'impl':<14} " + " ".join(f"{k + ' x':>12} {'x floor':>8}" for k in keys))
        for r in s.to_dict("records"):
            print(f"{str(r['run_id']).rsplit('-', 1)[-1] if 'compile-' not in str(r['run_id']) else 'compile':<16} "
                  f"{r['router']:<13} {r['impl']:<14} "
                  + " ".join(num(r.get(k + '_ratio'), '.3f', 12) + ' ' + num(r.get(k + '_floor'), '.1f', 8) for k in keys))
except Exception as exc:
    print(f"(cost table failed: {type(exc).__name__}: {exc})")

from harness.rundir.records import load_rows
print("\n== lean vs two_phase: CUDA peak memory and saved activations (MiB, x prenorm)")
rows = [r for r in load_rows(lean) if r.get("router") and r.get("value") is not None
        and r.get("status") == "ok" and r["metric"] in ("peak_allocated", "saved_activation")] if lean else []
get = {(r["router"], r["impl"], r["backend"], r["metric"]): r["value"] for r in rows}
cases = sorted({k[:3] for k in get}, key=lambda k: (k[2], k[0] != "prenorm", k[0], k[1]))
print(f"{'router':<8} {'impl':<10} {'backend':<8} {'peak_alloc':>10} {'x':>6} {'saved_act':>10} {'x':>6}")
for router, impl, backend in cases:
    peak, saved = (get.get((router, impl, backend, m)) for m in ("peak_allocated", "saved_activation"))
    bp, bs = (get.get(("prenorm", "naive", backend, m)) for m in ("peak_allocated", "saved_activation"))
    print(f"{router:<8} {impl:<10} {backend:<8} {num(peak and peak / 2**20, '.1f', 10)} {num(peak and bp and peak / bp, '.3f', 6)}"
          f" {num(saved and saved / 2**20, '.1f', 10)} {num(saved and bs and saved / bs, '.3f', 6)}")
if not cases:
    print("(no lean rows)")

print("\n== training (cudagraph): time to target")
rows = load_rows(train) if train else []
print(f"{'backend':<10} {'router':<8} {'seed':>4} {'status':<14} {'to_target_s':>11} {'steps':>6} {'train_s':>8} {'loss@budget':>11}")
tt = sorted((r for r in rows if r["metric"] == "time_to_target"), key=lambda r: (r["backend"], r["router"], r["seed"]))
for r in tt:
    get = lambda m: next((x["value"] for x in rows if x["case_key"] == r["case_key"] and x["metric"] == m), None)
    print(f"{r['backend']:<10} {r['router']:<8} {r['seed']:>4} {r['status']:<14} {num(r['value'], '.2f', 11)} "
          f"{num(get('steps_to_target'), '.1f', 6)} {num(get('train_time'), '.2f', 8)} {num(get('loss_at_token_budget'), '.4f', 11)}"
          + (f"  {r['error']}" if r.get("error") else ""))
if not tt:
    print("(no training rows)")
PYEOF
if ((DRY)); then
  show "${CLI[@]}" summary "<the graph, compile and impls run directories>"
  show "$PY" -c "<x-floor, lean-memory and training tables>"
  show "${CLI[@]}" report "<the cost run directories>" --out "$CHECK/report"
  show tar -czf "$ARCHIVE" -C "$OUT_ROOT" --exclude=checkpoints "$TAG"
  exit 0
fi
mapfile -t cost_dirs < <(run_dirs graph "${BLOCK_ROUTERS[@]/#/compile-}" impls impls-router impls-compiled)
mapfile -t all_cost < <(run_dirs graph "${BLOCK_ROUTERS[@]/#/compile-}" impls impls-router impls-compiled lean)
lean_dirs=$(run_dirs lean) train_dirs=$(run_dirs train)
TAIL_S=10   # kept for the archive
STAGE_END=$((BUDGET - TAIL_S))
if ((${#cost_dirs[@]})); then
  echo "== summary: paired ratios vs prenorm and vs eager with CIs, noise flags, failed cases"
  run_timed "results (summary)" TERM -20 "${CLI[@]}" summary "${cost_dirs[@]}"
else
  note "no cost run directory to summarise"
fi
run_timed "results (tables)" TERM -20 "$PY" -c "$tables_py" "$(printf '%s\n' "${cost_dirs[@]}")" "$lean_dirs" "$train_dirs"
if ((${#all_cost[@]})); then
  run_timed "results (report)" TERM 15 "${CLI[@]}" report "${all_cost[@]}" --out "$CHECK/report"
  case $? in
    0) note "report: $CHECK/report/report.md (report.html beside it); its summary's sentences:"
       awk '/^## Summary/ {on = 1; print; next} on && (/^## / || /^!\[/) {exit} on && NF' \
         "$CHECK/report/report.md" 2>/dev/null | head -n 30 ;;
    125) note "the report later: $(q "${CLI[@]}" report "${all_cost[@]}" --out "$CHECK/report")" ;;
  esac
fi

echo; echo "== stages (${SECONDS} s of ${BUDGET} s)"
printf '  %s\n' "${OUTCOMES[@]}"
trap - TERM INT HUP
exec 1>&4 2>&5 3>&4   # close the log (tee ends), so that the archive holds all of it
wait "$TEE_PID" 2>/dev/null
make_archive
exit "$FAILED"
