#!/usr/bin/env bash
# `make run`: set up only what the main job uses, then run it (python -m hack.demo). Cold, the development venv
# and the images (mostly downloads) are built while Go compiles Kubernetes, the node binaries and helm; warm, every
# step is a cache check. Not set up: the ONNX Runtime stack, Kueue, promtool.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$(date +%s)
bash hack/localcluster/host-packages.sh
log=$(mktemp)
setsid bash -c 'bash .ci/venv.sh --dev && bash hack/images/build.sh --images' > "$log" 2>&1 &
side=$!
trap 'kill -- "-$side" 2>/dev/null || true; cat "$log"; rm -f "$log"' EXIT
bash hack/localcluster/build.sh
bash hack/localcluster/build-node.sh
bash hack/helmtools/build.sh --helm
if ! wait "$side"; then echo "make run: building the venv or the images failed" >&2; exit 1; fi
trap - EXIT
cat "$log" && rm -f "$log"
bash hack/images/build.sh >/dev/null  # the node store (needs the Kubernetes module for the sandbox image)
echo "make run: set up in $(( $(date +%s) - start ))s"
exec "$(bash .ci/venv.sh --path)/bin/python" -m hack.demo "$@"
