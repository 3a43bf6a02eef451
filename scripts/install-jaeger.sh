#!/usr/bin/env bash
# Installs the Jaeger v2 all-in-one binary (`jaeger`) used by the agent's end-to-end test.
#
#   bash scripts/install-jaeger.sh            # -> ${UNSTALL_CACHE:-$HOME/.cache/unstall}/bin/jaeger
#   JAEGER_VERSION=v1.76.0 bash scripts/install-jaeger.sh
#
# Jaeger's Go module is github.com/jaegertracing/jaeger; its v1.x module tags carry the v2 binary
# in cmd/jaeger (v1.76.0 == Jaeger v2.13.0). Everything goes through the Go module proxy.
# `go install pkg@version` refuses modules whose go.mod has replace directives (all recent Jaeger
# tags have one), so when it fails we download the module and `go build` inside it, where the
# replace directives apply. GOPATH, GOMODCACHE and GOCACHE live under the cache so reruns are quick.
set -euo pipefail

CACHE="${UNSTALL_CACHE:-$HOME/.cache/unstall}"
BIN_DIR="$CACHE/bin"
TARGET="$BIN_DIR/jaeger"
JAEGER_VERSION="${JAEGER_VERSION:-v1.76.0}"
MODULE="github.com/jaegertracing/jaeger"

log() { echo "[install-jaeger] $*" >&2; }

if [[ -x "$TARGET" ]]; then
  log "already installed: $TARGET (delete it to reinstall)"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  log "ERROR: 'go' is not on PATH; Jaeger is built from source with the Go toolchain"
  exit 1
fi

export GOPATH="$CACHE/go"
export GOMODCACHE="$CACHE/go/mod"
export GOCACHE="$CACHE/go/cache"
export GOBIN="$BIN_DIR"
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
export CGO_ENABLED=0
mkdir -p "$BIN_DIR" "$GOMODCACHE" "$GOCACHE"

log "building $MODULE/cmd/jaeger@$JAEGER_VERSION with $(go version) (first build takes several minutes)"
if go install "$MODULE/cmd/jaeger@$JAEGER_VERSION" 2>"$BIN_DIR/.jaeger-install.log"; then
  log "installed with go install"
else
  if grep -q "replace directive" "$BIN_DIR/.jaeger-install.log"; then
    log "go install refused the module's replace directives; building inside the downloaded module"
  else
    sed 's/^/[install-jaeger]   /' "$BIN_DIR/.jaeger-install.log" >&2
    log "go install failed; trying a build inside the downloaded module"
  fi
  log "downloading $MODULE@$JAEGER_VERSION"
  SRC="$(go mod download -json "$MODULE@$JAEGER_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  if [[ -z "$SRC" || ! -d "$SRC" ]]; then
    log "ERROR: could not download $MODULE@$JAEGER_VERSION through the Go module proxy"
    exit 1
  fi
  WORK="$(mktemp -d)"
  trap 'chmod -R u+w "$WORK" 2>/dev/null; rm -rf "$WORK"' EXIT
  cp -r "$SRC/." "$WORK/"
  chmod -R u+w "$WORK"
  log "downloading dependencies and compiling (progress: go build -v, one line per package)"
  (cd "$WORK" && go build -mod=mod -v -o "$TARGET.tmp" ./cmd/jaeger 2>&1 \
      | awk '{ n++; if (n % 200 == 0) printf "[install-jaeger]   %d packages compiled...\n", n > "/dev/stderr" }')
  if [[ ! -x "$TARGET.tmp" ]]; then
    log "ERROR: build failed"
    exit 1
  fi
  mv "$TARGET.tmp" "$TARGET"
fi
rm -f "$BIN_DIR/.jaeger-install.log"
log "installed: $TARGET ($("$TARGET" version 2>/dev/null | head -c 200 | tr '\n' ' ' || true))"
