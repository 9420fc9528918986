/* Who computes a limit kernel: one table, one decision, for every tool (gpkernel, netsor kernel,
 * gplimits, gpregress, the Python package, gpkernel-mpi; docs/architecture.md "Solvers"). The
 * NETSOR interpreter computes every program; an architecture keeps a direct recursion of its
 * own only where that is measured at least 1.2x faster than the interpreter on the
 * architecture's benchmark (the rows below say what was measured), and then only for the row's
 * own program: program text given by a caller, or TPK_EVALUATOR=program, runs the interpreter. */
#include "tpk/archs.h"
#include "tpk/job.h"
#include "tpk/kernels.h"

#include "job-impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* --arch=transformer by kernels/transformer.c: the program's final parameter values (flags,
 * --set, its defaults) drive the direct recursion of the same limit (theory.md §2.7; the
 * shipped program's feed-forward φ is relu). Agreement with the evaluator on the program:
 * tests/test_transformer.c. */
static int transformer(const tpk_program *p, const tpk_phi_registry *reg, const tpk_array *X,
                       int all_outputs, int ntk, int param, size_t width,
                       const tpk_progress *prog, tpk_array **K, tpk_array **Th, double *err,
                       tpk_ctx *ctx)
{
    double L, T;
    tpk_transformer_params tp = {0};
    int st = tpk_program_param_number(p, "L", &L, ctx);
    if (!st) st = tpk_program_param_number(p, "T", &T, ctx);
    if (!st) st = tpk_program_param_number(p, "var_e", &tp.var_e, ctx);
    if (!st) st = tpk_program_param_number(p, "var_u", &tp.var_u, ctx);
    if (!st) st = tpk_program_param_number(p, "var_w", &tp.var_w, ctx);
    if (!st) st = tpk_program_param_number(p, "var_b", &tp.var_b, ctx);
    if (!st) st = tpk_program_param_number(p, "temp", &tp.temp, ctx);
    if (!st) st = tpk_program_param_number(p, "eps", &tp.eps, ctx);
    if (!st) st = tpk_program_param_number(p, "sigma_v2", &tp.sigma_v2, ctx);
    if (st)
        return st;
    if (!(L >= 1 && L <= 1e6 && L == floor(L)))
        return TPK_ERROR(ctx, TPK_EINVAL, "the depth L must be a whole number of layers >= 1 "
                         "(got %g)", L);
    if (X->ndim != 3)
        return TPK_ERROR(ctx, TPK_EINVAL, "transformer inputs are N x T x d token arrays (got "
                         "rank %d)", X->ndim);
    if ((double)X->dims[1] != T)
        return TPK_ERROR(ctx, TPK_EINVAL, "the inputs have %zu tokens per sequence, the program "
                         "T = %g", X->dims[1], T);
    tpk_phi *relu = tpk_phi_alloc(reg, "relu", ctx);
    if (!relu)
        return ctx->status;
    tp.depth = (int)L;
    tp.phi = relu;
    tp.ntk_param = param;
    tp.ntk_width = width;
    st = tpk_transformer_kernels(&tp, X, all_outputs, NULL, prog, K, ntk ? Th : NULL, err, ctx);
    tpk_phi_free(relu);
    return st;
}

int app_transformer_direct(const tpk_program *p, const tpk_phi_registry *reg,
                              const tpk_array *X, int all_outputs, const tpk_progress *prog,
                              tpk_array **K, double *err, tpk_ctx *ctx)
{
    return transformer(p, reg, X, all_outputs, 0, 0, 0, prog, K, NULL, err, ctx);
}

static int transformer_ntk(const tpk_program *p, const tpk_phi_registry *reg, const tpk_array *X,
                           int all_outputs, int param, size_t width, const tpk_progress *prog,
                           tpk_array **K, tpk_array **Th, double *err, tpk_ctx *ctx)
{
    return transformer(p, reg, X, all_outputs, 1, param, width, prog, K, Th, err, ctx);
}

/* --arch=gru by kernels/gru.c: the program's parameter values drive the direct recursion of the
 * same limit (theory.md §2.3). Agreement with the evaluator on the program and with the
 * independent reference: tests/test_gru.c. */
int app_gru_direct(const tpk_program *p, const tpk_phi_registry *reg, const tpk_array *X,
                      int all_outputs, const tpk_progress *prog, tpk_array **K, double *err,
                      tpk_ctx *ctx)
{
    (void)reg;
    double T;
    tpk_gru_params gp = {0};
    static const char *names[] = {"var_Uz", "var_Ur", "var_Uh", "var_Wz", "var_Wr",
                                  "var_Wh", "var_bz", "var_br", "var_bh", "mu_bz",
                                  "mu_br",  "mu_bh",  "sigma_v2"};
    double *dst[] = {&gp.var_Uz, &gp.var_Ur, &gp.var_Uh, &gp.var_Wz, &gp.var_Wr,
                     &gp.var_Wh, &gp.var_bz, &gp.var_br, &gp.var_bh, &gp.mu_bz,
                     &gp.mu_br,  &gp.mu_bh,  &gp.sigma_v2};
    int st = tpk_program_param_number(p, "T", &T, ctx);
    for (int i = 0; i < 13 && !st; i++)
        st = tpk_program_param_number(p, names[i], dst[i], ctx);
    double seed = 0;
    if (!st)
        st = tpk_program_param_number(p, "qmc_budget", &gp.budget, ctx);
    if (!st)
        st = tpk_program_param_number(p, "qmc_seed", &seed, ctx);
    if (!st)
        st = tpk_program_param_number(p, "qmc_tol", &gp.tol, ctx);
    if (st)
        return st;
    if (!(seed >= 0 && seed <= 9007199254740992.0 && seed == floor(seed)))
        return TPK_ERROR(ctx, TPK_EINVAL, "qmc_seed must be a whole number >= 0 (got %g)", seed);
    gp.seed = (uint64_t)seed;
    if (X->ndim != 3)
        return TPK_ERROR(ctx, TPK_EINVAL, "GRU inputs are N x T x d sequences (got rank %d)",
                         X->ndim);
    if ((double)X->dims[1] != T)
        return TPK_ERROR(ctx, TPK_EINVAL, "the inputs have %zu steps per sequence, the program "
                         "T = %g", X->dims[1], T);
    return tpk_gru_kernel(&gp, X, all_outputs, prog, K, err, ctx);
}

typedef struct solver_row {
    const char *name;           /* the outputs' "solver" attribute */
    tpk_direct_kernel kernel;
    app_direct_ntk ntk;         /* the NTK beside the NNGP by the same recursion, or NULL: the
                                 * interpreter's NTK pass */
    const char *measured;       /* why the row exists: against the interpreter, side by side */
} solver_row;

static const solver_row rows[] = {
    {"transformer-recursion", app_transformer_direct, transformer_ntk,
     "2 x 1000 tokens, depth 2: 0.13-0.14 s against the interpreter's 0.27-0.38 s "
     "(bench_transformer, docs/orchestration.md section 7)"},
    {"gru-recursion", app_gru_direct, NULL,
     "GRU 4 x 8, all times: 0.66 s against the member-level evaluator's 12.4 s, and a tighter "
     "integration (bench_recurrent; theory.md section 2.3)"},
};

/* The row of a direct recursion (NULL: none). */
static const solver_row *row_of(tpk_direct_kernel k)
{
    for (size_t i = 0; k != NULL && i < sizeof rows / sizeof rows[0]; i++)
        if (rows[i].kernel == k)
            return &rows[i];
    return NULL;
}

tpk_direct_kernel tpk_job_solver(const tpk_job *job, const char **name)
{
    tpk_direct_kernel k = job != NULL ? job->direct : NULL;
    const char *ev = getenv("TPK_EVALUATOR");
    /* the NTK: the row's own recursion where it has one, else the interpreter's pass */
    if (k == NULL || job->source != NULL || (ev != NULL && strcmp(ev, "program") == 0) ||
        (job->kernel != TPK_JOB_NNGP && (row_of(k) == NULL || row_of(k)->ntk == NULL)))
        k = NULL;
    if (name != NULL) {
        *name = k != NULL ? "direct-recursion" : "interpreter";
        for (size_t i = 0; k != NULL && i < sizeof rows / sizeof rows[0]; i++)
            if (rows[i].kernel == k)
                *name = rows[i].name;
    }
    return k;
}

app_direct_ntk app_job_solver_ntk(const tpk_job *job)
{
    tpk_direct_kernel k = job->kernel != TPK_JOB_NNGP ? tpk_job_solver(job, NULL) : NULL;
    return k != NULL ? row_of(k)->ntk : NULL;
}
