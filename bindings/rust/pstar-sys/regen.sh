#!/usr/bin/env bash
# Regenerates src/bindings.rs from the C header with the bindgen CLI (Debian's
# `bindgen`).  Usage: regen.sh BUILD_DIR [OUT]: BUILD_DIR holds the generated
# capi/include/pstar/version.h; OUT defaults to src/bindings.rs.  The flags
# are part of the contract: enums become integer constants (never Rust
# enums, so a status code added later cannot be undefined behaviour), size_t
# becomes usize, only pstar_* / PSTAR_* items are emitted.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
build=${1:?usage: regen.sh BUILD_DIR [OUT]}
out=${2:-$here/src/bindings.rs}
bindgen "$root/capi/include/pstar/pstar.h" \
  --allowlist-function 'pstar_.*' --allowlist-type 'pstar_.*' --allowlist-var 'PSTAR_.*' \
  --size_t-is-usize --default-enum-style consts \
  --output "$out" \
  -- -I"$root/capi/include" -I"$build/capi/include"
