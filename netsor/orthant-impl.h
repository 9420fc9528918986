/* Internal interface of the orthant back-end (netsor/limit_orthant.c): expectations of products
 * of smoothed steps σ_v(x) = P(ξ < x), ξ ~ N(0, v), of correlated Gaussians — erf-sigmoid gates
 * (v = 1/2) and steps (v = 0) — as Gaussian orthant probabilities by Genz's method with
 * randomised quasi-Monte Carlo (theory.md §2.3, §3.3), and randomised QMC normals for the
 * evaluator's other high-dimensional groups (§2.4). Not installed. */
#ifndef TPK_NETSOR_ORTHANT_IMPL_H
#define TPK_NETSOR_ORTHANT_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "tpk/netsor.h"

/* Largest orthant dimension (factors of one independent group). */
#define TPK_ORTHANT_MAXDIM 64
/* Most random shifts of a QMC estimate. */
#define TPK_ORTHANT_MAXSHIFTS 64

/* The generating vector of the embedded rank-1 lattice rule (2^10..2^20 points; Cools, Kuo &
 * Nuyens 2006, components 2..64 of F. Kuo's table): point k of the 2^b-point rule has coordinate
 * j = frac(k·z_j / 2^b). Shared by the orthant QMC and the joint sampler (limit_joint.c). */
#define TPK_ORTHANT_LATTICE_DIMS (TPK_ORTHANT_MAXDIM - 1)
extern const uint32_t tpk_nsr_lattice_z[TPK_ORTHANT_LATTICE_DIMS];

typedef struct tpk_orthant_opts {
    double abs_tol;    /* stop when the standard error ≤ max(abs_tol, rel_tol·|P|)  (0: default) */
    double rel_tol;
    int shifts;        /* randomisations of the point set (the standard error is over these; 0: 8) */
    size_t max_points; /* per shift (0: default 2^17) */
} tpk_orthant_opts;

/* Is node[0..len) a smoothed step of an affine function of one G-var:
 *   f(a·g + b) or 1 − f(a·g + b), f ∈ {erf_sigmoid, step}?
 * Then f = P(ξ < a'·g + b') with ξ ~ N(0, *v), and *leaf is the index of the G-var node. */
int tpk_nsr_orthant_factor(const tpk_rpn_node *node, int len, int *leaf, double *a, double *b,
                           double *v);

/* P(w > 0 componentwise) for w ~ N(mu, S), S m×m row-major PSD, m ≤ TPK_ORTHANT_MAXDIM.
 * m ≤ 4: the deterministic kernels/mvn.c (out->err its bound; a singular S it cannot reduce goes
 * on to the QMC). Beyond: Genz's separation of variables with Genz–Bretz variable reordering,
 * integrated by Owen-scrambled Sobol points (randomly shifted, baker-transformed Halton points
 * beyond 41 dimensions); out->err is the standard error over the randomisations (exact cases
 * m ≤ 1: err 0). The randomisations are keyed by `seed` (deterministic). */
int tpk_nsr_orthant(int m, const double *mu, const double *S, uint64_t seed,
                    const tpk_orthant_opts *o, tpk_estimate *out, tpk_ctx *ctx);

/* A memo of orthant probabilities shared by threads (OpenMP critical sections): the same
 * (m, μ, S) — after rounding to 44 mantissa bits — is computed once; its shifts are seeded by the problem's hash (and
 * `seed`), so results do not depend on the order of requests. c == NULL: no memo. */
typedef struct tpk_orthant_cache tpk_orthant_cache;
tpk_orthant_cache *tpk_nsr_orthant_cache_alloc(const tpk_allocator *al); /* NULL: default */
void tpk_nsr_orthant_cache_free(tpk_orthant_cache *c);
int tpk_nsr_orthant_cached(tpk_orthant_cache *c, int m, const double *mu, const double *S,
                           uint64_t seed, const tpk_orthant_opts *o, tpk_estimate *out,
                           tpk_ctx *ctx);

/* Randomised QMC standard normals in r dimensions (Sobol, Halton beyond 40 dimensions): a
 * sequence restarted for each random shift, x_j = Φ⁻¹(baker(u_j + Δ_{shift,j} mod 1)).
 * Deterministic in (seed, shift). */
typedef struct tpk_qmc tpk_qmc;
tpk_qmc *tpk_nsr_qmc_alloc(int r, tpk_ctx *ctx);
void tpk_nsr_qmc_free(tpk_qmc *g);
void tpk_nsr_qmc_start(tpk_qmc *g, uint64_t seed, int shift);
void tpk_nsr_qmc_next_normals(tpk_qmc *g, double *x);
/* The next B ≤ TPK_QMC_BLOCK points at once, coordinate j of point b at x[j·TPK_QMC_BLOCK + b]
 * (coordinate-major, so that what uses them runs along the points): the values of B calls of
 * tpk_nsr_qmc_next_normals up to the rounding of the vectorised Φ⁻¹, which here runs over B
 * points per coordinate (one point has only r, fewer than a vector's lanes). */
#define TPK_QMC_BLOCK 256
void tpk_nsr_qmc_next_block(tpk_qmc *g, size_t B, double *x);

#endif
