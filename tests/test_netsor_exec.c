/* Finite-width executor (tpk_netsor_run), Philox streams and tpk_dgemm: known answers, exact
 * one-hidden-layer statistics (theory §3.4), convergence to the limit kernel (§7.2) and
 * thread-count independence. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpk/matmul.h"
#include "tpk/rng.h"
#include "tpk/tpk.h"
#include "support/testutil.h"
#include "../netsor/backend-impl.h"

/* Monte Carlo comparisons: this many standard errors. */
#define N_SE 4.0

static const double PI = 3.14159265358979323846;

static uint64_t sm_next(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}
static double sm_normal(uint64_t *s)
{
    double u1 = ((double)(sm_next(s) >> 11) + 0.5) * 0x1.0p-53;
    double u2 = ((double)(sm_next(s) >> 11) + 0.5) * 0x1.0p-53;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * PI * u2);
}

static tpk_array *random_inputs(size_t N, size_t T, size_t d, uint64_t seed)
{
    size_t dims[3] = {N, T, d};
    tpk_array *x = T == 1 ? tpk_array_alloc2(N, d, NULL) : tpk_array_alloc(3, dims, NULL);
    assert_non_null(x);
    for (size_t i = 0; i < N * T * d; i++)
        x->data[i] = 1.3 * sm_normal(&seed) + 0.2;
    return x;
}

static double dot(const double *a, const double *b, size_t d)
{
    double s = 0.0;
    for (size_t i = 0; i < d; i++)
        s += a[i] * b[i];
    return s;
}

static tpk_rpn_node G(int v)
{
    return (tpk_rpn_node){TPK_RPN_GVAR, v, 0.0, NULL};
}
static tpk_rpn_node S(int v)
{
    return (tpk_rpn_node){TPK_RPN_SCALAR, v, 0.0, NULL};
}
static tpk_rpn_node CALL(const tpk_phi *f)
{
    return (tpk_rpn_node){TPK_RPN_CALL, -1, 0.0, f};
}
static tpk_rpn_node OP(int op)
{
    return (tpk_rpn_node){op, -1, 0.0, NULL};
}
static int phi_of(tpk_program *p, const tpk_phi *f, int g, const char *name)
{
    tpk_rpn_node b[2] = {G(g), CALL(f)};
    return tpk_nsr_nonlin(p, name, b, 2);
}
static int add2(tpk_program *p, const char *name, int a, int b)
{
    int t[2] = {a, b};
    double c[2] = {1.0, 1.0};
    return tpk_nsr_lincomb(p, name, 2, t, c);
}

/* depth-L MLP; sb2 < 0: no biases */
static tpk_program *build_mlp(const tpk_phi *f, int L, double sw2, double sb2, double sv2)
{
    tpk_program *p = tpk_nsr_prog_new(1);
    int U = tpk_nsr_add_embed(p, "U", sw2);
    int g = tpk_nsr_embed(p, "Ux", U, 0);
    if (sb2 >= 0)
        g = add2(p, "g1", g, tpk_nsr_bias(p, "b1", 0.0, sb2));
    int h = -1;
    for (int l = 1; l <= L; l++) {
        h = phi_of(p, f, g, "h");
        if (l < L) {
            int W = tpk_nsr_add_avar(p, "W", sw2);
            g = tpk_nsr_matmul(p, "Wh", W, h);
            if (sb2 >= 0)
                g = add2(p, "g", g, tpk_nsr_bias(p, "b", 0.0, sb2));
        }
    }
    tpk_nsr_output(p, "y", h, sv2);
    return p;
}

static tpk_program *build_rnn(const tpk_phi *f, int T)
{
    tpk_program *p = tpk_nsr_prog_new(T);
    int U = tpk_nsr_add_embed(p, "U", 0.9);
    int W = tpk_nsr_add_avar(p, "W", 1.4);
    int b = tpk_nsr_bias(p, "b", 0.1, 0.2);
    int s = -1;
    for (int t = 0; t < T; t++) {
        int e = tpk_nsr_embed(p, "Ux", U, t), h;
        if (t == 0) {
            h = add2(p, "h", e, b);
        } else {
            int tt[3] = {tpk_nsr_matmul(p, "Ws", W, s), e, b};
            double cc[3] = {1.0, 1.0, 1.0};
            h = tpk_nsr_lincomb(p, "h", 3, tt, cc);
        }
        s = phi_of(p, f, h, "s");
        tpk_nsr_output(p, "y", s, 1.0);
    }
    return p;
}

typedef tu_phis fixture; /* the shared registry fixture (tests/support) */

/* Seeds → mean Khat and the Frobenius check ‖mean − K‖ ≤ N_SE·√(Σ SE²); returns RMS error. */
typedef struct conv {
    double dist, se, rms;
} conv;

static conv converge(const tpk_program *p, const tpk_array *x, int all, size_t n, int seeds,
                     uint64_t seed0)
{
    tpk_array *K = NULL;
    assert_int_equal(tpk_netsor_kernel(p, x, all, &K, NULL, NULL), TPK_OK);
    size_t m = tpk_array_size(K);
    double *s1 = calloc(m, sizeof *s1), *s2 = calloc(m, sizeof *s2), ms = 0.0;
    for (int s = 0; s < seeds; s++) {
        tpk_array *Kh = NULL;
        assert_int_equal(tpk_netsor_run(p, x, n, seed0 + (uint64_t)s, all, &Kh, NULL, NULL), TPK_OK);
        assert_int_equal(tpk_array_size(Kh), m);
        for (size_t i = 0; i < m; i++) {
            double e = Kh->data[i] - K->data[i];
            s1[i] += e;
            s2[i] += e * e;
            ms += e * e;
        }
        tpk_array_free(Kh);
    }
    conv c = {0, 0, sqrt(ms / seeds)};
    for (size_t i = 0; i < m; i++) {
        double mean = s1[i] / seeds, var = (s2[i] - seeds * mean * mean) / (seeds - 1);
        c.dist += mean * mean;
        c.se += var / seeds;
    }
    c.dist = sqrt(c.dist);
    c.se = sqrt(c.se);
    free(s1);
    free(s2);
    tpk_array_free(K);
    return c;
}

/* ---- tests ------------------------------------------------------------------------------- */

static void test_philox_known_answers(void **state)
{
    (void)state;
    /* Random123 kat_vectors for philox4x32-10 */
    static const uint32_t ctr[3][4] = {{0, 0, 0, 0},
                                       {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
                                       {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}};
    static const uint32_t key[3][2] = {{0, 0}, {0xffffffff, 0xffffffff}, {0xa4093822, 0x299f31d0}};
    static const uint32_t want[3][4] = {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
                                        {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
                                        {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}};
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        tpk_philox4x32_10(ctr[i], key[i], out);
        assert_memory_equal(out, want[i], sizeof out);
    }
    /* rows agree with single draws whatever the start; the normals look standard */
    double row[101], s1 = 0, s2 = 0;
    for (uint32_t c0 = 0; c0 < 3; c0++) {
        tpk_rng_normal_row(42, 7, 5, c0, 101, row);
        for (uint32_t k = 0; k < 101; k++)
            assert_true(row[k] == tpk_rng_normal_at(42, 7, 5, c0 + k));
    }
    const int M = 200000;
    for (int i = 0; i < M; i++) {
        double z = tpk_rng_normal_at(3, TPK_RNG_STREAM(TPK_RNG_AVAR, 1), (uint32_t)(i / 1000), (uint32_t)(i % 1000));
        s1 += z;
        s2 += z * z;
    }
    assert_true(fabs(s1 / M) < 5.0 / sqrt(M));
    assert_true(fabs(s2 / M - 1.0) < 5.0 * sqrt(2.0 / M));
    assert_true(tpk_rng_normal_at(1, 2, 3, 4) != tpk_rng_normal_at(2, 2, 3, 4));
    assert_true(tpk_rng_normal_at(1, 2, 3, 4) != tpk_rng_normal_at(1, 3, 3, 4));
    double u = tpk_rng_uniform_at(9, 9, 9, 9);
    assert_true(u >= 0.0 && u < 1.0);
}

static void test_dgemm(void **state)
{
    (void)state;
    enum { M = 5, K = 4, N = 3 };
    double A[M * K], B[K * N], At[K * M], Bt[N * K], C[M * N], R[M * N];
    uint64_t s = 5;
    for (int i = 0; i < M * K; i++)
        A[i] = sm_normal(&s);
    for (int i = 0; i < K * N; i++)
        B[i] = sm_normal(&s);
    for (int i = 0; i < M; i++)
        for (int k = 0; k < K; k++)
            At[k * M + i] = A[i * K + k];
    for (int k = 0; k < K; k++)
        for (int j = 0; j < N; j++)
            Bt[j * K + k] = B[k * N + j];
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            R[i * N + j] = 0.5;
            for (int k = 0; k < K; k++)
                R[i * N + j] += 2.5 * A[i * K + k] * B[k * N + j];
        }
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            for (int i = 0; i < M * N; i++)
                C[i] = 1.0;
            assert_int_equal(tpk_dgemm(ta, tb, M, N, K, 2.5, ta ? At : A, ta ? M : K, tb ? Bt : B,
                                       tb ? K : N, 0.5, C, N, NULL), TPK_OK);
            for (int i = 0; i < M * N; i++)
                assert_true(fabs(C[i] - R[i]) < 1e-13);
        }
    assert_int_equal(tpk_dgemm(0, 0, M, N, 0, 1.0, A, K, B, N, 0.0, C, N, NULL), TPK_OK);
    assert_true(C[0] == 0.0);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_dgemm(2, 0, M, N, K, 1.0, A, K, B, N, 0.0, C, N, &ctx), TPK_EINVAL);
    assert_int_equal(tpk_dgemm(0, 0, M, N, K, 1.0, A, K - 1, B, N, 0.0, C, N, NULL), TPK_EINVAL);
    assert_int_equal(tpk_dgemm(0, 0, (size_t)1 << 40, N, K, 1.0, A, K, B, N, 0.0, C, N, NULL),
                     TPK_EINVAL);
    assert_non_null(tpk_dgemm_backend());
}

/* tpk_dtrmm against the dense product with the other triangle zeroed, every side/uplo/trans,
 * with garbage in the unread triangle (it must not be read), and its argument errors. */
static void test_dtrmm(void **state)
{
    (void)state;
    enum { M = 37, N = 29 };
    double *A = malloc(M * M * sizeof *A), *Ad = malloc(M * M * sizeof *Ad);
    double B[M * N], R[M * N], C[M * N];
    assert_non_null(A);
    assert_non_null(Ad);
    for (int side = 0; side < 2; side++)
        for (int uplo = 0; uplo < 2; uplo++)
            for (int tr = 0; tr < 2; tr++) {
                int na = side == TPK_LEFT ? M : N;
                for (int i = 0; i < na; i++)
                    for (int j = 0; j < na; j++) {
                        int in = uplo == TPK_LOWER ? j <= i : j >= i;
                        A[i * na + j] = in ? sin(1.3 * i + 0.7 * j + 0.3) : 1e300; /* unread */
                        Ad[i * na + j] = in ? A[i * na + j] : 0.0;
                    }
                for (int i = 0; i < M * N; i++)
                    B[i] = C[i] = cos(0.37 * i + 0.11);
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < N; j++) {
                        double acc = 0;
                        if (side == TPK_LEFT)
                            for (int k = 0; k < M; k++)
                                acc += (tr ? Ad[k * M + i] : Ad[i * M + k]) * B[k * N + j];
                        else
                            for (int k = 0; k < N; k++)
                                acc += B[i * N + k] * (tr ? Ad[j * N + k] : Ad[k * N + j]);
                        R[i * N + j] = -1.75 * acc;
                    }
                assert_int_equal(tpk_dtrmm(side, uplo, tr, M, N, -1.75, A, (size_t)na, C, N, NULL),
                                 TPK_OK);
                for (int i = 0; i < M * N; i++)
                    assert_true(fabs(C[i] - R[i]) < 1e-12);
            }
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_dtrmm(2, 0, 0, M, N, 1.0, A, N, C, N, &ctx), TPK_EINVAL);
    assert_non_null(strstr(ctx.msg, "tpk_dtrmm"));
    assert_int_equal(tpk_dtrmm(TPK_RIGHT, 0, 0, M, N, 1.0, A, N - 1, C, N, NULL), TPK_EINVAL);
    assert_int_equal(tpk_dtrmm(TPK_LEFT, 0, 0, 0, N, 1.0, A, 1, C, N, NULL), TPK_OK);
    free(A);
    free(Ad);
}

/* tpk_dsyrk_lower against a triple loop, both transposes, beta ≠ 0, k = 0: the lower triangle
 * written, the strict upper one untouched; tpk_dsyrk writes both, exactly symmetric. */
static void test_dsyrk_lower(void **state)
{
    (void)state;
    enum { N = 43, K = 17, LD = 47 };
    static double A[N * K], C[N * LD], R[N * LD];
    for (int i = 0; i < N * K; i++)
        A[i] = sin(0.71 * i + 0.2);
    for (int tr = 0; tr < 2; tr++)
        for (int kk = 0; kk <= K; kk += K) {
            for (int i = 0; i < N * LD; i++)
                C[i] = R[i] = cos(0.13 * i);
            for (int i = 0; i < N; i++)
                for (int j = 0; j <= i; j++) {
                    double acc = 0;
                    for (int k = 0; k < kk; k++)
                        acc += tr ? A[k * N + i] * A[k * N + j] : A[i * K + k] * A[j * K + k];
                    R[i * LD + j] = 0.6 * acc + 0.5 * R[i * LD + j];
                }
            assert_int_equal(tpk_dsyrk_lower(tr ? TPK_TRANS : TPK_NO_TRANS, N, (size_t)kk, 0.6, A,
                                             tr ? N : K, 0.5, C, LD, NULL), TPK_OK);
            for (int i = 0; i < N; i++)
                for (int j = 0; j < LD; j++)
                    if (j > i)
                        assert_true(C[i * LD + j] == R[i * LD + j]); /* untouched */
                    else
                        assert_true(fabs(C[i * LD + j] - R[i * LD + j]) < 1e-13);
            assert_int_equal(tpk_dsyrk(tr ? TPK_TRANS : TPK_NO_TRANS, N, (size_t)kk, 1.0, A,
                                       tr ? N : K, 0.0, C, LD, NULL), TPK_OK);
            for (int i = 0; i < N; i++)
                for (int j = 0; j < i; j++)
                    assert_true(C[i * LD + j] == C[j * LD + i]);
        }
    assert_int_equal(tpk_dsyrk_lower(7, N, K, 1.0, A, K, 0.0, C, LD, NULL), TPK_EINVAL);
}

/* Depth-3 ReLU MLP (σ_w² = 2, σ_b² = 0.1): width 2048 over 8 seeds matches the limit, and the
 * RMS error halves from n = 256 to 1024 (slope −1/2, theory §7.2). */
static void test_mlp_converges(void **state)
{
    fixture *f = *state;
    tpk_array *x = random_inputs(7, 1, 5, 101);
    tpk_program *p = build_mlp(f->relu, 3, 2.0, 0.1, 1.0);
    conv c = converge(p, x, 0, 2048, 8, 1000);
    print_message("relu n=2048: |mean Khat − K| = %.3g, SE = %.3g\n", c.dist, c.se);
    assert_true(c.dist <= N_SE * c.se);
    conv c256 = converge(p, x, 0, 256, 48, 2000), c1024 = converge(p, x, 0, 1024, 48, 3000);
    double ratio = c256.rms / c1024.rms;
    print_message("RMS n=256 %.4g, n=1024 %.4g, ratio %.3f\n", c256.rms, c1024.rms, ratio);
    assert_true(ratio >= 1.6 && ratio <= 2.5);
    tpk_nsr_prog_free(p);
    tpk_array_free(x);
}

static void test_tanh_and_rnn_converge(void **state)
{
    fixture *f = *state;
    tpk_array *x = random_inputs(6, 1, 5, 102);
    tpk_program *p = build_mlp(f->tanh_, 3, 1.5, 0.1, 1.0);
    conv c = converge(p, x, 0, 1024, 8, 4000);
    print_message("tanh n=1024: |mean − K| = %.3g, SE = %.3g\n", c.dist, c.se);
    assert_true(c.dist <= N_SE * c.se);
    tpk_nsr_prog_free(p);
    tpk_array_free(x);
    x = random_inputs(3, 4, 3, 103);
    p = build_rnn(f->erf_, 4);
    c = converge(p, x, 1, 1024, 8, 5000); /* all outputs, input-major layout */
    print_message("erf RNN n=1024: |mean − K| = %.3g, SE = %.3g\n", c.dist, c.se);
    assert_true(c.dist <= N_SE * c.se);
    tpk_nsr_prog_free(p);
    tpk_array_free(x);
}

/* One hidden ReLU layer, no bias: Khat = (1/n) Σ relu(u_α)relu(u'_α) with exactly Gaussian
 * pre-activations, so E Khat = K and Var Khat(x,x) = (3/2 − 1/4) q²/n = 1.25 q²/n (§3.4). */
static void test_one_layer_exact(void **state)
{
    fixture *f = *state;
    const size_t N = 5, d = 4, n = 256;
    const int seeds = 400;
    tpk_array *x = random_inputs(N, 1, d, 104);
    tpk_program *p = build_mlp(f->relu, 1, 1.7, -1.0, 1.0);
    conv c = converge(p, x, 0, n, 64, 6000);
    print_message("1 layer: |mean − K| = %.3g, SE = %.3g\n", c.dist, c.se);
    assert_true(c.dist <= N_SE * c.se);
    double ratio = 0.0, *s1 = calloc(N, sizeof *s1), *s2 = calloc(N, sizeof *s2);
    for (int s = 0; s < seeds; s++) {
        tpk_array *Kh = NULL;
        assert_int_equal(tpk_netsor_run(p, x, n, 9000 + (uint64_t)s, 0, &Kh, NULL, NULL), TPK_OK);
        for (size_t a = 0; a < N; a++) {
            s1[a] += Kh->data[a * N + a];
            s2[a] += Kh->data[a * N + a] * Kh->data[a * N + a];
        }
        tpk_array_free(Kh);
    }
    for (size_t a = 0; a < N; a++) {
        double q = 1.7 * dot(x->data + a * d, x->data + a * d, d) / (double)d;
        double var = (s2[a] - s1[a] * s1[a] / seeds) / (seeds - 1);
        ratio += var / (1.25 * q * q / (double)n) / (double)N;
    }
    /* sample variance of 400 near-Gaussian draws: relative SE √(2/399) ≈ 0.07 per input */
    print_message("diag variance / (1.25 q²/n) = %.3f\n", ratio);
    assert_true(fabs(ratio - 1.0) <= 0.2);
    free(s1);
    free(s2);
    tpk_nsr_prog_free(p);
    tpk_array_free(x);
}

/* NETSOR+: μ_a = mean of relu(g_a) over neurons (a Moment); h = relu(g) − μ; h2 = tanh(W h). */
static tpk_program *build_moment_prog(const fixture *f)
{
    tpk_program *p = tpk_nsr_prog_new(1);
    int U = tpk_nsr_add_embed(p, "U", 1.6);
    int g = add2(p, "g", tpk_nsr_embed(p, "Ux", U, 0), tpk_nsr_bias(p, "b", 0.2, 0.3));
    tpk_rpn_node mb[] = {G(g), CALL(f->relu)};
    int mu = tpk_nsr_moment(p, "mu", mb, 2);
    tpk_rpn_node hb[] = {G(g), CALL(f->relu), S(mu), OP(TPK_RPN_SUB)};
    int h = tpk_nsr_nonlin(p, "h", hb, 4);
    int W = tpk_nsr_add_avar(p, "W", 2.0);
    int g2 = tpk_nsr_matmul(p, "Wh", W, h);
    int h2 = phi_of(p, f->tanh_, g2, "h2");
    tpk_nsr_output(p, "y1", h, 1.0);
    tpk_nsr_output(p, "y2", h2, 0.7);
    return p;
}

/* Same seed → bitwise-identical Khat and y with 1 and 2 OpenMP threads. */
static void test_thread_independent(void **state)
{
    fixture *f = *state;
    tpk_array *x = random_inputs(4, 1, 3, 105);
    tpk_program *p = build_moment_prog(f);
    tpk_array *K1, *K2, *y1, *y2, *K3;
    int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    assert_int_equal(tpk_netsor_run(p, x, 777, 12345, 1, &K1, &y1, NULL), TPK_OK);
    omp_set_num_threads(2);
    assert_int_equal(tpk_netsor_run(p, x, 777, 12345, 1, &K2, &y2, NULL), TPK_OK);
    omp_set_num_threads(nt);
    assert_memory_equal(K1->data, K2->data, tpk_array_size(K1) * sizeof(double));
    assert_memory_equal(y1->data, y2->data, tpk_array_size(y1) * sizeof(double));
    assert_int_equal(tpk_netsor_run(p, x, 777, 12346, 1, &K3, NULL, NULL), TPK_OK);
    assert_true(K3->data[0] != K1->data[0]);
    /* readout bias: Khat shifts by its variance, y by one shared draw */
    tpk_array *Kb, *yb;
    p->output[0].bias_var = p->output[1].bias_var = 0.25;
    assert_int_equal(tpk_netsor_run(p, x, 777, 12345, 1, &Kb, &yb, NULL), TPK_OK);
    for (size_t i = 0; i < tpk_array_size(Kb); i++)
        assert_true(fabs(Kb->data[i] - K1->data[i] - 0.25) <= 1e-14);
    double shift = yb->data[0] - y1->data[0];
    for (size_t i = 0; i < tpk_array_size(yb); i++)
        assert_true(fabs(yb->data[i] - y1->data[i] - shift) <= 1e-14);
    p->output[0].bias_var = p->output[1].bias_var = 0.0;
    tpk_array_free(Kb);
    tpk_array_free(yb);
    size_t N = 8;
    for (size_t a = 0; a < N; a++)
        for (size_t c = 0; c < N; c++)
            assert_true(K1->data[a * N + c] == K1->data[c * N + a]);
    tpk_array_free(K1);
    tpk_array_free(K2);
    tpk_array_free(K3);
    tpk_array_free(y1);
    tpk_array_free(y2);
    tpk_nsr_prog_free(p);
    tpk_array_free(x);
}

/* Outputs y = ⟨v, h⟩/√n: over seeds, E[y_a y_c] → K (n = 256, 200 seeds). NETSOR+ centring
 * program: empirical Moments converge to the limit scalars. */
static void test_outputs_and_moments(void **state)
{
    fixture *f = *state;
    const size_t N = 4, d = 3;
    tpk_array *x = random_inputs(N, 1, d, 106);
    tpk_program *p = build_moment_prog(f);
    conv c = converge(p, x, 1, 1024, 8, 7000);
    print_message("moment program n=1024: |mean − K| = %.3g, SE = %.3g\n", c.dist, c.se);
    assert_true(c.dist <= N_SE * c.se);
    tpk_array *K = NULL;
    assert_int_equal(tpk_netsor_kernel(p, x, 1, &K, NULL, NULL), TPK_OK);
    const int seeds = 200;
    size_t m = 2 * N;
    double *s1 = calloc(m * m, sizeof *s1), *s2 = calloc(m * m, sizeof *s2);
    for (int s = 0; s < seeds; s++) {
        tpk_array *Kh = NULL, *y = NULL;
        assert_int_equal(tpk_netsor_run(p, x, 256, 8000 + (uint64_t)s, 1, &Kh, &y, NULL), TPK_OK);
        assert_int_equal(y->dims[0], N);
        assert_int_equal(y->dims[1], 2);
        for (size_t i = 0; i < m; i++)
            for (size_t j = 0; j < m; j++) {
                double v = y->data[i] * y->data[j];
                s1[i * m + j] += v;
                s2[i * m + j] += v * v;
            }
        tpk_array_free(Kh);
        tpk_array_free(y);
    }
    double dist = 0.0, se = 0.0;
    for (size_t i = 0; i < m * m; i++) {
        double mean = s1[i] / seeds, var = (s2[i] / seeds - mean * mean) / (seeds - 1);
        dist += (mean - K->data[i]) * (mean - K->data[i]);
        se += var;
    }
    print_message("outputs: |E yyᵀ − K| = %.3g, SE = %.3g\n", sqrt(dist), sqrt(se));
    assert_true(sqrt(dist) <= N_SE * sqrt(se));
    free(s1);
    free(s2);
    tpk_array_free(K);
    tpk_nsr_prog_free(p);
    tpk_array_free(x);
}

/* programs/layernorm-mlp.nsr through the front end: finite width → limit. */
static void test_layernorm_program(void **state)
{
    fixture *f = *state;
    char path[1024];
    const char *root = getenv("TPK_ROOT");
    snprintf(path, sizeof path, "%s/programs/layernorm-mlp.nsr", root ? root : ".");
    tpk_netsor_opts o = {.sets = NULL, .nsets = 0, .netsor_plus = 1, .explain = 0};
    tpk_program *p = tpk_netsor_load_file(path, &o, f->reg, NULL);
    assert_non_null(p);
    tpk_array *x = random_inputs(5, 1, 4, 109);
    conv c = converge(p, x, 0, 1024, 8, 9500);
    print_message("layernorm n=1024: |mean − K| = %.3g, SE = %.3g\n", c.dist, c.se);
    assert_true(c.dist <= N_SE * c.se);
    tpk_program_free(p);
    tpk_array_free(x);
}

static void test_errors(void **state)
{
    fixture *f = *state;
    tpk_array *x = random_inputs(3, 1, 4, 107);
    tpk_program *p = build_mlp(f->relu, 2, 2.0, 0.1, 1.0);
    tpk_array *K = NULL;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_netsor_run(p, x, 0, 1, 0, &K, NULL, &ctx), TPK_EINVAL);
    assert_non_null(strstr(ctx.msg, "width"));
    assert_int_equal(tpk_netsor_run(p, x, 16, 1, 0, NULL, NULL, NULL), TPK_EINVAL);
    assert_int_equal(tpk_netsor_run(NULL, x, 16, 1, 0, &K, NULL, NULL), TPK_EINVAL);
    tpk_array *x3 = random_inputs(3, 2, 4, 108);
    assert_int_equal(tpk_netsor_run(p, x3, 16, 1, 0, &K, NULL, NULL), TPK_EINVAL);
    p->instr[0].op = 99;
    assert_int_equal(tpk_netsor_run(p, x, 16, 1, 0, &K, NULL, NULL), TPK_EINVAL);
    p->instr[0].op = TPK_OP_EMBED;
    assert_int_equal(tpk_netsor_run(p, x, 16, 1, 0, &K, NULL, NULL), TPK_OK);
    tpk_array_free(K);
    tpk_array_free(x);
    tpk_array_free(x3);
    tpk_nsr_prog_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_known_answers),
        cmocka_unit_test(test_dgemm),
        cmocka_unit_test(test_dtrmm),
        cmocka_unit_test(test_dsyrk_lower),
        cmocka_unit_test(test_mlp_converges),
        cmocka_unit_test(test_tanh_and_rnn_converge),
        cmocka_unit_test(test_one_layer_exact),
        cmocka_unit_test(test_thread_independent),
        cmocka_unit_test(test_outputs_and_moments),
        cmocka_unit_test(test_layernorm_program),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, tu_phis_setup, tu_phis_teardown);
}
