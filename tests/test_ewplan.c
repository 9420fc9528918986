/* Entrywise plans (netsor/ewplan.c, docs/orchestration.md §7): random entrywise programs — maps
 * V_φ of several φ over random PSD leaves, sums with per-index weights and bias blocks, shared
 * arguments — run by the naive and the optimal plan against a reference that evaluates every
 * node as a whole matrix by the library's symmetric maps (tpk_gauss_map_affine, tiled, another
 * code path) and plain loops; the two plans agree bit for bit (the same arithmetic per entry in
 * another grouping of kernels); the optimal plan's predicted cost is at most the naive one's
 * (both are plans of one model); errors name the statement; TPK_PLAN is parsed strictly; and
 * through the evaluator, the shipped MLP programs give the same kernel under both plans and the
 * unrolled evaluator; `netsor plan` and TPK_PLAN on the command line. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tpk/tpk.h"
#include "tpk/job.h"
#include "tpk/cnn.h"
#include "../netsor/ewplan-impl.h"
#include "support/testutil.h"

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull); /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double unif(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) * 0x1p-53;
}

/* A random PSD n×n matrix: the Gram of n random vectors of dimension r, scaled. */
static double *random_psd(size_t n, size_t r, uint64_t *s)
{
    double *X = malloc(n * r * sizeof *X), *M = malloc(n * n * sizeof *M);
    for (size_t i = 0; i < n * r; i++)
        X[i] = 2 * unif(s) - 1;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            double acc = 0;
            for (size_t q = 0; q < r; q++)
                acc += X[i * r + q] * X[j * r + q];
            M[i * n + j] = acc / (double)r;
        }
    free(X);
    return M;
}

typedef struct prog {
    size_t n;
    long m;
    int nn;
    nsr_ew_node node[24];
    double *mem[24];   /* leaves' matrices; the reference's full matrices of the others */
    double *diag[24];
    double *w[24][NSR_EW_MAXT];
    double *s[24][NSR_EW_MAXT];
    int *cls[24][NSR_EW_MAXT];
} prog;

static void prog_free(prog *P)
{
    for (int k = 0; k < P->nn; k++) {
        free(P->mem[k]);
        free(P->diag[k]);
        for (int t = 0; t < NSR_EW_MAXT; t++) {
            free(P->w[k][t]);
            free(P->s[k][t]);
            free(P->cls[k][t]);
        }
    }
}

/* The reference: node k as a whole symmetric matrix from its arguments' (tpk_gauss_map_affine
 * for maps, loops for sums), and its diagonal from that matrix. */
static void reference(prog *P, int k, const tpk_gauss_ws *ws)
{
    size_t n = P->n, mm = (size_t)P->m;
    nsr_ew_node *nd = &P->node[k];
    double *M = malloc(n * n * sizeof *M);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    if (nd->op == NSR_EW_PHI) {
        assert_int_equal(tpk_gauss_map_affine(nd->phi, P->mem[nd->arg], n, nd->alpha, nd->beta, M,
                                              ws, NULL, &ctx), TPK_OK);
    } else {
        for (size_t a = 0; a < n; a++)
            for (size_t c = 0; c < n; c++) {
                double y = 0;
                for (int t = 0; t < nd->nt; t++) {
                    const nsr_ew_term *T = &nd->t[t];
                    double w = T->w ? T->w[a] * T->w[c] : 1.0;
                    const size_t p = a % mm, q = c % mm;
                    int same = T->cls ? T->cls[p] >= 0 && T->cls[p] == T->cls[q] : p == q;
                    double x = T->arg >= 0 ? P->mem[T->arg][a * n + c] : same ? T->s[p] : 0.0;
                    y += T->c * w * x;
                }
                M[a * n + c] = y;
            }
    }
    P->mem[k] = M;
}

static const char *const PHIS[] = {"relu", "erf", "tanh", "gelu", "step", "sin"};

/* The registry, a quadrature workspace and one φ of each of PHIS, for the tests of random
 * programs. */
typedef struct phis_fx {
    tpk_phi_registry *reg;
    tpk_gauss_ws *ws;
    tpk_phi *phis[sizeof PHIS / sizeof PHIS[0]];
} phis_fx;

static int phis_setup(void **state)
{
    phis_fx *fx = calloc(1, sizeof *fx);
    if (fx == NULL || (fx->reg = tpk_job_registry(NULL)) == NULL ||
        (fx->ws = tpk_gauss_ws_alloc(TPK_GAUSS_DEFAULT_DEGREE, NULL)) == NULL)
        return -1;
    for (size_t i = 0; i < sizeof PHIS / sizeof PHIS[0]; i++)
        if ((fx->phis[i] = tpk_phi_alloc(fx->reg, PHIS[i], NULL)) == NULL)
            return -1;
    *state = fx;
    return 0;
}

static int phis_teardown(void **state)
{
    phis_fx *fx = *state;
    for (size_t i = 0; fx && i < sizeof PHIS / sizeof PHIS[0]; i++)
        tpk_phi_free(fx->phis[i]);
    if (fx) {
        tpk_gauss_ws_free(fx->ws);
        tpk_phi_registry_free(fx->reg);
    }
    free(fx);
    return 0;
}

/* A random program of nn nodes over 1–3 leaves; the last node is the root. */
static void random_prog(prog *P, uint64_t seed, size_t n, long m, int nn,
                        const tpk_phi_registry *reg, tpk_phi *const *phis,
                        const tpk_gauss_ws *ws)
{
    uint64_t s = seed;
    memset(P, 0, sizeof *P);
    P->n = n;
    P->m = m;
    P->nn = nn;
    int leaves = 1 + (int)(rng_next(&s) % 3);
    (void)reg;
    for (int k = 0; k < nn; k++) {
        nsr_ew_node *nd = &P->node[k];
        nd->line = 10 + k;
        nd->col = 1;
        snprintf(nd->name, sizeof nd->name, "n%d", k);
        if (k < leaves) {
            nd->op = NSR_EW_LEAF;
            P->mem[k] = random_psd(n, 3 + (size_t)k, &s);
            nd->M = P->mem[k];
        } else if (rng_next(&s) % 2) {
            nd->op = NSR_EW_PHI;
            nd->arg = nn > 16 ? k - 1 : (int)(rng_next(&s) % (unsigned)k);
            nd->phi = phis[rng_next(&s) % (sizeof PHIS / sizeof PHIS[0])];
            nd->alpha = 0.5 + unif(&s);
            nd->beta = unif(&s) < 0.5 ? 0.0 : 0.2 * unif(&s);
        } else {
            nd->op = NSR_EW_SUM;
            nd->nt = 1 + (int)(rng_next(&s) % 3);
            for (int t = 0; t < nd->nt; t++) {
                nsr_ew_term *T = &nd->t[t];
                T->c = 0.3 + unif(&s);
                if (t > 0 && rng_next(&s) % 3 == 0) { /* a bias block */
                    T->arg = -1;
                    P->s[k][t] = malloc((size_t)m * sizeof(double));
                    for (long p = 0; p < m; p++)
                        P->s[k][t][p] = unif(&s);
                    T->s = P->s[k][t];
                    if (m > 1 && rng_next(&s) % 2) { /* members sharing bias members */
                        int *cl = P->cls[k][t] = malloc((size_t)m * sizeof *cl);
                        for (long p = 0; p < m; p++) {
                            cl[p] = (int)(rng_next(&s) % (unsigned)(m / 2 + 2)) - 1;
                            P->s[k][t][p] = cl[p] >= 0 ? 0.2 + 0.1 * cl[p] : 0.0;
                        }
                        T->cls = cl;
                    }
                } else {
                    T->arg = (int)(rng_next(&s) % (unsigned)k);
                }
                if (rng_next(&s) % 2) { /* LayerNorm-like per-index weights */
                    P->w[k][t] = malloc(n * sizeof(double));
                    for (size_t i = 0; i < n; i++)
                        P->w[k][t][i] = 0.5 + unif(&s);
                    T->w = P->w[k][t];
                }
            }
            if (nd->t[0].arg < 0 || nn > 16) /* long programs: a chain with side branches */
                nd->t[0].arg = nn > 16 ? k - 1 : 0;
        }
        if (k >= leaves)
            reference(P, k, ws);
        P->diag[k] = malloc(n * sizeof(double));
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        assert_int_equal(nsr_ew_diag(P->node, k, n, m, ws, "t.nsr", P->diag[k], NULL, &ctx),
                         TPK_OK);
        nd->diag = P->diag[k];
    }
}

static void test_random_programs(void **state)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    const phis_fx *fx = *state;
    tpk_phi_registry *reg = fx->reg;
    const tpk_gauss_ws *ws = fx->ws;
    tpk_phi *const *phis = fx->phis;
    int fused = 0, total = 0, long_programs = 0;
    for (int r = 0; r < 40; r++) {
        size_t n = r % 4 == 0 ? 300 : 37 + (size_t)r; /* odd sizes; one beyond a segment */
        long m = r % 5 == 1 ? 3 : 1;
        n -= n % (size_t)m;
        prog P;
        /* the last programs are longer than one kernel's worth (MAX_FUSE = 16) */
        random_prog(&P, 1000 + (uint64_t)r, n, m, r >= 34 ? 24 : 4 + r % 12, reg, phis, ws);
        int root = P.nn - 1;
        if (P.node[root].op == NSR_EW_LEAF) {
            prog_free(&P);
            continue;
        }
        double *out[3];
        nsr_ew_stats st[2];
        for (int k = 0; k < 2; k++) {
            out[k] = malloc(n * n * sizeof(double));
            double err = -1;
            /* one fixed model for both plans (sampled times would differ run to run) */
            nsr_ew_calib cal = {1, 1e-10, 1e-10, 3e-10, 2e-6, 1, 1e-10, NULL};
            /* the root in full (its upper triangle from the kernels' tiles), as both plans
             * cost it */
            int rc = nsr_ew_eval(P.node, P.nn, root, n, m, k ? NSR_PLAN_OPTIMAL : NSR_PLAN_NAIVE,
                                 ws, &cal, "t.nsr", NULL, out[k], 1, 1, &err, &st[k], &ctx);
            if (rc != TPK_OK)
                fail_msg("program %d, plan %d: %s", r, k, ctx.msg);
            assert_true(err >= 0);
        }
        /* and the plan of an unreported small run: no model, runs of the graph order (or one
         * kernel) */
        out[2] = malloc(n * n * sizeof(double));
        if (nsr_ew_eval(P.node, P.nn, root, n, m, NSR_PLAN_OPTIMAL, ws, NULL, "t.nsr", NULL, out[2],
                        1, 0, NULL, NULL, &ctx) != TPK_OK)
            fail_msg("program %d, unreported: %s", r, ctx.msg);
        /* the plans: the same numbers; the optimum no dearer than one kernel a primitive */
        for (size_t a = 0; a < n; a++) {
            assert_memory_equal(out[0] + a * n, out[1] + a * n, (a + 1) * sizeof(double));
            assert_memory_equal(out[0] + a * n, out[2] + a * n, (a + 1) * sizeof(double));
            for (size_t c = 0; c < a; c++) /* the full root: its mirror */
                assert_true(out[1][c * n + a] == out[1][a * n + c]);
        }
        long_programs += st[0].nkernels > 16; /* naive: one kernel a primitive */
        assert_true(st[1].predicted_s <= st[0].predicted_s * (1 + 1e-9));
        assert_int_equal(st[0].nkernels, st[0].nprims - (st[0].nprims - st[0].nkernels));
        assert_int_equal(st[0].fused, 0);
        fused += st[1].fused;
        total++;
        /* against the reference, entry by entry (lower triangle) */
        const double *R = P.mem[root];
        double scale = 0;
        for (size_t i = 0; i < n * n; i++)
            scale = fmax(scale, fabs(R[i]));
        for (size_t a = 0; a < n; a++)
            for (size_t c = 0; c <= a; c++)
                if (fabs(out[1][a * n + c] - R[a * n + c]) > 1e-12 * (scale + 1))
                    fail_msg("program %d (n %zu, m %ld): entry (%zu,%zu) %.17g, reference %.17g", r,
                             n, m, a, c, out[1][a * n + c], R[a * n + c]);
        for (size_t a = 0; a < n; a++)
            assert_true(fabs(P.diag[root][a] - R[a * n + a]) <= 1e-12 * (scale + 1));
        free(out[0]);
        free(out[1]);
        free(out[2]);
        prog_free(&P);
    }
    assert_true(total >= 30);
    assert_true(fused > 0); /* the optimum fuses somewhere */
    assert_true(long_programs > 0);
}

/* The measured model (a program large enough for the memory passes, 2^18 entries and more):
 * constants positive and finite and kept for the next evaluation, predicted times positive, the
 * same kernel as the naive plan. */
static void test_calibration(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_job_registry(&ctx);
    tpk_phi *relu = tpk_phi_alloc(reg, "relu", &ctx);
    uint64_t s = 5;
    size_t n = 760;
    double *M = random_psd(n, 6, &s), d0[760], d1[760], d2[760];
    double *out[2] = {malloc(n * n * sizeof(double)), malloc(n * n * sizeof(double))};
    double w[760];
    for (size_t i = 0; i < n; i++)
        w[i] = 0.5 + unif(&s);
    nsr_ew_node nd[3];
    memset(nd, 0, sizeof nd);
    nd[0].op = NSR_EW_LEAF;
    nd[0].M = M;
    nd[1].op = NSR_EW_SUM; /* a LayerNorm-like scaling, then a map */
    nd[1].nt = 1;
    nd[1].t[0] = (nsr_ew_term){.arg = 0, .c = 1.0, .w = w};
    nd[2].op = NSR_EW_PHI;
    nd[2].arg = 1;
    nd[2].phi = relu;
    nd[2].alpha = 2.0;
    nd[0].diag = d0;
    nd[1].diag = d1;
    nd[2].diag = d2;
    for (int k = 0; k < 3; k++)
        assert_int_equal(nsr_ew_diag(nd, k, n, 1, NULL, "c.nsr", (double *)nd[k].diag, NULL, &ctx),
                         TPK_OK);
    nsr_ew_calib cal;
    memset(&cal, 0, sizeof cal);
    nsr_ew_stats st[2];
    for (int k = 0; k < 2; k++)
        assert_int_equal(nsr_ew_eval(nd, 3, 2, n, 1, k ? NSR_PLAN_OPTIMAL : NSR_PLAN_NAIVE, NULL,
                                     &cal, "c.nsr", NULL, out[k], 1, 0, NULL, &st[k], &ctx),
                         TPK_OK);
    assert_int_equal(cal.have_memory, 1);
    assert_true(cal.read_s > 0 && isfinite(cal.read_s) && cal.write_s > 0 && isfinite(cal.write_s));
    assert_true(cal.fault_s >= 0 && isfinite(cal.fault_s));
    for (int k = 0; k < 2; k++)
        assert_true(st[k].predicted_s > 0 && isfinite(st[k].predicted_s) && st[k].measured_s > 0);
    assert_int_equal(st[1].nkernels, 1);
    assert_int_equal(st[0].nkernels, 2);
    for (size_t a = 0; a < n; a++)
        assert_memory_equal(out[0] + a * n, out[1] + a * n, (a + 1) * sizeof(double));
    free(out[0]);
    free(out[1]);
    free(M);
    tpk_phi_free(relu);
    tpk_phi_registry_free(reg);
}

/* A map over a leaf that is not PSD: the error names the map's statement, and nothing else. */
static void test_errors(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_job_registry(&ctx);
    tpk_phi *relu = tpk_phi_alloc(reg, "relu", &ctx);
    size_t n = 4;
    double M[16] = {1, 0, 0, 0, 3, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1}; /* k = 3 > √(1·1) */
    double d[4] = {1, 1, 1, 1}, dm[4], out[16];
    nsr_ew_node nd[2];
    memset(nd, 0, sizeof nd);
    nd[0].op = NSR_EW_LEAF;
    nd[0].M = M;
    nd[0].diag = d;
    nd[1].op = NSR_EW_PHI;
    nd[1].arg = 0;
    nd[1].phi = relu;
    nd[1].alpha = 1;
    nd[1].line = 7;
    nd[1].col = 3;
    assert_int_equal(nsr_ew_diag(nd, 1, n, 1, NULL, "p.nsr", dm, NULL, &ctx), TPK_OK);
    nd[1].diag = dm;
    for (int plan = NSR_PLAN_NAIVE; plan <= NSR_PLAN_OPTIMAL; plan++) {
        tpk_ctx_clear(&ctx);
        assert_int_equal(nsr_ew_eval(nd, 2, 1, n, 1, plan, NULL, NULL, "p.nsr", NULL, out, 0, 0,
                                     NULL, NULL, &ctx), TPK_EDOM);
        if (!strstr(ctx.msg, "p.nsr:7:3: ")) fail_msg("%s", ctx.msg);
        assert_non_null(strstr(ctx.msg, "(1,0)"));
    }
    tpk_ctx_clear(&ctx);
    assert_int_equal(nsr_ew_eval(nd, 2, 0, n, 1, NSR_PLAN_OPTIMAL, NULL, NULL, "p.nsr", NULL, out,
                                 0, 0, NULL, NULL, &ctx), TPK_EINVAL);
    tpk_phi_free(relu);
    tpk_phi_registry_free(reg);
}

static void test_plan_env(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    int plan = 0;
    unsetenv("TPK_PLAN");
    assert_int_equal(nsr_plan_from_env(&plan, &ctx), TPK_OK);
    assert_int_equal(plan, NSR_PLAN_OPTIMAL);
    setenv("TPK_PLAN", "naive", 1);
    assert_int_equal(nsr_plan_from_env(&plan, &ctx), TPK_OK);
    assert_int_equal(plan, NSR_PLAN_NAIVE);
    setenv("TPK_PLAN", "optimal", 1);
    assert_int_equal(nsr_plan_from_env(&plan, &ctx), TPK_OK);
    assert_int_equal(plan, NSR_PLAN_OPTIMAL);
    setenv("TPK_PLAN", "fastest", 1);
    assert_int_equal(nsr_plan_from_env(&plan, &ctx), TPK_EINVAL);
    assert_non_null(strstr(ctx.msg, "TPK_PLAN=fastest"));
    unsetenv("TPK_PLAN");
}

/* The kernel of p on X three ways: the naive plan, the optimal plan (its report returned, to
 * free), the unrolled evaluator (an independent code path); the two plans equal bit for bit,
 * the optimal one within tol·max|K| of the unrolled one (what names the program on failure). */
static char *three_ways(const tpk_program *p, const tpk_array *X, int all, tpk_array *K[3],
                        double tol, const char *what)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    char *rep = NULL;
    size_t replen = 0;
    FILE *f = open_memstream(&rep, &replen);
    assert_non_null(f);
    assert_int_equal(tpk_netsor_kernel_plan(p, X, all, TPK_PLAN_NAIVE, NULL, &K[0], NULL, &ctx),
                     TPK_OK);
    assert_int_equal(tpk_netsor_kernel_plan(p, X, all, TPK_PLAN_OPTIMAL, f, &K[1], NULL, &ctx),
                     TPK_OK);
    fclose(f);
    setenv("TPK_NETSOR_FORM", "unrolled", 1);
    assert_int_equal(tpk_netsor_kernel(p, X, all, &K[2], NULL, &ctx), TPK_OK);
    unsetenv("TPK_NETSOR_FORM");
    const size_t nk = tpk_array_size(K[2]);
    assert_int_equal(tpk_array_size(K[0]), nk);
    assert_int_equal(tpk_array_size(K[1]), nk);
    double scale = 0;
    for (size_t i = 0; i < nk; i++)
        scale = fmax(scale, fabs(K[2]->data[i]));
    for (size_t i = 0; i < nk; i++) {
        assert_true(K[0]->data[i] == K[1]->data[i]);
        if (fabs(K[1]->data[i] - K[2]->data[i]) > tol * scale)
            fail_msg("%s: entry %zu: %.17g (rolled), %.17g (unrolled)", what, i, K[1]->data[i],
                     K[2]->data[i]);
    }
    return rep;
}

/* Through the evaluator: the shipped MLP programs (plain, LayerNorm, residual, both) under both
 * plans and the unrolled evaluator, and the plan's report. */
static void test_programs(void **state)
{
    (void)state;
    static const struct {
        const char *file;
        const char *sets[4];
    } cases[] = {
        {"programs/mlp.nsr", {"L=4", "phi=erf", "sigma_b2=0.3", NULL}},
        {"programs/mlp-ln.nsr", {"L=3", "phi=tanh", "sigma_b2=0.2", NULL}},
        {"programs/mlp-residual.nsr", {"L=5", "alpha=0.6", "sigma_b2=0.1", NULL}},
        {"programs/mlp-ln-residual.nsr", {"L=4", "phi=gelu", "alpha=0.7", "sigma_b2=0.05"}},
    };
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_job_registry(&ctx);
    size_t N = 23, d = 5;
    tpk_array *X = tpk_array_alloc2(N, d, &ctx);
    uint64_t s = 7;
    for (size_t i = 0; i < N * d; i++)
        X->data[i] = 2 * unif(&s) - 1;
    X->data[3 * d + 1] = 0; /* and one input twice */
    memcpy(X->data + 9 * d, X->data + 4 * d, d * sizeof(double));
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tpk_param_set sets[4];
        int ns = 0;
        for (; ns < 4 && cases[c].sets[ns]; ns++) {
            const char *eq = strchr(cases[c].sets[ns], '=');
            static char names[4][32];
            snprintf(names[ns], sizeof names[ns], "%.*s", (int)(eq - cases[c].sets[ns]),
                     cases[c].sets[ns]);
            sets[ns].name = names[ns];
            sets[ns].value = eq + 1;
        }
        tpk_netsor_opts o = {.sets = sets, .nsets = ns};
        tpk_program *p = tpk_netsor_load_file(cases[c].file, &o, reg, &ctx);
        if (p == NULL)
            fail_msg("%s: %s", cases[c].file, ctx.msg);
        tpk_array *K[3];
        char *rep = three_ways(p, X, 0, K, 1e-8, cases[c].file);
        assert_int_equal(K[1]->dims[0], N);
        /* the report: a plan with its kernels, predicted and measured */
        if (!strstr(rep, "plan (optimal) of readout@")) fail_msg("%s", rep);
        assert_non_null(strstr(rep, "  kernel 1: "));
        assert_non_null(strstr(rep, "predicted"));
        assert_non_null(strstr(rep, "measured"));
        free(rep);
        for (int k = 0; k < 3; k++)
            tpk_array_free(K[k]);
        tpk_program_free(p);
    }
    assert_int_equal(tpk_netsor_kernel_plan(NULL, X, 0, 3, NULL, NULL, NULL, &ctx), TPK_EINVAL);
    tpk_array_free(X);
    tpk_phi_registry_free(reg);
}

/* Exact verification (§7.2): every candidate kernel of random programs — maps, weighted sums,
 * bias members per position or shared, m = 1 and 3, rows past a segment and tiles of the root —
 * run by the executor in Z_p equals the whole-matrix reference entry for entry; and each bug of
 * the mutation suite, injected into the executor, makes some kernel differ. */
static void test_exact_verification(void **state)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    const phis_fx *fx = *state;
    tpk_phi_registry *reg = fx->reg;
    const tpk_gauss_ws *ws = fx->ws;
    tpk_phi *const *phis = fx->phis;
    enum { NPROG = 12 };
    prog P[NPROG];
    int skip[NPROG];
    int kernels = 0;
    for (int r = 0; r < NPROG; r++) {
        size_t n = r % 3 == 0 ? 300 : 70 + 7 * (size_t)r; /* past a segment (256), tiles of 64 */
        long m = r % 4 == 1 ? 3 : 1;
        n -= n % (size_t)m;
        random_prog(&P[r], 7000 + (uint64_t)r, n, m, 8 + (r % 6) * 2, reg, phis, ws);
        skip[r] = P[r].node[P[r].nn - 1].op == NSR_EW_LEAF; /* a program that is a leaf */
        if (skip[r])
            continue;
        nsr_ew_verified v;
        if (nsr_ew_verify(P[r].node, P[r].nn, P[r].nn - 1, n, m, 42 + (uint64_t)r, 0, &v, &ctx))
            fail_msg("program %d: %s", r, ctx.msg);
        if (v.mismatch)
            fail_msg("program %d: %s differs at (%zu, %zu)", r, v.what, v.row, v.col);
        kernels += v.kernels;
    }
    print_message("exact verification: %d kernel runs over %d programs, all equal\n", kernels,
                  NPROG);
    assert_true(kernels > 100);
    /* the mutation suite: a mutant is caught when some program's kernel differs */
    int caught = 0;
    for (int mu = 1; mu <= nsr_ew_mutants(); mu++) {
        int hit = 0;
        for (int r = 0; r < NPROG && !hit; r++) {
            if (skip[r])
                continue;
            nsr_ew_verified v;
            assert_int_equal(nsr_ew_verify(P[r].node, P[r].nn, P[r].nn - 1, P[r].n, P[r].m,
                                           42 + (uint64_t)r, mu, &v, &ctx), TPK_OK);
            hit = v.mismatch;
        }
        if (!hit)
            print_message("mutant %d not caught\n", mu);
        caught += hit;
    }
    print_message("executor mutants: caught %d/%d\n", caught, nsr_ew_mutants());
    assert_int_equal(caught, nsr_ew_mutants());
    nsr_ew_verified v;
    assert_int_equal(nsr_ew_verify(P[0].node, 1, 0, P[0].n, 1, 1, 0, &v, &ctx), TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    { /* a pair program runs the library's layers, not the executor's kernels: refused */
        double x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        nsr_ew_node pn[2] = {{.op = NSR_EW_LEAF, .x = x, .d = 1, .name = "input"},
                             {.op = NSR_EW_CONV, .arg = 0, .alpha = 1, .rows = 2, .cols = 2,
                              .kh = 1, .kw = 1, .name = "conv"}};
        assert_int_equal(nsr_ew_verify(pn, 2, 1, 8, 4, 1, 0, &v, &ctx), TPK_EUNSUPPORTED);
        assert_non_null(strstr(ctx.msg, "pair program"));
    }
    for (int r = 0; r < NPROG; r++)
        prog_free(&P[r]);
}

/* ---- pair programs (netsor/ewpair.c) ------------------------------------------------------- */

/* The reference convolution of a whole matrix S (n = N·R·C): out[(a,p),(c,q)] = α Σ_t S[(a,p+t),
 * (c,q+t)], taps t over the kh×kw filter (centre (kh−1)/2, (kw−1)/2), wrapped or dropped where
 * either side leaves the grid — the defining formula (theory §2.8), loop by loop. */
static void ref_conv(const double *S, size_t N, int R, int C, int kh, int kw, int circ,
                     double alpha, double *out)
{
    const size_t m = (size_t)R * (size_t)C, n = N * m;
    const int cr = (kh - 1) / 2, cs = (kw - 1) / 2;
    for (size_t a = 0; a < N; a++)
        for (size_t c = 0; c < N; c++)
            for (int pr = 0; pr < R; pr++)
                for (int pc = 0; pc < C; pc++)
                    for (int qr = 0; qr < R; qr++)
                        for (int qc = 0; qc < C; qc++) {
                            double v = 0;
                            for (int i = 0; i < kh; i++)
                                for (int j = 0; j < kw; j++) {
                                    int r1 = pr + i - cr, c1 = pc + j - cs;
                                    int r2 = qr + i - cr, c2 = qc + j - cs;
                                    if (circ) {
                                        r1 = (r1 % R + R) % R, c1 = (c1 % C + C) % C;
                                        r2 = (r2 % R + R) % R, c2 = (c2 % C + C) % C;
                                    } else if (r1 < 0 || r1 >= R || c1 < 0 || c1 >= C ||
                                               r2 < 0 || r2 >= R || c2 < 0 || c2 >= C) {
                                        continue;
                                    }
                                    v += S[(a * m + (size_t)(r1 * C + c1)) * n + c * m +
                                           (size_t)(r2 * C + c2)];
                                }
                            out[(a * m + (size_t)(pr * C + pc)) * n + c * m +
                                (size_t)(qr * C + qc)] = alpha * v;
                        }
}

/* Random pair programs — a leaf (a PSD matrix, or the Gram of random inputs), then a chain of
 * convolutions (with a map before the taps or not), sums with per-index weights and bias blocks
 * (per member, or one member read at every position), and maps — against the whole-matrix
 * reference (tpk_gauss_map_affine for maps, ref_conv's loops for the taps), lower triangle and
 * both, the closed diagonals against the reference's, and the pooled readout against the sum
 * of the reference's mapped blocks; a non-PSD pair block's error names its statement and pair. */
static void test_pair_programs(void **state)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    const phis_fx *fx = *state;
    const tpk_gauss_ws *ws = fx->ws;
    tpk_phi *const *phis = fx->phis;
    static const int grids[][4] = {{3, 4, 3, 2}, {1, 7, 1, 3}, {4, 4, 3, 3}, {2, 5, 2, 4}};
    for (int r = 0; r < 16; r++) {
        uint64_t s = 500 + (uint64_t)r;
        const int *gd = grids[r % 4];
        const int R = gd[0], C = gd[1], kh = gd[2], kw = gd[3], circ = (r / 4) % 2;
        const size_t N = 3 + (size_t)(r % 3), m = (size_t)(R * C), n = N * m;
        prog P;
        memset(&P, 0, sizeof P);
        P.n = n;
        P.m = (long)m;
        double *x = NULL;
        const size_t d = 1 + (size_t)(r % 3);
        nsr_ew_node *nd = &P.node[0];
        nd->op = NSR_EW_LEAF;
        snprintf(nd->name, sizeof nd->name, "leaf");
        if (r % 2) { /* the inputs' Gram, made per pair */
            x = malloc(n * d * sizeof *x);
            for (size_t i = 0; i < n * d; i++)
                x[i] = 2 * unif(&s) - 1;
            nd->x = x;
            nd->d = d;
            P.mem[0] = malloc(n * n * sizeof(double));
            for (size_t i = 0; i < n; i++)
                for (size_t j = 0; j < n; j++) {
                    double g = 0;
                    for (size_t k = 0; k < d; k++)
                        g += x[i * d + k] * x[j * d + k];
                    P.mem[0][i * n + j] = g / (double)d;
                }
        } else {
            P.mem[0] = random_psd(n, 4, &s);
            nd->M = P.mem[0];
        }
        P.nn = 1;
        const int len = 3 + (int)(rng_next(&s) % 5);
        for (int k = 1; k <= len; k++) {
            nd = &P.node[k];
            nd->line = 20 + k;
            nd->col = 3;
            snprintf(nd->name, sizeof nd->name, "n%d", k);
            int kind = k == 1 ? 0 : (int)(rng_next(&s) % 3); /* the leaf's reader: taps */
            if (kind == 0) {
                nd->op = NSR_EW_CONV;
                nd->arg = k - 1;
                nd->phi = k > 1 && rng_next(&s) % 3 ? phis[rng_next(&s) % 4] : NULL;
                nd->alpha = (0.8 + unif(&s)) / (double)(kh * kw);
                nd->rows = R, nd->cols = C, nd->kh = kh, nd->kw = kw;
                nd->pad = circ ? TPK_CNN_CIRCULAR : TPK_CNN_ZERO;
            } else if (kind == 1) {
                nd->op = NSR_EW_PHI;
                nd->arg = k - 1;
                nd->phi = phis[rng_next(&s) % 4];
                nd->alpha = 0.5 + unif(&s);
                nd->beta = 0.1 * unif(&s);
            } else {
                nd->op = NSR_EW_SUM;
                nd->nt = 2;
                nd->t[0] = (nsr_ew_term){.arg = k - 1, .c = 0.7 + unif(&s)};
                if (rng_next(&s) % 2) {
                    P.w[k][0] = malloc(n * sizeof(double));
                    for (size_t i = 0; i < n; i++)
                        P.w[k][0][i] = 0.5 + unif(&s);
                    nd->t[0].w = P.w[k][0];
                }
                nd->t[1] = (nsr_ew_term){.arg = -1, .c = 1.0};
                P.s[k][1] = malloc(m * sizeof(double));
                if (rng_next(&s) % 2) { /* bias members read at several positions: one at
                                           * every position (a CNN layer's), or a few */
                    const int shared = rng_next(&s) % 2;
                    P.cls[k][1] = calloc(m, sizeof(int));
                    nd->t[1].cls = P.cls[k][1];
                    for (size_t p = 0; p < m; p++) {
                        P.cls[k][1][p] = shared ? 0 : (int)(rng_next(&s) % 3) - 1;
                        P.s[k][1][p] = P.cls[k][1][p] < 0 ? 0.0 : 0.3 + 0.1 * P.cls[k][1][p];
                    }
                } else {
                    for (size_t p = 0; p < m; p++)
                        P.s[k][1][p] = 0.2 * unif(&s);
                }
                nd->t[1].s = P.s[k][1];
            }
            if (nd->op == NSR_EW_CONV) {
                double *src = P.mem[k - 1], *tmp = NULL;
                if (nd->phi != NULL) {
                    tmp = malloc(n * n * sizeof *tmp);
                    assert_int_equal(tpk_gauss_map_affine(nd->phi, src, n, 1.0, 0.0, tmp, ws, NULL,
                                                          &ctx), TPK_OK);
                    src = tmp;
                }
                P.mem[k] = malloc(n * n * sizeof(double));
                ref_conv(src, N, R, C, kh, kw, circ, nd->alpha, P.mem[k]);
                free(tmp);
            } else {
                reference(&P, k, ws);
            }
            P.nn = k + 1;
        }
        for (int k = 0; k < P.nn; k++) { /* the closed diagonals */
            P.diag[k] = malloc(n * sizeof(double));
            assert_int_equal(nsr_ew_diag(P.node, k, n, (long)m, ws, "t.nsr", P.diag[k], NULL, &ctx),
                             TPK_OK);
            P.node[k].diag = P.diag[k];
        }
        const int root = P.nn - 1;
        assert_true(nsr_ew_pairwise(P.node, root));
        const double *Ref = P.mem[root];
        double scale = 0;
        for (size_t i = 0; i < n * n; i++)
            scale = fmax(scale, fabs(Ref[i]));
        for (size_t i = 0; i < n; i++)
            if (fabs(P.diag[root][i] - Ref[i * n + i]) > 1e-12 * scale)
                fail_msg("pair program %d: diagonal %zu: %.17g, reference %.17g", r, i,
                         P.diag[root][i], Ref[i * n + i]);
        double *out = malloc(n * n * sizeof *out);
        for (int full = 0; full < 2; full++) {
            for (size_t i = 0; i < n * n; i++)
                out[i] = NAN;
            double err = -1;
            nsr_ew_stats st;
            if (nsr_ew_eval(P.node, P.nn, root, n, (long)m, NSR_PLAN_OPTIMAL, ws, NULL, "t.nsr",
                            NULL, out, 1, full, &err, &st, &ctx) != TPK_OK)
                fail_msg("pair program %d: %s", r, ctx.msg);
            assert_true(err >= 0);
            assert_int_equal(st.nkernels, 1);
            for (size_t a = 0; a < n; a++)
                for (size_t c = 0; c < (full ? n : a + 1); c++)
                    /* two approximations of a map without a closed form (tanh, gelu) differ
                     * within their bounds; closed forms to rounding */
                    if (!(fabs(out[a * n + c] - Ref[a * n + c]) <= 1e-12 * scale + 2 * err))
                        fail_msg("pair program %d (%dx%d, %dx%d %s, full %d, err %g): entry (%zu,%zu) "
                                 "%.17g, reference %.17g", r, R, C, kh, kw, err,
                                 circ ? "circular" : "zero", full, a, c, out[a * n + c],
                                 Ref[a * n + c]);
        }
        /* the pooled readout, with a map and without */
        double *w = malloc(n * sizeof *w), K[36], *V = malloc(n * n * sizeof *V);
        for (size_t i = 0; i < n; i++)
            w[i] = unif(&s) / (double)m;
        for (int withphi = 0; withphi < 2; withphi++) {
            const nsr_ew_reduce red = {withphi ? phis[0] : NULL, 1.3, 0.2, w};
            double err = -1;
            if (nsr_ew_eval_pairs(P.node, P.nn, root, n, (long)m, ws, "t.nsr", NULL, K, 1, &red,
                                  &err, NULL, &ctx) != TPK_OK)
                fail_msg("pair program %d, pooled: %s", r, ctx.msg);
            if (withphi)
                assert_int_equal(tpk_gauss_map_affine(phis[0], Ref, n, 1.0, 0.0, V, ws, NULL, &ctx),
                                 TPK_OK);
            else
                memcpy(V, Ref, n * n * sizeof *V);
            double vs = 0;
            for (size_t i = 0; i < n * n; i++)
                vs = fmax(vs, fabs(V[i]));
            for (size_t a = 0; a < N; a++)
                for (size_t c = 0; c < N; c++) {
                    double want = 0;
                    for (size_t p = 0; p < m; p++)
                        for (size_t q = 0; q < m; q++)
                            want += w[a * m + p] * w[c * m + q] * V[(a * m + p) * n + c * m + q];
                    want = 1.3 * want + 0.2;
                    if (!(fabs(K[a * N + c] - want) <= 1e-12 * (vs + 1) + 2.6 * err))
                        fail_msg("pair program %d, pooled (map %d): (%zu,%zu) %.17g, want %.17g",
                                 r, withphi, a, c, K[a * N + c], want);
                }
        }
        free(w);
        free(V);
        free(out);
        free(x);
        prog_free(&P);
    }
    /* a pair block that is not PSD: the map's error names its statement and the pair */
    {
        const size_t N = 2, m = 4, n = N * m;
        double *M = random_psd(n, 3, &(uint64_t){9});
        M[(1 * m + 2) * n + 0 * m + 1] = 5.0; /* |S_pq| > √(S_pp S_qq) in pair (2, 1) */
        prog P;
        memset(&P, 0, sizeof P);
        P.nn = 2;
        P.node[0] = (nsr_ew_node){.op = NSR_EW_LEAF, .M = M, .name = "leaf"};
        P.node[1] = (nsr_ew_node){.op = NSR_EW_CONV, .arg = 0, .phi = phis[0], .alpha = 0.5,
                                  .rows = 2, .cols = 2, .kh = 1, .kw = 1,
                                  .pad = TPK_CNN_CIRCULAR, .name = "conv", .line = 7, .col = 9};
        for (int k = 0; k < 2; k++) {
            P.diag[k] = malloc(n * sizeof(double));
            assert_int_equal(nsr_ew_diag(P.node, k, n, (long)m, ws, "t.nsr", P.diag[k], NULL, &ctx),
                             TPK_OK);
            P.node[k].diag = P.diag[k];
        }
        double out[64];
        int rc = nsr_ew_eval(P.node, 2, 1, n, (long)m, NSR_PLAN_OPTIMAL, ws, NULL, "t.nsr", NULL,
                             out, 1, 0, NULL, NULL, &ctx);
        print_message("non-PSD pair block: %s\n", ctx.msg);
        assert_int_equal(rc, TPK_EDOM);
        assert_non_null(strstr(ctx.msg, "t.nsr:7:9: "));
        assert_non_null(strstr(ctx.msg, "(in the block of inputs 2 and 1)"));
        free(M);
        P.mem[0] = NULL;
        prog_free(&P);
    }
}

/* Linear readouts of sums of independent blocks, some pending (a LayerNorm's output plus a
 * second embedding; with an output bias where each input has one output, without where it has
 * several): the readout is the plan's last node (its report names it), and the kernel equals the
 * unrolled evaluator's under both plans. */
static void test_linear_readouts(void **state)
{
    (void)state;
    static const char *src[] = {
        "use netsor+\nwidth n\ninput x : d\nA W0 : (n, d) ~ 1.5\nA W2 : (n, d) ~ 0.7\n"
        "A W1 : (n, n) ~ 2.0\nG b : n ~ N(0, 0.3)\ng = W0 x\nh = W1 relu(g) + b\n"
        "scalar mu = mean(h)\nscalar v = mean((h - mu)^2)\nz = (h - mu) / sqrt(v + 1e-9)\n"
        "u = W2 x\noutput y = readout(0.5 * z + u, 1.3, 0.4)\n",
        "use netsor+\nparam T = 3\nwidth n\ninput x[t in 1..T] : d\nA W0 : (n, d) ~ 1.5\n"
        "A W2 : (n, d) ~ 0.7\nA W1 : (n, n) ~ 2.0\ng[i in 1..T] = W0 x[i]\n"
        "h[i in 1..T] = W1 tanh(g[i])\nscalar v[i in 1..T] = mean(h[i]^2)\n"
        "z[i in 1..T] = h[i] / sqrt(v[i] + 1e-9)\nu[i in 1..T] = W2 x[i]\n"
        "output y[i in 1..T] = readout(z[i] - 2 * u[i], 0.8)\n",
    };
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_job_registry(&ctx);
    for (size_t c = 0; c < sizeof src / sizeof src[0]; c++) {
        tpk_program *p = tpk_netsor_load_string("readout.nsr", src[c], NULL, reg, &ctx);
        if (p == NULL)
            fail_msg("program %zu: %s", c, ctx.msg);
        const size_t N = 19, T = c == 0 ? 1 : 3, d = 4;
        size_t dims[3] = {N, T, d};
        tpk_array *X = c == 0 ? tpk_array_alloc2(N, d, &ctx) : tpk_array_alloc(3, dims, &ctx);
        uint64_t s = 11 + c;
        for (size_t i = 0; i < N * T * d; i++)
            X->data[i] = 2 * unif(&s) - 1;
        tpk_array *K[3];
        char name[32];
        snprintf(name, sizeof name, "program %zu", c);
        char *rep = three_ways(p, X, 1, K, 1e-10, name);
        const size_t n = N * T;
        assert_int_equal(K[1]->dims[0], n);
        for (size_t i = 0; i < n * n; i++) /* both triangles */
            assert_true(K[1]->data[i] == K[1]->data[(i % n) * n + i / n]);
        if (!strstr(rep, "plan (optimal) of readout@"))
            fail_msg("program %zu: %s", c, rep);
        free(rep);
        for (int k = 0; k < 3; k++)
            tpk_array_free(K[k]);
        tpk_array_free(X);
        tpk_program_free(p);
    }
    tpk_phi_registry_free(reg);
}

/* tpk_gauss_segmap against the whole-matrix map, with zero-variance rows (scalar fix-ups) and
 * segments that cross the diagonal; the error of a non-PSD entry names it. */
static void test_segmap(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_job_registry(&ctx);
    tpk_gauss_ws *ws = tpk_gauss_ws_alloc(TPK_GAUSS_DEFAULT_DEGREE, &ctx);
    uint64_t s = 99;
    size_t n = 11;
    double *M = random_psd(n, 4, &s), *R = malloc(n * n * sizeof *R), q[11], row[11];
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            if (i == 2 || j == 2 || i == 7 || j == 7)
                M[i * n + j] = 0; /* inputs 2 and 7: zero variance */
    for (size_t i = 0; i < n; i++)
        q[i] = M[i * n + i];
    /* φ(0) = 0 (zero-variance entries exactly 0) and φ(0) ≠ 0 (erf_sigmoid, cos, softplus: a
     * value per index), closed forms, vector kernels and series */
    static const char *const names[] = {"relu", "erf", "tanh", "step", "sin", "erf_sigmoid", "cos",
                                        "softplus"};
    for (size_t f = 0; f < sizeof names / sizeof names[0]; f++) {
        tpk_phi *phi = tpk_phi_alloc(reg, names[f], &ctx);
        assert_non_null(phi);
        assert_int_equal(tpk_gauss_map(phi, M, n, R, ws, NULL, &ctx), TPK_OK);
        tpk_gauss_segmap *sm = tpk_gauss_segmap_alloc(phi, q, n, ws, &ctx);
        assert_non_null(sm);
        double maxr = 0, errmax = 0, e = -1;
        for (size_t i = 0; i < n; i++) {
            /* two segments per row: [0, 3) and [3, i] */
            size_t cut = i < 3 ? i + 1 : 3;
            tpk_gauss_segmap_row(sm, i, 0, cut, M + i * n, row, &maxr, &errmax);
            if (i + 1 > cut)
                tpk_gauss_segmap_row(sm, i, cut, i + 1 - cut, M + i * n + cut, row + cut, &maxr,
                                     &errmax);
            for (size_t j = 0; j <= i; j++)
                if (fabs(row[j] - R[i * n + j]) > 1e-13 * (1 + fabs(R[i * n + j])))
                    fail_msg("%s (%zu,%zu): %.17g vs %.17g", names[f], i, j, row[j], R[i * n + j]);
        }
        /* bands (i0 + t, j0 + t), the flatten CNN's pairs, a zero variance among them, and the
         * diagonal both as a band and whole */
        double kb[11], diag[11];
        static const size_t bands[][3] = {{5, 0, 6}, {1, 0, 10}, {6, 2, 5}, {0, 0, 11}, {3, 3, 5}};
        for (size_t b = 0; b < sizeof bands / sizeof bands[0]; b++) {
            const size_t i0 = bands[b][0], j0 = bands[b][1], len = bands[b][2];
            for (size_t t = 0; t < len; t++)
                kb[t] = M[(i0 + t) * n + j0 + t];
            tpk_gauss_segmap_band(sm, i0, j0, len, kb, kb, &maxr, &errmax); /* in place */
            for (size_t t = 0; t < len; t++) {
                const double want = R[(i0 + t) * n + j0 + t];
                if (fabs(kb[t] - want) > 1e-13 * (1 + fabs(want)))
                    fail_msg("%s band (%zu,%zu): %.17g vs %.17g", names[f], i0 + t, j0 + t, kb[t],
                             want);
            }
        }
        assert_int_equal(tpk_gauss_segmap_diagonal(sm, diag, &ctx), TPK_OK);
        for (size_t i = 0; i < n; i++)
            if (fabs(diag[i] - R[i * n + i]) > 1e-13 * (1 + fabs(R[i * n + i])))
                fail_msg("%s diagonal %zu: %.17g vs %.17g", names[f], i, diag[i], R[i * n + i]);
        tpk_gauss_segmap_merge(sm, maxr, errmax);
        assert_int_equal(tpk_gauss_segmap_finish(sm, &e, &ctx), TPK_OK);
        assert_true(e >= 0 && e < 1e-8);
        /* a band entry beyond √(q_i q_j): reported with its entry */
        double bb[2] = {M[7 * n + 2], 2 * sqrt(q[8] * q[3]) + 1};
        tpk_gauss_segmap_band(sm, 7, 2, 2, bb, bb, &maxr, &errmax);
        tpk_ctx_clear(&ctx);
        assert_int_not_equal(tpk_gauss_segmap_finish(sm, NULL, &ctx), TPK_OK);
        if (!strstr(ctx.msg, "(8,3)"))
            fail_msg("%s: %s", names[f], ctx.msg);
        tpk_gauss_segmap_reset(sm);
        tpk_ctx_clear(&ctx);
        /* a covariance beyond √(q_i q_j): recorded, then reported with its entry */
        double bad = 2 * sqrt(q[4] * q[1]) + 1;
        tpk_gauss_segmap_row(sm, 4, 1, 1, &bad, row, &maxr, &errmax);
        tpk_ctx_clear(&ctx);
        assert_int_not_equal(tpk_gauss_segmap_finish(sm, NULL, &ctx), TPK_OK);
        if (!strstr(ctx.msg, "(4,1)"))
            fail_msg("%s: %s", names[f], ctx.msg);
        tpk_gauss_segmap_reset(sm); /* the failure forgotten, the preparation kept */
        tpk_ctx_clear(&ctx);
        tpk_gauss_segmap_row(sm, 4, 1, 1, M + 4 * n + 1, row, &maxr, &errmax);
        assert_true(fabs(row[0] - R[4 * n + 1]) <= 1e-13 * (1 + fabs(R[4 * n + 1])));
        assert_int_equal(tpk_gauss_segmap_finish(sm, NULL, &ctx), TPK_OK);
        tpk_gauss_segmap_free(sm);
        tpk_phi_free(phi);
    }
    tpk_ctx_clear(&ctx);
    assert_null(tpk_gauss_segmap_alloc(NULL, q, n, ws, &ctx));
    assert_int_equal(ctx.status, TPK_EINVAL);
    free(M);
    free(R);
    tpk_gauss_ws_free(ws);
    tpk_phi_registry_free(reg);
}

static void test_cli(void **state)
{
    (void)state;
    const char *bin = getenv("TPK_BIN") ? getenv("TPK_BIN") : "build/bin";
    static char out[1 << 16];
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s/netsor plan programs/mlp-ln-residual.nsr --set L=3 --inputs=40 "
             "--plan=both 2>&1", bin);
    assert_int_equal(tu_capture(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "# naive plan\nplan (naive) of readout@"));
    assert_non_null(strstr(out, "# optimal plan\nplan (optimal) of readout@"));
    assert_non_null(strstr(out, "kernel 40 x 40 in "));
    assert_non_null(strstr(out, "max relative difference 0\n"));
    snprintf(cmd, sizeof cmd, "%s/netsor plan programs/mlp.nsr --input=data/demo-inputs.csv 2>&1",
             bin);
    assert_int_equal(tu_capture(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "kernel 48 x 48 in "));
    /* --verify: every candidate of every plan exactly in Z_p first (§7.2) */
    snprintf(cmd, sizeof cmd, "%s/netsor plan programs/mlp-ln-residual.nsr --set L=2 --inputs=30 "
             "--verify 2>&1", bin);
    assert_int_equal(tu_capture(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "exact check of readout@"));
    assert_non_null(strstr(out, "all equal to the reference"));
    /* usage errors: a bad plan, options it does not take, its options elsewhere */
    static const char *const bad[] = {"plan programs/mlp.nsr --plan=fast",
                                      "plan programs/mlp.nsr --output=x.h5",
                                      "plan programs/mlp.nsr --inputs=0",
                                      "plan programs/mlp.nsr --inputs=8 --input=data/demo-inputs.csv",
                                      "check programs/mlp.nsr --plan=naive",
                                      "kernel programs/mlp.nsr --verify"};
    /* a program or an input that cannot be read: 1, with the reason */
    snprintf(cmd, sizeof cmd, "%s/netsor plan programs/missing.nsr 2>&1", bin);
    assert_int_equal(tu_capture(cmd, out, sizeof out), 1);
    assert_non_null(strstr(out, "missing.nsr"));
    snprintf(cmd, sizeof cmd, "%s/netsor plan programs/mlp.nsr --input=missing.csv 2>&1", bin);
    assert_int_equal(tu_capture(cmd, out, sizeof out), 1);
    assert_non_null(strstr(out, "missing.csv"));
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s/netsor %s 2>&1", bin, bad[i]);
        if (tu_capture(cmd, out, sizeof out) != 2)
            fail_msg("netsor %s: %s", bad[i], out);
    }
    /* a bad TPK_PLAN: an error before any work, no output file, also for a direct recursion */
    char tmp[] = "/tmp/tpk-ewplan-XXXXXX";
    assert_non_null(mkdtemp(tmp));
    snprintf(cmd, sizeof cmd, "TPK_PLAN=fastest %s/gpkernel --arch=transformer --output=%s/k.h5 "
             "2>&1", bin, tmp);
    assert_int_equal(tu_capture(cmd, out, sizeof out), 1);
    assert_non_null(strstr(out, "TPK_PLAN=fastest: expected naive or optimal"));
    char path[64];
    snprintf(path, sizeof path, "%s/k.h5", tmp);
    assert_int_equal(access(path, F_OK), -1);
    snprintf(cmd, sizeof cmd, "TPK_PLAN=naive %s/gpkernel --arch=mlp --layernorm --output=%s/k.h5 "
             "--quiet 2>&1", bin, tmp);
    assert_int_equal(tu_capture(cmd, out, sizeof out), 0);
    remove(path);
    rmdir(tmp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_random_programs, phis_setup, phis_teardown),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_segmap),
        cmocka_unit_test(test_calibration),
        cmocka_unit_test(test_plan_env),
        cmocka_unit_test(test_programs),
        cmocka_unit_test(test_linear_readouts),
        cmocka_unit_test_setup_teardown(test_exact_verification, phis_setup, phis_teardown),
        cmocka_unit_test_setup_teardown(test_pair_programs, phis_setup, phis_teardown),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
