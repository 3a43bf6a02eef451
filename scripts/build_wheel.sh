#!/usr/bin/env bash
# Builds the unstall wheel into dist/: the Python shim with the sidecar jar inside (unstall/_jars/), so that
# `pip install unstall` needs no checkout and no build (and with the `jre` extra, no Java either).
#   scripts/build_wheel.sh                       # Maven-packages the sidecar jar first; the wheel goes to dist/
#   scripts/build_wheel.sh --jar PATH --out DIR  # a jar already built (no Maven); the wheel goes to DIR
#   --jre DIR   also carries the Java runtime DIR (unstall/_jre/, which find_java takes after JAVA_HOME); the
#               wheel is then tagged manylinux_X_Y_x86_64 for the newest glibc the runtime's binaries need
#   --stored    zip members uncompressed (scripts/build_bundle.sh compresses the whole bundle as one stream)
# The shim is copied to a staging directory and the jar put there: the source tree stays as it was (an
# editable install never finds a stale jar in python-shim/src/unstall/_jars/).
set -euo pipefail
source "$(dirname "$0")/env.sh"

jar=
jre=
out=$ROOT/dist
build_options=()
while [ $# -gt 0 ]; do
  case "$1" in
    --jar) jar=$(realpath "$2"); shift 2 ;;
    --out) out=$(realpath -m "$2"); shift 2 ;;
    --jre) jre=$(realpath "$2"); shift 2 ;;
    --stored) build_options+=(-C--build-option=--compression=stored); shift ;;
    *) echo "usage: scripts/build_wheel.sh [--jar PATH] [--out DIR] [--jre DIR] [--stored]" >&2; exit 2 ;;
  esac
done
cd "$ROOT"
ensure_sidecar_jar build_wheel

python=$VENV/bin/python
[ -x "$python" ] || python=python3
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
step "Wheel: stage python-shim with $jar"
cp -r python-shim/pyproject.toml python-shim/README.md python-shim/src "$stage/"
find "$stage" \( -name '*.egg-info' -o -name __pycache__ \) -prune -exec rm -rf {} +
mkdir -p "$stage/src/unstall/_jars"
cp "$jar" "$stage/src/unstall/_jars/unstall-sidecar.jar"
if [ -n "$jre" ]; then
  [ -x "$jre/bin/java" ] \
    || { echo "build_wheel: $jre/bin/java is missing: --jre takes a Java runtime's home" >&2; exit 1; }
  step "Wheel: with the Java runtime $jre"
  cp -rL "$jre" "$stage/src/unstall/_jre"  # links resolved: a wheel holds files
  symbols() {
    find "$stage/src/unstall/_jre" -type f \( -name '*.so' -o -perm -u+x \) -exec objdump -T {} + 2>/dev/null
  }
  glibc=$({ symbols || true; } | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
  [ -n "$glibc" ] || { echo "build_wheel: no glibc version found in $jre's binaries (objdump -T)" >&2; exit 1; }
  glibc=${glibc#GLIBC_}
  build_options+=("-C--build-option=--plat-name=manylinux_${glibc%%.*}_${glibc#*.}_x86_64")
fi
mkdir -p "$out"
rm -f "$out"/unstall-*.whl
# setuptools and wheel come from python-shim/requirements-dev.txt: no build isolation, nothing fetched.
"$python" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation \
  ${build_options[@]+"${build_options[@]}"} -w "$out" "$stage"
wheel=$(ls "$out"/unstall-*.whl)
echo "build_wheel: $wheel ($(stat -c %s "$wheel") bytes)"
