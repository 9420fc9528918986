/* The binary linear program of kernel orchestration (docs/orchestration.md §3; Korch §5) solved
 * by COIN-OR CBC through its C interface, with lazy cuts for the acyclicity that the BLP alone
 * does not ensure (§3.2). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <coin/Cbc_C_Interface.h>

#include "orch-impl.h"
#include "tpk/clock.h"

/* Costs go to CBC multiplied by BLP_SCALE_REF / R (R: solve_blp), so that the optimum is at
 * least BLP_SCALE_REF / P in CBC's units. CBC's tolerances are absolute: reduced costs to 1e-7,
 * a new incumbent must beat the old by the cutoff increment, the search stops at the absolute
 * gap. At costs of order 1 (a max-cost scaling) plans 1e-7 apart came back as equal and the
 * default increment (1e-5) lost optima by 1e-5 relative; here all three are ≤ P·1e-12 of the
 * optimum, below the 1e-9 agreement with the exhaustive solver that tests/test_orch.c asks. */
#define BLP_SCALE_REF 1e6
#define BLP_INCREMENT "1e-6"
#define BLP_ABS_GAP 1e-6
/* A binary variable above this is 1 (CBC's integer tolerance is 1e-6). */
#define BLP_ONE 0.5

/* One acyclicity cut: Σ_{r ∈ T} x_r − Σ_{k ∈ P} x_k ≤ |T| − 1 (orchestration.md §3.2). */
typedef struct blp_cut {
    int nt, np;
    int *idx; /* T then P, candidate indices */
} blp_cut;

typedef struct blp_state {
    const tpk_orch_cands *c;
    const tpk_orch_opts *o;
    int nx;      /* binary columns: candidates of finite cost */
    int *xk;     /* column → candidate */
    int *colof;  /* candidate → column or −1 */
    double scale;
    int ncut, capcut;
    blp_cut *cut;
} blp_state;

int orch_cbc_outcome(int status, int secondary, int infeasible, int optimal, int has_solution,
                     int ncands, tpk_ctx *ctx)
{
    if (infeasible)
        return TPK_ERROR(ctx, TPK_ENOTFOUND,
                         "orch: no selection of the %d buildable candidates computes every output "
                         "(CBC proved the BLP infeasible)",
                         ncands);
    if (status == 0 && optimal && has_solution)
        return TPK_OK;
    static const char *const why[] = {"search completed",
                                      "linear relaxation infeasible",
                                      "stopped on the gap",
                                      "stopped on the node limit (max_nodes)",
                                      "stopped on the time limit (max_seconds)",
                                      "stopped by an event",
                                      "stopped on the solution limit",
                                      "linear relaxation unbounded",
                                      "stopped on the iteration limit"};
    const char *w = secondary >= 0 && secondary <= 8 ? why[secondary] : "no secondary status";
    if (status == 2)
        return TPK_ERROR(ctx, TPK_ENUMERIC,
                         "orch: CBC abandoned the BLP (numerical difficulties; %s)", w);
    return TPK_ERROR(ctx, TPK_ENUMERIC,
                     "orch: CBC did not prove an optimum of the BLP (status %d: %s; %s)", status,
                     w, has_solution ? "a feasible plan was found" : "no feasible plan found");
}

/* Triplets (row, col, value) collected row by row, turned into CBC's column-major arrays. */
typedef struct trip {
    int n, cap;
    int *r, *c;
    double *v;
    const tpk_allocator *al; /* the call's */
} trip;

static int trip_add(trip *t, int r, int c, double v)
{
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 1024;
        int *r2 = tpk_mem_realloc(t->al, t->r, (size_t)cap * sizeof *r2, NULL);
        if (r2)
            t->r = r2;
        int *c2 = tpk_mem_realloc(t->al, t->c, (size_t)cap * sizeof *c2, NULL);
        if (c2)
            t->c = c2;
        double *v2 = tpk_mem_realloc(t->al, t->v, (size_t)cap * sizeof *v2, NULL);
        if (v2)
            t->v = v2;
        if (!r2 || !c2 || !v2)
            return -1;
        t->cap = cap;
    }
    t->r[t->n] = r;
    t->c[t->n] = c;
    t->v[t->n] = v;
    t->n++;
    return 0;
}

/* Builds the model: columns x (binary, one per buildable candidate) then a (continuous, one per
 * live primitive: "the value is in memory"); rows as in orchestration.md §3.1 plus the cuts. */
static Cbc_Model *build_model(const blp_state *s, tpk_ctx *ctx)
{
    const tpk_allocator *al = TPK_ALLOCATOR_OF(ctx); /* the call's temporaries */
    const tpk_orch_cands *c = s->c;
    int P = c->nlive, ncol = s->nx + P;
    trip t = {.al = al};
    int nrow = 0, bad = 0;
    double *rlo = NULL, *rhi = NULL;
    int nrow_max = 0;
    /* rows: P (written) + P (computed) + Σ primitive inputs (read) + cuts */
    nrow_max = 2 * P + s->ncut;
    for (int j = 0; j < s->nx; j++)
        nrow_max += c->k[s->xk[j]].ninputs;
    rlo = tpk_mem_malloc(al, ((size_t)nrow_max + 1) * sizeof *rlo, NULL);
    rhi = tpk_mem_malloc(al, ((size_t)nrow_max + 1) * sizeof *rhi, NULL);
    if (!rlo || !rhi)
        bad = 1;
    /* written(v): Σ_{k writes v} x_k − a_v ≥ 0 */
    for (int i = 0; i < P && !bad; i++) {
        int v = c->live[i];
        for (int j = c->wr_start[v]; j < c->wr_start[v + 1] && !bad; j++)
            if (s->colof[c->wr[j]] >= 0)
                bad |= trip_add(&t, nrow, s->colof[c->wr[j]], 1.0);
        bad |= trip_add(&t, nrow, s->nx + i, -1.0);
        rlo[nrow] = 0;
        rhi[nrow++] = DBL_MAX;
    }
    /* read(k, v): a_v − x_k ≥ 0 for every primitive input v of k */
    for (int j = 0; j < s->nx && !bad; j++) {
        const tpk_orch_kernel *K = &c->k[s->xk[j]];
        for (int q = 0; q < K->ninputs && !bad; q++) {
            int lv = c->live_of[K->inputs[q]];
            if (lv < 0)
                continue; /* a graph input */
            bad |= trip_add(&t, nrow, s->nx + lv, 1.0);
            bad |= trip_add(&t, nrow, j, -1.0);
            rlo[nrow] = 0;
            rhi[nrow++] = DBL_MAX;
        }
    }
    if (!bad) {
        /* computed(p): Σ_{k ∋ p} x_k ≥ 1. Implied for integer x (a plan computes every value an
         * output depends on), not for the LP: it closes most of the root gap (§3.1). */
        int r0 = nrow;
        for (int i = 0; i < P; i++) {
            rlo[nrow] = 1;
            rhi[nrow++] = DBL_MAX;
        }
        for (int j = 0; j < s->nx && !bad; j++) {
            const tpk_orch_kernel *K = &c->k[s->xk[j]];
            for (int q = 0; q < K->nprims && !bad; q++)
                bad |= trip_add(&t, r0 + c->live_of[K->prims[q]], j, 1.0);
        }
    }
    for (int q = 0; q < s->ncut && !bad; q++) {
        const blp_cut *cu = &s->cut[q];
        for (int i = 0; i < cu->nt + cu->np && !bad; i++)
            bad |= trip_add(&t, nrow, s->colof[cu->idx[i]], i < cu->nt ? 1.0 : -1.0);
        rlo[nrow] = -DBL_MAX;
        rhi[nrow++] = cu->nt - 1;
    }
    CoinBigIndex *start = tpk_mem_calloc(al, (size_t)ncol + 1, sizeof *start, NULL);
    int *index = tpk_mem_malloc(al, ((size_t)t.n + 1) * sizeof *index, NULL);
    double *value = tpk_mem_malloc(al, ((size_t)t.n + 1) * sizeof *value, NULL);
    double *clo = tpk_mem_malloc(al, ((size_t)ncol + 1) * sizeof *clo, NULL);
    double *chi = tpk_mem_malloc(al, ((size_t)ncol + 1) * sizeof *chi, NULL);
    double *obj = tpk_mem_malloc(al, ((size_t)ncol + 1) * sizeof *obj, NULL);
    Cbc_Model *m = NULL;
    if (bad || !start || !index || !value || !clo || !chi || !obj) {
        TPK_ERROR(ctx, TPK_ENOMEM, "orch: out of memory building the BLP (%d columns)", ncol);
        goto done;
    }
    for (int e = 0; e < t.n; e++)
        start[t.c[e] + 1]++;
    for (int j = 0; j < ncol; j++)
        start[j + 1] += start[j];
    {
        CoinBigIndex *fill = tpk_mem_malloc(al, ((size_t)ncol + 1) * sizeof *fill, NULL);
        if (fill == NULL) {
            TPK_ERROR(ctx, TPK_ENOMEM, "orch: out of memory building the BLP");
            goto done;
        }
        memcpy(fill, start, ((size_t)ncol + 1) * sizeof *fill);
        for (int e = 0; e < t.n; e++) {
            CoinBigIndex at = fill[t.c[e]]++;
            index[at] = t.r[e];
            value[at] = t.v[e];
        }
        tpk_mem_free(al, fill);
    }
    for (int j = 0; j < s->nx; j++) {
        clo[j] = 0;
        chi[j] = 1;
        obj[j] = c->k[s->xk[j]].cost / s->scale;
    }
    for (int i = 0; i < P; i++) {
        clo[s->nx + i] = c->g->v[c->live[i]].is_output ? 1 : 0; /* outputs must be in memory */
        chi[s->nx + i] = 1;
        obj[s->nx + i] = 0;
    }
    m = Cbc_newModel();
    if (m == NULL) {
        TPK_ERROR(ctx, TPK_ENOMEM, "orch: CBC could not create a model");
        goto done;
    }
    Cbc_loadProblem(m, ncol, nrow, start, index, value, clo, chi, obj, rlo, rhi);
    for (int j = 0; j < s->nx; j++)
        Cbc_setInteger(m, j);
    Cbc_setObjSense(m, 1.0);
    Cbc_setLogLevel(m, 0);
    Cbc_setAllowableGap(m, BLP_ABS_GAP);
    Cbc_setAllowableFractionGap(m, 0.0);
    Cbc_setParameter(m, "increment", BLP_INCREMENT);
    /* With the computed(p) rows the root LP is close to the optimum (22 branch-and-bound nodes
     * over 50 random 14-primitive graphs), and CBC's cut generators and heuristics only cost
     * time: 10 ms of CPU a solve on average without them, 50 ms with (root probing above all). */
    Cbc_setParameter(m, "cuts", "off");
    Cbc_setParameter(m, "heur", "off");
    if (s->o->cbc_args != NULL && *s->o->cbc_args) {
        char buf[512];
        snprintf(buf, sizeof buf, "%s", s->o->cbc_args);
        char *save = NULL;
        for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            char *eq = strchr(tok, '=');
            if (eq) {
                *eq = '\0';
                Cbc_setParameter(m, tok, eq + 1);
            }
        }
    }
    if (s->o->max_seconds > 0)
        Cbc_setMaximumSeconds(m, s->o->max_seconds);
    if (s->o->max_nodes > 0)
        Cbc_setMaximumNodes(m, s->o->max_nodes);
done:
    tpk_mem_free(t.al, t.r);
    tpk_mem_free(t.al, t.c);
    tpk_mem_free(t.al, t.v);
    tpk_mem_free(al, rlo);
    tpk_mem_free(al, rhi);
    tpk_mem_free(al, start);
    tpk_mem_free(al, index);
    tpk_mem_free(al, value);
    tpk_mem_free(al, clo);
    tpk_mem_free(al, chi);
    tpk_mem_free(al, obj);
    return m;
}

/* The cut of orchestration.md §3.2 from a selection whose kernels `stuck` cannot be placed after
 * the placed ones: shrink the stuck set to a minimal T in which every kernel has a "blocked"
 * input (a primitive that only kernels of T, among the selected, write); then any executable
 * plan containing T runs some first kernel of T earlier than the rest, so a kernel outside the
 * selection writes one of T's blocked inputs: Σ_T x − Σ_{k ∉ T writes a blocked input} x ≤ |T|−1.
 * The current selection violates it (its left side is |T|). */
/* Is v blocked for T: a primitive that no selected kernel outside T writes? */
static int blocked(const tpk_orch_cands *c, int v, const unsigned char *selected,
                   const unsigned char *inT)
{
    if (c->g->v[v].is_input)
        return 0;
    for (int j = c->wr_start[v]; j < c->wr_start[v + 1]; j++)
        if (selected[c->wr[j]] && !inT[c->wr[j]])
            return 0;
    return 1;
}

static int add_cut(blp_state *s, const unsigned char *selected, const int *stuck, int nstuck,
                   tpk_ctx *ctx)
{
    const tpk_allocator *al = TPK_ALLOCATOR_OF(ctx); /* the call's temporaries */
    const tpk_orch_cands *c = s->c;
    int nk = c->nk, nv = c->g->nvalues;
    unsigned char *inT = tpk_mem_calloc(al, (size_t)nk + 1, 1, NULL);
    unsigned char *blk = tpk_mem_calloc(al, (size_t)nv + 1, 1, NULL);
    unsigned char *inP = tpk_mem_calloc(al, (size_t)nk + 1, 1, NULL);
    int *T = tpk_mem_malloc(al, ((size_t)nstuck + 1) * sizeof *T, NULL);
    int st = TPK_OK;
    if (!inT || !blk || !inP || !T) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "orch: out of memory for an acyclicity cut");
        goto done;
    }
    for (int i = 0; i < nstuck; i++)
        inT[stuck[i]] = 1;
    /* Drop kernels one at a time while the rest stays closed (each keeps a blocked input, after
     * dropping those that lose theirs). */
    for (int i = 0; i < nstuck; i++) {
        int r = stuck[i];
        if (!inT[r])
            continue;
        unsigned char *save = tpk_mem_malloc(al, (size_t)nk + 1, NULL);
        if (save == NULL) {
            st = TPK_ERROR(ctx, TPK_ENOMEM, "orch: out of memory for an acyclicity cut");
            goto done;
        }
        memcpy(save, inT, (size_t)nk);
        inT[r] = 0;
        int left = 0;
        for (int changed = 1; changed;) {
            changed = 0;
            left = 0;
            for (int q = 0; q < nstuck; q++) {
                int k = stuck[q];
                if (!inT[k])
                    continue;
                int has = 0;
                for (int j = 0; j < c->k[k].ninputs && !has; j++)
                    has = blocked(c, c->k[k].inputs[j], selected, inT);
                if (!has) {
                    inT[k] = 0;
                    changed = 1;
                } else
                    left++;
            }
        }
        if (left == 0)
            memcpy(inT, save, (size_t)nk); /* r is needed */
        tpk_mem_free(al, save);
    }
    int nt = 0, np = 0;
    for (int i = 0; i < nstuck; i++)
        if (inT[stuck[i]]) {
            T[nt++] = stuck[i];
            const tpk_orch_kernel *K = &c->k[stuck[i]];
            for (int j = 0; j < K->ninputs; j++)
                if (blocked(c, K->inputs[j], selected, inT))
                    blk[K->inputs[j]] = 1;
        }
    for (int v = 0; v < nv; v++)
        if (blk[v])
            for (int j = c->wr_start[v]; j < c->wr_start[v + 1]; j++) {
                int k = c->wr[j];
                if (!inT[k] && !inP[k] && s->colof[k] >= 0) {
                    inP[k] = 1;
                    np++;
                }
            }
    if (s->ncut == s->capcut) {
        int cap = s->capcut ? 2 * s->capcut : 16;
        blp_cut *q = tpk_mem_realloc(al, s->cut, (size_t)cap * sizeof *q, NULL);
        if (q == NULL) {
            st = TPK_ERROR(ctx, TPK_ENOMEM, "orch: out of memory for an acyclicity cut");
            goto done;
        }
        s->cut = q;
        s->capcut = cap;
    }
    blp_cut *cu = &s->cut[s->ncut];
    cu->idx = tpk_mem_malloc(al, ((size_t)nt + (size_t)np + 1) * sizeof *cu->idx, NULL);
    if (cu->idx == NULL) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "orch: out of memory for an acyclicity cut");
        goto done;
    }
    cu->nt = nt;
    cu->np = np;
    memcpy(cu->idx, T, (size_t)nt * sizeof *T);
    for (int k = 0, q = nt; k < nk; k++)
        if (inP[k])
            cu->idx[q++] = k;
    s->ncut++;
done:
    tpk_mem_free(al, inT);
    tpk_mem_free(al, blk);
    tpk_mem_free(al, inP);
    tpk_mem_free(al, T);
    return st;
}

tpk_orch_plan *tpk_orch_solve_blp(const tpk_orch_cands *c, const tpk_orch_opts *o, tpk_ctx *ctx)
{
    const tpk_allocator *al = TPK_ALLOCATOR_OF(ctx); /* the call's temporaries */
    if (c == NULL) {
        TPK_ERROR(ctx, TPK_EINVAL, "orch: no candidates");
        return NULL;
    }
    tpk_orch_opts dflt;
    if (o == NULL) {
        tpk_orch_opts_default(&dflt);
        o = &dflt;
    }
    if (o->max_rounds < 1 || !(o->max_seconds >= 0) || o->max_nodes < 0) {
        TPK_ERROR(ctx, TPK_EINVAL, "orch: max_rounds %d (>= 1), max_seconds %g, max_nodes %d",
                  o->max_rounds, o->max_seconds, o->max_nodes);
        return NULL;
    }
    double t0 = tpk_wall_seconds();
    blp_state s;
    memset(&s, 0, sizeof s);
    s.c = c;
    s.o = o;
    s.scale = 1;
    tpk_orch_plan *plan = NULL;
    s.xk = tpk_mem_malloc(al, ((size_t)c->nk + 1) * sizeof *s.xk, NULL);
    s.colof = tpk_mem_malloc(al, ((size_t)c->nk + 1) * sizeof *s.colof, NULL);
    int *sel = tpk_mem_malloc(al, ((size_t)c->nk + 1) * sizeof *sel, NULL);
    int *order = tpk_mem_malloc(al, ((size_t)c->nk + 1) * sizeof *order, NULL);
    int *stuck = tpk_mem_malloc(al, ((size_t)c->nk + 1) * sizeof *stuck, NULL);
    unsigned char *selected = tpk_mem_calloc(al, (size_t)c->nk + 1, 1, NULL);
    if (!s.xk || !s.colof || !sel || !order || !stuck || !selected) {
        TPK_ERROR(ctx, TPK_ENOMEM, "orch: out of memory for the BLP of %d candidates", c->nk);
        goto done;
    }
    for (int k = 0; k < c->nk; k++) {
        double w = c->k[k].cost;
        if (isnan(w)) {
            TPK_ERROR(ctx, TPK_EINVAL, "orch: candidate %d has no cost (tpk_orch_cands_cost)", k);
            goto done;
        }
        s.colof[k] = -1;
        if (isfinite(w)) {
            s.colof[k] = s.nx;
            s.xk[s.nx++] = k;
        }
    }
    if (c->nlive == 0) { /* every output is a graph input: nothing to run */
        plan = orch_plan_new(c, sel, 0, ctx);
        goto done;
    }
    {
        /* CBC's tolerances are absolute: costs go in units of R / BLP_SCALE_REF, R = Σ_p the
         * cheapest kernel holding p. opt ≥ R / P (every live p is computed by a chosen kernel),
         * so the optimum is ≥ BLP_SCALE_REF / P in CBC's units. */
        double *minc = tpk_mem_malloc(al, ((size_t)c->nlive + 1) * sizeof *minc, NULL), R = 0;
        if (minc == NULL) {
            TPK_ERROR(ctx, TPK_ENOMEM, "orch: out of memory for the BLP");
            goto done;
        }
        for (int i = 0; i < c->nlive; i++)
            minc[i] = INFINITY;
        for (int j = 0; j < s.nx; j++) {
            const tpk_orch_kernel *K = &c->k[s.xk[j]];
            for (int q = 0; q < K->nprims; q++)
                if (K->cost < minc[c->live_of[K->prims[q]]])
                    minc[c->live_of[K->prims[q]]] = K->cost;
        }
        for (int i = 0; i < c->nlive; i++)
            if (isfinite(minc[i]))
                R += minc[i];
        tpk_mem_free(al, minc);
        s.scale = R / BLP_SCALE_REF;
        if (!(s.scale > 0))
            s.scale = 1;
    }
    long nodes = 0;
    int rounds = 0;
    for (;;) {
        if (rounds == o->max_rounds) {
            TPK_ERROR(ctx, TPK_ENUMERIC,
                      "orch: every optimum of the BLP still had no executable order after %d "
                      "solves with %d acyclicity cuts (max_rounds)",
                      rounds, s.ncut);
            goto done;
        }
        Cbc_Model *m = build_model(&s, ctx);
        if (m == NULL)
            goto done;
        Cbc_solve(m);
        rounds++;
        nodes += Cbc_getNodeCount(m);
        const double *x = Cbc_bestSolution(m);
        int st = orch_cbc_outcome(Cbc_status(m), Cbc_secondaryStatus(m),
                                  Cbc_isProvenInfeasible(m), Cbc_isProvenOptimal(m), x != NULL,
                                  s.nx, ctx);
        int n = 0;
        if (!st)
            for (int j = 0; j < s.nx; j++)
                if (x[j] > BLP_ONE)
                    sel[n++] = s.xk[j];
        Cbc_deleteModel(m);
        if (st)
            goto done;
        int placed = 0, nstuck = 0;
        int ok = orch_order(c, sel, n, order, &placed, stuck, &nstuck, al);
        if (ok < 0) {
            TPK_ERROR(ctx, TPK_ENOMEM, "orch: out of memory ordering a plan");
            goto done;
        }
        if (ok) {
            plan = orch_plan_new(c, order, placed, ctx);
            break;
        }
        if (nstuck == 0) { /* the rows forbid this; CBC's tolerances would be to blame */
            TPK_ERROR(ctx, TPK_ENUMERIC,
                      "orch: CBC's solution (%d kernels) leaves an output unwritten", n);
            goto done;
        }
        memset(selected, 0, (size_t)c->nk);
        for (int i = 0; i < n; i++)
            selected[sel[i]] = 1;
        if (add_cut(&s, selected, stuck, nstuck, ctx))
            goto done;
    }
    if (plan) {
        plan->solves = rounds;
        plan->cuts = s.ncut;
        plan->nodes = nodes;
        plan->seconds = tpk_wall_seconds() - t0;
    }
done:
    for (int q = 0; q < s.ncut; q++)
        tpk_mem_free(al, s.cut[q].idx);
    tpk_mem_free(al, s.cut);
    tpk_mem_free(al, s.xk);
    tpk_mem_free(al, s.colof);
    tpk_mem_free(al, sel);
    tpk_mem_free(al, order);
    tpk_mem_free(al, stuck);
    tpk_mem_free(al, selected);
    return plan;
}
