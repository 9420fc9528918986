/* Second moments in the rolled limit evaluator: of a block (φ maps of a Gaussian block, theory
 * §3), of a pair of blocks, of linear values E[u vᵀ] term pair by term pair, their diagonals and
 * their means. */
#include "flimit-impl.h"
#include "tpk/alloc.h"
#include "tpk/matmul.h"

#include <math.h>
#include <string.h>

static int nonlin_moments(fl *F, int k);

/* M2 of block k with both triangles (a symmetric block stored as its lower triangle is
 * mirrored now: most consumers read the lower triangle only and never pay for it). */
static const double *block_m2_full(fl *F, int k);

/* First moments of block k, N·m (NULL: all zero). */
static const double *block_mean(fl *F, int k)
{
    fblock *b = &F->b[k];
    nsr_fl_touch(F, k);
    if (b->kind == BK_NONLIN)
        nsr_fl_touch(F, b->arg); /* read when its moments are computed (lazily): keep it alive */
    if (b->kind == BK_NONLIN && b->M2 == NULL)
        nonlin_moments(F, k);
    return b->mean;
}

/* Second moments of block k, (N m)²: a pending block's entrywise program runs now, a φ block's
 * maps run (lazily, once), every other block's matrix is kept or made (nsr_fl_block_made). */
const double *nsr_fl_block_m2(fl *F, int k)
{
    fblock *b = &F->b[k];
    if (b->pend != NULL && !F->dry) { /* a pending block: its entrywise program runs now */
        nsr_fl_touch(F, k);
        return nsr_fl_ew_flush(F, k, NULL, 0) ? NULL : F->b[k].M2;
    }
    if (b->kind != BK_NONLIN)
        return nsr_fl_block_made(F, k);
    nsr_fl_touch(F, k);
    nsr_fl_touch(F, b->arg);
    if (b->M2 == NULL && nonlin_moments(F, k))
        return NULL;
    return b->M2;
}

static const double *block_m2_full(fl *F, int k)
{
    if (F->b[k].pend != NULL && !F->dry) /* both triangles from the plan's tiles, no mirror */
        return nsr_fl_ew_flush(F, k, NULL, 1) ? NULL : F->b[k].M2;
    const double *M = nsr_fl_block_m2(F, k);
    fblock *b = &F->b[k];
    if (M != NULL && b->lower) {
        nsr_ew_mirror(b->M2, F->N * (size_t)b->m);
        b->lower = 0;
    }
    return M;
}

/* φ of a zero-mean Gaussian block with moments S (n × n): the means E[φ(u_i)] first (an in-place
 * map overwrites the diagonal they read), then the lower triangle by the whole-matrix map (the
 * tuned maps serve it, ReLU's, and most readers need no more). */
static int phi_moments_centred(fl *F, const tpk_phi *phi, const double *S, size_t n, double *M2,
                               double *mean, double *err)
{
    int st = TPK_OK;
    double e = 0;
    for (size_t i = 0; st == TPK_OK && i < n; i++) {
        tpk_estimate r;
        st = tpk_gauss_expect1(phi, 0, S[i * n + i], F->ws, &r, F->X.ctx);
        mean[i] = r.value;
        e = fmax(e, r.err);
    }
    double em = 0;
    if (st == TPK_OK)
        st = tpk_gauss_map_affine_lower(phi, S, n, 1.0, 0.0, M2, F->ws, &em, F->X.ctx);
    *err = fmax(e, em);
    return st;
}

/* φ of a Gaussian block with means mu and second moments S: entry by entry, both triangles. */
static int phi_moments_means(fl *F, const tpk_phi *phi, const double *S, const double *mu,
                             size_t n, double *M2, double *mean, double *err)
{
    int st = TPK_OK;
    double e = 0;
    for (size_t i = 0; st == TPK_OK && i < n; i++) {
        double mi = mu[i], qi = S[i * n + i] - mi * mi;
        tpk_estimate r;
        st = tpk_gauss_expect1(phi, mi, fmax(qi, 0), F->ws, &r, F->X.ctx);
        mean[i] = r.value;
        for (size_t j = 0; st == TPK_OK && j <= i; j++) {
            double mj = mu[j], qj = S[j * n + j] - mj * mj;
            double kij = S[i * n + j] - mi * mj;
            st = tpk_gauss_expect2_quad(phi, phi, mi, mj, fmax(qi, 0), fmax(qj, 0), kij, F->ws,
                                        &r, F->X.ctx);
            M2[i * n + j] = M2[j * n + i] = r.value;
            e = fmax(e, r.err);
        }
    }
    *err = e;
    return st;
}

/* φ(u) block: E[φ(u_p)φ(u_q)] over the block by the library's whole-matrix maps (zero means),
 * or entry by entry with means (theory §3). */
static int nonlin_moments(fl *F, int k)
{
    size_t n = F->N * (size_t)F->b[k].m;
    if (F->dry || n == 0)
        return TPK_OK;
    if (nsr_fl_block_m2(F, F->b[k].arg) == NULL) /* a factor block makes its matrix now */
        return F->X.ctx->status ? F->X.ctx->status : TPK_ENOMEM;
    fblock *b = &F->b[k];
    fblock *u = &F->b[b->arg];
    int zero_mean = 1;
    if (u->mean)
        for (size_t i = 0; i < n && zero_mean; i++)
            zero_mean = u->mean[i] == 0;
    /* φ(g) where g dies here and the statement reads it through this block alone (a CNN's
     * h = φ(g) read by the next layer's taps): the map runs over g's matrix and this block takes
     * it (nsr_fl_take_matrix; the fused-map MatMul does the same for W·φ(g)). S: g's moments,
     * read in place. */
    const double *S = u->M2;
    double *M2 = zero_mean ? nsr_fl_take_matrix(F, b->arg, b->m) : NULL;
    const int in_place = M2 != NULL;
    if (!in_place)
        M2 = nsr_fl_big(F, n * n, sizeof *M2, 0);
    double *mean = nsr_fam_alloc(&F->X, n, sizeof *mean);
    int ready = M2 != NULL && mean != NULL && nsr_fl_ensure_ws(F) == TPK_OK, st = TPK_OK;
    double e = 0;
    if (ready)
        st = zero_mean ? phi_moments_centred(F, b->phi, S, n, M2, mean, &e)
                       : phi_moments_means(F, b->phi, S, u->mean, n, M2, mean, &e);
    if (!ready || st) {
        if (in_place) /* a block's matrix, freed (or pooled) like any */
            nsr_fl_release(F, M2, n * n * sizeof *M2);
        else
            tpk_free(F->X.ctx, M2);
        tpk_free(F->X.ctx, mean);
        return ready ? nsr_fam_err(&F->X, st, NULL, "%s", F->X.ctx->msg) : F->X.ctx->status;
    }
    F->err = fmax(F->err, e);
    b->M2 = M2;
    b->mean = mean;
    b->lower = zero_mean;
    return TPK_OK;
}

/* E[φ(u) ψ(u)ᵀ] of two functions of one Gaussian block u, entry by entry, into *bufp (made
 * here where it is NULL); NULL with *st on failure. */
static const double *pair_two_maps(fl *F, const fblock *bx, const fblock *by, double **bufp,
                                   int *st)
{
    if (block_m2_full(F, bx->arg) == NULL) {
        *st = F->X.ctx->status ? F->X.ctx->status : TPK_ENOMEM;
        return NULL;
    }
    const fblock *u = &F->b[bx->arg];
    size_t n = F->N * (size_t)bx->m;
    if (nsr_fl_ensure_ws(F)) {
        *st = F->X.ctx->status;
        return NULL;
    }
    double *buf = *bufp ? *bufp : (*bufp = nsr_fam_alloc(&F->X, n * n, sizeof *buf));
    if (buf == NULL) {
        *st = F->X.ctx->status;
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            double mi = u->mean ? u->mean[i] : 0, mj = u->mean ? u->mean[j] : 0;
            tpk_estimate r;
            if ((*st = tpk_gauss_expect2_quad(bx->phi, by->phi, mi, mj, u->M2[i * n + i] - mi * mi,
                                              u->M2[j * n + j] - mj * mj,
                                              u->M2[i * n + j] - mi * mj, F->ws, &r, F->X.ctx)))
                return NULL;
            buf[i * n + j] = r.value;
            F->err = fmax(F->err, r.err);
        }
    return buf;
}

/* E[X Yᵀ] = E[X] E[Y]ᵀ of independent blocks into *bufp (made here where it is NULL); NULL with
 * *zero = 1 where a mean is zero, or with *st on failure. */
static const double *pair_means(fl *F, int x, int y, double **bufp, int *zero, int *st)
{
    const double *mx = block_mean(F, x), *my = block_mean(F, y);
    if (F->X.ctx->status) {
        *st = F->X.ctx->status;
        return NULL;
    }
    if (mx == NULL || my == NULL) {
        *zero = 1;
        return NULL;
    }
    size_t nx = F->N * (size_t)F->b[x].m, ny = F->N * (size_t)F->b[y].m;
    double *buf = *bufp ? *bufp : (*bufp = nsr_fam_alloc(&F->X, nx * ny, sizeof *buf));
    if (buf == NULL) {
        *st = F->X.ctx->status;
        return NULL;
    }
    for (size_t i = 0; i < nx; i++)
        for (size_t j = 0; j < ny; j++)
            buf[i * ny + j] = mx[i] * my[j];
    return buf;
}

/* P = E[X Yᵀ] for blocks x ≠ y or x = y, as (N m_x) × (N m_y) with leading dimension N m_y:
 * a pointer into the store (x = y: both triangles with full, else maybe the lower one), or buf
 * filled (two maps of one block, or independent blocks' means). NULL with *st set on failure;
 * *zero = 1 when P = 0 (independent, zero means). indep: known independent at the member level
 * (nsr_fl_terms_indep). Correlated blocks of other kinds are refused. */
static const double *pair_m2(fl *F, int x, int y, double **bufp, int *zero, int *st, int full,
                             int indep)
{
    *zero = 0;
    *st = TPK_OK;
    nsr_fl_touch(F, x);
    nsr_fl_touch(F, y);
    if (x == y) {
        const double *M = full ? block_m2_full(F, x) : nsr_fl_block_m2(F, x);
        if (M == NULL && !F->dry)
            *st = F->X.ctx->status ? F->X.ctx->status : TPK_ENOMEM;
        return M;
    }
    const fblock *bx = &F->b[x], *by = &F->b[y];
    if (!indep && nsr_fl_correlated(bx, by)) {
        if (bx->kind == BK_NONLIN && by->kind == BK_NONLIN && bx->arg == by->arg)
            return F->dry ? NULL : pair_two_maps(F, bx, by, bufp, st);
        *st = NSR_UNSUP(&F->X, NULL, "correlated terms of different kinds (line %d and line %d) "
                        "in one expectation", bx->line, by->line);
        return NULL;
    }
    return F->dry ? NULL : pair_means(F, x, y, bufp, zero, st);
}

/* E[u] of a LIN value: mu + Σ_t C_t E[X_t]; N·m into out. */
int nsr_fl_lin_mean(fl *F, const val *u, double *out, int *nonzero)
{
    size_t N = F->N, m = (size_t)u->m;
    *nonzero = u->mu != NULL;
    for (size_t i = 0; i < N * m; i++)
        out[i] = u->mu ? u->mu[i] : 0;
    for (int k = 0; k < u->nt; k++) {
        const term *t = &u->t[k];
        const double *mx = block_mean(F, t->blk);
        if (F->X.ctx->status)
            return F->X.ctx->status;
        if (mx == NULL)
            continue;
        *nonzero = 1;
        size_t ms = (size_t)F->b[t->blk].m;
        for (size_t a = 0; a < N; a++)
            for (size_t p = 0; p < m; p++) {
                double acc = 0;
                if (t->dense) {
                    const double *row = t->w + (a * m + p) * ms;
                    for (size_t q = 0; q < ms; q++)
                        acc += row[q] * mx[a * ms + q];
                } else if (t->idx[p] >= 0) {
                    acc = (t->w ? t->w[a * m + p] : 1) * mx[a * ms + (size_t)t->idx[p]];
                }
                out[a * m + p] += acc;
            }
    }
    return TPK_OK;
}

/* One term pair of E[u vᵀ]: t of u (mu points, on a block of mt members) against s of v (mv
 * points, ms members), added into out (row stride ld) times alpha. sym: u = v, and only the lower
 * triangle counts; twice: the pair stands for both (i, j) and (j, i) of a symmetric product. */
typedef struct term_pair {
    const term *t, *s;
    size_t mu, mv, mt, ms;
    double *out;
    size_t ld;
    int sym, twice;
    double alpha;
} term_pair;

/* Members of one initial G-var family: E[b_i b_j] = var_i δ_ij + μ_i μ_j, shared by all inputs
 * (theory §1.2), without the (N m)² matrix. self: t and s are one term. */
static int pair_bias(fl *F, const term_pair *Q, int self)
{
    const term *t = Q->t, *s = Q->s;
    size_t N = F->N, mu = Q->mu, mv = Q->mv, ld = Q->ld;
    double *out = Q->out, alpha = Q->alpha;
    nsr_fl_touch(F, t->blk);
    if (F->dry)
        return TPK_OK;
    const fblock *bb = &F->b[t->blk];
    int same = self && t->w == NULL && mu > 0 && t->idx[0] >= 0;
    for (size_t p = 1; same && p < mu; p++)
        same = t->idx[p] == t->idx[0];
    if (same && Q->sym) { /* one member broadcast to every point: a constant */
        size_t i0 = (size_t)t->idx[0];
        double cst = alpha * (bb->s[i0] + (bb->mean ? bb->mean[i0] * bb->mean[i0] : 0));
        size_t n = N * mu;
        /* a pass over the triangle per layer, spread over the threads: on one it was a tenth
         * of an MLP's run at N = 2048 */
#pragma omp parallel for schedule(dynamic, 64) if (n >= 512)
        for (size_t r = 0; r < n; r++) {
            double *orow = out + r * ld;
            for (size_t q = 0; q <= r; q++)
                orow[q] += cst;
        }
        return TPK_OK;
    }
    for (int pass = 0; pass < 1 + Q->twice; pass++) {
        const term *x = pass ? s : t, *y = pass ? t : s;
        for (size_t a = 0; a < N; a++)
            for (size_t p = 0; p < mu; p++) {
                int ip = x->idx[p];
                if (ip < 0)
                    continue;
                double wp = alpha * (x->w ? x->w[a * mu + p] : 1);
                double mi = bb->mean ? bb->mean[(size_t)ip] : 0;
                double *orow = out + (a * mu + p) * ld;
                size_t cmax = Q->sym ? a + 1 : N;
                for (size_t c = 0; c < cmax; c++) {
                    size_t qmax = Q->sym && c == a ? p + 1 : mv;
                    const double *wy = y->w ? y->w + c * mv : NULL;
                    for (size_t q = 0; q < qmax; q++) {
                        int iq = y->idx[q];
                        if (iq < 0)
                            continue;
                        double e = (iq == ip ? bb->s[ip] : 0) +
                                   (bb->mean ? mi * bb->mean[(size_t)iq] : 0);
                        orow[c * mv + q] += wp * (wy ? wy[q] : 1) * e;
                    }
                }
            }
    }
    return TPK_OK;
}

/* A term against itself on a factor block: C·E[X Xᵀ]·Cᵀ = (C Fac)(C Fac)ᵀ, one rank-r update of
 * the lower triangle. */
static int pair_factor(fl *F, const term_pair *Q)
{
    long r = 0;
    double *G = nsr_fl_term_factor(F, Q->t, Q->mu, 1.0, &r);
    if (G == NULL)
        return F->X.ctx->status ? F->X.ctx->status : TPK_ENOMEM;
    nsr_fl_touch(F, Q->t->blk);
    int st = tpk_dsyrk_lower(TPK_NO_TRANS, F->N * Q->mu, (size_t)r, Q->alpha, G, (size_t)r, 1.0,
                             Q->out, Q->ld, F->X.ctx);
    tpk_free(F->X.ctx, G);
    return st;
}

/* Two gathers: out[(a,p),(c,q)] += w_t w_s P[(a, t_p), (c, s_q)], P = E[X Yᵀ] of their blocks
 * (row stride N ms). */
static void pair_gathers(fl *F, const term_pair *Q, const double *P)
{
    const term *t = Q->t, *s = Q->s;
    size_t N = F->N, mu = Q->mu, mv = Q->mv, mt = Q->mt, ms = Q->ms, ld = Q->ld, ldp = N * ms;
    double *out = Q->out, alpha = Q->alpha;
    int sym = Q->sym;
    /* s reading its block in order (s->idx[q] = q): contiguous, vectorised rows */
    int sid = mv <= ms;
    for (size_t q = 0; q < mv && sid; q++)
        sid = s->idx[q] == (int)q;
#pragma omp parallel for schedule(dynamic, 16) if (N * mu >= 1024 && N * mu * mv >= (1u << 20))
    for (size_t r = 0; r < N * mu; r++) {
        size_t a = r / mu, p = r % mu;
        int ip = t->idx[p];
        if (ip < 0)
            continue;
        double wp = alpha * (t->w ? t->w[a * mu + p] : 1);
        const double *Prow = P + (a * mt + (size_t)ip) * ldp;
        double *orow = out + (a * mu + p) * ld;
        size_t cmax = sym ? a + 1 : N;
        for (size_t c = 0; c < cmax; c++) {
            size_t qmax = sym && c == a ? p + 1 : mv;
            const double *Pc = Prow + c * ms;
            const double *ws = s->w ? s->w + c * mv : NULL;
            double *oc = orow + c * mv;
            if (sid && ws) {
                for (size_t q = 0; q < qmax; q++)
                    oc[q] += wp * ws[q] * Pc[q];
            } else if (sid) {
                for (size_t q = 0; q < qmax; q++)
                    oc[q] += wp * Pc[q];
            } else {
                for (size_t q = 0; q < qmax; q++) {
                    int iq = s->idx[q];
                    if (iq >= 0)
                        oc[q] += wp * (ws ? ws[q] : 1) * Pc[iq];
                }
            }
        }
    }
    if (!Q->twice)
        return;
    /* the transposed pair: out[(a,p),(c,q)] += C_s P' C_tᵀ */
    for (size_t a = 0; a < N; a++)
        for (size_t p = 0; p < mu; p++) {
            int ip = s->idx[p];
            if (ip < 0)
                continue;
            double wp = alpha * (s->w ? s->w[a * mu + p] : 1);
            double *orow = out + (a * mu + p) * ld;
            for (size_t c = 0; c <= a; c++) {
                size_t qmax = c == a ? p + 1 : mv;
                for (size_t q = 0; q < qmax; q++) {
                    int iq = t->idx[q];
                    if (iq >= 0)
                        orow[c * mv + q] += wp * (t->w ? t->w[c * mv + q] : 1) *
                                            P[(c * mt + (size_t)iq) * ldp + a * ms + (size_t)ip];
                }
            }
        }
}

/* A dense term: per input pair, out(a,c) += W_t(a) P(a,c) W_s(c)ᵀ by GEMM sandwiches (their
 * inner dimensions cut at each row's last non-zero), or by triangular products where the term
 * is against itself (self) with a lower-triangular map per input (causal attention). */
static int pair_dense(fl *F, const term_pair *Q, const double *P, int self)
{
    const term *t = Q->t, *s = Q->s;
    size_t N = F->N, mu = Q->mu, mv = Q->mv, mt = Q->mt, ms = Q->ms, ld = Q->ld, ldp = N * ms;
    double *out = Q->out, alpha = Q->alpha;
    int sym = Q->sym, twice = Q->twice, st = TPK_OK;
    double *Wt = nsr_fl_term_dense(F, t, mu), *Ws = nsr_fl_term_dense(F, s, mv);
    double *tmp = nsr_fam_alloc(&F->X, mu * ms, sizeof *tmp);
    if (Wt == NULL || Ws == NULL || tmp == NULL) {
        if (Wt != t->w)
            tpk_free(F->X.ctx, Wt);
        if (Ws != s->w)
            tpk_free(F->X.ctx, Ws);
        tpk_free(F->X.ctx, tmp);
        return F->X.ctx->status;
    }
    int *et = nsr_fam_alloc(&F->X, N * mu, sizeof *et);
    int *es = nsr_fam_alloc(&F->X, N * mv, sizeof *es);
    if (et == NULL || es == NULL)
        st = F->X.ctx->status;
    for (size_t a = 0; st == TPK_OK && a < N; a++) {
        nsr_fl_row_extents(Wt + a * mu * mt, mu, mt, et + a * mu);
        nsr_fl_row_extents(Ws + a * mv * ms, mv, ms, es + a * mv);
    }
    /* one term against itself with a lower-triangular map per input: triangular products */
    int triangular = st == TPK_OK && sym && self && mu == mt;
    for (size_t r = 0; triangular && r < N * mu; r++)
        triangular = (size_t)et[r] <= r % mu + 1;
    if (triangular)
        st = nsr_fl_tri_sandwich(F, Wt, mu, P, ldp, out, ld, alpha);
    for (size_t a = 0; a < N && st == TPK_OK && !triangular; a++)
        for (size_t c = 0; c < (sym ? a + 1 : N) && st == TPK_OK; c++) {
            const double *Pac = P + (a * mt) * ldp + c * ms;
            st = nsr_fl_sandwich(F, Wt + a * mu * mt, mu, mt, et + a * mu, Pac, ldp,
                                 Ws + c * mv * ms, mv, ms, es + c * mv,
                                 out + (a * mu) * ld + c * mv, ld, sym && a == c && !twice, tmp,
                                 alpha);
            if (st == TPK_OK && twice) { /* the transposed pair: W_s(a) · P(c,a)ᵀ · W_t(c)ᵀ */
                const double *Pca = P + (c * mt) * ldp + a * ms;
                double *tmp2 = nsr_fam_alloc(&F->X, mv * mt, sizeof *tmp2);
                if (tmp2 == NULL) {
                    st = F->X.ctx->status;
                    break;
                }
                st = tpk_dgemm(TPK_NO_TRANS, TPK_TRANS, mv, mt, ms, 1.0, Ws + a * mv * ms, ms,
                               Pca, ldp, 0.0, tmp2, mt, F->X.ctx);
                if (st == TPK_OK)
                    st = tpk_dgemm(TPK_NO_TRANS, TPK_TRANS, mv, mu, mt, alpha, tmp2, mt,
                                   Wt + c * mu * mt, mt, 1.0, out + (a * mu) * ld + c * mv, ld,
                                   F->X.ctx);
                tpk_free(F->X.ctx, tmp2);
            }
        }
    tpk_free(F->X.ctx, et), tpk_free(F->X.ctx, es);
    if (Wt != t->w)
        tpk_free(F->X.ctx, Wt);
    if (Ws != s->w)
        tpk_free(F->X.ctx, Ws);
    tpk_free(F->X.ctx, tmp);
    return st;
}

/* Term pair (i of u, j of v) of E[u vᵀ], by its kind: members of one initial G-var family, a
 * factor block against itself, else the pair's second moments P (pair_m2) read by two gathers
 * or sandwiched by dense maps. */
static int lin_m2_terms(fl *F, const val *u, const val *v, int i, int j, double *out, size_t ld,
                        int sym, double alpha)
{
    const term *t = &u->t[i], *s = &v->t[j];
    const term_pair Q = {t, s, (size_t)u->m, (size_t)v->m, (size_t)F->b[t->blk].m,
                         (size_t)F->b[s->blk].m, out, ld, sym, sym && i != j, alpha};
    if (t->blk == s->blk && F->b[t->blk].kind == BK_BIAS && !t->dense && !s->dense)
        return pair_bias(F, &Q, i == j);
    if (sym && i == j && !F->dry && F->b[t->blk].Fac != NULL && F->b[t->blk].M2 == NULL)
        return pair_factor(F, &Q);
    double *buf = NULL; /* pair_m2's, made only when it writes one */
    int zero, st;
    /* the lower triangle serves a symmetric identity pair: (a,p) ≥ (c,q) reads only it */
    int full = !(sym && i == j && !t->dense && nsr_fl_monotone(t->idx, Q.mu));
    int indep = t->blk != s->blk && nsr_fl_terms_indep(F, t, u->m, s, v->m);
    const double *P = pair_m2(F, t->blk, s->blk, &buf, &zero, &st, full, indep);
    if (st == TPK_OK && !F->dry && !zero) {
        if (!t->dense && !s->dense)
            pair_gathers(F, &Q, P);
        else
            st = pair_dense(F, &Q, P, i == j);
    }
    tpk_free(F->X.ctx, buf);
    return st;
}

/* The mean terms of E[u vᵀ] = E[LLᵀ] + μ_u m_vᵀ + m_u μ_vᵀ − μ_u μ_vᵀ (m = full first moment);
 * none when both constant parts vanish (LN's g − mean(g) of a centred g). */
static int lin_m2_means(fl *F, const val *u, const val *v, double *out, size_t ld, int sym,
                        double alpha)
{
    size_t N = F->N, mu = (size_t)u->m, mv = (size_t)v->m;
    if (nsr_fl_all_zero(u->mu, N * mu) && nsr_fl_all_zero(v->mu, N * mv))
        return TPK_OK;
    double *mU = nsr_fam_alloc(&F->X, N * mu, sizeof *mU);
    double *mV = nsr_fam_alloc(&F->X, N * mv, sizeof *mV);
    int nz;
    if (mU == NULL || mV == NULL || nsr_fl_lin_mean(F, u, mU, &nz) ||
        nsr_fl_lin_mean(F, v, mV, &nz)) {
        tpk_free(F->X.ctx, mU), tpk_free(F->X.ctx, mV);
        return F->X.ctx->status;
    }
#pragma omp parallel for schedule(dynamic, 16) if (N * mu >= 1024)
    for (size_t i = 0; i < N * mu; i++)
        for (size_t j = 0; j < (sym ? i + 1 : N * mv); j++) {
            double a = u->mu ? u->mu[i] : 0, b = v->mu ? v->mu[j] : 0;
            out[i * ld + j] += alpha * (a * mV[j] + mU[i] * b - a * b);
        }
    tpk_free(F->X.ctx, mU), tpk_free(F->X.ctx, mV);
    return TPK_OK;
}

/* out (N mu × N mv, ld) += alpha·(Σ_{t,s} C_t E[X_t X_sᵀ] C_sᵀ + mean terms) = alpha·E[u vᵀ] for
 * LIN values, term pair by term pair. sym: u = v, and only the lower triangle needs to be right
 * (it is mirrored). In the plan, the same walk without numbers: it touches the terms' blocks and
 * checks support. */
int nsr_fl_lin_m2(fl *F, const val *u, const val *v, double *out, size_t ld, int sym,
                  double alpha)
{
    int st = TPK_OK;
    for (int i = 0; i < u->nt && st == TPK_OK; i++)
        for (int j = 0; j < v->nt && st == TPK_OK; j++)
            if (!(sym && j > i)) /* the (j, i) pair is the transpose of (i, j): added with it */
                st = lin_m2_terms(F, u, v, i, j, out, ld, sym, alpha);
    if (st || F->dry)
        return st;
    return lin_m2_means(F, u, v, out, ld, sym, alpha);
}

/* Gathers t, s (m points) of one block that read the same member at each point (or none). */
static int same_members(const term *t, const term *s, size_t m)
{
    int same = t->blk == s->blk && !t->dense && !s->dense;
    for (size_t p = 0; same && p < m; p++)
        same = t->idx[p] < 0 || s->idx[p] < 0 || t->idx[p] == s->idx[p];
    return same;
}

/* The weight of gather t at input a, point p (NULL weights: 1). */
static inline double gather_w(const term *t, size_t m, size_t a, size_t p)
{
    return t->w ? t->w[a * m + p] : 1;
}

/* A pending block's diagonal is there: no matrix for a moment (LayerNorm's v). */
static void diag_pending(fl *F, const term *t, const term *s, size_t m, double *out)
{
    size_t N = F->N, mt = (size_t)F->b[t->blk].m;
    nsr_fl_touch(F, t->blk);
    const double *dg = F->b[t->blk].pend->diag;
    for (size_t a = 0; a < N; a++)
        for (size_t p = 0; p < m; p++)
            if (t->idx[p] >= 0 && s->idx[p] >= 0)
                out[a * m + p] += gather_w(t, m, a, p) * gather_w(s, m, a, p) *
                                  dg[a * mt + (size_t)t->idx[p]];
}

/* Initial G-var members: E[b_i b_j] = var_i δ_ij + μ_i μ_j (as nsr_fl_lin_m2), not the block's
 * (N m)² matrix. */
static void diag_bias(fl *F, const term *t, const term *s, size_t m, double *out)
{
    const fblock *bf = &F->b[t->blk];
    nsr_fl_touch(F, t->blk);
    for (size_t a = 0; !F->dry && a < F->N; a++)
        for (size_t p = 0; p < m; p++) {
            int i1 = t->idx[p], i2 = s->idx[p];
            if (i1 < 0 || i2 < 0)
                continue;
            double e = (i1 == i2 ? bf->s[i1] : 0) + (bf->mean ? bf->mean[i1] * bf->mean[i2] : 0);
            out[a * m + p] += gather_w(t, m, a, p) * gather_w(s, m, a, p) * e;
        }
}

/* Entries of a factor block: dot products of its rows. */
static void diag_factor(fl *F, const term *t, const term *s, size_t m, double *out)
{
    const fblock *bf = &F->b[t->blk];
    size_t mt = (size_t)bf->m, r = (size_t)bf->rank;
    nsr_fl_touch(F, t->blk);
    for (size_t a = 0; a < F->N; a++)
        for (size_t p = 0; p < m; p++) {
            if (t->idx[p] < 0 || s->idx[p] < 0)
                continue;
            const double *x = bf->Fac + (a * mt + (size_t)t->idx[p]) * r;
            const double *y = bf->Fac + (a * mt + (size_t)s->idx[p]) * r;
            double acc = 0;
            for (size_t q = 0; q < r; q++)
                acc += x[q] * y[q];
            out[a * m + p] += gather_w(t, m, a, p) * gather_w(s, m, a, p) * acc;
        }
}

/* Any other pair: entries of the pair's second moments (pair_m2), through dense maps or at the
 * gathered members. */
static int diag_pair(fl *F, const val *u, const val *v, const term *t, const term *s,
                     double *out)
{
    size_t N = F->N, m = (size_t)u->m, mt = (size_t)F->b[t->blk].m, ms = (size_t)F->b[s->blk].m;
    double *buf = NULL; /* pair_m2's, made only when it writes one */
    int zero, st;
    /* two gathers of one block read entries (a, i), (a, j): the lower triangle holds them as
     * (a, max), (a, min), so a lower-stored block need not be mirrored */
    int lower_ok = t->blk == s->blk && !t->dense && !s->dense;
    int indep = t->blk != s->blk && nsr_fl_terms_indep(F, t, u->m, s, v->m);
    const double *P = pair_m2(F, t->blk, s->blk, &buf, &zero, &st, !lower_ok, indep);
    if (st || F->dry || zero) {
        tpk_free(F->X.ctx, buf);
        return st;
    }
    size_t ldp = N * ms;
    double *Wt = (t->dense || s->dense) ? nsr_fl_term_dense(F, t, m) : NULL;
    double *Ws = (t->dense || s->dense) ? nsr_fl_term_dense(F, s, m) : NULL;
    for (size_t a = 0; a < N; a++)
        for (size_t p = 0; p < m; p++) {
            double acc = 0;
            if (Wt) {
                for (size_t q = 0; q < mt; q++) {
                    double wq = Wt[(a * m + p) * mt + q];
                    if (wq == 0)
                        continue;
                    const double *Prow = P + (a * mt + q) * ldp + a * ms;
                    for (size_t r = 0; r < ms; r++)
                        acc += wq * Prow[r] * Ws[(a * m + p) * ms + r];
                }
            } else if (t->idx[p] >= 0 && s->idx[p] >= 0) {
                size_t i1 = (size_t)t->idx[p], i2 = (size_t)s->idx[p];
                if (lower_ok && i2 > i1) { /* same block: ms = mt */
                    size_t tmpi = i1;
                    i1 = i2;
                    i2 = tmpi;
                }
                acc = gather_w(t, m, a, p) * gather_w(s, m, a, p) *
                      P[(a * mt + i1) * ldp + a * ms + i2];
            }
            out[a * m + p] += acc;
        }
    if (Wt && Wt != t->w)
        tpk_free(F->X.ctx, Wt);
    if (Ws && Ws != s->w)
        tpk_free(F->X.ctx, Ws);
    tpk_free(F->X.ctx, buf);
    return TPK_OK;
}

/* E[u_p v_p] at each input and point (same input, same member): N·m added into out, term pair
 * by term pair, then the mean terms (as nsr_fl_lin_m2's). */
int nsr_fl_diag_m2(fl *F, const val *u, const val *v, double *out)
{
    size_t N = F->N, m = (size_t)u->m;
    for (int i = 0; i < u->nt; i++)
        for (int j = 0; j < v->nt; j++) {
            const term *t = &u->t[i], *s = &v->t[j];
            const fblock *bf = &F->b[t->blk];
            int same = same_members(t, s, m);
            if (!F->dry && same && bf->pend != NULL) {
                diag_pending(F, t, s, m, out);
            } else if (t->blk == s->blk && bf->kind == BK_BIAS && !t->dense && !s->dense) {
                diag_bias(F, t, s, m, out);
            } else if (!F->dry && t->blk == s->blk && !t->dense && !s->dense && bf->Fac != NULL &&
                       bf->M2 == NULL) {
                diag_factor(F, t, s, m, out);
            } else {
                int st = diag_pair(F, u, v, t, s, out);
                if (st)
                    return st;
            }
        }
    if (F->dry || (u->mu == NULL && v->mu == NULL))
        return TPK_OK;
    double *mU = nsr_fam_alloc(&F->X, N * m, sizeof *mU);
    double *mV = nsr_fam_alloc(&F->X, N * m, sizeof *mV);
    int nz;
    if (mU == NULL || mV == NULL || nsr_fl_lin_mean(F, u, mU, &nz) ||
        nsr_fl_lin_mean(F, v, mV, &nz)) {
        tpk_free(F->X.ctx, mU), tpk_free(F->X.ctx, mV);
        return F->X.ctx->status;
    }
    for (size_t i = 0; i < N * m; i++) {
        double a = u->mu ? u->mu[i] : 0, b = v->mu ? v->mu[i] : 0;
        out[i] += a * mV[i] + mU[i] * b - a * b;
    }
    tpk_free(F->X.ctx, mU), tpk_free(F->X.ctx, mV);
    return TPK_OK;
}
