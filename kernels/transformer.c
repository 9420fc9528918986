/* Transformer NNGP kernel of Tensor Programs I by the direct layer recursion over all tokens
 * (theory.md §2.7; the model of programs/transformer.nsr, which the NETSOR evaluator computes
 * from the program text). One (N·T)×(N·T) covariance over every token of every sequence,
 * sequence-major (index a·T + i), as GP4A's recursion writes it:
 *   Σ^{z0}       = var_e X Xᵀ / d
 *   Σ^k          = var_u Σ^z                           (k = U z)
 *   A_a          = causal row softmax of Σ^k_aa / temp, per sequence a (1/n logits: their limit
 *                  is deterministic, theory §2.7)
 *   Σ^r_ab       = (I + A_a) Σ^k_ab (I + A_b)ᵀ          (r = k + Σ_j a_ij k_j)
 *   Σ^h          = LN(Σ^r),  LN(S)_ij = S_ij / sqrt((S_ii + ε)(S_jj + ε))   (E r = 0)
 *   Σ^q          = var_w V_φ(var_w Σ^h + var_b) + var_b + Σ^h   (feed-forward + residual)
 *   Σ^z          = LN(Σ^q)
 * and K = σ_v² Σ^{z_L}.
 * Cost. The mixing maps are block-diagonal and lower triangular, so Σ^r is made on the blocks
 * b ≤ a by triangular products of row and column slabs, the second only for the lower triangle
 * on diagonal blocks: about (N² + N/3)·T³ flops a layer where the dense product of the whole matrices costs
 * 4(NT)³. (dtrmm is OpenBLAS's, on the OpenMP threads of the passes around it where the
 * Makefile links OpenBLAS's OpenMP build.) The first layer's Σ^k has rank d (an embedding's
 * Gram): while d < T, Σ^r = (P F)(P F)ᵀ with F the scaled inputs, one SYRK of rank d. Every other
 * step is one pass over the lower triangle. */
#include "tpk/kernels.h"
#include "tpk/alloc.h"
#include "tpk/matmul.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

int tpk_transformer_params_check(const tpk_transformer_params *p, tpk_ctx *ctx)
{
    if (p->depth < 1)
        return TPK_ERROR(ctx, TPK_EINVAL, "depth must be at least 1 layer (got %d)", p->depth);
    if (p->phi == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "no nonlinearity given");
    const struct {
        const char *name;
        double v;
    } var[] = {/* the field a C caller set, and the flag of gpkernel --arch=transformer */
               {"var_e (--var-e)", p->var_e},       {"var_u (--var-u)", p->var_u},
               {"var_w (--var-w)", p->var_w},       {"var_b (--var-b)", p->var_b},
               {"eps (--ln-eps)", p->eps},          {"sigma_v2 (--sigma-v2)", p->sigma_v2}};
    for (size_t i = 0; i < sizeof var / sizeof var[0]; i++)
        if (!(var[i].v >= 0) || !isfinite(var[i].v))
            return TPK_ERROR(ctx, TPK_EDOM, "%s must be a finite value >= 0 (got %g)", var[i].name,
                             var[i].v);
    if (!(p->temp > 0) || !isfinite(p->temp))
        return TPK_ERROR(ctx, TPK_EDOM, "temp must be a finite temperature > 0 (got %g)", p->temp);
    return TPK_OK;
}

/* Blocks of the triangular products below: a blocked product does about (1 + TRI_NB/T) times
 * the triangle's flops. */
#define TRI_NB 128

/* Y = c·L·B with L lower triangular (T×T; its strict upper triangle is zero), B T×n, out of place
 * (B is the caller's input): by column blocks K of L, Y[K0:, :] += c·L[K0:, K]·B[K, :], tall
 * products by tpk_dgemm. */
static int tri_left(size_t T, size_t n, double c, const double *L, const double *B, size_t ldb,
                    double *Y, size_t ldy, tpk_ctx *ctx)
{
    int st = TPK_OK;
    for (size_t k0 = 0; st == TPK_OK && k0 < T; k0 += TRI_NB) {
        size_t kb = k0 + TRI_NB < T ? TRI_NB : T - k0;
        st = tpk_dgemm(TPK_NO_TRANS, TPK_NO_TRANS, T - k0, n, kb, c, L + k0 * T + k0, T,
                       B + k0 * ldb, ldb, k0 ? 1.0 : 0.0, Y + k0 * ldy, ldy, ctx);
    }
    return st;
}

/* The lower triangle of S = Y·Lᵀ (L lower triangular T×T, Y T×T): column blocks J of S from
 * their first row down, S[J0:, J] = Y[J0:, :J1]·L[J, :J1]ᵀ — a third of the full product's
 * flops, for the diagonal blocks of Σ^r, which are symmetric. */
static int tri_right_lower(size_t T, const double *Y, size_t ldy, const double *L, double *S,
                           size_t lds, tpk_ctx *ctx)
{
    int st = TPK_OK;
    for (size_t j0 = 0; st == TPK_OK && j0 < T; j0 += TRI_NB) {
        size_t j1 = j0 + TRI_NB < T ? j0 + TRI_NB : T;
        st = tpk_dgemm(TPK_NO_TRANS, TPK_TRANS, T - j0, j1 - j0, j1, 1.0, Y + j0 * ldy, ldy,
                       L + j0 * T, T, 0.0, S + j0 * lds + j0, lds, ctx);
    }
    return st;
}

/* P_a = I + causal row softmax of c·S_aa (S: M×M, lower triangle read), T×T per sequence, the
 * strict upper triangle zero. */
static void mixing(const double *S, size_t N, size_t T, double c, double *P)
{
    const size_t M = N * T;
#pragma omp parallel for schedule(dynamic, 32)
    for (size_t r = 0; r < M; r++) {
        size_t a = r / T, i = r % T;
        const double *s = S + r * M + a * T;
        double *o = P + r * T, mx = -INFINITY, z = 0;
        for (size_t j = 0; j <= i; j++)
            mx = fmax(mx, c * s[j]);
        for (size_t j = 0; j <= i; j++)
            z += (o[j] = exp(c * s[j] - mx));
        for (size_t j = 0; j <= i; j++)
            o[j] /= z;
        o[i] += 1.0;
        memset(o + i + 1, 0, (T - i - 1) * sizeof *o);
    }
}

/* The upper triangle of each T×T diagonal block from its lower one (the triangular products read
 * whole blocks). */
static void mirror_diagonal_blocks(double *S, size_t N, size_t T)
{
    const size_t M = N * T;
#pragma omp parallel for schedule(dynamic, 32)
    for (size_t r = 0; r < M; r++) {
        size_t a = r / T, i = r % T;
        for (size_t j = i + 1; j < T; j++)
            S[r * M + a * T + j] = S[(a * T + j) * M + r];
    }
}

/* D_i = 1/sqrt(S_ii + T_ii + ε) (Tm may be NULL); TPK_EDOM naming the token when it is not
 * finite (a token whose prefix is all zero, with ε = 0). */
static int ln_factors(const double *S, const double *Tm, size_t M, size_t T, double eps, int layer,
                      const char *what, double *D, tpk_ctx *ctx)
{
    for (size_t i = 0; i < M; i++) {
        double v = S[i * M + i] + (Tm ? Tm[i * M + i] : 0) + eps;
        D[i] = 1.0 / sqrt(v);
        if (!(v > 0) || !isfinite(D[i]))
            return TPK_ERROR(ctx, TPK_EDOM, "layer %d: the %s of token %zu of sequence %zu has "
                             "variance %g (%s; ln-eps > 0 keeps it finite)", layer, what,
                             i % T + 1, i / T + 1, v, v > 0 ? "overflow" : "zero signal");
    }
    return TPK_OK;
}

/* S_ab ← alpha·P_a S_ab P_bᵀ on the blocks b ≤ a of the lower triangle, in place: each row slab
 * of them times P_a, then each column slab times P_bᵀ (2N products, whatever the number of
 * blocks); a diagonal block's lower triangle by tri_right_lower through R. */
static int sandwich(double *S, const double *P, size_t N, size_t T, double alpha, double *R,
                    tpk_ctx *ctx)
{
    const size_t M = N * T;
    int st = TPK_OK;
    mirror_diagonal_blocks(S, N, T);
    for (size_t a = 0; st == TPK_OK && a < N; a++)
        st = tpk_dtrmm(TPK_LEFT, TPK_LOWER, TPK_NO_TRANS, T, (a + 1) * T, alpha, P + a * T * T, T,
                       S + a * T * M, M, ctx);
    for (size_t b = 0; st == TPK_OK && b < N; b++) {
        const double *Pb = P + b * T * T;
        size_t o = b * T * M + b * T;
        if (b + 1 < N)
            st = tpk_dtrmm(TPK_RIGHT, TPK_LOWER, TPK_TRANS, M - (b + 1) * T, T, 1.0, Pb, T,
                           S + o + T * M, M, ctx);
        if (st == TPK_OK)
            st = tri_right_lower(T, S + o, M, Pb, R + o, M, ctx);
        for (size_t i = 0; st == TPK_OK && i < T; i++)
            memcpy(S + o + i * M, R + o + i * M, (i + 1) * sizeof *S);
    }
    return st;
}

/* The NTK's own factors (tpk_ntk_own) of the embedding, the key projections, the feed-forward
 * weights, their biases and the readout. */
typedef struct tr_own {
    double e, u, w, b, v;
} tr_own;

/* The feed-forward block's NTK step, one pass over the lower triangle, row by row: with S = Σ^h,
 * R = Σ^pre and Tz = T^h, V_φ′ and V_φ of each row of R by two segment maps over R's diagonal,
 * then T^pre = w_W Σ^h + var_w T^h + w_b entrywise, Tz ← T^f + T^h with
 * T^f = w_W V_φ(Σ^pre) + var_w V_φ′(Σ^pre) ⊙ T^pre + w_b, and R ← Σ^f = var_w V_φ + var_b.
 * buf: M·(1 + threads) doubles. */
static int ffn_tangent(const tpk_transformer_params *p, const tpk_phi *dphi, const tr_own *own,
                       size_t M, const double *S, double *R, double *Tz, double *buf,
                       const tpk_gauss_ws *ws, double *err, tpk_ctx *ctx)
{
    for (size_t i = 0; i < M; i++)
        buf[i] = R[i * M + i];
    tpk_gauss_segmap *sm = tpk_gauss_segmap_alloc(p->phi, buf, M, ws, ctx);
    tpk_gauss_segmap *sd = sm ? tpk_gauss_segmap_alloc(dphi, buf, M, ws, ctx) : NULL;
    if (!sm || !sd) {
        tpk_gauss_segmap_free(sm);
        return ctx->status ? ctx->status : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    }
    const double vw = p->var_w, vb = p->var_b;
#pragma omp parallel
    {
        double maxr = 0, emax = 0, maxd = 0, emaxd = 0;
        double *kd = buf + M * (1 + (size_t)omp_get_thread_num());
#pragma omp for schedule(dynamic, 16)
        for (size_t i = 0; i < M; i++) {
            double *row = R + i * M, *t = Tz + i * M;
            const double *h = S + i * M;
            tpk_gauss_segmap_row(sd, i, 0, i + 1, row, kd, &maxd, &emaxd);
            tpk_gauss_segmap_row(sm, i, 0, i + 1, row, row, &maxr, &emax);
            for (size_t j = 0; j <= i; j++) {
                const double k = row[j], pre = own->w * h[j] + vw * t[j] + own->b;
                t[j] += own->w * k + vw * kd[j] * pre + own->b;
                row[j] = vw * k + vb;
            }
        }
        tpk_gauss_segmap_merge(sm, maxr, emax);
        tpk_gauss_segmap_merge(sd, maxd, emaxd);
    }
    double e = 0;
    int st = tpk_gauss_segmap_finish(sm, &e, ctx);
    if (!st)
        st = tpk_gauss_segmap_finish(sd, NULL, ctx);
    *err = vw * e;
    tpk_gauss_segmap_free(sm);
    tpk_gauss_segmap_free(sd);
    return st;
}

/* An M×M result from the lower triangle of S: all tokens (mirrored, S's array itself taken into
 * *K from *Z), or the last token of each sequence (N×N). */
static int tokens_out(tpk_array **Z, size_t N, size_t T, int all_tokens, tpk_array **K,
                      tpk_ctx *ctx)
{
    const size_t M = N * T;
    double *S = (*Z)->data;
    if (all_tokens) {
#pragma omp parallel for schedule(dynamic, 32)
        for (size_t i = 0; i < M; i++)
            for (size_t j = i + 1; j < M; j++)
                S[i * M + j] = S[j * M + i];
        *K = *Z;
        *Z = NULL;
    } else {
        if (!(*K = tpk_array_alloc2(N, N, ctx)))
            return ctx->status;
        for (size_t a = 0; a < N; a++)
            for (size_t b = 0; b <= a; b++)
                (*K)->data[a * N + b] = (*K)->data[b * N + a] = S[(a * T + T - 1) * M + b * T + T - 1];
    }
    const size_t n = (*K)->dims[0];
    for (size_t i = 0; i < n * n; i++)
        if (!isfinite((*K)->data[i])) {
            int st = TPK_ERROR(ctx, TPK_ENUMERIC, "limit kernel has a non-finite entry (%zu, %zu)",
                               i / n, i % n);
            tpk_array_free(*K);
            *K = NULL;
            return st;
        }
    return TPK_OK;
}

int tpk_transformer_kernel(const tpk_transformer_params *p, const tpk_array *X, int all_tokens,
                           const tpk_gauss_ws *ws, const tpk_progress *prog, tpk_array **K,
                           double *err, tpk_ctx *ctx)
{
    return tpk_transformer_kernels(p, X, all_tokens, ws, prog, K, NULL, err, ctx);
}

int tpk_transformer_kernels(const tpk_transformer_params *p, const tpk_array *X, int all_tokens,
                            const tpk_gauss_ws *ws, const tpk_progress *prog, tpk_array **K,
                            tpk_array **Theta, double *err, tpk_ctx *ctx)
{
    *K = NULL;
    if (Theta)
        *Theta = NULL;
    if (err)
        *err = 0;
    int st = tpk_transformer_params_check(p, ctx);
    if (st)
        return st;
    if (!X || !X->data || X->ndim != 3 || X->dims[0] == 0 || X->dims[1] == 0 || X->dims[2] == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "tokens are N × T × d with N, T, d >= 1 (got rank %d)",
                         X ? X->ndim : 0);
    if ((st = tpk_array_check_input(X, "tpk_transformer_kernel", "X", ctx)))
        return st;
    const size_t N = X->dims[0], T = X->dims[1], d = X->dims[2], M = N * T;
    if (M / N != T || M > ((size_t)1 << 28)) /* M² doubles then fit a size_t */
        return TPK_ERROR(ctx, TPK_EINVAL, "%zu sequences of %zu tokens are too many for one kernel",
                         N, T);
    const int ntk = Theta != NULL;
    tr_own own = {0};
    tpk_phi *dphi = NULL;
    if (ntk) {
        const int pm = p->ntk_param;
        if ((st = tpk_ntk_param_check("tpk_transformer_kernels", pm, (double)p->ntk_width, ctx)))
            return st;
        const double n = (double)p->ntk_width;
        own = (tr_own){tpk_ntk_own(pm, p->var_e, (double)d), tpk_ntk_own(pm, p->var_u, n),
                       tpk_ntk_own(pm, p->var_w, n), tpk_ntk_own(pm, p->var_b, 1.0),
                       tpk_ntk_own(pm, p->sigma_v2, n)};
        if (!(dphi = tpk_phi_derivative(p->phi, ctx)))
            return ctx->status;
    }
    tpk_array *Z = tpk_array_alloc2(M, M, ctx); /* Σ^z, then (all tokens) K itself */
    tpk_array *TZ = ntk ? tpk_array_alloc2(M, M, ctx) : NULL; /* the tangent kernel of z */
    double *R = tpk_malloc(ctx, M * M * sizeof *R), *P = tpk_malloc(ctx, M * T * sizeof *P);
    double *D = tpk_malloc(ctx, M * sizeof *D);
    /* the NTK: the feed-forward pass's row buffers */
    double *buf = ntk ? tpk_malloc(ctx, M * (1 + (size_t)omp_get_max_threads()) * sizeof *buf)
                      : NULL;
    const int lowrank = d < T;
    if (!Z || !R || !P || !D || (ntk && (!TZ || !buf))) {
        st = ctx->status ? ctx->status : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        goto done;
    }
    double *S = Z->data, *Tz = ntk ? TZ->data : NULL, emax = 0;
    st = tpk_dsyrk_lower(TPK_NO_TRANS, M, d, p->var_e / (double)d, X->data, d, 0.0, S, M, ctx);
    if (st == TPK_OK && ntk) /* the embedding's own term on ⟨x, x̄⟩/d */
        st = tpk_dsyrk_lower(TPK_NO_TRANS, M, d, own.e / (double)d, X->data, d, 0.0, Tz, M, ctx);
    for (int l = 0; st == TPK_OK && l < p->depth; l++) {
        if ((st = tpk_progress_report(prog, "layers", (size_t)l, (size_t)p->depth, ctx)))
            break;
        mixing(S, N, T, p->var_u / p->temp, P);
        if (ntk) { /* T^k = w_U Σ^z + var_u T^z, then T^r = P T^k Pᵀ (the logits are Moments:
                    * constant in the tangent, Tensor Programs II App. E.5; theory.md §8.5) */
#pragma omp parallel for schedule(dynamic, 32)
            for (size_t i = 0; i < M; i++)
                for (size_t j = 0; j <= i; j++)
                    Tz[i * M + j] = own.u * S[i * M + j] + p->var_u * Tz[i * M + j];
            if ((st = sandwich(Tz, P, N, T, 1.0, R, ctx)))
                break;
        }
        if (l == 0 && lowrank) { /* Σ^r = var_u (P F)(P F)ᵀ, F = sqrt(var_e/d) X; P F in R */
            const double c = sqrt(p->var_e / (double)d);
            for (size_t a = 0; st == TPK_OK && a < N; a++)
                st = tri_left(T, d, c, P + a * T * T, X->data + a * T * d, d, R + a * T * d, d, ctx);
            if (st == TPK_OK)
                st = tpk_dsyrk_lower(TPK_NO_TRANS, M, d, p->var_u, R, d, 0.0, S, M, ctx);
        } else {
            st = sandwich(S, P, N, T, p->var_u, R, ctx);
        }
        if (st || (st = ln_factors(S, NULL, M, T, p->eps, l + 1, "attention output", D, ctx)))
            break;
        /* Σ^h = LN(Σ^r) in S; the feed-forward pre-activation var_w Σ^h + var_b in R (the LN's
         * moments constant in the tangent: T^h = LN's scaling of T^r; T^pre in TP) */
        const double vw = p->var_w, vb = p->var_b;
#pragma omp parallel for schedule(dynamic, 32)
        for (size_t i = 0; i < M; i++)
            for (size_t j = 0; j <= i; j++) {
                double h = S[i * M + j] * D[i] * D[j];
                S[i * M + j] = h;
                R[i * M + j] = vw * h + vb;
                if (ntk)
                    Tz[i * M + j] *= D[i] * D[j];
            }
        double e = 0;
        if (!ntk) {
            if ((st = tpk_gauss_map_affine_lower(p->phi, R, M, vw, vb, R, ws, &e, ctx)))
                break;
        } else if ((st = ffn_tangent(p, dphi, &own, M, S, R, Tz, buf, ws, &e, ctx))) {
            break;
        }
        emax = fmax(emax, e);
        if ((st = ln_factors(S, R, M, T, p->eps, l + 1, "feed-forward output", D, ctx)))
            break;
        /* Σ^z = LN(Σ^f + Σ^h); the last layer takes the readout's σ_v² too (the NTK: Θ = w_v Σ^z
         * + σ_v² T^z, T^z = LN's scaling of T^f + T^h; f's tangent and h's are uncorrelated:
         * f's passes through the fresh W2) */
        const int last = l == p->depth - 1;
        const double sc = last ? p->sigma_v2 : 1.0;
#pragma omp parallel for schedule(dynamic, 32)
        for (size_t i = 0; i < M; i++)
            for (size_t j = 0; j <= i; j++) {
                const double z = (R[i * M + j] + S[i * M + j]) * D[i] * D[j];
                if (ntk) {
                    const double tz = Tz[i * M + j] * D[i] * D[j];
                    Tz[i * M + j] = last ? own.v * z + p->sigma_v2 * tz : tz;
                }
                S[i * M + j] = sc * z;
            }
    }
    if (st == TPK_OK)
        st = tpk_progress_report(prog, "layers", (size_t)p->depth, (size_t)p->depth, ctx);
    if (st == TPK_OK)
        st = tokens_out(&Z, N, T, all_tokens, K, ctx);
    if (st == TPK_OK && ntk && (st = tokens_out(&TZ, N, T, all_tokens, Theta, ctx))) {
        tpk_array_free(*K);
        *K = NULL;
    }
    if (err && st == TPK_OK)
        *err = p->sigma_v2 * emax;
done:
    tpk_array_free(Z);
    tpk_array_free(TZ);
    tpk_free(ctx, R);
    tpk_free(ctx, P);
    tpk_free(ctx, D);
    tpk_free(ctx, buf);
    tpk_phi_free(dphi);
    return st;
}
