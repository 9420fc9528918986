/* Invariants of the MLP recursion (theory.md §3.4): He-ReLU diagonal, deep correlation law,
 * linear networks, rotation invariance, symmetry/PSD, degenerate inputs, parameter errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tpk/kernels.h"

/* Closed forms: only rounding error, which grows at most linearly with depth. */
#define TOL_ROUND 1e-13

typedef struct fixture {
    tpk_ctx ctx;
    tpk_phi_registry *reg;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    tpk_ctx_init(&f->ctx);
    f->reg = tpk_phi_registry_alloc(&f->ctx);
    *state = f;
    return f->reg ? 0 : -1;
}

static int teardown(void **state)
{
    fixture *f = *state;
    tpk_phi_registry_free(f->reg);
    free(f);
    return 0;
}

static tpk_array *kernel(fixture *f, const char *spec, int depth, double sw2, double sb2,
                         const tpk_array *X)
{
    tpk_phi *phi = tpk_phi_alloc(f->reg, spec, &f->ctx);
    assert_non_null(phi);
    tpk_gauss_ws *ws = tpk_gauss_ws_alloc(64, &f->ctx);
    tpk_array *K = tpk_array_alloc2(X->dims[0], X->dims[0], &f->ctx);
    tpk_mlp_params p = {.depth = depth, .phi = phi, .sigma_w2 = sw2, .sigma_b2 = sb2};
    int st = tpk_mlp_kernel(&p, X, NULL, ws, K, NULL, NULL, NULL, &f->ctx);
    if (st)
        fail_msg("tpk_mlp_kernel: %s", f->ctx.msg);
    tpk_gauss_ws_free(ws);
    tpk_phi_free(phi);
    return K;
}

static tpk_array *random_inputs(size_t n, size_t d, unsigned long seed)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, seed);
    tpk_array *X = tpk_array_alloc2(n, d, NULL);
    for (size_t i = 0; i < n * d; i++)
        X->data[i] = gsl_ran_gaussian(r, 1.0);
    gsl_rng_free(r);
    return X;
}

static double min_eig_rel(const tpk_array *K)
{
    int n = (int)K->dims[0];
    double *A = malloc((size_t)n * n * sizeof *A), *w = malloc((size_t)n * sizeof *w);
    memcpy(A, K->data, (size_t)n * n * sizeof *A);
    assert_int_equal(LAPACKE_dsyev(LAPACK_ROW_MAJOR, 'N', 'L', n, A, n, w), 0);
    double r = w[0] / fmax(fabs(w[n - 1]), 1e-300);
    free(A);
    free(w);
    return r;
}

/* He-initialised ReLU (σ_w² = 2, σ_b = 0) with Σ¹(x,x) = 1 keeps the diagonal at 1. */
static void test_he_relu_diagonal(void **state)
{
    fixture *f = *state;
    tpk_array *X = random_inputs(7, 11, 31);
    for (size_t i = 0; i < 7; i++) { /* scale so that 2‖x‖²/d = 1 */
        double s = 0;
        for (size_t j = 0; j < 11; j++)
            s += X->data[i * 11 + j] * X->data[i * 11 + j];
        for (size_t j = 0; j < 11; j++)
            X->data[i * 11 + j] *= sqrt(11.0 / (2 * s));
    }
    tpk_array *K = kernel(f, "relu", 20, 2.0, 0.0, X);
    for (size_t i = 0; i < 7; i++)
        assert_true(fabs(K->data[i * 7 + i] - 1.0) < TOL_ROUND * 20);
    tpk_array_free(K);
    tpk_array_free(X);
}

/* Deep ReLU correlations approach 1 like 1 − c_l ≈ 9π²/(2 l²) (theory.md §3.4: measured
 * (1 − c_l) l² = 44.25 at l = 10⁴, limit 44.41). Two orthogonal inputs start at c = 0; the
 * output Σ^{L+1} is after L maps. Also: nothing degenerates into NaN at depth 10⁴. */
static void test_deep_relu_correlation_law(void **state)
{
    fixture *f = *state;
    tpk_array *X = tpk_array_alloc2(2, 2, NULL);
    X->data[0] = 1; /* e1 */
    X->data[3] = 1; /* e2 */
    int L = 10000;
    tpk_array *K = kernel(f, "relu", L, 2.0, 0.0, X);
    double c = K->data[1] / sqrt(K->data[0] * K->data[3]);
    double scaled = (1 - c) * (double)L * L;
    print_message("(1-c_L) L^2 at L = %d: %.3f (9pi^2/2 = %.3f)\n", L, scaled, 9 * M_PI * M_PI / 2);
    assert_true(scaled > 44.0 && scaled < 44.5);
    tpk_array_free(K);
    tpk_array_free(X);
}

/* Identity φ: Σ^{L+1} = σ_w^{2L} Σ¹ + σ_b² Σ_{j<L} σ_w^{2j} exactly. */
static void test_linear_network(void **state)
{
    fixture *f = *state;
    tpk_array *X = random_inputs(5, 4, 5);
    const double sw2 = 1.37, sb2 = 0.29;
    const int L = 6;
    tpk_array *K = kernel(f, "identity", L, sw2, sb2, X);
    for (size_t i = 0; i < 5; i++)
        for (size_t j = 0; j < 5; j++) {
            double g = 0;
            for (size_t t = 0; t < 4; t++)
                g += X->data[i * 4 + t] * X->data[j * 4 + t];
            double s1 = sw2 * g / 4 + sb2, geo = 0;
            for (int k = 0; k < L; k++)
                geo += pow(sw2, k);
            double expect = pow(sw2, L) * s1 + sb2 * geo;
            assert_true(fabs(K->data[i * 5 + j] - expect) < TOL_ROUND * fabs(expect) * L);
        }
    tpk_array_free(K);
    tpk_array_free(X);
}

/* MLP kernels depend on inner products only: an orthogonal rotation of the inputs changes nothing. */
static void test_rotation_invariance(void **state)
{
    fixture *f = *state;
    const size_t n = 6, d = 5;
    tpk_array *X = random_inputs(n, d, 99), *Q = random_inputs(d, d, 100);
    double tau[5];
    assert_int_equal(LAPACKE_dgeqrf(LAPACK_ROW_MAJOR, (int)d, (int)d, Q->data, (int)d, tau), 0);
    assert_int_equal(LAPACKE_dorgqr(LAPACK_ROW_MAJOR, (int)d, (int)d, (int)d, Q->data, (int)d, tau), 0);
    tpk_array *XR = tpk_array_alloc2(n, d, NULL);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < d; j++)
            for (size_t t = 0; t < d; t++)
                XR->data[i * d + j] += X->data[i * d + t] * Q->data[t * d + j];
    static const char *const phis[] = {"relu", "erf", "gelu", "tanh"};
    for (size_t k = 0; k < 4; k++) {
        tpk_array *K1 = kernel(f, phis[k], 3, 1.8, 0.1, X), *K2 = kernel(f, phis[k], 3, 1.8, 0.1, XR);
        for (size_t i = 0; i < n * n; i++)
            assert_true(fabs(K1->data[i] - K2->data[i]) < 1e-12 * fabs(K1->data[0]));
        tpk_array_free(K1);
        tpk_array_free(K2);
    }
    tpk_array_free(X);
    tpk_array_free(Q);
    tpk_array_free(XR);
}

/* Zero vectors, duplicates and a long deep stack: finite, symmetric, PSD. */
static void test_degenerate_inputs_psd(void **state)
{
    fixture *f = *state;
    tpk_array *X = random_inputs(12, 6, 7);
    memset(X->data, 0, 6 * sizeof(double));                      /* zero input */
    memcpy(X->data + 6 * 6, X->data + 5 * 6, 6 * sizeof(double)); /* duplicate */
    memcpy(X->data + 7 * 6, X->data + 5 * 6, 6 * sizeof(double)); /* triplicate */
    static const char *const phis[] = {"relu", "erf", "tanh", "step", "sign", "gelu", "abs"};
    static const double sb2s[] = {0.0, 0.3};
    for (size_t k = 0; k < sizeof phis / sizeof phis[0]; k++)
        for (size_t b = 0; b < 2; b++) {
            tpk_array *K = kernel(f, phis[k], 8, 1.5, sb2s[b], X);
            for (size_t i = 0; i < 144; i++)
                assert_true(isfinite(K->data[i]));
            for (size_t i = 0; i < 12; i++)
                for (size_t j = 0; j < 12; j++)
                    assert_true(K->data[i * 12 + j] == K->data[j * 12 + i]);
            double e = min_eig_rel(K);
            if (e < -1e-12)
                fail_msg("%s sb2=%g: min eigenvalue / max = %.3e", phis[k], sb2s[b], e);
            tpk_array_free(K);
        }
    tpk_array_free(X);
}

/* Blocks on their own (gpregress-mpi's tiles): K(Xr, Xc) from tpk_mlp_kernel_cross and the
 * per-layer diagonals of tpk_mlp_diag is the block of the kernel of both sets stacked, which the
 * symmetric maps compute; the last row of tpk_mlp_diag is that kernel's diagonal. For a closed
 * form (relu) and a numerical φ (tanh, Gauss–Hermite), with and without a bias. */
static void test_cross_blocks(void **state)
{
    fixture *f = *state;
    const char *specs[] = {"relu", "tanh", "erf"};
    const double sb2[] = {0.1, 0.0, 0.3};
    const size_t nr = 7, nc = 5, d = 6;
    tpk_array *X = random_inputs(nr + nc, d, 5);
    tpk_array Xc = *X, Xr = *X;
    Xc.dims[0] = nc;
    Xr.dims[0] = nr;
    Xr.data = X->data + nc * d;
    memset(&Xc.alloc, 0, sizeof Xc.alloc);
    memset(&Xr.alloc, 0, sizeof Xr.alloc);
    for (size_t c = 0; c < 3; c++) {
        const int depth = 4;
        tpk_array *K = kernel(f, specs[c], depth, 1.7, sb2[c], X);
        tpk_phi *phi = tpk_phi_alloc(f->reg, specs[c], &f->ctx);
        tpk_gauss_ws *ws = tpk_gauss_ws_alloc(64, &f->ctx);
        tpk_mlp_params p = {.depth = depth, .phi = phi, .sigma_w2 = 1.7, .sigma_b2 = sb2[c]};
        double *qr = malloc((depth + 1) * nr * sizeof *qr), *qc = malloc((depth + 1) * nc * sizeof *qc);
        double *B = malloc(nr * nc * sizeof *B), err = -1;
        assert_int_equal(tpk_mlp_diag(&p, &Xr, ws, qr, NULL, &f->ctx), TPK_OK);
        assert_int_equal(tpk_mlp_diag(&p, &Xc, ws, qc, NULL, &f->ctx), TPK_OK);
        assert_int_equal(tpk_mlp_kernel_cross(&p, &Xr, qr, &Xc, qc, ws, B, &err, &f->ctx), TPK_OK);
        assert_true(err >= 0);
        const size_t N = nr + nc;
        double dev = 0, scale = 0;
        for (size_t i = 0; i < nr; i++)
            for (size_t j = 0; j < nc; j++) {
                dev = fmax(dev, fabs(B[i * nc + j] - K->data[(nc + i) * N + j]));
                scale = fmax(scale, fabs(K->data[(nc + i) * N + j]));
            }
        for (size_t i = 0; i < nr; i++)
            dev = fmax(dev, fabs(qr[depth * nr + i] - K->data[(nc + i) * N + nc + i]));
        for (size_t j = 0; j < nc; j++)
            dev = fmax(dev, fabs(qc[depth * nc + j] - K->data[j * N + j]));
        print_message("%s: |cross block - stacked kernel| = %.2e (max |K| %.2f)\n", specs[c], dev,
                      scale);
        assert_true(dev <= TOL_ROUND * scale);
        /* the stacked kernel's test path (Xt) is the same block */
        tpk_array *Kc = tpk_array_alloc2(nc, nc, &f->ctx), *Kx = tpk_array_alloc2(nr, nc, &f->ctx);
        tpk_array *kd = tpk_array_alloc2(nr, 1, &f->ctx);
        assert_int_equal(tpk_mlp_kernel(&p, &Xc, &Xr, ws, Kc, Kx, kd, NULL, &f->ctx), TPK_OK);
        for (size_t i = 0; i < nr * nc; i++)
            assert_true(Kx->data[i] == B[i]);
        for (size_t i = 0; i < nr; i++)
            assert_true(kd->data[i] == qr[depth * nr + i]);
        tpk_array_free(Kc);
        tpk_array_free(Kx);
        tpk_array_free(kd);
        free(qr);
        free(qc);
        free(B);
        tpk_gauss_ws_free(ws);
        tpk_phi_free(phi);
        tpk_array_free(K);
    }
    tpk_array_free(X);
}

static void test_parameter_errors(void **state)
{
    fixture *f = *state;
    tpk_phi *phi = tpk_phi_alloc(f->reg, "relu", &f->ctx);
    tpk_array *X = random_inputs(3, 2, 1), *K = tpk_array_alloc2(3, 3, NULL), *Kbad = tpk_array_alloc2(2, 3, NULL);
    struct { tpk_mlp_params p; tpk_array *K; int status; } cases[] = {
        {{.depth = 0, .phi = phi, .sigma_w2 = 1, .sigma_b2 = 0}, K, TPK_EINVAL},
        {{.depth = 2, .phi = NULL, .sigma_w2 = 1, .sigma_b2 = 0}, K, TPK_EINVAL},
        {{.depth = 2, .phi = phi, .sigma_w2 = -1, .sigma_b2 = 0}, K, TPK_EDOM},
        {{.depth = 2, .phi = phi, .sigma_w2 = 1, .sigma_b2 = NAN}, K, TPK_EDOM},
        {{.depth = 2, .phi = phi, .sigma_w2 = 1, .sigma_b2 = 0}, Kbad, TPK_EINVAL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        assert_int_equal(tpk_mlp_kernel(&cases[i].p, X, NULL, NULL, cases[i].K, NULL, NULL, NULL, &ctx),
                         cases[i].status);
        assert_true(strlen(ctx.msg) > 0);
    }
    /* Overflow: exp grows without bound with depth: a clear numerical error, not inf in the file. */
    tpk_phi *ex = tpk_phi_alloc(f->reg, "exp", &f->ctx);
    assert_non_null(ex);
    tpk_mlp_params p = {.depth = 40, .phi = ex, .sigma_w2 = 4, .sigma_b2 = 1};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_mlp_kernel(&p, X, NULL, NULL, K, NULL, NULL, NULL, &ctx), TPK_ENUMERIC);
    /* the block entry points: the layer diagonals overflow at a named layer; a cross block of
     * items of two dimensions is refused */
    double q[41 * 3], B[9];
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_mlp_diag(&p, X, NULL, q, NULL, &ctx), TPK_ENUMERIC);
    print_message("diag overflow: %s\n", ctx.msg);
    assert_non_null(strstr(ctx.msg, "hidden layer"));
    tpk_array *X3 = random_inputs(3, 3, 2);
    tpk_mlp_params pr = {.depth = 2, .phi = phi, .sigma_w2 = 2, .sigma_b2 = 0};
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_mlp_diag(&pr, X, NULL, q, NULL, &ctx), TPK_OK);
    assert_int_equal(tpk_mlp_kernel_cross(&pr, X3, q, X, q, NULL, B, NULL, &ctx), TPK_EINVAL);
    assert_non_null(strstr(ctx.msg, "dimension"));
    tpk_array_free(X3);
    tpk_phi_free(ex);
    tpk_phi_free(phi);
    tpk_array_free(X);
    tpk_array_free(K);
    tpk_array_free(Kbad);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_he_relu_diagonal),
        cmocka_unit_test(test_deep_relu_correlation_law),
        cmocka_unit_test(test_linear_network),
        cmocka_unit_test(test_rotation_invariance),
        cmocka_unit_test(test_degenerate_inputs_psd),
        cmocka_unit_test(test_cross_blocks),
        cmocka_unit_test(test_parameter_errors),
    };
    return cmocka_run_group_tests_name("mlp", tests, setup, teardown);
}
