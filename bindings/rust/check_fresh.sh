#!/usr/bin/env bash
# Fails when pstar-sys/src/bindings.rs differs from what regen.sh generates
# from the current header.  Usage: check_fresh.sh BUILD_DIR.  Exit 77
# without the bindgen program.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v bindgen > /dev/null 2>&1; then
  echo "skipped: bindgen not found (Debian: apt install bindgen)"
  exit 77
fi
fresh=$(mktemp)
trap 'rm -f "$fresh"' EXIT
"$here/pstar-sys/regen.sh" "$1" "$fresh" || exit 1
if diff -u "$here/pstar-sys/src/bindings.rs" "$fresh" > /dev/null; then
  echo "pstar-sys/src/bindings.rs matches the header"
  exit 0
fi
# bindgen formats its output with rustfmt when it finds one (rustup's here,
# none on a bare Debian) and writes it unformatted otherwise: compare the
# tokens, without blanks and without the trailing commas rustfmt adds.
tokens() { tr -d ' \t\n' < "$1" | sed -E 's/,([])}>])/\1/g'; }
if [ "$(tokens "$here/pstar-sys/src/bindings.rs")" = "$(tokens "$fresh")" ]; then
  echo "pstar-sys/src/bindings.rs matches the header (formatted differently: rustfmt $(command -v rustfmt > /dev/null && echo differs || echo not found))"
  exit 0
fi
diff -u "$here/pstar-sys/src/bindings.rs" "$fresh" | head -40
echo "pstar-sys/src/bindings.rs is stale: run bindings/rust/pstar-sys/regen.sh <build dir> and commit it"
exit 1
