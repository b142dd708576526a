#!/usr/bin/env bash
# Build Kueue's controller manager from the Go module proxy (no release downloads) and copy the manifests the test
# harness installs from the same module: the CRDs and the webhook configurations.
# Output: $FINETUNE_CACHE/kueue-<version>/{bin/kueue,crds/,webhook/manifests.yaml}. Idempotent: a finished build
# (marked by .complete) is reused; nothing is written into the repository. Cold: 166 s on 2 cores, downloads included.
set -euo pipefail

KUEUE_VERSION="${KUEUE_VERSION:-$(cat "$(dirname "${BASH_SOURCE[0]}")/version")}"
cache="${FINETUNE_CACHE:-$HOME/.cache/finetune-operator}"
out="$cache/kueue-$KUEUE_VERSION"

# shellcheck source=../lib/cached-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/cached-build.sh"
cached_build kueue "$out" "$@"
export GOFLAGS=-mod=mod CGO_ENABLED=0
src="$out/src"
rm -rf "$src"
mkdir -p "$src" "$out/bin"
start=$(date +%s)
# A throwaway module that requires Kueue at the pinned version: its go.mod has no replace directives, so minimal
# version selection resolves exactly its own dependency versions.
cd "$src"
printf 'module finetune.dev/kueue\n\ngo 1.26.0\n' > go.mod
printf '//go:build tools\n\npackage tools\n\nimport _ "sigs.k8s.io/kueue/cmd/kueue"\n' > tools.go
go get "sigs.k8s.io/kueue@$KUEUE_VERSION" 2>&1 | grep -v '^go: downloading' || true
mod="$(go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
echo "building kueue $KUEUE_VERSION"
go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
  -o "$out/bin/kueue" sigs.k8s.io/kueue/cmd/kueue
rm -rf "$out/crds" "$out/webhook"
mkdir -p "$out/crds" "$out/webhook"
cp "$mod"/config/components/crd/bases/*.yaml "$out/crds/"
cp "$mod/config/components/webhook/manifests.yaml" "$out/webhook/manifests.yaml"
chmod -R u+w "$out/crds" "$out/webhook"
echo "built in $(( $(date +%s) - start ))s"
echo "$KUEUE_VERSION" > "$out/.complete"
echo "kueue: $out"
