/* Polynomial (degree ≤ 2) analysis of RPN bodies for the limit evaluator: see limit-poly.h.
 * Scalars are fixed numbers in the limit (NETSOR+ Moments, theory §1.9), so a body such as
 * layernorm's (k_i + Σ_j a_ij k_j − m)/√v is, input by input, an affine form in Gaussians. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend-impl.h"
#include "tpk/alloc.h"
#include "limit-poly.h"

struct tpk_nsr_poly_ws {
    int depth, nargs, deg2;
    int *deg;       /* per stack slot */
    double *c0;     /* per slot */
    double *lin;    /* depth × nargs */
    double *quad;   /* depth × nargs², only when the body may be quadratic */
    tpk_allocator al;
};

int tpk_nsr_poly_degree(const tpk_rpn *body, const tpk_allocator *al)
{
    if (body == NULL || body->len <= 0)
        return -1;
    int *st = tpk_mem_malloc(al, (size_t)body->len * sizeof *st, NULL), sp = 0, bad = 0;
    if (st == NULL)
        return -1;
    for (int i = 0; i < body->len && !bad; i++) {
        const tpk_rpn_node *nd = &body->node[i];
        switch (nd->op) {
        case TPK_RPN_CONST:
        case TPK_RPN_SCALAR:
            st[sp++] = 0;
            break;
        case TPK_RPN_GVAR:
            st[sp++] = 1;
            break;
        case TPK_RPN_NEG:
            bad = sp < 1;
            break;
        case TPK_RPN_ADD:
        case TPK_RPN_SUB:
            if ((bad = sp < 2) == 0) {
                st[sp - 2] = st[sp - 2] > st[sp - 1] ? st[sp - 2] : st[sp - 1];
                sp--;
            }
            break;
        case TPK_RPN_MUL:
            if ((bad = sp < 2) == 0) {
                st[sp - 2] += st[sp - 1];
                sp--;
                bad = st[sp - 1] > 64; /* far beyond any use; keeps the sum bounded */
            }
            break;
        case TPK_RPN_DIV:
            if ((bad = sp < 2 || st[sp - 1] != 0) == 0)
                sp--;
            break;
        case TPK_RPN_POWI:
            if ((bad = sp < 1) == 0 && st[sp - 1] != 0) {
                int e = (int)nd->value;
                bad = e < 0 || e > 64;
                if (!bad)
                    st[sp - 1] *= e;
                bad = bad || st[sp - 1] > 64;
            }
            break;
        case TPK_RPN_CALL:
            bad = sp < 1 || st[sp - 1] != 0;
            break;
        default:
            bad = 1;
        }
    }
    int d = !bad && sp == 1 ? st[0] : -1;
    tpk_mem_free(al, st);
    return d;
}

tpk_nsr_poly_ws *tpk_nsr_poly_ws_alloc(const tpk_rpn *body, tpk_ctx *ctx)
{
    int depth = tpk_nsr_rpn_depth(body->node, body->len);
    if (depth < 1)
        return NULL;
    tpk_nsr_poly_ws *w = tpk_calloc(ctx, 1, sizeof *w);
    if (w == NULL)
        return NULL;
    w->al = tpk_ctx_allocator(ctx);
    size_t na = (size_t)(body->nargs > 0 ? body->nargs : 1), D = (size_t)depth;
    w->depth = depth;
    w->nargs = body->nargs;
    w->deg2 = tpk_nsr_poly_degree(body, &w->al) >= 2;
    w->deg = tpk_malloc(ctx, D * sizeof *w->deg);
    w->c0 = tpk_malloc(ctx, D * sizeof *w->c0);
    w->lin = tpk_malloc(ctx, D * na * sizeof *w->lin);
    w->quad = w->deg2 ? tpk_malloc(ctx, D * na * na * sizeof *w->quad) : NULL;
    if (!w->deg || !w->c0 || !w->lin || (w->deg2 && !w->quad)) {
        tpk_nsr_poly_ws_free(w);
        return NULL;
    }
    return w;
}

void tpk_nsr_poly_ws_free(tpk_nsr_poly_ws *w)
{
    if (w == NULL)
        return;
    tpk_allocator al = w->al;
    tpk_mem_free(&al, w->deg);
    tpk_mem_free(&al, w->c0);
    tpk_mem_free(&al, w->lin);
    tpk_mem_free(&al, w->quad);
    tpk_mem_free(&al, w);
}

static int arg_index(const tpk_rpn *b, int var)
{
    int lo = 0, hi = b->nargs - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (b->args[mid] == var)
            return mid;
        if (b->args[mid] < var)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

/* slot s ← s · c (all its coefficients) */
static void scale_slot(tpk_nsr_poly_ws *w, int s, double c, int divide)
{
    size_t na = (size_t)w->nargs;
    double *l = w->lin + (size_t)s * na, *q = w->quad ? w->quad + (size_t)s * na * na : NULL;
    if (divide) {
        w->c0[s] /= c;
        if (w->deg[s] >= 1)
            for (size_t i = 0; i < na; i++)
                l[i] /= c;
        if (w->deg[s] == 2)
            for (size_t i = 0; i < na * na; i++)
                q[i] /= c;
        return;
    }
    w->c0[s] *= c;
    if (w->deg[s] >= 1)
        for (size_t i = 0; i < na; i++)
            l[i] *= c;
    if (w->deg[s] == 2)
        for (size_t i = 0; i < na * na; i++)
            q[i] *= c;
}

static void copy_slot(tpk_nsr_poly_ws *w, int dst, int src)
{
    size_t na = (size_t)w->nargs;
    w->deg[dst] = w->deg[src];
    w->c0[dst] = w->c0[src];
    if (w->deg[src] >= 1)
        memcpy(w->lin + (size_t)dst * na, w->lin + (size_t)src * na, na * sizeof *w->lin);
    if (w->deg[src] == 2)
        memcpy(w->quad + (size_t)dst * na * na, w->quad + (size_t)src * na * na,
               na * na * sizeof *w->quad);
}

/* slot a ← a · b for two degree-1 slots (a degree-2 result; the workspace has quad) */
static void mul_linear(tpk_nsr_poly_ws *w, int a, int b)
{
    size_t na = (size_t)w->nargs;
    double *la = w->lin + (size_t)a * na, *lb = w->lin + (size_t)b * na;
    double *q = w->quad + (size_t)a * na * na;
    for (size_t i = 0; i < na; i++)
        for (size_t j = 0; j < na; j++)
            q[i * na + j] = la[i] * lb[j];
    double ca = w->c0[a], cb = w->c0[b];
    for (size_t i = 0; i < na; i++)
        la[i] = ca * lb[i] + cb * la[i];
    w->c0[a] = ca * cb;
    w->deg[a] = 2;
}

static double powi(double base, int e)
{
    unsigned m = e < 0 ? (unsigned)(-(long)e) : (unsigned)e;
    double r = 1.0;
    for (unsigned k = m; k; k >>= 1) {
        if (k & 1u)
            r *= base;
        base *= base;
    }
    return e < 0 ? 1.0 / r : r;
}

int tpk_nsr_poly_eval(const tpk_rpn *body, double *const *scal, size_t input, int maxdeg,
                      tpk_nsr_poly_ws *w, double *c0, double *lin, double *quad)
{
    size_t na = (size_t)w->nargs;
    int sp = 0;
    if (maxdeg >= 2 && !w->deg2)
        maxdeg = 1; /* the structure never gets past 1 */
    for (int i = 0; i < body->len; i++) {
        const tpk_rpn_node *nd = &body->node[i];
        int a = sp - 2, b = sp - 1;
        switch (nd->op) {
        case TPK_RPN_CONST:
        case TPK_RPN_SCALAR:
            w->deg[sp] = 0;
            w->c0[sp] = nd->op == TPK_RPN_CONST ? nd->value : scal[nd->var][input];
            sp++;
            break;
        case TPK_RPN_GVAR: {
            int k = arg_index(body, nd->var);
            if (k < 0)
                return -1;
            double *l = w->lin + (size_t)sp * na;
            memset(l, 0, na * sizeof *l);
            l[k] = 1.0;
            w->deg[sp] = 1;
            w->c0[sp] = 0.0;
            sp++;
            break;
        }
        case TPK_RPN_NEG:
            scale_slot(w, b, -1.0, 0);
            break;
        case TPK_RPN_ADD:
        case TPK_RPN_SUB: {
            double s = nd->op == TPK_RPN_ADD ? 1.0 : -1.0;
            int dg = w->deg[a] > w->deg[b] ? w->deg[a] : w->deg[b];
            double *la = w->lin + (size_t)a * na, *lb = w->lin + (size_t)b * na;
            w->c0[a] += s * w->c0[b];
            if (dg >= 1) {
                if (w->deg[a] < 1)
                    memset(la, 0, na * sizeof *la);
                if (w->deg[b] >= 1)
                    for (size_t j = 0; j < na; j++)
                        la[j] += s * lb[j];
            }
            if (dg == 2) {
                double *qa = w->quad + (size_t)a * na * na, *qb = w->quad + (size_t)b * na * na;
                if (w->deg[a] < 2)
                    memset(qa, 0, na * na * sizeof *qa);
                if (w->deg[b] == 2)
                    for (size_t j = 0; j < na * na; j++)
                        qa[j] += s * qb[j];
            }
            w->deg[a] = dg;
            sp--;
            break;
        }
        case TPK_RPN_MUL:
            if (w->deg[a] == 0) {
                double c = w->c0[a];
                copy_slot(w, a, b);
                scale_slot(w, a, c, 0);
            } else if (w->deg[b] == 0) {
                scale_slot(w, a, w->c0[b], 0);
            } else if (w->deg[a] + w->deg[b] <= maxdeg) {
                mul_linear(w, a, b);
            } else {
                return -1;
            }
            sp--;
            break;
        case TPK_RPN_DIV:
            if (w->deg[b] != 0 || w->c0[b] == 0.0 || !isfinite(w->c0[b]))
                return -1;
            scale_slot(w, a, w->c0[b], 1);
            sp--;
            break;
        case TPK_RPN_POWI: {
            int e = (int)nd->value;
            if (w->deg[b] == 0) {
                w->c0[b] = powi(w->c0[b], e);
            } else if (e == 0) {
                w->deg[b] = 0;
                w->c0[b] = 1.0;
            } else if (e == 2 && w->deg[b] == 1 && maxdeg >= 2) {
                mul_linear(w, b, b); /* in place: (c + lᵀZ)² */
            } else if (e != 1) {
                return -1;
            }
            break;
        }
        case TPK_RPN_CALL:
            if (w->deg[b] != 0)
                return -1;
            w->c0[b] = tpk_phi_eval(nd->fn, w->c0[b]);
            break;
        default:
            return -1;
        }
        if (sp > 0 && w->deg[sp - 1] > maxdeg)
            return -1;
    }
    if (sp != 1)
        return -1;
    int dg = w->deg[0];
    *c0 = w->c0[0];
    int ok = isfinite(*c0);
    for (size_t j = 0; j < na && lin; j++) {
        lin[j] = dg >= 1 ? w->lin[j] : 0.0;
        ok = ok && isfinite(lin[j]);
    }
    if (dg == 2 && quad) {
        for (size_t j = 0; j < na * na; j++) {
            quad[j] = w->quad[j];
            ok = ok && isfinite(quad[j]);
        }
    }
    return ok ? dg : -1;
}
