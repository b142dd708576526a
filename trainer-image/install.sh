#!/usr/bin/env bash
# Install one of the trainer's two pinned stacks into a virtual environment.
#
#   trainer-image/install.sh default VENV_DIR   current torch / transformers (requirements.lock), Python 3.12
#                                               (3.11 where no 3.12 is found: the lock serves both)
#   trainer-image/install.sh ort VENV_DIR       the frozen ONNX Runtime stack (requirements-ort.lock), Python 3.11
#
# Idempotent: creates VENV_DIR if missing, installs the lock (uv is fast when nothing changed) and this package
# (a copy, not editable). For `ort` it also installs torch-ort with --no-deps and compiles ONNX Runtime's ORTModule
# C++ extensions when they are not built yet (about 6-7 minutes on 2 cores).
# Keep VENV_DIR outside the repository (PyPI's torch is a CUDA build of several GB): CI caches it.
# PYTHON=/path/to/python overrides the interpreter.
set -euo pipefail

if [[ $# -ne 2 || ! "$1" =~ ^(default|ort)$ ]]; then
    echo "usage: $0 default|ort VENV_DIR" >&2
    exit 2
fi
stack=$1
venv=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# The first interpreter of the wanted minor versions that really runs (a pyenv shim of a version that is not
# selected exists but fails, so `command -v` alone is not enough).
find_python() {
    local v candidate
    for v in "$@"; do
        for candidate in "python$v" /root/.pyenv/versions/"$v".*/bin/"python$v" "$HOME"/.pyenv/versions/"$v".*/bin/"python$v" \
            /usr/bin/"python$v" /usr/local/bin/"python$v"; do
            if "$candidate" -c 'import ssl, sqlite3' >/dev/null 2>&1; then
                command -v "$candidate" 2>/dev/null || echo "$candidate"
                return 0
            fi
        done
    done
    return 1
}

if [[ $stack == default ]]; then
    lock=$here/requirements.lock
    python_bin=${PYTHON:-$(find_python 3.12 3.11)} || { echo "install.sh: Python 3.12 or 3.11 is required" >&2; exit 1; }
else
    lock=$here/requirements-ort.lock
    # onnxruntime-training 1.19.2 has wheels for Python 3.10 and 3.11 only.
    python_bin=${PYTHON:-$(find_python 3.11)} || { echo "install.sh: Python 3.11 is required for the ORT stack" >&2; exit 1; }
fi

version=$("$python_bin" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [[ $stack == default && ! $version =~ ^3\.1[12]$ ]] || [[ $stack == ort && $version != 3.11 ]]; then
    echo "install.sh: $python_bin is Python $version; the $stack stack needs $([[ $stack == ort ]] && echo 3.11 || echo '3.12 or 3.11')" >&2
    exit 1
fi

if ! command -v uv >/dev/null 2>&1; then
    # A venv of its own for uv (never the system interpreter: Debian's refuses pip installs), at the pinned version.
    tools=${XDG_CACHE_HOME:-$HOME/.cache}/finetune-operator/uv
    [[ -x $tools/bin/uv ]] || { "$python_bin" -m venv "$tools" && "$tools/bin/pip" install --quiet uv==0.13.9; }
    export PATH=$tools/bin:$PATH
fi

if [[ ! -x "$venv/bin/python" ]]; then
    echo "install.sh: creating $venv ($stack stack, $("$python_bin" --version))"
    uv venv --quiet --python "$python_bin" "$venv"
fi
py="$venv/bin/python"
export VIRTUAL_ENV=$venv

# Pinned third-party stack (install, not sync: the caller may add its own packages to the same venv).
uv pip install --quiet --python "$py" -r "$lock"
if [[ $stack == ort ]]; then
    # torch-ort's only job here is to be importable by optimum; its declared deps would pull the GPU ORT.
    uv pip install --quiet --python "$py" --no-deps 'torch-ort==1.19.2'
fi
# The trainer itself (a stale setuptools build/ directory could carry modules deleted from src/).
rm -rf "$here/build"
uv pip install --quiet --python "$py" --no-deps --reinstall-package finetune-trainer "$here"

if [[ $stack == ort ]]; then
    # ORTModule's C++ extensions, compiled against the installed torch, once.
    if "$py" -c 'import sys; from finetune_trainer.accel import ort_extensions_built as b; sys.exit(0 if b() else 1)'; then
        echo "install.sh: ORTModule extensions already built"
    else
        echo "install.sh: compiling ORTModule C++ extensions (about 6-7 minutes on 2 cores)"
        MAX_JOBS=${MAX_JOBS:-2} "$py" -m onnxruntime.training.ortmodule.torch_cpp_extensions.install
    fi
fi
echo "install.sh: ready: $venv ($stack stack)"
