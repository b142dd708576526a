#!/usr/bin/env bash
# Build the gang schedulers' test pieces from the Go module proxy (no release downloads):
#   bin/kube-scheduler   the scheduler-plugins kube-scheduler (the Coscheduling plugin), from
#                        sigs.k8s.io/scheduler-plugins; crds/ takes its PodGroup CRD (scheduling.x-k8s.io);
#   crds/ (Volcano)      Volcano's PodGroup CRD (scheduling.volcano.sh), generated with controller-gen from the Go
#                        types of volcano.sh/apis: Volcano's scheduler module is not served, its API types are.
# Output: $FINETUNE_CACHE/gangschedulers-<versions>/{bin,crds}. Idempotent: a finished build (marked by .complete) is
# reused; nothing is written into the repository. Cold: about 4 minutes on 2 cores, downloads included.
set -euo pipefail

SCHEDULER_PLUGINS_VERSION="${SCHEDULER_PLUGINS_VERSION:-v0.34.7}"
VOLCANO_APIS_VERSION="${VOLCANO_APIS_VERSION:-v1.9.0}"
CONTROLLER_TOOLS_VERSION="${CONTROLLER_TOOLS_VERSION:-v0.23.0}"
# The proxy refuses k8s.io/csi-translation-lib v0.34.7 (403 "This module version is not available"), which the
# scheduler-plugins go.mod pins with a replace directive; v0.34.5 of the same release line is served and builds.
CSI_TRANSLATION_LIB_VERSION="${CSI_TRANSLATION_LIB_VERSION:-v0.34.5}"
cache="${FINETUNE_CACHE:-$HOME/.cache/finetune-operator}"
out="$cache/gangschedulers-sp-$SCHEDULER_PLUGINS_VERSION-vc-$VOLCANO_APIS_VERSION-cg-$CONTROLLER_TOOLS_VERSION"

# shellcheck source=../lib/cached-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/cached-build.sh"
cached_build gangschedulers "$out" "$@"
export GOFLAGS=-mod=mod CGO_ENABLED=0
start=$(date +%s)
rm -rf "$out/src" "$out/crds"
mkdir -p "$out/src" "$out/bin" "$out/crds"

# scheduler-plugins' go.mod has replace directives, so `go install ...@version` is refused: build its ./cmd/scheduler
# from a writable copy of the module.
mod="$(go mod download -json "sigs.k8s.io/scheduler-plugins@$SCHEDULER_PLUGINS_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
[[ -d "$mod" ]] || { echo "sigs.k8s.io/scheduler-plugins@$SCHEDULER_PLUGINS_VERSION: not downloaded" >&2; exit 1; }
cp -r "$mod" "$out/src/scheduler-plugins"
chmod -R u+w "$out/src/scheduler-plugins"
(
  cd "$out/src/scheduler-plugins"
  go mod edit -replace "k8s.io/csi-translation-lib=k8s.io/csi-translation-lib@$CSI_TRANSLATION_LIB_VERSION"
  echo "building the scheduler-plugins kube-scheduler $SCHEDULER_PLUGINS_VERSION"
  go build -trimpath -ldflags "-s -w" -o "$out/bin/kube-scheduler" ./cmd/scheduler 2>&1 | grep -v '^go: downloading' || true
  cp manifests/coscheduling/crd.yaml "$out/crds/scheduling.x-k8s.io_podgroups.yaml"
)
[[ -x "$out/bin/kube-scheduler" ]] || { echo "the scheduler-plugins kube-scheduler did not build" >&2; exit 1; }

# controller-gen in a throwaway module of its own, then Volcano's CRDs from its API types in another.
go_tool controller-gen sigs.k8s.io/controller-tools "$CONTROLLER_TOOLS_VERSION" sigs.k8s.io/controller-tools/cmd/controller-gen \
  "$out/bin" "$out/src/controller-gen"
crds_from_go_types "$out/bin/controller-gen" volcano.sh/apis "$VOLCANO_APIS_VERSION" \
  volcano.sh/apis/pkg/apis/scheduling/v1beta1 "$out/src/volcano" "$out/crds"
ls "$out/crds"
for crd in scheduling.x-k8s.io_podgroups scheduling.volcano.sh_podgroups; do
  [[ -f "$out/crds/$crd.yaml" ]] || { echo "missing CRD $crd" >&2; exit 1; }
done
rm -rf "$out/src"
echo "built in $(( $(date +%s) - start ))s"
echo "$SCHEDULER_PLUGINS_VERSION $VOLCANO_APIS_VERSION $CONTROLLER_TOOLS_VERSION" > "$out/.complete"
echo "gang schedulers: $out"
