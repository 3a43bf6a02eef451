#!/usr/bin/env bash
# Builds native_prep_bench against unstall_jpeg.c (this tree's, or the one given as $3) and runs it:
#   [NATIVE_BENCH_CFLAGS=-D...] native_prep_bench.sh 'DIR/*/*.jpg' REPEATS [unstall_jpeg.c] [AVX2 1|0]
# e.g. before/after a change: native_prep_bench.sh "$HOME/.cache/unstall/bench-prep/n640/*/*.jpg" 3 /tmp/old.c
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=$(readlink -f "${3:-$here/../../main/c/unstall_jpeg.c}")
java_home=$(dirname "$(dirname "$(readlink -f "$(command -v javac)")")")
bin=$(mktemp -d)/native_prep_bench
gcc -O3 -std=gnu11 -Wall ${NATIVE_BENCH_CFLAGS:-} -DUNSTALL_JPEG_C="\"$src\"" -I"$java_home/include" -I"$java_home/include/linux" \
  -o "$bin" "$here/native_prep_bench.c" -l:libjpeg.so.62 -lm
"$bin" "$1" "$2" "${4:-1}"
rm -rf "$(dirname "$bin")"
