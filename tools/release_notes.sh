#!/usr/bin/env bash
# The release notes of `make release` (tools/release.sh), Markdown on stdout: what was pushed, by digest,
# how to install it, and the commits since the previous tag.
#   tools/release_notes.sh VERSION REGISTRY TRAINER_DIGEST OPERATOR_DIGEST CHART_DIGEST
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
version="$1" registry="$2" trainer="$3" operator="$4" chart="$5"
previous="$(git describe --tags --abbrev=0 "v$version^" 2>/dev/null || git describe --tags --abbrev=0 HEAD^ 2>/dev/null || true)"
cat <<NOTES
# rljob $version

Commit \`$(git rev-parse HEAD)\`.

| artifact | reference |
| --- | --- |
| trainer image | \`$registry/trainer@$trainer\` (tag \`$version\`) |
| operator image | \`$registry/operator@$operator\` (tag \`$version\`) |
| Helm chart | \`oci://$registry/charts/rljob\` version \`$version\` (\`$chart\`) |

The chart's values name both images by digest: a tag moved later changes nothing that it installs.
Each image carries the OCI labels \`org.opencontainers.image.{source,revision,version}\` and the SBOM of its
Python packages (CycloneDX) at \`/opt/rljob/sbom/\`; both SBOMs are attached to this release.

    helm install rljob oci://$registry/charts/rljob --version $version -n rljob-system --create-namespace

See docs/install.md for the whole path (your registry, the default runtime, the quickstart).

## Changes${previous:+ since $previous}

$(git log --no-merges --format='- %s' "${previous:+$previous..}HEAD" | head -200)
NOTES
