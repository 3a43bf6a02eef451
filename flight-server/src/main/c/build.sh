#!/usr/bin/env bash
# Builds libunstall_jpeg.so (NativeJpeg's JNI library) into $2/native/linux-x86_64/, from the Maven build
# (flight-server/pom.xml, generate-resources). $1 is the JDK's home (its include/ has jni.h).
# Never fails the build: without gcc, jni.h or libjpeg-turbo's headers it says so in one line and builds nothing;
# the sidecar then prepares JPEGs through OpenCV (ImagePrep logs which decoder it uses).
set -u
java_home=$1
out=$2/native/linux-x86_64
src=$(cd "$(dirname "$0")" && pwd)/unstall_jpeg.c
skip() { echo "[unstall] native JPEG prep not built: $* (the sidecar will use OpenCV's slower path)"; exit 0; }
[ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] || skip "only built on Linux x86_64"
command -v gcc >/dev/null || skip "gcc not found"
[ -f "$java_home/include/jni.h" ] || skip "no $java_home/include/jni.h (a JDK, not a JRE, is needed)"
libjpeg=$(gcc -print-file-name=libjpeg.so.62)
[ -f /usr/include/jpeglib.h ] && [ -e "$libjpeg" ] \
  || skip "libjpeg-turbo's headers or libjpeg.so.62 missing (apt-get install libjpeg62-turbo-dev)"
grep -q jpeg_crop_scanline /usr/include/jpeglib.h || skip "/usr/include/jpeglib.h is not libjpeg-turbo >= 1.5"
mkdir -p "$out"
if [ -f "$out/libunstall_jpeg.so" ] && [ "$out/libunstall_jpeg.so" -nt "$src" ] && [ "$out/libunstall_jpeg.so" -nt "$0" ]; then
  exit 0
fi
# libjpeg.a is not position-independent throughout (jerror.c.o), so libjpeg.so.62 is linked dynamically.
gcc -O3 -fPIC -shared -std=gnu11 -Wall -Wextra -fvisibility=hidden \
  -I"$java_home/include" -I"$java_home/include/linux" \
  -o "$out/libunstall_jpeg.so" "$src" -l:libjpeg.so.62 -lm -Wl,-z,defs \
  || skip "gcc failed on $src"
