#!/bin/sh
# make bench: every benchmark, with OpenBLAS both as the environment sets it and with its
# core-type pinning removed for that one command (tuner-notes.md: the pin costs 40-45% of GEMM).
set -eu
B=${1:-build}
echo "== benchmarks (seconds are best of 3; ratios side by side in one run) =="
for b in "$B"/bench/*; do
    [ -x "$b" ] || continue
    echo "-- $(basename "$b"), OpenBLAS as the environment sets it"
    "$b"
    echo "-- $(basename "$b"), OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE unset"
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$b" 4096 --no-naive
done
