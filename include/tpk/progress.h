/* Progress and cancellation of long calls: a callback and a flag the caller passes (never a
 * global). The library counts steps and checks the flag; what is shown, where and how often is
 * the caller's business (the tools draw one line on stderr, tools/cli.c). */
#ifndef TPK_PROGRESS_H
#define TPK_PROGRESS_H

#include <signal.h>
#include <stddef.h>

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One report: `done` of `total` units finished (0 <= done <= total). `what` names the unit,
 * plural ("instructions", "family instructions", "steps", "runs"); it changes when a call moves
 * on to another stage, and then the count starts again. */
typedef struct tpk_progress_info {
    const char *what;
    size_t done, total;
} tpk_progress_info;

typedef void (*tpk_progress_fn)(const tpk_progress_info *p, void *user);

/* What a caller hands to a long call (NULL, or any field NULL: nothing). `fn` is called on the
 * calling thread between steps, never from inside a parallel region, as often as the steps come:
 * it should return at once (the tools only look at the clock, and draw a few times a second).
 * `cancel` is read at every step and more often in long loops: once it is non-zero the call
 * stops, frees what it allocated (an output file it was writing is not left behind) and returns
 * TPK_ECANCELED. A signal handler (SIGINT) or another thread may set it. */
typedef struct tpk_progress {
    tpk_progress_fn fn;
    void *user;
    const volatile sig_atomic_t *cancel;
} tpk_progress;

/* Report done of total to p's callback, then check p's flag: TPK_ECANCELED with the message
 * "cancelled" in ctx when it is set, TPK_OK otherwise (also when p is NULL). */
TPK_API int tpk_progress_report(const tpk_progress *p, const char *what, size_t done,
                                size_t total, tpk_ctx *ctx);
/* The flag alone, cheap and safe from any thread (also inside parallel loops): 1 when set. */
TPK_API int tpk_progress_cancelled(const tpk_progress *p);
/* TPK_ECANCELED with the message "cancelled" when the flag is set, else TPK_OK. */
TPK_API int tpk_progress_check(const tpk_progress *p, tpk_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
