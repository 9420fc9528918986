#!/bin/sh
# make fashion-full (issue 16, item 5): NNGP classification on all 60 000 Fashion-MNIST training
# images and the 10 000 test images on MPI ranks: gpregress-mpi with block preconditioned CG
# (pivoted Cholesky), the kernel stored in float32 (its lower triangle: 7.2 GB over the ranks),
# depth and noise chosen by the training LML (stochastic Lanczos quadrature), never by test data.
# Preprocessing as make fashion (scripts/fashion.sh): pixels centred by the training mean, each
# image scaled to unit norm, one-hot regression, accuracy by argmax.
# Usage: fashion-full.sh BINDIR OUTDIR. Environment: FASHION_N_TRAIN, FASHION_N_TEST (defaults
# 60000, 10000: smaller runs the same pipeline, as the toy run of the tests does), FASHION_DEPTHS
# (1-4), FASHION_RANKS (2), FASHION_VAR_N (0: no variances; CG takes one solve per test item),
# FASHION_SELECT_N (4000: the subsample whose eigendecomposition chooses each depth's noise, as
# gpregress chooses it), FASHION_NOISE_FITS (0: no full-size walk from there; each fit of the
# walk is a CG solve at N = 60 000), FASHION_CG_TOL (1e-6), FASHION_PROBES (10: SLQ probes of the
# full-size LML that chooses the depth), FASHION_PRECOND_RANK (1000: the pivoted Cholesky's rank;
# at N = 20 000 rank 100 took 174 CG iterations, 1000 took 38), TPK_MPIRUN (the launcher, as the MPI tests);
# FASHION_TRAIN, FASHION_LABELS, FASHION_TEST, FASHION_TEST_LABELS (all four: other inputs in
# place of the dataset, as tests/mpi/test_fashion_full.c runs the pipeline on toy data).
# Prints the accuracy per depth, the chosen depth, time per stage, memory per rank, CG iterations
# and residuals, beside the 10 000-image result of make fashion (87.47 %, relu, depth-selected).
set -eu
BIN=${1:-build/bin}
OUT=${2:-build/fashion-full}
N_TRAIN=${FASHION_N_TRAIN:-60000}
N_TEST=${FASHION_N_TEST:-10000}
DEPTHS=${FASHION_DEPTHS:-1-4}
RANKS=${FASHION_RANKS:-2}
VAR_N=${FASHION_VAR_N:-0}
SELECT_N=${FASHION_SELECT_N:-4000}
NOISE_FITS=${FASHION_NOISE_FITS:-0}
CG_TOL=${FASHION_CG_TOL:-1e-6}
PROBES=${FASHION_PROBES:-10}
PRECOND_RANK=${FASHION_PRECOND_RANK:-1000}
if [ "$VAR_N" -gt 0 ]; then VAR="--var-n=$VAR_N"; else VAR=--no-var; fi
MPIRUN=${TPK_MPIRUN:-mpirun -np $RANKS --allow-run-as-root --oversubscribe}

if [ -n "${FASHION_TRAIN:-}" ]; then
    TRX=$FASHION_TRAIN; TRY=${FASHION_LABELS:?}; TEX=${FASHION_TEST:?}; TEY=${FASHION_TEST_LABELS:?}
else
    FASHION_WHO=fashion-full
    . "$(dirname "$0")/fashion-data.sh"
fi
[ -x "$BIN/gpregress-mpi" ] || { echo "fashion-full: $BIN/gpregress-mpi missing (make mpi)" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "fashion-full: /usr/bin/time missing (apt-get install time)" >&2; exit 1; }
mkdir -p "$OUT"
rm -f "$OUT/rss.txt" # appended to by each rank
echo "== Fashion-MNIST, $N_TRAIN train / $N_TEST test images, $RANKS MPI ranks: NNGP (MLP, relu," \
     "sigma_w2=2, sigma_b2=0.01), depths $DEPTHS, CG with pivoted Cholesky, float32 kernel;" \
     "noise by the LML of $SELECT_N training images, depth by the full training LML (SLQ)"
start=$(date +%s)
# /usr/bin/time wraps each rank, so its maximum RSS is that rank's (mpirun's own is not counted)
# shellcheck disable=SC2086
$MPIRUN /usr/bin/time -f "rank max RSS %M KB" -a -o "$OUT/rss.txt" \
    "$BIN/gpregress-mpi" --arch=mlp --phi=relu --sigma-w2=2 --sigma-b2=0.01 --depth="$DEPTHS" \
    --train="$TRX" --labels="$TRY" --test="$TEX" --test-labels="$TEY" --n-train="$N_TRAIN" \
    --n-test="$N_TEST" --center --unit-norm --classify $VAR --select-n="$SELECT_N" \
    --noise-fits="$NOISE_FITS" --solver=cg --cg-tol="$CG_TOL" --slq-probes="$PROBES" \
    --precond-rank="$PRECOND_RANK" \
    --dtype=float32 --progress --output="$OUT/relu.h5" > "$OUT/relu.log" 2> "$OUT/relu.err" || {
    rc=$?; cat "$OUT/relu.log"; grep -v -e '^-*$' -e '^ *$' "$OUT/relu.err" | head -n 5 >&2
    echo "fashion-full: gpregress-mpi failed (exit $rc); its messages: $OUT/relu.err" >&2
    exit $rc; }
cat "$OUT/relu.log"
end=$(date +%s)
echo
echo "== summary"
grep -E "^ *depth|chosen|stages" "$OUT/relu.log" | head -n 40 || true
echo "memory per rank: $(sed 's/rank max RSS //' "$OUT/rss.txt" | tr '\n' ' ')"
echo "10 000-image subset (make fashion, relu, serial Cholesky): 0.8747"
echo "results: $OUT/relu.h5 (accuracy, nll, noise, scale, lml, cg_iterations, cg_residual per depth)"
echo "time: $((end - start)) s"
