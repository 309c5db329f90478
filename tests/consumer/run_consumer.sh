#!/usr/bin/env bash
# Builds and runs the consumer programs against an installed libpstar: the C
# program with pkg-config and with find_package(pstar CONFIG), and checks
# that the library exports the C API only, under its SONAME.
# Usage:
#   run_consumer.sh BUILD_DIR WORK_DIR          install BUILD_DIR into WORK_DIR/prefix first
#   run_consumer.sh --installed PREFIX WORK_DIR  use what is installed in PREFIX
#                                                (e.g. /usr from the .deb files)
set -euo pipefail
src=$(cd "$(dirname "$0")" && pwd)
if [ "$1" = --installed ]; then
  prefix=$2
  work=$3
  rm -rf "$work"
  mkdir -p "$work"
else
  build=$1
  work=$2
  rm -rf "$work"
  prefix=$work/prefix
  cmake --install "$build" --prefix "$prefix" > /dev/null
fi

pcdir=$(dirname "$(find "$prefix/lib" "$prefix/lib64" "$prefix/share" -name pstar.pc -print -quit 2>/dev/null)")
export PKG_CONFIG_PATH=$pcdir
libdir=$(pkg-config --variable=libdir pstar)
export LD_LIBRARY_PATH=$libdir
cc -std=c99 -Wall -Wextra -Werror "$src/consumer.c" -o "$work/consumer_pc" $(pkg-config --cflags --libs pstar)
"$work/consumer_pc"

cmake -S "$src" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" > /dev/null
cmake --build "$work/cmake" > /dev/null
"$work/cmake/consumer_cmake"

lib=$libdir/libpstar.so.0
readelf -d "$lib" | grep -q 'SONAME.*\[libpstar.so.0\]'
bad=$(nm -D --defined-only "$lib" | awk '$2 != "A" && $3 !~ /^pstar_/ {print $3}')
if [ -n "$bad" ]; then
  echo "unexpected exported symbols: $bad" >&2
  exit 1
fi
echo "consumer: pkg-config and find_package builds ran against $prefix; exports are pstar_* only"
