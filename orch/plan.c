/* Plans (docs/orchestration.md §3.2, §5): the executable order of a selection of candidates,
 * the check of a plan, the naive plan (one kernel per primitive), printing and freeing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orch-impl.h"
#include "tpk/clock.h"

/* A plan's stated cost against its kernels' sum: a sum in another order (a caller's) may differ
 * by rounding, n ulps for n kernels; plans here have at most a few hundred. */
#define PLAN_COST_RTOL 1e-12

tpk_orch_plan *orch_plan_new(const tpk_orch_cands *c, const int *kernels, int n, tpk_ctx *ctx)
{
    const tpk_allocator *al = TPK_ALLOCATOR_OF(ctx);
    tpk_orch_plan *p = tpk_mem_calloc(al, 1, sizeof *p, NULL);
    int *k = tpk_mem_malloc(al, ((size_t)n + 1) * sizeof *k, NULL);
    if (p == NULL || k == NULL) {
        tpk_mem_free(al, p);
        tpk_mem_free(al, k);
        TPK_ERROR(ctx, TPK_ENOMEM, "orch: out of memory for a plan of %d kernels", n);
        return NULL;
    }
    memcpy(k, kernels, (size_t)n * sizeof *k);
    p->alloc = tpk_ctx_allocator(ctx);
    p->kernels = k;
    p->nkernels = n;
    for (int i = 0; i < n; i++)
        p->cost += c->k[kernels[i]].cost;
    return p;
}

void tpk_orch_plan_free(tpk_orch_plan *p)
{
    if (p == NULL)
        return;
    const tpk_allocator al = p->alloc;
    tpk_mem_free(&al, p->kernels);
    tpk_mem_free(&al, p);
}

static int outputs_written(const tpk_orch_cands *c, const unsigned char *avail)
{
    for (int v = 0; v < c->g->nvalues; v++)
        if (c->g->v[v].is_output && !c->g->v[v].is_input && !avail[v])
            return 0;
    return 1;
}

static int ready(const tpk_orch_cands *c, int k, const unsigned char *avail)
{
    const tpk_orch_kernel *K = &c->k[k];
    for (int j = 0; j < K->ninputs; j++)
        if (!c->g->v[K->inputs[j]].is_input && !avail[K->inputs[j]])
            return 0;
    return 1;
}

/* A kernel can run once all its inputs are in memory, and running it only adds values, so
 * placing any ready kernel never hurts: the greedy order finds one iff one exists. */
int orch_order(const tpk_orch_cands *c, const int *sel, int n, int *order, int *placed,
               int *stuck, int *nstuck, const tpk_allocator *al)
{
    int nv = c->g->nvalues;
    unsigned char *avail = tpk_mem_calloc(al, (size_t)nv + 1, 1, NULL);
    unsigned char *done = tpk_mem_calloc(al, (size_t)n + 1, 1, NULL);
    if (avail == NULL || done == NULL) {
        tpk_mem_free(al, avail);
        tpk_mem_free(al, done);
        return -1;
    }
    int np = 0;
    for (int progress = 1; progress;) {
        progress = 0;
        for (int i = 0; i < n; i++) {
            if (done[i] || !ready(c, sel[i], avail))
                continue;
            done[i] = 1;
            order[np++] = sel[i];
            const tpk_orch_kernel *K = &c->k[sel[i]];
            for (int j = 0; j < K->noutputs; j++)
                avail[K->outputs[j]] = 1;
            progress = 1;
        }
    }
    *placed = np;
    *nstuck = 0;
    for (int i = 0; i < n; i++)
        if (!done[i])
            stuck[(*nstuck)++] = sel[i];
    int ok = outputs_written(c, avail);
    tpk_mem_free(al, avail);
    tpk_mem_free(al, done);
    return ok;
}

/* "{a,b,c}" of value names into buf. */
static const char *names(const tpk_orch_graph *g, const int *ids, int n, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && len + 1 < cap; i++) {
        int w = snprintf(buf + len, cap - len, "%s%s", i ? "," : "", g->v[ids[i]].name);
        if (w < 0)
            break;
        len += (size_t)w;
    }
    if (len >= cap && cap > 4)
        memcpy(buf + cap - 4, "...", 4);
    return buf;
}

int tpk_orch_plan_check(const tpk_orch_cands *c, const tpk_orch_plan *p, tpk_ctx *ctx)
{
    if (c == NULL || p == NULL || (p->nkernels > 0 && p->kernels == NULL))
        return TPK_ERROR(ctx, TPK_EINVAL, "orch: no candidates or no plan to check");
    const tpk_orch_graph *g = c->g;
    unsigned char *avail = tpk_mem_calloc(TPK_ALLOCATOR_OF(ctx), (size_t)g->nvalues + 1, 1, NULL);
    if (avail == NULL)
        return TPK_ERROR(ctx, TPK_ENOMEM, "orch: out of memory checking a plan");
    int st = TPK_OK;
    double sum = 0;
    char buf[256];
    for (int i = 0; i < p->nkernels && !st; i++) {
        int k = p->kernels[i];
        if (k < 0 || k >= c->nk) {
            st = TPK_ERROR(ctx, TPK_EINVAL, "orch: plan kernel %d is candidate %d (of %d)", i, k,
                           c->nk);
            break;
        }
        const tpk_orch_kernel *K = &c->k[k];
        for (int j = 0; j < K->ninputs; j++)
            if (!g->v[K->inputs[j]].is_input && !avail[K->inputs[j]]) {
                st = TPK_ERROR(ctx, TPK_EINVAL,
                               "orch: plan kernel %d (candidate %d: %s) reads '%s', which no "
                               "earlier kernel writes",
                               i, k, names(g, K->prims, K->nprims, buf, sizeof buf),
                               g->v[K->inputs[j]].name);
                break;
            }
        for (int j = 0; j < K->noutputs; j++)
            avail[K->outputs[j]] = 1;
        sum += K->cost;
    }
    for (int v = 0; v < g->nvalues && !st; v++)
        if (g->v[v].is_output && !g->v[v].is_input && !avail[v])
            st = TPK_ERROR(ctx, TPK_EINVAL, "orch: no kernel of the plan writes output '%s'",
                           g->v[v].name);
    if (!st && !(sum == p->cost || fabs(sum - p->cost) <= PLAN_COST_RTOL * fabs(sum)))
        st = TPK_ERROR(ctx, TPK_EINVAL, "orch: the plan says cost %.17g, its kernels sum to %.17g",
                       p->cost, sum);
    tpk_mem_free(TPK_ALLOCATOR_OF(ctx), avail);
    return st;
}

tpk_orch_plan *tpk_orch_solve_naive(const tpk_orch_cands *c, tpk_ctx *ctx)
{
    if (c == NULL) {
        TPK_ERROR(ctx, TPK_EINVAL, "orch: no candidates");
        return NULL;
    }
    double t0 = tpk_wall_seconds();
    int *sel = tpk_mem_malloc(TPK_ALLOCATOR_OF(ctx), ((size_t)c->nlive + 1) * sizeof *sel, NULL);
    if (sel == NULL) {
        TPK_ERROR(ctx, TPK_ENOMEM, "orch: out of memory for a plan");
        return NULL;
    }
    for (int i = 0; i < c->nlive; i++) {
        int v = c->live[i], found = -1;
        /* the candidate {v} (a single primitive is its own sink: one variant) */
        for (int j = c->wr_start[v]; j < c->wr_start[v + 1] && found < 0; j++)
            if (c->k[c->wr[j]].nprims == 1)
                found = c->wr[j];
        if (found < 0 || !isfinite(c->k[found].cost)) {
            TPK_ERROR(ctx, TPK_ENOTFOUND, "orch: no buildable one-primitive kernel for '%s'%s",
                      c->g->v[v].name,
                      found < 0 ? "" : isnan(c->k[found].cost) ? " (not costed)" : "");
            tpk_mem_free(TPK_ALLOCATOR_OF(ctx), sel);
            return NULL;
        }
        sel[i] = found;
    }
    tpk_orch_plan *p = orch_plan_new(c, sel, c->nlive, ctx);
    tpk_mem_free(TPK_ALLOCATOR_OF(ctx), sel);
    if (p)
        p->seconds = tpk_wall_seconds() - t0;
    return p;
}

int tpk_orch_plan_write(FILE *f, const tpk_orch_cands *c, const tpk_orch_plan *p, tpk_ctx *ctx)
{
    if (f == NULL || c == NULL || p == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "orch: nothing to write");
    char a[512], b[512], o[512];
    for (int i = 0; i < p->nkernels; i++) {
        const tpk_orch_kernel *K = &c->k[p->kernels[i]];
        fprintf(f, "k%d cand=%d cost=%.6g prims={%s} in={%s} out={%s}\n", i, p->kernels[i],
                K->cost, names(c->g, K->prims, K->nprims, a, sizeof a),
                names(c->g, K->inputs, K->ninputs, b, sizeof b),
                names(c->g, K->outputs, K->noutputs, o, sizeof o));
    }
    if (fprintf(f, "total cost=%.9g kernels=%d solves=%d cuts=%d nodes=%ld seconds=%.3g\n",
                p->cost, p->nkernels, p->solves, p->cuts, p->nodes, p->seconds) < 0)
        return TPK_ERROR(ctx, TPK_EIO, "orch: cannot write the plan");
    return TPK_OK;
}
