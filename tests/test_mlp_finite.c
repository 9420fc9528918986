/* The MLP kernel against brute-force finite-width networks (theory.md §1.5, §7.1). */
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
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tpk/kernels.h"

enum { N = 6, D = 10, WIDTH = 2048, SEEDS = 32, DEPTH = 2 };
/* Per-entry acceptance in standard errors over SEEDS networks. 4.5 SE of a t(31) statistic fails
 * by chance with p ≈ 1e-4 per entry; the O(1/WIDTH) bias is ≈ 0.1 SE here (theory.md §7.3). */
#define Z_ACCEPT 4.5

typedef double (*scalar_fn)(double);
static double relu(double x) { return x > 0 ? x : 0; }

/* One random network, Rao–Blackwellised output covariance
 * σ_w² (1/n)⟨h^L_a, h^L_c⟩ + σ_b² (exact conditional covariance of the readout). */
static void finite_kernel(const double *X, scalar_fn phi, double sw2, double sb2, gsl_rng *r,
                          double *Khat)
{
    double *W = malloc((size_t)WIDTH * WIDTH * sizeof *W);
    double *H = malloc((size_t)WIDTH * N * sizeof *H), *G = malloc((size_t)WIDTH * N * sizeof *G);
    double b[WIDTH];
    /* layer 1: G = W1 X^T + b, W1 entries N(0, σ_w²/d) */
    for (size_t i = 0; i < (size_t)WIDTH * D; i++)
        W[i] = gsl_ran_gaussian_ziggurat(r, sqrt(sw2 / D));
    for (int i = 0; i < WIDTH; i++)
        b[i] = gsl_ran_gaussian_ziggurat(r, sqrt(sb2));
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, WIDTH, N, D, 1.0, W, D, X, D, 0.0, G, N);
    for (int l = 1; l <= DEPTH; l++) {
        for (int i = 0; i < WIDTH; i++)
            for (int a = 0; a < N; a++)
                H[i * N + a] = phi(G[i * N + a] + b[i]);
        if (l == DEPTH)
            break;
        for (size_t i = 0; i < (size_t)WIDTH * WIDTH; i++)
            W[i] = gsl_ran_gaussian_ziggurat(r, sqrt(sw2 / WIDTH));
        for (int i = 0; i < WIDTH; i++)
            b[i] = gsl_ran_gaussian_ziggurat(r, sqrt(sb2));
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, WIDTH, N, WIDTH, 1.0, W, WIDTH, H, N,
                    0.0, G, N);
    }
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, N, WIDTH, sw2 / WIDTH, H, N, H, N, 0.0,
                Khat, N);
    for (int i = 0; i < N * N; i++)
        Khat[i] += sb2;
    free(W);
    free(H);
    free(G);
}

/* Largest |mean − K| / SE over the entries. */
static double max_z(const double *mean, const double *sd, const double *K)
{
    double z = 0;
    for (int i = 0; i < N * N; i++)
        z = fmax(z, fabs(mean[i] - K[i]) / (sd[i] / sqrt(SEEDS) + 1e-300));
    return z;
}

static void check_phi(const char *spec, scalar_fn f, double sw2, double sb2, unsigned long seed)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_phi_registry_alloc(&ctx);
    tpk_phi *phi = tpk_phi_alloc(reg, spec, &ctx);
    assert_non_null(phi);
    tpk_gauss_ws *ws = tpk_gauss_ws_alloc(64, &ctx);
    tpk_array *X = tpk_array_alloc2(N, D, &ctx), *K = tpk_array_alloc2(N, N, &ctx);
    tpk_array *Kwrong = tpk_array_alloc2(N, N, &ctx);
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, seed);
    for (int i = 0; i < N * D; i++)
        X->data[i] = gsl_ran_gaussian(r, 1.0);
    tpk_mlp_params p = {.depth = DEPTH, .phi = phi, .sigma_w2 = sw2, .sigma_b2 = sb2};
    assert_int_equal(tpk_mlp_kernel(&p, X, NULL, ws, K, NULL, NULL, NULL, &ctx), TPK_OK);
    /* A plausible wrong answer (one layer more) the test must be able to tell apart. */
    tpk_mlp_params pw = p;
    pw.depth = DEPTH + 1;
    assert_int_equal(tpk_mlp_kernel(&pw, X, NULL, ws, Kwrong, NULL, NULL, NULL, &ctx), TPK_OK);

    double sum[N * N] = {0}, sum2[N * N] = {0}, Khat[N * N];
    for (int s = 0; s < SEEDS; s++) {
        finite_kernel(X->data, f, sw2, sb2, r, Khat);
        for (int i = 0; i < N * N; i++) {
            sum[i] += Khat[i];
            sum2[i] += Khat[i] * Khat[i];
        }
    }
    double mean[N * N], sd[N * N];
    for (int i = 0; i < N * N; i++) {
        mean[i] = sum[i] / SEEDS;
        sd[i] = sqrt(fmax(sum2[i] / SEEDS - mean[i] * mean[i], 0) * SEEDS / (SEEDS - 1));
    }
    double z = max_z(mean, sd, K->data), zw = max_z(mean, sd, Kwrong->data);
    print_message("%s: width %d, %d seeds: max |mean-K|/SE = %.2f (wrong depth: %.1f)\n", spec,
                  WIDTH, SEEDS, z, zw);
    assert_true(z < Z_ACCEPT);
    assert_true(zw > Z_ACCEPT);
    gsl_rng_free(r);
    tpk_array_free(X);
    tpk_array_free(K);
    tpk_array_free(Kwrong);
    tpk_gauss_ws_free(ws);
    tpk_phi_free(phi);
    tpk_phi_registry_free(reg);
}

static void test_relu_finite_width(void **state)
{
    (void)state;
    check_phi("relu", relu, 2.0, 0.1, 2385);
}

static void test_erf_finite_width(void **state)
{
    (void)state;
    check_phi("erf", erf, 1.6, 0.05, 7919);
}

static void test_tanh_finite_width(void **state)
{
    (void)state;
    check_phi("tanh", tanh, 1.3, 0.2, 104729);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_relu_finite_width),
        cmocka_unit_test(test_erf_finite_width),
        cmocka_unit_test(test_tanh_finite_width),
    };
    return cmocka_run_group_tests_name("mlp_finite_width", tests, NULL, NULL);
}
