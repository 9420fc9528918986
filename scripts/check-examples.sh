#!/bin/sh
# examples/ as a user builds them (issue 40): against an installed tpk, found by pkg-config.
#   sh scripts/check-examples.sh ROOT BUILD SCRATCH
# installs ROOT's BUILD tree into SCRATCH/prefix (PREFIX: a real prefix, so the data directory
# compiled into the installed libraries is one that exists), checks that no global symbol of the
# installed libtpk.a lacks the tpk_ prefix, builds every example with examples/Makefile twice
# (shared with its run path; fully static with -static and `pkg-config --static`), runs each
# build on inputs written here and compares every number with a reference computed here by awk
# from closed forms (the ReLU arc-cosine kernel, the erf arcsine kernel, E[cos cos], a Cholesky
# GP posterior): never a number the examples printed. Then the shipped programs: found with
# TPK_DATADIR unset (compiled in), with TPK_DATADIR (pkg-config's datadir) when the prefix's copy
# has moved away, and an error listing the places tried when neither exists. Prints
# "examples: ok".
set -eu
ROOT=$1
BUILD=$2
S=$3
P=$S/prefix
fail() { echo "check-examples: $*" >&2; exit 1; }
rm -rf "$P" "$S/dyn" "$S/static"
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "$ROOT" BUILD="$BUILD" PREFIX="$P" install \
    >"$S/install.log" 2>&1 || { cat "$S/install.log" >&2; fail "make install PREFIX=$P failed"; }
export PKG_CONFIG_PATH="$P/lib/pkgconfig"
[ "$(pkg-config --variable=datadir tpk)" = "$P/share/tpk" ] ||
    fail "pkg-config --variable=datadir tpk is '$(pkg-config --variable=datadir tpk)', not $P/share/tpk"
[ -f "$(pkg-config --variable=datadir tpk)/programs/mlp.nsr" ] || fail "no programs under the datadir"

# No global symbol of the installed archive without the prefix (a user's static link).
bad=$(nm -g --defined-only "$P/lib/libtpk.a" | awk 'NF == 3 && $3 !~ /^tpk_/ { print $3 }' | head -5)
[ -z "$bad" ] || fail "libtpk.a exports names without the tpk_ prefix: $bad"

# A sanitizer build (make check-asan) cannot be linked by a plain cc: installed and checked, not run.
if nm "$P/lib/libtpk.a" 2>/dev/null | grep -q __asan_report; then
    echo "examples: ok (sanitizer build: examples not linked)"
    exit 0
fi
mkx() { env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "$ROOT/examples" "$@"; }
mkx OUT="$S/dyn" >"$S/dyn.log" 2>&1 || { cat "$S/dyn.log" >&2; fail "examples do not build (shared)"; }
mkx OUT="$S/static" STATIC=1 >"$S/static.log" 2>&1 ||
    { cat "$S/static.log" >&2; fail "examples do not link with -static and pkg-config --static"; }
for x in gp_mlp netsor_split custom_phi arch_kernel; do
    readelf -d "$S/dyn/$x" | grep -q 'NEEDED.*libtpk\.so' || fail "dyn/$x does not load libtpk.so"
    ! readelf -d "$S/static/$x" 2>/dev/null | grep -q NEEDED || fail "static/$x is not fully static"
done

# Inputs: deterministic, "high-entropy" values (style.md §13); rows of d numbers, no header.
rows() { awk -v n="$1" -v d="$2" -v ph="$3" 'BEGIN { for (a = 0; a < n; a++) { line = "";
    for (j = 0; j < d; j++) line = line (j ? "," : "") sprintf("%.17g", sin(1.37 * a + 2.11 * j + ph) * (1 + 0.3 * a));
    print line } }'; }
rows 7 3 0.3 >"$S/x.csv"
rows 4 3 0.9 >"$S/xt.csv"
awk 'BEGIN { for (a = 0; a < 7; a++) printf "%.17g\n", cos(0.7 * a) + 0.1 * a }' >"$S/y.csv"

# Reference kernels in awk. relu: Cho & Saul's arc-cosine E[relu(u) relu(v)]; erf: Williams'
# arcsine 2/π asin(2k/√((1+2q)(1+2q'))); cos: E[cos(ωu) cos(ωv)] = ½(e^{-ω²(q+q'-2k)/2} +
# e^{-ω²(q+q'+2k)/2}). The network: Σ¹ = σ_w²⟨x,x'⟩/d + σ_b², then `depth` times
# Σ ← σ_w² E[φφ](Σ) + σ_b²; out = vscale·E[φφ] + vbias of the last Σ when vscale > 0 (a
# readout of its own), else the last Σ itself (tpk_mlp_kernel's Σ^{L+1}).
KERNEL_AWK='
function asin(x) { return atan2(x, sqrt(1 - x * x)) }
function acos(x) { return atan2(sqrt(1 - x * x), x) }
function E(phi, q1, q2, k,   s, r, th) {
    if (phi == "relu") { s = sqrt(q1 * q2); r = s > 0 ? k / s : 0; r = r > 1 ? 1 : r < -1 ? -1 : r;
        th = acos(r); return s / (2 * PI) * (sin(th) + (PI - th) * r) }
    if (phi == "erf") return 2 / PI * asin(2 * k / sqrt((1 + 2 * q1) * (1 + 2 * q2)))
    return 0.5 * (exp(-W2 * (q1 + q2 - 2 * k) / 2) + exp(-W2 * (q1 + q2 + 2 * k) / 2))
}
function kern(a, b,   j, xx, yy, xy, q1, q2, k, l, k2) {
    xx = yy = xy = 0
    for (j = 1; j <= D; j++) { xx += P[a, j] * P[a, j]; yy += P[b, j] * P[b, j]; xy += P[a, j] * P[b, j] }
    q1 = SW2 * xx / D + SB2; q2 = SW2 * yy / D + SB2; k = SW2 * xy / D + SB2
    for (l = 0; l < DEPTH; l++) { k2 = SW2 * E(PHI, q1, q2, k) + SB2
        q1 = SW2 * E(PHI, q1, q1, q1) + SB2; q2 = SW2 * E(PHI, q2, q2, q2) + SB2; k = k2 }
    return VSCALE > 0 ? VSCALE * E(PHI, q1, q2, k) : k
}
BEGIN { PI = atan2(0, -1); FS = "," }
FILENAME == ARGV[1] { n++; for (j = 1; j <= NF; j++) P[n, j] = $j; D = NF; next }
FILENAME == ARGV[2] { m++; for (j = 1; j <= NF; j++) P[1000 + m, j] = $j; next }
'
# every number of got against ref: |got - ref| <= tol (1 + |ref|)
compare() { awk -v tol="$3" -v what="$4" -v num='^-?[0-9][0-9.]*([eE][-+]?[0-9]+)?$' '
    NR == FNR { for (i = 1; i <= NF; i++) ref[FNR, i] = $i; nf[FNR] = NF; nr = FNR; next }
    { if (NF != nf[FNR]) { printf "%s: line %d has %d fields, want %d\n", what, FNR, NF, nf[FNR]; bad = 1 }
      for (i = 1; i <= NF; i++) {
          if (ref[FNR, i] !~ num) { if ($i != ref[FNR, i]) { printf "%s: line %d field %d: %s, want %s\n",
              what, FNR, i, $i, ref[FNR, i]; bad = 1 }; continue }
          d = $i - ref[FNR, i]; d = d < 0 ? -d : d; r = ref[FNR, i]; r = r < 0 ? -r : r
          if ($i !~ num || d > tol * (1 + r)) {
              printf "%s: line %d field %d: %s, reference %s\n", what, FNR, i, $i, ref[FNR, i]; bad = 1 } }
      got++ }
    END { if (got != nr) { printf "%s: %d lines, want %d\n", what, got, nr; bad = 1 }; exit bad }' "$1" "$2"; }

# (a) gp_mlp: the ReLU MLP kernel (depth 3, σ_w² 2, σ_b² 0.1), then the GP posterior of
# Rasmussen & Williams Alg. 2.1 by a Cholesky factor written here, noise 0.01.
awk -v PHI=relu -v DEPTH=3 -v SW2=2 -v SB2=0.1 -v VSCALE=0 "$KERNEL_AWK"'
FILENAME == ARGV[3] { y[++ny] = $1 }
END {
    for (i = 1; i <= n; i++) for (j = 1; j <= n; j++) A[i, j] = kern(i, j) + (i == j ? 0.01 : 0)
    for (j = 1; j <= n; j++) { s = A[j, j]; for (k = 1; k < j; k++) s -= L[j, k] * L[j, k]; L[j, j] = sqrt(s)
        for (i = j + 1; i <= n; i++) { s = A[i, j]; for (k = 1; k < j; k++) s -= L[i, k] * L[j, k]; L[i, j] = s / L[j, j] } }
    for (i = 1; i <= n; i++) { s = y[i]; for (k = 1; k < i; k++) s -= L[i, k] * z[k]; z[i] = s / L[i, i] }
    for (i = n; i >= 1; i--) { s = z[i]; for (k = i + 1; k <= n; k++) s -= L[k, i] * al[k]; al[i] = s / L[i, i] }
    for (t = 1; t <= m; t++) { mu = 0; for (j = 1; j <= n; j++) { kx[j] = kern(1000 + t, j); mu += kx[j] * al[j] }
        vv = 0; for (i = 1; i <= n; i++) { s = kx[i]; for (k = 1; k < i; k++) s -= L[i, k] * v[k]; v[i] = s / L[i, i]; vv += v[i] * v[i] }
        printf "%.17g %.17g\n", mu, kern(1000 + t, 1000 + t) - vv }
    lml = -n / 2 * log(2 * PI); for (i = 1; i <= n; i++) lml -= 0.5 * y[i] * al[i] + log(L[i, i])
    printf "lml %.17g\n", lml }' "$S/x.csv" "$S/xt.csv" "$S/y.csv" >"$S/ref_gp_mlp.txt"
# (b) netsor_split: two erf layers, σ_w² 1.5 (the program's default 1.0 overridden), σ_b² 0.2,
# readout variance 1: test × train, then the test diagonal.
awk -v PHI=erf -v DEPTH=1 -v SW2=1.5 -v SB2=0.2 -v VSCALE=1 "$KERNEL_AWK"'
END { for (t = 1; t <= m; t++) for (j = 1; j <= n; j++) printf "%.17g%s", kern(1000 + t, j), j < n ? " " : "\n"
      printf "diag"; for (t = 1; t <= m; t++) printf " %.17g", kern(1000 + t, 1000 + t); printf "\n" }' \
    "$S/x.csv" "$S/xt.csv" >"$S/ref_netsor_split.txt"
# (c) custom_phi: cos(1.5 x), depth 2, σ_w² 1.3, σ_b² 0.05 (W2 = ω²)
awk -v PHI=cos -v W2=2.25 -v DEPTH=2 -v SW2=1.3 -v SB2=0.05 -v VSCALE=0 "$KERNEL_AWK"'
END { for (i = 1; i <= n; i++) for (j = 1; j <= n; j++) printf "%.17g%s", kern(i, j), j < n ? " " : "\n" }' \
    "$S/x.csv" /dev/null >"$S/ref_custom_phi.txt"
# (d) arch_kernel: gpkernel --arch=mlp --depth=2 --sigma-w2=1.7 --sigma-b2=0.05 (ReLU)
awk -v PHI=relu -v DEPTH=2 -v SW2=1.7 -v SB2=0.05 -v VSCALE=0 "$KERNEL_AWK"'
END { for (i = 1; i <= n; i++) for (j = 1; j <= n; j++) printf "%.17g%s", kern(i, j), j < n ? " " : "\n" }' \
    "$S/x.csv" /dev/null >"$S/ref_arch_kernel.txt"

# Tolerances: closed forms on both sides leave rounding of short sums and a 7×7 Cholesky
# (1e-9 is far above it and far below any modelling error); the cos kernel is Gauss–Hermite
# quadrature in the library (64 nodes per axis, exponential convergence for a smooth φ).
TOL_CLOSED=1e-9
TOL_QUAD=1e-8
# Run from the scratch folder: the working directory is the last place searched for programs/,
# and the checkout's must not stand in for the installed ones.
cd "$S"
run() { x=$1; shift; env -u TPK_DATADIR "$S/$b/$x" "$@" >"$S/$b-$x.txt" 2>"$S/$b-$x.err" ||
    { cat "$S/$b-$x.err" >&2; fail "$b/$x failed"; }; }
for b in dyn static; do
    run gp_mlp "$S/x.csv" "$S/y.csv" "$S/xt.csv"
    run netsor_split "$S/x.csv" "$S/xt.csv"
    run custom_phi "$S/x.csv"
    run arch_kernel "$S/x.csv"
    compare "$S/ref_gp_mlp.txt" "$S/$b-gp_mlp.txt" $TOL_CLOSED "$b/gp_mlp" || fail "$b/gp_mlp: numbers differ"
    compare "$S/ref_netsor_split.txt" "$S/$b-netsor_split.txt" $TOL_CLOSED "$b/netsor_split" ||
        fail "$b/netsor_split: numbers differ"
    compare "$S/ref_custom_phi.txt" "$S/$b-custom_phi.txt" $TOL_QUAD "$b/custom_phi" ||
        fail "$b/custom_phi: numbers differ"
    compare "$S/ref_arch_kernel.txt" "$S/$b-arch_kernel.txt" $TOL_CLOSED "$b/arch_kernel" ||
        fail "$b/arch_kernel: numbers differ"
done

# The shipped programs when the prefix's copy is gone: an error naming every place and both
# remedies, then TPK_DATADIR pointing at the moved copy.
mv "$P/share/tpk" "$P/share/tpk.moved"
for b in dyn static; do
    if env -u TPK_DATADIR "$S/$b/arch_kernel" "$S/x.csv" >/dev/null 2>"$S/$b-moved.err"; then
        mv "$P/share/tpk.moved" "$P/share/tpk"; fail "$b/arch_kernel found a program that was moved away"
    fi
    for w in "$P/share/tpk/programs/mlp.nsr (the install data directory compiled in)" TPK_DATADIR \
        tpk_arch_opts.root "pkg-config --variable=datadir"; do
        grep -qF "$w" "$S/$b-moved.err" || { mv "$P/share/tpk.moved" "$P/share/tpk";
            fail "$b/arch_kernel's error does not name '$w': $(cat "$S/$b-moved.err")"; }
    done
    TPK_DATADIR="$P/share/tpk.moved" "$S/$b/arch_kernel" "$S/x.csv" >"$S/$b-env.txt" ||
        { mv "$P/share/tpk.moved" "$P/share/tpk"; fail "$b/arch_kernel with TPK_DATADIR failed"; }
    compare "$S/ref_arch_kernel.txt" "$S/$b-env.txt" $TOL_CLOSED "$b/arch_kernel (TPK_DATADIR)" ||
        { mv "$P/share/tpk.moved" "$P/share/tpk"; fail "$b/arch_kernel with TPK_DATADIR: numbers differ"; }
done
mv "$P/share/tpk.moved" "$P/share/tpk"
echo "examples: ok"
