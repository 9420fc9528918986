/* Moments in the rolled limit evaluator: a Moment's body as a list of monomials of degree ≤ 2 in
 * vectors (theory §1.9). */
#include "flimit-impl.h"
#include "tpk/alloc.h"

#include <string.h>

void nsr_fl_ml_free(fl *F, mlist *L)
{
    for (int i = 0; i < L->n; i++) {
        nsr_fl_val_free(F, &L->v[i].coef);
        for (int k = 0; k < L->v[i].nf; k++)
            nsr_fl_val_free(F, &L->v[i].f[k]);
    }
    tpk_free(F->X.ctx, L->v);
    memset(L, 0, sizeof *L);
}

void nsr_fl_mono_free(fl *F, mono *m)
{
    nsr_fl_val_free(F, &m->coef);
    for (int k = 0; k < m->nf; k++)
        nsr_fl_val_free(F, &m->f[k]);
    memset(m, 0, sizeof *m);
}

/* Append m to L, which owns it from now on (on failure it is freed: no caller leaks it). */
int nsr_fl_ml_push(fl *F, mlist *L, mono *m)
{
    if (L->n == L->cap) {
        int cap = L->cap ? 2 * L->cap : 8;
        mono *v = tpk_realloc(F->X.ctx, L->v, (size_t)cap * sizeof *v);
        if (v == NULL) {
            nsr_fl_mono_free(F, m);
            return TPK_ERROR(F->X.ctx, TPK_ENOMEM, "out of memory");
        }
        L->v = v;
        L->cap = cap;
    }
    L->v[L->n++] = *m;
    return TPK_OK;
}

int nsr_fl_ml_mul(fl *F, mlist *A, mlist *B, mlist *out, const nsr_expr *e)
{
    int st = TPK_OK;
    for (int i = 0; i < A->n && st == TPK_OK; i++)
        for (int j = 0; j < B->n && st == TPK_OK; j++) {
            mono *x = &A->v[i], *y = &B->v[j];
            if (x->nf + y->nf > 2) {
                st = NSR_UNSUP(&F->X, e, "a Moment of degree > 2 in vectors: write the product as one "
                           "function");
                break;
            }
            mono r = {0};
            if ((st = nsr_fl_val_copy(F, &x->coef, &r.coef)) == TPK_OK)
                st = nsr_fl_val_scale(F, &r.coef, &y->coef);
            for (int k = 0; k < x->nf && st == TPK_OK; k++)
                st = nsr_fl_val_copy(F, &x->f[k], &r.f[r.nf++]);
            for (int k = 0; k < y->nf && st == TPK_OK; k++)
                st = nsr_fl_val_copy(F, &y->f[k], &r.f[r.nf++]);
            if (st == TPK_OK)
                st = nsr_fl_ml_push(F, out, &r);
            else {
                nsr_fl_val_free(F, &r.coef);
                for (int k = 0; k < r.nf; k++)
                    nsr_fl_val_free(F, &r.f[k]);
            }
        }
    return st;
}
