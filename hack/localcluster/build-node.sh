#!/usr/bin/env bash
# Build what real nodes run beside the control plane, from the Go module proxy: kubelet and kube-proxy (from the
# same throwaway module and compile cache as build.sh's binaries, so only their own packages compile) and CoreDNS
# (its own module at the pinned version). Output: $FINETUNE_CACHE/k8s-<version>/bin. Idempotent (.node-complete).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
K8S_VERSION="${K8S_VERSION:-$(cat "$here/k8s-version")}"
COREDNS_VERSION="$(cat "$here/coredns-version")"
cache="${FINETUNE_CACHE:-$HOME/.cache/finetune-operator}"
out="$cache/k8s-$K8S_VERSION"
bin="$out/bin"
marker="$out/.node-complete"
if [[ -f "$marker" && "$(cat "$marker")" == "v$K8S_VERSION coredns-$COREDNS_VERSION" ]]; then
  echo "node binaries: $bin (cached: kubelet, kube-proxy, coredns $COREDNS_VERSION)"
  exit 0
fi
bash "$here/build.sh"  # the module and compile cache the kubelet build reuses
exec 9>"$out.node.lock"
flock 9
if [[ -f "$marker" && "$(cat "$marker")" == "v$K8S_VERSION coredns-$COREDNS_VERSION" ]]; then exit 0; fi  # built meanwhile
export GOFLAGS=-mod=mod CGO_ENABLED=0
minor="${K8S_VERSION#*.}"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=v$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=${minor%%.*}"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
start=$(date +%s)
echo "building kubelet and kube-proxy v$K8S_VERSION"
(cd "$out/src" && go build -trimpath -ldflags "$ldflags" -o "$bin/" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)
echo "building coredns $COREDNS_VERSION"
rm -f "$bin/coredns"
if ! GOBIN="$bin" go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS_VERSION" > "$out/coredns-build.log" 2>&1; then
  grep -v '^go: downloading' "$out/coredns-build.log" >&2
  echo "build-node.sh: coredns $COREDNS_VERSION did not build" >&2
  exit 1
fi
"$bin/kubelet" --version
"$bin/coredns" -version | sed -n 1p
echo "node binaries built in $(( $(date +%s) - start ))s"
echo "v$K8S_VERSION coredns-$COREDNS_VERSION" > "$marker"
