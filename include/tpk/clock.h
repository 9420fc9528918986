/* The toolkit's one wall clock, for durations: progress, ETAs, timings in outputs and summaries. */
#ifndef TPK_CLOCK_H
#define TPK_CLOCK_H

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Seconds on the monotonic clock (CLOCK_MONOTONIC: not moved by changes of the date), from an
 * arbitrary origin: only differences mean something. Thread-safe. */
TPK_API double tpk_wall_seconds(void);

#ifdef __cplusplus
}
#endif
#endif
