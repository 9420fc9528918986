/* Descending loops and readouts of their own (docs/netsor.md "Loops" and "Outputs"): a loop
 * 'by -1' runs the network its ascending reindexing runs; readout(concat(a, b), ...) is the
 * readout of the stacked vector [a; b] of width 2n, so its kernel is the mean of the parts'
 * kernels (checked against the two directions of a bidirectional RNN computed as separate
 * programs); outputs of different readout vectors readout[u](...) are independent. The sampled
 * outputs are checked against their kernel: over many seeds, E[y y'] is the mean of K-hat. */
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

static tpk_array *random_inputs(size_t N, size_t T, size_t d, uint64_t seed)
{
    size_t dims[3] = {N, T, d};
    tpk_array *x = T > 1 ? tpk_array_alloc(3, dims, NULL) : tpk_array_alloc2(N, d, NULL);
    assert_non_null(x);
    for (size_t i = 0; i < tpk_array_size(x); i++) /* distinct scales: no two inputs alike */
        x->data[i] = (0.5 + (double)(i * N / tpk_array_size(x))) * tu_normal(&seed);
    return x;
}

static tpk_program *load(void **state, const char *name, const char *src)
{
    const tu_phis *f = *state;
    tpk_netsor_opts o = {.netsor_plus = 1};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_program *p = tpk_netsor_load_string(name, src, &o, f->reg, &ctx);
    if (p == NULL)
        print_message("%s: %s\n", name, ctx.msg);
    assert_non_null(p);
    return p;
}

static tpk_array *limit(const tpk_program *p, const tpk_array *x)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_array *K = NULL;
    if (tpk_netsor_kernel(p, x, 1, &K, NULL, &ctx) != TPK_OK)
        print_message("kernel: %s\n", ctx.msg);
    assert_non_null(K);
    return K;
}

static tpk_array *finite(const tpk_program *p, const tpk_array *x, size_t n, uint64_t seed,
                         tpk_array **y)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_array *K = NULL;
    if (tpk_netsor_run(p, x, n, seed, 1, &K, y, &ctx) != TPK_OK)
        print_message("run: %s\n", ctx.msg);
    assert_non_null(K);
    return K;
}

static double max_abs_diff(const tpk_array *a, const tpk_array *b)
{
    assert_int_equal(tpk_array_size(a), tpk_array_size(b));
    double m = 0;
    for (size_t i = 0; i < tpk_array_size(a); i++)
        m = fmax(m, fabs(a->data[i] - b->data[i]));
    return m;
}

#define RNN_HEAD                                                                                   \
    "param T = 4\nparam phi = relu\nparam sigma_w2 = 1.3\nparam sigma_u2 = 0.9\n"                \
    "param sigma_b2 = 0.05\nparam sigma_v2 = 1.1\nwidth n\ninput x[t in 1..T] : d\n"

#define FWD                                                                                        \
    "A Wf : (n, n) ~ sigma_w2\nA Uf : (n, d) ~ sigma_u2\nG bf : n ~ N(0, sigma_b2)\n"          \
    "sf[0] = 0\nfor t in 1..T {\n    sf[t] = phi(Wf sf[t - 1] + Uf x[t] + bf)\n}\n"

#define BWD                                                                                        \
    "A Wb : (n, n) ~ sigma_w2\nA Ub : (n, d) ~ sigma_u2\nG bb : n ~ N(0, sigma_b2)\n"          \
    "sb[T + 1] = 0\nfor t in 1..T by -1 {\n    sb[t] = phi(Wb sb[t + 1] + Ub x[t] + bb)\n}\n"

/* The backward direction written ascending, by the index s = T + 1 - t. */
#define BWD_ASCENDING                                                                              \
    "A Wb : (n, n) ~ sigma_w2\nA Ub : (n, d) ~ sigma_u2\nG bb : n ~ N(0, sigma_b2)\n"          \
    "r[0] = 0\nfor s in 1..T {\n    r[s] = phi(Wb r[s - 1] + Ub x[T + 1 - s] + bb)\n}\n"

static void test_descending_loop(void **state)
{
    tpk_program *down = load(state, "<down>", RNN_HEAD BWD "output y[t in 1..T] = readout(sb[t], sigma_v2)\n");
    tpk_program *up = load(state, "<up>",
                           RNN_HEAD BWD_ASCENDING "output y[t in 1..T] = readout(r[T + 1 - t], sigma_v2)\n");
    /* a binder target runs by -1 as well */
    tpk_program *bind = load(state, "<bind>",
                             RNN_HEAD "A Wb : (n, n) ~ sigma_w2\nA Ub : (n, d) ~ sigma_u2\n"
                                      "G bb : n ~ N(0, sigma_b2)\nsb[T + 1] = 0\n"
                                      "sb[t in 1..T by -1] = phi(Wb sb[t + 1] + Ub x[t] + bb)\n"
                                      "output y[t in 1..T] = readout(sb[t], sigma_v2)\n");
    tpk_array *x = random_inputs(3, 4, 3, 11);
    tpk_array *Kd = limit(down, x), *Ku = limit(up, x), *Kb = limit(bind, x);
    print_message("descending against ascending: %.2e\n", max_abs_diff(Kd, Ku));
    assert_true(max_abs_diff(Kd, Ku) < 1e-13);
    assert_true(max_abs_diff(Kd, Kb) == 0.0);
    /* the last output of a backward RNN reads one step, the first all four: they differ */
    assert_true(fabs(Kd->data[0] - Kd->data[3 * 12 + 3]) > 1e-3);
    /* at finite width: the same weights (streams keyed by name) in the same order of steps */
    tpk_array *yd = NULL, *yu = NULL;
    tpk_array *Hd = finite(down, x, 64, 5, &yd), *Hu = finite(up, x, 64, 5, &yu);
    assert_true(max_abs_diff(Hd, Hu) < 1e-12);
    assert_true(max_abs_diff(yd, yu) < 1e-12);
    tpk_array_free(yd);
    tpk_array_free(yu);
    tpk_array_free(Hd);
    tpk_array_free(Hu);
    tpk_array_free(Kd);
    tpk_array_free(Ku);
    tpk_array_free(Kb);
    tpk_array_free(x);
    tpk_program_free(down);
    tpk_program_free(up);
    tpk_program_free(bind);
}

/* A bidirectional RNN reads [sf[t]; sb[t]] out: its kernel is (K_f + K_b)/2 + σ_ob², where the
 * two directions are computed as programs of their own (their cross term, which a readout of
 * the sum sf + sb would add, is absent). */
static void test_concat_bidirectional(void **state)
{
    tpk_program *bi = load(state, "<bi>", RNN_HEAD FWD BWD
                           "output y[t in 1..T] = readout(concat(sf[t], sb[t]), sigma_v2, 0.3)\n");
    tpk_program *f = load(state, "<f>", RNN_HEAD FWD "output y[t in 1..T] = readout(sf[t], sigma_v2)\n");
    tpk_program *b = load(state, "<b>", RNN_HEAD BWD "output y[t in 1..T] = readout(sb[t], sigma_v2)\n");
    tpk_program *sum = load(state, "<sum>", RNN_HEAD FWD BWD
                            "output y[t in 1..T] = readout(sf[t] + sb[t], sigma_v2 / 2, 0.3)\n");
    tpk_array *x = random_inputs(3, 4, 2, 12);
    tpk_array *K = limit(bi, x), *Kf = limit(f, x), *Kb = limit(b, x), *Ks = limit(sum, x);
    double worst = 0, cross = 0;
    for (size_t i = 0; i < tpk_array_size(K); i++) {
        worst = fmax(worst, fabs(K->data[i] - (0.5 * (Kf->data[i] + Kb->data[i]) + 0.3)));
        cross = fmax(cross, fabs(Ks->data[i] - K->data[i]));
    }
    print_message("concat against (K_f + K_b)/2: %.2e; the readout of the sum differs by %.3f\n",
                  worst, cross);
    assert_true(worst < 1e-13);
    assert_true(cross > 1e-2); /* relu is not odd: the sum's cross term E[sf sb'] ≠ 0 */
    /* at finite width, the same identity holds for K-hat exactly (the same weights by name) */
    tpk_array *H = finite(bi, x, 48, 3, NULL), *Hf = finite(f, x, 48, 3, NULL),
              *Hb = finite(b, x, 48, 3, NULL);
    worst = 0;
    for (size_t i = 0; i < tpk_array_size(H); i++)
        worst = fmax(worst, fabs(H->data[i] - (0.5 * (Hf->data[i] + Hb->data[i]) + 0.3)));
    assert_true(worst < 1e-12);
    tpk_array_free(H);
    tpk_array_free(Hf);
    tpk_array_free(Hb);
    tpk_array_free(K);
    tpk_array_free(Kf);
    tpk_array_free(Kb);
    tpk_array_free(Ks);
    tpk_array_free(x);
    tpk_program_free(bi);
    tpk_program_free(f);
    tpk_program_free(b);
    tpk_program_free(sum);
}

#define HEADS                                                                                      \
    "param phi = tanh\nwidth n\ninput x : d\nA W1 : (n, d) ~ 1.5\nA W2 : (n, n) ~ 1.2\n"        \
    "G b : n ~ N(0, 0.1)\ng = W1 x + b\nh = phi(g)\nk = W2 h\n"

/* Outputs of different readout vectors are independent (kernel 0, their biases too); those of
 * one readout vector couple as before. */
static void test_named_readouts(void **state)
{
    tpk_program *p = load(state, "<heads>", HEADS
                          "output y = readout(h, 1.0, 0.2)\n"
                          "output z = readout[u](g, 0.7, 0.3)\n"
                          "output w = readout[u](h, 1.3, 0.4)\n"
                          "output c = readout[v](concat(h, relu(k)), 0.9)\n"
                          "output e = readout[v](concat(h, phi(k)), 0.9, 0.1)\n");
    tpk_program *one = load(state, "<one>", HEADS "output z = readout(g, 0.7, 0.3)\n"
                                                  "output w = readout(h, 1.3, 0.4)\n");
    tpk_program *y1 = load(state, "<y1>", HEADS "output y = readout(h, 1.0, 0.2)\n");
    size_t N = 4, O = 5;
    tpk_array *x = random_inputs(N, 1, 3, 13);
    tpk_array *K = limit(p, x), *K1 = limit(one, x), *Ky = limit(y1, x);
    size_t dim = N * O;
#define AT(M, d, a, o, c, q) (M)->data[((a) * (d) / N + (o)) * (d) + (c) * (d) / N + (q)]
    for (size_t a = 0; a < N; a++)
        for (size_t c = 0; c < N; c++) {
            assert_true(AT(K, dim, a, 0, c, 1) == 0.0 && AT(K, dim, a, 0, c, 2) == 0.0);
            assert_true(AT(K, dim, a, 1, c, 3) == 0.0 && AT(K, dim, a, 4, c, 0) == 0.0);
            assert_true(fabs(AT(K, dim, a, 0, c, 0) - AT(Ky, N, a, 0, c, 0)) < 1e-14);
            for (size_t o = 0; o < 2; o++)
                for (size_t q = 0; q < 2; q++)
                    assert_true(fabs(AT(K, dim, a, 1 + o, c, 1 + q) - AT(K1, 2 * N, a, o, c, q)) < 1e-14);
        }
    /* the sampled outputs carry these covariances: over S seeds, the mean of y_o y_q matches the
     * mean of K-hat (0 between independent readouts) within 5 standard errors */
    enum { S = 400 };
    size_t n = 32, E = dim * dim;
    double *m = calloc(E, sizeof *m), *m2 = calloc(E, sizeof *m2), *kh = calloc(E, sizeof *kh);
    assert_true(m && m2 && kh);
    for (int s = 0; s < S; s++) {
        tpk_array *y = NULL;
        tpk_array *H = finite(p, x, n, 1000 + (uint64_t)s, &y);
        for (size_t i = 0; i < dim; i++)
            for (size_t j = 0; j < dim; j++) {
                double v = y->data[i] * y->data[j];
                m[i * dim + j] += v / S;
                m2[i * dim + j] += v * v / S;
                kh[i * dim + j] += H->data[i * dim + j] / S;
            }
        tpk_array_free(y);
        tpk_array_free(H);
    }
    int bad = 0;
    double worst = 0;
    for (size_t i = 0; i < E; i++) {
        double se = sqrt(fmax(m2[i] - m[i] * m[i], 1e-300) / S);
        double z = fabs(m[i] - kh[i]) / se;
        worst = fmax(worst, z);
        bad += z > 5.0;
    }
    print_message("sampled outputs against K-hat: worst %.2f standard errors over %zu entries\n",
                  worst, E);
    assert_int_equal(bad, 0);
    free(m);
    free(m2);
    free(kh);
    tpk_array_free(K);
    tpk_array_free(K1);
    tpk_array_free(Ky);
    tpk_array_free(x);
    tpk_program_free(p);
    tpk_program_free(one);
    tpk_program_free(y1);
#undef AT
}

static void expect_error(void **state, const char *src, const char *where, const char *what)
{
    const tu_phis *f = *state;
    tpk_netsor_opts o = {.netsor_plus = 1};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_program *p = tpk_netsor_load_string("<bad>", src, &o, f->reg, &ctx);
    if (p != NULL || strstr(ctx.msg, where) == NULL || strstr(ctx.msg, what) == NULL)
        print_message("expected '%s' ... '%s', got: %s\n", where, what, p ? "(loaded)" : ctx.msg);
    assert_null(p);
    assert_non_null(strstr(ctx.msg, where));
    assert_non_null(strstr(ctx.msg, what));
}

static void test_errors(void **state)
{
    expect_error(state, RNN_HEAD FWD "output y = readout(sf[T], 1)\nfor t in 1..T by 2 {\n}\n",
                 "<bad>:17:", "'by -1'");
    expect_error(state, "width n\ninput x[t in 1..4 by -1] : d\nA U : (n, d) ~ 1\n"
                        "output y = readout(U x[1], 1)\n",
                 "<bad>:2:", "belongs to a loop");
    expect_error(state, "width n, m\ninput x : d\nA W : (n, d) ~ 1\nA V : (m, d) ~ 1\n"
                        "h = relu(W x)\nk = relu(V x)\noutput y = readout(concat(h, k), 1)\n",
                 "<bad>:", "one width");
    expect_error(state, HEADS "output y = readout(h, 1)\noutput z = readout(concat(h, g), 1)\n",
                 "<bad>:11:", "readout vector of its own");
    expect_error(state, HEADS "q = concat(h, g)\noutput y = readout(q, 1)\n", "<bad>:10:",
                 "readout's first argument");
    expect_error(state, HEADS "output y = readout(concat(h), 1)\n", "<bad>:10:", "two or more");
    expect_error(state, HEADS "output y = readout[1](h, 1)\n", "<bad>:10:", "one name");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_descending_loop),
        cmocka_unit_test(test_concat_bidirectional),
        cmocka_unit_test(test_named_readouts),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, tu_phis_setup, tu_phis_teardown);
}
