/* Benchmark: tpk_gp_fit (checks, Cholesky, pivot test, solve for C outputs) against
 * LAPACKE_dpotrf alone on the same matrix, side by side (issue 7, item 5: ratio <= 1.3).
 * Usage: bench_gp [N] [--no-naive] (default N = 10000; --no-naive is accepted and ignored: there is
 * no naive variant here). Not a test: no pass/fail. */
#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpk/gp.h"
#include "bench_util.h"

enum { D = 64, C = 10 };
/* Noise variance added for the fit (and to the matrix dpotrf sees, so both factor the same). */
#define NOISE 1e-2

/* Deterministic kernel: K = X Xᵀ/D + 0.05 (an NNGP-like first layer), full symmetric. */
static void make_kernel(double *K, size_t n)
{
    double *X = malloc(n * D * sizeof *X);
    unsigned long s = 88172645463325252ul;
    for (size_t i = 0; i < n * D; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        X[i] = (double)(s >> 11) / 9007199254740992.0 - 0.5;
    }
    cblas_dsyrk(CblasRowMajor, CblasLower, CblasNoTrans, (int)n, D, 1.0 / D, X, D, 0.0, K, (int)n);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j <= i; j++) {
            K[i * n + j] += 0.05;
            K[j * n + i] = K[i * n + j];
        }
    free(X);
}

int main(int argc, char **argv)
{
    size_t n = 10000;
    for (int i = 1; i < argc; i++)
        if (argv[i][0] != '-') {
            long v = strtol(argv[i], NULL, 10);
            if (v < 2 || v > 60000) {
                fprintf(stderr, "bench_gp: N must be in 2..60000 (got %s)\n", argv[i]);
                return 1;
            }
            n = (size_t)v;
        }
    const int reps = n > 6000 ? 2 : 3;
    double *K = malloc(n * n * sizeof *K), *A = malloc(n * n * sizeof *A);
    tpk_array *Y = tpk_array_alloc2(n, C, NULL);
    if (!K || !A || !Y) {
        fprintf(stderr, "bench_gp: out of memory for N = %zu\n", n);
        return 1;
    }
    make_kernel(K, n);
    for (size_t i = 0; i < n * C; i++)
        Y->data[i] = sin(0.37 * (double)i);
    double t_potrf = INFINITY, t_fit = INFINITY, t_fit_cond = INFINITY;
    for (int r = 0; r < reps; r++) {
        /* dpotrf alone on K + σ²I (the copy is outside the timing for both). */
        memcpy(A, K, n * n * sizeof *A);
        for (size_t i = 0; i < n; i++)
            A[i * n + i] += NOISE;
        double t0 = bench_now();
        int info = LAPACKE_dpotrf(LAPACK_COL_MAJOR, 'U', (lapack_int)n, A, (lapack_int)n);
        t_potrf = fmin(t_potrf, bench_now() - t0);
        if (info) {
            fprintf(stderr, "bench_gp: dpotrf info %d\n", info);
            return 1;
        }
        for (int variant = 0; variant < 2; variant++) {
            memcpy(A, K, n * n * sizeof *A);
            tpk_array Ka = {.ndim = 2, .dims = {n, n}, .data = A};
            tpk_gp_options o;
            tpk_gp_options_default(&o);
            o.overwrite_k = 1; /* memory N² + O(NC), as the issue asks */
            if (variant)
                o.rcond_min = 1e-15; /* also LAPACK's condition estimate (dpocon) */
            tpk_ctx ctx;
            tpk_ctx_init(&ctx);
            t0 = bench_now();
            tpk_gp *gp = tpk_gp_fit(&Ka, Y, NOISE, &o, &ctx);
            double t = bench_now() - t0;
            if (!gp) {
                fprintf(stderr, "bench_gp: %s\n", ctx.msg);
                return 1;
            }
            tpk_gp_free(gp);
            if (variant)
                t_fit_cond = fmin(t_fit_cond, t);
            else
                t_fit = fmin(t_fit, t);
        }
    }
    printf("gp fit, N = %zu, C = %d outputs (best of %d):\n", n, C, reps);
    printf("  LAPACKE_dpotrf alone                        %8.3f s\n", t_potrf);
    printf("  tpk_gp_fit (checks+dpotrf+solve), default   %8.3f s   ratio %.3f  (target <= 1.3)\n",
           t_fit, t_fit / t_potrf);
    printf("  tpk_gp_fit with dpocon (rcond_min > 0)      %8.3f s   ratio %.3f\n", t_fit_cond,
           t_fit_cond / t_potrf);
    free(K);
    free(A);
    tpk_array_free(Y);
    return 0;
}
