#!/usr/bin/env bash
# Debian packages real nodes and the image builds need on the host (root): the container runtime (containerd, runc),
# the CNI plugins, iptables and conntrack (kube-proxy), and the image tools (buildah, podman, debootstrap; gcc and
# libc's static archive for the sandbox image), and headless Chromium (the web view's browser tests). Installs only
# what is missing; a no-op on a prepared machine.
set -euo pipefail
declare -A need=(
  [containerd]=containerd [runc]=runc [ctr]=containerd [buildah]=buildah [podman]=podman [debootstrap]=debootstrap
  [iptables]=iptables [conntrack]=conntrack [ip]=iproute2 [gcc]=gcc [openssl]=openssl
  [chromium-headless-shell]=chromium-headless-shell
)
missing=()
for tool in "${!need[@]}"; do command -v "$tool" >/dev/null || missing+=("${need[$tool]}"); done
[[ -x /usr/lib/cni/bridge ]] || missing+=(containernetworking-plugins)
[[ -f /usr/lib/x86_64-linux-gnu/libc.a ]] || missing+=(libc6-dev)
if ((${#missing[@]})); then
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  echo "host-packages: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# buildah and podman refuse to run without a signature policy; a conffile an administrator deleted is not put back by a
# plain reinstall, so ask dpkg for it.
if [[ ! -f /etc/containers/policy.json ]]; then
  echo "host-packages: restoring /etc/containers/policy.json"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --reinstall -o Dpkg::Options::=--force-confmiss \
    golang-github-containers-common >/dev/null
fi
# The Debian containerd package may start a host containerd of its own (where there is an init system): real nodes
# run their own, on their own sockets, and never use it.
echo "host-packages: ready"
