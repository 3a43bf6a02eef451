#!/usr/bin/env bash
# Every test: JUnit (unit and forked-JVM/cross-process ITs) through Maven, then pytest (the shim against a
# real sidecar, real pyarrow Flight, real torch DataLoader). Installs what is missing first.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
bash scripts/setup.sh

step "Java: mvn verify (builds the sidecar and agent jars, runs JUnit and the integration tests)"
"${MVN[@]}" verify

step "Python: pytest"
"$VENV/bin/python" -m pytest python-shim/tests tests/python
