/* A finite network of a program trained by full-batch gradient descent on MSE (issue 36, item 3;
 * theory.md §8.10): the executor's forward pass and the backward pass of the empirical NTK
 * (exec_ntk.c), seeded by the loss's residuals instead of one row per output. The network is
 * tpk_netsor_run's of the same seed, in neural-tangents' 'ntk' parameterisation: every trained
 * scalar is a standard normal (a weight's entries ω with W = σ_W ω/√fan_in, a bias's β with
 * b = μ + σ_b β, the readout's v and its bias), so a step θ ← θ − η ∂L/∂θ on
 * L = (1/2N)‖f(X) − Y‖², N the number of targets, follows the kernel Θ/N of the NTK that
 * tpk_netsor_run_ntk and the limit compute (theory §8.7, §8.10). Training inputs and test inputs
 * run in one forward pass; the test rows carry no loss. */
#include <math.h>
#include <string.h>

#include "exec-impl.h"
#include "tpk/alloc.h"
#include "tpk/matmul.h"

typedef struct trainer {
    nsr_bw X;
    size_t ntrain;
    int *rep;      /* per output: the first output sharing its readout vector and bias */
    double **v;    /* per output rep, part k: v[oi·mmax + k], n entries */
    double *beta;  /* per output rep: the readout bias's standard normal */
    double **bz;   /* per var of the tangent program: a bias's standard normals, else NULL */
    double *f;     /* N × O outputs of the current network */
    double *res;   /* ntrain × O: (f − y)/N_targets */
    int mmax;
} trainer;

static const tpk_output *out_of(const trainer *S, int oi)
{
    return &S->X.t.q->output[S->X.o0 + oi];
}

/* The forward pass with the current parameters: every value kept, biases from S->bz. */
static int forward(trainer *S)
{
    ex *E = &S->X.E;
    const tpk_program *q = E->p;
    size_t N = E->N, n = E->n;
    for (int k = 0; k < q->ninstr; k++) {
        const tpk_instr *in = &q->instr[k];
        tpk_free(E->ctx, E->val[in->out]);
        E->val[in->out] = NULL;
        int st = nsr_ex_step(E, k);
        if (st)
            return st;
        if (in->op == TPK_OP_BIAS) {
            double s = sqrt(in->var), *b = E->val[in->out];
            for (size_t a = 0; a < N; a++)
                for (size_t i = 0; i < n; i++)
                    b[a * n + i] = in->mean + s * S->bz[in->out][i];
        }
    }
    /* f_a^o = σ_v/√(mn) Σ_k ⟨v_k, h_k(a)⟩ + σ_ob β (exec.c, readout_values) */
    for (int oi = 0; oi < S->X.O; oi++) {
        const tpk_output *o = out_of(S, oi);
        int m = nsr_out_nparts(o), r = S->rep[oi];
        double c = sqrt(o->var / ((double)n * m));
        for (size_t a = 0; a < N; a++) {
            double acc = 0.0;
            for (int k = 0; k < m; k++) {
                const double *h = E->val[nsr_out_part(o, k)] + a * n, *v = S->v[r * S->mmax + k];
                for (size_t i = 0; i < n; i++)
                    acc += v[i] * h[i];
            }
            S->f[a * (size_t)S->X.O + (size_t)oi] = c * acc + sqrt(o->bias_var) * S->beta[r];
        }
    }
    return TPK_OK;
}

/* One gradient step from the residuals in S->res: the backward pass seeded at the readouts
 * (row a: ∂L/∂h_k(a) = Σ_o res_{a,o} σ_v/√(mn) v_k), then every parameter moves by −η ∂L/∂θ. The
 * gradients read A and the values only, so each parameter is updated as soon as its gradient is
 * complete. */
static int step(trainer *S, double lr)
{
    nsr_bw *X = &S->X;
    ex *E = &X->E;
    const tpk_program *q = E->p;
    size_t N = E->N, n = E->n, d = E->d, O = (size_t)X->O;
    tpk_ctx *ctx = E->ctx;
    for (int v = 0; v < q->nvars; v++) {
        tpk_free(ctx, X->A[v]);
        X->A[v] = NULL;
    }
    for (int oi = 0; oi < X->O; oi++) {
        const tpk_output *o = out_of(S, oi);
        int m = nsr_out_nparts(o);
        double c = sqrt(o->var / ((double)n * m));
        for (int k = 0; k < m; k++) {
            double *A = nsr_bw_adj(X, nsr_out_part(o, k));
            if (A == NULL)
                return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
            const double *v = S->v[S->rep[oi] * S->mmax + k];
            for (size_t a = 0; a < S->ntrain; a++) {
                double w = c * S->res[a * O + (size_t)oi];
                for (size_t i = 0; i < n; i++)
                    A[a * n + i] += w * v[i];
            }
        }
    }
    int st = nsr_bw_propagate(X);
    for (int k = 0; k < q->ninstr && st == TPK_OK; k++) {
        const tpk_instr *in = &q->instr[k];
        const double *Ay = X->A[in->out];
        if (Ay == NULL)
            continue;
        if (in->op == TPK_OP_MATMUL) /* y = c Z z: ∂L/∂Z = c Ayᵀ z */
            st = tpk_dgemm(TPK_TRANS, TPK_NO_TRANS, n, n, N,
                           -lr * sqrt(q->avar[in->avar].var / (double)n), Ay, n, E->val[in->src],
                           n, 1.0, E->Z[in->avar], n, ctx);
        else if (in->op == TPK_OP_EMBED) /* y = c U x: ∂L/∂U = c Ayᵀ x */
            st = tpk_dgemm(TPK_TRANS, TPK_NO_TRANS, n, d, N, -lr * sqrt(in->var / (double)d), Ay,
                           n, E->x + (size_t)in->src * d, E->T * d, 1.0, E->U[in->avar], d, ctx);
        else if (in->op == TPK_OP_BIAS) { /* b = μ + s β: ∂L/∂β = s Σ_a ∂L/∂b(a) */
            double s = sqrt(in->var);
            for (size_t a = 0; a < N; a++)
                for (size_t i = 0; i < n; i++)
                    S->bz[in->out][i] -= lr * s * Ay[a * n + i];
        }
    }
    /* the readouts last: their seeds above used the vectors before this step */
    for (int oi = 0; oi < X->O && st == TPK_OK; oi++) {
        const tpk_output *o = out_of(S, oi);
        int m = nsr_out_nparts(o), r = S->rep[oi];
        double c = sqrt(o->var / ((double)n * m)), rs = 0.0;
        for (int k = 0; k < m; k++) {
            double *v = S->v[r * S->mmax + k];
            const double *h = E->val[nsr_out_part(o, k)];
            for (size_t a = 0; a < S->ntrain; a++) {
                double w = lr * c * S->res[a * O + (size_t)oi];
                for (size_t i = 0; i < n; i++)
                    v[i] -= w * h[a * n + i];
            }
        }
        for (size_t a = 0; a < S->ntrain; a++)
            rs += S->res[a * O + (size_t)oi];
        S->beta[r] -= lr * sqrt(o->bias_var) * rs;
    }
    return st;
}

static void trainer_free(trainer *S, tpk_ctx *ctx)
{
    const tpk_program *q = S->X.t.q;
    if (S->bz && q)
        for (int v = 0; v < q->nvars; v++)
            tpk_free(ctx, S->bz[v]);
    if (S->v)
        for (int i = 0; i < S->X.O * S->mmax; i++)
            tpk_free(ctx, S->v[i]);
    tpk_free(ctx, S->bz);
    tpk_free(ctx, S->v);
    tpk_free(ctx, S->beta);
    tpk_free(ctx, S->rep);
    tpk_free(ctx, S->f);
    tpk_free(ctx, S->res);
    nsr_bw_free(&S->X, ctx);
}

/* The trained parameters' starting values: tpk_netsor_run's draws (biases, readouts; the
 * weights are drawn by the first forward pass, as the run draws them). */
static int trainer_init(trainer *S, size_t n, uint64_t seed, tpk_ctx *ctx)
{
    nsr_bw *X = &S->X;
    const tpk_program *q = X->t.q;
    size_t O = (size_t)X->O;
    for (int oi = 0; oi < X->O; oi++)
        S->mmax = nsr_out_nparts(out_of(S, oi)) > S->mmax ? nsr_out_nparts(out_of(S, oi)) : S->mmax;
    S->rep = tpk_malloc(ctx, O * sizeof *S->rep);
    S->v = tpk_calloc(ctx, O * (size_t)S->mmax, sizeof *S->v);
    S->beta = tpk_calloc(ctx, O, sizeof *S->beta);
    S->bz = tpk_calloc(ctx, (size_t)q->nvars, sizeof *S->bz);
    S->f = tpk_malloc(ctx, X->E.N * O * sizeof *S->f);
    S->res = tpk_calloc(ctx, S->ntrain * O, sizeof *S->res);
    if (!S->rep || !S->v || !S->beta || !S->bz || !S->f || !S->res)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    for (int oi = 0; oi < X->O; oi++) {
        const tpk_output *o = out_of(S, oi);
        S->rep[oi] = oi;
        for (int oj = 0; oj < oi; oj++)
            if (nsr_same_readout(out_of(S, oj), o)) {
                S->rep[oi] = oj;
                break;
            }
        if (S->rep[oi] != oi)
            continue;
        for (int k = 0; k < nsr_out_nparts(o); k++) {
            double *v = S->v[(size_t)oi * (size_t)S->mmax + (size_t)k] = tpk_malloc(ctx, n * sizeof *v);
            if (v == NULL)
                return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
            nsr_ex_readout_vector(o, k, seed, n, v);
        }
        S->beta[oi] = o->bias_var > 0 ? nsr_ex_readout_bias(o, seed) : 0.0;
    }
    for (int k = 0; k < q->ninstr; k++) {
        const tpk_instr *in = &q->instr[k];
        if (in->op != TPK_OP_BIAS)
            continue;
        /* the run's draw of this bias, read back from the executor's own step */
        int st = nsr_ex_step(&X->E, k);
        double *z = S->bz[in->out] = tpk_malloc(ctx, n * sizeof *z);
        if (st || z == NULL)
            return st ? st : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        double s = sqrt(in->var);
        for (size_t i = 0; i < n; i++)
            z[i] = s > 0 ? (X->E.val[in->out][i] - in->mean) / s : 0.0;
    }
    return TPK_OK;
}

int tpk_netsor_train(const tpk_program *p, const tpk_array *x, size_t ntrain, const tpk_array *y,
                     const tpk_train_opts *o, tpk_array *f, double *loss, tpk_ctx *ctx)
{
    int st = tpk_array_check_input(x, "tpk_netsor_train", "x", ctx);
    if (st)
        return st;
    if (p == NULL || y == NULL || o == NULL || f == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_netsor_train: p, y, o and f are required");
    if (o->width < 1 || o->width > UINT32_MAX / 2)
        return TPK_ERROR(ctx, TPK_EINVAL, "width n = %zu outside 1..%u", o->width, UINT32_MAX / 2);
    if (!(isfinite(o->lr) && o->lr > 0))
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_netsor_train: the learning rate must be finite and "
                         "> 0 (got %g)", o->lr);
    if (o->nat == 0 || o->at == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_netsor_train: no steps to record (at, nat)");
    for (size_t j = 1; j < o->nat; j++)
        if (o->at[j] < o->at[j - 1])
            return TPK_ERROR(ctx, TPK_EINVAL, "tpk_netsor_train: the recorded steps must be "
                             "ascending (at[%zu] = %zu after %zu)", j, o->at[j], o->at[j - 1]);
    const char *file = p->path ? p->path : "program";
    if (p->ninstr == 0)
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED, "%s: training runs the unrolled form, which this "
                         "program does not have (too large after unrolling)", file);
    if (p->features & TPK_FEAT_SQRT_N_LOGITS)
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED, "%s: sqrt(n) * mean(q * k) logits are outside "
                         "Tensor Programs II: no NTK dynamics to compare with", file);
    for (int k = 0; k < p->ninstr; k++)
        if (p->instr[k].op == TPK_OP_NONLIN && p->instr[k].bnorm)
            return TPK_ERROR(ctx, TPK_EUNSUPPORTED, "%s:%d:%d: training a bn(...) network is not "
                             "carried: its batch statistics would mix training and test inputs",
                             file, p->instr[k].line, p->instr[k].col);
    trainer S;
    memset(&S, 0, sizeof S);
    S.ntrain = ntrain;
    if ((st = nsr_bw_init(&S.X, p, x, o->width, o->seed, o->all_outputs, ctx)))
        goto done;
    size_t N = S.X.E.N, O = (size_t)S.X.O;
    if (ntrain < 1 || ntrain > N) {
        st = TPK_ERROR(ctx, TPK_EINVAL, "tpk_netsor_train: %zu training inputs of %zu", ntrain, N);
        goto done;
    }
    if (!((y->ndim == 2 && y->dims[0] == ntrain && y->dims[1] == O) ||
          (y->ndim == 1 && y->dims[0] == ntrain && O == 1))) {
        st = TPK_ERROR(ctx, TPK_EINVAL, "tpk_netsor_train: the targets must be %zu × %zu (training "
                       "inputs × outputs)", ntrain, O);
        goto done;
    }
    if (f->ndim != 3 || f->dims[0] != o->nat || f->dims[1] != N || f->dims[2] != O) {
        st = TPK_ERROR(ctx, TPK_EINVAL, "tpk_netsor_train: f must be %zu × %zu × %zu (recorded "
                       "steps × inputs × outputs)", o->nat, N, O);
        goto done;
    }
    for (size_t i = 0; i < ntrain * O; i++)
        if (!isfinite(y->data[i])) {
            st = TPK_ERROR(ctx, TPK_EDOM, "tpk_netsor_train: target %zu is not finite", i);
            goto done;
        }
    if ((st = trainer_init(&S, o->width, o->seed, ctx)))
        goto done;
    const double nt = (double)(ntrain * O);
    size_t j = 0, last = o->at[o->nat - 1];
    for (size_t s = 0; st == TPK_OK; s++) {
        if ((st = forward(&S)))
            break;
        double l = 0.0;
        for (size_t i = 0; i < ntrain * O; i++) {
            double r = S.f[i] - y->data[i];
            l += r * r;
            S.res[i] = r / nt;
        }
        for (size_t i = 0; i < N * O; i++)
            if (!isfinite(S.f[i])) {
                st = TPK_ERROR(ctx, TPK_ENUMERIC, "training diverged at step %zu (a non-finite "
                               "output): lower the learning rate", s);
                break;
            }
        for (; st == TPK_OK && j < o->nat && o->at[j] == s; j++) {
            memcpy(f->data + j * N * O, S.f, N * O * sizeof *S.f);
            if (loss)
                loss[j] = l / (2 * nt);
        }
        if (st || s == last || (st = tpk_progress_report(o->progress, "steps", s, last, ctx)))
            break;
        st = step(&S, o->lr);
    }
done:
    trainer_free(&S, ctx);
    return st;
}
