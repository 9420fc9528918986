/* The table that gen/tpk_map_cpu.c (generated from data/tuning logs) defines and the map
 * dispatcher (map_dispatch.c) reads. */
#ifndef TPK_MAP_GEN_H
#define TPK_MAP_GEN_H

#include <stddef.h>

#include "tpk/map.h"

typedef struct tpk__map_entry {
    int dtype;   /* enum tpk_tune_dtype */
    int threads; /* threads it was tuned for */
    size_t n;
    double rate; /* G entries/s of the fastest repeat when tuned */
    const char *name;
    tpk_dmap_kernel_fn dfn; /* set for f64 */
    tpk_smap_kernel_fn sfn; /* set for f32 */
    tpk_map_ws_fn ws;
} tpk__map_entry;

extern const tpk__map_entry tpk__map_table[];
extern const size_t tpk__map_table_len;
/* Safe defaults (analytic blocking, rational arcsine), indexed by dtype. */
extern const tpk__map_entry tpk__map_default[2];

#endif
