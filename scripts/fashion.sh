#!/bin/sh
# make fashion: NNGP regression on Fashion-MNIST (issue 7). Usage: fashion.sh GPREGRESS OUTDIR
# Split: the first N_TRAIN training and first N_TEST test images (IDX, gzip) of Debian's
# dataset-fashion-mnist; pixels /255 (implied: --center --unit-norm are scale-free), centred by the
# training mean, each image scaled to unit norm; one-hot regression, accuracy by argmax.
# Noise and output scale by the training log marginal likelihood only (gpregress --noise=auto:
# subsample eigendecomposition, then a walk of full-size factorisations); RBF length scale by BFGS
# on the LML of a 2000-image training subsample. Test labels are used for scoring only.
set -eu
GPR=${1:-build/bin/gpregress}
OUT=${2:-build/fashion}
N_TRAIN=${FASHION_N_TRAIN:-10000}
N_TEST=${FASHION_N_TEST:-10000}
DEPTHS=${FASHION_DEPTHS:-1-8}
VAR_N=${FASHION_VAR_N:-2000}
FASHION_WHO=fashion
. "$(dirname "$0")/fashion-data.sh"
mkdir -p "$OUT"
COMMON="--train=$TRX --labels=$TRY --test=$TEX --test-labels=$TEY --n-train=$N_TRAIN
        --n-test=$N_TEST --center --unit-norm --classify --var-n=$VAR_N"
start=$(date +%s)
echo "== Fashion-MNIST, first $N_TRAIN train / $N_TEST test images: GP regression on one-hot labels"
# shellcheck disable=SC2086
for phi in relu erf; do
    echo "-- NNGP, MLP, phi=$phi, sigma_w2=2, sigma_b2=0.01, depths $DEPTHS"
    "$GPR" --arch=mlp --phi=$phi --sigma-w2=2 --sigma-b2=0.01 --depth="$DEPTHS" $COMMON \
        --output="$OUT/$phi.h5" | tee "$OUT/$phi.log"
done
echo "-- RBF kernel, length scale by the LML (BFGS on 2000 training images), noise as above"
# shellcheck disable=SC2086
"$GPR" --arch=rbf --fit-hyper --lengthscale2=1 --amplitude=1 $COMMON --output="$OUT/rbf.h5" |
    tee "$OUT/rbf.log"
end=$(date +%s)

acc() { awk -v d="$2" '$1 == "depth" && $2 == d { for (i = 1; i < NF; i++) if ($i == "accuracy") print $(i + 1) }' "$1"; }
nll() { awk -v d="$2" '$1 == "depth" && $2 == d { for (i = 1; i < NF; i++) if ($i == "nll") print $(i + 1) }' "$1"; }
echo
echo "== test accuracy (NLL per test image, first $VAR_N test images), noise by training LML"
printf '%-6s %-20s %-20s\n' depth "relu acc (nll)" "erf acc (nll)"
lo=${DEPTHS%-*}; hi=${DEPTHS#*-}
d=$lo
while [ "$d" -le "$hi" ]; do
    printf '%-6s %-20s %-20s\n' "$d" "$(acc "$OUT/relu.log" "$d") ($(nll "$OUT/relu.log" "$d"))" \
        "$(acc "$OUT/erf.log" "$d") ($(nll "$OUT/erf.log" "$d"))"
    d=$((d + 1))
done
rbf=$(awk '$1 == "kernel" { for (i = 1; i < NF; i++) if ($i == "accuracy") print $(i + 1) }' "$OUT/rbf.log")
echo "RBF-kernel GP, same split and selection:        $rbf"
echo "published: RBF SVM (SVC C=10) on all 60 000:   0.897  (Zalando's Fashion-MNIST benchmark)"
echo "results: $OUT/relu.h5 $OUT/erf.h5 $OUT/rbf.h5 (accuracy, nll, noise, scale, lml per depth)"
echo "time: $((end - start)) s"
