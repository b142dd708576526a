#!/usr/bin/env bash
# Create (or reuse) the project's virtualenv outside the repository, keyed by a hash of the locks,
# so a warm machine skips the multi-GB torch install. Then (re)install this checkout's own packages,
# without dependencies (seconds), so the venv always runs the code of this clone.
#   .ci/venv.sh          set up, print nothing but progress
#   .ci/venv.sh --path   print the venv's path and exit
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${FINETUNE_CACHE:-$HOME/.cache/finetune-operator}"
cd "$root"
locks=(requirements.lock)
[[ -f trainer-image/requirements-cpu.lock ]] && locks+=(trainer-image/requirements-cpu.lock trainer-image/install.sh)
# Keyed by what decides the third-party packages only (editing this script does not force a rebuild).
key="$(cat "${locks[@]}" | sha256sum | cut -c1-16)"
venv="$cache/venv-$key"
if [[ "${1:-}" == "--path" ]]; then echo "$venv"; exit 0; fi

mkdir -p "$cache"
uv="$cache/uv/bin/uv"
if [[ ! -x "$uv" ]]; then
  echo "installing uv into $cache/uv"
  python3.11 -m venv "$cache/uv"
  "$cache/uv/bin/pip" install -q uv==0.13.9
fi
export PATH="$cache/uv/bin:$PATH"

if [[ ! -f "$venv/.complete" ]]; then
  echo "building venv $venv (cold: torch is a multi-GB CUDA wheel; ORT extensions compile ~7 min)"
  rm -rf "$venv"
  if [[ -f trainer-image/install.sh ]]; then
    bash trainer-image/install.sh "$venv"
  else
    "$uv" venv -q --python python3.11 "$venv"
  fi
  "$uv" pip install -q --python "$venv/bin/python" -r requirements.lock
  touch "$venv/.complete"
fi
# This checkout's own packages, no dependencies: the operator editable (it runs on this machine); the
# trainer as a real copy in site-packages, because the venv doubles as the trainer "image" of the e2e node
# agent, whose pods get /tmp (and so any checkout under it) replaced by an emptyDir, as on a cluster.
"$uv" pip install -q --python "$venv/bin/python" --no-deps -e .
if [[ -f trainer-image/pyproject.toml ]]; then
  "$uv" pip install -q --python "$venv/bin/python" --no-deps --reinstall-package finetune-trainer ./trainer-image
fi
echo "venv: $venv"
