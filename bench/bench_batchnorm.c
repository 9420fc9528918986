/* Batchnorm limit kernel (theory.md §2.5): seconds for V_BNReLU of one batch of B inputs and
 * for one cross-batch block (two batches of Bc), against the straightforward reference, Monte
 * Carlo over the batch (sample y, normalise, relu, average) at M samples, with the accuracy each
 * reaches. Usage: bench_batchnorm [B] [--no-naive] (run-bench.sh passes "4096 --no-naive": B is
 * capped at 256). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpk/batchnorm.h"
#include "tpk/job.h"
#include "tpk/rng.h"
#include "bench_util.h"

static void gram(double *S, size_t n)
{
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            double d = 0.37 * ((double)i - (double)j);
            S[i * n + j] = exp(-d * d) + 0.1 * (i == j) + 0.05 * cos(0.3 * (double)(i + j));
        }
}

/* Monte Carlo reference: out (n×n) = mean of relu(BN y) relu(BN y)ᵀ; batches [0,B1), [B1,n). */
static void mc(const double *S, size_t n, size_t B1, size_t M, double *out)
{
    double *L = malloc(n * n * sizeof *L), *z = malloc(n * sizeof *z);
    double *y = malloc(n * sizeof *y);
    memcpy(L, S, n * n * sizeof *L);
    if (bench_psd_root((int)n, L)) {
        fprintf(stderr, "bench_batchnorm: eigendecomposition failed\n");
        exit(1);
    }
    memset(out, 0, n * n * sizeof *out);
    for (size_t t = 0; t < M; t++) {
        tpk_rng_normal_row(42, 9, (uint32_t)t, 0, n, z);
        for (size_t i = 0; i < n; i++) {
            double s = 0;
            for (size_t k = 0; k < n; k++)
                s += L[i * n + k] * z[k];
            y[i] = s;
        }
        for (size_t b0 = 0; b0 < n; b0 = B1 < n && b0 == 0 ? B1 : n) {
            size_t b1 = b0 == 0 ? B1 : n, B = b1 - b0;
            double m = 0, ss = 0;
            for (size_t i = b0; i < b1; i++)
                m += y[i] / (double)B;
            for (size_t i = b0; i < b1; i++)
                ss += (y[i] - m) * (y[i] - m);
            for (size_t i = b0; i < b1; i++)
                y[i] = fmax(0.0, sqrt((double)B) * (y[i] - m) / sqrt(ss));
        }
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n; j++)
                out[i * n + j] += y[i] * y[j] / (double)M;
    }
    free(L), free(z), free(y);
}

int main(int argc, char **argv)
{
    size_t B = argc > 1 && atoi(argv[1]) > 0 ? (size_t)atoi(argv[1]) : 32, Bc = 8;
    if (B > 256)
        B = 256;
    int naive = !(argc > 2 && strcmp(argv[2], "--no-naive") == 0);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_job_registry(&ctx);
    tpk_phi *relu = tpk_phi_alloc(reg, "relu", &ctx);
    double *S = malloc(B * B * sizeof *S), *V = malloc(B * B * sizeof *V);
    double *R = malloc(B * B * sizeof *R), e;
    gram(S, B);
    double t0 = bench_now();
    if (tpk_bn_map(relu, S, B, 0.0, V, &e, &ctx)) {
        fprintf(stderr, "%s\n", ctx.msg);
        return 1;
    }
    double t1 = bench_now() - t0;
    printf("batchnorm: one batch B=%zu (Laplace 1-D): %.4f s, error estimate %.2g\n", B, t1, e);
    double S2[256], C[64];
    gram(S2, 2 * Bc);
    double S11[64], S12[64], S22[64];
    for (size_t i = 0; i < Bc; i++)
        for (size_t j = 0; j < Bc; j++) {
            S11[i * Bc + j] = S2[i * 2 * Bc + j];
            S12[i * Bc + j] = S2[i * 2 * Bc + Bc + j];
            S22[i * Bc + j] = S2[(Bc + i) * 2 * Bc + Bc + j];
        }
    t0 = bench_now();
    if (tpk_bn_cross(relu, S11, Bc, S12, S22, Bc, 0.0, C, &e, &ctx)) {
        fprintf(stderr, "%s\n", ctx.msg);
        return 1;
    }
    double t2 = bench_now() - t0;
    printf("batchnorm: cross block %zu×%zu (Laplace 2-D): %.4f s, error estimate %.2g\n", Bc, Bc, t2, e);
    if (naive) {
        size_t M = 100000;
        t0 = bench_now();
        mc(S, B, B, M, R);
        double t3 = bench_now() - t0, d = 0;
        for (size_t i = 0; i < B * B; i++)
            d = fmax(d, fabs(R[i] - V[i]));
        printf("batchnorm: reference Monte Carlo B=%zu, M=%zu: %.4f s (ratio %.1fx), max |MC - V| "
               "%.2g (MC error ~M^-1/2: 1e-10 would need ~1e18 samples)\n", B, M, t3, t3 / t1, d);
        double R2[256];
        t0 = bench_now();
        mc(S2, 2 * Bc, Bc, M, R2);
        double t4 = bench_now() - t0;
        d = 0;
        for (size_t i = 0; i < Bc; i++)
            for (size_t j = 0; j < Bc; j++)
                d = fmax(d, fabs(R2[i * 2 * Bc + Bc + j] - C[i * Bc + j]));
        printf("batchnorm: reference Monte Carlo cross %zu×%zu, M=%zu: %.4f s (ratio %.1fx), "
               "max |MC - V| %.2g\n", Bc, Bc, M, t4, t4 / t2, d);
    }
    free(S), free(V), free(R);
    tpk_phi_free(relu);
    tpk_phi_registry_free(reg);
    return 0;
}
