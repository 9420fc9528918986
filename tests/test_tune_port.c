/* Porting tuned configurations between machine classes (issue 21 item 3, tuner/port.c): the
 * passes on the shipped classes' profiles, the enumerative repair where a pass leaves the target
 * space's constraints, the exact verifier after each changing pass, the ported log, and the
 * search measuring the ported configurations first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tpk/tune.h"

static tpk_machine intel, avx2, big;

static int setup(void **state)
{
    (void)state;
    size_t n;
    const tpk_machine *m = tpk_machine_classes(&n);
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(m[i].id, "avx512-intel"))
            intel = m[i];
        if (!strcmp(m[i].id, "avx2"))
            avx2 = m[i];
    }
    /* A made-up class with 8x the caches: blocks grow past what a small problem allows. */
    big = intel;
    big.name = "cpu/test/big-caches";
    big.id = "big";
    big.l1 *= 8, big.l2 *= 8, big.l3 *= 8;
    return intel.name && avx2.name ? 0 : -1;
}

static tpk_tune_task task_of(size_t m, size_t n, size_t k, int threads, int op)
{
    tpk_tune_task t = {TPK_TUNE_CPU, TPK_TUNE_F64, m, n, k, threads, op};
    return t;
}

/* AVX-512 to AVX2: 256-bit vectors, 16 registers; the register tile is re-chosen and the
 * kernel verified after each pass that changed it. */
static void test_port_to_avx2_verified(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_tune_task t = task_of(512, 512, 512, 1, TPK_TUNE_GEMM);
    tpk_tune_space from, to;
    assert_int_equal(tpk_tune_space_init_on(&from, &t, &intel, &ctx), TPK_OK);
    assert_int_equal(tpk_tune_space_init_on(&to, &t, &avx2, &ctx), TPK_OK);
    tpk_tune_config c;
    tpk_tune_space_default(&from, &c);
    assert_int_equal(tpk_tune_config_parse(&from, &c, "vw=512,mr=8,nv=3,kc=256,mc=576,nc=512", &ctx), TPK_OK);
    assert_true(tpk_tune_space_valid(&from, &c));
    assert_false(tpk_tune_space_valid(&to, &c)); /* 512-bit vectors, 28 registers */
    tpk_tune_mutant_opts vo = {.seed = 3};
    tpk_tune_port_report rep;
    assert_int_equal(tpk_tune_port_config(&from, &c, &to, &vo, &rep, &ctx), TPK_OK);
    for (int i = 0; i < rep.nstep; i++)
        print_message("%-9s changed %d repaired %d verified %d %s (%s)\n", rep.step[i].pass, rep.step[i].changed,
                      rep.step[i].repaired, rep.step[i].verified, rep.step[i].knobs, rep.step[i].why);
    assert_true(rep.ok);
    assert_int_equal(rep.nstep, 3);
    assert_string_equal(rep.step[0].pass, "vector");
    assert_true(rep.step[0].changed && rep.step[0].verified == 1);
    assert_true(tpk_tune_space_valid(&to, &rep.c));
    assert_int_equal(tpk_tune_config_get(&to, &rep.c, "vw", 0), 256);
    int mr = tpk_tune_config_get(&to, &rep.c, "mr", 0), nv = tpk_tune_config_get(&to, &rep.c, "nv", 0);
    assert_true(mr * nv + nv + 1 <= 16 && mr * nv >= 8);
    /* caches: avx2's L1 is 32 KiB against 48: a smaller kc */
    assert_true(tpk_tune_config_get(&to, &rep.c, "kc", 0) < 256);
    assert_non_null(strstr(rep.step[0].why, "passed"));
}

/* A pass that leaves the constraints: the enumerative repair finds the nearest valid point. */
static void test_port_repairs(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_tune_task t = task_of(200, 200, 200, 1, TPK_TUNE_GEMM);
    tpk_tune_space from, to;
    assert_int_equal(tpk_tune_space_init_on(&from, &t, &intel, &ctx), TPK_OK);
    assert_int_equal(tpk_tune_space_init_on(&to, &t, &big, &ctx), TPK_OK);
    tpk_tune_config c;
    tpk_tune_space_default(&from, &c);
    assert_int_equal(tpk_tune_config_parse(&from, &c, "mr=8,nv=3,kc=96,mc=144,nc=256", &ctx), TPK_OK);
    assert_true(tpk_tune_space_valid(&from, &c));
    tpk_tune_port_report rep;
    assert_int_equal(tpk_tune_port_config(&from, &c, &to, NULL, &rep, &ctx), TPK_OK);
    assert_true(rep.ok);
    const tpk_tune_port_step *cs = &rep.step[2];
    print_message("caches: %s (changed %d repaired %d)\n", cs->knobs, cs->changed, cs->repaired);
    assert_true(cs->changed && cs->repaired); /* 8x caches: kc, mc past twice the 200 problem */
    assert_int_equal(cs->verified, -1);       /* no verifier asked for */
    assert_true(tpk_tune_space_valid(&to, &rep.c));
    /* a different template or knob table is refused */
    tpk_tune_task mt = {TPK_TUNE_CPU, TPK_TUNE_F64, 512, 512, 1, 1, TPK_TUNE_MAP};
    tpk_tune_space ms;
    assert_int_equal(tpk_tune_space_init_on(&ms, &mt, &big, &ctx), TPK_OK);
    assert_int_equal(tpk_tune_port_config(&from, &c, &ms, NULL, &rep, &ctx), TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    /* a map configuration: the column block follows L1, the tile L2 (the S tile stays ≤ 2 MiB) */
    tpk_tune_space mf;
    assert_int_equal(tpk_tune_space_init_on(&mf, &mt, &intel, &ctx), TPK_OK);
    tpk_tune_config mc;
    tpk_tune_space_default(&mf, &mc);
    assert_int_equal(tpk_tune_config_parse(&mf, &mc, "mb=32,nb=256", &ctx), TPK_OK);
    assert_int_equal(tpk_tune_port_config(&mf, &mc, &ms, NULL, &rep, &ctx), TPK_OK);
    assert_true(rep.ok && tpk_tune_space_valid(&ms, &rep.c));
    assert_true(tpk_tune_config_get(&ms, &rep.c, "nb", 0) > 256);
}

/* The whole pipeline on a log: picks of the source class, a ported log of the target class with
 * unmeasured records, the search measuring them first. */
static void test_port_log_and_seeded_search(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_tune_task t = task_of(384, 384, 384, 1, TPK_TUNE_GEMM);
    tpk_tune_space s;
    assert_int_equal(tpk_tune_space_init_on(&s, &t, &intel, &ctx), TPK_OK);
    tpk_tune_record rec[3];
    const char *knobs[3] = {"mr=8,nv=3,kc=256,mc=192,nc=512", "mr=6,nv=4,kc=192,mc=144,nc=512", "mr=4,nv=4,kc=128"};
    for (int i = 0; i < 3; i++) {
        tpk_tune_config c;
        tpk_tune_space_default(&s, &c);
        assert_int_equal(tpk_tune_config_parse(&s, &c, knobs[i], &ctx), TPK_OK);
        tpk_tune_result r = {.gflops = 61.25 + 7.5 * i, .cpu_ratio = 1};
        tpk_tune_record_fill(&rec[i], &s, &c, &r);
        snprintf(rec[i].target_class, sizeof rec[i].target_class, "%s", intel.name);
    }
    char path[] = "/tmp/tpk_portXXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *log = fdopen(fd, "w");
    char *text = NULL;
    size_t len = 0;
    FILE *report = open_memstream(&text, &len);
    int np, nf;
    assert_int_equal(tpk_tune_port(rec, 3, &intel, &avx2, NULL, report, log, &np, &nf, &ctx), TPK_OK);
    fclose(report);
    fclose(log);
    assert_int_equal(np, 1); /* one workload: its best record (the third) */
    assert_int_equal(nf, 0);
    assert_non_null(strstr(text, "gemm f64 384x384x384 1t: vw=512,mr=4,nv=4,kc=128"));
    assert_non_null(strstr(text, "  ported\n"));
    free(text);
    tpk_tune_record *got;
    size_t n;
    assert_int_equal(tpk_tune_log_read(path, &got, &n, &ctx), TPK_OK);
    assert_int_equal(n, 1);
    assert_string_equal(got[0].target_class, avx2.name);
    assert_true(got[0].result.gflops == 0);
    tpk_tune_space ts;
    assert_int_equal(tpk_tune_space_init_on(&ts, &t, &avx2, &ctx), TPK_OK);
    tpk_tune_config pc;
    assert_int_equal(tpk_tune_record_config(&ts, &got[0], &pc, &ctx), TPK_OK);
    assert_true(tpk_tune_space_valid(&ts, &pc));
    /* no records of the source class: an error */
    assert_int_equal(tpk_tune_port(rec, 3, &avx2, &intel, NULL, NULL, NULL, &np, &nf, &ctx), TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    /* The search measures the given configurations first (here on the host's space). */
    tpk_tune_space hs;
    assert_int_equal(tpk_tune_space_init(&hs, &t, &ctx), TPK_OK);
    tpk_tune_config init[2];
    tpk_tune_space_default(&hs, &init[0]);
    /* valid on any host class: 6·2 + 2 + 1 registers of 16 at 256 bits */
    assert_int_equal(tpk_tune_config_parse(&hs, &init[0], "mr=6,nv=2,kc=192,mc=144,nc=512,vw=256", &ctx), TPK_OK);
    assert_true(tpk_tune_space_valid(&hs, &init[0]));
    init[1] = init[0]; /* twice: measured once */
    tpk_tune_opts o;
    tpk_tune_opts_default(&o);
    o.trials = 6;
    o.initial = init;
    o.ninitial = 2;
    o.model = TPK_TUNE_MODEL_RANDOM;
    uint64_t noise = 5;
    tpk_tune_outcome out;
    char lp[] = "/tmp/tpk_port_runXXXXXX";
    fd = mkstemp(lp);
    FILE *rl = fdopen(fd, "w");
    assert_int_equal(tpk_tune_run(&hs, &o, tpk_tune_synthetic_measure, &noise, rl, NULL, NULL, &out, &ctx), TPK_OK);
    fclose(rl);
    tpk_tune_record *runr;
    assert_int_equal(tpk_tune_log_read(lp, &runr, &n, &ctx), TPK_OK);
    assert_int_equal(n, 6);
    tpk_tune_config first;
    assert_int_equal(tpk_tune_record_config(&hs, &runr[0], &first, &ctx), TPK_OK);
    assert_int_equal(tpk_tune_space_index(&hs, &first), tpk_tune_space_index(&hs, &init[0]));
    for (size_t i = 1; i < n; i++) {
        tpk_tune_config c;
        assert_int_equal(tpk_tune_record_config(&hs, &runr[i], &c, &ctx), TPK_OK);
        assert_true(tpk_tune_space_index(&hs, &c) != tpk_tune_space_index(&hs, &init[0]));
    }
    free(runr);
    free(got);
    unlink(path);
    unlink(lp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_port_to_avx2_verified),
        cmocka_unit_test(test_port_repairs),
        cmocka_unit_test(test_port_log_and_seeded_search),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
