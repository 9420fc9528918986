/* Infinite-width limit of a NETSOR(+) program: the Master Theorem recursion over a batch
 * (theory.md §1.6–1.9), unrolled, member by member — the driver of the pipeline whose stages are
 * the files limit_plan.c (atoms, families, liveness), limit_store.c (covariance blocks),
 * limit_expand.c (bodies as sums of products), limit_expect.c (expectations, level by level),
 * limit_backend.c (the back-end table, §1.10) and limit_quad.c (Gauss–Hermite, (Q)MC); see
 * limit-impl.h. Here: the instructions in program order (embeddings as Gram blocks, MatMuls by
 * rule 3, Nonlins symbolically, Moments), the readouts, the PSD check, and the public entries
 * (the rolled evaluator netsor/flimit.c first where it takes the program). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <lapacke.h>

#include "ewplan-impl.h"
#include "limit-impl.h"
#include "tangent-impl.h"
#include "tpk/alloc.h"
#include "tpk/batchnorm.h"
#include "tpk/matmul.h"

/* The joint sampler (m2_joint, netsor/limit_joint.c) takes the groups of more dims than the
 * tensor Gauss–Hermite rule serves (they would be sampled alone). Its sample is shared by all of
 * them, so it affords JOINT_POINTS_X times the points one group gets: an LSTM 8 × 4 then has the
 * per-group rule's RMS error (6e-5) and a smaller largest error estimate (1.8e-4 against 2.6e-4),
 * 16 times faster. Its cache of factor values is bounded by JOINT_MAX_BYTES. */
#define JOINT_POINTS_X 2
#define JOINT_MAX_BYTES ((size_t)512 << 20)
/* Clear PSD violation of the final kernel: λ_min < −(PSD_REL·λ_max + PSD_ERR·dim·err). */
#define PSD_REL 1e-9
#define PSD_ERR 8.0

/* ---- instructions --------------------------------------------------------------------- */

/* Embedding U x^s: its sub-blocks with every earlier atom of the embedding's family. */
static int do_embed(lim *L, int k)
{
    const tpk_instr *in = &L->p->instr[k];
    atom *aj = &L->atom[L->atom_of_instr[k]];
    family *f = &L->fam[aj->fam];
    size_t N = L->N, d = L->d, ldx = L->T * d, ld;
    if (nsr_lim_block_new(L, f))
        return L->ctx->status;
    ld = (size_t)f->cap * N;
    f->atoms[aj->loc] = L->atom_of_instr[k];
    f->m = aj->loc + 1;
    for (int li = 0; li <= aj->loc; li++) {
        const atom *ai = &L->atom[f->atoms[li]];
        /* Cov(U x_a^s, U x_c^s') = σ_U σ_U' ⟨x_a^s, x_c^s'⟩/d (theory §1.2) */
        double *dst = f->blk + (size_t)aj->loc * N * ld + (size_t)li * N;
        int st;
        if (ai->src == in->src) { /* same slot: a symmetric Gram matrix, half the flops */
            st = tpk_dsyrk(TPK_NO_TRANS, N, d, aj->scale * ai->scale / (double)d,
                           L->x + (size_t)in->src * d, ldx, 0.0, dst, ld, L->ctx);
            if (st)
                return st;
            nsr_lim_block_mirror(L, f, f->blk, aj->loc, li);
            continue;
        }
        st = tpk_dgemm(TPK_NO_TRANS, TPK_TRANS, N, N, d, aj->scale * ai->scale / (double)d,
                           L->x + (size_t)in->src * d, ldx, L->x + (size_t)ai->src * d, ldx, 0.0,
                           dst, ld, L->ctx);
        if (st)
            return st;
        nsr_lim_block_mirror(L, f, f->blk, aj->loc, li);
    }
    return TPK_OK;
}

/* Progress of the unrolled evaluator, in covariance blocks: a MatMul's sub-blocks with the
 * earlier atoms of its family (the late ones of a recurrent program are most of the time), one
 * for every other instruction and one for the readouts. */
#define BLOCKS "covariance blocks"

static size_t instr_blocks(const lim *L, int k)
{
    return L->p->instr[k].op == TPK_OP_MATMUL ? (size_t)L->atom[L->atom_of_instr[k]].loc + 1 : 1;
}

/* The NTK's setting of the member-level evaluator: the tangent program and the parameterisation. */
typedef struct ntk_setup {
    nsr_tangent t;
    int param;
    double width; /* TPK_NTK_PARAM_STANDARD */
} ntk_setup;

static int unrolled(const tpk_program *p, const tpk_array *x, int all_outputs,
                    const tpk_limit_opts *opts, const ntk_setup *nt, tpk_array **K,
                    tpk_array **Theta, double *err, tpk_ctx *ctx);

/* ---- the NTK (theory.md §8): the tangent kernel T beside the covariance ------------------- */

/* The defining instruction of var u if it is a batch-coupled φ(bn(g)), else NULL. */
static const tpk_instr *bn_def(const lim *L, int u)
{
    int k = L->p->var[u].def;
    return L->p->var[u].type == TPK_VAR_H && k >= 0 && L->p->instr[k].bnorm ? &L->p->instr[k] : NULL;
}

/* T^H of two φ(bn(g)) of one G-var on one batch of all N inputs: E[M T^G Mᵀ] with M the Jacobian
 * of φ∘BN across the batch (theory.md §8.6; kernels/batchnorm.c). Two batches would need the
 * two-batch tilt of the backward terms, which is not derived: refused, as are two different
 * G-vars or bodies. */
static int tangent_bn(lim *L, int u, int v, int lower, double *out, size_t ld)
{
    const tpk_instr *iu = bn_def(L, u), *iv = bn_def(L, v);
    const char *file = L->p->path ? L->p->path : "program";
    const tpk_instr *at = iu ? iu : iv;
    size_t N = L->N;
    if (iu == NULL || iv == NULL || iu->body.node[0].var != iv->body.node[0].var ||
        iu->body.len != iv->body.len || iu->bn_eps != iv->bn_eps ||
        (iu->body.len == 2 && iu->body.node[1].fn != iv->body.node[1].fn))
        return TPK_ERROR(L->ctx, TPK_EUNSUPPORTED,
                         "%s:%d:%d: the NTK between %s and %s is not computed: bn(...) is carried "
                         "only between a phi(bn(g)) and itself (theory.md §8.6)", file, at->line,
                         at->col, L->p->var[u].name, L->p->var[v].name);
    if (iu->batch != 0 && (size_t)iu->batch != N)
        return TPK_ERROR(L->ctx, TPK_EUNSUPPORTED,
                         "%s:%d:%d: the NTK of bn(...) over batches of %d out of %zu inputs is not "
                         "computed (the cross-batch backward terms are not derived): normalise "
                         "over one batch (batch = 0)", file, iu->line, iu->col, iu->batch, N);
    int g = iu->body.node[0].var;
    const tpk_phi *phi = iu->body.len == 2 ? iu->body.node[1].fn : NULL;
    double *S = tpk_malloc(L->ctx, 3 * N * N * sizeof *S), e = 0;
    if (S == NULL)
        return TPK_ERROR(L->ctx, TPK_ENOMEM, "out of memory");
    nsr_lim_cov_mat(L, g, g, 0, S);
    nsr_lim_kern_mat(L, g, g, 0, 1, S + N * N);
    int st = tpk_bn_tangent(phi, S, S + N * N, N, iu->bn_eps, S + 2 * N * N, &e, L->ctx);
    if (st == TPK_OK) {
        note_err(L, e);
        for (size_t a = 0; a < N; a++)
            memcpy(out + a * ld, S + 2 * N * N + a * N, (lower ? a + 1 : N) * sizeof *out);
    }
    tpk_free(L->ctx, S);
    if (st && st != TPK_ENOMEM) { /* the library's message, at the program's line */
        char m[sizeof L->ctx->msg];
        snprintf(m, sizeof m, "%s", L->ctx->msg);
        tpk_ctx_clear(L->ctx); /* the first error stands otherwise */
        st = TPK_ERROR(L->ctx, st, "%s:%d:%d: %s", file, iu->line, iu->col, m);
    }
    return st;
}

/* out (N×N) = T^H(u, v)[a][c] = Σ_pq E[∂_pφ_u(Z_a) ∂_qφ_v(Z_c)] · T(g_p, g_q)[a][c] over the G-vars
 * g_p that u reads (u itself, with ∂ = 1, for a G-var) and those of v (tangent.c). A pair whose
 * G-vars share no family contributes 0 (their tangents are independent, like their values). */
static int tangent_h(lim *L, int u, int v, uint64_t site, scratch *sc, int lower, double *out,
                     size_t ld)
{
    const nsr_tangent *t = L->tan;
    const tpk_program *p = L->p;
    size_t N = L->N;
    double *TG = L->tE, *E = L->tE + N * N;
    if (bn_def(L, u) != NULL || bn_def(L, v) != NULL)
        return tangent_bn(L, u, v, lower, out, ld);
    int nu = p->var[u].type == TPK_VAR_G ? 1 : t->part[u].n;
    int nv = p->var[v].type == TPK_VAR_G ? 1 : t->part[v].n;
    int first = 1;
    for (int i = 0; i < nu; i++)
        for (int j = 0; j < nv; j++) {
            int gu = p->var[u].type == TPK_VAR_G ? u : t->part[u].g[i];
            int gv = p->var[v].type == TPK_VAR_G ? v : t->part[v].g[j];
            int du = p->var[u].type == TPK_VAR_G ? t->one : t->part[u].d[i];
            int dv = p->var[v].type == TPK_VAR_G ? t->one : t->part[v].d[j];
            if (!nsr_lim_share_family(L, gu, gv))
                continue;
            nsr_lim_kern_mat(L, gu, gv, lower, 1, TG);
            double e = 0;
            /* the first pair's expectation goes straight into out (no scratch to touch) */
            double *dst = first ? out : E;
            size_t ldd = first ? ld : N;
            int st = nsr_lim_m2(L, du, dv, site ^ ((uint64_t)(1 + i * 64 + j) << 44), sc, dst, ldd,
                                lower, 1.0, &e);
            if (st)
                return st;
            note_err(L, e);
            /* lower: the block is symmetric (u = v), only c ≤ a is read (see atom_cov) */
#pragma omp parallel for schedule(static) if (N >= 512)
            for (size_t a = 0; a < N; a++) {
                size_t cend = lower ? a + 1 : N;
                double *o = out + a * ld;
                const double *ea = E + a * N, *ta = TG + a * N;
                if (first)
                    for (size_t c = 0; c < cend; c++)
                        o[c] *= ta[c];
                else
                    for (size_t c = 0; c < cend; c++)
                        o[c] += ea[c] * ta[c];
            }
            first = 0;
        }
    if (first)
        for (size_t a = 0; a < N; a++)
            memset(out + a * ld, 0, (lower ? a + 1 : N) * sizeof *out);
    return TPK_OK;
}

/* The tangent sub-block (lj, li) of an A-var's family, beside its covariance sub-block C just
 * written: T = w·E[z z̄] + σ_W² T^H(z, z̄) (theory.md §8.2), where w·E[z z̄] is C (NT's 'ntk'
 * parameterisation) or C/σ_W² (Tensor Programs II's). A same-atom sub-block (li = lj) is kept in
 * its lower triangle, as C is. T^H is computed in place. */
static int tangent_matmul(lim *L, int k, family *f, int lj, int li, scratch *sc)
{
    size_t N = L->N, ld = (size_t)f->cap * N;
    const atom *aj = &L->atom[f->atoms[lj]], *ai = &L->atom[f->atoms[li]];
    const double *C = f->blk + (size_t)lj * N * ld + (size_t)li * N;
    double *T = f->tblk + (size_t)lj * N * ld + (size_t)li * N;
    uint64_t site = (nsr_lim_kid(L, k) * 4096 + (uint64_t)li) ^ ((uint64_t)1 << 62);
    int lower = li == lj, st;
    const double s2 = f->var;
    /* the weight's own term on the raw E[z z̄] = C/σ² (tpk_ntk_own; the fan-in is the width) */
    const double own = tpk_ntk_own(L->ntk_param, s2, L->ntk_width);
    if (!(s2 > 0)) { /* σ_W² = 0: no C to scale, the raw term itself */
        double e = 0;
        st = nsr_lim_m2(L, aj->src, ai->src, site ^ 1, sc, T, ld, lower, own, &e);
    } else {
        const double w = own / s2;
        st = tangent_h(L, aj->src, ai->src, site, sc, lower, T, ld);
#pragma omp parallel for schedule(static) if (N >= 512 && st == TPK_OK)
        for (size_t a = 0; a < N; a++) {
            size_t cend = lower ? a + 1 : N;
            double *t = T + a * ld;
            const double *c = C + a * ld;
            for (size_t j = 0; j < cend; j++)
                t[j] = w * c[j] + s2 * t[j];
        }
    }
    if (st)
        return st;
    nsr_lim_block_mirror(L, f, f->tblk, lj, li);
    return TPK_OK;
}

/* Θ of outputs (oi, oj) (theory.md §8.7): the readout's own gradient (NT: the kernel K itself, TP:
 * E[h h̄] and a bias 1) plus σ_v σ_v'/m Σ_k T^H(h_k, h̄_k); 0 between independent readouts. */
static int readout_ntk(lim *L, scratch *sc, const tpk_array *K, int o0, int O, int oi, int oj,
                       double *TM, tpk_array *th)
{
    const tpk_program *p = L->p;
    const tpk_output *po = &p->output[o0 + oi], *pq = &p->output[o0 + oj];
    size_t N = L->N, dim = N * (size_t)O;
    int same = nsr_same_readout(po, pq), m = nsr_out_nparts(po);
    double s = sqrt(po->var * pq->var) / m;
    uint64_t site = (nsr_lim_kid(L, p->ninstr) * 4096 + (uint64_t)(oi * O + oj)) ^ ((uint64_t)1 << 61);
    int lower = oi == oj; /* one output with itself: a symmetric block, its lower triangle */
    if (O == 1 && m == 1 && L->ntk_param == TPK_NTK_PARAM_NTK) {
        /* one readout: Θ = K + σ_v² T^H, T^H computed in Θ's place (its lower triangle) */
        int st = tangent_h(L, nsr_out_part(po, 0), nsr_out_part(pq, 0), site, sc, 1, th->data, N);
        if (st)
            return st;
#pragma omp parallel for schedule(static) if (N >= 512)
        for (size_t a = 0; a < N; a++)
            for (size_t c = 0; c <= a; c++)
                th->data[a * N + c] = K->data[a * N + c] + s * th->data[a * N + c];
        const size_t TS = 32;
        for (size_t a0 = 0; a0 < N; a0 += TS)
            for (size_t c0 = 0; c0 <= a0; c0 += TS)
                for (size_t a = a0; a < a0 + TS && a < N; a++)
                    for (size_t c = c0; c < c0 + TS && c < a; c++)
                        th->data[c * N + a] = th->data[a * N + c];
        return TPK_OK;
    }
    memset(TM, 0, N * N * sizeof *TM);
    double *H = L->tE + 2 * N * N;
    for (int k = 0; same && k < m; k++) {
        int u = nsr_out_part(po, k), v = nsr_out_part(pq, k);
        int st = tangent_h(L, u, v, site + ((uint64_t)k << 52), sc, lower, H, N);
        if (st)
            return st;
        for (size_t a = 0; a < N; a++)
            for (size_t c = 0; c < (lower ? a + 1 : N); c++)
                TM[a * N + c] += s * H[a * N + c];
        if (L->ntk_param != TPK_NTK_PARAM_NTK) {
            /* the readout's own gradient: E[h h̄]/m (TP II), m n E[h h̄]/m in its own entries */
            double e = 0, own = tpk_ntk_own(L->ntk_param, s, m * L->ntk_width) / m;
            if ((st = nsr_lim_m2(L, u, v, (site + ((uint64_t)k << 52)) ^ 1, sc, H, N, lower,
                                 own, &e)))
                return st;
            for (size_t a = 0; a < N; a++)
                for (size_t c = 0; c < (lower ? a + 1 : N); c++)
                    TM[a * N + c] += H[a * N + c];
        }
    }
    double b = same && L->ntk_param != TPK_NTK_PARAM_NTK && po->bias_var > 0 && pq->bias_var > 0;
    const size_t TS = 32; /* tiles: the transposed half is written in cache-sized pieces */
    for (size_t a0 = 0; a0 < N; a0 += TS)
        for (size_t c0 = 0; c0 < (lower ? a0 + 1 : N); c0 += TS)
            for (size_t a = a0; a < a0 + TS && a < N; a++)
                for (size_t c = c0; c < c0 + TS && c < (lower ? a + 1 : N); c++) {
                    size_t r = (a * (size_t)O + (size_t)oi) * dim + c * (size_t)O + (size_t)oj;
                    size_t rt = (c * (size_t)O + (size_t)oj) * dim + a * (size_t)O + (size_t)oi;
                    double v = (L->ntk_param != TPK_NTK_PARAM_NTK ? b : K->data[r]) + TM[a * N + c];
                    th->data[r] = v;
                    th->data[rt] = v;
                }
    return TPK_OK;
}

/* MatMul W h: its sub-blocks with every earlier atom of W's family (blocks done before it of
 * all, for the progress reports). */
static int do_matmul(lim *L, int k, scratch *sc, size_t blocks, size_t nblocks)
{
    const tpk_instr *in = &L->p->instr[k];
    atom *aj = &L->atom[L->atom_of_instr[k]];
    family *f = &L->fam[aj->fam];
    size_t N = L->N, ld;
    if (nsr_lim_block_new(L, f) || (L->tan != NULL && nsr_lim_tblock_new(L, f)))
        return L->ctx->status;
    ld = (size_t)f->cap * N;
    f->atoms[aj->loc] = L->atom_of_instr[k];
    f->m = aj->loc + 1;
    sc->aq.on = 1; /* u = in->src is the left factor of every pair below */
    int st = TPK_OK;
    for (int li = 0; li <= aj->loc; li++) {
        const atom *ai = &L->atom[f->atoms[li]];
        double e = 0.0;
        if ((st = tpk_progress_report(L->o.progress, BLOCKS, blocks + (size_t)li, nblocks,
                                      L->ctx))) /* a sub-block can take seconds */
            break;
        /* Cov(W h_a, W h'_c) = σ_W² E[Z^h_a Z^h'_c] (theory §1.6 rule 3) */
        /* the diagonal sub-block (li = loc) needs only its lower triangle (see atom_cov) */
        st = nsr_lim_m2(L, in->src, ai->src, nsr_lim_kid(L, k) * 4096 + (uint64_t)li, sc,
                        f->blk + (size_t)aj->loc * N * ld + (size_t)li * N, ld, li == aj->loc,
                        f->var, &e);
        if (st)
            break;
        note_err(L, e);
        nsr_lim_block_mirror(L, f, f->blk, aj->loc, li);
        if (L->tan != NULL && (st = tangent_matmul(L, k, f, aj->loc, li, sc)))
            break;
    }
    /* the half-products hold covariances of live G-vars only while this instruction runs */
    nsr_lim_halfprod_clear(&sc->aq, L->ctx);
    sc->aq.on = 0;
    return st;
}

/* λ_max of the symmetric K from below: the Rayleigh quotient after a few power steps from the
 * all-ones vector (a kernel's dominant eigenvector has no sign changes, so it converges fast),
 * never below the largest diagonal entry. */
static double lambda_max_below(const double *K, size_t n, double *v, double *w)
{
    double lam = 0;
    for (size_t i = 0; i < n; i++) {
        v[i] = 1.0 / sqrt((double)n);
        lam = fmax(lam, K[i * n + i]);
    }
    for (int it = 0; it < 12; it++) {
        double vw = 0, ww = 0;
        for (size_t i = 0; i < n; i++) /* w = K v from the lower triangle, row by row */
            w[i] = K[i * n + i] * v[i];
        for (size_t i = 1; i < n; i++) {
            const double *row = K + i * n;
            double acc = 0, vi = v[i];
            for (size_t j = 0; j < i; j++) {
                acc += row[j] * v[j];
                w[j] += row[j] * vi;
            }
            w[i] += acc;
        }
        for (size_t i = 0; i < n; i++) {
            vw += v[i] * w[i];
            ww += w[i] * w[i];
        }
        ww = sqrt(ww);
        lam = fmax(lam, vw);
        if (!(ww > 0))
            break;
        for (size_t i = 0; i < n; i++)
            v[i] = w[i] / ww;
    }
    return lam;
}

int nsr_check_psd(const double *K, size_t n, double err, tpk_ctx *ctx)
{
    /* Cheap enough up to a few hundred rows; beyond that the O(n³) check would dominate. */
    if (n > 600)
        return TPK_OK;
    double *A = tpk_malloc(ctx, n * n * sizeof *A), *lam = tpk_malloc(ctx, 2 * n * sizeof *lam);
    int st = TPK_OK;
    if (A == NULL || lam == NULL) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        goto done;
    }
    /* First a Cholesky factorisation of K + τI with τ the tolerance below from an estimate of
     * λ_max that does not exceed it: where it succeeds, λ_min > −τ and K passes (a few
     * milliseconds at n = 500, where the eigenvalues took 40); where it fails, the eigenvalues
     * decide, as they always did. */
    double tau = PSD_REL * lambda_max_below(K, n, lam, lam + n) + PSD_ERR * (double)n * err +
                 DBL_MIN;
    memcpy(A, K, n * n * sizeof *A);
    for (size_t i = 0; i < n; i++)
        A[i * n + i] += tau;
    /* the lower triangle in row-major order is the upper one in column-major order: no
     * transposed copy inside LAPACKE */
    if (isfinite(tau) && LAPACKE_dpotrf(LAPACK_COL_MAJOR, 'U', (int)n, A, (int)n) == 0)
        goto done;
    memcpy(A, K, n * n * sizeof *A);
    if (LAPACKE_dsyev(LAPACK_ROW_MAJOR, 'N', 'L', (int)n, A, (int)n, lam) == 0) {
        double lmax = fabs(lam[n - 1]) > fabs(lam[0]) ? fabs(lam[n - 1]) : fabs(lam[0]);
        double tol = PSD_REL * lmax + PSD_ERR * (double)n * err + DBL_MIN;
        if (lam[0] < -tol)
            st = TPK_ERROR(ctx, TPK_ENUMERIC,
                           "limit kernel is not PSD: smallest eigenvalue %.3g (largest %.3g, "
                           "error estimate %.3g)", lam[0], lam[n - 1], err);
    }
done:
    tpk_free(ctx, A);
    tpk_free(ctx, lam);
    return st;
}

/* TPK_NETSOR_TRACE=1: what each back end took, one line per level, on stderr. */
static void trace_backends(const lim *L)
{
    static const char *const level[NSR_LIM_NKINDS] = {"pairs", "term pairs", "groups", "moments"};
    static const char *const refined[NSR_LIM_NKINDS] = {"(term pair by term pair)",
                                                        "(entry by entry)", "", "(entry by entry)"};
    for (int k = 0; k < NSR_LIM_NKINDS; k++) {
        int any = 0;
        fprintf(stderr, "  limit back ends, %s:", level[k]);
        for (int i = 0; i < nsr_lim_nbackends; i++)
            if (L->used[i][k] > 0)
                fprintf(stderr, "%s %s %ld", any++ ? "," : "", nsr_lim_backends[i].name,
                        L->used[i][k]);
        if (L->fallback[k] > 0)
            fprintf(stderr, "%s %s %ld", any++ ? "," : "", refined[k], L->fallback[k]);
        fprintf(stderr, "%s\n", any ? "" : " none");
    }
}

static int check_psd(lim *L, const double *K, size_t n)
{
    return nsr_check_psd(K, n, L->err, L->ctx);
}

/* The rolled evaluator's kernel, PSD-checked (nsr_form_rolled_first's run). */
typedef struct rolled_job {
    const tpk_program *p;
    const tpk_array *x;
    int all_outputs;
    const tpk_limit_opts *opts;
    tpk_array **K;
    double *err;
} rolled_job;

static int rolled_kernel(void *arg, int *unsup, tpk_ctx *ctx)
{
    const rolled_job *J = arg;
    int st = nsr_flimit_kernel(J->p, J->x, J->all_outputs, J->K, J->err, unsup, J->opts, ctx);
    if (st == TPK_OK) {
        st = nsr_check_psd((*J->K)->data, (*J->K)->dims[0], J->err ? *J->err : 0, ctx);
        if (st) {
            tpk_array_free(*J->K);
            *J->K = NULL;
        }
    }
    return st;
}

int tpk_netsor_kernel_ex(const tpk_program *p, const tpk_array *x, int all_outputs,
                         const tpk_limit_opts *opts, tpk_array **K, double *err, tpk_ctx *ctx)
{
    if (K == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_netsor_kernel: K must not be NULL");
    *K = NULL;
    if (err)
        *err = 0.0;
    int force_unrolled = (opts && opts->unrolled) || nsr_form_unrolled_env();
    if (p != NULL && p->ninstr == 0 && !tpk_program_limit_rolled(p))
        return nsr_flimit_refusal(p, ctx);
    rolled_job RJ = {p, x, all_outputs, opts, K, err};
    int rst;
    if (nsr_form_rolled_first(p, tpk_program_limit_rolled(p), force_unrolled, "rolled evaluator",
                              rolled_kernel, &RJ, &rst, ctx))
        return rst;
    return unrolled(p, x, all_outputs, opts, NULL, K, NULL, err, ctx);
}

/* The member-level evaluator: K, and with the tangent program nt (q = nt->t.q in place of the
 * program) Θ beside it. */
static int unrolled(const tpk_program *p, const tpk_array *x, int all_outputs,
                    const tpk_limit_opts *opts, const ntk_setup *nt, tpk_array **K,
                    tpk_array **Theta, double *err, tpk_ctx *ctx)
{
    tpk_nsr_shape sh;
    int st = tpk_nsr_validate(p, x, all_outputs, &sh, ctx);
    if (st)
        return st;
    if (p->features & TPK_FEAT_SQRT_N_LOGITS)
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED,
                         "%s: sqrt(n) * mean(q * k) logits have a random, non-Gaussian limit "
                         "(theory.md §5), not a NETSOR+ kernel; the finite-width executor runs it, "
                         "and gpkernel --arch=attention --logit-scaling=inv-sqrt-n computes the "
                         "hierarchical limit", p->path ? p->path : "program");
    lim L;
    memset(&L, 0, sizeof L);
    L.p = p;
    if (opts)
        L.o = *opts;
    L.N = sh.N;
    L.T = sh.T;
    L.d = sh.d;
    L.x = x->data;
    L.maxlen = sh.maxlen;
    L.maxdepth = sh.maxdepth;
    L.ctx = ctx;
    if (nt != NULL) {
        L.tan = &nt->t;
        L.ntk_param = nt->param;
        L.ntk_width = nt->width;
        L.kid = nt->t.kid;
        L.nkid = nt->t.nkid;
    }
    L.ocache = tpk_nsr_orthant_cache_alloc(TPK_ALLOCATOR_OF(ctx)); /* NULL (out of memory) only disables the memo */
    /* NULL (out of memory, or the options ask for Monte Carlo per group) disables it */
    size_t jpts = (L.o.mc_samples ? L.o.mc_samples : MC_DEFAULT) / QMC_SHIFTS; /* per shift */
    jpts *= JOINT_POINTS_X;
    L.joint = L.o.force_mc || L.o.no_factor || L.o.no_joint ? NULL
              : tpk_nsr_joint_alloc(QMC_SHIFTS, jpts > 0 ? jpts : 1,
                                    L.o.joint_max_bytes ? L.o.joint_max_bytes : JOINT_MAX_BYTES,
                                    L.o.mc_seed, TPK_ALLOCATOR_OF(ctx));
    const char *tr = getenv("TPK_NETSOR_TRACE");
    int trace = tr != NULL && strcmp(tr, "1") == 0;
    size_t N = L.N;
    /* s1, s2, s3 only serve the cross/general paths: allocated on first use */
    scratch sc = {NULL, NULL, NULL, tpk_malloc(ctx, N * sizeof(double)), tpk_malloc(ctx, N * sizeof(double)),
                  {0, -1, 0, 0, NULL, NULL, 0}};
    tpk_array *out = NULL, *th = NULL;
    double *M = NULL, *A = NULL, *TM = NULL;
    if (nt != NULL && (L.tE = tpk_malloc(ctx, 3 * N * N * sizeof *L.tE)) == NULL) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        goto done;
    }
    if (!sc.qa || !sc.qb) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        goto done;
    }
    if ((st = nsr_lim_plan(&L, all_outputs)))
        goto done;
    size_t blocks = 0, nblocks = 1; /* the readouts: one */
    for (int k = 0; k < p->ninstr; k++)
        nblocks += instr_blocks(&L, k);
    for (int k = 0; k < p->ninstr; k++) {
        const tpk_instr *in = &p->instr[k];
        if ((st = tpk_progress_report(L.o.progress, BLOCKS, blocks, nblocks, ctx)))
            goto done;
        switch (in->op) {
        case TPK_OP_EMBED:
            st = do_embed(&L, k);
            break;
        case TPK_OP_BIAS:
            break;
        case TPK_OP_MATMUL:
            st = do_matmul(&L, k, &sc, blocks, nblocks);
            break;
        case TPK_OP_LINCOMB:
            break;
        case TPK_OP_NONLIN:
            if (nsr_lim_expand(in->body.node, in->body.len, L.o.no_factor, &L.xb[in->out], ctx))
                st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
            else
                st = nsr_lim_poly_prepare(&L, k);
            break;
        case TPK_OP_MOMENT:
            st = nsr_lim_moment(&L, k);
            break;
        default:
            break;
        }
        if (st == TPK_OK && p->var[in->out].type == TPK_VAR_G) {
            int v = in->out;
            L.xb[v].node = &L.gnode[v];
            L.xb[v].nterms = 1;
            L.xb[v].t = tpk_malloc(ctx, sizeof *L.xb[v].t);
            if (L.xb[v].t == NULL)
                st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
            else
                L.xb[v].t[0] = (xterm){1.0, 1, {0}, {1}};
        }
        if (st)
            goto done;
        nsr_lim_release(&L, k);
        blocks += instr_blocks(&L, k);
    }
    /* outputs: K[(a,o),(c,o')] = σ_v² E[Z^o_a Z^o'_c], input-major */
    if ((st = tpk_progress_report(L.o.progress, BLOCKS, blocks, nblocks, ctx)))
        goto done;
    int o0 = all_outputs ? 0 : p->noutputs - 1, O = p->noutputs - o0;
    size_t dim = N * (size_t)O;
    out = tpk_array_alloc2(dim, dim, ctx);
    if (out != NULL && L.spare != NULL && L.spare_len == dim * dim) {
        tpk_free(ctx, out->data); /* a freed block has its pages already: reuse it for K */
        out->data = L.spare;
        L.spare = NULL;
    }
    /* M: an output pair's block when there are several outputs or parts; A: a further part's */
    int parts = 1;
    for (int o = o0; o < p->noutputs; o++)
        parts = nsr_out_nparts(&p->output[o]) > parts ? nsr_out_nparts(&p->output[o]) : parts;
    M = O > 1 || parts > 1 ? tpk_malloc(ctx, N * N * sizeof *M) : NULL;
    A = parts > 1 ? tpk_malloc(ctx, N * N * sizeof *A) : NULL;
    if (out == NULL || ((O > 1 || parts > 1) && M == NULL) || (parts > 1 && A == NULL)) {
        st = out == NULL ? ctx->status : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        goto done;
    }
    for (int oi = 0; oi < O; oi++)
        for (int oj = 0; oj <= oi; oj++) {
            const tpk_output *po = &p->output[o0 + oi], *pq = &p->output[o0 + oj];
            /* one readout vector v of width m·n: part k of one output meets part k of the other,
             * K = σσ'/m Σ_k E[h_k h'_k] + ββ'; independent readouts: 0 (netsor-impl.h) */
            int same = nsr_same_readout(po, pq), m = nsr_out_nparts(po);
            double e = 0.0, s = sqrt(po->var * pq->var) / m;
            uint64_t site = nsr_lim_kid(&L, p->ninstr) * 4096 + (uint64_t)(oi * O + oj);
            /* a scalar readout bias β shared by the outputs adds its variance everywhere */
            double beta = same ? sqrt(po->bias_var * pq->bias_var) : 0.0;
            double *dst = O == 1 && m == 1 ? out->data : M; /* straight into K */
            if (!same)
                memset(M, 0, N * N * sizeof *M);
            for (int k = 0; same && k < m; k++) {
                if ((st = nsr_lim_m2(&L, nsr_out_part(po, k), nsr_out_part(pq, k),
                                     site + ((uint64_t)k << 52), &sc,
                                     k == 0 ? dst : A, N, 0, s, &e)))
                    goto done;
                note_err(&L, e);
                for (size_t i = 0; k > 0 && i < N * N; i++)
                    dst[i] += A[i];
            }
            if (dst == out->data) {
                if (beta != 0.0)
                    for (size_t i = 0; i < N * N; i++)
                        out->data[i] += beta;
                continue;
            }
            for (size_t a = 0; a < N; a++)
                for (size_t c = 0; c < N; c++) {
                    double v = M[a * N + c] + beta;
                    out->data[(a * (size_t)O + (size_t)oi) * dim + c * (size_t)O + (size_t)oj] = v;
                    out->data[(c * (size_t)O + (size_t)oj) * dim + a * (size_t)O + (size_t)oi] = v;
                }
        }
    if (nt != NULL) {
        if ((th = tpk_array_alloc2(dim, dim, ctx)) == NULL ||
            (TM = tpk_malloc(ctx, N * N * sizeof *TM)) == NULL) {
            st = th == NULL ? ctx->status : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
            goto done;
        }
        for (int oi = 0; oi < O && st == TPK_OK; oi++)
            for (int oj = 0; oj <= oi && st == TPK_OK; oj++)
                st = readout_ntk(&L, &sc, out, o0, O, oi, oj, TM, th);
        if (st)
            goto done;
    }
    for (size_t i = 0; i < dim * dim; i++)
        if (!isfinite(out->data[i]) || (th != NULL && !isfinite(th->data[i]))) {
            st = TPK_ERROR(ctx, TPK_ENUMERIC, "limit %s has a non-finite entry (%zu, %zu)",
                           isfinite(out->data[i]) ? "NTK" : "kernel", i / dim, i % dim);
            goto done;
        }
    if ((st = check_psd(&L, out->data, dim)) || (th != NULL && (st = check_psd(&L, th->data, dim))) ||
        (st = tpk_progress_report(L.o.progress, BLOCKS, nblocks, nblocks, ctx)))
        goto done;
    if (err)
        *err = L.err;
    *K = out;
    out = NULL;
    if (Theta != NULL) {
        *Theta = th;
        th = NULL;
    }
done:
    tpk_array_free(out);
    tpk_array_free(th);
    tpk_free(ctx, M);
    tpk_free(ctx, A);
    tpk_free(ctx, TM);
    tpk_free(ctx, L.tE);
    tpk_free(ctx, sc.s1);
    tpk_free(ctx, sc.s2);
    tpk_free(ctx, sc.s3);
    tpk_free(ctx, sc.qa);
    tpk_free(ctx, sc.qb);
    nsr_lim_halfprod_free(&sc.aq, ctx);
    if (trace)
        trace_backends(&L);
    nsr_lim_free(&L);
    return st;
}

int tpk_netsor_kernel(const tpk_program *p, const tpk_array *x, int all_outputs, tpk_array **K,
                      double *err, tpk_ctx *ctx)
{
    int st = tpk_array_check_input(x, "tpk_netsor_kernel", "x", ctx);
    return st ? st : tpk_netsor_kernel_ex(p, x, all_outputs, NULL, K, err, ctx);
}

int tpk_netsor_ntk_check(const tpk_program *p, tpk_ctx *ctx)
{
    if (p == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_netsor_ntk_check: no program");
    const char *file = p->path ? p->path : "program";
    if (p->ninstr == 0)
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED,
                         "%s: the NTK is computed on the unrolled form, which this program does "
                         "not have (too large after unrolling)", file);
    for (int k = 0; k < p->ninstr; k++) {
        const tpk_instr *in = &p->instr[k];
        if (in->op == TPK_OP_MOMENT && in->src == 1)
            return TPK_ERROR(ctx, TPK_EUNSUPPORTED,
                             "%s:%d:%d: sqrt(n) * mean(q * k) logits are outside Tensor Programs "
                             "II (their limit is not Gaussian, theory.md §5): no NTK", file,
                             in->line, in->col);
    }
    /* every φ differentiable (a weak derivative that is a function); bn(...)'s own limits
     * (one batch, centred rank ≥ 3) depend on the inputs and are checked with the numbers */
    nsr_tangent t;
    int st = nsr_tangent_build(p, &t, ctx);
    if (st == TPK_OK)
        nsr_tangent_free(&t, ctx);
    return st;
}

int tpk_netsor_ntk(const tpk_program *p, const tpk_array *x, int all_outputs, int param,
                   tpk_array **K, tpk_array **Theta, double *err, tpk_ctx *ctx)
{
    tpk_ntk_opts o = {.param = param};
    return tpk_netsor_ntk_ex(p, x, all_outputs, &o, K, Theta, err, ctx);
}

int tpk_netsor_ntk_ex(const tpk_program *p, const tpk_array *x, int all_outputs,
                      const tpk_ntk_opts *no, tpk_array **K, tpk_array **Theta, double *err,
                      tpk_ctx *ctx)
{
    int param = no ? no->param : TPK_NTK_PARAM_NTK;
    const tpk_progress *progress = no ? no->progress : NULL;
    if (Theta == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_netsor_ntk: Theta must not be NULL");
    *Theta = NULL;
    if (K)
        *K = NULL;
    if (err)
        *err = 0.0;
    int st = tpk_array_check_input(x, "tpk_netsor_ntk", "x", ctx);
    if (st)
        return st;
    if (p == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_netsor_ntk: no program");
    if ((st = tpk_ntk_param_check("tpk_netsor_ntk", param, no ? (double)no->width : 0.0, ctx)))
        return st;
    /* the tangent kernel is propagated at the member level, on the unrolled form */
    if (p->ninstr == 0)
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED,
                         "%s: the NTK is computed on the unrolled form, which this program does "
                         "not have (too large after unrolling)", p->path ? p->path : "program");
    if (p->features & TPK_FEAT_SQRT_N_LOGITS)
        return tpk_netsor_ntk_check(p, ctx);
    ntk_setup nt;
    memset(&nt, 0, sizeof nt);
    nt.param = param;
    nt.width = param == TPK_NTK_PARAM_STANDARD ? (double)no->width : 0.0;
    if ((st = nsr_tangent_build(p, &nt.t, ctx)))
        return st;
    tpk_array *Kq = NULL;
    tpk_limit_opts o;
    memset(&o, 0, sizeof o);
    o.progress = progress;
    st = unrolled(nt.t.q, x, all_outputs, &o, &nt, &Kq, Theta, err, ctx);
    if (st == TPK_OK && K != NULL)
        *K = Kq;
    else
        tpk_array_free(Kq);
    nsr_tangent_free(&nt.t, ctx);
    return st;
}

int tpk_netsor_plan_from_env(int *plan, tpk_ctx *ctx)
{
    return nsr_plan_from_env(plan, ctx);
}

int tpk_netsor_kernel_plan(const tpk_program *p, const tpk_array *x, int all_outputs, int plan,
                           FILE *report, tpk_array **K, double *err, tpk_ctx *ctx)
{
    int st = tpk_array_check_input(x, "tpk_netsor_kernel_plan", "x", ctx);
    if (st)
        return st;
    return tpk_netsor_kernel_plan_with(p, x, all_outputs, plan, report, NULL, K, err, ctx);
}

int tpk_netsor_kernel_plan_with(const tpk_program *p, const tpk_array *x, int all_outputs, int plan,
                                FILE *report, const tpk_netsor_ew_provider *provider,
                                tpk_array **K, double *err, tpk_ctx *ctx)
{
    const int kind = plan & ~(TPK_PLAN_VERIFY | TPK_PLAN_SIGNATURES | TPK_PLAN_CANDIDATES);
    int st = tpk_array_check_input(x, "tpk_netsor_kernel_plan_with", "x", ctx);
    if (st)
        return st;
    if (kind != TPK_PLAN_NAIVE && kind != TPK_PLAN_OPTIMAL)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_netsor_kernel_plan: plan %d is neither "
                         "TPK_PLAN_NAIVE nor TPK_PLAN_OPTIMAL", plan);
    tpk_limit_opts o;
    memset(&o, 0, sizeof o);
    o.plan = kind;
    o.plan_verify = (plan & TPK_PLAN_VERIFY) != 0;
    o.plan_signatures = (plan & TPK_PLAN_SIGNATURES) != 0 ? 1 + ((plan & TPK_PLAN_CANDIDATES) != 0) : 0;
    o.ew_provider = provider;
    o.plan_report = report;
    return tpk_netsor_kernel_ex(p, x, all_outputs, &o, K, err, ctx);
}

int tpk_netsor_kernel_progress(const tpk_program *p, const tpk_array *x, int all_outputs,
                               const tpk_progress *progress, tpk_array **K, double *err,
                               tpk_ctx *ctx)
{
    int st = tpk_array_check_input(x, "tpk_netsor_kernel_progress", "x", ctx);
    if (st)
        return st;
    tpk_limit_opts o;
    memset(&o, 0, sizeof o);
    o.progress = progress;
    return tpk_netsor_kernel_ex(p, x, all_outputs, &o, K, err, ctx);
}
