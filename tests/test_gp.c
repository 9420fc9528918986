/* GP regression library: posterior and LML against independent dense formulas, gradients against
 * finite differences, the jitter path, every error status, and the IDX reader. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* OpenBLAS's cblas.h and GSL's gsl_cblas.h declare the same enums: keep GSL's out. */
#include <cblas.h>
#define __GSL_CBLAS_H__
#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>
#include <lapacke.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "tpk/gp.h"
#include "tpk/idx.h"

/* Dense oracle vs Cholesky path on well-conditioned problems (κ ≲ 1e3): rounding only. */
#define TOL_DENSE 1e-10
/* Central differences of the LML with step 1e-5 in log space: truncation ~1e-10·|f'''|, rounding
 * ~1e-16·|f|/1e-5; 1e-6 relative is far above both. */
#define TOL_FD 1e-6
#define FD_H 1e-5
/* MLP dK is itself a finite difference (step 1e-4, O(h²) ≈ 1e-8 relative). */
#define TOL_FD_MLP 1e-5
/* Two recursions of the same kernel, different operation order. */
#define TOL_SWEEP 1e-12

static gsl_rng *rng(unsigned long seed)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, seed);
    return r;
}

static tpk_array *randn(size_t r, size_t c, gsl_rng *g)
{
    tpk_array *a = tpk_array_alloc2(r, c, NULL);
    for (size_t i = 0; i < r * c; i++)
        a->data[i] = gsl_ran_gaussian(g, 1.0);
    return a;
}

/* RBF kernel blocks of a random problem, through an independent loop (not the library). */
static double rbf(const double *a, const double *b, size_t d, double l2, double s)
{
    double q = 0;
    for (size_t k = 0; k < d; k++)
        q += (a[k] - b[k]) * (a[k] - b[k]);
    return s * exp(-q / (2 * l2));
}

typedef struct problem {
    size_t n, m, c, d;
    tpk_array *X, *Xt, *K, *Kxt, *kd, *Ktt, *Y;
} problem;

static problem make_problem(size_t n, size_t m, size_t c, unsigned long seed)
{
    problem p = {.n = n, .m = m, .c = c, .d = 3};
    gsl_rng *g = rng(seed);
    p.X = randn(n, p.d, g);
    p.Xt = randn(m, p.d, g);
    p.Y = randn(n, c, g);
    p.K = tpk_array_alloc2(n, n, NULL);
    p.Kxt = tpk_array_alloc2(m, n, NULL);
    p.Ktt = tpk_array_alloc2(m, m, NULL);
    p.kd = tpk_array_alloc(1, (size_t[]){m}, NULL);
    const double l2 = 1.7, s = 1.385;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            p.K->data[i * n + j] = rbf(p.X->data + i * p.d, p.X->data + j * p.d, p.d, l2, s);
    for (size_t i = 0; i < m; i++) {
        for (size_t j = 0; j < n; j++)
            p.Kxt->data[i * n + j] = rbf(p.Xt->data + i * p.d, p.X->data + j * p.d, p.d, l2, s);
        for (size_t j = 0; j < m; j++)
            p.Ktt->data[i * m + j] = rbf(p.Xt->data + i * p.d, p.Xt->data + j * p.d, p.d, l2, s);
        p.kd->data[i] = p.Ktt->data[i * m + i];
    }
    gsl_rng_free(g);
    return p;
}

static void free_problem(problem *p)
{
    tpk_array *all[] = {p->X, p->Xt, p->K, p->Kxt, p->kd, p->Ktt, p->Y};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        tpk_array_free(all[i]);
}

/* Explicit inverse of K + σ²I by LAPACKE_dgesv against the identity (the oracle the library
 * must never use). */
static double *dense_inverse(const tpk_array *K, double noise)
{
    const size_t n = K->dims[0];
    double *A = malloc(n * n * sizeof *A), *B = calloc(n * n, sizeof *B);
    lapack_int *piv = malloc(n * sizeof *piv);
    memcpy(A, K->data, n * n * sizeof *A);
    for (size_t i = 0; i < n; i++) {
        A[i * n + i] += noise;
        B[i * n + i] = 1;
    }
    assert_int_equal(LAPACKE_dgesv(LAPACK_ROW_MAJOR, (lapack_int)n, (lapack_int)n, A,
                                   (lapack_int)n, piv, B, (lapack_int)n), 0);
    free(A);
    free(piv);
    return B;
}

static void assert_close(double got, double want, double tol)
{
    double scale = fmax(1.0, fabs(want));
    if (!(fabs(got - want) <= tol * scale))
        fail_msg("got %.17g, want %.17g (tolerance %.3g)", got, want, tol * scale);
}

static void test_posterior_vs_dense(void **state)
{
    (void)state;
    problem p = make_problem(23, 7, 3, 11);
    const double noise = 0.0385;
    double *Ai = dense_inverse(p.K, noise);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_gp *gp = tpk_gp_fit(p.K, p.Y, noise, NULL, &ctx);
    assert_non_null(gp);
    tpk_array *mean = tpk_array_alloc2(p.m, p.c, NULL), *var = tpk_array_alloc(1, (size_t[]){p.m}, NULL);
    tpk_array *cov = tpk_array_alloc2(p.m, p.m, NULL);
    assert_int_equal(tpk_gp_predict(gp, p.Kxt, p.kd, mean, var, &ctx), TPK_OK);
    assert_int_equal(tpk_gp_predict_cov(gp, p.Kxt, p.Ktt, cov, &ctx), TPK_OK);
    const size_t n = p.n;
    for (size_t i = 0; i < p.m; i++) {
        const double *ki = p.Kxt->data + i * n;
        for (size_t k = 0; k < p.c; k++) {
            double mu = 0;
            for (size_t a = 0; a < n; a++)
                for (size_t b = 0; b < n; b++)
                    mu += ki[a] * Ai[a * n + b] * p.Y->data[b * p.c + k];
            assert_close(mean->data[i * p.c + k], mu, TOL_DENSE);
        }
        for (size_t j = 0; j < p.m; j++) {
            const double *kj = p.Kxt->data + j * n;
            double q = 0;
            for (size_t a = 0; a < n; a++)
                for (size_t b = 0; b < n; b++)
                    q += ki[a] * Ai[a * n + b] * kj[b];
            assert_close(cov->data[i * p.m + j], p.Ktt->data[i * p.m + j] - q, TOL_DENSE);
            if (i == j)
                assert_close(var->data[i], p.kd->data[i] - q, TOL_DENSE);
        }
    }
    /* Weights are A⁻¹Y. */
    tpk_array *alpha = tpk_array_alloc2(n, p.c, NULL);
    assert_int_equal(tpk_gp_weights(gp, alpha, &ctx), TPK_OK);
    for (size_t a = 0; a < n; a++) {
        double w = 0;
        for (size_t b = 0; b < n; b++)
            w += Ai[a * n + b] * p.Y->data[b * p.c + 1];
        assert_close(alpha->data[a * p.c + 1], w, TOL_DENSE);
    }
    const tpk_gp_info *in = tpk_gp_get_info(gp);
    assert_int_equal(in->tries, 1);
    assert_true(in->jitter == 0);
    assert_true(isnan(in->rcond)); /* not estimated by default */
    double rc;
    assert_int_equal(tpk_gp_rcond(gp, &rc, &ctx), TPK_OK);
    /* dpocon estimates 1/κ₁ within a small factor: compare with ‖A‖₁‖A⁻¹‖₁ from the oracle. */
    double n1 = 0, ni = 0;
    for (size_t j = 0; j < n; j++) {
        double ca = 0, ci = 0;
        for (size_t i = 0; i < n; i++) {
            ca += fabs(p.K->data[i * n + j] + (i == j) * noise);
            ci += fabs(Ai[i * n + j]);
        }
        n1 = fmax(n1, ca);
        ni = fmax(ni, ci);
    }
    assert_true(rc >= 1 / (n1 * ni) * (1 - 1e-12) && rc <= 10 / (n1 * ni));
    tpk_array_free(alpha);
    tpk_array_free(mean);
    tpk_array_free(var);
    tpk_array_free(cov);
    tpk_gp_free(gp);
    free(Ai);
    free_problem(&p);
}

/* LML against Σ_k over eigenpairs of K + σ²I (LAPACKE_dsyev): −½Σ(q_kᵀy)²/λ_k − ½Σlog λ_k − ½N log 2π. */
static double lml_eig(const tpk_array *K, const tpk_array *Y, double noise, double *lam_min)
{
    const size_t n = K->dims[0], c = Y->dims[1];
    double *A = malloc(n * n * sizeof *A), *w = malloc(n * sizeof *w);
    memcpy(A, K->data, n * n * sizeof *A);
    for (size_t i = 0; i < n; i++)
        A[i * n + i] += noise;
    assert_int_equal(LAPACKE_dsyev(LAPACK_ROW_MAJOR, 'V', 'L', (lapack_int)n, A, (lapack_int)n, w), 0);
    double l = 0;
    for (size_t k = 0; k < n; k++) {
        for (size_t j = 0; j < c; j++) {
            double z = 0;
            for (size_t i = 0; i < n; i++)
                z += A[i * n + k] * Y->data[i * c + j];
            l -= 0.5 * z * z / w[k];
        }
        l -= 0.5 * (double)c * log(w[k]);
    }
    l -= 0.5 * (double)(n * c) * log(2 * M_PI);
    if (lam_min)
        *lam_min = w[0] - noise;
    free(A);
    free(w);
    return l;
}

static void test_lml_vs_eigen(void **state)
{
    (void)state;
    problem p = make_problem(31, 1, 2, 12);
    const double noise = 0.127;
    double lmin;
    double want = lml_eig(p.K, p.Y, noise, &lmin);
    tpk_gp *gp = tpk_gp_fit(p.K, p.Y, noise, NULL, NULL);
    assert_non_null(gp);
    assert_close(tpk_gp_get_info(gp)->lml, want, TOL_DENSE);
    /* Min eigenvalue diagnostic: Lanczos on A⁻¹ converges to λ_min(K) from above; N steps are
     * exact up to rounding, a few are an upper bound. */
    double est, est3;
    assert_int_equal(tpk_gp_min_eig(gp, (int)p.n, &est, NULL), TPK_OK);
    assert_int_equal(tpk_gp_min_eig(gp, 3, &est3, NULL), TPK_OK);
    assert_true(est3 >= est - 1e-12);
    assert_true(est >= lmin - 1e-9);
    assert_true(est - lmin <= 1e-6 * fmax(1, fabs(lmin)) + 1e-9);
    tpk_gp_free(gp);
    /* The spectral path: same LML, and with a kernel scale s: log N(Y; 0, sK + σ²I). */
    tpk_gp_spectral *sp = tpk_gp_spectral_alloc(p.K, p.Y, NULL);
    assert_non_null(sp);
    assert_close(tpk_gp_spectral_lml(sp, 1.0, noise), want, TOL_DENSE);
    tpk_array *Ks = tpk_array_alloc2(p.n, p.n, NULL);
    for (size_t i = 0; i < p.n * p.n; i++)
        Ks->data[i] = 2.25 * p.K->data[i];
    assert_close(tpk_gp_spectral_lml(sp, 2.25, noise), lml_eig(Ks, p.Y, noise, NULL), TOL_DENSE);
    tpk_array_free(Ks);
    tpk_gp_spectral_free(sp);
    free_problem(&p);
}

static void test_overwrite_mode(void **state)
{
    (void)state;
    problem p = make_problem(17, 5, 2, 13);
    tpk_array *Kc = tpk_array_alloc2(p.n, p.n, NULL);
    memcpy(Kc->data, p.K->data, p.n * p.n * sizeof(double));
    tpk_gp_options o;
    tpk_gp_options_default(&o);
    o.overwrite_k = 1;
    tpk_gp *g1 = tpk_gp_fit(p.K, p.Y, 0.05, NULL, NULL), *g2 = tpk_gp_fit(Kc, p.Y, 0.05, &o, NULL);
    assert_non_null(g1);
    assert_non_null(g2);
    tpk_array *m1 = tpk_array_alloc2(p.m, p.c, NULL), *m2 = tpk_array_alloc2(p.m, p.c, NULL);
    assert_int_equal(tpk_gp_predict(g1, p.Kxt, NULL, m1, NULL, NULL), TPK_OK);
    assert_int_equal(tpk_gp_predict(g2, p.Kxt, NULL, m2, NULL, NULL), TPK_OK);
    for (size_t i = 0; i < p.m * p.c; i++)
        assert_true(m1->data[i] == m2->data[i]);
    assert_true(tpk_gp_get_info(g1)->lml == tpk_gp_get_info(g2)->lml);
    /* Strict upper triangle still holds K; the lower holds the factor. */
    for (size_t i = 0; i < p.n; i++)
        for (size_t j = i + 1; j < p.n; j++)
            assert_true(Kc->data[i * p.n + j] == p.K->data[i * p.n + j]);
    assert_true(Kc->data[0] != p.K->data[0]);
    tpk_array_free(m1);
    tpk_array_free(m2);
    tpk_gp_free(g1);
    tpk_gp_free(g2);
    tpk_array_free(Kc);
    free_problem(&p);
}

/* Duplicate inputs make K exactly singular; with no noise the fit must add jitter and say so. */
static void test_jitter_rank_deficient(void **state)
{
    (void)state;
    problem p = make_problem(12, 3, 1, 14);
    const size_t n = p.n, d = p.d;
    for (int pass = 0; pass < 4; pass++) {
        /* rows 6..11 duplicate rows 0..5, with their targets (noise 0 interpolates: the
         * targets of duplicates must agree, else no GP passes through them) */
        memcpy(p.X->data + 6 * d, p.X->data, 6 * d * sizeof(double));
        memcpy(p.Y->data + 6 * p.c, p.Y->data, 6 * p.c * sizeof(double));
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n; j++)
                p.K->data[i * n + j] = rbf(p.X->data + i * d, p.X->data + j * d, d, 1.7, 1.385);
        tpk_gp_options o;
        tpk_gp_options_default(&o);
        o.overwrite_k = pass & 1;          /* both restore paths */
        o.rcond_min = pass & 2 ? 1e-15 : 0; /* pivot-ratio test, then dpocon as well */
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        tpk_gp *gp = tpk_gp_fit(p.K, p.Y, 0.0, &o, &ctx);
        assert_non_null(gp);
        const tpk_gp_info *in = tpk_gp_get_info(gp);
        assert_true(in->jitter > 0);
        assert_true(in->tries > 1);
        assert_true(in->jitter <= o.jitter_max * 1.385 * (1 + 1e-12));
        if (o.rcond_min > 0)
            assert_true(in->rcond >= o.rcond_min);
        /* Jitter is decades of jitter_first × mean diagonal. */
        double dec = log10(in->jitter / (o.jitter_first * 1.385));
        assert_true(fabs(dec - round(dec)) < 1e-9);
        double lmin;
        assert_int_equal(tpk_gp_min_eig(gp, 50, &lmin, &ctx), TPK_OK);
        assert_true(fabs(lmin) < 1e-6); /* K is singular */
        tpk_gp_free(gp);
    }
    /* Too little jitter allowed: a clear ENUMERIC. */
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            p.K->data[i * n + j] = rbf(p.X->data + i * d, p.X->data + j * d, d, 1.7, 1.385);
    tpk_gp_options o;
    tpk_gp_options_default(&o);
    o.jitter_first = 1e-20; /* far too small to make κ < 1/rcond_min */
    o.jitter_max = 1e-19;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_null(tpk_gp_fit(p.K, p.Y, 0.0, &o, &ctx));
    assert_int_equal(ctx.status, TPK_ENUMERIC);
    assert_non_null(strstr(ctx.msg, "jitter"));
    /* An indefinite matrix fails even with jitter. */
    tpk_array *B = tpk_array_alloc2(2, 2, NULL), *y = tpk_array_alloc2(2, 1, NULL);
    B->data[0] = 1; B->data[1] = 2; B->data[2] = 2; B->data[3] = 1;
    tpk_ctx_init(&ctx);
    assert_null(tpk_gp_fit(B, y, 0.0, NULL, &ctx));
    assert_int_equal(ctx.status, TPK_ENUMERIC);
    assert_non_null(strstr(ctx.msg, "not positive definite"));
    tpk_array_free(B);
    tpk_array_free(y);
    free_problem(&p);
}

/* Noise 0 on data without an interpolant (issue 39, item 3): tpk_gp_fit refuses it, the rule
 * gpregress and tpk.GPRegressor share, in the caller's words; consistent targets interpolate. */
static void test_noise0_interpolation(void **state)
{
    (void)state;
    problem p = make_problem(10, 3, 2, 31);
    const size_t n = p.n, d = p.d, c = p.c;
    memcpy(p.X->data + 9 * d, p.X->data + 4 * d, d * sizeof(double)); /* item 9 = item 4 */
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            p.K->data[i * n + j] = rbf(p.X->data + i * d, p.X->data + j * d, d, 1.7, 1.385);
    memcpy(p.Y->data + 9 * c, p.Y->data + 4 * c, c * sizeof(double));
    p.Y->data[9 * c + 1] += 0.0385; /* output 1 differs */
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_null(tpk_gp_fit(p.K, p.Y, 0.0, NULL, &ctx));
    assert_int_equal(ctx.status, TPK_EDOM);
    if (!strstr(ctx.msg, "training items 4 and 9 are the same point to the kernel") ||
        !strstr(ctx.msg, "output 1") || !strstr(ctx.msg, "noise=0 asks to interpolate both"))
        fail_msg("%s", ctx.msg);
    tpk_gp_options o;
    tpk_gp_options_default(&o);
    o.data = "x.csv";
    o.noise_name = "--noise";
    o.noise_auto = "--noise=auto";
    tpk_ctx_init(&ctx);
    assert_null(tpk_gp_fit(p.K, p.Y, 0.0, &o, &ctx));
    if (strncmp(ctx.msg, "x.csv: training items 4 and 9", 29) != 0 ||
        !strstr(ctx.msg, "--noise=0 asks") || !strstr(ctx.msg, "give --noise > 0 or --noise=auto"))
        fail_msg("%s", ctx.msg);
    /* a noise > 0 has no interpolation to refuse */
    tpk_ctx_init(&ctx);
    tpk_gp *gp = tpk_gp_fit(p.K, p.Y, 0.01, NULL, &ctx);
    assert_non_null(gp);
    tpk_gp_free(gp);
    /* the same targets: an interpolant, through every point */
    p.Y->data[9 * c + 1] -= 0.0385;
    gp = tpk_gp_fit(p.K, p.Y, 0.0, NULL, &ctx);
    assert_non_null(gp);
    tpk_array *mean = tpk_array_alloc2(n, c, NULL);
    assert_int_equal(tpk_gp_predict(gp, p.K, NULL, mean, NULL, &ctx), TPK_OK);
    for (size_t i = 0; i < n * c; i++)
        assert_true(fabs(mean->data[i] - p.Y->data[i]) < 1e-6);
    tpk_array_free(mean);
    tpk_gp_free(gp);
    free_problem(&p);
}

#define EXPECT_FIT_FAIL(K, Y, noise, code, text)                                                    \
    do {                                                                                           \
        tpk_ctx c_;                                                                                \
        tpk_ctx_init(&c_);                                                                         \
        assert_null(tpk_gp_fit((K), (Y), (noise), NULL, &c_));                                     \
        assert_int_equal(c_.status, (code));                                                       \
        if (!strstr(c_.msg, (text)))                                                               \
            fail_msg("message '%s' lacks '%s'", c_.msg, (text));                                   \
    } while (0)

static void test_bad_inputs(void **state)
{
    (void)state;
    problem p = make_problem(9, 4, 2, 15);
    tpk_array *rect = tpk_array_alloc2(9, 8, NULL), *Ybad = tpk_array_alloc2(8, 2, NULL);
    EXPECT_FIT_FAIL(rect, p.Y, 0.1, TPK_EINVAL, "square");
    EXPECT_FIT_FAIL(p.K, Ybad, 0.1, TPK_EINVAL, "rows");
    EXPECT_FIT_FAIL(NULL, p.Y, 0.1, TPK_EINVAL, "kernel");
    EXPECT_FIT_FAIL(p.K, p.Y, -0.1, TPK_EDOM, ">= 0");
    EXPECT_FIT_FAIL(p.K, p.Y, NAN, TPK_EDOM, "finite");
    EXPECT_FIT_FAIL(p.K, p.Y, INFINITY, TPK_EDOM, "finite");
    double save = p.K->data[5 * 9 + 2];
    p.K->data[5 * 9 + 2] = NAN;
    EXPECT_FIT_FAIL(p.K, p.Y, 0.1, TPK_EDOM, "tpk_gp_fit: K[5, 2] is NaN");
    p.K->data[5 * 9 + 2] = save + 0.5; /* asymmetric */
    EXPECT_FIT_FAIL(p.K, p.Y, 0.1, TPK_EINVAL, "not symmetric");
    p.K->data[5 * 9 + 2] = save;
    save = p.K->data[3 * 9 + 3];
    p.K->data[3 * 9 + 3] = -1;
    EXPECT_FIT_FAIL(p.K, p.Y, 0.1, TPK_EDOM, "negative diagonal");
    p.K->data[3 * 9 + 3] = save;
    p.Y->data[7] = INFINITY;
    EXPECT_FIT_FAIL(p.K, p.Y, 0.1, TPK_EDOM, "tpk_gp_fit: Y[");
    p.Y->data[7] = 0.3;
    tpk_array *Y3 = tpk_array_alloc(3, (size_t[]){9, 1, 1}, NULL);
    EXPECT_FIT_FAIL(p.K, Y3, 0.1, TPK_EINVAL, "rank");
    /* Predict: wrong cross width, wrong outputs, non-finite cross, missing diagonal. */
    tpk_gp *gp = tpk_gp_fit(p.K, p.Y, 0.1, NULL, NULL);
    assert_non_null(gp);
    tpk_array *mean = tpk_array_alloc2(4, 2, NULL), *var = tpk_array_alloc(1, (size_t[]){4}, NULL);
    tpk_array *Kx8 = tpk_array_alloc2(4, 8, NULL), *mean3 = tpk_array_alloc2(4, 3, NULL);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gp_predict(gp, Kx8, p.kd, mean, var, &ctx), TPK_EINVAL);
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gp_predict(gp, p.Kxt, p.kd, mean3, var, &ctx), TPK_EINVAL);
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gp_predict(gp, p.Kxt, NULL, mean, var, &ctx), TPK_EINVAL);
    tpk_ctx_init(&ctx);
    p.Kxt->data[3] = NAN;
    assert_int_equal(tpk_gp_predict(gp, p.Kxt, p.kd, mean, var, &ctx), TPK_EDOM);
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gp_predict_cov(gp, p.Kxt, p.Ktt, mean, &ctx), TPK_EDOM);
    p.Kxt->data[3] = 0.25;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gp_predict_cov(gp, p.Kxt, p.Ktt, mean, &ctx), TPK_EINVAL);
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gp_min_eig(gp, 0, &save, &ctx), TPK_EINVAL);
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gp_weights(gp, mean, &ctx), TPK_EINVAL);
    /* Options and the spectral / gradient / hyper entry points. */
    tpk_gp_options o;
    tpk_gp_options_default(&o);
    o.jitter_max = -1;
    tpk_ctx_init(&ctx);
    assert_null(tpk_gp_fit(p.K, p.Y, 0.1, &o, &ctx));
    assert_int_equal(ctx.status, TPK_EINVAL);
    tpk_ctx_init(&ctx);
    assert_null(tpk_gp_spectral_alloc(rect, p.Y, &ctx));
    assert_int_equal(ctx.status, TPK_EINVAL);
    tpk_gp_spectral *sp = tpk_gp_spectral_alloc(p.K, p.Y, NULL);
    tpk_gp_noise_choice ch;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gp_spectral_choose_noise(sp, 1.0, 0.5, 1, &ch, &ctx), TPK_EINVAL);
    tpk_gp_spectral_free(sp);
    double lml, grad[1];
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gp_lml_grad(p.K, p.Y, -1.0, NULL, 0, NULL, &lml, grad, NULL, &ctx), TPK_EDOM);
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gp_lml_grad(p.K, p.Y, 0.1, NULL, 2, NULL, &lml, grad, NULL, &ctx), TPK_EINVAL);
    tpk_gp_family *f = tpk_gp_family_rbf_alloc(p.X, NULL);
    double th[2] = {1.0, 0.0}, nz = 0.1;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gp_fit_hyper(f, p.Y, th, &nz, NULL, NULL, &ctx), TPK_EDOM);
    assert_non_null(strstr(ctx.msg, "amplitude"));
    th[1] = 1.0;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gp_fit_hyper(f, Ybad, th, &nz, NULL, NULL, &ctx), TPK_EINVAL);
    tpk_gp_family_free(f);
    tpk_gp_family_free(NULL);
    tpk_gp_free(NULL);
    tpk_gp_spectral_free(NULL);
    tpk_array *all[] = {rect, Ybad, Y3, mean, var, Kx8, mean3};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        tpk_array_free(all[i]);
    tpk_gp_free(gp);
    free_problem(&p);
}

/* LML of a family at (θ, σ²), for finite differences. */
static double family_lml(const tpk_gp_family *f, const tpk_array *Y, const double *theta,
                         double noise)
{
    tpk_array *K = tpk_array_alloc2(f->n, f->n, NULL);
    assert_int_equal(f->eval(f, theta, K->data, NULL, NULL), TPK_OK);
    double l;
    assert_int_equal(tpk_gp_lml_grad(K, Y, noise, NULL, 0, NULL, &l, NULL, NULL, NULL), TPK_OK);
    tpk_array_free(K);
    return l;
}

static void check_family_gradient(const tpk_gp_family *f, const tpk_array *Y, const double *theta,
                                  double noise, double tol)
{
    const size_t n = f->n, np = f->nparams;
    tpk_array *K = tpk_array_alloc2(n, n, NULL);
    double *dK[TPK_GP_MAXPARAMS];
    for (size_t i = 0; i < np; i++)
        dK[i] = malloc(n * n * sizeof(double));
    assert_int_equal(f->eval(f, theta, K->data, dK, NULL), TPK_OK);
    double lml, grad[TPK_GP_MAXPARAMS + 1];
    assert_int_equal(tpk_gp_lml_grad(K, Y, noise, (const double *const *)dK, np, NULL, &lml, grad,
                                     NULL, NULL), TPK_OK);
    assert_close(lml, family_lml(f, Y, theta, noise), 1e-12);
    for (size_t i = 0; i <= np; i++) {
        double tp[TPK_GP_MAXPARAMS], tm[TPK_GP_MAXPARAMS], np_ = noise, nm = noise;
        memcpy(tp, theta, np * sizeof *tp);
        memcpy(tm, theta, np * sizeof *tm);
        if (i < np) {
            tp[i] *= exp(FD_H);
            tm[i] *= exp(-FD_H);
        } else {
            np_ *= exp(FD_H);
            nm *= exp(-FD_H);
        }
        double fd = (family_lml(f, Y, tp, np_) - family_lml(f, Y, tm, nm)) / (2 * FD_H);
        if (!(fabs(grad[i] - fd) <= tol * fmax(1.0, fabs(fd))))
            fail_msg("parameter %zu: analytic %.12g, finite difference %.12g", i, grad[i], fd);
    }
    for (size_t i = 0; i < np; i++)
        free(dK[i]);
    tpk_array_free(K);
}

static void test_gradient_rbf(void **state)
{
    (void)state;
    problem p = make_problem(25, 1, 3, 16);
    tpk_gp_family *f = tpk_gp_family_rbf_alloc(p.X, NULL);
    assert_non_null(f);
    assert_int_equal(f->analytic_grad, 1);
    check_family_gradient(f, p.Y, (double[]){0.83, 1.47}, 0.093, TOL_FD);
    /* Family kernel = the independent rbf() loop. */
    tpk_array *K = tpk_array_alloc2(p.n, p.n, NULL);
    assert_int_equal(f->eval(f, (double[]){1.7, 1.385}, K->data, NULL, NULL), TPK_OK);
    for (size_t i = 0; i < p.n * p.n; i++)
        assert_close(K->data[i], p.K->data[i], 1e-13);
    /* tpk_gp_rbf_kernel: train, cross, diagonal. */
    tpk_array *Kx = tpk_array_alloc2(p.m, p.n, NULL), *kd = tpk_array_alloc(1, (size_t[]){p.m}, NULL);
    assert_int_equal(tpk_gp_rbf_kernel((double[]){1.7, 1.385}, p.X, p.Xt, K, Kx, kd, NULL), TPK_OK);
    for (size_t i = 0; i < p.n * p.n; i++)
        assert_close(K->data[i], p.K->data[i], 1e-13);
    for (size_t i = 0; i < p.m * p.n; i++)
        assert_close(Kx->data[i], p.Kxt->data[i], 1e-13);
    assert_close(kd->data[0], p.kd->data[0], 1e-15);
    tpk_array_free(K);
    tpk_array_free(Kx);
    tpk_array_free(kd);
    tpk_gp_family_free(f);
    free_problem(&p);
}

static void test_gradient_mlp(void **state)
{
    (void)state;
    problem p = make_problem(19, 1, 2, 17);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_phi_registry_alloc(&ctx);
    assert_non_null(reg);
    const char *phis[2] = {"relu", "erf"};
    for (int k = 0; k < 2; k++) {
        tpk_phi *phi = tpk_phi_alloc(reg, phis[k], &ctx);
        assert_non_null(phi);
        tpk_mlp_params mp = {.depth = 2, .phi = phi, .sigma_w2 = 1.6, .sigma_b2 = 0.2};
        tpk_gp_family *f = tpk_gp_family_mlp_alloc(&mp, p.X, NULL, 0, &ctx);
        assert_non_null(f);
        assert_int_equal(f->analytic_grad, 0);
        check_family_gradient(f, p.Y, (double[]){1.6, 0.2}, 0.071, TOL_FD_MLP);
        tpk_gp_family_free(f);
        tpk_phi_free(phi);
    }
    tpk_phi_registry_free(reg);
    free_problem(&p);
}

/* Data drawn from a known GP: the BFGS fit must raise the LML, end with a small gradient, and
 * land near the truth. */
static void test_fit_hyper_rbf(void **state)
{
    (void)state;
    const size_t n = 150, d = 2;
    gsl_rng *g = rng(18);
    tpk_array *X = randn(n, d, g), *Y = tpk_array_alloc2(n, 2, NULL);
    const double l2 = 0.6, s = 1.9, noise = 0.05;
    tpk_array *K = tpk_array_alloc2(n, n, NULL);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            K->data[i * n + j] = rbf(X->data + i * d, X->data + j * d, d, l2, s) + (i == j) * noise;
    assert_int_equal(LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'L', (lapack_int)n, K->data, (lapack_int)n), 0);
    for (size_t c = 0; c < 2; c++) {
        double z[150];
        for (size_t i = 0; i < n; i++)
            z[i] = gsl_ran_gaussian(g, 1.0);
        for (size_t i = 0; i < n; i++) {
            double v = 0;
            for (size_t j = 0; j <= i; j++)
                v += K->data[i * n + j] * z[j];
            Y->data[i * 2 + c] = v;
        }
    }
    tpk_gp_family *f = tpk_gp_family_rbf_alloc(X, NULL);
    double th[2] = {3.0, 0.5}, nz = 0.5;
    double start = family_lml(f, Y, th, nz);
    tpk_gp_hyper_result r;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gp_fit_hyper(f, Y, th, &nz, NULL, &r, &ctx), TPK_OK);
    assert_true(r.lml > start);
    assert_true(r.converged);
    assert_close(r.lml, family_lml(f, Y, th, nz), 1e-12);
    /* Within a factor 2 of the truth at n = 150 (2 outputs). */
    assert_true(th[0] > l2 / 2 && th[0] < l2 * 2);
    assert_true(th[1] > s / 2 && th[1] < s * 2);
    assert_true(nz > noise / 2 && nz < noise * 2);
    /* Fixed parameters stay put. */
    tpk_gp_hyper_options o;
    tpk_gp_hyper_options_default(&o);
    o.fixed = 1u << 1;
    double th2[2] = {3.0, 0.777}, nz2 = 0.5;
    assert_int_equal(tpk_gp_fit_hyper(f, Y, th2, &nz2, &o, &r, &ctx), TPK_OK);
    assert_true(th2[1] == 0.777);
    /* The spectral noise choice on the fitted kernel agrees with BFGS's noise. */
    assert_int_equal(f->eval(f, th, K->data, NULL, NULL), TPK_OK);
    tpk_gp_spectral *sp = tpk_gp_spectral_alloc(K, Y, NULL);
    tpk_gp_noise_choice ch;
    assert_int_equal(tpk_gp_spectral_choose_noise(sp, 1e-6, 10, 0, &ch, NULL), TPK_OK);
    assert_true(fabs(log(ch.noise / nz)) < 0.01);
    assert_true(ch.lml >= tpk_gp_spectral_lml(sp, 1, nz) - 1e-9);
    /* Profiled scale: s* must beat its neighbours. */
    assert_int_equal(tpk_gp_spectral_choose_noise(sp, 1e-6, 10, 1, &ch, NULL), TPK_OK);
    assert_true(ch.lml >= tpk_gp_spectral_lml(sp, ch.scale * 1.05, ch.noise) - 1e-12);
    assert_true(ch.lml >= tpk_gp_spectral_lml(sp, ch.scale / 1.05, ch.noise) - 1e-12);
    assert_true(ch.lml >= tpk_gp_spectral_lml(sp, ch.scale, ch.noise * 1.05) - 1e-9);
    assert_true(ch.lml >= tpk_gp_spectral_lml(sp, ch.scale, ch.noise / 1.05) - 1e-9);
    tpk_gp_spectral_free(sp);
    /* From a start near the interpolating optimum (tiny lengthscale and noise) one BFGS run
     * stalls; the multi-start grid reaches the optimum found from the good start (issue 18). */
    double good = r.lml;
    assert_int_equal(tpk_gp_fit_hyper(f, Y, (double[]){3.0, 0.5}, (double[]){0.5}, NULL, &r, &ctx),
                     TPK_OK);
    good = r.lml;
    tpk_gp_hyper_options_default(&o);
    o.multistart = 1;
    double th3[2] = {0.002, 0.5}, nz3 = 1e-7;
    assert_int_equal(tpk_gp_fit_hyper(f, Y, th3, &nz3, &o, &r, &ctx), TPK_OK);
    double single = r.lml;
    double th4[2] = {0.002, 0.5}, nz4 = 1e-7;
    assert_int_equal(tpk_gp_fit_hyper(f, Y, th4, &nz4, NULL, &r, &ctx), TPK_OK);
    print_message("fit-hyper from a bad start: one run lml %.4f, multi-start %.4f, good start "
                  "%.4f\n", single, r.lml, good);
    assert_true(r.lml >= good - 1e-6 * fabs(good));
    assert_close(r.lml, family_lml(f, Y, th4, nz4), 1e-12);
    tpk_gp_family_free(f);
    tpk_array_free(K);
    tpk_array_free(X);
    tpk_array_free(Y);
    gsl_rng_free(g);
}

/* The full-size noise search against the exact LML curve of an eigendecomposition. */
static void test_search_noise(void **state)
{
    (void)state;
    problem p = make_problem(160, 4, 3, 20);
    /* Targets with structure (a smooth function plus noise of variance 0.01), so that the LML
     * has an interior optimum. */
    for (size_t i = 0; i < p.n; i++)
        for (size_t c = 0; c < p.c; c++)
            p.Y->data[i * p.c + c] = sin(p.X->data[i * p.d] + (double)c) +
                                     0.3 * p.X->data[i * p.d + 1] + 0.1 * p.Y->data[i * p.c + c];
    tpk_gp_spectral *sp = tpk_gp_spectral_alloc(p.K, p.Y, NULL);
    tpk_gp_noise_choice best, ch;
    assert_int_equal(tpk_gp_spectral_choose_noise(sp, 1e-8, 1e2, 1, &best, NULL), TPK_OK);
    assert_false(best.at_bound);
    const double r_best = best.noise / best.scale;
    for (int mode = 0; mode < 2; mode++) {
        tpk_array *Kc = tpk_array_alloc2(p.n, p.n, NULL);
        memcpy(Kc->data, p.K->data, p.n * p.n * sizeof(double));
        tpk_gp_options o;
        tpk_gp_options_default(&o);
        o.overwrite_k = mode;
        /* Start 1.3 decades off, so the walk has to move. */
        tpk_gp *gp = tpk_gp_fit_search_noise(Kc, p.Y, r_best * 20, 0.3, 8, 1, &o, &ch, NULL);
        assert_non_null(gp);
        assert_false(ch.at_bound);
        assert_true(ch.fits >= 4 && ch.fits <= 10);
        const double r = ch.noise / ch.scale;
        assert_true(fabs(log10(r / r_best)) < 0.1);
        /* The LML it reports is the spectral one at its point, within a hair of the maximum. */
        assert_close(ch.lml, tpk_gp_spectral_lml(sp, ch.scale, ch.noise), 1e-9);
        /* One parabolic step over 0.3-decade points leaves ~1 % in σ², O(1e-5) relative in LML. */
        assert_true(ch.lml >= best.lml - 1e-4 * fabs(best.lml));
        /* The GP returned is the fit at that noise. */
        assert_true(tpk_gp_get_info(gp)->noise == r);
        tpk_gp *ref = tpk_gp_fit(p.K, p.Y, r, NULL, NULL);
        tpk_array *m1 = tpk_array_alloc2(p.m, p.c, NULL), *m2 = tpk_array_alloc2(p.m, p.c, NULL);
        assert_int_equal(tpk_gp_predict(gp, p.Kxt, NULL, m1, NULL, NULL), TPK_OK);
        assert_int_equal(tpk_gp_predict(ref, p.Kxt, NULL, m2, NULL, NULL), TPK_OK);
        for (size_t i = 0; i < p.m * p.c; i++)
            assert_close(m1->data[i], m2->data[i], TOL_DENSE);
        tpk_array_free(m1);
        tpk_array_free(m2);
        tpk_gp_free(ref);
        tpk_gp_free(gp);
        tpk_array_free(Kc);
    }
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_null(tpk_gp_fit_search_noise(p.K, p.Y, -1, 0.3, 5, 1, NULL, &ch, &ctx));
    assert_int_equal(ctx.status, TPK_EINVAL);
    tpk_gp_spectral_free(sp);
    free_problem(&p);
}

typedef struct sweep_check {
    const tpk_mlp_params *p;
    const tpk_array *X, *Xt;
    int seen;
} sweep_check;

static int sweep_cb(int depth, const tpk_array *K, const tpk_array *Kxt, const tpk_array *kdiag,
                    void *data, tpk_ctx *ctx)
{
    sweep_check *s = data;
    const size_t n = K->dims[0], m = Kxt->dims[0];
    tpk_mlp_params q = *s->p;
    q.depth = depth;
    tpk_array *K2 = tpk_array_alloc2(n, n, NULL), *X2 = tpk_array_alloc2(m, n, NULL);
    tpk_array *d2 = tpk_array_alloc(1, (size_t[]){m}, NULL);
    assert_int_equal(tpk_mlp_kernel(&q, s->X, s->Xt, NULL, K2, X2, d2, NULL, ctx), TPK_OK);
    for (size_t i = 0; i < n * n; i++)
        assert_close(K->data[i], K2->data[i], TOL_SWEEP);
    for (size_t i = 0; i < m * n; i++)
        assert_close(Kxt->data[i], X2->data[i], TOL_SWEEP);
    for (size_t i = 0; i < m; i++)
        assert_close(kdiag->data[i], d2->data[i], TOL_SWEEP);
    tpk_array_free(K2);
    tpk_array_free(X2);
    tpk_array_free(d2);
    s->seen++;
    return depth == 4 ? TPK_EUNSUPPORTED : TPK_OK; /* a non-zero return stops the sweep */
}

static void test_mlp_sweep(void **state)
{
    (void)state;
    problem p = make_problem(11, 5, 1, 19);
    tpk_phi_registry *reg = tpk_phi_registry_alloc(NULL);
    tpk_phi *phi = tpk_phi_alloc(reg, "erf", NULL);
    tpk_mlp_params mp = {.depth = 6, .phi = phi, .sigma_w2 = 1.8, .sigma_b2 = 0.13};
    tpk_array *K = tpk_array_alloc2(p.n, p.n, NULL), *Kx = tpk_array_alloc2(p.m, p.n, NULL);
    tpk_array *kd = tpk_array_alloc(1, (size_t[]){p.m}, NULL);
    sweep_check sc = {&mp, p.X, p.Xt, 0};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gp_mlp_sweep(&mp, p.X, p.Xt, NULL, K, Kx, kd, sweep_cb, &sc, &ctx),
                     TPK_EUNSUPPORTED);
    assert_int_equal(sc.seen, 4);
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gp_mlp_sweep(&mp, p.X, p.Xt, NULL, K, Kx, kd, NULL, NULL, &ctx), TPK_EINVAL);
    tpk_array_free(K);
    tpk_array_free(Kx);
    tpk_array_free(kd);
    tpk_phi_free(phi);
    tpk_phi_registry_free(reg);
    free_problem(&p);
}

/* ---- IDX ----------------------------------------------------------------------------------- */

static char tmpdir[64];

static int setup(void **state)
{
    (void)state;
    strcpy(tmpdir, "/tmp/tpk-gp-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_gz(const char *path, const unsigned char *b, size_t len, int gz)
{
    if (gz) {
        gzFile f = gzopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(gzwrite(f, b, (unsigned)len), (int)len);
        gzclose(f);
    } else {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(b, 1, len, f), len);
        fclose(f);
    }
}

static void test_idx(void **state)
{
    (void)state;
    char path[128];
    /* uint8, 3×2×2, gzip. */
    unsigned char u8[4 + 12 + 12] = {0, 0, 0x08, 3, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 2};
    for (int i = 0; i < 12; i++)
        u8[16 + i] = (unsigned char)(i * 21 + 3);
    snprintf(path, sizeof path, "%s/a-ubyte.gz", tmpdir);
    write_gz(path, u8, sizeof u8, 1);
    assert_true(tpk_idx_name_matches(path));
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_array *a = tpk_idx_read(path, 0, &ctx);
    assert_non_null(a);
    assert_int_equal(a->ndim, 3);
    assert_int_equal(a->dims[0], 3);
    assert_int_equal(a->dims[2], 2);
    for (int i = 0; i < 12; i++)
        assert_true(a->data[i] == i * 21 + 3);
    tpk_array_free(a);
    a = tpk_idx_read(path, 2, &ctx); /* first two items only */
    assert_non_null(a);
    assert_int_equal(a->dims[0], 2);
    assert_true(a->data[7] == 7 * 21 + 3);
    tpk_array_free(a);
    /* int32 and float64 big-endian, plain file. */
    unsigned char i32[8 + 8] = {0, 0, 0x0C, 1, 0, 0, 0, 2, 0xFF, 0xFF, 0xFF, 0xFE, 0, 0, 1, 2};
    snprintf(path, sizeof path, "%s/b.idx", tmpdir);
    write_gz(path, i32, sizeof i32, 0);
    a = tpk_idx_read(path, 0, &ctx);
    assert_non_null(a);
    assert_true(a->data[0] == -2 && a->data[1] == 258);
    tpk_array_free(a);
    unsigned char f64[8 + 8] = {0, 0, 0x0E, 1, 0, 0, 0, 1, 0x40, 0x09, 0x21, 0xFB, 0x54, 0x44, 0x2D, 0x18};
    write_gz(path, f64, sizeof f64, 1);
    a = tpk_idx_read(path, 0, &ctx);
    assert_non_null(a);
    assert_true(a->data[0] == M_PI);
    tpk_array_free(a);
    /* Errors: missing, bad magic, bad type, rank 5, truncated data, truncated header. */
    struct { const unsigned char *b; size_t len; int code; const char *text; } bad[] = {
        {(const unsigned char *)"\x01\x00\x08\x01\x00\x00\x00\x01\x05", 9, TPK_EFORMAT, "not an IDX"},
        {(const unsigned char *)"\x00\x00\x07\x01\x00\x00\x00\x01\x05", 9, TPK_EFORMAT, "not an IDX"},
        {(const unsigned char *)"\x00\x00\x08\x05", 4, TPK_EFORMAT, "rank 5"},
        {u8, sizeof u8 - 1, TPK_EFORMAT, "truncated"},
        {u8, 10, TPK_EFORMAT, "truncated"},
        {u8, 2, TPK_EFORMAT, "truncated"}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        write_gz(path, bad[k].b, bad[k].len, (int)(k & 1));
        tpk_ctx_init(&ctx);
        assert_null(tpk_idx_read(path, 0, &ctx));
        assert_int_equal(ctx.status, bad[k].code);
        if (!strstr(ctx.msg, bad[k].text))
            fail_msg("case %zu: '%s' lacks '%s'", k, ctx.msg, bad[k].text);
    }
    tpk_ctx_init(&ctx);
    snprintf(path, sizeof path, "%s/missing-ubyte.gz", tmpdir);
    assert_null(tpk_idx_read(path, 0, &ctx));
    assert_int_equal(ctx.status, TPK_EIO);
    assert_false(tpk_idx_name_matches("x.csv"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_posterior_vs_dense),
        cmocka_unit_test(test_lml_vs_eigen),
        cmocka_unit_test(test_overwrite_mode),
        cmocka_unit_test(test_jitter_rank_deficient),
        cmocka_unit_test(test_noise0_interpolation),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_gradient_rbf),
        cmocka_unit_test(test_gradient_mlp),
        cmocka_unit_test(test_fit_hyper_rbf),
        cmocka_unit_test(test_search_noise),
        cmocka_unit_test(test_mlp_sweep),
        cmocka_unit_test(test_idx),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
