/* Finite-width executor: run a NETSOR(+) program at width n on a whole batch (theory.md §1.2,
 * §1.5, §7.1). Every G/H-var is an N×n matrix (row a = input a), so a MatMul is one GEMM
 * (N×n)·(n×n)ᵀ through tpk_dgemm. Random tensors come from counter-based streams keyed by
 * (seed, tensor, row, col) (include/tpk/rng.h): results depend on the seed alone, and the width-n
 * weights are the top-left block of the width-2n ones (standard normals before the 1/√n scale). */
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "exec-impl.h"
#include "tpk/alloc.h"
#include "tpk/batchnorm.h"
#include "tpk/matmul.h"
#include "tpk/rng.h"

#define BLK 256 /* coordinates per RPN block; also the fixed summation block of Moments */
/* Below this many elements a loop runs on one thread: fork/join (and spinning on a busy
 * machine) would cost more than the work. Results never depend on it. */
#define PAR_MIN 32768


static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Are the streams of all random tensors distinct when keyed by name? A program from the DSL
 * names every member uniquely; hand-built IR may not (then ids key them, as before). */
int nsr_ex_streams_by_name(const tpk_program *p, tpk_ctx *ctx)
{
    size_t n = (size_t)p->navars + (size_t)p->nembeds + (size_t)p->ninstr, k = 0;
    uint64_t *h = tpk_malloc(ctx, (n + 1) * sizeof *h);
    if (h == NULL)
        return -1; /* no memory: not "by ids", which would draw other numbers */
    for (int i = 0; i < p->navars; i++)
        h[k++] = tpk_rng_stream_named(TPK_RNG_AVAR, p->avar[i].name ? p->avar[i].name : "");
    for (int i = 0; i < p->nembeds; i++)
        h[k++] = tpk_rng_stream_named(TPK_RNG_EMBED, p->embed[i].name ? p->embed[i].name : "");
    for (int i = 0; i < p->ninstr; i++)
        if (p->instr[i].op == TPK_OP_BIAS) {
            const char *nm = p->var[p->instr[i].out].name;
            h[k++] = tpk_rng_stream_named(TPK_RNG_BIAS, nm ? nm : "");
        }
    qsort(h, k, sizeof *h, cmp_u64);
    int ok = 1;
    for (size_t i = 1; i < k && ok; i++)
        ok = h[i] != h[i - 1];
    tpk_free(ctx, h);
    return ok;
}

static double *normals(ex *E, uint64_t stream, size_t rows, size_t cols)
{
    double *z = tpk_malloc(E->ctx, rows * cols * sizeof *z);
    if (z == NULL) {
        TPK_ERROR(E->ctx, TPK_ENOMEM, "out of memory for a %zu×%zu random matrix", rows, cols);
        return NULL;
    }
#pragma omp parallel for schedule(static) if (rows * cols >= PAR_MIN)
    for (size_t r = 0; r < rows; r++)
        tpk_rng_normal_row(E->seed, stream, (uint32_t)r, 0, cols, z + r * cols);
    return z;
}

static void set_last(ex *E, int v, int k)
{
    if (E->last[v] < k)
        E->last[v] = k;
}

int nsr_ex_setup(ex *E, int all_outputs)
{
    const tpk_program *p = E->p;
    int nv = p->nvars, ni = p->ninstr;
    E->val = tpk_calloc(E->ctx, (size_t)nv, sizeof *E->val);
    E->Z = tpk_calloc(E->ctx, (size_t)p->navars + 1, sizeof *E->Z);
    E->U = tpk_calloc(E->ctx, (size_t)p->nembeds + 1, sizeof *E->U);
    E->last = tpk_malloc(E->ctx, (size_t)nv * sizeof *E->last);
    E->lastA = tpk_malloc(E->ctx, ((size_t)p->navars + 1) * sizeof *E->lastA);
    E->lastU = tpk_malloc(E->ctx, ((size_t)p->nembeds + 1) * sizeof *E->lastU);
    if (!E->val || !E->Z || !E->U || !E->last || !E->lastA || !E->lastU)
        return TPK_ERROR(E->ctx, TPK_ENOMEM, "out of memory setting up the executor");
    for (int v = 0; v < nv; v++)
        E->last[v] = -1;
    for (int k = 0; k < ni; k++) {
        const tpk_instr *in = &p->instr[k];
        switch (in->op) {
        case TPK_OP_EMBED:
            E->lastU[in->avar] = k;
            break;
        case TPK_OP_MATMUL:
            E->lastA[in->avar] = k;
            set_last(E, in->src, k);
            break;
        case TPK_OP_LINCOMB:
            for (int t = 0; t < in->nterms; t++)
                set_last(E, in->term[t], k);
            break;
        case TPK_OP_NONLIN:
        case TPK_OP_MOMENT:
            for (int j = 0; j < in->body.len; j++)
                if (in->body.node[j].op == TPK_RPN_GVAR || in->body.node[j].op == TPK_RPN_SCALAR)
                    set_last(E, in->body.node[j].var, k);
            break;
        default:
            break;
        }
    }
    for (int o = all_outputs ? 0 : p->noutputs - 1; o < p->noutputs; o++)
        for (int k = 0; k < nsr_out_nparts(&p->output[o]); k++)
            set_last(E, nsr_out_part(&p->output[o], k), ni);
    return TPK_OK;
}

void nsr_ex_free(ex *E)
{
    const tpk_program *p = E->p;
    if (E->val)
        for (int v = 0; v < p->nvars; v++)
            tpk_free(E->ctx, E->val[v]);
    if (E->Z)
        for (int i = 0; i < p->navars; i++)
            tpk_free(E->ctx, E->Z[i]);
    if (E->U)
        for (int i = 0; i < p->nembeds; i++)
            tpk_free(E->ctx, E->U[i]);
    tpk_free(E->ctx, E->val);
    tpk_free(E->ctx, E->Z);
    tpk_free(E->ctx, E->U);
    tpk_free(E->ctx, E->last);
    tpk_free(E->ctx, E->lastA);
    tpk_free(E->ctx, E->lastU);
}

/* Evaluate a body over all (input, coordinate) pairs; Moment: per-input means into out[N]. */
static int eval_body(ex *E, const tpk_instr *in, int moment, double *out)
{
    size_t N = E->N, n = E->n, nb = (n + BLK - 1) / BLK;
    const tpk_rpn *b = &in->body;
    double *part = NULL;
    if (moment && (part = tpk_malloc(E->ctx, N * nb * sizeof *part)) == NULL)
        return TPK_ERROR(E->ctx, TPK_ENOMEM, "out of memory");
    int oom = 0;
#pragma omp parallel if (N * n >= PAR_MIN / 4)
    {
        double *stack = tpk_malloc(E->ctx, (size_t)E->maxdepth * BLK * sizeof *stack);
        double *tmp = tpk_malloc(E->ctx, BLK * sizeof *tmp);
        const double **gv = tpk_malloc(E->ctx, (size_t)b->len * sizeof *gv);
        double *sv = tpk_malloc(E->ctx, (size_t)b->len * sizeof *sv);
        int ok = stack && tmp && gv && sv;
        if (!ok) {
#pragma omp atomic write
            oom = 1;
        }
#pragma omp for schedule(static) collapse(2)
        for (size_t a = 0; a < N; a++)
            for (size_t j = 0; j < nb; j++) {
                if (!ok)
                    continue;
                size_t lo = j * BLK, B = n - lo < BLK ? n - lo : BLK;
                for (int i = 0; i < b->len; i++) {
                    const tpk_rpn_node *nd = &b->node[i];
                    if (nd->op == TPK_RPN_GVAR)
                        gv[i] = E->val[nd->var] + a * n + lo;
                    else if (nd->op == TPK_RPN_SCALAR)
                        sv[i] = E->val[nd->var][a];
                }
                double *dst = moment ? tmp : out + a * n + lo;
                tpk_nsr_rpn_eval(b->node, b->len, gv, sv, B, stack, dst);
                if (moment) {
                    double s = 0.0;
                    for (size_t q = 0; q < B; q++)
                        s += tmp[q];
                    part[a * nb + j] = s;
                }
            }
        tpk_free(E->ctx, stack);
        tpk_free(E->ctx, tmp);
        tpk_free(E->ctx, gv);
        tpk_free(E->ctx, sv);
    }
    if (oom) {
        tpk_free(E->ctx, part);
        return TPK_ERROR(E->ctx, TPK_ENOMEM, "out of memory evaluating a body");
    }
    if (moment) {
        /* fixed-order reduction: independent of the thread count */
        for (size_t a = 0; a < N; a++) {
            double s = 0.0;
            for (size_t j = 0; j < nb; j++)
                s += part[a * nb + j];
            out[a] = s / (double)n;
        }
        tpk_free(E->ctx, part);
    }
    return TPK_OK;
}

int nsr_ex_step(ex *E, int k)
{
    const tpk_program *p = E->p;
    const tpk_instr *in = &p->instr[k];
    size_t N = E->N, n = E->n, d = E->d;
    int type = p->var[in->out].type;
    double *out = tpk_malloc(E->ctx, (type == TPK_VAR_SCALAR ? N : N * n) * sizeof *out);
    if (out == NULL)
        return TPK_ERROR(E->ctx, TPK_ENOMEM, "out of memory for variable '%s' (%zu×%zu)",
                         p->var[in->out].name ? p->var[in->out].name : "?", N, n);
    E->val[in->out] = out;
    switch (in->op) {
    case TPK_OP_EMBED: {
        /* out_a = U x_a^slot, U_αj = σ_U/√d · z */
        if (E->U[in->avar] == NULL &&
            (E->U[in->avar] = normals(E, E->named ? tpk_rng_stream_named(TPK_RNG_EMBED,
                                                                         p->embed[in->avar].name)
                                                 : TPK_RNG_STREAM(TPK_RNG_EMBED, in->avar), n, d)) == NULL)
            return E->ctx->status;
        return tpk_dgemm(TPK_NO_TRANS, TPK_TRANS, N, n, d, sqrt(in->var / (double)d),
                         E->x + (size_t)in->src * d, E->T * d, E->U[in->avar], d, 0.0, out, n,
                         E->ctx);
    }
    case TPK_OP_BIAS: {
        uint64_t stream = E->named ? tpk_rng_stream_named(TPK_RNG_BIAS, p->var[in->out].name)
                                   : TPK_RNG_STREAM(TPK_RNG_BIAS, in->out);
        double s = sqrt(in->var);
        for (size_t r = 0; r < n; r++)
            out[r] = in->mean + s * tpk_rng_normal_at(E->seed, stream, (uint32_t)r, 0);
        for (size_t a = 1; a < N; a++)
            memcpy(out + a * n, out, n * sizeof *out);
        return TPK_OK;
    }
    case TPK_OP_MATMUL: {
        /* out_a = W src_a, W_αβ = σ_W/√n · z_αβ: one GEMM for the batch */
        if (E->Z[in->avar] == NULL &&
            (E->Z[in->avar] = normals(E, E->named ? tpk_rng_stream_named(TPK_RNG_AVAR,
                                                                         p->avar[in->avar].name)
                                                 : TPK_RNG_STREAM(TPK_RNG_AVAR, in->avar), n, n)) == NULL)
            return E->ctx->status;
        return tpk_dgemm(TPK_NO_TRANS, TPK_TRANS, N, n, n, sqrt(p->avar[in->avar].var / (double)n),
                         E->val[in->src], n, E->Z[in->avar], n, 0.0, out, n, E->ctx);
    }
    case TPK_OP_LINCOMB:
#pragma omp parallel for schedule(static) if (N * n >= PAR_MIN)
        for (size_t i = 0; i < N * n; i++) {
            double s = 0.0;
            for (int t = 0; t < in->nterms; t++)
                s += in->coef[t] * E->val[in->term[t]][i];
            out[i] = s;
        }
        return TPK_OK;
    case TPK_OP_NONLIN:
        if (in->bnorm) { /* φ(bn(g)): normalise g across each batch, then the body (§2.5) */
            int g = in->body.node[0].var, st;
            double *raw = E->val[g], *nrm = tpk_malloc(E->ctx, N * n * sizeof *nrm);
            if (nrm == NULL)
                return TPK_ERROR(E->ctx, TPK_ENOMEM, "out of memory for bn(%s)", p->var[g].name);
            memcpy(nrm, raw, N * n * sizeof *nrm);
            st = tpk_bn_apply(nrm, N, n, (size_t)in->batch, in->bn_eps, E->ctx);
            E->val[g] = nrm;
            if (st == TPK_OK)
                st = eval_body(E, in, 0, out);
            E->val[g] = raw;
            tpk_free(E->ctx, nrm);
            return st;
        }
        return eval_body(E, in, 0, out);
    case TPK_OP_MOMENT: {
        int st = eval_body(E, in, 1, out);
        if (st == TPK_OK && in->src == 1) /* sqrt(n) * mean(q * k) = <q, k>/sqrt(n) (theory §5) */
            for (size_t a = 0; a < N; a++)
                out[a] *= sqrt((double)n);
        return st;
    }
    default:
        return TPK_ERROR(E->ctx, TPK_EINVAL, "unknown instruction %d", in->op);
    }
}

/* Part k of output o's readout vector at width n (N(0, 1) entries; the variance is applied by
 * the caller): the default readout's first part is the stream the rolled executor draws; a
 * further part k, and every part of a readout vector u of its own, a stream named after it. */
void nsr_ex_readout_vector(const tpk_output *o, int k, uint64_t seed, size_t n, double *v)
{
    uint64_t stream = TPK_RNG_STREAM(TPK_RNG_READOUT, 0);
    if (o->readout != NULL || k > 0) {
        char nm[160];
        snprintf(nm, sizeof nm, "%s[%d]", o->readout ? o->readout : "", k + 1);
        stream = tpk_rng_stream_named(TPK_RNG_READOUT, nm);
    }
    for (size_t r = 0; r < n; r++)
        v[r] = tpk_rng_normal_at(seed, stream, (uint32_t)r, 0);
}

/* The output bias of output o: z_b of its readout vector (N(0, 1)). */
double nsr_ex_readout_bias(const tpk_output *o, uint64_t seed)
{
    uint64_t stream = TPK_RNG_STREAM(TPK_RNG_READOUT, 1);
    if (o->readout != NULL) {
        char nm[160];
        snprintf(nm, sizeof nm, "%s.bias", o->readout);
        stream = tpk_rng_stream_named(TPK_RNG_READOUT, nm);
    }
    return tpk_rng_normal_at(seed, stream, 0, 0);
}

/* The readout of output o at width n over N inputs, into y[a·ld]: y = ⟨v, [h_1; ...; h_m]⟩/√(mn)·σ_v
 * + √β·z_b. The default readout's v (part 1) and z_b are the streams the rolled executor draws;
 * a further part k, and every part of a readout vector u of its own, has a stream named after
 * it ("[k]", "u[k]", "u.bias"), so outputs of one readout vector share v and β and outputs of
 * different ones are independent. */
static int readout_values(const tpk_output *o, double *const *val, size_t N, size_t n,
                          uint64_t seed, double *y, size_t ld, tpk_ctx *ctx)
{
    int m = nsr_out_nparts(o);
    double *v = tpk_malloc(ctx, n * sizeof *v);
    if (v == NULL)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    for (size_t a = 0; a < N; a++)
        y[a * ld] = 0.0;
    for (int k = 0; k < m; k++) {
        nsr_ex_readout_vector(o, k, seed, n, v);
        const double *h = val[nsr_out_part(o, k)];
        for (size_t a = 0; a < N; a++) {
            double acc = 0.0;
            for (size_t r = 0; r < n; r++)
                acc += v[r] * h[a * n + r];
            y[a * ld] += acc;
        }
    }
    tpk_free(ctx, v);
    double zb = o->bias_var > 0.0 ? nsr_ex_readout_bias(o, seed) : 0.0;
    double s = sqrt(o->var / ((double)n * m));
    for (size_t a = 0; a < N; a++)
        y[a * ld] = s * y[a * ld] + sqrt(o->bias_var) * zb;
    return TPK_OK;
}

int tpk_netsor_run(const tpk_program *p, const tpk_array *x, size_t n, uint64_t seed,
                   int all_outputs, tpk_array **Khat, tpk_array **y, tpk_ctx *ctx)
{
    int st = tpk_array_check_input(x, "tpk_netsor_run", "x", ctx);
    return st ? st : tpk_netsor_run_progress(p, x, n, seed, all_outputs, NULL, Khat, y, ctx);
}

/* The rolled executor's run (nsr_form_rolled_first's run). */
typedef struct rolled_job {
    const tpk_program *p;
    const tpk_array *x;
    size_t n;
    uint64_t seed;
    int all_outputs;
    tpk_array **Khat, **y;
    const tpk_progress *progress;
} rolled_job;

static int rolled_run(void *arg, int *unsup, tpk_ctx *ctx)
{
    const rolled_job *J = arg;
    return nsr_fexec_run(J->p, J->x, J->n, J->seed, J->all_outputs, J->Khat, J->y, unsup,
                         J->progress, ctx);
}

int tpk_netsor_run_progress(const tpk_program *p, const tpk_array *x, size_t n, uint64_t seed,
                            int all_outputs, const tpk_progress *progress, tpk_array **Khat,
                            tpk_array **y, tpk_ctx *ctx)
{
    tpk_nsr_shape sh;
    if (Khat == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_netsor_run: Khat must not be NULL");
    *Khat = NULL;
    if (y)
        *y = NULL;
    if (n < 1 || n > UINT32_MAX / 2)
        return TPK_ERROR(ctx, TPK_EINVAL, "width n = %zu outside 1..%u", n, UINT32_MAX / 2);
    int bad = tpk_array_check_input(x, "tpk_netsor_run_progress", "x", ctx);
    if (bad)
        return bad;
    /* the rolled form first (whole families as GEMMs); a form it does not take falls back to
     * the unrolled one. TPK_NETSOR_FORM=unrolled: the unrolled executor where it exists. */
    int force_unrolled = nsr_form_unrolled_env() && p != NULL && p->ninstr > 0;
    rolled_job RJ = {p, x, n, seed, all_outputs, Khat, y, progress};
    int rst;
    if (nsr_form_rolled_first(p, p != NULL && p->rolled != NULL, force_unrolled,
                              "rolled executor", rolled_run, &RJ, &rst, ctx))
        return rst;
    int st = tpk_nsr_validate(p, x, all_outputs, &sh, ctx);
    if (st)
        return st;
    ex E;
    memset(&E, 0, sizeof E);
    E.p = p;
    E.N = sh.N;
    E.T = sh.T;
    E.d = sh.d;
    E.n = n;
    E.x = x->data;
    E.seed = seed;
    E.maxdepth = sh.maxdepth;
    E.maxlen = sh.maxlen;
    E.ctx = ctx;
    E.named = nsr_ex_streams_by_name(p, ctx);
    tpk_array *K = NULL, *Y = NULL;
    double *M = NULL;
    if (E.named < 0)
        st = TPK_ENOMEM; /* recorded in ctx (which may be NULL) */
    if (st || (st = nsr_ex_setup(&E, all_outputs)))
        goto done;
    for (int k = 0; k < p->ninstr; k++) {
        const tpk_instr *in = &p->instr[k];
        if ((st = tpk_progress_report(progress, "instructions", (size_t)k, (size_t)p->ninstr, ctx)) ||
            (st = nsr_ex_step(&E, k)))
            goto done;
        /* liveness: drop what no later instruction reads */
        if (in->op == TPK_OP_MATMUL && E.lastA[in->avar] == k) {
            tpk_free(ctx, E.Z[in->avar]);
            E.Z[in->avar] = NULL;
        }
        if (in->op == TPK_OP_EMBED && E.lastU[in->avar] == k) {
            tpk_free(ctx, E.U[in->avar]);
            E.U[in->avar] = NULL;
        }
        if (E.last[in->out] < k) { /* never read */
            tpk_free(ctx, E.val[in->out]);
            E.val[in->out] = NULL;
        }
        if (in->op == TPK_OP_MATMUL && E.last[in->src] == k) {
            tpk_free(ctx, E.val[in->src]);
            E.val[in->src] = NULL;
        } else if (in->op == TPK_OP_LINCOMB) {
            for (int t = 0; t < in->nterms; t++)
                if (E.last[in->term[t]] == k) {
                    tpk_free(ctx, E.val[in->term[t]]);
                    E.val[in->term[t]] = NULL;
                }
        } else if (in->op == TPK_OP_NONLIN || in->op == TPK_OP_MOMENT) {
            for (int j = 0; j < in->body.len; j++) {
                const tpk_rpn_node *nd = &in->body.node[j];
                if ((nd->op == TPK_RPN_GVAR || nd->op == TPK_RPN_SCALAR) && E.last[nd->var] == k) {
                    tpk_free(ctx, E.val[nd->var]);
                    E.val[nd->var] = NULL;
                }
            }
        }
    }
    if ((st = tpk_progress_report(progress, "instructions", (size_t)p->ninstr, (size_t)p->ninstr,
                                  ctx)))
        goto done;
    size_t N = E.N;
    int o0 = all_outputs ? 0 : p->noutputs - 1, O = p->noutputs - o0;
    size_t dim = N * (size_t)O;
    K = tpk_array_alloc2(dim, dim, ctx);
    M = tpk_malloc(ctx, N * N * sizeof *M);
    if (K == NULL || M == NULL) {
        st = K == NULL ? ctx->status : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        goto done;
    }
    /* Khat[(a,o),(c,o')] = σ_v² ⟨h^o_a, h^o'_c⟩/n */
    for (int oi = 0; oi < O; oi++)
        for (int oj = 0; oj <= oi; oj++) {
            const tpk_output *po = &p->output[o0 + oi], *pq = &p->output[o0 + oj];
            /* part k meets part k through one readout vector; independent ones: 0 (§1.5) */
            int same = nsr_same_readout(po, pq), m = nsr_out_nparts(po);
            double s = sqrt(po->var * pq->var) / ((double)n * m);
            double beta = same ? sqrt(po->bias_var * pq->bias_var) : 0.0; /* Var β everywhere */
            if (!same)
                memset(M, 0, N * N * sizeof *M);
            for (int k = 0; same && k < m; k++)
                if ((st = tpk_dgemm(TPK_NO_TRANS, TPK_TRANS, N, N, n, s,
                                    E.val[nsr_out_part(po, k)], n, E.val[nsr_out_part(pq, k)], n,
                                    k ? 1.0 : 0.0, M, N, ctx)))
                    goto done;
            for (size_t a = 0; a < N; a++)
                for (size_t c = 0; c < N; c++) {
                    /* same block: mirror the lower triangle so Khat is exactly symmetric */
                    double v = ((oi == oj && c > a) ? M[c * N + a] : M[a * N + c]) + beta;
                    K->data[(a * (size_t)O + (size_t)oi) * dim + c * (size_t)O + (size_t)oj] = v;
                    K->data[(c * (size_t)O + (size_t)oj) * dim + a * (size_t)O + (size_t)oi] = v;
                }
        }
    if (y) {
        /* y_a^o = ⟨v, [h^o_1; ...; h^o_m]_a⟩/√(mn) + β: the readout v ~ N(0, σ_v²) and the bias
         * are shared by the outputs of one readout vector (§1.5) */
        Y = tpk_array_alloc2(N, (size_t)O, ctx);
        if (Y == NULL) {
            st = ctx->status;
            goto done;
        }
        for (int o = 0; o < O && st == TPK_OK; o++)
            st = readout_values(&p->output[o0 + o], E.val, N, n, seed, Y->data + o, (size_t)O, ctx);
        if (st)
            goto done;
        *y = Y;
        Y = NULL;
    }
    *Khat = K;
    K = NULL;
done:
    tpk_free(ctx, M);
    tpk_array_free(K);
    tpk_array_free(Y);
    nsr_ex_free(&E);
    return st;
}
