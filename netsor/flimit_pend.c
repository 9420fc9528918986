/* Pending entrywise blocks of the rolled limit evaluator: a block whose second moments are an
 * entrywise function of other blocks (φ maps, sums of independent blocks, convolutions) stays a
 * node of a DAG, run by netsor/ewplan.c or netsor/ewpair.c where a reader needs its matrix
 * (ewplan-impl.h; docs/orchestration.md §7). */
#include "flimit-impl.h"
#include "tpk/alloc.h"

#include <math.h>
#include <string.h>

/* Block x's diagonal into out (N m): a pending block's own, a matrix's, a factor's row norms, or
 * the input Gram's; NULL-free. */
static int block_diag(fl *F, int x, double *out)
{
    fblock *b = &F->b[x];
    size_t n = F->N * (size_t)b->m;
    if (b->pend) {
        memcpy(out, b->pend->diag, n * sizeof *out);
        return TPK_OK;
    }
    if (b->M2 == NULL && b->Fac != NULL) {
        size_t r = (size_t)b->rank;
        for (size_t i = 0; i < n; i++) {
            double acc = 0;
            for (size_t q = 0; q < r; q++)
                acc += b->Fac[i * r + q] * b->Fac[i * r + q];
            out[i] = acc;
        }
        return TPK_OK;
    }
    if (b->M2 == NULL && b->input) { /* the input block: (1/d) x xᵀ */
        for (size_t i = 0; i < n; i++) {
            double acc = 0;
            for (size_t q = 0; q < F->d; q++)
                acc += F->x[i * F->d + q] * F->x[i * F->d + q];
            out[i] = acc / (double)F->d;
        }
        return TPK_OK;
    }
    const double *M = nsr_fl_block_made(F, x);
    if (M == NULL)
        return F->X.ctx->status ? F->X.ctx->status : TPK_ENOMEM;
    for (size_t i = 0; i < n; i++)
        out[i] = M[i * n + i];
    return TPK_OK;
}

/* Can block x be read by a pending node: a zero-mean Gaussian block of m members whose matrix
 * is there or can be made (not one whose matrix was given away)? */
int nsr_fl_ew_leafable(const fl *F, int x, long m)
{
    const fblock *b = &F->b[x];
    return b->kind == BK_GAUSS && b->mean == NULL && b->m == m &&
           (b->pend != NULL || b->M2 != NULL || b->Fac != NULL || b->input);
}

/* A block's name in plan reports: its family's, else "input" or "block". */
static const char *block_label(const fl *F, int x)
{
    const fblock *b = &F->b[x];
    if (b->input)
        return "input";
    if (b->fam >= 0 && b->fam < F->X.C->nsym)
        return F->X.C->sym[b->fam].name;
    return "block";
}

static void ew_name(nsr_ew_node *nd, const char *what, int line)
{
    snprintf(nd->name, sizeof nd->name, "%s@%d", what, line);
}

/* A new pending block's diagonal: nsr_ew_diag on the node with its arguments as leaves. */
static int pend_diag(fl *F, pend *P, size_t n)
{
    nsr_ew_node tmp[NSR_EW_MAXT + 1];
    double *d[NSR_EW_MAXT] = {NULL};
    int na = 0, st = TPK_OK;
    nsr_ew_node me = P->nd;
    if (me.op == NSR_EW_PHI || me.op == NSR_EW_CONV) {
        memset(&tmp[0], 0, sizeof tmp[0]);
        if ((d[0] = nsr_fam_alloc(&F->X, n, sizeof *d[0])) == NULL ||
            (st = block_diag(F, me.arg, d[0])) != TPK_OK)
            goto done;
        tmp[0].op = NSR_EW_LEAF;
        tmp[0].diag = d[0];
        me.arg = na++;
    } else {
        for (int t = 0; t < me.nt; t++) {
            if (me.t[t].arg < 0)
                continue;
            memset(&tmp[na], 0, sizeof tmp[na]);
            if ((d[na] = nsr_fam_alloc(&F->X, n, sizeof *d[na])) == NULL ||
                (st = block_diag(F, me.t[t].arg, d[na])) != TPK_OK)
                goto done;
            tmp[na].op = NSR_EW_LEAF;
            tmp[na].diag = d[na];
            me.t[t].arg = na++;
        }
    }
    tmp[na] = me;
    if ((P->diag = nsr_fam_alloc(&F->X, n, sizeof *P->diag)) == NULL)
        goto done;
    double e = 0;
    if (me.phi != NULL && (st = nsr_fl_ensure_ws_for(F, me.phi)) != TPK_OK)
        goto done;
    st = nsr_ew_diag(tmp, na, n, (long)(n / F->N), F->ws, F->X.R->file, P->diag, &e, F->X.ctx);
    F->err = fmax(F->err, e);
done:
    for (int i = 0; i < NSR_EW_MAXT; i++)
        tpk_free(F->X.ctx, d[i]);
    if (st == TPK_OK && F->X.ctx->status)
        st = F->X.ctx->status;
    return st;
}

/* Block k becomes pending as P (its diagonal made, its arguments pinned); P is k's or freed. */
int nsr_fl_pend_attach(fl *F, int k, pend *P)
{
    size_t n = F->N * (size_t)F->b[k].m;
    int st = pend_diag(F, P, n);
    if (st) {
        nsr_fl_pend_discard(F, P);
        return st;
    }
    if (P->nd.op == NSR_EW_PHI || P->nd.op == NSR_EW_CONV)
        F->b[P->nd.arg].pins++;
    for (int t = 0; P->nd.op == NSR_EW_SUM && t < P->nd.nt; t++)
        if (P->nd.t[t].arg >= 0)
            F->b[P->nd.t[t].arg].pins++;
    fblock *b = &F->b[k];
    b->pend = P;
    b->lower = 1;
    return TPK_OK;
}

pend *nsr_fl_pend_new(fl *F, int op, int line, int col)
{
    pend *P = nsr_fam_alloc(&F->X, 1, sizeof *P);
    if (P == NULL)
        return NULL;
    memset(P, 0, sizeof *P);
    P->nd.op = op;
    ew_name(&P->nd, op == NSR_EW_PHI ? "map" : op == NSR_EW_CONV ? "conv" : "sum", line);
    P->nd.line = line;
    P->nd.col = col;
    return P;
}

/* Is u a sum the entrywise programs take: identity gathers (per-index weights allowed) of
 * distinct zero-mean Gaussian blocks, or members of initial G-var families, independent two by
 * two, at least one Gaussian? */
static int is_pending_sum(fl *F, const val *u)
{
    size_t N = F->N, m = (size_t)u->m;
    if (F->dry || u->kind != V_LIN || u->nt < 1 || u->nt > NSR_EW_MAXT ||
        !nsr_fl_all_zero(u->mu, N * m))
        return 0;
    int gauss = 0;
    for (int i = 0; i < u->nt; i++) {
        const term *t = &u->t[i];
        const fblock *b = &F->b[t->blk];
        if (t->dense)
            return 0;
        if (b->kind == BK_BIAS) {
            /* initial G-var members: E[b_idx[p] b_idx[q]] = var where idx[p] = idx[q] (one
             * member read at several points: a CNN layer's bias at every position) */
            if (b->mean != NULL || b->s == NULL)
                return 0;
        } else if (nsr_fl_identity_gather(t, u->m) && nsr_fl_ew_leafable(F, t->blk, u->m)) {
            gauss++;
        } else {
            return 0;
        }
        for (int j = 0; j < i; j++) {
            const term *s = &u->t[j];
            if (s->blk == t->blk ||
                (!nsr_fl_terms_indep(F, t, u->m, s, u->m) && nsr_fl_correlated(b, &F->b[s->blk])))
                return 0;
        }
    }
    return gauss > 0;
}

/* u as a pending sum, where it is one: identity gathers (per-index weights allowed) of distinct
 * zero-mean Gaussian or bias blocks of u's members, independent two by two — so that entry
 * (a, c) of its second moments is Σ_t w_t,a w_t,c E[x_t,a x_t,c], no cross terms (theory
 * §1.6). 1: *out is P; 0: not of that form; −1: error. */
int nsr_fl_ew_sum_of(fl *F, const val *u, int line, int col, pend **out)
{
    *out = NULL;
    if (!is_pending_sum(F, u))
        return 0;
    size_t N = F->N, m = (size_t)u->m;
    pend *P = nsr_fl_pend_new(F, NSR_EW_SUM, line, col);
    if (P == NULL)
        return -1;
    P->nd.nt = u->nt;
    for (int i = 0; i < u->nt; i++) {
        const term *t = &u->t[i];
        nsr_ew_term *T = &P->nd.t[i];
        T->c = 1.0;
        if (t->w != NULL) {
            if ((P->w[i] = nsr_fam_alloc(&F->X, N * m, sizeof *P->w[i])) == NULL)
                break;
            memcpy(P->w[i], t->w, N * m * sizeof *P->w[i]);
            T->w = P->w[i];
        }
        if (F->b[t->blk].kind == BK_BIAS) {
            T->arg = -1;
            if ((P->s[i] = nsr_fam_alloc(&F->X, m, sizeof *P->s[i])) == NULL)
                break;
            int shared = 0;
            for (size_t p = 0; p < m; p++) {
                P->s[i][p] = t->idx[p] >= 0 ? F->b[t->blk].s[t->idx[p]] : 0.0;
                for (size_t q = 0; q < p && t->idx[p] >= 0 && !shared; q++)
                    shared = t->idx[q] == t->idx[p];
            }
            T->s = P->s[i];
            if (shared) {
                if ((P->cls[i] = nsr_fam_alloc(&F->X, m, sizeof *P->cls[i])) == NULL)
                    break;
                memcpy(P->cls[i], t->idx, m * sizeof *P->cls[i]);
                T->cls = P->cls[i];
            }
        } else {
            T->arg = t->blk;
        }
        nsr_fl_touch(F, t->blk);
    }
    if (F->X.ctx->status) {
        nsr_fl_pend_discard(F, P);
        return -1;
    }
    *out = P;
    return 1;
}

/* The number of arguments of pending block x and its t-th (a block id, or −1 for a bias). */
static int pend_nargs(const fl *F, int x)
{
    const pend *P = F->b[x].pend;
    return P == NULL ? 0 : P->nd.op == NSR_EW_SUM ? P->nd.nt : 1;
}

static int pend_arg(const fl *F, int x, int t)
{
    const pend *P = F->b[x].pend;
    return P->nd.op == NSR_EW_SUM ? P->nd.t[t].arg : P->nd.arg;
}

/* The blocks under pending block k (and k), arguments before their readers (a depth-first
 * post-order: block ids are not one, an atom is made before the argument of its map). */
static int ew_collect(fl *F, int k, int *ids, int *nn, int cap)
{
    char *state = nsr_fam_alloc(&F->X, (size_t)F->nb, 1); /* 0 new, 1 open, 2 done */
    int *stack = nsr_fam_alloc(&F->X, (size_t)F->nb, sizeof *stack);
    int *next = nsr_fam_alloc(&F->X, (size_t)F->nb, sizeof *next);
    int st = TPK_OK, top = 0;
    *nn = 0;
    if (state == NULL || stack == NULL || next == NULL) {
        st = F->X.ctx->status;
        goto done;
    }
    memset(state, 0, (size_t)F->nb);
    stack[top++] = k;
    state[k] = 1;
    next[k] = 0;
    while (top > 0 && st == TPK_OK) {
        int x = stack[top - 1];
        if (next[x] < pend_nargs(F, x)) {
            int y = pend_arg(F, x, next[x]++);
            if (y >= 0 && state[y] == 0) {
                state[y] = 1;
                next[y] = 0;
                stack[top++] = y;
            }
            continue;
        }
        top--;
        state[x] = 2;
        if (*nn == cap)
            st = TPK_ERROR(F->X.ctx, TPK_ENOMEM, "internal: entrywise program too large");
        else
            ids[(*nn)++] = x;
    }
done:
    tpk_free(F->X.ctx, next);
    tpk_free(F->X.ctx, stack);
    tpk_free(F->X.ctx, state);
    return st;
}

/* Is the entrywise program under pending block k a pair program (a convolution in it)? 0 also
 * on failure (with the status in the context). */
int nsr_fl_ew_pairwise(fl *F, int k)
{
    int cap = F->nb + 1, nn = 0, pairs = 0;
    int *ids = nsr_fam_alloc(&F->X, (size_t)cap, sizeof *ids);
    if (ids != NULL && ew_collect(F, k, ids, &nn, cap) == TPK_OK)
        for (int i = 0; i < nn; i++)
            pairs |= F->b[ids[i]].pend != NULL && F->b[ids[i]].pend->nd.op == NSR_EW_CONV;
    tpk_free(F->X.ctx, ids);
    return pairs;
}

/* The entrywise program under a pending block k, as netsor/ewplan.c and netsor/ewpair.c take it:
 * its nodes in order (arguments before their readers), each a pending block's node or a leaf (a
 * block's matrix, or the inputs themselves in a pair program), and the readout's node last
 * where there is one. */
typedef struct ew_dag {
    int cap, nn;        /* nodes (room for every block and a readout) */
    int *ids;           /* the block of each node */
    int *at;            /* block → its node */
    nsr_ew_node *nd;
    double **leaf_diag; /* the leaves' diagonals (ours) */
    double *dphi;       /* the readout node's diagonal (ours) */
    double beta;        /* the readout's constant (a bias term of the readout node reads it) */
    int pairs;          /* a convolution in it: a pair program (netsor/ewpair.c) */
    int root;
} ew_dag;

static void ew_dag_free(fl *F, ew_dag *G)
{
    for (int i = 0; G->leaf_diag && i < G->cap; i++)
        tpk_free(F->X.ctx, G->leaf_diag[i]);
    tpk_free(F->X.ctx, G->leaf_diag);
    tpk_free(F->X.ctx, G->nd);
    tpk_free(F->X.ctx, G->at);
    tpk_free(F->X.ctx, G->ids);
    tpk_free(F->X.ctx, G->dphi);
}

/* Node i as leaf block x: its matrix (made now where it is not there), or in a pair program the
 * inputs' Gram per pair (a rank-d product of the pair's rows: few channels, RGB or grey) rather
 * than the (N m)² matrix first; its diagonal read from it. */
static int ew_leaf(fl *F, ew_dag *G, int i, int x, size_t n)
{
    nsr_ew_node *nd = G->nd;
    memset(&nd[i], 0, sizeof nd[i]);
    nd[i].op = NSR_EW_LEAF;
    ew_name(&nd[i], block_label(F, x), F->b[x].line);
    if (G->pairs && F->b[x].input && F->b[x].M2 == NULL && F->d <= 8) {
        nd[i].x = F->x;
        nd[i].d = F->d;
    } else if ((nd[i].M = nsr_fl_block_made(F, x)) == NULL) {
        return F->X.ctx->status ? F->X.ctx->status : TPK_ENOMEM;
    }
    if ((G->leaf_diag[i] = nsr_fam_alloc(&F->X, n, sizeof *G->leaf_diag[i])) == NULL)
        return F->X.ctx->status;
    nsr_ew_diag(nd, i, n, F->b[x].m, NULL, NULL, G->leaf_diag[i], NULL, F->X.ctx);
    nd[i].diag = G->leaf_diag[i];
    return TPK_OK;
}

/* The program under pending block k (n = N m): its blocks collected, pending ones as their nodes
 * (arguments renumbered), the rest as leaves. */
static int ew_dag_build(fl *F, int k, size_t n, ew_dag *G)
{
    memset(G, 0, sizeof *G);
    G->cap = F->nb + 1;
    G->ids = nsr_fam_alloc(&F->X, (size_t)G->cap, sizeof *G->ids);
    G->at = nsr_fam_alloc(&F->X, (size_t)F->nb, sizeof *G->at);
    G->nd = nsr_fam_alloc(&F->X, (size_t)G->cap, sizeof *G->nd);
    G->leaf_diag = nsr_fam_alloc(&F->X, (size_t)G->cap, sizeof *G->leaf_diag);
    if (G->ids == NULL || G->at == NULL || G->nd == NULL || G->leaf_diag == NULL)
        return F->X.ctx->status;
    memset(G->leaf_diag, 0, (size_t)G->cap * sizeof *G->leaf_diag);
    int st = ew_collect(F, k, G->ids, &G->nn, G->cap);
    if (st != TPK_OK)
        return st;
    for (int i = 0; i < G->nn; i++)
        G->pairs |= F->b[G->ids[i]].pend != NULL && F->b[G->ids[i]].pend->nd.op == NSR_EW_CONV;
    nsr_ew_node *nd = G->nd;
    for (int i = 0; i < G->nn && st == TPK_OK; i++) {
        int x = G->ids[i];
        G->at[x] = i;
        const pend *P = F->b[x].pend;
        if (P == NULL) {
            st = ew_leaf(F, G, i, x, n);
            continue;
        }
        nd[i] = P->nd;
        nd[i].diag = P->diag;
        if (nd[i].op == NSR_EW_PHI || nd[i].op == NSR_EW_CONV)
            nd[i].arg = G->at[nd[i].arg];
        for (int t = 0; nd[i].op == NSR_EW_SUM && t < nd[i].nt; t++)
            if (nd[i].t[t].arg >= 0)
                nd[i].t[t].arg = G->at[nd[i].t[t].arg];
    }
    G->root = G->nn - 1;
    return st;
}

/* A pooled readout of a pair program, input pair by input pair, into *ro->out. */
static int ew_pooled(fl *F, int k, size_t n, const ew_readout *ro, ew_dag *G)
{
    const nsr_ew_reduce red = {ro->phi, ro->alpha, ro->beta, ro->pool};
    double e = 0;
    int st = TPK_OK;
    if (!G->pairs)
        st = TPK_ERROR(F->X.ctx, TPK_EINVAL, "internal: a pooled readout of a program that is "
                       "not by input pairs");
    if (st == TPK_OK && ro->phi != NULL)
        st = nsr_fl_ensure_ws_for(F, ro->phi);
    for (int i = 0; st == TPK_OK && i < G->nn; i++)
        if (G->nd[i].phi != NULL)
            st = nsr_fl_ensure_ws_for(F, G->nd[i].phi);
    if (st == TPK_OK)
        st = nsr_ew_eval_pairs(G->nd, G->nn, G->root, n, F->b[k].m, F->ws, F->X.R->file,
                               F->plan_report, *ro->out, 1, &red, &e, NULL, F->X.ctx);
    if (st == TPK_OK)
        F->err = fmax(F->err, e);
    return st;
}

/* The readout as the program's last node: a map over k, or a scaled k (with a constant β for
 * m = 1, the caller's: a bias term is a constant); its failures are the output statement's. */
static int ew_readout_node(fl *F, int k, size_t n, const ew_readout *ro, ew_dag *G)
{
    nsr_ew_node *r = &G->nd[G->nn];
    memset(r, 0, sizeof *r);
    if (ro->phi != NULL) {
        r->op = NSR_EW_PHI;
        r->arg = G->root;
        r->phi = ro->phi;
        r->alpha = ro->alpha;
        r->beta = ro->beta;
    } else {
        r->op = NSR_EW_SUM;
        r->nt = 1;
        r->t[0] = (nsr_ew_term){.arg = G->root, .c = ro->alpha, .w = ro->w};
        if (G->beta != 0.0)
            r->t[r->nt++] = (nsr_ew_term){.arg = -1, .c = 1.0, .s = &G->beta};
    }
    ew_name(r, "readout", nsr_fl_cur_line(F));
    r->line = nsr_fl_cur_line(F);
    r->col = nsr_fl_cur_col(F);
    G->root = G->nn++;
    int st = TPK_OK;
    if ((G->dphi = nsr_fam_alloc(&F->X, n, sizeof *G->dphi)) == NULL ||
        (st = nsr_ew_diag(G->nd, G->root, n, F->b[k].m, F->ws, F->X.R->file, G->dphi, NULL,
                          F->X.ctx)) != TPK_OK)
        st = F->X.ctx->status ? F->X.ctx->status : TPK_ENOMEM;
    G->nd[G->root].diag = G->dphi;
    return st;
}

/* A leaf whose matrix the result may go over, as nothing reads it afterwards (each kernel reads
 * an entry before it writes it): no fresh block, whose first touch costs more than the maps (a
 * CNN layer's block is (N·784)²). Such a leaf: any, at the readout at the end; else one the plan
 * has freed already whose pending readers are all k (made now) or moot — freed by the plan too,
 * with only k or moot blocks reading them: nothing reads through them again (a transformer
 * layer's attention output, under LayerNorm, residual and feed-forward). −1: none. */
static int ew_donor(fl *F, int k, const ew_readout *ro, const ew_dag *G)
{
    int donor = -1;
    const int at_end = ro != NULL && F->X.cur == F->X.R->nfi && F->final_out != NULL;
    const int ndag = ro != NULL ? G->nn - 1 : G->nn;
    int *refs = nsr_fam_alloc(&F->X, (size_t)ndag, sizeof *refs);
    if (refs != NULL && ro == NULL) {
        memset(refs, 0, (size_t)ndag * sizeof *refs);
        for (int i = ndag - 1; i >= 0; i--) { /* readers before their arguments */
            const int x = G->ids[i];
            const fblock *b = &F->b[x];
            int gone = i == ndag - 1 || (b->pend != NULL && b->dead && b->pins == refs[i]);
            for (int a = 0; gone && a < pend_nargs(F, x); a++)
                if (pend_arg(F, x, a) >= 0)
                    refs[G->at[pend_arg(F, x, a)]]++;
        }
    }
    for (int i = 0; i < ndag && donor < 0; i++) {
        if (G->nd[i].op != NSR_EW_LEAF)
            continue;
        const fblock *x = &F->b[G->ids[i]];
        if (G->nd[i].M == NULL || x->M2 != G->nd[i].M || x->m != F->b[k].m)
            continue;
        if (at_end || (refs != NULL && ro == NULL && x->dead && x->pins == refs[i]))
            donor = G->ids[i];
    }
    tpk_free(F->X.ctx, refs);
    return donor;
}

/* netsor plan --verify: every candidate kernel checked exactly (a Z_p twin) before the run. */
static int ew_verify(fl *F, int k, size_t n, const ew_dag *G)
{
    nsr_ew_verified v;
    int st = nsr_ew_verify(G->nd, G->nn, G->root, n, F->b[k].m, 1, 0, &v, F->X.ctx);
    if (st == TPK_OK && v.mismatch)
        st = TPK_ERROR(F->X.ctx, TPK_ENUMERIC, "%s: internal: the executor's kernel for %s "
                       "differs from its reference at entry (%zu, %zu) in the Z_p check",
                       F->X.R->file, v.what, v.row, v.col);
    if (st == TPK_OK && F->plan_report)
        fprintf(F->plan_report, "exact check of %s (Z_p twin): %d kernel runs of every "
                "candidate, all equal to the reference\n", G->nd[G->root].name, v.kernels);
    return st;
}

/* Run the entrywise program under pending block k (ewplan-impl.h): with ro NULL, k's matrix (k
 * is no longer pending); else ro's readout of k into *ro->out, k left pending — where *ro->out
 * was a block of the caller's allocator that may be replaced (freed) by a leaf's. full: both
 * triangles (else the lower one). */
int nsr_fl_ew_flush(fl *F, int k, const ew_readout *ro, int full)
{
    size_t n = F->N * (size_t)F->b[k].m;
    ew_dag G;
    int st = ew_dag_build(F, k, n, &G);
    G.beta = ro ? ro->beta : 0.0;
    if (st == TPK_OK && ro != NULL && ro->pool != NULL) { /* pooled: by input pairs */
        st = ew_pooled(F, k, n, ro, &G);
        ew_dag_free(F, &G);
        return st;
    }
    if (st == TPK_OK && ro != NULL)
        st = ew_readout_node(F, k, n, ro, &G);
    double *M = NULL;
    int donor = st == TPK_OK ? ew_donor(F, k, ro, &G) : -1;
    if (st == TPK_OK && ro == NULL && donor < 0 && (M = nsr_fl_big(F, n * n, sizeof *M, 0)) == NULL)
        st = F->X.ctx->status;
    for (int i = 0; st == TPK_OK && i < G.nn; i++)
        if (G.nd[i].phi != NULL)
            st = nsr_fl_ensure_ws_for(F, G.nd[i].phi);
    double e = 0;
    if (st == TPK_OK && F->plan_verify && !G.pairs) /* every candidate exactly, first */
        st = ew_verify(F, k, n, &G);
    if (st == TPK_OK)
        st = nsr_ew_eval(G.nd, G.nn, G.root, n, F->b[k].m,
                         F->plan_kind | (F->plan_signatures ? NSR_PLAN_SIGNATURES : 0) |
                             (F->plan_signatures > 1 ? NSR_PLAN_CANDIDATES : 0),
                         F->ws, &F->cal, F->X.R->file, F->plan_report,
                         donor >= 0 ? F->b[donor].M2 : ro ? *ro->out : M, donor < 0, full, &e,
                         NULL, F->X.ctx);
    tpk_free(F->X.ctx, G.dphi);
    G.dphi = NULL;
    if (st == TPK_OK && donor >= 0) { /* the result is the leaf's matrix now */
        if (ro != NULL) {
            tpk_free(F->X.ctx, *ro->out);
            *ro->out = F->b[donor].M2;
        } else {
            M = F->b[donor].M2;
        }
        F->b[donor].M2 = NULL;
    }
    if (st == TPK_OK) {
        F->err = fmax(F->err, e);
        if (ro == NULL) {
            fblock *b = &F->b[k];
            pend *P = b->pend;
            b->pend = NULL;
            b->M2 = M;
            b->lower = !full;
            M = NULL;
            nsr_fl_pend_free(F, P);
        }
    }
    if (M != NULL)
        nsr_fl_release(F, M, n * n * sizeof *M);
    ew_dag_free(F, &G);
    return st;
}
