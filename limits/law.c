/* Distances between the finite-width output law and the GP (theory.md §7.5): Rao–Blackwellised
 * W1 of Gaussian scale mixtures by 1-D quadrature, its resampling noise floor, sliced versions
 * over several inputs, and the sample-based sliced W1 with its GP-vs-GP floor. */
#include "tpk/limits.h"
#include "tpk/alloc.h"

/* OpenBLAS cblas.h first, then keep GSL's gsl_cblas.h out (they declare the same enums). */
#include <cblas.h>
#define __GSL_CBLAS_H__
#include <gsl/gsl_eigen.h>
#include <gsl/gsl_errno.h>
#include <gsl/gsl_integration.h>
#include <gsl/gsl_matrix.h>
#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "limits-impl.h"

/* Scan points on [0, T] used to bracket the sign changes of F_a − F_b before integrating. A
 * scale mixture and a Gaussian cross a few times (≈ at ±√3σ for a pure variance spread); missed
 * double crossings inside one cell only cost qag more subdivisions, not accuracy. */
#define SCAN_POINTS 96
/* T = TAIL_SIGMAS × largest standard deviation: Φ̄(9) ≈ 1e-19, far below any W1 we resolve. */
#define TAIL_SIGMAS 9.0
#define BISECT_STEPS 48
#define QAG_LIMIT 200
/* Relative accuracy asked of qag; the integrand is a difference of O(1) CDFs computed from
 * erfc, good to ~1e-16 absolute, so 1e-9 relative to a W1 of 1e-6·σ is still reachable. */
#define QAG_EPSREL 1e-9

/* Up to this many seeds the bootstrap's statistics (called once per replicate and width) keep
 * their per-seed buffers on the stack: no allocation in that loop (style.md §5). */
#define SMALL_S 64

/* One side of the comparison: Σ w_i N(0, sd_i²), weights normalised, only w_i > 0 kept. */
typedef struct mixture {
    size_t n;
    double *inv;  /* 1/(sd_i √2); 0 marks sd_i = 0 (a point mass at 0) */
    double *w;
    double sdmax;
    double small[2 * SMALL_S]; /* inv and w of a mixture of at most SMALL_S components */
} mixture;

static void mixture_free(mixture *m, tpk_ctx *ctx)
{
    if (m->inv != m->small)
        tpk_free(ctx, m->inv);
    if (m->w != m->small + SMALL_S)
        tpk_free(ctx, m->w);
    m->inv = m->w = NULL;
}

static int mixture_init(mixture *m, const double *v, const double *w, size_t n, const char *fn,
                        tpk_ctx *ctx)
{
    m->n = 0;
    m->sdmax = 0;
    if (n <= SMALL_S) {
        m->inv = m->small;
        m->w = m->small + SMALL_S;
    } else {
        m->inv = tpk_malloc(ctx, n * sizeof *m->inv);
        m->w = tpk_malloc(ctx, n * sizeof *m->w);
    }
    if (!m->inv || !m->w) {
        mixture_free(m, ctx);
        return TPK_ERROR(ctx, TPK_ENOMEM, "%s: out of memory", fn);
    }
    double wsum = 0;
    for (size_t i = 0; i < n; i++) {
        double wi = w ? w[i] : 1.0;
        if (!(v[i] >= 0) || !isfinite(v[i]) || !(wi >= 0) || !isfinite(wi)) {
            mixture_free(m, ctx);
            return TPK_ERROR(ctx, TPK_EDOM, "%s: component %zu has variance %g, weight %g", fn, i,
                             v[i], wi);
        }
        if (wi == 0)
            continue;
        double sd = sqrt(v[i]);
        m->inv[m->n] = sd > 0 ? 1.0 / (sd * M_SQRT2) : 0.0;
        m->w[m->n] = wi;
        m->n++;
        wsum += wi;
        m->sdmax = fmax(m->sdmax, sd);
    }
    if (m->n == 0) {
        mixture_free(m, ctx);
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: mixture with no positive weight", fn);
    }
    for (size_t i = 0; i < m->n; i++)
        m->w[i] /= wsum;
    return TPK_OK;
}


/* Upper tail P(X > t), t > 0, from erfc so that it keeps its relative accuracy far out. */
static double mixture_tail(const mixture *m, double t)
{
    double q = 0;
    for (size_t i = 0; i < m->n; i++)
        if (m->inv[i] > 0)
            q += m->w[i] * erfc(t * m->inv[i]);
    return 0.5 * q;
}

typedef struct pair {
    const mixture *a, *b;
} pair;

/* F_a(t) − F_b(t) = Q_b(t) − Q_a(t) for t > 0. */
static double cdf_diff(double t, const pair *p)
{
    return mixture_tail(p->b, t) - mixture_tail(p->a, t);
}

static double abs_diff(double t, void *user)
{
    return fabs(cdf_diff(t, user));
}

/* ∫_lo^hi |F_a − F_b| by qag; workspace passed in. */
static int integrate(const pair *p, double lo, double hi, double epsabs,
                     gsl_integration_workspace *ws, double *acc, tpk_ctx *ctx)
{
    gsl_function F = {abs_diff, (void *)p};
    double r, e;
    int st = gsl_integration_qag(&F, lo, hi, epsabs, QAG_EPSREL, QAG_LIMIT, GSL_INTEG_GAUSS21, ws,
                                 &r, &e);
    /* EROUND: the requested accuracy is below the integrand's rounding noise; r is as good as
     * the integrand allows, so keep it. */
    if (st != GSL_SUCCESS && st != GSL_EROUND)
        return TPK_ERROR(ctx, TPK_ENUMERIC, "W1 quadrature on [%g, %g] failed: %s", lo, hi,
                         gsl_strerror(st));
    *acc += r;
    return TPK_OK;
}

static int w1_core(const mixture *a, const mixture *b, double *out, tpk_ctx *ctx)
{
    tpk_error_gsl_init(); /* GSL failures as return codes, never abort() (tpk/error.h) */
    pair p = {a, b};
    double T = TAIL_SIGMAS * fmax(a->sdmax, b->sdmax);
    if (!(T > 0)) {
        *out = 0; /* both are point masses at 0 */
        return TPK_OK;
    }
    gsl_integration_workspace *ws = gsl_integration_workspace_alloc(QAG_LIMIT);
    if (!ws)
        return TPK_ERROR(ctx, TPK_ENOMEM, "W1 quadrature: out of memory");
    /* Absolute target: far below the O(1e-6 σ) distances of interest, above rounding. */
    double epsabs = 1e-15 * T;
    double acc = 0, lo = 0, tprev = 0, gprev = 0;
    int st = TPK_OK;
    for (int j = 1; j <= SCAN_POINTS && st == TPK_OK; j++) {
        double t = T * j / SCAN_POINTS, g = cdf_diff(t, &p);
        if (j > 1 && ((g > 0 && gprev < 0) || (g < 0 && gprev > 0))) {
            double l = tprev, h = t, gl = gprev;
            for (int it = 0; it < BISECT_STEPS; it++) {
                double mid = 0.5 * (l + h), gm = cdf_diff(mid, &p);
                if ((gm > 0) == (gl > 0)) {
                    l = mid;
                    gl = gm;
                } else {
                    h = mid;
                }
            }
            double root = 0.5 * (l + h);
            st = integrate(&p, lo, root, epsabs, ws, &acc, ctx);
            lo = root;
        }
        if (g != 0) {
            tprev = t;
            gprev = g;
        }
    }
    if (st == TPK_OK)
        st = integrate(&p, lo, T, epsabs, ws, &acc, ctx);
    gsl_integration_workspace_free(ws);
    if (st == TPK_OK)
        *out = 2 * acc; /* both laws are symmetric about 0 */
    return st;
}

int tpk_limits_w1_mixtures(const double *va, const double *wa, size_t na, const double *vb,
                           const double *wb, size_t nb, double *out, tpk_ctx *ctx)
{
    static const char fn[] = "tpk_limits_w1_mixtures";
    if (!va || !vb || !out)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: NULL argument", fn);
    mixture a, b;
    int st = mixture_init(&a, va, wa, na, fn, ctx);
    if (st)
        return st;
    st = mixture_init(&b, vb, wb, nb, fn, ctx);
    if (st) {
        mixture_free(&a, ctx);
        return st;
    }
    st = w1_core(&a, &b, out, ctx);
    mixture_free(&a, ctx);
    mixture_free(&b, ctx);
    return st;
}

int tpk_limits_rbw1(const double *v, size_t S, double v_inf, double *out, tpk_ctx *ctx)
{
    return tpk_limits_w1_mixtures(v, NULL, S, &v_inf, NULL, 1, out, ctx);
}

int tpk_limits_rbw1_floor(const double *v, size_t S, size_t B, uint64_t seed, double *out,
                          tpk_ctx *ctx)
{
    tpk_error_gsl_init();
    if (!v || !out || S < 2 || B == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_limits_rbw1_floor: NULL argument, S < 2 or B = 0");
    /* Per-replicate values summed in order afterwards: the result does not depend on the thread
     * count (a reduction would change the last bits). */
    double *val = tpk_calloc(ctx, B, sizeof *val);
    if (!val)
        return TPK_ERROR(ctx, TPK_ENOMEM, "tpk_limits_rbw1_floor: out of memory");
    int st = TPK_OK;
#pragma omp parallel
    {
        gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
        double *cnt = tpk_malloc(ctx, S * sizeof *cnt);
        size_t *idx = tpk_malloc(ctx, S * sizeof *idx);
        tpk_ctx lctx;
        tpk_ctx_init_from(&lctx, ctx);
        if (!r || !cnt || !idx)
            TPK_ERROR(&lctx, TPK_ENOMEM, "tpk_limits_rbw1_floor: out of memory");
#pragma omp for schedule(dynamic, 4)
        for (size_t b = 0; b < B; b++) {
            if (lctx.status)
                continue;
            gsl_rng_set(r, (unsigned long)tpk_limits_mix64(seed ^ tpk_limits_mix64(b)));
            for (size_t i = 0; i < S; i++)
                idx[i] = gsl_rng_uniform_int(r, S);
            tpk_limits_counts(idx, S, cnt);
            tpk_limits_w1_mixtures(v, cnt, S, v, NULL, S, &val[b], &lctx);
        }
#pragma omp critical(tpk_limits_floor_err)
        if (lctx.status && st == TPK_OK)
            st = TPK_ERROR(ctx, lctx.status, "%s", lctx.msg);
        gsl_rng_free(r);
        tpk_free(ctx, cnt);
        tpk_free(ctx, idx);
    }
    double sum = 0;
    for (size_t b = 0; b < B; b++)
        sum += val[b];
    tpk_free(ctx, val);
    if (st == TPK_OK)
        *out = sum / (double)B;
    return st;
}

int tpk_limits_directions(size_t k, size_t L, uint64_t seed, double *theta, tpk_ctx *ctx)
{
    tpk_error_gsl_init();
    if (!theta || k == 0 || L == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_limits_directions: NULL output or zero size");
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    if (!r)
        return TPK_ERROR(ctx, TPK_ENOMEM, "tpk_limits_directions: out of memory");
    gsl_rng_set(r, (unsigned long)tpk_limits_mix64(seed));
    for (size_t l = 0; l < L; l++) {
        double nrm;
        do {
            nrm = 0;
            for (size_t j = 0; j < k; j++) {
                theta[l * k + j] = gsl_ran_gaussian(r, 1.0);
                nrm += theta[l * k + j] * theta[l * k + j];
            }
        } while (nrm < 1e-20);
        for (size_t j = 0; j < k; j++)
            theta[l * k + j] /= sqrt(nrm);
    }
    gsl_rng_free(r);
    return TPK_OK;
}

static double weighted_mean(const double *v, const double *w, size_t n)
{
    double s = 0, sw = 0;
    for (size_t i = 0; i < n; i++) {
        double wi = w ? w[i] : 1.0;
        s += wi * v[i];
        sw += wi;
    }
    return s / sw;
}

static double quad_form(const double *th, const double *K, size_t k)
{
    double s = 0;
    for (size_t i = 0; i < k; i++)
        for (size_t j = 0; j < k; j++)
            s += th[i] * K[i * k + j] * th[j];
    return s;
}

static int slices_check(const tpk_limits_slices *sl, const char *fn, tpk_ctx *ctx)
{
    if (!sl || !sl->theta || !sl->K || sl->k == 0 || sl->L == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: empty or NULL slices", fn);
    return TPK_OK;
}

/* RB sliced W1 with per-seed weights w (NULL: equal). */
static int rbsw1_weighted(const double *Khat, const double *w, size_t S,
                          const tpk_limits_slices *sl, double *out, tpk_ctx *ctx)
{
    size_t k = sl->k;
    double vsmall[SMALL_S], acc = 0;
    double *v = S <= SMALL_S ? vsmall : tpk_malloc(ctx, S * sizeof *v);
    if (!v)
        return TPK_ERROR(ctx, TPK_ENOMEM, "tpk_limits_rbsw1: out of memory");
    int st = TPK_OK;
    for (size_t l = 0; l < sl->L && st == TPK_OK; l++) {
        const double *th = sl->theta + l * k;
        for (size_t s = 0; s < S; s++)
            v[s] = fmax(quad_form(th, Khat + s * k * k, k), 0.0); /* PSD up to rounding */
        double vinf = sl->matched ? weighted_mean(v, w, S) : fmax(quad_form(th, sl->K, k), 0.0);
        double d = 0;
        st = tpk_limits_w1_mixtures(v, w, S, &vinf, NULL, 1, &d, ctx);
        acc += d;
    }
    if (v != vsmall)
        tpk_free(ctx, v);
    if (st == TPK_OK)
        *out = acc / (double)sl->L;
    return st;
}

int tpk_limits_rbsw1(const double *Khat, size_t S, const tpk_limits_slices *sl, double *out,
                     tpk_ctx *ctx)
{
    int st = slices_check(sl, "tpk_limits_rbsw1", ctx);
    if (st)
        return st;
    if (!Khat || !out || S == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_limits_rbsw1: NULL argument or no seeds");
    return rbsw1_weighted(Khat, NULL, S, sl, out, ctx);
}

int tpk_limits_sw1_samples(const double *Y, size_t M, const tpk_limits_slices *sl, double *out,
                           tpk_ctx *ctx)
{
    int st = slices_check(sl, "tpk_limits_sw1_samples", ctx);
    if (st)
        return st;
    if (!Y || !out || M == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_limits_sw1_samples: NULL argument or no samples");
    size_t k = sl->k;
    double *p = tpk_malloc(ctx, M * sizeof *p), acc = 0;
    if (!p)
        return TPK_ERROR(ctx, TPK_ENOMEM, "tpk_limits_sw1_samples: out of memory");
    for (size_t l = 0; l < sl->L && st == TPK_OK; l++) {
        const double *th = sl->theta + l * k;
        for (size_t i = 0; i < M; i++) {
            double s = 0;
            for (size_t j = 0; j < k; j++)
                s += th[j] * Y[i * k + j];
            p[i] = s;
        }
        double d = 0;
        st = tpk_limits_w1_gauss_samples(p, M, fmax(quad_form(th, sl->K, k), 0.0), &d, ctx);
        acc += d;
    }
    tpk_free(ctx, p);
    if (st == TPK_OK)
        *out = acc / (double)sl->L;
    return st;
}

/* A = V diag(√max(λ, 0)) with K = V Λ Vᵀ: a square root that tolerates singular K. */
static int psd_sqrt(const double *K, size_t k, double *A, tpk_ctx *ctx)
{
    tpk_error_gsl_init();
    /* views of one buffer from the allocator hook; the eigensolver's workspace is GSL's own */
    double *buf = k > 0 ? tpk_malloc(ctx, (2 * k * k + k) * sizeof *buf) : NULL;
    gsl_eigen_symmv_workspace *w = buf ? gsl_eigen_symmv_alloc(k) : NULL;
    int st = TPK_OK;
    if (!buf || !w) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "tpk_limits_sw1_gp_floor: out of memory");
    } else {
        gsl_matrix_view mv = gsl_matrix_view_array(buf, k, k);
        gsl_matrix_view Vv = gsl_matrix_view_array(buf + k * k, k, k);
        gsl_vector_view lv = gsl_vector_view_array(buf + 2 * k * k, k);
        gsl_matrix *m = &mv.matrix, *V = &Vv.matrix;
        gsl_vector *lam = &lv.vector;
        for (size_t i = 0; i < k; i++)
            for (size_t j = 0; j < k; j++)
                gsl_matrix_set(m, i, j, 0.5 * (K[i * k + j] + K[j * k + i]));
        if (gsl_eigen_symmv(m, lam, V, w) != GSL_SUCCESS)
            st = TPK_ERROR(ctx, TPK_ENUMERIC, "tpk_limits_sw1_gp_floor: eigensolver failed");
        for (size_t i = 0; i < k && st == TPK_OK; i++)
            for (size_t j = 0; j < k; j++)
                A[i * k + j] = gsl_matrix_get(V, i, j) * sqrt(fmax(gsl_vector_get(lam, j), 0.0));
    }
    if (w != NULL)
        gsl_eigen_symmv_free(w);
    tpk_free(ctx, buf);
    return st;
}

int tpk_limits_sw1_gp_floor(size_t M, const tpk_limits_slices *sl, size_t R, uint64_t seed,
                            double *mean, double *sd, tpk_ctx *ctx)
{
    tpk_error_gsl_init();
    int st = slices_check(sl, "tpk_limits_sw1_gp_floor", ctx);
    if (st)
        return st;
    if (!mean || M == 0 || R == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_limits_sw1_gp_floor: NULL output, M = 0 or R = 0");
    size_t k = sl->k;
    double *A = tpk_malloc(ctx, k * k * sizeof *A), *Y = tpk_malloc(ctx, M * k * sizeof *Y),
           *z = tpk_malloc(ctx, k * sizeof *z);
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    if (!A || !Y || !z || !r)
        st = TPK_ERROR(ctx, TPK_ENOMEM, "tpk_limits_sw1_gp_floor: out of memory");
    if (st == TPK_OK)
        st = psd_sqrt(sl->K, k, A, ctx);
    double s1 = 0, s2 = 0;
    if (st == TPK_OK)
        gsl_rng_set(r, (unsigned long)tpk_limits_mix64(seed));
    for (size_t rep = 0; rep < R && st == TPK_OK; rep++) {
        for (size_t i = 0; i < M; i++) {
            for (size_t j = 0; j < k; j++)
                z[j] = gsl_ran_gaussian_ziggurat(r, 1.0);
            for (size_t a = 0; a < k; a++) {
                double s = 0;
                for (size_t j = 0; j < k; j++)
                    s += A[a * k + j] * z[j];
                Y[i * k + a] = s;
            }
        }
        double d = 0;
        st = tpk_limits_sw1_samples(Y, M, sl, &d, ctx);
        s1 += d;
        s2 += d * d;
    }
    if (st == TPK_OK) {
        double m = s1 / (double)R;
        *mean = m;
        if (sd)
            *sd = R > 1 ? sqrt(fmax(s2 - (double)R * m * m, 0.0) / (double)(R - 1)) : 0.0;
    }
    gsl_rng_free(r);
    tpk_free(ctx, A);
    tpk_free(ctx, Y);
    tpk_free(ctx, z);
    return st;
}

int tpk_limits_rbw1_shape(const double *v, size_t S, double *out, tpk_ctx *ctx)
{
    if (!v || S == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_limits_rbw1_shape: NULL or empty input");
    double m = weighted_mean(v, NULL, S);
    return tpk_limits_w1_mixtures(v, NULL, S, &m, NULL, 1, out, ctx);
}

/* ---- Stock statistics for tpk_limits_boot_fit -------------------------------------------------- */

int tpk_limits_stat_rbw1(const double *recs, size_t S, size_t rec, const size_t *idx,
                         const void *user, double *out, tpk_ctx *ctx)
{
    if (rec != 1 || S == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_limits_stat_rbw1: needs rec = 1, S > 0");
    double csmall[SMALL_S];
    double *cnt = S <= SMALL_S ? csmall : tpk_malloc(ctx, S * sizeof *cnt);
    if (!cnt)
        return TPK_ERROR(ctx, TPK_ENOMEM, "tpk_limits_stat_rbw1: out of memory");
    tpk_limits_counts(idx, S, cnt);
    double target = user ? *(const double *)user : weighted_mean(recs, cnt, S);
    int st = tpk_limits_w1_mixtures(recs, cnt, S, &target, NULL, 1, out, ctx);
    if (cnt != csmall)
        tpk_free(ctx, cnt);
    return st;
}

int tpk_limits_stat_mix_kurtosis(const double *recs, size_t S, size_t rec, const size_t *idx,
                                 const void *user, double *out, tpk_ctx *ctx)
{
    (void)user;
    if (rec != 1 || S < 2)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_limits_stat_mix_kurtosis: needs rec = 1, S >= 2");
    double mean = 0, m2 = 0;
    for (size_t i = 0; i < S; i++) {
        double x = recs[idx ? idx[i] : i], d = x - mean;
        mean += d / (double)(i + 1);
        m2 += d * (x - mean);
    }
    if (!(mean > 0))
        return TPK_ERROR(ctx, TPK_EDOM, "tpk_limits_stat_mix_kurtosis: mean variance %g", mean);
    /* E f⁴ = 3 E v², E f² = E v for f | v ~ N(0, v): kurtosis − 3 = 3 Var v / (E v)² (§5.2). */
    *out = 3.0 * (m2 / (double)(S - 1)) / (mean * mean);
    return TPK_OK;
}

int tpk_limits_stat_rbsw1(const double *recs, size_t S, size_t rec, const size_t *idx,
                          const void *user, double *out, tpk_ctx *ctx)
{
    const tpk_limits_slices *sl = user;
    int st = slices_check(sl, "tpk_limits_stat_rbsw1", ctx);
    if (st)
        return st;
    if (rec != sl->k * sl->k)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_limits_stat_rbsw1: record of %zu, expected k² = %zu",
                         rec, sl->k * sl->k);
    double csmall[SMALL_S];
    double *cnt = S <= SMALL_S ? csmall : tpk_malloc(ctx, S * sizeof *cnt);
    if (!cnt)
        return TPK_ERROR(ctx, TPK_ENOMEM, "tpk_limits_stat_rbsw1: out of memory");
    tpk_limits_counts(idx, S, cnt);
    st = rbsw1_weighted(recs, cnt, S, sl, out, ctx);
    if (cnt != csmall)
        tpk_free(ctx, cnt);
    return st;
}
