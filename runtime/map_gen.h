/* The tables that gen/tpk_map_cpu_ID.c (generated per machine class from data/tuning logs)
 * define and the map dispatcher (map_dispatch.c) reads. */
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

/* One machine class's table (gen/tpk_map_cpu_ID.c): the tuned n, and safe defaults (the class's
 * analytic blocking, rational arcsine) indexed by dtype; listed by gen/tpk_classes.c. */
typedef struct tpk__map_class {
    const tpk__map_entry *table;
    size_t len;
    const tpk__map_entry *defaults; /* [2] */
} tpk__map_class;

#endif
