#!/usr/bin/env bash
# Build (once) the base image the Dockerfiles are built FROM on a machine that cannot pull images:
# a Debian 12 root file system with Python 3.11, assembled from Debian's packages by mmdebstrap and
# imported into the local container storage. Prints the image's name.
#
# The tag carries a hash of this script, so a change to the package list builds a new base and an
# unchanged one is reused (`podman image exists`). Users with a registry never need this: the
# Dockerfiles default to python:3.11-slim-bookworm, the same Debian release and Python minor.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
SUITE=bookworm
# python3-venv: the image's venv (and its pip); ca-certificates: TLS to object storage and the
# status API; libgomp1 and libstdc++6: what torch's wheels link against from the system;
# libpython3.11-dev: Python's headers, which python:3.11-slim carries too (torch.compile's kernels
# include Python.h).
PACKAGES=python3,python3-venv,ca-certificates,libgomp1,libstdc++6,libpython3.11-dev
TAG="localhost/rljob-base:$SUITE-$(cat base.sh | sha256sum | cut -c1-10)"
log() { echo "[images/base] $*" >&2; }

if podman image exists "$TAG"; then echo "$TAG"; exit 0; fi
for tool in mmdebstrap podman; do
  command -v "$tool" >/dev/null || { log "$tool is missing: apt-get install podman buildah runc mmdebstrap"; exit 1; }
done
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
start=$SECONDS
log "assembling Debian $SUITE ($PACKAGES) with mmdebstrap"
# minbase: essential packages and apt only; docs and locales dropped as slim images drop them.
mmdebstrap --quiet --variant=minbase --include="$PACKAGES" \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
  "$SUITE" "$work/rootfs.tar" >&2
podman import --quiet --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' "$work/rootfs.tar" "$TAG" >&2
log "built $TAG in $((SECONDS - start)) s"
echo "$TAG"
