/* Internal interface of the unrolled (member-level) executor (netsor/exec.c) for its passes:
 * the finite-width NTK (netsor/exec_ntk.c). Not installed. */
#ifndef TPK_NETSOR_EXEC_IMPL_H
#define TPK_NETSOR_EXEC_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "backend-impl.h"
#include "tangent-impl.h"

typedef struct ex {
    const tpk_program *p;
    size_t N, T, d, n;
    uint64_t seed;
    const double *x;
    double **val;   /* per var: N×n (G/H) or N (scalar) */
    double **Z;     /* per A-var: n×n standard normals, while still used */
    double **U;     /* per embedding: n×d standard normals, while still used */
    int *last;      /* per var: last instruction reading it (ninstr: outputs) */
    int *lastA, *lastU;
    int maxdepth, maxlen;
    int named;      /* streams keyed by member names (unique in the program), else by ids */
    tpk_ctx *ctx;
} ex;

/* Are the streams of all random tensors distinct when keyed by name (1), or by ids (0); -1: out
 * of memory. */
int nsr_ex_streams_by_name(const tpk_program *p, tpk_ctx *ctx);
/* Allocate E's tables for E->p and its liveness (E->p, N, T, d, n, ctx set). */
int nsr_ex_setup(ex *E, int all_outputs);
void nsr_ex_free(ex *E);
/* Instruction k: its variable's values at every input (E->val[out], N×n or N), drawing the
 * random tensors it multiplies when first needed. */
int nsr_ex_step(ex *E, int k);
/* The backward pass of the executor over the tangent program t.q (exec_ntk.c), shared by the
 * empirical NTK and training (exec_train.c): A[v] holds, per gradient row, the gradient of a
 * scalar (an output, or the loss) with respect to var v's value at the row's input. */
typedef struct nsr_bw {
    ex E;            /* the forward pass of t.q, every value kept */
    nsr_tangent t;
    size_t R;        /* outputs: N inputs × O outputs, input-major */
    int O, o0;
    int coupled;     /* bn(...): gradient rows are (output row r, input b) pairs, r·N + b */
    size_t rows;     /* gradient rows: R (row r at input r / O), or R·N when coupled */
    double **A;      /* per var of t.q: rows×n gradients (rows for a scalar), NULL if none
                      * reach it */
    double *G1, *G2; /* rows×rows and N×N scratch (the NTK's Gram matrices) */
} nsr_bw;
/* Set up X for p's tangent program at width n (the network of tpk_netsor_run with this seed),
 * inputs x: E ready for nsr_ex_step, one gradient row per output (R = N·O), A empty. Free with
 * nsr_bw_free, also after an error. */
int nsr_bw_init(nsr_bw *X, const tpk_program *p, const tpk_array *x, size_t n, uint64_t seed,
                int all_outputs, tpk_ctx *ctx);
void nsr_bw_free(nsr_bw *X, tpk_ctx *ctx);
/* A[v], allocated (zeroed) on first use; NULL out of memory. */
double *nsr_bw_adj(nsr_bw *X, int v);
/* From the gradients seeded in A (at the readouts' vectors), every variable's, last instruction
 * first: MatMuls by Wᵀ, LinCombs, Nonlins and Moments by their partials (t.part), bn(...) by the
 * exact BatchNorm backward. */
int nsr_bw_propagate(nsr_bw *X);

/* Part k of output o's readout vector (N(0, 1) entries) and its bias z_b, as the run draws them. */
void nsr_ex_readout_vector(const tpk_output *o, int k, uint64_t seed, size_t n, double *v);
double nsr_ex_readout_bias(const tpk_output *o, uint64_t seed);

#endif
