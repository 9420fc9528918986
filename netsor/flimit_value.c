/* Values of the rolled limit evaluator: a constant, per-point scalars, or a linear combination of
 * block members (a gather, one member per point, or a dense mixing map) with a constant part. */
#include "flimit-impl.h"
#include "tpk/alloc.h"

#include <string.h>

void nsr_fl_val_free(fl *F, val *v)
{
    tpk_free(F->X.ctx, v->s);
    tpk_free(F->X.ctx, v->mu);
    for (int i = 0; i < v->nt; i++) {
        tpk_free(F->X.ctx, v->t[i].idx);
        tpk_free(F->X.ctx, v->t[i].w);
    }
    tpk_free(F->X.ctx, v->t);
    memset(v, 0, sizeof *v);
}

int nsr_fl_val_const(val *v, long m, double c)
{
    memset(v, 0, sizeof *v);
    v->kind = V_CONST;
    v->m = m;
    v->c = c;
    return TPK_OK;
}

/* SCAL array of v (allocating for a constant). */
int nsr_fl_val_scal(fl *F, val *v)
{
    if (v->kind == V_SCAL)
        return TPK_OK;
    size_t n = F->N * (size_t)v->m;
    double *s = nsr_fam_alloc(&F->X, n, sizeof *s);
    if (s == NULL)
        return F->X.ctx->status;
    for (size_t i = 0; i < n; i++)
        s[i] = v->c;
    v->kind = V_SCAL;
    v->s = s;
    return TPK_OK;
}

/* v ← v · c (per input and point when c is SCAL). */
int nsr_fl_val_scale(fl *F, val *v, const val *c)
{
    size_t N = F->N, m = (size_t)v->m;
    if (c->kind == V_CONST && c->c == 1)
        return TPK_OK;
    if (c->kind == V_CONST && c->c == 0) { /* 0 · x = 0 (the unrolled form folds it) */
        long mv = v->m;
        nsr_fl_val_free(F, v);
        return nsr_fl_val_const(v, mv, 0);
    }
    if (v->kind == V_CONST && c->kind == V_CONST) {
        v->c *= c->c;
        return TPK_OK;
    }
    if (v->kind != V_LIN) {
        if (nsr_fl_val_scal(F, v))
            return F->X.ctx->status;
        for (size_t i = 0; i < N * m; i++)
            v->s[i] *= c->kind == V_CONST ? c->c : c->s[i];
        return TPK_OK;
    }
    if (v->mu)
        for (size_t i = 0; i < N * m; i++)
            v->mu[i] *= c->kind == V_CONST ? c->c : c->s[i];
    for (int k = 0; k < v->nt; k++) {
        term *t = &v->t[k];
        size_t ms = (size_t)F->b[t->blk].m;
        if (t->dense) {
            for (size_t a = 0; a < N; a++)
                for (size_t p = 0; p < m; p++) {
                    double w = c->kind == V_CONST ? c->c : c->s[a * m + p];
                    double *row = t->w + (a * m + p) * ms;
                    for (size_t q = 0; q < ms; q++)
                        row[q] *= w;
                }
            continue;
        }
        if (t->w == NULL) {
            if ((t->w = nsr_fam_alloc(&F->X, N * m, sizeof *t->w)) == NULL)
                return F->X.ctx->status;
            for (size_t i = 0; i < N * m; i++)
                t->w[i] = 1;
        }
        for (size_t i = 0; i < N * m; i++)
            t->w[i] *= c->kind == V_CONST ? c->c : c->s[i];
    }
    return TPK_OK;
}

/* a ← a + s·b (b consumed). */
int nsr_fl_val_add(fl *F, val *a, val *b, double s)
{
    size_t N = F->N, m = (size_t)a->m;
    if (s != 1) {
        val c;
        nsr_fl_val_const(&c, b->m, s);
        if (nsr_fl_val_scale(F, b, &c))
            return F->X.ctx->status;
    }
    if (a->kind == V_CONST && b->kind == V_CONST) {
        a->c += b->c;
        return TPK_OK;
    }
    if (a->kind != V_LIN && b->kind != V_LIN) {
        if (nsr_fl_val_scal(F, a))
            return F->X.ctx->status;
        for (size_t i = 0; i < N * m; i++)
            a->s[i] += b->kind == V_CONST ? b->c : b->s[i];
        nsr_fl_val_free(F, b);
        return TPK_OK;
    }
    if (a->kind != V_LIN) {
        val t = *a;
        *a = *b;
        *b = t;
    }
    /* a is LIN */
    if (b->kind != V_LIN) {
        if (b->kind == V_CONST && b->c == 0)
            return TPK_OK;
        if (a->mu == NULL && (a->mu = nsr_fam_alloc(&F->X, N * m, sizeof *a->mu)) == NULL)
            return F->X.ctx->status;
        for (size_t i = 0; i < N * m; i++)
            a->mu[i] += b->kind == V_CONST ? b->c : b->s[i];
        nsr_fl_val_free(F, b);
        return TPK_OK;
    }
    if (b->mu) {
        if (a->mu == NULL) {
            a->mu = b->mu;
            b->mu = NULL;
        } else {
            for (size_t i = 0; i < N * m; i++)
                a->mu[i] += b->mu[i];
        }
    }
    term *t = tpk_realloc(F->X.ctx, a->t, (size_t)(a->nt + b->nt) * sizeof *t);
    if (t == NULL)
        return TPK_ERROR(F->X.ctx, TPK_ENOMEM, "out of memory");
    memcpy(t + a->nt, b->t, (size_t)b->nt * sizeof *t);
    a->t = t;
    a->nt += b->nt;
    tpk_free(F->X.ctx, b->t);
    b->t = NULL;
    b->nt = 0;
    nsr_fl_val_free(F, b);
    return TPK_OK;
}

/* The value "member idx[p] of block k" over m points (idx consumed). */
int nsr_fl_val_gather(fl *F, val *v, long m, int k, int *idx)
{
    memset(v, 0, sizeof *v);
    v->kind = V_LIN;
    v->m = m;
    v->t = nsr_fam_alloc(&F->X, 1, sizeof *v->t);
    if (v->t == NULL) {
        tpk_free(F->X.ctx, idx);
        return F->X.ctx->status;
    }
    v->nt = 1;
    v->t[0].blk = k;
    v->t[0].idx = idx;
    return TPK_OK;
}

/* Member p read at point p, with weights (per input and point) allowed. */
int nsr_fl_identity_gather(const term *t, long m)
{
    if (t->dense)
        return 0;
    for (long p = 0; p < m; p++)
        if (t->idx[p] != p)
            return 0;
    return 1;
}

int nsr_fl_identity_term(const term *t, long m)
{
    return t->w == NULL && nsr_fl_identity_gather(t, m);
}

/* Non-decreasing gather: a symmetric pair of it reads only the lower triangle of its block
 * ((a, idx p) ≥ (c, idx q) whenever (a, p) ≥ (c, q)). */
int nsr_fl_monotone(const int *idx, size_t m)
{
    for (size_t p = 1; p < m; p++)
        if (idx[p] < idx[p - 1])
            return 0;
    return 1;
}

/* 1 when x is NULL or its n entries are all zero. */
int nsr_fl_all_zero(const double *x, size_t n)
{
    for (size_t i = 0; x != NULL && i < n; i++)
        if (x[i] != 0)
            return 0;
    return 1;
}

/* Dense per-input map of a term: N × m × ms (gather expanded). */
double *nsr_fl_term_dense(fl *F, const term *t, size_t m)
{
    size_t N = F->N, ms = (size_t)F->b[t->blk].m;
    if (t->dense)
        return t->w;
    double *w = nsr_fam_alloc(&F->X, N * m * ms, sizeof *w);
    if (w == NULL)
        return NULL;
    for (size_t a = 0; a < N; a++)
        for (size_t p = 0; p < m; p++)
            if (t->idx[p] >= 0)
                w[(a * m + p) * ms + (size_t)t->idx[p]] = t->w ? t->w[a * m + p] : 1;
    return w;
}

/* Terms on one block merge into one dense map when any of them is dense (attention's k + Σ a k
 * is (I + A)·k: one sandwich instead of four). */
int nsr_fl_val_merge(fl *F, val *v)
{
    size_t N = F->N, m = (size_t)v->m;
    for (int i = 0; i < v->nt; i++)
        for (int j = i + 1; j < v->nt; j++) {
            term *a = &v->t[i], *b = &v->t[j];
            if (a->blk != b->blk || (!a->dense && !b->dense))
                continue;
            size_t ms = (size_t)F->b[a->blk].m;
            if (!F->dry) {
                if (!a->dense) {
                    double *w = nsr_fl_term_dense(F, a, m);
                    if (w == NULL)
                        return F->X.ctx->status;
                    tpk_free(F->X.ctx, a->w);
                    tpk_free(F->X.ctx, a->idx);
                    a->w = w;
                    a->idx = NULL;
                }
                if (b->dense) {
                    for (size_t k = 0; k < N * m * ms; k++)
                        a->w[k] += b->w[k];
                } else {
                    for (size_t x = 0; x < N; x++)
                        for (size_t p = 0; p < m; p++)
                            if (b->idx[p] >= 0)
                                a->w[(x * m + p) * ms + (size_t)b->idx[p]] +=
                                    b->w ? b->w[x * m + p] : 1;
                }
            } else if (!a->dense) {
                tpk_free(F->X.ctx, a->idx);
                a->idx = NULL;
            }
            a->dense = 1;
            tpk_free(F->X.ctx, b->w);
            tpk_free(F->X.ctx, b->idx);
            v->t[j] = v->t[--v->nt];
            j--;
        }
    return TPK_OK;
}

int nsr_fl_val_copy(fl *F, const val *a, val *out)
{
    size_t N = F->N, m = (size_t)a->m;
    *out = *a;
    out->s = NULL;
    out->mu = NULL;
    out->t = NULL;
    out->nt = 0; /* until out->t exists (a copy that fails half-way is freed: nsr_fl_val_free) */
    if (a->s && (out->s = nsr_fam_alloc(&F->X, N * m, sizeof *out->s)) == NULL)
        return F->X.ctx->status;
    if (a->s)
        memcpy(out->s, a->s, N * m * sizeof *out->s);
    if (a->mu && (out->mu = nsr_fam_alloc(&F->X, N * m, sizeof *out->mu)) == NULL)
        return F->X.ctx->status;
    if (a->mu)
        memcpy(out->mu, a->mu, N * m * sizeof *out->mu);
    if (a->nt) {
        if ((out->t = nsr_fam_alloc(&F->X, (size_t)a->nt, sizeof *out->t)) == NULL)
            return F->X.ctx->status;
        out->nt = a->nt;
        for (int i = 0; i < a->nt; i++) {
            const term *t = &a->t[i];
            term *u = &out->t[i];
            *u = *t;
            u->idx = NULL;
            u->w = NULL;
            size_t ms = (size_t)F->b[t->blk].m;
            size_t nw = t->dense ? N * m * ms : N * m;
            if (t->idx && (u->idx = nsr_fam_alloc(&F->X, m, sizeof *u->idx)) == NULL)
                return F->X.ctx->status;
            if (t->idx)
                memcpy(u->idx, t->idx, m * sizeof *u->idx);
            if (t->w && (u->w = nsr_fam_alloc(&F->X, nw, sizeof *u->w)) == NULL)
                return F->X.ctx->status;
            if (t->w)
                memcpy(u->w, t->w, nw * sizeof *u->w);
        }
    }
    return TPK_OK;
}

int nsr_fl_val_is_block(const val *v, const fblock *b)
{
    if (v->kind != V_LIN || v->nt != 1 || v->mu || v->t[0].dense || v->t[0].w || b->m != v->m)
        return 0;
    for (long p = 0; p < v->m; p++)
        if (v->t[0].idx[p] != p)
            return 0;
    return 1;
}

/* Keep only the last member of v (the default kernel reads the last output). */
int nsr_fl_val_last(fl *F, val *v)
{
    size_t N = F->N, m = (size_t)v->m;
    for (int i = 0; i < v->nt; i++) {
        term *t = &v->t[i];
        size_t ms = (size_t)F->b[t->blk].m;
        if (t->dense) {
            for (size_t a = 0; a < N; a++)
                memmove(t->w + a * ms, t->w + (a * m + m - 1) * ms, ms * sizeof *t->w);
        } else {
            t->idx[0] = t->idx[m - 1];
            if (t->w)
                for (size_t a = 0; a < N; a++)
                    t->w[a] = t->w[a * m + m - 1];
        }
    }
    if (v->mu)
        for (size_t a = 0; a < N; a++)
            v->mu[a] = v->mu[a * m + m - 1];
    v->m = 1;
    return TPK_OK;
}
