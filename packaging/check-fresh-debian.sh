#!/usr/bin/env bash
# Checks the README's promise on a fresh Debian 12: debootstraps a minimal
# bookworm root (once; reused while it exists), clones the repository into it
# and runs both quick-start commands there as root.  Needs root, network
# access to Debian's mirror, and a few GiB of disk.  Not part of the test
# suite; run by hand or from a CI-only stage.
#   packaging/check-fresh-debian.sh [ROOT_DIR]     (default /var/tmp/pstar-fresh-bookworm)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
root=${1:-/var/tmp/pstar-fresh-bookworm}

# One check at a time per root: a second run's exit would unmount /proc
# under the first one's tests.
mkdir -p "$(dirname "$root")"
exec 9> "$root.lock"
flock -n 9 || { echo "check-fresh-debian: another check is using $root" >&2; exit 1; }

command -v debootstrap > /dev/null || apt-get install -y -qq --no-install-recommends debootstrap
if [ ! -x "$root/usr/bin/apt-get" ]; then
  debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian
fi
for d in proc sys dev; do
  mountpoint -q "$root/$d" || mount --bind "/$d" "$root/$d"
done
trap 'for d in dev sys proc; do umount "$root/$d" 2>/dev/null || true; done' EXIT
cp /etc/resolv.conf "$root/etc/resolv.conf"
# debootstrap's minbase writes no /etc/hosts, which every installed Debian
# has: without it "localhost" does not resolve there (torchrun's agent could
# not reach its own store at localhost).
if [ ! -s "$root/etc/hosts" ]; then
  printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' > "$root/etc/hosts"
fi
# Nor the line for the machine's own name that Debian's installer writes
# (127.0.1.1): torchrun --standalone rendezvouses at the host name, and
# without it the agent waits until its timeout.
host=$(hostname)
if ! grep -qw -- "$host" "$root/etc/hosts"; then
  printf '127.0.1.1\t%s\n' "$host" >> "$root/etc/hosts"
fi
# A network that inspects TLS needs its CA: give the root the host's trust
# store and pip's settings (nothing else of the host's).
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  mkdir -p "$root/etc/ssl/certs"
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
fi
# Its local CAs too: installing ca-certificates in the root (setup-debian.sh
# pulls it in) rebuilds the bundle from the root's own CA folders, which
# would drop the copied one's extra CAs and break pip there.
if compgen -G "/usr/local/share/ca-certificates/*.crt" > /dev/null; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
fi
[ -f /etc/pip.conf ] && cp /etc/pip.conf "$root/etc/pip.conf"
rm -rf "$root/root/libpstar"
git clone -q "$repo" "$root/root/libpstar"
for cmd in demo test; do
  echo "==> fresh bookworm: bash packaging/quickstart.sh $cmd"
  chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    bash -c "cd /root/libpstar && bash packaging/quickstart.sh $cmd"
done
echo "fresh bookworm: both quick-start commands passed"
