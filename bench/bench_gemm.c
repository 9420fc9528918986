/* Benchmark: tuned generated GEMM (tpk_gemm_tuned_d/s, gen/) against OpenBLAS, side by side in one
 * run, on 1 and 2 threads, square n³ and the executor's tall-skinny n×n·n×64 (issue 6 acceptance).
 *   bench_gemm [NMAX] [--no-naive]      sizes 1024..NMAX (default 4096, the range); --no-naive is accepted
 * Prints GFLOP/s (median of interleaved repeats), the ratio tuned/OpenBLAS, and which machine
 * class and kernel served (exact / nearest tuned shape / default; TPK_CLASS forces a class). Not a
 * test: no pass/fail. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tpk/gemm.h"
#include "tpk/machine.h"
#include "bench_util.h"

/* Interleaved tuned/OpenBLAS pairs, the median of each reported; which of the pair runs first
 * alternates. On the 2-core Zen 4 machine two timings of the very same OpenBLAS call (a cell
 * served by OpenBLAS) differed by up to 5 % with 5 pairs in a fixed order. */
#define REPEATS 9
#define MIN_REP_S 0.15    /* each repeat runs the call enough times to last this long */

static double load1(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1)
            l = -1;
        fclose(f);
    }
    return l;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct prob {
    int f32, nt;
    size_t m, n, k;
    void *A, *B, *C, *ws;
} prob;

static void call(const prob *p, int tuned)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    int m = (int)p->m, n = (int)p->n, k = (int)p->k;
    if (p->f32) {
        if (tuned)
            tpk_gemm_tuned_s(0, 0, p->m, p->n, p->k, 1.0f, p->A, p->k, p->B, p->n, 0.0f, p->C, p->n, p->nt, p->ws, &ctx);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, p->A, k, p->B, n, 0.0f, p->C, n);
    } else {
        if (tuned)
            tpk_gemm_tuned_d(0, 0, p->m, p->n, p->k, 1.0, p->A, p->k, p->B, p->n, 0.0, p->C, p->n, p->nt, p->ws, &ctx);
        else
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0, p->A, k, p->B, n, 0.0, p->C, n);
    }
    if (ctx.status)
        fprintf(stderr, "bench_gemm: %s\n", ctx.msg);
}

/* Seconds per call of one repeat. The pause first lets OpenBLAS's worker threads, which spin a
 * while after each call before they sleep, go idle: otherwise they compete with the next run. */
static double one_repeat(const prob *p, int tuned, long calls)
{
    struct timespec pause = {0, 200000000};
    nanosleep(&pause, NULL);
    double t = bench_now();
    for (long i = 0; i < calls; i++)
        call(p, tuned);
    return (bench_now() - t) / (double)calls;
}

static void bench(int f32, int nt, size_t m, size_t n, size_t k)
{
    size_t es = f32 ? 4 : 8;
    prob p = {f32, nt, m, n, k, NULL, NULL, NULL, NULL};
    p.A = aligned_alloc(64, (m * k * es + 63) / 64 * 64);
    p.B = aligned_alloc(64, (k * n * es + 63) / 64 * 64);
    p.C = aligned_alloc(64, (m * n * es + 63) / 64 * 64);
    size_t wsb = tpk_gemm_tuned_ws_size(f32, m, n, k, nt);
    p.ws = wsb ? aligned_alloc(64, wsb) : NULL;
    if (!p.A || !p.B || !p.C || (wsb && !p.ws)) {
        fprintf(stderr, "bench_gemm: out of memory at %zux%zux%zu\n", m, n, k);
        exit(1);
    }
    for (size_t i = 0; i < m * k; i++)
        f32 ? (void)(((float *)p.A)[i] = (float)((i % 17) * 0.0625 - 0.5)) : (void)(((double *)p.A)[i] = (i % 17) * 0.0625 - 0.5);
    for (size_t i = 0; i < k * n; i++)
        f32 ? (void)(((float *)p.B)[i] = (float)((i % 13) * 0.078125 - 0.5)) : (void)(((double *)p.B)[i] = (i % 13) * 0.078125 - 0.5);
    openblas_set_num_threads(nt);
    /* Warm-up both; calls per repeat from the warm-up time. */
    double tw[2];
    for (int w = 0; w < 2; w++) {
        double t = bench_now();
        call(&p, w);
        tw[w] = bench_now() - t;
    }
    long calls[2];
    for (int w = 0; w < 2; w++) {
        calls[w] = (long)ceil(MIN_REP_S / (tw[w] > 1e-9 ? tw[w] : 1e-9));
        if (calls[w] < 1)
            calls[w] = 1;
    }
    double t[2][REPEATS];
    for (int r = 0; r < REPEATS; r++)
        for (int x = 0; x < 2; x++) {
            const int w = x ^ (r & 1);
            t[w][r] = one_repeat(&p, w, calls[w]);
        }
    double gf[2];
    for (int w = 0; w < 2; w++) {
        qsort(t[w], REPEATS, sizeof t[w][0], cmp);
        gf[w] = 2.0 * (double)m * (double)n * (double)k / t[w][REPEATS / 2] * 1e-9;
    }
    const char *name;
    int how = tpk_gemm_tuned_choice(f32, m, n, k, nt, &name);
    static const char *hows[] = {"exact", "nearest", "default", "openblas"};
    int chow;
    const tpk_machine *cls = tpk_machine_select(&chow);
    printf("%sgemm %5zux%5zux%5zu  %d thr  OpenBLAS %7.1f  tuned %7.1f GFLOP/s  ratio %5.2f  (%s %s: %s)\n",
           f32 ? "s" : "d", m, n, k, nt, gf[0], gf[1], gf[1] / gf[0], how == TPK_GEMM_OPENBLAS ? "-" : cls ? cls->id : "none",
           hows[how], name);
    fflush(stdout);
    free(p.A);
    free(p.B);
    free(p.C);
    free(p.ws);
}

int main(int argc, char **argv)
{
    size_t nmax = 4096;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--no-naive") != 0 && atol(argv[i]) >= 1024)
            nmax = (size_t)atol(argv[i]);
    const char *ct = getenv("OPENBLAS_CORETYPE");
    int chow;
    const tpk_machine *cls = tpk_machine_select(&chow);
    printf("bench_gemm: OpenBLAS core %s (OPENBLAS_CORETYPE=%s), load average %.2f at start; sizes 1024..%zu\n"
           "bench_gemm: cpu %s, serving class %s (%s)\n",
           openblas_get_corename(), ct ? ct : "(unset)", load1(), nmax, tpk_machine_host_name(),
           cls ? cls->name : "none", tpk_machine_how_name(chow));
    for (int f32 = 0; f32 < 2; f32++)
        for (int nt = 1; nt <= 2; nt++) {
            for (size_t n = 1024; n <= nmax; n *= 2)
                bench(f32, nt, n, n, n);
            for (size_t n = 1024; n <= nmax; n *= 2)
                bench(f32, nt, n, 64, n);
        }
    printf("bench_gemm: load average %.2f at end (2 cores; > 2 means the numbers are disturbed)\n", load1());
    return 0;
}
