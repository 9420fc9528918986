/* Kernel orchestration (orch/, docs/orchestration.md): the candidate enumerator against a
 * brute-force walk over every subset of primitives, the BLP solved by CBC against the exhaustive
 * solver on 100 random DAGs of up to 14 primitives (optimal costs equal, plans executable),
 * hand-made graphs (a chain fused whole, a diamond where recomputation wins, the GEMM limit
 * forcing a split, a kernel-level cycle that the acyclicity cuts remove), and every error path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tpk/clock.h"
#include "tpk/orch.h"
#include "../orch/orch-impl.h"

/* The BLP's optimum against the exhaustive solver's: both sum the same candidate costs, CBC to
 * its tightened gap (orch/blp.c), so they agree far below this (issue 20: 1e-9 relative). */
#define COST_RTOL 1e-9
enum { N_RANDOM = 100, MAX_PRIMS = 14 };

/* A machine for the roofline model with fusion worth having: 3.7 µs a launch, 21.3 GB/s,
 * 89 GFLOP/s. */
static const tpk_orch_roofline ROOF = {3.7e-6, 2.13e10, 8.9e10};

/* ---- helpers ------------------------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s)
{
    /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static unsigned rnd(uint64_t *s, unsigned n)
{
    return (unsigned)(rng_next(s) % n);
}

static tpk_orch_shape shape2(size_t r, size_t c)
{
    tpk_orch_shape s = {2, {r, c, 0, 0}, 8};
    return s;
}

static tpk_orch_shape shape1(size_t n)
{
    tpk_orch_shape s = {1, {n, 0, 0, 0}, 8};
    return s;
}

static size_t elems(const tpk_orch_shape *s)
{
    size_t e = 1;
    for (int i = 0; i < s->rank; i++)
        e *= s->dims[i];
    return e;
}

static int add_input(tpk_orch_graph *g, const char *name, tpk_orch_shape s)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    int id = -1;
    assert_int_equal(tpk_orch_graph_add_input(g, name, &s, &id, &ctx), TPK_OK);
    return id;
}

static int add_prim(tpk_orch_graph *g, const char *name, int kind, tpk_orch_shape s, double flops,
                    int a0, int a1)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    int args[2] = {a0, a1}, id = -1;
    assert_int_equal(
        tpk_orch_graph_add_prim(g, name, kind, &s, flops, a1 < 0 ? 1 : 2, args, &id, &ctx), TPK_OK);
    return id;
}

static void set_output(tpk_orch_graph *g, int id)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_orch_graph_set_output(g, id, &ctx), TPK_OK);
}

/* A random DAG of n primitives over 1–3 inputs: kinds in Korch's mix (about one in five
 * linear), 1–2 arguments biased to recent values, shapes that follow the kind, outputs = every
 * sink plus about one in seven of the others. */
static tpk_orch_graph *random_dag(uint64_t seed, int n)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_orch_graph *g = tpk_orch_graph_alloc(&ctx);
    assert_non_null(g);
    uint64_t s = seed;
    static const size_t NS[3] = {96, 160, 224};
    int nin = 1 + (int)rnd(&s, 3);
    for (int i = 0; i < nin; i++) {
        char nm[16];
        snprintf(nm, sizeof nm, "x%d", i);
        size_t a = NS[rnd(&s, 3)], b = NS[rnd(&s, 3)];
        add_input(g, nm, rnd(&s, 4) ? shape2(a, b) : shape1(a));
    }
    int used[64] = {0};
    for (int p = 0; p < n; p++) {
        int nv = tpk_orch_graph_nvalues(g);
        unsigned r = rnd(&s, 100);
        int kind = r < 21 ? TPK_ORCH_LINEAR : r < 52 ? TPK_ORCH_MAP : r < 70 ? TPK_ORCH_REDUCE
                                          : r < 85 ? TPK_ORCH_BROADCAST : TPK_ORCH_LAYOUT;
        int a0 = rnd(&s, 3) ? nv - 1 - (int)rnd(&s, (unsigned)(nv < 4 ? nv : 4))
                            : (int)rnd(&s, (unsigned)nv);
        int a1 = -1;
        if (kind == TPK_ORCH_LINEAR || rnd(&s, 3) == 0) {
            a1 = (int)rnd(&s, (unsigned)nv);
            if (a1 == a0 && kind != TPK_ORCH_LINEAR)
                a1 = -1;
        }
        const tpk_orch_shape *in0 = &tpk_orch_graph_value(g, a0)->shape;
        tpk_orch_shape out = *in0;
        size_t e0 = elems(in0);
        double flops = 0;
        switch (kind) {
        case TPK_ORCH_LINEAR: {
            size_t m = in0->rank ? in0->dims[0] : 1, k = e0 / (m ? m : 1);
            size_t nn = NS[rnd(&s, 3)];
            out = shape2(m, nn);
            flops = 2.0 * (double)m * (double)nn * (double)k;
            break;
        }
        case TPK_ORCH_MAP:
            flops = 3.0 * (double)e0;
            break;
        case TPK_ORCH_REDUCE:
            if (out.rank > 0)
                out.rank--;
            flops = (double)e0;
            break;
        case TPK_ORCH_BROADCAST:
            if (out.rank < 3)
                out.dims[out.rank++] = NS[rnd(&s, 3)] / 8;
            break;
        default: /* layout: a transpose */
            for (int i = 0; i < out.rank / 2; i++) {
                size_t t = out.dims[i];
                out.dims[i] = out.dims[out.rank - 1 - i];
                out.dims[out.rank - 1 - i] = t;
            }
            break;
        }
        char nm[16];
        snprintf(nm, sizeof nm, "p%d", p);
        add_prim(g, nm, kind, out, flops, a0, a1);
        used[a0] = 1;
        if (a1 >= 0)
            used[a1] = 1;
    }
    int nv = tpk_orch_graph_nvalues(g);
    for (int v = nin; v < nv; v++)
        if (!used[v] || rnd(&s, 7) == 0)
            set_output(g, v);
    return g;
}

static tpk_orch_cands *cands_of(const tpk_orch_graph *g, const tpk_orch_opts *o)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_orch_cands *c = tpk_orch_cands_alloc(g, o, &ctx);
    if (c == NULL)
        fail_msg("%s", ctx.msg);
    return c;
}

static void cost_roofline(tpk_orch_cands *c)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_orch_roofline r = ROOF;
    if (tpk_orch_cands_cost(c, tpk_orch_cost_roofline, &r, &ctx))
        fail_msg("%s", ctx.msg);
}

static tpk_orch_plan *solve_blp(const tpk_orch_cands *c, const tpk_orch_opts *o)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_orch_plan *p = tpk_orch_solve_blp(c, o, &ctx);
    if (p == NULL)
        fail_msg("BLP: %s", ctx.msg);
    if (tpk_orch_plan_check(c, p, &ctx))
        fail_msg("BLP plan: %s", ctx.msg);
    return p;
}

static tpk_orch_plan *solve_exhaustive(const tpk_orch_cands *c)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_orch_plan *p = tpk_orch_solve_exhaustive(c, &ctx);
    if (p == NULL)
        fail_msg("exhaustive: %s", ctx.msg);
    if (tpk_orch_plan_check(c, p, &ctx))
        fail_msg("exhaustive plan: %s", ctx.msg);
    return p;
}

static int has(const int *a, int n, int v)
{
    for (int i = 0; i < n; i++)
        if (a[i] == v)
            return 1;
    return 0;
}

static void assert_msg(const tpk_ctx *ctx, const char *part)
{
    if (strstr(ctx->msg, part) == NULL)
        fail_msg("message '%s' lacks '%s'", ctx->msg, part);
}

/* ---- the enumerator against brute force ---------------------------------------------------- */

/* Every subset of the live primitives, kept when weakly connected, convex (no outside value
 * both reachable from it and reaching it), within the size and linear limits: the sets the
 * enumerator must produce, each once, with the inputs and written values of §2. */
static void check_enumeration(const tpk_orch_graph *g, const tpk_orch_opts *o)
{
    tpk_orch_cands *c = cands_of(g, o);
    int nv = tpk_orch_graph_nvalues(g);
    assert_true(nv <= 64);
    uint64_t succ[64] = {0}, reach[64] = {0}, live = 0, outm = 0;
    for (int v = 0; v < nv; v++) {
        const tpk_orch_value *x = tpk_orch_graph_value(g, v);
        for (int a = 0; a < x->nargs; a++)
            succ[x->args[a]] |= 1ull << v;
        if (x->is_output && !x->is_input)
            outm |= 1ull << v;
    }
    for (int v = nv - 1; v >= 0; v--) {
        reach[v] = succ[v];
        for (int w = 0; w < nv; w++)
            if (succ[v] >> w & 1)
                reach[v] |= reach[w];
        const tpk_orch_value *x = tpk_orch_graph_value(g, v);
        if (!x->is_input && ((outm >> v & 1) || (succ[v] & live)))
            live |= 1ull << v;
    }
    int lv[64], P = 0;
    for (int v = 0; v < nv; v++)
        if (live >> v & 1)
            lv[P++] = v;
    /* sets from the enumerator, with variants counted */
    int nk = tpk_orch_cands_count(c);
    uint64_t *got = malloc(((size_t)nk + 1) * sizeof *got);
    int ngot = 0;
    for (int i = 0; i < nk; i++) {
        const tpk_orch_kernel *k = tpk_orch_cands_get(c, i);
        uint64_t m = 0, inm = 0, wm = 0;
        for (int j = 0; j < k->nprims; j++)
            m |= 1ull << k->prims[j];
        for (int j = 0; j < k->ninputs; j++)
            inm |= 1ull << k->inputs[j];
        for (int j = 0; j < k->noutputs; j++)
            wm |= 1ull << k->outputs[j];
        /* inputs: exactly the arguments from outside */
        uint64_t want_in = 0, must = 0, opt = 0;
        for (int j = 0; j < k->nprims; j++) {
            const tpk_orch_value *x = tpk_orch_graph_value(g, k->prims[j]);
            for (int a = 0; a < x->nargs; a++)
                if (!(m >> x->args[a] & 1))
                    want_in |= 1ull << x->args[a];
            uint64_t s = succ[k->prims[j]] & live;
            if (!(s & m) || (outm >> k->prims[j] & 1))
                must |= 1ull << k->prims[j];
            else if (s & ~m)
                opt |= 1ull << k->prims[j];
        }
        assert_true(inm == want_in);
        assert_true((wm & must) == must);
        assert_true((wm & ~(must | opt)) == 0);
        int seen = 0;
        for (int q = 0; q < ngot; q++)
            seen |= got[q] == m;
        if (!seen) {
            got[ngot++] = m;
            /* its variants: 2^|opt| when few, else 2 */
            int nopt = __builtin_popcountll(opt), nvar = 0;
            for (int q = 0; q < nk; q++) {
                const tpk_orch_kernel *kq = tpk_orch_cands_get(c, q);
                uint64_t mq = 0;
                for (int j = 0; j < kq->nprims; j++)
                    mq |= 1ull << kq->prims[j];
                nvar += mq == m;
            }
            assert_int_equal(nvar, nopt <= o->max_extra_outputs ? 1 << nopt : 2);
        }
    }
    int want = 0;
    for (uint64_t sub = 1; sub < (1ull << P); sub++) {
        int size = __builtin_popcountll(sub), nlin = 0;
        if (size > o->max_size)
            continue;
        uint64_t m = 0;
        for (int i = 0; i < P; i++)
            if (sub >> i & 1) {
                m |= 1ull << lv[i];
                nlin += tpk_orch_graph_value(g, lv[i])->kind == TPK_ORCH_LINEAR;
            }
        if (nlin > o->max_linear)
            continue;
        /* connected: grow from the lowest along edges either way inside m */
        uint64_t comp = m & (~m + 1);
        for (uint64_t prev = 0; prev != comp;) {
            prev = comp;
            for (int v = 0; v < nv; v++)
                if (comp >> v & 1) {
                    comp |= succ[v] & m;
                    for (int w = 0; w < nv; w++)
                        if ((m >> w & 1) && (succ[w] >> v & 1))
                            comp |= 1ull << w;
                }
        }
        if (comp != m)
            continue;
        uint64_t below = 0, above = 0;
        for (int v = 0; v < nv; v++) {
            if (m >> v & 1)
                below |= reach[v];
            if (reach[v] & m)
                above |= 1ull << v;
        }
        if (below & above & ~m)
            continue;
        want++;
        int found = 0;
        for (int q = 0; q < ngot && !found; q++)
            found = got[q] == m;
        if (!found)
            fail_msg("convex connected set %#llx missing from the candidates",
                     (unsigned long long)m);
    }
    assert_int_equal(ngot, want);
    free(got);
    tpk_orch_cands_free(c);
}

static void test_enumeration_matches_brute_force(void **state)
{
    (void)state;
    tpk_orch_opts o;
    tpk_orch_opts_default(&o);
    for (uint64_t seed = 1; seed <= 30; seed++) {
        tpk_orch_graph *g = random_dag(0x5eed0000u + seed, 6 + (int)(seed % 9));
        o.max_size = seed % 3 == 0 ? 3 : 8;
        o.max_linear = (int)(seed % 4 == 0 ? 2 : 1);
        o.max_extra_outputs = (int)(seed % 5);
        check_enumeration(g, &o);
        tpk_orch_graph_free(g);
    }
}

/* ---- the BLP against the exhaustive solver ------------------------------------------------ */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void test_blp_equals_exhaustive(void **state)
{
    (void)state;
    double t14[N_RANDOM], cpu14[N_RANDOM];
    int n14 = 0, cuts = 0, solves = 0, fused = 0, recompute = 0, ncand_max = 0;
    long ncand_sum = 0, nodes14 = 0;
    double relmax = 0;
    for (int i = 0; i < N_RANDOM; i++) {
        uint64_t seed = 0x0c0ffee0u + (uint64_t)i * 7919u;
        int n = i % 2 == 0 ? MAX_PRIMS : 5 + (i / 2) % 9;
        tpk_orch_graph *g = random_dag(seed, n);
        tpk_orch_cands *c = cands_of(g, NULL);
        cost_roofline(c);
        clock_t c0 = clock();
        tpk_orch_plan *b = solve_blp(c, NULL);
        double cpu = (double)(clock() - c0) / CLOCKS_PER_SEC;
        tpk_orch_plan *e = solve_exhaustive(c);
        double rel = fabs(b->cost - e->cost) / fmax(fabs(e->cost), 1e-300);
        if (!(rel <= COST_RTOL))
            fail_msg("DAG %d (seed %#llx, %d primitives): BLP %.17g, exhaustive %.17g (rel %.3g)",
                     i, (unsigned long long)seed, n, b->cost, e->cost, rel);
        if (rel > relmax)
            relmax = rel;
        if (n == MAX_PRIMS) {
            cpu14[n14] = cpu;
            t14[n14++] = b->seconds;
            nodes14 += b->nodes;
        }
        cuts += b->cuts;
        solves += b->solves;
        ncand_sum += tpk_orch_cands_count(c);
        if (tpk_orch_cands_count(c) > ncand_max)
            ncand_max = tpk_orch_cands_count(c);
        /* fusion and recomputation happen on these graphs */
        int seen[64] = {0}, twice = 0;
        for (int q = 0; q < b->nkernels; q++) {
            const tpk_orch_kernel *k = tpk_orch_cands_get(c, b->kernels[q]);
            fused += k->nprims > 1;
            for (int j = 0; j < k->nprims; j++)
                twice |= seen[k->prims[j]]++ > 0;
        }
        recompute += twice;
        tpk_orch_plan_free(b);
        tpk_orch_plan_free(e);
        tpk_orch_cands_free(c);
        tpk_orch_graph_free(g);
    }
    qsort(t14, (size_t)n14, sizeof *t14, cmp_double);
    qsort(cpu14, (size_t)n14, sizeof *cpu14, cmp_double);
    double mean = 0, cmean = 0;
    for (int i = 0; i < n14; i++) {
        mean += t14[i] / n14;
        cmean += cpu14[i] / n14;
    }
    printf("orch: %d random DAGs (%d of %d primitives): BLP = exhaustive (largest difference "
           "%.2g relative); candidates mean %.0f, max %d; %d fused kernels, %d plans recompute; "
           "%d solves, %d acyclicity cuts; BLP on %d primitives: %ld nodes in all, CPU median "
           "%.2f ms, mean %.2f ms, max %.2f ms (wall median %.2f, max %.2f ms)\n",
           N_RANDOM, n14, MAX_PRIMS, relmax, (double)ncand_sum / N_RANDOM, ncand_max, fused,
           recompute, solves, cuts, MAX_PRIMS, nodes14, 1e3 * cpu14[n14 / 2], 1e3 * cmean,
           1e3 * cpu14[n14 - 1], 1e3 * t14[n14 / 2], 1e3 * t14[n14 - 1]);
    (void)mean;
    assert_true(fused > 0);
}

/* Costs with no structure (a hash of the kernel's contents): kernels that need each other are as
 * likely cheap as any, so the BLP's first optimum has no order more often than under the
 * roofline, and the acyclicity cuts are exercised against the exhaustive solver. */
static int cost_hashed(const tpk_orch_graph *g, const tpk_orch_kernel *k, void *arg, double *cost,
                       tpk_ctx *ctx)
{
    (void)g;
    (void)ctx;
    uint64_t h = *(const uint64_t *)arg;
    for (int i = 0; i < k->nprims; i++)
        h = h * 0x100000001b3ull ^ (uint64_t)(k->prims[i] + 1);
    for (int i = 0; i < k->noutputs; i++)
        h = h * 0x100000001b3ull ^ (uint64_t)(k->outputs[i] + 101);
    uint64_t s = h;
    *cost = 0.75 + (double)(rng_next(&s) >> 11) * 0x1.0p-53 * (1.0 + 0.25 * k->nprims);
    return TPK_OK;
}

static void test_blp_equals_exhaustive_hashed_costs(void **state)
{
    (void)state;
    int cuts = 0, cyclic = 0;
    for (int i = 0; i < N_RANDOM; i++) {
        uint64_t seed = 0xfacade00u + (uint64_t)i * 104729u;
        int n = 6 + i % 9;
        tpk_orch_graph *g = random_dag(seed, n);
        tpk_orch_cands *c = cands_of(g, NULL);
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        assert_int_equal(tpk_orch_cands_cost(c, cost_hashed, &seed, &ctx), TPK_OK);
        tpk_orch_plan *b = solve_blp(c, NULL);
        tpk_orch_plan *e = solve_exhaustive(c);
        double rel = fabs(b->cost - e->cost) / fmax(fabs(e->cost), 1e-300);
        if (!(rel <= COST_RTOL))
            fail_msg("DAG %d (seed %#llx, %d primitives): BLP %.17g, exhaustive %.17g (rel %.3g)",
                     i, (unsigned long long)seed, n, b->cost, e->cost, rel);
        cuts += b->cuts;
        cyclic += b->cuts > 0;
        tpk_orch_plan_free(b);
        tpk_orch_plan_free(e);
        tpk_orch_cands_free(c);
        tpk_orch_graph_free(g);
    }
    printf("orch: %d random DAGs, hashed costs: BLP = exhaustive; %d needed acyclicity cuts (%d "
           "cuts)\n",
           N_RANDOM, cyclic, cuts);
}

/* ---- hand-made graphs ----------------------------------------------------------------------- */

/* Six maps in a row: one kernel holding all six beats any split (one launch, x read once, only
 * the last value written). */
static void test_chain_fuses_whole(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_orch_graph *g = tpk_orch_graph_alloc(&ctx);
    int x = add_input(g, "x", shape2(512, 384)), p = x;
    for (int i = 0; i < 6; i++) {
        char nm[16];
        snprintf(nm, sizeof nm, "m%d", i);
        p = add_prim(g, nm, TPK_ORCH_MAP, shape2(512, 384), 2.0 * 512 * 384, p, -1);
    }
    set_output(g, p);
    tpk_orch_cands *c = cands_of(g, NULL);
    cost_roofline(c);
    tpk_orch_plan *b = solve_blp(c, NULL), *e = solve_exhaustive(c);
    assert_int_equal(b->nkernels, 1);
    const tpk_orch_kernel *k = tpk_orch_cands_get(c, b->kernels[0]);
    assert_int_equal(k->nprims, 6);
    assert_int_equal(k->ninputs, 1);
    assert_int_equal(k->noutputs, 1);
    assert_int_equal(k->outputs[0], p);
    double want = ROOF.launch_s + 2.0 * 512 * 384 * 8 / ROOF.bytes_per_s +
                  6 * 2.0 * 512 * 384 / ROOF.flops_per_s;
    assert_true(fabs(b->cost - want) <= 1e-15 * want * 8);
    assert_true(fabs(e->cost - b->cost) <= COST_RTOL * b->cost);
    /* the naive plan: six kernels */
    tpk_orch_plan *nv = tpk_orch_solve_naive(c, &ctx);
    assert_non_null(nv);
    assert_int_equal(nv->nkernels, 6);
    assert_int_equal(tpk_orch_plan_check(c, nv, &ctx), TPK_OK);
    assert_true(nv->cost > 3 * b->cost);
    tpk_orch_plan_free(nv);
    tpk_orch_plan_free(b);
    tpk_orch_plan_free(e);
    tpk_orch_cands_free(c);
    tpk_orch_graph_free(g);
}

/* x (a vector) broadcast to a 768×768 matrix a, read by two GEMMs. One kernel may hold only one
 * GEMM, so a is either written once and read twice (6.75 MiB moved) or recomputed in both
 * kernels from x (12 KiB): the optimum recomputes, and no kernel writes a. */
static void test_diamond_recomputes(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_orch_graph *g = tpk_orch_graph_alloc(&ctx);
    int x = add_input(g, "x", shape1(768));
    int w1 = add_input(g, "w1", shape2(768, 64)), w2 = add_input(g, "w2", shape2(768, 64));
    int a = add_prim(g, "a", TPK_ORCH_BROADCAST, shape2(768, 768), 0, x, -1);
    int g1 = add_prim(g, "g1", TPK_ORCH_LINEAR, shape2(768, 64), 2.0 * 768 * 768 * 64, a, w1);
    int g2 = add_prim(g, "g2", TPK_ORCH_LINEAR, shape2(768, 64), 2.0 * 768 * 768 * 64, a, w2);
    set_output(g, g1);
    set_output(g, g2);
    tpk_orch_cands *c = cands_of(g, NULL);
    cost_roofline(c);
    tpk_orch_plan *b = solve_blp(c, NULL), *e = solve_exhaustive(c);
    assert_true(fabs(e->cost - b->cost) <= COST_RTOL * b->cost);
    assert_int_equal(b->nkernels, 2);
    for (int i = 0; i < 2; i++) {
        const tpk_orch_kernel *k = tpk_orch_cands_get(c, b->kernels[i]);
        assert_int_equal(k->nprims, 2);
        assert_true(has(k->prims, k->nprims, a));
        assert_false(has(k->outputs, k->noutputs, a));
        assert_int_equal(k->nlinear, 1);
    }
    tpk_orch_plan_free(b);
    tpk_orch_plan_free(e);
    tpk_orch_cands_free(c);
    tpk_orch_graph_free(g);
}

static tpk_orch_graph *gemm_chain(int *e2out)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_orch_graph *g = tpk_orch_graph_alloc(&ctx);
    int x = add_input(g, "x", shape2(640, 320));
    int w1 = add_input(g, "w1", shape2(320, 320)), w2 = add_input(g, "w2", shape2(320, 320));
    int g1 = add_prim(g, "g1", TPK_ORCH_LINEAR, shape2(640, 320), 2.0 * 640 * 320 * 320, x, w1);
    int e1 = add_prim(g, "e1", TPK_ORCH_MAP, shape2(640, 320), 5.0 * 640 * 320, g1, -1);
    int g2 = add_prim(g, "g2", TPK_ORCH_LINEAR, shape2(640, 320), 2.0 * 640 * 320 * 320, e1, w2);
    int e2 = add_prim(g, "e2", TPK_ORCH_MAP, shape2(640, 320), 5.0 * 640 * 320, g2, -1);
    set_output(g, e2);
    if (e2out)
        *e2out = e2;
    return g;
}

/* GEMM, map, GEMM, map: with one GEMM a kernel the plan has two kernels of one GEMM each;
 * allowing two fuses all four into one, which is cheaper. */
static void test_gemm_limit_splits(void **state)
{
    (void)state;
    tpk_orch_graph *g = gemm_chain(NULL);
    tpk_orch_opts o;
    tpk_orch_opts_default(&o);
    tpk_orch_cands *c = cands_of(g, &o);
    cost_roofline(c);
    tpk_orch_plan *b = solve_blp(c, &o), *e = solve_exhaustive(c);
    assert_true(fabs(e->cost - b->cost) <= COST_RTOL * b->cost);
    assert_int_equal(b->nkernels, 2);
    int covered = 0;
    for (int i = 0; i < 2; i++) {
        const tpk_orch_kernel *k = tpk_orch_cands_get(c, b->kernels[i]);
        assert_int_equal(k->nlinear, 1);
        covered += k->nprims;
    }
    assert_int_equal(covered, 4);
    o.max_linear = 2;
    tpk_orch_cands *c2 = cands_of(g, &o);
    cost_roofline(c2);
    tpk_orch_plan *b2 = solve_blp(c2, &o);
    assert_int_equal(b2->nkernels, 1);
    assert_int_equal(tpk_orch_cands_get(c2, b2->kernels[0])->nprims, 4);
    assert_true(b2->cost < b->cost);
    tpk_orch_plan_free(b);
    tpk_orch_plan_free(b2);
    tpk_orch_plan_free(e);
    tpk_orch_cands_free(c);
    tpk_orch_cands_free(c2);
    tpk_orch_graph_free(g);
}

/* Two convex kernels that need each other: A = {w, a, c} reads u and writes w, B = {u, b, d}
 * reads w and writes u (a, b GEMMs, so one kernel cannot hold both). The BLP's constraints hold
 * for {A, B} and a cost that makes them cheap makes it the BLP's first optimum; it has no order,
 * so a cut must remove it, and the final plan matches the exhaustive solver's. */
typedef struct cyc {
    int u, w, a, b, cc, d;
} cyc;

static int same_set(const int *a, int n, const int *want, int m)
{
    if (n != m)
        return 0;
    for (int i = 0; i < m; i++)
        if (!has(a, n, want[i]))
            return 0;
    return 1;
}

static int cost_cyclic(const tpk_orch_graph *g, const tpk_orch_kernel *k, void *arg, double *cost,
                       tpk_ctx *ctx)
{
    (void)g;
    (void)ctx;
    const cyc *y = arg;
    int A[3] = {y->w, y->a, y->cc}, Aw[2] = {y->w, y->cc};
    int B[3] = {y->u, y->b, y->d}, Bw[2] = {y->u, y->d};
    if ((same_set(k->prims, k->nprims, A, 3) && same_set(k->outputs, k->noutputs, Aw, 2)) ||
        (same_set(k->prims, k->nprims, B, 3) && same_set(k->outputs, k->noutputs, Bw, 2)))
        *cost = 1.25;
    else
        *cost = 10.5 + 0.375 * k->nprims + 0.0625 * k->noutputs;
    return TPK_OK;
}

static tpk_orch_graph *cyclic_graph(cyc *y)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_orch_graph *g = tpk_orch_graph_alloc(&ctx);
    int x = add_input(g, "x", shape2(256, 256));
    int m1 = add_input(g, "m1", shape2(256, 256)), m2 = add_input(g, "m2", shape2(256, 256));
    y->u = add_prim(g, "u", TPK_ORCH_MAP, shape2(256, 256), 65536, x, -1);
    y->w = add_prim(g, "w", TPK_ORCH_MAP, shape2(256, 256), 65536, x, -1);
    y->a = add_prim(g, "a", TPK_ORCH_LINEAR, shape2(256, 256), 3.3e7, y->u, m1);
    y->b = add_prim(g, "b", TPK_ORCH_LINEAR, shape2(256, 256), 3.3e7, y->w, m2);
    y->cc = add_prim(g, "c", TPK_ORCH_MAP, shape2(256, 256), 65536, y->w, y->a);
    y->d = add_prim(g, "d", TPK_ORCH_MAP, shape2(256, 256), 65536, y->u, y->b);
    set_output(g, y->cc);
    set_output(g, y->d);
    return g;
}

static void test_cycle_is_cut(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    cyc y;
    tpk_orch_graph *g = cyclic_graph(&y);
    tpk_orch_cands *c = cands_of(g, NULL);
    assert_int_equal(tpk_orch_cands_cost(c, cost_cyclic, &y, &ctx), TPK_OK);
    tpk_orch_plan *b = solve_blp(c, NULL), *e = solve_exhaustive(c);
    assert_true(b->cuts >= 1);
    assert_true(b->solves >= 2);
    assert_true(fabs(e->cost - b->cost) <= COST_RTOL * b->cost);
    assert_true(b->cost > 2.5); /* not the cyclic pair */
    printf("orch: cyclic pair removed by %d cut(s) in %d solves; plan of %d kernels, cost %.4g\n",
           b->cuts, b->solves, b->nkernels, b->cost);
    /* one solve only: the cyclic optimum cannot be repaired */
    tpk_orch_opts o;
    tpk_orch_opts_default(&o);
    o.max_rounds = 1;
    tpk_orch_plan *p = tpk_orch_solve_blp(c, &o, &ctx);
    assert_null(p);
    assert_int_equal(ctx.status, TPK_ENUMERIC);
    assert_msg(&ctx, "no executable order after 1 solves");
    tpk_orch_plan_free(b);
    tpk_orch_plan_free(e);
    tpk_orch_cands_free(c);
    tpk_orch_graph_free(g);
}

/* ---- error paths -------------------------------------------------------------------------- */

/* Every kernel holding `arg`'s primitive cannot be built: no plan computes the outputs. */
static int cost_without(const tpk_orch_graph *g, const tpk_orch_kernel *k, void *arg,
                        double *cost, tpk_ctx *ctx)
{
    (void)g;
    (void)ctx;
    const int *banned = arg;
    *cost = has(k->prims, k->nprims, *banned) ? INFINITY : 1.0 + k->nprims;
    return TPK_OK;
}

static int cost_fails(const tpk_orch_graph *g, const tpk_orch_kernel *k, void *arg, double *cost,
                      tpk_ctx *ctx)
{
    (void)g;
    (void)arg;
    (void)cost;
    return k->nprims > 2 ? TPK_ERROR(ctx, TPK_EIO, "measuring a kernel of %d primitives failed",
                                     k->nprims)
                         : (*cost = 1, TPK_OK);
}

static int cost_nan(const tpk_orch_graph *g, const tpk_orch_kernel *k, void *arg, double *cost,
                    tpk_ctx *ctx)
{
    (void)g;
    (void)arg;
    (void)ctx;
    *cost = k->nprims == 2 ? NAN : 1;
    return TPK_OK;
}

static void test_infeasible(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    cyc y;
    tpk_orch_graph *g = cyclic_graph(&y);
    tpk_orch_cands *c = cands_of(g, NULL);
    assert_int_equal(tpk_orch_cands_cost(c, cost_without, &y.b, &ctx), TPK_OK);
    assert_null(tpk_orch_solve_blp(c, NULL, &ctx));
    assert_int_equal(ctx.status, TPK_ENOTFOUND);
    assert_msg(&ctx, "CBC proved the BLP infeasible");
    tpk_ctx_clear(&ctx);
    assert_null(tpk_orch_solve_exhaustive(c, &ctx));
    assert_int_equal(ctx.status, TPK_ENOTFOUND);
    tpk_ctx_clear(&ctx);
    assert_null(tpk_orch_solve_naive(c, &ctx));
    assert_int_equal(ctx.status, TPK_ENOTFOUND);
    assert_msg(&ctx, "'b'");
    tpk_orch_cands_free(c);
    tpk_orch_graph_free(g);
}

/* A real CBC stop: the first of the random DAGs whose BLP needs branching, solved again with a
 * node limit of 1. */
static void test_cbc_node_limit(void **state)
{
    (void)state;
    int found = 0;
    for (int i = 0; i < N_RANDOM && !found; i++) {
        uint64_t seed = 0x0c0ffee0u + (uint64_t)i * 7919u;
        int n = i % 2 == 0 ? MAX_PRIMS : 5 + (i / 2) % 9;
        tpk_orch_graph *g = random_dag(seed, n);
        tpk_orch_cands *c = cands_of(g, NULL);
        cost_roofline(c);
        tpk_orch_plan *b = solve_blp(c, NULL);
        if (b->nodes >= 2 && b->solves == 1) {
            found = 1;
            tpk_orch_opts o;
            tpk_orch_opts_default(&o);
            o.max_nodes = 1;
            tpk_ctx ctx;
            tpk_ctx_init(&ctx);
            tpk_orch_plan *p = tpk_orch_solve_blp(c, &o, &ctx);
            if (p != NULL)
                fail_msg("DAG %d: %ld nodes to the optimum, yet a 1-node limit gave a plan", i,
                         b->nodes);
            assert_int_equal(ctx.status, TPK_ENUMERIC);
            assert_msg(&ctx, "node limit");
            printf("orch: DAG %d (%ld nodes) with max_nodes = 1: %s\n", i, b->nodes, ctx.msg);
        }
        tpk_orch_plan_free(b);
        tpk_orch_cands_free(c);
        tpk_orch_graph_free(g);
    }
    if (!found)
        skip(); /* this CBC closes every one of them at the root */
}

/* CBC's outcomes as statuses, with outcomes a small graph cannot be made to produce. */
static void test_cbc_outcomes(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(orch_cbc_outcome(0, 0, 0, 1, 1, 7, &ctx), TPK_OK);
    assert_int_equal(orch_cbc_outcome(1, 3, 0, 0, 1, 7, &ctx), TPK_ENUMERIC);
    assert_msg(&ctx, "node limit");
    assert_msg(&ctx, "a feasible plan was found");
    tpk_ctx_clear(&ctx);
    assert_int_equal(orch_cbc_outcome(1, 4, 0, 0, 0, 7, &ctx), TPK_ENUMERIC);
    assert_msg(&ctx, "time limit");
    tpk_ctx_clear(&ctx);
    assert_int_equal(orch_cbc_outcome(2, -1, 0, 0, 0, 7, &ctx), TPK_ENUMERIC);
    assert_msg(&ctx, "abandoned");
    tpk_ctx_clear(&ctx);
    assert_int_equal(orch_cbc_outcome(0, 1, 1, 0, 0, 7, &ctx), TPK_ENOTFOUND);
    assert_msg(&ctx, "7 buildable candidates");
    tpk_ctx_clear(&ctx);
    /* finished but not proven optimal */
    assert_int_equal(orch_cbc_outcome(0, 0, 0, 0, 1, 7, &ctx), TPK_ENUMERIC);
}

static void test_graph_errors(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_orch_graph *g = tpk_orch_graph_alloc(&ctx);
    tpk_orch_shape bad = shape2(4, 0);
    assert_int_equal(tpk_orch_graph_add_input(g, "z", &bad, NULL, &ctx), TPK_EINVAL);
    assert_msg(&ctx, "'z' has dimension 1 of size 0");
    tpk_ctx_clear(&ctx);
    bad = shape2(4, 4);
    bad.rank = 5;
    assert_int_equal(tpk_orch_graph_add_input(g, "r", &bad, NULL, &ctx), TPK_EINVAL);
    assert_msg(&ctx, "rank 5");
    tpk_ctx_clear(&ctx);
    bad = shape2(4, 4);
    bad.elem_size = 0;
    assert_int_equal(tpk_orch_graph_add_input(g, "e", &bad, NULL, &ctx), TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    bad = shape2(SIZE_MAX / 2, 3);
    assert_int_equal(tpk_orch_graph_add_input(g, "huge", &bad, NULL, &ctx), TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    assert_int_equal(tpk_orch_graph_add_input(g, "s", NULL, NULL, &ctx), TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    int x = add_input(g, "x", shape2(8, 8));
    tpk_orch_shape s = shape2(8, 8);
    int args[2] = {x, 5};
    assert_int_equal(tpk_orch_graph_add_prim(g, "p", TPK_ORCH_MAP, &s, 1, 2, args, NULL, &ctx),
                     TPK_EINVAL);
    assert_msg(&ctx, "argument 2 is value 5");
    tpk_ctx_clear(&ctx);
    assert_int_equal(tpk_orch_graph_add_prim(g, "p", 99, &s, 1, 1, args, NULL, &ctx), TPK_EINVAL);
    assert_msg(&ctx, "kind 99");
    tpk_ctx_clear(&ctx);
    assert_int_equal(tpk_orch_graph_add_prim(g, "p", TPK_ORCH_MAP, &s, -1, 1, args, NULL, &ctx),
                     TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    assert_int_equal(tpk_orch_graph_add_prim(g, "p", TPK_ORCH_MAP, &s, NAN, 1, args, NULL, &ctx),
                     TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    assert_int_equal(tpk_orch_graph_add_prim(g, "p", TPK_ORCH_MAP, &s, 1, 0, args, NULL, &ctx),
                     TPK_EINVAL);
    assert_msg(&ctx, "reads no value");
    tpk_ctx_clear(&ctx);
    assert_int_equal(tpk_orch_graph_add_prim(NULL, "p", TPK_ORCH_MAP, &s, 1, 1, args, NULL, &ctx),
                     TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    assert_int_equal(tpk_orch_graph_set_output(g, 7, &ctx), TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    /* no output yet */
    int p = add_prim(g, "", TPK_ORCH_MAP, s, 64, x, -1);
    assert_string_equal(tpk_orch_graph_value(g, p)->name, "%1");
    assert_null(tpk_orch_graph_value(g, 2));
    assert_null(tpk_orch_cands_alloc(g, NULL, &ctx));
    assert_int_equal(ctx.status, TPK_EINVAL);
    assert_msg(&ctx, "no output");
    tpk_ctx_clear(&ctx);
    assert_null(tpk_orch_cands_alloc(NULL, NULL, &ctx));
    tpk_ctx_clear(&ctx);
    set_output(g, p);
    tpk_orch_opts o;
    tpk_orch_opts_default(&o);
    o.max_size = 0;
    assert_null(tpk_orch_cands_alloc(g, &o, &ctx));
    assert_msg(&ctx, "max_size is 0");
    tpk_ctx_clear(&ctx);
    tpk_orch_opts_default(&o);
    o.max_linear = -1;
    assert_null(tpk_orch_cands_alloc(g, &o, &ctx));
    tpk_ctx_clear(&ctx);
    tpk_orch_opts_default(&o);
    o.max_extra_outputs = 17;
    assert_null(tpk_orch_cands_alloc(g, &o, &ctx));
    tpk_ctx_clear(&ctx);
    tpk_orch_opts_default(&o);
    o.max_rounds = 0;
    assert_null(tpk_orch_cands_alloc(g, &o, &ctx));
    tpk_ctx_clear(&ctx);
    tpk_orch_opts_default(&o);
    o.max_candidates = 0;
    assert_null(tpk_orch_cands_alloc(g, &o, &ctx));
    tpk_ctx_clear(&ctx);
    tpk_orch_opts_default(&o);
    o.max_nodes = -2;
    assert_null(tpk_orch_cands_alloc(g, &o, &ctx));
    tpk_ctx_clear(&ctx);
    assert_string_equal(tpk_orch_kind_name(TPK_ORCH_REDUCE), "reduce");
    assert_string_equal(tpk_orch_kind_name(-3), "?");
    tpk_orch_graph_free(g);
    tpk_orch_graph_free(NULL);
    tpk_orch_cands_free(NULL);
    tpk_orch_plan_free(NULL);
}

static void test_cost_and_plan_errors(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    cyc y;
    tpk_orch_graph *g = cyclic_graph(&y);
    tpk_orch_cands *c = cands_of(g, NULL);
    /* not costed yet */
    assert_null(tpk_orch_solve_blp(c, NULL, &ctx));
    assert_int_equal(ctx.status, TPK_EINVAL);
    assert_msg(&ctx, "no cost");
    tpk_ctx_clear(&ctx);
    assert_null(tpk_orch_solve_exhaustive(c, &ctx));
    assert_int_equal(ctx.status, TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    assert_null(tpk_orch_solve_naive(c, &ctx));
    assert_msg(&ctx, "not costed");
    tpk_ctx_clear(&ctx);
    /* a failing measurement keeps its own message */
    assert_int_equal(tpk_orch_cands_cost(c, cost_fails, NULL, &ctx), TPK_EIO);
    assert_msg(&ctx, "measuring a kernel of 3 primitives failed");
    tpk_ctx_clear(&ctx);
    assert_int_equal(tpk_orch_cands_cost(c, cost_nan, NULL, &ctx), TPK_EDOM);
    assert_msg(&ctx, "has cost nan");
    tpk_ctx_clear(&ctx);
    assert_int_equal(tpk_orch_cands_set_cost(c, -1, 1, &ctx), TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    assert_int_equal(tpk_orch_cands_set_cost(c, 0, -0.5, &ctx), TPK_EDOM);
    tpk_ctx_clear(&ctx);
    assert_int_equal(tpk_orch_cands_cost(c, NULL, NULL, &ctx), TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    tpk_orch_roofline bad = {1e-6, 0, 1e9};
    assert_int_equal(tpk_orch_cands_cost(c, tpk_orch_cost_roofline, &bad, &ctx), TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    cost_roofline(c);
    /* solver options */
    tpk_orch_opts o;
    tpk_orch_opts_default(&o);
    o.max_rounds = 0;
    assert_null(tpk_orch_solve_blp(c, &o, &ctx));
    assert_int_equal(ctx.status, TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    assert_null(tpk_orch_solve_blp(NULL, NULL, &ctx));
    tpk_ctx_clear(&ctx);
    tpk_orch_cands_free(c);
    tpk_orch_graph_free(g);
    /* plan checks on GEMM-map-GEMM-map (two kernels, the second reading the first): reversed
     * order, a missing output, a wrong cost, a bad index */
    g = gemm_chain(NULL);
    c = cands_of(g, NULL);
    cost_roofline(c);
    tpk_orch_plan *b = solve_blp(c, NULL);
    assert_int_equal(b->nkernels, 2);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_int_equal(tpk_orch_plan_write(f, c, b, &ctx), TPK_OK);
    fclose(f);
    assert_non_null(strstr(buf, "total cost="));
    assert_non_null(strstr(buf, "prims={"));
    free(buf);
    assert_int_equal(tpk_orch_plan_write(NULL, c, b, &ctx), TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    int k0 = b->kernels[0];
    b->kernels[0] = b->kernels[b->nkernels - 1];
    b->kernels[b->nkernels - 1] = k0;
    assert_int_equal(tpk_orch_plan_check(c, b, &ctx), TPK_EINVAL);
    assert_msg(&ctx, "which no earlier kernel writes");
    tpk_ctx_clear(&ctx);
    b->kernels[b->nkernels - 1] = b->kernels[0];
    b->kernels[0] = k0;
    b->nkernels--;
    assert_int_equal(tpk_orch_plan_check(c, b, &ctx), TPK_EINVAL);
    assert_msg(&ctx, "writes output");
    tpk_ctx_clear(&ctx);
    b->nkernels++;
    assert_int_equal(tpk_orch_plan_check(c, b, &ctx), TPK_OK);
    b->cost *= 1.5;
    assert_int_equal(tpk_orch_plan_check(c, b, &ctx), TPK_EINVAL);
    assert_msg(&ctx, "its kernels sum to");
    tpk_ctx_clear(&ctx);
    b->kernels[0] = tpk_orch_cands_count(c);
    assert_int_equal(tpk_orch_plan_check(c, b, &ctx), TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    assert_int_equal(tpk_orch_plan_check(c, NULL, &ctx), TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    assert_null(tpk_orch_cands_get(c, -1));
    assert_ptr_equal(tpk_orch_cands_graph(c), g);
    tpk_orch_plan_free(b);
    tpk_orch_cands_free(c);
    tpk_orch_graph_free(g);
    /* candidate and size limits */
    g = cyclic_graph(&y);
    tpk_orch_opts_default(&o);
    o.max_candidates = 5;
    assert_null(tpk_orch_cands_alloc(g, &o, &ctx));
    assert_int_equal(ctx.status, TPK_EUNSUPPORTED);
    assert_msg(&ctx, "more than 5 candidate kernels");
    tpk_ctx_clear(&ctx);
    tpk_orch_graph_free(g);
    /* the exhaustive solver's size limit */
    g = tpk_orch_graph_alloc(&ctx);
    int p = add_input(g, "x", shape1(100));
    for (int i = 0; i <= TPK_ORCH_EXHAUSTIVE_MAX; i++)
        p = add_prim(g, NULL, TPK_ORCH_MAP, shape1(100), 100, p, -1);
    set_output(g, p);
    tpk_orch_opts_default(&o);
    o.max_size = 2;
    c = cands_of(g, &o);
    cost_roofline(c);
    assert_null(tpk_orch_solve_exhaustive(c, &ctx));
    assert_int_equal(ctx.status, TPK_EUNSUPPORTED);
    tpk_ctx_clear(&ctx);
    tpk_orch_plan *big = solve_blp(c, &o); /* the BLP takes it */
    assert_true(big->nkernels >= (TPK_ORCH_EXHAUSTIVE_MAX + 1) / 2);
    tpk_orch_plan_free(big);
    tpk_orch_cands_free(c);
    tpk_orch_graph_free(g);
}

/* A graph output that is a graph input needs no kernel; a dead primitive takes no part. */
static void test_trivial_graphs(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_orch_graph *g = tpk_orch_graph_alloc(&ctx);
    int x = add_input(g, "x", shape1(10));
    add_prim(g, "dead", TPK_ORCH_MAP, shape1(10), 10, x, -1);
    set_output(g, x);
    tpk_orch_cands *c = cands_of(g, NULL);
    assert_int_equal(tpk_orch_cands_count(c), 0);
    assert_int_equal(tpk_orch_cands_cost(c, tpk_orch_cost_roofline, (void *)&ROOF, &ctx), TPK_OK);
    tpk_orch_plan *b = solve_blp(c, NULL), *e = solve_exhaustive(c);
    assert_int_equal(b->nkernels, 0);
    assert_int_equal(e->nkernels, 0);
    tpk_orch_plan_free(b);
    tpk_orch_plan_free(e);
    tpk_orch_cands_free(c);
    tpk_orch_graph_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_enumeration_matches_brute_force),
        cmocka_unit_test(test_blp_equals_exhaustive),
        cmocka_unit_test(test_blp_equals_exhaustive_hashed_costs),
        cmocka_unit_test(test_chain_fuses_whole),
        cmocka_unit_test(test_diamond_recomputes),
        cmocka_unit_test(test_gemm_limit_splits),
        cmocka_unit_test(test_cycle_is_cut),
        cmocka_unit_test(test_infeasible),
        cmocka_unit_test(test_cbc_node_limit),
        cmocka_unit_test(test_cbc_outcomes),
        cmocka_unit_test(test_graph_errors),
        cmocka_unit_test(test_cost_and_plan_errors),
        cmocka_unit_test(test_trivial_graphs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
