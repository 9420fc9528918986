/* Index families of a rolled NETSOR program, shared by its two evaluators (family-impl.h). */
#include "family-impl.h"
#include "tpk/alloc.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int nsr_fam_init(nsr_fam *F, const tpk_program *p, tpk_ctx *ctx)
{
    memset(F, 0, sizeof *F);
    F->R = p->rolled;
    F->C = &F->R->C;
    F->ctx = ctx;
    F->num = nsr_fam_alloc(F, (size_t)F->C->nsym + 1, sizeof *F->num);
    return F->num == NULL ? ctx->status : TPK_OK;
}

void nsr_fam_free(nsr_fam *F)
{
    tpk_free(F->ctx, F->num);
    F->num = NULL;
}

int nsr_fam_err(nsr_fam *F, int st, const nsr_expr *e, const char *fmt, ...)
{
    if (F->ctx->status)
        return F->ctx->status;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* the statement being evaluated (the last one while the outputs are read at the end) */
    int k = F->cur < 0 ? 0 : F->cur >= F->R->nfi ? F->R->nfi - 1 : F->cur;
    const nsr_stmt *s = F->R->nfi > 0 ? F->R->fi[k].stmt : NULL;
    int line = e ? e->line : s ? s->line : 1, col = e ? e->col : s ? s->col : 1;
    if (st == TPK_EUNSUPPORTED)
        F->unsup = 1;
    return TPK_ERROR(F->ctx, st, "%s:%d:%d: %s", F->R->file, line, col, msg);
}

/* A block may not take more than this share of the machine's memory: beyond, a clear error
 * instead of the kernel's OOM killer once the pages are touched. */
#define BLOCK_MEM_SHARE 0.6

int nsr_fam_too_big(nsr_fam *F, size_t bytes)
{
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || psize <= 0)
        return 0;
    double phys = (double)pages * (double)psize;
    if ((double)bytes <= BLOCK_MEM_SHARE * phys)
        return 0;
    nsr_fam_err(F, TPK_ENOMEM, NULL, "%s needs %.3g GB and this machine has %.3g GB: fewer "
                "inputs or members (%s)", F->big_hint ? F->big_hint : "one buffer",
                (double)bytes / 1e9, phys / 1e9, "the rolled evaluators keep whole families, "
                "docs/netsor.md");
    return 1;
}

void *nsr_fam_alloc(nsr_fam *F, size_t n, size_t size)
{
    if (n == 0)
        n = 1;
    if (n > SIZE_MAX / size / 2) {
        TPK_ERROR(F->ctx, TPK_ENOMEM, "out of memory (%zu × %zu bytes)", n, size);
        return NULL;
    }
    if (n * size >= ((size_t)1 << 30) && nsr_fam_too_big(F, n * size))
        return NULL;
    void *q = tpk_calloc(F->ctx, n, size);
    if (q == NULL)
        TPK_ERROR(F->ctx, TPK_ENOMEM, "out of memory (%.3g GB)", (double)n * size / 1e9);
    return q;
}

void nsr_trie_free(nsr_trie *t, tpk_ctx *ctx)
{
    for (int k = 0; k < NSR_MAX_INDICES; k++) {
        tpk_free(ctx, t->lo[k]);
        tpk_free(ctx, t->hi[k]);
        tpk_free(ctx, t->base[k]);
    }
}

int nsr_fam_num(nsr_fam *F, const nsr_expr *e, double *v)
{
    double a, b;
    switch (e->kind) {
    case NSR_E_NUM:
        *v = e->num;
        return TPK_OK;
    case NSR_E_NAME:
        if (e->nidx == 0 && e->sym >= 0 && !isnan(F->num[e->sym]) &&
            (F->C->sym[e->sym].kind == NSR_SYM_PARAM || F->C->sym[e->sym].kind == NSR_SYM_LOOP)) {
            *v = F->num[e->sym];
            return TPK_OK;
        }
        return NSR_UNSUP(F, e, "'%s' is not a number here", e->name);
    case NSR_E_NEG:
        if (nsr_fam_num(F, e->a, &a))
            return F->ctx->status;
        *v = -a;
        return TPK_OK;
    case NSR_E_BIN:
        if (nsr_fam_num(F, e->a, &a) || nsr_fam_num(F, e->b, &b))
            return F->ctx->status;
        *v = e->op == NSR_T_PLUS ? a + b : e->op == NSR_T_MINUS ? a - b : e->op == NSR_T_STAR ? a * b
             : e->op == NSR_T_SLASH ? a / b : pow(a, b);
        return TPK_OK;
    case NSR_E_CALL:
        if (e->sym < 0 && strcmp(e->name, "mod") == 0 && e->nargs == 2) {
            if (nsr_fam_num(F, e->args[0], &a) || nsr_fam_num(F, e->args[1], &b))
                return F->ctx->status;
            if (b < 1 || a != floor(a) || b != floor(b))
                return nsr_fam_err(F, TPK_ETYPE, e, "mod(a, b) needs integers, b >= 1");
            long ia = (long)a, ib = (long)b;
            *v = (double)(((ia % ib) + ib) % ib);
            return TPK_OK;
        }
        if (e->sym < 0 && (strcmp(e->name, "wrap") == 0 || strcmp(e->name, "inside") == 0)) {
            double lo, hi;
            if (nsr_fam_num(F, e->args[0], &a) || nsr_fam_num(F, e->args[1], &lo) ||
                nsr_fam_num(F, e->args[2], &hi))
                return F->ctx->status;
            if (hi < lo)
                return nsr_fam_err(F, TPK_ETYPE, e, "%s(v, lo, hi) needs lo <= hi", e->name);
            *v = e->name[0] == 'w' ? (double)nsr_wrap((int)a, (int)lo, (int)hi)
                                   : (double)(a >= lo && a <= hi);
            return TPK_OK;
        }
        return NSR_UNSUP(F, e, "'%s(...)' is not index arithmetic", e->name);
    default:
        return NSR_UNSUP(F, e, "not an index expression");
    }
}

int nsr_fam_int(nsr_fam *F, const nsr_expr *e, int *out)
{
    double v;
    if (nsr_fam_num(F, e, &v))
        return F->ctx->status;
    if (v != floor(v) || fabs(v) > 1e9)
        return nsr_fam_err(F, TPK_ETYPE, e, "index %g is not an integer", v);
    *out = (int)v;
    return TPK_OK;
}

int nsr_fam_member(nsr_fam *F, int sym, const nsr_expr *e, int *out)
{
    int t[NSR_MAX_INDICES];
    for (int i = 0; i < e->nidx && i < NSR_MAX_INDICES; i++)
        if (nsr_fam_int(F, e->idx[i], &t[i]))
            return F->ctx->status;
    for (int i = 0; i < F->R->ndm; i++) {
        const nsr_dmember *d = &F->R->dm[i];
        if (d->sym == sym && d->nidx == e->nidx &&
            memcmp(d->idx, t, (size_t)e->nidx * sizeof *t) == 0) {
            *out = i;
            return TPK_OK;
        }
    }
    return nsr_fam_err(F, TPK_ETYPE, e, "%s has no such member (not declared)", e->name);
}

/* Does e read any of the symbols syms[0..n)? */
int nsr_reads_syms(const nsr_expr *e, const int *syms, int n, int depth)
{
    if (e == NULL || depth > 4 * NSR_MAX_DEPTH)
        return 0;
    if (e->kind == NSR_E_NAME && e->nidx == 0)
        for (int i = 0; i < n; i++)
            if (e->sym == syms[i])
                return 1;
    if (nsr_reads_syms(e->a, syms, n, depth + 1) || nsr_reads_syms(e->b, syms, n, depth + 1))
        return 1;
    for (int i = 0; i < e->nargs; i++)
        if (nsr_reads_syms(e->args[i], syms, n, depth + 1))
            return 1;
    for (int i = 0; i < e->nidx; i++)
        if (nsr_reads_syms(e->idx[i], syms, n, depth + 1))
            return 1;
    return 0;
}

void nsr_bind_point(nsr_fam *F, const nsr_fdom *D, long p)
{
    for (int k = 0; k < D->nv; k++)
        F->num[D->sym[k]] = D->val[p * D->nv + k];
}

/* A read through an affine index costs a few multiply-adds per point instead of walking the
 * expression. */
int nsr_iaff_of(nsr_fam *F, const nsr_expr *e, const nsr_fdom *D, nsr_iaff *a, int depth)
{
    memset(a, 0, sizeof *a);
    if (depth > NSR_MAX_DEPTH)
        return 0;
    if (!nsr_reads_syms(e, D->sym, D->nv, 0)) {
        double v;
        if (nsr_fam_num(F, e, &v)) {
            tpk_ctx_clear(F->ctx); /* the per-point path reports it where it happens */
            F->unsup = 0;
            return 0;
        }
        a->k = v;
        return 1;
    }
    nsr_iaff x, y;
    switch (e->kind) {
    case NSR_E_NAME:
        for (int v = 0; v < D->nv; v++)
            if (D->sym[v] == e->sym) {
                a->c[v] = 1;
                return 1;
            }
        return 0;
    case NSR_E_NEG:
        if (!nsr_iaff_of(F, e->a, D, &x, depth + 1))
            return 0;
        a->k = -x.k;
        for (int v = 0; v < D->nv; v++)
            a->c[v] = -x.c[v];
        return 1;
    case NSR_E_BIN:
        if (!nsr_iaff_of(F, e->a, D, &x, depth + 1) || !nsr_iaff_of(F, e->b, D, &y, depth + 1))
            return 0;
        if (e->op == NSR_T_PLUS || e->op == NSR_T_MINUS) {
            double sg = e->op == NSR_T_PLUS ? 1 : -1;
            a->k = x.k + sg * y.k;
            for (int v = 0; v < D->nv; v++)
                a->c[v] = x.c[v] + sg * y.c[v];
            return 1;
        }
        if (e->op == NSR_T_STAR) {
            int xc = 1, yc = 1;
            for (int v = 0; v < D->nv; v++) {
                xc &= x.c[v] == 0;
                yc &= y.c[v] == 0;
            }
            if (!xc && !yc)
                return 0;
            const nsr_iaff *f = xc ? &y : &x;
            double s = xc ? x.k : y.k;
            a->k = f->k * s;
            for (int v = 0; v < D->nv; v++)
                a->c[v] = f->c[v] * s;
            for (int v = 0; v < D->nv; v++)
                if (a->c[v] != floor(a->c[v]))
                    return 0;
            return a->k == floor(a->k);
        }
        return 0;
    default:
        return 0;
    }
}

int nsr_imap_of(nsr_fam *F, const nsr_expr *e, const nsr_fdom *D, nsr_imap *m)
{
    memset(m, 0, sizeof *m);
    m->n = e->nidx;
    for (int i = 0; i < e->nidx; i++) {
        nsr_iaff a;
        if (!nsr_iaff_of(F, e->idx[i], D, &a, 0) || a.k != floor(a.k) || fabs(a.k) > 1e9)
            return 0;
        m->k[i] = (long)a.k;
        for (int v = 0; v < D->nv; v++)
            if (a.c[v] != 0) {
                if (a.c[v] != floor(a.c[v]) || fabs(a.c[v]) > 1e6)
                    return 0;
                m->q[i][m->nt[i]] = v;
                m->c[i][m->nt[i]++] = (long)a.c[v];
            }
    }
    return 1;
}

/* Points of the rolled loops loop[0..n) (bounds may read outer loops), in loop order, with the
 * member-lookup nsr_trie of targets that carry the loops at positions pos[]. */
int nsr_build_domain(nsr_fam *F, const nsr_stmt *const *loop, int n, nsr_fdom *D, nsr_trie *tr)
{
    memset(D, 0, sizeof *D);
    D->nv = n;
    for (int k = 0; k < n; k++)
        D->sym[k] = loop[k]->fam;
    /* count level by level */
    long cnt = 1;
    int *pv = NULL;    /* prefix values: cnt × k */
    pv = nsr_fam_alloc(F, 1, sizeof *pv);
    if (pv == NULL)
        return F->ctx->status;
    for (int k = 0; k < n; k++) {
        int *lo = nsr_fam_alloc(F, (size_t)cnt, sizeof *lo), *hi = nsr_fam_alloc(F, (size_t)cnt, sizeof *hi);
        long *base = nsr_fam_alloc(F, (size_t)cnt, sizeof *base);
        if (lo == NULL || hi == NULL || base == NULL) {
            tpk_free(F->ctx, lo);
            tpk_free(F->ctx, hi);
            tpk_free(F->ctx, base);
            tpk_free(F->ctx, pv);
            return F->ctx->status;
        }
        long next = 0;
        for (long q = 0; q < cnt; q++) {
            for (int j = 0; j < k; j++)
                F->num[D->sym[j]] = pv[q * k + j];
            if (nsr_fam_int(F, loop[k]->lo, &lo[q]) || nsr_fam_int(F, loop[k]->hi, &hi[q])) {
                tpk_free(F->ctx, lo);
                tpk_free(F->ctx, hi);
                tpk_free(F->ctx, base);
                tpk_free(F->ctx, pv);
                return F->ctx->status;
            }
            if (hi[q] < lo[q])
                hi[q] = lo[q] - 1;
            base[q] = next;
            next += (long)hi[q] - lo[q] + 1;
            F->work += (long)hi[q] - lo[q] + 1;
            if (next > 400000000L) {
                tpk_free(F->ctx, lo);
                tpk_free(F->ctx, hi);
                tpk_free(F->ctx, base);
                tpk_free(F->ctx, pv);
                return nsr_fam_err(F, TPK_EINVAL, loop[k]->lo, "index domain too large (%ld points)", next);
            }
            if (F->work_budget > 0 && F->work > F->work_budget) {
                tpk_free(F->ctx, lo);
                tpk_free(F->ctx, hi);
                tpk_free(F->ctx, base);
                tpk_free(F->ctx, pv);
                F->deferred = 1;
                return TPK_ERROR(F->ctx, TPK_EINVAL, "plan deferred (more than %ld points)",
                                 F->work_budget);
            }
        }
        int *nv = nsr_fam_alloc(F, (size_t)next * (size_t)(k + 1), sizeof *nv);
        if (nv == NULL) {
            tpk_free(F->ctx, lo);
            tpk_free(F->ctx, hi);
            tpk_free(F->ctx, base);
            tpk_free(F->ctx, pv);
            return F->ctx->status;
        }
        for (long q = 0; q < cnt; q++)
            for (int v = lo[q]; v <= hi[q]; v++) {
                long r = base[q] + (v - lo[q]);
                memcpy(&nv[r * (k + 1)], &pv[q * k], (size_t)k * sizeof *nv);
                nv[r * (k + 1) + k] = v;
            }
        tpk_free(F->ctx, pv);
        pv = nv;
        if (tr) {
            tr->lo[k] = lo;
            tr->hi[k] = hi;
            tr->base[k] = base;
            tr->nn[k] = cnt;
        } else {
            tpk_free(F->ctx, lo);
            tpk_free(F->ctx, hi);
            tpk_free(F->ctx, base);
        }
        cnt = next;
    }
    D->m = cnt;
    D->val = pv;
    if (tr)
        tr->nlev = n;
    return TPK_OK;
}

/* Member of a block for a target index tuple, or −1. */
long nsr_trie_find(const nsr_trie *t, const int *idx)
{
    if (t->nlev < 0) { /* a table of nfix-index tuples (declared G-var members) */
        for (long r = 0; r < t->nn[0]; r++)
            if (memcmp(&t->lo[0][r * (NSR_MAX_INDICES + 1)], idx, (size_t)t->nfix * sizeof *idx) == 0)
                return r;
        return -1;
    }
    for (int f = 0; f < t->nfix; f++)
        if (idx[t->fpos[f]] != t->fval[f])
            return -1;
    if (t->nlev == 0)
        return 0;
    long node = 0;
    for (int k = 0; k < t->nlev; k++) {
        int v = idx[t->pos[k]];
        if (v < t->lo[k][node] || v > t->hi[k][node])
            return -1;
        node = t->base[k][node] + (v - t->lo[k][node]);
    }
    return node;
}


/* D' = D × (binder in lo..hi), with each point's parent in D. */
int nsr_extend(nsr_fam *F, const nsr_expr *e, const nsr_fdom *D, nsr_fdom *X, long **parent)
{
    memset(X, 0, sizeof *X);
    if (D->nv >= NSR_MAXV)
        return NSR_UNSUP(F, e, "too many nested index sums");
    X->nv = D->nv + 1;
    memcpy(X->sym, D->sym, (size_t)D->nv * sizeof *D->sym);
    X->sym[D->nv] = e->sym;
    int *lo = nsr_fam_alloc(F, (size_t)D->m, sizeof *lo), *hi = nsr_fam_alloc(F, (size_t)D->m, sizeof *hi);
    if (lo == NULL || hi == NULL) {
        tpk_free(F->ctx, lo);
        tpk_free(F->ctx, hi);
        return F->ctx->status;
    }
    long m = 0;
    for (long p = 0; p < D->m; p++) {
        nsr_bind_point(F, D, p);
        if (nsr_fam_int(F, e->args[0], &lo[p]) || nsr_fam_int(F, e->args[1], &hi[p])) {
            tpk_free(F->ctx, lo);
            tpk_free(F->ctx, hi);
            return F->ctx->status;
        }
        if (hi[p] >= lo[p])
            m += hi[p] - lo[p] + 1;
        if (F->work_budget > 0 && F->work + m > F->work_budget) {
            tpk_free(F->ctx, lo);
            tpk_free(F->ctx, hi);
            F->deferred = 1;
            return TPK_ERROR(F->ctx, TPK_EINVAL, "plan deferred (more than %ld points)",
                             F->work_budget);
        }
        if (m > 400000000L) {
            tpk_free(F->ctx, lo);
            tpk_free(F->ctx, hi);
            return nsr_fam_err(F, TPK_EINVAL, e, "index sum too large");
        }
    }
    X->m = m;
    F->work += m;
    X->val = nsr_fam_alloc(F, (size_t)m * (size_t)X->nv, sizeof *X->val);
    *parent = nsr_fam_alloc(F, (size_t)m, sizeof **parent);
    if (X->val == NULL || *parent == NULL) {
        tpk_free(F->ctx, lo);
        tpk_free(F->ctx, hi);
        tpk_free(F->ctx, X->val);
        tpk_free(F->ctx, *parent);
        X->val = NULL;
        *parent = NULL;
        return F->ctx->status;
    }
    long r = 0;
    for (long p = 0; p < D->m; p++)
        for (int j = lo[p]; j <= hi[p]; j++, r++) {
            memcpy(&X->val[r * X->nv], &D->val[p * D->nv], (size_t)D->nv * sizeof *D->val);
            X->val[r * X->nv + D->nv] = j;
            (*parent)[r] = p;
        }
    tpk_free(F->ctx, lo);
    tpk_free(F->ctx, hi);
    return TPK_OK;
}


/* The domain of instruction k and its block's member lookup (target positions of the rolled
 * loops; other positions fixed by the bound loops). */
int nsr_instr_domain(nsr_fam *F, const nsr_finstr *fi, nsr_fdom *D, nsr_trie *tr)
{
    const nsr_stmt *s = fi->stmt;
    if (nsr_build_domain(F, fi->loop, fi->nloops, D, tr))
        return F->ctx->status;
    for (int k = 0; k < fi->nloops; k++) {
        tr->pos[k] = -1;
        for (int i = 0; i < s->nidx; i++)
            if (s->idx[i]->kind == NSR_E_NAME && s->idx[i]->nidx == 0 &&
                s->idx[i]->sym == fi->loop[k]->fam)
                tr->pos[k] = i;
        if (tr->pos[k] < 0)
            return nsr_fam_err(F, TPK_ETYPE, s->idx[0], "internal: rolled index not in the target");
    }
    for (int i = 0; i < s->nidx; i++) {
        int rolled = 0;
        for (int k = 0; k < fi->nloops; k++)
            rolled |= tr->pos[k] == i;
        if (rolled)
            continue;
        if (nsr_reads_syms(s->idx[i], D->sym, D->nv, 0))
            return NSR_UNSUP(F, s->idx[i], "a target index that is an expression of a rolled index");
        tr->fpos[tr->nfix] = i;
        if (nsr_fam_int(F, s->idx[i], &tr->fval[tr->nfix]))
            return F->ctx->status;
        tr->nfix++;
    }
    return TPK_OK;
}


void nsr_softmax_shape_free(nsr_softmax_shape *S, tpk_ctx *ctx)
{
    tpk_free(ctx, S->rows.val);
    tpk_free(ctx, S->X.val);
    tpk_free(ctx, S->row);
    tpk_free(ctx, S->start);
    tpk_free(ctx, S->pick);
    tpk_free(ctx, S->parent);
    memset(S, 0, sizeof *S);
}

int nsr_softmax_shape_of(nsr_fam *F, const nsr_expr *e, const nsr_fdom *D, nsr_softmax_shape *S)
{
    memset(S, 0, sizeof *S);
    int kv = -1;
    for (int v = 0; v < D->nv; v++)
        if (D->sym[v] == e->op)
            kv = v;
    if (kv >= 0 && (nsr_reads_syms(e->a, &e->op, 1, 0) || nsr_reads_syms(e->args[0], &e->op, 1, 0) ||
                    nsr_reads_syms(e->args[1], &e->op, 1, 0)))
        kv = -1; /* the row reads the entry's own index: no sharing */
    nsr_fdom *Rw = &S->rows;
    long *row = S->row = nsr_fam_alloc(F, (size_t)D->m, sizeof *row);
    if (row == NULL)
        return F->ctx->status;
    if (kv < 0) {
        *Rw = *D;
        Rw->val = nsr_fam_alloc(F, (size_t)D->m * (size_t)D->nv, sizeof *Rw->val);
        if (Rw->val == NULL)
            return F->ctx->status;
        memcpy(Rw->val, D->val, (size_t)D->m * (size_t)D->nv * sizeof *Rw->val);
        for (long p = 0; p < D->m; p++)
            row[p] = p;
    } else {
        /* rows: the points of D with index kv dropped (hashing the other indices) */
        Rw->nv = D->nv - 1;
        for (int v = 0, w = 0; v < D->nv; v++)
            if (v != kv)
                Rw->sym[w++] = D->sym[v];
        size_t cap = 16;
        while (cap < 2 * (size_t)D->m)
            cap *= 2;
        long *tab = nsr_fam_alloc(F, cap, sizeof *tab);
        Rw->val = nsr_fam_alloc(F, (size_t)D->m * (size_t)(Rw->nv ? Rw->nv : 1), sizeof *Rw->val);
        if (tab == NULL || Rw->val == NULL) {
            tpk_free(F->ctx, tab);
            return F->ctx->status;
        }
        for (size_t i = 0; i < cap; i++)
            tab[i] = -1;
        /* the usual case: the entry's index is the innermost loop and the points come in loop
         * order, so each row is one run of equal prefixes and rows are numbered as the hash
         * below would number them (first appearance); a prefix that does not increase
         * lexicographically sends the whole domain to the hash */
        int runs = kv == D->nv - 1 && Rw->nv > 0;
        for (long p = 1; runs && p < D->m; p++) {
            const int *a = &D->val[(p - 1) * D->nv], *b = &D->val[p * D->nv];
            int c = 0;
            for (int w = 0; w < Rw->nv && c == 0; w++)
                c = (a[w] > b[w]) - (a[w] < b[w]);
            runs = c <= 0;
        }
        for (long p = 0; runs && p < D->m; p++) {
            const int *b = &D->val[p * D->nv];
            if (p == 0 || memcmp(&Rw->val[(Rw->m - 1) * Rw->nv], b, (size_t)Rw->nv * sizeof *b) != 0) {
                memcpy(&Rw->val[Rw->m * Rw->nv], b, (size_t)Rw->nv * sizeof *b);
                Rw->m++;
            }
            row[p] = Rw->m - 1;
        }
        for (long p = 0; !runs && p < D->m; p++) {
            int key[NSR_MAXV];
            for (int v = 0, w = 0; v < D->nv; v++)
                if (v != kv)
                    key[w++] = D->val[p * D->nv + v];
            uint64_t h = 1469598103934665603u;
            for (int w = 0; w < Rw->nv; w++)
                h = (h ^ (uint32_t)key[w]) * 1099511628211u;
            size_t q = (size_t)h & (cap - 1);
            while (tab[q] >= 0 &&
                   memcmp(&Rw->val[tab[q] * Rw->nv], key, (size_t)Rw->nv * sizeof *key) != 0)
                q = (q + 1) & (cap - 1);
            if (tab[q] < 0) {
                tab[q] = Rw->m;
                memcpy(&Rw->val[Rw->m * Rw->nv], key, (size_t)Rw->nv * sizeof *key);
                Rw->m++;
            }
            row[p] = tab[q];
        }
        tpk_free(F->ctx, tab);
    }
    if (nsr_extend(F, e, Rw, &S->X, &S->parent))
        return F->ctx->status;
    size_t m = (size_t)D->m, mx = (size_t)S->X.m, nr = (size_t)Rw->m;
    long *start = S->start = nsr_fam_alloc(F, nr + 1, sizeof *start);
    long *pick = S->pick = nsr_fam_alloc(F, m, sizeof *pick);
    if (start == NULL || pick == NULL)
        return F->ctx->status;
    for (size_t r = 0; r <= nr; r++)
        start[r] = (long)mx;
    for (size_t r = mx; r-- > 0;)
        start[S->parent[r]] = (long)r;
    for (size_t r = nr; r-- > 0;) /* empty rows start where the next one does */
        if (start[r] > start[r + 1])
            start[r] = start[r + 1];
    /* the entry of each point: its row's member whose binder equals the point's index */
    const nsr_fdom *X = &S->X;
    for (size_t p = 0; p < m; p++) {
        size_t r = (size_t)row[p];
        int want;
        if (kv >= 0) {
            want = D->val[p * (size_t)D->nv + (size_t)kv];
        } else {
            nsr_bind_point(F, D, (long)p);
            want = (int)F->num[e->op];
        }
        long s0 = start[r], s1 = start[r + 1];
        long q = s0 < s1 ? s0 + (want - X->val[s0 * X->nv + Rw->nv]) : -1;
        if (q < s0 || q >= s1)
            return nsr_fam_err(F, TPK_ETYPE, e, "softmax entry %s = %d is outside its range",
                               e->name, want);
        pick[p] = q;
    }
    return TPK_OK;
}

int nsr_rolled_input(const tpk_program *p, const tpk_array *x, size_t *N, size_t *T, size_t *d,
                     tpk_ctx *ctx)
{
    if (x == NULL || x->data == NULL || (x->ndim != 2 && x->ndim != 3))
        return TPK_ERROR(ctx, TPK_EINVAL, "input array must be N×d or N×T×d");
    if (!((x->ndim == 2 && p->nslots == 1) || (x->ndim == 3 && x->dims[1] == (size_t)p->nslots)))
        return TPK_ERROR(ctx, TPK_EINVAL,
                         "input array has rank %d; the program needs N×d (1 slot) or N×%d×d",
                         x->ndim, p->nslots);
    *N = x->dims[0];
    *T = x->ndim == 3 ? x->dims[1] : 1;
    *d = x->dims[x->ndim - 1];
    if (*N == 0 || *d == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "empty input array (N = %zu, d = %zu)", *N, *d);
    char where[64];
    size_t bad = tpk_array_first_nonfinite(x, where, sizeof where);
    if (bad != tpk_array_size(x))
        return TPK_ERROR(ctx, TPK_EDOM, "input array holds a non-finite value at [%s]", where);
    return TPK_OK;
}
