#!/bin/bash
# make bench-shared: the MLP kernel of 500 × 30 inputs by gpkernel and by tpk.kernel, quiet and
# beside other work on the same cores (issue 39 item 1, docs/architecture.md "Threads on a shared
# machine"): two plain busy loops, and another OpenMP program computing a large kernel in a loop,
# each started in a session of its own (setsid: the scheduler's autogroups, as another terminal
# or job would be). Medians of 7 runs. Usage: shared-machine.sh BINDIR [PYTHON] [BG_BINDIR]
# (BG_BINDIR: the gpkernel looping beside, default BINDIR). Prints ratios to the quiet times.
set -u
B=$1; PY=${2:-}; BG=${3:-$1}
T=$(mktemp -d); trap 'pkill -f "tpk-shared-bench" 2>/dev/null; rm -rf "$T"' EXIT
awk 'BEGIN{srand(1); for(i=0;i<500;i++){s=""; for(j=0;j<30;j++) s=s (j?",":"") (rand()*2-1); print s}}' > "$T/x.csv"
awk 'BEGIN{srand(2); for(i=0;i<3000;i++){s=""; for(j=0;j<30;j++) s=s (j?",":"") (rand()*2-1); print s}}' > "$T/big.csv"
med() { local a=(); for i in 1 2 3 4 5 6 7; do s=$(date +%s%N); "$@" >/dev/null 2>&1 || { echo "failed: $*" >&2; return 1; }; e=$(date +%s%N); a+=($(( (e - s) / 10000 ))); done
        printf '%s\n' "${a[@]}" | sort -n | sed -n 4p | awk '{printf "%.2f", $1/100}'; }
gk() { med "$B/gpkernel" --arch=mlp --input="$T/x.csv" --output="$T/k.h5" --force; }
py() { [ -n "$PY" ] || { echo "-"; return; }
       "$PY" -c "
import time, numpy as np, tpk
X = np.loadtxt('$T/x.csv', delimiter=',')
t = []
for i in range(7):
    s = time.perf_counter(); tpk.kernel('mlp', X); t.append(time.perf_counter() - s)
t.sort(); print('%.2f' % (1000 * t[3]))"; }
row() { printf '%-44s gpkernel %8s ms   tpk.kernel %8s ms\n' "$1" "$2" "$3"; }
q_gk=$(gk); q_py=$(py); row "quiet" "$q_gk" "$q_py"
for load in loops kernel; do
    if [ $load = loops ]; then
        setsid bash -c 'exec -a tpk-shared-bench bash -c "while :; do :; done"' &
        setsid bash -c 'exec -a tpk-shared-bench bash -c "while :; do :; done"' &
        what="beside two busy loops"
    else
        setsid bash -c "exec -a tpk-shared-bench bash -c 'while :; do \"$BG/gpkernel\" --arch=mlp --input=\"$T/big.csv\" --output=\"$T/big.h5\" --force >/dev/null 2>&1; done'" &
        what="beside a looping gpkernel of 3000 inputs"
    fi
    sleep 2
    l_gk=$(gk); l_py=$(py)
    pkill -f tpk-shared-bench; sleep 1; pkill -f "$T/big.csv" 2>/dev/null; sleep 1
    row "$what" "$l_gk" "$l_py"
    awk -v a="$l_gk" -v b="$q_gk" -v c="$l_py" -v d="$q_py" 'BEGIN{printf "%-44s gpkernel %7.2fx      tpk.kernel %7s\n", "  ratio to quiet", a/b, (d=="-"?"-":sprintf("%.2fx", c/d))}'
done
