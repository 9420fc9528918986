/* Kernels without files (tpk_arch_kernel, tpk_arch_job, tpk_job_kernel_arrays,
 * tpk_job_run_arrays; the path of the Python package): numbers against an independent MLP
 * recursion written here, the in-memory result against the gpkernel job's file, every error. */
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
#include "tpk/archs.h"
#include "tpk/job.h"

/* Closed forms on both sides: only rounding of O(d) sums over three layers is left. */
#define TOL_CLOSED 1e-12
/* The same computation reached through a file: HDF5 stores the doubles exactly. */
#define TOL_SAME 0.0

enum { N = 5, M = 3, D = 4 };
static const int depth = 3;
static const double sw2 = 2.0, sb2 = 0.1;

static int setup(void **state) { return tu_setup_tagged(state, "archk"); }

static const char *root(void)
{
    const char *r = getenv("TPK_ROOT");
    return r ? r : ".";
}

/* Deterministic "high-entropy" inputs. */
static void inputs(double *x, int n, double phase)
{
    for (int a = 0; a < n; a++)
        for (int j = 0; j < D; j++)
            x[a * D + j] = sin(1.37 * a + 2.11 * j + phase) * (1.0 + 0.3 * a);
}

/* Cho & Saul's degree-1 arc-cosine kernel, written out here (theory.md §3.2). */
static double relu_e2(double q1, double q2, double k)
{
    double s = sqrt(q1 * q2), r = s > 0 ? fmax(-1.0, fmin(1.0, k / s)) : 0, th = acos(r);
    return s / (2 * M_PI) * (sin(th) + (M_PI - th) * r);
}

/* The MLP NNGP Σ^{L+1}(x, x′) of the README's convention for one pair of inputs. */
static double mlp_ref(const double *x, const double *y)
{
    double xx = 0, yy = 0, xy = 0;
    for (int j = 0; j < D; j++) {
        xx += x[j] * x[j];
        yy += y[j] * y[j];
        xy += x[j] * y[j];
    }
    double q1 = sw2 * xx / D + sb2, q2 = sw2 * yy / D + sb2, k = sw2 * xy / D + sb2;
    for (int l = 0; l < depth; l++) {
        double k2 = sw2 * relu_e2(q1, q2, k) + sb2;
        q1 = sw2 * relu_e2(q1, q1, q1) + sb2;
        q2 = sw2 * relu_e2(q2, q2, q2) + sb2;
        k = k2;
    }
    return k;
}

static const tpk_arch_flag mlp_flags[] = {
    {.flag = "depth", .value = "3"}, {.flag = "phi", .value = "relu"},
    {.flag = "sigma-w2", .value = "2"}, {.flag = "sigma-b2", .value = "0.1"}};

static tpk_arch_opts mlp_opts(void)
{
    return (tpk_arch_opts){.flags = mlp_flags, .nflags = 4, .root = root()};
}

static void test_mlp_matches_recursion(void **state)
{
    (void)state;
    double x[N * D], xt[M * D];
    inputs(x, N, 0.3);
    inputs(xt, M, 1.9);
    size_t dx[2] = {N, D}, dt[2] = {M, D};
    tpk_array X = {.ndim = 2, .dims = {dx[0], dx[1]}, .data = x};
    tpk_array Xt = {.ndim = 2, .dims = {dt[0], dt[1]}, .data = xt};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_array *K = NULL, *Kx = NULL, *kd = NULL;
    tpk_arch_opts o = mlp_opts();
    double err = -1;
    assert_int_equal(tpk_arch_kernel(tpk_arch_find("mlp"), &o, &X, &Xt, &K, &Kx, &kd, &err, &ctx),
                     TPK_OK);
    assert_int_equal(K->dims[0], N);
    assert_int_equal(K->dims[1], N);
    assert_int_equal(Kx->dims[0], M);
    assert_int_equal(Kx->dims[1], N);
    assert_int_equal(kd->dims[0], M);
    assert_true(err >= 0);
    double worst = 0;
    for (int a = 0; a < N; a++)
        for (int c = 0; c < N; c++)
            worst = fmax(worst, fabs(K->data[a * N + c] - mlp_ref(x + a * D, x + c * D)));
    for (int a = 0; a < M; a++) {
        for (int c = 0; c < N; c++)
            worst = fmax(worst, fabs(Kx->data[a * N + c] - mlp_ref(xt + a * D, x + c * D)));
        worst = fmax(worst, fabs(kd->data[a] - mlp_ref(xt + a * D, xt + a * D)));
    }
    print_message("tpk_arch_kernel mlp: max |K - reference| = %.2e\n", worst);
    assert_true(worst < TOL_CLOSED);
    /* without a test set: only K, equal to the train block */
    tpk_array *K2 = NULL;
    assert_int_equal(tpk_arch_kernel(tpk_arch_find("mlp"), &o, &X, NULL, &K2, NULL, NULL, NULL, &ctx),
                     TPK_OK);
    for (int i = 0; i < N * N; i++)
        assert_true(fabs(K2->data[i] - K->data[i]) < TOL_CLOSED);
    tpk_array_free(K);
    tpk_array_free(Kx);
    tpk_array_free(kd);
    tpk_array_free(K2);
}

/* The in-memory kernel is the gpkernel job's kernel (the same settings, program and evaluator). */
static void test_same_as_job(void **state)
{
    const tu_env *e = *state;
    double x[N * D];
    inputs(x, N, 0.7);
    char in[512], out[512];
    const size_t dims[2] = {N, D};
    tu_write_npy(tu_path(e, in, sizeof in, "x.npy"), x, 2, dims);
    tu_path(e, out, sizeof out, "K.h5");
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_arch_opts o = mlp_opts();
    o.root = NULL; /* the shipped programs, found beside the test binary */
    assert_int_equal(tpk_arch_job(tpk_arch_find("mlp"), &o, in, NULL, out, &ctx), TPK_OK);
    size_t cnt;
    double *Kf = tu_h5_read(out, "/kernel", &cnt);
    assert_int_equal(cnt, N * N);
    assert_true(tu_h5_has_attr(out, "sigma_w2"));
    tpk_array X = {.ndim = 2, .dims = {N, D}, .data = x}, *K = NULL;
    assert_int_equal(tpk_arch_kernel(tpk_arch_find("mlp"), &o, &X, NULL, &K, NULL, NULL, NULL, &ctx),
                     TPK_OK);
    for (int i = 0; i < N * N; i++)
        assert_true(fabs(Kf[i] - K->data[i]) <= TOL_SAME);
    free(Kf);
    tpk_array_free(K);
    /* a custom job (cnn1d) runs through tpk_arch_job, on its bundled input */
    const tpk_arch_flag cf[] = {{.flag = "depth", .value = "2"}};
    tpk_arch_opts oc = {.flags = cf, .nflags = 1, .root = root()};
    assert_int_equal(tpk_arch_job(tpk_arch_find("cnn1d"), &oc, NULL, NULL, out, &ctx), TPK_OK);
    assert_true(tu_h5_has_attr(out, "readout"));
    /* ... and on arrays, the same job without files: the same numbers */
    size_t nc = 0;
    double *Kc = tu_h5_read(out, "/kernel", &nc);
    char cin[4200];
    tpk_input_info info;
    snprintf(cin, sizeof cin, "%s/%s", root(), tpk_arch_find("cnn1d")->input);
    tpk_array *Xc = tpk_io_read(cin, &info, &ctx), *Kcn = NULL;
    assert_non_null(Xc);
    assert_int_equal(tpk_arch_kernel(tpk_arch_find("cnn1d"), &oc, Xc, NULL, &Kcn, NULL, NULL, NULL,
                                     &ctx), TPK_OK);
    assert_int_equal(tpk_array_size(Kcn), nc);
    assert_memory_equal(Kcn->data, Kc, nc * sizeof *Kc);
    free(Kc);
    tpk_array_free(Xc);
    tpk_array_free(Kcn);
}

/* A program given as text; the sequence length T follows the input; a finite-width run. */
static void test_program_source(void **state)
{
    (void)state;
    static const char src[] =
        "param sigma_w2 = 2.0\n"
        "param T = 2\n"
        "width n\n"
        "input x[t in 1..T] : d\n"
        "A U : (n, d) ~ sigma_w2\n"
        "g[t in 1..T] = U x[t]\n"
        "output y = readout(relu(g[T]), 1.0)\n";
    enum { TT = 3 };
    double x[N * TT * D];
    inputs(x, N * TT, 0.1);
    tpk_array X = {.ndim = 3, .dims = {N, TT, D}, .data = x}, *K = NULL, *Kh = NULL, *y = NULL;
    tpk_param_set sets[] = {{"sigma_w2", "1.5"}};
    tpk_job job = {.program = "inline.nsr", .source = src, .sets = sets, .nsets = 1};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_job_kernel_arrays(&job, &X, NULL, &K, NULL, NULL, NULL, &ctx), TPK_OK);
    /* y reads relu(U x[T]) with T = 3 from the input: σ_v² E[relu relu] on the last token */
    for (int a = 0; a < N; a++)
        for (int c = 0; c < N; c++) {
            const double *u = x + (a * TT + TT - 1) * D, *v = x + (c * TT + TT - 1) * D;
            double uu = 0, vv = 0, uv = 0;
            for (int j = 0; j < D; j++) {
                uu += u[j] * u[j];
                vv += v[j] * v[j];
                uv += u[j] * v[j];
            }
            double r = relu_e2(1.5 * uu / D, 1.5 * vv / D, 1.5 * uv / D);
            assert_true(fabs(K->data[a * N + c] - r) < TOL_CLOSED);
        }
    assert_int_equal(tpk_job_run_arrays(&job, &X, 64, 7, &Kh, &y, &ctx), TPK_OK);
    assert_int_equal(Kh->dims[0], N);
    assert_int_equal(y->dims[0], N);
    tpk_array *Kh2 = NULL;
    assert_int_equal(tpk_job_run_arrays(&job, &X, 64, 7, &Kh2, NULL, &ctx), TPK_OK);
    assert_memory_equal(Kh->data, Kh2->data, N * N * sizeof(double)); /* same seed, same run */
    tpk_array_free(K);
    tpk_array_free(Kh);
    tpk_array_free(Kh2);
    tpk_array_free(y);
}

/* Each error: its status and words of its message. */
static void expect(int st, int want, const tpk_ctx *ctx, const char *words)
{
    if (st != want || !strstr(ctx->msg, words))
        print_error("status %d (want %d), message '%s' (want '%s')\n", st, want, ctx->msg, words);
    assert_int_equal(st, want);
    assert_non_null(strstr(ctx->msg, words));
}

static void test_errors(void **state)
{
    (void)state;
    double x[N * D], xt[M * (D + 1)] = {0}; /* inputs() fills M × D of it */
    inputs(x, N, 0.3);
    inputs(xt, M, 0.5);
    tpk_array X = {.ndim = 2, .dims = {N, D}, .data = x}, *K = NULL, *Kx = NULL, *kd = NULL;
    const tpk_arch *mlp = tpk_arch_find("mlp");
    tpk_arch_opts o = mlp_opts();
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);

    x[1 * D + 2] = NAN;
    expect(tpk_arch_kernel(mlp, &o, &X, NULL, &K, NULL, NULL, NULL, &ctx), TPK_EDOM, &ctx,
           "tpk_arch_kernel: X[1, 2] is NaN");
    assert_null(K);
    inputs(x, N, 0.3);

    tpk_ctx_clear(&ctx);
    tpk_array X1 = {.ndim = 1, .dims = {N}, .data = x};
    expect(tpk_arch_kernel(mlp, &o, &X1, NULL, &K, NULL, NULL, NULL, &ctx), TPK_EINVAL, &ctx,
           "rank 2..4");
    tpk_ctx_clear(&ctx);
    tpk_array X0 = {.ndim = 2, .dims = {0, D}, .data = x};
    expect(tpk_arch_kernel(mlp, &o, &X0, NULL, &K, NULL, NULL, NULL, &ctx), TPK_EINVAL, &ctx,
           "empty input");

    tpk_ctx_clear(&ctx);
    tpk_array Xt = {.ndim = 2, .dims = {M, D + 1}, .data = xt};
    expect(tpk_arch_kernel(mlp, &o, &X, &Xt, &K, &Kx, &kd, NULL, &ctx), TPK_EINVAL, &ctx,
           "test items have 5 values each");
    tpk_ctx_clear(&ctx);
    expect(tpk_arch_kernel(mlp, &o, &X, &Xt, &K, NULL, NULL, NULL, &ctx), TPK_EINVAL, &ctx,
           "needs Kxt and kdiag");

    tpk_ctx_clear(&ctx);
    const tpk_arch_flag bad[] = {{.flag = "dpth", .value = "3"}};
    tpk_arch_opts ob = {.flags = bad, .nflags = 1, .root = root()};
    expect(tpk_arch_kernel(mlp, &ob, &X, NULL, &K, NULL, NULL, NULL, &ctx), TPK_EINVAL, &ctx,
           "unknown flag 'dpth' of architecture mlp");
    tpk_ctx_clear(&ctx);
    const tpk_arch_flag neg[] = {{.flag = "sigma-w2", .value = "-1"}};
    ob.flags = neg;
    expect(tpk_arch_kernel(mlp, &ob, &X, NULL, &K, NULL, NULL, NULL, &ctx), TPK_EDOM, &ctx,
           "--sigma-w2 must be a finite variance");
    tpk_ctx_clear(&ctx);
    const tpk_arch_flag nophi[] = {{.flag = "phi", .value = "nosuchphi"}};
    ob.flags = nophi;
    expect(tpk_arch_kernel(mlp, &ob, &X, NULL, &K, NULL, NULL, NULL, &ctx), TPK_ENOTFOUND, &ctx,
           "nosuchphi");
    tpk_ctx_clear(&ctx);
    const tpk_arch_flag noval[] = {{.flag = "depth", .value = NULL}};
    ob.flags = noval;
    expect(tpk_arch_kernel(mlp, &ob, &X, NULL, &K, NULL, NULL, NULL, &ctx), TPK_EINVAL, &ctx,
           "no name or value");
    tpk_ctx_clear(&ctx);
    ob.nflags = 33;
    expect(tpk_arch_kernel(mlp, &ob, &X, NULL, &K, NULL, NULL, NULL, &ctx), TPK_EINVAL, &ctx,
           "at most 32");
    tpk_ctx_clear(&ctx);
    expect(tpk_arch_kernel(NULL, &o, &X, NULL, &K, NULL, NULL, NULL, &ctx), TPK_EINVAL, &ctx,
           "needs the architecture");
    tpk_ctx_clear(&ctx);
    tpk_arch_opts ol = {.layernorm = 1, .root = root()};
    expect(tpk_arch_kernel(tpk_arch_find("rnn"), &ol, &X, NULL, &K, NULL, NULL, NULL, &ctx),
           TPK_EINVAL, &ctx, "--layernorm is an option of --arch=mlp");

    tpk_ctx_clear(&ctx);
    expect(tpk_arch_kernel(tpk_arch_find("attention"), &o, &X, NULL, &K, NULL, NULL, NULL, &ctx),
           TPK_EUNSUPPORTED, &ctx, "run it with tpk_arch_job");
    /* the CNN's job on arrays: an N×d matrix is no image batch, said in the arrays' names */
    tpk_ctx_clear(&ctx);
    const tpk_arch_flag cf[] = {{.flag = "depth", .value = "2"}};
    tpk_arch_opts oc = {.flags = cf, .nflags = 1, .root = root()};
    expect(tpk_arch_kernel(tpk_arch_find("cnn2d"), &oc, &X, NULL, &K, NULL, NULL, NULL, &ctx),
           TPK_EINVAL, &ctx, "X: cnn2d inputs must be images");
    assert_null(K);
    tpk_ctx_clear(&ctx);
    expect(tpk_arch_job(mlp, &o, NULL, NULL, NULL, &ctx), TPK_EINVAL, &ctx, "needs an output");
    tpk_ctx_clear(&ctx);
    tpk_arch_opts onr = mlp_opts();
    onr.root = "/nonexistent-tpk-root";
    expect(tpk_arch_kernel(mlp, &onr, &X, NULL, &K, NULL, NULL, NULL, &ctx), TPK_EIO, &ctx,
           "/nonexistent-tpk-root/programs/mlp.nsr");

    /* a transformer reads sequences: a matrix of vectors is refused, naming the program's need */
    tpk_ctx_clear(&ctx);
    tpk_arch_opts ot = {.root = root()};
    expect(tpk_arch_kernel(tpk_arch_find("transformer"), &ot, &X, NULL, &K, NULL, NULL, NULL, &ctx),
           TPK_EINVAL, &ctx, "a matrix of vectors");

    /* program text: errors come back as name:line:col */
    tpk_ctx_clear(&ctx);
    tpk_job job = {.program = "bad.nsr", .source = "width n\ninput x : d\nA U : (n, d) ~ 1\n"
                                                   "g = U x +\n"};
    expect(tpk_job_kernel_arrays(&job, &X, NULL, &K, NULL, NULL, NULL, &ctx), TPK_ESYNTAX, &ctx,
           "bad.nsr:5:1: expected an expression");
    tpk_ctx_clear(&ctx);
    tpk_job none = {0};
    expect(tpk_job_kernel_arrays(&none, &X, NULL, &K, NULL, NULL, NULL, &ctx), TPK_EINVAL, &ctx,
           "needs a program");
    tpk_ctx_clear(&ctx);
    tpk_job ok = {.program = "mlp", .source = "width n\ninput x : d\nA U : (n, d) ~ 1\n"
                                              "g = U x\noutput y = readout(relu(g), 1.0)\n"};
    tpk_array *Kh = NULL;
    expect(tpk_job_run_arrays(&ok, &X, 0, 1, &Kh, NULL, &ctx), TPK_EINVAL, &ctx,
           "width must be at least 1");
    tpk_ctx_clear(&ctx);
    ok.test = "t.npy";
    expect(tpk_job_run_arrays(&ok, &X, 8, 1, &Kh, NULL, &ctx), TPK_EINVAL, &ctx, "no test set");
    assert_null(Kh);
}

/* The shipped programs from a program that is given no root (issue 40, item 2): found by
 * tpk_shipped_find, TPK_DATADIR first; a file found nowhere is an error that lists every place
 * tried and names the two ways to point at the folder. */
static void test_shipped_lookup(void **state)
{
    const tu_env *e = *state;
    char dir[512], path[1024], got[4096], want[4096];
    const tpk_arch *mlp = tpk_arch_find("mlp");
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    /* the build tree's library is not installed anywhere: no data directory compiled in */
    assert_null(tpk_datadir());

    /* root = NULL from the build tree: the checkout's programs, the numbers of the recursion */
    double x[N * D];
    inputs(x, N, 0.3);
    tpk_array X = {.ndim = 2, .dims = {N, D}, .data = x}, *K = NULL;
    tpk_arch_opts o = {.flags = mlp_flags, .nflags = 4};
    assert_int_equal(tpk_arch_kernel(mlp, &o, &X, NULL, &K, NULL, NULL, NULL, &ctx), TPK_OK);
    assert_true(fabs(K->data[1 * N + 3] - mlp_ref(x + D, x + 3 * D)) <= TOL_CLOSED);
    tpk_array_free(K);
    K = NULL;

    /* TPK_DATADIR ahead of everything: a folder of its own with a copy of mlp.nsr */
    snprintf(dir, sizeof dir, "%s/datadir", e->tmpdir);
    int w = snprintf(path, sizeof path, "mkdir -p '%s/programs' && cp '%s/programs/mlp.nsr' "
                     "'%s/programs/'", dir, root(), dir);
    assert_true(w > 0 && (size_t)w < sizeof path);
    assert_int_equal(system(path), 0);
    setenv("TPK_DATADIR", dir, 1);
    assert_int_equal(tpk_shipped_find("programs/mlp.nsr", got, sizeof got, &ctx), TPK_OK);
    assert_non_null(realpath(dir, want));
    assert_memory_equal(got, want, strlen(want));
    assert_int_equal(tpk_arch_kernel(mlp, &o, &X, NULL, &K, NULL, NULL, NULL, &ctx), TPK_OK);
    tpk_array_free(K);
    K = NULL;

    /* found nowhere: every place in the message, TPK_DATADIR's first */
    int st = tpk_shipped_find("programs/no-such.nsr", got, sizeof got, &ctx);
    print_message("%s\n", ctx.msg);
    assert_int_equal(st, TPK_ENOTFOUND);
    assert_string_equal(got, "programs/no-such.nsr");
    snprintf(want, sizeof want, "tried %s/programs/no-such.nsr (TPK_DATADIR)", dir);
    assert_non_null(strstr(ctx.msg, want));
    const char *words[] = {"set TPK_DATADIR", "tpk_arch_opts.root", "pkg-config --variable=datadir",
                           "/../share/tpk/programs/no-such.nsr", "(the working directory)"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (!strstr(ctx.msg, words[i]))
            fail_msg("'%s' not in: %s", words[i], ctx.msg);
    unsetenv("TPK_DATADIR");
    tpk_ctx_clear(&ctx);

    /* a tpk_arch_flag initialiser of tpk 0.1.0's member order ({flag, param, value}) */
    const tpk_arch_flag old[] = {{.flag = "depth", .param = "3"}};
    tpk_arch_opts oo = {.flags = old, .nflags = 1};
    expect(tpk_arch_kernel(mlp, &oo, &X, NULL, &K, NULL, NULL, NULL, &ctx), TPK_EINVAL, &ctx,
           "write {\"depth\", \"3\"}");
    assert_null(K);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_matches_recursion),
        cmocka_unit_test(test_same_as_job),
        cmocka_unit_test(test_program_source),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_shipped_lookup),
    };
    return cmocka_run_group_tests_name("arch_kernel", tests, setup, tu_teardown);
}
