/* gpkernel end to end: numbers against independent recursions, every bad input against its message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <gsl/gsl_integration.h>
#include <hdf5.h>
#include <gsl/gsl_rng.h>
#include <gsl/gsl_randist.h>
#include "support/testutil.h"
#include "tpk/archs.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Closed forms carry only rounding: 1e-12 relative is the acceptance bound. */
#define TOL_CLOSED 1e-12
/* tanh has no closed form: the issue asks 1e-8 against a high-order reference. */
#define TOL_TANH 1e-8

static int setup(void **state) { return tu_setup_tagged(state, "cli"); }

/* Run gpkernel (quietly) with the given arguments. Returns the exit status. */
static int gpkernel(const tu_env *e, const char *args)
{
    char buf[8192];
    snprintf(buf, sizeof buf, "%s --quiet", args);
    return tu_run_tool(e, "gpkernel", buf);
}

/* ---- independent reference recursions ------------------------------------------------------ */

/* ReLU: Cho & Saul arc-cosine kernel of degree 1, written out here rather than taken from the
 * library (theory.md §3.2). */
static double relu_e2(double q1, double q2, double k)
{
    double s = sqrt(q1 * q2), rho = s > 0 ? k / s : 0;
    if (rho > 1) rho = 1;
    if (rho < -1) rho = -1;
    double th = acos(rho);
    return s / (2 * M_PI) * (sin(th) + (M_PI - th) * cos(th));
}

/* tanh: E[tanh(u)tanh(v)] by nested adaptive integration of the conditional form
 * v | u ~ N(k u/q1, q2 − k²/q1): GSL QAGI in both directions, unrelated to Gauss–Hermite. */
typedef struct { double q1, q2, k, z; gsl_integration_workspace *w; } tanh_ctx;
static double inner(double w, void *vp)
{
    tanh_ctx *c = vp;
    double a = c->k / sqrt(c->q1), s = sqrt(fmax(c->q2 - c->k * c->k / c->q1, 0));
    return tanh(a * c->z + s * w) * exp(-0.5 * w * w) / sqrt(2 * M_PI);
}
static double outer(double z, void *vp)
{
    tanh_ctx *c = vp;
    c->z = z;
    gsl_function F = {inner, c};
    double r, e;
    gsl_integration_qagi(&F, 1e-15, 1e-13, 1000, c->w, &r, &e);
    return tanh(sqrt(c->q1) * z) * r * exp(-0.5 * z * z) / sqrt(2 * M_PI);
}
static double tanh_e2(double q1, double q2, double k)
{
    gsl_integration_workspace *w1 = gsl_integration_workspace_alloc(1000);
    gsl_integration_workspace *w2 = gsl_integration_workspace_alloc(1000);
    tanh_ctx c = {q1, q2, k, 0, w2};
    gsl_function F = {outer, &c};
    double r, e;
    gsl_integration_qagi(&F, 1e-15, 1e-12, 1000, w1, &r, &e);
    gsl_integration_workspace_free(w1);
    gsl_integration_workspace_free(w2);
    return r;
}

/* Direct recursion of the convention on an n×n Gram matrix. */
static void reference_mlp(const double *X, size_t n, size_t d, int depth, double sw2, double sb2,
                          double (*e2)(double, double, double), double *K)
{
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            double s = 0;
            for (size_t t = 0; t < d; t++)
                s += X[i * d + t] * X[j * d + t];
            K[i * n + j] = sw2 * s / (double)d + sb2;
        }
    double *T = malloc(n * n * sizeof *T);
    for (int l = 0; l < depth; l++) {
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j <= i; j++)
                T[i * n + j] = T[j * n + i] =
                    sw2 * e2(K[i * n + i], K[j * n + j], K[i * n + j]) + sb2;
        memcpy(K, T, n * n * sizeof *K);
    }
    free(T);
}

static void random_inputs(double *X, size_t n, size_t d, unsigned long seed)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, seed);
    for (size_t i = 0; i < n * d; i++)
        X[i] = gsl_ran_gaussian(r, 1.0);
    gsl_rng_free(r);
}

static double max_rel_err(const double *a, const double *b, size_t len)
{
    double scale = 0, m = 0;
    for (size_t i = 0; i < len; i++)
        scale = fmax(scale, fabs(b[i]));
    for (size_t i = 0; i < len; i++)
        m = fmax(m, fabs(a[i] - b[i]) / scale);
    return m;
}

/* ---- tests ---------------------------------------------------------------------------------- */

static void test_relu_matches_direct_recursion(void **state)
{
    const tu_env *e = *state;
    enum { N = 9, D = 13 };
    double X[N * D], Kref[N * N];
    random_inputs(X, N, D, 2385);
    memcpy(X + 8 * D, X + 7 * D, D * sizeof *X); /* a duplicated input: ρ = 1 exactly */
    char xin[512], kout[512], args[2048];
    tu_path(e, xin, sizeof xin, "X.h5");
    tu_path(e, kout, sizeof kout, "K.h5");
    tu_h5_write(xin, "/x", X, N, D);
    snprintf(args, sizeof args,
             "--arch=mlp --depth=3 --phi=relu --sigma-w2=2 --sigma-b2=0.1 --input='%s:/x' "
             "--output='%s'", xin, kout);
    assert_int_equal(gpkernel(e, args), 0);
    size_t cnt;
    double *K = tu_h5_read(kout, "/kernel", &cnt);
    assert_int_equal(cnt, N * N);
    reference_mlp(X, N, D, 3, 2.0, 0.1, relu_e2, Kref);
    double rel = max_rel_err(K, Kref, N * N);
    print_message("relu depth 3: max relative error %.2e\n", rel);
    assert_true(rel < TOL_CLOSED);
    for (size_t i = 0; i < N; i++)
        for (size_t j = 0; j < N; j++)
            assert_true(K[i * N + j] == K[j * N + i]);
    free(K);
}

static void test_tanh_matches_high_order_reference(void **state)
{
    const tu_env *e = *state;
    enum { N = 5, D = 7 };
    double X[N * D], Kref[N * N];
    random_inputs(X, N, D, 4711);
    char xin[512], kout[512], args[2048];
    tu_path(e, xin, sizeof xin, "Xt.h5");
    tu_path(e, kout, sizeof kout, "Kt.h5");
    tu_h5_write(xin, "/inputs", X, N, D);
    snprintf(args, sizeof args,
             "--arch=mlp --depth=3 --phi=tanh --sigma-w2=1.7 --sigma-b2=0.05 "
             "--input='%s:/inputs' --output='%s'", xin, kout);
    assert_int_equal(gpkernel(e, args), 0);
    size_t cnt;
    double *K = tu_h5_read(kout, "/kernel", &cnt);
    reference_mlp(X, N, D, 3, 1.7, 0.05, tanh_e2, Kref);
    double rel = max_rel_err(K, Kref, N * N);
    print_message("tanh depth 3: max relative error %.2e\n", rel);
    assert_true(rel < TOL_TANH);
    free(K);
}

static void test_test_set_outputs(void **state)
{
    const tu_env *e = *state;
    enum { N = 6, M = 4, D = 5 };
    double X[N * D], Xt[M * D];
    random_inputs(X, N, D, 77);
    random_inputs(Xt, M, D, 78);
    memcpy(Xt, X + 2 * D, D * sizeof *X); /* test row 0 equals train row 2 */
    char xin[512], tin[512], kout[512], args[2048];
    tu_path(e, xin, sizeof xin, "train.h5");
    tu_path(e, tin, sizeof tin, "test.h5");
    tu_path(e, kout, sizeof kout, "Kx.h5");
    tu_h5_write(xin, "/x", X, N, D);
    tu_h5_write(tin, "/x", Xt, M, D);
    snprintf(args, sizeof args,
             "--arch=mlp --depth=2 --phi=erf --sigma-w2=1.3 --sigma-b2=0.2 --input='%s:/x' "
             "--test='%s:/x' --output='%s'", xin, tin, kout);
    assert_int_equal(gpkernel(e, args), 0);
    size_t c1, c2, c3;
    double *K = tu_h5_read(kout, "/kernel", &c1);
    double *Kx = tu_h5_read(kout, "/kernel_test_train", &c2);
    double *kd = tu_h5_read(kout, "/kernel_test_diag", &c3);
    assert_int_equal(c2, M * N);
    assert_int_equal(c3, M);
    /* Test row 0 is train input 2: its cross row and diagonal must equal the train kernel's. */
    for (size_t j = 0; j < N; j++)
        assert_true(fabs(Kx[j] - K[2 * N + j]) <= TOL_CLOSED * fabs(K[2 * N + 2]));
    assert_true(fabs(kd[0] - K[2 * N + 2]) <= TOL_CLOSED * fabs(K[2 * N + 2]));
    /* Joint PSD: [K Kxᵀ; Kx diag] restricted to 2×2 blocks obeys Cauchy–Schwarz. */
    for (size_t i = 0; i < M; i++)
        for (size_t j = 0; j < N; j++)
            assert_true(Kx[i * N + j] * Kx[i * N + j] <= kd[i] * K[j * N + j] * (1 + 1e-12));
    free(K);
    free(Kx);
    free(kd);
}

static void test_provenance_attributes(void **state)
{
    const tu_env *e = *state;
    char kout[512], args[1024];
    tu_path(e, kout, sizeof kout, "demo.h5");
    snprintf(args, sizeof args, "--arch=mlp --output='%s'", kout); /* bundled demo input */
    assert_int_equal(gpkernel(e, args), 0);
    static const char *const attrs[] = {"architecture", "phi", "depth", "sigma_w2", "sigma_b2",
                                        "toolkit_version", "command_line", "created",
                                        "input_file", "input_sha256", "error_estimate"};
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
        if (!tu_h5_has_attr(kout, attrs[i]))
            fail_msg("attribute %s missing", attrs[i]);
    }
}

/* Every bad input: non-zero exit, a one-line message naming the problem, no output file,
 * and an existing file at the output path left alone. */
static void test_bad_inputs(void **state)
{
    const tu_env *e = *state;
    char good[512], nan_csv[512], ragged[512], kout[512], keep[512];
    tu_path(e, good, sizeof good, "good.h5");
    tu_path(e, nan_csv, sizeof nan_csv, "nan.csv");
    tu_path(e, ragged, sizeof ragged, "ragged.csv");
    tu_path(e, kout, sizeof kout, "never.h5");
    tu_path(e, keep, sizeof keep, "keep.h5");
    double X[6] = {0.3, -1.2, 2.5, 0.7, 1.1, -0.4};
    tu_h5_write(good, "/x", X, 3, 2);
    FILE *f = fopen(nan_csv, "w");
    fputs("0.5,1.5\nnan,2.0\n", f);
    fclose(f);
    f = fopen(ragged, "w");
    fputs("0.5,1.5,2.5\n1.0,2.0\n", f);
    fclose(f);
    f = fopen(keep, "w");
    fputs("precious", f);
    fclose(f);

    struct { const char *args; const char *needle; } cases[] = {
        {"--arch=mlp --input=/nonexistent/x.h5:/x --output=%s", "nonexistent"},
        {"--arch=mlp --input=%G:/nope --output=%s", "nope"},
        {"--arch=mlp --input=%N --output=%s", "non-finite"},
        {"--arch=mlp --input=%R --output=%s", "column"},
        {"--arch=mlp --phi=frobnicate --input=%G:/x --output=%s", "frobnicate"},
        {"--arch=mlp --sigma-w2=-1 --input=%G:/x --output=%s", "sigma-w2"},
        {"--arch=mlp --sigma-b2=-0.5 --input=%G:/x --output=%s", "sigma-b2"},
        {"--arch=mlp --depth=0 --input=%G:/x --output=%s", "depth"},
        {"--arch=mlp --depth=two --input=%G:/x --output=%s", "depth"},
        {"--arch=resnet9000 --input=%G:/x --output=%s", "resnet9000"},
        {"--arch=mlp --input=%G:/x", "output"},
        {"--arch=mlp --input=%G:/x --output=/nonexistent-dir/K.h5", "nonexistent-dir"},
        {"--arch=mlp --input=%G:/x --bogus --output=%s", "bogus"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* expand %G, %N, %R (inputs) and %s (output) */
        char args[2048] = "", *o = args;
        for (const char *p = cases[i].args; *p; p++) {
            if (*p == '%' && p[1]) {
                const char *sub = p[1] == 'G' ? good : p[1] == 'N' ? nan_csv
                                : p[1] == 'R' ? ragged : kout;
                o += sprintf(o, "'%s'", sub);
                p++;
            } else {
                *o++ = *p;
                *o = '\0';
            }
        }
        int rc = gpkernel(e, args);
        char err[4096];
        tu_stderr(e, err, sizeof err);
        if (rc == 0)
            fail_msg("case %zu (%s) exited 0", i, args);
        if (!strstr(err, cases[i].needle))
            fail_msg("case %zu: message does not name '%s': %s", i, cases[i].needle, err);
        char *nl = strchr(err, '\n');
        if (!nl || nl[1] != '\0')
            fail_msg("case %zu: message is not one line: %s", i, err);
        if (tu_exists(kout))
            fail_msg("case %zu left an output file", i);
    }
    /* A failing run aimed at an existing file leaves it intact. */
    char args[2048];
    snprintf(args, sizeof args, "--arch=mlp --input='%s' --output='%s'", nan_csv, keep);
    assert_int_not_equal(gpkernel(e, args), 0);
    f = fopen(keep, "r");
    char buf[32] = "";
    assert_non_null(fgets(buf, sizeof buf, f));
    fclose(f);
    assert_string_equal(buf, "precious");
}

/* Shape messages say what the architecture reads (issue 39, item 6), and the channel-less forms
 * the CNN rows document (N×H×W images, N×P signals: one channel) run, as the same kernel as
 * with the channel axis written out (they were viewed with their last axis as channels and
 * refused with "N×d (1 slot) or N×25×d"). */
static void test_shape_messages(void **state)
{
    const tu_env *e = *state;
    enum { N = 3, H = 5, W = 4, P = 6 };
    double img[N * H * W], sig[N * P];
    random_inputs(img, N * H, W, 811);
    random_inputs(sig, N, P, 812);
    char x3[512], x4[512], s2[512], s3[512], k3[512], k4[512], args[4096], err[4096];
    tu_path(e, x3, sizeof x3, "img3.npy");
    tu_path(e, x4, sizeof x4, "img4.npy");
    tu_path(e, s2, sizeof s2, "sig2.npy");
    tu_path(e, s3, sizeof s3, "sig3.npy");
    tu_write_npy(x3, img, 3, (const size_t[]){N, H, W});
    tu_write_npy(x4, img, 4, (const size_t[]){N, H, W, 1});
    tu_write_npy(s2, sig, 2, (const size_t[]){N, P});
    tu_write_npy(s3, sig, 3, (const size_t[]){N, P, 1});
    tu_path(e, k3, sizeof k3, "k3.h5");
    tu_path(e, k4, sizeof k4, "k4.h5");
    const char *const pairs[][3] = {{"cnn2d", x3, x4}, {"cnn1d", s2, s3}};
    for (int i = 0; i < 2; i++)
        for (int ro = 0; ro < 2; ro++) {
            const char *readout = ro ? " --readout=flatten" : ""; /* rolled GAP; direct flatten */
            snprintf(args, sizeof args, "--arch=%s%s --input='%s' --output='%s'", pairs[i][0],
                     readout, pairs[i][1], k3);
            if (gpkernel(e, args) != 0) {
                tu_stderr(e, err, sizeof err);
                fail_msg("%s: %s", args, err);
            }
            snprintf(args, sizeof args, "--arch=%s%s --input='%s' --output='%s'", pairs[i][0],
                     readout, pairs[i][2], k4);
            assert_int_equal(gpkernel(e, args), 0);
            size_t c3, c4;
            double *K3 = tu_h5_read(k3, "/kernel", &c3), *K4 = tu_h5_read(k4, "/kernel", &c4);
            assert_int_equal(c3, N * N);
            assert_int_equal(c4, N * N);
            assert_true(max_rel_err(K3, K4, N * N) < TOL_CLOSED);
            free(K3);
            free(K4);
        }
    /* rnn: the program's T follows the input, so the message names no default length */
    char csv[512];
    tu_path(e, csv, sizeof csv, "vec.csv");
    FILE *f = fopen(csv, "w");
    fputs("0.5,1.5\n-0.25,2.0\n", f);
    fclose(f);
    snprintf(args, sizeof args, "--arch=rnn --input='%s' --output='%s'", csv, k3);
    unlink(k3);
    assert_int_equal(gpkernel(e, args), 1);
    tu_stderr(e, err, sizeof err);
    if (!strstr(err, "N×T×d") || !strstr(err, "any T") || strstr(err, "N×4×d"))
        fail_msg("rnn on N×d: %s", err);
    /* a T the user fixed is the one length */
    snprintf(args, sizeof args, "--arch=rnn --set T=7 --input='%s' --output='%s'", csv, k3);
    assert_int_equal(gpkernel(e, args), 1);
    tu_stderr(e, err, sizeof err);
    if (!strstr(err, "N×7×d"))
        fail_msg("rnn --set T=7 on N×d: %s", err);
    /* cnn2d on a matrix: images are N×H×W×C, and the channel axis is suggested */
    snprintf(args, sizeof args, "--arch=cnn2d --input='%s' --output='%s'", csv, k3);
    assert_int_equal(gpkernel(e, args), 1);
    tu_stderr(e, err, sizeof err);
    if (!strstr(err, "N×H×W×C") || !strstr(err, "channel") || strstr(err, "1 slot"))
        fail_msg("cnn2d on N×d: %s", err);
    assert_false(tu_exists(k3));
}

/* `netsor kernel programs/mlp.nsr` and `gpkernel --arch=mlp` compute the same network by
 * default (issue 39, item 2: the program's sigma_b2, sigma_v2, sigma_ob2 were not the
 * architecture's), and so do the --layernorm / --residual programs and the same settings given
 * as flags and as --set; the defaults are Σ^{L+1} of the direct recursion here. */
static void test_program_defaults_are_the_architecture(void **state)
{
    const tu_env *e = *state;
    enum { N = 7, D = 5 };
    double X[N * D], Kref[N * N];
    random_inputs(X, N, D, 4417);
    char xin[512], kp[512], ka[512], args[4096], err[4096];
    tu_path(e, xin, sizeof xin, "Xd.h5");
    tu_path(e, kp, sizeof kp, "Kp.h5");
    tu_path(e, ka, sizeof ka, "Ka.h5");
    tu_h5_write(xin, "/x", X, N, D);
    const char *root = getenv("TPK_ROOT") ? getenv("TPK_ROOT") : ".";
    static const char *const cases[][3] = {
        {"mlp.nsr", "", ""},
        {"mlp-ln.nsr", "--layernorm", ""},
        {"mlp-residual.nsr", "--residual=0.6", "--set alpha=0.6"},
        {"mlp-ln-residual.nsr", "--layernorm --residual=0.6", "--set alpha=0.6"},
        {"mlp.nsr", "--depth=4 --phi=erf --sigma-b2=0.13", "--set L=4 --set phi=erf --set sigma_b2=0.13"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(args, sizeof args, "kernel '%s/programs/%s' %s --input='%s:/x' --output='%s' "
                 "--quiet", root, cases[i][0], cases[i][2], xin, kp);
        if (tu_run_tool(e, "netsor", args) != 0) {
            tu_stderr(e, err, sizeof err);
            fail_msg("netsor %s: %s", args, err);
        }
        snprintf(args, sizeof args, "--arch=mlp %s --input='%s:/x' --output='%s'", cases[i][1],
                 xin, ka);
        assert_int_equal(gpkernel(e, args), 0);
        size_t cp, ca;
        double *Kp = tu_h5_read(kp, "/kernel", &cp), *Ka = tu_h5_read(ka, "/kernel", &ca);
        assert_int_equal(cp, N * N);
        assert_int_equal(ca, N * N);
        double rel = max_rel_err(Kp, Ka, N * N);
        if (!(rel < TOL_CLOSED))
            fail_msg("netsor kernel %s %s vs gpkernel --arch=mlp %s: %.3g apart", cases[i][0],
                     cases[i][2], cases[i][1], rel);
        if (i == 0) { /* the default: Σ^{L+1} of three ReLU layers, σ_w² 2, σ_b² 0 */
            reference_mlp(X, N, D, 3, 2.0, 0.0, relu_e2, Kref);
            assert_true(max_rel_err(Kp, Kref, N * N) < TOL_CLOSED);
        }
        free(Kp);
        free(Ka);
    }
}

/* The HDF5 class of root attribute `name` of file (H5T_INTEGER, H5T_FLOAT, H5T_STRING), read
 * with the HDF5 library directly; -1 when there is none. */
static int attr_class(const char *file, const char *name)
{
    hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    assert_true(f >= 0);
    int cls = -1;
    if (H5Aexists_by_name(f, "/", name, H5P_DEFAULT) > 0) {
        hid_t a = H5Aopen_by_name(f, "/", name, H5P_DEFAULT, H5P_DEFAULT), t = H5Aget_type(a);
        cls = (int)H5Tget_class(t);
        H5Tclose(t);
        H5Aclose(a);
    }
    H5Fclose(f);
    return cls;
}

/* A string attribute of file's root, malloc'd (variable-length UTF-8 as the toolkit writes). */
static char *attr_string(const char *file, const char *name)
{
    hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    assert_true(f >= 0);
    hid_t a = H5Aopen_by_name(f, "/", name, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(a >= 0);
    hid_t t = H5Aget_type(a);
    assert_true(H5Tis_variable_str(t) > 0);
    char *v = NULL, *copy;
    assert_true(H5Aread(a, t, &v) >= 0);
    copy = strdup(v);
    H5free_memory(v);
    H5Tclose(t);
    H5Aclose(a);
    H5Fclose(f);
    return copy;
}

/* netsor kernel and run record the program's text and its SHA-256 (issue 39, item 9: the file
 * name only, irreproducible once the .nsr is edited), checked against sha256sum of the file;
 * integer parameters (L, T, k, circular, the centre tap c; gpkernel's depth, rows, cols) are
 * HDF5 integers and real ones stay floats even at integral values (--set sigma_w2=2). */
static void test_program_provenance_and_types(void **state)
{
    const tu_env *e = *state;
    const char *root = getenv("TPK_ROOT") ? getenv("TPK_ROOT") : ".";
    char prog[512], kout[512], rout[512], gout[512], img[512], cmd[2048], args[4096], err[4096];
    char want[128];
    tu_path(e, prog, sizeof prog, "copy.nsr");
    tu_path(e, kout, sizeof kout, "nk.h5");
    tu_path(e, rout, sizeof rout, "nr.h5");
    tu_path(e, gout, sizeof gout, "gk.h5");
    snprintf(cmd, sizeof cmd, "cp '%s/programs/cnn1d.nsr' '%s'", root, prog);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "sha256sum '%s' | cut -c1-64", prog);
    assert_int_equal(tu_capture(cmd, want, sizeof want), 0);
    want[64] = '\0';
    size_t tlen;
    FILE *f = fopen(prog, "rb");
    assert_non_null(f);
    static char text[65536];
    tlen = fread(text, 1, sizeof text - 1, f);
    text[tlen] = '\0';
    fclose(f);
    snprintf(args, sizeof args, "kernel '%s' --set sigma_w2=2 --input='%s/data/demo-sequences.npy' "
             "--output='%s' --quiet", prog, root, kout);
    if (tu_run_tool(e, "netsor", args) != 0) {
        tu_stderr(e, err, sizeof err);
        fail_msg("netsor %s: %s", args, err);
    }
    snprintf(args, sizeof args, "run '%s' --input='%s/data/demo-sequences.npy' --width=16 "
             "--output='%s' --quiet", prog, root, rout);
    assert_int_equal(tu_run_tool(e, "netsor", args), 0);
    /* the file edited afterwards: the outputs keep what ran */
    f = fopen(prog, "a");
    fputs("# edited later\n", f);
    fclose(f);
    const char *outs[2] = {kout, rout};
    for (int i = 0; i < 2; i++) {
        char *sha = attr_string(outs[i], "program_sha256"), *txt = attr_string(outs[i], "program_text");
        assert_string_equal(sha, want);
        assert_string_equal(txt, text);
        free(sha);
        free(txt);
        static const char *const ints[] = {"L", "T", "k", "circular", "c"};
        for (size_t j = 0; j < sizeof ints / sizeof ints[0]; j++)
            if (attr_class(outs[i], ints[j]) != H5T_INTEGER)
                fail_msg("%s: parameter %s is not stored as an integer", outs[i], ints[j]);
        assert_int_equal(attr_class(outs[i], "sigma_b2"), H5T_FLOAT);
    }
    assert_int_equal(attr_class(kout, "sigma_w2"), H5T_FLOAT); /* --set sigma_w2=2: still real */
    /* gpkernel: the flags under their own names take their parameter's type */
    enum { N = 2, H = 4, W = 3 };
    double x[N * H * W];
    random_inputs(x, N * H, W, 5);
    tu_path(e, img, sizeof img, "im.npy");
    tu_write_npy(img, x, 4, (const size_t[]){N, H, W, 1});
    snprintf(args, sizeof args, "--arch=cnn2d --depth=2 --sigma-w2=2 --input='%s' --output='%s'",
             img, gout);
    assert_int_equal(gpkernel(e, args), 0);
    static const char *const gints[] = {"depth", "L", "rows", "cols", "circular"};
    for (size_t j = 0; j < sizeof gints / sizeof gints[0]; j++)
        if (attr_class(gout, gints[j]) != H5T_INTEGER)
            fail_msg("gpkernel: %s is not stored as an integer", gints[j]);
    assert_int_equal(attr_class(gout, "sigma_w2"), H5T_FLOAT);
    assert_int_equal(attr_class(gout, "program_sha256"), H5T_STRING);
}

/* netsor train (issue 36, item 3): the datasets and their shapes, step 0 is netsor run's network
 * of the same seed (its /outputs), the loss falls; its usage errors exit 2 and a run error (targets
 * that do not match the training inputs) exits 1, both leaving no output. */
static void test_netsor_train(void **state)
{
    const tu_env *e = *state;
    const char *root = getenv("TPK_ROOT") ? getenv("TPK_ROOT") : ".";
    enum { N = 6, NT = 3, D = 4, S = 3 };
    double x[N * D], xt[NT * D], y[N];
    random_inputs(x, N, D, 21);
    random_inputs(xt, NT, D, 22);
    random_inputs(y, N, 1, 23);
    char fx[512], fxt[512], fy[512], fy2[512], out[512], run[512], args[4096];
    tu_path(e, fx, sizeof fx, "tx.npy");
    tu_path(e, fxt, sizeof fxt, "txt.npy");
    tu_path(e, fy, sizeof fy, "ty.npy");
    tu_path(e, fy2, sizeof fy2, "ty2.npy");
    tu_path(e, out, sizeof out, "nt-train.h5");
    tu_path(e, run, sizeof run, "nt-run.h5");
    tu_write_npy(fx, x, 2, (const size_t[]){N, D});
    tu_write_npy(fxt, xt, 2, (const size_t[]){NT, D});
    tu_write_npy(fy, y, 2, (const size_t[]){N, 1});
    tu_write_npy(fy2, y, 2, (const size_t[]){N - 1, 1});
    const char *prog = "programs/mlp.nsr --set phi=erf --set L=2 --set sigma_b2=0.1";
    snprintf(args, sizeof args, "train %s/%s --train=%s --labels=%s --test=%s --width=32 "
             "--seeds=%d --seed=5 --lr=0.5 --steps=50 --at=10 --output=%s --quiet", root, prog, fx,
             fy, fxt, S, out);
    if (tu_run_tool(e, "netsor", args) != 0) {
        char err[4096];
        tu_stderr(e, err, sizeof err);
        fail_msg("netsor %s: %s", args, err);
    }
    size_t n1, n2, n3;
    double *tr = tu_h5_read(out, "/train_outputs", &n1), *te = tu_h5_read(out, "/test_outputs", &n2);
    double *loss = tu_h5_read(out, "/loss", &n3);
    /* --at=10 plus 0 (no --at: 0 and K; --at given: K added) — steps 10 and 50 */
    assert_int_equal(n1, (size_t)S * 2 * N);
    assert_int_equal(n2, (size_t)S * 2 * NT);
    assert_int_equal(n3, (size_t)S * 2);
    for (int s = 0; s < S; s++)
        assert_true(loss[s * 2 + 1] < loss[s * 2]);
    /* the network of seed 6 (the second), trained on the training and test inputs stacked */
    snprintf(args, sizeof args, "train %s/%s --train=%s --labels=%s --width=32 --seed=6 "
             "--steps=0 --output=%s --quiet --force", root, prog, fx, fy, run);
    assert_int_equal(tu_run_tool(e, "netsor", args), 0);
    size_t nr;
    double *f0 = tu_h5_read(run, "/train_outputs", &nr);
    assert_int_equal(nr, (size_t)N);
    snprintf(args, sizeof args, "run %s/%s --input=%s --width=32 --seed=6 --output=%s --quiet "
             "--force", root, prog, fx, run);
    assert_int_equal(tu_run_tool(e, "netsor", args), 0);
    double *yr = tu_h5_read(run, "/outputs", &nr);
    for (size_t a = 0; a < N; a++)
        assert_true(fabs(f0[a] - yr[a]) <= 1e-12 * (1 + fabs(yr[a])));
    free(tr);
    free(te);
    free(loss);
    free(f0);
    free(yr);
    /* usage errors (2) and a run error (1): no file left */
    remove(out);
    static const struct { const char *extra; int rc; } bad[] = {
        {"--width=8 --steps=5", 2},                          /* no --labels */
        {"--labels=%s --width=8", 2},                        /* no --steps */
        {"--labels=%s --width=8 --steps=5 --lr=0", 2},       /* a rate <= 0 */
        {"--labels=%s --width=8 --steps=5 --at=9", 2},       /* a step beyond --steps */
        {"--labels=%s --width=8 --steps=5 --kernel=ntk", 2}, /* another command's option */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char extra[1024];
        snprintf(extra, sizeof extra, bad[i].extra, fy);
        snprintf(args, sizeof args, "train %s/%s --train=%s %s --output=%s --quiet", root, prog, fx,
                 extra, out);
        int rc = tu_run_tool(e, "netsor", args);
        if (rc != bad[i].rc)
            fail_msg("netsor %s: exit %d, want %d", args, rc, bad[i].rc);
        assert_false(tu_exists(out));
    }
    snprintf(args, sizeof args, "train %s/%s --input=%s --labels=%s --width=8 --steps=5 "
             "--output=%s --quiet", root, prog, fx, fy, out);
    assert_int_equal(tu_run_tool(e, "netsor", args), 2);
    snprintf(args, sizeof args, "train %s/%s --train=%s --labels=%s --width=8 --steps=5 "
             "--output=%s --quiet", root, prog, fx, fy2, out);
    assert_int_equal(tu_run_tool(e, "netsor", args), 1);
    assert_false(tu_exists(out));
}

/* --depth's range is the one that works (issue 39, item 5: 99 999 and 100 000 were accepted,
 * then failed after starting with "program too large after unrolling"): every row's largest
 * depth (tpk_arch.max_depth, shown by --list-archs) is refused beyond at once as a usage error
 * (exit 2, no output), and mlp's runs at that depth. */
static void test_depth_range(void **state)
{
    const tu_env *e = *state;
    char out[512], args[2048], err[4096], list[16384], cmd[1200];
    tu_path(e, out, sizeof out, "deep.h5");
    snprintf(cmd, sizeof cmd, "'%s/gpkernel' --list-archs", e->bindir);
    assert_int_equal(tu_capture(cmd, list, sizeof list), 0);
    size_t n;
    const tpk_arch *t = tpk_arch_table(&n);
    int rows = 0;
    for (size_t i = 0; i < n; i++) {
        if (t[i].max_depth <= 0)
            continue;
        rows++;
        char range[64];
        snprintf(range, sizeof range, "--depth (L, 1..%d)", t[i].max_depth);
        if (!strstr(list, range))
            fail_msg("--list-archs does not say %s for %s", range, t[i].name);
        const int bad[] = {t[i].max_depth + 1, 99999, 100000};
        for (int b = 0; b < 3; b++) {
            if (bad[b] <= t[i].max_depth)
                continue;
            snprintf(args, sizeof args, "--arch=%s --depth=%d --output='%s'", t[i].name, bad[b],
                     out);
            int rc = gpkernel(e, args);
            tu_stderr(e, err, sizeof err);
            snprintf(range, sizeof range, "1..%d", t[i].max_depth);
            if (rc != 2 || !strstr(err, "usage error") || !strstr(err, range))
                fail_msg("%s: rc %d, %s", args, rc, err);
            assert_false(tu_exists(out));
        }
    }
    assert_true(rows >= 4); /* mlp, batchnorm, transformer, the CNNs */
    snprintf(args, sizeof args, "--arch=mlp --depth=%d --output='%s'",
             tpk_arch_find("mlp")->max_depth, out);
    assert_int_equal(gpkernel(e, args), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_relu_matches_direct_recursion),
        cmocka_unit_test(test_tanh_matches_high_order_reference),
        cmocka_unit_test(test_test_set_outputs),
        cmocka_unit_test(test_provenance_attributes),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_shape_messages),
        cmocka_unit_test(test_depth_range),
        cmocka_unit_test(test_program_defaults_are_the_architecture),
        cmocka_unit_test(test_program_provenance_and_types),
        cmocka_unit_test(test_netsor_train),
    };
    return cmocka_run_group_tests_name("gpkernel_cli", tests, setup, tu_teardown);
}
