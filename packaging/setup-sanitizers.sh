#!/usr/bin/env bash
# Installs what the CI-only sanitizer stages need (clang and its sanitizer
# runtimes).  Idempotent; run as root on Debian 12.
set -euo pipefail
packages=(clang libclang-rt-14-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" -eq 0 ] || { echo "setup-sanitizers: need root to install: ${missing[*]}" >&2; exit 1; }
  echo "setup-sanitizers: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup-sanitizers: all ${#packages[@]} packages present"
fi
