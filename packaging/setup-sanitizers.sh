#!/usr/bin/env bash
# Installs what the CI-only sanitizer stages need (clang and its sanitizer
# runtimes).  Idempotent; run as root on Debian 12.
set -euo pipefail
. "$(dirname "$0")/apt-ensure.sh"
apt_ensure setup-sanitizers clang libclang-rt-14-dev
