#!/usr/bin/env bash
# Runs cargo for CTest.  Usage: cargo_test.sh CARGO LIB_DIR TARGET_DIR MANIFEST ARGS...
# Exit 77 (CTest's skip) when CARGO is missing.  With Debian's /usr/bin/cargo,
# its own rustc and rustdoc are put first on PATH (rustup's may be there too).
set -uo pipefail
cargo=$1 lib_dir=$2 target_dir=$3 manifest=$4
shift 4
if ! command -v "$cargo" > /dev/null 2>&1; then
  echo "skipped: $cargo not found"
  exit 77
fi
[ "$cargo" = /usr/bin/cargo ] && export PATH=/usr/bin:$PATH
"$cargo" --version
export PSTAR_LIB_DIR=$lib_dir CARGO_TARGET_DIR=$target_dir
exec "$cargo" "$@" --offline --manifest-path "$manifest"
