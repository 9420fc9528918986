/* NETSOR front end, the driver: file or string → lex → parse → check → elaborate → tpk_program
 * (the top of the pipeline, as Lua's ldo.c: it calls every pass, and no pass calls it). */
#include "netsor-impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define NSR_MAX_SOURCE (16u << 20) /* refuse program files above 16 MiB */

tpk_program *tpk_netsor_load_string(const char *name, const char *src, const tpk_netsor_opts *opts,
                                    const tpk_phi_registry *reg, tpk_ctx *ctx)
{
    tpk_ctx local;
    if (ctx == NULL) {
        tpk_ctx_init(&local);
        ctx = &local;
    }
    if (src == NULL) {
        TPK_ERROR(ctx, TPK_EINVAL, "tpk_netsor_load_string: no source");
        return NULL;
    }
    nsr_state S = {.file = name ? name : "<string>", .src = src, .ctx = ctx, .opts = opts, .reg = reg};
    S.arena = nsr_arena_alloc();
    if (S.arena == NULL) {
        TPK_ERROR(ctx, TPK_ENOMEM, "%s: out of memory", S.file);
        return NULL;
    }
    tpk_program *p = NULL;
    nsr_token *toks;
    int ntoks;
    nsr_ast ast = {0};
    nsr_check C;
    if (nsr_lex(&S, src, &toks, &ntoks) == TPK_OK && nsr_parse(&S, toks, ntoks, &ast) == TPK_OK &&
        nsr_check_program(&S, &ast, &C) == TPK_OK)
        p = nsr_elaborate(&S, &ast, &C);
    if (p == NULL && ctx->status == TPK_OK)
        TPK_ERROR(ctx, TPK_ETYPE, "%s: cannot elaborate the program", S.file);
    nsr_arena_free(S.arena);
    return p;
}

tpk_program *tpk_netsor_load_file(const char *path, const tpk_netsor_opts *opts,
                                  const tpk_phi_registry *reg, tpk_ctx *ctx)
{
    if (path == NULL) {
        TPK_ERROR(ctx, TPK_EINVAL, "tpk_netsor_load_file: no path");
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        TPK_ERROR(ctx, TPK_EIO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf != NULL) {
        if (n + 1 >= cap) {
            if (cap >= NSR_MAX_SOURCE) {
                free(buf);
                fclose(f);
                TPK_ERROR(ctx, TPK_EIO, "%s: program file larger than %u bytes", path, NSR_MAX_SOURCE);
                return NULL;
            }
            char *b = realloc(buf, cap * 2);
            if (b == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = b;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (buf == NULL) {
        TPK_ERROR(ctx, TPK_ENOMEM, "%s: out of memory", path);
        return NULL;
    }
    if (bad) {
        free(buf);
        TPK_ERROR(ctx, TPK_EIO, "%s: read error", path);
        return NULL;
    }
    buf[n] = '\0';
    if (memchr(buf, '\0', n) != NULL) {
        /* report the NUL byte at its position rather than silently truncating */
        int line = 1, col = 1;
        for (const char *c = buf; *c; c++) {
            if (*c == '\n') {
                line++;
                col = 1;
            } else {
                col++;
            }
        }
        free(buf);
        TPK_ERROR(ctx, TPK_ESYNTAX, "%s:%d:%d: unexpected byte 0x00", path, line, col);
        return NULL;
    }
    tpk_program *p = tpk_netsor_load_string(path, buf, opts, reg, ctx);
    free(buf);
    return p;
}
