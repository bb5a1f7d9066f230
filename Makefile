# rljob — `make demo` runs the quickstart, `make test` runs every test.
SHELL := /bin/bash
PY ?= .venv/bin/python
PYTEST_ARGS ?=
# Three pytest workers: two lanes of control-plane tests, each with its own control plane, and the rest
# beside them (tests/conftest.py). PYTEST_WORKERS=0 runs every test in one process, in file order.
PYTEST_WORKERS ?= 3
# The shared venv holds dependencies only; the code comes from this checkout.
export PYTHONPATH := $(CURDIR)/contract:$(CURDIR)/operator:$(CURDIR)/trainer:$(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))

.DEFAULT_GOAL := help
.PHONY: help venv demo test test-fast lint typecheck crd check-crd bench clean

help: ## List targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-20s %s\n", $$1, $$2}'

# The venv is keyed by requirements.lock and cached outside the checkout (tools/venv.sh).
venv: ## Create or reuse the cached virtualenv (.venv)
	@tools/venv.sh

$(PY): requirements.lock pyproject.toml
	@tools/venv.sh

demo: venv ## Train the embedded quickstart on this machine (output in runs/quickstart/)
	$(PY) -m rljob.cli train examples/quickstart.yaml

test: venv binaries lint check-wheel ## Run the tests (unit, trainer, S3, control plane) and the wheel check; the heavy end-to-end ones are make e2e's
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --durations=40 $(PYTEST_ARGS)

test-fast: venv ## Unit tests only (no torchrun, no cluster)
	$(PY) -m pytest -m "not trainer and not cluster and not s3 and not images" $(PYTEST_ARGS)

# mypy's cache is the machine's, like the venv: a clean clone (CI) reuses it instead of checking every
# module and its stubs again (35 s, against 1 s warm, on a 2-core machine). An entry whose source file's
# hash differs is checked again, so clones with other code share it safely.
MYPY_CACHE_DIR ?= $(or $(RLJOB_CACHE),$(HOME)/.cache/rljob)/mypy

# actionlint is one of the pinned Go tools (tools/actionlint, built by `make binaries`).
lint: venv binaries ## ruff, mypy and actionlint (.github/workflows)
	.venv/bin/ruff check rljob contract operator trainer tests bench charts/rljob/hack tools
	$$(tools/build-binaries.sh --check)/actionlint
	MYPY_CACHE_DIR=$(MYPY_CACHE_DIR) .venv/bin/mypy rljob contract/rljob_contract operator/rljob_operator trainer/rljob_trainer/checkpoints trainer/rljob_trainer/algorithms \
		trainer/rljob_trainer/rewards.py trainer/rljob_trainer/errors.py trainer/rljob_trainer/builtin/rewards.py \
		trainer/rljob_trainer/evaluation.py

clean: ## Remove run outputs and caches in the checkout
	rm -rf runs .pytest_cache .mypy_cache .ruff_cache

include $(wildcard mk/*.mk)

bench: venv ## Run the benchmarks, write bench/results/*.json and the table in bench/README.md
	$(PY) -m bench.startup
	$(PY) -m bench.rank_start
	$(PY) -m bench.trainer_overhead
	$(PY) -m bench.gpu_grpo --small
	$(PY) -m bench.lora --small
	@if [ -f bench/checkpoint_upload.py ]; then $(PY) -m bench.checkpoint_upload; fi
	@if [ -f bench/operator_scale.py ]; then $(PY) -m bench.operator_scale; fi
	@if [ -f bench/kueue_admission.py ]; then $(PY) -m bench.kueue_admission; fi
	$(PY) -m bench.large_gang
	$(PY) -m bench.report
