/* Batchnorm kernels (theory.md §2.5): E[φ(BN y)_a φ(BN y')_c] for Gaussian batches by the
 * Laplace-transform reduction to 1-D (one batch) or 2-D (two batches; Yang et al. 2019, "A mean
 * field theory of batch normalization", eq. 56) integrals of 2-D closed forms, and the
 * finite-width normalisation.
 *
 * Reduction. For φ positively homogeneous of degree 1, φ(√B u/‖u‖) = √B φ(u)/‖u‖ with u = G y.
 * One batch: ‖u‖⁻² = ∫_0^∞ e^{−s‖u‖²} ds, and tilting N(0, Sᴳ) by e^{−s‖u‖²} gives
 *   V = B ∫_0^∞ V_φ(Sᴳ_s) det(I + 2sSᴳ)^{−1/2} ds,   Sᴳ_s = Q diag(λ/(1+2sλ)) Qᵀ.
 * Two vectors: ‖u‖⁻¹‖u'‖⁻¹ = π⁻¹ ∫∫ (st)^{−1/2} e^{−s‖u‖²−t‖u'‖²} ds dt; the s-tilt acts on
 * z = Q₁ᵀu (u' = K z + ε, ε independent), the t-tilt on w = Q₂ᵀu' of the s-tilted law; every
 * covariance is formed from the eigen-decompositions without cancellation.
 *
 * Quadrature (one axis, s = e^r). Integrand F(r): left tail ~ e^{κ_L r} (κ_L = 1 one batch, 1/2
 * two), right tail ~ e^{−r m/2}, m = rank of Sᴳ (= B − 1 for distinct inputs; theory §2.5 says
 * so after correcting GP4A's (B − 2); tests/test_batchnorm.c measures it). We split at the
 * maximiser r₀ of the envelope (a 1-D root of its log-derivative), cover [r_L, r₀] and [r₀, r_R]
 * — the range over which the factors (1 + 2sλ) switch on — by Gauss–Legendre panels, and the two
 * tails beyond by Gauss–Laguerre in the scaled variable x = κ|r − r_edge|, where the integrand is
 * e^{−x} times a function smooth in e^{−x}. Two rule levels run; the error estimate is their
 * difference (it bounds the coarse rule, so it overstates the fine one's error). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <gsl/gsl_integration.h>
#include <lapacke.h>

#include "tpk/batchnorm.h"
#include "tpk/alloc.h"

/* Eigenvalues of Sᴳ below RANK_TOL·max diag(S) are 0: G kills 1 exactly, and repeated inputs
 * leave only rounding there (theory §1.6: Σ may be singular). */
#define RANK_TOL 1e-12
#define PAD 4.0        /* r-margin beyond −log(2λ) where a factor (1 + 2sλ) is asymptotic */
#define PANEL 2.0      /* Legendre panel width in r: the integrand is analytic in |Im r| < π/2 */
#define NCHUNK 16      /* fixed summation chunks: results independent of the thread count */
#define MAXNODE 640

enum { LV_HI, LV_LO, NLEVEL };
static const int leg_n[NLEVEL] = {16, 10}; /* Legendre points per panel */
static const int lag_n[NLEVEL] = {32, 16}; /* Laguerre points per tail */

typedef struct tabs {
    double leg_x[NLEVEL][16], leg_w[NLEVEL][16];
    double lag_x[NLEVEL][32], lag_w[NLEVEL][32]; /* w·e^x: weights for ∫_0^∞ f(x) dx */
} tabs;

typedef struct rule {
    int n;
    double r[MAXNODE], w[MAXNODE];
} rule;

static int tabs_init(tabs *T, tpk_ctx *ctx)
{
    tpk_error_gsl_init(); /* GSL failures as return codes, never abort() (tpk/error.h) */
    for (int lv = 0; lv < NLEVEL; lv++) {
        gsl_integration_glfixed_table *g = gsl_integration_glfixed_table_alloc((size_t)leg_n[lv]);
        gsl_integration_fixed_workspace *l = gsl_integration_fixed_alloc(
            gsl_integration_fixed_laguerre, (size_t)lag_n[lv], 0.0, 1.0, 0.0, 0.0);
        if (g == NULL || l == NULL) {
            gsl_integration_glfixed_table_free(g);
            gsl_integration_fixed_free(l);
            return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory for quadrature rules");
        }
        for (int i = 0; i < leg_n[lv]; i++)
            gsl_integration_glfixed_point(-1.0, 1.0, (size_t)i, &T->leg_x[lv][i], &T->leg_w[lv][i], g);
        const double *x = gsl_integration_fixed_nodes(l), *w = gsl_integration_fixed_weights(l);
        for (int i = 0; i < lag_n[lv]; i++) {
            T->lag_x[lv][i] = x[i];
            T->lag_w[lv][i] = w[i] * exp(x[i]);
        }
        gsl_integration_glfixed_table_free(g);
        gsl_integration_fixed_free(l);
    }
    return TPK_OK;
}

/* Log-derivative of the envelope e^{κ_L r}·(Σλ/(1+2sλ))^p·Π(1+2sλ)^{−1/2}·e^{−cut·s}: decreasing
 * from κ_L to κ_L − p − m/2 (and to −∞ with cut > 0, the factor of an ε > 0). */
static double env_dlog(const double *lam, int m, double kl, double p, double cut, double r)
{
    double s = exp(r), tr = 0.0, a = 0.0, b = 0.0;
    for (int i = 0; i < m; i++) {
        double d = 1.0 + 2.0 * s * lam[i];
        tr += lam[i] / d;
        a += 2.0 * s * lam[i] * lam[i] / (d * d);
        b += s * lam[i] / d;
    }
    return kl - p * a / tr - b - cut * s;
}

static void add_panels(rule *R, const tabs *T, int lv, double a, double b)
{
    int np = (int)ceil((b - a) / PANEL);
    if (np < 1)
        np = 1;
    double h = (b - a) / np;
    for (int j = 0; j < np; j++) {
        double c = a + (j + 0.5) * h;
        for (int i = 0; i < leg_n[lv]; i++) {
            R->r[R->n] = c + 0.5 * h * T->leg_x[lv][i];
            R->w[R->n++] = 0.5 * h * T->leg_w[lv][i];
        }
    }
}

/* The r-rule for eigenvalues lam[0..m) (all > 0), left exponent kl, envelope power p, and the
 * factor e^{−cut·s} of an ε > 0 (cut = Bε; 0: none). With a cut the integrand is below e^{−60} of
 * its envelope beyond r_hi = log(60/cut): the panels stop there, and where the envelope's own
 * right tail decays slowly (or not at all: the NTK's backward terms at rank ≤ 2) they run all the
 * way instead of a Laguerre tail. */
static void make_rule(rule *R, const tabs *T, int lv, const double *lam, int m, double kl, double p,
                      double cut)
{
    double lmax = lam[0], lmin = lam[0];
    for (int i = 1; i < m; i++) {
        lmax = lam[i] > lmax ? lam[i] : lmax;
        lmin = lam[i] < lmin ? lam[i] : lmin;
    }
    double lo = -log(2.0 * lmax) - 40.0, hi = -log(2.0 * lmin) + 40.0;
    for (int it = 0; it < 200 && hi - lo > 1e-10; it++) { /* bisection: ψ is monotone */
        double mid = 0.5 * (lo + hi);
        if (env_dlog(lam, m, kl, p, cut, mid) > 0)
            lo = mid;
        else
            hi = mid;
    }
    double r0 = 0.5 * (lo + hi);
    double kr = p + 0.5 * m - kl; /* the right tail's decay: the envelope's limit slope */
    double rl = fmin(r0 - 1.0, -log(2.0 * lmax) - PAD);
    double rr = fmax(r0 + 1.0, -log(2.0 * lmin) + PAD);
    int tail = 1;
    if (cut > 0) { /* r0 ≤ log(κ_L/cut) < r_hi: the envelope's maximum is left of the cut */
        double rhi = log(60.0 / cut);
        if (rhi < rr || kr < 0.25) {
            rr = fmax(rhi, r0 + 1.0);
            tail = 0;
        }
    }
    /* keep the node count bounded for absurd spectra (rank tolerance keeps λ_max/λ_min ≤ 1e12) */
    if ((rr - rl) / PANEL * leg_n[lv] + 2 * lag_n[lv] > MAXNODE - leg_n[lv]) {
        double half = 0.5 * ((MAXNODE - 2 * lag_n[lv]) / leg_n[lv] - 2) * PANEL;
        rl = fmax(rl, r0 - half);
        rr = fmin(rr, r0 + half);
    }
    R->n = 0;
    for (int i = 0; i < lag_n[lv]; i++) { /* left tail: r = r_L − x/κ_L */
        R->r[R->n] = rl - T->lag_x[lv][i] / kl;
        R->w[R->n++] = T->lag_w[lv][i] / kl;
    }
    add_panels(R, T, lv, rl, r0);
    add_panels(R, T, lv, r0, rr);
    for (int i = 0; tail && i < lag_n[lv]; i++) { /* right tail: r = r_R + x/κ_R */
        R->r[R->n] = rr + T->lag_x[lv][i] / kr;
        R->w[R->n++] = T->lag_w[lv][i] / kr;
    }
}

int tpk_bn_phi_degree(const tpk_phi *phi)
{
    if (phi == NULL)
        return 1;
    if (!(tpk_phi_flags(phi) & TPK_PHI_POS_HOMOGENEOUS) || !tpk_phi_has_closed_form(phi))
        return -1;
    const double x[2] = {1.37, -0.83};
    int d1 = 1, d0 = 1;
    for (int i = 0; i < 2; i++) {
        double f1 = tpk_phi_eval(phi, x[i]), f2 = tpk_phi_eval(phi, 2.0 * x[i]);
        d1 &= fabs(f2 - 2.0 * f1) <= 1e-12 * (fabs(f2) + 1e-300);
        d0 &= f2 == f1;
    }
    return d1 ? 1 : d0 ? 0 : -1;
}

static int e2(const tpk_phi *phi, double q1, double q2, double k, double *v, tpk_ctx *ctx)
{
    if (phi == NULL) {
        *v = k;
        return TPK_OK;
    }
    tpk_estimate e;
    int st = tpk_gauss_expect2(phi, q1 > 0 ? q1 : 0.0, q2 > 0 ? q2 : 0.0, k, NULL, &e, ctx);
    *v = e.value;
    return st;
}

/* Center rows and columns of the r×c block at S (leading dimension ld) into out (r×c). */
static void center(const double *S, size_t ld, size_t r, size_t c, double *out)
{
    for (size_t i = 0; i < r; i++)
        for (size_t j = 0; j < c; j++)
            out[i * c + j] = S[i * ld + j];
    for (size_t i = 0; i < r; i++) {
        double m = 0.0;
        for (size_t j = 0; j < c; j++)
            m += out[i * c + j];
        m /= (double)c;
        for (size_t j = 0; j < c; j++)
            out[i * c + j] -= m;
    }
    for (size_t j = 0; j < c; j++) {
        double m = 0.0;
        for (size_t i = 0; i < r; i++)
            m += out[i * c + j];
        m /= (double)r;
        for (size_t i = 0; i < r; i++)
            out[i * c + j] -= m;
    }
}

static double max_diag(const double *S, size_t ld, size_t B)
{
    double m = 0.0;
    for (size_t i = 0; i < B; i++)
        m = fmax(m, fabs(S[i * ld + i]));
    return m;
}

/* Eigen-decompose the B×B symmetric A in place (eigenvectors in columns), keep eigenvalues
 * above tol: they go first in lam/Q's columns (compacted, descending). work: B + B² doubles (the
 * caller's: this runs once per quadrature node, style.md §5). Returns the rank or -1. */
#define EIG_WORK(B) ((B) + (B) * (B))
static int eig_keep(double *A, size_t B, double tol, double *lam, double *work)
{
    double *w = work, *V = work + B;
    if (LAPACKE_dsyev(LAPACK_ROW_MAJOR, 'V', 'U', (int)B, A, (int)B, w) != 0)
        return -1;
    memcpy(V, A, B * B * sizeof *V);
    int m = 0;
    for (size_t k = B; k-- > 0;) /* descending */
        if (w[k] > tol) {
            for (size_t i = 0; i < B; i++)
                A[i * B + (size_t)m] = V[i * B + k];
            lam[m++] = w[k];
        }
    return m;
}

/* A node s of the one-batch integral: its weight w·B·s·det(I + 2sSᴳ)^{−1/2}·e^{−cut·s} (returned;
 * 0: skip it; cut = Bε, from 1/(‖u‖² + Bε) = ∫ e^{−s(‖u‖² + Bε)} ds), and K = Sᴳ_s = Q diag(λ/(1 + 2sλ)) Qᵀ from the eigen-decomposition (B×B, both halves). */
static double tilt(const double *Q, const double *lam, int m, size_t B, double s, double w,
                   double cut, double *K)
{
    double ld2 = 0.0;
    for (int k = 0; k < m; k++)
        ld2 += log1p(2.0 * s * lam[k]);
    double f = w * (double)B * s * exp(-0.5 * ld2 - cut * s);
    if (f == 0.0)
        return 0.0;
    for (size_t a = 0; a < B; a++)
        for (size_t c = 0; c <= a; c++) {
            double x = 0.0;
            for (int k = 0; k < m; k++)
                x += Q[a * B + (size_t)k] * Q[c * B + (size_t)k] * lam[k] / (1.0 + 2.0 * s * lam[k]);
            K[a * B + c] = K[c * B + a] = x;
        }
    return f;
}

/* One batch, by rows/cols of S with leading dimension ld; out (ldo) += scale·V. */
static int map_one(const tpk_phi *phi, int deg, const tabs *T, const double *S, size_t ld,
                   size_t B, double eps, double *out, size_t ldo, double scale, double *err,
                   tpk_ctx *ctx)
{
    double *Q = tpk_malloc(ctx, B * B * sizeof *Q), *lam = tpk_malloc(ctx, B * sizeof *lam);
    double *C = tpk_malloc(ctx, B * B * sizeof *C), *acc = tpk_calloc(ctx, 2 * B * B, sizeof *acc);
    double *work = tpk_malloc(ctx, EIG_WORK(B) * sizeof *work);
    rule *R = tpk_malloc(ctx, sizeof *R);
    int st = TPK_OK;
    if (!Q || !lam || !C || !acc || !work || !R) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        goto done;
    }
    center(S, ld, B, B, Q);
    double tol = RANK_TOL * max_diag(S, ld, B);
    if (deg == 0) { /* φ(BN g) = φ(G g) */
        for (size_t a = 0; a < B && !st; a++)
            for (size_t c = 0; c <= a && !st; c++) {
                double v;
                st = e2(phi, Q[a * B + a], Q[c * B + c], Q[a * B + c], &v, ctx);
                out[a * ldo + c] += scale * v;
                if (c != a)
                    out[c * ldo + a] += scale * v;
            }
        goto done;
    }
    int m = eig_keep(Q, B, tol, lam, work);
    if (m < 0) {
        st = TPK_ERROR(ctx, TPK_ENUMERIC, "batchnorm: eigen-decomposition failed");
        goto done;
    }
    if (m == 0) /* G g = 0: BN(g) = 0 by convention */
        goto done;
    double emax = 0.0;
    for (int lv = 0; lv < NLEVEL && !st; lv++) {
        make_rule(R, T, lv, lam, m, 1.0, 1.0, (double)B * eps);
        double *A = acc + (size_t)lv * B * B;
        for (int q = 0; q < R->n && !st; q++) {
            double s = exp(R->r[q]), f = tilt(Q, lam, m, B, s, R->w[q], (double)B * eps, C);
            if (f == 0.0)
                continue;
            for (size_t a = 0; a < B && !st; a++)
                for (size_t c = 0; c <= a && !st; c++) {
                    double v;
                    st = e2(phi, C[a * B + a], C[c * B + c], C[a * B + c], &v, ctx);
                    A[a * B + c] += f * v;
                }
        }
    }
    for (size_t a = 0; a < B; a++)
        for (size_t c = 0; c <= a; c++) {
            double v = scale * acc[a * B + c];
            emax = fmax(emax, fabs(scale) * (fabs(acc[a * B + c] - acc[B * B + a * B + c]) +
                                            1e-15 * fabs(acc[a * B + c])));
            out[a * ldo + c] += v;
            if (c != a)
                out[c * ldo + a] += v;
        }
    if (err)
        *err = fmax(*err, emax);
done:
    tpk_free(ctx, Q);
    tpk_free(ctx, lam);
    tpk_free(ctx, C);
    tpk_free(ctx, acc);
    tpk_free(ctx, work);
    tpk_free(ctx, R);
    return st;
}

/* Two normalised vectors: rows I (B1) of y, J (B2) of y'; out (ldo) += scale·E[...]. */
static int cross_one(const tpk_phi *phi, int deg, const tabs *T, const double *S11, const double *S12,
                     const double *S22, size_t ld, size_t B1, size_t B2, double eps, double *out,
                     size_t ldo, double scale, double *err, tpk_ctx *ctx)
{
    size_t nb = B1 > B2 ? B1 : B2;
    double *T11 = tpk_malloc(ctx, B1 * B1 * sizeof *T11), *T12 = tpk_malloc(ctx, B1 * B2 * sizeof *T12);
    double *T22 = tpk_malloc(ctx, B2 * B2 * sizeof *T22), *lam = tpk_malloc(ctx, nb * sizeof *lam);
    double *K = tpk_malloc(ctx, B2 * B1 * sizeof *K), *Eps = tpk_malloc(ctx, B2 * B2 * sizeof *Eps);
    double *acc = tpk_calloc(ctx, (size_t)NLEVEL * NCHUNK * B1 * B2, sizeof *acc);
    double *work = tpk_malloc(ctx, EIG_WORK(B1) * sizeof *work);
    rule *R = tpk_malloc(ctx, sizeof *R);
    int st = TPK_OK;
    if (!T11 || !T12 || !T22 || !lam || !K || !Eps || !acc || !work || !R) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        goto done;
    }
    center(S11, ld, B1, B1, T11);
    center(S12, ld, B1, B2, T12);
    center(S22, ld, B2, B2, T22);
    double tol1 = RANK_TOL * max_diag(S11, ld, B1), tol2 = RANK_TOL * max_diag(S22, ld, B2);
    if (deg == 0) {
        for (size_t a = 0; a < B1 && !st; a++)
            for (size_t c = 0; c < B2 && !st; c++) {
                double v;
                st = e2(phi, T11[a * B1 + a], T22[c * B2 + c], T12[a * B2 + c], &v, ctx);
                out[a * ldo + c] += scale * v;
            }
        goto done;
    }
    int m1 = eig_keep(T11, B1, tol1, lam, work); /* T11 now holds Q1 (columns 0..m1) */
    if (m1 < 0) {
        st = TPK_ERROR(ctx, TPK_ENUMERIC, "batchnorm: eigen-decomposition failed");
        goto done;
    }
    if (m1 == 0 || max_diag(T22, B2, B2) <= tol2)
        goto done; /* one side is BN(0) = 0 */
    /* u' = K z + ε, z = Q1ᵀu ~ N(0, Λ): K = T21 Q1 Λ⁻¹ (B2×m1), Cov ε = T22 − K Λ Kᵀ */
    for (size_t c = 0; c < B2; c++)
        for (int k = 0; k < m1; k++) {
            double x = 0.0;
            for (size_t a = 0; a < B1; a++)
                x += T12[a * B2 + c] * T11[a * B1 + (size_t)k];
            K[c * B1 + (size_t)k] = x / lam[k];
        }
    for (size_t c = 0; c < B2; c++)
        for (size_t e = 0; e < B2; e++) {
            double x = T22[c * B2 + e];
            for (int k = 0; k < m1; k++)
                x -= K[c * B1 + (size_t)k] * lam[k] * K[e * B1 + (size_t)k];
            Eps[c * B2 + e] = x;
        }
    const double norm = sqrt((double)B1 * (double)B2) / M_PI;
    for (int lv = 0; lv < NLEVEL && !st; lv++) {
        make_rule(R, T, lv, lam, m1, 0.5, 0.5, (double)B1 * eps);
        int nq = R->n;
#pragma omp parallel for schedule(dynamic, 1) if (B1 * B2 * (size_t)nq > 2048)
        for (int ch = 0; ch < NCHUNK; ch++) {
            tpk_ctx my;
            tpk_ctx_init_from(&my, ctx);
            double *W = tpk_malloc(&my, (B2 * B2 + B2 + B1 * B2 + B1 + B1 * B2 + B1 + EIG_WORK(B2)) *
                                            sizeof *W);
            rule *Ri = tpk_malloc(&my, sizeof *Ri);
            int my_st = W && Ri ? TPK_OK : TPK_ENOMEM;
            double *A = acc + ((size_t)lv * NCHUNK + (size_t)ch) * B1 * B2;
            for (int q = ch; q < nq && !my_st; q += NCHUNK) {
                double s = exp(R->r[q]), ld1 = 0.0;
                double *P = W, *mu = P + B2 * B2, *Ta = mu + B2, *Taa = Ta + B1 * B2;
                double *H = Taa + B1, *dl = H + B1 * B2, *ew = dl + B1;
                for (int k = 0; k < m1; k++)
                    ld1 += log1p(2.0 * s * lam[k]);
                /* s-tilted law: Λ_s = Λ/(1+2sΛ) */
                for (size_t a = 0; a < B1; a++) {
                    double x = 0.0;
                    for (int k = 0; k < m1; k++)
                        x += T11[a * B1 + (size_t)k] * T11[a * B1 + (size_t)k] * lam[k] / (1.0 + 2.0 * s * lam[k]);
                    Taa[a] = x;
                    for (size_t c = 0; c < B2; c++) {
                        double y = 0.0;
                        for (int k = 0; k < m1; k++)
                            y += T11[a * B1 + (size_t)k] * lam[k] / (1.0 + 2.0 * s * lam[k]) * K[c * B1 + (size_t)k];
                        Ta[a * B2 + c] = y; /* Cov_s(u_a, u'_c) */
                    }
                }
                for (size_t c = 0; c < B2; c++)
                    for (size_t e = 0; e <= c; e++) {
                        double x = Eps[c * B2 + e];
                        for (int k = 0; k < m1; k++)
                            x += K[c * B1 + (size_t)k] * K[e * B1 + (size_t)k] * lam[k] / (1.0 + 2.0 * s * lam[k]);
                        P[c * B2 + e] = P[e * B2 + c] = x;
                    }
                int m2 = eig_keep(P, B2, tol2, mu, ew); /* P holds Q2 */
                if (m2 < 0) {
                    my_st = TPK_ENUMERIC;
                    break;
                }
                if (m2 == 0)
                    continue;
                /* u_a = Σ_k H_ak w_k + δ_a, w = Q2ᵀu' ~ N(0, M): H = T'_{aJ} Q2 M⁻¹ */
                for (size_t a = 0; a < B1; a++) {
                    double v = Taa[a];
                    for (int k = 0; k < m2; k++) {
                        double x = 0.0;
                        for (size_t c = 0; c < B2; c++)
                            x += Ta[a * B2 + c] * P[c * B2 + (size_t)k];
                        H[a * B2 + (size_t)k] = x / mu[k];
                        v -= x * x / mu[k];
                    }
                    dl[a] = v > 0 ? v : 0.0; /* Var δ_a */
                }
                make_rule(Ri, T, lv, mu, m2, 0.5, 0.5, (double)B2 * eps);
                for (int qi = 0; qi < Ri->n && !my_st; qi++) {
                    double t = exp(Ri->r[qi]), ld2 = 0.0;
                    for (int k = 0; k < m2; k++)
                        ld2 += log1p(2.0 * t * mu[k]);
                    /* ε > 0: (‖u‖² + B₁ε)^{−1/2}(‖u′‖² + B₂ε)^{−1/2}, the tilts' e^{−(sB₁ + tB₂)ε} */
                    double f = R->w[q] * Ri->w[qi] * norm * sqrt(s * t) *
                               exp(-0.5 * (ld1 + ld2) - eps * (s * (double)B1 + t * (double)B2));
                    if (f == 0.0)
                        continue;
                    for (size_t a = 0; a < B1 && !my_st; a++) {
                        double qa = dl[a];
                        for (int k = 0; k < m2; k++)
                            qa += H[a * B2 + (size_t)k] * H[a * B2 + (size_t)k] * mu[k] / (1.0 + 2.0 * t * mu[k]);
                        for (size_t c = 0; c < B2 && !my_st; c++) {
                            double qc = 0.0, kc = 0.0;
                            for (int k = 0; k < m2; k++) {
                                double mt = mu[k] / (1.0 + 2.0 * t * mu[k]);
                                qc += P[c * B2 + (size_t)k] * P[c * B2 + (size_t)k] * mt;
                                kc += H[a * B2 + (size_t)k] * mt * P[c * B2 + (size_t)k];
                            }
                            double v;
                            my_st = e2(phi, qa, qc, kc, &v, &my);
                            A[a * B2 + c] += f * v;
                        }
                    }
                }
            }
            tpk_free(&my, W);
            tpk_free(&my, Ri);
#pragma omp critical(tpk_bn_err)
            if (my_st && !st) {
                if (my.status) /* the recorded cause (out of memory in eig_keep: not ENUMERIC) */
                    st = TPK_ERROR(ctx, my.status, "batchnorm: %s", my.msg);
                else
                    st = TPK_ERROR(ctx, my_st, "batchnorm: cross-batch integral failed");
            }
        }
    }
    if (st)
        goto done;
    double emax = 0.0;
    for (size_t a = 0; a < B1; a++)
        for (size_t c = 0; c < B2; c++) {
            double v[NLEVEL] = {0.0, 0.0};
            for (int lv = 0; lv < NLEVEL; lv++)
                for (int ch = 0; ch < NCHUNK; ch++)
                    v[lv] += acc[((size_t)lv * NCHUNK + (size_t)ch) * B1 * B2 + a * B2 + c];
            out[a * ldo + c] += scale * v[LV_HI];
            emax = fmax(emax, fabs(scale) * (fabs(v[LV_HI] - v[LV_LO]) + 1e-15 * fabs(v[LV_HI])));
        }
    if (err)
        *err = fmax(*err, emax);
done:
    tpk_free(ctx, T11);
    tpk_free(ctx, T12);
    tpk_free(ctx, T22);
    tpk_free(ctx, lam);
    tpk_free(ctx, K);
    tpk_free(ctx, Eps);
    tpk_free(ctx, acc);
    tpk_free(ctx, work);
    tpk_free(ctx, R);
    return st;
}

static int check_phi(const tpk_phi *phi, int *deg, tpk_ctx *ctx)
{
    *deg = tpk_bn_phi_degree(phi);
    if (*deg < 0)
        return TPK_ERROR(ctx, TPK_EINVAL,
                         "batchnorm limit: %s(bn(g)) needs phi positively homogeneous of degree 1 "
                         "(identity, relu, leaky_relu, abrelu, abs) or 0 (step, sign) with a closed "
                         "form (theory.md §2.5)", tpk_phi_name(phi));
    return TPK_OK;
}

static int check_eps(const char *who, double eps, tpk_ctx *ctx)
{
    return isfinite(eps) && eps >= 0 ? TPK_OK
                                     : TPK_ERROR(ctx, TPK_EINVAL, "%s: epsilon must be finite and "
                                                 ">= 0 (got %g)", who, eps);
}

static int check_finite(const double *S, size_t ld, size_t r, size_t c, tpk_ctx *ctx)
{
    for (size_t i = 0; i < r; i++)
        for (size_t j = 0; j < c; j++)
            if (!isfinite(S[i * ld + j]))
                return TPK_ERROR(ctx, TPK_EDOM, "batchnorm: covariance entry (%zu, %zu) is not finite", i, j);
    return TPK_OK;
}

int tpk_bn_map(const tpk_phi *phi, const double *S, size_t B, double eps, double *out,
               double *err, tpk_ctx *ctx)
{
    int deg, st;
    tabs T;
    if (S == NULL || out == NULL || B == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_bn_map: S, out and B >= 1 are required");
    if (err)
        *err = 0.0;
    if ((st = check_phi(phi, &deg, ctx)) || (st = check_eps("tpk_bn_map", eps, ctx)) ||
        (st = check_finite(S, B, B, B, ctx)) || (st = tabs_init(&T, ctx)))
        return st;
    memset(out, 0, B * B * sizeof *out);
    return map_one(phi, deg, &T, S, B, B, eps, out, B, 1.0, err, ctx);
}

int tpk_bn_cross(const tpk_phi *phi, const double *S11, size_t B1, const double *S12,
                 const double *S22, size_t B2, double eps, double *out, double *err, tpk_ctx *ctx)
{
    int deg, st;
    tabs T;
    if (!S11 || !S12 || !S22 || !out || B1 == 0 || B2 == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_bn_cross: all matrices and B1, B2 >= 1 are required");
    if (err)
        *err = 0.0;
    if ((st = check_phi(phi, &deg, ctx)) || (st = check_eps("tpk_bn_cross", eps, ctx)) ||
        (st = check_finite(S11, B1, B1, B1, ctx)) || (st = check_finite(S12, B2, B1, B2, ctx)) ||
        (st = check_finite(S22, B2, B2, B2, ctx)) || (st = tabs_init(&T, ctx)))
        return st;
    /* the block routine takes one leading dimension: pack [S11 S12; · S22] */
    size_t n = B1 + B2;
    double *P = tpk_malloc(ctx, n * n * sizeof *P);
    if (P == NULL)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    for (size_t i = 0; i < B1; i++) {
        memcpy(P + i * n, S11 + i * B1, B1 * sizeof *P);
        memcpy(P + i * n + B1, S12 + i * B2, B2 * sizeof *P);
    }
    for (size_t i = 0; i < B2; i++)
        memcpy(P + (B1 + i) * n + B1, S22 + i * B2, B2 * sizeof *P);
    memset(out, 0, B1 * B2 * sizeof *out);
    st = cross_one(phi, deg, &T, P, P + B1, P + B1 * n + B1, n, B1, B2, eps, out, B2, 1.0, err,
                   ctx);
    tpk_free(ctx, P);
    return st;
}

int tpk_bn_kernel(const tpk_phi *phi, size_t N, size_t batch, double eps, const double *S11,
                  const double *S12, const double *S22, double *out, size_t ld, double scale,
                  double *err, tpk_ctx *ctx)
{
    int deg, st;
    tabs T;
    if (S11 == NULL || out == NULL || N == 0 || ld < N || (S12 == NULL) != (S22 == NULL))
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_bn_kernel: bad arguments");
    if (err)
        *err = 0.0;
    size_t B = batch ? batch : N;
    if (N % B != 0)
        return TPK_ERROR(ctx, TPK_EINVAL,
                         "batchnorm: %zu inputs do not split into batches of %zu (theory.md §2.5 "
                         "normalises over whole batches)", N, B);
    if ((st = check_phi(phi, &deg, ctx)) || (st = check_eps("tpk_bn_kernel", eps, ctx)) ||
        (st = check_finite(S11, N, N, N, ctx)) ||
        (S12 && ((st = check_finite(S12, N, N, N, ctx)) || (st = check_finite(S22, N, N, N, ctx)))) ||
        (st = tabs_init(&T, ctx)))
        return st;
    for (size_t a = 0; a < N; a++)
        memset(out + a * ld, 0, N * sizeof *out);
    size_t nb = N / B;
    for (size_t i = 0; i < nb && !st; i++)
        for (size_t j = 0; j < nb && !st; j++) {
            size_t oi = i * B, oj = j * B;
            double *o = out + oi * ld + oj;
            if (S12 == NULL && i == j)
                st = map_one(phi, deg, &T, S11 + oi * N + oi, N, B, eps, o, ld, scale, err, ctx);
            else if (S12 == NULL && j < i)
                continue; /* mirrored below */
            else {
                const double *c22 = S12 ? S22 : S11, *c12 = S12 ? S12 : S11;
                /* rows oi of g, columns oj of g': pack the three blocks with one stride */
                size_t n2 = 2 * B;
                double *P = tpk_malloc(ctx, n2 * n2 * sizeof *P);
                if (P == NULL)
                    return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
                for (size_t r = 0; r < B; r++) {
                    memcpy(P + r * n2, S11 + (oi + r) * N + oi, B * sizeof *P);
                    memcpy(P + r * n2 + B, c12 + (oi + r) * N + oj, B * sizeof *P);
                    memcpy(P + (B + r) * n2 + B, c22 + (oj + r) * N + oj, B * sizeof *P);
                }
                st = cross_one(phi, deg, &T, P, P + B, P + B * n2 + B, n2, B, B, eps, o, ld, scale,
                               err, ctx);
                tpk_free(ctx, P);
            }
        }
    if (S12 == NULL) /* g' = g: the kernel is symmetric */
        for (size_t a = 0; a < N; a++)
            for (size_t c = a + 1; c < N; c++)
                if (a / B != c / B)
                    out[c * ld + a] = out[a * ld + c];
    return st;
}

/* The tangent map of φ∘BN on one batch (theory.md §8.6): out = E[M Θ Mᵀ], M = ∂φ(BN y)/∂y, for
 * φ = p·relu(x) + m·relu(−x) (p = φ(1), m = φ(−1): every degree-1 φ of tpk_bn_phi_degree).
 * With u = G y, ρ = ‖u‖² + Bε and P = uuᵀ/ρ, M = Φ′ √(B/ρ)(G − P), Φ′ = diag φ′(u), so
 *   M Θ Mᵀ = B Φ′[Θᴳ/ρ − (uuᵀΘᴳ + Θᴳuuᵀ)/ρ² + uuᵀ(uᵀΘᴳu)/ρ³]Φ′,   Θᴳ = GΘG,
 * and 1/ρ^k = ∫_0^∞ s^{k−1}/(k−1)! e^{−sBε} e^{−s‖u‖²} ds turns each term into an expectation
 * over the tilted law N(0, Sᴳ_s) times det(I + 2sSᴳ)^{−1/2}. Stein's lemma reduces those to pairs:
 *   E[φ′_a φ′_b],  E[φ_a φ′_b u_c] = K_ca E[φ′_aφ′_b] + K_cb (p+m) E[φ_a δ(u_b)],
 *   E[φ_a φ_b uᵀΘu] = tr(ΘK) E[φ_aφ_b] + Σ_{k,l∈{a,b}} (KΘK)_kl E[∂_k∂_l(φ_aφ_b)],
 * each in closed form (φ_a u_a-homogeneity: u_a φ′_a = φ_a; φ″ = (p+m)δ). At large s the three
 * terms are O(1) against det ~ s^{−m/2}: at ε = 0 the integral converges iff the rank m of Sᴳ is
 * ≥ 3; any ε > 0 makes it converge (the factor e^{−sBε}). */
static void tangent_node(double p, double mm, const double *K, const double *TK, const double *KTK,
                         double trTK, const double *TG, size_t B, double s, double f, double *A)
{
    const double pm = p + mm, q2 = p * p + mm * mm;
    for (size_t a = 0; a < B; a++) {
        double kaa = K[a * B + a];
        for (size_t b = 0; b <= a; b++) {
            double s1, s2, s3;
            if (a == b) {
                s1 = TG[a * B + a] * q2 / 2;
                s2 = TK[a * B + a] * q2;
                s3 = trTK * q2 * kaa / 2 + KTK[a * B + a] * q2;
            } else {
                double kbb = K[b * B + b], sab = sqrt(kaa * kbb);
                double rho = sab > 0 ? fmax(-1.0, fmin(1.0, K[a * B + b] / sab)) : 0.0;
                double as = asin(rho) / (2 * M_PI), c = sqrt(fmax(0.0, 1.0 - rho * rho));
                /* orthant probabilities and E[relu relu] of the normalised pair */
                double pp = 0.25 + as, pq = 0.25 - as;
                double epp = (p * p + mm * mm) * pp - 2 * p * mm * pq;
                double r1 = (c + (M_PI - acos(rho)) * rho) / (2 * M_PI);
                double r2 = (c + (M_PI - acos(-rho)) * -rho) / (2 * M_PI);
                double vab = sab * (q2 * r1 + 2 * p * mm * r2);
                /* E[φ_a δ(u_b)] = (p+m) √(K_aa(1−ρ²)) / (2π √K_bb), and a ↔ b */
                double dab = kbb > 0 ? pm * sqrt(kaa) * c / (2 * M_PI * sqrt(kbb)) : 0.0;
                double dba = kaa > 0 ? pm * sqrt(kbb) * c / (2 * M_PI * sqrt(kaa)) : 0.0;
                s1 = TG[a * B + b] * epp;
                s2 = (TK[b * B + a] + TK[a * B + b]) * epp + pm * (TK[b * B + b] * dab +
                                                                  TK[a * B + a] * dba);
                s3 = trTK * vab + 2 * KTK[a * B + b] * epp +
                     pm * (KTK[a * B + a] * dba + KTK[b * B + b] * dab);
            }
            A[a * B + b] += f * (s1 - s * s2 + 0.5 * s * s * s3);
        }
    }
}

int tpk_bn_tangent(const tpk_phi *phi, const double *S, const double *Th, size_t B, double eps,
                   double *out, double *err, tpk_ctx *ctx)
{
    int deg, st;
    tabs T;
    if (S == NULL || Th == NULL || out == NULL || B == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_bn_tangent: S, Th, out and B >= 1 are required");
    if (err)
        *err = 0.0;
    if ((st = check_phi(phi, &deg, ctx)) || (st = check_eps("tpk_bn_tangent", eps, ctx)) ||
        (st = check_finite(S, B, B, B, ctx)) || (st = check_finite(Th, B, B, B, ctx)))
        return st;
    if (deg != 1)
        return TPK_ERROR(ctx, TPK_EDOM, "batchnorm NTK: %s(bn(g)) has no derivative that is a "
                         "function (degree-0 phi); the NTK needs phi of degree 1 (theory.md §8.6)",
                         tpk_phi_name(phi));
    if ((st = tabs_init(&T, ctx)))
        return st;
    const double p = phi ? tpk_phi_eval(phi, 1.0) : 1.0, mm = phi ? tpk_phi_eval(phi, -1.0) : -1.0;
    double *Q = tpk_malloc(ctx, B * B * sizeof *Q), *lam = tpk_malloc(ctx, B * sizeof *lam);
    double *W = tpk_malloc(ctx, 5 * B * B * sizeof *W), *acc = tpk_calloc(ctx, 2 * B * B, sizeof *acc);
    double *work = tpk_malloc(ctx, EIG_WORK(B) * sizeof *work);
    rule *R = tpk_malloc(ctx, sizeof *R);
    if (!Q || !lam || !W || !acc || !work || !R) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        goto done;
    }
    double *K = W, *TG = W + B * B, *TK = W + 2 * B * B, *KTK = W + 3 * B * B, *X = W + 4 * B * B;
    center(S, B, B, B, Q);
    center(Th, B, B, B, TG);
    int m = eig_keep(Q, B, RANK_TOL * max_diag(S, B, B), lam, work);
    if (m < 0) {
        st = TPK_ERROR(ctx, TPK_ENUMERIC, "batchnorm: eigen-decomposition failed");
        goto done;
    }
    if (m == 0) { /* G y = 0: BN(y) = 0 for every y near it, M = 0 */
        memset(out, 0, B * B * sizeof *out);
        goto done;
    }
    if (m < 3 && eps == 0) {
        st = TPK_ERROR(ctx, TPK_EDOM,
                       "batchnorm NTK: the centred batch covariance has rank %d < 3; without an "
                       "epsilon the backward integrals diverge there (theory.md §8.6): use batches "
                       "of at least 4 distinct inputs", m);
        goto done;
    }
    for (int lv = 0; lv < NLEVEL; lv++) {
        make_rule(R, &T, lv, lam, m, 1.0, 0.0, (double)B * eps);
        double *A = acc + (size_t)lv * B * B;
        for (int q = 0; q < R->n; q++) {
            double s = exp(R->r[q]), f = tilt(Q, lam, m, B, s, R->w[q], (double)B * eps, K);
            if (f == 0.0)
                continue;
            double tr = 0.0;
            for (size_t a = 0; a < B; a++) /* TK = Θᴳ K */
                for (size_t c = 0; c < B; c++) {
                    double x = 0.0;
                    for (size_t k = 0; k < B; k++)
                        x += TG[a * B + k] * K[k * B + c];
                    TK[a * B + c] = x;
                }
            for (size_t a = 0; a < B; a++) {
                tr += TK[a * B + a];
                for (size_t c = 0; c < B; c++) { /* X = K Θᴳ K, lower half mirrored */
                    double x = 0.0;
                    for (size_t k = 0; k < B; k++)
                        x += K[a * B + k] * TK[k * B + c];
                    X[a * B + c] = x;
                }
            }
            for (size_t a = 0; a < B; a++)
                for (size_t c = 0; c < B; c++)
                    KTK[a * B + c] = 0.5 * (X[a * B + c] + X[c * B + a]);
            tangent_node(p, mm, K, TK, KTK, tr, TG, B, s, f, A);
        }
    }
    double emax = 0.0;
    for (size_t a = 0; a < B; a++)
        for (size_t c = 0; c <= a; c++) {
            double v = acc[a * B + c];
            emax = fmax(emax, fabs(v - acc[B * B + a * B + c]) + 1e-15 * fabs(v));
            out[a * B + c] = out[c * B + a] = v;
        }
    if (err)
        *err = emax;
done:
    tpk_free(ctx, Q);
    tpk_free(ctx, lam);
    tpk_free(ctx, W);
    tpk_free(ctx, acc);
    tpk_free(ctx, work);
    tpk_free(ctx, R);
    return st;
}

double tpk_bn_scale(double ss, double raw, size_t B, double eps)
{
    if (eps > 0)
        return 1.0 / sqrt(ss / (double)B + eps);
    double nrm = sqrt(ss);
    return nrm > TPK_BN_ZERO_REL * sqrt(raw) && nrm > 0 ? sqrt((double)B) / nrm : 0.0;
}

int tpk_bn_apply(double *g, size_t N, size_t n, size_t batch, double eps, tpk_ctx *ctx)
{
    size_t B = batch ? batch : N;
    if (g == NULL || N == 0 || N % B != 0)
        return TPK_ERROR(ctx, TPK_EINVAL,
                         "batchnorm: %zu inputs do not split into batches of %zu", N, B);
    int st = check_eps("tpk_bn_apply", eps, ctx);
    if (st)
        return st;
#pragma omp parallel for schedule(static) if (N * n >= 32768)
    for (size_t j = 0; j < n; j++)
        for (size_t b0 = 0; b0 < N; b0 += B) {
            double m = 0.0, ss = 0.0, raw = 0.0;
            for (size_t b = b0; b < b0 + B; b++)
                m += g[b * n + j];
            m /= (double)B;
            for (size_t b = b0; b < b0 + B; b++) {
                double x = g[b * n + j];
                ss += (x - m) * (x - m);
                raw += x * x;
            }
            double f = tpk_bn_scale(ss, raw, B, eps);
            for (size_t b = b0; b < b0 + B; b++)
                g[b * n + j] = f * (g[b * n + j] - m);
        }
    return TPK_OK;
}
