/* Log marginal likelihood with gradient (R&W eq. 5.9) and its maximisation with GSL's vector BFGS. */
#include "gp-impl.h"
#include "tpk/alloc.h"

#include <cblas.h>
#define __GSL_CBLAS_H__
#include <gsl/gsl_multimin.h>
#include <gsl/gsl_vector.h>
#include <lapacke.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A finite stand-in for −LML where the kernel or its factorisation fails: GSL's default error
 * handler aborts on non-finite objective values, and the line search backs off from this one. */
#define HYPER_HUGE 1e300
#define HYPER_MAX_GRID 256 /* grid starts evaluated at most (else the given start only) */
/* First trial step of the line search, in log θ (a factor e^0.5 ≈ 1.6), and its tolerance. */
#define HYPER_STEP 0.5
#define HYPER_LINE_TOL 0.1

int tpk_gp_lml_grad(const tpk_array *K, const tpk_array *Y, double noise,
                    const double *const *dK, size_t np, const tpk_gp_options *opt, double *lml,
                    double *grad, double *jitter_out, tpk_ctx *ctx)
{
    tpk_gp_options def;
    if (!opt) {
        tpk_gp_options_default(&def);
        opt = &def;
    }
    if (!K || !K->data || K->ndim != 2 || K->dims[0] != K->dims[1] || K->dims[0] == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "kernel must be a non-empty square N×N matrix");
    int st = tpk_gp_impl_check_noise(noise, ctx);
    if (st)
        return st;
    const size_t n = K->dims[0];
    size_t c = 0;
    if ((st = tpk_array_check_finite(K, "tpk_gp_lml_grad", "K", ctx)) ||
        (st = tpk_gp_impl_check_targets("tpk_gp_lml_grad", Y, n, &c, ctx)))
        return st;
    if (grad && np > 0 && !dK)
        return TPK_ERROR(ctx, TPK_EINVAL, "gradient requested for %zu parameters but no dK", np);
    for (size_t i = 0; grad && i < np; i++) {
        char name[32];
        snprintf(name, sizeof name, "dK[%zu]", i);
        tpk_array view = {.ndim = 2, .dims = {n, n}, .data = (double *)dK[i]};
        if ((st = tpk_array_check_finite(&view, "tpk_gp_lml_grad", name, ctx)))
            return st;
    }
    gp_kcheck kc = {0};
    if ((st = tpk_gp_impl_check_kernel(K->data, n, opt->sym_tol, "kernel", &kc, ctx)))
        return st;
    double *A = tpk_malloc(ctx, n * n * sizeof *A), *alpha = tpk_malloc(ctx, n * c * sizeof *alpha);
    double *T = grad ? tpk_malloc(ctx, n * c * sizeof *T) : NULL;
    if (!A || !alpha || (grad && !T)) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (%zu×%zu)", n, n);
        goto done;
    }
    double jit = 0, rc = 0, quad = 0;
    int tries = 0;
    st = tpk_gp_impl_factor(A, K->data, n, noise, &kc, opt, 0, &jit, &tries, &rc, NULL, ctx);
    if (!st)
        st = tpk_gp_impl_solve(A, n, Y, c, alpha, &quad, ctx);
    if (st)
        goto done;
    *lml = -0.5 * quad - 0.5 * (double)c * tpk_gp_impl_logdet(A, n) -
           0.5 * (double)(n * c) * log(2 * M_PI);
    if (jitter_out)
        *jitter_out = jit;
    if (!grad)
        goto done;
    /* A⁻¹ for the trace terms only (column-major upper = row-major lower). */
    lapack_int info = LAPACKE_dpotri_work(LAPACK_COL_MAJOR, 'U', (lapack_int)n, A, (lapack_int)n);
    if (info != 0) {
        st = TPK_ERROR(ctx, TPK_ENUMERIC, "dpotri failed (info %d)", (int)info);
        goto done;
    }
    double tr = 0;
    for (size_t i = 0; i < n; i++)
        tr += A[i * n + i];
    const double aa = cblas_ddot((int)(n * c), alpha, 1, alpha, 1);
    grad[np] = 0.5 * noise * (aa - (double)c * tr);
    for (size_t p = 0; p < np; p++) {
        const double *D = dK[p];
        if (!D) {
            grad[p] = 0;
            continue;
        }
        double t = 0;
#pragma omp parallel for reduction(+ : t) schedule(dynamic, 64)
        for (size_t i = 0; i < n; i++) {
            const double *ar = A + i * n, *dr = D + i * n;
            double s = 0;
            for (size_t j = 0; j < i; j++)
                s += ar[j] * dr[j];
            t += 2 * s + ar[i] * dr[i];
        }
        cblas_dsymm(CblasColMajor, CblasLeft, CblasUpper, (int)n, (int)c, 1.0, D, (int)n, alpha,
                    (int)n, 0.0, T, (int)n);
        const double adka = cblas_ddot((int)(n * c), alpha, 1, T, 1);
        grad[p] = 0.5 * (adka - (double)c * t);
    }
done:
    tpk_gp_impl_kcheck_free(&kc);
    tpk_free(ctx, A);
    tpk_free(ctx, alpha);
    tpk_free(ctx, T);
    return st;
}

void tpk_gp_hyper_options_default(tpk_gp_hyper_options *o)
{
    o->fixed = 0;
    o->max_iter = 60;
    o->gtol = 1e-4;
    o->log_lo = -25;
    o->log_hi = 10;
    o->trace = NULL;
    o->multistart = 3;
}

/* State shared with the GSL callbacks. */
typedef struct hyper_state {
    const tpk_gp_family *f;
    const tpk_array *Y;
    const tpk_gp_hyper_options *opt;
    size_t n, c, np;
    int free_idx[TPK_GP_MAXPARAMS + 1]; /* optimised coordinate → parameter (np = noise) */
    int nfree;
    double base[TPK_GP_MAXPARAMS + 1];  /* log values of all parameters (fixed ones stay) */
    tpk_array K;
    double *dK[TPK_GP_MAXPARAMS];
    int evals;
    double best_f, best[TPK_GP_MAXPARAMS + 1];
    tpk_ctx first_err;                  /* first evaluation failure, for the final message */
} hyper_state;

static void unpack(hyper_state *h, const gsl_vector *x, double *lg)
{
    memcpy(lg, h->base, sizeof h->base);
    for (int k = 0; k < h->nfree; k++) {
        double v = gsl_vector_get(x, (size_t)k);
        lg[h->free_idx[k]] = fmin(fmax(v, h->opt->log_lo), h->opt->log_hi);
    }
}

/* −LML/(NC) and, if g != NULL, its gradient in the free log coordinates. */
static double objective(hyper_state *h, const gsl_vector *x, gsl_vector *g)
{
    double lg[TPK_GP_MAXPARAMS + 1], theta[TPK_GP_MAXPARAMS], grad[TPK_GP_MAXPARAMS + 1];
    unpack(h, x, lg);
    for (size_t p = 0; p < h->np; p++)
        theta[p] = exp(lg[p]);
    const double noise = exp(lg[h->np]);
    double *dK[TPK_GP_MAXPARAMS] = {NULL};
    for (int k = 0; g && k < h->nfree; k++)
        if ((size_t)h->free_idx[k] < h->np)
            dK[h->free_idx[k]] = h->dK[h->free_idx[k]];
    tpk_ctx lc;
    tpk_ctx_init_from(&lc, &h->first_err); /* first_err carries the caller's allocator */
    h->evals++;
    double lml = 0;
    int st = h->f->eval(h->f, theta, h->K.data, g ? dK : NULL, &lc);
    if (!st)
        st = tpk_gp_lml_grad(&h->K, h->Y, noise, (const double *const *)dK, h->np, NULL, &lml,
                             g ? grad : NULL, NULL, &lc);
    const double nc = (double)(h->n * h->c);
    if (st) {
        /* out of memory is no bad point: it ends the fit (below), so it is the one kept */
        if (!h->first_err.status || (lc.status == TPK_ENOMEM && h->first_err.status != TPK_ENOMEM))
            h->first_err = lc;
        if (g)
            gsl_vector_set_zero(g);
        return HYPER_HUGE;
    }
    double fval = -lml / nc;
    if (fval < h->best_f) {
        h->best_f = fval;
        memcpy(h->best, lg, sizeof h->best);
    }
    for (int k = 0; g && k < h->nfree; k++)
        gsl_vector_set(g, (size_t)k, -grad[h->free_idx[k]] / nc);
    return fval;
}

static double gsl_f(const gsl_vector *x, void *p) { return objective(p, x, NULL); }
static void gsl_df(const gsl_vector *x, void *p, gsl_vector *g) { objective(p, x, g); }
static void gsl_fdf(const gsl_vector *x, void *p, double *f, gsl_vector *g)
{
    *f = objective(p, x, g);
}

int tpk_gp_fit_hyper(const tpk_gp_family *f, const tpk_array *Y, double *theta, double *noise,
                     const tpk_gp_hyper_options *opt, tpk_gp_hyper_result *res, tpk_ctx *ctx)
{
    tpk_error_gsl_init(); /* GSL failures as return codes, never abort() (tpk/error.h) */
    tpk_gp_hyper_options def;
    if (!opt) {
        tpk_gp_hyper_options_default(&def);
        opt = &def;
    }
    if (!f || !f->eval || f->nparams > TPK_GP_MAXPARAMS || f->n == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "invalid kernel family");
    size_t c = 0;
    int st = tpk_gp_impl_check_targets("tpk_gp_fit_hyper", Y, f->n, &c, ctx);
    if (st)
        return st;
    if (opt->max_iter < 0 || !(opt->gtol > 0) || !(opt->log_lo < opt->log_hi))
        return TPK_ERROR(ctx, TPK_EINVAL, "invalid hyperparameter options (max_iter, gtol, box)");
    hyper_state h = {.f = f, .Y = Y, .opt = opt, .n = f->n, .c = c, .np = f->nparams,
                     .best_f = INFINITY};
    tpk_ctx_init_from(&h.first_err, ctx);
    for (size_t p = 0; p <= h.np; p++) {
        double v = p < h.np ? theta[p] : *noise;
        const char *name = p < h.np ? f->names[p] : "noise";
        int is_free = !(opt->fixed & (1u << p));
        if (!isfinite(v) || v < 0 || (is_free && v == 0))
            return TPK_ERROR(ctx, TPK_EDOM,
                             "%s must be finite and > 0 to be fitted in log scale (got %g)",
                             name ? name : "parameter", v);
        h.base[p] = v > 0 ? log(v) : -INFINITY;
        if (is_free)
            h.free_idx[h.nfree++] = (int)p;
    }
    const size_t n = f->n;
    h.K.ndim = 2;
    h.K.dims[0] = h.K.dims[1] = n;
    h.K.data = tpk_malloc(ctx, n * n * sizeof(double));
    st = h.K.data ? TPK_OK : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (%zu×%zu)", n, n);
    for (int k = 0; !st && k < h.nfree; k++) {
        int p = h.free_idx[k];
        if ((size_t)p < h.np && !(h.dK[p] = tpk_malloc(ctx, n * n * sizeof(double))))
            st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory for dK (%zu×%zu)", n, n);
    }
    /* the start point: at most TPK_GP_MAXPARAMS + 1 coordinates, on the stack */
    double xbuf[TPK_GP_MAXPARAMS + 1] = {0};
    gsl_vector_view xv = gsl_vector_view_array(xbuf, (size_t)(h.nfree ? h.nfree : 1));
    gsl_vector *x = &xv.vector;
    gsl_multimin_fdfminimizer *m = NULL;
    if (st)
        goto done;
    for (int k = 0; k < h.nfree; k++)
        gsl_vector_set(x, (size_t)k, h.base[h.free_idx[k]]);
    /* Evaluate the start once: a failure there is the caller's problem, reported as is. */
    if (objective(&h, x, NULL) >= HYPER_HUGE) {
        tpk_error_at(ctx, h.first_err.status, h.first_err.src_file, h.first_err.src_line,
                     "at the starting hyperparameters: %s", h.first_err.msg);
        st = h.first_err.status;
        goto done;
    }
    int iters = 0, converged = 0;
    /* Multi-start (the LML is not concave in log θ, log σ²: from a tiny noise BFGS can stall at
     * the interpolating optimum): the given start and a grid around it — each kernel parameter
     * ×e^{±3}, the noise at 10⁻⁴, 10⁻² and 0.3 of the targets' variance — are evaluated, and BFGS
     * runs from the `multistart` best; the best point of all evaluations is the result. */
    double starts[HYPER_MAX_GRID][TPK_GP_MAXPARAMS + 1], sval[HYPER_MAX_GRID];
    int ns = 0;
    {
        double vy = 0;
        for (size_t i = 0; i < n * c; i++)
            vy += Y->data[i] * Y->data[i];
        vy = vy > 0 ? vy / (double)(n * c) : 1.0;
        int nopt[TPK_GP_MAXPARAMS + 1], total = 1;
        double opt_v[TPK_GP_MAXPARAMS + 1][4];
        for (int k = 0; k < h.nfree; k++) {
            int p = h.free_idx[k];
            double b = h.base[p];
            opt_v[k][0] = b;
            if ((size_t)p < h.np) {
                opt_v[k][1] = b - 3;
                opt_v[k][2] = b + 3;
                nopt[k] = 3;
            } else {
                opt_v[k][1] = log(1e-4 * vy);
                opt_v[k][2] = log(1e-2 * vy);
                opt_v[k][3] = log(0.3 * vy);
                nopt[k] = 4;
            }
            total *= nopt[k];
        }
        if (opt->multistart <= 1 || total > HYPER_MAX_GRID)
            total = 1; /* the given start only */
        for (int g = 0; g < total; g++) {
            int r = g;
            for (int k = 0; k < h.nfree; k++) {
                double v = opt_v[k][r % nopt[k]];
                r /= nopt[k];
                starts[ns][k] = fmin(fmax(v, opt->log_lo), opt->log_hi);
                gsl_vector_set(x, (size_t)k, starts[ns][k]);
            }
            sval[ns++] = g == 0 ? h.best_f : objective(&h, x, NULL);
        }
    }
    int runs = opt->multistart < 1 ? 1 : opt->multistart;
    if (h.nfree > 0 && opt->max_iter > 0) {
        gsl_multimin_function_fdf F = {gsl_f, gsl_df, gsl_fdf, (size_t)h.nfree, &h};
        m = gsl_multimin_fdfminimizer_alloc(gsl_multimin_fdfminimizer_vector_bfgs2,
                                            (size_t)h.nfree);
        if (!m) {
            st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (GSL minimiser)");
            goto done;
        }
        for (int run = 0; run < runs && run < ns; run++) {
            int b = -1; /* the best grid point not started from yet */
            for (int g = 0; g < ns; g++)
                if (sval[g] < HYPER_HUGE && (b < 0 || sval[g] < sval[b]))
                    b = g;
            if (b < 0)
                break;
            sval[b] = INFINITY;
            for (int k = 0; k < h.nfree; k++)
                gsl_vector_set(x, (size_t)k, starts[b][k]);
            gsl_multimin_fdfminimizer_set(m, &F, x, HYPER_STEP, HYPER_LINE_TOL);
            int it = 0, conv = 0;
            while (it < opt->max_iter) {
                it++;
                int s = gsl_multimin_fdfminimizer_iterate(m);
                if (opt->trace) {
                    FILE *tf = opt->trace;
                    fprintf(tf, "  hyper start %d iter %3d  -lml/(NC) %.10g ", run + 1, it, m->f);
                    for (int k = 0; k < h.nfree; k++) {
                        int p = h.free_idx[k];
                        fprintf(tf, " %s=%.6g", (size_t)p < h.np ? f->names[p] : "noise",
                                exp(gsl_vector_get(m->x, (size_t)k)));
                    }
                    fputc('\n', tf);
                }
                if (s != GSL_SUCCESS)
                    break; /* GSL_ENOPROG: the line search cannot improve */
                if (gsl_multimin_test_gradient(m->gradient, opt->gtol) == GSL_SUCCESS) {
                    conv = 1;
                    break;
                }
            }
            iters += it;
            /* converged: the run that found the best point met the gradient test */
            if (m->f <= h.best_f)
                converged = conv;
        }
    } else {
        converged = 1;
    }
    if (h.first_err.status == TPK_ENOMEM) { /* an evaluation ran out of memory: no result */
        st = tpk_error_at(ctx, TPK_ENOMEM, h.first_err.src_file, h.first_err.src_line, "%s",
                          h.first_err.msg);
        goto done;
    }
    for (size_t p = 0; p < h.np; p++)
        theta[p] = exp(h.best[p]);
    *noise = exp(h.best[h.np]);
    if (res) {
        res->lml = -h.best_f * (double)(n * c);
        res->iters = iters;
        res->evals = h.evals;
        res->converged = converged;
    }
done:
    gsl_multimin_fdfminimizer_free(m);
    tpk_free(ctx, h.K.data);
    for (size_t p = 0; p < TPK_GP_MAXPARAMS; p++)
        tpk_free(ctx, h.dK[p]);
    return st;
}
