/* kernels/mvn.c: bivariate, trivariate and quadrivariate normal probabilities against closed
 * forms (orthant probabilities, theory.md §3.2 step row and its trivariate analogue), 25-digit
 * mpmath references (tests/mvn_reference.h, scripts/mvn_reference.py), GSL 1-D integrals of the
 * conditional formula (independent of the code under test: nested gsl_integration_qagil of Φ),
 * and every error path. kernels/mvn_sov.c: the SIMD separation-of-variables kernel against its
 * plain reference, its Monte Carlo mean against the exact trivariate, its normals against GSL's
 * inverse normal, the Owen scrambling's nesting, stratification and uniformity. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <gsl/gsl_cdf.h>
#include <gsl/gsl_errno.h>
#include <gsl/gsl_integration.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "tpk/mvn.h"
#include "tpk/rng.h"
#include "mvn_reference.h"

/* BVN: the algorithm's bound is 1e-15 absolute; the references have 20 digits. */
#define BVN_TOL 1e-15
/* TVN / QVN against references: the returned bound, which must itself be below this. */
#define BOUND_MAX 1e-12
/* GSL references: requested absolute accuracy, and the slack the comparison allows on top of the
 * code's own bound (GSL's error estimates are estimates, not bounds). */
#define GSL_EPS 1e-14
#define GSL_SLACK 5e-14

static double Phi(double x) { return 0.5 * erfc(-x / sqrt(2.0)); }
static double phi(double x) { return exp(-0.5 * x * x) / sqrt(2.0 * M_PI); }

/* ---- GSL references: P(X < b) = ∫_{−∞}^{b1} φ(x) P(rest < b | X1 = x) dx, recursively ------- */

typedef struct cond {
    int m;          /* dimension of this level */
    double b[4];
    double R[16];   /* correlation matrix */
    gsl_integration_workspace *ws[4];
} cond;

static double cond_prob(const cond *c);

typedef struct lvl {
    const cond *c;
} lvl;

static double cond_integrand(double x, void *par)
{
    const cond *c = ((const lvl *)par)->c;
    int m = c->m;
    cond d;
    memset(&d, 0, sizeof d);
    d.m = m - 1;
    for (int k = 0; k < 4; k++)
        d.ws[k] = c->ws[k];
    double sd[4];
    for (int k = 1; k < m; k++) {
        sd[k] = sqrt(1 - c->R[k] * c->R[k]);
        d.b[k - 1] = (c->b[k] - c->R[k] * x) / sd[k];
    }
    for (int i = 1; i < m; i++)
        for (int j = 1; j < m; j++)
            d.R[(i - 1) * (m - 1) + j - 1] =
                i == j ? 1.0 : (c->R[i * m + j] - c->R[i] * c->R[j]) / (sd[i] * sd[j]);
    return phi(x) * cond_prob(&d);
}

static double cond_prob(const cond *c)
{
    if (c->m == 1)
        return Phi(c->b[0]);
    lvl L = {c};
    gsl_function F = {cond_integrand, &L};
    double v, e;
    gsl_integration_qagil(&F, c->b[0], GSL_EPS, 0, 1000, c->ws[c->m - 1], &v, &e);
    return v;
}

static double gsl_reference(int m, const double *b, const double *R)
{
    cond c;
    memset(&c, 0, sizeof c);
    c.m = m;
    memcpy(c.b, b, (size_t)m * sizeof *b);
    memcpy(c.R, R, (size_t)(m * m) * sizeof *R);
    for (int k = 0; k < 4; k++)
        c.ws[k] = gsl_integration_workspace_alloc(1000);
    double v = cond_prob(&c);
    for (int k = 0; k < 4; k++)
        gsl_integration_workspace_free(c.ws[k]);
    return v;
}

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- BVN ---------------------------------------------------------------------------------- */

static void test_bvn_reference(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    double worst = 0;
    for (size_t i = 0; i < sizeof bvn_ref / sizeof bvn_ref[0]; i++) {
        tpk_estimate e;
        assert_int_equal(tpk_mvn_bvn(bvn_ref[i].h, bvn_ref[i].k, bvn_ref[i].rho, &e, &ctx), TPK_OK);
        double d = fabs(e.value - bvn_ref[i].p);
        worst = fmax(worst, d);
        if (d > e.err || e.err > BVN_TOL)
            fail_msg("bvn(%g, %g, %g) = %.17g, reference %.17g (diff %.2e, bound %.2e)",
                     bvn_ref[i].h, bvn_ref[i].k, bvn_ref[i].rho, e.value, bvn_ref[i].p, d, e.err);
    }
    print_message("BVN vs 30-digit references: worst |diff| %.2e\n", worst);
}

/* P(X > 0, Y > 0) = P(X < 0, Y < 0) = 1/4 + asin(ρ)/(2π) over ρ ∈ [−1, 1], the ends included. */
static void test_bvn_orthant(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    double worst = 0;
    for (int i = 0; i <= 400; i++) {
        double rho = -1.0 + i / 200.0;
        if (i == 1)
            rho = -1.0 + 1e-12;
        if (i == 399)
            rho = 1.0 - 1e-12;
        tpk_estimate e;
        assert_int_equal(tpk_mvn_bvn(0.0, 0.0, rho, &e, &ctx), TPK_OK);
        double ex = 0.25 + asin(rho) / (2 * M_PI);
        worst = fmax(worst, fabs(e.value - ex));
        assert_true(fabs(e.value - ex) <= e.err);
    }
    print_message("BVN orthant, 401 correlations: worst |diff| %.2e\n", worst);
    /* infinite limits */
    tpk_estimate e;
    assert_int_equal(tpk_mvn_bvn(INFINITY, 0.7, 0.4, &e, &ctx), TPK_OK);
    assert_true(fabs(e.value - Phi(0.7)) < 1e-16);
    assert_int_equal(tpk_mvn_bvn(-INFINITY, 0.7, 0.4, &e, &ctx), TPK_OK);
    assert_true(e.value == 0.0);
    assert_int_equal(tpk_mvn_bvn(0.3, -0.2, 0.0, &e, &ctx), TPK_OK);
    assert_true(fabs(e.value - Phi(0.3) * Phi(-0.2)) < 1e-16);
}

static void test_bvn_gsl(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    double worst = 0;
    int n = 0;
    for (double h = -3.7; h < 3.8; h += 1.45)
        for (double k = -2.9; k < 3.0; k += 1.15)
            for (double rho = -0.97; rho < 0.98; rho += 0.277) {
                double b[2] = {h, k}, R[4] = {1, rho, rho, 1};
                tpk_estimate e;
                assert_int_equal(tpk_mvn_bvn(h, k, rho, &e, &ctx), TPK_OK);
                double ref = gsl_reference(2, b, R), d = fabs(e.value - ref);
                worst = fmax(worst, d);
                n++;
                if (d > e.err + GSL_SLACK)
                    fail_msg("bvn(%g, %g, %g) = %.17g, GSL %.17g", h, k, rho, e.value, ref);
            }
    print_message("BVN vs GSL qagil, %d cases: worst |diff| %.2e\n", n, worst);
}

/* ---- TVN ---------------------------------------------------------------------------------- */

static void test_tvn_reference(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    double worst = 0, wb = 0;
    for (size_t i = 0; i < sizeof tvn_ref / sizeof tvn_ref[0]; i++) {
        tpk_estimate e;
        assert_int_equal(tpk_mvn_tvn(tvn_ref[i].b, tvn_ref[i].r, 0, &e, &ctx), TPK_OK);
        double d = fabs(e.value - tvn_ref[i].p);
        worst = fmax(worst, d);
        wb = fmax(wb, e.err);
        if (d > e.err || e.err > BOUND_MAX)
            fail_msg("tvn case %zu = %.17g, reference %.17g (diff %.2e, bound %.2e)", i, e.value,
                     tvn_ref[i].p, d, e.err);
    }
    print_message("TVN vs 30-digit references: worst |diff| %.2e, largest bound %.2e\n", worst, wb);
}

/* P(X1 < 0, X2 < 0, X3 < 0) = 1/8 + (asin r12 + asin r13 + asin r23)/(4π). */
static void test_tvn_orthant(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    static const double rs[][3] = {{0.3, -0.5, 0.4},  {0.9, 0.85, 0.8},  {-0.45, -0.45, 0.2},
                                   {0.99, 0.98, 0.97}, {0.6, 0.0, 0.0},   {0.0, 0.0, -0.7},
                                   {-0.7, 0.7, -0.98}, {0.5, 0.5, 0.5},   {1.0, 0.3, 0.3},
                                   {0.2, -1.0, -0.2}};
    double worst = 0, b[3] = {0, 0, 0};
    for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++) {
        tpk_estimate e;
        assert_int_equal(tpk_mvn_tvn(b, rs[i], 0, &e, &ctx), TPK_OK);
        double ex = 0.125 + (asin(rs[i][0]) + asin(rs[i][1]) + asin(rs[i][2])) / (4 * M_PI);
        worst = fmax(worst, fabs(e.value - ex));
        if (fabs(e.value - ex) > e.err + 1e-15 || e.err > BOUND_MAX)
            fail_msg("tvn orthant %zu: %.17g vs %.17g (bound %.2e)", i, e.value, ex, e.err);
    }
    print_message("TVN orthant: worst |diff| %.2e\n", worst);
}

static void test_tvn_gsl(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    double worst = 0;
    int n = 0;
    for (int q = 0; q < 24; q++) {
        double b[3] = {2.6 * sin(1.3 * q + 0.4), 2.2 * sin(0.7 * q + 1.1), 2.9 * sin(2.3 * q + 2.0)};
        double r[3] = {0.95 * sin(0.9 * q + 0.2), 0.9 * sin(1.9 * q + 0.7), 0.85 * sin(1.1 * q + 2.5)};
        double det = 1 - r[0] * r[0] - r[1] * r[1] - r[2] * r[2] + 2 * r[0] * r[1] * r[2];
        if (det < 0.01)
            continue;
        double R[9] = {1, r[0], r[1], r[0], 1, r[2], r[1], r[2], 1};
        tpk_estimate e;
        assert_int_equal(tpk_mvn_tvn(b, r, 0, &e, &ctx), TPK_OK);
        double ref = gsl_reference(3, b, R), d = fabs(e.value - ref);
        worst = fmax(worst, d);
        n++;
        if (d > e.err + GSL_SLACK)
            fail_msg("tvn case %d: %.17g vs GSL %.17g (bound %.2e)", q, e.value, ref, e.err);
    }
    print_message("TVN vs nested GSL qagil, %d cases: worst |diff| %.2e\n", n, worst);
}

/* ---- QVN ---------------------------------------------------------------------------------- */

/* Equicorrelated r ≥ 0: ∫ φ(u) Π Φ((b_i − √r u)/√(1 − r)) du (GSL qagi). */
typedef struct eqp {
    const double *b;
    double r;
} eqp;
static double eq_integrand(double u, void *par)
{
    const eqp *q = par;
    double p = phi(u);
    for (int i = 0; i < 4; i++)
        p *= Phi((q->b[i] - sqrt(q->r) * u) / sqrt(1 - q->r));
    return p;
}

static void test_qvn(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    gsl_integration_workspace *ws = gsl_integration_workspace_alloc(1000);
    double worst = 0;
    /* equicorrelated */
    static const double bs[][4] = {{0.3, -0.5, 1.2, 0.1}, {-1.5, -2.0, -1.0, -2.5}, {0, 0, 0, 0},
                                   {2.0, 1.5, -0.2, 3.0}};
    for (size_t q = 0; q < 4; q++)
        for (double r = 0.15; r < 0.99; r += 0.27) {
            double R[16];
            for (int i = 0; i < 16; i++)
                R[i] = i % 5 == 0 ? 1.0 : r;
            tpk_estimate e;
            assert_int_equal(tpk_mvn_qvn(bs[q], R, 0, &e, &ctx), TPK_OK);
            eqp par = {bs[q], r};
            gsl_function F = {eq_integrand, &par};
            double ref, re;
            gsl_integration_qagi(&F, 1e-15, 0, 1000, ws, &ref, &re);
            worst = fmax(worst, fabs(e.value - ref));
            if (fabs(e.value - ref) > e.err + GSL_SLACK || e.err > BOUND_MAX)
                fail_msg("qvn equicorrelated %zu r=%g: %.17g vs %.17g (bound %.2e)", q, r, e.value,
                         ref, e.err);
        }
    /* block diagonal: a product of two bivariates */
    double b4[4] = {0.4, -0.3, 1.1, -0.8}, Rb[16] = {1, 0.6, 0, 0, 0.6, 1, 0, 0,
                                                     0, 0, 1, -0.7, 0, 0, -0.7, 1};
    tpk_estimate e, e1, e2;
    assert_int_equal(tpk_mvn_qvn(b4, Rb, 0, &e, &ctx), TPK_OK);
    assert_int_equal(tpk_mvn_bvn(0.4, -0.3, 0.6, &e1, &ctx), TPK_OK);
    assert_int_equal(tpk_mvn_bvn(1.1, -0.8, -0.7, &e2, &ctx), TPK_OK);
    assert_true(fabs(e.value - e1.value * e2.value) <= e.err + 3e-15);
    /* general correlations against the nested GSL integral (three levels) */
    static const double Rg[2][16] = {{1, 0.3, -0.2, 0.5, 0.3, 1, 0.4, 0.1,
                                      -0.2, 0.4, 1, -0.3, 0.5, 0.1, -0.3, 1},
                                     {1, 0.8, 0.7, 0.6, 0.8, 1, 0.75, 0.5,
                                      0.7, 0.75, 1, 0.65, 0.6, 0.5, 0.65, 1}};
    static const double bg[2][4] = {{0.5, -0.4, 1.3, 0.2}, {-1.0, -0.5, -1.5, 0.3}};
    for (int q = 0; q < 2; q++) {
        double t0 = seconds();
        assert_int_equal(tpk_mvn_qvn(bg[q], Rg[q], 0, &e, &ctx), TPK_OK);
        double t1 = seconds();
        double ref = gsl_reference(4, bg[q], Rg[q]);
        worst = fmax(worst, fabs(e.value - ref));
        print_message("QVN general %d: %.15f, GSL %.15f, diff %.2e, bound %.2e, %.0f us\n", q,
                      e.value, ref, e.value - ref, e.err, 1e6 * (t1 - t0));
        assert_true(fabs(e.value - ref) <= e.err + GSL_SLACK);
        assert_true(e.err <= BOUND_MAX);
    }
    print_message("QVN: worst |diff| %.2e\n", worst);
    gsl_integration_workspace_free(ws);
}

/* ---- tpk_mvn_cdf: covariances, reductions, errors ------------------------------------------- */

static void test_cdf_reductions(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_estimate e, f;
    /* scaling: S = D R D, b = D b' */
    double b[3] = {0.2, -0.4, 0.7}, r[3] = {0.3, -0.5, 0.4}, d[3] = {1.7, 0.6, 2.3};
    double S[9] = {1, r[0], r[1], r[0], 1, r[2], r[1], r[2], 1}, bs[3];
    for (int i = 0; i < 3; i++) {
        bs[i] = d[i] * b[i];
        for (int j = 0; j < 3; j++)
            S[i * 3 + j] *= d[i] * d[j];
    }
    assert_int_equal(tpk_mvn_cdf(3, bs, S, 0, &e, &ctx), TPK_OK);
    assert_true(fabs(e.value - tvn_ref[0].p) <= e.err);
    /* m = 0, 1; an infinite limit drops its variable; −∞ gives 0 */
    assert_int_equal(tpk_mvn_cdf(0, NULL, NULL, 0, &e, &ctx), TPK_OK);
    assert_true(e.value == 1.0);
    double s1 = 2.25, b1 = 0.9;
    assert_int_equal(tpk_mvn_cdf(1, &b1, &s1, 0, &e, &ctx), TPK_OK);
    assert_true(fabs(e.value - Phi(0.6)) < 1e-15);
    double binf[3] = {bs[0], INFINITY, bs[2]};
    assert_int_equal(tpk_mvn_cdf(3, binf, S, 0, &e, &ctx), TPK_OK);
    assert_int_equal(tpk_mvn_bvn(0.2, 0.7, r[1], &f, &ctx), TPK_OK);
    assert_true(fabs(e.value - f.value) < 1e-15);
    binf[1] = -INFINITY;
    assert_int_equal(tpk_mvn_cdf(3, binf, S, 0, &e, &ctx), TPK_OK);
    assert_true(e.value == 0.0);
    /* a zero-variance variable: X = 0 < b or not */
    double Sz[4] = {1.3, 0, 0, 0}, bz[2] = {0.4, 0.1};
    assert_int_equal(tpk_mvn_cdf(2, bz, Sz, 0, &e, &ctx), TPK_OK);
    assert_true(fabs(e.value - Phi(0.4 / sqrt(1.3))) < 1e-16);
    bz[1] = -0.1;
    assert_int_equal(tpk_mvn_cdf(2, bz, Sz, 0, &e, &ctx), TPK_OK);
    assert_true(e.value == 0.0);
    /* X2 = X1 (a repeated step): the tighter limit; X2 = −X1: an interval */
    double Sp[9] = {1, 1, 0.4, 1, 1, 0.4, 0.4, 0.4, 1}, bp[3] = {0.5, -0.3, 0.8};
    assert_int_equal(tpk_mvn_cdf(3, bp, Sp, 0, &e, &ctx), TPK_OK);
    assert_int_equal(tpk_mvn_bvn(-0.3, 0.8, 0.4, &f, &ctx), TPK_OK);
    assert_true(fabs(e.value - f.value) <= e.err + f.err);
    double Sm[9] = {1, -1, 0.4, -1, 1, -0.4, 0.4, -0.4, 1}, bm[3] = {0.5, 0.3, 0.8};
    assert_int_equal(tpk_mvn_cdf(3, bm, Sm, 0, &e, &ctx), TPK_OK);
    tpk_estimate g;
    assert_int_equal(tpk_mvn_bvn(0.5, 0.8, 0.4, &f, &ctx), TPK_OK);
    assert_int_equal(tpk_mvn_bvn(-0.3, 0.8, 0.4, &g, &ctx), TPK_OK);
    assert_true(fabs(e.value - (f.value - g.value)) <= e.err + 1e-15);
    bm[1] = -0.6; /* −b2 = 0.6 > b1: empty */
    assert_int_equal(tpk_mvn_cdf(3, bm, Sm, 0, &e, &ctx), TPK_OK);
    assert_true(e.value == 0.0);
    /* 4-D with a duplicated variable reduces to a trivariate */
    double S4[16] = {1, 0.3, -0.5, 0.3, 0.3, 1, 0.4, 1, -0.5, 0.4, 1, 0.4, 0.3, 1, 0.4, 1};
    double b4[4] = {0.2, -0.4, 0.7, 0.1};
    assert_int_equal(tpk_mvn_cdf(4, b4, S4, 0, &e, &ctx), TPK_OK);
    assert_true(fabs(e.value - tvn_ref[0].p) <= e.err);
}

static void test_errors(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_estimate e;
    double b[4] = {0, 0, 0, 0}, r[3] = {0.2, 0.2, 0.2}, R[16] = {1, 0, 0, 0, 0, 1, 0, 0,
                                                                  0, 0, 1, 0, 0, 0, 0, 1};
#define EXPECT(call, code)                                                                        \
    do {                                                                                          \
        tpk_ctx_init(&ctx);                                                                       \
        assert_int_equal((call), (code));                                                         \
        assert_int_equal(ctx.status, (code));                                                     \
        assert_true(ctx.msg[0] != '\0');                                                          \
    } while (0)
    EXPECT(tpk_mvn_bvn(0, 0, 0.5, NULL, &ctx), TPK_EINVAL);
    EXPECT(tpk_mvn_bvn(NAN, 0, 0.5, &e, &ctx), TPK_EDOM);
    EXPECT(tpk_mvn_bvn(0, 0, 1.0001, &e, &ctx), TPK_EDOM);
    EXPECT(tpk_mvn_bvn(0, 0, NAN, &e, &ctx), TPK_EDOM);
    EXPECT(tpk_mvn_tvn(NULL, r, 0, &e, &ctx), TPK_EINVAL);
    EXPECT(tpk_mvn_tvn(b, r, -1, &e, &ctx), TPK_EINVAL);
    double rbad[3] = {0.2, 1.5, 0.2}, rnpsd[3] = {0.9, 0.9, -0.9};
    EXPECT(tpk_mvn_tvn(b, rbad, 0, &e, &ctx), TPK_EDOM);
    EXPECT(tpk_mvn_tvn(b, rnpsd, 0, &e, &ctx), TPK_EDOM);
    /* an unreachable tolerance: the value and its bound come back with TPK_ENUMERIC */
    double bt[3] = {0.2, -0.4, 0.7}, rt[3] = {0.3, -0.5, 0.4};
    EXPECT(tpk_mvn_tvn(bt, rt, 1e-300, &e, &ctx), TPK_ENUMERIC);
    assert_true(fabs(e.value - tvn_ref[0].p) <= e.err && e.err < BOUND_MAX);
    EXPECT(tpk_mvn_qvn(b, NULL, 0, &e, &ctx), TPK_EINVAL);
    EXPECT(tpk_mvn_qvn(b, R, -2, &e, &ctx), TPK_EINVAL);
    double R2[16];
    memcpy(R2, R, sizeof R2);
    R2[5] = 2.0;
    EXPECT(tpk_mvn_qvn(b, R2, 0, &e, &ctx), TPK_EDOM);
    EXPECT(tpk_mvn_cdf(5, b, R, 0, &e, &ctx), TPK_EINVAL);
    EXPECT(tpk_mvn_cdf(-1, b, R, 0, &e, &ctx), TPK_EINVAL);
    EXPECT(tpk_mvn_cdf(2, NULL, R, 0, &e, &ctx), TPK_EINVAL);
    EXPECT(tpk_mvn_cdf(2, b, R, -1e-9, &e, &ctx), TPK_EINVAL);
    double bn[2] = {NAN, 0}, Sn[4] = {1, 0, 0, -1}, Si[4] = {1, INFINITY, INFINITY, 1};
    EXPECT(tpk_mvn_cdf(2, bn, R, 0, &e, &ctx), TPK_EDOM);
    EXPECT(tpk_mvn_cdf(2, b, Sn, 0, &e, &ctx), TPK_EDOM);
    EXPECT(tpk_mvn_cdf(2, b, Si, 0, &e, &ctx), TPK_EDOM);
    double Sc[4] = {1, 1.5, 1.5, 1}; /* |correlation| > 1 */
    EXPECT(tpk_mvn_cdf(2, b, Sc, 0, &e, &ctx), TPK_EDOM);
    double Snp[9] = {1, 0.9, 0.9, 0.9, 1, -0.9, 0.9, -0.9, 1}; /* not PSD */
    EXPECT(tpk_mvn_cdf(3, b, Snp, 0, &e, &ctx), TPK_EDOM);
    /* singular without a perfectly correlated pair: X3 = (X1 + X2)/√2·… */
    double s = 1 / sqrt(2.0), Ssg[9] = {1, 0, s, 0, 1, s, s, s, 1};
    EXPECT(tpk_mvn_cdf(3, b, Ssg, 0, &e, &ctx), TPK_EUNSUPPORTED);
#undef EXPECT
}

/* ---- the SOV kernel (kernels/mvn_sov.c) ------------------------------------------------------ */

/* SIMD kernel vs its reference: the same sums to rounding (Φ, Φ⁻¹ within 2e-16 absolute and
 * 1e-15 relative of libm's; a sum of ≤ 64 products of factors ≤ 1). */
#define SOV_TOL 1e-12
/* Monte Carlo mean of the integrand vs the exact probability: this many standard errors. */
#define SOV_SE 5.0
/* tpk_mvn_normals vs GSL's inverse normal, relative (both ~1e-16; the tails through a log). */
#define NORMAL_TOL 1e-13

static double unif(uint64_t i, uint64_t j) { return tpk_rng_uniform_at(2385, 17, (uint32_t)i, (uint32_t)j); }

/* A random m×m lower-triangular factor with positive diagonal, row `zero` degenerate (L_ii = 0). */
static void random_factor(int m, int zero, uint64_t key, double *L, double *b)
{
    for (int i = 0; i < m; i++) {
        for (int k = 0; k < m; k++)
            L[i * m + k] = k < i ? 1.6 * unif(key, (uint64_t)(i * m + k)) - 0.8 : 0.0;
        L[i * m + i] = i == zero ? 0.0 : 0.4 + unif(key, 4096 + (uint64_t)i);
        b[i] = 2.4 * unif(key, 8192 + (uint64_t)i) - 1.1;
    }
}

static void test_sov_kernel(void **state)
{
    (void)state;
    double L[13 * 13], b[13], u[12 * TPK_MVN_SOV_BLK], sh[12];
    double worst = 0.0;
    for (int m = 1; m <= 13; m++)
        for (int var = 0; var < 4; var++) {
            random_factor(m, var == 3 ? m / 2 : -1, (uint64_t)(m * 10 + var), L, b);
            for (int j = 0; j < 12; j++) {
                sh[j] = unif(99, (uint64_t)(m * 100 + var * 12 + j));
                for (int p = 0; p < TPK_MVN_SOV_BLK; p++) /* some points near 0 and 1: the tails */
                    u[j * TPK_MVN_SOV_BLK + p] = p % 9 == 0 ? 1e-13 * (p + 1)
                                                : p % 11 == 0 ? 1.0 - 1e-12 * (p + 1)
                                                              : unif(7, (uint64_t)(j * 1000 + p));
            }
            const double *shift = var == 1 ? NULL : sh;
            int B = var == 2 ? TPK_MVN_SOV_BLK - 3 : TPK_MVN_SOV_BLK; /* a tail of scalar points */
            double v = tpk_mvn_sov_sum(m, L, b, u, shift, B);
            double r = tpk_mvn_sov_sum_ref(m, L, b, u, shift, B);
            assert_true(isfinite(v) && v >= 0.0 && v <= B);
            worst = fmax(worst, fabs(v - r));
            if (shift == NULL || var == 2) {
                /* the prefix sums: each the plain sum of the problem of the leading k + 1
                 * variables (its own factor, stride k + 1) */
                double ps[13] = {0}, pr[13] = {0}, Lk[13 * 13];
                tpk_mvn_sov_prefix(m, L, b, u, B, ps);
                tpk_mvn_sov_prefix_ref(m, L, b, u, B, pr);
                for (int k = 0; k < m; k++) {
                    for (int i = 0; i <= k; i++)
                        for (int c = 0; c <= k; c++)
                            Lk[i * (k + 1) + c] = L[i * m + c];
                    double sub = tpk_mvn_sov_sum_ref(k + 1, Lk, b, u, NULL, B);
                    worst = fmax(worst, fmax(fabs(ps[k] - sub), fabs(pr[k] - sub)));
                }
            }
        }
    print_message("SOV kernel vs reference: worst |diff| %.2e over m = 1..13\n", worst);
    assert_true(worst <= SOV_TOL);
    assert_true(tpk_mvn_sov_sum(0, L, b, u, NULL, 4) == 0.0);
    assert_true(tpk_mvn_sov_sum_ref(TPK_MVN_SOV_MAXDIM + 1, L, b, u, NULL, 4) == 0.0);
}

/* The integrand's mean over independent uniform points is P(X < b): against the exact trivariate
 * (tpk_mvn_tvn, Plackett's identity), for the factor of a correlation matrix. */
static void test_sov_mean(void **state)
{
    (void)state;
    const double r12 = 0.38, r13 = -0.27, r23 = 0.51, bb[3] = {0.31, -0.42, 0.77};
    double L[9] = {1, 0, 0, r12, sqrt(1 - r12 * r12), 0, r13, 0, 0};
    L[7] = (r23 - r12 * r13) / L[4];
    L[8] = sqrt(1 - r13 * r13 - L[7] * L[7]);
    double u[2 * TPK_MVN_SOV_BLK], s1 = 0, s2 = 0;
    int nblk = 4000;
    for (int k = 0; k < nblk; k++) {
        for (int j = 0; j < 2 * TPK_MVN_SOV_BLK; j++)
            u[j] = unif(31 + (uint64_t)k, (uint64_t)j);
        double x = tpk_mvn_sov_sum(3, L, bb, u, NULL, TPK_MVN_SOV_BLK) / TPK_MVN_SOV_BLK;
        s1 += x;
        s2 += x * x;
    }
    double mean = s1 / nblk, se = sqrt((s2 / nblk - mean * mean) / nblk);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_estimate e;
    double r[3] = {r12, r13, r23};
    assert_int_equal(tpk_mvn_tvn(bb, r, 0, &e, &ctx), TPK_OK);
    print_message("SOV Monte Carlo mean %.6f, exact %.6f, %.2f SE\n", mean, e.value,
                  fabs(mean - e.value) / se);
    assert_true(fabs(mean - e.value) <= SOV_SE * se);
}

static void test_normals(void **state)
{
    (void)state;
    enum { NP = 517 };
    double u[NP], sh[NP], x[NP];
    double worst = 0.0;
    for (int i = 0; i < NP; i++) /* 1e-300 .. 1 − 1e-15 on a log scale, and the middle */
        u[i] = i < 300 ? pow(10.0, -300.0 + i) : i < 315 ? 1.0 - pow(10.0, -(double)(i - 299))
                                                        : (i - 315 + 0.5) / (NP - 315);
    tpk_mvn_normals(NP, u, NULL, x);
    for (int i = 0; i < NP; i++) {
        double ref = gsl_cdf_ugaussian_Pinv(u[i]);
        worst = fmax(worst, fabs(x[i] - ref) / fmax(fabs(ref), 1e-3));
    }
    print_message("normals vs gsl_cdf_ugaussian_Pinv: worst relative %.2e\n", worst);
    assert_true(worst <= NORMAL_TOL);
    /* the shift and tent: Φ⁻¹(1 − |2 frac(u + s) − 1|) */
    for (int i = 0; i < NP; i++) {
        u[i] = unif(5, (uint64_t)i);
        sh[i] = unif(6, (uint64_t)i);
    }
    tpk_mvn_normals(NP, u, sh, x);
    for (int i = 0; i < NP; i++) {
        double v = fmod(u[i] + sh[i], 1.0), ref = gsl_cdf_ugaussian_Pinv(1.0 - fabs(2 * v - 1));
        assert_true(fabs(x[i] - ref) <= NORMAL_TOL * fmax(fabs(ref), 1e-3));
    }
}

/* Owen scrambling (tpk_mvn_owen_scramble): a nested scrambling keeps the number of leading bits
 * two fractions share, exactly, so the 2^p points j/2^p land one in each interval of length 2^-p;
 * for random seeds a fixed point is uniform (its mean within OWEN_SE standard errors of 1/2, its
 * leading bit a fair coin). */
#define OWEN_SE 5.0
static int common_bits(uint32_t x, uint32_t y)
{
    int k = 0;
    while (k < 32 && ((x ^ y) & (0x80000000u >> k)) == 0)
        k++;
    return k;
}

static uint32_t owen_bits(uint32_t x, uint32_t seed)
{
    uint32_t r = tpk_mvn_reverse_bits(x);
    double v;
    tpk_mvn_owen_scramble(1, &r, seed, &v);
    assert_true(v > 0.0 && v < 1.0);
    return (uint32_t)(v * 4294967296.0); /* the scrambled 32 bits (the half unit drops) */
}

static void test_owen_scramble(void **state)
{
    (void)state;
    assert_true(tpk_mvn_reverse_bits(1u) == 0x80000000u);
    assert_true(tpk_mvn_reverse_bits(0x12345678u) == 0x1E6A2C48u);
    for (uint32_t i = 0; i < 1000; i++) {
        uint32_t x = (uint32_t)(unif(41, i) * 4294967296.0);
        assert_true(tpk_mvn_reverse_bits(tpk_mvn_reverse_bits(x)) == x);
    }
    /* nested: the number of shared leading bits is kept, for every k */
    for (uint32_t i = 0; i < 4000; i++) {
        uint32_t seed = (uint32_t)(unif(42, i) * 4294967296.0);
        uint32_t x = (uint32_t)(unif(43, i) * 4294967296.0);
        int k = (int)(i % 32);
        uint32_t y = x ^ (0x80000000u >> k); /* the first difference at bit k */
        y ^= (uint32_t)(unif(44, i) * 4294967296.0) & (0xFFFFFFFFu >> (k + 1 < 32 ? k + 1 : 31));
        if (k == 31)
            y = x ^ 1u;
        assert_int_equal(common_bits(owen_bits(x, seed), owen_bits(y, seed)), common_bits(x, y));
    }
    /* a net stays a net: j/2^10 for j < 2^10 fill the 2^10 intervals */
    enum { P = 10 };
    static unsigned char hit[1 << P];
    memset(hit, 0, sizeof hit);
    for (uint32_t j = 0; j < (1u << P); j++)
        hit[owen_bits(j << (32 - P), 0x9E3779B9u) >> (32 - P)]++;
    for (int j = 0; j < (1 << P); j++)
        assert_int_equal(hit[j], 1);
    /* uniform over seeds */
    enum { NS = 20000 };
    double s1 = 0, s2 = 0;
    int ones = 0;
    for (uint32_t i = 0; i < NS; i++) {
        uint32_t seed = (uint32_t)(unif(45, i) * 4294967296.0), v = owen_bits(0x40000000u, seed);
        double x = v / 4294967296.0;
        s1 += x;
        s2 += x * x;
        ones += (int)(v >> 31);
    }
    double mean = s1 / NS, se = sqrt((s2 / NS - mean * mean) / NS);
    print_message("Owen scrambling of 1/4 over %d seeds: mean %.4f (%.2f SE from 1/2), leading "
                  "bit 1 in %d\n", NS, mean, fabs(mean - 0.5) / se, ones);
    assert_true(fabs(mean - 0.5) <= OWEN_SE * se);
    assert_true(fabs(ones - NS / 2.0) <= OWEN_SE * sqrt(NS / 4.0));
}

static void test_speed(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_estimate e;
    double sum = 0, t0 = seconds();
    for (int i = 0; i < 20000; i++) {
        tpk_mvn_bvn(-1.0 + 1e-4 * i, 0.5, 0.3 + 3e-5 * i, &e, &ctx);
        sum += e.value;
    }
    double t1 = seconds();
    double b[3] = {0.2, -0.4, 0.7}, r[3] = {0.3, -0.5, 0.4};
    for (int i = 0; i < 2000; i++) {
        b[0] = 0.2 + 1e-4 * i;
        tpk_mvn_tvn(b, r, 0, &e, &ctx);
        sum += e.value;
    }
    double t2 = seconds();
    double b4[4] = {0.5, -0.4, 1.3, 0.2}, R[16] = {1, 0.3, -0.2, 0.5, 0.3, 1, 0.4, 0.1,
                                                   -0.2, 0.4, 1, -0.3, 0.5, 0.1, -0.3, 1};
    for (int i = 0; i < 100; i++) {
        b4[0] = 0.5 + 1e-3 * i;
        tpk_mvn_qvn(b4, R, 0, &e, &ctx);
        sum += e.value;
    }
    double t3 = seconds();
    print_message("time per call: BVN %.2f us, TVN %.1f us, QVN %.0f us (checksum %.3f)\n",
                  (t1 - t0) / 20000 * 1e6, (t2 - t1) / 2000 * 1e6, (t3 - t2) / 100 * 1e6, sum);
}

int main(void)
{
    gsl_set_error_handler_off();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bvn_reference), cmocka_unit_test(test_bvn_orthant),
        cmocka_unit_test(test_bvn_gsl),       cmocka_unit_test(test_tvn_reference),
        cmocka_unit_test(test_tvn_orthant),   cmocka_unit_test(test_tvn_gsl),
        cmocka_unit_test(test_qvn),           cmocka_unit_test(test_cdf_reductions),
        cmocka_unit_test(test_errors),        cmocka_unit_test(test_speed),
        cmocka_unit_test(test_sov_kernel),    cmocka_unit_test(test_sov_mean),
        cmocka_unit_test(test_normals),       cmocka_unit_test(test_owen_scramble),
    };
    return cmocka_run_group_tests_name("mvn", tests, NULL, NULL);
}
