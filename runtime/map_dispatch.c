/* Dispatch of the tuned ReLU maps (AutoTVM ApplyHistoryBest + fallback, tuner-notes §3 "Lookup",
 * §7): the machine class serving this CPU, then by size within its table: exact (dtype, n,
 * threads) → nearest tuned n in log2 space → the class's analytic default; the reference loops
 * where no shipped class runs on this CPU. */
#include "tpk/map.h"
#include "tpk/alloc.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "machine_gen.h"
#include "map_gen.h"

/* Farther than this in |log2 n ratio| (plus the thread mismatch) a tuned tiling says little
 * about the size: the analytic default serves. */
#define NEAREST_MAX 3.0
#define THREAD_MISMATCH 1.5

static int forced(void)
{
    const char *e = getenv("TPK_MAP");
    if (!e || !*e || !strcmp(e, "tuned"))
        return -1;
    if (!strcmp(e, "reference"))
        return TPK_MAP_REFERENCE;
    if (!strcmp(e, "default"))
        return TPK_MAP_DEFAULT;
    return -1;
}

static int threads_of(int nthreads)
{
    return nthreads > 0 ? nthreads : omp_get_max_threads();
}

static const tpk__map_entry *choose(int dtype, size_t n, int nt, int *how)
{
    int f = forced(), ci = tpk__machine_index(NULL);
    if (ci < 0) {
        *how = TPK_MAP_REFERENCE;
        return NULL;
    }
    const tpk__map_class *cl = tpk__map_classes[ci];
    const tpk__map_entry *best = NULL;
    double bd = INFINITY;
    for (size_t i = 0; f != TPK_MAP_DEFAULT && i < cl->len; i++) {
        const tpk__map_entry *e = &cl->table[i];
        if (e->dtype != dtype || !e->name || !e->ws)
            continue;
        double d = fabs(log2((double)e->n / (double)(n ? n : 1))) + (e->threads != nt ? THREAD_MISMATCH : 0);
        if (d < bd) {
            bd = d;
            best = e;
        }
    }
    if (best && bd <= NEAREST_MAX)
        *how = bd == 0 ? TPK_MAP_EXACT : TPK_MAP_NEAREST;
    else {
        *how = TPK_MAP_DEFAULT;
        best = &cl->defaults[dtype == 1];
    }
    if (f == TPK_MAP_REFERENCE)
        *how = TPK_MAP_REFERENCE;
    return best;
}

int tpk_relu_map_tuned_choice(int dtype, size_t n, int nthreads, const char **name)
{
    int how;
    const tpk__map_entry *e = choose(dtype, n, threads_of(nthreads), &how);
    if (name)
        *name = how == TPK_MAP_REFERENCE || !e ? "reference" : e->name;
    return how;
}

size_t tpk_relu_map_tuned_ws_size(int dtype, size_t n, int nthreads)
{
    int how;
    const tpk__map_entry *e = choose(dtype, n, threads_of(nthreads), &how);
    return e ? (e->ws(n) + 63) / 64 * 64 : 0;
}

#define TUNED_MAP(NAME, T, DT, FN, REF)                                                            \
    int NAME(size_t n, const T *S, size_t lds, T alpha, T beta, T *out, size_t ldo, int nthreads,  \
             void *ws, int *bad, tpk_ctx *ctx)                                                     \
    {                                                                                              \
        if (bad)                                                                                   \
            *bad = 0;                                                                              \
        if (n == 0)                                                                                \
            return TPK_OK;                                                                         \
        if (!S || !out)                                                                            \
            return TPK_ERROR(ctx, TPK_EINVAL, "%s: S and out are required", #NAME);                \
        if (lds < n || ldo < n)                                                                    \
            return TPK_ERROR(ctx, TPK_EINVAL, "%s: row stride smaller than n", #NAME);             \
        for (size_t i = 0; i < n; i++) {                                                           \
            const double qi = (double)S[i * lds + i];                                              \
            if (!isfinite(qi) || !(qi >= 0))                                                       \
                return TPK_ERROR(ctx, TPK_EDOM, "%s: S[%zu,%zu] = %g is not a finite variance >= 0", \
                                 #NAME, i, i, qi);                                                 \
        }                                                                                          \
        int how, nt = threads_of(nthreads);                                                        \
        const tpk__map_entry *e = choose(DT, n, nt, &how);                                         \
        if (!e) { /* no class runs here: the reference loops */                                    \
            int b = REF(n, S, lds, alpha, beta, out, ldo);                                         \
            if (b < 0)                                                                             \
                return TPK_ERROR(ctx, TPK_ENOMEM, "%s: out of memory", #NAME);                     \
            if (bad)                                                                               \
                *bad = b;                                                                          \
            return TPK_OK;                                                                         \
        }                                                                                          \
        void *own = NULL;                                                                          \
        if (!ws) {                                                                                 \
            ws = own = tpk_aligned_alloc(ctx, 64, (e->ws(n) + 63) / 64 * 64);                      \
            if (!ws)                                                                               \
                return TPK_ERROR(ctx, TPK_ENOMEM, "%s: no memory for a %zu-byte workspace", #NAME, \
                                 e->ws(n));                                                        \
        }                                                                                          \
        int b = e->FN(n, S, lds, alpha, beta, out, ldo, nt, ws);                                   \
        tpk_aligned_free(ctx, own);                                                                \
        if (bad)                                                                                   \
            *bad = b;                                                                              \
        return TPK_OK;                                                                             \
    }

TUNED_MAP(tpk_relu_map_tuned_d, double, 0, dfn, tpk_ref_relu_map_d)
TUNED_MAP(tpk_relu_map_tuned_s, float, 1, sfn, tpk_ref_relu_map_s)
