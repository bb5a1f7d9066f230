# Operator: the CRD generated from the API models (operator/rljob_operator/crd.py).
.PHONY: crd check-crd

crd: $(PY) ## Regenerate crds/ from the API models
	$(PY) -m rljob crd -o crds/rljob.dev_rltrainingjobs.yaml
	$(PY) -m rljob crd --kind RLExperiment -o crds/rljob.dev_rlexperiments.yaml
	$(PY) -m rljob crd --kind ClusterRLTrainingRuntime -o crds/rljob.dev_clusterrltrainingruntimes.yaml
	$(PY) -m rljob crd --kind RLTrainingRuntime -o crds/rljob.dev_rltrainingruntimes.yaml

check-crd: $(PY) ## Fail when crds/ drifted from the API models
	$(PY) -m rljob crd | diff -u crds/rljob.dev_rltrainingjobs.yaml - \
	  || { echo "crds/ drifted from the API models: run 'make crd'"; exit 1; }
	$(PY) -m rljob crd --kind RLExperiment | diff -u crds/rljob.dev_rlexperiments.yaml - \
	  || { echo "crds/ drifted from the experiment models: run 'make crd'"; exit 1; }
	for kind in ClusterRLTrainingRuntime RLTrainingRuntime; do \
	  plural=$$(echo $$kind | tr A-Z a-z)s; \
	  $(PY) -m rljob crd --kind $$kind | diff -u crds/rljob.dev_$$plural.yaml - \
	    || { echo "crds/ drifted from the runtime models: run 'make crd'"; exit 1; }; \
	done
