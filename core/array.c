/* Dense arrays: allocation with overflow checks. */
#include "tpk/array.h"
#include "tpk/alloc.h"

#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

tpk_array *tpk_array_alloc(int ndim, const size_t *dims, tpk_ctx *ctx)
{
    if (ndim < 1 || ndim > TPK_ARRAY_MAXDIM) {
        TPK_ERROR(ctx, TPK_EINVAL, "array rank %d outside 1..%d", ndim, TPK_ARRAY_MAXDIM);
        return NULL;
    }
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (dims[i] != 0 && n > SIZE_MAX / sizeof(double) / dims[i]) {
            TPK_ERROR(ctx, TPK_ENOMEM, "array of that shape is too large");
            return NULL;
        }
        n *= dims[i];
    }
    if (tpk_array_check_memory(n, "array", ctx))
        return NULL;
    tpk_array *a = tpk_calloc(ctx, 1, sizeof *a);
    if (a == NULL)
        return NULL;
    a->ndim = ndim;
    a->alloc = tpk_ctx_allocator(ctx);
    for (int i = 0; i < ndim; i++)
        a->dims[i] = dims[i];
    a->data = tpk_calloc(ctx, n ? n : 1, sizeof(double));
    if (a->data == NULL) {
        tpk_free(ctx, a);
        return NULL;
    }
    return a;
}

tpk_array *tpk_array_alloc2(size_t rows, size_t cols, tpk_ctx *ctx)
{
    size_t d[2] = {rows, cols};
    return tpk_array_alloc(2, d, ctx);
}

void tpk_array_free(tpk_array *a)
{
    if (a == NULL)
        return;
    tpk_allocator al = a->alloc;
    tpk_mem_free(&al, a->data);
    tpk_mem_free(&al, a);
}

size_t tpk_array_size(const tpk_array *a)
{
    size_t n = 1;
    for (int i = 0; i < a->ndim; i++)
        n *= a->dims[i];
    return n;
}

size_t tpk_array_item_size(const tpk_array *a)
{
    size_t n = 1;
    for (int i = 1; i < a->ndim; i++)
        n *= a->dims[i];
    return n;
}

tpk_array *tpk_array_block(const tpk_array *A, size_t r0, size_t rows, size_t c0, size_t cols,
                           tpk_ctx *ctx)
{
    if (A->ndim != 2 || r0 + rows > A->dims[0] || c0 + cols > A->dims[1]) {
        TPK_ERROR(ctx, TPK_EINVAL, "block outside the matrix");
        return NULL;
    }
    tpk_array *B = tpk_array_alloc2(rows, cols, ctx);
    if (!B)
        return NULL;
    for (size_t i = 0; i < rows; i++)
        memcpy(B->data + i * cols, A->data + (r0 + i) * A->dims[1] + c0, cols * sizeof(double));
    return B;
}

size_t tpk_array_first_nonfinite(const tpk_array *a, char *idx, size_t cap)
{
    size_t n = tpk_array_size(a);
    for (size_t i = 0; i < n; i++) {
        if (isfinite(a->data[i]))
            continue;
        size_t rem = i, used = 0, pos[TPK_ARRAY_MAXDIM];
        for (int k = a->ndim - 1; k >= 0; k--) {
            pos[k] = rem % a->dims[k];
            rem /= a->dims[k];
        }
        if (cap)
            idx[0] = '\0';
        for (int k = 0; k < a->ndim && used < cap; k++)
            used += (size_t)snprintf(idx + used, cap - used, k ? ", %zu" : "%zu", pos[k]);
        return i;
    }
    return n;
}

/* The one check behind every public entry point that takes arrays (issue 40): the first NaN or
 * infinity is named by the entry point, the array as its caller calls it, and its 0-based
 * multi-index, before any arithmetic can turn it into an error about something else ("a
 * pre-activation variance is not a number"). */
int tpk_array_check_finite(const tpk_array *a, const char *entry, const char *name, tpk_ctx *ctx)
{
    if (a == NULL || a->data == NULL)
        return TPK_OK; /* the entry point's own shape checks name a missing array */
    char idx[160];
    size_t i = tpk_array_first_nonfinite(a, idx, sizeof idx);
    if (i == tpk_array_size(a))
        return TPK_OK;
    double v = a->data[i];
    return TPK_ERROR(ctx, TPK_EDOM, "%s: %s[%s] is %s (indices from 0): the inputs must be finite",
                     entry ? entry : "tpk", name ? name : "input", idx,
                     isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf");
}

int tpk_values_check_finite(const double *v, size_t n, const char *entry, const char *name,
                            tpk_ctx *ctx)
{
    if (v == NULL)
        return TPK_OK;
    tpk_array view = {.ndim = 1, .dims = {n}, .data = (double *)v};
    return tpk_array_check_finite(&view, entry, name, ctx);
}

int tpk_array_check_input(const tpk_array *a, const char *entry, const char *name, tpk_ctx *ctx)
{
    int st = tpk_array_check_finite(a, entry, name, ctx);
    if (st || a == NULL || a->data == NULL)
        return st;
    char what[256];
    snprintf(what, sizeof what, "%s: %s", entry ? entry : "tpk", name ? name : "input");
    return tpk_array_check_scale(a, what, ctx);
}

/* "3×4" (the dims after the first), or "scalar" for one value per item. */
static void item_shape(const tpk_array *a, char *buf, size_t len)
{
    size_t k = 0;
    buf[0] = 0;
    for (int i = 1; i < a->ndim && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, "%s%zu", i > 1 ? "\xc3\x97" : "", a->dims[i]);
    if (a->ndim < 2)
        snprintf(buf, len, "scalar");
}

int tpk_array_check_items(const tpk_array *test, const char *test_name,
                          const tpk_array *train, const char *train_name, tpk_ctx *ctx)
{
    int same = test->ndim == train->ndim;
    for (int i = 1; same && i < test->ndim; i++)
        same = test->dims[i] == train->dims[i];
    if (same)
        return TPK_OK;
    char st[96], sr[96];
    item_shape(test, st, sizeof st);
    item_shape(train, sr, sizeof sr);
    return TPK_ERROR(ctx, TPK_EINVAL, "%s: test items have %zu values each (shape %s) but the items "
                     "of %s have %zu (shape %s)", test_name ? test_name : "test input",
                     tpk_array_item_size(test), st, train_name ? train_name : "the input",
                     tpk_array_item_size(train), sr);
}

int tpk_array_check_scale(const tpk_array *a, const char *name, tpk_ctx *ctx)
{
    size_t d = a->ndim >= 2 ? a->dims[a->ndim - 1] : 1, nv = tpk_array_size(a) / (d ? d : 1);
    for (size_t v = 0; v < nv; v++) {
        double s = 0, big = 0;
        const double *x = a->data + v * d;
        for (size_t k = 0; k < d; k++) {
            s += x[k] * x[k];
            big = fmax(big, fabs(x[k]));
        }
        if (!isfinite(s)) {
            size_t per = nv / (a->dims[0] ? a->dims[0] : 1);
            return TPK_ERROR(ctx, TPK_EDOM, "%s: item %zu%s has a squared norm beyond the range of "
                             "a double (entries up to %g): rescale the inputs", name ? name : "input",
                             v / (per ? per : 1), per > 1 ? " (one of its vectors)" : "", big);
        }
    }
    return TPK_OK;
}

int tpk_array_check_memory(size_t count, const char *what, tpk_ctx *ctx)
{
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || psize <= 0)
        return TPK_OK;
    double phys = (double)pages * (double)psize, need = (double)count * sizeof(double);
    if (need <= 0.6 * phys)
        return TPK_OK;
    return TPK_ERROR(ctx, TPK_ENOMEM, "%s: %zu values (%.3g GB) are more than this machine can "
                     "hold (%.3g GB of memory)", what ? what : "array", count, need / 1e9,
                     phys / 1e9);
}

void tpk_lower_index(size_t k, size_t *i, size_t *j)
{
    size_t r = (size_t)((sqrt(8.0 * (double)k + 1.0) - 1.0) / 2.0);
    while (r > 0 && r * (r + 1) / 2 > k)
        r--;
    while ((r + 1) * (r + 2) / 2 <= k)
        r++;
    *i = r;
    *j = k - r * (r + 1) / 2;
}
