/* Noise (and amplitude) by the marginal likelihood on an eigendecomposition: O(N³) once, O(N) per value. */
#include "gp-impl.h"
#include "tpk/alloc.h"

#include <cblas.h>
#define __GSL_CBLAS_H__
#include <gsl/gsl_errno.h>
#include <gsl/gsl_min.h>
#include <lapacke.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Grid density of the noise scan (points per decade) before the Brent refinement. */
#define SPEC_GRID_PER_DECADE 4
/* Brent stops when the bracket in log σ² is this narrow (a 0.1 % change of σ²). */
#define SPEC_BRENT_TOL 1e-3
#define SPEC_BRENT_MAXIT 100
#define SPEC_HUGE 1e300

struct tpk_gp_spectral {
    size_t n, c;
    double *lambda; /* ascending eigenvalues of K */
    double *zsq;    /* zsq[k] = Σ_c (q_kᵀ y_c)² */
    tpk_allocator al; /* of this struct, lambda and zsq */
};

tpk_gp_spectral *tpk_gp_spectral_alloc(const tpk_array *K, const tpk_array *Y, tpk_ctx *ctx)
{
    if (!K || !K->data || K->ndim != 2 || K->dims[0] != K->dims[1] || K->dims[0] == 0) {
        TPK_ERROR(ctx, TPK_EINVAL, "kernel must be a non-empty square N×N matrix");
        return NULL;
    }
    const size_t n = K->dims[0];
    if (n > (size_t)INT_MAX) {
        TPK_ERROR(ctx, TPK_EINVAL, "kernel too large for LAPACK");
        return NULL;
    }
    size_t c = 0;
    if (tpk_array_check_finite(K, "tpk_gp_spectral_alloc", "K", ctx) ||
        tpk_gp_impl_check_targets("tpk_gp_spectral_alloc", Y, n, &c, ctx))
        return NULL;
    gp_kcheck kc = {0};
    if (tpk_gp_impl_check_kernel(K->data, n, 1e-8, "kernel", &kc, ctx))
        return NULL;
    tpk_gp_impl_kcheck_free(&kc);
    tpk_gp_spectral *s = tpk_calloc(ctx, 1, sizeof *s);
    if (s != NULL)
        s->al = tpk_ctx_allocator(ctx);
    double *Q = tpk_malloc(ctx, n * n * sizeof *Q), *Z = tpk_malloc(ctx, n * c * sizeof *Z);
    if (s) {
        s->lambda = tpk_malloc(ctx, n * sizeof(double));
        s->zsq = tpk_malloc(ctx, n * sizeof(double));
    }
    if (!s || !Q || !Z || !s->lambda || !s->zsq) {
        tpk_free(ctx, Q);
        tpk_free(ctx, Z);
        tpk_gp_spectral_free(s);
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory for the eigendecomposition (%zu×%zu)", n, n);
        return NULL;
    }
    s->n = n;
    s->c = c;
    memcpy(Q, K->data, n * n * sizeof *Q);
    lapack_int info = LAPACKE_dsyevd(LAPACK_COL_MAJOR, 'V', 'U', (lapack_int)n, Q, (lapack_int)n,
                                     s->lambda);
    if (info != 0) {
        tpk_free(ctx, Q);
        tpk_free(ctx, Z);
        tpk_gp_spectral_free(s);
        TPK_ERROR(ctx, TPK_ENUMERIC, "eigendecomposition failed (dsyevd info %d)", (int)info);
        return NULL;
    }
    /* Column k of the column-major Q is eigenvector k, i.e. row k of Q read row-major. */
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)c, (int)n, 1.0, Q, (int)n,
                Y->data, (int)c, 0.0, Z, (int)c);
    for (size_t k = 0; k < n; k++) {
        double a = 0;
        for (size_t j = 0; j < c; j++)
            a += Z[k * c + j] * Z[k * c + j];
        s->zsq[k] = a;
    }
    tpk_free(ctx, Q);
    tpk_free(ctx, Z);
    return s;
}

void tpk_gp_spectral_free(tpk_gp_spectral *s)
{
    if (!s)
        return;
    tpk_allocator al = s->al;
    tpk_mem_free(&al, s->lambda);
    tpk_mem_free(&al, s->zsq);
    tpk_mem_free(&al, s);
}

void tpk_gp_spectral_range(const tpk_gp_spectral *s, double *lo, double *hi)
{
    *lo = s->lambda[0];
    *hi = s->lambda[s->n - 1];
}

double tpk_gp_spectral_lml(const tpk_gp_spectral *s, double scale, double noise)
{
    double q = 0, ld = 0;
    for (size_t k = 0; k < s->n; k++) {
        double d = scale * s->lambda[k] + noise;
        if (!(d > 0))
            return -INFINITY;
        q += s->zsq[k] / d;
        ld += log(d);
    }
    return -0.5 * q - 0.5 * (double)s->c * ld - 0.5 * (double)(s->n * s->c) * log(2 * M_PI);
}

/* −LML at ratio r = σ²/s with s profiled (fit_scale) or s = 1; *scale gets s. */
static double neg_lml(const tpk_gp_spectral *s, double log_r, int fit_scale, double *scale)
{
    const double r = exp(log_r);
    if (!fit_scale) {
        *scale = 1;
        return -tpk_gp_spectral_lml(s, 1.0, r);
    }
    double q = 0, ld = 0;
    for (size_t k = 0; k < s->n; k++) {
        double d = s->lambda[k] + r;
        if (!(d > 0))
            return INFINITY;
        q += s->zsq[k] / d;
        ld += log(d);
    }
    const double nc = (double)(s->n * s->c);
    const double sc = q / nc;
    *scale = sc;
    if (!(sc > 0))
        return INFINITY;
    /* LML at s*: −½ NC − ½ C Σ log(s* d_k) − ½ NC log 2π. */
    return 0.5 * nc * (1 + log(2 * M_PI) + log(sc)) + 0.5 * (double)s->c * ld;
}

typedef struct brent_arg {
    const tpk_gp_spectral *s;
    int fit_scale;
} brent_arg;

static double brent_f(double x, void *p)
{
    const brent_arg *a = p;
    double sc;
    double v = neg_lml(a->s, x, a->fit_scale, &sc);
    /* A finite sentinel: GSL's default error handler aborts on an infinite value. */
    return isfinite(v) ? v : SPEC_HUGE;
}

int tpk_gp_spectral_choose_noise(const tpk_gp_spectral *s, double noise_lo, double noise_hi,
                                 int fit_scale, tpk_gp_noise_choice *out, tpk_ctx *ctx)
{
    tpk_error_gsl_init(); /* GSL failures as return codes, never abort() (tpk/error.h) */
    if (!(noise_lo > 0) || !(noise_hi > noise_lo) || !isfinite(noise_hi))
        return TPK_ERROR(ctx, TPK_EINVAL,
                         "noise range must satisfy 0 < lo < hi < inf (got %g, %g)", noise_lo,
                         noise_hi);
    const double a = log(noise_lo), b = log(noise_hi);
    int g = (int)ceil((b - a) / log(10.0) * SPEC_GRID_PER_DECADE);
    if (g < 2)
        g = 2;
    const double h = (b - a) / g;
    int best = -1;
    double fbest = INFINITY, fprev = INFINITY, fnext = INFINITY, sc;
    double *f = tpk_malloc(ctx, (size_t)(g + 1) * sizeof *f);
    if (!f)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    for (int i = 0; i <= g; i++) {
        f[i] = neg_lml(s, a + i * h, fit_scale, &sc);
        if (f[i] < fbest) {
            fbest = f[i];
            best = i;
        }
    }
    if (best < 0) {
        tpk_free(ctx, f);
        return TPK_ERROR(ctx, TPK_ENUMERIC,
                         "the marginal likelihood is not finite anywhere in noise [%g, %g]: the "
                         "kernel has eigenvalues below -%g", noise_lo, noise_hi, noise_hi);
    }
    if (best > 0)
        fprev = f[best - 1];
    if (best < g)
        fnext = f[best + 1];
    tpk_free(ctx, f);
    double x = a + best * h;
    out->at_bound = best == 0 || best == g;
    out->fits = 0;
    if (!out->at_bound && fbest < fprev && fbest < fnext) {
        brent_arg arg = {s, fit_scale};
        gsl_function F = {brent_f, &arg};
        gsl_min_fminimizer *m = gsl_min_fminimizer_alloc(gsl_min_fminimizer_brent);
        if (!m)
            return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (GSL minimiser)");
        if (gsl_min_fminimizer_set_with_values(m, &F, x, fbest, x - h, fprev, x + h, fnext) ==
            GSL_SUCCESS) {
            for (int it = 0; it < SPEC_BRENT_MAXIT; it++) {
                if (gsl_min_fminimizer_iterate(m) != GSL_SUCCESS)
                    break;
                double lo = gsl_min_fminimizer_x_lower(m), hi = gsl_min_fminimizer_x_upper(m);
                if (gsl_min_test_interval(lo, hi, SPEC_BRENT_TOL, 0) == GSL_SUCCESS)
                    break;
            }
            double xm = gsl_min_fminimizer_x_minimum(m), fm = gsl_min_fminimizer_f_minimum(m);
            if (fm < fbest) {
                x = xm;
                fbest = fm;
            }
        }
        gsl_min_fminimizer_free(m);
    }
    fbest = neg_lml(s, x, fit_scale, &sc);
    out->scale = sc;
    out->noise = exp(x) * sc;
    out->lml = -fbest;
    return TPK_OK;
}
