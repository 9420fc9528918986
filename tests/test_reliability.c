/* No run ends silently wrong (issue 18): the writer refuses NaN and infinities naming the dataset
 * and entry, and so every program leaves no file after a non-finite result (netsor run of a
 * division by 0); gpregress refuses label files longer than the items, an indefinite or
 * asymmetric precomputed kernel (smallest eigenvalue in the message), --noise=0 on duplicates
 * whose targets differ (and warns of the jitter when they agree); gpattention refuses tokens
 * that make its output identically 0; a --set that contradicts an architecture flag is an error
 * naming both, so no file records a parameter other than the one that ran. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/resource.h>

#include "support/testutil.h"
#include "tpk/io.h"

enum { N = 7, M = 4 };

static int setup(void **state)
{
    return tu_setup_tagged(state, "reliab");
}

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* rows×cols values as CSV. */
static void put_csv(const char *path, const double *v, size_t rows, size_t cols)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++)
            fprintf(f, "%.17g%c", v[i * cols + j], j + 1 < cols ? ',' : '\n');
    assert_int_equal(fclose(f), 0);
}

/* Run a tool that must fail (exit 1, or 2 for a usage error) with `want` (and `want2`, if
 * given) on stderr and leave no file at `out`. */
static void expect_fail(const tu_env *e, const char *tool, const char *args, const char *want,
                        const char *want2, const char *out)
{
    int rc = tu_run_tool(e, tool, args);
    char err[4096];
    tu_stderr(e, err, sizeof err);
    if ((rc != 1 && !(rc == 2 && strstr(err, "usage error"))) || !strstr(err, want) ||
        (want2 && !strstr(err, want2)))
        fail_msg("%s %s: exit %d, stderr '%s' (wanted '%s'%s%s)", tool, args, rc, err, want,
                 want2 ? " and " : "", want2 ? want2 : "");
    if (out && tu_exists(out))
        fail_msg("%s %s: left %s behind", tool, args, out);
}

/* The writer itself: a NaN in a dataset, an infinity in a vector or an attribute fails the file
 * with the dataset and entry named, commit refuses it and the destination keeps its old file. */
static void test_writer_refuses_nonfinite(void **state)
{
    const tu_env *e = *state;
    char p[512];
    tu_path(e, p, sizeof p, "w.h5");
    double good[6] = {2.385, -1.25, 0.5, 3.75, 1.125, 0.0625}, bad[6];
    memcpy(bad, good, sizeof bad);
    bad[5] = NAN; /* entry [1, 2] of a 2×3 array */
    tpk_array ag = {2, {2, 3, 0, 0}, good, {NULL, NULL}};
    tpk_array ab = {2, {2, 3, 0, 0}, bad, {NULL, NULL}};
    tpk_ctx ctx;

    /* a good file first: it must survive the failed writes below */
    tpk_ctx_init(&ctx);
    tpk_h5out *h = tpk_h5out_open(p, &ctx);
    assert_non_null(h);
    assert_int_equal(tpk_h5out_write(h, "/good", &ag, &ctx), TPK_OK);
    assert_int_equal(tpk_h5out_commit(h, &ctx), TPK_OK);

    tpk_ctx_init(&ctx);
    h = tpk_h5out_open(p, &ctx);
    assert_non_null(h);
    assert_int_equal(tpk_h5out_write(h, "/good", &ag, &ctx), TPK_OK);
    assert_int_equal(tpk_h5out_write(h, "/kernel", &ab, &ctx), TPK_EDOM);
    if (!strstr(ctx.msg, "'/kernel'") || !strstr(ctx.msg, "[1, 2]") || !strstr(ctx.msg, "NaN"))
        fail_msg("message '%s' does not name the dataset, entry and value", ctx.msg);
    assert_int_not_equal(tpk_h5out_commit(h, &ctx), TPK_OK);
    size_t cnt;
    double *back = tu_h5_read(p, "/good", &cnt); /* the old file, untouched */
    assert_int_equal(cnt, 6);
    assert_memory_equal(back, good, sizeof good);
    free(back);

    double v[3] = {1.5, INFINITY, 0.25};
    tpk_ctx_init(&ctx);
    h = tpk_h5out_open(p, &ctx);
    assert_non_null(h);
    assert_int_equal(tpk_h5out_write_vector(h, "/v", v, 3, &ctx), TPK_EDOM);
    if (!strstr(ctx.msg, "'/v'") || !strstr(ctx.msg, "[1]") || !strstr(ctx.msg, "+inf"))
        fail_msg("message '%s'", ctx.msg);
    tpk_h5out_abort(h);

    tpk_ctx_init(&ctx);
    h = tpk_h5out_open(p, &ctx);
    assert_non_null(h);
    assert_int_equal(tpk_h5out_attr_double(h, "/", "error_estimate", -INFINITY, &ctx), TPK_EDOM);
    if (!strstr(ctx.msg, "'error_estimate'") || !strstr(ctx.msg, "-inf"))
        fail_msg("message '%s'", ctx.msg);
    /* text attributes stay text, whatever they spell */
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_h5out_attr_auto(h, "/", "alpha", "nan", &ctx), TPK_OK);
    assert_int_not_equal(tpk_h5out_commit(h, &ctx), TPK_OK); /* the failed attribute */
}

/* A program dividing by 0: the constant 0 is a check error; a divisor that is 0 at run time gives
 * all-NaN outputs, refused, no file (it wrote one with exit 0 before). */
static void test_netsor_run_nonfinite(void **state)
{
    const tu_env *e = *state;
    char prog[512], in[512], out[512], args[2048];
    tu_path(e, prog, sizeof prog, "div0.nsr");
    tu_path(e, in, sizeof in, "x.csv");
    tu_path(e, out, sizeof out, "r.h5");
    /* division by the constant 0: the checker refuses it where it is written */
    put(prog, "param phi = relu\nwidth n\ninput x : d\nA U : (n, d) ~ 1.0\ng = U x\n"
              "h = phi(g) / 0\noutput y = readout(h, 1.0, 0.0)\n");
    snprintf(args, sizeof args, "check '%s'", prog);
    assert_int_not_equal(tu_run_tool(e, "netsor", args), 0);
    char err[2048];
    tu_stderr(e, err, sizeof err);
    assert_non_null(strstr(err, "div0.nsr:6:14: division by the constant 0"));
    /* a divisor that is 0 only when run (the difference of two equal Moments): the writers
     * refuse the non-finite result */
    put(prog, "use netsor+\nparam phi = relu\nwidth n\ninput x : d\nA U : (n, d) ~ 1.0\n"
              "g = U x\nh = phi(g) / (mean(g * g) - mean(g * g))\n"
              "output y = readout(h, 1.0, 0.0)\n");
    put(in, "0.25,1.5\n-0.75,2.125\n1.375,-0.5\n");
    snprintf(args, sizeof args, "run '%s' --input='%s' --width=16 --seed=3 --output='%s'", prog, in,
             out);
    expect_fail(e, "netsor", args, "non-finite", "entry [0, 0]", out);
    snprintf(args, sizeof args, "kernel '%s' --input='%s' --output='%s'", prog, in, out);
    int rc = tu_run_tool(e, "netsor", args);
    assert_int_not_equal(rc, 0);
    assert_false(tu_exists(out));
}

/* Training inputs, targets and test inputs of a small smooth problem. */
static void make_problem(const tu_env *e)
{
    double X[N * 3], Y[N], Xt[M * 3], Yt[M + 2];
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < 3; j++)
            X[i * 3 + j] = sin(0.731 * i + 1.37 * j);
        Y[i] = cos(0.913 * i);
    }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < 3; j++)
            Xt[i * 3 + j] = cos(0.57 * i + 0.29 * j);
    for (int i = 0; i < M + 2; i++)
        Yt[i] = sin(1.13 * i);
    char p[512];
    put_csv(tu_path(e, p, sizeof p, "x.csv"), X, N, 3);
    put_csv(tu_path(e, p, sizeof p, "y.csv"), Y, N, 1);
    put_csv(tu_path(e, p, sizeof p, "xt.csv"), Xt, M, 3);
    put_csv(tu_path(e, p, sizeof p, "yt.csv"), Yt, M, 1);
    put_csv(tu_path(e, p, sizeof p, "yt_long.csv"), Yt, M + 2, 1);
}

static void test_gpregress_label_count(void **state)
{
    const tu_env *e = *state;
    make_problem(e);
    char args[4096], d[256];
    snprintf(d, sizeof d, "%s", e->tmpdir);
    char out[512];
    tu_path(e, out, sizeof out, "o.h5");
    snprintf(args, sizeof args, "--arch=rbf --noise=0.0385 --train=%s/x.csv --labels=%s/y.csv "
             "--test=%s/xt.csv --test-labels=%s/yt_long.csv --quiet --output='%s'", d, d, d, d,
             out);
    expect_fail(e, "gpregress", args, "yt_long.csv has 6 rows but there are 4 test items", NULL,
                out);
    /* --n-test asks for the first items: the labels are cut with them */
    snprintf(args, sizeof args, "--arch=rbf --noise=0.0385 --train=%s/x.csv --labels=%s/y.csv "
             "--test=%s/xt.csv --n-test=3 --test-labels=%s/yt_long.csv --quiet --output='%s'", d,
             d, d, d, out);
    assert_int_equal(tu_run_tool(e, "gpregress", args), 0);
    assert_true(tu_exists(out));
    remove(out);
    snprintf(args, sizeof args, "--arch=rbf --noise=0.0385 --train=%s/x.csv --labels=%s/yt.csv "
             "--quiet --output='%s'", d, d, out);
    expect_fail(e, "gpregress", args, "yt.csv has 4 rows but there are 7 training items", NULL,
                out);
}

/* K = J + (δ − 1) I has eigenvalues δ − 1 (N − 1 times) and δ − 1 + N. */
static void test_gpregress_indefinite_kernel(void **state)
{
    const tu_env *e = *state;
    make_problem(e);
    double K[N * N];
    const double delta = 0.385;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++)
            K[i * N + j] = i == j ? delta : 1.0;
    char kf[512], out[512], args[4096];
    tu_path(e, kf, sizeof kf, "kind.h5");
    tu_path(e, out, sizeof out, "o.h5");
    tu_h5_write(kf, "/kernel", K, N, N);
    /* with the automatic noise it was accepted, the noise covering the negative eigenvalues */
    snprintf(args, sizeof args, "--kernel='%s' --labels=%s/y.csv --quiet --output='%s'", kf,
             e->tmpdir, out);
    expect_fail(e, "gpregress", args, "kind.h5: /kernel is not positive semidefinite",
                "smallest eigenvalue is -0.615", out);
    snprintf(args, sizeof args, "--kernel='%s' --labels=%s/y.csv --noise=0.01 --quiet "
             "--output='%s'", kf, e->tmpdir, out);
    expect_fail(e, "gpregress", args, "smallest eigenvalue is -0.615", NULL, out);
    /* asymmetric */
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++)
            K[i * N + j] = i == j ? 2.385 : 0.125 * exp(-fabs((double)(i - j)));
    K[2 * N + 5] += 0.0625;
    tu_path(e, kf, sizeof kf, "kasym.h5");
    tu_h5_write(kf, "/kernel", K, N, N);
    snprintf(args, sizeof args, "--kernel='%s' --labels=%s/y.csv --quiet --output='%s'", kf,
             e->tmpdir, out);
    expect_fail(e, "gpregress", args, "kasym.h5: /kernel is not symmetric", "[5, 2]", out);
    /* the symmetric version passes */
    K[2 * N + 5] -= 0.0625;
    tu_path(e, kf, sizeof kf, "kgood.h5");
    tu_h5_write(kf, "/kernel", K, N, N);
    snprintf(args, sizeof args, "--kernel='%s' --labels=%s/y.csv --quiet --output='%s'", kf,
             e->tmpdir, out);
    assert_int_equal(tu_run_tool(e, "gpregress", args), 0);
    remove(out);
    /* test blocks that are no covariance with it: a negative test variance, and test×train
     * entries larger than the test variance allows (the joint matrix indefinite); both gave a
     * predictive variance of 0 without a word */
    const struct {
        const char *name;
        double cross, diag;
        const char *want, *want2;
    } bad[] = {{"kneg.h5", 0.0, -1.0, "kneg.h5: /kernel_test_diag is not a variance",
                "[0] = -1"},
               {"kjoint.h5", 1.5, 0.125, "test item 0: its prior variance k(x,x) = 0.125",
                "joint matrix is not PSD"}};
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        tu_path(e, kf, sizeof kf, bad[b].name);
        tpk_array Ka = {.ndim = 2, .dims = {N, N}, .data = K};
        double row[N], dg[1] = {bad[b].diag};
        for (int j = 0; j < N; j++)
            row[j] = bad[b].cross;
        tpk_array Ra = {.ndim = 2, .dims = {1, N}, .data = row};
        tpk_h5out *o = tpk_h5out_open(kf, &ctx);
        assert_non_null(o);
        assert_int_equal(tpk_h5out_write(o, "/kernel", &Ka, &ctx), 0);
        assert_int_equal(tpk_h5out_write(o, "/kernel_test_train", &Ra, &ctx), 0);
        assert_int_equal(tpk_h5out_write_vector(o, "/kernel_test_diag", dg, 1, &ctx), 0);
        assert_int_equal(tpk_h5out_commit(o, &ctx), 0);
        snprintf(args, sizeof args, "--kernel='%s' --labels=%s/y.csv --noise=0.01 --quiet "
                 "--output='%s'", kf, e->tmpdir, out);
        expect_fail(e, "gpregress", args, bad[b].want, bad[b].want2, out);
    }
}

static void test_gpregress_noise0_duplicates(void **state)
{
    const tu_env *e = *state;
    double X[2 * N * 3], Y[2 * N], Ysame[2 * N];
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < 3; j++)
            X[i * 3 + j] = X[(N + i) * 3 + j] = sin(0.731 * i + 1.37 * j);
        Y[i] = Ysame[i] = Ysame[N + i] = cos(0.913 * i);
        Y[N + i] = cos(0.913 * i) + 0.0385;
    }
    char p[512], out[512], args[4096];
    put_csv(tu_path(e, p, sizeof p, "xd.csv"), X, 2 * N, 3);
    put_csv(tu_path(e, p, sizeof p, "yd.csv"), Y, 2 * N, 1);
    put_csv(tu_path(e, p, sizeof p, "ysame.csv"), Ysame, 2 * N, 1);
    tu_path(e, out, sizeof out, "o.h5");
    for (int mlp = 0; mlp < 2; mlp++) {
        snprintf(args, sizeof args, "--arch=%s --noise=0 --train=%s/xd.csv --labels=%s/yd.csv "
                 "--quiet --output='%s'", mlp ? "mlp" : "rbf", e->tmpdir, e->tmpdir, out);
        expect_fail(e, "gpregress", args, "training items 0 and 7 are the same point",
                    "their targets differ", out);
    }
    /* a noise below the jitter asks to interpolate as well */
    snprintf(args, sizeof args, "--arch=mlp --noise=1e-300 --train=%s/xd.csv --labels=%s/yd.csv "
             "--quiet --output='%s'", e->tmpdir, e->tmpdir, out);
    expect_fail(e, "gpregress", args, "--noise=1e-300 asks to interpolate",
                "targets are not in its range", out);
    /* no duplicates, but item N+i = 2 x item i: under the bias-free ReLU kernel f(2x) = 2 f(x)
     * (K is singular) and these targets are not 2:1 (it gave LML -6.3e8 with exit 0) */
    for (int i = 0; i < N; i++)
        for (int j = 0; j < 3; j++)
            X[(N + i) * 3 + j] = 2 * X[i * 3 + j];
    put_csv(tu_path(e, p, sizeof p, "x2.csv"), X, 2 * N, 3);
    snprintf(args, sizeof args, "--arch=mlp --noise=0 --train=%s/x2.csv --labels=%s/yd.csv "
             "--quiet --output='%s'", e->tmpdir, e->tmpdir, out);
    expect_fail(e, "gpregress", args, "x2.csv: --noise=0 asks to interpolate",
                "targets are not in its range", out);
    /* equal targets: interpolation exists; the jitter is reported, the file has no NaN */
    snprintf(args, sizeof args, "--arch=rbf --noise=0 --train=%s/xd.csv --labels=%s/ysame.csv "
             "--output='%s'", e->tmpdir, e->tmpdir, out);
    assert_int_equal(tu_run_tool(e, "gpregress", args), 0);
    char err[4096];
    tu_stderr(e, err, sizeof err);
    if (!strstr(err, "warning: --noise=0 but the kernel is numerically singular: jitter"))
        fail_msg("no jitter warning: '%s'", err);
    size_t cnt;
    double *lml = tu_h5_read(out, "/lml", &cnt);
    assert_int_equal(cnt, 1);
    assert_true(isfinite(lml[0]));
    free(lml);
    remove(out);
}

static void test_gpattention_zero_tokens(void **state)
{
    const tu_env *e = *state;
    double z[2 * 3 * 4] = {0};
    size_t dims[3] = {2, 3, 4};
    char in[512], out[512], args[2048];
    tu_write_npy(tu_path(e, in, sizeof in, "zero.npy"), z, 3, dims);
    tu_path(e, out, sizeof out, "a.h5");
    snprintf(args, sizeof args, "--input='%s' --widths=4,8 --networks=16 --score-samples=16 "
             "--heads-list=1,2 --quiet --output='%s'", in, out);
    expect_fail(e, "gpattention", args, "zero.npy: the first output y_1 is identically 0",
                "kurtosis", out);
    /* nonzero tokens still run */
    for (int i = 0; i < 2 * 3 * 4; i++)
        z[i] = sin(0.731 * i + 0.25);
    tu_write_npy(in, z, 3, dims);
    assert_int_equal(tu_run_tool(e, "gpattention", args), 0);
    remove(out);
}

/* A numeric root attribute (a float, or an integer: integer parameters are stored as integers),
 * read with raw HDF5 (NaN when absent or not a number). */
static double attr_double(const char *file, const char *name)
{
    double v = NAN;
    hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    assert_true(f >= 0);
    if (H5Aexists(f, name) > 0) {
        hid_t a = H5Aopen(f, name, H5P_DEFAULT);
        hid_t t = H5Aget_type(a);
        H5T_class_t cls = H5Tget_class(t);
        if ((cls == H5T_FLOAT || cls == H5T_INTEGER) && H5Aread(a, H5T_NATIVE_DOUBLE, &v) < 0)
            v = NAN;
        H5Tclose(t);
        H5Aclose(a);
    }
    H5Fclose(f);
    return v;
}

/* A --set naming a flag's parameter: gpkernel computed 5 layers and recorded depth=2. */
static void test_conflicting_flags(void **state)
{
    const tu_env *e = *state;
    char out[512], args[2048];
    tu_path(e, out, sizeof out, "k.h5");
    snprintf(args, sizeof args, "--arch=mlp --depth=2 --set L=5 --quiet --output='%s'", out);
    expect_fail(e, "gpkernel", args, "--set L=5 conflicts with --depth=2", "parameter L", out);
    snprintf(args, sizeof args, "--arch=rnn --sigma-w2=2 --set sigma_w2=3 --quiet --output='%s'",
             out);
    expect_fail(e, "gpkernel", args, "--set sigma_w2=3 conflicts with --sigma-w2=2", NULL, out);
    snprintf(args, sizeof args, "--arch=transformer --ln-eps=1e-5 --set eps=0.001 --quiet "
             "--output='%s'", out);
    expect_fail(e, "gpkernel", args, "--set eps=0.001 conflicts with --ln-eps=1e-5", NULL, out);
    snprintf(args, sizeof args, "--arch=mlp --depth=2 --set L=5 --widths=8,16 --seeds=4 --quiet "
             "--output='%s'", out);
    expect_fail(e, "gplimits", args, "--set L=5 conflicts with --depth=2", NULL, out);
    /* either alone is fine; the file records the depth that ran */
    snprintf(args, sizeof args, "--arch=mlp --set L=5 --quiet --output='%s'", out);
    assert_int_equal(tu_run_tool(e, "gpkernel", args), 0);
    assert_true(attr_double(out, "depth") == 5.0);
    assert_true(attr_double(out, "L") == 5.0);
    remove(out);
    /* the CNN's --filter and --padding set the program's k and circular: with a --set of those
     * the --set was overridden (and a lone --set circular=0 lost to the default padding, the
     * file saying circular) */
    char seq[512], sq[1100];
    double v[2 * 5 * 2];
    for (int i = 0; i < 20; i++)
        v[i] = sin(0.731 * i + 0.25);
    tu_write_npy(tu_path(e, seq, sizeof seq, "sig.npy"), v, 3, (size_t[]){2, 5, 2});
    snprintf(sq, sizeof sq, "--input='%s'", seq);
    snprintf(args, sizeof args, "--arch=cnn1d %s --filter=3 --set k=5 --quiet --output='%s'", sq,
             out);
    expect_fail(e, "gpkernel", args, "--set k=5 conflicts with --filter=3", NULL, out);
    snprintf(args, sizeof args, "--arch=cnn1d %s --padding=zero --set circular=1 --quiet "
             "--output='%s'", sq, out);
    expect_fail(e, "gpkernel", args, "--set circular=1 conflicts with --padding=zero", NULL, out);
    snprintf(args, sizeof args, "--arch=cnn1d %s --filter=3 --set k=5 --widths=8,16 --seeds=4 "
             "--quiet --output='%s'", sq, out);
    expect_fail(e, "gplimits", args, "--set k=5 conflicts with --filter=3", NULL, out);
    snprintf(args, sizeof args, "--arch=cnn1d %s --set circular=0 --quiet --output='%s'", sq, out);
    assert_int_equal(tu_run_tool(e, "gpkernel", args), 0);
    assert_true(attr_double(out, "circular") == 0.0);
    remove(out);
}

/* Messages name the cause in the user's terms: an underflowing or overflowing recursion (not
 * "covariance not PSD" or "q1 = inf"), a --set value by its column (not "VALUE:1:1"), and test
 * items by their shapes (not flattened sizes). */
static void test_messages(void **state)
{
    const tu_env *e = *state;
    char out[512], args[2048], x[512], t[512], p[512];
    tu_path(e, out, sizeof out, "k.h5");
    snprintf(args, sizeof args, "--arch=mlp --sigma-w2=1 --depth=2000 --quiet --output='%s'", out);
    expect_fail(e, "gpkernel", args, "the kernel underflowed", "fewer layers or a larger weight "
                "variance", out);
    snprintf(args, sizeof args, "--arch=mlp --sigma-w2=1e300 --depth=3 --quiet --output='%s'", out);
    expect_fail(e, "gpkernel", args, "overflowed to inf", NULL, out);
    tu_path(e, x, sizeof x, "seq.csv");
    tu_path(e, p, sizeof p, "mlp.nsr");
    put(p, "param L = 2\nparam sigma_w2 = 2\nwidth n\ninput x : d\nA U : (n, d) ~ 1\n"
           "A W : (n, n) ~ sigma_w2\ng = U x\nh = W relu(g)\noutput y = readout(relu(h), 1)\n");
    double v[6] = {1, 2, 3, 4, 5, 6};
    put_csv(x, v, 2, 3);
    snprintf(args, sizeof args, "kernel '%s' --set sigma_w2=nan --input='%s' --quiet --output='%s'",
             p, x, out);
    expect_fail(e, "netsor", args, "--set sigma_w2=nan (column 1): undefined name 'nan'",
                "must be a finite number", out);
    snprintf(args, sizeof args, "kernel '%s' --set 'sigma_w2=2*bogus' --input='%s' --quiet "
             "--output='%s'", p, x, out);
    expect_fail(e, "netsor", args, "--set sigma_w2=2*bogus (column 3): undefined name 'bogus'",
                "expression of the program's parameters", out);
    tu_path(e, t, sizeof t, "test.csv");
    put_csv(t, v, 3, 2);
    snprintf(args, sizeof args, "--arch=mlp --input='%s' --test='%s' --quiet --output='%s'", x, t,
             out);
    expect_fail(e, "gpkernel", args, "test items have 2 values each (shape 2)",
                "have 3 (shape 3)", out);
    /* gpregress: huge targets were "the kernel has eigenvalues below ...", huge inputs blamed
     * sigma-w2 and the depth, a huge RBF amplitude gave "noise range must satisfy 0 < lo < hi <
     * inf (got inf, inf)" */
    double yb[2] = {1e300, -2e300}, xb[6] = {1e200, 2, 3, 4, 5, 6};
    char yf[512], xf[512];
    put_csv(tu_path(e, yf, sizeof yf, "ybig.csv"), yb, 2, 1);
    put_csv(tu_path(e, xf, sizeof xf, "xbig.csv"), xb, 2, 3);
    snprintf(args, sizeof args, "--arch=mlp --train='%s' --labels='%s' --quiet --output='%s'", x,
             yf, out);
    expect_fail(e, "gpregress", args, "ybig.csv: the targets' squares sum beyond the range",
                "rescale the targets", out);
    snprintf(args, sizeof args, "--arch=mlp --train='%s' --labels='%s' --quiet --output='%s'", xf,
             yf, out);
    expect_fail(e, "gpregress", args, "xbig.csv: item 0 has a squared norm beyond the range",
                "rescale the inputs", out);
    yb[0] = 0.5;
    yb[1] = -0.25;
    put_csv(yf, yb, 2, 1);
    snprintf(args, sizeof args, "--arch=rbf --amplitude=1e308 --train='%s' --labels='%s' --quiet "
             "--output='%s'", x, yf, out);
    expect_fail(e, "gpregress", args, "the kernel's mean diagonal is 1e+308", "amplitude", out);
    /* numbers beyond a double: at the --set, and as what they are (were "mlp.nsr:1:1: a
     * parameter value is not finite" and "'1e-320' is not a number") */
    snprintf(args, sizeof args, "kernel '%s' --set L=1e400 --input='%s' --quiet --output='%s'", p,
             x, out);
    expect_fail(e, "netsor", args, "--set L=1e400 (column 1): number '1e400' is beyond the range",
                NULL, out);
    snprintf(args, sizeof args, "--arch=rbf --lengthscale2=1e-320 --train='%s' --labels='%s' "
             "--quiet --output='%s'", x, yf, out);
    expect_fail(e, "gpregress", args, "'1e-320' is below the smallest normal double", NULL, out);
    snprintf(args, sizeof args, "--arch=mlp --sigma-w2=1e400 --quiet --output='%s'", out);
    expect_fail(e, "gpkernel", args, "'1e400' is beyond the range of a double", NULL, out);
    /* gpattention: tokens whose products underflow are not "zero"; huge ones are refused up
     * front (the file was refused at the end for a NaN kurtosis) */
    double tok[2 * 2 * 3];
    char tf[512];
    for (int i = 0; i < 12; i++)
        tok[i] = 1e-170 * sin(0.731 * i + 0.25);
    tu_write_npy(tu_path(e, tf, sizeof tf, "tiny.npy"), tok, 3, (size_t[]){2, 2, 3});
    snprintf(args, sizeof args, "--input='%s' --widths=4,8 --networks=16 --score-samples=16 "
             "--heads-list=1,2 --quiet --output='%s'", tf, out);
    expect_fail(e, "gpattention", args, "tiny.npy: the first output y_1 is identically 0",
                "underflow", out);
    for (int i = 0; i < 12; i++)
        tok[i] = 1e150 * sin(0.731 * i + 0.25);
    tu_write_npy(tf, tok, 3, (size_t[]){2, 2, 3});
    expect_fail(e, "gpattention", args, "tiny.npy: the token kernel reaches", "rescale", out);
}

/* A write that fails (here a file size limit, as a full disk) ends in a message naming the cause,
 * exit 1, no temp file, and the previous good file unchanged; before, SIGXFSZ killed the tool
 * mid-write, and with the signal ignored HDF5's exit-time shutdown crashed on the file it could
 * not close. */
static void test_write_failure_keeps_old_file(void **state)
{
    const tu_env *e = *state;
    char x[512], out[512], args[2048];
    tu_path(e, x, sizeof x, "big.csv");
    tu_path(e, out, sizeof out, "keep.h5");
    double v[300 * 4];
    for (int i = 0; i < 300 * 4; i++)
        v[i] = sin(0.37 * i) + 0.1 * (i % 7);
    put_csv(x, v, 8, 4); /* a small run first: the good file */
    snprintf(args, sizeof args, "--arch=mlp --input='%s' --output='%s' --quiet", x, out);
    assert_int_equal(tu_run_tool(e, "gpkernel", args), 0);
    FILE *f = fopen(out, "rb");
    assert_non_null(f);
    char good[65536];
    size_t ng = fread(good, 1, sizeof good, f);
    fclose(f);
    put_csv(x, v, 300, 4); /* 300×300 doubles: 720 KB, beyond the limit below */
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 200 * 1024;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int rc = tu_run_tool(e, "gpkernel", args);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    char err[4096];
    tu_stderr(e, err, sizeof err);
    if (rc != 1 || strstr(err, "File too large") == NULL || strstr(err, "unchanged") == NULL)
        fail_msg("gpkernel under a file size limit: exit %d, '%s'", rc, err);
    f = fopen(out, "rb");
    assert_non_null(f);
    char now[65536];
    size_t nn = fread(now, 1, sizeof now, f);
    fclose(f);
    assert_true(nn == ng && memcmp(now, good, ng) == 0);
    DIR *d = opendir(e->tmpdir);
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        assert_null(strstr(de->d_name, ".tmp."));
    closedir(d);
    /* gpattention's datasets are small: its file reaches the disk at the commit's flush, whose
     * failure named no cause ("HDF5 flush/close ... failed") */
    snprintf(args, sizeof args, "--output='%s' --quiet --networks=50 --score-samples=50 "
             "--widths=4,8 --heads-list=1,2", out);
    assert_int_equal(tu_run_tool(e, "gpattention", args), 0);
    lim.rlim_cur = 8 * 1024;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    rc = tu_run_tool(e, "gpattention", args);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    tu_stderr(e, err, sizeof err);
    if (rc != 1 || strstr(err, "File too large") == NULL || strstr(err, "unchanged") == NULL)
        fail_msg("gpattention under a file size limit: exit %d, '%s'", rc, err);
    assert_true(tu_exists(out));
}

/* What a reader chooses for the user is said (issue 18, "silent choices"): a CSV line is a
 * header only when none of its fields is a number, with a note; a rank-1 input is read as N×1
 * with a note; rank-1 targets (class labels) are what they mean, no note. */
static void test_silent_choices(void **state)
{
    const tu_env *e = *state;
    char x[512], h[512], r[512], out[512], args[2048], err[4096];
    tu_path(e, out, sizeof out, "sc.h5");
    put(tu_path(e, h, sizeof h, "head.csv"), "alpha,beta\n0.25,1.5\n-0.5,2\n1,0.125\n");
    snprintf(args, sizeof args, "--arch=mlp --input='%s' --output='%s' --quiet", h, out);
    assert_int_equal(tu_run_tool(e, "gpkernel", args), 0);
    tu_stderr(e, err, sizeof err);
    if (!strstr(err, "note: ") || !strstr(err, "head.csv:1: taken as a header line"))
        fail_msg("no header note: '%s'", err);
    size_t n;
    double *k = tu_h5_read(out, "/kernel", &n);
    assert_int_equal(n, 9); /* three data rows */
    free(k);
    remove(out);
    put(tu_path(e, x, sizeof x, "numhead.csv"), "1,2,abc\n0.25,1.5,2\n-0.5,2,1\n");
    snprintf(args, sizeof args, "--arch=mlp --input='%s' --output='%s' --quiet", x, out);
    expect_fail(e, "gpkernel", args, "numhead.csv:1: column 3: 'abc' is not a number", NULL,
                out);
    double v[4] = {0.25, -1.5, 2.125, 0.5};
    tu_write_npy(tu_path(e, r, sizeof r, "vec.npy"), v, 1, (size_t[]){4});
    snprintf(args, sizeof args, "--arch=mlp --input='%s' --output='%s' --quiet", r, out);
    assert_int_equal(tu_run_tool(e, "gpkernel", args), 0);
    tu_stderr(e, err, sizeof err);
    if (!strstr(err, "vec.npy: a rank-1 array of 4 values, read as 4 items"))
        fail_msg("no rank-1 note: '%s'", err);
    remove(out);
    double xs[8] = {0.25, 1.5, -0.5, 2, 1, 0.125, 0.75, -1};
    put_csv(tu_path(e, x, sizeof x, "x4.csv"), xs, 4, 2);
    snprintf(args, sizeof args, "--arch=mlp --train='%s' --labels='%s' --noise=0.1 "
             "--output='%s' --quiet", x, r, out);
    assert_int_equal(tu_run_tool(e, "gpregress", args), 0);
    tu_stderr(e, err, sizeof err);
    assert_null(strstr(err, "note: "));
    remove(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_writer_refuses_nonfinite),
        cmocka_unit_test(test_netsor_run_nonfinite),
        cmocka_unit_test(test_gpregress_label_count),
        cmocka_unit_test(test_gpregress_indefinite_kernel),
        cmocka_unit_test(test_gpregress_noise0_duplicates),
        cmocka_unit_test(test_gpattention_zero_tokens),
        cmocka_unit_test(test_conflicting_flags),
        cmocka_unit_test(test_messages),
        cmocka_unit_test(test_write_failure_keeps_old_file),
        cmocka_unit_test(test_silent_choices),
    };
    return cmocka_run_group_tests(tests, setup, tu_teardown);
}
