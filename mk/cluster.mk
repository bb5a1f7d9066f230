# Local Kubernetes control plane (tests/cluster): pinned binaries and the dev cluster.
#
# Binaries are built once per machine into $${RLJOB_CACHE:-~/.cache/rljob}/bin
# (slow when cold: see tools/build-binaries.sh); every later run reuses them.
# Other fragments can depend on `binaries` and use $(TOOLS_BIN)/helm,
# $(TOOLS_BIN)/promtool, $(TOOLS_BIN)/kubectl.

GPU_NODES ?= 4
KUEUE ?= 0
TOOLS_BIN = $(shell tools/build-binaries.sh --check 2>/dev/null)

.PHONY: binaries dev-cluster dev-cluster-down dev-cluster-status

binaries: ## Build or reuse etcd, Kubernetes v1.37.2, kwok, helm, promtool and Kueue
	@tools/build-binaries.sh

dev-cluster: binaries $(PY) ## Start a local control plane with fake 8-GPU nodes (GPU_NODES=4; KUEUE=1 adds Kueue); KUBECONFIG=.dev-cluster/kubeconfig
	$(PY) -m tests.cluster up --gpu-nodes $(GPU_NODES) $(if $(filter 1,$(KUEUE)),--kueue)

dev-cluster-down: $(PY) ## Stop the dev cluster and remove .dev-cluster/
	$(PY) -m tests.cluster down

dev-cluster-status: $(PY) ## Show which dev-cluster components run
	$(PY) -m tests.cluster status
