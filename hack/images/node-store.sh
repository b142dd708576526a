#!/usr/bin/env bash
# The image store real nodes start from (called by build.sh):  [FRESH="IMAGE..."] node-store.sh STORE PREVIOUS_STORE PAUSE_IMAGE IMAGE...
# A containerd root (STORE/root) holding the images, imported from buildah's storage and unpacked once into
# overlayfs snapshots. It starts as a hard-linked copy of PREVIOUS_STORE (may be empty): an image that one holds is
# kept, not imported again, and the images no longer wanted are removed from the copy. The layer blobs are then dropped, as containerd's own discard_unpacked_layers does: a node
# runs containers from the snapshots and never needs them again (nothing is pushed from a node). Each node's
# containerd gets a hard-linked clone of the root (hack/localcluster/nodes.py: clone_store), so a node costs
# seconds and no copy of the multi-GB trainer image.
set -euo pipefail
store=$1 previous=$2 pause=$3
shift 3
echo "images: importing into the node store $store" >&2
s=$(date +%s)
rm -rf "$store"
mkdir -p "$store"
if [[ -n "$previous" && -f "$previous/.complete" ]]; then
  cp -al "$previous/root" "$store/root"
  find "$store/root" -name '*.db' -exec sh -c 'cp --preserve=all "$1" "$1.copy" && mv "$1.copy" "$1"' _ {} \;
else
  mkdir -p "$store/root"
fi
run=/run/finetune-node-store
mkdir -p "$run"
cat > "$store/containerd.toml" <<CONF
version = 2
root = "$store/root"
state = "$run"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$run/containerd.sock"
[ttrpc]
  address = "$run/containerd.sock.ttrpc"
CONF
containerd --config "$store/containerd.toml" > "$store/containerd.log" 2>&1 &
ctd=$!
cleanup() {
  kill "$ctd" 2>/dev/null && wait "$ctd" 2>/dev/null || true
  awk -v r="$run" 'index($5, r) == 1 {print $5}' /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l
  rm -rf "$run"
}
trap cleanup EXIT
for _ in $(seq 100); do [[ -S "$run/containerd.sock" ]] && break; sleep 0.1; done
ctr=(ctr --address "$run/containerd.sock" -n k8s.io)
have="$("${ctr[@]}" images ls -q)"
for img in ${FRESH:-}; do  # another build under a name the previous store holds: imported again
  if grep -qx "$img" <<<"$have"; then "${ctr[@]}" images rm --sync "$img" >/dev/null; fi
done
have="$("${ctr[@]}" images ls -q)"
for img in $have; do  # images of the previous store that are not wanted any more (--sync: their snapshots go too)
  [[ " $pause $* " == *" $img "* ]] || "${ctr[@]}" images rm --sync "$img" >/dev/null
done
for img in "$pause" "$@"; do
  grep -qx "$img" <<<"$have" && { echo "images: $img kept from the previous store" >&2; continue; }
  t=$(date +%s)
  podman save --format docker-archive "$img" | "${ctr[@]}" images import --snapshotter overlayfs - >/dev/null
  echo "images: $img imported and unpacked in $(( $(date +%s) - t ))s" >&2
done
# Drop the layer blobs (the snapshots hold their content): the references of each manifest to its layers go, then
# the blobs themselves.
for digest in $("${ctr[@]}" content ls | grep -o 'containerd.io/gc.ref.content.l.[0-9]*=sha256:[0-9a-f]*' | cut -d= -f2 | sort -u); do
  "${ctr[@]}" content rm "$digest" >/dev/null 2>&1 || true
done
# containerd deletes a removed blob's file at its next garbage collection, which may not come before it stops (and a
# restarted containerd does not know the store is dirty): remove the files no reference names any more.
referenced="$("${ctr[@]}" content ls -q)"
for blob in "$store"/root/io.containerd.content.v1.content/blobs/sha256/*; do
  [[ -e "$blob" ]] && ! grep -qx "sha256:${blob##*/}" <<<"$referenced" && rm -f "$blob"
done
# The list first, then the match: `ctr ... | grep -q` under pipefail fails when grep exits at the match before ctr has
# written the names after it (SIGPIPE), as soon as an image sorts after the pause image.
imported="$("${ctr[@]}" images ls -q)"
grep -qx "$pause" <<<"$imported" || { echo "node-store.sh: $pause missing after import" >&2; exit 1; }
cleanup
trap - EXIT
echo "$pause" > "$store/pause-image"
printf '%s\n' "$@" > "$store/images"
touch "$store/.complete"
echo "images: node store ready in $(( $(date +%s) - s ))s" >&2
