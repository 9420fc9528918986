/* Fused entrywise candidates (tuner/ew.c, docs/orchestration.md §7.3): signatures parse and print
 * canonically, bad ones are refused with their column; random candidates — maps of three φ, sums
 * with weights and biases, stored intermediates, both vector widths — pass the exact check of
 * their Z_p twin and the tolerance check against libm; every injected bug of the emitter's sites
 * is caught; the emitted kernel computes what the evaluator's own executor computes for the same
 * candidate (two back ends, one program, through `netsor plan --signatures`'s text, and whole
 * programs under `netsor plan --emitted`); the CUDA
 * source compiles with nvcc where it is installed and, compiled as C, its host emulation (the
 * same per-thread code over the launch's grid) agrees with libm; the cache finds the fastest record of its key;
 * and `tptune ew` as a program (cache hits, the netsor pipe, errors). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tpk/tpk.h"
#include "tpk/job.h"
#include "tpk/machine.h"
#include "tpk/tune.h"
#include "../netsor/ewplan-impl.h"
#include "../tuner/tune_impl.h"
#include "support/testutil.h"

static void test_parse(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    static const char *const good[] = {
        "in=1;relu(v0)",
        "in=2;relu(v1);sum(v0*w,v2*w);relu(v3)!;sum(v0,v2,v4,b*w)",
        "in=0;sum(b)",
        "in=1;erf[0.5](v0)!;identity(v1)",
        "in=3;erf(v2);sum(v0,v1*w,v3*w,b)",
    };
    static const char *const canon[] = {
        "in=1;relu(v0)",
        "in=2;relu(v1);sum(v0*w,v2*w);relu(v3)!;sum(v0,v2,v4,b*w)",
        "in=0;sum(b)",
        "in=1;erf[0.5](v0)!;identity(v1)",
        "in=3;erf(v2);sum(v0,v1*w,v3*w,b)",
    };
    for (int i = 0; i < 5; i++) {
        tpk_tune_ew e, e2;
        char out[TPK_TUNE_EW_SIGLEN], out2[TPK_TUNE_EW_SIGLEN];
        assert_int_equal(tpk_tune_ew_parse(good[i], &e, &ctx), TPK_OK);
        tpk_tune_ew_print(&e, out, sizeof out);
        assert_string_equal(out, canon[i]);
        assert_int_equal(tpk_tune_ew_parse(out, &e2, &ctx), TPK_OK); /* a fixed point */
        tpk_tune_ew_print(&e2, out2, sizeof out2);
        assert_string_equal(out, out2);
        assert_int_equal(e.p[e.np - 1].stored, 1);
    }
    tpk_tune_ew e;
    assert_int_equal(tpk_tune_ew_parse("in=2;sum(v0,v1*w,b)", &e, &ctx), TPK_OK);
    int npar, nw;
    tpk_tune_ew_counts(&e, &npar, &nw);
    assert_int_equal(npar, 3);
    assert_int_equal(nw, 1);
    static const struct {
        const char *sig;
        int col;
    } bad[] = {
        {"relu(v0)", 1},             /* no in= */
        {"in=1;relu(v1)", 11},       /* v1 is the map itself */
        {"in=1;tanh(v0)", 6},        /* no emitted map */
        {"in=1;sum(v0,)", 13},       /* empty term */
        {"in=1;relu(v0)x", 14},      /* trailing text */
        {"in=1", 5},                 /* no primitive */
        {"in=17;sum(v0)", 4},        /* too many inputs */
        {"in=1;erf[x](v0)", 9},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tpk_ctx_init(&ctx);
        assert_int_equal(tpk_tune_ew_parse(bad[i].sig, &e, &ctx), TPK_EINVAL);
        char want[32];
        snprintf(want, sizeof want, "column %d:", bad[i].col);
        if (!strstr(ctx.msg, want))
            fail_msg("%s: '%s' lacks '%s'", bad[i].sig, ctx.msg, want);
    }
    char many[TPK_TUNE_EW_SIGLEN] = "in=1";
    for (int i = 0; i < 17; i++)
        strcat(many, ";relu(v0)");
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_tune_ew_parse(many, &e, &ctx), TPK_EINVAL);
    assert_non_null(strstr(ctx.msg, "more than 16"));
    tpk_ctx_init(&ctx); /* a primitive nothing reads or stores */
    assert_int_equal(tpk_tune_ew_parse("in=1;relu(v0);erf(v0)", &e, &ctx), TPK_EINVAL);
    assert_non_null(strstr(ctx.msg, "primitive 0 (v1) is neither stored"));
}

/* A random candidate: 1–3 inputs, 2–7 primitives (maps of relu / erf / identity, sums of up to
 * four terms with weights and biases), some intermediates stored. */
static void random_sig(uint64_t *s, char *out, size_t cap)
{
    const int nin = 1 + (int)(tpk__rng_next(s) % 3), np = 2 + (int)(tpk__rng_next(s) % 6);
    size_t at = (size_t)snprintf(out, cap, "in=%d", nin);
    for (int p = 0; p < np; p++) {
        const int nval = nin + p;
        const int kind = (int)(tpk__rng_next(s) % 4);
        if (kind < 2) {
            static const char *const phi[] = {"relu", "erf", "erf[0.6]", "identity"};
            at += (size_t)snprintf(out + at, cap - at, ";%s(v%d)", phi[tpk__rng_next(s) % 4],
                                   (int)(tpk__rng_next(s) % (uint64_t)nval));
        } else {
            const int nt = 1 + (int)(tpk__rng_next(s) % 4);
            at += (size_t)snprintf(out + at, cap - at, ";sum(");
            for (int t = 0; t < nt; t++) {
                const int bias = tpk__rng_next(s) % 5 == 0;
                if (bias)
                    at += (size_t)snprintf(out + at, cap - at, "%sb", t ? "," : "");
                else
                    at += (size_t)snprintf(out + at, cap - at, "%sv%d", t ? "," : "",
                                           (int)(tpk__rng_next(s) % (uint64_t)nval));
                if (tpk__rng_next(s) % 2)
                    at += (size_t)snprintf(out + at, cap - at, "*w");
            }
            at += (size_t)snprintf(out + at, cap - at, ")");
        }
        if (p + 1 < np && tpk__rng_next(s) % 3 == 0)
            at += (size_t)snprintf(out + at, cap - at, "!");
    }
}

/* Primitives nothing reads stored: a candidate writes its sinks. */
static void store_sinks(char *sig)
{
    char out[TPK_TUNE_EW_SIGLEN] = "";
    const char *p = sig;
    int q = 0, nin = atoi(sig + 3);
    for (const char *semi = strchr(p, ';'); semi; q++) {
        const char *next = strchr(semi + 1, ';');
        size_t len = next ? (size_t)(next - semi) : strlen(semi);
        char ref[16];
        snprintf(ref, sizeof ref, "v%d", nin + q);
        int read = 0;
        for (const char *r = next; r && (r = strstr(r, ref)) != NULL; r++)
            read |= !isdigit((unsigned char)r[strlen(ref)]);
        strncat(out, semi, len);
        if (!read && next && semi[len - 1] != '!')
            strcat(out, "!");
        semi = next;
    }
    snprintf(sig + strcspn(sig, ";"), TPK_TUNE_EW_SIGLEN - strcspn(sig, ";"), "%s", out);
}

static int host_lanes8(void)
{
    return tpk_machine_host_isa() >= TPK_ISA_AVX512;
}

static void test_verify_random(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    uint64_t s = 2026;
    for (int k = 0; k < 8; k++) {
        char sig[TPK_TUNE_EW_SIGLEN];
        random_sig(&s, sig, sizeof sig);
        store_sinks(sig);
        tpk_tune_ew e;
        assert_int_equal(tpk_tune_ew_parse(sig, &e, &ctx), TPK_OK);
        tpk_tune_ew_cfg c = {k % 2 && host_lanes8() ? 8 : 4, 1 + 3 * (k % 3), k / 2 % 2};
        tpk_tune_ew_report r;
        assert_int_equal(tpk_tune_ew_verify(&e, &c, NULL, NULL, 0, (uint64_t)k, NULL, &r, &ctx), TPK_OK);
        if (!r.exact_ok || !r.real_ok || !r.cuda_ok)
            fail_msg("%s lanes=%d: exact %d, real %d (%.3g), CUDA host emulation %d (%.3g)", sig, c.lanes, r.exact_ok,
                     r.real_ok, r.max_rel_err, r.cuda_ok, r.cuda_max_rel_err);
        /* every stored primitive's lower triangle over the five runs (n = 1, 2, 37, 3L + 5, 37) */
        int stored = 0;
        for (int p = 0; p < e.np; p++)
            stored += e.p[p].stored;
        const long L = 3 * c.lanes + 5, per = 1 + 3 + 703 + L * (L + 1) / 2 + 703;
        assert_int_equal(r.entries, stored * per);
        assert_true(r.max_rel_err <= 1e-12 && r.cuda_max_rel_err <= 1e-12);
    }
}

/* A candidate with every kind of site; every mutant caught. */
static void test_mutants(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_tune_ew e;
    assert_int_equal(tpk_tune_ew_parse("in=3;erf[0.7](v2)!;sum(v0,v1*w,v3*w,b);relu(v4)", &e, &ctx), TPK_OK);
    for (int v = 0; v < 4; v++) {
        const int lanes = v % 2 && host_lanes8() ? 8 : 4, pre = v / 2;
        tpk_tune_ew_cfg c = {lanes, 4, pre};
        tpk__mutation all = {.kind = -1};
        FILE *null = fopen("/dev/null", "w");
        assert_int_equal(tpk__ew_emit(&e, &c, "k", 1, 1, &all, null, &ctx), TPK_OK);
        fclose(null);
        int sites = 0;
        for (int k = TPK__MUT_EW_STEP; k <= (pre ? TPK__MUT_EW_PRE_END : TPK__MUT_EW_ARG_PREV); k++) {
            if (all.count[k] == 0)
                fail_msg("mutation kind %s has no site", tpk__mut_name(k));
            sites += all.count[k];
        }
        tpk_tune_ew_report r;
        assert_int_equal(tpk_tune_ew_verify(&e, &c, NULL, NULL, 1000, 7, NULL, &r, &ctx), TPK_OK);
        assert_true(r.exact_ok && r.real_ok);
        assert_int_equal(r.mutants, sites);
        assert_int_equal(r.caught, r.mutants);
    }
}

static void test_cuda(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_tune_ew e;
    assert_int_equal(tpk_tune_ew_parse("in=2;relu(v1);sum(v0*w,v2*w,b);erf[0.5](v3)!;identity(v4)", &e, &ctx),
                     TPK_OK);
    char nv[1024];
    const char *nvcc = tpk_tune_nvcc(nv, sizeof nv);
    char dir[] = "/tmp/tpk_ewcuXXXXXX";
    assert_non_null(mkdtemp(dir));
    char cu[128], obj[128], cmd[1400];
    snprintf(cu, sizeof cu, "%s/k.cu", dir);
    snprintf(obj, sizeof obj, "%s/k.cubin", dir);
    FILE *f = fopen(cu, "w");
    assert_non_null(f);
    assert_int_equal(tpk_tune_ew_emit_cuda(&e, "tpk_ew_k", f, &ctx), TPK_OK);
    fclose(f);
    char text[16384];
    f = fopen(cu, "r");
    size_t len = fread(text, 1, sizeof text - 1, f);
    text[len] = '\0';
    fclose(f);
    assert_non_null(strstr(text, "__global__ void tpk_ew_k("));
    assert_non_null(strstr(text, "tpk_ew_k_launch("));
    assert_non_null(strstr(text, "out[2][ij]")); /* the stored intermediate */
    assert_non_null(strstr(text, "out[3][ij]"));
    assert_null(strstr(text, "out[0][ij]"));
    assert_null(strstr(text, "out[1][ij]"));
    if (nvcc) {
        snprintf(cmd, sizeof cmd, "'%s' -arch=sm_90 -cubin -Werror all-warnings -o '%s' '%s' 2>&1", nvcc, obj, cu);
        char out[4096];
        int rc = tu_capture(cmd, out, sizeof out);
        if (rc != 0)
            fail_msg("nvcc: %s", out);
    } else
        printf("(nvcc not found: the CUDA source is checked as text only)\n");
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_cache(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    char path[] = "/tmp/tpk_ewcacheXXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    unlink(path);
    tpk_tune_ew_rec key = {.n = 512, .threads = 2, .cfg = {8, 4, 1}, .verified = 1};
    snprintf(key.target_class, sizeof key.target_class, "cpu/x86_64/avx512/intel");
    snprintf(key.sig, sizeof key.sig, "in=1;relu(v0)");
    tpk_tune_ew_rec hit;
    int found = 1;
    assert_int_equal(tpk_tune_ew_cache_find(path, &key, NULL, &hit, &found, &ctx), TPK_OK); /* no file yet */
    assert_int_equal(found, 0);
    const double secs[] = {0.5, 0.25, 0.75};
    const int chunks[] = {1, 4, 16};
    for (int i = 0; i < 3; i++) {
        tpk_tune_ew_rec r = key;
        r.cfg.chunk = chunks[i];
        r.seconds = secs[i];
        assert_int_equal(tpk_tune_ew_cache_add(path, &r, &ctx), TPK_OK);
    }
    tpk_tune_ew_rec other = key; /* another n, another class, an unverified record */
    other.n = 1024;
    other.seconds = 0.01;
    assert_int_equal(tpk_tune_ew_cache_add(path, &other, &ctx), TPK_OK);
    other = key;
    snprintf(other.target_class, sizeof other.target_class, "cpu/x86_64/avx2");
    other.seconds = 0.01;
    assert_int_equal(tpk_tune_ew_cache_add(path, &other, &ctx), TPK_OK);
    other = key;
    other.verified = 0;
    other.seconds = 0.01;
    assert_int_equal(tpk_tune_ew_cache_add(path, &other, &ctx), TPK_OK);
    assert_int_equal(tpk_tune_ew_cache_find(path, &key, NULL, &hit, &found, &ctx), TPK_OK);
    assert_int_equal(found, 1);
    assert_true(hit.seconds == 0.25 && hit.cfg.chunk == 4 && hit.cfg.lanes == 8);
    tpk_tune_ew_cfg c16 = {8, 16, 1};
    assert_int_equal(tpk_tune_ew_cache_find(path, &key, &c16, &hit, &found, &ctx), TPK_OK);
    assert_true(found && hit.seconds == 0.75);
    tpk_tune_ew_cfg c4l = {4, 4, 1};
    assert_int_equal(tpk_tune_ew_cache_find(path, &key, &c4l, &hit, &found, &ctx), TPK_OK);
    assert_int_equal(found, 0);
    /* the cache's path: an option as given, "none" none, else under $XDG_CACHE_HOME (made) */
    char cp[4096], xdg[] = "/tmp/tpk_ewxdgXXXXXX", want[600];
    tpk_tune_ew_cache_path("x.jsonl", cp, sizeof cp);
    assert_string_equal(cp, "x.jsonl");
    tpk_tune_ew_cache_path("none", cp, sizeof cp);
    assert_string_equal(cp, "");
    assert_non_null(mkdtemp(xdg));
    const char *old_xdg = getenv("XDG_CACHE_HOME");
    char *keep = old_xdg ? strdup(old_xdg) : NULL;
    setenv("XDG_CACHE_HOME", xdg, 1);
    tpk_tune_ew_cache_path(NULL, cp, sizeof cp);
    snprintf(want, sizeof want, "%s/tpk/ew.jsonl", xdg);
    assert_string_equal(cp, want);
    snprintf(want, sizeof want, "%s/tpk", xdg);
    assert_int_equal(access(want, W_OK), 0);
    if (keep)
        setenv("XDG_CACHE_HOME", keep, 1);
    else
        unsetenv("XDG_CACHE_HOME");
    free(keep);
    assert_int_equal(rmdir(want), 0);
    assert_int_equal(rmdir(xdg), 0);
    FILE *f = fopen(path, "a");
    fputs("{\"target\": 3}\n", f);
    fclose(f);
    assert_int_equal(tpk_tune_ew_cache_find(path, &key, NULL, &hit, &found, &ctx), TPK_EFORMAT);
    assert_non_null(strstr(ctx.msg, ":7:"));
    unlink(path);
}

/* The emitted kernel against the evaluator's executor on one program: a LayerNorm-like weighted
 * sum, two maps, a residual sum with a bias, a last map — one fused kernel under the optimal
 * plan, its signature from the report. The arrays the emitted kernel takes are made here from
 * the nodes, in the signature's order. */
static void test_against_executor(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_phi_registry *reg = tpk_job_registry(&ctx);
    tpk_phi *relu = tpk_phi_alloc(reg, "relu", &ctx), *erf = tpk_phi_alloc(reg, "erf", &ctx);
    assert_non_null(relu);
    assert_non_null(erf);
    const size_t n = 203;
    uint64_t s = 11;
    double *M = malloc(n * n * sizeof *M), *X = malloc(n * 5 * sizeof *X), *w = malloc(n * sizeof *w);
    for (size_t i = 0; i < n * 5; i++)
        X[i] = (i / 5) % 9 == 4 ? 0 : 2 * tpk__rng_unif(&s) - 1; /* zero rows: zero variances */
    for (size_t i = 0; i < n; i++) {
        w[i] = 0.5 + tpk__rng_unif(&s);
        for (size_t j = 0; j < n; j++) {
            double a = 0;
            for (int k = 0; k < 5; k++)
                a += X[i * 5 + k] * X[j * 5 + k];
            M[i * n + j] = a / 5;
        }
    }
    static const double bias[1] = {0.3};
    nsr_ew_node nd[6];
    memset(nd, 0, sizeof nd);
    nd[0].op = NSR_EW_LEAF;
    nd[0].M = M;
    nd[1].op = NSR_EW_SUM;
    nd[1].nt = 1;
    nd[1].t[0] = (nsr_ew_term){.arg = 0, .c = 1.5, .w = w};
    nd[2].op = NSR_EW_PHI, nd[2].arg = 1, nd[2].phi = relu, nd[2].alpha = 2.0, nd[2].beta = 0.1;
    nd[3].op = NSR_EW_PHI, nd[3].arg = 1, nd[3].phi = erf, nd[3].alpha = 1.3, nd[3].beta = 0.0;
    nd[4].op = NSR_EW_SUM;
    nd[4].nt = 3;
    nd[4].t[0] = (nsr_ew_term){.arg = 2, .c = 0.5};
    nd[4].t[1] = (nsr_ew_term){.arg = 3, .c = 0.7, .w = w};
    nd[4].t[2] = (nsr_ew_term){.arg = -1, .c = 2.0, .s = bias};
    nd[5].op = NSR_EW_PHI, nd[5].arg = 4, nd[5].phi = relu, nd[5].alpha = 1.1, nd[5].beta = 0.05;
    double *dg[6];
    for (int k = 0; k < 6; k++) {
        dg[k] = malloc(n * sizeof(double));
        nd[k].diag = dg[k];
        snprintf(nd[k].name, sizeof nd[k].name, "node%d", k);
        assert_int_equal(nsr_ew_diag(nd, k, n, 1, NULL, "t.nsr", dg[k], NULL, &ctx), TPK_OK);
    }
    double *ref = malloc(n * n * sizeof *ref), *got = malloc((n * n + 64) * sizeof *got);
    char *rep = NULL;
    size_t replen = 0;
    FILE *f = open_memstream(&rep, &replen);
    assert_int_equal(nsr_ew_eval(nd, 6, 5, n, 1, NSR_PLAN_OPTIMAL | NSR_PLAN_SIGNATURES, NULL, NULL, "t.nsr", f, ref, 0,
                                 0, NULL, NULL, &ctx),
                     TPK_OK);
    fclose(f);
    /* small programs run as one kernel; its signature */
    const char *sl = strstr(rep, "sig: ");
    assert_non_null(sl);
    char sig[TPK_TUNE_EW_SIGLEN];
    snprintf(sig, sizeof sig, "%.*s", (int)strcspn(sl + 5, "\n"), sl + 5);
    assert_null(strstr(sl + 5, "sig: "));
    free(rep);
    tpk_tune_ew e;
    assert_int_equal(tpk_tune_ew_parse(sig, &e, &ctx), TPK_OK);
    char canon[TPK_TUNE_EW_SIGLEN];
    tpk_tune_ew_print(&e, canon, sizeof canon);
    assert_string_equal(canon, "in=1;sum(v0*w);relu(v1);erf(v1);sum(v2,v3*w,b);relu(v4)");
    /* the arrays in the signature's order: inputs (the leaf), every value's diagonal, the
     * parameters primitive by primitive, the weights of the "*w" terms */
    const double par[] = {1.5, 2.0, 0.1, 1.3, 0.0, 0.5, 0.7, 2.0 * bias[0], 1.1, 0.05};
    const double *in[1] = {M}, *wv[2] = {w, w}, *dgv[6] = {dg[0], dg[1], dg[2], dg[3], dg[4], dg[5]};
    double *out[5] = {NULL, NULL, NULL, NULL, got};
    int npar, nw;
    tpk_tune_ew_counts(&e, &npar, &nw);
    assert_int_equal(npar, 10);
    assert_int_equal(nw, 2);
    char dir[] = "/tmp/tpk_ewexXXXXXX";
    assert_non_null(mkdtemp(dir));
    char src[128], so[128];
    snprintf(src, sizeof src, "%s/k.c", dir);
    snprintf(so, sizeof so, "%s/k.so", dir);
    for (int v = 0; v < 4; v++) {
        const int lanes = v % 2 && host_lanes8() ? 8 : 4;
        tpk_tune_ew_cfg c = {lanes, 4, v / 2};
        f = fopen(src, "w");
        assert_int_equal(tpk_tune_ew_emit(&e, &c, "tpk_kernel", 0, f, &ctx), TPK_OK);
        fclose(f);
        assert_int_equal(tpk__compile_cpu(src, so, NULL, "-Wno-psabi", 120, NULL, &ctx), TPK_OK);
        void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
        assert_non_null(h);
        int (*k)(size_t, const double *const *, const double *const *, double *const *, const double *,
                 const double *const *, int) =
            (int (*)(size_t, const double *const *, const double *const *, double *const *, const double *,
                     const double *const *, int))dlsym(h, "tpk_kernel");
        assert_non_null(k);
        for (size_t i = 0; i < n * n + 64; i++)
            got[i] = -7.0;
        assert_int_equal(k(n, in, dgv, out, par, wv, 2), 0);
        double scale = 0, diff = 0;
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j <= i; j++) {
                scale = fmax(scale, fabs(ref[i * n + j]));
                diff = fmax(diff, fabs(ref[i * n + j] - got[i * n + j]));
            }
        for (size_t i = 0; i < n; i++) /* upper triangle and padding untouched */
            for (size_t j = i + 1; j < n; j++)
                assert_true(got[i * n + j] == -7.0);
        if (!(diff <= 1e-13 * scale))
            fail_msg("lanes=%d pre=%d: emitted kernel vs executor %.3g of %.3g", lanes, c.pre, diff, scale);
        dlclose(h);
        unlink(so);
    }
    unlink(src);
    rmdir(dir);
    for (int k = 0; k < 6; k++)
        free(dg[k]);
    free(M), free(X), free(w), free(ref), free(got);
    tpk_phi_free(relu);
    tpk_phi_free(erf);
    tpk_phi_registry_free(reg);
}

static void test_cli(void **state)
{
    tu_env *env = *state;
    char cmd[4096], out[16384], cache[600];
    tu_path(env, cache, sizeof cache, "ew.jsonl");
    const char *sig = "in=2;relu(v1);sum(v0*w,v2*w,b)";
    snprintf(cmd, sizeof cmd, "'%s/tptune' ew --n=96 --repeat=1 --cache='%s' '%s' 2>&1", env->bindir, cache, sig);
    assert_int_equal(tu_capture(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "exact ok"));
    assert_null(strstr(out, "cached"));
    assert_int_equal(tu_capture(cmd, out, sizeof out), 0); /* the second run reads the cache */
    assert_non_null(strstr(out, "cached"));
    assert_null(strstr(out, "exact ok"));
    /* the pipe from netsor plan: every kernel's signature, each once */
    snprintf(cmd, sizeof cmd,
             "'%s/netsor' plan programs/mlp-ln-residual.nsr --set L=2 --inputs=64 --signatures 2>&1 | "
             "'%s/tptune' ew --n=64 --repeat=1 --cache=none - 2>&1", env->bindir, env->bindir);
    assert_int_equal(tu_capture(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "ew 1/"));
    assert_non_null(strstr(out, "exact ok"));
    assert_null(strstr(out, "FAILED"));
    /* every candidate's signature: each parses, and tptune reads the lines */
    snprintf(cmd, sizeof cmd,
             "'%s/netsor' plan programs/mlp-ln-residual.nsr --set L=2 --inputs=64 --signatures=all 2>&1",
             env->bindir);
    assert_int_equal(tu_capture(cmd, out, sizeof out), 0);
    int ncand = 0;
    for (const char *c = strstr(out, "candidate sig: "); c; c = strstr(c + 1, "candidate sig: ")) {
        char one[TPK_TUNE_EW_SIGLEN];
        snprintf(one, sizeof one, "%.*s", (int)strcspn(c + 15, "\n"), c + 15);
        tpk_tune_ew e;
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        if (tpk_tune_ew_parse(one, &e, &ctx) != TPK_OK)
            fail_msg("candidate %s: %s", one, ctx.msg);
        ncand++;
    }
    assert_true(ncand >= 3);
    snprintf(cmd, sizeof cmd, "'%s/netsor' plan programs/mlp.nsr --signatures=some 2>&1", env->bindir);
    assert_int_equal(tu_capture(cmd, out, sizeof out), 2);
    /* netsor plan --emitted: the optimal plan's kernels run as emitted C, the same kernel as the
     * executor's optimal plan to rounding; a second run reads the times from the cache */
    char ecache[600];
    tu_path(env, ecache, sizeof ecache, "emitted.jsonl");
    for (int run = 0; run < 2; run++) {
        snprintf(cmd, sizeof cmd,
                 "'%s/netsor' plan programs/mlp-ln-residual.nsr --set L=3 --inputs=96 --plan=both --emitted='%s' 2>&1",
                 env->bindir, ecache);
        assert_int_equal(tu_capture(cmd, out, sizeof out), 0);
        assert_non_null(strstr(out, "with emitted kernels"));
        assert_non_null(strstr(out, "(emitted kernel)"));
        const char *d = strstr(out, "max relative difference ");
        assert_non_null(d);
        const double diff = atof(d + strlen("max relative difference "));
        if (!(diff <= 1e-13))
            fail_msg("emitted vs executor differ by %g:\n%s", diff, out);
        assert_true(tu_exists(ecache));
    }
    /* --emitted's errors: a cache that is not one (named with its line), and no tptune to run the
     * checks (netsor alone in a folder, no $TPK_BIN or $TPK_TUNE_RUNNER) */
    char bad_cache[600];
    tu_path(env, bad_cache, sizeof bad_cache, "notacache.jsonl");
    FILE *bf = fopen(bad_cache, "w");
    assert_non_null(bf);
    fputs("{\"target\": 1}\n", bf);
    fclose(bf);
    snprintf(cmd, sizeof cmd, "'%s/netsor' plan programs/mlp.nsr --inputs=16 --emitted='%s' 2>&1", env->bindir,
             bad_cache);
    assert_int_equal(tu_capture(cmd, out, sizeof out), 1);
    assert_non_null(strstr(out, "notacache.jsonl:1: not an ew cache record"));
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s/alone' && cp '%s/netsor' '%s/alone/' && env -u TPK_BIN -u TPK_TUNE_RUNNER "
             "'%s/alone/netsor' plan programs/mlp.nsr --inputs=16 --emitted=none 2>&1",
             env->tmpdir, env->bindir, env->tmpdir, env->tmpdir);
    assert_int_equal(tu_capture(cmd, out, sizeof out), 1);
    assert_non_null(strstr(out, "--emitted needs tptune"));
    /* mutants: last line caught K/K */
    snprintf(cmd, sizeof cmd, "'%s/tptune' ew --cache=none --n=16 --repeat=1 --mutants=5 --lanes=4 'in=1;relu(v0)' 2>&1",
             env->bindir);
    assert_int_equal(tu_capture(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "caught 5/5\n"));
    /* errors: a bad signature names its column and writes no cache */
    char bad[600];
    tu_path(env, bad, sizeof bad, "bad.jsonl");
    snprintf(cmd, sizeof cmd, "'%s/tptune' ew --cache='%s' 'in=1;tanh(v0)' 2>&1", env->bindir, bad);
    assert_int_equal(tu_capture(cmd, out, sizeof out), 1);
    assert_non_null(strstr(out, "column 6"));
    assert_false(tu_exists(bad));
    snprintf(cmd, sizeof cmd, "'%s/tptune' ew --lanes=5 'in=1;relu(v0)' 2>&1", env->bindir);
    assert_int_equal(tu_capture(cmd, out, sizeof out), 2);
    snprintf(cmd, sizeof cmd, "'%s/tptune' ew 2>&1", env->bindir);
    assert_int_equal(tu_capture(cmd, out, sizeof out), 2);
    snprintf(cmd, sizeof cmd, "'%s/tptune' ew --emit=cuda 'in=1;relu(v0)' 2>&1", env->bindir);
    assert_int_equal(tu_capture(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "__global__"));
}

static int setup(void **state)
{
    return tu_setup_tagged(state, "tune-ew");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_verify_random),
        cmocka_unit_test(test_mutants),
        cmocka_unit_test(test_cuda),
        cmocka_unit_test(test_cache),
        cmocka_unit_test(test_against_executor),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, setup, tu_teardown);
}
