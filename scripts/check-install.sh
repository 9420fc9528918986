#!/bin/sh
# A staged `make install` as a packager runs it (issue 17, item 5), then `make uninstall`:
#   sh scripts/check-install.sh ROOT BUILD SCRATCH
# installs ROOT's BUILD tree into SCRATCH/stage (DESTDIR) with PREFIX=/opt/tpk and LIBDIR
# /opt/tpk/lib64, checks the files (versioned libtpk.so.X.Y.Z with SONAME libtpk.so.X and its
# links, the headers less the tuner's, man pages, bash completions, tpk.pc), builds a program
# against the staged tree through pkg-config three ways (shared; static libtpk.a with
# `pkg-config --static`; fully static with -static), runs them, checks what they link
# (OpenBLAS, never GSL's reference CBLAS or a tuner library), and that `make uninstall` leaves
# no file behind. Prints "install: ok".
set -eu
ROOT=$1
BUILD=$2
S=$3
D=$S/stage
P=/opt/tpk
L=$P/lib64
fail() { echo "check-install: $*" >&2; exit 1; }
mk() { env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "$ROOT" BUILD="$BUILD" \
    DESTDIR="$D" PREFIX=$P LIBDIR=$L "$@"; }
rm -rf "$D"
mk install >"$S/install.log" 2>&1 || { cat "$S/install.log" >&2; fail "make install failed"; }
V=$(sed -n 's/^#define TPK_VERSION_STRING "\(.*\)"/\1/p' "$ROOT/include/tpk/version.h")
M=${V%%.*}
[ -f "$D$L/libtpk.so.$V" ] || fail "no $L/libtpk.so.$V"
[ "$(readlink "$D$L/libtpk.so.$M")" = "libtpk.so.$V" ] || fail "libtpk.so.$M is not a link to libtpk.so.$V"
[ "$(readlink "$D$L/libtpk.so")" = "libtpk.so.$M" ] || fail "libtpk.so is not a link to libtpk.so.$M"
readelf -d "$D$L/libtpk.so.$V" | grep -q "SONAME.*\[libtpk.so.$M\]" || fail "SONAME is not libtpk.so.$M"
[ -f "$D$L/libtpk.a" ] || fail "no libtpk.a"
[ -f "$D$P/include/tpk/tpk.h" ] && [ -f "$D$P/include/tpk/version.h" ] || fail "headers missing"
[ ! -e "$D$P/include/tpk/tune.h" ] || fail "the tuner's header tune.h was installed"
for t in gpkernel netsor gplimits gpregress gpattention tptune; do
    [ -x "$D$P/bin/$t" ] || fail "no $P/bin/$t"
    [ -s "$D$P/share/man/man1/$t.1" ] || fail "no man page $t.1"
    grep -q 'Exit status: 0 success' "$D$P/share/man/man1/$t.1" || fail "$t.1 lacks the --help text"
    [ -s "$D$P/share/bash-completion/completions/$t" ] || fail "no bash completion for $t"
done
[ -f "$D$P/share/tpk/programs/mlp.nsr" ] || fail "programs not installed"
PC=$D$L/pkgconfig/tpk.pc
[ -f "$PC" ] || fail "no $L/pkgconfig/tpk.pc"
pc() { PKG_CONFIG_PATH=$D$L/pkgconfig pkg-config --define-variable=prefix="$D$P" "$@" tpk; }
[ "$(pc --modversion)" = "$V" ] || fail "pkg-config --modversion is not $V"
STATIC_LIBS=$(pc --static --libs)
case " $STATIC_LIBS " in *" -lopenblas "*) ;; *) fail "pkg-config --static does not link OpenBLAS: $STATIC_LIBS" ;; esac
for bad in -lgslcblas -lxgboost -ljansson; do
    case " $STATIC_LIBS " in *" $bad "*) fail "pkg-config --static links $bad: $STATIC_LIBS" ;; esac
done
# A sanitizer build (make check-asan) cannot be linked by a plain cc: its files are checked, the
# programs are not built.
if nm "$D$L/libtpk.a" 2>/dev/null | grep -q __asan_report; then
    mk uninstall >"$S/uninstall.log" 2>&1 || fail "make uninstall failed"
    [ -z "$(find "$D" -type f -o -type l | head -1)" ] || fail "make uninstall left files"
    echo "install: ok (sanitizer build: programs not linked)"
    exit 0
fi
cat >"$S/t.c" <<'C'
#include <stdio.h>
#include <string.h>
#include <tpk/tpk.h>
int main(void)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    double A[6] = {1.5, -2, 0.25, 3, 4, -1}, B[6] = {2, 1, 0, -1, 5, 0.5}, C[4] = {0};
    if (tpk_dgemm(TPK_NO_TRANS, TPK_NO_TRANS, 2, 2, 3, 1.0, A, 3, B, 2, 0.0, C, 2, &ctx))
        return 2;
    /* [1.5 -2 .25; 3 4 -1] [2 1; 0 -1; 5 .5] = [4.25 3.625; 1 -1.5] */
    if (C[0] != 4.25 || C[1] != 3.625 || C[2] != 1 || C[3] != -1.5)
        return 3;
    printf("%s %s\n", tpk_version(), strcmp(tpk_version(), TPK_VERSION_STRING) ? "mismatch" : "ok");
    return 0;
}
C
cc -o "$S/t_shared" "$S/t.c" $(pc --cflags --libs) || fail "cannot build against the shared library"
[ "$(LD_LIBRARY_PATH=$D$L "$S/t_shared")" = "$V ok" ] || fail "the shared build does not run"
ldd "$S/t_shared" >"$S/ldd_shared.txt"
grep -q "libtpk.so.$M " "$S/ldd_shared.txt" || fail "the program does not load libtpk.so.$M"
cc -o "$S/t_static" "$S/t.c" $(pc --cflags) "$D$L/libtpk.a" \
    $(echo "$STATIC_LIBS" | sed 's/ -ltpk / /; s/^-ltpk //') ||
    fail "cannot link libtpk.a with pkg-config --static"
[ "$("$S/t_static")" = "$V ok" ] || fail "the static build does not run"
# The README's fully static recipe (issue 40): -static with pkg-config --static, every library
# from its .a (Libs.private names what Debian's shared libraries pull in themselves: szip, the
# C++ runtime of CBC, the Fortran runtime of OpenBLAS).
cc -static -o "$S/t_full_static" "$S/t.c" $(pc --cflags --static --libs) >"$S/static.log" 2>&1 ||
    { cat "$S/static.log" >&2; fail "cannot link fully static with pkg-config --static --libs tpk"; }
! readelf -d "$S/t_full_static" 2>/dev/null | grep -q NEEDED || fail "the -static build needs shared libraries"
[ "$("$S/t_full_static")" = "$V ok" ] || fail "the fully static build does not run"
# What the program itself needs (Debian's libgsl.so needs libgslcblas in turn, which ldd would
# list; what counts is that OpenBLAS comes first and serves cblas_dgemm).
readelf -d "$S/t_static" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' >"$S/needed.txt"
grep -q libopenblas "$S/needed.txt" || fail "the static build does not link OpenBLAS: $(tr '\n' ' ' <"$S/needed.txt")"
! grep -q -e libgslcblas -e libxgboost -e libjansson -e 'libtpk\.so' "$S/needed.txt" ||
    fail "the static build links $(grep -e libgslcblas -e libxgboost -e libjansson -e 'libtpk.so' "$S/needed.txt" | head -1)"
LD_DEBUG=bindings "$S/t_static" 2>"$S/bindings.txt" >/dev/null
grep "symbol \`cblas_dgemm'" "$S/bindings.txt" | grep -q libopenblas ||
    fail "cblas_dgemm is not OpenBLAS's: $(grep "cblas_dgemm" "$S/bindings.txt" | head -1)"
mk uninstall >"$S/uninstall.log" 2>&1 || { cat "$S/uninstall.log" >&2; fail "make uninstall failed"; }
left=$(find "$D" -type f -o -type l | head -5)
[ -z "$left" ] || fail "make uninstall left: $left"
echo "install: ok"
