/* CNN NNGP kernels by the direct recursion of theory.md §2.8: (position × position) covariance
 * blocks per input pair, the 2-D closed-form maps of gauss.h, and the tap convolution between
 * layers by separable direct summation or FFTW. */
#include "tpk/cnn.h"
#include "tpk/alloc.h"

#include "gauss_impl.h" /* φ's closed-form family (the float32 maps) */

#include <fftw3.h>
#include <omp.h>
#include <float.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the grid and its taps ------------------------------------------------------------------- */

typedef struct grid {
    size_t R, S, Q;   /* rows, cols, positions */
    int kh, kw, cr, cs;
    int circular;
} grid;

static grid make_grid(size_t rows, size_t cols, int kh, int kw, int padding)
{
    grid g = {.R = rows, .S = cols, .Q = rows * cols, .kh = kh, .kw = kw,
              .cr = (kh - 1) / 2, .cs = (kw - 1) / 2, .circular = padding == TPK_CNN_CIRCULAR};
    return g;
}

/* Position i + d on an axis of length n: wrapped, or −1 when it falls off (zero padding). */
static long axis_pos(long i, long d, long n, int circular)
{
    long q = i + d;
    if (circular)
        return ((q % n) + n) % n;
    return q >= 0 && q < n ? q : -1;
}

/* dst[s'] += src[s' + d] for s' < n, wrapped (circular) or zero outside. */
static void add_shifted(double *restrict dst, const double *restrict src, long n, long d, int circular)
{
    if (circular) {
        long dd = ((d % n) + n) % n;
        for (long s = 0; s < n - dd; s++)
            dst[s] += src[s + dd];
        for (long s = n - dd; s < n; s++)
            dst[s] += src[s + dd - n];
    } else {
        long lo = d < 0 ? -d : 0, hi = d > 0 ? n - d : n;
        for (long s = lo; s < hi; s++)
            dst[s] += src[s + d];
    }
}

/* Direct separable tap sum of a Q×Q block, one output plane (the Q-entry rows (r, s), s < S) at a
 * time: the row taps of the kh input planes r + d_i into the plane tmp (S·Q doubles), then its
 * column taps into out; (kh + kw) adds per entry, and each plane of the block read about once
 * from beyond L2 (a plane is S·Q doubles: 176 KB on 28×28). out = alpha·Σ + beta. */
static void conv_direct(const grid *g, double alpha, double beta, const double *in, double *out,
                        double *tmp)
{
    const long R = (long)g->R, S = (long)g->S, Q = (long)g->Q;
    for (long r = 0; r < R; r++) {
        memset(tmp, 0, (size_t)(S * Q) * sizeof *tmp);
        for (int i = 0; i < g->kh; i++) {
            const long d = i - g->cr, rr = axis_pos(r, d, R, g->circular);
            if (rr < 0)
                continue;
            for (long r2 = 0; r2 < R; r2++) {
                const long rr2 = axis_pos(r2, d, R, g->circular);
                if (rr2 < 0)
                    continue;
                for (long s = 0; s < S; s++) {
                    double *restrict dst = tmp + s * Q + r2 * S;
                    const double *restrict src = in + (rr * S + s) * Q + rr2 * S;
                    for (long t = 0; t < S; t++)
                        dst[t] += src[t];
                }
            }
        }
        for (long s = 0; s < S; s++) {
            double *dst = out + (r * S + s) * Q;
            memset(dst, 0, (size_t)Q * sizeof *dst);
            for (int j = 0; j < g->kw; j++) {
                const long d = j - g->cs, ss = axis_pos(s, d, S, g->circular);
                if (ss < 0)
                    continue;
                for (long r2 = 0; r2 < R; r2++)
                    add_shifted(dst + r2 * S, tmp + ss * Q + r2 * S, S, d, g->circular);
            }
            for (long t = 0; t < Q; t++)
                dst[t] = alpha * dst[t] + beta;
        }
    }
}

/* ---- FFT path -------------------------------------------------------------------------------- */

/* A block is a rank-4 array (r, s, r', s'); zero padding embeds it in (R+kh−1, S+kw−1, ...) so
 * that the circular correlation of the FFT reads zeros where the network reads them. Shifting
 * both position indices by d multiplies the spectrum by e^{+2πi(ω+ω')d/M}, so the tap sum is a
 * pointwise product with Φ_r(ω_r + ω_r') Φ_s(ω_s + ω_s'), Φ(ω) = Σ_t e^{2πiω d_t/M}. */
typedef struct fftplan {
    size_t MR, MS, nreal, ncplx;
    fftw_plan fwd, inv;
    fftw_complex *phr, *phs; /* Φ tables, MR and MS entries */
    tpk_allocator al;        /* of phr, phs (the plans are FFTW's own) */
} fftplan;

static void fftplan_free(fftplan *f)
{
    if (f->fwd)
        fftw_destroy_plan(f->fwd);
    if (f->inv)
        fftw_destroy_plan(f->inv);
    tpk_mem_aligned_free(&f->al, f->phr);
    tpk_mem_aligned_free(&f->al, f->phs);
    memset(f, 0, sizeof *f);
}

static void phi_table(fftw_complex *t, size_t M, int k, int c)
{
    for (size_t w = 0; w < M; w++) {
        double re = 0, im = 0;
        for (int j = 0; j < k; j++) {
            double a = 2.0 * M_PI * (double)w * (double)(j - c) / (double)M;
            re += cos(a);
            im += sin(a);
        }
        t[w][0] = re;
        t[w][1] = im;
    }
}

/* Plans for the grid (not thread-safe: FFTW's planner; call before any parallel region).
 * measure: FFTW_MEASURE (worth it when many blocks follow). */
static int fftplan_make(fftplan *f, const grid *g, int measure, tpk_ctx *ctx)
{
    memset(f, 0, sizeof *f);
    f->MR = g->circular ? g->R : g->R + (size_t)g->kh - 1;
    f->MS = g->circular ? g->S : g->S + (size_t)g->kw - 1;
    f->nreal = f->MR * f->MS * f->MR * f->MS;
    f->ncplx = f->MR * f->MS * f->MR * (f->MS / 2 + 1);
    f->al = tpk_ctx_allocator(ctx);
    /* the buffers from the allocator hook (64-byte aligned: what FFTW's SIMD codelets need, and
     * what every later buffer the plans run on has too) */
    double *re = tpk_aligned_alloc(ctx, 64, f->nreal * sizeof *re);
    fftw_complex *cx = tpk_aligned_alloc(ctx, 64, f->ncplx * sizeof *cx);
    f->phr = tpk_aligned_alloc(ctx, 64, f->MR * sizeof *f->phr);
    f->phs = tpk_aligned_alloc(ctx, 64, f->MS * sizeof *f->phs);
    int st = TPK_OK;
    if (!re || !cx || !f->phr || !f->phs) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (FFT of a %zu-position block)", g->Q);
    } else {
        unsigned flags = measure ? FFTW_MEASURE : FFTW_ESTIMATE;
        /* 1-D grids (one row) transform the (s, s') plane only */
        int n4[4] = {(int)f->MR, (int)f->MS, (int)f->MR, (int)f->MS}, n2[2] = {(int)f->MS, (int)f->MS};
        int rank = f->MR == 1 ? 2 : 4;
        const int *n = rank == 2 ? n2 : n4;
        f->fwd = fftw_plan_dft_r2c(rank, n, re, cx, flags);
        f->inv = fftw_plan_dft_c2r(rank, n, cx, re, flags);
        if (!f->fwd || !f->inv)
            st = TPK_ERROR(ctx, TPK_EUNSUPPORTED, "FFTW could not plan a %zux%zu block transform",
                           f->MR * f->MS, f->MR * f->MS);
        phi_table(f->phr, f->MR, g->kh, g->cr);
        phi_table(f->phs, f->MS, g->kw, g->cs);
    }
    tpk_aligned_free(ctx, re);
    tpk_aligned_free(ctx, cx);
    if (st)
        fftplan_free(f);
    return st;
}

/* out = alpha·(tap sum of in) + beta by FFT; re/cx: 64-byte aligned buffers of the plan's sizes. */
static void conv_fft(const grid *g, const fftplan *f, double alpha, double beta, const double *in,
                     double *out, double *re, fftw_complex *cx)
{
    const size_t R = g->R, S = g->S, Q = g->Q, MR = f->MR, MS = f->MS, MH = MS / 2 + 1;
    if (MR != R || MS != S)
        memset(re, 0, f->nreal * sizeof *re);
    for (size_t r = 0; r < R; r++)
        for (size_t s = 0; s < S; s++)
            for (size_t r2 = 0; r2 < R; r2++)
                memcpy(re + ((r * MS + s) * MR + r2) * MS, in + (r * S + s) * Q + r2 * S,
                       S * sizeof *re);
    fftw_execute_dft_r2c(f->fwd, re, cx);
    for (size_t w0 = 0; w0 < MR; w0++)
        for (size_t w1 = 0; w1 < MS; w1++)
            for (size_t w2 = 0; w2 < MR; w2++) {
                const double *a = f->phr[(w0 + w2) % MR];
                fftw_complex *row = cx + ((w0 * MS + w1) * MR + w2) * MH;
                for (size_t w3 = 0; w3 < MH; w3++) {
                    const double *b = f->phs[(w1 + w3) % MS];
                    double fr = a[0] * b[0] - a[1] * b[1], fi = a[0] * b[1] + a[1] * b[0];
                    double xr = row[w3][0], xi = row[w3][1];
                    row[w3][0] = xr * fr - xi * fi;
                    row[w3][1] = xr * fi + xi * fr;
                }
            }
    fftw_execute_dft_c2r(f->inv, cx, re);
    const double sc = alpha / (double)f->nreal;
    for (size_t r = 0; r < R; r++)
        for (size_t s = 0; s < S; s++)
            for (size_t r2 = 0; r2 < R; r2++) {
                const double *src = re + ((r * MS + s) * MR + r2) * MS;
                double *dst = out + (r * S + s) * Q + r2 * S;
                for (size_t t = 0; t < S; t++)
                    dst[t] = sc * src[t] + beta;
            }
}

int tpk_cnn_conv_prefers_fft(size_t rows, size_t cols, int kh, int kw, int padding)
{
    double MR = padding == TPK_CNN_CIRCULAR ? (double)rows : (double)rows + kh - 1;
    double MS = padding == TPK_CNN_CIRCULAR ? (double)cols : (double)cols + kw - 1;
    double c = rows == 1 ? TPK_CNN_FFT_COST_1D : TPK_CNN_FFT_COST_2D;
    double fft = c * log2(MR * MS * MR * MS) * (MR * MS * MR * MS) /
                 ((double)rows * cols * rows * cols);
    return fft < (double)(kh > 1 ? kh : 0) + (double)(kw > 1 ? kw : 0);
}

/* ---- workspaces ------------------------------------------------------------------------------ */

typedef struct pairws {
    double *A, *B, *T;      /* Q×Q blocks */
    double *re;             /* FFT buffers (NULL for direct) */
    fftw_complex *cx;
    tpk_allocator al;
} pairws;

static void pairws_free(pairws *w) /* idempotent */
{
    tpk_mem_free(&w->al, w->A);
    tpk_mem_free(&w->al, w->B);
    tpk_mem_free(&w->al, w->T);
    tpk_mem_aligned_free(&w->al, w->re);
    tpk_mem_aligned_free(&w->al, w->cx);
    memset(w, 0, sizeof *w);
}

static int pairws_alloc(pairws *w, size_t Q, const fftplan *f, tpk_ctx *ctx)
{
    memset(w, 0, sizeof *w);
    w->al = tpk_ctx_allocator(ctx);
    size_t q2 = Q > 0 ? Q * Q : 1;
    w->A = tpk_malloc(ctx, q2 * sizeof *w->A);
    w->B = tpk_malloc(ctx, q2 * sizeof *w->B);
    w->T = tpk_malloc(ctx, q2 * sizeof *w->T);
    if (f && f->fwd) {
        w->re = tpk_aligned_alloc(ctx, 64, f->nreal * sizeof *w->re);
        w->cx = tpk_aligned_alloc(ctx, 64, f->ncplx * sizeof *w->cx);
    }
    if (!w->A || !w->B || !w->T || (f && f->fwd && (!w->re || !w->cx))) {
        pairws_free(w);
        return TPK_ENOMEM;
    }
    return TPK_OK;
}

static void conv_any(const grid *g, const fftplan *f, pairws *w, double alpha, double beta,
                     const double *in, double *out)
{
    if (f && f->fwd)
        conv_fft(g, f, alpha, beta, in, out, w->re, w->cx);
    else
        conv_direct(g, alpha, beta, in, out, w->T);
}

/* TPK_OK when a kh×kw filter fits the rows×cols grid, else TPK_EINVAL saying so. */
static int filter_fits(size_t rows, size_t cols, int kh, int kw, tpk_ctx *ctx)
{
    if (rows < 1 || cols < 1 || kh < 1 || kw < 1 || (size_t)kh > rows || (size_t)kw > cols)
        return TPK_ERROR(ctx, TPK_EINVAL, "filter %dx%d does not fit a %zux%zu grid", kh, kw, rows,
                         cols);
    return TPK_OK;
}

/* A convolution of blocks with its plan and workspace, reused across calls (one per thread). */
struct tpk_cnn_convws {
    grid g;
    int fft;
    fftplan f;
    pairws w;
    tpk_allocator al; /* of this struct */
};

tpk_cnn_convws *tpk_cnn_convws_alloc(size_t rows, size_t cols, int kh, int kw, int padding, int method,
                                 tpk_ctx *ctx)
{
    if (filter_fits(rows, cols, kh, kw, ctx))
        return NULL;
    tpk_cnn_convws *c = tpk_calloc(ctx, 1, sizeof *c);
    if (c == NULL) {
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        return NULL;
    }
    c->al = tpk_ctx_allocator(ctx);
    c->g = make_grid(rows, cols, kh, kw, padding);
    c->fft = method == TPK_CNN_CONV_FFT ||
             (method == TPK_CNN_CONV_AUTO && tpk_cnn_conv_prefers_fft(rows, cols, kh, kw, padding));
    if (c->fft && fftplan_make(&c->f, &c->g, 0, ctx)) {
        tpk_free(ctx, c);
        return NULL;
    }
    if (pairws_alloc(&c->w, c->g.Q, c->fft ? &c->f : NULL, ctx)) {
        fftplan_free(&c->f);
        tpk_free(ctx, c);
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        return NULL;
    }
    return c;
}

void tpk_cnn_convws_free(tpk_cnn_convws *c)
{
    if (c == NULL)
        return;
    tpk_allocator al = c->al;
    pairws_free(&c->w);
    fftplan_free(&c->f);
    tpk_mem_free(&al, c);
}

void tpk_cnn_convws_apply(tpk_cnn_convws *c, double alpha, double beta, const double *in, double *out)
{
    conv_any(&c->g, c->fft ? &c->f : NULL, &c->w, alpha, beta, in, out);
}

int tpk_cnn_conv_block(size_t rows, size_t cols, int kh, int kw, int padding, int method,
                       double alpha, double beta, const double *in, double *out, tpk_ctx *ctx)
{
    if (filter_fits(rows, cols, kh, kw, ctx))
        return ctx->status;
    if (in == out)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_cnn_conv_block: in and out must not alias");
    grid g = make_grid(rows, cols, kh, kw, padding);
    int fft = method == TPK_CNN_CONV_FFT ||
              (method == TPK_CNN_CONV_AUTO && tpk_cnn_conv_prefers_fft(rows, cols, kh, kw, padding));
    fftplan f = {0};
    if (fft && fftplan_make(&f, &g, 0, ctx))
        return ctx->status;
    pairws w;
    if (pairws_alloc(&w, g.Q, fft ? &f : NULL, ctx)) {
        fftplan_free(&f);
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    }
    conv_any(&g, fft ? &f : NULL, &w, alpha, beta, in, out);
    pairws_free(&w);
    fftplan_free(&f);
    return TPK_OK;
}

/* ---- parameters ------------------------------------------------------------------------------ */

int tpk_cnn_params_check(const tpk_cnn_params *p, tpk_ctx *ctx)
{
    if (p->rows < 1 || p->cols < 1)
        return TPK_ERROR(ctx, TPK_EINVAL, "the grid must have at least one position (got %zux%zu)",
                         p->rows, p->cols);
    if (p->channels < 1)
        return TPK_ERROR(ctx, TPK_EINVAL, "inputs need at least one channel");
    if (p->kh < 1 || p->kw < 1 || (size_t)p->kh > p->rows || (size_t)p->kw > p->cols)
        return TPK_ERROR(ctx, TPK_EINVAL,
                         "the filter (%dx%d) must have at least one tap and fit the %zux%zu grid",
                         p->kh, p->kw, p->rows, p->cols);
    if (p->depth < 1)
        return TPK_ERROR(ctx, TPK_EINVAL, "depth must be at least 1 convolutional layer (got %d)",
                         p->depth);
    if (p->phi == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "no nonlinearity given");
    const double v[5] = {p->sigma_u2, p->sigma_w2, p->sigma_b2, p->sigma_v2, p->sigma_ob2};
    static const char *const name[5] = {"sigma_u2", "sigma_w2", "sigma_b2", "sigma_v2", "sigma_ob2"};
    for (int i = 0; i < 5; i++)
        if (!(v[i] >= 0) || !isfinite(v[i]))
            return TPK_ERROR(ctx, TPK_EDOM, "%s must be a finite variance >= 0 (got %g)", name[i], v[i]);
    if (p->padding != TPK_CNN_CIRCULAR && p->padding != TPK_CNN_ZERO)
        return TPK_ERROR(ctx, TPK_EINVAL, "unknown padding %d", p->padding);
    if (p->readout < TPK_CNN_FLATTEN || p->readout > TPK_CNN_LAP)
        return TPK_ERROR(ctx, TPK_EINVAL, "unknown readout %d", p->readout);
    if (p->conv < TPK_CNN_CONV_AUTO || p->conv > TPK_CNN_CONV_FFT)
        return TPK_ERROR(ctx, TPK_EINVAL, "unknown convolution method %d", p->conv);
    if (p->pool < TPK_CNN_POOL_AUTO || p->pool > TPK_CNN_POOL_BLOCK)
        return TPK_ERROR(ctx, TPK_EINVAL, "unknown pooling method %d", p->pool);
    if (p->compute != TPK_CNN_F64 && p->compute != TPK_CNN_F32)
        return TPK_ERROR(ctx, TPK_EINVAL, "unknown compute precision %d (f64 or f32)", p->compute);
    if (p->readout == TPK_CNN_LAP && p->window < 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "the LAP window must be a shift reach c >= 0 (got %d)",
                         p->window);
    /* The LAP kernel is the mean of the flatten kernel over shifted images, and pooling by shifts
     * rests on translation equivariance (theory.md §2.8): every layer must commute with circular
     * shifts, which zero padding breaks at the borders. (Every layer here has stride 1.) */
    if (p->readout == TPK_CNN_LAP && p->padding != TPK_CNN_CIRCULAR)
        return TPK_ERROR(ctx, TPK_EINVAL,
                         "local average pooling (readout lap) needs circular padding: it averages "
                         "the flatten kernel over circular shifts of an image, which equals pooling "
                         "the network only when every layer commutes with those shifts, and zero "
                         "padding does not at the borders (theory.md §2.8)");
    if (p->pool == TPK_CNN_POOL_SHIFTS &&
        (p->padding != TPK_CNN_CIRCULAR ||
         (p->readout != TPK_CNN_GAP && p->readout != TPK_CNN_LAP)))
        return TPK_ERROR(ctx, TPK_EINVAL,
                         "pooling by shifts needs the gap or lap readout and circular padding "
                         "(translation equivariance of every layer, theory.md §2.8)");
    if (p->compute == TPK_CNN_F32 && p->readout != TPK_CNN_FLATTEN)
        return TPK_ERROR(ctx, TPK_EINVAL, "float32 computation is implemented for the flatten "
                         "readout only (got readout %s)",
                         p->readout == TPK_CNN_GAP ? "gap" : p->readout == TPK_CNN_LAP ? "lap"
                                                                                       : "positions");
    return TPK_OK;
}

/* ---- first layer ----------------------------------------------------------------------------- */

/* Gram block G[p][p'] = ⟨x_a[p], x_c[p']⟩/C. */
static void gram_block(const double *xa, const double *xc, size_t Q, size_t C, double *G)
{
    const double inv = 1.0 / (double)C;
    for (size_t p = 0; p < Q; p++)
        for (size_t q = 0; q < Q; q++) {
            double s = 0;
            for (size_t ch = 0; ch < C; ch++)
                s += xa[p * C + ch] * xc[q * C + ch];
            G[p * Q + q] = s * inv;
        }
}

/* Box sum over the grid of per-position values (the position-diagonal of a block), m values
 * per position (N×N blocks for the flatten path, 1 for variances): out[p] = α Σ_t in[p+t] + β.
 * Separable through tmp. */
static void diag_box(const grid *g, size_t m, double alpha, double beta, const double *in,
                     double *out, double *tmp)
{
    const long R = (long)g->R, S = (long)g->S;
    for (long r = 0; r < R; r++)
        for (long s = 0; s < S; s++) {
            double *dst = tmp + (size_t)(r * S + s) * m;
            memset(dst, 0, m * sizeof *dst);
            for (int j = 0; j < g->kw; j++) {
                long ss = axis_pos(s, j - g->cs, S, g->circular);
                if (ss < 0)
                    continue;
                const double *src = in + (size_t)(r * S + ss) * m;
                for (size_t i = 0; i < m; i++)
                    dst[i] += src[i];
            }
        }
    for (long r = 0; r < R; r++)
        for (long s = 0; s < S; s++) {
            double *dst = out + (size_t)(r * S + s) * m;
            memset(dst, 0, m * sizeof *dst);
            for (int i = 0; i < g->kh; i++) {
                long rr = axis_pos(r, i - g->cr, R, g->circular);
                if (rr < 0)
                    continue;
                const double *src = tmp + (size_t)(rr * S + s) * m;
                for (size_t t = 0; t < m; t++)
                    dst[t] += src[t];
            }
            for (size_t t = 0; t < m; t++)
                dst[t] = alpha * dst[t] + beta;
        }
}

static int check_finite(const double *v, size_t n, int layer, tpk_ctx *ctx)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return TPK_ERROR(ctx, TPK_ENUMERIC,
                             "kernel overflowed at layer %d: the variance grows without bound for "
                             "this phi, sigma-w2 and depth", layer);
    return TPK_OK;
}

/* ---- flatten: the closed position-diagonal recursion ---------------------------------------- */

/* The NTK's factors (tpk_cnn_kernels): φ′, and each parameter's own factor (tpk_ntk_own). With
 * dphi NULL the recursions compute the NNGP alone. */
typedef struct ntkf {
    const tpk_phi *dphi;
    double u, w, b, v, ob; /* first layer, later layers, biases, readout, readout bias */
} ntkf;

/* The tangent kernel's step at a map (tpk_cnn_kernels): T = own·K + s2·K̇ ⊙ T, entrywise over n,
 * where K = V_φ(Σ), kd = V_φ′(Σ), and (own, s2) are the next layer's (or the readout's) own
 * factor and weight variance. */
static void tangent_step(size_t n, double own, double s2, const double *K, const double *kd,
                         double *T)
{
    for (size_t i = 0; i < n; i++)
        T[i] = own * K[i] + s2 * kd[i] * T[i];
}

/* ---- GAP / positions: the full recursion, one input pair at a time -------------------------- */

/* Position-diagonal variances q[(l·N + a)·Q + p] = Σ^{l+1}_{(p,a),(p,a)}, l < depth: the
 * diagonal recursion is closed (§2.8), so each input runs alone. */
static int diag_variances(const tpk_cnn_params *p, const grid *g, const double *X, size_t N,
                          const tpk_gauss_ws *ws, double *q, tpk_ctx *ctx)
{
    const size_t Q = g->Q, C = p->channels;
    const double taps = (double)p->kh * p->kw;
    double *u = tpk_malloc(ctx, 2 * Q * sizeof *u);
    if (!u)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    double *tmp = u + Q;
    int st = TPK_OK;
    for (size_t a = 0; a < N && !st; a++) {
        for (size_t pp = 0; pp < Q; pp++) {
            double s = 0;
            for (size_t ch = 0; ch < C; ch++)
                s += X[(a * Q + pp) * C + ch] * X[(a * Q + pp) * C + ch];
            u[pp] = s / (double)C;
        }
        diag_box(g, 1, p->sigma_u2 / taps, p->sigma_b2, u, q + a * Q, tmp);
        for (int l = 1; l < p->depth && !st; l++) {
            const double *prev = q + ((size_t)(l - 1) * N + a) * Q;
            for (size_t pp = 0; pp < Q && !st; pp++) {
                tpk_estimate r;
                st = tpk_gauss_expect2(p->phi, prev[pp], prev[pp], prev[pp], ws, &r, ctx);
                u[pp] = r.value;
            }
            if (!st) {
                double *cur = q + ((size_t)l * N + a) * Q;
                diag_box(g, 1, p->sigma_w2 / taps, p->sigma_b2, u, cur, tmp);
                st = check_finite(cur, Q, l + 1, ctx);
            }
        }
    }
    tpk_free(ctx, u);
    return st;
}

/* ---- flatten: the closed position-diagonal recursion, by tiles of image pairs -------------- */

/* Box sum over one plane of per-position values (grid order): out = α Σ_taps in + β, as
 * diag_box with m = 1, vectorised along the rows: each row is copied once with its padding (the
 * wrapped columns, or zeros), then the taps are plain shifted sums. out may alias in (the passes
 * go through tmp, which holds Q + S + kw values). */
#define DEFINE_PLANE_BOX(NAME, T)                                                                  \
static void NAME(const grid *g, T alpha, T beta, const T *in, T *out, T *tmp)                      \
{                                                                                                  \
    const long R = (long)g->R, S = (long)g->S, W = S + g->kw - 1;                                  \
    T *restrict pad = tmp + g->Q;                                                                  \
    for (long r = 0; r < R; r++) {                                                                 \
        const T *restrict src = in + r * S;                                                        \
        T *restrict dst = tmp + r * S;                                                             \
        for (long t = 0; t < W; t++) { /* the row itself, and its kw − 1 padding columns */        \
            if (t == g->cs && S > 0) {                                                             \
                memcpy(pad + t, src, (size_t)S * sizeof *pad);                                     \
                t += S - 1;                                                                        \
                continue;                                                                          \
            }                                                                                      \
            long ss = axis_pos(t - g->cs, 0, S, g->circular);                                      \
            pad[t] = ss >= 0 ? src[ss] : 0.0;                                                      \
        }                                                                                          \
        if (g->kw == 3) { /* the common filter in one pass */                                      \
            for (long s = 0; s < S; s++)                                                           \
                dst[s] = pad[s] + pad[s + 1] + pad[s + 2];                                         \
            continue;                                                                              \
        }                                                                                          \
        for (long s = 0; s < S; s++)                                                               \
            dst[s] = pad[s];                                                                       \
        for (int j = 1; j < g->kw; j++)                                                            \
            for (long s = 0; s < S; s++)                                                           \
                dst[s] += pad[s + j];                                                              \
    }                                                                                              \
    for (long r = 0; r < R; r++) {                                                                 \
        T *restrict dst = out + r * S;                                                             \
        if (g->kh == 3 && g->circular) { /* the common filter in one pass */                       \
            const T *restrict t0 = tmp + (r == 0 ? R - 1 : r - 1) * S, *restrict t1 = tmp + r * S, \
                                   *restrict t2 = tmp + (r + 1 == R ? 0 : r + 1) * S;              \
            for (long s = 0; s < S; s++)                                                           \
                dst[s] = alpha * (t0[s] + t1[s] + t2[s]) + beta;                                   \
            continue;                                                                              \
        }                                                                                          \
        int first = 1;                                                                             \
        for (int i = 0; i < g->kh; i++) {                                                          \
            long rr = axis_pos(r, i - g->cr, R, g->circular);                                      \
            if (rr < 0)                                                                            \
                continue;                                                                          \
            const T *restrict src = tmp + rr * S;                                                  \
            if (first)                                                                             \
                for (long s = 0; s < S; s++)                                                       \
                    dst[s] = src[s];                                                               \
            else                                                                                   \
                for (long s = 0; s < S; s++)                                                       \
                    dst[s] += src[s];                                                              \
            first = 0;                                                                             \
        }                                                                                          \
        for (long s = 0; s < S; s++)                                                               \
            dst[s] = first ? beta : alpha * dst[s] + beta;                                         \
    }                                                                                              \
}
DEFINE_PLANE_BOX(plane_box, double)
DEFINE_PLANE_BOX(plane_box_f32, float) /* kernel_flatten_f32's */

/* Which pairs of the N items a call computes, and where their values go: the lower triangle of
 * the N×N kernel (nc = 0), or a cross block (nc > 0): rows the items [nc, N), columns the items
 * [0, nc), into an (N − nc) × nc block, and with diag each row with itself (the rows' own
 * entries, as a tile of a distributed kernel needs them). The flatten paths, GAP and LAP run
 * their pairs from it alike. */
typedef struct pairset {
    size_t N, nc;
    double *diag, *diagT; /* cross: the rows' own entries, NNGP and NTK (NULL: not wanted) */
} pairset;

static size_t pairs_count(const pairset *ps)
{
    const size_t nr = ps->N - ps->nc;
    return ps->nc == 0 ? ps->N * (ps->N + 1) / 2 : nr * ps->nc + (ps->diag || ps->diagT ? nr : 0);
}

/* Pair k → (a, c): row-major over the lower triangle, or over the block then its rows' own. */
static void pairs_at(const pairset *ps, size_t k, size_t *a, size_t *c)
{
    const size_t nr = ps->N - ps->nc;
    if (ps->nc == 0) {
        tpk_lower_index(k, a, c);
    } else if (k < nr * ps->nc) {
        *a = ps->nc + k / ps->nc;
        *c = k % ps->nc;
    } else {
        *a = *c = ps->nc + (k - nr * ps->nc);
    }
}

/* The value of pair (a, c) into its places: both halves of the square kernel, the block, or the
 * rows' own entries (dg: ps->diag or ps->diagT). */
static void pairs_store(const pairset *ps, size_t a, size_t c, double v, double *K, double *dg)
{
    if (ps->nc == 0) {
        K[a * ps->N + c] = K[c * ps->N + a] = v;
    } else if (a == c) {
        if (dg)
            dg[a - ps->nc] = v;
    } else {
        K[(a - ps->nc) * ps->nc + c] = v;
    }
}

/* Image blocks of the flatten kernel: pairs of blocks are its units of work, at most this many
 * images a side (the blocks' variances, all layers, stay in the last-level cache). */
#define FLAT_BLOCK 16

/* The flatten paths' units of work: tiles of pairs of image blocks of B images (B chosen for a
 * few tiles per thread), over the triangle (row block ≥ column block, pairs c ≤ a), or over the
 * cross block's rectangle, then its row blocks' own pairs. */
typedef struct pairtiles {
    size_t B, nbr, nbc, ntiles; /* block side; row and column blocks; tiles */
} pairtiles;

static pairtiles pairs_tiles(const pairset *ps)
{
    const size_t nr = ps->nc ? ps->N - ps->nc : ps->N, ncol = ps->nc ? ps->nc : ps->N;
    const size_t want = 4 * (size_t)omp_get_max_threads();
    pairtiles pt = {FLAT_BLOCK, 0, 0, 0};
    for (;;) {
        pt.nbr = (nr + pt.B - 1) / pt.B;
        pt.nbc = (ncol + pt.B - 1) / pt.B;
        pt.ntiles = ps->nc == 0 ? pt.nbr * (pt.nbr + 1) / 2
                                : pt.nbr * pt.nbc + (ps->diag || ps->diagT ? pt.nbr : 0);
        if (pt.B == 1 || pt.ntiles >= want)
            return pt;
        pt.B /= 2;
    }
}

/* Tile t: rows [a0, a1), columns [c0, c1) of the items; *own: the tile's pairs are its rows
 * with themselves (a = c) only; else all pairs with c ≤ a (the triangle) or all (a block). */
static void pairs_tile(const pairset *ps, const pairtiles *pt, size_t t, size_t *a0, size_t *a1,
                       size_t *c0, size_t *c1, int *own)
{
    size_t rb, cb;
    *own = 0;
    if (ps->nc == 0) {
        rb = 0;
        cb = t;
        while (cb > rb) {
            cb -= rb + 1;
            rb++;
        }
    } else if (t < pt->nbr * pt->nbc) {
        rb = t / pt->nbc;
        cb = t % pt->nbc;
    } else {
        rb = cb = t - pt->nbr * pt->nbc;
        *own = 1;
    }
    const size_t r0 = ps->nc, cend = ps->nc ? ps->nc : ps->N;
    *a0 = r0 + rb * pt->B;
    *a1 = *a0 + pt->B < ps->N ? *a0 + pt->B : ps->N;
    if (*own) {
        *c0 = *a0;
        *c1 = *a1;
    } else {
        *c0 = cb * pt->B;
        *c1 = *c0 + pt->B < cend ? *c0 + pt->B : cend;
    }
}

/* The pairs of a tile in order: the next (a, c) after *a, *c (start with *c = SIZE_MAX); 0 when
 * the tile is done. */
static int pairs_next(const pairset *ps, size_t a0, size_t a1, size_t c0, size_t c1, int own,
                      size_t *a, size_t *c)
{
    if (*c == SIZE_MAX) {
        *a = a0;
        *c = own ? a0 : c0;
    } else if (own) {
        *c = ++*a;
    } else if (++*c >= c1 || (ps->nc == 0 && *c > *a)) {
        ++*a;
        *c = c0;
    }
    return *a < a1 && (own || ps->nc != 0 || *c <= *a);
}

/* The flatten kernel, pair by pair: for images (a, c), c ≤ a, the position-diagonal recursion of
 * theory §2.8 — the box sum of the pair's Grams, then per layer the map of its Q positions and
 * the next box sum — runs through all L layers on Q values in the first-level cache. The map of
 * a pair is one band of the layer's segment map over the N·Q variances, indexed image-major
 * (a·Q + p against c·Q + p, tpk_gauss_segmap_band); (a, a) is its diagonal. The tangent kernel
 * (NTK) rides beside it. The variances (each image alone: the recursion of the diagonal is
 * closed) come from the segment maps' own diagonals, so the diagonal pairs are the same numbers.
 * Before this, tiles of one image against many (position-major) paid a call per position and
 * row segment: 8 images 28×28, depth 8, NNGP and NTK took 9.5 ms there. */
typedef struct flat_ws {
    double *V, *VT, *kd, *T; /* Q values each: the pair's kernel, tangent, V_φ′; box scratch */
} flat_ws;

/* One pair (a, c) through every layer: K[a][c] and Θ[a][c] (Th NULL: the NNGP alone). */
static void flat_pair(const tpk_cnn_params *p, const grid *g, const double *X, const pairset *ps,
                      const ntkf *nk, tpk_gauss_segmap *const *sm, size_t a, size_t c,
                      flat_ws *w, double *maxr, double *K, double *Th)
{
    const size_t Q = g->Q, C = p->channels, L = (size_t)p->depth;
    const double taps = (double)p->kh * p->kw;
    const int ntk = nk->dphi != NULL;
    const double *xa = X + a * Q * C, *xc = X + c * Q * C;
    for (size_t pp = 0; pp < Q; pp++) { /* the Gram ⟨x_a[p], x_c[p]⟩/C */
        double acc = 0;
        for (size_t ch = 0; ch < C; ch++)
            acc += xa[pp * C + ch] * xc[pp * C + ch];
        w->V[pp] = acc / (double)C;
    }
    if (ntk)
        plane_box(g, nk->u / taps, nk->b, w->V, w->VT, w->T);
    plane_box(g, p->sigma_u2 / taps, p->sigma_b2, w->V, w->V, w->T);
    for (size_t l = 0; l < L; l++) {
        const int last = l + 1 == L;
        if (ntk) /* V_φ′ before V_φ replaces the covariances */
            tpk_gauss_segmap_band(sm[L + l], a * Q, c * Q, Q, w->V, w->kd, &maxr[2 * (L + l)],
                                  &maxr[2 * (L + l) + 1]);
        tpk_gauss_segmap_band(sm[l], a * Q, c * Q, Q, w->V, w->V, &maxr[2 * l], &maxr[2 * l + 1]);
        if (ntk)
            tangent_step(Q, last ? nk->v : nk->w, last ? p->sigma_v2 : p->sigma_w2, w->V, w->kd,
                         w->VT);
        if (!last) {
            plane_box(g, p->sigma_w2 / taps, p->sigma_b2, w->V, w->V, w->T);
            if (ntk)
                plane_box(g, 1.0 / taps, nk->b, w->VT, w->VT, w->T);
        }
    }
    double sk = 0, stt = 0; /* the readout's mean over positions */
    for (size_t pp = 0; pp < Q; pp++) {
        sk += w->V[pp];
        stt += ntk ? w->VT[pp] : 0.0;
    }
    pairs_store(ps, a, c, p->sigma_v2 * sk / (double)Q + p->sigma_ob2, K, ps->diag);
    if (ntk)
        pairs_store(ps, a, c, stt / (double)Q + nk->ob, Th, ps->diagT);
}

static int kernel_flatten(const tpk_cnn_params *p, const grid *g, const double *X,
                          const pairset *ps, const tpk_gauss_ws *ws, const ntkf *nk, double *K,
                          double *Th, double *err, tpk_ctx *ctx)
{
    const size_t Q = g->Q, C = p->channels, L = (size_t)p->depth, N = ps->N;
    const double taps = (double)p->kh * p->kw;
    const int ntk = nk->dphi != NULL;
    const size_t tmpn = Q + g->S + (size_t)p->kw; /* plane_box's scratch */
    double *qv = tpk_malloc(ctx, (2 * N * Q + tmpn) * sizeof *qv);
    const size_t nmaps = ntk ? 2 * L : L;
    tpk_gauss_segmap **sm = tpk_calloc(ctx, nmaps, sizeof *sm);
    int st = !qv || !sm ? TPK_ERROR(ctx, TPK_ENOMEM, "out of memory") : TPK_OK;
    if (!st) { /* per layer the variances, the segment maps over them, the next variances */
        double *u = qv + N * Q, *tmp = qv + 2 * N * Q;
        for (size_t a = 0; a < N; a++) {
            for (size_t pp = 0; pp < Q; pp++) {
                const double *x = X + (a * Q + pp) * C;
                double s = 0;
                for (size_t ch = 0; ch < C; ch++)
                    s += x[ch] * x[ch];
                u[a * Q + pp] = s / (double)C;
            }
            plane_box(g, p->sigma_u2 / taps, p->sigma_b2, u + a * Q, qv + a * Q, tmp);
        }
        for (size_t l = 0; !st && l < L; l++) {
            st = check_finite(qv, N * Q, (int)l + 1, ctx);
            for (size_t k = l; !st && k < nmaps; k += L)
                if (!(sm[k] = tpk_gauss_segmap_alloc(k < L ? p->phi : nk->dphi, qv, N * Q, ws, ctx)))
                    st = ctx->status ? ctx->status : TPK_ENOMEM;
            if (!st && l + 1 < L && !(st = tpk_gauss_segmap_diagonal(sm[l], u, ctx)))
                for (size_t a = 0; a < N; a++)
                    plane_box(g, p->sigma_w2 / taps, p->sigma_b2, u + a * Q, qv + a * Q, tmp);
        }
    }
    const pairtiles pt = pairs_tiles(ps);
    const size_t ntiles = pt.ntiles;
    int failed = st;
#pragma omp parallel if (ntiles > 1 && !st)
    {
        flat_ws w = {0};
        tpk_ctx lctx; /* this thread's: the caller's allocator, its own message */
        tpk_ctx_init_from(&lctx, ctx);
        double *buf = tpk_malloc(&lctx, (3 * Q + tmpn) * sizeof *buf);
        double *maxr = tpk_calloc(&lctx, 2 * nmaps, sizeof *maxr);
        int lst = buf && maxr ? TPK_OK : TPK_ENOMEM;
        if (buf) {
            w.V = buf;
            w.VT = buf + Q;
            w.kd = buf + 2 * Q;
            w.T = buf + 3 * Q;
        }
#pragma omp for schedule(dynamic, 1)
        for (size_t t = 0; t < ntiles; t++) {
            if (lst || failed)
                continue;
            size_t a0, a1, c0, c1, a, c = SIZE_MAX;
            int own;
            pairs_tile(ps, &pt, t, &a0, &a1, &c0, &c1, &own);
            while (pairs_next(ps, a0, a1, c0, c1, own, &a, &c))
                flat_pair(p, g, X, ps, nk, sm, a, c, &w, maxr, K, Th);
        }
        for (size_t k = 0; sm && maxr && k < nmaps; k++)
            if (sm[k])
                tpk_gauss_segmap_merge(sm[k], maxr[2 * k], maxr[2 * k + 1]);
        if (lst) {
#pragma omp atomic write
            failed = lst;
        }
        tpk_free(&lctx, buf);
        tpk_free(&lctx, maxr);
    }
    if (!st && failed)
        st = TPK_ERROR(ctx, failed, "out of memory (flatten pairs of %zu positions)", Q);
    double e = 0;
    for (size_t k = 0; k < nmaps && sm; k++) {
        double el = 0;
        if (!sm[k])
            continue;
        if (!st)
            st = tpk_gauss_segmap_finish(sm[k], &el, ctx);
        if (k < L) /* K's bound, as the block recursion accumulates it */
            e = k + 1 < L ? p->sigma_w2 * (e + el) : e + el;
        tpk_gauss_segmap_free(sm[k]);
    }
    if (!st && err)
        *err = p->sigma_v2 * e;
    tpk_free(ctx, qv);
    tpk_free(ctx, sm);
    return st;
}

/* ---- flatten in float32 ---------------------------------------------------------------------- */

/* asin in float on [−1, 1], branch-free so that the map's loop vectorises: Cephes' asinf (a
 * degree-4 polynomial in z = x² on |x| ≤ 1/2; above, asin x = π/2 − 2 asin √((1 − |x|)/2));
 * peak relative error 2.5e-7 (Cephes' documentation) ≈ 4 float ulps. */
static inline float asin_f32(float x)
{
    const float a = fabsf(x);
    const int big = a > 0.5f;
    const float z = big ? 0.5f * (1.0f - a) : a * a;
    const float t = big ? sqrtf(z) : a;
    const float pz = (((4.2163199048e-2f * z + 2.4181311049e-2f) * z + 4.5470025998e-2f) * z +
                      7.4953002686e-2f) * z + 1.6666752422e-1f;
    float r = pz * z * t + t;
    r = big ? 1.57079632679489662f - 2.0f * r : r;
    return copysignf(r, x);
}

/* The float maps: the ABReLU family √(q_a q_c)[c0 √(1−ρ²) + (c1 + c0 asin ρ)ρ], erf(b·)
 * (2/π) asin(k a_a a_c), a = √(2b²)/√(1 + 2b²q), and the identity; any other φ is mapped in
 * double from the float values (F32_WIDE). */
enum { F32_ABRELU, F32_ERF, F32_IDENTITY, F32_WIDE };

/* |k| may exceed √(q_a q_c) by the float rounding of k (a storage rounding and the kh + kw − 2
 * adds of the tap sums, relative to √(q_a q_c) by Cauchy–Schwarz) and of the scales: up to
 * F32_PSD_ULPS float epsilons before the entry is refused as not PSD; within it ρ is clamped. */
#define F32_PSD_ULPS 64.0
/* Rounding of one float map evaluation (asin_f32's 4 ulps, the square root, ~8 products), in
 * units of the float epsilon times the map's scale (gauss_map.c's vector bound uses 16 too). */
#define F32_MAP_ULPS 16.0

/* A band of one pair's positions in place: v[p] ↦ the closed-form float map of the covariance
 * v[p] between images a and c at p, whose √q and 1/√q (erf: its a) are sqa/raa and sqc/rac at
 * p. Returns n, or (v unchanged) the first p whose entry is not PSD within F32_PSD_ULPS. */
static size_t map_band_f32(int mode, float c0, float c1, const float *restrict sqa,
                           const float *restrict raa, const float *restrict sqc,
                           const float *restrict rac, float *restrict v, size_t n)
{
    const float lim = 1.0f + (float)(F32_PSD_ULPS * FLT_EPSILON);
    if (mode == F32_IDENTITY)
        return n;
    int bad = 0;
    for (size_t t = 0; t < n; t++) /* a check pass first: the map overwrites v */
        bad |= !(fabsf(v[t] * raa[t] * rac[t]) <= lim);
    for (size_t t = 0; bad && t < n; t++)
        if (!(fabsf(v[t] * raa[t] * rac[t]) <= lim))
            return t;
    if (mode == F32_ERF) { /* one loop per map, so that each vectorises */
        for (size_t t = 0; t < n; t++) {
            float x = v[t] * raa[t] * rac[t];
            x = x > 1.0f ? 1.0f : x < -1.0f ? -1.0f : x;
            v[t] = c1 * asin_f32(x);
        }
        return n;
    }
    for (size_t t = 0; t < n; t++) {
        float x = v[t] * raa[t] * rac[t];
        x = x > 1.0f ? 1.0f : x < -1.0f ? -1.0f : x;
        const float w = sqrtf((1.0f - x) * (1.0f + x));
        v[t] = sqa[t] * sqc[t] * (c0 * w + (c1 + c0 * asin_f32(x)) * x);
    }
    return n;
}

/* The first failing (layer, position) of the float path, lexicographically (threads race). */
typedef struct f32_fail {
    int any;
    size_t l, pos;
} f32_fail;

static void f32_record(f32_fail *f, size_t l, size_t pos)
{
#pragma omp critical(tpk_cnn_f32_fail)
    if (!f->any || l < f->l || (l == f->l && pos < f->pos)) {
        f->l = l;
        f->pos = pos;
#pragma omp atomic write
        f->any = 1;
    }
}

/* The flatten recursion of kernel_flatten in float, pair by pair as there: each pair's Q
 * covariances box-summed and mapped in float through every layer; the per-image variances q
 * (diag_variances), their scales and the diagonal entries V_φ(q) in double, once per image,
 * position and layer (the diagonal pairs are those double values); the channel sums of the first
 * layer and the readout's sum over positions accumulate in double. φ without a float closed form
 * (F32_WIDE) is mapped in double from the float values, clamped to the variances (the layer's
 * segment map, as kernel_flatten's). Error analysis: theory.md §2.8. Before, the path kept Q
 * blocks of N×N floats and took 1.5 s for 200 images at depth 8, 4.5× the double path. */
static int kernel_flatten_f32(const tpk_cnn_params *p, const grid *g, const double *X,
                              const pairset *ps, const tpk_gauss_ws *ws, double *K, double *err,
                              tpk_ctx *ctx)
{
    const size_t Q = g->Q, C = p->channels, L = (size_t)p->depth, N = ps->N, NQ = N * Q;
    const double taps = (double)p->kh * p->kw, u = FLT_EPSILON / 2;
    const tpk_phi *phi = p->phi;
    const int mode = phi->kind == GK_ABRELU ? F32_ABRELU : phi->kind == GK_ERF ? F32_ERF
                     : phi->kind == GK_IDENTITY ? F32_IDENTITY : F32_WIDE;
    float c0 = 0, c1 = 0;
    double b2 = 0;
    if (mode == F32_ABRELU) {
        c0 = (float)((phi->ca - phi->cb) * (phi->ca - phi->cb) / (2 * M_PI));
        c1 = (float)(0.25 * (phi->ca + phi->cb) * (phi->ca + phi->cb));
    } else if (mode == F32_ERF) {
        b2 = phi->cb * phi->cb;
        c1 = (float)(2 / M_PI);
    }
    /* per layer l, image a, position p at l·NQ + a·Q + p: variance, diagonal value, √q, scale */
    double *q = tpk_malloc(ctx, 2 * L * NQ * sizeof *q), *dv = q ? q + L * NQ : NULL;
    float *sqf = tpk_malloc(ctx, 2 * L * NQ * sizeof *sqf), *raf = sqf ? sqf + L * NQ : NULL;
    double *el = tpk_calloc(ctx, 2 * L, sizeof *el), *rnd = el ? el + L : NULL; /* per layer: the
                                                        * maps' error, the float rounding's */
    tpk_gauss_segmap **sm = mode == F32_WIDE ? tpk_calloc(ctx, L, sizeof *sm) : NULL;
    int st = TPK_OK;
    if (!q || !sqf || !el || (mode == F32_WIDE && !sm)) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (%zu positions x %zu inputs, float)", Q, N);
        goto done;
    }
    if ((st = diag_variances(p, g, X, N, ws, q, ctx)))
        goto done;
    for (size_t l = 0; l < L && !st; l++) {
        /* the images' scales and diagonal values in double, and this layer's float rounding
         * (theory.md §2.8): the covariances' relative rounding (storage, tap sums, scales:
         * kh + kw + 4 roundings of √(q_a q_c)) through the map's slope in ρ, G, plus the map's
         * own rounding */
        double qmax = 0, vmax = 0, rmax = 0, e = 0;
        for (size_t i = l * NQ; i < (l + 1) * NQ && !st; i++) {
            const double v = q[i];
            tpk_estimate r;
            st = tpk_gauss_expect2(phi, v, v, v, ws, &r, ctx);
            dv[i] = r.value;
            qmax = fmax(qmax, v);
            vmax = fmax(vmax, fabs(r.value));
            e = fmax(e, r.err);
            sqf[i] = (float)sqrt(v);
            raf[i] = mode == F32_ERF ? (float)(sqrt(2 * b2) / sqrt(1 + 2 * b2 * v))
                                     : v > 0 ? (float)(1 / sqrt(v)) : 0.0f;
            if (mode == F32_ERF)
                rmax = fmax(rmax, 2 * b2 * v / (1 + 2 * b2 * v));
        }
        if (!st && mode == F32_WIDE && !(sm[l] = tpk_gauss_segmap_alloc(phi, q + l * NQ, NQ, ws, ctx)))
            st = ctx->status ? ctx->status : TPK_ENOMEM;
        double G = qmax, vs = qmax;
        if (mode == F32_ABRELU) {
            G = qmax * ((double)c1 + (double)c0 * M_PI);
            vs = qmax * ((double)c0 * (1 + M_PI / 2) + (double)c1);
        } else if (mode == F32_ERF) {
            G = (2 / M_PI) / sqrt(fmax(1 - rmax * rmax, DBL_MIN));
            vs = 1;
        } else if (mode == F32_WIDE) {
            vs = vmax;
        }
        el[l] = e;
        rnd[l] = u * ((double)(p->kh + p->kw + 4) * G + F32_MAP_ULPS * vs);
    }
    if (st)
        goto done;
    const pairtiles pt = pairs_tiles(ps); /* as kernel_flatten's */
    const size_t ntiles = pt.ntiles, tmpn = Q + g->S + (size_t)p->kw;
    const float tol = 1 + (float)(F32_PSD_ULPS * FLT_EPSILON);
    f32_fail fail = {0};
    int oom = 0;
#pragma omp parallel if (ntiles > 1)
    {
        tpk_ctx lctx;
        tpk_ctx_init_from(&lctx, ctx);
        float *V = tpk_malloc(&lctx, (Q + tmpn) * sizeof *V), *T = V ? V + Q : NULL;
        double *W = mode == F32_WIDE ? tpk_malloc(&lctx, Q * sizeof *W) : NULL;
        double *acc = mode == F32_WIDE ? tpk_calloc(&lctx, 2 * L, sizeof *acc) : NULL;
        if (!V || (mode == F32_WIDE && (!W || !acc))) {
#pragma omp atomic write
            oom = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (size_t t = 0; t < ntiles; t++) {
            int stop, failed;
#pragma omp atomic read
            stop = oom;
#pragma omp atomic read
            failed = fail.any;
            if (stop || failed)
                continue;
            size_t a0, a1, b0, b1, a, c = SIZE_MAX;
            int own;
            pairs_tile(ps, &pt, t, &a0, &a1, &b0, &b1, &own);
            while (pairs_next(ps, a0, a1, b0, b1, own, &a, &c)) {
                if (a == c) /* the diagonal pairs: the double values, below */
                    continue;
                {
                    const double *xa = X + a * Q * C, *xc = X + c * Q * C;
                    for (size_t pos = 0; pos < Q; pos++) { /* channel sums in double */
                        double s = 0;
                        for (size_t ch = 0; ch < C; ch++)
                            s += xa[pos * C + ch] * xc[pos * C + ch];
                        V[pos] = (float)(s / (double)C);
                    }
                    plane_box_f32(g, (float)(p->sigma_u2 / taps), (float)p->sigma_b2, V, V, T);
                    for (size_t l = 0; l < L; l++) {
                        const size_t ia = l * NQ + a * Q, ic = l * NQ + c * Q;
                        if (mode != F32_WIDE) {
                            size_t at = map_band_f32(mode, c0, c1, sqf + ia, raf + ia, sqf + ic,
                                                     raf + ic, V, Q);
                            if (at < Q)
                                f32_record(&fail, l, at);
                        } else { /* the double map on the float values, clamped as ρ is */
                            int bad = 0;
                            for (size_t pos = 0; pos < Q; pos++) {
                                const double k = V[pos], lim = (double)sqf[ia + pos] * sqf[ic + pos];
                                bad |= !(fabs(k) <= (double)tol * lim);
                                W[pos] = fmax(-lim, fmin(lim, k));
                            }
                            if (bad)
                                for (size_t pos = 0; pos < Q; pos++)
                                    if (!(fabs((double)V[pos]) <=
                                          (double)tol * sqf[ia + pos] * sqf[ic + pos])) {
                                        f32_record(&fail, l, pos);
                                        break;
                                    }
                            tpk_gauss_segmap_band(sm[l], a * Q, c * Q, Q, W, W, &acc[2 * l],
                                                  &acc[2 * l + 1]);
                            for (size_t pos = 0; pos < Q; pos++)
                                V[pos] = (float)W[pos];
                        }
                        if (l + 1 < L)
                            plane_box_f32(g, (float)(p->sigma_w2 / taps), (float)p->sigma_b2, V,
                                          V, T);
                    }
                    double s = 0; /* the readout's sum over positions in double */
                    for (size_t pos = 0; pos < Q; pos++)
                        s += (double)V[pos];
                    pairs_store(ps, a, c, p->sigma_v2 * s / (double)Q + p->sigma_ob2, K, NULL);
                }
            }
        }
        for (size_t l = 0; sm && acc && l < L; l++)
            tpk_gauss_segmap_merge(sm[l], acc[2 * l], acc[2 * l + 1]);
        tpk_free(&lctx, V);
        tpk_free(&lctx, W);
        tpk_free(&lctx, acc);
    }
    if (oom) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (flatten pairs of %zu positions, float)", Q);
        goto done;
    }
    if (fail.any) {
        st = TPK_ERROR(ctx, TPK_EDOM, "layer %zu, position %zu: a covariance exceeds its "
                       "variances beyond float rounding (not PSD)", fail.l + 1, fail.pos);
        goto done;
    }
    for (size_t l = 0; sm && l < L && !st; l++) { /* the double maps' own failures and bounds */
        double ew = 0;
        st = tpk_gauss_segmap_finish(sm[l], &ew, ctx);
        el[l] = fmax(el[l], ew);
    }
    if (st)
        goto done;
    for (size_t a = ps->nc; a < N && (ps->nc == 0 || ps->diag); a++) { /* the diagonal pairs */
        double s = 0;
        for (size_t pos = 0; pos < Q; pos++)
            s += dv[(L - 1) * NQ + a * Q + pos];
        pairs_store(ps, a, a, p->sigma_v2 * s / (double)Q + p->sigma_ob2, K, ps->diag);
    }
    double e = 0;
    for (size_t l = 0; l < L; l++)
        e = l + 1 < L ? p->sigma_w2 * (e + el[l] + rnd[l]) : e + el[l] + rnd[l];
    if (err)
        *err = p->sigma_v2 * e;
done:
    for (size_t l = 0; sm && l < L; l++)
        tpk_gauss_segmap_free(sm[l]);
    tpk_free(ctx, sm);
    tpk_free(ctx, q);
    tpk_free(ctx, sqf);
    tpk_free(ctx, el);
    return st;
}

/* ---- the direct path: one streaming pass per layer, plane by plane --------------------------- */

/* A block (p, p') is stored row-major over p = (r, s) and p' = (r2, s2); "plane r" is the S×Q
 * slab of rows p = r·S .. r·S + S − 1 (176 KB for 28×28). The separable tap sum
 *   out[(r,s),(r2,s2)] = α Σ_{i,j} K[(r+d_i, s+d_j), (r2+d_i, s2+d_j)] + β
 * is a column pass inside each plane, T[(r,s),·] = Σ_j K[(r, s+d_j), · shifted by d_j], and a
 * row pass over the planes, out[(r,s),·] = α Σ_i T[(r+d_i, s), · shifted by d_i·S] + β.
 * Both shifts act on a whole Q-row: the row pass shifts by d_i·S (cyclically mod Q for circular
 * padding, since (r2 + d) mod R · S + s2 = (x + d·S) mod Q), the column pass by d_j except at
 * the kw − 1 columns per grid row where s2 + d_j leaves [0, S), which are recomputed.
 * So one layer reads Σ once, maps a plane (tpk_gauss_map_cross, the same map as the block
 * path), sums its column taps into T while the plane is in L2, and writes an output plane as
 * soon as its kh T-planes exist: one read and one write of the Q×Q block per layer instead of
 * a map pass plus two tap passes. The first layer's Σ¹ plane comes straight from the image
 * patches: Σ¹ = α/C · P_a P_cᵀ + β with P_x[p] = (x[p+t, ch])_{t,ch} (zero off the grid for
 * zero padding), the tap sum of the Gram block ⟨x_a[p], x_c[p']⟩/C written as one product. */

typedef struct dws {
    double *A, *B;       /* Q×Q Σ blocks (ping-pong) */
    double *T;           /* column-tap sums of the live planes: 2kh − 1 S×Q slots (tslot) */
    double *P;           /* S×Q: Σ, then K, of one plane */
    double *acc;         /* Q */
    double *pa, *pct;    /* patches of the pair: Q×m (image a) and m×Q (image c), m = kh·kw·C */
    long *cmap;          /* kw×S: axis_pos(s2, d_j) */
    unsigned char *done; /* R flags: T-plane computed this layer */
    /* zero-variance positions (compaction, see map_plane) */
    double *cb;          /* S×Q compacted plane */
    double *qr, *qcz;    /* compacted row variances (S) and column variances (Q) */
    long *runs;          /* [start, end) runs of non-zero-variance columns, 2Q */
    long *zc;            /* zero-variance columns, Q */
    size_t nruns, nzc, nz; /* runs, non-zero columns, zero columns of this layer */
    size_t C;             /* the patches' channels */
    double falpha, fbeta; /* the first layer from the patches: α/C · P_a P_cᵀ + β */
    tpk_allocator al;
} dws;

static void dws_free(dws *w)
{
    tpk_mem_free(&w->al, w->A);
    tpk_mem_free(&w->al, w->B);
    tpk_mem_free(&w->al, w->T);
    tpk_mem_free(&w->al, w->P);
    tpk_mem_free(&w->al, w->acc);
    tpk_mem_free(&w->al, w->pa);
    tpk_mem_free(&w->al, w->pct);
    tpk_mem_free(&w->al, w->cmap);
    tpk_mem_free(&w->al, w->done);
    tpk_mem_free(&w->al, w->cb);
    tpk_mem_free(&w->al, w->qr);
    tpk_mem_free(&w->al, w->qcz);
    tpk_mem_free(&w->al, w->runs);
    tpk_mem_free(&w->al, w->zc);
    memset(w, 0, sizeof *w); /* idempotent */
}

static int dws_alloc(dws *w, const grid *g, size_t C, tpk_ctx *ctx)
{
    memset(w, 0, sizeof *w);
    w->al = tpk_ctx_allocator(ctx);
    const size_t Q = g->Q, m = (size_t)g->kh * (size_t)g->kw * C;
    w->A = tpk_malloc(ctx, Q * Q * sizeof *w->A);
    w->B = tpk_malloc(ctx, Q * Q * sizeof *w->B);
    w->T = tpk_calloc(ctx, (2 * (size_t)g->kh - 1) * g->S * Q, sizeof *w->T); /* see col_taps */
    w->P = tpk_malloc(ctx, g->S * Q * sizeof *w->P);
    w->acc = tpk_malloc(ctx, Q * sizeof *w->acc);
    w->pa = tpk_malloc(ctx, Q * m * sizeof *w->pa);
    w->pct = tpk_malloc(ctx, Q * m * sizeof *w->pct);
    w->cmap = tpk_malloc(ctx, (size_t)g->kw * g->S * sizeof *w->cmap);
    w->done = tpk_malloc(ctx, g->R);
    w->cb = tpk_malloc(ctx, g->S * Q * sizeof *w->cb);
    w->qr = tpk_malloc(ctx, g->S * sizeof *w->qr);
    w->qcz = tpk_malloc(ctx, Q * sizeof *w->qcz);
    w->runs = tpk_malloc(ctx, 2 * Q * sizeof *w->runs);
    w->zc = tpk_malloc(ctx, Q * sizeof *w->zc);
    if (!w->A || !w->B || !w->T || !w->P || !w->acc || !w->pa || !w->pct || !w->cmap || !w->done ||
        !w->cb || !w->qr || !w->qcz || !w->runs || !w->zc) {
        dws_free(w);
        return TPK_ENOMEM;
    }
    for (int j = 0; j < g->kw; j++)
        for (size_t s = 0; s < g->S; s++)
            w->cmap[(size_t)j * g->S + s] = axis_pos((long)s, j - g->cs, (long)g->S, g->circular);
    return TPK_OK;
}

/* Patches of the pair: pa[p·m + t·C + ch] = x_a[p+t, ch], pct[(t·C + ch)·Q + p] = x_c[p+t, ch],
 * taps t = (i, j) row-major, 0 off the grid (zero padding). */
static void patches(const grid *g, size_t C, const double *xa, const double *xc, dws *w)
{
    const size_t Q = g->Q, m = (size_t)g->kh * (size_t)g->kw * C;
    for (long r = 0; r < (long)g->R; r++)
        for (long s = 0; s < (long)g->S; s++) {
            const size_t p = (size_t)r * g->S + (size_t)s;
            for (int i = 0; i < g->kh; i++)
                for (int j = 0; j < g->kw; j++) {
                    long rr = axis_pos(r, i - g->cr, (long)g->R, g->circular);
                    long ss = axis_pos(s, j - g->cs, (long)g->S, g->circular);
                    size_t t = ((size_t)i * (size_t)g->kw + (size_t)j) * C;
                    for (size_t ch = 0; ch < C; ch++) {
                        int in = rr >= 0 && ss >= 0;
                        size_t src = in ? ((size_t)rr * g->S + (size_t)ss) * C + ch : 0;
                        w->pa[p * m + t + ch] = in ? xa[src] : 0.0;
                        w->pct[(t + ch) * Q + p] = in ? xc[src] : 0.0;
                    }
                }
        }
}

/* Σ¹ rows r·S .. r·S + S − 1 into w->P: α/C · P_a P_cᵀ + β. */
static void first_plane(const grid *g, size_t C, double alpha, double beta, size_t r, dws *w)
{
    const size_t Q = g->Q, S = g->S, m = (size_t)g->kh * (size_t)g->kw * C;
    const double sc = alpha / (double)C;
    for (size_t s = 0; s < S; s++) {
        const double *pa = w->pa + (r * S + s) * m;
        double *restrict acc = w->acc, *restrict dst = w->P + s * Q;
        memset(acc, 0, Q * sizeof *acc);
        for (size_t t = 0; t < m; t++) {
            const double v = pa[t], *restrict src = w->pct + t * Q;
            if (v != 0.0)
                for (size_t x = 0; x < Q; x++)
                    acc[x] += v * src[x];
        }
        for (size_t x = 0; x < Q; x++)
            dst[x] = sc * acc[x] + beta;
    }
}

/* Slot of T-plane pr: the planes that circular padding needs both first and last (pr ≥ R − cr,
 * pr < kh − 1 − cr) keep slots kh .. 2kh − 2; the others live in a ring of kh slots, pr mod kh.
 * Output plane r reads planes r − cr .. r + kh − 1 − cr; a ring plane is computed for the first
 * of its readers and last read cr + (kh − 1 − cr) = kh − 1 planes later, before the plane kh on
 * (computed for reader pr + cr + 1) takes its slot. So the live T stays in L2 (5 planes, 880 KB
 * for 3×3 on 28×28) instead of a Q×Q block that would be written to and read from memory. */
static double *tslot(const grid *g, double *T, size_t pr)
{
    const size_t R = g->R, kh = (size_t)g->kh, cr = (size_t)g->cr, n = g->S * g->Q;
    size_t slot = pr % kh;
    if (g->circular && pr >= R - cr)
        slot = kh + (pr - (R - cr));
    else if (g->circular && pr + 1 + cr < kh)
        slot = kh + cr + pr;
    return T + slot * n;
}

/* Column taps of the mapped plane w->P into T-plane r: T[(r,s), (r2,s2)] = Σ_j P[s+d_j][(r2, s2+d_j)],
 * j ascending; a whole-row shifted add, then the boundary columns (s2 + d_j off [0, S) for some
 * j) recomputed with their wrapped or dropped neighbours, in the same order. */
static void col_taps(const grid *g, dws *w, size_t r)
{
    const size_t Q = g->Q, S = g->S, R = g->R;
    const long rt = (long)g->kw - 1 - g->cs; /* largest right shift */
    for (size_t s = 0; s < S; s++) {
        double *restrict dst = tslot(g, w->T, r) + s * Q;
        int first = 1; /* the first tap assigns: what it leaves out is boundary, rewritten below */
        for (int j = 0; j < g->kw; j++) {
            const long d = j - g->cs, ss = w->cmap[(size_t)j * S + s];
            if (ss < 0)
                continue;
            const double *restrict src = w->P + (size_t)ss * Q;
            const long lo = d < 0 ? -d : 0, hi = d > 0 ? (long)Q - d : (long)Q;
            if (first)
                for (long x = lo; x < hi; x++)
                    dst[x] = src[x + d];
            else
                for (long x = lo; x < hi; x++)
                    dst[x] += src[x + d];
            first = 0;
        }
        for (size_t r2 = 0; r2 < R; r2++)
            for (long s2 = 0; s2 < (long)S; s2++) {
                if (s2 >= g->cs && s2 + rt < (long)S) {
                    s2 = (long)S - rt - 1; /* skip the interior */
                    continue;
                }
                double v = 0;
                for (int j = 0; j < g->kw; j++) {
                    const long ss = w->cmap[(size_t)j * S + s], s2j = w->cmap[(size_t)j * S + (size_t)s2];
                    if (ss >= 0 && s2j >= 0)
                        v += w->P[(size_t)ss * Q + r2 * S + (size_t)s2j];
                }
                dst[r2 * S + (size_t)s2] = v;
            }
    }
}

/* Column structure of image c at one layer: runs of positions with variance > 0, the compacted
 * variances, and the zero-variance positions. */
static void col_runs(size_t Q, const double *qc, dws *w)
{
    w->nruns = w->nzc = w->nz = 0;
    for (size_t j = 0; j < Q; j++) {
        if (qc[j] == 0) {
            w->zc[w->nz++] = (long)j;
            continue;
        }
        if (j == 0 || qc[j - 1] == 0)
            w->runs[2 * w->nruns++] = (long)j;
        w->runs[2 * w->nruns - 1] = (long)j + 1;
        w->qcz[w->nzc++] = qc[j];
    }
}

/* Map plane r of Σ^{l} (from `in`, or from the patches when in == NULL) into w->P.
 * Positions of zero variance (Fashion-MNIST's black borders with σ_b² = 0: a quarter of the
 * grid at the first layer) are the constant 0; their entries are E[φ(0)φ(v)] = φ(0)·E φ(v),
 * precomputed per image and layer in zv (the value tpk_gauss_map_cross's per-entry fix-up
 * computes, there at the cost of a scalar expectation per entry of each such row and column).
 * So the map runs on the compacted block of non-zero rows and columns, and those entries are
 * filled from zv_a (zero columns) and zv_c (zero rows). */
static int map_plane(const tpk_cnn_params *p, const grid *g, dws *w, const double *in, size_t r,
                     const double *qa, const double *qc, const double *zva, const double *zvc,
                     double zerr, const tpk_gauss_ws *ws, double *el, tpk_ctx *ctx)
{
    const size_t Q = g->Q, S = g->S;
    const double *src = w->P;
    if (in)
        src = in + r * S * Q;
    else
        first_plane(g, w->C, w->falpha, w->fbeta, r, w);
    qa += r * S;
    zva += r * S;
    size_t nzr = 0;
    for (size_t i = 0; i < S; i++)
        if (qa[i] != 0)
            w->qr[nzr++] = qa[i];
    double e = 0;
    int st = TPK_OK;
    if (nzr == S && w->nz == 0) {
        st = tpk_gauss_map_cross(p->phi, qa, S, qc, Q, src, w->P, ws, &e, ctx);
        *el = fmax(*el, e);
        return st;
    }
    /* compact, map, expand */
    const size_t nc = w->nzc;
    size_t k = 0;
    for (size_t i = 0; i < S; i++) {
        if (qa[i] == 0)
            continue;
        double *dst = w->cb + k++ * nc;
        for (size_t u = 0; u < w->nruns; u++) {
            const long j0 = w->runs[2 * u], j1 = w->runs[2 * u + 1];
            memcpy(dst, src + i * Q + (size_t)j0, (size_t)(j1 - j0) * sizeof *dst);
            dst += j1 - j0;
        }
    }
    if (nzr > 0 && nc > 0)
        st = tpk_gauss_map_cross(p->phi, w->qr, nzr, w->qcz, nc, w->cb, w->cb, ws, &e, ctx);
    if (st)
        return st;
    k = nzr;
    for (size_t i = S; i-- > 0;) {
        double *row = w->P + i * Q;
        if (qa[i] == 0) {
            memcpy(row, zvc, Q * sizeof *row);
            continue;
        }
        const double *cs = w->cb + --k * nc;
        for (size_t u = 0; u < w->nruns; u++) {
            const long j0 = w->runs[2 * u], j1 = w->runs[2 * u + 1];
            memcpy(row + j0, cs, (size_t)(j1 - j0) * sizeof *row);
            cs += j1 - j0;
        }
        for (size_t z = 0; z < w->nz; z++)
            row[w->zc[z]] = zva[i];
    }
    *el = fmax(*el, fmax(e, zerr));
    return TPK_OK;
}

/* One inner layer: out = α·taps(V_φ(Σ)) + β, Σ from `in` (NULL: the first layer's patches). */
static int layer_direct(const tpk_cnn_params *p, const grid *g, dws *w, const double *in,
                        const double *qa, const double *qc, const double *zva, const double *zvc,
                        double zerr, double alpha, double beta, double *out,
                        const tpk_gauss_ws *ws, double *el, tpk_ctx *ctx)
{
    const size_t Q = g->Q, S = g->S, R = g->R;
    memset(w->done, 0, R);
    col_runs(Q, qc, w);
    for (size_t r = 0; r < R; r++) {
        for (int i = 0; i < g->kh; i++) {
            long pr = axis_pos((long)r, i - g->cr, (long)R, g->circular);
            if (pr < 0 || w->done[pr])
                continue;
            int st = map_plane(p, g, w, in, (size_t)pr, qa, qc, zva, zvc, zerr, ws, el, ctx);
            if (st)
                return st;
            col_taps(g, w, (size_t)pr);
            w->done[pr] = 1;
        }
        for (size_t s = 0; s < S; s++) {
            double *restrict acc = w->acc, *restrict dst = out + (r * S + s) * Q;
            if (!g->circular) /* circular: the first tap covers every entry and assigns */
                memset(acc, 0, Q * sizeof *acc);
            for (int i = 0; i < g->kh; i++) {
                const long d = i - g->cr, pr = axis_pos((long)r, d, (long)R, g->circular);
                if (pr < 0)
                    continue;
                const double *restrict src = tslot(g, w->T, (size_t)pr) + s * Q;
                if (g->circular && i == 0) {
                    const long sh = ((d * (long)S) % (long)Q + (long)Q) % (long)Q;
                    for (long x = 0; x < (long)Q - sh; x++)
                        acc[x] = src[x + sh];
                    for (long x = (long)Q - sh; x < (long)Q; x++)
                        acc[x] = src[x + sh - (long)Q];
                } else {
                    add_shifted(acc, src, (long)Q, d * (long)S, g->circular);
                }
            }
            for (size_t x = 0; x < Q; x++)
                dst[x] = alpha * acc[x] + beta;
        }
    }
    return TPK_OK;
}

/* Circular distance of positions i and j on an axis of length n. */
static long axis_dist(long i, long j, long n)
{
    long d = ((j - i) % n + n) % n;
    return d < n - d ? d : n - d;
}

/* Readout of rows [i0, i0 + n) of the pair's K^L block (GAP, LAP: into *sum, in row-major
 * order; LAP sums the entries (p, p') whose circular offset is within the window on each axis,
 * the block form of the shifts' mean, theory.md §2.8). */
static void readout_rows(const tpk_cnn_params *p, const grid *g, size_t N, size_t a, size_t c,
                         size_t i0, size_t n, const double *rows, double *sum, double *K)
{
    const size_t Q = g->Q;
    if (p->readout == TPK_CNN_LAP) {
        const long R = (long)g->R, S = (long)g->S, w = p->window;
        double s = *sum;
        for (size_t i = 0; i < n; i++) {
            const long r = (long)(i0 + i) / S, sc = (long)(i0 + i) % S;
            for (long r2 = 0; r2 < R; r2++) {
                if (axis_dist(r, r2, R) > w)
                    continue;
                for (long s2 = 0; s2 < S; s2++)
                    if (axis_dist(sc, s2, S) <= w)
                        s += rows[i * Q + (size_t)(r2 * S + s2)];
            }
        }
        *sum = s;
    } else if (p->readout == TPK_CNN_GAP) {
        double s = *sum;
        for (size_t i = 0; i < n * Q; i++)
            s += rows[i];
        *sum = s;
    } else if (p->readout == TPK_CNN_FLATTEN) {
        for (size_t i = 0; i < n; i++)
            *sum += rows[i * Q + i0 + i];
    } else {
        const size_t ld = N * Q;
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < Q; j++) {
                double v = p->sigma_v2 * rows[i * Q + j] + p->sigma_ob2;
                K[(a * Q + i0 + i) * ld + c * Q + j] = v;
                K[(c * Q + j) * ld + a * Q + i0 + i] = v;
            }
    }
}

/* Pair (a, c) by the direct path; *sum as readout_rows; *e the accumulated map error. q: the
 * position-diagonal variances, zv: E[φ(0)φ(u_p)] at the same indices (map_plane). */
static int pair_direct(const tpk_cnn_params *p, const grid *g, dws *w, const double *X,
                       const double *q, const double *zv, double zerr, size_t N, size_t a,
                       size_t c, const tpk_gauss_ws *ws, double *sum, double *K, double *e,
                       tpk_ctx *ctx)
{
    const size_t Q = g->Q, S = g->S, C = p->channels, L = (size_t)p->depth;
    const double taps = (double)p->kh * p->kw;
    patches(g, C, X + a * Q * C, X + c * Q * C, w);
    w->C = C;
    w->falpha = p->sigma_u2 / taps;
    w->fbeta = p->sigma_b2;
    const double *in = NULL;
    double *out = w->A;
    *e = 0;
    for (size_t l = 0; l + 1 < L; l++) {
        const size_t ia = (l * N + a) * Q, ic = (l * N + c) * Q;
        double el = 0;
        int st = layer_direct(p, g, w, in, q + ia, q + ic, zv + ia, zv + ic, zerr,
                              p->sigma_w2 / taps, p->sigma_b2, out, ws, &el, ctx);
        if (st)
            return st;
        *e = p->sigma_w2 * (*e + el);
        in = out;
        out = out == w->A ? w->B : w->A;
    }
    /* The last layer: map plane by plane straight into the readout. There is no tap sum after
     * the last map to skip: GAP reads K^L = V_φ(Σ^L) itself. (Had the readout pooled a further
     * convolution, circular padding would make it free: Σ_{p,p'} Σ_t K[p+t, p'+t] = kh·kw·Σ K,
     * each shift t permuting the (p, p') pairs; zero padding drops border terms.) Nothing else
     * can be skipped: every entry of Σ^L enters the sum through the nonlinear map, and each
     * needs kh·kw entries of K^{L−1}, which together cover the whole block. */
    const size_t ia = ((L - 1) * N + a) * Q, ic = ((L - 1) * N + c) * Q;
    double el = 0;
    col_runs(Q, q + ic, w);
    for (size_t r = 0; r < g->R; r++) {
        int st = map_plane(p, g, w, in, r, q + ia, q + ic, zv + ia, zv + ic, zerr, ws, &el, ctx);
        if (st)
            return st;
        readout_rows(p, g, N, a, c, r * S, S, w->P, sum, K);
    }
    *e += el;
    return TPK_OK;
}

/* zv[i] = E[φ(0)φ(u)], u ~ N(0, q[i]) (the entries of a zero-variance row or column); *zerr
 * the largest error estimate. */
static int zero_values(const tpk_phi *phi, const double *q, size_t n, const tpk_gauss_ws *ws,
                       double *zv, double *zerr, tpk_ctx *ctx)
{
    *zerr = 0;
    for (size_t i = 0; i < n; i++) {
        tpk_estimate r;
        int st = tpk_gauss_expect2(phi, 0.0, q[i], 0.0, ws, &r, ctx);
        if (st)
            return st;
        zv[i] = r.value;
        *zerr = fmax(*zerr, r.err);
    }
    return TPK_OK;
}

/* Rows and columns of zero-variance positions are exactly 0 (|Σ_pp'| ≤ √(q_p q_p')); the FFT's
 * rounding leaves ~1e-17 there, which the map would reject as not PSD. */
static void zero_var_snap(size_t Q, const double *qa, const double *qc, double *blk)
{
    int any = 0;
    for (size_t i = 0; i < Q && !any; i++)
        any = qa[i] == 0 || qc[i] == 0;
    for (size_t i = 0; any && i < Q; i++)
        for (size_t j = 0; j < Q; j++)
            if (qa[i] == 0 || qc[j] == 0)
                blk[i * Q + j] = 0.0;
}

/* Pair (a, c) by the block path (FFT tap sums); same outputs as pair_direct. */
static int pair_fft(const tpk_cnn_params *p, const grid *g, const fftplan *f, pairws *w,
                    const double *X, const double *q, size_t N, size_t a, size_t c,
                    const tpk_gauss_ws *ws, double *sum, double *K, double *e, tpk_ctx *ctx)
{
    const size_t Q = g->Q, C = p->channels, L = (size_t)p->depth;
    const double taps = (double)p->kh * p->kw;
    gram_block(X + a * Q * C, X + c * Q * C, Q, C, w->B);
    conv_any(g, f, w, p->sigma_u2 / taps, p->sigma_b2, w->B, w->A);
    zero_var_snap(Q, q + a * Q, q + c * Q, w->A);
    *e = 0;
    for (size_t l = 0; l < L; l++) {
        double el = 0;
        int st = tpk_gauss_map_cross(p->phi, q + (l * N + a) * Q, Q, q + (l * N + c) * Q, Q, w->A,
                                     w->A, ws, &el, ctx);
        if (st)
            return st;
        if (l + 1 < L) {
            conv_any(g, f, w, p->sigma_w2 / taps, p->sigma_b2, w->A, w->B);
            zero_var_snap(Q, q + ((l + 1) * N + a) * Q, q + ((l + 1) * N + c) * Q, w->B);
            double *t = w->A;
            w->A = w->B;
            w->B = t;
            *e = p->sigma_w2 * (*e + el);
        } else {
            *e += el;
        }
    }
    readout_rows(p, g, N, a, c, 0, Q, w->A, sum, K);
    return TPK_OK;
}

/* V_φ of a pair's (P×P) block A in place and the tangent step on TH beside it, row by row in
 * cache: two segment maps (φ, φ′) over the variances (q_a, then q_c), each row's V_φ′ in kd
 * (Q doubles) before V_φ replaces it. */
static int ntk_block_map(const tpk_cnn_params *p, const ntkf *nk, int last, size_t Q,
                         const double *qa, const double *qc, double *A, double *TH, double *kd,
                         const tpk_gauss_ws *ws, double *err, tpk_ctx *ctx)
{
    /* an image with itself (qa == qc): one set of variances, so that the entries (p, p) are the
     * map's diagonal, taken exactly by its scalar path (correlation 1, not 1 − ulp) */
    const int same = qa == qc;
    const size_t j0 = same ? 0 : Q;
    double *qv = kd + Q; /* kd has 3Q: a row, then the variances */
    memcpy(qv, qa, Q * sizeof *qv);
    memcpy(qv + Q, qc, Q * sizeof *qv);
    tpk_gauss_segmap *sm = tpk_gauss_segmap_alloc(p->phi, qv, Q + j0, ws, ctx);
    tpk_gauss_segmap *sd = sm ? tpk_gauss_segmap_alloc(nk->dphi, qv, Q + j0, ws, ctx) : NULL;
    if (!sm || !sd) {
        tpk_gauss_segmap_free(sm);
        return ctx->status ? ctx->status : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    }
    const double own = last ? nk->v : nk->w, s2 = last ? p->sigma_v2 : p->sigma_w2;
    double maxr = 0, emax = 0, maxd = 0, emaxd = 0;
    for (size_t i = 0; i < Q; i++) {
        double *row = A + i * Q;
        tpk_gauss_segmap_row(sd, i, j0, Q, row, kd, &maxd, &emaxd);
        tpk_gauss_segmap_row(sm, i, j0, Q, row, row, &maxr, &emax);
        tangent_step(Q, own, s2, row, kd, TH + i * Q);
    }
    tpk_gauss_segmap_merge(sm, maxr, emax);
    tpk_gauss_segmap_merge(sd, maxd, emaxd);
    int st = tpk_gauss_segmap_finish(sm, err, ctx);
    if (!st)
        st = tpk_gauss_segmap_finish(sd, NULL, ctx);
    tpk_gauss_segmap_free(sm);
    tpk_gauss_segmap_free(sd);
    return st;
}

/* Pair (a, c) with its NTK by whole (P×P) blocks: the maps of φ and φ′ over each block, the
 * tap sums by conv_any (direct, or FFT where f has a plan). *sum and *sumT as readout_rows, of
 * K^L and of Θ's last tangent block (the per-position readout writes K and Th). TH and KD: two
 * more Q×Q blocks of the thread's, scr 3Q doubles. */
static int pair_ntk(const tpk_cnn_params *p, const grid *g, const fftplan *f, pairws *w,
                    double *TH, double *KD, double *scr, const ntkf *nk, const double *X, const double *q,
                    size_t N, size_t a, size_t c, const tpk_gauss_ws *ws, double *sum,
                    double *sumT, double *K, double *Th, double *e, tpk_ctx *ctx)
{
    const size_t Q = g->Q, C = p->channels, L = (size_t)p->depth;
    const double taps = (double)p->kh * p->kw;
    double *th = TH, *kd = KD; /* swapped as the blocks are */
    gram_block(X + a * Q * C, X + c * Q * C, Q, C, w->B);
    conv_any(g, f, w, nk->u / taps, nk->b, w->B, th);
    conv_any(g, f, w, p->sigma_u2 / taps, p->sigma_b2, w->B, w->A);
    zero_var_snap(Q, q + a * Q, q + c * Q, w->A);
    *e = 0;
    for (size_t l = 0; l < L; l++) {
        const int last = l + 1 == L;
        double el = 0;
        int st = ntk_block_map(p, nk, last, Q, q + (l * N + a) * Q, q + (l * N + c) * Q, w->A, th,
                               scr, ws, &el, ctx);
        if (st)
            return st;
        if (last) {
            *e += el;
            break;
        }
        conv_any(g, f, w, p->sigma_w2 / taps, p->sigma_b2, w->A, w->B);
        zero_var_snap(Q, q + ((l + 1) * N + a) * Q, q + ((l + 1) * N + c) * Q, w->B);
        conv_any(g, f, w, 1.0 / taps, nk->b, th, kd);
        double *t = w->A;
        w->A = w->B;
        w->B = t;
        t = th;
        th = kd;
        kd = t;
        *e = p->sigma_w2 * (*e + el);
    }
    readout_rows(p, g, N, a, c, 0, Q, w->A, sum, K);
    /* the tangent block is read out as it stands (its readout factors are in it) */
    tpk_cnn_params pt = *p;
    pt.sigma_v2 = 1.0;
    pt.sigma_ob2 = nk->ob;
    readout_rows(&pt, g, N, a, c, 0, Q, th, sumT, Th);
    return TPK_OK;
}

/* ---- GAP and LAP by shifts ------------------------------------------------------------------ */

/* With circular padding every layer commutes with circular shifts of the grid, so the pair's
 * block entry Σ^l_{(p,a),(p+u,c)} is the position-diagonal entry Σ^l_{(p,a),(p,c')} of the pair
 * (x_a, x_c' = shift_{−u} x_c), and the GAP / LAP kernels are means of flatten kernels over
 * shifts u (theory.md §2.8). The diagonal recursion of one shifted pair is closed: a vector over
 * the P positions, mapped entrywise with the variances q_a[p] and q_c[p + u], and box-summed over
 * positions. So a block of shifts is a P × mb array V[p][k] (k: the block's shifts) that runs
 * through all L layers in cache; the tap sum is diag_box over positions with mb values each, the
 * map a row segment per (position, row shift) over the block's consecutive column shifts. */

/* The shifts: rows r0 .. r0 + nr − 1 and columns s0 .. s0 + ns − 1 (mod the axis), every
 * residue once: the whole axis for GAP, or for LAP where 2c + 1 covers it, else −c .. c. */
typedef struct shiftwin {
    long r0, nr, s0, ns;
    long cl, gr; /* a block: gr row shifts × cl consecutive column shifts */
} shiftwin;

/* Block buffers of this many doubles (256 KB): two live per thread (V and diag_box's scratch). */
#define SHIFT_BLOCK_DOUBLES 32768
/* At least this many column shifts per block when the window has them (whole vectors). */
#define SHIFT_MIN_COLS 8

static shiftwin shift_window(const grid *g, int readout, int c)
{
    shiftwin w = {0, (long)g->R, 0, (long)g->S, 0, 0};
    if (readout == TPK_CNN_LAP) {
        if (2L * c + 1 < (long)g->R) {
            w.r0 = -(long)c;
            w.nr = 2L * c + 1;
        }
        if (2L * c + 1 < (long)g->S) {
            w.s0 = -(long)c;
            w.ns = 2L * c + 1;
        }
    }
    long per = SHIFT_BLOCK_DOUBLES / (long)g->Q;
    per = per < SHIFT_MIN_COLS ? SHIFT_MIN_COLS : per;
    w.cl = w.ns < per ? w.ns : per;
    long rows = per / w.cl;
    w.gr = rows < 1 ? 1 : rows < w.nr ? rows : w.nr;
    return w;
}

/* Row width of the column variances' layout: variance of column shift index j (j − s0 the
 * shift's offset from the position) at qv[P + row·width + s + j]. */
static long shift_row_width(const grid *g, const shiftwin *w)
{
    return (long)g->S + w->ns - 1;
}

static long pos_mod(long i, long n)
{
    return ((i % n) + n) % n;
}

typedef struct sws {
    double *V, *T;          /* P × mb: the block of shifts, diag_box's scratch */
    double *VT, *kd;        /* the NTK: the tangent kernels (P × mb) and a segment's V_φ′ (mb) */
    double *qv;             /* the segment map's variances: q_a (P), then q_c per row (R·width) */
    tpk_gauss_segmap **sm;  /* one per layer, then (NTK) one of φ′ per layer */
    double *maxr, *emax;    /* per map: the segments' accumulators */
    size_t L, nmaps;
    tpk_allocator al;
} sws;

static void sws_free(sws *w) /* idempotent */
{
    for (size_t l = 0; w->sm && l < w->nmaps; l++)
        tpk_gauss_segmap_free(w->sm[l]);
    tpk_mem_free(&w->al, w->V);
    tpk_mem_free(&w->al, w->T);
    tpk_mem_free(&w->al, w->VT);
    tpk_mem_free(&w->al, w->kd);
    tpk_mem_free(&w->al, w->qv);
    tpk_mem_free(&w->al, w->sm);
    tpk_mem_free(&w->al, w->maxr);
    memset(w, 0, sizeof *w);
}

static int sws_alloc(sws *w, const grid *g, const shiftwin *win, size_t L, int ntk, tpk_ctx *ctx)
{
    memset(w, 0, sizeof *w);
    w->al = tpk_ctx_allocator(ctx);
    w->L = L;
    w->nmaps = ntk ? 2 * L : L;
    const size_t mb = (size_t)(win->cl * win->gr);
    w->V = tpk_malloc(ctx, g->Q * mb * sizeof *w->V);
    w->T = tpk_malloc(ctx, g->Q * mb * sizeof *w->T);
    w->VT = ntk ? tpk_malloc(ctx, g->Q * mb * sizeof *w->VT) : NULL;
    w->kd = ntk ? tpk_malloc(ctx, mb * sizeof *w->kd) : NULL;
    w->qv = tpk_malloc(ctx, (g->Q + g->R * (size_t)shift_row_width(g, win)) * sizeof *w->qv);
    w->sm = tpk_calloc(ctx, w->nmaps, sizeof *w->sm);
    w->maxr = tpk_malloc(ctx, 2 * w->nmaps * sizeof *w->maxr);
    if (!w->V || !w->T || !w->qv || !w->sm || !w->maxr || (ntk && (!w->VT || !w->kd))) {
        sws_free(w);
        return TPK_ENOMEM;
    }
    w->emax = w->maxr + w->nmaps;
    return TPK_OK;
}

/* Pair (a, c) by shifts: *sum = Σ_{u∈W} Σ_p K^L_{(p,a),(p+u,c)}, *e the accumulated map error.
 * q: the per-image position-diagonal variances (diag_variances), computed once per image; the
 * segment maps' preparation of them (square roots) is per pair and layer, O(P) against the
 * O(|W|·P) map. */
static int pair_shifts(const tpk_cnn_params *p, const grid *g, const shiftwin *win, sws *w,
                       const ntkf *nk, const double *X, const double *q, size_t N, size_t a,
                       size_t c, const tpk_gauss_ws *ws, double *sum, double *sumT, double *e,
                       tpk_ctx *ctx)
{
    const size_t Q = g->Q, C = p->channels, L = (size_t)p->depth;
    const long R = (long)g->R, S = (long)g->S, width = shift_row_width(g, win);
    const double taps = (double)p->kh * p->kw;
    const double *xa = X + a * Q * C, *xc = X + c * Q * C;
    int st = TPK_OK;
    for (size_t l = 0; l < L && !st; l++) {
        const double *qa = q + (l * N + a) * Q, *qc = q + (l * N + c) * Q;
        memcpy(w->qv, qa, Q * sizeof *qa);
        for (long r = 0; r < R; r++)
            for (long j = 0; j < width; j++)
                w->qv[Q + (size_t)(r * width + j)] = qc[r * S + pos_mod(j + win->s0, S)];
        for (size_t k = l; k < w->nmaps; k += L) { /* φ, then (NTK) φ′ */
            w->sm[k] = tpk_gauss_segmap_alloc(k < L ? p->phi : nk->dphi, w->qv,
                                              Q + (size_t)(R * width), ws, ctx);
            if (!w->sm[k] && !st)
                st = ctx->status ? ctx->status : TPK_ENOMEM;
            w->maxr[k] = w->emax[k] = 0;
        }
    }
    double total = 0, totalT = 0;
    for (long bi = 0; bi < win->nr && !st; bi += win->gr)
        for (long bj = 0; bj < win->ns && !st; bj += win->cl) {
            const long ng = bi + win->gr <= win->nr ? win->gr : win->nr - bi;
            const long nl = bj + win->cl <= win->ns ? win->cl : win->ns - bj;
            const size_t mb = (size_t)(ng * nl);
            /* Σ¹ of the shifted pairs: the box sum of the Gram ⟨x_a[p], x_c[p + u]⟩/C */
            for (long r = 0; r < R; r++)
                for (long s0 = 0; s0 < S; s0++) {
                    double *row = w->V + (size_t)(r * S + s0) * mb;
                    const double *pa = xa + (size_t)(r * S + s0) * C;
                    for (long gi = 0; gi < ng; gi++) {
                        const long rr = pos_mod(r + win->r0 + bi + gi, R);
                        for (long jj = 0; jj < nl; jj++) {
                            const long ss = pos_mod(s0 + win->s0 + bj + jj, S);
                            const double *pc = xc + (size_t)(rr * S + ss) * C;
                            double acc = 0;
                            for (size_t ch = 0; ch < C; ch++)
                                acc += pa[ch] * pc[ch];
                            row[gi * nl + jj] = acc / (double)C;
                        }
                    }
                }
            if (w->VT)
                diag_box(g, mb, nk->u / taps, nk->b, w->V, w->VT, w->T);
            diag_box(g, mb, p->sigma_u2 / taps, p->sigma_b2, w->V, w->V, w->T);
            for (size_t l = 0; l < L; l++) {
                const int last = l + 1 == L;
                for (long r = 0; r < R; r++)
                    for (long gi = 0; gi < ng; gi++) {
                        const long rr = pos_mod(r + win->r0 + bi + gi, R);
                        for (long s0 = 0; s0 < S; s0++) {
                            const size_t at = (size_t)(r * S + s0) * mb + (size_t)(gi * nl);
                            const size_t i = (size_t)(r * S + s0);
                            const size_t j = Q + (size_t)(rr * width + s0 + bj);
                            double *seg = w->V + at;
                            if (w->VT) /* V_φ′ of the same segment, before V_φ replaces it */
                                tpk_gauss_segmap_row(w->sm[L + l], i, j, (size_t)nl, seg, w->kd,
                                                     &w->maxr[L + l], &w->emax[L + l]);
                            tpk_gauss_segmap_row(w->sm[l], i, j, (size_t)nl, seg, seg,
                                                 &w->maxr[l], &w->emax[l]);
                            if (w->VT)
                                tangent_step((size_t)nl, last ? nk->v : nk->w,
                                             last ? p->sigma_v2 : p->sigma_w2, seg, w->kd,
                                             w->VT + at);
                        }
                    }
                if (!last) {
                    diag_box(g, mb, p->sigma_w2 / taps, p->sigma_b2, w->V, w->V, w->T);
                    if (w->VT)
                        diag_box(g, mb, 1.0 / taps, nk->b, w->VT, w->VT, w->T);
                }
            }
            double bs = 0, bt = 0;
            for (size_t i = 0; i < Q * mb; i++)
                bs += w->V[i];
            for (size_t i = 0; w->VT && i < Q * mb; i++)
                bt += w->VT[i];
            total += bs;
            totalT += bt;
        }
    *e = 0;
    for (size_t k = 0; k < w->nmaps; k++) {
        double el = 0;
        if (w->sm[k] == NULL)
            continue;
        tpk_gauss_segmap_merge(w->sm[k], w->maxr[k], w->emax[k]);
        if (!st)
            st = tpk_gauss_segmap_finish(w->sm[k], &el, ctx);
        if (k < L) /* K's bound (the NTK's maps are checked, not bounded) */
            *e = k + 1 < L ? p->sigma_w2 * (*e + el) : *e + el;
        tpk_gauss_segmap_free(w->sm[k]);
        w->sm[k] = NULL;
    }
    *sum = total;
    *sumT = totalT;
    return st;
}

/* ---- which path pools -------------------------------------------------------------------- */

/* Operation counts of the pooling estimate (tpk_cnn_pool_prefers_shifts), in vector-lane
 * operations per entry; estimates from the code, not measurements (re-fit them from timings with
 * TPK_CNN_POOL_SHIFTS / _BLOCK, which give the same kernel). MAP: one closed-form 2-D expectation
 * (an arcsine polynomial, a square root, ~8 products), the same for both paths; the shift path's
 * row segments round up to whole vectors of LANES doubles (AVX-512) and cost SEG_CALL each (a
 * call, the row's constants, the tail); PREP: one variance prepared for a segment map (square
 * root, division); STREAM: the block path's read and write of its (P×P) block per layer (16
 * bytes an entry) where the block outgrows L2 (BLOCK_L2 bytes, Zen 4's per core), from L3 at
 * ~32 bytes a cycle against 16 double lanes of arithmetic a cycle. */
#define POOL_MAP_COST 24.0
#define POOL_LANES 8.0
#define POOL_SEG_CALL_COST 32.0
#define POOL_PREP_COST 12.0
#define POOL_STREAM_COST 8.0
#define POOL_BLOCK_L2 (1024.0 * 1024.0)
/* What the counts above leave out of the shift path (its segment maps' preparation per shifted
 * pair, the blocks of shifts not staying in L2 through all layers), measured: on the 2-core Intel
 * AVX-512 machine of session 19 GAP by shifts took 1.62x (16 images 28x28, depth 8), 1.84x
 * (depth 3) and 1.21x (8 images 32x32, depth 8) the block path's time, where the raw counts
 * predicted 0.9x; this factor puts the prediction at 1.2-1.6x. */
#define POOL_SHIFT_MEASURED 1.7

static double pool_tap_cost(int kh, int kw)
{
    return (kh > 1 ? kh : 0) + (kw > 1 ? kw : 0) + 1.0; /* the adds and the affine step */
}

/* Per pair. */
static double pool_cost_shifts(const tpk_cnn_params *p, const grid *g)
{
    const shiftwin w = shift_window(g, p->readout, p->window);
    const double Q = (double)g->Q, W = (double)(w.nr * w.ns), L = p->depth, cl = (double)w.cl;
    const double lanes = ceil(cl / POOL_LANES) * POOL_LANES / cl, tap = pool_tap_cost(p->kh, p->kw);
    const double per_layer = W * Q * (POOL_MAP_COST * lanes + tap + POOL_SEG_CALL_COST / cl) +
                             (Q + (double)g->R * (double)shift_row_width(g, &w)) * POOL_PREP_COST;
    return POOL_SHIFT_MEASURED * (L * per_layer + W * Q * ((double)p->channels + tap));
}

static double pool_cost_block(const tpk_cnn_params *p, const grid *g)
{
    const double Q = (double)g->Q, L = p->depth;
    double tap = pool_tap_cost(p->kh, p->kw);
    if (p->conv == TPK_CNN_CONV_FFT ||
        (p->conv == TPK_CNN_CONV_AUTO &&
         tpk_cnn_conv_prefers_fft(g->R, g->S, p->kh, p->kw, p->padding))) {
        const double c = g->R == 1 ? TPK_CNN_FFT_COST_1D : TPK_CNN_FFT_COST_2D;
        tap = c * log2(Q * Q) + 1.0; /* circular: the transform is the block's size */
    }
    const double stream = Q * Q * 8.0 > POOL_BLOCK_L2 ? POOL_STREAM_COST : 0.0;
    return L * Q * Q * (POOL_MAP_COST + tap + stream) +
           Q * Q * (double)p->kh * (double)p->kw * (double)p->channels;
}

int tpk_cnn_pool_prefers_shifts(const tpk_cnn_params *p)
{
    if (!p || p->padding != TPK_CNN_CIRCULAR ||
        (p->readout != TPK_CNN_GAP && p->readout != TPK_CNN_LAP) || p->rows < 1 || p->cols < 1 ||
        p->kh < 1 || p->kw < 1 || p->depth < 1 || p->channels < 1)
        return 0;
    const grid g = make_grid(p->rows, p->cols, p->kh, p->kw, p->padding);
    return pool_cost_shifts(p, &g) <= pool_cost_block(p, &g);
}

static int pools_by_shifts(const tpk_cnn_params *p)
{
    if (p->readout != TPK_CNN_GAP && p->readout != TPK_CNN_LAP)
        return 0;
    return p->pool == TPK_CNN_POOL_SHIFTS ||
           (p->pool == TPK_CNN_POOL_AUTO && tpk_cnn_pool_prefers_shifts(p));
}

static int kernel_pairs(const tpk_cnn_params *p, const grid *g, const double *X,
                        const pairset *ps, const tpk_gauss_ws *ws, const ntkf *nk, double *K,
                        double *Th, double *err, tpk_ctx *ctx)
{
    const size_t Q = g->Q, L = (size_t)p->depth, N = ps->N;
    const size_t npairs = pairs_count(ps);
    double *q = tpk_malloc(ctx, L * N * Q * sizeof *q);
    if (!q)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    int st = diag_variances(p, g, X, N, ws, q, ctx);
    const int shifts = pools_by_shifts(p);
    const shiftwin win = shift_window(g, p->readout, p->window);
    int fft = !shifts && (p->conv == TPK_CNN_CONV_FFT ||
                          (p->conv == TPK_CNN_CONV_AUTO &&
                           tpk_cnn_conv_prefers_fft(g->R, g->S, g->kh, g->kw, p->padding)));
    const int ntk = nk->dphi != NULL, blocks = ntk && !shifts; /* the NTK's block path: pair_ntk */
    double *zv = NULL, zerr = 0;
    if (!st && !fft && !shifts && !ntk) { /* zero-variance entries (map_plane); none with a bias variance > 0 */
        zv = tpk_calloc(ctx, L * N * Q, sizeof *zv);
        size_t nzero = 0;
        for (size_t i = 0; i < L * N * Q; i++)
            nzero += q[i] == 0;
        if (!zv)
            st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        else if (nzero)
            st = zero_values(p->phi, q, L * N * Q, ws, zv, &zerr, ctx);
    }
    fftplan f = {0};
    if (!st && fft) /* measured plans pay off when many blocks follow */
        st = fftplan_make(&f, g, npairs * (L > 1 ? L - 1 : 1) > 256, ctx);
    double emax = 0;
    int failed = st;
    tpk_ctx tctx;
    tpk_ctx_init_from(&tctx, ctx);
    if (!st) {
#pragma omp parallel reduction(max : emax)
        {
            pairws w = {0};
            dws dw = {0};
            sws sw = {0};
            double *tb = NULL; /* pair_ntk's two more blocks */
            tpk_ctx lctx;
            tpk_ctx_init_from(&lctx, ctx);
            int lst = (shifts        ? sws_alloc(&sw, g, &win, L, ntk, &lctx)
                       : fft || blocks ? pairws_alloc(&w, Q, fft ? &f : NULL, &lctx)
                                     : dws_alloc(&dw, g, p->channels, &lctx))
                          ? TPK_ENOMEM
                          : TPK_OK;
            if (!lst && blocks && !(tb = tpk_malloc(&lctx, (2 * Q * Q + 3 * Q) * sizeof *tb)))
                lst = TPK_ENOMEM;
            if (lst)
                TPK_ERROR(&lctx, TPK_ENOMEM, "out of memory (pair workspace, %zu positions)", Q);
#pragma omp for schedule(dynamic, 1)
            for (size_t k = 0; k < npairs; k++) {
                int bad;
#pragma omp atomic read
                bad = failed;
                if (lst || bad)
                    continue;
                size_t a, c;
                pairs_at(ps, k, &a, &c);
                double e = 0, sum = 0, sumT = 0;
                lst = shifts ? pair_shifts(p, g, &win, &sw, nk, X, q, N, a, c, ws, &sum, &sumT,
                                           &e, &lctx)
                      : blocks ? pair_ntk(p, g, fft ? &f : NULL, &w, tb, tb + Q * Q,
                                          tb + 2 * Q * Q, nk, X, q, N, a, c, ws, &sum, &sumT, K,
                                          Th, &e, &lctx)
                      : fft  ? pair_fft(p, g, &f, &w, X, q, N, a, c, ws, &sum, K, &e, &lctx)
                             : pair_direct(p, g, &dw, X, q, zv, zerr, N, a, c, ws, &sum, K, &e,
                                           &lctx);
                if (lst)
                    continue;
                emax = fmax(emax, p->sigma_v2 * e);
                /* the readout's count: P² pairs (GAP), P positions, |W| shifts of P (LAP) */
                const double cnt = p->readout == TPK_CNN_GAP      ? (double)Q * Q
                                   : p->readout == TPK_CNN_FLATTEN ? (double)Q
                                                                   : (double)Q * (double)(win.nr * win.ns);
                if (p->readout != TPK_CNN_POSITIONS) {
                    pairs_store(ps, a, c, p->sigma_v2 * sum / cnt + p->sigma_ob2, K, ps->diag);
                    if (ntk)
                        pairs_store(ps, a, c, sumT / cnt + nk->ob, Th, ps->diagT);
                }
            }
            if (lst) {
#pragma omp critical(tpk_cnn_err)
                if (!failed) {
                    tctx = lctx;
#pragma omp atomic write
                    failed = lst;
                }
            }
            pairws_free(&w);
            dws_free(&dw);
            sws_free(&sw);
            tpk_free(&lctx, tb);
        }
    }
    fftplan_free(&f);
    tpk_free(ctx, q);
    tpk_free(ctx, zv);
    if (!st && failed) {
        *ctx = tctx;
        st = failed;
    }
    if (!st && err)
        *err = emax;
    return st;
}

/* ---- one layer of one pair, for callers that chain layers themselves ------------------------ */

/* The workspace of tpk_cnn_layer_apply: the direct path's planes (dws, without its ping-pong
 * blocks and patches) or the FFT path's, and the zero-variance values of the two inputs. */
struct tpk_cnn_layerws {
    grid g;
    int fft;
    fftplan f;
    pairws pw;
    dws dw;
    double *zva, *zvc, *tmp; /* Q, Q, and the FFT path's mapped block (Q²) */
    size_t C;                /* channels of tpk_cnn_layer_first's inputs */
    int held;                /* tpk_cnn_layer_first held its patches for the next layer (their
                              * channels, α and β in dw) */
    tpk_allocator al;
};

void tpk_cnn_layerws_free(tpk_cnn_layerws *w)
{
    if (w == NULL)
        return;
    tpk_allocator al = w->al;
    pairws_free(&w->pw);
    fftplan_free(&w->f);
    dws_free(&w->dw);
    tpk_mem_free(&al, w->zva);
    tpk_mem_free(&al, w->zvc);
    tpk_mem_free(&al, w->tmp);
    tpk_mem_free(&al, w);
}

tpk_cnn_layerws *tpk_cnn_layerws_alloc(size_t rows, size_t cols, int kh, int kw, int padding,
                                       size_t channels, tpk_ctx *ctx)
{
    if (filter_fits(rows, cols, kh, kw, ctx))
        return NULL;
    tpk_cnn_layerws *w = tpk_calloc(ctx, 1, sizeof *w);
    if (w == NULL) {
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        return NULL;
    }
    w->al = tpk_ctx_allocator(ctx);
    w->g = make_grid(rows, cols, kh, kw, padding);
    const size_t Q = w->g.Q;
    w->fft = tpk_cnn_conv_prefers_fft(rows, cols, kh, kw, padding);
    w->C = channels > 0 ? channels : 1;
    int st = dws_alloc(&w->dw, &w->g, w->C, ctx); /* and the patches of the first layer */
    if (st == TPK_OK && w->fft && (st = fftplan_make(&w->f, &w->g, 0, ctx)) == TPK_OK)
        st = pairws_alloc(&w->pw, Q, &w->f, ctx);
    if (st == TPK_OK) { /* the direct path's ping-pong blocks: the caller holds the blocks */
        tpk_mem_free(&w->dw.al, w->dw.A);
        tpk_mem_free(&w->dw.al, w->dw.B);
        w->dw.A = w->dw.B = NULL;
        w->zva = tpk_malloc(ctx, Q * sizeof *w->zva);
        w->zvc = tpk_malloc(ctx, Q * sizeof *w->zvc);
        w->tmp = w->fft ? tpk_malloc(ctx, Q * Q * sizeof *w->tmp) : NULL;
        if (!w->zva || !w->zvc || (w->fft && !w->tmp))
            st = TPK_ENOMEM;
    }
    if (st != TPK_OK) {
        tpk_cnn_layerws_free(w);
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (layer workspace, %zu positions)", Q);
        return NULL;
    }
    return w;
}

int tpk_cnn_layer_first(tpk_cnn_layerws *w, const double *xa, const double *xc, size_t channels,
                        double alpha, double beta, double *out, tpk_ctx *ctx)
{
    const grid *g = &w->g;
    if (channels < 1 || channels > w->C)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_cnn_layer_first: %zu channels, the workspace has "
                         "%zu", channels, w->C);
    patches(g, channels, xa, xc, &w->dw);
    if (out == NULL) { /* made plane by plane by the next layer's map (map_plane) */
        w->held = 1;
        w->dw.C = channels;
        w->dw.falpha = alpha;
        w->dw.fbeta = beta;
        return TPK_OK;
    }
    double *P = w->dw.P;
    for (size_t r = 0; r < g->R; r++) { /* each plane straight into out */
        w->dw.P = out + r * g->S * g->Q;
        first_plane(g, channels, alpha, beta, r, &w->dw);
    }
    w->dw.P = P;
    return TPK_OK;
}

int tpk_cnn_layer_apply(tpk_cnn_layerws *w, const tpk_phi *phi, const double *qa,
                        const double *qc, double alpha, double beta, const double *in,
                        double *out, const tpk_gauss_ws *ws, double *err, tpk_ctx *ctx)
{
    const grid *g = &w->g;
    const size_t Q = g->Q;
    double el = 0, zerr = 0;
    *err = 0;
    const int held = w->held;
    w->held = 0;
    if (in == NULL && !held)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_cnn_layer_apply: no block and no first layer held");
    if (in == NULL && w->fft) { /* the held first layer as a block: out is scratch until the
                                 * map has read it */
        double *P = w->dw.P;
        for (size_t r = 0; r < g->R; r++) {
            w->dw.P = out + r * g->S * Q;
            first_plane(g, w->dw.C, w->dw.falpha, w->dw.fbeta, r, &w->dw);
        }
        w->dw.P = P;
        in = out;
    }
    if (w->fft) { /* the map over the block, then the FFT's tap sum (pair_fft) */
        int st = tpk_gauss_map_cross(phi, qa, Q, qc, Q, in, w->tmp, ws, &el, ctx);
        if (st)
            return st;
        conv_any(g, &w->f, &w->pw, alpha, beta, w->tmp, out);
        *err = el;
        return TPK_OK;
    }
    int zeros = 0; /* zero-variance positions: their entries from E[φ(0)φ(u)] (map_plane) */
    for (size_t i = 0; i < Q && !zeros; i++)
        zeros = qa[i] == 0 || qc[i] == 0;
    if (zeros) {
        double za = 0, zc = 0;
        int st = zero_values(phi, qa, Q, ws, w->zva, &za, ctx);
        if (st == TPK_OK)
            st = zero_values(phi, qc, Q, ws, w->zvc, &zc, ctx);
        if (st)
            return st;
        zerr = fmax(za, zc);
    }
    /* in NULL: map_plane makes each plane of the held first layer from the patches (dw's α, β) */
    const tpk_cnn_params p = {.rows = g->R, .cols = g->S, .channels = 1, .kh = g->kh,
                              .kw = g->kw, .depth = 1, .phi = phi};
    int st = layer_direct(&p, g, &w->dw, in, qa, qc, w->zva, w->zvc, zerr, alpha, beta, out, ws,
                          &el, ctx);
    *err = el;
    return st;
}

int tpk_cnn_kernel(const tpk_cnn_params *p, const tpk_array *X, const tpk_gauss_ws *ws,
                   tpk_array *K, double *err, tpk_ctx *ctx)
{
    if (!K || !K->data)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_cnn_kernel: no input X or no output K");
    return tpk_cnn_kernels(p, X, ws, K, NULL, err, ctx);
}

/* The NTK's factors of p (tpk_cnn_kernels' rules), φ′ into *dphi (the caller frees it). */
static int ntk_factors(const tpk_cnn_params *p, ntkf *nk, tpk_phi **dphi, tpk_ctx *ctx)
{
    const int param = p->ntk_param;
    int st = tpk_ntk_param_check("tpk_cnn_kernels", param, (double)p->ntk_width, ctx);
    if (st)
        return st;
    if (param == TPK_NTK_PARAM_STANDARD && p->readout == TPK_CNN_LAP)
        return TPK_ERROR(ctx, TPK_EINVAL, "the 'standard' NTK of local average pooling is not "
                         "defined: lap is a mean of kernels over shifts with no readout layer whose "
                         "fan-in that parameterisation would scale by (use ntk or tp)");
    if (p->compute == TPK_CNN_F32)
        return TPK_ERROR(ctx, TPK_EINVAL, "the NTK is computed in float64 only (got --compute=f32)");
    if (!(*dphi = tpk_phi_derivative(p->phi, ctx)))
        return ctx->status;
    const double taps = (double)p->kh * p->kw, n = (double)p->ntk_width, P = (double)(p->rows * p->cols);
    /* a layer is kh·kw weights (its taps), each N(0, σ²/(kh kw)) with the fan-in of one
     * position's channels, each trained on its own tap's input kernel: the layer's own term on
     * the taps' mean is kh·kw times one tap's (the programs' A-vars, programs/cnn2d.nsr) */
    *nk = (ntkf){.dphi = *dphi,
                 .u = taps * tpk_ntk_own(param, p->sigma_u2 / taps, (double)p->channels),
                 .w = taps * tpk_ntk_own(param, p->sigma_w2 / taps, n),
                 .b = tpk_ntk_own(param, p->sigma_b2, 1.0),
                 .v = tpk_ntk_own(param, p->sigma_v2, p->readout == TPK_CNN_FLATTEN ? n * P : n),
                 .ob = p->sigma_ob2 > 0 ? tpk_ntk_own(param, p->sigma_ob2, 1.0) : 0.0};
    return TPK_OK;
}

/* The pairs of ps by the readout's path into k (and th with the NTK factors nk), then the
 * finiteness of what was written. */
static int cnn_run(const tpk_cnn_params *p, const double *X, const pairset *ps,
                   const tpk_gauss_ws *ws, const ntkf *nk, double *k, double *th, double *err,
                   tpk_ctx *ctx)
{
    grid g = make_grid(p->rows, p->cols, p->kh, p->kw, p->padding);
    int st;
    if (p->readout == TPK_CNN_FLATTEN && p->compute == TPK_CNN_F32)
        st = kernel_flatten_f32(p, &g, X, ps, ws, k, err, ctx);
    else if (p->readout == TPK_CNN_FLATTEN)
        st = kernel_flatten(p, &g, X, ps, ws, nk, k, th, err, ctx);
    else
        st = kernel_pairs(p, &g, X, ps, ws, nk, k, th, err, ctx);
    const size_t N = ps->N, nr = N - ps->nc;
    const size_t n = p->readout == TPK_CNN_POSITIONS ? N * g.Q * N * g.Q
                     : ps->nc ? nr * ps->nc : N * N;
    for (int i = 0; i < 2 && !st; i++) {
        const double *out = i ? th : k, *dg = i ? ps->diagT : ps->diag;
        if (out)
            st = check_finite(out, n, p->depth, ctx);
        if (!st && ps->nc && dg)
            st = check_finite(dg, nr, p->depth, ctx);
    }
    return st;
}

/* The inputs' shape against the parameters (what = the argument's name). */
static int check_items(const tpk_cnn_params *p, const tpk_array *X, const char *fn,
                       const char *what, tpk_ctx *ctx)
{
    int st = tpk_array_check_input(X, fn, what, ctx);
    if (st)
        return st;
    const size_t Q = p->rows * p->cols;
    if (tpk_array_item_size(X) != Q * p->channels)
        return TPK_ERROR(ctx, TPK_EINVAL,
                         "each input must hold %zux%zu positions x %zu channels = %zu values (got %zu)",
                         p->rows, p->cols, p->channels, Q * p->channels, tpk_array_item_size(X));
    return TPK_OK;
}

int tpk_cnn_kernels(const tpk_cnn_params *p, const tpk_array *X, const tpk_gauss_ws *ws,
                    tpk_array *K, tpk_array *Theta, double *err, tpk_ctx *ctx)
{
    int st = tpk_cnn_params_check(p, ctx);
    if (st)
        return st;
    if (!X || !X->data || X->ndim < 1 || ((!K || !K->data) && (!Theta || !Theta->data)))
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_cnn_kernels: no input X or no output");
    if ((st = check_items(p, X, "tpk_cnn_kernel", "X", ctx)))
        return st;
    const size_t N = X->dims[0], Q = p->rows * p->cols;
    const size_t side = p->readout == TPK_CNN_POSITIONS ? N * Q : N;
    const tpk_array *outs[2] = {K, Theta};
    for (int i = 0; i < 2; i++)
        if (outs[i] && outs[i]->data &&
            (outs[i]->ndim != 2 || outs[i]->dims[0] != side || outs[i]->dims[1] != side))
            return TPK_ERROR(ctx, TPK_EINVAL, "%s output must be %zux%zu",
                             i ? "the NTK's" : "kernel", side, side);
    tpk_phi *dphi = NULL;
    ntkf nk = {0};
    if (Theta && Theta->data && (st = ntk_factors(p, &nk, &dphi, ctx)))
        return st;
    if (N == 0) {
        tpk_phi_free(dphi);
        return TPK_OK;
    }
    double *k = K && K->data ? K->data : tpk_malloc(ctx, side * side * sizeof *k);
    if (!k) {
        tpk_phi_free(dphi);
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (%zux%zu kernel)", side, side);
    }
    const pairset ps = {N, 0, NULL, NULL};
    st = cnn_run(p, X->data, &ps, ws, &nk, k, nk.dphi ? Theta->data : NULL, err, ctx);
    if (k != (K ? K->data : NULL))
        tpk_free(ctx, k);
    tpk_phi_free(dphi);
    return st;
}

int tpk_cnn_kernels_cross(const tpk_cnn_params *p, const tpk_array *Xr, const tpk_array *Xc,
                          const tpk_gauss_ws *ws, tpk_array *K, tpk_array *Theta, double *kdiag,
                          double *tdiag, double *err, tpk_ctx *ctx)
{
    int st = tpk_cnn_params_check(p, ctx);
    if (st)
        return st;
    if (p->readout == TPK_CNN_POSITIONS)
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED, "tpk_cnn_kernels_cross: the per-position readout "
                         "has no cross blocks (tpk_cnn_kernels computes it whole)");
    if (!Xr || !Xc || ((!K || !K->data) && (!Theta || !Theta->data)))
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_cnn_kernels_cross: no inputs or no output");
    if ((st = check_items(p, Xr, "tpk_cnn_kernels_cross", "Xr", ctx)) ||
        (st = check_items(p, Xc, "tpk_cnn_kernels_cross", "Xc", ctx)))
        return st;
    const size_t nr = Xr->dims[0], nc = Xc->dims[0], per = tpk_array_item_size(Xc);
    const tpk_array *outs[2] = {K, Theta};
    for (int i = 0; i < 2; i++)
        if (outs[i] && outs[i]->data &&
            (outs[i]->ndim != 2 || outs[i]->dims[0] != nr || outs[i]->dims[1] != nc))
            return TPK_ERROR(ctx, TPK_EINVAL, "%s output must be %zux%zu",
                             i ? "the NTK's" : "kernel", nr, nc);
    tpk_phi *dphi = NULL;
    ntkf nk = {0};
    if (Theta && Theta->data && (st = ntk_factors(p, &nk, &dphi, ctx)))
        return st;
    if (nr == 0 || nc == 0) {
        tpk_phi_free(dphi);
        return TPK_OK;
    }
    /* the columns' items then the rows': the order in which a job stacks training before test */
    double *X = tpk_malloc(ctx, (nr + nc) * per * sizeof *X);
    double *k = K && K->data ? K->data : tpk_malloc(ctx, nr * nc * sizeof *k);
    if (!X || !k) {
        tpk_free(ctx, X);
        if (k != (K ? K->data : NULL))
            tpk_free(ctx, k);
        tpk_phi_free(dphi);
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (%zux%zu kernel block)", nr, nc);
    }
    memcpy(X, Xc->data, nc * per * sizeof *X);
    memcpy(X + nc * per, Xr->data, nr * per * sizeof *X);
    const pairset ps = {nr + nc, nc, kdiag, nk.dphi ? tdiag : NULL};
    st = cnn_run(p, X, &ps, ws, &nk, k, nk.dphi ? Theta->data : NULL, err, ctx);
    tpk_free(ctx, X);
    if (k != (K ? K->data : NULL))
        tpk_free(ctx, k);
    tpk_phi_free(dphi);
    return st;
}
