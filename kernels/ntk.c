/* The NTK's parameterisations (include/tpk/ntk.h): their names and the one check of a choice,
 * for every solver that computes an NTK (the interpreter, the CNN and transformer recursions). */
#include "tpk/ntk.h"

int tpk_ntk_param_check(const char *who, int param, double width, tpk_ctx *ctx)
{
    if (param != TPK_NTK_PARAM_NTK && param != TPK_NTK_PARAM_TP && param != TPK_NTK_PARAM_STANDARD)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: parameterisation %d is none of TPK_NTK_PARAM_NTK, "
                         "_TP, _STANDARD", who, param);
    /* 'standard' trains the weights' own entries, so its NTK grows with the fan-ins (theory.md
     * §8.7): it has no width-free limit */
    if (param == TPK_NTK_PARAM_STANDARD && !(width >= 1))
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: the 'standard' parameterisation's NTK depends on "
                         "the finite width: give it (ntk_width, --ntk-width=N)", who);
    return TPK_OK;
}

const char *tpk_ntk_param_name(int param)
{
    return param == TPK_NTK_PARAM_NTK ? "ntk" : param == TPK_NTK_PARAM_TP ? "tp"
           : param == TPK_NTK_PARAM_STANDARD ? "standard" : "?";
}
