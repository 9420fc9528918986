/* Issue 5, item 5: every shipped architecture's finite-width kernel approaches its limit at rate
 * n^(-1/2) (theory.md §7.2). gplimits at toy size (widths 32..256, 32 networks per width, 3 or 4
 * inputs) on a deep MLP, the simple RNN, the transformer, batchnorm and the GRU; the fitted RMS
 * exponent's paired-bootstrap 95% interval must contain −1/2. The heavy version of the same runs
 * is `make limits-archs` (scripts/limits-archs.sh). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "tpk/tpk.h"
#include "tpk/clock.h"

static char tmpdir[64];
static char bindir[1024];
static char root[1024];

/* Each architecture runs at BASES independent seed bases (disjoint networks). A correct 95%
 * interval misses −1/2 with probability ≈ 0.05 per run, so "at least BASES − 1 of BASES cover"
 * fails by chance with probability ≈ 3·0.05² < 1% per architecture; a wrong rate (no decay,
 * or n^-1) is missed by all three. */
#define BASES 3
#define TOY "--widths=32..256 --seeds=32 --boot=200 --quiet"
/* Gross bounds that any run must meet: the toy slope's sd is ≈ 0.05–0.08 (measured: bootstrap
 * half-widths 0.07–0.15), so −1/2 ± 0.35 is > 4 sd, and an interval wider than 0.6 would not
 * tell −1/2 from −1/4 or −1. */
#define SLOPE_LO (-0.85)
#define SLOPE_HI (-0.15)
#define MAX_CI_WIDTH 0.6

static int setup(void **state)
{
    (void)state;
    strcpy(tmpdir, "/tmp/tpk-limarch-XXXXXX");
    if (!mkdtemp(tmpdir))
        return -1;
    const char *b = getenv("TPK_BIN"), *r = getenv("TPK_ROOT");
    snprintf(bindir, sizeof bindir, "%s", b ? b : "build/bin");
    snprintf(root, sizeof root, "%s", r ? r : ".");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static tpk_array *ds(const char *file, const char *name)
{
    char spec[1024];
    snprintf(spec, sizeof spec, "%s:%s", file, name);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_array *a = tpk_io_read(spec, NULL, &ctx);
    if (!a)
        print_error("%s\n", ctx.msg);
    assert_non_null(a);
    return a;
}

/* gplimits `args` TOY at BASES seed bases; /fits/rms = slope, lo, hi, ... */
static void check_rate(const char *label, const char *args)
{
    int cover = 0;
    double t0 = tpk_wall_seconds();
    for (int b = 0; b < BASES; b++) {
        char out[512], cmd[4096];
        snprintf(out, sizeof out, "%s/%s-%d.h5", tmpdir, label, b);
        snprintf(cmd, sizeof cmd, "'%s/gplimits' %s " TOY " --seed=%d --output='%s' 2>'%s/err'",
                 bindir, args, 1000 * (b + 1), out, tmpdir);
        int rc = system(cmd);
        if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0) {
            char e[600];
            snprintf(e, sizeof e, "%s/err", tmpdir);
            FILE *f = fopen(e, "r");
            char msg[2048] = "";
            if (f) {
                size_t k = fread(msg, 1, sizeof msg - 1, f);
                msg[k] = '\0';
                fclose(f);
            }
            fail_msg("%s: gplimits failed: %s", label, msg);
        }
        tpk_array *fit = ds(out, "/fits/rms");
        double s = fit->data[0], lo = fit->data[1], hi = fit->data[2];
        print_message("%-12s base %d: RMS exponent %.3f [%.3f, %.3f] from n = %g\n", label, b, s,
                      lo, hi, fit->data[12]);
        assert_true(lo < s && s < hi);
        assert_true(s > SLOPE_LO && s < SLOPE_HI);
        assert_true(hi - lo < MAX_CI_WIDTH);
        cover += lo < -0.5 && -0.5 < hi;
        tpk_array_free(fit);
    }
    print_message("%-12s %d of %d intervals contain -1/2 (%.1f s)\n", label, cover, BASES,
                  tpk_wall_seconds() - t0);
    assert_true(cover >= BASES - 1);
}

static void test_deep_mlp(void **state)
{
    (void)state;
    check_rate("mlp-depth4", "--arch=mlp --depth=4 --max-inputs=4");
}

static void test_rnn(void **state)
{
    (void)state;
    check_rate("rnn", "--arch=rnn --max-inputs=4");
}

static void test_transformer(void **state)
{
    (void)state;
    check_rate("transformer", "--arch=transformer --max-inputs=4");
}

static void test_batchnorm(void **state)
{
    (void)state;
    check_rate("batchnorm", "--arch=batchnorm --max-inputs=4");
}

/* GRU (programs/gru.nsr, erf gates, orthant limit): 3 sequences of 3 steps keep the limit's
 * quadrature to ~1 s (its error estimate ~5e-7 ≪ the smallest RMS error ~1e-1). */
static void test_gru(void **state)
{
    (void)state;
    char in[512], args[2048];
    snprintf(in, sizeof in, "%s/seq.h5", tmpdir);
    double x[3 * 3 * 2] = {0.31, -0.72, 1.13, 0.05, -0.48, 0.86, -1.02, 0.27, 0.64,
                           -0.33, 0.91, 0.12, 0.58, -0.15, -0.87, 0.44, 0.23, -0.61};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_h5out *h = tpk_h5out_open(in, &ctx);
    assert_non_null(h);
    tpk_array a = {3, {3, 3, 2, 0}, x, {NULL, NULL}};
    assert_int_equal(tpk_h5out_write(h, "/x", &a, &ctx), TPK_OK);
    assert_int_equal(tpk_h5out_commit(h, &ctx), TPK_OK);
    snprintf(args, sizeof args, "--program='%s/programs/gru.nsr' --input='%s:/x'", root, in);
    check_rate("gru", args);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deep_mlp),
        cmocka_unit_test(test_rnn),
        cmocka_unit_test(test_transformer),
        cmocka_unit_test(test_batchnorm),
        cmocka_unit_test(test_gru),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
