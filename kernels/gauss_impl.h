/* Internal definitions shared by the Gaussian-expectation sources (gauss.c, gauss_quad.c, gauss_map.c). */
#ifndef TPK_GAUSS_IMPL_H
#define TPK_GAUSS_IMPL_H

#include "tpk/gauss.h"

#include <float.h>
#include <stddef.h>

#define GAUSS_EPS DBL_EPSILON
#define GAUSS_NAME_MAX 32
#define GAUSS_CANON_MAX 160

/* Closed-form families of theory.md §3.2. Built-ins are normalised onto these at tpk_phi_alloc
 * (relu, leaky_relu, abs, arccos1 are all GK_ABRELU; step and arccos0 are GK_STEP; ...). */
enum gauss_kind {
    GK_NUMERIC = 0,  /* no closed form: Gauss–Hermite (§3.3) */
    GK_IDENTITY,     /* k */
    GK_ABRELU,       /* a·min(x,0) + b·max(x,0) */
    GK_STEP,         /* 1[x>0] */
    GK_SIGN,         /* sign x */
    GK_ARCCOS2,      /* x² 1[x>0] */
    GK_ERF,          /* erf(b x) */
    GK_ERF_SIGMOID,  /* (1 + erf x)/2 */
    GK_GELU,         /* x Φ(x) */
    GK_SIN,          /* a·sin(bx + c), or a·cos(bx + c) when cosine is set */
    GK_EXP,          /* a·exp(bx) */
    GK_EXPSQ,        /* a·exp(b x²) */
    GK_MONO,         /* a·x^m, m = 2..5 (a = 1 for the built-ins x2..x5; m·x^(m−1) for their φ′) */
    /* kinds that only derivatives take (theory.md §3.5) */
    GK_STEPMIX,      /* a·1[x<0] + b·1[x>0], c at 0: relu′, leaky_relu′, abs′, identity′ */
    GK_XEXPSQ,       /* a·x·exp(b x²): expsq′ */
    GK_GELU_D,       /* Φ(x) + x φ(x): gelu′ */
    GK_BOX           /* a·1[|x|<t] (b = t): hardtanh′ */
};

/* One registry entry (a built-in row or a user registration). */
typedef struct phi_def {
    char name[GAUSS_NAME_MAX];
    tpk_scalar_fn fn;
    int variant;        /* built-in id (gauss.c), or -1 for user functions */
    int nparams;
    double defaults[TPK_PHI_MAXPARAMS];
    const char *pnames; /* "a,b" for the listing; NULL → "p1,p2" */
    unsigned flags;
    const char *help;
} phi_def;

/* An instantiated φ. Copies its registry entry so it may outlive the registry. A derivative φ′
 * (tpk_phi_derivative, theory.md §3.5) keeps its φ's entry (name, variant) with deriv = 1; its fn
 * and p are then φ′'s: a built-in's derivative formula with its own constants, the user's dfn with
 * the user's parameters, or (ufn != NULL) Ridders' differences of the user's φ = ufn(·, p). */
struct tpk_phi {
    phi_def def;
    double p[TPK_PHI_MAXPARAMS]; /* bound parameters, as the user wrote them (defaults filled) */
    int deriv;                   /* 1: this is φ′ of the φ that def names */
    tpk_scalar_fn ufn;           /* φ differentiated numerically (user φ without dfn), or NULL */
    tpk_scalar_fn dfn;           /* user φ: φ′ from tpk_phi_register_derivative, or NULL */
    unsigned dflags;             /* its flags */
    unsigned flags;              /* instance flags (some depend on parameters) */
    char canon[GAUSS_CANON_MAX];
    /* normalised closed-form description */
    int kind;                    /* enum gauss_kind */
    double ca, cb, cc;           /* family constants: ABRELU (a,b); ERF b; SIN/EXP/EXPSQ (a,b,c) */
    int m;                       /* GK_MONO degree; GK_SIN: 1 for cosine */
    tpk_allocator al;            /* tpk_phi_alloc's: tpk_phi_free gives the struct back to it */
};

/* Gauss–Hermite rules for the standard normal: E f(Z) ≈ Σ w_i f(z_i), Σ w_i = 1. */
typedef struct gauss_rule {
    size_t n;
    double *z, *w;
} gauss_rule;

struct tpk_gauss_ws {
    size_t degree;    /* D */
    gauss_rule r2;    /* 2-D tensor rule, degree D (theory.md §3.3) */
    gauss_rule r2lo;  /* its error-estimate companion, degree D/2 */
    gauss_rule r1;    /* 1-D rule, degree 2D (1-D integrals are cheap: use more nodes) */
    gauss_rule r1lo;  /* its companion, degree D (= r2's nodes) */
    /* Polar rule for kinked φ and |ρ| → 1 (theory.md §3.3): Gauss–Legendre on [0, 1] with D,
     * D/2 and D/4 nodes (angles, 1-D pieces), and the radial rules on [0, R] with the Rayleigh
     * density r e^{−r²/2}/(2π) folded into the weights. */
    gauss_rule gl, gl2, gl4;
    gauss_rule pr, prlo;
    /* Mehler / Hermite-coefficient back-end for whole-matrix maps of smooth φ (theory.md §3.2,
     * "dual-kernel method"): coefficients c_j(q) = E[φ(√q Z) He_j(Z)]/√(j!), j < 2J, computed with
     * the rule rh of 2J nodes; hw[j*rh.n + i] = w_i He_j(z_i)/√(j!). Terms j < J are summed; j ≥ J
     * estimate the truncation tail. */
    size_t J;
    gauss_rule rh;
    double *hw;
    tpk_allocator al; /* tpk_gauss_ws_alloc's: of the struct, hw and the rules' nodes */
};

/* Relative accuracy assumed of a numerically differentiated φ′ (Ridders, phi.c) at the nodes of
 * the quadratures: its pointwise error estimates stay below ~5e-12 of max(1, |φ′|) for smooth φ
 * (its true errors ~1e-13; tests/test_phi_deriv.c); the quadratures add this fraction of Σ w|f g|
 * to their error bound. */
#define GAUSS_NUMDIFF_RTOL 1e-9
/* GAUSS_NUMDIFF_RTOL for a numerically differentiated φ′, else 0. */
double tpk__phi_eval_rtol(const tpk_phi *phi);

/* ---- gauss.c: validation and closed forms --------------------------------------------- */

/* Validate a zero-mean or shifted covariance (q1, q2 ≥ 0 finite, |k| ≤ √(q1q2)(1+rtol)); returns
 * ρ clamped to [-1,1] (0 when q1 or q2 is 0). */
int tpk__gauss_check_cov(double q1, double q2, double k, double *rho, tpk_ctx *ctx);
/* Zero-mean closed form E[φ(u)φ(v)] for validated input with q1 > 0 and q2 > 0. Returns a status
 * (EDOM when E is infinite, ENUMERIC on overflow); *err is a rounding-level bound. */
int tpk__gauss_cf2(const tpk_phi *phi, double q1, double q2, double k, double rho, double *val,
                   double *err, tpk_ctx *ctx);
/* Closed form E φ(m + √q Z), q ≥ 0, for any φ with a closed form. */
int tpk__gauss_cf1(const tpk_phi *phi, double m, double q, double *val, double *err, tpk_ctx *ctx);
/* Full zero-mean expect2 for validated input (dispatches closed form / quadrature; handles q = 0). */
int tpk__gauss_expect2_checked(const tpk_phi *phi, double q1, double q2, double k, double rho,
                               const tpk_gauss_ws *ws, double *val, double *err, tpk_ctx *ctx);

/* Error in asin(x) caused by rounding x itself (grows like √ε as |x| → 1). */
double tpk__gauss_asin_rounding(double x);
/* Relative slack on |k| ≤ √(q1q2) before a covariance is rejected as not PSD (see gauss.c). */
#define GAUSS_PSD_RTOL 1e-10
/* |ρ| ≥ 1 − GAUSS_RHO_SNAP is taken as ±1 (8 ulp of 1: the rounding of ρ itself). */
#define GAUSS_RHO_SNAP (8.0 * DBL_EPSILON)
/* Largest number of Mehler terms; the coefficient rule has 2J nodes. */
#define GAUSS_MEHLER_JMAX 128

/* ---- gauss_quad.c: Gauss–Hermite back-end --------------------------------------------- */

/* E[f(u) g(v)] for validated input (ρ already clamped). No allocation; thread-safe. */
void tpk__gauss_quad2(const tpk_phi *f, const tpk_phi *g, double m1, double m2, double q1,
                      double q2, double rho, const tpk_gauss_ws *ws, double *val, double *err);
/* E f(m + √q Z) with the 1-D rule pair. */
void tpk__gauss_quad1(const tpk_phi *f, double m, double q, const tpk_gauss_ws *ws, double *val,
                      double *err);
/* Hermite coefficients of x ↦ φ(√q x): c[t*stride] for t < ws->J; *tail = ‖c_{j≥J}‖₂ (estimate),
 * *norm = √(E φ(√q Z)²). fbuf needs ws->rh.n doubles. */
void tpk__gauss_hermite_coeffs(const tpk_phi *phi, double q, const tpk_gauss_ws *ws, double *c,
                               size_t stride, double *tail, double *norm, double *fbuf);

/* ---- gauss_map.c: test hooks ----------------------------------------------------------- */

/* The vectorised arcsine and √(1−x²) of the map kernels, applied to an array (for the ulp test). */
void tpk__gauss_asin_array(const double *x, double *y, double *w, size_t n);
/* Name of the SIMD path compiled in ("avx512", "avx2", "scalar"). */
const char *tpk__gauss_simd_isa(void);

#endif
