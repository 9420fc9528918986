#!/bin/sh
# The debug build under valgrind (issue 40, item 4; `make check-valgrind`, mk/debug.mk):
#   sh scripts/check-valgrind.sh BUILD [TEST...]
# runs every example of BUILD/examples on small inputs written here, then BUILD/tests/TEST for
# each TEST, each under valgrind --leak-check=full --error-exitcode=1: any invalid read or
# write, use of an uninitialised value, or definite or possible leak fails it. Prints one line
# per program and "valgrind: ok". The build must be the portable one (`make debug`): a
# -march=native build on an AVX-512 machine stops valgrind 3.19 with SIGILL.
set -eu
B=$1
shift
ROOT=${TPK_ROOT:-.}
command -v valgrind >/dev/null 2>&1 || { echo "check-valgrind: no valgrind (scripts/install-deps.sh --only valgrind)" >&2; exit 1; }
S=$(mktemp -d "${TMPDIR:-/tmp}/tpk-valgrind-XXXXXX")
trap 'rm -rf "$S"' EXIT
# Small inputs: the checks are about memory, not numbers (scripts/check-examples.sh does those).
awk 'BEGIN { for (a = 0; a < 5; a++) printf "%.6f,%.6f,%.6f\n", sin(1.37*a), cos(2.11*a), sin(0.7*a+1) }' >"$S/x.csv"
awk 'BEGIN { for (a = 0; a < 3; a++) printf "%.6f,%.6f,%.6f\n", cos(1.1*a), sin(0.3*a), cos(a+2) }' >"$S/xt.csv"
awk 'BEGIN { for (a = 0; a < 5; a++) printf "%.6f\n", cos(0.7*a) }' >"$S/y.csv"
# One OpenMP and one OpenBLAS thread: the thread pools' stacks, still alive at exit, would show
# as "possibly lost" (libgomp and OpenBLAS keep them on purpose), and one thread is what a
# debugger session wants anyway.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
VG="valgrind --leak-check=full --error-exitcode=1 --errors-for-leak-kinds=definite,possible --quiet"
rc=0
run() {
    name=$1
    shift
    if $VG --log-file="$S/$name.vg" "$@" >"$S/$name.out" 2>&1; then
        echo "valgrind: $name ok"
    else
        echo "valgrind: $name FAILED" >&2
        tail -n 40 "$S/$name.vg" "$S/$name.out" >&2
        rc=1
    fi
}
run gp_mlp "$B/examples/gp_mlp" "$S/x.csv" "$S/y.csv" "$S/xt.csv"
run netsor_split "$B/examples/netsor_split" "$S/x.csv" "$S/xt.csv"
run custom_phi "$B/examples/custom_phi" "$S/x.csv"
run arch_kernel "$B/examples/arch_kernel" "$S/x.csv"
for t in "$@"; do
    TPK_BIN=$(cd "$B/bin" && pwd) TPK_ROOT=$ROOT run "$t" "$B/tests/$t"
done
[ $rc = 0 ] && echo "valgrind: ok"
exit $rc
