#!/bin/sh
# make limits-archs: the RMS kernel-error exponent of every shipped architecture at proper size
# (issue 5, item 5; theory.md §7.2, §7.4), one gplimits run each, summarised as a table.
# Usage: scripts/limits-archs.sh BUILD_DIR [OUT_DIR]
#   LIMITS_SEEDS (default 128)   networks per width
#   LIMITS_ONLY  (default all)   space-separated subset of the labels below
set -u
BUILD=${1:-build}
OUT=${2:-$BUILD/limits-archs}
SEEDS=${LIMITS_SEEDS:-128}
ONLY=${LIMITS_ONLY:-}
BIN=$BUILD/bin/gplimits
mkdir -p "$OUT"

# label | widths | gplimits arguments (each run: all inputs of the bundled demo set up to 8,
# the default fitting-window rule, 1000 bootstrap replicates)
CONFIGS='mlp-depth4|64..4096|--arch=mlp --depth=4
mlp-erf-depth3|64..4096|--arch=mlp --depth=3 --phi=erf
rnn|64..4096|--arch=rnn
transformer|32..2048|--arch=transformer
batchnorm|64..4096|--arch=batchnorm
gru|64..2048|--program=programs/gru.nsr --input=data/demo-sequences.npy --max-inputs=4'

printf '%-15s %-9s %5s %8s %18s  %-28s %-9s %7s\n' architecture widths seeds exponent "95% CI" \
    "two-term fit (all widths)" "fit from" "time/s"
status=0
list=$OUT/.configs
echo "$CONFIGS" >"$list"
while IFS='|' read -r label widths args; do
    if [ -n "$ONLY" ] && ! echo " $ONLY " | grep -q " $label "; then continue; fi
    log=$OUT/$label.txt
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086  # args are words
    if ! $BIN $args --widths="$widths" --seeds="$SEEDS" --no-progress \
            --output="$OUT/$label.h5" >"$log" 2>&1; then
        printf '%-15s FAILED (see %s)\n' "$label" "$log"
        status=1
        continue
    fi
    t1=$(date +%s.%N)
    awk -v label="$label" -v widths="$widths" -v seeds="$SEEDS" -v t0="$t0" -v t1="$t1" '
        /^RMS kernel error/ { gsub(/[\[\],]/, " "); for (i = 1; i <= NF; i++) if ($i == "exponent") { s = $(i+1); lo = $(i+4); hi = $(i+5) } }
        /^fit window n >= / { from = $5; sub(/:$/, "", from); c1 = $9; c2 = $12
                              res = ($0 ~ /not resolved/) ? "c2 n.s." : "c2 resolved"
                              if ($0 ~ /NOT MET/) res = "CAPPED" }
        END { inside = (lo + 0 < -0.5 && -0.5 < hi + 0) ? "" : "  (-1/2 outside)"
              printf "%-15s %-9s %5s %8.3f  [%6.3f, %6.3f]  %7.3f n^-1/2 %+7.3f n^-1 %-12s %-9s %7.1f%s\n",
                     label, widths, seeds, s, lo, hi, c1, c2, res, "n>=" from, t1 - t0, inside }' "$log"
done <"$list"
rm -f "$list"
exit $status
