#!/usr/bin/env bash
# Builds and runs entropy_share.c: the share of entropy decoding in a whole-image decode, with the system's
# libjpeg-turbo (docs/BENCHMARKS.md, "Prep micro-benchmarks"). e.g.
#   flight-server/src/test/c/entropy_share.sh "$HOME/.cache/unstall/bench-prep/n1280/*/*.jpg" 3
set -eu
here=$(cd "$(dirname "$0")" && pwd)
bin=$(mktemp -d)/entropy_share
gcc -O2 -std=gnu11 -Wall -o "$bin" "$here/entropy_share.c" -l:libjpeg.so.62
"$bin" "$1" "${2:-3}"
rm -rf "$(dirname "$bin")"
