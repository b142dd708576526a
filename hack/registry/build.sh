#!/usr/bin/env bash
# Build the CNCF distribution registry (github.com/distribution/distribution/v3, the registry Docker Hub and most
# private registries run) from the Go module proxy (no release downloads), for the local release (hack/registry).
# Output: $FINETUNE_CACHE/registry-<version>/bin/registry. Idempotent: a finished build (marked by .complete) is
# reused; nothing is written into the repository. Cold: about 100 s on 2 cores, downloads included.
set -euo pipefail

REGISTRY_VERSION="${REGISTRY_VERSION:-$(cat "$(dirname "${BASH_SOURCE[0]}")/version")}"
cache="${FINETUNE_CACHE:-$HOME/.cache/finetune-operator}"
out="$cache/registry-$REGISTRY_VERSION"

# shellcheck source=../lib/cached-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/cached-build.sh"
cached_build registry "$out" "$@"
start=$(date +%s)
rm -rf "$out"
mkdir -p "$out/bin"
# `go install pkg@version` resolves the module's own go.mod, with no replace directives of ours.
GOFLAGS=-mod=mod CGO_ENABLED=0 GOBIN="$out/bin" go install -trimpath -ldflags "-s -w" \
  "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION" 2>&1 | grep -v '^go: downloading' || true
[[ -x "$out/bin/registry" ]] || { echo "registry/build.sh: no binary built" >&2; exit 1; }
echo "built in $(( $(date +%s) - start ))s"
echo "$REGISTRY_VERSION" > "$out/.complete"
echo "registry: $out"
