#!/usr/bin/env bash
# Build the operator and CPU trainer images from the repository's own Dockerfiles, with no container registry, and
# the image store real nodes start from:
#   - the base (what python:3.12-slim-bookworm is for users) from Debian's packages by debootstrap (base.sh): bookworm
#     minbase with Python 3.11, its venv module and CA certificates (bookworm ships no 3.12; the trainer lock serves
#     both);
#   - uv's image (ghcr.io/astral-sh/uv for users) from uv's PyPI wheel: a scratch image holding /uv;
#   - buildah builds operator/Dockerfile and trainer-image/Dockerfile.cpu unedited, pointed at those two by build args;
#   - the sandbox (pause) image, compiled from the Kubernetes module's own pause.c;
#   - the node store: a containerd root holding all three, imported and unpacked once (node-store.sh); every node's
#     containerd starts from a hard-linked clone of it (hack/localcluster/nodes.py).
# Images are named by a key of what they are built from (Dockerfile, context files, the base's key), so a warm run
# rebuilds nothing and a change rebuilds only what it touches. buildah keeps the current operator and trainer images
# (7 GB for the trainer) beside the store, as the local release pushes them to a registry (hack/release.py local);
# older builds are removed. Storage for podman and buildah is under $FINETUNE_CACHE/containers, not the host's
# /var/lib/containers.
#
#   hack/images/build.sh            build what is missing; the last line printed is the store's path
#   hack/images/build.sh --images   only the base, uv, operator and trainer images (no Go module needed: what a
#                                   setup runs while Go builds Kubernetes; the store comes after)
#   hack/images/build.sh --names    print the image names (built or not) and exit
#   hack/images/build.sh --store    print the store's path (prepared or not) and exit
#   hack/images/build.sh --env      print the environment podman/buildah need for this storage
#
# The CUDA Dockerfiles (trainer-image/Dockerfile, Dockerfile.ort) start from registry images and are not built here.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="$root/hack/images"
cache="${FINETUNE_CACHE:-$HOME/.cache/finetune-operator}"
store="$cache/containers"
SUITE=bookworm
BASE_PACKAGES=python3,python3-venv,python-is-python3,ca-certificates,netbase,passwd
K8S_VERSION="$(cat "$root/hack/localcluster/k8s-version")"
UV_VERSION="$(sed -n 's|.*ghcr.io/astral-sh/uv:\([0-9.]*\).*|\1|p' "$root/trainer-image/Dockerfile.cpu" | head -n1)"

# Keys: a hash of the files an image is built from (plus what its base is).
key() { (cd "$root" && for f in "$@"; do git ls-files -z --cached --others --exclude-standard -- "$f" ; done) \
        | sort -z | (cd "$root" && xargs -0 sha256sum) | sha256sum | cut -c1-12; }
base_key="$(printf '%s %s %s\n' "$SUITE" "$BASE_PACKAGES" "$(sha256sum "$here/base.sh" | cut -c1-12)" | sha256sum | cut -c1-12)"
BASE="localhost/finetune-base:$SUITE-$base_key"
UV="localhost/finetune-uv:$UV_VERSION"
PAUSE="localhost/finetune-pause:$K8S_VERSION"
OPERATOR="localhost/finetune-operator:$(key operator/Dockerfile requirements.lock pyproject.toml README.md operator/finetune_operator | cut -c1-8)-$base_key"
TRAINER="localhost/finetune-trainer:cpu-$(key trainer-image/Dockerfile.cpu trainer-image/requirements.lock trainer-image/pyproject.toml trainer-image/README.md trainer-image/src | cut -c1-8)-$base_key"
NODE_STORE="$cache/node-store-$(printf '%s\n' "$PAUSE" "$OPERATOR" "$TRAINER" "$(sha256sum "$here/node-store.sh" | cut -c1-12)" | sha256sum | cut -c1-12)"

mkdir -p "$store"
# Settings every podman/buildah call here uses (runc: crun cannot run on this hybrid cgroup host; cgroupfs;
# ulimits the host allows; storage under the cache).
cat > "$store/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$store/storage"
runroot = "/run/finetune-containers"
CONF
cat > "$store/containers.conf" <<CONF
[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$store/events.log"
CONF
export CONTAINERS_STORAGE_CONF="$store/storage.conf" CONTAINERS_CONF="$store/containers.conf"

case "${1:-}" in
  --names) printf 'base %s\nuv %s\npause %s\noperator %s\ntrainer %s\n' "$BASE" "$UV" "$PAUSE" "$OPERATOR" "$TRAINER"; exit 0 ;;
  --store) echo "$NODE_STORE"; exit 0 ;;
  --env) printf 'export CONTAINERS_STORAGE_CONF=%q CONTAINERS_CONF=%q\n' "$CONTAINERS_STORAGE_CONF" "$CONTAINERS_CONF"; exit 0 ;;
  --images) images_only=1 ;;
esac
# The builds the store was made from: a rebuild under the same name (the same inputs) is other content, and a node
# that holds other layers than the registry's would fetch all of them.
ids() { for img in "$OPERATOR" "$TRAINER"; do printf '%s %s\n' "$img" "$(podman image inspect --format '{{.Id}}' "$img" 2>/dev/null)"; done; }
built() { [[ -f "$NODE_STORE/.complete" ]] && [[ "$(ids)" == "$(cat "$NODE_STORE/image-ids" 2>/dev/null)" ]]; }
if built; then
  echo "images: $OPERATOR, $TRAINER (cached, and in the node store)" >&2
  echo "$NODE_STORE"
  exit 0
fi

for tool in buildah podman debootstrap containerd ctr gcc go; do
  command -v "$tool" >/dev/null || { echo "images/build.sh: $tool is missing (bash hack/localcluster/host-packages.sh installs it)" >&2; exit 1; }
done
exec 9>"$store/.lock"  # one build at a time
flock 9
if built; then echo "$NODE_STORE"; exit 0; fi  # built by another process meanwhile
# The newest complete store: the next one starts as a hard-linked copy of it, so an image it holds is neither
# rebuilt nor imported again (an operator change does not cost a trainer rebuild).
prev_store=""
if [[ -f "$NODE_STORE/.complete" ]]; then  # holds other builds of these names: the new store starts from it
  rm -rf "$NODE_STORE.old" && mv "$NODE_STORE" "$NODE_STORE.old"
fi
for marker in $(ls -dt "$cache"/node-store-*/.complete 2>/dev/null || true); do prev_store="${marker%/.complete}"; break; done
exists() { podman image exists "$1" 2>/dev/null || { [[ -n "$prev_store" ]] && grep -qx "$1" "$prev_store/images"; }; }
t0=$(date +%s)

if ! exists "$BASE"; then
  bash "$here/base.sh" "$SUITE" "$BASE_PACKAGES" "$BASE" "$store"
fi

if ! exists "$UV"; then
  echo "images: $UV from uv's PyPI wheel" >&2
  tmp="$(mktemp -d)"
  python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_17_x86_64 "uv==$UV_VERSION" -d "$tmp"
  python3 -m zipfile -e "$tmp"/uv-*.whl "$tmp/x"
  install -m 0755 "$tmp"/x/uv-*.data/scripts/uv "$tmp/uv"
  ctr="$(buildah from scratch)"
  buildah copy -q "$ctr" "$tmp/uv" /uv >/dev/null
  buildah commit -q "$ctr" "$UV" >/dev/null
  buildah rm "$ctr" >/dev/null
  rm -rf "$tmp"
fi

if [[ -z "${images_only:-}" ]] && ! exists "$PAUSE"; then
  echo "images: $PAUSE from the Kubernetes module's pause.c" >&2
  # Only the module's source (the Go module cache locks it, so a control-plane build may run beside this).
  mod="$(cd / && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" |
    sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  [[ -f "$mod/build/pause/linux/pause.c" ]] || { echo "images: no pause.c in k8s.io/kubernetes@v$K8S_VERSION" >&2; exit 1; }
  tmp="$(mktemp -d)"
  gcc -Os -static -Wall -DVERSION="v$K8S_VERSION-finetune" -o "$tmp/pause" "$mod/build/pause/linux/pause.c"
  strip "$tmp/pause"
  ctr="$(buildah from scratch)"
  buildah copy -q "$ctr" "$tmp/pause" /pause >/dev/null
  buildah config --entrypoint '["/pause"]' --user 65535:65535 "$ctr"
  buildah commit -q "$ctr" "$PAUSE" >/dev/null
  buildah rm "$ctr" >/dev/null
  rm -rf "$tmp"
fi

# Package downloads inside a build go through this machine's TLS-inspecting proxy: the host's CA bundle is mounted for
# the RUN steps only (nothing of it lands in an image), pip reads it from /etc/pip.conf, uv with native-tls.
printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$store/pip.conf"
printf 'native-tls = true\nno-cache = true\n' > "$store/uv.toml"  # no cache in the build container: 7 GB less at the peak
build() {  # build IMAGE DOCKERFILE CONTEXT
  local image=$1 dockerfile=$2 context=$3 s old
  podman image exists "$image" 2>/dev/null && return 0
  # An older build of the same image goes first (the previous store holds it): one 7 GB trainer at a time.
  for old in $(podman images --format '{{.Repository}}:{{.Tag}}' | grep "^${image%%:*}:" || true); do
    podman rmi -f "$old" >/dev/null 2>&1 || true
  done
  echo "images: building $image from ${dockerfile#"$root"/}" >&2
  s=$(date +%s)
  buildah bud --quiet --format docker --network host --pull=never --layers=false \
    --volume /etc/ssl/certs:/etc/ssl/certs:ro --volume "$store/pip.conf:/etc/pip.conf:ro" \
    --volume "$store/uv.toml:/etc/uv/uv.toml:ro" \
    --build-arg "PYTHON_IMAGE=$BASE" --build-arg "UV_IMAGE=$UV" --build-arg PYTHON_VERSION=3.11 \
    -f "$dockerfile" -t "$image" "$context" > "$store/build.log" 2>&1 || { tail -n 40 "$store/build.log" >&2; return 1; }
  echo "images: built $image in $(( $(date +%s) - s ))s" >&2
}
build "$OPERATOR" "$root/operator/Dockerfile" "$root"
build "$TRAINER" "$root/trainer-image/Dockerfile.cpu" "$root/trainer-image"
[[ -n "${images_only:-}" ]] && { echo "images: built in $(( $(date +%s) - t0 ))s" >&2; exit 0; }

# An image the previous store holds under its name but from another build is imported again (FRESH).
fresh=()
while read -r img id; do
  [[ -n "$prev_store" ]] && grep -qxF "$img $id" "$prev_store/image-ids" 2>/dev/null || fresh+=("$img")
done <<<"$(ids)"
FRESH="${fresh[*]}" bash "$here/node-store.sh" "$NODE_STORE" "$prev_store" "$PAUSE" "$OPERATOR" "$TRAINER"
ids > "$NODE_STORE/image-ids"

# Keep the images the next builds start from and the current operator and trainer; drop every older build.
buildah rm --all >/dev/null 2>&1 || true
keep=("$BASE" "$UV" "$PAUSE" "$OPERATOR" "$TRAINER")
podman images --format '{{.Repository}}:{{.Tag}}' | while read -r img; do
  [[ " ${keep[*]} " == *" $img "* ]] || podman rmi -f "$img" >/dev/null 2>&1 || true
done
podman image prune -f >/dev/null 2>&1 || true
for old in "$cache"/node-store-*; do [[ "$old" == "$NODE_STORE" ]] || rm -rf "$old"; done
echo "images: ready in $(( $(date +%s) - t0 ))s; node store $(du -sh "$NODE_STORE" | cut -f1)" >&2
echo "$NODE_STORE"
