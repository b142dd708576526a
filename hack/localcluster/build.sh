#!/usr/bin/env bash
# Build the real Kubernetes control-plane binaries (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl) and etcd from the Go module proxy, in one `go build` so they share
# the compile cache. Output: $FINETUNE_CACHE/k8s-<version>/bin. Idempotent: a finished build
# (marked by .complete) is reused; nothing is written into the repository.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-$(cat "$(dirname "${BASH_SOURCE[0]}")/k8s-version")}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${FINETUNE_CACHE:-$HOME/.cache/finetune-operator}"
out="$cache/k8s-$K8S_VERSION"
bin="$out/bin"

if [[ -f "$out/.complete" ]]; then
  echo "control plane binaries: $bin (cached, Kubernetes v$K8S_VERSION)"
  exit 0
fi

command -v go >/dev/null || { echo "build.sh: the go toolchain is required" >&2; exit 1; }
src="$out/src"
rm -rf "$src"
mkdir -p "$src/cmd/etcd" "$bin"
cp "$here/gomod/cmd/etcd/main.go" "$src/cmd/etcd/main.go"

# The throwaway module: k8s.io/kubernetes requires its staging modules at v0.0.0 and
# replaces them with ./staging in its own tree; outside that tree each needs a replace
# pointing at the matching v0.X.Y release.
minor="${K8S_VERSION#*.}"
staging_version="v0.$minor"
{
  echo "module finetune.dev/localcluster"
  echo
  echo "go 1.26.0"
  echo
  echo "require k8s.io/kubernetes v$K8S_VERSION"
  echo
  echo "replace ("
  k8s_mod="$(GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  grep -oE '^\s+k8s\.io/[a-z0-9-]+ v0\.0\.0$' "$k8s_mod" | awk -v v="$staging_version" '{print "\t" $1 " => " $1 " " v}'
  echo ")"
} > "$src/go.mod"

cd "$src"
# etcd at exactly the version Kubernetes pins, so MVS leaves Kubernetes' own dependencies alone.
etcd_version="$(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2}' "$k8s_mod")"
echo "resolving modules for Kubernetes v$K8S_VERSION and etcd $etcd_version"
GOFLAGS=-mod=mod go get "k8s.io/kubernetes@v$K8S_VERSION" "go.etcd.io/etcd/server/v3@$etcd_version" 2>&1 | grep -v '^go: downloading' || true

ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=v$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=${minor%%.*}"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
ldflags+=" -X go.etcd.io/etcd/api/v3/version.GitSHA=module-${etcd_version}"

echo "building kube-apiserver kube-controller-manager kube-scheduler kubectl etcd (cold: ~20-30 min on 2 cores)"
start=$(date +%s)
GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bin/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kubectl \
  ./cmd/etcd
echo "built in $(( $(date +%s) - start ))s"
"$bin/kube-apiserver" --version
"$bin/etcd" --version | sed -n 1p  # sed reads to the end: `head` would close the pipe early (SIGPIPE under pipefail)
echo "v$K8S_VERSION" > "$out/.complete"
echo "control plane binaries: $bin"
