#!/usr/bin/env bash
# Create (or reuse) the project's two virtualenvs outside the repository, each keyed by a hash of the locks that
# decide its third-party packages, so a warm machine skips the multi-GB torch installs:
#   - the development venv: the operator, its tools and the default trainer stack (Python 3.12): it runs pytest,
#     the operator and, in the e2e tier, the trainer "image" of the node agent;
#   - the ONNX Runtime venv: the frozen ORT trainer stack (Python 3.11), whose `finetune-trainer` the ORT tests run.
# Then (re)install this checkout's own packages without dependencies (seconds), so the venvs run this clone's code.
#   .ci/venv.sh             set up both, print nothing but progress
#   .ci/venv.sh --dev       set up the development venv only (make run needs no ONNX Runtime stack)
#   .ci/venv.sh --path      print the development venv's path and exit
#   .ci/venv.sh --ort-path  print the ORT venv's path and exit
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${FINETUNE_CACHE:-$HOME/.cache/finetune-operator}"
cd "$root"
# Keyed by what decides the third-party packages only (editing this script does not force a rebuild).
key() { cat "$@" | sha256sum | cut -c1-16; }
dev="$cache/venv-$(key requirements.lock trainer-image/requirements.lock trainer-image/install.sh)"
ort="$cache/venv-ort-$(key trainer-image/requirements-ort.lock trainer-image/install.sh)"
case "${1:-}" in
  --path) echo "$dev"; exit 0 ;;
  --ort-path) echo "$ort"; exit 0 ;;
  --dev) dev_only=1 ;;
esac

mkdir -p "$cache"
uv="$cache/uv/bin/uv"
if [[ ! -x "$uv" ]]; then
  echo "installing uv into $cache/uv"
  python3.11 -m venv "$cache/uv"
  "$cache/uv/bin/pip" install -q uv==0.13.9
fi
export PATH="$cache/uv/bin:$PATH"
# Bytecode at install time: with PYTHONDONTWRITEBYTECODE set (CI machines set it) nothing is cached at import, and
# every trainer process would compile torch and transformers from source again (about 20 s of CPU each).
export UV_COMPILE_BYTECODE=1

if [[ ! -f "$dev/.complete" ]]; then
  echo "building venv $dev (cold: torch is a multi-GB CUDA wheel)"
  rm -rf "$dev"
  bash trainer-image/install.sh default "$dev"
  "$uv" pip install -q --python "$dev/bin/python" -r requirements.lock
  touch "$dev/.complete" "$dev/.bytecode"
fi
if [[ -z "${dev_only:-}" && ! -f "$ort/.complete" ]]; then
  echo "building venv $ort (cold: torch 2.6 and ONNX Runtime training; ORTModule extensions compile ~7 min)"
  rm -rf "$ort"
  bash trainer-image/install.sh ort "$ort"
  touch "$ort/.complete" "$ort/.bytecode"
fi
# This checkout's own packages, no dependencies: the operator editable (it runs on this machine); the trainer as a
# real copy in site-packages, because the venv doubles as the trainer "image" of the e2e node agent, whose pods get
# /tmp (and so any checkout under it) replaced by an emptyDir, as on a cluster.
"$uv" pip install -q --python "$dev/bin/python" --no-deps -e .
rm -rf trainer-image/build  # a stale setuptools build/ could carry modules deleted from src/
venvs=("$dev")
[[ -n "${dev_only:-}" ]] || venvs+=("$ort")
for venv in "${venvs[@]}"; do
  "$uv" pip install -q --python "$venv/bin/python" --no-deps --reinstall-package finetune-trainer ./trainer-image
done
for venv in "${venvs[@]}"; do
  # Venvs built before bytecode was compiled at install time: compile once (a few files of test suites inside
  # packages do not compile, which is harmless).
  if [[ ! -f "$venv/.bytecode" ]]; then
    echo "compiling the bytecode of $venv"
    "$venv/bin/python" -m compileall -q -j 0 "$venv/lib" >/dev/null 2>&1 || true
    touch "$venv/.bytecode"
  fi
done
echo "venv: $dev"
[[ -n "${dev_only:-}" ]] || echo "ORT venv: $ort"
