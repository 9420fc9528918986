/* Benchmark: CNN-2D NNGP with global average pooling on Fashion-MNIST (issue 4: 256 images,
 * depth 4) against a straightforward reference implementation of the same recursion, the
 * crossover of the tap convolution (direct summation vs FFTW) over grid and filter sizes, and the
 * flatten path's cost per layer-entry (NNGP, and with the NTK) beside an operation-count floor.
 * Not a test: no pass/fail. Usage: bench_cnn [--images=N] [--depth=L] [--no-naive] (other
 * arguments, such as the 4096 make bench passes to every benchmark, are ignored).
 * Default: the 256 images (a few minutes on 2 cores); --no-naive without --images (make
 * bench's second call, `BIN 4096 --no-naive`) runs 32 images, a short timing run. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tpk/cnn.h"
#include "tpk/idx.h"
#include "tpk/job.h"
#include "bench_util.h"

#define FASHION "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
#define REF_PAIRS 48 /* pairs the reference runs; its time is scaled to all pairs */

/* CPU seconds of the whole process (all threads): on a shared machine the wall time depends on
 * the other load, the CPU time much less; CPU/threads is the wall time on idle cores. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- crossover: one Q×Q block, direct vs FFT ------------------------------------------------ */

static double time_conv(size_t R, size_t S, int kh, int kw, int pad, int method, const double *in,
                        double *out)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        int iters = 0;
        double t0 = bench_now(), t;
        do {
            tpk_cnn_conv_block(R, S, kh, kw, pad, method, 1.0, 0.0, in, out, &ctx);
            iters++;
        } while ((t = bench_now() - t0) < 0.05);
        best = fmin(best, t / iters);
    }
    return best;
}

static void crossover(void)
{
    static const struct { size_t R, S; int k[6]; } grids[] = {
        {1, 64, {3, 9, 17, 33, 63, 0}}, {1, 256, {3, 9, 33, 65, 129, 255}},
        {8, 8, {3, 5, 7, 0}}, {16, 16, {3, 5, 9, 15, 0}}, {28, 28, {3, 5, 9, 15, 27, 0}}};
    printf("tap convolution of one (position x position) block, seconds per block "
           "(plans excluded; direct = separable summation)\n");
    printf("%-8s %-7s %-8s %11s %11s %8s %s\n", "grid", "filter", "padding", "direct", "fft",
           "fft/dir", "auto picks");
    for (size_t g = 0; g < sizeof grids / sizeof grids[0]; g++) {
        size_t R = grids[g].R, S = grids[g].S, Q = R * S;
        double *in = malloc(Q * Q * sizeof *in), *out = malloc(Q * Q * sizeof *out);
        for (size_t i = 0; i < Q * Q; i++)
            in[i] = sin(0.37 * (double)i + 0.1);
        for (int i = 0; i < 6 && grids[g].k[i]; i++)
            for (int pad = TPK_CNN_CIRCULAR; pad <= TPK_CNN_ZERO; pad++) {
                int k = grids[g].k[i], kh = R == 1 ? 1 : k, kw = k;
                double td = time_conv(R, S, kh, kw, pad, TPK_CNN_CONV_DIRECT, in, out);
                double tf = time_conv(R, S, kh, kw, pad, TPK_CNN_CONV_FFT, in, out);
                char gs[16], fs[16];
                snprintf(gs, sizeof gs, "%zux%zu", R, S);
                snprintf(fs, sizeof fs, "%dx%d", kh, kw);
                printf("%-8s %-7s %-8s %11.3e %11.3e %8.2f %s\n", gs, fs,
                       pad == TPK_CNN_CIRCULAR ? "circular" : "zero", td, tf, tf / td,
                       tpk_cnn_conv_prefers_fft(R, S, kh, kw, pad) ? "fft" : "direct");
            }
        free(in);
        free(out);
    }
}

/* ---- the straightforward reference: per pair, scalar closed form, every tap summed ---------- */

static double relu_e2(double q1, double q2, double k)
{
    double s = sqrt(q1 * q2);
    if (s == 0)
        return 0;
    double rho = k / s;
    rho = rho > 1 ? 1 : rho < -1 ? -1 : rho;
    double th = acos(rho);
    return s / (2 * M_PI) * (sin(th) + (M_PI - th) * rho);
}

/* Σ(a,c) blocks with circular padding, 3×3-style taps summed directly (kh·kw adds per entry). */
static void ref_conv(size_t R, size_t S, int k, double alpha, double beta, const double *in, double *out)
{
    const long Rl = (long)R, Sl = (long)S, Q = Rl * Sl, c = (k - 1) / 2;
    for (long r = 0; r < Rl; r++)
        for (long s = 0; s < Sl; s++)
            for (long r2 = 0; r2 < Rl; r2++)
                for (long s2 = 0; s2 < Sl; s2++) {
                    double acc = 0;
                    for (long i = 0; i < k; i++)
                        for (long j = 0; j < k; j++) {
                            long ra = (r + i - c + Rl) % Rl, sa = (s + j - c + Sl) % Sl;
                            long rc = (r2 + i - c + Rl) % Rl, sc = (s2 + j - c + Sl) % Sl;
                            acc += in[(ra * Sl + sa) * Q + rc * Sl + sc];
                        }
                    out[(r * Sl + s) * Q + r2 * Sl + s2] = alpha * acc + beta;
                }
}

/* GAP kernel entries of `npairs` pairs (a ≥ c, row-major) by the plain recursion: per-image
 * position-diagonal variances (the closed diagonal recursion), then per pair the cross block.
 * Returns seconds. */
static double reference(const double *X, size_t N, size_t R, size_t S, int k, int L, size_t npairs,
                        double *Kref, double *cpu_s)
{
    const double c0cpu = cpu_now();
    const size_t Q = R * S;
    const double sw2 = 2.0, taps = (double)k * k;
    const long c0 = (k - 1) / 2;
    double t0 = bench_now();
    size_t nimg = 0;
    while (nimg * (nimg + 1) / 2 < npairs)
        nimg++;
    nimg = nimg < N ? nimg : N;
    double *q = malloc((size_t)L * nimg * Q * sizeof *q);
#pragma omp parallel for
    for (size_t a = 0; a < nimg; a++) {
        double u[Q];
        for (size_t i = 0; i < Q; i++)
            u[i] = X[a * Q + i] * X[a * Q + i];
        for (int l = 0; l < L; l++) {
            double *cur = q + ((size_t)l * nimg + a) * Q;
            for (long r = 0; r < (long)R; r++)
                for (long s = 0; s < (long)S; s++) {
                    double acc = 0;
                    for (long i = 0; i < k; i++)
                        for (long j = 0; j < k; j++)
                            acc += u[((r + i - c0 + (long)R) % (long)R) * (long)S + (s + j - c0 + (long)S) % (long)S];
                    cur[r * (long)S + s] = sw2 / taps * acc;
                }
            for (size_t i = 0; i < Q; i++)
                u[i] = relu_e2(cur[i], cur[i], cur[i]);
        }
    }
#pragma omp parallel
    {
        double *A = malloc(Q * Q * sizeof *A), *B = malloc(Q * Q * sizeof *B);
#pragma omp for schedule(dynamic, 1)
        for (size_t p = 0; p < npairs; p++) {
            size_t a = 0;
            while ((a + 1) * (a + 2) / 2 <= p)
                a++;
            size_t c = p - a * (a + 1) / 2;
            const double *xa = X + a * Q, *xc = X + c * Q;
            for (size_t i = 0; i < Q; i++)
                for (size_t j = 0; j < Q; j++)
                    B[i * Q + j] = xa[i] * xc[j];
            ref_conv(R, S, k, sw2 / taps, 0.0, B, A);
            for (int l = 0; l < L; l++) {
                const double *qa = q + ((size_t)l * nimg + a) * Q, *qc = q + ((size_t)l * nimg + c) * Q;
                for (size_t i = 0; i < Q; i++)
                    for (size_t j = 0; j < Q; j++)
                        B[i * Q + j] = relu_e2(qa[i], qc[j], A[i * Q + j]);
                if (l + 1 < L)
                    ref_conv(R, S, k, sw2 / taps, 0.0, B, A);
                else
                    memcpy(A, B, Q * Q * sizeof *A);
            }
            double s = 0;
            for (size_t i = 0; i < Q * Q; i++)
                s += A[i];
            Kref[p] = sw2 * s / (double)(Q * Q);
        }
        free(A);
        free(B);
    }
    free(q);
    *cpu_s = cpu_now() - c0cpu;
    return bench_now() - t0;
}

int main(int argc, char **argv)
{
    /* The size: 256 images, depth 4 (32896 pairs; kernels/cnn.c's direct path streams
     * each layer plane by plane, ~10 ms of one core per pair). */
    size_t N = 256;
    int L = 4, naive = 1, images_set = 0;
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "--images=", 9) == 0) {
            N = (size_t)atol(argv[i] + 9);
            images_set = 1;
        } else if (strncmp(argv[i], "--depth=", 8) == 0) {
            L = atoi(argv[i] + 8);
        } else if (strcmp(argv[i], "--no-naive") == 0) {
            naive = 0;
        }
    }
    if (!naive && !images_set)
        N = 32; /* make bench's second call: a short run, not the full size again */
    crossover();

    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_array *X = tpk_idx_read(FASHION, N, &ctx);
    const char *src = "Fashion-MNIST train images " FASHION;
    if (X) {
        for (size_t i = 0; i < tpk_array_size(X); i++)
            X->data[i] /= 255.0;
    } else {
        /* no dataset: synthetic 28×28 images, said so in the output */
        size_t dims[3] = {N, 28, 28};
        tpk_ctx_init(&ctx);
        X = tpk_array_alloc(3, dims, &ctx);
        for (size_t i = 0; i < tpk_array_size(X); i++)
            X->data[i] = 0.5 + 0.5 * sin(0.731 * (double)i + 0.01 * (double)(i / 784));
        src = "SYNTHETIC 28x28 images (Fashion-MNIST not installed)";
    }
    N = X->dims[0];
    const size_t R = X->dims[1], S = X->dims[2];
    tpk_phi_registry *reg = tpk_job_registry(&ctx);
    tpk_phi *relu = tpk_phi_alloc(reg, "relu", &ctx);
    tpk_cnn_params p = {.rows = R, .cols = S, .channels = 1, .kh = 3, .kw = 3, .depth = L,
                        .phi = relu, .sigma_u2 = 2, .sigma_w2 = 2, .sigma_b2 = 0, .sigma_v2 = 2,
                        .sigma_ob2 = 0, .padding = TPK_CNN_CIRCULAR, .readout = TPK_CNN_GAP,
                        .conv = TPK_CNN_CONV_AUTO};
    tpk_array *K = tpk_array_alloc2(N, N, &ctx);
    printf("\nCNN-2D + GAP NNGP: %zu images %zux%zu (%s), depth %d, 3x3 circular, relu, %d threads\n",
           N, R, S, src, L, omp_get_max_threads());
    double t0 = bench_now(), c0 = cpu_now(), err = 0;
    if (tpk_cnn_kernel(&p, X, NULL, K, &err, &ctx)) {
        fprintf(stderr, "bench_cnn: %s\n", ctx.msg);
        return 1;
    }
    double t = bench_now() - t0, tc = cpu_now() - c0, npairs = (double)N * (N + 1) / 2;
    const int nth = omp_get_max_threads();
    printf("tpk_cnn_kernel: %.2f s (%.3g s per pair of images, %.0f pairs), error estimate %.1e\n"
           "  CPU %.1f s (%.3g s per pair on one core; %.0f s on %d idle cores)\n",
           t, t / npairs, npairs, err, tc, tc / npairs, tc / nth, nth);
    if (N != 256)
        printf("  -> 256 images (32896 pairs) at this rate: %.0f s\n", t / npairs * 32896.0);
    if (naive) {
        size_t m = REF_PAIRS < (size_t)npairs ? REF_PAIRS : (size_t)npairs;
        double *Kref = malloc(m * sizeof *Kref);
        double trc = 0, tr = reference(X->data, N, R, S, 3, L, m, Kref, &trc);
        double worst = 0;
        for (size_t q = 0; q < m; q++) {
            size_t a = 0;
            while ((a + 1) * (a + 2) / 2 <= q)
                a++;
            size_t c = q - a * (a + 1) / 2;
            worst = fmax(worst, fabs(Kref[q] - K->data[a * N + c]) / fabs(K->data[a * N + c]));
        }
        double full = tr / (double)m * npairs;
        printf("reference (plain loops, 9-tap direct sums, scalar closed form): %.3g s per pair "
               "(timed on %zu pairs) -> %.1f s for all pairs; ratio %.1fx; max rel. difference %.1e\n"
               "  CPU: reference %.3g s per pair, tpk_cnn_kernel %.3g s per pair: ratio %.1fx\n",
               tr / (double)m, m, full, full / t, worst, trc / (double)m, tc / npairs,
               (trc / (double)m) / (tc / npairs));
        free(Kref);
    }
    /* The flatten path (issue 37): the cost per layer-entry (one kernel entry, unordered pair,
     * through one layer: P positions of two maps' worth of work for the NTK, one for the NNGP),
     * beside a floor from operation counts: per position one closed-form 2-D expectation
     * (FLAT_MAP_FLOPS: an arcsine polynomial, a square root, ~8 products) and the 3×3 box sum's
     * 2 + 2 adds and an affine step, at 16 double lanes a cycle per core (AVX-512 FMA) and the
     * nominal clock FLAT_GHZ. Both are estimates of this machine class, not measurements. */
    {
        const double FLAT_MAP_FLOPS = 40.0, FLAT_BOX_FLOPS = 6.0, FLAT_GHZ = 2.6, LANES = 16.0;
        tpk_cnn_params pf = p;
        pf.readout = TPK_CNN_FLATTEN;
        pf.depth = 8;
        tpk_array *Kf = tpk_array_alloc2(N, N, &ctx), *Tf = tpk_array_alloc2(N, N, &ctx);
        for (int ntk = 0; ntk <= 1 && Kf && Tf; ntk++) {
            double tb = bench_now();
            if (tpk_cnn_kernels(&pf, X, NULL, Kf, ntk ? Tf : NULL, NULL, &ctx)) {
                fprintf(stderr, "bench_cnn: %s\n", ctx.msg);
                return 1;
            }
            const double tf = bench_now() - tb, le = npairs * pf.depth;
            const double flops = (double)(R * S) * ((1 + ntk) * (FLAT_MAP_FLOPS + FLAT_BOX_FLOPS));
            const double floor_s = flops / (LANES * FLAT_GHZ * 1e9 * nth);
            printf("flatten %s, depth %d: %.2f s, %.3g us per layer-entry (%.0f pairs x %d "
                   "layers); floor by operation counts %.3g us (%.0fx above it)\n",
                   ntk ? "NNGP + NTK" : "NNGP", pf.depth, tf, tf / le * 1e6, npairs, pf.depth,
                   floor_s * 1e6, (tf / le) / floor_s);
        }
        tpk_array_free(Kf);
        tpk_array_free(Tf);
    }
    tpk_array_free(K);
    tpk_array_free(X);
    tpk_phi_free(relu);
    tpk_phi_registry_free(reg);
    return 0;
}
