#!/usr/bin/env bash
# Build the pinned binaries the cluster tests and `make dev-cluster` need, into a
# cache outside the checkout, and print a directory holding all of them.
#
#   tools/build-binaries.sh            build what is missing, print the bin dir
#   tools/build-binaries.sh --check    print the bin dir if complete, else exit 1
#   tools/build-binaries.sh --peers    build (if missing) and print the path of the
#                                      peers the benchmarks compare against: Kubeflow's
#                                      training operator (bench/peer_scale.py). Not part
#                                      of the default set, so CI's cold build does not grow.
#   tools/build-binaries.sh --real-node [--check]
#                                      build (if missing) and print the directory of what a
#                                      real node needs (tests/cluster/realnode.py): kubelet and
#                                      kube-proxy (tools/k8s), CoreDNS (tools/coredns) and the
#                                      sandbox's pause (Kubernetes' build/pause/linux/pause.c,
#                                      compiled with gcc -static), and the Prometheus server that
#                                      scrapes its pods (tools/promtool). On demand only, like --peers.
#
# Versions come from the go.mod files under tools/<tool>/: one module per tool,
# so each builds with the dependency versions its own release uses (kwok, helm
# and prometheus pin other client-go/otel versions than Kubernetes v1.37.2).
# Each tool lands in ${RLJOB_CACHE:-$HOME/.cache/rljob}/bin/<tool>-<version>/, so
# clones on the same machine share it, and a version bump builds a new folder
# instead of overwriting the old one. The printed directory,
# bin/set-<hash of the tool versions>/, holds symlinks to the current set.
# Progress goes to stderr; stdout is only the directory.
set -euo pipefail

TOOLS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${RLJOB_CACHE:-$HOME/.cache/rljob}"
BIN_ROOT="$CACHE/bin"
CHECK_ONLY=0
PEERS=0
REAL_NODE=0
for arg in "$@"; do
  case "$arg" in
    --check) CHECK_ONLY=1 ;;
    --peers) PEERS=1 ;;
    --real-node) REAL_NODE=1 ;;
    *) echo "[build-binaries] unknown argument: $arg" >&2; exit 2 ;;
  esac
done

export GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0
# Keep the Go caches out of the checkout but shared across builds.
export GOCACHE="${GOCACHE:-$(go env GOCACHE)}"

log() { echo "[build-binaries] $*" >&2; }

# Version of a module as required in a tool's go.mod (the single source of truth).
module_version() {
  local dir="$1" module="$2"
  awk -v m="$module" '$1 == m && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' \
    "$TOOLS_DIR/$dir/go.mod"
}

# Patches to a tool: tools/<dir>/*.patch (for the source of the module of its package, -p1), one
# path a line, in name order; nothing when it has none.
patches() {
  compgen -G "$TOOLS_DIR/$1/*.patch" | sort || true
}

# A patched tool's version is <version>+p<hash of its patches>: a patched build never reuses an
# unpatched one.
patch_suffix() {
  local files; mapfile -t files < <(patches "$1")
  [[ ${#files[@]} -eq 0 ]] || echo "+p$(cat "${files[@]}" | sha256sum | cut -c1-8)"
}

# Where `go build` runs: tools/<dir>, or for a patched tool WORK (emptied first, so an interrupted
# build leaves nothing stale), a copy of tools/<dir> whose go.mod replaces the module with a patched
# copy of its source from the module cache.
build_dir() {
  local dir="$1" pkg="$2" work="$3" files module src
  mapfile -t files < <(patches "$dir")
  if [[ ${#files[@]} -eq 0 ]]; then echo "$TOOLS_DIR/$dir"; return 0; fi
  module="$(cd "$TOOLS_DIR/$dir" && go list -f '{{.Module.Path}}' "$pkg")"
  src="$(cd "$TOOLS_DIR/$dir" && go list -m -f '{{.Dir}}' "$module")"
  rm -rf "$work" && mkdir -p "$work"
  cp -r "$src" "$work/src" && chmod -R u+w "$work/src"  # the module cache is read-only
  for f in "${files[@]}"; do
    log "patching $module with ${f#"$TOOLS_DIR"/}"
    patch -s -p1 -d "$work/src" <"$f" >&2
  done
  cp "$TOOLS_DIR/$dir/go.mod" "$TOOLS_DIR/$dir/go.sum" "$work/"
  (cd "$work" && go mod edit -replace "$module=$work/src")
  echo "$work"
}

K8S_VERSION="$(module_version k8s k8s.io/kubernetes)"
ETCD_VERSION="$(module_version etcd go.etcd.io/etcd/server/v3)"
KWOK_VERSION="$(module_version kwok sigs.k8s.io/kwok)$(patch_suffix kwok)"
HELM_VERSION="$(module_version helm helm.sh/helm/v3)"
PROMTOOL_VERSION="$(module_version promtool github.com/prometheus/prometheus)"
KUEUE_VERSION="$(module_version kueue sigs.k8s.io/kueue)"
TRAINING_OPERATOR_VERSION="$(module_version training-operator github.com/kubeflow/training-operator)"
COREDNS_VERSION="$(module_version coredns github.com/coredns/coredns)"
REGISTRY_VERSION="$(module_version registry github.com/distribution/distribution/v3)"
ACTIONLINT_VERSION="$(module_version actionlint github.com/rhysd/actionlint)"

# name|dir|version|binaries (space-separated "out=package" pairs)
TOOLS=(
  "etcd|etcd|$ETCD_VERSION|etcd=go.etcd.io/etcd/server/v3"
  "kubernetes|k8s|$K8S_VERSION|kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler kubectl=k8s.io/kubernetes/cmd/kubectl"
  "kwok|kwok|$KWOK_VERSION|kwok=sigs.k8s.io/kwok/cmd/kwok"
  "helm|helm|$HELM_VERSION|helm=helm.sh/helm/v3/cmd/helm"
  "promtool|promtool|$PROMTOOL_VERSION|promtool=github.com/prometheus/prometheus/cmd/promtool"
  "kueue|kueue|$KUEUE_VERSION|kueue=sigs.k8s.io/kueue/cmd/kueue"
  "registry|registry|$REGISTRY_VERSION|registry=github.com/distribution/distribution/v3/cmd/registry"
  "actionlint|actionlint|$ACTIONLINT_VERSION|actionlint=github.com/rhysd/actionlint/cmd/actionlint"
)

# Built only on demand (--peers): the operators the benchmarks compare rljob with.
PEER_TOOLS=(
  "training-operator|training-operator|$TRAINING_OPERATOR_VERSION|training-operator=github.com/kubeflow/training-operator/cmd/training-operator.v1"
)

# Built only on demand (--real-node): the node agents of the one real node. kubelet and kube-proxy
# land beside the control plane's binaries (same module, same version); coredns is tools/coredns's
# own main package (only the plugins it uses). The Prometheus server comes from promtool's module (same
# version): `make e2e` scrapes the real node's pods with it (tests/cluster/prometheus.py).
REAL_NODE_TOOLS=(
  "kubernetes|k8s|$K8S_VERSION|kubelet=k8s.io/kubernetes/cmd/kubelet kube-proxy=k8s.io/kubernetes/cmd/kube-proxy"
  "coredns|coredns|$COREDNS_VERSION|coredns=rljob.dev/tools/coredns"
  "prometheus|promtool|$PROMTOOL_VERSION|prometheus=github.com/prometheus/prometheus/cmd/prometheus"
)

# -X flags that make binaries report their real version (kubectl version and
# helm's .Capabilities.KubeVersion read these). kwok's version is a constant.
ldflags_for() {
  local name="$1" version="$2"
  case "$name" in
    kubernetes)
      local minor="${version#v1.}"; minor="${minor%%.*}"
      # buildDate is the tag's time from the module proxy, so rebuilds are identical.
      local date
      date="$(go list -m -json "k8s.io/kubernetes@$version" 2>/dev/null | awk -F'"' '/"Time"/ { print $4; exit }')"
      local flags=""
      for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        # gitCommit stays empty: the module proxy does not tell us the commit.
        flags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
        flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=${date:-1970-01-01T00:00:00Z} -X $pkg.gitCommit="
      done
      echo "$flags" ;;
    helm)
      echo "-X helm.sh/helm/v3/internal/version.version=$version -X helm.sh/helm/v3/internal/version.gitTreeState=clean" ;;
    promtool|prometheus)
      # Prometheus 3.x tags its Go module v0.3XY.Z for release 3.XY.Z.
      local v="${version#v0.}"
      echo "-X github.com/prometheus/common/version.Version=${v:0:1}.$((10#${v:1:2}))${v:3}" ;;
    kueue)
      echo "-X sigs.k8s.io/kueue/pkg/version.GitVersion=$version" ;;
    registry)
      echo "-X github.com/distribution/distribution/v3/version.version=$version" ;;
    actionlint)
      echo "-X github.com/rhysd/actionlint.version=$version" ;;
    *) echo "" ;;
  esac
}

# Kueue's CRDs and webhook configurations, from the same module version as its binary, next to
# it (<tool>-<version>/config/): tests/cluster installs them before starting the manager.
copy_kueue_config() {
  local out="$1" src
  [[ -f "$out/config/webhook/manifests.yaml" ]] && return 0
  [[ $CHECK_ONLY -eq 1 ]] && { log "missing: kueue config in $out"; return 1; }
  src="$(cd "$TOOLS_DIR/kueue" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)/config/components"
  rm -rf "$out/.config.tmp" && mkdir -p "$out/.config.tmp/crd" "$out/.config.tmp/webhook"
  cp "$src"/crd/bases/*.yaml "$out/.config.tmp/crd/"
  cp "$src/webhook/manifests.yaml" "$out/.config.tmp/webhook/"
  chmod -R u+w "$out/.config.tmp"  # the module cache is read-only
  mv -T "$out/.config.tmp" "$out/config"
}

build_tool() {
  local name="$1" dir="$2" version="$3" bins="$4"
  local out="$BIN_ROOT/$name-$version"
  local missing=()
  for pair in $bins; do
    [[ -x "$out/${pair%%=*}" ]] || missing+=("$pair")
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  if [[ $CHECK_ONLY -eq 1 ]]; then
    log "missing: $name $version"; return 1
  fi
  if [[ -z "${ANNOUNCED:-}" ]]; then
    ANNOUNCED=1
    if [[ $PEERS -eq 1 ]]; then
      log "building into $BIN_ROOT; about 6 min on 2 cores, once per machine"
    elif [[ $REAL_NODE -eq 1 ]]; then
      log "building the real node's binaries into $BIN_ROOT; about 10 min on 2 cores, once per machine"
    else
      log "building into $BIN_ROOT; from cold this takes 25-45 min on 2 cores, once per machine"
    fi
  fi
  mkdir -p "$out"
  local flags; flags="$(ldflags_for "$name" "$version")"
  local first="${missing[0]}" bdir
  bdir="$(build_dir "$dir" "${first#*=}" "$out/.build")"
  for pair in "${missing[@]}"; do
    local bin="${pair%%=*}" pkg="${pair#*=}" start=$SECONDS
    log "building $bin $version ..."
    # Build to a temp name and rename, so an interrupted build never leaves a
    # half-written binary that a later run would take as done.
    (cd "$bdir" && go build -trimpath -ldflags "-s -w $flags" -o "$out/.$bin.tmp" "$pkg")
    mv -f "$out/.$bin.tmp" "$out/$bin"
    log "built $bin in $((SECONDS - start))s"
  done
  rm -rf "$out/.build"
}

# The sandbox (pause) image's one binary, from the pause.c of the same Kubernetes version (no
# registry to pull registry.k8s.io/pause from): it sleeps, reaps zombies of a pod that shares its
# process namespace and exits on SIGTERM, as on every real node. Needs gcc and libc6-dev.
build_pause() {
  local out="$BIN_ROOT/pause-$K8S_VERSION" src tag
  [[ -x "$out/pause" ]] && return 0
  [[ $CHECK_ONLY -eq 1 ]] && { log "missing: pause $K8S_VERSION"; return 1; }
  command -v gcc >/dev/null || { log "gcc is missing: apt-get install gcc libc6-dev"; return 1; }
  src="$(cd "$TOOLS_DIR/k8s" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause"
  tag="$(awk '$1 == "TAG" && $2 == "?=" { print $3; exit }' "$src/Makefile")"
  mkdir -p "$out"
  gcc -Os -Wall -Werror -static -DVERSION="v$tag-rljob" -o "$out/.pause.tmp" "$src/linux/pause.c"
  strip "$out/.pause.tmp"
  echo "$tag" >"$out/TAG"
  mv -f "$out/.pause.tmp" "$out/pause"
  log "built pause $tag (Kubernetes $K8S_VERSION)"
}

# The --real-node set: build what is missing, print a directory of symlinks to all of it.
real_node_main() {
  for entry in "${REAL_NODE_TOOLS[@]}"; do
    IFS='|' read -r name dir version bins <<<"$entry"
    [[ -n "$version" ]] || { log "no version for $name in tools/$dir/go.mod"; exit 1; }
    build_tool "$name" "$dir" "$version" "$bins"
  done
  build_pause
  local set_dir
  set_dir="$BIN_ROOT/real-node-$(printf '%s\n' "${REAL_NODE_TOOLS[@]}" "pause|$K8S_VERSION" | sha256sum | cut -c1-12)"
  link_set "$set_dir" "${REAL_NODE_TOOLS[@]}" \
    "link:pause=../pause-$K8S_VERSION/pause" "link:pause.tag=../pause-$K8S_VERSION/TAG"
  echo "$set_dir"
}

# A folder of symlinks to a pinned set's binaries (callers put it on PATH), made once and atomically.
# Arguments: the folder, then the set's entries ("name|dir|version|bins"), or "link:NAME=TARGET".
link_set() {
  local set_dir="$1" tmp entry name dir version bins pair link
  shift
  [[ -d "$set_dir" ]] && return 0
  tmp="$(mktemp -d "$BIN_ROOT/.set.XXXXXX")"
  chmod 755 "$tmp"
  for entry in "$@"; do
    if [[ "$entry" == link:* ]]; then
      link="${entry#link:}"
      ln -s "${link#*=}" "$tmp/${link%%=*}"
      continue
    fi
    IFS='|' read -r name dir version bins <<<"$entry"
    for pair in $bins; do
      ln -s "../$name-$version/${pair%%=*}" "$tmp/${pair%%=*}"
    done
  done
  mv -T "$tmp" "$set_dir" 2>/dev/null || rm -rf "$tmp"  # another run won the race
}

# A function, so bash has parsed all of it before running: editing this file
# during a long build cannot derail the build.
main() {
  if [[ $REAL_NODE -eq 1 ]]; then
    real_node_main
    return 0
  fi
  if [[ $PEERS -eq 1 ]]; then
    # One peer today; print the path of its binary (stdout), build it if missing.
    IFS='|' read -r name dir version bins <<<"${PEER_TOOLS[0]}"
    [[ -n "$version" ]] || { log "no version for $name in tools/$dir/go.mod"; exit 1; }
    build_tool "$name" "$dir" "$version" "$bins"
    echo "$BIN_ROOT/$name-$version/${bins%%=*}"
    return 0
  fi
  for entry in "${TOOLS[@]}"; do
    IFS='|' read -r name dir version bins <<<"$entry"
    [[ -n "$version" ]] || { log "no version for $name in tools/$dir/go.mod"; exit 1; }
    build_tool "$name" "$dir" "$version" "$bins"
    [[ "$name" == kueue ]] && copy_kueue_config "$BIN_ROOT/$name-$version"
  done

  # One directory of symlinks for the whole pinned set: callers put it on PATH.
  set_hash="$(printf '%s\n' "${TOOLS[@]}" | sha256sum | cut -c1-12)"
  SET_DIR="$BIN_ROOT/set-$set_hash"
  link_set "$SET_DIR" "${TOOLS[@]}"
  echo "$SET_DIR"
}

main "$@"; exit
