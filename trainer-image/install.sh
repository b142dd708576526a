#!/usr/bin/env bash
# Install the trainer's pinned CPU stack into a virtual environment.
#
#   trainer-image/install.sh VENV_DIR
#
# Idempotent: creates VENV_DIR if missing, syncs it to requirements-cpu.lock (uv is fast when nothing
# changed), installs torch-ort with --no-deps, installs this package editable, and compiles ONNX Runtime's
# ORTModule C++ extensions only when they are not built yet (about 6-7 minutes on 2 cores).
# Keep VENV_DIR outside the repository (the CUDA build of torch from PyPI is several GB): CI caches it.
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: $0 VENV_DIR" >&2
    exit 2
fi
venv=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python_bin=${PYTHON:-python3.11}

if ! command -v uv >/dev/null 2>&1; then
    "$python_bin" -m pip install --quiet 'uv>=0.5'
fi

if [[ ! -x "$venv/bin/python" ]]; then
    echo "install.sh: creating $venv"
    uv venv --quiet --python "$python_bin" "$venv"
fi
py="$venv/bin/python"
export VIRTUAL_ENV=$venv

# Pinned third-party stack (install, not sync: the caller may add its own packages to the same venv).
uv pip install --quiet --python "$py" -r "$here/requirements-cpu.lock"
# torch-ort's only job here is to be importable by optimum; its declared deps would pull the GPU ORT.
uv pip install --quiet --python "$py" --no-deps 'torch-ort==1.19.2'
# The trainer itself, editable.
uv pip install --quiet --python "$py" --no-deps -e "$here"

# ORTModule's C++ extensions, compiled against the installed torch, once.
if "$py" - <<'PY'
import sys
from finetune_trainer.accel import ort_extensions_built
sys.exit(0 if ort_extensions_built() else 1)
PY
then
    echo "install.sh: ORTModule extensions already built"
else
    echo "install.sh: compiling ORTModule C++ extensions (about 6-7 minutes on 2 cores)"
    MAX_JOBS=${MAX_JOBS:-2} "$py" -m onnxruntime.training.ortmodule.torch_cpp_extensions.install
fi
echo "install.sh: ready: $venv"
