#!/usr/bin/env bash
# Installs the Debian packages that libpstar's build and tests need.
# Idempotent (packaging/apt-ensure.sh). Run as root on Debian 12.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libuv1-dev libcriterion-dev nlohmann-json3-dev libcli11-dev libxxhash-dev libgloo-dev
  python3 python3-venv python3-dev swig
  # bindgen's libclang needs clang's resource headers (stddef.h, ...),
  # which no package above pulls in on a bare system.
  cargo rustc bindgen libclang-common-14-dev
  default-jdk junit5
  doxygen
  abigail-tools
  # The launcher tests start ranks with mpirun (docs/launching.md).
  openmpi-bin
  # format_check: the sources against .clang-format (tools/check_format.sh).
  clang-format
)

. "$(dirname "$0")/apt-ensure.sh"
apt_ensure setup-debian "${packages[@]}"
