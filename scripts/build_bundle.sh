#!/usr/bin/env bash
# Packs what a Linux x86-64 node with Python (torch, pyarrow, numpy) but no Java, no Maven and no internet needs
# to run unstall into one file of less than 60 MB, dist/unstall-offline-<version>-linux-x86_64.tar.xz:
#   unstall-<version>-py3-none-manylinux_X_Y_x86_64.whl  the shim, the sidecar jar and a jlinked Java runtime of
#                                                         the modules the sidecar needs (unstall/_jre/)
#   py4j-<version>-*.whl                                  the shim's pure-Python dependency a node may lack
#   nvidia_nvimgcodec_cu13-*.whl, nvidia_nvjpeg-*.whl     decode(device="mixed", backend="nvimgcodec")'s decoder
#                                                         (pip install them by name); the first trimmed to JPEG and the
#                                                         --nvimgcodec-abis Pythons, stored
# Install there, from the file alone:
#   tar -xJf unstall-offline-0.1.0-linux-x86_64.tar.xz \
#     && pip install --no-index --find-links unstall-offline-0.1.0 unstall
#
#   scripts/build_bundle.sh                       # Maven-packages the sidecar jar first; the bundle goes to dist/
#   scripts/build_bundle.sh --jar PATH --out DIR  # a jar already built (no Maven); the bundle goes to DIR
#   --nvimgcodec-abis LIST  the CPython ABIs whose nvImageCodec module the bundle keeps (default cp311,cp312;
#               "none": no nvImageCodec, the mixed decode uses torchvision's)
#   --jdk DIR   the JDK whose jdeps and jlink make the runtime (default: JAVA_HOME, else the one of `java` on
#               PATH); the wheel requires the newest glibc its binaries need (Temurin's: 2.17)
# The jar and the runtime go in uncompressed and xz compresses the whole as one stream: a third of what the
# jar's per-entry deflate and jlink's per-resource zip leave. Installed, they take ~350 MB.
set -euo pipefail
source "$(dirname "$0")/env.sh"

LIMIT=$((60 * 1000 * 1000))
# Reached by reflection or as a security provider, which jdeps does not see: sun.misc.Unsafe (Netty, Arrow) and
# the elliptic-curve TLS suites.
EXTRA_MODULES=jdk.unsupported,jdk.crypto.ec
# decode(device="mixed", backend="nvimgcodec")'s decoder, for the GPU node's CUDA 13 torch (the nvimgcodec extra also
# names nvJPEG2000 and nvTIFF, whose extensions the bundle leaves out).
NVIMGCODEC_VERSION=0.9.0.20
NVJPEG_VERSION=13.3.2.43

jar=
jdk=
out=$ROOT/dist
abis=cp311,cp312
while [ $# -gt 0 ]; do
  case "$1" in
    --jar) jar=$(realpath "$2"); shift 2 ;;
    --out) out=$(realpath -m "$2"); shift 2 ;;
    --jdk) jdk=$(realpath "$2"); shift 2 ;;
    --nvimgcodec-abis) abis=$2; shift 2 ;;
    *) echo "usage: scripts/build_bundle.sh [--jar PATH] [--out DIR] [--jdk DIR] [--nvimgcodec-abis LIST|none]" >&2
       exit 2 ;;
  esac
done
cd "$ROOT"
ensure_sidecar_jar build_bundle
if [ -z "$jdk" ]; then
  if [ -n "${JAVA_HOME:-}" ]; then
    jdk=$JAVA_HOME
  elif command -v java >/dev/null; then
    jdk=$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")
  fi
fi
[ -n "$jdk" ] && [ -x "$jdk/bin/jlink" ] && [ -x "$jdk/bin/jdeps" ] \
  || { echo "build_bundle: no JDK with jlink and jdeps at '${jdk}' (set --jdk or JAVA_HOME)" >&2; exit 1; }

python=$VENV/bin/python
[ -x "$python" ] || python=python3
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

step "Java runtime: the sidecar's modules, jlinked from $jdk"
modules=$("$jdk/bin/jdeps" --ignore-missing-deps --print-module-deps --multi-release 17 -q "$jar")
[ -n "$modules" ] || { echo "build_bundle: jdeps named no modules for $jar" >&2; exit 1; }
modules=$(echo "$modules,$EXTRA_MODULES" | tr , '\n' | sort -u | paste -sd, -)
echo "modules: $modules"
# No --compress: the bundle's xz does better on the uncompressed image.
"$jdk/bin/jlink" --add-modules "$modules" --strip-debug --no-header-files --no-man-pages --output "$stage/jre"
"$stage/jre/bin/java" -version 2>&1 | head -1

step "Wheel: the shim, the jar and the runtime, stored"
"$python" - "$jar" "$stage/unstall-sidecar.jar" <<'EOF'
import sys, zipfile
# The same entries in the same order (the manifest first), uncompressed.
with zipfile.ZipFile(sys.argv[1]) as src, zipfile.ZipFile(sys.argv[2], "w", zipfile.ZIP_STORED) as dst:
    for info in src.infolist():
        data = src.read(info)
        info.compress_type = zipfile.ZIP_STORED
        dst.writestr(info, data)
EOF
bash scripts/build_wheel.sh --jar "$stage/unstall-sidecar.jar" --jre "$stage/jre" --stored --out "$stage/wheel"
wheel=$(ls "$stage"/wheel/unstall-*.whl)
name=$(basename "$wheel")
version=$(echo "$name" | cut -d- -f2)
dir=unstall-offline-$version
mkdir -p "$stage/$dir"
mv "$wheel" "$stage/$dir/"

step "py4j: the shim's pure-Python dependency"
py4j=$("$python" -c 'import importlib.metadata as m; print(m.version("py4j"))')
wheelhouse=$UNSTALL_CACHE/pip/wheelhouse
if ! ls "$wheelhouse"/py4j-"$py4j"-*.whl >/dev/null 2>&1; then
  "$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: \
    --cache-dir "$UNSTALL_CACHE/pip" -d "$wheelhouse" "py4j==$py4j"
fi
cp "$wheelhouse"/py4j-"$py4j"-*.whl "$stage/$dir/"

if [ "$abis" != none ]; then
  step "nvImageCodec and nvJPEG (CUDA 13): the JPEG decoders of $abis, stored"
  for req in "nvidia-nvimgcodec-cu13==$NVIMGCODEC_VERSION" "nvidia-nvjpeg==$NVJPEG_VERSION"; do
    name=$(echo "${req%%==*}" | tr - _)
    ls "$wheelhouse/$name-${req##*==}"-*.whl >/dev/null 2>&1 \
      || "$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: \
        --cache-dir "$UNSTALL_CACHE/pip" -d "$wheelhouse" "$req"
  done
  cp "$wheelhouse"/nvidia_nvjpeg-"$NVJPEG_VERSION"-*.whl "$stage/$dir/"
  # The wheel carries a module per CPython ABI and decoders for eight formats: the bundle keeps JPEG's (nvJPEG on the
  # device, libjpeg-turbo on the CPU) for the ABIs asked for, and lists only what it keeps in RECORD.
  "$python" - "$wheelhouse"/nvidia_nvimgcodec_cu13-"$NVIMGCODEC_VERSION"-*.whl "$stage/$dir" "$abis" <<'EOF'
import os, re, sys, zipfile
src, out, abis = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
def keep(name: str) -> bool:
    m = re.search(r"nvimgcodec_impl\.cpython-(\d+t?)-", name)
    if m:
        return "cp" + m.group(1) in abis
    if "/extensions/" in name:
        return re.search(r"/lib(nvjpeg|jpeg_turbo)_ext\.so", name) is not None
    return True
with zipfile.ZipFile(src) as z, zipfile.ZipFile(os.path.join(out, os.path.basename(src)), "w", zipfile.ZIP_STORED) as w:
    names = [i.filename for i in z.infolist()]
    kept = {n for n in names if keep(n)}
    if not any("nvimgcodec_impl." in n for n in kept):
        sys.exit(f"build_bundle: {os.path.basename(src)} has no module for the ABIs {abis}")
    for info in z.infolist():
        if info.filename not in kept:
            continue
        data = z.read(info)
        if info.filename.endswith(".dist-info/RECORD"):
            rows = data.decode().splitlines()
            data = ("\n".join(r for r in rows if r.split(",", 1)[0] in kept) + "\n").encode()
        info.compress_type = zipfile.ZIP_STORED
        w.writestr(info, data)
    print(f"nvimgcodec: kept {len(kept)} of {len(names)} entries")
EOF
fi

step "Bundle: one xz stream"
mkdir -p "$out"
bundle=$out/$dir-linux-x86_64.tar.xz
rm -f "$bundle"
tar -C "$stage" -cf - "$dir" | xz -6 -T0 > "$bundle"
size=$(stat -c %s "$bundle")
echo "build_bundle: $bundle ($size bytes, $((size / 1000000)) MB; limit $((LIMIT / 1000000)) MB)"
echo "install: tar -xJf $(basename "$bundle") && pip install --no-index --find-links $dir unstall"
[ "$abis" = none ] || echo "  the GPU's JPEG decoder: pip install --no-index --find-links $dir nvidia-nvimgcodec-cu13 nvidia-nvjpeg"
if [ "$size" -ge "$LIMIT" ]; then
  echo "build_bundle: $bundle is $size bytes, not under the $LIMIT-byte limit" >&2
  exit 1
fi
