#!/usr/bin/env bash
# CI-only stage: builds the Debian packages, installs them on this machine
# with apt (dpkg underneath; apt fetches their Debian dependencies), runs the
# consumer programs against /usr, and removes the packages again.
# Never part of the README's test command: it installs system-wide.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "ci-debs: installs packages system-wide: run as root" >&2; exit 1; }

bash packaging/setup-packaging.sh
out=$(mktemp -d)
work=$(mktemp -d)
packages=(libpstar0 libpstar-dev pstar-tools python3-pstar)
cleanup() {
  apt-get purge -y -qq "${packages[@]}" > /dev/null 2>&1 || true
  rm -rf "$out" "$work"
}
trap cleanup EXIT

bash packaging/build-debs.sh "$out"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends "$out"/*.deb > "$work/apt.log" || { cat "$work/apt.log"; exit 1; }
dpkg-query -W "${packages[@]}"

# C: pkg-config and find_package(pstar 0.1 CONFIG) from /usr.
bash tests/consumer/run_consumer.sh --installed /usr "$work/c"
# Python: Debian's python3 imports the installed module.
(cd "$work" && /usr/bin/python3 "$OLDPWD/tests/consumer/consumer.py")
# Tools: on PATH, and they run.
pstar-plan --preset v100x8 --json | grep -q '"max_params"' 
pstar-run -n 2 -- sh -c 'test -n "$RANK"'
pstar-bench --help > /dev/null
echo "ci-debs: the packages install, and the C, CMake, Python and tool consumers run against them"
