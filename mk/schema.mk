# Schema: TRL's config fields, generated at build time so `rljob validate` and the operator check
# spec.training.trl without importing torch or TRL (rljob/contract/trl_fields.py, committed).
.PHONY: generate trl-fields check-trl-fields

generate: trl-fields crd chart-crds admission-policies ## Regenerate every generated file (TRL fields, the CRD and its copies, the admission policies' reference checks)

trl-fields: $(PY) ## Regenerate rljob/contract/trl_fields.py from the installed TRL
	$(PY) trainer/hack/gen_trl_fields.py

check-trl-fields: $(PY) ## Fail when trl_fields.py drifted from the installed TRL
	$(PY) trainer/hack/gen_trl_fields.py --check

# Packaging: `pip install rljob` gives `rljob validate`/`crd` with pydantic and PyYAML only.
.PHONY: check-wheel
check-wheel: ## Build the wheel, install it (base deps only) in a fresh venv: rljob --help/validate/crd work, no torch
	@tools/check-wheel.sh
