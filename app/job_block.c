/* Kernel jobs block by block (issue 16): a job prepared once, its kernel on any block of items
 * as the same evaluator computes the whole job, for the tiles of gpkernel-mpi (docs/scale-out.md). */
#include "tpk/alloc.h"
#include "tpk/archs.h"

#include "job-impl.h"
#include "tpk/alloc.h"

#include <stdlib.h>
#include <string.h>

/* The job prepared from its files, or (X != NULL) on the caller's arrays. */
static tpk_kernel_job *kernel_job(const struct tpk_arch *a, const tpk_job *job, const tpk_array *X,
                                  const tpk_array *Xt, tpk_ctx *ctx)
{
    if (!job) {
        TPK_ERROR(ctx, TPK_EINVAL, "a kernel job needs a job");
        return NULL;
    }
    if (a && a->custom && a->custom != tpk_cnn_job) {
        /* the attention row samples score covariances (1/sqrt(n) logits) over the whole batch */
        TPK_ERROR(ctx, TPK_EUNSUPPORTED,
                  "architecture %s is computed by its own job over the whole batch, not block by "
                  "block (its Gaussian 1/n limit: --program=programs/attention.nsr --netsor-plus)",
                  a->name);
        return NULL;
    }
    if (X && a && a->custom) {
        TPK_ERROR(ctx, TPK_EUNSUPPORTED, "architecture %s reads its inputs from files (its own "
                  "job): no kernel job on arrays", a->name);
        return NULL;
    }
    tpk_kernel_job *kj = tpk_calloc(ctx, 1, sizeof *kj);
    if (!kj)
        return NULL;
    kj->alloc = tpk_ctx_allocator(ctx);
    kj->job = *job;
    kj->borrowed = X != NULL;
    kj->X = X;
    kj->Xt = Xt;
    int st = a && a->custom ? tpk_kjob_cnn_init(kj, ctx) : tpk_kjob_program_init(kj, ctx);
    if (st) {
        tpk_kernel_job_free(kj);
        return NULL;
    }
    return kj;
}

tpk_kernel_job *tpk_kernel_job_alloc(const struct tpk_arch *a, const tpk_job *job, tpk_ctx *ctx)
{
    return kernel_job(a, job, NULL, NULL, ctx);
}

tpk_kernel_job *tpk_kernel_job_alloc_arrays(const struct tpk_arch *a, const tpk_job *job,
                                            const tpk_array *X, const tpk_array *Xt,
                                            tpk_ctx *ctx)
{
    if (!X) {
        TPK_ERROR(ctx, TPK_EINVAL, "a kernel job on arrays needs its training inputs");
        return NULL;
    }
    return kernel_job(a, job, X, Xt, ctx);
}

void tpk_kernel_job_free(tpk_kernel_job *kj)
{
    if (!kj)
        return;
    if (kj->impl)
        kj->impl->release(kj->self);
    tpk_mem_free(&kj->owned_al, kj->owned);
    tpk_allocator al = kj->alloc;
    tpk_mem_free(&al, kj);
}

size_t tpk_kernel_job_items(const tpk_kernel_job *kj, int test)
{
    const tpk_array *A = test ? kj->Xt : kj->X;
    return A ? A->dims[0] : 0;
}

size_t tpk_kernel_job_readouts(const tpk_kernel_job *kj)
{
    return kj->readouts;
}

const tpk_array *tpk_kernel_job_input(const tpk_kernel_job *kj, int test)
{
    return test ? kj->Xt : kj->X;
}

/* items [i0, i0 + n) of A into dst (whole items, row-major). */
static void copy_items(const tpk_array *A, size_t i0, size_t n, double *dst)
{
    size_t per = tpk_array_item_size(A);
    memcpy(dst, A->data + i0 * per, n * per * sizeof(double));
}

/* items [i0, i0 + n) of A as an array of their own (NULL: out of memory, in ctx). */
static tpk_array *items(const tpk_array *A, size_t i0, size_t n, tpk_ctx *ctx)
{
    size_t dims[TPK_ARRAY_MAXDIM];
    memcpy(dims, A->dims, sizeof dims);
    dims[0] = n;
    tpk_array *B = tpk_array_alloc(A->ndim, dims, ctx);
    if (B)
        copy_items(A, i0, n, B->data);
    return B;
}

/* An off-diagonal block by the implementation's cross hook: only the block's pairs, not the
 * (nr + nc)² kernel of the stacked items (a distributed kernel's tiles). */
static int block_cross(tpk_kernel_job *kj, const tpk_array *R, size_t r0, size_t nr,
                       const tpk_array *C, size_t c0, size_t nc, double *K, size_t ld,
                       double *diag, double *err, tpk_ctx *ctx)
{
    tpk_array *Xr = items(R, r0, nr, ctx), *Xc = Xr ? items(C, c0, nc, ctx) : NULL, *Kb = NULL;
    double e = 0;
    int st = Xr && Xc ? kj->impl->cross(kj, Xr, Xc, &Kb, diag, &e, ctx) : ctx->status;
    tpk_array_free(Xr);
    tpk_array_free(Xc);
    if (st)
        return st;
    const size_t O = kj->readouts, rows = nr * O, cols = nc * O;
    if (Kb->ndim != 2 || Kb->dims[0] != rows || Kb->dims[1] != cols) {
        tpk_array_free(Kb);
        return TPK_ERROR(ctx, TPK_EINVAL, "kernel block: the %s evaluator returned %zux%zu for "
                         "a %zux%zu block", kj->impl->name, Kb->dims[0], Kb->dims[1], rows, cols);
    }
    for (size_t i = 0; i < rows; i++)
        memcpy(K + i * ld, Kb->data + i * cols, cols * sizeof(double));
    tpk_array_free(Kb);
    if (err)
        *err = e;
    return TPK_OK;
}

int tpk_kernel_job_block(tpk_kernel_job *kj, int test, size_t r0, size_t nr, size_t c0,
                         size_t nc, double *K, size_t ld, double *diag, double *err,
                         tpk_ctx *ctx)
{
    const tpk_array *R = test ? kj->Xt : kj->X, *C = kj->X;
    if (!R)
        return TPK_ERROR(ctx, TPK_EINVAL, "the job has no test inputs");
    if (nr == 0 || nc == 0 || r0 > R->dims[0] || nr > R->dims[0] - r0 || c0 > C->dims[0] ||
        nc > C->dims[0] - c0)
        return TPK_ERROR(ctx, TPK_EINVAL,
                         "kernel block: rows %zu..%zu of %zu %s items, columns %zu..%zu of %zu "
                         "training items: empty or outside the inputs", r0, r0 + nr, R->dims[0],
                         test ? "test" : "training", c0, c0 + nc, C->dims[0]);
    const size_t O = kj->readouts, rows = nr * O, cols = nc * O;
    if (ld < cols)
        return TPK_ERROR(ctx, TPK_EINVAL, "kernel block: leading dimension %zu < %zu columns", ld,
                         cols);
    /* A diagonal block is the kernel of its own items; any other block is cut from the kernel
     * of the column items followed by the row items, the order in which gpkernel stacks
     * training before test items: row a, column c of the block is then a lower-triangle entry
     * (a after c), as in the whole job's kernel for a tile below the diagonal. */
    int square = !test && r0 == c0 && nr == nc;
    if (!square && kj->impl->cross) {
        int st = block_cross(kj, R, r0, nr, C, c0, nc, K, ld, diag, err, ctx);
        if (st != TPK_EUNSUPPORTED)
            return st;
        tpk_ctx_clear(ctx);
    }
    tpk_array *Xb = NULL, *Kb = NULL;
    size_t dims[TPK_ARRAY_MAXDIM];
    memcpy(dims, C->dims, sizeof dims);
    dims[0] = square ? nc : nc + nr;
    if (!(Xb = tpk_array_alloc(C->ndim, dims, ctx)))
        return ctx->status;
    copy_items(C, c0, nc, Xb->data);
    if (!square)
        copy_items(R, r0, nr, Xb->data + nc * tpk_array_item_size(C));
    double e = 0;
    int st = kj->impl->batch(kj, Xb, &Kb, &e, ctx);
    tpk_array_free(Xb);
    if (st)
        return st;
    const size_t side = dims[0] * O, off = square ? 0 : cols;
    if (Kb->ndim != 2 || Kb->dims[0] != side || Kb->dims[1] != side) {
        tpk_array_free(Kb);
        return TPK_ERROR(ctx, TPK_EINVAL, "kernel block: the %s evaluator returned %zux%zu for "
                         "%zu items of %zu readouts", kj->impl->name, Kb->dims[0], Kb->dims[1],
                         dims[0], O);
    }
    for (size_t i = 0; i < rows; i++)
        memcpy(K + i * ld, Kb->data + (off + i) * side, cols * sizeof(double));
    if (diag)
        for (size_t i = 0; i < rows; i++)
            diag[i] = Kb->data[(off + i) * side + off + i];
    tpk_array_free(Kb);
    if (err)
        *err = e;
    return TPK_OK;
}

int tpk_kernel_job_describe(const tpk_kernel_job *kj, tpk_h5out *out, tpk_ctx *ctx)
{
    int st = kj->impl->describe(kj, out, ctx);
    if (st)
        return st;
    /* the datasets' dimensions: the NNGP's /kernel..., or the NTK's /ntk... */
    const int ntk = kj->job.kernel == TPK_JOB_NTK, test = kj->Xt != NULL;
    return tpk_job_kernel_dims_named(out, ntk ? "/ntk" : "/kernel",
                                     !test ? NULL : ntk ? "/ntk_test_train" : "/kernel_test_train",
                                     !test ? NULL : ntk ? "/ntk_test_diag" : "/kernel_test_diag",
                                     kj->readouts > 1, ctx);
}
