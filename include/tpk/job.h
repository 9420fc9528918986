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
} tpk_attr;

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
} tpk_job;

/* Infinite-width kernel: /kernel, and with a test set /kernel_test_train and /kernel_test_diag. */
TPK_API int tpk_job_kernel(const tpk_job *job, tpk_ctx *ctx);
/* Finite-width run at width n with seed s: /kernel_hat (empirical kernel, same layout as /kernel)
 * and /outputs (sampled readouts, N × outputs). */
TPK_API int tpk_job_run(const tpk_job *job, size_t width, uint64_t seed, tpk_ctx *ctx);

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
/* tpk_job_run on inputs in memory: *Khat (empirical kernel) and, if y is not NULL, *y (sampled
 * readouts, N × outputs). X as for tpk_job_kernel_arrays; job->test must be NULL. */
TPK_API int tpk_job_run_arrays(const tpk_job *job, const tpk_array *X, size_t width,
                               uint64_t seed, tpk_array **Khat, tpk_array **y, tpk_ctx *ctx);

/* Find a file shipped with the toolkit ("programs/mlp.nsr", "data/demo-inputs.csv") beside the
 * executable: <exe>/../../REL (build tree) or <exe>/../share/tpk/REL (installed); falls back to
 * REL relative to the working directory. Returns buf. */
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

/* A registry with the built-ins plus what programs commonly need. */
TPK_API tpk_phi_registry *tpk_job_registry(tpk_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
