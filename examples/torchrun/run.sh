#!/usr/bin/env bash
# Two "nodes" x 2 ranks on one machine: two torchrun invocations (--node-rank 0 and 1, a static rendezvous on
# 127.0.0.1), each node with its own UNSTALL_HOME (so its own sidecar, started by its first rank) bound to its own
# loopback address (127.0.0.2, 127.0.0.3), the two sidecars joined into one partitioned cache.
#
#   examples/torchrun/run.sh [DATA_DIR] [-- extra train_ddp.py arguments]
#
# Without DATA_DIR a small image folder is generated. Environment (all optional): PYTHON (the venv's python),
# WORK (a directory for the homes and the cluster token; default a temporary one), RDZV_PORT (29511),
# CLUSTER_PORT (5701), CLUSTER_NAME (unstall-example-$$), EPOCHS (2). On real nodes, run one torchrun per node
# with --cluster-bind set to the node's address on the cluster network and peer TLS (docs/ARCHITECTURE.md).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
PYTHON=${PYTHON:-$repo/.venv/bin/python}
WORK=${WORK:-$(mktemp -d -t unstall-torchrun.XXXXXX)}
RDZV_PORT=${RDZV_PORT:-29511}
CLUSTER_PORT=${CLUSTER_PORT:-5701}
CLUSTER_NAME=${CLUSTER_NAME:-unstall-example-$$}
EPOCHS=${EPOCHS:-2}
data=${1:-}
[[ $# -gt 0 ]] && shift
[[ ${1:-} == "--" ]] && shift

mkdir -p "$WORK"
if [[ -z $data ]]; then
  data=$WORK/images
  "$PYTHON" - "$data" <<'PY'
import sys
from pathlib import Path
import numpy as np
from PIL import Image
root, rng = Path(sys.argv[1]), np.random.default_rng(0)
for c in range(4):  # 4 classes x 32 small JPEGs, each class a tint
    (root / f"class{c}").mkdir(parents=True, exist_ok=True)
    for i in range(32):
        img = np.clip(rng.normal(60 * c + 40, 30, size=(40, 40, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(img, "RGB").save(root / f"class{c}" / f"img{i:03d}.jpg", quality=85)
PY
fi

# The cluster token: a secret of its own, the same file for every node, readable by its user only.
token=$WORK/cluster-token
if [[ ! -s $token ]]; then
  (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$token")
fi
members="127.0.0.2:$CLUSTER_PORT,127.0.0.3:$CLUSTER_PORT"

pids=()
for node in 0 1; do
  UNSTALL_HOME=$WORK/node$node "$PYTHON" -m torch.distributed.run \
      --nnodes 2 --nproc-per-node 2 --node-rank "$node" \
      --rdzv-backend static --rdzv-endpoint "127.0.0.1:$RDZV_PORT" \
      "$here/train_ddp.py" --data "$data" --epochs "$EPOCHS" \
      --cluster-members "$members" --cluster-bind "127.0.0.$((node + 2))" --cluster-token "$token" \
      --cluster-port "$CLUSTER_PORT" --cluster-name "$CLUSTER_NAME" "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || status=$?
done
echo "run.sh: done (status $status); homes and logs in $WORK"
exit "$status"
