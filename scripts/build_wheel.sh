#!/usr/bin/env bash
# Builds the unstall wheel into dist/: the Python shim with the sidecar jar inside (unstall/_jars/), so that
# `pip install unstall` needs no checkout and no build (and with the `jre` extra, no Java either).
#   scripts/build_wheel.sh                       # Maven-packages the sidecar jar first; the wheel goes to dist/
#   scripts/build_wheel.sh --jar PATH --out DIR  # a jar already built (no Maven); the wheel goes to DIR
# The shim is copied to a staging directory and the jar put there: the source tree stays as it was (an
# editable install never finds a stale jar in python-shim/src/unstall/_jars/).
set -euo pipefail
source "$(dirname "$0")/env.sh"

jar=
out=$ROOT/dist
while [ $# -gt 0 ]; do
  case "$1" in
    --jar) jar=$(realpath "$2"); shift 2 ;;
    --out) out=$(realpath -m "$2"); shift 2 ;;
    *) echo "usage: scripts/build_wheel.sh [--jar PATH] [--out DIR]" >&2; exit 2 ;;
  esac
done
cd "$ROOT"
if [ -z "$jar" ]; then
  step "Maven: package the sidecar jar"
  "${MVN[@]}" -q -DskipTests package -pl sidecar -am
  jar=$ROOT/sidecar/target/unstall-sidecar.jar
fi
[ -f "$jar" ] || { echo "build_wheel: the sidecar jar $jar is missing" >&2; exit 1; }

python=$VENV/bin/python
[ -x "$python" ] || python=python3
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
step "Wheel: stage python-shim with $jar"
cp -r python-shim/pyproject.toml python-shim/README.md python-shim/src "$stage/"
find "$stage" \( -name '*.egg-info' -o -name __pycache__ \) -prune -exec rm -rf {} +
mkdir -p "$stage/src/unstall/_jars"
cp "$jar" "$stage/src/unstall/_jars/unstall-sidecar.jar"
mkdir -p "$out"
rm -f "$out"/unstall-*.whl
# setuptools and wheel come from python-shim/requirements-dev.txt: no build isolation, nothing fetched.
"$python" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation -w "$out" "$stage"
wheel=$(ls "$out"/unstall-*.whl)
echo "build_wheel: $wheel ($(stat -c %s "$wheel") bytes)"
