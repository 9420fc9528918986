/* CNN NNGP kernels (1-D signals, 2-D images) by the direct recursion over (position × input)
 * covariance blocks, theory.md §2.8; the fast path behind gpkernel --arch=cnn1d / cnn2d. */
#ifndef TPK_CNN_H
#define TPK_CNN_H

#include "array.h"
#include "gauss.h"
#include "ntk.h"

#ifdef __cplusplus
extern "C" {
#endif

enum tpk_cnn_padding { TPK_CNN_CIRCULAR, TPK_CNN_ZERO };
enum tpk_cnn_readout {
    TPK_CNN_FLATTEN,   /* a readout weight per position: (σ_v²/P) Σ_p K^L_{(p,a),(p,c)} + σ_ob²  */
    TPK_CNN_GAP,       /* global average pooling: (σ_v²/P²) Σ_{p,p'} K^L_{(p,a),(p',c)} + σ_ob² */
    TPK_CNN_POSITIONS, /* every position read out: σ_v² K^L + σ_ob² over (input, position)
                        * pairs, (N·P)×(N·P), index a·P + p (p row-major over the grid): the
                        * layout of the NETSOR programs' all-outputs kernel */
    TPK_CNN_LAP        /* local average pooling (Li et al. 2019, arXiv:1911.00809), window c:
                        * (1/|W|) Σ_{u∈W} K_flatten(x, shift_u z) = (σ_v²/(P|W|)) Σ_p Σ_{u∈W}
                        * K^L_{(p,a),(p+u,c)} + σ_ob², W the circular shifts with |u_i| ≤ c on
                        * each axis (each distinct shift once: c = 0 is FLATTEN, 2c + 1 ≥ the
                        * axis lengths is GAP); circular padding only (theory.md §2.8) */
};
/* How GAP and LAP are summed (theory.md §2.8, "pooling by shifts"). */
enum tpk_cnn_pool {
    TPK_CNN_POOL_AUTO,   /* the cheaper of the two by tpk_cnn_pool_prefers_shifts */
    TPK_CNN_POOL_SHIFTS, /* the flatten recursion of each shifted pair (x, shift_u z), u ∈ W, in
                          * blocks of shifts: no (P×P) block (circular padding only) */
    TPK_CNN_POOL_BLOCK   /* the full (P×P) recursion per pair, the readout summed over it */
};
/* Arithmetic of the flatten recursion. */
enum tpk_cnn_compute {
    TPK_CNN_F64,         /* double throughout */
    TPK_CNN_F32          /* float storage, tap sums and maps (closed forms of the ABReLU family
                          * and erf in float; other φ mapped in double from the float values);
                          * per-image variances, channel sums and the readout's sum over positions
                          * in double. FLATTEN only. Error: theory.md §2.8 */
};
/* How the tap convolution of a (position × position) block is summed. */
enum tpk_cnn_conv {
    TPK_CNN_CONV_AUTO,   /* the cheaper of the two by tpk_cnn_conv_prefers_fft */
    TPK_CNN_CONV_DIRECT, /* separable direct summation: (kh + kw) adds per entry */
    TPK_CNN_CONV_FFT     /* FFTW r2c/c2r of the whole block (zero-extended for zero padding) */
};

/* Convolutional layers g¹_p = Σ_t U_t x_{p+t} + b¹, g^{l+1}_p = Σ_t F^{l+1}_t φ(g^l_p+t) + b^{l+1}
 * (stride 1, "same" size; taps t = (i, j), i < kh, j < kw, offset by the centre
 * (floor((kh−1)/2), floor((kw−1)/2))), each tap its own weight shared over positions, entries
 * N(0, σ²/(kh·kw·fan_in)). Recursion (§2.8):
 *   Σ¹_{(p,a),(p',c)}      = σ_u²/(kh kw) Σ_t ⟨x_{p+t,a}, x_{p'+t,c}⟩/C + σ_b²
 *   Σ^{l+1}_{(p,a),(p',c)} = σ_w²/(kh kw) Σ_t K^l_{(p+t,a),(p'+t,c)} + σ_b²,  K^l = V_φ(Σ^l)
 * with positions outside the grid wrapped (circular) or zero (zero padding). 1-D: rows = 1,
 * kh = 1. */
typedef struct tpk_cnn_params {
    size_t rows, cols;   /* grid (positions P = rows·cols) */
    size_t channels;     /* C ≥ 1 */
    int kh, kw;          /* filter size, 1 ≤ kh ≤ rows, 1 ≤ kw ≤ cols */
    int depth;           /* convolutional layers L ≥ 1 */
    const tpk_phi *phi;
    double sigma_u2, sigma_w2, sigma_b2; /* first layer, later layers, biases */
    double sigma_v2, sigma_ob2;          /* readout weights and readout bias */
    int padding;         /* enum tpk_cnn_padding */
    int readout;         /* enum tpk_cnn_readout */
    int conv;            /* enum tpk_cnn_conv */
    int window;          /* LAP: the shifts' reach c ≥ 0 on each axis (ignored otherwise) */
    int pool;            /* enum tpk_cnn_pool (GAP, LAP) */
    int compute;         /* enum tpk_cnn_compute */
    int ntk_param;       /* tpk_cnn_kernels' NTK: TPK_NTK_PARAM_NTK (0), _TP or _STANDARD */
    size_t ntk_width;    /* TPK_NTK_PARAM_STANDARD: the channels n of every hidden layer */
} tpk_cnn_params;

/* Check the parameters; a clear message for each violation. */
TPK_API int tpk_cnn_params_check(const tpk_cnn_params *p, tpk_ctx *ctx);

/* The kernel of N inputs X (N × rows × cols × C in row-major order, any rank with that item
 * size) into K: N×N for FLATTEN / GAP / LAP, (N·P)×(N·P) for POSITIONS (preallocated).
 * FLATTEN runs the closed position-diagonal recursion by tiles of image pairs (a, c0..c1), each
 * tile's P position vectors through all layers at once (memory: the per-image variances, L·N·P
 * doubles, and per thread three tiles of at most 256 K doubles).
 * GAP / POSITIONS run the full recursion one input pair at a time (P×P blocks, OpenMP over
 * pairs): cost L·P²·N²/2 2-D expectations (fewer where positions have zero variance, e.g. black
 * borders with σ_b² = 0). With direct tap sums each layer is one streaming pass over the block,
 * plane by plane (kernels/cnn.c); per thread ≈ (2 + (2kh − 1)/rows)·P² doubles of workspace.
 * GAP / LAP by shifts (pool, circular padding): per pair L·|W|·P 2-D expectations, |W| the
 * shifts (P for GAP, (2c+1)² for LAP on a 2-D grid), in blocks of shifts of ≈ 256 KB per thread.
 * err (may be NULL) gets a first-order bound on the accumulated expectation error (with
 * TPK_CNN_F32: on the float rounding, theory.md §2.8). ws may be NULL when φ has a closed form. */
TPK_API int tpk_cnn_kernel(const tpk_cnn_params *p, const tpk_array *X, const tpk_gauss_ws *ws,
                           tpk_array *K, double *err, tpk_ctx *ctx);

/* The NNGP kernel K and the Neural Tangent Kernel Theta of the same network (either may be NULL;
 * layouts as tpk_cnn_kernel), in the parameterisation p->ntk_param (include/tpk/ntk.h,
 * theory.md §8.7 and §2.8 "The NTK"). Beside each covariance Σ^l the recursion carries the
 * tangent kernel Θ^l of the same positions (Arora et al. 2019, CNTK; Tensor Programs II):
 *   Θ¹      = w_U/(kh kw) Σ_t ⟨x_{p+t,a}, x_{p'+t,c}⟩/C + w_b
 *   Θ^{l+1} = 1/(kh kw) Σ_t (w_F K^l + σ_w² K̇^l ⊙ Θ^l)_{(p+t,a),(p'+t,c)} + w_b,  K̇^l = V_φ′(Σ^l)
 *   Θ       = R(w_v K^L + σ_v² K̇^L ⊙ Θ^L) + w_ob,  R the readout's mean over positions
 * where each parameter's own factor is tpk_ntk_own(param, σ², fan_in): a layer's taps are kh·kw
 * weights N(0, σ²/(kh kw)) of fan-in C (first layer) or n, so w_U = kh kw·own(σ_u²/(kh kw), C)
 * and w_F = kh kw·own(σ_w²/(kh kw), n) (σ² in 'ntk', kh·kw·fan-in in 'standard', kh·kw in
 * Tensor Programs II's, as the programs' per-tap A-vars); w_b = own(σ_b², 1) (every layer has a
 * bias), w_v = own(σ_v², n) for GAP and per-position readouts and own(σ_v², n·P) for flatten;
 * the readout bias counts where σ_ob² > 0. LAP has no readout layer
 * whose fan-in 'standard' could scale by, and float32 is the NNGP's: both refused with the NTK.
 * GAP and LAP by shifts (circular padding) carry Θ through the shifted pairs' flatten recursions
 * (the shift identity holds for Θ as for K); the other pooled and per-position readouts run the
 * (P×P) block recursion with whole-block maps. err bounds K's expectations. */
TPK_API int tpk_cnn_kernels(const tpk_cnn_params *p, const tpk_array *X, const tpk_gauss_ws *ws,
                            tpk_array *K, tpk_array *Theta, double *err, tpk_ctx *ctx);
/* A cross block of tpk_cnn_kernels: K (nr × nc) = k(Xr[i], Xc[j]), Theta beside it as there
 * (NULL or no data: not wanted), and kdiag, tdiag (nr values each, NULL: not wanted) the rows'
 * own k(Xr[i], Xr[i]) and Θ(Xr[i], Xr[i]). The same numbers as those entries of tpk_cnn_kernels
 * on the items Xc then Xr, for the pairs of the block alone (a tile of a distributed kernel,
 * not the (nr + nc)² kernel of the two stacked). Flatten, GAP and LAP; the per-position readout
 * is TPK_EUNSUPPORTED. */
TPK_API int tpk_cnn_kernels_cross(const tpk_cnn_params *p, const tpk_array *Xr,
                                  const tpk_array *Xc, const tpk_gauss_ws *ws, tpk_array *K,
                                  tpk_array *Theta, double *kdiag, double *tdiag, double *err,
                                  tpk_ctx *ctx);

/* One tap convolution of a (position × position) block, the step between layers:
 * out[(p),(p')] = alpha Σ_t in[(p+t),(p'+t)] + beta over the rows×cols grid (P×P row-major,
 * P = rows·cols), by `method` (DIRECT or FFT; AUTO decides). Exposed for tests and benchmarks;
 * allocates its own workspace. in and out must not alias. */
TPK_API int tpk_cnn_conv_block(size_t rows, size_t cols, int kh, int kw, int padding, int method,
                               double alpha, double beta, const double *in, double *out,
                               tpk_ctx *ctx);

/* The same with its plan and workspace kept (a loop over many blocks: one per thread, since
 * the workspace is written). apply: in and out must not alias. */
typedef struct tpk_cnn_convws tpk_cnn_convws;
TPK_API tpk_cnn_convws *tpk_cnn_convws_alloc(size_t rows, size_t cols, int kh, int kw, int padding,
                                         int method, tpk_ctx *ctx);
TPK_API void tpk_cnn_convws_apply(tpk_cnn_convws *c, double alpha, double beta, const double *in,
                                double *out);
TPK_API void tpk_cnn_convws_free(tpk_cnn_convws *c);

/* One layer of the recursion on one input pair's block, for callers that chain layers
 * themselves (the rolled evaluator's pair programs, netsor/ewpair.c): out = alpha·taps(V_φ(in))
 * + beta over the rows×cols grid, in and out P×P (P = rows·cols, both triangles; they must not
 * alias), qa and qc the positions' variances of the two inputs (in's diagonals). Direct tap sums
 * stream the block plane by plane through L2, as tpk_cnn_kernel does; where the FFT is cheaper
 * (tpk_cnn_conv_prefers_fft) the map runs over the block and the FFT sums the taps. *err: the
 * map's error bound. The workspace is written: one per thread; channels: the most of
 * tpk_cnn_layer_first's inputs (1 if unused). */
typedef struct tpk_cnn_layerws tpk_cnn_layerws;
TPK_API tpk_cnn_layerws *tpk_cnn_layerws_alloc(size_t rows, size_t cols, int kh, int kw,
                                               int padding, size_t channels, tpk_ctx *ctx);
TPK_API int tpk_cnn_layer_apply(tpk_cnn_layerws *w, const tpk_phi *phi, const double *qa,
                                const double *qc, double alpha, double beta, const double *in,
                                double *out, const tpk_gauss_ws *ws, double *err, tpk_ctx *ctx);
/* The first layer from the inputs themselves: out = alpha/C · Σ_t ⟨x_a[p+t], x_c[q+t]⟩ + beta
 * (the taps of the inputs' Gram ⟨x_ap, x_cq⟩/C), x_a and x_c P×C row-major, as one product of
 * the pair's patches; C at most the workspace's channels. out NULL: the block is not made but
 * held for the next tpk_cnn_layer_apply with in NULL, which makes it plane by plane as its map
 * reads it (the first two layers in one pass). */
TPK_API int tpk_cnn_layer_first(tpk_cnn_layerws *w, const double *xa, const double *xc,
                                size_t channels, double alpha, double beta, double *out,
                                tpk_ctx *ctx);
TPK_API void tpk_cnn_layerws_free(tpk_cnn_layerws *w);

/* 1 when the FFT is expected to beat direct summation for this grid and filter: direct costs
 * (kh + kw) adds per entry (taps of size 1 cost nothing), the FFT about
 * c·log2(M)·M/P² add-equivalents per entry, M the (zero-extended) transform size, with c from
 * bench/bench_cnn.c's crossover table on the development machine (AVX-512, FFTW 3.3.10
 * ESTIMATE plans): one FFT entry·log2 costs ~6 direct adds on 1-D blocks, ~1.5 on 2-D blocks
 * (whose direct pass is strided). Measured crossovers: circular 1×256 at k ≈ 100, 16×16 at
 * 9×9..15×15, 28×28 at ~15×15..27×27; zero padding (transform 2^4× larger) never in range. */
/* 1 when GAP / LAP of these parameters are summed by shifts under TPK_CNN_POOL_AUTO: circular
 * padding, a GAP or LAP readout, and a smaller op-count estimate per pair than the (P×P) block
 * recursion (kernels/cnn.c, pool_cost; theory.md §2.8). Both count the same 2-D expectations per
 * shift and position for GAP; the estimate weighs the tap sums (direct, or the block's FFT), the
 * first layer (the block's patches product kh·kw·C per entry against a Gram of C and a box sum)
 * and the shift path's overheads (its map's row segments, the per-pair preparation of the
 * variances). The constants are operation counts, not measurements. */
TPK_API int tpk_cnn_pool_prefers_shifts(const tpk_cnn_params *p);

#define TPK_CNN_FFT_COST_1D 6.0
#define TPK_CNN_FFT_COST_2D 1.5
TPK_API int tpk_cnn_conv_prefers_fft(size_t rows, size_t cols, int kh, int kw, int padding);

#ifdef __cplusplus
}
#endif
#endif
