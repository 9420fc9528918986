/* The parameterisations of the Neural Tangent Kernel (docs/theory.md §8.7): what each parameter's
 * own gradient contributes. Shared by the NETSOR interpreter's NTK (netsor/) and the direct
 * recursions (kernels/cnn.c), so that one rule serves both. */
#ifndef TPK_NTK_H
#define TPK_NTK_H

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* TPK_NTK_PARAM_NTK: neural-tangents' parameterization='ntk' (W = σ_W ω/√fan_in, b = σ_b β);
 * TPK_NTK_PARAM_TP: Tensor Programs II's (W = ω/√fan_in, ω ~ N(0, σ_W²); b trained as is);
 * TPK_NTK_PARAM_STANDARD: neural-tangents' 'standard' (the weights' own entries trained,
 * W ~ N(0, σ_W²/fan_in)), which depends on the finite widths. */
enum { TPK_NTK_PARAM_NTK = 0, TPK_NTK_PARAM_TP = 1, TPK_NTK_PARAM_STANDARD = 2 };

/* "ntk", "tp", "standard" (the CLI's --parameterization), or "?". */
TPK_API const char *tpk_ntk_param_name(int param);
/* TPK_OK for one of the three, with the width 'standard' needs (>= 1); else TPK_EINVAL saying
 * which, `who` (the caller's name) first. */
TPK_API int tpk_ntk_param_check(const char *who, int param, double width, tpk_ctx *ctx);

/* A parameter's own term per unit of its raw term (theory.md §8.7). The raw term is the layer's
 * input kernel E[z z̄] for a weight (the mean over its taps for a convolution) and 1 for a bias;
 * var is the parameter's variance σ², fan its fan-in (1 for a bias): σ² in 'ntk', 1 in Tensor
 * Programs II's, fan in 'standard'. The backward factor σ_W² is the same in all three. */
static inline double tpk_ntk_own(int param, double var, double fan)
{
    return param == TPK_NTK_PARAM_NTK ? var : param == TPK_NTK_PARAM_STANDARD ? fan : 1.0;
}

#ifdef __cplusplus
}
#endif
#endif
