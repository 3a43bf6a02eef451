# Sourced by the other scripts: where things live. Everything slow to fetch is cached under $UNSTALL_CACHE.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
UNSTALL_CACHE=${UNSTALL_CACHE:-$HOME/.cache/unstall}
VENV=$UNSTALL_CACHE/venv-py311
MVN=(mvn -B -ntp -Dmaven.repo.local="$UNSTALL_CACHE/m2")
export UNSTALL_CACHE
step() { printf '\n==> %s\n' "$*"; }
