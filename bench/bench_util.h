/* Helpers every benchmark needs: a wall clock, and the square root of a covariance that the
 * plain Monte Carlo references sample through. Header-only: each bench is one program. */
#ifndef TPK_BENCH_UTIL_H
#define TPK_BENCH_UTIL_H

#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tpk/clock.h"
#include "tpk/netsor.h"

/* The toolkit's wall clock (include/tpk/clock.h). */
static inline double bench_now(void)
{
    return tpk_wall_seconds();
}

/* Two computations timed side by side on a shared machine: reps pairs, the order within a pair
 * alternated; each side's best time, and the median of the pairs' ratios a/b — a ratio that
 * drift of the machine's speed between pairs does not move, where the ratio of two bests can
 * pair a lucky run with an unlucky one. Returns 0, or -1 when a run fails (its status). */
typedef int (*bench_fn)(void *arg);

static inline int bench_cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static inline int bench_pairs(bench_fn a, void *aa, bench_fn b, void *ba, int reps,
                              double *best_a, double *best_b, double *median_ratio)
{
    double *r = malloc((size_t)(reps > 0 ? reps : 1) * sizeof *r);
    if (r == NULL)
        return -1;
    *best_a = *best_b = INFINITY;
    for (int i = 0; i < reps; i++) {
        double t[2];
        for (int k = 0; k < 2; k++) {
            const int first_a = i % 2 == 0, run_a = k == 0 ? first_a : !first_a;
            double t0 = bench_now();
            if ((run_a ? a(aa) : b(ba)) != 0) {
                free(r);
                return -1;
            }
            t[run_a ? 0 : 1] = bench_now() - t0;
        }
        *best_a = fmin(*best_a, t[0]);
        *best_b = fmin(*best_b, t[1]);
        r[i] = t[0] / t[1];
    }
    qsort(r, (size_t)reps, sizeof *r, bench_cmp_double);
    *median_ratio = reps % 2 ? r[reps / 2] : 0.5 * (r[reps / 2 - 1] + r[reps / 2]);
    free(r);
    return 0;
}

/* The evaluator's side of a comparison (a bench_fn): the kernel of program p on x, all outputs
 * or the last; K keeps the last run's kernel (the caller frees it). */
typedef struct bench_program {
    const tpk_program *p;
    const tpk_array *x;
    int all_outputs;
    tpk_array *K;
} bench_program;

static inline int bench_run_program(void *v)
{
    bench_program *e = v;
    tpk_array_free(e->K);
    e->K = NULL;
    return tpk_netsor_kernel(e->p, e->x, e->all_outputs, &e->K, NULL, NULL);
}

/* A ← B (n×n, row-major, in place) with B Bᵀ = A for a symmetric PSD A: B = V max(Λ, 0)^{1/2}
 * from the eigendecomposition. The references' covariances are singular (many inputs in few
 * dimensions) or assembled from particles and so not exactly PSD; a (jittered) Cholesky stops at
 * the first non-positive pivot, which once made the GRU reference disagree silently (theory.md
 * §1.6). Returns 0, or -1 when out of memory or LAPACK fails. */
static inline int bench_psd_root(int n, double *A)
{
    double *V = malloc((size_t)n * n * sizeof *V), *w = malloc((size_t)n * sizeof *w);
    int rc = -1;
    if (V && w) {
        memcpy(V, A, (size_t)n * n * sizeof *V);
        if (LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'V', 'L', n, V, n, w) == 0) {
            for (int i = 0; i < n; i++)
                for (int j = 0; j < n; j++)
                    A[i * n + j] = V[i * n + j] * sqrt(w[j] > 0 ? w[j] : 0.0);
            rc = 0;
        }
    }
    free(V);
    free(w);
    return rc;
}

#endif
