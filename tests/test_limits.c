/* limits/: convergence statistics against exact oracles (theory.md §3.4, §7.3–7.5). The
 * finite-width networks here are simulated directly (a tiny ReLU MLP with GSL normals), so the
 * statistics are checked independently of the NETSOR executor. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cblas.h>
#define __GSL_CBLAS_H__
#include <gsl/gsl_errno.h>
#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "tpk/limits.h"

/* z-score acceptance for mean/variance checks over many seeds: 4.5 SE fails by chance with
 * p ≈ 7e-6 per check (all seeds are fixed, so a pass is deterministic anyway). */
#define Z_ACCEPT 4.5

static double relu(double x) { return x > 0 ? x : 0; }

/* ReLU arc-cosine kernel E[relu(u)relu(v)], (u,v) ~ N(0, [[q1,k],[k,q2]]) (theory.md §3.2). */
static double relu_k(double q1, double q2, double k)
{
    double s = sqrt(q1 * q2), c = fmax(-1.0, fmin(1.0, k / s)), th = acos(c);
    return s / (2 * M_PI) * (sin(th) + (M_PI - th) * c);
}

/* Finite ReLU MLP with `depth` hidden layers of width n on N inputs X (N×d), σ_b = 0: the
 * readout-conditional covariance K̂ = σ_w² ⟨h^L_a, h^L_c⟩/n (σ_v² = σ_w²), N×N into Khat. */
static void mlp_finite(const double *X, size_t N, size_t d, size_t n, int depth, double sw2,
                       gsl_rng *r, double *Khat)
{
    double *G = malloc(n * N * sizeof *G), *H = malloc(n * N * sizeof *H);
    for (size_t i = 0; i < n; i++) {
        double w[64];
        for (size_t j = 0; j < d; j++)
            w[j] = gsl_ran_gaussian_ziggurat(r, sqrt(sw2 / (double)d));
        for (size_t a = 0; a < N; a++) {
            double s = 0;
            for (size_t j = 0; j < d; j++)
                s += w[j] * X[a * d + j];
            H[i * N + a] = relu(s);
        }
    }
    for (int l = 2; l <= depth; l++) {
        memset(G, 0, n * N * sizeof *G);
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n; j++) {
                double w = gsl_ran_gaussian_ziggurat(r, sqrt(sw2 / (double)n));
                for (size_t a = 0; a < N; a++)
                    G[i * N + a] += w * H[j * N + a];
            }
        for (size_t i = 0; i < n * N; i++)
            H[i] = relu(G[i]);
    }
    for (size_t a = 0; a < N; a++)
        for (size_t c = 0; c < N; c++) {
            double s = 0;
            for (size_t i = 0; i < n; i++)
                s += H[i * N + a] * H[i * N + c];
            Khat[a * N + c] = sw2 * s / (double)n;
        }
    free(G);
    free(H);
}

/* Limit of the same network: Σ¹ = σ_w² ⟨x,x′⟩/d, Σ^{l+1} = σ_w² E[relu relu]. */
static void mlp_limit(const double *X, size_t N, size_t d, int depth, double sw2, double *K)
{
    double *S = malloc(N * N * sizeof *S);
    for (size_t a = 0; a < N; a++)
        for (size_t c = 0; c < N; c++) {
            double s = 0;
            for (size_t j = 0; j < d; j++)
                s += X[a * d + j] * X[c * d + j];
            S[a * N + c] = sw2 * s / (double)d;
        }
    for (int l = 1; l <= depth; l++) {
        for (size_t a = 0; a < N; a++)
            for (size_t c = 0; c < N; c++)
                K[a * N + c] = sw2 * relu_k(S[a * N + a], S[c * N + c], S[a * N + c]);
        memcpy(S, K, N * N * sizeof *S);
    }
    free(S);
}

static const double X3[3 * 5] = {1.3, -0.4, 0.77, 0.2, -1.1, 0.5, 0.9, -0.3, 1.4, 0.35,
                                 -0.8, 0.6, 1.05, -0.25, 0.4};

/* One hidden layer: E K̂_n = K_∞ exactly, and Var K̂(x,x) = 1.25 q²/n for the raw
 * (1/n)Σ relu(g)², q = Var g (theory.md §3.4, §7.3); here K̂ carries σ_w², so
 * Var K̂(x,x) = σ_w⁴ · 1.25 q²/n. */
static void test_one_layer_exact(void **state)
{
    (void)state;
    enum { N = 3, D = 5, S = 4000 };
    const size_t n = 48;
    const double sw2 = 1.7;
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, 20240611);
    double *Kh = malloc((size_t)S * N * N * sizeof *Kh), K[N * N];
    for (int s = 0; s < S; s++)
        mlp_finite(X3, N, D, n, 1, sw2, r, Kh + (size_t)s * N * N);
    mlp_limit(X3, N, D, 1, sw2, K);
    for (int e = 0; e < N * N; e++) {
        double m = 0, m2 = 0;
        for (int s = 0; s < S; s++)
            m += Kh[s * N * N + e];
        m /= S;
        for (int s = 0; s < S; s++)
            m2 += (Kh[s * N * N + e] - m) * (Kh[s * N * N + e] - m);
        double var = m2 / (S - 1);
        assert_true(fabs(m - K[e]) < Z_ACCEPT * sqrt(var / S)); /* unbiased, every entry */
    }
    for (int a = 0; a < N; a++) {
        double q = 0;
        for (int j = 0; j < D; j++)
            q += X3[a * D + j] * X3[a * D + j];
        q *= sw2 / D;
        double want = sw2 * sw2 * 1.25 * q * q / (double)n;
        /* Library fluctuation on one entry: fluct² ‖K‖² = sample variance. */
        double *v = malloc(S * sizeof *v);
        for (int s = 0; s < S; s++)
            v[s] = Kh[s * N * N + a * N + a];
        tpk_limits_bias_result b;
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        double Kaa = K[a * N + a];
        assert_int_equal(tpk_limits_bias(v, S, 1, &Kaa, &b, &ctx), TPK_OK);
        double got = b.fluct * b.fluct * Kaa * Kaa;
        /* SE of a sample variance: √((μ4/σ⁴ − 1)/S) relative; μ4/σ⁴ ≤ 3 + 6/n·(excess of
         * relu(z)², ≈ 20) here, so ≈ √(4.5/S). */
        assert_true(fabs(got / want - 1) < Z_ACCEPT * sqrt(4.5 / S));
        /* Unbiased: the debiased bias is within noise of 0 (a few floors). */
        assert_true(b.bias < Z_ACCEPT * b.floor);
        free(v);
    }
    free(Kh);
    gsl_rng_free(r);
}

/* ReLU without bias: the diagonal is unbiased at every depth (theory.md §3.4). */
static void test_relu_diag_unbiased_depth3(void **state)
{
    (void)state;
    enum { N = 3, D = 5, S = 1500 };
    const size_t n = 24;
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, 977);
    double *Kh = malloc((size_t)S * N * N * sizeof *Kh), K[N * N];
    for (int s = 0; s < S; s++)
        mlp_finite(X3, N, D, n, 3, 2.0, r, Kh + (size_t)s * N * N);
    mlp_limit(X3, N, D, 3, 2.0, K);
    for (int a = 0; a < N; a++) {
        double *v = malloc(S * sizeof *v);
        for (int s = 0; s < S; s++)
            v[s] = Kh[s * N * N + a * N + a];
        tpk_limits_bias_result b;
        assert_int_equal(tpk_limits_bias(v, S, 1, &K[a * N + a], &b, NULL), TPK_OK);
        assert_true(b.bias < Z_ACCEPT * b.floor);
        free(v);
    }
    free(Kh);
    gsl_rng_free(r);
}

/* RMS exponent of the tiny MLP (depth 1 and 2): the bootstrap interval contains −1/2. */
static void rms_exponent(int depth, size_t nmax, size_t S, unsigned long seed)
{
    enum { N = 3, D = 5 };
    size_t W = 0;
    double n[8];
    for (size_t w = 16; w <= nmax; w *= 2)
        n[W++] = (double)w;
    double *e = malloc(W * S * sizeof *e), K[N * N], Kh[N * N];
    mlp_limit(X3, N, D, depth, 2.0, K);
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, seed);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    for (size_t w = 0; w < W; w++)
        for (size_t s = 0; s < S; s++) {
            mlp_finite(X3, N, D, (size_t)n[w], depth, 2.0, r, Kh);
            assert_int_equal(tpk_limits_frob_rel(Kh, K, N * N, &e[w * S + s], &ctx), TPK_OK);
        }
    tpk_limits_series d = {W, S, 1, n, e};
    tpk_limits_boot_opts o = {1000, 5, 0.95, 0, 0};
    tpk_limits_fit f;
    assert_int_equal(tpk_limits_boot_fit(&d, tpk_limits_stat_rms, NULL, &o, &f, NULL, NULL, NULL,
                                         &ctx),
                     TPK_OK);
    print_message("depth %d: RMS slope %.3f [%.3f, %.3f]\n", depth, f.slope, f.slope_lo,
                  f.slope_hi);
    assert_true(f.slope_lo < -0.5 && f.slope_hi > -0.5);
    assert_true(f.slope_hi - f.slope_lo < 0.3);
    free(e);
    gsl_rng_free(r);
}

static void test_rms_exponent_one_layer(void **state)
{
    (void)state;
    rms_exponent(1, 1024, 200, 31);
}

static void test_rms_exponent_two_layers(void **state)
{
    (void)state;
    rms_exponent(2, 256, 100, 37);
}

/* Synthetic per-seed errors e = c n^γ √(χ²_k/k): RMS² = c² n^{2γ} exactly in expectation. */
static double *synthetic(double gamma, double c, size_t W, size_t S, unsigned long seed, double *n)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, seed);
    double *e = malloc(W * S * sizeof *e);
    for (size_t w = 0; w < W; w++) {
        n[w] = 32.0 * pow(2.0, (double)w);
        for (size_t s = 0; s < S; s++)
            e[w * S + s] = c * pow(n[w], gamma) * sqrt(gsl_ran_chisq(r, 6.0) / 6.0);
    }
    gsl_rng_free(r);
    return e;
}

static void test_bootstrap_ci_synthetic(void **state)
{
    (void)state;
    enum { W = 7, S = 64 };
    double n[W];
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_limits_boot_opts o = {1500, 11, 0.95, 0, 0};
    tpk_limits_fit f;
    double *e = synthetic(-0.5, 2.385, W, S, 5, n);
    tpk_limits_series d = {W, S, 1, n, e};
    assert_int_equal(tpk_limits_boot_fit(&d, tpk_limits_stat_rms, NULL, &o, &f, NULL, NULL, NULL,
                                         &ctx),
                     TPK_OK);
    assert_true(f.slope_lo < -0.5 && f.slope_hi > -0.5);
    assert_int_equal(f.nfail, 0);
    free(e);
    e = synthetic(-0.7, 2.385, W, S, 6, n);
    d.recs = e;
    assert_int_equal(tpk_limits_boot_fit(&d, tpk_limits_stat_rms, NULL, &o, &f, NULL, NULL, NULL,
                                         &ctx),
                     TPK_OK);
    assert_true(f.slope_hi < -0.5);                          /* excludes −1/2 */
    assert_true(f.slope_lo < -0.7 && f.slope_hi > -0.7);     /* contains the truth */
    free(e);
}

/* Coverage: over 60 independent data sets the 95% interval contains the true exponent in most.
 * Percentile intervals under-cover slightly at S = 64; 50/60 (83%) is far below the nominal 57
 * yet would catch a broken interval (e.g. a CI of the mean of logs, or no resampling). */
static void test_bootstrap_coverage(void **state)
{
    (void)state;
    enum { W = 6, S = 64, REPS = 60 };
    double n[W];
    int hit = 0;
    tpk_limits_boot_opts o = {400, 3, 0.95, 0, 0};
    for (int rep = 0; rep < REPS; rep++) {
        double *e = synthetic(-0.5, 1.3, W, S, 1000 + (unsigned long)rep, n);
        tpk_limits_series d = {W, S, 1, n, e};
        tpk_limits_fit f;
        o.seed = (uint64_t)rep;
        assert_int_equal(tpk_limits_boot_fit(&d, tpk_limits_stat_rms, NULL, &o, &f, NULL, NULL,
                                             NULL, NULL),
                         TPK_OK);
        hit += f.slope_lo < -0.5 && f.slope_hi > -0.5;
        free(e);
    }
    print_message("coverage %d/%d\n", hit, REPS);
    assert_true(hit >= 50);
}

/* Same seed → identical intervals for 1 and 2 threads; per-width intervals bracket the value. */
static void test_bootstrap_deterministic(void **state)
{
    (void)state;
    enum { W = 5, S = 40 };
    double n[W], v1[W], lo[W], hi[W];
    double *e = synthetic(-0.5, 0.9, W, S, 77, n);
    tpk_limits_series d = {W, S, 1, n, e};
    tpk_limits_boot_opts o = {200, 99, 0.9, 1, 1};
    tpk_limits_fit f1, f2;
    omp_set_num_threads(1);
    assert_int_equal(tpk_limits_boot_fit(&d, tpk_limits_stat_rms, NULL, &o, &f1, v1, lo, hi, NULL),
                     TPK_OK);
    omp_set_num_threads(2);
    assert_int_equal(tpk_limits_boot_fit(&d, tpk_limits_stat_rms, NULL, &o, &f2, NULL, NULL, NULL,
                                         NULL),
                     TPK_OK);
    assert_memory_equal(&f1, &f2, sizeof f1);
    assert_int_equal(f1.first, 1);
    for (int w = 0; w < W; w++) {
        assert_true(lo[w] <= v1[w] && v1[w] <= hi[w]);
        assert_true(fabs(v1[w] - tpk_limits_rms(e + w * S, S)) < 1e-15);
    }
    tpk_limits_fit st[W - 1];
    assert_int_equal(tpk_limits_stability(&d, tpk_limits_stat_rms, NULL, &o, st, NULL), TPK_OK);
    assert_int_equal(st[W - 2].first, W - 2);
    assert_true(fabs(st[1].slope - f1.slope) < 1e-14);
    free(e);
}

static void test_fits_exact(void **state)
{
    (void)state;
    double n[6], y[6], y2[6], slope, icpt, se, c1, c2, cov[4], chi;
    for (int i = 0; i < 6; i++) {
        n[i] = 17.0 * pow(2.0, i);
        y[i] = 3.7 * pow(n[i], -0.83);
        y2[i] = 2.385 / sqrt(n[i]) - 4.1 / n[i];
    }
    assert_int_equal(tpk_limits_fit_power(n, y, 6, &slope, &icpt, &se, NULL), TPK_OK);
    assert_true(fabs(slope + 0.83) < 1e-12 && fabs(icpt - log(3.7)) < 1e-11 && se < 1e-10);
    assert_int_equal(tpk_limits_fit_two_term(n, y2, NULL, 6, &c1, &c2, cov, &chi, NULL), TPK_OK);
    assert_true(fabs(c1 - 2.385) < 1e-10 && fabs(c2 + 4.1) < 1e-9);
    double w[6];
    for (int i = 0; i < 6; i++)
        w[i] = 1 / (y2[i] * y2[i]);
    assert_int_equal(tpk_limits_fit_two_term(n, y2, w, 6, &c1, &c2, NULL, NULL, NULL), TPK_OK);
    assert_true(fabs(c1 - 2.385) < 1e-10 && fabs(c2 + 4.1) < 1e-9);
}

/* Two-term fit through the bootstrap: data c1 n^{-1/2} + c2 n^{-1} with multiplicative seed noise;
 * the intervals contain the true constants. */
static void test_two_term_bootstrap(void **state)
{
    (void)state;
    enum { W = 7, S = 200 };
    const double c1 = 1.9, c2 = 6.5;
    double n[W];
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, 4242);
    double *e = malloc(W * S * sizeof *e);
    for (int w = 0; w < W; w++) {
        n[w] = 16.0 * pow(2.0, w);
        double m = c1 / sqrt(n[w]) + c2 / n[w];
        for (int s = 0; s < S; s++)
            e[w * S + s] = m * sqrt(gsl_ran_chisq(r, 8.0) / 8.0);
    }
    tpk_limits_series d = {W, S, 1, n, e};
    tpk_limits_boot_opts o = {1000, 8, 0.95, 0, 0};
    tpk_limits_fit f;
    assert_int_equal(tpk_limits_boot_fit(&d, tpk_limits_stat_rms, NULL, &o, &f, NULL, NULL, NULL,
                                         NULL),
                     TPK_OK);
    print_message("two-term c1 %.3f [%.3f %.3f] c2 %.3f [%.3f %.3f]\n", f.c1, f.c1_lo, f.c1_hi,
                  f.c2, f.c2_lo, f.c2_hi);
    assert_true(f.c1_lo < c1 && c1 < f.c1_hi);
    assert_true(f.c2_lo < c2 && c2 < f.c2_hi);
    free(e);
    gsl_rng_free(r);
}

/* W1(N(0,a), N(0,b)) = √(2/π) |√a − √b|, and for symmetric ±ε variance spread at matched variance
 * W1 ≈ ε² (2φ(0) + 8φ(√3))/8 (second-order expansion, theory.md §7.5; He₃ term). */
static void test_w1_closed_forms(void **state)
{
    (void)state;
    const double pairs[][2] = {{1.0, 4.0}, {2.385, 2.4}, {0.3, 0.3}, {5.0, 1e-4}, {1e-3, 0.0}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        double a = pairs[i][0], b = pairs[i][1], w, w2;
        assert_int_equal(tpk_limits_w1_mixtures(&a, NULL, 1, &b, NULL, 1, &w, NULL), TPK_OK);
        assert_int_equal(tpk_limits_rbw1(&b, 1, a, &w2, NULL), TPK_OK);
        double want = sqrt(2 / M_PI) * fabs(sqrt(a) - sqrt(b));
        assert_true(fabs(w - want) <= 1e-8 * fmax(want, 1e-300) + 1e-15);
        assert_true(fabs(w - w2) <= 1e-13 * fmax(w, 1e-300));
    }
    const double eps = 0.01, v[2] = {1 + eps, 1 - eps};
    double phi0 = 1 / sqrt(2 * M_PI), phi3 = phi0 * exp(-1.5), w;
    assert_int_equal(tpk_limits_rbw1_shape(v, 2, &w, NULL), TPK_OK);
    double want = eps * eps * (2 * phi0 + 8 * phi3) / 8;
    assert_true(fabs(w / want - 1) < 1e-3);
    /* Weighted mixture vs the same mixture, weights doubled: distance 0. */
    const double va[3] = {0.5, 1.5, 2.2}, wa[3] = {1, 2, 3}, wb[3] = {2, 4, 6};
    assert_int_equal(tpk_limits_w1_mixtures(va, wa, 3, va, wb, 3, &w, NULL), TPK_OK);
    assert_true(w < 1e-14);
}

/* Plain RB-W1 of 2-layer ReLU variances (exact sampler: a single input's K̂/K is a product of
 * independent (2/n) χ²_{Bin(n,1/2)} factors, theory.md §3.4): the variance-matched W1 has
 * exponent −1 and n·W1 ≈ 0.189·n Var(v) ≈ 1.9; the floor of the plain estimator is reported. */
static void test_rbw1_exponent(void **state)
{
    (void)state;
    enum { W = 7, S = 200 };
    double n[W];
    double *v = malloc(W * S * sizeof *v);
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, 4);
    for (int w = 0; w < W; w++) {
        n[w] = 32.0 * pow(2.0, w);
        for (int s = 0; s < S; s++) {
            double x = 1;
            for (int l = 0; l < 2; l++) {
                unsigned b = gsl_ran_binomial(r, 0.5, (unsigned)n[w]);
                x *= b ? 2 * gsl_ran_chisq(r, b) / n[w] : 0;
            }
            v[w * S + s] = x;
        }
    }
    tpk_limits_series d = {W, S, 1, n, v};
    tpk_limits_boot_opts o = {300, 1, 0.95, 0, 0};
    tpk_limits_fit f;
    double val[W];
    assert_int_equal(tpk_limits_boot_fit(&d, tpk_limits_stat_rbw1, NULL, &o, &f, val, NULL, NULL,
                                         NULL),
                     TPK_OK);
    print_message("shape RB-W1 slope %.3f [%.3f %.3f]\n", f.slope, f.slope_lo, f.slope_hi);
    assert_true(f.slope_lo < -1 && f.slope_hi > -1);
    for (int w = 0; w < W; w++)
        assert_true(n[w] * val[w] > 1.0 && n[w] * val[w] < 3.0);
    double vinf = 1, raw, floor_;
    assert_int_equal(tpk_limits_rbw1(v + 6 * S, S, vinf, &raw, NULL), TPK_OK);
    assert_int_equal(tpk_limits_rbw1_floor(v + 6 * S, S, 100, 2, &floor_, NULL), TPK_OK);
    /* Floor ≈ 0.32 √(Var v / S) = 0.32 √(10/(2048·200)) ≈ 1.6e-3. */
    assert_true(floor_ > 0.8e-3 && floor_ < 3e-3);
    assert_true(raw > 0);
    tpk_limits_fit fk;
    assert_int_equal(tpk_limits_boot_fit(&d, tpk_limits_stat_mix_kurtosis, NULL, &o, &fk, NULL,
                                         NULL, NULL, NULL),
                     TPK_OK);
    assert_true(fk.slope_lo < -1 && fk.slope_hi > -1);
    free(v);
    gsl_rng_free(r);
}

static void test_samples_and_sliced(void **state)
{
    (void)state;
    enum { M = 20000, k = 3, L = 8 };
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, 12);
    double *x = malloc(M * sizeof *x), w, kurt;
    for (int i = 0; i < M; i++)
        x[i] = gsl_ran_gaussian(r, 2.0);
    assert_int_equal(tpk_limits_w1_gauss_samples(x, M, 4.0, &w, NULL), TPK_OK);
    assert_true(w < 0.05); /* noise floor ~ M^{-1/2} · σ */
    assert_int_equal(tpk_limits_w1_gauss_samples(x, M, 1.0, &w, NULL), TPK_OK);
    assert_true(fabs(w - sqrt(2 / M_PI)) < 0.05); /* √(2/π)|2 − 1| */
    assert_int_equal(tpk_limits_kurtosis(x, M, &kurt, NULL), TPK_OK);
    assert_true(fabs(kurt) < Z_ACCEPT * sqrt(24.0 / M));
    for (int i = 0; i < M; i++)
        x[i] = gsl_ran_laplace(r, 1.0);
    assert_int_equal(tpk_limits_kurtosis(x, M, &kurt, NULL), TPK_OK);
    assert_true(fabs(kurt - 3.0) < 0.6);

    const double K[k * k] = {1.0, 0.3, 0.1, 0.3, 2.0, -0.4, 0.1, -0.4, 0.7};
    double theta[L * k];
    assert_int_equal(tpk_limits_directions(k, L, 5, theta, NULL), TPK_OK);
    for (int l = 0; l < L; l++)
        assert_true(fabs(theta[l * k] * theta[l * k] + theta[l * k + 1] * theta[l * k + 1] +
                         theta[l * k + 2] * theta[l * k + 2] - 1) < 1e-14);
    tpk_limits_slices sl = {k, L, theta, K, 0};
    double Kh[4 * k * k];
    for (int s = 0; s < 4; s++)
        memcpy(Kh + s * k * k, K, sizeof K);
    assert_int_equal(tpk_limits_rbsw1(Kh, 4, &sl, &w, NULL), TPK_OK);
    assert_true(w < 1e-14);
    /* A scaled kernel: every slice is W1(N(0,4σ²), N(0,σ²)) = √(2/π) σ. */
    for (int i = 0; i < k * k; i++)
        Kh[i] = 4 * K[i];
    double want = 0;
    for (int l = 0; l < L; l++) {
        double q = 0;
        for (int i = 0; i < k; i++)
            for (int j = 0; j < k; j++)
                q += theta[l * k + i] * K[i * k + j] * theta[l * k + j];
        want += sqrt(2 / M_PI) * sqrt(q) / L;
    }
    assert_int_equal(tpk_limits_rbsw1(Kh, 1, &sl, &w, NULL), TPK_OK);
    assert_true(fabs(w - want) < 1e-8 * want);
    /* GP-vs-GP floor: positive, ~M^{-1/2}; GP samples sit at the floor, scaled ones far above. */
    double fm, fsd;
    assert_int_equal(tpk_limits_sw1_gp_floor(500, &sl, 20, 9, &fm, &fsd, NULL), TPK_OK);
    assert_true(fm > 0.005 && fm < 0.1 && fsd > 0);
    double *Y = malloc(500 * k * sizeof *Y);
    for (int i = 0; i < 500; i++) { /* N(0, K) via a fixed factor L Lᵀ = K (Cholesky by hand) */
        double z0 = gsl_ran_gaussian(r, 1), z1 = gsl_ran_gaussian(r, 1), z2 = gsl_ran_gaussian(r, 1);
        double l00 = 1, l10 = 0.3, l11 = sqrt(2 - 0.09), l20 = 0.1, l21 = (-0.4 - 0.03) / l11,
               l22 = sqrt(0.7 - 0.01 - l21 * l21);
        Y[i * k] = l00 * z0;
        Y[i * k + 1] = l10 * z0 + l11 * z1;
        Y[i * k + 2] = l20 * z0 + l21 * z1 + l22 * z2;
    }
    assert_int_equal(tpk_limits_sw1_samples(Y, 500, &sl, &w, NULL), TPK_OK);
    assert_true(w < fm + 5 * fsd);
    for (int i = 0; i < 500 * k; i++)
        Y[i] *= 2;
    assert_int_equal(tpk_limits_sw1_samples(Y, 500, &sl, &w, NULL), TPK_OK);
    assert_true(w > fm + 10 * fsd);
    free(Y);
    free(x);
    gsl_rng_free(r);
}

static void test_energy_mmd(void **state)
{
    (void)state;
    enum { M = 600, k = 2 };
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, 31337);
    double *X = malloc(M * k * sizeof *X), *Y = malloc(M * k * sizeof *Y),
           *Z = malloc(M * k * sizeof *Z);
    for (int i = 0; i < M * k; i++) {
        X[i] = gsl_ran_gaussian(r, 1);
        Y[i] = gsl_ran_gaussian(r, 1);
        /* same variance, heavier tails: a Gaussian scale mixture, as in attention (§5.2) */
        Z[i] = gsl_ran_gaussian(r, 1) * sqrt(gsl_rng_uniform(r) < 0.5 ? 0.1 : 1.9);
    }
    double e0, e1, m0, m1;
    assert_int_equal(tpk_limits_energy(X, M, Y, M, k, &e0, NULL), TPK_OK);
    assert_int_equal(tpk_limits_energy(X, M, Z, M, k, &e1, NULL), TPK_OK);
    assert_true(fabs(e0) < 0.01);
    assert_true(e1 > 0.01 && e1 > 4 * fabs(e0));
    assert_int_equal(tpk_limits_mmd2(X, M, Y, M, k, 1.0, &m0, NULL), TPK_OK);
    assert_int_equal(tpk_limits_mmd2(X, M, Z, M, k, 1.0, &m1, NULL), TPK_OK);
    assert_true(fabs(m0) < 0.005 && m1 > 4 * fabs(m0));
    free(X);
    free(Y);
    free(Z);
    gsl_rng_free(r);
}

/* Every error path once. */
static int stat_negative(const double *recs, size_t S, size_t rec, const size_t *idx,
                         const void *user, double *out, tpk_ctx *ctx)
{
    (void)recs, (void)S, (void)rec, (void)user, (void)ctx;
    *out = idx ? -1.0 : 1.0; /* fine on the full sample, never on a resample */
    return TPK_OK;
}

static void test_errors(void **state)
{
    (void)state;
    tpk_ctx ctx;
    double K[2] = {0, 0}, Kh[2] = {1, 2}, out, a = 1, b = -1;
#define EXPECT(call, code)                                                                         \
    do {                                                                                           \
        tpk_ctx_init(&ctx);                                                                        \
        assert_int_equal((call), (code));                                                          \
        assert_int_equal(ctx.status, (code));                                                      \
        assert_true(ctx.msg[0] != '\0');                                                           \
    } while (0)
    EXPECT(tpk_limits_frob_rel(Kh, K, 2, &out, &ctx), TPK_EDOM);
    EXPECT(tpk_limits_frob_rel(NULL, K, 2, &out, &ctx), TPK_EINVAL);
    tpk_limits_bias_result br;
    EXPECT(tpk_limits_bias(Kh, 1, 2, Kh, &br, &ctx), TPK_EINVAL);
    EXPECT(tpk_limits_bias(Kh, 2, 1, K, &br, &ctx), TPK_EDOM);
    assert_true(isnan(tpk_limits_rms(Kh, 0)));
    double n2[2] = {8, 16}, y2[2] = {1, 0};
    double s, i;
    EXPECT(tpk_limits_fit_power(n2, y2, 2, &s, &i, NULL, &ctx), TPK_EDOM);
    EXPECT(tpk_limits_fit_power(n2, y2, 1, &s, &i, NULL, &ctx), TPK_EINVAL);
    double n3[2] = {8, 8}, y3[2] = {1, 2};
    EXPECT(tpk_limits_fit_power(n3, y3, 2, &s, &i, NULL, &ctx), TPK_EDOM);
    EXPECT(tpk_limits_fit_two_term(n2, y2, NULL, 1, &s, &i, NULL, NULL, &ctx), TPK_EINVAL);
    double nbad[2] = {-1, 4};
    EXPECT(tpk_limits_fit_two_term(nbad, y3, NULL, 2, &s, &i, NULL, NULL, &ctx), TPK_EDOM);
    EXPECT(tpk_limits_w1_mixtures(&a, NULL, 1, &b, NULL, 1, &out, &ctx), TPK_EDOM);
    double zero_w = 0;
    EXPECT(tpk_limits_w1_mixtures(&a, &zero_w, 1, &a, NULL, 1, &out, &ctx), TPK_EINVAL);
    EXPECT(tpk_limits_rbw1_floor(&a, 1, 10, 0, &out, &ctx), TPK_EINVAL);
    EXPECT(tpk_limits_rbw1_shape(NULL, 1, &out, &ctx), TPK_EINVAL);
    EXPECT(tpk_limits_kurtosis(Kh, 2, &out, &ctx), TPK_EINVAL);
    double flat[4] = {1, 1, 1, 1};
    EXPECT(tpk_limits_kurtosis(flat, 4, &out, &ctx), TPK_EDOM);
    EXPECT(tpk_limits_w1_gauss_samples(Kh, 2, -1, &out, &ctx), TPK_EDOM);
    EXPECT(tpk_limits_energy(Kh, 1, Kh, 2, 1, &out, &ctx), TPK_EINVAL);
    EXPECT(tpk_limits_mmd2(Kh, 2, Kh, 2, 1, 0.0, &out, &ctx), TPK_EINVAL);
    EXPECT(tpk_limits_directions(0, 1, 0, Kh, &ctx), TPK_EINVAL);
    tpk_limits_slices bad = {0, 0, NULL, NULL, 0};
    EXPECT(tpk_limits_rbsw1(Kh, 1, &bad, &out, &ctx), TPK_EINVAL);
    EXPECT(tpk_limits_sw1_samples(Kh, 1, &bad, &out, &ctx), TPK_EINVAL);
    EXPECT(tpk_limits_sw1_gp_floor(10, &bad, 1, 0, &out, NULL, &ctx), TPK_EINVAL);
    double th[2] = {1, 0}, K2[4] = {1, 0, 0, 1};
    tpk_limits_slices sl = {2, 1, th, K2, 0};
    EXPECT(tpk_limits_stat_rbsw1(Kh, 1, 3, NULL, &sl, &out, &ctx), TPK_EINVAL);
    EXPECT(tpk_limits_stat_rbw1(Kh, 1, 2, NULL, NULL, &out, &ctx), TPK_EINVAL);
    EXPECT(tpk_limits_stat_rms(Kh, 1, 2, NULL, NULL, &out, &ctx), TPK_EINVAL);
    EXPECT(tpk_limits_stat_mix_kurtosis(Kh, 1, 1, NULL, NULL, &out, &ctx), TPK_EINVAL);
    double negv[2] = {-1, -2};
    EXPECT(tpk_limits_stat_mix_kurtosis(negv, 2, 1, NULL, NULL, &out, &ctx), TPK_EDOM);

    double nn[3] = {8, 16, 32}, recs[6] = {1, 2, 1, 2, 1, 2};
    tpk_limits_series d = {3, 2, 1, nn, recs};
    tpk_limits_boot_opts o = {100, 1, 0.95, 0, 0};
    tpk_limits_fit f;
    EXPECT(tpk_limits_boot_fit(&d, stat_negative, NULL, &o, &f, NULL, NULL, NULL, &ctx),
           TPK_ENUMERIC);
    o.first = 2;
    EXPECT(tpk_limits_boot_fit(&d, tpk_limits_stat_rms, NULL, &o, &f, NULL, NULL, NULL, &ctx),
           TPK_EINVAL);
    o.first = 0;
    o.B = 5;
    EXPECT(tpk_limits_boot_fit(&d, tpk_limits_stat_rms, NULL, &o, &f, NULL, NULL, NULL, &ctx),
           TPK_EINVAL);
    o.B = 100;
    o.level = 1.0;
    EXPECT(tpk_limits_stability(&d, tpk_limits_stat_rms, NULL, &o, &f, &ctx), TPK_EINVAL);
    o.level = 0.95;
    EXPECT(tpk_limits_stability(&d, tpk_limits_stat_rms, NULL, &o, NULL, &ctx), TPK_EINVAL);
    double zrec[6] = {0, 0, 0, 0, 0, 0};
    d.recs = zrec;
    EXPECT(tpk_limits_boot_fit(&d, tpk_limits_stat_rms, NULL, &o, &f, NULL, NULL, NULL, &ctx),
           TPK_EDOM);
#undef EXPECT
}

/* The fitting-window rule (tpk_limits_fit_window): the first width is the smallest with
 * |c2|/(c1 √n) ≤ ratio when c2's interval excludes 0, all widths when it does not, the cap keeps
 * `keep` widths, and every error path. Widths 32·2^i; with c1 = 2.385, |c2| = 4.1 the ratio
 * 4.1/(2.385 √n) is 0.304 at 32, 0.107 at 256, 0.076 at 512, so ratio 0.1 picks 512 (index 4). */
static void test_fit_window(void **state)
{
    (void)state;
    enum { W = 8 };
    double n[W];
    for (int i = 0; i < W; i++)
        n[i] = 32.0 * pow(2.0, i);
    tpk_limits_fit all = {.c1 = 2.385, .c2 = 4.1, .c2_lo = 3.2, .c2_hi = 5.3};
    tpk_limits_window win;
    assert_int_equal(tpk_limits_fit_window(n, W, &all, 0.1, 3, &win, NULL), TPK_OK);
    assert_true(win.resolved && !win.capped);
    assert_int_equal(win.first, 4);
    double need = pow(4.1 / (0.1 * 2.385), 2); /* 295.5: 256 misses it, 512 is the first above */
    assert_true(fabs(win.n_needed - need) < 1e-9 * need);
    assert_true(fabs(win.ratio_at_first - 4.1 / (2.385 * sqrt(512.0))) < 1e-12);
    /* A negative correction counts by its size. */
    all = (tpk_limits_fit){.c1 = 2.385, .c2 = -4.1, .c2_lo = -5.3, .c2_hi = -3.2};
    assert_int_equal(tpk_limits_fit_window(n, W, &all, 0.1, 3, &win, NULL), TPK_OK);
    assert_int_equal(win.first, 4);
    /* A looser bound starts lower; a tight one is capped to keep 3 widths. */
    assert_int_equal(tpk_limits_fit_window(n, W, &all, 0.31, 3, &win, NULL), TPK_OK);
    assert_int_equal(win.first, 0);
    assert_int_equal(tpk_limits_fit_window(n, W, &all, 0.01, 3, &win, NULL), TPK_OK);
    assert_true(win.capped && win.first == W - 3);
    /* Not resolved (interval contains 0): every width, whatever the point estimate. */
    all.c2_hi = 0.4;
    assert_int_equal(tpk_limits_fit_window(n, W, &all, 0.01, 3, &win, NULL), TPK_OK);
    assert_true(!win.resolved && !win.capped && win.first == 0);
    /* A resolved correction without an n^-1/2 regime (c1 ≤ 0): capped. */
    all = (tpk_limits_fit){.c1 = -0.05, .c2 = 5.0, .c2_lo = 4.0, .c2_hi = 6.0};
    assert_int_equal(tpk_limits_fit_window(n, W, &all, 0.1, 2, &win, NULL), TPK_OK);
    assert_true(win.capped && win.first == W - 2 && isinf(win.n_needed));
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_limits_fit_window(n, W, &all, 0.1, 1, &win, &ctx), TPK_EINVAL);
    assert_int_equal(tpk_limits_fit_window(n, W, &all, 0.1, W + 1, &win, &ctx), TPK_EINVAL);
    assert_int_equal(tpk_limits_fit_window(n, W, &all, 0.0, 3, &win, &ctx), TPK_EINVAL);
    assert_int_equal(tpk_limits_fit_window(NULL, W, &all, 0.1, 3, &win, &ctx), TPK_EINVAL);
    all.c2 = NAN;
    assert_int_equal(tpk_limits_fit_window(n, W, &all, 0.1, 3, &win, &ctx), TPK_EDOM);
    all.c2 = 5.0;
    n[3] = n[2];
    assert_int_equal(tpk_limits_fit_window(n, W, &all, 0.1, 3, &win, &ctx), TPK_EDOM);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_layer_exact),
        cmocka_unit_test(test_relu_diag_unbiased_depth3),
        cmocka_unit_test(test_rms_exponent_one_layer),
        cmocka_unit_test(test_rms_exponent_two_layers),
        cmocka_unit_test(test_bootstrap_ci_synthetic),
        cmocka_unit_test(test_bootstrap_coverage),
        cmocka_unit_test(test_bootstrap_deterministic),
        cmocka_unit_test(test_fits_exact),
        cmocka_unit_test(test_fit_window),
        cmocka_unit_test(test_two_term_bootstrap),
        cmocka_unit_test(test_w1_closed_forms),
        cmocka_unit_test(test_rbw1_exponent),
        cmocka_unit_test(test_samples_and_sliced),
        cmocka_unit_test(test_energy_mmd),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
