/* One multi-head attention layer: the hierarchical 1/sqrt(n) limit (theory.md §5.2–5.3), the 1/n
 * uniform-averaging limit (§2.7), and an exact-in-law finite-width sampler (see tpk/attention.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>
#include <lapacke.h>

#include "tpk/attention.h"
#include "tpk/alloc.h"

/* Per-draw generator seeds: splitmix64 of (seed, stream, index), so draws do not depend on the
 * thread that makes them. */
static unsigned long draw_seed(uint64_t seed, uint64_t stream, uint64_t i)
{
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (stream * 0x100000001ull + i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (unsigned long)(z ^ (z >> 31));
}

/* L (m×m) with L Lᵀ = S: eigen-decomposition, negative eigenvalues (rounding) clipped at 0
 * (theory §1.6: never a plain Cholesky). work: m² + m doubles. Returns 0 on success. */
static int sqrt_psd(const double *S, size_t m, double *L, double *work)
{
    double *V = work, *lam = work + m * m;
    memcpy(V, S, m * m * sizeof *V);
    if (m == 1) {
        L[0] = S[0] > 0 ? sqrt(S[0]) : 0.0;
        return 0;
    }
    if (LAPACKE_dsyev(LAPACK_ROW_MAJOR, 'V', 'L', (int)m, V, (int)m, lam) != 0)
        return -1;
    for (size_t j = 0; j < m; j++) {
        double s = lam[j] > 0 ? sqrt(lam[j]) : 0.0;
        for (size_t i = 0; i < m; i++)
            L[i * m + j] = V[i * m + j] * s;
    }
    return 0;
}

/* Row softmax of logits P (ld) over the visible columns of each row of one sequence of T tokens,
 * written into A (same layout); invisible entries 0. */
static void softmax_rows(const double *P, size_t ld, size_t T, int causal, double *A)
{
    for (size_t i = 0; i < T; i++) {
        size_t vis = causal ? i + 1 : T;
        const double *p = P + i * ld;
        double *a = A + i * ld, mx = -INFINITY, z = 0.0;
        for (size_t j = 0; j < vis; j++)
            mx = p[j] > mx ? p[j] : mx;
        for (size_t j = 0; j < vis; j++)
            z += (a[j] = exp(p[j] - mx));
        for (size_t j = 0; j < vis; j++)
            a[j] /= z;
        for (size_t j = vis; j < T; j++)
            a[j] = 0.0;
    }
}

static int check_params(const tpk_attn_params *p, tpk_ctx *ctx)
{
    if (p == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "attention: parameters are required");
    if (p->heads < 1)
        return TPK_ERROR(ctx, TPK_EINVAL, "attention: heads must be >= 1 (got %d)", p->heads);
    if (p->scaling != TPK_ATTN_INV_N && p->scaling != TPK_ATTN_INV_SQRT_N)
        return TPK_ERROR(ctx, TPK_EINVAL, "attention: unknown logit scaling %d", p->scaling);
    if (!(p->temp > 0) || !isfinite(p->temp))
        return TPK_ERROR(ctx, TPK_EDOM, "attention: temp must be finite and > 0 (got %g)", p->temp);
    const double v[4] = {p->var_q, p->var_k, p->var_v, p->var_o};
    for (int i = 0; i < 4; i++)
        if (!(v[i] >= 0) || !isfinite(v[i]))
            return TPK_ERROR(ctx, TPK_EDOM, "attention: variances must be finite and >= 0");
    return TPK_OK;
}

int tpk_attn_limit_covs(const double *Sx, size_t nseq, size_t T, const tpk_attn_params *prm,
                        const size_t *sel, size_t m, size_t R, uint64_t seed, double *C,
                        double *mean, double *se, tpk_ctx *ctx)
{
    tpk_error_gsl_init(); /* GSL failures as return codes, never abort() (tpk/error.h) */
    int st = check_params(prm, ctx);
    if (st)
        return st;
    size_t P = nseq * T;
    if (Sx == NULL || mean == NULL || P == 0 || m == 0 || R == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_attn_limit_covs: Sx, mean and sizes >= 1 required");
    for (size_t i = 0; i < m; i++)
        if (sel && sel[i] >= P)
            return TPK_ERROR(ctx, TPK_EINVAL, "tpk_attn_limit_covs: token %zu out of range", sel[i]);
    for (size_t i = 0; i < P * P; i++)
        if (!isfinite(Sx[i]))
            return TPK_ERROR(ctx, TPK_EDOM, "tpk_attn_limit_covs: token kernel is not finite");
    double *L = tpk_malloc(ctx, P * P * sizeof *L), *work = tpk_malloc(ctx, (P * P + P) * sizeof *work);
    double *all = C ? C : tpk_malloc(ctx, R * m * m * sizeof *all);
    if (!L || !work || !all) {
        tpk_free(ctx, L);
        tpk_free(ctx, work);
        if (all != C)
            tpk_free(ctx, all);
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    }
    if (sqrt_psd(Sx, P, L, work)) {
        st = TPK_ERROR(ctx, TPK_ENUMERIC, "eigen-decomposition of the token kernel failed");
        goto done;
    }
    const double sv = prm->var_v * prm->var_o, sp = sqrt(prm->var_q * prm->var_k) / prm->temp;
    /* 1/n: every logit is 0, one deterministic C; 1/sqrt(n): R draws */
    size_t draws = prm->scaling == TPK_ATTN_INV_N ? 1 : R;
    int oom = 0;
    const tpk_allocator mem = tpk_ctx_allocator(ctx); /* threads: no ctx (reported below) */
#pragma omp parallel
    {
        double *G = tpk_mem_malloc(&mem, P * P * sizeof *G, NULL);
        double *T1 = tpk_mem_malloc(&mem, P * P * sizeof *T1, NULL);
        double *A = tpk_mem_calloc(&mem, P * P, sizeof *A, NULL);
        double *M1 = tpk_mem_malloc(&mem, P * P * sizeof *M1, NULL);
        double *Cr = tpk_mem_malloc(&mem, P * P * sizeof *Cr, NULL);
        gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
        int ok = G && T1 && A && M1 && Cr && rng;
        if (!ok) {
#pragma omp atomic write
            oom = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (size_t r = 0; r < draws; r++) {
            if (!ok)
                continue;
            gsl_rng_set(rng, draw_seed(seed, 1, r));
            memset(Cr, 0, P * P * sizeof *Cr);
            for (int a = 0; a < prm->heads; a++) {
                /* logits p = sp · L G Lᵀ: vec covariance (L Lᵀ) ⊗ (L Lᵀ) = Sx ⊗ Sx (§5.3) */
                if (prm->scaling == TPK_ATTN_INV_SQRT_N) {
                    for (size_t i = 0; i < P * P; i++)
                        G[i] = gsl_ran_gaussian_ziggurat(rng, 1.0);
                    for (size_t i = 0; i < P; i++) { /* T1 = L G */
                        double *t = T1 + i * P;
                        memset(t, 0, P * sizeof *t);
                        for (size_t k = 0; k < P; k++) {
                            double l = L[i * P + k];
                            const double *g = G + k * P;
                            for (size_t j = 0; j < P; j++)
                                t[j] += l * g[j];
                        }
                    }
                    for (size_t i = 0; i < P; i++) /* G ← sp · T1 Lᵀ */
                        for (size_t j = 0; j < P; j++) {
                            double s = 0.0;
                            for (size_t k = 0; k < P; k++)
                                s += T1[i * P + k] * L[j * P + k];
                            G[i * P + j] = sp * s;
                        }
                } else {
                    memset(G, 0, P * P * sizeof *G);
                }
                for (size_t b = 0; b < nseq; b++) /* block-diagonal attention, one per sequence */
                    softmax_rows(G + b * T * P + b * T, P, T, prm->causal, A + b * T * P + b * T);
                /* M1 = A Σ^V (A block-diagonal), Cr += M1 Aᵀ */
                for (size_t b = 0; b < nseq; b++)
                    for (size_t i = 0; i < T; i++) {
                        double *o = M1 + (b * T + i) * P;
                        memset(o, 0, P * sizeof *o);
                        for (size_t j = 0; j < T; j++) {
                            double w = A[(b * T + i) * P + b * T + j] * sv;
                            const double *s = Sx + (b * T + j) * P;
                            if (w != 0.0)
                                for (size_t c = 0; c < P; c++)
                                    o[c] += w * s[c];
                        }
                    }
                for (size_t i = 0; i < P; i++)
                    for (size_t c = 0; c < nseq; c++)
                        for (size_t k = 0; k < T; k++) {
                            double s = 0.0;
                            const double *ar = A + (c * T + k) * P + c * T, *mr = M1 + i * P + c * T;
                            for (size_t l = 0; l < T; l++)
                                s += mr[l] * ar[l];
                            Cr[i * P + c * T + k] += s / prm->heads;
                        }
            }
            double *dst = all + r * m * m;
            for (size_t i = 0; i < m; i++)
                for (size_t j = 0; j < m; j++) {
                    size_t si = sel ? sel[i] : i, sj = sel ? sel[j] : j;
                    /* symmetrise: the two triangles come from different summation orders */
                    dst[i * m + j] = 0.5 * (Cr[si * P + sj] + Cr[sj * P + si]);
                }
        }
        tpk_mem_free(&mem, G);
        tpk_mem_free(&mem, T1);
        tpk_mem_free(&mem, A);
        tpk_mem_free(&mem, M1);
        tpk_mem_free(&mem, Cr);
        gsl_rng_free(rng);
    }
    if (oom) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        goto done;
    }
    for (size_t r = draws; r < R && C; r++)
        memcpy(C + r * m * m, C, m * m * sizeof *C);
    /* mean and its standard error, in draw order (reproducible) */
    for (size_t i = 0; i < m * m; i++) {
        double s = 0.0, s2 = 0.0;
        for (size_t r = 0; r < draws; r++)
            s += all[r * m * m + i];
        s /= (double)draws;
        for (size_t r = 0; r < draws; r++)
            s2 += (all[r * m * m + i] - s) * (all[r * m * m + i] - s);
        mean[i] = s;
        if (se)
            se[i] = draws > 1 ? sqrt(s2 / (double)(draws - 1) / (double)draws) : 0.0;
    }
done:
    tpk_free(ctx, L);
    tpk_free(ctx, work);
    if (all != C)
        tpk_free(ctx, all);
    return st;
}

int tpk_attn_finite_sample(const double *Sx, size_t s, const tpk_attn_params *prm, size_t n,
                           size_t M, uint64_t seed, double *Khat, double *Y, tpk_ctx *ctx)
{
    tpk_error_gsl_init();
    int st = check_params(prm, ctx);
    if (st)
        return st;
    if (Sx == NULL || s == 0 || n == 0 || M == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_attn_finite_sample: Sx and sizes >= 1 required");
    double Lx[64 * 64], wk[64 * 64 + 64];
    if (s > 64)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_attn_finite_sample: at most 64 tokens (got %zu)", s);
    if (sqrt_psd(Sx, s, Lx, wk))
        return TPK_ERROR(ctx, TPK_ENUMERIC, "eigen-decomposition of the token kernel failed");
    const double scale = prm->scaling == TPK_ATTN_INV_SQRT_N ? 1.0 / sqrt((double)n) : 1.0 / (double)n;
    int oom = 0;
    const tpk_allocator mem = tpk_ctx_allocator(ctx); /* threads: no ctx (reported below) */
#pragma omp parallel
    {
        double *Z = tpk_mem_malloc(&mem, n * s * sizeof *Z, NULL);
        double *Q = tpk_mem_malloc(&mem, n * s * sizeof *Q, NULL);
        double *K = tpk_mem_malloc(&mem, n * s * sizeof *K, NULL);
        double *V = tpk_mem_malloc(&mem, n * s * sizeof *V, NULL);
        double *U = tpk_mem_malloc(&mem, n * s * sizeof *U, NULL);
        double *y = tpk_mem_malloc(&mem, n * s * sizeof *y, NULL);
        double S[64 * 64], Ls[64 * 64], w2[64 * 64 + 64], Pl[64 * 64], A[64 * 64], g[64];
        gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
        int ok = Z && Q && K && V && U && y && rng;
        if (!ok) {
#pragma omp atomic write
            oom = 1;
        }
#pragma omp for schedule(dynamic, 4)
        for (size_t net = 0; net < M; net++) {
            if (!ok)
                continue;
            gsl_rng_set(rng, draw_seed(seed, 2, net));
            /* rows of X (n × s) iid N(0, L Lᵀ): row α = L g */
            #define ROWS(X, Lm, sd)                                                          \
                for (size_t al = 0; al < n; al++) {                                          \
                    for (size_t k = 0; k < s; k++)                                           \
                        g[k] = gsl_ran_gaussian_ziggurat(rng, 1.0);                          \
                    for (size_t i = 0; i < s; i++) {                                         \
                        double acc = 0.0;                                                    \
                        for (size_t k = 0; k < s; k++)                                       \
                            acc += (Lm)[i * s + k] * g[k];                                   \
                        (X)[al * s + i] = (sd) * acc;                                        \
                    }                                                                        \
                }
            ROWS(Z, Lx, 1.0)
            memset(y, 0, n * s * sizeof *y);
            for (int a = 0; a < prm->heads && ok; a++) {
                /* given Z, the rows of W Z are iid N(0, var ZᵀZ/n) */
                for (size_t i = 0; i < s; i++)
                    for (size_t j = 0; j < s; j++) {
                        double acc = 0.0;
                        for (size_t al = 0; al < n; al++)
                            acc += Z[al * s + i] * Z[al * s + j];
                        S[i * s + j] = acc / (double)n;
                    }
                sqrt_psd(S, s, Ls, w2);
                ROWS(Q, Ls, sqrt(prm->var_q))
                ROWS(K, Ls, sqrt(prm->var_k))
                ROWS(V, Ls, sqrt(prm->var_v))
                for (size_t i = 0; i < s; i++)
                    for (size_t j = 0; j < s; j++) {
                        double acc = 0.0;
                        for (size_t al = 0; al < n; al++)
                            acc += Q[al * s + i] * K[al * s + j];
                        Pl[i * s + j] = acc * scale / prm->temp;
                    }
                softmax_rows(Pl, s, s, prm->causal, A);
                for (size_t al = 0; al < n; al++) /* U = V Aᵀ */
                    for (size_t i = 0; i < s; i++) {
                        double acc = 0.0;
                        for (size_t j = 0; j < s; j++)
                            acc += A[i * s + j] * V[al * s + j];
                        U[al * s + i] = acc;
                    }
                for (size_t i = 0; i < s; i++)
                    for (size_t j = 0; j < s; j++) {
                        double acc = 0.0;
                        for (size_t al = 0; al < n; al++)
                            acc += U[al * s + i] * U[al * s + j];
                        S[i * s + j] = acc / (double)n;
                    }
                sqrt_psd(S, s, Ls, w2);
                ROWS(Q, Ls, sqrt(prm->var_o / (double)prm->heads)) /* W_O U / √H, into Q */
                for (size_t i = 0; i < n * s; i++)
                    y[i] += Q[i];
            }
            #undef ROWS
            if (Khat)
                for (size_t i = 0; i < s; i++)
                    for (size_t j = 0; j < s; j++) {
                        double acc = 0.0;
                        for (size_t al = 0; al < n; al++)
                            acc += y[al * s + i] * y[al * s + j];
                        Khat[(net * s + i) * s + j] = acc / (double)n;
                    }
            if (Y) {
                double *o = Y + net * s;
                for (size_t i = 0; i < s; i++)
                    o[i] = 0.0;
                for (size_t al = 0; al < n; al++) {
                    double v = gsl_ran_gaussian_ziggurat(rng, 1.0);
                    for (size_t i = 0; i < s; i++)
                        o[i] += v * y[al * s + i];
                }
                for (size_t i = 0; i < s; i++)
                    o[i] /= sqrt((double)n);
            }
        }
        tpk_mem_free(&mem, Z);
        tpk_mem_free(&mem, Q);
        tpk_mem_free(&mem, K);
        tpk_mem_free(&mem, V);
        tpk_mem_free(&mem, U);
        tpk_mem_free(&mem, y);
        gsl_rng_free(rng);
    }
    return oom ? TPK_ERROR(ctx, TPK_ENOMEM, "out of memory") : TPK_OK;
}

int tpk_attn_mixture_sample(const double *C, size_t R, size_t m, size_t M, uint64_t seed,
                            double *Y, tpk_ctx *ctx)
{
    tpk_error_gsl_init();
    if (C == NULL || Y == NULL || R == 0 || m == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_attn_mixture_sample: C, Y and sizes >= 1 required");
    double *L = tpk_malloc(ctx, R * m * m * sizeof *L), *work = tpk_malloc(ctx, (m * m + m) * sizeof *work);
    int st = TPK_OK;
    if (!L || !work) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        goto done;
    }
    for (size_t r = 0; r < R; r++)
        if (sqrt_psd(C + r * m * m, m, L + r * m * m, work)) {
            st = TPK_ERROR(ctx, TPK_ENUMERIC, "eigen-decomposition of C[%zu] failed", r);
            goto done;
        }
    gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
    double *g = tpk_malloc(ctx, m * sizeof *g);
    if (!rng || !g) {
        gsl_rng_free(rng);
        tpk_free(ctx, g);
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        goto done;
    }
    gsl_rng_set(rng, draw_seed(seed, 3, 0));
    for (size_t i = 0; i < M; i++) {
        const double *l = L + (i % R) * m * m;
        for (size_t k = 0; k < m; k++)
            g[k] = gsl_ran_gaussian_ziggurat(rng, 1.0);
        for (size_t a = 0; a < m; a++) {
            double acc = 0.0;
            for (size_t k = 0; k < m; k++)
                acc += l[a * m + k] * g[k];
            Y[i * m + a] = acc;
        }
    }
    gsl_rng_free(rng);
    tpk_free(ctx, g);
done:
    tpk_free(ctx, L);
    tpk_free(ctx, work);
    return st;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int tpk_attn_w1_samples(const double *x, size_t M, const double *y, size_t P, double *out,
                        tpk_ctx *ctx)
{
    if (x == NULL || y == NULL || out == NULL || M == 0 || P == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_attn_w1_samples: two non-empty samples required");
    double *a = tpk_malloc(ctx, M * sizeof *a), *b = tpk_malloc(ctx, P * sizeof *b);
    if (!a || !b) {
        tpk_free(ctx, a);
        tpk_free(ctx, b);
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    }
    memcpy(a, x, M * sizeof *a);
    memcpy(b, y, P * sizeof *b);
    qsort(a, M, sizeof *a, cmp_double);
    qsort(b, P, sizeof *b, cmp_double);
    /* walk the merged values: between consecutive ones both CDFs are constant */
    size_t i = 0, j = 0;
    double w = 0.0, prev = a[0] < b[0] ? a[0] : b[0];
    while (i < M || j < P) {
        double next = j >= P || (i < M && a[i] <= b[j]) ? a[i] : b[j];
        w += fabs((double)i / (double)M - (double)j / (double)P) * (next - prev);
        prev = next;
        while (i < M && a[i] == next)
            i++;
        while (j < P && b[j] == next)
            j++;
    }
    tpk_free(ctx, a);
    tpk_free(ctx, b);
    *out = w;
    return TPK_OK;
}

/* E|X − X'| for X, X' independent from the mixture (U-statistic over distinct components). */
static double within(const double *v, size_t n)
{
    if (n == 1)
        return sqrt(4.0 * v[0] / M_PI);
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            s += sqrt(2.0 * (v[i] + v[j]) / M_PI);
    return 2.0 * s / ((double)n * (double)(n - 1));
}

int tpk_attn_energy_mixtures(const double *va, size_t na, const double *vb, size_t nb,
                             double *out, tpk_ctx *ctx)
{
    if (va == NULL || vb == NULL || out == NULL || na == 0 || nb == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_attn_energy_mixtures: two non-empty mixtures required");
    for (size_t i = 0; i < na; i++)
        if (!(va[i] >= 0) || !isfinite(va[i]))
            return TPK_ERROR(ctx, TPK_EDOM, "tpk_attn_energy_mixtures: variance %zu is not >= 0", i);
    for (size_t j = 0; j < nb; j++)
        if (!(vb[j] >= 0) || !isfinite(vb[j]))
            return TPK_ERROR(ctx, TPK_EDOM, "tpk_attn_energy_mixtures: variance %zu is not >= 0", j);
    double x = 0.0;
#pragma omp parallel for reduction(+ : x) schedule(static) if (na * nb > 1000000)
    for (size_t i = 0; i < na; i++)
        for (size_t j = 0; j < nb; j++)
            x += sqrt(2.0 * (va[i] + vb[j]) / M_PI);
    *out = 2.0 * x / ((double)na * (double)nb) - within(va, na) - within(vb, nb);
    return TPK_OK;
}
