/* gpregress --predict=gd and --kernel-type=ntk (tpk_gp_experiment_run; issue 36, item 2): the
 * trained ensemble's test mean and variances at several times against neural-tangents 0.6.5's
 * gradient_descent_mse_ensemble (tests/gd_reference.h, through a kernel file as gpkernel
 * --kernel=both writes it), the identity between the t = ∞ NTK mean and the NTK-GP posterior
 * mean at zero noise on a computed kernel, t = 0 exactly 0, the time coordinate xarray reads,
 * and the option checks with nothing written. */
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

#include "support/testutil.h"
#include "tpk/tpk.h"
#include "gd_reference.h"

static tpk_array *block(const double *full, size_t P, size_t r0, size_t r, size_t c0, size_t c)
{
    tpk_array *a = tpk_array_alloc2(r, c, NULL);
    assert_non_null(a);
    for (size_t i = 0; i < r; i++)
        for (size_t j = 0; j < c; j++)
            a->data[i * c + j] = full[(r0 + i) * P + c0 + j];
    return a;
}

/* The reference kernels as gpkernel --kernel=both --test writes them (with_ntk 0: the NNGP's
 * alone, as gpkernel --kernel=nngp). */
static void kernel_file(const char *path, int with_ntk)
{
    const size_t n = GDREF_N, m = GDREF_M, P = n + m;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_h5out *h = tpk_h5out_open(path, &ctx);
    assert_non_null(h);
    const double *full[2] = {gdref_nngp_full, gdref_ntk_full};
    const char *name[2] = {"kernel", "ntk"};
    for (int k = 0; k < 1 + with_ntk; k++) {
        char ds[64];
        tpk_array *dd = block(full[k], P, 0, n, 0, n), *td = block(full[k], P, n, m, 0, n);
        tpk_array *diag = tpk_array_alloc(1, (size_t[1]){m}, NULL);
        for (size_t i = 0; i < m; i++)
            diag->data[i] = full[k][(n + i) * P + n + i];
        snprintf(ds, sizeof ds, "/%s", name[k]);
        assert_int_equal(tpk_h5out_write(h, ds, dd, &ctx), TPK_OK);
        snprintf(ds, sizeof ds, "/%s_test_train", name[k]);
        assert_int_equal(tpk_h5out_write(h, ds, td, &ctx), TPK_OK);
        snprintf(ds, sizeof ds, "/%s_test_diag", name[k]);
        assert_int_equal(tpk_h5out_write(h, ds, diag, &ctx), TPK_OK);
        tpk_array_free(dd);
        tpk_array_free(td);
        tpk_array_free(diag);
    }
    assert_int_equal(tpk_h5out_commit(h, &ctx), TPK_OK);
}

static tpk_array *read_ds(const char *file, const char *ds)
{
    char spec[700];
    snprintf(spec, sizeof spec, "%s:%s", file, ds);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_ctx_set_notes(&ctx, NULL, NULL);
    tpk_array *a = tpk_io_read(spec, NULL, &ctx);
    if (!a)
        fail_msg("%s", ctx.msg);
    return a;
}

static void test_neural_tangents(void **state)
{
    const tu_env *e = *state;
    char kf[512], yf[512], out[512];
    tu_path(e, kf, sizeof kf, "k.h5");
    tu_path(e, yf, sizeof yf, "y.npy");
    tu_path(e, out, sizeof out, "gd.h5");
    kernel_file(kf, 1);
    tu_write_npy(yf, gdref_y, 2, (size_t[2]){GDREF_N, GDREF_K});
    double t[GDREF_T];
    for (size_t i = 0; i + 1 < GDREF_T; i++)
        t[i] = gdref_times[i];
    t[GDREF_T - 1] = INFINITY;
    for (int kt = 0; kt < 2; kt++) {
        tpk_gp_experiment_opts o;
        tpk_gp_experiment_opts_default(&o);
        o.kernel_file = kf;
        o.labels = yf;
        o.output = out;
        o.noise_auto = 0;
        o.noise = 0.01;
        o.force = 1;
        o.predict_gd = 1;
        o.times = t;
        o.ntimes = GDREF_T;
        o.lr = gdref_lr;
        o.kernel_type = kt ? TPK_GP_KERNEL_NTK : TPK_GP_KERNEL_NNGP;
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        if (tpk_gp_experiment_run(&o, &ctx))
            fail_msg("%s", ctx.msg);
        tpk_array *mean = read_ds(out, "/gd_mean"), *var = read_ds(out, "/gd_var");
        const double *wm = kt ? gdref_ntk_test_mean : gdref_nngp_test_mean;
        const double *wc = kt ? gdref_ntk_test_cov : gdref_nngp_test_cov;
        double wv[GDREF_T * GDREF_M];
        for (size_t i = 0; i < GDREF_T; i++)
            for (size_t j = 0; j < GDREF_M; j++)
                wv[i * GDREF_M + j] = wc[(i * GDREF_M + j) * GDREF_M + j];
        assert_int_equal(tpk_array_size(mean), GDREF_T * GDREF_M * GDREF_K);
        assert_int_equal(tpk_array_size(var), GDREF_T * GDREF_M);
        double em = tu_max_rel(mean->data + GDREF_M * GDREF_K, wm + GDREF_M * GDREF_K,
                           (GDREF_T - 1) * GDREF_M * GDREF_K);
        double ev = tu_max_rel(var->data, wv, GDREF_T * GDREF_M);
        print_message("gd (%s) against neural-tangents: mean %.1e, variances %.1e relative\n",
                      kt ? "ntk" : "nngp", em, ev);
        for (size_t j = 0; j < GDREF_M * GDREF_K; j++) /* t = 0: the prior mean, exactly */
            assert_true(mean->data[j] == 0.0);
        assert_true(em <= 1e-10);
        assert_true(ev <= 1e-10);
        /* the variances of the first 2 test items only (--var-n): the means by a call of their
         * own, the same numbers */
        o.var_n = 2;
        tpk_ctx_init(&ctx);
        if (tpk_gp_experiment_run(&o, &ctx))
            fail_msg("%s", ctx.msg);
        tpk_array *m2 = read_ds(out, "/gd_mean"), *v2 = read_ds(out, "/gd_var");
        assert_int_equal(tpk_array_size(v2), GDREF_T * 2);
        assert_true(tu_max_rel(m2->data, mean->data, tpk_array_size(mean)) <= 1e-13);
        for (size_t i = 0; i < GDREF_T; i++)
            for (size_t j = 0; j < 2; j++)
                assert_true(fabs(v2->data[i * 2 + j] - var->data[i * GDREF_M + j]) <=
                            1e-13 * fabs(var->data[i * GDREF_M + j]) + 1e-300);
        tpk_array_free(m2);
        tpk_array_free(v2);
        tpk_array_free(mean);
        tpk_array_free(var);
    }
}

/* A computed kernel (--arch=mlp through the table): at zero noise the NTK-GP posterior mean is
 * Θ_td Θ⁻¹ Y, which is the trained ensemble's mean at t = ∞; with discrete steps far beyond the
 * slowest mode the mean has converged to it too. */
static void test_ntkgp_identity(void **state)
{
    const tu_env *e = *state;
    const size_t n = 24, m = 7, d = 4;
    char xf[512], tf[512], yf[512], out[512];
    tu_path(e, xf, sizeof xf, "x.npy");
    tu_path(e, tf, sizeof tf, "xt.npy");
    tu_path(e, yf, sizeof yf, "yy.npy");
    tu_path(e, out, sizeof out, "id.h5");
    uint64_t s = 11;
    double X[24 * 4], Xt[7 * 4], Y[24];
    for (size_t i = 0; i < n * d; i++)
        X[i] = tu_normal(&s);
    for (size_t i = 0; i < m * d; i++)
        Xt[i] = tu_normal(&s);
    for (size_t i = 0; i < n; i++)
        Y[i] = sin(X[i * d]) + 0.5 * X[i * d + 1];
    tu_write_npy(xf, X, 2, (size_t[2]){n, d});
    tu_write_npy(tf, Xt, 2, (size_t[2]){m, d});
    tu_write_npy(yf, Y, 2, (size_t[2]){n, 1});
    const double t[2] = {0.0, INFINITY};
    tpk_gp_experiment_opts o;
    tpk_gp_experiment_opts_default(&o);
    o.kernel = "mlp";
    o.depth_lo = o.depth_hi = 2;
    o.sigma_b2 = 0.1;
    o.train = xf;
    o.test = tf;
    o.labels = yf;
    o.output = out;
    o.noise_auto = 0;
    o.noise = 0;
    o.force = 1;
    o.kernel_type = TPK_GP_KERNEL_NTK;
    o.predict_gd = 1;
    o.times = t;
    o.ntimes = 2;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    if (tpk_gp_experiment_run(&o, &ctx))
        fail_msg("%s", ctx.msg);
    tpk_array *gm = read_ds(out, "/gd_mean"), *pm = read_ds(out, "/mean");
    double err = tu_max_rel(gm->data + m, pm->data, m);
    print_message("NTK-GP posterior mean at zero noise vs the t = inf ensemble mean: %.1e\n", err);
    assert_true(err <= 1e-9);
    for (size_t i = 0; i < m; i++)
        assert_true(gm->data[i] == 0.0);
    /* the time coordinate: labels xarray shows */
    tpk_array_free(gm);
    tpk_array_free(pm);
    /* discrete steps at half the largest stable rate, many of them: converged to the same mean */
    const double steps[1] = {20000};
    o.times = steps;
    o.ntimes = 1;
    o.gd_steps = 1;
    o.lr = 0.5;
    tpk_ctx_init(&ctx);
    if (tpk_gp_experiment_run(&o, &ctx))
        fail_msg("%s", ctx.msg);
    tpk_array *sm = read_ds(out, "/gd_mean");
    pm = read_ds(out, "/mean");
    err = tu_max_rel(sm->data, pm->data, m);
    print_message("20000 steps of lr 0.5 vs the NTK-GP mean: %.1e\n", err);
    assert_true(err <= 1e-6);
    tpk_array_free(sm);
    tpk_array_free(pm);
}

static void test_checks(void **state)
{
    const tu_env *e = *state;
    char kf[512], yf[512], out[512], k1[512];
    tu_path(e, kf, sizeof kf, "kc.h5");
    tu_path(e, k1, sizeof k1, "k1.h5");
    tu_path(e, yf, sizeof yf, "yc.npy");
    tu_path(e, out, sizeof out, "never.h5");
    kernel_file(kf, 1);
    kernel_file(k1, 0); /* a kernel file without /ntk */
    tu_write_npy(yf, gdref_y, 2, (size_t[2]){GDREF_N, GDREF_K});
    const double good[2] = {0, 5}, neg[1] = {-1}, frac[1] = {2.5};
    static const struct { int which; const char *what; } bad[] = {
        {0, "--times"}, {1, ">= 0"}, {2, "whole numbers"}, {3, "/ntk"}, {4, "rbf"},
        {5, "--predict=gd"}, {6, "learning rate"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tpk_gp_experiment_opts o;
        tpk_gp_experiment_opts_default(&o);
        o.kernel_file = kf;
        o.labels = yf;
        o.output = out;
        o.predict_gd = 1;
        o.times = good;
        o.ntimes = 2;
        switch (bad[i].which) {
        case 0: o.ntimes = 0; break;
        case 1: o.times = neg; o.ntimes = 1; break;
        case 2: o.times = frac; o.ntimes = 1; o.gd_steps = 1; break;
        case 3: o.kernel_file = k1; break;
        case 4: o.kernel_file = NULL; o.kernel = "rbf"; o.train = yf; o.test = yf; break;
        case 5: o.predict_gd = 0; o.kernel_type = TPK_GP_KERNEL_NNGP; break; /* times alone */
        case 6: o.lr = -1; break;
        }
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        assert_int_not_equal(tpk_gp_experiment_run(&o, &ctx), TPK_OK);
        if (!strstr(ctx.msg, bad[i].what))
            fail_msg("case %zu: '%s' does not name '%s'", i, ctx.msg, bad[i].what);
        assert_int_not_equal(access(out, F_OK), 0);
    }
}

static int setup(void **state)
{
    return tu_setup_tagged(state, "gpgd");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_neural_tangents),
        cmocka_unit_test(test_ntkgp_identity),
        cmocka_unit_test(test_checks),
    };
    return cmocka_run_group_tests(tests, setup, tu_teardown);
}
