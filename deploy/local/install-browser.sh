#!/usr/bin/env bash
# Installs Debian's Chromium and ChromeDriver for tests/stack/test_browser.py.
# Does nothing when both are already there. Needs root (or sudo) and apt.
set -euo pipefail

if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  echo "chromium and chromedriver are installed: $(command -v chromium), $(command -v chromedriver)"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "install-browser: no apt-get here; install Chromium and a matching ChromeDriver yourself" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
# Fresh machines may have no package lists yet: refresh them once if the first try fails.
$SUDO apt-get install -y --no-install-recommends chromium chromium-driver \
  || { $SUDO apt-get update && $SUDO apt-get install -y --no-install-recommends chromium chromium-driver; }
echo "installed: $(chromium --version 2>/dev/null | head -1)"
