/* Status codes and the error context: errors are values plus a message, never a global (style.md §6). */
#ifndef TPK_ERROR_H
#define TPK_ERROR_H

#include <stddef.h>

#if defined(__GNUC__)
#define TPK_API __attribute__((visibility("default")))
#define TPK_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define TPK_API
#define TPK_PRINTF(f, a)
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum tpk_status {
    TPK_OK = 0,
    TPK_EINVAL,      /* invalid argument or option value */
    TPK_ENOMEM,      /* allocation failed */
    TPK_EIO,         /* file missing, unreadable, unwritable */
    TPK_EFORMAT,     /* file readable but malformed (ragged CSV, wrong dtype) */
    TPK_ENOTFOUND,   /* named thing (dataset, function, variable) does not exist */
    TPK_EDOM,        /* numerical domain error: NaN input, negative variance */
    TPK_ESYNTAX,     /* NETSOR program does not parse */
    TPK_ETYPE,       /* NETSOR program does not type-check */
    TPK_ENUMERIC,    /* numerical failure: not PSD, quadrature did not converge */
    TPK_EUNSUPPORTED, /* valid request this build or back-end cannot serve */
    TPK_ECANCELED    /* the caller's cancel flag stopped the call (include/tpk/progress.h) */
};

#define TPK_MSG_MAX 1024

/* Error context, passed to every fallible call. Callers own it (usually on the stack).
 * The first error wins: later errors do not overwrite the message, so the root cause
 * is what the user sees. */
typedef struct tpk_ctx {
    int status;
    char msg[TPK_MSG_MAX];
    const char *src_file; /* where in the toolkit the error was raised (for debugging) */
    int src_line;
} tpk_ctx;

TPK_API void tpk_ctx_init(tpk_ctx *ctx);
/* Clear a recorded error so the context can be reused. */
TPK_API void tpk_ctx_clear(tpk_ctx *ctx);
/* Record an error (if none recorded yet) and return `status`. `ctx` may be NULL. */
TPK_API int tpk_error_at(tpk_ctx *ctx, int status, const char *src_file, int src_line,
                         const char *fmt, ...) TPK_PRINTF(5, 6);
TPK_API const char *tpk_strerror(int status);

/* GSL reports errors through a process-wide handler whose default prints and calls abort().
 * Every toolkit function that calls GSL calls this first: once per process (pthread_once, so
 * concurrent first calls are safe) it replaces GSL's default handler by GSL's "off" handler, so
 * GSL failures come back as return codes, which the toolkit turns into TPK_ statuses with a
 * message. A handler the host program installed itself is left in place. Callers of the toolkit
 * never need to call this (or gsl_set_error_handler_off) themselves. */
TPK_API void tpk_error_gsl_init(void);

#define TPK_ERROR(ctx, status, ...) tpk_error_at((ctx), (status), __FILE__, __LINE__, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
