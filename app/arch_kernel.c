/* Architectures without a command line (include/tpk/archs.h): gpkernel --arch's flag checks,
 * settings and program choice from data, then the kernel in memory or a gpkernel job over files. */
#include "job-impl.h"
#include "tpk/alloc.h"
#include "tpk/archs.h"

#include <stdlib.h>
#include <string.h>

#define ARCH_MAX_FLAGS 32

/* A request resolved: flags with their parameters, the settings, the program's path. */
typedef struct resolved {
    tpk_arch_flag fl[ARCH_MAX_FLAGS];
    char param[ARCH_MAX_FLAGS][64];
    char attr[ARCH_MAX_FLAGS][64];   /* the flag with '_' for '-', as gpkernel records it */
    tpk_param_set sets[TPK_ARCH_MAX_SETS];
    int nsets;
    char lists[2048];
    char prog[4200];
    const char *program;             /* prog, or NULL for a row without a program */
} resolved;

/* root/rel, or the shipped file (TPK_ENOTFOUND listing where it was looked for). */
static int locate(const char *root, const char *rel, char *buf, size_t len, tpk_ctx *ctx)
{
    if (!root)
        return tpk_shipped_find(rel, buf, len, ctx);
    snprintf(buf, len, "%s/%s", root, rel);
    return TPK_OK;
}

static int resolve(const tpk_arch *a, const tpk_arch_opts *o, resolved *r, tpk_ctx *ctx)
{
    if (!a || !o)
        return TPK_ERROR(ctx, TPK_EINVAL, "an architecture request needs the architecture and options");
    if (o->nflags < 0 || o->nflags > ARCH_MAX_FLAGS || (o->nflags && !o->flags))
        return TPK_ERROR(ctx, TPK_EINVAL, "at most %d architecture flags", ARCH_MAX_FLAGS);
    if (o->nsets < 0 || (o->nsets && !o->sets))
        return TPK_ERROR(ctx, TPK_EINVAL, "bad parameter settings");
    tpk_phi_registry *reg = tpk_job_registry(ctx);
    if (!reg)
        return ctx->status;
    int st = TPK_OK;
    for (int i = 0; !st && i < o->nflags; i++) {
        const char *flag = o->flags[i].flag, *value = o->flags[i].value;
        if (flag && !value && o->flags[i].param)
            /* {"depth", NULL, "3"}: an initialiser of tpk 0.1.0's member order (archs.h) */
            st = TPK_ERROR(ctx, TPK_EINVAL, "architecture flag %d ('%s') has no value but a "
                           "param '%s': tpk_arch_flag is {flag, value, param}, so write "
                           "{\"%s\", \"%s\"} (an initialiser {\"%s\", NULL, \"%s\"} has the "
                           "order of tpk 0.1.0)", i, flag, o->flags[i].param, flag,
                           o->flags[i].param, flag, o->flags[i].param);
        else if (!flag || !value)
            st = TPK_ERROR(ctx, TPK_EINVAL, "architecture flag %d has no name or value", i);
        else if (!tpk_arch_flag_param(a, flag, r->param[i], sizeof r->param[i]))
            st = TPK_ERROR(ctx, TPK_EINVAL, "unknown flag '%s' of architecture %s (see gpkernel "
                           "--list-archs)", flag, a->name);
        else
            st = tpk_arch_check(a, flag, value, reg, ctx);
        if (!st) {
            r->fl[i] = (tpk_arch_flag){.flag = flag, .param = r->param[i], .value = value};
            snprintf(r->attr[i], sizeof r->attr[i], "%s", flag);
            for (char *c = r->attr[i]; *c; c++)
                if (*c == '-')
                    *c = '_';
        }
    }
    tpk_phi_registry_free(reg);
    if (!st)
        st = tpk_arch_sets(a, r->fl, o->nflags, o->sets, o->nsets, r->sets, TPK_ARCH_MAX_SETS,
                           &r->nsets, r->lists, sizeof r->lists, ctx);
    const char *program = NULL;
    if (!st)
        st = tpk_arch_program(a, o->layernorm, r->fl, o->nflags, &program, ctx);
    if (!st && program && !(st = locate(o->root, program, r->prog, sizeof r->prog, ctx)))
        r->program = r->prog;
    return st;
}

/* The architecture's job on arrays (entry names the caller in messages): one kernel into
 * K/Kxt/kdiag (tpk_job_kernel_arrays), or with T both kernels' blocks (tpk_job_kernels_arrays). */
static int on_arrays(const char *entry, const tpk_arch *a, const tpk_arch_opts *o,
                     const tpk_array *X, const tpk_array *Xt, tpk_array **K, tpk_array **Kxt,
                     tpk_array **kdiag, tpk_array *T[3], double *err, tpk_ctx *ctx)
{
    const int cnn = a && a->custom == tpk_cnn_job; /* its job also runs on arrays */
    if (a && a->custom && !cnn)
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED, "architecture %s is computed by its own job, which "
                         "writes HDF5: run it with tpk_arch_job", a->name);
    int st = tpk_array_check_input(X, entry, "X", ctx);
    if (st || (st = tpk_array_check_input(Xt, entry, "Xt", ctx)))
        return st;
    resolved *r = tpk_calloc(ctx, 1, sizeof *r);
    if (!r)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    st = resolve(a, o, r, ctx);
    if (!st) {
        tpk_job job = {.label = a->name, .program = r->program, .direct = a->direct,
                       .sets = r->sets, .nsets = r->nsets, .all_outputs = o->all_outputs,
                       .progress = o->progress, .kernel = o->kernel, .ntk_param = o->ntk_param,
                       .ntk_width = o->ntk_width};
        if (cnn) {
            tpk_array *B[3];
            st = tpk_cnn_job_arrays(&job, X, Xt, B, T, err, ctx);
            *K = B[0];
            if (Kxt)
                *Kxt = B[1];
            else
                tpk_array_free(B[1]);
            if (kdiag)
                *kdiag = B[2];
            else
                tpk_array_free(B[2]);
        } else if (T != NULL) {
            tpk_array *B[3];
            st = tpk_job_kernels_arrays(&job, X, Xt, B, T, err, ctx);
            *K = B[0];
            *Kxt = B[1];
            *kdiag = B[2];
        } else {
            st = tpk_job_kernel_arrays(&job, X, Xt, K, Kxt, kdiag, err, ctx);
        }
    }
    tpk_free(ctx, r);
    return st;
}

int tpk_arch_kernel(const tpk_arch *a, const tpk_arch_opts *o, const tpk_array *X,
                    const tpk_array *Xt, tpk_array **K, tpk_array **Kxt, tpk_array **kdiag,
                    double *err, tpk_ctx *ctx)
{
    *K = NULL;
    if (Kxt)
        *Kxt = NULL;
    if (kdiag)
        *kdiag = NULL;
    return on_arrays("tpk_arch_kernel", a, o, X, Xt, K, Kxt, kdiag, NULL, err, ctx);
}

int tpk_arch_kernels(const tpk_arch *a, const tpk_arch_opts *o, const tpk_array *X,
                     const tpk_array *Xt, tpk_array *K[3], tpk_array *T[3], double *err,
                     tpk_ctx *ctx)
{
    for (int i = 0; i < 3; i++)
        K[i] = T[i] = NULL;
    return on_arrays("tpk_arch_kernels", a, o, X, Xt, &K[0], &K[1], &K[2], T, err, ctx);
}

tpk_kernel_job *tpk_arch_kernel_job(const tpk_arch *a, const tpk_arch_opts *o,
                                    const tpk_array *X, const tpk_array *Xt, tpk_ctx *ctx)
{
    if (a && a->custom) {
        TPK_ERROR(ctx, TPK_EUNSUPPORTED, "architecture %s is computed by its own job, which "
                  "reads files: no kernel job on arrays", a->name);
        return NULL;
    }
    if (tpk_array_check_input(X, "tpk_arch_kernel_job", "X", ctx) ||
        tpk_array_check_input(Xt, "tpk_arch_kernel_job", "Xt", ctx))
        return NULL;
    resolved *r = tpk_calloc(ctx, 1, sizeof *r);
    if (!r)
        return NULL;
    tpk_kernel_job *kj = NULL;
    if (!resolve(a, o, r, ctx)) {
        tpk_job job = {.label = a->name, .program = r->program, .direct = a->direct,
                       .sets = r->sets, .nsets = r->nsets, .all_outputs = o->all_outputs,
                       .progress = o->progress};
        kj = tpk_kernel_job_alloc_arrays(a, &job, X, Xt, ctx);
    }
    if (!kj) {
        tpk_free(ctx, r);
        return NULL;
    }
    /* the job's settings point into r: it lives as long as the job */
    kj->owned = r;
    kj->owned_al = tpk_ctx_allocator(ctx);
    return kj;
}

int tpk_arch_custom_job(const tpk_arch *a, const tpk_job *job, tpk_ctx *ctx)
{
    /* the rows with a job of their own say themselves which kernels they compute */
    return a->custom(job, ctx);
}

int tpk_arch_job(const tpk_arch *a, const tpk_arch_opts *o, const char *input, const char *test,
                 const char *output, tpk_ctx *ctx)
{
    resolved *r = tpk_calloc(ctx, 1, sizeof *r);
    char in[4200];
    tpk_attr attrs[ARCH_MAX_FLAGS + 1];
    int nattrs = 0;
    if (!r)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    int st = resolve(a, o, r, ctx);
    if (!st && !output)
        st = TPK_ERROR(ctx, TPK_EINVAL, "an architecture job needs an output file");
    if (!st && !input && !(st = locate(o->root, a->input, in, sizeof in, ctx)))
        input = in;
    if (!st) {
        if (o->layernorm)
            attrs[nattrs++] = (tpk_attr){.name = "layernorm", .value = "1"};
        /* as gpkernel: flags under their own names where those differ from the parameter */
        for (int f = 0; f < o->nflags; f++)
            if (strcmp(r->attr[f], r->fl[f].param) != 0)
                attrs[nattrs++] = (tpk_attr){.name = r->attr[f], .value = r->fl[f].value,
                                             .param = r->fl[f].param};
        tpk_job job = {.label = a->name, .program = r->program, .direct = a->direct,
                       .sets = r->sets, .nsets = r->nsets, .input = input, .test = test, .output = output,
                       .all_outputs = o->all_outputs, .attrs = attrs, .nattrs = nattrs,
                       .progress = o->progress, .force = o->force, .kernel = o->kernel,
                       .ntk_param = o->ntk_param, .ntk_width = o->ntk_width};
        st = a->custom ? tpk_arch_custom_job(a, &job, ctx) : tpk_job_kernel(&job, ctx);
    }
    tpk_free(ctx, r);
    return st;
}
