#!/usr/bin/env bash
# Install the Debian packages the real node of tests/cluster needs (tests/cluster/realnode.py):
# containerd and runc run its containers, containernetworking-plugins gives the pod network's
# bridge and host-local plugins (/usr/lib/cni), podman's storage holds the images it loads, and
# gcc with libc6-dev compiles the sandbox's pause (tools/build-binaries.sh --real-node).
# Idempotent; needs root (the real node itself needs it too). Debian 12 ships containerd 1.6.20.
set -euo pipefail
PACKAGES=(containerd runc containernetworking-plugins podman gcc libc6-dev)
missing=()
for package in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
echo "[real-node-deps] installing ${missing[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
# Debian's package enables and starts a system containerd; the real node runs its own (own socket
# and folders) and never talks to that one.
