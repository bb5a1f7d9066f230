# Schema: TRL's config fields, generated at build time so `rljob validate` and the operator check
# spec.training.trl without importing torch or TRL (contract/rljob_contract/trl_fields.py, committed).
.PHONY: generate version check-version trl-fields check-trl-fields pod-schema check-pod-schema docs-reference check-docs-reference

generate: version trl-fields pod-schema crd chart-crds admission-policies docs-reference ## Regenerate every generated file (the version everywhere, TRL fields, the pod's schema, the CRD and its copies, the admission policies' reference checks, docs/reference/)

version: $(PY) ## Carry pyproject.toml's version to the chart, the CRDs' label, the manifests and rljob_contract.version
	$(PY) tools/gen_version.py

check-version: $(PY) ## Fail when a file states another version than pyproject.toml's
	$(PY) tools/gen_version.py --check

trl-fields: $(PY) ## Regenerate contract/rljob_contract/trl_fields.py from the installed TRL
	$(PY) trainer/hack/gen_trl_fields.py

check-trl-fields: $(PY) ## Fail when trl_fields.py drifted from the installed TRL
	$(PY) trainer/hack/gen_trl_fields.py --check

pod-schema: $(PY) ## Regenerate operator/rljob_operator/decisions/podschema_fields.py from the installed Kubernetes client
	$(PY) operator/hack/gen_pod_schema.py

check-pod-schema: $(PY) ## Fail when podschema_fields.py drifted from the installed Kubernetes client
	$(PY) operator/hack/gen_pod_schema.py --check

docs-reference: $(PY) ## Regenerate docs/reference/*.md (fields, settings, CLI, exit codes, metrics) from the code
	$(PY) tools/gen_docs.py

check-docs-reference: $(PY) ## Fail when a page of docs/reference/ drifted from the code it describes
	$(PY) tools/gen_docs.py --check

# Packaging: `pip install rljob` gives `rljob validate`/`crd` with pydantic and PyYAML only.
.PHONY: check-wheel
check-wheel: ## Build the wheel, install it (base deps only) in a fresh venv: rljob --help/validate/crd work, no torch
	@tools/check-wheel.sh
