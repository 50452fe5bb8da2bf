#!/usr/bin/env bash
# Create or update the project's virtual environment (default .venv) and install routerbench.
#
# torch is installed first as `torch==2.13.0` (override with TORCH_SPEC): where a CPU wheel of that
# release is offered to pip (e.g. a local wheel directory in pip's config) pip takes the CPU build,
# and from the default package index on Linux it takes the CUDA build, so one command serves a
# CPU laptop and a GPU box. TORCH_INDEX_URL, when set, is the index torch alone is taken from
# (e.g. https://download.pytorch.org/whl/cpu on a CPU-only CI runner, where the default index
# would give the multi-GB CUDA build). The project itself is then installed editable with its
# test extra.
# Re-running is cheap: nothing is reinstalled unless pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
stamp="$VENV/.routerbench-installed"

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV with $($PYTHON --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi
py="$VENV/bin/python"
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$(cat "$stamp")" = "$TORCH_SPEC" ]; then
  exit 0
fi
# pip's output less the noise of this machine's index config and setuptools' note that every
# editable install gets ("Editable installation. Please be careful with folders…", shown by pip
# >= 26 even with -q); anything else is printed, and a failing pip fails the script.
quiet() {
  local out rc=0
  out=$(PYTHONWARNINGS="ignore:Editable installation${PYTHONWARNINGS:+,$PYTHONWARNINGS}" "$@" 2>&1) || rc=$?
  printf '%s\n' "$out" | grep -v -e "^WARNING: Location" -e "^\s*$" || true
  return "$rc"
}
echo "setup: installing $TORCH_SPEC and routerbench into $VENV"
quiet "$py" -m pip install -q --upgrade pip
if ! "$py" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '${TORCH_SPEC#torch==}' else 1)" 2>/dev/null; then
  quiet "$py" -m pip install -q ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "$TORCH_SPEC"
fi
quiet "$py" -m pip install -q -e ".[test]"
# TileKernels' pure-PyTorch mHC reference (tile_kernels/torch/mhc.py), the cross-check of mhc: its
# package depends on TileLang (GPU compiler), so it is installed without dependencies and the test
# loads that one file by path.
quiet "$py" -m pip install -q --no-deps tile-kernels==1.0.0
"$py" -c "import torch, fvcore, pandas, seaborn; print('setup: torch', torch.__version__, '| CUDA', torch.cuda.is_available())"
echo "$TORCH_SPEC" > "$stamp"
