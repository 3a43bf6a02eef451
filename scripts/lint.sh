#!/usr/bin/env bash
# Python lint and types: ruff over every Python file of the repo (ruff.toml), mypy over the shim
# (python-shim/pyproject.toml, [tool.mypy]). Both come with the dev requirements (scripts/setup.sh).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
"$VENV/bin/python" -m ruff check .
"$VENV/bin/python" -m mypy --config-file python-shim/pyproject.toml python-shim/src/unstall
