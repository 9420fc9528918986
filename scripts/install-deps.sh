#!/bin/sh
# Install the Debian packages tpk needs, if any is missing. Safe to run repeatedly.
#   sh scripts/install-deps.sh [EXTRA...]   also the named extra packages (e.g. qemu-user for
#                                           scripts/check-portable.sh)
set -eu
PKGS="build-essential pkg-config libgsl-dev libfftw3-dev liblapacke-dev libopenblas-dev
      libhdf5-dev hdf5-tools libxgboost-dev libjansson-dev libcmocka-dev zlib1g-dev nettle-dev
      clang libclang-rt-14-dev libomp-dev $*"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "install-deps: installing:$missing" >&2
if [ "$(id -u)" != 0 ]; then
    SUDO=sudo
else
    SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
