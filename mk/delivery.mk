# Delivery: the Helm chart (charts/rljob), kustomize (manifests/), alerts and dashboards.
# The CRD copies in the chart and in manifests/base are generated from `rljob crd`.
.PHONY: chart-crds check-chart-crds admission-policies check-admission-policies helm-lint promtool-test test-delivery

DELIVERY_BIN = $$(tools/build-binaries.sh --check)

chart-crds: $(PY) ## Regenerate the chart's and kustomize's CRD copies from the API models
	$(PY) -m rljob crd | $(PY) charts/rljob/hack/gen_crds.py
	$(PY) -m rljob crd --kind RLExperiment | $(PY) charts/rljob/hack/gen_crds.py
	$(PY) -m rljob crd --kind ClusterRLTrainingRuntime | $(PY) charts/rljob/hack/gen_crds.py
	$(PY) -m rljob crd --kind RLTrainingRuntime | $(PY) charts/rljob/hack/gen_crds.py

check-chart-crds: $(PY) ## Fail when the chart's or kustomize's CRD drifted from `rljob crd`
	$(PY) -m rljob crd | $(PY) charts/rljob/hack/gen_crds.py --check
	$(PY) -m rljob crd --kind RLExperiment | $(PY) charts/rljob/hack/gen_crds.py --check
	$(PY) -m rljob crd --kind ClusterRLTrainingRuntime | $(PY) charts/rljob/hack/gen_crds.py --check
	$(PY) -m rljob crd --kind RLTrainingRuntime | $(PY) charts/rljob/hack/gen_crds.py --check

admission-policies: $(PY) ## Regenerate the admission policies' reference checks from contract/rljob_contract/references.py
	$(PY) charts/rljob/hack/gen_admission.py

check-admission-policies: $(PY) ## Fail when the admission policies' reference checks drifted from the table
	$(PY) charts/rljob/hack/gen_admission.py --check

helm-lint: ## helm lint --strict the chart with its default and ci/ values
	$(DELIVERY_BIN)/helm lint --strict charts/rljob
	for f in charts/rljob/ci/*-values.yaml; do $(DELIVERY_BIN)/helm lint --strict charts/rljob -f $$f || exit 1; done

promtool-test: ## promtool check and unit-test the alerting rules
	$(DELIVERY_BIN)/promtool check rules charts/rljob/files/alerts.yaml
	bin=$(DELIVERY_BIN) && cd charts/rljob/tests && $$bin/promtool test rules alerts_test.yaml

test-delivery: $(PY) ## Chart, kustomize, RBAC, alert and dashboard tests (some need the control plane)
	$(PY) -m pytest tests/delivery/ $(PYTEST_ARGS)
