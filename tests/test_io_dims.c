/* Named dimensions in HDF5 output (tpk_h5out_dims, tpk_h5out_coord_*, issue 17 item 2): netCDF-4 style
 * scales, read back here with HDF5's own dimension-scale API rather than the toolkit's reader,
 * the kernel jobs' names (gpkernel, netsor run), and every error. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <hdf5.h>
#include <hdf5_hl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/testutil.h"
#include "tpk/io.h"

static int setup(void **state) { return tu_setup_tagged(state, "dims"); }

static herr_t scale_name_cb(hid_t did, unsigned dim, hid_t dsid, void *data)
{
    (void)did;
    (void)dim;
    char *buf = data;
    return H5DSget_scale_name(dsid, buf, 64) >= 0 ? 1 : -1; /* the first scale only */
}

/* The name of the scale attached to axis k of dataset ds in file f ("" if none), through HDF5's
 * own dimension-scale API (the scale's NAME, as netCDF and xarray read it). */
static void scale_of(const char *f, const char *ds, unsigned k, char *buf, size_t len)
{
    assert_true(len >= 64);
    hid_t file = H5Fopen(f, H5F_ACC_RDONLY, H5P_DEFAULT);
    assert_true(file >= 0);
    hid_t d = H5Dopen2(file, ds, H5P_DEFAULT);
    if (d < 0)
        fail_msg("%s: no dataset %s", f, ds);
    buf[0] = '\0';
    if (H5DSget_num_scales(d, k) == 1)
        H5DSiterate_scales(d, k, NULL, scale_name_cb, buf);
    H5Dclose(d);
    H5Fclose(file);
}

/* Every axis of ds named as `want` (n names). */
static void expect_dims(const char *f, const char *ds, const char *const *want, unsigned n)
{
    char got[64];
    for (unsigned k = 0; k < n; k++) {
        scale_of(f, ds, k, got, sizeof got);
        if (strcmp(got, want[k]) != 0)
            fail_msg("%s: axis %u of %s is '%s', want '%s'", f, k, ds, got, want[k]);
    }
}

/* The class of dataset ds (H5T_INTEGER, H5T_FLOAT, H5T_STRING). */
static H5T_class_t class_of(const char *f, const char *ds)
{
    hid_t file = H5Fopen(f, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(file, ds, H5P_DEFAULT);
    assert_true(d >= 0);
    hid_t t = H5Dget_type(d);
    H5T_class_t c = H5Tget_class(t);
    H5Tclose(t);
    H5Dclose(d);
    H5Fclose(file);
    return c;
}

/* An integer dataset (≤ cap values) as long long; its length in *n. */
static void read_ints(const char *f, const char *ds, long long *v, size_t cap, size_t *n)
{
    hid_t file = H5Fopen(f, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(file, ds, H5P_DEFAULT);
    assert_true(d >= 0);
    hid_t sp = H5Dget_space(d);
    hssize_t np = H5Sget_simple_extent_npoints(sp);
    assert_true(np >= 0 && (size_t)np <= cap);
    *n = (size_t)np;
    assert_true(H5Dread(d, H5T_NATIVE_LLONG, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0);
    H5Sclose(sp);
    H5Dclose(d);
    H5Fclose(file);
}

/* Entry i of a variable-length string dataset into buf. */
static void read_label(const char *f, const char *ds, size_t i, char *buf, size_t len)
{
    hid_t file = H5Fopen(f, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(file, ds, H5P_DEFAULT);
    assert_true(d >= 0);
    hid_t t = H5Dget_type(d), sp = H5Dget_space(d);
    assert_true(H5Tis_variable_str(t) > 0);
    hssize_t np = H5Sget_simple_extent_npoints(sp);
    assert_true(np > 0 && (size_t)np > i);
    char **v = calloc((size_t)np, sizeof *v);
    assert_true(H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0);
    snprintf(buf, len, "%s", v[i]);
    H5Dvlen_reclaim(t, sp, H5P_DEFAULT, v);
    free(v);
    H5Sclose(sp);
    H5Tclose(t);
    H5Dclose(d);
    H5Fclose(file);
}

static void test_dims_written(void **state)
{
    const tu_env *e = *state;
    char f[512], got[64];
    tu_path(e, f, sizeof f, "d.h5");
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_h5out *out = tpk_h5out_open(f, &ctx);
    assert_non_null(out);
    double k[6] = {1.5, 2.5, 3.5, 4.5, 5.5, 6.5}, v[3] = {0.25, 0.5, 0.75};
    tpk_array K = {.ndim = 2, .dims = {3, 2}, .data = k};
    assert_int_equal(tpk_h5out_write(out, "/K", &K, &ctx), TPK_OK);
    assert_int_equal(tpk_h5out_write_vector(out, "/v", v, 3, &ctx), TPK_OK);
    assert_int_equal(tpk_h5out_dims(out, "/K", (const char *const[]){"a", "b"}, 2, &ctx), TPK_OK);
    /* a second dataset shares the dimension "a" */
    assert_int_equal(tpk_h5out_dims(out, "/v", (const char *const[]){"a"}, 1, &ctx), TPK_OK);
    assert_int_equal(tpk_h5out_commit(out, &ctx), TPK_OK);
    scale_of(f, "/K", 0, got, sizeof got);
    assert_string_equal(got, "a");
    scale_of(f, "/K", 1, got, sizeof got);
    assert_string_equal(got, "b");
    scale_of(f, "/v", 0, got, sizeof got);
    assert_string_equal(got, "a");
    /* the data is untouched; the scale holds 0 .. n-1 as integers */
    size_t n;
    double *kk = tu_h5_read(f, "/K", &n);
    assert_int_equal(n, 6);
    assert_memory_equal(kk, k, sizeof k);
    free(kk);
    hid_t file = H5Fopen(f, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t b = H5Dopen2(file, "/b", H5P_DEFAULT);
    hid_t t = H5Dget_type(b);
    assert_int_equal(H5Tget_class(t), H5T_INTEGER);
    long long bv[2] = {7, 7};
    assert_true(H5Dread(b, H5T_NATIVE_LLONG, H5S_ALL, H5S_ALL, H5P_DEFAULT, bv) >= 0);
    assert_true(bv[0] == 0 && bv[1] == 1);
    H5Tclose(t);
    H5Dclose(b);
    H5Fclose(file);
}

static void expect(int st, int want, const tpk_ctx *ctx, const char *words)
{
    if (st != want || !strstr(ctx->msg, words))
        print_error("status %d (want %d), message '%s' (want '%s')\n", st, want, ctx->msg, words);
    assert_int_equal(st, want);
    assert_non_null(strstr(ctx->msg, words));
}

static void test_dims_errors(void **state)
{
    const tu_env *e = *state;
    char f[512];
    tu_path(e, f, sizeof f, "bad.h5");
    double k[6] = {1, 2, 3, 4, 5, 6};
    tpk_array K = {.ndim = 2, .dims = {3, 2}, .data = k};
    const char *const ab[] = {"a", "b"}, *const ba[] = {"b", "a"}, *const bad[] = {"a", "2x"};
    struct { const char *ds; const char *const *names; int n; int st; const char *words; } cases[] = {
        {"/K", bad, 2, TPK_EINVAL, "dimension name '2x' is not an identifier"},
        {"/K", ab, 1, TPK_EINVAL, "has rank 2 but 1 dimension names"},
        {"/nope", ab, 2, TPK_ENOTFOUND, "no dataset '/nope'"},
        {"/K", (const char *const[]){"K", "b"}, 2, TPK_EINVAL, "not a dimension scale at '/K'"},
        {"/K", ba, 2, TPK_EINVAL, "dimension 'b' has length 2, not 3"},
        {"K", ab, 2, TPK_EINVAL, "must be an absolute path"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        tpk_h5out *out = tpk_h5out_open(f, &ctx);
        assert_non_null(out);
        assert_int_equal(tpk_h5out_write(out, "/K", &K, &ctx), TPK_OK);
        if (cases[i].names == ba) /* "b" first made of length 2 by another dataset */
            assert_int_equal(tpk_h5out_dims(out, "/K", ab, 2, &ctx), TPK_OK);
        expect(tpk_h5out_dims(out, cases[i].ds, cases[i].names, cases[i].n, &ctx), cases[i].st,
               &ctx, cases[i].words);
        /* a failed naming fails the file: commit refuses, nothing is left behind */
        assert_int_not_equal(tpk_h5out_commit(out, &ctx), TPK_OK);
        assert_false(tu_exists(f));
    }
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    expect(tpk_h5out_dims(NULL, "/K", ab, 2, &ctx), TPK_EINVAL, &ctx, "not open");
}

/* The jobs name their datasets: gpkernel (with a test set; --all-times) and netsor run. */
static void test_job_dims(void **state)
{
    const tu_env *e = *state;
    char f[512], args[2048], got[64];
    const char *r = getenv("TPK_ROOT");
    r = r ? r : ".";
    tu_path(e, f, sizeof f, "K.h5");
    snprintf(args, sizeof args, "--arch=mlp --depth=2 --input=%s/data/demo-inputs.csv "
             "--test=%s/data/demo-inputs.csv --output=%s --quiet", r, r, f);
    assert_int_equal(tu_run_tool(e, "gpkernel", args), 0);
    static const struct { const char *ds; unsigned k; const char *name; } want[] = {
        {"/kernel", 0, "train"}, {"/kernel", 1, "train2"}, {"/kernel_test_train", 0, "test"},
        {"/kernel_test_train", 1, "train2"}, {"/kernel_test_diag", 0, "test"}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        scale_of(f, want[i].ds, want[i].k, got, sizeof got);
        assert_string_equal(got, want[i].name);
    }
    snprintf(args, sizeof args, "--arch=rnn --all-times --output=%s --quiet", f);
    assert_int_equal(tu_run_tool(e, "gpkernel", args), 0);
    scale_of(f, "/kernel", 0, got, sizeof got);
    assert_string_equal(got, "train_readout");
    snprintf(args, sizeof args, "run %s/programs/mlp.nsr --input=%s/data/demo-inputs.csv "
             "--width=16 --seed=3 --output=%s --quiet", r, r, f);
    assert_int_equal(tu_run_tool(e, "netsor", args), 0);
    scale_of(f, "/kernel_hat", 1, got, sizeof got);
    assert_string_equal(got, "train2");
    scale_of(f, "/outputs", 0, got, sizeof got);
    assert_string_equal(got, "train");
    scale_of(f, "/outputs", 1, got, sizeof got);
    assert_string_equal(got, "output");
    /* the 1/sqrt(n) attention job and gpattention */
    snprintf(args, sizeof args, "--arch=attention --logit-scaling=inv-sqrt-n --output=%s --quiet",
             f);
    assert_int_equal(tu_run_tool(e, "gpkernel", args), 0);
    expect_dims(f, "/score_covariances", (const char *const[]){"sample", "train", "train2"}, 3);
    expect_dims(f, "/input_kernel", (const char *const[]){"token", "token2"}, 2);
    snprintf(args, sizeof args, "--widths=4,8 --networks=8 --heads-list=1,2 --output=%s --quiet",
             f);
    assert_int_equal(tu_run_tool(e, "gpattention", args), 0);
    expect_dims(f, "/energy_limit", (const char *const[]){"width"}, 1);
    expect_dims(f, "/heads_kurtosis", (const char *const[]){"heads"}, 1);
    expect_dims(f, "/limit_mean", (const char *const[]){"token", "token2"}, 2);
    assert_int_equal(class_of(f, "/widths"), H5T_INTEGER);
}

/* Coordinates: integer, float and label dimension scales, attached by tpk_h5out_dims afterwards;
 * tpk_h5out_has; every error fails the file. */
static void test_coords(void **state)
{
    const tu_env *e = *state;
    char f[512], got[64];
    tu_path(e, f, sizeof f, "c.h5");
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_h5out *out = tpk_h5out_open(f, &ctx);
    assert_non_null(out);
    const long long w[3] = {32, 128, 2048};
    const double t[2] = {0.125, 2.375};
    const char *const lab[2] = {"slope", "intercept"};
    double v[6] = {1.5, 2.5, 3.5, 4.5, 5.5, 6.5};
    tpk_array A = {.ndim = 2, .dims = {3, 2}, .data = v};
    assert_int_equal(tpk_h5out_has(out, "/width"), 0);
    assert_int_equal(tpk_h5out_coord_ints(out, "width", w, 3, &ctx), TPK_OK);
    assert_int_equal(tpk_h5out_coord_doubles(out, "time", t, 2, &ctx), TPK_OK);
    assert_int_equal(tpk_h5out_coord_labels(out, "stat", lab, 2, &ctx), TPK_OK);
    assert_int_equal(tpk_h5out_has(out, "/width"), 1);
    assert_int_equal(tpk_h5out_has(out, "/g/A"), 0);
    assert_int_equal(tpk_h5out_write(out, "/g/A", &A, &ctx), TPK_OK);
    assert_int_equal(tpk_h5out_has(out, "/g/A"), 1);
    assert_int_equal(tpk_h5out_has(out, "/g/A/x"), 0);
    assert_int_equal(tpk_h5out_has(out, "g"), 0); /* not an absolute path */
    assert_int_equal(tpk_h5out_dims(out, "/g/A", (const char *const[]){"width", "stat"}, 2, &ctx),
                     TPK_OK);
    assert_int_equal(tpk_h5out_write_vector(out, "/B", t, 2, &ctx), TPK_OK);
    assert_int_equal(tpk_h5out_dims(out, "/B", (const char *const[]){"time"}, 1, &ctx), TPK_OK);
    assert_int_equal(tpk_h5out_commit(out, &ctx), TPK_OK);
    expect_dims(f, "/g/A", (const char *const[]){"width", "stat"}, 2);
    expect_dims(f, "/B", (const char *const[]){"time"}, 1);
    assert_int_equal(class_of(f, "/width"), H5T_INTEGER);
    assert_int_equal(class_of(f, "/time"), H5T_FLOAT);
    assert_int_equal(class_of(f, "/stat"), H5T_STRING);
    long long got_w[3];
    size_t n;
    read_ints(f, "/width", got_w, 3, &n);
    assert_int_equal(n, 3);
    assert_memory_equal(got_w, w, sizeof w);
    read_label(f, "/stat", 1, got, sizeof got);
    assert_string_equal(got, "intercept");
    size_t nt;
    double *tt = tu_h5_read(f, "/time", &nt);
    assert_int_equal(nt, 2);
    assert_memory_equal(tt, t, sizeof t);
    free(tt);

    /* errors: each one fails the file, and the destination stays as it was */
    const double inf[1] = {1.0 / 0.0};
    const char *const nul[2] = {"a", NULL};
    for (int c = 0; c < 6; c++) {
        tpk_ctx_init(&ctx);
        tu_path(e, f, sizeof f, "cbad.h5");
        out = tpk_h5out_open(f, &ctx);
        assert_non_null(out);
        int st = 0, want = TPK_EINVAL;
        const char *words = "";
        switch (c) {
        case 0: st = tpk_h5out_coord_ints(out, "2w", w, 3, &ctx); words = "not an identifier"; break;
        case 1: st = tpk_h5out_coord_ints(out, "w", w, 0, &ctx); words = "no coordinate values"; break;
        case 2:
            assert_int_equal(tpk_h5out_coord_ints(out, "w", w, 3, &ctx), TPK_OK);
            st = tpk_h5out_coord_ints(out, "w", w, 2, &ctx);
            words = "dimension 'w' exists already";
            break;
        case 3: st = tpk_h5out_coord_labels(out, "l", nul, 2, &ctx); words = "label 1 is NULL"; break;
        case 4:
            st = tpk_h5out_coord_doubles(out, "d", inf, 1, &ctx);
            want = TPK_EDOM;
            words = "coordinate 0 is +inf";
            break;
        case 5: /* a coordinate of another length than the axis it names */
            assert_int_equal(tpk_h5out_coord_ints(out, "w", w, 2, &ctx), TPK_OK);
            assert_int_equal(tpk_h5out_write(out, "/A", &A, &ctx), TPK_OK);
            st = tpk_h5out_dims(out, "/A", (const char *const[]){"w", "x"}, 2, &ctx);
            words = "dimension 'w' has length 2, not 3";
            break;
        }
        expect(st, want, &ctx, words);
        assert_int_not_equal(tpk_h5out_commit(out, &ctx), TPK_OK);
        assert_false(tu_exists(f));
    }
    tpk_ctx_init(&ctx);
    expect(tpk_h5out_coord_ints(NULL, "w", w, 3, &ctx), TPK_EINVAL, &ctx, "not open");
    assert_int_equal(tpk_h5out_has(NULL, "/w"), 0);
}

/* gplimits names every axis: width and seed (their values as integer coordinates), the inputs by
 * their row, fits as labelled records (issue 17 acceptance: xarray shows named dimensions). */
static void test_gplimits_dims(void **state)
{
    const tu_env *e = *state;
    char f[512], args[1024], got[64];
    tu_path(e, f, sizeof f, "conv.h5");
    snprintf(args, sizeof args, "--arch=mlp --depth=2 --widths=16,48,96 --seeds=5 --boot=60 "
             "--max-inputs=3 --seed=7 --output=%s --quiet", f);
    assert_int_equal(tu_run_tool(e, "gplimits", args), 0);
    expect_dims(f, "/per_seed/khat", (const char *const[]){"width", "seed", "input", "input2"}, 4);
    expect_dims(f, "/per_seed/outputs", (const char *const[]){"width", "seed", "input"}, 3);
    expect_dims(f, "/per_seed/frob_rel", (const char *const[]){"width", "seed"}, 2);
    expect_dims(f, "/kernel_limit", (const char *const[]){"input", "input2"}, 2);
    expect_dims(f, "/inputs", (const char *const[]){"input", "feature"}, 2);
    expect_dims(f, "/per_width/rms", (const char *const[]){"width"}, 1);
    expect_dims(f, "/slices", (const char *const[]){"slice", "input"}, 2);
    expect_dims(f, "/fits/rms", (const char *const[]){"fit_stat"}, 1);
    expect_dims(f, "/fits/rms_stability", (const char *const[]){"first_width", "stability_stat"}, 2);
    long long v[16];
    size_t n;
    read_ints(f, "/width", v, 16, &n);
    assert_true(n == 3 && v[0] == 16 && v[1] == 48 && v[2] == 96);
    assert_int_equal(class_of(f, "/widths"), H5T_INTEGER);
    read_ints(f, "/seed", v, 16, &n);
    assert_true(n == 5 && v[0] == 7 && v[4] == 11);
    read_ints(f, "/input", v, 16, &n);  /* 3 evenly spaced rows of the 48 demo inputs */
    assert_true(n == 3 && v[0] == 0 && v[1] == 16 && v[2] == 32);
    assert_int_equal(class_of(f, "/input_rows"), H5T_INTEGER);
    /* the record's labels are the attribute names, in the order of its values */
    read_label(f, "/fit_stat", 0, got, sizeof got);
    assert_string_equal(got, "slope");
    read_label(f, "/fit_stat", 13, got, sizeof got);
    assert_string_equal(got, "boot_failures");
    size_t nf;
    double *fit = tu_h5_read(f, "/fits/rms", &nf);
    assert_int_equal(nf, 14);
    assert_true(fit[12] == 16.0); /* first_width */
    free(fit);
    /* every readout: the compared coordinates are (input, readout) pairs */
    snprintf(args, sizeof args, "--arch=rnn --all-outputs --widths=16,32 --seeds=4 --boot=60 "
             "--max-inputs=2 --output=%s --quiet", f);
    assert_int_equal(tu_run_tool(e, "gplimits", args), 0);
    expect_dims(f, "/kernel_limit", (const char *const[]){"coord", "coord2"}, 2);
    expect_dims(f, "/inputs", (const char *const[]){"input", "token", "feature"}, 3);
}

/* gpregress: predictions over test × output, one entry per kernel (a depth range: the axis
 * depth with the depths as coordinates), integers as integers, seconds with units. */
static void test_gpregress_dims(void **state)
{
    const tu_env *e = *state;
    char f[512], x[512], y[512], args[4096];
    tu_path(e, f, sizeof f, "gp.h5");
    tu_path(e, x, sizeof x, "x.npy");
    tu_path(e, y, sizeof y, "y.npy");
    double xv[12 * 2], yv[12 * 2];
    for (int i = 0; i < 24; i++) {
        xv[i] = sin(1.7 * i + 0.3);
        yv[i] = cos(0.9 * i);
    }
    tu_write_npy(x, xv, 2, (size_t[]){12, 2});
    tu_write_npy(y, yv, 2, (size_t[]){12, 2});
    snprintf(args, sizeof args, "--arch=mlp --depth=1-3 --train=%s --labels=%s --test=%s "
             "--test-labels=%s --n-train=8 --n-test=4 --noise=0.1 --output=%s --quiet", x, y, x,
             y, f);
    assert_int_equal(tu_run_tool(e, "gpregress", args), 0);
    expect_dims(f, "/lml", (const char *const[]){"depth"}, 1);
    expect_dims(f, "/depths", (const char *const[]){"depth"}, 1);
    expect_dims(f, "/depth_2/mean", (const char *const[]){"test", "output"}, 2);
    expect_dims(f, "/depth_2/var", (const char *const[]){"test"}, 1);
    long long v[8];
    size_t n;
    read_ints(f, "/depth", v, 8, &n);
    assert_true(n == 3 && v[0] == 1 && v[2] == 3);
    assert_int_equal(class_of(f, "/depths"), H5T_INTEGER);
    snprintf(args, sizeof args, "--arch=rbf --train=%s --labels=%s --test=%s --n-train=8 "
             "--n-test=4 --noise=0.1 --full-cov --output=%s --quiet", x, y, x, f);
    assert_int_equal(tu_run_tool(e, "gpregress", args), 0);
    expect_dims(f, "/mean", (const char *const[]){"test", "output"}, 2);
    expect_dims(f, "/cov", (const char *const[]){"test", "test2"}, 2);
    expect_dims(f, "/noise", (const char *const[]){"model"}, 1);
    char units[16];
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_io_read_attr_str(f, "/seconds", "units", units, sizeof units, &ctx),
                     TPK_OK);
    assert_string_equal(units, "s");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dims_written),
        cmocka_unit_test(test_dims_errors),
        cmocka_unit_test(test_job_dims),
        cmocka_unit_test(test_coords),
        cmocka_unit_test(test_gplimits_dims),
        cmocka_unit_test(test_gpregress_dims),
    };
    return cmocka_run_group_tests_name("io_dims", tests, setup, tu_teardown);
}
