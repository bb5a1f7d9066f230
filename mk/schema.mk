# Schema: TRL's config fields, generated at build time so `rljob validate` and the operator check
# spec.training.trl without importing torch or TRL (contract/rljob_contract/trl_fields.py, committed).
.PHONY: generate trl-fields check-trl-fields settings-table check-settings-table

generate: trl-fields crd chart-crds admission-policies settings-table ## Regenerate every generated file (TRL fields, the CRD and its copies, the admission policies' reference checks, the README's settings table)

trl-fields: $(PY) ## Regenerate contract/rljob_contract/trl_fields.py from the installed TRL
	$(PY) trainer/hack/gen_trl_fields.py

check-trl-fields: $(PY) ## Fail when trl_fields.py drifted from the installed TRL
	$(PY) trainer/hack/gen_trl_fields.py --check

settings-table: $(PY) ## Regenerate the README's table of operator settings from operator/rljob_operator/settings.py
	$(PY) operator/hack/gen_settings.py

check-settings-table: $(PY) ## Fail when the README's settings table drifted from operator/rljob_operator/settings.py
	$(PY) operator/hack/gen_settings.py --check

# Packaging: `pip install rljob` gives `rljob validate`/`crd` with pydantic and PyYAML only.
.PHONY: check-wheel
check-wheel: ## Build the wheel, install it (base deps only) in a fresh venv: rljob --help/validate/crd work, no torch
	@tools/check-wheel.sh
