/* Progress reports and the cancel flag of long calls (include/tpk/progress.h). */
#include "tpk/progress.h"

int tpk_progress_cancelled(const tpk_progress *p)
{
    return p != NULL && p->cancel != NULL && *p->cancel != 0;
}

int tpk_progress_check(const tpk_progress *p, tpk_ctx *ctx)
{
    return tpk_progress_cancelled(p) ? TPK_ERROR(ctx, TPK_ECANCELED, "cancelled") : TPK_OK;
}

int tpk_progress_report(const tpk_progress *p, const char *what, size_t done, size_t total,
                        tpk_ctx *ctx)
{
    if (p == NULL)
        return TPK_OK;
    if (p->fn != NULL) {
        tpk_progress_info info = {.what = what ? what : "steps",
                                  .done = done < total ? done : total, .total = total};
        p->fn(&info, p->user);
    }
    return tpk_progress_check(p, ctx);
}
