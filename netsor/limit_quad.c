/* Limit evaluator, stage 6 — quadrature (theory.md §1.6, §3.3): the per-thread workspace of one
 * product expectation, the Gauss–Hermite rules for N(0, 1), and the back end of last resort for
 * a group of factors: eigen-decompose its covariance (clipped at 0: Σ may be singular, §1.6),
 * then tensor Gauss–Hermite on the kept directions (rank ≤ max_gh_dim, two degrees whose
 * difference is the error), else randomised QMC or plain Monte Carlo with a standard error. */
#include <math.h>
#include <stdlib.h>

#include <gsl/gsl_integration.h>
#include <lapacke.h>

#include "limit-impl.h"
#include "tpk/alloc.h"
#include "tpk/rng.h"

/* Eigenvalues below this fraction of the largest are treated as 0 (Σ may be singular, §1.6). */
#define RANK_TOL 1e-12

/* A thread's workspace (nsr_lim_pws_free(NULL) is a no-op). */
void nsr_lim_pws_free(pws *w)
{
    if (w == NULL)
        return;
    tpk_free(&w->ctx, w->dg);
    tpk_free(&w->ctx, w->da);
    tpk_free(&w->ctx, w->nodedim);
    tpk_free(&w->ctx, w->sv);
    tpk_free(&w->ctx, w->gv);
    tpk_free(&w->ctx, w->C);
    tpk_free(&w->ctx, w->m);
    tpk_free(&w->ctx, w->sub);
    tpk_free(&w->ctx, w->lam);
    tpk_free(&w->ctx, w->V);
    tpk_free(&w->ctx, w->scaled);
    tpk_free(&w->ctx, w->parent);
    tpk_free(&w->ctx, w->gdims);
    tpk_free(&w->ctx, w->gfacs);
    tpk_free(&w->ctx, w->loc);
    tpk_free(&w->ctx, w->z);
    tpk_free(&w->ctx, w->stack);
    tpk_free(&w->ctx, w->fv);
    tpk_free(&w->ctx, w->prod);
    tpk_free(&w->ctx, w->xs);
    tpk_free(&w->ctx, w->xb);
    tpk_free(&w->ctx, w->aff);
    tpk_allocator al = w->ctx.alloc;
    tpk_mem_free(&al, w);
}

pws *nsr_lim_pws_alloc(const lim *L)
{
    /* per thread: errors go to w->ctx, never to L->ctx (the caller reports) */
    const tpk_allocator al = tpk_ctx_allocator(L->ctx);
    pws *w = tpk_mem_calloc(&al, 1, sizeof *w, NULL);
    if (w == NULL)
        return NULL;
    int nodes = 2 * L->maxlen + 2; /* leaves of both sides */
    size_t D = (size_t)nodes;
    w->maxd = nodes;
    tpk_ctx_init_from(&w->ctx, L->ctx);
    w->dg = tpk_malloc(&w->ctx, D * sizeof *w->dg);
    w->da = tpk_malloc(&w->ctx, D * sizeof *w->da);
    w->nodedim = tpk_malloc(&w->ctx, D * sizeof *w->nodedim);
    w->sv = tpk_malloc(&w->ctx, D * sizeof *w->sv);
    w->gv = tpk_malloc(&w->ctx, D * sizeof *w->gv);
    w->C = tpk_malloc(&w->ctx, D * D * sizeof *w->C);
    w->m = tpk_malloc(&w->ctx, D * sizeof *w->m);
    w->sub = tpk_malloc(&w->ctx, D * D * sizeof *w->sub);
    w->lam = tpk_malloc(&w->ctx, D * sizeof *w->lam);
    w->V = tpk_malloc(&w->ctx, D * D * sizeof *w->V);
    w->scaled = tpk_malloc(&w->ctx, D * D * sizeof *w->scaled);
    w->parent = tpk_malloc(&w->ctx, D * sizeof *w->parent);
    w->gdims = tpk_malloc(&w->ctx, D * sizeof *w->gdims);
    w->gfacs = tpk_malloc(&w->ctx, (2 * MAXF + 2) * sizeof *w->gfacs);
    w->loc = tpk_malloc(&w->ctx, D * sizeof *w->loc);
    w->z = tpk_malloc(&w->ctx, D * BLK * sizeof *w->z);
    w->stack = tpk_malloc(&w->ctx, (size_t)L->maxdepth * BLK * sizeof *w->stack);
    w->fv = tpk_malloc(&w->ctx, BLK * sizeof *w->fv);
    w->prod = tpk_malloc(&w->ctx, BLK * sizeof *w->prod);
    w->xs = tpk_malloc(&w->ctx, D * sizeof *w->xs);
    w->xb = tpk_malloc(&w->ctx, D * TPK_QMC_BLOCK * sizeof *w->xb);
    w->aff = tpk_malloc(&w->ctx, D * sizeof *w->aff);
    if (!w->xs || !w->xb || !w->aff || !w->dg || !w->da || !w->nodedim || !w->sv || !w->gv || !w->C || !w->m || !w->sub ||
        !w->lam || !w->V || !w->scaled || !w->parent || !w->gdims || !w->gfacs || !w->loc ||
        !w->z || !w->stack || !w->fv || !w->prod) {
        nsr_lim_pws_free(w);
        return NULL;
    }
    return w;
}

/* Evaluate Π_{f in group} f at BLK points whose dims are in w->z (group-local layout via
 * w->loc), accumulating Σ weight·value. */
static void eval_group_block(pws *w, const fac *fs, const int *nodeoff, const int *gf, int ngf,
                             size_t B, double *out)
{
    for (size_t b = 0; b < B; b++)
        out[b] = 1.0;
    for (int q = 0; q < ngf; q++) {
        const fac *f = &fs[gf[q]];
        int off = nodeoff[gf[q]];
        for (int i = 0; i < f->len; i++)
            if (f->node[i].op == TPK_RPN_GVAR)
                w->gv[off + i] = w->z + (size_t)w->loc[w->nodedim[off + i]] * BLK;
        tpk_nsr_rpn_eval(f->node, f->len, w->gv + off, w->sv + off, B, w->stack, w->fv);
        for (size_t b = 0; b < B; b++)
            out[b] *= w->fv[b];
    }
}

_Static_assert(BLK <= TPK_QMC_BLOCK, "a block of points is one tpk_nsr_qmc_next_block call");

/* The block's B points from coordinate-major normals x[j·TPK_QMC_BLOCK + b] (the QMC path):
 * z_k = m_k + Σ_j V_kj √λ_j x_j, as support_point sums it, along the points. */
static void support_block(pws *w, int nd, int r, const double *x, size_t B)
{
    for (int k = 0; k < nd; k++) {
        double *zk = w->z + (size_t)k * BLK, mk = w->m[w->gdims[k]];
        for (size_t b = 0; b < B; b++)
            zk[b] = mk;
        for (int j = 0; j < r; j++) {
            const double s = w->scaled[k * r + j], *xj = x + (size_t)j * TPK_QMC_BLOCK;
            for (size_t b = 0; b < B; b++)
                zk[b] += s * xj[b];
        }
    }
}

/* Point b of the block: z_k = m_k + Σ_j V_kj √λ_j x_j for the group's nd dims. */
static void support_point(pws *w, int nd, int r, const double *x, size_t b)
{
    for (int k = 0; k < nd; k++) {
        double zk = w->m[w->gdims[k]];
        for (int j = 0; j < r; j++)
            zk += w->scaled[k * r + j] * x[j];
        w->z[(size_t)k * BLK + b] = zk;
    }
}

/* Expectation of a group over its r-dimensional support z = m + V·√λ·x, x ~ N(0, I_r):
 * tensor Gauss–Hermite (two degrees, difference = error) or Monte Carlo (standard error). */
static void group_numeric(const lim *L, pws *w, const fac *fs, const int *nodeoff, const int *gf,
                          int ngf, int nd, int r, uint64_t site, tpk_estimate *est)
{
    /* w->scaled[k*r + j] = V[k][j]·√λ_j for the r kept eigen-directions */
    int use_mc = L->o.force_mc || r > (L->o.max_gh_dim ? L->o.max_gh_dim : 4) || r > GH_MAXDIM;
    if (!use_mc) {
        double val[2];
        for (int h = 0; h < 2; h++) {
            const ghrule *g = &L->gh[r][h];
            size_t npts = 1;
            for (int j = 0; j < r; j++)
                npts *= (size_t)g->n;
            double acc = 0.0;
            for (size_t p0 = 0; p0 < npts; p0 += BLK) {
                size_t B = npts - p0 < BLK ? npts - p0 : BLK;
                double wt[BLK];
                for (size_t b = 0; b < B; b++) {
                    size_t idx = p0 + b;
                    double x[GH_MAXDIM];
                    wt[b] = 1.0;
                    for (int j = 0; j < r; j++) {
                        size_t ij = idx % (size_t)g->n;
                        idx /= (size_t)g->n;
                        x[j] = g->x[ij];
                        wt[b] *= g->w[ij];
                    }
                    support_point(w, nd, r, x, b);
                }
                eval_group_block(w, fs, nodeoff, gf, ngf, B, w->prod);
                for (size_t b = 0; b < B; b++)
                    acc += wt[b] * w->prod[b];
            }
            val[h] = acc;
        }
        est->value = val[0];
        est->err = fabs(val[0] - val[1]);
        return;
    }
    size_t M = L->o.mc_samples ? L->o.mc_samples : MC_DEFAULT;
    uint64_t stream = TPK_RNG_STREAM(TPK_RNG_MC, (uint32_t)site);
    uint64_t seed = L->o.mc_seed ^ (site >> 32) * UINT64_C(0x9E3779B97F4A7C15);
    double s1 = 0.0, s2 = 0.0;
    if (!L->o.force_mc) {
        /* randomised QMC (netsor/limit_orthant.c): QMC_SHIFTS shifted lattices of M/QMC_SHIFTS
         * points, the standard error over the shifts (theory §3.3: ~M⁻¹ for smooth integrands) */
        size_t Ms = (M + QMC_SHIFTS - 1) / QMC_SHIFTS;
        uint64_t qseed = seed ^ (uint64_t)stream;
        tpk_qmc *g = tpk_nsr_qmc_alloc(r, &w->ctx);
        if (g == NULL) { /* no error channel here: an infinite error estimate says it */
            est->value = 0.0;
            est->err = HUGE_VAL;
            return;
        }
        for (int sh = 0; sh < QMC_SHIFTS; sh++) {
            double acc = 0.0;
            tpk_nsr_qmc_start(g, qseed, sh);
            for (size_t p0 = 0; p0 < Ms; p0 += BLK) {
                size_t B = Ms - p0 < BLK ? Ms - p0 : BLK;
                /* the block's normals at once (BLK ≤ TPK_QMC_BLOCK): Φ⁻¹ over all B·r */
                tpk_nsr_qmc_next_block(g, B, w->xb);
                support_block(w, nd, r, w->xb, B);
                eval_group_block(w, fs, nodeoff, gf, ngf, B, w->prod);
                for (size_t b = 0; b < B; b++)
                    acc += w->prod[b];
            }
            acc /= (double)Ms;
            s1 += acc;
            s2 += acc * acc;
        }
        tpk_nsr_qmc_free(g);
        double mean = s1 / QMC_SHIFTS, var = (s2 - QMC_SHIFTS * mean * mean) / (QMC_SHIFTS - 1);
        est->value = mean;
        est->err = var > 0 ? sqrt(var / QMC_SHIFTS) : 0.0;
        return;
    }
    for (size_t p0 = 0; p0 < M; p0 += BLK) {
        size_t B = M - p0 < BLK ? M - p0 : BLK;
        for (size_t b = 0; b < B; b++) {
            double *x = w->xs;
            for (int j = 0; j < r; j++)
                x[j] = tpk_rng_normal_at(seed, stream, (uint32_t)(p0 + b), (uint32_t)j);
            support_point(w, nd, r, x, b);
        }
        eval_group_block(w, fs, nodeoff, gf, ngf, B, w->prod);
        for (size_t b = 0; b < B; b++) {
            s1 += w->prod[b];
            s2 += w->prod[b] * w->prod[b];
        }
    }
    double mean = s1 / (double)M;
    double var = s2 / (double)M - mean * mean;
    est->value = mean;
    est->err = var > 0 ? sqrt(var / (double)M) : 0.0;
}

/* Gauss–Hermite rules for N(0,1) from GSL's e^{−x²} rule: x → √2 x, w → w/√π. */
int nsr_lim_gh_init(lim *L)
{
    if (L->gh_ready)
        return TPK_OK;
    L->gh_ready = 1;
    /* the library's 1-/2-D rules; closed-form fast paths never need them */
    L->gws = tpk_gauss_ws_alloc(TPK_GAUSS_DEFAULT_DEGREE, L->ctx);
    if (L->gws == NULL)
        return L->ctx && L->ctx->status ? L->ctx->status : TPK_ENOMEM;
    static const int deg[GH_MAXDIM + 1][2] = {{1, 1}, {96, 64}, {64, 44}, {28, 20},
                                              {16, 12}, {8, 6},  {6, 4}};
    for (int r = 1; r <= GH_MAXDIM; r++)
        for (int h = 0; h < 2; h++) {
            int n = deg[r][h];
            ghrule *g = &L->gh[r][h];
            gsl_integration_fixed_workspace *ws =
                gsl_integration_fixed_alloc(gsl_integration_fixed_hermite, (size_t)n, 0.0, 1.0, 0.0, 0.0);
            g->x = tpk_malloc(L->ctx, (size_t)n * sizeof *g->x);
            g->w = tpk_malloc(L->ctx, (size_t)n * sizeof *g->w);
            if (ws == NULL || g->x == NULL || g->w == NULL) {
                gsl_integration_fixed_free(ws);
                return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory for Gauss–Hermite rules");
            }
            const double *x = gsl_integration_fixed_nodes(ws), *w = gsl_integration_fixed_weights(ws);
            double sw = 0.0;
            for (int i = 0; i < n; i++)
                sw += w[i];
            for (int i = 0; i < n; i++) {
                g->x[i] = 1.41421356237309504880 * x[i];
                g->w[i] = w[i] / sw;
            }
            g->n = n;
            gsl_integration_fixed_free(ws);
        }
    return TPK_OK;
}

/* The quadrature back end: always applicable, last in the table. The group's covariance is
 * eigen-decomposed and clipped at 0 (§1.6); rank 0 is a point evaluation at the means, rank r a
 * tensor Gauss–Hermite or (Q)MC integral over the kept directions (group_numeric). */
int nsr_lim_quad_group(const lim *L, nsr_lim_query *q)
{
    pws *w = q->w;
    int nd = q->nd, D = q->D;
    for (int i = 0; i < nd; i++)
        for (int j = 0; j < nd; j++)
            w->V[i * nd + j] = w->C[w->gdims[i] * D + w->gdims[j]];
    if (nd == 1) {
        w->lam[0] = w->V[0];
        w->V[0] = 1.0;
    } else if (LAPACKE_dsyev(LAPACK_ROW_MAJOR, 'V', 'U', nd, w->V, nd, w->lam) != 0) {
        return TPK_ERROR(&w->ctx, TPK_ENUMERIC,
                         "eigen-decomposition of a %d×%d covariance failed", nd, nd);
    }
    double lmax = 0.0;
    for (int j = 0; j < nd; j++)
        if (w->lam[j] > lmax)
            lmax = w->lam[j];
    int r = 0;
    for (int j = 0; j < nd; j++)
        if (w->lam[j] > RANK_TOL * lmax && w->lam[j] > 0.0) {
            double s = sqrt(w->lam[j]);
            for (int k = 0; k < nd; k++)
                w->sub[k * nd + r] = w->V[k * nd + j] * s;
            r++;
        }
    for (int k = 0; k < nd; k++)
        for (int j = 0; j < r; j++)
            w->scaled[k * r + j] = w->sub[k * nd + j];
    if (r == 0) {
        for (int k = 0; k < nd; k++)
            w->z[(size_t)k * BLK] = w->m[w->gdims[k]];
        eval_group_block(w, q->fs, q->nodeoff, q->gf, q->ngf, 1, w->prod);
        q->e.value = w->prod[0];
    } else {
        group_numeric(L, w, q->fs, q->nodeoff, q->gf, q->ngf, nd, r, q->site, &q->e);
    }
    return TPK_OK;
}
