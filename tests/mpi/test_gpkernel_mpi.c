/* gpkernel-mpi end to end under mpirun -np 2 (make check-mpi; issue 16): its kernel is gpkernel's
 * (MLP with a test set, the CNN's own recursion, an RNN with every readout), float32 storage is
 * the float64 kernel rounded, and a run killed (SIGKILL of a rank or of mpirun) or stopped
 * (SIGTERM, SIGINT) and resumed writes a kernel identical byte for byte to an uninterrupted run;
 * every refusal (a checkpoint without --resume, one of another job, a grid that is not the
 * ranks', batch-coupled programs, a bad --dtype) exits with its status and names the cause. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "mpitest.h"

#include <dirent.h>
#include <fcntl.h>
#include <hdf5.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Tiles evaluate the same entries as the whole batch, in other batches: the evaluator's
 * reductions (the Gram matrix by GEMM, PSD-independent maps) may round differently, by a few
 * ulps of O(1) entries. The acceptance bound. */
#define TOL_MPI 1e-14
/* Kill tests: tiles a run finishes before it is killed (of 465), the most a test waits. */
#define KILL_AFTER_TILES 40

/* How long a stand-in for a killed run's rank holds the checkpoint's lock: over the one second
 * after which a resume says it waits. */
#define HOLD_MS 2500

static int setup(void **state) { return tu_setup_tagged(state, "mpi"); }

/* The root attributes gpkernel-mpi adds to gpkernel's. */
static const char *const gpkernel_own[] = {"mpi_ranks", "mpi_grid", "tile_items", "dtype"};

/* gpkernel-mpi under mpirun with stdout kept: its first line into line. */
static int run_mpi_summary(const tu_env *e, const char *args, char *line, size_t cap)
{
    char cmd[8192], p[512];
    snprintf(cmd, sizeof cmd, "%s '%s/gpkernel-mpi' %s >'%s/out.txt' 2>'%s/err.txt'", mt_mpirun(),
             e->bindir, args, e->tmpdir, e->tmpdir);
    int rc = system(cmd);
    FILE *f = fopen(tu_path(e, p, sizeof p, "out.txt"), "r");
    assert_non_null(f);
    if (!fgets(line, (int)cap, f))
        line[0] = '\0';
    fclose(f);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}





/* ---- inputs and comparisons -------------------------------------------------------------------- */


/* ---- tests ------------------------------------------------------------------------------------ */

/* MLP with a test set: 3 × 2 ranks' tiles (one short), the cross block and the test diagonal. */
static void test_mlp_matches_gpkernel(void **state)
{
    tu_env *e = *state;
    char x[512], t[512], s[512], m[512], args[4096];
    const size_t shape[2] = {0, 12};
    mt_write_inputs(tu_path(e, x, sizeof x, "x.npy"), 230, shape, 2, 1);
    mt_write_inputs(tu_path(e, t, sizeof t, "t.npy"), 70, shape, 2, 2);
    tu_path(e, s, sizeof s, "serial.h5");
    tu_path(e, m, sizeof m, "mpi.h5");
    snprintf(args, sizeof args, "--arch=mlp --depth=3 --sigma-b2=0.1 --input='%s' --test='%s' "
             "--output='%s' --quiet", x, t, s);
    assert_int_equal(tu_run_tool(e, "gpkernel", args), 0);
    snprintf(args, sizeof args, "--arch=mlp --depth=3 --sigma-b2=0.1 --input='%s' --test='%s' "
             "--output='%s' --tile=64 --quiet", x, t, m);
    assert_int_equal(mt_run_mpi(e, "gpkernel-mpi", args), 0);
    double dk = mt_max_abs_diff(s, m, "/kernel"), dx = mt_max_abs_diff(s, m, "/kernel_test_train"),
           dd = mt_max_abs_diff(s, m, "/kernel_test_diag");
    print_message("mlp N=230 M=70 tile 64: max |K_mpi - K| %.2e, cross %.2e, diag %.2e\n", dk, dx,
                  dd);
    assert_true(dk <= TOL_MPI && dx <= TOL_MPI && dd <= TOL_MPI);
    mt_assert_attrs_superset(s, m, gpkernel_own, 4);
    char ck[600];
    snprintf(ck, sizeof ck, "%s.partial.h5", m);
    assert_false(tu_exists(ck)); /* the checkpoint became the output */
}

/* cnn1d: the CNN's own recursion (a custom job), signals N×P×C. */
static void test_cnn1d_matches_gpkernel(void **state)
{
    tu_env *e = *state;
    char x[512], s[512], m[512], args[4096];
    const size_t shape[3] = {0, 10, 2};
    mt_write_inputs(tu_path(e, x, sizeof x, "sig.npy"), 37, shape, 3, 3);
    tu_path(e, s, sizeof s, "cnn-serial.h5");
    tu_path(e, m, sizeof m, "cnn-mpi.h5");
    snprintf(args, sizeof args, "--arch=cnn1d --depth=2 --filter=3 --input='%s' --output='%s' "
             "--quiet", x, s);
    assert_int_equal(tu_run_tool(e, "gpkernel", args), 0);
    snprintf(args, sizeof args, "--arch=cnn1d --depth=2 --filter=3 --input='%s' --output='%s' "
             "--tile=8 --quiet", x, m);
    assert_int_equal(mt_run_mpi(e, "gpkernel-mpi", args), 0);
    double d = mt_max_abs_diff(s, m, "/kernel");
    print_message("cnn1d N=37 tile 8: max |K_mpi - K| %.2e\n", d);
    assert_true(d <= TOL_MPI);
    mt_assert_attrs_superset(s, m, gpkernel_own, 4);
}

/* rnn with every readout: tiles of items × time steps (input-major). */
static void test_rnn_all_times_matches_gpkernel(void **state)
{
    tu_env *e = *state;
    char x[512], s[512], m[512], args[4096];
    const size_t shape[3] = {0, 4, 3};
    mt_write_inputs(tu_path(e, x, sizeof x, "seq.npy"), 29, shape, 3, 4);
    tu_path(e, s, sizeof s, "rnn-serial.h5");
    tu_path(e, m, sizeof m, "rnn-mpi.h5");
    snprintf(args, sizeof args, "--arch=rnn --phi=erf --all-times --input='%s' --output='%s' "
             "--quiet", x, s);
    assert_int_equal(tu_run_tool(e, "gpkernel", args), 0);
    snprintf(args, sizeof args, "--arch=rnn --phi=erf --all-times --input='%s' --output='%s' "
             "--tile=6 --grid=2x1 --quiet", x, m);
    assert_int_equal(mt_run_mpi(e, "gpkernel-mpi", args), 0);
    double d = mt_max_abs_diff(s, m, "/kernel");
    print_message("rnn --all-times N=29 T=4 tile 6: max |K_mpi - K| %.2e\n", d);
    assert_true(d <= TOL_MPI);
}

/* The NTK tile by tile (--kernel=ntk: /ntk, /ntk_test_train, /ntk_test_diag): the interpreter's
 * NTK pass on an MLP with a test set, and the CNN's own recursion in Tensor Programs II's
 * parameterisation; --kernel=both is a usage error (a tile holds one kernel). */
static void test_ntk_matches_gpkernel(void **state)
{
    tu_env *e = *state;
    char x[512], t[512], s[512], m[512], args[4096];
    const size_t shape[2] = {0, 6};
    mt_write_inputs(tu_path(e, x, sizeof x, "nx.npy"), 41, shape, 2, 5);
    mt_write_inputs(tu_path(e, t, sizeof t, "nt.npy"), 11, shape, 2, 6);
    tu_path(e, s, sizeof s, "ntk-serial.h5");
    tu_path(e, m, sizeof m, "ntk-mpi.h5");
    snprintf(args, sizeof args, "--arch=mlp --depth=3 --sigma-b2=0.1 --kernel=ntk --input='%s' "
             "--test='%s' --output='%s' --quiet", x, t, s);
    assert_int_equal(tu_run_tool(e, "gpkernel", args), 0);
    snprintf(args, sizeof args, "--arch=mlp --depth=3 --sigma-b2=0.1 --kernel=ntk --input='%s' "
             "--test='%s' --output='%s' --tile=16 --quiet", x, t, m);
    assert_int_equal(mt_run_mpi(e, "gpkernel-mpi", args), 0);
    double dk = mt_max_abs_diff(s, m, "/ntk"), dx = mt_max_abs_diff(s, m, "/ntk_test_train"),
           dd = mt_max_abs_diff(s, m, "/ntk_test_diag");
    print_message("mlp NTK N=41 M=11 tile 16: max |T_mpi - T| %.2e, cross %.2e, diag %.2e\n", dk,
                  dx, dd);
    assert_true(dk <= TOL_MPI && dx <= TOL_MPI && dd <= TOL_MPI);
    mt_assert_attrs_superset(s, m, gpkernel_own, 4);
    const size_t sig[3] = {0, 8, 2};
    mt_write_inputs(tu_path(e, x, sizeof x, "nsig.npy"), 17, sig, 3, 7);
    snprintf(args, sizeof args, "--arch=cnn1d --depth=2 --filter=3 --kernel=ntk "
             "--parameterization=tp --input='%s' --output='%s' --quiet", x, s);
    assert_int_equal(tu_run_tool(e, "gpkernel", args), 0);
    snprintf(args, sizeof args, "--arch=cnn1d --depth=2 --filter=3 --kernel=ntk "
             "--parameterization=tp --input='%s' --output='%s' --tile=5 --quiet --force", x, m);
    assert_int_equal(mt_run_mpi(e, "gpkernel-mpi", args), 0);
    double dc = mt_max_abs_diff(s, m, "/ntk");
    print_message("cnn1d NTK N=17 tile 5: max |T_mpi - T| %.2e\n", dc);
    assert_true(dc <= TOL_MPI);
    mt_assert_attrs_superset(s, m, gpkernel_own, 4);
    snprintf(args, sizeof args, "--arch=mlp --kernel=both --input='%s' --output='%s' --quiet", t,
             m);
    assert_int_equal(mt_run_mpi(e, "gpkernel-mpi", args), 2);
}

/* float32 storage is the float64 kernel rounded to nearest, entry by entry. */
static void test_float32_is_rounded_float64(void **state)
{
    tu_env *e = *state;
    char x[512], a[512], b[512], args[4096];
    const size_t shape[2] = {0, 7};
    mt_write_inputs(tu_path(e, x, sizeof x, "x32.npy"), 90, shape, 2, 5);
    tu_path(e, a, sizeof a, "f64.h5");
    tu_path(e, b, sizeof b, "f32.h5");
    snprintf(args, sizeof args, "--arch=mlp --input='%s' --output='%s' --tile=32 --quiet", x, a);
    assert_int_equal(mt_run_mpi(e, "gpkernel-mpi", args), 0);
    snprintf(args, sizeof args, "--arch=mlp --input='%s' --output='%s' --tile=32 --dtype=float32 "
             "--quiet", x, b);
    assert_int_equal(mt_run_mpi(e, "gpkernel-mpi", args), 0);
    hid_t f = H5Fopen(b, H5F_ACC_RDONLY, H5P_DEFAULT), d = H5Dopen2(f, "/kernel", H5P_DEFAULT);
    hid_t ty = H5Dget_type(d);
    assert_int_equal(H5Tget_class(ty), H5T_FLOAT);
    assert_int_equal(H5Tget_size(ty), 4);
    H5Tclose(ty);
    H5Dclose(d);
    H5Fclose(f);
    size_t n64, n32;
    double *k64 = tu_h5_read(a, "/kernel", &n64), *k32 = tu_h5_read(b, "/kernel", &n32);
    assert_int_equal(n64, n32);
    for (size_t i = 0; i < n64; i++)
        assert_true(k32[i] == (double)(float)k64[i]);
    free(k64);
    free(k32);
}

/* A run long enough to be caught in the middle: 1200 items in tiles of 40 (465 tiles). */
static void long_args(const tu_env *e, const char *out, char *args, size_t cap)
{
    char x[512];
    tu_path(e, x, sizeof x, "long.npy");
    if (!tu_exists(x)) {
        const size_t shape[2] = {0, 16};
        mt_write_inputs(x, 1200, shape, 2, 6);
    }
    snprintf(args, cap, "--arch=mlp --depth=4 --phi=erf --input='%s' --output='%s' --tile=40 "
             "--quiet", x, out);
}

/* The uninterrupted run, once. */
static const char *reference(const tu_env *e)
{
    static char ref[512];
    if (!ref[0]) {
        char args[4096];
        tu_path(e, ref, sizeof ref, "ref.h5");
        long_args(e, ref, args, sizeof args);
        assert_int_equal(mt_run_mpi(e, "gpkernel-mpi", args), 0);
    }
    return ref;
}




/* Kill (sig to mpirun, or to its ranks) once some tiles are done, then --resume: only the
 * missing tiles are computed, and the kernel has the bytes of `reference`'s. */
static void interrupt_and_resume(const tu_env *e, const char *name, int sig, int ranks,
                                 int want_rc, const char *msg)
{
    const char *ref = reference(e);
    char out[512], ck[600], args[4096], rargs[4200];
    tu_path(e, out, sizeof out, name);
    snprintf(ck, sizeof ck, "%s.partial.h5", out);
    long_args(e, out, args, sizeof args);
    pid_t mp = mt_spawn_mpi(e, "gpkernel-mpi", args);
    mt_wait_for_tiles(mp, ck, KILL_AFTER_TILES);
    pid_t kids[16];
    int n = mt_children(mp, kids, 16);
    assert_true(n >= 1);
    if (ranks) {
        for (int i = 0; i < (ranks > 1 ? n : 1); i++)
            kill(kids[i], sig);
    } else {
        kill(mp, sig);
    }
    int rc = mt_wait_exit(mp);
    mt_wait_gone(kids, n); /* ranks orphaned by a killed mpirun go on for a moment */
    if (want_rc >= 0)
        assert_int_equal(rc, want_rc);
    else
        assert_true(rc != 0);
    if (msg)
        mt_assert_stderr_has(e, msg);
    assert_false(tu_exists(out));
    assert_true(tu_exists(ck));
    long total = 0, done = mt_done_tiles(ck, &total);
    print_message("%s after %s: %ld of %ld tiles in the checkpoint\n", name, strsignal(sig), done,
                  total);
    assert_true(done >= KILL_AFTER_TILES && done < total);
    /* the resumed run reports what it computed: exactly the missing tiles */
    snprintf(rargs, sizeof rargs, "%s --resume", args);
    char *summary = strstr(rargs, " --quiet");
    assert_non_null(summary);
    memmove(summary, summary + 8, strlen(summary + 8) + 1);
    char line[512];
    assert_int_equal(run_mpi_summary(e, rargs, line, sizeof line), 0);
    char want[128];
    snprintf(want, sizeof want, "%ld computed now, %ld resumed", total - done, done);
    if (!strstr(line, want))
        fail_msg("the resumed run says '%s', not '%s'", line, want);
    assert_false(tu_exists(ck));
    mt_assert_same_bytes(ref, out, "/kernel");
}

static void test_resume_after_sigkill_of_a_rank(void **state)
{
    interrupt_and_resume(*state, "kill-rank.h5", SIGKILL, 1, -1, NULL);
}

static void test_resume_after_sigkill_of_mpirun(void **state)
{
    interrupt_and_resume(*state, "kill-mpirun.h5", SIGKILL, 0, -1, NULL);
}

/* SIGTERM / SIGINT to every rank: they end at once, rank 0 says so, exit 128 + signal. */
static void test_sigterm_ends_with_checkpoint(void **state)
{
    interrupt_and_resume(*state, "term.h5", SIGTERM, 2, 143, "terminated (SIGTERM)");
}

static void test_sigint_ends_with_checkpoint(void **state)
{
    interrupt_and_resume(*state, "int.h5", SIGINT, 2, 130, "interrupted (SIGINT)");
}

/* --resume with nothing to resume starts from scratch; the result is the uninterrupted one's. */
static void test_resume_without_checkpoint(void **state)
{
    tu_env *e = *state;
    char out[512], args[4096], rargs[4200];
    tu_path(e, out, sizeof out, "fresh.h5");
    long_args(e, out, args, sizeof args);
    snprintf(rargs, sizeof rargs, "%s --resume", args);
    assert_int_equal(mt_run_mpi(e, "gpkernel-mpi", rargs), 0);
    mt_assert_same_bytes(reference(e), out, "/kernel");
}

/* A checkpoint is not overwritten without --resume, nor resumed for another job. */
static void test_checkpoint_refusals(void **state)
{
    tu_env *e = *state;
    char out[512], ck[600], args[4096], other[4200];
    tu_path(e, out, sizeof out, "refuse.h5");
    snprintf(ck, sizeof ck, "%s.partial.h5", out);
    long_args(e, out, args, sizeof args);
    pid_t mp = mt_spawn_mpi(e, "gpkernel-mpi", args);
    mt_wait_for_tiles(mp, ck, 1);
    pid_t kids[16];
    int n = mt_children(mp, kids, 16);
    kill(mp, SIGKILL);
    mt_wait_exit(mp);
    mt_wait_gone(kids, n);
    assert_true(tu_exists(ck));
    assert_int_equal(mt_run_mpi(e, "gpkernel-mpi", args), 1);
    mt_assert_stderr_has(e, "--resume continues it");
    /* another depth: the config names the setting that differs */
    snprintf(other, sizeof other, "%s --resume", args); /* the same run at depth 2 */
    char *dp = strstr(other, "--depth=4");
    assert_non_null(dp);
    dp[8] = '2';
    assert_int_equal(mt_run_mpi(e, "gpkernel-mpi", other), 1);
    mt_assert_stderr_has(e, "set L=");
    assert_true(tu_exists(ck));
    /* a process still holding it (as a killed run's ranks do for a moment): the resume waits */
    pid_t holder = fork();
    assert_true(holder >= 0);
    if (holder == 0) {
        int fd = open(ck, O_RDONLY);
        if (fd < 0 || flock(fd, LOCK_SH) != 0)
            _exit(1);
        mt_sleep_ms(HOLD_MS);
        _exit(0);
    }
    mt_sleep_ms(200);
    snprintf(other, sizeof other, "%s --resume", args);
    char *q = strstr(other, " --quiet");
    assert_non_null(q);
    memmove(q, q + 8, strlen(q + 8) + 1);
    assert_int_equal(mt_run_mpi(e, "gpkernel-mpi", other), 0);
    mt_assert_stderr_has(e, "waiting for the processes that still hold");
    assert_int_equal(mt_wait_exit(holder), 0);
    mt_assert_same_bytes(reference(e), out, "/kernel");
}

static void test_usage_errors(void **state)
{
    tu_env *e = *state;
    char x[512], out[512], args[4096];
    const size_t shape[2] = {0, 5};
    mt_write_inputs(tu_path(e, x, sizeof x, "small.npy"), 20, shape, 2, 7);
    tu_path(e, out, sizeof out, "bad.h5");
    snprintf(args, sizeof args, "--arch=mlp --input='%s' --output='%s' --grid=3x1", x, out);
    assert_int_equal(mt_run_mpi(e, "gpkernel-mpi", args), 2);
    mt_assert_stderr_has(e, "--grid=3x1");
    snprintf(args, sizeof args, "--arch=mlp --input='%s' --output='%s' --dtype=float16", x, out);
    assert_int_equal(mt_run_mpi(e, "gpkernel-mpi", args), 2);
    mt_assert_stderr_has(e, "--dtype");
    snprintf(args, sizeof args, "--arch=mlp --input='%s' --output='%s' --tile=0", x, out);
    assert_int_equal(mt_run_mpi(e, "gpkernel-mpi", args), 2);
    mt_assert_stderr_has(e, "--tile");
    /* entries of a batch-coupled program depend on the whole batch: no tiles */
    snprintf(args, sizeof args, "--arch=batchnorm --input='%s' --output='%s'", x, out);
    assert_int_equal(mt_run_mpi(e, "gpkernel-mpi", args), 1);
    mt_assert_stderr_has(e, "batch-coupled");
    snprintf(args, sizeof args, "--arch=attention --output='%s'", out);
    assert_int_equal(mt_run_mpi(e, "gpkernel-mpi", args), 1);
    mt_assert_stderr_has(e, "block by block");
    /* a tile that fails (an expectation overflows): exit 1, its message, no checkpoint of
     * nothing left behind */
    snprintf(args, sizeof args, "--arch=mlp --phi=exp --depth=30 --sigma-w2=4 --input='%s' "
             "--output='%s' --tile=8", x, out);
    assert_int_equal(mt_run_mpi(e, "gpkernel-mpi", args), 1);
    mt_assert_stderr_has(e, "overflows");
    char ck[600];
    snprintf(ck, sizeof ck, "%s.partial.h5", out);
    assert_false(tu_exists(ck));
    assert_false(tu_exists(out));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_matches_gpkernel),
        cmocka_unit_test(test_cnn1d_matches_gpkernel),
        cmocka_unit_test(test_rnn_all_times_matches_gpkernel),
        cmocka_unit_test(test_float32_is_rounded_float64),
        cmocka_unit_test(test_ntk_matches_gpkernel),
        cmocka_unit_test(test_resume_after_sigkill_of_a_rank),
        cmocka_unit_test(test_resume_after_sigkill_of_mpirun),
        cmocka_unit_test(test_sigterm_ends_with_checkpoint),
        cmocka_unit_test(test_sigint_ends_with_checkpoint),
        cmocka_unit_test(test_resume_without_checkpoint),
        cmocka_unit_test(test_checkpoint_refusals),
        cmocka_unit_test(test_usage_errors),
    };
    return cmocka_run_group_tests_name("gpkernel-mpi", tests, setup, tu_teardown);
}
