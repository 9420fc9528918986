/* CNN kernels (theory.md §2.8, §3.4): the direct recursion of kernels/cnn.c (gpkernel --arch=cnn1d
 * / cnn2d) against the NETSOR evaluator on programs/cnn{1,2}d.nsr and against a naive recursion
 * written here (4-D direct summation, no FFT), also with zero-variance positions; flatten = the locally connected twin; circular
 * translation equivariance; symmetric/PSD/no NaN for zero images; the executor's n^(-1/2) rate. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <lapacke.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tpk/job.h"
#include "tpk/cnn.h"
#include "tpk/limits.h"
#include "tpk/tpk.h"
#include "support/testutil.h"

/* Evaluator vs recursion: both closed-form ReLU maps, L layers of rounding (values O(1)). */
#define TOL_EVAL 1e-10
/* Naive recursion / direct / FFT: the same arithmetic up to summation order and FFT rounding. */
#define TOL_FFT 1e-12
/* Circular shifts permute the same sums exactly up to summation order. */
#define TOL_SHIFT 1e-12
/* Fitted RMS slope within this of −1/2 (issue 4). */
#define SLOPE_TOL 0.1
/* PSD: λ_min ≥ −PSD_TOL·λ_max (rounding of the maps). */
#define PSD_TOL 1e-12

static const double su2 = 1.1, sw2 = 1.7, sb2 = 0.13, sv2 = 0.9, sob2 = 0.05;
static char tmpdir[256], bindir[1024];
static tpk_phi_registry *reg;
static tpk_phi *relu;

static int setup(void **state)
{
    if (tu_setup_tagged(state, "cnn"))
        return -1;
    const tu_env *e = *state;
    snprintf(tmpdir, sizeof tmpdir, "%s", e->tmpdir);
    snprintf(bindir, sizeof bindir, "%s", e->bindir);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    reg = tpk_job_registry(&ctx);
    relu = reg ? tpk_phi_alloc(reg, "relu", &ctx) : NULL;
    return relu ? 0 : -1;
}

static int teardown(void **state)
{
    tpk_phi_free(relu);
    tpk_phi_registry_free(reg);
    return tu_teardown(state);
}

/* Deterministic "high-entropy" inputs x[a][position][channel]. */
static void inputs(double *x, size_t N, size_t Q, size_t C, double salt)
{
    for (size_t a = 0; a < N; a++)
        for (size_t p = 0; p < Q; p++)
            for (size_t c = 0; c < C; c++)
                x[(a * Q + p) * C + c] =
                    sin(1.37 * (double)a + 0.61 * (double)p + 2.11 * (double)c + salt) * (1.0 + 0.2 * (double)a);
}

static double relu_e2(double q1, double q2, double k)
{
    double s = sqrt(q1 * q2);
    if (s == 0)
        return 0;
    double rho = fmax(-1.0, fmin(1.0, k / s)), th = acos(rho);
    return s / (2 * M_PI) * (sin(th) + (M_PI - th) * cos(th));
}

/* ---- the naive recursion: (N·Q)² matrices, every tap summed in 4-D, no separability, no FFT -- */
typedef struct naive {
    size_t R, S, C;
    int kh, kw, L, circular;
} naive;

static long wrap(long i, long n, int circ)
{
    if (circ)
        return ((i % n) + n) % n;
    return i >= 0 && i < n ? i : -1;
}

/* out[(a,p),(c,p')] = α Σ_{i,j} in[(a, p+t), (c, p'+t)] + β, zero when either falls off */
static void naive_conv(const naive *nv, size_t N, double alpha, double beta, const double *in, double *out)
{
    const long R = (long)nv->R, S = (long)nv->S, Q = R * S, M = (long)N * Q;
    for (long a = 0; a < (long)N; a++)
        for (long c = 0; c < (long)N; c++)
            for (long r = 0; r < R; r++)
                for (long s = 0; s < S; s++)
                    for (long r2 = 0; r2 < R; r2++)
                        for (long s2 = 0; s2 < S; s2++) {
                            double acc = 0;
                            for (int i = 0; i < nv->kh; i++)
                                for (int j = 0; j < nv->kw; j++) {
                                    long di = i - (nv->kh - 1) / 2, dj = j - (nv->kw - 1) / 2;
                                    long ra = wrap(r + di, R, nv->circular), sa = wrap(s + dj, S, nv->circular);
                                    long rc = wrap(r2 + di, R, nv->circular), sc = wrap(s2 + dj, S, nv->circular);
                                    if (ra < 0 || sa < 0 || rc < 0 || sc < 0)
                                        continue;
                                    acc += in[(a * Q + ra * S + sa) * M + c * Q + rc * S + sc];
                                }
                            out[(a * Q + r * S + s) * M + c * Q + r2 * S + s2] = alpha * acc + beta;
                        }
}

/* σ_v² K^L + σ_ob² over (input, position) pairs, (N·Q)², with bias variance b2. */
static double *naive_kernel_b(const naive *nv, const double *x, size_t N, double b2)
{
    const size_t Q = nv->R * nv->S, M = N * Q;
    double *G = calloc(M * M, sizeof *G), *S = malloc(M * M * sizeof *S);
    for (size_t i = 0; i < M; i++)
        for (size_t j = 0; j < M; j++) {
            double g = 0;
            for (size_t c = 0; c < nv->C; c++)
                g += x[i * nv->C + c] * x[j * nv->C + c];
            G[i * M + j] = g / (double)nv->C;
        }
    const double taps = (double)nv->kh * nv->kw;
    naive_conv(nv, N, su2 / taps, b2, G, S);
    for (int l = 1; l <= nv->L; l++) {
        for (size_t i = 0; i < M; i++)
            for (size_t j = 0; j < M; j++)
                G[i * M + j] = relu_e2(S[i * M + i], S[j * M + j], S[i * M + j]);
        if (l < nv->L)
            naive_conv(nv, N, sw2 / taps, b2, G, S);
    }
    for (size_t i = 0; i < M * M; i++)
        G[i] = sv2 * G[i] + sob2;
    free(S);
    return G;
}

static double *naive_kernel(const naive *nv, const double *x, size_t N)
{
    return naive_kernel_b(nv, x, N, sb2);
}

/* Flatten / GAP readouts of a positions kernel. */
static void reduce(const double *Kp, size_t N, size_t Q, int gap, double *K)
{
    const size_t M = N * Q;
    for (size_t a = 0; a < N; a++)
        for (size_t c = 0; c < N; c++) {
            double s = 0;
            for (size_t p = 0; p < Q; p++)
                for (size_t q = 0; q < Q; q++)
                    if (gap || p == q)
                        s += Kp[(a * Q + p) * M + c * Q + q];
            K[a * N + c] = s / (double)(gap ? Q * Q : Q);
        }
}

static tpk_cnn_params params(size_t R, size_t S, size_t C, int kh, int kw, int L, int circular,
                             int readout, int conv)
{
    return (tpk_cnn_params){.rows = R, .cols = S, .channels = C, .kh = kh, .kw = kw, .depth = L,
                            .phi = relu, .sigma_u2 = su2, .sigma_w2 = sw2, .sigma_b2 = sb2,
                            .sigma_v2 = sv2, .sigma_ob2 = sob2,
                            .padding = circular ? TPK_CNN_CIRCULAR : TPK_CNN_ZERO,
                            .readout = readout, .conv = conv};
}

static tpk_array *cnn(const tpk_cnn_params *p, const double *x, size_t N)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    size_t Q = p->rows * p->cols, dims[3] = {N, Q, p->channels};
    tpk_array *X = tpk_array_alloc(3, dims, &ctx);
    memcpy(X->data, x, N * Q * p->channels * sizeof(double));
    size_t side = p->readout == TPK_CNN_POSITIONS ? N * Q : N;
    tpk_array *K = tpk_array_alloc2(side, side, &ctx);
    double err = -1;
    if (tpk_cnn_kernel(p, X, NULL, K, &err, &ctx))
        fail_msg("%s", ctx.msg);
    assert_true(err >= 0 && err < 1e-10);
    tpk_array_free(X);
    return K;
}

static double max_rel(const double *a, const double *b, size_t n)
{
    double scale = 0, worst = 0;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(b[i]));
    for (size_t i = 0; i < n; i++)
        worst = fmax(worst, fabs(a[i] - b[i]));
    return worst / scale;
}

/* ---- the NETSOR program on the same inputs ---------------------------------------------------- */

static tpk_program *load(const char *rel, const char *src, tpk_param_set *sets, int nsets)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_netsor_opts o = {.sets = sets, .nsets = nsets};
    tpk_program *p;
    if (src) {
        p = tpk_netsor_load_string(rel, src, &o, reg, &ctx);
    } else {
        char path[4200];
        tpk_shipped_path(rel, path, sizeof path);
        p = tpk_netsor_load_file(path, &o, reg, &ctx);
    }
    if (!p)
        fail_msg("%s", ctx.msg);
    return p;
}

/* The evaluator's all-outputs kernel of program p on x (N×Q×C). */
static tpk_array *evaluate(const tpk_program *p, const double *x, size_t N, size_t Q, size_t C)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    size_t dims[3] = {N, Q, C};
    tpk_array *X = tpk_array_alloc(3, dims, &ctx), *K = NULL;
    memcpy(X->data, x, N * Q * C * sizeof(double));
    double err;
    if (tpk_netsor_kernel(p, X, 1, &K, &err, &ctx))
        fail_msg("%s", ctx.msg);
    tpk_array_free(X);
    return K;
}

/* cnn1d.nsr / cnn2d.nsr settings matching params() */
static int program_sets(tpk_param_set *s, char b[][32], int twod, size_t R, size_t S, int kh, int kw,
                        int L, int circ)
{
    int n = 0;
    snprintf(b[0], 32, "%zu", R);
    snprintf(b[1], 32, "%zu", S);
    snprintf(b[2], 32, "%d", kh);
    snprintf(b[3], 32, "%d", kw);
    snprintf(b[4], 32, "%d", L);
    snprintf(b[5], 32, "%d", circ);
    if (twod) {
        s[n++] = (tpk_param_set){"rows", b[0]};
        s[n++] = (tpk_param_set){"cols", b[1]};
        s[n++] = (tpk_param_set){"kh", b[2]};
        s[n++] = (tpk_param_set){"kw", b[3]};
    } else {
        s[n++] = (tpk_param_set){"T", b[1]};
        s[n++] = (tpk_param_set){"k", b[3]};
    }
    s[n++] = (tpk_param_set){"L", b[4]};
    s[n++] = (tpk_param_set){"circular", b[5]};
    s[n++] = (tpk_param_set){"phi", "relu"};
    s[n++] = (tpk_param_set){"sigma_u2", "1.1"};
    s[n++] = (tpk_param_set){"sigma_w2", "1.7"};
    s[n++] = (tpk_param_set){"sigma_b2", "0.13"};
    s[n++] = (tpk_param_set){"sigma_v2", "0.9"};
    s[n++] = (tpk_param_set){"sigma_ob2", "0.05"};
    return n;
}

static void program_vs_recursion(int twod, size_t R, size_t S, size_t C, int kh, int kw, int L, int circ)
{
    enum { N = 3 };
    const size_t Q = R * S;
    double *x = malloc(N * Q * C * sizeof *x);
    inputs(x, N, Q, C, 0.3 + circ);
    tpk_param_set sets[16];
    char b[6][32];
    int ns = program_sets(sets, b, twod, R, S, kh, kw, L, circ);
    tpk_program *p = load(twod ? "programs/cnn2d.nsr" : "programs/cnn1d.nsr", NULL, sets, ns);
    tpk_array *Ke = evaluate(p, x, N, Q, C);
    tpk_cnn_params cp = params(R, S, C, kh, kw, L, circ, TPK_CNN_POSITIONS, TPK_CNN_CONV_AUTO);
    tpk_array *Kr = cnn(&cp, x, N);
    assert_int_equal(tpk_array_size(Ke), tpk_array_size(Kr));
    double e = max_rel(Kr->data, Ke->data, tpk_array_size(Ke));
    print_message("%s %zux%zu filter %dx%d %s: recursion vs NETSOR evaluator %.2e\n",
                  twod ? "cnn2d" : "cnn1d", R, S, kh, kw, circ ? "circular" : "zero", e);
    assert_true(e < TOL_EVAL);
    /* flatten and GAP of the recursion are the reductions of the evaluator's positions kernel */
    double Kred[N * N];
    for (int gap = 0; gap < 2; gap++) {
        tpk_cnn_params rp = params(R, S, C, kh, kw, L, circ, gap ? TPK_CNN_GAP : TPK_CNN_FLATTEN,
                                   TPK_CNN_CONV_AUTO);
        tpk_array *K = cnn(&rp, x, N);
        reduce(Ke->data, N, Q, gap, Kred);
        assert_true(max_rel(K->data, Kred, N * N) < TOL_EVAL);
        if (gap) { /* the pooled output (the CNN job's): pooled per input pair (ewpair.c) */
            tpk_ctx ctx;
            tpk_ctx_init(&ctx);
            tpk_netsor_opts o = {.sets = sets, .nsets = ns,
                                 .append = twod ? "output y_gap = readout(sum(r in 1..rows, s in "
                                                  "1..cols: h[L, r, s]) / (rows * cols), "
                                                  "sigma_v2, sigma_ob2)\n"
                                                : "output y_gap = readout(sum(p in 1..T: h[L, "
                                                  "p]) / T, sigma_v2, sigma_ob2)\n"};
            char path[4200];
            tpk_shipped_path(twod ? "programs/cnn2d.nsr" : "programs/cnn1d.nsr", path,
                             sizeof path);
            tpk_program *pp = tpk_netsor_load_file(path, &o, reg, &ctx);
            size_t dims[3] = {N, Q, C};
            tpk_array *X = tpk_array_alloc(3, dims, &ctx), *Kp = NULL;
            memcpy(X->data, x, N * Q * C * sizeof(double));
            for (int plan = TPK_PLAN_NAIVE; pp != NULL && plan <= TPK_PLAN_OPTIMAL; plan++) {
                if (tpk_netsor_kernel_plan(pp, X, 0, plan, NULL, &Kp, NULL, &ctx))
                    fail_msg("%s", ctx.msg);
                double ep = max_rel(Kp->data, K->data, N * N);
                print_message("  GAP output (%s plan) vs recursion %.6e\n",
                              plan == TPK_PLAN_NAIVE ? "naive" : "optimal", ep);
                assert_int_equal(tpk_array_size(Kp), N * N);
                assert_true(ep < TOL_EVAL);
                tpk_array_free(Kp);
                Kp = NULL;
            }
            if (pp == NULL)
                fail_msg("%s", ctx.msg);
            tpk_array_free(X);
            tpk_program_free(pp);
        }
        tpk_array_free(K);
    }
    tpk_array_free(Ke);
    tpk_array_free(Kr);
    tpk_program_free(p);
    free(x);
}

static void test_cnn1d_program(void **state)
{
    (void)state;
    program_vs_recursion(0, 1, 5, 2, 1, 3, 2, 1);
    program_vs_recursion(0, 1, 5, 2, 1, 3, 2, 0);
    program_vs_recursion(0, 1, 4, 1, 1, 2, 3, 0); /* even filter: centre offset 0 */
}

static void test_cnn2d_program(void **state)
{
    (void)state;
    program_vs_recursion(1, 3, 4, 2, 3, 2, 2, 1);
    program_vs_recursion(1, 3, 4, 2, 3, 2, 2, 0);
}

/* gpkernel --arch=cnn1d (the custom hook) equals the NETSOR evaluator, through the CLI. */
static void write_npy(const char *path, const double *x, size_t N, size_t P, size_t C)
{
    const size_t dims[3] = {N, P, C};
    tu_write_npy(path, x, 3, dims);
}

static void test_gpkernel_hook(void **state)
{
    (void)state;
    enum { N = 3, P = 5, C = 2 };
    double x[N * P * C];
    inputs(x, N, P, C, 0.7);
    char in[512], out[512], cmd[4096];
    snprintf(in, sizeof in, "%s/sig.npy", tmpdir);
    write_npy(in, x, N, P, C);
    tpk_param_set sets[16];
    char b[6][32];
    int ns = program_sets(sets, b, 0, 1, P, 1, 3, 2, 0);
    tpk_program *p = load("programs/cnn1d.nsr", NULL, sets, ns);
    tpk_array *Ke = evaluate(p, x, N, P, C);
    double Kred[N * N];
    static const char *const ro[2] = {"flatten", "gap"};
    for (int gap = 0; gap < 2; gap++) {
        snprintf(out, sizeof out, "%s/k-%s.h5", tmpdir, ro[gap]);
        snprintf(cmd, sizeof cmd,
                 "'%s/gpkernel' --arch=cnn1d --depth=2 --filter=3 --padding=zero --readout=%s "
                 "--sigma-u2=1.1 --sigma-w2=1.7 --sigma-b2=0.13 --sigma-v2=0.9 --set sigma_ob2=0.05 "
                 "--input='%s' --output='%s' --quiet", bindir, ro[gap], in, out);
        int rc = system(cmd);
        assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) == 0);
        size_t cnt;
        double *K = tu_h5_read(out, "/kernel", &cnt);
        assert_int_equal(cnt, N * N);
        reduce(Ke->data, N, P, gap, Kred);
        double e = max_rel(K, Kred, N * N);
        print_message("gpkernel --arch=cnn1d --readout=%s vs evaluator: %.2e\n", ro[gap], e);
        assert_true(e < TOL_EVAL);
        free(K);
    }
    /* --all-times: every position, the evaluator's layout */
    snprintf(out, sizeof out, "%s/k-all.h5", tmpdir);
    snprintf(cmd, sizeof cmd,
             "'%s/gpkernel' --arch=cnn1d --depth=2 --filter=3 --padding=zero --all-times "
             "--sigma-u2=1.1 --sigma-w2=1.7 --sigma-b2=0.13 --sigma-v2=0.9 --set sigma_ob2=0.05 "
             "--input='%s' --output='%s' --quiet", bindir, in, out);
    int rc = system(cmd);
    assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) == 0);
    size_t cnt;
    double *K = tu_h5_read(out, "/kernel", &cnt);
    assert_int_equal(cnt, tpk_array_size(Ke));
    assert_true(max_rel(K, Ke->data, cnt) < TOL_EVAL);
    free(K);
    /* errors of the job: bad padding, readout, filter, rank */
    static const char *const bad[] = {"--padding=reflect", "--readout=max", "--filter=0",
                                      "--filter=3,3", "--filter=9"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "'%s/gpkernel' --arch=cnn1d %s --input='%s' --output='%s/bad.h5' "
                 "--quiet 2>/dev/null", bindir, bad[i], in, tmpdir);
        rc = system(cmd);
        assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) == 1);
    }
    snprintf(cmd, sizeof cmd, "'%s/gpkernel' --arch=cnn2d --input='%s' --output='%s/bad.h5' --quiet "
             "2>/dev/null", bindir, in, tmpdir); /* N×P×C read as images of 5×2 pixels: filter 3 too big */
    rc = system(cmd);
    assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) == 1);
    tpk_array_free(Ke);
    tpk_program_free(p);
}

/* CNN without pooling = the locally connected network (theory §2.8, §3.4): a fresh A-var per
 * (position, tap), written here as a program. Flatten agrees; GAP does not (weight sharing
 * matters only off the position diagonal). */
static const char lcn_src[] =
    "param T = 5\nparam k = 3\nparam L = 2\nparam phi = relu\n"
    "param sigma_u2 = 1.1\nparam sigma_w2 = 1.7\nparam sigma_b2 = 0.13\n"
    "param sigma_v2 = 0.9\nparam sigma_ob2 = 0.05\n"
    "width n\ninput x[t in 1..T] : C\n"
    "A U[p in 1..T, j in 0..k-1] : (n, C) ~ sigma_u2 / k\n"
    "A F[l in 2..L, p in 1..T, j in 0..k-1] : (n, n) ~ sigma_w2 / k\n"
    "G b[l in 1..L] : n ~ N(0, sigma_b2)\n"
    "for p in 1..T {\n"
    "  g[1, p] = sum(j in 0..k-1, U[p, j] x[mod(p + j - 2, T) + 1]) + b[1]\n"
    "  h[1, p] = phi(g[1, p])\n"
    "}\n"
    "for l in 2..L {\n"
    "  for p in 1..T {\n"
    "    g[l, p] = sum(j in 0..k-1, F[l, p, j] h[l - 1, mod(p + j - 2, T) + 1]) + b[l]\n"
    "    h[l, p] = phi(g[l, p])\n"
    "  }\n"
    "}\n"
    "output y[p in 1..T] = readout(h[L, p], sigma_v2, sigma_ob2)\n";

static void test_flatten_equals_lcn(void **state)
{
    (void)state;
    enum { N = 3, P = 5, C = 2 };
    double x[N * P * C], Kl[N * N], Kg[N * N];
    inputs(x, N, P, C, 1.9);
    tpk_program *lcn = load("lcn.nsr", lcn_src, NULL, 0);
    tpk_array *Ke = evaluate(lcn, x, N, P, C);
    reduce(Ke->data, N, P, 0, Kl);
    reduce(Ke->data, N, P, 1, Kg);
    tpk_cnn_params fp = params(1, P, C, 1, 3, 2, 1, TPK_CNN_FLATTEN, TPK_CNN_CONV_AUTO);
    tpk_cnn_params gp = params(1, P, C, 1, 3, 2, 1, TPK_CNN_GAP, TPK_CNN_CONV_AUTO);
    tpk_array *Kf = cnn(&fp, x, N), *Kgap = cnn(&gp, x, N);
    double e = max_rel(Kf->data, Kl, N * N), d = max_rel(Kgap->data, Kg, N * N);
    print_message("flatten CNN vs LCN program %.2e; GAP CNN vs GAP LCN differ by %.2e\n", e, d);
    assert_true(e < TOL_EVAL);
    assert_true(d > 1e-2);
    /* the LCN's positions kernel is position-diagonal off the bias: (p ≠ p') entries are
     * σ_v² E[φφ] of independent-given-bias pre-activations, not the CNN's */
    tpk_array_free(Kf);
    tpk_array_free(Kgap);
    tpk_array_free(Ke);
    tpk_program_free(lcn);
}

/* Circular padding: shifting every input by (dr, ds) leaves GAP and flatten unchanged and
 * permutes the positions kernel (theory §3.4). Zero padding is not equivariant (checked too). */
static void shift(const double *x, double *y, size_t N, size_t R, size_t S, size_t C, long dr, long ds)
{
    for (size_t a = 0; a < N; a++)
        for (long r = 0; r < (long)R; r++)
            for (long s = 0; s < (long)S; s++)
                memcpy(y + ((a * R + (size_t)wrap(r + dr, (long)R, 1)) * S + (size_t)wrap(s + ds, (long)S, 1)) * C,
                       x + ((a * R + (size_t)r) * S + (size_t)s) * C, C * sizeof *y);
}

static void test_translation_equivariance(void **state)
{
    (void)state;
    enum { N = 3, R = 4, S = 5, C = 2, Q = R * S };
    double x[N * Q * C], y[N * Q * C];
    inputs(x, N, Q, C, 0.11);
    shift(x, y, N, R, S, C, 1, 3);
    for (int circ = 1; circ >= 0; circ--) {
        tpk_cnn_params pp = params(R, S, C, 3, 3, 3, circ, TPK_CNN_POSITIONS, TPK_CNN_CONV_AUTO);
        tpk_cnn_params gp = params(R, S, C, 3, 3, 3, circ, TPK_CNN_GAP, TPK_CNN_CONV_AUTO);
        tpk_array *Kx = cnn(&pp, x, N), *Ky = cnn(&pp, y, N);
        tpk_array *Gx = cnn(&gp, x, N), *Gy = cnn(&gp, y, N);
        double worst = 0;
        const size_t M = N * Q;
        for (size_t a = 0; a < N; a++)
            for (long r = 0; r < R; r++)
                for (long s = 0; s < S; s++)
                    for (size_t c = 0; c < N; c++)
                        for (long r2 = 0; r2 < R; r2++)
                            for (long s2 = 0; s2 < S; s2++) {
                                size_t i = a * Q + (size_t)(r * S + s), j = c * Q + (size_t)(r2 * S + s2);
                                size_t i2 = a * Q + (size_t)(wrap(r + 1, R, 1) * S + wrap(s + 3, S, 1));
                                size_t j2 = c * Q + (size_t)(wrap(r2 + 1, R, 1) * S + wrap(s2 + 3, S, 1));
                                worst = fmax(worst, fabs(Kx->data[i * M + j] - Ky->data[i2 * M + j2]));
                            }
        double g = max_rel(Gy->data, Gx->data, N * N);
        print_message("%s padding: shifted positions kernel differs by %.2e, GAP by %.2e\n",
                      circ ? "circular" : "zero", worst, g);
        if (circ) {
            assert_true(worst < TOL_SHIFT && g < TOL_SHIFT);
        } else {
            assert_true(g > 1e-3); /* the oracle can fail: zero padding sees the border */
        }
        tpk_array_free(Kx);
        tpk_array_free(Ky);
        tpk_array_free(Gx);
        tpk_array_free(Gy);
    }
}

/* The naive 4-D recursion (no FFT, no separability) vs the library's direct and FFT paths. */
static void test_naive_direct_fft(void **state)
{
    (void)state;
    enum { N = 3 };
    static const struct { size_t R, S, C; int kh, kw, L, circ; } cases[] = {
        {4, 5, 2, 3, 2, 3, 1}, {4, 5, 2, 3, 2, 3, 0}, {1, 9, 3, 1, 4, 2, 1}, {1, 9, 3, 1, 5, 2, 0},
        {5, 3, 1, 2, 3, 1, 0}};
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        naive nv = {cases[t].R, cases[t].S, cases[t].C, cases[t].kh, cases[t].kw, cases[t].L, cases[t].circ};
        size_t Q = nv.R * nv.S;
        double *x = malloc(N * Q * nv.C * sizeof *x);
        inputs(x, N, Q, nv.C, 0.5 + (double)t);
        double *Kn = naive_kernel(&nv, x, N);
        double Kred[N * N];
        for (int m = TPK_CNN_CONV_DIRECT; m <= TPK_CNN_CONV_FFT; m++) {
            tpk_cnn_params pp = params(nv.R, nv.S, nv.C, nv.kh, nv.kw, nv.L, nv.circular,
                                       TPK_CNN_POSITIONS, m);
            tpk_array *K = cnn(&pp, x, N);
            double e = max_rel(K->data, Kn, N * Q * N * Q);
            for (int gap = 0; gap < 2; gap++) {
                tpk_cnn_params rp = pp;
                rp.readout = gap ? TPK_CNN_GAP : TPK_CNN_FLATTEN;
                tpk_array *Kr = cnn(&rp, x, N);
                reduce(Kn, N, Q, gap, Kred);
                e = fmax(e, max_rel(Kr->data, Kred, N * N));
                tpk_array_free(Kr);
            }
            print_message("%zux%zu filter %dx%d %s, %s: vs naive recursion %.2e\n", nv.R, nv.S, nv.kh,
                          nv.kw, nv.circular ? "circular" : "zero", m == TPK_CNN_CONV_FFT ? "FFT" : "direct", e);
            assert_true(e < TOL_FFT);
            tpk_array_free(K);
        }
        free(Kn);
        free(x);
    }
    /* one block, random entries: direct and FFT tap sums agree */
    enum { R = 6, S = 7, Q = R * S };
    static double in[Q * Q], o1[Q * Q], o2[Q * Q];
    for (size_t i = 0; i < Q * Q; i++)
        in[i] = sin(0.37 * (double)i * (double)i + 0.1);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    for (int circ = 0; circ < 2; circ++) {
        int pad = circ ? TPK_CNN_CIRCULAR : TPK_CNN_ZERO;
        assert_int_equal(tpk_cnn_conv_block(R, S, 4, 5, pad, TPK_CNN_CONV_DIRECT, 0.3, 0.2, in, o1, &ctx), 0);
        assert_int_equal(tpk_cnn_conv_block(R, S, 4, 5, pad, TPK_CNN_CONV_FFT, 0.3, 0.2, in, o2, &ctx), 0);
        assert_true(max_rel(o2, o1, Q * Q) < TOL_FFT);
    }
    assert_int_equal(tpk_cnn_conv_block(R, S, 7, 1, TPK_CNN_ZERO, TPK_CNN_CONV_FFT, 1, 0, in, o1, &ctx),
                     TPK_EINVAL);
    assert_int_equal(tpk_cnn_conv_block(R, S, 1, 1, TPK_CNN_ZERO, TPK_CNN_CONV_FFT, 1, 0, in, in, &ctx),
                     TPK_EINVAL);
}

/* The direct path (kernels/cnn.c: plane-streaming layers, T-plane ring, first layer from
 * patches, zero-variance rows and columns compacted out of the map) with no bias, so that
 * positions whose receptive field is zero have variance 0: against the naive recursion (relu,
 * φ(0) = 0) and against the FFT block path, whose map fixes such entries up one by one
 * (erf_sigmoid, φ(0) = 1/2: the entries are φ(0)·E φ(v) ≠ 0). Grids where the filter fills
 * the grid (the ring's wrap slots), even filters, 1-D, depth 1. */
static void test_direct_zero_variance(void **state)
{
    (void)state;
    enum { N = 4 };
    static const struct { size_t R, S, C; int kh, kw, L; } cases[] = {
        {6, 7, 2, 3, 3, 3}, {4, 4, 1, 4, 4, 2}, {5, 6, 1, 2, 3, 2}, {3, 5, 1, 3, 1, 1}, {1, 9, 2, 1, 3, 2}};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi *sig = tpk_phi_alloc(reg, "erf_sigmoid", &ctx);
    assert_non_null(sig);
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        const size_t R = cases[t].R, S = cases[t].S, C = cases[t].C, Q = R * S, M = N * Q;
        double *x = malloc(N * Q * C * sizeof *x);
        inputs(x, N, Q, C, 0.7 + (double)t);
        for (size_t p = 0; p < Q; p++)
            for (size_t ch = 0; ch < C; ch++) {
                if (p < S || p % S == 0)                 /* image 0: top row and left column */
                    x[(0 * Q + p) * C + ch] = 0;
                x[(1 * Q + p) * C + ch] = 0;             /* image 1: all zero */
                if (2 * p >= Q)                          /* image 2: bottom half */
                    x[(2 * Q + p) * C + ch] = 0;
            }
        for (int circ = 0; circ < 2; circ++) {
            naive nv = {R, S, C, cases[t].kh, cases[t].kw, cases[t].L, circ};
            double *Kn = naive_kernel_b(&nv, x, N, 0.0), Kred[N * N];
            double worst = 0, worst_fft = 0;
            for (int ro = TPK_CNN_GAP; ro <= TPK_CNN_POSITIONS; ro++)
                for (int ph = 0; ph < 2; ph++) {
                    tpk_cnn_params d = params(R, S, C, cases[t].kh, cases[t].kw, cases[t].L, circ,
                                              ro, TPK_CNN_CONV_DIRECT);
                    d.sigma_b2 = 0;
                    d.phi = ph ? sig : relu;
                    tpk_cnn_params f = d;
                    f.conv = TPK_CNN_CONV_FFT;
                    tpk_array *Kd = cnn(&d, x, N), *Kf = cnn(&f, x, N);
                    const size_t n = Kd->dims[0];
                    worst_fft = fmax(worst_fft, max_rel(Kd->data, Kf->data, n * n));
                    if (ph == 0) {
                        const double *ref = Kn;
                        if (ro == TPK_CNN_GAP) {
                            reduce(Kn, N, Q, 1, Kred);
                            ref = Kred;
                        }
                        worst = fmax(worst, max_rel(Kd->data, ref, n * n));
                        /* the zero image: σ_v²·0 + σ_ob² (its variance is 0 at every layer) */
                        for (size_t j = 0; j < (ro == TPK_CNN_GAP ? N : M); j++)
                            assert_true(fabs(Kd->data[(ro == TPK_CNN_GAP ? 1 : Q) * n + j] - sob2) < 1e-15);
                    } else {
                        /* erf_sigmoid: the zero image's entries are (1/2)·E φ(v) > 0 */
                        assert_true(Kd->data[(ro == TPK_CNN_GAP ? 1 : Q) * n + 0] > sob2 + 0.1);
                    }
                    tpk_array_free(Kd);
                    tpk_array_free(Kf);
                }
            print_message("%zux%zu filter %dx%d depth %d %s, zero biases: direct vs naive %.2e, "
                          "vs FFT block path %.2e\n", R, S, cases[t].kh, cases[t].kw, cases[t].L,
                          circ ? "circular" : "zero", worst, worst_fft);
            assert_true(worst < TOL_FFT);
            assert_true(worst_fft < TOL_FFT);
            free(Kn);
        }
        free(x);
    }
    tpk_phi_free(sig);
}

/* Symmetric, PSD, finite — also with a zero image and a repeated image in the batch. */
static double min_eig_ratio(const double *K, size_t n)
{
    double *A = malloc(n * n * sizeof *A), *w = malloc(n * sizeof *w);
    memcpy(A, K, n * n * sizeof *A);
    assert_int_equal(LAPACKE_dsyev(LAPACK_ROW_MAJOR, 'N', 'L', (int)n, A, (int)n, w), 0);
    double r = w[0] / fmax(w[n - 1], 1e-300);
    free(A);
    free(w);
    return r;
}

static void test_psd_zero_images(void **state)
{
    (void)state;
    enum { N = 4, R = 4, S = 4, C = 1, Q = R * S };
    double x[N * Q * C];
    inputs(x, N, Q, C, 2.3);
    memset(x + 1 * Q * C, 0, Q * C * sizeof *x);     /* a zero image */
    memcpy(x + 3 * Q * C, x, Q * C * sizeof *x);      /* a repeated image */
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi *erfp = tpk_phi_alloc(reg, "erf", &ctx);
    for (int ph = 0; ph < 2; ph++)
        for (int ro = TPK_CNN_FLATTEN; ro <= TPK_CNN_POSITIONS; ro++)
            for (int circ = 0; circ < 2; circ++) {
                tpk_cnn_params p = params(R, S, C, 3, 3, 3, circ, ro, TPK_CNN_CONV_AUTO);
                p.phi = ph ? erfp : relu;
                tpk_array *K = cnn(&p, x, N);
                size_t n = K->dims[0];
                for (size_t i = 0; i < n; i++)
                    for (size_t j = 0; j < n; j++) {
                        assert_true(isfinite(K->data[i * n + j]));
                        assert_true(K->data[i * n + j] == K->data[j * n + i]);
                    }
                assert_true(min_eig_ratio(K->data, n) > -PSD_TOL);
                if (ro != TPK_CNN_POSITIONS) /* the repeated image has the same row */
                    for (size_t j = 0; j < n; j++)
                        assert_true(fabs(K->data[0 * n + j] - K->data[3 * n + j]) < 1e-14);
                tpk_array_free(K);
            }
    tpk_phi_free(erfp);
}

/* The one-layer API the evaluator's pair programs chain (tpk_cnn_layer_apply, _first): a map and
 * its taps over an input pair's block against the definitions (relu_e2 entry by entry, then
 * naive_conv's 4-D tap sum), on the direct path (3×3 on 5×6, 3×2 zero-padded on 4×4, positions
 * of zero variance) and the FFT path (15×15 circular on 16×16); the first layer from the inputs'
 * patches, made as a block and held for the next layer's map; errors. */
static void test_layer_api(void **state)
{
    (void)state;
    static const struct {
        size_t R, S;
        int kh, kw, circ, zeros;
    } g[] = {{5, 6, 3, 3, 1, 0}, {4, 4, 3, 2, 0, 1}, {16, 16, 15, 15, 1, 0}};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    for (size_t k = 0; k < sizeof g / sizeof g[0]; k++) {
        const size_t Q = g[k].R * g[k].S, C = 2;
        const naive nv = {g[k].R, g[k].S, C, g[k].kh, g[k].kw, 1, g[k].circ};
        /* two inputs' positions as vectors: the pair's block and the two diagonals */
        double *xa = malloc(Q * C * sizeof *xa), *xc = malloc(Q * C * sizeof *xc);
        inputs(xa, 1, Q, C, 0.4 + (double)k);
        inputs(xc, 1, Q, C, 1.9 + (double)k);
        for (size_t p = 0; g[k].zeros && p < Q; p += 3) /* every third position of a: zero */
            for (size_t c = 0; c < C; c++)
                xa[p * C + c] = 0.0;
        double *in = malloc(Q * Q * sizeof *in), *M = malloc(Q * Q * sizeof *M);
        double *ref = malloc(Q * Q * sizeof *ref), *out = malloc(Q * Q * sizeof *out);
        double *qa = malloc(Q * sizeof *qa), *qc = malloc(Q * sizeof *qc);
        for (size_t p = 0; p < Q; p++) {
            qa[p] = qc[p] = 0;
            for (size_t c = 0; c < C; c++) {
                qa[p] += xa[p * C + c] * xa[p * C + c] / (double)C;
                qc[p] += xc[p * C + c] * xc[p * C + c] / (double)C;
            }
            for (size_t q = 0; q < Q; q++) {
                double v = 0;
                for (size_t c = 0; c < C; c++)
                    v += xa[p * C + c] * xc[q * C + c] / (double)C;
                in[p * Q + q] = v;
            }
        }
        for (size_t p = 0; p < Q; p++)
            for (size_t q = 0; q < Q; q++)
                M[p * Q + q] = relu_e2(qa[p], qc[q], in[p * Q + q]);
        naive_conv(&nv, 1, 0.7, 0.05, M, ref);
        tpk_cnn_layerws *w = tpk_cnn_layerws_alloc(g[k].R, g[k].S, g[k].kh, g[k].kw,
                                                   g[k].circ ? TPK_CNN_CIRCULAR : TPK_CNN_ZERO, C,
                                                   &ctx);
        assert_non_null(w);
        double err = -1;
        assert_int_equal(tpk_cnn_layer_apply(w, relu, qa, qc, 0.7, 0.05, in, out, NULL, &err,
                                             &ctx), TPK_OK);
        assert_true(err >= 0 && err < 1e-12);
        double e = max_rel(out, ref, Q * Q);
        print_message("layer %zux%zu, filter %dx%d %s%s: apply vs definition %.2e\n", g[k].R,
                      g[k].S, g[k].kh, g[k].kw, g[k].circ ? "circular" : "zero",
                      g[k].zeros ? ", zero-variance positions" : "", e);
        assert_true(e < 1e-12);
        /* the first layer: the taps of the pair's Gram, as a block ... */
        naive_conv(&nv, 1, 0.9, 0.1, in, ref);
        assert_int_equal(tpk_cnn_layer_first(w, xa, xc, C, 0.9, 0.1, out, &ctx), TPK_OK);
        assert_true(max_rel(out, ref, Q * Q) < 1e-13);
        /* ... and held for the next layer, which makes it plane by plane as it maps it */
        double *q1a = malloc(Q * sizeof *q1a), *q1c = malloc(Q * sizeof *q1c);
        double *ref2 = malloc(Q * Q * sizeof *ref2);
        for (size_t p = 0; p < Q; p++) { /* the first layer's diagonals: its own with a = c */
            double sa = 0, sc = 0;
            for (int i = 0; i < g[k].kh; i++)
                for (int j = 0; j < g[k].kw; j++) {
                    long r = wrap((long)(p / g[k].S) + i - (g[k].kh - 1) / 2, (long)g[k].R,
                                  g[k].circ),
                         c = wrap((long)(p % g[k].S) + j - (g[k].kw - 1) / 2, (long)g[k].S,
                                  g[k].circ);
                    if (r >= 0 && c >= 0) {
                        sa += qa[(size_t)r * g[k].S + (size_t)c];
                        sc += qc[(size_t)r * g[k].S + (size_t)c];
                    }
                }
            q1a[p] = 0.9 * sa + 0.1;
            q1c[p] = 0.9 * sc + 0.1;
        }
        for (size_t p = 0; p < Q; p++)
            for (size_t q = 0; q < Q; q++)
                M[p * Q + q] = relu_e2(q1a[p], q1c[q], ref[p * Q + q]);
        naive_conv(&nv, 1, 0.7, 0.0, M, ref2);
        assert_int_equal(tpk_cnn_layer_first(w, xa, xc, C, 0.9, 0.1, NULL, &ctx), TPK_OK);
        assert_int_equal(tpk_cnn_layer_apply(w, relu, q1a, q1c, 0.7, 0.0, NULL, out, NULL, &err,
                                             &ctx), TPK_OK);
        assert_true(max_rel(out, ref2, Q * Q) < 1e-12);
        /* nothing held now: a block is required; more channels than the workspace's */
        assert_int_equal(tpk_cnn_layer_apply(w, relu, q1a, q1c, 0.7, 0.0, NULL, out, NULL, &err,
                                             &ctx), TPK_EINVAL);
        assert_non_null(strstr(ctx.msg, "no first layer held"));
        tpk_ctx_clear(&ctx);
        assert_int_equal(tpk_cnn_layer_first(w, xa, xc, C + 1, 0.9, 0.1, out, &ctx), TPK_EINVAL);
        assert_non_null(strstr(ctx.msg, "3 channels, the workspace has 2"));
        tpk_ctx_clear(&ctx);
        tpk_cnn_layerws_free(w);
        free(xa), free(xc), free(in), free(M), free(ref), free(out), free(qa), free(qc);
        free(q1a), free(q1c), free(ref2);
    }
    tpk_ctx_clear(&ctx); /* the first error stands otherwise */
    assert_null(tpk_cnn_layerws_alloc(3, 3, 4, 1, TPK_CNN_CIRCULAR, 1, &ctx));
    assert_non_null(strstr(ctx.msg, "does not fit"));
    tpk_cnn_layerws_free(NULL);
}

/* Parameter and front-end errors. */
static void test_errors(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    size_t dims[3] = {2, 6, 1};
    tpk_array *X = tpk_array_alloc(3, dims, &ctx), *K = tpk_array_alloc2(2, 2, &ctx);
    memset(X->data, 0, 12 * sizeof(double));
    tpk_cnn_params good = params(1, 6, 1, 1, 3, 2, 1, TPK_CNN_GAP, TPK_CNN_CONV_AUTO), p;
    assert_int_equal(tpk_cnn_kernel(&good, X, NULL, K, NULL, &ctx), TPK_OK);
    p = good; p.kw = 7;
    assert_int_equal(tpk_cnn_kernel(&p, X, NULL, K, NULL, &ctx), TPK_EINVAL);
    p = good; p.depth = 0;
    assert_int_equal(tpk_cnn_kernel(&p, X, NULL, K, NULL, &ctx), TPK_EINVAL);
    p = good; p.sigma_w2 = -1;
    assert_int_equal(tpk_cnn_kernel(&p, X, NULL, K, NULL, &ctx), TPK_EDOM);
    p = good; p.phi = NULL;
    assert_int_equal(tpk_cnn_kernel(&p, X, NULL, K, NULL, &ctx), TPK_EINVAL);
    p = good; p.channels = 2;
    assert_int_equal(tpk_cnn_kernel(&p, X, NULL, K, NULL, &ctx), TPK_EINVAL);
    p = good; p.readout = TPK_CNN_POSITIONS; /* K must be 12×12 */
    assert_int_equal(tpk_cnn_kernel(&p, X, NULL, K, NULL, &ctx), TPK_EINVAL);
    p = good; p.padding = 7;
    assert_int_equal(tpk_cnn_kernel(&p, X, NULL, K, NULL, &ctx), TPK_EINVAL);
    p = good; p.conv = 9;
    assert_int_equal(tpk_cnn_kernel(&p, X, NULL, K, NULL, &ctx), TPK_EINVAL);
    p = good; p.sigma_w2 = 1e300; p.depth = 40; p.phi = tpk_phi_alloc(reg, "exp", &ctx);
    if (p.phi) { /* exp kernels overflow: a numeric error, not inf in the output */
        int st = tpk_cnn_kernel(&p, X, NULL, K, NULL, &ctx);
        assert_true(st == TPK_ENUMERIC || st == TPK_EDOM);
        tpk_phi_free((tpk_phi *)p.phi);
    }
    tpk_array_free(X);
    tpk_array_free(K);
    /* front end: sum and mod */
    static const struct { const char *src, *msg; } bad[] = {
        {"width n\ninput x : d\nA U : (n, d) ~ 1\nparam k = mod(3, 0)\ng = U x\noutput y = readout(g, 1)\n",
         "mod(a, b) needs b >= 1"},
        {"width n\ninput x : d\nA U : (n, d) ~ 1\nfor j in 1..2 {\n g[j] = sum(j in 1..2, U x)\n}\n"
         "output y = readout(g[1], 1)\n", "shadows the loop variable"},
        {"width n\ninput x : d\nA U : (n, d) ~ 1\ng = sum(j in 1..2 U x)\noutput y = readout(g, 1)\n",
         "(or ',') after the range"},
        {"width n\ninput x : d\nA U : (n, d) ~ 1\ng = U x + mod(1)\noutput y = readout(g, 1)\n",
         "mod takes two integers"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tpk_ctx_init(&ctx);
        tpk_netsor_opts o = {0};
        assert_null(tpk_netsor_load_string("bad.nsr", bad[i].src, &o, reg, &ctx));
        if (!strstr(ctx.msg, bad[i].msg))
            fail_msg("expected '%s' in: %s", bad[i].msg, ctx.msg);
    }
    /* an empty sum is 0; mod is floored */
    tpk_netsor_opts o = {0};
    tpk_program *pr = tpk_netsor_load_string(
        "ok.nsr", "width n\ninput x[t in 1..3] : d\nA U : (n, d) ~ 1\n"
                  "g = U x[mod(-1, 3) + 1] + sum(j in 1..0, U x[j])\noutput y = readout(g, 1)\n",
        &o, reg, &ctx);
    if (!pr)
        fail_msg("%s", ctx.msg);
    assert_int_equal(pr->ninstr, 2);               /* the EMBED and a one-term LinComb */
    assert_int_equal(pr->instr[0].op, TPK_OP_EMBED);
    assert_int_equal(pr->instr[0].src, 2);         /* mod(-1, 3) + 1 = 3: x[3] is slot 2 */
    assert_int_equal(pr->instr[1].nterms, 1);      /* the empty sum left no term */
    tpk_program_free(pr);
}

/* The executor on cnn1d.nsr converges to the limit like n^(-1/2) (theory §7.2); at the largest
 * width the seed-mean GAP kernel is within 3 standard errors of the limit. */
static void test_executor_rate(void **state)
{
    (void)state;
    enum { W = 5, SEEDS = 64, N = 2, P = 4, C = 2 };
    static const double widths[W] = {128, 256, 512, 1024, 2048};
    /* Seeds per width: the error's spread is wide at small n (64 seeds there are cheap: a run
     * costs ~n²); 16 at n = 2048 for the standard-error check. */
    static const int seeds[W] = {64, 64, 64, 32, 16};
    double x[N * P * C];
    inputs(x, N, P, C, 0.9);
    tpk_param_set sets[16];
    char b[6][32];
    int ns = program_sets(sets, b, 0, 1, P, 1, 3, 2, 1);
    tpk_program *p = load("programs/cnn1d.nsr", NULL, sets, ns);
    tpk_array *K = evaluate(p, x, N, P, C);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    size_t dims[3] = {N, P, C};
    tpk_array *X = tpk_array_alloc(3, dims, &ctx);
    memcpy(X->data, x, sizeof x);
    double rms[W], gap[SEEDS][N * N], Kg[N * N];
    reduce(K->data, N, P, 1, Kg);
    for (int w = 0; w < W; w++) {
        double e[SEEDS];
        for (int s = 0; s < seeds[w]; s++) {
            tpk_array *Kh = NULL;
            if (tpk_netsor_run(p, X, (size_t)widths[w], 4000 + (uint64_t)s, 1, &Kh, NULL, &ctx))
                fail_msg("%s", ctx.msg);
            assert_int_equal(tpk_limits_frob_rel(Kh->data, K->data, tpk_array_size(K), &e[s], &ctx), 0);
            if (w == W - 1)
                reduce(Kh->data, N, P, 1, gap[s]);
            tpk_array_free(Kh);
        }
        rms[w] = tpk_limits_rms(e, (size_t)seeds[w]);
    }
    const int SL = seeds[W - 1];
    double slope, icpt;
    assert_int_equal(tpk_limits_fit_power(widths, rms, W, &slope, &icpt, NULL, &ctx), 0);
    double worst_z = 0;
    for (int i = 0; i < N * N; i++) {
        double m = 0, v = 0;
        for (int s = 0; s < SL; s++)
            m += gap[s][i] / SL;
        for (int s = 0; s < SL; s++)
            v += (gap[s][i] - m) * (gap[s][i] - m) / (SL - 1);
        worst_z = fmax(worst_z, fabs(m - Kg[i]) / sqrt(v / SL));
    }
    print_message("CNN-1D executor (64..16 seeds): RMS relative error %.3g (n=128) .. %.3g (n=2048), "
                  "slope %.3f; GAP seed mean at n=2048 (%d seeds) within %.2f SE\n", rms[0],
                  rms[W - 1], slope, SL, worst_z);
    assert_true(fabs(slope + 0.5) < SLOPE_TOL);
    assert_true(worst_z < 3.0);
    tpk_array_free(X);
    tpk_array_free(K);
    tpk_program_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cnn1d_program),
        cmocka_unit_test(test_cnn2d_program),
        cmocka_unit_test(test_gpkernel_hook),
        cmocka_unit_test(test_flatten_equals_lcn),
        cmocka_unit_test(test_translation_equivariance),
        cmocka_unit_test(test_naive_direct_fft),
        cmocka_unit_test(test_direct_zero_variance),
        cmocka_unit_test(test_psd_zero_images),
        cmocka_unit_test(test_layer_api),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_executor_rate),
    };
    return cmocka_run_group_tests_name("cnn", tests, setup, teardown);
}
