/* Orthant back-end of the limit evaluator: E[Π σ_v(a_i·g_i + b_i)] for erf-sigmoid gates and
 * steps of correlated Gaussians as Gaussian orthant probabilities by Genz's method
 * (theory.md §2.3: σ(x) = P(ξ < x), ξ ~ N(0, 1/2)), integrated by randomised QMC with a
 * standard error over random shifts; and randomised QMC normals for other groups (§2.4).
 *
 * Genz's separation of variables (A. Genz, "Numerical computation of multivariate normal
 * probabilities", J. Comput. Graph. Stat. 1 (1992); Genz & Bretz, "Computation of Multivariate
 * Normal and t Probabilities", Springer 2009, §4.1): with X ~ N(0, S) = L·Y, L lower-triangular,
 * P(X < b) = ∫_{[0,1]^{m−1}} e_1 Π_{i≥2} e_i(u) du with
 *   e_i = Φ((b_i − Σ_{k<i} L_ik y_k) / L_ii),  y_k = Φ⁻¹(u_k e_k).
 * Variables are reordered while L is built so that the most constraining comes first (the
 * Genz–Bretz priority rule), which lowers the integrand's effective dimension. The integral
 * is taken with Sobol points (GSL, with the point 0 that GSL skips put back, so that the first
 * 2^k points are a digital net) under R independent Owen scramblings (tpk_mvn_owen_scramble);
 * beyond 40 dimensions with Halton points under R uniform shifts modulo 1 and the baker's (tent)
 * transform. The estimate is the mean over the R randomisations and the error estimate their
 * standard error; points are doubled until it meets the tolerance. The integrand is evaluated
 * over blocks of points by the SIMD kernel tpk_mvn_sov_sum (kernels/mvn_sov.c). */
#include <float.h>
#include <math.h>
#include <string.h>

#include <gsl/gsl_qrng.h>
#include <stdlib.h>

#include "orthant-impl.h"
#include "tpk/alloc.h"
#include "tpk/mvn.h"
#include "tpk/rng.h"

#define DEF_ABS_TOL 5e-7   /* default target standard error, absolute ... */
#define DEF_REL_TOL 2e-6   /* ... or relative: the GRU issue asks 1e-5 of the kernel, and */
                           /* a kernel entry sums up to T² such terms through T steps       */
#define DEF_SHIFTS 8       /* R shifts: the standard error has R − 1 degrees of freedom     */
#define DEF_MAXPTS 32768   /* points per shift before giving up on the tolerance           */
#define FIRST_PTS 64       /* points per shift of the first pass                            */
/* Absolute tolerance of the deterministic back ends (m ≤ 4): far below any QMC error here, and
 * a 4-D probability still costs ~0.2 ms at it (tests/test_mvn.c test_speed). */
#define MVN_TOL 1e-13
/* A conditional variance below this fraction of the largest variance is zero: the variable is
 * a linear function of the earlier ones and its factor a 0/1 indicator given them. */
#define DEGEN_TOL 1e-12

/* Largest dimension of GSL's Sobol generator; Halton points beyond. */
#define SOBOL_MAXDIM 40

/* Stream of the random shifts and scramblings (a tag of its own inside the Monte Carlo tag). */
#define SHIFT_STREAM TPK_RNG_STREAM(TPK_RNG_MC, 0x4F525448u) /* "ORTH" */

static double Phi(double x) { return 0.5 * erfc(-x * M_SQRT1_2); }

/* A QMC point set of dimension r: Sobol (GSL, r ≤ 40) or Halton beyond. */
static gsl_qrng *qrng_alloc(int r)
{
    tpk_error_gsl_init(); /* GSL failures as return codes, never abort() (tpk/error.h) */
    if (r < 1)
        r = 1;
    return gsl_qrng_alloc(r <= SOBOL_MAXDIM ? gsl_qrng_sobol : gsl_qrng_halton, (unsigned)r);
}

/* ---- factor recognition ------------------------------------------------------------------ */

/* Affine analysis of node[s..e) in one G-var: value = a·g + b. Returns 0 if not affine in one
 * G-var (or constant). */
static int affine_one(const tpk_rpn_node *node, int s, int e, int *leaf, double *a, double *b)
{
    struct { int kind; double a, b; } st[64];
    int sp = 0, g = -1;
    for (int i = s; i < e; i++) {
        const tpk_rpn_node *nd = &node[i];
        if (sp > 60)
            return 0;
        switch (nd->op) {
        case TPK_RPN_CONST:
            st[sp].kind = 0, st[sp].a = 0.0, st[sp].b = nd->value, sp++;
            break;
        case TPK_RPN_GVAR:
            if (g >= 0 && node[g].var != nd->var)
                return 0;
            if (g < 0)
                g = i;
            st[sp].kind = 1, st[sp].a = 1.0, st[sp].b = 0.0, sp++;
            break;
        case TPK_RPN_NEG:
            if (sp < 1)
                return 0;
            st[sp - 1].a = -st[sp - 1].a, st[sp - 1].b = -st[sp - 1].b;
            break;
        case TPK_RPN_ADD:
        case TPK_RPN_SUB: {
            if (sp < 2)
                return 0;
            double sg = nd->op == TPK_RPN_ADD ? 1.0 : -1.0;
            st[sp - 2].a += sg * st[sp - 1].a;
            st[sp - 2].b += sg * st[sp - 1].b;
            st[sp - 2].kind |= st[sp - 1].kind;
            sp--;
            break;
        }
        case TPK_RPN_MUL: {
            if (sp < 2 || (st[sp - 2].kind && st[sp - 1].kind))
                return 0;
            double c = st[sp - 2].kind ? st[sp - 1].b : st[sp - 2].b;
            int k = st[sp - 2].kind ? sp - 2 : sp - 1;
            st[sp - 2].kind = st[k].kind;
            st[sp - 2].a = c * st[k].a;
            st[sp - 2].b = c * st[k].b;
            sp--;
            break;
        }
        case TPK_RPN_DIV:
            if (sp < 2 || st[sp - 1].kind || st[sp - 1].b == 0.0)
                return 0;
            st[sp - 2].a /= st[sp - 1].b;
            st[sp - 2].b /= st[sp - 1].b;
            sp--;
            break;
        default: /* scalars, calls, powers: not affine here */
            return 0;
        }
    }
    if (sp != 1 || g < 0 || !st[0].kind)
        return 0;
    *leaf = g - s;
    *a = st[0].a;
    *b = st[0].b;
    return 1;
}

static int smoothed_step(const tpk_phi *fn, double *v)
{
    const char *name = tpk_phi_name(fn);
    if (strcmp(name, "erf_sigmoid") == 0) { /* (1 + erf x)/2 = P(ξ < x), ξ ~ N(0, 1/2) */
        *v = 0.5;
        return 1;
    }
    if (strcmp(name, "step") == 0) {         /* 1[x > 0] = P(0 < x) */
        *v = 0.0;
        return 1;
    }
    return 0;
}

int tpk_nsr_orthant_factor(const tpk_rpn_node *node, int len, int *leaf, double *a, double *b,
                           double *v)
{
    /* f(arg):      arg..., CALL f
     * 1 − f(arg):  CONST 1, arg..., CALL f, SUB   (= f(−arg) for these symmetric f) */
    int s = 0, e = len - 1, flip = 0;
    if (len >= 4 && node[0].op == TPK_RPN_CONST && node[0].value == 1.0 &&
        node[len - 1].op == TPK_RPN_SUB) {
        s = 1;
        e = len - 2;
        flip = 1;
    }
    if (e < 1 || node[e].op != TPK_RPN_CALL || !smoothed_step(node[e].fn, v))
        return 0;
    if (!affine_one(node, s, e, leaf, a, b))
        return 0;
    *leaf += s;
    if (flip) {
        *a = -*a;
        *b = -*b;
    }
    return 1;
}

/* ---- Genz's separation of variables ------------------------------------------------------ */

typedef struct sov {
    int m;
    double L[TPK_ORTHANT_MAXDIM * TPK_ORTHANT_MAXDIM]; /* row-major, lower */
    double b[TPK_ORTHANT_MAXDIM];
    double e0;                                        /* e_1, the same at every point */
} sov;

/* Reorder and factor S (Genz–Bretz priority: at step i take the remaining variable with the
 * smallest conditional probability given the expected values of the earlier ones). */
static void sov_setup(sov *z, int m, const double *mu, const double *S)
{
    double A[TPK_ORTHANT_MAXDIM * TPK_ORTHANT_MAXDIM], yexp[TPK_ORTHANT_MAXDIM];
    double *L = z->L, *b = z->b, dmax = 0.0;
    z->m = m;
    z->e0 = 0.0;
    if (m < 1 || m > TPK_ORTHANT_MAXDIM) /* callers check; this keeps the copies in bounds */
        return;
    memcpy(A, S, (size_t)m * (size_t)m * sizeof *A);
    memcpy(b, mu, (size_t)m * sizeof *b);
    memset(L, 0, (size_t)m * (size_t)m * sizeof *L);
    for (int i = 0; i < m; i++)
        dmax = fmax(dmax, A[i * m + i]);
    double tiny = DEGEN_TOL * (dmax > 0 ? dmax : 1.0);
    for (int i = 0; i < m; i++) {
        int best = i;
        double pbest = 2.0;
        for (int j = i; j < m; j++) {
            double s2 = A[j * m + j], num = b[j];
            for (int k = 0; k < i; k++) {
                s2 -= L[j * m + k] * L[j * m + k];
                num -= L[j * m + k] * yexp[k];
            }
            double p = s2 > tiny ? Phi(num / sqrt(s2)) : (num > 0 ? 1.0 : 0.0);
            if (p < pbest) {
                pbest = p;
                best = j;
            }
        }
        if (best != i) {
            for (int k = 0; k < m; k++) { /* swap rows, then columns */
                double t = A[i * m + k];
                A[i * m + k] = A[best * m + k];
                A[best * m + k] = t;
            }
            for (int k = 0; k < m; k++) {
                double t = A[k * m + i];
                A[k * m + i] = A[k * m + best];
                A[k * m + best] = t;
            }
            for (int k = 0; k < i; k++) {
                double t = L[i * m + k];
                L[i * m + k] = L[best * m + k];
                L[best * m + k] = t;
            }
            double t = b[i];
            b[i] = b[best];
            b[best] = t;
        }
        double s2 = A[i * m + i], num = b[i];
        for (int k = 0; k < i; k++) {
            s2 -= L[i * m + k] * L[i * m + k];
            num -= L[i * m + k] * yexp[k];
        }
        if (s2 > tiny) {
            double lii = sqrt(s2);
            L[i * m + i] = lii;
            for (int j = i + 1; j < m; j++) {
                double s = A[j * m + i];
                for (int k = 0; k < i; k++)
                    s -= L[j * m + k] * L[i * m + k];
                L[j * m + i] = s / lii;
            }
            /* E[Y | Y < c] = −φ(c)/Φ(c); for c ≪ 0 the Mills-ratio limit c */
            double c = num / lii, P = Phi(c);
            yexp[i] = P > 1e-300 ? -exp(-0.5 * c * c) / (sqrt(2.0 * M_PI) * P) : c;
        } else {
            yexp[i] = 0.0; /* a linear function of the earlier variables: no column */
        }
    }
    z->e0 = L[0] > 0 ? Phi(b[0] / L[0]) : (b[0] > 0 ? 1.0 : 0.0);
}

/* Embedded rank-1 lattice rule: the generating vector of Cools, Kuo & Nuyens, "Constructing
 * embedded lattice rules for multivariate integration", SIAM J. Sci. Comput. 28 (2006) 2162
 * (order-2 weights, 2^10..2^20 points; F. Kuo's table lattice-32001-1024-1048576.3600,
 * components 2..64). Its first component, 1, is left out: with it the 3-D projection is poor up to
 * 2^16 points (a 4-variable GRU gate product stalled at a standard error of 1e-6 from 2^10 to
 * 2^16 points; without it, 1e-8 at 2^16). Point k is frac(ψ(k)·z) with ψ the base-2 radical inverse, so the first 2^p points
 * are the 2^p-point lattice {j·z/2^p}: doubling the points keeps the earlier ones. Under random
 * shifts and the tent transform, the error on the SOV integrands here falls like ~M^(−1.5..−2)
 * (measured on a trivariate orthant with a closed form: 3e-8 at M = 2^14, against 7e-7 for the
 * shifted Sobol points used before). */
#define LATTICE_BITS 20
/* Used up to 3 SOV dimensions only: with components 2..5 the rule stalls as well (a 5-variable
 * GRU gate product: standard error 1.7e-6 at 2^15 and at 2^17 points per shift; the shifted
 * Sobol points reach 1.3e-7 at 2^17). Dimensions ≤ 4 are deterministic (kernels/mvn.c), so the
 * lattice now serves only problems the deterministic back ends cannot reduce. */
#ifndef LATTICE_MAXDIM
#define LATTICE_MAXDIM 3
#endif
const uint32_t tpk_nsr_lattice_z[TPK_ORTHANT_LATTICE_DIMS] = {
    182667, 469891, 498753, 110745, 446247, 250185, 118627, 245333, 283199, 408519,
    391023, 246327, 126539, 399185, 461527, 300343, 69681,  516695, 436179, 106383, 238523,
    413283, 70841,  47719,  300129, 113029, 123925, 410745, 211325, 17489,  511893, 40767,
    186077, 519471, 255369, 101819, 243573, 66189,  152143, 503455, 113217, 132603, 463967,
    297717, 157383, 224015, 502917, 36237,  94049,  170665, 79397,  123963, 223451, 323871,
    303633, 98567,  318855, 494245, 477137, 177975, 64483,  26695,  88779};

static uint32_t radical_inverse(uint32_t k)
{
    uint32_t r = 0;
    for (int i = 0; i < LATTICE_BITS; i++, k >>= 1)
        r = (r << 1) | (k & 1u);
    return r;
}

/* Points per block of the SOV evaluation (kernels/mvn_sov.c: its stride). */
#define SOV_BLK TPK_MVN_SOV_BLK
#define TWO32 4294967296.0 /* 2^32: a binary fraction's 32 bits as an integer */

/* Owen's nested uniform scrambling of the Sobol points (tpk_mvn_owen_scramble, kernels/mvn_sov.c:
 * B. Burley's hash, "Practical hash-based Owen scrambling", JCGT 9 (2020)). Each randomisation
 * is unbiased (a scrambled point is uniform) and a scrambled digital net is one. Measured on 40
 * orthant problems of a GRU 4 × 8 kernel (dimension 5–16, against 2^17 × 16 points): RMS error
 * 2.4–3.5× below that of the shifted, tent-transformed Sobol points used before, at 2^10–2^16
 * points per randomisation (1.3–2.1× of it from the point 0 put back). In the whole 4 × 8 kernel
 * at the default tolerance: 2.3× fewer points (1.97e9 against 4.59e9 point-dimensions); the
 * 3 × 4 kernel of tests/gru_reference.h is as accurate as before (RMS difference over 8 seeds
 * 1.6e-7, before 1.7e-7). */

int tpk_nsr_orthant(int m, const double *mu, const double *S, uint64_t seed,
                    const tpk_orthant_opts *o, tpk_estimate *out, tpk_ctx *ctx)
{
    if (m < 0 || m > TPK_ORTHANT_MAXDIM)
        return TPK_ERROR(ctx, TPK_EINVAL, "orthant dimension %d is outside 0..%d", m,
                         TPK_ORTHANT_MAXDIM);
    for (int i = 0; i < m; i++)
        if (!isfinite(mu[i]) || !(S[i * m + i] >= 0.0))
            return TPK_ERROR(ctx, TPK_EDOM, "orthant probability: bad mean or variance %g, %g",
                             mu[i], S[i * m + i]);
    out->err = 0.0;
    if (m == 0) {
        out->value = 1.0;
        return TPK_OK;
    }
    if (m == 1) {
        out->value = S[0] > 0 ? Phi(mu[0] / sqrt(S[0])) : (mu[0] > 0 ? 1.0 : 0.0);
        return TPK_OK;
    }
    if (m <= TPK_MVN_MAXDIM) {
        /* P(w > 0) = P(X < μ), X = μ − w ~ N(0, S): the deterministic bivariate / trivariate /
         * 4-D back ends (kernels/mvn.c) with their error bounds. A singular S they cannot
         * reduce (TPK_EUNSUPPORTED) falls through to the QMC below; a missed tolerance
         * (TPK_ENUMERIC) still returns the value with its honest bound. */
        tpk_ctx mctx;
        tpk_ctx_init_from(&mctx, ctx);
        int st = tpk_mvn_cdf(m, mu, S, MVN_TOL, out, &mctx);
        if (st == TPK_OK || st == TPK_ENUMERIC)
            return TPK_OK;
        if (st != TPK_EUNSUPPORTED)
            return TPK_ERROR(ctx, st, "%s", mctx.msg);
        out->err = 0.0;
    }
    sov z;
    sov_setup(&z, m, mu, S);
    if (z.e0 == 0.0) {
        out->value = 0.0;
        return TPK_OK;
    }
    double abs_tol = o && o->abs_tol > 0 ? o->abs_tol : DEF_ABS_TOL;
    double rel_tol = o && o->rel_tol > 0 ? o->rel_tol : DEF_REL_TOL;
    int R = o && o->shifts > 1 ? o->shifts : DEF_SHIFTS;
    size_t maxpts = o && o->max_points ? o->max_points : DEF_MAXPTS;
    if (R > 64)
        R = 64;
    if (maxpts > (size_t)1 << LATTICE_BITS)
        maxpts = (size_t)1 << LATTICE_BITS;
    const int r1 = m - 1;
    double sum[64] = {0}, shift[64 * TPK_ORTHANT_MAXDIM];
    double u[(TPK_ORTHANT_MAXDIM - 1) * SOV_BLK], us[(TPK_ORTHANT_MAXDIM - 1) * SOV_BLK];
    uint32_t rb[(TPK_ORTHANT_MAXDIM - 1) * SOV_BLK]; /* the Sobol coordinates' reversed bits */
    uint32_t sd[64 * TPK_ORTHANT_MAXDIM];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < r1; j++) {
            shift[r * r1 + j] = tpk_rng_uniform_at(seed, SHIFT_STREAM, (uint32_t)r, (uint32_t)j);
            sd[r * r1 + j] = (uint32_t)(shift[r * r1 + j] * TWO32);
        }
    gsl_qrng *q = NULL;
    if (r1 > LATTICE_MAXDIM && (q = qrng_alloc(r1)) == NULL)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory for a QMC generator");
    int sobol = q != NULL && r1 <= SOBOL_MAXDIM; /* Owen-scrambled; else shifted and tent */
    size_t M = 0, Mnext = FIRST_PTS;
    double mean = 0.0, se = 0.0;
    const double inv = 1.0 / (double)((uint32_t)1 << LATTICE_BITS);
    const uint32_t mask = ((uint32_t)1 << LATTICE_BITS) - 1;
    for (;;) {
        for (size_t k0 = M; k0 < Mnext; k0 += SOV_BLK) {
            int B = Mnext - k0 < SOV_BLK ? (int)(Mnext - k0) : SOV_BLK;
            for (int b = 0; b < B; b++) {
                if (q != NULL) {
                    double pt[TPK_ORTHANT_MAXDIM];
                    if (sobol && k0 + (size_t)b == 0)
                        memset(pt, 0, sizeof pt); /* the net's first point, which GSL skips */
                    else
                        gsl_qrng_get(q, pt);
                    for (int j = 0; j < r1; j++) {
                        uint32_t bits = (uint32_t)(pt[j] * TWO32); /* multiples of 2^-30: exact */
                        if (sobol)
                            rb[j * SOV_BLK + b] = tpk_mvn_reverse_bits(bits);
                        else
                            u[j * SOV_BLK + b] = pt[j];
                    }
                    continue;
                }
                uint64_t psi = radical_inverse((uint32_t)(k0 + (size_t)b));
                for (int j = 0; j < r1; j++)
                    u[j * SOV_BLK + b] = (double)(uint32_t)((psi * tpk_nsr_lattice_z[j]) & mask) * inv;
            }
            for (int r = 0; r < R; r++) { /* the same points under each randomisation */
                if (sobol) {
                    for (int j = 0; j < r1; j++)
                        tpk_mvn_owen_scramble(B, rb + j * SOV_BLK, sd[r * r1 + j],
                                              us + j * SOV_BLK);
                    sum[r] += tpk_mvn_sov_sum(m, z.L, z.b, us, NULL, B);
                } else {
                    sum[r] += tpk_mvn_sov_sum(m, z.L, z.b, u, shift + r * r1, B);
                }
            }
        }
        M = Mnext;
        double s1 = 0.0, s2 = 0.0;
        for (int r = 0; r < R; r++) {
            double x = sum[r] / (double)M;
            s1 += x;
            s2 += x * x;
        }
        mean = s1 / R;
        double var = (s2 - R * mean * mean) / (R - 1);
        se = var > 0 ? sqrt(var / R) : 0.0;
        if (se <= fmax(abs_tol, rel_tol * fabs(mean)) || 2 * M > maxpts)
            break;
        Mnext = 2 * M;
    }
    if (q != NULL)
        gsl_qrng_free(q);
    out->value = mean;
    out->err = se;
    return TPK_OK;
}

struct tpk_qmc {
    gsl_qrng *q;
    int r;
    double *u, *delta;
    double *ub, *db; /* a block's uniforms and their shifts, TPK_QMC_BLOCK × r */
    tpk_allocator al;
};

tpk_qmc *tpk_nsr_qmc_alloc(int r, tpk_ctx *ctx)
{
    tpk_qmc *g = tpk_calloc(ctx, 1, sizeof *g);
    if (g == NULL)
        return NULL;
    g->al = tpk_ctx_allocator(ctx);
    g->r = r;
    g->q = qrng_alloc(r);
    g->u = tpk_malloc(ctx, (size_t)(r > 0 ? r : 1) * sizeof *g->u);
    g->delta = tpk_malloc(ctx, (size_t)(r > 0 ? r : 1) * sizeof *g->delta);
    g->ub = tpk_malloc(ctx, TPK_QMC_BLOCK * (size_t)(r > 0 ? r : 1) * sizeof *g->ub);
    g->db = tpk_malloc(ctx, TPK_QMC_BLOCK * (size_t)(r > 0 ? r : 1) * sizeof *g->db);
    if (g->q == NULL || g->u == NULL || g->delta == NULL || g->ub == NULL || g->db == NULL) {
        tpk_nsr_qmc_free(g);
        return NULL;
    }
    return g;
}

void tpk_nsr_qmc_free(tpk_qmc *g)
{
    if (g == NULL)
        return;
    if (g->q)
        gsl_qrng_free(g->q);
    tpk_allocator al = g->al;
    tpk_mem_free(&al, g->u);
    tpk_mem_free(&al, g->delta);
    tpk_mem_free(&al, g->ub);
    tpk_mem_free(&al, g->db);
    tpk_mem_free(&al, g);
}

void tpk_nsr_qmc_start(tpk_qmc *g, uint64_t seed, int shift)
{
    gsl_qrng_init(g->q);
    for (int j = 0; j < g->r; j++)
        g->delta[j] = tpk_rng_uniform_at(seed, SHIFT_STREAM + 1, (uint32_t)shift, (uint32_t)j);
    for (int j = 0; j < g->r; j++)
        for (size_t b = 0; b < TPK_QMC_BLOCK; b++)
            g->db[(size_t)j * TPK_QMC_BLOCK + b] = g->delta[j];
}

void tpk_nsr_qmc_next_normals(tpk_qmc *g, double *x)
{
    gsl_qrng_get(g->q, g->u);
    tpk_mvn_normals(g->r, g->u, g->delta, x); /* Φ⁻¹(tent(u + Δ mod 1)), vectorised */
}

void tpk_nsr_qmc_next_block(tpk_qmc *g, size_t B, double *x)
{
    B = B < TPK_QMC_BLOCK ? B : TPK_QMC_BLOCK;
    const size_t r = (size_t)g->r;
    for (size_t b = 0; b < B; b++) {
        gsl_qrng_get(g->q, g->u);
        for (size_t j = 0; j < r; j++)
            g->ub[j * TPK_QMC_BLOCK + b] = g->u[j];
    }
    for (size_t j = 0; j < r; j++)
        tpk_mvn_normals((int)B, g->ub + j * TPK_QMC_BLOCK, g->db + j * TPK_QMC_BLOCK,
                        x + j * TPK_QMC_BLOCK);
}

/* ---- memo of orthant probabilities --------------------------------------------------------- */

/* The same orthant problem recurs: E[h^{t−1} h^{s−1}] feeds W_z, W_r and (times E[r r']) W_h
 * (theory §2.3), so each gate product is asked for three times. Entries are keyed by two 64-bit
 * hashes of (m, μ, S) as computed — bit-identical inputs — and the QMC shifts are seeded by the
 * key, so a result does not depend on which thread or instruction asked first. */
typedef struct oentry {
    uint64_t h1, h2; /* h1 == 0: empty */
    double value, err;
} oentry;

struct tpk_orthant_cache {
    size_t cap, n;
    oentry *e;
    tpk_allocator al; /* no error is recorded: without memory the memo just stays as it is */
};

tpk_orthant_cache *tpk_nsr_orthant_cache_alloc(const tpk_allocator *al)
{
    tpk_orthant_cache *c = tpk_mem_calloc(al, 1, sizeof(tpk_orthant_cache), NULL);
    if (c != NULL && al != NULL)
        c->al = *al;
    return c;
}

void tpk_nsr_orthant_cache_free(tpk_orthant_cache *c)
{
    if (c == NULL)
        return;
    tpk_allocator al = c->al;
    tpk_mem_free(&al, c->e);
    tpk_mem_free(&al, c);
}

/* Problems are keyed after rounding each entry to 52 − ROUND_BITS mantissa bits (relative
 * 2^-44 ≈ 6e-14): the same (covariance, threshold) met through another summation order — the
 * (a, c) and (c, a) entries, a MatMul and the readout of the same pair — hits the memo; the
 * probability moves by ≲ 1e-13 under such a change, far below every error estimate here. */
#define ROUND_BITS 8
#define ROUND_MASK ((UINT64_C(1) << ROUND_BITS) - 1)
#define ROUND_HALF (UINT64_C(1) << (ROUND_BITS - 1))

static void hash_problem(int m, const double *mu, const double *S, uint64_t *h1, uint64_t *h2)
{
    uint64_t a = UINT64_C(0xcbf29ce484222325) ^ (uint64_t)m, b = UINT64_C(0x9E3779B97F4A7C15) + (uint64_t)m;
    size_t n = (size_t)m + (size_t)m * (size_t)m;
    for (size_t i = 0; i < n; i++) {
        double v = i < (size_t)m ? mu[i] : S[i - (size_t)m];
        uint64_t x;
        memcpy(&x, &v, sizeof x);
        x = (x + ROUND_HALF) & ~ROUND_MASK; /* the rounded problem (see ROUND_BITS) */
        a = (a ^ x) * UINT64_C(0x100000001b3);
        a ^= a >> 29;
        b = (b + x) * UINT64_C(0xbf58476d1ce4e5b9);
        b ^= b >> 31;
    }
    *h1 = a ? a : 1;
    *h2 = b;
}

static oentry *slot(tpk_orthant_cache *c, uint64_t h1, uint64_t h2)
{
    size_t i = (size_t)(h1 & (c->cap - 1));
    while (c->e[i].h1 != 0 && (c->e[i].h1 != h1 || c->e[i].h2 != h2))
        i = (i + 1) & (c->cap - 1);
    return &c->e[i];
}

/* Insert (caller holds the lock); on allocation failure the memo just stays as it is. */
static void cache_put(tpk_orthant_cache *c, uint64_t h1, uint64_t h2, const tpk_estimate *v)
{
    if (2 * (c->n + 1) > c->cap) {
        size_t ncap = c->cap ? 2 * c->cap : 4096;
        oentry *ne = tpk_mem_calloc(&c->al, ncap, sizeof *ne, NULL), *old = c->e;
        if (ne == NULL)
            return;
        size_t ocap = c->cap;
        c->e = ne;
        c->cap = ncap;
        for (size_t i = 0; i < ocap; i++)
            if (old[i].h1 != 0)
                *slot(c, old[i].h1, old[i].h2) = old[i];
        tpk_mem_free(&c->al, old);
    }
    oentry *s = slot(c, h1, h2);
    if (s->h1 == 0) {
        *s = (oentry){h1, h2, v->value, v->err};
        c->n++;
    }
}

int tpk_nsr_orthant_cached(tpk_orthant_cache *c, int m, const double *mu, const double *S,
                           uint64_t seed, const tpk_orthant_opts *o, tpk_estimate *out,
                           tpk_ctx *ctx)
{
    if (c == NULL || m < 2 || m > TPK_ORTHANT_MAXDIM)
        return tpk_nsr_orthant(m, mu, S, seed, o, out, ctx);
    uint64_t h1, h2;
    hash_problem(m, mu, S, &h1, &h2);
    int hit = 0;
#pragma omp critical(tpk_orthant_cache)
    {
        if (c->cap) {
            const oentry *s = slot(c, h1, h2);
            if (s->h1 != 0) {
                out->value = s->value;
                out->err = s->err;
                hit = 1;
            }
        }
    }
    if (hit)
        return TPK_OK;
    int st = tpk_nsr_orthant(m, mu, S, seed ^ h2, o, out, ctx);
    if (st == TPK_OK) {
#pragma omp critical(tpk_orthant_cache)
        cache_put(c, h1, h2, out);
    }
    return st;
}
