/* The exhaustive solver (docs/orchestration.md §4), the BLP's test oracle: a shortest path over
 * the sets of primitive values in memory. It shares only the candidate set with the BLP, not its
 * constraints: a plan here is a sequence of kernels each run when its inputs are in memory. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "orch-impl.h"
#include "tpk/clock.h"

/* State M ⊆ live primitives (a bitmask): the values in memory. Running kernel k from M needs
 * in(k) ⊆ M and gives M ∪ out(k) ⊋ M, a larger integer, so one sweep over M in increasing
 * order relaxes every edge after its tail is final (a DAG; no Dijkstra needed). The cheapest
 * state containing every output is the optimum over executable plans; a kernel twice in a plan
 * never helps (costs are ≥ 0), so this is the optimum over sets of candidates too. */
tpk_orch_plan *tpk_orch_solve_exhaustive(const tpk_orch_cands *c, tpk_ctx *ctx)
{
    const tpk_allocator *al = TPK_ALLOCATOR_OF(ctx); /* the call's temporaries */
    if (c == NULL) {
        TPK_ERROR(ctx, TPK_EINVAL, "orch: no candidates");
        return NULL;
    }
    int P = c->nlive;
    if (P > TPK_ORCH_EXHAUSTIVE_MAX) {
        TPK_ERROR(ctx, TPK_EUNSUPPORTED,
                  "orch: the exhaustive solver takes at most %d primitives; the graph has %d",
                  TPK_ORCH_EXHAUSTIVE_MAX, P);
        return NULL;
    }
    for (int k = 0; k < c->nk; k++)
        if (isnan(c->k[k].cost)) {
            TPK_ERROR(ctx, TPK_EINVAL, "orch: candidate %d has no cost (tpk_orch_cands_cost)", k);
            return NULL;
        }
    double t0 = tpk_wall_seconds();
    size_t ns = (size_t)1 << P;
    double *dist = tpk_mem_malloc(al, ns * sizeof *dist, NULL);
    uint32_t *from = tpk_mem_malloc(al, ns * sizeof *from, NULL);
    int32_t *via = tpk_mem_malloc(al, ns * sizeof *via, NULL);
    uint32_t *in = tpk_mem_malloc(al, ((size_t)c->nk + 1) * sizeof *in, NULL);
    uint32_t *out = tpk_mem_malloc(al, ((size_t)c->nk + 1) * sizeof *out, NULL);
    int *kid = tpk_mem_malloc(al, ((size_t)c->nk + 1) * sizeof *kid, NULL);
    int *seq = tpk_mem_malloc(al, ((size_t)P + 1) * sizeof *seq, NULL);
    tpk_orch_plan *plan = NULL;
    if (!dist || !from || !via || !in || !out || !kid || !seq) {
        TPK_ERROR(ctx, TPK_ENOMEM, "orch: out of memory for 2^%d states", P);
        goto done;
    }
    int nk = 0;
    for (int k = 0; k < c->nk; k++) {
        const tpk_orch_kernel *K = &c->k[k];
        if (!isfinite(K->cost))
            continue;
        uint32_t a = 0, b = 0;
        for (int j = 0; j < K->ninputs; j++)
            if (c->live_of[K->inputs[j]] >= 0)
                a |= (uint32_t)1 << c->live_of[K->inputs[j]];
        for (int j = 0; j < K->noutputs; j++)
            b |= (uint32_t)1 << c->live_of[K->outputs[j]];
        in[nk] = a;
        out[nk] = b;
        kid[nk++] = k;
    }
    uint32_t goal = 0;
    for (int i = 0; i < P; i++)
        if (c->g->v[c->live[i]].is_output)
            goal |= (uint32_t)1 << i;
    for (size_t m = 0; m < ns; m++)
        dist[m] = INFINITY;
    dist[0] = 0;
    uint32_t best = 0;
    double bestd = INFINITY;
    for (size_t m = 0; m < ns; m++) {
        double d = dist[m];
        if (!isfinite(d))
            continue;
        uint32_t M = (uint32_t)m;
        if ((M & goal) == goal && d < bestd) {
            bestd = d;
            best = M;
            continue; /* nothing beyond a goal state is cheaper */
        }
        for (int j = 0; j < nk; j++) {
            if ((in[j] & ~M) || !(out[j] & ~M))
                continue;
            uint32_t T = M | out[j];
            double e = d + c->k[kid[j]].cost;
            if (e < dist[T]) {
                dist[T] = e;
                from[T] = M;
                via[T] = kid[j];
            }
        }
    }
    if (!isfinite(bestd)) {
        TPK_ERROR(ctx, TPK_ENOTFOUND,
                  "orch: no plan of buildable candidates computes every output (exhaustive "
                  "search over %d candidates)",
                  nk);
        goto done;
    }
    int n = 0;
    for (uint32_t M = best; M != 0; M = from[M])
        seq[n++] = via[M];
    for (int i = 0; i < n / 2; i++) {
        int t = seq[i];
        seq[i] = seq[n - 1 - i];
        seq[n - 1 - i] = t;
    }
    plan = orch_plan_new(c, seq, n, ctx);
    if (plan)
        plan->seconds = tpk_wall_seconds() - t0;
done:
    tpk_mem_free(al, dist);
    tpk_mem_free(al, from);
    tpk_mem_free(al, via);
    tpk_mem_free(al, in);
    tpk_mem_free(al, out);
    tpk_mem_free(al, kid);
    tpk_mem_free(al, seq);
    return plan;
}
