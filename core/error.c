/* Error context: first error wins, message formatted once. GSL's error handler, once. */
#include "tpk/error.h"

#include <gsl/gsl_errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void tpk_ctx_init(tpk_ctx *ctx)
{
    memset(ctx, 0, sizeof *ctx);
}

void tpk_ctx_clear(tpk_ctx *ctx)
{
    tpk_ctx keep = *ctx;
    tpk_ctx_init_from(ctx, &keep);
}

void tpk_ctx_init_from(tpk_ctx *ctx, const tpk_ctx *parent)
{
    tpk_ctx_init(ctx);
    if (parent != NULL) {
        ctx->alloc = parent->alloc;
        ctx->note = parent->note;
        ctx->note_ud = parent->note_ud;
    }
}

void tpk_ctx_set_notes(tpk_ctx *ctx, tpk_note_fn fn, void *ud)
{
    ctx->note = fn;
    ctx->note_ud = ud;
}

void tpk_note(tpk_ctx *ctx, const char *fmt, ...)
{
    if (ctx == NULL || ctx->note == NULL)
        return;
    char msg[TPK_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ctx->note(ctx->note_ud, msg);
}

int tpk_error_at(tpk_ctx *ctx, int status, const char *src_file, int src_line, const char *fmt, ...)
{
    if (ctx == NULL)
        return status;
    if (ctx->status == TPK_ENOMEM) /* out of memory is sticky (tpk/error.h) */
        return TPK_ENOMEM;
    if (ctx->status != TPK_OK)
        return status;
    ctx->status = status;
    ctx->src_file = src_file;
    ctx->src_line = src_line;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->msg, sizeof ctx->msg, fmt, ap);
    va_end(ap);
    return status;
}

const char *tpk_strerror(int status)
{
    switch (status) {
    case TPK_OK: return "success";
    case TPK_EINVAL: return "invalid argument";
    case TPK_ENOMEM: return "out of memory";
    case TPK_EIO: return "input/output error";
    case TPK_EFORMAT: return "malformed file";
    case TPK_ENOTFOUND: return "not found";
    case TPK_EDOM: return "domain error";
    case TPK_ESYNTAX: return "syntax error";
    case TPK_ETYPE: return "type error";
    case TPK_ENUMERIC: return "numerical failure";
    case TPK_EUNSUPPORTED: return "unsupported";
    case TPK_ECANCELED: return "cancelled";
    default: return "unknown status";
    }
}

/* The handler is GSL's own process-wide variable (gsl_set_error_handler), not ours: style.md §6
 * keeps errors out of mutable globals, and the toolkit's errors stay in tpk_ctx. Setting GSL's
 * variable once, under pthread_once, is the one exception; the once-flag below is the only state
 * this file keeps. */
static pthread_once_t gsl_once = PTHREAD_ONCE_INIT;

static void gsl_handler_off(void)
{
    gsl_error_handler_t *prev = gsl_set_error_handler_off();
    if (prev != NULL) /* the host program's own handler (NULL is GSL's aborting default) */
        gsl_set_error_handler(prev);
}

void tpk_error_gsl_init(void)
{
    pthread_once(&gsl_once, gsl_handler_off);
}
