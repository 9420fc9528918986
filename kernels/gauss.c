/* Gaussian expectations of registered φ (phi.c): the closed forms of theory.md §3.2, with quadrature
 * (gauss_quad.c) where no closed form exists. */
#include "gauss_impl.h"
#include "tpk/mvn.h"

#include <ctype.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PI 3.14159265358979323846
#define SQRT2 1.41421356237309504880
#define INV_SQRT2PI 0.39894228040143267794

/* Relative slack on |k| ≤ √(q1 q2) before a covariance counts as not PSD. Inputs are typically
 * Gram matrices from a BLAS (diagonal and off-diagonal summed in different orders, relative
 * discrepancy up to ~d·ε ≈ 2e-12 for d = 10⁴) or earlier layers of a kernel recursion; genuine
 * non-PSD input is off by far more. Within the slack ρ is clamped to ±1. */
#define PSD_RTOL GAUSS_PSD_RTOL

/* ==== validation ========================================================================= */

/* What an underflowing kernel means and what to change (issue 18: it was "covariance not PSD",
 * and with a closed-form phi an all-zero kernel, exit 0). */
#define UNDERFLOW_HINT "the signal vanishes with depth (e.g. ReLU with sigma_w2 < 2 halves it " \
                       "every layer): fewer layers or a larger weight variance"

static int check_var(double q, const char *what, tpk_ctx *ctx)
{
    (void)what;
    if (isinf(q))
        return TPK_ERROR(ctx, TPK_EDOM, "a pre-activation variance overflowed to inf: the "
                         "kernel grows without bound (weight variance or depth too large for "
                         "this nonlinearity)");
    if (isnan(q))
        return TPK_ERROR(ctx, TPK_EDOM, "a pre-activation variance is not a number: an earlier "
                         "step overflowed (inf - inf or 0 * inf; a weight variance or the depth "
                         "too large)");
    if (!(q >= 0))
        return TPK_ERROR(ctx, TPK_EDOM, "a pre-activation variance is %g, not a finite variance "
                         ">= 0", q);
    return TPK_OK;
}

int tpk__gauss_check_cov(double q1, double q2, double k, double *rho, tpk_ctx *ctx)
{
    int st = check_var(q1, "q1", ctx);
    if (!st)
        st = check_var(q2, "q2", ctx);
    if (st)
        return st;
    if (!isfinite(k))
        return TPK_ERROR(ctx, TPK_EDOM, "covariance k = %g is not finite", k);
    /* √q1·√q2 rather than √(q1q2): the product can under/overflow. */
    double s = q1 == q2 ? q1 : sqrt(q1) * sqrt(q2);
    if (fabs(k) > s * (1.0 + PSD_RTOL) && ((q1 > 0 && q1 < DBL_MIN) || (q2 > 0 && q2 < DBL_MIN)))
        return TPK_ERROR(ctx, TPK_EDOM, "the kernel underflowed: variances %g and %g are below "
                         "the smallest normal double (%g), where covariances lose their digits; "
                         UNDERFLOW_HINT, q1, q2, DBL_MIN);
    if (fabs(k) > s * (1.0 + PSD_RTOL))
        return TPK_ERROR(ctx, TPK_EDOM,
                         "covariance not PSD: |k| = %.17g exceeds sqrt(q1*q2) = %.17g (q1 = %g, q2 = %g)",
                         fabs(k), s, q1, q2);
    double r = s > 0 ? k / s : 0.0;
    /* ρ within a few ulp of ±1 is ±1: that is the size of the rounding in k/√(q1q2) (and in the
     * map's k·a_i·a_j), and snapping makes identical inputs give the exact diagonal value where
     * E is not Lipschitz in ρ (step, sign). */
    if (fabs(r) >= 1.0 - GAUSS_RHO_SNAP)
        r = r > 0 ? 1.0 : -1.0;
    *rho = r;
    return TPK_OK;
}

/* ==== closed forms ======================================================================= */

/* Error in asin(x) caused by a relative rounding of a few ε in x itself. asin is not Lipschitz at
 * ±1, so near there the honest bound is √(2δ), not δ/√(1−x²). */
double tpk__gauss_asin_rounding(double x)
{
    double ax = fabs(x), d = 4.0 * GAUSS_EPS * ax, g = (1.0 - ax) * (1.0 + ax);
    double lin = g > 0 ? d / sqrt(g) : INFINITY;
    double root = sqrt(2.0 * d);
    return (lin < root ? lin : root) + 2.0 * GAUSS_EPS * fabs(asin(x));
}

static double clamp1(double x) { return x > 1.0 ? 1.0 : x < -1.0 ? -1.0 : x; }

static double std_cdf(double x) { return 0.5 * erfc(-x / SQRT2); }
static double std_pdf(double x) { return INV_SQRT2PI * exp(-0.5 * x * x); }

static int finite_result(const tpk_phi *phi, double v, tpk_ctx *ctx)
{
    if (!isfinite(v))
        return TPK_ERROR(ctx, TPK_ENUMERIC, "E[phi phi] for %s overflows a double", phi->canon);
    return TPK_OK;
}

/* det(I − 2bΣ) = (1 − 2bq1)(1 − 2bq2) − 4b²k², formed as 1 − 2b(q1 + q2) + 4b²(q1q2 − k²): for
 * b ≤ 0 (erf′, the decaying expsq) every term is ≥ 0, so there is no cancellation when q is
 * large and |ρ| → 1, where the product form lost every digit. Returns 1 where E is infinite
 * (I − 2bΣ not positive definite). */
static int expsq_det(double b, double q1, double q2, double k, double *d1, double *d2, double *det)
{
    const double dq = q1 * q2 - k * k;
    *d1 = 1.0 - 2.0 * b * q1;
    *d2 = 1.0 - 2.0 * b * q2;
    *det = 1.0 - 2.0 * b * (q1 + q2) + 4.0 * b * b * (dq > 0 ? dq : 0.0);
    return !(*d1 > 0 && *d2 > 0 && *det > 0);
}

/* Relative condition of det above: O(1) for b ≤ 0, the size of the cancelled terms otherwise. */
static double expsq_det_cond(double b, double d1, double d2, double k, double det)
{
    return b <= 0 ? 2.0 : (fabs(d1 * d2) + 4.0 * b * b * k * k) / det;
}

int tpk__gauss_cf2(const tpk_phi *phi, double q1, double q2, double k, double rho, double *val,
                   double *err, tpk_ctx *ctx)
{
    const double eps = GAUSS_EPS;
    double v = 0.0, e = 0.0;
    switch (phi->kind) {
    case GK_IDENTITY:
        v = k;
        e = 0.0;
        break;
    case GK_ABRELU: {
        /* (a−b)²/(2π)·√(q1q2−k²) + [(a²+b²)/2 − (a−b)²θ/(2π)]·k, rewritten with θ = π/2 − asin ρ:
         * √(q1q2)·[c0 √(1−ρ²) + (c1 + c0 asin ρ) ρ], c0 = (a−b)²/(2π), c1 = (a+b)²/4. */
        const double a = phi->ca, b = phi->cb, c0 = (a - b) * (a - b) / (2 * PI),
                     c1 = 0.25 * (a + b) * (a + b);
        const double s = q1 == q2 ? q1 : sqrt(q1) * sqrt(q2);
        if (rho == 1.0)
            v = 0.5 * (a * a + b * b) * s; /* diagonal column: exact */
        else if (rho == -1.0)
            v = -a * b * s;
        else
            v = s * (c0 * sqrt((1.0 - rho) * (1.0 + rho)) + (c1 + c0 * asin(rho)) * rho);
        /* dE/dρ is bounded (by s(c1 + c0π/2)), so ρ's rounding adds only a few ε. */
        e = 8.0 * eps * s * (c0 * (1.0 + PI / 2) + c1);
        break;
    }
    case GK_STEP:
        v = 0.25 + asin(rho) / (2 * PI);
        e = tpk__gauss_asin_rounding(rho) / (2 * PI) + 4.0 * eps;
        break;
    case GK_SIGN:
        v = (2.0 / PI) * asin(rho);
        e = (2.0 / PI) * tpk__gauss_asin_rounding(rho) + 4.0 * eps;
        break;
    case GK_ARCCOS2: {
        /* (q1q2)/(2π)·J2, J2 = 3 sinθ cosθ + (π−θ)(1+2cos²θ) with cosθ = ρ, π−θ = π/2 + asin ρ */
        const double s = q1 == q2 ? q1 * q1 : q1 * q2;
        if (rho == 1.0)
            v = 1.5 * s;
        else if (rho == -1.0)
            v = 0.0;
        else
            v = s / (2 * PI) *
                (3.0 * rho * sqrt((1.0 - rho) * (1.0 + rho)) + (PI / 2 + asin(rho)) * (1.0 + 2.0 * rho * rho));
        e = 16.0 * eps * s;
        break;
    }
    case GK_ERF:
    case GK_ERF_SIGMOID: {
        /* Williams 1997: (2/π) asin(2k / √((1+2q1)(1+2q2))), with Σ → b²Σ for erf(bx). */
        const double b2 = phi->kind == GK_ERF ? phi->cb * phi->cb : 1.0;
        const double x = clamp1(2.0 * b2 * k / (sqrt(1.0 + 2.0 * b2 * q1) * sqrt(1.0 + 2.0 * b2 * q2)));
        if (phi->kind == GK_ERF) {
            v = (2.0 / PI) * asin(x);
            e = (2.0 / PI) * tpk__gauss_asin_rounding(x) + 4.0 * eps;
        } else {
            v = 0.25 + asin(x) / (2 * PI);
            e = tpk__gauss_asin_rounding(x) / (2 * PI) + 4.0 * eps;
        }
        break;
    }
    case GK_GELU: {
        /* Tsuchida et al.: P = (1+q1)(1+q2), Δ = √(P−k²):
         * k/4 + (1/2π)[k asin(k/√P) + (k² + q1q2Δ²)/(PΔ)]. With x = k/√P, Δ = √P·√(1−x²):
         * (k² + q1q2Δ²)/(PΔ) = (x² + q1q2(1−x²)) / (√P √(1−x²)). 1 − x² is formed as
         * Δ²/P with Δ² = 1 + q1 + q2 + (q1q2 − k²) ≥ 1: no cancellation, never 0 (even when
         * 1 + q rounds to q). */
        const double rp = 1.0 / (sqrt(1.0 + q1) * sqrt(1.0 + q2));
        const double dq = q1 * q2 - k * k, d2 = 1.0 + q1 + q2 + (dq > 0 ? dq : 0.0);
        const double x = clamp1(k * rp), w2 = d2 * rp * rp, w = sqrt(w2);
        const double t = rp * (x * x + q1 * q2 * w2) / w;
        v = 0.25 * k + (k * asin(x) + t) / (2 * PI);
        e = 8.0 * eps * (0.25 * fabs(k) + (fabs(k) * PI / 2 + t) / (2 * PI)) +
            fabs(k) * tpk__gauss_asin_rounding(x) / (2 * PI);
        break;
    }
    case GK_SIN: {
        /* sin A sin B = [cos(A−B) − cos(A+B)]/2 with A = bu+c, B = bv+c:
         * (a²/2)[e^{−b²(q1+q2−2k)/2} − σ cos(2c) e^{−b²(q1+q2+2k)/2}], σ = +1 sin, −1 cos. */
        const double a = phi->ca, b2 = phi->cb * phi->cb, sig = phi->m ? -1.0 : 1.0;
        const double e1 = exp(-0.5 * b2 * (q1 + q2 - 2.0 * k)), e2 = exp(-0.5 * b2 * (q1 + q2 + 2.0 * k));
        const double c2 = cos(2.0 * phi->cc);
        /* e1 − σ c2 e2 = (e1 − e2) + (1 − σ c2) e2 with e1 − e2 = −e1·expm1(−2b²k) and
         * 1 − σ cos 2c = 2 sin²c (sin) or 2 cos²c (cos): no cancellation where e1 ≈ e2, i.e. at
         * small variances, where the plain difference lost every digit (sin(u) at q = 1e-17
         * gave 0, issue 18). */
        const double sc = sig > 0 ? sin(phi->cc) : cos(phi->cc);
        v = 0.5 * a * a * (-e1 * expm1(-2.0 * b2 * k) + 2.0 * sc * sc * e2);
        /* exp's relative error grows with its argument's rounding: ε·(1 + |arg|). */
        e = 8.0 * eps * 0.5 * a * a * (e1 + fabs(c2) * e2) * (2.0 + b2 * (q1 + q2 + 2.0 * fabs(k)));
        break;
    }
    case GK_EXP: {
        const double a = phi->ca, b2 = phi->cb * phi->cb, arg = 0.5 * b2 * (q1 + q2 + 2.0 * k);
        v = a * a * exp(arg);
        e = 4.0 * eps * fabs(v) * (2.0 + fabs(arg));
        break;
    }
    case GK_EXPSQ: {
        /* E e^{b(u²+v²)} = det(I − 2bΣ)^{−1/2}: finite only when I − 2bΣ is positive definite. */
        const double a = phi->ca, b = phi->cb;
        double d1, d2, det;
        if (expsq_det(b, q1, q2, k, &d1, &d2, &det))
            return TPK_ERROR(ctx, TPK_EDOM,
                             "E[phi(u)phi(v)] is infinite for %s at q1 = %g, q2 = %g, k = %g "
                             "(needs I - 2b*Sigma positive definite)", phi->canon, q1, q2, k);
        v = a * a / sqrt(det);
        e = 8.0 * eps * fabs(v) * (1.0 + expsq_det_cond(b, d1, d2, k, det));
        break;
    }
    case GK_MONO: {
        const double P = q1 * q2, k2 = k * k;
        double terms;
        switch (phi->m) {
        case 2: v = 2.0 * k2 + P; terms = 2.0 * k2 + P; break;
        case 3: v = k * (6.0 * k2 + 9.0 * P); terms = fabs(k) * (6.0 * k2 + 9.0 * P); break;
        case 4: v = 24.0 * k2 * k2 + 72.0 * k2 * P + 9.0 * P * P; terms = v; break;
        default:
            v = k * (120.0 * k2 * k2 + 600.0 * k2 * P + 225.0 * P * P);
            terms = fabs(v);
            break;
        }
        /* a·x^m (φ′ of x^{m+1}: a = m + 1) scales the kernel by a² */
        const double a2 = phi->ca * phi->ca;
        v *= a2;
        e = 8.0 * eps * terms * a2;
        break;
    }
    case GK_STEPMIX: {
        /* theory.md §3.5: s = μ + h·sign on x ≠ 0 with μ = (a+b)/2, h = (b−a)/2, so
         * E[s(u)s(v)] = μ² + h²·(2/π) asin ρ; relu′: 1/4 + asin(ρ)/(2π) = (π − θ)/(2π), the
         * arc-cosine kernel of degree 0 (Cho & Saul 2009). Exact at ρ = ±1: (a²+b²)/2 and ab. */
        const double mu = 0.5 * (phi->ca + phi->cb), h = 0.5 * (phi->cb - phi->ca);
        const double c1 = (2.0 / PI) * h * h;
        v = mu * mu + c1 * asin(rho);
        e = c1 * tpk__gauss_asin_rounding(rho) + 4.0 * eps * (mu * mu + h * h);
        break;
    }
    case GK_XEXPSQ: {
        /* theory.md §3.5: E[uv e^{b(u²+v²)}] = k·det(I − 2bΣ)^{−3/2} (the Gaussian with
         * precision Σ⁻¹ − 2bI has covariance Σ(I − 2bΣ)⁻¹, whose off-diagonal entry is k/det). */
        const double a = phi->ca, b = phi->cb;
        double d1, d2, det;
        if (expsq_det(b, q1, q2, k, &d1, &d2, &det))
            return TPK_ERROR(ctx, TPK_EDOM,
                             "E[phi(u)phi(v)] is infinite for %s at q1 = %g, q2 = %g, k = %g "
                             "(needs I - 2b*Sigma positive definite)", phi->canon, q1, q2, k);
        v = a * a * k / (det * sqrt(det));
        e = 8.0 * eps * fabs(v) * (2.0 + 1.5 * expsq_det_cond(b, d1, d2, k, det));
        break;
    }
    case GK_GELU_D: {
        /* theory.md §3.5: with P_i = 1 + q_i and D = P1P2 − k² = 1 + q1 + q2 + (q1q2 − k²) ≥ 1,
         * E[(Φ(u) + uφ(u))(Φ(v) + vφ(v))] = 1/4 + asin(k/√(P1P2))/(2π)
         *   + k/(2π√D)·(1/P1 + 1/P2) + k/(2π D^{3/2}). */
        const double p1 = 1.0 + q1, p2 = 1.0 + q2, dq = q1 * q2 - k * k;
        const double D = 1.0 + q1 + q2 + (dq > 0 ? dq : 0.0), sD = sqrt(D);
        const double x = clamp1(k / (sqrt(p1) * sqrt(p2)));
        const double t = k / (2 * PI * sD) * (1.0 / p1 + 1.0 / p2 + 1.0 / D);
        v = 0.25 + asin(x) / (2 * PI) + t;
        e = 8.0 * eps * (0.25 + 0.25 + 2.0 * fabs(t)) + tpk__gauss_asin_rounding(x) / (2 * PI);
        break;
    }
    case GK_BOX: {
        /* a²·P(|u| < t, |v| < t): inclusion–exclusion over four bivariate normal CDFs */
        const double a = phi->ca, h1 = phi->cb / sqrt(q1), h2 = phi->cb / sqrt(q2);
        const double hs[4][2] = {{h1, h2}, {h1, -h2}, {-h1, h2}, {-h1, -h2}};
        const double sg[4] = {1.0, -1.0, -1.0, 1.0};
        double pr = 0.0, pe = 0.0;
        for (int c = 0; c < 4; c++) {
            tpk_estimate b;
            int st = tpk_mvn_bvn(hs[c][0], hs[c][1], rho, &b, ctx);
            if (st)
                return st;
            pr += sg[c] * b.value;
            pe += b.err;
        }
        pr = pr < 0 ? 0.0 : pr; /* cancellation in the tails */
        v = a * a * pr;
        e = a * a * (pe + 8.0 * eps);
        break;
    }
    default:
        return TPK_ERROR(ctx, TPK_EINVAL, "internal: %s has no closed form", phi->canon);
    }
    *val = v;
    *err = e;
    return finite_result(phi, v, ctx);
}

int tpk__gauss_cf1(const tpk_phi *phi, double m, double q, double *val, double *err, tpk_ctx *ctx)
{
    const double eps = GAUSS_EPS;
    if (q == 0) {
        *val = tpk_phi_eval(phi, m);
        *err = 0.0;
        return finite_result(phi, *val, ctx);
    }
    const double sd = sqrt(q);
    double v = 0.0, scale = 0.0;
    switch (phi->kind) {
    case GK_IDENTITY: v = m; scale = 0.0; break;
    case GK_ABRELU: {
        /* E max(u,0) = mΦ(m/s) + sφ(m/s); E min(u,0) = m − E max(u,0). */
        const double z = m / sd, emax = m * std_cdf(z) + sd * std_pdf(z), emin = m - emax;
        v = phi->ca * emin + phi->cb * emax;
        scale = (fabs(phi->ca) + fabs(phi->cb)) * (fabs(m) + sd);
        break;
    }
    case GK_STEP: v = std_cdf(m / sd); scale = 1.0; break;
    case GK_SIGN: v = erf(m / (SQRT2 * sd)); scale = 1.0; break;
    case GK_ARCCOS2: {
        /* E[u² 1[u>0]] = (m² + q)Φ(m/s) + m s φ(m/s) */
        const double z = m / sd;
        v = (m * m + q) * std_cdf(z) + m * sd * std_pdf(z);
        scale = m * m + q + fabs(m) * sd;
        break;
    }
    case GK_ERF: {
        const double b = phi->cb;
        v = erf(b * m / sqrt(1.0 + 2.0 * b * b * q));
        scale = 1.0;
        break;
    }
    case GK_ERF_SIGMOID: v = 0.5 * erfc(-m / sqrt(1.0 + 2.0 * q)); scale = 1.0; break;
    case GK_GELU: {
        /* Stein: E[uΦ(u)] = m EΦ(u) + q Eφ(u) = mΦ(m/√(1+q)) + q φ(m/√(1+q))/√(1+q) */
        const double r = sqrt(1.0 + q), z = m / r;
        v = m * std_cdf(z) + q * std_pdf(z) / r;
        scale = fabs(m) + q;
        break;
    }
    case GK_SIN: {
        const double a = phi->ca, b = phi->cb, damp = exp(-0.5 * b * b * q);
        const double ph = b * m + phi->cc;
        v = a * (phi->m ? cos(ph) : sin(ph)) * damp;
        scale = fabs(a) * damp * (2.0 + fabs(ph) + b * b * q);
        break;
    }
    case GK_EXP: {
        const double arg = phi->cb * m + 0.5 * phi->cb * phi->cb * q;
        v = phi->ca * exp(arg);
        scale = fabs(v) * (2.0 + fabs(arg));
        break;
    }
    case GK_EXPSQ: {
        const double b = phi->cb, d = 1.0 - 2.0 * b * q;
        if (!(d > 0))
            return TPK_ERROR(ctx, TPK_EDOM, "E[phi(u)] is infinite for %s at q = %g (needs 1 - 2bq > 0)",
                             phi->canon, q);
        const double arg = b * m * m / d;
        v = phi->ca * exp(arg) / sqrt(d);
        scale = fabs(v) * (2.0 + fabs(arg) + 1.0 / d);
        break;
    }
    case GK_MONO: {
        const double m2 = m * m;
        switch (phi->m) {
        case 2: v = m2 + q; scale = v; break;
        case 3: v = m * (m2 + 3.0 * q); scale = fabs(m) * (m2 + 3.0 * q); break;
        case 4: v = m2 * m2 + 6.0 * m2 * q + 3.0 * q * q; scale = v; break;
        default:
            v = m * (m2 * m2 + 10.0 * m2 * q + 15.0 * q * q);
            scale = fabs(v);
            break;
        }
        v *= phi->ca;
        scale *= fabs(phi->ca);
        break;
    }
    case GK_STEPMIX: {
        const double z = m / sd;
        v = phi->ca * std_cdf(-z) + phi->cb * std_cdf(z);
        scale = fabs(phi->ca) + fabs(phi->cb);
        break;
    }
    case GK_XEXPSQ: {
        /* E[u e^{bu²}] = ∂_m E[e^{bu²}]/(2b) = m e^{bm²/d} d^{−3/2}, d = 1 − 2bq */
        const double b = phi->cb, d = 1.0 - 2.0 * b * q;
        if (!(d > 0))
            return TPK_ERROR(ctx, TPK_EDOM, "E[phi(u)] is infinite for %s at q = %g (needs 1 - 2bq > 0)",
                             phi->canon, q);
        const double arg = b * m * m / d;
        v = phi->ca * m * exp(arg) / (d * sqrt(d));
        scale = fabs(v) * (2.0 + fabs(arg) + 1.5 / d);
        break;
    }
    case GK_GELU_D: {
        /* ∂_m of GELU's E[uΦ(u)] above: Φ(z) + φ(z)·m/r³, r = √(1+q), z = m/r */
        const double r = sqrt(1.0 + q), z = m / r;
        v = std_cdf(z) + std_pdf(z) * m / (r * r * r);
        scale = 1.0 + fabs(m);
        break;
    }
    case GK_BOX: {
        const double t = phi->cb;
        v = phi->ca * (std_cdf((t - m) / sd) - std_cdf((-t - m) / sd));
        scale = fabs(phi->ca);
        break;
    }
    default:
        return TPK_ERROR(ctx, TPK_EINVAL, "internal: %s has no closed form", phi->canon);
    }
    *val = v;
    *err = 8.0 * eps * scale;
    return finite_result(phi, v, ctx);
}

static int expect2_any(const tpk_phi *phi, double q1, double q2, double k, double rho,
                       const tpk_gauss_ws *ws, double *val, double *err, tpk_ctx *ctx);

/* E[φ(u)²] of a positive variance below the smallest normal double: the next layer's variance
 * would be subnormal or 0, every later one 0, and the kernel all zeros without a word. */
int tpk__gauss_expect2_checked(const tpk_phi *phi, double q1, double q2, double k, double rho,
                               const tpk_gauss_ws *ws, double *val, double *err, tpk_ctx *ctx)
{
    int st = expect2_any(phi, q1, q2, k, rho, ws, val, err, ctx);
    if (st == TPK_OK && q1 > 0 && q1 == q2 && k == q1 && fabs(*val) < DBL_MIN)
        return TPK_ERROR(ctx, TPK_EDOM, "the kernel underflowed: E[%s(u)^2] = %g for u ~ N(0, %g) "
                         "is below the smallest normal double (%g); " UNDERFLOW_HINT, phi->canon,
                         *val, q1, DBL_MIN);
    return st;
}

static int expect2_any(const tpk_phi *phi, double q1, double q2, double k, double rho,
                       const tpk_gauss_ws *ws, double *val, double *err, tpk_ctx *ctx)
{
    if (phi->kind == GK_NUMERIC) {
        if (!ws)
            return TPK_ERROR(ctx, TPK_EINVAL, "%s has no closed form: a Gauss-Hermite workspace is required",
                             phi->canon);
        tpk__gauss_quad2(phi, phi, 0.0, 0.0, q1, q2, rho, ws, val, err);
        return finite_result(phi, *val, ctx);
    }
    if (q1 == 0 || q2 == 0) {
        /* A zero variance makes that variable the constant 0: E = φ(0)·E φ(other). */
        double f0 = tpk_phi_eval(phi, 0.0), m1, e1;
        int st = tpk__gauss_cf1(phi, 0.0, q1 == 0 ? q2 : q1, &m1, &e1, ctx);
        if (st)
            return st;
        *val = f0 * m1;
        *err = fabs(f0) * e1 + GAUSS_EPS * fabs(*val);
        return finite_result(phi, *val, ctx);
    }
    return tpk__gauss_cf2(phi, q1, q2, k, rho, val, err, ctx);
}

/* ==== public expectations ================================================================ */

int tpk_gauss_expect2(const tpk_phi *phi, double q1, double q2, double k, const tpk_gauss_ws *ws,
                      tpk_estimate *out, tpk_ctx *ctx)
{
    if (!phi || !out)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_gauss_expect2: phi and out are required");
    double rho = 0.0;
    int st = tpk__gauss_check_cov(q1, q2, k, &rho, ctx);
    if (st)
        return st;
    return tpk__gauss_expect2_checked(phi, q1, q2, k, rho, ws, &out->value, &out->err, ctx);
}

int tpk_gauss_expect2_quad(const tpk_phi *f, const tpk_phi *g, double m1, double m2, double q1,
                           double q2, double k, const tpk_gauss_ws *ws, tpk_estimate *out,
                           tpk_ctx *ctx)
{
    if (!f || !g || !ws || !out)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_gauss_expect2_quad: f, g, ws and out are required");
    if (!isfinite(m1) || !isfinite(m2))
        return TPK_ERROR(ctx, TPK_EDOM, "means (%g, %g) must be finite", m1, m2);
    double rho = 0.0;
    int st = tpk__gauss_check_cov(q1, q2, k, &rho, ctx);
    if (st)
        return st;
    tpk__gauss_quad2(f, g, m1, m2, q1, q2, rho, ws, &out->value, &out->err);
    if (!isfinite(out->value))
        return TPK_ERROR(ctx, TPK_ENUMERIC, "E[%s * %s] is not finite at these moments", f->canon,
                         g->canon);
    return TPK_OK;
}

int tpk_gauss_expect1(const tpk_phi *f, double m, double q, const tpk_gauss_ws *ws,
                      tpk_estimate *out, tpk_ctx *ctx)
{
    if (!f || !out)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_gauss_expect1: f and out are required");
    if (!isfinite(m))
        return TPK_ERROR(ctx, TPK_EDOM, "mean %g is not finite", m);
    int st = check_var(q, "q", ctx);
    if (st)
        return st;
    if (f->kind != GK_NUMERIC || q == 0)
        return tpk__gauss_cf1(f, m, q, &out->value, &out->err, ctx);
    if (!ws)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s has no closed form: a Gauss-Hermite workspace is required",
                         f->canon);
    tpk__gauss_quad1(f, m, q, ws, &out->value, &out->err);
    return finite_result(f, out->value, ctx);
}
