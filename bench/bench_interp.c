/* Benchmark (issue 14): interpreter against direct recursion. The shipped NETSOR programs run by
 * the limit evaluator (its rolled form, netsor/flimit.c) beside the hand-written recursions of
 * the same kernels, in one process: MLP (kernels/mlp.c), MLP with layernorm (the recursion
 * written here over the library's whole-matrix map), CNN-2D with global average pooling
 * (kernels/cnn.c); the transformer's line is bench_transformer's. Prints seconds (best of 3),
 * the ratio evaluator / direct (issue 14's goal: ≤ 1.1) and the largest difference. Not a
 * test: no pass/fail. Arguments (`BIN 4096 --no-naive` from scripts/run-bench.sh) are
 * accepted and ignored. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpk/cnn.h"
#include "tpk/job.h"
#include "tpk/kernels.h"
#include "tpk/netsor.h"
#include "bench_util.h"

static tpk_phi_registry *reg;

static tpk_array *inputs(size_t N, size_t T, size_t d, unsigned seed)
{
    size_t dims[3] = {N, T, d};
    tpk_array *x = T > 1 ? tpk_array_alloc(3, dims, NULL) : tpk_array_alloc2(N, d, NULL);
    srand(seed);
    for (size_t i = 0; x && i < tpk_array_size(x); i++) {
        double u1 = (rand() + 1.0) / ((double)RAND_MAX + 2.0), u2 = rand() / (double)RAND_MAX;
        x->data[i] = sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
    }
    return x;
}

static tpk_program *program(const char *rel, const char *append, const tpk_param_set *s, int n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", getenv("TPK_ROOT") ? getenv("TPK_ROOT") : ".", rel);
    tpk_netsor_opts o = {.sets = s, .nsets = n, .netsor_plus = 1, .append = append};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_program *p = tpk_netsor_load_file(path, &o, reg, &ctx);
    if (p == NULL)
        fprintf(stderr, "%s: %s\n", path, ctx.msg);
    return p;
}

/* best of 3 seconds of the evaluator; K kept from the last run */
static double time_program(const tpk_program *p, const tpk_array *x, tpk_array **K)
{
    double best = INFINITY;
    for (int r = 0; r < 3; r++) {
        tpk_array_free(*K);
        *K = NULL;
        double t = bench_now();
        if (tpk_netsor_kernel(p, x, 0, K, NULL, NULL))
            return NAN;
        best = fmin(best, bench_now() - t);
    }
    return best;
}

static double maxdiff(const double *a, const double *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(a[i] - b[i]));
    return m;
}

static void line(const char *name, const char *size, double te, double td, double diff)
{
    printf("%-10s %-36s evaluator %7.3f s  direct %7.3f s  ratio %5.2f  max|diff| %.1e\n", name,
           size, te, td, te / td, diff);
}

static void bench_mlp(void)
{
    const size_t N = 2048, d = 32;
    tpk_param_set s[] = {{"L", "8"}, {"sigma_v2", "2.0"}, {"sigma_ob2", "0.1"}};
    tpk_program *p = program("programs/mlp.nsr", NULL, s, 3);
    tpk_array *x = inputs(N, 1, d, 1), *K = NULL, *R = NULL;
    tpk_phi *relu = tpk_phi_alloc(reg, "relu", NULL);
    if (!p || !x || !relu)
        return;
    double te = time_program(p, x, &K), td = INFINITY;
    tpk_mlp_params mp = {.depth = 8, .phi = relu, .sigma_w2 = 2.0, .sigma_b2 = 0.1};
    /* Each side makes a new N × N kernel from the inputs, its array's first touch included: the
     * evaluator returns a fresh array, so the direct call gets a fresh one too (reusing one
     * array over the repetitions would leave its page faults, ~20 % of the run, out of one
     * side only). */
    for (int r = 0; r < 3; r++) {
        tpk_array_free(R);
        double t = bench_now();
        R = tpk_array_alloc2(N, N, NULL);
        if (R == NULL || tpk_mlp_kernel(&mp, x, NULL, NULL, R, NULL, NULL, NULL, NULL))
            return;
        td = fmin(td, bench_now() - t);
    }
    line("mlp", "N=2048, d=32, depth 8, relu", te, td, K ? maxdiff(K->data, R->data, N * N) : NAN);
    tpk_array_free(K), tpk_array_free(R), tpk_array_free(x);
    tpk_phi_free(relu);
    tpk_program_free(p);
}

/* Σ¹ = σ_u² XXᵀ/d; per layer C = Σ/√((Σ_ii + ε)(Σ_jj + ε)) (the layernorm of a zero-mean
 * Gaussian, theory §2.6), M = V_relu(C), Σ ← σ_w² M; K = σ_v² M. */
static void bench_mlp_ln(void)
{
    const size_t N = 2048, d = 32;
    const int L = 8;
    const double eps = 1e-5;
    tpk_param_set s[] = {{"L", "8"}};
    tpk_program *p = program("programs/mlp-ln.nsr", NULL, s, 1);
    tpk_array *x = inputs(N, 1, d, 2), *K = NULL;
    double *S = malloc(N * N * sizeof *S), *dg = malloc(N * sizeof *dg);
    tpk_phi *relu = tpk_phi_alloc(reg, "relu", NULL);
    if (!p || !x || !S || !dg || !relu)
        return;
    double te = time_program(p, x, &K), td = INFINITY;
    for (int r = 0; r < 3; r++) {
        double t = bench_now();
        for (size_t i = 0; i < N; i++)
            for (size_t j = 0; j < N; j++) {
                double a = 0;
                for (size_t q = 0; q < d; q++)
                    a += x->data[i * d + q] * x->data[j * d + q];
                S[i * N + j] = 2.0 * a / (double)d;
            }
        for (int l = 0; l < L; l++) {
            for (size_t i = 0; i < N; i++)
                dg[i] = 1 / sqrt(S[i * N + i] + eps);
            for (size_t i = 0; i < N; i++)
                for (size_t j = 0; j < N; j++)
                    S[i * N + j] *= dg[i] * dg[j];
            tpk_gauss_map(relu, S, N, S, NULL, NULL, NULL);
            if (l < L - 1)
                for (size_t i = 0; i < N * N; i++)
                    S[i] *= 2.0;
        }
        td = fmin(td, bench_now() - t);
    }
    line("mlp-ln", "N=2048, d=32, depth 8, relu", te, td, K ? maxdiff(K->data, S, N * N) : NAN);
    tpk_array_free(K), tpk_array_free(x);
    free(S), free(dg);
    tpk_phi_free(relu);
    tpk_program_free(p);
}

static void bench_cnn(void)
{
    const size_t N = 8, R = 28, C = 28;
    tpk_param_set s[] = {{"rows", "28"}, {"cols", "28"}, {"L", "8"}};
    tpk_program *p = program("programs/cnn2d.nsr",
                             "output y_gap = readout(sum(r in 1..rows, s in 1..cols: h[L, r, s]) / "
                             "(rows * cols), sigma_v2, sigma_ob2)\n", s, 3);
    tpk_array *x = inputs(N, R * C, 1, 3), *K = NULL, *D = tpk_array_alloc2(N, N, NULL);
    tpk_phi *relu = tpk_phi_alloc(reg, "relu", NULL);
    if (!p || !x || !D || !relu)
        return;
    double te = time_program(p, x, &K), td = INFINITY;
    tpk_cnn_params cp = {.rows = R, .cols = C, .channels = 1, .kh = 3, .kw = 3, .depth = 8,
                         .phi = relu, .sigma_u2 = 2, .sigma_w2 = 2, .sigma_b2 = 0, .sigma_v2 = 2,
                         .sigma_ob2 = 0, .padding = TPK_CNN_CIRCULAR, .readout = TPK_CNN_GAP,
                         .conv = TPK_CNN_CONV_AUTO};
    for (int r = 0; r < 3; r++) {
        double t = bench_now();
        tpk_cnn_kernel(&cp, x, NULL, D, NULL, NULL);
        td = fmin(td, bench_now() - t);
    }
    line("cnn2d-gap", "8 images 28x28x1, 3x3 circular, depth 8", te, td,
         K ? maxdiff(K->data, D->data, N * N) : NAN);
    tpk_array_free(K), tpk_array_free(D), tpk_array_free(x);
    tpk_phi_free(relu);
    tpk_program_free(p);
}

int main(void)
{
    reg = tpk_job_registry(NULL);
    if (reg == NULL)
        return 1;
    printf("interpreter (rolled NETSOR program, limit evaluator) vs direct recursion, best of 3:\n");
    bench_mlp();
    bench_mlp_ln();
    bench_cnn();
    printf("(transformer: see bench_transformer)\n");
    tpk_phi_registry_free(reg);
    return 0;
}
