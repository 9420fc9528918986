/* Benchmark (issue 14): interpreter against direct recursion. The shipped NETSOR programs run by
 * the limit evaluator (its rolled form, netsor/flimit.c) beside the hand-written recursions of
 * the same kernels, in one process: MLP (kernels/mlp.c), MLP with layernorm (the recursion
 * written here over the library's whole-matrix map), CNN-2D with global average pooling
 * (kernels/cnn.c); the transformer's line is bench_transformer's. Each pair runs both, in
 * alternating order (bench_pairs); prints each side's best seconds, the median of the pairs'
 * ratios evaluator / direct (issue 14's and 20's goal: ≤ 1.1; the median, because this machine's
 * speed drifts between runs) beside the ratio of the bests, and the largest difference. Not a
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

static double maxdiff(const double *a, const double *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(a[i] - b[i]));
    return m;
}

/* reps pairs side by side (bench_pairs), then the line: the best of each side, the median of
 * the ratios, the difference of the kernels (Kd read after the runs) */
static void compare(const char *name, const char *size, bench_program *e, bench_fn direct, void *darg,
                    int reps, const double *const *Kd, size_t nk)
{
    double te, td, ratio;
    if (bench_pairs(bench_run_program, e, direct, darg, reps, &te, &td, &ratio)) {
        printf("%-10s failed\n", name);
        return;
    }
    printf("%-10s %-36s evaluator %7.3f s  direct %7.3f s  ratio %5.2f (best %4.2f)  "
           "max|diff| %.1e\n", name, size, te, td, ratio, te / td,
           e->K && *Kd ? maxdiff(e->K->data, *Kd, nk) : NAN);
}

typedef struct mlp_arg {
    const tpk_mlp_params *mp;
    const tpk_array *x;
    tpk_array *R;
    const double *K; /* R's data */
} mlp_arg;

/* Each side makes a new N × N kernel from the inputs, its array's first touch included: the
 * evaluator returns a fresh array, so the direct call gets a fresh one too (reusing one array
 * over the repetitions would leave its page faults, ~20 % of the run, out of one side only). */
static int run_mlp(void *v)
{
    mlp_arg *a = v;
    tpk_array_free(a->R);
    const size_t N = a->x->dims[0];
    a->R = tpk_array_alloc2(N, N, NULL);
    a->K = a->R ? a->R->data : NULL;
    return a->R == NULL || tpk_mlp_kernel(a->mp, a->x, NULL, NULL, a->R, NULL, NULL, NULL, NULL);
}

static void bench_mlp(void)
{
    const size_t N = 2048, d = 32;
    /* every parameter the direct recursion below uses, not the program's defaults */
    tpk_param_set s[] = {{"L", "8"}, {"sigma_w2", "2.0"}, {"sigma_b2", "0.1"},
                         {"sigma_v2", "2.0"}, {"sigma_ob2", "0.1"}};
    tpk_program *p = program("programs/mlp.nsr", NULL, s, 5);
    tpk_array *x = inputs(N, 1, d, 1);
    tpk_phi *relu = tpk_phi_alloc(reg, "relu", NULL);
    if (!p || !x || !relu)
        return;
    tpk_mlp_params mp = {.depth = 8, .phi = relu, .sigma_w2 = 2.0, .sigma_b2 = 0.1};
    bench_program e = {p, x, 0, NULL};
    mlp_arg m = {&mp, x, NULL, NULL};
    compare("mlp", "N=2048, d=32, depth 8, relu", &e, run_mlp, &m, 15, &m.K, N * N);
    tpk_array_free(e.K), tpk_array_free(m.R), tpk_array_free(x);
    tpk_phi_free(relu);
    tpk_program_free(p);
}

/* Σ¹ = σ_u² XXᵀ/d; per layer C = Σ/√((Σ_ii + ε)(Σ_jj + ε)) (the layernorm of a zero-mean
 * Gaussian, theory §2.6), M = V_relu(C), Σ ← σ_w² M; K = σ_v² M. */
typedef struct ln_arg {
    const tpk_array *x;
    const tpk_phi *relu;
    double *S, *dg;
} ln_arg;

static int run_mlp_ln(void *v)
{
    ln_arg *a = v;
    const size_t N = a->x->dims[0], d = a->x->dims[1];
    const int L = 8;
    const double eps = 1e-5;
    double *S = a->S, *dg = a->dg;
    for (size_t i = 0; i < N; i++)
        for (size_t j = 0; j < N; j++) {
            double g = 0;
            for (size_t q = 0; q < d; q++)
                g += a->x->data[i * d + q] * a->x->data[j * d + q];
            S[i * N + j] = 2.0 * g / (double)d;
        }
    for (int l = 0; l < L; l++) {
        for (size_t i = 0; i < N; i++)
            dg[i] = 1 / sqrt(S[i * N + i] + eps);
        for (size_t i = 0; i < N; i++)
            for (size_t j = 0; j < N; j++)
                S[i * N + j] *= dg[i] * dg[j];
        if (tpk_gauss_map(a->relu, S, N, S, NULL, NULL, NULL))
            return -1;
        if (l < L - 1)
            for (size_t i = 0; i < N * N; i++)
                S[i] *= 2.0;
    }
    return 0;
}

static void bench_mlp_ln(void)
{
    const size_t N = 2048, d = 32;
    /* every parameter the recursion below uses, not the program's defaults */
    tpk_param_set s[] = {{"L", "8"}, {"sigma_w2", "2.0"}, {"sigma_b2", "0.0"},
                         {"sigma_v2", "1.0"}, {"sigma_ob2", "0.0"}};
    tpk_program *p = program("programs/mlp-ln.nsr", NULL, s, 5);
    tpk_array *x = inputs(N, 1, d, 2);
    double *S = malloc(N * N * sizeof *S), *dg = malloc(N * sizeof *dg);
    tpk_phi *relu = tpk_phi_alloc(reg, "relu", NULL);
    if (!p || !x || !S || !dg || !relu)
        return;
    bench_program e = {p, x, 0, NULL};
    ln_arg a = {x, relu, S, dg};
    compare("mlp-ln", "N=2048, d=32, depth 8, relu", &e, run_mlp_ln, &a, 5,
            (const double *const *)&a.S, N * N);
    tpk_array_free(e.K), tpk_array_free(x);
    free(S), free(dg);
    tpk_phi_free(relu);
    tpk_program_free(p);
}

typedef struct cnn_arg {
    const tpk_cnn_params *cp;
    const tpk_array *x;
    tpk_array *D;
} cnn_arg;

static int run_cnn(void *v)
{
    cnn_arg *a = v;
    return tpk_cnn_kernel(a->cp, a->x, NULL, a->D, NULL, NULL);
}

static void bench_cnn(void)
{
    const size_t N = 8, R = 28, C = 28;
    tpk_param_set s[] = {{"rows", "28"}, {"cols", "28"}, {"L", "8"}};
    tpk_program *p = program("programs/cnn2d.nsr",
                             "output y_gap = readout(sum(r in 1..rows, s in 1..cols: h[L, r, s]) / "
                             "(rows * cols), sigma_v2, sigma_ob2)\n", s, 3);
    tpk_array *x = inputs(N, R * C, 1, 3), *D = tpk_array_alloc2(N, N, NULL);
    tpk_phi *relu = tpk_phi_alloc(reg, "relu", NULL);
    if (!p || !x || !D || !relu)
        return;
    tpk_cnn_params cp = {.rows = R, .cols = C, .channels = 1, .kh = 3, .kw = 3, .depth = 8,
                         .phi = relu, .sigma_u2 = 2, .sigma_w2 = 2, .sigma_b2 = 0, .sigma_v2 = 2,
                         .sigma_ob2 = 0, .padding = TPK_CNN_CIRCULAR, .readout = TPK_CNN_GAP,
                         .conv = TPK_CNN_CONV_AUTO};
    bench_program e = {p, x, 0, NULL};
    cnn_arg a = {&cp, x, D};
    compare("cnn2d-gap", "8 images 28x28x1, 3x3 circular, depth 8", &e, run_cnn, &a, 9,
            (const double *const *)&D->data, N * N);
    tpk_array_free(e.K), tpk_array_free(D), tpk_array_free(x);
    tpk_phi_free(relu);
    tpk_program_free(p);
}

int main(void)
{
    reg = tpk_job_registry(NULL);
    if (reg == NULL)
        return 1;
    printf("interpreter (rolled NETSOR program, limit evaluator) vs direct recursion, side by side\n"
           "(ratio: median of the pairs' evaluator/direct; best: ratio of the best times):\n");
    bench_mlp();
    bench_mlp_ln();
    bench_cnn();
    printf("(transformer: see bench_transformer)\n");
    tpk_phi_registry_free(reg);
    return 0;
}
