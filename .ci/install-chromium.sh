#!/usr/bin/env bash
# Installs Debian's chromium for the inspector's end-to-end test (test/inspector.e2e.test.ts),
# which drives it through playwright-core. Playwright's own browser download cannot be used here:
# only the npm registry and Debian's archive are reachable, so the distribution build it is.
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
  echo "chromium already installed: $(/usr/bin/chromium --version 2>/dev/null || echo unknown version)"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "install-chromium: /usr/bin/chromium is missing and installing it needs root (apt-get)." >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends chromium
echo "chromium installed: $(/usr/bin/chromium --version 2>/dev/null || echo unknown version)"
