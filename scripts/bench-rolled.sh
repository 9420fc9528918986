#!/bin/sh
# Issue 14 acceptance, side by side in one run (bench/rolled/bench_rolled.py; `make bench-rolled`).
# Usage: bench-rolled.sh BUILD [--toy] [--strict]
#   (a) transformer 2 × 1000 tokens, d = 12, depth 2, --all-times: gpkernel vs numpy
#       (bench/rolled/transformer_ref.py): max abs difference and time ratio (bar 1e-9, <= 1/5)
#   (b) cnn2d GAP, 8 images 28×28×1 depth 8 and 32×32×3 depth 10: gpkernel vs neural-tangents'
#       second (compiled) call (bench/rolled/cnn_ref.py; bar 1e-10, >= 5×)
#   (c) netsor check programs/transformer.nsr --set T=2000 --set L=24: wall time and max RSS,
#       and at T = 20 (bar < 1 s, < 200 MB, within 3× of T = 20)
#   (d) netsor run of the transformer of (a) at n = 1024 (the rolled executor): wall time, RSS
#       and its relative error against (a)'s limit kernel
# One summary line per item with PASS/FAIL; a size the toolkit refuses prints "refused: <message>"
# and the run goes on. --toy: every item at tiny sizes (about 10 s), exit 1 if an agreement is off;
# --strict: exit 1 unless every bar is met. Inputs: fixed seeds, BUILD/rolled/*.npy.
# Python: BUILD/venv-nt (bench/rolled/requirements.txt, pinned: neural-tangents 0.6.5, jax 0.4.26,
# numpy < 2; made by `make bench-rolled` through scripts/python-venv.sh). Full size: about 2-3 min
# of 2 cores, up to a few GB of memory (neural-tangents at 32×32×3).
set -eu
B=${1:?usage: bench-rolled.sh BUILD [--toy] [--strict]}
shift
PY="$B/venv-nt/bin/python"
if ! [ -x "$PY" ]; then
    echo "bench-rolled: $PY missing: make bench-rolled (or sh scripts/python-venv.sh $B/venv-nt bench/rolled/requirements.txt)" >&2
    exit 2
fi
[ -x /usr/bin/time ] || echo "bench-rolled: /usr/bin/time missing (apt-get install time): max RSS from os.wait4 (includes the forked Python, too high)" >&2
exec "$PY" "$(dirname "$0")/../bench/rolled/bench_rolled.py" --build="$B" "$@"
