/* Direct kernel recursions for fixed architectures (the fast paths the NETSOR evaluator matches). */
#ifndef TPK_KERNELS_H
#define TPK_KERNELS_H

#include <stdint.h>

#include "array.h"
#include "gauss.h"
#include "ntk.h"
#include "progress.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Deep MLP NNGP (theory.md §2.1, issue convention):
 *   Σ¹(x,x′)   = σ_w² ⟨x,x′⟩/d + σ_b²
 *   Σ^{l+1}    = σ_w² E[φ(u)φ(v)] + σ_b²,  (u,v) ~ N(0, Σ^l restricted to x, x′)
 * and the result is Σ^{depth+1}: the covariance of the scalar output of a network with `depth`
 * hidden layers, i.e. neural-tangents' serial([Dense(σ_w, σ_b), φ] * depth + [Dense(σ_w, σ_b)]). */
typedef struct tpk_mlp_params {
    int depth;           /* hidden layers, ≥ 1 */
    const tpk_phi *phi;
    double sigma_w2;     /* ≥ 0 */
    double sigma_b2;     /* ≥ 0 */
} tpk_mlp_params;

/* Check the parameters; a clear message for each violation. */
TPK_API int tpk_mlp_params_check(const tpk_mlp_params *p, tpk_ctx *ctx);

/* K (N×N, preallocated) from inputs X (N×d, or any rank: each item flattened).
 * If Xt (M×d) is not NULL, also Kxt (M×N cross kernel, test × train) and kdiag (M, test diagonal).
 * err (may be NULL) gets a first-order bound on the accumulated expectation error.
 * ws may be NULL when φ has a closed form. */
TPK_API int tpk_mlp_kernel(const tpk_mlp_params *p, const tpk_array *X, const tpk_array *Xt,
                           const tpk_gauss_ws *ws, tpk_array *K, tpk_array *Kxt, tpk_array *kdiag,
                           double *err, tpk_ctx *ctx);

/* The diagonal of every layer, for kernels computed block by block (gpregress-mpi's tiles):
 * q[l·N + i] = Σ^{l+1}(x_i, x_i) for l = 0 .. depth, so q holds (depth + 1)·N values and its
 * last row is the kernel's diagonal. err (may be NULL): as tpk_mlp_kernel's. */
TPK_API int tpk_mlp_diag(const tpk_mlp_params *p, const tpk_array *X, const tpk_gauss_ws *ws,
                         double *q, double *err, tpk_ctx *ctx);

/* The block K(Xr, Xc) (Nr×Nc, row-major, preallocated) alone, from both sets' tpk_mlp_diag: the
 * cost of the block, not of the kernel of both sets. err (may be NULL): the block's share of the
 * first-order bound (a diagonal's errors carried through the cross maps). */
TPK_API int tpk_mlp_kernel_cross(const tpk_mlp_params *p, const tpk_array *Xr, const double *qr,
                                 const tpk_array *Xc, const double *qc, const tpk_gauss_ws *ws,
                                 double *K, double *err, tpk_ctx *ctx);

/* Transformer of Tensor Programs I (theory.md §2.7; the model of programs/transformer.nsr):
 * token embedding, then per layer causal single-head attention with query = key = value and 1/n
 * logits, a post-LN residual, a φ feed-forward block with a post-LN residual; LN without affine
 * part, LN(v) = (v − mean v)/sqrt(var v + eps); readout σ_v²⟨v, z_L⟩ of each token. Parameter
 * names are the program's (and gpkernel's flags --var-e ... --ln-eps). */
typedef struct tpk_transformer_params {
    int depth;           /* layers L, >= 1 */
    const tpk_phi *phi;  /* the feed-forward nonlinearity (the shipped program: relu) */
    double var_e;        /* embedding E: entries N(0, var_e/d) */
    double var_u;        /* key projections U_l: N(0, var_u/n) */
    double var_w;        /* feed-forward W1_l, W2_l: N(0, var_w/n) */
    double var_b;        /* feed-forward biases: N(0, var_b) */
    double temp;         /* softmax temperature, > 0 */
    double eps;          /* LN: added to the variance, >= 0 */
    double sigma_v2;     /* readout variance */
    int ntk_param;       /* tpk_transformer_kernels' NTK: TPK_NTK_PARAM_NTK (0), _TP, _STANDARD */
    size_t ntk_width;    /* TPK_NTK_PARAM_STANDARD: the width n */
} tpk_transformer_params;

/* Check the parameters; a clear message naming the flag for each violation. */
TPK_API int tpk_transformer_params_check(const tpk_transformer_params *p, tpk_ctx *ctx);

/* The limit kernel by the direct recursion (kernels/transformer.c) of tokens X (N × T × d):
 * all_tokens = 1: every token of every sequence, (N·T)×(N·T), index a·T + i (gpkernel
 * --all-times); 0: the last token of each sequence, N × N. *K is allocated (the caller frees it).
 * ws may be NULL when φ has a closed form. prog (may be NULL) gets the layers done and its flag
 * is read between them (TPK_ECANCELED). err (may be NULL): σ_v² times the largest per-layer
 * bound of the φ map. TPK_EDOM names the token whose LN variance is zero (eps = 0) or not
 * finite; TPK_ENUMERIC an entry that overflowed. */
TPK_API int tpk_transformer_kernel(const tpk_transformer_params *p, const tpk_array *X,
                                   int all_tokens, const tpk_gauss_ws *ws,
                                   const tpk_progress *prog, tpk_array **K, double *err,
                                   tpk_ctx *ctx);

/* The same with the Neural Tangent Kernel of the same network (Theta NULL: the NNGP alone), in
 * the parameterisation p->ntk_param (include/tpk/ntk.h, theory.md §8.7; fan-ins d for the
 * embedding, n for U, W1, W2 and the readout, 1 for the biases, which every layer has). Beside
 * each covariance the recursion carries its tangent kernel (theory.md §2.7, §8.5): the logits
 * and the LayerNorms' moments are Moments, constant in the tangent, so T^r = P T^k Pᵀ with
 * T^k = w_U Σ^z + var_u T^z, T^h = LN's scaling of T^r, T^pre = w_W Σ^h + var_w T^h + w_b,
 * T^f = w_W V_φ(Σ^pre) + var_w V_φ′(Σ^pre) ⊙ T^pre + w_b, T^z = LN's scaling of T^f + T^h,
 * Θ = w_v Σ^{z_L} + σ_v² T^{z_L}. Layouts as K. */
TPK_API int tpk_transformer_kernels(const tpk_transformer_params *p, const tpk_array *X,
                                    int all_tokens, const tpk_gauss_ws *ws,
                                    const tpk_progress *prog, tpk_array **K, tpk_array **Theta,
                                    double *err, tpk_ctx *ctx);

/* erf-GRU of Tensor Programs I (theory.md §2.3; the model of programs/gru.nsr, whose parameter
 * names these are): z̃ = U_z x + W_z h + b_z, r̃ likewise, h̃ = U_h x + W_h (h ⊙ σ(r̃)) + b_h,
 * h ← (1 − σ(z̃)) h + σ(z̃) erf(h̃), σ(x) = (1 + erf x)/2, h⁰ = 0; U entries N(0, var_U/d), W
 * N(0, var_W/n), biases N(mu, var); readout σ_v²⟨v, h^t⟩. */
typedef struct tpk_gru_params {
    double var_Uz, var_Ur, var_Uh, var_Wz, var_Wr, var_Wh; /* >= 0 */
    double var_bz, var_br, var_bh;                         /* >= 0 */
    double mu_bz, mu_br, mu_bh;
    double sigma_v2;                                       /* >= 0 */
    double tol;      /* target standard error of each E[h h'] (0: 1e-8) */
    double budget;   /* QMC work (points × steps over all paths and randomisations) before the
                        tolerance is given up (0: 2048 per step of every path, at least 1.8e8,
                        up to 7.2e8 for small kernels: kernels/gru.c); the error estimate is
                        what was reached */
    uint64_t seed;   /* of the randomised QMC (Owen scramblings) */
} tpk_gru_params;

/* Check the parameters; a clear message naming the parameter for each violation. */
TPK_API int tpk_gru_params_check(const tpk_gru_params *p, tpk_ctx *ctx);

/* The limit kernel of sequences X (N × T × d, T ≤ 63) by the direct recursion of kernels/gru.c:
 * all_times = 1: every step of every sequence, (N·T)×(N·T), index a·T + t; 0: the last step,
 * N × N. *K is allocated (the caller frees it). err (may be NULL): σ_v² times the largest
 * entry's standard error (root-sum-square of its terms'). prog (may be NULL) counts the gate
 * paths and is polled for cancellation (TPK_ECANCELED). */
TPK_API int tpk_gru_kernel(const tpk_gru_params *p, const tpk_array *X, int all_times,
                           const tpk_progress *prog, tpk_array **K, double *err, tpk_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
