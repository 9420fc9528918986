/* Internal interface of the kernel jobs computed block by block (tpk_kernel_job, include/tpk/job.h):
 * the state every implementation shares and the table of what differs between them — the NETSOR
 * evaluator on a loaded program (app/job.c) and the CNN's direct recursion (app/job_cnn.c). The
 * blocks themselves are cut and stacked in one place (app/job_block.c). Not installed. */
#ifndef TPK_APP_JOB_IMPL_H
#define TPK_APP_JOB_IMPL_H

#include "tpk/job.h"

typedef struct kjob_impl {
    const char *name; /* for messages: "program", "cnn" */
    /* The kernel of the items Xb (a batch of training and test items, in that order) as the
     * implementation's evaluator computes it for the whole job: (items · readouts)². */
    int (*batch)(tpk_kernel_job *kj, const tpk_array *Xb, tpk_array **K, double *err,
                 tpk_ctx *ctx);
    /* Optional (NULL: the batch of the stacked items serves): the block of the row items Xr
     * against the column items Xc, (|Xr|·R) × (|Xc|·R) in *K, and with diag the rows' own
     * entries, the same numbers as the batch's. TPK_EUNSUPPORTED: the batch serves instead. */
    int (*cross)(tpk_kernel_job *kj, const tpk_array *Xr, const tpk_array *Xc, tpk_array **K,
                 double *diag, double *err, tpk_ctx *ctx);
    /* The root attributes of the job's file besides the dimensions and error_estimate. */
    int (*describe)(const tpk_kernel_job *kj, tpk_h5out *out, tpk_ctx *ctx);
    void (*release)(void *self);
} kjob_impl;

struct tpk_kernel_job {
    tpk_job job;              /* the caller's request (its strings stay the caller's) */
    const tpk_array *X, *Xt;  /* training and test items (owned by the implementation's state) */
    size_t readouts;          /* kernel rows per item */
    const kjob_impl *impl;
    void *self;               /* the implementation's state */
    int borrowed;             /* X, Xt are the caller's arrays (tpk_kernel_job_alloc_arrays) */
    void *owned;              /* what the job's strings point into, when the library made the job
                               * (tpk_arch_kernel_job), from owned_al; freed with the job */
    tpk_allocator owned_al;
    tpk_allocator alloc;      /* of tpk_kernel_job_alloc: this struct (tpk/alloc.h) */
};

/* The implementations: fill kj (X, Xt, readouts, impl, self) from kj->job; with kj->borrowed
 * the inputs are kj->X, kj->Xt as set by the caller (the program's implementation only). */
int tpk_kjob_program_init(tpk_kernel_job *kj, tpk_ctx *ctx);
int tpk_kjob_cnn_init(tpk_kernel_job *kj, tpk_ctx *ctx);
/* The CNN job on inputs in memory (X, Xt borrowed): the blocks of the kernel job->kernel names
 * into K (training, test × training, test diagonal), or with T both kernels, the NNGP's in K and
 * the NTK's in T (tpk_arch_kernel, tpk_arch_kernels). */
int tpk_cnn_job_arrays(const tpk_job *job, const tpk_array *X, const tpk_array *Xt,
                       tpk_array *K[3], tpk_array *T[3], double *err, tpk_ctx *ctx);

/* The NTK's root attributes (ntk_parameterization, with 'standard' ntk_width) of a job that
 * computes it; nothing for the NNGP. */
int tpk_job_ntk_attrs(tpk_h5out *out, const tpk_job *job, tpk_ctx *ctx);
/* tpk_job_kernel_dims of any kernel's datasets (K; Kx and kd NULL without a test set; per_item:
 * several readouts per item). */
int tpk_job_kernel_dims_named(tpk_h5out *out, const char *K, const char *Kx, const char *kd,
                              int per_item, tpk_ctx *ctx);

/* A direct recursion's NTK (a solver row's, app/solvers.c): both kernels of the batch X in the
 * parameterisation param (width: 'standard''s n), layouts as tpk_netsor_ntk. */
typedef int (*app_direct_ntk)(const tpk_program *p, const tpk_phi_registry *reg,
                              const tpk_array *X, int all_outputs, int param, size_t width,
                              const tpk_progress *prog, tpk_array **K, tpk_array **Th,
                              double *err, tpk_ctx *ctx);
/* The job's NTK recursion where its solver row has one (and the job asks for the NTK), else
 * NULL: the interpreter's NTK pass. */
app_direct_ntk app_job_solver_ntk(const tpk_job *job);

/* The architectures' direct recursions (app/solvers.c's table; tpk_arch.direct). */
int app_transformer_direct(const tpk_program *p, const tpk_phi_registry *reg, const tpk_array *X,
                           int all_outputs, const tpk_progress *prog, tpk_array **K, double *err,
                           tpk_ctx *ctx);
int app_gru_direct(const tpk_program *p, const tpk_phi_registry *reg, const tpk_array *X,
                   int all_outputs, const tpk_progress *prog, tpk_array **K, double *err,
                   tpk_ctx *ctx);

#endif
