/* GEMM kernels of the rolled limit evaluator's linear maps: sandwiches C·P·Cᵀ in tiles, their
 * triangular form for causal maps, and low-rank factors carried through linear maps (theory
 * §2.7). */
#include "flimit-impl.h"
#include "tpk/alloc.h"
#include "tpk/matmul.h"

#include <string.h>

/* ext[p] = 1 + the last non-zero column of row p of W (m × n), 0 for a zero row. */
void nsr_fl_row_extents(const double *W, size_t m, size_t n, int *ext)
{
    for (size_t p = 0; p < m; p++) {
        size_t q = n;
        while (q > 0 && W[p * n + q - 1] == 0)
            q--;
        ext[p] = (int)q;
    }
}

#define SW_TILE 256 /* rows per GEMM tile of the sandwich */

/* out (mu × mv, ld) += Wt (mu × mt) · P (mt × ms, ldp) · Wsᵀ (Ws: mv × ms), by tpk_dgemm in
 * row tiles whose inner dimension stops at the tile's last non-zero column (a causal attention
 * matrix is lower triangular: about half the flops); lower: only q ≤ p of out is needed (a
 * diagonal block of a symmetric result). tmp: mu × ms. */
int nsr_fl_sandwich(fl *F, const double *Wt, size_t mu, size_t mt, const int *et, const double *P,
                    size_t ldp, const double *Ws, size_t mv, size_t ms, const int *es, double *out,
                    size_t ld, int lower, double *tmp, double alpha)
{
    int st = TPK_OK;
    for (size_t p0 = 0; p0 < mu && st == TPK_OK; p0 += SW_TILE) {
        size_t p1 = p0 + SW_TILE < mu ? p0 + SW_TILE : mu, K = 0;
        for (size_t p = p0; p < p1; p++)
            K = (size_t)et[p] > K ? (size_t)et[p] : K;
        if (K == 0) {
            memset(tmp + p0 * ms, 0, (p1 - p0) * ms * sizeof *tmp);
            continue;
        }
        st = tpk_dgemm(TPK_NO_TRANS, TPK_NO_TRANS, p1 - p0, ms, K, 1.0, Wt + p0 * mt, mt, P, ldp,
                       0.0, tmp + p0 * ms, ms, F->X.ctx);
    }
    for (size_t p0 = 0; p0 < mu && st == TPK_OK; p0 += SW_TILE) {
        size_t p1 = p0 + SW_TILE < mu ? p0 + SW_TILE : mu;
        size_t qend = lower ? p1 : mv;
        for (size_t q0 = 0; q0 < qend && st == TPK_OK; q0 += SW_TILE) {
            size_t q1 = q0 + SW_TILE < qend ? q0 + SW_TILE : qend, K = 0;
            for (size_t q = q0; q < q1; q++)
                K = (size_t)es[q] > K ? (size_t)es[q] : K;
            if (K == 0)
                continue;
            st = tpk_dgemm(TPK_NO_TRANS, TPK_TRANS, p1 - p0, q1 - q0, K, alpha, tmp + p0 * ms, ms,
                           Ws + q0 * ms, ms, 1.0, out + p0 * ld + q0, ld, F->X.ctx);
        }
    }
    return st;
}

/* out(a, c) += alpha · L_a · P(a, c) · L_cᵀ for every input pair c ≤ a, when each input's map
 * L_a (m × m) is lower triangular — causal attention's I + A (theory §2.7): the sandwich as two
 * triangular products per pair (tpk_dtrmm, half the flops of dense GEMMs, and large calls: the
 * left product covers P(a, 0..a) at once). P is the full (N m)² block, row stride ldp. */
int nsr_fl_tri_sandwich(fl *F, const double *L, size_t m, const double *P, size_t ldp, double *out,
                        size_t ld, double alpha)
{
    size_t N = F->N, bytes = m * N * m * sizeof(double);
    double *tmp = nsr_fl_big(F, m * N * m, sizeof *tmp, 0);
    if (tmp == NULL)
        return F->X.ctx->status;
    int st = TPK_OK;
    for (size_t a = 0; a < N && st == TPK_OK; a++) {
        size_t w = (a + 1) * m; /* P(a, c) for c ≤ a: the first w columns of rows a·m.. */
        for (size_t p = 0; p < m; p++)
            memcpy(tmp + p * w, P + (a * m + p) * ldp, w * sizeof *tmp);
        st = tpk_dtrmm(TPK_LEFT, TPK_LOWER, TPK_NO_TRANS, m, w, 1.0, L + a * m * m, m, tmp, w,
                       F->X.ctx);
        for (size_t c = 0; c <= a && st == TPK_OK; c++) {
            st = tpk_dtrmm(TPK_RIGHT, TPK_LOWER, TPK_TRANS, m, m, alpha, L + c * m * m, m,
                           tmp + c * m, w, F->X.ctx);
            if (st)
                break;
            int diag = c == a; /* a diagonal pair: its lower triangle is what is read */
#pragma omp parallel for schedule(static) if (m >= 256)
            for (size_t p = 0; p < m; p++) {
                const double *src = tmp + p * w + c * m;
                double *dst = out + (a * m + p) * ld + c * m;
                size_t qn = diag ? p + 1 : m;
                for (size_t q = 0; q < qn; q++)
                    dst[q] += src[q];
            }
        }
    }
    nsr_fl_release(F, tmp, bytes);
    return st;
}

/* C·Fac for one term on a factor block (theory §2.7: a Gram of rank d stays rank d through
 * linear maps), (N m) × rank, times scale: a gather picks and weights rows; a dense map
 * multiplies each input's rows (tpk_dtrmm when it is lower triangular, as causal attention's
 * I + A). NULL when the block has no factor, or on error (ctx set). */
double *nsr_fl_term_factor(fl *F, const term *t, size_t m, double scale, long *rank)
{
    const fblock *b = &F->b[t->blk];
    if (b->kind != BK_GAUSS || b->Fac == NULL || b->mean != NULL)
        return NULL;
    size_t N = F->N, ms = (size_t)b->m, r = (size_t)b->rank;
    double *G = nsr_fam_alloc(&F->X, N * m * r, sizeof *G);
    if (G == NULL)
        return NULL;
    int st = TPK_OK;
    for (size_t a = 0; a < N && st == TPK_OK; a++) {
        const double *Fa = b->Fac + a * ms * r;
        double *Ga = G + a * m * r;
        if (!t->dense) {
            for (size_t p = 0; p < m; p++)
                if (t->idx[p] >= 0) {
                    double w = scale * (t->w ? t->w[a * m + p] : 1);
                    const double *src = Fa + (size_t)t->idx[p] * r;
                    for (size_t q = 0; q < r; q++)
                        Ga[p * r + q] = w * src[q];
                }
            continue;
        }
        const double *W = t->w + a * m * ms;
        int tri = m == ms;
        for (size_t p = 0; p < m && tri; p++)
            for (size_t q = p + 1; q < ms && tri; q++)
                tri = W[p * ms + q] == 0;
        if (tri) {
            memcpy(Ga, Fa, m * r * sizeof *Ga);
            st = tpk_dtrmm(TPK_LEFT, TPK_LOWER, TPK_NO_TRANS, m, r, scale, W, ms, Ga, r, F->X.ctx);
        } else {
            st = tpk_dgemm(TPK_NO_TRANS, TPK_NO_TRANS, m, r, ms, scale, W, ms, Fa, r, 0.0, Ga, r,
                           F->X.ctx);
        }
    }
    if (st) {
        tpk_free(F->X.ctx, G);
        return NULL;
    }
    *rank = b->rank;
    return G;
}

/* The factor of a value that is one term on a factor block with no constant part: 1 (and *G),
 * 0 when it is not, −1 on error. */
int nsr_fl_factor_of(fl *F, const val *u, double scale, double **G, long *rank)
{
    *G = NULL;
    if (F->dry || u->kind != V_LIN || u->nt != 1 || !nsr_fl_all_zero(u->mu, F->N * (size_t)u->m))
        return 0;
    const fblock *b = &F->b[u->t[0].blk];
    if (b->Fac == NULL || (size_t)b->rank * FAC_RATIO > F->N * (size_t)u->m)
        return 0;
    *G = nsr_fl_term_factor(F, &u->t[0], (size_t)u->m, scale, rank);
    if (*G == NULL)
        return F->X.ctx->status ? -1 : 0;
    nsr_fl_touch(F, u->t[0].blk);
    return 1;
}

/* The upper triangle of each m×m diagonal block of an (N·m)² matrix from its lower one. */
void nsr_fl_mirror_diagonal_blocks(double *M, size_t N, size_t m)
{
    const size_t n = N * m;
#pragma omp parallel for schedule(dynamic, 32) if (n > 512)
    for (size_t r = 0; r < n; r++) {
        size_t a = r / m, i = r % m;
        for (size_t j = i + 1; j < m; j++)
            M[r * n + a * m + j] = M[(a * m + j) * n + r];
    }
}
