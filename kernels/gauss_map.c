/* Whole-matrix maps S ↦ V_φ(S): tiled, OpenMP-parallel, vectorised closed forms (theory.md §3.2), Mehler series otherwise. */
#include "gauss_impl.h"
#include "tpk/alloc.h"
#include "tpk/array.h"
#include "gauss_simd.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tpk/map.h"

#define PI 3.14159265358979323846
/* Square tiles of the lower triangle: a 64×64 block of doubles (32 KiB) is computed into a
 * buffer and written out twice (in place and transposed), so the mirror costs no extra pass. */
#define TILE 64
/* Below this many entries the OpenMP fork costs more than it saves. */
#define PAR_MIN_ENTRIES 16384
/* Mehler series accepted when its truncation bound is below this fraction of √(Eφ(u)²Eφ(v)²);
 * otherwise the entry is also integrated by 2-D Gauss–Hermite and the better estimate kept. */
#define MEHLER_RTOL 1e-10

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* Kernels the map dispatches to, once per row segment (never per entry). */
enum map_kernel {
    MK_ASIN,    /* α + β asin(k a_i a_j): step, sign, erf(b), erf_sigmoid, relu′ and its step mixes */
    MK_ABRELU,  /* √(q_i q_j)[c0 √(1−ρ²) + (c1 + c0 asin ρ)ρ] */
    MK_ARCCOS2, /* q_i q_j/(2π)[3ρ√(1−ρ²) + (π/2 + asin ρ)(1 + 2ρ²)] */
    MK_GELU,
    MK_EXPSQ,   /* c0/√(1 + c1(q_i + q_j) + c1²(q_i q_j − k²)): a·exp(βx²), β ≤ 0 (erf′), c1 = −2β */
    MK_GELU_D,  /* gelu′ (theory.md §3.5) */
    MK_SCALAR,  /* the remaining closed forms, entry by entry (identity, sin, exp, monomials, growing
                 * expsq, expsq′, hardtanh′) */
    MK_MEHLER,  /* no closed form, smooth φ: Mehler series, quadrature where its bound is loose */
    MK_QUAD     /* no closed form, kinked φ: quadrature per entry */
};

/* Per-index arrays: q (variance), sq = √q (PSD check), a (ρ-scale: ρ_ij = k a_i a_j),
 * s (output scale), and for MK_MEHLER the coefficients [t*len + i], tail and norm. */
typedef struct index_prep {
    size_t len;
    double *q, *sq, *a, *s;
    double *coef, *tail, *norm;
    double qmax;
    tpk_allocator al; /* of q and coef */
} index_prep;

typedef struct map_plan {
    const tpk_phi *phi;
    const tpk_gauss_ws *ws;
    int mk;
    double c0, c1;       /* kernel constants (MK_ASIN: α, β; MK_ABRELU: c0, c1) */
    const index_prep *r; /* rows */
    const index_prep *c; /* columns */
    size_t J;
    double alpha, beta;  /* output affine */
} map_plan;

/* First failing entry (lexicographically smallest (i, j), so the message is deterministic). */
typedef struct map_fail {
    int any;
    size_t i, j;
    double k;
} map_fail;

typedef struct seg_stats {
    int bad;       /* some entry of the segment failed a check: rescan it */
    double maxr;   /* largest |asin argument| (MK_ASIN, MK_GELU error bound) */
    double errmax; /* largest per-entry error (MK_SCALAR, MK_MEHLER) */
} seg_stats;

/* ==== vector kernels ===================================================================== */

typedef struct row_consts {
    gv lim, ra, rs, c0, c1;
} row_consts;

/* One vector of entries (i, j..j+L). k: covariances; csq, ca, cs: the column arrays. */
static ALWAYS_INLINE gv vec_entry(const int mk, const row_consts *R, gv k, gv csq, gv ca, gv cs,
                                  gm *bad, gv *maxr)
{
    const gv one = gv_set1(1.0);
    /* PSD check |k| ≤ (1+rtol)√(q_i q_j); true also for NaN k. */
    *bad = gm_or(*bad, gv_not_le(gv_abs(k), gv_mul(R->lim, csq)));
    gv x = gv_mul(gv_mul(k, R->ra), ca);
    x = gv_min(gv_max(x, gv_set1(-1.0)), one);
    /* as tpk__gauss_check_cov: within rounding of ±1 is ±1 */
    x = gv_select(gv_ge(gv_abs(x), gv_set1(1.0 - GAUSS_RHO_SNAP)), gv_copysign(one, x), x);
    gv out;
    switch (mk) {
    case MK_ASIN:
        *maxr = gv_max(*maxr, gv_abs(x));
        out = gv_fma(R->c1, gv_asin(x), R->c0);
        break;
    case MK_ABRELU: {
        gv w, as = gv_asin_w(x, &w); /* w = √(1−ρ²) */
        gv in = gv_fma(gv_fma(R->c0, as, R->c1), x, gv_mul(R->c0, w));
        out = gv_mul(gv_mul(R->rs, cs), in);
        break;
    }
    case MK_ARCCOS2: {
        gv w, as = gv_asin_w(x, &w);
        gv t1 = gv_mul(gv_mul(gv_set1(3.0), x), w);
        gv t2 = gv_mul(gv_add(gv_set1(PI / 2), as), gv_fma(gv_add(x, x), x, one));
        out = gv_mul(gv_mul(gv_mul(R->rs, cs), gv_set1(1.0 / (2 * PI))), gv_add(t1, t2));
        break;
    }
    case MK_EXPSQ: {
        /* s = q; det(I − 2βΣ) without cancellation, as tpk__gauss_cf2 (PSD: q_i q_j ≥ k²) */
        gv qq = gv_mul(R->rs, cs), dq = gv_max(gv_sub(qq, gv_mul(k, k)), gv_set1(0.0));
        gv det = gv_fma(gv_mul(R->c1, R->c1), dq, gv_fma(R->c1, gv_add(R->rs, cs), one));
        out = gv_div(R->c0, gv_sqrt(det));
        break;
    }
    case MK_GELU_D: {
        /* a = 1/√(1+q), s = q: 1/4 + asin(x)/(2π) + k/(2π√D)(a_i² + a_j² + 1/D), x = k a_i a_j,
         * D = 1 + q_i + q_j + (q_i q_j − k²) ≥ 1 (see tpk__gauss_cf2) */
        gv qq = gv_mul(R->rs, cs), dq = gv_max(gv_sub(qq, gv_mul(k, k)), gv_set1(0.0));
        gv D = gv_add(gv_add(one, gv_add(R->rs, cs)), dq), sD = gv_sqrt(D);
        gv ra2 = gv_mul(R->ra, R->ra), inner = gv_fma(ca, ca, gv_add(ra2, gv_div(one, D)));
        gv t = gv_div(gv_mul(gv_mul(gv_set1(1.0 / (2 * PI)), k), inner), sD);
        *maxr = gv_max(*maxr, gv_abs(x));
        out = gv_add(gv_fma(gv_set1(1.0 / (2 * PI)), gv_asin(x), gv_set1(0.25)), t);
        break;
    }
    default: { /* MK_GELU: a = 1/√(1+q), s = q; see tpk__gauss_cf2 for the algebra */
        gv rp = gv_mul(R->ra, ca), qq = gv_mul(R->rs, cs);
        gv dq = gv_max(gv_sub(qq, gv_mul(k, k)), gv_set1(0.0));
        gv d2 = gv_add(gv_add(one, gv_add(R->rs, cs)), dq);
        gv w2 = gv_mul(d2, gv_mul(rp, rp));
        gv t = gv_div(gv_mul(rp, gv_fma(qq, w2, gv_mul(x, x))), gv_sqrt(w2));
        *maxr = gv_max(*maxr, gv_abs(x));
        out = gv_fma(gv_set1(0.25), k, gv_mul(gv_set1(1.0 / (2 * PI)), gv_fma(k, gv_asin(x), t)));
        break;
    }
    }
    *bad = gm_or(*bad, gv_not_le(gv_abs(out), gv_set1(DBL_MAX)));
    return out;
}

/* Entries (i0 + rstep·t, j0 + t), t < len: with rstep = 0 a row segment (the row's constants
 * broadcast), with rstep = 1 a band parallel to the diagonal, row and column arrays both
 * contiguous (the flatten CNN's pairs of images (a, c), one position after the other). rstep is
 * a constant at every call, so each form compiles to its own loop. */
static ALWAYS_INLINE void strip_vec(const int mk, const int rstep, const map_plan *P, size_t i0,
                                    const double *k, size_t j0, size_t len, double *out,
                                    seg_stats *st)
{
    const index_prep *r = P->r, *c = P->c;
    const gv c0 = gv_set1(P->c0), c1 = gv_set1(P->c1), lim = gv_set1(1.0 + GAUSS_PSD_RTOL);
    gm bad = gm_none();
    gv maxr = gv_set1(0.0);
    const double *rsq = r->sq + i0, *ra = r->a + i0, *rs = r->s + i0;
    const double *csq = c->sq + j0, *ca = c->a + j0, *cs = c->s + j0;
    const row_consts R1 = {gv_mul(lim, gv_set1(rsq[0])), gv_set1(ra[0]), gv_set1(rs[0]), c0, c1};
    size_t j = 0;
    for (; j + GV_LANES <= len; j += GV_LANES) {
        const row_consts R = rstep ? (row_consts){gv_mul(lim, gv_load(rsq + j)), gv_load(ra + j),
                                                  gv_load(rs + j), c0, c1}
                                   : R1;
        gv_store(out + j, vec_entry(mk, &R, gv_load(k + j), gv_load(csq + j), gv_load(ca + j),
                                    gv_load(cs + j), &bad, &maxr));
    }
    if (j < len) { /* tail: pad with a harmless entry (k = 0, unit scales) */
        double t[7][GV_LANES];
        for (size_t l = 0; l < GV_LANES; l++) {
            const int in = j + l < len;
            const size_t ri = rstep ? j + l : 0;
            t[0][l] = in ? k[j + l] : 0.0;
            t[1][l] = in ? rsq[ri] : 1.0;
            t[2][l] = in ? ra[ri] : 1.0;
            t[3][l] = in ? rs[ri] : 0.0;
            t[4][l] = in ? csq[j + l] : 1.0;
            t[5][l] = in ? ca[j + l] : 1.0;
            t[6][l] = in ? cs[j + l] : 0.0;
        }
        row_consts R = {gv_mul(lim, gv_load(t[1])), gv_load(t[2]), gv_load(t[3]), c0, c1};
        gv_store(t[0], vec_entry(mk, &R, gv_load(t[0]), gv_load(t[4]), gv_load(t[5]),
                                 gv_load(t[6]), &bad, &maxr));
        for (size_t l = 0; j + l < len; l++)
            out[j + l] = t[0][l];
    }
    double mr[GV_LANES];
    gv_store(mr, maxr);
    for (size_t l = 0; l < GV_LANES; l++)
        st->maxr = mr[l] > st->maxr ? mr[l] : st->maxr;
    st->bad |= gm_any(bad);
}

static ALWAYS_INLINE void seg_vec(const int mk, const map_plan *P, size_t i, const double *k,
                                  size_t j0, size_t len, double *out, seg_stats *st)
{
    strip_vec(mk, 0, P, i, k, j0, len, out, st);
}

static ALWAYS_INLINE void band_vec(const int mk, const map_plan *P, size_t i0, const double *k,
                                   size_t j0, size_t len, double *out, seg_stats *st)
{
    strip_vec(mk, 1, P, i0, k, j0, len, out, st);
}

static void seg_asin(const map_plan *P, size_t i, const double *k, size_t j0, size_t len,
                     double *out, seg_stats *st)
{
    seg_vec(MK_ASIN, P, i, k, j0, len, out, st);
}

/* band_vec for the vector kernels; 0 for the others (mapped entry by entry by their seg_fn). */
static int band_map(const map_plan *P, size_t i0, const double *k, size_t j0, size_t len,
                    double *out, seg_stats *st)
{
    switch (P->mk) {
    case MK_ASIN: band_vec(MK_ASIN, P, i0, k, j0, len, out, st); return 1;
    case MK_ABRELU: band_vec(MK_ABRELU, P, i0, k, j0, len, out, st); return 1;
    case MK_ARCCOS2: band_vec(MK_ARCCOS2, P, i0, k, j0, len, out, st); return 1;
    case MK_GELU: band_vec(MK_GELU, P, i0, k, j0, len, out, st); return 1;
    case MK_EXPSQ: band_vec(MK_EXPSQ, P, i0, k, j0, len, out, st); return 1;
    case MK_GELU_D: band_vec(MK_GELU_D, P, i0, k, j0, len, out, st); return 1;
    default: return 0;
    }
}

static void seg_abrelu(const map_plan *P, size_t i, const double *k, size_t j0, size_t len,
                       double *out, seg_stats *st)
{
    seg_vec(MK_ABRELU, P, i, k, j0, len, out, st);
}
static void seg_arccos2(const map_plan *P, size_t i, const double *k, size_t j0, size_t len,
                        double *out, seg_stats *st)
{
    seg_vec(MK_ARCCOS2, P, i, k, j0, len, out, st);
}
static void seg_gelu(const map_plan *P, size_t i, const double *k, size_t j0, size_t len,
                     double *out, seg_stats *st)
{
    seg_vec(MK_GELU, P, i, k, j0, len, out, st);
}
static void seg_expsq(const map_plan *P, size_t i, const double *k, size_t j0, size_t len,
                      double *out, seg_stats *st)
{
    seg_vec(MK_EXPSQ, P, i, k, j0, len, out, st);
}
static void seg_gelu_d(const map_plan *P, size_t i, const double *k, size_t j0, size_t len,
                       double *out, seg_stats *st)
{
    seg_vec(MK_GELU_D, P, i, k, j0, len, out, st);
}

/* ==== scalar closed forms and the Mehler series ========================================== */

static void seg_scalar(const map_plan *P, size_t i, const double *k, size_t j0, size_t len,
                       double *out, seg_stats *st)
{
    const double qi = P->r->q[i];
    for (size_t jj = 0; jj < len; jj++) {
        double rho = 0.0, v = 0.0, e = 0.0;
        if (tpk__gauss_check_cov(qi, P->c->q[j0 + jj], k[jj], &rho, NULL) ||
            tpk__gauss_expect2_checked(P->phi, qi, P->c->q[j0 + jj], k[jj], rho, P->ws, &v, &e, NULL)) {
            st->bad = 1;
            v = 0.0;
        }
        out[jj] = v;
        st->errmax = e > st->errmax ? e : st->errmax;
    }
}

/* Mehler: E[φ(u)φ(v)] = Σ_t c_t(q_i) c_t(q_j) ρ^t (theory.md §3.2). Truncation after J terms is
 * bounded by Cauchy–Schwarz: |Σ_{t≥J}| ≤ T_i T_j |ρ|^J with T = ‖c_{t≥J}‖₂; rounding by
 * J ε N_i N_j (N = ‖c‖₂ = √(Eφ²)). Horner runs across a row segment so the loop vectorises. */
static void seg_mehler(const map_plan *P, size_t i, const double *k, size_t j0, size_t len,
                       double *out, seg_stats *st)
{
    const index_prep *r = P->r, *c = P->c;
    const size_t J = P->J;
    double rho[TILE], acc[TILE], pw[TILE];
    const double lim = (1.0 + GAUSS_PSD_RTOL) * r->sq[i], ra = r->a[i];
    int bad = 0;
    for (size_t jj = 0; jj < len; jj++) {
        const double kk = k[jj];
        bad |= !(fabs(kk) <= lim * c->sq[j0 + jj]);
        double x = kk * ra * c->a[j0 + jj];
        x = x > 1.0 ? 1.0 : x < -1.0 ? -1.0 : x;
        rho[jj] = fabs(x) >= 1.0 - GAUSS_RHO_SNAP ? (x > 0 ? 1.0 : -1.0) : x;
        acc[jj] = 0.0;
        pw[jj] = 1.0;
    }
    for (size_t t = J; t-- > 0;) {
        const double ci = r->coef[t * r->len + i];
        const double *cc = c->coef + t * c->len + j0;
#pragma omp simd
        for (size_t jj = 0; jj < len; jj++) {
            acc[jj] = acc[jj] * rho[jj] + ci * cc[jj];
            pw[jj] *= fabs(rho[jj]);
        }
    }
    const double Ti = r->tail[i], Ni = r->norm[i], rtol = 2.0 * tpk__phi_eval_rtol(P->phi);
    for (size_t jj = 0; jj < len; jj++) {
        const size_t j = j0 + jj;
        const double nn = Ni * c->norm[j];
        double v = acc[jj], e = Ti * c->tail[j] * pw[jj] + ((double)J * GAUSS_EPS + rtol) * nn;
        if (e > MEHLER_RTOL * nn && !bad) {
            double qv, qe;
            tpk__gauss_quad2(P->phi, P->phi, 0.0, 0.0, r->q[i], c->q[j], rho[jj], P->ws, &qv, &qe);
            if (qe < e) {
                v = qv;
                e = qe;
            }
        }
        bad |= !(fabs(v) <= DBL_MAX);
        out[jj] = v;
        st->errmax = e > st->errmax ? e : st->errmax;
    }
    st->bad |= bad;
}

/* Kinked φ: the Hermite coefficients themselves converge only algebraically (aliasing in the
 * 2J-node rule), so the series' tail bound would not be honest; integrate every entry. */
static void seg_quad(const map_plan *P, size_t i, const double *k, size_t j0, size_t len,
                     double *out, seg_stats *st)
{
    const double qi = P->r->q[i];
    for (size_t jj = 0; jj < len; jj++) {
        double rho = 0.0, v = 0.0, e = 0.0;
        if (tpk__gauss_check_cov(qi, P->c->q[j0 + jj], k[jj], &rho, NULL)) {
            st->bad = 1;
        } else {
            tpk__gauss_quad2(P->phi, P->phi, 0.0, 0.0, qi, P->c->q[j0 + jj], rho, P->ws, &v, &e);
            st->bad |= !(fabs(v) <= DBL_MAX);
        }
        out[jj] = v;
        st->errmax = e > st->errmax ? e : st->errmax;
    }
}

typedef void (*seg_fn)(const map_plan *, size_t, const double *, size_t, size_t, double *,
                       seg_stats *);

static seg_fn seg_for(int mk)
{
    switch (mk) {
    case MK_ASIN: return seg_asin;
    case MK_ABRELU: return seg_abrelu;
    case MK_ARCCOS2: return seg_arccos2;
    case MK_GELU: return seg_gelu;
    case MK_EXPSQ: return seg_expsq;
    case MK_GELU_D: return seg_gelu_d;
    case MK_SCALAR: return seg_scalar;
    case MK_QUAD: return seg_quad;
    default: return seg_mehler;
    }
}

/* ==== planning =========================================================================== */

static void prep_free(index_prep *p)
{
    tpk_mem_free(&p->al, p->q);
    tpk_mem_free(&p->al, p->coef);
    memset(p, 0, sizeof *p);
}

/* Validate the variances and fill the per-index arrays for kernel mk. */
static int prep_alloc(index_prep *p, const tpk_phi *phi, int mk, const tpk_gauss_ws *ws,
                      const double *q, size_t qstride, size_t len, const char *what, tpk_ctx *ctx)
{
    memset(p, 0, sizeof *p);
    p->al = tpk_ctx_allocator(ctx);
    p->len = len;
    const size_t nb = len ? len : 1;
    const int mehler = mk == MK_MEHLER; /* the series' tail and norm per index */
    p->q = tpk_malloc(ctx, (mehler ? 6 : 4) * nb * sizeof *p->q);
    if (!p->q)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory in tpk_gauss_map");
    p->sq = p->q + nb;
    p->a = p->q + 2 * nb;
    p->s = p->q + 3 * nb;
    p->tail = mehler ? p->q + 4 * nb : NULL;
    p->norm = mehler ? p->q + 5 * nb : NULL;
    size_t bad = len; /* the first variance that is not finite and ≥ 0 */
    for (size_t i = 0; i < len; i++) {
        const double qi = q[i * qstride];
        bad = bad == len && !(isfinite(qi) && qi >= 0) ? i : bad;
        p->q[i] = qi;
    }
    if (bad < len) {
        const double qi = q[bad * qstride];
        /* in the user's terms: rows and columns of a cross kernel, else the inputs */
        const char *who = strcmp(what, "qa") == 0 ? "row input"
                          : strcmp(what, "qb") == 0 ? "column input" : "input";
        /* NaN comes from an overflow upstream (inf − inf, 0·inf): said as such, not as
         * "-nan, not a finite variance" (issue 18) */
        int st = isinf(qi) ? TPK_ERROR(ctx, TPK_EDOM, "the variance of %s %zu overflowed to "
                                       "inf: the kernel grows without bound (weight variance "
                                       "or depth too large for this nonlinearity)", who, bad)
                 : isnan(qi) ? TPK_ERROR(ctx, TPK_EDOM, "the variance of %s %zu is not a "
                                         "number: an earlier step overflowed (inf - inf or "
                                         "0 * inf; a weight variance or the depth too large)",
                                         who, bad)
                           : TPK_ERROR(ctx, TPK_EDOM, "the variance of %s %zu is %g, not a "
                                       "finite variance >= 0", who, bad, qi);
        prep_free(p);
        return st;
    }
    /* the per-index arrays in plain loops that vectorise (a flatten CNN prepares 2L maps of
     * N·Q variances before its first pair) */
    double qmax = 0.0;
    for (size_t i = 0; i < len; i++) {
        const double qi = p->q[i], sq = sqrt(qi);
        qmax = qi > qmax ? qi : qmax;
        p->sq[i] = sq;
        p->a[i] = qi > 0 ? 1.0 / sq : 0.0;
        p->s[i] = sq;
    }
    p->qmax = qmax;
    if (mk == MK_ASIN && (phi->kind == GK_ERF || phi->kind == GK_ERF_SIGMOID)) {
        /* 2b²k/√((1+2b²q_i)(1+2b²q_j)) = k a_i a_j */
        const double b2 = phi->kind == GK_ERF ? phi->cb * phi->cb : 1.0;
        for (size_t i = 0; i < len; i++)
            p->a[i] = sqrt(2.0 * b2) / sqrt(1.0 + 2.0 * b2 * p->q[i]);
    } else if (mk == MK_GELU || mk == MK_GELU_D) {
        for (size_t i = 0; i < len; i++) {
            p->a[i] = 1.0 / sqrt(1.0 + p->q[i]);
            p->s[i] = p->q[i];
        }
    } else if (mk == MK_ARCCOS2 || mk == MK_EXPSQ) {
        for (size_t i = 0; i < len; i++)
            p->s[i] = p->q[i];
    }
    if (mk == MK_MEHLER) {
        const size_t J = ws->J;
        p->coef = tpk_malloc(ctx, J * nb * sizeof *p->coef);
        if (!p->coef) {
            prep_free(p);
            return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory in tpk_gauss_map");
        }
#pragma omp parallel for schedule(dynamic, 16) if (len >= 64)
        for (size_t i = 0; i < len; i++) {
            double fbuf[2 * GAUSS_MEHLER_JMAX];
            tpk__gauss_hermite_coeffs(phi, p->q[i], ws, p->coef + i, len, &p->tail[i], &p->norm[i],
                                      fbuf);
        }
    }
    return TPK_OK;
}

static int plan_kernel(const tpk_phi *phi, const tpk_gauss_ws *ws, map_plan *P, tpk_ctx *ctx)
{
    memset(P, 0, sizeof *P);
    P->phi = phi;
    P->ws = ws;
    switch (phi->kind) {
    case GK_STEP: P->mk = MK_ASIN; P->c0 = 0.25; P->c1 = 1.0 / (2 * PI); break;
    case GK_SIGN: P->mk = MK_ASIN; P->c0 = 0.0; P->c1 = 2.0 / PI; break;
    case GK_ERF: P->mk = MK_ASIN; P->c0 = 0.0; P->c1 = 2.0 / PI; break;
    case GK_ERF_SIGMOID: P->mk = MK_ASIN; P->c0 = 0.25; P->c1 = 1.0 / (2 * PI); break;
    case GK_STEPMIX: {
        /* φ′ of the piecewise-linear family (theory.md §3.5): μ² + h²(2/π) asin ρ */
        const double mu = 0.5 * (phi->ca + phi->cb), h = 0.5 * (phi->cb - phi->ca);
        P->mk = MK_ASIN;
        P->c0 = mu * mu;
        P->c1 = (2.0 / PI) * h * h;
        break;
    }
    case GK_ABRELU: {
        const double a = phi->ca, b = phi->cb;
        P->mk = MK_ABRELU;
        P->c0 = (a - b) * (a - b) / (2 * PI);
        P->c1 = 0.25 * (a + b) * (a + b);
        break;
    }
    case GK_ARCCOS2: P->mk = MK_ARCCOS2; break;
    case GK_GELU: P->mk = MK_GELU; break;
    case GK_GELU_D: P->mk = MK_GELU_D; break;
    case GK_EXPSQ:
        /* decaying a·exp(βx²) (erf′) is finite everywhere; growing ones need the scalar checks */
        if (phi->cb <= 0) {
            P->mk = MK_EXPSQ;
            P->c0 = phi->ca * phi->ca;
            P->c1 = -2.0 * phi->cb;
        } else {
            P->mk = MK_SCALAR;
        }
        break;
    case GK_NUMERIC:
        if (!ws)
            return TPK_ERROR(ctx, TPK_EINVAL,
                             "%s has no closed form: a Gauss-Hermite workspace is required",
                             phi->canon);
        if (tpk_phi_flags(phi) & TPK_PHI_SMOOTH) {
            P->mk = MK_MEHLER;
            P->J = ws->J;
        } else {
            P->mk = MK_QUAD;
        }
        break;
    default: P->mk = MK_SCALAR; break;
    }
    return TPK_OK;
}

/* Rounding bound shared by all entries of a vector-kernel map (per-entry kernels track their own). */
static double vector_err(const map_plan *P, double qmax_r, double qmax_c, double maxr)
{
    const double eps = GAUSS_EPS, sq = sqrt(qmax_r) * sqrt(qmax_c);
    switch (P->mk) {
    case MK_ASIN:
        /* 2-ulp asin plus the sensitivity to ρ's own rounding */
        return fabs(P->c1) * tpk__gauss_asin_rounding(maxr) + 8.0 * eps * (fabs(P->c0) + fabs(P->c1) * PI / 2);
    case MK_ABRELU: return 16.0 * eps * sq * (P->c0 * (1.0 + PI / 2) + P->c1);
    case MK_ARCCOS2: return 16.0 * eps * 1.5 * qmax_r * qmax_c;
    case MK_GELU:
        /* terms: |k|/4, |k|π/(4π), t ≤ 2 max q (see tpk__gauss_cf2) */
        return 16.0 * eps * (sq / 2 + 2.0 * (qmax_r > qmax_c ? qmax_r : qmax_c) / (2 * PI)) +
               sq * tpk__gauss_asin_rounding(maxr) / (2 * PI);
    case MK_EXPSQ: return 16.0 * eps * P->c0; /* |V| ≤ c0: det ≥ 1 */
    case MK_GELU_D:
        /* terms 1/4, asin/(2π) ≤ 1/4, t ≤ 3|k|/(2π√D) ≤ 3√(q_i q_j)/(2π) */
        return 16.0 * eps * (0.5 + sq) + tpk__gauss_asin_rounding(maxr) / (2 * PI);
    default: return 0.0;
    }
}

/* Rescan a segment that flagged a failure, entry by entry, and keep the smallest (i, j). */
static void record_failure(const map_plan *P, size_t i, const double *k, size_t j0, size_t len,
                           const double *out, map_fail *fail)
{
    for (size_t jj = 0; jj < len; jj++) {
        double rho = 0.0, v, e;
        const double qi = P->r->q[i], qj = P->c->q[j0 + jj];
        int st = tpk__gauss_check_cov(qi, qj, k[jj], &rho, NULL);
        if (!st && P->mk == MK_SCALAR)
            st = tpk__gauss_expect2_checked(P->phi, qi, qj, k[jj], rho, P->ws, &v, &e, NULL);
        if (st || !isfinite(out[jj])) {
#pragma omp critical(tpk_gauss_map_fail)
            {
                if (!fail->any || i < fail->i || (i == fail->i && j0 + jj < fail->j)) {
                    fail->any = 1;
                    fail->i = i;
                    fail->j = j0 + jj;
                    fail->k = k[jj];
                }
            }
            return;
        }
    }
}

/* Turn the recorded failure into a message naming the entry. */
static int report_failure(const map_plan *P, const map_fail *fail, tpk_ctx *ctx)
{
    tpk_ctx local;
    tpk_ctx_init_from(&local, ctx);
    double rho = 0.0, v, e;
    const double qi = P->r->q[fail->i], qj = P->c->q[fail->j];
    int st = tpk__gauss_check_cov(qi, qj, fail->k, &rho, &local);
    if (!st)
        st = tpk__gauss_expect2_checked(P->phi, qi, qj, fail->k, rho, P->ws, &v, &e, &local);
    if (!st)
        return TPK_ERROR(ctx, TPK_ENUMERIC, "%s: entry (%zu,%zu) is not finite (q = %g, %g, k = %g)",
                         P->phi->canon, fail->i, fail->j, qi, qj, fail->k);
    return TPK_ERROR(ctx, st, "%s: entry (%zu,%zu): %s", P->phi->canon, fail->i, fail->j, local.msg);
}

/* Entries whose row or column variance is 0 (E = φ(0)·E φ(other)) and, for the symmetric map, the
 * diagonal (ρ = 1 exactly) are recomputed with the scalar path: the vector kernels' clamps give
 * the right ρ but not, e.g., step's φ(0) = 0. */
static int fixup_entry(const map_plan *P, double qi, double qj, double k, double rho, double *val,
                       double *err, tpk_ctx *ctx)
{
    return tpk__gauss_expect2_checked(P->phi, qi, qj, k, rho, P->ws, val, err, ctx);
}

/* ==== drivers ============================================================================ */

/* Outputs larger than this bypass the caches (streaming stores): an n×n kernel that does not
 * fit in the last-level cache is evicted before it is read again, so reading each line for
 * ownership first would only add a third to the memory traffic. */
#define STREAM_MIN_BYTES (48u << 20)

/* dst[0..len) = alpha·src + beta; with stream, aligned full vectors use non-temporal stores. */
static void store_row(double *restrict dst, const double *restrict src, size_t len, double alpha,
                      double beta, int stream)
{
    size_t j = 0;
    if (stream) {
        while (j < len && ((uintptr_t)(dst + j) % (GV_LANES * sizeof(double))) != 0) {
            dst[j] = alpha * src[j] + beta;
            j++;
        }
        const gv a = gv_set1(alpha), b = gv_set1(beta);
        for (; j + GV_LANES <= len; j += GV_LANES)
            gv_stream(dst + j, gv_fma(a, gv_load(src + j), b));
    }
    for (; j < len; j++)
        dst[j] = alpha * src[j] + beta;
}

/* relu's lower-triangle map through the tuner's generated kernel (tpk/map.h, gen/tpk_map_cpu_ID.c;
 * the tile loop of map_sym stays the reference). Returns 1 when it served, 0 when the reference
 * must run: TPK_MAP=reference, another φ, no memory, or an entry flagged out of place (the loop
 * then finds and reports it). In place a flagged entry is overwritten and cannot be named any
 * more: *st gets the error (TPK_EDOM, as the reference's check). */
static int relu_tuned(const tpk_phi *phi, const double *S, size_t n, double alpha, double beta,
                      double *out, int *st, tpk_ctx *ctx)
{
    if (phi->kind != GK_ABRELU || phi->ca != 0.0 || phi->cb != 1.0 ||
        tpk_relu_map_tuned_choice(0, n, 0, NULL) == TPK_MAP_REFERENCE)
        return 0;
    tpk_ctx local;
    tpk_ctx_init_from(&local, ctx);
    int bad = 1;
    if (tpk_relu_map_tuned_d(n, S, n, alpha, beta, out, n, n * n >= PAR_MIN_ENTRIES ? 0 : 1, NULL,
                             &bad, &local) != TPK_OK)
        return 0;
    if (bad && out == S)
        *st = TPK_ERROR(ctx, TPK_EDOM,
                        "%s: a covariance is not finite or exceeds sqrt(q_i*q_j) (not PSD); the "
                        "in-place map overwrote it (TPK_MAP=reference names the entry)", phi->canon);
    return !bad || out == S;
}

static int map_sym(const tpk_phi *phi, const double *S, size_t n, double alpha, double beta,
                   double *out, int mirror, const tpk_gauss_ws *ws, double *err_max, tpk_ctx *ctx)
{
    if (err_max)
        *err_max = 0.0;
    if (!phi || (n && (!S || !out)))
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_gauss_map: phi, S and out are required");
    if (!isfinite(alpha) || !isfinite(beta))
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_gauss_map: affine coefficients must be finite");
    if (n == 0)
        return TPK_OK;
    map_plan P;
    int st = plan_kernel(phi, ws, &P, ctx);
    if (st)
        return st;
    index_prep ip;
    st = prep_alloc(&ip, phi, P.mk, ws, S, n + 1, n, "S diagonal", ctx);
    if (st)
        return st;
    P.r = P.c = &ip;
    P.alpha = alpha;
    P.beta = beta;
    const seg_fn seg = seg_for(P.mk);
    /* relu, lower triangle: the tuned kernel replaces the tile loop; the fix-ups below still run.
     * Mirrored maps stay on the tile loop, which writes both halves from one tile buffer: the
     * tuned kernel plus a transposing pass measured no faster (tuner/README.md). */
    const int tuned = !mirror && relu_tuned(phi, S, n, alpha, beta, out, &st, ctx);
    if (st) {
        prep_free(&ip);
        return st;
    }

    const size_t T = (n + TILE - 1) / TILE, ntiles = tuned ? 0 : T * (T + 1) / 2;
    const int stream = n * n * sizeof(double) >= STREAM_MIN_BYTES;
    map_fail fail = {0, 0, 0, 0.0};
    double maxr = 0.0, errmax = 0.0;
#pragma omp parallel for schedule(dynamic, 1) reduction(max : maxr, errmax) \
    if (n * n >= PAR_MIN_ENTRIES)
    for (size_t t = 0; t < ntiles; t++) {
        /* tile t ↦ (I, J), J ≤ I, row-major over the lower triangle of tiles */
        size_t I, Jt;
        tpk_lower_index(t, &I, &Jt);
        const size_t i0 = I * TILE, i1 = i0 + TILE < n ? i0 + TILE : n;
        const size_t j0 = Jt * TILE, j1 = j0 + TILE < n ? j0 + TILE : n;
        double buf[TILE * TILE];
        seg_stats stt = {0, 0.0, 0.0};
        for (size_t i = i0; i < i1; i++) {
            /* strictly below the diagonal; the diagonal comes from the scalar fix-up */
            const size_t jend = I == Jt ? i : j1;
            if (jend <= j0)
                continue;
            seg_stats s1 = {0, 0.0, 0.0};
            double *b = buf + (i - i0) * TILE;
            seg(&P, i, S + i * n + j0, j0, jend - j0, b, &s1);
            if (s1.bad)
                record_failure(&P, i, S + i * n + j0, j0, jend - j0, b, &fail);
            stt.maxr = s1.maxr > stt.maxr ? s1.maxr : stt.maxr;
            stt.errmax = s1.errmax > stt.errmax ? s1.errmax : stt.errmax;
        }
        /* write back: the lower block row by row, then the upper block (its transpose, made
         * contiguous in a second buffer so that both are written with full-vector stores) */
        for (size_t i = i0; i < i1; i++) {
            const size_t jend = I == Jt ? i : j1;
            if (jend > j0)
                store_row(out + i * n + j0, buf + (i - i0) * TILE, jend - j0, alpha, beta, stream);
        }
        double bt[TILE * TILE];
        for (size_t i = i0; mirror && i < i1; i++)
            for (size_t j = j0; j < (I == Jt ? i : j1); j++)
                bt[(j - j0) * TILE + (i - i0)] = buf[(i - i0) * TILE + (j - j0)];
        for (size_t j = j0; mirror && j < j1; j++) {
            const size_t ist = I == Jt ? j + 1 : i0;
            if (i1 > ist)
                store_row(out + j * n + ist, bt + (j - j0) * TILE + (ist - i0), i1 - ist, alpha,
                          beta, stream);
        }
        gv_store_fence();
        maxr = stt.maxr > maxr ? stt.maxr : maxr;
        errmax = stt.errmax > errmax ? stt.errmax : errmax;
    }
    if (fail.any) {
        st = report_failure(&P, &fail, ctx);
        prep_free(&ip);
        return st;
    }
    double err = vector_err(&P, ip.qmax, ip.qmax, maxr);
    err = errmax > err ? errmax : err;
    /* diagonal, then rows/columns of zero variance */
    for (size_t i = 0; i < n && !st; i++) {
        double v, e;
        st = fixup_entry(&P, ip.q[i], ip.q[i], ip.q[i], ip.q[i] > 0 ? 1.0 : 0.0, &v, &e, ctx);
        out[i * n + i] = alpha * v + beta;
        err = e > err ? e : err;
    }
    for (size_t i = 0; i < n && !st; i++) {
        if (ip.q[i] != 0)
            continue;
        for (size_t j = 0; j < n && !st; j++) {
            double v, e;
            if (j == i)
                continue;
            /* the PSD check passed, so the covariance of a zero-variance row is 0; a lower map
             * writes only its own triangle (as documented) */
            st = fixup_entry(&P, 0.0, ip.q[j], 0.0, 0.0, &v, &e, ctx);
            if (mirror || j < i)
                out[i * n + j] = alpha * v + beta;
            if (mirror || j > i)
                out[j * n + i] = alpha * v + beta;
            err = e > err ? e : err;
        }
    }
    prep_free(&ip);
    if (err_max)
        *err_max = fabs(alpha) * err;
    return st;
}

int tpk_gauss_map(const tpk_phi *phi, const double *S, size_t n, double *out,
                  const tpk_gauss_ws *ws, double *err_max, tpk_ctx *ctx)
{
    return map_sym(phi, S, n, 1.0, 0.0, out, 1, ws, err_max, ctx);
}

int tpk_gauss_map_affine(const tpk_phi *phi, const double *S, size_t n, double alpha, double beta,
                         double *out, const tpk_gauss_ws *ws, double *err_max, tpk_ctx *ctx)
{
    return map_sym(phi, S, n, alpha, beta, out, 1, ws, err_max, ctx);
}

int tpk_gauss_map_affine_lower(const tpk_phi *phi, const double *S, size_t n, double alpha,
                               double beta, double *out, const tpk_gauss_ws *ws, double *err_max,
                               tpk_ctx *ctx)
{
    /* half the stores and no transposed tiles: the map is memory-bound (perf: loads of S) */
    return map_sym(phi, S, n, alpha, beta, out, 0, ws, err_max, ctx);
}

/* ==== chains ============================================================================= */

/* A chain of maps, M ↦ α_L V_φL(… α_1 V_φ1(S) + β_1 …) + β_L, in one pass over the lower
 * triangle: each entry's recursion depends only on itself and the diagonals (theory.md §1.8:
 * an MLP layer maps (q_i, q_j, k_ij) to the next), so the diagonals are carried first (O(n) per
 * step) and each row segment then goes through every step in a cache-resident buffer. That is
 * one read and one write of the matrix instead of one of each per step (a map is memory-bound,
 * see map_sym). Only the vector kernels chain; a step of another kind, or a zero variance at
 * some step (its entries take the scalar fix-ups), runs the steps one by one through map_sym. */
static int chain_by_steps(const tpk_gauss_step *step, int ns, const double *S, size_t n,
                          double *out, const tpk_gauss_ws *ws, double *err_max, tpk_ctx *ctx)
{
    double e, emax = 0.0;
    int st = TPK_OK;
    for (int l = 0; l < ns && st == TPK_OK; l++) {
        st = map_sym(step[l].phi, l == 0 ? S : out, n, step[l].alpha, step[l].beta, out, 0, ws, &e,
                     ctx);
        emax = e > emax ? e : emax;
    }
    if (err_max)
        *err_max = emax;
    return st;
}

static int vector_kind(int mk)
{
    return mk == MK_ASIN || mk == MK_ABRELU || mk == MK_ARCCOS2 || mk == MK_GELU || mk == MK_EXPSQ ||
           mk == MK_GELU_D;
}

int tpk_gauss_map_chain_lower(const tpk_gauss_step *step, int nsteps, const double *S, size_t n,
                              double *out, const tpk_gauss_ws *ws, double *err_max, tpk_ctx *ctx)
{
    if (err_max)
        *err_max = 0.0;
    if (nsteps < 0 || nsteps > TPK_GAUSS_CHAIN_MAX || (nsteps && !step) || (n && (!S || !out)))
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_gauss_map_chain_lower: 0..%d steps, S and out are "
                         "required", TPK_GAUSS_CHAIN_MAX);
    for (int l = 0; l < nsteps; l++)
        if (!step[l].phi || !isfinite(step[l].alpha) || !isfinite(step[l].beta))
            return TPK_ERROR(ctx, TPK_EINVAL, "tpk_gauss_map_chain_lower: step %d needs a φ and "
                             "finite affine coefficients", l + 1);
    if (n == 0 || nsteps == 0) {
        for (size_t i = 0; out != S && i < n; i++)
            memmove(out + i * n, S + i * n, (i + 1) * sizeof *out);
        return TPK_OK;
    }
    if (nsteps == 1)
        return map_sym(step[0].phi, S, n, step[0].alpha, step[0].beta, out, 0, ws, err_max, ctx);
    map_plan P[TPK_GAUSS_CHAIN_MAX];
    index_prep ip[TPK_GAUSS_CHAIN_MAX];
    seg_fn seg[TPK_GAUSS_CHAIN_MAX];
    int np = 0, st = TPK_OK, chain = 1;
    double *q = tpk_malloc(ctx, n * sizeof *q);
    if (q == NULL)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory in tpk_gauss_map_chain_lower");
    for (size_t i = 0; i < n; i++)
        q[i] = S[i * n + i];
    double err = 0.0;
    /* the diagonal of every step, exactly as map_sym's scalar fix-up makes it */
    for (int l = 0; l < nsteps && st == TPK_OK && chain; l++) {
        if ((st = plan_kernel(step[l].phi, ws, &P[l], ctx)) != TPK_OK)
            break;
        chain = vector_kind(P[l].mk);
        if (!chain || (st = prep_alloc(&ip[l], step[l].phi, P[l].mk, ws, q, 1, n, "S diagonal",
                                       ctx)) != TPK_OK)
            break;
        np = l + 1;
        P[l].r = P[l].c = &ip[l];
        P[l].alpha = step[l].alpha;
        P[l].beta = step[l].beta;
        seg[l] = seg_for(P[l].mk);
        for (size_t i = 0; i < n && st == TPK_OK && chain; i++) {
            double v, e;
            chain = q[i] > 0;
            if (chain && (st = fixup_entry(&P[l], q[i], q[i], q[i], 1.0, &v, &e, ctx)) == TPK_OK)
                q[i] = step[l].alpha * v + step[l].beta;
            err = e > err ? e : err;
        }
    }
    if (st != TPK_OK || !chain) {
        for (int l = 0; l < np; l++)
            prep_free(&ip[l]);
        tpk_free(ctx, q);
        return st != TPK_OK ? st : chain_by_steps(step, nsteps, S, n, out, ws, err_max, ctx);
    }
    const int stream = n * n * sizeof(double) >= STREAM_MIN_BYTES;
    map_fail fail[TPK_GAUSS_CHAIN_MAX];
    memset(fail, 0, sizeof fail);
    double maxr[TPK_GAUSS_CHAIN_MAX] = {0};
#pragma omp parallel if (n * n >= PAR_MIN_ENTRIES)
    {
        double my_maxr[TPK_GAUSS_CHAIN_MAX] = {0};
#pragma omp for schedule(dynamic, 8)
        for (size_t i = 1; i < n; i++) {
            double a[TILE], b[TILE];
            for (size_t j0 = 0; j0 < i; j0 += TILE) {
                const size_t len = j0 + TILE < i ? TILE : i - j0;
                memcpy(a, S + i * n + j0, len * sizeof *a);
                for (int l = 0; l < nsteps; l++) {
                    seg_stats s1 = {0, 0.0, 0.0};
                    seg[l](&P[l], i, a, j0, len, b, &s1);
                    if (s1.bad)
                        record_failure(&P[l], i, a, j0, len, b, &fail[l]);
                    my_maxr[l] = s1.maxr > my_maxr[l] ? s1.maxr : my_maxr[l];
                    if (l + 1 < nsteps)
                        store_row(a, b, len, step[l].alpha, step[l].beta, 0);
                    else
                        store_row(out + i * n + j0, b, len, step[l].alpha, step[l].beta, stream);
                }
            }
        }
        gv_store_fence();
#pragma omp critical(tpk_gauss_chain_maxr)
        for (int l = 0; l < nsteps; l++)
            maxr[l] = my_maxr[l] > maxr[l] ? my_maxr[l] : maxr[l];
    }
    for (int l = 0; l < nsteps && st == TPK_OK; l++) {
        if (fail[l].any) {
            /* the first step that failed names its entry; later steps saw what it made */
            tpk_ctx local;
            tpk_ctx_init_from(&local, ctx);
            st = report_failure(&P[l], &fail[l], &local);
            st = TPK_ERROR(ctx, st, "step %d of %d: %s", l + 1, nsteps, local.msg);
        }
        double e = fabs(step[l].alpha) * vector_err(&P[l], ip[l].qmax, ip[l].qmax, maxr[l]);
        err = e > err ? e : err;
    }
    for (size_t i = 0; st == TPK_OK && i < n; i++)
        out[i * n + i] = q[i];
    for (int l = 0; l < nsteps; l++)
        prep_free(&ip[l]);
    tpk_free(ctx, q);
    if (err_max && st == TPK_OK)
        *err_max = err;
    return st;
}

int tpk_gauss_map_cross(const tpk_phi *phi, const double *qa, size_t m, const double *qb,
                        size_t n, const double *C, double *out, const tpk_gauss_ws *ws,
                        double *err_max, tpk_ctx *ctx)
{
    if (err_max)
        *err_max = 0.0;
    if (!phi || (m && !qa) || (n && !qb) || (m && n && (!C || !out)))
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_gauss_map_cross: phi, qa, qb, C and out are required");
    if (m == 0 || n == 0)
        return TPK_OK;
    map_plan P;
    int st = plan_kernel(phi, ws, &P, ctx);
    if (st)
        return st;
    index_prep ra, ca;
    st = prep_alloc(&ra, phi, P.mk, ws, qa, 1, m, "qa", ctx);
    if (st)
        return st;
    st = prep_alloc(&ca, phi, P.mk, ws, qb, 1, n, "qb", ctx);
    if (st) {
        prep_free(&ra);
        return st;
    }
    P.r = &ra;
    P.c = &ca;
    P.alpha = 1.0;
    const seg_fn seg = seg_for(P.mk);
    map_fail fail = {0, 0, 0, 0.0};
    double maxr = 0.0, errmax = 0.0;
#pragma omp parallel for schedule(dynamic, 4) reduction(max : maxr, errmax) \
    if (m * n >= PAR_MIN_ENTRIES)
    for (size_t i = 0; i < m; i++) {
        double buf[TILE];
        for (size_t j0 = 0; j0 < n; j0 += TILE) {
            const size_t len = j0 + TILE < n ? TILE : n - j0;
            seg_stats s1 = {0, 0.0, 0.0};
            /* through a buffer: out may alias C */
            seg(&P, i, C + i * n + j0, j0, len, buf, &s1);
            if (s1.bad)
                record_failure(&P, i, C + i * n + j0, j0, len, buf, &fail);
            memcpy(out + i * n + j0, buf, len * sizeof *buf);
            maxr = s1.maxr > maxr ? s1.maxr : maxr;
            errmax = s1.errmax > errmax ? s1.errmax : errmax;
        }
    }
    if (fail.any) {
        st = report_failure(&P, &fail, ctx);
    } else {
        double err = vector_err(&P, ra.qmax, ca.qmax, maxr);
        err = errmax > err ? errmax : err;
        /* zero-variance rows, then zero-variance columns (O((m + n)·#zeros), not O(mn)) */
        for (size_t i = 0; i < m && !st; i++)
            for (size_t j = 0; ra.q[i] == 0 && j < n && !st; j++) {
                double v, e;
                st = fixup_entry(&P, 0.0, ca.q[j], 0.0, 0.0, &v, &e, ctx);
                out[i * n + j] = v;
                err = e > err ? e : err;
            }
        for (size_t j = 0; j < n && !st; j++)
            for (size_t i = 0; ca.q[j] == 0 && i < m && !st; i++) {
                double v, e;
                st = fixup_entry(&P, ra.q[i], 0.0, 0.0, 0.0, &v, &e, ctx);
                out[i * n + j] = v;
                err = e > err ? e : err;
            }
        if (err_max)
            *err_max = err;
    }
    prep_free(&ra);
    prep_free(&ca);
    return st;
}

/* ==== row segments (tpk_gauss_segmap) ===================================================== */

struct tpk_gauss_segmap {
    map_plan P;
    index_prep ip;
    seg_fn seg;
    int any_zero; /* some variance is 0: segments fix those entries up */
    int zero_phi0; /* and φ(0) = 0: an entry with a zero variance is exactly 0 (that variable is
                    * the constant 0), no scalar evaluation (images' blank borders, 3×3 patches
                    * of zeros: 8 of 10 fix-ups of a Fashion-MNIST CNN kernel) */
    double *zval; /* some variance 0 and φ(0) ≠ 0: V(0, q_j, 0) = φ(0)·E φ(v_j) per index j, the
                   * entries of a zero variance against j (then their error bounds, n more);
                   * NaN where the scalar path failed (it reports at use). NULL otherwise */
    double *diag; /* vector kernels: V(q_i, q_i, q_i) of every positive variance, computed at
                   * preparation by the vector kernel (ρ = 1 exactly: the snap), once per index
                   * instead of once per segment by the scalar path; NULL for the other kernels */
    double diag_maxr; /* their largest |asin argument|, for the error bound of segments of them */
    map_fail fail;
    double maxr, errmax;
    tpk_allocator al;
};

tpk_gauss_segmap *tpk_gauss_segmap_alloc(const tpk_phi *phi, const double *q, size_t n,
                                         const tpk_gauss_ws *ws, tpk_ctx *ctx)
{
    if (!phi || (n && !q)) {
        TPK_ERROR(ctx, TPK_EINVAL, "tpk_gauss_segmap_alloc: phi and q are required");
        return NULL;
    }
    tpk_gauss_segmap *sm = tpk_calloc(ctx, 1, sizeof *sm);
    if (!sm) {
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory in tpk_gauss_segmap_alloc");
        return NULL;
    }
    sm->al = tpk_ctx_allocator(ctx);
    if (plan_kernel(phi, ws, &sm->P, ctx) ||
        prep_alloc(&sm->ip, phi, sm->P.mk, ws, q, 1, n, "S diagonal", ctx)) {
        tpk_mem_free(&sm->al, sm);
        return NULL;
    }
    sm->P.r = sm->P.c = &sm->ip;
    sm->P.alpha = 1.0;
    sm->seg = seg_for(sm->P.mk);
    for (size_t i = 0; i < n && !sm->any_zero; i++)
        sm->any_zero = q[i] == 0;
    sm->zero_phi0 = sm->any_zero && tpk_phi_eval(phi, 0.0) == 0.0;
    if (sm->any_zero && !sm->zero_phi0) { /* once per index, not once per entry */
        if (!(sm->zval = tpk_malloc(ctx, 2 * n * sizeof *sm->zval))) {
            tpk_gauss_segmap_free(sm);
            TPK_ERROR(ctx, TPK_ENOMEM, "out of memory in tpk_gauss_segmap_alloc");
            return NULL;
        }
        for (size_t j = 0; j < n; j++) {
            double v = 0.0, e = 0.0;
            if (fixup_entry(&sm->P, 0.0, q[j], 0.0, 0.0, &v, &e, NULL))
                v = NAN;
            sm->zval[j] = v;
            sm->zval[n + j] = e;
        }
    }
    if (sm->P.mk < MK_SCALAR && n > 0) {
        if (!(sm->diag = tpk_malloc(ctx, n * sizeof *sm->diag))) {
            tpk_gauss_segmap_free(sm);
            TPK_ERROR(ctx, TPK_ENOMEM, "out of memory in tpk_gauss_segmap_alloc");
            return NULL;
        }
        seg_stats s1 = {0, 0.0, 0.0};
        band_map(&sm->P, 0, q, 0, n, sm->diag, &s1);
        sm->diag_maxr = s1.maxr;
        /* a zero variance, a value that failed a check, or one below the smallest normal
         * double (the scalar path reports the kernel's underflow) takes the scalar path at use */
        for (size_t i = 0; i < n; i++)
            if (q[i] == 0 || !(fabs(sm->diag[i]) >= DBL_MIN && fabs(sm->diag[i]) <= DBL_MAX))
                sm->diag[i] = NAN;
    }
    return sm;
}

/* The diagonal entry (i, i): the prepared value, else the scalar path; a failure is recorded
 * (k: where the caller's covariance of the entry is, for the message). */
static double segmap_diag(tpk_gauss_segmap *sm, size_t i, const double *k, double *errmax)
{
    if (sm->diag && !isnan(sm->diag[i]))
        return sm->diag[i];
    double v = 0.0, e = 0.0;
    const double qi = sm->P.r->q[i];
    if (qi == 0 && sm->zero_phi0)
        return 0.0;
    if (qi == 0 && sm->zval && !isnan(sm->zval[i])) {
        *errmax = sm->zval[sm->ip.len + i] > *errmax ? sm->zval[sm->ip.len + i] : *errmax;
        return sm->zval[i];
    }
    if (fixup_entry(&sm->P, qi, qi, qi, qi > 0 ? 1.0 : 0.0, &v, &e, NULL)) {
        v = NAN; /* record_failure keeps it; report_failure says why */
        record_failure(&sm->P, i, k, i, 1, &v, &sm->fail);
    }
    *errmax = e > *errmax ? e : *errmax;
    return v;
}

/* An entry (i, j), i ≠ j, with a zero variance, by the scalar path. */
static double segmap_zero(tpk_gauss_segmap *sm, size_t i, size_t j, const double *k,
                          double *errmax)
{
    double v = 0.0, e = 0.0;
    if (sm->zero_phi0)
        return 0.0;
    const size_t other = sm->P.r->q[i] == 0 ? j : i; /* V(0, q, 0) is symmetric */
    if (sm->zval && !isnan(sm->zval[other])) {
        const double eo = sm->zval[sm->ip.len + other];
        *errmax = eo > *errmax ? eo : *errmax;
        return sm->zval[other];
    }
    if (fixup_entry(&sm->P, sm->P.r->q[i], sm->P.c->q[j], 0.0, 0.0, &v, &e, NULL)) {
        v = NAN;
        record_failure(&sm->P, i, k, j, 1, &v, &sm->fail);
    }
    *errmax = e > *errmax ? e : *errmax;
    return v;
}

int tpk_gauss_segmap_diagonal(tpk_gauss_segmap *sm, double *out, tpk_ctx *ctx)
{
    double errmax = 0.0;
    for (size_t i = 0; i < sm->ip.len; i++)
        out[i] = segmap_diag(sm, i, &sm->ip.q[i], &errmax);
    return sm->fail.any ? report_failure(&sm->P, &sm->fail, ctx) : TPK_OK;
}

void tpk_gauss_segmap_band(tpk_gauss_segmap *sm, size_t i0, size_t j0, size_t len,
                           const double *k, double *out, double *maxr, double *errmax)
{
    double buf[TILE];
    const map_plan *P = &sm->P;
    for (size_t o = 0; o < len; o += TILE) {
        const size_t l = len - o < TILE ? len - o : TILE, i = i0 + o, j = j0 + o;
        seg_stats s1 = {0, 0.0, 0.0};
        if (i == j) { /* the diagonal itself */
            for (size_t t = 0; t < l; t++)
                buf[t] = segmap_diag(sm, i + t, k + o + t, errmax);
            memcpy(out + o, buf, l * sizeof *buf);
            *maxr = sm->diag_maxr > *maxr ? sm->diag_maxr : *maxr;
            continue;
        }
        if (!band_map(P, i, k + o, j, l, buf, &s1))
            for (size_t t = 0; t < l; t++)
                sm->seg(P, i + t, k + o + t, j + t, 1, buf + t, &s1);
        if (s1.bad)
            for (size_t t = 0; t < l; t++)
                record_failure(P, i + t, k + o + t, j + t, 1, buf + t, &sm->fail);
        if (sm->zero_phi0) { /* branch-free, so that it vectorises */
            const double *qi = P->r->q + i, *qj = P->c->q + j;
            for (size_t t = 0; t < l; t++)
                buf[t] = qi[t] == 0 || qj[t] == 0 ? 0.0 : buf[t];
        } else if (sm->any_zero) {
            for (size_t t = 0; t < l; t++)
                if (P->r->q[i + t] == 0 || P->c->q[j + t] == 0)
                    buf[t] = segmap_zero(sm, i + t, j + t, k + o + t, errmax);
        }
        memcpy(out + o, buf, l * sizeof *buf);
        *maxr = s1.maxr > *maxr ? s1.maxr : *maxr;
        *errmax = s1.errmax > *errmax ? s1.errmax : *errmax;
    }
}

/* Built with the kernels' flags (Makefile: -march, -O3) where the framework's sources are not:
 * the sums around the maps in an orchestrated kernel are as wide as the maps. No contraction into
 * FMA (-std=c11 turns it off), so each entry rounds as the scalar loop's. */
void tpk_gauss_seg_axpy(size_t len, double c, const double *w, const double *x, double *y)
{
    if (w != NULL)
        for (size_t j = 0; j < len; j++)
            y[j] += c * w[j] * x[j];
    else
        for (size_t j = 0; j < len; j++)
            y[j] += c * x[j];
}

void tpk_gauss_seg_affine(size_t len, double alpha, double beta, double *y)
{
    for (size_t j = 0; j < len; j++)
        y[j] = alpha * y[j] + beta;
}

void tpk_gauss_segmap_row(tpk_gauss_segmap *sm, size_t i, size_t j0, size_t len, const double *k,
                          double *out, double *maxr, double *errmax)
{
    double buf[TILE];
    const map_plan *P = &sm->P;
    for (size_t o = 0; o < len; o += TILE) {
        const size_t l = len - o < TILE ? len - o : TILE;
        seg_stats s1 = {0, 0.0, 0.0};
        sm->seg(P, i, k + o, j0 + o, l, buf, &s1);
        if (s1.bad)
            record_failure(P, i, k + o, j0 + o, l, buf, &sm->fail);
        /* the diagonal and zero variances by the scalar path (as map_sym's fix-ups) */
        const size_t a = j0 + o, b = a + l;
        if (i >= a && i < b)
            buf[i - a] = segmap_diag(sm, i, k + o + (i - a), errmax);
        if (sm->any_zero)
            for (size_t j = a; j < b; j++)
                if (j != i && (P->r->q[i] == 0 || P->c->q[j] == 0))
                    buf[j - a] = segmap_zero(sm, i, j, k + o + (j - a), errmax);
        memcpy(out + o, buf, l * sizeof *buf);
        *maxr = s1.maxr > *maxr ? s1.maxr : *maxr;
        *errmax = s1.errmax > *errmax ? s1.errmax : *errmax;
    }
}

void tpk_gauss_segmap_merge(tpk_gauss_segmap *sm, double maxr, double errmax)
{
#pragma omp critical(tpk_gauss_segmap_merge)
    {
        sm->maxr = maxr > sm->maxr ? maxr : sm->maxr;
        sm->errmax = errmax > sm->errmax ? errmax : sm->errmax;
    }
}

int tpk_gauss_segmap_finish(tpk_gauss_segmap *sm, double *err_max, tpk_ctx *ctx)
{
    if (err_max)
        *err_max = 0.0;
    if (sm->fail.any)
        return report_failure(&sm->P, &sm->fail, ctx);
    const double e = vector_err(&sm->P, sm->ip.qmax, sm->ip.qmax, sm->maxr);
    if (err_max)
        *err_max = e > sm->errmax ? e : sm->errmax;
    return TPK_OK;
}

void tpk_gauss_segmap_reset(tpk_gauss_segmap *sm)
{
    memset(&sm->fail, 0, sizeof sm->fail);
    sm->maxr = sm->errmax = 0.0;
}

void tpk_gauss_segmap_free(tpk_gauss_segmap *sm)
{
    if (!sm)
        return;
    prep_free(&sm->ip);
    tpk_allocator al = sm->al;
    tpk_mem_free(&al, sm->diag);
    tpk_mem_free(&al, sm->zval);
    tpk_mem_free(&al, sm);
}

/* ==== test hooks ========================================================================= */

void tpk__gauss_asin_array(const double *x, double *y, double *w, size_t n)
{
    size_t i = 0;
    gv wv;
    for (; i + GV_LANES <= n; i += GV_LANES) {
        gv_store(y + i, gv_asin_w(gv_load(x + i), &wv));
        gv_store(w + i, wv);
    }
    if (i < n) {
        double t[GV_LANES] = {0}, tw[GV_LANES];
        for (size_t l = 0; i + l < n; l++)
            t[l] = x[i + l];
        gv_store(t, gv_asin_w(gv_load(t), &wv));
        gv_store(tw, wv);
        for (size_t l = 0; i + l < n; l++) {
            y[i + l] = t[l];
            w[i + l] = tw[l];
        }
    }
}

const char *tpk__gauss_simd_isa(void) { return GV_ISA; }
