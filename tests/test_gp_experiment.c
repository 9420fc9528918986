/* The GP experiment API (tpk_gp_experiment_run, gp/experiment.c) on its own: the same datasets
 * as gpregress with the same options (a depth sweep with test targets, a precomputed kernel,
 * classification with fitted hyperparameters), its summary lines, and every check of the
 * options with no output left behind. */
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
#include "tpk/gp.h"
#include "tpk/io.h"

enum { N = 30, M = 8 };

static void csv(const tu_env *e, const char *name, const double *v, size_t r, size_t c)
{
    char p[512];
    FILE *f = fopen(tu_path(e, p, sizeof p, name), "w");
    assert_non_null(f);
    for (size_t i = 0; i < r; i++)
        for (size_t j = 0; j < c; j++)
            fprintf(f, "%.17g%c", v[i * c + j], j + 1 < c ? ',' : '\n');
    fclose(f);
}

static int setup(void **state)
{
    if (tu_setup_tagged(state, "gpexp"))
        return -1;
    const tu_env *e = *state;
    double X[N * 3], Xt[M * 3], Y[N * 2], Yt[M * 2], L[N], Lt[M];
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < 3; j++)
            X[i * 3 + j] = sin(0.731 * i + 1.37 * j) + 0.1 * j;
        Y[i * 2] = X[i * 3] - 0.385 * X[i * 3 + 2];
        Y[i * 2 + 1] = 2 * X[i * 3 + 1];
        L[i] = X[i * 3] > 0 ? 1 : 0;
    }
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < 3; j++)
            Xt[i * 3 + j] = cos(0.913 * i + 0.57 * j);
        Yt[i * 2] = Xt[i * 3] - 0.385 * Xt[i * 3 + 2];
        Yt[i * 2 + 1] = 2 * Xt[i * 3 + 1];
        Lt[i] = Xt[i * 3] > 0 ? 1 : 0;
    }
    csv(e, "x.csv", X, N, 3);
    csv(e, "xt.csv", Xt, M, 3);
    csv(e, "y.csv", Y, N, 2);
    csv(e, "yt.csv", Yt, M, 2);
    csv(e, "l.csv", L, N, 1);
    csv(e, "lt.csv", Lt, M, 1);
    return 0;
}

static tpk_gp_experiment_opts opts_in(const tu_env *e, char paths[8][512])
{
    static const char *const names[8] = {"x.csv", "xt.csv", "y.csv", "yt.csv", "l.csv",
                                         "lt.csv", "lib.h5", "k.h5"};
    for (int i = 0; i < 8; i++)
        tu_path(e, paths[i], 512, names[i]);
    tpk_gp_experiment_opts o;
    tpk_gp_experiment_opts_default(&o);
    o.train = paths[0];
    o.test = paths[1];
    o.labels = paths[2];
    o.test_labels = paths[3];
    o.output = paths[6];
    return o;
}

/* Every dataset of `names` equal to the last bit in two files. */
static void same_datasets(const char *a, const char *b, const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t ca, cb;
        double *x = tu_h5_read(a, names[i], &ca), *y = tu_h5_read(b, names[i], &cb);
        assert_int_equal(ca, cb);
        for (size_t k = 0; k < ca; k++)
            if (memcmp(&x[k], &y[k], sizeof(double)) != 0)
                fail_msg("%s[%zu]: %.17g (library) vs %.17g (gpregress)", names[i], k, x[k], y[k]);
        free(x);
        free(y);
    }
}

static void test_sweep_matches_cli(void **state)
{
    const tu_env *e = *state;
    char p[8][512], cli[512], args[4096], sum[512];
    tpk_gp_experiment_opts o = opts_in(e, p);
    o.kernel = "mlp";
    o.phi = "erf";
    o.depth_lo = 1;
    o.depth_hi = 3;
    o.sigma_b2 = 0.1;
    o.select_n = 20;
    FILE *f = fopen(tu_path(e, sum, sizeof sum, "summary.txt"), "w+");
    assert_non_null(f);
    o.summary = f;
    o.name = "exp";
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    if (tpk_gp_experiment_run(&o, &ctx))
        fail_msg("%s", ctx.msg);
    rewind(f);
    char text[4096];
    size_t k = fread(text, 1, sizeof text - 1, f);
    text[k] = '\0';
    fclose(f);
    assert_non_null(strstr(text, "exp: mlp, N=30 train, M=8 test, C=2 outputs"));
    assert_non_null(strstr(text, "  depth 3  noise"));
    assert_non_null(strstr(text, " nll "));
    snprintf(args, sizeof args, "--arch=mlp --phi=erf --depth=1-3 --sigma-b2=0.1 --select-n=20 "
             "--train='%s' --test='%s' --labels='%s' --test-labels='%s' --quiet --output='%s'",
             p[0], p[1], p[2], p[3], tu_path(e, cli, sizeof cli, "cli.h5"));
    assert_int_equal(tu_run_tool(e, "gpregress", args), 0);
    static const char *const names[] = {"/depths", "/noise", "/scale", "/lml", "/lml_select",
                                        "/jitter", "/rcond", "/nll", "/rmse", "/depth_1/mean",
                                        "/depth_2/var", "/depth_3/mean", "/depth_3/var"};
    same_datasets(p[6], cli, names, sizeof names / sizeof names[0]);
}

static void test_classify_and_kernel_file(void **state)
{
    const tu_env *e = *state;
    char p[8][512], cli[512], args[4096];
    tpk_gp_experiment_opts o = opts_in(e, p);
    o.kernel = "rbf";
    o.fit_hyper = 1;
    o.classify = 1;
    o.center = 1;
    o.labels = p[4];
    o.test_labels = p[5];
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    if (tpk_gp_experiment_run(&o, &ctx))
        fail_msg("%s", ctx.msg);
    snprintf(args, sizeof args, "--arch=rbf --fit-hyper --classify --center --train='%s' "
             "--test='%s' --labels='%s' --test-labels='%s' --quiet --output='%s'", p[0], p[1],
             p[4], p[5], tu_path(e, cli, sizeof cli, "cli2.h5"));
    assert_int_equal(tu_run_tool(e, "gpregress", args), 0);
    static const char *const names[] = {"/fitted_lengthscale2", "/fitted_amplitude", "/noise",
                                        "/lml", "/accuracy", "/mean", "/var"};
    same_datasets(p[6], cli, names, sizeof names / sizeof names[0]);
    size_t c;
    double *acc = tu_h5_read(p[6], "/accuracy", &c);
    assert_true(acc[0] >= 0.5); /* two classes split by the sign of a feature */
    free(acc);

    /* A precomputed kernel: RBF written here, the file path of gpkernel --test. */
    double K[N * N], Kxt[M * N], kd[M], X[N * 3], Xt[M * 3];
    for (int i = 0; i < N; i++)
        for (int j = 0; j < 3; j++)
            X[i * 3 + j] = sin(0.731 * i + 1.37 * j) + 0.1 * j;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < 3; j++)
            Xt[i * 3 + j] = cos(0.913 * i + 0.57 * j);
    for (int a = 0; a < N + M; a++)
        for (int b = 0; b < N; b++) {
            const double *u = a < N ? X + a * 3 : Xt + (a - N) * 3, *v = X + b * 3;
            double q = 0;
            for (int j = 0; j < 3; j++)
                q += (u[j] - v[j]) * (u[j] - v[j]);
            (a < N ? K + a * N : Kxt + (a - N) * N)[b] = 1.3 * exp(-q / 1.4);
        }
    for (int i = 0; i < M; i++)
        kd[i] = 1.3;
    tpk_h5out *h = tpk_h5out_open(p[7], &ctx);
    assert_non_null(h);
    tpk_array aK = {2, {N, N, 0, 0}, K, {NULL, NULL}}, aX = {2, {M, N, 0, 0}, Kxt, {NULL, NULL}};
    assert_int_equal(tpk_h5out_write(h, "/kernel", &aK, &ctx), 0);
    assert_int_equal(tpk_h5out_write(h, "/kernel_test_train", &aX, &ctx), 0);
    assert_int_equal(tpk_h5out_write_vector(h, "/kernel_test_diag", kd, M, &ctx), 0);
    assert_int_equal(tpk_h5out_commit(h, &ctx), 0);
    tpk_gp_experiment_opts_default(&o);
    o.kernel_file = p[7];
    o.labels = p[2];
    o.test_labels = p[3];
    o.noise_auto = 0;
    o.noise = 0.0385;
    o.output = p[6];
    if (tpk_gp_experiment_run(&o, &ctx))
        fail_msg("%s", ctx.msg);
    snprintf(args, sizeof args, "--kernel='%s' --noise=0.0385 --labels='%s' --test-labels='%s' "
             "--quiet --output='%s'", p[7], p[2], p[3], cli);
    assert_int_equal(tu_run_tool(e, "gpregress", args), 0);
    static const char *const kn[] = {"/noise", "/lml", "/rcond", "/mean", "/var", "/rmse"};
    same_datasets(p[6], cli, kn, sizeof kn / sizeof kn[0]);
}

static void test_checks(void **state)
{
    const tu_env *e = *state;
    char p[8][512], out[512];
    tpk_gp_experiment_opts base = opts_in(e, p), o;
    base.kernel = "mlp";
    base.output = tu_path(e, out, sizeof out, "never.h5");
    struct { const char *field; const char *needle; } cases[] = {
        {"both", "exactly one"}, {"none", "exactly one"}, {"arch", "unknown --arch"},
        {"train", "--train"}, {"kernel_train", "do not apply"}, {"labels", "--labels"},
        {"output", "--output"}, {"test_labels", "--test-labels needs --test"},
        {"depth", "--depth"}, {"depth_rbf", "--arch=mlp"}, {"full_cov", "single depth"},
        {"fit_hyper", "kernel family"}, {"noise", "--noise"}, {"sigma", "sigma-w2"},
        {"l2", "lengthscale2"}, {"quad", "--quad-degree"}, {"select", "--select-n"},
        {"phi", "nosuchphi"}, {"rows", "rows"}, {"classes", "one integer label"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        o = base;
        const char *c = cases[i].field;
        if (!strcmp(c, "both")) o.kernel_file = p[7];
        if (!strcmp(c, "none")) o.kernel = NULL;
        if (!strcmp(c, "arch")) o.kernel = "cnn";
        if (!strcmp(c, "train")) o.train = NULL;
        if (!strcmp(c, "kernel_train")) o.kernel = NULL, o.kernel_file = p[7];
        if (!strcmp(c, "labels")) o.labels = NULL;
        if (!strcmp(c, "output")) o.output = NULL;
        if (!strcmp(c, "test_labels")) o.test = NULL;
        if (!strcmp(c, "depth")) o.depth_lo = 3, o.depth_hi = 1;
        if (!strcmp(c, "depth_rbf")) o.kernel = "rbf", o.depth_lo = 1;
        if (!strcmp(c, "full_cov")) o.full_cov = 1, o.depth_lo = 1;
        if (!strcmp(c, "fit_hyper")) o.kernel = NULL, o.kernel_file = p[7], o.train = o.test = NULL,
                                     o.fit_hyper = 1;
        if (!strcmp(c, "noise")) o.noise_auto = 0, o.noise = -1;
        if (!strcmp(c, "sigma")) o.sigma_w2 = -2;
        if (!strcmp(c, "l2")) o.lengthscale2 = 0;
        if (!strcmp(c, "quad")) o.quad_degree = 1000;
        if (!strcmp(c, "select")) o.select_n = 1;
        if (!strcmp(c, "phi")) o.phi = "nosuchphi";
        if (!strcmp(c, "rows")) o.labels = p[3]; /* M rows for N items */
        if (!strcmp(c, "classes")) o.classify = 1; /* two values per item */
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        int st = tpk_gp_experiment_run(&o, &ctx);
        if (st == TPK_OK || !strstr(ctx.msg, cases[i].needle))
            fail_msg("case %s: status %d, '%s' (wanted '%s')", c, st, ctx.msg, cases[i].needle);
        if (tu_exists(out))
            fail_msg("case %s left %s behind", c, out);
    }
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gp_experiment_check(NULL, &ctx), TPK_EINVAL);
    assert_int_equal(tpk_gp_experiment_check(&base, &ctx), TPK_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sweep_matches_cli),
        cmocka_unit_test(test_classify_and_kernel_file),
        cmocka_unit_test(test_checks),
    };
    return cmocka_run_group_tests(tests, setup, tu_teardown);
}
