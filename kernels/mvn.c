/* Deterministic bivariate, trivariate and quadrivariate normal probabilities with error bounds:
 * the low-dimensional orthant probabilities that erf-gate products reduce to (theory.md §2.3,
 * §3.3), in place of randomised QMC up to 4 dimensions.
 *
 *   BVN  Drezner & Wesolowsky, "On the computation of the bivariate normal integral", J. Stat.
 *        Comput. Simul. 35 (1990), in the refined form of A. Genz, "Numerical computation of
 *        rectangular bivariate and trivariate normal and t probabilities", Stat. Comput. 14
 *        (2004) 251–260 (his BVNU): Gauss–Legendre in θ = asin ρ, the asymptotic expansion
 *        with Taylor correction for |ρ| ≥ 0.925. Double precision (err 1e-15 absolute).
 *   TVN  Genz (2004) §3: Plackett's identity ∂P/∂ρ_ij = φ2(b_i, b_j; ρ_ij)·P(rest | X_i = b_i,
 *        X_j = b_j) along ρ12(t) = t·r12, ρ13(t) = t·r13 (the largest |r| kept fixed as r23), so
 *        P = Φ(b1)Φ2(b2, b3; r23) + (1/2π)[∫_0^{asin r12} … dθ + ∫_0^{asin r13} … dθ], the
 *        substitution ρ = sin θ removing the 1/√(1 − ρ²) of the density.
 *   QVN  P = ∫_{−∞}^{b1} φ(x) P3(conditional on X1 = x) dx: one Gauss–Kronrod integral of
 *        trivariates with partial correlations.
 * The quadratures are adaptive Gauss–Kronrod 7/15 (global bisection of the worst panel); a
 * panel's error is |K15 − G7|, the error of the 7-point rule, so the bound is conservative
 * for the K15 value returned. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "tpk/mvn.h"

/* Absolute error bound of the BVN algorithm: Genz (2004) reports ~1e-15; tests/test_mvn.c
 * measures ≤ 4e-16 against 30-digit references over ρ ∈ [−1, 1] and tails to 1e-12. */
#define BVN_ERR 1e-15
/* Panels an adaptive integral may use before giving up on its tolerance. */
#define GK_MAXPANELS 64
/* Rounding floor of a Gauss–Kronrod panel, relative to the integral of |f| over it. */
#define GK_ROUND (64 * DBL_EPSILON)
/* Correlations within this of ±1 are exactly ±1: the pair is merged (tpk_mvn_cdf). */
#define RHO_ONE 1e-14
/* Cholesky pivots below this (relative to 1 for a correlation matrix) are singular. */
#define PIVOT_TOL 1e-12
/* φ(x) ≤ 1e-18 beyond |x| = 9: the outer integral of QVN is cut there (mass Φ(−9) = 1.1e-19). */
#define QVN_CUT 9.0
#define PHI_M9 1.2e-19

static double Phi(double x) { return 0.5 * erfc(-x * M_SQRT1_2); }

/* ---- BVN ------------------------------------------------------------------------------------ */

/* Genz's BVNU: P(X > dh, Y > dk), correlation r, |r| ≤ 1. */
static double bvnu(double dh, double dk, double r)
{
    if (dh == INFINITY || dk == INFINITY)
        return 0.0;
    if (dh == -INFINITY)
        return dk == -INFINITY ? 1.0 : Phi(-dk);
    if (dk == -INFINITY)
        return Phi(-dh);
    if (r == 0.0)
        return Phi(-dh) * Phi(-dk);
    static const double w6[3] = {0.1713244923791705, 0.3607615730481384, 0.4679139345726904};
    static const double x6[3] = {0.9324695142031522, 0.6612093864662647, 0.2386191860831970};
    static const double w12[6] = {.04717533638651177, 0.1069393259953183, 0.1600783285433464,
                                  0.2031674267230659, 0.2334925365383547, 0.2491470458134029};
    static const double x12[6] = {0.9815606342467191, 0.9041172563704750, 0.7699026741943050,
                                  0.5873179542866171, 0.3678314989981802, 0.1252334085114692};
    static const double w20[10] = {.01761400713915212, .04060142980038694, .06267204833410906,
                                   .08327674157670475, 0.1019301198172404, 0.1181945319615184,
                                   0.1316886384491766, 0.1420961093183821, 0.1491729864726037,
                                   0.1527533871307259};
    static const double x20[10] = {0.9931285991850949, 0.9639719272779138, 0.9122344282513259,
                                   0.8391169718222188, 0.7463319064601508, 0.6360536807265150,
                                   0.5108670019508271, 0.3737060887154196, 0.2277858511416451,
                                   0.07652652113349733};
    const double *w, *x;
    int n;
    double ar = fabs(r);
    if (ar < 0.3) {
        w = w6, x = x6, n = 3;
    } else if (ar < 0.75) {
        w = w12, x = x12, n = 6;
    } else {
        w = w20, x = x20, n = 10;
    }
    const double tp = 2.0 * M_PI;
    double h = dh, k = dk, hk = h * k, bvn = 0.0;
    if (ar < 0.925) {
        double hs = (h * h + k * k) / 2, asr = asin(r) / 2;
        for (int i = 0; i < n; i++)
            for (int sgn = -1; sgn <= 1; sgn += 2) {
                double sn = sin(asr * (1.0 + sgn * x[i]));
                bvn += w[i] * exp((sn * hk - hs) / (1.0 - sn * sn));
            }
        return fmax(0.0, fmin(1.0, bvn * asr / tp + Phi(-h) * Phi(-k)));
    }
    if (r < 0) {
        k = -k;
        hk = -hk;
    }
    if (ar < 1.0) {
        double as = (1.0 - r) * (1.0 + r), a = sqrt(as), bs = (h - k) * (h - k);
        double asr = -(bs / as + hk) / 2, c = (4.0 - hk) / 8, d = (12.0 - hk) / 80;
        if (asr > -100)
            bvn = a * exp(asr) * (1.0 - c * (bs - as) * (1.0 - d * bs) / 3 + c * d * as * as);
        if (hk > -100) {
            double b = sqrt(bs), sp = sqrt(tp) * Phi(-b / a);
            bvn -= exp(-hk / 2) * sp * b * (1.0 - c * bs * (1.0 - d * bs) / 3);
        }
        a /= 2;
        double s = 0.0;
        for (int i = 0; i < n; i++)
            for (int sgn = -1; sgn <= 1; sgn += 2) {
                double xs = a * (1.0 + sgn * x[i]);
                xs *= xs;
                double as2 = -(bs / xs + hk) / 2;
                if (as2 <= -100)
                    continue;
                double sp2 = 1.0 + c * xs * (1.0 + 5.0 * d * xs), rs = sqrt(1.0 - xs);
                double ep = exp(-(hk / 2) * xs / ((1.0 + rs) * (1.0 + rs))) / rs;
                s += w[i] * exp(as2) * (sp2 - ep);
            }
        bvn = (a * s - bvn) / tp;
    }
    if (r > 0) {
        bvn += Phi(-fmax(h, k));
    } else if (h >= k) {
        bvn = -bvn;
    } else {
        double L = h < 0 ? Phi(k) - Phi(h) : Phi(-h) - Phi(-k);
        bvn = L - bvn;
    }
    return fmax(0.0, fmin(1.0, bvn));
}

static double bvn_lower(double h, double k, double r) { return bvnu(-h, -k, r); }

int tpk_mvn_bvn(double h, double k, double rho, tpk_estimate *out, tpk_ctx *ctx)
{
    if (out == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_mvn_bvn: out must not be NULL");
    if (isnan(h) || isnan(k) || !(fabs(rho) <= 1.0))
        return TPK_ERROR(ctx, TPK_EDOM, "tpk_mvn_bvn: limits (%g, %g) and correlation %g must be "
                         "numbers with |rho| <= 1", h, k, rho);
    out->value = bvn_lower(h, k, rho);
    out->err = BVN_ERR;
    return TPK_OK;
}

/* ---- adaptive Gauss–Kronrod 7/15 ------------------------------------------------------------- */

typedef double (*gk_fn)(double x, void *par);

static const double xgk[8] = {0.991455371120812639206854697526329, 0.949107912342758524526189684047851,
                              0.864864423359769072789712788640926, 0.741531185599394439863864773280788,
                              0.586087235467691130294144845693013, 0.405845151377397166906606412076961,
                              0.207784955007898467600689403773245, 0.0};
static const double wgk[8] = {0.022935322010529224963732008058970, 0.063092092629978553290700663189204,
                              0.104790010322250183839876322541518, 0.140653259715525918745189590510238,
                              0.169004726639267902826583426598550, 0.190350578064785409913256402421014,
                              0.204432940075298892414161999234649, 0.209482141084727828012999174891714};
static const double wg7[4] = {0.129484966168869693270611432679082, 0.279705391489276667901467771423780,
                              0.381830050505118944950369775488975, 0.417959183673469387755102040816327};

typedef struct panel {
    double a, b, val, err;
} panel;

static void gk15(gk_fn f, void *par, panel *p)
{
    double c = 0.5 * (p->a + p->b), hl = 0.5 * (p->b - p->a);
    double fc = f(c, par), k = wgk[7] * fc, g = wg7[3] * fc, aabs = wgk[7] * fabs(fc);
    for (int j = 0; j < 7; j++) {
        double dx = hl * xgk[j], f1 = f(c - dx, par), f2 = f(c + dx, par);
        k += wgk[j] * (f1 + f2);
        aabs += wgk[j] * (fabs(f1) + fabs(f2));
        if (j & 1)
            g += wg7[j >> 1] * (f1 + f2);
    }
    p->val = k * hl;
    p->err = fabs((k - g) * hl) + GK_ROUND * aabs * fabs(hl);
}

/* ∫_a^b f over `npan0` equal starting panels, bisecting the worst until Σ err ≤ tol.
 * Returns 0 when the tolerance was met, 1 when the panel budget ran out (value and err valid). */
static int gk_adapt(gk_fn f, void *par, double a, double b, int npan0, double tol,
                    tpk_estimate *out)
{
    panel P[GK_MAXPANELS];
    int n = 0;
    if (npan0 < 1)
        npan0 = 1;
    for (int i = 0; i < npan0; i++, n++) {
        P[n].a = a + (b - a) * i / npan0;
        P[n].b = i == npan0 - 1 ? b : a + (b - a) * (i + 1) / npan0;
        gk15(f, par, &P[n]);
    }
    for (;;) {
        double val = 0.0, err = 0.0;
        int worst = 0;
        for (int i = 0; i < n; i++) {
            val += P[i].val;
            err += P[i].err;
            if (P[i].err > P[worst].err)
                worst = i;
        }
        if (err <= tol || n == GK_MAXPANELS) {
            out->value = val;
            out->err = err;
            return err <= tol ? 0 : 1;
        }
        double m = 0.5 * (P[worst].a + P[worst].b);
        P[n] = P[worst];
        P[n].a = m;
        P[worst].b = m;
        gk15(f, par, &P[worst]);
        gk15(f, par, &P[n]);
        n++;
    }
}

/* ---- TVN ------------------------------------------------------------------------------------ */

/* One Plackett term: variables (1, j) interpolated, k the third. s = sin θ = ρ_1j(t), t = s/r1j,
 * ρ_1k(t) = t·r1k, ρ_jk = rjk fixed. Integrand e^{−(b1² + bj² − 2 b1 bj s)/(2 cos²θ)}·Φ(u_k). */
typedef struct tvn_term {
    double b1, bj, bk, r1j, r1k, rjk;
} tvn_term;

static double tvn_integrand(double th, void *par)
{
    const tvn_term *q = par;
    double s = sin(th), D = 1.0 - s * s;
    if (D <= 0.0)
        return 0.0;
    double t = s / q->r1j, r1k = t * q->r1k;
    double e = exp(-(q->b1 * q->b1 + q->bj * q->bj - 2.0 * q->b1 * q->bj * s) / (2.0 * D));
    if (e == 0.0)
        return 0.0;
    double beta1 = (r1k - s * q->rjk) / D, betaj = (q->rjk - s * r1k) / D;
    double var = 1.0 - (r1k * r1k + q->rjk * q->rjk - 2.0 * s * r1k * q->rjk) / D;
    double num = q->bk - beta1 * q->b1 - betaj * q->bj;
    double p = var > 0.0 ? Phi(num / sqrt(var)) : (num > 0 ? 1.0 : 0.0);
    return e * p;
}

/* b finite, correlations valid; |r23| the largest. */
static int tvn_core(double b1, double b2, double b3, double r12, double r13, double r23,
                    double tol, tpk_estimate *out)
{
    if (r23 >= 1.0) { /* X3 = X2 */
        out->value = bvn_lower(b1, fmin(b2, b3), r12);
        out->err = BVN_ERR;
        return 0;
    }
    if (r23 <= -1.0) { /* X3 = −X2: −b3 < X2 < b2 */
        out->value = b2 > -b3 ? fmax(0.0, bvn_lower(b1, b2, r12) - bvn_lower(b1, -b3, r12)) : 0.0;
        out->err = 2 * BVN_ERR;
        return 0;
    }
    double base = Phi(b1) * bvn_lower(b2, b3, r23);
    tpk_estimate e12 = {0, 0}, e13 = {0, 0};
    int bad = 0;
    if (r12 != 0.0) {
        tvn_term q = {b1, b2, b3, r12, r13, r23};
        bad |= gk_adapt(tvn_integrand, &q, 0.0, asin(r12), 1, tol * M_PI, &e12);
    }
    if (r13 != 0.0) {
        tvn_term q = {b1, b3, b2, r13, r12, r23};
        bad |= gk_adapt(tvn_integrand, &q, 0.0, asin(r13), 1, tol * M_PI, &e13);
    }
    double v = base + (e12.value + e13.value) / (2.0 * M_PI);
    out->value = fmax(0.0, fmin(1.0, v));
    out->err = BVN_ERR + (e12.err + e13.err) / (2.0 * M_PI);
    return bad;
}

/* Reorder so that the pair with the largest |r| is (2, 3), then tvn_core. */
static int tvn_any(const double b[3], const double r[3], double tol, tpk_estimate *out)
{
    double a12 = fabs(r[0]), a13 = fabs(r[1]), a23 = fabs(r[2]);
    if (a23 >= a12 && a23 >= a13)
        return tvn_core(b[0], b[1], b[2], r[0], r[1], r[2], tol, out);
    if (a12 >= a13) /* (1,2) largest: new order (3, 1, 2) */
        return tvn_core(b[2], b[0], b[1], r[1], r[2], r[0], tol, out);
    /* (1,3) largest: new order (2, 1, 3) */
    return tvn_core(b[1], b[0], b[2], r[0], r[2], r[1], tol, out);
}

static int check_tol(double tol, const char *who, tpk_ctx *ctx)
{
    if (!(tol >= 0.0))
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: tolerance %g must be >= 0", who, tol);
    return TPK_OK;
}

int tpk_mvn_tvn(const double b[3], const double r[3], double tol, tpk_estimate *out,
                tpk_ctx *ctx)
{
    if (b == NULL || r == NULL || out == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_mvn_tvn: NULL argument");
    if (check_tol(tol, "tpk_mvn_tvn", ctx))
        return ctx ? ctx->status : TPK_EINVAL;
    for (int i = 0; i < 3; i++)
        if (isnan(b[i]) || !(fabs(r[i]) <= 1.0))
            return TPK_ERROR(ctx, TPK_EDOM, "tpk_mvn_tvn: limit %g or correlation %g is NaN or "
                             "|r| > 1", b[i], r[i]);
    double det = 1.0 - r[0] * r[0] - r[1] * r[1] - r[2] * r[2] + 2.0 * r[0] * r[1] * r[2];
    if (det < -PIVOT_TOL)
        return TPK_ERROR(ctx, TPK_EDOM, "tpk_mvn_tvn: correlations (%g, %g, %g) are not a "
                         "correlation matrix (determinant %.3g)", r[0], r[1], r[2], det);
    double S[9] = {1, r[0], r[1], r[0], 1, r[2], r[1], r[2], 1};
    return tpk_mvn_cdf(3, b, S, tol, out, ctx);
}

/* ---- QVN ------------------------------------------------------------------------------------ */

typedef struct qvn_par {
    double b[4];       /* b[0]: the conditioning variable */
    double r1[4];      /* r_1k */
    double sd[4];      /* √(1 − r_1k²) */
    double pr[3];      /* partial correlations of (2,3), (2,4), (3,4) given 1: {r12, r13, r23} of the TVN */
    double tol;
    double inner_err;  /* largest inner error met */
    int bad;
} qvn_par;

static double qvn_integrand(double x, void *par)
{
    qvn_par *q = par; /* records the inner errors */
    double bb[3];
    for (int k = 1; k < 4; k++)
        bb[k - 1] = (q->b[k] - q->r1[k] * x) / q->sd[k];
    tpk_estimate e;
    q->bad |= tvn_any(bb, q->pr, q->tol, &e);
    if (e.err > q->inner_err)
        q->inner_err = e.err;
    return exp(-0.5 * x * x) / sqrt(2.0 * M_PI) * e.value;
}

/* R a correlation matrix, b finite; variable 0 is conditioned on (1 − r_0k² > 0). */
static int qvn_core(const double b[4], const double R[16], double tol, tpk_estimate *out)
{
    qvn_par q;
    memset(&q, 0, sizeof q);
    for (int k = 0; k < 4; k++) {
        q.b[k] = b[k];
        q.r1[k] = R[k];
        q.sd[k] = k ? sqrt((1.0 - R[k]) * (1.0 + R[k])) : 1.0;
    }
    static const int pi[3][2] = {{1, 2}, {1, 3}, {2, 3}};
    for (int p = 0; p < 3; p++) {
        int i = pi[p][0], j = pi[p][1];
        double v = (R[i * 4 + j] - R[i] * R[j]) / (q.sd[i] * q.sd[j]);
        q.pr[p] = fmax(-1.0, fmin(1.0, v));
    }
    q.tol = 0.25 * tol;
    double hi = fmin(b[0], QVN_CUT), tail = PHI_M9;
    if (b[0] <= -QVN_CUT) {
        out->value = 0.0;
        out->err = Phi(b[0]);
        return 0;
    }
    tpk_estimate e;
    /* a few starting panels: the integrand is a Gaussian bump of width ~1 */
    int np = (int)ceil((hi + QVN_CUT) / 3.0);
    int bad = gk_adapt(qvn_integrand, &q, -QVN_CUT, hi, np, 0.5 * tol, &e);
    out->value = fmax(0.0, fmin(1.0, e.value));
    out->err = e.err + Phi(hi) * q.inner_err + tail;
    return bad | q.bad;
}

int tpk_mvn_qvn(const double b[4], const double R[16], double tol, tpk_estimate *out,
                tpk_ctx *ctx)
{
    if (b == NULL || R == NULL || out == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_mvn_qvn: NULL argument");
    if (check_tol(tol, "tpk_mvn_qvn", ctx))
        return ctx ? ctx->status : TPK_EINVAL;
    for (int i = 0; i < 4; i++)
        if (R[i * 4 + i] != 1.0)
            return TPK_ERROR(ctx, TPK_EDOM, "tpk_mvn_qvn: R[%d][%d] = %g: not a correlation "
                             "matrix", i, i, R[i * 4 + i]);
    return tpk_mvn_cdf(4, b, R, tol, out, ctx);
}

/* ---- general covariance, m ≤ 4 ---------------------------------------------------------------- */

/* Recursive worker on a correlation problem of dimension m (already standardised, finite b). */
static int cdf_corr(int m, double *b, double *R, double tol, tpk_estimate *out, tpk_ctx *ctx);

static void drop_var(int m, double *b, double *R, int j)
{
    double nb[TPK_MVN_MAXDIM], nR[TPK_MVN_MAXDIM * TPK_MVN_MAXDIM];
    int p = 0;
    for (int i = 0; i < m; i++) {
        if (i == j)
            continue;
        nb[p] = b[i];
        int q = 0;
        for (int k = 0; k < m; k++)
            if (k != j)
                nR[p * (m - 1) + q++] = R[i * m + k];
        p++;
    }
    memcpy(b, nb, (size_t)(m - 1) * sizeof *b);
    memcpy(R, nR, (size_t)(m - 1) * (size_t)(m - 1) * sizeof *R);
}

static int cdf_corr(int m, double *b, double *R, double tol, tpk_estimate *out, tpk_ctx *ctx)
{
    /* perfectly correlated pairs */
    for (int i = 0; i < m; i++)
        for (int j = i + 1; j < m; j++) {
            double r = R[i * m + j];
            if (r >= 1.0 - RHO_ONE) { /* X_j = X_i: the tighter limit */
                b[i] = fmin(b[i], b[j]);
                drop_var(m, b, R, j);
                return cdf_corr(m - 1, b, R, tol, out, ctx);
            }
            if (r <= -1.0 + RHO_ONE) { /* X_j = −X_i: −b_j < X_i < b_i */
                if (b[i] <= -b[j]) {
                    out->value = 0.0;
                    out->err = 0.0;
                    return TPK_OK;
                }
                double b2[TPK_MVN_MAXDIM], R2[TPK_MVN_MAXDIM * TPK_MVN_MAXDIM];
                double lo = -b[j];
                drop_var(m, b, R, j);
                memcpy(b2, b, (size_t)(m - 1) * sizeof *b);
                memcpy(R2, R, (size_t)(m - 1) * (size_t)(m - 1) * sizeof *R);
                b2[i < j ? i : i - 1] = lo;
                tpk_estimate up, dn;
                int st = cdf_corr(m - 1, b, R, tol / 2, &up, ctx);
                if (st == TPK_OK || st == TPK_ENUMERIC) {
                    int st2 = cdf_corr(m - 1, b2, R2, tol / 2, &dn, ctx);
                    if (st2 != TPK_OK && st2 != TPK_ENUMERIC)
                        return st2;
                    st = st ? st : st2;
                    out->value = fmax(0.0, up.value - dn.value);
                    out->err = up.err + dn.err;
                }
                return st;
            }
        }
    /* Cholesky: PSD and not singular */
    double L[TPK_MVN_MAXDIM * TPK_MVN_MAXDIM] = {0};
    for (int j = 0; j < m; j++) {
        double s = R[j * m + j];
        for (int k = 0; k < j; k++)
            s -= L[j * m + k] * L[j * m + k];
        if (s < -PIVOT_TOL)
            return TPK_ERROR(ctx, TPK_EDOM, "normal probability: the %d×%d covariance is not "
                             "positive semidefinite (pivot %.3g)", m, m, s);
        if (s < PIVOT_TOL)
            return TPK_ERROR(ctx, TPK_EUNSUPPORTED, "normal probability: the %d×%d covariance is "
                             "singular (pivot %.3g)", m, m, s);
        L[j * m + j] = sqrt(s);
        for (int i = j + 1; i < m; i++) {
            double t = R[i * m + j];
            for (int k = 0; k < j; k++)
                t -= L[i * m + k] * L[j * m + k];
            L[i * m + j] = t / L[j * m + j];
        }
    }
    int bad = 0;
    switch (m) {
    case 0:
        out->value = 1.0, out->err = 0.0;
        break;
    case 1:
        out->value = Phi(b[0]), out->err = 0.0;
        break;
    case 2:
        out->value = bvn_lower(b[0], b[1], R[1]), out->err = BVN_ERR;
        break;
    case 3: {
        double r[3] = {R[1], R[2], R[5]};
        bad = tvn_any(b, r, tol, out);
        break;
    }
    default: {
        /* condition on the variable least correlated with the others: the conditional
         * trivariate then has the largest partial variances */
        int best = 0;
        double bestc = INFINITY;
        for (int i = 0; i < 4; i++) {
            double c = 0.0;
            for (int k = 0; k < 4; k++)
                if (k != i)
                    c = fmax(c, fabs(R[i * 4 + k]));
            if (c < bestc)
                bestc = c, best = i;
        }
        int ord[4] = {best, 0, 0, 0}, p = 1;
        for (int i = 0; i < 4; i++)
            if (i != best)
                ord[p++] = i;
        double bb[4], RR[16];
        for (int i = 0; i < 4; i++) {
            bb[i] = b[ord[i]];
            for (int k = 0; k < 4; k++)
                RR[i * 4 + k] = R[ord[i] * 4 + ord[k]];
        }
        bad = qvn_core(bb, RR, tol, out);
        break;
    }
    }
    if (bad)
        return TPK_ERROR(ctx, TPK_ENUMERIC, "normal probability (m = %d): tolerance %.2g not met "
                         "(error bound %.2g)", m, tol, out->err);
    return TPK_OK;
}

int tpk_mvn_cdf(int m, const double *b, const double *S, double tol, tpk_estimate *out,
                tpk_ctx *ctx)
{
    if (m < 0 || m > TPK_MVN_MAXDIM)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_mvn_cdf: dimension %d is outside 0..%d", m,
                         TPK_MVN_MAXDIM);
    if (out == NULL || (m > 0 && (b == NULL || S == NULL)))
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_mvn_cdf: NULL argument");
    if (check_tol(tol, "tpk_mvn_cdf", ctx))
        return ctx ? ctx->status : TPK_EINVAL;
    if (tol == 0.0)
        tol = TPK_MVN_DEFAULT_TOL;
    for (int i = 0; i < m; i++) {
        if (isnan(b[i]) || !(S[i * m + i] >= 0.0))
            return TPK_ERROR(ctx, TPK_EDOM, "tpk_mvn_cdf: limit %g or variance %g is NaN or "
                             "negative", b[i], S[i * m + i]);
        for (int j = 0; j < m; j++)
            if (!isfinite(S[i * m + j]))
                return TPK_ERROR(ctx, TPK_EDOM, "tpk_mvn_cdf: covariance entry (%d, %d) is %g", i,
                                 j, S[i * m + j]);
    }
    double smax = 0.0;
    for (int i = 0; i < m; i++)
        smax = fmax(smax, S[i * m + i]);
    /* settle +∞ / −∞ limits and zero variances, standardise the rest */
    int keep[TPK_MVN_MAXDIM], n = 0;
    double bb[TPK_MVN_MAXDIM], R[TPK_MVN_MAXDIM * TPK_MVN_MAXDIM], sd[TPK_MVN_MAXDIM];
    for (int i = 0; i < m; i++) {
        if (b[i] == -INFINITY) {
            out->value = 0.0, out->err = 0.0;
            return TPK_OK;
        }
        if (b[i] == INFINITY)
            continue;
        if (S[i * m + i] <= PIVOT_TOL * PIVOT_TOL * smax) { /* X_i = 0: 0 < b_i or nothing */
            if (!(b[i] > 0.0)) {
                out->value = 0.0, out->err = 0.0;
                return TPK_OK;
            }
            continue;
        }
        sd[n] = sqrt(S[i * m + i]);
        bb[n] = b[i] / sd[n];
        keep[n++] = i;
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double r = i == j ? 1.0 : S[keep[i] * m + keep[j]] / (sd[i] * sd[j]);
            if (fabs(r) > 1.0 + 1e-12)
                return TPK_ERROR(ctx, TPK_EDOM, "tpk_mvn_cdf: correlation %g of variables %d, %d "
                                 "exceeds 1: not a covariance", r, keep[i], keep[j]);
            R[i * n + j] = fmax(-1.0, fmin(1.0, r));
        }
    return cdf_corr(n, bb, R, tol, out, ctx);
}
