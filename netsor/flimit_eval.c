/* The rolled limit evaluator's instructions: each kind of the family IR (netsor/ir-impl.h)
 * lowered here, once, to values over a domain (numbers, reads, MatMuls, index sums, softmax, φ,
 * LinCombs, mean()). */
#include "flimit-impl.h"
#include "tpk/alloc.h"

#include <math.h>
#include <string.h>

/* A number over the domain (index arithmetic, parameters, loop indices): a constant when it
 * reads no domain index, else one value per point (the same for every input). */
static int number_value(fl *F, const nsr_expr *e, const nsr_fdom *D, val *out)
{
    double c;
    if (!nsr_reads_syms(e, D->sym, D->nv, 0)) {
        if (nsr_fam_num(&F->X, e, &c))
            return F->X.ctx->status;
        return nsr_fl_val_const(out, D->m, c);
    }
    nsr_fl_val_const(out, D->m, 0);
    if (nsr_fl_val_scal(F, out))
        return F->X.ctx->status;
    for (long p = 0; p < D->m; p++) {
        nsr_bind_point(&F->X, D, p);
        if (nsr_fam_num(&F->X, e, &c)) {
            nsr_fl_val_free(F, out);
            return F->X.ctx->status;
        }
        for (size_t a = 0; a < F->N; a++)
            out->s[a * (size_t)D->m + (size_t)p] = c;
    }
    return TPK_OK;
}

/* The family instruction block holding member idx of family sym, or −1 (and *mem). */
static int find_block(fl *F, int sym, const int *idx, long *mem)
{
    for (int k = F->nb - 1; k >= 0; k--) {
        const fblock *b = &F->b[k];
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

/* A stored combination of this many terms or more becomes a Gaussian block of its own when it is
 * first read: a residual stream g_l = g_{l-1} + α W_l h_{l-1} is otherwise expanded again into
 * all l terms at every layer, O(L²) passes over the matrix where the recursion makes one per
 * layer (theory §2.9). Two-term sums (attention's f + h) stay combinations. */
#define MIX_MATERIALIZE 3

/* g[idx...] of an initial G-var family over D: a gather on its block (a family of N(0, 0)
 * members is the zero vector: σ_b² = 0 biases cost nothing). */
static int eval_gdecl(fl *F, const nsr_expr *e, const nsr_fdom *D, val *out)
{
    int k = -1, nonzero = 0;
    for (int i = 0; i < F->X.R->ndm && !nonzero; i++)
        nonzero = F->X.R->dm[i].sym == e->sym &&
                  (F->X.R->dm[i].var != 0 || F->X.R->dm[i].mean != 0);
    if (!nonzero)
        return nsr_fl_val_const(out, D->m, 0);
    if (nsr_fl_bias_block(F, e->sym, &k))
        return F->X.ctx->status;
    int *idx = nsr_fam_alloc(&F->X, (size_t)D->m, sizeof *idx);
    if (idx == NULL)
        return F->X.ctx->status;
    const fblock *b = &F->b[k];
    int vary = nsr_reads_syms(e, D->sym, D->nv, 0);
    for (long p = 0; p < D->m; p++) {
        if (!vary && p > 0) {
            idx[p] = idx[0];
            continue;
        }
        nsr_bind_point(&F->X, D, p);
        int t[NSR_MAX_INDICES];
        for (int i = 0; i < e->nidx; i++)
            if (nsr_fam_int(&F->X, e->idx[i], &t[i])) {
                tpk_free(F->X.ctx, idx);
                return F->X.ctx->status;
            }
        long r = nsr_trie_find(&b->tr, t);
        if (r < 0) {
            tpk_free(F->X.ctx, idx);
            return nsr_fam_err(&F->X, TPK_ETYPE, e, "%s has no such member", e->name);
        }
        idx[p] = (int)r;
    }
    return nsr_fl_val_gather(F, out, D->m, k, idx);
}

/* The read of a defined family over D, point by point: each point's member, all on one block (a
 * vector read: idx) or scalar members (sv). */
typedef struct name_read {
    const nsr_expr *e;
    const nsr_fdom *D;
    int vary;           /* the indices read the domain's */
    int affine;         /* ... as integer affine maps (A) */
    nsr_imap A;
    int kfast;          /* the block every check has passed for: its next points go the short way */
    int k0;             /* the previous point's block */
    long first;         /* point 0's member */
    int blk;            /* the block of a vector read (−1: none yet) */
    int is_scal;        /* −1: not known yet */
    int *idx;           /* vector read: each point's member (−1: a padding member) */
    double *sv;         /* scalar read: N × m values */
} name_read;

/* Point p reads member mem of block k, a scalar family's (its values) or a vector family's (one
 * block per read). */
static int read_store(fl *F, name_read *R, long p, int k, long mem)
{
    const nsr_expr *e = R->e;
    size_t m = (size_t)R->D->m;
    const fblock *b = &F->b[k];
    int scal = b->kind == BK_SCAL;
    if (R->is_scal < 0)
        R->is_scal = scal;
    if (R->is_scal != scal)
        return NSR_UNSUP(&F->X, e, "%s mixes scalar and vector members in one read", e->name);
    if (scal) {
        if (R->sv == NULL && (R->sv = nsr_fam_alloc(&F->X, F->N * m, sizeof *R->sv)) == NULL)
            return F->X.ctx->status;
        if (!F->dry)
            for (size_t a = 0; a < F->N; a++)
                R->sv[a * m + (size_t)p] = b->s[a * (size_t)b->m + (size_t)mem];
        R->kfast = k;
        return TPK_OK;
    }
    if (R->blk >= 0 && R->blk != k)
        return NSR_UNSUP(&F->X, e, "a read of %s spans several definitions (lines %d and %d)",
                         e->name, F->b[R->blk].line, b->line);
    if (R->idx == NULL) {
        if ((R->idx = nsr_fam_alloc(&F->X, m, sizeof *R->idx)) == NULL)
            return F->X.ctx->status;
        for (size_t q = 0; q < m; q++)
            R->idx[q] = -1;
    }
    R->blk = k;
    R->idx[p] = (int)mem;
    R->kfast = k;
    return TPK_OK;
}

/* The block defining member t of the family (tried first: the previous point's), its member in
 * *mem; an error where no statement before this one defines it. */
static int read_find(fl *F, name_read *R, const int *t, int *k, long *mem)
{
    const nsr_expr *e = R->e;
    *k = R->k0 >= 0 && (*mem = nsr_trie_find(&F->b[R->k0].tr, t)) >= 0
             ? R->k0
             : find_block(F, e->sym, t, mem);
    if (*k >= 0)
        return TPK_OK;
    char buf[80] = "";
    size_t n = 0;
    for (int i = 0; i < e->nidx && n < sizeof buf; i++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%d", i ? "," : "", t[i]);
    const nsr_sym *y = &F->X.C->sym[e->sym];
    return nsr_fam_err(&F->X, TPK_ETYPE, e, "%s[%s] is read but not defined before (members are "
                       "defined for %s)", e->name, buf, y->ranges[0] ? y->ranges : "?");
}

/* Point p of the read. */
static int read_point(fl *F, name_read *R, long p)
{
    const nsr_expr *e = R->e;
    const nsr_fdom *D = R->D;
    int t[NSR_MAX_INDICES];
    long mem = -1;
    int k;
    if (R->affine)
        nsr_imap_at(&R->A, &D->val[p * D->nv], t);
    if (R->kfast >= 0 &&
        (!R->vary || (R->affine && (mem = nsr_trie_find(&F->b[R->kfast].tr, t)) >= 0))) {
        if (!R->vary)
            mem = R->first;
        if (R->sv != NULL) {
            const fblock *bf = &F->b[R->kfast];
            for (size_t a = 0; !F->dry && a < F->N; a++)
                R->sv[a * (size_t)D->m + (size_t)p] = bf->s[a * (size_t)bf->m + (size_t)mem];
        } else {
            R->idx[p] = (int)mem;
        }
        return TPK_OK;
    }
    if (R->vary || p == 0) {
        if (!R->affine) {
            nsr_bind_point(&F->X, D, p);
            for (int i = 0; i < e->nidx; i++)
                if (nsr_fam_int(&F->X, e->idx[i], &t[i]))
                    return F->X.ctx->status;
        }
        if (read_find(F, R, t, &k, &mem))
            return F->X.ctx->status;
    } else {
        k = R->k0;
        mem = R->first;
    }
    if (p == 0)
        R->first = mem;
    R->k0 = k;
    nsr_fl_touch(F, k);
    if (F->b[k].kind == BK_ZERO)
        return TPK_OK;
    return read_store(F, R, p, k, mem);
}

/* A read of stored combination b (BK_MIX) at members idx (consumed): its gathers composed with
 * idx. */
static int mix_compose(fl *F, const fblock *b, int *idx, const nsr_fdom *D, val *out)
{
    const val *s = &b->mix;
    memset(out, 0, sizeof *out);
    out->kind = V_LIN;
    out->m = D->m;
    size_t N = F->N, m = (size_t)D->m, mb = (size_t)b->m;
    out->t = nsr_fam_alloc(&F->X, (size_t)s->nt, sizeof *out->t);
    if (out->t == NULL) {
        tpk_free(F->X.ctx, idx);
        return F->X.ctx->status;
    }
    out->nt = s->nt;
    for (int i = 0; i < s->nt; i++) {
        term *t = &out->t[i];
        t->blk = s->t[i].blk;
        nsr_fl_touch(F, t->blk);
        t->idx = nsr_fam_alloc(&F->X, m, sizeof *t->idx);
        t->w = s->t[i].w ? nsr_fam_alloc(&F->X, N * m, sizeof *t->w) : NULL;
        if (t->idx == NULL || (s->t[i].w && t->w == NULL)) {
            tpk_free(F->X.ctx, idx);
            nsr_fl_val_free(F, out); /* the terms made so far (the rest are zeroed) */
            return F->X.ctx->status;
        }
        for (size_t p = 0; p < m; p++) {
            t->idx[p] = idx[p] < 0 ? -1 : s->t[i].idx[idx[p]];
            if (t->w)
                for (size_t a = 0; a < N; a++)
                    t->w[a * m + p] = idx[p] < 0 ? 0 : s->t[i].w[a * mb + (size_t)idx[p]];
        }
    }
    if (s->mu) {
        if ((out->mu = nsr_fam_alloc(&F->X, N * m, sizeof *out->mu)) == NULL) {
            tpk_free(F->X.ctx, idx);
            nsr_fl_val_free(F, out);
            return F->X.ctx->status;
        }
        for (size_t p = 0; p < m; p++)
            for (size_t a = 0; a < N; a++)
                out->mu[a * m + p] = idx[p] < 0 ? 0 : s->mu[a * mb + (size_t)idx[p]];
    }
    tpk_free(F->X.ctx, idx);
    return TPK_OK;
}

/* f[idx...] of a defined family over D: each point's member resolved, then per-point scalars, a
 * gather on the one block met, or the composed gathers of a stored combination. */
static int eval_defined(fl *F, const nsr_expr *e, const nsr_fdom *D, val *out)
{
    name_read R = {.e = e, .D = D, .kfast = -1, .k0 = -1, .first = -1, .blk = -1, .is_scal = -1};
    R.vary = nsr_reads_syms(e, D->sym, D->nv, 0);
    nsr_fl_val_const(out, D->m, 0);
    R.affine = R.vary && nsr_imap_of(&F->X, e, D, &R.A);
    for (long p = 0; p < D->m; p++) {
        int st = read_point(F, &R, p);
        if (st) {
            tpk_free(F->X.ctx, R.idx), tpk_free(F->X.ctx, R.sv);
            return st;
        }
    }
    if (R.sv != NULL) {
        out->kind = V_SCAL;
        out->s = R.sv;
        return TPK_OK;
    }
    if (R.blk < 0)
        return nsr_fl_val_const(out, D->m, 0); /* only padding members */
    if (F->b[R.blk].kind == BK_MIX && F->b[R.blk].mix.nt >= MIX_MATERIALIZE &&
        nsr_fl_mix_to_gauss(F, R.blk)) {
        tpk_free(F->X.ctx, R.idx);
        return F->X.ctx->status;
    }
    const fblock *b = &F->b[R.blk];
    if (b->kind != BK_MIX)
        return nsr_fl_val_gather(F, out, D->m, R.blk, R.idx);
    return mix_compose(F, b, R.idx, D, out);
}

/* f[idx...] over the domain: a number, an initial G-var family, or a defined family. */
static int eval_name(fl *F, const nsr_expr *e, const nsr_fdom *D, val *out)
{
    const nsr_sym *y = &F->X.C->sym[e->sym];
    if (y->kind == NSR_SYM_PARAM || y->kind == NSR_SYM_LOOP) {
        if (e->nidx)
            return nsr_fam_err(&F->X, TPK_ETYPE, e, "'%s' is a number, not a family", e->name);
        return number_value(F, e, D, out);
    }
    if (y->kind == NSR_SYM_GFAM)
        return eval_gdecl(F, e, D, out);
    if (y->kind != NSR_SYM_DFAM)
        return NSR_UNSUP(&F->X, e, "'%s' cannot be read here", e->name);
    return eval_defined(F, e, D, out);
}

/* The embedding's source U·x[slot(p)] as a gather on the input block. */
static int embed_src(fl *F, const nsr_expr *src, const nsr_fdom *D, val *u)
{
    size_t m = (size_t)D->m;
    if (src->nidx != (F->p->nslots > 1 || src->nidx ? 1 : 0))
        return nsr_fam_err(&F->X, TPK_ETYPE, src, "the input is read as %s[t]", src->name);
    int ib = -1;
    if (nsr_fl_input_block(F, &ib))
        return F->X.ctx->status;
    int *slot = nsr_fam_alloc(&F->X, m, sizeof *slot);
    if (slot == NULL)
        return F->X.ctx->status;
    int vary = nsr_reads_syms(src, D->sym, D->nv, 0);
    for (size_t p = 0; p < m; p++) {
        int t = F->X.R->input_lo;
        if (vary || p == 0) {
            nsr_bind_point(&F->X, D, (long)p);
            if (src->nidx && nsr_fam_int(&F->X, src->idx[0], &t)) {
                tpk_free(F->X.ctx, slot);
                return F->X.ctx->status;
            }
            t -= F->X.R->input_lo;
        } else {
            t = slot[0];
        }
        if (t < 0 || t >= F->p->nslots) {
            tpk_free(F->X.ctx, slot);
            return nsr_fam_err(&F->X, TPK_ETYPE, src, "input slot %d is outside %d..%d",
                               t + F->X.R->input_lo, F->X.R->input_lo,
                               F->X.R->input_lo + F->p->nslots - 1);
        }
        slot[p] = t;
    }
    return nsr_fl_val_gather(F, u, D->m, ib, slot);
}

/* A MatMul node's weight and source: the A-var's checks and σ² (nsr_fl_matmul_weight), then the
 * value of its operand over D — an embedding U·x[t] reads the input block. */
static int matmul_source(fl *F, const nsr_irn *mm, const nsr_fdom *D, double *var, val *u)
{
    if (nsr_fl_matmul_weight(F, mm->e, D, var))
        return F->X.ctx->status;
    const nsr_irn *src = nsr_fl_arg(F, mm, 0);
    if (mm->embed)
        return embed_src(F, src->e, D, u) ? F->X.ctx->status : TPK_OK;
    return nsr_fl_eval(F, src, D, u) ? F->X.ctx->status : TPK_OK;
}

/* A·src over D: a new atom, lowered by the MatMul strategies (flimit_matmul.c). */
static int eval_matmul(fl *F, const nsr_irn *mm, const nsr_fdom *D, val *out)
{
    nsr_fl_atom A;
    F->nsites++;
    if (nsr_fl_atom_new(F, D->m, mm->e->line, &A))
        return F->X.ctx->status;
    double var = 0;
    val u;
    int st = matmul_source(F, mm, D, &var, &u);
    if (st == TPK_OK)
        st = nsr_fl_matmul(F, mm->e, nsr_fl_arg(F, mm, 0)->e, D, var, &u, &A);
    return nsr_fl_atom_finish(F, &A, st, out) ? F->X.ctx->status : TPK_OK;
}

/* A sum over binders of MatMuls whose A-var changes with the binder (convolution taps:
 * Σ_t F_t h_{p+t}): the terms are independent (distinct A-vars, theory §1.6), so the sum is one
 * Gaussian block with M2 = Σ_t σ_t² E[h_{p+t} h_{q+t}ᵀ] (theory §2.8) — no block per tap. */
static int is_acc_leaf(const fl *F, const nsr_irn *n, const nsr_irn **mm, const nsr_irn **coef)
{
    *coef = NULL;
    if (n->op == NSR_IR_MUL) {
        const nsr_irn *x = nsr_fl_arg(F, n, 0), *y = nsr_fl_arg(F, n, 1);
        if (y->op == NSR_IR_MATMUL) {
            *coef = x;
            n = y;
        } else {
            *coef = y;
            n = x;
        }
    }
    *mm = n;
    return n->op == NSR_IR_MATMUL;
}

/* The taps of a sum over binders (nested sums walked binder value by binder value), each MatMul
 * term kept in T with its coefficient and binder values. */
static int acc_sum(fl *F, const nsr_irn *n, const nsr_fdom *D, taps *T, const int *binders,
                   int nb, int depth)
{
    const nsr_expr *e = n->e;
    if (depth > NSR_MAX_DEPTH)
        return NSR_UNSUP(&F->X, e, "sums nested too deeply");
    if (n->op == NSR_IR_SUM) {
        int lo, hi;
        if (nsr_fam_int(&F->X, e->args[0], &lo) || nsr_fam_int(&F->X, e->args[1], &hi))
            return F->X.ctx->status;
        for (int j = lo; j <= hi; j++) {
            F->X.num[n->sym] = j;
            if (acc_sum(F, nsr_fl_arg(F, n, 0), D, T, binders, nb, depth + 1))
                return F->X.ctx->status;
        }
        F->X.num[n->sym] = NAN;
        return TPK_OK;
    }
    const nsr_irn *mm, *ce;
    if (!is_acc_leaf(F, n, &mm, &ce))
        return NSR_UNSUP(&F->X, e, "internal: not a MatMul term");
    val c, *cp = NULL;
    if (ce) {
        if (nsr_fl_eval(F, ce, D, &c))
            return F->X.ctx->status;
        if (c.kind == V_LIN) {
            nsr_fl_val_free(F, &c);
            return NSR_UNSUP(&F->X, ce->e, "a MatMul multiplied by a vector");
        }
        cp = &c;
    }
    int b[2] = {0, 0};
    for (int i = 0; i < nb && i < 2; i++)
        b[i] = (int)F->X.num[binders[i]];
    double var = 0;
    val u;
    int st = matmul_source(F, mm, D, &var, &u);
    if (st == TPK_OK)
        st = nsr_fl_taps_push(F, T, nsr_fl_arg(F, mm, 0)->e, cp, var, &u, b, nb);
    if (cp)
        nsr_fl_val_free(F, cp);
    return st;
}

/* Does the innermost body of nested sums have the accumulable form, with an A-var reading a
 * binder? */
static int accumulable(const fl *F, const nsr_irn *n, int *binders, int nb)
{
    while (n->op == NSR_IR_SUM && nb < NSR_MAXV) {
        binders[nb++] = n->sym;
        n = nsr_fl_arg(F, n, 0);
    }
    const nsr_irn *mm, *ce;
    if (!is_acc_leaf(F, n, &mm, &ce))
        return 0;
    return nsr_reads_syms(mm->e, binders, nb, 0);
}

/* Scalars summed over the binder: out(a, p) = Σ of v over the points whose parent is p. */
static int sum_scalars(fl *F, const nsr_fdom *D, const nsr_fdom *X, const long *parent, val *v,
                       val *out)
{
    size_t N = F->N, m = (size_t)D->m, mx = (size_t)X->m;
    nsr_fl_val_const(out, D->m, 0);
    if (nsr_fl_val_scal(F, out) || nsr_fl_val_scal(F, v)) {
        nsr_fl_val_free(F, out); /* eval's contract: nothing is left in out on failure */
        return F->X.ctx->status;
    }
    for (size_t a = 0; a < N; a++)
        for (size_t r = 0; r < mx; r++)
            out->s[a * m + (size_t)parent[r]] += v->s[a * mx + r];
    return TPK_OK;
}

/* A vector summed over the binder: each term becomes a dense map from D's points to its block's
 * members (terms on one block merge), the constant parts add up. */
static int sum_vectors(fl *F, const nsr_fdom *D, const nsr_fdom *X, const long *parent,
                       const val *v, val *out)
{
    size_t N = F->N, m = (size_t)D->m, mx = (size_t)X->m;
    int st = TPK_OK;
    memset(out, 0, sizeof *out);
    out->kind = V_LIN;
    out->m = D->m;
    if (v->mu) {
        if ((out->mu = nsr_fam_alloc(&F->X, N * m, sizeof *out->mu)) == NULL)
            return F->X.ctx->status;
        for (size_t a = 0; a < N; a++)
            for (size_t r = 0; r < mx; r++)
                out->mu[a * m + (size_t)parent[r]] += v->mu[a * mx + r];
    }
    out->t = nsr_fam_alloc(&F->X, (size_t)v->nt, sizeof *out->t);
    if (out->t == NULL) {
        nsr_fl_val_free(F, out);
        return F->X.ctx->status;
    }
    for (int i = 0; i < v->nt && st == TPK_OK; i++) {
        const term *t = &v->t[i];
        size_t ms = (size_t)F->b[t->blk].m;
        int j = 0;
        while (j < out->nt && out->t[j].blk != t->blk)
            j++;
        if (j == out->nt) {
            out->t[j].blk = t->blk;
            out->t[j].dense = 1;
            out->nt++;
            if (!F->dry && (out->t[j].w = nsr_fam_alloc(&F->X, N * m * ms, sizeof(double))) == NULL)
                st = F->X.ctx->status;
        }
        if (st || F->dry)
            continue;
        double *W = out->t[j].w;
        for (size_t a = 0; a < N; a++)
            for (size_t r = 0; r < mx; r++) {
                double *row = W + (a * m + (size_t)parent[r]) * ms;
                if (t->dense) {
                    const double *src = t->w + (a * mx + r) * ms;
                    for (size_t q = 0; q < ms; q++)
                        row[q] += src[q];
                } else if (t->idx[r] >= 0) {
                    row[t->idx[r]] += t->w ? t->w[a * mx + r] : 1;
                }
            }
    }
    if (st)
        nsr_fl_val_free(F, out);
    return st;
}

/* A sum over a binder that is not a tap sum (attention's Σ_j a_ij k_j, a mean over positions):
 * its body over the extended domain, summed into each point. */
static int eval_index_sum(fl *F, const nsr_irn *sn, const nsr_fdom *D, val *out)
{
    nsr_fdom X;
    long *parent;
    if (nsr_extend(&F->X, sn->e, D, &X, &parent))
        return F->X.ctx->status;
    val v;
    int st = nsr_fl_eval(F, nsr_fl_arg(F, sn, 0), &X, &v);
    tpk_free(F->X.ctx, X.val);
    if (st == TPK_OK) {
        st = v.kind != V_LIN ? sum_scalars(F, D, &X, parent, &v, out)
                             : sum_vectors(F, D, &X, parent, &v, out);
        nsr_fl_val_free(F, &v);
    }
    tpk_free(F->X.ctx, parent);
    return st;
}

/* sum(binder in lo..hi: body) over D: one atom for a sum of MatMuls by A-vars that read the
 * binder (convolution taps), else the body summed over the binder. */
static int eval_sum(fl *F, const nsr_irn *sn, const nsr_fdom *D, val *out)
{
    const nsr_expr *e = sn->e;
    int binders[NSR_MAXV];
    if (accumulable(F, sn, binders, 0)) { /* taps: one atom (flimit_matmul.c) */
        nsr_fl_atom A;
        F->nsites++;
        if (nsr_fl_atom_new(F, D->m, e->line, &A))
            return F->X.ctx->status;
        taps T = {.nb = 0};
        const nsr_irn *q = sn;
        while (q->op == NSR_IR_SUM && T.nb < NSR_MAXV)
            T.nb++, q = nsr_fl_arg(F, q, 0);
        if (acc_sum(F, sn, D, &T, binders, T.nb, 0)) {
            nsr_fl_taps_free(F, &T);
            nsr_fl_atom_finish(F, &A, F->X.ctx->status, out);
            return F->X.ctx->status;
        }
        int st = nsr_fl_tap_sum(F, D, &T, &A, e->line);
        nsr_fl_taps_free(F, &T);
        return nsr_fl_atom_finish(F, &A, st, out);
    }
    return eval_index_sum(F, sn, D, out);
}

/* softmax(j in lo..hi: s) at the enclosing j. Its rows depend on the other indices only, so
 * they are computed once per row (a[i, j] for all j ≤ i costs T² exp, not T³), shifted by the
 * row maximum. */
static int eval_softmax(fl *F, const nsr_irn *sn, const nsr_fdom *D, val *out)
{
    nsr_softmax_shape S;
    val v;
    memset(&v, 0, sizeof v);
    int st = nsr_softmax_shape_of(&F->X, sn->e, D, &S);
    if (st == TPK_OK)
        st = nsr_fl_eval(F, nsr_fl_arg(F, sn, 0), &S.X, &v);
    if (st == TPK_OK && v.kind == V_LIN)
        st = NSR_UNSUP(&F->X, sn->e->a, "softmax of a vector: its argument must be scalars "
                       "(Moments)");
    if (st == TPK_OK)
        st = nsr_fl_val_scal(F, &v);
    if (st == TPK_OK) {
        nsr_fl_val_const(out, D->m, 0);
        st = nsr_fl_val_scal(F, out);
    }
    size_t N = F->N, m = (size_t)D->m, mx = (size_t)S.X.m, nr = (size_t)S.rows.m;
    if (st == TPK_OK && !F->dry) {
        /* one exp per row entry: the row pass keeps exp(s − max) in place of s (v is ours),
         * then each point picks its entry and divides by its row's sum */
        double *z = nsr_fam_alloc(&F->X, nr, sizeof *z);
        if (z == NULL)
            st = F->X.ctx->status;
        for (size_t a = 0; st == TPK_OK && a < N; a++) {
            double *sv = v.s + a * mx;
#pragma omp parallel for schedule(dynamic, 64) if (mx >= 65536)
            for (size_t r = 0; r < nr; r++) {
                double mm = -INFINITY, zz = 0;
                for (long q = S.start[r]; q < S.start[r + 1]; q++)
                    mm = fmax(mm, sv[q]);
                for (long q = S.start[r]; q < S.start[r + 1]; q++)
                    zz += (sv[q] = exp(sv[q] - mm));
                z[r] = zz;
            }
            for (size_t p = 0; p < m; p++)
                out->s[a * m + p] = sv[S.pick[p]] / z[S.row[p]];
        }
        tpk_free(F->X.ctx, z);
    }
    nsr_softmax_shape_free(&S, F->X.ctx);
    nsr_fl_val_free(F, &v);
    return st;
}

static int expand(fl *F, const nsr_irn *n, const nsr_fdom *D, mlist *L, int depth);

/* Σ ±terms: each term's list appended, negated for −, in the program's order. */
static int expand_lin(fl *F, const nsr_irn *n, const nsr_fdom *D, mlist *L, int depth)
{
    val neg;
    nsr_fl_val_const(&neg, D->m, -1);
    for (int i = 0; i < n->nterms; i++) {
        mlist B = {0};
        if (i == 0 && n->sign[0] > 0) { /* the first term straight into L */
            if (expand(F, nsr_fl_arg(F, n, 0), D, L, depth + 1))
                return F->X.ctx->status;
            continue;
        }
        if (expand(F, nsr_fl_arg(F, n, i), D, &B, depth + 1)) {
            nsr_fl_ml_free(F, &B);
            return F->X.ctx->status;
        }
        if (nsr_fl_ml_append(F, L, &B, n->sign[i] < 0 ? &neg : NULL))
            return F->X.ctx->status;
    }
    return TPK_OK;
}

/* a·b: every product of a monomial of a with one of b. */
static int expand_product(fl *F, const nsr_irn *n, const nsr_fdom *D, mlist *L, int depth)
{
    mlist A = {0}, B = {0};
    int st = expand(F, nsr_fl_arg(F, n, 0), D, &A, depth + 1);
    if (st == TPK_OK)
        st = expand(F, nsr_fl_arg(F, n, 1), D, &B, depth + 1);
    if (st == TPK_OK)
        st = nsr_fl_ml_mul(F, &A, &B, L, n->e);
    nsr_fl_ml_free(F, &A);
    nsr_fl_ml_free(F, &B);
    return st;
}

/* a^k: a itself (k = 1), a·a (k = 2), or a scalar power of scalars, evaluated as a leaf (*leaf);
 * another power of a vector is refused. */
static int expand_power(fl *F, const nsr_irn *n, const nsr_fdom *D, mlist *L, int depth,
                        int *leaf)
{
    mlist A = {0};
    double k = 0;
    *leaf = 0;
    int st = expand(F, nsr_fl_arg(F, n, 0), D, &A, depth + 1);
    if (st == TPK_OK)
        st = nsr_fam_num(&F->X, n->e->b, &k);
    if (st == TPK_OK && k == 1) {
        nsr_fl_ml_append(F, L, &A, NULL);
        return F->X.ctx->status;
    }
    if (st == TPK_OK && k == 2) {
        st = nsr_fl_ml_square(F, &A, L, n->e);
        nsr_fl_ml_free(F, &A);
        return st;
    }
    int vec = 0;
    for (int i = 0; st == TPK_OK && i < A.n; i++)
        vec |= A.v[i].nf > 0;
    if (vec)
        st = NSR_UNSUP(&F->X, n->e, "a power other than 2 of a vector inside mean()");
    nsr_fl_ml_free(F, &A);
    *leaf = st == TPK_OK;
    return st;
}

/* a / d, d scalars: a's coefficients times 1/d. */
static int expand_quotient(fl *F, const nsr_irn *n, const nsr_fdom *D, mlist *L, int depth)
{
    val d;
    const nsr_irn *dn = nsr_fl_arg(F, n, 1);
    if (nsr_fl_eval(F, dn, D, &d))
        return F->X.ctx->status;
    if (d.kind == V_LIN) {
        nsr_fl_val_free(F, &d);
        return NSR_UNSUP(&F->X, dn->e, "division by a vector inside mean()");
    }
    if (nsr_fl_val_scal(F, &d)) {
        nsr_fl_val_free(F, &d);
        return F->X.ctx->status;
    }
    for (size_t i = 0; i < F->N * (size_t)D->m; i++)
        d.s[i] = 1.0 / d.s[i];
    mlist A = {0};
    if (expand(F, nsr_fl_arg(F, n, 0), D, &A, depth + 1) == TPK_OK)
        nsr_fl_ml_append(F, L, &A, &d);
    nsr_fl_ml_free(F, &A);
    nsr_fl_val_free(F, &d);
    return F->X.ctx->status;
}

/* Anything else: its value, a vector factor or a scalar coefficient. */
static int expand_leaf(fl *F, const nsr_irn *n, const nsr_fdom *D, mlist *L)
{
    mono r = {0};
    val v;
    if (nsr_fl_eval(F, n, D, &v))
        return F->X.ctx->status;
    if (v.kind == V_LIN) {
        nsr_fl_val_const(&r.coef, D->m, 1);
        r.f[0] = v;
        r.nf = 1;
    } else {
        r.coef = v;
    }
    return nsr_fl_ml_push(F, L, &r);
}

/* The body of a Moment as monomials of degree ≤ 2 in vectors, appended to L. */
static int expand(fl *F, const nsr_irn *n, const nsr_fdom *D, mlist *L, int depth)
{
    if (depth > NSR_MAX_DEPTH)
        return NSR_UNSUP(&F->X, n->e, "expression nested too deeply");
    switch (n->op) {
    case NSR_IR_LIN:
        return expand_lin(F, n, D, L, depth);
    case NSR_IR_MUL:
        return expand_product(F, n, D, L, depth);
    case NSR_IR_POW: {
        int leaf, st = expand_power(F, n, D, L, depth, &leaf);
        return leaf ? expand_leaf(F, n, D, L) : st;
    }
    case NSR_IR_DIV:
        return expand_quotient(F, n, D, L, depth);
    default:
        return expand_leaf(F, n, D, L);
    }
}

/* mean(body) at every point: Σ monomials coef·E[Π factors] (theory §1.9: the limit of a NETSOR+
 * Moment is the expectation under the limit Gaussian). */
static int eval_mean(fl *F, const nsr_irn *mn, const nsr_fdom *D, val *out)
{
    mlist L = {0};
    if (expand(F, nsr_fl_arg(F, mn, 0), D, &L, 0)) {
        nsr_fl_ml_free(F, &L);
        return F->X.ctx->status;
    }
    int st = nsr_fl_ml_expect(F, &L, D->m, out);
    nsr_fl_ml_free(F, &L);
    return st;
}

/* φ(u): of scalars, evaluated; of a vector, a φ block over u as one Gaussian block (u made one
 * where it is a combination), its moments made when first read. */
static int eval_phi(fl *F, const nsr_irn *mp, const nsr_fdom *D, val *out)
{
    if (mp->narg != 1)
        return nsr_fam_err(&F->X, TPK_ETYPE, mp->e, "%s takes one argument", mp->e->name);
    val u;
    if (nsr_fl_eval(F, nsr_fl_arg(F, mp, 0), D, &u))
        return F->X.ctx->status;
    if (u.kind == V_CONST) {
        u.c = tpk_phi_eval(mp->phi, u.c);
        *out = u;
        return TPK_OK;
    }
    if (u.kind == V_SCAL) {
        for (size_t i = 0; i < F->N * (size_t)u.m; i++)
            u.s[i] = tpk_phi_eval(mp->phi, u.s[i]);
        *out = u;
        return TPK_OK;
    }
    /* a Gaussian argument, as one block */
    int arg = -1;
    if (u.nt == 1 && u.mu == NULL && !u.t[0].dense && u.t[0].w == NULL &&
        F->b[u.t[0].blk].kind == BK_GAUSS && F->b[u.t[0].blk].m == u.m) {
        arg = u.t[0].blk;
        for (long p = 0; p < u.m && arg >= 0; p++)
            if (u.t[0].idx[p] != p)
                arg = -1;
    }
    if (arg < 0 && nsr_fl_materialize(F, &u, -1, &arg)) {
        nsr_fl_val_free(F, &u);
        return F->X.ctx->status;
    }
    nsr_fl_val_free(F, &u);
    int k = nsr_fl_new_block(F, BK_NONLIN, -1, D->m);
    if (k < 0)
        return F->X.ctx->status;
    fblock *b = &F->b[k];
    b->phi = mp->phi;
    b->arg = arg;
    b->line = mp->e->line;
    b->nanc = 0;
    nsr_fl_anc_union(b, &F->b[arg]);
    nsr_fl_touch(F, arg);
    int *idx = nsr_fam_alloc(&F->X, (size_t)D->m, sizeof *idx);
    if (idx == NULL)
        return F->X.ctx->status;
    for (long p = 0; p < D->m; p++)
        idx[p] = (int)p;
    return nsr_fl_val_gather(F, out, D->m, k, idx);
}

/* a^k: a power of scalars (a vector only to the power 1). */
static int eval_power(fl *F, const nsr_irn *pn, const nsr_fdom *D, val *out)
{
    double k;
    val a;
    if (nsr_fam_num(&F->X, pn->e->b, &k))
        return F->X.ctx->status;
    if (nsr_fl_eval(F, nsr_fl_arg(F, pn, 0), D, &a))
        return F->X.ctx->status;
    if (a.kind == V_LIN) {
        if (k == 1) {
            *out = a;
            return TPK_OK;
        }
        nsr_fl_val_free(F, &a);
        return NSR_UNSUP(&F->X, pn->e, "a power of a vector outside mean(): write it as a function");
    }
    if (a.kind == V_CONST) {
        a.c = pow(a.c, k);
    } else {
        for (size_t i = 0; i < F->N * (size_t)a.m; i++)
            a.s[i] = pow(a.s[i], k);
    }
    *out = a;
    return TPK_OK;
}

/* Σ ±terms, added left to right as the program writes them (a LinComb). */
static int eval_lin(fl *F, const nsr_irn *ln, const nsr_fdom *D, val *out)
{
    if (nsr_fl_eval(F, nsr_fl_arg(F, ln, 0), D, out))
        return F->X.ctx->status;
    int st = TPK_OK;
    if (ln->sign[0] < 0) {
        val c;
        nsr_fl_val_const(&c, D->m, -1);
        st = nsr_fl_val_scale(F, out, &c);
    }
    for (int i = 1; st == TPK_OK && i < ln->nterms; i++) {
        val b;
        if ((st = nsr_fl_eval(F, nsr_fl_arg(F, ln, i), D, &b)))
            break;
        st = nsr_fl_val_add(F, out, &b, ln->sign[i]);
        nsr_fl_val_free(F, &b);
    }
    if (st)
        nsr_fl_val_free(F, out);
    return st;
}

/* a·b (one factor scalars: a product of two vectors is a Nonlin of several G-vars, refused),
 * a / b (b scalars, not the constant 0). */
static int eval_arith(fl *F, const nsr_irn *an, const nsr_fdom *D, val *out)
{
    val a, b;
    const nsr_irn *bn = nsr_fl_arg(F, an, 1);
    if (nsr_fl_eval(F, nsr_fl_arg(F, an, 0), D, &a))
        return F->X.ctx->status;
    if (nsr_fl_eval(F, bn, D, &b)) {
        nsr_fl_val_free(F, &a);
        return F->X.ctx->status;
    }
    int st = TPK_OK;
    if (an->op == NSR_IR_MUL) {
        if (a.kind == V_LIN && b.kind == V_LIN)
            st = NSR_UNSUP(&F->X, an->e, "a product of two vectors outside mean() (a Nonlin of "
                           "several G-vars)");
        else if (a.kind == V_LIN)
            st = nsr_fl_val_scale(F, &a, &b);
        else {
            st = nsr_fl_val_scale(F, &b, &a);
            val t = a;
            a = b;
            b = t;
        }
    } else { /* / */
        if (b.kind == V_CONST && b.c == 0) {
            st = nsr_fam_err(&F->X, TPK_ETYPE, bn->e, "division by the constant 0");
        } else if (b.kind == V_LIN) {
            st = NSR_UNSUP(&F->X, bn->e, "division by a vector");
        } else if ((st = nsr_fl_val_scal(F, &b)) == TPK_OK) {
            for (size_t i = 0; i < F->N * (size_t)b.m; i++)
                b.s[i] = 1.0 / b.s[i];
            st = nsr_fl_val_scale(F, &a, &b);
        }
    }
    if (st) {
        nsr_fl_val_free(F, &a);
        nsr_fl_val_free(F, &b);
        return st;
    }
    nsr_fl_val_free(F, &b);
    *out = a;
    return TPK_OK;
}

/* The one dispatch: node n's value over D, each instruction kind lowered here, once. */
int nsr_fl_eval(fl *F, const nsr_irn *n, const nsr_fdom *D, val *out)
{
    memset(out, 0, sizeof *out);
    if (F->X.ctx->status)
        return F->X.ctx->status;
    const nsr_expr *e = n->e;
    char what[96];
    switch (n->op) {
    case NSR_IR_NUM:
        if (e->kind == NSR_E_NUM)
            return nsr_fl_val_const(out, D->m, e->num);
        return number_value(F, e, D, out);
    case NSR_IR_READ:
        return eval_name(F, e, D, out);
    case NSR_IR_INPUT:
        return nsr_fam_err(&F->X, TPK_ETYPE, e, "the input can only be embedded (U %s)", e->name);
    case NSR_IR_MATMUL:
        return eval_matmul(F, n, D, out);
    case NSR_IR_MAP:
        return eval_phi(F, n, D, out);
    case NSR_IR_LIN:
        return eval_lin(F, n, D, out);
    case NSR_IR_MUL:
    case NSR_IR_DIV:
        return eval_arith(F, n, D, out);
    case NSR_IR_POW:
        return eval_power(F, n, D, out);
    case NSR_IR_SUM:
        return eval_sum(F, n, D, out);
    case NSR_IR_SOFTMAX:
        return eval_softmax(F, n, D, out);
    case NSR_IR_MOMENT:
        return eval_mean(F, n, D, out);
    case NSR_IR_SQRTN: /* √n logits: a non-Gaussian limit (theory §5) */
    case NSR_IR_BN:    /* batch-coupled: the member-level evaluator's batchnorm back end */
    case NSR_IR_UNSUP:
        return NSR_UNSUP(&F->X, e, "%s is not taken by the rolled evaluator",
                         nsr_ir_unsup_text(n, what, sizeof what));
    default:
        return NSR_UNSUP(&F->X, e, "internal: %s is not a value", nsr_ir_op_name(n->op));
    }
}
