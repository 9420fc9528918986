/* Batchnorm across a batch of inputs (theory.md §2.5): the infinite-width kernel map of
 * φ∘BN by the Laplace-transform reduction, and the finite-width normalisation. */
#ifndef TPK_BATCHNORM_H
#define TPK_BATCHNORM_H

#include <stddef.h>

#include "error.h"
#include "gauss.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Per neuron, over a batch of B inputs: BN(g)_b = (G g)_b / √(‖G g‖²/B + ε), G = I − 11ᵀ/B, with
 * ε ≥ 0 (every function below takes it; ε = 0 is √B (G g)_b/‖G g‖). Convention for a degenerate
 * batch at ε = 0 (G g = 0: all inputs of the batch equal, or B = 1): BN(g) = 0, in the limit and
 * at finite width (docs/netsor.md, "Batchnorm"); with ε > 0 that is what the formula gives. */

/* Which φ the limit handles: φ positively homogeneous of degree 1 (identity, relu, leaky_relu,
 * abrelu, abs: the Laplace reduction) or degree 0 (step, sign: φ(BN g) = φ(G g)), with a 2-D
 * closed form. Returns 1 or 0 (the degree), or -1 (unsupported). phi NULL is the identity. */
TPK_API int tpk_bn_phi_degree(const tpk_phi *phi);

/* One batch: out[a·B + c] = E[φ(BN(y))_a φ(BN(y))_c], y ~ N(μ1, S) (S is B×B, row-major; a mean
 * common to the batch cancels). V = B ∫_0^∞ V_φ(S_s) det(I + 2sSᴳ)^(−1/2) e^(−sBε) ds,
 * Sᴳ = G S G, S_s = Sᴳ(I + 2sSᴳ)^(−1). err (may be NULL) gets the largest quadrature error
 * estimate. TPK_EINVAL for a negative or non-finite ε. */
TPK_API int tpk_bn_map(const tpk_phi *phi, const double *S, size_t B, double eps, double *out,
                       double *err, tpk_ctx *ctx);

/* Two normalised vectors (two batches, or two different G-vars): (y, y') jointly Gaussian with
 * Cov y = S11 (B1×B1), Cov(y, y') = S12 (B1×B2), Cov y' = S22 (B2×B2); out (B1×B2) gets
 * E[φ(BN(y))_a φ(BN(y'))_c], a double integral over (s, t) (Yang et al. 2019, eq. 56). */
TPK_API int tpk_bn_cross(const tpk_phi *phi, const double *S11, size_t B1, const double *S12,
                         const double *S22, size_t B2, double eps, double *out, double *err,
                         tpk_ctx *ctx);

/* All inputs, consecutive batches of `batch` (0: one batch of all N; N must be a multiple):
 * out[a·ld + c] = scale·E[φ(BN(g))_a φ(BN(g'))_c]. S11 = Cov(g, g) (N×N), S12 = Cov(g, g'),
 * S22 = Cov(g', g'); S12 = S22 = NULL means g' = g (same-batch blocks by tpk_bn_map). */
TPK_API int tpk_bn_kernel(const tpk_phi *phi, size_t N, size_t batch, double eps,
                          const double *S11, const double *S12, const double *S22, double *out,
                          size_t ld, double scale, double *err, tpk_ctx *ctx);

/* The tangent map of φ∘BN on one batch (the NTK's BatchNorm step, theory.md §8.6): out (B×B) =
 * E[M Th Mᵀ], M = ∂φ(BN(y))/∂y, y ~ N(μ1, S), for a degree-1 φ. Th is the tangent kernel of y
 * (B×B symmetric). At ε = 0 the centred S must have rank ≥ 3 (batches of ≥ 4 distinct inputs):
 * below, the integral diverges (TPK_EDOM); any ε > 0 converges. err (may be NULL) gets the
 * quadrature error estimate. */
TPK_API int tpk_bn_tangent(const tpk_phi *phi, const double *S, const double *Th, size_t B,
                           double eps, double *out, double *err, tpk_ctx *ctx);

/* Finite width: normalise each of the n columns of the N×n row-major g over each batch of rows
 * (0: all N), in place. At ε = 0, columns whose centred norm is ≤ TPK_BN_ZERO_REL·(norm of the
 * column in the batch) count as G g = 0 and become 0. */
#define TPK_BN_ZERO_REL 1e-12
TPK_API int tpk_bn_apply(double *g, size_t N, size_t n, size_t batch, double eps, tpk_ctx *ctx);
/* The factor 1/σ that scales a centred column with sum of squares ss (raw: the uncentred one) in
 * a batch of B: 1/√(ss/B + ε), or at ε = 0 √B/√ss (0 for a degenerate column, as tpk_bn_apply). */
TPK_API double tpk_bn_scale(double ss, double raw, size_t B, double eps);

#ifdef __cplusplus
}
#endif
#endif
