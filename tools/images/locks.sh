#!/usr/bin/env bash
# Write the images' locks: tools/images/<image>.lock is the part of requirements.lock that the
# trainer (or operator) extra needs, with every wheel's hash, so an image installs exactly the
# versions the tests ran (`pip install --require-hashes`). requirements.lock is the constraint:
# a version here can never differ from the tests' (tests/delivery/test_images.py checks it offline).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
for image in trainer operator; do
  uv pip compile pyproject.toml --quiet --extra "$image" --generate-hashes --python-version 3.11 \
    --constraint requirements.lock --custom-compile-command "make locks" -o "tools/images/$image.lock"
  echo "tools/images/$image.lock: $(grep -c '^[a-z0-9].*==' "tools/images/$image.lock") packages" >&2
done
