# Images: Dockerfile.trainer and Dockerfile.operator, built here with buildah (tools/images/).
# The locks pin what the images install to requirements.lock, with hashes.
.PHONY: locks images trainer-image operator-image test-images

locks: ## Regenerate tools/images/{trainer,operator}.lock (hash-checked) from requirements.lock
	tools/images/locks.sh

images: ## Build localhost/rljob-trainer:dev and localhost/rljob-operator:dev (buildah; base from Debian's packages)
	@tools/images/engine.sh
	tools/images/build.sh trainer operator

trainer-image: ## Build localhost/rljob-trainer:dev only
	@tools/images/engine.sh
	tools/images/build.sh trainer

operator-image: ## Build localhost/rljob-operator:dev only
	@tools/images/engine.sh
	tools/images/build.sh operator

test-images: venv images ## Build both images and run them under their pods' restrictions (pytest -m images)
	$(PY) -m pytest -m images tests/delivery/test_images.py $(PYTEST_ARGS)
