#!/usr/bin/env bash
# Checks (default) or applies (--fix) .clang-format on the C and C++ sources
# of src/, capi/, tools/ and bench/ (the public header capi/include/pstar/pstar.h
# is left to its hand layout: .clang-format says why).  Exit 0 when every file
# is formatted, 1 with the files that are not, 77 without clang-format.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
fmt=${CLANG_FORMAT:-clang-format}
if ! command -v "$fmt" > /dev/null; then
  echo "skipped: $fmt not found (packaging/setup-debian.sh installs it)"
  exit 77
fi
mapfile -t files < <(git ls-files 'src/*.cpp' 'src/*.h' 'src/*.cu' 'capi/*.cpp' 'capi/*.h' 'tools/*.cpp' \
                       'tools/*.h' 'bench/*.cpp' 'bench/*.h' | grep -v '^capi/include/pstar/pstar\.h$')
if [ "${1:-}" = "--fix" ]; then
  "$fmt" -i --style=file "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$fmt" --dry-run -Werror --style=file "$f" > /dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "not formatted (tools/check_format.sh --fix formats them):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "format_check: ${#files[@]} files formatted"
