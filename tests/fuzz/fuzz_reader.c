/* libFuzzer harness of one data reader (issue 18): the bytes become a file with the format's
 * extension (in /dev/shm, else /tmp) and go through the reader a tool uses — tpk_io_read for
 * .npy / .npz / .csv / .h5, tpk_idx_read for IDX, tpk_tune_log_read for tuning logs. Built once
 * per format (mk/fuzz.mk: -DFUZZ_EXT=".npy" ...). Besides the sanitizers, every outcome is
 * checked: a read array has a sane shape and only finite values (the readers refuse the rest),
 * a refusal carries a status and a message. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <math.h>

#include "tpk/error.h"
#include "tpk/idx.h"
#include "tpk/io.h"
#ifdef FUZZ_TUNELOG
#include "tpk/tune.h"
#endif

#ifndef FUZZ_EXT
#define FUZZ_EXT ".npy"
#endif

static char path[256];

static void cleanup(void)
{
    if (path[0])
        unlink(path);
}

static void check_refusal(const tpk_ctx *ctx)
{
    if (ctx->status == TPK_OK || ctx->msg[0] == '\0')
        __builtin_trap(); /* a refusal without a status or a message */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (path[0] == '\0') {
        const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(path, sizeof path, "%s/tpk-fuzz-%ld%s", dir, (long)getpid(), FUZZ_EXT);
        atexit(cleanup);
    }
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return 0;
    if (size && fwrite(data, 1, size, f) != size) {
        fclose(f);
        return 0;
    }
    fclose(f);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
#ifdef FUZZ_TUNELOG
    tpk_tune_record *recs = NULL;
    size_t n = 0;
    if (tpk_tune_log_read(path, &recs, &n, &ctx) != TPK_OK)
        check_refusal(&ctx);
    free(recs);
#else
    char spec[300];
    snprintf(spec, sizeof spec, "%s%s", path, strcmp(FUZZ_EXT, ".h5") == 0 ? ":/x" : "");
#ifdef FUZZ_IDX
    tpk_array *a = tpk_idx_read(spec, 0, &ctx);
#else
    tpk_input_info info;
    tpk_array *a = tpk_io_read(spec, &info, &ctx);
#endif
    if (a == NULL) {
        check_refusal(&ctx);
        return 0;
    }
    if (a->ndim < 1 || a->ndim > TPK_ARRAY_MAXDIM)
        __builtin_trap();
    size_t cnt = tpk_array_size(a);
    for (size_t i = 0; i < cnt; i++)
        if (!isfinite(a->data[i]))
            __builtin_trap(); /* readers refuse NaN and infinities */
    tpk_array_free(a);
#endif
    return 0;
}
