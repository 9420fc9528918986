/* Finite-width convergence studies (theory.md §7): a NETSOR program run through the finite-width
 * executor at a ladder of widths × seeds and compared with its limit kernel, checkpointed so that
 * an interrupted study resumes without losing finished seeds; the analysis of the raw data
 * (kernel errors, bias and fluctuation, output-law distances, fitted exponents with bootstrap
 * intervals) and the self-describing HDF5 file of the whole study. gplimits is a command line
 * over this; the statistics themselves are include/tpk/limits.h. */
#ifndef TPK_STUDY_H
#define TPK_STUDY_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "archs.h"
#include "io.h"
#include "limits.h"
#include "netsor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Raw data and its analysis ---------------------------------------------------------------- */

/* The raw data of a study: for W widths × S seeds, the empirical kernel on the N compared output
 * coordinates (the inputs; with all outputs, inputs × readouts, input-major) and the sampled
 * readouts on the same coordinates; and the limit kernel. Seed s is the same network seed at
 * every width (nested widths, theory.md §7.3). */
typedef struct tpk_study_raw {
    size_t W, S, N;
    const double *widths;   /* W, increasing */
    const double *khat;     /* W × S × N × N */
    const double *y;        /* W × S × N */
    const double *K;        /* N × N */
} tpk_study_raw;

/* Fit window chosen by the rule of tpk_limits_fit_window on the RMS error. */
#define TPK_STUDY_FIT_AUTO SIZE_MAX
/* Default bound of that rule: at n_min the n^-1 term is at most 10% of the n^-1/2 term, so the
 * local log-slope of c1 n^-1/2 + c2 n^-1, -(1/2 + r)/(1 + r) with r = c2/(c1 sqrt n), is within
 * r/(2(1 + r)) <= 0.045 of -1/2 there and within half that one doubling higher: below the
 * bootstrap half-widths (0.03-0.08) of the studies this is used for. */
#define TPK_STUDY_FIT_RATIO_DEFAULT 0.1

typedef struct tpk_study_stats {
    size_t boot;           /* bootstrap replicates (>= 50; the sliced fit uses boot/5, >= 50) */
    uint64_t seed;         /* seeds the bootstrap, the noise floors and the slice directions */
    size_t w1_input;       /* output coordinate (< N) of the 1-D law statistics */
    size_t slices;         /* directions of the sliced distances (>= 1) */
    size_t fit_min_width;  /* fit over widths >= this (0: all); TPK_STUDY_FIT_AUTO: the rule */
    double fit_ratio;      /* the rule's bound on the n^-1 / n^-1/2 term ratio (> 0) */
} tpk_study_stats;

/* boot 1000, seed 1, w1_input 0, slices 8, TPK_STUDY_FIT_AUTO, TPK_STUDY_FIT_RATIO_DEFAULT. */
TPK_API void tpk_study_stats_default(tpk_study_stats *o);

/* Per-width statistics, each a dataset /per_width/NAME (tpk_study_column_name). */
enum tpk_study_column {
    TPK_STUDY_RMS,             /* rms: RMS over seeds of the relative Frobenius error */
    TPK_STUDY_RMS_LO,          /* rms_lo, rms_hi: its bootstrap 95% interval */
    TPK_STUDY_RMS_HI,
    TPK_STUDY_BIAS,            /* bias, bias_debiased, bias2_debiased, bias_floor, fluctuation: */
    TPK_STUDY_BIAS_DEBIASED,   /*   tpk_limits_bias */
    TPK_STUDY_BIAS2_DEBIASED,
    TPK_STUDY_BIAS_FLOOR,
    TPK_STUDY_FLUCT,
    TPK_STUDY_RBW1,            /* rbw1, rbw1_floor: RB-W1 against the GP and its noise floor */
    TPK_STUDY_RBW1_FLOOR,
    TPK_STUDY_SHAPE,           /* rbw1_shape (+ _lo, _hi): the variance-matched RB-W1 */
    TPK_STUDY_SHAPE_LO,
    TPK_STUDY_SHAPE_HI,
    TPK_STUDY_VARPART,         /* rbw1_variance_part: sqrt(2/pi) |sqrt(mean v) - sqrt(v_inf)| */
    TPK_STUDY_KURT_MIX,        /* kurtosis_mixture, kurtosis_samples */
    TPK_STUDY_KURT_SAMPLES,
    TPK_STUDY_NCOLS
};
TPK_API const char *tpk_study_column_name(int column);

typedef struct tpk_study_analysis {
    size_t W, S, N;
    tpk_study_stats stats;         /* the options it was made with */
    double *widths;                /* W */
    double *frob_rel;              /* W × S per-seed relative errors (/per_seed/frob_rel) */
    double *variance;              /* W × S output variance at w1_input */
    double *col[TPK_STUDY_NCOLS];  /* W each */
    double *sliced_rbw1, *sliced_rbw1_shape, *sliced_w1_samples; /* W each */
    double gp_floor_mean, gp_floor_sd; /* GP-vs-GP floor of sliced_w1_samples */
    double *theta;                 /* slices × N directions */
    tpk_limits_fit rms, shape, rbw1, kurt, sliced; /* fits over the chosen window */
    tpk_limits_fit *stability;     /* W − 1: the RMS fit from width k on, k = 0..W−2 */
    tpk_limits_window window;      /* how the window was chosen (auto_window) */
    int auto_window;
    int degenerate;                /* the variance at w1_input does not vary over networks */
    double vdev;                   /* max over (width, seed) of |v − v_inf| / v_inf */
    tpk_allocator alloc;           /* tpk_study_analyse's (tpk/alloc.h), for its _free */
} tpk_study_analysis;

/* Every statistic of the raw data (deterministic for given data and options, whatever the thread
 * count). Errors: TPK_EINVAL (shapes, options: w1_input ≥ N, a fit_min_width leaving < 2
 * widths), TPK_EDOM / TPK_ENUMERIC from the statistics, TPK_ENOMEM. */
TPK_API tpk_study_analysis *tpk_study_analyse(const tpk_study_raw *raw, const tpk_study_stats *o,
                                              tpk_ctx *ctx);
TPK_API void tpk_study_analysis_free(tpk_study_analysis *a);
/* /per_seed/frob_rel, /per_seed/w1_input_variance, /per_width/..., /slices, /fits/... with
 * readable attributes. */
TPK_API int tpk_study_analysis_write(const tpk_study_analysis *a, tpk_h5out *out, tpk_ctx *ctx);
/* The human summary: the per-width table, each exponent against its expected value, the window,
 * the stability of the RMS exponent, notes (few seeds, degenerate variance). */
TPK_API void tpk_study_analysis_print(const tpk_study_analysis *a, FILE *f);

/* ---- The study: plan, run, write --------------------------------------------------------------- */

typedef struct tpk_study_opts {
    const tpk_arch *arch;         /* a shipped architecture, or NULL with `program` */
    const tpk_arch_flag *flags;   /* its flags, resolved (tpk_arch_flag_param) and checked */
    int nflags;
    int layernorm;                /* mlp: the LayerNorm variant (tpk_arch_program) */
    const char *program;          /* any NETSOR program (arch NULL) */
    const tpk_param_set *sets;    /* parameter overrides, applied after the flags */
    int nsets;
    int all_outputs;              /* compare every readout (input-major); 0: the last output */
    const char *input;            /* NULL: the architecture's bundled input, or with a program
                                     data/demo-inputs.csv (tpk_shipped_path) */
    size_t max_inputs;            /* use this many evenly spaced inputs; 0: all */
    const size_t *widths;         /* increasing, at least 2 */
    size_t nwidths;
    size_t seeds;                 /* networks per width, >= 4 */
    uint64_t seed;                /* network s has seed `seed + s` at every width */
    const char *output;           /* the final file; the checkpoint is output + ".partial.h5" */
    int resume;                   /* continue from the checkpoint; without one, reuse the raw
                                     data of a finished `output` made with the same settings */
    tpk_study_stats stats;
    const char *root;             /* folder holding programs/ and data/ (NULL: tpk_shipped_path;
                                     the Python package gives its own) */
    const tpk_progress *progress; /* reports and cancel flag of the limit kernel that
                                     tpk_study_alloc computes (TPK_ECANCELED); NULL: none */
    int force;                    /* replace an existing output that is not an HDF5 file of this
                                     toolkit (tpk_h5out_check_replace; --force) */
    int kernel;                   /* TPK_JOB_NNGP (0): K-hat against the NNGP; TPK_JOB_NTK: the
                                     empirical NTK (tpk_netsor_run_ntk) against the limit NTK,
                                     without the output samples' law statistics (NaN) */
    int ntk_param;                /* the NTK's parameterisation (TPK_NTK_PARAM_*) */
} tpk_study_opts;

/* Where the raw data of tpk_study_alloc came from. */
enum tpk_study_source {
    TPK_STUDY_FRESH,              /* nothing to resume */
    TPK_STUDY_FROM_CHECKPOINT,    /* the checkpoint of an interrupted study */
    TPK_STUDY_FROM_OUTPUT,        /* resume: a finished output, re-analysed without rerunning */
    TPK_STUDY_NO_CHECKPOINT       /* resume asked for, but nothing found: from scratch */
};

typedef struct tpk_study_info {
    const char *program;          /* the .nsr file run */
    const char *checkpoint;       /* output + ".partial.h5" */
    const char *config;           /* what the raw data depend on (a checkpoint must match it) */
    size_t inputs;                /* inputs used */
    size_t inputs_all;            /* inputs in the file (max_inputs picks `inputs` of them) */
    size_t runs, done;            /* (width, seed) runs in all, finished */
    int source;                   /* enum tpk_study_source */
    double limit_error;           /* the limit evaluator's error estimate */
    const char *limit_solver;     /* who computed the limit (tpk_job_solver: "interpreter",
                                   * "transformer-recursion", ...), as gpkernel would */
} tpk_study_info;

typedef struct tpk_study tpk_study;

/* Prepare a study: the program (architecture flags and settings translated for a finite-width
 * comparison of the program itself: 1/n attention only, the CNNs' padding and filter as program
 * parameters, per-position readouts), the inputs, the limit kernel, the raw-data buffers, and
 * what a checkpoint or finished output already holds. A checkpoint without `resume`, or one made
 * with other settings, is refused (TPK_EINVAL). reg: tpk_job_registry. */
TPK_API tpk_study *tpk_study_alloc(const tpk_study_opts *o, const tpk_phi_registry *reg,
                                   tpk_ctx *ctx);
TPK_API void tpk_study_free(tpk_study *s);
TPK_API const tpk_study_info *tpk_study_get_info(const tpk_study *s);
/* The raw data as it stands (pointers into the study). */
TPK_API tpk_study_raw tpk_study_get_raw(const tpk_study *s);

/* Checkpoints are rewritten when this many seconds have passed since the last one, and when a
 * run stops: an uncatchable kill loses at most this much work. */
#define TPK_STUDY_CHECKPOINT_SECONDS 2.0

typedef struct tpk_study_progress {
    size_t widths_done, widths;   /* widths with every seed finished */
    size_t done, runs;            /* finished (width, seed) runs */
    size_t todo, ran;             /* runs missing when tpk_study_run started; finished since */
    double elapsed;               /* seconds since tpk_study_run started */
    int final;                    /* the last call */
} tpk_study_progress;
typedef void (*tpk_study_progress_fn)(const tpk_study_progress *p, void *user);

typedef struct tpk_study_run_opts {
    const volatile sig_atomic_t *stop; /* non-zero: start no more runs, end the running ones
                                          (they stay missing), checkpoint and return TPK_OK
                                          with done < runs (e.g. set by SIGINT); NULL */
    double checkpoint_seconds;    /* 0: TPK_STUDY_CHECKPOINT_SECONDS */
    tpk_study_progress_fn progress; /* NULL: none; one thread at a time, every 0.2 s or more,
                                       and once with final = 1 */
    void *user;
} tpk_study_run_opts;

/* Run every missing (width, seed) pair (one OpenMP loop over all pairs, widest first: peak
 * memory is one network at the largest width per thread); results depend on (width, seed) only.
 * o may be NULL. */
TPK_API int tpk_study_run(tpk_study *s, const tpk_study_run_opts *o, tpk_ctx *ctx);

/* The final file, written atomically: provenance (argc, argv: the command line to record), the
 * inputs and their identity, the limit, the raw data under /per_seed, the analysis
 * (tpk_study_analysis_write); then the checkpoint is removed. It is a function of the raw data
 * and the options only, so a resumed study writes the same datasets as an uninterrupted one.
 * Every run must be done (TPK_EINVAL). summary (NULL: none) gets tpk_study_analysis_print. */
TPK_API int tpk_study_write(tpk_study *s, int argc, char **argv, FILE *summary, tpk_ctx *ctx);
/* The analysis of the last successful tpk_study_write (NULL before). */
TPK_API const tpk_study_analysis *tpk_study_get_analysis(const tpk_study *s);

#ifdef __cplusplus
}
#endif
#endif
