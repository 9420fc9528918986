/* The choice of form for a program's limit kernel and its finite-width run: the rolled back end
 * first, the unrolled one where the rolled refuses the program (docs/netsor.md "Rolled
 * programs"). One decision for the limit evaluator (limit.c) and the executor (exec.c). */
#include "backend-impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int nsr_form_unrolled_env(void)
{
    const char *form = getenv("TPK_NETSOR_FORM");
    return form != NULL && strcmp(form, "unrolled") == 0;
}

int nsr_form_rolled_first(const tpk_program *p, int has_rolled, int force_unrolled,
                          const char *who, nsr_rolled_run run, void *arg, int *st, tpk_ctx *ctx)
{
    if (!has_rolled || force_unrolled)
        return 0;
    /* a fresh context: the rolled back end stops at a recorded error, and the caller's may
     * hold an earlier, handled one */
    tpk_ctx local;
    tpk_ctx_init_from(&local, ctx);
    int unsup = 0;
    *st = run(arg, &unsup, &local);
    if (*st == TPK_OK || !unsup || p->ninstr == 0) {
        if (*st && ctx)
            *ctx = local;
        return 1;
    }
    const char *tr = getenv("TPK_NETSOR_TRACE");
    if (tr != NULL && strcmp(tr, "1") == 0) /* why the slower form runs */
        fprintf(stderr, "  %s: %s; the unrolled one runs\n", who, local.msg);
    return 0;
}
