#!/usr/bin/env bash
# Build the rljob wheel and install it, with its base dependencies only, in a fresh virtualenv:
# `rljob --help`, `rljob validate` and `rljob crd` must work there and torch must be absent.
#
# The wheel is built from a copy of the working tree (tracked and untracked, not ignored files), so
# nothing is written into the checkout. uv's cache is reused: warm, this takes seconds.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd)"
PYTHON="${PYTHON:-python3}"
UV="$(command -v uv || echo "$PYTHON -m uv")"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/rljob-wheel.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
# The checkout's code must not leak in through PYTHONPATH (the Makefile exports it).
unset PYTHONPATH

mkdir -p "$WORK/src"
git ls-files -z --cached --others --exclude-standard \
  | (cd "$ROOT" && xargs -0 cp --parents -t "$WORK/src" 2>/dev/null || true)
$UV build --quiet --wheel --out-dir "$WORK/dist" "$WORK/src"
WHEEL="$(ls "$WORK"/dist/rljob-*.whl)"
$UV venv --quiet --python "$PYTHON" "$WORK/venv"
$UV pip install --quiet --python "$WORK/venv/bin/python" "$WHEEL"

cd "$WORK"  # not the checkout: its rljob/ must not be importable from the current directory
fail() { echo "check-wheel: $*" >&2; exit 1; }
"$WORK/venv/bin/rljob" --help >/dev/null || fail "rljob --help failed"
"$WORK/venv/bin/rljob" validate "$ROOT/examples/quickstart.yaml" || fail "rljob validate examples/quickstart.yaml failed"
"$WORK/venv/bin/rljob" crd | diff -q - "$ROOT/crds/rljob.dev_rltrainingjobs.yaml" >/dev/null \
  || fail "rljob crd from the wheel differs from crds/ (run make crd)"
out="$("$WORK/venv/bin/rljob" train "$ROOT/examples/quickstart.yaml" 2>&1)" && fail "rljob train ran without torch"
grep -q "pip install 'rljob\[trainer\]'" <<<"$out" || fail "rljob train without torch does not name the extra: $out"
"$WORK/venv/bin/python" - <<'PY' || fail "the base install pulled in heavy packages"
import importlib.util, sys
heavy = [m for m in ("torch", "transformers", "trl", "datasets", "kopf", "kubernetes", "boto3") if importlib.util.find_spec(m)]
sys.exit(f"installed: {', '.join(heavy)}" if heavy else 0)
PY
echo "check-wheel: $(basename "$WHEEL") installs with $(
  $UV pip list --quiet --python "$WORK/venv/bin/python" --format freeze | grep -v '^rljob==' | cut -d= -f1 | paste -sd' ')"
