/* Entrywise programs, lowered to primitives and run by an orchestrated plan (ewplan-impl.h,
 * docs/orchestration.md §7). */
#include "ewplan-impl.h"

#include "tpk/alloc.h"
#include "tpk/array.h"
#include "tpk/clock.h"
#include "tpk/cnn.h"
#include "tpk/orch.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* Row segments a kernel maps at once: every primitive's segment stays in L1 (2 KiB each). */
#define SEG 256
/* Primitives per candidate kernel (their segments are on the stack: SEG·8 bytes each). */
#define MAX_FUSE 16
/* Below this many entries the model's memory constants are not measured (the passes would cost
 * more than they inform): the defaults below stand in. */
#define CALIB_MIN_ENTRIES ((size_t)1 << 18)
/* Candidates beyond this make the enumeration and the BLP cost more than they save; the plan is
 * then searched again with smaller kernels. */
#define MAX_CANDS 60000
/* Entries × primitives below which the run is too short for a plan to be worth solving (about
 * 10 ms of maps on one core): the primitives run in order in runs of MAX_FUSE. */
#define SMALL_WORK 4e6

/* The first parallel region of a process starts its threads (about a millisecond): not part of
 * what a calibration pass measures. */
static void warm_threads(void)
{
    int x = 0;
#pragma omp parallel reduction(+ : x)
    x += 1;
    (void)x;
}

int nsr_plan_from_env(int *plan, tpk_ctx *ctx)
{
    const char *s = getenv("TPK_PLAN");
    *plan = NSR_PLAN_OPTIMAL;
    if (s == NULL || *s == 0 || strcmp(s, "optimal") == 0)
        return TPK_OK;
    if (strcmp(s, "naive") == 0) {
        *plan = NSR_PLAN_NAIVE;
        return TPK_OK;
    }
    return TPK_ERROR(ctx, TPK_EINVAL, "TPK_PLAN=%s: expected naive or optimal", s);
}


/* ---- one segment of one node ---------------------------------------------------------------- */

/* Per-thread accumulators of the maps' error statistics. */
typedef struct seg_acc {
    double maxr, errmax;
} seg_acc;

/* Entries (i, j0..j0+len) of node k into y, its arguments' segments at a[t] (SUM: one per term,
 * NULL for a bias; PHI: a[0]). */
static void node_seg(const nsr_ew_node *nd, tpk_gauss_segmap *sm, size_t i, size_t j0, size_t len,
                     long m, const double *const *a, double *y, seg_acc *acc)
{
    if (nd->op == NSR_EW_PHI) {
        tpk_gauss_segmap_row(sm, i, j0, len, a[0], y, &acc->maxr, &acc->errmax);
        if (nd->alpha != 1.0 || nd->beta != 0.0)
            tpk_gauss_seg_affine(len, nd->alpha, nd->beta, y);
        return;
    }
    for (size_t j = 0; j < len; j++)
        y[j] = 0.0;
    for (int t = 0; t < nd->nt; t++) {
        const nsr_ew_term *T = &nd->t[t];
        const double c = T->w ? T->c * T->w[i] : T->c, *w = T->w ? T->w + j0 : NULL;
        if (T->arg >= 0) {
            tpk_gauss_seg_axpy(len, c, w, a[t], y);
        } else if (T->cls == NULL) { /* a bias block: members of one index only */
            const size_t mm = (size_t)m, p = i % mm;
            for (size_t j = (p + mm - j0 % mm) % mm; j < len; j += mm)
                y[j] += c * (w ? w[j] : 1.0) * T->s[p];
        } else { /* members reading one bias member */
            const size_t mm = (size_t)m, p = i % mm;
            for (size_t j = 0, q = j0 % mm; T->cls[p] >= 0 && j < len;
                 j++, q = q + 1 == mm ? 0 : q + 1)
                if (T->cls[q] == T->cls[p])
                    y[j] += c * (w ? w[j] : 1.0) * T->s[p];
        }
    }
}

/* V_φ's diagonal over variances q (n): out_i = E φ(u)², u ~ N(0, q_i), by the map's scalar path
 * (tpk_gauss_segmap_row); *err its bound. */
static int phi_diag(const tpk_phi *phi, const double *q, size_t n, const tpk_gauss_ws *ws,
                    double *out, double *err, tpk_ctx *ctx)
{
    tpk_gauss_segmap *sm = tpk_gauss_segmap_alloc(phi, q, n, ws, ctx);
    if (sm == NULL)
        return ctx->status;
    seg_acc acc = {0, 0};
    for (size_t i = 0; i < n; i++)
        tpk_gauss_segmap_row(sm, i, i, 1, q + i, out + i, &acc.maxr, &acc.errmax);
    tpk_gauss_segmap_merge(sm, acc.maxr, acc.errmax);
    int st = tpk_gauss_segmap_finish(sm, err, ctx);
    tpk_gauss_segmap_free(sm);
    return st;
}

/* A convolution's diagonal: entry (a, p) reads (a, p + t) of its source for every tap t, the
 * same shift on both sides, so the diagonal is the source's (mapped) diagonal summed over the
 * taps (theory §2.8; kernels/cnn.c's diag_box) — no off-diagonal entry needed. */
static int conv_diag(const nsr_ew_node *node, int k, size_t n, long m, const tpk_gauss_ws *ws,
                     const char *file, double *out, double *err, tpk_ctx *ctx)
{
    const nsr_ew_node *nd = &node[k];
    const long R = nd->rows, C = nd->cols, cr = (nd->kh - 1) / 2, cs = (nd->kw - 1) / 2;
    if (R * C != m || n % (size_t)m)
        return TPK_ERROR(ctx, TPK_EINVAL, "internal: %s: a %ldx%ld grid is not %ld members",
                         nd->name, R, C, m);
    const double *q = node[nd->arg].diag;
    double *u = NULL, e = 0;
    if (nd->phi != NULL) {
        if ((u = tpk_malloc(ctx, n * sizeof *u)) == NULL)
            return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        int st = phi_diag(nd->phi, q, n, ws, u, &e, ctx);
        if (st) {
            tpk_free(ctx, u);
            return nsr_ew_named(ctx, st, file, nd);
        }
        q = u;
    }
    const int circ = nd->pad == TPK_CNN_CIRCULAR;
    for (size_t a = 0; a < n / (size_t)m; a++)
        for (long r = 0; r < R; r++)
            for (long c = 0; c < C; c++) {
                double s = 0;
                for (long i = 0; i < nd->kh; i++)
                    for (long j = 0; j < nd->kw; j++) {
                        long rr = r + i - cr, cc = c + j - cs;
                        if (circ) {
                            rr = (rr % R + R) % R;
                            cc = (cc % C + C) % C;
                        } else if (rr < 0 || rr >= R || cc < 0 || cc >= C) {
                            continue;
                        }
                        s += q[a * (size_t)m + (size_t)(rr * C + cc)];
                    }
                out[a * (size_t)m + (size_t)(r * C + c)] = nd->alpha * s;
            }
    tpk_free(ctx, u);
    if (err)
        *err = fabs(nd->alpha) * nd->kh * nd->kw * e;
    return TPK_OK;
}

int nsr_ew_diag(const nsr_ew_node *node, int k, size_t n, long m, const tpk_gauss_ws *ws,
                const char *file, double *out, double *err, tpk_ctx *ctx)
{
    const nsr_ew_node *nd = &node[k];
    if (err)
        *err = 0.0;
    if (nd->op == NSR_EW_LEAF) {
        for (size_t i = 0; i < n; i++) {
            if (nd->M != NULL) {
                out[i] = nd->M[i * n + i];
                continue;
            }
            double g = 0; /* the inputs' Gram, as the pair blocks make it */
            for (size_t h = 0; h < nd->d; h++)
                g += nd->x[i * nd->d + h] * nd->x[i * nd->d + h];
            out[i] = g / (double)nd->d;
        }
        return TPK_OK;
    }
    if (nd->op == NSR_EW_CONV)
        return conv_diag(node, k, n, m, ws, file, out, err, ctx);
    if (nd->op == NSR_EW_SUM) {
        for (size_t i = 0; i < n; i++) {
            double y = 0.0;
            for (int t = 0; t < nd->nt; t++) { /* in node_seg's order of operations */
                const nsr_ew_term *T = &nd->t[t];
                const double x = T->arg >= 0 ? node[T->arg].diag[i] : T->s[i % (size_t)m];
                y += T->w ? T->c * T->w[i] * T->w[i] * x : T->c * x;
            }
            out[i] = y;
        }
        return TPK_OK;
    }
    /* a map: the same scalar path as the map's diagonal entries (tpk_gauss_segmap_row) */
    double e = 0;
    int st = phi_diag(nd->phi, node[nd->arg].diag, n, ws, out, &e, ctx);
    if (st)
        return nsr_ew_named(ctx, st, file, nd);
    for (size_t i = 0; i < n; i++)
        out[i] = nd->alpha * out[i] + nd->beta;
    if (err)
        *err = fabs(nd->alpha) * e;
    return TPK_OK;
}

/* ---- lowering, costs, plans ---------------------------------------------------------------- */

typedef struct ew {
    const nsr_ew_node *node;
    int nn, root;
    size_t n, E;             /* E: entries of a lower triangle */
    long m;
    const tpk_gauss_ws *ws;
    int *val;                /* node → value id of the graph (−1: not under root) */
    int *nodeof;             /* value id → node */
    int nv;
    tpk_gauss_segmap **sm;   /* per node (maps) */
    /* the model (seconds) */
    double *t_entry;         /* per node: compute per entry, all threads */
    double read_s, write_s, fault_s; /* per byte */
    double launch_s;
    nsr_ew_calib *cal;
    int out_fresh;           /* the root's block is fresh pages (their first touch costs) */
    int out_full;            /* the root's both triangles are written (tiles) */
    /* the Z_p twin (nsr_ew_verify): entries are integers in [0, p), maps a random table */
    const uint32_t *ztab;    /* non-NULL: the twin runs */
    uint64_t za, zb, zc;
    int mutant;              /* a bug injected into the executor (0: none; the twin's only) */
    tpk_ctx *ctx;
} ew;

static const char *kernel_sig(const ew *W, const tpk_orch_kernel *K, char *buf, size_t cap);

/* Upper triangle ← lower, in cache-sized tiles (a plain column walk is memory-bound at n²). */
void nsr_ew_mirror(double *M, size_t n)
{
    const size_t B = 64;
#pragma omp parallel for schedule(dynamic, 1) if (n > 512)
    for (size_t i0 = 0; i0 < n; i0 += B)
        for (size_t j0 = 0; j0 <= i0; j0 += B) {
            size_t i1 = i0 + B < n ? i0 + B : n, j1 = j0 + B < n ? j0 + B : n;
            for (size_t i = i0; i < i1; i++)
                for (size_t j = j0; j < j1 && j < i; j++)
                    M[j * n + i] = M[i * n + j];
        }
}

static void ew_init(ew *W, const nsr_ew_node *node, int nn, int root, size_t n, long m,
                    tpk_ctx *ctx)
{
    memset(W, 0, sizeof *W);
    W->node = node;
    W->nn = nn;
    W->root = root;
    W->n = n;
    W->E = n * (n + 1) / 2;
    W->m = m;
    W->ctx = ctx;
}

/* A sum that is one of its arguments: one term 1·x, every other a bias of variance 0 (an MLP's
 * b ~ N(0, 0)). */
static int is_identity(const nsr_ew_node *nd, long m)
{
    if (nd->op != NSR_EW_SUM)
        return 0;
    int terms = 0;
    for (int t = 0; t < nd->nt; t++) {
        const nsr_ew_term *T = &nd->t[t];
        if (T->arg >= 0) {
            if (T->c != 1.0 || T->w != NULL || terms++)
                return 0;
        } else {
            for (long p = 0; p < m && T->c != 0.0; p++)
                if (T->s[p] != 0.0)
                    return 0;
        }
    }
    return terms == 1;
}

static int lower(ew *W, tpk_orch_graph *g)
{
    tpk_ctx *ctx = W->ctx;
    char *need = tpk_calloc(ctx, (size_t)W->nn, 1);
    if (need == NULL)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    need[W->root] = 1;
    for (int k = W->root; k >= 0; k--) {
        const nsr_ew_node *nd = &W->node[k];
        if (!need[k])
            continue;
        if (nd->op == NSR_EW_PHI)
            need[nd->arg] = 1;
        for (int t = 0; nd->op == NSR_EW_SUM && t < nd->nt; t++)
            if (nd->t[t].arg >= 0)
                need[nd->t[t].arg] = 1;
    }
    tpk_orch_shape sh = {1, {W->E, 0, 0, 0}, sizeof(double)};
    int st = TPK_OK;
    for (int k = 0; k < W->nn; k++)
        W->val[k] = -1;
    for (int k = 0; k <= W->root && st == TPK_OK; k++) {
        const nsr_ew_node *nd = &W->node[k];
        if (!need[k])
            continue;
        int id = -1, args[NSR_EW_MAXT], na = 0;
        if (k != W->root && is_identity(nd, W->m)) { /* x + 0: its readers read x */
            for (int t = 0; t < nd->nt; t++)
                if (nd->t[t].arg >= 0)
                    W->val[k] = W->val[nd->t[t].arg];
            continue;
        }
        if (nd->op == NSR_EW_LEAF) {
            st = tpk_orch_graph_add_input(g, nd->name, &sh, &id, ctx);
        } else {
            double flops;
            if (nd->op == NSR_EW_PHI) {
                args[na++] = W->val[nd->arg];
                flops = 40.0 * (double)W->E;
            } else {
                for (int t = 0; t < nd->nt; t++)
                    if (nd->t[t].arg >= 0)
                        args[na++] = W->val[nd->t[t].arg];
                flops = 3.0 * nd->nt * (double)W->E;
            }
            if (na == 0) /* a sum of biases alone: read no value (a constant block) */
                st = TPK_ERROR(ctx, TPK_EINVAL, "internal: %s reads no block", nd->name);
            else
                st = tpk_orch_graph_add_prim(g, nd->name, TPK_ORCH_MAP, &sh, flops, na, args, &id,
                                             ctx);
        }
        if (st == TPK_OK) {
            W->val[k] = id;
            W->nodeof[id] = k;
            W->nv = id + 1;
        }
    }
    if (st == TPK_OK)
        st = tpk_orch_graph_set_output(g, W->val[W->root], ctx);
    tpk_free(ctx, need);
    return st;
}

/* Rows [0, S) of the sample (spread over the lower half of the triangle) through every node
 * under root in order, each from its arguments' segments as one fused kernel would; secs (may be
 * NULL) gets each node's time. seg: nv × SEG scratch. Returns the entries mapped. */
static size_t sample_rows(ew *W, int S, int s0, double *seg, double *secs)
{
    const size_t n = W->n;
    size_t entries = 0;
    seg_acc acc = {0, 0};
    for (int s = s0; s < s0 + S; s++) {
        const size_t i = n / 2 + (size_t)((double)(n - n / 2) * (s + 0.5) / (2.0 * S + s0));
        if (i >= n)
            continue;
        for (size_t j0 = 0; j0 <= i; j0 += SEG) {
            const size_t len = i + 1 - j0 < SEG ? i + 1 - j0 : SEG;
            entries += len;
            for (int v = 0; v < W->nv; v++) {
                const int k = W->nodeof[v];
                const nsr_ew_node *nd = &W->node[k];
                double *y = seg + (size_t)v * SEG;
                if (nd->op == NSR_EW_LEAF) {
                    memcpy(y, nd->M + i * n + j0, len * sizeof *y);
                    continue;
                }
                const double *a[NSR_EW_MAXT];
                if (nd->op == NSR_EW_PHI)
                    a[0] = seg + (size_t)W->val[nd->arg] * SEG;
                for (int t = 0; nd->op == NSR_EW_SUM && t < nd->nt; t++)
                    a[t] = nd->t[t].arg >= 0 ? seg + (size_t)W->val[nd->t[t].arg] * SEG : NULL;
                const double t0 = secs ? tpk_wall_seconds() : 0;
                node_seg(nd, W->sm[k], i, j0, len, W->m, a, y, &acc);
                if (secs)
                    secs[k] += tpk_wall_seconds() - t0;
            }
        }
    }
    return entries;
}

/* Compute cost per entry of every primitive, all threads working: each node's share from a
 * serial sample timed node by node, the total from a parallel sample of other rows (threads
 * share cores and caches: dividing a serial time by the thread count overstates them). */
static void calibrate_compute(ew *W)
{
    if (W->cal->fixed_compute) { /* the flops of lower() at a fixed rate */
        for (int k = 0; k < W->nn; k++)
            W->t_entry[k] = W->node[k].op == NSR_EW_PHI ? 40.0 * W->cal->flop_s
                            : W->node[k].op == NSR_EW_SUM ? 3.0 * W->node[k].nt * W->cal->flop_s
                                                          : 0.0;
        return;
    }
    const int S = W->n < 8 ? (int)W->n : 8, P = 8 * nsr_threads();
    double *seg = tpk_malloc(W->ctx, (size_t)W->nv * SEG * sizeof *seg);
    double *secs = tpk_calloc(W->ctx, (size_t)W->nn, sizeof *secs);
    if (seg == NULL || secs == NULL) { /* no measurement: rough per-entry times stand in */
        for (int k = 0; k < W->nn; k++)
            W->t_entry[k] = W->node[k].op == NSR_EW_PHI ? 5e-9 : 1e-9;
        tpk_free(W->ctx, seg);
        tpk_free(W->ctx, secs);
        return;
    }
    size_t entries = sample_rows(W, S, 0, seg, secs);
    double serial = 0;
    for (int k = 0; k < W->nn; k++)
        serial += secs[k];
    double scale = 1.0 / nsr_threads();
    /* scratch for every thread, allocated here: the allocator hook is not called from threads */
    double *all = W->n >= 64 && serial > 0 && entries > 0
                      ? tpk_malloc(W->ctx,
                                   (size_t)nsr_threads() * (size_t)W->nv * SEG * sizeof *all)
                      : NULL;
    if (all != NULL) {
        size_t pe = 0;
        warm_threads();
        const double t0 = tpk_wall_seconds();
#pragma omp parallel reduction(+ : pe)
        {
#ifdef _OPENMP
            double *mine = all + (size_t)omp_get_thread_num() * (size_t)W->nv * SEG;
#else
            double *mine = all;
#endif
#pragma omp for schedule(static)
            for (int s = 0; s < P; s++)
                pe += sample_rows(W, 1, S + s, mine, NULL);
        }
        const double par = tpk_wall_seconds() - t0;
        /* between perfect scaling and none: a sample this small can only err outside */
        if (pe > 0)
            scale = fmin(fmax((par / (double)pe) / (serial / (double)entries), 1.0 / nsr_threads()),
                         1.0);
        tpk_free(W->ctx, all);
    }
    for (int k = 0; k < W->nn; k++)
        W->t_entry[k] = entries ? scale * secs[k] / (double)entries : 0.0;
    tpk_free(W->ctx, seg);
    tpk_free(W->ctx, secs);
}

/* Memory constants per byte: a pass that writes fresh pages (their faults and the kernel's
 * zeroing), one that writes them again, one that reads them — over the threads, as the plan's
 * kernels run. */
static void calibrate_memory(ew *W)
{
    nsr_ew_calib *c = W->cal;
    if (!c->have_memory) { /* defaults, until a large enough program measures them */
        c->read_s = 1.0 / 12e9;
        c->write_s = 1.0 / 8e9;
        c->fault_s = 1.0 / 3e9;
        c->launch_s = 20e-6;
    }
    W->read_s = c->read_s;
    W->write_s = c->write_s;
    W->fault_s = c->fault_s;
    W->launch_s = c->launch_s;
    if (c->have_memory || W->E < CALIB_MIN_ENTRIES)
        return;
    size_t bytes = W->E * sizeof(double);
    bytes = bytes > ((size_t)4 << 20) ? (size_t)4 << 20 : bytes;
    const size_t nd = bytes / sizeof(double);
    double *p = tpk_malloc(W->ctx, bytes);
    if (p == NULL)
        return;
    warm_threads();
    double t0 = tpk_wall_seconds();
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < nd; i++)
        p[i] = 1.0;
    double t1 = tpk_wall_seconds();
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < nd; i++)
        p[i] = 2.0;
    double t2 = tpk_wall_seconds(), sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum)
    for (size_t i = 0; i < nd; i++)
        sum += p[i];
    double t3 = tpk_wall_seconds();
    tpk_free(W->ctx, p);
    if (sum != 2.0 * (double)nd) /* cannot happen; keeps the read from being optimised away */
        return;
    c->write_s = W->write_s = (t2 - t1) / (double)bytes;
    c->fault_s = W->fault_s = fmax((t1 - t0) - (t2 - t1), 0.0) / (double)bytes;
    c->read_s = W->read_s = (t3 - t2) / (double)bytes;
    c->have_memory = 1;
}

static int cost_fn(const tpk_orch_graph *g, const tpk_orch_kernel *k, void *arg, double *cost,
                   tpk_ctx *ctx)
{
    (void)g;
    (void)ctx;
    const ew *W = arg;
    const double B = (double)W->E * sizeof(double);
    double c = W->launch_s, compute = 0;
    for (int i = 0; i < k->nprims; i++)
        compute += (double)W->E * W->t_entry[W->nodeof[k->prims[i]]];
    /* an emitted kernel's own time where the provider measured it (§7.3): timed in a loop over
     * data that stays in cache, it stands for the compute; the memory terms stay the model's */
    const tpk_netsor_ew_provider *pv = W->cal != NULL ? W->cal->provider : NULL;
    if (pv != NULL && pv->cost != NULL && pv->find != NULL) {
        char sig[1024];
        const double t = kernel_sig(W, k, sig, sizeof sig) == NULL ? pv->cost(pv->user, sig, W->n) : -1;
        if (t >= 0)
            compute = t;
    }
    c += compute + k->ninputs * B * W->read_s;
    for (int i = 0; i < k->noutputs; i++) { /* the root goes to the caller's block */
        const int root = W->nodeof[k->outputs[i]] == W->root;
        c += B * (W->write_s + (!root || W->out_fresh ? W->fault_s : 0.0));
        /* and where both triangles are asked for, the upper one from transposed tiles (or an
         * emitted kernel's mirror pass): a store to each cache line from eight rows, each line
         * read for ownership first */
        if (root && W->out_full)
            c += B * (W->write_s + W->read_s + (W->out_fresh ? W->fault_s : 0.0));
    }
    *cost = c;
    return TPK_OK;
}

/* ---- the executor ---------------------------------------------------------------------------- */

/* Run kernel K over blocks of the lower triangle in parallel: each row segment of a block goes
 * through the kernel's primitives in order, and the written values are stored. Blocks are rows
 * (segments of SEG entries), or with full square tiles of TILE whose root values are also stored
 * transposed (its upper triangle) from a buffer: a reader that needs both triangles gets them
 * without a mirror pass. Rows where nothing is mirrored: longer segments cost fewer calls per
 * entry (measured 20–25 % on an LN-residual MLP at N = 4096 against 64-entry tiles). */
#define TILE 64
/* ---- the Z_p twin of the executor (docs/orchestration.md §7.2) ------------------------------ */

/* Exact verification of the orchestrated executor, after Mirage: the same kernels (run_kernel:
 * segments, tiles, the sources of every argument, the stores, the transposed root) run over
 * values in Z_p, p = 2^31 − 1, held exactly in doubles, with every map replaced by a random
 * function of (x, q_a, q_c) — a table lookup of x mod 2^16 plus random multiples of x, q_a + q_c
 * and q_a q_c — and every weight, coefficient and bias a random element. A kernel that reads a
 * wrong entry, drops or doubles a term, stores the wrong segment or transposes wrongly then
 * differs from the reference (whole matrices, plain loops) in some entry except with probability
 * about 1/p per entry. */
#define ZP_P 2147483647ull

static inline uint64_t zp_of(double x)
{
    return (uint64_t)x;
}
static inline double zp_mul(double a, double b)
{
    return (double)(zp_of(a) * zp_of(b) % ZP_P);
}
static inline double zp_add(double a, double b)
{
    return (double)((zp_of(a) + zp_of(b)) % ZP_P);
}
static inline double zp_map(const ew *W, double x, double qa, double qc)
{
    const uint64_t k = zp_of(x), a = zp_of(qa), c = zp_of(qc);
    return (double)((W->ztab[k & 0xffff] + W->za * k % ZP_P + W->zb * ((a + c) % ZP_P) % ZP_P +
                     W->zc * (a * c % ZP_P) % ZP_P) % ZP_P);
}

/* node_seg in Z_p: entries (i, j0..j0+len) of node k into y. */
static void twin_seg(const ew *W, int k, size_t i, size_t j0, size_t len,
                     const double *const *a, double *y)
{
    const nsr_ew_node *nd = &W->node[k];
    if (nd->op == NSR_EW_PHI) {
        const double *q = W->node[nd->arg].diag;
        for (size_t j = 0; j < len; j++)
            y[j] = zp_add(zp_mul(nd->alpha, zp_map(W, a[0][j], q[i], q[j0 + j])), nd->beta);
        return;
    }
    const size_t mm = (size_t)W->m, p = i % mm;
    for (size_t j = 0; j < len; j++)
        y[j] = 0.0;
    for (int t = 0; t < nd->nt; t++) {
        const nsr_ew_term *T = &nd->t[t];
        const double c = T->w ? zp_mul(T->c, T->w[i]) : T->c;
        for (size_t j = 0; j < len; j++) {
            const double cw = T->w ? zp_mul(c, T->w[j0 + j]) : c;
            if (T->arg >= 0)
                y[j] = zp_add(y[j], zp_mul(cw, a[t][j]));
            else if (T->cls == NULL ? (j0 + j) % mm == p
                                    : T->cls[p] >= 0 && T->cls[(j0 + j) % mm] == T->cls[p])
                y[j] = zp_add(y[j], zp_mul(cw, T->s[p]));
        }
    }
}

/* Bugs the mutation suite injects into run_kernel (nsr_ew_verify's mutant): each must make some
 * kernel differ from the reference. */
enum {
    MUT_NONE,
    MUT_SEG_TAIL,   /* a row segment one entry short */
    MUT_DIAG_SEG,   /* a row's segment that starts on the diagonal skipped */
    MUT_SRC_SHIFT,  /* an argument read from memory one entry to the right */
    MUT_SRC_ROW,    /* an argument read from memory one row up */
    MUT_STORE_SKIP, /* an output other than the root not stored */
    MUT_STORE_LEN,  /* a stored segment one entry short */
    MUT_ARG_SWAP,   /* a sum's first two arguments swapped */
    MUT_BUF_PREV,   /* an in-kernel argument taken from the primitive before it */
    MUT_TILE_SWAP,  /* the root's transposed tile written untransposed */
    MUT_TILE_ROWS,  /* a tile one row short */
    MUT_TILE_COLS,  /* a tile's transpose one column short */
    MUT_COUNT
};

static void run_kernel(ew *W, const tpk_orch_kernel *K, double *const *mem, int full)
{
    const size_t n = W->n, T = (n + TILE - 1) / TILE;
    const int rootv = W->val[W->root];
    int loc[MAX_FUSE], isout[MAX_FUSE], src[MAX_FUSE][NSR_EW_MAXT], rootp = -1;
    for (int p = 0; p < K->nprims; p++) {
        loc[p] = W->nodeof[K->prims[p]];
        isout[p] = 0;
        for (int o = 0; o < K->noutputs; o++)
            isout[p] |= K->outputs[o] == K->prims[p];
        if (full && K->prims[p] == rootv && isout[p])
            rootp = p;
        /* each argument: a primitive of this kernel (its position), else memory (−1 − value) */
        const nsr_ew_node *nd = &W->node[loc[p]];
        int na = nd->op == NSR_EW_PHI ? 1 : nd->nt;
        for (int t = 0; t < na; t++) {
            int x = nd->op == NSR_EW_PHI ? nd->arg : nd->t[t].arg;
            src[p][t] = INT32_MIN; /* a bias: no argument */
            if (x < 0)
                continue;
            int v = W->val[x], q = -1;
            for (int r = 0; r < p && q < 0; r++)
                q = K->prims[r] == v ? r : -1;
            src[p][t] = q >= 0 ? q : -1 - v;
        }
    }
    /* blocks: rows (each its segments, ⌈(i + 1)/SEG⌉ of them), or tiles (I, J ≤ I) */
    const int tiles = rootp >= 0, mut = W->mutant;
    const size_t nblocks = tiles ? T * (T + 1) / 2 : n, width = tiles ? TILE : SEG;
#pragma omp parallel if (n * n >= 32768)
    {
        double buf[MAX_FUSE][SEG], tile[TILE * TILE];
        seg_acc acc = {0, 0};
#pragma omp for schedule(dynamic, 4)
        for (size_t t = 0; t < nblocks; t++) {
            size_t I = t, J = 0, i0 = t, i1 = t + 1;
            if (tiles) {
                tpk_lower_index(t, &I, &J);
                i0 = I * TILE;
                i1 = i0 + TILE < n ? i0 + TILE : n;
            }
            if (mut == MUT_TILE_ROWS && tiles && i1 - i0 > 1)
                i1--;
            for (size_t i = i0; i < i1; i++) {
                for (size_t j0 = tiles ? J * TILE : 0; j0 <= i && j0 < (tiles ? J * TILE + 1 : n);
                     j0 += width) {
                    const size_t jend = !tiles || I == J ? (j0 + width < i + 1 ? j0 + width : i + 1)
                                                         : j0 + TILE;
                    size_t len = jend - j0;
                    if (mut && ((mut == MUT_SEG_TAIL && !tiles && len > 1) ||
                                (mut == MUT_DIAG_SEG && !tiles && j0 == i && i > 0)))
                        len -= mut == MUT_SEG_TAIL ? 1 : len;
                    for (int p = 0; p < K->nprims && len > 0; p++) {
                        const nsr_ew_node *nd = &W->node[loc[p]];
                        const double *a[NSR_EW_MAXT];
                        int na = nd->op == NSR_EW_PHI ? 1 : nd->nt;
                        for (int q = 0; q < na; q++) {
                            const int sq = mut == MUT_BUF_PREV && src[p][q] > 0 ? src[p][q] - 1
                                                                               : src[p][q];
                            size_t off = i * n + j0;
                            if (mut == MUT_SRC_ROW && i > 0)
                                off -= n;
                            else if (mut == MUT_SRC_SHIFT && j0 + len < n)
                                off += 1;
                            a[q] = sq == INT32_MIN ? NULL : sq >= 0 ? buf[sq] : mem[-1 - sq] + off;
                        }
                        if (mut == MUT_ARG_SWAP && nd->op == NSR_EW_SUM && na > 1) {
                            const double *t0 = a[0];
                            a[0] = a[1];
                            a[1] = t0;
                        }
                        if (W->ztab != NULL)
                            twin_seg(W, loc[p], i, j0, len, a, buf[p]);
                        else
                            node_seg(nd, W->sm[loc[p]], i, j0, len, W->m, a, buf[p], &acc);
                    }
                    /* stored once every primitive has read the segment: an output may then
                     * overwrite an input's (out aliasing a leaf, nsr_ew_eval) */
                    for (int p = 0; p < K->nprims && len > 0; p++)
                        if (isout[p] && !(mut == MUT_STORE_SKIP && K->prims[p] != rootv))
                            memcpy(mem[K->prims[p]] + i * n + j0, buf[p],
                                   (mut == MUT_STORE_LEN && len > 1 ? len - 1 : len) *
                                       sizeof(double));
                    if (tiles)
                        memcpy(tile + (i - i0) * TILE, buf[rootp], len * sizeof(double));
                }
            }
            /* the root's upper triangle: the tile transposed, column by column of the tile */
            const size_t jcols = mut == MUT_TILE_COLS ? TILE - 1 : TILE;
            for (size_t j = J * TILE; tiles && j < J * TILE + jcols && j < n; j++) {
                double *dst = mem[rootv] + j * n;
                for (size_t i = (I == J ? j + 1 : i0); i < i1; i++)
                    dst[i] = mut == MUT_TILE_SWAP && (i - i0) < TILE && (j - J * TILE) < TILE
                                 ? tile[(j - J * TILE) * TILE + (i - i0)]
                                 : tile[(i - i0) * TILE + (j - J * TILE)];
            }
        }
        for (int p = 0; p < K->nprims; p++)
            if (W->node[loc[p]].op == NSR_EW_PHI && W->sm[loc[p]] != NULL)
                tpk_gauss_segmap_merge(W->sm[loc[p]], acc.maxr, acc.errmax);
    }
}

/* The values value v reads (its node's arguments, as values); returns their count. */
static int value_args(const ew *W, int v, int *a)
{
    const nsr_ew_node *nd = &W->node[W->nodeof[v]];
    int na = 0;
    if (nd->op == NSR_EW_PHI)
        a[na++] = W->val[nd->arg];
    for (int t = 0; nd->op == NSR_EW_SUM && t < nd->nt; t++)
        if (nd->t[t].arg >= 0)
            a[na++] = W->val[nd->t[t].arg];
    return na;
}

/* The plan of small programs, where solving costs more than any plan saves: the primitives in
 * graph order cut into runs of MAX_FUSE (a run of a topological order is convex), each run one
 * kernel that writes what later runs read and the root. k: one per run (nv); pool: nv·(nv + 3)
 * ints for their lists. Returns the number of runs. */
static int interval_plan(const ew *W, int rootv, tpk_orch_kernel *k, int *pool)
{
    int nk = 0, a[NSR_EW_MAXT];
    for (int v = 0; v < W->nv;) {
        if (W->node[W->nodeof[v]].op == NSR_EW_LEAF) {
            v++;
            continue;
        }
        int *pr = pool, np = 0;
        for (; v < W->nv && np < MAX_FUSE; v++)
            if (W->node[W->nodeof[v]].op != NSR_EW_LEAF)
                pr[np++] = v;
        int *in = pr + np, ni = 0;
        for (int i = 0; i < np; i++) {
            int na = value_args(W, pr[i], a);
            for (int j = 0; j < na; j++) {
                int dup = 0;
                for (int q = 0; q < np && !dup; q++)
                    dup = pr[q] == a[j];
                for (int q = 0; q < ni && !dup; q++)
                    dup = in[q] == a[j];
                if (!dup)
                    in[ni++] = a[j];
            }
        }
        int *out = in + ni, no = 0;
        for (int i = 0; i < np; i++) {
            int later = pr[i] == rootv;
            for (int u = v; u < W->nv && !later; u++) {
                int na = value_args(W, u, a);
                for (int j = 0; j < na; j++)
                    later |= a[j] == pr[i];
            }
            if (later)
                out[no++] = pr[i];
        }
        memset(&k[nk], 0, sizeof k[nk]);
        k[nk].prims = pr;
        k[nk].nprims = np;
        k[nk].inputs = in;
        k[nk].ninputs = ni;
        k[nk].outputs = out;
        k[nk].noutputs = no;
        nk++;
        pool = out + no;
    }
    return nk;
}

static int search(ew *W, const tpk_orch_graph *g, int plan, tpk_orch_cands **cp,
                  tpk_orch_plan **pp)
{
    tpk_ctx *ctx = W->ctx;
    tpk_orch_opts o;
    tpk_orch_opts_default(&o);
    o.max_size = plan == NSR_PLAN_NAIVE ? 1 : MAX_FUSE;
    o.max_extra_outputs = 2;
    o.max_candidates = MAX_CANDS;
    for (;;) {
        tpk_ctx local;
        tpk_ctx_init_from(&local, ctx);
        tpk_orch_cands *c = tpk_orch_cands_alloc(g, &o, &local);
        if (c == NULL && local.status == TPK_EUNSUPPORTED && o.max_size > 2) {
            o.max_size--; /* too many candidates: smaller kernels */
            continue;
        }
        if (c == NULL)
            return TPK_ERROR(ctx, local.status, "%s", local.msg);
        int st = tpk_orch_cands_cost(c, cost_fn, W, ctx);
        tpk_orch_plan *p = NULL;
        if (st == TPK_OK)
            p = plan == NSR_PLAN_NAIVE ? tpk_orch_solve_naive(c, ctx) : tpk_orch_solve_blp(c, &o, ctx);
        if (p == NULL) {
            tpk_orch_cands_free(c);
            return ctx->status ? ctx->status : st;
        }
        *cp = c;
        *pp = p;
        return TPK_OK;
    }
}

static void report_kernel(FILE *f, const ew *W, int i, const tpk_orch_kernel *K, double measured,
                          int emitted)
{
    fprintf(f, "  kernel %d:", i + 1);
    for (int p = 0; p < K->nprims; p++)
        fprintf(f, " %s", W->node[W->nodeof[K->prims[p]]].name);
    fprintf(f, " | reads");
    for (int p = 0; p < K->ninputs; p++)
        fprintf(f, " %s", W->node[W->nodeof[K->inputs[p]]].name);
    fprintf(f, " | writes");
    for (int p = 0; p < K->noutputs; p++)
        fprintf(f, " %s", W->node[W->nodeof[K->outputs[p]]].name);
    fprintf(f, " | predicted %.4f s, measured %.4f s%s\n", K->cost, measured,
            emitted ? " (emitted kernel)" : "");
}

/* Kernel K's signature (docs/orchestration.md §7.3; tpk/tune.h's grammar) into buf: its inputs
 * in the order of K->inputs, its primitives in order, "!" on those it writes. Returns NULL, or
 * where the tuner's emitter has no code for it (a φ other than relu, identity and erf; a bias of
 * several members; the root's upper triangle from tiles) why not. */
static const char *kernel_sig(const ew *W, const tpk_orch_kernel *K, char *buf, size_t cap)
{
    size_t at = 0;
    const char *why = NULL;
#define PUT(...) (at += (size_t)snprintf(buf + (at < cap ? at : cap), at < cap ? cap - at : 0, \
                                          __VA_ARGS__))
    PUT("in=%d", K->ninputs);
    for (int p = 0; p < K->nprims; p++) {
        const nsr_ew_node *nd = &W->node[W->nodeof[K->prims[p]]];
        int isout = 0;
        for (int o = 0; o < K->noutputs; o++)
            isout |= K->outputs[o] == K->prims[p];
        int na = nd->op == NSR_EW_PHI ? 1 : nd->nt, id[NSR_EW_MAXT];
        for (int t = 0; t < na; t++) { /* each argument as a value of the kernel */
            const int x = nd->op == NSR_EW_PHI ? nd->arg : nd->t[t].arg;
            id[t] = -1;
            if (x < 0)
                continue;
            const int v = W->val[x];
            for (int r = 0; r < p; r++)
                id[t] = K->prims[r] == v ? K->ninputs + r : id[t];
            for (int r = 0; r < K->ninputs && id[t] < 0; r++)
                id[t] = K->inputs[r] == v ? r : -1;
        }
        if (nd->op == NSR_EW_PHI) {
            const char *nm = tpk_phi_name(nd->phi);
            char phi[64];
            snprintf(phi, sizeof phi, "%s", nm);
            char *lp = strchr(phi, '(');
            if (lp != NULL) { /* erf(b) → erf[b] */
                *lp = '[';
                char *rp = strchr(lp, ')');
                if (rp != NULL)
                    *rp = ']';
            }
            const int erf = strncmp(phi, "erf", 3) == 0 && (phi[3] == '\0' || phi[3] == '[');
            if (strcmp(phi, "relu") != 0 && strcmp(phi, "identity") != 0 && !erf)
                why = nm;
            PUT(";%s(v%d)", phi, id[0]);
        } else {
            PUT(";sum(");
            for (int t = 0; t < nd->nt; t++) {
                if (nd->t[t].arg < 0 && W->m != 1)
                    why = "a bias of several members";
                if (nd->t[t].arg < 0)
                    PUT("%sb", t ? "," : "");
                else
                    PUT("%sv%d", t ? "," : "", id[t]);
                if (nd->t[t].w != NULL)
                    PUT("*w");
            }
            PUT(")");
        }
        if (isout && p + 1 < K->nprims)
            PUT("!");
    }
#undef PUT
    if (at >= cap)
        why = "a signature too long";
    return why;
}

/* Run K by the provider's emitted kernel fn: the arrays of tpk/tune.h's ABI from the nodes
 * (inputs, every value's diagonal, α and β per map and c per term — a bias term's constant c·s —
 * and the weight vectors in order). 1: it ran; −1: the kernel failed (out of memory). */
static int run_emitted(ew *W, const tpk_orch_kernel *K, double *const *mem, tpk_netsor_ew_fn fn)
{
    const double *in[MAX_FUSE * NSR_EW_MAXT], *dg[MAX_FUSE * (NSR_EW_MAXT + 1)],
        *w[MAX_FUSE * NSR_EW_MAXT];
    double *out[MAX_FUSE], par[MAX_FUSE * NSR_EW_MAXT + 2 * MAX_FUSE];
    int np = 0, nw = 0;
    for (int k = 0; k < K->ninputs; k++) {
        in[k] = mem[K->inputs[k]];
        dg[k] = W->node[W->nodeof[K->inputs[k]]].diag;
    }
    for (int p = 0; p < K->nprims; p++) {
        const nsr_ew_node *nd = &W->node[W->nodeof[K->prims[p]]];
        dg[K->ninputs + p] = nd->diag;
        out[p] = NULL;
        for (int o = 0; o < K->noutputs; o++)
            if (K->outputs[o] == K->prims[p])
                out[p] = mem[K->prims[p]];
        if (nd->op == NSR_EW_PHI) {
            par[np++] = nd->alpha;
            par[np++] = nd->beta;
            continue;
        }
        for (int t = 0; t < nd->nt; t++) {
            const nsr_ew_term *T = &nd->t[t];
            /* m = 1: a bias term is its member's variance where it reads one */
            par[np++] = T->arg >= 0 ? T->c : (T->cls == NULL || T->cls[0] >= 0 ? T->c * T->s[0] : 0.0);
            if (T->w != NULL)
                w[nw++] = T->w;
        }
    }
    if (fn(W->n, in, dg, out, par, w, nsr_threads()) != 0)
        return -1;
    /* the root's upper triangle, where asked: emitted kernels write lower triangles */
    for (int o = 0; W->out_full && o < K->noutputs; o++)
        if (W->nodeof[K->outputs[o]] == W->root)
            nsr_ew_mirror(mem[K->outputs[o]], W->n);
    return 1;
}

/* A copy of the program with each sum x + b (m = 1: b a constant) whose x is a map read by it
 * alone folded into that map's β: an MLP layer W·φ(g) + b is one primitive, not two. */
static nsr_ew_node *fold_biases(const nsr_ew_node *in, int nn, int root, long m, tpk_ctx *ctx)
{
    nsr_ew_node *nd = tpk_calloc(ctx, (size_t)nn, sizeof *nd);
    int *readers = tpk_calloc(ctx, (size_t)nn, sizeof *readers);
    if (nd == NULL || readers == NULL) {
        tpk_free(ctx, nd);
        tpk_free(ctx, readers);
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        return NULL;
    }
    memcpy(nd, in, (size_t)nn * sizeof *nd);
    for (int k = 0; k < nn; k++) {
        if (in[k].op == NSR_EW_PHI)
            readers[in[k].arg]++;
        for (int t = 0; in[k].op == NSR_EW_SUM && t < in[k].nt; t++)
            if (in[k].t[t].arg >= 0)
                readers[in[k].t[t].arg]++;
    }
    for (int k = 0; m == 1 && k < nn; k++) {
        const nsr_ew_node *x = &in[k];
        int arg = -1, ok = x->op == NSR_EW_SUM;
        double beta = 0;
        for (int t = 0; ok && t < x->nt; t++) {
            const nsr_ew_term *T = &x->t[t];
            if (T->arg >= 0) {
                ok = arg < 0 && T->c == 1.0 && T->w == NULL;
                arg = T->arg;
            } else {
                ok = T->w == NULL;
                beta += T->c * T->s[0];
            }
        }
        if (!ok || arg < 0 || nd[arg].op != NSR_EW_PHI || readers[arg] != 1 || arg == root)
            continue;
        const double *diag = nd[k].diag;
        char name[sizeof nd[k].name];
        memcpy(name, nd[k].name, sizeof name);
        nd[k] = nd[arg];
        nd[k].beta += beta;
        nd[k].diag = diag; /* the sum's: the map's plus β */
        memcpy(nd[k].name, name, sizeof name);
    }
    tpk_free(ctx, readers);
    return nd;
}

int nsr_ew_eval(const nsr_ew_node *node_in, int nn, int root, size_t n, long m, int plan,
                const tpk_gauss_ws *ws, nsr_ew_calib *cal, const char *file, FILE *report,
                double *out, int out_fresh, int out_full, double *err, nsr_ew_stats *stats,
                tpk_ctx *ctx)
{
    if (err)
        *err = 0.0;
    if (stats)
        memset(stats, 0, sizeof *stats);
    if (root < 0 || root >= nn || node_in[root].op == NSR_EW_LEAF || m < 1 || n % (size_t)m)
        return TPK_ERROR(ctx, TPK_EINVAL, "nsr_ew_eval: root %d of %d is not a map or a sum", root,
                         nn);
    const int sigs = (plan & NSR_PLAN_SIGNATURES) != 0, csigs = (plan & NSR_PLAN_CANDIDATES) != 0;
    plan &= ~(NSR_PLAN_SIGNATURES | NSR_PLAN_CANDIDATES);
    if (n == 0)
        return TPK_OK;
    if (nsr_ew_pairwise(node_in, root))
        return nsr_ew_eval_pairs(node_in, nn, root, n, m, ws, file, report, out, out_full, NULL,
                                 err, stats, ctx);
    nsr_ew_node *folded = fold_biases(node_in, nn, root, m, ctx);
    if (folded == NULL)
        return ctx->status;
    const nsr_ew_node *node = folded;
    ew W;
    ew_init(&W, node, nn, root, n, m, ctx);
    W.ws = ws;
    nsr_ew_calib local;
    memset(&local, 0, sizeof local);
    W.cal = cal ? cal : &local;
    W.out_fresh = out_fresh;
    W.out_full = out_full;
    const double t0 = tpk_wall_seconds();
    W.val = tpk_calloc(ctx, (size_t)nn, sizeof *W.val);
    W.nodeof = tpk_calloc(ctx, (size_t)nn, sizeof *W.nodeof);
    W.sm = tpk_calloc(ctx, (size_t)nn, sizeof *W.sm);
    W.t_entry = tpk_calloc(ctx, (size_t)nn, sizeof *W.t_entry);
    double **mem = tpk_calloc(ctx, (size_t)nn, sizeof *mem);
    char *owned = tpk_calloc(ctx, (size_t)nn, 1);
    tpk_orch_graph *g = tpk_orch_graph_alloc(ctx);
    tpk_orch_cands *c = NULL;
    tpk_orch_plan *p = NULL;
    int st = W.val && W.nodeof && W.sm && W.t_entry && mem && owned && g
                 ? TPK_OK
                 : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    if (st == TPK_OK)
        st = lower(&W, g);
    for (int k = 0; st == TPK_OK && k <= root; k++)
        if (W.val[k] >= 0 && node[k].op == NSR_EW_PHI &&
            (W.sm[k] = tpk_gauss_segmap_alloc(node[k].phi, node[node[k].arg].diag, n, ws, ctx)) == NULL)
            st = nsr_ew_named(ctx, ctx->status, file, &node[k]);
    /* the whole program in one kernel, where it fits one: computes each primitive once, reads
     * each leaf once and writes only the root, so no plan costs less under the model (§7) —
     * the model and the BLP are then only needed for a report */
    int nprims = 0;
    for (int v = 0; v < W.nv; v++)
        nprims += node[W.nodeof[v]].op != NSR_EW_LEAF;
    /* and small programs: the runs of interval_plan, no model, no BLP */
    const int single = plan == NSR_PLAN_OPTIMAL &&
                       (nprims <= MAX_FUSE || (double)W.E * nprims < SMALL_WORK);
    const int model = report != NULL || stats != NULL || !single;
    const double t1 = tpk_wall_seconds();
    if (st == TPK_OK && !model) { /* fixed constants: no measurement (nothing reads them) */
        nsr_ew_calib fixed = {1, 1e-10, 1e-10, 3e-10, 2e-5, 1, 1e-10, NULL};
        nsr_ew_calib *keep = W.cal;
        W.cal = &fixed;
        calibrate_memory(&W);
        calibrate_compute(&W);
        W.cal = keep;
    } else if (st == TPK_OK) {
        calibrate_memory(&W);
        calibrate_compute(&W);
        /* the sampled rows went through the maps: their statistics start afresh below */
        for (int k = 0; k <= root; k++)
            if (W.sm[k] != NULL)
                tpk_gauss_segmap_reset(W.sm[k]);
    }
    const double t2 = tpk_wall_seconds();
    /* the kernels to run, in order: the plan's, or the one kernel of everything */
    int nk = 0, *pool = NULL, rootv = st == TPK_OK ? W.val[root] : -1;
    const tpk_orch_kernel **ks = NULL;
    tpk_orch_kernel *runs = NULL;
    double pcost = 0;
    int use_runs = st == TPK_OK && single && !model;
    char why[TPK_MSG_MAX] = "";
    if (st == TPK_OK && !use_runs) {
        st = search(&W, g, plan, &c, &p);
        if (st != TPK_OK && st != TPK_ENOMEM && plan == NSR_PLAN_OPTIMAL) {
            /* no optimum here (CBC stopped without a proof, too many candidates even for small
             * kernels): the runs of the graph order are a plan too, and the kernel is the same */
            snprintf(why, sizeof why, "%s", ctx->msg);
            tpk_ctx_clear(ctx);
            st = TPK_OK;
            use_runs = 1;
        } else if (st == TPK_OK) {
            if ((ks = tpk_calloc(ctx, (size_t)p->nkernels + 1, sizeof *ks)) == NULL)
                st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
            for (int q = 0; st == TPK_OK && q < p->nkernels; q++)
                ks[nk++] = tpk_orch_cands_get(c, p->kernels[q]);
            pcost = st == TPK_OK ? p->cost : 0;
        }
    }
    if (st == TPK_OK && use_runs) {
        pool = tpk_calloc(ctx, (size_t)W.nv * ((size_t)W.nv + 3) + 1, sizeof *pool);
        runs = tpk_calloc(ctx, (size_t)W.nv + 1, sizeof *runs);
        ks = tpk_calloc(ctx, (size_t)W.nv + 1, sizeof *ks);
        if (pool == NULL || runs == NULL || ks == NULL)
            st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        int nr = st == TPK_OK ? interval_plan(&W, rootv, runs, pool) : 0;
        for (int q = 0; q < nr; q++) {
            cost_fn(g, &runs[q], &W, &runs[q].cost, ctx);
            pcost += runs[q].cost;
            ks[nk++] = &runs[q];
        }
    }
    const double t3 = tpk_wall_seconds();
    if (st == TPK_OK && report)
        fprintf(report, "plan (%s) of %s: %d primitives, %d candidates, %d kernels\n",
                plan == NSR_PLAN_NAIVE ? "naive" : "optimal", node[root].name,
                tpk_orch_graph_nvalues(g), c ? tpk_orch_cands_count(c) : 1, nk);
    for (int q = 0; st == TPK_OK && report && csigs && c != NULL && q < tpk_orch_cands_count(c); q++) {
        char sig[1024]; /* every candidate the BLP chose from, for `tptune ew` to time */
        const tpk_orch_kernel *K = tpk_orch_cands_get(c, q);
        if (isfinite(K->cost) && kernel_sig(&W, K, sig, sizeof sig) == NULL)
            fprintf(report, "  candidate sig: %s\n", sig);
    }
    if (st == TPK_OK && report && why[0])
        fprintf(report, "  (no optimum: %s; the primitives run in graph order, %d a kernel)\n",
                why, MAX_FUSE);
    /* the last kernel (position) that reads each value: written blocks are freed after it */
    int *last = st == TPK_OK ? tpk_calloc(ctx, (size_t)W.nv, sizeof *last) : NULL;
    if (st == TPK_OK && last == NULL)
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    for (int v = 0; st == TPK_OK && v < W.nv; v++) {
        last[v] = -1;
        if (node[W.nodeof[v]].op == NSR_EW_LEAF)
            mem[v] = (double *)node[W.nodeof[v]].M; /* read only */
    }
    for (int q = 0; st == TPK_OK && q < nk; q++)
        for (int i = 0; i < ks[q]->ninputs; i++)
            last[ks[q]->inputs[i]] = q;
    double measured = 0;
    int fused = 0, emitted = 0;
    for (int q = 0; st == TPK_OK && q < nk; q++) {
        const tpk_orch_kernel *K = ks[q];
        fused += K->nprims > 1;
        /* its signature (for the report and the provider) and the provider's kernel, prepared
         * (verified, compiled) before the kernel is timed */
        tpk_netsor_ew_fn efn = NULL;
        char esig[1024];
        const int want_sig = (report && sigs) || (W.cal->provider != NULL && W.cal->provider->find != NULL);
        const char *no_sig = want_sig ? kernel_sig(&W, K, esig, sizeof esig) : NULL;
        if (want_sig && no_sig == NULL && W.cal->provider != NULL && W.cal->provider->find != NULL)
            efn = W.cal->provider->find(W.cal->provider->user, esig, n);
        const double k0 = tpk_wall_seconds();
        for (int i = 0; i < K->noutputs && st == TPK_OK; i++) {
            int v = K->outputs[i];
            if (mem[v] != NULL)
                continue;
            if (W.nodeof[v] == root) {
                mem[v] = out;
            } else if ((mem[v] = tpk_malloc(ctx, n * n * sizeof(double))) == NULL) {
                st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (%.3g GB)", 8e-9 * (double)(n * n));
            } else {
                owned[v] = 1;
            }
        }
        if (st)
            break;
        int done = 0;
        if (efn != NULL && (done = run_emitted(&W, K, mem, efn)) < 0) {
            st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (an emitted kernel's arrays)");
            break;
        }
        emitted += done;
        if (!done)
            run_kernel(&W, K, mem, out_full);
        for (int v = 0; v < W.nv; v++)
            if (owned[v] && last[v] <= q) {
                tpk_free(ctx, mem[v]);
                mem[v] = NULL;
                owned[v] = 0;
            }
        const double dt = tpk_wall_seconds() - k0;
        measured += dt;
        if (report)
            report_kernel(report, &W, q, K, dt, done);
        if (report && sigs) {
            if (no_sig != NULL)
                fprintf(report, "    sig: none (%s has no emitted code)\n", no_sig);
            else
                fprintf(report, "    sig: %s\n", esig);
        }
    }
    double emax = 0;
    for (int k = 0; W.sm != NULL && k <= root; k++) {
        if (W.sm[k] == NULL)
            continue;
        double e = 0;
        if (st == TPK_OK && (st = tpk_gauss_segmap_finish(W.sm[k], &e, ctx)) != TPK_OK)
            st = nsr_ew_named(ctx, st, file, &node[k]);
        emax = fmax(emax, fabs(node[k].alpha) * e);
    }
    if (st == TPK_OK && err)
        *err = emax;
    if (st == TPK_OK && report)
        fprintf(report, "  predicted %.4f s, measured %.4f s (%d of %d kernels fused%s; model "
                "calibrated in %.4f s, candidates and solve %.4f s)\n", pcost, measured, fused,
                nk, emitted ? ", some emitted" : "", t2 - t1, t3 - t2);
    if (st == TPK_OK && stats) {
        stats->nprims = W.nv;
        stats->ncands = c ? tpk_orch_cands_count(c) : 1;
        stats->nkernels = nk;
        stats->fused = fused;
        stats->emitted = emitted;
        stats->predicted_s = pcost;
        stats->measured_s = measured;
        stats->calib_s = t2 - t1;
        stats->solve_s = t3 - t2;
    }
    (void)t0;
    for (int v = 0; v < W.nv && mem; v++)
        if (owned && owned[v])
            tpk_free(ctx, mem[v]);
    for (int k = 0; W.sm && k < nn; k++)
        tpk_gauss_segmap_free(W.sm[k]);
    tpk_orch_plan_free(p);
    tpk_orch_cands_free(c);
    tpk_orch_graph_free(g);
    tpk_free(ctx, ks);
    tpk_free(ctx, runs);
    tpk_free(ctx, pool);
    tpk_free(ctx, last);
    tpk_free(ctx, owned);
    tpk_free(ctx, mem);
    tpk_free(ctx, W.t_entry);
    tpk_free(ctx, W.sm);
    tpk_free(ctx, W.nodeof);
    tpk_free(ctx, W.val);
    tpk_free(ctx, folded);
    return st;
}

/* ---- exact verification of every candidate kernel (the Z_p twin, §7.2) -------------------- */

static double zp_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull); /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (double)((z ^ (z >> 31)) % ZP_P);
}

/* A structural value kept (0 and 1 decide identities and folds), any other one a random element. */
static double zp_value(double x, uint64_t *s)
{
    return x == 0.0 || x == 1.0 ? x : zp_rand(s);
}

/* The reference of node k in Z_p over the whole n×n matrix, from its arguments' (R), by the
 * definitions of the nodes (ewplan-impl.h) in plain loops. */
static void zp_reference(const ew *W, const nsr_ew_node *node, int k, double *const *R)
{
    const nsr_ew_node *nd = &node[k];
    const size_t n = W->n, mm = (size_t)W->m;
    double *Y = R[k];
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            double y = 0;
            if (nd->op == NSR_EW_PHI) {
                const double *X = R[nd->arg];
                y = zp_add(zp_mul(nd->alpha, zp_map(W, X[i * n + j], X[i * n + i], X[j * n + j])),
                           nd->beta);
            }
            for (int t = 0; nd->op == NSR_EW_SUM && t < nd->nt; t++) {
                const nsr_ew_term *T = &nd->t[t];
                const double w = T->w ? zp_mul(T->w[i], T->w[j]) : 1.0, cw = zp_mul(T->c, w);
                const size_t p = i % mm, q = j % mm;
                if (T->arg >= 0)
                    y = zp_add(y, zp_mul(cw, R[T->arg][i * n + j]));
                else if (T->cls == NULL ? p == q : T->cls[p] >= 0 && T->cls[q] == T->cls[p])
                    y = zp_add(y, zp_mul(cw, T->s[p]));
            }
            Y[i * n + j] = y;
        }
}

int nsr_ew_verify(const nsr_ew_node *node_in, int nn, int root, size_t n, long m, uint64_t seed,
                  int mutant, nsr_ew_verified *out, tpk_ctx *ctx)
{
    memset(out, 0, sizeof *out);
    if (root < 0 || root >= nn || node_in[root].op == NSR_EW_LEAF || m < 1 || n == 0 ||
        n % (size_t)m || mutant < 0 || mutant >= MUT_COUNT)
        return TPK_ERROR(ctx, TPK_EINVAL, "nsr_ew_verify: root %d of %d, n %zu, m %ld, mutant %d",
                         root, nn, n, m, mutant);
    if (nsr_ew_pairwise(node_in, root))
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED, "nsr_ew_verify: a pair program (convolutions run "
                         "through the library's layer, not the executor's kernels)");
    uint64_t s = seed;
    ew W;
    ew_init(&W, NULL, nn, root, n, m, ctx);
    W.mutant = mutant;
    uint32_t *tab = tpk_malloc(ctx, ((size_t)1 << 16) * sizeof *tab);
    nsr_ew_node *nd = tpk_calloc(ctx, (size_t)nn, sizeof *nd);
    double **R = tpk_calloc(ctx, (size_t)nn, sizeof *R);
    double **own = tpk_calloc(ctx, 3 * (size_t)nn * NSR_EW_MAXT, sizeof *own);
    double **mem = tpk_calloc(ctx, (size_t)nn, sizeof *mem);
    double **scratch = tpk_calloc(ctx, (size_t)nn, sizeof *scratch);
    W.val = tpk_calloc(ctx, (size_t)nn, sizeof *W.val);
    W.nodeof = tpk_calloc(ctx, (size_t)nn, sizeof *W.nodeof);
    W.sm = tpk_calloc(ctx, (size_t)nn, sizeof *W.sm);
    tpk_orch_graph *g = tpk_orch_graph_alloc(ctx);
    tpk_orch_cands *c = NULL;
    int nown = 0, st = tab && nd && R && own && mem && scratch && W.val && W.nodeof && W.sm && g
                           ? TPK_OK
                           : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    /* the twin program: the same structure, random elements of Z_p for its numbers */
    for (size_t i = 0; st == TPK_OK && i < ((size_t)1 << 16); i++)
        tab[i] = (uint32_t)zp_rand(&s);
    W.ztab = tab;
    W.za = (uint64_t)zp_rand(&s), W.zb = (uint64_t)zp_rand(&s), W.zc = (uint64_t)zp_rand(&s);
    W.node = nd;
    for (int k = 0; st == TPK_OK && k <= root; k++) {
        nd[k] = node_in[k];
        if ((R[k] = own[nown++] = tpk_malloc(ctx, n * n * sizeof(double))) == NULL) {
            st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
            break;
        }
        if (nd[k].op == NSR_EW_LEAF) { /* a random symmetric matrix */
            for (size_t i = 0; i < n; i++)
                for (size_t j = 0; j <= i; j++)
                    R[k][i * n + j] = R[k][j * n + i] = zp_rand(&s);
            nd[k].M = R[k];
        } else {
            nd[k].alpha = zp_value(nd[k].alpha, &s);
            nd[k].beta = zp_value(nd[k].beta, &s);
            for (int t = 0; nd[k].op == NSR_EW_SUM && t < nd[k].nt && st == TPK_OK; t++) {
                nsr_ew_term *T = &nd[k].t[t];
                T->c = zp_value(T->c, &s);
                double *w = T->w ? own[nown++] = tpk_malloc(ctx, n * sizeof *w) : NULL;
                double *sv = T->arg < 0 ? own[nown++] = tpk_malloc(ctx, (size_t)m * sizeof *sv)
                                        : NULL;
                if ((T->w && w == NULL) || (T->arg < 0 && sv == NULL)) {
                    st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
                    break;
                }
                for (size_t i = 0; w && i < n; i++)
                    w[i] = zp_rand(&s);
                for (long p = 0; sv && p < m; p++) { /* one value per bias member (cls) */
                    long q = 0;
                    while (T->cls && q < p && T->cls[q] != T->cls[p])
                        q++;
                    sv[p] = T->cls && T->cls[p] < 0 ? 0.0
                            : T->cls && q < p       ? sv[q]
                                                    : zp_value(T->s[p], &s);
                }
                if (w)
                    T->w = w;
                if (sv)
                    T->s = sv;
            }
            zp_reference(&W, nd, k, R);
        }
        if ((nd[k].diag = own[nown++] = tpk_malloc(ctx, n * sizeof(double))) == NULL) {
            st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
            break;
        }
        for (size_t i = 0; i < n; i++)
            ((double *)nd[k].diag)[i] = R[k][i * n + i];
    }
    if (st == TPK_OK)
        st = lower(&W, g);
    tpk_orch_opts o;
    tpk_orch_opts_default(&o);
    o.max_size = MAX_FUSE;
    o.max_extra_outputs = 2;
    o.max_candidates = MAX_CANDS;
    while (st == TPK_OK) { /* every candidate the plans choose from (as search() makes them) */
        tpk_ctx local;
        tpk_ctx_init_from(&local, ctx);
        if ((c = tpk_orch_cands_alloc(g, &o, &local)) != NULL)
            break;
        if (local.status == TPK_EUNSUPPORTED && o.max_size > 2)
            o.max_size--;
        else
            st = TPK_ERROR(ctx, local.status, "%s", local.msg);
    }
    /* and the runs of the small programs' plan (interval_plan) */
    int *pool = NULL, nrun = 0;
    tpk_orch_kernel *runs = NULL;
    if (st == TPK_OK) {
        pool = tpk_calloc(ctx, (size_t)W.nv * ((size_t)W.nv + 3) + 1, sizeof *pool);
        runs = tpk_calloc(ctx, (size_t)W.nv + 1, sizeof *runs);
        if (pool == NULL || runs == NULL)
            st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        else
            nrun = interval_plan(&W, W.val[root], runs, pool);
    }
    const int ncand = c ? tpk_orch_cands_count(c) : 0;
    for (int q = 0; st == TPK_OK && q < ncand + nrun; q++) {
        const tpk_orch_kernel *K = q < ncand ? tpk_orch_cands_get(c, q) : &runs[q - ncand];
        int writes_root = 0;
        for (int i = 0; i < K->noutputs; i++)
            writes_root |= W.nodeof[K->outputs[i]] == root;
        for (int full = 0; full <= writes_root && st == TPK_OK; full++) {
            /* inputs from the reference; outputs into scratch that starts as a value no twin
             * entry takes (p itself) */
            for (int v = 0; v < W.nv; v++)
                mem[v] = R[W.nodeof[v]];
            for (int i = 0; i < K->noutputs && st == TPK_OK; i++) {
                const int v = K->outputs[i];
                if (scratch[v] == NULL &&
                    (scratch[v] = tpk_malloc(ctx, n * n * sizeof(double))) == NULL)
                    st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
                for (size_t e = 0; st == TPK_OK && e < n * n; e++)
                    scratch[v][e] = (double)ZP_P;
                mem[v] = scratch[v];
            }
            if (st)
                break;
            run_kernel(&W, K, mem, full);
            out->kernels++;
            for (int i = 0; i < K->noutputs && !out->mismatch; i++) {
                const int v = K->outputs[i], k = W.nodeof[v];
                const int upper = full && k == root;
                for (size_t a = 0; a < n && !out->mismatch; a++)
                    for (size_t b = 0; b < (upper ? n : a + 1); b++)
                        if (scratch[v][a * n + b] != R[k][a * n + b]) {
                            out->mismatch = 1;
                            out->row = a;
                            out->col = b;
                            snprintf(out->what, sizeof out->what, "%s (kernel of %d primitives%s)",
                                     nd[k].name, K->nprims, upper ? ", both triangles" : "");
                            break;
                        }
            }
        }
    }
    for (int i = 0; own && i < nown; i++)
        tpk_free(ctx, own[i]);
    for (int v = 0; scratch && v < nn; v++)
        tpk_free(ctx, scratch[v]);
    tpk_free(ctx, pool);
    tpk_free(ctx, runs);
    tpk_orch_cands_free(c);
    tpk_orch_graph_free(g);
    tpk_free(ctx, W.sm);
    tpk_free(ctx, W.nodeof);
    tpk_free(ctx, W.val);
    tpk_free(ctx, scratch);
    tpk_free(ctx, mem);
    tpk_free(ctx, own);
    tpk_free(ctx, R);
    tpk_free(ctx, nd);
    tpk_free(ctx, tab);
    return st;
}

int nsr_ew_mutants(void)
{
    return MUT_COUNT - 1;
}
