/* Registered scalar nonlinearities φ and Gaussian expectations E[φ(u)ψ(v)] (theory.md §3). */
#ifndef TPK_GAUSS_H
#define TPK_GAUSS_H

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Properties of a nonlinearity that the theorems care about (theory.md §1.4). */
enum tpk_phi_flag {
    TPK_PHI_CONTROLLED = 1u << 0,      /* |φ(x)| ≤ exp(C|x|^(2-ε) + c): Master Theorem applies */
    TPK_PHI_POLY_BOUNDED = 1u << 1,
    TPK_PHI_LIPSCHITZ = 1u << 2,       /* quantitative rates (theory.md §4) apply */
    TPK_PHI_SMOOTH = 1u << 3,          /* analytic: Gauss–Hermite converges exponentially */
    TPK_PHI_POS_HOMOGENEOUS = 1u << 4  /* φ(cx) = c^m φ(x), c > 0 */
};

#define TPK_PHI_MAXPARAMS 4

/* A user scalar function: x ↦ φ(x; params). Must be pure (called from several threads). */
typedef double (*tpk_scalar_fn)(double x, const double *params);

typedef struct tpk_phi_registry tpk_phi_registry; /* name → function table */
typedef struct tpk_phi tpk_phi;                   /* one instantiated φ, parameters bound */

/* A registry pre-filled with the built-ins (relu, tanh, erf, ...). Not thread-safe for writes. */
TPK_API tpk_phi_registry *tpk_phi_registry_alloc(tpk_ctx *ctx);
TPK_API void tpk_phi_registry_free(tpk_phi_registry *reg);
/* Register a new function; it gets the numerical back-end. nparams ≤ TPK_PHI_MAXPARAMS,
 * defaults gives their values when a spec omits them. */
TPK_API int tpk_phi_register(tpk_phi_registry *reg, const char *name, tpk_scalar_fn fn,
                             int nparams, const double *defaults, unsigned flags, tpk_ctx *ctx);
/* Print "name  flags  closed-form?" one per line. */
TPK_API void tpk_phi_registry_list(const tpk_phi_registry *reg, void *file /* FILE* */);

/* Instantiate from a spec: "relu", "erf", "leaky_relu(0.1)", "erf(2.5)" (erf(b x)), "tanh'" (φ′).
 * Grammar: name [ '(' number {',' number} ')' ] [ "'" ]; omitted trailing parameters take their
 * defaults; a final "'" gives the derivative (tpk_phi_derivative).
 * Errors: TPK_ENOTFOUND (unknown name, with suggestions), TPK_EINVAL (syntax, too many
 * parameters, non-finite parameter). Names and defaults: tpk_phi_registry_list. */
TPK_API tpk_phi *tpk_phi_alloc(const tpk_phi_registry *reg, const char *spec, tpk_ctx *ctx);
TPK_API void tpk_phi_free(tpk_phi *phi);
TPK_API const char *tpk_phi_name(const tpk_phi *phi);     /* canonical spec, e.g. "leaky_relu(0.1)" */
TPK_API double tpk_phi_eval(const tpk_phi *phi, double x);
/* y[i] = φ(x[i]) for i < n, vectorised for the common built-ins (y may be x). */
TPK_API void tpk_phi_eval_n(const tpk_phi *phi, size_t n, const double *x, double *y);
TPK_API unsigned tpk_phi_flags(const tpk_phi *phi);
TPK_API int tpk_phi_has_closed_form(const tpk_phi *phi); /* zero-mean 2-D closed form known */

/* Derivatives (theory.md §3.5), for the backward kernels E[φ′(u)φ′(v)] of the NTK.
 * φ′ as a tpk_phi of its own (free with tpk_phi_free; it does not refer to phi or the registry):
 * every entry point that takes a φ takes it, with a closed-form V_φ′ where one is known.
 * Its name is φ's with a prime ("relu'", "erf(2.5)'"), which tpk_phi_alloc reads back: a spec
 * may end in one "'". Built-ins get their derivative formulas; at a kink φ′(x0) is the element
 * of least magnitude of the one-sided derivatives' interval (relu′(0) = 0: the Heaviside step
 * with step(0) = 0; abs′(0) = 0; leaky_relu(a)′(0) = a for 0 ≤ a ≤ 1; hardtanh′(±1) = 0). User
 * functions use the derivative given to tpk_phi_register_derivative, else Ridders-extrapolated
 * central differences of φ (tpk_phi_eval_err gives their error estimate).
 * Errors: TPK_EDOM for step, sign and arccos0 (their derivative is Dirac's δ, not a function),
 * TPK_EUNSUPPORTED for a derivative (no second derivatives), TPK_EINVAL (NULL), TPK_ENOMEM. */
TPK_API tpk_phi *tpk_phi_derivative(const tpk_phi *phi, tpk_ctx *ctx);
/* 1 when phi is a derivative (from tpk_phi_derivative or a spec ending in "'"), else 0. */
TPK_API int tpk_phi_is_derivative(const tpk_phi *phi);
/* φ(x), with *err (may be NULL) an estimate of its absolute error: 0 for a formula (built-ins,
 * closed-form derivatives, user functions, user-given derivatives: libm accuracy); for a
 * numerically differentiated φ′, Ridders' estimate (the spread of the last extrapolations) plus
 * a rounding bound that assumes φ itself is evaluated within 4 ulp. */
TPK_API double tpk_phi_eval_err(const tpk_phi *phi, double x, double *err);
/* Give a registered user function's derivative dfn(x, params) (same parameters as φ) with its
 * flags, in place of numerical differentiation. Errors: TPK_ENOTFOUND (no user function of that
 * name; built-ins have theirs), TPK_EINVAL (NULL, unknown flag bits). */
TPK_API int tpk_phi_register_derivative(tpk_phi_registry *reg, const char *name, tpk_scalar_fn dfn,
                                        unsigned flags, tpk_ctx *ctx);

/* A value with its error: an estimate (quadrature, MC standard error) or a bound. 0 = exact to rounding. */
typedef struct tpk_estimate {
    double value;
    double err;
} tpk_estimate;

/* Gauss–Hermite nodes and weights (from GSL), read-only after allocation, shareable by threads. */
typedef struct tpk_gauss_ws tpk_gauss_ws;
#define TPK_GAUSS_DEFAULT_DEGREE 64
TPK_API tpk_gauss_ws *tpk_gauss_ws_alloc(size_t degree, tpk_ctx *ctx);
TPK_API void tpk_gauss_ws_free(tpk_gauss_ws *ws);
/* The degree D the workspace was built with (0 for NULL). */
TPK_API size_t tpk_gauss_ws_degree(const tpk_gauss_ws *ws);

/* E[φ(u)φ(v)], (u,v) ~ N(0, [[q1,k],[k,q2]]). Closed form when known, else 2-D Gauss–Hermite
 * with a Cholesky (guarded for ρ → ±1, q → 0). Fails with TPK_EDOM on a non-PSD or non-finite Σ.
 * |k| may exceed √(q1q2) by rounding (relative 1e-10); ρ is then clamped to ±1. err: for closed
 * forms a rounding-level bound; for quadrature |Q_D − Q_{D/2}| (×3 for non-smooth φ) plus a
 * summation-rounding bound. Smooth f, g with |ρ| ≤ 0.9 use the Cholesky tensor rule; otherwise a
 * polar rule (angle split where u or v changes sign, radius where they cross 0), which converges
 * exponentially for φ kinked only at 0 and for any ρ (theory.md §3.3). */
TPK_API int tpk_gauss_expect2(const tpk_phi *phi, double q1, double q2, double k,
                              const tpk_gauss_ws *ws, tpk_estimate *out, tpk_ctx *ctx);
/* Numerical back-end only, with means and two different functions: E[f(u) g(v)],
 * (u,v) ~ N((m1,m2), [[q1,k],[k,q2]]). */
TPK_API int tpk_gauss_expect2_quad(const tpk_phi *f, const tpk_phi *g, double m1, double m2,
                                   double q1, double q2, double k, const tpk_gauss_ws *ws,
                                   tpk_estimate *out, tpk_ctx *ctx);
/* E[f(u)], u ~ N(m, q) (1-D Gauss–Hermite; closed form where known). */
TPK_API int tpk_gauss_expect1(const tpk_phi *f, double m, double q, const tpk_gauss_ws *ws,
                              tpk_estimate *out, tpk_ctx *ctx);

/* Whole-matrix maps (OpenMP, vectorised closed forms).
 * Symmetric: out = V_φ(S) for an n×n symmetric S (row-major, leading dimension n); computes the
 * lower triangle and mirrors it. out may alias S. err_max (may be NULL) gets the largest error. */
TPK_API int tpk_gauss_map(const tpk_phi *phi, const double *S, size_t n, double *out,
                          const tpk_gauss_ws *ws, double *err_max, tpk_ctx *ctx);
/* Cross: out[i][j] = E[φ(u)φ(v)] with Var u = qa[i], Var v = qb[j], Cov = C[i][j] (m×n, row-major).
 * out may alias C. */
TPK_API int tpk_gauss_map_cross(const tpk_phi *phi, const double *qa, size_t m, const double *qb,
                                size_t n, const double *C, double *out, const tpk_gauss_ws *ws,
                                double *err_max, tpk_ctx *ctx);
/* Fused form for kernel recursions (saves a pass over the matrix per layer):
 * out = alpha·V_φ(S) + beta entrywise; otherwise as tpk_gauss_map (err_max is scaled by |alpha|). */
TPK_API int tpk_gauss_map_affine(const tpk_phi *phi, const double *S, size_t n, double alpha,
                                 double beta, double *out, const tpk_gauss_ws *ws, double *err_max,
                                 tpk_ctx *ctx);
/* As tpk_gauss_map_affine, but only the lower triangle (with the diagonal) of out is written: for
 * recursions whose next step reads only the lower triangle (it halves the memory traffic). */
TPK_API int tpk_gauss_map_affine_lower(const tpk_phi *phi, const double *S, size_t n, double alpha,
                                       double beta, double *out, const tpk_gauss_ws *ws,
                                       double *err_max, tpk_ctx *ctx);
/* One step of a chain: M ↦ alpha·V_φ(M) + beta, V_φ taken with M's own diagonal. */
typedef struct tpk_gauss_step {
    const tpk_phi *phi;
    double alpha, beta;
} tpk_gauss_step;
#define TPK_GAUSS_CHAIN_MAX 64
/* The lower triangle (with the diagonal) of out = step[nsteps−1](… step[0](S)) for 0 ≤ nsteps ≤
 * TPK_GAUSS_CHAIN_MAX: an L-layer kernel recursion in one pass over the matrix (the diagonals
 * first, then every entry through all steps). The same values as nsteps calls of
 * tpk_gauss_map_affine_lower up to rounding; errors name the step and the entry. err_max: the
 * largest per-step bound. out may alias S. */
TPK_API int tpk_gauss_map_chain_lower(const tpk_gauss_step *step, int nsteps, const double *S,
                                      size_t n, double *out, const tpk_gauss_ws *ws,
                                      double *err_max, tpk_ctx *ctx);
/* Row segments of a symmetric map, for callers that fuse V_φ with other entrywise work (the
 * orchestrated evaluator, netsor/ewplan.c): prepared once over the variances q[0..n) (rows and
 * columns alike), then any thread maps segments (i, j0..j0+len) of a covariance row, k[0..len)
 * = S[i][j0..], into out (which may alias k). Entries on the diagonal or with a zero variance
 * take the scalar path, as in tpk_gauss_map. Non-finite results and non-PSD entries are
 * recorded (the first, lexicographically) and reported by _finish, which also gives the error
 * bound. *maxr and *errmax are the caller's per-thread accumulators (start at 0). */
typedef struct tpk_gauss_segmap tpk_gauss_segmap;
TPK_API tpk_gauss_segmap *tpk_gauss_segmap_alloc(const tpk_phi *phi, const double *q, size_t n,
                                                 const tpk_gauss_ws *ws, tpk_ctx *ctx);
TPK_API void tpk_gauss_segmap_row(tpk_gauss_segmap *sm, size_t i, size_t j0, size_t len,
                                  const double *k, double *out, double *maxr, double *errmax);
/* A band instead of a row segment: out[t] = V(S)[i0 + t][j0 + t] from k[t], t < len (the flatten
 * CNN's image pairs (a, c) over their positions, variances indexed image-major). i0 = j0 is the
 * diagonal. Zero variances as in _row. out may alias k. */
TPK_API void tpk_gauss_segmap_band(tpk_gauss_segmap *sm, size_t i0, size_t j0, size_t len,
                                   const double *k, double *out, double *maxr, double *errmax);
/* The diagonal, out[i] = V(q_i, q_i, q_i) = E φ(u)² (u ~ N(0, q_i)) for i < n, the same values
 * the segments give their diagonal entries: a recursion that carries the variances (the flatten
 * CNN's position diagonals) stays consistent with its off-diagonal entries. A failure is reported
 * naming the entry. */
TPK_API int tpk_gauss_segmap_diagonal(tpk_gauss_segmap *sm, double *out, tpk_ctx *ctx);
/* Segment arithmetic of fused entrywise kernels: y[j] += c·w[j]·x[j] (w NULL: c·x[j]), and
 * y[j] = alpha·y[j] + beta, for j < len; y must not overlap x or w. */
TPK_API void tpk_gauss_seg_axpy(size_t len, double c, const double *w, const double *x, double *y);
TPK_API void tpk_gauss_seg_affine(size_t len, double alpha, double beta, double *y);
/* Merge one thread's accumulators (thread-safe). */
TPK_API void tpk_gauss_segmap_merge(tpk_gauss_segmap *sm, double maxr, double errmax);
/* TPK_OK, or the first failure's status and message (naming the entry); *err_max (may be NULL):
 * the largest error of the entries mapped. */
TPK_API int tpk_gauss_segmap_finish(tpk_gauss_segmap *sm, double *err_max, tpk_ctx *ctx);
/* Forget the failures and statistics recorded so far (the preparation is kept). */
TPK_API void tpk_gauss_segmap_reset(tpk_gauss_segmap *sm);
TPK_API void tpk_gauss_segmap_free(tpk_gauss_segmap *sm);
/* Notes on the maps: only the lower triangle (and diagonal) of S is read. ws may be NULL when φ
 * has a closed form. On error (TPK_EDOM for a non-PSD entry, naming it) out is left partially
 * written. Non-closed-form φ use the Mehler (Hermite-coefficient) series of theory.md §3.2 per
 * entry, falling back to 2-D Gauss–Hermite where its tail bound is not small. */

#ifdef __cplusplus
}
#endif
#endif
