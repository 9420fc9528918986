/* The readout of the rolled limit evaluator: the outputs' values become the kernel K = σ_v² E[y yᵀ]
 * + β, input-major (a·O + o), by the first strategy of a table that takes them. */
#include "flimit-impl.h"
#include "tpk/alloc.h"

#include <math.h>
#include <string.h>

/* The outputs being read: their values, the kernel's layout, and K (dim × dim, uninitialised:
 * every strategy writes each entry or gives K a block of its own). */
typedef struct ro_job {
    const fout *out;
    int no;             /* outputs read (1: the last output, or the program's only one) */
    size_t N, O, dim;   /* inputs, outputs per input, dim = N·O */
    tpk_array *K;
} ro_job;

/* One output read by a φ block of its own, y = readout(φ(g)): that block (else NULL). */
static const fblock *phi_readout(const fl *F, const ro_job *J)
{
    const val *v = &J->out[0].v;
    if (J->no != 1 || v->nt != 1 || v->mu != NULL || !nsr_fl_identity_term(&v->t[0], v->m))
        return NULL;
    const fblock *bx = &F->b[v->t[0].blk];
    return bx->kind == BK_NONLIN && bx->M2 == NULL ? bx : NULL;
}

/* y = readout(φ(g)), g pending: the readout's map is the plan's last node, its result the kernel
 * (the whole recursion in the passes the plan chooses). */
static int pending_map_applicable(fl *F, const ro_job *J)
{
    const fblock *bx = phi_readout(F, J);
    return bx != NULL && F->b[bx->arg].pend != NULL && (size_t)bx->m * J->N == J->dim;
}

static int pending_map_apply(fl *F, ro_job *J)
{
    const fout *a = &J->out[0];
    const fblock *bx = phi_readout(F, J);
    int st = nsr_fl_ensure_ws_for(F, bx->phi);
    const ew_readout ro = {.phi = bx->phi, .alpha = a->var, .beta = a->bias_var,
                           .out = &J->K->data};
    if (st == TPK_OK)
        st = nsr_fl_ew_flush(F, bx->arg, &ro, 1);
    return st;
}

/* y = readout(φ(g)): K = σ_v² V_φ(Σ_g) + β in one fused map. The test makes g's matrix and φ's
 * workspace. */
static int fused_map_applicable(fl *F, const ro_job *J)
{
    const fblock *bx = phi_readout(F, J);
    return bx != NULL && F->b[bx->arg].mean == NULL && nsr_fl_block_m2(F, bx->arg) != NULL &&
           nsr_fl_ensure_ws_for(F, bx->phi) == TPK_OK;
}

static int fused_map_apply(fl *F, ro_job *J)
{
    const fout *a = &J->out[0];
    const fblock *bx = phi_readout(F, J);
    size_t dim = J->dim;
    double e = 0;
    /* the lower triangle by the map (the tuned kernel for ReLU), then the mirror: measured
     * faster than the map's own mirrored tiles (N = 4096: 42 ms, 54 ms) */
    fblock *g = &F->b[bx->arg];
    if (g->M2 != NULL && g->pins == 0 && (size_t)g->m * J->N == dim) {
        /* g is read for the last time: the map runs in place and K takes its matrix (no fresh
         * dim² pages to fault in); both come from F's allocator */
        tpk_free(F->X.ctx, J->K->data);
        J->K->data = g->M2;
        g->M2 = NULL;
    }
    int st = tpk_gauss_map_affine_lower(bx->phi, g->M2 ? g->M2 : J->K->data, dim, a->var,
                                        a->bias_var, J->K->data, F->ws, &e, F->X.ctx);
    if (st == TPK_OK)
        nsr_ew_mirror(J->K->data, dim);
    F->err = fmax(F->err, e * a->var);
    return st;
}

/* y = readout(Σ_p w_p φ(g)_p) (a CNN's global average pool), g a pair program: each input
 * pair's block is pooled where it is made — no (N m)² matrix (declined where g is not one). */
static int pooled_pairs_applicable(fl *F, const ro_job *J)
{
    const val *v = &J->out[0].v;
    return J->no == 1 && v->kind == V_LIN && v->nt == 1 && v->t[0].dense && v->m == 1 &&
           nsr_fl_all_zero(v->mu, F->N);
}

static int pooled_pairs_apply(fl *F, ro_job *J)
{
    const fout *a = &J->out[0];
    const fblock *bx = &F->b[a->v.t[0].blk];
    int g = bx->kind == BK_NONLIN && bx->M2 == NULL ? bx->arg
            : bx->kind == BK_GAUSS                  ? a->v.t[0].blk
                                                    : -1;
    if (g >= 0 && F->b[g].pend != NULL && F->b[g].mean == NULL && F->b[g].m == bx->m &&
        nsr_fl_ew_pairwise(F, g)) {
        const ew_readout ro = {.phi = bx->kind == BK_NONLIN ? bx->phi : NULL, .alpha = a->var,
                               .beta = a->bias_var, .pool = a->v.t[0].w, .out = &J->K->data};
        return nsr_fl_ew_flush(F, g, &ro, 1);
    }
    return F->X.ctx->status ? F->X.ctx->status : NSR_FL_DECLINED;
}

/* y = readout(Σ_t w_t·g_t) of independent blocks, some pending (a transformer's last LayerNorm
 * over its residual sum): the sum and the readout's scaling are the plan's last nodes, both
 * triangles written from its tiles, no mirror (declined where the value is not such a sum). */
static int pending_sum_applicable(fl *F, const ro_job *J)
{
    (void)F;
    const fout *a = &J->out[0];
    return J->no == 1 && a->v.kind == V_LIN && (a->bias_var == 0 || a->v.m == 1);
}

static int pending_sum_apply(fl *F, ro_job *J)
{
    const fout *a = &J->out[0];
    pend *P = NULL;
    int k = -1;
    int is_sum = nsr_fl_ew_sum_of(F, &a->v, nsr_fl_cur_line(F), nsr_fl_cur_col(F), &P);
    if (is_sum > 0 && ((k = nsr_fl_new_block(F, BK_GAUSS, -1, a->v.m)) < 0 ||
                       nsr_fl_pend_attach(F, k, P))) {
        if (k < 0)
            nsr_fl_pend_discard(F, P);
        is_sum = -1;
    }
    if (is_sum < 0)
        return F->X.ctx->status;
    if (is_sum == 0)
        return NSR_FL_DECLINED;
    const ew_readout ro = {.alpha = a->var, .beta = a->bias_var, .out = &J->K->data};
    return nsr_fl_ew_flush(F, k, &ro, 1);
}

/* y = readout(w·g), g read for the last time: K takes g's matrix, scaled in place (no zeroed dim²
 * block), as the fused φ readout does. */
static int scaled_in_place_applicable(fl *F, const ro_job *J)
{
    const val *v = &J->out[0].v;
    if (J->no != 1 || v->nt != 1)
        return 0;
    const fblock *g = &F->b[v->t[0].blk];
    return g->kind == BK_GAUSS && g->M2 != NULL && g->pins == 0 && g->mean == NULL &&
           (size_t)g->m * J->N == J->dim && nsr_fl_identity_gather(&v->t[0], v->m) &&
           nsr_fl_all_zero(v->mu, J->dim);
}

static int scaled_in_place_apply(fl *F, ro_job *J)
{
    const fout *a = &J->out[0];
    const term *t0 = &a->v.t[0];
    fblock *g = &F->b[t0->blk];
    size_t dim = J->dim;
    double *M = g->M2;
    const double *w = t0->w, sc = a->var, beta = a->bias_var;
    g->M2 = NULL;
    tpk_free(F->X.ctx, J->K->data);
    J->K->data = M;
#pragma omp parallel for schedule(dynamic, 64) if (dim >= 512)
    for (size_t r = 0; r < dim; r++)
        for (size_t q = 0; q <= r; q++)
            M[r * dim + q] = sc * (w ? w[r] * w[q] : 1) * M[r * dim + q] + beta;
    nsr_ew_mirror(M, dim);
    return TPK_OK;
}

static int one_output(fl *F, const ro_job *J)
{
    (void)F;
    return J->no == 1;
}

/* One output family: K is its second-moment block itself (nsr_fl_lin_m2), scaled. */
static int one_block_apply(fl *F, ro_job *J)
{
    const fout *a = &J->out[0];
    size_t dim = J->dim;
    double sc = a->var, beta = a->bias_var;
    /* a block of the pool where one is free (a freed block of this size: no fresh pages to fault
     * in, measured 83 ms of 95 for the transformer's 2000² output), else fresh pages zeroed by
     * writing before the first += reads them (nsr_fl_big) */
    double *q = nsr_fl_big(F, dim * dim, sizeof *q, 1);
    if (q == NULL)
        return F->X.ctx->status;
    tpk_free(F->X.ctx, J->K->data);
    J->K->data = q;
    int st = nsr_fl_lin_m2(F, &a->v, &a->v, J->K->data, dim, 1, sc);
    if (st == TPK_OK) {
        nsr_ew_mirror(J->K->data, dim);
        if (beta != 0)
            for (size_t x = 0; x < dim * dim; x++)
                J->K->data[x] += beta;
    }
    return st;
}

static int several_outputs(fl *F, const ro_job *J)
{
    (void)F;
    return J->no > 1;
}

/* The block of outputs i and j (i ≥ j) at offsets oi0, oj0 of each input's O outputs. */
static int output_pair(fl *F, ro_job *J, int i, int j, size_t oi0, size_t oj0)
{
    const fout *a = &J->out[i], *c = &J->out[j];
    size_t N = J->N, O = J->O, dim = J->dim, mi = (size_t)a->v.m, mj = (size_t)c->v.m;
    double *M = nsr_fam_alloc(&F->X, N * mi * N * mj, sizeof *M);
    if (M == NULL)
        return F->X.ctx->status;
    int st = nsr_fl_lin_m2(F, &a->v, &c->v, M, N * mj, i == j, 1.0);
    if (st == TPK_OK && i == j)
        nsr_ew_mirror(M, N * mi);
    double s = sqrt(a->var * c->var), beta = sqrt(a->bias_var * c->bias_var);
    double *K = J->K->data;
    for (size_t x = 0; st == TPK_OK && x < N; x++)
        for (size_t p = 0; p < mi; p++)
            for (size_t y = 0; y < N; y++)
                for (size_t q = 0; q < mj; q++) {
                    double v = s * M[(x * mi + p) * N * mj + y * mj + q] + beta;
                    K[(x * O + oi0 + p) * dim + y * O + oj0 + q] = v;
                    K[(y * O + oj0 + q) * dim + x * O + oi0 + p] = v;
                }
    tpk_free(F->X.ctx, M);
    return st;
}

/* Several outputs: each pair's second moments, scaled, into its place in K (input-major). */
static int output_pairs_apply(fl *F, ro_job *J)
{
    int st = TPK_OK;
    size_t oi0 = 0;
    for (int i = 0; i < J->no && st == TPK_OK; i++) {
        size_t oj0 = 0;
        for (int j = 0; j <= i && st == TPK_OK; j++) {
            st = output_pair(F, J, i, j, oi0, oj0);
            oj0 += (size_t)J->out[j].v.m;
        }
        oi0 += (size_t)J->out[i].v.m;
    }
    return st;
}

/* The readout strategies in order of preference: the first entry applicable whose apply does not
 * decline makes K (one_output takes every single output, several_outputs the rest). */
static const struct {
    const char *name;
    int (*applicable)(fl *F, const ro_job *J);
    int (*apply)(fl *F, ro_job *J); /* a status, or NSR_FL_DECLINED: the next entry runs */
} readout_strategies[] = {
    {"pending map", pending_map_applicable, pending_map_apply},
    {"fused map", fused_map_applicable, fused_map_apply},
    {"pooled pairs", pooled_pairs_applicable, pooled_pairs_apply},
    {"pending sum", pending_sum_applicable, pending_sum_apply},
    {"scaled in place", scaled_in_place_applicable, scaled_in_place_apply},
    {"one block", one_output, one_block_apply},
    {"output pairs", several_outputs, output_pairs_apply},
};

/* The plan's readout: every pair of outputs walked without numbers (support, last uses). */
static int readout_plan(fl *F, const fout *out, int no)
{
    int st = TPK_OK;
    for (int i = 0; i < no && st == TPK_OK; i++)
        for (int j = 0; j <= i && st == TPK_OK; j++)
            st = nsr_fl_lin_m2(F, &out[i].v, &out[j].v, NULL, 0, i == j, 1.0);
    return st;
}

/* A dim × dim kernel, uninitialised. */
static int kernel_alloc(fl *F, size_t dim, tpk_array **K)
{
    double *q = tpk_array_check_memory(dim * dim, "kernel", F->X.ctx)
                    ? NULL
                    : nsr_fl_big(F, dim * dim, sizeof *q, 0);
    *K = q != NULL ? tpk_array_alloc2(1, 1, F->X.ctx) : NULL;
    if (*K == NULL) {
        tpk_free(F->X.ctx, q);
        return F->X.ctx->status;
    }
    tpk_free(F->X.ctx, (*K)->data);
    (*K)->data = q;
    (*K)->dims[0] = (*K)->dims[1] = dim;
    return TPK_OK;
}

int nsr_fl_readout(fl *F, const fout *out, int no, tpk_array **K)
{
    *K = NULL;
    size_t O = 0;
    for (int i = 0; i < no; i++)
        O += (size_t)out[i].v.m;
    if (O > 200000)
        return TPK_ERROR(F->X.ctx, TPK_EINVAL, "%s: %zu outputs per input are too many for one "
                         "kernel", F->X.R->file, O);
    if (F->dry)
        return readout_plan(F, out, no);
    ro_job J = {.out = out, .no = no, .N = F->N, .O = O, .dim = F->N * O};
    int st = kernel_alloc(F, J.dim, &J.K);
    *K = J.K;
    if (st)
        return st;
    st = NSR_FL_DECLINED;
    size_t nstrat = sizeof readout_strategies / sizeof readout_strategies[0], i = 0;
    for (; i < nstrat && st == NSR_FL_DECLINED; i++)
        if (readout_strategies[i].applicable(F, &J))
            st = readout_strategies[i].apply(F, &J);
    if (F->trace && st == TPK_OK)
        fprintf(stderr, "  %s: readout: %s\n", F->X.R->file, readout_strategies[i - 1].name);
    return st;
}
