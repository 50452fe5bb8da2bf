#!/usr/bin/env bash
# GPU study: the papers' depth study, sized to a wall-clock budget, on one GPU.
#
# It runs `routerbench study depth` at the char scale (d=512, T=256, B=32; the embedded corpus or
# --data DIR), depths 12 and 48, block_attnres against haares (and wav_v1 when the budget allows),
# each with its two_phase impl, 5 seeds paired by seed, on the graphed training step (--backend
# cudagraph: forward, backward, clip and AdamW captured in one CUDA graph per run), bf16-mixed.
#
# It sizes itself (python -m harness.cli.study_budget; rules in harness/spec/study_budget.py): a
# probe times every router at both depths on this GPU (the study's own timed estimate: set-up and
# capture, one evaluation, the median of 10 graphed steps), then the steps per run are the most
# that fit the budget less what the session has spent, the runs' set-up, evaluations and
# checkpoints, the report and diagnostics and the archive (capped at the full study's 5,000). It
# prints the plan and its estimate before training; below a fifth of the full budget the plan, the
# study's report and this script say the study is a smoke test (below all of it: a shortened
# study), and how far it is from the full study. With --dry-run it needs no GPU: the plan
# uses ASSUMED H100-class step times, labelled so. At the end it prints the table and where the
# depth-trend figure is (gain_vs_depth.png: Δ loss vs block_attnres by depth, paired seed CIs) and
# writes ONE archive of the run directory (checkpoints left out).
#
# Usage: bash scripts/gpu_study.sh BUDGET [--out DIR] [--wheels DIR] [--data DIR] [--seeds N]
#                                         [--precision bf16-mixed|fp32] [--dry-run]
#   BUDGET        the whole session's wall time: seconds (360) or with a unit (6m, 1.5h, 1h30m)
#   --out DIR     output root (default /tmp/routerbench-gpu-study): DIR/<tag>/ holds the results
#                 root (results/<device>/<tag>/, the study's run directory), gpu_study.log, the plan
#                 (plan.json, study_args.txt); the archive is DIR/<tag>.tar.gz
#   --wheels DIR  wheels to install first into DIR/site (--no-index --no-deps), put on PYTHONPATH
#   --data DIR    a corpus dir (`routerbench data prepare`; default: the embedded stdlib corpus)
#   --seeds N     seeds (default 5)
#   --precision   bf16-mixed (default) or fp32
#   --dry-run     print versions and the plan (assumed step times), exit 0; no GPU needed
#   PYTHON=...    the interpreter (default python3; the checkout's .venv when python3 has no torch)
# Exit status: 0 done; 1 the study failed or ran out of budget (the archive is still written);
# 2 bad usage, a bad BUDGET, or no CUDA device without --dry-run.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 2
START=$(date +%s)

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "gpu_study: $*" >&2; exit 2; }
need_value() { (($2 >= 2)) || die "$1 needs a value"; }

# ---------------------------------------------------------------- arguments (before any work)
BUDGET="" OUT_ROOT=/tmp/routerbench-gpu-study WHEELS="" DATA="" SEEDS="" PRECISION="" DRY=0
set_budget() {
  [ -z "$BUDGET" ] || die "BUDGET given twice ('$BUDGET' and '$1')"
  BUDGET=$1
}
while (($#)); do
  case $1 in
    --out) need_value "$1" $#; OUT_ROOT=$2; shift 2 ;;
    --out=*) OUT_ROOT=${1#*=}; shift ;;
    --wheels) need_value "$1" $#; WHEELS=$2; shift 2 ;;
    --wheels=*) WHEELS=${1#*=}; shift ;;
    --data) need_value "$1" $#; DATA=$2; shift 2 ;;
    --data=*) DATA=${1#*=}; shift ;;
    --seeds) need_value "$1" $#; SEEDS=$2; shift 2 ;;
    --seeds=*) SEEDS=${1#*=}; shift ;;
    --precision) need_value "$1" $#; PRECISION=$2; shift 2 ;;
    --precision=*) PRECISION=${1#*=}; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -[0-9]*) set_budget "$1"; shift ;;   # a negative budget: refused below, by name
    -*) die "unknown option $1 (see --help)" ;;
    *) set_budget "$1"; shift ;;
  esac
done
[ -n "$BUDGET" ] || die "BUDGET missing: bash scripts/gpu_study.sh BUDGET [--dry-run], e.g. 6m or 360 (see --help)"
[ -n "$OUT_ROOT" ] || die "--out needs a folder"
[ -z "$WHEELS" ] || [ -d "$WHEELS" ] || die "--wheels $WHEELS is not a folder"
[ -z "$DATA" ] || [ -d "$DATA" ] || die "--data $DATA is not a folder"
[ -z "$DATA" ] || DATA=$(cd "$DATA" && pwd)
[[ -z $SEEDS || $SEEDS =~ ^[0-9]+$ ]] || die "--seeds takes a whole number, not '$SEEDS'"
case ${PRECISION:-bf16-mixed} in bf16-mixed|fp32) ;; *) die "--precision must be bf16-mixed or fp32, not '$PRECISION'" ;; esac

PY=${PYTHON:-python3}
GIVEN_PYTHONPATH=${PYTHONPATH:-}
export PYTHONPATH="$REPO${GIVEN_PYTHONPATH:+:$GIVEN_PYTHONPATH}" PYTHONUNBUFFERED=1
# BUDGET checked in Python (the sizing's own parser; no torch imported): one line and exit 2 if bad
BUDGET_S=$("$PY" -m harness.cli.study_budget --budget "$BUDGET" --check) || exit 2

OPTS=(--budget "$BUDGET")
[ -z "$DATA" ] || OPTS+=(--data "$DATA")
[ -z "$SEEDS" ] || OPTS+=(--seeds "$SEEDS")
[ -z "$PRECISION" ] || OPTS+=(--precision "$PRECISION")

has_torch() { "$1" -c "import torch" 2>/dev/null; }

# ---------------------------------------------------------------- --dry-run: the plan, no GPU
if ((DRY)); then
  if [ -z "${PYTHON:-}" ] && ! has_torch "$PY" && [ -x "$REPO/.venv/bin/python" ]; then
    PY=$REPO/.venv/bin/python
  fi
  echo "gpu_study: dry run: budget $BUDGET (${BUDGET_S} s); nothing trained, nothing written"
  "$PY" -m harness.cli.study_budget "${OPTS[@]}" --versions
  rc=$?
  ((rc == 0)) || exit "$rc"
  echo "gpu_study: without --dry-run the step times come from a probe on the GPU first, the steps per run"
  echo "  from them, and the study above runs with --out <out>/<tag>/results --run-id <tag>"
  exit 0
fi

# ---------------------------------------------------------------- set-up: wheels, CUDA, folders
TAG=gpu-study-$(date -u +%Y%m%d-%H%M%S)
STUDY_DIR=$OUT_ROOT/$TAG
RES=$STUDY_DIR/results
SITE=$OUT_ROOT/site
ARCHIVE=$OUT_ROOT/$TAG.tar.gz
LOG=$STUDY_DIR/gpu_study.log
if [ -n "$WHEELS" ]; then
  compgen -G "$WHEELS/*.whl" >/dev/null || die "--wheels $WHEELS holds no .whl files"
  mkdir -p "$SITE" || die "--out $OUT_ROOT: cannot make $SITE"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$WHEELS"/*.whl \
    || die "--wheels $WHEELS: pip could not install them into $SITE"
  export PYTHONPATH="$REPO:$SITE${GIVEN_PYTHONPATH:+:$GIVEN_PYTHONPATH}"
fi
if [ -z "${PYTHON:-}" ] && ! has_torch "$PY" && [ -x "$REPO/.venv/bin/python" ]; then
  PY=$REPO/.venv/bin/python
fi
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
  || die "no CUDA device visible to $PY (torch missing or CPU-only): the study needs one GPU; --dry-run prints the plan without it"
mkdir -p "$RES" || die "--out $OUT_ROOT: cannot make $RES"
exec > >(trap '' INT TERM HUP; exec tee -a "$LOG") 2>&1
echo "gpu_study: $TAG, budget $BUDGET (${BUDGET_S} s), output $STUDY_DIR"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null || true

# ---------------------------------------------------------------- probe and plan
echo; echo "== probe and plan (at $(($(date +%s) - START)) s)"
"$PY" -m harness.cli.study_budget "${OPTS[@]}" --versions --probe --started-at "$START" \
  --args-file "$STUDY_DIR/study_args.txt" --plan-json "$STUDY_DIR/plan.json"
rc=$?
if ((rc != 0)); then
  echo "gpu_study: the probe or the plan failed (exit $rc): nothing trained; see $LOG"
  exit $((rc == 2 ? 2 : 1))
fi
mapfile -t STUDY_ARGS < "$STUDY_DIR/study_args.txt"

# ---------------------------------------------------------------- the study (stopped at the budget)
ARCHIVE_RESERVE=15
left=$((START + BUDGET_S - ARCHIVE_RESERVE - $(date +%s)))
((left > 30)) || left=30
echo; echo "== study depth (at $(($(date +%s) - START)) s; stopped with SIGTERM after ${left} s if still running)"
CMD=("$PY" -m harness.cli study depth "${STUDY_ARGS[@]}" --out "$RES" --run-id "$TAG")
printf '%q ' "${CMD[@]}"; echo
timeout --signal=TERM --kill-after=30 "$left" "${CMD[@]}" &
CHILD=$!
trap 'kill -TERM "$CHILD" 2>/dev/null' TERM INT HUP
wait "$CHILD"; study_rc=$?
while kill -0 "$CHILD" 2>/dev/null; do wait "$CHILD"; study_rc=$?; done
trap - TERM INT HUP
if ((study_rc == 124)); then
  echo "gpu_study: the study ran past the budget and was stopped; what it committed is kept (resume:"
  echo "  the same command with --run-id $TAG)"
elif ((study_rc != 0)); then
  echo "gpu_study: study depth exited $study_rc"
fi

# ---------------------------------------------------------------- table, figure, archive
RUN_DIR=$(find "$RES" -mindepth 2 -maxdepth 2 -type d -name "$TAG" 2>/dev/null | head -n 1)
if [ -z "$RUN_DIR" ]; then
  echo "gpu_study: no run directory under $RES; archiving the log and plan only"
  RUN_DIR=$STUDY_DIR
elif [ ! -f "$RUN_DIR/study.md" ] || ((study_rc != 0)); then
  echo "== the report of the runs committed so far"
  "$PY" -c "import sys; from reports.study import write_study; print(write_study(sys.argv[1])[1])" "$RUN_DIR" \
    || echo "gpu_study: no report could be written"
fi
echo; echo "== result (at $(($(date +%s) - START)) s of ${BUDGET_S} s)"
if [ -f "$RUN_DIR/study.md" ]; then
  sed -n '/^## Loss at the token budget/,/^## /p' "$RUN_DIR/study.md" | sed '$d'
  grep -m1 '^Budget: ' "$RUN_DIR/study.md"   # below the full study's steps: says it is a smoke test
fi
for f in gain_vs_depth loss_vs_depth; do
  if [ -f "$RUN_DIR/$f.png" ]; then
    case $f in
      gain_vs_depth) what="depth trend: Δ loss vs block_attnres by depth, paired by seed, 95% t-interval bars" ;;
      *) what="loss at the token budget vs depth, each seed" ;;
    esac
    echo "figure ($what): $RUN_DIR/$f.png (data: $f.csv)"
  else
    echo "figure $f: not written (no finished pair of runs)"
  fi
done
[ -f "$RUN_DIR/study.md" ] && echo "report: $RUN_DIR/study.md, $RUN_DIR/study.html"
if [ "$RUN_DIR" != "$STUDY_DIR" ]; then
  mkdir -p "$RUN_DIR/gpu_study"
  cp "$STUDY_DIR/plan.json" "$STUDY_DIR/study_args.txt" "$LOG" "$RUN_DIR/gpu_study/" 2>/dev/null
fi
if tar -czf "$ARCHIVE" -C "$(dirname "$RUN_DIR")" --exclude=checkpoints --exclude=.lock "$(basename "$RUN_DIR")"; then
  echo "archive: $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1); the run directory without checkpoints/, whose final weights stay in $RUN_DIR)"
else
  echo "archive: tar failed; the results are in $RUN_DIR"
  ((study_rc != 0)) || study_rc=1
fi
echo "gpu_study: done in $(($(date +%s) - START)) s of the ${BUDGET_S} s budget"
((study_rc == 0)) || exit 1
exit 0
