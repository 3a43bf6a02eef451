#!/usr/bin/env bash
# Every test: the Python linter and type checker, the Java linter (Checkstyle) and JUnit (unit and
# forked-JVM/cross-process ITs) through Maven, a bounded fuzzing run of every Jazzer target, then pytest (the shim
# against a real sidecar, real pyarrow Flight, real torch DataLoader). Installs what is missing first.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
bash scripts/setup.sh

step "Python: lint and types (scripts/lint.sh: ruff, mypy)"
bash scripts/lint.sh

step "Java: mvn verify (builds the sidecar and agent jars; JUnit, the integration tests, then Checkstyle)"
"${MVN[@]}" verify

step "Java: fuzz every @FuzzTest target for 10 s (scripts/fuzz.sh; mvn verify only replayed their corpora)"
bash scripts/fuzz.sh all --duration "${UNSTALL_FUZZ_SECONDS:-10}"

step "Python: pytest"
"$VENV/bin/python" -m pytest python-shim/tests tests/python
