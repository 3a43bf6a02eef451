#!/usr/bin/env bash
# Installs what unstall needs on a fresh machine, idempotently: the Java build (Maven), the Python venv with
# the shim, and (for the tests only) Jaeger and Chromium. Reruns reuse $UNSTALL_CACHE (~/.cache/unstall).
#   bash scripts/setup.sh            # everything the tests need (scripts/test.sh)
#   bash scripts/setup.sh --build    # ... and the Java build (sidecar and agent jars)
#   bash scripts/setup.sh --demo     # what the demo runs: the Python venv and the Java build, no Jaeger/Chromium
set -euo pipefail
build=false; test_tools=true
for arg in "$@"; do
  case "$arg" in
    --build) build=true ;;
    --demo) build=true; test_tools=false ;;
    *) echo "setup: unknown option '$arg' (--build, --demo)" >&2; exit 2 ;;
  esac
done
source "$(dirname "$0")/env.sh"
cd "$ROOT"

tools=(java mvn python3); $test_tools && tools+=(go)
for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null || { echo "setup: '$tool' is required but not on PATH" >&2; exit 1; }
done

step "cmake and nasm (the build compiles libjpeg-turbo for the sidecar's native JPEG prep); libjpeg-turbo's tools"
# Optional: without cmake and nasm the build skips the native library and the sidecar prepares JPEGs through
# OpenCV. libjpeg-turbo-progs has tjbench (bench_prep); libjpeg62-turbo-dev the C tools in flight-server/src/test/c.
if ! command -v cmake >/dev/null || ! command -v nasm >/dev/null || [ ! -f /usr/include/jpeglib.h ] \
    || ! command -v tjbench >/dev/null; then
  sudo=""; [ "$(id -u)" = 0 ] || { command -v sudo >/dev/null && sudo -n true 2>/dev/null && sudo="sudo -n"; }
  if [ "$(id -u)" = 0 ] || [ -n "$sudo" ]; then
    if command -v apt-get >/dev/null; then
      $sudo apt-get install -y -q cmake nasm libjpeg62-turbo-dev libjpeg-turbo-progs >/dev/null \
        || echo "setup: apt-get install cmake nasm libjpeg62-turbo-dev libjpeg-turbo-progs failed; continuing" \
          "without them" >&2
    fi
  else
    echo "setup: no root: install cmake and nasm for the native JPEG prep (and libjpeg-turbo-progs for tjbench)" >&2
  fi
fi

step "Python environment (.venv, dependencies shared from $DEPS_VENV)"
# torch from PyPI carries CUDA libraries (gigabytes): the dependencies live in one cached venv, so this is
# slow only once. Each checkout gets its own small .venv that sees them through a .pth file and holds an
# editable install of its own python-shim (two checkouts never point one install at each other).
if [ ! -x "$DEPS_VENV/bin/python" ]; then
  python3 -m venv "$DEPS_VENV"
fi
requirements=python-shim/requirements-dev.txt; $test_tools || requirements=python-shim/requirements-demo.txt
"$DEPS_VENV/bin/pip" install -q --disable-pip-version-check --cache-dir "$UNSTALL_CACHE/pip" -r "$requirements"
if [ -L .venv ]; then rm .venv; fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
purelib() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
purelib "$DEPS_VENV/bin/python" > "$(purelib .venv/bin/python)/unstall-deps.pth"
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation -e python-shim

if $test_tools; then
  step "Jaeger (for the tracing end-to-end tests)"
  bash scripts/install-jaeger.sh

  step "Chromium (renders unstall analyze's HTML report in a test)"
  bash scripts/install-chromium.sh
fi

if $build; then
  step "Java build (sidecar jar, agent jar)"
  "${MVN[@]}" -q -DskipTests package
fi
echo "setup: done"
