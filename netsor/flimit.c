/* Infinite-width limit of a rolled NETSOR program (issue 14), the driver: the plan (a dry run
 * with N = 0, on a second thread beside the run), the statement loop with its frees at each
 * block's last use, and the kernel of the outputs. The stages are listed in flimit-impl.h. */
#include "flimit-impl.h"
#include "tpk/alloc.h"
#include "tpk/clock.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Everything a pass holds: its blocks, the pool, the workspace. */
static void fl_free(fl *F)
{
    for (int k = 0; k < F->nb; k++) {
        nsr_fl_block_data_free(F, &F->b[k]);
        nsr_trie_free(&F->b[k].tr, F->X.ctx);
    }
    tpk_free(F->X.ctx, F->b);
    tpk_free(F->X.ctx, F->avar_site);
    nsr_fam_free(&F->X);

    for (int i = 0; i < 6; i++)
        tpk_free(F->X.ctx, F->pool[i].p);
    tpk_gauss_ws_free(F->ws);
}

/* TPK_NETSOR_TRACE=1: the seconds since the last mark, on stderr, after what took them. */
static void trace_mark(fl *F, const char *fmt, ...) TPK_PRINTF(2, 3);
static void trace_mark(fl *F, const char *fmt, ...)
{
    double t = tpk_wall_seconds();
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " %.4f s\n", t - F->t_mark);
    F->t_mark = t;
}

static void trace_stmt(fl *F, int k)
{
    const nsr_stmt *s = F->X.R->fi[k].stmt;
    trace_mark(F, "  %s:%d: %s", F->X.R->file, s->line, s->name);
}

/* The blocks whose last use the plan pl puts at instruction k or before are freed (the ones it
 * keeps to the end, −1, stay). */
static void free_dead(fl *F, const int *pl, int k)
{
    for (int b = 0; b < F->nb && b < F->nplan; b++)
        if (pl[b] <= k && pl[b] >= 0 && F->b[b].last_use != INT32_MAX) {
            nsr_fl_kill_block(F, b);
            F->b[b].last_use = INT32_MAX; /* freed */
        }
}

/* The family instructions in order, each output's value kept in out[*no]; blocks freed as the
 * plan (once made) allows, and its failure taken as the result. */
static int fl_statements(fl *F, fout *out, int *no)
{
    const nsr_rolled *R = F->X.R;
    int st = TPK_OK;
    for (int k = 0; k < R->nfi && st == TPK_OK; k++) {
        if (!F->dry && (st = tpk_progress_report(F->X.progress, "family instructions", (size_t)k,
                                                 (size_t)R->nfi, F->X.ctx)))
            break;
        if (F->trace && k > 0)
            trace_stmt(F, k - 1);
        F->X.cur = k;
        memcpy(F->X.num, R->fi[k].num, ((size_t)F->X.C->nsym + 1) * sizeof *F->X.num);
        st = R->fi[k].stmt->kind == NSR_S_OUTPUT ? nsr_fl_run_output(F, &R->fi[k], &out[(*no)++])
                                                 : nsr_fl_run_def(F, &R->fi[k]);
        const int *pl = F->dry ? NULL : nsr_fl_plan_get(F, 0);
        if (st == TPK_OK)
            st = nsr_fl_plan_status(F, 0); /* the plan failed: its error is the result */
        if (st == TPK_OK && pl)
            free_dead(F, pl, k);
    }
    if (F->trace && R->nfi > 0)
        trace_stmt(F, R->nfi - 1);
    return st;
}

/* The plan made beside the run, waited for: its verdict, and the rest of the frees. */
static int fl_plan_end(fl *F)
{
    int st = nsr_fl_plan_status(F, 1);
    if (F->trace)
        trace_mark(F, "  %s: waiting for the plan", F->X.R->file);
    const int *pl = nsr_fl_plan_get(F, 0);
    if (st == TPK_OK && pl)
        free_dead(F, pl, INT32_MAX);
    return st;
}

/* The default kernel reads the last output only: out[0] becomes its last member; returns 1. */
static int keep_last_output(fl *F, fout *out, int no)
{
    for (int i = 0; i < no - 1; i++)
        nsr_fl_val_free(F, &out[i].v);
    out[0] = out[no - 1];
    nsr_fl_val_last(F, &out[0].v);
    return 1;
}

/* The one output statement the end reads where a single output is read: the last one (the
 * kernel of every output reads several); NULL otherwise. */
static const nsr_stmt *final_output(const fl *F, int no)
{
    for (int k = F->X.R->nfi - 1; k >= 0 && no == 1; k--)
        if (F->X.R->fi[k].stmt->kind == NSR_S_OUTPUT)
            return F->X.R->fi[k].stmt;
    return NULL;
}

/* Every entry of K finite: checked over the threads first; the first bad entry is named. */
static int kernel_finite(fl *F, const tpk_array *K)
{
    size_t dim = K->dims[0], nn = dim * dim;
    const double *kd = K->data;
    int finite = 1;
#pragma omp parallel for reduction(& : finite) schedule(static) if (nn >= ((size_t)1 << 18))
    for (size_t i = 0; i < nn; i++)
        finite &= isfinite(kd[i]) != 0;
    for (size_t i = 0; !finite && i < nn; i++)
        if (!isfinite(kd[i]))
            return TPK_ERROR(F->X.ctx, TPK_ENUMERIC, "limit kernel has a non-finite entry (%zu, "
                             "%zu)", i / dim, i % dim);
    return TPK_OK;
}

/* One pass over the program: the plan (F->dry: its blocks' last uses) or the numbers, the
 * kernel of the outputs into *K. plan_last: the plan made already (NULL: F->pj makes it beside
 * this run, or this is the plan). */
static int fl_run(fl *F, int all_outputs, const int *plan_last, int nplan, tpk_array **K)
{
    const nsr_rolled *R = F->X.R;
    int nout = 0;
    for (int k = 0; k < R->nfi; k++)
        nout += R->fi[k].stmt->kind == NSR_S_OUTPUT;
    if (nout == 0)
        return TPK_ERROR(F->X.ctx, TPK_ETYPE, "%s: the program has no output", R->file);
    fout *out = nsr_fam_alloc(&F->X, (size_t)nout, sizeof *out);
    if (out == NULL)
        return F->X.ctx->status;
    int no = 0;
    if (plan_last != NULL || F->pj == NULL) {
        F->plan = plan_last;
        F->nplan = nplan;
    }
    /* TPK_NETSOR_TRACE=1: seconds per family instruction (where the time goes), and which
     * strategy each MatMul and the readout took, on stderr */
    const char *tr = getenv("TPK_NETSOR_TRACE");
    F->trace = !F->dry && tr != NULL && strcmp(tr, "1") == 0;
    F->t_mark = F->trace ? tpk_wall_seconds() : 0;
    int st = fl_statements(F, out, &no);
    if (st == TPK_OK && !F->dry && F->pj != NULL)
        st = fl_plan_end(F);
    if (st == TPK_OK && !F->dry)
        st = tpk_progress_report(F->X.progress, "family instructions", (size_t)R->nfi,
                                 (size_t)R->nfi, F->X.ctx);
    F->X.cur = R->nfi; /* the outputs read their blocks at the end */
    F->nb_stmts = F->nb;
    if (st == TPK_OK && !all_outputs)
        no = keep_last_output(F, out, no);
    F->final_out = final_output(F, no);
    tpk_array *Kout = NULL;
    if (st == TPK_OK)
        st = nsr_fl_readout(F, out, no, &Kout);
    for (int i = 0; i < no; i++)
        nsr_fl_val_free(F, &out[i].v);
    tpk_free(F->X.ctx, out);
    if (st == TPK_OK && Kout)
        st = kernel_finite(F, Kout);
    if (F->trace)
        trace_mark(F, "  %s: kernel of the outputs", R->file);
    if (st) {
        tpk_array_free(Kout);
        return st;
    }
    if (K)
        *K = Kout;
    return TPK_OK;
}

/* A pass over p for N inputs x (N×T×d; N = 0: the plan, no numbers). */
static int fl_init(fl *F, const tpk_program *p, size_t N, size_t T, size_t d, const double *x,
                   tpk_ctx *ctx)
{
    memset(F, 0, sizeof *F);
    int st = nsr_fam_init(&F->X, p, ctx);
    F->X.big_hint = "one covariance block over (input × member)";
    F->p = p;
    F->N = N;
    F->T = T;
    F->d = d;
    F->x = x;
    F->dry = N == 0;
    F->ir = F->X.R ? F->X.R->ir : NULL;
    if (st == TPK_OK && F->ir == NULL)
        st = TPK_ERROR(ctx, TPK_EINVAL, "internal: %s has no family IR", F->X.R->file);
    if (st)
        return st;
    F->avar_site = nsr_fam_alloc(&F->X, (size_t)F->X.R->ndm + 1, sizeof *F->avar_site);
    if (F->avar_site == NULL)
        return ctx->status;
    for (int i = 0; i < F->X.R->ndm; i++)
        F->avar_site[i] = -1;
    return TPK_OK;
}

/* The plan of p: the same pass with no inputs (N = 0) and T slots of d dimensions, its work
 * limited to budget domain points (0: none). P is left for the caller to read and free. */
static int fl_plan(fl *P, const tpk_program *p, size_t T, size_t d, int all_outputs, long budget,
                   tpk_ctx *ctx)
{
    int st = fl_init(P, p, 0, T, d, NULL, ctx);
    P->X.work_budget = budget;
    if (st == TPK_OK)
        st = fl_run(P, all_outputs, NULL, 0, NULL);
    return st;
}

/* The plan's verdict on each block the statements made (P, a finished plan): its last use, −1
 * where it lives to the end (the outputs read it). last holds P->nb_stmts entries. */
static void fl_plan_last(const fl *P, int *last)
{
    for (int k = 0; k < P->nb_stmts; k++)
        last[k] = P->b[k].last_use >= P->X.R->nfi ? -1 : P->b[k].last_use;
}

/* fl_plan_last into a fresh array from ctx's allocator (nb_stmts + 1 entries). */
static int fl_plan_last_alloc(const fl *P, tpk_ctx *ctx, int **last)
{
    if ((*last = tpk_malloc(ctx, ((size_t)P->nb_stmts + 1) * sizeof **last)) == NULL)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    fl_plan_last(P, *last);
    return TPK_OK;
}

int nsr_flimit_plan(tpk_program *p, long budget, tpk_ctx *ctx, int *unsupported, int *deferred)
{
    fl F;
    int st = fl_plan(&F, p, (size_t)p->nslots, 0, 1, budget, ctx);
    *unsupported = F.X.unsup;
    *deferred = F.X.deferred;
    if (st == TPK_OK) {
        nsr_rolled *R = p->rolled;
        tpk_mem_free(&R->al, R->plan_last); /* no memory: each evaluation plans (no error) */
        R->plan_last = tpk_mem_malloc(&R->al, ((size_t)F.nb + 1) * sizeof *R->plan_last, NULL);
        if (R->plan_last != NULL) {
            fl_plan_last(&F, R->plan_last);
            R->nplan = F.nb_stmts;
        }
    }
    fl_free(&F);
    return st;
}

int nsr_flimit_outputs(tpk_program *p, tpk_ctx *ctx)
{
    fl F;
    int st = fl_init(&F, p, 0, (size_t)p->nslots, 0, NULL, ctx);
    F.fill = p;
    for (int k = 0; st == TPK_OK && k < F.X.R->nfi; k++) {
        const nsr_finstr *fi = &F.X.R->fi[k];
        if (fi->stmt->kind != NSR_S_OUTPUT)
            continue;
        F.X.cur = k;
        memcpy(F.X.num, fi->num, ((size_t)F.X.C->nsym + 1) * sizeof *F.X.num);
        nsr_fdom D;
        nsr_trie tr;
        memset(&tr, 0, sizeof tr);
        st = nsr_instr_domain(&F.X, fi, &D, &tr);
        nsr_trie_free(&tr, ctx);
        double var = 0, bias = 0;
        const nsr_expr *rd = fi->stmt->value;
        if (st == TPK_OK)
            st = nsr_fam_num(&F.X, rd->args[1], &var);
        if (st == TPK_OK && rd->nargs == 3)
            st = nsr_fam_num(&F.X, rd->args[2], &bias);
        if (st == TPK_OK)
            st = nsr_fl_name_outputs(&F, fi->stmt, &D, var, bias);
        tpk_free(ctx, D.val);
    }
    fl_free(&F);
    return st;
}

static void *plan_thread(void *arg)
{
    plan_job *J = arg;
    double t0 = tpk_wall_seconds();
    fl P;
    int *last = NULL;
    int st = fl_plan(&P, J->p, J->T, J->d, J->all_outputs, 0, &J->ctx);
    if (st == TPK_OK)
        st = fl_plan_last_alloc(&P, &J->ctx, &last);
    pthread_mutex_lock(&J->mu);
    J->st = st;
    J->unsup = P.X.unsup;
    J->nb = P.nb_stmts;
    J->last = last;
    J->seconds = tpk_wall_seconds() - t0;
    J->done = 1;
    pthread_cond_broadcast(&J->cv);
    pthread_mutex_unlock(&J->mu);
    fl_free(&P);
    return NULL;
}

/* Starts the plan on a second thread (1), or 0 where none starts (then J holds nothing). */
static int plan_start(plan_job *J, pthread_t *th)
{
    int threaded = 0;
    if (pthread_mutex_init(&J->mu, NULL) == 0) {
        if (pthread_cond_init(&J->cv, NULL) == 0) {
            threaded = pthread_create(th, NULL, plan_thread, J) == 0 ? 1 : 0;
            if (!threaded)
                pthread_cond_destroy(&J->cv);
        }
        if (!threaded)
            pthread_mutex_destroy(&J->mu);
    }
    return threaded;
}

/* The evaluator's options, one copy for every run: progress reports and the cancel flag, the
 * entrywise plans' kind, report, checks and cost model. */
static void fl_set_opts(fl *F, const tpk_limit_opts *opts, int plan_kind)
{
    F->X.progress = opts ? opts->progress : NULL;
    F->plan_kind = plan_kind;
    F->plan_report = opts ? opts->plan_report : NULL;
    F->plan_verify = opts ? opts->plan_verify : 0;
    F->plan_signatures = opts ? opts->plan_signatures : 0;
    F->cal.provider = opts ? opts->ew_provider : NULL;
}

/* The run beside the plan of J (started on thread th): its result stands where the plan agrees;
 * the plan's error, where it fails, is the result, as if it had run first. */
static int run_beside_plan(const tpk_program *p, const tpk_array *x, size_t N, size_t T, size_t d,
                           int all_outputs, tpk_array **K, double *err, int *unsupported,
                           const tpk_limit_opts *opts, int plan_kind, plan_job *J, pthread_t th,
                           tpk_ctx *ctx)
{
    fl F;
    tpk_ctx rc;
    tpk_ctx_init_from(&rc, ctx);
    int st = fl_init(&F, p, N, T, d, x->data, &rc);
    F.pj = J;
    fl_set_opts(&F, opts, plan_kind);
    if (st == TPK_OK)
        st = fl_run(&F, all_outputs, NULL, 0, K);
    int made = st == TPK_OK && K != NULL; /* *K is ours to free if the verdict is no */
    pthread_join(th, NULL);
    pthread_cond_destroy(&J->cv);
    pthread_mutex_destroy(&J->mu);
    const char *tr = getenv("TPK_NETSOR_TRACE");
    if (tr != NULL && strcmp(tr, "1") == 0)
        fprintf(stderr, "  %s: plan %.4f s beside the run, %d blocks\n", p->rolled->file,
                J->seconds, J->nb);
    if (J->st != TPK_OK) { /* the plan's error, as if it had run first */
        st = J->st;
        *unsupported = J->unsup;
        tpk_error_at(ctx, J->ctx.status, J->ctx.src_file, J->ctx.src_line, "%s", J->ctx.msg);
    } else {
        if (st == TPK_OK && F.nb_stmts != J->nb)
            st = TPK_ERROR(&rc, TPK_EINVAL, "internal: the plan and the run differ (%d vs "
                           "%d blocks)", J->nb, F.nb_stmts);
        if (st)
            tpk_error_at(ctx, rc.status, rc.src_file, rc.src_line, "%s", rc.msg);
        *unsupported = F.X.unsup;
    }
    if (st != TPK_OK && made) {
        tpk_array_free(*K);
        *K = NULL;
    }
    if (err)
        *err = F.err;
    tpk_free(ctx, J->last);
    fl_free(&F);
    return st;
}

/* The run with its plan made already: last[0..nb), each block's last use (consumed). */
static int run_planned(const tpk_program *p, const tpk_array *x, size_t N, size_t T, size_t d,
                       int all_outputs, tpk_array **K, double *err, int *unsupported,
                       const tpk_limit_opts *opts, int plan_kind, int *last, int nb, tpk_ctx *ctx)
{
    fl F;
    int st = fl_init(&F, p, N, T, d, x->data, ctx);
    fl_set_opts(&F, opts, plan_kind);
    if (st == TPK_OK)
        st = fl_run(&F, all_outputs, last, nb, K);
    if (st == TPK_OK && F.nb_stmts != nb)
        st = TPK_ERROR(ctx, TPK_EINVAL, "internal: the plan and the run differ (%d vs %d blocks)",
                       nb, F.nb_stmts);
    *unsupported = F.X.unsup;
    if (err)
        *err = F.err;
    tpk_free(ctx, last);
    fl_free(&F);
    return st;
}

int nsr_flimit_kernel(const tpk_program *p, const tpk_array *x, int all_outputs, tpk_array **K,
                      double *err, int *unsupported, const tpk_limit_opts *opts, tpk_ctx *ctx)
{
    *unsupported = 0;
    size_t N, T, d;
    int plan_kind = opts ? opts->plan : 0;
    if (plan_kind == 0 && nsr_plan_from_env(&plan_kind, ctx))
        return ctx->status;
    if (nsr_rolled_input(p, x, &N, &T, &d, ctx))
        return ctx->status;
    const nsr_rolled *RR = p->rolled;
    int nb = 0;
    int *last = NULL;
    if (RR->plan_last != NULL) { /* planned at load */
        nb = RR->nplan;
        if ((last = tpk_malloc(ctx, ((size_t)nb + 1) * sizeof *last)) == NULL)
            return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        memcpy(last, RR->plan_last, (size_t)nb * sizeof *last);
    } else {
        plan_job J;
        memset(&J, 0, sizeof J);
        J.p = p;
        J.T = T;
        J.d = d;
        J.all_outputs = all_outputs;
        tpk_ctx_init_from(&J.ctx, ctx);
        pthread_t th;
        if (plan_start(&J, &th))
            return run_beside_plan(p, x, N, T, d, all_outputs, K, err, unsupported, opts,
                                   plan_kind, &J, th, ctx);
        /* no second thread: plan first, as the thread would */
        fl P;
        int st = fl_plan(&P, p, T, d, all_outputs, 0, ctx);
        if (st == TPK_OK)
            st = fl_plan_last_alloc(&P, ctx, &last);
        *unsupported = P.X.unsup;
        nb = P.nb_stmts;
        fl_free(&P);
        if (st)
            return st;
    }
    return run_planned(p, x, N, T, d, all_outputs, K, err, unsupported, opts, plan_kind, last, nb,
                       ctx);
}

int nsr_flimit_refusal(const tpk_program *p, tpk_ctx *ctx)
{
    return TPK_ERROR(ctx, TPK_EUNSUPPORTED, "%s (the unrolled form is too large here; the "
                     "finite-width executor runs the program)",
                     p->rolled && p->rolled->limit_why[0] ? p->rolled->limit_why
                                                          : "no limit evaluator takes it");
}
