#!/usr/bin/env bash
# Chromium from the system's packages, for the web page's browser test (tests/server). Without
# it (no apt-get, not root) that test skips and says why.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install-browser: no chromium, and no apt-get as root to install it: the page's browser test will skip" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium >/dev/null
