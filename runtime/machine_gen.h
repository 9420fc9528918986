/* The class table that gen/tpk_classes.c (generated from the files data/machines/ID.conf)
 * defines and runtime/machine_select.c, gemm_dispatch.c and map_dispatch.c read: the classes'
 * profiles and, in the same order, each class's GEMM and map tables (gen/tpk_gemm_cpu_ID.c,
 * gen/tpk_map_cpu_ID.c). */
#ifndef TPK_MACHINE_GEN_H
#define TPK_MACHINE_GEN_H

#include <stddef.h>

#include "tpk/machine.h"

struct tpk__gemm_class;
struct tpk__map_class;

extern const tpk_machine tpk__machine_classes[];
extern const size_t tpk__machine_nclasses;
extern const struct tpk__gemm_class *const tpk__gemm_classes[];
extern const struct tpk__map_class *const tpk__map_classes[];

/* The index of the class serving this CPU in the tables above, or -1 (tpk_machine_select). */
int tpk__machine_index(int *how);

#endif
