/* Training finite networks of a program (tpk_netsor_train; issue 36, item 3) against what does not
 * share its code path: step 0 is tpk_netsor_run's network (its outputs, bit for bit); a small step
 * moves every output, training and test, by −(η/N) Θ̂ (f − Y) with Θ̂ the same network's empirical
 * NTK from tpk_netsor_run_ntk's structured per-weight sums (first order in η, so the relative
 * difference must shrink like η); a run's loss falls; and the refusals. Programs: an erf MLP with
 * biases, the tied-weight RNN (all pairs of uses), the transformer (Moments: LayerNorm, 1/n
 * attention). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/testutil.h"
#include "tpk/netsor.h"
#include "tpk/ntk.h"
#include "tpk/tpk.h"

static double gauss(uint64_t *s)
{
    double u = 0, v = 0;
    for (int i = 0; i < 2; i++) {
        *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
        double r = ((*s * UINT64_C(2685821657736338717)) >> 11) * 0x1.0p-53 + 0x1.0p-54;
        *(i ? &v : &u) = r;
    }
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static tpk_array *inputs(size_t N, size_t T, size_t d, uint64_t seed)
{
    size_t dims[3] = {N, T, d};
    tpk_array *x = T > 1 ? tpk_array_alloc(3, dims, NULL) : tpk_array_alloc2(N, d, NULL);
    assert_non_null(x);
    for (size_t i = 0; i < tpk_array_size(x); i++)
        x->data[i] = gauss(&seed);
    return x;
}

typedef struct tcase {
    const char *prog;
    tpk_param_set sets[4];
    int nsets;
    size_t T, d, width;
} tcase;

static const tcase cases[] = {
    {"programs/mlp.nsr", {{"phi", "erf"}, {"sigma_b2", "0.1"}, {"L", "2"}}, 3, 1, 5, 64},
    {"programs/rnn.nsr", {{"T", "3"}, {"phi", "erf"}}, 2, 3, 4, 48},
    {"programs/transformer.nsr", {{"T", "3"}, {"L", "1"}}, 2, 3, 4, 32},
};

/* Outputs at step 0 and after one step of size lr, from a fresh training run. */
static void one_step(const tpk_program *p, const tpk_array *x, size_t ntrain, const tpk_array *y,
                     size_t width, double lr, double *f0, double *f1)
{
    const size_t at[2] = {0, 1};
    tpk_train_opts o = {.width = width, .seed = 11, .lr = lr, .at = at, .nat = 2};
    size_t dims[3] = {2, x->dims[0], 1};
    tpk_array *f = tpk_array_alloc(3, dims, NULL);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    if (tpk_netsor_train(p, x, ntrain, y, &o, f, NULL, &ctx))
        fail_msg("%s", ctx.msg);
    memcpy(f0, f->data, x->dims[0] * sizeof *f0);
    memcpy(f1, f->data + x->dims[0], x->dims[0] * sizeof *f1);
    tpk_array_free(f);
}

static void test_first_step(void **state)
{
    const tu_phis *ph = *state;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const tcase *k = &cases[c];
        tpk_program *p = tu_load_shipped(ph->reg, k->prog, k->sets, k->nsets);
        assert_non_null(p);
        enum { N = 6, NTR = 4 };
        tpk_array *x = inputs(N, k->T, k->d, 5 + c), *y = tpk_array_alloc2(NTR, 1, NULL);
        uint64_t g = 99;
        for (size_t i = 0; i < NTR; i++)
            y->data[i] = gauss(&g);
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        /* the run's network and its empirical NTK, by the structured sums */
        tpk_array *Kh = NULL, *yr = NULL, *Th = NULL;
        assert_int_equal(tpk_netsor_run(p, x, k->width, 11, 0, &Kh, &yr, &ctx), TPK_OK);
        assert_int_equal(tpk_netsor_run_ntk(p, x, k->width, 11, 0, TPK_NTK_PARAM_NTK, NULL, &Th,
                                            &ctx), TPK_OK);
        double f0[N], f1[N], rel[2];
        const double lrs[2] = {1e-3, 1e-4};
        for (int l = 0; l < 2; l++) {
            one_step(p, x, NTR, y, k->width, lrs[l], f0, f1);
            for (size_t a = 0; a < N; a++) /* step 0 is the run's network */
                if (!(fabs(f0[a] - yr->data[a]) <= 1e-12 * (1 + fabs(yr->data[a]))))
                    fail_msg("%s: input %zu: %.17g != %.17g", k->prog, a, f0[a], yr->data[a]);
            /* first order: f1 − f0 = −(η/N) Σ_b Θ̂(a, b)(f0(b) − y_b) over the training inputs */
            double num = 0, den = 0;
            for (size_t a = 0; a < N; a++) {
                double want = 0;
                for (size_t b = 0; b < NTR; b++)
                    want -= lrs[l] / NTR * Th->data[a * N + b] * (f0[b] - y->data[b]);
                num = fmax(num, fabs((f1[a] - f0[a]) - want));
                den = fmax(den, fabs(want));
            }
            rel[l] = num / den;
        }
        print_message("%s: one step vs -(lr/N) NTK-hat residual: rel. diff %.2e (lr 1e-3), "
                      "%.2e (lr 1e-4)\n", k->prog, rel[0], rel[1]);
        /* the difference is the step's second-order term: it shrinks with lr (×10 here) */
        assert_true(rel[0] < 1e-2);
        assert_true(rel[1] < 0.2 * rel[0] || rel[1] < 1e-7);
        tpk_array_free(Kh);
        tpk_array_free(yr);
        tpk_array_free(Th);
        tpk_array_free(x);
        tpk_array_free(y);
        tpk_program_free(p);
    }
}

/* A run of 200 steps: the training loss falls steadily (full-batch GD below the stable rate), and
 * the recorded steps repeat and reach the last one exactly. */
static void test_loss_falls(void **state)
{
    const tu_phis *ph = *state;
    const tcase *k = &cases[0];
    tpk_program *p = tu_load_shipped(ph->reg, k->prog, k->sets, k->nsets);
    enum { N = 8, NTR = 8 };
    tpk_array *x = inputs(N, 1, k->d, 3), *y = tpk_array_alloc2(NTR, 1, NULL);
    uint64_t g = 7;
    for (size_t i = 0; i < NTR; i++)
        y->data[i] = gauss(&g);
    const size_t at[5] = {0, 10, 10, 100, 200};
    tpk_train_opts o = {.width = 128, .seed = 3, .lr = 0.5, .at = at, .nat = 5};
    size_t dims[3] = {5, N, 1};
    tpk_array *f = tpk_array_alloc(3, dims, NULL);
    double loss[5];
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    if (tpk_netsor_train(p, x, NTR, y, &o, f, loss, &ctx))
        fail_msg("%s", ctx.msg);
    print_message("loss %.4g %.4g %.4g %.4g\n", loss[0], loss[1], loss[3], loss[4]);
    assert_true(loss[1] == loss[2]);
    assert_true(loss[1] < loss[0] && loss[3] < loss[1] && loss[4] < loss[3]);
    assert_true(loss[4] < 0.2 * loss[0]);
    double l4 = 0; /* the loss recorded is the outputs' */
    for (size_t a = 0; a < N; a++)
        l4 += (f->data[4 * N + a] - y->data[a]) * (f->data[4 * N + a] - y->data[a]);
    assert_true(fabs(l4 / (2 * N) - loss[4]) <= 1e-14 * loss[4]);

    /* refusals: unsorted steps, a bad rate, wrong targets, bn(...) at its line */
    const size_t bad[2] = {3, 1};
    o.at = bad;
    o.nat = 2;
    assert_int_equal(tpk_netsor_train(p, x, NTR, y, &o, f, NULL, &ctx), TPK_EINVAL);
    o.at = at;
    o.nat = 5;
    o.lr = -1;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_netsor_train(p, x, NTR, y, &o, f, NULL, &ctx), TPK_EINVAL);
    o.lr = 0.5;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_netsor_train(p, x, NTR - 1, y, &o, f, NULL, &ctx), TPK_EINVAL);
    tpk_program *bn = tu_load_shipped(ph->reg, "programs/batchnorm.nsr", NULL, 0);
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_netsor_train(bn, x, NTR, y, &o, f, NULL, &ctx), TPK_EUNSUPPORTED);
    assert_non_null(strstr(ctx.msg, "batchnorm.nsr:"));
    /* a rate far beyond 2N/λ_max diverges: an error, never NaN outputs */
    o.lr = 1e6;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_netsor_train(p, x, NTR, y, &o, f, NULL, &ctx), TPK_ENUMERIC);
    assert_non_null(strstr(ctx.msg, "diverged"));
    tpk_program_free(bn);
    tpk_array_free(f);
    tpk_array_free(x);
    tpk_array_free(y);
    tpk_program_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_step),
        cmocka_unit_test(test_loss_falls),
    };
    return cmocka_run_group_tests_name("netsor_train", tests, tu_phis_setup, tu_phis_teardown);
}
