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

/* The allocator hook (one for the whole library, as Lua's lua_Alloc; tpk/alloc.h has the
 * helpers and the rules). Every block of memory libtpk allocates comes from one call
 *     fn(ud, NULL, n)  allocate n > 0 bytes (NULL: out of memory)
 *     fn(ud, p, n)     resize the block p to n > 0 bytes, as realloc (NULL: p is left intact)
 *     fn(ud, p, 0)     free the block p (p != NULL; the return value is ignored)
 * The library never asks for 0 bytes and never frees NULL. Unlike lua_Alloc there is no old
 * size: the library's objects do not record the size of every buffer they own, and an allocator
 * that wants it (a counting one) keeps a header of its own. The hook may be called from several
 * threads at once when a call runs threads (OpenMP, nthreads > 1); it must be thread-safe then.
 * tpk_alloc_default is the C library's malloc/realloc/free behind this interface. */
typedef void *(*tpk_alloc_fn)(void *ud, void *ptr, size_t nsize);
/* An allocator: the hook and its user data. {NULL, NULL} (a zeroed struct) is the default. */
typedef struct tpk_allocator {
    tpk_alloc_fn fn;
    void *ud;
} tpk_allocator;

/* Notes: what a call chose on the caller's behalf and the user should hear about (a CSV line
 * taken as a header, a rank-1 array read as N×1): one line, without a newline, to fn(ud, msg).
 * Not errors: the call goes on. None is the default (tpk_ctx_init): they are dropped. */
typedef void (*tpk_note_fn)(void *ud, const char *msg);

/* Error context, passed to every fallible call. Callers own it (usually on the stack).
 * The first error wins: later errors do not overwrite the message, so the root cause
 * is what the user sees. The context also carries the allocator every call made with it
 * allocates from (tpk_ctx_set_allocator); objects remember theirs, so their _free needs none.
 *
 * THE ONE RULE: after an error your program handles and goes on from, call tpk_ctx_clear(ctx)
 * before the next call. A context that holds an error keeps it: later calls that succeed leave
 * it there, and a later failure returns its own status with the OLD message. A program that
 * stops at its first error (print ctx->msg, exit) never needs to clear. examples/custom_phi.c
 * shows the handled case (a tpk_phi_alloc that fails, a tpk_phi_register, a clear).
 *
 * Why the rule, rather than a context reset at entry to every public call: first-error-wins is
 * how a failure deep in a call chain keeps its root cause, and the library's public calls call
 * each other with the caller's context, also after a failure (tpk_arch_kernel →
 * tpk_job_kernel_arrays → tpk_netsor_kernel_progress, whose failed job then frees its state
 * through tpk_free(ctx, ...) on that same context): a reset at each entry would let that
 * clean-up, or any later step of the chain, erase the message that explains the failure. Out
 * of memory is kept on purpose across calls (below), which a reset would undo too. So the
 * context is reset only where the caller says the error is dealt with: tpk_ctx_clear. */
typedef struct tpk_ctx {
    int status;
    char msg[TPK_MSG_MAX];
    const char *src_file; /* where in the toolkit the error was raised (for debugging) */
    int src_line;
    tpk_allocator alloc;  /* {NULL, NULL} after tpk_ctx_init: the C library's malloc */
    tpk_note_fn note;     /* NULL after tpk_ctx_init: notes are dropped (tpk_ctx_set_notes) */
    void *note_ud;
} tpk_ctx;

/* A clear context with the default allocator. */
TPK_API void tpk_ctx_init(tpk_ctx *ctx);
/* Clear a recorded error so the context can be reused; the allocator and notes are kept. */
TPK_API void tpk_ctx_clear(tpk_ctx *ctx);
/* A clear context with the allocator and notes of `parent` (NULL: the defaults): the scratch
 * contexts the library makes for a step whose error it handles itself, or one per thread. */
TPK_API void tpk_ctx_init_from(tpk_ctx *ctx, const tpk_ctx *parent);
/* Send the notes of every later call with ctx to fn(ud, msg); fn NULL: drop them. */
TPK_API void tpk_ctx_set_notes(tpk_ctx *ctx, tpk_note_fn fn, void *ud);
/* Hand a note to ctx's note function (a no-op without one, or with ctx NULL). */
TPK_API void tpk_note(tpk_ctx *ctx, const char *fmt, ...) TPK_PRINTF(2, 3);
/* Make every later call with ctx allocate through fn(ud, ...); fn NULL: the default. Objects
 * allocated before keep the allocator they were made with. */
TPK_API void tpk_ctx_set_allocator(tpk_ctx *ctx, tpk_alloc_fn fn, void *ud);
/* The C library's allocator as a tpk_alloc_fn (ud unused): a hook can pass calls on to it. */
TPK_API void *tpk_alloc_default(void *ud, void *ptr, size_t nsize);
/* Record an error (if none recorded yet) and return `status`. Out of memory is sticky: once ctx
 * holds TPK_ENOMEM, every later call returns TPK_ENOMEM, so an allocation that failed deep down
 * makes the whole call return TPK_ENOMEM, with the message, whatever status the levels above
 * would have chosen for their own failure ("eigen-decomposition failed"). `ctx` may be NULL. */
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
