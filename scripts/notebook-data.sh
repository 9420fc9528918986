#!/bin/sh
# Toy-sized toolkit outputs for the notebooks (make check-notebooks). Usage: notebook-data.sh [OUTDIR]
# Every data file is written by the toolkit's programs (gpkernel, gplimits, gpregress, tptune);
# no Python here. A step whose program, architecture or data set is not there yet leaves
# OUTDIR/<step>.skipped with the reason, and the notebook prints it instead of a plot.
# Architectures come from `gpkernel --list-archs`, so a new row there appears in the gallery.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${TPK_BIN:-$ROOT/build/bin}
OUT=${1:-$ROOT/build/notebook-data}
SEEDS=${NB_SEEDS:-24}          # networks per width: toy size (paper-figures/ uses more)
WIDTHS=${NB_WIDTHS:-32..512}
TUNE_TRIALS=${NB_TUNE_TRIALS:-6}
STEP_TIMEOUT=${NB_STEP_TIMEOUT:-60}   # seconds: a step slower than a toy run is skipped, not waited for
cd "$ROOT" || exit 1

rm -rf "$OUT"
mkdir -p "$OUT/kernels" "$OUT/convergence" "$OUT/attention" "$OUT/gp" "$OUT/tuning" || exit 1
start=$(date +%s)

skip() {  # skip STEP REASON...
    s=$1; shift
    printf '%s\n' "$*" > "$OUT/$s.skipped"
    echo "notebook-data: skipped $s: $*" >&2
}
# run STEP CMD...: output to OUTDIR/STEP.log; a failure or a timeout becomes a skip.
run() {
    s=$1; shift
    t0=$(date +%s)
    timeout "$STEP_TIMEOUT" "$@" > "$OUT/$s.log" 2>&1
    rc=$?
    if [ $rc = 0 ]; then
        echo "notebook-data: $s ($(($(date +%s) - t0)) s)" >&2
        return 0
    elif [ $rc = 124 ]; then
        skip "$s" "$(basename "$1") took longer than the toy budget of $STEP_TIMEOUT s (NB_STEP_TIMEOUT); see make figures"
    else
        skip "$s" "$(basename "$1") failed: $(tail -n 3 "$OUT/$s.log" | tr '\n' ' ')"
    fi
    return 1
}
# The architecture table: "name  summary  [programs/x.nsr]" then an indented "flags:" line.
ARCHS=$("$BIN/gpkernel" --list-archs | awk '/^[^ \t]/ { print $1 }')
program_of() {
    "$BIN/gpkernel" --list-archs |
        awk -v a="$1" '$1 == a { if (match($0, /\[[^] ]*\][ \t]*$/)) { p = substr($0, RSTART + 1); sub(/\].*/, "", p); print p } }'
}
has_arch() { printf '%s\n' "$ARCHS" | grep -qx "$1"; }
# T of an N×T×d .npy input, from its header (dict text in the first 128 bytes).
npy_T() { head -c 128 "$1" | tr -cd '[:print:]' | sed -n "s/.*'shape': *([0-9]*, *\([0-9]*\), *[0-9]*).*/\1/p"; }

# 1. Kernel gallery: every architecture on its bundled demo input.
for a in $ARCHS; do
    run "kernels/$a" "$BIN/gpkernel" --arch="$a" --output="$OUT/kernels/$a.h5"
done

# 2. Convergence: gplimits over a width ladder for the MLP and each recurrent / normalised /
#    transformer architecture present (the program gpkernel ships for it, at its defaults).
run convergence/mlp "$BIN/gplimits" --arch=mlp --depth=2 --phi=relu --widths="$WIDTHS" \
    --seeds="$SEEDS" --boot=200 --output="$OUT/convergence/mlp.h5"
for a in rnn gru lstm transformer batchnorm; do
    has_arch "$a" || { skip "convergence/$a" "architecture $a not in gpkernel --list-archs yet"; continue; }
    prog=$(program_of "$a")
    set --
    if grep -q 'input *[A-Za-z_]*\[' "$prog"; then
        set -- --input=data/demo-sequences.npy --set T="$(npy_T data/demo-sequences.npy)"
    fi
    run "convergence/$a" "$BIN/gplimits" --program="$prog" "$@" --max-inputs=4 --widths="$WIDTHS" \
        --seeds="$SEEDS" --boot=200 --output="$OUT/convergence/$a.h5"
done

# 3. The 1/sqrt(n) attention layer (theory.md §5): the hierarchical limit on the demo tokens
#    (gpkernel: sampled conditional covariances C(p)), finite-width networks of the same layer
#    (netsor run, one file per network: /kernel_hat is the output's conditional variance), and law
#    distances against width in the paper's setting (gpattention: s = 4 tokens, Sigma^x = I).
if has_arch attention && [ -x "$BIN/gpattention" ] && [ -f programs/attention-sqrtn.nsr ]; then
    TOK=data/demo-tokens.npy
    run attention/limit "$BIN/gpkernel" --arch=attention --heads=2 --logit-scaling=inv-sqrt-n \
        --score-samples=2000 --input=$TOK --output="$OUT/attention/limit.h5"
    run attention/distances "$BIN/gpattention" --tokens=4 --heads=2 --widths=16..256 --networks=1000 \
        --score-samples=1000 --output="$OUT/attention/distances.h5"
    T=$(npy_T $TOK)
    for n in 16 64 256; do
        mkdir -p "$OUT/attention/n$n"
        s=1
        while [ $s -le 60 ]; do
            "$BIN/netsor" run programs/attention-sqrtn.nsr --input=$TOK --set heads=2 --set T="$T" \
                --width=$n --seed=$s --output="$OUT/attention/n$n/net$s.h5" --quiet ||
                { skip attention/finite "netsor run programs/attention-sqrtn.nsr failed"; break; }
            s=$((s + 1))
        done
    done
else
    skip attention "needs gpkernel --arch=attention, gpattention and programs/attention-sqrtn.nsr"
fi

# 4. GP regression. (a) A 1-D toy problem: NNGP kernel with test cross terms, then gpregress.
#    20 points on [-3, 3] with a gap in the middle; noise sd 0.1 from a deterministic hash
#    (frac(sin(k) 43758.5453), the same on every awk): a sum of 3 uniforms scaled to unit variance.
awk -v out="$OUT/gp" 'BEGIN {
    for (i = 0; i < 24; i++) {
        x = -3 + 6 * (i + 0.5) / 24
        if (x > -0.6 && x < 0.9) continue
        e = 0
        for (j = 1; j <= 3; j++) { h = sin(12.9898 * i + 78.233 * j) * 43758.5453; e += h - int(h) }
        e = (e - 1.5) * 2                  # sum of 3 U(0,1): mean 3/2, variance 1/4
        printf "%.6f\n", x > (out "/toy-x.csv")
        printf "%.6f\n", sin(1.7 * x) + 0.5 * x + 0.1 * e > (out "/toy-y.csv")
    }
    for (i = 0; i <= 240; i++) printf "%.6f\n", -4.5 + 9 * i / 240 > (out "/toy-grid.csv")
}'
for phi in relu erf; do
    run "gp/toy-kernel-$phi" "$BIN/gpkernel" --arch=mlp --depth=3 --phi=$phi --sigma-w2=2 --sigma-b2=0.5 \
        --input="$OUT/gp/toy-x.csv" --test="$OUT/gp/toy-grid.csv" --output="$OUT/gp/toy-kernel-$phi.h5" &&
    run "gp/toy-$phi" "$BIN/gpregress" --kernel="$OUT/gp/toy-kernel-$phi.h5" --labels="$OUT/gp/toy-y.csv" \
        --output="$OUT/gp/toy-$phi.h5"
done
# (b) Fashion-MNIST accuracy against depth at toy size (make fashion runs 10 000 / 10 000).
if dpkg-query -W -f='${Status}' dataset-fashion-mnist 2>/dev/null | grep -q "ok installed"; then
    run gp/fashion env FASHION_N_TRAIN=500 FASHION_N_TEST=500 FASHION_VAR_N=500 FASHION_DEPTHS=1-6 \
        sh scripts/fashion.sh "$BIN/gpregress" "$OUT/gp/fashion"
else
    skip gp/fashion "Debian package dataset-fashion-mnist not installed (make fashion installs it)"
fi

# 5. Tuner: a few trials of model-guided and random search on one small GEMM. The shipped logs
#    (data/tuning/*.jsonl) are read by the notebook directly.
if [ -x "$BIN/tptune" ]; then
    for m in rank random; do
        run "tuning/$m" "$BIN/tptune" gemm --m=256 --n=256 --k=256 --dtype=f64 --threads=1 \
            --trials="$TUNE_TRIALS" --batch=3 --model=$m --seed=5 --log="$OUT/tuning/gemm256-$m.jsonl"
    done
else
    skip tuning "tptune not built"
fi

echo "notebook-data: $OUT in $(($(date +%s) - start)) s" >&2
