/* Polynomial view of Nonlin / Moment bodies for the limit evaluator (netsor/limit_poly.c).
 * A body that, for fixed scalars, is a polynomial of degree ≤ 2 in its G-vars has exact Gaussian
 * moments: an affine H-var (layernorm of a sum, attention's Σ_j a_ij k_j, residual sums, theory
 * §2.6–2.7) is itself Gaussian, E[Z^u Z^v] = lᵤᵀ C lᵥ + mᵤ mᵥ, and a quadratic Moment
 * (mean((r − m)²)) is c₀ + lᵀμ + Σ Q_gh (C_gh + μ_g μ_h). Not installed. */
#ifndef TPK_NETSOR_LIMIT_POLY_H
#define TPK_NETSOR_LIMIT_POLY_H

#include <stddef.h>

#include "tpk/netsor.h"

/* Upper bound on the body's degree in its G-vars, from its structure alone (no values): GVAR 1,
 * constants and scalars 0, + and − the max, × the sum, ÷ and calls only of degree-0 operands,
 * x^e with e ≥ 0. Returns -1 when some node leaves polynomials (a call or division of a G-var,
 * a negative power of one). Input-independent: call once per body. */
/* al: for scratch (NULL: the default); -1 also without memory (the general path is then taken). */
int tpk_nsr_poly_degree(const tpk_rpn *body, const tpk_allocator *al);

typedef struct tpk_nsr_poly_ws tpk_nsr_poly_ws;
/* Workspace for bodies of `body` (its stack depth and argument count). NULL when out of memory. */
tpk_nsr_poly_ws *tpk_nsr_poly_ws_alloc(const tpk_rpn *body, tpk_ctx *ctx);
void tpk_nsr_poly_ws_free(tpk_nsr_poly_ws *ws);

/* The body at input `input` as c0 + Σ_g lin[g] Z_g + Σ_{g,h} quad[g·nargs + h] Z_g Z_h over its
 * arguments body->args (g, h index into them). Scalars are scal[var][input]. maxdeg is 1 or 2
 * (quad may be NULL when maxdeg = 1). Returns the degree, or -1 if the structural bound exceeds
 * maxdeg or a value is not finite (a division by a zero scalar): the caller falls back to its
 * general rules. quad is written in full only when the degree is 2. */
int tpk_nsr_poly_eval(const tpk_rpn *body, double *const *scal, size_t input, int maxdeg,
                      tpk_nsr_poly_ws *ws, double *c0, double *lin, double *quad);

#endif
