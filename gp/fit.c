/* GP regression: checked Cholesky with jitter escalation, posterior mean/variance, LML (R&W Alg. 2.1). */
#include "gp-impl.h"
#include "tpk/alloc.h"

#include <cblas.h>
#include <lapacke.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Tile for the transposed (cache-unfriendly) reads of the upper triangle. */
#define GP_TILE 64
/* Test points per triangular solve in tpk_gp_predict: workspace N×GP_PRED_BLOCK doubles. */
#define GP_PRED_BLOCK 256
/* A predictive variance k(x,x) − kᵀA⁻¹k below −GP_VAR_RTOL·max(k(x,x), kᵀA⁻¹k) is no rounding
 * (that is ~ε·cond(A), at most ~1e-6 at the jitter's floor): the test kernel is not the same
 * covariance as the training one — its joint matrix is not PSD (issue 18: a precomputed
 * /kernel_test_diag of −1, or test×train entries larger than the variances allow, gave variance 0
 * without a word). Between that and 0 it is rounding, clipped to 0. */
#define GP_VAR_RTOL 1e-3
/* Noise search: smallest parabolic move (decades of σ²) worth a factorisation: the LML is flat
 * near its optimum, and 0.1 decade (26 %) in σ² changes it by O(1e-4) per output. */
#define GP_VERTEX_MIN 0.1

struct tpk_gp {
    size_t n, c;
    double *A;        /* factor U (column-major upper = row-major lower), borrowed or owned */
    double *owned;    /* == A in copy mode, NULL in overwrite mode */
    double *alpha;    /* column-major N×C */
    double anorm;     /* ‖A‖₁, for tpk_gp_rcond */
    tpk_gp_info info;
    tpk_allocator al; /* of this struct, owned and alpha */
};

void tpk_gp_options_default(tpk_gp_options *o)
{
    o->overwrite_k = 0;
    o->jitter_first = 1e-10;
    o->jitter_max = 1e-3;
    o->rcond_min = 0;
    o->pivot_ratio_min = 1e-7;
    o->sym_tol = 1e-8;
    o->data = NULL;
    o->noise_name = NULL;
    o->noise_auto = NULL;
}

/* --noise=0 / GPRegressor(noise=0) asks to interpolate: two items the kernel cannot tell apart
 * are the same point to it when their squared feature distance K_ii + K_jj − 2K_ij is below
 * DUP_REL_TOL of K_ii + K_jj (rounding of the kernel sums); their targets then must agree to
 * TARGET_REL_TOL of the largest |target| (rounding of text files). */
#define DUP_REL_TOL 1e-12
#define TARGET_REL_TOL 1e-9
/* A noise below the jitter the factorisation needed: the fit of K + rI misses targets in the
 * kernel's range by Y − Kα = rα, O(r), and a fraction of Y for the rest (issue 18: x and 2x under
 * a bias-free ReLU kernel gave LML −6.3e8). More than INTERP_RTOL of ‖Y‖ is no interpolant. */
#define INTERP_RTOL 1e-3

/* The caller's names for messages (tpk_gp_options.data, noise_name, noise_auto). */
static void gp_names(const tpk_gp_options *o, const char **pre, const char **sep,
                     const char **noise, const char **autom)
{
    *pre = o->data ? o->data : "";
    *sep = o->data ? ": " : "";
    *noise = o->noise_name ? o->noise_name : "noise";
    *autom = o->noise_auto ? o->noise_auto : "a noise chosen by the likelihood";
}

/* Noise 0: items the kernel ties must have equal targets (O(N²); lower triangle of K). */
static int check_interpolable(const tpk_array *K, const tpk_array *Y, const tpk_gp_options *o,
                              tpk_ctx *ctx)
{
    const size_t n = K->dims[0], c = tpk_array_item_size(Y);
    const double *k = K->data, *y = Y->data;
    double ymax = 0;
    for (size_t i = 0; i < n * c; i++)
        ymax = fmax(ymax, fabs(y[i]));
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < i; j++) {
            double kii = k[i * n + i], kjj = k[j * n + j], d2 = kii + kjj - 2 * k[i * n + j];
            if (!(d2 <= DUP_REL_TOL * (kii + kjj)))
                continue;
            for (size_t q = 0; q < c; q++)
                if (fabs(y[i * c + q] - y[j * c + q]) > TARGET_REL_TOL * ymax) {
                    const char *pre, *sep, *nn, *au;
                    gp_names(o, &pre, &sep, &nn, &au);
                    return TPK_ERROR(ctx, TPK_EDOM, "%s%straining items %zu and %zu are the "
                                     "same point to the kernel (K[%zu][%zu] + K[%zu][%zu] - "
                                     "2 K[%zu][%zu] = %.3g) but their targets differ (%.6g vs "
                                     "%.6g, output %zu): %s=0 asks to interpolate both; give "
                                     "%s > 0 or %s", pre, sep, j, i, j, j, i, i, i, j, d2,
                                     y[j * c + q], y[i * c + q], q, nn, nn, au);
                }
        }
    return TPK_OK;
}

/* A fit whose jitter exceeded the noise: the targets must be in the kernel's range. */
static int check_interpolant(const tpk_gp *gp, const tpk_array *Y, const tpk_gp_options *o,
                             tpk_ctx *ctx)
{
    const size_t n = gp->n, c = gp->c;
    const double r = gp->info.noise + gp->info.jitter;
    double miss = 0, norm = 0, worst = 0;
    size_t at = 0;
    for (size_t q = 0; q < c; q++) /* alpha is column-major N×C */
        for (size_t i = 0; i < n; i++) {
            double m = fabs(r * gp->alpha[q * n + i]), yv = Y->data[i * c + q];
            miss += m * m;
            norm += yv * yv;
            if (m > worst) {
                worst = m;
                at = i * c + q;
            }
        }
    if (!(sqrt(miss) > INTERP_RTOL * sqrt(norm)))
        return TPK_OK;
    const char *pre, *sep, *nn, *au;
    gp_names(o, &pre, &sep, &nn, &au);
    return TPK_ERROR(ctx, TPK_EDOM, "%s%s%s=%g asks to interpolate, but the kernel is singular "
                     "and the targets are not in its range: the closest fit misses them by %.3g "
                     "of their size (most at training item %zu, output %zu); items the kernel "
                     "ties together (duplicates, multiples under a bias-free homogeneous phi) "
                     "need consistent targets: give %s > 0 or %s", pre, sep, nn,
                     gp->info.noise, sqrt(miss / norm), at / c, at % c, nn, au);
}

int tpk_gp_impl_check_noise(double noise, tpk_ctx *ctx)
{
    if (!isfinite(noise))
        return TPK_ERROR(ctx, TPK_EDOM, "noise variance must be finite (got %g)", noise);
    if (noise < 0)
        return TPK_ERROR(ctx, TPK_EDOM, "noise variance must be >= 0 (got %g)", noise);
    return TPK_OK;
}

void tpk_gp_impl_kcheck_free(gp_kcheck *kc)
{
    tpk_mem_free(&kc->al, kc->col_abs);
    tpk_mem_free(&kc->al, kc->diag);
    kc->col_abs = kc->diag = NULL;
}

int tpk_gp_impl_check_kernel(const double *K, size_t n, double sym_tol, const char *what,
                             gp_kcheck *kc, tpk_ctx *ctx)
{
    kc->al = tpk_ctx_allocator(ctx);
    kc->col_abs = tpk_calloc(ctx, n ? n : 1, sizeof(double));
    kc->diag = tpk_malloc(ctx, (n ? n : 1) * sizeof(double));
    if (!kc->col_abs || !kc->diag) {
        tpk_gp_impl_kcheck_free(kc);
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (%zu doubles)", 2 * n);
    }
    double dmax = 0, dsum = 0;
    for (size_t i = 0; i < n; i++) {
        double d = K[i * n + i];
        kc->diag[i] = d;
        if (!isfinite(d)) {
            TPK_ERROR(ctx, TPK_EDOM, "%s has a non-finite value at [%zu][%zu]", what, i, i);
            tpk_gp_impl_kcheck_free(kc);
            return TPK_EDOM;
        }
        if (d < 0) {
            TPK_ERROR(ctx, TPK_EDOM, "%s has a negative diagonal entry %g at [%zu][%zu]: not a "
                      "covariance", what, d, i, i);
            tpk_gp_impl_kcheck_free(kc);
            return TPK_EDOM;
        }
        dmax = fmax(dmax, d);
        dsum += d;
    }
    /* One pass over the off-diagonal tiles, each lower tile beside its mirror (both stay in
     * cache): finiteness, symmetry, and |K_ij| summed into per-thread column sums (summed after).
     * The first offending entry in row order is reported. */
    const double tol = sym_tol * (dmax > 0 ? dmax : 1.0);
    size_t bad_nf = n * n, bad_sym = n * n;
    int nth = omp_get_max_threads();
    double *part = tpk_calloc(ctx, (size_t)nth * n, sizeof *part);
    if (!part) {
        tpk_gp_impl_kcheck_free(kc);
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (%d×%zu)", nth, n);
    }
#pragma omp parallel num_threads(nth) reduction(min : bad_nf, bad_sym)
    {
        double *cs = part + (size_t)omp_get_thread_num() * n;
#pragma omp for schedule(dynamic, 1)
        for (size_t ib = 0; ib < n; ib += GP_TILE)
            for (size_t jb = 0; jb <= ib; jb += GP_TILE) {
                size_t ie = ib + GP_TILE < n ? ib + GP_TILE : n;
                for (size_t i = ib; i < ie; i++) {
                    const double *row = K + i * n;
                    size_t je = jb + GP_TILE < i ? jb + GP_TILE : i;
                    double rs = 0;
                    for (size_t j = jb; j < je; j++) {
                        double a = row[j], b = K[j * n + i];
                        rs += fabs(a);
                        cs[j] += fabs(a);
                        if (!(fabs(a - b) <= tol)) { /* NaN in either fails too */
                            if (!isfinite(a)) {
                                if (i * n + j < bad_nf)
                                    bad_nf = i * n + j;
                            } else if (i * n + j < bad_sym) {
                                bad_sym = i * n + j;
                            }
                        }
                    }
                    cs[i] += rs;
                }
            }
    }
    for (int t = 0; t < nth; t++)
        for (size_t i = 0; i < n; i++)
            kc->col_abs[i] += part[(size_t)t * n + i];
    tpk_free(ctx, part);
    int st = TPK_OK;
    if (bad_nf < n * n) {
        st = TPK_ERROR(ctx, TPK_EDOM, "%s has a non-finite value at [%zu][%zu]", what, bad_nf / n,
                       bad_nf % n);
        goto out;
    }
    if (bad_sym < n * n) {
        size_t i = bad_sym / n, j = bad_sym % n;
        st = TPK_ERROR(ctx, TPK_EINVAL, "%s is not symmetric: [%zu][%zu] = %.17g but [%zu][%zu] = "
                       "%.17g", what, i, j, K[i * n + j], j, i, K[j * n + i]);
        goto out;
    }
    kc->mean_diag = n ? dsum / (double)n : 0;
out:
    if (st)
        tpk_gp_impl_kcheck_free(kc);
    return st;
}

int tpk_gp_impl_check_targets(const char *entry, const tpk_array *Y, size_t n, size_t *c,
                              tpk_ctx *ctx)
{
    if (!Y || !Y->data)
        return TPK_ERROR(ctx, TPK_EINVAL, "no targets given");
    if (Y->ndim != 1 && Y->ndim != 2)
        return TPK_ERROR(ctx, TPK_EINVAL, "targets must be N or N×C (got rank %d)", Y->ndim);
    if (Y->dims[0] != n)
        return TPK_ERROR(ctx, TPK_EINVAL, "targets have %zu rows but the kernel is %zu×%zu",
                         Y->dims[0], n, n);
    *c = Y->ndim == 2 ? Y->dims[1] : 1;
    if (*c == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "targets have no columns");
    return tpk_array_check_finite(Y, entry, "Y", ctx);
}

/* Lower triangle of A from the strict upper triangle of A (overwrite mode) or from src. */
static void restore_lower(double *A, const double *src, size_t n, const double *diag)
{
    if (src != A) {
#pragma omp parallel for schedule(dynamic, 64)
        for (size_t i = 0; i < n; i++)
            memcpy(A + i * n, src + i * n, (i + 1) * sizeof(double));
        return;
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t ib = 0; ib < n; ib += GP_TILE)
        for (size_t jb = 0; jb <= ib; jb += GP_TILE) {
            size_t ie = ib + GP_TILE < n ? ib + GP_TILE : n;
            for (size_t i = ib; i < ie; i++) {
                size_t je = jb + GP_TILE < i ? jb + GP_TILE : i;
                for (size_t j = jb; j < je; j++)
                    A[i * n + j] = A[j * n + i];
            }
        }
    for (size_t i = 0; i < n; i++)
        A[i * n + i] = diag[i];
}

int tpk_gp_impl_factor(double *A, const double *src, size_t n, double noise, const gp_kcheck *kc,
                       const tpk_gp_options *opt, int restore_first, double *jitter, int *tries,
                       double *rcond, double *anorm_out, tpk_ctx *ctx)
{
    if (n > (size_t)INT_MAX)
        return TPK_ERROR(ctx, TPK_EINVAL, "kernel of size %zu exceeds LAPACK's int indexing", n);
    const lapack_int ln = (lapack_int)n;
    double *work = NULL;
    lapack_int *iwork = NULL;
    if (opt->rcond_min > 0) {
        work = tpk_malloc(ctx, (3 * n + 1) * sizeof *work);
        iwork = tpk_malloc(ctx, (n + 1) * sizeof *iwork);
        if (!work || !iwork) {
            tpk_free(ctx, work);
            tpk_free(ctx, iwork);
            return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (condition estimate workspace)");
        }
    }
    const double scale = kc->mean_diag > 0 ? kc->mean_diag : 1.0;
    double jit = 0, last_rc = NAN, last_ratio = NAN, anorm = 0;
    lapack_int last_info = 0;
    int t = 0, st = TPK_ENUMERIC;
    for (;;) {
        t++;
        if (t > 1 || src != A || restore_first)
            restore_lower(A, src, n, kc->diag);
        const double s = noise + jit;
        for (size_t i = 0; i < n; i++)
            A[i * n + i] += s;
        /* _work: the inputs are already checked for NaN, skip LAPACKE's O(N²) rescan. */
        lapack_int info = LAPACKE_dpotrf_work(LAPACK_COL_MAJOR, 'U', ln, A, ln);
        if (info < 0) {
            st = TPK_ERROR(ctx, TPK_EINVAL, "dpotrf rejected argument %d (internal error)",
                           (int)-info);
            break;
        }
        last_info = info;
        last_rc = NAN;
        anorm = 0;
        for (size_t i = 0; i < n; i++)
            anorm = fmax(anorm, kc->col_abs[i] + fabs(kc->diag[i] + s));
        if (info == 0) {
            /* Free test first: κ₂(A) ≥ (max U_ii / min U_ii)², so a tiny pivot ratio proves
             * near-singularity (a pivot that only survived rounding). */
            double umin = INFINITY, umax = 0;
            for (size_t i = 0; i < n; i++) {
                umin = fmin(umin, A[i * n + i]);
                umax = fmax(umax, A[i * n + i]);
            }
            last_ratio = umin / umax;
            if (!(last_ratio >= opt->pivot_ratio_min))
                goto next;
            if (!(opt->rcond_min > 0)) {
                st = TPK_OK;
                break;
            }
            double rc = 0;
            info = LAPACKE_dpocon_work(LAPACK_COL_MAJOR, 'U', ln, A, ln, anorm, &rc, work, iwork);
            last_rc = rc;
            if (info == 0 && rc >= opt->rcond_min) {
                st = TPK_OK;
                break;
            }
        }
    next:;
        double next = jit == 0 ? opt->jitter_first * scale : jit * 10;
        if (!(opt->jitter_first > 0) || next > opt->jitter_max * scale * (1 + 1e-12))
            break;
        jit = next;
    }
    tpk_free(ctx, work);
    tpk_free(ctx, iwork);
    if (st == TPK_OK) {
        *jitter = jit;
        *tries = t;
        *rcond = last_rc;
        if (anorm_out)
            *anorm_out = anorm;
        return TPK_OK;
    }
    if (st != TPK_ENUMERIC)
        return st;
    if (last_info == 0 && !(last_ratio >= opt->pivot_ratio_min))
        return TPK_ERROR(ctx, TPK_ENUMERIC,
                         "kernel + noise*I is numerically singular: Cholesky pivots span a ratio "
                         "%.3g < %.3g (condition number >= %.3g) even with jitter %.3g (%.3g x mean "
                         "diagonal, %d tries); raise the noise or the jitter limit", last_ratio,
                         opt->pivot_ratio_min, 1 / (last_ratio * last_ratio), jit, jit / scale, t);
    if (last_info > 0)
        return TPK_ERROR(ctx, TPK_ENUMERIC,
                         "kernel + noise*I is not positive definite: Cholesky fails at column %d "
                         "even with jitter %.3g (%.3g x mean diagonal, %d tries); raise the noise "
                         "or the jitter limit", (int)last_info, jit, jit / scale, t);
    return TPK_ERROR(ctx, TPK_ENUMERIC,
                     "kernel + noise*I is numerically singular: reciprocal condition %.3g < %.3g "
                     "even with jitter %.3g (%.3g x mean diagonal, %d tries); raise the noise or "
                     "the jitter limit", last_rc, opt->rcond_min, jit, jit / scale, t);
}

double tpk_gp_impl_logdet(const double *A, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += log(A[i * n + i]);
    return 2 * s;
}

int tpk_gp_impl_solve(const double *A, size_t n, const tpk_array *Y, size_t c, double *alpha,
                      double *quad, tpk_ctx *ctx)
{
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < c; k++)
            alpha[k * n + i] = Y->data[i * c + k];
    lapack_int info = LAPACKE_dpotrs_work(LAPACK_COL_MAJOR, 'U', (lapack_int)n, (lapack_int)c, A,
                                          (lapack_int)n, alpha, (lapack_int)n);
    if (info != 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "dpotrs failed (info %d, internal error)", (int)info);
    double q = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < c; k++)
            q += alpha[k * n + i] * Y->data[i * c + k];
    *quad = q;
    return TPK_OK;
}

static int check_square(const tpk_array *K, const char *what, tpk_ctx *ctx)
{
    if (!K || !K->data)
        return TPK_ERROR(ctx, TPK_EINVAL, "no %s given", what);
    if (K->ndim != 2 || K->dims[0] != K->dims[1])
        return TPK_ERROR(ctx, TPK_EINVAL, "%s must be a square N×N matrix (got rank %d, %zu×%zu)",
                         what, K->ndim, K->dims[0], K->ndim > 1 ? K->dims[1] : (size_t)1);
    if (K->dims[0] == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s is empty (N = 0)", what);
    return TPK_OK;
}

/* Validate and allocate for the entry point `entry`; kc receives the kernel check (caller
 * frees). */
static tpk_gp *gp_prepare(const char *entry, tpk_array *K, const tpk_array *Y,
                          const tpk_gp_options *opt, gp_kcheck *kc, tpk_ctx *ctx)
{
    size_t c = 0;
    if (check_square(K, "kernel", ctx) || tpk_array_check_finite(K, entry, "K", ctx))
        return NULL;
    const size_t n = K->dims[0];
    if (tpk_gp_impl_check_targets(entry, Y, n, &c, ctx))
        return NULL;
    if (!(opt->jitter_first >= 0) || !(opt->jitter_max >= 0) || !(opt->rcond_min >= 0) ||
        !(opt->sym_tol >= 0) || !(opt->pivot_ratio_min >= 0)) {
        TPK_ERROR(ctx, TPK_EINVAL,
                  "GP options must be >= 0 (jitter, rcond_min, pivot_ratio_min, sym_tol)");
        return NULL;
    }
    if (tpk_gp_impl_check_kernel(K->data, n, opt->sym_tol, "kernel", kc, ctx))
        return NULL;
    tpk_gp *gp = tpk_calloc(ctx, 1, sizeof *gp);
    if (gp != NULL)
        gp->al = tpk_ctx_allocator(ctx);
    if (!gp) {
        tpk_gp_impl_kcheck_free(kc);
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        return NULL;
    }
    gp->n = n;
    gp->c = c;
    gp->info.n = n;
    gp->info.c = c;
    gp->alpha = tpk_malloc(ctx, n * c * sizeof(double));
    if (opt->overwrite_k) {
        gp->A = K->data;
    } else {
        gp->owned = tpk_malloc(ctx, n * n * sizeof(double));
        gp->A = gp->owned;
    }
    if (!gp->alpha || !gp->A) {
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory for the factor (%zu×%zu)", n, n);
        tpk_gp_impl_kcheck_free(kc);
        tpk_gp_free(gp);
        return NULL;
    }
    return gp;
}

/* Factor K + noise·I into gp->A (restoring it first if an earlier factor is there), solve, LML. */
static int gp_factor_solve(tpk_gp *gp, const tpk_array *K, const tpk_array *Y, double noise,
                           const gp_kcheck *kc, const tpk_gp_options *opt, int restore,
                           tpk_ctx *ctx)
{
    tpk_gp_info *in = &gp->info;
    const size_t n = gp->n, c = gp->c;
    in->noise = noise;
    int st = tpk_gp_impl_factor(gp->A, K->data, n, noise, kc, opt, restore, &in->jitter,
                                &in->tries, &in->rcond, &gp->anorm, ctx);
    if (!st)
        st = tpk_gp_impl_solve(gp->A, n, Y, c, gp->alpha, &in->quad, ctx);
    if (st)
        return st;
    in->logdet = tpk_gp_impl_logdet(gp->A, n);
    in->lml = -0.5 * in->quad - 0.5 * (double)c * in->logdet -
              0.5 * (double)(n * c) * log(2 * M_PI);
    return TPK_OK;
}

tpk_gp *tpk_gp_fit(tpk_array *K, const tpk_array *Y, double noise, const tpk_gp_options *opt,
                   tpk_ctx *ctx)
{
    tpk_gp_options def;
    if (!opt) {
        tpk_gp_options_default(&def);
        opt = &def;
    }
    if (tpk_gp_impl_check_noise(noise, ctx))
        return NULL;
    gp_kcheck kc = {0};
    tpk_gp *gp = gp_prepare("tpk_gp_fit", K, Y, opt, &kc, ctx);
    if (!gp)
        return NULL;
    int st = noise == 0 ? check_interpolable(K, Y, opt, ctx) : TPK_OK;
    if (!st)
        st = gp_factor_solve(gp, K, Y, noise, &kc, opt, 0, ctx);
    tpk_gp_impl_kcheck_free(&kc);
    if (!st && gp->info.jitter > noise)
        st = check_interpolant(gp, Y, opt, ctx);
    if (st) {
        tpk_gp_free(gp);
        return NULL;
    }
    return gp;
}

/* LML of the fitted model, with the scale s profiled out when fit_scale (cov s·A, s = quad/(NC)). */
static double model_lml(const tpk_gp_info *in, int fit_scale, double *scale)
{
    const double nc = (double)(in->n * in->c);
    if (!fit_scale) {
        *scale = 1;
        return in->lml;
    }
    *scale = in->quad / nc;
    return -0.5 * nc * (1 + log(2 * M_PI * *scale)) - 0.5 * (double)in->c * in->logdet;
}

/* Vertex of the parabola through three points (x1 < x2 < x3, f2 the largest); x2 if degenerate. */
static double parabola_vertex(double x1, double f1, double x2, double f2, double x3, double f3)
{
    const double a = (x2 - x1) * (f2 - f3), b = (x2 - x3) * (f2 - f1);
    const double den = a - b;
    if (!(fabs(den) > 0))
        return x2;
    double v = x2 - 0.5 * ((x2 - x1) * a - (x2 - x3) * b) / den;
    return v > x1 && v < x3 ? v : x2;
}

static int check_walk(double guess, double step, int max_fits, tpk_ctx *ctx)
{
    if (!(guess > 0) || !isfinite(guess) || !(step > 0) || !isfinite(step) || max_fits < 1)
        return TPK_ERROR(ctx, TPK_EINVAL, "noise search needs guess > 0, step > 0 and max_fits "
                         ">= 1 (got %g, %g, %d)", guess, step, max_fits);
    return TPK_OK;
}

int tpk_gp_noise_walk(tpk_gp_noise_eval_fn eval, void *data, double guess, double step,
                      int max_fits, int fit_scale, tpk_gp_noise_choice *out, tpk_ctx *ctx)
{
    int st = check_walk(guess, step, max_fits, ctx);
    if (st)
        return st;
    /* The walk is in x = log10 σ²; sc receives the profiled scale of each fit. */
    tpk_gp_info in = {0};
    double sc;
    int fits = 0;
    double last_x = NAN;
    const double h = step;
#define EVAL(x_, f_)                                                                               \
    do {                                                                                           \
        st = eval(pow(10, (x_)), data, &in, ctx);                                                  \
        in.lml = -0.5 * in.quad - 0.5 * (double)in.c * in.logdet -                                 \
                 0.5 * (double)(in.n * in.c) * log(2 * M_PI);                                      \
        fits++;                                                                                    \
        last_x = (x_);                                                                             \
        (f_) = st ? -INFINITY : model_lml(&in, fit_scale, &sc);                                    \
    } while (0)
    /* Evaluate c0 − h and c0 + h first and the guess c0 last, so that when the guess is the
     * best of the three (the usual case with a good guess) its fit is the one left in place. */
    const double c0 = log10(guess);
    double lo = c0 - h, hi = c0 + h, mid = c0, flo = -INFINITY, fhi = -INFINITY, fmid;
    if (max_fits >= 3) {
        EVAL(lo, flo);
        if (!st)
            EVAL(hi, fhi);
        if (st)
            return st;
    }
    EVAL(mid, fmid);
    if (st)
        return st;
    /* Walk uphill in steps of h until the LML falls. */
    int dir = flo > fmid && flo >= fhi ? -1 : fhi > fmid ? +1 : 0;
    if (dir < 0) { hi = mid; fhi = fmid; mid = lo; fmid = flo; }
    if (dir > 0) { lo = mid; flo = fmid; mid = hi; fmid = fhi; }
    while (dir && fits < max_fits) {
        double x = mid + dir * h, f;
        EVAL(x, f);
        if (st)
            return st;
        if (f > fmid) { /* keep walking */
            if (dir < 0) { hi = mid; fhi = fmid; }
            else { lo = mid; flo = fmid; }
            mid = x; fmid = f;
            continue;
        }
        if (dir < 0) { lo = x; flo = f; }
        else { hi = x; fhi = f; }
        break;
    }
    out->at_bound = !(isfinite(flo) && isfinite(fhi) && flo < fmid && fhi < fmid);
    double best = mid;
    if (!out->at_bound && fits < max_fits) {
        double v = parabola_vertex(lo, flo, mid, fmid, hi, fhi);
        /* Worth a fit only if it moves the noise by more than GP_VERTEX_MIN decades (or the
         * fit in place is not the best point's anyway). */
        if (fabs(v - mid) > GP_VERTEX_MIN || last_x != mid) {
            double fv;
            EVAL(v, fv);
            if (st)
                return st;
            if (fv >= fmid) {
                best = v;
                fmid = fv;
            }
        }
    }
    if (last_x != best) {
        double f;
        EVAL(best, f);
        (void)f;
        if (st)
            return st;
    }
#undef EVAL
    out->lml = model_lml(&in, fit_scale, &out->scale);
    out->noise = pow(10, best) * out->scale;
    out->fits = fits;
    return TPK_OK;
}

/* tpk_gp_fit_search_noise's fits: the factor of K + noise·I in the one tpk_gp, restored from K
 * before every fit but the first. */
typedef struct search_arg {
    tpk_gp *gp;
    const tpk_array *K, *Y;
    const gp_kcheck *kc;
    const tpk_gp_options *opt;
    int fits;
} search_arg;

static int search_eval(double noise, void *data, tpk_gp_info *info, tpk_ctx *ctx)
{
    search_arg *a = data;
    int st = gp_factor_solve(a->gp, a->K, a->Y, noise, a->kc, a->opt, a->fits++ > 0, ctx);
    if (!st)
        *info = a->gp->info;
    return st;
}

tpk_gp *tpk_gp_fit_search_noise(tpk_array *K, const tpk_array *Y, double guess, double step,
                                int max_fits, int fit_scale, const tpk_gp_options *opt,
                                tpk_gp_noise_choice *out, tpk_ctx *ctx)
{
    tpk_gp_options def;
    if (!opt) {
        tpk_gp_options_default(&def);
        opt = &def;
    }
    if (check_walk(guess, step, max_fits, ctx))
        return NULL;
    gp_kcheck kc = {0};
    tpk_gp *gp = gp_prepare("tpk_gp_fit_search_noise", K, Y, opt, &kc, ctx);
    if (!gp)
        return NULL;
    search_arg a = {.gp = gp, .K = K, .Y = Y, .kc = &kc, .opt = opt};
    int st = tpk_gp_noise_walk(search_eval, &a, guess, step, max_fits, fit_scale, out, ctx);
    tpk_gp_impl_kcheck_free(&kc);
    if (st) {
        tpk_gp_free(gp);
        return NULL;
    }
    return gp;
}

void tpk_gp_free(tpk_gp *gp)
{
    if (!gp)
        return;
    tpk_allocator al = gp->al;
    tpk_mem_free(&al, gp->owned);
    tpk_mem_free(&al, gp->alpha);
    tpk_mem_free(&al, gp);
}

const tpk_gp_info *tpk_gp_get_info(const tpk_gp *gp) { return &gp->info; }

int tpk_gp_weights(const tpk_gp *gp, tpk_array *alpha, tpk_ctx *ctx)
{
    if (!alpha || tpk_array_size(alpha) != gp->n * gp->c || alpha->dims[0] != gp->n)
        return TPK_ERROR(ctx, TPK_EINVAL, "weights output must be %zu×%zu", gp->n, gp->c);
    for (size_t i = 0; i < gp->n; i++)
        for (size_t k = 0; k < gp->c; k++)
            alpha->data[i * gp->c + k] = gp->alpha[k * gp->n + i];
    return TPK_OK;
}

static int check_cross(const char *entry, const tpk_gp *gp, const tpk_array *Kxt, size_t *m,
                       tpk_ctx *ctx)
{
    if (!Kxt || !Kxt->data)
        return TPK_ERROR(ctx, TPK_EINVAL, "no test×train kernel given");
    if (Kxt->ndim != 2 || Kxt->dims[1] != gp->n)
        return TPK_ERROR(ctx, TPK_EINVAL,
                         "test×train kernel must be M×%zu (the training size) but is %s%zu×%zu",
                         gp->n, Kxt->ndim != 2 ? "not a matrix, " : "", Kxt->dims[0],
                         Kxt->ndim > 1 ? Kxt->dims[1] : (size_t)1);
    *m = Kxt->dims[0];
    return tpk_array_check_finite(Kxt, entry, "Kxt", ctx);
}

/* Test item i: prior variance d, of which the training points explain s (GP_VAR_RTOL). */
static int check_variance(size_t i, double d, double s, tpk_ctx *ctx)
{
    if (!(d - s < -GP_VAR_RTOL * fmax(fabs(d), s)))
        return TPK_OK;
    return TPK_ERROR(ctx, TPK_EDOM, "test item %zu: its prior variance k(x,x) = %.6g is below "
                     "the %.6g that its covariances with the training items imply: the test "
                     "kernel (test x train, test diagonal) is not the training kernel's "
                     "covariance (their joint matrix is not PSD)", i, d, s);
}

int tpk_gp_predict(const tpk_gp *gp, const tpk_array *Kxt, const tpk_array *kdiag,
                   tpk_array *mean, tpk_array *var, tpk_ctx *ctx)
{
    size_t m = 0;
    if (!gp)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_gp_predict: no fitted GP");
    const size_t n = gp->n, c = gp->c;
    int st = check_cross("tpk_gp_predict", gp, Kxt, &m, ctx);
    if (st)
        return st;
    if (!mean || !mean->data || mean->dims[0] != m || tpk_array_size(mean) != m * c)
        return TPK_ERROR(ctx, TPK_EINVAL, "mean output must be %zu×%zu", m, c);
    if (var) {
        if (!kdiag || !kdiag->data || tpk_array_size(kdiag) != m)
            return TPK_ERROR(ctx, TPK_EINVAL, "test diagonal must have %zu entries (got %zu)", m,
                             kdiag && kdiag->data ? tpk_array_size(kdiag) : (size_t)0);
        if (!var->data || tpk_array_size(var) != m)
            return TPK_ERROR(ctx, TPK_EINVAL, "variance output must have %zu entries", m);
        if ((st = tpk_array_check_finite(kdiag, "tpk_gp_predict", "kdiag", ctx)))
            return st;
    }
    if (m == 0)
        return TPK_OK;
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)c, (int)n, 1.0, Kxt->data,
                (int)n, gp->alpha, (int)n, 0.0, mean->data, (int)c);
    if (!var)
        return TPK_OK;
    const size_t bs = m < GP_PRED_BLOCK ? m : GP_PRED_BLOCK;
    double *W = tpk_malloc(ctx, n * bs * sizeof *W);
    if (!W)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (%zu×%zu workspace)", n, bs);
    for (size_t i0 = 0; i0 < m; i0 += bs) {
        size_t b = m - i0 < bs ? m - i0 : bs;
        /* Rows i0.. of the row-major Kxt are the columns of a column-major N×b block. */
        memcpy(W, Kxt->data + i0 * n, b * n * sizeof *W);
        cblas_dtrsm(CblasColMajor, CblasLeft, CblasUpper, CblasTrans, CblasNonUnit, (int)n, (int)b,
                    1.0, gp->A, (int)n, W, (int)n);
        for (size_t j = 0; j < b; j++) {
            double s = cblas_ddot((int)n, W + j * n, 1, W + j * n, 1), d = kdiag->data[i0 + j];
            if ((st = check_variance(i0 + j, d, s, ctx)))
                break;
            var->data[i0 + j] = fmax(d - s, 0.0);
        }
        if (st)
            break;
    }
    tpk_free(ctx, W);
    return st;
}

int tpk_gp_predict_cov(const tpk_gp *gp, const tpk_array *Kxt, const tpk_array *Ktt,
                       tpk_array *cov, tpk_ctx *ctx)
{
    size_t m = 0;
    if (!gp)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_gp_predict_cov: no fitted GP");
    const size_t n = gp->n;
    int st = check_cross("tpk_gp_predict_cov", gp, Kxt, &m, ctx);
    if (st)
        return st;
    if (!Ktt || !Ktt->data || Ktt->ndim != 2 || Ktt->dims[0] != m || Ktt->dims[1] != m)
        return TPK_ERROR(ctx, TPK_EINVAL, "test×test kernel must be %zu×%zu", m, m);
    if (!cov || !cov->data || cov->ndim != 2 || cov->dims[0] != m || cov->dims[1] != m)
        return TPK_ERROR(ctx, TPK_EINVAL, "covariance output must be %zu×%zu", m, m);
    if ((st = tpk_array_check_finite(Ktt, "tpk_gp_predict_cov", "Ktt", ctx)))
        return st;
    if (m == 0)
        return TPK_OK;
    double *W = tpk_malloc(ctx, n * m * sizeof *W);
    if (!W)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (%zu×%zu workspace)", n, m);
    memcpy(W, Kxt->data, n * m * sizeof *W);
    cblas_dtrsm(CblasColMajor, CblasLeft, CblasUpper, CblasTrans, CblasNonUnit, (int)n, (int)m,
                1.0, gp->A, (int)n, W, (int)n);
    if (cov->data != Ktt->data)
        memcpy(cov->data, Ktt->data, m * m * sizeof(double));
    /* Column-major upper of cov = row-major lower: cov ← Ktt − WᵀW there, then mirror. */
    for (size_t i = 0; i < m && !st; i++) /* the diagonal, as tpk_gp_predict checks it */
        st = check_variance(i, Ktt->data[i * m + i],
                            cblas_ddot((int)n, W + i * n, 1, W + i * n, 1), ctx);
    if (st) {
        tpk_free(ctx, W);
        return st;
    }
    cblas_dsyrk(CblasColMajor, CblasUpper, CblasTrans, (int)m, (int)n, -1.0, W, (int)n, 1.0,
                cov->data, (int)m);
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < i; j++)
            cov->data[j * m + i] = cov->data[i * m + j];
    tpk_free(ctx, W);
    return TPK_OK;
}

int tpk_gp_rcond(const tpk_gp *gp, double *rcond, tpk_ctx *ctx)
{
    const size_t n = gp->n;
    double *work = tpk_malloc(ctx, (3 * n + 1) * sizeof *work);
    lapack_int *iwork = tpk_malloc(ctx, (n + 1) * sizeof *iwork);
    int st = TPK_OK;
    if (!work || !iwork) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (condition estimate workspace)");
    } else {
        lapack_int info = LAPACKE_dpocon_work(LAPACK_COL_MAJOR, 'U', (lapack_int)n, gp->A,
                                              (lapack_int)n, gp->anorm, rcond, work, iwork);
        if (info != 0)
            st = TPK_ERROR(ctx, TPK_ENUMERIC, "dpocon failed (info %d)", (int)info);
    }
    tpk_free(ctx, work);
    tpk_free(ctx, iwork);
    return st;
}

int tpk_gp_min_eig(const tpk_gp *gp, int iters, double *lambda_min, tpk_ctx *ctx)
{
    if (iters < 1)
        return TPK_ERROR(ctx, TPK_EINVAL, "min_eig needs at least 1 iteration (got %d)", iters);
    const size_t n = gp->n;
    const size_t k = (size_t)iters < n ? (size_t)iters : n;
    /* Lanczos on A⁻¹ (each step one solve with the factor, O(N²)), full reorthogonalisation:
     * its largest Ritz value is a lower bound on λ_max(A⁻¹) = 1/λ_min(A) that converges fast
     * even when the small eigenvalues of K cluster (Golub & Van Loan §10.1). */
    double *V = tpk_calloc(ctx, (k + 1) * n, sizeof *V), *al = tpk_malloc(ctx, k * sizeof *al);
    double *be = tpk_malloc(ctx, (k + 1) * sizeof *be);
    if (!V || !al || !be) {
        tpk_free(ctx, V);
        tpk_free(ctx, al);
        tpk_free(ctx, be);
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (%zu Lanczos vectors)", k + 1);
    }
    /* Deterministic start with weight in every direction: a centred low-discrepancy sequence. */
    for (size_t i = 0; i < n; i++)
        V[i] = fmod(0.6180339887498949 * (double)(i + 1), 1.0) - 0.5;
    cblas_dscal((int)n, 1.0 / cblas_dnrm2((int)n, V, 1), V, 1);
    size_t steps = 0;
    for (size_t j = 0; j < k; j++) {
        double *w = V + (j + 1) * n;
        memcpy(w, V + j * n, n * sizeof *w);
        LAPACKE_dpotrs_work(LAPACK_COL_MAJOR, 'U', (lapack_int)n, 1, gp->A, (lapack_int)n, w,
                            (lapack_int)n);
        al[j] = cblas_ddot((int)n, w, 1, V + j * n, 1);
        for (int pass = 0; pass < 2; pass++) /* twice is enough (Parlett's "twice is enough") */
            for (size_t i = 0; i <= j; i++)
                cblas_daxpy((int)n, -cblas_ddot((int)n, w, 1, V + i * n, 1), V + i * n, 1, w, 1);
        steps = j + 1;
        be[j] = cblas_dnrm2((int)n, w, 1);
        if (!(be[j] > 1e-14 * fabs(al[j])))
            break; /* invariant subspace found */
        cblas_dscal((int)n, 1.0 / be[j], w, 1);
    }
    /* Largest eigenvalue of the steps×steps tridiagonal (al, be). */
    lapack_int info = LAPACKE_dstev(LAPACK_COL_MAJOR, 'N', (lapack_int)steps, al, be, NULL, 1);
    double top = al[steps - 1];
    tpk_free(ctx, V);
    tpk_free(ctx, al);
    tpk_free(ctx, be);
    if (info != 0)
        return TPK_ERROR(ctx, TPK_ENUMERIC, "tridiagonal eigensolver failed (info %d)", (int)info);
    *lambda_min = 1.0 / top - gp->info.noise - gp->info.jitter;
    return TPK_OK;
}
