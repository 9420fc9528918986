/* Moments in the rolled limit evaluator: a Moment's body as a list of monomials of degree ≤ 2 in
 * vectors, and its expectation at every point (theory §1.9: the limit of a NETSOR+ Moment is the
 * expectation under the limit Gaussian). The walk that builds the list is the expression walk's
 * (flimit_eval.c). */
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
                st = NSR_UNSUP(&F->X, e, "a Moment of degree > 2 in vectors: write the product "
                               "as one function");
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

/* Moves every monomial of A into L, its coefficient times *scale (NULL: as it is); A is left
 * empty. Stops at the first failure (what is left of A is freed). */
int nsr_fl_ml_append(fl *F, mlist *L, mlist *A, const val *scale)
{
    int st = TPK_OK;
    for (int i = 0; i < A->n && st == TPK_OK; i++) {
        if (scale != NULL && (st = nsr_fl_val_scale(F, &A->v[i].coef, scale)) != TPK_OK)
            break;
        if ((st = nsr_fl_ml_push(F, L, &A->v[i])) != TPK_OK)
            break;
        memset(&A->v[i], 0, sizeof A->v[i]);
    }
    nsr_fl_ml_free(F, A);
    return st ? F->X.ctx->status : TPK_OK;
}

/* out += A·A (e: where a product of degree > 2 is refused). */
int nsr_fl_ml_square(fl *F, mlist *A, mlist *out, const nsr_expr *e)
{
    mlist A2 = {0};
    int st = TPK_OK;
    for (int i = 0; i < A->n && st == TPK_OK; i++) {
        mono c = {0};
        if ((st = nsr_fl_val_copy(F, &A->v[i].coef, &c.coef)) == TPK_OK) {
            for (int q = 0; q < A->v[i].nf && st == TPK_OK; q++)
                st = nsr_fl_val_copy(F, &A->v[i].f[q], &c.f[c.nf++]);
        }
        if (st == TPK_OK)
            st = nsr_fl_ml_push(F, &A2, &c);
        else
            nsr_fl_mono_free(F, &c);
    }
    if (st == TPK_OK)
        st = nsr_fl_ml_mul(F, A, &A2, out, e);
    nsr_fl_ml_free(F, &A2);
    return st;
}

/* The expectation of L's sum at every input and point of an m-point domain: out = Σ coef·E[Π f],
 * per-point scalars (a constant monomial is its coefficient, one factor its mean, two their
 * diagonal second moment). Nothing is left in out on failure. */
int nsr_fl_ml_expect(fl *F, const mlist *L, long m, val *out)
{
    size_t n = F->N * (size_t)m;
    nsr_fl_val_const(out, m, 0);
    int st = nsr_fl_val_scal(F, out);
    double *tmp = st ? NULL : nsr_fam_alloc(&F->X, n, sizeof *tmp);
    if (st == TPK_OK && tmp == NULL)
        st = F->X.ctx->status;
    for (int i = 0; i < L->n && st == TPK_OK; i++) {
        const mono *q = &L->v[i];
        memset(tmp, 0, n * sizeof *tmp);
        int nz = 1;
        if (q->nf == 0) {
            for (size_t k = 0; k < n; k++)
                tmp[k] = 1;
        } else if (q->nf == 1) {
            st = nsr_fl_lin_mean(F, &q->f[0], tmp, &nz);
        } else {
            st = nsr_fl_diag_m2(F, &q->f[0], &q->f[1], tmp);
        }
        if (st)
            break;
        for (size_t k = 0; k < n; k++)
            out->s[k] += (q->coef.kind == V_CONST ? q->coef.c : q->coef.s[k]) * tmp[k];
    }
    tpk_free(F->X.ctx, tmp);
    if (st)
        nsr_fl_val_free(F, out);
    return st;
}
