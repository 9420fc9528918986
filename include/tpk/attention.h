/* One multi-head attention layer (theory.md §5, Sakai, Karakida & Imaizumi 2025): the
 * hierarchical infinite-width limit under 1/sqrt(n) logits, the uniform-averaging limit under 1/n
 * logits with independent Q and K (§2.7), and an exact-in-law finite-width sampler for
 * convergence studies (§7.5). Programs: programs/attention.nsr, programs/attention-sqrtn.nsr. */
#ifndef TPK_ATTENTION_H
#define TPK_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

enum tpk_attn_scaling { TPK_ATTN_INV_N, TPK_ATTN_INV_SQRT_N };

typedef struct tpk_attn_params {
    int heads;                       /* H ≥ 1; the output carries the factor H^(-1/2) */
    int scaling;                     /* enum tpk_attn_scaling */
    int causal;                      /* token i sees j ≤ i (else every token of its sequence) */
    double var_q, var_k, var_v, var_o;
    double temp;                     /* logits are divided by temp > 0 */
} tpk_attn_params;

/* Conditional covariances of the limit over the tokens of nseq sequences of T tokens each
 * (token index b·T + t), given the input-token kernel Sx ((nseq·T)², symmetric PSD):
 *   C(p) = (1/H) Σ_a A^a Σ^V A^aᵀ,  Σ^V = var_v var_o Sx,  A^a = row-softmax(mask(p^a / temp))
 * per sequence (theory §5.2). Under 1/sqrt(n) the logits of all tokens are jointly Gaussian,
 * Cov(p_ij, p_kl) = var_q var_k Sx_ik Sx_jl, drawn as √(var_q var_k) L G Lᵀ with L Lᵀ = Sx
 * (eigen-decomposition, clipped at 0) and G iid N(0,1) (§5.3); under 1/n the logits are 0 and
 * C is the deterministic Ā Σ^V Āᵀ. Rows/columns kept: `sel` (m token indices; NULL: all).
 * C (R × m × m, may be NULL) gets the R draws; mean (m × m) their average E_p[C(p)], se (m × m,
 * may be NULL) its Monte Carlo standard error. Draws are reproducible from `seed` (GSL mt19937
 * seeded per draw) whatever the thread count. */
TPK_API int tpk_attn_limit_covs(const double *Sx, size_t nseq, size_t T,
                                const tpk_attn_params *prm, const size_t *sel, size_t m,
                                size_t R, uint64_t seed, double *C, double *mean, double *se,
                                tpk_ctx *ctx);

/* Exact-in-law finite-width sampler of the layer on one sequence of s tokens whose rows are
 * iid N(0, Sx) (what an embedding E x gives, theory §1.2), for M independent networks at width n.
 * Given the tokens Z (n × s), the rows of W Z are iid N(0, var·ZᵀZ/n), so each projection is
 * drawn from n × s normals instead of an n × n matrix; likewise W_O U given U. Writes, per
 * network, the empirical kernel Khat (M × s × s, may be NULL) of y = H^(-1/2) Σ_a W_O^a U^a and a
 * readout output Y (M × s, may be NULL): ⟨v, y_i⟩/√n, v ~ N(0, I_n), i.e. the output law whose
 * limit is the Gaussian mixture over C(p). */
TPK_API int tpk_attn_finite_sample(const double *Sx, size_t s, const tpk_attn_params *prm,
                                   size_t n, size_t M, uint64_t seed, double *Khat, double *Y,
                                   tpk_ctx *ctx);

/* Samples of a Gaussian mixture: Y[i] ~ N(0, C[i mod R]) (C: R × m × m), M × m, from `seed`. */
TPK_API int tpk_attn_mixture_sample(const double *C, size_t R, size_t m, size_t M, uint64_t seed,
                                    double *Y, tpk_ctx *ctx);

/* W1 between the empirical laws of two 1-D samples (sizes M, P ≥ 1): ∫|F_x − F_y| over the
 * merged sorted values (exact for empirical CDFs). */
TPK_API int tpk_attn_w1_samples(const double *x, size_t M, const double *y, size_t P, double *out,
                                tpk_ctx *ctx);

/* Rao–Blackwellised energy distance between two zero-mean 1-D Gaussian scale mixtures
 * (1/na) Σ N(0, va_i) and (1/nb) Σ N(0, vb_j) — e.g. a coordinate's law at width n (per-network
 * K̂_ii) and in the hierarchical limit (sampled C_ii) — from E|X − Y| = √(2(a + b)/π) for
 * independent N(0, a), N(0, b): 2 mean_ij − mean_{i≠i'} − mean_{j≠j'} (U-statistics; a mixture
 * of one component uses its exact √(4a/π)). No sampling noise from drawing the outputs. */
TPK_API int tpk_attn_energy_mixtures(const double *va, size_t na, const double *vb, size_t nb,
                                     double *out, tpk_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
