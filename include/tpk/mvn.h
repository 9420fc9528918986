/* Bivariate, trivariate and quadrivariate normal probabilities P(X < b), deterministic and with
 * an error bound (theory.md §3.3: the low-dimensional orthant probabilities of gate products). */
#ifndef TPK_MVN_H
#define TPK_MVN_H

#include <stdint.h>

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

/* ---- Genz's separation-of-variables integrand (kernels/mvn_sov.c) ---------------------------
 * For P(X < b), X ~ N(0, S) = L·Y with L the m×m lower-triangular Cholesky factor of S (row-major,
 * variables in the caller's order; A. Genz, J. Comput. Graph. Stat. 1 (1992)):
 *   e_0 = Φ(b_0/L_00),  e_i = Φ((b_i − Σ_{k<i} L_ik y_k)/L_ii),  y_k = Φ⁻¹(u_k e_k),
 * and P = ∫_{[0,1]^{m−1}} Π_i e_i(u) du. L_ii = 0 means X_i is a function of the earlier
 * variables: e_i is then the indicator of its threshold. */
#define TPK_MVN_SOV_BLK 64     /* points per call at most, and the stride of u */
#define TPK_MVN_SOV_MAXDIM 64  /* largest m */

/* Σ_{p<B} Π_i e_i(u_p) over B ≤ TPK_MVN_SOV_BLK points, 1 ≤ m ≤ TPK_MVN_SOV_MAXDIM: coordinate j of
 * point p is u[j·TPK_MVN_SOV_BLK + p] ∈ [0, 1), j < m − 1. With shift (one value in [0, 1) per
 * coordinate; NULL: none) each coordinate is randomised first as 1 − |2·frac(u + shift_j) − 1| (a
 * random shift, then the baker's transform). The SIMD kernel (AVX-512, AVX2 or scalar by the
 * build; its Φ and Φ⁻¹ are within 2e-16 absolute / 1e-15 relative of libm's). m out of range: 0. */
TPK_API double tpk_mvn_sov_sum(int m, const double *L, const double *b, const double *u,
                               const double *shift, int B);
/* The plain reference of tpk_mvn_sov_sum: one point at a time, libm's erfc and AS 241. */
TPK_API double tpk_mvn_sov_sum_ref(int m, const double *L, const double *b, const double *u,
                                   const double *shift, int B);
/* The nested problems of one SOV order at once: adds Σ_{p<B} Π_{i≤k} e_i(u_p) to sums[k] for every
 * k < m (sums[m−1] is what tpk_mvn_sov_sum returns; u as there, no shift). Each prefix sum is
 * Genz's integrand of the problem of the first k + 1 variables, so one pass over the points
 * estimates all of them (kernels/gru.c: the gate products of a window that grows by one gate). */
TPK_API void tpk_mvn_sov_prefix(int m, const double *L, const double *b, const double *u, int B,
                                double *sums);
/* Its plain reference (one point at a time, libm). */
TPK_API void tpk_mvn_sov_prefix_ref(int m, const double *L, const double *b, const double *u,
                                    int B, double *sums);
/* Randomised quasi-random normals: out[i] = Φ⁻¹(1 − |2·frac(u_i + shift_i) − 1|) (shift NULL:
 * Φ⁻¹(u_i)), u_i ∈ [0, 1); the SIMD Φ⁻¹ above, clamped to Φ⁻¹(1e-300) in the tails. */
TPK_API void tpk_mvn_normals(int n, const double *u, const double *shift, double *out);

/* Owen's nested uniform scrambling of binary fractions (B. Burley, "Practical hash-based Owen
 * scrambling", JCGT 9 (2020), the Laine–Karras hash on reversed bits): out[i] is the scrambled
 * fraction whose bit-reversed 32 bits are rbits[i] — rbits[i] = tpk_mvn_reverse_bits(⌊u_i·2^32⌋)
 * — plus half its last unit, in (0, 1). Points that share their k leading bits keep k shared
 * leading bits (so a digital net stays one), and for a uniformly random seed each point is
 * uniform on (0, 1). */
TPK_API void tpk_mvn_owen_scramble(int n, const uint32_t *rbits, uint32_t seed, double *out);
/* The 32 bits of x in reverse order. */
TPK_API uint32_t tpk_mvn_reverse_bits(uint32_t x);

#ifdef __cplusplus
}
#endif
#endif
