#!/usr/bin/env bash
# Writes packaging/abi/libpstar.abi, the ABI baseline that tests/abi/check_abi.py
# compares every build against: abidw XML of libpstar.so as released, read
# from its DWARF (build with RelWithDebInfo or Debug).  Run it at a release,
# or when the SONAME major changes; never to make a failing check pass.
# Usage: packaging/abi/update-baseline.sh BUILD_DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
lib=$1/lib/libpstar.so.0
out=$root/packaging/abi/libpstar.abi
abidw --exported-interfaces-only --no-show-locs --no-corpus-path --no-comp-dir-path --drop-private-types \
  --headers-dir "$root/capi/include/pstar" --out-file "$out" "$lib"
# Source paths relative to the tree: the baseline names no machine's folders.
sed -i "s|path='$root/|path='|" "$out"
echo "wrote $out ($(grep -c '<elf-symbol ' "$out") functions, SONAME $(sed -n "s/.*soname='\([^']*\)'.*/\1/p" "$out" | head -1))"
