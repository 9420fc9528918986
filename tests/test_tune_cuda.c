/* CUDA code generation: generated kernels compile for sm_90 with nvcc (-cubin, warnings as
 * errors) when a CUDA toolkit exists; skipped otherwise. The relu map ported to CUDA: its host
 * emulation is checked everywhere. Nothing runs on a GPU here
 * (scripts/device-check.sh does that where one is lent). */
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

static const char *nvcc(void)
{
    static char buf[1024]; /* one test process, one answer */
    return tpk_tune_nvcc(buf, sizeof buf);
}

static int compile_cubin(const char *cu, const char *cubin)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "timeout 300 '%s' -arch=sm_90 -std=c++17 -Werror all-warnings -cubin -o '%s' '%s'",
             nvcc(), cubin, cu);
    return system(cmd);
}

static void test_space_and_emit(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    for (int d = 0; d < 2; d++) {
        tpk_tune_task t = {TPK_TUNE_CUDA, d, 4096, 64, 4096, 1, TPK_TUNE_GEMM};
        tpk_tune_space s;
        assert_int_equal(tpk_tune_space_init(&s, &t, &ctx), TPK_OK);
        tpk_tune_config c;
        tpk_tune_space_default(&s, &c);
        assert_true(tpk_tune_space_valid(&s, &c));
        uint64_t rng = 31;
        float f[TPK_TUNE_MAX_FEATURES];
        for (int i = 0; i < 200; i++) {
            uint64_t idx = tpk_tune_space_random(&s, &rng);
            tpk_tune_space_point(&s, idx, &c);
            assert_true(tpk_tune_space_valid(&s, &c));
            assert_int_equal(tpk_tune_space_index(&s, &c), idx);
            assert_true(s.features(&s, &c, f, TPK_TUNE_MAX_FEATURES) > 15);
        }
        /* 256×256 tiles of 2×2 per thread: 16384 threads, rejected. */
        assert_int_equal(tpk_tune_config_set(&s, &c, "bm", 256), TPK_OK);
        assert_int_equal(tpk_tune_config_set(&s, &c, "bn", 256), TPK_OK);
        assert_int_equal(tpk_tune_config_set(&s, &c, "tm", 2), TPK_OK);
        assert_int_equal(tpk_tune_config_set(&s, &c, "tn", 2), TPK_OK);
        assert_false(tpk_tune_space_valid(&s, &c));
        /* Without a GPU a CUDA measurement reports "no device", not a failure of the tuner. */
        if (access("/dev/nvidiactl", F_OK) != 0) {
            tpk_tune_result r;
            tpk_tune_space_default(&s, &c);
            assert_int_equal(tpk_tune_measure(&s, &c, NULL, &r, &ctx), TPK_OK);
            assert_int_equal(r.err, TPK_TUNE_ENODEV);
        }
    }
}

static void test_generated_cuda_compiles_for_sm90(void **state)
{
    (void)state;
    if (!nvcc())
        skip();
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    char dir[] = "/tmp/tpk_cudaXXXXXX";
    assert_non_null(mkdtemp(dir));
    char cu[128], cubin[128];
    snprintf(cu, sizeof cu, "%s/k.cu", dir);
    snprintf(cubin, sizeof cubin, "%s/k.cubin", dir);
    /* The library file from no logs (defaults + dispatch), plus variants covering split-K, the
     * synchronous single stage and scalar copies. */
    FILE *f = fopen(cu, "w");
    assert_int_equal(tpk_tune_gen_cuda_library(NULL, 0, "test_tune_cuda", f, &ctx), TPK_OK);
    tpk_tune_task t = {TPK_TUNE_CUDA, TPK_TUNE_F64, 2048, 64, 2048, 1, TPK_TUNE_GEMM};
    tpk_tune_space s;
    assert_int_equal(tpk_tune_space_init(&s, &t, &ctx), TPK_OK);
    tpk_tune_config c;
    tpk_tune_space_default(&s, &c);
    assert_int_equal(tpk_tune_config_set(&s, &c, "splitk", 4), TPK_OK);
    assert_int_equal(tpk_tune_config_set(&s, &c, "stages", 1), TPK_OK);
    assert_int_equal(tpk_tune_config_set(&s, &c, "vec", 1), TPK_OK);
    assert_true(tpk_tune_space_valid(&s, &c));
    assert_int_equal(tpk_tune_emit(&s, &c, "variant_a", 0, f, &ctx), TPK_OK);
    fclose(f);
    assert_int_equal(compile_cubin(cu, cubin), 0);
    FILE *b = fopen(cubin, "rb");
    assert_non_null(b);
    unsigned char magic[4] = {0};
    assert_int_equal(fread(magic, 1, 4, b), 4);
    fclose(b);
    assert_memory_equal(magic, "\x7f" "ELF", 4);
    unlink(cu);
    unlink(cubin);
    /* The shipped generated file. */
    const char *root = getenv("TPK_ROOT");
    if (root) {
        char shipped[1024];
        snprintf(shipped, sizeof shipped, "%s/gen/tpk_gemm_cuda.cu", root);
        if (access(shipped, R_OK) == 0)
            assert_int_equal(compile_cubin(shipped, cubin), 0);
        unlink(cubin);
    }
    rmdir(dir);
}

/* Replace the first occurrence of `from` in file `path` by `to` (a hand-made bug). */
static int patch_file(const char *path, const char *from, const char *to)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    static char buf[1 << 16], out[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *at = strstr(buf, from);
    if (!at)
        return -1;
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - buf), buf, to, at + strlen(from));
    f = fopen(path, "w");
    if (!f)
        return -1;
    fputs(out, f);
    fclose(f);
    return 0;
}

/* The relu-map schedule of a CPU class as a CUDA map kernel (tuner/cuda_map.c, issue 21 item 3):
 * the passes' plan, the host emulation of the emitted grid verified (the CPU map checks, then the
 * whole map at rows + cols + 3), and for sm_90 without spills where nvcc exists; hand-made bugs in
 * the emitted file (the last row of every block dropped, the diagonal's entry computed as an
 * off-diagonal one, a column step one short) fail the check. Each arccos variant and both root
 * modes, f64 and f32. */
static void test_map_port_to_cuda(void **state)
{
    (void)state;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    char dir[] = "/tmp/tpk_cudamapXXXXXX";
    assert_non_null(mkdtemp(dir));
    char cu[128];
    snprintf(cu, sizeof cu, "%s/m.cu", dir);
    static const char *const knobs[] = {"vw=512,mb=16,nb=512,acos=mvec,rq=pre,un=4",
                                        "vw=256,mb=64,nb=1024,acos=poly,rq=sqrt,un=2,split=tiles",
                                        "vw=512,mb=4,nb=64,acos=atan2,rq=pre,un=1,split=balanced"};
    for (int d = 0; d < 2; d++)
        for (int v = 0; v < 3; v++) {
            tpk_tune_task t = {TPK_TUNE_CPU, d, 1024, 1024, 1, 2, TPK_TUNE_MAP};
            tpk_tune_space s;
            assert_int_equal(tpk_tune_space_init(&s, &t, &ctx), TPK_OK);
            tpk_tune_config c;
            tpk_tune_space_default(&s, &c);
            assert_int_equal(tpk_tune_config_parse(&s, &c, knobs[v], &ctx), TPK_OK);
            tpk_tune_cuda_map p;
            assert_int_equal(tpk_tune_cuda_map_plan(&s, &c, &p, &ctx), TPK_OK);
            assert_int_equal(p.tx, 32);
            assert_true(p.cols % (p.tx * p.un) == 0 && p.rows % p.ty == 0);
            assert_true(p.blocks >= 264); /* two waves on 132 SMs at n = 1024 */
            FILE *f = fopen(cu, "w");
            assert_non_null(f);
            assert_int_equal(tpk_tune_cuda_map_emit(&s, &c, &p, f, &ctx), TPK_OK);
            fclose(f);
            const size_t gn = (size_t)(p.rows + p.cols + 3);
            tpk_tune_cuda_map_check_report r;
            assert_int_equal(tpk_tune_cuda_map_check(cu, d, gn, nvcc(), &r, &ctx), TPK_OK);
            if (!r.host_ok)
                fail_msg("%s %s: %s", d ? "f32" : "f64", knobs[v], r.why);
            assert_true(r.worst <= (d ? 1e-6 : 1e-14));
            if (nvcc()) {
                assert_true(r.nvcc_ran && r.nvcc_ok);
                assert_true(r.regs > 0 && r.regs <= 255);
                print_message("%s %s: tile %dx%d, %d registers, %d bytes spilled\n", d ? "f32" : "f64", knobs[v],
                              p.rows, p.cols, r.regs, r.spill);
            }
            if (v > 0)
                continue;
            /* hand-made bugs: each is caught by the host emulation's checks */
            static const char *const bug[][2] = {
                {"r < TPK_ROWS / TPK_TY", "r + 1 < TPK_ROWS / TPK_TY"},
                {"if (ju0 < i)", "if (ju0 <= i)"},
                {"m < TPK_COLS / (TPK_TX * TPK_UN)", "m + 1 < TPK_COLS / (TPK_TX * TPK_UN)"},
            };
            for (int b = 0; b < 3; b++) {
                f = fopen(cu, "w");
                assert_non_null(f);
                assert_int_equal(tpk_tune_cuda_map_emit(&s, &c, &p, f, &ctx), TPK_OK);
                fclose(f);
                assert_int_equal(patch_file(cu, bug[b][0], bug[b][1]), 0);
                assert_int_equal(tpk_tune_cuda_map_check(cu, d, gn, NULL, &r, &ctx), TPK_OK);
                if (r.host_ok)
                    fail_msg("bug '%s' -> '%s' not caught", bug[b][0], bug[b][1]);
            }
            /* a kernel that crashes (rows read terabytes apart): a failed check in its child
             * process, reported, and this process goes on */
            f = fopen(cu, "w");
            assert_non_null(f);
            assert_int_equal(tpk_tune_cuda_map_emit(&s, &c, &p, f, &ctx), TPK_OK);
            fclose(f);
            assert_int_equal(patch_file(cu, "srow = S + i * lds", "srow = S + i * lds * ((size_t)1 << 40)"), 0);
            assert_int_equal(tpk_tune_cuda_map_check(cu, d, gn, NULL, &r, &ctx), TPK_OK);
            assert_false(r.host_ok);
            assert_non_null(strstr(r.why, "crashed"));
        }
    /* not a map configuration */
    tpk_tune_task g = {TPK_TUNE_CPU, TPK_TUNE_F64, 64, 64, 64, 1, TPK_TUNE_GEMM};
    tpk_tune_space gs;
    assert_int_equal(tpk_tune_space_init(&gs, &g, &ctx), TPK_OK);
    tpk_tune_config gc;
    tpk_tune_space_default(&gs, &gc);
    tpk_tune_cuda_map gp;
    assert_int_equal(tpk_tune_cuda_map_plan(&gs, &gc, &gp, &ctx), TPK_EINVAL);
    unlink(cu);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_space_and_emit),
        cmocka_unit_test(test_generated_cuda_compiles_for_sm90),
        cmocka_unit_test(test_map_port_to_cuda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
