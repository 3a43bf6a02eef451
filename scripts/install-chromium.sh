#!/usr/bin/env bash
# Installs Debian's `chromium` (headless) for the test that renders `unstall analyze`'s HTML report.
#
#   bash scripts/install-chromium.sh
#
# Needs root and apt-get; otherwise, or when apt-get fails, it says so and exits 0 (the test then skips),
# except under CI, where a failed apt-get fails the set-up (and the test fails rather than skips).
# Downloaded packages are kept in ${UNSTALL_CACHE:-~/.cache/unstall}/apt so that a reinstall on this
# machine does not download them again.
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
apt_install() { apt-get -o Dir::Cache::archives="$ARCHIVES" install -y -q --no-install-recommends chromium >/dev/null; }
if apt_install || { apt-get update -q >/dev/null && apt_install; }; then
  log "installed: $(command -v chromium)"
elif [[ -n "${CI:-}" ]]; then
  log "ERROR: apt-get could not install chromium (CI needs it for the HTML report's browser test)"
  exit 1
else
  log "apt-get could not install chromium: the HTML report's browser test will skip"
fi
