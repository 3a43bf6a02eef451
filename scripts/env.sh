# Sourced by the other scripts: where things live. Everything slow to fetch is cached under $UNSTALL_CACHE.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
UNSTALL_CACHE=${UNSTALL_CACHE:-$HOME/.cache/unstall}
DEPS_VENV=$UNSTALL_CACHE/venv-py311   # the heavy dependencies (torch, pyarrow, ...), shared by checkouts
VENV=$ROOT/.venv                       # this checkout's environment: its own shim, the deps via a .pth
MVN=(mvn -B -ntp -Dmaven.repo.local="$UNSTALL_CACHE/m2")
export UNSTALL_CACHE
# Sets $jar to the sidecar jar: the one given (--jar), else Maven-packaged from this checkout. $1: the caller's name.
ensure_sidecar_jar() {
  if [ -z "${jar:-}" ]; then
    step "Maven: package the sidecar jar"
    "${MVN[@]}" -q -DskipTests package -pl sidecar -am
    jar=$ROOT/sidecar/target/unstall-sidecar.jar
  fi
  [ -f "$jar" ] || { echo "$1: the sidecar jar $jar is missing" >&2; exit 1; }
}
step() { printf '\n==> %s\n' "$*"; }
