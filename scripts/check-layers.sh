#!/bin/sh
# Layering check (mk/layers.txt): no #include, and with OBJDIR no call, runs upward or sideways
# across the layers; no two files of one folder depend on each other in a cycle.
#   scripts/check-layers.sh [ROOT [OBJDIR]]     ROOT: the source tree (.); OBJDIR: build/obj
# Prints one line per violation (path:line for includes) and exits 1 if there is any.
set -u
root=${1:-.}
obj=${2:-}
spec=$root/mk/layers.txt
[ -r "$spec" ] || { echo "check-layers: cannot read $spec" >&2; exit 2; }

# The layer of each folder and the public headers it owns, as awk assignments.
folders=$(awk '!/^#/ && NF { sub(/:.*/, ""); print }' "$spec")

# ---- includes ----------------------------------------------------------------------------------
files=""
for f in $folders; do
    for s in "$root/$f"/*.c "$root/$f"/*.h "$root/$f"/*.cu; do [ -f "$s" ] && files="$files $s"; done
done
for s in "$root"/include/tpk/*.h; do [ -f "$s" ] && files="$files $s"; done

LAYERS_AWK='
function parse(line,   a, u, o, i, n, f, name) {
    if (line ~ /^#/ || line !~ /[^ \t]/) return
    split(line, a, /\|/); split(a[1], u, /:/)
    n = split(u[1], f, " "); if (n < 1) { print spec ": bad line: " line; bad = 1; return }
    name = f[1]; for (i = 1; i <= n; i++) { folder[f[i]] = 1; layer[f[i]] = name }
    n = split(u[2], f, " "); for (i = 1; i <= n; i++) uses[name "," f[i]] = 1
    n = split(a[2], o, " "); for (i = 1; i <= n; i++) owner[o[i]] = name
}
# Folders of one layer may use each other (runtime/ and its generated half gen/).
function allowed(from, to) { return layer[from] == layer[to] || ((layer[from] "," layer[to]) in uses) }
BEGIN { while ((getline line < spec) > 0) parse(line) }
'

# shellcheck disable=SC2086
inc=$(awk -v spec="$spec" -v root="$root" "$LAYERS_AWK"'
FNR == 1 {
    rel = substr(FILENAME, length(root) + 2)
    if (rel ~ /^include\/tpk\//) {
        h = rel; sub(/^include\/tpk\//, "", h); sub(/\.h$/, "", h)
        if (!(h in owner)) { print rel ": public header owned by no layer in mk/layers.txt"; bad = 1 }
        here = owner[h]; pub = 1
    } else { here = rel; sub(/\/.*/, "", here); pub = 0 }
}
/^[ \t]*#[ \t]*include[ \t]*"/ {
    t = $0; sub(/^[^"]*"/, "", t); sub(/".*/, "", t)
    to = ""
    if (t ~ /^tpk\/[^\/]*\.h$/ || (pub && t ~ /^[^\/]*\.h$/)) {
        h = t; sub(/^tpk\//, "", h); sub(/\.h$/, "", h)
        if (!(h in owner)) { print rel ":" FNR ": includes " t ", owned by no layer"; bad = 1; next }
        to = owner[h]
    } else if (t ~ /\//) {
        to = t; sub(/^(\.\.\/)+/, "", to); sub(/\/.*/, "", to)
        if (!(to in folder)) next
    } else next
    if (!allowed(here, to)) {
        print rel ":" FNR ": " here " includes " t " (" to "): not below it in mk/layers.txt"; bad = 1
    }
}
END { exit bad }' $files)
st=$?
[ -n "$inc" ] && printf '%s\n' "$inc"

# ---- calls (undefined symbols) and file cycles --------------------------------------------------
if [ -n "$obj" ]; then
    objs=""
    for f in $folders; do
        # Only objects of sources that still exist (a build tree may hold stale ones).
        for o in "$obj/$f"/*.o; do
            b=$(basename "$o" .o)
            [ -f "$o" ] && { [ -f "$root/$f/$b.c" ] || [ -f "$root/$f/$b.cu" ]; } && objs="$objs $o"
        done
    done
    if [ -n "$objs" ]; then
        # shellcheck disable=SC2086
        calls=$(nm -A -P -g $objs 2>/dev/null | awk -v spec="$spec" -v obj="$obj" "$LAYERS_AWK"'
{
    file = $1; sub(/:$/, "", file); rel = substr(file, length(obj) + 2)
    dir = rel; sub(/\/.*/, "", dir)
    if ($3 == "U") { nu++; ufile[nu] = rel; udir[nu] = dir; usym[nu] = $2 }
    else if ($3 ~ /^[A-TV-Z]$/) { defdir[$2] = dir; deffile[$2] = rel }
}
END {
    for (i = 1; i <= nu; i++) {
        s = usym[i]; if (!(s in defdir)) continue
        if (!allowed(udir[i], defdir[s])) {
            key = ufile[i] " " s
            if (!(key in seen)) print ufile[i] ": calls " s " of " deffile[s] ": not below " udir[i] " in mk/layers.txt"
            seen[key] = 1; bad = 1
        } else if (udir[i] == defdir[s] && ufile[i] != deffile[s])
            edge[udir[i] " " ufile[i] " " deffile[s]] = 1
    }
    for (e in edge) print "EDGE " e
    exit bad
}')
        cst=$?
        printf '%s\n' "$calls" | grep -v '^EDGE ' | grep . && st=1
        [ "$cst" = 0 ] || st=1
        for f in $folders; do
            loop=$(printf '%s\n' "$calls" | awk -v f="$f" '$1 == "EDGE" && $2 == f { print $3, $4 }' |
                   tsort 2>&1 >/dev/null | sed -n 's/^tsort: //p' | grep -v 'input contains a loop')
            if [ -n "$loop" ]; then
                echo "$obj/$f: files that call each other in a cycle:" $loop
                st=1
            fi
        done
    fi
fi
exit $st
