#!/usr/bin/env bash
# The GPU rows of docs/BENCHMARKS.md in one prepared run, on a GPU node that has Python with torch, torchvision and
# pyarrow but no Java, no Maven and no network. Here (with Java and Maven), make the bundle and note the commit:
#   scripts/build_bundle.sh && git rev-parse --short=12 HEAD > dist/COMMIT
# There, from a copy of this tree with dist/ beside it:
#   bash benchmarks/gpu_node.sh dist/unstall-offline-*.tar.xz OUT_DIR [MODELS] [bench_gpu.py options ...]
# installs the bundle's wheels into a private directory (nothing system-wide), checks that the sidecar starts on the
# bundled Java runtime, then runs bench_gpu.py once per model (MODELS: comma-separated, default resnet18,resnet50)
# and writes each table (.md), its JSON and the log to OUT_DIR. GPU_NODE_PYTEST="PATH ..." runs those tests first
# (their CUDA cases run there; at most GPU_NODE_PYTEST_TIMEOUT seconds, 900), the log to OUT_DIR/pytest.log, while
# bench_gpu's data is made (OUT_DIR/data.log).
# GPU_NODE_SHARE="bench_decode_share.py options" runs that benchmark (--device cuda) before the models, and
# GPU_NODE_MIXED="bench_mixed_backends.py options" that one (the device decode alone, e.g. --variants whole,hw0,hw100),
# GPU_NODE_HYBRID="bench_hybrid.py options" that one (one job: the sidecar alone, the device alone, the split).
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
bundle=$1 out=$2 models=${3:-resnet18,resnet50}
shift $(( $# >= 3 ? 3 : 2 ))
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"

tar -xJf "$bundle" -C "$work"
wheels=("$work"/unstall-offline-*/*.whl)
"$python" -m pip install -q --no-index --no-deps --no-compile --target "$work/site" "${wheels[@]}"
export PYTHONPATH=$work/site${PYTHONPATH:+:$PYTHONPATH}
commit_file=$(dirname "$bundle")/COMMIT
[ -f "$commit_file" ] && export UNSTALL_BENCH_COMMIT="$(cat "$commit_file")"
# bench_gpu.py imports the shim from this tree (the bundle's commit); it takes the bundle's jar and Java runtime.
eval "$("$python" - <<'PY'
import shlex, sys, unstall, unstall.sidecar as s
java, jar = s.find_java(), s.find_jar()
print(f"gpu_node: unstall {unstall.__version__} from {unstall.__file__}; java {java}; jar {jar}", file=sys.stderr)
assert "/_jre/" in str(java), f"expected the bundled runtime, got {java}"
print(f"export UNSTALL_JAVA={shlex.quote(str(java))} UNSTALL_SIDECAR_JAR={shlex.quote(str(jar))}")
PY
)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu_node: /' || true
# bench_gpu's data, made while the tests run (generated once per node: a minute or more on 16 cores)
"$python" "$here/bench_gpu.py" --data-only "$@" > "$out/data.log" 2>&1 &
data_pid=$!
if [ -n "${GPU_NODE_PYTEST:-}" ]; then  # test paths to run first, on this node's GPU (their CUDA cases too)
  read -r -a tests <<< "$GPU_NODE_PYTEST"
  (cd "$here/.." && timeout "${GPU_NODE_PYTEST_TIMEOUT:-900}" "$python" -m pytest -v -p no:cacheprovider -rfs \
    "${tests[@]}") 2>&1 | tee "$out/pytest.log" || true
fi

if [ -n "${GPU_NODE_SHARE+x}" ]; then  # k jobs decoding on this GPU, with and without device_share
  read -r -a share_args <<< "${GPU_NODE_SHARE}"
  stamp=$(date -u +%Y-%m-%dT%H%M)
  "$python" "$here/bench_decode_share.py" --device cuda --json "$out/share-$stamp.json" "${share_args[@]}" \
    2> >(tee "$out/share-$stamp.log" >&2) | tee "$out/share-$stamp.md" || true
fi

if [ -n "${GPU_NODE_MIXED+x}" ]; then  # the device decode alone: its backends and variants on this GPU
  read -r -a mixed_args <<< "${GPU_NODE_MIXED}"
  stamp=$(date -u +%Y-%m-%dT%H%M)
  "$python" "$here/bench_mixed_backends.py" --device cuda --json "$out/mixed-$stamp.json" "${mixed_args[@]}" \
    2> >(tee "$out/mixed-$stamp.log" >&2) | tee "$out/mixed-$stamp.md" || true
fi

if [ -n "${GPU_NODE_HYBRID+x}" ]; then  # one job: the sidecar's cores, the device, and the split between them
  read -r -a hybrid_args <<< "${GPU_NODE_HYBRID}"
  stamp=$(date -u +%Y-%m-%dT%H%M)
  "$python" "$here/bench_hybrid.py" --device cuda --json "$out/hybrid-$stamp.json" "${hybrid_args[@]}" \
    2> >(tee "$out/hybrid-$stamp.log" >&2) | tee "$out/hybrid-$stamp.md" || true
fi

wait "$data_pid" || { cat "$out/data.log" >&2; exit 1; }
IFS=, read -r -a model_list <<< "$models"
for model in "${model_list[@]}"; do
  stamp=$(date -u +%Y-%m-%dT%H%M)
  set -o pipefail
  "$python" "$here/bench_gpu.py" --model "$model" --json "$out/gpu-$model-$stamp.json" "$@" \
    2> >(tee "$out/gpu-$model-$stamp.log" >&2) | tee "$out/gpu-$model-$stamp.md"
done
