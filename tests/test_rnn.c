/* Simple RNN (theory.md §2.2): gpkernel --arch=rnn against an independent recursion, the untied
 * RNN's missing cross-time terms, and the finite-width executor's n^(-1/2) convergence. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpk/job.h"
#include "tpk/limits.h"
#include "tpk/tpk.h"
#include "support/testutil.h"

static int setup(void **state) { return tu_setup_tagged(state, "rnn"); }

enum { N = 4, T = 5, D = 3 };
/* Closed-form erf expectations on both sides, T steps of rounding: the issue asks 1e-10. */
#define TOL_RNN 1e-10
/* Fitted RMS slope must be within this of −1/2 (issue 3 acceptance). */
#define SLOPE_TOL 0.1

static const double sw2 = 1.3, su2 = 0.8, sb2 = 0.1, sv2 = 1.1;
/* Deterministic "high-entropy" sequences: x[a][t][j]. */
static void sequences(double *x)
{
    for (int a = 0; a < N; a++)
        for (int t = 0; t < T; t++)
            for (int j = 0; j < D; j++)
                x[(a * T + t) * D + j] = sin(1.37 * a + 0.61 * t + 2.11 * j + 0.3) * (1.0 + 0.2 * a);
}

/* Williams' erf kernel, written out here (theory.md §3.2). */
static double erf_e2(double q1, double q2, double k)
{
    return 2.0 / M_PI * asin(2.0 * k / sqrt((1.0 + 2.0 * q1) * (1.0 + 2.0 * q2)));
}

/* Independent §2.2 recursion over all (sequence, time) pairs, index a·T + t:
 * Σ(h^t_a, h^r_c) = σ_W² E[φφ](t−1, r−1)·1[t>1, r>1, tied or t = r] + σ_U²⟨x^t_a, x^r_c⟩/d + σ_b²,
 * output σ_v² E[φ(h^t_a) φ(h^r_c)]. */
static void reference(const double *x, int tied, double *Y)
{
    enum { M = N * T };
    static double S[M * M];
    for (int t = 0; t < T; t++)     /* in order of increasing time: step t needs t−1 */
        for (int a = 0; a < N; a++)
            for (int r = 0; r <= t; r++)
                for (int c = 0; c < N; c++) {
                    int i = a * T + t, j = c * T + r;
                    double g = 0;
                    for (int k = 0; k < D; k++)
                        g += x[i * D + k] * x[j * D + k];
                    double s = su2 * g / D + sb2;
                    if (t > 0 && r > 0 && (tied || t == r)) {
                        int ip = i - 1, jp = j - 1;
                        s += sw2 * erf_e2(S[ip * M + ip], S[jp * M + jp], S[ip * M + jp]);
                    }
                    S[i * M + j] = S[j * M + i] = s;
                }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < M; j++)
            Y[i * M + j] = sv2 * erf_e2(S[i * M + i], S[j * M + j], S[i * M + j]);
}

static double *gpkernel_rnn(const tu_env *e, const char *arch, const char *extra, size_t *count)
{
    char in[512], out[512], name[64], args[4096];
    double x[N * T * D];
    const size_t dims[3] = {N, T, D};
    sequences(x);
    tu_write_npy(tu_path(e, in, sizeof in, "seq.npy"), x, 3, dims);
    snprintf(name, sizeof name, "K-%s%s.h5", arch, extra[0] ? "-all" : "");
    tu_path(e, out, sizeof out, name);
    snprintf(args, sizeof args,
             "--arch=%s --phi=erf --sigma-w2=%g --sigma-u2=%g --sigma-b2=%g --sigma-v2=%g "
             "--input='%s' --output='%s' --quiet %s", arch, sw2, su2, sb2, sv2, in, out, extra);
    assert_int_equal(tu_run_tool(e, "gpkernel", args), 0);
    return tu_h5_read(out, "/kernel", count);
}

static void check_against_reference(const tu_env *e, const char *arch, int tied)
{
    enum { M = N * T };
    size_t cnt;
    double *K = gpkernel_rnn(e, arch, "--all-times", &cnt);
    assert_int_equal(cnt, M * M);
    static double R[M * M];
    double x[N * T * D];
    sequences(x);
    reference(x, tied, R);
    double scale = 0, worst = 0;
    for (int i = 0; i < M * M; i++)
        scale = fmax(scale, fabs(R[i]));
    for (int i = 0; i < M * M; i++)
        worst = fmax(worst, fabs(K[i] - R[i]) / scale);
    print_message("%s --all-times: max relative error %.2e\n", arch, worst);
    assert_true(worst < TOL_RNN);
    /* default output: the final time step of each sequence, i.e. entries (a·T + T−1, c·T + T−1) */
    double *Kl = gpkernel_rnn(e, arch, "", &cnt);
    assert_int_equal(cnt, N * N);
    for (int a = 0; a < N; a++)
        for (int c = 0; c < N; c++)
            assert_true(fabs(Kl[a * N + c] - R[(a * T + T - 1) * M + c * T + T - 1]) < TOL_RNN * scale);
    free(K);
    free(Kl);
}

static void test_rnn_matches_recursion(void **state)
{
    check_against_reference(*state, "rnn", 1);
}

/* Untied weights: no recurrent cross-time contributions (theory.md §1.8). The reference above
 * drops them; it also differs from the tied kernel, so the test can tell the two apart. */
static void test_untied_rnn(void **state)
{
    check_against_reference(*state, "rnn-untied", 0);
    enum { M = N * T };
    static double Rt[M * M], Ru[M * M];
    double x[N * T * D];
    sequences(x);
    reference(x, 1, Rt);
    reference(x, 0, Ru);
    double diff = 0;
    for (int i = 0; i < M * M; i++)
        diff = fmax(diff, fabs(Rt[i] - Ru[i]));
    assert_true(diff > 1e-3);
}

/* The executor converges to the limit like n^(-1/2) (theory.md §7.2). */
static void test_executor_rate(void **state)
{
    (void)state;
    enum { W = 5, S = 16 };
    static const double widths[W] = {256, 512, 1024, 2048, 4096};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_job_registry(&ctx);
    char prog[4200];
    tpk_shipped_path("programs/rnn.nsr", prog, sizeof prog);
    char tb[16];
    snprintf(tb, sizeof tb, "%d", T);
    tpk_param_set sets[] = {{"T", tb}, {"phi", "erf"}, {"sigma_w2", "1.3"}, {"sigma_u2", "0.8"},
                            {"sigma_b2", "0.1"}, {"sigma_v2", "1.1"}};
    tpk_netsor_opts o = {.sets = sets, .nsets = 6};
    tpk_program *p = tpk_netsor_load_file(prog, &o, reg, &ctx);
    if (!p)
        fail_msg("%s", ctx.msg);
    size_t dims[3] = {N, T, D};
    tpk_array *x = tpk_array_alloc(3, dims, &ctx);
    sequences(x->data);
    tpk_array *K = NULL;
    assert_int_equal(tpk_netsor_kernel(p, x, 1, &K, NULL, &ctx), TPK_OK);
    double rms[W];
    for (int w = 0; w < W; w++) {
        double e[S];
        for (int s = 0; s < S; s++) {
            tpk_array *Kh = NULL;
            if (tpk_netsor_run(p, x, (size_t)widths[w], 1000 + (uint64_t)s, 1, &Kh, NULL, &ctx))
                fail_msg("%s", ctx.msg);
            assert_int_equal(tpk_limits_frob_rel(Kh->data, K->data, tpk_array_size(K), &e[s], &ctx),
                             TPK_OK);
            tpk_array_free(Kh);
        }
        rms[w] = tpk_limits_rms(e, S);
    }
    double slope, icpt;
    assert_int_equal(tpk_limits_fit_power(widths, rms, W, &slope, &icpt, NULL, &ctx), TPK_OK);
    print_message("RNN executor: RMS relative error %.3g (n=256) .. %.3g (n=4096), slope %.3f\n",
                  rms[0], rms[W - 1], slope);
    assert_true(fabs(slope + 0.5) < SLOPE_TOL);
    tpk_array_free(K);
    tpk_array_free(x);
    tpk_program_free(p);
    tpk_phi_registry_free(reg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rnn_matches_recursion),
        cmocka_unit_test(test_untied_rnn),
        cmocka_unit_test(test_executor_rate),
    };
    return cmocka_run_group_tests_name("rnn", tests, setup, tu_teardown);
}
