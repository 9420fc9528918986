/* Joint sampler of the limit evaluator (issue 19): expectations of high-dimensional products of
 * factors — an LSTM's E[tanh(c^t_a) tanh(c^s_c)], a (3t + 3s)-dimensional Gaussian integral for
 * every pair of inputs (a, c) and of steps (t, s), theory.md §2.4 — from one randomised QMC
 * sample of the limit Gaussians that all of them share.
 *
 * The per-entry way (netsor/limit.c group_numeric) draws a fresh sample for each pair, and so
 * evaluates the long body of tanh(c^t) (3t G-vars) again for every (a, c, s). Here a G-var at an
 * input is a coordinate of ONE sample over the whole evaluation: the first time it is used it is
 * appended and drawn conditionally on every coordinate before it (its row of the Cholesky factor
 * of their covariance, in order of first use), so earlier coordinates never change, and a factor's
 * values on the sample, once computed, are kept and stay consistent with any later factor. Then
 * E[f g] for a pair of kept factors is a mean of products.
 *
 * The points: R random shifts of M = 2^b points — the lattice rule of netsor/limit_orthant.c in
 * the first coordinates, stratified coordinates beyond (coord) — tent-transformed; normals by
 * Φ⁻¹ (kernels/mvn_sov.c). The estimate is the mean over the shifts, the error their standard
 * error. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend-impl.h"
#include "joint-impl.h"
#include "orthant-impl.h"
#include "tpk/alloc.h"
#include "tpk/gemm.h"
#include "tpk/mvn.h"
#include "tpk/rng.h"

/* A conditional variance below this fraction of the largest variance is zero: the coordinate is
 * a linear function of the earlier ones. */
#define DEGEN_TOL 1e-12
/* Points per block of the sample (the RPN evaluation's block). */
#define BLKP 256
/* Work (points × groups) below which the means of products are not split over threads: short
 * parallel regions cost more than they save, on a shared machine most. */
#define PAR_MIN ((size_t)1 << 20)
/* Streams of the shifts and of the coordinates past the lattice's. */
#define SHIFT_STREAM TPK_RNG_STREAM(TPK_RNG_MC, 0x4A4E5453u) /* "JNTS" */
#define MC_STREAM TPK_RNG_STREAM(TPK_RNG_MC, 0x4A4E544Du)    /* "JNTM" */

typedef struct kv {
    uint64_t k1, k2; /* k1 == 0: empty */
    int v;
} kv;

typedef struct map {
    size_t cap, n;
    kv *e;
} map;

static int map_get(const map *m, uint64_t k1, uint64_t k2)
{
    if (m->cap == 0)
        return -1;
    for (size_t i = (size_t)(k1 * UINT64_C(0x9E3779B97F4A7C15) >> 7) & (m->cap - 1);;
         i = (i + 1) & (m->cap - 1)) {
        if (m->e[i].k1 == 0)
            return -1;
        if (m->e[i].k1 == k1 && m->e[i].k2 == k2)
            return m->e[i].v;
    }
}

static int map_put(map *m, const tpk_allocator *al, uint64_t k1, uint64_t k2, int v)
{
    if (2 * (m->n + 1) > m->cap) {
        size_t nc = m->cap ? 2 * m->cap : 256;
        kv *ne = tpk_mem_calloc(al, nc, sizeof *ne, NULL), *old = m->e;
        if (ne == NULL)
            return TPK_ENOMEM;
        size_t oc = m->cap;
        m->e = ne;
        m->cap = nc;
        m->n = 0;
        for (size_t i = 0; i < oc; i++)
            if (old[i].k1 != 0)
                map_put(m, al, old[i].k1, old[i].k2, old[i].v);
        tpk_mem_free(al, old);
    }
    size_t i = (size_t)(k1 * UINT64_C(0x9E3779B97F4A7C15) >> 7) & (m->cap - 1);
    while (m->e[i].k1 != 0)
        i = (i + 1) & (m->cap - 1);
    m->e[i] = (kv){k1, k2, v};
    m->n++;
    return TPK_OK;
}

struct tpk_nsr_joint {
    int R;
    size_t M, P;          /* points per shift, R·M in all */
    uint64_t seed;
    size_t max_bytes, bytes;
    /* coordinates: G-var and input, mean, Cholesky row (sparse: the columns it uses) */
    int nd, capd;
    int *dg;
    size_t *da;
    double *mu, *diag, *row;  /* row: a dense scratch row of capd */
    size_t *roff;
    int *rlen;
    int *ridx;
    double *rval;
    size_t rn, rcap;
    map dims;
    /* kept factors: values on all P points */
    int nf, capf;
    double **vals;
    map facs;
    tpk_allocator al;     /* of tpk_nsr_joint_alloc: every block above */
};

tpk_nsr_joint *tpk_nsr_joint_alloc(int shifts, size_t points, size_t max_bytes, uint64_t seed,
                                   const tpk_allocator *al)
{
    if (shifts < 2 || points < 1)
        return NULL;
    tpk_nsr_joint *j = tpk_mem_calloc(al, 1, sizeof *j, NULL);
    if (j == NULL)
        return NULL;
    j->al = al ? *al : (tpk_allocator){NULL, NULL};
    j->R = shifts;
    j->M = points;
    j->P = (size_t)shifts * points;
    j->seed = seed;
    j->max_bytes = max_bytes;
    return j;
}

void tpk_nsr_joint_free(tpk_nsr_joint *j)
{
    if (j == NULL)
        return;
    const tpk_allocator al = j->al;
    void *blocks[] = {j->dg, j->da, j->mu, j->diag, j->row, j->roff, j->rlen, j->ridx, j->rval,
                      j->dims.e, j->facs.e};
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++)
        tpk_mem_free(&al, blocks[i]);
    for (int i = 0; i < j->nf; i++)
        tpk_mem_free(&al, j->vals[i]);
    tpk_mem_free(&al, j->vals);
    tpk_mem_free(&al, j);
}

static int grow_dims(tpk_nsr_joint *j)
{
    int nc = j->capd ? 2 * j->capd : 64;
#define GROW(p)                                                                            \
    do {                                                                                       \
        void *q_ = tpk_mem_realloc(&j->al, (p), (size_t)nc * sizeof *(p), NULL);               \
        if (!q_)                                                                               \
            return TPK_ENOMEM;                                                                 \
        (p) = q_;                                                                              \
    } while (0)
    GROW(j->dg);
    GROW(j->da);
    GROW(j->mu);
    GROW(j->diag);
    GROW(j->row);
    GROW(j->roff);
    GROW(j->rlen);
#undef GROW
    j->capd = nc;
    return TPK_OK;
}

/* The coordinate of G-var g at input a, appended (with its Cholesky row against every earlier
 * coordinate) on first use; −1 out of memory. */
static int dim_of(tpk_nsr_joint *j, const tpk_nsr_joint_env *env, int g, size_t a)
{
    uint64_t k1 = ((uint64_t)(uint32_t)g << 32 | (uint64_t)(uint32_t)a) + 1, k2 = (uint64_t)a >> 32;
    int k = map_get(&j->dims, k1, k2);
    if (k >= 0)
        return k;
    if (j->nd == j->capd && grow_dims(j))
        return -1;
    k = j->nd;
    double *L = j->row, s2 = env->cov(env->ctx, g, a, g, a), dmax = s2;
    for (int i = 0; i < k; i++)
        dmax = fmax(dmax, j->diag[i] * j->diag[i]);
    /* L_ki = (C_ki − Σ_{l<i} L_kl L_il) / L_ii over the earlier coordinates, in order */
    int nz = 0;
    for (int i = 0; i < k; i++) {
        double c = env->cov(env->ctx, g, a, j->dg[i], j->da[i]);
        const int *ix = j->ridx + j->roff[i];
        const double *iv = j->rval + j->roff[i];
        for (int q = 0; q < j->rlen[i] - 1; q++) /* the row's last entry is its diagonal */
            c -= L[ix[q]] * iv[q];
        L[i] = j->diag[i] > 0 && c != 0.0 ? c / j->diag[i] : 0.0;
        s2 -= L[i] * L[i];
        nz += L[i] != 0.0;
    }
    double lkk = s2 > DEGEN_TOL * (dmax > 0 ? dmax : 1.0) ? sqrt(s2) : 0.0;
    if (j->rn + (size_t)nz + 1 > j->rcap) {
        size_t nc = j->rcap ? 2 * j->rcap : 4096;
        while (nc < j->rn + (size_t)nz + 1)
            nc *= 2;
        int *ni = tpk_mem_realloc(&j->al, j->ridx, nc * sizeof *ni, NULL);
        if (ni == NULL)
            return -1;
        j->ridx = ni;
        double *nv = tpk_mem_realloc(&j->al, j->rval, nc * sizeof *nv, NULL);
        if (nv == NULL)
            return -1;
        j->rval = nv;
        j->rcap = nc;
    }
    j->roff[k] = j->rn;
    for (int i = 0; i < k; i++)
        if (L[i] != 0.0) {
            j->ridx[j->rn] = i;
            j->rval[j->rn++] = L[i];
        }
    j->ridx[j->rn] = k;
    j->rval[j->rn++] = lkk;
    j->rlen[k] = nz + 1;
    j->diag[k] = lkk;
    j->dg[k] = g;
    j->da[k] = a;
    j->mu[k] = env->mean(env->ctx, g);
    if (map_put(&j->dims, &j->al, k1, k2, k))
        return -1;
    j->nd++;
    return k;
}

/* Coordinate j of point k (of 2^bits), before its shift: for the first LATTICE_HEAD coordinates
 * the embedded lattice rule of netsor/limit_orthant.c, frac(k·z_j / 2^bits); beyond, a
 * pseudo-random permutation of the 2^bits strata of [0, 1) (xorshift–multiply rounds, each a
 * bijection of the bits, keyed by j), taken at their centres: every coordinate is stratified
 * like a lattice's, with none of a high-dimensional lattice's linear relations between
 * coordinates (which stopped its error from falling with the points). */
#define LATTICE_HEAD 16
static double coord(int j, uint64_t k, unsigned bits)
{
    const uint64_t mask = ((uint64_t)1 << bits) - 1;
    if (j < LATTICE_HEAD)
        return (double)((k * tpk_nsr_lattice_z[j]) & mask) / (double)((uint64_t)1 << bits);
    uint64_t x = k;
    for (int round = 0; round < 3; round++) {
        uint64_t h = ((uint64_t)(uint32_t)j << 8 | (uint64_t)round) * UINT64_C(0x9E3779B97F4A7C15);
        h ^= h >> 31;
        x = (x ^ (h & mask)) & mask;
        x = (x * ((h >> 17) | 1)) & mask;
        x ^= x >> (bits / 2 + 1);
    }
    return ((double)x + 0.5) / (double)((uint64_t)1 << bits);
}

static uint64_t fac_key(const tpk_nsr_jfac *f, uint64_t *k2)
{
    *k2 = (uint64_t)f->input << 20 ^ (uint64_t)(unsigned)f->len;
    uint64_t k1 = (uint64_t)(uintptr_t)f->node;
    return k1 ? k1 : 1;
}

/* Values of the new factors nf[0..nn) (kept slots slot[]) on every point. */
static int sample_factors(tpk_nsr_joint *j, const tpk_nsr_joint_env *env, int nn,
                          const tpk_nsr_jfac *nf, const int *slot, tpk_ctx *ctx)
{
    /* coordinates: those the factors read (D), and those their rows use (J ⊇ D) */
    int *mark = NULL, *D = NULL, *J = NULL, nD = 0, nJ = 0;
    int *jpos = NULL, maxlen = 1, maxdepth = 1, st = TPK_OK;
    int **leaf = NULL;     /* per factor: the coordinate of each node (−1: not a G-var) */
    double **sv = NULL;    /* per factor: the scalars' values */
    const tpk_allocator *al = TPK_ALLOCATOR_OF(ctx); /* temporaries: the caller's allocator */
    leaf = tpk_mem_calloc(al, (size_t)nn, sizeof *leaf, NULL);
    sv = tpk_mem_calloc(al, (size_t)nn, sizeof *sv, NULL);
    if (!leaf || !sv) {
        st = TPK_ENOMEM;
        goto out;
    }
    for (int f = 0; f < nn; f++) {
        leaf[f] = tpk_mem_malloc(al, (size_t)nf[f].len * sizeof **leaf, NULL);
        sv[f] = tpk_mem_malloc(al, (size_t)nf[f].len * sizeof **sv, NULL);
        if (!leaf[f] || !sv[f]) {
            st = TPK_ENOMEM;
            goto out;
        }
        int dp = tpk_nsr_rpn_depth(nf[f].node, nf[f].len);
        if (dp > maxdepth)
            maxdepth = dp;
        if (nf[f].len > maxlen)
            maxlen = nf[f].len;
        for (int i = 0; i < nf[f].len; i++) {
            const tpk_rpn_node *nd = &nf[f].node[i];
            leaf[f][i] = -1;
            sv[f][i] = nd->op == TPK_RPN_SCALAR ? env->scalar(env->ctx, nd->var, nf[f].input) : 0.0;
            if (nd->op != TPK_RPN_GVAR)
                continue;
            int k = dim_of(j, env, nd->var, nf[f].input);
            if (k < 0) {
                st = TPK_ENOMEM;
                goto out;
            }
            leaf[f][i] = k;
        }
    }
    /* the marks: 1 read by a factor, 2 used by a row (after the appends above) */
    mark = tpk_mem_calloc(al, (size_t)j->nd, sizeof *mark, NULL);
    D = tpk_mem_malloc(al, (size_t)j->nd * sizeof *D, NULL);
    J = tpk_mem_malloc(al, (size_t)j->nd * sizeof *J, NULL);
    jpos = tpk_mem_malloc(al, (size_t)j->nd * sizeof *jpos, NULL);
    if (!mark || !D || !J || !jpos) {
        st = TPK_ENOMEM;
        goto out;
    }
    for (int f = 0; f < nn; f++)
        for (int i = 0; i < nf[f].len; i++)
            if (leaf[f][i] >= 0 && !(mark[leaf[f][i]] & 1)) {
                mark[leaf[f][i]] |= 1;
                int k = leaf[f][i];
                for (int q = 0; q < j->rlen[k]; q++)
                    mark[j->ridx[j->roff[k] + q]] |= 2;
            }
    for (int k = 0; k < j->nd; k++) {
        jpos[k] = -1;
        if (mark[k] & 1)
            D[nD++] = k;
        if (mark[k] & 2) {
            jpos[k] = nJ;
            J[nJ++] = k;
        }
    }
    /* the rows of D over the columns J, dense: per block, samples = A · normals (one GEMM) */
    double *A = tpk_mem_calloc(al, (size_t)(nD ? nD : 1) * (size_t)(nJ ? nJ : 1), sizeof *A,
                               NULL);
    int *dpos = tpk_mem_malloc(al, (size_t)j->nd * sizeof *dpos, NULL);
    if (!A || !dpos) {
        tpk_mem_free(al, A);
        tpk_mem_free(al, dpos);
        st = TPK_ENOMEM;
        goto out;
    }
    for (int q = 0; q < nD; q++) {
        int k = D[q];
        dpos[k] = q;
        for (int e = 0; e < j->rlen[k]; e++)
            A[(size_t)q * (size_t)nJ + (size_t)jpos[j->ridx[j->roff[k] + e]]] = j->rval[j->roff[k] + e];
    }
    const size_t M = j->M;
    const size_t nblk = (M + BLKP - 1) / BLKP;
    const size_t gws = tpk_gemm_tuned_ws_size(0, (size_t)nD, BLKP, (size_t)nJ, 1);
    unsigned bits = 0;
    while (((size_t)1 << bits) < M)
        bits++;
    const int lattice = ((size_t)1 << bits) == M && bits <= 20; /* 2^b points: coord() */
#pragma omp parallel
    {
        /* per thread, from the caller's allocator (the hook is thread-safe where calls run
         * threads; no context is written here: the region reports through st) */
        double *nrm = tpk_mem_malloc(al, (size_t)nJ * BLKP * sizeof *nrm, NULL);
        double *smp = tpk_mem_malloc(al, (size_t)(nD ? nD : 1) * BLKP * sizeof *smp, NULL);
        tpk_ctx gctx;
        tpk_ctx_init_from(&gctx, ctx);
        void *gw = gws ? tpk_aligned_alloc(&gctx, 64, gws) : NULL;
        double *uu = tpk_mem_malloc(al, BLKP * sizeof *uu, NULL);
        double *sh = tpk_mem_malloc(al, BLKP * sizeof *sh, NULL);
        double *stack = tpk_mem_malloc(al, (size_t)maxdepth * BLKP * sizeof *stack, NULL);
        const double **gv = tpk_mem_malloc(al, (size_t)maxlen * sizeof *gv, NULL);
        int my = nrm && smp && uu && sh && stack && gv && (gw || !gws) ? TPK_OK : TPK_ENOMEM;
#pragma omp for schedule(dynamic, 1)
        for (size_t it = 0; it < (size_t)j->R * nblk; it++) {
            if (my != TPK_OK)
                continue;
            int r = (int)(it / nblk);
            size_t k0 = (it % nblk) * BLKP, B = M - k0 < BLKP ? M - k0 : BLKP;
            for (int q = 0; q < nJ; q++) {
                int c = J[q];
                double *n = nrm + (size_t)q * BLKP;
                if (!lattice) { /* M not a power of two: independent uniforms */
                    for (size_t b = 0; b < B; b++)
                        uu[b] = tpk_rng_uniform_at(j->seed, MC_STREAM,
                                                   (uint32_t)((size_t)r * M + k0 + b), (uint32_t)c);
                    tpk_mvn_normals((int)B, uu, NULL, n);
                    continue;
                }
                double d = tpk_rng_uniform_at(j->seed, SHIFT_STREAM, (uint32_t)r, (uint32_t)c);
                for (size_t b = 0; b < B; b++) {
                    uu[b] = coord(c, k0 + b, bits);
                    sh[b] = d;
                }
                tpk_mvn_normals((int)B, uu, sh, n);
            }
            /* x_k = μ_k + Σ_i L_ki n_i for the coordinates the factors read */
            if (tpk_gemm_tuned_d(0, 0, (size_t)nD, B, (size_t)nJ, 1.0, A, (size_t)nJ, nrm, BLKP, 0.0,
                                 smp, BLKP, 1, gw, &gctx)) {
                my = gctx.status;
                continue;
            }
            for (int q = 0; q < nD; q++)
                for (size_t b = 0; b < B; b++)
                    smp[(size_t)q * BLKP + b] += j->mu[D[q]];
            for (int f = 0; f < nn; f++) {
                for (int i = 0; i < nf[f].len; i++)
                    gv[i] = leaf[f][i] >= 0 ? smp + (size_t)dpos[leaf[f][i]] * BLKP : NULL;
                tpk_nsr_rpn_eval(nf[f].node, nf[f].len, gv, sv[f], B, stack,
                                 j->vals[slot[f]] + (size_t)r * M + k0);
            }
        }
#pragma omp critical(tpk_joint_err)
        if (my != TPK_OK)
            st = my;
        void *tb[] = {nrm, smp, uu, sh, stack, (void *)gv};
        for (size_t b = 0; b < sizeof tb / sizeof tb[0]; b++)
            tpk_mem_free(al, tb[b]);
        tpk_aligned_free(&gctx, gw);
    }
    tpk_mem_free(al, A);
    tpk_mem_free(al, dpos);
out:
    for (int f = 0; leaf && f < nn; f++)
        tpk_mem_free(al, leaf[f]);
    for (int f = 0; sv && f < nn; f++)
        tpk_mem_free(al, sv[f]);
    void *ob[] = {leaf, sv, mark, D, J, jpos};
    for (size_t b = 0; b < sizeof ob / sizeof ob[0]; b++)
        tpk_mem_free(al, ob[b]);
    return st == TPK_OK ? TPK_OK : TPK_ERROR(ctx, st, "out of memory for the joint sample");
}

/* A fresh sample: no coordinates, no kept factors. */
static void joint_reset(tpk_nsr_joint *j)
{
    for (int i = 0; i < j->nf; i++)
        tpk_mem_free(&j->al, j->vals[i]);
    j->nf = 0;
    j->nd = 0;
    j->rn = 0;
    j->bytes = 0;
    j->dims.n = 0;
    j->facs.n = 0;
    if (j->dims.e)
        memset(j->dims.e, 0, j->dims.cap * sizeof *j->dims.e);
    if (j->facs.e)
        memset(j->facs.e, 0, j->facs.cap * sizeof *j->facs.e);
}

int tpk_nsr_joint_expect(tpk_nsr_joint *j, const tpk_nsr_joint_env *env, int n,
                         const size_t *off, const tpk_nsr_jfac *f, tpk_estimate *out,
                         tpk_ctx *ctx)
{
    /* a new coordinate is drawn against every earlier one: all must still be live */
    for (int k = 0; k < j->nd; k++)
        if (!env->alive(env->ctx, j->dg[k])) {
            joint_reset(j);
            break;
        }
    size_t nfac = off[n];
    int *slot = tpk_malloc(ctx, (nfac ? nfac : 1) * sizeof *slot), nn = 0, st = TPK_OK;
    tpk_nsr_jfac *nf = slot ? tpk_malloc(ctx, (nfac ? nfac : 1) * sizeof *nf) : NULL;
    int *nslot = nf ? tpk_malloc(ctx, (nfac ? nfac : 1) * sizeof *nslot) : NULL;
    if (!slot || !nf || !nslot) {
        st = ctx->status;
        goto done;
    }
    /* kept factors, and room for the new ones (in the order given: deterministic) */
    size_t need = 0;
    for (size_t q = 0; q < nfac; q++) {
        uint64_t k2, k1 = fac_key(&f[q], &k2);
        int s = map_get(&j->facs, k1, k2);
        if (s < 0) {
            for (int p = 0; p < nn; p++)
                if (nf[p].node == f[q].node && nf[p].len == f[q].len && nf[p].input == f[q].input) {
                    s = nslot[p];
                    break;
                }
        }
        if (s < 0) {
            need += j->P * sizeof(double);
            s = j->nf + nn;
            nf[nn] = f[q];
            nslot[nn++] = s;
        }
        slot[q] = s;
    }
    if (j->bytes + need > j->max_bytes) {
        st = TPK_EUNSUPPORTED;
        goto done;
    }
    if (nn > 0) {
        if (j->nf + nn > j->capf) {
            int nc = j->capf ? 2 * j->capf : 64;
            while (nc < j->nf + nn)
                nc *= 2;
            double **nv = tpk_mem_realloc(&j->al, j->vals, (size_t)nc * sizeof *nv, ctx);
            if (nv == NULL) {
                st = ctx->status;
                goto done;
            }
            j->vals = nv;
            j->capf = nc;
        }
        for (int p = 0; p < nn; p++) {
            j->vals[j->nf + p] = tpk_mem_malloc(&j->al, j->P * sizeof(double), ctx);
            if (j->vals[j->nf + p] == NULL) {
                for (int q = 0; q < p; q++)
                    tpk_mem_free(&j->al, j->vals[j->nf + q]);
                st = ctx->status;
                goto done;
            }
        }
        st = sample_factors(j, env, nn, nf, nslot, ctx);
        for (int p = 0; st == TPK_OK && p < nn; p++) {
            uint64_t k2, k1 = fac_key(&nf[p], &k2);
            if (map_put(&j->facs, &j->al, k1, k2, nslot[p]))
                st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        }
        if (st != TPK_OK) {
            for (int p = 0; p < nn; p++)
                tpk_mem_free(&j->al, j->vals[j->nf + p]);
            goto done;
        }
        j->nf += nn;
        j->bytes += need;
    }
    /* the groups: per shift, the mean of the product of their factors' values */
#pragma omp parallel for schedule(dynamic, 4) if ((size_t)n * j->P > PAR_MIN)
    for (int i = 0; i < n; i++) {
        double x[TPK_ORTHANT_MAXSHIFTS], s1 = 0.0, s2 = 0.0;
        int R = j->R < TPK_ORTHANT_MAXSHIFTS ? j->R : TPK_ORTHANT_MAXSHIFTS;
        for (int r = 0; r < R; r++) {
            double acc = 0.0;
            for (size_t k = 0; k < j->M; k++) {
                double p = 1.0;
                for (size_t q = off[i]; q < off[i + 1]; q++)
                    p *= j->vals[slot[q]][(size_t)r * j->M + k];
                acc += p;
            }
            x[r] = acc / (double)j->M;
            s1 += x[r];
        }
        double mean = s1 / R;
        for (int r = 0; r < R; r++)
            s2 += (x[r] - mean) * (x[r] - mean);
        out[i].value = mean;
        out[i].err = sqrt(s2 / (R - 1) / R);
    }
done:
    tpk_free(ctx, slot);
    tpk_free(ctx, nf);
    tpk_free(ctx, nslot);
    return st;
}
