#!/usr/bin/env bash
# Installs redis-server from Debian's packages when it is missing.
set -euo pipefail
if ! command -v redis-server >/dev/null 2>&1; then
    echo "redis-server not found: installing it from Debian packages"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi
