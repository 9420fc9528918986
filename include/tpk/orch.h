/* Kernel orchestration on a DAG of primitives (Korch: Hu et al., "Optimal Kernel Orchestration for
 * Tensor Programs with Korch", ASPLOS 2024; docs/orchestration.md): candidate kernels are convex
 * sub-graphs, a binary linear program solved by COIN-OR CBC picks the cheapest set of them that
 * computes every graph output (recomputation allowed), returned in an executable order. */
#ifndef TPK_ORCH_H
#define TPK_ORCH_H

#include <stddef.h>
#include <stdio.h>

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- The primitive graph (orchestration.md §1) -------------------------------------------- */

/* What a primitive does to memory and arithmetic (Korch §3's four classes, linear split out as
 * the compute-bound one). At most opts.max_linear LINEAR primitives share a kernel. */
enum tpk_orch_kind {
    TPK_ORCH_LINEAR = 0, /* GEMM-like, compute-bound: products, Gram/SYRK, A Σ Bᵀ, conv taps */
    TPK_ORCH_MAP,        /* elementwise: φ, affine updates, scaling by broadcast operands */
    TPK_ORCH_REDUCE,     /* along an axis: diagonals, row sums, means, pooling */
    TPK_ORCH_BROADCAST,  /* replication along an axis */
    TPK_ORCH_LAYOUT,     /* data movement only: transpose, gather, slice, concatenation */
    TPK_ORCH_NKINDS
};
/* "linear", "map", "reduce", "broadcast", "layout"; "?" outside the enum. */
TPK_API const char *tpk_orch_kind_name(int kind);

#define TPK_ORCH_MAX_RANK 4
/* Names are copied, cut to this many bytes (with the NUL). */
#define TPK_ORCH_NAME_MAX 48

/* The shape of a value: rank 0 (a scalar) to TPK_ORCH_MAX_RANK, bytes per element. */
typedef struct tpk_orch_shape {
    int rank;
    size_t dims[TPK_ORCH_MAX_RANK];
    size_t elem_size;
} tpk_orch_shape;

/* A value of the graph: a graph input (in memory before the first kernel) or the output of one
 * primitive. Ids are dense from 0 in the order of creation, which is a topological order: a
 * primitive's arguments are created before it. */
typedef struct tpk_orch_value {
    char name[TPK_ORCH_NAME_MAX];
    int is_input;  /* 1: graph input, 0: primitive */
    int kind;      /* primitives: enum tpk_orch_kind */
    tpk_orch_shape shape;
    size_t bytes;  /* elements × elem_size */
    double flops;  /* primitives: arithmetic of one evaluation (for cost models) */
    int nargs;     /* primitives: the values read, in argument order (repeats allowed) */
    const int *args;
    int is_output; /* 1: a graph output, kept after the last kernel */
} tpk_orch_value;

typedef struct tpk_orch_graph tpk_orch_graph;

TPK_API tpk_orch_graph *tpk_orch_graph_alloc(tpk_ctx *ctx);
TPK_API void tpk_orch_graph_free(tpk_orch_graph *g);
/* Add a graph input; *id (may be NULL) receives its value id. TPK_EINVAL for a bad shape. */
TPK_API int tpk_orch_graph_add_input(tpk_orch_graph *g, const char *name,
                                     const tpk_orch_shape *shape, int *id, tpk_ctx *ctx);
/* Add a primitive of `kind` reading args[0..nargs) (existing value ids, nargs ≥ 1), producing a
 * value of `shape` with `flops` of arithmetic (finite, ≥ 0); *id (may be NULL) its value id. */
TPK_API int tpk_orch_graph_add_prim(tpk_orch_graph *g, const char *name, int kind,
                                    const tpk_orch_shape *shape, double flops, int nargs,
                                    const int *args, int *id, tpk_ctx *ctx);
/* Mark a value as a graph output (a graph input marked so is available from the start). */
TPK_API int tpk_orch_graph_set_output(tpk_orch_graph *g, int id, tpk_ctx *ctx);
TPK_API int tpk_orch_graph_nvalues(const tpk_orch_graph *g);
/* Value `id`, or NULL outside [0, nvalues). The pointer lives until the next add or the free. */
TPK_API const tpk_orch_value *tpk_orch_graph_value(const tpk_orch_graph *g, int id);

/* ---- Options ------------------------------------------------------------------------------ */

typedef struct tpk_orch_opts {
    int max_size;          /* primitives per candidate kernel (≥ 1) */
    int max_linear;        /* LINEAR primitives per candidate kernel (≥ 0; Korch: 1) */
    int max_extra_outputs; /* a convex set with e optional outputs gives 2^e candidates when
                            * e ≤ this, else two: none and all of them (orchestration.md §2) */
    int max_candidates;    /* more is TPK_EUNSUPPORTED (a bound on memory and solve time) */
    int max_rounds;        /* BLP solves with acyclicity cuts before TPK_ENUMERIC (≥ 1) */
    double max_seconds;    /* CBC's time limit per solve; 0: none */
    int max_nodes;         /* CBC's branch-and-bound node limit per solve; 0: none */
    const char *cbc_args;  /* more CBC parameters, "name=value,..." as its command line takes
                            * them ("cuts=on,log=1"), after the defaults; NULL: none */
} tpk_orch_opts;

/* max_size 8, max_linear 1, max_extra_outputs 4, max_candidates 200000, max_rounds 200, no
 * time or node limit, no extra CBC parameters. */
TPK_API void tpk_orch_opts_default(tpk_orch_opts *o);

/* ---- Candidate kernels (orchestration.md §2) ---------------------------------------------- */

/* One candidate kernel: a weakly connected convex set of primitives (no path leaves it and comes
 * back) with at most max_linear LINEAR ones, and the values it writes. */
typedef struct tpk_orch_kernel {
    int nprims;        /* its primitives (value ids, ascending: a topological order) */
    const int *prims;
    int ninputs;       /* values it reads from outside: graph inputs or primitives of others */
    const int *inputs;
    int noutputs;      /* values it writes: its sinks, its graph outputs, and the chosen subset
                        * of its other values that a primitive outside reads */
    const int *outputs;
    int nlinear;       /* LINEAR primitives among prims */
    double cost;       /* from tpk_orch_cands_cost: ≥ 0, +inf when it cannot be built; NaN
                        * before costing */
} tpk_orch_kernel;

typedef struct tpk_orch_cands tpk_orch_cands;

/* Enumerate the candidates of g under o (NULL: defaults). Only primitives some graph output
 * depends on take part. The graph must outlive the set and stay unchanged. */
TPK_API tpk_orch_cands *tpk_orch_cands_alloc(const tpk_orch_graph *g, const tpk_orch_opts *o,
                                             tpk_ctx *ctx);
TPK_API void tpk_orch_cands_free(tpk_orch_cands *c);
TPK_API int tpk_orch_cands_count(const tpk_orch_cands *c);
TPK_API const tpk_orch_kernel *tpk_orch_cands_get(const tpk_orch_cands *c, int i);
TPK_API const tpk_orch_graph *tpk_orch_cands_graph(const tpk_orch_cands *c);

/* A cost model or measurement: *cost for kernel k (predicted or measured time, any unit shared
 * by all candidates), ≥ 0, or +INFINITY when k cannot be built (it is then never chosen).
 * Returns a status; a failure stops tpk_orch_cands_cost with the callback's message. */
typedef int (*tpk_orch_cost_fn)(const tpk_orch_graph *g, const tpk_orch_kernel *k, void *arg,
                                double *cost, tpk_ctx *ctx);
/* Cost every candidate by fn. TPK_EDOM (naming the kernel) for a NaN or negative cost. */
TPK_API int tpk_orch_cands_cost(tpk_orch_cands *c, tpk_orch_cost_fn fn, void *arg, tpk_ctx *ctx);
/* Set candidate i's cost directly (a cached measurement); same checks. */
TPK_API int tpk_orch_cands_set_cost(tpk_orch_cands *c, int i, double cost, tpk_ctx *ctx);

/* A roofline-style predicted time (orchestration.md §2): launch_s + (bytes read + bytes written)
 * / bytes_per_s + flops / flops_per_s, every primitive of the kernel counted (recomputation
 * costs arithmetic, not memory). arg: a const tpk_orch_roofline *. */
typedef struct tpk_orch_roofline {
    double launch_s;    /* fixed cost of one kernel launch, seconds */
    double bytes_per_s; /* memory bandwidth */
    double flops_per_s; /* arithmetic peak */
} tpk_orch_roofline;
TPK_API int tpk_orch_cost_roofline(const tpk_orch_graph *g, const tpk_orch_kernel *k, void *arg,
                                   double *cost, tpk_ctx *ctx);

/* ---- Plans (orchestration.md §3, §4) ------------------------------------------------------ */

typedef struct tpk_orch_plan {
    int nkernels;
    int *kernels;   /* candidate indices, in an executable order */
    double cost;    /* Σ of their costs */
    int solves;     /* BLPs solved: 1 + rounds with acyclicity cuts (0 for the other solvers) */
    int cuts;       /* acyclicity cuts added */
    long nodes;     /* CBC branch-and-bound nodes over all solves */
    double seconds; /* wall time of the solver */
    tpk_allocator alloc; /* of the solver's call (tpk/alloc.h): kernels and the plan */
} tpk_orch_plan;

/* The optimal plan by the binary linear program of orchestration.md §3, solved by CBC, with
 * lazy acyclicity cuts. TPK_ENOTFOUND when no selection of buildable candidates computes every
 * output (CBC proves the BLP infeasible); TPK_ENUMERIC when CBC stops without a proof (limits
 * of o, numerical trouble) or the cuts do not converge within o->max_rounds; TPK_EINVAL when a
 * candidate has no cost yet. o NULL: defaults. */
TPK_API tpk_orch_plan *tpk_orch_solve_blp(const tpk_orch_cands *c, const tpk_orch_opts *o,
                                          tpk_ctx *ctx);
/* The optimal plan by dynamic programming over the sets of values in memory (orchestration.md
 * §4): the BLP's test oracle, independent of its formulation. TPK_EUNSUPPORTED beyond
 * TPK_ORCH_EXHAUSTIVE_MAX primitives that outputs depend on. */
#define TPK_ORCH_EXHAUSTIVE_MAX 20
TPK_API tpk_orch_plan *tpk_orch_solve_exhaustive(const tpk_orch_cands *c, tpk_ctx *ctx);
/* One kernel per primitive that outputs depend on, in graph order (TPK_PLAN=naive): the
 * single-primitive candidates writing all their values. TPK_ENOTFOUND if one is missing or
 * cannot be built. */
TPK_API tpk_orch_plan *tpk_orch_solve_naive(const tpk_orch_cands *c, tpk_ctx *ctx);
/* Is p executable as listed: valid indices, every input a graph input or written by an earlier
 * kernel, every graph output written, p->cost the sum of the costs? TPK_EINVAL naming the first
 * fault. */
TPK_API int tpk_orch_plan_check(const tpk_orch_cands *c, const tpk_orch_plan *p, tpk_ctx *ctx);
/* The plan, one kernel a line: "k3 cost=... prims={a,b} in={x} out={b}"; returns a status. */
TPK_API int tpk_orch_plan_write(FILE *f, const tpk_orch_cands *c, const tpk_orch_plan *p,
                                tpk_ctx *ctx);
TPK_API void tpk_orch_plan_free(tpk_orch_plan *p);

#ifdef __cplusplus
}
#endif
#endif
