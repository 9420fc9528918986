/* A value becomes a Gaussian block in the rolled limit evaluator: a low-rank factor, a pending
 * sum, a triangular map or a sum run in a dying block's matrix, or its second moments. */
#include "flimit-impl.h"
#include "tpk/alloc.h"
#include "tpk/matmul.h"

#include <string.h>

/* u = L·x for block x dying here, L lower triangular per input (causal attention's (I + A)·k, one
 * dense term): the two triangular products of nsr_fl_tri_sandwich run in x's own matrix, which
 * becomes the result's (lower triangle); no zeroed block, no copy, no add. 1 when done (*M2
 * set), 0 when u is not of that form, −1 on error. */
static int tri_in_place(fl *F, const val *u, double **M2)
{
    *M2 = NULL;
    if (u->nt != 1 || !u->t[0].dense || !nsr_fl_all_zero(u->mu, F->N * (size_t)u->m))
        return 0;
    int x = u->t[0].blk;
    const fblock *bx = &F->b[x];
    size_t N = F->N, m = (size_t)u->m, n = N * m;
    if (bx->kind != BK_GAUSS || bx->M2 == NULL || bx->pins > 0 || bx->mean != NULL ||
        (size_t)bx->m != m || !nsr_fl_plan_get(F, 1) || x >= F->nplan || F->plan[x] != F->X.cur)
        return 0;
    const double *W = u->t[0].w; /* N × m × m */
    for (size_t a = 0; a < N; a++)
        for (size_t p = 0; p < m; p++)
            for (size_t q = p + 1; q < m; q++)
                if (W[(a * m + p) * m + q] != 0)
                    return 0;
    /* the products read the lower block triangle and both triangles of the diagonal blocks:
     * a block stored lower-only has those mirrored, not the whole matrix */
    double *P = (double *)nsr_fl_block_m2(F, x);
    if (P == NULL)
        return -1;
    if (F->b[x].lower)
        nsr_fl_mirror_diagonal_blocks(P, N, m);
    nsr_fl_touch(F, x);
    /* blocks (a, c ≤ a) ← L_a P_ac L_cᵀ: each row slab of them times L_a, then each column
     * slab (rows from c's own down) times L_cᵀ — 2N tall products, not N²/2 of m × m */
    for (size_t a = 0; a < N; a++)
        if (tpk_dtrmm(TPK_LEFT, TPK_LOWER, TPK_NO_TRANS, m, (a + 1) * m, 1.0, W + a * m * m, m,
                      P + a * m * n, n, F->X.ctx))
            return -1;
    for (size_t c = 0; c < N; c++)
        if (tpk_dtrmm(TPK_RIGHT, TPK_LOWER, TPK_TRANS, n - c * m, m, 1.0, W + c * m * m, m,
                      P + c * m * n + c * m, n, F->X.ctx))
            return -1;
    F->b[x].M2 = NULL; /* now the result's */
    *M2 = P;
    return 1;
}

/* u's first term, the identity on a Gaussian block x that dies here, lends x's matrix: g = (conv
 * atom) + b adds b in place instead of copying the atom — where the value is the statement's own
 * (fam >= 0) or the statement reads its blocks once (φ(g) twice in one statement materialises g
 * twice, and the second needs the atom the first took), and no other term reads x. */
static int lends_matrix(fl *F, const val *u, int fam)
{
    int x = u->t[0].blk;
    const fblock *bx = &F->b[x];
    if (!(nsr_fl_plan_get(F, 1) && x < F->nplan && F->plan[x] == F->X.cur &&
          bx->kind == BK_GAUSS && (fam >= 0 || nsr_fl_stmt_reads_once(F)) && !bx->input &&
          bx->M2 && bx->pins == 0 && bx->mean == NULL && bx->m == u->m &&
          nsr_fl_identity_gather(&u->t[0], u->m)))
        return 0;
    for (int i = 1; i < u->nt; i++)
        if (u->t[i].blk == x || nsr_fl_term_correlated(F, bx, &u->t[i], u->m))
            return 0;
    return 1;
}

/* u's second moments over its first term's matrix (lends_matrix), which *M2 takes: scaled by the
 * term's weights in place (LN's 1/√(v + ε): M2_pq ← w_p w_q M2_pq), plus the other terms'. */
static int m2_over_first(fl *F, const val *u, size_t n, double **M2)
{
    int x = u->t[0].blk;
    double *M = F->b[x].M2;
    F->b[x].M2 = NULL;
    *M2 = M;
    const double *w = u->t[0].w;
    if (w != NULL) {
#pragma omp parallel for schedule(dynamic, 64) if (n >= 512)
        for (size_t r = 0; r < n; r++)
            for (size_t c = 0; c <= r; c++)
                M[r * n + c] *= w[r] * w[c];
    }
    val rest = *u;
    rest.t = u->t + 1;
    rest.nt = u->nt - 1;
    return nsr_fl_lin_m2(F, &rest, &rest, M, n, 1, 1.0);
}

/* Block k holds u's moments (the run): a low-rank factor where u keeps one, a pending sum of
 * independent blocks (LayerNorm's w·g, g + W·φ + b), else its second moments — made in a dying
 * block's matrix (triangular map, or lent by the first term) or a fresh one — and its means
 * (exactly zero means are none: LN's g − m). */
static int materialize_run(fl *F, val *u, int fam, int k)
{
    size_t n = F->N * (size_t)u->m;
    double *G = NULL;
    long rank = 0;
    int has_factor = nsr_fl_factor_of(F, u, 1.0, &G, &rank);
    if (has_factor < 0)
        return F->X.ctx->status;
    if (has_factor > 0) { /* stays low rank: its matrix is made only if a reader needs it */
        F->b[k].Fac = G;
        F->b[k].rank = rank;
        return TPK_OK;
    }
    pend *P = NULL;
    int is_sum = nsr_fl_ew_sum_of(F, u, nsr_fl_cur_line(F), nsr_fl_cur_col(F), &P);
    if (is_sum < 0 || (is_sum > 0 && nsr_fl_pend_attach(F, k, P)))
        return F->X.ctx->status;
    if (is_sum > 0)
        return TPK_OK;
    int lent = lends_matrix(F, u, fam);
    double *M2 = NULL, *mean = nsr_fam_alloc(&F->X, n, sizeof *mean);
    int has_mean = 0, st = mean == NULL ? F->X.ctx->status : TPK_OK;
    int in_place = st == TPK_OK && !lent ? tri_in_place(F, u, &M2) : 0;
    if (in_place < 0)
        st = F->X.ctx->status ? F->X.ctx->status : TPK_ENOMEM;
    if (in_place != 0) {
        /* done (or failed) in place */
    } else if (st == TPK_OK && lent) {
        st = m2_over_first(F, u, n, &M2);
    } else if (st == TPK_OK) {
        if ((M2 = nsr_fl_big(F, n * n, sizeof *M2, 1)) == NULL)
            st = F->X.ctx->status;
        else
            st = nsr_fl_lin_m2(F, u, u, M2, n, 1, 1.0);
    }
    if (st == TPK_OK)
        st = nsr_fl_lin_mean(F, u, mean, &has_mean);
    if (st == TPK_OK && has_mean)
        has_mean = !nsr_fl_all_zero(mean, n);
    if (st) {
        tpk_free(F->X.ctx, M2), tpk_free(F->X.ctx, mean);
        return F->X.ctx->status;
    }
    fblock *b = &F->b[k];
    b->M2 = M2;
    b->lower = 1;
    if (has_mean) {
        b->mean = mean;
    } else {
        tpk_free(F->X.ctx, mean);
    }
    return TPK_OK;
}

/* A new Gaussian block *out holding the LIN value u (its second and first moments), of family
 * fam (−1: a temporary, as φ's argument); in the plan, u's terms walked without numbers (it
 * touches their blocks, checks support). */
int nsr_fl_materialize(fl *F, val *u, int fam, int *out)
{
    for (int k = 0; k < u->nt; k++) {
        int kind = F->b[u->t[k].blk].kind;
        if (kind == BK_NONLIN)
            return NSR_UNSUP(&F->X, NULL, "a function of an H-var that is not Gaussian (a Nonlin "
                             "of a Nonlin): write the composition as one function");
    }
    if (nsr_fl_val_merge(F, u))
        return F->X.ctx->status;
    int k = nsr_fl_new_block(F, BK_GAUSS, fam, u->m);
    if (k < 0)
        return F->X.ctx->status;
    fblock *b = &F->b[k];
    b->nanc = 0;
    b->line = nsr_fl_cur_line(F);
    for (int i = 0; i < u->nt; i++)
        nsr_fl_anc_union_term(F, &F->b[k], &u->t[i], u->m);
    if (F->dry)
        nsr_fl_lin_m2(F, u, u, NULL, 0, 1, 1.0);
    else if (materialize_run(F, u, fam, k))
        return F->X.ctx->status;
    *out = k;
    return F->X.ctx->status;
}

/* Block k (BK_MIX) in place as a Gaussian block (its number is kept: the plan's liveness is per
 * block); left as it is when a term is not Gaussian (a φ block: E[φ·g] is read term by term). */
int nsr_fl_mix_to_gauss(fl *F, int k)
{
    const val *u = &F->b[k].mix;
    for (int i = 0; i < u->nt; i++) {
        int kind = F->b[u->t[i].blk].kind;
        if (kind != BK_GAUSS && kind != BK_BIAS)
            return TPK_OK;
    }
    size_t n = F->N * (size_t)F->b[k].m;
    pend *P = NULL; /* independent terms: a pending sum, no matrix yet */
    int is_sum = nsr_fl_ew_sum_of(F, u, F->b[k].line, F->b[k].col, &P);
    if (is_sum < 0)
        return F->X.ctx->status;
    if (is_sum > 0) {
        fblock *b = &F->b[k];
        nsr_fl_val_free(F, &b->mix);
        b->kind = BK_GAUSS;
        b->mean = NULL;
        return nsr_fl_pend_attach(F, k, P);
    }
    double *M2 = NULL, *mean = NULL;
    int has_mean = 0, st;
    if (F->dry) {
        st = nsr_fl_lin_m2(F, u, u, NULL, 0, 1, 1.0); /* touches the terms, checks support */
    } else if ((M2 = nsr_fl_big(F, n * n, sizeof *M2, 1)) == NULL ||
               (mean = nsr_fam_alloc(&F->X, n, sizeof *mean)) == NULL) {
        st = F->X.ctx->status;
    } else if ((st = nsr_fl_lin_m2(F, u, u, M2, n, 1, 1.0)) == TPK_OK &&
               (st = nsr_fl_lin_mean(F, u, mean, &has_mean)) == TPK_OK && has_mean) {
        has_mean = !nsr_fl_all_zero(mean, n); /* exactly zero means are no means (LN's g − m) */
    }
    fblock *b = &F->b[k];
    if (st) {
        nsr_fl_release(F, M2, n * n * sizeof *M2);
        tpk_free(F->X.ctx, mean);
        return st;
    }
    if (!has_mean) {
        tpk_free(F->X.ctx, mean);
        mean = NULL;
    }
    nsr_fl_val_free(F, &b->mix);
    b->kind = BK_GAUSS;
    b->M2 = M2;
    b->mean = mean;
    b->lower = 1;
    return TPK_OK;
}
