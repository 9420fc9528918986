/* Kernel jobs block by block (tpk_kernel_job_*, issue 16) and the adopted HDF5 output
 * (tpk_h5out_adopt, tpk_h5out_remove) that gpkernel-mpi finishes its file with: every block —
 * diagonal, below and above the diagonal, ragged, test rows with their diagonal, several
 * readouts per item — is that block of the whole job's kernel (NETSOR program, the CNN's own
 * recursion), the description is gpkernel's, and every error path says what is wrong. */
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
#include "tpk/archs.h"
#include "tpk/io.h"
#include "tpk/job.h"
#include "tpk/tpk.h"

/* A block is evaluated on other items than the whole kernel: the input Gram matrix and the
 * evaluator's reductions may round differently by a few ulps of O(1) entries. */
#define TOL_BLOCK 1e-14

static int setup(void **state) { return tu_setup_tagged(state, "block"); }

static const char *root(void)
{
    const char *r = getenv("TPK_ROOT");
    return r ? r : ".";
}

/* n items of shape dims[1..] with high-entropy values, as .npy at path. */
static void inputs(const char *path, size_t n, int ndim, const size_t *dims, double phase)
{
    size_t per = 1, d[4];
    for (int k = 1; k < ndim; k++)
        per *= dims[k];
    double *x = malloc(n * per * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < n * per; i++)
        x[i] = 1.37 * sin(0.731 * (double)i + phase) + 0.41 * cos(2.113 * (double)(i % 7));
    memcpy(d, dims, (size_t)ndim * sizeof *d);
    d[0] = n;
    tu_write_npy(path, x, ndim, d);
    free(x);
}

/* The whole job's kernel through gpkernel's job (a file, read back). */
static double *whole(const tu_env *e, const tpk_arch *a, const tpk_job *job, const char *name,
                     size_t *count, const char *dset)
{
    char out[512];
    tpk_job j = *job;
    j.output = tu_path(e, out, sizeof out, name);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    int st = a && a->custom ? a->custom(&j, &ctx) : tpk_job_kernel(&j, &ctx);
    if (st)
        fail_msg("whole job: %s", ctx.msg);
    return tu_h5_read(out, dset, count);
}

/* Every block of rows (test or training items) r0.. × columns c0.. matches K (side ld). */
static void check_block(tpk_kernel_job *kj, int test, size_t r0, size_t nr, size_t c0, size_t nc,
                        const double *K, size_t ldK, const double *kdiag)
{
    size_t R = tpk_kernel_job_readouts(kj), rows = nr * R, cols = nc * R, ld = cols + 3;
    double *B = malloc(rows * ld * sizeof *B), *dg = malloc(rows * sizeof *dg), err = -1;
    assert_non_null(B);
    assert_non_null(dg);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    if (tpk_kernel_job_block(kj, test, r0, nr, c0, nc, B, ld, dg, &err, &ctx))
        fail_msg("block: %s", ctx.msg);
    assert_true(err >= 0);
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++) {
            double want = K[(r0 * R + i) * ldK + c0 * R + j];
            if (fabs(B[i * ld + j] - want) > TOL_BLOCK)
                fail_msg("block (%d, %zu+%zu, %zu+%zu) entry (%zu, %zu): %.17g, whole %.17g", test,
                         r0, nr, c0, nc, i, j, B[i * ld + j], want);
        }
    for (size_t i = 0; i < rows; i++) {
        double want = kdiag ? kdiag[r0 * R + i] : K[(r0 * R + i) * ldK + r0 * R + i];
        assert_true(fabs(dg[i] - want) <= TOL_BLOCK);
    }
    free(B);
    free(dg);
}

static void test_program_blocks_are_the_kernels(void **state)
{
    tu_env *e = *state;
    char x[512], t[512], prog[1024];
    const size_t dims[2] = {0, 6};
    inputs(tu_path(e, x, sizeof x, "x.npy"), 23, 2, dims, 0.3);
    inputs(tu_path(e, t, sizeof t, "t.npy"), 9, 2, dims, 1.9);
    snprintf(prog, sizeof prog, "%s/programs/mlp.nsr", root());
    const tpk_param_set sets[] = {{"L", "2"}, {"sigma_b2", "0.13"}};
    tpk_job job = {.label = "mlp", .program = prog, .sets = sets, .nsets = 2, .input = x, .test = t};
    size_t nk, nx, nd;
    char wf[512];
    double *K = whole(e, NULL, &job, "whole.h5", &nk, "/kernel");
    double *Kx = tu_h5_read(tu_path(e, wf, sizeof wf, "whole.h5"), "/kernel_test_train", &nx);
    double *kd = tu_h5_read(wf, "/kernel_test_diag", &nd);
    assert_true(nk == 23 * 23 && nx == 9 * 23 && nd == 9);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_kernel_job *kj = tpk_kernel_job_alloc(NULL, &job, &ctx);
    if (!kj)
        fail_msg("%s", ctx.msg);
    assert_int_equal(tpk_kernel_job_items(kj, 0), 23);
    assert_int_equal(tpk_kernel_job_items(kj, 1), 9);
    assert_int_equal(tpk_kernel_job_readouts(kj), 1);
    assert_int_equal(tpk_kernel_job_input(kj, 0)->dims[0], 23);
    check_block(kj, 0, 0, 23, 0, 23, K, 23, NULL);  /* the whole kernel as one block */
    check_block(kj, 0, 5, 7, 5, 7, K, 23, NULL);    /* on the diagonal */
    check_block(kj, 0, 14, 9, 2, 7, K, 23, NULL);   /* below, ragged at the end */
    check_block(kj, 0, 1, 4, 16, 7, K, 23, NULL);   /* above the diagonal */
    check_block(kj, 0, 3, 6, 6, 6, K, 23, NULL);    /* overlapping ranges */
    check_block(kj, 1, 0, 9, 0, 23, Kx, 23, kd);    /* test rows, their diagonal */
    check_block(kj, 1, 4, 5, 11, 12, Kx, 23, kd);
    tpk_kernel_job_free(kj);
    free(K);
    free(Kx);
    free(kd);
}

/* On arrays (tpk_arch_kernel_job, gpregress-mpi's tiles): mlp's flags give tpk_mlp_kernel's
 * kernel (gpregress's) block by block, for a closed-form phi (relu) and a quadrature one (gelu,
 * both Gauss–Hermite of the default degree: the same rounding). */
static void test_arch_job_on_arrays_is_mlp_kernel(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    const size_t n = 19, m = 7, d = 5;
    tpk_array *X = tpk_array_alloc2(n, d, &ctx), *Xt = tpk_array_alloc2(m, d, &ctx);
    assert_non_null(X);
    assert_non_null(Xt);
    for (size_t i = 0; i < n * d; i++)
        X->data[i] = 1.37 * sin(0.731 * (double)i + 0.3);
    for (size_t i = 0; i < m * d; i++)
        Xt->data[i] = 0.83 * cos(1.219 * (double)i + 0.1);
    const tpk_arch *a = tpk_arch_find("mlp");
    tpk_phi_registry *reg = tpk_phi_registry_alloc(&ctx);
    assert_non_null(reg);
    const char *phis[] = {"relu", "gelu"};
    for (int q = 0; q < 2; q++) {
        const tpk_arch_flag fl[] = {{.flag = "depth", .value = "3"},
                                    {.flag = "phi", .value = phis[q]},
                                    {.flag = "sigma-w2", .value = "1.7"},
                                    {.flag = "sigma-b2", .value = "0.21"}};
        tpk_arch_opts o = {.flags = fl, .nflags = 4};
        tpk_kernel_job *kj = tpk_arch_kernel_job(a, &o, X, Xt, &ctx);
        if (!kj)
            fail_msg("%s", ctx.msg);
        tpk_phi *phi = tpk_phi_alloc(reg, phis[q], &ctx);
        tpk_gauss_ws *ws = tpk_gauss_ws_alloc(TPK_GAUSS_DEFAULT_DEGREE, &ctx);
        tpk_mlp_params p = {.depth = 3, .phi = phi, .sigma_w2 = 1.7, .sigma_b2 = 0.21};
        tpk_array *K = tpk_array_alloc2(n, n, &ctx), *Kx = tpk_array_alloc2(m, n, &ctx),
                  *kd = tpk_array_alloc(1, (size_t[]){m}, &ctx);
        assert_int_equal(tpk_mlp_kernel(&p, X, Xt, ws, K, Kx, kd, NULL, &ctx), TPK_OK);
        check_block(kj, 0, 0, n, 0, n, K->data, n, NULL);
        check_block(kj, 0, 11, 8, 3, 6, K->data, n, NULL);
        check_block(kj, 1, 2, 5, 9, 10, Kx->data, n, kd->data);
        tpk_kernel_job_free(kj);
        tpk_array_free(K);
        tpk_array_free(Kx);
        tpk_array_free(kd);
        tpk_gauss_ws_free(ws);
        tpk_phi_free(phi);
    }
    /* refusals: no inputs, a custom row (it reads files) */
    tpk_arch_opts none = {0};
    assert_null(tpk_kernel_job_alloc_arrays(a, &(tpk_job){.label = "mlp"}, NULL, NULL, &ctx));
    assert_int_equal(ctx.status, TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    assert_null(tpk_arch_kernel_job(tpk_arch_find("cnn1d"), &none, X, NULL, &ctx));
    assert_int_equal(ctx.status, TPK_EUNSUPPORTED);
    tpk_phi_registry_free(reg);
    tpk_array_free(X);
    tpk_array_free(Xt);
}

/* The CNN's own recursion (a custom job) and positions read out: R = P readouts per item. */
static void test_cnn_blocks_with_readouts(void **state)
{
    tu_env *e = *state;
    char x[512], prog[1024];
    const size_t dims[3] = {0, 5, 2};
    inputs(tu_path(e, x, sizeof x, "sig.npy"), 11, 3, dims, 0.7);
    snprintf(prog, sizeof prog, "%s/programs/cnn1d.nsr", root());
    const tpk_arch *a = tpk_arch_find("cnn1d");
    assert_non_null(a);
    const tpk_param_set sets[] = {{"L", "2"}, {"phi", "relu"}, {"sigma_w2", "2"}, {"sigma_b2", "0.2"},
                                  {"filter", "3"}};
    for (int positions = 0; positions < 2; positions++) {
        tpk_job job = {.label = "cnn1d", .program = prog, .sets = sets, .nsets = 5, .input = x,
                       .all_outputs = positions};
        size_t nk;
        double *K = whole(e, a, &job, positions ? "cnnp.h5" : "cnn.h5", &nk, "/kernel");
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        tpk_kernel_job *kj = tpk_kernel_job_alloc(a, &job, &ctx);
        if (!kj)
            fail_msg("%s", ctx.msg);
        size_t R = tpk_kernel_job_readouts(kj), side = 11 * R;
        assert_int_equal(R, positions ? 5 : 1);
        assert_int_equal(nk, side * side);
        check_block(kj, 0, 4, 4, 4, 4, K, side, NULL);
        check_block(kj, 0, 8, 3, 0, 4, K, side, NULL);
        tpk_kernel_job_free(kj);
        free(K);
    }
}

/* The description is gpkernel's: the same root attributes and named dimensions. */
static void test_describe_is_gpkernels(void **state)
{
    tu_env *e = *state;
    char x[512], prog[1024], out[512];
    const size_t dims[2] = {0, 4};
    inputs(tu_path(e, x, sizeof x, "d.npy"), 6, 2, dims, 2.2);
    snprintf(prog, sizeof prog, "%s/programs/mlp.nsr", root());
    const tpk_attr attrs[] = {{.name = "depth", .value = "3"}};
    tpk_job job = {.label = "mlp", .program = prog, .input = x, .attrs = attrs, .nattrs = 1};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_kernel_job *kj = tpk_kernel_job_alloc(NULL, &job, &ctx);
    assert_non_null(kj);
    double K[36];
    assert_int_equal(tpk_kernel_job_block(kj, 0, 0, 6, 0, 6, K, 6, NULL, NULL, &ctx), TPK_OK);
    tpk_h5out *o = tpk_h5out_open(tu_path(e, out, sizeof out, "desc.h5"), &ctx);
    assert_non_null(o);
    tpk_array A = {.ndim = 2, .dims = {6, 6}, .data = K};
    assert_int_equal(tpk_h5out_write(o, "/kernel", &A, &ctx), TPK_OK);
    assert_int_equal(tpk_kernel_job_describe(kj, o, &ctx), TPK_OK);
    assert_int_equal(tpk_h5out_commit(o, &ctx), TPK_OK);
    static const char *const want[] = {"architecture", "program", "L", "depth", "input_sha256",
                                       "input_shape", "toolkit_version", "all_outputs"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!tu_h5_has_attr(out, want[i]))
            fail_msg("no attribute %s", want[i]);
    size_t n;
    free(tu_h5_read(out, "/train", &n)); /* the dimension scale of /kernel's rows */
    assert_int_equal(n, 6);
    tpk_kernel_job_free(kj);
}

static void test_block_errors(void **state)
{
    tu_env *e = *state;
    char x[512], prog[1024];
    const size_t dims[2] = {0, 3};
    inputs(tu_path(e, x, sizeof x, "err.npy"), 8, 2, dims, 0.1);
    snprintf(prog, sizeof prog, "%s/programs/mlp.nsr", root());
    tpk_job job = {.label = "mlp", .program = prog, .input = x};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_null(tpk_kernel_job_alloc(NULL, NULL, &ctx));
    assert_int_equal(ctx.status, TPK_EINVAL);
    tpk_job none = {.label = "mlp", .program = prog};
    tpk_ctx_init(&ctx);
    assert_null(tpk_kernel_job_alloc(NULL, &none, &ctx));
    assert_int_equal(ctx.status, TPK_EINVAL);
    tpk_kernel_job *kj = tpk_kernel_job_alloc(NULL, &job, &ctx);
    assert_non_null(kj);
    double B[64];
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_kernel_job_block(kj, 0, 6, 3, 0, 2, B, 8, NULL, NULL, &ctx), TPK_EINVAL);
    assert_non_null(strstr(ctx.msg, "outside the inputs"));
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_kernel_job_block(kj, 0, 0, 0, 0, 2, B, 8, NULL, NULL, &ctx), TPK_EINVAL);
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_kernel_job_block(kj, 0, 0, 2, 0, 4, B, 3, NULL, NULL, &ctx), TPK_EINVAL);
    assert_non_null(strstr(ctx.msg, "leading dimension"));
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_kernel_job_block(kj, 1, 0, 1, 0, 1, B, 8, NULL, NULL, &ctx), TPK_EINVAL);
    assert_non_null(strstr(ctx.msg, "no test inputs"));
    assert_int_equal(tpk_kernel_job_items(kj, 1), 0);
    tpk_kernel_job_free(kj);
    tpk_kernel_job_free(NULL);
    /* batch-coupled entries and the sampled attention limit have no blocks */
    snprintf(prog, sizeof prog, "%s/programs/batchnorm.nsr", root());
    tpk_job bn = {.label = "batchnorm", .program = prog, .input = x};
    tpk_ctx_init(&ctx);
    assert_null(tpk_kernel_job_alloc(NULL, &bn, &ctx));
    assert_int_equal(ctx.status, TPK_EUNSUPPORTED);
    assert_non_null(strstr(ctx.msg, "batch-coupled"));
    tpk_ctx_init(&ctx);
    assert_null(tpk_kernel_job_alloc(tpk_arch_find("attention"), &job, &ctx));
    assert_int_equal(ctx.status, TPK_EUNSUPPORTED);
}

/* A file made elsewhere, finished and renamed into place; refusals leave it alone. */
static void test_h5out_adopt(void **state)
{
    tu_env *e = *state;
    char tmp[512], path[512], junk[512], other[600];
    tu_path(e, tmp, sizeof tmp, ".adopt.partial");
    tu_path(e, path, sizeof path, "adopt.h5");
    const double v[6] = {2.385, -1.25, 0.5, 3.75, 1e-3, 7.0};
    tu_h5_write(tmp, "/kernel", v, 2, 3);
    tu_h5_write(tu_path(e, junk, sizeof junk, ".scratch.h5"), "/bookkeeping", v, 1, 1);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    /* abort leaves the caller's file where it is */
    tpk_h5out *o = tpk_h5out_adopt(path, tmp, &ctx);
    assert_non_null(o);
    tpk_h5out_abort(o);
    assert_true(tu_exists(tmp));
    assert_false(tu_exists(path));
    o = tpk_h5out_adopt(path, tmp, &ctx);
    assert_non_null(o);
    assert_int_equal(tpk_h5out_write_vector(o, "/bookkeeping", v, 6, &ctx), TPK_OK);
    assert_int_equal(tpk_h5out_attr_int(o, "/", "mpi_ranks", 2, &ctx), TPK_OK);
    assert_int_equal(tpk_h5out_remove(o, "/bookkeeping", &ctx), TPK_OK);
    assert_false(tpk_h5out_has(o, "/bookkeeping"));
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_h5out_remove(o, "/bookkeeping", &ctx), TPK_ENOTFOUND);
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_h5out_commit(o, &ctx), TPK_OK);
    assert_false(tu_exists(tmp));
    assert_true(tu_h5_has_attr(path, "mpi_ranks"));
    size_t n;
    double *k = tu_h5_read(path, "/kernel", &n);
    assert_int_equal(n, 6);
    assert_memory_equal(k, v, sizeof v);
    free(k);
    /* not HDF5, elsewhere, missing, empty */
    FILE *f = fopen(tu_path(e, junk, sizeof junk, ".junk"), "w");
    assert_non_null(f);
    fputs("not hdf5\n", f);
    fclose(f);
    tpk_ctx_init(&ctx);
    assert_null(tpk_h5out_adopt(path, junk, &ctx));
    assert_int_equal(ctx.status, TPK_EFORMAT);
    assert_true(tu_exists(junk));
    snprintf(other, sizeof other, "/tmp/.tpk-elsewhere-%ld", (long)getpid());
    tpk_ctx_init(&ctx);
    assert_null(tpk_h5out_adopt(path, other, &ctx));
    assert_int_equal(ctx.status, TPK_EINVAL);
    tpk_ctx_init(&ctx);
    assert_null(tpk_h5out_adopt(path, tu_path(e, junk, sizeof junk, ".missing"), &ctx));
    assert_int_equal(ctx.status, TPK_EIO);
    tpk_ctx_init(&ctx);
    assert_null(tpk_h5out_adopt("", tmp, &ctx));
    assert_int_equal(ctx.status, TPK_EINVAL);
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_h5out_remove(NULL, "/x", &ctx), TPK_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_program_blocks_are_the_kernels),
        cmocka_unit_test(test_arch_job_on_arrays_is_mlp_kernel),
        cmocka_unit_test(test_cnn_blocks_with_readouts),
        cmocka_unit_test(test_describe_is_gpkernels),
        cmocka_unit_test(test_block_errors),
        cmocka_unit_test(test_h5out_adopt),
    };
    return cmocka_run_group_tests_name("job_block", tests, setup, tu_teardown);
}
