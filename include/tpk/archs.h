/* Shipped architectures: each is a NETSOR program under programs/ plus how command-line flags map
 * onto its parameters. One table for every tool (gpkernel, gplimits), so an architecture added
 * here is available everywhere with the same flags. */
#ifndef TPK_ARCHS_H
#define TPK_ARCHS_H

#include <stddef.h>
#include <stdio.h>

#include "job.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An architecture is a shipped program plus how its command-line flags map onto the program's
 * parameters ("flag=param,..."). Flags named sigma-* or var-* (and ln-eps) are variances (checked
 * >= 0), "depth" is a positive layer count, "temp" is > 0, "phi" must name a registered function;
 * others are passed through for the program (or the custom job) to check. An architecture whose
 * limit is not a plain NETSOR evaluation (the non-Gaussian 1/sqrt(n) attention limit, the CNN's
 * direct recursion and readouts) names a `custom` job besides its program. */
typedef struct tpk_arch {
    const char *name;
    const char *program;        /* under programs/ (NULL: none, custom only) */
    const char *input;          /* default (bundled) input under data/ */
    const char *summary;
    const char *flags;          /* "flag=param,..." */
    const char *defaults;       /* the tools' defaults, "param=value,..." (before the flags) */
    const char *fixed;          /* settings applied after the flags, "param=value,..." */
    int (*custom)(const tpk_job *job, tpk_ctx *ctx); /* NULL: tpk_job_kernel */
    /* A direct recursion of the same limit (NULL: none): the architecture's jobs set it as
     * tpk_job.direct, which computes in place of the NETSOR evaluator on the loaded program
     * unless the environment sets TPK_EVALUATOR=program. */
    tpk_direct_kernel direct;
    /* The largest --depth (0: the row has no depth flag). The program is elaborated at that
     * depth before anything is computed, so the bound is the elaborator's size limit (2 000 000
     * unrolled statements, or a rolled form of 20 000 family instructions, docs/netsor.md
     * "Rolled programs") at every input size, with room to spare; tpk_arch_check refuses more
     * at once. */
    int max_depth;
} tpk_arch;

/* The custom jobs of the table (app/job_cnn.c, app/attention_job.c). */
/* The gpkernel job of --arch=cnn1d / cnn2d: the shipped program
 * (programs/cnn1d.nsr or cnn2d.nsr, by job->program) is loaded with the job's settings for its
 * parameters and their final values drive tpk_cnn_kernel. Settings the program does not have:
 * padding=circular|zero, readout=flatten|gap, filter=k or kh,kw. The grid comes from the input
 * (1-D: N×P or N×P×C; 2-D: N×rows×cols or N×rows×cols×C; IDX files such as Fashion-MNIST
 * are read by tpk_idx_read). job->all_outputs selects the POSITIONS readout. */
TPK_API int tpk_cnn_job(const tpk_job *job, tpk_ctx *ctx);

/* gpkernel --arch=attention: --logit-scaling=inv-n evaluates programs/attention.nsr (Gaussian
 * limit); inv-sqrt-n writes /kernel (σ_v² E_p[C]), /kernel_se, /score_covariances (R × m × m),
 * /excess_kurtosis (3 Var C_ii / E[C_ii]², per output), /input_kernel (token kernel Σ^x). */
TPK_API int tpk_attention_job(const tpk_job *job, tpk_ctx *ctx);


/* The table (count gets its length) and a lookup by name (NULL if unknown). */
TPK_API const tpk_arch *tpk_arch_table(size_t *count);
TPK_API const tpk_arch *tpk_arch_find(const char *name);
/* "mlp, batchnorm, rnn, ..." into buf, for messages; returns buf. */
TPK_API const char *tpk_arch_names(char *buf, size_t len);
/* Every architecture with its program and flags ("--flag (param)"), one entry per two lines. */
TPK_API void tpk_arch_list(FILE *f);

/* The parameter `flag` maps to (into buf); NULL if the architecture has no such flag. */
TPK_API const char *tpk_arch_flag_param(const tpk_arch *a, const char *flag, char *buf,
                                        size_t len);
/* Check a flag's value by the naming rules above (reg is needed for "phi"; NULL skips that
 * check). TPK_EINVAL / TPK_EDOM with a message that names the flag. */
TPK_API int tpk_arch_check_flag(const char *flag, const char *value, const tpk_phi_registry *reg,
                                tpk_ctx *ctx);
/* tpk_arch_check_flag and the architecture's own bounds: --depth in 1..a->max_depth, with a
 * message naming the architecture and its limit (TPK_EINVAL), before any work. */
TPK_API int tpk_arch_check(const tpk_arch *a, const char *flag, const char *value,
                           const tpk_phi_registry *reg, tpk_ctx *ctx);

/* One typed architecture flag: --flag=value, which sets the program's parameter `param`. A caller
 * writes {"depth", "3"} (or {.flag = "depth", .value = "3"}): param comes last because the
 * library fills it in (tpk_arch_flag_param) where it needs it; tpk_arch_opts ignores it. In tpk
 * 0.1.0 param came second, and initialisers read {"depth", NULL, "3"}: such an initialiser now
 * leaves the value NULL, which tpk_arch_kernel refuses with a message that says so. */
typedef struct tpk_arch_flag {
    const char *flag;   /* as on the command line, without "--": "depth", "sigma-w2" */
    const char *value;  /* "3", "relu", "2.0" */
    const char *param;  /* the parameter it sets (resolved flags: tpk_arch_sets, tpk_study_opts) */
} tpk_arch_flag;

#define TPK_ARCH_MAX_SETS 96

/* The flag → --set translation: parameter settings in the order the front end applies them (later
 * wins): the architecture's defaults, the flags, its fixed settings, then the user's --set. The
 * settings point into `buf` (which holds split copies of the defaults and fixed lists), into the
 * flags and into `user`: keep all three alive while `out` is used. out has room for `cap`.
 * TPK_EINVAL when a user setting names the parameter of one of the flags (--depth=2 --set L=5):
 * the two contradict each other and the output would record the flag's value. */
TPK_API int tpk_arch_sets(const tpk_arch *a, const tpk_arch_flag *fl, int nfl,
                          const tpk_param_set *user, int nuser, tpk_param_set *out, int cap,
                          int *n, char *buf, size_t len, tpk_ctx *ctx);

/* The shipped program to run: the row's, or for mlp a variant chosen by --layernorm and the
 * residual flag (programs/mlp-ln.nsr, mlp-residual.nsr, mlp-ln-residual.nsr; theory §2.6, §2.9).
 * Errors: --layernorm on another architecture, mlp's ln-eps without --layernorm. */
TPK_API int tpk_arch_program(const tpk_arch *a, int layernorm, const tpk_arch_flag *fl, int nfl,
                             const char **program, tpk_ctx *ctx);

/* ---- an architecture without a command line (app/arch_kernel.c) -------------------------------
 * What gpkernel --arch=NAME does with its flags, for callers that hold the flags as data (the
 * Python package): each flag's parameter (tpk_arch_flag_param) and value (tpk_arch_check_flag),
 * the settings (tpk_arch_sets), the program (tpk_arch_program), then the job. */
typedef struct tpk_arch_opts {
    const tpk_arch_flag *flags; /* {flag, value} pairs, the flag as on the command line
                                 * ("depth", "sigma-w2"); param is ignored (looked up in the row) */
    int nflags;
    const tpk_param_set *sets;  /* --set overrides, applied after the flags */
    int nsets;
    int layernorm;              /* --layernorm (mlp) */
    int all_outputs;            /* --all-times */
    const char *root;           /* folder holding programs/ and data/ (NULL: tpk_shipped_path) */
    const tpk_progress *progress; /* the job's progress and cancel flag (tpk_job.progress) */
    int force;                  /* tpk_arch_job: tpk_job.force (--force) */
    int kernel, ntk_param;      /* tpk_job.kernel and .ntk_param (--kernel, --parameterization) */
    size_t ntk_width;           /* tpk_job.ntk_width (--ntk-width) */
} tpk_arch_opts;

/* The architecture's kernel on inputs in memory (tpk_job_kernel_arrays; the arrays as there).
 * cnn1d and cnn2d run their own job on the arrays (every readout, the NTK beside the NNGP);
 * attention, whose job writes HDF5, is TPK_EUNSUPPORTED: run it with tpk_arch_job. Unknown flags
 * are TPK_EINVAL naming the architecture. */
TPK_API int tpk_arch_kernel(const tpk_arch *a, const tpk_arch_opts *o, const tpk_array *X,
                            const tpk_array *Xt, tpk_array **K, tpk_array **Kxt,
                            tpk_array **kdiag, double *err, tpk_ctx *ctx);
/* Both limit kernels on inputs in memory (tpk_job_kernels_arrays), whatever o->kernel says. */
TPK_API int tpk_arch_kernels(const tpk_arch *a, const tpk_arch_opts *o, const tpk_array *X,
                             const tpk_array *Xt, tpk_array *K[3], tpk_array *T[3], double *err,
                             tpk_ctx *ctx);
/* The architecture's kernel job on inputs in memory, block by block (tpk_kernel_job_alloc_arrays:
 * X, Xt borrowed and kept alive by the caller, as o's flags and sets). Custom rows:
 * TPK_EUNSUPPORTED. Free with tpk_kernel_job_free. */
TPK_API tpk_kernel_job *tpk_arch_kernel_job(const tpk_arch *a, const tpk_arch_opts *o,
                                            const tpk_array *X, const tpk_array *Xt,
                                            tpk_ctx *ctx);
/* A custom row's job (cnn1d, cnn2d, attention: tpk_arch.custom), refusing the NTK, which those
 * jobs do not compute (TPK_EUNSUPPORTED, naming the program that does). */
TPK_API int tpk_arch_custom_job(const tpk_arch *a, const tpk_job *job, tpk_ctx *ctx);
/* The same request as a gpkernel job over files, any architecture (custom jobs included):
 * input (NULL: the row's bundled input under root), test (NULL: none), output (HDF5, written
 * atomically; the flags are recorded as root attributes the way gpkernel records them). */
TPK_API int tpk_arch_job(const tpk_arch *a, const tpk_arch_opts *o, const char *input,
                         const char *test, const char *output, tpk_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
