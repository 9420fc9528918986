/* Bivariate, trivariate and quadrivariate normal probabilities P(X < b), deterministic and with
 * an error bound (theory.md §3.3: the low-dimensional orthant probabilities of gate products). */
#ifndef TPK_MVN_H
#define TPK_MVN_H

#include "error.h"
#include "gauss.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest dimension served (tpk_mvn_cdf). */
#define TPK_MVN_MAXDIM 4
/* Default absolute tolerance of the quadratures of tpk_mvn_tvn / _qvn / _cdf (tol = 0). */
#define TPK_MVN_DEFAULT_TOL 1e-13

/* P(X < h, Y < k) for a standard bivariate normal with correlation rho, |rho| ≤ 1: Drezner &
 * Wesolowsky (1990) as refined by Genz (2004): 6/12/20-point Gauss–Legendre in asin(ρ) for
 * |ρ| < 0.925, the Taylor-corrected asymptotic form beyond. h, k may be ±∞. out->err is the
 * algorithm's bound (1e-15 absolute, checked in tests/test_mvn.c).
 * Errors: TPK_EINVAL (out NULL), TPK_EDOM (NaN limit, |rho| > 1 or NaN). */
TPK_API int tpk_mvn_bvn(double h, double k, double rho, tpk_estimate *out, tpk_ctx *ctx);

/* P(X1 < b1, X2 < b2, X3 < b3) for unit variances and correlations r = {r12, r13, r23}
 * (a PSD correlation matrix), by Plackett's identity integrated in the angle (Genz 2004,
 * "Numerical computation of rectangular bivariate and trivariate normal and t probabilities",
 * Stat. Comput. 14): P = Φ(b1)·Φ2(b2, b3; r23) + ∫ of bivariate densities times a univariate Φ,
 * by adaptive Gauss–Kronrod (7/15) to the absolute tolerance tol (0: TPK_MVN_DEFAULT_TOL).
 * out->err bounds the quadrature error (Σ |K15 − G7| over the panels) plus the BVN bound.
 * Errors: TPK_EINVAL (NULL, tol < 0), TPK_EDOM (NaN, |r| > 1, not PSD), TPK_ENUMERIC (the
 * tolerance was not reached within the panel budget: the value and its honest err are still
 * written). */
TPK_API int tpk_mvn_tvn(const double b[3], const double r[3], double tol, tpk_estimate *out,
                        tpk_ctx *ctx);

/* P(X_i < b_i, i < 4) for a 4×4 correlation matrix R (row-major): the 1-D integral over the
 * first variable, x ≤ b1, of φ(x) times the conditional trivariate probability (partial
 * correlations), by adaptive Gauss–Kronrod; err bounds the outer quadrature error plus the
 * inner trivariate bounds. The partial variances 1 − r_1k² must be positive.
 * Errors as tpk_mvn_tvn; TPK_EUNSUPPORTED when R is singular in the first variable. */
TPK_API int tpk_mvn_qvn(const double b[4], const double R[16], double tol, tpk_estimate *out,
                        tpk_ctx *ctx);

/* P(X < b) for X ~ N(0, S), S an m×m covariance (row-major, PSD), 0 ≤ m ≤ TPK_MVN_MAXDIM:
 * drops +∞ limits, gives 0 for a −∞ one, settles zero-variance variables (X_i = 0), merges
 * perfectly correlated pairs (X_j = ±X_i: a + pair keeps the tighter limit, a − pair is a
 * difference of two problems of one dimension less), standardises and calls the above.
 * Errors: TPK_EINVAL (m out of range, NULL, tol < 0), TPK_EDOM (NaN, negative variance, not
 * PSD), TPK_EUNSUPPORTED (singular in a way not reducible to the above: the caller falls back
 * to a sampling method), TPK_ENUMERIC as tpk_mvn_tvn. */
TPK_API int tpk_mvn_cdf(int m, const double *b, const double *S, double tol, tpk_estimate *out,
                        tpk_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
