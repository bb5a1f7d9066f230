# Local Kubernetes control plane (tests/cluster): pinned binaries and the dev cluster.
#
# Binaries are built once per machine into $${RLJOB_CACHE:-~/.cache/rljob}/bin
# (slow when cold: see tools/build-binaries.sh); every later run reuses them.
# Other fragments can depend on `binaries` and use $(TOOLS_BIN)/helm,
# $(TOOLS_BIN)/promtool, $(TOOLS_BIN)/kubectl.

GPU_NODES ?= 4
KUEUE ?= 0
# REAL_NODE=1: one real node too (containerd, kubelet, kube-proxy, CoreDNS; tests/cluster/realnode.py).
REAL_NODE ?= 0
TOOLS_BIN = $(shell tools/build-binaries.sh --check 2>/dev/null)

.PHONY: binaries real-node-binaries dev-cluster dev-cluster-down dev-cluster-status e2e

binaries: ## Build or reuse etcd, Kubernetes v1.37.2, kwok, helm, promtool, Kueue, the registry and actionlint
	@tools/build-binaries.sh

# On demand only: not in `binaries`, so CI's cold build does not grow.
real-node-binaries: ## Install the real node's Debian packages (root) and build or reuse kubelet, kube-proxy, CoreDNS and pause
	@tools/real-node-deps.sh
	@tools/build-binaries.sh --real-node >/dev/null

# REGISTRY=1: an OCI registry too (tests/cluster/registry.py), which `make release` pushes to and the real node
# pulls from. (`make release REGISTRY=<host>/<path>` names a registry instead: only "1" means "start one".)
dev-cluster: binaries $(if $(filter 1,$(REAL_NODE)),real-node-binaries) $(PY) ## Start a local control plane with fake 8-GPU nodes (GPU_NODES=4; KUEUE=1 adds Kueue; REAL_NODE=1 a real node, as root; REGISTRY=1 an OCI registry); KUBECONFIG=.dev-cluster/kubeconfig
	$(PY) -m tests.cluster up --gpu-nodes $(GPU_NODES) $(if $(filter 1,$(KUEUE)),--kueue) $(if $(filter 1,$(REAL_NODE)),--real-node) $(if $(filter 1,$(REGISTRY)),--registry)

dev-cluster-down: $(PY) ## Stop the dev cluster and remove .dev-cluster/
	$(PY) -m tests.cluster down

dev-cluster-status: $(PY) ## Show which dev-cluster components run
	$(PY) -m tests.cluster status

# Not in `make test`: root, host packages, on-demand binaries, and the host's network changes while it runs.
e2e: venv binaries real-node-binaries images ## Real pods on a real kubelet node (root; the images of `make images`), then the images and the trainer run from the operator's pods
	$(PY) -m pytest -m realnode $(PYTEST_ARGS)
	$(PY) -m pytest -n 2 --dist loadgroup -m "e2e or images" $(PYTEST_ARGS)
