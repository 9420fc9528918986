/* gpkernel --arch=cnn1d / cnn2d: the shipped program fixes the parameters, the direct recursion
 * of kernels/cnn.c computes the kernel (theory.md §2.8), written to HDF5 like tpk_job_kernel. */
#include "tpk/alloc.h"
#include "tpk/archs.h"
#include "tpk/clock.h"
#include "tpk/cnn.h"

#include "job-impl.h"

#include "tpk/idx.h"
#include "tpk/io.h"
#include "tpk/netsor.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define MAX_JOB_SETS 96

typedef struct cnn_job {
    int twod;
    const char *padding, *readout, *filter, *conv; /* the settings the program does not have */
    const char *window, *compute;                  /* (--window: lap; --compute: f64 or f32) */
    tpk_param_set sets[MAX_JOB_SETS];
    int nsets;
    char buf[6][32];
    tpk_phi_registry *reg;
    tpk_program *prog;
    tpk_array *X, *Xt, *Xall, *K, *T; /* T: the NTK (--kernel=ntk|both) */
    tpk_input_info xi, ti;
    tpk_phi *phi;
    tpk_gauss_ws *ws;
    tpk_h5out *out;
    tpk_netsor_opts o;  /* the program's settings (sets above) */
    size_t rows, cols, C;
    tpk_cnn_params cp;
    int rolled;         /* the rolled program computes (decided for the whole job's batch) */
    int ntk;            /* the job asks for the NTK: kernels/cnn.c computes both */
    int borrowed;       /* X and Xt are the caller's arrays (tpk_cnn_job_arrays): not freed */
    tpk_allocator al;   /* a kernel job's state (tpk_kjob_cnn_init): its allocator */
} cnn_job;

static void cnn_job_free(cnn_job *s)
{
    tpk_h5out_abort(s->out);
    tpk_program_free(s->prog);
    if (!s->borrowed) {
        tpk_array_free(s->X);
        tpk_array_free(s->Xt);
    }
    tpk_array_free(s->Xall);
    tpk_array_free(s->K);
    tpk_array_free(s->T);
    tpk_phi_free(s->phi);
    tpk_gauss_ws_free(s->ws);
    tpk_phi_registry_free(s->reg);
}

/* IDX files (Fashion-MNIST) by name, everything else by tpk_io_read. */
static tpk_array *read_input(const char *spec, tpk_input_info *info, tpk_ctx *ctx)
{
    if (!tpk_idx_name_matches(spec))
        return tpk_io_read(spec, info, ctx);
    tpk_array *a = tpk_idx_read(spec, 0, ctx);
    if (a) {
        memset(info, 0, sizeof *info);
        snprintf(info->path, sizeof info->path, "%s", spec);
        snprintf(info->format, sizeof info->format, "idx");
        tpk_sha256_array_hex(a, info->sha256);
    }
    return a;
}

static int add(cnn_job *s, const char *name, const char *value, tpk_ctx *ctx)
{
    if (s->nsets == MAX_JOB_SETS)
        return TPK_ERROR(ctx, TPK_EINVAL, "too many parameter settings");
    s->sets[s->nsets++] = (tpk_param_set){.name = name, .value = value};
    return TPK_OK;
}

static int parse_int(const char *what, const char *s, long lo, long hi, long *out, tpk_ctx *ctx)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || errno == ERANGE || v < lo || v > hi)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: '%s' is not an integer in %ld..%ld", what, s, lo, hi);
    *out = v;
    return TPK_OK;
}

/* --filter=k or kh,kw → the program's k (1-D) or kh, kw (2-D). */
static int add_filter(cnn_job *s, tpk_ctx *ctx)
{
    long kh = 1, kw;
    const char *comma = strchr(s->filter, ',');
    if (comma && !s->twod)
        return TPK_ERROR(ctx, TPK_EINVAL, "--filter=k takes one size for cnn1d (got '%s')", s->filter);
    char first[32];
    snprintf(first, sizeof first, "%.*s", comma ? (int)(comma - s->filter) : 31, s->filter);
    int st = parse_int("--filter", first, 1, 100000, &kw, ctx);
    if (st)
        return st;
    if (comma) {
        kh = kw;
        if ((st = parse_int("--filter", comma + 1, 1, 100000, &kw, ctx)))
            return st;
    } else if (s->twod) {
        kh = kw;
    }
    snprintf(s->buf[2], sizeof s->buf[2], "%ld", kh);
    snprintf(s->buf[3], sizeof s->buf[3], "%ld", kw);
    if (!s->twod)
        return add(s, "k", s->buf[3], ctx);
    st = add(s, "kh", s->buf[2], ctx);
    return st ? st : add(s, "kw", s->buf[3], ctx);
}

/* Input shape → grid and channels; the settings that follow from it and from padding/filter. */
static int settings(const tpk_job *job, cnn_job *s, size_t *rows, size_t *cols, size_t *C,
                    tpk_ctx *ctx)
{
    const tpk_array *X = s->X;
    int nd = X->ndim;
    if (s->twod ? nd != 3 && nd != 4 : nd != 2 && nd != 3)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: %s inputs must be %s, not rank %d%s",
                         s->borrowed ? "X" : job->input,
                         s->twod ? "cnn2d" : "cnn1d",
                         s->twod ? "images N×H×W×C (C channels; N×H×W is one channel)"
                                 : "signals N×P×C (C channels; N×P is one channel)", nd,
                         s->twod && nd == 2 ? " (an N×d matrix: give each row its image axes, "
                                              "e.g. x.reshape(N, H, W, 1) with a channel axis)"
                                            : "");
    *rows = s->twod ? X->dims[1] : 1;
    *cols = s->twod ? X->dims[2] : X->dims[1];
    *C = nd == (s->twod ? 4 : 3) ? X->dims[nd - 1] : 1;
    int st = TPK_OK;
    /* the grid first: a user's own T / rows / cols come later and are checked after loading */
    if (s->twod) {
        snprintf(s->buf[0], sizeof s->buf[0], "%zu", *rows);
        snprintf(s->buf[1], sizeof s->buf[1], "%zu", *cols);
        st = add(s, "rows", s->buf[0], ctx);
        if (!st) st = add(s, "cols", s->buf[1], ctx);
    } else {
        snprintf(s->buf[0], sizeof s->buf[0], "%zu", *cols);
        st = add(s, "T", s->buf[0], ctx);
    }
    /* padding and filter become program parameters where they stand in the settings (the
     * defaults first, the user's --set last): a later --set circular=0 wins over the default
     * padding (it was overridden by it, and the output said circular, issue 18); a --filter
     * flag beside a --set of k, kh or kw is refused by tpk_arch_sets */
    for (int i = 0; !st && i < job->nsets; i++) {
        const char *n = job->sets[i].name, *v = job->sets[i].value;
        if (strcmp(n, "padding") == 0) {
            s->padding = v;
            if (strcmp(v, "circular") != 0 && strcmp(v, "zero") != 0)
                return TPK_ERROR(ctx, TPK_EINVAL, "--padding must be circular or zero (got '%s')",
                                 v);
            st = add(s, "circular", strcmp(v, "circular") == 0 ? "1" : "0", ctx);
        } else if (strcmp(n, "readout") == 0) {
            s->readout = v;
        } else if (strcmp(n, "filter") == 0) {
            s->filter = v;
            st = add_filter(s, ctx);
        } else if (strcmp(n, "conv") == 0) {
            s->conv = v;
        } else if (strcmp(n, "window") == 0) {
            s->window = v;
        } else if (strcmp(n, "compute") == 0) {
            s->compute = v;
        } else {
            st = add(s, n, v, ctx);
        }
    }
    if (st)
        return st;
    if (s->readout && strcmp(s->readout, "flatten") != 0 && strcmp(s->readout, "gap") != 0 &&
        strcmp(s->readout, "lap") != 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "--readout must be flatten, gap or lap (got '%s')",
                         s->readout);
    const int lap = s->readout && strcmp(s->readout, "lap") == 0;
    if (lap && !s->window)
        return TPK_ERROR(ctx, TPK_EINVAL, "--readout=lap needs --window=c: the mean over the "
                         "circular shifts within c positions on each axis (theory.md §2.8)");
    if (s->window && !lap)
        return TPK_ERROR(ctx, TPK_EINVAL, "--window is the reach of --readout=lap (got --readout=%s)",
                         s->readout ? s->readout : "gap");
    long c = 0;
    if (s->window && parse_int("--window", s->window, 0, 1000000, &c, ctx))
        return ctx->status;
    if (s->compute && strcmp(s->compute, "f64") != 0 && strcmp(s->compute, "f32") != 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "--compute must be f64 or f32 (got '%s')", s->compute);
    if (s->conv && strcmp(s->conv, "auto") != 0 && strcmp(s->conv, "direct") != 0 &&
        strcmp(s->conv, "fft") != 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "--conv must be auto, direct or fft (got '%s')", s->conv);
    return TPK_OK;
}

/* Whole (input × position) covariance blocks of the rolled evaluator up to this size (entries
 * per block; a run holds about four): beyond it the direct recursion, one input pair at a time. */
#define CNN_ROLLED_MAX_ENTRIES ((size_t)1 << 26)

/* One more output, the global average pool of the last layer: the pooled program's default
 * (last-output) kernel is the GAP kernel (σ_v²/P²) Σ_{p,p'} K^L + σ_ob² of theory §2.8. */
static const char POOL_2D[] = "output y_gap = readout(sum(r in 1..rows, s in 1..cols: h[L, r, s]) "
                              "/ (rows * cols), sigma_v2, sigma_ob2)\n";
static const char POOL_1D[] = "output y_gap = readout(sum(p in 1..T: h[L, p]) / T, sigma_v2, "
                              "sigma_ob2)\n";

/* The kernel by the rolled NETSOR evaluator, whose convolution families lower to the same tap
 * sums as tpk_cnn_kernel (netsor/flimit.c): GAP through the pooled output, positions through
 * every output. X: N × rows × cols × C, viewed as N × P × C. */
static int rolled_kernel(const tpk_job *job, const tpk_netsor_opts *o, cnn_job *s, int twod,
                         const tpk_array *X, int positions, tpk_array **K, double *err,
                         tpk_ctx *ctx)
{
    tpk_netsor_opts po = *o;
    po.no_limit = 0; /* this copy is the one evaluated */
    po.append = positions ? NULL : twod ? POOL_2D : POOL_1D;
    tpk_program *p = tpk_netsor_load_file(job->program, &po, s->reg, ctx);
    if (p == NULL)
        return ctx->status;
    /* the channels as the input's shape gives them (settings): an N×rows×cols image or an N×P
     * signal has one channel, not its last axis (issue 39, item 6: N×H×W was viewed as
     * N×H×W-channel rows and refused with "N×d (1 slot) or N×64×d") */
    size_t C = s->C, P = tpk_array_item_size(X) / C;
    tpk_array view = *X;
    view.ndim = 3;
    view.dims[0] = X->dims[0];
    view.dims[1] = P;
    view.dims[2] = C;
    int st = tpk_netsor_kernel_progress(p, &view, positions, job->progress, K, err, ctx);
    tpk_program_free(p);
    return st;
}

/* The program's final parameter values → tpk_cnn_params. */
static int params_from_program(cnn_job *s, size_t rows, size_t cols, size_t C, tpk_cnn_params *cp,
                               tpk_ctx *ctx)
{
    const tpk_program *p = s->prog;
    double L, kh = 1, kw, circ, grid_r = 1, grid_c;
    int st = tpk_program_param_number(p, "L", &L, ctx);
    if (!st) st = tpk_program_param_number(p, "circular", &circ, ctx);
    if (!st) st = tpk_program_param_number(p, "sigma_u2", &cp->sigma_u2, ctx);
    if (!st) st = tpk_program_param_number(p, "sigma_w2", &cp->sigma_w2, ctx);
    if (!st) st = tpk_program_param_number(p, "sigma_b2", &cp->sigma_b2, ctx);
    if (!st) st = tpk_program_param_number(p, "sigma_v2", &cp->sigma_v2, ctx);
    if (!st) st = tpk_program_param_number(p, "sigma_ob2", &cp->sigma_ob2, ctx);
    if (s->twod) {
        if (!st) st = tpk_program_param_number(p, "kh", &kh, ctx);
        if (!st) st = tpk_program_param_number(p, "kw", &kw, ctx);
        if (!st) st = tpk_program_param_number(p, "rows", &grid_r, ctx);
        if (!st) st = tpk_program_param_number(p, "cols", &grid_c, ctx);
    } else {
        if (!st) st = tpk_program_param_number(p, "k", &kw, ctx);
        if (!st) st = tpk_program_param_number(p, "T", &grid_c, ctx);
    }
    if (st)
        return st;
    if (grid_r != (double)rows || grid_c != (double)cols)
        return TPK_ERROR(ctx, TPK_EINVAL, "the program's grid (%gx%g) is not the input's (%zux%zu)",
                         grid_r, grid_c, rows, cols);
    if (circ != 0 && circ != 1)
        return TPK_ERROR(ctx, TPK_EINVAL, "circular must be 1 (circular padding) or 0 (zero padding)");
    const char *phi = tpk_program_param(p, "phi");
    if (!phi)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: the program has no parameter 'phi'", p->path);
    s->phi = tpk_phi_alloc(s->reg, phi, ctx);
    if (!s->phi)
        return ctx->status;
    int closed = tpk_phi_has_closed_form(s->phi);
    if (closed && s->ntk) { /* the NTK maps φ′ too */
        tpk_phi *d = tpk_phi_derivative(s->phi, ctx);
        if (!d)
            return ctx->status;
        closed = tpk_phi_has_closed_form(d);
        tpk_phi_free(d);
    }
    if (!closed && !(s->ws = tpk_gauss_ws_alloc(TPK_GAUSS_DEFAULT_DEGREE, ctx)))
        return ctx->status;
    *cp = (tpk_cnn_params){.rows = rows, .cols = cols, .channels = C, .kh = (int)kh, .kw = (int)kw,
                           .depth = (int)L, .phi = s->phi, .sigma_u2 = cp->sigma_u2,
                           .sigma_w2 = cp->sigma_w2, .sigma_b2 = cp->sigma_b2,
                           .sigma_v2 = cp->sigma_v2, .sigma_ob2 = cp->sigma_ob2,
                           .padding = circ == 1 ? TPK_CNN_CIRCULAR : TPK_CNN_ZERO,
                           .readout = !s->readout ? TPK_CNN_GAP
                                      : strcmp(s->readout, "flatten") == 0 ? TPK_CNN_FLATTEN
                                      : strcmp(s->readout, "lap") == 0     ? TPK_CNN_LAP
                                                                           : TPK_CNN_GAP,
                           .window = s->window ? atoi(s->window) : 0,
                           .compute = s->compute && strcmp(s->compute, "f32") == 0 ? TPK_CNN_F32
                                                                                   : TPK_CNN_F64,
                           .conv = !s->conv || strcmp(s->conv, "auto") == 0 ? TPK_CNN_CONV_AUTO
                                   : strcmp(s->conv, "fft") == 0 ? TPK_CNN_CONV_FFT
                                                                 : TPK_CNN_CONV_DIRECT};
    return tpk_cnn_params_check(cp, ctx);
}

/* Read the inputs, resolve the settings, load the program, derive the CNN parameters (s->cp)
 * and decide the evaluator for the whole job's batch of training and test items (s->rolled). */
static int cnn_prepare(const tpk_job *job, cnn_job *s, tpk_ctx *ctx)
{
    int st;
    if (!job->program || (!job->input && !s->borrowed))
        return TPK_ERROR(ctx, TPK_EINVAL, "a job needs a program, an input and an output");
    int plan;
    if ((st = tpk_netsor_plan_from_env(&plan, ctx)))
        return st;
    s->twod = (job->label && strcmp(job->label, "cnn2d") == 0) || strstr(job->program, "cnn2d") != NULL;
    const char *xin = s->borrowed ? "X" : job->input, *tin = s->borrowed ? "Xt" : job->test;
    if (!(s->reg = tpk_job_registry(ctx)) ||
        (!s->borrowed && !(s->X = read_input(job->input, &s->xi, ctx))) ||
        tpk_array_check_scale(s->X, xin, ctx) ||
        (!s->borrowed && job->test && !(s->Xt = read_input(job->test, &s->ti, ctx))) ||
        (s->Xt && tpk_array_check_scale(s->Xt, tin, ctx)))
        return ctx->status;
    if (s->Xt && (st = tpk_array_check_items(s->Xt, tin, s->X, xin, ctx)))
        return st;
    if ((st = settings(job, s, &s->rows, &s->cols, &s->C, ctx)))
        return st;
    /* this copy is read for its parameters (rolled_kernel loads its own to evaluate) */
    s->o = (tpk_netsor_opts){.sets = s->sets, .nsets = s->nsets, .no_limit = 1};
    s->ntk = job->kernel != TPK_JOB_NNGP;
    if (!(s->prog = tpk_netsor_load_file(job->program, &s->o, s->reg, ctx)))
        return ctx->status;
    if ((st = params_from_program(s, s->rows, s->cols, s->C, &s->cp, ctx)))
        return st;
    if (job->all_outputs && (s->cp.readout == TPK_CNN_LAP || s->cp.compute == TPK_CNN_F32))
        return TPK_ERROR(ctx, TPK_EINVAL, "--all-times reads out every position: it takes neither "
                         "--readout=lap nor --compute=f32");
    if (job->all_outputs)
        s->cp.readout = TPK_CNN_POSITIONS;
    s->cp.ntk_param = job->ntk_param;
    s->cp.ntk_width = job->ntk_width;
    size_t whole = (s->X->dims[0] + (s->Xt ? s->Xt->dims[0] : 0)) * s->rows * s->cols;
    /* the rolled program pools GAP (its appended output) or reads out every position; LAP and
     * flatten are the direct recursion's */
    s->rolled = (s->cp.readout == TPK_CNN_GAP || s->cp.readout == TPK_CNN_POSITIONS) &&
                whole * whole <= CNN_ROLLED_MAX_ENTRIES && !s->ntk;
    return TPK_OK;
}

/* Kernel rows per item: every position with the POSITIONS readout, else one. */
static size_t cnn_readouts(const cnn_job *s)
{
    return s->cp.readout == TPK_CNN_POSITIONS ? s->rows * s->cols : 1;
}

/* The kernel of the items Xin by the evaluator chosen for the job; with T (the job asks for the
 * NTK) the NTK beside it, by kernels/cnn.c's recursion. */
static int cnn_batch(const tpk_job *job, cnn_job *s, const tpk_array *Xin, tpk_array **K,
                     tpk_array **T, double *err, tpk_ctx *ctx)
{
    *K = NULL;
    if (T)
        *T = NULL;
    if (s->rolled)
        return rolled_kernel(job, &s->o, s, s->twod, Xin, s->cp.readout == TPK_CNN_POSITIONS, K,
                             err, ctx);
    size_t side = Xin->dims[0] * cnn_readouts(s);
    if (!(*K = tpk_array_alloc2(side, side, ctx)) ||
        (T && !(*T = tpk_array_alloc2(side, side, ctx)))) {
        tpk_array_free(*K);
        *K = NULL;
        return ctx->status;
    }
    int st = tpk_cnn_kernels(&s->cp, Xin, s->ws, *K, T ? *T : NULL, err, ctx);
    if (st == TPK_OK)
        st = tpk_progress_check(job->progress, ctx);
    if (st) {
        tpk_array_free(*K);
        *K = NULL;
        if (T) {
            tpk_array_free(*T);
            *T = NULL;
        }
    }
    return st;
}

static const char *const rname[] = {"flatten", "gap", "positions", "lap"};

/* GAP / LAP by shifts (kernels/cnn.c) or by the (P×P) block; "" for the other readouts. */
static const char *cnn_pooling(const cnn_job *s)
{
    const tpk_cnn_params *cp = &s->cp;
    if (s->rolled || (cp->readout != TPK_CNN_GAP && cp->readout != TPK_CNN_LAP))
        return "";
    return cp->pool == TPK_CNN_POOL_SHIFTS ||
                   (cp->pool == TPK_CNN_POOL_AUTO && tpk_cnn_pool_prefers_shifts(cp))
               ? "shifts" : "block";
}

static int cnn_uses_fft(const cnn_job *s)
{
    const tpk_cnn_params *cp = &s->cp;
    if (strcmp(cnn_pooling(s), "shifts") == 0) /* box sums over positions */
        return 0;
    return cp->conv == TPK_CNN_CONV_FFT ||
           (cp->conv == TPK_CNN_CONV_AUTO &&
            tpk_cnn_conv_prefers_fft(s->rows, s->cols, cp->kh, cp->kw, cp->padding));
}

/* The root attributes of a CNN kernel file (the datasets' dimensions and error_estimate aside). */
static int cnn_describe(tpk_h5out *out, const tpk_job *job, const cnn_job *s, tpk_ctx *ctx)
{
    const tpk_cnn_params *cp = &s->cp;
    int st = tpk_job_describe(out, job, s->prog, NULL, "cnn", ctx);
    if (!st) st = tpk_h5out_attr_str(out, "/", "readout", rname[cp->readout], ctx);
    if (!st) st = tpk_h5out_attr_str(out, "/", "padding", cp->padding == TPK_CNN_CIRCULAR ? "circular" : "zero", ctx);
    if (!st) st = tpk_h5out_attr_str(out, "/", "convolution", cnn_uses_fft(s) ? "fft" : "direct", ctx);
    /* which evaluator computed it: the rolled program (whole blocks) or the per-pair recursion */
    if (!st) st = tpk_h5out_attr_str(out, "/", "evaluator", s->rolled ? "rolled-netsor" : "direct-recursion", ctx);
    if (!st && *cnn_pooling(s)) st = tpk_h5out_attr_str(out, "/", "pooling", cnn_pooling(s), ctx);
    if (!st && cp->readout == TPK_CNN_LAP) st = tpk_h5out_attr_int(out, "/", "window", cp->window, ctx);
    if (!st) st = tpk_h5out_attr_str(out, "/", "compute", cp->compute == TPK_CNN_F32 ? "f32" : "f64", ctx);
    if (!st) st = tpk_h5out_attr_int(out, "/", "channels", (long long)s->C, ctx);
    if (!st) st = tpk_h5out_input_attrs(out, "input", &s->xi, s->X, ctx);
    if (!st && s->Xt) st = tpk_h5out_input_attrs(out, "test", &s->ti, s->Xt, ctx);
    return st;
}

/* The blocks of a kernel over the training items then the test items (per rows each): the
 * training block, test × training and the test diagonal (B[1], B[2] NULL without a test set). */
static int split_blocks(const tpk_array *K, size_t ntr, size_t nte, tpk_array *B[3], tpk_ctx *ctx)
{
    const size_t side = ntr + nte, dm[1] = {nte};
    B[0] = B[1] = B[2] = NULL;
    if (nte == 0)
        return TPK_OK;
    if (!(B[0] = tpk_array_block(K, 0, ntr, 0, ntr, ctx)) ||
        !(B[1] = tpk_array_block(K, ntr, nte, 0, ntr, ctx)) || !(B[2] = tpk_array_alloc(1, dm, ctx)))
        return ctx->status;
    for (size_t i = 0; i < nte; i++)
        B[2]->data[i] = K->data[(ntr + i) * side + ntr + i];
    return TPK_OK;
}

/* One kernel's datasets: /NAME, /NAME_test_train, /NAME_test_diag, and their dimensions. */
static int write_kernel(tpk_h5out *out, const char *name, const tpk_array *K, tpk_array *B[3],
                        const tpk_array *X, tpk_ctx *ctx)
{
    char path[3][32];
    snprintf(path[0], sizeof path[0], "/%s", name);
    snprintf(path[1], sizeof path[1], "/%s_test_train", name);
    snprintf(path[2], sizeof path[2], "/%s_test_diag", name);
    int st = tpk_h5out_write(out, path[0], B[0] ? B[0] : K, ctx);
    if (!st && B[1]) st = tpk_h5out_write(out, path[1], B[1], ctx);
    if (!st && B[2]) st = tpk_h5out_write(out, path[2], B[2], ctx);
    if (!st)
        st = tpk_job_kernel_dims_named(out, path[0], B[1] ? path[1] : NULL, B[2] ? path[2] : NULL,
                                       (B[0] ? B[0] : K)->dims[0] != X->dims[0], ctx);
    return st;
}

/* The job's batch (training then test items) in one kernel, or both: s->K, s->T. */
static int cnn_batch_all(const tpk_job *job, cnn_job *s, double *err, tpk_ctx *ctx)
{
    const tpk_array *Xin = s->X;
    if (s->Xt) {
        size_t dims[TPK_ARRAY_MAXDIM];
        memcpy(dims, s->X->dims, sizeof dims);
        dims[0] += s->Xt->dims[0];
        if (!(s->Xall = tpk_array_alloc(s->X->ndim, dims, ctx)))
            return ctx->status;
        memcpy(s->Xall->data, s->X->data, tpk_array_size(s->X) * sizeof(double));
        memcpy(s->Xall->data + tpk_array_size(s->X), s->Xt->data,
               tpk_array_size(s->Xt) * sizeof(double));
        Xin = s->Xall;
    }
    return cnn_batch(job, s, Xin, &s->K, s->ntk ? &s->T : NULL, err, ctx);
}

/* A kernel's blocks for the caller: training (the whole kernel without a test set, taken from
 * *K), test × training, test diagonal. */
static int take_blocks(tpk_array **K, size_t ntr, size_t nte, tpk_array *B[3], tpk_ctx *ctx)
{
    int st = split_blocks(*K, ntr, nte, B, ctx);
    if (!st && !B[0]) {
        B[0] = *K;
        *K = NULL;
    }
    return st;
}

int tpk_cnn_job_arrays(const tpk_job *job, const tpk_array *X, const tpk_array *Xt,
                       tpk_array *K[3], tpk_array *T[3], double *err, tpk_ctx *ctx)
{
    for (int i = 0; i < 3; i++) {
        K[i] = NULL;
        if (T)
            T[i] = NULL;
    }
    int st = tpk_array_check_input(X, "tpk_cnn_job_arrays", "X", ctx);
    if (st || (st = tpk_array_check_input(Xt, "tpk_cnn_job_arrays", "Xt", ctx)))
        return st;
    tpk_job j = *job;
    j.input = j.test = j.output = NULL;
    if (T)
        j.kernel = TPK_JOB_BOTH;
    /* the caller's arrays, borrowed: read, never written or freed */
    cnn_job s = {.X = (tpk_array *)X, .Xt = (tpk_array *)Xt, .borrowed = 1};
    double e = 0;
    if (!(st = cnn_prepare(&j, &s, ctx)) && !(st = cnn_batch_all(&j, &s, &e, ctx))) {
        const size_t per = cnn_readouts(&s), ntr = X->dims[0] * per;
        const size_t nte = Xt ? Xt->dims[0] * per : 0;
        if (T) {
            st = take_blocks(&s.K, ntr, nte, K, ctx);
            if (!st)
                st = take_blocks(&s.T, ntr, nte, T, ctx);
        } else {
            st = take_blocks(j.kernel == TPK_JOB_NTK ? &s.T : &s.K, ntr, nte, K, ctx);
        }
    }
    if (!st && err)
        *err = e;
    for (int i = 0; st && i < 3; i++) {
        tpk_array_free(K[i]);
        K[i] = NULL;
        if (T) {
            tpk_array_free(T[i]);
            T[i] = NULL;
        }
    }
    cnn_job_free(&s);
    return st;
}

int tpk_cnn_job(const tpk_job *job, tpk_ctx *ctx)
{
    cnn_job s = {0};
    tpk_array *B[3] = {NULL, NULL, NULL}, *BT[3] = {NULL, NULL, NULL};
    double t0 = tpk_wall_seconds(), err = 0;
    int st = TPK_OK;
    if (!job->output) {
        st = TPK_ERROR(ctx, TPK_EINVAL, "a job needs a program, an input and an output");
        goto done;
    }
    if ((st = cnn_prepare(job, &s, ctx)))
        goto done;
    /* open before computing: an unwritable path fails at once; an input is never the output */
    const char *ins[] = {job->program, job->input, job->test};
    if (tpk_io_check_output(job->output, ins, 3, ctx) ||
        tpk_h5out_check_replace(job->output, job->force, ctx) ||
        !(s.out = tpk_h5out_open(job->output, ctx))) {
        st = ctx->status;
        goto done;
    }
    const tpk_cnn_params *cp = &s.cp;
    size_t per = cnn_readouts(&s);
    if ((st = cnn_batch_all(job, &s, &err, ctx)))
        goto done;
    size_t ntr = s.X->dims[0] * per, nte = s.Xt ? s.Xt->dims[0] * per : 0;
    const int nngp = job->kernel != TPK_JOB_NTK;
    if ((nngp && (st = split_blocks(s.K, ntr, nte, B, ctx))) ||
        (s.T && (st = split_blocks(s.T, ntr, nte, BT, ctx))))
        goto done;
    if (nngp)
        st = write_kernel(s.out, "kernel", s.K, B, s.X, ctx);
    if (!st && s.T)
        st = write_kernel(s.out, "ntk", s.T, BT, s.X, ctx);
    if (!st && s.T)
        st = tpk_job_ntk_attrs(s.out, job, ctx);
    if (!st) st = cnn_describe(s.out, job, &s, ctx);
    if (!st) st = tpk_h5out_attr_double(s.out, "/", "error_estimate", err, ctx);
    if (!st) {
        st = tpk_h5out_commit(s.out, ctx);
        s.out = NULL;
    }
    if (!st && job->summary) {
        const tpk_array *K = nngp ? (B[0] ? B[0] : s.K) : (BT[0] ? BT[0] : s.T);
        size_t n = K->dims[0];
        fprintf(job->summary, "kernel: %s (%s), %zux%zu grid, %zu channel%s, %d layers, filter %dx%d, "
                "%s padding, %s readout%s%s%s (%s convolution, %s%s%s)\n",
                job->label ? job->label : "cnn", job->program, s.rows, s.cols, s.C,
                s.C == 1 ? "" : "s", cp->depth, cp->kh, cp->kw,
                cp->padding == TPK_CNN_CIRCULAR ? "circular" : "zero", rname[cp->readout],
                cp->readout == TPK_CNN_LAP ? ", window " : "",
                cp->readout == TPK_CNN_LAP ? s.window : "",
                cp->compute == TPK_CNN_F32 ? ", float32" : "",
                cnn_uses_fft(&s) ? "FFT" : "direct", s.rolled ? "rolled program" : "direct recursion",
                *cnn_pooling(&s) ? ", pooled by " : "", cnn_pooling(&s));
        fprintf(job->summary, "  input   %s (N=%zu)\n", job->input, s.X->dims[0]);
        if (s.Xt)
            fprintf(job->summary, "  test    %s (M=%zu)\n", job->test, s.Xt->dims[0]);
        fprintf(job->summary, "  %-7s %zux%zu, K[0][0]=%.6g, K[0][1]=%.6g, error estimate %.2e\n",
                nngp ? "kernel" : "ntk", n, n, K->data[0], n > 1 ? K->data[1] : K->data[0], err);
        if (nngp && s.T) {
            const tpk_array *T = BT[0] ? BT[0] : s.T;
            fprintf(job->summary, "  ntk     %zux%zu, Θ[0][0]=%.6g, Θ[0][1]=%.6g (%s parameterization)\n",
                    n, n, T->data[0], n > 1 ? T->data[1] : T->data[0],
                    tpk_ntk_param_name(job->ntk_param));
        }
        fprintf(job->summary, "  wrote   %s in %.3f s\n", job->output, tpk_wall_seconds() - t0);
    }
done:
    for (int i = 0; i < 3; i++) {
        tpk_array_free(B[i]);
        tpk_array_free(BT[i]);
    }
    cnn_job_free(&s);
    return st;
}

/* ---- the CNN's kernel job, block by block (job-impl.h, app/job_block.c) ------------------- */

/* The job's kernel of a batch: with kernel = NTK the NTK, the NNGP beside it dropped. */
static int kjob_cnn_batch(tpk_kernel_job *kj, const tpk_array *Xb, tpk_array **K, double *err,
                          tpk_ctx *ctx)
{
    if (kj->job.kernel == TPK_JOB_NNGP)
        return cnn_batch(&kj->job, kj->self, Xb, K, NULL, err, ctx);
    tpk_array *Kn = NULL;
    int st = cnn_batch(&kj->job, kj->self, Xb, &Kn, K, err, ctx);
    tpk_array_free(Kn);
    return st;
}

/* A tile's off-diagonal block by the recursion's cross blocks (tpk_cnn_kernels_cross): the
 * block's pairs alone, where the stacked batch computed (nr + nc)² entries to keep nr·nc. */
static int kjob_cnn_cross(tpk_kernel_job *kj, const tpk_array *Xr, const tpk_array *Xc,
                          tpk_array **K, double *diag, double *err, tpk_ctx *ctx)
{
    cnn_job *s = kj->self;
    *K = NULL;
    if (s->rolled || s->cp.readout == TPK_CNN_POSITIONS) /* whole blocks of the evaluator */
        return TPK_EUNSUPPORTED;
    const int ntk = kj->job.kernel == TPK_JOB_NTK;
    if (!(*K = tpk_array_alloc2(Xr->dims[0], Xc->dims[0], ctx)))
        return ctx->status;
    int st = ntk ? tpk_cnn_kernels_cross(&s->cp, Xr, Xc, s->ws, NULL, *K, NULL, diag, err, ctx)
                 : tpk_cnn_kernels_cross(&s->cp, Xr, Xc, s->ws, *K, NULL, diag, NULL, err, ctx);
    if (!st)
        st = tpk_progress_check(kj->job.progress, ctx);
    if (st) {
        tpk_array_free(*K);
        *K = NULL;
    }
    return st;
}

static int kjob_cnn_describe(const tpk_kernel_job *kj, tpk_h5out *out, tpk_ctx *ctx)
{
    int st = cnn_describe(out, &kj->job, kj->self, ctx);
    return st ? st : tpk_job_ntk_attrs(out, &kj->job, ctx);
}

static void kjob_cnn_release(void *self)
{
    if (self) {
        cnn_job *s = self;
        tpk_allocator al = s->al;
        cnn_job_free(s);
        tpk_mem_free(&al, s);
    }
}

static const kjob_impl kjob_cnn = {"cnn", kjob_cnn_batch, kjob_cnn_cross, kjob_cnn_describe,
                                   kjob_cnn_release};

int tpk_kjob_cnn_init(tpk_kernel_job *kj, tpk_ctx *ctx)
{
    if (kj->job.kernel == TPK_JOB_BOTH) /* a tile is one kernel's block */
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED, "a kernel job computes one kernel, block by "
                         "block: the NNGP or the NTK, not both");
    cnn_job *s = tpk_calloc(ctx, 1, sizeof *s);
    if (!s)
        return ctx->status;
    s->al = tpk_ctx_allocator(ctx);
    kj->impl = &kjob_cnn;
    kj->self = s;
    int st = cnn_prepare(&kj->job, s, ctx);
    if (st)
        return st;
    kj->X = s->X;
    kj->Xt = s->Xt;
    kj->readouts = cnn_readouts(s);
    return TPK_OK;
}
