/* Generated GEMM kernels and the measurer: every kernel in gen/ against the reference kernel
 * (odd shapes, transposes, beta, 1 and 2 threads), the shape dispatch and its errors, and one
 * candidate through compile → load → verify → time (no assertion on the time itself). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dlfcn.h>
#include <unistd.h>

#include "../runtime/gemm_gen.h"
#include "../runtime/machine_gen.h"
#include "tpk/gemm.h"
#include "tpk/tune.h"

/* Relative to (|alpha|·k + |beta|) with entries in [-1, 1]: a k-term dot product in the working
 * precision has error ≤ k·u (Higham Thm 3.5); the factor 4 leaves room for beta·C. */
#define TOL_F64(k) (4.0 * (double)(k) * 1.1102230246251565e-16)
#define TOL_F32(k) (4.0 * (double)(k) * 5.9604644775390625e-08)

static uint64_t rng_state = 0x2385;
static double unif(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

/* One kernel on one shape against the reference, A and B each either way round. */
static double check_d(tpk_dgemm_kernel_fn fn, tpk_gemm_ws_fn wsf, size_t m, size_t n, size_t k, int ta,
                      int tb, int nt, int syrk)
{
    if (syrk) /* lower triangle of A·Aᵀ: square, B = Aᵀ by strides */
        n = m;
    double *A = malloc(m * k * sizeof *A), *B = malloc(k * n * sizeof *B);
    double *C = malloc(m * n * sizeof *C), *R = malloc(m * n * sizeof *R);
    void *ws = aligned_alloc(64, (wsf(nt) + 63) / 64 * 64);
    for (size_t i = 0; i < m * k; i++)
        A[i] = unif();
    for (size_t i = 0; i < k * n; i++)
        B[i] = unif();
    for (size_t i = 0; i < m * n; i++)
        C[i] = R[i] = unif();
    size_t rsa = ta ? 1 : k, csa = ta ? m : 1, rsb = tb ? 1 : n, csb = tb ? k : 1;
    const double *Bx = syrk ? A : B;
    if (syrk)
        rsb = csa, csb = rsa;
    fn(m, n, k, 1.375, A, rsa, csa, Bx, rsb, csb, -0.625, C, n, nt, ws);
    tpk_ref_dgemm(m, n, k, 1.375, A, rsa, csa, Bx, rsb, csb, -0.625, R, n);
    double worst = 0;
    for (size_t i = 0; i < m * n; i++) {
        /* syrk: the strict upper triangle keeps its old values (R there holds the product) */
        int upper = syrk && i % n > i / n;
        double e = upper ? 0 : fabs(C[i] - R[i]) / (1.375 * (double)k + 0.625);
        worst = e > worst || isnan(e) ? e : worst;
    }
    free(A), free(B), free(C), free(R), free(ws);
    return worst;
}

static double check_s(tpk_sgemm_kernel_fn fn, tpk_gemm_ws_fn wsf, size_t m, size_t n, size_t k, int ta,
                      int tb, int nt, int syrk)
{
    if (syrk)
        n = m;
    float *A = malloc(m * k * sizeof *A), *B = malloc(k * n * sizeof *B);
    float *C = malloc(m * n * sizeof *C), *R = malloc(m * n * sizeof *R);
    void *ws = aligned_alloc(64, (wsf(nt) + 63) / 64 * 64);
    for (size_t i = 0; i < m * k; i++)
        A[i] = (float)unif();
    for (size_t i = 0; i < k * n; i++)
        B[i] = (float)unif();
    for (size_t i = 0; i < m * n; i++)
        C[i] = R[i] = (float)unif();
    size_t rsa = ta ? 1 : k, csa = ta ? m : 1, rsb = tb ? 1 : n, csb = tb ? k : 1;
    const float *Bx = syrk ? A : B;
    if (syrk)
        rsb = csa, csb = rsa;
    for (size_t i = 0; i < m * n; i++)
        C[i] = NAN; /* beta = 0: C must not be read, and syrk must not write the upper triangle */
    fn(m, n, k, 1.375f, A, rsa, csa, Bx, rsb, csb, 0.0f, C, n, nt, ws);
    tpk_ref_sgemm(m, n, k, 1.375f, A, rsa, csa, Bx, rsb, csb, 0.0f, R, n);
    double worst = 0;
    for (size_t i = 0; i < m * n; i++) {
        int upper = syrk && i % n > i / n;
        double e = upper ? (isnan(C[i]) ? 0 : INFINITY) : fabs((double)C[i] - (double)R[i]) / (1.375 * (double)k);
        worst = e > worst || isnan(e) ? e : worst;
    }
    free(A), free(B), free(C), free(R), free(ws);
    return worst;
}

static void test_generated_kernels_match_reference(void **state)
{
    (void)state;
    /* Shapes that leave edge tiles in m and n and cross the kc blocking (kc ≤ 512). */
    const size_t shapes[][3] = {{131, 97, 547}, {29, 203, 64}, {1, 1, 1}};
    /* Every class this CPU runs: on an AVX-512 machine the AVX2 class's kernels are checked too. */
    int checked = 0;
    for (size_t ci = 0; ci < tpk__machine_nclasses; ci++) {
    if (tpk__machine_classes[ci].isa > tpk_machine_host_isa())
        continue;
    const tpk__gemm_class *cl = tpk__gemm_classes[ci];
    size_t nent = cl->len + 4;
    for (size_t i = 0; i < nent; i++) {
        const tpk__gemm_entry *e = i < cl->len ? &cl->table[i] : &cl->defaults[i - cl->len];
        if (!e->dfn && !e->sfn)
            continue; /* OpenBLAS serves this workload */
        checked++;
        for (size_t s = 0; s < 3; s++) {
            int ta = (int)((i + s) & 1), tb = (int)(((i + s) >> 1) & 1), nt = 1 + (int)((i + s) % 2);
            size_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
            double err = e->dfn ? check_d(e->dfn, e->ws, m, n, k, ta, tb, nt, e->op)
                                : check_s(e->sfn, e->ws, m, n, k, ta, tb, nt, e->op);
            double tol = e->dfn ? TOL_F64(k) : TOL_F32(k);
            if (!(err <= tol))
                fail_msg("%s (%s) on %zux%zux%zu (ta %d tb %d, %d threads): error %.3g > %.3g", e->name,
                         tpk__machine_classes[ci].id, m, n, k, ta, tb, nt, err, tol);
        }
    }
    }
    assert_true(checked >= 4); /* at least one class's four defaults ran */
}

static void test_dispatch(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    const char *name;
    unsetenv("TPK_GEMM");
    assert_int_equal(tpk_gemm_tuned_choice(0, 8, 8, 8, 1, &name), TPK_GEMM_OPENBLAS);
    assert_string_equal(name, "openblas");
    int ci = tpk__machine_index(NULL);
    assert_true(ci >= 0);
    const tpk__gemm_class *cl = tpk__gemm_classes[ci];
    for (size_t i = 0; i < cl->len; i++) {
        const tpk__gemm_entry *e = &cl->table[i];
        int tuned = e->ws != NULL;
        assert_int_equal(tpk_gemm_tuned_choice(e->dtype, e->m, e->n, e->k, e->threads, &name),
                         tuned ? TPK_GEMM_EXACT : TPK_GEMM_OPENBLAS);
        assert_string_equal(name, tuned ? e->name : "openblas");
        assert_int_equal(tpk_gemm_tuned_choice(e->dtype, e->m + 8, e->n, e->k, e->threads, NULL),
                         tuned ? TPK_GEMM_NEAREST : TPK_GEMM_OPENBLAS);
    }
    assert_int_equal(tpk_gemm_tuned_choice(0, 3, 1u << 20, 1u << 20, 1, NULL), TPK_GEMM_DEFAULT);
    /* the distance behind "nearest" (shared with tptune --init): Σ|log2 ratio|, symmetric, a zero
     * size as 1 */
    assert_true(fabs(tpk_gemm_shape_distance(1024, 64, 512, 256, 128, 512) - 3.0) < 1e-15);
    assert_true(tpk_gemm_shape_distance(256, 128, 512, 1024, 64, 512) == tpk_gemm_shape_distance(1024, 64, 512, 256, 128, 512));
    assert_true(tpk_gemm_shape_distance(0, 8, 8, 1, 8, 8) == 0.0);
    setenv("TPK_GEMM", "default", 1);
    assert_int_equal(tpk_gemm_tuned_choice(1, 512, 512, 512, 1, NULL), TPK_GEMM_DEFAULT);
    setenv("TPK_GEMM", "openblas", 1);
    assert_int_equal(tpk_gemm_tuned_choice(1, 512, 512, 512, 1, NULL), TPK_GEMM_OPENBLAS);
    assert_int_equal(tpk_gemm_tuned_ws_size(1, 512, 512, 512, 1), 0);
    unsetenv("TPK_GEMM");
    assert_true(tpk_gemm_tuned_ws_size(0, 512, 512, 512, 1) > 0);

    /* Through the public entry points, every path, against the reference. */
    const size_t m = 150, n = 70, k = 90;
    double *A = malloc(m * k * sizeof *A), *B = malloc(k * n * sizeof *B);
    double *C = malloc(m * n * sizeof *C), *R = malloc(m * n * sizeof *R);
    float *As = malloc(m * k * sizeof *As), *Bs = malloc(k * n * sizeof *Bs), *Cs = malloc(m * n * sizeof *Cs);
    for (size_t i = 0; i < m * k; i++)
        As[i] = (float)(A[i] = unif());
    for (size_t i = 0; i < k * n; i++)
        Bs[i] = (float)(B[i] = unif());
    const char *modes[] = {"tuned", "default", "openblas"};
    for (int md = 0; md < 3; md++) {
        setenv("TPK_GEMM", modes[md], 1);
        for (int ta = 0; ta < 2; ta++) {
            for (size_t i = 0; i < m * n; i++)
                Cs[i] = (float)(C[i] = R[i] = unif());
            /* op(A) = A^T when ta: A is then stored k×m with row stride m. */
            assert_int_equal(tpk_gemm_tuned_d(ta, 0, m, n, k, 0.75, A, ta ? m : k, B, n, 2.5, C, n, 2, NULL, &ctx), TPK_OK);
            tpk_ref_dgemm(m, n, k, 0.75, A, ta ? 1 : k, ta ? m : 1, B, n, 1, 2.5, R, n);
            for (size_t i = 0; i < m * n; i++)
                assert_true(fabs(C[i] - R[i]) <= TOL_F64(k) * (0.75 * k + 2.5));
            assert_int_equal(tpk_gemm_tuned_s(ta, 0, m, n, k, 0.75f, As, ta ? m : k, Bs, n, 0.0f, Cs, n, 1, NULL, &ctx), TPK_OK);
            tpk_ref_dgemm(m, n, k, 0.75, A, ta ? 1 : k, ta ? m : 1, B, n, 1, 0.0, R, n);
            for (size_t i = 0; i < m * n; i++)
                assert_true(fabs((double)Cs[i] - R[i]) <= TOL_F32(k) * 0.75 * k);
        }
    }
    unsetenv("TPK_GEMM");
    /* k = 0 scales C by beta; errors. */
    for (size_t i = 0; i < m * n; i++)
        C[i] = 2.0;
    assert_int_equal(tpk_gemm_tuned_d(0, 0, m, n, 0, 1.0, A, 1, B, n, 0.5, C, n, 1, NULL, &ctx), TPK_OK);
    assert_true(C[0] == 1.0 && C[m * n - 1] == 1.0);
    assert_int_equal(tpk_gemm_tuned_d(2, 0, m, n, k, 1.0, A, k, B, n, 0.0, C, n, 1, NULL, &ctx), TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    assert_int_equal(tpk_gemm_tuned_d(0, 0, m, n, k, 1.0, A, k - 1, B, n, 0.0, C, n, 1, NULL, &ctx), TPK_EINVAL);
    assert_non_null(strstr(ctx.msg, "leading dimension"));
    tpk_ctx_clear(&ctx);
    assert_int_equal(tpk_gemm_tuned_s(0, 0, (size_t)1 << 40, n, k, 1.0f, As, k, Bs, n, 0.0f, Cs, n, 1, NULL, &ctx), TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    free(A), free(B), free(C), free(R), free(As), free(Bs), free(Cs);
}

static void test_syrk_dispatch(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    const size_t n = 157, k = 83;
    double *A = malloc(n * k * sizeof *A), *C = malloc(n * n * sizeof *C), *R = malloc(n * n * sizeof *R);
    float *As = malloc(n * k * sizeof *As), *Cs = malloc(n * n * sizeof *Cs);
    for (size_t i = 0; i < n * k; i++)
        As[i] = (float)(A[i] = unif());
    const char *modes[] = {"tuned", "default", "openblas"};
    for (int md = 0; md < 3; md++) {
        setenv("TPK_GEMM", modes[md], 1);
        for (int tr = 0; tr < 2; tr++) {
            for (size_t i = 0; i < n * n; i++)
                Cs[i] = (float)(C[i] = R[i] = unif());
            /* tr: A stored k×n (row stride n), op(A) = Aᵀ. */
            size_t lda = tr ? n : k, rsa = tr ? 1 : k, csa = tr ? n : 1;
            assert_int_equal(tpk_syrk_tuned_d(tr, n, k, 0.75, A, lda, 1.5, C, n, 2, NULL, &ctx), TPK_OK);
            tpk_ref_dgemm(n, n, k, 0.75, A, rsa, csa, A, csa, rsa, 1.5, R, n);
            for (size_t i = 0; i < n; i++)
                for (size_t j = 0; j < n; j++) {
                    if (j > i) /* untouched */
                        assert_true(C[i * n + j] == (double)Cs[i * n + j] || fabs(C[i * n + j] - Cs[i * n + j]) < 1e-6);
                    else
                        assert_true(fabs(C[i * n + j] - R[i * n + j]) <= TOL_F64(k) * (0.75 * k + 1.5));
                }
            float keep = Cs[1]; /* (0, 1): upper */
            assert_int_equal(tpk_syrk_tuned_s(tr, n, k, 0.75f, As, lda, 0.0f, Cs, n, 1, NULL, &ctx), TPK_OK);
            tpk_ref_dgemm(n, n, k, 0.75, A, rsa, csa, A, csa, rsa, 0.0, R, n);
            assert_true(Cs[1] == keep);
            for (size_t i = 0; i < n; i++)
                for (size_t j = 0; j <= i; j++)
                    assert_true(fabs((double)Cs[i * n + j] - R[i * n + j]) <= TOL_F32(k) * 0.75 * k);
        }
    }
    unsetenv("TPK_GEMM");
    const char *name;
    assert_int_equal(tpk_syrk_tuned_choice(0, 8, 8, 1, &name), TPK_GEMM_OPENBLAS);
    assert_int_equal(tpk_syrk_tuned_choice(0, 300, 1u << 22, 1, &name), TPK_GEMM_DEFAULT);
    assert_non_null(strstr(name, "syrk"));
    assert_true(tpk_syrk_tuned_ws_size(1, 500, 500, 2) > 0);
    /* k = 0 scales the lower triangle by beta only. */
    for (size_t i = 0; i < n * n; i++)
        C[i] = 2.0;
    assert_int_equal(tpk_syrk_tuned_d(0, n, 0, 1.0, A, 1, 0.5, C, n, 1, NULL, &ctx), TPK_OK);
    assert_true(C[n] == 1.0 && C[1] == 2.0);
    assert_int_equal(tpk_syrk_tuned_d(3, n, k, 1.0, A, k, 0.0, C, n, 1, NULL, &ctx), TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    assert_int_equal(tpk_syrk_tuned_s(0, n, k, 1.0f, As, k, 0.0f, Cs, n - 1, 1, NULL, &ctx), TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    free(A), free(C), free(R), free(As), free(Cs);
}

static void test_measure_pipeline(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_tune_space s;
    tpk_tune_task t = {TPK_TUNE_CPU, TPK_TUNE_F32, 100, 75, 130, 2, TPK_TUNE_GEMM};
    assert_int_equal(tpk_tune_space_init(&s, &t, &ctx), TPK_OK);
    tpk_tune_measure_opts o;
    tpk_tune_measure_opts_default(&o);
    o.repeat = 1;
    o.min_repeat_ms = 1;
    o.max_redo = 0;
    tpk_tune_config c;
    tpk_tune_space_default(&s, &c);
    assert_int_equal(tpk_tune_config_get(&s, &c, "pb", -1), 1); /* 2 threads: private B by default */
    assert_int_equal(tpk_tune_config_set(&s, &c, "par", 1), TPK_OK); /* split jr */
    assert_false(tpk_tune_space_valid(&s, &c));                      /* ... needs the shared B */
    assert_int_equal(tpk_tune_config_set(&s, &c, "pb", 0), TPK_OK);
    assert_int_equal(tpk_tune_config_set(&s, &c, "order", 1), TPK_OK);
    tpk_tune_result r;
    assert_int_equal(tpk_tune_measure(&s, &c, &o, &r, &ctx), TPK_OK);
    if (r.err)
        fail_msg("candidate failed: err %d (rel err %.3g)", r.err, r.max_rel_err);
    assert_true(r.gflops > 0 && r.ncost == 1 && r.max_rel_err < 1e-5);
    /* A syrk candidate, OpenBLAS timed beside it. */
    tpk_tune_task ts = {TPK_TUNE_CPU, TPK_TUNE_F64, 90, 90, 70, 2, TPK_TUNE_SYRK};
    tpk_tune_space ss;
    assert_int_equal(tpk_tune_space_init(&ss, &ts, &ctx), TPK_OK);
    assert_string_equal(ss.template_name, "cpu_syrk");
    tpk_tune_space_default(&ss, &c);
    o.vendor = 1;
    assert_int_equal(tpk_tune_measure(&ss, &c, &o, &r, &ctx), TPK_OK);
    if (r.err)
        fail_msg("syrk candidate failed: err %d (rel err %.3g)", r.err, r.max_rel_err);
    assert_true(r.gflops > 0 && r.vendor_gflops > 0);
    o.vendor = 0;
    ts.n = 91; /* syrk needs a square C */
    assert_int_equal(tpk_tune_space_init(&ss, &ts, &ctx), TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    /* A configuration outside the constraints is not built. */
    assert_int_equal(tpk_tune_config_set(&s, &c, "mr", 28), TPK_OK);
    assert_int_equal(tpk_tune_config_set(&s, &c, "nv", 4), TPK_OK);
    assert_int_equal(tpk_tune_measure(&s, &c, &o, &r, &ctx), TPK_OK);
    assert_int_equal(r.err, TPK_TUNE_EINVALID);
    /* A compiler that fails. */
    tpk_tune_space_default(&s, &c);
    o.cc = "false";
    assert_int_equal(tpk_tune_measure(&s, &c, &o, &r, &ctx), TPK_OK);
    assert_int_equal(r.err, TPK_TUNE_ECOMPILE);
    /* A wrong kernel is caught by the child's check against the reference. */
    char dir[] = "/tmp/tpk_tune_testXXXXXX";
    assert_non_null(mkdtemp(dir));
    char src[128], so[128], out[128];
    snprintf(src, sizeof src, "%s/bad.c", dir);
    snprintf(so, sizeof so, "%s/bad.so", dir);
    snprintf(out, sizeof out, "%s/out.txt", dir);
    FILE *f = fopen(src, "w");
    fputs("#include <stddef.h>\nsize_t tpk_kernel_ws(int nt) { (void)nt; return 64; }\n"
          "void tpk_kernel(size_t m, size_t n, size_t k, double al, const double *A, size_t ra, size_t ca,\n"
          "  const double *B, size_t rb, size_t cb, double be, double *C, size_t ldc, int nt, void *ws)\n"
          "{ (void)k; (void)al; (void)A; (void)ra; (void)ca; (void)B; (void)rb; (void)cb; (void)be;\n"
          "  (void)nt; (void)ws; /* it must compile under the measurer's -Wall -Wextra -Werror */\n"
          "  for (size_t i = 0; i < m; i++) for (size_t j = 0; j < n; j++) C[i * ldc + j] = 0; }\n", f);
    fclose(f);
    assert_int_equal(tpk_tune_compile_cpu(src, so, "gcc", 60, NULL, &ctx), TPK_OK);
    assert_int_equal(tpk_tune_compile_cpu("/nonexistent.c", so, "gcc", 60, NULL, &ctx), TPK_EIO);
    tpk_ctx_clear(&ctx);
    /* A candidate that compiles only with warnings would fail gen/'s -Werror build: rejected. */
    char warn[128], wso[128];
    snprintf(warn, sizeof warn, "%s/warn.c", dir);
    snprintf(wso, sizeof wso, "%s/warn.so", dir);
    FILE *fw = fopen(warn, "w");
    fputs("#include <stddef.h>\nsize_t tpk_kernel_ws(int nt) { return 64; }\n", fw);
    fclose(fw);
    assert_int_equal(tpk_tune_compile_cpu(warn, wso, "gcc", 60, NULL, &ctx), TPK_EIO);
    tpk_ctx_clear(&ctx);
    remove(warn);
    remove(wso);
    char *argv[] = {"t", "__measure", so, "0", "40", "30", "20", "1", "1", "1", "11", "13", "17", NULL};
    fflush(stdout);
    FILE *saved = fopen(out, "w");
    int fd = dup(1);
    dup2(fileno(saved), 1);
    int rc = tpk_tune_child_main(13, argv);
    fflush(stdout);
    dup2(fd, 1);
    close(fd);
    fclose(saved);
    assert_int_equal(rc, 0);
    char line[256] = "";
    f = fopen(out, "r");
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    assert_non_null(strstr(line, "TPKRESULT 3 ")); /* TPK_TUNE_EWRONG */
    assert_int_equal(tpk_tune_child_main(3, argv), 2);
    unlink(src), unlink(so), unlink(out), rmdir(dir);
}

/* The direct-A variant (pa=direct: whole mr-row panels of A read in place, the partial panel
 * packed; a transposed A falls back to packing) emitted, compiled and loaded here, then checked
 * like the gen/ kernels: partial panels, C edge tiles, kc blocking, transposes, 1 and 2 threads. */
static void test_direct_a(void **state)
{
    (void)state;
    static const struct { int dtype, threads, vw, mr, nv, kc, mc, order, pf, pb; } cfg[] = {
        {TPK_TUNE_F64, 1, 512, 6, 3, 64, 48, 0, 2, 0},  {TPK_TUNE_F64, 2, 256, 8, 2, 96, 72, 1, 0, 1},
        {TPK_TUNE_F32, 1, 512, 6, 4, 128, 96, 0, 2, 0}, {TPK_TUNE_F32, 2, 512, 4, 2, 64, 48, 1, 1, 0},
        /* within 16 vector registers (AVX2 hosts) */
        {TPK_TUNE_F64, 1, 256, 6, 2, 64, 48, 0, 2, 0},  {TPK_TUNE_F32, 2, 256, 4, 2, 128, 96, 1, 1, 0}};
    int ran = 0;
    const size_t shapes[][3] = {{131, 97, 547}, {29, 64, 200}, {1, 1, 1}};
    char dir[] = "/tmp/tpk_tune_directXXXXXX";
    assert_non_null(mkdtemp(dir));
    char src[128], so[128];
    snprintf(src, sizeof src, "%s/k.c", dir);
    snprintf(so, sizeof so, "%s/k.so", dir);
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        tpk_tune_task t = {TPK_TUNE_CPU, cfg[i].dtype, 131, 97, 547, cfg[i].threads, TPK_TUNE_GEMM};
        tpk_tune_space s;
        assert_int_equal(tpk_tune_space_init(&s, &t, &ctx), TPK_OK);
        tpk_tune_config c;
        tpk_tune_space_default(&s, &c);
        const char *nm[] = {"vw", "mr", "nv", "kc", "mc", "order", "pf", "pb", "pa"};
        int val[] = {cfg[i].vw, cfg[i].mr, cfg[i].nv, cfg[i].kc, cfg[i].mc, cfg[i].order, cfg[i].pf, cfg[i].pb, 1};
        for (int j = 0; j < 9; j++)
            assert_int_equal(tpk_tune_config_set(&s, &c, nm[j], val[j]), TPK_OK);
        if (!tpk_tune_space_valid(&s, &c)) { /* wider vectors or more registers than the host's */
            tpk_ctx_clear(&ctx);
            continue;
        }
        ran++;
        FILE *f = fopen(src, "w");
        assert_non_null(f);
        assert_int_equal(tpk_tune_emit(&s, &c, "tpk_kernel", 1, f, &ctx), TPK_OK);
        fclose(f);
        assert_int_equal(tpk_tune_compile_cpu(src, so, "gcc", 120, NULL, &ctx), TPK_OK);
        void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
        assert_non_null(h);
        void *fn = dlsym(h, "tpk_kernel"), *wsf = dlsym(h, "tpk_kernel_ws");
        assert_true(fn && wsf);
        for (size_t sh = 0; sh < 3; sh++)
            for (int ta = 0; ta < 2; ta++) {
                size_t m = shapes[sh][0], n = shapes[sh][1], k = shapes[sh][2];
                int tb = (int)(sh & 1), nt = cfg[i].threads;
                tpk_gemm_ws_fn ws = (tpk_gemm_ws_fn)(uintptr_t)wsf;
                double err = cfg[i].dtype == TPK_TUNE_F64
                                 ? check_d((tpk_dgemm_kernel_fn)(uintptr_t)fn, ws, m, n, k, ta, tb, nt, 0)
                                 : check_s((tpk_sgemm_kernel_fn)(uintptr_t)fn, ws, m, n, k, ta, tb, nt, 0);
                double tol = cfg[i].dtype == TPK_TUNE_F64 ? TOL_F64(k) : TOL_F32(k);
                if (!(err <= tol))
                    fail_msg("direct-A config %zu on %zux%zux%zu (ta %d): error %.3g > %.3g", i, m, n, k, ta, err, tol);
            }
        dlclose(h);
        tpk_ctx_clear(&ctx);
    }
    assert_true(ran >= 2); /* the last two fit any AVX2 host */
    /* Not offered where it does not apply: the jr split and syrk. */
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_tune_task t2 = {TPK_TUNE_CPU, TPK_TUNE_F64, 256, 256, 256, 2, TPK_TUNE_GEMM};
    tpk_tune_space s2;
    assert_int_equal(tpk_tune_space_init(&s2, &t2, &ctx), TPK_OK);
    tpk_tune_config c2;
    tpk_tune_space_default(&s2, &c2);
    assert_int_equal(tpk_tune_config_set(&s2, &c2, "pa", 1), TPK_OK);
    assert_true(tpk_tune_space_valid(&s2, &c2));
    assert_int_equal(tpk_tune_config_set(&s2, &c2, "pb", 0), TPK_OK);
    assert_int_equal(tpk_tune_config_set(&s2, &c2, "par", 1), TPK_OK);
    assert_false(tpk_tune_space_valid(&s2, &c2));
    t2.op = TPK_TUNE_SYRK;
    assert_int_equal(tpk_tune_space_init(&s2, &t2, &ctx), TPK_OK);
    tpk_tune_space_default(&s2, &c2);
    assert_int_equal(tpk_tune_config_set(&s2, &c2, "pa", 1), TPK_ENOTFOUND);
    unlink(src), unlink(so), rmdir(dir);
}

static void test_emit_readable(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_tune_space s;
    tpk_tune_task t = {TPK_TUNE_CPU, TPK_TUNE_F64, 512, 512, 512, 1, TPK_TUNE_GEMM};
    assert_int_equal(tpk_tune_space_init(&s, &t, &ctx), TPK_OK);
    tpk_tune_config c;
    tpk_tune_space_default(&s, &c);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_int_equal(tpk_tune_emit(&s, &c, "tpk_kernel", 1, f, &ctx), TPK_OK);
    fclose(f);
    assert_non_null(strstr(buf, "DO NOT EDIT"));
    assert_non_null(strstr(buf, "tpk_kernel_ws"));
    free(buf);
    assert_int_equal(tpk_tune_config_set(&s, &c, "mr", 28), TPK_OK);
    assert_int_equal(tpk_tune_config_set(&s, &c, "nv", 4), TPK_OK);
    f = tmpfile();
    assert_int_equal(tpk_tune_emit(&s, &c, "x", 1, f, &ctx), TPK_EINVAL);
    fclose(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_measure_pipeline), /* first: before this process runs OpenMP */
        cmocka_unit_test(test_generated_kernels_match_reference),
        cmocka_unit_test(test_dispatch),
        cmocka_unit_test(test_syrk_dispatch),
        cmocka_unit_test(test_emit_readable),
        cmocka_unit_test(test_direct_a),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
