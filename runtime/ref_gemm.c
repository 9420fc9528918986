/* Reference GEMM beside the generated ones (style.md §9, BLIS ref_kernels): plain loops, the
 * oracle every tuned kernel is checked against. */
#include "tpk/gemm.h"

#define REF_GEMM(NAME, T)                                                                          \
    void NAME(size_t m, size_t n, size_t k, T alpha, const T *A, size_t rsa, size_t csa,           \
              const T *B, size_t rsb, size_t csb, T beta, T *C, size_t ldc)                        \
    {                                                                                              \
        for (size_t i = 0; i < m; i++)                                                             \
            for (size_t j = 0; j < n; j++) {                                                       \
                double s = 0; /* accumulate in double: the oracle should be the better answer */   \
                for (size_t p = 0; p < k; p++)                                                     \
                    s += (double)A[i * rsa + p * csa] * (double)B[p * rsb + j * csb];              \
                T *c = &C[i * ldc + j];                                                            \
                *c = (T)((beta == 0 ? 0.0 : (double)beta * (double)*c) + (double)alpha * s);      \
            }                                                                                      \
    }

REF_GEMM(tpk_ref_dgemm, double)
REF_GEMM(tpk_ref_sgemm, float)
