/* MatMul lowering of the rolled limit evaluator: each MatMul, or sum of MatMuls by distinct
 * A-vars (convolution taps), is a new atom with σ²·E[u uᵀ] of its source (theory §1.6, §2.8),
 * made by the first strategy of a table that takes it. */
#include "flimit-impl.h"
#include "tpk/alloc.h"
#include "tpk/cnn.h"
#include "tpk/matmul.h"

#include <math.h>
#include <string.h>

/* alpha·E[u uᵀ] into M2 (lower triangle); in the plan, the walk over the terms alone. */
static int lin_m2_acc(fl *F, val *u, double var, size_t n, double *M2)
{
    return nsr_fl_lin_m2(F, u, u, F->dry ? NULL : M2, F->dry ? 0 : n, 1, var);
}

/* The A-var of a MatMul am over D: one that changes with the family's index (untied weights per
 * member) or is multiplied in more than one place (tied) is refused; its σ² in *var. The site
 * that multiplies it is marked. */
int nsr_fl_matmul_weight(fl *F, const nsr_expr *am, const nsr_fdom *D, double *var)
{
    if (nsr_reads_syms(am, D->sym, D->nv, 0))
        return NSR_UNSUP(&F->X, am, "an A-var that changes with the family's index (%s): untied "
                         "weights per member", am->name);
    int di = -1;
    if (nsr_fam_member(&F->X, am->sym, am, &di))
        return F->X.ctx->status;
    if (F->avar_site[di] >= 0)
        return NSR_UNSUP(&F->X, am, "%s is multiplied in more than one place (weight tying, e.g. a "
                     "recurrence); the rolled evaluator keeps every MatMul's A-var its own",
                     am->name);
    F->avar_site[di] = (int)F->nsites;
    *var = F->X.R->dm[di].var;
    return TPK_OK;
}

/* ---- the atom ----------------------------------------------------------------------------- */

/* A new atom of m members made at line: its block (a root of its own) and, in the run, its
 * (N m)² matrix, uninitialised — the lowering writes or zeroes every lower-triangle entry. */
int nsr_fl_atom_new(fl *F, long m, int line, nsr_fl_atom *A)
{
    memset(A, 0, sizeof *A);
    A->m = m;
    if ((A->k = nsr_fl_new_block(F, BK_GAUSS, -1, m)) < 0)
        return F->X.ctx->status;
    nsr_fl_anc_root(&F->b[A->k], A->k);
    F->b[A->k].line = line;
    if (!F->dry) {
        size_t n = F->N * (size_t)m;
        if ((A->M2 = nsr_fl_big(F, n * n, sizeof *A->M2, 0)) == NULL)
            return F->X.ctx->status;
    }
    return TPK_OK;
}

/* *out reads every member of block k in order. */
static int atom_value(fl *F, int k, val *out, long m)
{
    int *idx = nsr_fam_alloc(&F->X, (size_t)m, sizeof *idx);
    if (idx == NULL)
        return F->X.ctx->status;
    for (long p = 0; p < m; p++)
        idx[p] = (int)p;
    return nsr_fl_val_gather(F, out, m, k, idx);
}

/* The atom's block takes what its lowering made (st: the lowering's status; on failure its
 * matrices go): a pending node (its own matrix, never touched, goes back to the pool), a dying
 * block's matrix written in place (likewise), a low-rank factor, or its own matrix. */
int nsr_fl_atom_finish(fl *F, nsr_fl_atom *A, int st, val *out)
{
    size_t n = F->N * (size_t)A->m, bytes = n * n * sizeof *A->M2;
    double *M2 = A->M2;
    if (st == TPK_OK && A->pend != NULL) {
        nsr_fl_release(F, M2, bytes);
        if (nsr_fl_pend_attach(F, A->k, A->pend))
            return F->X.ctx->status;
        M2 = NULL;
    } else {
        if (A->taken != NULL) {
            nsr_fl_release(F, M2, bytes);
            M2 = A->taken;
        }
        if (st) {
            tpk_free(F->X.ctx, M2);
            return st;
        }
        if (A->fac != NULL) { /* low rank: the block keeps the factor */
            nsr_fl_release(F, M2, bytes);
            M2 = NULL;
            F->b[A->k].Fac = A->fac;
            F->b[A->k].rank = A->rank;
        }
    }
    F->b[A->k].M2 = M2;
    F->b[A->k].lower = 1;
    return atom_value(F, A->k, out, A->m);
}

/* ---- one MatMul ----------------------------------------------------------------------------- */

/* u = coef · (the source's value, consumed) as a MatMul term: 1 (u LIN, its terms on one block
 * merged), 0 (the zero vector: nothing to add), or an error (a constant vector is refused). */
static int matmul_term(fl *F, const nsr_expr *src, val *coef, val *src_val, val *u)
{
    *u = *src_val;
    memset(src_val, 0, sizeof *src_val);
    if (u->kind != V_LIN) {
        int zero = u->kind == V_CONST && u->c == 0;
        nsr_fl_val_free(F, u);
        if (zero || (coef && coef->kind == V_CONST && coef->c == 0))
            return 0;
        return NSR_UNSUP(&F->X, src, "MatMul of a constant vector");
    }
    if ((coef && nsr_fl_val_scale(F, u, coef)) || nsr_fl_val_merge(F, u)) {
        nsr_fl_val_free(F, u);
        return F->X.ctx->status;
    }
    return 1;
}

/* One MatMul being lowered: A·src over D, its term u (owned) and its atom. */
typedef struct mm_job {
    const nsr_expr *am, *src;
    const nsr_fdom *D;
    double var;
    val u;
    nsr_fl_atom *A;
} mm_job;

/* u is one block read in order, unweighted, with no constant part (its block: *x). */
static int lone_block(const val *u, int *x)
{
    if (u->nt != 1 || u->mu != NULL || !nsr_fl_identity_term(&u->t[0], u->m))
        return 0;
    *x = u->t[0].blk;
    return 1;
}

/* U·x[t] over every slot in order (an embedding): the Gram (σ²/d) x xᵀ is the atom. */
static int embedding(fl *F, const mm_job *J)
{
    int x;
    return !F->dry && lone_block(&J->u, &x) && F->b[x].input && F->b[x].M2 == NULL &&
           (size_t)J->u.m == F->T;
}

static int embed_factor_applicable(fl *F, const mm_job *J)
{
    return embedding(F, J) && F->d * FAC_RATIO <= F->N * F->T;
}

/* rank d: the factor √(σ²/d)·x, no Gram (theory §2.7) */
static int embed_factor_apply(fl *F, mm_job *J)
{
    size_t n = F->N * F->T;
    nsr_fl_touch(F, J->u.t[0].blk);
    if ((J->A->fac = nsr_fam_alloc(&F->X, n * F->d, sizeof *J->A->fac)) == NULL)
        return F->X.ctx->status;
    double c = sqrt(J->var / (double)F->d);
    for (size_t i = 0; i < n * F->d; i++)
        J->A->fac[i] = c * F->x[i];
    J->A->rank = (long)F->d;
    return TPK_OK;
}

/* the Gram straight into the atom, lower triangle (the atom is stored lower) */
static int embed_gram_apply(fl *F, mm_job *J)
{
    size_t n = F->N * F->T;
    nsr_fl_touch(F, J->u.t[0].blk);
    return tpk_dsyrk_lower(TPK_NO_TRANS, n, F->d, J->var / (double)F->d, F->x, F->d, 0.0,
                           J->A->M2, n, F->X.ctx);
}

/* A·φ(g), g a zero-mean Gaussian block: the atom is pending, σ²·V_φ(g), and its matrix is made
 * where a reader needs one — with the maps and sums around it, by the plan of nsr_fl_ew_flush
 * (docs/orchestration.md §7). */
static int pending_map_applicable(fl *F, const mm_job *J)
{
    int x;
    return !F->dry && lone_block(&J->u, &x) && F->b[x].kind == BK_NONLIN && F->b[x].M2 == NULL &&
           F->b[x].m == J->D->m && nsr_fl_ew_leafable(F, F->b[x].arg, J->D->m);
}

static int pending_map_apply(fl *F, mm_job *J)
{
    int x = J->u.t[0].blk, g = F->b[x].arg;
    pend *P = nsr_fl_pend_new(F, NSR_EW_PHI, F->b[x].line, J->am->col);
    if (P == NULL)
        return F->X.ctx->status;
    P->nd.arg = g;
    P->nd.phi = F->b[x].phi;
    P->nd.alpha = J->var;
    nsr_fl_touch(F, x);
    nsr_fl_touch(F, g);
    J->A->pend = P;
    return TPK_OK;
}

/* A·φ(g) where the φ block dies here: its map goes straight into the atom, scaled by σ², instead
 * of being stored and then copied — one pass over the block per layer, as in the direct
 * recursion's fused map (tpk_gauss_map_affine). The test makes g's matrix (a pending g runs its
 * program) and φ's workspace. */
static int fused_map_applicable(fl *F, const mm_job *J)
{
    int x;
    if (F->dry || !lone_block(&J->u, &x))
        return 0;
    const fblock *bx = &F->b[x];
    return bx->kind == BK_NONLIN && bx->M2 == NULL && nsr_fl_plan_get(F, 1) && x < F->nplan &&
           F->plan[x] == F->X.cur && F->b[bx->arg].mean == NULL &&
           nsr_fl_block_m2(F, bx->arg) != NULL && nsr_fl_ensure_ws_for(F, bx->phi) == TPK_OK;
}

static int fused_map_apply(fl *F, mm_job *J)
{
    int x = J->u.t[0].blk;
    const fblock *bx = &F->b[x];
    double e = 0;
    size_t n = F->N * (size_t)J->D->m;
    nsr_fl_touch(F, x);
    nsr_fl_touch(F, bx->arg);
    /* and where g dies here too (a layer of a deep network), the map runs in place and the atom
     * takes g's matrix: no fresh block, whose first touch (page faults and the kernel's zeroing)
     * cost more than the map (MLP N = 2048: 56 % of the run) */
    const double *S = F->b[bx->arg].M2;
    double *dst = nsr_fl_defined_names(F, J->src) == 1
                      ? nsr_fl_take_matrix(F, bx->arg, J->D->m) : NULL;
    if (dst != NULL)
        J->A->taken = dst;
    else
        dst = J->A->M2;
    int st = tpk_gauss_map_affine_lower(bx->phi, S, n, J->var, 0.0, dst, F->ws, &e, F->X.ctx);
    F->err = fmax(F->err, e);
    return st;
}

static int always(fl *F, const mm_job *J)
{
    (void)F, (void)J;
    return 1;
}

/* A·(C·X) of a factor block: σ·C·Fac, still low rank (declined where u is not one term on a
 * factor block). */
static int factor_chain_apply(fl *F, mm_job *J)
{
    int has_factor = nsr_fl_factor_of(F, &J->u, sqrt(J->var), &J->A->fac, &J->A->rank);
    return has_factor == 0 ? NSR_FL_DECLINED : has_factor < 0 ? F->X.ctx->status : TPK_OK;
}

static int run_only(fl *F, const mm_job *J)
{
    (void)J;
    return !F->dry;
}

/* A·u, u a sum of independent zero-mean blocks (a transformer's W1·h, U·z): the atom is pending,
 * σ²·Σ_t E[u_t u_tᵀ], another node of the entrywise program (declined where u is not one). */
static int pending_sum_apply(fl *F, mm_job *J)
{
    pend *P = NULL;
    int is_sum = nsr_fl_ew_sum_of(F, &J->u, J->am->line, J->am->col, &P);
    if (is_sum == 0)
        return NSR_FL_DECLINED;
    if (is_sum < 0)
        return F->X.ctx->status;
    for (int t = 0; t < P->nd.nt; t++)
        P->nd.t[t].c *= J->var;
    J->A->pend = P;
    return TPK_OK;
}

/* σ²·E[u uᵀ] summed term pair by term pair into the zeroed atom (nsr_fl_lin_m2); in the plan,
 * the same walk over the terms without numbers (it touches their blocks, checks support). */
static int generic_apply(fl *F, mm_job *J)
{
    size_t n = F->N * (size_t)J->D->m;
    if (J->A->M2 != NULL)
        memset(J->A->M2, 0, n * n * sizeof *J->A->M2);
    return lin_m2_acc(F, &J->u, J->var, n, J->A->M2);
}

/* The MatMul lowering, in order of preference: the first entry applicable whose apply does not
 * decline takes the MatMul (the last takes every one). */
static const struct {
    const char *name;
    int (*applicable)(fl *F, const mm_job *J);
    int (*apply)(fl *F, mm_job *J); /* a status, or NSR_FL_DECLINED: the next entry runs */
} matmul_strategies[] = {
    {"embedding factor", embed_factor_applicable, embed_factor_apply},
    {"embedding Gram", embedding, embed_gram_apply},
    {"pending map", pending_map_applicable, pending_map_apply},
    {"fused map", fused_map_applicable, fused_map_apply},
    {"factor chain", always, factor_chain_apply},
    {"pending sum", run_only, pending_sum_apply},
    {"term pairs", always, generic_apply},
};

/* A·src over D (src_val: src's value, consumed; var: σ² of the A-var) into atom A. */
int nsr_fl_matmul(fl *F, const nsr_expr *am, const nsr_expr *src, const nsr_fdom *D, double var,
                  val *src_val, nsr_fl_atom *A)
{
    mm_job J = {.am = am, .src = src, .D = D, .var = var, .A = A};
    int st = matmul_term(F, src, NULL, src_val, &J.u);
    if (st == 0) { /* the zero vector: the atom is zero */
        size_t n = F->N * (size_t)D->m;
        if (A->M2 != NULL)
            memset(A->M2, 0, n * n * sizeof *A->M2);
        A->how = "zero source";
        st = TPK_OK;
    } else if (st == 1) {
        st = NSR_FL_DECLINED;
        size_t nstrat = sizeof matmul_strategies / sizeof matmul_strategies[0];
        for (size_t i = 0; i < nstrat && st == NSR_FL_DECLINED; i++)
            if (matmul_strategies[i].applicable(F, &J)) {
                st = matmul_strategies[i].apply(F, &J);
                A->how = matmul_strategies[i].name;
            }
        nsr_fl_val_free(F, &J.u);
    }
    if (F->trace && st == TPK_OK)
        fprintf(stderr, "  %s:%d:%d: MatMul %s: %s\n", F->X.R->file, am->line, am->col, am->name,
                A->how);
    return st;
}

/* ---- a sum of MatMuls: convolution taps ----------------------------------------------------- */

/* One more tap of a sum (src_val: its source's value, consumed; coef: its scalar factor, or
 * NULL; b: its binder values), kept in T for the lowering of the whole sum. */
int nsr_fl_taps_push(fl *F, taps *T, const nsr_expr *src, val *coef, double var, val *src_val,
                     const int *b, int nb)
{
    val u;
    int st = matmul_term(F, src, coef, src_val, &u);
    if (st != 1)
        return st; /* the zero vector adds nothing */
    if (T->n == T->cap) {
        int cap = T->cap ? 2 * T->cap : 16;
        tap *t = tpk_realloc(F->X.ctx, T->t, (size_t)cap * sizeof *t);
        if (t == NULL) {
            nsr_fl_val_free(F, &u);
            return TPK_ERROR(F->X.ctx, TPK_ENOMEM, "out of memory");
        }
        T->t = t;
        T->cap = cap;
    }
    tap *t = &T->t[T->n++];
    memset(t, 0, sizeof *t);
    t->u = u;
    t->var = var;
    for (int i = 0; i < nb && i < 2; i++)
        t->b[i] = b[i];
    return TPK_OK;
}

void nsr_fl_taps_free(fl *F, taps *T)
{
    for (int i = 0; i < T->n; i++)
        nsr_fl_val_free(F, &T->t[i].u);
    tpk_free(F->X.ctx, T->t);
    memset(T, 0, sizeof *T);
}

/* The taps as a convolution (theory §2.8): over a rows × cols grid, every tap reads one block X
 * defined on the same grid at the shifted position — wrapped (circular) or masked to zero
 * outside (zero padding) — with one variance: the step between CNN layers of kernels/cnn.c,
 * M2 += σ² Σ_t M2_X[p+t, q+t] per input pair. */
typedef struct conv_shape {
    int X;              /* the block the taps read */
    long R, C;          /* the grid */
    int kh, kw, padding;
    double var;
} conv_shape;

/* D as a grid r0..r1 × s0..s1 in row-major order (one index: a row); 0 where it is not. */
static int grid_of(const nsr_fdom *D, int *r0, int *s0, int *r1, int *s1, long *R, long *C)
{
    int two = D->nv == 2;
    *r0 = two ? D->val[0] : 1;
    *s0 = D->val[two ? 1 : 0];
    const int *last = &D->val[(D->m - 1) * D->nv];
    *r1 = two ? last[0] : 1;
    *s1 = last[two ? 1 : 0];
    *R = *r1 - *r0 + 1;
    *C = *s1 - *s0 + 1;
    if (*R < 1 || *C < 1 || *R * *C != D->m)
        return 0;
    for (long p = 0; p < D->m; p++)
        if ((two && D->val[p * 2] != *r0 + p / *C) || D->val[p * D->nv + two] != *s0 + p % *C)
            return 0;
    return 1;
}

/* Block X's members on the grid, row-major (the input's slots are, by the program's
 * (r − 1)·cols + s, which the taps' index check confirms). */
static int block_on_grid(const fblock *bx, int two, int r0, int s0, int r1, int s1)
{
    if (bx->input)
        return 1;
    if (bx->tr.nlev != 1 + two || bx->tr.nn[0] != 1 || bx->tr.lo[0][0] != (two ? r0 : s0) ||
        bx->tr.hi[0][0] != (two ? r1 : s1))
        return 0;
    for (long q = 0; two && q < bx->tr.nn[1]; q++)
        if (bx->tr.lo[1][q] != s0 || bx->tr.hi[1][q] != s1)
            return 0;
    return 1;
}

/* Tap i (at (ti, tj) of a kh × kw filter centred at (cr, cs)) reads X at each point's shifted
 * position: 1, with the padding it implies folded into *padding (−1: none yet); 0 where not. */
static int tap_shifts(const fl *F, const nsr_fdom *D, const tap *t, int two, long R, long C,
                      int ti, int tj, int cr, int cs, int *padding)
{
    size_t N = F->N, m = (size_t)D->m;
    const term *u = &t->u.t[0];
    for (long p = 0; p < D->m; p++) {
        long r = two ? p / C : 0, c = p % C;
        long rr = r + ti - cr, cc = c + tj - cs;
        int in = rr >= 0 && rr < R && cc >= 0 && cc < C;
        long want = ((rr % R + R) % R) * C + (cc % C + C) % C;
        double w = u->w ? u->w[p] : 1;
        for (size_t a = 1; u->w && a < N; a++)
            if (u->w[a * m + (size_t)p] != w)
                return 0;
        if (!(w == 1 || w == 0) || (w == 1 && u->idx[p] != want))
            return 0;
        int pad = w == 0 ? TPK_CNN_ZERO : in ? -1 : TPK_CNN_CIRCULAR;
        if (w == 0 && in)
            return 0;
        if (pad >= 0) {
            if (*padding >= 0 && *padding != pad)
                return 0;
            *padding = pad;
        }
    }
    return 1;
}

/* Are the taps T over D a convolution (then *S)? Never in the plan: it takes the tap-by-tap
 * path, which touches the same block. */
static int conv_shape_of(const fl *F, const nsr_fdom *D, const taps *T, conv_shape *S)
{
    if (F->dry || T->n == 0 || D->nv < 1 || D->nv > 2 || T->nb != D->nv)
        return 0;
    int two = D->nv == 2, r0, s0, r1, s1;
    if (!grid_of(D, &r0, &s0, &r1, &s1, &S->R, &S->C))
        return 0;
    const tap *t0 = &T->t[0];
    if (t0->u.nt != 1)
        return 0;
    S->X = t0->u.t[0].blk;
    S->var = t0->var;
    const fblock *bx = &F->b[S->X];
    if (bx->m != D->m || !block_on_grid(bx, two, r0, s0, r1, s1))
        return 0;
    S->kh = 1;
    S->kw = 0;
    for (int i = 0; i < T->n; i++) {
        S->kh = two && T->t[i].b[0] + 1 > S->kh ? T->t[i].b[0] + 1 : S->kh;
        S->kw = T->t[i].b[two] + 1 > S->kw ? T->t[i].b[two] + 1 : S->kw;
    }
    if (S->kh * S->kw != T->n || S->kh > S->R || S->kw > S->C)
        return 0;
    int cr = (S->kh - 1) / 2, cs = (S->kw - 1) / 2;
    S->padding = -1;
    for (int i = 0; i < T->n; i++) {
        const tap *t = &T->t[i];
        int ti = two ? t->b[0] : 0, tj = t->b[two];
        if (t->u.nt != 1 || t->u.t[0].blk != S->X || t->u.t[0].dense || t->u.mu ||
            t->var != t0->var || ti < 0 || tj < 0 || ti != i / S->kw || tj != i % S->kw ||
            !tap_shifts(F, D, t, two, S->R, S->C, ti, tj, cr, cs, &S->padding))
            return 0;
    }
    if (S->padding < 0)
        S->padding = TPK_CNN_CIRCULAR; /* no tap leaves the grid */
    return 1;
}

/* A tap sum being lowered: its taps, its atom, and its shape where it is a convolution. */
typedef struct tap_job {
    const nsr_fdom *D;
    taps *T;
    nsr_fl_atom *A;
    int conv;           /* the taps are a convolution: S */
    conv_shape S;
} tap_job;

/* The block a pending convolution reads, or −1: φ(g) with g a zero-mean Gaussian block (pending
 * or not; *phi), or a Gaussian block itself (the inputs': their Gram is made per pair). */
static int conv_pending_source(fl *F, const tap_job *J, const tpk_phi **phi)
{
    const fblock *bx = &F->b[J->S.X];
    *phi = NULL;
    if (bx->kind == BK_NONLIN && bx->M2 == NULL && nsr_fl_ew_leafable(F, bx->arg, J->D->m)) {
        *phi = bx->phi;
        return bx->arg;
    }
    if (bx->kind == BK_GAUSS && nsr_fl_ew_leafable(F, J->S.X, J->D->m))
        return J->S.X;
    return -1;
}

/* The convolution stays pending, a node of a pair program (netsor/ewpair.c), under the optimal
 * plan: a CNN's layers then run one input pair at a time from the inputs to the readout, in
 * buffers, as kernels/cnn.c does. */
static int conv_pending_applicable(fl *F, const tap_job *J)
{
    const tpk_phi *phi;
    return J->conv && F->plan_kind == NSR_PLAN_OPTIMAL && conv_pending_source(F, J, &phi) >= 0;
}

static int conv_pending_apply(fl *F, tap_job *J)
{
    const tpk_phi *phi;
    int src = conv_pending_source(F, J, &phi);
    pend *P = nsr_fl_pend_new(F, NSR_EW_CONV, nsr_fl_cur_line(F), nsr_fl_cur_col(F));
    if (P == NULL)
        return F->X.ctx->status;
    P->nd.arg = src;
    P->nd.phi = phi;
    P->nd.alpha = J->S.var;
    P->nd.rows = (int)J->S.R;
    P->nd.cols = (int)J->S.C;
    P->nd.kh = J->S.kh;
    P->nd.kw = J->S.kw;
    P->nd.pad = J->S.padding;
    nsr_fl_touch(F, J->S.X);
    nsr_fl_touch(F, src);
    J->A->pend = P;
    return TPK_OK;
}

static int conv_applicable(fl *F, const tap_job *J)
{
    (void)F;
    return J->conv;
}

/* What the convolution reads per input pair: a matrix MX (lower: its lower triangle only), or
 * the inputs x themselves (from_x), with φ's map fused in (phi, over g's diagonal dg). */
typedef struct conv_source {
    int blk;            /* the block read (g under a fused φ, else X) */
    const double *MX;
    int lower, from_x;
    const tpk_phi *phi;
    double *dg;
} conv_source;

/* The taps read h = φ(g) whose moments are not made yet, and h dies here: φ's map runs per input
 * pair on the pair's block of g, in the buffer the convolution reads next (map and taps fused, as
 * the direct recursion of kernels/cnn.c does), so h's (N m)² matrix is never written and read
 * back. Else the taps read the inputs themselves and nothing after this statement does: each
 * pair's block of their Gram, ⟨x_ap, x_cq⟩/d, is made where the convolution needs it (a rank-d
 * product per pair) instead of the whole (N m)² Gram first — a CNN's first layer on images then
 * touches one fresh block, not two. Few channels only (RGB, grey): the per-pair loop is plain,
 * where the whole Gram would be one tuned SYRK. Else X's matrix. */
static int conv_source_of(fl *F, const tap_job *J, conv_source *cs)
{
    int X = J->S.X;
    const fblock *bx = &F->b[X];
    size_t n = F->N * (size_t)J->D->m;
    memset(cs, 0, sizeof *cs);
    cs->blk = X;
    if (bx->kind == BK_NONLIN && bx->M2 == NULL && nsr_fl_dies_here(F, X) &&
        nsr_fl_stmt_reads_once(F)) {
        const fblock *bg = &F->b[bx->arg];
        int zero_mean = bg->kind == BK_GAUSS && bg->m == bx->m;
        for (size_t i = 0; zero_mean && bg->mean && i < n; i++)
            zero_mean = bg->mean[i] == 0;
        if (zero_mean) {
            cs->phi = bx->phi;
            cs->blk = bx->arg;
            nsr_fl_touch(F, X);
        }
    }
    cs->from_x = cs->phi == NULL && bx->input && bx->M2 == NULL && nsr_fl_dies_here(F, X) &&
                 (size_t)bx->m == F->T && F->d > 0 && F->d <= 8;
    if (cs->from_x)
        nsr_fl_touch(F, X);
    cs->MX = cs->from_x ? NULL : nsr_fl_block_m2(F, cs->blk);
    cs->lower = F->b[cs->blk].lower;
    /* the pair's map needs both inputs' variances: g's diagonal, kept before the matrix is
     * overwritten */
    cs->dg = cs->phi ? nsr_fam_alloc(&F->X, n, sizeof *cs->dg) : NULL;
    if ((cs->MX == NULL && !cs->from_x) ||
        (cs->phi && (cs->dg == NULL || nsr_fl_ensure_ws_for(F, cs->phi)))) {
        tpk_free(F->X.ctx, cs->dg);
        cs->dg = NULL;
        return F->X.ctx->status ? F->X.ctx->status : TPK_ENOMEM;
    }
    for (size_t i = 0; cs->phi && i < n; i++)
        cs->dg[i] = cs->MX[i * n + i];
    return TPK_OK;
}

/* Input pair (a, c)'s block of what the convolution reads, into bi (m × m): the source's pair
 * block, with φ's map fused in (*e its error); φ's status (lc: the thread's context). */
static int conv_pair_source(fl *F, const conv_source *cs, size_t a, size_t c, size_t m,
                            double *bi, double *e, tpk_ctx *lc)
{
    size_t n = F->N * m;
    nsr_pair_block(cs->from_x ? NULL : cs->MX, cs->lower, F->x, F->d, n, m, a, c, bi);
    if (cs->phi == NULL)
        return TPK_OK;
    return tpk_gauss_map_cross(cs->phi, cs->dg + a * m, m, cs->dg + c * m, m, bi, bi, F->ws, e,
                               lc);
}

/* The convolution input pair by input pair (pairs are independent: one per thread, each with its
 * two P×P buffers), into the atom's matrix — or, where the source dies here and the statement
 * reads it once, over the source's own matrix, which the atom takes: each pair's block of the
 * result depends on that pair's block of the source alone, so no fresh (N m)² block to fault in. */
static int conv_apply(fl *F, tap_job *J)
{
    conv_source cs;
    int st = conv_source_of(F, J, &cs);
    if (st)
        return st;
    size_t N = F->N, m = (size_t)J->D->m, n = N * m, npairs = N * (N + 1) / 2;
    double *M2 = J->A->M2;
    double *taken = cs.MX != NULL ? nsr_fl_take_matrix(F, cs.blk, J->D->m) : NULL;
    if (taken != NULL)
        M2 = J->A->taken = taken;
    const conv_shape *S = &J->S;
    int fail = 0, mapst = TPK_OK;
    double emap = 0.0;
    char mapmsg[sizeof F->X.ctx->msg] = "";
#pragma omp parallel reduction(| : fail)
    {
        /* the hook's allocator, never folded into calloc (see nsr_fl_big) */
        void *vi = tpk_mem_malloc(TPK_ALLOCATOR_OF(F->X.ctx), m * m * sizeof(double), NULL);
        void *vo = tpk_mem_malloc(TPK_ALLOCATOR_OF(F->X.ctx), m * m * sizeof(double), NULL);
        double *bi = vi, *bo = vo;
        tpk_ctx lc;
        tpk_ctx_init_from(&lc, F->X.ctx);
        tpk_cnn_convws *cv = tpk_cnn_convws_alloc((size_t)S->R, (size_t)S->C, S->kh, S->kw,
                                                  S->padding, TPK_CNN_CONV_AUTO, &lc);
        fail |= bi == NULL || bo == NULL || cv == NULL;
        if (bi != NULL && bo != NULL) { /* touch the pages by writing (see nsr_fl_big) */
            memset(bi, 0, m * m * sizeof *bi);
            memset(bo, 0, m * m * sizeof *bo);
        }
#pragma omp for schedule(dynamic, 1)
        for (size_t ac = 0; ac < npairs; ac++) {
            if (bi == NULL || bo == NULL || cv == NULL)
                continue;
            size_t a, c;
            tpk_lower_index(ac, &a, &c);
            double e = 0.0;
            int ms = conv_pair_source(F, &cs, a, c, m, bi, &e, &lc);
            if (ms != TPK_OK) {
#pragma omp critical(tpk_flimit_convmap)
                if (mapst == TPK_OK) {
                    mapst = ms;
                    snprintf(mapmsg, sizeof mapmsg, "%s", lc.msg);
                }
                continue;
            }
            if (cs.phi != NULL) {
#pragma omp critical(tpk_flimit_convmap)
                emap = fmax(emap, e);
            }
            tpk_cnn_convws_apply(cv, S->var, 0.0, bi, bo);
            for (size_t p = 0; p < m; p++) {
                double *row = M2 + (a * m + p) * n + c * m;
                for (size_t q = 0; q < m; q++)
                    row[q] = bo[p * m + q]; /* the block was uninitialised: assign */
            }
        }
        tpk_free(F->X.ctx, bi), tpk_free(F->X.ctx, bo);
        tpk_cnn_convws_free(cv);
    }
    tpk_free(F->X.ctx, cs.dg);
    if (fail)
        return TPK_ERROR(F->X.ctx, TPK_ENOMEM, "convolution of the covariance blocks failed (out "
                         "of memory)");
    if (mapst != TPK_OK)
        return nsr_fam_err(&F->X, mapst, NULL, "%s", mapmsg);
    F->err = fmax(F->err, emap);
    return TPK_OK;
}

static int taps_always(fl *F, const tap_job *J)
{
    (void)F, (void)J;
    return 1;
}

/* Σ_t σ_t² E[u_t u_tᵀ], tap by tap, into the zeroed atom: the taps are independent (distinct
 * A-vars, theory §1.6), so no cross terms. */
static int taps_generic_apply(fl *F, tap_job *J)
{
    size_t n = F->N * (size_t)J->D->m;
    int st = TPK_OK;
    if (J->A->M2 != NULL)
        memset(J->A->M2, 0, n * n * sizeof *J->A->M2);
    for (int i = 0; i < J->T->n && st == TPK_OK; i++)
        st = lin_m2_acc(F, &J->T->t[i].u, J->T->t[i].var, n, J->A->M2);
    return st;
}

/* The lowering of a tap sum, in order of preference (the last takes every one). */
static const struct {
    const char *name;
    int (*applicable)(fl *F, const tap_job *J);
    int (*apply)(fl *F, tap_job *J);
} tap_strategies[] = {
    {"pending convolution", conv_pending_applicable, conv_pending_apply},
    {"convolution by input pairs", conv_applicable, conv_apply},
    {"tap by tap", taps_always, taps_generic_apply},
};

/* The sum of the MatMuls kept in T, over D, into atom A (line: the sum's, for the trace). */
int nsr_fl_tap_sum(fl *F, const nsr_fdom *D, taps *T, nsr_fl_atom *A, int line)
{
    tap_job J = {.D = D, .T = T, .A = A};
    J.conv = conv_shape_of(F, D, T, &J.S);
    size_t i = 0;
    while (!tap_strategies[i].applicable(F, &J))
        i++;
    A->how = tap_strategies[i].name;
    int st = tap_strategies[i].apply(F, &J);
    if (F->trace && st == TPK_OK)
        fprintf(stderr, "  %s:%d: sum of %d MatMuls: %s\n", F->X.R->file, line, T->n, A->how);
    return st;
}
