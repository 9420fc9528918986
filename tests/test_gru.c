/* GRU and LSTM (theory.md §2.3, §2.4): the orthant back-end against exact orthant probabilities,
 * the joint sampler (netsor/limit_joint.c) against Gaussian moments and against per-group sampling,
 * the GRU limit against an independent recursion written here (tensor Gauss–Hermite over the
 * z-family, 2-D rules for the others), the finite-width executor on the same programs (within 3
 * standard errors at the largest width, RMS error ~ n^(-1/2)), and the invariants (symmetric, PSD,
 * finite for zero and repeated inputs). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <gsl/gsl_integration.h>
#include <lapacke.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpk/job.h"
#include "tpk/kernels.h"
#include <omp.h>
#include <signal.h>
#include <gsl/gsl_cdf.h>

#include "tpk/limits.h"
#include "tpk/tpk.h"
#include "../netsor/backend-impl.h"
#include "../netsor/joint-impl.h"
#include "../netsor/orthant-impl.h"
#include "gru_reference.h"

enum { N = 3, D = 3 };
/* The accuracy for the GRU limit (T ≤ 8): relative to the largest kernel entry. */
#define TOL_GRU 1e-5
/* Exact orthant probabilities: the back-end's own standard error times this, plus a floor for
 * the 1-D reference quadrature (composite Simpson, 4000 panels: ~1e-12). */
#define N_SE 5.0
/* Executor vs limit, with thresholds from the seeds' own spread (a fixed tolerance on a slope
 * fitted from a few seeds fails on about one draw of the weights in three): the fitted RMS slope
 * within 3 of its standard errors of [−1, −1/2] (fluctuation n^-1/2 plus bias n^-1, theory
 * §7.2), that interval narrow enough (3 SE ≤ SLOPE_SE_MAX) to tell convergence from none, and
 * every entry's seed mean at the largest width within the two-sided t quantile at family-wise
 * level EXEC_ALPHA (Bonferroni over the entries) of the limit. */
#define SLOPE_SE_MAX 0.25
#define EXEC_ALPHA 1e-3
/* PSD: smallest eigenvalue ≥ −(PSD_TOL·largest + dim·error estimate): QMC entries carry their
 * own errors. */
#define PSD_TOL 1e-6

/* GRU parameters, all different so that a swapped one shows (issue-4 names). */
static const double vUz = 0.9, vUr = 1.1, vUh = 1.2, vWz = 0.8, vWr = 1.3, vWh = 0.7;
static const double vbz = 0.15, vbr = 0.1, vbh = 0.2, mbz = 0.1, mbr = -0.2, mbh = 0.05;
static const double sv2 = 1.1;

static void sequences(double *x, int T)
{
    for (int a = 0; a < N; a++)
        for (int t = 0; t < T; t++)
            for (int j = 0; j < D; j++)
                x[(a * T + t) * D + j] = sin(1.37 * a + 0.61 * t + 2.11 * j + 0.3) * (1.0 + 0.2 * a);
}

static double Phi(double x) { return 0.5 * erfc(-x / sqrt(2.0)); }
static double esig(double x) { return 0.5 * (1.0 + erf(x)); }

/* ---- exact orthant probabilities ------------------------------------------------------------ */

/* P(X_i < b_i ∀i), X ~ N(0, (1 − r)I + r11ᵀ), r ≥ 0: ∫ φ(u) Π Φ((b_i − √r u)/√(1 − r)) du
 * (composite Simpson on [−9, 9]). */
static double equicorrelated(int m, const double *b, double r)
{
    int n = 4000;
    double lo = -9, h = 18.0 / n, s = 0;
    for (int i = 0; i <= n; i++) {
        double u = lo + i * h, w = (i == 0 || i == n) ? 1 : (i % 2 ? 4 : 2);
        double p = exp(-u * u / 2) / sqrt(2 * M_PI);
        for (int k = 0; k < m; k++)
            p *= Phi((b[k] - sqrt(r) * u) / sqrt(1 - r));
        s += w * p;
    }
    return s * h / 3;
}

static void test_orthant_exact(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    /* 5–12: Owen-scrambled Sobol points; 44: shifted Halton points (beyond GSL's Sobol) */
    static const int dims[] = {1, 2, 3, 5, 8, 12, 44};
    for (size_t q = 0; q < sizeof dims / sizeof dims[0]; q++) {
        int m = dims[q];
        static double mu[64], S[64 * 64], b[64];
        double r = 0.35 + 0.05 * (double)q;
        for (int i = 0; i < m; i++) {
            mu[i] = 0.4 * sin(1.3 * i + 0.2) + 0.1;
            b[i] = mu[i];
            for (int j = 0; j < m; j++)
                S[i * m + j] = i == j ? 1.0 : r;
        }
        tpk_estimate e;
        assert_int_equal(tpk_nsr_orthant(m, mu, S, 42, NULL, &e, &ctx), TPK_OK);
        double ex = equicorrelated(m, b, r);
        print_message("orthant m=%2d: P=%.9f exact %.9f diff %.2e se %.2e\n", m, e.value, ex,
                      e.value - ex, e.err);
        assert_true(fabs(e.value - ex) <= N_SE * e.err + 1e-11);
        /* the default tolerance is met — but for 44 dims, where the Halton points stop at the
         * point cap short of it (measured: standard error 4.6e-6 against 6e-7 asked) */
        if (m <= 12)
            assert_true(e.err <= 1e-5 * ex);
    }
    /* steps (ξ variance 0): P(u > 0, v > 0) = 1/4 + asin(ρ)/(2π) (theory §3.2 step row) */
    double mu0[2] = {0, 0}, S2[4] = {1.3, 0.6, 0.6, 0.8};
    tpk_estimate e;
    assert_int_equal(tpk_nsr_orthant(2, mu0, S2, 7, NULL, &e, &ctx), TPK_OK);
    double rho = 0.6 / sqrt(1.3 * 0.8), ex = 0.25 + asin(rho) / (2 * M_PI);
    assert_true(fabs(e.value - ex) <= N_SE * e.err + 1e-9);
    /* a repeated variable (singular S) and a deterministic one */
    double S3[9] = {1, 1, 0.5, 1, 1, 0.5, 0.5, 0.5, 1}, mu3[3] = {0.3, 0.3, -0.2};
    assert_int_equal(tpk_nsr_orthant(3, mu3, S3, 7, NULL, &e, &ctx), TPK_OK);
    double b2[2] = {0.3, -0.2};
    ex = equicorrelated(2, b2, 0.5);
    assert_true(fabs(e.value - ex) <= N_SE * e.err + 1e-9);
    double S1[4] = {0, 0, 0, 1}, mu1[2] = {-0.1, 0.5};
    assert_int_equal(tpk_nsr_orthant(2, mu1, S1, 7, NULL, &e, &ctx), TPK_OK);
    assert_true(e.value == 0.0);
    /* errors */
    assert_int_equal(tpk_nsr_orthant(TPK_ORTHANT_MAXDIM + 1, mu1, S1, 7, NULL, &e, &ctx), TPK_EINVAL);
    double Sbad[1] = {-1}, mubad[1] = {0};
    assert_int_equal(tpk_nsr_orthant(1, mubad, Sbad, 7, NULL, &e, &ctx), TPK_EDOM);
}

/* ---- an independent GRU recursion (T = 2) ----------------------------------------------------- */

typedef struct rule {
    int n;
    double x[64], w[64];
} rule;

/* Gauss–Hermite for N(0, 1) from GSL's e^{−x²} rule. */
static void gh_rule(int n, rule *r)
{
    gsl_integration_fixed_workspace *ws =
        gsl_integration_fixed_alloc(gsl_integration_fixed_hermite, (size_t)n, 0, 1, 0, 0);
    const double *x = gsl_integration_fixed_nodes(ws), *w = gsl_integration_fixed_weights(ws);
    r->n = n;
    for (int i = 0; i < n; i++) {
        r->x[i] = sqrt(2.0) * x[i];
        r->w[i] = w[i] / sqrt(M_PI);
    }
    gsl_integration_fixed_free(ws);
}

/* Semidefinite Cholesky (zero pivots skipped): C = L Lᵀ, m ≤ 4. */
static void chol(int m, const double *C, double *L)
{
    memset(L, 0, (size_t)(m * m) * sizeof *L);
    for (int j = 0; j < m; j++) {
        double s = C[j * m + j];
        for (int k = 0; k < j; k++)
            s -= L[j * m + k] * L[j * m + k];
        if (s <= 1e-12 * (1 + fabs(C[j * m + j])))
            continue;
        L[j * m + j] = sqrt(s);
        for (int i = j + 1; i < m; i++) {
            double t = C[i * m + j];
            for (int k = 0; k < j; k++)
                t -= L[i * m + k] * L[j * m + k];
            L[i * m + j] = t / L[j * m + j];
        }
    }
}

/* E[f(Z1) g(Z2)], (Z1, Z2) ~ N((m1, m2), [[q1, k], [k, q2]]), 2-D Gauss–Hermite. */
static double e2(double (*f)(double), double (*g)(double), double m1, double m2, double q1,
                 double q2, double k, const rule *r)
{
    double C[4] = {q1, k, k, q2}, L[4], s = 0;
    chol(2, C, L);
    for (int i = 0; i < r->n; i++)
        for (int j = 0; j < r->n; j++) {
            double u = m1 + L[0] * r->x[i], v = m2 + L[2] * r->x[i] + L[3] * r->x[j];
            s += r->w[i] * r->w[j] * f(u) * g(v);
        }
    return s;
}

static double gram(const double *x, int T, int a, int t, int c, int s)
{
    double g = 0;
    for (int j = 0; j < D; j++)
        g += x[(a * T + t) * D + j] * x[(c * T + s) * D + j];
    return g / D;
}

/* The §2.3 recursion for T = 2, all outputs: Y[(a,t),(c,s)] = σ_v² E[h^t_a h^s_c]. */
static void gru_reference(const double *x, double *Y)
{
    enum { T = 2 };
    rule r2, r4;
    gh_rule(48, &r2);
    gh_rule(24, &r4);
    double H1[N][N], E11[N][N], Rr2[N][N];
    /* step 1: h¹ = σ(z̃¹) erf(h̃¹) */
    for (int a = 0; a < N; a++)
        for (int c = 0; c < N; c++) {
            double qz_a = vUz * gram(x, T, a, 0, a, 0) + vbz, qz_c = vUz * gram(x, T, c, 0, c, 0) + vbz;
            double kz = vUz * gram(x, T, a, 0, c, 0) + vbz;
            double qh_a = vUh * gram(x, T, a, 0, a, 0) + vbh, qh_c = vUh * gram(x, T, c, 0, c, 0) + vbh;
            double kh = vUh * gram(x, T, a, 0, c, 0) + vbh;
            E11[a][c] = e2(erf, erf, mbh, mbh, qh_a, qh_c, kh, &r2);
            H1[a][c] = e2(esig, esig, mbz, mbz, qz_a, qz_c, kz, &r2) * E11[a][c];
        }
    /* r² (only E[r² r²'] enters: W_h multiplies h¹ ⊙ r²) */
    for (int a = 0; a < N; a++)
        for (int c = 0; c < N; c++) {
            double qa = vUr * gram(x, T, a, 1, a, 1) + vWr * H1[a][a] + vbr;
            double qc = vUr * gram(x, T, c, 1, c, 1) + vWr * H1[c][c] + vbr;
            double k = vUr * gram(x, T, a, 1, c, 1) + vWr * H1[a][c] + vbr;
            Rr2[a][c] = e2(esig, esig, mbr, mbr, qa, qc, k, &r2);
        }
    /* h̃ covariances over (time, input) and the erf expectations E[e^i_a e^j_c] */
    double Eh[2][2][N][N];
    for (int a = 0; a < N; a++)
        for (int c = 0; c < N; c++)
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 2; j++) {
                    double q[2], k;
                    int ai[2] = {a, c}, ti[2] = {i, j};
                    for (int p = 0; p < 2; p++) {
                        int b = ai[p], t = ti[p];
                        q[p] = vUh * gram(x, T, b, t, b, t) + vbh + (t == 1 ? vWh * H1[b][b] * Rr2[b][b] : 0);
                    }
                    k = vUh * gram(x, T, a, i, c, j) + vbh + (i == 1 && j == 1 ? vWh * H1[a][c] * Rr2[a][c] : 0);
                    Eh[i][j][a][c] = e2(erf, erf, mbh, mbh, q[0], q[1], k, &r2);
                }
    /* z-family over (z̃¹_a, z̃²_a, z̃¹_c, z̃²_c): 4-D Gauss–Hermite of the gate products */
    for (int a = 0; a < N; a++)
        for (int c = 0; c < N; c++) {
            int in[4] = {a, a, c, c}, tm[4] = {0, 1, 0, 1};
            double C[16], L[16];
            for (int p = 0; p < 4; p++)
                for (int q = 0; q < 4; q++)
                    C[p * 4 + q] = vUz * gram(x, T, in[p], tm[p], in[q], tm[q]) + vbz +
                                   (tm[p] == 1 && tm[q] == 1 ? vWz * H1[in[p]][in[q]] : 0);
            chol(4, C, L);
            /* ζ_1 = σ(z̃¹)(1 − σ(z̃²)), ζ_2 = σ(z̃²); Z[i][j] = E[ζ_i^a ζ_j^c], Z1[i] = E[ζ_i^a σ(z̃¹_c)] */
            double Zs[2][2] = {{0}}, Z1[2] = {0};
            const rule *r = &r4;
            for (int i0 = 0; i0 < r->n; i0++)
                for (int i1 = 0; i1 < r->n; i1++)
                    for (int i2 = 0; i2 < r->n; i2++)
                        for (int i3 = 0; i3 < r->n; i3++) {
                            double g[4] = {r->x[i0], r->x[i1], r->x[i2], r->x[i3]}, z[4];
                            double w = r->w[i0] * r->w[i1] * r->w[i2] * r->w[i3];
                            for (int p = 0; p < 4; p++) {
                                z[p] = mbz;
                                for (int q = 0; q <= p; q++)
                                    z[p] += L[p * 4 + q] * g[q];
                            }
                            double za[2] = {esig(z[0]) * (1 - esig(z[1])), esig(z[1])};
                            double zc[2] = {esig(z[2]) * (1 - esig(z[3])), esig(z[3])};
                            for (int i = 0; i < 2; i++) {
                                for (int j = 0; j < 2; j++)
                                    Zs[i][j] += w * za[i] * zc[j];
                                Z1[i] += w * za[i] * esig(z[2]);
                            }
                        }
            double h22 = 0, h21 = 0;
            for (int i = 0; i < 2; i++) {
                for (int j = 0; j < 2; j++)
                    h22 += Zs[i][j] * Eh[i][j][a][c];
                h21 += Z1[i] * Eh[i][0][a][c];
            }
            int M = N * T;
            Y[(a * T + 0) * M + c * T + 0] = sv2 * H1[a][c];
            Y[(a * T + 1) * M + c * T + 1] = sv2 * h22;
            Y[(a * T + 1) * M + c * T + 0] = sv2 * h21;
            Y[(c * T + 0) * M + a * T + 1] = sv2 * h21;
        }
}

static tpk_program *load(const char *prog, int T, const tpk_param_set *extra, int nextra,
                         tpk_phi_registry *reg, tpk_ctx *ctx)
{
    char path[4200], tb[16], v[13][32];
    tpk_shipped_path(prog, path, sizeof path);
    snprintf(tb, sizeof tb, "%d", T);
    tpk_param_set sets[32] = {{"T", tb}};
    int n = 1;
    if (strstr(prog, "gru")) {
        const char *names[] = {"var_Uz", "var_Ur", "var_Uh", "var_Wz", "var_Wr", "var_Wh", "var_bz",
                               "var_br", "var_bh", "mu_bz", "mu_br", "mu_bh", "sigma_v2"};
        const double vals[] = {vUz, vUr, vUh, vWz, vWr, vWh, vbz, vbr, vbh, mbz, mbr, mbh, sv2};
        for (int i = 0; i < 13; i++) {
            snprintf(v[i], sizeof v[i], "%.17g", vals[i]);
            sets[n++] = (tpk_param_set){names[i], v[i]};
        }
    }
    for (int i = 0; i < nextra; i++)
        sets[n++] = extra[i];
    tpk_netsor_opts o = {.sets = sets, .nsets = n};
    tpk_program *p = tpk_netsor_load_file(path, &o, reg, ctx);
    if (!p)
        fail_msg("%s", ctx->msg);
    return p;
}

static tpk_array *seq_array(int T, tpk_ctx *ctx)
{
    size_t dims[3] = {N, (size_t)T, D};
    tpk_array *x = tpk_array_alloc(3, dims, ctx);
    sequences(x->data, T);
    return x;
}

static void test_gru_matches_recursion(void **state)
{
    (void)state;
    enum { T = 2, M = N * T };
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_job_registry(&ctx);
    tpk_program *p = load("programs/gru.nsr", T, NULL, 0, reg, &ctx);
    tpk_array *x = seq_array(T, &ctx), *K = NULL;
    double err = -1;
    assert_int_equal(tpk_netsor_kernel(p, x, 1, &K, &err, &ctx), TPK_OK);
    static double R[M * M];
    gru_reference(x->data, R);
    double scale = 0, worst = 0;
    for (int i = 0; i < M * M; i++)
        scale = fmax(scale, fabs(R[i]));
    for (int i = 0; i < M * M; i++)
        worst = fmax(worst, fabs(K->data[i] - R[i]) / scale);
    print_message("GRU T=2 vs recursion: max relative error %.2e (error estimate %.2e)\n", worst,
                  err);
    assert_true(worst < TOL_GRU);
    assert_true(err > 0 && err < TOL_GRU * scale); /* the estimate is reported, and small */
    tpk_array_free(K);
    tpk_array_free(x);
    tpk_program_free(p);
    tpk_phi_registry_free(reg);
}

/* The default tolerances against a tight run with other random shifts (independent randomisation):
 * the difference is within a few of the reported error estimates, and within the 1e-5 of
 * the largest entry (T = 3, all outputs). */
static void test_gru_tight(void **state)
{
    (void)state;
    enum { T = 3 };
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_job_registry(&ctx);
    tpk_program *p = load("programs/gru.nsr", T, NULL, 0, reg, &ctx);
    tpk_array *x = seq_array(T, &ctx), *K = NULL, *Kt = NULL;
    double err = -1, errt = -1;
    tpk_limit_opts tight = {.mc_seed = 977, .orthant_abs_tol = 1e-10, .orthant_rel_tol = 1e-9};
    assert_int_equal(tpk_netsor_kernel(p, x, 1, &K, &err, &ctx), TPK_OK);
    assert_int_equal(tpk_netsor_kernel_ex(p, x, 1, &tight, &Kt, &errt, &ctx), TPK_OK);
    size_t len = tpk_array_size(K);
    double scale = 0, worst = 0;
    for (size_t i = 0; i < len; i++)
        scale = fmax(scale, fabs(Kt->data[i]));
    for (size_t i = 0; i < len; i++)
        worst = fmax(worst, fabs(K->data[i] - Kt->data[i]));
    print_message("GRU T=3 default vs tight: max |diff| %.2e = %.2e relative (estimates %.2e, "
                  "tight %.2e)\n", worst, worst / scale, err, errt);
    assert_true(errt < err);
    assert_true(worst <= N_SE * (err + errt));
    assert_true(worst <= TOL_GRU * scale);
    assert_true(err <= TOL_GRU * scale);
    tpk_array_free(K);
    tpk_array_free(Kt);
    tpk_array_free(x);
    tpk_program_free(p);
    tpk_phi_registry_free(reg);
}

/* symmetric, PSD, finite */
static void check_kernel(const tpk_array *K, double err)
{
    size_t M = K->dims[0];
    double *A = malloc(M * M * sizeof *A), *lam = malloc(M * sizeof *lam);
    for (size_t i = 0; i < M; i++)
        for (size_t j = 0; j < M; j++) {
            assert_true(isfinite(K->data[i * M + j]));
            assert_true(K->data[i * M + j] == K->data[j * M + i]);
        }
    memcpy(A, K->data, M * M * sizeof *A);
    assert_int_equal(LAPACKE_dsyev(LAPACK_ROW_MAJOR, 'N', 'U', (int)M, A, (int)M, lam), 0);
    if (lam[0] < -(PSD_TOL * fabs(lam[M - 1]) + (double)M * err))
        fail_msg("not PSD: smallest eigenvalue %.3g, largest %.3g, error estimate %.3g", lam[0],
                 lam[M - 1], err);
    free(A);
    free(lam);
}

/* Zero and repeated inputs: no NaN, symmetric, PSD; equal inputs give equal rows (up to the QMC
 * error: an entry of two equal inputs is a different orthant problem from that of one input). */
static void test_invariants(void **state)
{
    (void)state;
    enum { T = 3 };
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_job_registry(&ctx);
    static const char *progs[] = {"programs/gru.nsr", "programs/lstm.nsr"};
    for (int q = 0; q < 2; q++) {
        tpk_program *p = load(progs[q], T, NULL, 0, reg, &ctx);
        tpk_array *x = seq_array(T, &ctx), *K = NULL;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < D; j++) {
                x->data[(0 * T + t) * D + j] = 0.0;                         /* a zero sequence */
                x->data[(2 * T + t) * D + j] = x->data[(1 * T + t) * D + j]; /* a repeated one */
            }
        double err = 0;
        if (tpk_netsor_kernel(p, x, 1, &K, &err, &ctx))
            fail_msg("%s", ctx.msg);
        check_kernel(K, err);
        size_t M = K->dims[0];
        for (size_t i = 0; i < M; i++) /* rows of sequences 1 and 2 agree */
            for (int t = 0; t < T; t++)
                assert_true(fabs(K->data[(size_t)(1 * T + t) * M + i] -
                                 K->data[(size_t)(2 * T + t) * M + i]) <= N_SE * err + 1e-12);
        tpk_array_free(K);
        tpk_array_free(x);
        tpk_program_free(p);
    }
    tpk_phi_registry_free(reg);
}

/* Executor at widths 256..2048 (seeds S each) vs the limit: RMS relative Frobenius error
 * ~ n^(-1/2), and at the largest width the seed mean of every entry within 3 standard errors
 * (+ the limit's own error estimate). */
static void executor_check(const char *prog, int T, const tpk_param_set *extra, int nextra)
{
    enum { W = 4, S = 16 };
    static const double widths[W] = {256, 512, 1024, 2048};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_job_registry(&ctx);
    tpk_program *p = load(prog, T, extra, nextra, reg, &ctx);
    tpk_array *x = seq_array(T, &ctx), *K = NULL;
    double err = 0;
    if (tpk_netsor_kernel(p, x, 0, &K, &err, &ctx))
        fail_msg("%s", ctx.msg);
    size_t len = tpk_array_size(K);
    double rms[W], se_log[W], *sum = calloc(len, sizeof *sum), *sum2 = calloc(len, sizeof *sum2);
    for (int w = 0; w < W; w++) {
        double e[S];
        for (int s = 0; s < S; s++) {
            tpk_array *Kh = NULL;
            if (tpk_netsor_run(p, x, (size_t)widths[w], 500 + (uint64_t)s, 0, &Kh, NULL, &ctx))
                fail_msg("%s", ctx.msg);
            assert_int_equal(tpk_limits_frob_rel(Kh->data, K->data, len, &e[s], &ctx), TPK_OK);
            if (w == W - 1)
                for (size_t i = 0; i < len; i++) {
                    sum[i] += Kh->data[i];
                    sum2[i] += Kh->data[i] * Kh->data[i];
                }
            tpk_array_free(Kh);
        }
        rms[w] = tpk_limits_rms(e, S);
        /* standard error of log RMS (delta method on the mean of e²) */
        double m2 = 0, v2 = 0;
        for (int s = 0; s < S; s++)
            m2 += e[s] * e[s] / S;
        for (int s = 0; s < S; s++)
            v2 += (e[s] * e[s] - m2) * (e[s] * e[s] - m2) / (S - 1);
        se_log[w] = 0.5 * sqrt(v2 / S) / m2;
    }
    double slope, icpt, worst = 0;
    assert_int_equal(tpk_limits_fit_power(widths, rms, W, &slope, &icpt, NULL, &ctx), TPK_OK);
    /* least-squares slope in log n: SE² = Σ w_i² se_i², w_i = (x_i − x̄)/Σ(x_j − x̄)² (widths
     * nest, so their errors correlate positively and this overstates the SE) */
    double xm = 0, sxx = 0, se_slope = 0;
    for (int w = 0; w < W; w++)
        xm += log(widths[w]) / W;
    for (int w = 0; w < W; w++)
        sxx += (log(widths[w]) - xm) * (log(widths[w]) - xm);
    for (int w = 0; w < W; w++)
        se_slope += pow((log(widths[w]) - xm) / sxx * se_log[w], 2);
    se_slope = sqrt(se_slope);
    for (size_t i = 0; i < len; i++) {
        double m = sum[i] / S, var = (sum2[i] / S - m * m) * S / (S - 1);
        double se = sqrt(fmax(var, 0) / S);
        worst = fmax(worst, fabs(m - K->data[i]) / (se + err + 1e-300));
    }
    double tq = gsl_cdf_tdist_Qinv(EXEC_ALPHA / (2.0 * (double)len), S - 1);
    print_message("%s T=%d executor: RMS rel. error %.3g (n=256) .. %.3g (n=2048), slope %.3f "
                  "± %.3f; n=2048 mean vs limit: worst %.2f SE (bound %.2f, limit err %.1e)\n",
                  prog, T, rms[0], rms[W - 1], slope, se_slope, worst, tq, err);
    assert_true(3 * se_slope <= SLOPE_SE_MAX);
    assert_true(slope >= -1.0 - 3 * se_slope && slope <= -0.5 + 3 * se_slope);
    assert_true(worst < tq);
    free(sum);
    free(sum2);
    tpk_array_free(K);
    tpk_array_free(x);
    tpk_program_free(p);
    tpk_phi_registry_free(reg);
}

/* Against the independent reference of scripts/gru_reference.py (numpy + SciPy, tests/
 * gru_reference.h): 3 sequences × 4 steps with input standard deviations 0.5, 1, 1.6, every
 * time step. The issue asks ≤ 1e-7 of the kernel; the reported error estimate (a root-sum-square
 * of the terms' standard errors) must cover the difference. Run at the tight orthant tolerances
 * (the default one is what gpkernel uses; its estimate is checked the same way). */
#define TOL_REF 1e-7
#define REF_SE 5.0 /* the difference within this many combined standard errors */
static void test_gru_reference(void **state)
{
    (void)state;
    enum { RT = GREF_T, RN = GREF_N, RD = GREF_D };
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_job_registry(&ctx);
    static const char *names[13] = {"var_Uz", "var_Ur", "var_Uh", "var_Wz", "var_Wr", "var_Wh",
                                    "var_bz", "var_br", "var_bh", "mu_bz",  "mu_br",  "mu_bh",
                                    "sigma_v2"};
    char v[14][32], path[4200];
    tpk_param_set sets[14];
    snprintf(v[13], sizeof v[13], "%d", RT);
    sets[0] = (tpk_param_set){"T", v[13]};
    for (int i = 0; i < 13; i++) {
        snprintf(v[i], sizeof v[i], "%.17g", gref_param[i]);
        sets[i + 1] = (tpk_param_set){names[i], v[i]};
    }
    tpk_shipped_path("programs/gru.nsr", path, sizeof path);
    tpk_netsor_opts o = {.sets = sets, .nsets = 14};
    tpk_program *p = tpk_netsor_load_file(path, &o, reg, &ctx);
    if (!p)
        fail_msg("%s", ctx.msg);
    size_t dims[3] = {RN, RT, RD};
    tpk_array *x = tpk_array_alloc(3, dims, &ctx), *K = NULL;
    memcpy(x->data, gref_x, sizeof gref_x);
    for (int pass = 0; pass < 2; pass++) {
        /* 2^19 QMC points per shift (16× the default cap) for the 5–8-D problems */
        tpk_limit_opts tight = {.orthant_abs_tol = 1e-10, .orthant_rel_tol = 1e-9,
                                .orthant_max_points = (size_t)1 << 19};
        double err = -1;
        assert_int_equal(tpk_netsor_kernel_ex(p, x, 1, pass ? &tight : NULL, &K, &err, &ctx),
                         TPK_OK);
        double worst = 0, worst_se = 0;
        for (int i = 0; i < RN * RT * RN * RT; i++) {
            double d = fabs(K->data[i] - gref_K[i]);
            worst = fmax(worst, d);
            worst_se = fmax(worst_se, d / (err + gref_err_max));
        }
        print_message("GRU 3x4 vs independent reference (%s): max |diff| %.2e, error estimate "
                      "%.2e (reference %.1e), %.2f combined SE\n", pass ? "tight" : "default",
                      worst, err, gref_err_max, worst_se);
        assert_true(worst <= REF_SE * (err + gref_err_max));
        if (pass)
            assert_true(worst <= TOL_REF);
        tpk_array_free(K);
        K = NULL;
    }
    tpk_array_free(x);
    tpk_program_free(p);
    tpk_phi_registry_free(reg);
}

/* tpk_netsor_kernel_progress: the same kernel as tpk_netsor_kernel; the reports count the
 * instructions up to all of them (the line itself is the tools', tests/test_progress.c). */
typedef struct gru_reports {
    size_t n, last_done, last_total;
} gru_reports;

static void count_report(const tpk_progress_info *i, void *user)
{
    gru_reports *r = user;
    r->n++;
    r->last_done = i->done;
    r->last_total = i->total;
}

static void test_progress_same_kernel(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_job_registry(&ctx);
    tpk_program *p = load("programs/gru.nsr", 2, NULL, 0, reg, &ctx);
    tpk_array *x = seq_array(2, &ctx), *K = NULL, *K2 = NULL;
    gru_reports r = {0};
    const tpk_progress pr = {.fn = count_report, .user = &r};
    double e1, e2;
    assert_int_equal(tpk_netsor_kernel(p, x, 1, &K, &e1, &ctx), TPK_OK);
    assert_int_equal(tpk_netsor_kernel_progress(p, x, 1, &pr, &K2, &e2, &ctx), TPK_OK);
    assert_true(r.n >= 2);
    assert_true(r.last_total > 0 && r.last_done == r.last_total);
    assert_memory_equal(K->data, K2->data, tpk_array_size(K) * sizeof(double));
    assert_true(e1 == e2);
    tpk_array_free(K);
    tpk_array_free(K2);
    tpk_array_free(x);
    tpk_program_free(p);
    tpk_phi_registry_free(reg);
}

static void test_gru_executor(void **state)
{
    (void)state;
    executor_check("programs/gru.nsr", 2, NULL, 0);
}

static void test_lstm_executor(void **state)
{
    (void)state;
    executor_check("programs/lstm.nsr", 2, NULL, 0);
    tpk_param_set logistic[] = {{"gate", "sigmoid"}, {"mu_bf", "1.0"}};
    executor_check("programs/lstm.nsr", 2, logistic, 2);
}

/* ---- the joint sampler (netsor/limit_joint.c) ------------------------------------------------ */

/* Its estimates against the exact moments: this many standard errors. */
#define JOINT_SE 5.0

/* A Gaussian of three G-vars at two inputs (a 6×6 covariance, G-var-major), means m. */
static const double jm[3] = {0.3, -0.2, 0.1};
static double jC(int i, int j)
{
    static const double C[36] = {
        1.10, 0.40, 0.30, 0.10, 0.00, 0.00, 0.40, 0.90, 0.20, 0.25, 0.00, 0.00,
        0.30, 0.20, 1.30, 0.15, 0.00, 0.00, 0.10, 0.25, 0.15, 0.80, 0.00, 0.00,
        0.00, 0.00, 0.00, 0.00, 0.70, 0.35, 0.00, 0.00, 0.00, 0.00, 0.35, 1.20};
    return C[i * 6 + j];
}
static double jcov(void *c, int g, size_t a, int h, size_t b)
{
    (void)c;
    return jC(2 * g + (int)a, 2 * h + (int)b);
}
static double jmean(void *c, int g)
{
    (void)c;
    return jm[g];
}
static double jscalar(void *c, int v, size_t a)
{
    (void)c;
    return 1.5 + v + 0.25 * (double)a;
}
static int jdead = -1; /* a G-var the test has let die */
static int jalive(void *c, int g)
{
    (void)c;
    return g != jdead;
}

static void test_joint_sampler(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_nsr_joint_env env = {NULL, jcov, jmean, jscalar, jalive};
    jdead = -1;
    /* factors: Z0, Z1, Z0², and s·Z2 with a scalar s (var 0) */
    tpk_rpn_node z0[1] = {{TPK_RPN_GVAR, 0, 0, NULL}}, z1[1] = {{TPK_RPN_GVAR, 1, 0, NULL}};
    tpk_rpn_node sq0[3] = {{TPK_RPN_GVAR, 0, 0, NULL}, {TPK_RPN_GVAR, 0, 0, NULL},
                           {TPK_RPN_MUL, 0, 0, NULL}};
    tpk_rpn_node sz2[3] = {{TPK_RPN_SCALAR, 0, 0, NULL}, {TPK_RPN_GVAR, 2, 0, NULL},
                           {TPK_RPN_MUL, 0, 0, NULL}};
    tpk_nsr_joint *j = tpk_nsr_joint_alloc(16, 4096, (size_t)64 << 20, 11, NULL);
    assert_non_null(j);
    /* first call: E[Z0_0 Z1_1], E[Z0_0² Z1_0], E[Z0_1] */
    tpk_nsr_jfac f1[5] = {{z0, 1, 0}, {z1, 1, 1}, {sq0, 3, 0}, {z1, 1, 0}, {z0, 1, 1}};
    size_t off1[4] = {0, 2, 4, 5};
    tpk_estimate e1[3];
    assert_int_equal(tpk_nsr_joint_expect(j, &env, 3, off1, f1, e1, &ctx), TPK_OK);
    double c00 = jC(0, 0);
    double ex[3] = {jC(0, 3) + jm[0] * jm[1],
                    /* E[X²Y], X = Z0_0, Y = Z1_0: 2 m_x C_xy + m_y (C_xx + m_x²) */
                    2 * jm[0] * jC(0, 2) + jm[1] * (c00 + jm[0] * jm[0]), jm[0]};
    /* second call: kept factors with a new one (Z2 at input 1 times its scalar) */
    tpk_nsr_jfac f2[4] = {{z0, 1, 0}, {sz2, 3, 1}, {sq0, 3, 0}, {z1, 1, 0}};
    size_t off2[3] = {0, 2, 4};
    tpk_estimate e2[2];
    assert_int_equal(tpk_nsr_joint_expect(j, &env, 2, off2, f2, e2, &ctx), TPK_OK);
    double ex2[2] = {jscalar(NULL, 0, 1) * (jC(0, 5) + jm[0] * jm[2]), ex[1]};
    for (int i = 0; i < 3; i++) {
        print_message("joint E[%d] = %.5f ± %.1e, exact %.5f\n", i, e1[i].value, e1[i].err, ex[i]);
        assert_true(e1[i].err > 0 && fabs(e1[i].value - ex[i]) <= JOINT_SE * e1[i].err);
    }
    assert_true(fabs(e2[0].value - ex2[0]) <= JOINT_SE * e2[0].err + 1e-15);
    assert_true(e2[1].value == e1[1].value && e2[1].err == e1[1].err); /* the kept values */
    /* G-var 1 dies: a fresh sample, the same moments within their errors */
    jdead = 1;
    tpk_nsr_jfac f3[2] = {{z0, 1, 0}, {sz2, 3, 1}};
    size_t off3[2] = {0, 2};
    tpk_estimate e3[1];
    assert_int_equal(tpk_nsr_joint_expect(j, &env, 1, off3, f3, e3, &ctx), TPK_OK);
    assert_true(fabs(e3[0].value - ex2[0]) <= JOINT_SE * e3[0].err + 1e-15);
    jdead = -1;
    /* a cache too small for the new factors: declined, nothing computed */
    tpk_nsr_joint *small = tpk_nsr_joint_alloc(16, 4096, 1000, 11, NULL);
    assert_int_equal(tpk_nsr_joint_expect(small, &env, 3, off1, f1, e1, &ctx), TPK_EUNSUPPORTED);
    assert_null(tpk_nsr_joint_alloc(1, 4096, 1000, 11, NULL));
    tpk_nsr_joint_free(small);
    tpk_nsr_joint_free(j);
    tpk_nsr_joint_free(NULL);
}

/* The LSTM limit through the joint sampler against every group sampled alone (independent
 * randomisations: within the combined error), the fallback when its cache is full (exactly the
 * per-group kernel), and the same kernel on a second run (deterministic whatever the threads). */
static void test_lstm_joint(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_job_registry(&ctx);
    tpk_program *p = load("programs/lstm.nsr", 3, NULL, 0, reg, &ctx);
    tpk_array *x = seq_array(3, &ctx), *Kj = NULL, *Kj2 = NULL, *Kg = NULL, *Kf = NULL;
    tpk_limit_opts alone = {.no_joint = 1}, full = {.joint_max_bytes = 1};
    double ej = 0, eg = 0, ef = 0, ej2 = 0;
    assert_int_equal(tpk_netsor_kernel_ex(p, x, 1, NULL, &Kj, &ej, &ctx), TPK_OK);
    assert_int_equal(tpk_netsor_kernel_ex(p, x, 1, NULL, &Kj2, &ej2, &ctx), TPK_OK);
    assert_int_equal(tpk_netsor_kernel_ex(p, x, 1, &alone, &Kg, &eg, &ctx), TPK_OK);
    assert_int_equal(tpk_netsor_kernel_ex(p, x, 1, &full, &Kf, &ef, &ctx), TPK_OK);
    size_t len = tpk_array_size(Kj);
    double worst = 0;
    for (size_t i = 0; i < len; i++) {
        worst = fmax(worst, fabs(Kj->data[i] - Kg->data[i]));
        assert_true(Kj->data[i] == Kj2->data[i]);
        assert_true(Kf->data[i] == Kg->data[i]);
    }
    print_message("LSTM T=3 joint vs per-group: max |diff| %.2e (errors %.1e, %.1e)\n", worst, ej,
                  eg);
    assert_true(worst <= JOINT_SE * hypot(ej, eg));
    assert_true(ef == eg && ej == ej2 && ej > 0);
    tpk_array_free(Kj);
    tpk_array_free(Kj2);
    tpk_array_free(Kg);
    tpk_array_free(Kf);
    tpk_array_free(x);
    tpk_program_free(p);
    tpk_phi_registry_free(reg);
}

/* ---- the direct recursion (kernels/gru.c, gpkernel --arch=gru) ------------------------------- */

static tpk_gru_params direct_params(const double *v13)
{
    tpk_gru_params g = {0};
    double *dst[] = {&g.var_Uz, &g.var_Ur, &g.var_Uh, &g.var_Wz, &g.var_Wr, &g.var_Wh, &g.var_bz,
                     &g.var_br, &g.var_bh, &g.mu_bz,  &g.mu_br,  &g.mu_bh,  &g.sigma_v2};
    for (int i = 0; i < 13; i++)
        *dst[i] = v13[i];
    return g;
}

static const double test_v13[13] = {0.9, 1.1, 1.2, 0.8, 1.3, 0.7, 0.15, 0.1, 0.2, 0.1, -0.2, 0.05, 1.1};

/* Against the independent recursion of this file (T = 2), and the independent reference of
 * scripts/gru_reference.py (3 × 4, distinct input variances) at the default budget: the issue's
 * 1e-7, and within REF_SE combined standard errors of the reference. */
static void test_direct_reference(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    {
        enum { T = 2, M = N * T };
        tpk_array *x = seq_array(T, &ctx), *K = NULL;
        tpk_gru_params g = direct_params(test_v13);
        double err = -1;
        assert_int_equal(tpk_gru_kernel(&g, x, 1, NULL, &K, &err, &ctx), TPK_OK);
        static double R[M * M];
        gru_reference(x->data, R);
        /* T = 2: every gate product has at most 4 gates, exact in both back ends */
        tpk_phi_registry *reg = tpk_job_registry(&ctx);
        tpk_program *p = load("programs/gru.nsr", T, NULL, 0, reg, &ctx);
        tpk_array *Ke = NULL;
        double ee = -1;
        assert_int_equal(tpk_netsor_kernel(p, x, 1, &Ke, &ee, &ctx), TPK_OK);
        double worst = 0, scale = 0, dev = 0;
        for (int i = 0; i < M * M; i++) {
            scale = fmax(scale, fabs(R[i]));
            worst = fmax(worst, fabs(K->data[i] - R[i]));
            dev = fmax(dev, fabs(K->data[i] - Ke->data[i]));
        }
        print_message("GRU direct T=2: vs recursion max relative error %.2e, vs evaluator max "
                      "|diff| %.2e (error estimates %.2e, %.2e)\n", worst / scale, dev, err, ee);
        assert_true(worst <= TOL_GRU * scale && err >= 0 && err < 1e-12);
        assert_true(dev <= 1e-12);
        tpk_array_free(Ke);
        tpk_program_free(p);
        tpk_phi_registry_free(reg);
        tpk_array_free(K);
        tpk_array_free(x);
    }
    size_t dims[3] = {GREF_N, GREF_T, GREF_D};
    tpk_array *x = tpk_array_alloc(3, dims, &ctx), *K = NULL;
    memcpy(x->data, gref_x, sizeof gref_x);
    tpk_gru_params g = direct_params(gref_param);
    double err = -1;
    assert_int_equal(tpk_gru_kernel(&g, x, 1, NULL, &K, &err, &ctx), TPK_OK);
    double worst = 0, worst_se = 0;
    for (int i = 0; i < GREF_N * GREF_T * GREF_N * GREF_T; i++) {
        double d = fabs(K->data[i] - gref_K[i]);
        worst = fmax(worst, d);
        worst_se = fmax(worst_se, d / (err + gref_err_max));
    }
    print_message("GRU direct 3x4 vs independent reference: max |diff| %.2e, error estimate %.2e "
                  "(reference %.1e), %.2f combined SE\n", worst, err, gref_err_max, worst_se);
    assert_true(worst <= TOL_REF);
    assert_true(worst <= REF_SE * (err + gref_err_max));
    check_kernel(K, err);
    tpk_array_free(K);
    tpk_array_free(x);
}

/* The direct recursion and the NETSOR evaluator on programs/gru.nsr compute the same limit by
 * different orders of integration (nested windows vs one Genz–Bretz problem each): T = 4, the
 * evaluator at tight tolerances, within 5 of their combined error estimates; the last step alone
 * is the last-step block of the all-times kernel. */
static void test_direct_vs_evaluator(void **state)
{
    (void)state;
    enum { T = 4, M = N * T };
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_job_registry(&ctx);
    tpk_program *p = load("programs/gru.nsr", T, NULL, 0, reg, &ctx);
    tpk_array *x = seq_array(T, &ctx), *Ke = NULL, *Kd = NULL, *Kl = NULL;
    tpk_limit_opts tight = {.orthant_abs_tol = 2e-8, .orthant_rel_tol = 1e-7,
                            .orthant_max_points = (size_t)1 << 17};
    double ee = -1, ed = -1, el = -1;
    assert_int_equal(tpk_netsor_kernel_ex(p, x, 1, &tight, &Ke, &ee, &ctx), TPK_OK);
    tpk_gru_params g = direct_params(test_v13);
    assert_int_equal(tpk_gru_kernel(&g, x, 1, NULL, &Kd, &ed, &ctx), TPK_OK);
    assert_int_equal(tpk_gru_kernel(&g, x, 0, NULL, &Kl, &el, &ctx), TPK_OK);
    double worst = 0;
    for (int i = 0; i < M * M; i++)
        worst = fmax(worst, fabs(Ke->data[i] - Kd->data[i]));
    print_message("GRU T=4 direct vs evaluator: max |diff| %.2e (estimates %.2e, %.2e)\n", worst,
                  ed, ee);
    assert_true(worst <= 5.0 * (ed + ee));
    for (int a = 0; a < N; a++)
        for (int c = 0; c < N; c++)
            assert_true(Kl->data[a * N + c] == Kd->data[(a * T + T - 1) * M + c * T + T - 1]);
    assert_true(el <= ed);
    check_kernel(Kd, ed);
    tpk_array_free(Ke);
    tpk_array_free(Kd);
    tpk_array_free(Kl);
    tpk_array_free(x);
    tpk_program_free(p);
    tpk_phi_registry_free(reg);
}

/* The same kernel, bit for bit, for any number of threads (every refinement decision is a path's
 * own); another seed gives another randomisation within the error estimates; a larger budget
 * lowers the estimate; a cancel stops it; bad parameters and inputs are refused by name. */
static void test_direct_contract(void **state)
{
    (void)state;
    enum { T = 5, M = N * T };
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_array *x = seq_array(T, &ctx), *K1 = NULL, *K2 = NULL, *K3 = NULL, *K4 = NULL;
    tpk_gru_params g = direct_params(test_v13);
    g.budget = 2e7;
    double e1, e2, e3, e4;
    omp_set_num_threads(1);
    assert_int_equal(tpk_gru_kernel(&g, x, 1, NULL, &K1, &e1, &ctx), TPK_OK);
    omp_set_num_threads(2);
    assert_int_equal(tpk_gru_kernel(&g, x, 1, NULL, &K2, &e2, &ctx), TPK_OK);
    assert_memory_equal(K1->data, K2->data, M * M * sizeof(double));
    assert_true(e1 == e2);
    g.seed = 12345;
    assert_int_equal(tpk_gru_kernel(&g, x, 1, NULL, &K3, &e3, &ctx), TPK_OK);
    g.budget = 4e8;
    assert_int_equal(tpk_gru_kernel(&g, x, 1, NULL, &K4, &e4, &ctx), TPK_OK);
    double d13 = 0, d34 = 0;
    for (int i = 0; i < M * M; i++) {
        d13 = fmax(d13, fabs(K1->data[i] - K3->data[i]));
        d34 = fmax(d34, fabs(K3->data[i] - K4->data[i]));
    }
    print_message("GRU direct T=5: seeds differ by %.2e (estimates %.2e, %.2e); budget 20x: "
                  "estimate %.2e, |diff| %.2e\n", d13, e1, e3, e4, d34);
    assert_true(d13 > 0 && d13 <= 5.0 * (e1 + e3));
    assert_true(d34 <= 5.0 * (e3 + e4));
    assert_true(e4 < 0.5 * e3);
    volatile sig_atomic_t flag = 1;
    tpk_progress prog = {.cancel = &flag};
    tpk_array *Kc = (tpk_array *)1;
    assert_int_equal(tpk_gru_kernel(&g, x, 1, &prog, &Kc, NULL, &ctx), TPK_ECANCELED);
    assert_null(Kc);
    tpk_gru_params bad = g;
    bad.var_Wz = -1;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gru_kernel(&bad, x, 1, NULL, &Kc, NULL, &ctx), TPK_EINVAL);
    assert_non_null(strstr(ctx.msg, "var_Wz"));
    bad = g;
    bad.mu_br = NAN;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gru_kernel(&bad, x, 1, NULL, &Kc, NULL, &ctx), TPK_EINVAL);
    assert_non_null(strstr(ctx.msg, "mu_br"));
    x->data[7] = NAN;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gru_kernel(&g, x, 1, NULL, &Kc, NULL, &ctx), TPK_EDOM);
    assert_non_null(strstr(ctx.msg, "tpk_gru_kernel: X["));
    assert_non_null(strstr(ctx.msg, "] is NaN"));
    tpk_array_free(K1);
    tpk_array_free(K2);
    tpk_array_free(K3);
    tpk_array_free(K4);
    tpk_array_free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_orthant_exact),
        cmocka_unit_test(test_gru_matches_recursion),
        cmocka_unit_test(test_gru_tight),
        cmocka_unit_test(test_gru_reference),
        cmocka_unit_test(test_direct_reference),
        cmocka_unit_test(test_direct_vs_evaluator),
        cmocka_unit_test(test_direct_contract),
        cmocka_unit_test(test_progress_same_kernel),
        cmocka_unit_test(test_invariants),
        cmocka_unit_test(test_gru_executor),
        cmocka_unit_test(test_lstm_executor),
        cmocka_unit_test(test_joint_sampler),
        cmocka_unit_test(test_lstm_joint),
    };
    return cmocka_run_group_tests_name("gru-lstm", tests, NULL, NULL);
}
