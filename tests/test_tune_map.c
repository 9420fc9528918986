/* The tuner's map template (cpu_map, op relu_map): generated variants of every arccos variant,
 * both 1/√q modes, both vector widths and all three parallel splits, f64 and f32, against the
 * plain reference and an independent closed form, on odd n with degenerate variances; the
 * library's generated kernels and their dispatch; kernels/gauss_map.c's relu path with the tuned
 * kernel in place vs TPK_MAP=reference; byte-identical regeneration of gen/ (every class, the index); class files; the
 * measuring child accepting a right kernel and rejecting a wrong one; tptune map / show. No
 * assertion on any time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../runtime/machine_gen.h"
#include "../runtime/map_gen.h"
#include "../tuner/tune_impl.h"
#include "tpk/gauss.h"
#include "tpk/map.h"
#include "tpk/tune.h"

/* Errors relative to the entry's scale |α|√(q_i q_j)/2 + |β| (J ≤ π bounds the map): issue 6's
 * verification tolerances, 1e-14 for f64 (the formula is ~16 ε accurate, kernels/gauss_map.c
 * vector_err), 1e-6 for f32 (a few float ulp of 6e-8 in ρ, J π-Lipschitz in ρ). */
#define TOL_F64 1e-14
#define TOL_F32 1e-6
/* The closed form sin θ + (π − θ) cos θ with libm acos vs the reference's asin form: both are
 * within a few ε of the truth; 64 ε of the scale leaves room for the rounding of ρ. */
#define TOL_CLOSED (64 * 2.220446049250313e-16)

static const double ALPHA = 1.8125, BETA = 0.0625;

static uint64_t rng = 0x2385;
static double unif(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

/* A Gram matrix of n points in R^3 (rank 3: many ρ near ±1) with degenerate rows: zero
 * vectors, exact duplicates (ρ = 1 off the diagonal) and negatives (ρ = −1). */
static void gram(double *S, size_t n)
{
    double *x = malloc(3 * n * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++)
        for (int d = 0; d < 3; d++)
            x[3 * i + d] = i % 9 == 2 ? 0.0 : i % 6 == 5 ? x[3 * (i - 1) + d]
                         : i % 13 == 12 ? -x[3 * (i - 1) + d] : 2.385 * unif();
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            S[i * n + j] = x[3 * i] * x[3 * j] + x[3 * i + 1] * x[3 * j + 1] + x[3 * i + 2] * x[3 * j + 2];
    free(x);
}

static double scale(double qi, double qj)
{
    return fabs(ALPHA) * sqrt(qi) * sqrt(qj) / 2 + fabs(BETA);
}

/* Independent oracle: α/(2π)√(q_i q_j)(sin θ + (π − θ) cos θ) + β with libm acos. */
static double closed(double qi, double qj, double k)
{
    if (qi == 0 || qj == 0)
        return BETA;
    double c = k / (sqrt(qi) * sqrt(qj));
    c = c > 1 ? 1 : c < -1 ? -1 : c;
    const double th = acos(c);
    return ALPHA / (2 * M_PI) * sqrt(qi) * sqrt(qj) * (sin(th) + (M_PI - th) * c) + BETA;
}

/* The reference against the closed form (it is the oracle the kernels are measured against). */
static void test_reference_closed_form(void **state)
{
    (void)state;
    const size_t n = 61;
    double *S = malloc(n * n * sizeof *S), *O = malloc(n * n * sizeof *O);
    gram(S, n);
    assert_int_equal(tpk_ref_relu_map_d(n, S, n, ALPHA, BETA, O, n), 0);
    double worst = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j <= i; j++) {
            double e = fabs(O[i * n + j] - closed(S[i * n + i], S[j * n + j], S[i * n + j])) /
                       scale(S[i * n + i], S[j * n + j]);
            worst = e > worst || isnan(e) ? e : worst;
        }
    assert_true(worst <= TOL_CLOSED);
    /* a covariance beyond its bound is flagged */
    S[40 * n + 3] = 2 * sqrt(S[40 * n + 40] * S[3 * n + 3]) + 1;
    assert_int_not_equal(tpk_ref_relu_map_d(n, S, n, ALPHA, BETA, O, n), 0);
    free(S), free(O);
}

/* Worst scaled error of a f64 kernel against the reference on the lower triangle; the strict
 * upper triangle must be untouched; in place must give the same numbers. */
static double check_d(tpk_dmap_kernel_fn fn, tpk_map_ws_fn wsf, size_t n, int nt)
{
    double *S = malloc(n * n * sizeof *S), *O = malloc(n * n * sizeof *O), *R = malloc(n * n * sizeof *R);
    void *ws = aligned_alloc(64, (wsf(n) + 63) / 64 * 64);
    gram(S, n);
    for (size_t i = 0; i < n * n; i++)
        O[i] = 7.25;
    assert_int_equal(fn(n, S, n, ALPHA, BETA, O, n, nt, ws), 0);
    assert_int_equal(tpk_ref_relu_map_d(n, S, n, ALPHA, BETA, R, n), 0);
    double worst = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            double e = j > i ? (O[i * n + j] == 7.25 ? 0 : INFINITY)
                             : fabs(O[i * n + j] - R[i * n + j]) / scale(S[i * n + i], S[j * n + j]);
            worst = e > worst || isnan(e) ? e : worst;
        }
    assert_int_equal(fn(n, S, n, ALPHA, BETA, S, n, nt, ws), 0);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j <= i; j++)
            if (S[i * n + j] != O[i * n + j])
                worst = INFINITY;
    /* the flag: one covariance beyond its bound */
    gram(S, n);
    if (n > 20) {
        S[(n - 2) * n + 7] = 3 * sqrt(S[(n - 2) * n + n - 2] * S[7 * n + 7]) + 0.5;
        assert_int_not_equal(fn(n, S, n, ALPHA, BETA, O, n, nt, ws), 0);
        S[(n - 2) * n + 7] = NAN;
        assert_int_not_equal(fn(n, S, n, ALPHA, BETA, O, n, nt, ws), 0);
    }
    free(S), free(O), free(R), free(ws);
    return worst;
}

static double check_s(tpk_smap_kernel_fn fn, tpk_map_ws_fn wsf, size_t n, int nt)
{
    double *Sd = malloc(n * n * sizeof *Sd);
    float *S = malloc(n * n * sizeof *S), *O = malloc(n * n * sizeof *O);
    void *ws = aligned_alloc(64, (wsf(n) + 63) / 64 * 64);
    gram(Sd, n);
    for (size_t i = 0; i < n * n; i++) {
        S[i] = (float)Sd[i];
        O[i] = 7.25f;
    }
    assert_int_equal(fn(n, S, n, (float)ALPHA, (float)BETA, O, n, nt, ws), 0);
    double worst = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            /* oracle in double on the float inputs */
            double e = j > i ? (O[i * n + j] == 7.25f ? 0 : INFINITY)
                             : fabs(O[i * n + j] - closed(S[i * n + i], S[j * n + j], S[i * n + j])) /
                                   scale(S[i * n + i], S[j * n + j]);
            worst = e > worst || isnan(e) ? e : worst;
        }
    if (n > 20) {
        S[(n - 2) * n + 7] = (float)(3 * sqrt((double)S[(n - 2) * n + n - 2] * S[7 * n + 7]) + 0.5);
        assert_int_not_equal(fn(n, S, n, (float)ALPHA, (float)BETA, O, n, nt, ws), 0);
    }
    free(Sd), free(S), free(O), free(ws);
    return worst;
}

/* Emit one configuration standalone, compile and load it. */
static void *build_variant(int dtype, int threads, const char *knobs, const char *tag)
{
    tpk_tune_task t = {TPK_TUNE_CPU, dtype, 256, 256, 1, threads, TPK_TUNE_MAP};
    tpk_tune_space s;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_tune_space_init(&s, &t, &ctx), TPK_OK);
    tpk_tune_config c;
    tpk_tune_space_default(&s, &c);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", knobs);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        char *eq = strchr(tok, '=');
        assert_non_null(eq);
        *eq = '\0';
        int v = atoi(eq + 1);
        for (int i = 0; i < s.nknob; i++)
            for (int j = 0; s.knob[i].labels && j < s.knob[i].ncand; j++)
                if (!strcmp(s.knob[i].name, tok) && !strcmp(s.knob[i].labels[j], eq + 1))
                    v = s.knob[i].cand[j];
        assert_int_equal(tpk_tune_config_set(&s, &c, tok, v), TPK_OK);
    }
    /* a host without 512-bit vectors runs the variant at 256 bits (the other knobs as asked) */
    if (tpk_tune_config_get(&s, &c, "vw", 0) > s.machine.vector_bits)
        assert_int_equal(tpk_tune_config_set(&s, &c, "vw", 256), TPK_OK);
    assert_true(tpk_tune_space_valid(&s, &c));
    char src[256], so[256];
    snprintf(src, sizeof src, "/tmp/tpk_test_map_%ld_%s.c", (long)getpid(), tag);
    snprintf(so, sizeof so, "/tmp/tpk_test_map_%ld_%s.so", (long)getpid(), tag);
    FILE *f = fopen(src, "w");
    assert_non_null(f);
    assert_int_equal(tpk_tune_emit(&s, &c, "tpk_kernel", 1, f, &ctx), TPK_OK);
    fclose(f);
    assert_int_equal(tpk_tune_compile_cpu(src, so, "gcc", 120, NULL, &ctx), TPK_OK);
    tpk_tune_pin_openmp();
    void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(h);
    unlink(src);
    unlink(so);
    return h;
}

/* Every arccos variant, 1/√q precomputed or not, 256/512-bit, each split, both dtypes. */
static void test_variants(void **state)
{
    (void)state;
    static const struct { int dtype, threads; const char *knobs; } v[] = {
        {0, 1, "acos=poly,rq=pre,vw=512,un=2"},
        {0, 2, "acos=mvec,rq=sqrt,vw=256,un=4,split=tiles,sched=dynamic,chunk=4,mb=8,nb=64"},
        {0, 2, "acos=atan2,rq=pre,vw=512,un=1,split=balanced,sched=static,chunk=1,mb=4,nb=128"},
        {1, 1, "acos=poly,rq=sqrt,vw=256,un=1,mb=32"},
        {1, 2, "acos=mvec,rq=pre,vw=512,un=2,split=tiles,sched=static,chunk=16,nb=64"},
        {1, 2, "acos=atan2,rq=sqrt,vw=512,un=4,split=rows,sched=static,chunk=4,mb=4,nb=64"},
    };
    static const size_t sizes[] = {1, 2, 17, 203};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        char tag[16];
        snprintf(tag, sizeof tag, "v%zu", i);
        void *h = build_variant(v[i].dtype, v[i].threads, v[i].knobs, tag);
        void *fn = dlsym(h, "tpk_kernel");
        tpk_map_ws_fn wsf = (tpk_map_ws_fn)dlsym(h, "tpk_kernel_ws");
        assert_non_null(fn);
        assert_non_null(wsf);
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            double e = v[i].dtype == 0 ? check_d((tpk_dmap_kernel_fn)fn, wsf, sizes[k], v[i].threads)
                                       : check_s((tpk_smap_kernel_fn)fn, wsf, sizes[k], v[i].threads);
            if (!(e <= (v[i].dtype == 0 ? TOL_F64 : TOL_F32)))
                fail_msg("%s (%s) n=%zu: error %g", v[i].knobs, v[i].dtype ? "f32" : "f64", sizes[k], e);
        }
        /* no dlclose: OpenMP code (tuner-notes §3) */
    }
}

/* The library's generated kernels: every table entry and the defaults, through the table and
 * through the dispatcher (exact, nearest, default). */
static void test_library_kernels(void **state)
{
    (void)state;
    /* every class this CPU runs (on an AVX-512 machine, the AVX2 class's kernels too) */
    for (size_t ci = 0; ci < tpk__machine_nclasses; ci++) {
    if (tpk__machine_classes[ci].isa > tpk_machine_host_isa())
        continue;
    const tpk__map_class *cls = tpk__map_classes[ci];
    for (size_t i = 0; i < cls->len + 2; i++) {
        const tpk__map_entry *e = i < cls->len ? &cls->table[i] : &cls->defaults[i - cls->len];
        if (!e->name)
            continue;
        for (int nt = 1; nt <= 2; nt++) {
            double err = e->dfn ? check_d(e->dfn, e->ws, 203, nt) : check_s(e->sfn, e->ws, 203, nt);
            if (!(err <= (e->dfn ? TOL_F64 : TOL_F32)))
                fail_msg("%s (%s), %d thread(s): error %g", e->name, tpk__machine_classes[ci].id, nt, err);
        }
    }
    }
    const tpk__map_class *cl = tpk__map_classes[tpk__machine_index(NULL)];
    const char *name = NULL;
    setenv("TPK_MAP", "default", 1);
    assert_int_equal(tpk_relu_map_tuned_choice(0, 4096, 2, &name), TPK_MAP_DEFAULT);
    assert_string_equal(name, cl->defaults[0].name);
    setenv("TPK_MAP", "reference", 1);
    assert_int_equal(tpk_relu_map_tuned_choice(1, 4096, 2, &name), TPK_MAP_REFERENCE);
    unsetenv("TPK_MAP");
    for (size_t i = 0; i < cl->len; i++) {
        const tpk__map_entry *e = &cl->table[i];
        if (!e->name)
            continue;
        assert_int_equal(tpk_relu_map_tuned_choice(e->dtype, e->n, e->threads, &name), TPK_MAP_EXACT);
        assert_string_equal(name, e->name);
        assert_int_equal(tpk_relu_map_tuned_choice(e->dtype, e->n + 1, e->threads, NULL), TPK_MAP_NEAREST);
    }
    /* the public entry points: both dtypes, errors */
    const size_t n = 77;
    double *S = malloc(n * n * sizeof *S), *O = malloc(n * n * sizeof *O), *R = malloc(n * n * sizeof *R);
    float *Sf = malloc(n * n * sizeof *Sf), *Of = malloc(n * n * sizeof *Of);
    gram(S, n);
    for (size_t i = 0; i < n * n; i++)
        Sf[i] = (float)S[i];
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    int bad = 1;
    assert_int_equal(tpk_relu_map_tuned_d(n, S, n, ALPHA, BETA, O, n, 0, NULL, &bad, &ctx), TPK_OK);
    assert_int_equal(bad, 0);
    assert_int_equal(tpk_ref_relu_map_d(n, S, n, ALPHA, BETA, R, n), 0);
    bad = 1;
    assert_int_equal(tpk_relu_map_tuned_s(n, Sf, n, (float)ALPHA, (float)BETA, Of, n, 1, NULL, &bad, &ctx), TPK_OK);
    assert_int_equal(bad, 0);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j <= i; j++) {
            assert_true(fabs(O[i * n + j] - R[i * n + j]) <= TOL_F64 * scale(S[i * n + i], S[j * n + j]));
            assert_true(fabs(Of[i * n + j] - R[i * n + j]) <= TOL_F32 * scale(S[i * n + i], S[j * n + j]));
        }
    assert_true(tpk_relu_map_tuned_ws_size(0, n, 2) > 0);
    assert_int_equal(tpk_relu_map_tuned_d(n, S, n - 1, ALPHA, BETA, O, n, 1, NULL, NULL, &ctx), TPK_EINVAL);
    assert_int_equal(tpk_relu_map_tuned_d(n, NULL, n, ALPHA, BETA, O, n, 1, NULL, NULL, &ctx), TPK_EINVAL);
    S[5 * n + 5] = -1;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_relu_map_tuned_d(n, S, n, ALPHA, BETA, O, n, 1, NULL, NULL, &ctx), TPK_EDOM);
    assert_non_null(strstr(ctx.msg, "variance"));
    assert_int_equal(tpk_relu_map_tuned_d(0, NULL, 0, ALPHA, BETA, NULL, 0, 1, NULL, &bad, &ctx), TPK_OK);
    free(S), free(O), free(R), free(Sf), free(Of);
}

/* kernels/gauss_map.c: relu's lower-triangle map with the tuned kernel (default) against the
 * same call under TPK_MAP=reference; its error paths in and out of place. */
static void test_gauss_map_relu(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_phi_registry_alloc(&ctx);
    assert_non_null(reg);
    tpk_phi *relu = tpk_phi_alloc(reg, "relu", &ctx);
    assert_non_null(relu);
    const size_t n = 301; /* > 128: the map's OpenMP threshold */
    double *S = malloc(n * n * sizeof *S), *A = malloc(n * n * sizeof *A), *B = malloc(n * n * sizeof *B);
    gram(S, n);
    double ea = -1, eb = -1;
    unsetenv("TPK_MAP");
    assert_int_not_equal(tpk_relu_map_tuned_choice(0, n, 0, NULL), TPK_MAP_REFERENCE);
    assert_int_equal(tpk_gauss_map_affine_lower(relu, S, n, ALPHA, BETA, A, NULL, &ea, &ctx), TPK_OK);
    setenv("TPK_MAP", "reference", 1);
    assert_int_equal(tpk_gauss_map_affine_lower(relu, S, n, ALPHA, BETA, B, NULL, &eb, &ctx), TPK_OK);
    unsetenv("TPK_MAP");
    assert_true(ea == eb && ea > 0);
    for (size_t i = 0; i < n; i++) {
        assert_true(A[i * n + i] == B[i * n + i]); /* the diagonal: the same scalar fix-up */
        for (size_t j = 0; j <= i; j++) {
            double e = fabs(A[i * n + j] - B[i * n + j]) / scale(S[i * n + i], S[j * n + j]);
            if (!(e <= TOL_F64))
                fail_msg("(%zu,%zu): tuned %.17g reference %.17g", i, j, A[i * n + j], B[i * n + j]);
        }
    }
    /* the mirrored map (tpk_gauss_map_affine: the MLP's last layer, GP kernels): whole matrix */
    assert_int_equal(tpk_gauss_map_affine(relu, S, n, ALPHA, BETA, A, NULL, &ea, &ctx), TPK_OK);
    setenv("TPK_MAP", "reference", 1);
    assert_int_equal(tpk_gauss_map_affine(relu, S, n, ALPHA, BETA, B, NULL, &eb, &ctx), TPK_OK);
    unsetenv("TPK_MAP");
    assert_true(ea == eb);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            double e = fabs(A[i * n + j] - B[i * n + j]) / scale(S[i * n + i], S[j * n + j]);
            if (!(e <= TOL_F64) || A[i * n + j] != A[j * n + i])
                fail_msg("mirrored (%zu,%zu): tuned %.17g reference %.17g", i, j, A[i * n + j], B[i * n + j]);
        }
    assert_int_equal(tpk_gauss_map_affine_lower(relu, S, n, ALPHA, BETA, A, NULL, NULL, &ctx), TPK_OK);
    /* in place, as the MLP recursion calls it */
    memcpy(B, S, n * n * sizeof *B);
    assert_int_equal(tpk_gauss_map_affine_lower(relu, B, n, ALPHA, BETA, B, NULL, NULL, &ctx), TPK_OK);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j <= i; j++)
            assert_true(B[i * n + j] == A[i * n + j]);
    /* a covariance beyond its bound: out of place the reference names the entry; in place the
     * tuned kernel reports it without the entry */
    S[200 * n + 100] = 5 * sqrt(S[200 * n + 200] * S[100 * n + 100]) + 1;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gauss_map_affine_lower(relu, S, n, ALPHA, BETA, A, NULL, NULL, &ctx), TPK_EDOM);
    assert_non_null(strstr(ctx.msg, "(200,100)"));
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_gauss_map_affine_lower(relu, S, n, ALPHA, BETA, S, NULL, NULL, &ctx), TPK_EDOM);
    assert_non_null(strstr(ctx.msg, "not PSD"));
    tpk_phi_free(relu);
    tpk_phi_registry_free(reg);
    free(S), free(A), free(B);
}

/* The contents of path, malloc'd (len set). */
static char *slurp(const char *path, size_t *len)
{
    FILE *g = fopen(path, "rb");
    if (!g)
        fail_msg("%s: cannot open", path);
    fseek(g, 0, SEEK_END);
    long n = ftell(g);
    fseek(g, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    *len = fread(buf, 1, (size_t)n, g);
    fclose(g);
    return buf;
}

/* What one generator writes, twice (it must not depend on anything but its inputs). */
typedef int (*gen_fn)(const tpk_tune_record *recs, size_t n, const tpk_machine *cls, const char *generator,
                      FILE *out, tpk_ctx *ctx);
static void expect_generated(const char *path, gen_fn gen, const tpk_tune_record *all, size_t nall,
                             const tpk_machine *cls, const char *must_have)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    char *buf = NULL, *buf2 = NULL;
    size_t len = 0, len2 = 0, flen;
    FILE *m = open_memstream(&buf, &len), *m2 = open_memstream(&buf2, &len2);
    assert_int_equal(gen(all, nall, cls, "tptune gen", m, &ctx), TPK_OK);
    assert_int_equal(gen(all, nall, cls, "tptune gen", m2, &ctx), TPK_OK);
    fclose(m);
    fclose(m2);
    assert_true(len == len2 && memcmp(buf, buf2, len) == 0);
    char *file = slurp(path, &flen);
    if (flen != len || memcmp(file, buf, len) != 0)
        fail_msg("%s is not what data/machines and data/tuning generate", path);
    if (must_have)
        assert_non_null(strstr(buf, must_have));
    free(file), free(buf), free(buf2);
}

/* gen/ is what the class files and the shipped logs generate, byte for byte (style.md §10): for
 * every class its GEMM and map tables, and the class index; and the host is not an input. */
static void test_regeneration(void **state)
{
    (void)state;
    const char *root = getenv("TPK_ROOT");
    if (!root) {
        skip();
        return;
    }
    char path[1024];
    tpk_tune_record *all = NULL;
    size_t nall = 0;
    /* the Makefile passes every log under data/tuning sorted by name: the same here (glob sorts) */
    snprintf(path, sizeof path, "%s/data/tuning/*.jsonl", root);
    glob_t gl;
    assert_int_equal(glob(path, 0, NULL, &gl), 0);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    for (size_t i = 0; i < gl.gl_pathc; i++) {
        tpk_tune_record *r;
        size_t n;
        assert_int_equal(tpk_tune_log_read(gl.gl_pathv[i], &r, &n, &ctx), TPK_OK);
        all = realloc(all, (nall + n + 1) * sizeof *all);
        memcpy(all + nall, r, n * sizeof *r);
        nall += n;
        free(r);
    }
    globfree(&gl);
    snprintf(path, sizeof path, "%s/data/machines/*.conf", root);
    assert_int_equal(glob(path, 0, NULL, &gl), 0);
    assert_true(gl.gl_pathc >= 1);
    tpk_tune_class *cls = calloc(gl.gl_pathc, sizeof *cls);
    int tuned_classes = 0;
    for (size_t i = 0; i < gl.gl_pathc; i++) {
        assert_int_equal(tpk_tune_class_read(gl.gl_pathv[i], &cls[i], &ctx), TPK_OK);
        int has = 0;
        for (size_t r = 0; r < nall; r++)
            has |= !strcmp(all[r].target_class, cls[i].name);
        tuned_classes += has;
        /* a class with logs names a tuned kernel per workload (rows for f64 on one thread, whatever
         * variant won); one without has an empty table */
        snprintf(path, sizeof path, "%s/gen/tpk_map_cpu_%s.c", root, cls[i].id);
        expect_generated(path, tpk_tune_gen_map_library, all, nall, &cls[i].m, has ? "{0, 1, " : ", 0, defaults}");
        snprintf(path, sizeof path, "%s/gen/tpk_gemm_cpu_%s.c", root, cls[i].id);
        expect_generated(path, tpk_tune_gen_cpu_library, all, nall, &cls[i].m, has ? "{0, 0, 1, " : ", 0, defaults}");
    }
    assert_true(tuned_classes >= 1);
    char *buf = NULL;
    size_t len = 0, flen;
    FILE *m = open_memstream(&buf, &len);
    assert_int_equal(tpk_tune_gen_class_index(cls, gl.gl_pathc, "tptune gen", m, &ctx), TPK_OK);
    fclose(m);
    snprintf(path, sizeof path, "%s/gen/tpk_classes.c", root);
    char *file = slurp(path, &flen);
    assert_true(flen == len && memcmp(file, buf, len) == 0);
    free(file), free(buf);
    globfree(&gl);
    free(cls), free(all);
}

/* Class files: what a good one gives, and every error named with its place. */
static void test_class_files(void **state)
{
    (void)state;
    char dir[] = "/tmp/tpk-class-XXXXXX", path[256];
    assert_non_null(mkdtemp(dir));
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_tune_class c;
    static const struct { const char *text, *err; } cases[] = {
        {"name cpu/x/y\nisa avx2\nvector_bits 256\nregisters 16\nl1 32768 # L1d\nl2 262144\nl3 8388608\n"
         "cflags -march=x86-64-v3\n", NULL},
        {"name a\nisa sse9\n", "good.conf:2: isa must be"},
        {"name a\nisa avx2\nvector_bits 256\nregisters 16\nl1 32768\nl2 262144\n", "needs name, isa"},
        {"name a\nl1 -5\n", "good.conf:2: l1 must be an integer"},
        {"name a\nfrobs 3\n", "good.conf:2: unknown key 'frobs'"},
    };
    snprintf(path, sizeof path, "%s/good.conf", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        FILE *f = fopen(path, "w");
        fputs(cases[i].text, f);
        fclose(f);
        tpk_ctx_clear(&ctx);
        int st = tpk_tune_class_read(path, &c, &ctx);
        if (!cases[i].err) {
            assert_int_equal(st, TPK_OK);
            assert_string_equal(c.m.name, "cpu/x/y");
            assert_string_equal(c.m.id, "good");
            assert_int_equal(c.m.isa, TPK_ISA_AVX2);
            assert_true(c.m.registers == 16 && c.m.vector_bits == 256 && c.m.l1 == 32768 && c.m.l3 == 8388608);
            assert_string_equal(c.cflags, "-march=x86-64-v3");
        } else {
            assert_int_equal(st, TPK_EINVAL);
            if (!strstr(ctx.msg, cases[i].err))
                fail_msg("case %zu: '%s' does not say '%s'", i, ctx.msg, cases[i].err);
        }
    }
    tpk_ctx_clear(&ctx);
    assert_int_equal(tpk_tune_class_read("/nonexistent/x.conf", &c, &ctx), TPK_EIO);
    remove(path);
    rmdir(dir);
}

/* The measuring child: the default kernel passes and is timed; the same kernel with a wrong
 * constant (α/(2π) off by 1e-9 relative) is rejected. */
static void test_measure_child(void **state)
{
    (void)state;
    tpk_tune_pin_openmp();
    void *h = build_variant(0, 1, "mb=8", "ok");
    tpk_tune_result r;
    memset(&r, 0, sizeof r);
    assert_int_equal(tpk__cpu_map_child(h, 0, 96, 1, 1, 1.0, &r), TPK_TUNE_OK);
    assert_true(r.gflops > 0 && r.max_rel_err <= TOL_F64);
    /* a wrong kernel: patch the emitted source */
    tpk_tune_task t = {TPK_TUNE_CPU, 0, 96, 96, 1, 1, TPK_TUNE_MAP};
    tpk_tune_space s;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_tune_space_init(&s, &t, &ctx), TPK_OK);
    tpk_tune_config c;
    tpk_tune_space_default(&s, &c);
    char *src = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&src, &len);
    assert_int_equal(tpk_tune_emit(&s, &c, "tpk_kernel", 1, m, &ctx), TPK_OK);
    fclose(m);
    char *at = strstr(src, "0.15915494309189533577");
    assert_non_null(at);
    memcpy(at, "0.15915494325", 13); /* 1e-9 relative: far above 1e-14 */
    char cpath[256], so[256];
    snprintf(cpath, sizeof cpath, "/tmp/tpk_test_map_%ld_bad.c", (long)getpid());
    snprintf(so, sizeof so, "/tmp/tpk_test_map_%ld_bad.so", (long)getpid());
    FILE *f = fopen(cpath, "w");
    fputs(src, f);
    fclose(f);
    free(src);
    assert_int_equal(tpk_tune_compile_cpu(cpath, so, "gcc", 120, NULL, &ctx), TPK_OK);
    void *hb = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(hb);
    unlink(cpath);
    unlink(so);
    memset(&r, 0, sizeof r);
    assert_int_equal(tpk__cpu_map_child(hb, 0, 96, 1, 1, 1.0, &r), TPK_TUNE_EWRONG);
    assert_true(r.max_rel_err > TOL_F64);
}

/* Space: constraints and features; records round-trip through the log. */
static void test_space_and_log(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_tune_task t = {TPK_TUNE_CPU, 1, 1000, 1000, 1, 2, TPK_TUNE_MAP};
    tpk_tune_space s;
    assert_int_equal(tpk_tune_space_init(&s, &t, &ctx), TPK_OK);
    assert_string_equal(s.template_name, "cpu_map");
    assert_string_equal(tpk_tune_op_name(TPK_TUNE_MAP), "relu_map");
    uint64_t seed = 7, nvalid = 0;
    for (int i = 0; i < 200; i++) {
        tpk_tune_config c;
        tpk_tune_space_point(&s, tpk_tune_space_random(&s, &seed), &c);
        nvalid += tpk_tune_space_valid(&s, &c);
        float f[TPK_TUNE_MAX_FEATURES];
        int nf = s.features(&s, &c, f, TPK_TUNE_MAX_FEATURES);
        assert_true(nf > 20);
        for (int j = 0; j < nf; j++)
            assert_true(isfinite(f[j]));
    }
    assert_int_equal(nvalid, 200);
    tpk_tune_config c;
    tpk_tune_space_default(&s, &c);
    assert_int_equal(tpk_tune_config_set(&s, &c, "split", 2 /* balanced */), TPK_OK);
    assert_int_equal(tpk_tune_config_set(&s, &c, "sched", 1), TPK_OK);
    assert_false(tpk_tune_space_valid(&s, &c)); /* balanced ignores the schedule */
    tpk_tune_space_default(&s, &c);
    assert_int_equal(tpk_tune_config_set(&s, &c, "nb", 4096), TPK_OK);
    assert_false(tpk_tune_space_valid(&s, &c)); /* a column block twice the problem */
    /* wrong workloads */
    t.n = 999;
    assert_int_equal(tpk_tune_space_init(&s, &t, &ctx), TPK_EINVAL);
    t.n = 1000;
    t.target = TPK_TUNE_CUDA;
    assert_int_equal(tpk_tune_space_init(&s, &t, &ctx), TPK_EINVAL);
    /* a record written and read back names the same configuration */
    t.target = TPK_TUNE_CPU;
    assert_int_equal(tpk_tune_space_init(&s, &t, &ctx), TPK_OK);
    tpk_tune_space_default(&s, &c);
    tpk_tune_result res = {.err = 0, .gflops = 0.5, .ncost = 1, .costs_s = {1e-3}, .cpu_ratio = 1};
    tpk_tune_record rec;
    tpk_tune_record_fill(&rec, &s, &c, &res);
    char p[128];
    snprintf(p, sizeof p, "/tmp/tpk_test_map_%ld.jsonl", (long)getpid());
    FILE *f = fopen(p, "w");
    assert_int_equal(tpk_tune_log_write(f, &rec, &ctx), TPK_OK);
    fclose(f);
    tpk_tune_record *back;
    size_t nb;
    assert_int_equal(tpk_tune_log_read(p, &back, &nb, &ctx), TPK_OK);
    unlink(p);
    assert_int_equal(nb, 1);
    assert_int_equal(back[0].task.op, TPK_TUNE_MAP);
    tpk_tune_config c2;
    assert_int_equal(tpk_tune_record_config(&s, &back[0], &c2, &ctx), TPK_OK);
    assert_memory_equal(&c, &c2, sizeof c);
    free(back);
}

/* tptune map → log → tptune show (needs TPK_BIN, as make check sets). */
static void test_cli(void **state)
{
    (void)state;
    const char *bin = getenv("TPK_BIN");
    if (!bin) {
        skip();
        return;
    }
    char log[128], cmd[1024];
    snprintf(log, sizeof log, "/tmp/tpk_test_map_cli_%ld.jsonl", (long)getpid());
    snprintf(cmd, sizeof cmd, "%s/tptune map --n=80 --dtype=f32 --trials=2 --batch=2 --repeat=1 --min-ms=1 "
                              "--log=%s > /dev/null && %s/tptune show %s | grep -q relu_map", bin, log, bin, log);
    assert_int_equal(system(cmd), 0);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_tune_record *r;
    size_t n;
    assert_int_equal(tpk_tune_log_read(log, &r, &n, &ctx), TPK_OK);
    assert_int_equal(n, 2);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(r[i].task.op, TPK_TUNE_MAP);
        assert_string_equal(r[i].template_name, "cpu_map");
        assert_int_equal(r[i].result.err, 0);
    }
    free(r);
    unlink(log);
    snprintf(cmd, sizeof cmd, "%s/tptune map --n=80 --target=cuda --log=%s 2> /dev/null", bin, log);
    assert_int_not_equal(system(cmd), 0);
    unlink(log);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_closed_form),
        cmocka_unit_test(test_space_and_log),
        cmocka_unit_test(test_variants),
        cmocka_unit_test(test_library_kernels),
        cmocka_unit_test(test_gauss_map_relu),
        cmocka_unit_test(test_regeneration),
        cmocka_unit_test(test_class_files),
        cmocka_unit_test(test_measure_child),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
