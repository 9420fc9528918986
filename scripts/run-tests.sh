#!/bin/sh
# Run every test binary; add up cmocka's per-binary counts into one closing line.
passed=0; failed=0; broken=""
for t in "$@"; do
    name=$(basename "$t")
    out=$("$t" 2>&1); rc=$?
    printf '%s\n' "$out"
    p=$(printf '%s\n' "$out" | sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' | tail -n 1)
    f=$(printf '%s\n' "$out" | sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' | tail -n 1)
    p=${p:-0}; f=${f:-0}
    if [ "$rc" != 0 ] && [ "$f" = 0 ]; then f=1; broken="$broken $name"; fi
    passed=$((passed + p)); failed=$((failed + f))
done
[ -n "$broken" ] && echo "crashed or exited non-zero without a cmocka summary:$broken"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
