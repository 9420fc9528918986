/* Internal interface of the joint sampler of the limit evaluator (netsor/limit_joint.c): the
 * expectations of many high-dimensional factor products — an LSTM's E[tanh(c^t_a) tanh(c^s_c)]
 * for every pair of inputs and steps (theory.md §2.4) — from one randomised QMC sample of the
 * limit Gaussians that every call shares, each factor evaluated once on it. Not installed. */
#ifndef TPK_NETSOR_JOINT_IMPL_H
#define TPK_NETSOR_JOINT_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "tpk/netsor.h"

/* What the sampler asks the evaluator: Cov(Z^g_a, Z^h_c), E Z^g, a scalar's value at input a, and
 * whether G-var g is still live (its covariances still held). */
typedef struct tpk_nsr_joint_env {
    void *ctx;
    double (*cov)(void *ctx, int g, size_t a, int h, size_t c);
    double (*mean)(void *ctx, int g);
    double (*scalar)(void *ctx, int var, size_t a);
    int (*alive)(void *ctx, int g);
} tpk_nsr_joint_env;

/* A factor: the RPN node[0..len) (owned by the program, stable for the evaluation) at an input. */
typedef struct tpk_nsr_jfac {
    const tpk_rpn_node *node;
    int len;
    size_t input;
} tpk_nsr_jfac;

typedef struct tpk_nsr_joint tpk_nsr_joint;

/* shifts × points per shift; max_bytes bounds the cache of factor values. Its memory comes from
 * al (tpk/alloc.h; NULL: the default), kept for its growth and its _free. NULL: out of memory
 * (nothing recorded: the caller then integrates without it). */
tpk_nsr_joint *tpk_nsr_joint_alloc(int shifts, size_t points, size_t max_bytes, uint64_t seed,
                                   const tpk_allocator *al);
void tpk_nsr_joint_free(tpk_nsr_joint *j);

/* out[i] = E[Π of the factors f[off[i] .. off[i+1])] with the standard error over the shifts, for
 * i < n. Every G-var a factor reads joins the shared sample (in order of first use: each new one
 * is drawn conditionally on all earlier ones, through its Cholesky row), and each factor's values
 * are kept, so a factor met again costs nothing and its values stay consistent with every later
 * one. When a coordinate's G-var has died (its covariance with a new one is gone), the sample
 * starts afresh: the groups asked later only read live G-vars. TPK_EUNSUPPORTED (nothing
 * computed): the cache would pass max_bytes — the caller computes these expectations its own way. */
int tpk_nsr_joint_expect(tpk_nsr_joint *j, const tpk_nsr_joint_env *env, int n,
                         const size_t *off, const tpk_nsr_jfac *f, tpk_estimate *out,
                         tpk_ctx *ctx);

#endif
