#!/usr/bin/env bash
# Builds libunstall_jpeg.so (NativeJpeg's JNI library) into $2/native/linux-x86_64/, from the Maven build
# (flight-server/pom.xml, generate-resources). $1 is the JDK's home (its include/ has jni.h).
# libjpeg-turbo is compiled from its release source into a position-independent static library, cached under
# $UNSTALL_CACHE/libjpeg-turbo-<version>/, and linked in with its symbols hidden: the .so needs only glibc, so it
# loads on Debian (libjpeg.so.62) and Ubuntu (libjpeg.so.8) userlands alike, and never clashes with a libjpeg
# that OpenCV or the JVM loads.
# Never fails the build: without gcc, jni.h, cmake, nasm or the source it says so in one line and builds nothing;
# the sidecar then prepares JPEGs through OpenCV (prep.stats says which decoder prepares and why).
set -u
java_home=$1
out=$2/native/linux-x86_64
src=$(cd "$(dirname "$0")" && pwd)/unstall_jpeg.c
ljt_version=2.1.5
ljt_sha256=254f3642b04e309fee775123133c6464181addc150499561020312ec61c1bf7c
ljt_url=http://deb.debian.org/debian/pool/main/libj/libjpeg-turbo/libjpeg-turbo_$ljt_version.orig.tar.gz
ljt=${UNSTALL_CACHE:-$HOME/.cache/unstall}/libjpeg-turbo-$ljt_version
log=$ljt.log
skip() { echo "[unstall] native JPEG prep not built: $* (the sidecar will use OpenCV's slower path)"; exit 0; }
[ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] || skip "only built on Linux x86_64"
command -v gcc >/dev/null || skip "gcc not found"
[ -f "$java_home/include/jni.h" ] || skip "no $java_home/include/jni.h (a JDK, not a JRE, is needed)"
mkdir -p "$out"
so=$out/libunstall_jpeg.so
if [ -f "$so" ] && [ -f "$ljt/lib/libjpeg.a" ] && [ "$so" -nt "$src" ] && [ "$so" -nt "$0" ] \
    && [ "$so" -nt "$ljt/lib/libjpeg.a" ]; then
  exit 0
fi
rm -f "$so" # a skipped rebuild must not leave an older library in the jar

# Prints why libjpeg-turbo could not be built into $ljt; builds it in a private directory and renames that into
# place, so concurrent builds sharing the cache never see half a library.
build_libjpeg_turbo() {
  command -v cmake >/dev/null || { echo "cmake not found (apt-get install cmake)"; return 1; }
  command -v nasm >/dev/null || command -v yasm >/dev/null \
    || { echo "nasm not found, needed for libjpeg-turbo's SIMD (apt-get install nasm)"; return 1; }
  mkdir -p "$(dirname "$ljt")" && : >"$log"
  local work
  work=$(mktemp -d "$ljt.tmp.XXXXXX") || { echo "cannot create a directory beside $ljt"; return 1; }
  trap 'rm -rf "$work"' RETURN
  local tarball=$work/src.tar.gz
  if command -v curl >/dev/null; then
    curl -fsSL --retry 2 -m 300 -o "$tarball" "$ljt_url" 2>>"$log"
  else
    wget -q -T 300 -O "$tarball" "$ljt_url" 2>>"$log"
  fi || { echo "downloading $ljt_url failed (see $log)"; return 1; }
  echo "$ljt_sha256  $tarball" | sha256sum -c --quiet - >>"$log" 2>&1 \
    || { echo "$ljt_url does not have the pinned sha256 $ljt_sha256"; return 1; }
  tar -xzf "$tarball" -C "$work" || { echo "cannot unpack $ljt_url"; return 1; }
  local s=$work/libjpeg-turbo-$ljt_version b=$work/build
  # WITH_JPEG8=OFF: the libjpeg v6b API (jpeg_mem_src etc. as turbo extensions) that unstall_jpeg.c is written to.
  { cmake -S "$s" -B "$b" -DCMAKE_BUILD_TYPE=Release -DENABLE_SHARED=OFF -DENABLE_STATIC=ON \
        -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DWITH_JPEG8=OFF -DWITH_TURBOJPEG=OFF -DWITH_SIMD=ON -DREQUIRE_SIMD=ON \
      && cmake --build "$b" --target jpeg-static -j2; } >>"$log" 2>&1 \
    || { echo "building libjpeg-turbo $ljt_version failed (see $log)"; return 1; }
  mkdir -p "$work/out/lib" "$work/out/include"
  cp "$b/libjpeg.a" "$work/out/lib/" \
    && cp "$b/jconfig.h" "$s/jpeglib.h" "$s/jmorecfg.h" "$s/jerror.h" "$work/out/include/" \
    || { echo "libjpeg-turbo's build left no libjpeg.a or headers in $b"; return 1; }
  echo "$ljt_url sha256 $ljt_sha256" >"$work/out/SOURCE"
  # Another build may have renamed its copy in first: then that one serves.
  mv -T "$work/out" "$ljt" 2>/dev/null || [ -f "$ljt/lib/libjpeg.a" ] \
    || { echo "cannot move the built library to $ljt"; return 1; }
}
if [ ! -f "$ljt/lib/libjpeg.a" ]; then
  echo "[unstall] building libjpeg-turbo $ljt_version (static, PIC) into $ljt, once"
  why=$(build_libjpeg_turbo) || skip "$why"
fi
# --exclude-libs,ALL keeps libjpeg's symbols out of the dynamic symbol table; -z,defs fails on anything unresolved;
# -lpthread adds nothing on glibc 2.34+ (libc holds the pthread functions there).
gcc -O3 -fPIC -shared -std=gnu11 -Wall -Wextra -fvisibility=hidden \
  -I"$ljt/include" -I"$java_home/include" -I"$java_home/include/linux" \
  -o "$so" "$src" "$ljt/lib/libjpeg.a" -Wl,--as-needed -lpthread -lm -Wl,--exclude-libs,ALL -Wl,-z,defs \
  || skip "gcc failed on $src"
