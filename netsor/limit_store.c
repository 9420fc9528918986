/* Limit evaluator, stage 2 — the covariance store (theory.md §1.6 "Interpreter notes", §1.7):
 * one block per family over (atom × input), written when its later atom is created (same-atom
 * sub-blocks keep only their lower triangle); covariances of G-vars through their atoms; the
 * memo of generic E[Z^u Z^v] matrices; the half-products of an affine left factor; and the
 * release of what instruction k was the last to read (the plan's free lists). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "limit-impl.h"
#include "tangent-impl.h"
#include "tpk/alloc.h"

#define AFFQ_MAX_BYTES ((size_t)256 << 20) /* beyond this, pairs are summed directly */

static double atom_cov(const lim *L, int i, size_t a, int j, size_t c)
{
    const atom *ai = &L->atom[i], *aj = &L->atom[j];
    if (ai->fam != aj->fam)
        return 0.0;
    const family *f = &L->fam[ai->fam];
    if (f->kind == FAM_BIAS)
        return f->var;
    size_t ld = (size_t)f->cap * L->N;
    if (i == j && c > a) { /* a same-atom sub-block is kept in its lower triangle only */
        size_t t = a;
        a = c;
        c = t;
    }
    return f->blk[((size_t)ai->loc * L->N + a) * ld + (size_t)aj->loc * L->N + c];
}

/* Cov(Z^g_a, Z^h_c) of G-vars g, h through their atoms. */
double nsr_lim_cov(const lim *L, int g, size_t a, int h, size_t c)
{
    const grep *r = &L->rep[g], *s = &L->rep[h];
    double acc = 0.0;
    for (int i = 0; i < r->n; i++)
        for (int j = 0; j < s->n; j++)
            if (L->atom[r->atom[i]].fam == L->atom[s->atom[j]].fam)
                acc += r->coef[i] * s->coef[j] * atom_cov(L, r->atom[i], a, s->atom[j], c);
    return acc;
}

/* The tangent kernel of an atom pair's family (theory.md §8.7): under NT's 'ntk'
 * parameterisation a leaf's own gradient gives its covariance (σ² E[z z̄]); under Tensor
 * Programs II's, the same without σ². */
static double bias_kern(const lim *L, const family *f, int tangent)
{
    return tangent ? tpk_ntk_own(L->ntk_param, f->var, 1.0) : f->var;
}

/* out[a][c] = Cov(Z^g_a, Z^h_c) (tangent: the tangent kernel T(g_a, h_c)), N×N; lower: only
 * c ≤ a is written (what tpk_gauss_map reads). One pass over the output: bias families add a
 * constant, the first block assigns. */
void nsr_lim_kern_mat(const lim *L, int g, int h, int lower, int tangent, double *out)
{
    size_t N = L->N;
    const grep *r = &L->rep[g], *s = &L->rep[h];
    double c0 = 0.0;
    int first = 1;
    for (int i = 0; i < r->n; i++)
        for (int j = 0; j < s->n; j++) {
            const atom *ai = &L->atom[r->atom[i]], *aj = &L->atom[s->atom[j]];
            if (ai->fam == aj->fam && L->fam[ai->fam].kind == FAM_BIAS)
                c0 += r->coef[i] * s->coef[j] * bias_kern(L, &L->fam[ai->fam], tangent);
        }
    for (int i = 0; i < r->n; i++)
        for (int j = 0; j < s->n; j++) {
            const atom *ai = &L->atom[r->atom[i]], *aj = &L->atom[s->atom[j]];
            if (ai->fam != aj->fam || L->fam[ai->fam].kind == FAM_BIAS)
                continue;
            const family *f = &L->fam[ai->fam];
            double cc = r->coef[i] * s->coef[j];
            if (tangent && f->kind == FAM_EMBED) /* its own term on the raw ⟨x, x̄⟩/d = C/(σσ′) */
                cc *= tpk_ntk_own(L->ntk_param, ai->scale * aj->scale, (double)L->d) /
                      (ai->scale * aj->scale);
            size_t ld = (size_t)f->cap * N;
            const double *b = (tangent && f->kind == FAM_AVAR ? f->tblk : f->blk) +
                              (size_t)ai->loc * N * ld + (size_t)aj->loc * N;
            /* a same-atom sub-block holds only its lower triangle: the rest is its transpose */
            const int same = r->atom[i] == s->atom[j];
#pragma omp parallel for schedule(dynamic, 64) if (N >= 512)
            for (size_t a = 0; a < N; a++) {
                size_t cend = lower || same ? a + 1 : N;
                double *o = out + a * N;
                const double *br = b + a * ld;
                if (first)
                    for (size_t c = 0; c < cend; c++)
                        o[c] = c0 + cc * br[c];
                else
                    for (size_t c = 0; c < cend; c++)
                        o[c] += cc * br[c];
                if (same && !lower)
                    for (size_t c = a + 1; c < N; c++)
                        o[c] = (first ? c0 : o[c]) + cc * b[c * ld + a];
            }
            first = 0;
        }
    if (first)
        for (size_t a = 0; a < N; a++)
            for (size_t c = 0; c < (lower ? a + 1 : N); c++)
                out[a * N + c] = c0;
}

void nsr_lim_cov_mat(const lim *L, int g, int h, int lower, double *out)
{
    nsr_lim_kern_mat(L, g, h, lower, 0, out);
}

/* dst (ld) = scale · src (N×N, ld N), row by row. */
void nsr_lim_put_rows(size_t N, const double *src, double scale, double *dst, size_t ld)
{
    for (size_t a = 0; a < N; a++)
        for (size_t c = 0; c < N; c++)
            dst[a * ld + c] = scale * src[a * N + c];
}

/* Do some atoms of G-vars g and h share a family (else Cov(Z^g, Z^h) = 0)? */
int nsr_lim_share_family(const lim *L, int g, int h)
{
    const grep *r = &L->rep[g], *s = &L->rep[h];
    for (int i = 0; i < r->n; i++)
        for (int j = 0; j < s->n; j++)
            if (L->atom[r->atom[i]].fam == L->atom[s->atom[j]].fam)
                return 1;
    return 0;
}

/* Q_h of the cache (computed on first use; C is N×N scratch), or NULL when the cache is off or
 * full — the caller then sums the pairs directly — or out of memory (L->ctx set). */
const double *nsr_lim_halfprod(lim *L, affq *q, int u, const int *argu, int nu,
                               const double *coefu, int h, double *C)
{
    size_t N = L->N, nn = N * N;
    if (!q->on)
        return NULL;
    for (int i = 0; i < q->n; i++)
        if (q->h[i] == h)
            return q->Q[i];
    if (q->bytes + nn * sizeof(double) > AFFQ_MAX_BYTES)
        return NULL;
    if (q->n == q->cap) {
        int cap = q->cap ? 2 * q->cap : 16;
        int *nh = tpk_realloc(L->ctx, q->h, (size_t)cap * sizeof *nh);
        if (nh)
            q->h = nh;
        double **nq = nh ? tpk_realloc(L->ctx, q->Q, (size_t)cap * sizeof *nq) : NULL;
        if (!nq) {
            TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
            return NULL;
        }
        q->Q = nq;
        q->cap = cap;
    }
    double *Q = tpk_calloc(L->ctx, nn, sizeof *Q);
    if (!Q) {
        TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
        return NULL;
    }
    for (int gi = 0; gi < nu; gi++) {
        int g = argu[gi];
        if (!nsr_lim_share_family(L, g, h))
            continue;
        nsr_lim_cov_mat(L, g, h, 0, C);
        const double *cu = coefu ? coefu + (size_t)gi * N : NULL;
        for (size_t a = 0; a < N; a++) {
            double w = cu ? cu[a] : 1.0;
            if (w == 0.0)
                continue;
            double *o = Q + a * N;
            const double *Ca = C + a * N;
            for (size_t c = 0; c < N; c++)
                o[c] += w * Ca[c];
        }
    }
    q->u = u;
    q->h[q->n] = h;
    q->Q[q->n++] = Q;
    q->bytes += nn * sizeof(double);
    return Q;
}

/* The half-products of a finished instruction, and the cache itself at the end. */
void nsr_lim_halfprod_clear(affq *q, tpk_ctx *ctx)
{
    for (int i = 0; i < q->n; i++)
        tpk_free(ctx, q->Q[i]);
    q->n = 0;
    q->u = -1;
    q->bytes = 0;
}

void nsr_lim_halfprod_free(affq *q, tpk_ctx *ctx)
{
    nsr_lim_halfprod_clear(q, ctx);
    tpk_free(ctx, q->h);
    tpk_free(ctx, q->Q);
    q->h = NULL;
    q->Q = NULL;
    q->cap = 0;
}

/* The memo's E[Z^u Z^v] (*transposed: it holds E[Z^v Z^u]), or NULL. */
const m2memo *nsr_lim_memo_find(const lim *L, int u, int v, int *transposed)
{
    for (int i = 0; i < L->nmm; i++) {
        if (L->mm[i].u == u && L->mm[i].v == v) {
            *transposed = 0;
            return &L->mm[i];
        }
        if (L->mm[i].u == v && L->mm[i].v == u) {
            *transposed = 1;
            return &L->mm[i];
        }
    }
    return NULL;
}

/* Keep a copy of E (N×N); out of memory only skips the memo. */
void nsr_lim_memo_put(lim *L, int u, int v, const double *E, double err)
{
    size_t nn = L->N * L->N;
    if (L->nmm == L->capmm) {
        int cap = L->capmm ? 2 * L->capmm : 16;
        m2memo *n = tpk_realloc(L->ctx, L->mm, (size_t)cap * sizeof *n);
        if (n == NULL)
            return;
        L->mm = n;
        L->capmm = cap;
    }
    double *c = tpk_malloc(L->ctx, nn * sizeof *c);
    if (c == NULL)
        return;
    memcpy(c, E, nn * sizeof *c);
    L->mm[L->nmm++] = (m2memo){u, v, c, err};
}

/* Drop the entries that read variable x (it is being freed). */
static void memo_drop(lim *L, int x)
{
    int j = 0;
    for (int i = 0; i < L->nmm; i++) {
        if (L->mm[i].u == x || L->mm[i].v == x)
            tpk_free(L->ctx, L->mm[i].E);
        else
            L->mm[j++] = L->mm[i];
    }
    L->nmm = j;
}

/* A variable no later instruction reads: its rep, expansion, values, affine form, memo entries. */
static void free_var_data(lim *L, int v)
{
    memo_drop(L, v);
    tpk_free(L->ctx, L->rep[v].atom);
    tpk_free(L->ctx, L->rep[v].coef);
    L->rep[v].atom = NULL;
    L->rep[v].coef = NULL;
    L->rep[v].n = 0;
    tpk_free(L->ctx, L->xb[v].t);
    L->xb[v].t = NULL;
    tpk_free(L->ctx, L->scal[v]);
    L->scal[v] = NULL;
    tpk_free(L->ctx, L->aff[v]);
    L->aff[v] = NULL;
}

/* A family's (cap·N)² block into *blk, from *spare when it fits (its pages are mapped already:
 * a fresh one costs its page faults); what: the kind, for the message. */
static int block_new(lim *L, const family *f, double **blk, double **spare, size_t spare_len,
                     const char *what)
{
    if (*blk != NULL)
        return TPK_OK;
    size_t dim = (size_t)f->cap * L->N;
    if (*spare != NULL && spare_len == dim * dim) {
        *blk = *spare;
        *spare = NULL;
        return TPK_OK;
    }
    *blk = tpk_malloc(L->ctx, dim * dim * sizeof **blk);
    if (*blk == NULL)
        return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory for a %zu×%zu %s block", dim, dim, what);
    return TPK_OK;
}

/* The family's block; every sub-block is written when its later atom is created, before anyone
 * reads it. */
int nsr_lim_block_new(lim *L, family *f)
{
    return block_new(L, f, &f->blk, &L->spare, L->spare_len, "covariance");
}

/* The family's tangent block (the NTK), beside its covariance block. */
int nsr_lim_tblock_new(lim *L, family *f)
{
    return block_new(L, f, &f->tblk, &L->tspare, L->tspare_len, "tangent");
}

/* Sub-block (li, lj) ← transpose of sub-block (lj, li), in cache-sized tiles. */
void nsr_lim_block_mirror(lim *L, family *f, double *blk, int lj, int li)
{
    if (li == lj)
        return;
    size_t N = L->N, ld = (size_t)f->cap * N, TS = 32;
    const double *src = blk + (size_t)lj * N * ld + (size_t)li * N;
    double *dst = blk + (size_t)li * N * ld + (size_t)lj * N;
    for (size_t a0 = 0; a0 < N; a0 += TS)
        for (size_t c0 = 0; c0 < N; c0 += TS)
            for (size_t c = c0; c < c0 + TS && c < N; c++)
                for (size_t a = a0; a < a0 + TS && a < N; a++)
                    dst[c * ld + a] = src[a * ld + c];
}

/* After instruction k: free the variables and the family blocks it was the last to read (the
 * plan's free lists); the first freed block is kept as the spare (its pages are mapped). */
void nsr_lim_release(lim *L, int k)
{
    for (int v = L->free_var[k]; v >= 0; v = L->var_next[v])
        free_var_data(L, v);
    for (int f = L->free_fam[k]; f >= 0; f = L->fam[f].next) {
        if (L->spare == NULL && L->fam[f].blk != NULL) {
            size_t dim = (size_t)L->fam[f].cap * L->N;
            L->spare = L->fam[f].blk;
            L->spare_len = dim * dim;
        } else {
            tpk_free(L->ctx, L->fam[f].blk);
        }
        L->fam[f].blk = NULL;
        if (L->tspare == NULL && L->fam[f].tblk != NULL) {
            size_t dim = (size_t)L->fam[f].cap * L->N;
            L->tspare = L->fam[f].tblk;
            L->tspare_len = dim * dim;
        } else {
            tpk_free(L->ctx, L->fam[f].tblk);
        }
        L->fam[f].tblk = NULL;
    }
}
