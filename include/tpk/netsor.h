/* NETSOR programs: the elaborated straight-line IR, and the pipeline
 * lex → parse → check → elaborate → {limit evaluator, finite-width executor} (theory.md §1, §6). */
#ifndef TPK_NETSOR_H
#define TPK_NETSOR_H

#include <stdint.h>
#include <stdio.h>

#include "array.h"
#include "gauss.h"
#include "ntk.h"
#include "progress.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Elaborated program (all index families unrolled, all H-vars inlined) ------------------- */

enum tpk_vtype { TPK_VAR_G, TPK_VAR_H, TPK_VAR_SCALAR };

/* Body of a Nonlin or Moment after inlining, in postfix (RPN) form. Leaves are G-vars,
 * scalars (NETSOR+ Moments) and constants, so the same code evaluates it at one quadrature
 * point or over all n coordinates of a finite-width run. */
enum tpk_rpn_op {
    TPK_RPN_CONST,  /* push value */
    TPK_RPN_GVAR,   /* push G-var `var` */
    TPK_RPN_SCALAR, /* push scalar variable `var` */
    TPK_RPN_ADD, TPK_RPN_SUB, TPK_RPN_MUL, TPK_RPN_DIV, /* pop b, pop a, push a∘b */
    TPK_RPN_NEG,
    TPK_RPN_POWI,   /* pop a, push a^(int)value */
    TPK_RPN_CALL    /* pop a, push fn(a) */
};
typedef struct tpk_rpn_node {
    int op;
    int var;             /* GVAR / SCALAR: variable id */
    double value;        /* CONST value; POWI exponent */
    const tpk_phi *fn;   /* CALL: owned by the program */
} tpk_rpn_node;
typedef struct tpk_rpn {
    int len;
    tpk_rpn_node *node;
    int nargs;           /* distinct G-vars the body reads, ascending ids */
    int *args;
} tpk_rpn;

enum tpk_op {
    TPK_OP_EMBED,   /* initial G-var  out = U·x[slot],  U_αj ~ N(0, var/d)          (theory §1.2) */
    TPK_OP_BIAS,    /* initial G-var  out_α ~ iid N(mean, var), shared by all inputs            */
    TPK_OP_MATMUL,  /* out = A·src, A an A-var (entries N(0, var/n)), src an H- or G-var    */
    TPK_OP_LINCOMB, /* out = Σ coef[i]·term[i] over G-vars                                  */
    TPK_OP_NONLIN,  /* out (H) = body(G-vars; scalars)                                     */
    TPK_OP_MOMENT   /* out (scalar) = (1/n) Σ_α body(G-vars_α; scalars)   NETSOR+ (§1.9)    */
};

typedef struct tpk_instr {
    int op;
    int out;            /* variable id written */
    int avar;           /* MATMUL: A-var id; EMBED: embedding-matrix id (its own family) */
    int src;            /* MATMUL: source var id; EMBED: input slot (0-based time/position) */
    double mean, var;   /* BIAS: N(mean, var); EMBED: var (σ_U²) */
    int nterms;         /* LINCOMB */
    int *term;
    double *coef;
    tpk_rpn body;       /* NONLIN, MOMENT */
    int line, col;      /* source position, for run-time diagnostics */
    int bnorm;          /* NONLIN: 1 = batch-coupled φ(bn(g)): the body (one G-var g, optionally
                         * under one CALL) reads g normalised across each batch of inputs,
                         * BN(g)_b = √B (Gg)_b/‖Gg‖ (theory §2.5; include/tpk/batchnorm.h) */
    int batch;          /* bnorm: inputs per batch (consecutive), 0 = all inputs */
    double bn_eps;      /* bnorm: ε ≥ 0 added to the batch variance (include/tpk/batchnorm.h) */
} tpk_instr;

typedef struct tpk_var {
    char *name;         /* as unrolled: "h[3]" */
    int type;           /* enum tpk_vtype */
    int width;          /* width-symbol id (G/H) */
    int def;            /* index of the defining instruction */
} tpk_var;

typedef struct tpk_avar {
    char *name;
    double var;         /* σ²: entries N(0, σ²/fan_in) */
    int rows, cols;     /* width-symbol ids */
} tpk_avar;

typedef struct tpk_embed {
    char *name;         /* U: one family of initial G-vars */
    double var;
    int rows;           /* width-symbol id; cols = input dimension d */
} tpk_embed;

typedef struct tpk_output {
    char *name;         /* "y" or "y[5]" */
    int src;            /* H- or G-var read out (the first part of a concatenation) */
    double var;         /* σ_v²; one readout vector v shared by the outputs of one readout (§1.5) */
    double bias_var;    /* variance of a scalar readout bias β shared likewise (default 0):
                         * y = ⟨v, h⟩/√n + β adds bias_var to every kernel entry */
    int nparts;         /* readout(concat(h1, ..., hm), ...): m ≥ 2 parts, y = ⟨v, [h1; ...; hm]⟩/√(mn);
                         * 0 or 1: one vector, src */
    int *part;          /* the m parts' vars (part[0] = src) when nparts ≥ 2, else NULL */
    char *readout;      /* readout[u](...): the name of its own readout vector and bias; outputs with
                         * different ones are independent (kernel 0). NULL: the shared default */
} tpk_output;

typedef struct tpk_program {
    char *path;
    int nwidths;
    char **width_name;  /* width symbols, e.g. "n" */
    int nvars;
    tpk_var *var;
    int navars;
    tpk_avar *avar;
    int nembeds;
    tpk_embed *embed;
    int ninstr;
    tpk_instr *instr;
    int nslots;         /* input slots per example: 1 for vectors, T for sequences */
    int noutputs;
    tpk_output *output;
    unsigned features;  /* TPK_FEAT_* */
    tpk_phi **phis;     /* functions the program instantiated (owned) */
    int nphis;
    int nparams;        /* final parameter values after --set, for output attributes */
    char **param_name;
    char **param_value; /* "%.17g" for numbers, the function spec for functions */
    int *param_integer; /* 1: declared by integer arithmetic (param L = 3: counts, indices,
                         * 0/1 switches; docs/netsor.md), so outputs store it as an integer */
    struct nsr_rolled *rolled; /* the rolled form (family instructions, issue 14), or NULL; when
                                * the unrolled form would be too large, ninstr = 0 and only the
                                * rolled form exists (the limit evaluator takes it) */
    tpk_allocator alloc; /* the load's (tpk/alloc.h): tpk_program_free gives everything back to
                          * it */
} tpk_program;

enum tpk_feature {
    TPK_FEAT_NETSOR_PLUS = 1u << 0,   /* uses Moments / parametrised Nonlins */
    TPK_FEAT_SQRT_N_LOGITS = 1u << 1, /* 1/sqrt(n) inner products: non-Gaussian limit (§5) */
    TPK_FEAT_BATCHNORM = 1u << 2      /* a batch-coupled Nonlin: outputs depend on other inputs */
};

/* ---- Front end ------------------------------------------------------------------------------ */

/* `--set name=value` overrides of program parameters. */
typedef struct tpk_param_set {
    const char *name;
    const char *value;
} tpk_param_set;

typedef struct tpk_netsor_opts {
    const tpk_param_set *sets;
    int nsets;
    int netsor_plus;   /* allow Moments (else a type error that says so) */
    int explain;       /* report inferred shape holes to `diag` */
    FILE *diag;        /* where `--explain` notes and warnings go (NULL: none) */
    const char *append; /* tpk_netsor_load_file: source read after the file's, on new lines
                         * (e.g. one more output statement); NULL: none */
    int plan_when_used; /* 1: a program kept only rolled is planned by its first evaluation,
                         * not at load (for callers that evaluate at once: one plan, not two;
                         * errors of the plan then come from the evaluation) */
    int no_limit;       /* 1: the caller evaluates no limit kernel of this program (it reads the
                         * parameters, runs its own recursion or the finite-width executor):
                         * the load keeps the rolled form only and skips the limit back end's
                         * support check and plan, which cost O(members) (a deep CNN on 28×28
                         * images: milliseconds); a limit evaluation that comes anyway plans the
                         * rolled form then, without the member-level fallback */
    int verify_ir;      /* 1: run the family IR's verifier after lowering (also when the
                         * environment has TPK_VERIFY_IR=1); a violation is TPK_EINVAL naming the
                         * node */
} tpk_netsor_opts;

/* Parse, check and elaborate a program file or string. Errors: TPK_ESYNTAX / TPK_ETYPE with the
 * message "file:line:col: message" in ctx. reg names the functions a program may call (relu,
 * erf, ..., and the caller's own: tpk_phi_register); NULL is a registry with none, so a
 * program that calls any function is TPK_ETYPE "unknown function 'erf': the function registry
 * is NULL ...": pass tpk_phi_registry_alloc's (the built-ins) or tpk_job_registry's (the
 * built-ins and sqrt, which the layernorm programs use). */
TPK_API tpk_program *tpk_netsor_load_file(const char *path, const tpk_netsor_opts *opts,
                                          const tpk_phi_registry *reg, tpk_ctx *ctx);
TPK_API tpk_program *tpk_netsor_load_string(const char *name, const char *src,
                                            const tpk_netsor_opts *opts,
                                            const tpk_phi_registry *reg, tpk_ctx *ctx);
TPK_API void tpk_program_free(tpk_program *p);
/* A final parameter value (after --set) as text, or NULL if the program has no such parameter. */
TPK_API const char *tpk_program_param(const tpk_program *p, const char *name);
/* The same as a finite number; TPK_EINVAL naming the program and parameter otherwise. */
TPK_API int tpk_program_param_number(const tpk_program *p, const char *name, double *v,
                                     tpk_ctx *ctx);
/* The IR as text. Its scratch strings come from the program's allocator (p->alloc); without
 * memory a body prints as "<out of memory>". */
TPK_API void tpk_program_dump(const tpk_program *p, FILE *f);
/* The family IR of the rolled form as text (docs/architecture.md "The family IR"): per family
 * instruction its domain and its instructions (MATMUL with the weight it multiplies and its site,
 * MAP, LIN, MOMENT, ...), then the weights and the sites that use them (tied weights). TPK_EINVAL
 * for a program without a rolled form. */
TPK_API int tpk_program_dump_ir(const tpk_program *p, FILE *f, tpk_ctx *ctx);
/* Run the family IR's verifier: TPK_OK, or TPK_EINVAL naming the first node that breaks a rule. */
TPK_API int tpk_program_verify_ir(const tpk_program *p, tpk_ctx *ctx);
/* Family instructions of the rolled form (one per statement and layer, issue 14), 0 if none. */
TPK_API int tpk_program_family_instructions(const tpk_program *p);
/* Does the limit evaluator use the rolled form? (The finite-width executor runs the rolled form
 * wherever it exists; the limit evaluator does not take every program, docs/netsor.md.) */
TPK_API int tpk_program_limit_rolled(const tpk_program *p);

/* ---- Back ends -------------------------------------------------------------------------------- */

/* Infinite-width kernel: K[(a,o),(c,o')] = σ_v² E[Z^{out o}_a Z^{out o'}_c] for inputs a, c and
 * outputs o, o' (input-major). `x` is N×d (nslots = 1) or N×T×d. err gets the largest error
 * estimate of any entry. */
TPK_API int tpk_netsor_kernel(const tpk_program *p, const tpk_array *x, int all_outputs,
                              tpk_array **K, double *err, tpk_ctx *ctx);
/* The same, reporting progress and honouring a cancel flag (include/tpk/progress.h; NULL:
 * none, as tpk_netsor_kernel): the rolled evaluator counts its family instructions ("family
 * instructions"), the unrolled one its covariance blocks ("covariance blocks": a MatMul's
 * sub-blocks with the earlier members of its family, one for any other instruction and one for
 * the readouts), before each and once at the end; the flag is read at each and inside the long
 * loops, and stops the call with TPK_ECANCELED. Recurrent programs (GRU, LSTM) are the long
 * ones. */
TPK_API int tpk_netsor_kernel_progress(const tpk_program *p, const tpk_array *x, int all_outputs,
                                       const tpk_progress *progress, tpk_array **K, double *err,
                                       tpk_ctx *ctx);

/* The Neural Tangent Kernel of the program in the infinite-width limit (Tensor Programs II;
 * docs/theory.md §8), beside its NNGP kernel K (both as tpk_netsor_kernel lays them out):
 * Θ = Σ_W Σ_{pairs of uses} D·C + Σ_b D, computed forwards as the tangent kernel of every
 * G-var — T(Wz, Wz̄) = w_W E[z z̄] + σ_W² T(z, z̄), T(φ(g), φ̄(ḡ)) = Σ_ij E[∂_iφ ∂_jφ̄] T(g_i, ḡ_j),
 * Moments constant — at the member level (the unrolled form). `param` says what a parameter's
 * own gradient contributes (theory.md §8.7): TPK_NTK_PARAM_NTK, neural-tangents'
 * parameterization='ntk' (W = σ_W ω/√fan_in, b = σ_b β: w_W = σ_W², a bias σ_b², the readout
 * σ_v² E[h h̄] and σ_ob²), or TPK_NTK_PARAM_TP, Tensor Programs II's (gradients in W's own
 * entries times √fan_in and in b: w_W = 1, a bias 1, the readout E[h h̄] and 1). K may be NULL.
 * A φ(bn(g)) carries T(φ(bn g), φ(bn g)) = E[M T(g, g) Mᵀ] across its batch, M the Jacobian of
 * φ∘BN (theory.md §8.6; tpk_bn_tangent). Errors as tpk_netsor_kernel; TPK_EUNSUPPORTED for
 * sqrt(n)-scaled logits (outside Tensor Programs II) and for bn(...) over several batches or
 * between two different bn(...) Nonlins; TPK_EDOM for a φ without a derivative (step, sign) and
 * for a batch whose centred covariance has rank < 3 (the integrals diverge without an epsilon). */
/* (TPK_NTK_PARAM_NTK, _TP, _STANDARD: include/tpk/ntk.h) */
/* Whether tpk_netsor_ntk takes the program, without numbers (netsor check --ntk): its readouts
 * make it BP-like by construction (readout vectors are zero-mean, independent and never used
 * inside the network: Tensor Programs II's Condition 1), so what remains is every φ having a
 * derivative that is a function and no sqrt(n)-scaled logits (bn(...)'s own limits depend on the
 * inputs: one batch of all N, centred rank ≥ 3; tpk_netsor_ntk checks them). The error
 * names file:line:col. */
TPK_API int tpk_netsor_ntk_check(const tpk_program *p, tpk_ctx *ctx);
TPK_API int tpk_netsor_ntk(const tpk_program *p, const tpk_array *x, int all_outputs, int param,
                           tpk_array **K, tpk_array **Theta, double *err, tpk_ctx *ctx);
/* The NTK's options: the parameterisation; for TPK_NTK_PARAM_STANDARD (neural-tangents'
 * parameterization='standard': gradients in the weights' own entries, W ~ N(0, σ²/fan_in)) the
 * finite width n that every width symbol stands for, on which that NTK depends (each weight's
 * own term is fan_in times Tensor Programs II's: n for an A-var, d for an embedding, m·n for a
 * readout of m parts; theory.md §8.7); progress and a cancel flag as tpk_netsor_kernel_progress
 * (TPK_ECANCELED), or NULL. */
typedef struct tpk_ntk_opts {
    int param;
    size_t width;
    const tpk_progress *progress;
} tpk_ntk_opts;
TPK_API int tpk_netsor_ntk_ex(const tpk_program *p, const tpk_array *x, int all_outputs,
                              const tpk_ntk_opts *o, tpk_array **K, tpk_array **Theta,
                              double *err, tpk_ctx *ctx);

/* The empirical NTK of the program at width n with the random weights of tpk_netsor_run (same
 * seed, same network): Θ̂ = J Jᵀ over every parameter (A-vars, embeddings, biases, the readout and
 * its bias), in `param`'s parameterisation (as tpk_netsor_ntk_ex, STANDARD at the width n), by
 * one backward pass with
 * structured per-weight sums over pairs of uses (theory.md §8.9); *Khat (may be NULL) gets
 * tpk_netsor_run's K̂. Layout as tpk_netsor_kernel. Moments (LayerNorm, attention with 1/n logits)
 * are differentiated exactly, and so is bn(...), whose gradient couples the inputs of a batch
 * (theory.md §8.6). Errors as tpk_netsor_run, and TPK_EUNSUPPORTED for sqrt(n)-scaled logits. */
TPK_API int tpk_netsor_run_ntk(const tpk_program *p, const tpk_array *x, size_t n, uint64_t seed,
                               int all_outputs, int param, tpk_array **Khat, tpk_array **That,
                               tpk_ctx *ctx);

/* Training one finite network (issue 36; theory.md §8.10): tpk_netsor_run's network of `seed` at
 * `width`, in neural-tangents' 'ntk' parameterisation (every trained scalar a standard normal),
 * trained by full-batch gradient descent θ ← θ − lr ∂L/∂θ on L = (1/2N)‖f(X_train) − Y‖², N the
 * number of targets, with the gradients of the empirical NTK's backward pass (tied weights and
 * Moments exact). The outputs at every input are recorded at the steps at[0..nat) (ascending;
 * 0 is the untrained network). */
typedef struct tpk_train_opts {
    size_t width;
    uint64_t seed;
    double lr;
    const size_t *at;
    size_t nat;
    int all_outputs;              /* every readout (labels then have one column per output) */
    const tpk_progress *progress; /* "steps" reports and a cancel flag, or NULL */
} tpk_train_opts;
/* x: every input, the first ntrain the training set (the rest: test inputs, outputs only);
 * y: ntrain × O targets (or ntrain when O = 1); f (preallocated): nat × N × O outputs; loss (may
 * be NULL): nat training losses. Errors: TPK_EINVAL (shapes, options), TPK_EDOM (non-finite
 * targets), TPK_EUNSUPPORTED (bn(...), whose batch statistics would mix the training and test
 * inputs; sqrt(n)-scaled logits; no unrolled form), TPK_ENUMERIC (a diverging run),
 * TPK_ECANCELED, TPK_ENOMEM. */
TPK_API int tpk_netsor_train(const tpk_program *p, const tpk_array *x, size_t ntrain,
                             const tpk_array *y, const tpk_train_opts *o, tpk_array *f,
                             double *loss, tpk_ctx *ctx);

/* The rolled evaluator's entrywise plans (docs/orchestration.md §7): between reads that need a
 * whole matrix, the maps and sums of a recursion run as fused kernels chosen by a binary linear
 * program (TPK_PLAN_OPTIMAL, the default), or one kernel per primitive (TPK_PLAN_NAIVE). The
 * environment's TPK_PLAN=naive|optimal picks it for every other call. */
enum { TPK_PLAN_NAIVE = 1, TPK_PLAN_OPTIMAL = 2, TPK_PLAN_VERIFY = 16, TPK_PLAN_SIGNATURES = 32,
       TPK_PLAN_CANDIDATES = 64 };
/* tpk_netsor_kernel with plan `plan` (one of the above); report (may be NULL) gets every plan:
 * its primitives and candidates, then one line per kernel with its primitives, the values it
 * reads and writes, its predicted and measured seconds. plan | TPK_PLAN_VERIFY: before each
 * entrywise plan runs, every candidate kernel of its program runs exactly over Z_p against
 * whole-matrix loops (docs/orchestration.md §7.2; the report says how many); a difference is
 * TPK_ENUMERIC naming the kernel and the entry. plan | TPK_PLAN_SIGNATURES: the report gives
 * each kernel's signature too ("    sig: in=..."; docs/orchestration.md §7.3), the text `tptune
 * ew` emits, verifies and times it from; plan | TPK_PLAN_CANDIDATES: every candidate's too
 * ("  candidate sig: in=..."), so that `tptune ew` can time all of them for the BLP. */
TPK_API int tpk_netsor_kernel_plan(const tpk_program *p, const tpk_array *x, int all_outputs,
                                   int plan, FILE *report, tpk_array **K, double *err,
                                   tpk_ctx *ctx);
/* Emitted fused kernels for the entrywise plans (docs/orchestration.md §7.3): a provider maps a
 * kernel's signature (tpk/tune.h's grammar) to compiled code with tpk/tune.h's ABI, and may give
 * its measured time. The library compiles nothing itself; `netsor plan --emitted` provides
 * kernels emitted, verified and compiled by the tuner (libtpktune). */
typedef int (*tpk_netsor_ew_fn)(size_t n, const double *const *in, const double *const *dg,
                                double *const *out, const double *par, const double *const *w,
                                int threads);
typedef struct tpk_netsor_ew_provider {
    /* the kernel of signature sig on n×n, or NULL: the library's executor runs it */
    tpk_netsor_ew_fn (*find)(void *user, const char *sig, size_t n);
    /* its measured seconds at n (the plan's cost for that candidate), or < 0: unknown (the
     * model's); NULL: none known */
    double (*cost)(void *user, const char *sig, size_t n);
    void *user;
} tpk_netsor_ew_provider;
/* tpk_netsor_kernel_plan with a provider of emitted kernels (NULL: none). */
TPK_API int tpk_netsor_kernel_plan_with(const tpk_program *p, const tpk_array *x, int all_outputs,
                                        int plan, FILE *report,
                                        const tpk_netsor_ew_provider *provider, tpk_array **K,
                                        double *err, tpk_ctx *ctx);
/* The plan TPK_PLAN asks for (TPK_PLAN_OPTIMAL when unset or empty); TPK_EINVAL naming any other
 * value. Jobs check it before their work, also where no plan runs (a direct recursion). */
TPK_API int tpk_netsor_plan_from_env(int *plan, tpk_ctx *ctx);

/* Finite-width run at width n, seed s: empirical kernel (1/n)⟨h, h'⟩·σ_v² of the read-out
 * variables (same layout as tpk_netsor_kernel) and, if `y` is not NULL, sampled outputs
 * ⟨v, h⟩/√n (N × noutputs). Depends on (seed, variable) alone, not on the thread count. */
TPK_API int tpk_netsor_run(const tpk_program *p, const tpk_array *x, size_t n, uint64_t seed,
                           int all_outputs, tpk_array **Khat, tpk_array **y, tpk_ctx *ctx);
/* The same with progress and a cancel flag, as tpk_netsor_kernel_progress: the executors count
 * family instructions (rolled) or instructions (unrolled). */
TPK_API int tpk_netsor_run_progress(const tpk_program *p, const tpk_array *x, size_t n,
                                    uint64_t seed, int all_outputs, const tpk_progress *progress,
                                    tpk_array **Khat, tpk_array **y, tpk_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
