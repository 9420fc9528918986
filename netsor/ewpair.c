/* Pair-local programs: entrywise programs with convolution taps, run one input pair at a time
 * (ewplan-impl.h, docs/orchestration.md §7.1).
 *
 * Entry ((a, p), (c, q)) of a convolution's second moments reads entries ((a, p + t), (c, q + t))
 * of its source, one shift t for both sides (theory §2.8): every entry of input pair (a, c)'s
 * m × m block depends on that pair's blocks of the program's leaves alone, and on diagonals. So
 * where the program under a root holds a convolution, its unit of work is the pair block rather
 * than the row segment: each thread takes pairs (a, c ≤ a) and runs every node of the program
 * over the pair's blocks in m × m buffers — a CNN's layers, map, taps and bias, from the input
 * Gram to the readout, as kernels/cnn.c's direct recursion does — and writes the root's block
 * (or reduces it, for a pooled readout). Nothing of size (N m)² is made between the leaves and
 * the root. The diagonals the maps need are the nodes' own (nsr_ew_diag), made beforehand: a
 * convolution's diagonal is its source's diagonal summed over the taps, so they close without
 * any off-diagonal block. */
#include "ewplan-impl.h"

#include "tpk/alloc.h"
#include "tpk/array.h"
#include "tpk/clock.h"
#include "tpk/cnn.h"

#include <math.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* Rows of a pair's block a pooled readout maps and sums at once (their map stays in L2). */
#define RED_ROWS 32

static int thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* The status st of ctx again, its message prefixed with the node's statement (copied first: the
 * message is written into the buffer it is read from). Here, below ewplan.c, which calls it
 * too (a module's files call downward only). */
int nsr_ew_named(tpk_ctx *ctx, int st, const char *file, const nsr_ew_node *nd)
{
    char msg[sizeof ctx->msg];
    memcpy(msg, ctx->msg, sizeof msg);
    msg[sizeof msg - 1] = 0;
    st = st ? st : TPK_ENOMEM;
    tpk_ctx_clear(ctx); /* the first error stands otherwise */
    if (file != NULL && nd->line > 0)
        return TPK_ERROR(ctx, st, "%s:%d:%d: %s", file, nd->line, nd->col, msg);
    return TPK_ERROR(ctx, st, "%s: %s", nd->name, msg);
}

int nsr_ew_pairwise(const nsr_ew_node *node, int root)
{
    for (int k = 0; k <= root; k++)
        if (node[k].op == NSR_EW_CONV || (node[k].op == NSR_EW_LEAF && node[k].M == NULL))
            return 1;
    return 0;
}

/* Where the program stands for a pair: each needed node's buffer slot (an identity sum shares
 * its argument's), and the slots' count. */
typedef struct pplan {
    char *need;
    int *rep;   /* node → the node whose buffer holds its block (itself, or an identity's arg) */
    int *slot;  /* rep node → buffer slot */
    int nslots;
    int nconv;  /* distinct convolution grids */
    int *grid;  /* CONV node → its grid's index */
    char *lazy; /* not made: an inputs' Gram leaf read only by first layers (which read the
                 * inputs), a first layer read only by the next layer's map (fuse) */
    int *fuse;  /* CONV with a map → the first layer it makes plane by plane (−1: none) */
} pplan;

/* A convolution that reads the inputs themselves: taps of an inputs' Gram leaf, no map. */
static int first_layer(const nsr_ew_node *node, const pplan *P, int k)
{
    const nsr_ew_node *src = &node[P->rep[node[k].arg]];
    return node[k].op == NSR_EW_CONV && node[k].phi == NULL && src->op == NSR_EW_LEAF &&
           src->M == NULL;
}

/* A sum that is its one argument: one term 1·x, the others biases of variance 0. */
static int identity_of(const nsr_ew_node *nd, long m)
{
    if (nd->op != NSR_EW_SUM)
        return -1;
    int arg = -1;
    for (int t = 0; t < nd->nt; t++) {
        const nsr_ew_term *T = &nd->t[t];
        if (T->arg >= 0) {
            if (T->c != 1.0 || T->w != NULL || arg >= 0)
                return -1;
            arg = T->arg;
        } else {
            for (long p = 0; p < m && T->c != 0.0; p++)
                if (T->s[p] != 0.0)
                    return -1;
        }
    }
    return arg;
}

static int same_grid(const nsr_ew_node *a, const nsr_ew_node *b)
{
    return a->rows == b->rows && a->cols == b->cols && a->kh == b->kh && a->kw == b->kw &&
           a->pad == b->pad;
}

static int nargs(const nsr_ew_node *nd)
{
    return nd->op == NSR_EW_PHI || nd->op == NSR_EW_CONV ? 1 : nd->op == NSR_EW_SUM ? nd->nt : 0;
}
static int argof(const nsr_ew_node *nd, int t)
{
    return nd->op == NSR_EW_SUM ? nd->t[t].arg : nd->arg;
}

static int pplan_make(const nsr_ew_node *node, int nn, int root, long m, pplan *P, tpk_ctx *ctx)
{
    memset(P, 0, sizeof *P);
    P->need = tpk_calloc(ctx, (size_t)nn, 1);
    P->rep = tpk_calloc(ctx, (size_t)nn, sizeof *P->rep);
    P->slot = tpk_calloc(ctx, (size_t)nn, sizeof *P->slot);
    P->grid = tpk_calloc(ctx, (size_t)nn, sizeof *P->grid);
    P->lazy = tpk_calloc(ctx, (size_t)nn, 1);
    P->fuse = tpk_calloc(ctx, (size_t)nn, sizeof *P->fuse);
    int *last = tpk_calloc(ctx, (size_t)nn, sizeof *last);
    int *busy = tpk_calloc(ctx, (size_t)nn + 1, sizeof *busy); /* slot → in use */
    int *nread = tpk_calloc(ctx, (size_t)nn, sizeof *nread);
    if (!P->need || !P->rep || !P->slot || !P->grid || !P->lazy || !P->fuse || !last || !busy ||
        !nread) {
        tpk_free(ctx, last);
        tpk_free(ctx, busy);
        tpk_free(ctx, nread);
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    }
    P->need[root] = 1;
    for (int k = root; k >= 0; k--)
        for (int t = 0; P->need[k] && t < nargs(&node[k]); t++)
            if (argof(&node[k], t) >= 0)
                P->need[argof(&node[k], t)] = 1;
    for (int k = 0; k <= root; k++) {
        int a = identity_of(&node[k], m);
        P->rep[k] = a >= 0 ? P->rep[a] : k;
        last[k] = -1;
    }
    for (int k = 0; k <= root; k++) /* Gram leaves: lazy until a reader needs their block */
        P->lazy[k] = node[k].op == NSR_EW_LEAF && node[k].M == NULL && P->rep[root] != k;
    for (int k = 0; k <= root; k++) {
        P->fuse[k] = -1;
        for (int t = 0; P->need[k] && P->rep[k] == k && t < nargs(&node[k]); t++)
            if (argof(&node[k], t) >= 0)
                nread[P->rep[argof(&node[k], t)]]++;
    }
    for (int k = 0; k <= root; k++) { /* a first layer under the next layer's map */
        const int f = node[k].op == NSR_EW_CONV && node[k].phi != NULL ? P->rep[node[k].arg] : -1;
        if (P->need[k] && P->rep[k] == k && f >= 0 && first_layer(node, P, f) &&
            nread[f] == 1 && f != P->rep[root] && same_grid(&node[f], &node[k])) {
            P->fuse[k] = f;
            P->lazy[f] = 1;
        }
    }
    for (int k = 0; k <= root; k++) /* the last reader of each buffer */
        for (int t = 0; P->need[k] && P->rep[k] == k && !P->lazy[k] && t < nargs(&node[k]);
             t++) {
            int a = argof(&node[k], t) >= 0 ? P->rep[argof(&node[k], t)] : -1;
            if (a < 0 || first_layer(node, P, k) || P->fuse[k] == a)
                continue;
            last[a] = k;
            P->lazy[a] = 0;
        }
    last[P->rep[root]] = nn; /* written out at the end */
    for (int k = 0; k <= root; k++) {
        P->slot[k] = -1;
        if (!P->need[k] || P->rep[k] != k || P->lazy[k])
            continue;
        int s = 0; /* a free slot; the arguments' are freed after the node (no aliasing) */
        while (busy[s])
            s++;
        busy[s] = 1;
        P->slot[k] = s;
        P->nslots = s + 1 > P->nslots ? s + 1 : P->nslots;
        for (int t = 0; t < nargs(&node[k]); t++) {
            int a = argof(&node[k], t) >= 0 ? P->rep[argof(&node[k], t)] : -1;
            if (a >= 0 && last[a] == k && P->slot[a] >= 0)
                busy[P->slot[a]] = 0;
        }
        if (last[k] < 0) /* read by nothing needed (cannot happen under root) */
            busy[s] = 0;
    }
    for (int k = 0; k <= root; k++) { /* the grids, one workspace each (lazy layers too) */
        if (node[k].op != NSR_EW_CONV || !P->need[k] || P->rep[k] != k)
            continue;
        int gi = 0;
        while (gi < k && !(node[gi].op == NSR_EW_CONV && P->need[gi] && P->rep[gi] == gi &&
                           same_grid(&node[gi], &node[k])))
            gi++;
        P->grid[k] = gi < k ? P->grid[gi] : P->nconv++;
    }
    tpk_free(ctx, last);
    tpk_free(ctx, busy);
    tpk_free(ctx, nread);
    return TPK_OK;
}

static void pplan_free(pplan *P, tpk_ctx *ctx)
{
    tpk_free(ctx, P->need);
    tpk_free(ctx, P->rep);
    tpk_free(ctx, P->slot);
    tpk_free(ctx, P->grid);
    tpk_free(ctx, P->lazy);
    tpk_free(ctx, P->fuse);
}

/* One thread's buffers: slots, the map scratch of convolutions, and a convolution workspace per
 * grid. */
typedef struct pws {
    double *buf;
    double *tmp;
    tpk_cnn_convws **cv;  /* per grid: taps alone */
    tpk_cnn_layerws **lw; /* per grid: a map and its taps, streamed (kernels/cnn.c) */
} pws;

void nsr_pair_block(const double *M, int lower, const double *x, size_t d, size_t n, size_t m,
                    size_t a, size_t c, double *y)
{
    if (M == NULL) { /* the inputs' Gram, ⟨x_ap, x_cq⟩/d */
        const double *xa = x + a * m * d, *xc = x + c * m * d;
        for (size_t p = 0; p < m; p++)
            for (size_t q = 0; q < m; q++) {
                double g = 0;
                for (size_t k = 0; k < d; k++)
                    g += xa[p * d + k] * xc[q * d + k];
                y[p * m + q] = g / (double)d;
            }
        return;
    }
    for (size_t p = 0; p < m; p++)
        memcpy(y + p * m, M + (a * m + p) * n + c * m, (lower && a == c ? p + 1 : m) * sizeof *y);
    if (lower && a == c) /* a diagonal block of a matrix stored as its lower triangle */
        for (size_t p = 0; p < m; p++)
            for (size_t q = 0; q < p; q++)
                y[q * m + p] = y[p * m + q];
}

/* Pair (a, c): every needed node of the program in order; the root's block ends in its slot.
 * Map failures return their status with the message in lc; *e the maps' largest error. */
static int run_pair(const nsr_ew_node *node, int root, const pplan *P, size_t n, size_t m,
                    const tpk_gauss_ws *ws, pws *w, size_t a, size_t c, double *e, int *where,
                    tpk_ctx *lc)
{
    const size_t mm = m * m;
    for (int k = 0; k <= root; k++) {
        const nsr_ew_node *nd = &node[k];
        if (!P->need[k] || P->rep[k] != k || P->lazy[k])
            continue;
        double *y = w->buf + (size_t)P->slot[k] * mm;
        const double *x = nd->op == NSR_EW_LEAF || nd->op == NSR_EW_SUM ||
                                  first_layer(node, P, k) || P->fuse[k] >= 0
                              ? NULL
                              : w->buf + (size_t)P->slot[P->rep[nd->arg]] * mm;
        double em = 0;
        int st = TPK_OK;
        *where = k;
        switch (nd->op) {
        case NSR_EW_LEAF:
            nsr_pair_block(nd->M, 1, nd->x, nd->d, n, m, a, c, y); /* lower triangles only */
            break;
        case NSR_EW_PHI: {
            const double *q = node[nd->arg].diag;
            st = tpk_gauss_map_cross(nd->phi, q + a * m, m, q + c * m, m, x, y, ws, &em, lc);
            if (nd->alpha != 1.0 || nd->beta != 0.0)
                tpk_gauss_seg_affine(mm, nd->alpha, nd->beta, y);
            em *= fabs(nd->alpha);
            break;
        }
        case NSR_EW_CONV:
            if (nd->phi != NULL) { /* map and taps plane by plane, as a CNN layer */
                const double *q = node[nd->arg].diag;
                if (P->fuse[k] >= 0) { /* its source, the first layer, made as it maps it */
                    const nsr_ew_node *f = &node[P->fuse[k]], *lf = &node[P->rep[f->arg]];
                    st = tpk_cnn_layer_first(w->lw[P->grid[k]], lf->x + a * m * lf->d,
                                             lf->x + c * m * lf->d, lf->d, f->alpha, 0.0, NULL,
                                             lc);
                }
                if (st == TPK_OK)
                    st = tpk_cnn_layer_apply(w->lw[P->grid[k]], nd->phi, q + a * m, q + c * m,
                                             nd->alpha, 0.0, x, y, ws, &em, lc);
                em *= fabs(nd->alpha) * nd->kh * nd->kw; /* each entry sums kh·kw mapped ones */
            } else if (first_layer(node, P, k)) {
                /* the first layer: the taps of the inputs' Gram as one product of patches */
                const nsr_ew_node *lf = &node[P->rep[nd->arg]];
                st = tpk_cnn_layer_first(w->lw[P->grid[k]], lf->x + a * m * lf->d,
                                         lf->x + c * m * lf->d, lf->d, nd->alpha, 0.0, y, lc);
            } else {
                tpk_cnn_convws_apply(w->cv[P->grid[k]], nd->alpha, 0.0, x, y);
            }
            break;
        default: /* NSR_EW_SUM */
            memset(y, 0, mm * sizeof *y);
            for (int t = 0; t < nd->nt; t++) {
                const nsr_ew_term *T = &nd->t[t];
                if (T->arg >= 0) {
                    const double *xt = w->buf + (size_t)P->slot[P->rep[T->arg]] * mm;
                    for (size_t p = 0; p < m; p++)
                        tpk_gauss_seg_axpy(m, T->w ? T->c * T->w[a * m + p] : T->c,
                                           T->w ? T->w + c * m : NULL, xt + p * m, y + p * m);
                } else { /* a bias block: members p, q reading one bias member (cls) */
                    for (size_t p = 0; p < m; p++)
                        for (size_t q = T->cls ? 0 : p; q < (T->cls ? m : p + 1); q++)
                            if (T->cls == NULL || (T->cls[p] >= 0 && T->cls[q] == T->cls[p]))
                                y[p * m + q] += T->c *
                                                (T->w ? T->w[a * m + p] * T->w[c * m + q] : 1.0) *
                                                T->s[p];
                }
            }
            break;
        }
        if (st != TPK_OK)
            return st;
        *e = fmax(*e, em);
    }
    return TPK_OK;
}

/* The pooled readout of pair (a, c) from the root's block y: *out = alpha·Σ_pq w_ap w_cq
 * V_φ(y)_pq + beta, the map over row chunks in z (RED_ROWS × m) so that each chunk is summed
 * while in cache; *e the map's error, at least what it was. */
static int pool_pair(const nsr_ew_reduce *red, const double *q, size_t m, size_t a, size_t c,
                     const double *y, double *z, const tpk_gauss_ws *ws, double *out, double *e,
                     tpk_ctx *lc)
{
    double s = 0;
    for (size_t p0 = 0; p0 < m; p0 += RED_ROWS) {
        const size_t nr = m - p0 < RED_ROWS ? m - p0 : RED_ROWS;
        const double *yc = y + p0 * m;
        if (red->phi != NULL) {
            double e1 = 0;
            int st = tpk_gauss_map_cross(red->phi, q + a * m + p0, nr, q + c * m, m, yc, z, ws,
                                         &e1, lc);
            if (st != TPK_OK)
                return st;
            *e = fmax(*e, fabs(red->alpha) * e1);
            yc = z;
        }
        for (size_t p = 0; p < nr; p++) {
            double r = 0;
            for (size_t j = 0; j < m; j++)
                r += red->w[c * m + j] * yc[p * m + j];
            s += red->w[a * m + p0 + p] * r;
        }
    }
    *out = red->alpha * s + red->beta;
    return TPK_OK;
}

int nsr_ew_eval_pairs(const nsr_ew_node *node, int nn, int root, size_t n, long m_,
                      const tpk_gauss_ws *ws, const char *file, FILE *report, double *out,
                      int out_full, const nsr_ew_reduce *red, double *err, nsr_ew_stats *stats,
                      tpk_ctx *ctx)
{
    if (err)
        *err = 0.0;
    if (stats)
        memset(stats, 0, sizeof *stats);
    const size_t m = (size_t)m_;
    if (root < 0 || root >= nn || node[root].op == NSR_EW_LEAF || m_ < 1 || n % m)
        return TPK_ERROR(ctx, TPK_EINVAL, "nsr_ew_eval_pairs: root %d of %d is not a map, a sum "
                         "or a convolution", root, nn);
    for (int k = 0; k <= root; k++)
        if (node[k].op == NSR_EW_CONV && (size_t)node[k].rows * (size_t)node[k].cols != m)
            return TPK_ERROR(ctx, TPK_EINVAL, "internal: %s: a %dx%d grid is not the %zu members "
                             "of an input", node[k].name, node[k].rows, node[k].cols, m);
    if (n == 0)
        return TPK_OK;
    const double t0 = tpk_wall_seconds();
    const size_t N = n / m, npairs = N * (N + 1) / 2, mm = m * m;
    const int nth = nsr_threads();
    pplan P;
    int st = pplan_make(node, nn, root, m_, &P, ctx);
    pws *w = st == TPK_OK ? tpk_calloc(ctx, (size_t)nth, sizeof *w) : NULL;
    if (st == TPK_OK && w == NULL)
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    size_t chan = 1; /* the inputs' channels, for first layers */
    for (int k = 0; k <= root; k++)
        if (node[k].op == NSR_EW_LEAF && node[k].M == NULL && node[k].d > chan)
            chan = node[k].d;
    /* every thread's workspace here: the allocator hook is not called from threads */
    for (int t = 0; st == TPK_OK && t < nth; t++) {
        w[t].buf = tpk_malloc(ctx, (size_t)P.nslots * mm * sizeof *w[t].buf);
        w[t].tmp = tpk_malloc(ctx, mm * sizeof *w[t].tmp);
        w[t].cv = tpk_calloc(ctx, (size_t)P.nconv + 1, sizeof *w[t].cv);
        w[t].lw = tpk_calloc(ctx, (size_t)P.nconv + 1, sizeof *w[t].lw);
        if (w[t].buf == NULL || w[t].tmp == NULL || w[t].cv == NULL || w[t].lw == NULL) {
            st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (pair buffers, %d of %zu entries)",
                           P.nslots + 1, mm);
            break;
        }
        memset(w[t].buf, 0, (size_t)P.nslots * mm * sizeof *w[t].buf); /* touch (fl_big) */
        for (int k = 0; k <= root && st == TPK_OK; k++) {
            const nsr_ew_node *nd = &node[k];
            if (nd->op != NSR_EW_CONV || !P.need[k] || P.rep[k] != k)
                continue;
            const size_t R = (size_t)nd->rows, C = (size_t)nd->cols;
            const int gi = P.grid[k];
            const int first = first_layer(node, &P, k);
            if ((nd->phi != NULL || first) && w[t].lw[gi] == NULL &&
                (w[t].lw[gi] = tpk_cnn_layerws_alloc(R, C, nd->kh, nd->kw, nd->pad, chan,
                                                     ctx)) == NULL)
                st = ctx->status;
            if (nd->phi == NULL && !first && w[t].cv[gi] == NULL &&
                (w[t].cv[gi] = tpk_cnn_convws_alloc(R, C, nd->kh, nd->kw, nd->pad,
                                                    TPK_CNN_CONV_AUTO, ctx)) == NULL)
                st = ctx->status;
        }
    }
    /* the first failure in pair order, whichever thread meets it: the same message every run */
    size_t fail_at = npairs;
    int fail_st = TPK_OK, fail_node = -1;
    char fail_msg[sizeof ctx->msg] = "";
    double emax = 0.0;
    const int rs = st == TPK_OK ? P.slot[P.rep[root]] : 0;
    if (st == TPK_OK) {
#pragma omp parallel reduction(max : emax)
        {
            pws *tw = &w[thread_id()];
            tpk_ctx lc;
            tpk_ctx_init_from(&lc, ctx);
#pragma omp for schedule(dynamic, 1)
            for (size_t ac = 0; ac < npairs; ac++) {
                size_t a, c;
                tpk_lower_index(ac, &a, &c);
                double e = 0, pooled = 0;
                int where = -1;
                int ps = run_pair(node, root, &P, n, m, ws, tw, a, c, &e, &where, &lc);
                const double *y = tw->buf + (size_t)rs * mm;
                if (ps == TPK_OK && red != NULL) {
                    where = nn; /* the readout */
                    ps = pool_pair(red, node[root].diag, m, a, c, y, tw->tmp, ws, &pooled, &e, &lc);
                }
                if (ps != TPK_OK) {
#pragma omp critical(tpk_ewpair_fail)
                    if (ac < fail_at) {
                        fail_at = ac;
                        fail_st = ps;
                        fail_node = where;
                        memcpy(fail_msg, lc.msg, sizeof fail_msg);
                    }
                    tpk_ctx_clear(&lc);
                    continue;
                }
                emax = fmax(emax, e);
                if (red != NULL) { /* a pooled readout: one entry per pair */
                    out[a * N + c] = out[c * N + a] = pooled;
                    continue;
                }
                for (size_t p = 0; p < m; p++) {
                    double *row = out + (a * m + p) * n + c * m;
                    const size_t len = a == c && !out_full ? p + 1 : m;
                    memcpy(row, y + p * m, len * sizeof *row);
                    if (out_full && a != c)
                        for (size_t q = 0; q < m; q++)
                            out[(c * m + q) * n + a * m + p] = y[p * m + q];
                }
            }
        }
    }
    if (st == TPK_OK && fail_st != TPK_OK) {
        tpk_ctx_clear(ctx);
        size_t a, c;
        tpk_lower_index(fail_at, &a, &c);
        TPK_ERROR(ctx, fail_st, "%s (in the block of inputs %zu and %zu)", fail_msg, a + 1, c + 1);
        if (fail_node >= 0 && fail_node < nn)
            st = nsr_ew_named(ctx, fail_st, file, &node[fail_node]);
        else
            st = fail_st;
    }
    const double dt = tpk_wall_seconds() - t0;
    if (st == TPK_OK && report) {
        int np = 0;
        for (int k = 0; k <= root; k++)
            np += P.need[k] && node[k].op != NSR_EW_LEAF;
        fprintf(report, "plan (pairs) of %s: %d primitives over %zu input pairs of %zu x %zu "
                "blocks, 1 kernels\n", red ? "readout" : node[root].name, np, npairs, m, m);
        fprintf(report, "  kernel 1:");
        for (int k = 0; k <= root; k++)
            if (P.need[k] && node[k].op != NSR_EW_LEAF)
                fprintf(report, " %s", node[k].name);
        fprintf(report, " | reads");
        for (int k = 0; k <= root; k++)
            if (P.need[k] && node[k].op == NSR_EW_LEAF)
                fprintf(report, " %s", node[k].name);
        fprintf(report, " | writes %s | measured %.4f s\n", red ? "readout" : node[root].name, dt);
        fprintf(report, "  measured %.4f s (one kernel per input pair: no model, no choice)\n",
                dt);
    }
    if (st == TPK_OK && stats) {
        stats->nprims = 0;
        for (int k = 0; k <= root; k++)
            stats->nprims += P.need[k];
        stats->ncands = 1;
        stats->nkernels = 1;
        stats->fused = 1;
        stats->measured_s = dt;
    }
    if (st == TPK_OK && err)
        *err = emax;
    for (int t = 0; w != NULL && t < nth; t++) {
        tpk_free(ctx, w[t].buf);
        tpk_free(ctx, w[t].tmp);
        for (int g = 0; w[t].cv != NULL && g < P.nconv; g++)
            tpk_cnn_convws_free(w[t].cv[g]);
        for (int g = 0; w[t].lw != NULL && g < P.nconv; g++)
            tpk_cnn_layerws_free(w[t].lw[g]);
        tpk_free(ctx, w[t].cv);
        tpk_free(ctx, w[t].lw);
    }
    tpk_free(ctx, w);
    pplan_free(&P, ctx);
    return st;
}
