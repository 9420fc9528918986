/* NETSOR front end, the driver: file or string → lex → parse → check → elaborate → tpk_program
 * (the top of the pipeline, as Lua's ldo.c: it calls every pass, and no pass calls it). */
#include "netsor-impl.h"
#include "tpk/alloc.h"
#include "backend-impl.h"
#include "ir-impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define NSR_MAX_SOURCE (16u << 20) /* refuse program files above 16 MiB */

/* Both forms (issue 14): the rolled one — family instructions — always, the unrolled one
 * unless it would be large. The rolled form stays when its evaluator takes the program (a
 * data-independent plan); a program with neither a small unrolled form nor a supported rolled
 * one is refused with the rolled evaluator's reason. */
static tpk_program *elaborate(nsr_state *S, nsr_ast *ast, nsr_check *C)
{
    const tpk_netsor_opts *o = S->opts;
    FILE *diag = o && o->explain ? o->diag : NULL;
    int nrolled = nsr_roll_mark(C, ast);
    nsr_rolled *R = tpk_calloc(S->ctx, 1, sizeof *R);
    tpk_program *pr = tpk_calloc(S->ctx, 1, sizeof *pr);
    if (R != NULL)
        R->al = tpk_ctx_allocator(S->ctx);
    if (pr != NULL)
        pr->alloc = tpk_ctx_allocator(S->ctx);
    if (R == NULL || pr == NULL || (R->file = tpk_strdup(S->ctx, S->file)) == NULL ||
        (pr->path = tpk_strdup(S->ctx, S->file)) == NULL) {
        nsr_rolled_free(R);
        tpk_program_free(pr);
        nsr_oom(S);
        return NULL;
    }
    R->arena = S->arena;
    R->C = *C;
    int st = nsr_elaborate_rolled(S, ast, C, pr, R);
    long estimate = 0;
    for (int k = 0; k < R->nfi; k++)
        estimate = estimate + R->fi[k].estimate > 4000000000000L ? 4000000000000L
                                                                 : estimate + R->fi[k].estimate;
    int keep = st == TPK_OK;
    if (st && S->ctx->status == TPK_EINVAL && R->nfi >= NSR_MAX_FAMILY_INSTR) {
        tpk_ctx_clear(S->ctx); /* too many sequential steps for the rolled form: unrolled only */
        S->failed = 0;
        estimate = 0;
    } else if (st) {
        R->arena = NULL;
        nsr_rolled_free(R);
        tpk_program_free(pr);
        return NULL;
    }
    tpk_program *p = NULL;
    /* a caller that evaluates no limit (no_limit) needs no unrolled form beside the rolled one */
    int unrolled = !keep || (estimate <= NSR_UNROLL_ESTIMATE && !(o && o->no_limit));
    if (unrolled) {
        S->too_large = 0;
        p = nsr_elaborate(S, ast, C);
        if (p == NULL && keep && S->too_large && S->ctx->status == TPK_EINVAL) {
            /* the estimate fell short (a deep CNN on 28×28 images: every tap a statement), the
             * unrolled form does not fit: the rolled one alone is kept, as above the estimate */
            tpk_ctx_clear(S->ctx);
            S->failed = 0;
            unrolled = 0;
        } else if (p == NULL) {
            R->arena = NULL;
            nsr_rolled_free(R);
            tpk_program_free(pr);
            return NULL;
        } else {
            tpk_program_free(pr);
            pr = NULL;
        }
    }
    if (!unrolled) {
        /* the unrolled elaborator's width rules, once per statement */
        if (nsr_roll_widths(C, R)) {
            R->arena = NULL;
            nsr_rolled_free(R);
            tpk_program_free(pr);
            return NULL;
        }
        p = pr;
        if (R->C.netsor_plus)
            p->features |= TPK_FEAT_NETSOR_PLUS;
        if (diag)
            fprintf(diag, "%s: note: the unrolled form would take about %ld steps: only the rolled "
                          "form (%d family instructions) is kept\n", S->file, estimate, R->nfi);
    }
    if (!keep) {
        R->arena = NULL;
        nsr_rolled_free(R);
        return p;
    }
    p->rolled = R;
    R->C.S = NULL;
    /* the family IR, which the back ends of the rolled form run */
    const char *vir = getenv("TPK_VERIFY_IR");
    int verify = (o && o->verify_ir) || (vir && *vir && strcmp(vir, "0") != 0);
    if (nsr_ir_lower(R, &R->ir, S->ctx) || (verify && nsr_ir_verify(R, R->ir, S->ctx))) {
        p->rolled = NULL;
        R->arena = NULL;
        nsr_rolled_free(R);
        tpk_program_free(p);
        return NULL;
    }
    int unsup = 0, deferred = 0;
    /* which limit back end: the structure the rolled evaluator cannot represent is read off the
     * IR (ir_support.c); otherwise plan now (liveness: kept for the evaluations) unless it visits
     * too many points; then the first evaluation plans it and `check` stays O(text) */
    char why[TPK_MSG_MAX];
    int refused = o && o->no_limit ? 0 : nsr_ir_limit_refusal(p, why, sizeof why, S->ctx);
    if (refused < 0) {
        p->rolled = NULL;
        R->arena = NULL;
        nsr_rolled_free(R);
        tpk_program_free(p);
        return NULL;
    }
    if (refused) {
        st = TPK_ERROR(S->ctx, TPK_EUNSUPPORTED, "%s", why);
        unsup = 1;
    } else if ((pr != NULL && o && o->plan_when_used) || (o && o->no_limit)) {
        deferred = 1; /* the caller evaluates at once: its evaluation plans */
    } else {
        st = nsr_flimit_plan(p, NSR_PLAN_BUDGET, S->ctx, &unsup, &deferred);
    }
    if (st && S->ctx->status == TPK_ENOMEM) /* out of memory is no reason to drop the rolled form */
        unsup = deferred = 0;
    if (deferred) {
        tpk_ctx_clear(S->ctx);
        st = TPK_OK;
    }
    if (st == TPK_OK && pr != NULL)
        st = nsr_flimit_outputs(p, S->ctx);
    if (st == TPK_OK) {
        if (diag)
            fprintf(diag, "%s: note: rolled: %d family instructions, %d loops kept rolled%s; the "
                    "limit evaluator uses the rolled form\n", S->file, R->nfi, nrolled,
                    deferred ? "; planned when first evaluated" : "");
        return p;
    }
    if ((!unsup && p->ninstr == 0) || S->ctx->status == TPK_ENOMEM) {
        /* an error of the program, not of the evaluator (or no memory) */
        p->rolled = NULL;
        R->arena = NULL;
        nsr_rolled_free(R);
        tpk_program_free(p);
        return NULL;
    }
    /* the limit evaluator does not take the rolled form (tied A-vars, bn, sqrt(n) logits): the
     * unrolled form serves the limit where it exists; the rolled executor runs either way */
    snprintf(R->limit_why, sizeof R->limit_why, "%s", S->ctx->msg);
    R->limit_unsup = 1;
    tpk_ctx_clear(S->ctx);
    if (pr != NULL && nsr_flimit_outputs(p, S->ctx)) {
        R->arena = NULL;
        p->rolled = NULL;
        nsr_rolled_free(R);
        tpk_program_free(p);
        return NULL;
    }
    if (diag)
        fprintf(diag, "%s: note: the limit evaluator uses the %s: %s\n", S->file,
                p->ninstr > 0 ? "unrolled form" : "rolled form, which it does not take here",
                R->limit_why);
    return p;
}

tpk_program *tpk_netsor_load_string(const char *name, const char *src, const tpk_netsor_opts *opts,
                                    const tpk_phi_registry *reg, tpk_ctx *ctx)
{
    tpk_ctx local;
    if (ctx == NULL) {
        tpk_ctx_init(&local);
        ctx = &local;
    }
    if (src == NULL) {
        TPK_ERROR(ctx, TPK_EINVAL, "tpk_netsor_load_string: no source");
        return NULL;
    }
    nsr_state S = {.file = name ? name : "<string>", .src = src, .ctx = ctx, .opts = opts, .reg = reg};
    S.arena = nsr_arena_alloc(ctx);
    if (S.arena == NULL) {
        TPK_ERROR(ctx, TPK_ENOMEM, "%s: out of memory", S.file);
        return NULL;
    }
    tpk_program *p = NULL;
    nsr_token *toks;
    int ntoks;
    nsr_ast ast = {0};
    nsr_check C;
    if (nsr_lex(&S, src, &toks, &ntoks) == TPK_OK && nsr_parse(&S, toks, ntoks, &ast) == TPK_OK &&
        nsr_check_program(&S, &ast, &C) == TPK_OK)
        p = elaborate(&S, &ast, &C);
    if (p == NULL && ctx->status == TPK_OK)
        TPK_ERROR(ctx, TPK_ETYPE, "%s: cannot elaborate the program", S.file);
    if (p == NULL || p->rolled == NULL)
        nsr_arena_free(S.arena); /* else the rolled form owns it */
    return p;
}

tpk_program *tpk_netsor_load_file(const char *path, const tpk_netsor_opts *opts,
                                  const tpk_phi_registry *reg, tpk_ctx *ctx)
{
    if (path == NULL) {
        TPK_ERROR(ctx, TPK_EINVAL, "tpk_netsor_load_file: no path");
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        TPK_ERROR(ctx, TPK_EIO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = tpk_malloc(ctx, cap);
    while (buf != NULL) {
        if (n + 1 >= cap) {
            if (cap >= NSR_MAX_SOURCE) {
                tpk_free(ctx, buf);
                fclose(f);
                TPK_ERROR(ctx, TPK_EIO, "%s: program file larger than %u bytes", path, NSR_MAX_SOURCE);
                return NULL;
            }
            char *b = tpk_realloc(ctx, buf, cap * 2);
            if (b == NULL) {
                tpk_free(ctx, buf);
                buf = NULL;
                break;
            }
            buf = b;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (buf == NULL) {
        TPK_ERROR(ctx, TPK_ENOMEM, "%s: out of memory", path);
        return NULL;
    }
    if (bad) {
        tpk_free(ctx, buf);
        TPK_ERROR(ctx, TPK_EIO, "%s: read error", path);
        return NULL;
    }
    buf[n] = '\0';
    const char *app = opts ? opts->append : NULL;
    if (app != NULL && memchr(buf, '\0', n) == NULL) {
        size_t na = strlen(app);
        char *b = tpk_realloc(ctx, buf, n + na + 2);
        if (b == NULL) {
            tpk_free(ctx, buf);
            TPK_ERROR(ctx, TPK_ENOMEM, "%s: out of memory", path);
            return NULL;
        }
        buf = b;
        buf[n] = '\n';
        memcpy(buf + n + 1, app, na + 1);
        n += na + 1;
    }
    if (memchr(buf, '\0', n) != NULL) {
        /* report the NUL byte at its position rather than silently truncating */
        int line = 1, col = 1;
        for (const char *c = buf; *c; c++) {
            if (*c == '\n') {
                line++;
                col = 1;
            } else {
                col++;
            }
        }
        tpk_free(ctx, buf);
        TPK_ERROR(ctx, TPK_ESYNTAX, "%s:%d:%d: unexpected byte 0x00", path, line, col);
        return NULL;
    }
    tpk_program *p = tpk_netsor_load_string(path, buf, opts, reg, ctx);
    tpk_free(ctx, buf);
    return p;
}
