/* Benchmark: deep ReLU MLP kernel against its floor (dsyrk + one acos pass) and a scalar loop.
 * Prints seconds and ratios (issue 2, item 7). Not a test: no pass/fail. */
/* OpenBLAS's cblas.h and GSL's gsl_cblas.h declare the same enums: keep GSL's out. */
#include <cblas.h>
#define __GSL_CBLAS_H__
#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpk/job.h"
#include "tpk/kernels.h"
#include "tpk/netsor.h"
#include "bench_util.h"

/* Let GCC call glibc's vector acos (libmvec) in the floor loop, as a tuned map would; this needs
 * -fno-math-errno too (acos may set errno), which the bench objects get. */
__attribute__((simd("notinbranch"))) double acos(double);

/* The floor: the input Gram matrix by OpenBLAS plus one vectorised acos over the lower triangle. */
static double floor_run(const double *X, size_t n, size_t d, double *S)
{
    double t0 = bench_now();
    cblas_dsyrk(CblasRowMajor, CblasLower, CblasNoTrans, (int)n, (int)d, 1.0 / (double)d, X, (int)d,
                0.0, S, (int)n);
#pragma omp parallel for schedule(dynamic, 64)
    for (size_t i = 0; i < n; i++) {
        double *row = S + i * n;
#pragma omp simd
        for (size_t j = 0; j <= i; j++)
        {
            /* ternaries, not fmin/fmax, so GCC vectorises the clamp and calls libmvec's acos */
            double r = row[j] * 1e-3;
            r = r < -1.0 ? -1.0 : r > 1.0 ? 1.0 : r;
            row[j] = acos(r);
        }
    }
    return bench_now() - t0;
}

/* Plain scalar loops: Gram by a triple loop, then the arc-cosine recursion entry by entry. */
static double naive_run(const double *X, size_t n, size_t d, int depth, double *S, double *T)
{
    double t0 = bench_now();
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            double s = 0;
            for (size_t k = 0; k < d; k++)
                s += X[i * d + k] * X[j * d + k];
            S[i * n + j] = 2.0 * s / (double)d;
        }
    for (int l = 0; l < depth; l++) {
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n; j++) {
                double q = sqrt(S[i * n + i] * S[j * n + j]);
                double rho = q > 0 ? S[i * n + j] / q : 0;
                rho = rho > 1 ? 1 : rho < -1 ? -1 : rho;
                double th = acos(rho);
                T[i * n + j] = 2.0 * q / (2 * M_PI) * (sin(th) + (M_PI - th) * rho);
            }
        memcpy(S, T, n * n * sizeof *S);
    }
    return bench_now() - t0;
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? (size_t)atol(argv[1]) : 4096, d = 784;
    int depth = 10;
    int do_naive = !(argc > 2 && strcmp(argv[2], "--no-naive") == 0);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_phi_registry_alloc(&ctx);
    tpk_phi *relu = tpk_phi_alloc(reg, "relu", &ctx);
    tpk_array *X = tpk_array_alloc2(n, d, &ctx), *K = tpk_array_alloc2(n, n, &ctx);
    double *S = malloc(n * n * sizeof *S);
    if (!relu || !X || !K || !S) {
        fprintf(stderr, "bench_mlp: %s\n", ctx.msg);
        return 1;
    }
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, 2385);
    for (size_t i = 0; i < n * d; i++)
        X->data[i] = gsl_ran_gaussian(r, 1.0);

    tpk_mlp_params p = {.depth = depth, .phi = relu, .sigma_w2 = 2.0, .sigma_b2 = 0.0};
    /* The same network as the shipped NETSOR program (gpkernel --arch=mlp's settings). */
    char prog[4200], L[16];
    snprintf(L, sizeof L, "%d", depth);
    tpk_param_set sets[] = {{"L", L}, {"phi", "relu"}, {"sigma_w2", "2"}, {"sigma_b2", "0"},
                            {"sigma_v2", "sigma_w2"}, {"sigma_ob2", "sigma_b2"}};
    tpk_netsor_opts nopts = {.sets = sets, .nsets = 6};
    tpk_program *pr = tpk_netsor_load_file(tpk_shipped_path("programs/mlp.nsr", prog, sizeof prog),
                                           &nopts, reg, &ctx);
    if (!pr) {
        fprintf(stderr, "bench_mlp: %s\n", ctx.msg);
        return 1;
    }
    double best_lib = INFINITY, best_floor = INFINITY, best_nsr = INFINITY, nsr_diff = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = bench_now();
        if (tpk_mlp_kernel(&p, X, NULL, NULL, K, NULL, NULL, NULL, &ctx)) {
            fprintf(stderr, "bench_mlp: %s\n", ctx.msg);
            return 1;
        }
        best_lib = fmin(best_lib, bench_now() - t0);
        best_floor = fmin(best_floor, floor_run(X->data, n, d, S));
        tpk_array *Kn = NULL;
        t0 = bench_now();
        if (tpk_netsor_kernel(pr, X, 0, &Kn, NULL, &ctx)) {
            fprintf(stderr, "bench_mlp: %s\n", ctx.msg);
            return 1;
        }
        best_nsr = fmin(best_nsr, bench_now() - t0);
        for (size_t i = 0; i < n * n; i++)
            nsr_diff = fmax(nsr_diff, fabs(Kn->data[i] - K->data[i]) / K->data[(i / n) * (n + 1)]);
        tpk_array_free(Kn);
    }
    printf("mlp kernel: N=%zu d=%zu depth=%d relu, %d OpenMP threads, OPENBLAS_CORETYPE=%s\n", n, d,
           depth, omp_get_max_threads(), getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "(unset)");
    printf("  tpk_mlp_kernel             %8.3f s\n", best_lib);
    printf("  floor (dsyrk + 1 acos pass) %7.3f s   ratio tpk/floor = %.2f  (target <= 3)\n",
           best_floor, best_lib / best_floor);
    printf("  NETSOR evaluator, mlp.nsr  %8.3f s   ratio interpreter/direct = %.2f  (target <= 1.2; "
           "max rel diff %.1e)\n", best_nsr, best_nsr / best_lib, nsr_diff);
    if (do_naive) {
        double *T = malloc(n * n * sizeof *T);
        double tn = naive_run(X->data, n, d, depth, S, T);
        double md = 0;
        for (size_t i = 0; i < n * n; i++)
            md = fmax(md, fabs(S[i] - K->data[i]) / K->data[(i / n) * (n + 1)]); /* relative to the row's diagonal */
        printf("  plain scalar loops (1 thread) %5.3f s   ratio naive/tpk = %.1f  (max rel diff %.1e)\n",
               tn, tn / best_lib, md);
        free(T);
    }
    gsl_rng_free(r);
    tpk_program_free(pr);
    free(S);
    tpk_array_free(X);
    tpk_array_free(K);
    tpk_phi_free(relu);
    tpk_phi_registry_free(reg);
    return 0;
}
