#!/usr/bin/env bash
# `make release REGISTRY=… [VERSION=…]`: build both images, push them, and push the chart as an OCI
# artifact whose values pin both images by digest.
#
#   REGISTRY     where to push, without a scheme: ghcr.io/rljob, registry.example.com/ml, or the dev
#                cluster's 127.0.0.1:<port>/rljob. Images go to $REGISTRY/trainer and $REGISTRY/operator
#                (tag $VERSION), the chart to oci://$REGISTRY/charts/rljob (version $VERSION).
#   VERSION      rljob's version; pyproject.toml's when unset, and refused when it differs (one number,
#                bumped in one place: `make generate` carries it to the chart, the CRDs and the code).
#   PLAIN_HTTP=1 the registry speaks plain HTTP (the dev cluster's): podman --tls-verify=false, helm --plain-http.
#   COMPRESSION  the layers' compression for podman push: gzip (the default; every runtime reads it) or zstd
#                (faster to push; containerd >= 1.5 and Docker >= 23 read it).
#   SOURCE       the repository's address, for the images' org.opencontainers.image.source label.
#
# Prints each image's digest, the chart's reference and digest, and the SBOMs' paths (in the images and
# copied out). Writes dist/release/: digests.txt, notes.md (the release notes), the chart's .tgz and the SBOMs.
# Logging in is the caller's (`podman login`, `helm registry login`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
log() { echo "[release] $*" >&2; }
fail() { echo "[release] $*" >&2; exit 1; }

PROJECT_VERSION="$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
VERSION="${VERSION:-$PROJECT_VERSION}"
REGISTRY="${REGISTRY:-}"
COMPRESSION="${COMPRESSION:-gzip}"
[[ -n "$REGISTRY" && "$REGISTRY" != 1 ]] || fail "REGISTRY is required: make release REGISTRY=ghcr.io/<owner> (no scheme)"
[[ "$REGISTRY" != *://* && "$REGISTRY" != */ ]] || fail "REGISTRY=$REGISTRY: give host[:port]/path, without a scheme or a trailing /"
[[ "$VERSION" == "$PROJECT_VERSION" ]] || fail "VERSION=$VERSION differs from pyproject.toml's $PROJECT_VERSION: bump [project] version there and run make generate"
[[ "$COMPRESSION" == gzip || "$COMPRESSION" == zstd ]] || fail "COMPRESSION=$COMPRESSION: gzip or zstd"
tools/gen_version.py --check >/dev/null || fail "a file states another version than pyproject.toml's: run make generate"

PODMAN_FLAGS=(--compression-format "$COMPRESSION")
HELM_FLAGS=()
if [[ "${PLAIN_HTTP:-0}" == 1 ]]; then PODMAN_FLAGS+=(--tls-verify=false); HELM_FLAGS+=(--plain-http); fi
HELM="$(tools/build-binaries.sh --check)/helm"
OUT=dist/release
rm -rf "$OUT" && mkdir -p "$OUT"

log "building rljob-trainer and rljob-operator $VERSION (tools/images/build.sh)"
TAG="$VERSION" tools/images/build.sh trainer operator

declare -A DIGEST
for image in trainer operator; do
  local_name="localhost/rljob-$image:$VERSION" remote="$REGISTRY/$image:$VERSION"
  log "pushing $remote ($COMPRESSION)"
  podman push --quiet "${PODMAN_FLAGS[@]}" --digestfile "$OUT/$image.digest" "$local_name" "$remote" >&2
  DIGEST[$image]="$(cat "$OUT/$image.digest")"
  # The SBOM the build wrote into the image, copied out of it (not regenerated).
  container="$(podman create --quiet "$local_name")"
  podman cp "$container:/opt/rljob/sbom/rljob-$image.cdx.json" "$OUT/rljob-$image-$VERSION.cdx.json"
  podman rm --force "$container" >/dev/null
done

log "pushing the chart, its values pinned to both images by digest"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
cp -r charts/rljob "$work/rljob"
python3 tools/pin_chart.py "$work/rljob/values.yaml" --registry "$REGISTRY" --version "$VERSION" \
  --operator-digest "${DIGEST[operator]}" --trainer-digest "${DIGEST[trainer]}"
"$HELM" package "$work/rljob" --version "$VERSION" --app-version "$VERSION" --destination "$OUT" >&2
"$HELM" push "$OUT/rljob-$VERSION.tgz" "oci://$REGISTRY/charts" "${HELM_FLAGS[@]}" 2>&1 | tee "$OUT/chart-push.log" >&2
CHART_DIGEST="$(sed -n 's/^Digest: //p' "$OUT/chart-push.log")"

{
  echo "$REGISTRY/trainer:$VERSION@${DIGEST[trainer]}"
  echo "$REGISTRY/operator:$VERSION@${DIGEST[operator]}"
  echo "oci://$REGISTRY/charts/rljob:$VERSION@$CHART_DIGEST"
} >"$OUT/digests.txt"
tools/release_notes.sh "$VERSION" "$REGISTRY" "${DIGEST[trainer]}" "${DIGEST[operator]}" "$CHART_DIGEST" >"$OUT/notes.md"

cat <<EOF
rljob $VERSION released to $REGISTRY
  trainer image   $REGISTRY/trainer@${DIGEST[trainer]}
  operator image  $REGISTRY/operator@${DIGEST[operator]}
  chart           oci://$REGISTRY/charts/rljob --version $VERSION (digest $CHART_DIGEST; values pin both images by digest)
  SBOMs (CycloneDX, in the images at /opt/rljob/sbom/, copied to $OUT/):
    $OUT/rljob-trainer-$VERSION.cdx.json
    $OUT/rljob-operator-$VERSION.cdx.json
  install: helm install rljob oci://$REGISTRY/charts/rljob --version $VERSION${HELM_FLAGS:+ ${HELM_FLAGS[*]}} -n rljob-system --create-namespace
EOF
