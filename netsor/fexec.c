/* Finite-width executor on the rolled form (issue 14; theory.md §1.2, §1.5, §7.1): the network
 * of netsor/exec.c, run family instruction by family instruction instead of member by member.
 *
 * A family of G/H-vars over m members is one (m·N)×n matrix (member-major, then input), so
 *   MatMul of a family     → one GEMM (m·N × n)·(n × n)ᵀ through tpk_dgemm, or one per A-var
 *                            member where the A-var changes across the domain (convolution taps);
 *   a read f[i - 1, j]     → a gather: (block, member per point, weights), kept lazy until
 *                            something needs the numbers, so weighting it costs nothing;
 *   mean(u · v) of gathers → per input one Gram matrix U Vᵀ (tpk_dgemm) when the points cover
 *                            enough of the member pairs (attention logits), else dot products;
 *   Σ_j w_ij · f[j]        → per input one product W F (tpk_dgemm) when the weights are dense
 *                            enough (attention's Σ_j a_ij k_j), else axpys;
 *   φ, +, ·, /, softmax    → elementwise over the family.
 * Scalar families (NETSOR+ Moments) are m×N. Random tensors come from streams keyed by the
 * member's name (tpk_rng_stream_named), exactly as in the unrolled executor, so the two forms
 * of a program give the same network up to rounding. A dry pass (no numbers) runs first and
 * gives every block's and every weight's last use, so memory holds the live families only.
 * Forms not taken here (bn, tied A-var reads across statements are fine) are reported as
 * TPK_EUNSUPPORTED and the caller runs the unrolled form where it exists. */
#include "backend-impl.h"
#include "tpk/alloc.h"
#include "family-impl.h"
#include "ir-impl.h"

#include "tpk/matmul.h"
#include "tpk/rng.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Below this many elements a loop runs on one thread (fork/join would cost more). */
#define PAR_MIN 32768

enum { XV_CONST, XV_SCAL, XV_VEC, XV_GATHER };

typedef struct xv {   /* a value over a domain of m points */
    int kind;
    long m;
    double c;         /* CONST */
    double *s;        /* SCAL: m × N */
    double *v;        /* VEC: m × N × n */
    int blk;          /* GATHER: block blk, member idx[p] (−1: zero), weights w (m × N; NULL: 1) */
    int *idx;
    double *w;
} xv;

enum { XB_SCAL, XB_VEC, XB_ZERO };

typedef struct xblock {
    int kind, fam, fi;
    long m;
    nsr_trie tr;
    double *d;        /* SCAL: m × N; VEC: m × N × n */
    int last;         /* last instruction reading it; INT_MAX once freed */
} xblock;

typedef struct fx {
    nsr_fam X;
    const nsr_ir *ir;       /* the program's family IR: what this executor runs */
    const tpk_program *p;
    size_t N, T, d, n;
    uint64_t seed;
    const double *x;
    int dry;                /* the liveness pass: indices, no numbers */
    xblock *b;
    int nb, capb;
    const int *blast;       /* real run: last use of each block, from the dry pass */
    int nblast;
    double **dmz;           /* per declared member: its weights (A-var n × cols) when drawn */
    int *dmlast;            /* per declared member: last instruction using it */
    const int *dlast;       /* real run: dmlast of the dry pass */
} fx;

/* ---- values --------------------------------------------------------------------------------- */

static void xv_free(fx *F, xv *v)
{
    tpk_free(F->X.ctx, v->s);
    tpk_free(F->X.ctx, v->v);
    tpk_free(F->X.ctx, v->idx);
    tpk_free(F->X.ctx, v->w);
    memset(v, 0, sizeof *v);
}

static void xv_const(xv *v, long m, double c)
{
    memset(v, 0, sizeof *v);
    v->kind = XV_CONST;
    v->m = m;
    v->c = c;
}

/* A buffer of cnt doubles for numbers (NULL without error in the dry pass). */
static double *fx_buf(fx *F, size_t cnt, int *st)
{
    if (F->dry)
        return NULL;
    double *q = nsr_fam_alloc(&F->X, cnt, sizeof *q);
    if (q == NULL)
        *st = F->X.ctx->status;
    return q;
}

static int vecish(const xv *v)
{
    return v->kind == XV_VEC || v->kind == XV_GATHER;
}

static void touch(fx *F, int k)
{
    if (F->b[k].last < F->X.cur)
        F->b[k].last = F->X.cur;
}

/* CONST → SCAL (m × N). */
static int to_scal(fx *F, xv *v)
{
    if (v->kind == XV_SCAL)
        return TPK_OK;
    if (v->kind != XV_CONST)
        return nsr_fam_err(&F->X, TPK_ETYPE, NULL, "internal: a vector where a scalar is needed");
    int st = TPK_OK;
    size_t cnt = (size_t)v->m * F->N;
    double *s = fx_buf(F, cnt, &st);
    if (st)
        return st;
    for (size_t i = 0; s && i < cnt; i++)
        s[i] = v->c;
    v->kind = XV_SCAL;
    v->s = s;
    return TPK_OK;
}

/* Anything → VEC (m × N × n). */
static int to_vec(fx *F, xv *v)
{
    if (v->kind == XV_VEC)
        return TPK_OK;
    size_t N = F->N, n = F->n, m = (size_t)v->m;
    int st = TPK_OK;
    double *o = fx_buf(F, m * N * n, &st);
    if (st)
        return st;
    if (o != NULL) {
        if (v->kind == XV_CONST) {
            for (size_t i = 0; i < m * N * n; i++)
                o[i] = v->c;
        } else if (v->kind == XV_SCAL) {
#pragma omp parallel for schedule(static) if (m * N * n >= PAR_MIN)
            for (size_t r = 0; r < m * N; r++)
                for (size_t k = 0; k < n; k++)
                    o[r * n + k] = v->s[r];
        } else {
            const xblock *b = &F->b[v->blk];
#pragma omp parallel for schedule(static) if (m * N * n >= PAR_MIN)
            for (size_t p = 0; p < m; p++)
                for (size_t a = 0; a < N; a++) {
                    double *dst = o + (p * N + a) * n;
                    if (v->idx[p] < 0 || b->kind == XB_ZERO) {
                        memset(dst, 0, n * sizeof *dst);
                        continue;
                    }
                    const double *src = b->d + ((size_t)v->idx[p] * N + a) * n;
                    double w = v->w ? v->w[p * N + a] : 1.0;
                    if (w == 1.0)
                        memcpy(dst, src, n * sizeof *dst);
                    else
                        for (size_t k = 0; k < n; k++)
                            dst[k] = w * src[k];
                }
        }
    }
    tpk_free(F->X.ctx, v->s);
    tpk_free(F->X.ctx, v->idx);
    tpk_free(F->X.ctx, v->w);
    v->s = NULL;
    v->idx = NULL;
    v->w = NULL;
    v->kind = XV_VEC;
    v->v = o;
    return TPK_OK;
}

/* The value of a scalar-ish v at (point, input). */
static inline double sc_at(const xv *v, size_t p, size_t a, size_t N)
{
    return v->kind == XV_CONST ? v->c : v->s[p * N + a];
}

/* a ← a + sgn·b. */
static int xv_add(fx *F, xv *a, xv *b, double sgn)
{
    size_t N = F->N, n = F->n, m = (size_t)a->m;
    int st;
    if (!vecish(a) && !vecish(b)) {
        if (a->kind == XV_CONST && b->kind == XV_CONST) {
            a->c += sgn * b->c;
            return TPK_OK;
        }
        if ((st = to_scal(F, a)))
            return st;
        for (size_t i = 0; !F->dry && i < m * N; i++)
            a->s[i] += sgn * sc_at(b, i / N, i % N, N);
        return TPK_OK;
    }
    if (!vecish(a)) { /* a + s·b = s·(b + a/s) is not exact; swap by value instead */
        xv t = *a;
        *a = *b;
        *b = t;
        if ((st = to_vec(F, a)))
            return st;
        for (size_t i = 0; !F->dry && sgn != 1 && i < m * N * n; i++)
            a->v[i] = -a->v[i];
        sgn = 1;
    } else if ((st = to_vec(F, a))) {
        return st;
    }
    if (F->dry)
        return TPK_OK;
    if (b->kind == XV_CONST || b->kind == XV_SCAL) {
#pragma omp parallel for schedule(static) if (m * N * n >= PAR_MIN)
        for (size_t r = 0; r < m * N; r++) {
            double c = sgn * sc_at(b, r / N, r % N, N);
            for (size_t k = 0; k < n; k++)
                a->v[r * n + k] += c;
        }
        return TPK_OK;
    }
    if (b->kind == XV_VEC) {
#pragma omp parallel for schedule(static) if (m * N * n >= PAR_MIN)
        for (size_t i = 0; i < m * N * n; i++)
            a->v[i] += sgn * b->v[i];
        return TPK_OK;
    }
    const xblock *bb = &F->b[b->blk];
    if (bb->kind == XB_ZERO)
        return TPK_OK;
#pragma omp parallel for schedule(static) if (m * N * n >= PAR_MIN)
    for (size_t p = 0; p < m; p++)
        for (size_t x = 0; x < N; x++) {
            if (b->idx[p] < 0)
                continue;
            const double *src = bb->d + ((size_t)b->idx[p] * N + x) * n;
            double w = sgn * (b->w ? b->w[p * N + x] : 1.0);
            double *dst = a->v + (p * N + x) * n;
            for (size_t k = 0; k < n; k++)
                dst[k] += w * src[k];
        }
    return TPK_OK;
}

/* a ← a·b (op '*') or a/b (op '/'). */
static int xv_mul(fx *F, xv *a, xv *b, int div, const nsr_expr *e)
{
    size_t N = F->N, n = F->n, m = (size_t)a->m;
    int st;
    if (div && b->kind == XV_CONST && b->c == 0)
        return nsr_fam_err(&F->X, TPK_ETYPE, e->b, "division by the constant 0");
    if (!vecish(a) && !vecish(b)) {
        if (a->kind == XV_CONST && b->kind == XV_CONST) {
            a->c = div ? a->c / b->c : a->c * b->c;
            return TPK_OK;
        }
        if ((st = to_scal(F, a)))
            return st;
        for (size_t i = 0; !F->dry && i < m * N; i++) {
            double y = sc_at(b, i / N, i % N, N);
            a->s[i] = div ? a->s[i] / y : a->s[i] * y;
        }
        return TPK_OK;
    }
    if (!div && !vecish(a)) { /* scalar · vector: the vector on the left */
        xv t = *a;
        *a = *b;
        *b = t;
    }
    if (!vecish(b)) {
        /* vector · scalar: a gather takes the factor into its weights */
        if (a->kind == XV_GATHER) {
            if (a->w == NULL && !F->dry) {
                if ((a->w = fx_buf(F, m * N, &st)) == NULL)
                    return st;
                for (size_t i = 0; i < m * N; i++)
                    a->w[i] = 1.0;
            }
            for (size_t i = 0; !F->dry && i < m * N; i++) {
                double y = sc_at(b, i / N, i % N, N);
                a->w[i] = div ? a->w[i] / y : a->w[i] * y;
            }
            return TPK_OK;
        }
        if (F->dry)
            return TPK_OK;
#pragma omp parallel for schedule(static) if (m * N * n >= PAR_MIN)
        for (size_t r = 0; r < m * N; r++) {
            double y = sc_at(b, r / N, r % N, N);
            if (div)
                y = 1.0 / y;
            for (size_t k = 0; k < n; k++)
                a->v[r * n + k] *= y;
        }
        return TPK_OK;
    }
    /* two vectors (or scalar / vector): elementwise over the coordinates */
    if ((st = to_vec(F, a)) || (st = to_vec(F, b)))
        return st;
    if (F->dry)
        return TPK_OK;
#pragma omp parallel for schedule(static) if (m * N * n >= PAR_MIN)
    for (size_t i = 0; i < m * N * n; i++)
        a->v[i] = div ? a->v[i] / b->v[i] : a->v[i] * b->v[i];
    return TPK_OK;
}

/* ---- blocks ------------------------------------------------------------------------------- */

static int new_block(fx *F, int kind, int fam, long m)
{
    if (F->nb == F->capb) {
        int cap = F->capb ? 2 * F->capb : 64;
        xblock *nb = tpk_realloc(F->X.ctx, F->b, (size_t)cap * sizeof *nb);
        if (nb == NULL)
            return TPK_ERROR(F->X.ctx, TPK_ENOMEM, "out of memory"), -1;
        F->b = nb;
        F->capb = cap;
    }
    xblock *b = &F->b[F->nb];
    memset(b, 0, sizeof *b);
    b->kind = kind;
    b->fam = fam;
    b->fi = F->X.cur;
    b->m = m;
    b->last = -1;
    return F->nb++;
}

/* The block defined before the current instruction holding member idx of family sym. */
static int find_block(fx *F, int sym, const int *idx, long *mem)
{
    for (int k = F->nb - 1; k >= 0; k--) {
        const xblock *b = &F->b[k];
        if (b->fam != sym || b->fi >= F->X.cur)
            continue;
        long r = nsr_trie_find(&b->tr, idx);
        if (r >= 0) {
            *mem = r;
            return k;
        }
    }
    return -1;
}

/* ---- declared members: weights and initial G-vars ------------------------------------------ */

static int dm_of(fx *F, int sym, const nsr_expr *e, int *out)
{
    if (nsr_fam_member(&F->X, sym, e, out))
        return F->X.ctx->status;
    if (F->dmlast[*out] < F->X.cur) /* its weights live until here */
        F->dmlast[*out] = F->X.cur;
    return TPK_OK;
}

/* Member dm's random matrix (rows × cols standard normals) or vector (rows = n, cols = 1),
 * drawn on first use from the stream of its name. */
static const double *dm_draw(fx *F, int dm, int tag, size_t rows, size_t cols, int *st)
{
    if (F->dry || F->dmz[dm] != NULL)
        return F->dmz[dm];
    const nsr_dmember *d = &F->X.R->dm[dm];
    char *name = nsr_member_name(F->X.ctx, F->X.C->sym[d->sym].name, d->nidx, d->idx);
    double *z = name ? fx_buf(F, rows * cols, st) : NULL;
    if (name == NULL && *st == TPK_OK)
        *st = TPK_ERROR(F->X.ctx, TPK_ENOMEM, "out of memory");
    if (z != NULL) {
        uint64_t stream = tpk_rng_stream_named(tag, name);
#pragma omp parallel for schedule(static) if (rows * cols >= PAR_MIN)
        for (size_t r = 0; r < rows; r++)
            if (!tpk_progress_cancelled(F->X.progress)) /* a wide matrix takes seconds */
                tpk_rng_normal_row(F->seed, stream, (uint32_t)r, 0, cols, z + r * cols);
        if (*st == TPK_OK)
            *st = tpk_progress_check(F->X.progress, F->X.ctx);
    }
    tpk_free(F->X.ctx, name);
    F->dmz[dm] = z;
    return z;
}

/* The declared members of an initial G-var family as one block: each member's vector
 * mean + σ·z (the unrolled executor's BIAS instruction), the same for every input. */
static int gdecl_block(fx *F, int sym, int *out)
{
    for (int k = 0; k < F->nb; k++)
        if (F->b[k].fam == sym && F->b[k].fi == -1) {
            *out = k;
            return TPK_OK;
        }
    const nsr_rolled *R = F->X.R;
    long m = 0;
    for (int i = 0; i < R->ndm; i++)
        m += R->dm[i].sym == sym;
    int save = F->X.cur;
    F->X.cur = -1; /* visible to every instruction */
    int k = new_block(F, XB_VEC, sym, m);
    F->X.cur = save;
    if (k < 0)
        return F->X.ctx->status;
    size_t N = F->N, n = F->n;
    int st = TPK_OK;
    double *d = fx_buf(F, (size_t)m * N * n, &st);
    int *tab = nsr_fam_alloc(&F->X, (size_t)m * (NSR_MAX_INDICES + 1), sizeof *tab);
    if (st || tab == NULL) {
        tpk_free(F->X.ctx, d), tpk_free(F->X.ctx, tab);
        return F->X.ctx->status;
    }
    xblock *b = &F->b[k];
    b->d = d;
    b->tr.nlev = -1; /* a table of declared index tuples, searched linearly: members are few */
    b->tr.lo[0] = tab;
    b->tr.nn[0] = m;
    long j = 0;
    for (int i = 0; i < R->ndm; i++) {
        const nsr_dmember *dm = &R->dm[i];
        if (dm->sym != sym)
            continue;
        b->tr.nfix = dm->nidx;
        memcpy(&tab[j * (NSR_MAX_INDICES + 1)], dm->idx, sizeof dm->idx);
        if (d != NULL) {
            char *name = nsr_member_name(F->X.ctx, F->X.C->sym[sym].name, dm->nidx, dm->idx);
            if (name == NULL)
                return TPK_ERROR(F->X.ctx, TPK_ENOMEM, "out of memory");
            uint64_t stream = tpk_rng_stream_named(TPK_RNG_BIAS, name);
            tpk_free(F->X.ctx, name);
            double s = sqrt(dm->var), *row = d + (size_t)j * N * n;
            for (size_t r = 0; r < n; r++)
                row[r] = dm->mean + s * tpk_rng_normal_at(F->seed, stream, (uint32_t)r, 0);
            for (size_t a = 1; a < N; a++)
                memcpy(row + a * n, row, n * sizeof *row);
        }
        j++;
    }
    *out = k;
    return TPK_OK;
}

/* ---- expressions ---------------------------------------------------------------------------- */

static int eval(fx *F, const nsr_irn *n, const nsr_fdom *D, xv *out);

/* Operand i of node n. */
static const nsr_irn *arg(const fx *F, const nsr_irn *n, int i)
{
    return &F->ir->n[n->op == NSR_IR_LIN ? n->terms[i] : n->arg[i]];
}

static int number_value(fx *F, const nsr_expr *e, const nsr_fdom *D, xv *out)
{
    double c;
    if (!nsr_reads_syms(e, D->sym, D->nv, 0)) {
        if (nsr_fam_num(&F->X, e, &c))
            return F->X.ctx->status;
        xv_const(out, D->m, c);
        return TPK_OK;
    }
    xv_const(out, D->m, 0);
    int st = to_scal(F, out);
    for (long p = 0; st == TPK_OK && p < D->m; p++) {
        nsr_bind_point(&F->X, D, p);
        if (nsr_fam_num(&F->X, e, &c))
            return F->X.ctx->status;
        for (size_t a = 0; out->s && a < F->N; a++)
            out->s[(size_t)p * F->N + a] = c;
    }
    return st;
}

/* f[idx...] over the domain: a gather of one block, scalars, or (reads spanning several
 * definitions) the vectors themselves. */
static int eval_name(fx *F, const nsr_expr *e, const nsr_fdom *D, xv *out)
{
    const nsr_sym *y = &F->X.C->sym[e->sym];
    size_t N = F->N, n = F->n, m = (size_t)D->m;
    if (y->kind == NSR_SYM_PARAM || y->kind == NSR_SYM_LOOP) {
        if (e->nidx)
            return nsr_fam_err(&F->X, TPK_ETYPE, e, "'%s' is a number, not a family", e->name);
        return number_value(F, e, D, out);
    }
    int gdecl = y->kind == NSR_SYM_GFAM;
    if (!gdecl && y->kind != NSR_SYM_DFAM)
        return NSR_UNSUP(&F->X, e, "'%s' cannot be read here", e->name);
    int kg = -1;
    if (gdecl && gdecl_block(F, e->sym, &kg))
        return F->X.ctx->status;
    int vary = nsr_reads_syms(e, D->sym, D->nv, 0);
    nsr_imap A;
    int affine = vary && nsr_imap_of(&F->X, e, D, &A);
    int *idx = nsr_fam_alloc(&F->X, m, sizeof *idx), *blk = nsr_fam_alloc(&F->X, m, sizeof *blk);
    if (idx == NULL || blk == NULL) {
        tpk_free(F->X.ctx, idx), tpk_free(F->X.ctx, blk);
        return F->X.ctx->status;
    }
    int st = TPK_OK, k0 = -1, single = 1, scal = -1;
    for (size_t p = 0; p < m && st == TPK_OK; p++) {
        if (!vary && p > 0) {
            idx[p] = idx[0];
            blk[p] = blk[0];
            continue;
        }
        int t[NSR_MAX_INDICES];
        if (affine) {
            nsr_imap_at(&A, &D->val[p * (size_t)D->nv], t);
        } else {
            nsr_bind_point(&F->X, D, (long)p);
            for (int i = 0; i < e->nidx && st == TPK_OK; i++)
                st = nsr_fam_int(&F->X, e->idx[i], &t[i]);
            if (st)
                break;
        }
        long mem = -1;
        int k = gdecl ? kg : k0 >= 0 && (mem = nsr_trie_find(&F->b[k0].tr, t)) >= 0 ? k0
                                                 : find_block(F, e->sym, t, &mem);
        if (gdecl && (mem = nsr_trie_find(&F->b[kg].tr, t)) < 0)
            k = -1;
        if (k < 0) {
            char buf[80] = "";
            size_t q = 0;
            for (int i = 0; i < e->nidx && q < sizeof buf; i++)
                q += (size_t)snprintf(buf + q, sizeof buf - q, "%s%d", i ? "," : "", t[i]);
            st = nsr_fam_err(&F->X, TPK_ETYPE, e, "%s[%s] is read but not defined before "
                             "(members are defined for %s)", e->name, buf,
                             y->ranges[0] ? y->ranges : "?");
            break;
        }
        touch(F, k);
        int sc = F->b[k].kind == XB_SCAL;
        if (scal >= 0 && sc != scal && F->b[k].kind != XB_ZERO)
            st = NSR_UNSUP(&F->X, e, "%s mixes scalar and vector members in one read", e->name);
        if (F->b[k].kind != XB_ZERO)
            scal = sc;
        if (k0 >= 0 && k != k0)
            single = 0;
        k0 = k;
        idx[p] = (int)mem;
        blk[p] = k;
    }
    if (st) {
        tpk_free(F->X.ctx, idx), tpk_free(F->X.ctx, blk);
        return st;
    }
    memset(out, 0, sizeof *out);
    out->m = D->m;
    if (scal == 1) {
        out->kind = XV_SCAL;
        out->s = fx_buf(F, m * N, &st);
        for (size_t p = 0; out->s && p < m; p++)
            for (size_t a = 0; a < N; a++) {
                const xblock *b = &F->b[blk[p]];
                out->s[p * N + a] = b->kind == XB_ZERO ? 0 : b->d[(size_t)idx[p] * N + a];
            }
        tpk_free(F->X.ctx, idx), tpk_free(F->X.ctx, blk);
        return st;
    }
    if (scal < 0) { /* only zero members */
        tpk_free(F->X.ctx, idx), tpk_free(F->X.ctx, blk);
        xv_const(out, D->m, 0);
        out->kind = XV_VEC;
        out->v = fx_buf(F, m * N * n, &st);
        return st;
    }
    if (single) {
        out->kind = XV_GATHER;
        out->blk = k0;
        out->idx = idx;
        tpk_free(F->X.ctx, blk);
        return TPK_OK;
    }
    out->kind = XV_VEC;
    out->v = fx_buf(F, m * N * n, &st);
    for (size_t p = 0; out->v && p < m; p++) {
        const xblock *b = &F->b[blk[p]];
        double *dst = out->v + p * N * n;
        if (b->kind == XB_ZERO)
            memset(dst, 0, N * n * sizeof *dst);
        else
            memcpy(dst, b->d + (size_t)idx[p] * N * n, N * n * sizeof *dst);
    }
    tpk_free(F->X.ctx, idx), tpk_free(F->X.ctx, blk);
    return st;
}

/* A·src over the domain, A[idx] possibly changing from point to point (convolution taps): one
 * GEMM per A-var member over the rows of its points. An embedding reads the input slots. */
static int eval_matmul(fx *F, const nsr_irn *mm, const nsr_fdom *D, xv *out)
{
    size_t N = F->N, n = F->n, m = (size_t)D->m;
    const nsr_expr *am = mm->e;
    const nsr_irn *sn = arg(F, mm, 0);
    const nsr_expr *src = sn->e;
    int embed = mm->embed;
    int vary = nsr_reads_syms(am, D->sym, D->nv, 0);
    int *dm = nsr_fam_alloc(&F->X, m, sizeof *dm), *slot = NULL;
    if (dm == NULL)
        return F->X.ctx->status;
    int st = TPK_OK;
    for (size_t p = 0; p < m && st == TPK_OK; p++) {
        if (!vary && p > 0) {
            dm[p] = dm[0];
            continue;
        }
        nsr_bind_point(&F->X, D, (long)p);
        st = dm_of(F, am->sym, am, &dm[p]);
    }
    xv u;
    memset(&u, 0, sizeof u);
    size_t cols = n;
    if (st == TPK_OK && embed) {
        const nsr_rolled *R = F->X.R;
        cols = F->d;
        if (src->nidx != (F->p->nslots > 1 || src->nidx ? 1 : 0))
            st = nsr_fam_err(&F->X, TPK_ETYPE, src, "the input is read as %s[t]", src->name);
        if (st == TPK_OK && (slot = nsr_fam_alloc(&F->X, m, sizeof *slot)) == NULL)
            st = F->X.ctx->status;
        int svary = nsr_reads_syms(src, D->sym, D->nv, 0);
        for (size_t p = 0; p < m && st == TPK_OK; p++) {
            int t = R->input_lo;
            if (!svary && p > 0) {
                slot[p] = slot[0];
                continue;
            }
            nsr_bind_point(&F->X, D, (long)p);
            if (src->nidx && (st = nsr_fam_int(&F->X, src->idx[0], &t)))
                break;
            if (t - R->input_lo < 0 || t - R->input_lo >= F->p->nslots)
                st = nsr_fam_err(&F->X, TPK_ETYPE, src, "input slot %d is outside %d..%d", t,
                                 R->input_lo, R->input_lo + F->p->nslots - 1);
            slot[p] = t - R->input_lo;
        }
    } else if (st == TPK_OK) {
        st = eval(F, sn, D, &u);
        if (st == TPK_OK && !vecish(&u) && u.kind != XV_CONST)
            st = nsr_fam_err(&F->X, TPK_ETYPE, src, "MatMul of a scalar: %s needs a G- or H-var",
                             am->name);
        if (st == TPK_OK && (u.kind == XV_CONST ||
                             (u.kind == XV_GATHER && (u.w || F->b[u.blk].m != D->m ||
                                                      F->b[u.blk].kind == XB_ZERO))))
            st = to_vec(F, &u);
        for (size_t p = 0; st == TPK_OK && u.kind == XV_GATHER && p < m; p++)
            if (u.idx[p] != (int)p)
                st = to_vec(F, &u);
    }
    memset(out, 0, sizeof *out);
    out->kind = XV_VEC;
    out->m = D->m;
    if (st == TPK_OK)
        out->v = fx_buf(F, m * N * n, &st);
    /* the source rows: the gathered input slots, or u's (m·N) × n matrix */
    double *xin = NULL;
    if (st == TPK_OK && embed && !F->dry && (xin = fx_buf(F, m * N * cols, &st)) != NULL)
        for (size_t p = 0; p < m; p++)
            for (size_t a = 0; a < N; a++)
                memcpy(xin + (p * N + a) * cols, F->x + (a * F->T + (size_t)slot[p]) * cols,
                       cols * sizeof *xin);
    const double *in = embed ? xin : u.kind == XV_GATHER ? (F->dry ? NULL : F->b[u.blk].d) : u.v;
    /* one GEMM per distinct member, over its points (one run of points in the common case) */
    int *pts = st ? NULL : nsr_fam_alloc(&F->X, m, sizeof *pts);
    char *done = st ? NULL : nsr_fam_alloc(&F->X, m, 1);
    if (st == TPK_OK && (pts == NULL || done == NULL))
        st = F->X.ctx->status;
    double *ti = NULL, *to = NULL;
    for (size_t p0 = 0; st == TPK_OK && p0 < m; p0++) {
        if (done[p0])
            continue;
        size_t k = 0;
        for (size_t p = p0; p < m; p++)
            if (!done[p] && dm[p] == dm[p0]) {
                pts[k++] = (int)p;
                done[p] = 1;
            }
        const nsr_dmember *d = &F->X.R->dm[dm[p0]];
        const double *Z = dm_draw(F, dm[p0], embed ? TPK_RNG_EMBED : TPK_RNG_AVAR, n, cols, &st);
        if (st || F->dry)
            continue;
        double s = sqrt(d->var / (double)cols);
        int run = (size_t)pts[k - 1] - (size_t)pts[0] == k - 1;
        if (run) {
            st = tpk_dgemm(TPK_NO_TRANS, TPK_TRANS, k * N, n, cols, s, in + (size_t)pts[0] * N * cols,
                           cols, Z, cols, 0.0, out->v + (size_t)pts[0] * N * n, n, F->X.ctx);
            continue;
        }
        if (ti == NULL && ((ti = fx_buf(F, m * N * cols, &st)) == NULL ||
                           (to = fx_buf(F, m * N * n, &st)) == NULL))
            break;
        for (size_t q = 0; q < k; q++)
            memcpy(ti + q * N * cols, in + (size_t)pts[q] * N * cols, N * cols * sizeof *ti);
        st = tpk_dgemm(TPK_NO_TRANS, TPK_TRANS, k * N, n, cols, s, ti, cols, Z, cols, 0.0, to, n,
                       F->X.ctx);
        for (size_t q = 0; st == TPK_OK && q < k; q++)
            memcpy(out->v + (size_t)pts[q] * N * n, to + q * N * n, N * n * sizeof *to);
    }
    tpk_free(F->X.ctx, ti), tpk_free(F->X.ctx, to), tpk_free(F->X.ctx, pts), tpk_free(F->X.ctx, done), tpk_free(F->X.ctx, xin), tpk_free(F->X.ctx, slot), tpk_free(F->X.ctx, dm);
    xv_free(F, &u);
    if (st) /* nothing is left in out on failure (what eval's callers rely on) */
        xv_free(F, out);
    return st;
}

/* Σ over the binder of e's body: X = D × binder; scalars and vectors add into their parent
 * point. A weighted gather of one block is a mixing matrix: per input one GEMM W·F when the
 * points fill enough of it (attention), else an axpy per point. */
static int eval_sum(fx *F, const nsr_irn *sn, const nsr_fdom *D, xv *out)
{
    nsr_fdom X;
    long *parent = NULL;
    if (nsr_extend(&F->X, sn->e, D, &X, &parent))
        return F->X.ctx->status;
    xv v;
    int st = eval(F, arg(F, sn, 0), &X, &v);
    tpk_free(F->X.ctx, X.val);
    size_t N = F->N, n = F->n, m = (size_t)D->m, mx = (size_t)X.m;
    memset(out, 0, sizeof *out);
    out->m = D->m;
    if (st == TPK_OK && !vecish(&v)) {
        out->kind = XV_SCAL;
        out->s = fx_buf(F, m * N, &st);
        for (size_t r = 0; out->s && r < mx; r++)
            for (size_t a = 0; a < N; a++)
                out->s[(size_t)parent[r] * N + a] += sc_at(&v, r, a, N);
    } else if (st == TPK_OK) {
        out->kind = XV_VEC;
        out->v = fx_buf(F, m * N * n, &st);
    }
    if (st || !vecish(&v) || F->dry) {
        tpk_free(F->X.ctx, parent);
        xv_free(F, &v);
        return st;
    }
    if (v.kind == XV_VEC) {
        for (size_t r = 0; r < mx; r++) {
            double *dst = out->v + (size_t)parent[r] * N * n;
            const double *src = v.v + r * N * n;
            for (size_t i = 0; i < N * n; i++)
                dst[i] += src[i];
        }
        tpk_free(F->X.ctx, parent);
        xv_free(F, &v);
        return TPK_OK;
    }
    const xblock *b = &F->b[v.blk];
    size_t mb = (size_t)b->m;
    if (b->kind != XB_ZERO && 4 * mx >= m * mb && m * mb <= ((size_t)1 << 26)) {
        /* dense: out_a = W_a F_a with W_a the m × mb weights of input a */
        double *W = fx_buf(F, m * mb, &st);
        for (size_t a = 0; W && a < N && st == TPK_OK; a++) {
            memset(W, 0, m * mb * sizeof *W);
            for (size_t r = 0; r < mx; r++)
                if (v.idx[r] >= 0)
                    W[(size_t)parent[r] * mb + (size_t)v.idx[r]] += v.w ? v.w[r * N + a] : 1.0;
            st = tpk_dgemm(TPK_NO_TRANS, TPK_NO_TRANS, m, n, mb, 1.0, W, mb, b->d + a * n, N * n,
                           0.0, out->v + a * n, N * n, F->X.ctx);
        }
        tpk_free(F->X.ctx, W);
    } else if (b->kind != XB_ZERO) {
#pragma omp parallel for schedule(static) if (m * N * n >= PAR_MIN)
        for (size_t a = 0; a < N; a++)
            for (size_t r = 0; r < mx; r++) {
                if (v.idx[r] < 0)
                    continue;
                double w = v.w ? v.w[r * N + a] : 1.0;
                const double *src = b->d + ((size_t)v.idx[r] * N + a) * n;
                double *dst = out->v + ((size_t)parent[r] * N + a) * n;
                for (size_t k = 0; k < n; k++)
                    dst[k] += w * src[k];
            }
    }
    tpk_free(F->X.ctx, parent);
    xv_free(F, &v);
    return st;
}

/* softmax(j in lo..hi: s) at the enclosing j, one row per point with j dropped, shifted by
 * the row maximum. */
static int eval_softmax(fx *F, const nsr_irn *sn, const nsr_fdom *D, xv *out)
{
    nsr_softmax_shape S;
    xv v;
    memset(&v, 0, sizeof v);
    int st = nsr_softmax_shape_of(&F->X, sn->e, D, &S);
    if (st == TPK_OK)
        st = eval(F, arg(F, sn, 0), &S.X, &v);
    if (st == TPK_OK && vecish(&v))
        st = nsr_fam_err(&F->X, TPK_ETYPE, sn->e->a, "softmax of a vector: its argument must be "
                         "scalars (Moments)");
    if (st == TPK_OK)
        st = to_scal(F, &v);
    size_t N = F->N, m = (size_t)D->m, nr = (size_t)S.rows.m;
    xv_const(out, D->m, 0);
    if (st == TPK_OK)
        st = to_scal(F, out);
    double *z = st ? NULL : fx_buf(F, nr * N, &st), *mr = st ? NULL : fx_buf(F, nr * N, &st);
    for (size_t r = 0; z && mr && r < nr; r++)
        for (size_t a = 0; a < N; a++) {
            double mm = -INFINITY, zz = 0;
            for (long q = S.start[r]; q < S.start[r + 1]; q++)
                mm = fmax(mm, v.s[(size_t)q * N + a]);
            for (long q = S.start[r]; q < S.start[r + 1]; q++)
                zz += exp(v.s[(size_t)q * N + a] - mm);
            z[r * N + a] = zz;
            mr[r * N + a] = mm;
        }
    for (size_t p = 0; z && mr && p < m; p++)
        for (size_t a = 0; a < N; a++) {
            size_t r = (size_t)S.row[p];
            out->s[p * N + a] = exp(v.s[(size_t)S.pick[p] * N + a] - mr[r * N + a]) / z[r * N + a];
        }
    tpk_free(F->X.ctx, z), tpk_free(F->X.ctx, mr);
    nsr_softmax_shape_free(&S, F->X.ctx);
    xv_free(F, &v);
    return st;
}

/* mean over the n coordinates. mean(u·v) of two gathers needs no product: dot products, or per
 * input the Gram matrix of the two blocks (tpk_dgemm) when the points cover enough pairs. */
static int eval_mean(fx *F, const nsr_irn *mn, const nsr_fdom *D, xv *out)
{
    size_t N = F->N, n = F->n, m = (size_t)D->m;
    const nsr_irn *body = arg(F, mn, 0);
    int st;
    xv_const(out, D->m, 0);
    if (body->op == NSR_IR_MUL) {
        xv a, b;
        if (eval(F, arg(F, body, 0), D, &a))
            return F->X.ctx->status;
        if (eval(F, arg(F, body, 1), D, &b)) {
            xv_free(F, &a);
            return F->X.ctx->status;
        }
        if (a.kind == XV_GATHER && b.kind == XV_GATHER && F->b[a.blk].kind != XB_ZERO &&
            F->b[b.blk].kind != XB_ZERO) {
            const xblock *A = &F->b[a.blk], *B = &F->b[b.blk];
            size_t ma = (size_t)A->m, mb = (size_t)B->m;
            st = to_scal(F, out);
            int gram = 4 * m >= ma * mb && ma * mb <= ((size_t)1 << 26);
            double *G = st || !gram ? NULL : fx_buf(F, ma * mb, &st);
            for (size_t x = 0; !F->dry && st == TPK_OK && x < N; x++) {
                if (gram)
                    st = tpk_dgemm(TPK_NO_TRANS, TPK_TRANS, ma, mb, n, 1.0 / (double)n,
                                   A->d + x * n, N * n, B->d + x * n, N * n, 0.0, G, mb, F->X.ctx);
#pragma omp parallel for schedule(static) if (!gram && m * n >= PAR_MIN)
                for (size_t p = 0; p < m; p++) {
                    double s = 0;
                    if (a.idx[p] >= 0 && b.idx[p] >= 0) {
                        if (gram) {
                            s = G[(size_t)a.idx[p] * mb + (size_t)b.idx[p]];
                        } else {
                            const double *u = A->d + ((size_t)a.idx[p] * N + x) * n;
                            const double *w = B->d + ((size_t)b.idx[p] * N + x) * n;
                            for (size_t k = 0; k < n; k++)
                                s += u[k] * w[k];
                            s /= (double)n;
                        }
                    }
                    out->s[p * N + x] = s * (a.w ? a.w[p * N + x] : 1.0) * (b.w ? b.w[p * N + x] : 1.0);
                }
            }
            tpk_free(F->X.ctx, G);
            xv_free(F, &a), xv_free(F, &b);
            return st;
        }
        st = xv_mul(F, &a, &b, 0, body->e);
        xv_free(F, &b);
        if (st) {
            xv_free(F, &a);
            return st;
        }
        *out = a;
    } else if (eval(F, body, D, out)) {
        return F->X.ctx->status;
    }
    if (!vecish(out))
        return TPK_OK; /* the mean of a number over the coordinates is that number */
    if ((st = to_vec(F, out)))
        return st;
    int st2 = TPK_OK;
    double *s = fx_buf(F, m * N, &st2);
    if (st2)
        return st2;
#pragma omp parallel for schedule(static) if (s && m * N * n >= PAR_MIN)
    for (size_t r = 0; r < (s ? m * N : 0); r++) {
        double acc = 0;
        for (size_t k = 0; k < n; k++)
            acc += out->v[r * n + k];
        s[r] = acc / (double)n;
    }
    tpk_free(F->X.ctx, out->v);
    out->v = NULL;
    out->kind = XV_SCAL;
    out->s = s;
    return TPK_OK;
}

/* A function applied entrywise. */
static int eval_phi(fx *F, const nsr_irn *mp, const nsr_fdom *D, xv *out)
{
    if (mp->narg != 1)
        return nsr_fam_err(&F->X, TPK_ETYPE, mp->e, "%s takes one argument", mp->e->name);
    if (eval(F, arg(F, mp, 0), D, out))
        return F->X.ctx->status;
    size_t N = F->N, n = F->n, m = (size_t)D->m;
    if (out->kind == XV_CONST) {
        out->c = tpk_phi_eval(mp->phi, out->c);
        return TPK_OK;
    }
    if (out->kind == XV_SCAL) {
        for (size_t i = 0; !F->dry && i < m * N; i++)
            out->s[i] = tpk_phi_eval(mp->phi, out->s[i]);
        return TPK_OK;
    }
    int st = to_vec(F, out);
    if (st || F->dry)
        return st;
    const tpk_phi *phi = mp->phi;
#pragma omp parallel for schedule(static) if (m * N * n >= PAR_MIN)
    for (size_t i = 0; i < m * N * n; i++)
        out->v[i] = tpk_phi_eval(phi, out->v[i]);
    return TPK_OK;
}

/* A LinComb: the terms added left to right, as the program writes them. */
static int eval_lin(fx *F, const nsr_irn *ln, const nsr_fdom *D, xv *out)
{
    if (eval(F, arg(F, ln, 0), D, out))
        return F->X.ctx->status;
    int st = TPK_OK;
    if (ln->sign[0] < 0) {
        xv c;
        xv_const(&c, D->m, -1);
        st = xv_mul(F, out, &c, 0, ln->e);
    }
    for (int i = 1; st == TPK_OK && i < ln->nterms; i++) {
        xv b;
        if ((st = eval(F, arg(F, ln, i), D, &b)))
            break;
        st = xv_add(F, out, &b, ln->sign[i]);
        xv_free(F, &b);
    }
    if (st)
        xv_free(F, out);
    return st;
}

static int eval_pow(fx *F, const nsr_irn *pn, const nsr_fdom *D, xv *out)
{
    size_t N = F->N, n = F->n, m = (size_t)D->m;
    double k;
    int st;
    if (nsr_fam_num(&F->X, pn->e->b, &k) || eval(F, arg(F, pn, 0), D, out))
        return F->X.ctx->status;
    if (k == 1)
        return TPK_OK;
    if (out->kind == XV_CONST) {
        out->c = pow(out->c, k);
        return TPK_OK;
    }
    if (vecish(out) && (st = to_vec(F, out)))
        return st;
    double *q = out->kind == XV_SCAL ? out->s : out->v;
    size_t cnt = out->kind == XV_SCAL ? m * N : m * N * n;
    int two = k == 2;
    for (size_t i = 0; !F->dry && i < cnt; i++)
        q[i] = two ? q[i] * q[i] : pow(q[i], k);
    return TPK_OK;
}

static int eval_arith(fx *F, const nsr_irn *an, const nsr_fdom *D, xv *out)
{
    xv a, b;
    if (eval(F, arg(F, an, 0), D, &a))
        return F->X.ctx->status;
    if (eval(F, arg(F, an, 1), D, &b)) {
        xv_free(F, &a);
        return F->X.ctx->status;
    }
    int st = xv_mul(F, &a, &b, an->op == NSR_IR_DIV, an->e);
    xv_free(F, &b);
    if (st) {
        xv_free(F, &a);
        return st;
    }
    *out = a;
    return TPK_OK;
}

/* The one dispatch: each instruction kind lowered here, once. */
static int eval(fx *F, const nsr_irn *n, const nsr_fdom *D, xv *out)
{
    memset(out, 0, sizeof *out);
    out->m = D->m;
    if (F->X.ctx->status)
        return F->X.ctx->status;
    const nsr_expr *e = n->e;
    switch (n->op) {
    case NSR_IR_NUM:
        if (e->kind == NSR_E_NUM) {
            xv_const(out, D->m, e->num);
            return TPK_OK;
        }
        return number_value(F, e, D, out);
    case NSR_IR_SQRTN:
        xv_const(out, D->m, sqrt((double)F->n));
        return TPK_OK;
    case NSR_IR_READ:
        return eval_name(F, e, D, out);
    case NSR_IR_INPUT:
        return nsr_fam_err(&F->X, TPK_ETYPE, e, "the input can only be embedded (U %s)", e->name);
    case NSR_IR_MATMUL:
        return eval_matmul(F, n, D, out);
    case NSR_IR_MAP:
        return eval_phi(F, n, D, out);
    case NSR_IR_BN:
        return NSR_UNSUP(&F->X, e, "bn(...) is run by the unrolled executor");
    case NSR_IR_LIN:
        return eval_lin(F, n, D, out);
    case NSR_IR_MUL:
    case NSR_IR_DIV:
        return eval_arith(F, n, D, out);
    case NSR_IR_POW:
        return eval_pow(F, n, D, out);
    case NSR_IR_SUM:
        return eval_sum(F, n, D, out);
    case NSR_IR_SOFTMAX:
        return eval_softmax(F, n, D, out);
    case NSR_IR_MOMENT:
        return eval_mean(F, n, D, out);
    case NSR_IR_UNSUP: {
        char what[96];
        return NSR_UNSUP(&F->X, e, "%s is not taken by the rolled executor",
                         nsr_ir_unsup_text(n, what, sizeof what));
    }
    default:
        return NSR_UNSUP(&F->X, e, "internal: %s is not a value", nsr_ir_op_name(n->op));
    }
}

/* ---- instructions --------------------------------------------------------------------------- */

typedef struct xout {
    double *h;        /* m × N × n */
    long m;
    double var, bias_var;
} xout;

static int run_def(fx *F, const nsr_finstr *fi)
{
    const nsr_stmt *s = fi->stmt;
    const nsr_irn *root = &F->ir->n[nsr_ir_root(F->ir, F->X.cur)];
    nsr_fdom D;
    nsr_trie tr;
    memset(&tr, 0, sizeof tr);
    memset(&D, 0, sizeof D);
    xv v;
    memset(&v, 0, sizeof v);
    int st = nsr_instr_domain(&F->X, fi, &D, &tr);
    if (st == TPK_OK)
        st = eval(F, arg(F, root, 0), &D, &v);
    tpk_free(F->X.ctx, D.val);
    int kind = XB_VEC;
    if (st == TPK_OK && !vecish(&v)) {
        if (s->annot == NSR_ANN_G || s->annot == NSR_ANN_H)
            st = nsr_fam_err(&F->X, TPK_ETYPE, s->value, "%s is annotated %s but its value is a "
                             "scalar", s->name, s->annot == NSR_ANN_G ? "G" : "H");
        kind = v.kind == XV_CONST && v.c == 0 && s->annot != NSR_ANN_SCALAR ? XB_ZERO : XB_SCAL;
        if (st == TPK_OK && kind == XB_SCAL)
            st = to_scal(F, &v);
    } else if (st == TPK_OK) {
        if (s->annot == NSR_ANN_SCALAR)
            st = nsr_fam_err(&F->X, TPK_ETYPE, s->value, "%s is annotated scalar but its value "
                             "is a vector", s->name);
        else
            st = to_vec(F, &v);
    }
    int k = st ? -1 : new_block(F, kind, s->fam, D.m);
    if (k < 0) {
        xv_free(F, &v);
        nsr_trie_free(&tr, F->X.ctx);
        return st ? st : F->X.ctx->status;
    }
    xblock *b = &F->b[k];
    b->tr = tr;
    if (kind == XB_SCAL) {
        b->d = v.s;
        v.s = NULL;
    } else if (kind == XB_VEC) {
        b->d = v.v;
        v.v = NULL;
    }
    xv_free(F, &v);
    return TPK_OK;
}

static int run_output(fx *F, const nsr_finstr *fi, xout *o)
{
    const nsr_irn *root = &F->ir->n[nsr_ir_root(F->ir, F->X.cur)];
    const nsr_expr *rd = root->e;
    nsr_fdom D;
    nsr_trie tr;
    memset(&tr, 0, sizeof tr);
    memset(o, 0, sizeof *o);
    int st = nsr_instr_domain(&F->X, fi, &D, &tr);
    nsr_trie_free(&tr, F->X.ctx);
    if (st == TPK_OK && (nsr_fam_num(&F->X, arg(F, root, 1)->e, &o->var) ||
                         (root->narg == 3 && nsr_fam_num(&F->X, arg(F, root, 2)->e, &o->bias_var))))
        st = F->X.ctx->status;
    if (st == TPK_OK && (o->var < 0 || o->bias_var < 0))
        st = nsr_fam_err(&F->X, TPK_ETYPE, rd, "readout variance is negative");
    xv v;
    memset(&v, 0, sizeof v);
    if (st == TPK_OK)
        st = eval(F, arg(F, root, 0), &D, &v);
    if (st == TPK_OK && !vecish(&v))
        st = nsr_fam_err(&F->X, TPK_ETYPE, rd->args[0], "readout needs a G- or H-var, not a scalar");
    if (st == TPK_OK)
        st = to_vec(F, &v);
    o->m = D.m;
    o->h = v.v;
    v.v = NULL;
    xv_free(F, &v);
    tpk_free(F->X.ctx, D.val);
    return st;
}

/* ---- driver ------------------------------------------------------------------------------- */

static void fx_free(fx *F)
{
    for (int k = 0; k < F->nb; k++) {
        tpk_free(F->X.ctx, F->b[k].d);
        nsr_trie_free(&F->b[k].tr, F->X.ctx);
    }
    tpk_free(F->X.ctx, F->b);
    if (F->dmz)
        for (int i = 0; i < F->X.R->ndm; i++)
            tpk_free(F->X.ctx, F->dmz[i]);
    tpk_free(F->X.ctx, F->dmz);
    tpk_free(F->X.ctx, F->dmlast);
    nsr_fam_free(&F->X);
}

static int fx_init(fx *F, const tpk_program *p, size_t N, size_t T, size_t d, size_t n,
                   uint64_t seed, const double *x, tpk_ctx *ctx)
{
    memset(F, 0, sizeof *F);
    int st = nsr_fam_init(&F->X, p, ctx);
    F->X.big_hint = "one family over (member × input × width)";
    F->p = p;
    F->N = N;
    F->T = T;
    F->d = d;
    F->n = n;
    F->seed = seed;
    F->x = x;
    F->dry = x == NULL;
    F->ir = F->X.R->ir;
    if (st == TPK_OK && F->ir == NULL)
        st = TPK_ERROR(ctx, TPK_EINVAL, "internal: %s has no family IR", F->X.R->file);
    if (st)
        return st;
    F->dmz = nsr_fam_alloc(&F->X, (size_t)F->X.R->ndm + 1, sizeof *F->dmz);
    F->dmlast = nsr_fam_alloc(&F->X, (size_t)F->X.R->ndm + 1, sizeof *F->dmlast);
    if (F->dmz == NULL || F->dmlast == NULL)
        return ctx->status;
    for (int i = 0; i < F->X.R->ndm; i++)
        F->dmlast[i] = -1;
    return TPK_OK;
}

/* Drop the blocks and weights the dry pass saw last used at instruction k. */
static void release(fx *F, int k)
{
    for (int b = 0; b < F->nb && b < F->nblast; b++)
        if (F->blast[b] <= k && F->b[b].last != INT_MAX) {
            tpk_free(F->X.ctx, F->b[b].d);
            F->b[b].d = NULL;
            F->b[b].last = INT_MAX;
        }
    for (int i = 0; i < F->X.R->ndm; i++)
        if (F->dlast[i] <= k && F->dmz[i] != NULL) {
            tpk_free(F->X.ctx, F->dmz[i]);
            F->dmz[i] = NULL;
        }
}

/* One pass: the outputs' vectors into out[0..*nout), or (dry) liveness only. */
static int fx_run(fx *F, xout **outp, int *noutp)
{
    const nsr_rolled *R = F->X.R;
    int nout = 0, st = TPK_OK;
    for (int k = 0; k < R->nfi; k++)
        nout += R->fi[k].stmt->kind == NSR_S_OUTPUT;
    if (nout == 0)
        return TPK_ERROR(F->X.ctx, TPK_ETYPE, "%s: the program has no output", R->file);
    xout *out = nsr_fam_alloc(&F->X, (size_t)nout, sizeof *out);
    if (out == NULL)
        return F->X.ctx->status;
    int no = 0;
    for (int k = 0; k < R->nfi && st == TPK_OK; k++) {
        if (!F->dry && (st = tpk_progress_report(F->X.progress, "family instructions", (size_t)k,
                                                 (size_t)R->nfi, F->X.ctx)))
            break;
        F->X.cur = k;
        memcpy(F->X.num, R->fi[k].num, ((size_t)F->X.C->nsym + 1) * sizeof *F->X.num);
        st = R->fi[k].stmt->kind == NSR_S_OUTPUT ? run_output(F, &R->fi[k], &out[no++])
                                                 : run_def(F, &R->fi[k]);
        if (st == TPK_OK && !F->dry)
            release(F, k);
    }
    if (st == TPK_OK && !F->dry)
        st = tpk_progress_report(F->X.progress, "family instructions", (size_t)R->nfi,
                                 (size_t)R->nfi, F->X.ctx);
    if (st) {
        for (int i = 0; i < no; i++)
            tpk_free(F->X.ctx, out[i].h);
        tpk_free(F->X.ctx, out);
        return st;
    }
    *outp = out;
    *noutp = no;
    return TPK_OK;
}

int nsr_fexec_run(const tpk_program *p, const tpk_array *x, size_t n, uint64_t seed,
                  int all_outputs, tpk_array **Khat, tpk_array **y, int *unsupported,
                  const tpk_progress *progress, tpk_ctx *ctx)
{
    *unsupported = 0;
    size_t N, T, d;
    int st = nsr_rolled_input(p, x, &N, &T, &d, ctx);
    if (st)
        return st;
    /* the dry pass: every block's and every declared member's last use */
    fx P;
    xout *out = NULL;
    int no = 0;
    st = fx_init(&P, p, N, T, d, n, seed, NULL, ctx);
    if (st == TPK_OK)
        st = fx_run(&P, &out, &no);
    *unsupported = P.X.unsup;
    tpk_free(ctx, out);
    out = NULL;
    no = 0; /* the real run fills them again (a failure before it leaves none) */
    int nb = P.nb, ndm = P.X.R->ndm;
    int *blast = st ? NULL : tpk_malloc(ctx, ((size_t)nb + 1) * sizeof *blast);
    int *dlast = st ? NULL : tpk_malloc(ctx, ((size_t)ndm + 1) * sizeof *dlast);
    if (st == TPK_OK && (blast == NULL || dlast == NULL))
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    for (int k = 0; st == TPK_OK && k < nb; k++)
        blast[k] = P.b[k].last < 0 ? P.b[k].fi : P.b[k].last;
    for (int i = 0; st == TPK_OK && i < ndm; i++)
        dlast[i] = P.dmlast[i];
    fx_free(&P);
    fx F;
    memset(&F, 0, sizeof F);
    if (st == TPK_OK && (st = fx_init(&F, p, N, T, d, n, seed, x->data, ctx)) == TPK_OK)
        *unsupported = 0;
    F.X.progress = progress;
    F.blast = blast;
    F.nblast = nb;
    F.dlast = dlast;
    if (st == TPK_OK) {
        st = fx_run(&F, &out, &no);
        *unsupported = F.X.unsup;
    }
    if (st == TPK_OK && F.nb != nb)
        st = TPK_ERROR(ctx, TPK_EINVAL, "internal: the dry pass and the run differ (%d vs %d "
                       "blocks)", nb, F.nb);
    /* the outputs, in program order, as rows (input, output) of one (N·O) × n matrix scaled by
     * σ_v/√n: K̂ = H Hᵀ + β (the unrolled executor's (a, o) order) */
    int o0 = 0;
    size_t O = 0;
    if (st == TPK_OK && !all_outputs) {
        o0 = no - 1;
        O = 1;
    } else if (st == TPK_OK) { /* after a failure out may not exist */
        for (int i = 0; i < no; i++)
            O += (size_t)out[i].m;
    }
    size_t dim = N * O;
    double *H = st ? NULL : nsr_fam_alloc(&F.X, dim * n, sizeof *H);
    double *beta = st ? NULL : nsr_fam_alloc(&F.X, O, sizeof *beta);
    if (st == TPK_OK && (H == NULL || beta == NULL))
        st = ctx->status;
    size_t oc = 0;
    for (int i = o0; st == TPK_OK && i < no; i++) {
        size_t m = (size_t)out[i].m, p0 = all_outputs ? 0 : m - 1;
        for (size_t q = p0; q < m; q++, oc++) {
            double s = sqrt(out[i].var / (double)n);
            beta[oc] = sqrt(out[i].bias_var);
            for (size_t a = 0; a < N; a++) {
                const double *h = out[i].h + (q * N + a) * n;
                double *dst = H + (a * O + oc) * n;
                for (size_t k = 0; k < n; k++)
                    dst[k] = s * h[k];
            }
        }
    }
    tpk_array *K = st ? NULL : tpk_array_alloc2(dim, dim, ctx);
    if (st == TPK_OK && K == NULL)
        st = ctx->status;
    if (st == TPK_OK)
        st = tpk_dgemm(TPK_NO_TRANS, TPK_TRANS, dim, dim, n, 1.0, H, n, H, n, 0.0, K->data, dim, ctx);
    if (st == TPK_OK) {
        for (size_t r = 0; r < dim; r++)
            for (size_t c = 0; c <= r; c++) {
                /* mirror the lower triangle so K̂ is exactly symmetric */
                double v = K->data[r * dim + c] + beta[r % O] * beta[c % O];
                K->data[r * dim + c] = v;
                K->data[c * dim + r] = v;
            }
    }
    tpk_array *Y = NULL;
    if (st == TPK_OK && y != NULL) {
        /* y = ⟨v, h⟩/√n·σ_v + √β·z_b, one readout v ~ N(0, 1)·σ_v shared by all outputs (§1.5) */
        Y = tpk_array_alloc2(N, O, ctx);
        double *v = Y ? tpk_malloc(ctx, n * sizeof *v) : NULL;
        if (Y == NULL || v == NULL) {
            tpk_free(ctx, v);
            st = Y == NULL ? ctx->status : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        } else {
            for (size_t r = 0; r < n; r++)
                v[r] = tpk_rng_normal_at(seed, TPK_RNG_STREAM(TPK_RNG_READOUT, 0), (uint32_t)r, 0);
            double zb = tpk_rng_normal_at(seed, TPK_RNG_STREAM(TPK_RNG_READOUT, 1), 0, 0);
            for (size_t a = 0; a < N; a++)
                for (size_t o = 0; o < O; o++) {
                    const double *h = H + (a * O + o) * n;
                    double acc = 0.0;
                    for (size_t r = 0; r < n; r++)
                        acc += v[r] * h[r];
                    Y->data[a * O + o] = acc + beta[o] * zb;
                }
            tpk_free(ctx, v);
        }
    }
    for (int i = 0; i < no; i++)
        tpk_free(ctx, out[i].h);
    tpk_free(ctx, out), tpk_free(ctx, H), tpk_free(ctx, beta), tpk_free(ctx, blast), tpk_free(ctx, dlast);
    fx_free(&F);
    if (st) {
        tpk_array_free(K);
        tpk_array_free(Y);
        return st;
    }
    *Khat = K;
    if (y)
        *y = Y;
    return TPK_OK;
}
