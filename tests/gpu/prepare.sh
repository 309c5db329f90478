#!/usr/bin/env bash
# Run here, before tests/gpu/run.sh goes to the lent GPU machine: copies the
# build dependencies that machine lacks and that are headers only (today
# nlohmann-json, from Debian's nlohmann-json3-dev) into build/gpu-deps, an
# ignored folder the device run carries (`carry: ["build/gpu-deps"]`).
# run.sh passes it to CMake when it is there.
set -euo pipefail
cd "$(dirname "$0")/../.."
src=${PSTAR_JSON_HEADERS:-/usr/include/nlohmann}
if [ ! -f "$src/json.hpp" ]; then
  echo "prepare: $src/json.hpp not found (apt install nlohmann-json3-dev)" >&2
  exit 1
fi
rm -rf build/gpu-deps
mkdir -p build/gpu-deps/include
cp -r "$src" build/gpu-deps/include/nlohmann
echo "prepare: build/gpu-deps holds $(du -sh build/gpu-deps | cut -f1) of headers; carry it with the run"
