#!/usr/bin/env bash
# Build the trainer and operator images with buildah from the repository's own Dockerfiles, the
# way `docker build` builds them, into the local container storage (podman sees them too).
#
#   tools/images/build.sh [trainer] [operator]     (default: both)
#
# BASE_IMAGE: the Dockerfiles' FROM. Unset, it is the base tools/images/base.sh assembles from
# Debian's packages (no registry is needed); a user with a registry sets nothing and the
# Dockerfiles' default (python:3.11-slim-bookworm) applies. TAG (default dev) names the images
# localhost/rljob-trainer:$TAG and localhost/rljob-operator:$TAG. SOURCE: the repository's address for the
# images' org.opencontainers.image.source label.
#
# Layers are cached (--layers): an unchanged lock reuses the dependency layer, so a code change
# rebuilds in seconds. pip's downloads are cached across builds by the Dockerfiles' cache mount.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
TAG="${TAG:-dev}"
IMAGES=("$@"); [[ ${#IMAGES[@]} -gt 0 ]] || IMAGES=(trainer operator)
BASE_IMAGE="${BASE_IMAGE:-$(tools/images/base.sh)}"
log() { echo "[images] $*" >&2; }

# This machine's limits: no CAP_SYS_RESOURCE, so buildah's default rlimits are refused, and the
# chroot isolation runs without a user namespace. The host's CA bundle and pip configuration are
# mounted for the RUN steps only (a proxy's certificate, an index), never copied into the image.
ARGS=(--isolation chroot --ulimit nofile=20000:20000 --ulimit nproc=32768:32768 --layers)
for f in /etc/ssl/certs/ca-certificates.crt /etc/pip.conf; do
  [[ -f "$f" ]] && ARGS+=(--volume "$f:$f:ro")
done

# The OCI labels (org.opencontainers.image.version/revision/source) and the SBOM's version: rljob's version
# (pyproject.toml), the commit (with -dirty when the work tree has changes), the repository's address.
VERSION="$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
REVISION="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
[[ "$REVISION" == unknown ]] || git diff --quiet HEAD 2>/dev/null || REVISION="$REVISION-dirty"
SOURCE="${SOURCE:-https://github.com/rljob/rljob}"
ARGS+=(--build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION" --build-arg "SOURCE=$SOURCE")

for image in "${IMAGES[@]}"; do
  start=$SECONDS
  log "building localhost/rljob-$image:$TAG from Dockerfile.$image on $BASE_IMAGE"
  buildah bud "${ARGS[@]}" --build-arg "BASE_IMAGE=$BASE_IMAGE" -f "Dockerfile.$image" \
    -t "localhost/rljob-$image:$TAG" . >&2
  size="$(podman image inspect --format '{{.Size}}' "localhost/rljob-$image:$TAG")"
  log "built localhost/rljob-$image:$TAG in $((SECONDS - start)) s, $((size / 1048576)) MiB"
done
# Drop the layers a rebuild replaced (dangling leaves only: the cached layers below the tags stay), so
# a machine that rebuilds on every code change does not fill its disk.
podman image prune --force >/dev/null
