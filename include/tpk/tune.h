/* Tensor-program tuner (AutoTVM-style, tuner-notes.md §1, §3): workloads, knob spaces, code
 * generation, measurement, JSON-lines logs, the cost models (XGBoost, the latent world model) and
 * their search, exact verification, porting between machine classes. */
#ifndef TPK_TUNE_H
#define TPK_TUNE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "error.h"
#include "gemm.h"
#include "machine.h"
#include "map.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Workloads --------------------------------------------------------------------------- */

enum tpk_tune_target { TPK_TUNE_CPU = 0, TPK_TUNE_CUDA = 1 };
enum tpk_tune_dtype { TPK_TUNE_F64 = 0, TPK_TUNE_F32 = 1 };
/* GEMM: C(m×n) = alpha·A(m×k)·B(k×n) + beta·C. SYRK: the lower triangle of C(m×m) =
 * alpha·A·Aᵀ + beta·C (the Gram / covariance update), n = m, B = Aᵀ by strides; CPU only. */
enum tpk_tune_op { TPK_TUNE_GEMM = 0, TPK_TUNE_SYRK = 1, TPK_TUNE_MAP = 2 };
/* MAP ("relu_map", tuner/cpu_map.c): the ReLU NNGP map over the lower triangle of an N×N
 * covariance S (m = n = N, k = 1): out_ij = alpha/(2π)·√(q_i q_j)(sin θ + (π − θ) cos θ) + beta,
 * cos θ = S_ij/√(q_i q_j), q = diag S; CPU only. Its "gflops" are giga-entries per second. */

/* One workload of an op and dtype on a target with a thread count. */
typedef struct tpk_tune_task {
    int target;  /* enum tpk_tune_target */
    int dtype;   /* enum tpk_tune_dtype */
    size_t m, n, k;
    int threads; /* CPU OpenMP threads; ignored for CUDA */
    int op;      /* enum tpk_tune_op */
} tpk_tune_task;

TPK_API const char *tpk_tune_dtype_name(int dtype);   /* "f64" / "f32" */
TPK_API const char *tpk_tune_target_name(int target); /* "cpu" / "cuda" */
TPK_API const char *tpk_tune_op_name(int op);         /* "gemm" / "syrk" */
/* Target class string written into logs, e.g. "cpu/x86_64/avx512/intel" or "cuda/sm_90". */
TPK_API const char *tpk_tune_target_class(int target);
TPK_API double tpk_tune_task_flops(const tpk_tune_task *t);
/* 1 when a and b are the same workload (target, op, dtype, m, n, k, threads). */
TPK_API int tpk_tune_task_same(const tpk_tune_task *a, const tpk_tune_task *b);

/* ---- Schedule space: a table of knobs, a validity filter, a mixed-radix index -------------- */

#define TPK_TUNE_MAX_KNOBS 16
#define TPK_TUNE_MAX_CANDS 16

typedef struct tpk_tune_knob {
    const char *name;
    int ncand;
    int cand[TPK_TUNE_MAX_CANDS];
    const char *const *labels; /* names of categorical candidates (loop order, ...) or NULL */
} tpk_tune_knob;

typedef struct tpk_tune_space tpk_tune_space;
/* Knob values of one configuration, in the order of the space's knob table. */
typedef struct tpk_tune_config {
    int v[TPK_TUNE_MAX_KNOBS];
} tpk_tune_config;

struct tpk_tune_space {
    tpk_tune_task task;
    tpk_machine machine;       /* the class tuned or generated for: caches, vector width, registers */
    const char *template_name; /* "cpu_gemm" / "cpu_syrk" / "cuda_gemm" */
    int nknob;
    tpk_tune_knob knob[TPK_TUNE_MAX_KNOBS];
    uint64_t size; /* product of candidate counts, valid or not */
    /* Cross-knob constraints (AutoTVM's multi_filter); NULL means every point is valid. */
    int (*valid)(const tpk_tune_space *s, const tpk_tune_config *c);
    /* Features of a configuration for the cost model; returns the count written (≤ cap). */
    int (*features)(const tpk_tune_space *s, const tpk_tune_config *c, float *out, int cap);
};

#define TPK_TUNE_MAX_FEATURES 64

/* The space of the template that serves `task` (cpu_gemm for CPU, cuda_gemm for CUDA), on this
 * host (tpk_machine_host), or on machine class m (gen/: the class's data file, never the host). */
TPK_API int tpk_tune_space_init(tpk_tune_space *s, const tpk_tune_task *task, tpk_ctx *ctx);
TPK_API int tpk_tune_space_init_on(tpk_tune_space *s, const tpk_tune_task *task,
                                   const tpk_machine *m, tpk_ctx *ctx);

/* A machine class as the tuner reads it from data/machines/ID.conf ("key value" lines, '#'
 * comments: name, isa avx2|avx512, vector_bits, registers, l1, l2, l3 in bytes, cflags). The
 * strings live in the struct; m's pointers point into it. */
typedef struct tpk_tune_class {
    tpk_machine m;
    char name[64], id[64], cflags[256];
} tpk_tune_class;
TPK_API int tpk_tune_class_read(const char *path, tpk_tune_class *c, tpk_ctx *ctx);
/* Mixed-radix index ↔ knob values (AutoTVM point2knob / knob2point). */
TPK_API void tpk_tune_space_point(const tpk_tune_space *s, uint64_t index, tpk_tune_config *c);
TPK_API uint64_t tpk_tune_space_index(const tpk_tune_space *s, const tpk_tune_config *c);
TPK_API int tpk_tune_space_valid(const tpk_tune_space *s, const tpk_tune_config *c);
/* Value of a knob by name in a configuration, or `dflt` when the space has no such knob. */
TPK_API int tpk_tune_config_get(const tpk_tune_space *s, const tpk_tune_config *c,
                                const char *name, int dflt);
/* Set a knob by name to a value; TPK_ENOTFOUND if the knob or value is not in the table. */
TPK_API int tpk_tune_config_set(const tpk_tune_space *s, tpk_tune_config *c, const char *name,
                                int value);
/* Set knobs from "mr=8,nv=3,order=ir_jr" (values, or the labels of categorical knobs) on top of c;
 * TPK_EINVAL names the first pair outside the table. */
TPK_API int tpk_tune_config_parse(const tpk_tune_space *s, tpk_tune_config *c, const char *knobs, tpk_ctx *ctx);
/* A uniformly drawn valid configuration index (rejection sampling); state is a 64-bit seed. */
TPK_API uint64_t tpk_tune_space_random(const tpk_tune_space *s, uint64_t *rng);
/* Analytic default (tuner-notes §3 lookup step 3): kc from L1, mc from L2, nc from L3. */
TPK_API void tpk_tune_space_default(const tpk_tune_space *s, tpk_tune_config *c);
/* "mr=8,nv=3,..." into buf; returns buf. */
TPK_API char *tpk_tune_config_str(const tpk_tune_space *s, const tpk_tune_config *c, char *buf,
                                  size_t cap);

/* ---- Code generation ---------------------------------------------------------------------- */

/* Emit readable source (C for CPU, CUDA for CUDA) defining the kernel `fname` for this
 * configuration. `standalone` adds the prelude (includes, vector types) and, for CPU, the
 * exported entry points tpk_kernel / tpk_kernel_ws that the measurer loads. */
TPK_API int tpk_tune_emit(const tpk_tune_space *s, const tpk_tune_config *c, const char *fname,
                          int standalone, FILE *out, tpk_ctx *ctx);
/* The shared prelude of a file holding several CPU kernels (gen/). */
TPK_API void tpk_tune_emit_cpu_prelude(FILE *out);

/* Kernel entry-point types and the reference kernels: tpk/gemm.h and tpk/map.h (runtime). */

/* ---- Measurement -------------------------------------------------------------------------- */

enum tpk_tune_err {
    TPK_TUNE_OK = 0,
    TPK_TUNE_ECOMPILE = 1, /* compiler failed or timed out */
    TPK_TUNE_ELOAD = 2,    /* dlopen / symbol lookup failed */
    TPK_TUNE_EWRONG = 3,   /* result differs from the reference */
    TPK_TUNE_ECRASH = 4,   /* child died or timed out */
    TPK_TUNE_ENODEV = 5,   /* target hardware absent (CUDA without a GPU) */
    TPK_TUNE_EINVALID = 6  /* configuration violates the space's constraints */
};

#define TPK_TUNE_MAX_REPEAT 16

typedef struct tpk_tune_result {
    int err;           /* enum tpk_tune_err */
    double gflops;     /* flops / median cost; 0 on error */
    int ncost;
    double costs_s[TPK_TUNE_MAX_REPEAT]; /* seconds per call, one per repeat */
    double compile_s;
    double cpu_ratio;  /* process CPU time / (wall × threads) while timing; < 1 means stolen */
    int redone;        /* times the measurement was redone because it looked disturbed */
    double load1;      /* /proc/loadavg at the end */
    double max_rel_err;/* verification error, relative to |A||B| */
    double vendor_gflops; /* the vendor library on the same shape when measured (cuBLAS), else 0 */
} tpk_tune_result;

typedef struct tpk_tune_measure_opts {
    int repeat;          /* timed repeats (median reported); default 5 */
    double min_repeat_ms;/* grow calls per repeat until one repeat lasts this long; default 50 */
    double timeout_s;    /* compile and run limit each; default 60 */
    int max_redo;        /* redo a disturbed measurement this many times; default 2 */
    double min_cpu_ratio;/* below this the run counts as disturbed; default 0.85 */
    const char *workdir; /* scratch directory; default a fresh mkdtemp under $TMPDIR */
    const char *cc;      /* compiler; default "gcc" */
    int keep;            /* keep generated sources and objects */
    int verbose;
    /* Program that runs a candidate (`RUNNER __measure ...`, see tpk_tune_child_main): a fresh
     * exec'd process, because libgomp cannot run parallel regions in a child forked from a
     * process whose OpenMP pool exists. Default: $TPK_TUNE_RUNNER, else $TPK_BIN/tptune, else
     * a plain fork of this process. */
    const char *runner;
    int vendor;          /* also time OpenBLAS on the same data (result.vendor_gflops) */
} tpk_tune_measure_opts;

TPK_API void tpk_tune_measure_opts_default(tpk_tune_measure_opts *o);
/* Generate, compile, load in a forked child, verify against the reference, and time one
 * configuration. A failed candidate is a result (res->err), not a status: the status is
 * non-zero only when the measurement itself could not be set up (no temp dir, no fork). */
TPK_API int tpk_tune_measure(const tpk_tune_space *s, const tpk_tune_config *c,
                             const tpk_tune_measure_opts *o, tpk_tune_result *res, tpk_ctx *ctx);
/* The measuring child: argv = {prog, "__measure", so, dtype, m, n, k, threads, repeat,
 * min_repeat_ms, ms, ns, ks[, vendor]}. Prints one "TPKRESULT ..." line; returns the exit status. */
TPK_API int tpk_tune_child_main(int argc, char **argv);
/* Compile a kernel source file into a shared object (used by tests). */
TPK_API int tpk_tune_compile_cpu(const char *src, const char *so, const char *cc, double timeout_s,
                                 double *seconds, tpk_ctx *ctx);
/* Keep libgomp resident so that unloading an OpenMP kernel cannot unmap it under live threads
 * (tuner-notes §3 "Pitfall"). Idempotent. */
TPK_API void tpk_tune_pin_openmp(void);

/* ---- Logs: one JSON line per measurement --------------------------------------------------- */

typedef struct tpk_tune_record {
    char target_class[64];
    char template_name[32];
    tpk_tune_task task;
    int nknob;
    char knob_name[TPK_TUNE_MAX_KNOBS][16];
    int knob_val[TPK_TUNE_MAX_KNOBS];
    tpk_tune_result result;
    double ts; /* unix time */
} tpk_tune_record;

/* Finds a machine class by name (tpk_machine_find; NULL: unknown). */
typedef const tpk_machine *(*tpk_tune_class_fn)(const char *name);

/* The space of a record's workload on the machine class it was measured on (its target_class,
 * looked up by find, which may be NULL), or on this host when the class is unknown: the
 * configurations of a log from another machine (replay tables, transfer histories) are read in
 * their own space. (The tuner cannot look classes up itself: gen/ holds them, and generating gen/
 * must not need it.) */
TPK_API int tpk_tune_space_init_record(tpk_tune_space *s, const tpk_tune_record *r,
                                       tpk_tune_class_fn find, tpk_ctx *ctx);

/* A measurement's rate for ranking: the rate of its fastest repeat (other processes only slow a
 * run down; scaling by the CPU share instead ranked disturbed runs first); 0 on error. */
TPK_API double tpk_tune_result_label(const tpk_tune_result *r);
/* The label relative to OpenBLAS timed in the same child, times `vref` (a vendor rate fixed for
 * the comparison, so the unit stays GFLOP/s): label · vref / vendor_gflops. The machine's speed
 * drifts between children and moves both rates alike (tuner/README.md "Search efficiency").
 * The plain label when there is no vendor rate or vref ≤ 0; 0 on error. */
TPK_API double tpk_tune_result_label_relative(const tpk_tune_result *r, double vref);
/* 1 when the record was measured without competing load: load average at most its threads + 1
 * (or not recorded). Transfer learns only from these: labels measured under load rank
 * configurations badly (Spearman 0.49-0.62 against an idle re-measurement, tuner/README.md). */
TPK_API int tpk_tune_record_unloaded(const tpk_tune_record *r);
TPK_API void tpk_tune_record_fill(tpk_tune_record *r, const tpk_tune_space *s,
                                  const tpk_tune_config *c, const tpk_tune_result *res);
TPK_API int tpk_tune_log_write(FILE *f, const tpk_tune_record *r, tpk_ctx *ctx);
/* Read every record of a log; unparsable lines are an error with the line number. */
TPK_API int tpk_tune_log_read(const char *path, tpk_tune_record **recs, size_t *n, tpk_ctx *ctx);
/* The configuration a record names, in space s (same template); TPK_ENOTFOUND if a value is
 * outside the space's table. */
TPK_API int tpk_tune_record_config(const tpk_tune_space *s, const tpk_tune_record *r,
                                   tpk_tune_config *c, tpk_ctx *ctx);
/* Human-readable table: per workload, count, best GFLOP/s and its knobs. */
TPK_API int tpk_tune_log_show(const tpk_tune_record *recs, size_t n, FILE *out);

/* ---- Cost model --------------------------------------------------------------------------- */

enum tpk_tune_model_kind {
    TPK_TUNE_MODEL_RANDOM = 0, /* no model: random search */
    TPK_TUNE_MODEL_XGB_RANK,   /* XGBoost rank:pairwise (AutoTVM "rank") */
    TPK_TUNE_MODEL_XGB_REG,    /* XGBoost reg:squarederror on y / y_max (AutoTVM "reg") */
    TPK_TUNE_MODEL_LATENT,     /* the latent world model (tpk_tune_latent, below; issue 21) */
    TPK_TUNE_MODEL_XGB_LATENT  /* XGBoost-rank and the latent model, standardised scores averaged */
};

typedef struct tpk_tune_model tpk_tune_model;

TPK_API tpk_tune_model *tpk_tune_model_alloc(int kind, int nfeat, int rounds, int seed,
                                             tpk_ctx *ctx);
TPK_API void tpk_tune_model_free(tpk_tune_model *m);
/* Fit on n rows of features X (n×nfeat, row-major), labels y (GFLOP/s; 0 for failures), and
 * group sizes (rows of one workload are contiguous; ngroup groups). base_margin: per-row
 * prior (transfer) or NULL. */
TPK_API int tpk_tune_model_fit(tpk_tune_model *m, const float *X, const float *y, size_t n,
                               const unsigned *group, size_t ngroup, const float *base_margin,
                               tpk_ctx *ctx);
TPK_API int tpk_tune_model_predict(const tpk_tune_model *m, const float *X, size_t n,
                                   const float *base_margin, float *out, tpk_ctx *ctx);
TPK_API int tpk_tune_model_trained(const tpk_tune_model *m);
/* Override one XGBoost parameter of later fits (e.g. "max_depth", "4"); an unknown name or
 * value fails at the next fit. */
TPK_API int tpk_tune_model_set(tpk_tune_model *m, const char *name, const char *value, tpk_ctx *ctx);

/* ---- Latent cost model: a compiler world model (issue 21; tuner/latent.c) ------------------- */

/* A configuration is the emitter's action sequence: one action per knob of its space, in the
 * order of the template's knob table (vector width, register tile, splits, unroll, loop order,
 * parallel loop, prefetch, packing). An encoder maps the task (shape, dtype, threads, op) and the
 * machine class (caches, registers, vector width) to a latent state h0; each action updates it by
 * a residual transition h <- h + W2 tanh(W1 h + A0[k] + u A1[k] + u^2 A2[k]) + b2 (k the knob, u
 * its value scaled to [-1, 1]); a ranking head scores the final state with the action values and
 * the task/machine features. Trained with a pairwise logistic rank loss (within each group) plus
 * an auxiliary loss: a linear decoder of every state predicts the template's analytic features
 * (s->features: footprints against the caches, arithmetic intensity, register use, ...), each
 * from the first state whose actions determine it, on labelled and unlabelled configurations
 * alike; Adam on the whole batch, initialised from the seed, warm-started by later fits. */
typedef struct tpk_tune_latent tpk_tune_latent;

typedef struct tpk_tune_latent_opts {
    int hidden;        /* latent state width; default 16 */
    int trans_hidden;  /* width of the transition MLP; default 32 */
    int head_hidden;   /* width of the ranking head; default 16 */
    int epochs;        /* Adam steps of the first fit; default 300 */
    int refit_epochs;  /* Adam steps of each later fit, from the previous parameters; default 100 */
    double lr;         /* Adam step size; default 0.01 */
    double aux_weight; /* weight of the auxiliary feature loss; default 1 */
    double l2;         /* weight decay on every parameter; default 1e-4 */
    int pair_weight;   /* 1: pairs weighted by their label gap over the group's best; default 0 */
    uint64_t seed;     /* initial parameters */
} tpk_tune_latent_opts;

/* One configuration of a space (the space outlives the call). */
typedef struct tpk_tune_latent_row {
    const tpk_tune_space *s;
    tpk_tune_config c;
} tpk_tune_latent_row;

TPK_API void tpk_tune_latent_opts_default(tpk_tune_latent_opts *o);
/* nfeat: the feature count of the template's spaces (the auxiliary targets), 1..64. */
TPK_API tpk_tune_latent *tpk_tune_latent_alloc(const tpk_tune_latent_opts *o, int nfeat, tpk_ctx *ctx);
TPK_API void tpk_tune_latent_free(tpk_tune_latent *m);
/* Fit on n labelled rows (labels y, larger is better; 0 for failures) in ngroup contiguous groups
 * (pairs are formed within a group; group NULL: one group) and nunlab unlabelled rows (the
 * auxiliary loss only). The first fit fixes the standardisation of the auxiliary targets. */
TPK_API int tpk_tune_latent_fit(tpk_tune_latent *m, const tpk_tune_latent_row *rows, const double *y, size_t n,
                                const unsigned *group, size_t ngroup, const tpk_tune_latent_row *unlab,
                                size_t nunlab, tpk_ctx *ctx);
/* Scores of n rows (larger: predicted faster). */
TPK_API int tpk_tune_latent_predict(tpk_tune_latent *m, const tpk_tune_latent_row *rows, size_t n, float *out,
                                    tpk_ctx *ctx);
TPK_API int tpk_tune_latent_trained(const tpk_tune_latent *m);
/* The parameter vector (mutable; *n its length) and the training loss at the current parameters
 * with its gradient (grad may be NULL), for tests and diagnostics. */
TPK_API double *tpk_tune_latent_params(tpk_tune_latent *m, size_t *n);
TPK_API int tpk_tune_latent_loss(tpk_tune_latent *m, const tpk_tune_latent_row *rows, const double *y, size_t n,
                                 const unsigned *group, size_t ngroup, const tpk_tune_latent_row *unlab,
                                 size_t nunlab, double *loss, double *grad, tpk_ctx *ctx);
/* Persistence: a text file of the sizes, the target standardisation and the parameters. */
TPK_API int tpk_tune_latent_save(const tpk_tune_latent *m, const char *path, tpk_ctx *ctx);
TPK_API tpk_tune_latent *tpk_tune_latent_load(const char *path, tpk_ctx *ctx);

/* Kendall's tau-b of two score vectors (ties in either count for neither pair class). */
TPK_API double tpk_tune_kendall_tau(const double *a, const double *b, size_t n);

/* ---- Search ------------------------------------------------------------------------------- */

/* How the tuner obtains a measurement: the real measurer, a synthetic objective, or a table. */
typedef int (*tpk_tune_measure_cb)(void *user, const tpk_tune_space *s, const tpk_tune_config *c,
                                   tpk_tune_result *res, tpk_ctx *ctx);
typedef void (*tpk_tune_progress_cb)(void *user, int batch, int trials, double best_gflops,
                                     const char *best_knobs, const tpk_tune_result *last);

typedef struct tpk_tune_opts {
    int trials;       /* measurements in all */
    int plan_size;    /* measurements per batch (refit after each); default 16 */
    double eps;       /* fraction of each batch drawn at random; default 0.05 */
    int model;        /* enum tpk_tune_model_kind; default XGB_RANK */
    int rounds;       /* boosting rounds per fit; default 80 */
    uint64_t seed;
    int sa_chains;    /* simulated annealing chains; default 128 */
    int sa_steps;     /* maximum steps; default 500 */
    int sa_patience;  /* stop after this many steps without a change in the top-k; default 50 */
    /* Restrict the search to these configuration indices (replaying a recorded table): the
     * model then ranks the whole table instead of annealing. NULL: the whole space. */
    const uint64_t *universe;
    size_t nuniverse;
    /* Transfer: records of other workloads of the same template (earlier logs). */
    const tpk_tune_record *history;
    size_t nhistory;
    tpk_tune_class_fn history_class; /* the history records' machine classes (NULL: the host) */
    /* Stop early once best ≥ stop_at_gflops (> 0); used by replay experiments. */
    double stop_at_gflops;
    /* Early batches: the first batch has plan_first points, later ones half the trials so far,
     * between plan_first and plan_size (more refits while the model learns fastest). 0: every
     * batch is plan_size (AutoTVM). */
    int plan_first;
    /* Diversity (AutoTVM submodular_pick): the model's top diversity × want candidates, of which
     * want are picked greedily for knob values not yet in the batch. ≤ 1: plain top-k. */
    double diversity;
    /* Tree depth and learning rate of the model; 0: AutoTVM's 3 and 0.3. */
    int model_depth;
    double model_eta;
    /* The latent model (model LATENT or XGB_LATENT): its settings (NULL: the defaults, seeded by
     * `seed`) and the unlabelled configurations of its auxiliary loss, drawn once per run from
     * the table or the space; default 128. */
    const tpk_tune_latent_opts *latent;
    int latent_unlabelled;
    /* Configurations measured first, as the first batch (with the batch's own picks when it is
     * larger): tptune port's configurations of this workload on this class. Invalid ones are
     * skipped. */
    const tpk_tune_config *initial;
    size_t ninitial;
} tpk_tune_opts;

TPK_API void tpk_tune_opts_default(tpk_tune_opts *o);
/* Kendall's tau-b on held-out configurations: the model of o (o->model, its settings and seed)
 * fitted on ntrain of the n configurations idx (labels y; a seeded random choice), scored on the
 * rest; the latent model's unlabelled rows come from idx. */
TPK_API int tpk_tune_model_tau(const tpk_tune_space *s, const tpk_tune_opts *o, const uint64_t *idx,
                               const double *y, size_t n, size_t ntrain, double *tau, tpk_ctx *ctx);

typedef struct tpk_tune_outcome {
    int trials;
    double best_gflops;
    tpk_tune_config best;
    int trials_to_stop; /* trial number (1-based) at which stop_at_gflops was reached; 0: never */
} tpk_tune_outcome;

/* Run the tuner: batches of plan_size, each measured by `measure`, logged to `log` (may be
 * NULL), model refit after each batch. */
TPK_API int tpk_tune_run(const tpk_tune_space *s, const tpk_tune_opts *o, tpk_tune_measure_cb measure,
                         void *measure_user, FILE *log, tpk_tune_progress_cb progress,
                         void *progress_user, tpk_tune_outcome *out, tpk_ctx *ctx);

/* Seeded synthetic objective for tests (no timing): a roofline-style analytic GFLOP/s of a
 * cpu_gemm configuration with deterministic multiplicative noise. */
TPK_API double tpk_tune_synthetic_gflops(const tpk_tune_space *s, const tpk_tune_config *c,
                                         uint64_t noise_seed);
/* A measure callback over tpk_tune_synthetic_gflops; user points at a uint64_t noise seed. */
TPK_API int tpk_tune_synthetic_measure(void *user, const tpk_tune_space *s,
                                       const tpk_tune_config *c, tpk_tune_result *res,
                                       tpk_ctx *ctx);

/* ---- Exact verification (tptune verify: tuner/verify.c, tuner/mutate.c) ------------------- */

/* What one kernel's checks found. A failed check is a report (ok = 0), never a status. */
typedef struct tpk_tune_verify_report {
    int ok;            /* 1: every check passed */
    int runs;          /* kernel calls checked */
    int shapes;        /* distinct problem sizes */
    size_t entries;    /* elements compared exactly: every output entry, padding and guard */
    double miss_bound; /* Z_p twin: bound on the probability that a wrong entry passes; 0: exact */
    char what[512];    /* the first failure: shape, variant, entry, value and expected value */
} tpk_tune_verify_report;

/* A cpu_gemm / cpu_syrk kernel of configuration c in space s (its blocking chooses the shapes;
 * s->task.threads the thread count) — dfn for f64, sfn for f32, ws its workspace function — run
 * unchanged on small nonzero integers whose every float sum is exact, on ragged shapes that
 * cross every block of the blocking, with A and B row-major and transposed, padded leading
 * dimensions, alpha ∈ {3, −1, 2, −2, 0}, beta ∈ {−2, 0, 3, −3} and both thread counts; every
 * output entry is compared exactly with an int64 reference, and guards and padding around C (and
 * SYRK's upper triangle) must be untouched. seed: the inputs. */
TPK_API int tpk_tune_verify_gemm(const tpk_tune_space *s, const tpk_tune_config *c, tpk_dgemm_kernel_fn dfn,
                                 tpk_sgemm_kernel_fn sfn, tpk_gemm_ws_fn ws, uint64_t seed,
                                 tpk_tune_verify_report *rep, tpk_ctx *ctx);
/* A cpu_map configuration's Z_p twin (the kernel's loop nest over Z_p, p = 2^31 − 1, with the
 * arithmetic of an entry replaced by random lookup tables): emitted, compiled with cc (NULL:
 * gcc) and checked exactly against a scalar Z_p reference, out of place, in place and with a
 * flagged entry in every lane. rep->miss_bound states the probability that a wrong entry passes. */
TPK_API int tpk_tune_verify_map(const tpk_tune_space *s, const tpk_tune_config *c, uint64_t seed, const char *cc,
                                tpk_tune_verify_report *rep, tpk_ctx *ctx);
/* The tolerance check of a map kernel (the measurer's, issue 6): odd n with degenerate
 * variances, out of place and in place, a flagged entry, against tpk_ref_relu_map_*; *worst is
 * the largest error relative to the entry's scale. Returns 1 within the tolerance. */
TPK_API int tpk_tune_check_map(tpk_dmap_kernel_fn dfn, tpk_smap_kernel_fn sfn, tpk_map_ws_fn ws, int nt,
                               double *worst);

typedef struct tpk_tune_mutant_opts {
    int n;             /* mutants wanted */
    uint64_t seed;     /* which sites, and the verifier's inputs */
    const char *cc;    /* compiler; NULL: gcc */
    const char *runner;/* the program whose `__verify` runs a mutant (measure options' rule) */
    double timeout_s;  /* per mutant run; default 120 */
    const char *kinds; /* only these kinds ("k_tail,map_tiles"), NULL: all */
} tpk_tune_mutant_opts;
/* The mutation suite: n distinct mutants — one bug each (off-by-one bounds, swapped strides,
 * dropped tails, wrong masks, doubled accumulation, wrong indices: tuner/mutate.c) injected into
 * the emitted source of the kernels (spaces s[i], configurations c[i]; a map kernel's twin) —
 * each compiled and run through the exact verifier in a process of its own. One line per mutant
 * on out and `caught K/N` last; *caught = K. A mutant that does not compile is replaced. */
TPK_API int tpk_tune_verify_mutants(const tpk_tune_space *s, const tpk_tune_config *c, size_t nk,
                                    const tpk_tune_mutant_opts *o, FILE *out, int *caught, tpk_ctx *ctx);
/* One kernel (a map kernel: its Z_p twin) emitted, compiled and checked by the exact verifier in
 * a process of its own, as a mutant is (o: compiler, runner, timeout, seed; n and kinds unused):
 * *ok = 1 when every check passed; why says what ran or what failed. A kernel that does not
 * compile or fails is a result (ok = 0), not a status. */
TPK_API int tpk_tune_verify_kernel(const tpk_tune_space *s, const tpk_tune_config *c, const tpk_tune_mutant_opts *o,
                                   int *ok, char *why, size_t cap, tpk_ctx *ctx);
/* The standalone source the suite compiles: the kernel (twin = 0) or a map kernel's Z_p twin, with
 * the mutation "KIND[:SITE]" (the kinds of tuner/mutate.c) or none (NULL). */
TPK_API int tpk_tune_emit_variant(const tpk_tune_space *s, const tpk_tune_config *c, int twin, const char *mutant,
                                  FILE *out, tpk_ctx *ctx);
/* The suite's child: argv = {prog, "__verify", SO, OP, DTYPE, M, N, K, THREADS, INDEX, SEED}
 * (INDEX: the configuration's mixed-radix index). Prints one "TPKVERIFY ..." line. */
TPK_API int tpk_tune_verify_child_main(int argc, char **argv);

/* ---- Porting to another machine class (tptune port: tuner/port.c, issue 21 item 3) ---------- */

#define TPK_TUNE_PORT_MAX_STEPS 8

/* One pass of a port: whether it changed the configuration, whether the target space's
 * constraints then needed the enumerative repair, the verifier's verdict (1 passed, 0 failed,
 * -1 not run: nothing changed), the configuration after it, and what the verifier said. */
typedef struct tpk_tune_port_step {
    char pass[16];
    int changed, repaired, verified;
    char knobs[256];
    char why[256];
} tpk_tune_port_step;

typedef struct tpk_tune_port_report {
    int ok; /* every pass repaired and verified */
    int nstep;
    tpk_tune_port_step step[TPK_TUNE_PORT_MAX_STEPS];
    tpk_tune_config c; /* the ported configuration (in the target space) */
} tpk_tune_port_report;

/* Carry configuration c of space `from` (one machine class) to space `to` (the same template and
 * workload on another class) through the passes vector width, register tile and cache
 * re-blocking, each followed by the enumerative repair of `to`'s constraints (the nearest valid
 * configuration changing at most three knobs) and, when verify is not NULL, the exact verifier
 * (tpk_tune_verify_kernel) where the kernel changed. */
TPK_API int tpk_tune_port_config(const tpk_tune_space *from, const tpk_tune_config *c, const tpk_tune_space *to,
                                 const tpk_tune_mutant_opts *verify, tpk_tune_port_report *rep, tpk_ctx *ctx);
/* Port every tuned configuration of class `from` in the logs (the picks of its generated GEMM
 * and map files) to class `to`: one block of lines per workload on report, and each ported
 * configuration as an unmeasured record (rate 0) of class `to` on log (both may be NULL). */
TPK_API int tpk_tune_port(const tpk_tune_record *recs, size_t n, const tpk_machine *from, const tpk_machine *to,
                          const tpk_tune_mutant_opts *verify, FILE *report, FILE *log, int *nported, int *nfailed,
                          tpk_ctx *ctx);

/* ---- The relu-map schedule as a CUDA kernel (tuner/cuda_map.c, issue 21 item 3) ------------ */

/* A cpu_map configuration's schedule on sm_90: a grid of rows × cols tiles of the lower triangle,
 * blocks of tx × ty threads (a warp along a row, ty warps across rows), un entries per thread and
 * step; the CPU's arccos variant and roots. notes: what the passes did. */
typedef struct tpk_tune_cuda_map {
    int dtype;
    size_t n;                 /* the workload's size (the occupancy repair's) */
    int rows, cols, tx, ty, un;
    int acos, rq;             /* the cpu_map knob values */
    int repaired;             /* the tile was shrunk for two waves of blocks */
    size_t blocks;            /* blocks with an entry on or below the diagonal at n */
    char notes[192];
} tpk_tune_cuda_map;

/* What checking an emitted file found: the host emulation against tpk_tune_check_map, and
 * (nvcc given) the sm_90 compile with ptxas's registers and spill bytes; why: the failure. */
typedef struct tpk_tune_cuda_map_check_report {
    int host_ok;
    double worst; /* the map checks' largest error relative to their bound's scale */
    int nvcc_ran, nvcc_ok, regs, spill;
    char why[320];
} tpk_tune_cuda_map_check_report;

/* The passes: CPU split → grid of tiles, vector lanes → a warp along the row, unroll → entries
 * per thread, tile re-blocked and repaired for occupancy. */
TPK_API int tpk_tune_cuda_map_plan(const tpk_tune_space *s, const tpk_tune_config *c, tpk_tune_cuda_map *p,
                                   tpk_ctx *ctx);
/* The .cu file: CUDA C under nvcc (tpk_cuda_map_launch, tpk_cuda_map_ws), plain C otherwise (the
 * host emulation of the same grid as tpk_kernel / tpk_kernel_ws). */
TPK_API int tpk_tune_cuda_map_emit(const tpk_tune_space *s, const tpk_tune_config *c, const tpk_tune_cuda_map *p,
                                   FILE *o, tpk_ctx *ctx);
/* Compile the file's host emulation (gcc) and run tpk_tune_check_map on it in a child process,
 * then (grid_n > 0; rows + cols + 3 spans several blocks) the whole map at n = grid_n against the
 * reference; with nvcc (a path, or NULL to skip), compile it for sm_90 and read ptxas -v. A
 * failed check is a report, not a status. */
TPK_API int tpk_tune_cuda_map_check(const char *cu, int dtype, size_t grid_n, const char *nvcc,
                                    tpk_tune_cuda_map_check_report *rep, tpk_ctx *ctx);
/* The nvcc to use: $NVCC when set (NULL if it is not executable), else the first on $PATH, else
 * /usr/local/cuda/bin/nvcc; written to buf, NULL when there is none. */
TPK_API const char *tpk_tune_nvcc(char *buf, size_t cap);
/* Every relu map pick of class `from` in the logs to dir/relu_map_DTYPE_nN_Tt.cu, each checked
 * (ported: the host emulation passes and, with nvcc, it compiles for sm_90 without spills). */
TPK_API int tpk_tune_port_map_cuda(const tpk_tune_record *recs, size_t n, const tpk_machine *from, const char *dir,
                                   const char *nvcc, FILE *report, int *nported, int *nfailed, tpk_ctx *ctx);

/* ---- Library generation (gen/) ------------------------------------------------------------ */

/* Write the generated C file of one machine class's tuned CPU GEMM kernels and their dispatch
 * table (gen/tpk_gemm_cpu_ID.c, defining tpk__gemm_class_ID) from the best record per (dtype, m, n,
 * k, threads) among the records whose target is cls->name, and the class's analytic defaults.
 * Output depends only on recs and cls. */
TPK_API int tpk_tune_gen_cpu_library(const tpk_tune_record *recs, size_t n, const tpk_machine *cls,
                                     const char *generator, FILE *out, tpk_ctx *ctx);

/* One class's generated map file (gen/tpk_map_cpu_ID.c): the best relu_map record per (dtype, n,
 * threads) of that class, its analytic defaults, and the table runtime/map_dispatch.c reads. */
TPK_API int tpk_tune_gen_map_library(const tpk_tune_record *recs, size_t n, const tpk_machine *cls,
                                     const char *generator, FILE *out, tpk_ctx *ctx);
/* The distinct kernels a class's generated file holds (what tpk_tune_gen_cpu_library, or for
 * map = 1 tpk_tune_gen_map_library, emits): *out (malloc'd, the caller frees) holds *nout spaces
 * and configurations, names[i] (may be NULL, 160 bytes each) their kernel names. */
TPK_API int tpk_tune_gen_kernels(const tpk_tune_record *recs, size_t n, const tpk_machine *cls, int map,
                                 tpk_tune_space **spaces, tpk_tune_config **configs, char (**names)[160],
                                 size_t *nout, tpk_ctx *ctx);
/* The class index (gen/tpk_classes.c): every class's profile and its GEMM and map tables. */
TPK_API int tpk_tune_gen_class_index(const tpk_tune_class *cls, size_t n, const char *generator,
                                     FILE *out, tpk_ctx *ctx);

/* The generated CUDA file (gen/tpk_gemm_cuda.cu): the best cuda_gemm record per workload, the
 * analytic defaults, and extern "C" tpk_cuda_gemm_d / tpk_cuda_gemm_s dispatching by shape. */
TPK_API int tpk_tune_gen_cuda_library(const tpk_tune_record *recs, size_t n, const char *generator,
                                      FILE *out, tpk_ctx *ctx);
/* A device-check bundle in dir: kNN.cu, one per kernel (the defaults plus `nrandom` random valid
 * configurations per dtype, seeded), and harness.cu timing each against cuBLAS on the shapes. */
TPK_API int tpk_tune_emit_cuda_check(const char *dir, int nrandom, uint64_t seed,
                                     const size_t (*shapes)[3], int nshape, int repeat,
                                     tpk_ctx *ctx);


/* ---- Fused entrywise candidates (tuner/ew.c, issue 20 item 1; docs/orchestration.md §7.3) ----
 *
 * A candidate kernel of the limit evaluator's entrywise plans (netsor/ewplan.c) as text, its
 * *signature*: which values it reads, which primitives it computes in registers, which it stores.
 *
 *   sig  := "in=" K { ";" prim }            values v0 .. v(K−1) are the kernel's inputs (n×n
 *   prim := phi "(" "v" I ")" ["!"]         lower triangles), v(K+p) is primitive p
 *         | "sum(" term {"," term} ")" ["!"]
 *   term := ("v" I | "b") ["*w"]            a value, or a constant (a bias); "*w": times w_i w_j
 *   phi  := "identity" | "relu" | "erf" ["[" b "]"]      V_φ(x; q_i, q_j) of erf(b·x)
 *
 * "!" marks a stored primitive; the last one is always stored. Entry (i, j ≤ i) of a map is
 * α V_φ(x_ij; q_i, q_j) + β with q the diagonal of its argument; of a sum Σ_t c_t (w_t,i w_t,j)
 * x_t,ij. The emitted C function (tpk_tune_ew_emit) is
 *
 *   int NAME(size_t n, const double *const *in, const double *const *dg, double *const *out,
 *            const double *par, const double *const *w, int threads);
 *
 * in[k]: input k (row-major, leading dimension n; only the lower triangle is read); dg[v]: the
 * diagonal of value v where a map reads it (n); out[p]: where primitive p goes (lower triangle;
 * NULL unless stored); par: per primitive in order, a map's α, β and a sum's c_t per term (a
 * bias term: the constant itself); w: the weight vectors of the "*w" terms in order. It returns
 * 0, or −1 when the arrays of pre could not be allocated (nothing written). */
#define TPK_TUNE_EW_MAXP 16
#define TPK_TUNE_EW_MAXT 8
#define TPK_TUNE_EW_MAXIN 16
#define TPK_TUNE_EW_SIGLEN 1024
enum tpk_tune_ew_op { TPK_TUNE_EW_MAP = 0, TPK_TUNE_EW_SUM = 1 };
enum tpk_tune_ew_phi { TPK_TUNE_EW_IDENTITY = 0, TPK_TUNE_EW_RELU = 1, TPK_TUNE_EW_ERF = 2 };
typedef struct tpk_tune_ew_prim {
    int op, phi;
    double b;                         /* erf(b·x) */
    int nt;                           /* MAP: 1 */
    int arg[TPK_TUNE_EW_MAXT];        /* value ids; −1: a bias term */
    int weighted[TPK_TUNE_EW_MAXT];
    int stored;
} tpk_tune_ew_prim;
typedef struct tpk_tune_ew {
    int nin, np;
    tpk_tune_ew_prim p[TPK_TUNE_EW_MAXP];
} tpk_tune_ew;
/* The schedule: doubles per vector (4: AVX2, 8: AVX-512), rows per dynamic grab, and pre: each
 * map's column transforms (√q and 1/√q, or 1/√(1 + 2b²q)) computed once per call into arrays
 * (two square roots and a division fewer per entry, n doubles each), else per entry. */
typedef struct tpk_tune_ew_cfg {
    int lanes, chunk, pre;
} tpk_tune_ew_cfg;

/* Parse a signature; errors name the column. */
TPK_API int tpk_tune_ew_parse(const char *sig, tpk_tune_ew *e, tpk_ctx *ctx);
/* The canonical signature (what the cache keys on). */
TPK_API void tpk_tune_ew_print(const tpk_tune_ew *e, char *out, size_t cap);
/* Entries of par and of w the kernel reads. */
TPK_API void tpk_tune_ew_counts(const tpk_tune_ew *e, int *npar, int *nw);
/* The analytic default schedule on this host (its widest vectors, chunks of 4 rows). */
TPK_API void tpk_tune_ew_default(tpk_tune_ew_cfg *c);
/* The fused kernel as C (GCC vector extensions, OpenMP; standalone: with its prelude), or its
 * Z_p twin (twin = 1: the same loop nest over values of Z_p, p = 2^31 − 1, every map a random
 * table function; exports tpk_twin_tables). */
TPK_API int tpk_tune_ew_emit(const tpk_tune_ew *e, const tpk_tune_ew_cfg *c, const char *fname, int twin,
                             FILE *out, tpk_ctx *ctx);
/* The fused kernel as CUDA: __global__ NAME (one thread per entry of the lower triangle, pointer
 * arrays in device memory) and extern "C" NAME_launch(n, in, dg, out, par, w, stream) under nvcc;
 * compiled as C, NAME is the host emulation of the same grid with the C kernels' interface. */
TPK_API int tpk_tune_ew_emit_cuda(const tpk_tune_ew *e, const char *fname, FILE *out, tpk_ctx *ctx);

typedef struct tpk_tune_ew_report {
    int exact_ok;          /* the Z_p twin equals the reference on every entry, upper triangle untouched */
    long entries;          /* entries compared exactly */
    double miss_bound;     /* probability that a wrong entry passes */
    int real_ok;           /* the kernel itself within tolerance of the libm reference */
    double max_rel_err;
    int cuda_ok;           /* the CUDA kernel's host emulation (its per-thread code over its grid) too */
    double cuda_max_rel_err;
    int mutants, caught;   /* --mutants: distinct bugs injected, and caught */
} tpk_tune_ew_report;
/* Exact verification (the Z_p twin: n = 1, 2, 37, 3·lanes + 5, random inputs, diagonals,
 * weights and parameters; every entry of every stored primitive, and the upper triangles
 * untouched) and the tolerance check of the kernel (libm reference, PSD inputs with zero
 * variances), each compiled with cc (NULL: gcc) and run in a process of its own (runner: below).
 * mutants > 0:
 * that many distinct bugs of the emitter's sites (or all there are) injected one at a time into
 * the twin, each compiled and checked; one line per mutant on log (may be NULL). The CUDA kernel's
 * host emulation is checked against libm as the C kernel is (r->cuda_ok). */
TPK_API int tpk_tune_ew_verify(const tpk_tune_ew *e, const tpk_tune_ew_cfg *c, const char *cc, const char *runner,
                               int mutants, uint64_t seed, FILE *log, tpk_tune_ew_report *r, tpk_ctx *ctx);
/* Seconds per call on n×n (median of repeat, each ≥ 20 ms of calls), in a process of its own. */
TPK_API int tpk_tune_ew_measure(const tpk_tune_ew *e, const tpk_tune_ew_cfg *c, size_t n, int threads, int repeat,
                                const char *cc, const char *runner, double *seconds, tpk_ctx *ctx);
/* The checking and timing child (`RUNNER __ew KIND SO SIG LANES PRE SEED N THREADS REPEAT`, KIND
 * twin, real or time): prints one "TPKEW ..." line. runner (the verifier's and the timer's): the
 * program run as that child, NULL: tpk_tune_measure_opts's rule ($TPK_TUNE_RUNNER, $TPK_BIN/tptune,
 * else a fork of this process — which must not have run OpenMP regions yet). */
TPK_API int tpk_tune_ew_child_main(int argc, char **argv);

/* The cache of measured candidates: JSON lines, one per measurement, keyed by machine class,
 * signature, n, threads and schedule (like tuning logs; tptune ew --cache). */
typedef struct tpk_tune_ew_rec {
    char target_class[64];
    char sig[TPK_TUNE_EW_SIGLEN];
    size_t n;
    int threads;
    tpk_tune_ew_cfg cfg;
    double seconds;
    int verified;
    double ts;
} tpk_tune_ew_rec;
/* The fastest record of (class, sig, n, threads) — of schedule c where c is not NULL — in the
 * cache at path (*found = 0: none; a missing file is an empty cache). */
TPK_API int tpk_tune_ew_cache_find(const char *path, const tpk_tune_ew_rec *key, const tpk_tune_ew_cfg *c,
                                   tpk_tune_ew_rec *out, int *found, tpk_ctx *ctx);
TPK_API int tpk_tune_ew_cache_add(const char *path, const tpk_tune_ew_rec *r, tpk_ctx *ctx);
/* The cache file of an option (tptune ew --cache, netsor plan --emitted): opt itself, "" for
 * "none", and for NULL the default $XDG_CACHE_HOME/tpk/ew.jsonl or ~/.cache/tpk/ew.jsonl (its
 * folders made; "" without a home). */
TPK_API void tpk_tune_ew_cache_path(const char *opt, char *out, size_t cap);
/* Every record of the cache (*recs malloc'd; a missing file: none), and the fastest verified one
 * of key's (class, sig, n, threads) among them — of schedule c where c is not NULL — or NULL. */
TPK_API int tpk_tune_ew_cache_load(const char *path, tpk_tune_ew_rec **recs, size_t *nrec, tpk_ctx *ctx);
TPK_API const tpk_tune_ew_rec *tpk_tune_ew_cache_best(const tpk_tune_ew_rec *recs, size_t nrec,
                                                      const tpk_tune_ew_rec *key, const tpk_tune_ew_cfg *c);

#ifdef __cplusplus
}
#endif
#endif
