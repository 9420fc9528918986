"""The cffi (API mode) module tpk._native over the public headers include/tpk/*.h.

API mode: the C compiler checks every declaration below against the real headers when the
package is built (a struct that changes shape fails the build instead of corrupting memory), and
libtpk.a is linked statically into the module, so an installed package needs no build tree.
Only what the Python layer calls is declared; "...;" leaves the rest of a struct to the headers.
"""
import cffi

CDEF = r"""
const char *tpk_version(void);
int tpk_threads_adapt(void);
typedef struct tpk_ctx { int status; char msg[1024]; ...; } tpk_ctx;
void tpk_ctx_init(tpk_ctx *ctx);
const char *tpk_strerror(int status);
enum tpk_status { TPK_OK, TPK_EINVAL, TPK_ENOMEM, TPK_EIO, TPK_EFORMAT, TPK_ENOTFOUND,
                  TPK_EDOM, TPK_ESYNTAX, TPK_ETYPE, TPK_ENUMERIC, TPK_EUNSUPPORTED,
                  TPK_ECANCELED };

typedef int... sig_atomic_t;
typedef struct tpk_progress { void *user; const volatile sig_atomic_t *cancel; ...; } tpk_progress;

typedef struct tpk_array { int ndim; size_t dims[4]; double *data; ...; } tpk_array;
tpk_array *tpk_array_alloc(int ndim, const size_t *dims, tpk_ctx *ctx);
void tpk_array_free(tpk_array *a);

typedef struct tpk_input_info {
    char path[1024]; char dataset[256]; char format[8]; char sha256[65];
} tpk_input_info;
tpk_array *tpk_io_read(const char *spec, tpk_input_info *info, tpk_ctx *ctx);

typedef struct tpk_phi_registry tpk_phi_registry;
void tpk_phi_registry_free(tpk_phi_registry *reg);

typedef struct tpk_param_set { const char *name; const char *value; } tpk_param_set;
typedef struct tpk_netsor_opts {
    const tpk_param_set *sets; int nsets; int netsor_plus; int explain; ...;
} tpk_netsor_opts;
typedef struct tpk_program {
    int ninstr; int nslots; int noutputs; unsigned features;
    int nparams; char **param_name; char **param_value; int *param_integer; ...;
} tpk_program;
tpk_program *tpk_netsor_load_file(const char *path, const tpk_netsor_opts *opts,
                                  const tpk_phi_registry *reg, tpk_ctx *ctx);
tpk_program *tpk_netsor_load_string(const char *name, const char *src,
                                    const tpk_netsor_opts *opts, const tpk_phi_registry *reg,
                                    tpk_ctx *ctx);
void tpk_program_free(tpk_program *p);

typedef struct tpk_job {
    const char *label; const char *program; const tpk_param_set *sets; int nsets;
    int netsor_plus; const char *input; const char *test; const char *output;
    int all_outputs; const char *source; const tpk_progress *progress; int kernel;
    int ntk_param; size_t ntk_width; ...;
} tpk_job;
#define TPK_JOB_NNGP ...
#define TPK_JOB_NTK ...
#define TPK_JOB_BOTH ...
#define TPK_NTK_PARAM_NTK ...
#define TPK_NTK_PARAM_TP ...
#define TPK_NTK_PARAM_STANDARD ...
tpk_phi_registry *tpk_job_registry(tpk_ctx *ctx);
int tpk_job_kernel_arrays(const tpk_job *job, const tpk_array *X, const tpk_array *Xt,
                          tpk_array **K, tpk_array **Kxt, tpk_array **kdiag, double *err,
                          tpk_ctx *ctx);
int tpk_job_kernels_arrays(const tpk_job *job, const tpk_array *X, const tpk_array *Xt,
                           tpk_array *K[3], tpk_array *T[3], double *err, tpk_ctx *ctx);
int tpk_job_run_arrays(const tpk_job *job, const tpk_array *X, size_t width, uint64_t seed,
                       tpk_array **Khat, tpk_array **y, tpk_ctx *ctx);
typedef struct tpk_train_opts {
    size_t width; uint64_t seed; double lr; const size_t *at; size_t nat; ...;
} tpk_train_opts;
int tpk_job_train_arrays(const tpk_job *job, const tpk_array *X, size_t ntrain,
                         const tpk_array *y, const tpk_train_opts *o, tpk_array *f, double *loss,
                         tpk_ctx *ctx);

typedef struct tpk_arch {
    const char *name; const char *program; const char *input; const char *summary;
    const char *flags; const char *defaults; const char *fixed;
    int (*custom)(const tpk_job *job, tpk_ctx *ctx); ...;
} tpk_arch;
typedef struct tpk_arch_flag { const char *flag; const char *value; const char *param; } tpk_arch_flag;
typedef struct tpk_arch_opts {
    const tpk_arch_flag *flags; int nflags; const tpk_param_set *sets; int nsets;
    int layernorm; int all_outputs; const char *root; const tpk_progress *progress; int force;
    int kernel, ntk_param; size_t ntk_width;
} tpk_arch_opts;
const tpk_arch *tpk_arch_table(size_t *count);
const tpk_arch *tpk_arch_find(const char *name);
int tpk_arch_kernel(const tpk_arch *a, const tpk_arch_opts *o, const tpk_array *X,
                    const tpk_array *Xt, tpk_array **K, tpk_array **Kxt, tpk_array **kdiag,
                    double *err, tpk_ctx *ctx);
int tpk_arch_kernels(const tpk_arch *a, const tpk_arch_opts *o, const tpk_array *X,
                     const tpk_array *Xt, tpk_array *K[3], tpk_array *T[3], double *err,
                     tpk_ctx *ctx);
int tpk_arch_job(const tpk_arch *a, const tpk_arch_opts *o, const char *input,
                 const char *test, const char *output, tpk_ctx *ctx);

typedef struct tpk_gp tpk_gp;
typedef struct tpk_gp_options {
    const char *data; const char *noise_name; const char *noise_auto; ...;
} tpk_gp_options;
void tpk_gp_options_default(tpk_gp_options *o);
typedef struct tpk_gp_info {
    size_t n, c; double noise; double jitter; int tries; double rcond; double logdet;
    double quad; double lml;
} tpk_gp_info;
tpk_gp *tpk_gp_fit(tpk_array *K, const tpk_array *Y, double noise, const tpk_gp_options *opt,
                   tpk_ctx *ctx);
void tpk_gp_free(tpk_gp *gp);
const tpk_gp_info *tpk_gp_get_info(const tpk_gp *gp);
int tpk_gp_predict(const tpk_gp *gp, const tpk_array *Kxt, const tpk_array *kdiag,
                   tpk_array *mean, tpk_array *var, tpk_ctx *ctx);
typedef struct tpk_gp_spectral tpk_gp_spectral;
tpk_gp_spectral *tpk_gp_spectral_alloc(const tpk_array *K, const tpk_array *Y, tpk_ctx *ctx);
void tpk_gp_spectral_free(tpk_gp_spectral *s);
double tpk_gp_spectral_lml(const tpk_gp_spectral *s, double scale, double noise);
typedef struct tpk_gp_noise_choice {
    double noise; double scale; double lml; int at_bound; int fits;
} tpk_gp_noise_choice;
int tpk_gp_spectral_choose_noise(const tpk_gp_spectral *s, double noise_lo, double noise_hi,
                                 int fit_scale, tpk_gp_noise_choice *out, tpk_ctx *ctx);

const char *tpk_arch_flag_param(const tpk_arch *a, const char *flag, char *buf, size_t len);
int tpk_arch_check_flag(const char *flag, const char *value, const tpk_phi_registry *reg,
                        tpk_ctx *ctx);
int tpk_arch_check(const tpk_arch *a, const char *flag, const char *value,
                   const tpk_phi_registry *reg, tpk_ctx *ctx);

typedef struct tpk_study_stats {
    size_t boot; uint64_t seed; size_t w1_input; size_t slices; size_t fit_min_width;
    double fit_ratio;
} tpk_study_stats;
void tpk_study_stats_default(tpk_study_stats *o);
typedef struct tpk_study_opts {
    const tpk_arch *arch; const tpk_arch_flag *flags; int nflags; int layernorm;
    const char *program; const tpk_param_set *sets; int nsets; int all_outputs;
    const char *input; size_t max_inputs; const size_t *widths; size_t nwidths; size_t seeds;
    uint64_t seed; const char *output; int resume; tpk_study_stats stats; const char *root;
    const tpk_progress *progress; int force; ...;
} tpk_study_opts;
typedef struct tpk_study tpk_study;
typedef struct tpk_study_run_opts {
    const volatile sig_atomic_t *stop; double checkpoint_seconds; ...;
} tpk_study_run_opts;
typedef struct tpk_study_info { size_t runs, done; ...; } tpk_study_info;
const tpk_study_info *tpk_study_get_info(const tpk_study *s);
tpk_study *tpk_study_alloc(const tpk_study_opts *o, const tpk_phi_registry *reg, tpk_ctx *ctx);
void tpk_study_free(tpk_study *s);
int tpk_study_run(tpk_study *s, const tpk_study_run_opts *o, tpk_ctx *ctx);
int tpk_study_write(tpk_study *s, int argc, char **argv, FILE *summary, tpk_ctx *ctx);

typedef struct tpk_gp_experiment_opts {
    const char *kernel; const char *kernel_file; const char *phi; int depth_lo, depth_hi;
    double sigma_w2, sigma_b2; double lengthscale2, amplitude;
    const char *train, *test; const char *labels, *test_labels; int classify;
    int noise_auto; double noise; int fit_hyper; const char *output; int full_cov;
    int argc; char **argv; const char *name; const tpk_progress *progress; int force; ...;
} tpk_gp_experiment_opts;
void tpk_gp_experiment_opts_default(tpk_gp_experiment_opts *o);
int tpk_gp_experiment_run(const tpk_gp_experiment_opts *o, tpk_ctx *ctx);

typedef enum tpk_gd_get { TPK_GD_NTK, TPK_GD_NNGP, TPK_GD_NTKGP } tpk_gd_get;
typedef struct tpk_gd_opts {
    double lr; double diag_reg; int diag_reg_absolute; int discrete; double momentum; tpk_gd_get get; ...;
} tpk_gd_opts;
void tpk_gd_opts_default(tpk_gd_opts *o);
int tpk_gd_mse_ensemble(const tpk_array *ntk_dd, const tpk_array *nngp_dd,
                        const tpk_array *ntk_td, const tpk_array *nngp_td,
                        const tpk_array *nngp_tt, const tpk_array *y, const double *t, size_t nt,
                        const tpk_gd_opts *opt, tpk_array *mean, tpk_array *cov, tpk_ctx *ctx);
int tpk_gd_gp_inference(const tpk_array *ntk_dd, const tpk_array *nngp_dd,
                        const tpk_array *ntk_td, const tpk_array *nngp_td, const tpk_array *k_tt,
                        const tpk_array *y, const tpk_gd_opts *opt, tpk_array *mean,
                        tpk_array *cov, tpk_ctx *ctx);
int tpk_gd_max_learning_rate(const tpk_array *ntk_dd, size_t y_size, double momentum, double eps,
                             double *lr, tpk_ctx *ctx);
"""

HEADERS = r"""
#include "tpk/tpk.h"
#include "tpk/archs.h"
#include "tpk/job.h"
#include "tpk/gp.h"
#include "tpk/study.h"
"""


def make_ffi(include_dir, static_lib, link_args):
    """The builder and the arguments of its extension: headers from include_dir, libtpk.a and
    the libraries it needs after it (link_args)."""
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    ffi.set_source("tpk._native", HEADERS)
    ext = dict(
        include_dirs=[include_dir],
        extra_compile_args=["-std=c11", "-D_XOPEN_SOURCE=700"],
        extra_objects=[static_lib],
        extra_link_args=link_args,
    )
    return ffi, ext
