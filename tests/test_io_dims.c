/* Named dimensions in HDF5 output (tpk_h5out_dims, issue 17 item 2): netCDF-4 style dimension
 * scales, read back here with HDF5's own dimension-scale API rather than the toolkit's reader,
 * the kernel jobs' names (gpkernel, netsor run), and every error. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <hdf5.h>
#include <hdf5_hl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/testutil.h"
#include "tpk/io.h"

static int setup(void **state) { return tu_setup_tagged(state, "dims"); }

/* The name of the scale attached to axis k of dataset ds in file f ("" if none). */
static void scale_of(const char *f, const char *ds, unsigned k, char *buf, size_t len)
{
    hid_t file = H5Fopen(f, H5F_ACC_RDONLY, H5P_DEFAULT);
    assert_true(file >= 0);
    hid_t d = H5Dopen2(file, ds, H5P_DEFAULT);
    assert_true(d >= 0);
    buf[0] = '\0';
    int n = H5DSget_num_scales(d, k);
    if (n == 1) {
        hid_t sc = -1;
        char path[256];
        /* the attached scale's own name: open it through the dimension list */
        for (const char *cand = "/train\0/train2\0/test\0/output\0/train_readout\0"
                                "/train_readout2\0/test_readout\0/a\0/b\0";
             *cand; cand += strlen(cand) + 1) {
            snprintf(path, sizeof path, "%s", cand);
            if (H5Lexists(file, path, H5P_DEFAULT) <= 0)
                continue;
            sc = H5Dopen2(file, path, H5P_DEFAULT);
            if (H5DSis_attached(d, sc, k) > 0) {
                H5DSget_scale_name(sc, buf, len);
                H5Dclose(sc);
                break;
            }
            H5Dclose(sc);
        }
    }
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
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dims_written),
        cmocka_unit_test(test_dims_errors),
        cmocka_unit_test(test_job_dims),
    };
    return cmocka_run_group_tests_name("io_dims", tests, setup, tu_teardown);
}
