/* The CNN recursion's NTK (tpk_cnn_kernels; theory.md §2.8 "The NTK") against independent
 * references: neural-tangents 0.6.5's analytic kernels (tests/ntk_nt_reference.h, 'ntk' and
 * 'standard', GAP and Flatten), and the interpreter's member-level NTK of programs/cnn2d.nsr
 * (tpk_netsor_ntk: its tangent pass over every position, a different code path), which it must
 * equal on every readout the program has — per position, GAP as their mean — in all three
 * parameterisations, with circular and zero padding. The pooled paths (by shifts and by
 * blocks) are checked against each other where only they compute (LAP). */
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
#include "cnn_ntk_reference.h"
#include "ntk_nt_reference.h"

/* Both kernels of p on X into fresh side×side arrays; the call must succeed. */
static void kernels(const tpk_cnn_params *p, const tpk_array *X, size_t side, tpk_array **K,
                    tpk_array **T)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    *K = tpk_array_alloc2(side, side, NULL);
    *T = tpk_array_alloc2(side, side, NULL);
    assert_non_null(*K);
    assert_non_null(*T);
    int st = tpk_cnn_kernels(p, X, NULL, *K, *T, NULL, &ctx);
    if (st)
        print_message("tpk_cnn_kernels: %s\n", ctx.msg);
    assert_int_equal(st, TPK_OK);
}

/* neural-tangents: 3×3 circular Conv(16) + Relu, depth 3, then GlobalAvgPool or Flatten and
 * Dense(1), W_std² = 1.7 and b_std² = 0.1 everywhere, on 4 images 8×8×1; both pooling paths of
 * GAP; 'standard' at 16 channels (Flatten's readout fan-in 16·64). */
static void test_neural_tangents(void **state)
{
    const tu_phis *f = *state;
    size_t dims[4] = {NTREF_CNN_N, NTREF_CNN_H, NTREF_CNN_W, NTREF_CNN_C};
    tpk_array *X = tpk_array_alloc(4, dims, NULL);
    assert_non_null(X);
    memcpy(X->data, ntref_cnn_x, tpk_array_size(X) * sizeof *X->data);
    for (int c = 0; c < NTREF_NCASES; c++) {
        const struct ntref_case *k = &ntref_cases[c];
        if (strcmp(k->arch, "cnn2d") != 0)
            continue;
        const int gap = strcmp(k->readout, "gap") == 0;
        for (int pool = 0; pool < (gap ? 3 : 1); pool++)
            for (int param = 0; param < 2; param++) {
                tpk_cnn_params p = {.rows = NTREF_CNN_H, .cols = NTREF_CNN_W,
                                    .channels = NTREF_CNN_C, .kh = 3, .kw = 3,
                                    .depth = k->depth, .phi = f->relu,
                                    .sigma_u2 = NTREF_SIGMA_W2, .sigma_w2 = NTREF_SIGMA_W2,
                                    .sigma_b2 = NTREF_SIGMA_B2, .sigma_v2 = NTREF_SIGMA_W2,
                                    .sigma_ob2 = NTREF_SIGMA_B2, .padding = TPK_CNN_CIRCULAR,
                                    .readout = gap ? TPK_CNN_GAP : TPK_CNN_FLATTEN,
                                    .pool = pool,
                                    .ntk_param = param ? TPK_NTK_PARAM_STANDARD : TPK_NTK_PARAM_NTK,
                                    .ntk_width = NTREF_CNN_CHANNELS};
                tpk_array *K, *T;
                kernels(&p, X, NTREF_CNN_N, &K, &T);
                const size_t n2 = NTREF_CNN_N * NTREF_CNN_N;
                double ek = tu_max_rel(K->data, k->nngp, n2);
                double et = tu_max_rel(T->data, param ? k->ntk_std : k->ntk, n2);
                print_message("%-22s pool %d %-8s NNGP %.1e, NTK %.1e relative\n", k->name, pool,
                              param ? "standard" : "ntk", ek, et);
                assert_true(ek <= 1e-13);
                assert_true(et <= 1e-13);
                tpk_array_free(K);
                tpk_array_free(T);
            }
    }
    tpk_array_free(X);
}

/* The CNN (28×28, depth 8, GAP and flatten) against neural-tangents' rules evaluated in
 * long double (tests/cnn_ntk_reference.h), where neural-tangents' own compiled float64 call
 * drifts by up to ~1e-11 (GAP) and ~6e-9 (flatten) at the diagonal correlations: both pooling
 * paths of GAP, 'ntk' with and without biases, 'standard' at 16 channels. */
static void test_long_double(void **state)
{
    const tu_phis *f = *state;
    size_t dims[4] = {CNREF_N, CNREF_H, CNREF_W, CNREF_C};
    tpk_array *X = tpk_array_alloc(4, dims, NULL);
    assert_non_null(X);
    memcpy(X->data, cnref_x, sizeof cnref_x);
    static const struct {
        int readout, param, bias;
        const double *K, *T, *Tnt;
        const char *name;
    } cs[] = {
        {TPK_CNN_GAP, TPK_NTK_PARAM_NTK, 1, cnref_gap_ntk_nngp_ld, cnref_gap_ntk_ntk_ld,
         cnref_gap_ntk_ntk_nt, "gap ntk"},
        {TPK_CNN_GAP, TPK_NTK_PARAM_STANDARD, 1, cnref_gap_standard_nngp_ld,
         cnref_gap_standard_ntk_ld, cnref_gap_standard_ntk_nt, "gap standard"},
        {TPK_CNN_GAP, TPK_NTK_PARAM_NTK, 0, cnref_gap_ntk_nobias_nngp_ld,
         cnref_gap_ntk_nobias_ntk_ld, cnref_gap_ntk_nobias_ntk_nt, "gap ntk, no biases"},
        {TPK_CNN_FLATTEN, TPK_NTK_PARAM_NTK, 1, cnref_flatten_ntk_nngp_ld,
         cnref_flatten_ntk_ntk_ld, cnref_flatten_ntk_ntk_nt, "flatten ntk"},
        {TPK_CNN_FLATTEN, TPK_NTK_PARAM_STANDARD, 1, cnref_flatten_standard_nngp_ld,
         cnref_flatten_standard_ntk_ld, cnref_flatten_standard_ntk_nt, "flatten standard"},
        {TPK_CNN_FLATTEN, TPK_NTK_PARAM_NTK, 0, cnref_flatten_ntk_nobias_nngp_ld,
         cnref_flatten_ntk_nobias_ntk_ld, cnref_flatten_ntk_nobias_ntk_nt,
         "flatten ntk, no biases"},
    };
    const size_t n2 = CNREF_N * CNREF_N;
    for (size_t c = 0; c < sizeof cs / sizeof *cs; c++)
        for (int pool = 0; pool < (cs[c].readout == TPK_CNN_GAP ? 3 : 1); pool++) {
            const double b2 = cs[c].bias ? CNREF_SIGMA_B2 : 0.0;
            tpk_cnn_params p = {.rows = CNREF_H, .cols = CNREF_W, .channels = CNREF_C, .kh = 3,
                                .kw = 3, .depth = CNREF_DEPTH, .phi = f->relu,
                                .sigma_u2 = CNREF_SIGMA_W2, .sigma_w2 = CNREF_SIGMA_W2,
                                .sigma_b2 = b2, .sigma_v2 = CNREF_SIGMA_W2, .sigma_ob2 = b2,
                                .padding = TPK_CNN_CIRCULAR, .readout = cs[c].readout,
                                .pool = pool, .ntk_param = cs[c].param,
                                .ntk_width = CNREF_CHANNELS};
            tpk_array *K, *T;
            kernels(&p, X, CNREF_N, &K, &T);
            double ek = tu_max_rel(K->data, cs[c].K, n2), et = tu_max_rel(T->data, cs[c].T, n2);
            double en = tu_max_rel(cs[c].Tnt, cs[c].T, n2);
            print_message("%-24s pool %d: NNGP %.1e, NTK %.1e off long double (neural-tangents "
                          "%.1e)\n", cs[c].name, pool, ek, et, en);
            assert_true(ek <= 1e-13);
            assert_true(et <= 1e-13);
            tpk_array_free(K);
            tpk_array_free(T);
        }
    tpk_array_free(X);
}

/* The interpreter's NTK of programs/cnn2d.nsr with every position read out, on N images. */
static void program_ntk(void **state, const char *phi, int circular, double sb2, int L,
                        size_t R, size_t S, const tpk_array *X, int param, size_t width,
                        tpk_array **K, tpk_array **T)
{
    const tu_phis *f = *state;
    char rows[8], cols[8], depth[8], b2[32];
    snprintf(rows, sizeof rows, "%zu", R);
    snprintf(cols, sizeof cols, "%zu", S);
    snprintf(depth, sizeof depth, "%d", L);
    snprintf(b2, sizeof b2, "%.17g", sb2);
    tpk_param_set sets[] = {{"rows", rows}, {"cols", cols}, {"L", depth}, {"phi", phi},
                            {"circular", circular ? "1" : "0"}, {"sigma_b2", b2},
                            {"sigma_w2", "1.6"}, {"sigma_u2", "1.2"}, {"sigma_v2", "0.9"},
                            {"sigma_ob2", sb2 > 0 ? "0.05" : "0"}};
    tpk_program *p = tu_load_shipped(f->reg, "programs/cnn2d.nsr", sets, 10);
    size_t dims[3] = {X->dims[0], R * S, X->dims[3]};
    tpk_array view = *X;
    view.ndim = 3;
    memcpy(view.dims, dims, sizeof dims);
    tpk_ntk_opts o = {param, width, NULL};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    int st = tpk_netsor_ntk_ex(p, &view, 1, &o, K, T, NULL, &ctx);
    if (st)
        print_message("tpk_netsor_ntk_ex: %s\n", ctx.msg);
    assert_int_equal(st, TPK_OK);
    tpk_program_free(p);
}

/* Mean over the (P×P) position block of each image pair: GAP from the per-position kernel. */
static void pool_positions(const tpk_array *A, size_t N, size_t P, double *out)
{
    for (size_t a = 0; a < N; a++)
        for (size_t c = 0; c < N; c++) {
            double s = 0;
            for (size_t p = 0; p < P; p++)
                for (size_t q = 0; q < P; q++)
                    s += A->data[(a * P + p) * (N * P) + c * P + q];
            out[a * N + c] = s / (double)(P * P);
        }
}

static void test_program(void **state)
{
    const tu_phis *f = *state;
    const size_t N = 3, R = 4, S = 5, C = 2, P = R * S;
    tpk_array *X = tpk_array_alloc(4, (size_t[4]){N, R, S, C}, NULL);
    assert_non_null(X);
    uint64_t seed = 37;
    for (size_t i = 0; i < tpk_array_size(X); i++)
        X->data[i] = (0.5 + 0.3 * (double)(i % 3)) * tu_normal(&seed);
    static const struct { const char *phi; int circular; double sb2; int L; } cases[] = {
        {"relu", 1, 0.0, 2}, {"erf", 1, 0.3, 3}, {"relu", 0, 0.3, 2}, {"erf", 0, 0.0, 2}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (int param = 0; param < 3; param++) {
            const size_t width = param == TPK_NTK_PARAM_STANDARD ? 7 : 0;
            tpk_array *Kp = NULL, *Tp = NULL;
            program_ntk(state, cases[c].phi, cases[c].circular, cases[c].sb2, cases[c].L, R, S, X,
                        param, width, &Kp, &Tp);
            tpk_cnn_params p = {.rows = R, .cols = S, .channels = C, .kh = 3, .kw = 3,
                                .depth = cases[c].L,
                                .phi = strcmp(cases[c].phi, "relu") == 0 ? f->relu : f->erf_,
                                .sigma_u2 = 1.2, .sigma_w2 = 1.6, .sigma_b2 = cases[c].sb2,
                                .sigma_v2 = 0.9, .sigma_ob2 = cases[c].sb2 > 0 ? 0.05 : 0.0,
                                .padding = cases[c].circular ? TPK_CNN_CIRCULAR : TPK_CNN_ZERO,
                                .readout = TPK_CNN_POSITIONS, .ntk_param = param,
                                .ntk_width = width};
            tpk_array *K, *T;
            kernels(&p, X, N * P, &K, &T);
            double ek = tu_max_rel(K->data, Kp->data, N * P * N * P);
            double et = tu_max_rel(T->data, Tp->data, N * P * N * P);
            /* GAP by every pooling path against the mean of the program's positions */
            double gk[9], gt[9], eg = 0;
            pool_positions(Kp, N, P, gk);
            pool_positions(Tp, N, P, gt);
            for (int pool = 0; pool < 3; pool++) {
                if (pool == TPK_CNN_POOL_SHIFTS && !cases[c].circular)
                    continue;
                tpk_cnn_params g = p;
                g.readout = TPK_CNN_GAP;
                g.pool = pool;
                tpk_array *Kg, *Tg;
                kernels(&g, X, N, &Kg, &Tg);
                eg = fmax(eg, fmax(tu_max_rel(Kg->data, gk, N * N), tu_max_rel(Tg->data, gt, N * N)));
                tpk_array_free(Kg);
                tpk_array_free(Tg);
            }
            /* flatten: the mean of the position diagonal, where its readout's own term is the
             * shared vector's (not in 'standard', whose flatten readout has n·P entries) */
            double ef = 0;
            if (param != TPK_NTK_PARAM_STANDARD) {
                tpk_cnn_params fl = p;
                fl.readout = TPK_CNN_FLATTEN;
                tpk_array *Kf, *Tf;
                kernels(&fl, X, N, &Kf, &Tf);
                for (size_t a = 0; a < N; a++)
                    for (size_t b = 0; b < N; b++) {
                        double sk = 0, sth = 0;
                        for (size_t q = 0; q < P; q++) {
                            sk += Kp->data[(a * P + q) * (N * P) + b * P + q];
                            sth += Tp->data[(a * P + q) * (N * P) + b * P + q];
                        }
                        gk[a * N + b] = sk / (double)P;
                        gt[a * N + b] = sth / (double)P;
                    }
                ef = fmax(tu_max_rel(Kf->data, gk, N * N), tu_max_rel(Tf->data, gt, N * N));
                tpk_array_free(Kf);
                tpk_array_free(Tf);
            }
            print_message("%-4s %-8s %-8s positions: NNGP %.1e, NTK %.1e; GAP %.1e; flatten "
                          "%.1e relative\n", cases[c].phi, cases[c].circular ? "circular" : "zero",
                          tpk_ntk_param_name(param), ek, et, eg, ef);
            assert_true(ef <= 1e-12);
            assert_true(ek <= 1e-12);
            assert_true(et <= 1e-12);
            assert_true(eg <= 1e-12);
            tpk_array_free(K);
            tpk_array_free(T);
            tpk_array_free(Kp);
            tpk_array_free(Tp);
        }
    tpk_array_free(X);
}

/* LAP has no program form: its two paths (shifts of the flatten recursion, the block's offset
 * window) against each other; a window covering the grid is GAP, window 0 is flatten. */
static void test_lap(void **state)
{
    const tu_phis *f = *state;
    const size_t N = 3;
    tpk_array *X = tu_normal_inputs(N, 6 * 7, 1, 5);
    X->ndim = 4;
    X->dims[1] = 6;
    X->dims[2] = 7;
    X->dims[3] = 1;
    for (int param = 0; param < 2; param++) {
        tpk_cnn_params p = {.rows = 6, .cols = 7, .channels = 1, .kh = 3, .kw = 3, .depth = 3,
                            .phi = f->erf_, .sigma_u2 = 1.5, .sigma_w2 = 1.5, .sigma_b2 = 0.2,
                            .sigma_v2 = 1.1, .sigma_ob2 = 0.1, .padding = TPK_CNN_CIRCULAR,
                            .readout = TPK_CNN_LAP, .window = 1, .ntk_param = param};
        tpk_array *K[4], *T[4];
        p.pool = TPK_CNN_POOL_SHIFTS;
        kernels(&p, X, N, &K[0], &T[0]);
        p.pool = TPK_CNN_POOL_BLOCK;
        kernels(&p, X, N, &K[1], &T[1]);
        double e = fmax(tu_max_rel(K[0]->data, K[1]->data, N * N), tu_max_rel(T[0]->data, T[1]->data, N * N));
        p.window = 3; /* 2·3 + 1 ≥ 6 and 7: every shift, GAP */
        kernels(&p, X, N, &K[2], &T[2]);
        p.readout = TPK_CNN_GAP;
        kernels(&p, X, N, &K[3], &T[3]);
        double eg = tu_max_rel(T[2]->data, T[3]->data, N * N);
        tpk_cnn_params q = p;
        q.readout = TPK_CNN_LAP;
        q.window = 0;
        tpk_array *K0, *T0, *Kf, *Tf;
        kernels(&q, X, N, &K0, &T0);
        q.readout = TPK_CNN_FLATTEN;
        kernels(&q, X, N, &Kf, &Tf);
        double ef = tu_max_rel(T0->data, Tf->data, N * N);
        print_message("LAP %s: shifts vs block %.1e, whole window vs GAP %.1e, window 0 vs "
                      "flatten %.1e\n", tpk_ntk_param_name(param), e, eg, ef);
        assert_true(e <= 1e-13);
        assert_true(eg <= 1e-13);
        assert_true(ef <= 1e-13);
        /* the NTK dominates the NNGP in 'ntk' (theory.md §8.7): Θ − K is a PSD kernel */
        for (size_t i = 0; param == TPK_NTK_PARAM_NTK && i < N; i++)
            assert_true(T[0]->data[i * N + i] >= K[0]->data[i * N + i]);
        for (int i = 0; i < 4; i++) {
            tpk_array_free(K[i]);
            tpk_array_free(T[i]);
        }
        tpk_array_free(K0);
        tpk_array_free(T0);
        tpk_array_free(Kf);
        tpk_array_free(Tf);
    }
    tpk_array_free(X);
}

static void test_refusals(void **state)
{
    const tu_phis *f = *state;
    tpk_array *X = tu_normal_inputs(2, 16, 1, 9);
    X->ndim = 4;
    X->dims[1] = 4;
    X->dims[2] = 4;
    X->dims[3] = 1;
    tpk_array *K = tpk_array_alloc2(2, 2, NULL), *T = tpk_array_alloc2(2, 2, NULL);
    const tpk_cnn_params base = {.rows = 4, .cols = 4, .channels = 1, .kh = 3, .kw = 3, .depth = 2,
                                 .phi = f->relu, .sigma_u2 = 2, .sigma_w2 = 2, .sigma_v2 = 2,
                                 .padding = TPK_CNN_CIRCULAR, .readout = TPK_CNN_GAP};
    static const struct { int param, readout, compute; size_t width; const char *what; } bad[] = {
        {TPK_NTK_PARAM_STANDARD, TPK_CNN_GAP, TPK_CNN_F64, 0, "ntk-width"},
        {TPK_NTK_PARAM_STANDARD, TPK_CNN_LAP, TPK_CNN_F64, 8, "local average pooling"},
        {TPK_NTK_PARAM_NTK, TPK_CNN_FLATTEN, TPK_CNN_F32, 0, "float64"},
        {7, TPK_CNN_GAP, TPK_CNN_F64, 0, "parameterisation 7"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tpk_cnn_params p = base;
        p.ntk_param = bad[i].param;
        p.readout = bad[i].readout;
        p.window = 1;
        p.compute = bad[i].compute;
        p.ntk_width = bad[i].width;
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        assert_int_equal(tpk_cnn_kernels(&p, X, NULL, K, T, NULL, &ctx), TPK_EINVAL);
        assert_non_null(strstr(ctx.msg, bad[i].what));
    }
    /* step has no derivative that is a function */
    tpk_phi *step = tpk_phi_alloc(f->reg, "step", NULL);
    assert_non_null(step);
    tpk_cnn_params p = base;
    p.phi = step;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_not_equal(tpk_cnn_kernels(&p, X, NULL, K, T, NULL, &ctx), TPK_OK);
    /* the NNGP alone takes it */
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_cnn_kernels(&p, X, NULL, K, NULL, NULL, &ctx), TPK_OK);
    tpk_phi_free(step);
    tpk_array_free(K);
    tpk_array_free(T);
    tpk_array_free(X);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_neural_tangents),
        cmocka_unit_test(test_long_double),
        cmocka_unit_test(test_program),
        cmocka_unit_test(test_lap),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, tu_phis_setup, tu_phis_teardown);
}
