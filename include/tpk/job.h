/* Whole jobs behind the command-line programs: load a NETSOR program, read inputs, compute the
 * infinite-width kernel or a finite-width run, write self-describing HDF5 atomically. */
#ifndef TPK_JOB_H
#define TPK_JOB_H

#include <stdint.h>
#include <stdio.h>

#include "io.h"
#include "netsor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpk_attr {
    const char *name;
    const char *value; /* written as a double when it parses as one, else as a string */
    const char *param; /* the program parameter it sets (NULL: none): an integer parameter's
                        * value is written as an integer (depth for L) */
} tpk_attr;

/* A direct recursion that computes the limit of a loaded program (an architecture's
 * tpk_arch.direct): from the program's final parameter values, on the batch X, all_outputs as
 * for tpk_netsor_kernel; *K allocated, err (may be NULL) its bound. */
typedef int (*tpk_direct_kernel)(const tpk_program *p, const tpk_phi_registry *reg,
                                 const tpk_array *X, int all_outputs, const tpk_progress *prog,
                                 tpk_array **K, double *err, tpk_ctx *ctx);

typedef struct tpk_job {
    const char *label;          /* "architecture" attribute: "mlp", "rnn", or "program" */
    const char *program;        /* .nsr path */
    const tpk_param_set *sets;  /* --set overrides */
    int nsets;
    int netsor_plus;
    const char *input;          /* input spec (file.h5:/ds, .npy, .csv) */
    const char *test;           /* optional test inputs: cross kernel and test diagonal */
    const char *output;         /* HDF5 path, written atomically */
    int all_outputs;            /* all readouts (e.g. every time step), input-major */
    const tpk_attr *attrs;      /* extra root attributes (the CLI's own flags) */
    int nattrs;
    int argc;                   /* command line, for provenance */
    char **argv;
    FILE *summary;              /* a short human summary; NULL for none */
    const char *source;         /* the program's text (NULL: read the file job->program; else
                                 * job->program, which may be NULL, only names it in messages) */
    const tpk_progress *progress; /* the evaluator's or executor's progress reports and cancel
                                 * flag (include/tpk/progress.h); NULL: none. A cancelled job
                                 * returns TPK_ECANCELED and leaves no output file */
    tpk_direct_kernel direct;   /* computes the kernel in place of the NETSOR evaluator (set by
                                 * the architecture jobs from tpk_arch.direct; the output's
                                 * "evaluator" attribute says so). NULL, a job->source, or
                                 * TPK_EVALUATOR=program in the environment: the evaluator */
    int force;                  /* replace an existing output that is not an HDF5 file of this
                                 * toolkit (tpk_h5out_check_replace; --force) */
    FILE *explain;              /* where the program's notes go (--explain: which back end computes
                                 * the limit and why; inferred shape holes), NULL: none */
    int kernel;                 /* which limit kernels: TPK_JOB_NNGP (0, /kernel), TPK_JOB_NTK
                                 * (/ntk) or TPK_JOB_BOTH; the NTK by tpk_netsor_ntk */
    int ntk_param;              /* the NTK's parameterisation: TPK_NTK_PARAM_NTK (0), _TP or
                                 * _STANDARD (with ntk_width) */
    size_t ntk_width;           /* TPK_NTK_PARAM_STANDARD: the finite width (--ntk-width) */
} tpk_job;

enum { TPK_JOB_NNGP = 0, TPK_JOB_NTK = 1, TPK_JOB_BOTH = 2 };

/* Who computes a job's limit kernel: the one decision every tool shares (gpkernel, netsor
 * kernel, gplimits, gpregress, the Python package, gpkernel-mpi). The architecture's direct
 * recursion where the job carries one (tpk_arch.direct, which a row keeps only where it is
 * measured faster than the interpreter) and runs the row's own program (no job->source) and
 * TPK_EVALUATOR is not "program"; else NULL: the NETSOR interpreter, whose back end the program's
 * family IR decides (netsor check --explain). *name (may be NULL): the solver's name, which the
 * outputs record as their "solver" attribute ("transformer-recursion", "gru-recursion",
 * "interpreter"). */
TPK_API tpk_direct_kernel tpk_job_solver(const tpk_job *job, const char **name);

/* Infinite-width kernel: /kernel, and with a test set /kernel_test_train and /kernel_test_diag. */
TPK_API int tpk_job_kernel(const tpk_job *job, tpk_ctx *ctx);
/* Finite-width run at width n with seed s: /kernel_hat (empirical kernel, same layout as /kernel)
 * and /outputs (sampled readouts, N × outputs). */
TPK_API int tpk_job_run(const tpk_job *job, size_t width, uint64_t seed, tpk_ctx *ctx);

/* Training (netsor train; tpk_netsor_train): `seeds` networks of the job's program at `width`,
 * seeds seed, seed + 1, ..., each trained by full-batch gradient descent at rate lr on the
 * job's input (the training set) against `labels` (a spec read like an input: N, or N × outputs)
 * for steps[nsteps − 1] steps, the outputs recorded at every step of steps[] (sorted here;
 * 0: untrained). Writes /train_outputs (seed × step × train × output), with job->test
 * /test_outputs (seed × step × test × output), /loss (seed × step), the step and seed
 * coordinates, and the settings as attributes; progress reports count networks. */
typedef struct tpk_job_train_opts {
    const char *labels;
    size_t width, seeds;
    uint64_t seed;
    double lr;
    const size_t *steps;
    size_t nsteps;
} tpk_job_train_opts;
TPK_API int tpk_job_train(const tpk_job *job, const tpk_job_train_opts *t, tpk_ctx *ctx);
/* tpk_netsor_train of the job's program (loaded as tpk_job_run_arrays loads it: a sequence input
 * fixes an unset T) on inputs in memory: X holds the ntrain training inputs, then any test
 * inputs; y, o, f and loss as tpk_netsor_train (o->all_outputs is the job's). */
TPK_API int tpk_job_train_arrays(const tpk_job *job, const tpk_array *X, size_t ntrain,
                                 const tpk_array *y, const tpk_train_opts *o, tpk_array *f,
                                 double *loss, tpk_ctx *ctx);

/* The kernel of tpk_job_kernel on inputs in memory, without files: the same program loading (a
 * sequence input fixes an unset T), train and test stacked into one batch, the same evaluator.
 * job->input, test and output are not read; job->input (if set) names X in messages. X: N×d or
 * N×T×d (rank 2..4, finite); Xt (NULL: none) items of X's shape. *K gets the train kernel; with
 * Xt, *Kxt the test × train block and *kdiag the test diagonal (else both NULL). err (may be
 * NULL) gets the error estimate. The caller frees the arrays. Errors: TPK_EINVAL (shapes),
 * TPK_EDOM (a non-finite value, named by its index), and those of the program and evaluator. */
TPK_API int tpk_job_kernel_arrays(const tpk_job *job, const tpk_array *X, const tpk_array *Xt,
                                  tpk_array **K, tpk_array **Kxt, tpk_array **kdiag, double *err,
                                  tpk_ctx *ctx);
/* The NNGP and the NTK together (job->kernel is not read): K[0..2] the NNGP's train block, test ×
 * train block and test diagonal (the last two NULL without Xt), T[0..2] the NTK's, in
 * job->ntk_param's parameterisation. tpk_job_kernel_arrays with job->kernel = TPK_JOB_NTK gives
 * the NTK's blocks alone. */
TPK_API int tpk_job_kernels_arrays(const tpk_job *job, const tpk_array *X, const tpk_array *Xt,
                                   tpk_array *K[3], tpk_array *T[3], double *err, tpk_ctx *ctx);
/* tpk_job_run on inputs in memory: *Khat (empirical kernel) and, if y is not NULL, *y (sampled
 * readouts, N × outputs). X as for tpk_job_kernel_arrays; job->test must be NULL. */
TPK_API int tpk_job_run_arrays(const tpk_job *job, const tpk_array *X, size_t width,
                               uint64_t seed, tpk_array **Khat, tpk_array **y, tpk_ctx *ctx);

/* The install data directory compiled into the library by `make install`: PREFIX/share/tpk,
 * the folder holding programs/ and data/ (`pkg-config --variable=datadir tpk` prints the same).
 * NULL for the build tree's library, which is not installed anywhere. */
TPK_API const char *tpk_datadir(void);

/* Find a file shipped with the toolkit ("programs/mlp.nsr", "data/demo-inputs.csv") into buf
 * (len bytes; the real path). The folders tried, each holding programs/ and data/, in order:
 *   1. $TPK_DATADIR                  the environment's override, ahead of everything;
 *   2. EXEDIR/../..                  a program of the build tree (build/bin, build/tests);
 *   3. EXEDIR/../share/tpk           an installed tool, wherever its prefix was moved;
 *   4. tpk_datadir()                 the compiled-in install data directory;
 *   5. LIBDIR/../share/tpk           a user's program on the installed shared library;
 *   6. the working directory.
 * (EXEDIR: the running program's folder; LIBDIR: the folder of the libtpk.so it loaded.)
 * The build tree comes before the installed copies so that tools and tests built in a checkout
 * run the checkout's programs even where an older tpk is installed. TPK_ENOTFOUND when none
 * has it, with a message that lists every path tried and names TPK_DATADIR and
 * tpk_arch_opts.root; buf then holds REL. Callers with a folder of their own (tpk_arch_opts.root,
 * tpk_study_opts.root) do not search at all. */
TPK_API int tpk_shipped_find(const char *rel, char *buf, size_t len, tpk_ctx *ctx);
/* tpk_shipped_find without an error: the path found, or REL itself (which then names the file
 * in the caller's "cannot open" message). Returns buf. */
TPK_API const char *tpk_shipped_path(const char *rel, char *buf, size_t len);

/* The attributes every job writes on "/": provenance (tpk_h5out_provenance), "architecture"
 * (job->label, else fallback_label), "program" (path, NULL: job->program), the program's final
 * parameters, the CLI's own flags (job->attrs) and "all_outputs". The job modules add their own
 * attributes after it. */
TPK_API int tpk_job_describe(tpk_h5out *out, const tpk_job *job, const tpk_program *prog,
                             const char *path, const char *fallback_label, tpk_ctx *ctx);

/* Named dimensions (tpk_h5out_dims) of /kernel (train, train2) and, with a test set,
 * /kernel_test_train (test, train2) and /kernel_test_diag (test), as every kernel job writes them:
 * train_readout, train_readout2 and test_readout when K has several readouts per item of X. */
TPK_API int tpk_job_kernel_dims(tpk_h5out *out, const tpk_array *K, const tpk_array *X, int test,
                                tpk_ctx *ctx);

/* ---- kernel jobs block by block (app/job_block.c; issue 16, docs/scale-out.md) ----------------
 * gpkernel's job prepared once (inputs read, program loaded, the architecture's own evaluator
 * chosen for the whole job), then its kernel computed on any block of items: rows from the
 * training or the test items, columns from the training items. A block is the kernel of its
 * items evaluated as one batch by the evaluator the whole job runs, the column items before the
 * row items (as tpk_job_kernel stacks training before test items), so its entries are the whole
 * kernel's to rounding: an NNGP entry depends on its two inputs alone (theory.md §1.6). A
 * diagonal block costs its own pairs; any other block evaluates its rows' and columns' own
 * pairs with it (twice the block's). Jobs whose entries depend on the other inputs of the batch
 * (batch-coupled programs, TPK_FEAT_BATCHNORM) or that are computed over the whole batch by an
 * architecture's own job (attention's 1/sqrt(n) limit) are TPK_EUNSUPPORTED. */
typedef struct tpk_kernel_job tpk_kernel_job;
struct tpk_arch;
/* a: the job's architecture row (NULL: job->program is a user's program); the CNN rows' own
 * recursion is used as gpkernel uses it. job as for tpk_job_kernel (input required, test
 * optional); job->output is not written, and the job's strings must outlive the kernel job. */
TPK_API tpk_kernel_job *tpk_kernel_job_alloc(const struct tpk_arch *a, const tpk_job *job,
                                             tpk_ctx *ctx);
/* The same job on inputs in memory (gpregress-mpi's tiles, issue 16): X (and Xt, NULL: none)
 * borrowed, checked as tpk_job_kernel_arrays checks them; job->input and job->test only name
 * them in messages. They must outlive the kernel job. Architectures with their own job (CNN
 * rows) read files: TPK_EUNSUPPORTED. */
TPK_API tpk_kernel_job *tpk_kernel_job_alloc_arrays(const struct tpk_arch *a, const tpk_job *job,
                                                    const tpk_array *X, const tpk_array *Xt,
                                                    tpk_ctx *ctx);
TPK_API void tpk_kernel_job_free(tpk_kernel_job *kj);
/* Training (test = 0) or test items (test = 1; 0 without a test set). */
TPK_API size_t tpk_kernel_job_items(const tpk_kernel_job *kj, int test);
/* Kernel rows per item: 1, or the readouts of job->all_outputs (outputs, positions). */
TPK_API size_t tpk_kernel_job_readouts(const tpk_kernel_job *kj);
/* The training (test = 0) or test inputs as read (NULL without a test set). */
TPK_API const tpk_array *tpk_kernel_job_input(const tpk_kernel_job *kj, int test);
/* The block of rows r0 .. r0+nr−1 of the training (test = 0) or test items (test = 1) and
 * columns c0 .. c0+nc−1 of the training items: (nr·R) × (nc·R) entries, R readouts per item,
 * input-major, into K (row stride ld ≥ nc·R). diag (NULL: not wanted) gets the nr·R entries
 * k(x_a, x_a) of the row items (/kernel_test_diag for test rows); err (NULL: not wanted) the
 * block's error estimate. TPK_EINVAL: an empty block, one outside the inputs, ld too small. */
TPK_API int tpk_kernel_job_block(tpk_kernel_job *kj, int test, size_t r0, size_t nr, size_t c0,
                                 size_t nc, double *K, size_t ld, double *diag, double *err,
                                 tpk_ctx *ctx);
/* The root attributes and named dimensions tpk_job_kernel writes (tpk_job_describe, inputs,
 * the architecture's own; tpk_job_kernel_dims: /kernel, and with a test set /kernel_test_train
 * and /kernel_test_diag, must exist in out), all but error_estimate. */
TPK_API int tpk_kernel_job_describe(const tpk_kernel_job *kj, tpk_h5out *out, tpk_ctx *ctx);

/* A registry with the built-ins plus what programs commonly need. */
TPK_API tpk_phi_registry *tpk_job_registry(tpk_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
