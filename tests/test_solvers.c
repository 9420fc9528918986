/* One choice of solver for every tool (app/solvers.c, tpk_job_solver): for mlp, transformer and
 * gru on their bundled inputs, gpkernel's kernel, gplimits' limit kernel and the kernel gpregress
 * computes for itself are the same numbers bit for bit (gpregress: its log marginal likelihood
 * against gpregress on gpkernel's own file), every output names the same solver, and
 * TPK_EVALUATOR=program moves all of them to the interpreter together. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/testutil.h"

static const char *root(void)
{
    const char *r = getenv("TPK_ROOT");
    return r && *r ? r : ".";
}

/* A root string attribute of file (fixed or variable length) into buf. */
static void attr_text(const char *file, const char *name, char *buf, size_t len)
{
    buf[0] = '\0';
    hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    assert_true(f >= 0);
    hid_t a = H5Aopen(f, name, H5P_DEFAULT);
    if (a < 0) {
        H5Fclose(f);
        fail_msg("%s: no attribute %s", file, name);
    }
    hid_t t = H5Aget_type(a);
    if (H5Tis_variable_str(t) > 0) {
        char *s = NULL;
        hid_t mt = H5Tcopy(H5T_C_S1);
        H5Tset_size(mt, H5T_VARIABLE);
        H5Tset_cset(mt, H5Tget_cset(t));
        assert_true(H5Aread(a, mt, &s) >= 0);
        snprintf(buf, len, "%s", s ? s : "");
        H5free_memory(s);
        H5Tclose(mt);
    } else {
        size_t n = H5Tget_size(t);
        char *s = calloc(n + 1, 1);
        assert_non_null(s);
        assert_true(H5Aread(a, t, s) >= 0);
        snprintf(buf, len, "%s", s);
        free(s);
    }
    H5Tclose(t);
    H5Aclose(a);
    H5Fclose(f);
}

static void run(const tu_env *e, const char *env, const char *tool, const char *args)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd '%s' && %s '%s/%s' %s --force >/dev/null 2>err.txt", e->tmpdir,
             env, e->bindir, tool, args);
    if (system(cmd) != 0) {
        char err[2048];
        tu_stderr(e, err, sizeof err);
        fail_msg("%s %s: %s", tool, args, err);
    }
}

static void same_bits(const char *a, const char *da, const char *b, const char *db)
{
    size_t na, nb;
    double *x = tu_h5_read(a, da, &na), *y = tu_h5_read(b, db, &nb);
    assert_int_equal(na, nb);
    size_t diff = 0;
    for (size_t i = 0; i < na; i++)
        diff += memcmp(&x[i], &y[i], sizeof x[i]) != 0;
    if (diff)
        print_message("%s:%s and %s:%s differ in %zu of %zu entries\n", a, da, b, db, diff, na);
    assert_int_equal(diff, 0);
    free(x);
    free(y);
}

static void one_arch(const tu_env *e, const char *arch, const char *input, const char *env,
                     const char *want)
{
    char args[2048], k[512], l[512], r1[512], r2[512], s[256], lab[512];
    tu_path(e, k, sizeof k, "k.h5");
    tu_path(e, l, sizeof l, "l.h5");
    tu_path(e, r1, sizeof r1, "r1.h5");
    tu_path(e, r2, sizeof r2, "r2.h5");
    snprintf(args, sizeof args, "--arch=%s --input='%s/%s' --output=k.h5", arch, root(), input);
    run(e, env, "gpkernel", args);
    attr_text(k, "solver", s, sizeof s);
    assert_string_equal(s, want);
    /* gplimits' limit, on every input (--max-inputs=0): the same kernel, the same solver */
    snprintf(args, sizeof args, "--arch=%s --input='%s/%s' --widths=8..16 --seeds=4 "
             "--max-inputs=0 --output=l.h5 --quiet", arch, root(), input);
    run(e, env, "gplimits", args);
    attr_text(l, "limit_solver", s, sizeof s);
    assert_string_equal(s, want);
    same_bits(k, "/kernel", l, "/kernel_limit");
    /* gpregress computing the kernel itself, and on gpkernel's file: the same fit */
    size_t n;
    double *K = tu_h5_read(k, "/kernel", &n);
    size_t N = 1;
    while (N * N < n)
        N++;
    free(K);
    tu_path(e, lab, sizeof lab, "y.csv");
    FILE *f = fopen(lab, "w");
    assert_non_null(f);
    for (size_t i = 0; i < N; i++)
        fprintf(f, "%.6f\n", 0.3 + 0.71 * (double)(i % 5) - 0.23 * (double)(i % 3));
    fclose(f);
    snprintf(args, sizeof args, "--arch=%s --train='%s/%s' --labels=y.csv --noise=0.05 "
             "--output=r1.h5 --quiet", arch, root(), input);
    run(e, env, "gpregress", args);
    run(e, env, "gpregress", "--kernel=k.h5 --labels=y.csv --noise=0.05 --output=r2.h5 --quiet");
    same_bits(r1, "/lml", r2, "/lml");
}

static void test_same_solver_everywhere(void **state)
{
    const tu_env *e = *state;
    one_arch(e, "mlp", "data/demo-inputs.csv", "TPK_THREADS=fixed", "interpreter");
    one_arch(e, "transformer", "data/demo-tokens.npy", "TPK_THREADS=fixed", "transformer-recursion");
    one_arch(e, "gru", "data/demo-sequences.npy", "TPK_THREADS=fixed", "gru-recursion");
}

static void test_evaluator_override(void **state)
{
    const tu_env *e = *state;
    const char *env = "TPK_THREADS=fixed TPK_EVALUATOR=program";
    one_arch(e, "transformer", "data/demo-tokens.npy", env, "interpreter");
}

static int setup(void **state)
{
    return tu_setup_tagged(state, "solvers");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_solver_everywhere),
        cmocka_unit_test(test_evaluator_override),
    };
    return cmocka_run_group_tests(tests, setup, tu_teardown);
}
