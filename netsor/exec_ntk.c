/* The empirical NTK of a finite network, Θ̂ = J Jᵀ over every parameter, by one backward pass of
 * the member-level executor (theory.md §8.9). The forward pass runs the tangent program
 * (tangent.c), whose partial Nonlins give ∂φ/∂g at every coordinate; the backward pass carries,
 * for every variable, the gradient of every output (row a·O + o: input a, output o) with
 * respect to its value at that input. Each weight's contribution is the structured sum over
 * pairs of its uses (y = W z, ȳ = W z̄): (dyᵀ dȳ)(zᵀ z̄)/fan_in, times σ_W² in neural-tangents'
 * parameterisation — the Jacobian itself is never formed. A Moment m = mean(ψ) carries its
 * gradient to every coordinate (dg += dm ∂ψ/∂g / n) and from the bodies that read it (dm +=
 * Σ_α ∂φ/∂m dh): the exact J Jᵀ of the finite network, where the limit drops these terms.
 * A program with bn(...) couples the inputs of a batch: an output at input a then depends on the
 * values at every input b of its batch, and the gradients are carried per (output row, input b)
 * pair — rows R·N instead of R — through the exact BatchNorm backward (theory.md §8.6). */
#include <math.h>
#include <string.h>

#include "exec-impl.h"
#include "tpk/alloc.h"
#include "tpk/batchnorm.h"
#include "tpk/matmul.h"


/* The input whose value gradient row `row` is taken at. */
static inline size_t row_input(const nsr_bw *X, size_t row)
{
    return X->coupled ? row % X->E.N : row / (size_t)X->O;
}

double *nsr_bw_adj(nsr_bw *X, int v)
{
    if (X->A[v] == NULL)
        X->A[v] = tpk_calloc(X->E.ctx, X->rows * (X->t.q->var[v].type == TPK_VAR_SCALAR ? 1 : X->E.n),
                             sizeof *X->A[v]);
    return X->A[v];
}

/* A body's partials (tangent.c) applied to the gradient of its value: a Nonlin's dh (R×n) or a
 * Moment's dm (R, the mean's 1/n folded in): dg_i += ∂_iφ ⊙ dh, ds_j += Σ_α ∂_jφ · dh. */
static int body_backward(nsr_bw *X, const nsr_partials *d, const double *Ay, int moment, double *into)
{
    size_t R = X->rows, n = X->E.n;
    for (int i = 0; i < d->n; i++) {
        double *Ag = into ? into : nsr_bw_adj(X, d->g[i]);
        const double *D = X->E.val[d->d[i]];
        if (Ag == NULL)
            return TPK_ERROR(X->E.ctx, TPK_ENOMEM, "out of memory");
        for (size_t r = 0; r < R; r++)
            for (size_t j = 0; j < n; j++)
                Ag[r * n + j] += D[row_input(X, r) * n + j] * (moment ? Ay[r] / (double)n : Ay[r * n + j]);
    }
    for (int i = 0; i < d->ns; i++) {
        double *As = nsr_bw_adj(X, d->s[i]);
        const double *D = X->E.val[d->ds[i]];
        if (As == NULL)
            return TPK_ERROR(X->E.ctx, TPK_ENOMEM, "out of memory");
        for (size_t r = 0; r < R; r++) {
            double acc = 0;
            for (size_t j = 0; j < n; j++)
                acc += D[row_input(X, r) * n + j] * (moment ? Ay[r] / (double)n : Ay[r * n + j]);
            As[r] += acc;
        }
    }
    return TPK_OK;
}

/* Θ̂ += f · (A1 A2ᵀ) ⊙ (Z1 Z2ᵀ) over gradient-row pairs, Z rows by input (row_input): one pair
 * of uses of a weight; Z1, Z2 (N × k, leading dimension ldz) its operands; Z1 NULL: a bias
 * (z = 1). Coupled rows (r, b) sum over every pair of inputs (b, b′) into Θ̂[r][r′]. */
static int use_pair(nsr_bw *X, const double *A1, const double *A2, const double *Z1, const double *Z2,
                    size_t k, size_t ldz, double f, double *T)
{
    size_t R = X->R, N = X->E.N, n = X->E.n, rows = X->rows;
    tpk_ctx *ctx = X->E.ctx;
    int st = tpk_dgemm(TPK_NO_TRANS, TPK_TRANS, rows, rows, n, 1.0, A1, n, A2, n, 0.0, X->G1, rows,
                       ctx);
    if (st == TPK_OK && Z1 != NULL)
        st = tpk_dgemm(TPK_NO_TRANS, TPK_TRANS, N, N, k, 1.0, Z1, ldz, Z2, ldz, 0.0, X->G2, N, ctx);
    if (st)
        return st;
    if (!X->coupled) {
        size_t O = (size_t)X->O;
        for (size_t r = 0; r < R; r++)
            for (size_t c = 0; c < R; c++)
                T[r * R + c] += f * X->G1[r * R + c] * (Z1 != NULL ? X->G2[(r / O) * N + c / O] : 1.0);
        return TPK_OK;
    }
    for (size_t r = 0; r < R; r++)
        for (size_t c = 0; c < R; c++) {
            double acc = 0.0;
            for (size_t a = 0; a < N; a++) {
                const double *g1 = X->G1 + (r * N + a) * rows + c * N;
                for (size_t b = 0; b < N; b++)
                    acc += g1[b] * (Z1 != NULL ? X->G2[a * N + b] : 1.0);
            }
            T[r * R + c] += f * acc;
        }
    return TPK_OK;
}

/* dg += Jᵀ (φ′ ⊙ dh) for h = φ(bn(g)), per neuron j and batch: with u = G g, σ² = ‖u‖²/B + ε and
 * ζ̃ = u/σ, J = (1/σ)(G − uuᵀ/(Bσ²)) is symmetric, and J t = (1/σ)(t − mean t − ζ̃ (ζ̃ᵀt)/B)
 * (theory.md §8.6). A degenerate column at ε = 0 (tpk_bn_apply's rule: BN = 0) passes nothing
 * back. */
static int bn_backward(nsr_bw *X, const tpk_instr *in, const double *Ay)
{
    const nsr_partials *d = &X->t.part[in->out];
    size_t N = X->E.N, n = X->E.n, R = X->R, rows = X->rows;
    size_t B = in->batch ? (size_t)in->batch : N;
    tpk_ctx *ctx = X->E.ctx;
    if (d->n != 1 || !X->coupled)
        return TPK_ERROR(ctx, TPK_EINVAL, "bn(...) backward: the body must read one G-var");
    double *t = tpk_calloc(ctx, rows * n, sizeof *t), *Ag = nsr_bw_adj(X, d->g[0]);
    double *z = tpk_malloc(ctx, B * sizeof *z);
    int st = t && Ag && z ? body_backward(X, d, Ay, 0, t) : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    const double *g = X->E.val[d->g[0]];
    for (size_t j = 0; j < n && st == TPK_OK; j++)
        for (size_t b0 = 0; b0 < N; b0 += B) {
            double m = 0.0, ss = 0.0, raw = 0.0;
            for (size_t b = 0; b < B; b++)
                m += g[(b0 + b) * n + j];
            m /= (double)B;
            for (size_t b = 0; b < B; b++) {
                double x = g[(b0 + b) * n + j];
                ss += (x - m) * (x - m);
                raw += x * x;
            }
            double f = tpk_bn_scale(ss, raw, B, in->bn_eps);
            if (f == 0.0)
                continue;
            for (size_t b = 0; b < B; b++)
                z[b] = f * (g[(b0 + b) * n + j] - m);
            for (size_t r = 0; r < R; r++) {
                const double *tr = t + (r * N + b0) * n + j;
                double *ar = Ag + (r * N + b0) * n + j;
                double mt = 0.0, zt = 0.0;
                for (size_t b = 0; b < B; b++) {
                    mt += tr[b * n];
                    zt += z[b] * tr[b * n];
                }
                mt /= (double)B;
                zt /= (double)B;
                for (size_t b = 0; b < B; b++)
                    ar[b * n] += f * (tr[b * n] - mt - z[b] * zt);
            }
        }
    tpk_free(ctx, t);
    tpk_free(ctx, z);
    return st;
}

/* The backward pass: the outputs' gradients with respect to every variable, seeded at the
 * readouts (one row per output and input), then nsr_bw_propagate. */
static int backward(nsr_bw *X)
{
    const tpk_program *q = X->t.q;
    size_t n = X->E.n, O = (size_t)X->O, N = X->E.N;
    tpk_ctx *ctx = X->E.ctx;
    double *v = tpk_malloc(ctx, n * sizeof *v);
    if (v == NULL)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    /* y_{a,o} = σ_v/√(mn) Σ_k ⟨v_k, h_k(a)⟩ + β: ∂y/∂h_k(a) = σ_v/√(mn) v_k */
    for (int oi = 0; oi < X->O; oi++) {
        const tpk_output *o = &q->output[X->o0 + oi];
        int m = nsr_out_nparts(o);
        double c = sqrt(o->var / ((double)n * m));
        for (int k = 0; k < m; k++) {
            double *A = nsr_bw_adj(X, nsr_out_part(o, k));
            if (A == NULL) {
                tpk_free(ctx, v);
                return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
            }
            nsr_ex_readout_vector(o, k, X->E.seed, n, v);
            for (size_t a = 0; a < N; a++) { /* output (a, oi) at its own input a */
                size_t row = (a * O + (size_t)oi) * (X->coupled ? N : 1) + (X->coupled ? a : 0);
                for (size_t i = 0; i < n; i++)
                    A[row * n + i] += c * v[i];
            }
        }
    }
    tpk_free(ctx, v);
    return nsr_bw_propagate(X);
}

int nsr_bw_propagate(nsr_bw *X)
{
    const tpk_program *q = X->t.q;
    size_t R = X->rows, n = X->E.n;
    tpk_ctx *ctx = X->E.ctx;
    for (int k = q->ninstr - 1; k >= 0; k--) {
        const tpk_instr *in = &q->instr[k];
        const double *Ay = X->A[in->out];
        if (Ay == NULL)
            continue;
        switch (in->op) {
        case TPK_OP_NONLIN:
        case TPK_OP_MOMENT: {
            int st = in->bnorm ? bn_backward(X, in, Ay)
                               : body_backward(X, &X->t.part[in->out], Ay, in->op == TPK_OP_MOMENT, NULL);
            if (st)
                return st;
            break;
        }
        case TPK_OP_LINCOMB:
            for (int t = 0; t < in->nterms; t++) {
                double *At = nsr_bw_adj(X, in->term[t]);
                if (At == NULL)
                    return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
                for (size_t i = 0; i < R * n; i++)
                    At[i] += in->coef[t] * Ay[i];
            }
            break;
        case TPK_OP_MATMUL: { /* y = c Z z: dz += c dy Z */
            double *Az = nsr_bw_adj(X, in->src);
            if (Az == NULL)
                return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
            int st = tpk_dgemm(TPK_NO_TRANS, TPK_NO_TRANS, R, n, n,
                               sqrt(q->avar[in->avar].var / (double)n), Ay, n, X->E.Z[in->avar], n,
                               1.0, Az, n, ctx);
            if (st)
                return st;
            break;
        }
        default: /* EMBED, BIAS: leaves */
            break;
        }
    }
    return TPK_OK;
}

/* Θ̂'s parameter terms: every pair of uses of each weight, embedding and bias (theory.md §8.9). */
static int parameters(nsr_bw *X, int param, double *T)
{
    const tpk_program *q = X->t.q;
    size_t n = X->E.n, d = X->E.d, ldx = X->E.T * d;
    int st = TPK_OK;
    for (int k1 = 0; k1 < q->ninstr && st == TPK_OK; k1++) {
        const tpk_instr *a = &q->instr[k1];
        const double *A1 = X->A[a->out];
        if (A1 == NULL)
            continue;
        if (a->op == TPK_OP_BIAS) {
            st = use_pair(X, A1, A1, NULL, NULL, 0, 0, tpk_ntk_own(param, a->var, 1.0), T);
            continue;
        }
        if (a->op != TPK_OP_MATMUL && a->op != TPK_OP_EMBED)
            continue;
        for (int k2 = 0; k2 < q->ninstr && st == TPK_OK; k2++) {
            const tpk_instr *b = &q->instr[k2];
            if (b->op != a->op || b->avar != a->avar || X->A[b->out] == NULL)
                continue;
            /* the raw term (dy·dȳ)(z·z̄)/fan_in times the weight's own factor (tpk_ntk_own) */
            if (a->op == TPK_OP_MATMUL) {
                double w = tpk_ntk_own(param, q->avar[a->avar].var, (double)n) / (double)n;
                st = use_pair(X, A1, X->A[b->out], X->E.val[a->src], X->E.val[b->src], n, n, w, T);
            } else {
                double w = tpk_ntk_own(param, q->embed[a->avar].var, (double)d) / (double)d;
                st = use_pair(X, A1, X->A[b->out], X->E.x + (size_t)a->src * d,
                              X->E.x + (size_t)b->src * d, d, ldx, w, T);
            }
        }
    }
    return st;
}

/* The readouts' own terms: K̂ (σ_v σ_v′/(mn) Σ_k h_k·h̄_k + β β′ between outputs of one readout
 * vector), and Θ̂'s readout term (K̂ itself, or without the variances: TP II's). */
static void readouts(nsr_bw *X, int param, double *K, double *T)
{
    const tpk_program *q = X->t.q;
    size_t N = X->E.N, n = X->E.n, R = X->R, O = (size_t)X->O;
    for (size_t r = 0; r < R; r++)
        for (size_t c = 0; c <= r; c++) {
            const tpk_output *po = &q->output[X->o0 + (int)(r % O)];
            const tpk_output *pq = &q->output[X->o0 + (int)(c % O)];
            size_t a = r / O, b = c / O;
            double e = 0;
            int m = nsr_out_nparts(po);
            if (nsr_same_readout(po, pq))
                for (int k = 0; k < m; k++) {
                    const double *h = X->E.val[nsr_out_part(po, k)] + a * n;
                    const double *g = X->E.val[nsr_out_part(pq, k)] + b * n;
                    for (size_t i = 0; i < n; i++)
                        e += h[i] * g[i];
                }
            int same = nsr_same_readout(po, pq);
            double kk = same ? sqrt(po->var * pq->var) / ((double)n * m) * e +
                                   sqrt(po->bias_var * pq->bias_var) : 0.0;
            /* the readout's raw term e/(mn) and its bias (one only where declared, outside NT) */
            const double mn = (double)n * m;
            int bias = param == TPK_NTK_PARAM_NTK || (po->bias_var > 0 && pq->bias_var > 0);
            double tt = !same ? 0.0
                        : param == TPK_NTK_PARAM_NTK
                            ? kk
                            : tpk_ntk_own(param, 0.0, mn) / mn * e +
                                  (bias ? tpk_ntk_own(param, 0.0, 1.0) : 0.0);
            K[r * R + c] = K[c * R + r] = kk;
            T[r * R + c] += tt;
            if (c != r)
                T[c * R + r] += tt;
        }
    (void)N;
}

int nsr_bw_init(nsr_bw *X, const tpk_program *p, const tpk_array *x, size_t n, uint64_t seed,
                int all_outputs, tpk_ctx *ctx)
{
    memset(X, 0, sizeof *X);
    int st = nsr_tangent_build(p, &X->t, ctx);
    if (st)
        return st;
    const tpk_program *q = X->t.q;
    tpk_nsr_shape sh;
    if ((st = tpk_nsr_validate(q, x, all_outputs, &sh, ctx)))
        return st;
    ex *E = &X->E;
    E->p = q;
    E->N = sh.N;
    E->T = sh.T;
    E->d = sh.d;
    E->n = n;
    E->x = x->data;
    E->seed = seed;
    E->maxdepth = sh.maxdepth;
    E->maxlen = sh.maxlen;
    E->ctx = ctx;
    /* the same random tensors as tpk_netsor_run of p: streams keyed by the same names */
    E->named = nsr_ex_streams_by_name(q, ctx);
    if (E->named < 0 || (st = nsr_ex_setup(E, all_outputs)))
        return st ? st : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    X->o0 = all_outputs ? 0 : q->noutputs - 1;
    X->O = q->noutputs - X->o0;
    X->R = E->N * (size_t)X->O;
    X->rows = X->R;
    X->A = tpk_calloc(ctx, (size_t)q->nvars, sizeof *X->A);
    return X->A ? TPK_OK : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
}

void nsr_bw_free(nsr_bw *X, tpk_ctx *ctx)
{
    if (X->A && X->t.q)
        for (int v = 0; v < X->t.q->nvars; v++)
            tpk_free(ctx, X->A[v]);
    tpk_free(ctx, X->A);
    tpk_free(ctx, X->G1);
    tpk_free(ctx, X->G2);
    nsr_ex_free(&X->E);
    nsr_tangent_free(&X->t, ctx);
    memset(X, 0, sizeof *X);
}

int tpk_netsor_run_ntk(const tpk_program *p, const tpk_array *x, size_t n, uint64_t seed,
                       int all_outputs, int param, tpk_array **Khat, tpk_array **That,
                       tpk_ctx *ctx)
{
    if (That == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_netsor_run_ntk: That must not be NULL");
    *That = NULL;
    if (Khat)
        *Khat = NULL;
    int st = tpk_array_check_input(x, "tpk_netsor_run_ntk", "x", ctx);
    if (st)
        return st;
    if (p == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_netsor_run_ntk: no program");
    if (n < 1 || n > UINT32_MAX / 2)
        return TPK_ERROR(ctx, TPK_EINVAL, "width n = %zu outside 1..%u", n, UINT32_MAX / 2);
    if (param != TPK_NTK_PARAM_NTK && param != TPK_NTK_PARAM_TP && param != TPK_NTK_PARAM_STANDARD)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_netsor_run_ntk: parameterisation %d is none of "
                         "TPK_NTK_PARAM_NTK, _TP, _STANDARD", param);
    if (p->ninstr == 0)
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED,
                         "%s: the finite-width NTK runs the unrolled form, which this program does "
                         "not have (too large after unrolling)", p->path ? p->path : "program");
    if (p->features & TPK_FEAT_SQRT_N_LOGITS)
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED,
                         "%s: sqrt(n) * mean(q * k) logits are outside Tensor Programs II: no NTK",
                         p->path ? p->path : "program");
    nsr_bw X;
    memset(&X, 0, sizeof X);
    tpk_array *K = NULL, *T = NULL;
    if ((st = nsr_bw_init(&X, p, x, n, seed, all_outputs, ctx)))
        goto done;
    const tpk_program *q = X.t.q;
    ex *E = &X.E;
    for (int k = 0; k < q->ninstr && st == TPK_OK; k++) /* every value is kept for the backward pass */
        st = nsr_ex_step(E, k);
    if (st)
        goto done;
    for (int k = 0; k < q->ninstr; k++)
        X.coupled |= q->instr[k].op == TPK_OP_NONLIN && q->instr[k].bnorm;
    X.rows = X.coupled ? X.R * E->N : X.R;
    X.G1 = tpk_malloc(ctx, X.rows * X.rows * sizeof *X.G1);
    X.G2 = tpk_malloc(ctx, E->N * E->N * sizeof *X.G2);
    K = tpk_array_alloc2(X.R, X.R, ctx);
    T = tpk_array_alloc2(X.R, X.R, ctx);
    if (!X.A || !X.G1 || !X.G2 || !K || !T) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        goto done;
    }
    memset(T->data, 0, X.R * X.R * sizeof *T->data);
    readouts(&X, param, K->data, T->data);
    if ((st = backward(&X)) || (st = parameters(&X, param, T->data)))
        goto done;
    for (size_t r = 0; r < X.R; r++) /* the two triangles summed alike: mirror for exact symmetry */
        for (size_t c = 0; c < r; c++)
            T->data[c * X.R + r] = T->data[r * X.R + c];
    for (size_t i = 0; i < X.R * X.R; i++)
        if (!isfinite(T->data[i])) {
            st = TPK_ERROR(ctx, TPK_ENUMERIC, "the empirical NTK has a non-finite entry (%zu, %zu)",
                           i / X.R, i % X.R);
            goto done;
        }
    *That = T;
    T = NULL;
    if (Khat) {
        *Khat = K;
        K = NULL;
    }
done:
    tpk_array_free(K);
    tpk_array_free(T);
    nsr_bw_free(&X, ctx);
    return st;
}
