/* NETSOR front end, between check and elaboration: which loops stay rolled (issue 14).
 * A `for` loop (or a binder h[i in 1..T] = ...) stays one index of a family instruction when its
 * iterations are independent: its body only defines families (no declarations), each target
 * carries the loop variable as a plain index, every loop inside it stays rolled, and a read of a
 * family the body defines either takes the same iteration (the loop variable itself at the
 * target's position) or provably another member set — an index that differs from the target's
 * by a non-zero constant, as layer l reading layer l − 1. Everything else (a recurrence over
 * time, a running sum) is a sequential loop, unrolled as before (theory.md §1.3). */
#include "netsor-impl.h"
#include "ir-impl.h"
#include "tpk/alloc.h"

#include <stdlib.h>
#include <string.h>

/* Affine form k + Σ c_i·sym_i of an index expression, over at most 8 symbols. */
typedef struct aff {
    int ok, n;
    int sym[8];
    double c[8];
    double k;
} aff;

static void aff_add(aff *r, const aff *a, double s)
{
    r->k += s * a->k;
    for (int i = 0; i < a->n && r->ok; i++) {
        int j = 0;
        while (j < r->n && r->sym[j] != a->sym[i])
            j++;
        if (j == r->n) {
            if (r->n == 8) {
                r->ok = 0;
                return;
            }
            r->sym[r->n] = a->sym[i];
            r->c[r->n++] = 0;
        }
        r->c[j] += s * a->c[i];
    }
}

static aff affine(const nsr_check *C, const nsr_expr *e, int depth)
{
    aff r = {.ok = 1};
    if (e == NULL || depth > NSR_MAX_DEPTH) {
        r.ok = 0;
        return r;
    }
    switch (e->kind) {
    case NSR_E_NUM:
        r.k = e->num;
        return r;
    case NSR_E_NAME:
        if (e->nidx || e->sym < 0 ||
            (C->sym[e->sym].kind != NSR_SYM_LOOP && C->sym[e->sym].kind != NSR_SYM_PARAM)) {
            r.ok = 0;
            return r;
        }
        r.n = 1;
        r.sym[0] = e->sym;
        r.c[0] = 1;
        return r;
    case NSR_E_NEG: {
        aff a = affine(C, e->a, depth + 1);
        r.ok = a.ok;
        aff_add(&r, &a, -1);
        return r;
    }
    case NSR_E_BIN: {
        aff a = affine(C, e->a, depth + 1), b = affine(C, e->b, depth + 1);
        r.ok = a.ok && b.ok;
        if (!r.ok)
            return r;
        if (e->op == NSR_T_PLUS || e->op == NSR_T_MINUS) {
            aff_add(&r, &a, 1);
            aff_add(&r, &b, e->op == NSR_T_PLUS ? 1 : -1);
        } else if (e->op == NSR_T_STAR && (a.n == 0 || b.n == 0)) {
            aff_add(&r, a.n == 0 ? &b : &a, a.n == 0 ? a.k : b.k);
        } else {
            r.ok = 0;
        }
        return r;
    }
    default:
        r.ok = 0;
        return r;
    }
}

/* t − e is a non-zero constant. */
static int differ_by_constant(const nsr_check *C, const nsr_expr *t, const nsr_expr *e)
{
    aff d = affine(C, t, 0), b = affine(C, e, 0);
    if (!d.ok || !b.ok)
        return 0;
    aff_add(&d, &b, -1);
    if (!d.ok)
        return 0;
    for (int i = 0; i < d.n; i++)
        if (d.c[i] != 0)
            return 0;
    return d.k != 0;
}

static int is_var(const nsr_expr *e, int sym)
{
    return e->kind == NSR_E_NAME && e->nidx == 0 && e->sym == sym;
}

/* The definitions and outputs inside a body, nested loops included. */
typedef struct defs {
    const nsr_stmt **s;
    int n, cap;
    int ok;
    tpk_allocator al; /* the load's (no error recorded: see mark_for) */
} defs;

static void collect(defs *D, nsr_stmt **body, int n, int depth)
{
    for (int i = 0; i < n && D->ok; i++) {
        const nsr_stmt *s = body[i];
        if (s->kind == NSR_S_FOR && s->rolled && depth < NSR_MAX_DEPTH) {
            collect(D, s->body, s->nbody, depth + 1);
        } else if (s->kind == NSR_S_DEF || s->kind == NSR_S_OUTPUT) {
            if (D->n == D->cap) {
                int cap = D->cap ? 2 * D->cap : 16;
                const nsr_stmt **v = tpk_mem_realloc(&D->al, D->s, (size_t)cap * sizeof *v, NULL);
                if (v == NULL) {
                    D->ok = 0;
                    return;
                }
                D->s = v;
                D->cap = cap;
            }
            D->s[D->n++] = s;
        } else {
            D->ok = 0; /* declarations, sequential loops */
        }
    }
}

/* Position of loop symbol v in a target, or -1. */
static int target_pos(const nsr_stmt *s, int v)
{
    for (int i = 0; i < s->nidx; i++)
        if (is_var(s->idx[i], v))
            return i;
    return -1;
}

/* Every read of a body family in e takes the same iteration of v or a disjoint member set. */
static int reads_ok(const nsr_check *C, const defs *D, int v, const nsr_expr *e, int depth)
{
    if (e == NULL)
        return 1;
    if (depth > 4 * NSR_MAX_DEPTH)
        return 0;
    if (e->kind == NSR_E_NAME && e->nidx > 0 && e->sym >= 0) {
        for (int d = 0; d < D->n; d++) {
            const nsr_stmt *t = D->s[d];
            if (t->fam != e->sym || t->nidx != e->nidx)
                continue;
            int p = target_pos(t, v);
            if (p >= 0 && is_var(e->idx[p], v))
                continue;
            int disjoint = 0;
            for (int q = 0; q < t->nidx && !disjoint; q++)
                disjoint = q != p && differ_by_constant(C, t->idx[q], e->idx[q]);
            if (!disjoint)
                return 0;
        }
    }
    if (!reads_ok(C, D, v, e->a, depth + 1) || !reads_ok(C, D, v, e->b, depth + 1))
        return 0;
    for (int i = 0; i < e->nargs; i++)
        if (!reads_ok(C, D, v, e->args[i], depth + 1))
            return 0;
    for (int i = 0; i < e->nidx; i++)
        if (!reads_ok(C, D, v, e->idx[i], depth + 1))
            return 0;
    return 1;
}

static int mark_block(nsr_check *C, nsr_stmt **body, int n, int depth);

static int mark_for(nsr_check *C, nsr_stmt *s, int depth)
{
    int k = mark_block(C, s->body, s->nbody, depth + 1);
    if (k < 0)
        return k;
    defs D = {.ok = 1, .al = tpk_ctx_allocator(C->S->ctx)};
    collect(&D, s->body, s->nbody, 0);
    /* 'by -1' asks for an order (its outputs are numbered in it): it runs as written */
    int ok = D.ok && D.n > 0 && !s->down;
    for (int d = 0; d < D.n && ok; d++)
        ok = target_pos(D.s[d], s->fam) >= 0;
    for (int d = 0; d < D.n && ok; d++) {
        const nsr_stmt *t = D.s[d];
        for (int e = 0; e < D.n && ok; e++) /* one family: the same position everywhere */
            if (D.s[e]->fam == t->fam && target_pos(D.s[e], s->fam) != target_pos(t, s->fam))
                ok = 0;
        ok = ok && reads_ok(C, &D, s->fam, t->value, 0);
    }
    /* out of memory in collect leaves the loop sequential, which is always correct */
    tpk_mem_free(&D.al, D.s);
    s->rolled = ok;
    return k + ok;
}

static int mark_block(nsr_check *C, nsr_stmt **body, int n, int depth)
{
    if (depth > NSR_MAX_DEPTH)
        return 0;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (body[i]->kind == NSR_S_FOR) {
            int m = mark_for(C, body[i], depth);
            if (m < 0)
                return m;
            k += m;
        }
    return k;
}

int nsr_roll_mark(nsr_check *C, nsr_ast *ast)
{
    return mark_block(C, ast->stmts, ast->nstmts, 0);
}

void nsr_rolled_free(nsr_rolled *r)
{
    if (r == NULL)
        return;
    for (int i = 0; i < r->nphis; i++)
        tpk_phi_free(r->phis[i]);
    tpk_allocator al = r->al;
    nsr_ir_free(r->ir);
    tpk_mem_free(&al, r->phis);
    tpk_mem_free(&al, r->plan_last);
    tpk_mem_free(&al, r->fi);
    tpk_mem_free(&al, r->dm);
    tpk_mem_free(&al, r->file);
    nsr_arena_free(r->arena);
    tpk_mem_free(&al, r);
}

/* ---- Widths of the rolled form ---------------------------------------------------------------
 * The unrolled elaborator unifies widths member by member; a program kept only rolled gets the
 * same rules once per statement (theory §6): a MatMul's source has the A-var's column width and
 * its result the row width, the vectors of a sum or product share a width, a definition has its
 * family's width. Values: a width node (≥ 0), W_SCALAR, W_NUM (numbers: fit anywhere), W_ANY. */
enum { W_SCALAR = -1, W_NUM = -2, W_ANY = -3 };

typedef struct wwalk {
    nsr_check *C;
    signed char *vec; /* per symbol: −1 unknown, 0 scalar family, 1 vector family */
} wwalk;

static int w_unify(wwalk *W, int a, int b, const nsr_expr *e, const char *what)
{
    if (a < 0 || b < 0)
        return TPK_OK;
    char fa[160], fb[160];
    snprintf(fa, sizeof fa, "one side has width %s", nsr_uf_show(W->C, a));
    snprintf(fb, sizeof fb, "the other has width %s", nsr_uf_show(W->C, b));
    return nsr_uf_unify(W->C, a, b, e->line, e->col, what, fa, fb);
}

static int w_expr(wwalk *W, const nsr_expr *e, int depth, int *out);

static int w_matmul(wwalk *W, const nsr_expr *am, const nsr_expr *src, const nsr_expr *at,
                    int depth, int *out)
{
    nsr_check *C = W->C;
    const nsr_sym *af = &C->sym[am->sym];
    char what[200], fa[200], fb[200];
    int ws;
    if (src->kind == NSR_E_NAME && src->sym >= 0 && C->sym[src->sym].kind == NSR_SYM_INPUT) {
        ws = C->sym[src->sym].node;
    } else if (w_expr(W, src, depth + 1, &ws)) {
        return TPK_ETYPE;
    }
    if (ws == W_SCALAR)
        return nsr_error(C->S, TPK_ETYPE, src->line, src->col,
                         "MatMul %s needs a G- or H-var on the right, not a scalar", af->name);
    snprintf(what, sizeof what, "MatMul %s\xc2\xb7%s", af->name,
             src->kind == NSR_E_NAME && src->name ? src->name : "(...)");
    snprintf(fa, sizeof fa, "%s is A(%s, %s) (declared at line %d)", af->name,
             nsr_uf_show(C, af->node), nsr_uf_show(C, af->node2), af->line);
    if (ws >= 0) {
        snprintf(fb, sizeof fb, "the source has width %s", nsr_uf_show(C, ws));
        if (nsr_uf_unify(C, af->node2, ws, at->line, at->col, what, fa, fb))
            return TPK_ETYPE;
    }
    *out = af->node;
    return TPK_OK;
}

static int w_expr(wwalk *W, const nsr_expr *e, int depth, int *out)
{
    nsr_check *C = W->C;
    *out = W_NUM;
    if (e == NULL || depth > 4 * NSR_MAX_DEPTH)
        return TPK_OK;
    const nsr_sym *y = e->sym >= 0 ? &C->sym[e->sym] : NULL;
    int a, b;
    switch (e->kind) {
    case NSR_E_NUM:
        return TPK_OK;
    case NSR_E_NAME:
        if (y == NULL)
            return TPK_OK;
        if (y->kind == NSR_SYM_GFAM)
            *out = y->node;
        else if (y->kind == NSR_SYM_DFAM)
            *out = W->vec[e->sym] == 1 ? y->node : W->vec[e->sym] == 0 ? W_SCALAR : W_ANY;
        return TPK_OK;
    case NSR_E_APPLY:
        return e->a->kind == NSR_E_NAME && e->a->sym >= 0 ? w_matmul(W, e->a, e->b, e, depth, out)
                                                          : TPK_OK;
    case NSR_E_CALL:
        if (y != NULL && y->kind == NSR_SYM_AFAM && e->nargs == 1)
            return w_matmul(W, e, e->args[0], e, depth, out);
        if (e->sym < 0 && (strcmp(e->name, "mean") == 0)) {
            *out = W_SCALAR;
            return e->nargs == 1 ? w_expr(W, e->args[0], depth + 1, &a) : TPK_OK;
        }
        if (e->sym < 0) /* mod, wrap, inside, bn, readout: numbers or left to the evaluator */
            return TPK_OK;
        if (e->nargs == 1)
            return w_expr(W, e->args[0], depth + 1, out); /* φ keeps the width */
        return TPK_OK;
    case NSR_E_SUM:
        return w_expr(W, e->a, depth + 1, out);
    case NSR_E_SOFTMAX:
        *out = W_SCALAR;
        return w_expr(W, e->a, depth + 1, &a);
    case NSR_E_NEG:
        return w_expr(W, e->a, depth + 1, out);
    case NSR_E_BIN:
        if (w_expr(W, e->a, depth + 1, &a) || w_expr(W, e->b, depth + 1, &b))
            return TPK_ETYPE;
        if (e->op == NSR_T_CARET) {
            *out = a;
            return TPK_OK;
        }
        if (a >= 0 && b >= 0 &&
            w_unify(W, a, b, e, e->op == NSR_T_PLUS || e->op == NSR_T_MINUS ? "sum of vectors"
                                                                             : "product of vectors"))
            return TPK_ETYPE;
        *out = a >= 0 ? a : b >= 0 ? b : (a == W_ANY || b == W_ANY) ? W_ANY
               : (a == W_SCALAR || b == W_SCALAR) ? W_SCALAR : W_NUM;
        return TPK_OK;
    default:
        return TPK_OK;
    }
}

int nsr_roll_widths(nsr_check *C, const nsr_rolled *R)
{
    wwalk W = {.C = C};
    W.vec = tpk_calloc(C->S->ctx, (size_t)C->nsym + 1, 1);
    if (W.vec == NULL)
        return TPK_ENOMEM;
    memset(W.vec, -1, (size_t)C->nsym + 1);
    int st = TPK_OK;
    /* twice: a family read before the statement that fixes its kind (rare) is seen again */
    for (int pass = 0; pass < 2 && st == TPK_OK; pass++)
        for (int k = 0; k < R->nfi && st == TPK_OK; k++) {
            const nsr_stmt *s = R->fi[k].stmt;
            if (k > 0 && R->fi[k - 1].stmt == s)
                continue; /* the same statement in the next layer: the same facts */
            int w;
            if (s->kind == NSR_S_OUTPUT) {
                if (s->value->nargs >= 1)
                    st = w_expr(&W, s->value->args[0], 0, &w);
                continue;
            }
            if ((st = w_expr(&W, s->value, 0, &w)))
                break;
            if (s->annot == NSR_ANN_SCALAR || w == W_SCALAR) {
                if (W.vec[s->fam] < 0)
                    W.vec[s->fam] = 0;
            } else if (w >= 0) {
                W.vec[s->fam] = 1;
                char what[200], fa[200], fb[200];
                snprintf(what, sizeof what, "definition of %s", s->name);
                snprintf(fa, sizeof fa, "%s has width %s", s->name,
                         nsr_uf_show(C, C->sym[s->fam].node));
                snprintf(fb, sizeof fb, "its value has width %s", nsr_uf_show(C, w));
                st = nsr_uf_unify(C, C->sym[s->fam].node, w, s->value->line, s->value->col, what,
                                  fa, fb);
            }
        }
    tpk_free(C->S->ctx, W.vec);
    return st;
}
