#!/usr/bin/env bash
# Builds libpstar's Debian packages (libpstar0, libpstar-dev, pstar-tools,
# python3-pstar) with dpkg-buildpackage from a copy of the tracked source
# tree, and runs lintian over them.
# Usage: packaging/build-debs.sh OUT_DIR
# The version comes from CMakeLists.txt (project(... VERSION ...)): this
# script writes debian/changelog from it, so there is one version to edit.
# Needs: packaging/setup-packaging.sh (debhelper, dh-python, lintian).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "$1" && cd "$1" && pwd)

version=$(sed -n 's/^project(pstar VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
[ -n "$version" ] || { echo "build-debs: no version in CMakeLists.txt" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tree=$work/libpstar-$version
mkdir -p "$tree"
# The working tree less what git ignores: no build trees or virtual environments.
git -C "$src" ls-files -z --cached --others --exclude-standard | (cd "$src" && xargs -0 tar -cf - --no-recursion) | tar -xf - -C "$tree"
cp -r "$src/packaging/debian" "$tree/debian"

# The changelog's date: the commit's, so that the same commit gives the same
# packages.
date=$(git -C "$src" log -1 --format=%cD 2>/dev/null || date -R)
cat > "$tree/debian/changelog" <<CHANGELOG
libpstar ($version) unstable; urgency=medium

  * Release $version (version from CMakeLists.txt).

 -- libpstar developers <libpstar@localhost>  $date
CHANGELOG

(cd "$tree" && dpkg-buildpackage -us -uc -b -j"$(nproc)" | tail -n 20)
find "$work" -maxdepth 1 -name '*.deb' ! -name '*-dbgsym_*' -exec mv -t "$out" {} +

# lintian: errors and warnings fail the build; the tags accepted are listed
# with their reasons in packaging/debian/lintian-accepted.
grep -v '^#' "$src/packaging/debian/lintian-accepted" | cut -d' ' -f1 | grep . > "$work/accepted" || true
lintian --fail-on error,warning --suppress-tags-from-file "$work/accepted" "$out"/*.deb
ls -1 "$out"/*.deb
