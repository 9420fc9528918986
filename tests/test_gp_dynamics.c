/* Infinite-width training dynamics (gp/dynamics.c, issue 36 item 1; theory.md §8.10): against
 * neural-tangents 0.6.5's own predict functions (tests/gd_reference.h, scripts/gd_reference.py),
 * scalar and diagonal closed forms, the t = 0 / t → ∞ limits, NTK = NNGP giving the GP posterior,
 * discrete gradient descent against the iterated affine map, and the error statuses. */
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

#include "tpk/gp.h"

#include "gd_reference.h"

/* NT (jax eigh / cho_solve, float64) vs LAPACK on kernels with κ ≲ 1e3: rounding only. */
#define TOL_NT 1e-10
/* Closed forms and iterations computed here in double. */
#define TOL_CLOSED 1e-12

static double worst_nt; /* largest relative error against NT seen, printed at the end */

/* max|a − b| / max|b| */
static double relerr(const double *a, const double *b, size_t n)
{
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs(a[i] - b[i]));
        s = fmax(s, fabs(b[i]));
    }
    return s > 0 ? d / s : d;
}

static void expect_close(const char *what, const double *a, const double *b, size_t n,
                         double tol)
{
    double e = relerr(a, b, n);
    if (!(e <= tol))
        fail_msg("%s: relative error %.3g > %.3g", what, e, tol);
}

static tpk_array *mat(size_t r, size_t c)
{
    tpk_array *a = tpk_array_alloc2(r, c, NULL);
    assert_non_null(a);
    return a;
}

static tpk_array *arr3(size_t a, size_t b, size_t c)
{
    tpk_array *x = tpk_array_alloc(3, (size_t[]){a, b, c}, NULL);
    assert_non_null(x);
    return x;
}

/* Block [r0, r0+r) × [c0, c0+c) of a P×P row-major matrix. */
static tpk_array *block(const double *full, size_t P, size_t r0, size_t r, size_t c0, size_t c)
{
    tpk_array *a = mat(r, c);
    for (size_t i = 0; i < r; i++)
        for (size_t j = 0; j < c; j++)
            a->data[i * c + j] = full[(r0 + i) * P + c0 + j];
    return a;
}

typedef struct ref {
    tpk_array *tdd, *kdd, *ttd, *ktd, *ktt, *ttt, *y;
} ref;

static ref ref_make(void)
{
    const size_t n = GDREF_N, m = GDREF_M, P = GDREF_N + GDREF_M;
    ref r;
    r.tdd = block(gdref_ntk_full, P, 0, n, 0, n);
    r.kdd = block(gdref_nngp_full, P, 0, n, 0, n);
    r.ttd = block(gdref_ntk_full, P, n, m, 0, n);
    r.ktd = block(gdref_nngp_full, P, n, m, 0, n);
    r.ktt = block(gdref_nngp_full, P, n, m, n, m);
    r.ttt = block(gdref_ntk_full, P, n, m, n, m);
    r.y = mat(n, GDREF_K);
    memcpy(r.y->data, gdref_y, sizeof gdref_y);
    return r;
}

static void ref_free(ref *r)
{
    tpk_array *a[] = {r->tdd, r->kdd, r->ttd, r->ktd, r->ktt, r->ttt, r->y};
    for (size_t i = 0; i < 7; i++)
        tpk_array_free(a[i]);
}

static void nt_case(const char *name, const ref *r, tpk_gd_get get, int test, double reg,
                    const double *want_mean, const double *want_cov)
{
    const size_t T = GDREF_T, rows = test ? GDREF_M : GDREF_N, k = GDREF_K;
    double t[GDREF_T];
    for (size_t i = 0; i + 1 < T; i++)
        t[i] = gdref_times[i];
    t[T - 1] = INFINITY;
    tpk_gd_opts o;
    tpk_gd_opts_default(&o);
    o.lr = gdref_lr;
    o.get = get;
    o.diag_reg = reg;
    tpk_array *mean = arr3(T, rows, k), *cov = arr3(T, rows, rows);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    int st = tpk_gd_mse_ensemble(r->tdd, r->kdd, test ? r->ttd : NULL, test ? r->ktd : NULL,
                                 test ? r->ktt : NULL, r->y, t, T, &o, mean, cov, &ctx);
    if (st)
        fail_msg("%s: %s", name, ctx.msg);
    /* per time, relative to that time's largest entry (t = 0: mean 0 exactly) */
    double em = 0, ec = 0;
    for (size_t i = 0; i < T; i++) {
        const double *wm = want_mean + i * rows * k, *wc = want_cov + i * rows * rows;
        double s = 0;
        for (size_t j = 0; j < rows * k; j++)
            s = fmax(s, fabs(wm[j]));
        if (s == 0)
            for (size_t j = 0; j < rows * k; j++)
                assert_true(mean->data[i * rows * k + j] == 0);
        else
            em = fmax(em, relerr(mean->data + i * rows * k, wm, rows * k));
        ec = fmax(ec, relerr(cov->data + i * rows * rows, wc, rows * rows));
    }
    printf("    NT %-22s mean %.2e  cov %.2e\n", name, em, ec);
    worst_nt = fmax(worst_nt, fmax(em, ec));
    if (!(em <= TOL_NT && ec <= TOL_NT))
        fail_msg("%s: relative error mean %.3g cov %.3g > %.3g", name, em, ec, TOL_NT);
    tpk_array_free(mean);
    tpk_array_free(cov);
}

static void test_nt_ensemble(void **state)
{
    (void)state;
    ref r = ref_make();
    nt_case("ntk test", &r, TPK_GD_NTK, 1, 0, gdref_ntk_test_mean, gdref_ntk_test_cov);
    nt_case("ntk train", &r, TPK_GD_NTK, 0, 0, gdref_ntk_train_mean, gdref_ntk_train_cov);
    nt_case("nngp test", &r, TPK_GD_NNGP, 1, 0, gdref_nngp_test_mean, gdref_nngp_test_cov);
    nt_case("nngp train", &r, TPK_GD_NNGP, 0, 0, gdref_nngp_train_mean, gdref_nngp_train_cov);
    nt_case("ntk test diag_reg", &r, TPK_GD_NTK, 1, gdref_diag_reg, gdref_ntk_test_reg_mean,
            gdref_ntk_test_reg_cov);
    nt_case("nngp test diag_reg", &r, TPK_GD_NNGP, 1, gdref_diag_reg, gdref_nngp_test_reg_mean,
            gdref_nngp_test_reg_cov);
    ref_free(&r);
}

static void test_nt_gp_inference(void **state)
{
    (void)state;
    ref r = ref_make();
    const struct {
        tpk_gd_get get;
        const char *name;
        const double *mean, *cov;
    } cs[] = {{TPK_GD_NNGP, "gp_inference nngp", gdref_gpinf_nngp_mean, gdref_gpinf_nngp_cov},
              {TPK_GD_NTK, "gp_inference ntk", gdref_gpinf_ntk_mean, gdref_gpinf_ntk_cov},
              {TPK_GD_NTKGP, "gp_inference ntkgp", gdref_gpinf_ntkgp_mean, gdref_gpinf_ntkgp_cov}};
    for (size_t c = 0; c < 3; c++) {
        tpk_gd_opts o;
        tpk_gd_opts_default(&o);
        o.get = cs[c].get;
        tpk_array *mean = mat(GDREF_M, GDREF_K), *cov = mat(GDREF_M, GDREF_M);
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        if (tpk_gd_gp_inference(r.tdd, r.kdd, r.ttd, r.ktd,
                                cs[c].get == TPK_GD_NTKGP ? r.ttt : r.ktt, r.y, &o, mean, cov,
                                &ctx))
            fail_msg("%s: %s", cs[c].name, ctx.msg);
        double em = relerr(mean->data, cs[c].mean, GDREF_M * GDREF_K);
        double ec = relerr(cov->data, cs[c].cov, GDREF_M * GDREF_M);
        printf("    NT %-22s mean %.2e  cov %.2e\n", cs[c].name, em, ec);
        worst_nt = fmax(worst_nt, fmax(em, ec));
        assert_true(em <= TOL_NT && ec <= TOL_NT);
        tpk_array_free(mean);
        tpk_array_free(cov);
    }
    double lr;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gd_max_learning_rate(r.tdd, GDREF_N * GDREF_K, 0, 1e-12, &lr, &ctx), 0);
    double e1 = fabs(lr - gdref_lr_max) / gdref_lr_max;
    assert_int_equal(tpk_gd_max_learning_rate(r.tdd, GDREF_N * GDREF_K, 0.9, 1e-12, &lr, &ctx), 0);
    double e2 = fabs(lr - gdref_lr_max_mom09) / gdref_lr_max_mom09;
    printf("    NT max_learning_rate        %.2e (momentum 0.9: %.2e)\n", e1, e2);
    worst_nt = fmax(worst_nt, fmax(e1, e2));
    assert_true(e1 <= TOL_NT && e2 <= TOL_NT);
    printf("    largest relative error against neural-tangents: %.2e\n", worst_nt);
    ref_free(&r);
}

/* n = m = k = 1: every matrix a number (N = 1). */
static void test_scalar(void **state)
{
    (void)state;
    const double th = 2.5, ka = 0.8, a = 1.3, b = 0.4, c = 0.9, yv = -1.7, eta = 0.3;
    tpk_array *T = mat(1, 1), *K = mat(1, 1), *Ttd = mat(1, 1), *Ktd = mat(1, 1), *Ktt = mat(1, 1),
              *Y = mat(1, 1);
    T->data[0] = th, K->data[0] = ka, Ttd->data[0] = a, Ktd->data[0] = b, Ktt->data[0] = c;
    Y->data[0] = yv;
    const double t[] = {0, 0.5, 3, 40, INFINITY};
    const size_t nt = 5;
    for (int disc = 0; disc < 2; disc++)
        for (int g = 0; g < 2; g++) {
            tpk_gd_opts o;
            tpk_gd_opts_default(&o);
            o.lr = eta;
            o.discrete = disc;
            o.get = g ? TPK_GD_NNGP : TPK_GD_NTK;
            const double tt[] = {0, 1, 3, 40, INFINITY};
            const double *ts = disc ? tt : t;
            tpk_array *m = arr3(nt, 1, 1), *cv = arr3(nt, 1, 1), *md = arr3(nt, 1, 1),
                      *cd = arr3(nt, 1, 1);
            tpk_ctx ctx;
            tpk_ctx_init(&ctx);
            assert_int_equal(tpk_gd_mse_ensemble(T, K, Ttd, Ktd, Ktt, Y, ts, nt, &o, m, cv, &ctx),
                             0);
            assert_int_equal(tpk_gd_mse_ensemble(T, K, NULL, NULL, NULL, Y, ts, nt, &o, md, cd,
                                                 &ctx), 0);
            const double G = g ? ka : th, Gtd = g ? b : a;
            for (size_t i = 0; i < nt; i++) {
                double e = disc ? pow(1 - eta * G, ts[i]) : exp(-eta * ts[i] * G);
                if (isinf(ts[i]))
                    e = 0;
                double p = Gtd / G * (1 - e);
                double want[4] = {p * yv, c + p * p * ka - 2 * p * b, (1 - e) * yv, e * e * ka};
                double got[4] = {m->data[i], cv->data[i], md->data[i], cd->data[i]};
                char what[64];
                snprintf(what, sizeof what, "scalar %s %s t=%g", disc ? "discrete" : "flow",
                         g ? "nngp" : "ntk", ts[i]);
                for (int q = 0; q < 4; q++)
                    if (!(fabs(got[q] - want[q]) <= TOL_CLOSED * fmax(1, fabs(want[q]))))
                        fail_msg("%s: quantity %d = %.17g, want %.17g", what, q, got[q], want[q]);
            }
            tpk_array_free(m), tpk_array_free(cv), tpk_array_free(md), tpk_array_free(cd);
        }
    tpk_array_free(T), tpk_array_free(K), tpk_array_free(Ttd), tpk_array_free(Ktd);
    tpk_array_free(Ktt), tpk_array_free(Y);
}

/* Θ diagonal with one zero eigenvalue: Θ⁻¹E_τ(Θ) is diag((1 − e^{−τθ_i/N})/θ_i), and τ/N at
 * θ_i = 0 (NT gives 0/0 there). K full. */
static void test_diagonal(void **state)
{
    (void)state;
    enum { n = 3, m = 2, k = 2 };
    const double th[n] = {1.5, 0.0, 4.0}, eta = 0.6, N = n * k;
    const double kd[n * n] = {1.0, 0.2, -0.1, 0.2, 0.8, 0.3, -0.1, 0.3, 1.2};
    const double td[m * n] = {0.5, 0.3, -0.2, 0.1, 0.7, 0.4};
    const double kt[m * n] = {0.2, -0.1, 0.3, 0.05, 0.25, 0.1};
    const double tt[m * m] = {1.1, 0.3, 0.3, 0.9};
    const double yv[n * k] = {1, -0.5, 0.3, 2, -1.2, 0.7};
    tpk_array *T = mat(n, n), *K = mat(n, n), *Ttd = mat(m, n), *Ktd = mat(m, n), *Ktt = mat(m, m),
              *Y = mat(n, k);
    for (size_t i = 0; i < n; i++)
        T->data[i * n + i] = th[i];
    memcpy(K->data, kd, sizeof kd), memcpy(Ttd->data, td, sizeof td);
    memcpy(Ktd->data, kt, sizeof kt), memcpy(Ktt->data, tt, sizeof tt), memcpy(Y->data, yv, sizeof yv);
    const double t[] = {0, 0.7, 5, 60};
    const size_t nt = 4;
    tpk_gd_opts o;
    tpk_gd_opts_default(&o);
    o.lr = eta;
    tpk_array *mt = arr3(nt, m, k), *ct = arr3(nt, m, m), *md = arr3(nt, n, k), *cd = arr3(nt, n, n);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gd_mse_ensemble(T, K, Ttd, Ktd, Ktt, Y, t, nt, &o, mt, ct, &ctx), 0);
    assert_int_equal(tpk_gd_mse_ensemble(T, K, NULL, NULL, NULL, Y, t, nt, &o, md, cd, &ctx), 0);
    for (size_t s = 0; s < nt; s++) {
        double r[n], e[n], P[m * n], wm[m * k], wc[m * m], wmd[n * k], wcd[n * n];
        double x = eta * t[s] / N;
        for (size_t i = 0; i < n; i++) {
            e[i] = exp(-x * th[i]);
            r[i] = th[i] > 0 ? (1 - e[i]) / th[i] : x;
        }
        for (size_t a = 0; a < m; a++)
            for (size_t i = 0; i < n; i++)
                P[a * n + i] = td[a * n + i] * r[i];
        for (size_t a = 0; a < m; a++)
            for (size_t c = 0; c < k; c++) {
                wm[a * k + c] = 0;
                for (size_t i = 0; i < n; i++)
                    wm[a * k + c] += P[a * n + i] * yv[i * k + c];
            }
        for (size_t a = 0; a < m; a++)
            for (size_t b = 0; b < m; b++) {
                double v = tt[a * m + b];
                for (size_t i = 0; i < n; i++) {
                    v -= P[a * n + i] * kt[b * n + i] + kt[a * n + i] * P[b * n + i];
                    for (size_t j = 0; j < n; j++)
                        v += P[a * n + i] * kd[i * n + j] * P[b * n + j];
                }
                wc[a * m + b] = v;
            }
        for (size_t i = 0; i < n; i++) {
            for (size_t c = 0; c < k; c++)
                wmd[i * k + c] = (1 - e[i]) * yv[i * k + c];
            for (size_t j = 0; j < n; j++)
                wcd[i * n + j] = e[i] * kd[i * n + j] * e[j];
        }
        expect_close("diagonal mean test", mt->data + s * m * k, wm, m * k, TOL_CLOSED);
        expect_close("diagonal cov test", ct->data + s * m * m, wc, m * m, TOL_CLOSED);
        expect_close("diagonal mean train", md->data + s * n * k, wmd, n * k, TOL_CLOSED);
        expect_close("diagonal cov train", cd->data + s * n * n, wcd, n * n, TOL_CLOSED);
    }
    /* t = 0: mean 0, covariances the priors K_tt and K_dd */
    for (size_t j = 0; j < m * k; j++)
        assert_true(mt->data[j] == 0);
    expect_close("t=0 cov test", ct->data, tt, m * m, 1e-15);
    expect_close("t=0 cov train", cd->data, kd, n * n, 1e-15);
    /* the zero eigenvalue at t = ∞: singular */
    double inf = INFINITY;
    tpk_array *m1 = arr3(1, m, k);
    assert_int_equal(tpk_gd_mse_ensemble(T, K, Ttd, Ktd, NULL, Y, &inf, 1, &o, m1, NULL, &ctx),
                     TPK_ENUMERIC);
    printf("    singular: %s\n", ctx.msg);
    assert_non_null(strstr(ctx.msg, "smallest eigenvalue 0"));
    assert_non_null(strstr(ctx.msg, "diag_reg"));
    /* with a regulariser it goes through */
    tpk_ctx_init(&ctx);
    o.diag_reg = 1e-3;
    assert_int_equal(tpk_gd_mse_ensemble(T, K, Ttd, Ktd, NULL, Y, &inf, 1, &o, m1, NULL, &ctx), 0);
    tpk_array_free(m1);
    tpk_array_free(mt), tpk_array_free(ct), tpk_array_free(md), tpk_array_free(cd);
    tpk_array_free(T), tpk_array_free(K), tpk_array_free(Ttd), tpk_array_free(Ktd);
    tpk_array_free(Ktt), tpk_array_free(Y);
}

/* Large t (eigen path) equals t = ∞ (Cholesky path); and Θ = K makes the NTK covariance at ∞ the
 * GP posterior K_tt − K_td K⁻¹K_dt (computed here by dgesv). */
static void test_limits(void **state)
{
    (void)state;
    ref r = ref_make();
    const size_t n = GDREF_N, m = GDREF_M, k = GDREF_K;
    for (int g = 0; g < 2; g++) {
        tpk_gd_opts o;
        tpk_gd_opts_default(&o);
        o.get = g ? TPK_GD_NNGP : TPK_GD_NTK;
        const double t[2] = {1e8, INFINITY};
        tpk_array *mean = arr3(2, m, k), *cov = arr3(2, m, m);
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        assert_int_equal(tpk_gd_mse_ensemble(r.tdd, r.kdd, r.ttd, r.ktd, r.ktt, r.y, t, 2, &o,
                                             mean, cov, &ctx), 0);
        double em = relerr(mean->data, mean->data + m * k, m * k);
        double ec = relerr(cov->data, cov->data + m * m, m * m);
        printf("    t=1e8 vs inf (%s): mean %.2e cov %.2e\n", g ? "nngp" : "ntk", em, ec);
        assert_true(em <= 1e-10 && ec <= 1e-10);
        tpk_array_free(mean), tpk_array_free(cov);
    }
    /* Θ = K */
    tpk_gd_opts o;
    tpk_gd_opts_default(&o);
    const double t = INFINITY;
    tpk_array *mean = arr3(1, m, k), *cov = arr3(1, m, m);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gd_mse_ensemble(r.kdd, r.kdd, r.ktd, r.ktd, r.ktt, r.y, &t, 1, &o, mean,
                                         cov, &ctx), 0);
    double A[GDREF_N * GDREF_N], B[GDREF_N * GDREF_M], want[GDREF_M * GDREF_M];
    lapack_int piv[GDREF_N];
    memcpy(A, r.kdd->data, sizeof A);
    for (size_t i = 0; i < n; i++) /* B = K_dt */
        for (size_t a = 0; a < m; a++)
            B[i * m + a] = r.ktd->data[a * n + i];
    assert_int_equal(LAPACKE_dgesv(LAPACK_ROW_MAJOR, (lapack_int)n, (lapack_int)m, A,
                                   (lapack_int)n, piv, B, (lapack_int)m), 0);
    for (size_t a = 0; a < m; a++)
        for (size_t b = 0; b < m; b++) {
            double v = r.ktt->data[a * m + b];
            for (size_t i = 0; i < n; i++)
                v -= r.ktd->data[a * n + i] * B[i * m + b];
            want[a * m + b] = v;
        }
    expect_close("Theta = K: GP posterior covariance", cov->data, want, m * m, 1e-10);
    tpk_array_free(mean), tpk_array_free(cov);
    ref_free(&r);
}

/* The test (m×m, from row and column n) and training (n×n) blocks of a covariance S with
 * leading dimension ld. */
static void cov_blocks(const double *S, size_t ld, size_t n, size_t m, double *wct, double *wcd)
{
    for (size_t a = 0; a < m; a++)
        for (size_t b = 0; b < m; b++)
            wct[a * m + b] = S[(n + a) * ld + n + b];
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            wcd[i * n + j] = S[i * ld + j];
}

/* S ← A S Aᵀ (n×n, tmp n×n scratch): a covariance through a linear step. */
static void sandwich(const double *A, double *S, double *tmp, size_t n)
{
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            double v = 0;
            for (size_t q = 0; q < n; q++)
                v += A[i * n + q] * S[q * n + j];
            tmp[i * n + j] = v;
        }
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            double v = 0;
            for (size_t q = 0; q < n; q++)
                v += tmp[i * n + q] * A[j * n + q];
            S[i * n + j] = v;
        }
}

/* Discrete GD against the iterated affine map of the joint Gaussian (f_d, f_t):
 * f_d ← f_d − (η/N)G(f_d − Y), f_t ← f_t − (η/N)G_td(f_d − Y), from f ~ N(0, joint NNGP). */
static void test_discrete_iteration(void **state)
{
    (void)state;
    ref r = ref_make();
    enum { n = GDREF_N, m = GDREF_M, k = GDREF_K, P = GDREF_N + GDREF_M };
    const double N = n * k;
    for (int g = 0; g < 2; g++) {
        const double *G = g ? r.kdd->data : r.tdd->data, *Gtd = g ? r.ktd->data : r.ttd->data;
        double lrmax;
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        tpk_array *Gd = g ? r.kdd : r.tdd;
        assert_int_equal(tpk_gd_max_learning_rate(Gd, n * k, 0, 1e-12, &lrmax, &ctx), 0);
        tpk_gd_opts o;
        tpk_gd_opts_default(&o);
        o.discrete = 1;
        o.get = g ? TPK_GD_NNGP : TPK_GD_NTK;
        o.lr = 0.8 * lrmax;
        const double t[] = {0, 1, 2, 7, 25};
        const size_t nt = 5;
        tpk_array *mt = arr3(nt, m, k), *ct = arr3(nt, m, m), *md = arr3(nt, n, k),
                  *cd = arr3(nt, n, n);
        assert_int_equal(tpk_gd_mse_ensemble(r.tdd, r.kdd, r.ttd, r.ktd, r.ktt, r.y, t, nt, &o,
                                             mt, ct, &ctx), 0);
        assert_int_equal(tpk_gd_mse_ensemble(r.tdd, r.kdd, NULL, NULL, NULL, r.y, t, nt, &o, md,
                                             cd, &ctx), 0);
        /* the iteration: mean μ (P×k) and covariance Σ (P×P), L = [[I − cG, 0], [−cG_td, I]] */
        double mu[P * k] = {0}, S[P * P], L[P * P] = {0}, tmp[P * P], mu2[P * k];
        const double c = o.lr / N;
        memcpy(S, gdref_nngp_full, sizeof S);
        for (size_t i = 0; i < P; i++)
            L[i * P + i] = 1;
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n; j++)
                L[i * P + j] -= c * G[i * n + j];
        for (size_t a = 0; a < m; a++)
            for (size_t j = 0; j < n; j++)
                L[(n + a) * P + j] = -c * Gtd[a * n + j];
        size_t step = 0;
        for (size_t s = 0; s < nt; s++) {
            for (; step < (size_t)t[s]; step++) {
                /* μ ← Lμ + (cG Y; cG_td Y) = L μ + (I − L)[:, :n] Y */
                for (size_t i = 0; i < P; i++)
                    for (size_t q = 0; q < k; q++) {
                        double v = 0;
                        for (size_t j = 0; j < P; j++)
                            v += L[i * P + j] * mu[j * k + q];
                        for (size_t j = 0; j < n; j++)
                            v += ((i == j) - L[i * P + j]) * r.y->data[j * k + q];
                        mu2[i * k + q] = v;
                    }
                memcpy(mu, mu2, sizeof mu);
                sandwich(L, S, tmp, P); /* Σ ← L Σ Lᵀ */
            }
            double wct[m * m], wcd[n * n];
            cov_blocks(S, P, n, m, wct, wcd);
            char what[80];
            snprintf(what, sizeof what, "discrete %s step %g", g ? "nngp" : "ntk", t[s]);
            if (s > 0) {
                expect_close(what, mt->data + s * m * k, mu + n * k, m * k, 1e-11);
                expect_close(what, md->data + s * n * k, mu, n * k, 1e-11);
            }
            expect_close(what, ct->data + s * m * m, wct, m * m, 1e-11);
            expect_close(what, cd->data + s * n * n, wcd, n * n, 1e-11);
        }
        /* t = ∞ steps: stable below 2N/λ_max (the flow's limit), TPK_EDOM above */
        double inf = INFINITY;
        tpk_array *m1 = arr3(1, m, k), *m1c = arr3(1, m, k);
        assert_int_equal(tpk_gd_mse_ensemble(r.tdd, r.kdd, r.ttd, r.ktd, NULL, r.y, &inf, 1, &o,
                                             m1, NULL, &ctx), 0);
        o.discrete = 0;
        assert_int_equal(tpk_gd_mse_ensemble(r.tdd, r.kdd, r.ttd, r.ktd, NULL, r.y, &inf, 1, &o,
                                             m1c, NULL, &ctx), 0);
        expect_close("discrete inf = flow inf", m1->data, m1c->data, m * k, 1e-15);
        o.discrete = 1;
        o.lr = 1.01 * lrmax;
        assert_int_equal(tpk_gd_mse_ensemble(r.tdd, r.kdd, r.ttd, r.ktd, NULL, r.y, &inf, 1, &o,
                                             m1, NULL, &ctx), TPK_EDOM);
        assert_non_null(strstr(ctx.msg, "diverge"));
        tpk_array_free(m1), tpk_array_free(m1c);
        tpk_array_free(mt), tpk_array_free(ct), tpk_array_free(md), tpk_array_free(cd);
    }
    ref_free(&r);
}

/* Heavy-ball steps against the iterated affine map of the stacked state (f_k, f_{k−1}), both
 * (f_d, f_t) jointly Gaussian: f_{k+1} = f_k − (η/N)[G; G_td](f_d,k − Y) + μ(f_k − f_{k−1}), from
 * f_0 = f_{−1} ~ N(0, joint NNGP) — the recursion written out, no eigenvalue in sight. */
static void test_momentum_iteration(void **state)
{
    (void)state;
    ref r = ref_make();
    enum { n = GDREF_N, m = GDREF_M, k = GDREF_K, P = GDREF_N + GDREF_M, Q = 2 * P };
    const double N = n * k, mu_m = 0.7;
    for (int g = 0; g < 2; g++) {
        const double *G = g ? r.kdd->data : r.tdd->data, *Gtd = g ? r.ktd->data : r.ttd->data;
        double lrmax;
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        assert_int_equal(tpk_gd_max_learning_rate(g ? r.kdd : r.tdd, n * k, mu_m, 1e-12, &lrmax,
                                                  &ctx), 0);
        tpk_gd_opts o;
        tpk_gd_opts_default(&o);
        o.discrete = 1;
        o.momentum = mu_m;
        o.get = g ? TPK_GD_NNGP : TPK_GD_NTK;
        o.lr = 0.6 * lrmax; /* above the plain limit 2N/λ_max: only momentum keeps it stable */
        const double t[] = {0, 1, 3, 10, 40};
        const size_t nt = 5;
        tpk_array *mt = arr3(nt, m, k), *ct = arr3(nt, m, m), *md = arr3(nt, n, k),
                  *cd = arr3(nt, n, n);
        assert_int_equal(tpk_gd_mse_ensemble(r.tdd, r.kdd, r.ttd, r.ktd, r.ktt, r.y, t, nt, &o,
                                             mt, ct, &ctx), 0);
        assert_int_equal(tpk_gd_mse_ensemble(r.tdd, r.kdd, NULL, NULL, NULL, r.y, t, nt, &o, md,
                                             cd, &ctx), 0);
        /* A = [[L + μI, −μI], [I, 0]] on (f_k, f_{k−1}); offset b = ((I − L)[:, :n] Y; 0) */
        static double A[Q * Q], S[Q * Q], tmp[Q * Q];
        double mean[Q * k] = {0}, m2[Q * k];
        const double c = o.lr / N;
        memset(A, 0, sizeof A);
        for (size_t i = 0; i < P; i++) {
            A[i * Q + i] = 1 + mu_m;
            A[i * Q + P + i] = -mu_m;
            A[(P + i) * Q + i] = 1;
        }
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n; j++)
                A[i * Q + j] -= c * G[i * n + j];
        for (size_t a = 0; a < m; a++)
            for (size_t j = 0; j < n; j++)
                A[(n + a) * Q + j] -= c * Gtd[a * n + j];
        for (size_t i = 0; i < Q; i++) /* f_0 = f_{−1}: every block the joint NNGP */
            for (size_t j = 0; j < Q; j++)
                S[i * Q + j] = gdref_nngp_full[(i % P) * P + j % P];
        size_t step = 0;
        for (size_t s = 0; s < nt; s++) {
            for (; step < (size_t)t[s]; step++) {
                for (size_t i = 0; i < Q; i++)
                    for (size_t q = 0; q < k; q++) {
                        double v = 0;
                        for (size_t j = 0; j < Q; j++)
                            v += A[i * Q + j] * mean[j * k + q];
                        if (i < n)
                            for (size_t j = 0; j < n; j++)
                                v += c * G[i * n + j] * r.y->data[j * k + q];
                        else if (i < P)
                            for (size_t j = 0; j < n; j++)
                                v += c * Gtd[(i - n) * n + j] * r.y->data[j * k + q];
                        m2[i * k + q] = v;
                    }
                memcpy(mean, m2, sizeof mean);
                sandwich(A, S, tmp, Q); /* S ← A S Aᵀ */
            }
            double wct[m * m], wcd[n * n];
            cov_blocks(S, Q, n, m, wct, wcd);
            char what[80];
            snprintf(what, sizeof what, "momentum %s step %g", g ? "nngp" : "ntk", t[s]);
            expect_close(what, mt->data + s * m * k, mean + n * k, m * k, 1e-10);
            expect_close(what, md->data + s * n * k, mean, n * k, 1e-10);
            expect_close(what, ct->data + s * m * m, wct, m * m, 1e-10);
            expect_close(what, cd->data + s * n * n, wcd, n * n, 1e-10);
        }
        /* t = ∞: stable below 2(1 + μ)N/λ_max, the flow's end point; diverging above */
        double inf = INFINITY;
        tpk_array *m1 = arr3(1, m, k), *m1c = arr3(1, m, k);
        assert_int_equal(tpk_gd_mse_ensemble(r.tdd, r.kdd, r.ttd, r.ktd, NULL, r.y, &inf, 1, &o,
                                             m1, NULL, &ctx), 0);
        tpk_gd_opts flow;
        tpk_gd_opts_default(&flow);
        flow.get = o.get;
        assert_int_equal(tpk_gd_mse_ensemble(r.tdd, r.kdd, r.ttd, r.ktd, NULL, r.y, &inf, 1, &flow,
                                             m1c, NULL, &ctx), 0);
        expect_close("momentum inf = flow inf", m1->data, m1c->data, m * k, 1e-15);
        o.lr = 1.01 * lrmax;
        assert_int_equal(tpk_gd_mse_ensemble(r.tdd, r.kdd, r.ttd, r.ktd, NULL, r.y, &inf, 1, &o,
                                             m1, NULL, &ctx), TPK_EDOM);
        assert_non_null(strstr(ctx.msg, "momentum"));
        /* momentum with gradient flow, or outside [0, 1): refused */
        o.lr = 0.5 * lrmax;
        o.discrete = 0;
        tpk_ctx_init(&ctx);
        assert_int_equal(tpk_gd_mse_ensemble(r.tdd, r.kdd, r.ttd, r.ktd, NULL, r.y, t, 1, &o, m1,
                                             NULL, &ctx), TPK_EINVAL);
        assert_non_null(strstr(ctx.msg, "discrete"));
        o.discrete = 1;
        o.momentum = 1.0;
        tpk_ctx_init(&ctx);
        assert_int_equal(tpk_gd_mse_ensemble(r.tdd, r.kdd, r.ttd, r.ktd, NULL, r.y, t, 1, &o, m1,
                                             NULL, &ctx), TPK_EINVAL);
        tpk_array_free(m1), tpk_array_free(m1c);
        tpk_array_free(mt), tpk_array_free(ct), tpk_array_free(md), tpk_array_free(cd);
    }
    ref_free(&r);
}

static void test_errors(void **state)
{
    (void)state;
    ref r = ref_make();
    const size_t m = GDREF_M, k = GDREF_K;
    const double t[] = {1, INFINITY};
    tpk_array *mean = arr3(2, m, k), *cov = arr3(2, m, m), *bad = mat(m, m + 1);
    tpk_ctx ctx;
#define EXPECT(call, code, text)                                                                \
    do {                                                                                        \
        tpk_ctx_init(&ctx);                                                                     \
        assert_int_equal((call), (code));                                                       \
        if (!strstr(ctx.msg, (text)))                                                           \
            fail_msg("'%s' lacks '%s'", ctx.msg, (text));                                       \
    } while (0)
    EXPECT(tpk_gd_mse_ensemble(NULL, r.kdd, r.ttd, r.ktd, r.ktt, r.y, t, 2, NULL, mean, cov, &ctx),
           TPK_EINVAL, "ntk_dd is NULL");
    EXPECT(tpk_gd_mse_ensemble(r.tdd, r.kdd, r.ttd, r.ktd, r.ktt, NULL, t, 2, NULL, mean, cov, &ctx),
           TPK_EINVAL, "y is NULL");
    EXPECT(tpk_gd_mse_ensemble(r.tdd, r.kdd, r.ttd, r.ktd, NULL, r.y, t, 2, NULL, mean, cov, &ctx),
           TPK_EINVAL, "k_tt is NULL");
    EXPECT(tpk_gd_mse_ensemble(r.tdd, NULL, r.ttd, r.ktd, r.ktt, r.y, t, 2, NULL, mean, cov, &ctx),
           TPK_EINVAL, "nngp_dd is NULL");
    EXPECT(tpk_gd_mse_ensemble(r.tdd, r.kdd, bad, r.ktd, r.ktt, r.y, t, 2, NULL, mean, cov, &ctx),
           TPK_EINVAL, "ntk_td must be");
    EXPECT(tpk_gd_mse_ensemble(r.tdd, r.kdd, r.ttd, r.ktd, bad, r.y, t, 2, NULL, mean, cov, &ctx),
           TPK_EINVAL, "k_tt must be");
    EXPECT(tpk_gd_mse_ensemble(r.tdd, r.kdd, r.ttd, r.ktd, r.ktt, r.ktt, t, 2, NULL, mean, cov,
                               &ctx), TPK_EINVAL, "y must be");
    EXPECT(tpk_gd_mse_ensemble(r.tdd, r.kdd, r.ttd, r.ktd, r.ktt, r.y, t, 2, NULL, bad, cov, &ctx),
           TPK_EINVAL, "mean must be");
    EXPECT(tpk_gd_mse_ensemble(r.tdd, r.kdd, r.ttd, r.ktd, r.ktt, r.y, t, 1, NULL, mean, cov, &ctx),
           TPK_EINVAL, "mean must be 1");
    EXPECT(tpk_gd_mse_ensemble(r.tdd, r.kdd, r.ttd, r.ktd, r.ktt, r.y, NULL, 2, NULL, mean, cov,
                               &ctx), TPK_EINVAL, "no times");
    const double tneg[] = {-1, 1};
    EXPECT(tpk_gd_mse_ensemble(r.tdd, r.kdd, r.ttd, r.ktd, r.ktt, r.y, tneg, 2, NULL, mean, cov,
                               &ctx), TPK_EINVAL, ">= 0");
    tpk_gd_opts o;
    tpk_gd_opts_default(&o);
    o.discrete = 1;
    const double tfrac[] = {1.5, 2};
    EXPECT(tpk_gd_mse_ensemble(r.tdd, r.kdd, r.ttd, r.ktd, r.ktt, r.y, tfrac, 2, &o, mean, cov,
                               &ctx), TPK_EINVAL, "whole numbers");
    tpk_gd_opts_default(&o);
    o.lr = 0;
    EXPECT(tpk_gd_mse_ensemble(r.tdd, r.kdd, r.ttd, r.ktd, r.ktt, r.y, t, 2, &o, mean, cov, &ctx),
           TPK_EINVAL, "learning rate");
    /* asymmetric Θ */
    tpk_array *asym = mat(GDREF_N, GDREF_N);
    memcpy(asym->data, r.tdd->data, GDREF_N * GDREF_N * sizeof(double));
    asym->data[1] += 0.1;
    EXPECT(tpk_gd_mse_ensemble(asym, r.kdd, r.ttd, r.ktd, r.ktt, r.y, t, 2, NULL, mean, cov, &ctx),
           TPK_EINVAL, "not symmetric");
    /* NaN */
    r.ktt->data[0] = NAN;
    EXPECT(tpk_gd_mse_ensemble(r.tdd, r.kdd, r.ttd, r.ktd, r.ktt, r.y, t, 2, NULL, mean, cov, &ctx),
           TPK_EDOM, "k_tt");
    /* a rank-deficient PSD Θ (rank 2 of 6) at t = ∞: TPK_ENUMERIC naming the eigenvalue; finite
     * t goes through; diag_reg makes ∞ go through */
    tpk_array *sing = mat(GDREF_N, GDREF_N);
    for (size_t i = 0; i < GDREF_N; i++)
        for (size_t j = 0; j < GDREF_N; j++)
            sing->data[i * GDREF_N + j] = 1.0 + 0.5 * (double)(i * j);
    EXPECT(tpk_gd_mse_ensemble(sing, r.kdd, r.ttd, r.ktd, NULL, r.y, t, 2, NULL, mean, NULL, &ctx),
           TPK_ENUMERIC, "smallest eigenvalue");
    assert_non_null(strstr(ctx.msg, "singular"));
    tpk_array *m1 = arr3(1, m, k);
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gd_mse_ensemble(sing, r.kdd, r.ttd, r.ktd, NULL, r.y, t, 1, NULL, m1,
                                         NULL, &ctx), 0);
    tpk_gd_opts_default(&o);
    o.diag_reg = 1e-4;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gd_mse_ensemble(sing, r.kdd, r.ttd, r.ktd, NULL, r.y, t, 2, &o, mean,
                                         NULL, &ctx), 0);
    o.diag_reg_absolute = 1;
    assert_int_equal(tpk_gd_mse_ensemble(sing, r.kdd, r.ttd, r.ktd, NULL, r.y, t, 2, &o, mean,
                                         NULL, &ctx), 0);
    EXPECT(tpk_gd_gp_inference(sing, r.kdd, r.ttd, r.ktd, NULL, r.y, NULL, m1, NULL, &ctx),
           TPK_EINVAL, "mean must be");
    tpk_array *m2 = mat(m, k);
    EXPECT(tpk_gd_gp_inference(sing, r.kdd, r.ttd, r.ktd, NULL, r.y, NULL, m2, NULL, &ctx),
           TPK_ENUMERIC, "smallest eigenvalue");
    double lr;
    EXPECT(tpk_gd_max_learning_rate(bad, 0, 0, 1e-12, &lr, &ctx), TPK_EINVAL, "square");
#undef EXPECT
    tpk_array_free(m1), tpk_array_free(m2), tpk_array_free(sing), tpk_array_free(asym);
    tpk_array_free(mean), tpk_array_free(cov), tpk_array_free(bad);
    ref_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nt_ensemble),
        cmocka_unit_test(test_nt_gp_inference),
        cmocka_unit_test(test_scalar),
        cmocka_unit_test(test_diagonal),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_discrete_iteration),
        cmocka_unit_test(test_momentum_iteration),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
