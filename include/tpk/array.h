/* Dense row-major float64 arrays of rank 1..4: inputs (N×d, N×T×d, N×H×W×C) and kernels (N×N). */
#ifndef TPK_ARRAY_H
#define TPK_ARRAY_H

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TPK_ARRAY_MAXDIM 4

typedef struct tpk_array {
    int ndim;
    size_t dims[TPK_ARRAY_MAXDIM];
    double *data; /* row-major, owned by the array */
    tpk_allocator alloc; /* what tpk_array_free gives the header and data back to (tpk/alloc.h);
                          * zeroed in an array built by hand: the C library's malloc */
} tpk_array;

/* Allocate a zero-filled array from ctx's allocator (which it remembers); returns NULL (and sets
 * ctx) on failure. */
TPK_API tpk_array *tpk_array_alloc(int ndim, const size_t *dims, tpk_ctx *ctx);
TPK_API tpk_array *tpk_array_alloc2(size_t rows, size_t cols, tpk_ctx *ctx);
TPK_API void tpk_array_free(tpk_array *a);
TPK_API size_t tpk_array_size(const tpk_array *a);
/* Number of items along axis 0 (N) and the size of one item (product of the other dims). */
TPK_API size_t tpk_array_item_size(const tpk_array *a);
/* Do the items (dims after the first) of test have the shape of train's? If not, TPK_EINVAL with
 * "TEST: test items have K values each (shape a×b) but the items of TRAIN have ... (shape c×d)". */
/* Are the squared norms along the last axis (a vector per item and slot: what every kernel's
 * first Gram x·x'/d needs) within the range of a double? If not, TPK_EDOM naming the item and
 * the largest entry ("rescale the inputs"), rather than an overflow deep in a recursion. */
/* Would an array of `count` doubles fit in 60% of this machine's memory? If not, TPK_ENOMEM
 * "WHAT: COUNT values (X GB) are more than this machine can hold (Y GB of memory)" — a clear
 * error before the allocation (a corrupt header's shape, an oversized request), instead of an
 * allocator failure or the OOM killer. */
TPK_API int tpk_array_check_memory(size_t count, const char *what, tpk_ctx *ctx);
TPK_API int tpk_array_check_scale(const tpk_array *a, const char *name, tpk_ctx *ctx);
TPK_API int tpk_array_check_items(const tpk_array *test, const char *test_name,
                                  const tpk_array *train, const char *train_name, tpk_ctx *ctx);
/* The check every public entry point that takes arrays runs first (issue 40): TPK_EDOM
 * "ENTRY: NAME[i, j] is NaN (indices from 0): the inputs must be finite" (or +Inf, -Inf) for
 * the first non-finite entry of a, naming the entry point and the array as its caller calls it;
 * TPK_OK when every entry is finite, or a (or its data) is NULL. The entry points: the kernels
 * (tpk_mlp_*, tpk_transformer_kernel, tpk_gru_kernel, tpk_cnn_kernel), tpk_netsor_kernel* and
 * tpk_netsor_run*, the *_arrays jobs, tpk_arch_kernel*, and the GP calls on kernels and targets
 * (tests/test_input_checks.c calls each one). The building blocks they are made of (tpk_dgemm,
 * tpk_gauss_map*, tpk_cnn_conv_block and tpk_cnn_layer_*, tpk_bn_*, tpk_attn_*, tpk_limits_*)
 * run inside loops over blocks and take what they are given: a NaN in gives NaN out there. */
TPK_API int tpk_array_check_finite(const tpk_array *a, const char *entry, const char *name,
                                   tpk_ctx *ctx);
/* The same for n values a caller passes as a plain vector ("ENTRY: NAME[i] is NaN ..."). */
TPK_API int tpk_values_check_finite(const double *v, size_t n, const char *entry,
                                    const char *name, tpk_ctx *ctx);
/* A kernel's inputs: tpk_array_check_finite, then tpk_array_check_scale (a finite 1e200 whose
 * square overflows), both messages starting "ENTRY: NAME". */
TPK_API int tpk_array_check_input(const tpk_array *a, const char *entry, const char *name,
                                  tpk_ctx *ctx);
/* The flat index of the first NaN or infinite entry (tpk_array_size(a) when all are finite),
 * and its 0-based multi-index as "i, j, k" in idx (cap bytes): what error messages name. */
TPK_API size_t tpk_array_first_nonfinite(const tpk_array *a, char *idx, size_t cap);
/* The k-th entry of a lower triangle in row-major order, k = i(i+1)/2 + j with j ≤ i: (i, j).
 * The square root's estimate is corrected by integer steps, so every k below 2^52 is exact (the
 * pair loops and tile walks that spread a triangle over threads). */
TPK_API void tpk_lower_index(size_t k, size_t *i, size_t *j);
/* A copy of the rows×cols block of the 2-D array A at (r0, c0); NULL (ctx set) on failure. */
TPK_API tpk_array *tpk_array_block(const tpk_array *A, size_t r0, size_t rows, size_t c0,
                                   size_t cols, tpk_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
