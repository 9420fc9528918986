/* Limit evaluator, stage 3 — expansion (theory.md §2.3, §2.6): a Nonlin or Moment body as
 * Σ coef · Π factors, sums and products multiplied out (up to MAXT terms of MAXF factors), so
 * that each term pair of E[Z^u Z^v] can go to its own back end and each product splits into
 * independent groups: a GRU's (1 − z)·h̃ + z·h, a residual sum, layernorm's centred body. */
#include <stdlib.h>
#include <string.h>

#include "limit-impl.h"
#include "tpk/alloc.h"

/* The expansion of an RPN prefix: its first node and its terms. */
typedef struct xent {
    int start;
    int n;
    xterm t[MAXT];
} xent;

/* The prefix [start, end) as one factor. */
static void x_atomic(xent *e, int start, int end)
{
    e->start = start;
    e->n = 1;
    e->t[0].coef = 1.0;
    e->t[0].nf = 1;
    e->t[0].fs[0] = start;
    e->t[0].fe[0] = end;
}

/* xb = body node[0..len) as Σ coef · Π factors (xb->t allocated); atomic_only: the body as one
 * factor (no_factor). A sum or product that would exceed MAXT terms or MAXF factors, a call, a
 * power, a division stays one factor; 1 − σ(g) of a smoothed step stays one factor σ(−g) for the
 * orthant back end. Zero terms (g − g) are dropped, one is kept. */
int nsr_lim_expand(const tpk_rpn_node *node, int len, int atomic_only, xbody *xb, tpk_ctx *ctx)
{
    xb->node = node;
    xb->nterms = 0;
    xb->t = NULL;
    xent *stk = NULL;
    int sp = 0;
    if (atomic_only)
        goto whole;
    int depth = tpk_nsr_rpn_depth(node, len);
    stk = tpk_malloc(ctx, (size_t)(depth > 0 ? depth : 1) * sizeof *stk);
    if (stk == NULL)
        return TPK_ENOMEM;
    for (int i = 0; i < len; i++) {
        const tpk_rpn_node *nd = &node[i];
        switch (nd->op) {
        case TPK_RPN_CONST:
            stk[sp].start = i;
            stk[sp].n = 1;
            stk[sp].t[0].coef = nd->value;
            stk[sp].t[0].nf = 0;
            sp++;
            break;
        case TPK_RPN_GVAR:
        case TPK_RPN_SCALAR:
            x_atomic(&stk[sp++], i, i + 1);
            break;
        case TPK_RPN_NEG:
            for (int t = 0; t < stk[sp - 1].n; t++)
                stk[sp - 1].t[t].coef = -stk[sp - 1].t[t].coef;
            break;
        case TPK_RPN_CALL:
        case TPK_RPN_POWI:
            x_atomic(&stk[sp - 1], stk[sp - 1].start, i + 1);
            break;
        case TPK_RPN_DIV:
            sp--;
            x_atomic(&stk[sp - 1], stk[sp - 1].start, i + 1);
            break;
        case TPK_RPN_ADD:
        case TPK_RPN_SUB: {
            xent *a = &stk[sp - 2], *b = &stk[sp - 1];
            int dummy;
            double da, db, dv;
            /* 1 − σ(g) of a smoothed step stays one factor, σ(−g), for the orthant back-end */
            if (nd->op == TPK_RPN_SUB && a->n == 1 && a->t[0].nf == 0 && a->t[0].coef == 1.0 &&
                tpk_nsr_orthant_factor(node + a->start, i + 1 - a->start, &dummy, &da, &db, &dv)) {
                x_atomic(a, a->start, i + 1);
            } else if (a->n + b->n > MAXT) {
                x_atomic(a, a->start, i + 1);
            } else {
                for (int t = 0; t < b->n; t++) {
                    a->t[a->n] = b->t[t];
                    if (nd->op == TPK_RPN_SUB)
                        a->t[a->n].coef = -a->t[a->n].coef;
                    a->n++;
                }
            }
            sp--;
            break;
        }
        case TPK_RPN_MUL: {
            xent *a = &stk[sp - 2], *b = &stk[sp - 1];
            int ok = a->n * b->n <= MAXT;
            for (int s = 0; ok && s < a->n; s++)
                for (int t = 0; ok && t < b->n; t++)
                    ok = a->t[s].nf + b->t[t].nf <= MAXF;
            if (!ok) {
                x_atomic(a, a->start, i + 1);
            } else {
                xterm prod[MAXT];
                int np = 0;
                for (int s = 0; s < a->n; s++)
                    for (int t = 0; t < b->n; t++) {
                        xterm *r = &prod[np++];
                        *r = a->t[s];
                        r->coef *= b->t[t].coef;
                        for (int f = 0; f < b->t[t].nf; f++) {
                            r->fs[r->nf] = b->t[t].fs[f];
                            r->fe[r->nf] = b->t[t].fe[f];
                            r->nf++;
                        }
                    }
                memcpy(a->t, prod, (size_t)np * sizeof *prod);
                a->n = np;
            }
            sp--;
            break;
        }
        default:
            break;
        }
    }
    xb->t = tpk_malloc(ctx, (size_t)stk[0].n * sizeof *xb->t);
    if (xb->t == NULL) {
        tpk_free(ctx, stk);
        return TPK_ENOMEM;
    }
    /* drop zero terms (e.g. g − g), keep at least one */
    for (int t = 0; t < stk[0].n; t++)
        if (stk[0].t[t].coef != 0.0 || (t == stk[0].n - 1 && xb->nterms == 0))
            xb->t[xb->nterms++] = stk[0].t[t];
    tpk_free(ctx, stk);
    return TPK_OK;
whole:
    xb->t = tpk_malloc(ctx, sizeof *xb->t);
    if (xb->t == NULL)
        return TPK_ENOMEM;
    xb->nterms = 1;
    xb->t[0].coef = 1.0;
    xb->t[0].nf = 1;
    xb->t[0].fs[0] = 0;
    xb->t[0].fe[0] = len;
    return TPK_OK;
}
