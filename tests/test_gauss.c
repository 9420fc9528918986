/* Gaussian expectations (theory.md §3): closed forms against independent oracles (adaptive
 * nested QAGP, Monte Carlo), the quadrature back-end, §3.4 invariants, maps, and every error path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <gsl/gsl_errno.h>
#include <gsl/gsl_integration.h>
#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>
#include <lapacke.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/gauss_impl.h"
#include "tpk/gauss.h"

/* ---- tolerances (relative to the natural scale √(Eφ(u)² Eφ(v)²) unless said otherwise) ---- */
/* Closed form vs the nested adaptive oracle: the oracle is asked for 1e-13 and usually gets it;
 * 1e-9 leaves room for its hardest cases (jumps of sign/step at ρ → ±1) and still catches any
 * wrong formula, whose errors are O(1e-3) or more. */
#define TOL_ORACLE 1e-9
/* Closed form vs the Gauss–Hermite/polar back-end at D = QUAD_DEGREE (theory.md §3.3: 1e-13 for
 * smooth φ at D = 64; steep ones such as erf(1.73x) need 128; the polar rule makes φ kinked at 0
 * exponentially convergent too). */
#define TOL_QUAD 1e-10
#define QUAD_DEGREE 128
/* Monte Carlo: |mean − E| within 5 standard errors (sample sd / √M); fails by chance ~6e-7. */
#define MC_SIGMAS 5.0
#define MC_SAMPLES 200000
/* Vector map kernels vs the scalar closed form: a 2-ulp asin and a few reassociated products. */
#define TOL_MAP 1e-14
/* PSD: smallest eigenvalue ≥ −1e-12 ‖K‖ (theory.md §3.4, structural). */
#define TOL_PSD 1e-12
/* Our vectorised asin against glibc's (< 1 ulp): the brief allows ~4 ulp; we measure ≤ 2. */
#define ASIN_MAX_ULP 3.0

typedef struct fixture {
    tpk_ctx ctx;
    tpk_phi_registry *reg;
    tpk_gauss_ws *ws, *ws128;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    tpk_ctx_init(&f->ctx);
    f->reg = tpk_phi_registry_alloc(&f->ctx);
    f->ws = tpk_gauss_ws_alloc(TPK_GAUSS_DEFAULT_DEGREE, &f->ctx);
    f->ws128 = tpk_gauss_ws_alloc(QUAD_DEGREE, &f->ctx);
    *state = f;
    /* The oracle (GSL quadrature called here) may report "roundoff limits the tolerance"; we
     * judge its result ourselves, so GSL must return that as a code: the toolkit's own switch
     * (tpk_gauss_ws_alloc above has already thrown it; this says so). */
    tpk_error_gsl_init();
    return f->reg && f->ws && f->ws128 ? 0 : -1;
}

static int teardown(void **state)
{
    fixture *f = *state;
    tpk_gauss_ws_free(f->ws);
    tpk_gauss_ws_free(f->ws128);
    tpk_phi_registry_free(f->reg);
    free(f);
    return 0;
}

static tpk_phi *phi_new(fixture *f, const char *spec)
{
    tpk_phi *p = tpk_phi_alloc(f->reg, spec, &f->ctx);
    if (!p)
        fail_msg("tpk_phi_alloc(%s): %s", spec, f->ctx.msg);
    return p;
}

static tpk_estimate e2(fixture *f, const tpk_phi *p, double q1, double q2, double k)
{
    tpk_estimate r = {NAN, NAN};
    if (tpk_gauss_expect2(p, q1, q2, k, f->ws, &r, &f->ctx))
        fail_msg("expect2(%s, %g, %g, %g): %s", tpk_phi_name(p), q1, q2, k, f->ctx.msg);
    return r;
}

/* ==== independent oracle: nested adaptive quadrature (GSL QAGP) on the conditional form ====
 * E[f(u)g(v)] = ∫ f(m1 + √q1 z) G(z) φ(z) dz, G(z) = E g(μ(z) + σY), μ(z) = m2 + ρ√q2 z,
 * σ = √(q2(1−ρ²)); breakpoints where the arguments of f and g cross 0 (the kinks/jumps). */
#define ORC_L 12.0 /* truncation at 12 sd: mass e^{-72} */

typedef struct orc {
    const tpk_phi *f, *g;
    double m1, m2, su, sv, rho, sig, z;
    gsl_integration_workspace *wo, *wi;
} orc;

static double npdf(double z) { return exp(-0.5 * z * z) / sqrt(2 * M_PI); }

static double orc_inner(double y, void *p)
{
    orc *o = p;
    return tpk_phi_eval(o->g, o->m2 + o->rho * o->sv * o->z + o->sig * y) * npdf(y);
}

static double qagp_sorted(gsl_function *F, double *pts, size_t npts, gsl_integration_workspace *w)
{
    /* sort, drop duplicates and points outside (−L, L) */
    double p[6];
    size_t n = 0;
    p[n++] = -ORC_L;
    for (size_t i = 0; i < npts; i++)
        if (pts[i] > -ORC_L && pts[i] < ORC_L)
            p[n++] = pts[i];
    p[n++] = ORC_L;
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && p[j - 1] > p[j]; j--) {
            double t = p[j];
            p[j] = p[j - 1];
            p[j - 1] = t;
        }
    size_t m = 1;
    for (size_t i = 1; i < n; i++)
        if (p[i] > p[m - 1])
            p[m++] = p[i];
    double r, e;
    gsl_integration_qagp(F, p, m, 1e-15, 1e-13, 1000, w, &r, &e);
    return r;
}

static double orc_outer(double z, void *p)
{
    orc *o = p;
    const double fz = tpk_phi_eval(o->f, o->m1 + o->su * z);
    if (fz == 0.0)
        return 0.0;
    const double mu = o->m2 + o->rho * o->sv * z;
    double G;
    if (o->sig == 0.0) {
        G = tpk_phi_eval(o->g, mu);
    } else {
        o->z = z;
        gsl_function F = {orc_inner, o};
        double pt = -mu / o->sig;
        G = qagp_sorted(&F, &pt, 1, o->wi);
    }
    return fz * G * npdf(z);
}

static double oracle2(const tpk_phi *f, const tpk_phi *g, double m1, double m2, double q1,
                      double q2, double k)
{
    double rho = k / (sqrt(q1) * sqrt(q2));
    rho = rho > 1 ? 1 : rho < -1 ? -1 : rho;
    orc o = {f, g, m1, m2, sqrt(q1), sqrt(q2), rho, sqrt(q2 * (1 - rho) * (1 + rho)), 0, NULL, NULL};
    o.wo = gsl_integration_workspace_alloc(1000);
    o.wi = gsl_integration_workspace_alloc(1000);
    gsl_function F = {orc_outer, &o};
    double pts[2];
    size_t np = 0;
    pts[np++] = -m1 / o.su;
    if (rho != 0)
        pts[np++] = -m2 / (rho * o.sv);
    double r = qagp_sorted(&F, pts, np, o.wo);
    gsl_integration_workspace_free(o.wo);
    gsl_integration_workspace_free(o.wi);
    return r;
}

typedef struct orc1 {
    const tpk_phi *f;
    double m, s;
} orc1;

static double orc1_fn(double z, void *p)
{
    orc1 *o = p;
    return tpk_phi_eval(o->f, o->m + o->s * z) * npdf(z);
}

static double oracle1(const tpk_phi *f, double m, double q)
{
    orc1 o = {f, m, sqrt(q)};
    gsl_integration_workspace *w = gsl_integration_workspace_alloc(1000);
    gsl_function F = {orc1_fn, &o};
    double pt = -m / o.s;
    double r = qagp_sorted(&F, &pt, 1, w);
    gsl_integration_workspace_free(w);
    return r;
}

/* Monte Carlo mean and standard error of f(u)g(v). */
static void mc2(const tpk_phi *f, const tpk_phi *g, double m1, double m2, double q1, double q2,
                double k, unsigned long seed, double *mean, double *se)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, seed);
    const double su = sqrt(q1), rho = k / (sqrt(q1) * sqrt(q2));
    const double a = rho * sqrt(q2), b = sqrt(q2 * (1 - rho) * (1 + rho) > 0 ? q2 * (1 - rho) * (1 + rho) : 0);
    double s = 0, s2 = 0;
    for (int i = 0; i < MC_SAMPLES; i++) {
        const double x = gsl_ran_gaussian_ziggurat(r, 1.0), y = gsl_ran_gaussian_ziggurat(r, 1.0);
        const double h = tpk_phi_eval(f, m1 + su * x) * tpk_phi_eval(g, m2 + a * x + b * y);
        s += h;
        s2 += h * h;
    }
    *mean = s / MC_SAMPLES;
    const double var = (s2 - s * s / MC_SAMPLES) / (MC_SAMPLES - 1);
    *se = sqrt(var > 0 ? var : 0) / sqrt((double)MC_SAMPLES);
    gsl_rng_free(r);
}

/* Every closed-form built-in, with "high-entropy" parameters where it has any. */
static const char *const closed_specs[] = {
    "identity", "relu", "leaky_relu(0.17)", "abrelu(-0.37,1.61)", "abs", "step", "sign",
    "erf", "erf(1.73)", "erf_sigmoid", "gelu", "sin(1.31,0.77,0.43)", "cos(0.89,1.21,-0.29)",
    "exp(0.53,0.81)", "expsq(1.13,-0.31)", "expsq(0.71,0.09)", "arccos0", "arccos1", "arccos2",
    "x2", "x3", "x4", "x5",
};
#define NCLOSED (sizeof closed_specs / sizeof closed_specs[0])

/* Covariances: generic, negative, |ρ| near 1 both signs, ρ = ±1 exactly, ρ = 0, unequal q. */
static const double covs[][3] = {
    {1.37, 0.82, 0.41},
    {1.37, 0.82, -0.61},
    {0.53, 2.11, 0.95 * 1.0575916},  /* ρ ≈ 0.95 (√(0.53·2.11) = 1.0575916) */
    {0.53, 2.11, -0.999 * 1.0575916}, /* ρ ≈ −0.999 */
    {0.77, 0.77, 0.77},                /* ρ = 1 */
    {0.64, 1.44, -0.96},               /* ρ = −1 exactly: √(0.64·1.44) = 0.96 */
    {0.77, 1.9, 0.0},
};
#define NCOVS (sizeof covs / sizeof covs[0])

static double natural_scale(fixture *f, const tpk_phi *p, double q1, double q2)
{
    double a = fabs(e2(f, p, q1, q1, q1).value), b = fabs(e2(f, p, q2, q2, q2).value);
    double s = sqrt(a * b);
    return s > 1e-300 ? s : 1.0;
}

/* ==== closed forms ========================================================================= */

static void test_closed_vs_oracle(void **state)
{
    fixture *f = *state;
    for (size_t s = 0; s < NCLOSED; s++) {
        tpk_phi *p = phi_new(f, closed_specs[s]);
        assert_true(tpk_phi_has_closed_form(p));
        for (size_t c = 0; c < NCOVS; c++) {
            const double q1 = covs[c][0], q2 = covs[c][1], k = covs[c][2];
            tpk_estimate r = e2(f, p, q1, q2, k);
            const double o = oracle2(p, p, 0, 0, q1, q2, k), sc = natural_scale(f, p, q1, q2);
            if (!(fabs(r.value - o) <= TOL_ORACLE * sc))
                fail_msg("%s at (%g,%g,%g): closed %.17g oracle %.17g", tpk_phi_name(p), q1, q2, k,
                         r.value, o);
            /* the reported rounding bound is honest: within it of the oracle (up to the oracle's
             * own ~1e-13) */
            if (!(fabs(r.value - o) <= r.err + 1e-12 * sc))
                fail_msg("%s at (%g,%g,%g): |closed - oracle| = %.3e > err %.3e", tpk_phi_name(p), q1,
                         q2, k, fabs(r.value - o), r.err);
        }
        tpk_phi_free(p);
    }
}

static void test_closed_vs_quadrature(void **state)
{
    fixture *f = *state;
    for (size_t s = 0; s < NCLOSED; s++) {
        tpk_phi *p = phi_new(f, closed_specs[s]);
        for (size_t c = 0; c < NCOVS; c++) {
            const double q1 = covs[c][0], q2 = covs[c][1], k = covs[c][2];
            tpk_estimate r = e2(f, p, q1, q2, k), qd;
            assert_int_equal(tpk_gauss_expect2_quad(p, p, 0, 0, q1, q2, k, f->ws128, &qd, &f->ctx), TPK_OK);
            const double sc = natural_scale(f, p, q1, q2), d = fabs(r.value - qd.value);
            if (!(d <= TOL_QUAD * sc))
                fail_msg("%s at (%g,%g,%g): closed %.17g quad %.17g (err %.2e)", tpk_phi_name(p), q1,
                         q2, k, r.value, qd.value, qd.err);
            /* the quadrature's own error estimate covers the difference */
            if (!(d <= qd.err + r.err + 1e-15 * sc))
                fail_msg("%s at (%g,%g,%g): quad error estimate %.2e < actual %.2e", tpk_phi_name(p),
                         q1, q2, k, qd.err, d);
        }
        tpk_phi_free(p);
    }
}

static void test_closed_vs_monte_carlo(void **state)
{
    fixture *f = *state;
    static const double mc_covs[][3] = {{1.37, 0.82, 0.41}, {0.53, 2.11, -0.83}};
    unsigned long seed = 2385;
    for (size_t s = 0; s < NCLOSED; s++) {
        tpk_phi *p = phi_new(f, closed_specs[s]);
        for (size_t c = 0; c < 2; c++) {
            const double q1 = mc_covs[c][0], q2 = mc_covs[c][1], k = mc_covs[c][2];
            tpk_estimate r = e2(f, p, q1, q2, k);
            double mean, se;
            mc2(p, p, 0, 0, q1, q2, k, seed++, &mean, &se);
            if (!(fabs(mean - r.value) <= MC_SIGMAS * se + 1e-15))
                fail_msg("%s at (%g,%g,%g): closed %.10g MC %.10g ± %.2e", tpk_phi_name(p), q1, q2, k,
                         r.value, mean, se);
        }
        tpk_phi_free(p);
    }
}

/* theory.md §3.4 values and the diagonal column of §3.2. */
static void test_invariants(void **state)
{
    fixture *f = *state;
    tpk_phi *erf1 = phi_new(f, "erf"), *relu = phi_new(f, "relu"), *step = phi_new(f, "step");
    assert_true(fabs(e2(f, erf1, 1, 1, 1).value - 0.4645590543975399) < 4e-16);
    assert_true(fabs(e2(f, relu, 1, 1, 0).value - 1 / (2 * M_PI)) < 1e-16);
    assert_true(e2(f, relu, 1, 1, 1).value == 0.5); /* exact: He init keeps the diagonal at 1 */
    assert_true(fabs(e2(f, relu, 1, 1, -1).value) < 1e-16);
    assert_true(fabs(e2(f, step, 1, 1, 0).value - 0.25) < 1e-16);
    /* He-ReLU correlation map c ↦ (√(1−c²) + (π − arccos c)c)/π = 2 E[relu relu] at q = 1 */
    for (double c = -0.95; c < 1; c += 0.1) {
        const double want = (sqrt(1 - c * c) + (M_PI - acos(c)) * c) / M_PI;
        assert_true(fabs(2 * e2(f, relu, 1, 1, c).value - want) < 4e-16);
    }
    /* E[relu(u)^4] = 3q²/2, i.e. arccos2 on the diagonal */
    tpk_phi *ac2 = phi_new(f, "arccos2");
    assert_true(fabs(e2(f, ac2, 1.37, 1.37, 1.37).value - 1.5 * 1.37 * 1.37) < 1e-15);

    /* diagonal column (q1 = q2 = k = q) */
    const double q = 1.37;
    struct { const char *spec; double want; } diag[] = {
        {"identity", q},
        {"relu", q / 2},
        {"abrelu(-0.37,1.61)", (0.37 * 0.37 + 1.61 * 1.61) * q / 2},
        {"abs", q},
        {"step", 0.5},
        {"sign", 1.0},
        {"arccos0", 0.5},
        {"arccos1", q / 2},
        {"arccos2", 1.5 * q * q},
        {"erf", 2 / M_PI * asin(2 * q / (1 + 2 * q))},
        {"erf(1.73)", 2 / M_PI * asin(2 * 1.73 * 1.73 * q / (1 + 2 * 1.73 * 1.73 * q))},
        {"gelu", q / 4 + q * atan(q / sqrt(1 + 2 * q)) / (2 * M_PI) +
                     q * q / (M_PI * (1 + q) * sqrt(1 + 2 * q))},
        {"x2", 3 * q * q},
        {"x3", 15 * q * q * q},
        {"x4", 105 * q * q * q * q},
        {"x5", 945 * q * q * q * q * q},
        {"exp(0.53,0.81)", 0.53 * 0.53 * exp(2 * 0.81 * 0.81 * q)},
        {"sin(1.31,0.77,0.43)", 1.31 * 1.31 / 2 * (1 - cos(0.86) * exp(-2 * 0.77 * 0.77 * q))},
    };
    for (size_t i = 0; i < sizeof diag / sizeof diag[0]; i++) {
        tpk_phi *p = phi_new(f, diag[i].spec);
        tpk_estimate r = e2(f, p, q, q, q);
        if (!(fabs(r.value - diag[i].want) <= 8 * DBL_EPSILON * fabs(diag[i].want)))
            fail_msg("%s diagonal: %.17g, want %.17g", diag[i].spec, r.value, diag[i].want);
        tpk_phi_free(p);
    }
    /* symmetry in (q1, q2) and the scaling rules of §3.1 */
    tpk_phi *erfb = phi_new(f, "erf(1.73)"), *s1 = phi_new(f, "sin(1,0.77,0.43)"),
            *s2 = phi_new(f, "sin(1.31,0.77,0.43)");
    for (size_t c = 0; c < NCOVS; c++) {
        const double q1 = covs[c][0], q2 = covs[c][1], k = covs[c][2], b2 = 1.73 * 1.73;
        assert_true(fabs(e2(f, erfb, q1, q2, k).value - e2(f, erfb, q2, q1, k).value) < 1e-15);
        assert_true(fabs(e2(f, erfb, q1, q2, k).value - e2(f, erf1, b2 * q1, b2 * q2, b2 * k).value) < 1e-15);
        assert_true(fabs(e2(f, s2, q1, q2, k).value - 1.31 * 1.31 * e2(f, s1, q1, q2, k).value) < 1e-15);
    }
    tpk_phi_free(erfb);
    tpk_phi_free(s1);
    tpk_phi_free(s2);
    tpk_phi_free(ac2);
    tpk_phi_free(erf1);
    tpk_phi_free(relu);
    tpk_phi_free(step);
}

/* Zero variances, ρ = ±1 and rounding-level non-PSD input: finite, and the right limit. */
static void test_degenerate_inputs(void **state)
{
    fixture *f = *state;
    for (size_t s = 0; s < NCLOSED; s++) {
        tpk_phi *p = phi_new(f, closed_specs[s]);
        const double q = 0.83, f0 = tpk_phi_eval(p, 0.0);
        tpk_estimate m1;
        assert_int_equal(tpk_gauss_expect1(p, 0.0, q, f->ws, &m1, &f->ctx), TPK_OK);
        /* u ≡ 0: E = φ(0)·E φ(v) */
        tpk_estimate r = e2(f, p, 0.0, q, 0.0);
        assert_true(fabs(r.value - f0 * m1.value) <= 1e-15 * (1 + fabs(f0 * m1.value)));
        r = e2(f, p, q, 0.0, 0.0);
        assert_true(fabs(r.value - f0 * m1.value) <= 1e-15 * (1 + fabs(f0 * m1.value)));
        r = e2(f, p, 0.0, 0.0, 0.0);
        assert_true(r.value == f0 * f0);
        /* |k| above √(q1q2) by rounding only: clamped to ρ = ±1 */
        const double q1 = 1.37, q2 = 0.82, s12 = sqrt(q1 * q2);
        tpk_estimate hi = e2(f, p, q1, q2, s12 * (1 + 1e-13)), at = e2(f, p, q1, q2, s12);
        tpk_estimate lo = e2(f, p, q1, q2, -s12 * (1 + 1e-13));
        assert_true(isfinite(hi.value) && isfinite(lo.value) && isfinite(hi.err) && isfinite(lo.err));
        assert_true(fabs(hi.value - at.value) <= 1e-12 * (1 + fabs(at.value)));
        tpk_phi_free(p);
    }
    /* step has φ(0) = 0: a zero input is orthogonal to everything */
    tpk_phi *step = phi_new(f, "step"), *es = phi_new(f, "erf_sigmoid"), *cs = phi_new(f, "cos");
    assert_true(e2(f, step, 0, 1.3, 0).value == 0.0);
    assert_true(fabs(e2(f, es, 0, 1.3, 0).value - 0.25) < 1e-16);
    assert_true(fabs(e2(f, cs, 0, 1.3, 0).value - exp(-0.65)) < 1e-16);
    tpk_phi_free(step);
    tpk_phi_free(es);
    tpk_phi_free(cs);
}

/* ==== 1-D expectations with means, quadrature with means ================================== */

static void test_expect1(void **state)
{
    fixture *f = *state;
    static const double mq[][2] = {{0.0, 1.37}, {0.61, 0.82}, {-1.13, 2.11}, {2.9, 0.04}};
    static const char *const num[] = {"tanh", "softplus", "elu(0.7)", "silu", "softsign", "hardtanh"};
    for (size_t s = 0; s < NCLOSED + 6; s++) {
        tpk_phi *p = phi_new(f, s < NCLOSED ? closed_specs[s] : num[s - NCLOSED]);
        for (size_t c = 0; c < 4; c++) {
            tpk_estimate r;
            assert_int_equal(tpk_gauss_expect1(p, mq[c][0], mq[c][1], f->ws, &r, &f->ctx), TPK_OK);
            const double o = oracle1(p, mq[c][0], mq[c][1]);
            const double tol = s < NCLOSED ? TOL_ORACLE : r.err + TOL_ORACLE;
            if (!(fabs(r.value - o) <= tol * (1 + fabs(o))))
                fail_msg("E %s(N(%g,%g)): %.17g oracle %.17g (err %.2e)", tpk_phi_name(p), mq[c][0],
                         mq[c][1], r.value, o, r.err);
        }
        tpk_phi_free(p);
    }
    /* relu, m = 0: √(q/2π) */
    tpk_phi *relu = phi_new(f, "relu");
    tpk_estimate r;
    assert_int_equal(tpk_gauss_expect1(relu, 0.0, 1.37, NULL, &r, &f->ctx), TPK_OK);
    assert_true(fabs(r.value - sqrt(1.37 / (2 * M_PI))) < 1e-16);
    tpk_phi_free(relu);
}

/* Means and two different functions: smooth pairs by the tensor rule, kinked by the polar rule. */
static void test_quad_with_means(void **state)
{
    fixture *f = *state;
    static const char *const pairs[][2] = {
        {"tanh", "erf"}, {"gelu", "sin(1.31,0.77,0.43)"}, {"relu", "tanh"}, {"step", "erf"},
        {"elu(0.7)", "relu"}, {"softplus", "sigmoid"},
    };
    static const double c[][5] = {
        {0.31, -0.47, 1.37, 0.82, 0.41}, {-0.9, 0.2, 0.53, 2.11, -0.8}, {0.0, 0.0, 0.77, 1.9, 0.3},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        tpk_phi *a = phi_new(f, pairs[i][0]), *b = phi_new(f, pairs[i][1]);
        const int smooth = (tpk_phi_flags(a) & tpk_phi_flags(b) & TPK_PHI_SMOOTH) != 0;
        for (size_t j = 0; j < 3; j++) {
            tpk_estimate r;
            assert_int_equal(tpk_gauss_expect2_quad(a, b, c[j][0], c[j][1], c[j][2], c[j][3], c[j][4],
                                                    f->ws128, &r, &f->ctx), TPK_OK);
            const double o = oracle2(a, b, c[j][0], c[j][1], c[j][2], c[j][3], c[j][4]);
            const double d = fabs(r.value - o);
            /* error estimate honest (1e-13: the oracle's own accuracy) */
            if (!(d <= r.err + 1e-13))
                fail_msg("E[%s %s] at %zu: |quad - oracle| = %.2e > err %.2e", pairs[i][0],
                         pairs[i][1], j, d, r.err);
            /* smooth pairs and zero means converge fast; kinks off 0 only algebraically */
            const double tol = smooth || (c[j][0] == 0 && c[j][1] == 0) ? TOL_QUAD : 1e-4;
            if (!(d <= tol))
                fail_msg("E[%s %s] at %zu: %.17g oracle %.17g", pairs[i][0], pairs[i][1], j, r.value, o);
        }
        tpk_phi_free(a);
        tpk_phi_free(b);
    }
}

/* ==== numerical-only built-ins and user functions ========================================== */

static double xtanh(double x, const double *p)
{
    (void)p;
    return x * tanh(x);
}

static double shifted_tanh(double x, const double *p) { return p[1] * tanh(x + p[0]); }

/* tpk_phi_eval_n against tpk_phi_eval for every built-in (the vectorised ones by libmvec, which
 * promises 4 ulp; the rest through the scalar function) and a user function, on a grid with
 * zeros, subnormals, the tails, ±inf and NaN, out of place and in place, at a length that is no
 * multiple of any vector width. */
static void test_phi_eval_n(void **state)
{
    fixture *f = *state;
    assert_int_equal(tpk_phi_register(f->reg, "xtanh2", xtanh, 0, NULL, TPK_PHI_SMOOTH, &f->ctx), TPK_OK);
    static const char *const specs[] = {"identity", "relu", "arccos1", "leaky_relu(0.2)", "abrelu(-0.3,2)", "abs",
                                        "step", "sign", "erf", "erf(2.5)", "erf_sigmoid", "gelu", "sin(2,0.5,0.1)",
                                        "cos", "exp(0.5,-1.5)", "expsq", "arccos2", "x2", "x3", "x4", "x5", "tanh",
                                        "sigmoid", "softplus", "silu", "elu(0.7)", "selu", "softsign",
                                        "gelu_tanh", "mish", "hardtanh", "xtanh2"};
    enum { NX = 1003 };
    double x[NX], y[NX], z[NX];
    for (int i = 0; i < NX; i++)
        x[i] = -40.0 + 80.0 * i / (NX - 1) + 1e-3 * sin(i);
    const double special[] = {0.0, -0.0, 5e-324, -5e-324, 1e-300, -1e-300, 1e-8, -1e-8, 0.5, -0.5, 6.0, -6.0,
                              27.0, -27.0, 700.0, -700.0, INFINITY, -INFINITY, NAN};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        x[7 * i + 3] = special[i];
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        tpk_phi *p = phi_new(f, specs[s]);
        tpk_phi_eval_n(p, NX, x, y);
        memcpy(z, x, sizeof z);
        tpk_phi_eval_n(p, NX, z, z);
        for (int i = 0; i < NX; i++) {
            const double r = tpk_phi_eval(p, x[i]);
            assert_memory_equal(&y[i], &z[i], sizeof y[i]); /* in place: the same bits */
            if (isnan(r) && isnan(y[i]))
                continue;
            const double a = fabs(r), ulp = a < DBL_MIN ? 5e-324 : nextafter(a, INFINITY) - a;
            if (!(r == y[i] || fabs(r - y[i]) <= 4 * ulp))
                fail_msg("%s(%.17g): batched %.17g, scalar %.17g (%.1f ulp)", specs[s], x[i], y[i], r,
                         fabs(r - y[i]) / ulp);
        }
        tpk_phi_free(p);
    }
}

static void test_numeric_and_user_functions(void **state)
{
    fixture *f = *state;
    assert_int_equal(tpk_phi_register(f->reg, "xtanh", xtanh, 0, NULL,
                                      TPK_PHI_CONTROLLED | TPK_PHI_POLY_BOUNDED | TPK_PHI_SMOOTH,
                                      &f->ctx), TPK_OK);
    const double defs[2] = {0.25, 1.5};
    assert_int_equal(tpk_phi_register(f->reg, "stanh", shifted_tanh, 2, defs, TPK_PHI_SMOOTH, &f->ctx),
                     TPK_OK);
    static const char *const specs[] = {"xtanh", "stanh", "stanh(-0.4)", "tanh", "sigmoid", "softplus",
                                        "silu", "elu(0.7)", "selu", "softsign", "gelu_tanh", "mish",
                                        "hardtanh"};
    unsigned long seed = 7919;
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        tpk_phi *p = phi_new(f, specs[s]);
        assert_false(tpk_phi_has_closed_form(p));
        for (size_t c = 0; c < 4; c++) {
            const double q1 = covs[c][0], q2 = covs[c][1], k = covs[c][2];
            tpk_estimate r = e2(f, p, q1, q2, k);
            double mean, se;
            mc2(p, p, 0, 0, q1, q2, k, seed++, &mean, &se);
            if (!(fabs(mean - r.value) <= MC_SIGMAS * se + r.err))
                fail_msg("%s: quad %.10g (err %.1e) MC %.10g ± %.1e", tpk_phi_name(p), r.value, r.err,
                         mean, se);
            const double o = oracle2(p, p, 0, 0, q1, q2, k);
            if (!(fabs(o - r.value) <= r.err + 1e-13))
                fail_msg("%s at (%g,%g,%g): |quad - oracle| = %.2e > err %.2e", tpk_phi_name(p), q1, q2,
                         k, fabs(o - r.value), r.err);
        }
        tpk_phi_free(p);
    }
    tpk_phi *st = phi_new(f, "stanh(-0.4)");
    assert_string_equal(tpk_phi_name(st), "stanh(-0.4,1.5)");
    assert_true(tpk_phi_eval(st, 0.9) == 1.5 * tanh(0.5));
    tpk_phi_free(st);
}

/* ==== registry, spec parsing ============================================================== */

static void test_registry_and_specs(void **state)
{
    fixture *f = *state;
    struct { const char *spec, *canon; double x, fx; } cases[] = {
        {"relu", "relu", -1.3, 0.0},
        {"  leaky_relu ( 0.1 ) ", "leaky_relu(0.1)", -2.0, -0.2},
        {"leaky_relu", "leaky_relu(0.01)", -2.0, -0.02},
        {"abrelu(-0.5,2)", "abrelu(-0.5,2)", -2.0, 1.0},
        {"erf(2.5)", "erf(2.5)", 0.3, 0.0},
        {"erf()", "erf(1)", 0.3, 0.0},
        {"sin(1.3)", "sin(1.3,1,0)", 0.7, 1.3 * 0.644217687237691},
        {"x3", "x3", -1.5, -3.375},
        {"arccos2", "arccos2", -1.0, 0.0},
        {"sign", "sign", -0.2, -1.0},
        {"gelu", "gelu", 0.0, 0.0},
    };
    cases[4].fx = erf(0.75);
    cases[5].fx = erf(0.3);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tpk_phi *p = phi_new(f, cases[i].spec);
        assert_string_equal(tpk_phi_name(p), cases[i].canon);
        assert_true(fabs(tpk_phi_eval(p, cases[i].x) - cases[i].fx) < 1e-15);
        /* the canonical name reads back as the same function */
        tpk_phi *p2 = phi_new(f, tpk_phi_name(p));
        assert_string_equal(tpk_phi_name(p2), tpk_phi_name(p));
        tpk_phi_free(p2);
        tpk_phi_free(p);
    }
    tpk_phi *p = phi_new(f, "leaky_relu(0.1)");
    assert_true(tpk_phi_flags(p) & TPK_PHI_LIPSCHITZ);
    assert_true(tpk_phi_flags(p) & TPK_PHI_POS_HOMOGENEOUS);
    assert_false(tpk_phi_flags(p) & TPK_PHI_SMOOTH);
    tpk_phi_free(p);
    p = phi_new(f, "expsq(1,0.2)"); /* e^{0.2x²}: not controlled */
    assert_false(tpk_phi_flags(p) & TPK_PHI_CONTROLLED);
    tpk_phi_free(p);

    /* the listing names every built-in, flags and the back-end */
    char *buf = NULL;
    size_t len = 0;
    FILE *mf = open_memstream(&buf, &len);
    assert_int_equal(tpk_phi_register(f->reg, "my_phi", xtanh, 1, NULL, 0, &f->ctx), TPK_OK);
    tpk_phi_registry_list(f->reg, mf);
    fclose(mf);
    for (size_t s = 0; s < NCLOSED; s++) {
        char name[32];
        snprintf(name, sizeof name, "\n%.*s", (int)strcspn(closed_specs[s], "("), closed_specs[s]);
        assert_non_null(strstr(buf, name));
    }
    assert_non_null(strstr(buf, "\nmy_phi(p1=0)"));
    assert_non_null(strstr(buf, "\nleaky_relu(a=0.01)"));
    assert_non_null(strstr(buf, "closed-form"));
    assert_non_null(strstr(buf, "quadrature"));
    free(buf);
    tpk_phi_registry_free(NULL);
    tpk_phi_free(NULL);
    tpk_gauss_ws_free(NULL);
    assert_int_equal(tpk_gauss_ws_degree(f->ws), TPK_GAUSS_DEFAULT_DEGREE);
}

/* ==== error paths ========================================================================= */

#define EXPECT_ERR(call, want, needle)                                                            \
    do {                                                                                          \
        tpk_ctx c_;                                                                               \
        tpk_ctx_init(&c_);                                                                        \
        tpk_ctx *ctx = &c_;                                                                       \
        int st_ = (call);                                                                         \
        if (st_ != (want) || c_.status != (want) || !strstr(c_.msg, (needle)))                    \
            fail_msg("%s: status %d (want %d), message '%s' (want '%s')", #call, st_, (want),    \
                     c_.msg, (needle));                                                           \
    } while (0)

static int alloc_status(const tpk_phi_registry *reg, const char *spec, tpk_ctx *ctx)
{
    tpk_phi *p = tpk_phi_alloc(reg, spec, ctx);
    if (p) {
        tpk_phi_free(p);
        return TPK_OK;
    }
    return ctx->status;
}

static int ws_status(size_t degree, tpk_ctx *ctx)
{
    tpk_gauss_ws *ws = tpk_gauss_ws_alloc(degree, ctx);
    tpk_gauss_ws_free(ws);
    return ws ? TPK_OK : ctx->status;
}

static void test_error_paths(void **state)
{
    fixture *f = *state;
    tpk_phi_registry *reg = f->reg;
    tpk_gauss_ws *ws = f->ws;
    tpk_phi *relu = phi_new(f, "relu"), *tanh_ = phi_new(f, "tanh"), *ex = phi_new(f, "exp(1,30)"),
            *esq = phi_new(f, "expsq(1,0.4)");
    tpk_estimate r;
    /* specs */
    EXPECT_ERR(alloc_status(reg, "rleu", ctx), TPK_ENOTFOUND, "did you mean relu");
    EXPECT_ERR(alloc_status(reg, "tanhh", ctx), TPK_ENOTFOUND, "tanh");
    EXPECT_ERR(alloc_status(reg, "zzzzzzz", ctx), TPK_ENOTFOUND,
               "tpk_phi_registry_list, or --list-phi");
    EXPECT_ERR(alloc_status(reg, "relu(", ctx), TPK_EINVAL, "expected a number");
    EXPECT_ERR(alloc_status(reg, "erf(1.5", ctx), TPK_EINVAL, "expected ',' or ')'");
    EXPECT_ERR(alloc_status(reg, "erf(1.5,)", ctx), TPK_EINVAL, "expected a number");
    EXPECT_ERR(alloc_status(reg, "relu)", ctx), TPK_EINVAL, "unexpected ')'");
    EXPECT_ERR(alloc_status(reg, "", ctx), TPK_EINVAL, "expected a name");
    EXPECT_ERR(alloc_status(reg, NULL, ctx), TPK_EINVAL, "NULL");
    EXPECT_ERR(alloc_status(reg, "erf(1,2)", ctx), TPK_EINVAL, "takes 1 parameter, got 2");
    EXPECT_ERR(alloc_status(reg, "relu(0.5)", ctx), TPK_EINVAL, "takes 0 parameters");
    EXPECT_ERR(alloc_status(reg, "sin(1,2,3,4,5)", ctx), TPK_EINVAL, "more than 4 parameters");
    EXPECT_ERR(alloc_status(reg, "erf(nan)", ctx), TPK_EINVAL, "not finite");
    EXPECT_ERR(alloc_status(reg, "erf(1e999)", ctx), TPK_EINVAL, "not finite");
    /* registration */
    EXPECT_ERR(tpk_phi_register(reg, "relu", xtanh, 0, NULL, 0, ctx), TPK_EINVAL, "already registered");
    assert_int_equal(tpk_phi_register(reg, "dup_fn", xtanh, 0, NULL, 0, &f->ctx), TPK_OK);
    EXPECT_ERR(tpk_phi_register(reg, "dup_fn", xtanh, 0, NULL, 0, ctx), TPK_EINVAL, "already registered");
    EXPECT_ERR(tpk_phi_register(reg, "2fast", xtanh, 0, NULL, 0, ctx), TPK_EINVAL, "not an identifier");
    EXPECT_ERR(tpk_phi_register(reg, "bad-name", xtanh, 0, NULL, 0, ctx), TPK_EINVAL, "not an identifier");
    EXPECT_ERR(tpk_phi_register(reg, "many", xtanh, 5, NULL, 0, ctx), TPK_EINVAL, "nparams = 5");
    EXPECT_ERR(tpk_phi_register(reg, "neg", xtanh, -1, NULL, 0, ctx), TPK_EINVAL, "nparams = -1");
    EXPECT_ERR(tpk_phi_register(reg, "flagged", xtanh, 0, NULL, 1u << 9, ctx), TPK_EINVAL, "flag");
    EXPECT_ERR(tpk_phi_register(reg, "nofn", NULL, 0, NULL, 0, ctx), TPK_EINVAL, "required");
    const double nandef = NAN;
    EXPECT_ERR(tpk_phi_register(reg, "nandef", xtanh, 1, &nandef, 0, ctx), TPK_EINVAL, "not finite");
    /* workspaces */
    EXPECT_ERR(ws_status(0, ctx), TPK_EINVAL, "out of range");
    EXPECT_ERR(ws_status(100000, ctx), TPK_EINVAL, "out of range");
    /* expectations */
    EXPECT_ERR(tpk_gauss_expect2(relu, NAN, 1, 0, ws, &r, ctx), TPK_EDOM, "is not a number");
    EXPECT_ERR(tpk_gauss_expect2(relu, 1, -0.5, 0, ws, &r, ctx), TPK_EDOM, "not a finite variance");
    EXPECT_ERR(tpk_gauss_expect2(relu, INFINITY, 1, 0, ws, &r, ctx), TPK_EDOM, "overflowed to inf");
    EXPECT_ERR(tpk_gauss_expect2(relu, 1, 1, NAN, ws, &r, ctx), TPK_EDOM, "not finite");
    EXPECT_ERR(tpk_gauss_expect2(relu, 1.37, 0.82, 1.2, ws, &r, ctx), TPK_EDOM, "not PSD");
    EXPECT_ERR(tpk_gauss_expect2(relu, 1.37, 0.82, -1.06 * (1 + 1e-6), ws, &r, ctx), TPK_EDOM, "not PSD");
    EXPECT_ERR(tpk_gauss_expect2(relu, 0, 0.82, 1e-9, ws, &r, ctx), TPK_EDOM, "not PSD");
    EXPECT_ERR(tpk_gauss_expect2(NULL, 1, 1, 0, ws, &r, ctx), TPK_EINVAL, "required");
    EXPECT_ERR(tpk_gauss_expect2(tanh_, 1, 1, 0.5, NULL, &r, ctx), TPK_EINVAL, "workspace");
    EXPECT_ERR(tpk_gauss_expect2(ex, 1, 1, 0.5, ws, &r, ctx), TPK_ENUMERIC, "overflows");
    EXPECT_ERR(tpk_gauss_expect2(esq, 1, 1, 0.5, ws, &r, ctx), TPK_EDOM, "infinite");
    EXPECT_ERR(tpk_gauss_expect2_quad(relu, tanh_, NAN, 0, 1, 1, 0, ws, &r, ctx), TPK_EDOM, "means");
    EXPECT_ERR(tpk_gauss_expect2_quad(relu, tanh_, 0, 0, 1, 1, 2, ws, &r, ctx), TPK_EDOM, "not PSD");
    EXPECT_ERR(tpk_gauss_expect2_quad(relu, tanh_, 0, 0, 1, 1, 0, NULL, &r, ctx), TPK_EINVAL, "required");
    EXPECT_ERR(tpk_gauss_expect1(relu, 0, -1, ws, &r, ctx), TPK_EDOM, "not a finite variance");
    EXPECT_ERR(tpk_gauss_expect1(relu, INFINITY, 1, ws, &r, ctx), TPK_EDOM, "mean");
    EXPECT_ERR(tpk_gauss_expect1(tanh_, 0, 1, NULL, &r, ctx), TPK_EINVAL, "workspace");
    EXPECT_ERR(tpk_gauss_expect1(esq, 0, 2, ws, &r, ctx), TPK_EDOM, "infinite");
    /* maps */
    double S[9] = {1.3, 0.2, 0.1, 0.2, 0.9, -0.3, 0.1, -0.3, 1.1}, out[9], qa[3] = {1.3, 0.9, 1.1};
    double Sbad[9];
    memcpy(Sbad, S, sizeof S);
    Sbad[4] = -0.9;
    EXPECT_ERR(tpk_gauss_map(relu, Sbad, 3, out, NULL, NULL, ctx), TPK_EDOM, "variance of input 1");
    memcpy(Sbad, S, sizeof S);
    Sbad[7] = 2.0; /* lower triangle (2,1) */
    EXPECT_ERR(tpk_gauss_map(relu, Sbad, 3, out, NULL, NULL, ctx), TPK_EDOM, "entry (2,1)");
    EXPECT_ERR(tpk_gauss_map(tanh_, Sbad, 3, out, ws, NULL, ctx), TPK_EDOM, "not PSD");
    Sbad[7] = NAN;
    EXPECT_ERR(tpk_gauss_map(relu, Sbad, 3, out, NULL, NULL, ctx), TPK_EDOM, "entry (2,1)");
    EXPECT_ERR(tpk_gauss_map(tanh_, S, 3, out, NULL, NULL, ctx), TPK_EINVAL, "workspace");
    EXPECT_ERR(tpk_gauss_map(NULL, S, 3, out, NULL, NULL, ctx), TPK_EINVAL, "required");
    EXPECT_ERR(tpk_gauss_map(ex, S, 3, out, NULL, NULL, ctx), TPK_ENUMERIC, "overflows");
    EXPECT_ERR(tpk_gauss_map_affine(relu, S, 3, NAN, 0, out, NULL, NULL, ctx), TPK_EINVAL, "finite");
    qa[1] = -1;
    EXPECT_ERR(tpk_gauss_map_cross(relu, qa, 3, qa, 3, S, out, NULL, NULL, ctx), TPK_EDOM, "row input 1");
    qa[1] = 0.9;
    Sbad[7] = 5.0;
    EXPECT_ERR(tpk_gauss_map_cross(relu, qa, 3, qa, 3, Sbad, out, NULL, NULL, ctx), TPK_EDOM, "entry (2,1)");
    tpk_phi_free(relu);
    tpk_phi_free(tanh_);
    tpk_phi_free(ex);
    tpk_phi_free(esq);
}

/* ==== maps ================================================================================ */

/* A PSD test matrix: Gram of n random Gaussian vectors in d dims (scaled), with a zero row, a
 * duplicated row (ρ = 1) and a negated one (ρ = −1). */
static double *random_psd(size_t n, size_t d, unsigned long seed)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, seed);
    double *X = malloc(n * d * sizeof *X), *S = malloc(n * n * sizeof *S);
    for (size_t i = 0; i < n * d; i++)
        X[i] = gsl_ran_gaussian(r, 1.0) * 0.61;
    memset(X + 2 * d, 0, d * sizeof *X);
    memcpy(X + 5 * d, X + 4 * d, d * sizeof *X);
    for (size_t t = 0; t < d; t++)
        X[6 * d + t] = -X[4 * d + t];
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j <= i; j++) {
            double s = 0;
            for (size_t t = 0; t < d; t++)
                s += X[i * d + t] * X[j * d + t];
            S[i * n + j] = S[j * n + i] = s / (double)d * 1.37;
        }
    free(X);
    gsl_rng_free(r);
    return S;
}

static double min_eig_rel(const double *K, size_t n)
{
    double *A = malloc(n * n * sizeof *A), *w = malloc(n * sizeof *w);
    memcpy(A, K, n * n * sizeof *A);
    assert_int_equal(LAPACKE_dsyev(LAPACK_ROW_MAJOR, 'N', 'L', (int)n, A, (int)n, w), 0);
    double mx = fmax(fabs(w[0]), fabs(w[n - 1])), mn = w[0];
    free(A);
    free(w);
    return mx > 0 ? mn / mx : 0.0;
}

static void check_map(fixture *f, const char *spec, size_t n, unsigned long seed)
{
    tpk_phi *p = phi_new(f, spec);
    double *S = random_psd(n, 7, seed), *K = malloc(n * n * sizeof *K), *K2 = malloc(n * n * sizeof *K2);
    double *q = malloc(n * sizeof *q), err;
    if (tpk_gauss_map(p, S, n, K, f->ws, &err, &f->ctx))
        fail_msg("map %s: %s", spec, f->ctx.msg);
    assert_true(isfinite(err) && err >= 0);
    double scale = 0;
    for (size_t i = 0; i < n; i++) {
        q[i] = S[i * n + i];
        scale = fmax(scale, fabs(K[i * n + i]));
    }
    const int closed = tpk_phi_has_closed_form(p);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            assert_true(K[i * n + j] == K[j * n + i]); /* mirrored exactly */
            tpk_estimate r = e2(f, p, q[i], q[j], S[i * n + j]);
            const double tol = closed ? TOL_MAP * fmax(scale, 1e-300) + r.err : err + r.err;
            if (!(fabs(K[i * n + j] - r.value) <= tol))
                fail_msg("map %s (%zu,%zu): %.17g, expect2 %.17g (tol %.2e)", spec, i, j, K[i * n + j],
                         r.value, tol);
        }
    const double me = min_eig_rel(K, n);
    if (me < -TOL_PSD)
        fail_msg("map %s: min eigenvalue / max = %.3e", spec, me);
    /* cross map with the same arguments: the same kernels, so the same numbers */
    double errc;
    if (tpk_gauss_map_cross(p, q, n, q, n, S, K2, f->ws, &errc, &f->ctx))
        fail_msg("map_cross %s: %s", spec, f->ctx.msg);
    for (size_t i = 0; i < n * n; i++)
        if (!(fabs(K2[i] - K[i]) <= (closed ? TOL_MAP * scale : err) + errc))
            fail_msg("map_cross %s entry %zu: %.17g vs %.17g", spec, i, K2[i], K[i]);
    /* in place, and fused affine: bit-identical to out-of-place */
    memcpy(K2, S, n * n * sizeof *K2);
    assert_int_equal(tpk_gauss_map(p, K2, n, K2, f->ws, NULL, &f->ctx), TPK_OK);
    assert_memory_equal(K2, K, n * n * sizeof *K);
    assert_int_equal(tpk_gauss_map_affine(p, S, n, 1.7, 0.31, K2, f->ws, NULL, &f->ctx), TPK_OK);
    for (size_t i = 0; i < n * n; i++)
        assert_true(K2[i] == 1.7 * K[i] + 0.31);
    /* cross map in place on a rectangular block */
    const size_t m = n / 3;
    memcpy(K2, S + n, m * n * sizeof *K2);
    assert_int_equal(tpk_gauss_map_cross(p, q + 1, m, q, n, K2, K2, f->ws, NULL, &f->ctx), TPK_OK);
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < n; j++)
            assert_true(fabs(K2[i * n + j] - K[(i + 1) * n + j]) <= (closed ? TOL_MAP * scale : err) + errc);
    free(S);
    free(K);
    free(K2);
    free(q);
    tpk_phi_free(p);
}

static void test_maps(void **state)
{
    fixture *f = *state;
    /* n = 150: tiles of 64 with ragged edges, and more than one thread's worth of tiles */
    static const char *const specs[] = {"relu", "erf", "erf(1.73)", "step", "sign", "gelu", "arccos2",
                                        "abs", "leaky_relu(0.17)", "erf_sigmoid", "arccos0",
                                        "identity", "sin(1.31,0.77,0.43)", "exp(0.53,0.81)", "x3"};
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++)
        check_map(f, specs[s], 150, 100 + s);
    check_map(f, "relu", 9, 7);   /* smaller than a vector tile */
    check_map(f, "tanh", 40, 11); /* Mehler series with Gauss–Hermite fallback */
    check_map(f, "softplus", 33, 12);
    check_map(f, "elu(0.7)", 12, 13); /* kinked: falls back to the polar rule */
    /* n = 0 is fine */
    tpk_phi *p = phi_new(f, "relu");
    double e = 1;
    assert_int_equal(tpk_gauss_map(p, NULL, 0, NULL, NULL, &e, &f->ctx), TPK_OK);
    assert_true(e == 0);
    tpk_phi_free(p);
}

/* A chain of maps in one pass against the entry-by-entry recursion through the scalar closed
 * forms (q_i, q_j, k) ↦ (α E φ(u)² + β, …, α E φ(u)φ(v) + β) — an independent path — and against
 * the same steps one map at a time. */
static void check_chain(fixture *f, const char *const *specs, int ns, size_t n, unsigned long seed)
{
    tpk_gauss_step st[8];
    tpk_phi *p[8];
    for (int l = 0; l < ns; l++) {
        p[l] = phi_new(f, specs[l]);
        st[l] = (tpk_gauss_step){p[l], 0.8 + 0.3 * l, l % 2 ? 0.05 * l : 0.0};
    }
    double *S = random_psd(n, 7, seed), *K = malloc(n * n * sizeof *K);
    double *K2 = malloc(n * n * sizeof *K2), err = -1;
    /* no zero variance (random_psd's row 2), so the one-pass kernel runs; rows 4-6 keep ρ = ±1 */
    S[2 * n + 2] = 0.3;
    if (tpk_gauss_map_chain_lower(st, ns, S, n, K, f->ws, &err, &f->ctx))
        fail_msg("chain %s..: %s", specs[0], f->ctx.msg);
    assert_true(isfinite(err) && err >= 0);
    memcpy(K2, S, n * n * sizeof *K2);
    for (int l = 0; l < ns; l++)
        assert_int_equal(tpk_gauss_map_affine_lower(p[l], K2, n, st[l].alpha, st[l].beta, K2, f->ws,
                                                    NULL, &f->ctx), TPK_OK);
    double scale = 0;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(K2[i * n + i]));
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j <= i; j++) {
            double qi = S[i * n + i], qj = S[j * n + j], k = S[i * n + j];
            for (int l = 0; l < ns; l++) {
                tpk_estimate a = e2(f, p[l], qi, qi, qi), b = e2(f, p[l], qj, qj, qj);
                tpk_estimate c = e2(f, p[l], qi, qj, k);
                qi = st[l].alpha * a.value + st[l].beta;
                qj = st[l].alpha * b.value + st[l].beta;
                k = st[l].alpha * c.value + st[l].beta;
            }
            /* each step's kernel is within err of the closed form, and the steps here are
             * Lipschitz in k with constants ≤ 1.5: ns·err bounds the difference with room */
            if (!(fabs(K[i * n + j] - k) <= ns * err + 1e-15 * scale))
                fail_msg("chain %s.. (%zu,%zu): %.17g, recursion %.17g, map by map %.17g, err %.3g scale %.3g", specs[0], i, j, K[i * n + j], k, K2[i * n + j], err, scale);
            if (!(fabs(K[i * n + j] - K2[i * n + j]) <= 1e-13 * scale))
                fail_msg("chain (%zu,%zu): %.17g, map by map %.17g", i, j, K[i * n + j],
                         K2[i * n + j]);
        }
    /* in place: the same numbers */
    memcpy(K2, S, n * n * sizeof *K2);
    assert_int_equal(tpk_gauss_map_chain_lower(st, ns, K2, n, K2, f->ws, NULL, &f->ctx), TPK_OK);
    for (size_t i = 0; i < n; i++)
        assert_memory_equal(K2 + i * n, K + i * n, (i + 1) * sizeof *K);
    for (int l = 0; l < ns; l++)
        tpk_phi_free(p[l]);
    free(S), free(K), free(K2);
}

static void test_map_chain(void **state)
{
    fixture *f = *state;
    static const char *const deep[] = {"relu", "relu", "relu", "relu", "relu", "relu", "relu", "relu"};
    check_chain(f, deep, 8, 150, 41);
    static const char *const mixed[] = {"erf", "gelu", "relu", "arccos2", "erf(1.73)", "step"};
    check_chain(f, mixed, 6, 131, 42);
    static const char *const mehler[] = {"relu", "tanh", "relu"}; /* no vector kernel: map by map */
    check_chain(f, mehler, 3, 37, 43);
    check_chain(f, deep, 1, 20, 44);
    /* a zero variance (an all-zero input): the scalar fix-ups, map by map */
    const size_t n = 40;
    double *S = random_psd(n, 7, 45), *K = malloc(n * n * sizeof *K);
    for (size_t j = 0; j < n; j++)
        S[3 * n + j] = S[j * n + 3] = 0;
    tpk_phi *r = phi_new(f, "relu"), *g = phi_new(f, "gelu");
    const tpk_gauss_step st[2] = {{r, 2.0, 0.0}, {g, 1.0, 0.0}};
    assert_int_equal(tpk_gauss_map_chain_lower(st, 2, S, n, K, f->ws, NULL, &f->ctx), TPK_OK);
    double *K2 = malloc(n * n * sizeof *K2);
    assert_int_equal(tpk_gauss_map_affine_lower(r, S, n, 2.0, 0.0, K2, f->ws, NULL, &f->ctx), TPK_OK);
    assert_int_equal(tpk_gauss_map_affine_lower(g, K2, n, 1.0, 0.0, K2, f->ws, NULL, &f->ctx), TPK_OK);
    for (size_t i = 0; i < n; i++)
        assert_memory_equal(K2 + i * n, K + i * n, (i + 1) * sizeof *K);
    /* a covariance beyond √(q_i q_j): the step and the entry are named */
    double *B = random_psd(n, 7, 46);
    B[2 * n + 2] = 0.3;
    B[9 * n + 4] = 10 * sqrt(B[9 * n + 9] * B[4 * n + 4]);
    assert_int_equal(tpk_gauss_map_chain_lower(st, 2, B, n, K, f->ws, NULL, &f->ctx), TPK_EDOM);
    assert_non_null(strstr(f->ctx.msg, "step 1 of 2"));
    assert_non_null(strstr(f->ctx.msg, "(9,4)"));
    /* bad arguments */
    assert_int_equal(tpk_gauss_map_chain_lower(st, TPK_GAUSS_CHAIN_MAX + 1, S, n, K, f->ws, NULL,
                                               &f->ctx), TPK_EINVAL);
    const tpk_gauss_step nan_step[1] = {{r, NAN, 0.0}};
    assert_int_equal(tpk_gauss_map_chain_lower(nan_step, 1, S, n, K, f->ws, NULL, &f->ctx),
                     TPK_EINVAL);
    tpk_phi_free(r), tpk_phi_free(g);
    free(S), free(K), free(K2), free(B);
}

static double ulp_err(double got, double ref)
{
    if (ref == 0)
        return got == 0 && signbit(got) == signbit(ref) ? 0.0 : INFINITY;
    return fabs(got - ref) / (nextafter(fabs(ref), INFINITY) - fabs(ref));
}

/* The map's arcsine and √(1−x²) against glibc over [-1, 1]: dense grid, tiny and near-±1
 * arguments. √((1−x)(1+x)) is within 1.5 ulp of the truth itself, hence the extra ulp there. */
static void test_vector_asin_ulp(void **state)
{
    (void)state;
    const size_t n = 400003;
    double *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), *w = malloc(n * sizeof *w);
    for (size_t i = 0; i < n; i++)
        x[i] = -1.0 + 2.0 * (double)i / (double)(n - 1);
    x[1] = -0.0;
    x[2] = 0.5;
    x[3] = nextafter(0.5, 0);
    x[4] = 1e-300;
    x[5] = nextafter(1.0, 0);
    for (size_t i = 6; i < 200; i++)
        x[i] = ldexp(1.0, -(int)i) * (i & 1 ? -1 : 1);
    for (size_t i = 200; i < 400; i++)
        x[i] = 1.0 - ldexp(1.0, -(int)(i - 199) / 4);
    tpk__gauss_asin_array(x, y, w, n);
    double worst = 0, at = 0, worstw = 0, atw = 0;
    for (size_t i = 0; i < n; i++) {
        const double u = ulp_err(y[i], asin(x[i]));
        const double uw = ulp_err(w[i], sqrt((1 - x[i]) * (1 + x[i])));
        if (u > worst) {
            worst = u;
            at = x[i];
        }
        if (uw > worstw) {
            worstw = uw;
            atw = x[i];
        }
    }
    if (worst > ASIN_MAX_ULP)
        fail_msg("vector asin (%s): %.1f ulp at x = %.17g", tpk__gauss_simd_isa(), worst, at);
    if (worstw > ASIN_MAX_ULP + 1.5)
        fail_msg("vector sqrt(1-x^2) (%s): %.1f ulp at x = %.17g", tpk__gauss_simd_isa(), worstw, atw);
    print_message("vector asin (%s): max %.2f ulp; sqrt(1-x^2): max %.2f ulp\n", tpk__gauss_simd_isa(),
                  worst, worstw);
    free(x);
    free(y);
    free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry_and_specs),
        cmocka_unit_test(test_closed_vs_oracle),
        cmocka_unit_test(test_closed_vs_quadrature),
        cmocka_unit_test(test_closed_vs_monte_carlo),
        cmocka_unit_test(test_invariants),
        cmocka_unit_test(test_degenerate_inputs),
        cmocka_unit_test(test_expect1),
        cmocka_unit_test(test_quad_with_means),
        cmocka_unit_test(test_phi_eval_n),
        cmocka_unit_test(test_numeric_and_user_functions),
        cmocka_unit_test(test_error_paths),
        cmocka_unit_test(test_maps),
        cmocka_unit_test(test_map_chain),
        cmocka_unit_test(test_vector_asin_ulp),
    };
    return cmocka_run_group_tests_name("gauss", tests, setup, teardown);
}
