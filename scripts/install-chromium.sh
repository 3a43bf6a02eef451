#!/usr/bin/env bash
# Installs Debian's `chromium` (headless) for the test that renders `unstall analyze`'s HTML report.
#
#   bash scripts/install-chromium.sh
#
# Needs root and apt-get; otherwise it says so and exits 0 (the test then skips, except under CI=true,
# where it fails). Downloaded packages are kept in ${UNSTALL_CACHE:-~/.cache/unstall}/apt so that a
# reinstall on this machine does not download them again.
set -euo pipefail

log() { echo "[install-chromium] $*" >&2; }

if command -v chromium >/dev/null 2>&1; then
  log "already installed: $(command -v chromium)"
  exit 0
fi
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  log "chromium is missing and cannot be installed here (needs root and apt-get): the HTML report's browser test will skip"
  exit 0
fi
ARCHIVES="${UNSTALL_CACHE:-$HOME/.cache/unstall}/apt"
mkdir -p "$ARCHIVES/partial"
log "apt-get install chromium (packages cached in $ARCHIVES)"
export DEBIAN_FRONTEND=noninteractive
apt-get -o Dir::Cache::archives="$ARCHIVES" install -y -q --no-install-recommends chromium >/dev/null \
  || { apt-get update -q >/dev/null && apt-get -o Dir::Cache::archives="$ARCHIVES" install -y -q --no-install-recommends chromium >/dev/null; }
log "installed: $(command -v chromium)"
