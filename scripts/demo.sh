#!/usr/bin/env bash
# The main job on the embedded default: builds the sidecar, then trains a small PyTorch model on a generated
# image-folder dataset read through an embedded sidecar, printing cache hits per epoch. Extra arguments go
# to examples/train_imagefolder.py (try --help).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
bash scripts/setup.sh --demo   # no Jaeger or Chromium: the demo uses neither
step "Training through unstall"
exec "$VENV/bin/python" examples/train_imagefolder.py "$@"
