#!/usr/bin/env bash
# Build the chart test tools from the Go module proxy (no release downloads):
#   helm            helm.sh/helm/v4/cmd/helm
#   promtool        github.com/prometheus/prometheus/cmd/promtool
#   controller-gen  sigs.k8s.io/controller-tools/cmd/controller-gen
# and generate the Prometheus Operator CRDs (ServiceMonitor, PodMonitor, PrometheusRule, ...) with
# controller-gen from the github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring module.
# Output: $FINETUNE_CACHE/tools-<versions>/{bin,crds}. Idempotent: a finished build (marked by .complete)
# is reused; nothing is written into the repository. Each tool is built in its own throwaway module so
# Go's minimal version selection never mixes their Kubernetes library versions.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v4.3.1}"
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"
CONTROLLER_TOOLS_VERSION="${CONTROLLER_TOOLS_VERSION:-v0.23.0}"
PROM_OPERATOR_VERSION="${PROM_OPERATOR_VERSION:-v0.95.2}"

cache="${FINETUNE_CACHE:-$HOME/.cache/finetune-operator}"
out="$cache/tools-helm-$HELM_VERSION-prom-$PROMETHEUS_VERSION-cg-$CONTROLLER_TOOLS_VERSION-po-$PROM_OPERATOR_VERSION"
bin="$out/bin"

if [[ "${1:-}" == "--path" ]]; then echo "$out"; exit 0; fi
helm_only=""
if [[ "${1:-}" == "--helm" ]]; then  # helm alone (make run installs the chart and needs nothing else)
  helm_only=1
  [[ -f "$out/.helm-complete" ]] && { echo "helm: $bin/helm (cached)"; exit 0; }
fi
if [[ -f "$out/.complete" ]]; then
  echo "chart tools: $out (cached)"
  exit 0
fi
command -v go >/dev/null || { echo "helmtools/build.sh: the go toolchain is required" >&2; exit 1; }
mkdir -p "$cache"
# One build at a time (parallel test sessions): wait for the lock, then re-check the marker.
exec 9>"$out.lock"
flock 9
if [[ -f "$out/.complete" ]]; then echo "chart tools: $out (built by another process)"; exit 0; fi
export GOFLAGS=-mod=mod CGO_ENABLED=0
mkdir -p "$bin"
start=$(date +%s)

# shellcheck source=../lib/cached-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/cached-build.sh"
# build <name> <module> <version> <package> [ldflags] [tags]
build() { go_tool "$1" "$2" "$3" "$4" "$bin" "$out/src/$1" "${5:-}" "${6:-}"; }

if [[ ! -f "$out/.helm-complete" ]]; then
  build helm helm.sh/helm/v4 "$HELM_VERSION" helm.sh/helm/v4/cmd/helm \
    "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
  touch "$out/.helm-complete"
fi
if [[ -n "$helm_only" ]]; then "$bin/helm" version; exit 0; fi
# remove_all_sd: no service-discovery plugins (the cloud SDKs are most of its compile time; `promtool test rules`
# and `check rules` use none): 134 s instead of 311 s cold on 2 cores.
build promtool github.com/prometheus/prometheus "$PROMETHEUS_VERSION" github.com/prometheus/prometheus/cmd/promtool \
  "-X github.com/prometheus/common/version.Version=$PROMETHEUS_VERSION" remove_all_sd
build controller-gen sigs.k8s.io/controller-tools "$CONTROLLER_TOOLS_VERSION" sigs.k8s.io/controller-tools/cmd/controller-gen

# The Prometheus Operator CRDs, generated from the Go types of the monitoring API module.
rm -rf "$out/src/monitoring" "$out/crds"
mon=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring
crds_from_go_types "$bin/controller-gen" "$mon" "$PROM_OPERATOR_VERSION" "$mon/v1" "$out/src/monitoring" "$out/crds"
ls "$out/crds"
for kind in servicemonitors podmonitors prometheusrules; do
  [[ -f "$out/crds/monitoring.coreos.com_$kind.yaml" ]] || { echo "missing CRD $kind" >&2; exit 1; }
done
"$bin/helm" version
"$bin/promtool" --version | sed -n 1p  # not head: SIGPIPE under pipefail
echo "built in $(( $(date +%s) - start ))s"
echo "$HELM_VERSION $PROMETHEUS_VERSION $CONTROLLER_TOOLS_VERSION $PROM_OPERATOR_VERSION" > "$out/.complete"
echo "chart tools: $out"
