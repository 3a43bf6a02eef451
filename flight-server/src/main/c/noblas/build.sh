#!/usr/bin/env bash
# Builds the stub libopenblas.so.0 (noblas.c) into $1/native/linux-x86_64/, from the Maven build
# (flight-server/pom.xml, generate-resources). Unlike the native JPEG library it is not optional: without it
# OpenCV does not load, so a build without gcc fails here and says so.
set -euo pipefail
out=$1/native/linux-x86_64
src=$(cd "$(dirname "$0")" && pwd)/noblas.c
[ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] || { echo "[unstall] noblas: OpenCV's natives are packaged for Linux x86_64 only" >&2; exit 1; }
command -v gcc >/dev/null || { echo "[unstall] noblas: gcc is required to build the stub libopenblas.so.0 that OpenCV loads in place of OpenBLAS" >&2; exit 1; }
mkdir -p "$out"
lib=$out/libopenblas.so.0
if [ -f "$lib" ] && [ "$lib" -nt "$src" ] && [ "$lib" -nt "$0" ]; then
  exit 0
fi
gcc -O2 -fPIC -shared -std=gnu11 -Wall -Wextra -fvisibility=hidden -Wl,-soname,libopenblas.so.0 -Wl,-z,defs \
  -o "$lib" "$src"
