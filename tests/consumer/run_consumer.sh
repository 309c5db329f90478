#!/usr/bin/env bash
# Installs the build into a private prefix, then builds and runs the consumer
# program twice: with pkg-config and with find_package(pstar CONFIG).
# Usage: run_consumer.sh BUILD_DIR WORK_DIR
set -euo pipefail
build=$1
work=$2
src=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" > /dev/null

libdir=$(dirname "$(find "$prefix" -name pstar.pc -print -quit)")
export PKG_CONFIG_PATH=$libdir
export LD_LIBRARY_PATH=$prefix/lib:$(dirname "$libdir")
cc -std=c99 -Wall -Wextra -Werror "$src/consumer.c" -o "$work/consumer_pc" $(pkg-config --cflags --libs pstar)
"$work/consumer_pc"

cmake -S "$src" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" > /dev/null
cmake --build "$work/cmake" > /dev/null
"$work/cmake/consumer_cmake"

# The installed library exports the C API only, under its SONAME.
lib=$(find "$prefix" -name 'libpstar.so.0' -print -quit)
readelf -d "$lib" | grep -q 'SONAME.*libpstar.so.0'
bad=$(nm -D --defined-only "$lib" | awk '$2 != "A" && $3 !~ /^pstar_/ {print $3}')
if [ -n "$bad" ]; then
  echo "unexpected exported symbols: $bad" >&2
  exit 1
fi
echo "consumer: pkg-config and find_package builds ran; exports are pstar_* only"
