#!/bin/sh
# Device check of the generated CUDA GEMM kernels (issue 6, item 7), for a machine with an H200:
# build gen/cuda-check (defaults + seeded random configurations of the cuda_gemm template, f64 and
# f32) with nvcc for sm_90, check every kernel against cuBLAS on square and n×n·n×64 shapes
# (relative Frobenius error < 1e-12 f64, < 1e-5 f32), time both (median of 10, L2 flushed), and
# print each kernel's speed as a fraction of cuBLAS. One run, at most 8 minutes.
# Needs only nvcc and cuBLAS (no other package). Output in $OUT (default build/device-check):
#   results.txt      one TPKRESULT line per (kernel, shape): err ours cublas rel_err name M N K
#   cuda-sm_90.jsonl the same as tuning-log records (copy into data/tuning/ to ship them)
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/build/device-check}
NVCC=${NVCC:-$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)}
BUNDLE=$ROOT/gen/cuda-check
LIMIT=${LIMIT:-480}
START=$(date +%s)
mkdir -p "$OUT"
rm -f "$OUT"/*.o "$OUT"/check "$OUT"/results.txt "$OUT"/cuda-sm_90.jsonl

echo "== device"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader 2>/dev/null || echo "(no nvidia-smi)"
"$NVCC" --version | tail -n 1

echo "== build ($(ls "$BUNDLE"/k*.cu | wc -l) kernels, in parallel)"
pids=""
for f in "$BUNDLE"/k*.cu; do
    "$NVCC" -O3 -std=c++17 -arch=sm_90 -c "$f" -o "$OUT/$(basename "$f" .cu).o" &
    pids="$pids $!"
done
fail=0
for p in $pids; do wait "$p" || fail=1; done
[ "$fail" = 0 ] || { echo "device-check: a kernel did not compile"; exit 1; }
"$NVCC" -O3 -std=c++17 -arch=sm_90 -o "$OUT/check" "$BUNDLE/harness.cu" "$OUT"/k*.o -lcublas
echo "built in $(( $(date +%s) - START )) s"

echo "== check against cuBLAS and time"
LEFT=$(( LIMIT - ($(date +%s) - START) - 15 ))
[ "$LEFT" -gt 30 ] || { echo "device-check: no time left to run"; exit 1; }
rc=0
timeout "$LEFT" "$OUT/check" > "$OUT/results.txt" || rc=$?
[ "$rc" = 0 ] || echo "device-check: harness exited with $rc (124 = time limit); partial results follow"

echo "== results (GFLOP/s; fraction of cuBLAS; err 0 = matches cuBLAS within tolerance)"
awk '$1 == "TPKRESULT" {
        printf "%-48s %6d %6d %6d  err %d  rel %9.2e  ours %9.1f  cublas %9.1f  %5.2f\n",
               $6, $7, $8, $9, $2, $5, $3, $4, ($4 > 0 ? $3 / $4 : 0)
     }' "$OUT/results.txt"
echo "== best per (dtype, shape)"
awk '$1 == "TPKRESULT" && $2 == 0 {
        dt = ($6 ~ /_dgemm_/) ? "f64" : "f32"; key = dt " " $7 "x" $8 "x" $9
        if (!(key in best) || $3 > best[key]) { best[key] = $3; who[key] = $6; ref[key] = $4 }
     }
     $1 == "TPKRESULT" && $2 != 0 { bad++ }
     END {
        for (k in best) printf "%-22s best %9.1f GFLOP/s = %.2f x cuBLAS (%9.1f)  %s\n", k, best[k], best[k] / ref[k], ref[k], who[k]
        printf "failed or wrong: %d\n", bad + 0
     }' "$OUT/results.txt" | sort

# Tuning-log records (tuner/log.c format); knobs decoded from the kernel names
# tpk_cuda_<d|s>gemm_<bm>x<bn>x<bk>_t<tm>x<tn>_s<stages>_v<vec>_p<pad>_k<splitk>.
awk -v ts="$(date +%s)" '$1 == "TPKRESULT" {
        split($6, p, "_"); split(p[4], b, "x"); split(substr(p[5], 2), t, "x")
        dt = (p[3] == "dgemm") ? "f64" : "f32"
        cost = ($3 > 0) ? 2.0 * $7 * $8 * $9 / ($3 * 1e9) : 0
        printf "{\"v\":1,\"target\":\"cuda/sm_90\",\"template\":\"cuda_gemm\",\"task\":{\"op\":\"gemm\",\"dtype\":\"%s\",\"m\":%d,\"n\":%d,\"k\":%d,\"threads\":1},", dt, $7, $8, $9
        printf "\"knobs\":{\"bm\":%d,\"bn\":%d,\"bk\":%d,\"tm\":%d,\"tn\":%d,\"stages\":%d,\"vec\":%d,\"pad\":%d,\"splitk\":%d},", b[1], b[2], b[3], t[1], t[2], substr(p[6], 2), substr(p[7], 2), substr(p[8], 2), substr(p[9], 2)
        printf "\"result\":{\"err\":%d,\"gflops\":%.3f,\"costs_s\":[%.6e],\"compile_s\":0,\"cpu_ratio\":1,\"redone\":0,\"load1\":0,\"max_rel_err\":%s,\"vendor_gflops\":%.3f,\"ts\":%s}}\n", $2, ($2 == 0 ? $3 : 0), cost, $5, $4, ts
     }' "$OUT/results.txt" > "$OUT/cuda-sm_90.jsonl"
echo "records: $OUT/cuda-sm_90.jsonl ($(wc -l < "$OUT/cuda-sm_90.jsonl") lines); total $(( $(date +%s) - START )) s"
exit "$rc"
