/* Internal interface shared by the NETSOR back ends (limit evaluator netsor/limit*.c and the
 * finite-width executor netsor/exec*.c): program validation, RPN evaluation over blocks of
 * points, and the evaluator's debugging options. Not installed. */
#ifndef TPK_NETSOR_BACKEND_IMPL_H
#define TPK_NETSOR_BACKEND_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tpk/netsor.h"

/* An output's readout (theory §1.5, docs/netsor.md "Outputs"): the parts it reads out (one, or
 * the m vectors of readout(concat(h1, ..., hm), ...)) and whether two outputs share a readout
 * vector. Outputs of one readout vector have the same number of parts (elab checks it), and
 * part k of one meets part k of the other: K = σ_v σ_v' / m · Σ_k E[h_k h'_k] + β β'. Outputs
 * of different readout vectors (readout[u] against readout[w] or the default) are independent:
 * their kernel entry is 0, biases included. */
static inline int nsr_out_nparts(const tpk_output *o)
{
    return o->nparts > 1 ? o->nparts : 1;
}

static inline int nsr_out_part(const tpk_output *o, int k)
{
    return o->nparts > 1 ? o->part[k] : o->src;
}

static inline int nsr_same_readout(const tpk_output *a, const tpk_output *b)
{
    return a->readout == NULL ? b->readout == NULL
                              : b->readout != NULL && strcmp(a->readout, b->readout) == 0;
}

/* Shape facts about (program, x) established by tpk_nsr_validate. */
typedef struct tpk_nsr_shape {
    size_t N;        /* inputs */
    size_t T;        /* slots per input (1 for N×d) */
    size_t d;        /* input dimension */
    int maxlen;      /* longest Nonlin/Moment body */
    int maxdepth;    /* deepest RPN stack */
} tpk_nsr_shape;

/* Check the IR (ids in range, types, define-before-use, RPN well-formed) and x's shape.
 * TPK_EINVAL with "line:col: ..." on failure. */
int tpk_nsr_validate(const tpk_program *p, const tpk_array *x, int all_outputs,
                     tpk_nsr_shape *shape, tpk_ctx *ctx);

/* Stack depth an RPN range needs, or -1 if it is not one well-formed expression. */
int tpk_nsr_rpn_depth(const tpk_rpn_node *node, int len);

/* Evaluate the expression node[0..len) at B points. gv[i] (for GVAR nodes) points at the B
 * values of that leaf; sv[i] (for SCALAR nodes) is its value. stack: depth·B doubles. */
void tpk_nsr_rpn_eval(const tpk_rpn_node *node, int len, const double *const *gv,
                      const double *sv, size_t B, double *stack, double *out);

/* Options of the limit evaluator, for tests and diagnostics (defaults: all zero). */
typedef struct tpk_limit_opts {
    int no_fastpath;    /* never use whole-matrix tpk_gauss_map / _cross */
    int no_factor;      /* no sum expansion, no splitting into independent families, no 2-D
                         * special cases: every entry by tensor Gauss–Hermite / Monte Carlo */
    int force_mc;       /* generic groups always by Monte Carlo */
    size_t mc_samples;  /* 0: default (65536) */
    uint64_t mc_seed;   /* Monte Carlo stream seed */
    int max_gh_dim;     /* 0: default 4 */
    double orthant_abs_tol; /* orthant back-end (limit_orthant.c) target standard errors, */
    double orthant_rel_tol; /* absolute or relative; 0: its defaults                      */
    size_t orthant_max_points; /* QMC points per shift before giving up (0: its default) */
    const tpk_progress *progress; /* reports and cancel flag (tpk_netsor_kernel_progress), or NULL */
    int unrolled;       /* evaluate the unrolled form even when the rolled one exists */
    int no_joint;       /* no joint sampler: every high-dimensional group sampled alone */
    size_t joint_max_bytes; /* the joint sampler's cache of factor values (0: its default) */
    int plan;           /* rolled evaluator's entrywise plans: NSR_PLAN_NAIVE or _OPTIMAL;
                         * 0: TPK_PLAN from the environment (default optimal) */
    FILE *plan_report;  /* every entrywise plan, its kernels and times (netsor plan), or NULL */
    int plan_verify;    /* every entrywise plan's candidates verified exactly first (§7.2) */
    int plan_signatures;/* the report gives each kernel's signature (§7.3); 2: every candidate's too */
    const tpk_netsor_ew_provider *ew_provider; /* emitted kernels (§7.3), or NULL */
} tpk_limit_opts;

/* The rolled evaluator (netsor/flimit.c). plan: the data-independent pass (support, liveness,
 * kept in p->rolled for the evaluations); *deferred = 1 when it would visit more than budget
 * points (0: no limit) and was left to the first evaluation. *unsupported = 1 when
 * the failure is a form the rolled evaluator does not take (the unrolled one may). */
int nsr_flimit_plan(tpk_program *p, long budget, tpk_ctx *ctx, int *unsupported, int *deferred);
/* Why a program kept only rolled has no limit kernel here (TPK_EUNSUPPORTED). */
int nsr_flimit_refusal(const tpk_program *p, tpk_ctx *ctx);
/* Only the outputs of a rolled-only program (names, variances), without planning. */
int nsr_flimit_outputs(tpk_program *p, tpk_ctx *ctx);
int nsr_flimit_kernel(const tpk_program *p, const tpk_array *x, int all_outputs, tpk_array **K,
                      double *err, int *unsupported, const tpk_limit_opts *opts, tpk_ctx *ctx);
/* The finite-width executor on the rolled form (netsor/fexec.c): tpk_netsor_run's contract.
 * *unsupported = 1 when the failure is a form it does not take (the unrolled one may). */
int nsr_fexec_run(const tpk_program *p, const tpk_array *x, size_t n, uint64_t seed,
                  int all_outputs, tpk_array **Khat, tpk_array **y, int *unsupported,
                  const tpk_progress *progress, tpk_ctx *ctx);
/* The form that computes a program's result (netsor/form.c): the rolled one first where the
 * program has one (has_rolled) and the unrolled form is not forced, its result standing unless it
 * refused the program (*unsup: a form it does not take) and an unrolled form exists. run(arg,
 * &unsup, ctx) runs the rolled back end in a fresh context. Returns 1 with *st where the rolled
 * result stands (its error in ctx), 0 where the unrolled form runs (TPK_NETSOR_TRACE=1 prints
 * why, as "who: reason"). */
typedef int (*nsr_rolled_run)(void *arg, int *unsup, tpk_ctx *ctx);
int nsr_form_rolled_first(const tpk_program *p, int has_rolled, int force_unrolled,
                          const char *who, nsr_rolled_run run, void *arg, int *st, tpk_ctx *ctx);
/* TPK_NETSOR_FORM=unrolled: the unrolled form even where the rolled one serves (comparisons and
 * benchmarks of the two; docs/netsor.md). */
int nsr_form_unrolled_env(void);
/* Clear PSD violation of a kernel (n ≤ 600; larger kernels are not checked). */
int nsr_check_psd(const double *K, size_t n, double err, tpk_ctx *ctx);

int tpk_netsor_kernel_ex(const tpk_program *p, const tpk_array *x, int all_outputs,
                         const tpk_limit_opts *opts, tpk_array **K, double *err, tpk_ctx *ctx);

#endif

/* ---- Hand-built IR (tests, and callers without the DSL front end) ---------------------------
 * Each adder returns the new id, or -1 when out of memory / given bad arguments. Functions
 * (tpk_phi) referenced from bodies stay owned by the caller; free with tpk_nsr_prog_free. A
 * hand-built program allocates from the default allocator (tpk/alloc.h: NULL context). */
tpk_program *tpk_nsr_prog_new(int nslots);
void tpk_nsr_prog_free(tpk_program *p);
int tpk_nsr_add_avar(tpk_program *p, const char *name, double var);
int tpk_nsr_add_embed(tpk_program *p, const char *name, double var);
int tpk_nsr_embed(tpk_program *p, const char *out, int embed, int slot);
int tpk_nsr_bias(tpk_program *p, const char *out, double mean, double var);
int tpk_nsr_matmul(tpk_program *p, const char *out, int avar, int src);
int tpk_nsr_lincomb(tpk_program *p, const char *out, int nterms, const int *term,
                    const double *coef);
int tpk_nsr_nonlin(tpk_program *p, const char *out, const tpk_rpn_node *node, int len);
int tpk_nsr_moment(tpk_program *p, const char *out, const tpk_rpn_node *node, int len);
int tpk_nsr_output(tpk_program *p, const char *name, int src, double var);
