/* Limit evaluator, stage 1 — plan (theory.md §1.6, §1.10): before any number, the program's
 * atoms (MatMul outputs, embeddings, biases) and their families (one A-var, one embedding, one
 * bias: §1.6's block structure, §1.8 weight sharing), every G-var as a combination of atoms
 * (LinCombs by rule 2), and liveness — the last instruction that reads each variable and each
 * family's block — as free lists by instruction, so the store holds only what is still read.
 * nsr_lim_free tears the whole state down. */
#include <math.h>
#include <stdlib.h>

#include "limit-impl.h"
#include "tangent-impl.h"
#include "tpk/alloc.h"

static int rep_merge(grep *r, const tpk_instr *in, const grep *rep, tpk_ctx *ctx)
{
    int cap = 0;
    for (int t = 0; t < in->nterms; t++)
        cap += rep[in->term[t]].n;
    r->atom = tpk_malloc(ctx, (size_t)(cap ? cap : 1) * sizeof *r->atom);
    r->coef = tpk_malloc(ctx, (size_t)(cap ? cap : 1) * sizeof *r->coef);
    if (r->atom == NULL || r->coef == NULL)
        return TPK_ENOMEM;
    r->n = 0;
    r->mean = 0.0;
    for (int t = 0; t < in->nterms; t++) {
        const grep *s = &rep[in->term[t]];
        r->mean += in->coef[t] * s->mean;
        for (int i = 0; i < s->n; i++) {
            int k;
            for (k = 0; k < r->n; k++)
                if (r->atom[k] == s->atom[i])
                    break;
            if (k == r->n) {
                r->atom[k] = s->atom[i];
                r->coef[k] = 0.0;
                r->n++;
            }
            r->coef[k] += in->coef[t] * s->coef[i];
        }
    }
    return TPK_OK;
}

static void touch(lim *L, int v, int k)
{
    const tpk_program *p = L->p;
    if (L->last[v] < k)
        L->last[v] = k;
    if (L->tan != NULL && v != L->tan->one) {
        /* the NTK reads a variable's tangent through its partials (tangent.c) */
        const nsr_partials *d = &L->tan->part[v];
        if (p->var[v].type == TPK_VAR_G)
            touch(L, L->tan->one, k);
        for (int i = 0; i < d->n; i++)
            touch(L, d->d[i], k);
    }
    if (p->var[v].type == TPK_VAR_H && L->def[v] >= 0) {
        /* an H-var is read through its body's leaves */
        const tpk_rpn *b = &p->instr[L->def[v]].body;
        for (int j = 0; j < b->len; j++)
            if (b->node[j].op == TPK_RPN_GVAR || b->node[j].op == TPK_RPN_SCALAR)
                if (L->last[b->node[j].var] < k)
                    L->last[b->node[j].var] = k;
    }
}

/* Atoms, families, reps and free lists of L->p (L->p, N, ctx set; the rest zero). */
int nsr_lim_plan(lim *L, int all_outputs)
{
    const tpk_program *p = L->p;
    int nv = p->nvars, ni = p->ninstr, nbias = 0;
    for (int k = 0; k < ni; k++) {
        int op = p->instr[k].op;
        if (op == TPK_OP_BIAS)
            nbias++;
        if (op == TPK_OP_BIAS || op == TPK_OP_EMBED || op == TPK_OP_MATMUL)
            L->natoms++;
    }
    L->nfam = p->navars + p->nembeds + nbias;
    L->atom = tpk_calloc(L->ctx, (size_t)L->natoms + 1, sizeof *L->atom);
    L->fam = tpk_calloc(L->ctx, (size_t)L->nfam + 1, sizeof *L->fam);
    L->fam_of_avar = tpk_calloc(L->ctx, (size_t)p->navars + 1, sizeof(int));
    L->fam_of_embed = tpk_calloc(L->ctx, (size_t)p->nembeds + 1, sizeof(int));
    L->atom_of_instr = tpk_calloc(L->ctx, (size_t)ni + 1, sizeof(int));
    L->rep = tpk_calloc(L->ctx, (size_t)nv, sizeof *L->rep);
    L->xb = tpk_calloc(L->ctx, (size_t)nv, sizeof *L->xb);
    L->scal = tpk_calloc(L->ctx, (size_t)nv, sizeof *L->scal);
    L->aff = tpk_calloc(L->ctx, (size_t)nv, sizeof *L->aff);
    L->gnode = tpk_calloc(L->ctx, (size_t)nv, sizeof *L->gnode);
    L->last = tpk_malloc(L->ctx, (size_t)nv * sizeof *L->last);
    L->def = tpk_malloc(L->ctx, (size_t)nv * sizeof *L->def);
    L->var_next = tpk_malloc(L->ctx, ((size_t)nv + (size_t)L->nfam) * sizeof *L->var_next);
    L->free_var = tpk_malloc(L->ctx, ((size_t)ni + 2) * sizeof *L->free_var);
    L->free_fam = tpk_malloc(L->ctx, ((size_t)ni + 2) * sizeof *L->free_fam);
    if (!L->atom || !L->fam || !L->fam_of_avar || !L->fam_of_embed || !L->atom_of_instr ||
        !L->rep || !L->xb || !L->scal || !L->aff || !L->gnode || !L->last || !L->def || !L->var_next ||
        !L->free_var || !L->free_fam)
        return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory setting up the limit evaluator");
    int f = 0;
    for (int i = 0; i < p->navars; i++, f++) {
        L->fam_of_avar[i] = f;
        L->fam[f].kind = FAM_AVAR;
        L->fam[f].var = p->avar[i].var;
    }
    for (int i = 0; i < p->nembeds; i++, f++) {
        L->fam_of_embed[i] = f;
        L->fam[f].kind = FAM_EMBED;
    }
    for (int v = 0; v < nv; v++) {
        L->gnode[v].op = TPK_RPN_GVAR;
        L->gnode[v].var = v;
        L->last[v] = -1;
        L->def[v] = -1;
    }
    /* atoms and reps, symbolically, in program order */
    int na = 0;
    int *deff = L->def;
    for (int k = 0; k < ni; k++) {
        const tpk_instr *in = &p->instr[k];
        deff[in->out] = k;
        L->atom_of_instr[k] = -1;
        if (in->op == TPK_OP_LINCOMB) {
            if (rep_merge(&L->rep[in->out], in, L->rep, L->ctx))
                return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
            continue;
        }
        if (in->op != TPK_OP_BIAS && in->op != TPK_OP_EMBED && in->op != TPK_OP_MATMUL)
            continue;
        atom *a = &L->atom[na];
        if (in->op == TPK_OP_BIAS) {
            a->fam = f;
            L->fam[f].kind = FAM_BIAS;
            L->fam[f].var = in->var;
            a->mean = in->mean;
            f++;
        } else if (in->op == TPK_OP_EMBED) {
            a->fam = L->fam_of_embed[in->avar];
            a->src = in->src;
            a->scale = sqrt(in->var);
        } else {
            a->fam = L->fam_of_avar[in->avar];
            a->src = in->src;
        }
        a->loc = L->fam[a->fam].cap++;
        L->fam[a->fam].last = k;
        L->atom_of_instr[k] = na;
        grep *r = &L->rep[in->out];
        r->atom = tpk_malloc(L->ctx, sizeof *r->atom);
        r->coef = tpk_malloc(L->ctx, sizeof *r->coef);
        if (r->atom == NULL || r->coef == NULL)
            return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
        r->n = 1;
        r->atom[0] = na;
        r->coef[0] = 1.0;
        r->mean = a->mean;
        na++;
    }
    for (int i = 0; i < L->nfam; i++) {
        family *fm = &L->fam[i];
        fm->atoms = tpk_malloc(L->ctx, (size_t)(fm->cap ? fm->cap : 1) * sizeof *fm->atoms);
        if (fm->atoms == NULL)
            return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
        if (fm->cap == 0)
            fm->last = -1;
    }
    /* liveness: who reads what, and when */
    int *lastmm = tpk_malloc(L->ctx, ((size_t)p->navars + 1) * sizeof *lastmm);
    if (lastmm == NULL)
        return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
    for (int i = 0; i < p->navars; i++)
        lastmm[i] = -1;
    for (int k = 0; k < ni; k++)
        if (p->instr[k].op == TPK_OP_MATMUL)
            lastmm[p->instr[k].avar] = k;
    for (int k = 0; k < ni; k++) {
        const tpk_instr *in = &p->instr[k];
        switch (in->op) {
        case TPK_OP_MATMUL: /* new atom is correlated with every earlier one of its A-var */
            touch(L, in->src, lastmm[in->avar]);
            break;
        case TPK_OP_LINCOMB:
            for (int t = 0; t < in->nterms; t++)
                touch(L, in->term[t], k);
            break;
        case TPK_OP_NONLIN: /* aff_build reads its scalars when it is defined */
            for (int j = 0; j < in->body.len; j++)
                if (in->body.node[j].op == TPK_RPN_SCALAR)
                    touch(L, in->body.node[j].var, k);
            break;
        case TPK_OP_MOMENT:
            for (int j = 0; j < in->body.len; j++)
                if (in->body.node[j].op == TPK_RPN_GVAR || in->body.node[j].op == TPK_RPN_SCALAR)
                    touch(L, in->body.node[j].var, k);
            break;
        default:
            break;
        }
    }
    for (int o = all_outputs ? 0 : p->noutputs - 1; o < p->noutputs; o++)
        for (int k = 0; k < nsr_out_nparts(&p->output[o]); k++)
            touch(L, nsr_out_part(&p->output[o], k), ni);
    for (int v = 0; v < nv; v++)
        if (p->var[v].type == TPK_VAR_G)
            for (int i = 0; i < L->rep[v].n; i++) {
                family *fm = &L->fam[L->atom[L->rep[v].atom[i]].fam];
                if (fm->last < L->last[v])
                    fm->last = L->last[v];
            }
    /* free lists: var v after instruction max(def, last) */
    for (int k = 0; k <= ni; k++)
        L->free_var[k] = L->free_fam[k] = -1;
    for (int v = 0; v < nv; v++) {
        if (deff[v] < 0)
            continue;
        int at = L->last[v] > deff[v] ? L->last[v] : deff[v];
        L->var_next[v] = L->free_var[at];
        L->free_var[at] = v;
    }
    for (int i = 0; i < L->nfam; i++) {
        family *fm = &L->fam[i];
        if (fm->last < 0)
            continue;
        fm->next = L->free_fam[fm->last];
        L->free_fam[fm->last] = i;
    }
    tpk_free(L->ctx, lastmm);
    return TPK_OK;
}

/* Everything the plan, the store, the quadrature and the memos hold (L itself is the caller's). */
void nsr_lim_free(lim *L)
{
    const tpk_program *p = L->p;
    if (L->rep || L->xb || L->scal)
        for (int v = 0; v < p->nvars; v++) {
            if (L->rep)
                tpk_free(L->ctx, L->rep[v].atom), tpk_free(L->ctx, L->rep[v].coef);
            if (L->xb)
                tpk_free(L->ctx, L->xb[v].t);
            if (L->scal)
                tpk_free(L->ctx, L->scal[v]);
            if (L->aff)
                tpk_free(L->ctx, L->aff[v]);
        }
    if (L->fam)
        for (int i = 0; i < L->nfam; i++) {
            tpk_free(L->ctx, L->fam[i].atoms);
            tpk_free(L->ctx, L->fam[i].blk);
            tpk_free(L->ctx, L->fam[i].tblk);
        }
    tpk_free(L->ctx, L->atom);
    tpk_free(L->ctx, L->fam);
    tpk_free(L->ctx, L->fam_of_avar);
    tpk_free(L->ctx, L->fam_of_embed);
    tpk_free(L->ctx, L->atom_of_instr);
    tpk_free(L->ctx, L->rep);
    tpk_free(L->ctx, L->xb);
    tpk_free(L->ctx, L->scal);
    tpk_free(L->ctx, L->aff);
    tpk_free(L->ctx, L->gnode);
    tpk_free(L->ctx, L->last);
    tpk_free(L->ctx, L->def);
    tpk_free(L->ctx, L->var_next);
    tpk_free(L->ctx, L->free_var);
    tpk_free(L->ctx, L->free_fam);
    for (int r = 0; r <= GH_MAXDIM; r++)
        for (int h = 0; h < 2; h++) {
            tpk_free(L->ctx, L->gh[r][h].x);
            tpk_free(L->ctx, L->gh[r][h].w);
        }
    tpk_gauss_ws_free(L->gws);
    tpk_nsr_orthant_cache_free(L->ocache);
    tpk_nsr_joint_free(L->joint);
    for (int i = 0; i < L->nmm; i++)
        tpk_free(L->ctx, L->mm[i].E);
    tpk_free(L->ctx, L->mm);
    tpk_free(L->ctx, L->spare);
    tpk_free(L->ctx, L->tspare);
}

