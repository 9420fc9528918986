/* The table that gen/tpk_gemm_cpu.c (generated from data/tuning logs) defines and the
 * dispatcher (gemm_dispatch.c) reads. */
#ifndef TPK_GEMM_GEN_H
#define TPK_GEMM_GEN_H

#include <stddef.h>

#include "tpk/gemm.h"

typedef struct tpk__gemm_entry {
    int op;      /* enum tpk_tune_op: gemm, or syrk (lower triangle, B = Aᵀ by strides) */
    int dtype;   /* enum tpk_tune_dtype */
    int threads; /* threads it was tuned for */
    size_t m, n, k;
    double gflops; /* measured when tuned */
    const char *name;
    tpk_dgemm_kernel_fn dfn; /* set for f64 */
    tpk_sgemm_kernel_fn sfn; /* set for f32 */
    tpk_gemm_ws_fn ws;
} tpk__gemm_entry;

extern const tpk__gemm_entry tpk__gemm_table[];
extern const size_t tpk__gemm_table_len;
/* Safe defaults (analytic blocking), indexed by 2·op + dtype. */
extern const tpk__gemm_entry tpk__gemm_default[4];

#endif
