/* The primitive DAG of kernel orchestration (docs/orchestration.md §1): graph inputs and
 * primitives with kinds, shapes and arithmetic, edges from their arguments, marked outputs. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orch-impl.h"

static const char *const KIND_NAMES[TPK_ORCH_NKINDS] = {"linear", "map", "reduce", "broadcast",
                                                        "layout"};

const char *tpk_orch_kind_name(int kind)
{
    return kind >= 0 && kind < TPK_ORCH_NKINDS ? KIND_NAMES[kind] : "?";
}

int orch_grow(void **p, size_t size, size_t need, size_t *cap, const tpk_allocator *al,
              tpk_ctx *ctx)
{
    if (need <= *cap)
        return TPK_OK;
    size_t n = *cap ? *cap : 16;
    while (n < need)
        n *= 2;
    if (n > SIZE_MAX / size)
        return TPK_ERROR(ctx, TPK_ENOMEM, "orch: %zu items of %zu bytes overflow", n, size);
    void *q = tpk_mem_realloc(al, *p, n * size, NULL);
    if (q == NULL)
        return TPK_ERROR(ctx, TPK_ENOMEM, "orch: out of memory (%zu bytes)", n * size);
    *p = q;
    *cap = n;
    return TPK_OK;
}

tpk_orch_graph *tpk_orch_graph_alloc(tpk_ctx *ctx)
{
    tpk_orch_graph *g = tpk_mem_calloc(TPK_ALLOCATOR_OF(ctx), 1, sizeof *g, NULL);
    if (g == NULL)
        TPK_ERROR(ctx, TPK_ENOMEM, "orch: out of memory for a graph");
    else
        g->al = tpk_ctx_allocator(ctx);
    return g;
}

void tpk_orch_graph_free(tpk_orch_graph *g)
{
    if (g == NULL)
        return;
    const tpk_allocator al = g->al;
    for (int i = 0; i < g->nvalues; i++)
        tpk_mem_free(&al, (int *)g->v[i].args); /* the graph's own copy */
    tpk_mem_free(&al, g->v);
    tpk_mem_free(&al, g);
}

int tpk_orch_graph_nvalues(const tpk_orch_graph *g)
{
    return g ? g->nvalues : 0;
}

const tpk_orch_value *tpk_orch_graph_value(const tpk_orch_graph *g, int id)
{
    return g && id >= 0 && id < g->nvalues ? &g->v[id] : NULL;
}

/* Checks the shape and computes its bytes; the name is for the message. */
static int shape_bytes(const tpk_orch_shape *s, const char *name, size_t *bytes, tpk_ctx *ctx)
{
    if (s == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "orch: value '%s' has no shape", name);
    if (s->rank < 0 || s->rank > TPK_ORCH_MAX_RANK)
        return TPK_ERROR(ctx, TPK_EINVAL, "orch: value '%s' has rank %d (0 to %d)", name,
                         s->rank, TPK_ORCH_MAX_RANK);
    if (s->elem_size == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "orch: value '%s' has elements of 0 bytes", name);
    size_t b = s->elem_size;
    for (int i = 0; i < s->rank; i++) {
        if (s->dims[i] == 0)
            return TPK_ERROR(ctx, TPK_EINVAL, "orch: value '%s' has dimension %d of size 0", name,
                             i);
        if (b > SIZE_MAX / s->dims[i])
            return TPK_ERROR(ctx, TPK_EINVAL, "orch: value '%s' has more bytes than size_t holds",
                             name);
        b *= s->dims[i];
    }
    *bytes = b;
    return TPK_OK;
}

static int add_value(tpk_orch_graph *g, const char *name, int is_input, int kind,
                     const tpk_orch_shape *shape, double flops, int nargs, const int *args, int *id,
                     tpk_ctx *ctx)
{
    if (g == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "orch: no graph");
    char nm[TPK_ORCH_NAME_MAX];
    if (name != NULL && *name)
        snprintf(nm, sizeof nm, "%s", name);
    else
        snprintf(nm, sizeof nm, "%%%d", g->nvalues);
    size_t bytes = 0;
    int st = shape_bytes(shape, nm, &bytes, ctx);
    if (st)
        return st;
    if (!is_input) {
        if (kind < 0 || kind >= TPK_ORCH_NKINDS)
            return TPK_ERROR(ctx, TPK_EINVAL, "orch: primitive '%s' has kind %d (0 to %d)", nm,
                             kind, TPK_ORCH_NKINDS - 1);
        if (!(flops >= 0) || !isfinite(flops))
            return TPK_ERROR(ctx, TPK_EINVAL, "orch: primitive '%s' has %g flops (finite, >= 0)",
                             nm, flops);
        if (nargs < 1 || args == NULL)
            return TPK_ERROR(ctx, TPK_EINVAL, "orch: primitive '%s' reads no value", nm);
        for (int i = 0; i < nargs; i++)
            if (args[i] < 0 || args[i] >= g->nvalues)
                return TPK_ERROR(ctx, TPK_EINVAL,
                                 "orch: primitive '%s' argument %d is value %d, not one of the %d "
                                 "defined before it",
                                 nm, i + 1, args[i], g->nvalues);
    }
    if (g->nvalues == INT32_MAX)
        return TPK_ERROR(ctx, TPK_EINVAL, "orch: too many values");
    if ((st = orch_grow((void **)&g->v, sizeof *g->v, (size_t)g->nvalues + 1, &g->cap, &g->al,
                        ctx)))
        return st;
    int *own = NULL;
    if (!is_input) {
        own = tpk_mem_malloc(&g->al, (size_t)nargs * sizeof *own, NULL);
        if (own == NULL)
            return TPK_ERROR(ctx, TPK_ENOMEM, "orch: out of memory for '%s'", nm);
        memcpy(own, args, (size_t)nargs * sizeof *own);
    }
    tpk_orch_value *v = &g->v[g->nvalues];
    memset(v, 0, sizeof *v);
    memcpy(v->name, nm, sizeof nm);
    v->is_input = is_input;
    v->kind = is_input ? -1 : kind;
    v->shape = *shape;
    v->bytes = bytes;
    v->flops = is_input ? 0 : flops;
    v->nargs = is_input ? 0 : nargs;
    v->args = own;
    if (id)
        *id = g->nvalues;
    g->nvalues++;
    return TPK_OK;
}

int tpk_orch_graph_add_input(tpk_orch_graph *g, const char *name, const tpk_orch_shape *shape,
                             int *id, tpk_ctx *ctx)
{
    return add_value(g, name, 1, -1, shape, 0, 0, NULL, id, ctx);
}

int tpk_orch_graph_add_prim(tpk_orch_graph *g, const char *name, int kind,
                            const tpk_orch_shape *shape, double flops, int nargs, const int *args,
                            int *id, tpk_ctx *ctx)
{
    return add_value(g, name, 0, kind, shape, flops, nargs, args, id, ctx);
}

int tpk_orch_graph_set_output(tpk_orch_graph *g, int id, tpk_ctx *ctx)
{
    if (g == NULL || id < 0 || id >= g->nvalues)
        return TPK_ERROR(ctx, TPK_EINVAL, "orch: output %d is not a value of the graph (0 to %d)",
                         id, g ? g->nvalues - 1 : -1);
    g->v[id].is_output = 1;
    return TPK_OK;
}
