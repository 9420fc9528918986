# bash completion for the tpk tools (gpkernel, netsor, gplimits, gpregress, gpattention, tptune),
# installed by `make install` as BASHCOMPDIR/TOOL. Options come from the tool's own --help, so they
# are always those of the installed version; --arch and --phi complete their names (gpkernel
# --list-archs, --list-phi), netsor and tptune their commands, everything else file names.
# Source it to try: . scripts/tpk-completion.bash

_tpk_complete() {
    local tool=$1 line=${COMP_LINE:0:$COMP_POINT}
    local cur=${line##*[[:space:]]} words opt value prefix=""
    # "--opt=VAL": bash splits at '=' (COMP_WORDBREAKS), so the reply is the value part alone
    if [[ $cur == --*=* ]]; then
        opt=${cur%%=*}
        value=${cur#*=}
        [[ $COMP_WORDBREAKS == *=* ]] || prefix="$opt="
        case $opt in
        --arch) words=$("$tool" --list-archs 2>/dev/null | awk '/^[a-z]/ {print $1}') ;;
        --phi) words=$("$tool" --list-phi 2>/dev/null | awk '/^[a-z]/ {print $1}') ;;
        *) words="" ;;
        esac
        if [ -n "$words" ]; then
            COMPREPLY=($(compgen -P "$prefix" -W "$words" -- "$value"))
        else
            compopt -o filenames 2>/dev/null
            COMPREPLY=($(compgen -P "$prefix" -f -- "$value"))
        fi
        return 0
    fi
    if [[ $cur == -* ]]; then
        words=$("$tool" --help 2>/dev/null | grep -oE -- '--[a-z][a-z0-9-]*' | sort -u)
        COMPREPLY=($(compgen -W "$words" -- "$cur"))
        return 0
    fi
    if [ "$COMP_CWORD" -eq 1 ]; then
        case ${tool##*/} in
        netsor) COMPREPLY=($(compgen -W "check dump kernel run plan" -- "$cur")); return 0 ;;
        tptune)
            COMPREPLY=($(compgen -W "gemm syrk map gen show measure emit replay port verify cuda-check" \
                -- "$cur"))
            return 0 ;;
        esac
    fi
    compopt -o filenames 2>/dev/null
    COMPREPLY=($(compgen -f -- "$cur"))
}

_tpk() { _tpk_complete "$1"; }
complete -F _tpk gpkernel netsor gplimits gpregress gpattention tptune
