#!/usr/bin/env bash
# The base image both Dockerfiles build on, made from Debian's packages with debootstrap (no registry):
#   base.sh SUITE PACKAGES IMAGE STORE
# The mirror is the one apt on this machine uses; the root filesystem is imported as one layer.
set -euo pipefail
suite=$1 packages=$2 image=$3 store=$4
mirror="$(grep -srhoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
          | awk '{print $2}' | head -n1 || true)"
mirror="${mirror:-http://deb.debian.org/debian}"
rootfs="$store/base-rootfs"
rm -rf "$rootfs"
echo "images: $image by debootstrap $suite from $mirror"
s=$(date +%s)
debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" > "$store/debootstrap.log" 2>&1 \
  || { tail -n 30 "$store/debootstrap.log" >&2; exit 1; }
# As in Debian's own images: no package caches or lists, the mirror for later apt-get calls in the Dockerfiles.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log
printf 'deb %s %s main\ndeb %s %s-updates main\n' "$mirror" "$suite" "$mirror" "$suite" > "$rootfs/etc/apt/sources.list"
tar -C "$rootfs" --numeric-owner -c . | podman import --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' - "$image" >/dev/null
rm -rf "$rootfs"
echo "images: $image in $(( $(date +%s) - s ))s"
