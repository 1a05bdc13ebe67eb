#!/usr/bin/env bash
# Installs the real Prometheus server (Debian's package) when it is not already on the machine.
set -euo pipefail
if command -v prometheus >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
command -v prometheus >/dev/null
