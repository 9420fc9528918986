/* Internal state of the orchestration module (orch/): the graph, the candidate set with the
 * indexes the solvers share, bitsets over the live primitives, and the executable-order search.
 * Not installed. */
#ifndef TPK_ORCH_IMPL_H
#define TPK_ORCH_IMPL_H

#include <stdint.h>

#include "tpk/alloc.h"
#include "tpk/orch.h"

struct tpk_orch_graph {
    int nvalues;
    size_t cap;
    tpk_orch_value *v; /* v[i].args: the graph's own copy of the arguments */
    tpk_allocator al;  /* of tpk_orch_graph_alloc (tpk/alloc.h): v and the arguments */
};

/* Bitsets of `nw` 64-bit words over the live primitives (their dense index 0..nlive). */
typedef uint64_t orch_word;
#define ORCH_BIT(s, i) (((s)[(i) >> 6] >> ((i) & 63)) & 1u)
#define ORCH_SET(s, i) ((s)[(i) >> 6] |= (orch_word)1 << ((i) & 63))

struct tpk_orch_cands {
    const tpk_orch_graph *g;
    tpk_orch_opts opts;
    int nlive;         /* primitives some graph output depends on */
    int *live;         /* live index → value id */
    int *live_of;      /* value id → live index, −1 for inputs and dead primitives */
    int nk;
    size_t capk, capoff;
    tpk_orch_kernel *k; /* their prims/inputs/outputs point into pool (fixed up at the end) */
    int *pool;
    size_t npool, cappool;
    size_t *off;        /* per kernel: offset of prims in pool (inputs, outputs follow) */
    /* Who writes and who reads each value (CSR over value ids, filled after enumeration). */
    int *wr_start, *wr;
    int *rd_start, *rd;
    tpk_allocator al;   /* of tpk_orch_cands_alloc: every array above */
};

/* Grows an array of `size`-byte items (from al) to hold at least `need`; TPK_ENOMEM on failure.
 * Every block of orch/ comes from the allocator hook (tpk/alloc.h): an object's from the one it
 * remembers, a call's temporaries from its ctx's (TPK_ALLOCATOR_OF(ctx)), their failures
 * reported with orch's own messages. */
int orch_grow(void **p, size_t size, size_t need, size_t *cap, const tpk_allocator *al,
              tpk_ctx *ctx);

/* A plan of n kernels (indices copied), cost summed; NULL and ctx set on allocation failure. */
tpk_orch_plan *orch_plan_new(const tpk_orch_cands *c, const int *kernels, int n, tpk_ctx *ctx);

/* Executable order of the selected candidates sel[0..n) (orchestration.md §3.2): repeatedly
 * the first kernel, in the order given, whose inputs are graph inputs or written by kernels
 * already placed. Writes the placed ones to order[0..*placed), the others to stuck[0..*nstuck),
 * and returns 1 when the placed ones write every graph output (the others are then not needed),
 * 0 when they do not, −1 when out of memory. */
int orch_order(const tpk_orch_cands *c, const int *sel, int n, int *order, int *placed,
               int *stuck, int *nstuck, const tpk_allocator *al);

/* Turns CBC's outcome into a status and message (orch/blp.c; tests drive it with made-up
 * outcomes): status/secondary as Cbc_status/Cbc_secondaryStatus, infeasible and optimal as
 * Cbc_isProvenInfeasible/Cbc_isProvenOptimal, has_solution as Cbc_bestSolution != NULL. */
int orch_cbc_outcome(int status, int secondary, int infeasible, int optimal, int has_solution,
                     int ncands, tpk_ctx *ctx);

#endif
