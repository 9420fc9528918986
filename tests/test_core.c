/* Core pieces that hold process state of other libraries or of the system: GSL's error handler,
 * which the toolkit switches off once (tpk_error_gsl_init), keeping a handler the host installed,
 * and the one wall clock. The handler tests run in child processes, so each starts from GSL's
 * aborting default whatever another test did first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <gsl/gsl_errno.h>
#include <gsl/gsl_integration.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tpk/array.h"
#include "tpk/clock.h"
#include "tpk/limits.h"

static double one(double x, void *p)
{
    (void)p;
    return x;
}

/* A GSL call that reports GSL_EINVAL through the error handler: a subdivision limit larger
 * than the workspace. With GSL's default handler this aborts the process. */
static int gsl_error_call(void)
{
    gsl_integration_workspace *w = gsl_integration_workspace_alloc(10);
    gsl_function F = {one, NULL};
    double r, e;
    int st = gsl_integration_qag(&F, 0, 1, 0, 1e-10, 20, GSL_INTEG_GAUSS21, w, &r, &e);
    gsl_integration_workspace_free(w);
    return st;
}

/* Any toolkit function that calls GSL (here: random directions by GSL's mt19937). */
static void library_call(void)
{
    double theta[6];
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    if (tpk_limits_directions(3, 2, 2385, theta, &ctx) != TPK_OK)
        _exit(100);
}

static int host_calls;

static void host_handler(const char *reason, const char *file, int line, int gsl_errno)
{
    (void)reason;
    (void)file;
    (void)line;
    (void)gsl_errno;
    host_calls++;
}

enum { PLAIN, AFTER_LIBRARY, HOST_HANDLER, THREADS };

/* The child's exit status: the GSL status it got back (+ 10 × host handler calls), or the
 * signal that ended it, negated. */
static int in_child(int what)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (what == HOST_HANDLER)
            gsl_set_error_handler(host_handler);
        if (what == AFTER_LIBRARY || what == HOST_HANDLER)
            library_call();
        if (what == THREADS) {
#pragma omp parallel num_threads(8)
            tpk_error_gsl_init();
        }
        int st = gsl_error_call();
        _exit(st + 10 * host_calls);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? -WTERMSIG(status) : -999;
}

static void test_gsl_default_aborts(void **state)
{
    (void)state;
    /* Before any toolkit call GSL is untouched: the error aborts (the check below can fail). */
    int quiet = dup(2), null = open("/dev/null", 1);
    dup2(null, 2); /* GSL's default handler prints before abort() */
    int rc = in_child(PLAIN);
    dup2(quiet, 2);
    close(null);
    close(quiet);
    assert_int_equal(rc, -SIGABRT);
}

static void test_gsl_off_after_library_call(void **state)
{
    (void)state;
    assert_int_equal(in_child(AFTER_LIBRARY), GSL_EINVAL);
    assert_int_equal(in_child(THREADS), GSL_EINVAL);
}

static void test_gsl_host_handler_kept(void **state)
{
    (void)state;
    /* The host's handler is called once, and the code still comes back. */
    assert_int_equal(in_child(HOST_HANDLER), GSL_EINVAL + 10);
}

static void test_wall_clock(void **state)
{
    (void)state;
    double t0 = tpk_wall_seconds(), prev = t0;
    for (int i = 0; i < 1000; i++) {
        double t = tpk_wall_seconds();
        assert_true(t >= prev);
        prev = t;
    }
    struct timespec ts = {0, 30 * 1000 * 1000};
    nanosleep(&ts, NULL);
    double dt = tpk_wall_seconds() - t0;
    /* at least the 30 ms slept; well under a second even on a loaded machine */
    assert_true(dt >= 0.029 && dt < 5.0);
}

/* The first non-finite entry by flat and multi-index; all finite gives the size. */
static void test_first_nonfinite(void **state)
{
    (void)state;
    size_t dims[3] = {2, 3, 4};
    tpk_array *a = tpk_array_alloc(3, dims, NULL);
    assert_non_null(a);
    for (size_t i = 0; i < 24; i++)
        a->data[i] = 0.125 * (double)i - 1.375;
    char idx[64];
    assert_int_equal(tpk_array_first_nonfinite(a, idx, sizeof idx), 24);
    a->data[23] = INFINITY;
    a->data[17] = NAN; /* [1, 1, 1] */
    assert_int_equal(tpk_array_first_nonfinite(a, idx, sizeof idx), 17);
    assert_string_equal(idx, "1, 1, 1");
    tpk_array_free(a);
}

/* tpk_lower_index against a walk over the rows, and at rows up to 2^26 (k near 2^51), where the
 * square root alone rounds to a neighbouring row. */
static void test_lower_index(void **state)
{
    (void)state;
    size_t k = 0;
    for (size_t i = 0; i < 300; i++)
        for (size_t j = 0; j <= i; j++, k++) {
            size_t a = 99, c = 99;
            tpk_lower_index(k, &a, &c);
            assert_int_equal(a, i);
            assert_int_equal(c, j);
        }
    for (size_t i = ((size_t)1 << 26) - 3; i < ((size_t)1 << 26) + 3; i++) {
        const size_t first = i * (i + 1) / 2, last = first + i;
        size_t a, c;
        tpk_lower_index(first, &a, &c);
        assert_int_equal(a, i);
        assert_int_equal(c, 0);
        tpk_lower_index(last, &a, &c);
        assert_int_equal(a, i);
        assert_int_equal(c, i);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gsl_default_aborts),
        cmocka_unit_test(test_gsl_off_after_library_call),
        cmocka_unit_test(test_gsl_host_handler_kept),
        cmocka_unit_test(test_wall_clock),
        cmocka_unit_test(test_first_nonfinite),
        cmocka_unit_test(test_lower_index),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
