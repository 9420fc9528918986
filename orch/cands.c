/* Candidate kernels (docs/orchestration.md §2): every weakly connected convex set of live
 * primitives up to opts.max_size with at most opts.max_linear LINEAR ones, by Wernicke's ESU
 * enumeration of connected sets (Wernicke, "Efficient detection of network motifs", IEEE/ACM
 * TCBB 2006), each with its variants of written values; costs by a callback; the roofline model. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orch-impl.h"

void tpk_orch_opts_default(tpk_orch_opts *o)
{
    memset(o, 0, sizeof *o);
    o->max_size = 8;
    o->max_linear = 1;
    o->max_extra_outputs = 4;
    o->max_candidates = 200000;
    o->max_rounds = 200;
    o->max_seconds = 0;
    o->max_nodes = 0;
}

/* The enumeration's state: the graph over live primitives as bitsets, and one workspace level
 * per primitive added (S, its extension set, S ∪ N(S), and the descendants and ancestors of S). */
typedef struct enum_state {
    tpk_orch_cands *c;
    int P, nw;
    orch_word *nb;   /* P × nw: undirected neighbours */
    orch_word *desc; /* P × nw: strict descendants */
    orch_word *succ; /* P × nw: direct successors */
    orch_word *anc;  /* P × nw: strict ancestors */
    orch_word *ws;   /* (max_size + 1) levels × 5 × nw */
    int *is_lin;     /* per live primitive */
    int *scratch;    /* 3 × nvalues ints for one emission */
    int *mark;       /* nvalues: stamp of the last emission that saw the value */
    int stamp;
    const tpk_allocator *al; /* the call's (its ctx's): the arrays above */
} enum_state;

static orch_word *row(orch_word *base, int i, int nw)
{
    return base + (size_t)i * (size_t)nw;
}

/* Appends one kernel (prims, inputs, outputs) to the candidate set. */
static int push_kernel(tpk_orch_cands *c, const int *prims, int np, const int *in, int ni,
                       const int *out, int no, int nlin, tpk_ctx *ctx)
{
    if (c->nk >= c->opts.max_candidates)
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED,
                         "orch: more than %d candidate kernels (max_candidates; max_size %d, "
                         "max_extra_outputs %d): lower max_size or max_extra_outputs",
                         c->opts.max_candidates, c->opts.max_size, c->opts.max_extra_outputs);
    int st;
    if ((st = orch_grow((void **)&c->k, sizeof *c->k, (size_t)c->nk + 1, &c->capk, &c->al,
                        ctx)) ||
        (st = orch_grow((void **)&c->off, sizeof *c->off, (size_t)c->nk + 1, &c->capoff, &c->al,
                        ctx)))
        return st;
    size_t need = c->npool + (size_t)np + (size_t)ni + (size_t)no;
    if ((st = orch_grow((void **)&c->pool, sizeof *c->pool, need, &c->cappool, &c->al, ctx)))
        return st;
    int *p = c->pool + c->npool;
    memcpy(p, prims, (size_t)np * sizeof *p);
    memcpy(p + np, in, (size_t)ni * sizeof *p);
    memcpy(p + np + ni, out, (size_t)no * sizeof *p);
    tpk_orch_kernel *k = &c->k[c->nk];
    memset(k, 0, sizeof *k);
    k->nprims = np;
    k->ninputs = ni;
    k->noutputs = no;
    k->nlinear = nlin;
    k->cost = NAN;
    c->off[c->nk] = c->npool;
    c->npool = need;
    c->nk++;
    return TPK_OK;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Emits the candidates of one convex set S (live-index bitset): its inputs, the values it must
 * write (its sinks in S and its graph outputs), and one candidate per chosen subset of the other
 * values of S read outside it (orchestration.md §2). */
static int emit_set(enum_state *e, const orch_word *S, int nlin, tpk_ctx *ctx)
{
    tpk_orch_cands *c = e->c;
    const tpk_orch_graph *g = c->g;
    int nw = e->nw;
    int *prims = e->scratch, *in = prims + g->nvalues, *out = in + g->nvalues;
    int np = 0, ni = 0, nmust = 0, nextra = 0;
    int must[64], extra[64];
    if (++e->stamp == INT32_MAX) {
        memset(e->mark, 0, (size_t)g->nvalues * sizeof *e->mark);
        e->stamp = 1;
    }
    for (int i = 0; i < e->P; i++)
        if (ORCH_BIT(S, i))
            prims[np++] = c->live[i];
    for (int j = 0; j < np; j++) {
        const tpk_orch_value *v = &g->v[prims[j]];
        for (int a = 0; a < v->nargs; a++) {
            int u = v->args[a], lu = c->live_of[u];
            if ((lu >= 0 && ORCH_BIT(S, lu)) || e->mark[u] == e->stamp)
                continue;
            e->mark[u] = e->stamp;
            in[ni++] = u;
        }
    }
    qsort(in, (size_t)ni, sizeof *in, cmp_int);
    /* Sinks of S and graph outputs are written; the other values read outside are optional. */
    for (int j = 0; j < np; j++) {
        const orch_word *su = row(e->succ, c->live_of[prims[j]], nw);
        int inside = 0, outside = 0;
        for (int w = 0; w < nw; w++) {
            inside |= (su[w] & S[w]) != 0;
            outside |= (su[w] & ~S[w]) != 0;
        }
        if (!inside || g->v[prims[j]].is_output)
            must[nmust++] = prims[j];
        else if (outside)
            extra[nextra++] = prims[j];
    }
    int full = nextra <= c->opts.max_extra_outputs;
    unsigned long nvar = full ? 1ul << nextra : 2;
    for (unsigned long m = 0; m < nvar; m++) {
        unsigned long pick = full ? m : (m ? ~0ul : 0);
        int no = 0;
        for (int j = 0; j < nmust; j++)
            out[no++] = must[j];
        for (int j = 0; j < nextra; j++)
            if (pick >> j & 1)
                out[no++] = extra[j];
        qsort(out, (size_t)no, sizeof *out, cmp_int);
        int st = push_kernel(c, prims, np, in, ni, out, no, nlin, ctx);
        if (st)
            return st;
    }
    return TPK_OK;
}

/* Level `d` holds S, ext, NS = S ∪ N(S), D = descendants of S, A = ancestors of S. */
enum { W_S, W_EXT, W_NS, W_D, W_A, W_N };

static orch_word *lvl(enum_state *e, int d, int which)
{
    return e->ws + ((size_t)d * W_N + (size_t)which) * (size_t)e->nw;
}

/* ESU: S at level d (size d + 1) contains v as its smallest element; every connected set with
 * that property is reached once. Convexity (no outside node both below and above S) is checked
 * at each set; it is not monotone, so no pruning by it. */
static int extend(enum_state *e, int d, int v, int nlin, tpk_ctx *ctx)
{
    int nw = e->nw;
    orch_word *S = lvl(e, d, W_S), *ext = lvl(e, d, W_EXT), *NS = lvl(e, d, W_NS);
    orch_word *D = lvl(e, d, W_D), *A = lvl(e, d, W_A);
    int convex = 1;
    for (int w = 0; w < nw && convex; w++)
        convex = (D[w] & A[w] & ~S[w]) == 0;
    if (convex) {
        int st = emit_set(e, S, nlin, ctx);
        if (st)
            return st;
    }
    if (d + 1 >= e->c->opts.max_size)
        return TPK_OK;
    for (;;) {
        int w = -1;
        for (int i = 0; i < nw && w < 0; i++)
            if (ext[i])
                w = i * 64 + __builtin_ctzll(ext[i]);
        if (w < 0)
            break;
        ext[w >> 6] &= ~((orch_word)1 << (w & 63));
        int nl = nlin + e->is_lin[w];
        if (nl > e->c->opts.max_linear)
            continue;
        orch_word *S2 = lvl(e, d + 1, W_S), *ext2 = lvl(e, d + 1, W_EXT);
        orch_word *NS2 = lvl(e, d + 1, W_NS), *D2 = lvl(e, d + 1, W_D), *A2 = lvl(e, d + 1, W_A);
        const orch_word *nbw = row(e->nb, w, nw);
        for (int i = 0; i < nw; i++) {
            S2[i] = S[i];
            /* exclusive neighbours of w above v: not in S, not next to S */
            ext2[i] = ext[i] | (nbw[i] & ~NS[i]);
            NS2[i] = NS[i] | nbw[i];
            D2[i] = D[i] | row(e->desc, w, nw)[i];
            A2[i] = A[i] | row(e->anc, w, nw)[i];
        }
        ORCH_SET(S2, w);
        ORCH_SET(NS2, w);
        /* only elements above v */
        for (int i = 0; i <= v; i++)
            ext2[i >> 6] &= ~((orch_word)1 << (i & 63));
        int st = extend(e, d + 1, v, nl, ctx);
        if (st)
            return st;
    }
    return TPK_OK;
}

/* Who writes and reads each value, as CSR arrays over value ids. */
static int index_rw(tpk_orch_cands *c, tpk_ctx *ctx)
{
    int nv = c->g->nvalues;
    c->wr_start = tpk_mem_calloc(&c->al, (size_t)nv + 1, sizeof *c->wr_start, NULL);
    c->rd_start = tpk_mem_calloc(&c->al, (size_t)nv + 1, sizeof *c->rd_start, NULL);
    size_t nwr = 0, nrd = 0;
    for (int k = 0; k < c->nk; k++) {
        nwr += (size_t)c->k[k].noutputs;
        nrd += (size_t)c->k[k].ninputs;
    }
    c->wr = tpk_mem_malloc(&c->al, (nwr ? nwr : 1) * sizeof *c->wr, NULL);
    c->rd = tpk_mem_malloc(&c->al, (nrd ? nrd : 1) * sizeof *c->rd, NULL);
    if (!c->wr_start || !c->rd_start || !c->wr || !c->rd)
        return TPK_ERROR(ctx, TPK_ENOMEM, "orch: out of memory indexing %d candidates", c->nk);
    for (int k = 0; k < c->nk; k++) {
        for (int j = 0; j < c->k[k].noutputs; j++)
            c->wr_start[c->k[k].outputs[j] + 1]++;
        for (int j = 0; j < c->k[k].ninputs; j++)
            c->rd_start[c->k[k].inputs[j] + 1]++;
    }
    for (int v = 0; v < nv; v++) {
        c->wr_start[v + 1] += c->wr_start[v];
        c->rd_start[v + 1] += c->rd_start[v];
    }
    const tpk_allocator *al = TPK_ALLOCATOR_OF(ctx);
    int *fw = tpk_mem_malloc(al, ((size_t)nv + 1) * sizeof *fw, NULL);
    int *fr = tpk_mem_malloc(al, ((size_t)nv + 1) * sizeof *fr, NULL);
    if (!fw || !fr) {
        tpk_mem_free(al, fw);
        tpk_mem_free(al, fr);
        return TPK_ERROR(ctx, TPK_ENOMEM, "orch: out of memory indexing %d candidates", c->nk);
    }
    memcpy(fw, c->wr_start, ((size_t)nv + 1) * sizeof *fw);
    memcpy(fr, c->rd_start, ((size_t)nv + 1) * sizeof *fr);
    for (int k = 0; k < c->nk; k++) {
        for (int j = 0; j < c->k[k].noutputs; j++)
            c->wr[fw[c->k[k].outputs[j]]++] = k;
        for (int j = 0; j < c->k[k].ninputs; j++)
            c->rd[fr[c->k[k].inputs[j]]++] = k;
    }
    tpk_mem_free(al, fw);
    tpk_mem_free(al, fr);
    return TPK_OK;
}

static int check_opts(const tpk_orch_opts *o, tpk_ctx *ctx)
{
    if (o->max_size < 1 || o->max_size > 64)
        return TPK_ERROR(ctx, TPK_EINVAL, "orch: max_size is %d (1 to 64)", o->max_size);
    if (o->max_linear < 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "orch: max_linear is %d (>= 0)", o->max_linear);
    if (o->max_extra_outputs < 0 || o->max_extra_outputs > 16)
        return TPK_ERROR(ctx, TPK_EINVAL, "orch: max_extra_outputs is %d (0 to 16)",
                         o->max_extra_outputs);
    if (o->max_candidates < 1)
        return TPK_ERROR(ctx, TPK_EINVAL, "orch: max_candidates is %d (>= 1)", o->max_candidates);
    if (o->max_rounds < 1)
        return TPK_ERROR(ctx, TPK_EINVAL, "orch: max_rounds is %d (>= 1)", o->max_rounds);
    if (!(o->max_seconds >= 0) || o->max_nodes < 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "orch: max_seconds %g and max_nodes %d (>= 0)",
                         o->max_seconds, o->max_nodes);
    return TPK_OK;
}

static void enum_free(enum_state *e)
{
    void *b[] = {e->nb, e->desc, e->succ, e->anc, e->ws, e->is_lin, e->scratch, e->mark};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++)
        tpk_mem_free(e->al, b[i]);
}

/* Liveness, the bitset graph and the enumeration. */
static int enumerate(tpk_orch_cands *c, tpk_ctx *ctx)
{
    const tpk_orch_graph *g = c->g;
    int nv = g->nvalues;
    c->live_of = tpk_mem_malloc(&c->al, ((size_t)nv + 1) * sizeof *c->live_of, NULL);
    c->live = tpk_mem_malloc(&c->al, ((size_t)nv + 1) * sizeof *c->live, NULL);
    if (!c->live_of || !c->live)
        return TPK_ERROR(ctx, TPK_ENOMEM, "orch: out of memory for %d values", nv);
    /* Live: graph outputs and every primitive they read, transitively (ids are topological). */
    for (int v = 0; v < nv; v++)
        c->live_of[v] = g->v[v].is_output && !g->v[v].is_input ? 1 : 0;
    for (int v = nv - 1; v >= 0; v--)
        if (c->live_of[v])
            for (int a = 0; a < g->v[v].nargs; a++)
                if (!g->v[g->v[v].args[a]].is_input)
                    c->live_of[g->v[v].args[a]] = 1;
    c->nlive = 0;
    for (int v = 0; v < nv; v++) {
        if (c->live_of[v]) {
            c->live[c->nlive] = v;
            c->live_of[v] = c->nlive++;
        } else
            c->live_of[v] = -1;
    }
    enum_state e;
    memset(&e, 0, sizeof e);
    e.c = c;
    e.al = TPK_ALLOCATOR_OF(ctx);
    e.P = c->nlive;
    e.nw = (e.P + 63) / 64;
    if (e.nw == 0)
        return TPK_OK; /* nothing to compute */
    size_t bs = (size_t)e.P * (size_t)e.nw;
    e.nb = tpk_mem_calloc(e.al, bs, sizeof *e.nb, NULL);
    e.desc = tpk_mem_calloc(e.al, bs, sizeof *e.desc, NULL);
    e.succ = tpk_mem_calloc(e.al, bs, sizeof *e.succ, NULL);
    e.anc = tpk_mem_calloc(e.al, bs, sizeof *e.anc, NULL);
    e.ws = tpk_mem_calloc(e.al, (size_t)(c->opts.max_size + 1) * W_N * (size_t)e.nw,
                          sizeof *e.ws, NULL);
    e.is_lin = tpk_mem_calloc(e.al, (size_t)e.P, sizeof *e.is_lin, NULL);
    e.scratch = tpk_mem_malloc(e.al, 3 * ((size_t)nv + 1) * sizeof *e.scratch, NULL);
    e.mark = tpk_mem_calloc(e.al, (size_t)nv + 1, sizeof *e.mark, NULL);
    if (!e.nb || !e.desc || !e.succ || !e.anc || !e.ws || !e.is_lin || !e.scratch || !e.mark) {
        enum_free(&e);
        return TPK_ERROR(ctx, TPK_ENOMEM, "orch: out of memory for the bitsets of %d primitives",
                         e.P);
    }
    for (int i = 0; i < e.P; i++) {
        const tpk_orch_value *v = &g->v[c->live[i]];
        e.is_lin[i] = v->kind == TPK_ORCH_LINEAR;
        for (int a = 0; a < v->nargs; a++) {
            int p = c->live_of[v->args[a]];
            if (p < 0)
                continue;
            ORCH_SET(row(e.nb, i, e.nw), p);
            ORCH_SET(row(e.nb, p, e.nw), i);
            ORCH_SET(row(e.succ, p, e.nw), i);
            /* ancestors: forward in topological order */
            ORCH_SET(row(e.anc, i, e.nw), p);
            for (int w = 0; w < e.nw; w++)
                row(e.anc, i, e.nw)[w] |= row(e.anc, p, e.nw)[w];
        }
    }
    for (int i = e.P - 1; i >= 0; i--)
        for (int s = i + 1; s < e.P; s++)
            if (ORCH_BIT(row(e.succ, i, e.nw), s)) {
                ORCH_SET(row(e.desc, i, e.nw), s);
                for (int w = 0; w < e.nw; w++)
                    row(e.desc, i, e.nw)[w] |= row(e.desc, s, e.nw)[w];
            }
    int st = TPK_OK;
    for (int v = 0; v < e.P && !st; v++) {
        if (e.is_lin[v] > c->opts.max_linear)
            continue;
        orch_word *S = lvl(&e, 0, W_S), *ext = lvl(&e, 0, W_EXT), *NS = lvl(&e, 0, W_NS);
        orch_word *D = lvl(&e, 0, W_D), *A = lvl(&e, 0, W_A);
        for (int w = 0; w < e.nw; w++) {
            S[w] = 0;
            ext[w] = row(e.nb, v, e.nw)[w];
            NS[w] = row(e.nb, v, e.nw)[w];
            D[w] = row(e.desc, v, e.nw)[w];
            A[w] = row(e.anc, v, e.nw)[w];
        }
        ORCH_SET(S, v);
        ORCH_SET(NS, v);
        for (int i = 0; i <= v; i++)
            ext[i >> 6] &= ~((orch_word)1 << (i & 63));
        st = extend(&e, 0, v, e.is_lin[v], ctx);
    }
    enum_free(&e);
    return st;
}

tpk_orch_cands *tpk_orch_cands_alloc(const tpk_orch_graph *g, const tpk_orch_opts *o,
                                     tpk_ctx *ctx)
{
    if (g == NULL) {
        TPK_ERROR(ctx, TPK_EINVAL, "orch: no graph");
        return NULL;
    }
    tpk_orch_opts dflt;
    tpk_orch_opts_default(&dflt);
    if (o == NULL)
        o = &dflt;
    if (check_opts(o, ctx))
        return NULL;
    int nout = 0;
    for (int v = 0; v < g->nvalues; v++)
        nout += g->v[v].is_output;
    if (nout == 0) {
        TPK_ERROR(ctx, TPK_EINVAL, "orch: the graph has no output (tpk_orch_graph_set_output)");
        return NULL;
    }
    tpk_orch_cands *c = tpk_mem_calloc(TPK_ALLOCATOR_OF(ctx), 1, sizeof *c, NULL);
    if (c == NULL) {
        TPK_ERROR(ctx, TPK_ENOMEM, "orch: out of memory for a candidate set");
        return NULL;
    }
    c->al = tpk_ctx_allocator(ctx);
    c->g = g;
    c->opts = *o;
    int st = enumerate(c, ctx);
    if (!st) {
        for (int k = 0; k < c->nk; k++) {
            int *p = c->pool + c->off[k];
            c->k[k].prims = p;
            c->k[k].inputs = p + c->k[k].nprims;
            c->k[k].outputs = p + c->k[k].nprims + c->k[k].ninputs;
        }
        st = index_rw(c, ctx);
    }
    if (st) {
        tpk_orch_cands_free(c);
        return NULL;
    }
    return c;
}

void tpk_orch_cands_free(tpk_orch_cands *c)
{
    if (c == NULL)
        return;
    const tpk_allocator al = c->al;
    void *b[] = {c->live, c->live_of, c->k, c->pool, c->off, c->wr_start, c->wr, c->rd_start,
                 c->rd};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++)
        tpk_mem_free(&al, b[i]);
    tpk_mem_free(&al, c);
}

int tpk_orch_cands_count(const tpk_orch_cands *c)
{
    return c ? c->nk : 0;
}

const tpk_orch_kernel *tpk_orch_cands_get(const tpk_orch_cands *c, int i)
{
    return c && i >= 0 && i < c->nk ? &c->k[i] : NULL;
}

const tpk_orch_graph *tpk_orch_cands_graph(const tpk_orch_cands *c)
{
    return c ? c->g : NULL;
}

int tpk_orch_cands_set_cost(tpk_orch_cands *c, int i, double cost, tpk_ctx *ctx)
{
    if (c == NULL || i < 0 || i >= c->nk)
        return TPK_ERROR(ctx, TPK_EINVAL, "orch: candidate %d does not exist (%d candidates)", i,
                         c ? c->nk : 0);
    if (isnan(cost) || cost < 0) {
        const tpk_orch_kernel *k = &c->k[i];
        return TPK_ERROR(ctx, TPK_EDOM,
                         "orch: candidate %d (%d primitives from '%s') has cost %g (>= 0 or +inf)",
                         i, k->nprims, c->g->v[k->prims[0]].name, cost);
    }
    c->k[i].cost = cost;
    return TPK_OK;
}

int tpk_orch_cands_cost(tpk_orch_cands *c, tpk_orch_cost_fn fn, void *arg, tpk_ctx *ctx)
{
    if (c == NULL || fn == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "orch: no candidates or no cost function");
    for (int i = 0; i < c->nk; i++) {
        double cost = NAN;
        int st = fn(c->g, &c->k[i], arg, &cost, ctx);
        if (st)
            return ctx && ctx->status ? ctx->status
                                      : TPK_ERROR(ctx, st, "orch: the cost of candidate %d failed",
                                                  i);
        if ((st = tpk_orch_cands_set_cost(c, i, cost, ctx)))
            return st;
    }
    return TPK_OK;
}

int tpk_orch_cost_roofline(const tpk_orch_graph *g, const tpk_orch_kernel *k, void *arg,
                           double *cost, tpk_ctx *ctx)
{
    const tpk_orch_roofline *r = arg;
    if (r == NULL || !(r->launch_s >= 0) || !(r->bytes_per_s > 0) || !(r->flops_per_s > 0))
        return TPK_ERROR(ctx, TPK_EINVAL,
                         "orch: roofline needs launch_s >= 0, bytes_per_s > 0, flops_per_s > 0");
    double bytes = 0, flops = 0;
    for (int i = 0; i < k->ninputs; i++)
        bytes += (double)g->v[k->inputs[i]].bytes;
    for (int i = 0; i < k->noutputs; i++)
        bytes += (double)g->v[k->outputs[i]].bytes;
    for (int i = 0; i < k->nprims; i++)
        flops += g->v[k->prims[i]].flops;
    *cost = r->launch_s + bytes / r->bytes_per_s + flops / r->flops_per_s;
    return TPK_OK;
}
