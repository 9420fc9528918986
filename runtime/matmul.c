/* tpk_dgemm and tpk_dsyrk: the library's matrix-multiply entry points (include/tpk/matmul.h). They
 * go through the shape dispatch of the generated kernels (include/tpk/gemm.h: the tables of this
 * CPU's machine class, from the shipped tuning logs; OpenBLAS where no tuned kernel wins or the
 * problem is tiny). */
#include "tpk/gemm.h"
#include "tpk/matmul.h"

#include <cblas.h>
#include <limits.h>

int tpk_dgemm(int transa, int transb, size_t m, size_t n, size_t k, double alpha,
              const double *A, size_t lda, const double *B, size_t ldb, double beta, double *C,
              size_t ldc, tpk_ctx *ctx)
{
    if ((transa != TPK_NO_TRANS && transa != TPK_TRANS) ||
        (transb != TPK_NO_TRANS && transb != TPK_TRANS))
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_dgemm: transpose flags must be TPK_NO_TRANS or TPK_TRANS");
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_dgemm: dimension exceeds INT_MAX");
    size_t acols = transa == TPK_NO_TRANS ? k : m;
    size_t bcols = transb == TPK_NO_TRANS ? n : k;
    if (lda < (acols ? acols : 1) || ldb < (bcols ? bcols : 1) || ldc < (n ? n : 1))
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_dgemm: leading dimension smaller than a row");
    if (m == 0 || n == 0)
        return TPK_OK;
    if (k == 0) {
        for (size_t i = 0; i < m; i++)
            for (size_t j = 0; j < n; j++)
                C[i * ldc + j] = beta == 0.0 ? 0.0 : beta * C[i * ldc + j];
        return TPK_OK;
    }
    return tpk_gemm_tuned_d(transa == TPK_TRANS, transb == TPK_TRANS, m, n, k, alpha, A, lda, B,
                            ldb, beta, C, ldc, 0, NULL, ctx);
}

static int dsyrk(int transa, size_t n, size_t k, double alpha, const double *A, size_t lda,
                 double beta, double *C, size_t ldc, int mirror, tpk_ctx *ctx)
{
    if (transa != TPK_NO_TRANS && transa != TPK_TRANS)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_dsyrk: transpose flag must be TPK_NO_TRANS or TPK_TRANS");
    if (n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldc > INT_MAX)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_dsyrk: dimension exceeds INT_MAX");
    size_t acols = transa == TPK_NO_TRANS ? k : n;
    if (lda < (acols ? acols : 1) || ldc < (n ? n : 1))
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_dsyrk: leading dimension smaller than a row");
    if (n == 0)
        return TPK_OK;
    if (k == 0) {
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < (mirror ? n : i + 1); j++)
                C[i * ldc + j] = beta == 0.0 ? 0.0 : beta * C[i * ldc + j];
        return TPK_OK;
    }
    /* The lower triangle by the tuned SYRK kernels (gen/: exact, nearest or default blocking of
     * this CPU's class; OpenBLAS where none wins), then the mirror. */
    int st = tpk_syrk_tuned_d(transa == TPK_TRANS, n, k, alpha, A, lda, beta, C, ldc, 0, NULL, ctx);
    if (st || !mirror)
        return st;
    /* mirror the lower triangle, in tiles */
    const size_t TS = 64;
#pragma omp parallel for schedule(dynamic, 1) if (n >= 512)
    for (size_t i0 = 0; i0 < n; i0 += TS)
        for (size_t j0 = 0; j0 <= i0; j0 += TS)
            for (size_t i = i0; i < i0 + TS && i < n; i++)
                for (size_t j = j0; j < j0 + TS && j < i; j++)
                    C[j * ldc + i] = C[i * ldc + j];
    return TPK_OK;
}

int tpk_dsyrk(int transa, size_t n, size_t k, double alpha, const double *A, size_t lda,
              double beta, double *C, size_t ldc, tpk_ctx *ctx)
{
    return dsyrk(transa, n, k, alpha, A, lda, beta, C, ldc, 1, ctx);
}

int tpk_dsyrk_lower(int transa, size_t n, size_t k, double alpha, const double *A, size_t lda,
                    double beta, double *C, size_t ldc, tpk_ctx *ctx)
{
    return dsyrk(transa, n, k, alpha, A, lda, beta, C, ldc, 0, ctx);
}

int tpk_dtrmm(int side, int uplo, int transa, size_t m, size_t n, double alpha, const double *A,
              size_t lda, double *B, size_t ldb, tpk_ctx *ctx)
{
    if ((side != TPK_LEFT && side != TPK_RIGHT) || (uplo != TPK_LOWER && uplo != TPK_UPPER) ||
        (transa != TPK_NO_TRANS && transa != TPK_TRANS))
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_dtrmm: side, triangle or transpose flag out of range");
    if (m > INT_MAX || n > INT_MAX || lda > INT_MAX || ldb > INT_MAX)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_dtrmm: dimension exceeds INT_MAX");
    size_t na = side == TPK_LEFT ? m : n;
    if (lda < (na ? na : 1) || ldb < (n ? n : 1))
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_dtrmm: leading dimension smaller than a row");
    if (m == 0 || n == 0)
        return TPK_OK;
    /* No tuned triangular kernel: OpenBLAS's (threaded, GEMM-based) serves it. */
    cblas_dtrmm(CblasRowMajor, side == TPK_LEFT ? CblasLeft : CblasRight,
                uplo == TPK_LOWER ? CblasLower : CblasUpper, transa ? CblasTrans : CblasNoTrans,
                CblasNonUnit, (int)m, (int)n, alpha, A, (int)lda, B, (int)ldb);
    return TPK_OK;
}

const char *tpk_dgemm_backend(void)
{
    return "tuned (gen/, the machine class of this CPU) with OpenBLAS fallback";
}
