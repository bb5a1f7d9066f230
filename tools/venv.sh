#!/usr/bin/env bash
# Create (or reuse) the project's virtualenv and point .venv at it.
#
# The venv lives outside the checkout, in ${RLJOB_CACHE:-~/.cache/rljob}/venv-<hash of
# requirements.lock>, so every clone on this machine shares it and a warm run installs
# nothing (torch is large). uv's own cache makes a cold rebuild after a lock change cheap.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd)"
CACHE="${RLJOB_CACHE:-$HOME/.cache/rljob}"
PYTHON="${PYTHON:-python3}"

if ! command -v uv >/dev/null 2>&1; then
  echo "[venv] installing uv" >&2
  # As root (containers, CI) pip warns about root installs, which is intended here; environment
  # variables rather than flags, so a pip older than the option ignores them instead of failing.
  PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 "$PYTHON" -m pip install --quiet uv >&2
fi
UV="$(command -v uv || echo "$PYTHON -m uv")"

HASH="$(cat requirements.lock pyproject.toml | sha256sum | cut -c1-12)"
VENV="$CACHE/venv-$HASH"
mkdir -p "$CACHE"
if [[ ! -f "$VENV/.complete" ]]; then
  echo "[venv] creating $VENV (first run on this machine: downloads torch, several minutes)" >&2
  # A venv is not relocatable, so it is built in place; .complete marks a finished one.
  rm -rf "$VENV"
  $UV venv --quiet --python "$PYTHON" "$VENV" >&2
  $UV pip sync --quiet --compile-bytecode --python "$VENV/bin/python" requirements.lock >&2
  touch "$VENV/.bytecode" "$VENV/.complete"
fi
# Bytecode for every installed module, written once here. uv installs sources only, and with
# PYTHONDONTWRITEBYTECODE set (as in many CI images, this machine's included) Python never caches
# what it compiles: every process then compiled torch, transformers, TRL and the Kubernetes client
# from source, and `from trl import GRPOTrainer` took 22 s instead of 8 on a 2-core machine.
# Python reads .pyc files whatever that variable says. A new venv is compiled as it is installed
# (above); one made before bytecode was compiled gets the step here, once.
if [[ ! -f "$VENV/.bytecode" ]]; then
  echo "[venv] compiling bytecode in $VENV (once)" >&2
  $UV pip sync --quiet --compile-bytecode --python "$VENV/bin/python" requirements.lock >&2
  touch "$VENV/.bytecode"
fi
# The project itself is not installed: clones share this venv, so each one puts its own
# operator/ and trainer/ first on PYTHONPATH (the Makefile and tests/conftest.py do).
ln -sfn "$VENV" .venv
