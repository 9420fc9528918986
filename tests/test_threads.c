/* The team size on a shared machine (core/threads.c, include/tpk/threads.h): the CPUs the
 * process may use (affinity, cgroup v2 and v1 quotas on fake hierarchies), less the threads other
 * processes are running (a fake /proc/loadavg, and a real busy child), never below 1; the user's
 * OMP_NUM_THREADS and TPK_THREADS=fixed are kept. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tpk/threads.h"
#include "support/testutil.h"

static void put(const tu_env *e, const char *name, const char *text)
{
    char path[512];
    tu_path(e, path, sizeof path, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static void dir(const tu_env *e, const char *name)
{
    char path[512];
    tu_path(e, path, sizeof path, name);
    mkdir(path, 0700);
}

/* Fake /proc/loadavg with `run` threads running, and an empty cgroup tree (no quota). */
static void fake_load(const tu_env *e, int run)
{
    char text[64], path[512];
    snprintf(text, sizeof text, "0.50 0.40 0.30 %d/200 4242\n", run);
    put(e, "loadavg", text);
    setenv("TPK_LOADAVG", tu_path(e, path, sizeof path, "loadavg"), 1);
    dir(e, "nocg");
    setenv("TPK_CGROUP_ROOT", tu_path(e, path, sizeof path, "nocg"), 1);
}

static void clean_env(void)
{
    unsetenv("OMP_NUM_THREADS");
    unsetenv("TPK_THREADS");
    unsetenv("TPK_LOADAVG");
    unsetenv("TPK_CGROUP_ROOT");
}

static void test_free_cpus(void **state)
{
    const tu_env *e = *state;
    clean_env();
    int procs = omp_get_num_procs();
    fake_load(e, 1); /* only the caller */
    assert_int_equal(tpk_threads_adapt(), procs);
    assert_int_equal(omp_get_max_threads(), procs);
    fake_load(e, 2); /* one other thread running */
    int want = procs > 1 ? procs - 1 : 1;
    assert_int_equal(tpk_threads_adapt(), want);
    assert_int_equal(omp_get_max_threads(), want);
    fake_load(e, 57); /* a crowded machine: one thread, never none */
    assert_int_equal(tpk_threads_adapt(), 1);
    assert_int_equal(omp_get_max_threads(), 1);
    clean_env();
}

static void test_user_choice_kept(void **state)
{
    const tu_env *e = *state;
    clean_env();
    fake_load(e, 57);
    omp_set_num_threads(3);
    setenv("OMP_NUM_THREADS", "3", 1);
    assert_int_equal(tpk_threads_adapt(), 3);
    assert_int_equal(omp_get_max_threads(), 3);
    unsetenv("OMP_NUM_THREADS");
    setenv("TPK_THREADS", "fixed", 1);
    assert_int_equal(tpk_threads_adapt(), 3);
    clean_env();
}

/* cgroup v2: the tightest cpu.max on the path wins ("max" is none); v1 where v2 has none. */
static void test_quota(void **state)
{
    const tu_env *e = *state;
    clean_env();
    int procs = omp_get_num_procs();
    if (procs < 2) {
        print_message("one CPU: quotas cannot lower the team\n");
        return;
    }
    char path[512];
    fake_load(e, 1);
    dir(e, "cg2");
    dir(e, "cg2/a");
    dir(e, "cg2/a/b");
    put(e, "cg2/self.cgroup", "1:name=systemd:/x\n0::/a/b\n");
    put(e, "cg2/cpu.max", "max 100000\n");
    put(e, "cg2/a/cpu.max", "50000 100000\n"); /* half a CPU: one thread */
    put(e, "cg2/a/b/cpu.max", "max 100000\n");
    setenv("TPK_CGROUP_ROOT", tu_path(e, path, sizeof path, "cg2"), 1);
    assert_int_equal(tpk_threads_adapt(), 1);
    put(e, "cg2/a/cpu.max", "max 100000\n");
    assert_int_equal(tpk_threads_adapt(), procs);
    dir(e, "cg1");
    dir(e, "cg1/cpu");
    put(e, "cg1/cpu/cpu.cfs_quota_us", "100000\n");
    put(e, "cg1/cpu/cpu.cfs_period_us", "100000\n");
    setenv("TPK_CGROUP_ROOT", tu_path(e, path, sizeof path, "cg1"), 1);
    assert_int_equal(tpk_threads_adapt(), 1);
    put(e, "cg1/cpu/cpu.cfs_quota_us", "-1\n"); /* v1's "no quota" */
    assert_int_equal(tpk_threads_adapt(), procs);
    clean_env();
}

/* The real /proc/loadavg beside a busy child: the team leaves it a CPU. */
static void test_beside_busy_child(void **state)
{
    (void)state;
    clean_env();
    int procs = omp_get_num_procs();
    if (procs < 2) {
        print_message("one CPU: nothing to leave\n");
        return;
    }
    pid_t c = fork();
    assert_true(c >= 0);
    if (c == 0) {
        volatile unsigned long x = 0;
        for (time_t t0 = time(NULL); time(NULL) - t0 < 5;)
            x++;
        _exit(0);
    }
    struct timespec ts = {0, 200000000};
    nanosleep(&ts, NULL);
    int k = tpk_threads_adapt();
    kill(c, SIGKILL);
    waitpid(c, NULL, 0);
    assert_true(k >= 1 && k <= procs - 1);
}

static int setup(void **state)
{
    return tu_setup_tagged(state, "threads");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_free_cpus),
        cmocka_unit_test(test_user_choice_kept),
        cmocka_unit_test(test_quota),
        cmocka_unit_test(test_beside_busy_child),
    };
    return cmocka_run_group_tests(tests, setup, tu_teardown);
}
