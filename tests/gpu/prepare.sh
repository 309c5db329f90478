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
# The Python binding (SWIG is not on that machine): the package built here,
# for this interpreter's version; run.sh loads it against the libpstar it
# builds there with CUDA (same source, same ABI) for bench/e2e_train.py.
if [ -f build/default/python/pstar/_capi.so ]; then
  mkdir -p build/gpu-deps/python
  cp -r build/default/python/pstar build/gpu-deps/python/pstar
  rm -rf build/gpu-deps/python/pstar/__pycache__
  echo "prepare: the Python binding for $(python3 -c 'import sys; print(sys.implementation.cache_tag)' 2>/dev/null || echo '?') copied"
else
  echo "prepare: no build/default/python (the Python binding): bench/e2e_train.py will not run on the GPU"
fi
echo "prepare: build/gpu-deps holds $(du -sh build/gpu-deps | cut -f1); carry it with the run"
