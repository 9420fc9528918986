/* Benchmark: the tuner's generated ReLU NNGP map (tpk_relu_map_tuned_d/s, gen/tpk_map_cpu_ID.c) against
 * the library's reference map (kernels/gauss_map.c under TPK_MAP=reference) and the library path
 * with the tuned kernel in place, with OpenBLAS dsyrk/ssyrk (k = 1, beta = 1: it reads and writes
 * the same lower triangle, the memory traffic of an in-place map) as a floor, and the mirrored
 * library map (tpk_gauss_map_affine) both ways; side by side in one run, on 1 and 2 threads.
 *   bench_map [N] [--no-naive]      N default 4096; --no-naive is accepted and ignored
 * Prints milliseconds per call (median of interleaved repeats), G entries/s, and the kernel that
 * served. Not a test: no pass/fail. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpk/gauss.h"
#include "tpk/map.h"
#include "bench_util.h"

#define REPEATS 5      /* interleaved rounds; the median of each contender is reported */
#define MIN_REP_S 0.1  /* each round runs a contender enough times to last this long */

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

enum { C_TUNED, C_LIB_TUNED, C_LIB_REF, C_MIR_TUNED, C_MIR_REF, C_SYRK, C_TUNED_S, C_SYRK_S, NC };
static const char *const cname[NC] = {"tuned map f64 (tpk_relu_map_tuned_d)", "gauss_map relu, tuned kernel",
                                      "gauss_map relu, TPK_MAP=reference", "gauss_map_affine (mirrored), TPK_MAP=tuned",
                                      "gauss_map_affine (mirrored), =reference", "OpenBLAS dsyrk k=1 (floor)",
                                      "tuned map f32 (tpk_relu_map_tuned_s)", "OpenBLAS ssyrk k=1 (floor)"};

typedef struct bench {
    size_t n;
    int nt;
    double *S, *O, *x;
    float *Sf, *Of, *xf;
    const tpk_phi *relu;
    void *ws, *wsf;
    tpk_ctx ctx;
} bench;

static void run(bench *b, int c)
{
    const size_t n = b->n;
    switch (c) {
    case C_TUNED:
        tpk_relu_map_tuned_d(n, b->S, n, 1.6, 0.1, b->O, n, b->nt, b->ws, NULL, &b->ctx);
        break;
    case C_LIB_TUNED:
    case C_LIB_REF:
        setenv("TPK_MAP", c == C_LIB_REF ? "reference" : "tuned", 1);
        tpk_gauss_map_affine_lower(b->relu, b->S, n, 1.6, 0.1, b->O, NULL, NULL, &b->ctx);
        break;
    case C_MIR_TUNED:
    case C_MIR_REF:
        setenv("TPK_MAP", c == C_MIR_REF ? "reference" : "tuned", 1);
        tpk_gauss_map_affine(b->relu, b->S, n, 1.6, 0.1, b->O, NULL, NULL, &b->ctx);
        break;
    case C_SYRK:
        cblas_dsyrk(CblasRowMajor, CblasLower, CblasNoTrans, (int)n, 1, 1e-9, b->x, 1, 1.0, b->O, (int)n);
        break;
    case C_TUNED_S:
        tpk_relu_map_tuned_s(n, b->Sf, n, 1.6f, 0.1f, b->Of, n, b->nt, b->wsf, NULL, &b->ctx);
        break;
    default:
        cblas_ssyrk(CblasRowMajor, CblasLower, CblasNoTrans, (int)n, 1, 1e-9f, b->xf, 1, 1.0f, b->Of, (int)n);
        break;
    }
}

int main(int argc, char **argv)
{
    size_t n = 4096;
    if (argc > 1 && strncmp(argv[1], "--", 2) != 0)
        n = (size_t)strtoull(argv[1], NULL, 10);
    if (n < 16)
        n = 16;
    bench b;
    memset(&b, 0, sizeof b);
    b.n = n;
    tpk_ctx_init(&b.ctx);
    tpk_phi_registry *reg = tpk_phi_registry_alloc(&b.ctx);
    tpk_phi *relu = reg ? tpk_phi_alloc(reg, "relu", &b.ctx) : NULL;
    b.relu = relu;
    b.S = malloc(n * n * sizeof *b.S);
    b.O = malloc(n * n * sizeof *b.O);
    b.Sf = malloc(n * n * sizeof *b.Sf);
    b.Of = malloc(n * n * sizeof *b.Of);
    b.x = malloc(n * sizeof *b.x);
    b.xf = malloc(n * sizeof *b.xf);
    if (!relu || !b.S || !b.O || !b.Sf || !b.Of || !b.x || !b.xf) {
        fprintf(stderr, "bench_map: setup failed: %s\n", b.ctx.msg);
        return 1;
    }
    /* a valid covariance: S_ij = √(q_i q_j)·cos(t_i − t_j) (rank 2, ρ over all of [−1, 1]) */
    for (size_t i = 0; i < n; i++) {
        b.x[i] = 1e-3 * (double)(i % 7);
        b.xf[i] = (float)b.x[i];
    }
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            double qi = 0.5 + (double)(i % 13) / 7, qj = 0.5 + (double)(j % 13) / 7;
            b.S[i * n + j] = sqrt(qi * qj) * cos(0.0137 * (double)i - 0.0137 * (double)j);
            b.Sf[i * n + j] = (float)b.S[i * n + j];
        }
    printf("bench_map: N = %zu, lower triangle %.2f M entries; OpenBLAS %s\n", n, (double)n * (n + 1) / 2e6,
           openblas_get_corename());
    for (int nt = 1; nt <= 2; nt++) {
        b.nt = nt;
        omp_set_num_threads(nt);
        openblas_set_num_threads(nt);
        free(b.ws);
        free(b.wsf);
        b.ws = aligned_alloc(64, tpk_relu_map_tuned_ws_size(0, n, nt));
        b.wsf = aligned_alloc(64, tpk_relu_map_tuned_ws_size(1, n, nt));
        const char *kd = NULL, *ks = NULL;
        unsetenv("TPK_MAP");
        int hd = tpk_relu_map_tuned_choice(0, n, nt, &kd), hs = tpk_relu_map_tuned_choice(1, n, nt, &ks);
        static const char *const how[] = {"exact", "nearest", "default", "reference"};
        double t[NC][REPEATS];
        long calls[NC];
        for (int c = 0; c < NC; c++) { /* warm-up and calls per round */
            double t0 = bench_now();
            run(&b, c);
            double dt = bench_now() - t0;
            calls[c] = (long)ceil(MIN_REP_S / (dt > 1e-6 ? dt : 1e-6));
        }
        for (int r = 0; r < REPEATS; r++)
            for (int c = 0; c < NC; c++) {
                double t0 = bench_now();
                for (long k = 0; k < calls[c]; k++)
                    run(&b, c);
                t[c][r] = (bench_now() - t0) / (double)calls[c];
            }
        unsetenv("TPK_MAP");
        printf("-- %d thread(s); f64 kernel %s (%s), f32 kernel %s (%s)\n", nt, kd, how[hd], ks, how[hs]);
        double med[NC];
        for (int c = 0; c < NC; c++) {
            qsort(t[c], REPEATS, sizeof t[c][0], cmp);
            med[c] = t[c][REPEATS / 2];
            printf("   %-40s %9.3f ms  %6.3f G entries/s\n", cname[c], 1e3 * med[c], (double)n * (n + 1) / 2 / med[c] * 1e-9);
        }
        printf("   ratios: reference/tuned f64 %.2f, library tuned/reference %.2f (mirrored %.2f), tuned/dsyrk "
               "floor %.2f, f32 tuned/ssyrk floor %.2f\n", med[C_LIB_REF] / med[C_TUNED], med[C_LIB_TUNED] / med[C_LIB_REF],
               med[C_MIR_TUNED] / med[C_MIR_REF], med[C_TUNED] / med[C_SYRK], med[C_TUNED_S] / med[C_SYRK_S]);
    }
    tpk_phi_free(relu);
    tpk_phi_registry_free(reg);
    free(b.S), free(b.O), free(b.Sf), free(b.Of), free(b.x), free(b.xf), free(b.ws), free(b.wsf);
    return 0;
}
