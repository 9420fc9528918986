/* Jobs behind gpkernel and netsor: program + inputs → kernel or finite-width run → atomic HDF5. */
#include "tpk/job.h"
#include "tpk/alloc.h"

#include "job-impl.h"
#include "tpk/clock.h"
#include "tpk/io.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static double f_sqrt(double x, const double *params)
{
    (void)params;
    return sqrt(x);
}

tpk_phi_registry *tpk_job_registry(tpk_ctx *ctx)
{
    tpk_phi_registry *reg = tpk_phi_registry_alloc(ctx);
    if (reg == NULL)
        return NULL;
    /* layernorm programs divide by sqrt of a Moment; older registries lack it */
    tpk_ctx probe;
    tpk_ctx_init_from(&probe, ctx);
    tpk_phi *s = tpk_phi_alloc(reg, "sqrt", &probe);
    if (s != NULL) {
        tpk_phi_free(s);
    } else if (probe.status == TPK_ENOMEM) {
        tpk_error_at(ctx, TPK_ENOMEM, probe.src_file, probe.src_line, "%s", probe.msg);
        tpk_phi_registry_free(reg);
        return NULL;
    } else if (tpk_phi_register(reg, "sqrt", f_sqrt, 0, NULL,
                                TPK_PHI_CONTROLLED | TPK_PHI_POLY_BOUNDED, ctx)) {
        tpk_phi_registry_free(reg);
        return NULL;
    }
    return reg;
}

/* Everything a job holds; freed in one place. X and Xt are the inputs (read from files into
 * Xown / Xtown, or borrowed from the caller of the *_arrays entry points). */
typedef struct job_state {
    tpk_phi_registry *reg;
    tpk_program *prog;
    const tpk_array *X, *Xt;
    tpk_array *Xown, *Xtown, *Xall;
    tpk_input_info xi, ti;
    tpk_h5out *out;
    tpk_param_set *sets; /* the user's sets plus an automatic T */
    char tbuf[32];
    int blocks;          /* evaluated block by block (tpk_kernel_job): plan once, at load */
    tpk_allocator al;    /* a kernel job's: what its state was allocated from */
} job_state;

static void job_state_free(job_state *s, tpk_ctx *ctx)
{
    tpk_h5out_abort(s->out);
    tpk_program_free(s->prog);
    tpk_array_free(s->Xown);
    tpk_array_free(s->Xtown);
    tpk_array_free(s->Xall);
    tpk_phi_registry_free(s->reg);
    tpk_free(ctx, s->sets);
}

static int user_set(const tpk_job *job, const char *name)
{
    for (int i = 0; i < job->nsets; i++)
        if (strcmp(job->sets[i].name, name) == 0)
            return 1;
    return 0;
}

static const char *input_name(const tpk_job *job)
{
    return job->input ? job->input : "input";
}

/* The program from its file or, with job->source, from its text. */
static tpk_program *load_program(const tpk_job *job, const tpk_netsor_opts *o,
                                 const tpk_phi_registry *reg, tpk_ctx *ctx)
{
    if (job->source)
        return tpk_netsor_load_string(job->program ? job->program : "<program>", job->source, o,
                                      reg, ctx);
    if (!job->program) {
        TPK_ERROR(ctx, TPK_EINVAL, "a job needs a program");
        return NULL;
    }
    return tpk_netsor_load_file(job->program, o, reg, ctx);
}

/* Load the program for these inputs. Sequence inputs (N×T×d) fix the number of time steps:
 * a program with a parameter T that the user did not set gets T from the input. */
static int load(const tpk_job *job, job_state *s, tpk_ctx *ctx)
{
    s->sets = tpk_calloc(ctx, (size_t)job->nsets + 1, sizeof *s->sets);
    if (!s->sets)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    if (job->nsets)
        memcpy(s->sets, job->sets, (size_t)job->nsets * sizeof *s->sets);
    tpk_netsor_opts o = {.sets = s->sets, .nsets = job->nsets, .netsor_plus = job->netsor_plus,
                         .plan_when_used = !s->blocks, .explain = job->explain != NULL,
                         .diag = job->explain};
    s->prog = load_program(job, &o, s->reg, ctx);
    if (!s->prog)
        return ctx->status;
    size_t T = s->X->ndim >= 3 ? s->X->dims[1] : 1;
    if ((size_t)s->prog->nslots != T && s->X->ndim >= 3 && tpk_program_param(s->prog, "T") &&
        !user_set(job, "T")) {
        snprintf(s->tbuf, sizeof s->tbuf, "%zu", T);
        s->sets[job->nsets] = (tpk_param_set){.name = "T", .value = s->tbuf};
        o.nsets = job->nsets + 1;
        tpk_program_free(s->prog);
        s->prog = load_program(job, &o, s->reg, ctx);
        if (!s->prog)
            return ctx->status;
    }
    int slots = s->prog->nslots;
    /* A program whose T follows the input takes any length: the message must not name the
     * program's default T as the one length (issue 39, item 6: "must be N×4×d"). */
    if (slots > 1 && s->X->ndim != 3 && tpk_program_param(s->prog, "T") && !user_set(job, "T"))
        return TPK_ERROR(ctx, TPK_EINVAL,
                         "%s: the program reads sequences (input x[t]); the input must be N×T×d "
                         "(N sequences of T steps of d features, any T), not %s",
                         input_name(job), s->X->ndim == 2 ? "a matrix of vectors (N×d)"
                                                          : "an array of rank 4");
    if (slots > 1 && (s->X->ndim != 3 || s->X->dims[1] != (size_t)slots))
        return TPK_ERROR(ctx, TPK_EINVAL,
                         "%s: the program reads sequences of %d steps (input x[t]); the input must be "
                         "N×%d×d, not %s", input_name(job), slots, slots,
                         s->X->ndim == 3 ? "of another length (set T)" : "a matrix of vectors");
    return TPK_OK;
}

/* Test items must look like the training items. */
static int check_test_shape(const tpk_job *job, const job_state *s, tpk_ctx *ctx)
{
    return tpk_array_check_items(s->Xt, job->test, s->X, input_name(job), ctx);
}

/* Read inputs and load the program. */
static int prepare_inputs(const tpk_job *job, job_state *s, tpk_ctx *ctx)
{
    s->reg = tpk_job_registry(ctx);
    if (!s->reg)
        return ctx->status;
    s->X = s->Xown = tpk_io_read(job->input, &s->xi, ctx);
    if (!s->X || tpk_array_check_scale(s->X, job->input, ctx))
        return ctx->status;
    if (job->test) {
        s->Xt = s->Xtown = tpk_io_read(job->test, &s->ti, ctx);
        if (!s->Xt || tpk_array_check_scale(s->Xt, job->test, ctx))
            return ctx->status;
        int st = check_test_shape(job, s, ctx);
        if (st)
            return st;
    }
    return load(job, s, ctx);
}

/* Read inputs, load the program, open the output. */
static int prepare(const tpk_job *job, job_state *s, tpk_ctx *ctx)
{
    if ((!job->program && !job->source) || !job->input || !job->output)
        return TPK_ERROR(ctx, TPK_EINVAL, "a job needs a program, an input and an output");
    int plan; /* a bad TPK_PLAN is an error before any work, whichever evaluator runs */
    int st = tpk_netsor_plan_from_env(&plan, ctx);
    if (st == TPK_OK)
        st = prepare_inputs(job, s, ctx);
    if (st)
        return st;
    /* Open before computing: an unwritable path fails at once, not after the work; an output
     * that is an input would destroy it. */
    const char *ins[] = {job->program, job->input, job->test};
    if (tpk_io_check_output(job->output, ins, 3, ctx) ||
        tpk_h5out_check_replace(job->output, job->force, ctx))
        return ctx->status;
    s->out = tpk_h5out_open(job->output, ctx);
    return s->out ? TPK_OK : ctx->status;
}

/* A caller's array as an input: rank 2..4, not empty, finite (the first bad value named by the
 * entry point, the array and its 0-based index: tpk_array_check_input). `what` is the array's
 * name, with the name the job gives it (job->input, job->test) beside it. */
static int check_array(const char *entry, const char *arg, const char *label, const tpk_array *a,
                       tpk_ctx *ctx)
{
    char what[300];
    snprintf(what, sizeof what, label ? "%s (%s)" : "%s", arg, label);
    if (!a || !a->data || a->ndim < 2 || a->ndim > TPK_ARRAY_MAXDIM)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: %s: inputs are arrays of rank 2..%d (N×d, N×T×d, "
                         "...)", entry, what, TPK_ARRAY_MAXDIM);
    for (int k = 0; k < a->ndim; k++)
        if (a->dims[k] == 0)
            return TPK_ERROR(ctx, TPK_EINVAL, "%s: %s: empty input (axis %d has length 0)", entry,
                             what, k);
    return tpk_array_check_input(a, entry, what, ctx);
}

/* The *_arrays entry points (`entry` names the one called): borrowed inputs, checked, and the
 * program loaded for them. */
static int prepare_arrays(const char *entry, const tpk_job *job, const tpk_array *X,
                          const tpk_array *Xt, job_state *s, tpk_ctx *ctx)
{
    int plan;
    int st = tpk_netsor_plan_from_env(&plan, ctx);
    if (st == TPK_OK)
        st = check_array(entry, "X", job->input, X, ctx);
    if (!st && Xt)
        st = check_array(entry, "Xt", job->test, Xt, ctx);
    if (st)
        return st;
    s->X = X;
    s->Xt = Xt;
    if (Xt && (st = check_test_shape(job, s, ctx)))
        return st;
    if (!(s->reg = tpk_job_registry(ctx)))
        return ctx->status;
    return load(job, s, ctx);
}

/* The direct recursion that computes this job, or NULL for the NETSOR interpreter: the one
 * decision of app/solvers.c. */
static tpk_direct_kernel job_direct(const tpk_job *job)
{
    return tpk_job_solver(job, NULL);
}

/* The limit kernel of a batch: the architecture's direct recursion or the NETSOR evaluator. */
static int batch_kernel(const tpk_job *job, const job_state *s, const tpk_array *X,
                        const tpk_progress *prog, tpk_array **K, double *err, tpk_ctx *ctx)
{
    tpk_direct_kernel direct = job_direct(job);
    if (direct)
        return direct(s->prog, s->reg, X, job->all_outputs, prog, K, err, ctx);
    return tpk_netsor_kernel_progress(s->prog, X, job->all_outputs, prog, K, err, ctx);
}

/* The train block of a kernel of train and test stacked into one batch, and with a test set the
 * test × train block and the test diagonal; K is consumed. */
static int split_blocks(const job_state *s, tpk_array *K, tpk_array **Ktr, tpk_array **Kx,
                        tpk_array **kd, tpk_ctx *ctx)
{
    *Ktr = *Kx = *kd = NULL;
    if (!s->Xt) {
        *Ktr = K;
        return TPK_OK;
    }
    /* Layout is input-major: index a·O + o; the train block comes first. */
    size_t per = K->dims[0] / s->Xall->dims[0];
    size_t ntr = s->X->dims[0] * per, nte = s->Xt->dims[0] * per, dm[1] = {nte};
    *Ktr = tpk_array_block(K, 0, ntr, 0, ntr, ctx);
    *Kx = tpk_array_block(K, ntr, nte, 0, ntr, ctx);
    *kd = tpk_array_alloc(1, dm, ctx);
    if (*kd)
        for (size_t i = 0; i < nte; i++)
            (*kd)->data[i] = K->data[(ntr + i) * K->dims[1] + ntr + i];
    tpk_array_free(K);
    if (!*Ktr || !*Kx || !*kd) {
        tpk_array_free(*Ktr);
        tpk_array_free(*Kx);
        tpk_array_free(*kd);
        *Ktr = *Kx = *kd = NULL;
        return ctx->status;
    }
    return TPK_OK;
}

/* X and Xt stacked into s->Xall (X alone when there is no test set). */
static int stack_inputs(job_state *s, tpk_ctx *ctx)
{
    if (!s->Xt || s->Xall)
        return TPK_OK;
    size_t dims[TPK_ARRAY_MAXDIM];
    memcpy(dims, s->X->dims, sizeof dims);
    dims[0] = s->X->dims[0] + s->Xt->dims[0];
    s->Xall = tpk_array_alloc(s->X->ndim, dims, ctx);
    if (!s->Xall)
        return ctx->status;
    size_t nx = tpk_array_size(s->X);
    memcpy(s->Xall->data, s->X->data, nx * sizeof(double));
    memcpy(s->Xall->data + nx, s->Xt->data, tpk_array_size(s->Xt) * sizeof(double));
    return TPK_OK;
}

/* The kernel of train and test stacked into one batch, split into the train block (*Ktr), and
 * with a test set the test × train block (*Kx) and the test diagonal (*kd); with the NTK
 * (job->kernel), its blocks likewise in T[0..2] (T may be NULL for the NNGP alone). */
static int kernel_blocks(const tpk_job *job, job_state *s, tpk_array **Ktr, tpk_array **Kx,
                         tpk_array **kd, tpk_array **T, double *err, tpk_ctx *ctx)
{
    *Ktr = *Kx = *kd = NULL;
    if (T)
        T[0] = T[1] = T[2] = NULL;
    int st0 = stack_inputs(s, ctx);
    if (st0)
        return st0;
    tpk_array *K = NULL, *Th = NULL;
    const tpk_array *X = s->Xall ? s->Xall : s->X;
    app_direct_ntk dn = app_job_solver_ntk(job);
    int st = job->kernel == TPK_JOB_NNGP
                 ? batch_kernel(job, s, X, job->progress, &K, err, ctx)
             : dn != NULL ? dn(s->prog, s->reg, X, job->all_outputs, job->ntk_param,
                               job->ntk_width, job->progress, &K, &Th, err, ctx)
                 : tpk_netsor_ntk_ex(s->prog, X, job->all_outputs,
                                     &(tpk_ntk_opts){job->ntk_param, job->ntk_width, job->progress},
                                     &K, &Th, err, ctx);
    if (st)
        return st;
    if (Th != NULL && (T == NULL || (st = split_blocks(s, Th, &T[0], &T[1], &T[2], ctx)))) {
        if (T == NULL)
            tpk_array_free(Th);
        tpk_array_free(K);
        return st;
    }
    st = split_blocks(s, K, Ktr, Kx, kd, ctx);
    if (st && T)
        for (int i = 0; i < 3; i++) {
            tpk_array_free(T[i]);
            T[i] = NULL;
        }
    return st;
}

/* An attribute `name` of `value`: an integer where it is the value of an integer parameter
 * `param` of the program (declared by integer arithmetic, tpk_program.param_integer: L, T, cols,
 * circular; the README promises integers as integers), else a double or a string. */
static int param_attr(tpk_h5out *out, const tpk_program *prog, const char *name,
                      const char *value, const char *param, tpk_ctx *ctx)
{
    for (int i = 0; param && prog->param_integer && i < prog->nparams; i++) {
        if (strcmp(prog->param_name[i], param) != 0 || !prog->param_integer[i])
            continue;
        char *end;
        errno = 0;
        double v = strtod(prog->param_value[i], &end); /* the value as run */
        if (*end == '\0' && errno == 0 && v == floor(v) && fabs(v) < 9007199254740992.0) {
            char *e2;
            double w = strtod(value, &e2); /* a flag's own value must be that number */
            if (*e2 == '\0' && w == v)
                return tpk_h5out_attr_int(out, "/", name, (long long)v, ctx);
        }
        break;
    }
    return tpk_h5out_attr_auto(out, "/", name, value, ctx);
}

int tpk_job_describe(tpk_h5out *out, const tpk_job *job, const tpk_program *prog,
                     const char *path, const char *fallback_label, tpk_ctx *ctx)
{
    int st = tpk_h5out_provenance(out, job->argc, job->argv, ctx);
    if (!st) st = tpk_h5out_attr_str(out, "/", "architecture", job->label ? job->label : fallback_label, ctx);
    if (!st) st = tpk_h5out_attr_str(out, "/", "program", path ? path : job->program, ctx);
    /* its text and SHA-256 as run: the file may change later (issue 39, item 9) */
    if (!st) st = tpk_h5out_program_attrs(out, path ? path : job->program,
                                          path ? NULL : job->source, ctx);
    for (int i = 0; !st && i < prog->nparams; i++)
        st = param_attr(out, prog, prog->param_name[i], prog->param_value[i],
                        prog->param_name[i], ctx);
    for (int i = 0; !st && i < job->nattrs; i++)
        st = param_attr(out, prog, job->attrs[i].name, job->attrs[i].value, job->attrs[i].param,
                        ctx);
    if (!st) st = tpk_h5out_attr_int(out, "/", "all_outputs", job->all_outputs, ctx);
    return st;
}

/* The common attributes, then the inputs. */
static int describe(tpk_h5out *out, const tpk_job *job, const job_state *s, tpk_ctx *ctx)
{
    const char *solver;
    int st = tpk_job_describe(out, job, s->prog, NULL, "program", ctx);
    if (!st && tpk_job_solver(job, &solver))
        st = tpk_h5out_attr_str(out, "/", "evaluator", "direct-recursion", ctx);
    if (!st)
        st = tpk_h5out_attr_str(out, "/", "solver", solver, ctx);
    if (!st) st = tpk_h5out_input_attrs(out, "input", &s->xi, s->X, ctx);
    if (!st && s->Xt) st = tpk_h5out_input_attrs(out, "test", &s->ti, s->Xt, ctx);
    return st;
}

/* Copy the [r0, r0+rows) × [c0, c0+cols) block of the square matrix K. */
static void summarise(const tpk_job *job, const job_state *s, const tpk_array *K, double err,
                      double secs, const char *what)
{
    if (!job->summary)
        return;
    size_t n = K->dims[0];
    double dmin = INFINITY, dmax = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        dmin = fmin(dmin, K->data[i * n + i]);
        dmax = fmax(dmax, K->data[i * n + i]);
    }
    int nf = tpk_program_family_instructions(s->prog);
    if ((strcmp(what, "kernel") == 0 || strcmp(what, "ntk") == 0) &&
        (!tpk_program_limit_rolled(s->prog) || job->kernel != TPK_JOB_NNGP))
        nf = 0; /* the limit evaluator took the unrolled form (the NTK always does) */
    if (strcmp(what, "kernel") == 0 && job_direct(job)) /* the architecture's recursion */
        fprintf(job->summary, "%s: %s (%s) by its direct recursion, %d outputs\n", what,
                job->label ? job->label : "program", job->program, s->prog->noutputs);
    else if (nf > 0) /* the rolled form computed it (docs/netsor.md "Rolled programs") */
        fprintf(job->summary, "%s: %s (%s), rolled: %d family instructions, %d outputs\n", what,
                job->label ? job->label : "program", job->program, nf, s->prog->noutputs);
    else
        fprintf(job->summary, "%s: %s (%s), %d instructions, %d outputs\n", what,
                job->label ? job->label : "program", job->program, s->prog->ninstr,
                s->prog->noutputs);
    fprintf(job->summary, "  input   %s (N=%zu%s)\n", job->input, s->X->dims[0],
            s->X->ndim >= 3 ? ", sequences" : "");
    if (s->Xt)
        fprintf(job->summary, "  test    %s (M=%zu)\n", job->test, s->Xt->dims[0]);
    fprintf(job->summary, "  %-7s %zux%zu, diagonal in [%.6g, %.6g], K[0][1]=%.6g",
            strcmp(what, "ntk") == 0 ? "ntk" : "kernel", n, n, dmin, dmax,
            n > 1 ? K->data[1] : K->data[0]);
    if (err >= 0)
        fprintf(job->summary, ", error estimate %.2e", err);
    fprintf(job->summary, "\n  wrote   %s in %.3f s\n", job->output, secs);
}

/* Named dimensions of the kernel datasets (tpk_h5out_dims: xarray shows them): train / test
 * items, or train_readout / test_readout when a kernel has several readouts per item. */
static int kernel_dims(tpk_h5out *out, const char *K, const char *Kx, const char *kd,
                       int per_item, tpk_ctx *ctx)
{
    const char *tr[2] = {per_item ? "train_readout" : "train",
                         per_item ? "train_readout2" : "train2"};
    const char *te[2] = {per_item ? "test_readout" : "test", tr[1]};
    int st = tpk_h5out_dims(out, K, tr, 2, ctx);
    if (!st && Kx) st = tpk_h5out_dims(out, Kx, te, 2, ctx);
    if (!st && kd) st = tpk_h5out_dims(out, kd, te, 1, ctx);
    return st;
}

int tpk_job_ntk_attrs(tpk_h5out *out, const tpk_job *job, tpk_ctx *ctx)
{
    if (job->kernel == TPK_JOB_NNGP)
        return TPK_OK;
    int st = tpk_h5out_attr_str(out, "/", "ntk_parameterization",
                                tpk_ntk_param_name(job->ntk_param), ctx);
    if (!st && job->ntk_param == TPK_NTK_PARAM_STANDARD)
        st = tpk_h5out_attr_int(out, "/", "ntk_width", (long long)job->ntk_width, ctx);
    return st;
}

int tpk_job_kernel_dims_named(tpk_h5out *out, const char *K, const char *Kx, const char *kd,
                              int per_item, tpk_ctx *ctx)
{
    return kernel_dims(out, K, Kx, kd, per_item, ctx);
}

int tpk_job_kernel_dims(tpk_h5out *out, const tpk_array *K, const tpk_array *X, int test,
                        tpk_ctx *ctx)
{
    return kernel_dims(out, "/kernel", test ? "/kernel_test_train" : NULL,
                       test ? "/kernel_test_diag" : NULL, K->dims[0] != X->dims[0], ctx);
}

int tpk_job_kernel(const tpk_job *job, tpk_ctx *ctx)
{
    job_state s = {0};
    tpk_array *Ktr = NULL, *Kx = NULL, *kd = NULL, *T[3] = {NULL, NULL, NULL};
    double t0 = tpk_wall_seconds(), err = 0;
    int st = job->kernel < TPK_JOB_NNGP || job->kernel > TPK_JOB_BOTH ||
                     job->ntk_param < TPK_NTK_PARAM_NTK || job->ntk_param > TPK_NTK_PARAM_STANDARD
                 ? TPK_ERROR(ctx, TPK_EINVAL, "tpk_job: kernel %d or NTK parameterisation %d "
                             "unknown", job->kernel, job->ntk_param)
                 : prepare(job, &s, ctx);
    if (!st)
        st = kernel_blocks(job, &s, &Ktr, &Kx, &kd, T, &err, ctx);
    int nngp = job->kernel != TPK_JOB_NTK;
    if (!st && nngp) st = tpk_h5out_write(s.out, "/kernel", Ktr, ctx);
    if (!st && nngp && Kx) st = tpk_h5out_write(s.out, "/kernel_test_train", Kx, ctx);
    if (!st && nngp && kd) st = tpk_h5out_write(s.out, "/kernel_test_diag", kd, ctx);
    if (!st && nngp) st = tpk_job_kernel_dims(s.out, Ktr, s.X, Kx != NULL, ctx);
    if (!st && T[0]) st = tpk_h5out_write(s.out, "/ntk", T[0], ctx);
    if (!st && T[1]) st = tpk_h5out_write(s.out, "/ntk_test_train", T[1], ctx);
    if (!st && T[2]) st = tpk_h5out_write(s.out, "/ntk_test_diag", T[2], ctx);
    if (!st && T[0])
        st = kernel_dims(s.out, "/ntk", T[1] ? "/ntk_test_train" : NULL,
                         T[2] ? "/ntk_test_diag" : NULL, T[0]->dims[0] != s.X->dims[0], ctx);
    if (!st && T[0])
        st = tpk_job_ntk_attrs(s.out, job, ctx);
    if (!st) st = describe(s.out, job, &s, ctx);
    if (!st) st = tpk_h5out_attr_double(s.out, "/", "error_estimate", err, ctx);
    if (!st) {
        st = tpk_h5out_commit(s.out, ctx);
        s.out = NULL;
    }
    if (!st)
        summarise(job, &s, nngp ? Ktr : T[0], err, tpk_wall_seconds() - t0, nngp ? "kernel" : "ntk");
    if (!st && nngp && T[0] && job->summary) /* --kernel=both: the NTK's line too */
        fprintf(job->summary, "  ntk     %zux%zu, Θ[0][0]=%.6g, Θ[0][1]=%.6g (%s parameterization)\n",
                T[0]->dims[0], T[0]->dims[1], T[0]->data[0],
                T[0]->dims[1] > 1 ? T[0]->data[1] : T[0]->data[0],
                tpk_ntk_param_name(job->ntk_param));
    tpk_array_free(Ktr);
    tpk_array_free(Kx);
    tpk_array_free(kd);
    for (int i = 0; i < 3; i++)
        tpk_array_free(T[i]);
    job_state_free(&s, ctx);
    return st;
}

int tpk_job_kernels_arrays(const tpk_job *job, const tpk_array *X, const tpk_array *Xt,
                           tpk_array *K[3], tpk_array *T[3], double *err, tpk_ctx *ctx)
{
    job_state s = {0};
    double e = 0;
    for (int i = 0; i < 3; i++)
        K[i] = T[i] = NULL;
    tpk_job both = *job;
    both.kernel = TPK_JOB_BOTH;
    int st = prepare_arrays("tpk_job_kernels_arrays", &both, X, Xt, &s, ctx);
    if (!st)
        st = kernel_blocks(&both, &s, &K[0], &K[1], &K[2], T, &e, ctx);
    job_state_free(&s, ctx);
    if (!st && err)
        *err = e;
    return st;
}

int tpk_job_kernel_arrays(const tpk_job *job, const tpk_array *X, const tpk_array *Xt,
                          tpk_array **K, tpk_array **Kxt, tpk_array **kdiag, double *err,
                          tpk_ctx *ctx)
{
    job_state s = {0};
    tpk_array *B[3] = {NULL, NULL, NULL}, *T[3] = {NULL, NULL, NULL};
    double e = 0;
    *K = NULL;
    if (Kxt)
        *Kxt = NULL;
    if (kdiag)
        *kdiag = NULL;
    int st = Xt && (!Kxt || !kdiag)
                 ? TPK_ERROR(ctx, TPK_EINVAL, "a test input needs Kxt and kdiag for its blocks")
             : job->kernel == TPK_JOB_BOTH
                 ? TPK_ERROR(ctx, TPK_EINVAL, "tpk_job_kernel_arrays gives one kernel: ask for "
                             "TPK_JOB_NNGP or TPK_JOB_NTK, or call tpk_job_kernels_arrays")
                 : prepare_arrays("tpk_job_kernel_arrays", job, X, Xt, &s, ctx);
    if (!st)
        st = kernel_blocks(job, &s, &B[0], &B[1], &B[2], T, &e, ctx);
    job_state_free(&s, ctx);
    if (st)
        return st;
    tpk_array **keep = job->kernel == TPK_JOB_NTK ? T : B, **drop = keep == T ? B : T;
    for (int i = 0; i < 3; i++)
        tpk_array_free(drop[i]);
    *K = keep[0];
    if (Kxt)
        *Kxt = keep[1];
    if (kdiag)
        *kdiag = keep[2];
    if (err)
        *err = e;
    return TPK_OK;
}

int tpk_job_run(const tpk_job *job, size_t width, uint64_t seed, tpk_ctx *ctx)
{
    job_state s = {0};
    tpk_array *Khat = NULL, *y = NULL;
    double t0 = tpk_wall_seconds();
    int st = TPK_OK;
    if (job->test)
        st = TPK_ERROR(ctx, TPK_EINVAL, "a finite-width run takes no test set (put all inputs in --input)");
    else if (width < 1)
        st = TPK_ERROR(ctx, TPK_EINVAL, "the width must be at least 1");
    if (!st)
        st = prepare(job, &s, ctx);
    if (!st)
        st = tpk_netsor_run_progress(s.prog, s.X, width, seed, job->all_outputs, job->progress,
                                     &Khat, &y, ctx);
    /* --ntk: the same network's empirical NTK, by the executor's backward pass */
    tpk_array *That = NULL;
    if (!st && job->kernel != TPK_JOB_NNGP)
        st = tpk_netsor_run_ntk(s.prog, s.X, width, seed, job->all_outputs, job->ntk_param, NULL,
                                &That, ctx);
    if (!st) st = tpk_h5out_write(s.out, "/kernel_hat", Khat, ctx);
    if (!st) st = tpk_h5out_write(s.out, "/outputs", y, ctx);
    if (!st) st = kernel_dims(s.out, "/kernel_hat", NULL, NULL, Khat->dims[0] != s.X->dims[0], ctx);
    if (!st && That) st = tpk_h5out_write(s.out, "/ntk_hat", That, ctx);
    if (!st && That)
        st = kernel_dims(s.out, "/ntk_hat", NULL, NULL, That->dims[0] != s.X->dims[0], ctx);
    if (!st && That)
        st = tpk_h5out_attr_str(s.out, "/", "ntk_parameterization",
                                tpk_ntk_param_name(job->ntk_param), ctx);
    tpk_array_free(That);
    if (!st) st = tpk_h5out_dims(s.out, "/outputs", (const char *const[]){"train", "output"}, 2, ctx);
    if (!st) st = describe(s.out, job, &s, ctx);
    if (!st) st = tpk_h5out_attr_int(s.out, "/", "width", (long long)width, ctx);
    if (!st) st = tpk_h5out_attr_int(s.out, "/", "seed", (long long)seed, ctx);
    if (!st) {
        st = tpk_h5out_commit(s.out, ctx);
        s.out = NULL;
    }
    if (!st)
        summarise(job, &s, Khat, -1, tpk_wall_seconds() - t0, "finite-width run");
    tpk_array_free(Khat);
    tpk_array_free(y);
    job_state_free(&s, ctx);
    return st;
}

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

/* Rows [r0, r0 + rows) of one step's outputs f (N × O) into dst (rows × O). */
static void split_rows(const double *f, size_t O, size_t r0, size_t rows, double *dst)
{
    memcpy(dst, f + r0 * O, rows * O * sizeof *dst);
}

int tpk_job_train(const tpk_job *job, const tpk_job_train_opts *t, tpk_ctx *ctx)
{
    if (t == NULL || t->labels == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "training needs targets (--labels=SPEC)");
    if (t->width < 1 || t->seeds < 1 || t->nsteps < 1 || t->steps == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "training needs a width, at least one seed and the "
                         "steps to record");
    if (!(isfinite(t->lr) && t->lr > 0))
        return TPK_ERROR(ctx, TPK_EINVAL, "the learning rate must be finite and > 0 (got %g)",
                         t->lr);
    job_state s = {0};
    double t0 = tpk_wall_seconds();
    tpk_array *y = NULL, *f = NULL, *ftr = NULL, *fte = NULL, *loss = NULL;
    size_t *at = tpk_malloc(ctx, t->nsteps * sizeof *at);
    long long *coord = NULL;
    int st = at ? prepare(job, &s, ctx) : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    if (!st) {
        memcpy(at, t->steps, t->nsteps * sizeof *at);
        qsort(at, t->nsteps, sizeof *at, cmp_size);
        y = tpk_io_read(t->labels, NULL, ctx);
        st = y ? stack_inputs(&s, ctx) : ctx->status;
    }
    size_t ntr = s.X ? s.X->dims[0] : 0, nte = s.Xt ? s.Xt->dims[0] : 0, N = ntr + nte;
    size_t nat = t->nsteps, S = t->seeds, O = 0;
    if (!st) { /* targets: one row per training input, one column per output */
        O = y->ndim == 1 ? 1 : y->dims[1];
        if (y->dims[0] != ntr || y->ndim > 2)
            st = TPK_ERROR(ctx, TPK_EINVAL, "--labels %s: %zu rows for %zu training inputs "
                           "(targets are N or N × outputs)", t->labels, y->dims[0], ntr);
    }
    if (!st) {
        size_t d3[3] = {nat, N, O}, d4[4] = {S, nat, ntr, O}, d4t[4] = {S, nat, nte, O};
        f = tpk_array_alloc(3, d3, ctx);
        ftr = f ? tpk_array_alloc(4, d4, ctx) : NULL;
        fte = ftr && nte ? tpk_array_alloc(4, d4t, ctx) : NULL;
        loss = ftr && (!nte || fte) ? tpk_array_alloc2(S, nat, ctx) : NULL;
        coord = tpk_malloc(ctx, (nat > S ? nat : S) * sizeof *coord);
        if (!loss || !coord)
            st = ctx->status ? ctx->status : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    }
    for (size_t k = 0; k < S && !st; k++) {
        if ((st = tpk_progress_report(job->progress, "networks", k, S, ctx)))
            break;
        tpk_train_opts o = {.width = t->width, .seed = t->seed + k, .lr = t->lr, .at = at,
                            .nat = nat, .all_outputs = job->all_outputs};
        st = tpk_netsor_train(s.prog, s.Xall ? s.Xall : s.X, ntr, y, &o, f, loss->data + k * nat,
                              ctx);
        for (size_t j = 0; j < nat && !st; j++) {
            const double *fj = f->data + j * N * O;
            split_rows(fj, O, 0, ntr, ftr->data + (k * nat + j) * ntr * O);
            if (fte)
                split_rows(fj, O, ntr, nte, fte->data + (k * nat + j) * nte * O);
        }
    }
    if (!st) st = tpk_progress_report(job->progress, "networks", S, S, ctx);
    static const char *const dn[4] = {"seed", "step", "train", "output"};
    static const char *const dt[4] = {"seed", "step", "test", "output"};
    if (!st) {
        for (size_t j = 0; j < nat; j++)
            coord[j] = (long long)at[j];
        st = tpk_h5out_coord_ints(s.out, "step", coord, nat, ctx);
    }
    if (!st) {
        for (size_t k = 0; k < S; k++)
            coord[k] = (long long)(t->seed + k);
        st = tpk_h5out_coord_ints(s.out, "seed", coord, S, ctx);
    }
    if (!st) st = tpk_h5out_write(s.out, "/train_outputs", ftr, ctx);
    if (!st) st = tpk_h5out_dims(s.out, "/train_outputs", dn, 4, ctx);
    if (!st && fte) st = tpk_h5out_write(s.out, "/test_outputs", fte, ctx);
    if (!st && fte) st = tpk_h5out_dims(s.out, "/test_outputs", dt, 4, ctx);
    if (!st) st = tpk_h5out_write(s.out, "/loss", loss, ctx);
    if (!st) st = tpk_h5out_dims(s.out, "/loss", dn, 2, ctx);
    if (!st) st = describe(s.out, job, &s, ctx);
    if (!st) st = tpk_h5out_attr_int(s.out, "/", "width", (long long)t->width, ctx);
    if (!st) st = tpk_h5out_attr_double(s.out, "/", "lr", t->lr, ctx);
    if (!st) st = tpk_h5out_attr_str(s.out, "/", "ntk_parameterization", "ntk", ctx);
    if (!st) st = tpk_h5out_attr_str(s.out, "/", "loss", "(1/2N) sum (f - y)^2, N targets", ctx);
    if (!st) st = tpk_h5out_attr_str(s.out, "/", "labels", t->labels, ctx);
    if (!st) {
        st = tpk_h5out_commit(s.out, ctx);
        s.out = NULL;
    }
    if (!st && job->summary) {
        double l0 = 0, l1 = 0;
        for (size_t k = 0; k < S; k++) {
            l0 += loss->data[k * nat] / (double)S;
            l1 += loss->data[k * nat + nat - 1] / (double)S;
        }
        fprintf(job->summary, "  trained %zu networks of width %zu, %zu steps at lr %g: mean "
                "loss %.4g (step %zu) -> %.4g (step %zu)\n  wrote   %s in %.3f s\n", S,
                t->width, at[nat - 1], t->lr, l0, at[0], l1, at[nat - 1], job->output,
                tpk_wall_seconds() - t0);
    }
    tpk_free(ctx, at);
    tpk_free(ctx, coord);
    tpk_array_free(y);
    tpk_array_free(f);
    tpk_array_free(ftr);
    tpk_array_free(fte);
    tpk_array_free(loss);
    job_state_free(&s, ctx);
    return st;
}

int tpk_job_train_arrays(const tpk_job *job, const tpk_array *X, size_t ntrain,
                         const tpk_array *y, const tpk_train_opts *o, tpk_array *f, double *loss,
                         tpk_ctx *ctx)
{
    job_state s = {0};
    if (o == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_job_train_arrays: no options");
    tpk_train_opts t = *o;
    t.all_outputs = job->all_outputs;
    int st = prepare_arrays("tpk_job_train_arrays", job, X, NULL, &s, ctx);
    if (!st)
        st = tpk_netsor_train(s.prog, X, ntrain, y, &t, f, loss, ctx);
    job_state_free(&s, ctx);
    return st;
}

int tpk_job_run_arrays(const tpk_job *job, const tpk_array *X, size_t width, uint64_t seed,
                       tpk_array **Khat, tpk_array **y, tpk_ctx *ctx)
{
    job_state s = {0};
    *Khat = NULL;
    if (y)
        *y = NULL;
    int st = TPK_OK;
    if (job->test)
        st = TPK_ERROR(ctx, TPK_EINVAL, "a finite-width run takes no test set (put all inputs in the input)");
    else if (width < 1)
        st = TPK_ERROR(ctx, TPK_EINVAL, "the width must be at least 1");
    if (!st)
        st = prepare_arrays("tpk_job_run_arrays", job, X, NULL, &s, ctx);
    if (!st)
        st = tpk_netsor_run_progress(s.prog, s.X, width, seed, job->all_outputs, job->progress,
                                     Khat, y, ctx);
    job_state_free(&s, ctx);
    return st;
}

/* ---- the kernel job of a program, block by block (job-impl.h, app/job_block.c) ------------ */

/* The job's kernel of a batch: the NNGP, or with kernel = NTK the NTK (its solver row's, or the
 * interpreter's pass), the NNGP beside it dropped. */
static int kjob_program_batch(tpk_kernel_job *kj, const tpk_array *Xb, tpk_array **K, double *err,
                              tpk_ctx *ctx)
{
    const job_state *s = kj->self;
    const tpk_job *job = &kj->job;
    if (job->kernel == TPK_JOB_NNGP)
        return batch_kernel(job, s, Xb, NULL, K, err, ctx);
    app_direct_ntk dn = app_job_solver_ntk(job);
    tpk_array *Kn = NULL;
    int st = dn != NULL ? dn(s->prog, s->reg, Xb, job->all_outputs, job->ntk_param,
                             job->ntk_width, NULL, &Kn, K, err, ctx)
                        : tpk_netsor_ntk_ex(s->prog, Xb, job->all_outputs,
                                            &(tpk_ntk_opts){job->ntk_param, job->ntk_width, NULL},
                                            &Kn, K, err, ctx);
    tpk_array_free(Kn);
    return st;
}

static int kjob_program_describe(const tpk_kernel_job *kj, tpk_h5out *out, tpk_ctx *ctx)
{
    int st = describe(out, &kj->job, kj->self, ctx);
    return st ? st : tpk_job_ntk_attrs(out, &kj->job, ctx);
}

static void kjob_program_release(void *self)
{
    if (self) { /* the allocator the job was prepared with (its _free takes no context) */
        job_state *s = self;
        tpk_ctx c;
        tpk_ctx_init(&c);
        c.alloc = s->al;
        job_state_free(s, &c);
        tpk_free(&c, s);
    }
}

static const kjob_impl kjob_program = {"program", kjob_program_batch, NULL, kjob_program_describe,
                                       kjob_program_release};

int tpk_kjob_program_init(tpk_kernel_job *kj, tpk_ctx *ctx)
{
    const tpk_job *job = &kj->job;
    if ((!job->program && !job->source) || (!job->input && !kj->borrowed))
        return TPK_ERROR(ctx, TPK_EINVAL, "a kernel job needs a program and an input");
    if (job->kernel == TPK_JOB_BOTH)
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED, "a kernel job computes one kernel, block by "
                         "block: the NNGP or the NTK, not both");
    job_state *s = tpk_calloc(ctx, 1, sizeof *s);
    if (!s)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    s->al = tpk_ctx_allocator(ctx);
    kj->impl = &kjob_program;
    kj->self = s;
    s->blocks = 1;
    int st = kj->borrowed
                 ? prepare_arrays("tpk_kernel_job_alloc_arrays", job, kj->X, kj->Xt, s, ctx)
                 : prepare_inputs(job, s, ctx);
    if (st)
        return st;
    /* An entry of a batch-coupled program depends on the other inputs of its batch: a block
     * evaluated on its own items is not the block of the whole kernel. */
    if (s->prog->features & TPK_FEAT_BATCHNORM)
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED,
                         "%s: a batch-coupled program (batchnorm) has entries that depend on the "
                         "other inputs of its batch: its kernel cannot be computed block by block",
                         job->program ? job->program : "program");
    kj->X = s->X;
    kj->Xt = s->Xt;
    /* input-major readouts: every output with all_outputs, else the last one (tpk_netsor_kernel) */
    kj->readouts = job->all_outputs ? (size_t)s->prog->noutputs : 1;
    return TPK_OK;
}
