/* The limit NTK of NETSOR programs (tpk_netsor_ntk; theory.md §8) against independent
 * references: the MLP's layer recursion with the arc-cosine and erf closed forms (written here,
 * in neural-tangents' forward form Θ ← Σ + σ_w² Θ·E[φ′φ′], and in Tensor Programs II's
 * parameterisation), the RNN's recursion over pairs of time steps (tied weights: every pair of
 * uses of W), and brute force: the empirical NTK J Jᵀ of finite networks, gradients written out
 * by hand, averaged over seeds at width 1024. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpk/tpk.h"
#include "support/testutil.h"
#include "ntk_nt_reference.h"
#include "rnn_ntk_reference.h"

static const double PI = 3.14159265358979323846;

static double gauss(uint64_t *s)
{
    return tu_normal(s);
}

static tpk_array *inputs(size_t N, size_t T, size_t d, uint64_t seed)
{
    size_t dims[3] = {N, T, d};
    tpk_array *x = T > 1 ? tpk_array_alloc(3, dims, NULL) : tpk_array_alloc2(N, d, NULL);
    assert_non_null(x);
    for (size_t i = 0; i < tpk_array_size(x); i++)
        x->data[i] = (0.4 + 0.5 * (double)(i * N / tpk_array_size(x))) * gauss(&seed);
    return x;
}

static tpk_program *load(void **state, const char *src)
{
    const tu_phis *f = *state;
    tpk_netsor_opts o = {.netsor_plus = 1};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_program *p = tpk_netsor_load_string("<ntk>", src, &o, f->reg, &ctx);
    if (p == NULL)
        print_message("%s\n", ctx.msg);
    assert_non_null(p);
    return p;
}

static void ntk(const tpk_program *p, const tpk_array *x, int param, tpk_array **K, tpk_array **Th)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    int st = tpk_netsor_ntk(p, x, 1, param, K, Th, NULL, &ctx);
    if (st)
        print_message("ntk: %s\n", ctx.msg);
    assert_int_equal(st, TPK_OK);
}

/* E[φ(u)φ(v)] and E[φ′(u)φ′(v)] for (u, v) ~ N(0, [[q1, c], [c, q2]]): relu (arc-cosine kernels of
 * orders 1 and 0) and erf. */
static void expect(int relu, double q1, double q2, double c, double *ff, double *dd)
{
    if (relu) {
        double r = c / sqrt(q1 * q2);
        r = r > 1 ? 1 : r < -1 ? -1 : r;
        double th = acos(r);
        *ff = sqrt(q1 * q2) / (2 * PI) * (sin(th) + (PI - th) * cos(th));
        *dd = (PI - th) / (2 * PI);
    } else {
        double a = (1 + 2 * q1) * (1 + 2 * q2);
        *ff = 2 / PI * asin(2 * c / sqrt(a));
        *dd = 4 / PI / sqrt(a - 4 * c * c);
    }
}

#define MLP_SRC                                                                                    \
    "param L = %d\nparam phi = %s\nparam sw = 1.7\nparam sb = 0.12\nparam sv = 0.9\n"           \
    "param sob = 0.05\nwidth n\ninput x : d\nA W1 : (n, d) ~ sw\nA W[l in 2..L] : (n, n) ~ sw\n"    \
    "G b[l in 1..L] : n ~ N(0, sb)\ng[1] = W1 x + b[1]\nh[1] = phi(g[1])\n"                       \
    "for l in 2..L {\n  g[l] = W[l] h[l - 1] + b[l]\n  h[l] = phi(g[l])\n}\n"                     \
    "output y = readout(h[L], sv, sob)\n"

/* The MLP's NNGP and NTK by the layer recursion (theory.md §8.1): Σ¹ = σ_w² x·x̄/d + σ_b², then
 * Σˡ = σ_w² E[φφ](Σˡ⁻¹) + σ_b², Θˡ = w Σ-part + σ_w² E[φ′φ′](Σˡ⁻¹) Θˡ⁻¹, readout likewise. */
static void mlp_reference(int relu, int L, int tp, const tpk_array *x, double *K, double *Th)
{
    const double sw = 1.7, sb = 0.12, sv = 0.9, sob = 0.05;
    size_t N = x->dims[0], d = x->dims[1];
    double *S = malloc(N * N * sizeof *S), *T = malloc(N * N * sizeof *T);
    assert_true(S && T);
    for (size_t a = 0; a < N; a++)
        for (size_t c = 0; c < N; c++) {
            double dot = 0;
            for (size_t i = 0; i < d; i++)
                dot += x->data[a * d + i] * x->data[c * d + i];
            S[a * N + c] = sw * dot / (double)d + sb;
            T[a * N + c] = tp ? dot / (double)d + 1 : S[a * N + c];
        }
    double *S2 = malloc(N * N * sizeof *S2), *T2 = malloc(N * N * sizeof *T2);
    assert_true(S2 && T2);
    for (int l = 2; l <= L + 1; l++) {
        int out = l == L + 1;
        double w2 = out ? sv : sw, b2 = out ? sob : sb;
        for (size_t a = 0; a < N; a++)
            for (size_t c = 0; c < N; c++) {
                double ff, dd;
                expect(relu, S[a * N + a], S[c * N + c], S[a * N + c], &ff, &dd);
                S2[a * N + c] = w2 * ff + b2;
                T2[a * N + c] = (tp ? ff + 1 : w2 * ff + b2) + w2 * dd * T[a * N + c];
            }
        memcpy(S, S2, N * N * sizeof *S);
        memcpy(T, T2, N * N * sizeof *T);
    }
    memcpy(K, S, N * N * sizeof *K);
    memcpy(Th, T, N * N * sizeof *Th);
    free(S);
    free(S2);
    free(T);
    free(T2);
}

static void test_mlp_closed_forms(void **state)
{
    size_t N = 5;
    tpk_array *x = inputs(N, 1, 4, 21);
    double *K = malloc(N * N * sizeof *K), *T = malloc(N * N * sizeof *T);
    for (int relu = 0; relu < 2; relu++)
        for (int L = 1; L <= 4; L += 3)
            for (int tp = 0; tp < 2; tp++) {
                char src[2048];
                snprintf(src, sizeof src, MLP_SRC, L, relu ? "relu" : "erf");
                tpk_program *p = load(state, src);
                tpk_array *Kp = NULL, *Tp = NULL;
                ntk(p, x, tp ? TPK_NTK_PARAM_TP : TPK_NTK_PARAM_NTK, &Kp, &Tp);
                mlp_reference(relu, L, tp, x, K, T);
                double ek = 0, et = 0, scale = 0;
                for (size_t i = 0; i < N * N; i++) {
                    ek = fmax(ek, fabs(Kp->data[i] - K[i]));
                    et = fmax(et, fabs(Tp->data[i] - T[i]));
                    scale = fmax(scale, fabs(T[i]));
                }
                print_message("mlp %s L=%d %s: K %.1e, Θ %.1e (|Θ| ≤ %.3g)\n",
                              relu ? "relu" : "erf", L, tp ? "TP" : "NT", ek, et, scale);
                assert_true(ek < 1e-12 * scale);
                assert_true(et < 1e-12 * scale);
                tpk_array_free(Kp);
                tpk_array_free(Tp);
                tpk_program_free(p);
            }
    free(K);
    free(T);
    tpk_array_free(x);
}

/* A gate: h = erf(g1)·erf(g2) with g1, g2 from independent weights. Its partials are
 * erf′(g1)·erf(g2) and erf(g1)·erf′(g2), and T(g1, ḡ2) = 0, so
 * Θ = K + σ_v² (E[erf′erf′](C1) E[erf erf](C2) C1 + E[erf erf](C1) E[erf′erf′](C2) C2). */
static void test_gate_product(void **state)
{
    tpk_program *p = load(state, "width n\ninput x : d\nA W1 : (n, d) ~ 1.4\nA W2 : (n, d) ~ 0.6\n"
                                 "G b : n ~ N(0, 0.2)\ng1 = W1 x + b\ng2 = W2 x\n"
                                 "h = erf(g1) * erf(g2)\noutput y = readout(h, 1.3)\n");
    size_t N = 4, d = 3;
    tpk_array *x = inputs(N, 1, d, 5);
    tpk_array *K = NULL, *Th = NULL;
    ntk(p, x, TPK_NTK_PARAM_NTK, &K, &Th);
    double worst = 0;
    for (size_t a = 0; a < N; a++)
        for (size_t c = 0; c < N; c++) {
            double C1[3], C2[3]; /* (a,a), (c,c), (a,c) */
            size_t pr[3][2] = {{a, a}, {c, c}, {a, c}};
            for (int k = 0; k < 3; k++) {
                double dot = 0;
                for (size_t i = 0; i < d; i++)
                    dot += x->data[pr[k][0] * d + i] * x->data[pr[k][1] * d + i];
                C1[k] = 1.4 * dot / (double)d + 0.2;
                C2[k] = 0.6 * dot / (double)d;
            }
            double f1, d1, f2, d2;
            expect(0, C1[0], C1[1], C1[2], &f1, &d1);
            expect(0, C2[0], C2[1], C2[2], &f2, &d2);
            double k = 1.3 * f1 * f2, t = k + 1.3 * (d1 * f2 * C1[2] + f1 * d2 * C2[2]);
            worst = fmax(worst, fmax(fabs(K->data[a * N + c] - k), fabs(Th->data[a * N + c] - t)));
        }
    print_message("gate product: %.1e\n", worst);
    assert_true(worst < 1e-13);
    tpk_array_free(K);
    tpk_array_free(Th);
    tpk_array_free(x);
    tpk_program_free(p);
}

#define RNN_SRC                                                                                    \
    "param T = 3\nparam phi = %s\nwidth n\ninput x[t in 1..T] : d\nA W : (n, n) ~ 1.3\n"         \
    "A U : (n, d) ~ 0.8\nG b : n ~ N(0, 0.1)\ns[0] = 0\n"                                         \
    "for t in 1..T {\n  g[t] = W s[t - 1] + U x[t] + b\n  s[t] = phi(g[t])\n}\n"                   \
    "output y[t in 1..T] = readout(s[t], 1.1)\n"
enum { RT = 3 };
static const double RW = 1.3, RU = 0.8, RB = 0.1, RV = 1.1;

/* The RNN's NNGP and NTK over every pair of (sequence, step), NT's parameterisation: Σ(t, r) =
 * σ_W² E[φφ](t−1, r−1) + σ_U² x^t·x̄^r/d + σ_b², T(t, r) = Σ(t, r) + σ_W² E[φ′φ′](t−1, r−1) T(t−1,
 * r−1): W is used at every step, and its uses at steps t and r meet (theory.md §8.4). */
static void rnn_reference(int relu, const tpk_array *x, double *K, double *Th)
{
    size_t N = x->dims[0], d = x->dims[2], M = N * RT;
    double *S = calloc(M * M, sizeof *S), *T = calloc(M * M, sizeof *T);
    assert_true(S && T);
#define IX(a, t) ((a) * RT + (t))
    for (int t = 0; t < RT; t++)
        for (int r = 0; r < RT; r++)
            for (size_t a = 0; a < N; a++)
                for (size_t c = 0; c < N; c++) {
                    double dot = 0;
                    for (size_t i = 0; i < d; i++)
                        dot += x->data[(a * RT + t) * d + i] * x->data[(c * RT + r) * d + i];
                    double s = RU * dot / (double)d + RB, tt = 0;
                    if (t > 0 && r > 0) {
                        double ff, dd;
                        expect(relu, S[IX(a, t - 1) * M + IX(a, t - 1)],
                               S[IX(c, r - 1) * M + IX(c, r - 1)], S[IX(a, t - 1) * M + IX(c, r - 1)],
                               &ff, &dd);
                        s += RW * ff;
                        tt = RW * dd * T[IX(a, t - 1) * M + IX(c, r - 1)];
                    }
                    S[IX(a, t) * M + IX(c, r)] = s;
                    T[IX(a, t) * M + IX(c, r)] = s + tt;
                }
    for (size_t i = 0; i < M; i++)
        for (size_t j = 0; j < M; j++) {
            double ff, dd;
            expect(relu, S[i * M + i], S[j * M + j], S[i * M + j], &ff, &dd);
            K[i * M + j] = RV * ff;
            Th[i * M + j] = RV * ff + RV * dd * T[i * M + j];
        }
#undef IX
    free(S);
    free(T);
}

/* The empirical NTK of finite RNNs of width n (NT's parameterisation), by backpropagation
 * through time: one gradient vector per output (sequence a, step t) over every parameter
 * (ω_W, ω_U, β, ω_v), Θ̂ = G Gᵀ, averaged over `seeds` networks. The weights are the ones
 * tpk_netsor_run draws for seed 1000 + s (tpk/rng.h streams keyed by the names W, U, b and the
 * readout's), so one network's Θ̂ can be compared with tpk_netsor_run_ntk's entry by entry. */
static void rnn_empirical_param(int relu, const tpk_array *x, size_t n, int seeds, int param,
                                double *Th)
{
    size_t N = x->dims[0], d = x->dims[2], M = N * RT;
    size_t P = n * n + n * d + n + n;
    double *G = malloc(M * P * sizeof *G), *W = malloc(n * n * sizeof *W),
           *U = malloc(n * d * sizeof *U), *b = malloc(n * sizeof *b), *v = malloc(n * sizeof *v);
    double *g = malloc((RT + 1) * n * sizeof *g), *s = malloc((RT + 1) * n * sizeof *s);
    double *del = malloc(n * sizeof *del), *nd = malloc(n * sizeof *nd);
    assert_true(G && W && U && b && v && g && s && del && nd);
    const double cw = sqrt(RW / (double)n), cu = sqrt(RU / (double)d), cb = sqrt(RB),
                 cv = sqrt(RV / (double)n);
    memset(Th, 0, M * M * sizeof *Th);
    for (int seed = 0; seed < seeds; seed++) {
        uint64_t sd = 1000 + (uint64_t)seed;
        for (size_t i = 0; i < n; i++) {
            tpk_rng_normal_row(sd, tpk_rng_stream_named(TPK_RNG_AVAR, "W"), (uint32_t)i, 0,
                               (uint32_t)n, W + i * n);
            tpk_rng_normal_row(sd, tpk_rng_stream_named(TPK_RNG_EMBED, "U"), (uint32_t)i, 0,
                               (uint32_t)d, U + i * d);
            b[i] = tpk_rng_normal_at(sd, tpk_rng_stream_named(TPK_RNG_BIAS, "b"), (uint32_t)i, 0);
            v[i] = tpk_rng_normal_at(sd, TPK_RNG_STREAM(TPK_RNG_READOUT, 0), (uint32_t)i, 0);
        }
        memset(G, 0, M * P * sizeof *G);
        for (size_t a = 0; a < N; a++) {
            memset(s, 0, n * sizeof *s);
            for (int t = 1; t <= RT; t++) {
                const double *xt = x->data + (a * RT + (size_t)(t - 1)) * d;
                for (size_t i = 0; i < n; i++) {
                    double acc = cb * b[i];
                    for (size_t j = 0; j < n; j++)
                        acc += cw * W[i * n + j] * s[(size_t)(t - 1) * n + j];
                    for (size_t j = 0; j < d; j++)
                        acc += cu * U[i * d + j] * xt[j];
                    g[(size_t)t * n + i] = acc;
                    s[(size_t)t * n + i] = relu ? fmax(acc, 0) : erf(acc);
                }
            }
            for (int t = 1; t <= RT; t++) {
                double *gr = G + (a * RT + (size_t)(t - 1)) * P;
                for (size_t i = 0; i < n; i++) /* ∂y/∂ω_v */
                    gr[n * n + n * d + n + i] = cv * s[(size_t)t * n + i];
                for (size_t i = 0; i < n; i++) {
                    double z = g[(size_t)t * n + i];
                    del[i] = cv * v[i] * (relu ? (z > 0) : 2 / sqrt(PI) * exp(-z * z));
                }
                for (int u = t; u >= 1; u--) {
                    const double *xu = x->data + (a * RT + (size_t)(u - 1)) * d;
                    for (size_t i = 0; i < n; i++) {
                        for (size_t j = 0; j < n; j++)
                            gr[i * n + j] += cw * del[i] * s[(size_t)(u - 1) * n + j];
                        for (size_t j = 0; j < d; j++)
                            gr[n * n + i * d + j] += cu * del[i] * xu[j];
                        gr[n * n + n * d + i] += cb * del[i];
                    }
                    if (u == 1)
                        break;
                    for (size_t j = 0; j < n; j++) {
                        double acc = 0;
                        for (size_t i = 0; i < n; i++)
                            acc += cw * W[i * n + j] * del[i];
                        double z = g[(size_t)(u - 1) * n + j];
                        nd[j] = acc * (relu ? (z > 0) : 2 / sqrt(PI) * exp(-z * z));
                    }
                    memcpy(del, nd, n * sizeof *del);
                }
            }
        }
        /* the gradients in the other parameterisations' parameters (theory.md §8.7): by ω ~ N(0,
         * σ²) (TP II) the NT gradient over σ; by the weights' own entries (standard) over its
         * scale c */
        const double f[4] = {param == TPK_NTK_PARAM_TP ? 1 / sqrt(RW) : param ? 1 / cw : 1,
                             param == TPK_NTK_PARAM_TP ? 1 / sqrt(RU) : param ? 1 / cu : 1,
                             param == TPK_NTK_PARAM_TP ? 1 / sqrt(RB) : param ? 1 / cb : 1,
                             param == TPK_NTK_PARAM_TP ? 1 / sqrt(RV) : param ? 1 / cv : 1};
        const size_t seg[5] = {0, n * n, n * n + n * d, n * n + n * d + n, P};
        for (size_t i = 0; i < M; i++)
            for (int k = 0; k < 4; k++)
                for (size_t j = seg[k]; j < seg[k + 1]; j++)
                    G[i * P + j] *= f[k];
        for (size_t i = 0; i < M; i++)
            for (size_t j = 0; j <= i; j++) {
                double acc = 0;
                for (size_t k = 0; k < P; k++)
                    acc += G[i * P + k] * G[j * P + k];
                Th[i * M + j] += acc / seeds;
                if (j < i)
                    Th[j * M + i] += acc / seeds;
            }
    }
    free(G);
    free(W);
    free(U);
    free(b);
    free(v);
    free(g);
    free(s);
    free(del);
    free(nd);
}

static void rnn_empirical(int relu, const tpk_array *x, size_t n, int seeds, double *Th)
{
    rnn_empirical_param(relu, x, n, seeds, TPK_NTK_PARAM_NTK, Th);
}

static double rel_frob(const double *A, const double *B, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (A[i] - B[i]) * (A[i] - B[i]);
        den += B[i] * B[i];
    }
    return sqrt(num / den);
}

static void test_rnn_tied(void **state)
{
    size_t N = 3, M = N * RT;
    tpk_array *x = inputs(N, RT, 2, 8);
    double *K = malloc(M * M * sizeof *K), *T = malloc(M * M * sizeof *T),
           *E = malloc(M * M * sizeof *E), *E2 = malloc(M * M * sizeof *E2);
    for (int relu = 0; relu < 2; relu++) {
        char src[2048];
        snprintf(src, sizeof src, RNN_SRC, relu ? "relu" : "erf");
        tpk_program *p = load(state, src);
        tpk_array *Kp = NULL, *Tp = NULL;
        ntk(p, x, TPK_NTK_PARAM_NTK, &Kp, &Tp);
        rnn_reference(relu, x, K, T);
        double ek = 0, et = 0, scale = 0;
        for (size_t i = 0; i < M * M; i++) {
            ek = fmax(ek, fabs(Kp->data[i] - K[i]));
            et = fmax(et, fabs(Tp->data[i] - T[i]));
            scale = fmax(scale, fabs(T[i]));
        }
        /* tpk_netsor_run_ntk's backward pass against backpropagation through time written out
         * here, on the same network (the same weights): equal to rounding */
        for (int param = 0; param < 3; param++) { /* NT's 'ntk', TP II's, NT's 'standard' */
            tpk_array *Kh = NULL, *Th = NULL;
            tpk_ctx ctx;
            tpk_ctx_init(&ctx);
            assert_int_equal(tpk_netsor_run_ntk(p, x, 48, 1000, 1, param, &Kh, &Th, &ctx), TPK_OK);
            rnn_empirical_param(relu, x, 48, 1, param, E);
            double ex = 0, es = 0;
            for (size_t i = 0; i < M * M; i++) {
                ex = fmax(ex, fabs(Th->data[i] - E[i]));
                es = fmax(es, fabs(E[i]));
            }
            print_message("rnn %s, %s: tpk_netsor_run_ntk against BPTT at n = 48: %.1e relative\n",
                          relu ? "relu" : "erf", tpk_ntk_param_name(param), ex / es);
            assert_true(ex < 1e-12 * es);
            tpk_array_free(Kh);
            tpk_array_free(Th);
        }
        /* finite networks: the relative error falls as n^(-1/2) toward the limit */
        rnn_empirical(relu, x, 128, 4, E);
        rnn_empirical(relu, x, 1024, 4, E2);
        double r1 = rel_frob(E, Tp->data, M * M), r2 = rel_frob(E2, Tp->data, M * M);
        print_message("rnn %s: K %.1e, Θ %.1e against the recursion; finite width: relative "
                      "error %.3f (n = 128), %.3f (n = 1024)\n", relu ? "relu" : "erf", ek, et,
                      r1, r2);
        assert_true(ek < 1e-12 * scale && et < 1e-12 * scale);
        assert_true(r2 < 0.6 * r1 && r2 < 0.08);
        tpk_array_free(Kp);
        tpk_array_free(Tp);
        tpk_program_free(p);
    }
    free(K);
    free(T);
    free(E);
    free(E2);
    tpk_array_free(x);
}

static tpk_program *load_shipped(void **state, const char *rel, const tpk_param_set *sets, int n)
{
    const tu_phis *f = *state;
    return tu_load_shipped(f->reg, rel, sets, n);
}

/* neural-tangents 0.6.5's analytic NNGP and NTK (parameterization='ntk', float64;
 * tests/ntk_nt_reference.h) of MLPs (relu, erf; depths 1, 3, 10; LayerNorm) and of a 3×3
 * circular cnn2d with GAP and flatten readouts, computed from the shipped programs. The CNN's
 * outputs are one per position sharing the readout: flatten is the mean of the position
 * diagonal, GAP the mean of all position pairs. */
static void test_neural_tangents(void **state)
{
    char L[16], ph[16], w2[32], b2[32];
    snprintf(w2, sizeof w2, "%.17g", NTREF_SIGMA_W2);
    snprintf(b2, sizeof b2, "%.17g", NTREF_SIGMA_B2);
    for (int c = 0; c < NTREF_NCASES; c++) {
        const struct ntref_case *k = &ntref_cases[c];
        int cnn = strcmp(k->arch, "cnn2d") == 0;
        snprintf(L, sizeof L, "%d", k->depth);
        snprintf(ph, sizeof ph, "%s", k->phi);
        tpk_param_set sets[10] = {{"L", L}, {"phi", ph}, {"sigma_w2", w2}, {"sigma_b2", b2},
                                  {"sigma_u2", w2}, {"sigma_v2", w2}, {"sigma_ob2", b2},
                                  {"rows", "8"}, {"cols", "8"}, {"circular", "1"}};
        tpk_program *p = load_shipped(state, cnn ? "programs/cnn2d.nsr"
                                      : k->layernorm ? "programs/mlp-ln.nsr" : "programs/mlp.nsr",
                                      sets, cnn ? 10 : 7);
        size_t n = (size_t)k->n, P = cnn ? NTREF_CNN_H * NTREF_CNN_W : 1;
        size_t dims[3] = {n, P, cnn ? NTREF_CNN_C : NTREF_MLP_D};
        tpk_array *x = cnn ? tpk_array_alloc(3, dims, NULL) : tpk_array_alloc2(n, dims[2], NULL);
        assert_non_null(x);
        memcpy(x->data, k->x, tpk_array_size(x) * sizeof *x->data);
        tpk_array *K = NULL, *Th = NULL, *Ts = NULL;
        ntk(p, x, TPK_NTK_PARAM_NTK, &K, &Th);
        /* 'standard' at neural-tangents' widths: 64 hidden units, 16 channels */
        tpk_ntk_opts so = {TPK_NTK_PARAM_STANDARD, cnn ? NTREF_CNN_CHANNELS : NTREF_MLP_WIDTH, NULL};
        tpk_ctx sctx;
        tpk_ctx_init(&sctx);
        assert_int_equal(tpk_netsor_ntk_ex(p, x, 1, &so, NULL, &Ts, NULL, &sctx), TPK_OK);
        double ek = 0, et = 0, sk = 0, st = 0, es = 0, ss = 0;
        for (size_t a = 0; a < n; a++)
            for (size_t b = 0; b < n; b++) {
                double kk = 0, tt = 0, ts = 0;
                size_t dim = n * P;
                for (size_t p1 = 0; p1 < P; p1++)
                    for (size_t p2 = 0; p2 < P; p2++) {
                        if (strcmp(k->readout, "flatten") == 0 && p1 != p2)
                            continue;
                        kk += K->data[(a * P + p1) * dim + b * P + p2];
                        tt += Th->data[(a * P + p1) * dim + b * P + p2];
                        ts += Ts->data[(a * P + p1) * dim + b * P + p2];
                    }
                double cnt = strcmp(k->readout, "gap") == 0 ? (double)(P * P) : (double)P;
                kk /= cnt;
                tt /= cnt;
                ts /= cnt;
                /* flatten's readout has P·n entries of its own: not the mean of the diagonal of
                 * outputs that share one readout vector, in the standard parameterisation */
                if (strcmp(k->readout, "flatten") != 0) {
                    es = fmax(es, fabs(ts - k->ntk_std[a * n + b]));
                    ss = fmax(ss, fabs(k->ntk_std[a * n + b]));
                }
                ek = fmax(ek, fabs(kk - k->nngp[a * n + b]));
                et = fmax(et, fabs(tt - k->ntk[a * n + b]));
                sk = fmax(sk, fabs(k->nngp[a * n + b]));
                st = fmax(st, fabs(k->ntk[a * n + b]));
            }
        print_message("%-20s NNGP %.1e, NTK %.1e, standard NTK %.1e relative\n", k->name, ek / sk,
                      et / st, ss > 0 ? es / ss : 0.0);
        assert_true(ek < 1e-12 * sk);
        assert_true(et < 1e-12 * st);
        assert_true(es <= 1e-12 * ss);
        tpk_array_free(K);
        tpk_array_free(Th);
        tpk_array_free(Ts);
        tpk_array_free(x);
        tpk_program_free(p);
    }
}

/* An independent numpy implementation of Tensor Programs II's RNN recursion
 * (tests/rnn_ntk_reference.h: every pair (t, r) of uses of W and U summed, in TP II's
 * parameterisation and in neural-tangents'), on programs/rnn.nsr with every output. */
static void test_rnn_reference(void **state)
{
    char w[32], u[32], b[32], v[32], T[16];
    snprintf(w, sizeof w, "%.17g", rref_param[0]);
    snprintf(u, sizeof u, "%.17g", rref_param[1]);
    snprintf(b, sizeof b, "%.17g", rref_param[2]);
    snprintf(v, sizeof v, "%.17g", rref_param[3]);
    snprintf(T, sizeof T, "%d", RREF_T);
    size_t dims[3] = {RREF_N, RREF_T, RREF_D}, M = RREF_N * RREF_T;
    tpk_array *x = tpk_array_alloc(3, dims, NULL);
    assert_non_null(x);
    memcpy(x->data, rref_x, tpk_array_size(x) * sizeof *x->data);
    for (int c = 0; c < 6; c++) {
        const struct rref_case *k = &rref_cases[c];
        if (strcmp(k->readout, "all") != 0)
            continue;
        tpk_param_set sets[6] = {{"phi", k->phi}, {"sigma_w2", w}, {"sigma_u2", u},
                                 {"sigma_b2", b}, {"sigma_v2", v}, {"T", T}};
        tpk_program *p = load_shipped(state, "programs/rnn.nsr", sets, 6);
        for (int tp = 0; tp < 2; tp++) {
            tpk_array *K = NULL, *Th = NULL;
            ntk(p, x, tp ? TPK_NTK_PARAM_TP : TPK_NTK_PARAM_NTK, &K, &Th);
            const double *ref = tp ? k->ntk : k->ntk_nt;
            double ek = 0, et = 0, sc = 0;
            for (size_t i = 0; i < M * M; i++) {
                ek = fmax(ek, fabs(K->data[i] - k->nngp[i]));
                et = fmax(et, fabs(Th->data[i] - ref[i]));
                sc = fmax(sc, fabs(ref[i]));
            }
            print_message("rnn %s (%s): NNGP %.1e, NTK %.1e relative\n", k->phi,
                          tp ? "TP II" : "NT", ek / sc, et / sc);
            assert_true(ek < 1e-10 * sc && et < 1e-10 * sc);
            tpk_array_free(K);
            tpk_array_free(Th);
        }
        tpk_program_free(p);
    }
    tpk_array_free(x);
}

/* LayerNorm at finite width: tpk_netsor_run_ntk differentiates the Moments (mean, variance)
 * exactly. Against the textbook LayerNorm backward pass written here, dg = (dĥ − mean dĥ −
 * ĥ·mean(dĥ ĥ))/σ, on the same weights (the tpk/rng.h streams of U, b[1] and the readout), for
 * programs/mlp-ln.nsr with one layer; and the finite networks approach the limit NTK. */
static void test_layernorm_finite(void **state)
{
    const double su = 1.6, sb = 0.2, sv = 1.1, sob = 0.05, eps = 1e-5;
    tpk_param_set sets[7] = {{"L", "1"}, {"sigma_u2", "1.6"}, {"sigma_b2", "0.2"},
                             {"sigma_v2", "1.1"}, {"sigma_ob2", "0.05"}, {"ln_eps", "1e-5"},
                             {"phi", "relu"}};
    tpk_program *p = load_shipped(state, "programs/mlp-ln.nsr", sets, 7);
    size_t N = 4, d = 3, n = 40;
    tpk_array *x = inputs(N, 1, d, 31);
    tpk_array *Kh = NULL, *Th = NULL;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_netsor_run_ntk(p, x, n, 7, 0, TPK_NTK_PARAM_NTK, &Kh, &Th, &ctx), TPK_OK);
    double *U = malloc(n * d * sizeof *U), *b = malloc(n * sizeof *b), *v = malloc(n * sizeof *v);
    double *dg = malloc(N * n * sizeof *dg), *h = malloc(N * n * sizeof *h);
    assert_true(U && b && v && dg && h);
    for (size_t i = 0; i < n; i++) {
        tpk_rng_normal_row(7, tpk_rng_stream_named(TPK_RNG_EMBED, "U"), (uint32_t)i, 0,
                           (uint32_t)d, U + i * d);
        b[i] = sqrt(sb) * tpk_rng_normal_at(7, tpk_rng_stream_named(TPK_RNG_BIAS, "b[1]"), (uint32_t)i, 0);
        v[i] = tpk_rng_normal_at(7, TPK_RNG_STREAM(TPK_RNG_READOUT, 0), (uint32_t)i, 0);
    }
    const double cu = sqrt(su / (double)d), cv = sqrt(sv / (double)n);
    for (size_t a = 0; a < N; a++) {
        double g[64], hh[64], dh[64], m = 0, var = 0;
        for (size_t i = 0; i < n; i++) {
            g[i] = b[i];
            for (size_t j = 0; j < d; j++)
                g[i] += cu * U[i * d + j] * x->data[a * d + j];
            m += g[i] / (double)n;
        }
        for (size_t i = 0; i < n; i++)
            var += (g[i] - m) * (g[i] - m) / (double)n;
        double sg = sqrt(var + eps), mdh = 0, mdhh = 0;
        for (size_t i = 0; i < n; i++) {
            hh[i] = (g[i] - m) / sg;
            h[a * n + i] = fmax(hh[i], 0);
            dh[i] = cv * v[i] * (hh[i] > 0);
            mdh += dh[i] / (double)n;
            mdhh += dh[i] * hh[i] / (double)n;
        }
        for (size_t i = 0; i < n; i++)
            dg[a * n + i] = (dh[i] - mdh - hh[i] * mdhh) / sg;
    }
    double worst = 0, scale = 0;
    for (size_t a = 0; a < N; a++)
        for (size_t c = 0; c < N; c++) {
            double xx = 0, gg = 0, hc = 0;
            for (size_t j = 0; j < d; j++)
                xx += x->data[a * d + j] * x->data[c * d + j];
            for (size_t i = 0; i < n; i++) {
                gg += dg[a * n + i] * dg[c * n + i];
                hc += h[a * n + i] * h[c * n + i];
            }
            /* ω_U: (σ_U²/d) x·x̄ dg·dḡ; β_b: σ_b² dg·dḡ; the readout: σ_v²/n h·h̄ + σ_ob² */
            double t = (su / (double)d * xx + sb) * gg + sv / (double)n * hc + sob;
            worst = fmax(worst, fabs(Th->data[a * N + c] - t));
            scale = fmax(scale, fabs(t));
        }
    print_message("layernorm: tpk_netsor_run_ntk against the LayerNorm backward pass at n = %zu: "
                  "%.1e relative\n", n, worst / scale);
    assert_true(worst < 1e-12 * scale);
    tpk_array_free(Kh);
    tpk_array_free(Th);
    free(U);
    free(b);
    free(v);
    free(dg);
    free(h);
    tpk_array_free(x);
    tpk_program_free(p);
}

/* What the NTK refuses, said before any number with file:line:col (tpk_netsor_ntk_check, netsor
 * check --ntk): sqrt(n)-scaled logits (outside Tensor Programs II) and a φ whose derivative is
 * not a function; every other shipped program is taken (batchnorm's limits: test_batchnorm). */
static void test_ntk_check(void **state)
{
    static const char *const ok[] = {"programs/mlp.nsr", "programs/mlp-ln.nsr",
                                     "programs/mlp-residual.nsr", "programs/rnn.nsr",
                                     "programs/rnn_untied.nsr", "programs/gru.nsr",
                                     "programs/lstm.nsr", "programs/transformer.nsr",
                                     "programs/attention.nsr", "programs/cnn1d.nsr",
                                     "programs/cnn2d.nsr", "programs/batchnorm.nsr"};
    tpk_ctx ctx;
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        tpk_program *p = load_shipped(state, ok[i], NULL, 0);
        tpk_ctx_init(&ctx);
        int st = tpk_netsor_ntk_check(p, &ctx);
        if (st)
            print_message("%s: %s\n", ok[i], ctx.msg);
        assert_int_equal(st, TPK_OK);
        tpk_program_free(p);
    }
    static const struct {
        const char *prog, *where, *what;
    } bad[] = {{"programs/attention-sqrtn.nsr", "attention-sqrtn.nsr:", "outside Tensor Programs II"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tpk_program *p = load_shipped(state, bad[i].prog, NULL, 0);
        tpk_ctx_init(&ctx);
        assert_int_equal(tpk_netsor_ntk_check(p, &ctx), TPK_EUNSUPPORTED);
        print_message("%s\n", ctx.msg);
        assert_non_null(strstr(ctx.msg, bad[i].where));
        assert_non_null(strstr(ctx.msg, bad[i].what));
        assert_non_null(strchr(strstr(ctx.msg, bad[i].where) + strlen(bad[i].where), ':'));
        tpk_program_free(p);
    }
    tpk_program *p = load(state, "param phi = step\nwidth n\ninput x : d\nA W : (n, d) ~ 1\n"
                                 "h = phi(W x)\noutput y = readout(h, 1)\n");
    tpk_ctx_init(&ctx);
    assert_int_not_equal(tpk_netsor_ntk_check(p, &ctx), TPK_OK);
    assert_non_null(strstr(ctx.msg, "<ntk>:5:5:"));
    tpk_array *x = inputs(2, 1, 2, 3), *K = NULL, *T = NULL;
    tpk_ctx_init(&ctx);
    assert_int_not_equal(tpk_netsor_ntk(p, x, 0, TPK_NTK_PARAM_NTK, &K, &T, NULL, &ctx), TPK_OK);
    assert_null(T);
    tpk_array_free(x);
    tpk_program_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_closed_forms),
        cmocka_unit_test(test_gate_product),
        cmocka_unit_test(test_rnn_tied),
        cmocka_unit_test(test_neural_tangents),
        cmocka_unit_test(test_rnn_reference),
        cmocka_unit_test(test_layernorm_finite),
        cmocka_unit_test(test_ntk_check),
    };
    return cmocka_run_group_tests(tests, tu_phis_setup, tu_phis_teardown);
}
