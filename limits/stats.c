/* Kernel errors, bias/fluctuation, kurtosis, 1-D W1 to a Gaussian and two-sample distances
 * (theory.md §7.2, §7.3, §7.5). */
#include "tpk/limits.h"
#include "tpk/alloc.h"

/* OpenBLAS cblas.h first, then keep GSL's gsl_cblas.h out (they declare the same enums). */
#include <cblas.h>
#define __GSL_CBLAS_H__
#include <gsl/gsl_cdf.h>
#include <gsl/gsl_sort.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "limits-impl.h"

int tpk_limits_frob_rel(const double *Khat, const double *K, size_t len, double *out,
                        tpk_ctx *ctx)
{
    if (!Khat || !K || !out || len == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_limits_frob_rel: NULL argument or empty kernel");
    double num = 0, den = 0;
    for (size_t i = 0; i < len; i++) {
        double d = Khat[i] - K[i];
        num += d * d;
        den += K[i] * K[i];
    }
    /* in the user's terms: these reach gplimits' messages (issue 18) */
    if (!isfinite(num) || !isfinite(den))
        return TPK_ERROR(ctx, TPK_EDOM, "relative kernel error: a kernel entry is not finite "
                         "(or their squares overflow)");
    if (den == 0)
        return TPK_ERROR(ctx, TPK_EDOM, "relative kernel error: the limit kernel is zero, so the "
                         "error relative to it is undefined");
    *out = sqrt(num / den);
    return TPK_OK;
}

double tpk_limits_rms(const double *e, size_t S)
{
    if (S == 0)
        return NAN;
    double s2 = 0;
    for (size_t s = 0; s < S; s++)
        s2 += e[s] * e[s];
    return sqrt(s2 / (double)S);
}

int tpk_limits_bias(const double *Khat, size_t S, size_t len, const double *K,
                    tpk_limits_bias_result *out, tpk_ctx *ctx)
{
    if (!Khat || !K || !out || len == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_limits_bias: NULL argument or empty kernel");
    if (S < 2)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_limits_bias: needs at least 2 seeds, got %zu", S);
    double dev2 = 0, tr = 0, kk = 0;
    for (size_t i = 0; i < len; i++) {
        /* Welford per entry: the spread is ~n^{-1/2} of the mean, so the naive
         * Σx² − (Σx)²/S would lose most digits at large n. */
        double mean = 0, m2 = 0;
        for (size_t s = 0; s < S; s++) {
            double x = Khat[s * len + i], d = x - mean;
            mean += d / (double)(s + 1);
            m2 += d * (x - mean);
        }
        double b = mean - K[i];
        dev2 += b * b;
        tr += m2 / (double)(S - 1);
        kk += K[i] * K[i];
    }
    if (!isfinite(dev2) || !isfinite(tr) || !isfinite(kk))
        return TPK_ERROR(ctx, TPK_EDOM, "tpk_limits_bias: non-finite kernel entry");
    if (kk == 0)
        return TPK_ERROR(ctx, TPK_EDOM, "tpk_limits_bias: the limit kernel is zero");
    out->bias = sqrt(dev2 / kk);
    out->bias2_debiased = (dev2 - tr / (double)S) / kk;
    out->bias_debiased = sqrt(fmax(out->bias2_debiased, 0.0));
    out->floor = sqrt(tr / (double)S / kk);
    out->fluct = sqrt(tr / kk);
    return TPK_OK;
}

int tpk_limits_kurtosis(const double *x, size_t M, double *out, tpk_ctx *ctx)
{
    if (!x || !out)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_limits_kurtosis: NULL argument");
    if (M < 4)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_limits_kurtosis: needs at least 4 samples, got %zu",
                         M);
    double mean = 0;
    for (size_t i = 0; i < M; i++)
        mean += x[i];
    mean /= (double)M;
    double m2 = 0, m4 = 0;
    for (size_t i = 0; i < M; i++) {
        double d = (x[i] - mean) * (x[i] - mean);
        m2 += d;
        m4 += d * d;
    }
    m2 /= (double)M;
    m4 /= (double)M;
    if (!(m2 > 0) || !isfinite(m4))
        return TPK_ERROR(ctx, TPK_EDOM, "tpk_limits_kurtosis: zero or non-finite variance");
    *out = m4 / (m2 * m2) - 3.0;
    return TPK_OK;
}

int tpk_limits_w1_gauss_samples(const double *x, size_t M, double var, double *out, tpk_ctx *ctx)
{
    tpk_error_gsl_init(); /* GSL failures as return codes, never abort() (tpk/error.h) */
    if (!x || !out || M == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_limits_w1_gauss_samples: NULL or empty sample");
    if (!(var >= 0) || !isfinite(var))
        return TPK_ERROR(ctx, TPK_EDOM, "tpk_limits_w1_gauss_samples: variance %g", var);
    double *y = tpk_malloc(ctx, M * sizeof *y);
    if (!y)
        return TPK_ERROR(ctx, TPK_ENOMEM, "tpk_limits_w1_gauss_samples: out of memory");
    memcpy(y, x, M * sizeof *y);
    gsl_sort(y, 1, M);
    double sd = sqrt(var), acc = 0;
    for (size_t i = 0; i < M; i++)
        acc += fabs(y[i] - sd * gsl_cdf_ugaussian_Pinv(((double)i + 0.5) / (double)M));
    tpk_free(ctx, y);
    if (!isfinite(acc))
        return TPK_ERROR(ctx, TPK_EDOM, "tpk_limits_w1_gauss_samples: non-finite sample");
    *out = acc / (double)M;
    return TPK_OK;
}

static double dist(const double *a, const double *b, size_t k)
{
    double s = 0;
    for (size_t j = 0; j < k; j++)
        s += (a[j] - b[j]) * (a[j] - b[j]);
    return s;
}

/* Mean of g(|x−y|²) within one sample (i ≠ j, U-statistic) or across two samples. */
typedef double (*pair_fn)(double d2, double h);
static double g_dist(double d2, double h)
{
    (void)h;
    return sqrt(d2);
}
static double g_gauss(double d2, double h)
{
    return exp(-d2 / (2 * h * h));
}

static double mean_within(const double *X, size_t M, size_t k, pair_fn g, double h)
{
    double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(dynamic, 16)
    for (size_t i = 0; i < M; i++)
        for (size_t j = i + 1; j < M; j++)
            s += g(dist(X + i * k, X + j * k, k), h);
    return 2 * s / ((double)M * (double)(M - 1));
}

static double mean_across(const double *X, size_t M, const double *Y, size_t P, size_t k,
                          pair_fn g, double h)
{
    double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(dynamic, 16)
    for (size_t i = 0; i < M; i++)
        for (size_t j = 0; j < P; j++)
            s += g(dist(X + i * k, Y + j * k, k), h);
    return s / ((double)M * (double)P);
}

static int two_sample_check(const char *fn, const double *X, size_t M, const double *Y, size_t P,
                            size_t k, const double *out, tpk_ctx *ctx)
{
    if (!X || !Y || !out || k == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: NULL argument or zero dimension", fn);
    if (M < 2 || P < 2)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: needs at least 2 samples on each side (%zu, %zu)",
                         fn, M, P);
    return TPK_OK;
}

int tpk_limits_energy(const double *X, size_t M, const double *Y, size_t P, size_t k, double *out,
                      tpk_ctx *ctx)
{
    int st = two_sample_check("tpk_limits_energy", X, M, Y, P, k, out, ctx);
    if (st)
        return st;
    double e = 2 * mean_across(X, M, Y, P, k, g_dist, 0) - mean_within(X, M, k, g_dist, 0) -
               mean_within(Y, P, k, g_dist, 0);
    if (!isfinite(e))
        return TPK_ERROR(ctx, TPK_EDOM, "tpk_limits_energy: non-finite sample");
    *out = e;
    return TPK_OK;
}

int tpk_limits_mmd2(const double *X, size_t M, const double *Y, size_t P, size_t k, double h,
                    double *out, tpk_ctx *ctx)
{
    int st = two_sample_check("tpk_limits_mmd2", X, M, Y, P, k, out, ctx);
    if (st)
        return st;
    if (!(h > 0) || !isfinite(h))
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_limits_mmd2: bandwidth must be > 0, got %g", h);
    double e = mean_within(X, M, k, g_gauss, h) + mean_within(Y, P, k, g_gauss, h) -
               2 * mean_across(X, M, Y, P, k, g_gauss, h);
    if (!isfinite(e))
        return TPK_ERROR(ctx, TPK_EDOM, "tpk_limits_mmd2: non-finite sample");
    *out = e;
    return TPK_OK;
}
