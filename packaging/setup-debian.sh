#!/usr/bin/env bash
# Installs the Debian packages that libpstar's build and tests need.
# Idempotent: packages already present are not reinstalled, and apt's lists are
# refreshed only when something is missing. Run as root on Debian 12.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libuv1-dev libcriterion-dev nlohmann-json3-dev libcli11-dev libxxhash-dev libgloo-dev
  python3 python3-venv python3-dev swig
  cargo rustc bindgen
  default-jdk junit5
  doxygen
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup-debian: need root to install: ${missing[*]}" >&2
    exit 1
  fi
  echo "setup-debian: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup-debian: all ${#packages[@]} packages present"
fi
