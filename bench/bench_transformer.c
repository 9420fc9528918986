/* Benchmark: the transformer kernel (theory.md §2.7) — programs/transformer.nsr run by the limit
 * evaluator against a straightforward direct implementation of the same recursion and against
 * the library's (tpk_transformer_kernel, what gpkernel --arch=transformer runs) — at 64
 * sequences of 16 tokens, depth 4, over all tokens (1024 × 1024). Prints seconds, the ratios and
 * the largest differences. Not a test: no pass/fail. Arguments (`BIN 4096 --no-naive` from
 * scripts/run-bench.sh) are accepted and ignored. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpk/job.h"
#include "tpk/kernels.h"
#include "tpk/netsor.h"
#include "bench_util.h"

enum { NS = 64, T = 16, D = 8, L = 4, M = NS * T };

static double relu_e2(double q1, double q2, double k)
{
    double s = sqrt(q1 * q2);
    if (s == 0.0)
        return 0.0;
    double r = fmax(-1.0, fmin(1.0, k / s)), th = acos(r);
    return s / (2.0 * M_PI) * (sin(th) + (M_PI - th) * r);
}

/* The recursion written directly (program defaults: all variances 1, biases 0, temp 1,
 * ε = 1e-12): per layer Σ^k = Σ^z, A_b = causal softmax of each sequence's block,
 * R_bc = (I + A_b) Σ^k_bc (I + A_c)ᵀ block by block, LN, ReLU FFN + residual, LN. */
static void direct(const double *x, double *Z, double *B, double *R, double *tmp)
{
    const double eps = 1e-12;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < M; j++) {
            double g = 0;
            for (int k = 0; k < D; k++)
                g += x[i * D + k] * x[j * D + k];
            Z[i * M + j] = g / D;
        }
    for (int l = 0; l < L; l++) {
        for (int b = 0; b < NS; b++) /* B_b = I + softmax rows, T × T per sequence */
            for (int i = 0; i < T; i++) {
                const double *s = Z + (b * T + i) * M + b * T;
                double *o = B + (b * T + i) * T, mx = -INFINITY, z = 0;
                for (int j = 0; j <= i; j++)
                    mx = fmax(mx, s[j]);
                for (int j = 0; j < T; j++)
                    z += (o[j] = j <= i ? exp(s[j] - mx) : 0.0);
                for (int j = 0; j < T; j++)
                    o[j] /= z;
                o[i] += 1.0;
            }
        for (int b = 0; b < NS; b++) /* R = B Σ Bᵀ by blocks: tmp = B_b Σ_b·, R_bc = tmp_c B_cᵀ */
            for (int i = 0; i < T; i++) {
                double *t = tmp + (b * T + i) * M;
                memset(t, 0, M * sizeof *t);
                for (int j = 0; j < T; j++) {
                    double w = B[(b * T + i) * T + j];
                    const double *z = Z + (b * T + j) * M;
                    for (int c = 0; c < M; c++)
                        t[c] += w * z[c];
                }
            }
        for (int r = 0; r < M; r++)
            for (int c = 0; c < NS; c++)
                for (int k = 0; k < T; k++) {
                    double s = 0;
                    for (int j = 0; j < T; j++)
                        s += tmp[r * M + c * T + j] * B[(c * T + k) * T + j];
                    R[r * M + c * T + k] = s;
                }
        for (int i = 0; i < M; i++) /* LN → K^h (into Z), FFN + residual → Q (into R) */
            for (int j = 0; j < M; j++)
                Z[i * M + j] = R[i * M + j] / sqrt((R[i * M + i] + eps) * (R[j * M + j] + eps));
        for (int i = 0; i < M; i++)
            for (int j = 0; j < M; j++)
                R[i * M + j] = relu_e2(Z[i * M + i], Z[j * M + j], Z[i * M + j]) + Z[i * M + j];
        for (int i = 0; i < M; i++)
            for (int j = 0; j < M; j++)
                Z[i * M + j] = R[i * M + j] / sqrt((R[i * M + i] + eps) * (R[j * M + j] + eps));
    }
}

/* The library's side of the pairs (bench_pairs; the evaluator's is bench_run_program): its
 * direct recursion, keeping its last kernel. */
typedef struct lib_arg {
    const tpk_transformer_params *tp;
    const tpk_array *x;
    tpk_array *K;
} lib_arg;

static int run_lib(void *v)
{
    lib_arg *l = v;
    tpk_array_free(l->K);
    l->K = NULL;
    return tpk_transformer_kernel(l->tp, l->x, 1, NULL, NULL, &l->K, NULL, NULL);
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_job_registry(&ctx);
    char prog[4200];
    tpk_shipped_path("programs/transformer.nsr", prog, sizeof prog);
    tpk_param_set sets[] = {{"L", "4"}, {"T", "16"}};
    tpk_netsor_opts o = {.sets = sets, .nsets = 2};
    double t0 = bench_now();
    tpk_program *p = reg ? tpk_netsor_load_file(prog, &o, reg, &ctx) : NULL;
    double tload = bench_now() - t0;
    size_t dims[3] = {NS, T, D};
    tpk_array *x = p ? tpk_array_alloc(3, dims, &ctx) : NULL;
    double *Z = malloc((size_t)M * M * sizeof *Z), *R = malloc((size_t)M * M * sizeof *R);
    double *tmp = malloc((size_t)M * M * sizeof *tmp), *B = malloc((size_t)M * T * sizeof *B);
    if (!x || !Z || !R || !tmp || !B) {
        fprintf(stderr, "bench_transformer: %s\n", ctx.msg[0] ? ctx.msg : "out of memory");
        return 1;
    }
    for (size_t i = 0; i < tpk_array_size(x); i++) /* tokens: deterministic, varied */
        x->data[i] = sin(0.37 * (double)i + 1.3 * (double)(i % D)) + 0.3 * cos(0.011 * (double)i * (double)i);
    double best_e = 1e30, best_d = 1e30, best_l = 1e30, diff = 0, diff_l = 0, ratio = 0;
    tpk_phi *relu = tpk_phi_alloc(reg, "relu", &ctx);
    const tpk_transformer_params tp = {.depth = L, .phi = relu, .var_e = 1, .var_u = 1, .var_w = 1,
                                       .var_b = 0, .temp = 1, .eps = 1e-12, .sigma_v2 = 1};
    for (int rep = 0; rep < 3; rep++) { /* the plain recursion: the reference and its time */
        t0 = bench_now();
        direct(x->data, Z, B, R, tmp);
        best_d = fmin(best_d, bench_now() - t0);
    }
    bench_program e = {p, x, 1, NULL};
    lib_arg l = {&tp, x, NULL};
    if (bench_pairs(bench_run_program, &e, run_lib, &l, 21, &best_e, &best_l, &ratio)) {
        fprintf(stderr, "bench_transformer: %s\n", ctx.msg);
        return 1;
    }
    tpk_array *K = e.K, *Kl = l.K;
    for (size_t i = 0; i < (size_t)M * M; i++)
        diff_l = fmax(diff_l, fabs(Kl->data[i] - Z[i]));
    for (size_t i = 0; i < (size_t)M * M; i++)
        diff = fmax(diff, fabs(K->data[i] - Z[i]));
    printf("transformer kernel, %d sequences x %d tokens, depth %d, all tokens (%dx%d), best times:\n",
           NS, T, L, M, M);
    printf("  NETSOR+ program (%d instructions, loaded in %.3f s) by the limit evaluator: %8.3f s\n",
           p->ninstr, tload, best_e);
    printf("  direct recursion (block (I+A) S (I+A)^T, 2-D ReLU closed forms):        %8.3f s\n",
           best_d);
    printf("  ratio evaluator / direct: %.2f; max |difference| %.2e\n", best_e / best_d, diff);
    printf("  the library's direct recursion (tpk_transformer_kernel, gpkernel's):    %8.3f s\n",
           best_l);
    printf("  ratio evaluator / library direct: %.2f (median of 21 pairs side by side; of the "
           "best times %.2f); max |difference| %.2e\n", ratio, best_e / best_l, diff_l);
    tpk_array_free(K);
    tpk_array_free(Kl);
    tpk_phi_free(relu);
    tpk_array_free(x);
    tpk_program_free(p);
    tpk_phi_registry_free(reg);
    free(Z);
    free(R);
    free(tmp);
    free(B);
    return 0;
}
