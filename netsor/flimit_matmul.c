/* MatMul lowering of the rolled limit evaluator: each MatMul a new atom with σ²·E[u uᵀ] of its
 * source, convolution taps as one block (theory §1.6, §2.8). */
#include "flimit-impl.h"
#include "tpk/alloc.h"
#include "tpk/cnn.h"
#include "tpk/matmul.h"

#include <math.h>
#include <string.h>

/* The declared member of A-var (or G) family sym at the indices of e, or −1. */
static int dm_find(fl *F, int sym, const nsr_expr *e, int *out)
{
    int t[NSR_MAX_INDICES];
    for (int i = 0; i < e->nidx; i++)
        if (nsr_fam_int(&F->X, e->idx[i], &t[i]))
            return F->X.ctx->status;
    for (int i = 0; i < F->X.R->ndm; i++) {
        const nsr_dmember *d = &F->X.R->dm[i];
        if (d->sym == sym && d->nidx == e->nidx && memcmp(d->idx, t, (size_t)e->nidx * sizeof *t) == 0) {
            *out = i;
            return TPK_OK;
        }
    }
    return nsr_fam_err(&F->X, TPK_ETYPE, e, "%s has no such member (not declared)", e->name);
}

void nsr_fl_taps_free(fl *F, taps *T)
{
    for (int i = 0; i < T->n; i++)
        nsr_fl_val_free(F, &T->t[i].u);
    tpk_free(F->X.ctx, T->t);
    memset(T, 0, sizeof *T);
}

int nsr_fl_lin_m2_acc(fl *F, val *u, double var, size_t n, double *M2)
{
    return nsr_fl_lin_m2(F, u, u, F->dry ? NULL : M2, F->dry ? 0 : n, 1, var);
}

/* The A-var of a MatMul am over D: one that changes with the family's index (untied weights per
 * member) or is multiplied in more than one place (tied) is refused; its σ² in *var. The site
 * that multiplies it is marked. */
int nsr_fl_matmul_weight(fl *F, const nsr_expr *am, const nsr_fdom *D, double *var)
{
    if (nsr_reads_syms(am, D->sym, D->nv, 0))
        return NSR_UNSUP(&F->X, am, "an A-var that changes with the family's index (%s): untied weights "
                     "per member", am->name);
    int di = -1;
    if (dm_find(F, am->sym, am, &di))
        return F->X.ctx->status;
    if (F->avar_site[di] >= 0)
        return NSR_UNSUP(&F->X, am, "%s is multiplied in more than one place (weight tying, e.g. a "
                     "recurrence); the rolled evaluator keeps every MatMul's A-var its own",
                     am->name);
    F->avar_site[di] = (int)F->nsites;
    *var = F->X.R->dm[di].var;
    return TPK_OK;
}

/* One MatMul term A·src (scaled by coef; src_val: src's value, consumed) added into the atom's
 * M2 (lower triangle), or kept in T (a vector source inside a tap sum). */
int nsr_fl_matmul_acc(fl *F, const nsr_expr *am, const nsr_expr *src, const nsr_fdom *D,
                      val *coef, double var, val *src_val, double *M2, taps *T, double **fac,
                      long *rank)
{
    val u = *src_val;
    memset(src_val, 0, sizeof *src_val);
    if (u.kind != V_LIN) {
        int zero = u.kind == V_CONST && u.c == 0;
        nsr_fl_val_free(F, &u);
        if (zero || (coef && coef->kind == V_CONST && coef->c == 0)) {
            if (T == NULL && M2 != NULL) /* eval_matmul's block is uninitialised */
                memset(M2, 0, F->N * (size_t)D->m * F->N * (size_t)D->m * sizeof *M2);
            return TPK_OK;
        }
        return NSR_UNSUP(&F->X, src, "MatMul of a constant vector");
    }
    if ((coef && nsr_fl_val_scale(F, &u, coef)) || nsr_fl_val_merge(F, &u)) {
        nsr_fl_val_free(F, &u);
        return F->X.ctx->status;
    }
    if (T != NULL) {
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
        return TPK_OK;
    }
    /* U·x[t] over every slot in order: the Gram (σ²/d) x xᵀ straight into the atom */
    if (!F->dry && u.nt == 1 && u.mu == NULL && nsr_fl_identity_term(&u.t[0], u.m) &&
        F->b[u.t[0].blk].input && F->b[u.t[0].blk].M2 == NULL && (size_t)u.m == F->T) {
        size_t n = F->N * F->T;
        nsr_fl_touch(F, u.t[0].blk);
        if (fac != NULL && F->d * FAC_RATIO <= n) { /* rank d: the factor √(σ²/d)·x, no Gram */
            nsr_fl_val_free(F, &u);
            if ((*fac = nsr_fam_alloc(&F->X, n * F->d, sizeof **fac)) == NULL)
                return F->X.ctx->status;
            double c = sqrt(var / (double)F->d);
            for (size_t i = 0; i < n * F->d; i++)
                (*fac)[i] = c * F->x[i];
            *rank = (long)F->d;
            return TPK_OK;
        }
        int st = tpk_dsyrk_lower(TPK_NO_TRANS, n, F->d, var / (double)F->d, F->x, F->d, 0.0, M2,
                                 n, F->X.ctx); /* the atom is stored lower (finish_atom) */
        nsr_fl_val_free(F, &u);
        return st;
    }
    /* A·φ(g) made by eval_matmul (fac: its call), g a zero-mean Gaussian block: the atom is
     * pending, σ²·V_φ(g), and its matrix is made where a reader needs one — with the maps and
     * sums around it, by the plan of ew_flush (docs/orchestration.md §7) */
    if (!F->dry && fac != NULL && u.nt == 1 && u.mu == NULL && nsr_fl_identity_term(&u.t[0], u.m) &&
        F->b[u.t[0].blk].kind == BK_NONLIN && F->b[u.t[0].blk].M2 == NULL &&
        F->b[u.t[0].blk].m == D->m && nsr_fl_ew_leafable(F, F->b[u.t[0].blk].arg, D->m)) {
        int x = u.t[0].blk, g = F->b[x].arg;
        pend *P = nsr_fl_pend_new(F, NSR_EW_PHI, F->b[x].line, am->col);
        nsr_fl_val_free(F, &u);
        if (P == NULL)
            return F->X.ctx->status;
        P->nd.arg = g;
        P->nd.phi = F->b[x].phi;
        P->nd.alpha = var;
        nsr_fl_touch(F, x);
        nsr_fl_touch(F, g);
        F->newpend = P;
        return TPK_OK;
    }
    /* A·φ(g) where the φ block dies here: its map goes straight into the (zeroed) atom, scaled
     * by σ², instead of being stored and then copied — one pass over the block per layer, as in
     * the direct recursion's fused map (tpk_gauss_map_affine) */
    if (!F->dry && u.nt == 1 && u.mu == NULL && nsr_fl_identity_term(&u.t[0], u.m)) {
        int x = u.t[0].blk;
        fblock *bx = &F->b[x];
        if (bx->kind == BK_NONLIN && bx->M2 == NULL && nsr_fl_plan_get(F, 1) && x < F->nplan &&
            F->plan[x] == F->X.cur && F->b[bx->arg].mean == NULL && nsr_fl_block_m2(F, bx->arg) != NULL &&
            nsr_fl_ensure_ws_for(F, bx->phi) == TPK_OK) {
            double e = 0;
            size_t n = F->N * (size_t)D->m;
            nsr_fl_touch(F, x);
            nsr_fl_touch(F, bx->arg);
            /* and where g dies here too (a layer of a deep network), the map runs in place and
             * the atom takes g's matrix: no fresh block, whose first touch (page faults and the
             * kernel's zeroing) cost more than the map (MLP N = 2048: 56 % of the run) */
            const double *S = F->b[bx->arg].M2;
            double *dst = F->inplace == NULL && nsr_fl_defined_names(F, src) == 1
                              ? nsr_fl_take_matrix(F, bx->arg, D->m) : NULL;
            if (dst != NULL)
                F->inplace = dst; /* eval_matmul's atom takes it */
            else
                dst = M2;
            int st = tpk_gauss_map_affine_lower(bx->phi, S, n, var, 0.0, dst, F->ws, &e,
                                                F->X.ctx);
            F->err = fmax(F->err, e);
            nsr_fl_val_free(F, &u);
            return st;
        }
    }
    if (fac != NULL) { /* A·(C·X) of a factor block: σ·C·Fac */
        int fo = nsr_fl_factor_of(F, &u, sqrt(var), fac, rank);
        if (fo != 0) {
            nsr_fl_val_free(F, &u);
            return fo < 0 ? F->X.ctx->status : TPK_OK;
        }
    }
    if (fac != NULL && !F->dry) {
        /* A·u, u a sum of independent zero-mean blocks (a transformer's W1·h, U·z): the atom is
         * pending, σ²·Σ_t E[u_t u_tᵀ], another node of the entrywise program (ew_flush) */
        pend *P = NULL;
        int es = nsr_fl_ew_sum_of(F, &u, am->line, am->col, &P);
        if (es != 0) {
            nsr_fl_val_free(F, &u);
            if (es < 0)
                return F->X.ctx->status;
            for (int t = 0; t < P->nd.nt; t++)
                P->nd.t[t].c *= var;
            F->newpend = P;
            return TPK_OK;
        }
    }
    if (M2 != NULL) /* the generic sum accumulates: eval_matmul's block starts uninitialised */
        memset(M2, 0, F->N * (size_t)D->m * F->N * (size_t)D->m * sizeof *M2);
    int st = nsr_fl_lin_m2_acc(F, &u, var, F->N * (size_t)D->m, M2);
    nsr_fl_val_free(F, &u);
    return st;
}

/* zero = 0: M2 is left uninitialised (the caller assigns every lower-triangle entry) */
int nsr_fl_new_atom(fl *F, long m, double **M2, int *k, int zero)
{
    if ((*k = nsr_fl_new_block(F, BK_GAUSS, -1, m)) < 0)
        return F->X.ctx->status;
    nsr_fl_anc_root(&F->b[*k], *k);
    *M2 = NULL;
    if (!F->dry) {
        size_t n = F->N * (size_t)m;
        if ((*M2 = nsr_fl_big(F, n * n, sizeof **M2, zero)) == NULL)
            return F->X.ctx->status;
    }
    return TPK_OK;
}

int nsr_fl_finish_atom(fl *F, int k, double *M2, val *out, long m)
{
    F->b[k].M2 = M2;
    F->b[k].lower = 1;
    int *idx = nsr_fam_alloc(&F->X, (size_t)m, sizeof *idx);
    if (idx == NULL)
        return F->X.ctx->status;
    for (long p = 0; p < m; p++)
        idx[p] = (int)p;
    return nsr_fl_val_gather(F, out, m, k, idx);
}

/* The convolution lowering (theory §2.8): the taps of a sum Σ_t F_t h[p + t] over a rows×cols
 * grid, every tap reading one block h defined on the same grid at the shifted position — wrapped
 * (circular) or masked to zero outside (zero padding) — with one variance, are the step between
 * CNN layers of kernels/cnn.c: M2 += σ² Σ_t M2_h[p+t, q+t] per input pair by
 * tpk_cnn_conv_block. Returns 1 when it took the taps, 2 when they are a pending node
 * (F->newpend); 0 leaves them to the generic sum. */
int nsr_fl_conv_lowering(fl *F, const nsr_fdom *D, taps *T, double *M2, int *st)
{
    *st = TPK_OK;
    if (F->dry || T->n == 0 || D->nv < 1 || D->nv > 2 || T->nb != D->nv)
        return 0; /* the plan takes the generic path: it touches the same block */
    /* the grid: D is r0..r1 × s0..s1 in row-major order */
    int two = D->nv == 2;
    int r0 = two ? D->val[0] : 1, s0 = D->val[two ? 1 : 0];
    const int *last = &D->val[(D->m - 1) * D->nv];
    int r1 = two ? last[0] : 1, s1 = last[two ? 1 : 0];
    long R = r1 - r0 + 1, C = s1 - s0 + 1;
    if (R < 1 || C < 1 || R * C != D->m)
        return 0;
    for (long p = 0; p < D->m; p++)
        if ((two && D->val[p * 2] != r0 + p / C) || D->val[p * D->nv + two] != s0 + p % C)
            return 0;
    const tap *t0 = &T->t[0];
    if (t0->u.nt != 1)
        return 0;
    int X = t0->u.t[0].blk;
    const fblock *bx = &F->b[X];
    if (bx->m != D->m)
        return 0;
    /* X's members: the same grid, row-major (the input's slots are, by the program's
     * (r − 1)·cols + s, which the index check below confirms) */
    if (!bx->input && (bx->tr.nlev != D->nv || bx->tr.nn[0] != 1 ||
                         bx->tr.lo[0][0] != (two ? r0 : s0) || bx->tr.hi[0][0] != (two ? r1 : s1)))
        return 0;
    if (two && !bx->input)
        for (long q = 0; q < bx->tr.nn[1]; q++)
            if (bx->tr.lo[1][q] != s0 || bx->tr.hi[1][q] != s1)
                return 0;
    int kh = 1, kw = 0;
    for (int i = 0; i < T->n; i++) {
        kh = two && T->t[i].b[0] + 1 > kh ? T->t[i].b[0] + 1 : kh;
        kw = T->t[i].b[two] + 1 > kw ? T->t[i].b[two] + 1 : kw;
    }
    if (kh * kw != T->n || kh > R || kw > C)
        return 0;
    int cr = (kh - 1) / 2, cs = (kw - 1) / 2, padding = -1;
    size_t N = F->N, m = (size_t)D->m;
    for (int i = 0; i < T->n; i++) {
        const tap *t = &T->t[i];
        const term *u = &t->u.t[0];
        int ti = two ? t->b[0] : 0, tj = t->b[two];
        if (t->u.nt != 1 || u->blk != X || u->dense || t->u.mu || t->var != t0->var || ti < 0 ||
            tj < 0 || ti != i / kw || tj != i % kw)
            return 0;
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
                if (padding >= 0 && padding != pad)
                    return 0;
                padding = pad;
            }
        }
    }
    if (padding < 0)
        padding = TPK_CNN_CIRCULAR; /* no tap leaves the grid */
    if (F->plan_kind == NSR_PLAN_OPTIMAL) {
        /* The convolution stays pending, a node of a pair program (netsor/ewpair.c): over φ(g)
         * with g a zero-mean Gaussian block (pending or not), or over a Gaussian block itself
         * (the inputs': their Gram is made per pair). A CNN's layers then run one input pair
         * at a time from the inputs to the readout, in buffers, as kernels/cnn.c does. */
        int psrc = -1;
        const tpk_phi *pphi = NULL;
        if (bx->kind == BK_NONLIN && bx->M2 == NULL && nsr_fl_ew_leafable(F, bx->arg, D->m)) {
            psrc = bx->arg;
            pphi = bx->phi;
        } else if (bx->kind == BK_GAUSS && nsr_fl_ew_leafable(F, X, D->m)) {
            psrc = X;
        }
        if (psrc >= 0) {
            pend *P = nsr_fl_pend_new(F, NSR_EW_CONV, nsr_fl_cur_line(F), nsr_fl_cur_col(F));
            if (P == NULL) {
                *st = F->X.ctx->status;
                return 1;
            }
            P->nd.arg = psrc;
            P->nd.phi = pphi;
            P->nd.alpha = t0->var;
            P->nd.rows = (int)R;
            P->nd.cols = (int)C;
            P->nd.kh = kh;
            P->nd.kw = kw;
            P->nd.pad = padding;
            nsr_fl_touch(F, X);
            nsr_fl_touch(F, psrc);
            F->newpend = P;
            return 2;
        }
    }
    size_t n = N * m, npairs = N * (N + 1) / 2;
    /* The taps read h = φ(g) whose moments are not made yet, and h dies here: φ's map runs per
     * input pair on the pair's block of g, in the buffer the convolution reads next (map and
     * taps fused, as the direct recursion of kernels/cnn.c does), so h's (N m)² matrix is never
     * written and read back. The pair's map needs both inputs' variances: g's diagonal, kept
     * first. */
    const tpk_phi *fphi = NULL;
    int gsrc = X;
    if (bx->kind == BK_NONLIN && bx->M2 == NULL && nsr_fl_dies_here(F, X) && nsr_fl_stmt_reads_once(F)) {
        const fblock *bg = &F->b[bx->arg];
        int zero_mean = bg->kind == BK_GAUSS && bg->m == bx->m;
        for (size_t i = 0; zero_mean && bg->mean && i < n; i++)
            zero_mean = bg->mean[i] == 0;
        if (zero_mean) {
            fphi = bx->phi;
            gsrc = bx->arg;
            nsr_fl_touch(F, X);
        }
    }
    /* The taps read the inputs themselves and nothing after this statement does: each pair's
     * block of their Gram, ⟨x_ap, x_cq⟩/d, is made where the convolution needs it (a rank-d
     * product per pair) instead of the whole (N m)² Gram first — a CNN's first layer on images
     * then touches one fresh block, not two. Few channels only (RGB, grey): the per-pair loop
     * is plain, where the whole Gram would be one tuned SYRK. */
    int from_x = fphi == NULL && bx->input && bx->M2 == NULL && nsr_fl_dies_here(F, X) &&
                 (size_t)bx->m == F->T && F->d > 0 && F->d <= 8;
    if (from_x)
        nsr_fl_touch(F, X);
    const double *MX = from_x ? NULL : nsr_fl_block_m2(F, gsrc);
    int lowerX = F->b[gsrc].lower;
    double *in = nsr_fam_alloc(&F->X, m * m, sizeof *in), *out = nsr_fam_alloc(&F->X, m * m, sizeof *out);
    double *dg = fphi ? nsr_fam_alloc(&F->X, n, sizeof *dg) : NULL;
    if ((MX == NULL && !from_x) || in == NULL || out == NULL ||
        (fphi && (dg == NULL || nsr_fl_ensure_ws_for(F, fphi)))) {
        tpk_free(F->X.ctx, in), tpk_free(F->X.ctx, out), tpk_free(F->X.ctx, dg);
        *st = F->X.ctx->status ? F->X.ctx->status : TPK_ENOMEM;
        return 1;
    }
    tpk_free(F->X.ctx, in), tpk_free(F->X.ctx, out);
    for (size_t i = 0; fphi && i < n; i++)
        dg[i] = MX[i * n + i];
    /* Each input pair's block of the result depends on that pair's block of the source alone,
     * so where the source dies here (read once by this statement) the result is written over it
     * and the atom takes its matrix (eval_sum): no fresh (N m)² block to fault in. */
    double *taken = MX != NULL && F->inplace == NULL ? nsr_fl_take_matrix(F, gsrc, D->m) : NULL;
    if (taken != NULL)
        M2 = F->inplace = taken; /* eval_sum's atom takes it */
    int fail = 0, mapst = TPK_OK;
    double emap = 0.0;
    char mapmsg[sizeof F->X.ctx->msg] = "";
    /* input pairs are independent: one per thread, each with its two P×P buffers */
#pragma omp parallel reduction(| : fail)
    {
        void *vi = tpk_mem_malloc(TPK_ALLOCATOR_OF(F->X.ctx), m * m * sizeof(double), NULL); /* see fl_big */
        void *vo = tpk_mem_malloc(TPK_ALLOCATOR_OF(F->X.ctx), m * m * sizeof(double), NULL);
        double *bi = vi, *bo = vo;
        tpk_ctx lc;
        tpk_ctx_init_from(&lc, F->X.ctx);
        tpk_cnn_convws *cv = tpk_cnn_convws_alloc((size_t)R, (size_t)C, kh, kw, padding,
                                              TPK_CNN_CONV_AUTO, &lc);
        fail |= bi == NULL || bo == NULL || cv == NULL;
        if (bi != NULL && bo != NULL) { /* touch the pages by writing (see fl_big) */
            memset(bi, 0, m * m * sizeof *bi);
            memset(bo, 0, m * m * sizeof *bo);
        }
#pragma omp for schedule(dynamic, 1)
        for (size_t ac = 0; ac < npairs; ac++) {
            if (bi == NULL || bo == NULL || cv == NULL)
                continue;
            size_t a, c;
            tpk_lower_index(ac, &a, &c);
            nsr_pair_block(from_x ? NULL : MX, lowerX, F->x, F->d, n, m, a, c, bi);
            if (fphi != NULL) {
                double e = 0.0;
                int ms = tpk_gauss_map_cross(fphi, dg + a * m, m, dg + c * m, m, bi, bi, F->ws, &e,
                                             &lc);
                if (ms != TPK_OK) {
#pragma omp critical(tpk_flimit_convmap)
                    if (mapst == TPK_OK) {
                        mapst = ms;
                        snprintf(mapmsg, sizeof mapmsg, "%s", lc.msg);
                    }
                    continue;
                }
#pragma omp critical(tpk_flimit_convmap)
                emap = fmax(emap, e);
            }
            tpk_cnn_convws_apply(cv, t0->var, 0.0, bi, bo);
            for (size_t p = 0; p < m; p++) {
                double *row = M2 + (a * m + p) * n + c * m;
                for (size_t q = 0; q < m; q++)
                    row[q] = bo[p * m + q]; /* the block was uninitialised: assign */
            }
        }
        tpk_free(F->X.ctx, bi), tpk_free(F->X.ctx, bo);
        tpk_cnn_convws_free(cv);
    }
    tpk_free(F->X.ctx, dg);
    if (fail)
        *st = TPK_ERROR(F->X.ctx, TPK_ENOMEM, "convolution of the covariance blocks failed (out of "
                        "memory)");
    else if (mapst != TPK_OK)
        *st = nsr_fam_err(&F->X, mapst, NULL, "%s", mapmsg);
    else
        F->err = fmax(F->err, emap);
    return 1;
}
