#!/usr/bin/env bash
# Fill a wheels folder for scripts/gpu_check.sh on a GPU machine without network.
#
# Run it where PyPI is reachable; carry the folder to the GPU machine (e.g. as wheels/ at the
# root of the checkout, gpu_check.sh's default, or anywhere given with --wheels DIR). It fetches
# the optional packages of routerbench for CPython 3.12 on x86_64 Linux, each without its
# dependencies (the GPU machine already has torch, triton, numpy, pandas, ...):
#   - fvcore and what its fvcore.nn imports: iopath, portalocker, tabulate, termcolor (+ yacs, for
#     fvcore.common.config): the fvcore FLOP rows (without them they are `skipped`);
#   - tomli-w (spec.toml written by tomli_w, else by the project's own writer);
#   - nvidia-ml-py (the `pynvml` module: SM clock, temperature and throttle rows);
#   - pytest-benchmark and py-cpuinfo (the tests/benchmarks suite);
#   - the peer kernels of the block routers: fla-core, liger-kernel, flash-attn-res, fast-attnres,
#     and einops (pyproject.toml's [kernels] extra, without triton).
# torch and triton are never fetched: the GPU machine's own stay in use (fast-attnres pins
# triton==3.7.1 for torch 2.13; with another triton its impl may show as unavailable in
# `routerbench list`, and the check skips it).
#
# Each package is fetched on its own (one that fails does not stop the others): a binary wheel for
# cp312 manylinux x86_64 or a pure-python py3-none-any wheel; a package that has no wheel (fvcore)
# is built here with `pip wheel --no-deps` and kept only when the result is pure python.
#
# Usage: bash scripts/gpu_wheels.sh [DIR]    (default: wheels/ at the root of the checkout)
#        bash scripts/gpu_wheels.sh --list   (what it fetches, one requirement a line; no network)
#        PYTHON=python3.12 bash scripts/gpu_wheels.sh DIR   (the interpreter whose pip is used)
# Exit status: 0 all fetched, 1 some failed (listed), 2 bad usage.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}

# The GPU machine: CPython 3.12 on x86_64 Linux (any manylinux glibc 2.5 .. 2.28).
TARGET=(--python-version 3.12 --implementation cp
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

# Requirement specifiers; versions follow pyproject.toml where it states one.
PKGS=(
  # fvcore's import chain (fvcore itself: below, built from its sdist)
  iopath yacs termcolor portalocker 'tabulate>=0.9'
  'tomli-w>=1.0'
  nvidia-ml-py
  'pytest-benchmark>=4.0' py-cpuinfo
  # peer kernels (pyproject.toml [kernels]; triton left out on purpose)
  'fla-core>=0.6' 'liger-kernel>=0.8.5' 'flash-attn-res>=0.1.12' 'fast-attnres>=2.1' 'einops>=0.8'
)
BUILD=(fvcore)   # no wheel on PyPI: built here (pure python)

case ${1:-} in
  -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  --list) printf '%s\n' "${PKGS[@]}" "${BUILD[@]}"; exit 0 ;;
  -*) echo "gpu_wheels: unknown option $1 (usage: bash scripts/gpu_wheels.sh [DIR | --list])" >&2; exit 2 ;;
esac
(($# <= 1)) || { echo "gpu_wheels: one folder at most (usage: bash scripts/gpu_wheels.sh [DIR])" >&2; exit 2; }
DIR=${1:-$REPO/wheels}
mkdir -p "$DIR" || { echo "gpu_wheels: cannot create $DIR" >&2; exit 2; }
"$PY" -m pip --version >/dev/null 2>&1 || { echo "gpu_wheels: $PY has no pip (set PYTHON=...)" >&2; exit 2; }

failed=()
pure_wheel_of() {   # pure_wheel_of REQ: build REQ's wheel here into DIR, kept only if pure python
  local tmp f kept=0
  tmp=$(mktemp -d) || return 1
  if "$PY" -m pip wheel -q --no-deps -w "$tmp" "$1"; then
    for f in "$tmp"/*.whl; do
      [ -e "$f" ] || continue
      case $f in
        *-none-any.whl) mv -f "$f" "$DIR/" && kept=1 ;;
        *) echo "gpu_wheels: $1 built a platform wheel ($(basename "$f")), not usable on the GPU machine" >&2 ;;
      esac
    done
  fi
  rm -rf "$tmp"
  ((kept))
}

for req in "${PKGS[@]}"; do
  if "$PY" -m pip download -q --no-deps --only-binary=:all: "${TARGET[@]}" -d "$DIR" "$req"; then
    echo "gpu_wheels: $req ok"
  elif pure_wheel_of "$req"; then
    echo "gpu_wheels: $req ok (built here: pure python)"
  else
    echo "gpu_wheels: $req FAILED" >&2
    failed+=("$req")
  fi
done
for req in "${BUILD[@]}"; do
  if pure_wheel_of "$req"; then
    echo "gpu_wheels: $req ok (built here: pure python)"
  else
    echo "gpu_wheels: $req FAILED" >&2
    failed+=("$req")
  fi
done

n=$(find "$DIR" -maxdepth 1 -name '*.whl' | wc -l)
size=$(du -sh "$DIR" 2>/dev/null | cut -f1)
echo "gpu_wheels: $n wheels in $DIR ($size):"
find "$DIR" -maxdepth 1 -name '*.whl' -printf '  %f\n' | sort
if ((${#failed[@]})); then
  echo "gpu_wheels: not fetched: ${failed[*]}" >&2
  exit 1
fi
echo "gpu_wheels: carry $DIR to the GPU machine, then: bash scripts/gpu_check.sh --wheels $DIR"
