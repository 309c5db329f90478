#!/usr/bin/env bash
# What the CI-only packaging stage needs beyond setup-debian.sh: Debian's
# packaging tools.  Idempotent; run as root on Debian 12.
set -euo pipefail
. "$(dirname "$0")/apt-ensure.sh"
apt_ensure setup-packaging dpkg-dev debhelper dh-python lintian fakeroot
