/* CUDA code generation: generated kernels compile for sm_90 with nvcc (-cubin, warnings as
 * errors) when a CUDA toolkit exists; skipped otherwise. Nothing runs on a GPU here
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
    const char *e = getenv("NVCC");
    if (e && *e && access(e, X_OK) == 0)
        return e;
    return access("/usr/local/cuda/bin/nvcc", X_OK) == 0 ? "/usr/local/cuda/bin/nvcc" : NULL;
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_space_and_emit),
        cmocka_unit_test(test_generated_cuda_compiles_for_sm90),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
