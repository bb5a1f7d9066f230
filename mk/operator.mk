# Operator: the CRD generated from the API models (operator/rljob_operator/crd.py).
.PHONY: crd check-crd

crd: $(PY) ## Regenerate crds/ from the API models
	$(PY) -m rljob crd -o crds/rljob.dev_rltrainingjobs.yaml
	$(PY) -m rljob crd --kind RLExperiment -o crds/rljob.dev_rlexperiments.yaml

check-crd: $(PY) ## Fail when crds/ drifted from the API models
	$(PY) -m rljob crd | diff -u crds/rljob.dev_rltrainingjobs.yaml - \
	  || { echo "crds/ drifted from the API models: run 'make crd'"; exit 1; }
	$(PY) -m rljob crd --kind RLExperiment | diff -u crds/rljob.dev_rlexperiments.yaml - \
	  || { echo "crds/ drifted from the experiment models: run 'make crd'"; exit 1; }
