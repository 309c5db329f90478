#!/bin/sh
# libpstar.so must not link NCCL: no libnccl in its DT_NEEDED and no nccl*
# symbol left for the dynamic linker to bind.  NCCL is loaded with dlopen
# when the first CUDA group forms (src/distributed/comm/nccl_loader.h), so that
# `import pstar` before `import torch` leaves torch its own libnccl.so.2.
# Usage: no_nccl_needed.sh LIBPSTAR_SO     exit 77 (skipped) without binutils.
set -u
lib=$1
for tool in readelf nm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "skipped: $tool not found (binutils)"
    exit 77
  fi
done
needed=$(readelf -d "$lib" | grep '(NEEDED)') || {
  echo "FAIL: readelf found no DT_NEEDED entry in $lib"
  exit 1
}
echo "DT_NEEDED of $lib:"
echo "$needed"
status=0
if echo "$needed" | grep -qi 'libnccl'; then
  echo "FAIL: $lib names libnccl in its DT_NEEDED"
  status=1
fi
undefined=$(nm -D --undefined-only "$lib" | grep -E '[[:space:]]p?nccl[A-Z]') && {
  echo "FAIL: $lib leaves NCCL symbols to the dynamic linker:"
  echo "$undefined"
  status=1
}
[ "$status" = 0 ] && echo "ok: no libnccl in DT_NEEDED, no undefined nccl* symbols"
exit "$status"
