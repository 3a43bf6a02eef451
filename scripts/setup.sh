#!/usr/bin/env bash
# Installs what unstall needs on a fresh machine, idempotently: the Java build (Maven), the Python venv with
# the shim, and Jaeger (for the tracing tests). Reruns reuse $UNSTALL_CACHE (~/.cache/unstall).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"

for tool in java mvn python3 go; do
  command -v "$tool" >/dev/null || { echo "setup: '$tool' is required but not on PATH" >&2; exit 1; }
done

step "Python environment ($VENV)"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
# torch from PyPI carries CUDA libraries (gigabytes): the venv is cached so this is slow only once.
"$VENV/bin/pip" install -q --disable-pip-version-check --cache-dir "$UNSTALL_CACHE/pip" -r python-shim/requirements-dev.txt
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation -e python-shim
ln -sfn "$VENV" .venv

step "Jaeger (for the tracing end-to-end tests)"
bash scripts/install-jaeger.sh

if [ "${1:-}" = "--build" ]; then
  step "Java build (sidecar jar, agent jar)"
  "${MVN[@]}" -q -DskipTests package
fi
echo "setup: done"
