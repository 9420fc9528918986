/* Dispatch of the tuned GEMM kernels (AutoTVM ApplyHistoryBest + fallback, tuner-notes §3
 * "Lookup", §7): the machine class serving this CPU (tpk_machine_select), then by shape within its
 * table: exact (dtype, m, n, k, threads) → nearest tuned shape in log2 space → the class's analytic
 * default → OpenBLAS (also when no shipped class runs on this CPU). */
#include "tpk/gemm.h"
#include "tpk/alloc.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_gen.h"
#include "machine_gen.h"

/* Below this many multiply-adds packing costs more than it saves: OpenBLAS serves. */
#define TINY_MNK (48.0 * 48.0 * 48.0)
/* Farther than this in Σ|log2 ratio| of m, n, k (plus thread mismatch) a tuned blocking says
 * little about the shape: the analytic default serves instead. */
#define NEAREST_MAX 4.0
#define THREAD_MISMATCH 1.5

static int forced(void)
{
    const char *e = getenv("TPK_GEMM");
    if (!e || !*e || !strcmp(e, "tuned"))
        return -1;
    if (!strcmp(e, "openblas"))
        return TPK_GEMM_OPENBLAS;
    if (!strcmp(e, "default"))
        return TPK_GEMM_DEFAULT;
    return -1;
}

static const tpk__gemm_entry *choose(int op, int dtype, size_t m, size_t n, size_t k, int nt, int *how)
{
    int f = forced();
    if (f == TPK_GEMM_OPENBLAS || (double)m * (double)n * (double)k < TINY_MNK) {
        *how = TPK_GEMM_OPENBLAS;
        return NULL;
    }
    int ci = tpk__machine_index(NULL);
    if (ci < 0) {
        *how = TPK_GEMM_OPENBLAS;
        return NULL;
    }
    const tpk__gemm_class *cl = tpk__gemm_classes[ci];
    const tpk__gemm_entry *best = NULL;
    double bd = INFINITY;
    for (size_t i = 0; f != TPK_GEMM_DEFAULT && i < cl->len; i++) {
        const tpk__gemm_entry *e = &cl->table[i];
        if (e->op != op || e->dtype != dtype || !e->name)
            continue;
        if (e->m == m && e->n == n && e->k == k && e->threads == nt) {
            *how = e->ws ? TPK_GEMM_EXACT : TPK_GEMM_OPENBLAS;
            return e->ws ? e : NULL;
        }
        double d = tpk_gemm_shape_distance(e->m, e->n, e->k, m, n, k) + (e->threads != nt ? THREAD_MISMATCH : 0);
        if (d < bd) {
            bd = d;
            best = e;
        }
    }
    if (best && bd <= NEAREST_MAX) {
        *how = best->ws ? TPK_GEMM_NEAREST : TPK_GEMM_OPENBLAS; /* OpenBLAS won there when tuned */
        return best->ws ? best : NULL;
    }
    *how = TPK_GEMM_DEFAULT;
    return &cl->defaults[2 * (op == 1) + (dtype == 1)];
}

static int threads_of(int nthreads)
{
    return nthreads > 0 ? nthreads : omp_get_max_threads();
}

int tpk_gemm_tuned_choice(int dtype, size_t m, size_t n, size_t k, int nthreads, const char **name)
{
    int how;
    const tpk__gemm_entry *e = choose(0, dtype, m, n, k, threads_of(nthreads), &how);
    if (name)
        *name = e ? e->name : "openblas";
    return how;
}

size_t tpk_gemm_tuned_ws_size(int dtype, size_t m, size_t n, size_t k, int nthreads)
{
    int how, nt = threads_of(nthreads);
    const tpk__gemm_entry *e = choose(0, dtype, m, n, k, nt, &how);
    return e ? (e->ws(nt) + 63) / 64 * 64 : 0;
}

int tpk_syrk_tuned_choice(int dtype, size_t n, size_t k, int nthreads, const char **name)
{
    int how;
    const tpk__gemm_entry *e = choose(1, dtype, n, n, k, threads_of(nthreads), &how);
    if (name)
        *name = e ? e->name : "openblas";
    return how;
}

size_t tpk_syrk_tuned_ws_size(int dtype, size_t n, size_t k, int nthreads)
{
    int how, nt = threads_of(nthreads);
    const tpk__gemm_entry *e = choose(1, dtype, n, n, k, nt, &how);
    return e ? (e->ws(nt) + 63) / 64 * 64 : 0;
}

static int check(const char *fn, int transa, int transb, size_t m, size_t n, size_t k, size_t lda,
                 size_t ldb, size_t ldc, tpk_ctx *ctx)
{
    if ((transa != 0 && transa != 1) || (transb != 0 && transb != 1))
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: transpose flags must be 0 or 1", fn);
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: dimension exceeds INT_MAX", fn);
    size_t acols = transa ? m : k, bcols = transb ? k : n;
    if (lda < (acols ? acols : 1) || ldb < (bcols ? bcols : 1) || ldc < (n ? n : 1))
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: leading dimension smaller than a row", fn);
    return TPK_OK;
}

#define TUNED_GEMM(NAME, T, DT, FN, CBLAS)                                                         \
    int NAME(int transa, int transb, size_t m, size_t n, size_t k, T alpha, const T *A, size_t lda, \
             const T *B, size_t ldb, T beta, T *C, size_t ldc, int nthreads, void *ws,             \
             tpk_ctx *ctx)                                                                         \
    {                                                                                              \
        int st = check(#NAME, transa, transb, m, n, k, lda, ldb, ldc, ctx);                        \
        if (st)                                                                                    \
            return st;                                                                             \
        if (m == 0 || n == 0)                                                                      \
            return TPK_OK;                                                                         \
        int how, nt = threads_of(nthreads);                                                        \
        const tpk__gemm_entry *e = k ? choose(0, DT, m, n, k, nt, &how) : NULL;                    \
        if (!e) {                                                                                  \
            if (k == 0) {                                                                          \
                for (size_t i = 0; i < m; i++)                                                     \
                    for (size_t j = 0; j < n; j++)                                                 \
                        C[i * ldc + j] = beta == 0 ? 0 : beta * C[i * ldc + j];                    \
                return TPK_OK;                                                                     \
            }                                                                                      \
            CBLAS(CblasRowMajor, transa ? CblasTrans : CblasNoTrans,                               \
                  transb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, alpha, A, (int)lda,  \
                  B, (int)ldb, beta, C, (int)ldc);                                                 \
            return TPK_OK;                                                                         \
        }                                                                                          \
        void *own = NULL;                                                                          \
        if (!ws) {                                                                                 \
            ws = own = tpk_aligned_alloc(ctx, 64, (e->ws(nt) + 63) / 64 * 64);                     \
            if (!ws)                                                                               \
                return TPK_ERROR(ctx, TPK_ENOMEM, "%s: no memory for a %zu-byte workspace",       \
                                 #NAME, e->ws(nt));                                                \
        }                                                                                          \
        e->FN(m, n, k, alpha, A, transa ? 1 : lda, transa ? lda : 1, B, transb ? 1 : ldb,          \
              transb ? ldb : 1, beta, C, ldc, nt, ws);                                             \
        tpk_aligned_free(ctx, own);                                                                \
        return TPK_OK;                                                                             \
    }

TUNED_GEMM(tpk_gemm_tuned_d, double, 0, dfn, cblas_dgemm)
TUNED_GEMM(tpk_gemm_tuned_s, float, 1, sfn, cblas_sgemm)

/* SYRK: lower triangle of C (n×n) = alpha·op(A)·op(A)ᵀ + beta·C; the kernel sees B = op(A)ᵀ by
 * strides. The strict upper triangle is not touched. */
#define TUNED_SYRK(NAME, T, DT, FN, CBLAS)                                                         \
    int NAME(int trans, size_t n, size_t k, T alpha, const T *A, size_t lda, T beta, T *C,         \
             size_t ldc, int nthreads, void *ws, tpk_ctx *ctx)                                     \
    {                                                                                              \
        int st = check(#NAME, trans, 0, n, n, k, lda, n, ldc, ctx);                                \
        if (st)                                                                                    \
            return st;                                                                             \
        if (n == 0)                                                                                \
            return TPK_OK;                                                                         \
        int how, nt = threads_of(nthreads);                                                        \
        const tpk__gemm_entry *e = k ? choose(1, DT, n, n, k, nt, &how) : NULL;                    \
        if (!e) {                                                                                  \
            if (k == 0) {                                                                          \
                for (size_t i = 0; i < n; i++)                                                     \
                    for (size_t j = 0; j <= i; j++)                                                \
                        C[i * ldc + j] = beta == 0 ? 0 : beta * C[i * ldc + j];                    \
                return TPK_OK;                                                                     \
            }                                                                                      \
            CBLAS(CblasRowMajor, CblasLower, trans ? CblasTrans : CblasNoTrans, (int)n, (int)k,    \
                  alpha, A, (int)lda, beta, C, (int)ldc);                                          \
            return TPK_OK;                                                                         \
        }                                                                                          \
        void *own = NULL;                                                                          \
        if (!ws) {                                                                                 \
            ws = own = tpk_aligned_alloc(ctx, 64, (e->ws(nt) + 63) / 64 * 64);                     \
            if (!ws)                                                                               \
                return TPK_ERROR(ctx, TPK_ENOMEM, "%s: no memory for a %zu-byte workspace",       \
                                 #NAME, e->ws(nt));                                                \
        }                                                                                          \
        size_t rsa = trans ? 1 : lda, csa = trans ? lda : 1;                                       \
        e->FN(n, n, k, alpha, A, rsa, csa, A, csa, rsa, beta, C, ldc, nt, ws);                     \
        tpk_aligned_free(ctx, own);                                                                \
        return TPK_OK;                                                                             \
    }

TUNED_SYRK(tpk_syrk_tuned_d, double, 0, dfn, cblas_dsyrk)
TUNED_SYRK(tpk_syrk_tuned_s, float, 1, sfn, cblas_ssyrk)
