#!/bin/sh
# Make sure what tpk needs is there; install what is missing with apt-get. Safe to run repeatedly.
#   sh scripts/install-deps.sh [EXTRA...]     also the named extra Debian packages (e.g. qemu-user
#                                            for scripts/check-portable.sh)
#   sh scripts/install-deps.sh --only PKG...  just these (help2man for `make man`, doxygen for
#                                            `make docs`)
#   sh scripts/install-deps.sh --mpi          the default set plus the MPI stack of `make mpi`
#                                            (Open MPI, parallel HDF5, ScaLAPACK; issue 16)
# Each dependency is checked by what the build uses (a command, a pkg-config module, a header or
# a library file), not by its package name, so a machine that has them from elsewhere (another
# distribution, a source build, no dpkg or apt) builds as it is. What is missing is installed with
# apt-get where apt-get exists (as root, else through sudo); without apt-get the script stops with
# the list of what is missing and the Debian package of each.
set -eu

have_cmd() { command -v "$1" >/dev/null 2>&1; }
have_pc() { have_cmd pkg-config && pkg-config --exists "$1"; }
have_header() { printf '#include <%s>\n' "$1" | ${CC:-cc} -E -x c - >/dev/null 2>&1; }
have_file() { for f in $1; do [ -e "$f" ] && return 0; done; return 1; }

# Debian package | how to tell it is there
check() {
    case $1 in
    build-essential) have_cmd gcc && have_cmd make ;;
    pkg-config) have_cmd pkg-config ;;
    libgsl-dev) have_pc gsl ;;
    libfftw3-dev) have_pc fftw3 ;;
    liblapacke-dev) have_pc lapacke && have_header lapacke.h ;;
    libopenblas-dev) have_pc openblas ;;
    # OpenBLAS's OpenMP build, where Debian has it (the Makefile prefers it: one thread pool with
    # the library's OpenMP loops; it falls back to whatever `openblas` pkg-config names)
    libopenblas-openmp-dev) have_file "/usr/lib/*/openblas-openmp/pkgconfig/openblas.pc" ;;
    libhdf5-dev) have_pc hdf5 ;;
    hdf5-tools) have_cmd h5dump ;;
    libxgboost-dev) have_header xgboost/c_api.h ;;
    libjansson-dev) have_pc jansson ;;
    libcmocka-dev) have_pc cmocka ;;
    zlib1g-dev) have_pc zlib ;;
    nettle-dev) have_pc nettle ;;
    coinor-libcbc-dev) have_pc cbc && have_header coin/Cbc_C_Interface.h ;;
    clang) have_cmd clang ;;
    libclang-rt-14-dev) have_file "/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a" ;;
    libomp-dev) have_file "/usr/lib/llvm-*/lib/libomp.so /usr/lib/*/libomp.so /usr/local/lib/libomp.so" ;;
    # make mpi (mk/mpi.mk): mpicc and mpirun, the openmpi flavour of HDF5 beside the serial one,
    # ScaLAPACK with its BLACS built on Open MPI
    openmpi-bin) have_cmd mpirun ;;
    libopenmpi-dev) have_cmd mpicc && have_pc ompi-c ;;
    libhdf5-openmpi-dev) have_pc hdf5-openmpi ;;
    libscalapack-openmpi-dev) have_pc scalapack-openmpi ||
        have_file "/usr/lib/*/libscalapack-openmpi.so /usr/local/lib/libscalapack-openmpi.so" ;;
    *) # an extra package: a command of that name, or dpkg's word where there is dpkg
        have_cmd "$1" ||
            { have_cmd dpkg-query && dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"; } ;;
    esac
}

BASE="build-essential pkg-config libgsl-dev libfftw3-dev liblapacke-dev libopenblas-dev
      libhdf5-dev hdf5-tools libxgboost-dev libjansson-dev libcmocka-dev zlib1g-dev nettle-dev
      coinor-libcbc-dev clang libclang-rt-14-dev libomp-dev"
if [ "${1:-}" = "--only" ]; then
    shift
    PKGS="$*"
elif [ "${1:-}" = "--mpi" ]; then
    shift
    PKGS="$BASE openmpi-bin libopenmpi-dev libhdf5-openmpi-dev libscalapack-openmpi-dev $*"
else
    PKGS="$BASE $*"
fi
missing=""
for p in $PKGS; do
    check "$p" || missing="$missing $p"
done
# Wanted but not needed: installed where apt-get can, never a reason to stop.
if [ "${1:-}" != "--only" ] && have_cmd apt-get; then
    for p in libopenblas-openmp-dev; do
        check "$p" || missing="$missing $p"
    done
fi
[ -z "$missing" ] && exit 0
if ! have_cmd apt-get; then
    echo "install-deps: missing (Debian package names):$missing" >&2
    echo "install-deps: no apt-get here: install them with this system's package manager (or from" >&2
    echo "  source, where pkg-config and the compiler find them), then run make again" >&2
    exit 1
fi
# One line says what is being installed; apt-get's and dpkg's own lines go to a log, shown only
# if the installation fails (a newcomer's first screen should not look like a failure).
n=$(echo $missing | wc -w)
echo "install-deps: installing $n missing Debian package(s) with apt-get:$missing" >&2
log=$(mktemp "${TMPDIR:-/tmp}/tpk-install-deps.XXXXXX")
if [ "$(id -u)" != 0 ]; then
    SUDO=sudo
else
    SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
# libhdf5-openmpi-dev repoints Debian's hdf5.pc alternative at the MPI flavour (a higher priority
# than the serial one): builds that ask pkg-config for "hdf5" (other checkouts, other programs)
# would switch HDF5 under them. Where it pointed before, it is put back afterwards.
hdf5_pc=$(pkg-config --variable=pcfiledir hdf5 2>/dev/null || true)/hdf5.pc
hdf5_was=$(readlink -f "$hdf5_pc" 2>/dev/null || true)
# shellcheck disable=SC2086
if ! { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends $missing; } \
    >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "install-deps: apt-get failed (its whole output: $log)" >&2
    exit 1
fi
rm -f "$log"
hdf5_now=$(readlink -f "$hdf5_pc" 2>/dev/null || true)
if [ -n "$hdf5_was" ] && [ "$hdf5_was" != "$hdf5_now" ] && have_cmd update-alternatives &&
    $SUDO update-alternatives --set hdf5.pc "$hdf5_was" >/dev/null 2>&1; then
    echo "install-deps: kept hdf5.pc on $hdf5_was (the MPI flavour is hdf5-openmpi.pc)" >&2
fi
