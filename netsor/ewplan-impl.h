/* Entrywise programs of the rolled limit evaluator, lowered to primitives and run by an
 * orchestrated plan (issue 20; docs/orchestration.md §7, theory.md §1.8).
 *
 * Between two reads that need a whole matrix, much of a network's limit recursion is entrywise:
 * entry (a, c) of a layer's second-moment block depends only on entry (a, c) of the blocks it is
 * made from and on their diagonals (φ-maps V_φ(k; q_a, q_c), sums of independent terms scaled by
 * per-index weights such as LayerNorm's 1/√(v + ε), biases). netsor/flimit.c keeps such blocks
 * pending as nodes of a DAG; when a reader needs a matrix, nsr_ew_eval lowers the DAG under it
 * to a graph of map primitives (tpk_orch_graph), enumerates fused candidate kernels, costs them
 * by a model calibrated on this run's data (sampled rows) and machine (memory passes), chooses a
 * plan (one kernel per primitive, or the BLP's optimum) and runs it: each kernel maps row
 * segments of the lower triangle through its primitives in cache-resident buffers and writes only
 * the values the plan keeps. */
#ifndef NSR_EWPLAN_IMPL_H
#define NSR_EWPLAN_IMPL_H

#include "tpk/error.h"
#include "tpk/gauss.h"
#include "tpk/netsor.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef _OPENMP
#include <omp.h>
#endif

enum { NSR_EW_LEAF, NSR_EW_PHI, NSR_EW_SUM, NSR_EW_CONV };

/* Plans (TPK_PLAN): one kernel per primitive, or the BLP's optimum (tpk/netsor.h's values). */
enum { NSR_PLAN_NAIVE = TPK_PLAN_NAIVE, NSR_PLAN_OPTIMAL = TPK_PLAN_OPTIMAL };
/* A flag beside the plan: the report gives each kernel's signature (§7.3, nsr_ew_signature). */
enum { NSR_PLAN_SIGNATURES = TPK_PLAN_SIGNATURES, NSR_PLAN_CANDIDATES = TPK_PLAN_CANDIDATES };

#define NSR_EW_MAXT 8

/* A term of a sum: c · w_a w_c · x_ac, x a node's entries (arg ≥ 0) or a bias block (arg = −1:
 * entry (a, c) of members p = a mod m, q = c mod m is s[p] where both read one bias member, else
 * 0 — independent members, theory §1.6). cls NULL: member p reads bias member p (p = q only);
 * else cls[p], −1 for none (a bias shared by every position of a CNN layer: all equal). w NULL:
 * 1. */
typedef struct nsr_ew_term {
    int arg;
    double c;
    const double *w;
    const double *s;
    const int *cls;
} nsr_ew_term;

/* A node of n×n symmetric second moments; only lower triangles are read and written. Arguments
 * are earlier nodes (ids below the node's own). */
typedef struct nsr_ew_node {
    int op;
    const double *M;        /* LEAF: the matrix, row-major, leading dimension n; NULL: the */
    const double *x;        /*   inputs' Gram ⟨x_i, x_j⟩/d, x n rows of d (pair programs only) */
    size_t d;
    int arg;                /* PHI: alpha·V_φ(x) + beta, x's own diagonal */
    const tpk_phi *phi;     /* CONV: alpha·taps(x), or alpha·taps(V_φ(x)) where phi is set */
    double alpha, beta;
    int rows, cols, kh, kw, pad; /* CONV: the grid of an input's m members (row-major), the
                                  * filter (centre tap (kh−1)/2, (kw−1)/2), TPK_CNN_CIRCULAR or
                                  * TPK_CNN_ZERO (theory §2.8) */
    int nt;                 /* SUM: Σ terms */
    nsr_ew_term t[NSR_EW_MAXT];
    const double *diag;     /* every node: its diagonal (n), nsr_ew_diag's for maps and sums */
    char name[40];          /* for reports ("map@27") */
    int line, col;          /* the statement that made it (errors: FILE:LINE:COL), 0: none */
} nsr_ew_node;

/* What one evaluation did (for `netsor plan` and the tests). */
typedef struct nsr_ew_stats {
    int nprims, ncands, nkernels, fused; /* fused: kernels of more than one primitive */
    int emitted;                         /* kernels run by the provider's code */
    double predicted_s, measured_s;      /* the plan's kernels: model, wall clock */
    double calib_s, solve_s;             /* calibration and candidates + solve */
} nsr_ew_stats;

/* The cost model's machine constants (seconds): measured once by the first evaluation that needs
 * them (memory passes over the threads) and kept by the caller across evaluations; per-entry
 * compute is sampled on each program's own rows unless fixed (then flops × flop_s: a
 * deterministic model, for tests). */
typedef struct nsr_ew_calib {
    int have_memory;
    double read_s, write_s, fault_s; /* per byte: read, write, first touch of a fresh page */
    double launch_s;                 /* per kernel */
    int fixed_compute;
    double flop_s;
    /* emitted kernels by signature (§7.3), or NULL: where one is found, it runs instead of the
     * executor's, and its measured time is the candidate's cost */
    const tpk_netsor_ew_provider *provider;
} nsr_ew_calib;

/* Node k's diagonal into out (n) from its arguments' diagonals; *err (may be NULL) its error.
 * Errors name the node's statement in file (FILE:LINE:COL: ...). */
int nsr_ew_diag(const nsr_ew_node *node, int k, size_t n, long m, const tpk_gauss_ws *ws,
                const char *file, double *out, double *err, tpk_ctx *ctx);

/* The lower triangle of node root (leading dimension n) into out — with out_full both
 * triangles (the upper stored from the kernel's tiles, no mirror pass) — by the plan of `plan`;
 * every node below root that is not a leaf is computed on the way. m: members per input (bias
 * terms). report (may be NULL): the plan, one kernel a line, with predicted and measured times.
 * *err: the largest error bound of a map; stats (may be NULL). cal (may be NULL): the model's
 * constants, measured into it where it has none. out_fresh: out is fresh pages (the model counts
 * their first touch). out may be a leaf's matrix that nothing reads after this call: every
 * kernel reads an entry of its inputs before it stores that entry of its outputs, and the
 * kernel that writes the root is the plan's last. */
int nsr_ew_eval(const nsr_ew_node *node, int nn, int root, size_t n, long m, int plan,
                const tpk_gauss_ws *ws, nsr_ew_calib *cal, const char *file, FILE *report,
                double *out, int out_fresh, int out_full, double *err, nsr_ew_stats *stats,
                tpk_ctx *ctx);

/* A pooled readout of a pair program's root x: out (N×N, both triangles) =
 * alpha·Σ_pq w_ap w_cq V_φ(x)_(ap)(cq) + beta, or of x itself where phi is NULL; w is N × m. */
typedef struct nsr_ew_reduce {
    const tpk_phi *phi;
    double alpha, beta;
    const double *w;
} nsr_ew_reduce;

/* The upper triangle of the n×n M from its lower one, in cache-sized tiles. */
void nsr_ew_mirror(double *M, size_t n);

/* Threads a parallel region of the executors runs on. */
static inline int nsr_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* Input pair (a, c)'s m × m block into y: of M (n × n; lower: only its lower triangle is
 * stored, a diagonal block is mirrored), or with M NULL of the inputs' Gram ⟨x_ap, x_cq⟩/d
 * (x: n rows of d). */
void nsr_pair_block(const double *M, int lower, const double *x, size_t d, size_t n, size_t m,
                    size_t a, size_t c, double *y);

/* 1 when the program under root must run by input pairs (netsor/ewpair.c): it holds a
 * convolution or an inputs' Gram leaf. nsr_ew_eval then hands it to nsr_ew_eval_pairs. */
int nsr_ew_pairwise(const nsr_ew_node *node, int root);

/* nsr_ew_eval for pair programs: one kernel, each input pair's blocks of every node in buffers
 * (no plan to choose: the maps and taps of a pair run once each whatever the order), and with
 * red a pooled readout instead of the root's matrix (out is then N×N). */
int nsr_ew_eval_pairs(const nsr_ew_node *node, int nn, int root, size_t n, long m,
                      const tpk_gauss_ws *ws, const char *file, FILE *report, double *out,
                      int out_full, const nsr_ew_reduce *red, double *err, nsr_ew_stats *stats,
                      tpk_ctx *ctx);

/* The status st of ctx again, its message prefixed with node nd's statement (FILE:LINE:COL). */
int nsr_ew_named(tpk_ctx *ctx, int st, const char *file, const nsr_ew_node *nd);

/* Exact verification of the executor's kernels (docs/orchestration.md §7.2): the program's
 * structure with random elements of Z_p (p = 2^31 − 1) for its leaves, weights, coefficients and
 * biases (0 and 1 kept: they decide identities), its maps a random function of (x, q_a, q_c);
 * every candidate kernel the plans choose from (and the small programs' runs) run by the
 * executor's own code in Z_p from the reference's inputs, each output (the root's both
 * triangles where a kernel writes them from tiles) compared entry by entry with whole-matrix
 * loops. mutant (1..nsr_ew_mutants(); 0 none) injects a bug into the executor for the
 * mutation suite. A wrong entry survives with probability about 1/p. */
typedef struct nsr_ew_verified {
    int kernels;            /* kernel runs checked */
    int mismatch;           /* 1: the first differing entry below */
    size_t row, col;
    char what[96];
} nsr_ew_verified;
int nsr_ew_verify(const nsr_ew_node *node, int nn, int root, size_t n, long m, uint64_t seed,
                  int mutant, nsr_ew_verified *out, tpk_ctx *ctx);
int nsr_ew_mutants(void);

/* TPK_PLAN from the environment: naive or optimal (default, also for an empty value); any other
 * value is TPK_EINVAL with a message naming it. */
int nsr_plan_from_env(int *plan, tpk_ctx *ctx);

#endif
