/* Issue 16's acceptance for gpkernel-mpi at size (make check-mpi-size; minutes, not part of make
 * check-mpi): under mpirun -np 2, an MLP kernel of N = 6000 inputs is the single process's to
 * 1e-14, and at N = 16 000 a run whose mpirun is SIGKILLed part-way, then rerun with --resume,
 * writes a kernel whose values are those of an uninterrupted run, bit for bit. Prints the
 * differences, the tiles the checkpoint held and the wall time of every run. Inputs: N × 64
 * deterministic high-entropy features. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "mpitest.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define N_SINGLE 6000
#define N_RESUME 16000
#define DIM 64
#define TOL_SINGLE 1e-14
/* the kill comes once this share of the tiles is in the checkpoint */
#define KILL_AT 0.3

static int setup(void **state) { return tu_setup_tagged(state, "gpk-size"); }

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void args_for(const tu_env *e, size_t n, const char *out, char *args, size_t cap)
{
    char x[512], name[64];
    snprintf(name, sizeof name, "x%zu.npy", n);
    tu_path(e, x, sizeof x, name);
    if (!tu_exists(x)) {
        const size_t shape[2] = {0, DIM};
        mt_write_inputs(x, n, shape, 2, 16 + n);
    }
    snprintf(args, cap, "--arch=mlp --depth=3 --phi=relu --input='%s' --output='%s' --quiet", x,
             out);
}

static void test_mlp_6000_is_the_single_process_kernel(void **state)
{
    tu_env *e = *state;
    char out[512], ref[512], args[4096], cmd[8192];
    tu_path(e, out, sizeof out, "k6000-mpi.h5");
    tu_path(e, ref, sizeof ref, "k6000.h5");
    args_for(e, N_SINGLE, ref, args, sizeof args);
    snprintf(cmd, sizeof cmd, "'%s/gpkernel' %s", e->bindir, args);
    double t0 = now();
    assert_int_equal(system(cmd), 0);
    double t1 = now();
    args_for(e, N_SINGLE, out, args, sizeof args);
    assert_int_equal(mt_run_mpi(e, "gpkernel-mpi", args), 0);
    double t2 = now();
    double d = mt_max_abs_diff(out, ref, "/kernel"), m = mt_max_abs(ref, "/kernel");
    print_message("N=%d: gpkernel %.1f s, mpirun -np 2 gpkernel-mpi %.1f s; max |K_mpi - K| "
                  "%.2e (max |K| %.3g)\n", N_SINGLE, t1 - t0, t2 - t1, d, m);
    assert_true(d <= TOL_SINGLE * m);
}

static void test_resume_16000_after_sigkill_of_mpirun(void **state)
{
    tu_env *e = *state;
    char ref[512], out[512], ck[600], args[4096], rargs[4200];
    tu_path(e, ref, sizeof ref, "k16000-ref.h5");
    tu_path(e, out, sizeof out, "k16000.h5");
    snprintf(ck, sizeof ck, "%s.partial.h5", out);
    args_for(e, N_RESUME, ref, args, sizeof args);
    double t0 = now();
    assert_int_equal(mt_run_mpi(e, "gpkernel-mpi", args), 0);
    double t1 = now();
    args_for(e, N_RESUME, out, args, sizeof args);
    pid_t mp = mt_spawn_mpi(e, "gpkernel-mpi", args);
    long total = 0;
    while (mt_done_tiles(ck, &total) < 0 && waitpid(mp, NULL, WNOHANG) == 0)
        mt_sleep_ms(50);
    mt_wait_for_tiles(mp, ck, (long)(KILL_AT * (double)total) + 1);
    pid_t kids[16];
    int n = mt_children(mp, kids, 16);
    assert_true(n >= 1);
    kill(mp, SIGKILL);
    assert_int_equal(mt_wait_exit(mp), 128 + SIGKILL);
    mt_wait_gone(kids, n);
    double t2 = now();
    long done = mt_done_tiles(ck, &total);
    assert_false(tu_exists(out));
    assert_true(done > 0 && done < total);
    snprintf(rargs, sizeof rargs, "%s --resume", args);
    assert_int_equal(mt_run_mpi(e, "gpkernel-mpi", rargs), 0);
    double t3 = now();
    assert_false(tu_exists(ck));
    mt_assert_same_bytes(ref, out, "/kernel");
    print_message("N=%d: uninterrupted %.1f s; killed (SIGKILL of mpirun) after %.1f s with %ld "
                  "of %ld tiles in the checkpoint; --resume %.1f s; /kernel identical\n", N_RESUME,
                  t1 - t0, t2 - t1, done, total, t3 - t2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_6000_is_the_single_process_kernel),
        cmocka_unit_test(test_resume_16000_after_sigkill_of_mpirun),
    };
    return cmocka_run_group_tests_name("gpkernel-mpi at size", tests, setup, tu_teardown);
}
