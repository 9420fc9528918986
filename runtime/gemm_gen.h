/* The tables that gen/tpk_gemm_cpu_ID.c (generated per machine class from data/tuning logs)
 * define and the dispatcher (gemm_dispatch.c) reads. */
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

/* One machine class's table (gen/tpk_gemm_cpu_ID.c, compiled with that class's flags): the tuned
 * workloads, and safe defaults (the class's analytic blocking) indexed by 2·op + dtype. The class
 * index gen/tpk_classes.c lists them in the order of tpk__machine_classes (machine_gen.h). */
typedef struct tpk__gemm_class {
    const tpk__gemm_entry *table;
    size_t len;
    const tpk__gemm_entry *defaults; /* [4] */
} tpk__gemm_class;

#endif
