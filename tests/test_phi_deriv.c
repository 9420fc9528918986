/* Derivatives φ′ and their kernels V_φ′ = E[φ′(u)φ′(v)] (theory.md §3.5): φ′ against finite
 * differences of φ for every built-in, V_φ′ against Price's theorem (∂V_φ/∂k), a nested adaptive
 * oracle, the Gauss–Hermite back-end and Monte Carlo; the maps with a derivative against entrywise
 * tpk_gauss_expect2; degenerate inputs; numerical derivatives of user φ and their error estimate;
 * every error path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <gsl/gsl_integration.h>
#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpk/gauss.h"

/* ---- tolerances (relative to the natural scale √(Eφ′(u)² Eφ′(v)²) unless said otherwise) ---- */
/* φ′ against the 5-point central difference of φ with h = 1e-3·max(1,|x|): its truncation is
 * h⁴|φ⁽⁵⁾|/30 ≈ 3e-14|φ⁽⁵⁾| and its rounding ≈ 1.5ε|φ|/h ≈ 3e-13|φ|, both far below 1e-8 on
 * |x| ≤ 4.4 for every built-in; a wrong formula is off by O(1e-2) or more. Relative to
 * max(1, |φ|, |φ′|). */
#define TOL_FD 1e-8
#define FD_H 1e-3
/* Points closer than this to a kink (0, or ±1 for hardtanh) are left out of the difference test:
 * the stencil spans 2h there. */
#define FD_KINK_GAP 1e-2
/* Price's theorem ∂V_φ/∂k = V_φ′ by a 5-point difference in k with step PRICE_H·√(q1q2):
 * truncation ~h⁴·|∂⁵V/∂k⁵| (the ρ used stay ≤ 0.95, so the derivatives are O(1)) and rounding
 * ~ε·V/h ≈ 1e-13: 1e-7 of the scale leaves room; a wrong V_φ′ is off by O(1e-2). */
#define TOL_PRICE 1e-7
#define PRICE_H 1e-3
/* Closed form vs the nested adaptive oracle (asked for 1e-13; jumps of φ′ at 0 or ±1 are
 * breakpoints of both integrals): as tests/test_gauss.c. */
#define TOL_ORACLE 1e-9
/* V_φ′ without a closed form (Gauss–Hermite / Mehler / polar at QUAD_DEGREE) vs the oracle:
 * tanh′ = sech² has poles at ±iπ/2, the nearest of the built-ins, and reaches ~1e-9 there
 * (measured 9.9e-10 at q = 1.9); the others 1e-14. */
#define TOL_ORACLE_QUAD 1e-8
/* Closed form vs the library's own Gauss–Hermite / polar back-end at degree QUAD_DEGREE: φ′ jumps
 * only at 0 here, where the polar rule splits, so it converges exponentially (theory.md §3.3);
 * erf(bx)′ is a Gaussian bump √(1+2b²q) ≈ 3.5 times narrower than the measure for b = 1.73,
 * q = 1.9, where 128 nodes reach ~1e-9 (measured 8.7e-10). */
#define TOL_QUAD 2e-9
#define QUAD_DEGREE 128
/* Monte Carlo with a fixed seed: within 5 standard errors (fails by chance ~6e-7). */
#define MC_SIGMAS 5.0
#define MC_SAMPLES 200000
#define MC_SEED 2385
/* Vector map kernels vs the scalar closed forms: a 2-ulp asin and reassociated products. */
#define TOL_MAP 1e-14
/* A user φ′ by Ridders' differences, relative to max(1, |φ′|): ~1e-13 is reached on smooth φ
 * (the measured worst case is printed); a wrong derivative would be O(1) off. */
#define TOL_NUMDIFF 1e-11

typedef struct fixture {
    tpk_ctx ctx;
    tpk_phi_registry *reg;
    tpk_gauss_ws *ws, *ws128;
} fixture;

static double u_cube(double x, const double *p) { (void)p; return x * x * x; }
static double u_sin(double x, const double *p) { return p[0] * sin(p[1] * x + 0.2); }
static double u_sin_d(double x, const double *p) { return p[0] * p[1] * cos(p[1] * x + 0.2); }
/* kinked at 0 (not smooth): 0.4x for x < 0, 1.3x for x > 0 */
static double u_kink(double x, const double *p) { (void)p; return x > 0 ? 1.3 * x : 0.4 * x; }
static double u_tanh(double x, const double *p) { (void)p; return tanh(1.7 * x); }

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    tpk_ctx_init(&f->ctx);
    f->reg = tpk_phi_registry_alloc(&f->ctx);
    f->ws = tpk_gauss_ws_alloc(TPK_GAUSS_DEFAULT_DEGREE, &f->ctx);
    f->ws128 = tpk_gauss_ws_alloc(QUAD_DEGREE, &f->ctx);
    *state = f;
    tpk_error_gsl_init();
    const double sp[2] = {1.13, 0.87};
    if (!f->reg || !f->ws || !f->ws128 ||
        tpk_phi_register(f->reg, "ucube", u_cube, 0, NULL,
                         TPK_PHI_CONTROLLED | TPK_PHI_POLY_BOUNDED | TPK_PHI_SMOOTH, &f->ctx) ||
        tpk_phi_register(f->reg, "usin", u_sin, 2, sp,
                         TPK_PHI_CONTROLLED | TPK_PHI_POLY_BOUNDED | TPK_PHI_LIPSCHITZ | TPK_PHI_SMOOTH,
                         &f->ctx) ||
        tpk_phi_register(f->reg, "usin_given", u_sin, 2, sp, TPK_PHI_SMOOTH, &f->ctx) ||
        tpk_phi_register(f->reg, "ukink", u_kink, 0, NULL,
                         TPK_PHI_CONTROLLED | TPK_PHI_POLY_BOUNDED | TPK_PHI_LIPSCHITZ, &f->ctx) ||
        tpk_phi_register(f->reg, "utanh", u_tanh, 0, NULL,
                         TPK_PHI_CONTROLLED | TPK_PHI_POLY_BOUNDED | TPK_PHI_LIPSCHITZ | TPK_PHI_SMOOTH,
                         &f->ctx) ||
        tpk_phi_register_derivative(f->reg, "usin_given", u_sin_d,
                                    TPK_PHI_CONTROLLED | TPK_PHI_LIPSCHITZ | TPK_PHI_SMOOTH, &f->ctx))
        return -1;
    return 0;
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

/* expect2 with the degree-QUAD_DEGREE workspace */
static tpk_estimate e2q(fixture *f, const tpk_phi *p, double q1, double q2, double k)
{
    tpk_estimate r = {NAN, NAN};
    if (tpk_gauss_expect2(p, q1, q2, k, f->ws128, &r, &f->ctx))
        fail_msg("expect2(%s, %g, %g, %g): %s", tpk_phi_name(p), q1, q2, k, f->ctx.msg);
    return r;
}

/* Every built-in with a derivative, "high-entropy" parameters where it has any. */
static const char *const all_specs[] = {
    "identity", "relu", "leaky_relu(0.17)", "abrelu(-0.37,1.61)", "abs", "erf", "erf(1.73)",
    "erf_sigmoid", "gelu", "sin(1.31,0.77,0.43)", "cos(0.89,1.21,-0.29)", "exp(0.53,0.81)",
    "expsq(1.13,-0.31)", "expsq(0.71,0.09)", "arccos1", "arccos2", "x2", "x3", "x4", "x5",
    "tanh", "sigmoid", "softplus", "silu", "elu(0.7)", "elu", "selu", "softsign", "gelu_tanh",
    "mish", "hardtanh",
};
#define NALL (sizeof all_specs / sizeof all_specs[0])
/* The ones whose V_φ′ has a closed form (theory.md §3.5). */
static const char *const closed_specs[] = {
    "identity", "relu", "leaky_relu(0.17)", "abrelu(-0.37,1.61)", "abs", "erf", "erf(1.73)",
    "erf_sigmoid", "gelu", "sin(1.31,0.77,0.43)", "cos(0.89,1.21,-0.29)", "exp(0.53,0.81)",
    "expsq(1.13,-0.31)", "expsq(0.71,0.09)", "arccos1", "arccos2", "x2", "x3", "x4", "x5",
    "hardtanh",
};
#define NCLOSED (sizeof closed_specs / sizeof closed_specs[0])

/* Covariances: generic, negative, |ρ| near 1 both signs, ρ = ±1 exactly, ρ = 0, unequal q. */
static const double covs[][3] = {
    {1.37, 0.82, 0.41},
    {1.37, 0.82, -0.61},
    {0.53, 2.11, 0.95 * 1.0575916},   /* ρ ≈ 0.95 (√(0.53·2.11) = 1.0575916) */
    {0.53, 2.11, -0.999 * 1.0575916}, /* ρ ≈ −0.999 */
    {0.77, 0.77, 0.77},               /* ρ = 1 */
    {0.64, 1.44, -0.96},              /* ρ = −1 exactly */
    {0.77, 1.9, 0.0},
};
#define NCOVS (sizeof covs / sizeof covs[0])

static double natural_scale(fixture *f, const tpk_phi *p, double q1, double q2)
{
    double a = fabs(e2(f, p, q1, q1, q1).value), b = fabs(e2(f, p, q2, q2, q2).value);
    double s = sqrt(a * b);
    return s > 1e-300 ? s : 1.0;
}

/* ==== independent oracle: nested adaptive quadrature (GSL QAGP) ==============================
 * E[f(u)g(v)] = ∫ f(√q1 z) G(z) φ(z) dz, G(z) = E g(ρ√q2 z + σY), σ = √(q2(1−ρ²)), with
 * breakpoints where the arguments cross 0 and ±1 (the jumps of relu′ and hardtanh′). */
#define ORC_L 12.0

typedef struct orc {
    const tpk_phi *f, *g;
    double su, sv, rho, sig, z;
    gsl_integration_workspace *wo, *wi;
} orc;

static double npdf(double z) { return exp(-0.5 * z * z) / sqrt(2 * M_PI); }

static double orc_inner(double y, void *p)
{
    orc *o = p;
    return tpk_phi_eval(o->g, o->rho * o->sv * o->z + o->sig * y) * npdf(y);
}

/* ∫_{−L}^{L} with the breakpoints pts (any order, those outside dropped). */
static double qagp_pts(gsl_function *F, const double *pts, size_t npts, gsl_integration_workspace *w)
{
    double p[8];
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

/* the values t of z (or y) where a + b·t crosses 0 or ±1 */
static size_t crossings(double a, double b, double *t)
{
    if (b == 0)
        return 0;
    t[0] = -a / b;
    t[1] = (1 - a) / b;
    t[2] = (-1 - a) / b;
    return 3;
}

static double orc_outer(double z, void *p)
{
    orc *o = p;
    const double fz = tpk_phi_eval(o->f, o->su * z);
    if (fz == 0.0)
        return 0.0;
    const double mu = o->rho * o->sv * z;
    double G;
    if (o->sig == 0.0) {
        G = tpk_phi_eval(o->g, mu);
    } else {
        o->z = z;
        gsl_function F = {orc_inner, o};
        double pt[3];
        size_t np = crossings(mu, o->sig, pt);
        G = qagp_pts(&F, pt, np, o->wi);
    }
    return fz * G * npdf(z);
}

static double oracle2(const tpk_phi *f, const tpk_phi *g, double q1, double q2, double k)
{
    double rho = k / (sqrt(q1) * sqrt(q2));
    rho = rho > 1 ? 1 : rho < -1 ? -1 : rho;
    orc o = {f, g, sqrt(q1), sqrt(q2), rho, sqrt(q2 * (1 - rho) * (1 + rho)), 0, NULL, NULL};
    o.wo = gsl_integration_workspace_alloc(1000);
    o.wi = gsl_integration_workspace_alloc(1000);
    gsl_function F = {orc_outer, &o};
    double pts[6];
    size_t np = crossings(0, o.su, pts);
    if (o.sig == 0.0)
        np += crossings(0, rho * o.sv, pts + np);
    double r = qagp_pts(&F, pts, np, o.wo);
    gsl_integration_workspace_free(o.wo);
    gsl_integration_workspace_free(o.wi);
    return r;
}

/* Monte Carlo mean and standard error of f(u)g(v), fixed seed. */
static void mc2(const tpk_phi *f, const tpk_phi *g, double q1, double q2, double k,
                unsigned long seed, double *mean, double *se)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, seed);
    const double su = sqrt(q1), rho = k / (sqrt(q1) * sqrt(q2));
    const double a = rho * sqrt(q2), b2 = q2 * (1 - rho) * (1 + rho), b = sqrt(b2 > 0 ? b2 : 0);
    double s = 0, s2 = 0;
    for (int i = 0; i < MC_SAMPLES; i++) {
        const double x = gsl_ran_gaussian_ziggurat(r, 1.0), y = gsl_ran_gaussian_ziggurat(r, 1.0);
        const double h = tpk_phi_eval(f, su * x) * tpk_phi_eval(g, a * x + b * y);
        s += h;
        s2 += h * h;
    }
    *mean = s / MC_SAMPLES;
    const double var = (s2 - s * s / MC_SAMPLES) / (MC_SAMPLES - 1);
    *se = sqrt(var > 0 ? var : 0) / sqrt((double)MC_SAMPLES);
    gsl_rng_free(r);
}

/* ==== φ′ itself ============================================================================== */

static void test_names_flags_and_specs(void **state)
{
    fixture *f = *state;
    for (size_t s = 0; s < NALL; s++) {
        tpk_phi *p = phi_new(f, all_specs[s]);
        tpk_phi *d = tpk_phi_derivative(p, &f->ctx);
        if (!d)
            fail_msg("derivative of %s: %s", all_specs[s], f->ctx.msg);
        char want[200];
        snprintf(want, sizeof want, "%s'", tpk_phi_name(p));
        assert_string_equal(tpk_phi_name(d), want);
        assert_true(tpk_phi_is_derivative(d));
        assert_false(tpk_phi_is_derivative(p));
        /* the name reads back as the same function */
        tpk_phi *d2 = phi_new(f, want);
        assert_string_equal(tpk_phi_name(d2), want);
        for (double x = -3.1; x < 3.2; x += 0.37)
            assert_true(tpk_phi_eval(d2, x) == tpk_phi_eval(d, x));
        /* smooth φ have smooth φ′ (the Cholesky/Mehler back-ends), kinked ones do not */
        if (!(tpk_phi_flags(p) & TPK_PHI_SMOOTH))
            assert_false(tpk_phi_flags(d) & TPK_PHI_SMOOTH);
        int closed = 0;
        for (size_t c = 0; c < NCLOSED; c++)
            closed |= strcmp(closed_specs[c], all_specs[s]) == 0;
        if (tpk_phi_has_closed_form(d) != closed)
            fail_msg("%s: has_closed_form %d, want %d", want, tpk_phi_has_closed_form(d), closed);
        tpk_phi_free(d2);
        tpk_phi_free(d);
        tpk_phi_free(p);
    }
    /* flags the theorems and the back-end rely on */
    struct { const char *spec; unsigned yes, no; } fl[] = {
        {"relu'", TPK_PHI_POS_HOMOGENEOUS | TPK_PHI_POLY_BOUNDED,
         TPK_PHI_SMOOTH | TPK_PHI_LIPSCHITZ},
        {"leaky_relu(0.1)'", TPK_PHI_POS_HOMOGENEOUS, TPK_PHI_SMOOTH | TPK_PHI_LIPSCHITZ},
        {"identity'", TPK_PHI_SMOOTH | TPK_PHI_LIPSCHITZ | TPK_PHI_POS_HOMOGENEOUS, 0},
        {"erf(2.5)'", TPK_PHI_SMOOTH | TPK_PHI_LIPSCHITZ | TPK_PHI_CONTROLLED, 0},
        {"tanh'", TPK_PHI_SMOOTH | TPK_PHI_LIPSCHITZ, 0},
        {"exp(1,0.5)'", TPK_PHI_SMOOTH | TPK_PHI_CONTROLLED, TPK_PHI_LIPSCHITZ},
        {"expsq(1,0.2)'", TPK_PHI_SMOOTH, TPK_PHI_CONTROLLED},
        {"x3'", TPK_PHI_SMOOTH | TPK_PHI_POS_HOMOGENEOUS, TPK_PHI_LIPSCHITZ},
        {"elu(0.7)'", TPK_PHI_POLY_BOUNDED, TPK_PHI_SMOOTH | TPK_PHI_LIPSCHITZ},
        {"elu(1)'", TPK_PHI_LIPSCHITZ, TPK_PHI_SMOOTH},
        {"hardtanh'", TPK_PHI_POLY_BOUNDED, TPK_PHI_SMOOTH | TPK_PHI_LIPSCHITZ},
        {"ukink'", TPK_PHI_POLY_BOUNDED, TPK_PHI_SMOOTH | TPK_PHI_LIPSCHITZ},
        {"ucube'", TPK_PHI_SMOOTH, TPK_PHI_LIPSCHITZ},
        {"usin_given'", TPK_PHI_SMOOTH | TPK_PHI_LIPSCHITZ, TPK_PHI_POLY_BOUNDED},
    };
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) {
        tpk_phi *d = phi_new(f, fl[i].spec);
        const unsigned g = tpk_phi_flags(d);
        if ((g & fl[i].yes) != fl[i].yes || (g & fl[i].no))
            fail_msg("%s: flags 0x%x, want 0x%x set and 0x%x clear", fl[i].spec, g, fl[i].yes,
                     fl[i].no);
        tpk_phi_free(d);
    }
    /* blanks around the prime, as around every token */
    tpk_phi *d = phi_new(f, " erf ( 2.5 ) ' ");
    assert_string_equal(tpk_phi_name(d), "erf(2.5)'");
    tpk_phi_free(d);
}

/* 5-point central difference of φ (an independent path: φ's own formula, not φ′'s). */
static double fd5(const tpk_phi *p, double x)
{
    const double h = FD_H * fmax(1.0, fabs(x));
    return (tpk_phi_eval(p, x - 2 * h) - 8 * tpk_phi_eval(p, x - h) + 8 * tpk_phi_eval(p, x + h) -
            tpk_phi_eval(p, x + 2 * h)) / (12 * h);
}

static void test_derivative_vs_differences(void **state)
{
    fixture *f = *state;
    double worst = 0;
    const char *wname = "";
    for (size_t s = 0; s < NALL; s++) {
        tpk_phi *p = phi_new(f, all_specs[s]), *d = tpk_phi_derivative(p, &f->ctx);
        assert_non_null(d);
        for (int i = 0; i <= 80; i++) {
            const double x = -4.41 + 0.1107 * i;
            if (fabs(x) < FD_KINK_GAP || fabs(fabs(x) - 1.0) < FD_KINK_GAP)
                continue;
            const double got = tpk_phi_eval(d, x), want = fd5(p, x);
            const double sc = fmax(1.0, fmax(fabs(tpk_phi_eval(p, x)), fabs(got)));
            const double rel = fabs(got - want) / sc;
            if (!(rel <= TOL_FD))
                fail_msg("%s at x = %.17g: %.17g, differences of phi %.17g", tpk_phi_name(d), x,
                         got, want);
            double e = -1;
            assert_true(tpk_phi_eval_err(d, x, &e) == got && e == 0.0); /* a formula */
            if (rel > worst) {
                worst = rel;
                wname = all_specs[s];
            }
        }
        tpk_phi_free(d);
        tpk_phi_free(p);
    }
    print_message("phi' vs 5-point differences of phi: worst %.2e (relative, %s)\n", worst, wname);

    /* the values at the kinks: the least-magnitude one-sided derivative (theory.md §3.5) */
    struct { const char *spec; double x, want; } k[] = {
        {"relu'", 0.0, 0.0},          /* Heaviside with step(0) = 0 */
        {"arccos1'", 0.0, 0.0},
        {"leaky_relu(0.17)'", 0.0, 0.17},
        {"abs'", 0.0, 0.0},
        {"abrelu(-0.37,1.61)'", 0.0, 0.0},
        {"abrelu(0.5,2)'", 0.0, 0.5},
        {"abrelu(-2,-0.5)'", 0.0, -0.5},
        {"identity'", 0.0, 1.0},
        {"hardtanh'", 1.0, 0.0},
        {"hardtanh'", -1.0, 0.0},
        {"hardtanh'", 0.999, 1.0},
        {"elu(0.7)'", 0.0, 0.7},
        {"elu(1.3)'", 0.0, 1.0},
        {"selu'", 0.0, 1.0507009873554804934},
        {"arccos2'", 0.0, 0.0},
        {"softsign'", 0.0, 1.0},
        {"relu'", -0.0, 0.0},
        {"relu'", 1e-300, 1.0},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        tpk_phi *d = phi_new(f, k[i].spec);
        if (tpk_phi_eval(d, k[i].x) != k[i].want)
            fail_msg("%s(%g) = %.17g, want %.17g", k[i].spec, k[i].x, tpk_phi_eval(d, k[i].x),
                     k[i].want);
        tpk_phi_free(d);
    }
    /* far tails: finite, no inf·0 */
    static const char *const tails[] = {"tanh'", "sigmoid'", "gelu'", "gelu_tanh'", "mish'",
                                        "silu'", "erf(1.73)'", "softplus'"};
    for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
        tpk_phi *d = phi_new(f, tails[i]);
        for (double x = 1e3; x < 1e300; x *= 1e7) {
            assert_true(isfinite(tpk_phi_eval(d, x)));
            assert_true(isfinite(tpk_phi_eval(d, -x)));
        }
        tpk_phi_free(d);
    }
}

/* The batched evaluation of derivatives is the scalar one (libmvec within 4 ulp). */
static void test_eval_n(void **state)
{
    fixture *f = *state;
    enum { N = 203 };
    double x[N], y[N];
    for (int i = 0; i < N; i++)
        x[i] = -7.3 + 0.0721 * i;
    x[100] = 0.0;
    for (size_t s = 0; s < NALL; s++) {
        char spec[64];
        snprintf(spec, sizeof spec, "%s'", all_specs[s]);
        tpk_phi *d = phi_new(f, spec);
        tpk_phi_eval_n(d, N, x, y);
        for (int i = 0; i < N; i++) {
            const double want = tpk_phi_eval(d, x[i]);
            if (!(fabs(y[i] - want) <= 8 * DBL_EPSILON * fabs(want) + 1e-300))
                fail_msg("%s: eval_n(%.17g) = %.17g, eval %.17g", spec, x[i], y[i], want);
        }
        /* in place */
        memcpy(y, x, sizeof y);
        tpk_phi_eval_n(d, N, y, y);
        for (int i = 0; i < N; i++)
            assert_true(fabs(y[i] - tpk_phi_eval(d, x[i])) <=
                        8 * DBL_EPSILON * fabs(tpk_phi_eval(d, x[i])) + 1e-300);
        tpk_phi_free(d);
    }
}

/* ==== V_φ′ ================================================================================== */

/* Price's theorem: ∂/∂k E[φ(u)φ(v)] = E[φ′(u)φ′(v)] — V_φ's own closed forms or quadrature,
 * differenced in k, against V_φ′: two independent code paths meet. */
static void test_price_theorem(void **state)
{
    fixture *f = *state;
    static const double pc[][3] = {{1.37, 0.82, 0.41}, {1.37, 0.82, -0.61}, {0.53, 2.11, 0.87},
                                   {0.77, 1.9, 0.0}};
    double worst = 0;
    for (size_t s = 0; s < NALL; s++) {
        tpk_phi *p = phi_new(f, all_specs[s]), *d = tpk_phi_derivative(p, &f->ctx);
        if (strcmp(all_specs[s], "hardtanh") == 0 || !tpk_phi_has_closed_form(p)) {
            /* V_φ by quadrature: differencing its 1e-13 noise would need a looser tolerance;
             * these are checked against the oracle below */
            tpk_phi_free(d);
            tpk_phi_free(p);
            continue;
        }
        for (size_t c = 0; c < sizeof pc / sizeof pc[0]; c++) {
            const double q1 = pc[c][0], q2 = pc[c][1], k = pc[c][2];
            const double h = PRICE_H * sqrt(q1 * q2);
            const double dv = (e2(f, p, q1, q2, k - 2 * h).value - 8 * e2(f, p, q1, q2, k - h).value +
                               8 * e2(f, p, q1, q2, k + h).value - e2(f, p, q1, q2, k + 2 * h).value) /
                              (12 * h);
            const double got = e2(f, d, q1, q2, k).value, sc = natural_scale(f, d, q1, q2);
            const double rel = fabs(got - dv) / sc;
            if (!(rel <= TOL_PRICE))
                fail_msg("%s at (%g,%g,%g): V_phi' %.17g, dV_phi/dk %.17g", tpk_phi_name(d), q1, q2,
                         k, got, dv);
            worst = fmax(worst, rel);
        }
        tpk_phi_free(d);
        tpk_phi_free(p);
    }
    print_message("V_phi' vs dV_phi/dk (Price): worst %.2e of the scale\n", worst);
}

/* The formulas of the brief, written out here: relu′ → (π − θ)/(2π) (Cho & Saul's arc-cosine
 * kernel of degree 0), erf(bx)′ → (4b²/π)/√((1+2b²q1)(1+2b²q2) − 4b⁴k²), identity′ → 1, and
 * leaky_relu(a)′ by its four orthants. */
static void test_closed_forms_explicit(void **state)
{
    fixture *f = *state;
    tpk_phi *relu = phi_new(f, "relu'"), *erfb = phi_new(f, "erf(1.73)'"),
            *id = phi_new(f, "identity'"), *lk = phi_new(f, "leaky_relu(0.17)'");
    const double b = 1.73, b2 = b * b, a = 0.17;
    for (size_t c = 0; c < NCOVS; c++) {
        const double q1 = covs[c][0], q2 = covs[c][1], k = covs[c][2];
        double rho = k / sqrt(q1 * q2);
        rho = fmax(-1.0, fmin(1.0, rho));
        const double th = acos(rho);
        const double pp = (M_PI - th) / (2 * M_PI), pm = th / (2 * M_PI); /* P(u>0,v>0), P(u>0,v<0) */
        tpk_estimate r = e2(f, relu, q1, q2, k);
        assert_true(fabs(r.value - pp) <= 1e-15 + r.err);
        r = e2(f, erfb, q1, q2, k);
        const double we = (4 * b2 / M_PI) / sqrt((1 + 2 * b2 * q1) * (1 + 2 * b2 * q2) - 4 * b2 * b2 * k * k);
        assert_true(fabs(r.value - we) <= 1e-14 * we);
        r = e2(f, id, q1, q2, k);
        assert_true(r.value == 1.0);
        r = e2(f, lk, q1, q2, k);
        const double wl = pp * 1.0 + 2 * pm * a + pp * a * a; /* P(u<0,v<0) = P(u>0,v>0) */
        assert_true(fabs(r.value - wl) <= 1e-15 + r.err);
    }
    tpk_phi_free(relu);
    tpk_phi_free(erfb);
    tpk_phi_free(id);
    tpk_phi_free(lk);
}

/* Every derivative's V_φ′ against the nested oracle, the library's Gauss–Hermite back-end, and
 * Monte Carlo; the reported errors cover the differences. */
static void test_kernels_vs_oracles(void **state)
{
    fixture *f = *state;
    double worst_o = 0, worst_q = 0, worst_mc = 0;
    unsigned long seed = MC_SEED;
    for (size_t s = 0; s < NALL; s++) {
        char spec[64];
        snprintf(spec, sizeof spec, "%s'", all_specs[s]);
        tpk_phi *d = phi_new(f, spec);
        const int box = strcmp(all_specs[s], "hardtanh") == 0;
        for (size_t c = 0; c < NCOVS; c++) {
            const double q1 = covs[c][0], q2 = covs[c][1], k = covs[c][2];
            const int closed = tpk_phi_has_closed_form(d);
            tpk_estimate r = closed ? e2(f, d, q1, q2, k) : e2q(f, d, q1, q2, k), qd;
            const double sc = natural_scale(f, d, q1, q2);
            const double o = oracle2(d, d, q1, q2, k);
            if (!(fabs(r.value - o) <= (closed ? TOL_ORACLE : TOL_ORACLE_QUAD) * sc) ||
                !(fabs(r.value - o) <= r.err + 1e-12 * sc))
                fail_msg("%s at (%g,%g,%g): %.17g (err %.2e), oracle %.17g", spec, q1, q2, k,
                         r.value, r.err, o);
            worst_o = fmax(worst_o, fabs(r.value - o) / sc);
            if (box || !tpk_phi_has_closed_form(d))
                continue; /* hardtanh′ jumps at ±1, where the polar rule does not split */
            assert_int_equal(tpk_gauss_expect2_quad(d, d, 0, 0, q1, q2, k, f->ws128, &qd, &f->ctx),
                             TPK_OK);
            const double dq = fabs(r.value - qd.value);
            if (!(dq <= TOL_QUAD * sc) || !(dq <= qd.err + r.err + 1e-15 * sc))
                fail_msg("%s at (%g,%g,%g): closed %.17g, quadrature %.17g (err %.2e)", spec, q1, q2,
                         k, r.value, qd.value, qd.err);
            worst_q = fmax(worst_q, dq / sc);
        }
        static const double mcc[][3] = {{1.37, 0.82, 0.41}, {0.53, 2.11, -0.83}};
        for (size_t c = 0; c < 2; c++) {
            const double q1 = mcc[c][0], q2 = mcc[c][1], k = mcc[c][2];
            double mean, se;
            tpk_estimate r = e2(f, d, q1, q2, k);
            mc2(d, d, q1, q2, k, seed++, &mean, &se);
            if (!(fabs(mean - r.value) <= MC_SIGMAS * se + 1e-15))
                fail_msg("%s at (%g,%g,%g): %.10g, Monte Carlo %.10g ± %.2e", spec, q1, q2, k,
                         r.value, mean, se);
            if (se > 0)
                worst_mc = fmax(worst_mc, fabs(mean - r.value) / se);
        }
        tpk_phi_free(d);
    }
    print_message("V_phi': worst vs oracle %.2e, vs quadrature %.2e (of the scale); vs Monte Carlo "
                  "%.2f standard errors\n", worst_o, worst_q, worst_mc);
}

/* 1-D expectations E φ′(m + √q Z) with means: closed forms and quadrature against the oracle. */
typedef struct o1 {
    const tpk_phi *f;
    double m, s;
} o1;
static double o1_fn(double z, void *p)
{
    o1 *o = p;
    return tpk_phi_eval(o->f, o->m + o->s * z) * npdf(z);
}

static void test_expect1(void **state)
{
    fixture *f = *state;
    static const double mq[][2] = {{0.0, 1.37}, {0.61, 0.82}, {-1.13, 2.11}, {2.9, 0.04}};
    gsl_integration_workspace *w = gsl_integration_workspace_alloc(1000);
    for (size_t s = 0; s < NALL; s++) {
        char spec[64];
        snprintf(spec, sizeof spec, "%s'", all_specs[s]);
        tpk_phi *d = phi_new(f, spec);
        for (size_t i = 0; i < sizeof mq / sizeof mq[0]; i++) {
            const double m = mq[i][0], q = mq[i][1];
            tpk_estimate r;
            assert_int_equal(tpk_gauss_expect1(d, m, q, f->ws128, &r, &f->ctx), TPK_OK);
            o1 o = {d, m, sqrt(q)};
            gsl_function F = {o1_fn, &o};
            double pts[3];
            size_t np = crossings(m, o.s, pts);
            const double want = qagp_pts(&F, pts, np, w);
            const double sc = fmax(1.0, fabs(want));
            if (!(fabs(r.value - want) <= TOL_ORACLE * sc) ||
                !(fabs(r.value - want) <= r.err + 1e-12 * sc))
                fail_msg("%s: E phi'(%g + sqrt(%g) Z) = %.17g (err %.2e), oracle %.17g", spec, m, q,
                         r.value, r.err, want);
        }
        tpk_phi_free(d);
    }
    gsl_integration_workspace_free(w);
}

/* ==== degenerate inputs ===================================================================== */

static void test_degenerate(void **state)
{
    fixture *f = *state;
    /* the step convention: relu′(0) = 0, so a zero-variance input is orthogonal to everything */
    tpk_phi *relu = phi_new(f, "relu'"), *lk = phi_new(f, "leaky_relu(0.17)'");
    assert_true(e2(f, relu, 0.0, 1.3, 0.0).value == 0.0);
    assert_true(e2(f, relu, 1.3, 0.0, 0.0).value == 0.0);
    assert_true(e2(f, relu, 0.0, 0.0, 0.0).value == 0.0);
    /* leaky_relu(a)′: a at 0, mean (a+1)/2 */
    assert_true(fabs(e2(f, lk, 0.0, 1.3, 0.0).value - 0.17 * 0.585) <= 1e-16);
    assert_true(fabs(e2(f, lk, 0.0, 0.0, 0.0).value - 0.17 * 0.17) <= 1e-17);
    /* ρ = ±1 exactly and from either side by rounding */
    assert_true(e2(f, relu, 0.77, 0.77, 0.77).value == 0.5);
    assert_true(e2(f, relu, 0.64, 1.44, -0.96).value == 0.0);
    assert_true(fabs(e2(f, lk, 0.64, 1.44, -0.96).value - 0.17) <= 1e-16);
    tpk_phi_free(relu);
    tpk_phi_free(lk);
    /* erf′ at large variances and ρ = 1: det(I − 2βΣ) = 1 + 4b²q exactly, where the product form
     * (1+2b²q)² − 4b⁴q² cancelled every digit but log10(q) of them; scalar and vector paths */
    tpk_phi *ed = phi_new(f, "erf(1.73)'");
    for (double q = 1e3; q < 1e16; q *= 1e3) {
        const double b2 = 1.73 * 1.73, want = (4 * b2 / M_PI) / sqrt(1 + 4 * b2 * q);
        tpk_estimate r = e2(f, ed, q, q, q);
        if (!(fabs(r.value - want) <= 1e-14 * want))
            fail_msg("erf' at q = k = %g: %.17g, want %.17g", q, r.value, want);
        double S[9] = {q, q, q, q, q, q, q, q, q}, K[9];
        assert_int_equal(tpk_gauss_map(ed, S, 3, K, f->ws, NULL, &f->ctx), TPK_OK);
        for (int i = 0; i < 9; i++)
            assert_true(fabs(K[i] - want) <= 1e-14 * want);
    }
    tpk_phi_free(ed);

    /* every derivative: zero variances give φ′(0)·E φ′(v), ρ → ±1 is continuous, nothing is NaN */
    for (size_t s = 0; s < NALL; s++) {
        char spec[64];
        snprintf(spec, sizeof spec, "%s'", all_specs[s]);
        tpk_phi *d = phi_new(f, spec);
        const double q = 0.83, d0 = tpk_phi_eval(d, 0.0);
        tpk_estimate m1, r;
        assert_int_equal(tpk_gauss_expect1(d, 0.0, q, f->ws, &m1, &f->ctx), TPK_OK);
        r = e2(f, d, 0.0, q, 0.0);
        if (!(fabs(r.value - d0 * m1.value) <= 1e-15 * (1 + fabs(d0 * m1.value)) + r.err))
            fail_msg("%s: E with q1 = 0 is %.17g, want phi'(0) E phi'(v) = %.17g", spec, r.value,
                     d0 * m1.value);
        r = e2(f, d, q, 0.0, 0.0);
        assert_true(fabs(r.value - d0 * m1.value) <= 1e-15 * (1 + fabs(d0 * m1.value)) + r.err);
        r = e2(f, d, 0.0, 0.0, 0.0);
        assert_true(r.value == d0 * d0);
        const double q1 = 1.37, q2 = 0.82, s12 = sqrt(q1 * q2);
        for (int sg = -1; sg <= 1; sg += 2) {
            tpk_estimate at = e2(f, d, q1, q2, sg * s12), hi = e2(f, d, q1, q2, sg * s12 * (1 + 1e-13));
            tpk_estimate near = e2(f, d, q1, q2, sg * s12 * (1 - 1e-9));
            assert_true(isfinite(at.value) && isfinite(at.err) && isfinite(hi.value) && isfinite(near.value));
            assert_true(fabs(hi.value - at.value) <= 1e-12 * (1 + fabs(at.value)));
            /* relu′-like kernels are Hölder-½ in ρ at ±1: √(2·1e-9)/π ≈ 1.4e-5 of the scale */
            if (!(fabs(near.value - at.value) <= 1e-4 * natural_scale(f, d, q1, q2) + at.err + near.err))
                fail_msg("%s: rho -> %d: %.17g vs %.17g at the limit", spec, sg, near.value, at.value);
        }
        /* tiny variances: finite */
        r = e2(f, d, 1e-300, 1e-300, 0.5e-300);
        assert_true(isfinite(r.value) && isfinite(r.err));
        tpk_phi_free(d);
    }
}

/* ==== maps ================================================================================== */

/* A PSD matrix of n·d Gaussian features with a zero row (q = 0), a duplicated row (ρ = 1) and a
 * negated one (ρ = −1). */
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

/* The tolerance of a map entry against expect2: vector kernels round differently (TOL_MAP); the
 * Mehler and quadrature paths are within their reported bounds. */
static double map_tol(const tpk_phi *d, double scale, double err_map, double err_e2)
{
    return tpk_phi_has_closed_form(d) ? TOL_MAP * scale + err_e2 : err_map + err_e2 + 1e-15 * scale;
}

static void check_map(fixture *f, const char *spec, size_t n, unsigned long seed)
{
    tpk_phi *d = phi_new(f, spec);
    double *S = random_psd(n, 7, seed), *K = malloc(n * n * sizeof *K), *K2 = malloc(n * n * sizeof *K2);
    double *q = malloc(n * sizeof *q), err, scale = 0;
    for (size_t i = 0; i < n; i++)
        q[i] = S[i * n + i];
    if (tpk_gauss_map(d, S, n, K, f->ws, &err, &f->ctx))
        fail_msg("map %s: %s", spec, f->ctx.msg);
    assert_true(isfinite(err) && err >= 0);
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(K[i * n + i]));
    /* tpk_gauss_map against entrywise expect2 */
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            assert_true(K[i * n + j] == K[j * n + i]);
            tpk_estimate r = e2(f, d, q[i], q[j], S[i * n + j]);
            if (!(fabs(K[i * n + j] - r.value) <= map_tol(d, scale, err, r.err)))
                fail_msg("map %s (%zu,%zu): %.17g, expect2 %.17g (err %.2e, %.2e)", spec, i, j,
                         K[i * n + j], r.value, err, r.err);
        }
    /* affine, and its lower triangle */
    double erra;
    assert_int_equal(tpk_gauss_map_affine(d, S, n, 1.7, 0.31, K2, f->ws, &erra, &f->ctx), TPK_OK);
    for (size_t i = 0; i < n * n; i++)
        assert_true(fabs(K2[i] - (1.7 * K[i] + 0.31)) <= 4 * DBL_EPSILON * (1.7 * fabs(K[i]) + 0.31));
    for (size_t i = 0; i < n * n; i++)
        K2[i] = -7.0; /* sentinel: the upper triangle must stay untouched */
    assert_int_equal(tpk_gauss_map_affine_lower(d, S, n, 1.7, 0.31, K2, f->ws, NULL, &f->ctx), TPK_OK);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            if (j > i) {
                assert_true(K2[i * n + j] == -7.0);
                continue;
            }
            tpk_estimate r = e2(f, d, q[i], q[j], S[i * n + j]);
            if (!(fabs(K2[i * n + j] - (1.7 * r.value + 0.31)) <= 1.7 * map_tol(d, scale, err, r.err) + 1e-15))
                fail_msg("affine_lower %s (%zu,%zu): %.17g, 1.7 expect2 + 0.31 = %.17g", spec, i, j,
                         K2[i * n + j], 1.7 * r.value + 0.31);
        }
    /* cross: rows 1..m of S against all columns, in place */
    const size_t m = n / 3 + 1;
    double errc;
    memcpy(K2, S + n, m * n * sizeof *K2);
    if (tpk_gauss_map_cross(d, q + 1, m, q, n, K2, K2, f->ws, &errc, &f->ctx))
        fail_msg("map_cross %s: %s", spec, f->ctx.msg);
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < n; j++) {
            tpk_estimate r = e2(f, d, q[i + 1], q[j], S[(i + 1) * n + j]);
            if (!(fabs(K2[i * n + j] - r.value) <= map_tol(d, scale, errc, r.err)))
                fail_msg("map_cross %s (%zu,%zu): %.17g, expect2 %.17g", spec, i + 1, j,
                         K2[i * n + j], r.value);
        }
    /* row segments, cut at an odd place, with the zero-variance row and the diagonal */
    tpk_gauss_segmap *sm = tpk_gauss_segmap_alloc(d, q, n, f->ws, &f->ctx);
    if (!sm)
        fail_msg("segmap %s: %s", spec, f->ctx.msg);
    double maxr = 0, errmax = 0, errs;
    for (size_t i = 0; i < n; i++) {
        const size_t cut = (i * 7 + 3) % (i + 1);
        tpk_gauss_segmap_row(sm, i, 0, cut, S + i * n, K2 + i * n, &maxr, &errmax);
        tpk_gauss_segmap_row(sm, i, cut, i + 1 - cut, S + i * n + cut, K2 + i * n + cut, &maxr,
                             &errmax);
    }
    tpk_gauss_segmap_merge(sm, maxr, errmax);
    assert_int_equal(tpk_gauss_segmap_finish(sm, &errs, &f->ctx), TPK_OK);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j <= i; j++) {
            tpk_estimate r = e2(f, d, q[i], q[j], S[i * n + j]);
            if (!(fabs(K2[i * n + j] - r.value) <= map_tol(d, scale, errs, r.err)))
                fail_msg("segmap %s (%zu,%zu): %.17g, expect2 %.17g", spec, i, j, K2[i * n + j],
                         r.value);
        }
    tpk_gauss_segmap_free(sm);
    /* a covariance beyond √(q_i q_j) is refused and named */
    S[9 * n + 4] = S[4 * n + 9] = 10 * sqrt(q[9] * q[4]);
    assert_int_equal(tpk_gauss_map(d, S, n, K, f->ws, NULL, &f->ctx), TPK_EDOM);
    assert_non_null(strstr(f->ctx.msg, "(9,4)"));
    free(S);
    free(K);
    free(K2);
    free(q);
    tpk_phi_free(d);
}

static void test_maps(void **state)
{
    fixture *f = *state;
    /* closed forms: the vector kernels (relu′ and kin by asin, erf′ and gelu′ by their own) on
     * n = 150 (ragged tiles), the scalar ones on n = 41 */
    static const struct { const char *spec; size_t n; } closed[] = {
        {"relu'", 150}, {"leaky_relu(0.17)'", 150}, {"erf(1.73)'", 150}, {"gelu'", 150},
        {"abs'", 41}, {"identity'", 41}, {"erf_sigmoid'", 41}, {"x3'", 41},
        {"expsq(1.13,-0.31)'", 41}, {"expsq(0.71,0.09)'", 41}, {"hardtanh'", 41},
        {"sin(1.31,0.77,0.43)'", 41}, {"arccos2'", 41},
    };
    for (size_t s = 0; s < sizeof closed / sizeof closed[0]; s++)
        check_map(f, closed[s].spec, closed[s].n, 300 + s);
    check_map(f, "tanh'", 37, 311);      /* Mehler series */
    check_map(f, "elu(0.7)'", 12, 312);  /* jump at 0: polar rule per entry */
    check_map(f, "ucube'", 14, 313);     /* numerical derivative, smooth: Mehler */
}

/* A chain of derivative maps in one pass (all vector kernels) against the maps one by one; each
 * of those is checked against expect2 in test_maps. */
static void test_chain(void **state)
{
    fixture *f = *state;
    const size_t n = 70;
    tpk_phi *r = phi_new(f, "relu'"), *l = phi_new(f, "leaky_relu(0.17)'"),
            *e = phi_new(f, "erf(1.73)'"), *g = phi_new(f, "gelu'");
    const tpk_gauss_step st[5] = {{r, 2.0, 0.1}, {e, 1.3, 0.0}, {l, 1.3, 0.0}, {g, 0.7, 0.05},
                                  {r, 0.9, 0.2}};
    const int ns = 5;
    double *S = random_psd(n, 7, 51), *K = malloc(n * n * sizeof *K), *K2 = malloc(n * n * sizeof *K2);
    S[2 * n + 2] = 0.3; /* no zero variance: the one-pass kernel runs */
    double err;
    assert_int_equal(tpk_gauss_map_chain_lower(st, ns, S, n, K, f->ws, &err, &f->ctx), TPK_OK);
    memcpy(K2, S, n * n * sizeof *K2);
    for (int i = 0; i < ns; i++)
        assert_int_equal(tpk_gauss_map_affine_lower(st[i].phi, K2, n, st[i].alpha, st[i].beta, K2,
                                                    f->ws, NULL, &f->ctx), TPK_OK);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j <= i; j++)
            if (!(fabs(K[i * n + j] - K2[i * n + j]) <= 1e-13 * 3.0))
                fail_msg("chain (%zu,%zu): %.17g, map by map %.17g", i, j, K[i * n + j], K2[i * n + j]);
    tpk_phi_free(r);
    tpk_phi_free(l);
    tpk_phi_free(e);
    tpk_phi_free(g);
    free(S);
    free(K);
    free(K2);
}

/* ==== user φ ================================================================================ */

static void test_user_numerical(void **state)
{
    fixture *f = *state;
    tpk_phi *cube = phi_new(f, "ucube'"), *us = phi_new(f, "usin'"), *uk = phi_new(f, "ukink'"),
            *ut = phi_new(f, "utanh'");
    assert_false(tpk_phi_has_closed_form(cube));
    double worst = 0, worst_ratio = 0;
    for (int i = 0; i <= 4000; i++) {
        const double x = -9.7 + 0.004867 * i;
        struct { const tpk_phi *d; double want; } c[] = {
            {cube, 3 * x * x},
            {us, 1.13 * 0.87 * cos(0.87 * x + 0.2)},
            {ut, 1.7 / (cosh(1.7 * x) * cosh(1.7 * x))},
            {uk, x > 0 ? 1.3 : 0.4},
        };
        for (size_t j = 0; j < sizeof c / sizeof c[0]; j++) {
            if (c[j].d == uk && x == 0)
                continue;
            double e = -1;
            const double v = tpk_phi_eval_err(c[j].d, x, &e);
            assert_true(v == tpk_phi_eval(c[j].d, x));
            const double sc = fmax(1.0, fabs(c[j].want)), d = fabs(v - c[j].want);
            if (!(d <= TOL_NUMDIFF * sc))
                fail_msg("%s(%.17g) = %.17g, want %.17g (err estimate %.2e)", tpk_phi_name(c[j].d), x,
                         v, c[j].want, e);
            /* the error estimate bounds the true error */
            if (!(d <= e))
                fail_msg("%s(%.17g): error %.3e above its estimate %.3e", tpk_phi_name(c[j].d), x, d, e);
            worst = fmax(worst, d / sc);
            if (d > 0)
                worst_ratio = fmax(worst_ratio, d / e);
        }
    }
    print_message("user phi' by Ridders: worst relative error %.2e; worst error/estimate %.2f\n",
                  worst, worst_ratio);
    /* at the kink itself: the mean of the one-sided derivatives, with an honest estimate */
    double e;
    assert_true(fabs(tpk_phi_eval_err(uk, 0.0, &e) - 0.85) <= 1e-14);

    /* kernels: ucube′ = 3x² has V = 9(2k² + q1q2) (the x2 row of theory.md §3.2); ukink′ is
     * abrelu(0.4,1.3)′, whose closed form is tested above */
    tpk_phi *x2 = phi_new(f, "x2"), *ak = phi_new(f, "abrelu(0.4,1.3)'");
    for (size_t c = 0; c < NCOVS; c++) {
        const double q1 = covs[c][0], q2 = covs[c][1], k = covs[c][2];
        tpk_estimate r = e2(f, cube, q1, q2, k), w = e2(f, x2, q1, q2, k);
        if (!(fabs(r.value - 9 * w.value) <= r.err) || !(r.err <= 1e-6 * 9 * fabs(w.value)))
            fail_msg("V of ucube' at (%g,%g,%g): %.17g (err %.2e), want %.17g", q1, q2, k, r.value,
                     r.err, 9 * w.value);
        r = e2(f, uk, q1, q2, k);
        w = e2(f, ak, q1, q2, k);
        if (!(fabs(r.value - w.value) <= r.err + w.err) || !(r.err <= 1e-6))
            fail_msg("V of ukink' at (%g,%g,%g): %.17g (err %.2e), closed form %.17g", q1, q2, k,
                     r.value, r.err, w.value);
    }
    /* a derivative given at registration is used as is */
    tpk_phi *ug = phi_new(f, "usin_given'");
    for (double x = -3; x < 3; x += 0.31) {
        double eg = -1;
        assert_true(tpk_phi_eval_err(ug, x, &eg) == u_sin_d(x, (const double[]){1.13, 0.87}));
        assert_true(eg == 0.0);
    }
    tpk_phi_free(ug);
    tpk_phi_free(x2);
    tpk_phi_free(ak);
    tpk_phi_free(cube);
    tpk_phi_free(us);
    tpk_phi_free(uk);
    tpk_phi_free(ut);
}

/* ==== error paths =========================================================================== */

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

static int deriv_status(const tpk_phi *p, tpk_ctx *ctx)
{
    tpk_phi *d = tpk_phi_derivative(p, ctx);
    tpk_phi_free(d);
    return d ? TPK_OK : ctx->status;
}

static int alloc_status(const tpk_phi_registry *reg, const char *spec, tpk_ctx *ctx)
{
    tpk_phi *p = tpk_phi_alloc(reg, spec, ctx);
    tpk_phi_free(p);
    return p ? TPK_OK : ctx->status;
}

static void test_error_paths(void **state)
{
    fixture *f = *state;
    tpk_phi *step = phi_new(f, "step"), *sign = phi_new(f, "sign"), *ac0 = phi_new(f, "arccos0"),
            *rd = phi_new(f, "relu'"), *ed = phi_new(f, "expsq(0.71,0.09)'"), *td = phi_new(f, "tanh'");
    tpk_estimate r;
    EXPECT_ERR(deriv_status(step, ctx), TPK_EDOM, "Dirac");
    EXPECT_ERR(deriv_status(sign, ctx), TPK_EDOM, "Dirac");
    EXPECT_ERR(deriv_status(ac0, ctx), TPK_EDOM, "Dirac");
    EXPECT_ERR(deriv_status(NULL, ctx), TPK_EINVAL, "required");
    EXPECT_ERR(deriv_status(rd, ctx), TPK_EUNSUPPORTED, "second derivatives");
    EXPECT_ERR(alloc_status(f->reg, "relu''", ctx), TPK_EUNSUPPORTED, "first derivatives");
    EXPECT_ERR(alloc_status(f->reg, "step'", ctx), TPK_EDOM, "Dirac");
    EXPECT_ERR(alloc_status(f->reg, "relu'x", ctx), TPK_EINVAL, "unexpected 'x'");
    EXPECT_ERR(alloc_status(f->reg, "'", ctx), TPK_EINVAL, "expected a name");
    /* registering derivatives */
    EXPECT_ERR(tpk_phi_register_derivative(f->reg, "nosuch", u_sin_d, 0, ctx), TPK_ENOTFOUND,
               "no user function");
    EXPECT_ERR(tpk_phi_register_derivative(f->reg, "tanh", u_sin_d, 0, ctx), TPK_EINVAL, "built-in");
    EXPECT_ERR(tpk_phi_register_derivative(f->reg, "usin", NULL, 0, ctx), TPK_EINVAL, "required");
    EXPECT_ERR(tpk_phi_register_derivative(NULL, "usin", u_sin_d, 0, ctx), TPK_EINVAL, "required");
    EXPECT_ERR(tpk_phi_register_derivative(f->reg, "usin", u_sin_d, 1u << 9, ctx), TPK_EINVAL, "flag");
    /* kernels: non-PSD, NaN, an infinite expectation, no workspace for quadrature */
    EXPECT_ERR(tpk_gauss_expect2(rd, 1.37, 0.82, 1.2, f->ws, &r, ctx), TPK_EDOM, "not PSD");
    EXPECT_ERR(tpk_gauss_expect2(rd, NAN, 0.82, 0.1, f->ws, &r, ctx), TPK_EDOM, "not a number");
    EXPECT_ERR(tpk_gauss_expect2(rd, 1.0, -0.5, 0.0, f->ws, &r, ctx), TPK_EDOM, "variance");
    EXPECT_ERR(tpk_gauss_expect2(ed, 9.0, 9.0, 1.0, f->ws, &r, ctx), TPK_EDOM, "infinite");
    EXPECT_ERR(tpk_gauss_expect1(ed, 0.3, 9.0, f->ws, &r, ctx), TPK_EDOM, "infinite");
    EXPECT_ERR(tpk_gauss_expect2(td, 1.0, 1.0, 0.5, NULL, &r, ctx), TPK_EINVAL, "workspace");
    double S[4] = {1.0, 2.0, 2.0, 1.0}, K[4];
    EXPECT_ERR(tpk_gauss_map(rd, S, 2, K, NULL, NULL, ctx), TPK_EDOM, "(1,0)");
    tpk_phi_free(step);
    tpk_phi_free(sign);
    tpk_phi_free(ac0);
    tpk_phi_free(rd);
    tpk_phi_free(ed);
    tpk_phi_free(td);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_flags_and_specs),
        cmocka_unit_test(test_derivative_vs_differences),
        cmocka_unit_test(test_eval_n),
        cmocka_unit_test(test_price_theorem),
        cmocka_unit_test(test_closed_forms_explicit),
        cmocka_unit_test(test_kernels_vs_oracles),
        cmocka_unit_test(test_expect1),
        cmocka_unit_test(test_degenerate),
        cmocka_unit_test(test_maps),
        cmocka_unit_test(test_chain),
        cmocka_unit_test(test_user_numerical),
        cmocka_unit_test(test_error_paths),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
