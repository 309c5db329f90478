# Sourced by the setup-*.sh scripts: apt_ensure NAME PACKAGE... installs the
# Debian packages that are missing (idempotent: nothing is reinstalled, and
# apt's lists are refreshed only when something is missing).  NAME prefixes
# the messages.  Installing needs root.
apt_ensure() {
  local name=$1
  shift
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "$name: all $# packages present"
    return 0
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "$name: need root to install: ${missing[*]}" >&2
    return 1
  fi
  echo "$name: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
}
