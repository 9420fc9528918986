#!/bin/sh
# Portable-build check (issue 15, tuner-notes §7): the library and tools built with
# ARCH=x86-64-v3 into their own folder run on an emulated CPU without AVX-512
# (qemu-x86_64 -cpu Haswell), serve from the AVX2 class, and write the same kernels as the native
# build (h5diff -d 1e-13). Run by .ci/run; `make check-portable` calls it.
set -eu
cd "$(dirname "$0")/.."
B=${PORTABLE_BUILD:-build-v3}
JOBS=${JOBS:-2}
sh scripts/install-deps.sh qemu-user
make -j"$JOBS" tools
make -j"$JOBS" BUILD="$B" ARCH=x86-64-v3 tools
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
q="qemu-x86_64 -cpu Haswell"
fail=0
# The check must be able to fail: the native build of an AVX-512 host dies on this CPU.
if grep -q avx512f /proc/cpuinfo && $q build/bin/gpkernel --arch=mlp --depth=3 --output="$out/x.h5" >/dev/null 2>&1; then
    echo "check-portable: the native build ran under -cpu Haswell: the emulated CPU is not AVX2-only" >&2
    fail=1
fi
# (qemu's TCG warns about CPUID bits it does not emulate: kept in qemu.err, shown on failure.)
$q "$B/bin/tptune" show > "$out/show.txt" 2>>"$out/qemu.err"
grep -q '^serving class: cpu/x86_64/avx2 (exact)' "$out/show.txt" || {
    echo "check-portable: the portable build does not serve from the AVX2 class under -cpu Haswell:" >&2
    head -4 "$out/show.txt" >&2
    fail=1
}
# Kernels whose inner loops run through the runtime layer: MLP (ReLU map, input Gram by GEMM),
# an erf MLP (closed form), and a recurrent program (the NETSOR evaluator).
for args in "--arch=mlp --depth=3" "--arch=mlp --depth=4 --phi=erf" "--arch=rnn --all-times"; do
    tag=$(printf '%s' "$args" | tr -c 'a-z0-9' '_')
    build/bin/gpkernel $args --output="$out/native-$tag.h5" >/dev/null
    $q "$B/bin/gpkernel" $args --output="$out/v3-$tag.h5" >/dev/null 2>>"$out/qemu.err" || {
        grep -v "TCG doesn't support" "$out/qemu.err" >&2; exit 1; }
    if h5diff -d 1e-13 "$out/native-$tag.h5" "$out/v3-$tag.h5" /kernel /kernel; then
        echo "check-portable: gpkernel $args: the x86-64-v3 build under -cpu Haswell agrees to 1e-13"
    else
        echo "check-portable: gpkernel $args: kernels differ beyond 1e-13" >&2
        fail=1
    fi
done
exit $fail
