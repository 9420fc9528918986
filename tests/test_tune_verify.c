/* The exact verifier of generated kernels (tuner/verify.c, tuner/mutate.c; issue 20 items 3, 4):
 * shipped GEMM, SYRK and map kernels pass it (no false alarm), an independent correct kernel
 * passes, kernels with one planted bug each fail it with the entry named, the Z_p twins of every
 * parallel split pass, a handful of mutants of toy kernels are all caught, and tptune verify /
 * emit --twin answer on the command line. Toy sizes: seconds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/gemm_gen.h"
#include "../runtime/machine_gen.h"
#include "../runtime/map_gen.h"
#include "support/testutil.h"
#include "tpk/gemm.h"
#include "tpk/tune.h"

static int setup(void **state) { return tu_setup_tagged(state, "verify"); }

/* A space and configuration from knobs ("mr=4,nv=2,par=jr") on top of the analytic default. */
static void toy(tpk_tune_space *s, tpk_tune_config *c, int op, int dtype, int threads, const char *knobs)
{
    const size_t n = op == TPK_TUNE_MAP ? 256 : 64;
    tpk_tune_task t = {TPK_TUNE_CPU, dtype, n, n, op == TPK_TUNE_MAP ? 1 : 64, threads, op};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_tune_space_init(s, &t, &ctx), TPK_OK);
    tpk_tune_space_default(s, c);
    assert_int_equal(tpk_tune_config_parse(s, c, knobs, &ctx), TPK_OK);
    assert_true(tpk_tune_space_valid(s, c));
}

/* The logs and the class file of class ci, and the kernels its generated files hold. */
static size_t class_kernels(size_t ci, int map, tpk_tune_space **sp, tpk_tune_config **cf, char (**names)[160])
{
    const char *root = getenv("TPK_ROOT");
    char path[2048];
    snprintf(path, sizeof path, "%s/data/machines/%s.conf", root && *root ? root : ".", tpk__machine_classes[ci].id);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_tune_class cls;
    assert_int_equal(tpk_tune_class_read(path, &cls, &ctx), TPK_OK);
    glob_t g; /* every log, in the generator's order (make sorts them) */
    snprintf(path, sizeof path, "%s/data/tuning/*.jsonl", root && *root ? root : ".");
    assert_int_equal(glob(path, 0, NULL, &g), 0);
    tpk_tune_record *all = NULL;
    size_t nall = 0;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        tpk_tune_record *r;
        size_t n;
        assert_int_equal(tpk_tune_log_read(g.gl_pathv[i], &r, &n, &ctx), TPK_OK);
        all = realloc(all, (nall + n) * sizeof *all);
        assert_non_null(all);
        memcpy(all + nall, r, n * sizeof *r);
        nall += n;
        free(r);
    }
    globfree(&g);
    size_t nk;
    assert_int_equal(tpk_tune_gen_kernels(all, nall, &cls.m, map, sp, cf, names, &nk, &ctx), TPK_OK);
    free(all);
    return nk;
}

/* Shipped kernels of the serving class (or the best class this CPU runs): the first tuned GEMM
 * workload, the SYRK defaults and one map kernel, run as the library holds them. */
static void test_shipped(void **state)
{
    (void)state;
    size_t ci = tpk__machine_nclasses;
    for (size_t i = 0; i < tpk__machine_nclasses; i++)
        if (tpk__machine_classes[i].isa <= tpk_machine_host_isa() &&
            (ci == tpk__machine_nclasses || tpk__gemm_classes[i]->len > tpk__gemm_classes[ci]->len))
            ci = i;
    if (ci == tpk__machine_nclasses)
        skip();
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    for (int map = 0; map < 2; map++) {
        tpk_tune_space *sp;
        tpk_tune_config *cf;
        char(*names)[160];
        size_t nk = class_kernels(ci, map, &sp, &cf, &names), checked = 0;
        const size_t len = map ? tpk__map_classes[ci]->len : tpk__gemm_classes[ci]->len, nd = map ? 2 : 4;
        for (size_t e = 0; e < len + nd; e++) {
            const char *name;
            tpk_tune_verify_report r;
            tpk_tune_space s;
            size_t ki = 0;
            if (map) {
                const tpk__map_entry *me = e < len ? &tpk__map_classes[ci]->table[e] : &tpk__map_classes[ci]->defaults[e - len];
                if (e != 0 || !me->name) /* one map kernel: its twin compiles */
                    continue;
                name = me->name;
                while (ki < nk && strcmp(names[ki], name))
                    ki++;
                assert_true(ki < nk);
                s = sp[ki];
                assert_int_equal(tpk_tune_verify_map(&s, &cf[ki], 7, NULL, &r, &ctx), TPK_OK);
                double worst;
                assert_true(tpk_tune_check_map(me->dfn, me->sfn, me->ws, s.task.threads, &worst));
                assert_true(r.miss_bound > 0 && r.miss_bound < 1e-8);
            } else {
                const tpk__gemm_entry *ge = e < len ? &tpk__gemm_classes[ci]->table[e] : &tpk__gemm_classes[ci]->defaults[e - len];
                if (!ge->ws || (e > 0 && e < len + 2)) /* the first entry and the SYRK defaults */
                    continue;
                name = ge->name;
                while (ki < nk && strcmp(names[ki], name))
                    ki++;
                assert_true(ki < nk);
                s = sp[ki];
                if (ge->threads > 0)
                    s.task.threads = ge->threads;
                assert_int_equal(tpk_tune_verify_gemm(&s, &cf[ki], ge->dfn, ge->sfn, ge->ws, 7, &r, &ctx), TPK_OK);
                assert_true(r.miss_bound == 0);
            }
            if (!r.ok)
                fail_msg("%s: %s", name, r.what);
            assert_true(r.runs >= 13 && r.entries > 1000);
            checked++;
        }
        assert_true(checked >= 1);
        free(sp), free(cf), free(names);
    }
}

/* Kernels around the reference (runtime/ref_gemm.c): correct, and with one bug each. */
static int bug;
static void ref_kernel(size_t m, size_t n, size_t k, double alpha, const double *A, size_t rsa, size_t csa,
                       const double *B, size_t rsb, size_t csb, double beta, double *C, size_t ldc, int nt, void *ws)
{
    (void)nt, (void)ws;
    if (bug == 3) /* beta ignored */
        beta = beta == 0 ? 0 : 1;
    tpk_ref_dgemm(m, n, k, alpha, A, rsa, csa, B, rsb, csb, beta, C, ldc);
    if (bug == 1 && m > 1 && n > 1) /* one entry one off */
        C[(m - 1) * ldc + n - 2] += 1;
    if (bug == 2) /* one element past the last row's end */
        C[(m - 1) * ldc + n] = 0;
}

static size_t ref_ws(int nt)
{
    (void)nt;
    return 64;
}

static void test_planted_bugs(void **state)
{
    (void)state;
    tpk_tune_space s;
    tpk_tune_config c;
    toy(&s, &c, TPK_TUNE_GEMM, TPK_TUNE_F64, 1, "vw=256,mr=4,nv=2,kc=64,mc=48,nc=256");
    tpk_tune_verify_report r;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    bug = 0; /* an independent correct kernel: no false alarm */
    assert_int_equal(tpk_tune_verify_gemm(&s, &c, ref_kernel, NULL, ref_ws, 3, &r, &ctx), TPK_OK);
    if (!r.ok)
        fail_msg("reference: %s", r.what);
    bug = 1;
    assert_int_equal(tpk_tune_verify_gemm(&s, &c, ref_kernel, NULL, ref_ws, 3, &r, &ctx), TPK_OK);
    assert_false(r.ok);
    assert_non_null(strstr(r.what, "C[10][19]")); /* the first shape past 1x1x1: 11x21x71 */
    bug = 2;
    assert_int_equal(tpk_tune_verify_gemm(&s, &c, ref_kernel, NULL, ref_ws, 3, &r, &ctx), TPK_OK);
    assert_false(r.ok);
    assert_non_null(strstr(r.what, "written outside C"));
    bug = 3;
    assert_int_equal(tpk_tune_verify_gemm(&s, &c, ref_kernel, NULL, ref_ws, 3, &r, &ctx), TPK_OK);
    assert_false(r.ok);
    assert_non_null(strstr(r.what, "beta -2"));
    /* errors: no kernel for the dtype, not a GEMM space */
    assert_int_equal(tpk_tune_verify_gemm(&s, &c, NULL, NULL, ref_ws, 3, &r, &ctx), TPK_EINVAL);
    tpk_tune_space ms;
    tpk_tune_config mc;
    toy(&ms, &mc, TPK_TUNE_MAP, TPK_TUNE_F64, 1, "vw=256");
    assert_int_equal(tpk_tune_verify_gemm(&ms, &mc, ref_kernel, NULL, ref_ws, 3, &r, &ctx), TPK_EINVAL);
    char buf[64];
    FILE *f = fmemopen(buf, sizeof buf, "w");
    assert_int_not_equal(tpk_tune_emit_variant(&s, &c, 1, NULL, f, &ctx), TPK_OK); /* GEMM: no twin */
    assert_int_not_equal(tpk_tune_emit_variant(&s, &c, 0, "no_such_kind", f, &ctx), TPK_OK);
    assert_int_not_equal(tpk_tune_emit_variant(&s, &c, 0, "k_tail:999", f, &ctx), TPK_OK);
    fclose(f);
}

/* The twins of the splits no shipped kernel uses (tiles, balanced) and of rq = sqrt pass. */
static void test_twins(void **state)
{
    (void)state;
    static const char *const knobs[] = {"vw=256,mb=4,nb=64,rq=sqrt,un=2,split=tiles,sched=static,chunk=4",
                                        "vw=256,mb=8,nb=128,rq=pre,un=1,split=balanced,sched=static,chunk=1"};
    for (int i = 0; i < 2; i++) {
        tpk_tune_space s;
        tpk_tune_config c;
        toy(&s, &c, TPK_TUNE_MAP, i, 2, knobs[i]);
        tpk_tune_verify_report r;
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        assert_int_equal(tpk_tune_verify_map(&s, &c, 5, NULL, &r, &ctx), TPK_OK);
        if (!r.ok)
            fail_msg("%s: %s", knobs[i], r.what);
        assert_int_equal(r.shapes, 4);
    }
}

/* A handful of mutants over toy kernels of every family (gemm with the jr split, syrk, the map's
 * tiles and balanced splits), kinds chosen to span the classes: all caught. */
static void test_mutants(void **state)
{
    const tu_env *e = *state;
    char runner[1200];
    snprintf(runner, sizeof runner, "%s/tptune", e->bindir);
    if (!tu_exists(runner))
        skip();
    tpk_tune_space s[4];
    tpk_tune_config c[4];
    toy(&s[0], &c[0], TPK_TUNE_GEMM, TPK_TUNE_F64, 2, "vw=256,mr=4,nv=2,kc=64,mc=48,nc=256,ku=2,par=jr,pb=shared");
    toy(&s[1], &c[1], TPK_TUNE_SYRK, TPK_TUNE_F32, 1, "vw=256,mr=6,nv=2,kc=64,mc=48,nc=256,ku=4");
    toy(&s[2], &c[2], TPK_TUNE_MAP, TPK_TUNE_F64, 2, "vw=256,mb=4,nb=64,rq=sqrt,un=2,split=tiles,sched=static,chunk=4");
    toy(&s[3], &c[3], TPK_TUNE_MAP, TPK_TUNE_F32, 2, "vw=256,mb=8,nb=128,un=1,split=balanced,sched=static,chunk=1");
    tpk_tune_mutant_opts o = {.n = 8, .seed = 11, .runner = runner,
                              .kinds = "k_tail,edge_cond,jr_split,pack_b_strides,syrk_diag_over,map_tiles,"
                                       "map_balanced,map_flag_lanes"};
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    int caught = -1;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_tune_verify_mutants(s, c, 4, &o, out, &caught, &ctx), TPK_OK);
    fclose(out);
    if (caught != 8)
        fail_msg("%s", text);
    const char *last = text + len - 1;
    while (last > text && last[-1] != '\n')
        last--;
    assert_string_equal(last, "caught 8/8\n");
    assert_non_null(strstr(text, "map_tiles"));
    assert_non_null(strstr(text, "syrk_diag_over"));
    free(text);
    o.n = 1000; /* more distinct mutants than these kinds have sites: an error */
    out = fopen("/dev/null", "w");
    assert_int_not_equal(tpk_tune_verify_mutants(s, c, 4, &o, out, &caught, &ctx), TPK_OK);
    fclose(out);
}

/* tptune verify on the AVX2 class (any x86-64-v3 CPU), emit --twin, and the usage errors. */
static void test_cli(void **state)
{
    const tu_env *e = *state;
    char err[2048];
    if (tpk_machine_host_isa() >= TPK_ISA_AVX2) {
        char cmd[1400];
        snprintf(cmd, sizeof cmd, "'%s/tptune' verify --class=avx2", e->bindir);
        FILE *f = popen(cmd, "r");
        assert_non_null(f);
        char line[512], lastl[512] = "";
        int oks = 0;
        while (fgets(line, sizeof line, f)) {
            oks += strstr(line, "  ok\n") != NULL;
            snprintf(lastl, sizeof lastl, "%s", line);
        }
        assert_int_equal(pclose(f), 0);
        assert_int_equal(oks, 6);
        assert_string_equal(lastl, "verified 6 kernels: 6 passed, 0 failed\n");
    }
    assert_int_equal(tu_run_tool(e, "tptune", "verify --class=no-such-class"), 1);
    tu_stderr(e, err, sizeof err);
    assert_non_null(strstr(err, "no such machine class"));
    assert_int_equal(tu_run_tool(e, "tptune", "verify --data=/nonexistent"), 1);
    tu_stderr(e, err, sizeof err);
    assert_non_null(strstr(err, "no tuning logs"));
    assert_int_equal(tu_run_tool(e, "tptune", "verify --mutants=0"), 2);
    assert_int_equal(tu_run_tool(e, "tptune", "emit --op=map --n=64 --knobs=vw=256 --twin=1"), 0);
    assert_int_equal(tu_run_tool(e, "tptune", "emit --op=map --n=64 --knobs=vw=256 --twin=1 --mutant=map_step"), 0);
    assert_int_equal(tu_run_tool(e, "tptune", "emit --m=64 --n=64 --k=64 --mutant=bogus"), 1);
    tu_stderr(e, err, sizeof err);
    assert_non_null(strstr(err, "no mutation kind 'bogus'"));
    assert_int_equal(tu_run_tool(e, "tptune", "__verify x"), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shipped),
        cmocka_unit_test(test_planted_bugs),
        cmocka_unit_test(test_twins),
        cmocka_unit_test(test_mutants),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests_name("tune_verify", tests, setup, tu_teardown);
}
