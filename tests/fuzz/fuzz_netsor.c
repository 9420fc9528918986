/* Fuzz target for the NETSOR front end: any byte string must load or fail with a message,
 * never crash, hang or leak (lex → parse → check → elaborate → dump → free); a program that
 * loads has a family IR that passes its verifier (a lowering bug is a crash here).
 *
 * libFuzzer (clang-14):
 *   clang-14 -g -O1 -std=c11 -D_XOPEN_SOURCE=700 -fsanitize=fuzzer,address,undefined -Iinclude \
 *     tests/fuzz/fuzz_netsor.c netsor/lex.c netsor/parse.c netsor/check.c netsor/elab.c \
 *     netsor/program.c kernels/gauss.c kernels/gauss_quad.c core/error.c \
 *     -lgsl -lgslcblas -lm -o build/fuzz_netsor
 *   build/fuzz_netsor -max_len=4096 -timeout=10 tests/fuzz/corpus
 * Standalone (no libFuzzer; replays files given on the command line), add -DNSR_FUZZ_STANDALONE
 * and drop "fuzzer," from -fsanitize. */
#include "tpk/tpk.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static tpk_phi_registry *registry(void)
{
    static tpk_phi_registry *reg; /* created once, read-only afterwards */
    if (reg == NULL) {
        tpk_ctx ctx;
        tpk_ctx_init(&ctx);
        reg = tpk_phi_registry_alloc(&ctx);
    }
    return reg;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A first line "#set NAME=VALUE" becomes a --set override, so overrides get fuzzed too. */
    char *src = malloc(size + 1);
    if (src == NULL)
        return 0;
    memcpy(src, data, size);
    src[size] = '\0';
    tpk_param_set set = {0};
    char name[64], value[128];
    tpk_netsor_opts opts = {.netsor_plus = size > 0 && (data[0] & 1), .explain = 1, .diag = NULL};
    if (strncmp(src, "#set ", 5) == 0 && sscanf(src + 5, "%63[^=\n]=%127[^\n]", name, value) == 2) {
        set.name = name;
        set.value = value;
        opts.sets = &set;
        opts.nsets = 1;
    }
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_program *p = tpk_netsor_load_string("fuzz.nsr", src, &opts, registry(), &ctx);
    if (p != NULL) {
        FILE *f = fopen("/dev/null", "w");
        if (f != NULL) {
            tpk_program_dump(p, f);
            if (tpk_program_family_instructions(p) > 0 && tpk_program_dump_ir(p, f, &ctx) &&
                ctx.status != TPK_ENOMEM)
                abort();
            fclose(f);
        }
        if (tpk_program_family_instructions(p) > 0 && tpk_program_verify_ir(p, &ctx) != TPK_OK &&
            ctx.status != TPK_ENOMEM) {
            fprintf(stderr, "%s\n", ctx.msg);
            abort();
        }
    } else if (ctx.status == TPK_OK || ctx.msg[0] == '\0') {
        abort(); /* a failure must always come with a status and a message */
    }
    tpk_program_free(p);
    free(src);
    return 0;
}

#ifdef NSR_FUZZ_STANDALONE
int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (f == NULL) {
            perror(argv[i]);
            return 1;
        }
        static uint8_t buf[1 << 20];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, n);
        printf("%s: ok\n", argv[i]);
    }
    return 0;
}
#endif
