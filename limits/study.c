/* Finite-width studies (include/tpk/study.h; theory.md §7): prepare the program, inputs and
 * limit; run a ladder of widths × seeds through the finite-width executor with checkpoints and
 * resume; write the raw data and its analysis as one atomic HDF5 file. */
#include "tpk/study.h"
#include "tpk/alloc.h"

#include "tpk/clock.h"
#include "tpk/job.h"

#include "limits-impl.h"

#include <math.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_SETS 64
/* Settings the study adds to the architecture's (CNN filter and padding, sequence length,
 * image rows and columns). */
#define EXTRA_SETS 16
/* The progress callback is called at most this often (seconds). */
#define PROGRESS_SECONDS 0.2

struct tpk_study {
    tpk_allocator al;         /* tpk_study_alloc's: of this struct and its arrays */
    tpk_study_info info;
    tpk_study_stats stats;
    size_t W, S, N, NN;       /* widths, seeds, compared coordinates, N² */
    size_t *widths;           /* W */
    double *nw;               /* W, as doubles */
    uint64_t seed;
    int all_outputs;
    int ntk, ntk_param;       /* the NTK compared (tpk_study_opts.kernel) */
    tpk_program *prog;
    tpk_array *xall, *x, *K;  /* all inputs read, the used ones, the limit kernel */
    double *rows;             /* the used inputs' rows in xall */
    tpk_input_info input;
    double *khat;             /* W × S × N × N */
    double *y;                /* W × S × N sampled outputs */
    double *done;             /* W × S, 1 when finished */
    tpk_study_analysis *analysis;
    char *output;
    char program[4096];
    char config[4096];        /* what the raw data depends on; a checkpoint must match it */
    char partial[4200];
};

/* ---- The program ------------------------------------------------------------------------------- */

/* A shipped file (programs/, data/): under o->root when set, else where tpk_shipped_find finds
 * it (TPK_ENOTFOUND listing the places tried). */
static int shipped(const tpk_study_opts *o, const char *rel, char *buf, size_t len, tpk_ctx *ctx)
{
    if (!o->root)
        return tpk_shipped_find(rel, buf, len, ctx);
    snprintf(buf, len, "%s/%s", o->root, rel);
    return TPK_OK;
}

/* The flag the user typed for `param`, or NULL. */
static const char *typed_flag(const tpk_study_opts *o, const char *param)
{
    for (int f = 0; f < o->nflags; f++)
        if (o->flags[f].param && strcmp(o->flags[f].param, param) == 0)
            return o->flags[f].flag;
    return NULL;
}

/* Settings of gpkernel's custom jobs that are not program parameters, translated for the
 * finite-width comparison of the program itself: attention runs its 1/n program (the 1/sqrt(n)
 * limit is not a GP, gpattention compares with it); the CNNs' padding and filter become the
 * program's circular and k (kh, kw), their readouts (gap/flatten, computed by gpkernel's direct
 * recursion) are not programs' outputs: the study compares the per-position readouts. */
static int job_settings(const tpk_study_opts *o, tpk_param_set *sets, int *n, char buf[3][32],
                        tpk_ctx *ctx)
{
    const tpk_arch *a = o->arch;
    int k = 0, twod = strcmp(a->name, "cnn2d") == 0;
    tpk_param_set out[MAX_SETS + EXTRA_SETS];
    for (int i = 0; i < *n; i++) {
        const char *nm = sets[i].name, *v = sets[i].value;
        if (strcmp(nm, "scaling") == 0) {
            if (strcmp(v, "inv-sqrt-n") == 0)
                return TPK_ERROR(ctx, TPK_EUNSUPPORTED,
                                 "--logit-scaling=inv-sqrt-n: that limit is not a GP (theory.md "
                                 "§5); gpattention compares finite widths with it");
            if (strcmp(v, "inv-n") != 0)
                return TPK_ERROR(ctx, TPK_EINVAL, "--logit-scaling must be inv-n (got '%s')", v);
        } else if (strcmp(nm, "R") == 0 || strcmp(nm, "rng_seed") == 0 ||
                   strcmp(nm, "readout") == 0 || strcmp(nm, "conv") == 0) {
            if (!typed_flag(o, nm))
                continue; /* the architecture's default for gpkernel, not asked for here */
            return TPK_ERROR(ctx, TPK_EINVAL, "--arch=%s: --%s is a setting of gpkernel's %s; "
                             "gplimits compares the program's own outputs (--all-outputs for "
                             "all of them)", a->name, typed_flag(o, nm),
                             strcmp(nm, "R") == 0 || strcmp(nm, "rng_seed") == 0
                                 ? "1/sqrt(n) attention limit" : "direct CNN recursion");
        } else if (strcmp(nm, "padding") == 0) {
            if (strcmp(v, "circular") != 0 && strcmp(v, "zero") != 0)
                return TPK_ERROR(ctx, TPK_EINVAL, "--padding must be circular or zero (got '%s')",
                                 v);
            out[k++] = (tpk_param_set){"circular", strcmp(v, "circular") == 0 ? "1" : "0"};
        } else if (strcmp(nm, "filter") == 0) {
            const char *comma = strchr(v, ',');
            if (comma && !twod)
                return TPK_ERROR(ctx, TPK_EINVAL, "--filter=k takes one size for cnn1d (got '%s')",
                                 v);
            snprintf(buf[0], 32, "%.*s", comma ? (int)(comma - v) : 31, v);
            snprintf(buf[1], 32, "%.31s", comma ? comma + 1 : buf[0]);
            if (twod) {
                out[k++] = (tpk_param_set){"kh", buf[0]};
                out[k++] = (tpk_param_set){"kw", buf[1]};
            } else {
                out[k++] = (tpk_param_set){"k", buf[0]};
            }
        } else {
            out[k++] = sets[i];
        }
        if (k > MAX_SETS + 4)
            return TPK_ERROR(ctx, TPK_EINVAL, "too many parameter settings");
    }
    memcpy(sets, out, (size_t)k * sizeof *sets);
    *n = k;
    return TPK_OK;
}

static int set_by_user(const tpk_study_opts *o, const char *name)
{
    for (int i = 0; i < o->nsets; i++)
        if (strcmp(o->sets[i].name, name) == 0)
            return 1;
    return 0;
}

/* Load the program for these inputs: sequences N×T×d set a parameter T, images N×rows×cols×C
 * set rows and cols and are given to the back ends as N×(rows·cols)×C (the same memory), unless
 * the user set those (as tpk_job_kernel does). sets has room for 3 more. */
static tpk_program *load_program(const char *path, const tpk_study_opts *o, tpk_param_set *sets,
                                 int nsets, tpk_array *x, const tpk_phi_registry *reg,
                                 tpk_ctx *ctx)
{
    char buf[2][32];
    tpk_netsor_opts no = {.sets = sets, .nsets = nsets, .netsor_plus = 1, .explain = 0};
    tpk_program *p = tpk_netsor_load_file(path, &no, reg, ctx);
    if (!p)
        return NULL;
    int extra = 0;
    if (x->ndim == 3 && tpk_program_param(p, "T") && !set_by_user(o, "T") &&
        (size_t)p->nslots != x->dims[1]) {
        snprintf(buf[0], sizeof buf[0], "%zu", x->dims[1]);
        sets[nsets + extra++] = (tpk_param_set){"T", buf[0]};
    } else if (x->ndim == 4 && tpk_program_param(p, "rows") && tpk_program_param(p, "cols")) {
        if (!set_by_user(o, "rows") && !set_by_user(o, "cols")) {
            snprintf(buf[0], sizeof buf[0], "%zu", x->dims[1]);
            snprintf(buf[1], sizeof buf[1], "%zu", x->dims[2]);
            sets[nsets + extra++] = (tpk_param_set){"rows", buf[0]};
            sets[nsets + extra++] = (tpk_param_set){"cols", buf[1]};
        }
        x->dims[1] *= x->dims[2];
        x->dims[2] = x->dims[3];
        x->dims[3] = 0;
        x->ndim = 3;
    }
    if (extra) {
        tpk_program_free(p);
        no.nsets = nsets + extra;
        p = tpk_netsor_load_file(path, &no, reg, ctx);
    }
    return p;
}

/* Pick K evenly spaced items (rows along axis 0) of x; rows[i] gets the row of item i. */
static tpk_array *subset(const tpk_array *x, size_t K, double *rows, tpk_ctx *ctx)
{
    size_t N = x->dims[0], item = tpk_array_item_size(x);
    size_t dims[TPK_ARRAY_MAXDIM];
    memcpy(dims, x->dims, sizeof dims);
    dims[0] = K;
    tpk_array *s = tpk_array_alloc(x->ndim, dims, ctx);
    if (!s)
        return NULL;
    for (size_t i = 0; i < K; i++) {
        size_t r = K == N ? i : (size_t)((double)i * (double)N / (double)K);
        rows[i] = (double)r;
        memcpy(s->data + i * item, x->data + r * item, item * sizeof(double));
    }
    return s;
}

/* The program's settings (architecture defaults, flags, fixed settings, then the user's) and its
 * path into s->program. sets has room for MAX_SETS + EXTRA_SETS. */
static int program_settings(tpk_study *s, const tpk_study_opts *o, tpk_param_set *sets,
                            int *nsets, char *lists, size_t nlists, char jbuf[3][32],
                            tpk_ctx *ctx)
{
    *nsets = 0;
    if (!o->arch) {
        if (o->nsets > MAX_SETS)
            return TPK_ERROR(ctx, TPK_EINVAL, "more than %d parameter settings", MAX_SETS);
        for (int i = 0; i < o->nsets; i++)
            sets[(*nsets)++] = o->sets[i];
        snprintf(s->program, sizeof s->program, "%s", o->program);
        return TPK_OK;
    }
    const char *rel = NULL;
    if (!o->arch->program)
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED, "--arch=%s has no NETSOR program to run at "
                         "finite width", o->arch->name);
    if (tpk_arch_program(o->arch, o->layernorm, o->flags, o->nflags, &rel, ctx) ||
        tpk_arch_sets(o->arch, o->flags, o->nflags, o->sets, o->nsets, sets, MAX_SETS + 8, nsets,
                      lists, nlists, ctx) ||
        job_settings(o, sets, nsets, jbuf, ctx))
        return ctx->status;
    return shipped(o, rel, s->program, sizeof s->program, ctx);
}

/* Raw-data identity: program file digest, inputs, widths, seeds, the program's final parameter
 * values (what the raw data depend on). */
static int make_config(tpk_study *s, tpk_ctx *ctx)
{
    char psha[65] = "";
    size_t len = 0;
    tpk_ctx lc;
    tpk_ctx_init_from(&lc, ctx);
    char *buf = tpk_io_read_text(s->program, &len, &lc);
    if (!buf && lc.status == TPK_ENOMEM) /* a digest of part of the file names another program */
        return TPK_ERROR(ctx, TPK_ENOMEM, "%s", lc.msg);
    if (buf)
        tpk_sha256_hex(buf, len, psha);
    tpk_free(ctx, buf);
    char xsha[65];
    tpk_sha256_array_hex(s->x, xsha);
    char *pos = s->config;
    size_t left = sizeof s->config;
    int c = snprintf(pos, left, "gplimits/1 program_sha256=%s inputs_sha256=%s seeds=%zu "
                     "seed=%llu all_outputs=%d%s widths=", psha, xsha, s->S,
                     (unsigned long long)s->seed, s->all_outputs,
                     !s->ntk ? "" : s->ntk_param == TPK_NTK_PARAM_TP ? " kernel=ntk(tp)"
                                                                      : " kernel=ntk");
    for (size_t i = 0; i < s->W && c > 0 && (size_t)c < left; i++)
        c += snprintf(pos + c, left - (size_t)c, "%zu,", s->widths[i]);
    for (int i = 0; i < s->prog->nparams && c > 0 && (size_t)c < left; i++)
        c += snprintf(pos + c, left - (size_t)c, " %s=%s", s->prog->param_name[i],
                      s->prog->param_value[i]);
    return TPK_OK;
}

/* ---- Checkpoints --------------------------------------------------------------------------- */

/* The checkpoint: /khat, /outputs, /done (W × S, 1 when finished) and the configuration, written
 * atomically (core/io: a crash mid-write keeps the previous checkpoint). */
static int write_checkpoint(const tpk_study *s, tpk_ctx *ctx)
{
    tpk_h5out *h = tpk_h5out_open(s->partial, ctx);
    if (!h)
        return ctx->status;
    tpk_array a4 = {4, {s->W, s->S, s->N, s->N}, s->khat, {NULL, NULL}};
    tpk_array a3 = {3, {s->W, s->S, s->N, 0}, s->y, {NULL, NULL}};
    tpk_array a2 = {2, {s->W, s->S, 0, 0}, s->done, {NULL, NULL}};
    tpk_h5out_write(h, "/khat", &a4, ctx);
    tpk_h5out_write(h, "/outputs", &a3, ctx);
    tpk_h5out_write(h, "/done", &a2, ctx);
    tpk_h5out_attr_str(h, "/", "gplimits_config", s->config, ctx);
    tpk_h5out_attr_str(h, "/", "kernel", s->ntk ? "ntk" : "nngp", ctx);
    if (s->ntk)
        tpk_h5out_attr_str(h, "/", "ntk_parameterization",
                           tpk_ntk_param_name(s->ntk_param), ctx);
    return tpk_h5out_commit(h, ctx);
}

/* Load raw data from a checkpoint (prefix "") or a finished output ("/per_seed") if its
 * configuration matches. */
static int read_checkpoint(tpk_study *s, const char *file, const char *prefix, tpk_ctx *ctx)
{
    char cfg[sizeof s->config + 1];
    tpk_ctx lc;
    tpk_ctx_init_from(&lc, ctx);
    int st = tpk_io_read_attr_str(file, "/", "gplimits_config", cfg, sizeof cfg, &lc);
    if (st == TPK_ENOTFOUND)
        return TPK_ERROR(ctx, TPK_EFORMAT, "%s: not a gplimits checkpoint", file);
    if (st == TPK_EINVAL)
        cfg[0] = '\0'; /* longer than any configuration of ours: different settings */
    else if (st)
        return TPK_ERROR(ctx, st, "cannot open checkpoint %s", lc.msg);
    if (strcmp(cfg, s->config) != 0)
        return TPK_ERROR(ctx, TPK_EINVAL,
                         "%s was made by a run with different settings (program, inputs, "
                         "widths, seeds); remove it or rerun with the same options.\n"
                         "  checkpoint: %s\n  this run:   %s",
                         file, cfg, s->config);
    const char *names[3] = {"/khat", "/outputs", "/done"};
    double *dst[3] = {s->khat, s->y, s->done};
    size_t want[3] = {s->W * s->S * s->NN, s->W * s->S * s->N, s->W * s->S};
    int nread = prefix[0] ? 2 : 3; /* a finished file has every seed done */
    if (nread == 2)
        for (size_t k = 0; k < want[2]; k++)
            s->done[k] = 1;
    for (int i = 0; i < nread; i++) {
        char spec[4300];
        snprintf(spec, sizeof spec, "%s:%s%s", file, prefix, names[i]);
        tpk_array *a = tpk_io_read(spec, NULL, ctx);
        if (!a)
            return ctx->status;
        if (tpk_array_size(a) != want[i]) {
            tpk_array_free(a);
            return TPK_ERROR(ctx, TPK_EFORMAT, "%s: %s has the wrong size", file, names[i]);
        }
        memcpy(dst[i], a->data, want[i] * sizeof(double));
        tpk_array_free(a);
    }
    return TPK_OK;
}

/* What an earlier run left: a checkpoint (needs resume), or with resume a finished output. */
static int load_earlier(tpk_study *s, const tpk_study_opts *o, tpk_ctx *ctx)
{
    int have_partial = access(s->partial, F_OK) == 0;
    s->info.source = TPK_STUDY_FRESH;
    if (have_partial && !o->resume)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s exists (an interrupted run): rerun with --resume, or "
                         "remove it to start over", s->partial);
    if (have_partial) {
        if (read_checkpoint(s, s->partial, "", ctx))
            return ctx->status;
        s->info.source = TPK_STUDY_FROM_CHECKPOINT;
    } else if (o->resume) {
        /* Re-analysis: a finished output with the same raw-data settings is reused as is, so
         * the statistics options can change without rerunning. */
        if (access(s->output, F_OK) == 0) {
            if (read_checkpoint(s, s->output, "/per_seed", ctx))
                return ctx->status;
            s->info.source = TPK_STUDY_FROM_OUTPUT;
        } else {
            s->info.source = TPK_STUDY_NO_CHECKPOINT;
        }
    }
    return TPK_OK;
}

/* ---- Plan -------------------------------------------------------------------------------------- */

static int check_opts(const tpk_study_opts *o, tpk_ctx *ctx)
{
    static const char fn[] = "tpk_study_alloc";
    if (!o || !o->output || !o->widths)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: NULL options, output or widths", fn);
    if (!o->arch == !o->program)
        return TPK_ERROR(ctx, TPK_EINVAL, "give exactly one of --arch and --program (see --help)");
    if (o->nflags > 0 && !o->flags)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: NULL flags", fn);
    if (o->nsets > 0 && !o->sets)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: NULL settings", fn);
    if (o->nwidths < 2)
        return TPK_ERROR(ctx, TPK_EINVAL, "--widths: need at least 2 widths to fit a rate");
    for (size_t i = 0; i < o->nwidths; i++)
        if (o->widths[i] == 0 || (i > 0 && o->widths[i] <= o->widths[i - 1]))
            return TPK_ERROR(ctx, TPK_EINVAL, "--widths: must be positive and increase");
    if (o->seeds < 4)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: needs at least 4 seeds (got %zu)", fn, o->seeds);
    return TPK_OK;
}

static int alloc_raw(tpk_study *s, const tpk_study_opts *o, tpk_ctx *ctx)
{
    s->W = o->nwidths;
    s->S = o->seeds;
    s->widths = tpk_malloc(ctx, s->W * sizeof *s->widths);
    s->nw = tpk_malloc(ctx, s->W * sizeof *s->nw);
    s->khat = tpk_calloc(ctx, s->W * s->S * s->NN, sizeof(double));
    s->y = tpk_calloc(ctx, s->W * s->S * s->N, sizeof(double));
    s->done = tpk_calloc(ctx, s->W * s->S, sizeof(double));
    if (!s->widths || !s->nw || !s->khat || !s->y || !s->done)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory for %zu widths x %zu seeds", s->W, s->S);
    for (size_t i = 0; i < s->W; i++) {
        s->widths[i] = o->widths[i];
        s->nw[i] = (double)o->widths[i];
    }
    return TPK_OK;
}

/* Inputs (K evenly spaced of the file), program, limit kernel and its shape. */
static int prepare(tpk_study *s, const tpk_study_opts *o, const tpk_phi_registry *reg,
                   tpk_ctx *ctx)
{
    tpk_param_set sets[MAX_SETS + EXTRA_SETS];
    char lists[2048], jbuf[3][32], demo[4096];
    int nsets = 0;
    if (program_settings(s, o, sets, &nsets, lists, sizeof lists, jbuf, ctx))
        return ctx->status;
    const char *input = o->input ? o->input : demo;
    if (!o->input &&
        shipped(o, o->arch ? o->arch->input : "data/demo-inputs.csv", demo, sizeof demo, ctx))
        return ctx->status;
    if (!(s->xall = tpk_io_read(input, &s->input, ctx)))
        return ctx->status;
    /* Neither the result nor its checkpoint may be an input or the program (issue 18). */
    const char *ins[] = {input, s->program};
    if (tpk_io_check_output(s->output, ins, 2, ctx) || tpk_io_check_output(s->partial, ins, 2, ctx) ||
        tpk_h5out_check_replace(s->output, o->force, ctx))
        return ctx->status;
    size_t Nall = s->xall->dims[0];
    size_t N = o->max_inputs == 0 || o->max_inputs > Nall ? Nall : o->max_inputs;
    s->info.inputs = N;
    s->info.inputs_all = Nall;
    if (!(s->rows = tpk_malloc(ctx, N * sizeof *s->rows)))
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    if (!(s->x = subset(s->xall, N, s->rows, ctx)))
        return ctx->status;
    if (!(s->prog = load_program(s->program, o, sets, nsets, s->x, reg, ctx)))
        return ctx->status;
    if (s->prog->features & TPK_FEAT_SQRT_N_LOGITS)
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED,
                         "%s has 1/sqrt(n) logits: its limit is not a GP (theory.md §5); compare "
                         "with the hierarchical limit by gpattention (law distances, kurtosis, "
                         "heads) and gpkernel --arch=attention (its mean kernel and score "
                         "covariances)", s->program);
    /* the limit as gpkernel computes it for this architecture: the one choice of solver */
    tpk_job lj = {.direct = o->arch ? o->arch->direct : NULL, .kernel = s->ntk ? TPK_JOB_NTK : 0};
    tpk_direct_kernel direct = tpk_job_solver(&lj, &s->info.limit_solver);
    if (s->ntk ? tpk_netsor_ntk(s->prog, s->x, s->all_outputs, s->ntk_param, NULL, &s->K,
                                &s->info.limit_error, ctx)
        : direct ? direct(s->prog, reg, s->x, s->all_outputs, o->progress, &s->K,
                          &s->info.limit_error, ctx)
                 : tpk_netsor_kernel_progress(s->prog, s->x, s->all_outputs, o->progress, &s->K,
                                              &s->info.limit_error, ctx))
        return ctx->status;
    /* The compared kernel: N×N (last output) or (N·O)×(N·O) input-major (all outputs); the
     * sampled outputs y are N×O in the same order, so one coordinate index serves both. */
    size_t kdim = s->K->dims[0];
    if (s->K->ndim != 2 || s->K->dims[1] != kdim || kdim % N != 0)
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED, "unexpected limit kernel shape for %zu inputs", N);
    /* Errors are relative to the limit: a zero limit (all-zero inputs through a program without
     * biases) leaves nothing to compare with; said before any run (issue 18: gplimits ran every
     * width and seed, then failed and left its checkpoint). */
    int nonzero = 0;
    for (size_t i = 0; i < kdim * kdim && !nonzero; i++)
        nonzero = s->K->data[i] != 0;
    if (!nonzero)
        return TPK_ERROR(ctx, TPK_EDOM, "%s: the limit kernel of these inputs is zero (every "
                         "entry; e.g. all-zero inputs and no biases), so errors relative to it are "
                         "undefined: give inputs that are not all zero", input);
    if (o->stats.w1_input >= kdim)
        return TPK_ERROR(ctx, TPK_EINVAL, "--w1-input=%zu: only %zu output coordinates (%zu "
                         "inputs x %zu outputs) are compared", o->stats.w1_input, kdim, N,
                         kdim / N);
    s->N = kdim;
    s->NN = kdim * kdim;
    return TPK_OK;
}

tpk_study *tpk_study_alloc(const tpk_study_opts *o, const tpk_phi_registry *reg, tpk_ctx *ctx)
{
    if (check_opts(o, ctx))
        return NULL;
    tpk_study *s = tpk_calloc(ctx, 1, sizeof *s);
    if (s != NULL)
        s->al = tpk_ctx_allocator(ctx);
    if (!s || !(s->output = tpk_strdup(ctx, o->output))) {
        tpk_free(ctx, s);
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        return NULL;
    }
    s->stats = o->stats;
    s->seed = o->seed;
    s->S = o->seeds;
    s->W = o->nwidths;
    s->all_outputs = o->all_outputs;
    s->ntk = o->kernel != TPK_JOB_NNGP;
    s->ntk_param = o->ntk_param;
    if (s->ntk && s->ntk_param == TPK_NTK_PARAM_STANDARD) {
        TPK_ERROR(ctx, TPK_EINVAL, "--parameterization=standard: that NTK grows with the width, "
                  "so there is no limit to converge to; compare ntk or tp");
        tpk_study_free(s);
        return NULL;
    }
    snprintf(s->partial, sizeof s->partial, "%s.partial.h5", o->output);
    if (prepare(s, o, reg, ctx) || alloc_raw(s, o, ctx)) {
        tpk_study_free(s);
        return NULL;
    }
    if (make_config(s, ctx) || load_earlier(s, o, ctx)) {
        tpk_study_free(s);
        return NULL;
    }
    s->info.program = s->program;
    s->info.checkpoint = s->partial;
    s->info.config = s->config;
    s->info.runs = s->W * s->S;
    for (size_t k = 0; k < s->info.runs; k++)
        s->info.done += s->done[k] != 0;
    return s;
}

void tpk_study_free(tpk_study *s)
{
    if (!s)
        return;
    tpk_allocator al = s->al;
    tpk_study_analysis_free(s->analysis);
    tpk_mem_free(&al, s->khat);
    tpk_mem_free(&al, s->y);
    tpk_mem_free(&al, s->done);
    tpk_mem_free(&al, s->rows);
    tpk_mem_free(&al, s->widths);
    tpk_mem_free(&al, s->nw);
    tpk_mem_free(&al, s->output);
    tpk_array_free(s->K);
    tpk_array_free(s->x);
    tpk_array_free(s->xall);
    tpk_program_free(s->prog);
    tpk_mem_free(&al, s);
}

const tpk_study_info *tpk_study_get_info(const tpk_study *s)
{
    return s ? &s->info : NULL;
}

tpk_study_raw tpk_study_get_raw(const tpk_study *s)
{
    tpk_study_raw r = {0, 0, 0, NULL, NULL, NULL, NULL};
    if (s)
        r = (tpk_study_raw){s->W, s->S, s->N, s->nw, s->khat, s->ntk ? NULL : s->y, s->K->data};
    return r;
}

const tpk_study_analysis *tpk_study_get_analysis(const tpk_study *s)
{
    return s ? s->analysis : NULL;
}

/* ---- Run --------------------------------------------------------------------------------------- */

typedef struct run_state {
    tpk_study_progress p;
    double t0, tlast, tdraw, every;
    size_t dirty;             /* runs finished since the last checkpoint */
    size_t *wleft;            /* per width: seeds not finished */
} run_state;

static void report(const tpk_study_run_opts *o, run_state *rs, int final)
{
    if (!o->progress)
        return;
    rs->p.elapsed = tpk_wall_seconds() - rs->t0;
    rs->p.final = final;
    o->progress(&rs->p, o->user);
}

/* One finished (width, seed): store it, checkpoint when due, report progress. Called inside the
 * critical section. */
static int store(tpk_study *s, const tpk_study_run_opts *o, run_state *rs, size_t w, size_t sd,
                 const tpk_array *Kh, const tpk_array *yy, tpk_ctx *ctx)
{
    memcpy(s->khat + (w * s->S + sd) * s->NN, Kh->data, s->NN * sizeof(double));
    memcpy(s->y + (w * s->S + sd) * s->N, yy->data, s->N * sizeof(double));
    s->done[w * s->S + sd] = 1;
    s->info.done++;
    rs->p.done++;
    rs->p.ran++;
    rs->dirty++;
    rs->p.widths_done += --rs->wleft[w] == 0;
    int st = TPK_OK;
    double t = tpk_wall_seconds();
    if (t - rs->tlast > rs->every) {
        tpk_ctx cctx;
        tpk_ctx_init_from(&cctx, ctx);
        if (write_checkpoint(s, &cctx) == TPK_OK)
            rs->dirty = 0;
        else
            st = TPK_ERROR(ctx, cctx.status, "checkpoint: %s", cctx.msg);
        rs->tlast = tpk_wall_seconds();
    }
    if (t - rs->tdraw > PROGRESS_SECONDS) {
        report(o, rs, 0);
        rs->tdraw = t;
    }
    return st;
}

int tpk_study_run(tpk_study *s, const tpk_study_run_opts *opt, tpk_ctx *ctx)
{
    if (!s)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_study_run: NULL study");
    const tpk_study_run_opts none = {NULL, 0, NULL, NULL};
    const tpk_study_run_opts *o = opt ? opt : &none;
    const size_t W = s->W, S = s->S, total = W * S;
    run_state rs = {.p = {.widths = W, .runs = total, .done = s->info.done}};
    rs.p.todo = total - s->info.done;
    rs.every = o->checkpoint_seconds > 0 ? o->checkpoint_seconds : TPK_STUDY_CHECKPOINT_SECONDS;
    if (!(rs.wleft = tpk_calloc(ctx, W, sizeof *rs.wleft)))
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    for (size_t w = 0; w < W; w++) {
        for (size_t sd = 0; sd < S; sd++)
            rs.wleft[w] += s->done[w * S + sd] == 0;
        rs.p.widths_done += rs.wleft[w] == 0;
    }
    rs.t0 = rs.tlast = tpk_wall_seconds();
    int st = TPK_OK;
    /* the stop flag also ends the networks running when it is set (a wide one takes seconds) */
    const tpk_progress stopper = {.cancel = o->stop};
    /* Widths run in parallel with seeds: one loop over all (width, seed) pairs, widest first
     * (longest jobs first balances the threads). Peak memory is unchanged: one network per
     * thread, at most the widest. Results depend on (width, seed) alone. */
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t j = 0; j < total; j++) {
        size_t w = W - 1 - j / S, sd = j % S;
        if ((o->stop && *o->stop) || st != TPK_OK || s->done[w * S + sd] != 0)
            continue;
        tpk_ctx lctx;
        tpk_ctx_init_from(&lctx, ctx);
        tpk_array *Kh = NULL, *yy = NULL;
        int ls;
        if (s->ntk) { /* the network's empirical NTK; no output samples (their law is the NNGP's) */
            size_t dy[1] = {s->N};
            ls = tpk_netsor_run_ntk(s->prog, s->x, s->widths[w], s->seed + sd, s->all_outputs,
                                    s->ntk_param, NULL, &Kh, &lctx);
            if (ls == TPK_OK && (yy = tpk_array_alloc(1, dy, &lctx)) == NULL)
                ls = lctx.status;
            if (yy)
                memset(yy->data, 0, s->N * sizeof *yy->data);
        } else {
            ls = tpk_netsor_run_progress(s->prog, s->x, s->widths[w], s->seed + sd,
                                         s->all_outputs, &stopper, &Kh, &yy, &lctx);
        }
#pragma omp critical(tpk_study_store)
        {
            if (ls == TPK_ECANCELED) {
                /* stopped: this run stays missing (a resumed study runs it) */
            } else if (ls != TPK_OK) {
                if (st == TPK_OK)
                    st = TPK_ERROR(ctx, ls, "width %zu, seed %llu: %s", s->widths[w],
                                   (unsigned long long)(s->seed + sd), lctx.msg);
            } else if (tpk_array_size(Kh) != s->NN || tpk_array_size(yy) != s->N) {
                if (st == TPK_OK)
                    st = TPK_ERROR(ctx, TPK_EUNSUPPORTED, "width %zu: the executor's kernel "
                                   "does not match the limit's shape", s->widths[w]);
            } else {
                int cs = store(s, o, &rs, w, sd, Kh, yy, ctx);
                if (cs && st == TPK_OK)
                    st = cs;
            }
        }
        tpk_array_free(Kh);
        tpk_array_free(yy);
    }
    tpk_free(ctx, rs.wleft);
    /* stopped before any run finished: the checkpoint still records the configuration, so the
     * message's "saved in" holds and a --resume with other settings is refused */
    int stopped = o->stop && *o->stop && s->info.done < total;
    if ((rs.dirty || (stopped && access(s->partial, F_OK) != 0)) && st == TPK_OK)
        st = write_checkpoint(s, ctx);
    report(o, &rs, 1);
    return st;
}

/* ---- Write ------------------------------------------------------------------------------------- */

static int write_attrs(const tpk_study *s, tpk_h5out *h, int argc, char **argv, tpk_ctx *ctx)
{
    tpk_h5out_provenance(h, argc, argv, ctx);
    tpk_h5out_input_attrs(h, "input", &s->input, s->xall, ctx);
    tpk_h5out_attr_str(h, "/", "program", s->program, ctx);
    tpk_h5out_program_attrs(h, s->program, NULL, ctx);
    tpk_h5out_attr_str(h, "/", "gplimits_config", s->config, ctx);
    tpk_h5out_attr_str(h, "/", "kernel", s->ntk ? "ntk" : "nngp", ctx);
    if (s->ntk)
        tpk_h5out_attr_str(h, "/", "ntk_parameterization",
                           tpk_ntk_param_name(s->ntk_param), ctx);
    tpk_h5out_attr_int(h, "/", "seed_base", (long long)s->seed, ctx);
    tpk_h5out_attr_int(h, "/", "w1_input", (long long)s->stats.w1_input, ctx);
    tpk_h5out_attr_int(h, "/", "fit_min_width",
                       s->stats.fit_min_width == TPK_STUDY_FIT_AUTO
                           ? -1 : (long long)s->stats.fit_min_width, ctx);
    tpk_h5out_attr_double(h, "/", "limit_kernel_error", s->info.limit_error, ctx);
    tpk_h5out_attr_str(h, "/", "limit_solver",
                       s->info.limit_solver ? s->info.limit_solver : "interpreter", ctx);
    tpk_h5out_attr_str(h, "/", "layout",
                       "per_seed/khat[w][s] = tpk_netsor_run(program, inputs, widths[w], "
                       "seed_base + s) empirical kernel (sigma_v2 included); per_seed/outputs "
                       "sampled readouts; errors relative Frobenius; fits: log-log OLS of the "
                       "per-width statistic with paired bootstrap-over-seeds 95% percentile "
                       "intervals (theory.md §7.4)", ctx);
    return ctx->status;
}

/* The raw data with named axes (xarray reads them, issue 17): width and seed with their values as
 * coordinates (integers), the inputs by their row in the input file, the compared coordinates
 * ("input" when they are the inputs, else "coord": input-major × readouts). */
static int write_raw(const tpk_study *s, tpk_h5out *h, tpk_ctx *ctx)
{
    const size_t W = s->W, S = s->S, M = s->info.inputs, n = W > S ? (W > M ? W : M)
                                                                   : (S > M ? S : M);
    long long *v = tpk_malloc(ctx, n * sizeof *v);
    if (!v)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    for (size_t w = 0; w < W; w++)
        v[w] = (long long)s->widths[w];
    tpk_h5out_coord_ints(h, "width", v, W, ctx);
    tpk_h5out_write_ints(h, "/widths", v, W, ctx);
    tpk_h5out_dims(h, "/widths", (const char *const[]){"width"}, 1, ctx);
    /* seeds past INT64_MAX (never in practice) keep their offsets from seed_base */
    const int offsets = s->seed > (uint64_t)INT64_MAX - S;
    for (size_t i = 0; i < S; i++)
        v[i] = offsets ? (long long)i : (long long)(s->seed + i);
    tpk_h5out_coord_ints(h, "seed", v, S, ctx);
    for (size_t i = 0; i < M; i++)
        v[i] = llround(s->rows[i]);
    tpk_h5out_coord_ints(h, "input", v, M, ctx);
    tpk_h5out_write_ints(h, "/input_rows", v, M, ctx);
    tpk_h5out_dims(h, "/input_rows", (const char *const[]){"input"}, 1, ctx);
    if (!s->all_outputs)
        tpk_h5out_coord_ints(h, "input2", v, M, ctx);
    tpk_free(ctx, v);
    /* images were read as N×rows×cols×C and are kept as N×(rows·cols)×C */
    const int image = s->xall->ndim == 4;
    static const char *const in2[] = {"input", "feature"}, *const in3[] = {"input", "token",
                                                                            "feature"},
                             *const im3[] = {"input", "pixel", "channel"},
                             *const in4[] = {"input", "row", "col", "channel"};
    const char *const *xd = s->x->ndim == 2 ? in2 : s->x->ndim == 4 ? in4 : image ? im3 : in3;
    tpk_h5out_write(h, "/inputs", s->x, ctx);
    tpk_h5out_dims(h, "/inputs", xd, s->x->ndim, ctx);
    const char *p = s->all_outputs ? "coord" : "input", *p2 = s->all_outputs ? "coord2" : "input2";
    tpk_h5out_write(h, "/kernel_limit", s->K, ctx);
    tpk_h5out_dims(h, "/kernel_limit", (const char *const[]){p, p2}, 2, ctx);
    tpk_array a4 = {4, {W, S, s->N, s->N}, s->khat, {NULL, NULL}};
    tpk_array a3 = {3, {W, S, s->N, 0}, s->y, {NULL, NULL}};
    tpk_h5out_write(h, "/per_seed/khat", &a4, ctx);
    tpk_h5out_dims(h, "/per_seed/khat", (const char *const[]){"width", "seed", p, p2}, 4, ctx);
    tpk_h5out_write(h, "/per_seed/outputs", &a3, ctx);
    tpk_h5out_dims(h, "/per_seed/outputs", (const char *const[]){"width", "seed", p}, 3, ctx);
    if (s->ntk) { /* the same layout, other kernels: said on each dataset */
        tpk_h5out_attr_str(h, "/kernel_limit", "kernel", "the limit NTK (tpk_netsor_ntk)", ctx);
        tpk_h5out_attr_str(h, "/per_seed/khat", "kernel",
                           "the empirical NTK (tpk_netsor_run_ntk) of each network", ctx);
        tpk_h5out_attr_str(h, "/per_seed/outputs", "kernel",
                           "none: a study of the NTK keeps no output samples (zeros)", ctx);
    }
    return ctx->status;
}

int tpk_study_write(tpk_study *s, int argc, char **argv, FILE *summary, tpk_ctx *ctx)
{
    if (!s)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_study_write: NULL study");
    if (s->info.done < s->info.runs)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_study_write: %zu of %zu (width, seed) runs are "
                         "missing", s->info.runs - s->info.done, s->info.runs);
    tpk_study_raw raw = tpk_study_get_raw(s);
    tpk_study_analysis *a = tpk_study_analyse(&raw, &s->stats, ctx);
    if (!a)
        return ctx->status;
    tpk_h5out *h = tpk_h5out_open(s->output, ctx);
    if (!h) {
        tpk_study_analysis_free(a);
        return ctx->status;
    }
    write_attrs(s, h, argc, argv, ctx);
    write_raw(s, h, ctx);
    if (ctx->status ||
        tpk_study_analysis_write_named(a, h, s->all_outputs ? "coord" : "input", ctx)) {
        tpk_h5out_abort(h);
        tpk_study_analysis_free(a);
        return ctx->status;
    }
    if (tpk_h5out_commit(h, ctx)) {
        tpk_study_analysis_free(a);
        return ctx->status;
    }
    remove(s->partial);
    tpk_study_analysis_free(s->analysis);
    s->analysis = a;
    if (summary) {
        /* the inputs are a choice of max_inputs: said, not silent (issue 39, item 7) */
        if (s->info.inputs < s->info.inputs_all)
            fprintf(summary, "inputs: %zu of the %zu in %s, evenly spaced (--max-inputs=%zu; "
                    "--max-inputs=0 uses all)\n", s->info.inputs, s->info.inputs_all,
                    s->input.path, s->info.inputs);
        else
            fprintf(summary, "inputs: all %zu in %s (--max-inputs=K uses K of them)\n",
                    s->info.inputs, s->input.path);
        tpk_study_analysis_print(a, summary);
    }
    return TPK_OK;
}
