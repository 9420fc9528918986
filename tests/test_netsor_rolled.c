/* Rolled NETSOR (issue 14): the rolled form and its evaluator (netsor/roll.c, netsor/flimit.c)
 * against the unrolled evaluator on every shipped program, against an independent matrix
 * recursion of the transformer written out here (theory.md §2.7; GP4A's way), and the checks
 * that elaboration does not grow with T and that errors keep their file:line:col. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpk/tpk.h"
#include "support/testutil.h"
#include "../netsor/backend-impl.h"

static const double PI = 3.14159265358979323846;

/* Same closed forms on both sides, different order of summation. */
#define TOL_SAME 1e-14

static tpk_array *random_inputs(size_t N, size_t T, size_t d, uint64_t seed)
{
    return tu_normal_inputs(N, T, d, seed);
}

static tpk_program *load(const tu_phis *f, const char *rel, const tpk_param_set *sets, int n)
{
    return tu_load_shipped(f->reg, rel, sets, n);
}

static double max_abs(const double *v, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(v[i]));
    return m;
}

/* Kernel by the rolled and by the unrolled evaluator; returns max |difference| / max |K|. */
static double rolled_vs_unrolled(const tpk_program *p, const tpk_array *x)
{
    tpk_array *A = NULL, *B = NULL;
    tpk_limit_opts o = {0};
    tpk_ctx c1, c2;
    tpk_ctx_init(&c1);
    tpk_ctx_init(&c2);
    int s1 = tpk_netsor_kernel_ex(p, x, 1, NULL, &A, NULL, &c1);
    o.unrolled = 1;
    int s2 = tpk_netsor_kernel_ex(p, x, 1, &o, &B, NULL, &c2);
    if (s1 || s2)
        print_message("%s | %s\n", c1.msg, c2.msg);
    assert_int_equal(s1, TPK_OK);
    assert_int_equal(s2, TPK_OK);
    assert_int_equal(tpk_array_size(A), tpk_array_size(B));
    double d = 0;
    for (size_t i = 0; i < tpk_array_size(A); i++)
        d = fmax(d, fabs(A->data[i] - B->data[i]));
    d /= max_abs(B->data, tpk_array_size(B));
    tpk_array_free(A);
    tpk_array_free(B);
    return d;
}

/* Every shipped program at a small size (rolled: whether the limit evaluator takes the rolled
 * form; the others fall back to the unrolled form); the rolled ones give the same kernel, bit
 * for bit, under both entrywise plans (TPK_PLAN). */
static const struct shipped {
    const char *path;
    size_t T, d;
    int rolled;
    tpk_param_set set[4];
    int nset;
} shipped_cases[] = {
    {"programs/mlp.nsr", 1, 4, 1, {{0}}, 0},
    {"programs/mlp.nsr", 1, 4, 1, {{"phi", "erf"}, {"sigma_b2", "0.3"}}, 2},
    {"programs/mlp-residual.nsr", 1, 4, 1, {{0}}, 0},
    {"programs/mlp-ln.nsr", 1, 4, 1, {{0}}, 0},
    {"programs/layernorm-mlp.nsr", 1, 4, 1, {{0}}, 0},
    {"programs/mlp-ln-residual.nsr", 1, 4, 1, {{0}}, 0},
    /* biases: the residual stream becomes a block of its own at 3 terms, its bias members
     * (b[1..l]) independent of the later ones (b[l+1]) */
    {"programs/mlp-residual.nsr", 1, 4, 1, {{"sigma_b2", "0.2"}, {"L", "5"}}, 2},
    {"programs/mlp-ln-residual.nsr", 1, 4, 1,
     {{"sigma_b2", "0.13"}, {"L", "6"}, {"alpha", "0.6"}}, 3},
    {"programs/transformer.nsr", 5, 3, 1, {{"var_b", "0.3"}, {"temp", "0.7"}}, 2},
    {"programs/transformer.nsr", 4, 2, 1, {{"L", "3"}, {"eps", "0.01"}}, 2},
    {"programs/cnn1d.nsr", 6, 2, 1, {{"sigma_b2", "0.2"}}, 1},
    {"programs/cnn1d.nsr", 6, 2, 1, {{"circular", "0"}, {"k", "4"}}, 2},
    {"programs/cnn2d.nsr", 9, 2, 1, {{0}}, 0},
    {"programs/cnn2d.nsr", 20, 2, 1,
     {{"rows", "4"}, {"cols", "5"}, {"circular", "0"}}, 3},
    /* φ fused into the taps with a map other than ReLU's, and a bias (flimit.c conv_lowering) */
    {"programs/cnn2d.nsr", 12, 3, 1,
     {{"rows", "3"}, {"cols", "4"}, {"phi", "erf"}, {"sigma_b2", "0.3"}}, 4},
    {"programs/rnn.nsr", 4, 3, 0, {{0}}, 0},
    {"programs/rnn_untied.nsr", 4, 3, 0, {{0}}, 0},
    {"programs/gru.nsr", 3, 2, 0, {{0}}, 0},
    {"programs/lstm.nsr", 3, 2, 0, {{0}}, 0},
    {"programs/attention.nsr", 4, 3, 1, {{0}}, 0},
    {"programs/attention.nsr", 4, 3, 1, {{"causal", "1"}, {"heads", "3"}}, 2},
    {"programs/batchnorm.nsr", 1, 4, 0, {{0}}, 0},
};

static tpk_program *load_case(const tu_phis *f, const struct shipped *c)
{
    tpk_param_set sets[4];
    int n = c->nset;
    memcpy(sets, c->set, sizeof c->set);
    char tbuf[32];
    if (c->T > 1 && strstr(c->path, "cnn2d") == NULL) {
        snprintf(tbuf, sizeof tbuf, "%zu", c->T);
        sets[n++] = (tpk_param_set){"T", tbuf};
    }
    return load(f, c->path, sets, n);
}

static void test_shipped_programs(void **state)
{
    const tu_phis *f = *state;
    for (size_t c = 0; c < sizeof shipped_cases / sizeof shipped_cases[0]; c++) {
        tpk_program *p = load_case(f, &shipped_cases[c]);
        int rolled = tpk_program_limit_rolled(p);
        if (rolled != shipped_cases[c].rolled)
            print_message("%s: rolled form %s\n", shipped_cases[c].path, rolled ? "kept" : "dropped");
        assert_int_equal(rolled, shipped_cases[c].rolled);
        assert_true(p->ninstr > 0); /* small: the unrolled form exists too */
        tpk_array *x = random_inputs(3, shipped_cases[c].T, shipped_cases[c].d, 100 + c);
        double d = rolled_vs_unrolled(p, x);
        print_message("%-28s rolled %d: |rolled - unrolled| / max|K| = %.2e\n", shipped_cases[c].path,
                      rolled, d);
        assert_true(d <= TOL_SAME);
        if (rolled) { /* the entrywise plans (docs/orchestration.md §7): the same kernel */
            tpk_array *Kn = NULL, *Ko = NULL;
            tpk_ctx ctx;
            tpk_ctx_init(&ctx);
            assert_int_equal(tpk_netsor_kernel_plan(p, x, 1, TPK_PLAN_NAIVE, NULL, &Kn, NULL, &ctx),
                             TPK_OK);
            assert_int_equal(tpk_netsor_kernel_plan(p, x, 1, TPK_PLAN_OPTIMAL, NULL, &Ko, NULL,
                                                    &ctx), TPK_OK);
            assert_int_equal(tpk_array_size(Kn), tpk_array_size(Ko));
            if (strstr(shipped_cases[c].path, "cnn") != NULL) {
                /* pair programs (netsor/ewpair.c): the optimal plan's maps read the diagonals of
                 * the closed diagonal recursion, the naive plan's (one convolution a statement)
                 * the matrices' own — equal up to rounding, not bit for bit */
                double dmax = 0, kmax = 0;
                for (size_t i = 0; i < tpk_array_size(Kn); i++) {
                    dmax = fmax(dmax, fabs(Kn->data[i] - Ko->data[i]));
                    kmax = fmax(kmax, fabs(Kn->data[i]));
                }
                print_message("  naive vs optimal (pairs): %.2e relative\n", dmax / kmax);
                assert_true(dmax <= 1e-13 * kmax);
            } else {
                assert_memory_equal(Kn->data, Ko->data, tpk_array_size(Kn) * sizeof *Kn->data);
            }
            tpk_array_free(Kn);
            tpk_array_free(Ko);
        }
        tpk_array_free(x);
        tpk_program_free(p);
    }
}

/* ---- the transformer of programs/transformer.nsr as whole matrices (independent) ---------- */

/* E[relu(u) relu(v)] for (u, v) ~ N(0, [[a, k], [k, b]]) (arc-cosine kernel of degree 1). */
static double relu2(double a, double b, double k)
{
    double s = sqrt(a * b);
    if (s == 0)
        return 0;
    double r = fmax(-1.0, fmin(1.0, k / s)), t = acos(r);
    return s / (2 * PI) * (sin(t) + (PI - t) * r);
}

/* LN of a Gaussian block in place: Σ ← D Σ D, D = diag(1/√(diag Σ + eps)) (zero means). */
static void ln_block(double *S, size_t n, double eps)
{
    double *d = malloc(n * sizeof *d);
    for (size_t i = 0; i < n; i++)
        d[i] = 1 / sqrt(S[i * n + i] + eps);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            S[i * n + j] *= d[i] * d[j];
    free(d);
}

/* K over (sequence, token): embedding, then per layer causal softmax attention with
 * query = key = value, residual, LN, ReLU feed-forward with biases, residual, LN. */
static double *transformer_matrices(const tpk_array *x, int L, double var_e, double var_u,
                                    double var_w, double var_b, double temp, double eps)
{
    size_t N = x->dims[0], T = x->dims[1], d = x->dims[2], n = N * T;
    double *Z = calloc(n * n, sizeof *Z), *K = calloc(n * n, sizeof *K), *R = calloc(n * n, sizeof *R);
    double *B = calloc(N * T * T, sizeof *B);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            double s = 0;
            for (size_t q = 0; q < d; q++)
                s += x->data[i * d + q] * x->data[j * d + q];
            Z[i * n + j] = var_e * s / (double)d;
        }
    for (int l = 0; l < L; l++) {
        for (size_t i = 0; i < n * n; i++)
            K[i] = var_u * Z[i];
        /* B_a = I + A_a, A_a the causal softmax of K(a,a)/temp */
        for (size_t a = 0; a < N; a++)
            for (size_t i = 0; i < T; i++) {
                double *row = B + (a * T + i) * T, mx = -INFINITY, z = 0;
                for (size_t j = 0; j <= i; j++)
                    mx = fmax(mx, K[(a * T + i) * n + a * T + j] / temp);
                for (size_t j = 0; j < T; j++)
                    row[j] = j <= i ? exp(K[(a * T + i) * n + a * T + j] / temp - mx) : 0;
                for (size_t j = 0; j <= i; j++)
                    z += row[j];
                for (size_t j = 0; j <= i; j++)
                    row[j] /= z;
                row[i] += 1;
            }
        /* R = B K Bᵀ, block by block */
        for (size_t a = 0; a < N; a++)
            for (size_t c = 0; c < N; c++)
                for (size_t i = 0; i < T; i++)
                    for (size_t j = 0; j < T; j++) {
                        double s = 0;
                        for (size_t p = 0; p < T; p++)
                            for (size_t q = 0; q < T; q++)
                                s += B[(a * T + i) * T + p] * K[(a * T + p) * n + c * T + q] *
                                     B[(c * T + j) * T + q];
                        R[(a * T + i) * n + c * T + j] = s;
                    }
        ln_block(R, n, eps); /* h */
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n; j++) { /* q = W2 relu(W1 h + b1) + b2 + h */
                double a = var_w * R[i * n + i] + var_b, b = var_w * R[j * n + j] + var_b;
                double k = var_w * R[i * n + j] + var_b;
                Z[i * n + j] = var_w * relu2(a, b, k) + var_b + R[i * n + j];
            }
        ln_block(Z, n, eps);
    }
    free(K), free(R), free(B);
    return Z;
}

static void test_transformer_independent(void **state)
{
    const tu_phis *f = *state;
    const size_t N = 2, T = 24, d = 5;
    tpk_param_set s[] = {{"T", "24"}, {"L", "2"}, {"var_b", "0.2"}, {"temp", "1.5"},
                         {"eps", "0.001"}};
    tpk_program *p = load(f, "programs/transformer.nsr", s, 5);
    assert_true(tpk_program_family_instructions(p) > 0);
    tpk_array *x = random_inputs(N, T, d, 7);
    tpk_array *K = NULL;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_netsor_kernel(p, x, 1, &K, NULL, &ctx), TPK_OK);
    double *R = transformer_matrices(x, 2, 1.0, 1.0, 1.0, 0.2, 1.5, 0.001);
    double e = 0;
    for (size_t i = 0; i < N * T * N * T; i++)
        e = fmax(e, fabs(K->data[i] - R[i]));
    print_message("transformer N=2 T=24: rolled vs matrix recursion %.2e\n", e);
    assert_true(e <= 1e-12 * max_abs(R, N * T * N * T));
    free(R);
    tpk_array_free(K);
    tpk_array_free(x);
    tpk_program_free(p);
}

/* The rolled form's size is the text's, not T's: the same family instructions at T = 20 and
 * T = 2000 (where only the rolled form is kept, the unrolled one would be millions of steps). */
static void test_elaboration_scale(void **state)
{
    const tu_phis *f = *state;
    tpk_param_set small[] = {{"T", "20"}, {"L", "24"}}, large[] = {{"T", "2000"}, {"L", "24"}};
    tpk_program *a = load(f, "programs/transformer.nsr", small, 2);
    tpk_program *b = load(f, "programs/transformer.nsr", large, 2);
    assert_int_equal(tpk_program_family_instructions(a), tpk_program_family_instructions(b));
    assert_int_equal(b->ninstr, 0);
    assert_int_equal(b->noutputs, 2000);
    assert_string_equal(b->output[1999].name, "y[2000]");
    /* the rolled executor runs the rolled-only program: a correlation kernel (eps ≈ 0) */
    tpk_array *x = random_inputs(1, 2000, 2, 3), *Kh = NULL;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_netsor_run(b, x, 8, 1, 0, &Kh, NULL, &ctx), TPK_OK);
    assert_int_equal(tpk_array_size(Kh), 1);
    assert_true(fabs(Kh->data[0] - 1.0) < 1e-6);
    tpk_array_free(Kh);
    tpk_array_free(x);
    tpk_program_free(a);
    tpk_program_free(b);
}

/* A program whose unrolled size the estimate puts under the limit but whose unrolling passes it
 * (cnn2d, depth 6 on 28×28: every tap a statement) loads rolled-only, as one above the estimate
 * does; it failed to load before ("program too large after unrolling"). Depth 7, above the
 * estimate, for comparison. */
static void test_unrolled_past_the_estimate(void **state)
{
    const tu_phis *f = *state;
    for (int L = 6; L <= 7; L++) {
        char l[16];
        snprintf(l, sizeof l, "%d", L);
        tpk_param_set s[] = {{"L", l}, {"rows", "28"}, {"cols", "28"}};
        tpk_program *p = load(f, "programs/cnn2d.nsr", s, 3);
        assert_true(tpk_program_limit_rolled(p));
        assert_int_equal(p->ninstr, 0);
        assert_int_equal(p->noutputs, 784);
        tpk_program_free(p);
    }
}

/* Errors keep their position on the rolled form: a read past a family's members (found by the
 * plan, at T where only the rolled form is kept), softmax outside its range, and the grammar. */
static void test_errors(void **state)
{
    const tu_phis *f = *state;
    static const struct {
        const char *src, *want;
    } cases[] = {
        {"use netsor+\nparam T = 1500\nwidth n\ninput x[t in 1..T] : d\nA U : (n, d) ~ 1\n"
         "g[i in 1..T] = U x[i]\nscalar s[i in 1..T, j in 1..T] = mean(g[i] * g[j + 1])\n"
         "output y[i in 1..T] = readout(g[i], 1)\n",
         "<rolled>:7:46: g[1501] is read but not defined"},
        {"use netsor+\nparam T = 3\nwidth n\ninput x[t in 1..T] : d\nA U : (n, d) ~ 1\n"
         "g[i in 1..T] = U x[i]\nscalar s[i in 1..T] = softmax(j in 1..T: mean(g[j] * g[j]))\n"
         "output y[i in 1..T] = readout(g[i], 1)\n",
         "no enclosing loop or binder is named 'j'"},
        {"param T = 3\nwidth n\ninput x[t in 1..T] : d\nA U[i in 0..1] : (n, d) ~ 1\n"
         "g[i in 1..T] = sum(k in 0..1 U[k] x[i])\noutput y = readout(g[1], 1)\n",
         "<rolled>:5:39: expected ':' (or ',') after the range of sum(...)"},
        {"param T = 3\nwidth n\ninput x[t in 1..T] : d\nA U : (n, d) ~ 1\n"
         "g[i in 1..T] = U x[wrap(i, 1)]\noutput y = readout(g[1], 1)\n",
         "wrap takes three integers"},
        /* widths on a program kept only rolled (the unrolled form would be 6·10⁷ steps) */
        {"use netsor+\nparam T = 3000\nwidth n, m\ninput x[t in 1..T] : d\nA U : (n, d) ~ 1\n"
         "A W : (m, m) ~ 1\ng[i in 1..T] = U x[i]\n"
         "scalar s[i in 1..T, j in 1..i] = mean(g[i] * g[j])\nk[i in 1..T] = W g[i]\n"
         "output y[i in 1..T] = readout(k[i], 1)\n",
         "<rolled>:9:16: MatMul W\xc2\xb7g: W is A(m, m) (declared at line 6) but the source has "
         "width n; cannot unify m with n"},
        /* found by the fuzzer: a per-point coefficient failing in the rolled plan leaked the
         * values it had allocated (LeakSanitizer in make check-asan); T² pairs keep the program
         * rolled, so the plan is what sees the error */
        {"use netsor+\nparam T = 1500\nwidth n\ninput x[t in 1..T] : d\nA U : (n, d) ~ 1\n"
         "g[i in 1..T] = sum(k in 0..1: inside(i + k, T + 1, T) * U x[wrap(i + k, 1, T)])\n"
         "scalar s[i in 1..T, j in 1..T] = mean(g[i] * g[j])\n"
         "output y[i in 1..T] = readout(g[i], 1)\n",
         "<rolled>:6:31: inside(v, lo, hi) needs lo <= hi"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tpk_netsor_opts o = {.sets = NULL, .nsets = 0, .netsor_plus = 0, .explain = 0};
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        tpk_program *p = tpk_netsor_load_string("<rolled>", cases[c].src, &o, f->reg, &ctx);
        if (p != NULL || strstr(ctx.msg, cases[c].want) == NULL)
            print_message("case %zu: got '%s', want '%s'\n", c, ctx.msg, cases[c].want);
        assert_null(p);
        assert_non_null(strstr(ctx.msg, cases[c].want));
    }
}

/* A program from source that the rolled evaluator takes (it has family instructions). */
static tpk_program *load_rolled(const tu_phis *f, const char *name, const char *src)
{
    tpk_netsor_opts o = {.sets = NULL, .nsets = 0, .netsor_plus = 0, .explain = 0};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_program *p = tpk_netsor_load_string(name, src, &o, f->reg, &ctx);
    if (p == NULL)
        print_message("%s\n", ctx.msg);
    assert_non_null(p);
    assert_true(tpk_program_family_instructions(p) > 0);
    return p;
}

/* The new operations have the meaning the unrolled elaborator gives them: nested binders,
 * softmax rows, the padding arithmetic, two output families. (relu(r) of the attention output r
 * is left out: the unrolled evaluator integrates φ(Σ_j a_ij g_j) of six G-vars by Monte Carlo,
 * 1e-3, where the rolled one has the closed form of one Gaussian.) */
static void test_operations(void **state)
{
    const tu_phis *f = *state;
    const char *src =
        "use netsor+\nparam T = 6\nwidth n\ninput x[t in 1..T] : d\nA U : (n, d) ~ 1\n"
        "A F[i in 0..1, j in 0..2] : (n, n) ~ 0.5\n"
        "g[t in 1..T] = U x[t]\n"
        "scalar a[i in 1..T, j in 1..i] = softmax(j in 1..i: mean(g[i] * g[j]) / 2)\n"
        "H r[i in 1..T] = sum(j in 1..i: a[i, j] * g[j])\n"
        "h[i in 1..T] = sum(p in 0..1, q in 0..2: inside(i + p + q - 2, 1, T) * "
        "F[p, q] relu(g[wrap(i + p + q - 2, 1, T)]))\n"
        "output y[i in 1..T] = readout(h[i], 1)\n"
        "output z[i in 1..T] = readout(r[i], 2, 0.5)\n";
    tpk_program *p = load_rolled(f, "<ops>", src);
    tpk_array *x = random_inputs(3, 6, 2, 11);
    double dd = rolled_vs_unrolled(p, x);
    print_message("sum/softmax/wrap/inside: |rolled - unrolled| / max|K| = %.2e\n", dd);
    assert_true(dd <= TOL_SAME);
    tpk_array_free(x);
    tpk_program_free(p);
}

/* Found by the fuzzer: 0 · φ(g) in a sum with g (the zero term folds, as in the unrolled form;
 * before, the plan reported an unsupported correlated pair from past the last statement). */
static void test_zero_term(void **state)
{
    const tu_phis *f = *state;
    const char *src = "width n\ninput x : d\nA U : (n, d) ~ 1\ng = U x\nz[1] = erf_sigmoid(g)\n"
                      "mix = g + 0 * z[1]\noutput y = readout(mix, 1)\n";
    tpk_netsor_opts o = {.sets = NULL, .nsets = 0, .netsor_plus = 0, .explain = 0};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_program *p = tpk_netsor_load_string("<zero>", src, &o, f->reg, &ctx);
    assert_non_null(p);
    assert_true(tpk_program_family_instructions(p) > 0);
    tpk_array *x = random_inputs(4, 1, 3, 5);
    assert_true(rolled_vs_unrolled(p, x) <= TOL_SAME);
    tpk_array_free(x);
    tpk_program_free(p);
}

/* Blocks overwritten where they die (flimit.c): W·φ(g) + b maps in place into g's matrix, and
 * g = atom + b takes the atom's, where the plan says the source dies in that statement and the
 * statement reads it once; where it reads it again (g + W·φ(g), 0.5·g + W·φ(g), φ(g) twice) they
 * must not. The second program crashed the evaluator before (φ(g5) twice, g5 = atom + bias: the
 * first φ materialised g5 by taking the atom's matrix, the second read a NULL matrix as the
 * block's). Both against the unrolled evaluator. */
static void test_layer_in_place(void **state)
{
    const tu_phis *f = *state;
    const char *head = "width n\ninput x : d\nA U : (n, d) ~ 2\nA W2 : (n, n) ~ 2\n"
                       "A W3 : (n, n) ~ 1.5\nA W4 : (n, n) ~ 1\nA W5 : (n, n) ~ 1\n"
                       "A W6 : (n, n) ~ 1.2\nA W7 : (n, n) ~ 0.8\n"
                       "G b2 : n ~ N(0, 0.2)\nG b3 : n ~ N(0, 0.1)\n";
    const char *body[] = {
        "g1 = U x\ng2 = W2 relu(g1) + b2\ng3 = W3 relu(g2) + b3\n"
        "g4 = W4 relu(g3) + g3 + b2\ng5 = 0.5 * g4 + W5 relu(g4)\n"
        "g6 = W6 erf(g5) + W7 erf(g5)\noutput y = readout(relu(g6), 1, 0.1)\n",
        "g4 = U x\ng5 = W5 relu(g4) + b2\ng6 = W6 erf(g5) + W7 erf(g5)\n"
        "g7 = W3 relu(g6) + b3\noutput y = readout(relu(g7), 1, 0.1)\n",
    };
    for (size_t c = 0; c < sizeof body / sizeof body[0]; c++) {
        char src[2048];
        snprintf(src, sizeof src, "%s%s", head, body[c]);
        tpk_program *p = load_rolled(f, "<in-place>", src);
        tpk_array *x = random_inputs(24, 1, 3, 7 + (unsigned)c);
        double dd = rolled_vs_unrolled(p, x);
        print_message("blocks taken where they die, program %zu: |rolled - unrolled| / max|K| = "
                      "%.2e\n", c, dd);
        assert_true(dd <= TOL_SAME);
        tpk_array_free(x);
        tpk_program_free(p);
    }
}

/* A map that fails inside the convolution (φ fused into the taps, flimit.c conv_lowering) is the
 * program's error at the taps' statement, with no kernel: exp with σ_w² = 100 overflows at the
 * second layer. */
static void test_fused_map_error(void **state)
{
    const tu_phis *f = *state;
    tpk_param_set s[] = {{"rows", "4"}, {"cols", "4"}, {"L", "3"}, {"phi", "exp"},
                         {"sigma_w2", "100"}};
    tpk_program *p = load(f, "programs/cnn2d.nsr", s, 5);
    tpk_array *x = random_inputs(2, 16, 1, 5), *K = NULL;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    int st = tpk_netsor_kernel(p, x, 0, &K, NULL, &ctx);
    print_message("fused map overflow: %s\n", ctx.msg);
    assert_int_equal(st, TPK_ENUMERIC);
    assert_null(K);
    assert_non_null(strstr(ctx.msg, "cnn2d.nsr:43:"));
    assert_non_null(strstr(ctx.msg, "overflows"));
    tpk_array_free(x);
    tpk_program_free(p);
}

/* opts.append: a statement read after the file's (the CNN jobs' pooled readout) */
static void test_append(void **state)
{
    const tu_phis *f = *state;
    char path[1024];
    snprintf(path, sizeof path, "%s/programs/mlp.nsr", getenv("TPK_ROOT") ? getenv("TPK_ROOT") : ".");
    tpk_netsor_opts o = {.append = "output z = readout(h[1], 2.0)"};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_program *p = tpk_netsor_load_file(path, &o, f->reg, &ctx);
    assert_non_null(p);
    assert_int_equal(p->noutputs, 2);
    assert_string_equal(p->output[1].name, "z");
    assert_true(p->output[1].var == 2.0);
    tpk_program_free(p);
    o.append = "output z = readout(nothing, 1)";
    assert_null(tpk_netsor_load_file(path, &o, f->reg, &ctx));
    assert_non_null(strstr(ctx.msg, "mlp.nsr:"));
}

/* ---- the finite-width executor on families (netsor/fexec.c) ---------------------------------- */

/* max |a − b| / max |b| */
static double rel_diff(const tpk_array *a, const tpk_array *b)
{
    assert_int_equal(tpk_array_size(a), tpk_array_size(b));
    double d = 0;
    for (size_t i = 0; i < tpk_array_size(a); i++)
        d = fmax(d, fabs(a->data[i] - b->data[i]));
    return d / max_abs(b->data, tpk_array_size(b));
}

/* The rolled executor runs the same network as the unrolled one (weights keyed by member
 * name): the same K̂ and readouts up to rounding, on every shipped program. */
static void test_executor_shipped(void **state)
{
    const tu_phis *f = *state;
    const struct shipped extra = {"programs/attention-sqrtn.nsr", 4, 3, 0, {{"causal", "1"}}, 1};
    size_t ncase = sizeof shipped_cases / sizeof shipped_cases[0];
    for (size_t c = 0; c <= ncase; c++) {
        const struct shipped *cs = c < ncase ? &shipped_cases[c] : &extra;
        tpk_program *p = load_case(f, cs);
        tpk_array *x = random_inputs(3, cs->T, cs->d, 300 + c);
        tpk_array *K1 = NULL, *y1 = NULL, *K2 = NULL, *y2 = NULL;
        tpk_ctx c1, c2;
        tpk_ctx_init(&c1);
        tpk_ctx_init(&c2);
        int unsup = 0;
        int s1 = nsr_fexec_run(p, x, 48, 11, 1, &K1, &y1, &unsup, NULL, &c1);
        if (strstr(cs->path, "batchnorm") != NULL) { /* bn(...) stays with the unrolled one */
            assert_int_equal(s1, TPK_EUNSUPPORTED);
            assert_int_equal(unsup, 1);
            tpk_array_free(x);
            tpk_program_free(p);
            continue;
        }
        setenv("TPK_NETSOR_FORM", "unrolled", 1);
        int s2 = tpk_netsor_run(p, x, 48, 11, 1, &K2, &y2, &c2);
        unsetenv("TPK_NETSOR_FORM");
        if (s1 || s2)
            print_message("%s: %s | %s\n", cs->path, c1.msg, c2.msg);
        assert_int_equal(s1, TPK_OK);
        assert_int_equal(s2, TPK_OK);
        double dk = rel_diff(K1, K2), dy = rel_diff(y1, y2);
        print_message("%-28s executor rolled vs unrolled: K %.1e, y %.1e\n", cs->path, dk, dy);
        assert_true(dk <= 1e-13);
        assert_true(dy <= 1e-13);
        tpk_array_free(K1), tpk_array_free(K2), tpk_array_free(y1), tpk_array_free(y2);
        tpk_array_free(x);
        tpk_program_free(p);
    }
}

/* At T = 1000 (only the rolled form is kept) the finite-width kernel converges to the limit:
 * the relative error of K̂ over all 1000 token outputs falls like 1/√n (theory.md §1.5, the
 * Master Theorem's fluctuations), about 1/√8 from n = 64 to n = 512. */
static void test_executor_large_T(void **state)
{
    const tu_phis *f = *state;
    tpk_param_set s[] = {{"T", "1000"}, {"L", "2"}};
    tpk_program *p = load(f, "programs/transformer.nsr", s, 2);
    assert_int_equal(p->ninstr, 0);
    tpk_array *x = random_inputs(1, 1000, 6, 21), *K = NULL;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_netsor_kernel(p, x, 1, &K, NULL, &ctx), TPK_OK);
    double e[2];
    const size_t width[2] = {64, 512};
    for (int w = 0; w < 2; w++) {
        double s2 = 0;
        for (uint64_t seed = 1; seed <= 2; seed++) {
            tpk_array *Kh = NULL;
            assert_int_equal(tpk_netsor_run(p, x, width[w], seed, 1, &Kh, NULL, &ctx), TPK_OK);
            double num = 0, den = 0;
            for (size_t i = 0; i < tpk_array_size(K); i++) {
                num += (Kh->data[i] - K->data[i]) * (Kh->data[i] - K->data[i]);
                den += K->data[i] * K->data[i];
            }
            s2 += num / den;
            tpk_array_free(Kh);
        }
        e[w] = sqrt(s2 / 2);
        print_message("transformer T=1000: n = %zu, relative error of K-hat %.3f\n", width[w], e[w]);
    }
    assert_true(e[1] < 0.6 * e[0]);
    assert_true(e[1] < 0.25);
    tpk_array_free(K);
    tpk_array_free(x);
    tpk_program_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shipped_programs),
        cmocka_unit_test(test_transformer_independent),
        cmocka_unit_test(test_elaboration_scale),
        cmocka_unit_test(test_unrolled_past_the_estimate),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_operations),
        cmocka_unit_test(test_layer_in_place),
        cmocka_unit_test(test_fused_map_error),
        cmocka_unit_test(test_zero_term),
        cmocka_unit_test(test_append),
        cmocka_unit_test(test_executor_shipped),
        cmocka_unit_test(test_executor_large_T),
    };
    return cmocka_run_group_tests(tests, tu_phis_setup, tu_phis_teardown);
}
