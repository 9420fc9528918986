/* The one matrix-multiply entry point of the library. Everything that multiplies matrices
 * (finite-width executor, Gram matrices) calls tpk_dgemm, so a tuned kernel can replace the
 * BLAS call in one place (tuner; style.md "framework apart from kernels"). */
#ifndef TPK_MATMUL_H
#define TPK_MATMUL_H

#include <stddef.h>

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

enum tpk_trans { TPK_NO_TRANS = 0, TPK_TRANS = 1 };

/* C ← alpha·op(A)·op(B) + beta·C, all ROW-MAJOR; op(A) is m×k, op(B) is k×n, C is m×n.
 * lda/ldb/ldc are row strides (elements). Fails with TPK_EINVAL on bad flags, strides or sizes
 * the back end cannot index (> INT_MAX). m, n or k = 0 is allowed (k = 0 scales C by beta). */
TPK_API int tpk_dgemm(int transa, int transb, size_t m, size_t n, size_t k, double alpha,
                      const double *A, size_t lda, const double *B, size_t ldb, double beta,
                      double *C, size_t ldc, tpk_ctx *ctx);

/* C ← alpha·A·Aᵀ + beta·C (transa = TPK_NO_TRANS; A is n×k) or alpha·Aᵀ·A (TPK_TRANS; A is k×n),
 * ROW-MAJOR, C n×n. Both triangles of C are written (the product is computed once, then
 * mirrored), so C is exactly symmetric. Errors as tpk_dgemm. */
TPK_API int tpk_dsyrk(int transa, size_t n, size_t k, double alpha, const double *A, size_t lda,
                      double beta, double *C, size_t ldc, tpk_ctx *ctx);
/* As tpk_dsyrk, but only the lower triangle (with the diagonal) of C is written, the strict upper
 * one left as it is: for readers of the lower triangle (it saves the mirror's pass). */
TPK_API int tpk_dsyrk_lower(int transa, size_t n, size_t k, double alpha, const double *A,
                            size_t lda, double beta, double *C, size_t ldc, tpk_ctx *ctx);

enum tpk_side { TPK_LEFT = 0, TPK_RIGHT = 1 };
enum tpk_uplo { TPK_LOWER = 0, TPK_UPPER = 1 };

/* B ← alpha·op(A)·B (side = TPK_LEFT; A is m×m) or alpha·B·op(A) (TPK_RIGHT; A is n×n), B m×n,
 * in place, all ROW-MAJOR; A is triangular (uplo: which triangle holds it; the other is not read),
 * non-unit diagonal. Half the flops of the dense product: causal attention's (I + A) and other
 * lower-triangular mixing maps take it. Errors as tpk_dgemm. */
TPK_API int tpk_dtrmm(int side, int uplo, int transa, size_t m, size_t n, double alpha,
                      const double *A, size_t lda, double *B, size_t ldb, tpk_ctx *ctx);

/* Name of the back end that serves tpk_dgemm now, e.g. "cblas". */
TPK_API const char *tpk_dgemm_backend(void);

#ifdef __cplusplus
}
#endif
#endif
