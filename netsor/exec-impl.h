/* Internal interface of the unrolled (member-level) executor (netsor/exec.c) for its passes:
 * the finite-width NTK (netsor/exec_ntk.c). Not installed. */
#ifndef TPK_NETSOR_EXEC_IMPL_H
#define TPK_NETSOR_EXEC_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "backend-impl.h"

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
/* Part k of output o's readout vector (N(0, 1) entries) and its bias z_b, as the run draws them. */
void nsr_ex_readout_vector(const tpk_output *o, int k, uint64_t seed, size_t n, double *v);
double nsr_ex_readout_bias(const tpk_output *o, uint64_t seed);

#endif
