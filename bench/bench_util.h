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

/* The toolkit's wall clock (include/tpk/clock.h). */
static inline double bench_now(void)
{
    return tpk_wall_seconds();
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
