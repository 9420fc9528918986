/* NETSOR limit evaluator (tpk_netsor_kernel) against independent oracles: closed-form MLP and
 * RNN recursions written out here (theory.md §2.1, §2.2, §3.2), 2-D quadrature recursions, a
 * Monte Carlo of the limit Gaussian drawn here, and its own alternative back ends. */
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

#include "tpk/tpk.h"
#include "support/testutil.h"
#include "../netsor/backend-impl.h"

/* Closed forms carry rounding only (three layers): the 1e-12 relative bound. */
#define TOL_CLOSED 1e-12
/* Same 2-D quadrature on both sides, different summation order. */
#define TOL_QUAD 1e-10
/* Degree of the per-entry reference quadrature for smooth φ (see test_mlp_tanh_quadrature). */
#define REF_DEGREE 400
/* That reference is itself good to only ~1e-10 for tanh near ρ = 1 (theory.md §3.3 table); the
 * independent nested adaptive integration of tests/test_gpkernel_cli.c pins the same evaluator
 * to ~1e-15. */
#define TOL_REF_TANH 1e-9
/* Monte Carlo comparisons: this many standard errors. */
#define N_SE 5.0
/* PSD: smallest eigenvalue ≥ −tol·largest; rounding for closed forms, and the accuracy of a
 * 64-point Gauss–Hermite rule near ρ = 1 (theory §3.3 table) for quadrature back ends. */
#define PSD_TOL 1e-12
#define PSD_TOL_QUAD 1e-8

static const double PI = 3.14159265358979323846;

/* ---- test-local randomness (independent of the library's Philox) ------------------------- */
static uint64_t sm_next(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}
static double sm_unif(uint64_t *s)
{
    return ((double)(sm_next(s) >> 11) + 0.5) * 0x1.0p-53;
}
static double sm_normal(uint64_t *s)
{
    return sqrt(-2.0 * log(sm_unif(s))) * cos(2.0 * PI * sm_unif(s));
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

/* ---- oracles ----------------------------------------------------------------------------- */
/* ReLU arc-cosine kernel, Cho & Saul degree 1 (theory §3.2), written out here. */
static double relu_k(double q1, double q2, double k)
{
    double s = sqrt(q1 * q2);
    if (s == 0.0)
        return 0.0;
    double r = k / s;
    r = r > 1.0 ? 1.0 : r < -1.0 ? -1.0 : r;
    double th = acos(r);
    return s / (2.0 * PI) * (sin(th) + (PI - th) * r);
}
/* erf kernel (Williams 1997). */
static double erf_k(double q1, double q2, double k)
{
    return 2.0 / PI * asin(2.0 * k / sqrt((1.0 + 2.0 * q1) * (1.0 + 2.0 * q2)));
}

static double dot(const double *a, const double *b, size_t d)
{
    double s = 0.0;
    for (size_t i = 0; i < d; i++)
        s += a[i] * b[i];
    return s;
}

static double max_abs(const double *a, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(a[i]));
    return m;
}

static void assert_sym_psd_tol(const tpk_array *K, double tol)
{
    size_t n = K->dims[0];
    for (size_t i = 0; i < n * n; i++)
        assert_false(isnan(K->data[i]));
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            assert_true(K->data[i * n + j] == K->data[j * n + i]);
    double *A = malloc(n * n * sizeof *A), *w = malloc(n * sizeof *w);
    memcpy(A, K->data, n * n * sizeof *A);
    assert_int_equal(LAPACKE_dsyev(LAPACK_ROW_MAJOR, 'N', 'L', (int)n, A, (int)n, w), 0);
    if (w[0] < -tol * fmax(fabs(w[n - 1]), 1e-300))
        print_message("not PSD: eigenvalues %.3g .. %.3g\n", w[0], w[n - 1]);
    assert_true(w[0] >= -tol * fmax(fabs(w[n - 1]), 1e-300));
    free(A);
    free(w);
}

static void assert_sym_psd(const tpk_array *K)
{
    assert_sym_psd_tol(K, PSD_TOL);
}

/* ---- IR helpers -------------------------------------------------------------------------- */
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

/* depth-L MLP: g1 = Ux + b1, h_l = φ(g_l), g_{l+1} = W_{l+1} h_l + b_{l+1}; y = h_L */
static tpk_program *build_mlp(const tpk_phi *f, int L, double sw2, double sb2, double sv2)
{
    tpk_program *p = tpk_nsr_prog_new(1);
    int U = tpk_nsr_add_embed(p, "U", sw2);
    int g = add2(p, "g1", tpk_nsr_embed(p, "Ux", U, 0), tpk_nsr_bias(p, "b1", 0.0, sb2));
    int h = -1;
    for (int l = 1; l <= L; l++) {
        h = phi_of(p, f, g, "h");
        if (l < L) {
            int W = tpk_nsr_add_avar(p, "W", sw2);
            g = add2(p, "g", tpk_nsr_matmul(p, "Wh", W, h), tpk_nsr_bias(p, "b", 0.0, sb2));
        }
    }
    assert_true(h >= 0);
    tpk_nsr_output(p, "y", h, sv2);
    return p;
}

typedef double (*kern2)(double, double, double, void *);

/* direct recursion Σ¹ = σ_U²⟨x,x'⟩/d + σ_b², Σ^{l+1} = σ_w² V(Σ^l) + σ_b², out σ_v² V(Σ^L) */
static double *mlp_recursion(const tpk_array *x, int L, double sw2, double sb2, double sv2,
                             kern2 V, void *ctx)
{
    size_t N = x->dims[0], d = x->dims[1];
    double *S = malloc(N * N * sizeof *S), *K = malloc(N * N * sizeof *K);
    for (size_t a = 0; a < N; a++)
        for (size_t c = 0; c < N; c++)
            S[a * N + c] = sw2 * dot(x->data + a * d, x->data + c * d, d) / (double)d + sb2;
    for (int l = 1; l <= L; l++) {
        for (size_t a = 0; a < N; a++) /* lower triangle, mirrored: V is symmetric */
            for (size_t c = 0; c <= a; c++)
                K[a * N + c] = K[c * N + a] = V(S[a * N + a], S[c * N + c], S[a * N + c], ctx);
        for (size_t i = 0; i < N * N; i++)
            S[i] = l < L ? sw2 * K[i] + sb2 : sv2 * K[i];
    }
    free(K);
    return S;
}

static double V_relu(double q1, double q2, double k, void *c)
{
    (void)c;
    return relu_k(q1, q2, k);
}

typedef struct quadctx {
    const tpk_phi *f;
    tpk_gauss_ws *ws;
} quadctx;
static double V_quad(double q1, double q2, double k, void *c)
{
    quadctx *q = c;
    tpk_estimate e;
    assert_int_equal(tpk_gauss_expect2_quad(q->f, q->f, 0, 0, q1, q2, k, q->ws, &e, NULL), TPK_OK);
    return e.value;
}

typedef tu_phis fixture; /* the shared registry fixture (tests/support) */

/* ---- tests ------------------------------------------------------------------------------- */

static void test_mlp_relu_closed_form(void **state)
{
    fixture *f = *state;
    const size_t N = 7, d = 5;
    tpk_array *x = random_inputs(N, 1, d, 11);
    tpk_program *p = build_mlp(f->relu, 3, 2.0, 0.1, 1.7);
    tpk_array *K = NULL;
    double err = -1;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_netsor_kernel(p, x, 0, &K, &err, &ctx), TPK_OK);
    double *R = mlp_recursion(x, 3, 2.0, 0.1, 1.7, V_relu, NULL);
    double scale = max_abs(R, N * N), worst = 0.0;
    for (size_t i = 0; i < N * N; i++)
        worst = fmax(worst, fabs(K->data[i] - R[i]) / scale);
    print_message("relu MLP: max rel diff %.3g, err %.3g\n", worst, err);
    assert_true(worst <= TOL_CLOSED);
    assert_true(err <= 1e-12);
    assert_sym_psd(K);
    /* a readout bias β ~ N(0, 0.37) adds 0.37 to every entry */
    tpk_array *Kb = NULL;
    p->output[0].bias_var = 0.37;
    assert_int_equal(tpk_netsor_kernel(p, x, 0, &Kb, NULL, NULL), TPK_OK);
    for (size_t i = 0; i < N * N; i++)
        assert_true(fabs(Kb->data[i] - K->data[i] - 0.37) <= 1e-14);
    tpk_array_free(Kb);
    free(R);
    tpk_array_free(K);
    tpk_array_free(x);
    tpk_nsr_prog_free(p);
}

static void test_mlp_tanh_quadrature(void **state)
{
    fixture *f = *state;
    const size_t N = 7, d = 5;
    tpk_array *x = random_inputs(N, 1, d, 12);
    tpk_program *p = build_mlp(f->tanh_, 3, 2.0, 0.1, 1.0);
    tpk_array *K = NULL;
    double err;
    assert_int_equal(tpk_netsor_kernel(p, x, 0, &K, &err, NULL), TPK_OK);
    /* The reference integrates entry by entry with a much higher degree than the evaluator's
     * default: Gauss–Hermite for tanh (poles at ±iπ/2) gains only ~1e-6 at degree 64 for q ≈ 3,
     * while the whole-matrix Mehler path the evaluator takes is accurate to rounding. */
    quadctx qc = {f->tanh_, tpk_gauss_ws_alloc(REF_DEGREE, NULL)};
    double *R = mlp_recursion(x, 3, 2.0, 0.1, 1.0, V_quad, &qc);
    double scale = max_abs(R, N * N), worst = 0.0;
    for (size_t i = 0; i < N * N; i++)
        worst = fmax(worst, fabs(K->data[i] - R[i]) / scale);
    print_message("tanh MLP: max rel diff %.3g, err %.3g\n", worst, err);
    assert_true(worst <= TOL_REF_TANH);
    assert_sym_psd_tol(K, PSD_TOL_QUAD);
    tpk_gauss_ws_free(qc.ws);
    free(R);
    tpk_array_free(K);
    tpk_array_free(x);
    tpk_nsr_prog_free(p);
}

/* RNN (theory §2.2): h^t = W s^{t−1} + U x^t + b, s^t = φ(h^t); untied: a fresh W per step.
 * read_h: outputs read h^t instead of s^t. */
static tpk_program *build_rnn(const tpk_phi *f, int T, int tied, int read_h, double sw2,
                              double su2, double sb2, double sv2)
{
    tpk_program *p = tpk_nsr_prog_new(T);
    int U = tpk_nsr_add_embed(p, "U", su2);
    int W = tpk_nsr_add_avar(p, "W", sw2);
    int b = tpk_nsr_bias(p, "b", 0.0, sb2);
    int s = -1;
    for (int t = 0; t < T; t++) {
        int e = tpk_nsr_embed(p, "Ux", U, t), h;
        if (t == 0) {
            h = add2(p, "h", e, b);
        } else {
            int m = tpk_nsr_matmul(p, "Ws", tied ? W : tpk_nsr_add_avar(p, "Wt", sw2), s);
            int tt[3] = {m, e, b};
            double cc[3] = {1.0, 1.0, 1.0};
            h = tpk_nsr_lincomb(p, "h", 3, tt, cc);
        }
        s = phi_of(p, f, h, "s");
        tpk_nsr_output(p, "y", read_h ? h : s, sv2);
    }
    return p;
}

static void test_rnn_erf_vs_recursion(void **state)
{
    fixture *f = *state;
    const size_t N = 4, T = 4, d = 3, M = N * T;
    const double sw2 = 1.3, su2 = 0.8, sb2 = 0.2, sv2 = 1.1;
    tpk_array *x = random_inputs(N, T, d, 21);
    tpk_program *p = build_rnn(f->erf_, (int)T, 1, 0, sw2, su2, sb2, sv2);
    tpk_array *K = NULL;
    double err;
    assert_int_equal(tpk_netsor_kernel(p, x, 1, &K, &err, NULL), TPK_OK);
    assert_int_equal(K->dims[0], M);
    /* independent §2.2 recursion over (sequence, time), item i = a·T + t */
    double *Sh = calloc(M * M, sizeof *Sh);
#define XV(a, t) (x->data + ((a) * T + (t)) * d)
#define SH(a, t, c, r) Sh[((a) * T + (t)) * M + (c) * T + (r)]
    for (size_t m = 0; m < T; m++)
        for (int pass = 0; pass < 2; pass++) /* diagonal time pairs first */
            for (size_t a = 0; a < N; a++)
                for (size_t c = 0; c < N; c++)
                    for (size_t r = 0; r <= m; r++) {
                        size_t t = m;
                        if ((pass == 0) != (r == m))
                            continue;
                        double v = su2 * dot(XV(a, t), XV(c, r), d) / (double)d + sb2;
                        if (t > 0 && r > 0)
                            v += sw2 * erf_k(SH(a, t - 1, a, t - 1), SH(c, r - 1, c, r - 1),
                                             SH(a, t - 1, c, r - 1));
                        SH(a, t, c, r) = v;
                        SH(c, r, a, t) = v;
                    }
    double worst = 0.0, scale = 0.0;
    for (size_t a = 0; a < N; a++)
        for (size_t t = 0; t < T; t++)
            for (size_t c = 0; c < N; c++)
                for (size_t r = 0; r < T; r++) {
                    double want = sv2 * erf_k(SH(a, t, a, t), SH(c, r, c, r), SH(a, t, c, r));
                    double got = K->data[(a * T + t) * M + c * T + r];
                    scale = fmax(scale, fabs(want));
                    worst = fmax(worst, fabs(got - want));
                }
    print_message("erf RNN: max diff %.3g (scale %.3g)\n", worst, scale);
    assert_true(worst <= TOL_QUAD * scale);
    assert_sym_psd(K);
    /* all_outputs = 0: the last output only, equal to the (·,T−1) block */
    tpk_array *K1 = NULL;
    assert_int_equal(tpk_netsor_kernel(p, x, 0, &K1, NULL, NULL), TPK_OK);
    assert_int_equal(K1->dims[0], N);
    for (size_t a = 0; a < N; a++)
        for (size_t c = 0; c < N; c++)
            assert_true(fabs(K1->data[a * N + c] - K->data[(a * T + T - 1) * M + c * T + T - 1]) <=
                        1e-14 * scale);
#undef XV
#undef SH
    free(Sh);
    tpk_array_free(K);
    tpk_array_free(K1);
    tpk_array_free(x);
    tpk_nsr_prog_free(p);
}

static void test_rnn_untied_no_cross_time(void **state)
{
    fixture *f = *state;
    const size_t N = 3, T = 4, d = 3, M = N * T;
    const double sw2 = 1.3, su2 = 0.8, sb2 = 0.2;
    tpk_array *x = random_inputs(N, T, d, 22);
    tpk_program *pu = build_rnn(f->tanh_, (int)T, 0, 1, sw2, su2, sb2, 1.0);
    tpk_program *pt = build_rnn(f->tanh_, (int)T, 1, 1, sw2, su2, sb2, 1.0);
    tpk_array *Ku = NULL, *Kt = NULL;
    assert_int_equal(tpk_netsor_kernel(pu, x, 1, &Ku, NULL, NULL), TPK_OK);
    assert_int_equal(tpk_netsor_kernel(pt, x, 1, &Kt, NULL, NULL), TPK_OK);
    double tied_cross = 0.0;
    for (size_t a = 0; a < N; a++)
        for (size_t t = 0; t < T; t++)
            for (size_t c = 0; c < N; c++)
                for (size_t r = 0; r < T; r++) {
                    double in = su2 * dot(x->data + (a * T + t) * d, x->data + (c * T + r) * d, d) / (double)d + sb2;
                    size_t i = (a * T + t) * M + c * T + r;
                    if (t != r)
                        assert_true(fabs(Ku->data[i] - in) <= 1e-13 * fmax(1.0, fabs(in)));
                    else if (t > 0 && a == c)
                        assert_true(Ku->data[i] > in); /* the recurrent term adds σ_W² E[s²] */
                    if (t != r && t > 0 && r > 0)
                        tied_cross = fmax(tied_cross, fabs(Kt->data[i] - in));
                }
    assert_true(tied_cross > 1e-3); /* tied weights do correlate different times */
    tpk_array_free(Ku);
    tpk_array_free(Kt);
    tpk_array_free(x);
    tpk_nsr_prog_free(pu);
    tpk_nsr_prog_free(pt);
}

/* h = tanh(g1)·erf(g2) + g3 with g1 = e1 + ½e2, g2 = e2 + b, g3 = 0.7e1 − 0.4e2 + b (b has a
 * mean): three correlated arguments from three families. factor_only: h = tanh(e1)·erf(e2 + b). */
typedef struct prog3 {
    tpk_program *p;
    double su1, su2, bm, bv;
} prog3;

static prog3 build_3arg(const fixture *f, int factor_only)
{
    prog3 r = {tpk_nsr_prog_new(1), 1.4, 0.9, 0.3, 0.25};
    tpk_program *p = r.p;
    int U1 = tpk_nsr_add_embed(p, "U1", r.su1), U2 = tpk_nsr_add_embed(p, "U2", r.su2);
    int e1 = tpk_nsr_embed(p, "e1", U1, 0), e2 = tpk_nsr_embed(p, "e2", U2, 0);
    int b = tpk_nsr_bias(p, "b", r.bm, r.bv);
    int g1, g2 = add2(p, "g2", e2, b), g3, h;
    if (factor_only) {
        tpk_rpn_node body[] = {G(e1), CALL(f->tanh_), G(g2), CALL(f->erf_), OP(TPK_RPN_MUL)};
        h = tpk_nsr_nonlin(p, "h", body, 5);
    } else {
        int t1[2] = {e1, e2}, t3[3] = {e1, e2, b};
        double c1[2] = {1.0, 0.5}, c3[3] = {0.7, -0.4, 1.0};
        g1 = tpk_nsr_lincomb(p, "g1", 2, t1, c1);
        g3 = tpk_nsr_lincomb(p, "g3", 3, t3, c3);
        tpk_rpn_node body[] = {G(g1), CALL(f->tanh_), G(g2), CALL(f->erf_), OP(TPK_RPN_MUL),
                               G(g3), OP(TPK_RPN_ADD)};
        h = tpk_nsr_nonlin(p, "h", body, 7);
    }
    tpk_nsr_output(p, "y", h, 1.0);
    return r;
}

/* Monte Carlo of the limit drawn here: rows u1, u2 of the embeddings and one bias coordinate. */
static void mc_3arg(const prog3 *r, int factor_only, const tpk_array *x, size_t M, double *mean,
                    double *se)
{
    size_t N = x->dims[0], d = x->dims[1];
    double *s1 = calloc(N * N, sizeof *s1), *s2 = calloc(N * N, sizeof *s2), *h = malloc(N * sizeof *h);
    double u1[16], u2[16];
    uint64_t st = 777;
    for (size_t m = 0; m < M; m++) {
        for (size_t j = 0; j < d; j++) {
            u1[j] = sqrt(r->su1 / (double)d) * sm_normal(&st);
            u2[j] = sqrt(r->su2 / (double)d) * sm_normal(&st);
        }
        double b = r->bm + sqrt(r->bv) * sm_normal(&st);
        for (size_t a = 0; a < N; a++) {
            double e1 = dot(u1, x->data + a * d, d), e2 = dot(u2, x->data + a * d, d);
            h[a] = factor_only ? tanh(e1) * erf(e2 + b)
                               : tanh(e1 + 0.5 * e2) * erf(e2 + b) + 0.7 * e1 - 0.4 * e2 + b;
        }
        for (size_t a = 0; a < N; a++)
            for (size_t c = 0; c < N; c++) {
                double v = h[a] * h[c];
                s1[a * N + c] += v;
                s2[a * N + c] += v * v;
            }
    }
    for (size_t i = 0; i < N * N; i++) {
        mean[i] = s1[i] / (double)M;
        se[i] = sqrt(fmax(s2[i] / (double)M - mean[i] * mean[i], 0.0) / (double)M);
    }
    free(s1);
    free(s2);
    free(h);
}

static void test_three_arg_vs_monte_carlo(void **state)
{
    fixture *f = *state;
    const size_t N = 5, d = 4, M = 400000;
    tpk_array *x = random_inputs(N, 1, d, 31);
    memset(x->data + 4 * d, 0, d * sizeof(double)); /* one zero input */
    prog3 r = build_3arg(f, 0);
    tpk_array *K = NULL;
    double err;
    assert_int_equal(tpk_netsor_kernel(r.p, x, 0, &K, &err, NULL), TPK_OK);
    double *mean = malloc(N * N * sizeof *mean), *se = malloc(N * N * sizeof *se);
    mc_3arg(&r, 0, x, M, mean, se);
    double worst = 0.0;
    for (size_t i = 0; i < N * N; i++) {
        double z = fabs(K->data[i] - mean[i]) / (se[i] + err + 1e-12);
        worst = fmax(worst, z);
    }
    print_message("3-arg Nonlin vs MC: worst |diff|/(se+err) = %.2f, err %.3g\n", worst, err);
    assert_true(worst <= N_SE);
    assert_sym_psd(K);
    /* the generic path (joint Gauss–Hermite / Monte Carlo over all arguments) agrees */
    tpk_limit_opts o = {0};
    o.no_factor = 1;
    o.no_fastpath = 1;
    tpk_array *Kg = NULL;
    double errg;
    assert_int_equal(tpk_netsor_kernel_ex(r.p, x, 0, &o, &Kg, &errg, NULL), TPK_OK);
    double worst_g = 0.0;
    for (size_t i = 0; i < N * N; i++)
        worst_g = fmax(worst_g, fabs(K->data[i] - Kg->data[i]) / (N_SE * (err + errg) + 1e-12));
    print_message("3-arg: generic vs expanded: worst |diff|/(5·errs) = %.2f, generic err %.3g\n", worst_g, errg);
    assert_true(worst_g <= 1.0);
    free(mean);
    free(se);
    tpk_array_free(K);
    tpk_array_free(Kg);
    tpk_array_free(x);
    tpk_nsr_prog_free(r.p);
}

static void test_factorised_vs_generic(void **state)
{
    fixture *f = *state;
    const size_t N = 5, d = 4;
    tpk_array *x = random_inputs(N, 1, d, 32);
    prog3 r = build_3arg(f, 1);
    tpk_array *Kf = NULL, *Kg = NULL, *Km = NULL;
    double ef, eg, em;
    assert_int_equal(tpk_netsor_kernel(r.p, x, 0, &Kf, &ef, NULL), TPK_OK);
    tpk_limit_opts o = {0};
    o.no_factor = 1;
    assert_int_equal(tpk_netsor_kernel_ex(r.p, x, 0, &o, &Kg, &eg, NULL), TPK_OK);
    o.force_mc = 1;
    o.mc_samples = 1 << 17;
    assert_int_equal(tpk_netsor_kernel_ex(r.p, x, 0, &o, &Km, &em, NULL), TPK_OK);
    double wg = 0.0, wm = 0.0;
    for (size_t i = 0; i < N * N; i++) {
        wg = fmax(wg, fabs(Kf->data[i] - Kg->data[i]));
        wm = fmax(wm, fabs(Kf->data[i] - Km->data[i]));
    }
    print_message("factorised vs 4-D GH: %.3g (errs %.3g, %.3g); vs MC: %.3g (se %.3g)\n", wg, ef,
                  eg, wm, em);
    assert_true(ef <= 1e-3 && ef < eg); /* 2-D factors: the library's (conservative) estimate */
    assert_true(wg <= 2.0 * eg + 1e-9); /* the 4-D rule's own estimate bounds the gap */
    assert_true(eg <= 1e-2);
    assert_true(wm <= N_SE * em);
    /* the oracle MC of the test agrees with the factorised value */
    double *mean = malloc(N * N * sizeof *mean), *se = malloc(N * N * sizeof *se);
    mc_3arg(&r, 1, x, 200000, mean, se);
    for (size_t i = 0; i < N * N; i++)
        assert_true(fabs(Kf->data[i] - mean[i]) <= N_SE * se[i] + 1e-12);
    free(mean);
    free(se);
    tpk_array_free(Kf);
    tpk_array_free(Kg);
    tpk_array_free(Km);
    tpk_array_free(x);
    tpk_nsr_prog_free(r.p);
}

/* NETSOR+: μ_a = E relu(g_a) is a Moment; h = relu(g) − μ. K = V_relu − μ_a μ_c (closed form). */
static void test_moment_centring(void **state)
{
    fixture *f = *state;
    const size_t N = 6, d = 4;
    const double su2 = 1.6, sb2 = 0.3;
    tpk_array *x = random_inputs(N, 1, d, 41);
    tpk_program *p = tpk_nsr_prog_new(1);
    int U = tpk_nsr_add_embed(p, "U", su2);
    int g = add2(p, "g", tpk_nsr_embed(p, "Ux", U, 0), tpk_nsr_bias(p, "b", 0.0, sb2));
    tpk_rpn_node mb[] = {G(g), CALL(f->relu)};
    int mu = tpk_nsr_moment(p, "mu", mb, 2);
    tpk_rpn_node hb[] = {G(g), CALL(f->relu), S(mu), OP(TPK_RPN_SUB)};
    int h = tpk_nsr_nonlin(p, "h", hb, 4);
    tpk_nsr_output(p, "y", h, 1.0);
    tpk_array *K = NULL;
    double err;
    assert_int_equal(tpk_netsor_kernel(p, x, 0, &K, &err, NULL), TPK_OK);
    double worst = 0.0;
    for (size_t a = 0; a < N; a++)
        for (size_t c = 0; c < N; c++) {
            double qa = su2 * dot(x->data + a * d, x->data + a * d, d) / (double)d + sb2;
            double qc = su2 * dot(x->data + c * d, x->data + c * d, d) / (double)d + sb2;
            double k = su2 * dot(x->data + a * d, x->data + c * d, d) / (double)d + sb2;
            double want = relu_k(qa, qc, k) - sqrt(qa / (2 * PI)) * sqrt(qc / (2 * PI));
            worst = fmax(worst, fabs(K->data[a * N + c] - want));
        }
    print_message("moment centring: max diff %.3g (err %.3g)\n", worst, err);
    assert_true(worst <= 1e-9);
    assert_sym_psd(K);
    tpk_array_free(K);
    tpk_array_free(x);
    tpk_nsr_prog_free(p);
}

/* Load a program from programs/ through the front end (path relative to TPK_ROOT). */
static tpk_program *load_program(const fixture *f, const char *rel, const tpk_param_set *sets,
                                 int nsets)
{
    return tu_load_shipped(f->reg, rel, sets, nsets);
}

/* The front end's programs/mlp.nsr and programs/rnn.nsr give the recursions' kernels. */
static void test_front_end_programs(void **state)
{
    fixture *f = *state;
    const size_t N = 5, d = 4;
    tpk_array *x = random_inputs(N, 1, d, 71);
    tpk_program *p = load_program(f, "programs/mlp.nsr", NULL, 0);
    tpk_array *K = NULL;
    assert_int_equal(tpk_netsor_kernel(p, x, 0, &K, NULL, NULL), TPK_OK);
    /* its defaults are gpkernel --arch=mlp's: sigma_b2 = 0, sigma_v2 = sigma_w2 (issue 39) */
    double *R = mlp_recursion(x, 3, 2.0, 0.0, 2.0, V_relu, NULL);
    for (size_t i = 0; i < N * N; i++)
        assert_true(fabs(K->data[i] - R[i]) <= TOL_CLOSED * max_abs(R, N * N));
    free(R);
    tpk_array_free(K);
    tpk_program_free(p);
    tpk_array_free(x);
    /* rnn.nsr (erf, T = 4) equals the builder's RNN with the same parameters */
    x = random_inputs(3, 4, 3, 72);
    p = load_program(f, "programs/rnn.nsr", NULL, 0);
    tpk_program *q = build_rnn(f->erf_, 4, 1, 0, 1.0, 1.0, 0.05, 1.0);
    tpk_array *Kq = NULL;
    assert_int_equal(tpk_netsor_kernel(p, x, 1, &K, NULL, NULL), TPK_OK);
    assert_int_equal(tpk_netsor_kernel(q, x, 1, &Kq, NULL, NULL), TPK_OK);
    assert_int_equal(tpk_array_size(K), tpk_array_size(Kq));
    for (size_t i = 0; i < tpk_array_size(K); i++)
        assert_true(fabs(K->data[i] - Kq->data[i]) <= 1e-13);
    tpk_array_free(K);
    tpk_array_free(Kq);
    tpk_program_free(p);
    tpk_nsr_prog_free(q);
    tpk_array_free(x);
}

/* The readout's third argument as docs/netsor.md documents it (issue 39, item 2: a program
 * written from the docs' two-argument grammar was a constant off): readout(h, s2, b2) is
 * y = <v, h>/sqrt(n) + beta, kernel s2 E[relu relu] + b2 in every entry, against the Cho–Saul
 * arc-cosine closed form; the two-argument form has no bias; a negative bias variance is an
 * error at its position. */
static void test_readout_bias_documented(void **state)
{
    fixture *f = *state;
    const size_t N = 6, d = 5;
    tpk_array *x = random_inputs(N, 1, d, 391);
    const double sw2 = 1.7, sb2 = 0.23, sv2 = 1.3, ob2 = 0.05;
    const char *src[2] = {
        "param sigma_ob2 = 0.05\nwidth n\ninput x : d\nA U : (n, d) ~ 1.7\nA W : (n, n) ~ 1.7\n"
        "G b1 : n ~ 0.23\nG b2 : n ~ 0.23\ng1 = U x + b1\ng2 = W relu(g1) + b2\n"
        "output y = readout(relu(g2), 1.3, sigma_ob2)\n",
        "width n\ninput x : d\nA U : (n, d) ~ 1.7\nA W : (n, n) ~ 1.7\n"
        "G b1 : n ~ 0.23\nG b2 : n ~ 0.23\ng1 = U x + b1\ng2 = W relu(g1) + b2\n"
        "output y = readout(relu(g2), 1.3)\n"};
    /* Σ¹ = σ_w²<x,x'>/d + σ_b², Σ² = σ_w² V(Σ¹) + σ_b², K = σ_v² V(Σ²) + σ_ob² */
    double *S1 = malloc(N * N * sizeof *S1), *S2 = malloc(N * N * sizeof *S2);
    for (size_t a = 0; a < N; a++)
        for (size_t c = 0; c < N; c++)
            S1[a * N + c] = sw2 * dot(x->data + a * d, x->data + c * d, d) / (double)d + sb2;
    for (size_t a = 0; a < N; a++)
        for (size_t c = 0; c < N; c++)
            S2[a * N + c] = sw2 * relu_k(S1[a * N + a], S1[c * N + c], S1[a * N + c]) + sb2;
    for (int v = 0; v < 2; v++) {
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        tpk_netsor_opts o = {0};
        tpk_program *p = tpk_netsor_load_string("doc.nsr", src[v], &o, f->reg, &ctx);
        if (!p)
            fail_msg("%s", ctx.msg);
        tpk_array *K = NULL;
        assert_int_equal(tpk_netsor_kernel(p, x, 0, &K, NULL, &ctx), TPK_OK);
        double worst = 0;
        for (size_t a = 0; a < N; a++)
            for (size_t c = 0; c < N; c++) {
                double want = sv2 * relu_k(S2[a * N + a], S2[c * N + c], S2[a * N + c]) +
                              (v == 0 ? ob2 : 0.0);
                worst = fmax(worst, fabs(K->data[a * N + c] - want) / fabs(want));
            }
        print_message("readout with%s a bias: max relative error %.2e\n", v ? "out" : "", worst);
        assert_true(worst <= TOL_CLOSED);
        tpk_array_free(K);
        tpk_program_free(p);
    }
    /* a negative bias variance, at its position */
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_netsor_opts o = {0};
    const char *bad = "width n\ninput x : d\nA U : (n, d) ~ 1\ng = U x\n"
                      "output y = readout(relu(g), 1, -0.5)\n";
    assert_null(tpk_netsor_load_string("bad.nsr", bad, &o, f->reg, &ctx));
    assert_non_null(strstr(ctx.msg, "bad.nsr:5:"));
    assert_non_null(strstr(ctx.msg, "bias variance is negative"));
    free(S1);
    free(S2);
    tpk_array_free(x);
}

/* programs/layernorm-mlp.nsr (NETSOR+, theory §2.6): m = E g = 0, v = Var g, so
 * h = relu(g/√(Σ_aa + ε)) and the layer map is V_relu of the ε-shrunk correlation matrix. */
static void test_layernorm_program(void **state)
{
    fixture *f = *state;
    const size_t N = 5, d = 4;
    const double eps = 1e-5, sw2 = 2.0, sb2 = 0.1, su2 = 1.0;
    tpk_array *x = random_inputs(N, 1, d, 73);
    tpk_program *p = load_program(f, "programs/layernorm-mlp.nsr", NULL, 0);
    tpk_array *K = NULL;
    double err;
    assert_int_equal(tpk_netsor_kernel(p, x, 0, &K, &err, NULL), TPK_OK);
    double *S = malloc(N * N * sizeof *S), *T = malloc(N * N * sizeof *T);
    for (size_t a = 0; a < N; a++)
        for (size_t c = 0; c < N; c++)
            S[a * N + c] = su2 * dot(x->data + a * d, x->data + c * d, d) / (double)d + sb2;
    for (int l = 1; l <= 2; l++) {
        for (size_t a = 0; a < N; a++)
            for (size_t c = 0; c < N; c++) {
                double sa = sqrt(S[a * N + a] + eps), sc = sqrt(S[c * N + c] + eps);
                T[a * N + c] = relu_k(S[a * N + a] / (sa * sa), S[c * N + c] / (sc * sc),
                                      S[a * N + c] / (sa * sc));
            }
        for (size_t i = 0; i < N * N; i++)
            S[i] = l < 2 ? sw2 * T[i] + sb2 : T[i];
    }
    double worst = 0.0;
    for (size_t i = 0; i < N * N; i++)
        worst = fmax(worst, fabs(K->data[i] - S[i]));
    print_message("layernorm MLP: max diff %.3g (err %.3g)\n", worst, err);
    assert_true(worst <= 1e-10);
    assert_sym_psd(K);
    free(S);
    free(T);
    tpk_array_free(K);
    tpk_program_free(p);
    tpk_array_free(x);
}

static void test_degenerate_inputs(void **state)
{
    fixture *f = *state;
    const size_t N = 6, d = 5;
    tpk_array *x = random_inputs(N, 1, d, 51);
    memset(x->data, 0, d * sizeof(double));                          /* zero input */
    memcpy(x->data + 2 * d, x->data + 3 * d, d * sizeof(double));    /* duplicate */
    memcpy(x->data + 5 * d, x->data + 3 * d, d * sizeof(double));    /* triplicate */
    const tpk_phi *phis[3] = {f->relu, f->tanh_, f->erf_};
    for (int i = 0; i < 3; i++)
        for (int sb = 0; sb < 2; sb++) {
            tpk_program *p = build_mlp(phis[i], 3, 2.0, sb ? 0.1 : 0.0, 1.0);
            tpk_array *K = NULL;
            assert_int_equal(tpk_netsor_kernel(p, x, 0, &K, NULL, NULL), TPK_OK);
            assert_sym_psd_tol(K, i == 1 ? PSD_TOL_QUAD : PSD_TOL);
            for (size_t c = 0; c < N; c++) /* duplicated inputs: identical rows */
                assert_true(fabs(K->data[2 * N + c] - K->data[3 * N + c]) <= 1e-12);
            tpk_array_free(K);
            tpk_nsr_prog_free(p);
        }
    prog3 r = build_3arg(f, 0); /* the generic paths with singular covariances */
    tpk_array *K = NULL;
    assert_int_equal(tpk_netsor_kernel(r.p, x, 0, &K, NULL, NULL), TPK_OK);
    assert_sym_psd(K);
    tpk_array_free(K);
    tpk_nsr_prog_free(r.p);
    tpk_array_free(x);
}

static void test_errors(void **state)
{
    fixture *f = *state;
    tpk_array *x = random_inputs(3, 1, 4, 61);
    tpk_program *p = build_mlp(f->relu, 2, 2.0, 0.1, 1.0);
    tpk_array *K = NULL;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_netsor_kernel(NULL, x, 0, &K, NULL, &ctx), TPK_EINVAL);
    assert_int_equal(tpk_netsor_kernel(p, x, 0, NULL, NULL, NULL), TPK_EINVAL);
    tpk_array *x3 = random_inputs(3, 2, 4, 62); /* 2 slots, program has 1 */
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_netsor_kernel(p, x3, 0, &K, NULL, &ctx), TPK_EINVAL);
    assert_non_null(strstr(ctx.msg, "rank"));
    x->data[1] = NAN;
    assert_int_equal(tpk_netsor_kernel(p, x, 0, &K, NULL, NULL), TPK_EDOM);
    x->data[1] = 0.5;
    /* a body reading an undefined variable, a malformed body, a bad A-var, a bad slot */
    tpk_instr *nl = NULL;
    for (int k = 0; k < p->ninstr; k++)
        if (p->instr[k].op == TPK_OP_NONLIN)
            nl = &p->instr[k];
    int saved = nl->body.node[0].var;
    nl->body.node[0].var = p->nvars + 3;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_netsor_kernel(p, x, 0, &K, NULL, &ctx), TPK_EINVAL);
    assert_non_null(strstr(ctx.msg, "not a defined"));
    nl->body.node[0].var = saved;
    nl->body.node[1].op = TPK_RPN_ADD;
    assert_int_equal(tpk_netsor_kernel(p, x, 0, &K, NULL, NULL), TPK_EINVAL);
    nl->body.node[1].op = TPK_RPN_CALL;
    for (int k = 0; k < p->ninstr; k++)
        if (p->instr[k].op == TPK_OP_MATMUL) {
            p->instr[k].avar = 9;
            assert_int_equal(tpk_netsor_kernel(p, x, 0, &K, NULL, NULL), TPK_EINVAL);
            p->instr[k].avar = 0;
        } else if (p->instr[k].op == TPK_OP_EMBED) {
            p->instr[k].src = 1;
            assert_int_equal(tpk_netsor_kernel(p, x, 0, &K, NULL, NULL), TPK_EINVAL);
            p->instr[k].src = 0;
        }
    p->output[0].var = -1.0;
    assert_int_equal(tpk_netsor_kernel(p, x, 0, &K, NULL, NULL), TPK_EINVAL);
    p->output[0].var = 1.0;
    assert_int_equal(tpk_netsor_kernel(p, x, 0, &K, NULL, NULL), TPK_OK);
    assert_null(NULL);
    tpk_array_free(K);
    tpk_array_free(x);
    tpk_array_free(x3);
    tpk_nsr_prog_free(p);
}

/* The final kernel's PSD check (nsr_check_psd): K = Q diag(λ) Qᵀ with Q a product of two random
 * Householder reflections. PSD, rank-deficient and slightly negative within the tolerance pass;
 * an eigenvalue clearly below −1e-9·λ_max fails, naming it. The Cholesky shortcut and the
 * eigenvalues must agree on every case. */
static void psd_case(size_t n, double lam_min, int nneg, int rank, int want)
{
    double *K = calloc(n * n, sizeof *K), *u = malloc(n * sizeof *u), *w = malloc(n * sizeof *w);
    double *Q = calloc(n * n, sizeof *Q), *lam = malloc(n * sizeof *lam);
    assert_true(K && u && w && Q && lam);
    uint64_t seed = 2385 + n;
    for (size_t i = 0; i < n; i++)
        Q[i * n + i] = 1;
    for (int h = 0; h < 2; h++) { /* Q ← Q (I − 2uuᵀ) */
        double nn = 0;
        for (size_t i = 0; i < n; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            u[i] = (double)(seed >> 11) / 9007199254740992.0 - 0.5;
            nn += u[i] * u[i];
        }
        for (size_t i = 0; i < n; i++)
            u[i] /= sqrt(nn);
        for (size_t i = 0; i < n; i++) {
            double d = 0;
            for (size_t j = 0; j < n; j++)
                d += Q[i * n + j] * u[j];
            for (size_t j = 0; j < n; j++)
                Q[i * n + j] -= 2 * d * u[j];
        }
    }
    for (size_t k = 0; k < n; k++)
        lam[k] = k < (size_t)rank ? 1.7 + 3.1 * (double)k / (double)n : 0;
    for (int k = 0; k < nneg; k++)
        lam[n - 1 - (size_t)k] = lam_min * 4.8; /* λ_max = 4.8 */
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j <= i; j++) {
            double a = 0;
            for (size_t k = 0; k < n; k++)
                a += Q[i * n + k] * lam[k] * Q[j * n + k];
            K[i * n + j] = K[j * n + i] = a;
        }
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    int st = nsr_check_psd(K, n, 1e-15, &ctx);
    if ((st == TPK_OK) != want)
        print_message("n %zu, λ_min %g·λ_max, %d negative, rank %d: status %d %s\n", n, lam_min,
                      nneg, rank, st, ctx.msg);
    assert_int_equal(st == TPK_OK, want);
    if (!want) {
        assert_int_equal(st, TPK_ENUMERIC);
        assert_non_null(strstr(ctx.msg, "not PSD"));
    }
    free(K), free(u), free(w), free(Q), free(lam);
}

static void test_psd_check(void **state)
{
    (void)state;
    psd_case(120, 0, 0, 120, 1);       /* PSD */
    psd_case(150, 0, 0, 7, 1);         /* rank 7 of 150: zero eigenvalues in rounding */
    psd_case(130, -2e-10, 3, 130, 1);  /* negative within PSD_REL = 1e-9 */
    psd_case(140, -1e-6, 1, 140, 0);   /* one clearly negative eigenvalue */
    psd_case(160, -3e-8, 2, 20, 0);    /* rank-deficient with a negative pair */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_relu_closed_form),
        cmocka_unit_test(test_mlp_tanh_quadrature),
        cmocka_unit_test(test_rnn_erf_vs_recursion),
        cmocka_unit_test(test_rnn_untied_no_cross_time),
        cmocka_unit_test(test_three_arg_vs_monte_carlo),
        cmocka_unit_test(test_factorised_vs_generic),
        cmocka_unit_test(test_moment_centring),
        cmocka_unit_test(test_front_end_programs),
        cmocka_unit_test(test_readout_bias_documented),
        cmocka_unit_test(test_layernorm_program),
        cmocka_unit_test(test_degenerate_inputs),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_psd_check),
    };
    return cmocka_run_group_tests(tests, tu_phis_setup, tu_phis_teardown);
}
