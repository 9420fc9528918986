/* Transformer of Tensor Programs I (theory.md §2.7): gpkernel --arch=transformer (its direct
 * recursion, kernels/transformer.c, and with TPK_EVALUATOR=program the NETSOR+ program
 * programs/transformer.nsr run by the limit evaluator) against an independent matrix recursion
 * written here, the two evaluators against each other over a grid of shapes and settings, their
 * invariants and errors, and the finite-width executor's convergence. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tpk/job.h"
#include "tpk/limits.h"
#include "tpk/tpk.h"
#include "support/testutil.h"

enum { N = 3, T = 4, D = 3, M = N * T };
/* Both sides are closed forms (softmax of exact Moments, 2-D ReLU kernel, LN as a correlation);
 * what is left is the rounding of three layers of O(M) sums. */
#define TOL_REF 1e-12
/* Fitted RMS slope within this of −1/2 (issue 4). */
#define SLOPE_TOL 0.1
/* Mean over seeds within this many standard errors of the limit at the largest width. */
#define SE_TOL 3.0

/* Non-default settings throughout, so that a parameter mapped to the wrong place shows. */
static const int depth = 3;
static const double var_e = 1.3, var_u = 0.8, var_w = 1.7, var_b = 0.2, temp = 0.7, eps = 1e-12,
                    sv2 = 1.0;
static char tmpdir[256], bindir[1024];

/* The shared fixture; the file-scope copies keep the command lines below short. */
static int setup(void **state)
{
    int rc = tu_setup_tagged(state, "transformer");
    if (rc == 0) {
        const tu_env *e = *state;
        snprintf(tmpdir, sizeof tmpdir, "%s", e->tmpdir);
        snprintf(bindir, sizeof bindir, "%s", e->bindir);
    }
    return rc;
}

/* Deterministic "high-entropy" token sequences x[a][t][j]. */
static void sequences(double *x)
{
    for (int a = 0; a < N; a++)
        for (int t = 0; t < T; t++)
            for (int j = 0; j < D; j++)
                x[(a * T + t) * D + j] = sin(1.37 * a + 0.61 * t + 2.11 * j + 0.3) * (1.0 + 0.2 * a);
}

/* A .npy file written by hand (format v1), independent of the toolkit's reader. */
static void write_npy(const char *path, const double *x, int n, int t, int d)
{
    const size_t dims[3] = {(size_t)n, (size_t)t, (size_t)d};
    tu_write_npy(path, x, 3, dims);
}

/* E[relu(u) relu(v)] (Cho & Saul, theory.md §3.2), written out here. */
static double relu_e2(double q1, double q2, double k)
{
    double s = sqrt(q1 * q2);
    if (s == 0.0)
        return 0.0;
    double r = fmax(-1.0, fmin(1.0, k / s)), th = acos(r);
    return s / (2.0 * M_PI) * (sin(th) + (M_PI - th) * r);
}

/* LN in the limit (theory §2.6): zero-mean G-vars, so a correlation (with ε). */
static void layernorm(const double *S, double *out, int m, double e)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < m; j++)
            out[i * m + j] = S[i * m + j] / sqrt((S[i * m + i] + e) * (S[j * m + j] + e));
}

/* The §2.7 recursion over all tokens of all sequences (index a·T + t), GP4A transformer_theory.py
 * with a key projection per layer and ε in LN:
 *   Σ^z_0 = σ_e² X Xᵀ/d;  per layer Σ^k = σ_u² Σ^z;  A = softmax_row(mask(Σ^k/temp)) per sequence;
 *   R = (I + A) Σ^k (I + A)ᵀ (cross blocks (I+A₁)Σ₁₂(I+A₂)ᵀ);  K^h = LN(R);
 *   Q = σ_w² V_ReLU(σ_w² K^h + σ_b²) + σ_b² + K^h;  Σ^z = LN(Q).  Output σ_v² Σ^z. */
static void reference(const double *x, int L, double e, double *out)
{
    static double Z[M * M], S[M * M], B[M * M], BS[M * M], R[M * M], Kh[M * M], Q[M * M];
    for (int i = 0; i < M; i++)
        for (int j = 0; j < M; j++) {
            double g = 0;
            for (int k = 0; k < D; k++)
                g += x[i * D + k] * x[j * D + k];
            Z[i * M + j] = var_e * g / D;
        }
    for (int l = 0; l < L; l++) {
        for (int i = 0; i < M * M; i++)
            S[i] = var_u * Z[i];
        memset(B, 0, sizeof B);
        for (int a = 0; a < N; a++)
            for (int i = 0; i < T; i++) {
                int r = a * T + i;
                double mx = -INFINITY, z = 0;
                for (int j = 0; j <= i; j++)
                    mx = fmax(mx, S[r * M + a * T + j] / temp);
                for (int j = 0; j <= i; j++)
                    z += exp(S[r * M + a * T + j] / temp - mx);
                for (int j = 0; j <= i; j++)
                    B[r * M + a * T + j] = exp(S[r * M + a * T + j] / temp - mx) / z;
                B[r * M + r] += 1.0;
            }
        for (int i = 0; i < M; i++) /* BS = B S, R = BS Bᵀ */
            for (int j = 0; j < M; j++) {
                double s = 0;
                for (int k = 0; k < M; k++)
                    s += B[i * M + k] * S[k * M + j];
                BS[i * M + j] = s;
            }
        for (int i = 0; i < M; i++)
            for (int j = 0; j < M; j++) {
                double s = 0;
                for (int k = 0; k < M; k++)
                    s += BS[i * M + k] * B[j * M + k];
                R[i * M + j] = s;
            }
        layernorm(R, Kh, M, e);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < M; j++) {
                double q1 = var_w * Kh[i * M + i] + var_b, q2 = var_w * Kh[j * M + j] + var_b;
                double k = var_w * Kh[i * M + j] + var_b;
                Q[i * M + j] = var_w * relu_e2(q1, q2, k) + var_b + Kh[i * M + j];
            }
        layernorm(Q, Z, M, e);
    }
    for (int i = 0; i < M * M; i++)
        out[i] = sv2 * Z[i];
}

/* gpkernel --arch=transformer on x (n sequences), with extra flags; returns /kernel. */
static double *gpkernel(const double *x, int n, const char *tag, const char *extra, size_t *count)
{
    char in[512], out[512], cmd[4096];
    snprintf(in, sizeof in, "%s/%s.npy", tmpdir, tag);
    snprintf(out, sizeof out, "%s/K-%s.h5", tmpdir, tag);
    write_npy(in, x, n, T, D);
    snprintf(cmd, sizeof cmd,
             "'%s/gpkernel' --arch=transformer --depth=%d --var-e=%.17g --var-u=%.17g "
             "--var-w=%.17g --var-b=%.17g --temp=%.17g --input='%s' --output='%s' --quiet %s",
             bindir, depth, var_e, var_u, var_w, var_b, temp, in, out, extra);
    int rc = system(cmd);
    assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) == 0);
    return tu_h5_read(out, "/kernel", count);
}

/* The tests below run once with the default evaluator of --arch=transformer (the direct
 * recursion) and once with TPK_EVALUATOR=program (the NETSOR evaluator on the program). */
static int use_program(void **state)
{
    (void)state;
    return setenv("TPK_EVALUATOR", "program", 1);
}

static int use_default(void **state)
{
    (void)state;
    return unsetenv("TPK_EVALUATOR");
}

static void test_matches_recursion(void **state)
{
    (void)state;
    static double R[M * M];
    double x[M * D];
    size_t cnt;
    sequences(x);
    reference(x, depth, eps, R);
    double *K = gpkernel(x, N, "all", "--all-times", &cnt);
    assert_int_equal(cnt, M * M);
    double worst = 0;
    for (int i = 0; i < M * M; i++)
        worst = fmax(worst, fabs(K[i] - R[i]));
    print_message("transformer depth %d --all-times: max |K - reference| = %.2e\n", depth, worst);
    assert_true(worst < TOL_REF);
    /* the recursion really depends on the settings: a wrong temperature is far off */
    static double R2[M * M];
    reference(x, depth - 1, eps, R2);
    double diff = 0;
    for (int i = 0; i < M * M; i++)
        diff = fmax(diff, fabs(R2[i] - R[i]));
    assert_true(diff > 1e-3);
    /* default output: the last token of each sequence */
    double *Kl = gpkernel(x, N, "last", "", &cnt);
    assert_int_equal(cnt, N * N);
    for (int a = 0; a < N; a++)
        for (int c = 0; c < N; c++)
            assert_true(fabs(Kl[a * N + c] - R[(a * T + T - 1) * M + c * T + T - 1]) < TOL_REF);
    free(K);
    free(Kl);
}

/* Outputs are LN'd: with ε = 0 the kernel has unit diagonal to rounding (theory §2.6) and is
 * symmetric; a repeated sequence repeats its rows; with the default ε an all-zero sequence gives a
 * finite kernel (LN(0) = 0) rather than 0/0. */
static void test_invariants(void **state)
{
    (void)state;
    enum { P = (N + 2) * T };
    double x[(N + 2) * T * D];
    size_t cnt;
    sequences(x);
    memcpy(x + N * T * D, x + T * D, T * D * sizeof *x);          /* a copy of sequence 1 */
    double *K = gpkernel(x, N + 1, "inv", "--all-times --ln-eps=0", &cnt);
    enum { Q = (N + 1) * T };
    assert_int_equal(cnt, Q * Q);
    for (int i = 0; i < Q; i++)
        assert_true(fabs(K[i * Q + i] - 1.0) < 1e-14);
    for (int i = 0; i < Q; i++)
        for (int j = 0; j < Q; j++)
            assert_true(fabs(K[i * Q + j] - K[j * Q + i]) < 1e-15);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < Q; j++)
            assert_true(fabs(K[(N * T + t) * Q + j] - K[(T + t) * Q + j]) < 1e-14);
    free(K);
    memset(x + (N + 1) * T * D, 0, T * D * sizeof *x);            /* an all-zero sequence */
    double *K2 = gpkernel(x, N + 2, "inv-eps", "--all-times", &cnt);
    assert_int_equal(cnt, P * P);
    for (int i = 0; i < P * P; i++)
        assert_true(isfinite(K2[i]));
    /* the zero sequence's attention output is 0, its feed-forward output the bias path
     * W2 relu(b1) + b2, so LN still gives a unit diagonal, 1 − O(ε) */
    for (int i = 0; i < P; i++)
        assert_true(fabs(K2[i * P + i] - 1.0) < 1e-11);
    free(K2);
}

static tpk_program *load(int L, tpk_phi_registry *reg, tpk_ctx *ctx)
{
    char prog[4200], lb[16], b[6][32];
    tpk_shipped_path("programs/transformer.nsr", prog, sizeof prog);
    snprintf(lb, sizeof lb, "%d", L);
    snprintf(b[0], 32, "%.17g", var_e);
    snprintf(b[1], 32, "%.17g", var_u);
    snprintf(b[2], 32, "%.17g", var_w);
    snprintf(b[3], 32, "%.17g", var_b);
    snprintf(b[4], 32, "%.17g", temp);
    snprintf(b[5], 32, "%d", T);
    tpk_param_set sets[] = {{"L", lb}, {"var_e", b[0]}, {"var_u", b[1]}, {"var_w", b[2]},
                            {"var_b", b[3]}, {"temp", b[4]}, {"T", b[5]}};
    tpk_netsor_opts o = {.sets = sets, .nsets = 7};
    tpk_program *p = tpk_netsor_load_file(prog, &o, reg, ctx);
    if (!p)
        fail_msg("%s", ctx->msg);
    return p;
}

/* The executor on the same program converges like n^(-1/2) (theory.md §7.2), and at the largest
 * width the seed mean is within SE_TOL standard errors of the limit. */
static void test_executor(void **state)
{
    (void)state;
    enum { W = 5, S = 8 };
    static const double widths[W] = {128, 256, 512, 1024, 2048};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_job_registry(&ctx);
    tpk_program *p = load(1, reg, &ctx);
    size_t dims[3] = {N, T, D};
    tpk_array *x = tpk_array_alloc(3, dims, &ctx);
    sequences(x->data);
    tpk_array *K = NULL;
    assert_int_equal(tpk_netsor_kernel(p, x, 1, &K, NULL, &ctx), TPK_OK);
    static double R[M * M];
    reference(x->data, 1, eps, R);
    for (int i = 0; i < M * M; i++)
        assert_true(fabs(K->data[i] - R[i]) < TOL_REF);
    double rms[W], last[S][N * N];
    for (int w = 0; w < W; w++) {
        double e[S];
        for (int s = 0; s < S; s++) {
            tpk_array *Kh = NULL;
            if (tpk_netsor_run(p, x, (size_t)widths[w], 7000 + (uint64_t)s, 1, &Kh, NULL, &ctx))
                fail_msg("%s", ctx.msg);
            assert_int_equal(tpk_limits_frob_rel(Kh->data, K->data, tpk_array_size(K), &e[s], &ctx),
                             TPK_OK);
            if (w == W - 1)
                for (int a = 0; a < N; a++)
                    for (int c = 0; c < N; c++)
                        last[s][a * N + c] = Kh->data[(a * T + T - 1) * M + c * T + T - 1];
            tpk_array_free(Kh);
        }
        rms[w] = tpk_limits_rms(e, S);
    }
    double slope, icpt;
    assert_int_equal(tpk_limits_fit_power(widths, rms, W, &slope, &icpt, NULL, &ctx), TPK_OK);
    print_message("transformer executor: RMS relative error %.3g (n=128) .. %.3g (n=2048), slope %.3f "
                  "(%d seeds)\n", rms[0], rms[W - 1], slope, S);
    assert_true(fabs(slope + 0.5) < SLOPE_TOL);
    double zmax = 0;
    for (int a = 0; a < N; a++)
        for (int c = 0; c < N; c++) {
            double m = 0, v = 0, k = K->data[(a * T + T - 1) * M + c * T + T - 1];
            for (int s = 0; s < S; s++)
                m += last[s][a * N + c] / S;
            for (int s = 0; s < S; s++)
                v += (last[s][a * N + c] - m) * (last[s][a * N + c] - m) / (S - 1);
            if (a == c) { /* LN'd: the diagonal is 1 − O(ε) at every width */
                assert_true(fabs(m - k) < 1e-9 && v < 1e-18);
                continue;
            }
            double z = fabs(m - k) / sqrt(v / S);
            zmax = fmax(zmax, z);
        }
    print_message("transformer executor n=2048: largest |mean - limit| = %.2f SE\n", zmax);
    assert_true(zmax < SE_TOL);
    tpk_array_free(K);
    tpk_array_free(x);
    tpk_program_free(p);
    tpk_phi_registry_free(reg);
}

/* The program's evaluator on (L, T, settings) of the program: its kernel of x. */
/* programs/transformer.nsr at depth L, x's T, and v = var_e, var_u, var_w, var_b, temp, eps,
 * sigma_v2. */
static tpk_program *program_of(const tpk_array *x, int L, const double *v,
                               tpk_phi_registry *reg, tpk_ctx *ctx)
{
    char prog[4200], b[9][32];
    tpk_shipped_path("programs/transformer.nsr", prog, sizeof prog);
    snprintf(b[0], 32, "%d", L);
    snprintf(b[1], 32, "%zu", x->dims[1]);
    for (int i = 0; i < 7; i++)
        snprintf(b[2 + i], 32, "%.17g", v[i]);
    tpk_param_set sets[] = {{"L", b[0]},     {"T", b[1]},    {"var_e", b[2]}, {"var_u", b[3]},
                            {"var_w", b[4]}, {"var_b", b[5]}, {"temp", b[6]}, {"eps", b[7]},
                            {"sigma_v2", b[8]}};
    tpk_netsor_opts o = {.sets = sets, .nsets = 9};
    tpk_program *p = tpk_netsor_load_file(prog, &o, reg, ctx);
    if (!p)
        fail_msg("%s", ctx->msg);
    return p;
}

static tpk_array *evaluator_kernel(const tpk_array *x, int L, const double *v, int all,
                                   tpk_phi_registry *reg, tpk_ctx *ctx)
{
    tpk_program *p = program_of(x, L, v, reg, ctx);
    tpk_array *K = NULL;
    if (tpk_netsor_kernel(p, x, all, &K, NULL, ctx))
        fail_msg("%s", ctx->msg);
    tpk_program_free(p);
    return K;
}

/* tpk_transformer_kernel against the NETSOR evaluator on the program, two implementations of
 * theory §2.7 that share no code but the φ map: shapes with d < T (the rank-d first layer) and
 * d >= T (the block products from the start), one token, one sequence, sequences of unequal
 * scale, T beyond one block of the blocked products, every setting away from its default, both
 * readouts. */
static void test_direct_matches_evaluator(void **state)
{
    (void)state;
    static const struct {
        size_t n, t, d;
        int L;
        double v[7]; /* var_e, var_u, var_w, var_b, temp, eps, sigma_v2 */
    } cs[] = {
        {3, 5, 2, 2, {1.3, 0.8, 1.7, 0.2, 0.7, 1e-12, 1.0}},
        {2, 3, 7, 3, {0.6, 1.4, 0.9, 0.0, 2.5, 1e-3, 0.4}},
        {1, 1, 4, 1, {1.0, 1.0, 1.0, 0.5, 1.0, 0.0, 2.0}},
        {4, 6, 6, 2, {2.0, 0.3, 1.2, 0.1, 0.4, 1e-12, 1.0}},
        {2, 9, 3, 4, {1.0, 2.0, 2.0, 0.3, 1.5, 0.05, 0.7}},
        /* more tokens than one block of the blocked triangular products, not a multiple of it */
        {2, 300, 5, 2, {1.1, 0.9, 1.3, 0.1, 0.8, 1e-12, 1.0}},
        {1, 260, 300, 2, {0.7, 1.2, 1.0, 0.0, 1.2, 1e-6, 1.3}},
    };
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_job_registry(&ctx);
    tpk_phi *relu = tpk_phi_alloc(reg, "relu", &ctx);
    assert_non_null(relu);
    double worst = 0;
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        size_t dims[3] = {cs[c].n, cs[c].t, cs[c].d};
        tpk_array *x = tpk_array_alloc(3, dims, &ctx);
        for (size_t i = 0; i < tpk_array_size(x); i++) /* sequence a scaled by 1 + a/2 */
            x->data[i] = sin(0.37 * (double)i + 0.2 * (double)c) *
                         (1.0 + 0.5 * (double)(i / (cs[c].t * cs[c].d)));
        const double *v = cs[c].v;
        tpk_transformer_params tp = {.depth = cs[c].L, .phi = relu, .var_e = v[0], .var_u = v[1],
                                     .var_w = v[2], .var_b = v[3], .temp = v[4], .eps = v[5],
                                     .sigma_v2 = v[6]};
        for (int all = 0; all <= 1; all++) {
            tpk_array *Ke = evaluator_kernel(x, cs[c].L, v, all, reg, &ctx), *Kd = NULL;
            double err = -1;
            if (tpk_transformer_kernel(&tp, x, all, NULL, NULL, &Kd, &err, &ctx))
                fail_msg("%s", ctx.msg);
            size_t side = all ? cs[c].n * cs[c].t : cs[c].n;
            assert_int_equal(Kd->dims[0], side);
            assert_int_equal(Kd->dims[1], side);
            assert_int_equal(tpk_array_size(Ke), side * side);
            assert_true(err >= 0 && err < 1e-12);
            for (size_t i = 0; i < side * side; i++) {
                double scale = fmax(1.0, fabs(Ke->data[i]));
                worst = fmax(worst, fabs(Kd->data[i] - Ke->data[i]) / scale);
                assert_true(Kd->data[i] == Kd->data[(i % side) * side + i / side]);
            }
            tpk_array_free(Ke);
            tpk_array_free(Kd);
        }
        tpk_array_free(x);
    }
    print_message("transformer direct vs evaluator: largest difference %.2e\n", worst);
    assert_true(worst < 1e-13);
    tpk_phi_free(relu);
    tpk_phi_registry_free(reg);
}

/* The recursion's NTK (tpk_transformer_kernels) against the interpreter's member-level NTK of
 * the program (tpk_netsor_ntk_ex: its tangent pass over the unrolled form, which shares no code
 * with the recursion but the φ maps), in all three parameterisations, with d < T and d >= T,
 * both readouts; the NNGP beside it is the recursion's own to rounding (its feed-forward map
 * runs by segments there). */
static void test_direct_ntk(void **state)
{
    (void)state;
    static const struct {
        size_t n, t, d;
        int L;
        double v[7]; /* var_e, var_u, var_w, var_b, temp, eps, sigma_v2 */
    } cs[] = {
        {3, 4, 2, 2, {1.3, 0.8, 1.7, 0.2, 0.7, 1e-12, 1.0}},
        {2, 3, 5, 3, {0.6, 1.4, 0.9, 0.0, 2.5, 1e-3, 0.4}},
        {1, 1, 4, 1, {1.0, 1.0, 1.0, 0.5, 1.0, 0.0, 2.0}},
    };
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_job_registry(&ctx);
    tpk_phi *relu = tpk_phi_alloc(reg, "relu", &ctx);
    assert_non_null(relu);
    double worst = 0;
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        size_t dims[3] = {cs[c].n, cs[c].t, cs[c].d};
        tpk_array *x = tpk_array_alloc(3, dims, &ctx);
        for (size_t i = 0; i < tpk_array_size(x); i++)
            x->data[i] = cos(0.41 * (double)i + 0.3 * (double)c) *
                         (1.0 + 0.5 * (double)(i / (cs[c].t * cs[c].d)));
        const double *v = cs[c].v;
        tpk_program *p = program_of(x, cs[c].L, v, reg, &ctx);
        for (int param = 0; param < 3; param++)
            for (int all = 0; all <= 1; all++) {
                tpk_transformer_params tp = {.depth = cs[c].L, .phi = relu, .var_e = v[0],
                                             .var_u = v[1], .var_w = v[2], .var_b = v[3],
                                             .temp = v[4], .eps = v[5], .sigma_v2 = v[6],
                                             .ntk_param = param, .ntk_width = 6};
                tpk_ntk_opts no = {param, 6, NULL};
                tpk_array *Ke = NULL, *Te = NULL, *Kd = NULL, *Td = NULL, *K1 = NULL;
                if (tpk_netsor_ntk_ex(p, x, all, &no, &Ke, &Te, NULL, &ctx) ||
                    tpk_transformer_kernels(&tp, x, all, NULL, NULL, &Kd, &Td, NULL, &ctx) ||
                    tpk_transformer_kernel(&tp, x, all, NULL, NULL, &K1, NULL, &ctx))
                    fail_msg("%s", ctx.msg);
                const size_t side = Td->dims[0];
                assert_int_equal(tpk_array_size(Te), side * side);
                double scale = 0;
                for (size_t i = 0; i < side * side; i++)
                    scale = fmax(scale, fabs(Te->data[i]));
                for (size_t i = 0; i < side * side; i++) {
                    worst = fmax(worst, fabs(Td->data[i] - Te->data[i]) / scale);
                    assert_true(Td->data[i] == Td->data[(i % side) * side + i / side]);
                    assert_true(fabs(Kd->data[i] - K1->data[i]) <= 1e-14 * fabs(K1->data[i]));
                }
                tpk_array_free(Ke);
                tpk_array_free(Te);
                tpk_array_free(Kd);
                tpk_array_free(Td);
                tpk_array_free(K1);
            }
        tpk_program_free(p);
        tpk_array_free(x);
    }
    print_message("transformer NTK, recursion vs the interpreter's pass: largest difference "
                  "%.2e\n", worst);
    assert_true(worst < 1e-13);
    /* 'standard' needs the width */
    tpk_transformer_params bad = {.depth = 1, .phi = relu, .var_e = 1, .var_u = 1, .var_w = 1,
                                  .temp = 1, .sigma_v2 = 1, .ntk_param = TPK_NTK_PARAM_STANDARD};
    tpk_array *x = tpk_array_alloc(3, (size_t[3]){1, 2, 2}, &ctx), *K = NULL, *Th = NULL;
    for (size_t i = 0; i < 4; i++)
        x->data[i] = 0.3 * (double)i + 0.1;
    assert_int_equal(tpk_transformer_kernels(&bad, x, 1, NULL, NULL, &K, &Th, NULL, &ctx),
                     TPK_EINVAL);
    assert_non_null(strstr(ctx.msg, "ntk-width"));
    assert_null(K);
    assert_null(Th);
    tpk_array_free(x);
    tpk_phi_free(relu);
    tpk_phi_registry_free(reg);
}

/* Bad input: a clear status and message, nothing allocated. */
static void test_direct_errors(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_job_registry(&ctx);
    tpk_phi *relu = tpk_phi_alloc(reg, "relu", &ctx);
    size_t dims[3] = {2, 3, 2};
    tpk_array *x = tpk_array_alloc(3, dims, &ctx);
    for (size_t i = 0; i < tpk_array_size(x); i++)
        x->data[i] = 1.0 + (double)i;
    tpk_transformer_params ok = {.depth = 2, .phi = relu, .var_e = 1, .var_u = 1, .var_w = 1,
                                 .var_b = 0, .temp = 1, .eps = 1e-12, .sigma_v2 = 1};
    tpk_array *K = (tpk_array *)&ctx; /* set to NULL by every call */
    tpk_transformer_params p = ok;
    p.depth = 0;
    assert_int_equal(tpk_transformer_kernel(&p, x, 1, NULL, NULL, &K, NULL, &ctx), TPK_EINVAL);
    assert_null(K);
    assert_non_null(strstr(ctx.msg, "depth"));
    tpk_ctx_clear(&ctx);
    p = ok;
    p.temp = 0;
    assert_int_equal(tpk_transformer_kernel(&p, x, 1, NULL, NULL, &K, NULL, &ctx), TPK_EDOM);
    assert_non_null(strstr(ctx.msg, "temp"));
    tpk_ctx_clear(&ctx);
    p = ok;
    p.var_w = -1;
    assert_int_equal(tpk_transformer_kernel(&p, x, 1, NULL, NULL, &K, NULL, &ctx), TPK_EDOM);
    assert_non_null(strstr(ctx.msg, "var-w"));
    tpk_ctx_clear(&ctx);
    size_t d2[2] = {6, 2};
    tpk_array *flat = tpk_array_alloc(2, d2, &ctx);
    assert_int_equal(tpk_transformer_kernel(&ok, flat, 1, NULL, NULL, &K, NULL, &ctx), TPK_EINVAL);
    assert_non_null(strstr(ctx.msg, "N × T × d"));
    tpk_ctx_clear(&ctx);
    /* a sequence whose first token is zero, with eps = 0: LN of a zero vector, named */
    x->data[6] = x->data[7] = 0;
    p = ok;
    p.eps = 0;
    assert_int_equal(tpk_transformer_kernel(&p, x, 1, NULL, NULL, &K, NULL, &ctx), TPK_EDOM);
    assert_null(K);
    assert_non_null(strstr(ctx.msg, "token 1 of sequence 2"));
    tpk_ctx_clear(&ctx);
    /* the same with eps > 0 is finite (LN(0) = 0) */
    assert_int_equal(tpk_transformer_kernel(&ok, x, 1, NULL, NULL, &K, NULL, &ctx), TPK_OK);
    for (size_t i = 0; i < tpk_array_size(K); i++)
        assert_true(isfinite(K->data[i]));
    tpk_array_free(K);
    /* cancelled before the first layer: TPK_ECANCELED, no kernel */
    volatile sig_atomic_t stop = 1;
    tpk_progress pr = {.cancel = &stop};
    assert_int_equal(tpk_transformer_kernel(&ok, x, 1, NULL, &pr, &K, NULL, &ctx), TPK_ECANCELED);
    assert_null(K);
    tpk_ctx_clear(&ctx);
    tpk_array_free(flat);
    tpk_array_free(x);
    tpk_phi_free(relu);
    tpk_phi_registry_free(reg);
}

/* The file says which evaluator computed it. */
static void test_evaluator_attribute(void **state)
{
    (void)state;
    double x[M * D];
    sequences(x);
    char cmd[4096], in[512], out[512];
    snprintf(in, sizeof in, "%s/attr.npy", tmpdir);
    write_npy(in, x, N, T, D);
    for (int prog = 0; prog <= 1; prog++) {
        snprintf(out, sizeof out, "%s/attr-%d.h5", tmpdir, prog);
        snprintf(cmd, sizeof cmd, "%s'%s/gpkernel' --arch=transformer --input='%s' --output='%s' "
                 "--quiet", prog ? "TPK_EVALUATOR=program " : "", bindir, in, out);
        int rc = system(cmd);
        assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) == 0);
        assert_int_equal(tu_h5_has_attr(out, "evaluator"), !prog);
    }
    snprintf(cmd, sizeof cmd, "h5dump -a /evaluator '%s/attr-0.h5' | grep -q direct-recursion",
             tmpdir);
    int rc = system(cmd);
    assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_matches_recursion, use_default),
        cmocka_unit_test_setup(test_invariants, use_default),
        cmocka_unit_test_setup_teardown(test_matches_recursion, use_program, use_default),
        cmocka_unit_test_setup_teardown(test_invariants, use_program, use_default),
        cmocka_unit_test(test_direct_matches_evaluator),
        cmocka_unit_test(test_direct_errors),
        cmocka_unit_test(test_direct_ntk),
        cmocka_unit_test(test_evaluator_attribute),
        cmocka_unit_test(test_executor),
    };
    return cmocka_run_group_tests_name("transformer", tests, setup, tu_teardown);
}
