/* Statements of the rolled limit evaluator: a family instruction's value becomes its block; an
 * output statement's value is kept for the readout, and its outputs are named. */
#include "flimit-impl.h"
#include "tpk/alloc.h"

#include <string.h>

/* A scalar value's block (v consumed): a scalar family (BK_SCAL), or the zero vector (BK_ZERO)
 * where a vector statement's value folds to 0. */
static int scalar_block(fl *F, const nsr_stmt *s, val *v, int *k)
{
    if (s->annot == NSR_ANN_G || s->annot == NSR_ANN_H) {
        nsr_fl_val_free(F, v);
        return nsr_fam_err(&F->X, TPK_ETYPE, s->value, "%s is annotated %s but its value is a "
                           "scalar", s->name, s->annot == NSR_ANN_G ? "G" : "H");
    }
    int zero = v->kind == V_CONST && v->c == 0 && s->annot != NSR_ANN_SCALAR, st = TPK_OK;
    *k = nsr_fl_new_block(F, zero ? BK_ZERO : BK_SCAL, s->fam, v->m);
    if (*k >= 0 && !zero && (st = nsr_fl_val_scal(F, v)) == TPK_OK) {
        F->b[*k].s = v->s;
        v->s = NULL;
    }
    nsr_fl_val_free(F, v);
    return st;
}

/* A vector value's block (v consumed): a new block the value is (a MatMul's, a φ's) becomes the
 * family's own; dense maps of Gaussian blocks are materialised (attention's Σ_j a_ij k_j); gathers
 * stay a lazy combination (BK_MIX) read term by term. */
static int vector_block(fl *F, const nsr_stmt *s, val *v, int *k)
{
    int dense = 0, nonlin = 0;
    for (int i = 0; i < v->nt; i++) {
        dense |= v->t[i].dense;
        nonlin |= F->b[v->t[i].blk].kind == BK_NONLIN;
    }
    if (v->nt == 1 && nsr_fl_val_is_block(v, &F->b[v->t[0].blk]) && F->b[v->t[0].blk].fam < 0 &&
        F->b[v->t[0].blk].kind != BK_BIAS) {
        *k = v->t[0].blk;
        F->b[*k].fam = s->fam;
        F->b[*k].fi = F->X.cur;
        nsr_fl_val_free(F, v);
        return TPK_OK;
    }
    if (dense && !nonlin) {
        int st = nsr_fl_materialize(F, v, s->fam, k);
        nsr_fl_val_free(F, v);
        return st;
    }
    if (dense) {
        nsr_fl_val_free(F, v);
        return NSR_UNSUP(&F->X, s->value, "an index sum of H-vars defining a family (pooling is "
                         "taken in a readout)");
    }
    if ((*k = nsr_fl_new_block(F, BK_MIX, s->fam, v->m)) < 0) {
        nsr_fl_val_free(F, v);
        return TPK_OK;
    }
    F->b[*k].nanc = 0;
    for (int i = 0; i < v->nt; i++) {
        nsr_fl_anc_union_term(F, &F->b[*k], &v->t[i], v->m);
        nsr_fl_touch(F, v->t[i].blk);
    }
    F->b[*k].mix = *v;
    return TPK_OK;
}

/* A family instruction: its value over its domain becomes the family's block, which takes the
 * member lookup of the instruction's target. */
int nsr_fl_run_def(fl *F, const nsr_finstr *fi)
{
    const nsr_stmt *s = fi->stmt;
    nsr_fdom D;
    nsr_trie tr;
    memset(&tr, 0, sizeof tr);
    if (nsr_instr_domain(&F->X, fi, &D, &tr)) {
        tpk_free(F->X.ctx, D.val);
        nsr_trie_free(&tr, F->X.ctx);
        return F->X.ctx->status;
    }
    val v;
    int st = nsr_fl_eval(F, nsr_fl_arg(F, nsr_fl_root(F), 0), &D, &v);
    tpk_free(F->X.ctx, D.val);
    if (st) {
        nsr_trie_free(&tr, F->X.ctx);
        return st;
    }
    int k = -1;
    if (v.kind != V_LIN) {
        st = scalar_block(F, s, &v, &k);
    } else if (s->annot == NSR_ANN_SCALAR) {
        nsr_fl_val_free(F, &v);
        st = nsr_fam_err(&F->X, TPK_ETYPE, s->value, "%s is annotated scalar but its value is a "
                         "vector", s->name);
    } else {
        st = vector_block(F, s, &v, &k);
    }
    if (k < 0 || st) {
        nsr_trie_free(&tr, F->X.ctx);
        return st ? st : F->X.ctx->status;
    }
    fblock *b = &F->b[k];
    b->fam = s->fam;
    b->fi = F->X.cur;
    b->nidx = s->nidx;
    b->tr = tr;
    b->line = s->name_line;
    b->col = s->name_col;
    return TPK_OK;
}

/* The outputs of an output instruction as the program's tpk_output entries ("y[3]"). */
int nsr_fl_name_outputs(fl *F, const nsr_stmt *s, const nsr_fdom *D, double var, double bias)
{
    tpk_program *P = F->fill;
    int st = TPK_OK;
    {
        tpk_output *no = tpk_realloc(F->X.ctx, P->output,
                                     ((size_t)P->noutputs + (size_t)D->m) * sizeof *no);
        if (no == NULL)
            st = TPK_ERROR(F->X.ctx, TPK_ENOMEM, "out of memory");
        else
            P->output = no;
        for (long q = 0; st == TPK_OK && q < D->m; q++) {
            char buf[160];
            size_t n = (size_t)snprintf(buf, sizeof buf, "%s", s->name);
            nsr_bind_point(&F->X, D, q);
            for (int i = 0; i < s->nidx && st == TPK_OK && n < sizeof buf; i++) {
                int v;
                st = nsr_fam_int(&F->X, s->idx[i], &v);
                n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%d", i ? "," : "[", v);
                if (i == s->nidx - 1 && n < sizeof buf)
                    n += (size_t)snprintf(buf + n, sizeof buf - n, "]");
            }
            tpk_output *y = &P->output[P->noutputs];
            memset(y, 0, sizeof *y);
            if (st == TPK_OK && (y->name = tpk_strdup(F->X.ctx, buf)) == NULL)
                st = TPK_ERROR(F->X.ctx, TPK_ENOMEM, "out of memory");
            if (st == TPK_OK) {
                y->src = -1;
                y->var = var;
                y->bias_var = bias;
                P->noutputs++;
            }
        }
    }
    return st;
}

/* An output statement: its readout variances and its value over its domain, kept in *o. */
int nsr_fl_run_output(fl *F, const nsr_finstr *fi, fout *o)
{
    const nsr_stmt *s = fi->stmt;
    const nsr_expr *rd = s->value;
    nsr_fdom D;
    nsr_trie tr;
    memset(&tr, 0, sizeof tr);
    int st = nsr_instr_domain(&F->X, fi, &D, &tr);
    nsr_trie_free(&tr, F->X.ctx);
    if (st) {
        tpk_free(F->X.ctx, D.val);
        return st;
    }
    memset(o, 0, sizeof *o);
    if (nsr_fam_num(&F->X, rd->args[1], &o->var) ||
        (rd->nargs == 3 && nsr_fam_num(&F->X, rd->args[2], &o->bias_var))) {
        tpk_free(F->X.ctx, D.val);
        return F->X.ctx->status;
    }
    if (o->var < 0 || o->bias_var < 0) {
        tpk_free(F->X.ctx, D.val);
        return nsr_fam_err(&F->X, TPK_ETYPE, rd, "readout variance is negative");
    }
    st = nsr_fl_eval(F, nsr_fl_arg(F, nsr_fl_root(F), 0), &D, &o->v);
    if (st == TPK_OK && o->v.kind != V_LIN)
        st = nsr_fam_err(&F->X, TPK_ETYPE, rd->args[0], "readout needs a G- or H-var, not a "
                         "scalar");
    if (st == TPK_OK && F->fill != NULL) /* a rolled-only program: name its outputs */
        st = nsr_fl_name_outputs(F, s, &D, o->var, o->bias_var);
    tpk_free(F->X.ctx, D.val);
    return st;
}
