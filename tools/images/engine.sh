#!/usr/bin/env bash
# Install the container engine the image builds and runs need, from Debian's packages, when any of
# it is missing: buildah (builds the Dockerfiles), podman (runs images, keeps the local storage),
# runc (the OCI runtime that works under cgroup v1 here; crun refuses the hybrid layout) and
# mmdebstrap (assembles the base image from Debian's packages, as no registry is reachable).
set -euo pipefail
missing=()
for tool in buildah podman runc mmdebstrap; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
if [[ $(id -u) -ne 0 ]]; then
  echo "[images] missing ${missing[*]}: install them (Debian: apt-get install podman buildah runc mmdebstrap)" >&2
  exit 1
fi
echo "[images] installing ${missing[*]} from Debian's packages" >&2
apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  podman buildah runc mmdebstrap uidmap >&2
