/* gplimits: how fast finite-width networks approach their infinite-width limit. Runs a NETSOR
 * program at a ladder of widths × seeds through the finite-width executor, compares with the limit
 * kernel, and writes every raw per-seed result plus fitted rates with bootstrap intervals to HDF5
 * (theory.md §7). Checkpointed so an interrupted run resumes without losing finished seeds. */
#include "tpk/tpk.h"
#include "tpk/archs.h"
#include "tpk/job.h"
#include "tpk/limits.h"

#include <cblas.h>
#define __GSL_CBLAS_H__
#include <gsl/gsl_errno.h>
#include <hdf5.h>

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef TPK_VERSION
#define TPK_VERSION "unknown"
#endif

/* Set by SIGINT/SIGTERM; the run loop stops taking new seeds, checkpoints and exits 130. A
 * signal flag is the one piece of process state a program cannot pass around. */
static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
}

#define MAX_WIDTHS 32
#define MAX_SETS 64
#define MAX_FLAGS 32
/* A checkpoint is rewritten when this many seconds have passed since the last one (and at the
 * end of every width, and on SIGINT/SIGTERM): an uncatchable kill loses at most this much. */
#define CHECKPOINT_SECONDS 2.0

typedef struct opts {
    const char *program, *input, *output;
    const tpk_arch *arch;
    tpk_arch_flag fl[MAX_FLAGS]; /* --flag=value of the architecture (include/tpk/archs.h) */
    char fl_name[MAX_FLAGS][64], fl_param[MAX_FLAGS][64];
    int nflags, layernorm, all_outputs;
    tpk_param_set sets[MAX_SETS];
    int nsets;
    size_t widths[MAX_WIDTHS];
    int nwidths;
    size_t seeds;
    uint64_t seed;
    size_t max_inputs;
    size_t w1_input;
    size_t boot, slices;
    size_t fit_min_width;        /* FIT_AUTO: the two-term rule (choose_first) */
    double fit_ratio;            /* the rule's bound on the n^-1 / n^-1/2 term ratio */
    int resume, quiet, progress; /* progress: -1 auto (isatty), 0 off, 1 on */
} opts;

#define FIT_AUTO SIZE_MAX
/* Default of --fit-ratio: at n_min the n^-1 term is at most 10% of the n^-1/2 term, so the local
 * log-slope of c1 n^-1/2 + c2 n^-1, -(1/2 + r)/(1 + r) with r = c2/(c1 sqrt n), is within
 * r/(2(1 + r)) <= 0.045 of -1/2 there and within half that one doubling higher: below the
 * bootstrap half-widths (0.03-0.08) of the runs this tool is used for. */
#define FIT_RATIO_DEFAULT 0.1

static const char usage[] =
    "Usage: gplimits (--arch=NAME [--FLAG=VALUE]... | --program=FILE.nsr) [--set k=v]...\n"
    "                --output=FILE.h5 [options]\n"
    "Finite-width convergence to the infinite-width limit (theory.md §7): runs the program at\n"
    "each width for S seeds and reports kernel errors, bias, fluctuation, output-law distances\n"
    "and their fitted exponents with bootstrap-over-seeds 95% intervals.\n"
    "\n"
    "Program:\n"
    "  --arch=NAME        a shipped architecture, with the flags and defaults of gpkernel\n"
    "                     (gpkernel --list-archs): mlp (--depth, --phi, --sigma-w2, --sigma-b2,\n"
    "                     --residual=A, --layernorm [--ln-eps]), batchnorm, rnn, rnn-untied,\n"
    "                     transformer, attention (1/n logits only: --logit-scaling=inv-n is\n"
    "                     implied; the 1/sqrt(n) limit is gpattention's), cnn1d, cnn2d\n"
    "                     (--padding, --filter; outputs are the per-position readouts)\n"
    "  --program=FILE     any NETSOR program\n"
    "  --set NAME=VALUE   override a program parameter (repeatable; after the arch flags)\n"
    "  --all-outputs      compare the whole output kernel: every readout of the program (all\n"
    "                     time steps, tokens or positions), input-major, (N*O)x(N*O); default:\n"
    "                     the last output only (NxN), as tpk_netsor_kernel/run with all_outputs=0\n"
    "Run:\n"
    "  --input=SPEC       FILE.h5:/dataset, FILE.npy or FILE.csv (default: the architecture's\n"
    "                     bundled demo input; with --program: data/demo-inputs.csv). Sequences\n"
    "                     N×T×d set a program parameter T, images N×rows×cols×C set rows, cols\n"
    "  --max-inputs=K     use K evenly spaced inputs of SPEC (default 8; 0 = all)\n"
    "  --widths=LIST      32,64,128 or 32..2048 (geometric, x2) (default 32..2048)\n"
    "  --seeds=S          networks per width (default 64); seed of network s is BASE + s,\n"
    "  --seed=BASE        shared by all widths (nested widths, theory.md §7.3) (default 1)\n"
    "  --output=FILE.h5   results (written atomically at the end; required)\n"
    "  --resume           continue from FILE.h5.partial.h5 (the checkpoint of a killed run)\n"
    "Statistics:\n"
    "  --boot=B           bootstrap replicates (default 1000; sliced fits use B/5)\n"
    "  --w1-input=I       output coordinate (index within the used inputs, times the outputs\n"
    "                     with --all-outputs) for the 1-D law distance (0)\n"
    "  --slices=L         directions for sliced distances (default 8)\n"
    "  --fit-min-width=N  fit exponents over widths >= N; 0 = all; auto (default): the smallest\n"
    "                     width n_min at which the two-term fit c1 n^-1/2 + c2 n^-1 of the RMS\n"
    "                     error over all widths has |c2|/(c1 sqrt(n_min)) <= --fit-ratio, keeping\n"
    "                     at least 3 widths (capped, with a warning). The RMS exponent for every\n"
    "                     n_min is in /fits/rms_stability. With --resume on a finished FILE.h5\n"
    "                     the statistics are recomputed from its raw data without rerunning.\n"
    "  --fit-ratio=R      the auto rule's bound on the n^-1 / n^-1/2 term ratio (default 0.1)\n"
    "Output:\n"
    "  --progress / --no-progress   progress bar on stderr (default: when stderr is a terminal)\n"
    "  --quiet            no summary on stdout\n"
    "  --help, --version\n"
    "\n"
    "Widths and seeds run in parallel (one OpenMP loop over all (width, seed) pairs, widest\n"
    "first): peak memory is that of one network at the largest width per thread.\n"
    "Reproducing one network: tpk_netsor_run(program, inputs, width, BASE + s, all_outputs)\n"
    "gives the kernel stored at /per_seed/khat[w][s]. Exit status 130: interrupted, checkpoint\n"
    "written.\n";

static int parse_size(const char *name, const char *s, size_t lo, size_t hi, size_t *out,
                      tpk_ctx *ctx)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *end != '\0' || errno == ERANGE || s[0] == '-' || v < lo || v > hi)
        return TPK_ERROR(ctx, TPK_EINVAL, "--%s: '%s' is not an integer in %zu..%zu", name, s, lo,
                         hi);
    *out = (size_t)v;
    return TPK_OK;
}

static int parse_double(const char *name, const char *s, double *out, tpk_ctx *ctx)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || errno == ERANGE || !isfinite(v))
        return TPK_ERROR(ctx, TPK_EINVAL, "--%s: '%s' is not a number", name, s);
    *out = v;
    return TPK_OK;
}

/* "32,64,128" or "32..2048" (doubling). */
static int parse_widths(const char *s, opts *o, tpk_ctx *ctx)
{
    const char *dots = strstr(s, "..");
    o->nwidths = 0;
    if (dots) {
        char lo_s[64];
        size_t len = (size_t)(dots - s), lo, hi;
        if (len == 0 || len >= sizeof lo_s)
            return TPK_ERROR(ctx, TPK_EINVAL, "--widths: malformed range '%s'", s);
        memcpy(lo_s, s, len);
        lo_s[len] = '\0';
        if (parse_size("widths", lo_s, 1, 1u << 24, &lo, ctx) ||
            parse_size("widths", dots + 2, 1, 1u << 24, &hi, ctx))
            return TPK_EINVAL;
        if (hi <= lo)
            return TPK_ERROR(ctx, TPK_EINVAL, "--widths: empty range '%s'", s);
        for (size_t n = lo; n <= hi; n *= 2) {
            if (o->nwidths == MAX_WIDTHS)
                return TPK_ERROR(ctx, TPK_EINVAL, "--widths: more than %d widths", MAX_WIDTHS);
            o->widths[o->nwidths++] = n;
        }
    } else {
        char buf[1024];
        if (strlen(s) >= sizeof buf)
            return TPK_ERROR(ctx, TPK_EINVAL, "--widths: list too long");
        strcpy(buf, s);
        char *save = NULL;
        for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            if (o->nwidths == MAX_WIDTHS)
                return TPK_ERROR(ctx, TPK_EINVAL, "--widths: more than %d widths", MAX_WIDTHS);
            if (parse_size("widths", tok, 1, 1u << 24, &o->widths[o->nwidths], ctx))
                return TPK_EINVAL;
            if (o->nwidths > 0 && o->widths[o->nwidths] <= o->widths[o->nwidths - 1])
                return TPK_ERROR(ctx, TPK_EINVAL, "--widths: must increase ('%s')", s);
            o->nwidths++;
        }
    }
    if (o->nwidths < 2)
        return TPK_ERROR(ctx, TPK_EINVAL, "--widths: need at least 2 widths to fit a rate");
    return TPK_OK;
}

enum { OPT_ARCH = 256, OPT_PROGRAM, OPT_SET, OPT_INPUT, OPT_MAXIN, OPT_OUTPUT, OPT_WIDTHS,
       OPT_SEEDS, OPT_SEED, OPT_RESUME, OPT_BOOT, OPT_W1IN, OPT_SLICES, OPT_FITMIN, OPT_FITRATIO,
       OPT_ALLOUT, OPT_LN, OPT_PROGRESS, OPT_NOPROGRESS, OPT_QUIET, OPT_HELP, OPT_VERSION };

static const struct option longopts[] = {
    {"arch", required_argument, NULL, OPT_ARCH},
    {"program", required_argument, NULL, OPT_PROGRAM},
    {"set", required_argument, NULL, OPT_SET},
    {"input", required_argument, NULL, OPT_INPUT},
    {"max-inputs", required_argument, NULL, OPT_MAXIN},
    {"output", required_argument, NULL, OPT_OUTPUT},
    {"widths", required_argument, NULL, OPT_WIDTHS},
    {"seeds", required_argument, NULL, OPT_SEEDS},
    {"seed", required_argument, NULL, OPT_SEED},
    {"resume", no_argument, NULL, OPT_RESUME},
    {"boot", required_argument, NULL, OPT_BOOT},
    {"w1-input", required_argument, NULL, OPT_W1IN},
    {"slices", required_argument, NULL, OPT_SLICES},
    {"fit-min-width", required_argument, NULL, OPT_FITMIN},
    {"fit-ratio", required_argument, NULL, OPT_FITRATIO},
    {"all-outputs", no_argument, NULL, OPT_ALLOUT},
    {"layernorm", no_argument, NULL, OPT_LN},
    {"progress", no_argument, NULL, OPT_PROGRESS},
    {"no-progress", no_argument, NULL, OPT_NOPROGRESS},
    {"quiet", no_argument, NULL, OPT_QUIET},
    {"help", no_argument, NULL, OPT_HELP},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0}};

static int is_own_option(const char *name, size_t len)
{
    for (const struct option *op = longopts; op->name; op++)
        if (strlen(op->name) == len && strncmp(op->name, name, len) == 0)
            return 1;
    return 0;
}

/* The architecture's flags (--depth=3, --var-u=0.5, ...) are not known to getopt: every
 * "--name=value" whose name is not one of gplimits' own options is one; they are resolved and
 * checked against the architecture table once --arch is known. */
static int take_arch_flags(int argc, char **argv, int *nrest, char **rest, opts *o, tpk_ctx *ctx)
{
    int k = 1;
    rest[0] = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        if (strncmp(a, "--", 2) == 0 && eq && !is_own_option(a + 2, (size_t)(eq - a - 2))) {
            if (o->nflags == MAX_FLAGS)
                return TPK_ERROR(ctx, TPK_EINVAL, "more than %d architecture flags", MAX_FLAGS);
            if ((size_t)(eq - a - 2) >= sizeof o->fl_name[0])
                return TPK_ERROR(ctx, TPK_EINVAL, "unknown option '%s' (see --help)", a);
            snprintf(o->fl_name[o->nflags], sizeof o->fl_name[0], "%.*s", (int)(eq - a - 2), a + 2);
            o->fl[o->nflags] = (tpk_arch_flag){o->fl_name[o->nflags], NULL, eq + 1};
            o->nflags++;
        } else {
            rest[k++] = argv[i];
        }
    }
    rest[k] = NULL;
    *nrest = k;
    return TPK_OK;
}

/* Returns 0 to go on, -1 to exit successfully (help/version), or an error status (> 0). */
static int parse_args_rest(int argc, char **argv, const tpk_phi_registry *reg, opts *o,
                           tpk_ctx *ctx);

static int parse_args(int argc, char **argv, const tpk_phi_registry *reg, opts *o, tpk_ctx *ctx)
{
    char **rest = malloc((size_t)(argc + 1) * sizeof *rest);
    if (!rest)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    int nrest = 0, st = take_arch_flags(argc, argv, &nrest, rest, o, ctx);
    if (st == TPK_OK)
        st = parse_args_rest(nrest, rest, reg, o, ctx);
    free(rest);
    return st;
}

/* getopt over gplimits' own options (rest of argv), then the architecture and its flags. */
static int parse_args_rest(int argc, char **argv, const tpk_phi_registry *reg, opts *o,
                           tpk_ctx *ctx)
{
    int c, st = TPK_OK;
    const char *arch = NULL;
    opterr = 0;
    while (st == TPK_OK && (c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_ARCH: arch = optarg; break;
        case OPT_PROGRAM: o->program = optarg; break;
        case OPT_SET: {
            char *eq = strchr(optarg, '=');
            if (!eq || eq == optarg)
                return TPK_ERROR(ctx, TPK_EINVAL, "--set: expected NAME=VALUE, got '%s'", optarg);
            if (o->nsets == MAX_SETS)
                return TPK_ERROR(ctx, TPK_EINVAL, "--set: more than %d overrides", MAX_SETS);
            *eq = '\0'; /* argv is ours to split */
            o->sets[o->nsets++] = (tpk_param_set){optarg, eq + 1};
            break;
        }
        case OPT_INPUT: o->input = optarg; break;
        case OPT_MAXIN: st = parse_size("max-inputs", optarg, 0, 1u << 20, &o->max_inputs, ctx); break;
        case OPT_OUTPUT: o->output = optarg; break;
        case OPT_WIDTHS: st = parse_widths(optarg, o, ctx); break;
        case OPT_SEEDS: st = parse_size("seeds", optarg, 4, 1u << 20, &o->seeds, ctx); break;
        case OPT_SEED: {
            size_t v;
            st = parse_size("seed", optarg, 0, SIZE_MAX, &v, ctx);
            o->seed = (uint64_t)v;
            break;
        }
        case OPT_RESUME: o->resume = 1; break;
        case OPT_BOOT: st = parse_size("boot", optarg, 50, 1000000, &o->boot, ctx); break;
        case OPT_W1IN: st = parse_size("w1-input", optarg, 0, 1u << 20, &o->w1_input, ctx); break;
        case OPT_SLICES: st = parse_size("slices", optarg, 1, 10000, &o->slices, ctx); break;
        case OPT_FITMIN:
            if (strcmp(optarg, "auto") == 0)
                o->fit_min_width = FIT_AUTO;
            else
                st = parse_size("fit-min-width", optarg, 0, 1u << 24, &o->fit_min_width, ctx);
            break;
        case OPT_FITRATIO:
            st = parse_double("fit-ratio", optarg, &o->fit_ratio, ctx);
            if (st == TPK_OK && !(o->fit_ratio > 0))
                st = TPK_ERROR(ctx, TPK_EINVAL, "--fit-ratio must be > 0 (got %s)", optarg);
            break;
        case OPT_ALLOUT: o->all_outputs = 1; break;
        case OPT_LN: o->layernorm = 1; break;
        case OPT_PROGRESS: o->progress = 1; break;
        case OPT_NOPROGRESS: o->progress = 0; break;
        case OPT_QUIET: o->quiet = 1; break;
        case OPT_HELP: fputs(usage, stdout); return -1;
        case OPT_VERSION: printf("gplimits (tpk) %s\n", TPK_VERSION); return -1;
        default:
            return TPK_ERROR(ctx, TPK_EINVAL, "unknown or malformed option '%s' (see --help)",
                             argv[optind - 1]);
        }
    }
    if (st)
        return st;
    if (optind < argc)
        return TPK_ERROR(ctx, TPK_EINVAL, "unexpected argument '%s' (see --help)", argv[optind]);
    if (!arch == !o->program)
        return TPK_ERROR(ctx, TPK_EINVAL, "give exactly one of --arch and --program (see --help)");
    if (arch) {
        char names[512];
        if (!(o->arch = tpk_arch_find(arch)))
            return TPK_ERROR(ctx, TPK_EINVAL, "--arch: unknown architecture '%s' (known: %s)",
                             arch, tpk_arch_names(names, sizeof names));
        if (!o->arch->program)
            return TPK_ERROR(ctx, TPK_EUNSUPPORTED, "--arch=%s has no NETSOR program to run at "
                             "finite width", arch);
    }
    for (int f = 0; f < o->nflags; f++) {
        const char *flag = o->fl[f].flag;
        if (!o->arch)
            return TPK_ERROR(ctx, TPK_EINVAL, "unknown option '--%s': architecture flags go with "
                             "--arch; use --set NAME=VALUE with --program", flag);
        if (!tpk_arch_flag_param(o->arch, flag, o->fl_param[f], sizeof o->fl_param[0]))
            return TPK_ERROR(ctx, TPK_EINVAL, "unknown option '--%s' for --arch=%s (see --help "
                             "and gpkernel --list-archs)", flag, o->arch->name);
        o->fl[f].param = o->fl_param[f];
        if ((st = tpk_arch_check_flag(flag, o->fl[f].value, reg, ctx)))
            return st;
    }
    if (o->layernorm && !o->arch)
        return TPK_ERROR(ctx, TPK_EINVAL, "--layernorm goes with --arch=mlp");
    if (!o->output)
        return TPK_ERROR(ctx, TPK_EINVAL, "--output=FILE.h5 is required");
    return TPK_OK;
}

/* ---- The run state: raw per-(width, seed) results ---------------------------------------------- */

typedef struct run {
    size_t W, S, N, NN;
    double *khat;          /* W × S × N × N */
    double *y;             /* W × S × N sampled outputs */
    double *done;          /* W × S, 1 when finished */
    char config[4096];     /* what the raw data depends on; a checkpoint must match it */
    char partial[4200];
} run;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int write_checkpoint(const run *r, tpk_ctx *ctx)
{
    tpk_h5out *h = tpk_h5out_open(r->partial, ctx);
    if (!h)
        return ctx->status;
    size_t d4[4] = {r->W, r->S, r->N, r->N}, d3[3] = {r->W, r->S, r->N}, d2[2] = {r->W, r->S};
    tpk_array a4 = {4, {d4[0], d4[1], d4[2], d4[3]}, r->khat};
    tpk_array a3 = {3, {d3[0], d3[1], d3[2], 0}, r->y};
    tpk_array a2 = {2, {d2[0], d2[1], 0, 0}, r->done};
    tpk_h5out_write(h, "/khat", &a4, ctx);
    tpk_h5out_write(h, "/outputs", &a3, ctx);
    tpk_h5out_write(h, "/done", &a2, ctx);
    tpk_h5out_attr_str(h, "/", "gplimits_config", r->config, ctx);
    return tpk_h5out_commit(h, ctx);
}

/* Load raw data into r from a checkpoint (prefix "") or a finished output ("/per_seed") if its
 * configuration matches. */
static int read_checkpoint(run *r, const char *file, const char *prefix, tpk_ctx *ctx)
{
    hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0)
        return TPK_ERROR(ctx, TPK_EIO, "%s: cannot open checkpoint", file);
    /* The writer stores strings as variable-length UTF-8 (core/io_h5out.c). */
    char *vl = NULL, *cfg = NULL;
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    hid_t at = H5Aexists_by_name(f, "/", "gplimits_config", H5P_DEFAULT) > 0
                   ? H5Aopen_by_name(f, "/", "gplimits_config", H5P_DEFAULT, H5P_DEFAULT)
                   : -1;
    if (at >= 0 && H5Aread(at, t, &vl) >= 0 && vl) {
        cfg = strdup(vl);
        H5free_memory(vl);
    }
    if (at >= 0)
        H5Aclose(at);
    H5Tclose(t);
    int ok = cfg != NULL;
    H5Fclose(f);
    if (!ok) {
        free(cfg);
        return TPK_ERROR(ctx, TPK_EFORMAT, "%s: not a gplimits checkpoint", file);
    }
    if (strcmp(cfg, r->config) != 0) {
        int st = TPK_ERROR(ctx, TPK_EINVAL,
                           "%s was made by a run with different settings (program, inputs, "
                           "widths, seeds); remove it or rerun with the same options.\n"
                           "  checkpoint: %s\n  this run:   %s",
                           file, cfg, r->config);
        free(cfg);
        return st;
    }
    free(cfg);
    const char *names[3] = {"/khat", "/outputs", "/done"};
    double *dst[3] = {r->khat, r->y, r->done};
    size_t want[3] = {r->W * r->S * r->NN, r->W * r->S * r->N, r->W * r->S};
    int nread = prefix[0] ? 2 : 3; /* a finished file has every seed done */
    if (nread == 2)
        for (size_t k = 0; k < want[2]; k++)
            r->done[k] = 1;
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

static void progress_draw(size_t wdone, size_t W, size_t sdone, size_t total, size_t todo_at_start,
                          size_t done_now, double t0)
{
    double el = now_s() - t0, frac = (double)sdone / (double)total;
    size_t ran = done_now;
    double eta = ran > 0 ? el * (double)(todo_at_start - ran) / (double)ran : 0;
    int bar = 30, fill = (int)(frac * bar);
    fprintf(stderr, "\r[%.*s%*s] widths %zu/%zu  seeds %zu/%zu  ETA %02d:%02d ", fill,
            "==============================", bar - fill, "", wdone, W, sdone, total,
            (int)(eta / 60), (int)fmod(eta, 60));
    fflush(stderr);
}

/* ---- Statistics and output --------------------------------------------------------------------- */

static int write_vec(tpk_h5out *h, const char *name, const double *v, size_t n, tpk_ctx *ctx)
{
    tpk_array a = {1, {n, 0, 0, 0}, (double *)v};
    return tpk_h5out_write(h, name, &a, ctx);
}

/* A fit as a small dataset plus readable attributes. */
static int write_fit(tpk_h5out *h, const char *name, const tpk_limits_fit *f, const double *n,
                     tpk_ctx *ctx)
{
    static const char *const keys[] = {"slope", "slope_lo", "slope_hi", "slope_median",
                                       "intercept", "slope_ols_se", "c1", "c1_lo", "c1_hi",
                                       "c2", "c2_lo", "c2_hi", "first_width", "boot_failures"};
    double v[14] = {f->slope, f->slope_lo, f->slope_hi, f->slope_med, f->intercept, f->slope_se,
                    f->c1, f->c1_lo, f->c1_hi, f->c2, f->c2_lo, f->c2_hi, n[f->first],
                    (double)f->nfail};
    write_vec(h, name, v, 14, ctx);
    for (int i = 0; i < 14; i++)
        tpk_h5out_attr_double(h, name, keys[i], v[i], ctx);
    tpk_h5out_attr_int(h, name, "boot_replicates", (long long)f->nboot, ctx);
    return ctx->status;
}

typedef struct summary {
    tpk_limits_fit rms, shape, rbw1, kurt, sw;
    tpk_limits_window window;
    int have_sw, auto_window;
    int degenerate;  /* the conditional variance at w1_input does not vary over networks */
    double vdev;     /* max over (width, seed) of |v − v_inf| / v_inf */
} summary;

/* Below this relative spread of the per-network output variance at the W1 coordinate, the
 * variance is fixed by the architecture (LayerNorm's unit diagonal) up to rounding; a real
 * finite-width spread is O(n^-1/2) >= 1e-3 at any width the executor runs. */
#define DEGENERATE_SPREAD 1e-9
/* theory.md §7.4 asks S >= 64; with 16 the transformer's intervals missed -1/2 at 2 of 4 seed
 * bases while 128 seeds cover it (limits/README.md). */
#define MIN_SEEDS_FOR_CI 64

static int analyse(const run *r, const opts *o, const double *n, const tpk_array *K, tpk_h5out *h,
                   summary *sum, tpk_ctx *ctx)
{
    size_t W = r->W, S = r->S, N = r->N, NN = r->NN, i0 = o->w1_input;
    int st = TPK_OK;
    double *err = malloc(W * S * sizeof *err), *v = malloc(W * S * sizeof *v);
    double *col[16];
    for (int c = 0; c < 16; c++)
        col[c] = calloc(W, sizeof(double));
    double *theta = malloc(o->slices * N * sizeof *theta), *proj = malloc(S * sizeof *proj);
    tpk_limits_fit *stab = calloc(W, sizeof *stab);
    if (!err || !v || !theta || !proj || !stab)
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    for (int c = 0; c < 16 && st == TPK_OK; c++)
        if (!col[c])
            st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    for (size_t k = 0; k < W * S && st == TPK_OK; k++) {
        st = tpk_limits_frob_rel(r->khat + k * NN, K->data, NN, &err[k], ctx);
        v[k] = r->khat[k * NN + i0 * N + i0];
    }
    if (st)
        goto done;
    sum->vdev = 0;
    for (size_t k = 0; k < W * S; k++)
        sum->vdev = fmax(sum->vdev, fabs(v[k] - K->data[i0 * N + i0]) / K->data[i0 * N + i0]);
    sum->degenerate = sum->vdev < DEGENERATE_SPREAD;
    /* Per width: bias/fluctuation, plain RB-W1 and its floor, variance part, sample statistics. */
    enum { RMS, RMS_LO, RMS_HI, BIAS, BIAS_DEB, BIAS2_DEB, BIAS_FLOOR, FLUCT, RBW1, RBW1_FLOOR,
           SHAPE, SHAPE_LO, SHAPE_HI, VARPART, KURT_MIX, KURT_Y };
    double vinf = K->data[i0 * N + i0];
    for (size_t w = 0; w < W && st == TPK_OK; w++) {
        tpk_limits_bias_result b;
        st = tpk_limits_bias(r->khat + w * S * NN, S, NN, K->data, &b, ctx);
        if (st)
            break;
        col[BIAS][w] = b.bias;
        col[BIAS_DEB][w] = b.bias_debiased;
        col[BIAS2_DEB][w] = b.bias2_debiased;
        col[BIAS_FLOOR][w] = b.floor;
        col[FLUCT][w] = b.fluct;
        st = tpk_limits_rbw1(v + w * S, S, vinf, &col[RBW1][w], ctx);
        if (st == TPK_OK)
            st = tpk_limits_rbw1_floor(v + w * S, S, 200, o->seed + 7 * w, &col[RBW1_FLOOR][w],
                                       ctx);
        double vbar = 0;
        for (size_t s = 0; s < S; s++)
            vbar += v[w * S + s] / (double)S;
        col[VARPART][w] = sqrt(2 / M_PI) * fabs(sqrt(vbar) - sqrt(vinf));
        for (size_t s = 0; s < S; s++)
            proj[s] = r->y[(w * S + s) * N + i0];
        if (st == TPK_OK)
            st = tpk_limits_kurtosis(proj, S, &col[KURT_Y][w], ctx);
    }
    if (st)
        goto done;
    /* Fitting window. Default: the rule of tpk_limits_fit_window on the RMS error (it never
     * looks at the fitted exponent; theory.md §7.4): if the all-widths paired-bootstrap two-term
     * fit resolves an n^-1 term (c2's interval excludes 0), start at the smallest n_min where
     * it is at most --fit-ratio of the n^-1/2 term, keeping >= 3 widths; else keep all widths.
     * The same window serves every fit; /fits/rms_stability shows every other choice. */
    tpk_limits_boot_opts bo = {o->boot, o->seed, 0.95, 1, 0};
    tpk_limits_series ds_err = {W, S, 1, n, err}, ds_v = {W, S, 1, n, v};
    st = tpk_limits_stability(&ds_err, tpk_limits_stat_rms, NULL, &bo, stab, ctx);
    size_t first = 0;
    tpk_limits_window *win = &sum->window;
    memset(win, 0, sizeof *win);
    sum->auto_window = o->fit_min_width == FIT_AUTO;
    if (st == TPK_OK && sum->auto_window)
        st = tpk_limits_fit_window(n, W, &stab[0], o->fit_ratio, W >= 3 ? 3 : 2, win, ctx);
    if (st)
        goto done;
    if (sum->auto_window)
        first = win->first;
    else
        while (first < W && n[first] < (double)o->fit_min_width)
            first++;
    if (first + 2 > W) {
        st = TPK_ERROR(ctx, TPK_EINVAL, "--fit-min-width=%zu leaves fewer than 2 widths to fit",
                       o->fit_min_width);
        goto done;
    }
    /* Paired bootstrap: seed s is network BASE + s at every width (nested, theory.md §7.3). */
    bo.first = first;
    st = tpk_limits_boot_fit(&ds_err, tpk_limits_stat_rms, NULL, &bo, &sum->rms, col[RMS],
                             col[RMS_LO], col[RMS_HI], ctx);
    if (st == TPK_OK)
        st = tpk_limits_boot_fit(&ds_v, tpk_limits_stat_rbw1, NULL, &bo, &sum->shape, col[SHAPE],
                                 col[SHAPE_LO], col[SHAPE_HI], ctx);
    if (st == TPK_OK)
        st = tpk_limits_boot_fit(&ds_v, tpk_limits_stat_rbw1, &vinf, &bo, &sum->rbw1, NULL, NULL,
                                 NULL, ctx);
    if (st == TPK_OK)
        st = tpk_limits_boot_fit(&ds_v, tpk_limits_stat_mix_kurtosis, NULL, &bo, &sum->kurt,
                                 col[KURT_MIX], NULL, NULL, ctx);
    if (st)
        goto done;

    /* Sliced over all used inputs: RB (variance-matched and plain), samples vs GP floor. */
    double *sw_shape = calloc(W, sizeof(double)), *sw_plain = calloc(W, sizeof(double)),
           *sw_y = calloc(W, sizeof(double)), fl_mean = 0, fl_sd = 0;
    if (!sw_shape || !sw_plain || !sw_y) {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    } else {
        st = tpk_limits_directions(N, o->slices, o->seed, theta, ctx);
        tpk_limits_slices sl = {N, o->slices, theta, K->data, 0};
        for (size_t w = 0; w < W && st == TPK_OK; w++) {
            st = tpk_limits_rbsw1(r->khat + w * S * NN, S, &sl, &sw_plain[w], ctx);
            if (st == TPK_OK)
                st = tpk_limits_sw1_samples(r->y + w * S * N, S, &sl, &sw_y[w], ctx);
        }
        if (st == TPK_OK)
            st = tpk_limits_sw1_gp_floor(S, &sl, 50, o->seed, &fl_mean, &fl_sd, ctx);
        sl.matched = 1;
        tpk_limits_series ds_k = {W, S, NN, n, r->khat};
        tpk_limits_boot_opts bs = bo;
        bs.B = o->boot / 5 < 50 ? 50 : o->boot / 5;
        if (st == TPK_OK)
            st = tpk_limits_boot_fit(&ds_k, tpk_limits_stat_rbsw1, &sl, &bs, &sum->sw, sw_shape,
                                     NULL, NULL, ctx);
        sum->have_sw = st == TPK_OK;
    }

    /* Output. */
    if (st == TPK_OK) {
        static const char *const names[16] = {
            "/per_width/rms", "/per_width/rms_lo", "/per_width/rms_hi", "/per_width/bias",
            "/per_width/bias_debiased", "/per_width/bias2_debiased", "/per_width/bias_floor",
            "/per_width/fluctuation", "/per_width/rbw1", "/per_width/rbw1_floor",
            "/per_width/rbw1_shape", "/per_width/rbw1_shape_lo", "/per_width/rbw1_shape_hi",
            "/per_width/rbw1_variance_part", "/per_width/kurtosis_mixture",
            "/per_width/kurtosis_samples"};
        tpk_array e2 = {2, {W, S, 0, 0}, err}, v2 = {2, {W, S, 0, 0}, v};
        tpk_h5out_write(h, "/per_seed/frob_rel", &e2, ctx);
        tpk_h5out_write(h, "/per_seed/w1_input_variance", &v2, ctx);
        for (int c = 0; c < 16; c++)
            write_vec(h, names[c], col[c], W, ctx);
        write_vec(h, "/per_width/sliced_rbw1", sw_plain, W, ctx);
        write_vec(h, "/per_width/sliced_rbw1_shape", sw_shape, W, ctx);
        write_vec(h, "/per_width/sliced_w1_samples", sw_y, W, ctx);
        tpk_h5out_attr_double(h, "/per_width/sliced_w1_samples", "gp_floor_mean", fl_mean, ctx);
        tpk_h5out_attr_double(h, "/per_width/sliced_w1_samples", "gp_floor_sd", fl_sd, ctx);
        tpk_array th = {2, {o->slices, N, 0, 0}, theta};
        tpk_h5out_write(h, "/slices", &th, ctx);
        write_fit(h, "/fits/rms", &sum->rms, n, ctx);
        write_fit(h, "/fits/rbw1_shape", &sum->shape, n, ctx);
        tpk_h5out_attr_int(h, "/per_seed/w1_input_variance", "degenerate", sum->degenerate, ctx);
        tpk_h5out_attr_double(h, "/per_seed/w1_input_variance", "max_relative_deviation",
                              sum->vdev, ctx);
        write_fit(h, "/fits/rbw1", &sum->rbw1, n, ctx);
        write_fit(h, "/fits/kurtosis_mixture", &sum->kurt, n, ctx);
        write_fit(h, "/fits/sliced_rbw1_shape", &sum->sw, n, ctx);
        double *stb = malloc((W - 1) * 4 * sizeof *stb);
        if (stb) {
            for (size_t k = 0; k + 1 < W; k++) {
                stb[k * 4] = n[k];
                stb[k * 4 + 1] = stab[k].slope;
                stb[k * 4 + 2] = stab[k].slope_lo;
                stb[k * 4 + 3] = stab[k].slope_hi;
            }
            tpk_array sa = {2, {W - 1, 4, 0, 0}, stb};
            tpk_h5out_write(h, "/fits/rms_stability", &sa, ctx);
            tpk_h5out_attr_str(h, "/fits/rms_stability", "columns",
                               "first_width slope slope_lo slope_hi", ctx);
            free(stb);
        }
        /* How the window was chosen (tpk_limits_fit_window): on /fits/rms. */
        tpk_h5out_attr_str(h, "/fits/rms", "window_rule",
                           sum->auto_window
                               ? "auto: in the all-widths two-term fit of the RMS error, if c2's "
                                 "95% interval excludes 0, the smallest width with |c2|/(c1 "
                                 "sqrt(n)) <= window_ratio, >= 3 widths kept; else all widths"
                               : "--fit-min-width", ctx);
        if (sum->auto_window) {
            const tpk_limits_window *wn = &sum->window;
            tpk_h5out_attr_double(h, "/fits/rms", "window_ratio", o->fit_ratio, ctx);
            tpk_h5out_attr_double(h, "/fits/rms", "window_c1_all_widths", wn->c1, ctx);
            tpk_h5out_attr_double(h, "/fits/rms", "window_c2_all_widths", wn->c2, ctx);
            tpk_h5out_attr_double(h, "/fits/rms", "window_ratio_at_first", wn->ratio_at_first,
                                  ctx);
            tpk_h5out_attr_double(h, "/fits/rms", "window_n_needed", wn->n_needed, ctx);
            tpk_h5out_attr_int(h, "/fits/rms", "window_capped", wn->capped, ctx);
            tpk_h5out_attr_int(h, "/fits/rms", "window_c2_resolved", wn->resolved, ctx);
        }
        st = ctx->status;
    }
    if (st == TPK_OK && !o->quiet) {
        printf("%7s %11s %11s %11s %11s %11s %11s %11s\n", "width", "rms", "bias_deb", "floor",
               "fluct", "rbw1_shape", "rbw1", "rbw1_floor");
        for (size_t w = 0; w < W; w++)
            printf("%7g %11.4e %11.4e %11.4e %11.4e %11.4e %11.4e %11.4e\n", n[w], col[RMS][w],
                   col[BIAS_DEB][w], col[BIAS_FLOOR][w], col[FLUCT][w], col[SHAPE][w],
                   col[RBW1][w], col[RBW1_FLOOR][w]);
        const struct { const char *name; const tpk_limits_fit *f; double expect; } rows[] = {
            {"RMS kernel error", &sum->rms, -0.5},
            {"RB-W1 law distance (variance-matched)", &sum->shape, -1},
            {"RB-W1 vs GP (plain, floor-limited)", &sum->rbw1, -1},
            {"excess kurtosis (mixture)", &sum->kurt, -1},
            {"sliced RB-W1 (variance-matched)", &sum->sw, -1}};
        for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++)
            printf("%-40s exponent %7.3f  95%% CI [%7.3f, %7.3f]  (expected %g: %s)\n",
                   rows[k].name, rows[k].f->slope, rows[k].f->slope_lo, rows[k].f->slope_hi,
                   rows[k].expect,
                   sum->degenerate && k >= 1 && k <= 3 ? "degenerate, see below"
                   : rows[k].f->slope_lo <= rows[k].expect && rows[k].expect <= rows[k].f->slope_hi
                       ? "inside"
                       : "outside");
        if (S < MIN_SEEDS_FOR_CI)
            printf("note: %zu seeds < %d (theory.md §7.4): percentile-bootstrap intervals from so "
                   "few networks are too narrow and the window rule's c2 test too eager (see "
                   "limits/README.md)\n", S, MIN_SEEDS_FOR_CI);
        if (sum->degenerate)
            printf("note: the output variance at coordinate %zu is the same for every network "
                   "(max relative deviation %.1e; e.g. LayerNorm): its 1-D law is exactly the GP's "
                   "and the 1-D fits above are of rounding noise; the sliced distance is the "
                   "law statistic here\n", o->w1_input, sum->vdev);
        printf("two-term RMS fit (n >= %g): %.4g n^-1/2 + %.4g n^-1\n", n[sum->rms.first],
               sum->rms.c1, sum->rms.c2);
        if (sum->auto_window) {
            const tpk_limits_window *wn = &sum->window;
            if (!wn->resolved)
                printf("fit window n >= %g: all widths give %.4g n^-1/2 + %.4g n^-1 [c2 95%% CI "
                       "%.3g, %.3g]: the n^-1 term is not resolved, every width is fitted\n",
                       n[sum->rms.first], wn->c1, wn->c2, stab[0].c2_lo, stab[0].c2_hi);
            else
                printf("fit window n >= %g: all widths give %.4g n^-1/2 + %.4g n^-1 [c2 95%% CI "
                       "%.3g, %.3g], whose n^-1 term is %.3g of the n^-1/2 term there (rule: <= "
                       "%g%s)\n", n[sum->rms.first], wn->c1, wn->c2, stab[0].c2_lo,
                       stab[0].c2_hi, wn->ratio_at_first, o->fit_ratio,
                       wn->capped ? "; NOT MET: capped to keep 3 widths" : "");
            if (wn->capped)
                printf("warning: widths up to >= %.0f are needed for the O(1/n) correction to be "
                       "small; the exponent is biased toward %s\n", wn->n_needed,
                       wn->c2 > 0 ? "steeper values" : "shallower values");
        }
        printf("RMS exponent as small widths are dropped:");
        for (size_t k = 0; k + 1 < W; k++)
            printf(" n>=%g: %.3f", n[k], stab[k].slope);
        printf("\nsliced W1 of samples vs GP: %.3e at n=%g (GP-vs-GP floor %.3e +- %.1e)\n",
               sw_y[W - 1], n[W - 1], fl_mean, fl_sd);
    }
    free(sw_shape);
    free(sw_plain);
    free(sw_y);
done:
    free(err);
    free(v);
    for (int c = 0; c < 16; c++)
        free(col[c]);
    free(theta);
    free(proj);
    free(stab);
    return st;
}

/* ---- main ------------------------------------------------------------------------------------- */

/* Pick K evenly spaced items (rows along axis 0) of x. */
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

/* Settings of gpkernel's custom jobs that are not program parameters, translated for the
 * finite-width comparison of the program itself: attention runs its 1/n program (the 1/sqrt(n)
 * limit is not a GP, gpattention compares with it); the CNNs' padding and filter become the
 * program's circular and k (kh, kw), their readouts (gap/flatten, computed by gpkernel's direct
 * recursion) are not programs' outputs: gplimits compares the per-position readouts. */
/* The flag the user typed for `param`, or NULL. */
static const char *typed_flag(const opts *o, const char *param)
{
    for (int f = 0; f < o->nflags; f++)
        if (strcmp(o->fl[f].param, param) == 0)
            return o->fl[f].flag;
    return NULL;
}

static int job_settings(const opts *o, tpk_param_set *sets, int *n, char buf[3][32],
                        tpk_ctx *ctx)
{
    const tpk_arch *a = o->arch;
    int k = 0, twod = strcmp(a->name, "cnn2d") == 0;
    tpk_param_set out[MAX_SETS + 16];
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

static int set_by_user(const opts *o, const char *name)
{
    for (int i = 0; i < o->nsets; i++)
        if (strcmp(o->sets[i].name, name) == 0)
            return 1;
    return 0;
}

/* Load the program for these inputs: sequences N×T×d set a parameter T, images N×rows×cols×C
 * set rows and cols and are given to the back ends as N×(rows·cols)×C (the same memory), unless
 * the user set those with --set (as tpk_job_kernel does). */
static tpk_program *load_program(const char *path, const opts *o, tpk_param_set *sets, int nsets,
                                 tpk_array *x, const tpk_phi_registry *reg, tpk_ctx *ctx)
{
    char buf[2][32];
    tpk_netsor_opts no = {sets, nsets, 1, 0, NULL};
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

int main(int argc, char **argv)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    gsl_set_error_handler_off();
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    opts o = {.seeds = 64, .seed = 1, .max_inputs = 8, .boot = 1000, .slices = 8, .progress = -1,
              .fit_min_width = FIT_AUTO, .fit_ratio = FIT_RATIO_DEFAULT};
    /* Argument copy: --set splits its argument in place, the provenance wants the original. */
    char **av = malloc((size_t)(argc + 1) * sizeof *av);
    for (int i = 0; i < argc; i++)
        av[i] = strdup(argv[i]);
    av[argc] = NULL;
    tpk_phi_registry *reg = tpk_job_registry(&ctx); /* built-ins plus sqrt (LN, attention) */
    int rc = reg ? parse_args(argc, av, reg, &o, &ctx) : ctx.status;
    if (rc == -1) {
        for (int i = 0; i < argc; i++)
            free(av[i]);
        free(av);
        tpk_phi_registry_free(reg);
        return 0;
    }
    if (o.nwidths == 0 && rc == TPK_OK)
        rc = parse_widths("32..2048", &o, &ctx);

    tpk_program *prog = NULL;
    tpk_array *xall = NULL, *x = NULL, *K = NULL;
    tpk_input_info info;
    run r;
    memset(&r, 0, sizeof r);
    char pathbuf[4096], lists[2048], jbuf[3][32];
    double nw[MAX_WIDTHS], *rows = NULL;
    const char *prog_path = o.program;
    tpk_param_set sets[MAX_SETS + 16];
    int nsets = 0;
    if (rc)
        goto fail;

    if (o.arch) {
        const char *rel = NULL;
        if (tpk_arch_program(o.arch, o.layernorm, o.fl, o.nflags, &rel, &ctx) ||
            tpk_arch_sets(o.arch, o.fl, o.nflags, o.sets, o.nsets, sets, MAX_SETS + 8, &nsets,
                          lists, sizeof lists, &ctx) ||
            job_settings(&o, sets, &nsets, jbuf, &ctx))
            goto fail;
        prog_path = tpk_shipped_path(rel, pathbuf, sizeof pathbuf);
    } else {
        for (int i = 0; i < o.nsets; i++)
            sets[nsets++] = o.sets[i];
    }
    char demo[4096];
    const char *input = o.input ? o.input
                      : tpk_shipped_path(o.arch ? o.arch->input : "data/demo-inputs.csv", demo,
                                         sizeof demo);
    xall = tpk_io_read(input, &info, &ctx);
    if (!xall)
        goto fail;
    size_t Nall = xall->dims[0], N = o.max_inputs == 0 || o.max_inputs > Nall ? Nall : o.max_inputs;
    rows = malloc(N * sizeof *rows);
    if (!rows || !(x = subset(xall, N, rows, &ctx)))
        goto fail;
    prog = load_program(prog_path, &o, sets, nsets, x, reg, &ctx);
    if (!prog)
        goto fail;
    if (prog->features & TPK_FEAT_SQRT_N_LOGITS) {
        TPK_ERROR(&ctx, TPK_EUNSUPPORTED,
                  "%s has 1/sqrt(n) logits: its limit is not a GP (theory.md §5); compare "
                  "with the hierarchical limit by gpattention (law distances, kurtosis, heads) "
                  "and gpkernel --arch=attention (its mean kernel and score covariances)",
                  prog_path);
        goto fail;
    }
    double kerr = 0;
    if (tpk_netsor_kernel(prog, x, o.all_outputs, &K, &kerr, &ctx))
        goto fail;
    /* The compared kernel: N×N (last output) or (N·O)×(N·O) input-major (--all-outputs); the
     * sampled outputs y are N×O in the same order, so one coordinate index serves both. */
    size_t kdim = K->dims[0];
    if (K->ndim != 2 || K->dims[1] != kdim || kdim % N != 0) {
        TPK_ERROR(&ctx, TPK_EUNSUPPORTED, "unexpected limit kernel shape for %zu inputs", N);
        goto fail;
    }
    if (o.w1_input >= kdim) {
        TPK_ERROR(&ctx, TPK_EINVAL, "--w1-input=%zu: only %zu output coordinates (%zu inputs x "
                  "%zu outputs) are compared", o.w1_input, kdim, N, kdim / N);
        goto fail;
    }

    /* Raw-data identity: program file digest, overrides, inputs, widths, seeds. */
    r.W = (size_t)o.nwidths;
    r.S = o.seeds;
    r.N = kdim;
    r.NN = kdim * kdim;
    {
        char psha[65] = "", *pos = r.config;
        FILE *pf = fopen(prog_path, "rb");
        if (pf) {
            char *buf = NULL;
            size_t cap = 0, len = 0, got;
            char chunk[4096];
            while ((got = fread(chunk, 1, sizeof chunk, pf)) > 0) {
                if (len + got > cap) {
                    cap = 2 * (len + got);
                    char *nb = realloc(buf, cap);
                    if (!nb)
                        break;
                    buf = nb;
                }
                memcpy(buf + len, chunk, got);
                len += got;
            }
            fclose(pf);
            tpk_sha256_hex(buf ? buf : "", len, psha);
            free(buf);
        }
        char xsha[65];
        tpk_sha256_array_hex(x, xsha);
        size_t left = sizeof r.config;
        int c = snprintf(pos, left, "gplimits/1 program_sha256=%s inputs_sha256=%s seeds=%zu "
                         "seed=%llu all_outputs=%d widths=", psha, xsha, r.S,
                         (unsigned long long)o.seed, o.all_outputs);
        for (int i = 0; i < o.nwidths && c > 0 && (size_t)c < left; i++)
            c += snprintf(pos + c, left - (size_t)c, "%zu,", o.widths[i]);
        /* the program's final parameter values: what the raw data depend on */
        for (int i = 0; i < prog->nparams && c > 0 && (size_t)c < left; i++)
            c += snprintf(pos + c, left - (size_t)c, " %s=%s", prog->param_name[i],
                          prog->param_value[i]);
    }
    snprintf(r.partial, sizeof r.partial, "%s.partial.h5", o.output);
    r.khat = calloc(r.W * r.S * r.NN, sizeof(double));
    r.y = calloc(r.W * r.S * r.N, sizeof(double));
    r.done = calloc(r.W * r.S, sizeof(double));
    if (!r.khat || !r.y || !r.done) {
        TPK_ERROR(&ctx, TPK_ENOMEM, "out of memory for %zu widths x %zu seeds", r.W, r.S);
        goto fail;
    }
    int have_partial = access(r.partial, F_OK) == 0;
    if (have_partial && !o.resume) {
        TPK_ERROR(&ctx, TPK_EINVAL, "%s exists (an interrupted run): rerun with --resume, or "
                  "remove it to start over", r.partial);
        goto fail;
    }
    if (have_partial && read_checkpoint(&r, r.partial, "", &ctx))
        goto fail;
    if (o.resume && !have_partial) {
        /* Re-analysis: a finished output with the same raw-data settings is reused as is, so
         * the statistics options (--boot, --fit-min-width, ...) can change without rerunning. */
        if (access(o.output, F_OK) == 0) {
            if (read_checkpoint(&r, o.output, "/per_seed", &ctx))
                goto fail;
            if (!o.quiet)
                fprintf(stderr, "gplimits: reusing the raw data of %s\n", o.output);
        } else if (!o.quiet) {
            fprintf(stderr, "gplimits: no checkpoint %s, starting from scratch\n", r.partial);
        }
    }

    for (int i = 0; i < o.nwidths; i++)
        nw[i] = (double)o.widths[i];
    int show = o.progress == 1 || (o.progress == -1 && isatty(STDERR_FILENO));
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    size_t total = r.W * r.S, ndone = 0;
    for (size_t k = 0; k < total; k++)
        ndone += r.done[k] != 0;
    size_t todo0 = total - ndone, ran = 0, wdone = 0, *wleft = calloc(r.W, sizeof *wleft);
    if (!wleft) {
        TPK_ERROR(&ctx, TPK_ENOMEM, "out of memory");
        goto fail;
    }
    for (size_t w = 0; w < r.W; w++) {
        for (size_t s = 0; s < r.S; s++)
            wleft[w] += r.done[w * r.S + s] == 0;
        wdone += wleft[w] == 0;
    }
    double t0 = now_s(), tlast = t0, tdraw = 0;
    int st = TPK_OK;
    size_t dirty = 0;
    /* Widths run in parallel with seeds: one loop over all (width, seed) pairs, widest first
     * (longest jobs first balances the threads). Peak memory is unchanged: one network per
     * thread, at most the widest. Results depend on (width, seed) alone. */
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t j = 0; j < total; j++) {
        size_t w = r.W - 1 - j / r.S, s = j % r.S;
        if (interrupted || st != TPK_OK || r.done[w * r.S + s] != 0)
            continue;
        tpk_ctx lctx;
        tpk_ctx_init(&lctx);
        tpk_array *Kh = NULL, *yy = NULL;
        int ls = tpk_netsor_run(prog, x, o.widths[w], o.seed + s, o.all_outputs, &Kh, &yy, &lctx);
#pragma omp critical(gplimits_store)
        {
            if (ls != TPK_OK) {
                if (st == TPK_OK)
                    st = TPK_ERROR(&ctx, ls, "width %zu, seed %llu: %s", o.widths[w],
                                   (unsigned long long)(o.seed + s), lctx.msg);
            } else if (tpk_array_size(Kh) != r.NN || tpk_array_size(yy) != r.N) {
                if (st == TPK_OK)
                    st = TPK_ERROR(&ctx, TPK_EUNSUPPORTED, "width %zu: the executor's kernel "
                                   "does not match the limit's shape", o.widths[w]);
            } else {
                memcpy(r.khat + (w * r.S + s) * r.NN, Kh->data, r.NN * sizeof(double));
                memcpy(r.y + (w * r.S + s) * r.N, yy->data, r.N * sizeof(double));
                r.done[w * r.S + s] = 1;
                ndone++;
                ran++;
                dirty++;
                wdone += --wleft[w] == 0;
                double t = now_s();
                if (t - tlast > CHECKPOINT_SECONDS) {
                    tpk_ctx cctx;
                    tpk_ctx_init(&cctx);
                    if (write_checkpoint(&r, &cctx) == TPK_OK)
                        dirty = 0;
                    else if (st == TPK_OK)
                        st = TPK_ERROR(&ctx, cctx.status, "checkpoint: %s", cctx.msg);
                    tlast = now_s();
                }
                if (show && t - tdraw > 0.2) {
                    progress_draw(wdone, r.W, ndone, total, todo0, ran, t0);
                    tdraw = t;
                }
            }
        }
        tpk_array_free(Kh);
        tpk_array_free(yy);
    }
    free(wleft);
    if (dirty && st == TPK_OK)
        st = write_checkpoint(&r, &ctx);
    if (show) {
        progress_draw(r.W, r.W, ndone, total, todo0, ran, t0);
        fputc('\n', stderr);
    }
    if (st)
        goto fail;
    if (interrupted) {
        fprintf(stderr, "gplimits: interrupted; %zu of %zu (width, seed) runs saved in %s; "
                "rerun with --resume\n", ndone, total, r.partial);
        rc = 130;
        goto out;
    }

    /* Final file: a function of the raw data and the options only, so a resumed run writes the
     * same datasets as an uninterrupted one. --resume is left out of the recorded command. */
    tpk_h5out *h = tpk_h5out_open(o.output, &ctx);
    if (!h)
        goto fail;
    {
        char **pv = malloc((size_t)argc * sizeof *pv);
        int pc = 0;
        for (int i = 0; pv && i < argc; i++)
            if (strcmp(argv[i], "--resume") != 0)
                pv[pc++] = argv[i];
        tpk_h5out_provenance(h, pc, pv, &ctx);
        free(pv);
    }
    tpk_h5out_input_attrs(h, "input", &info, xall, &ctx);
    tpk_h5out_attr_str(h, "/", "program", prog_path, &ctx);
    tpk_h5out_attr_str(h, "/", "gplimits_config", r.config, &ctx);
    tpk_h5out_attr_int(h, "/", "seed_base", (long long)o.seed, &ctx);
    tpk_h5out_attr_int(h, "/", "w1_input", (long long)o.w1_input, &ctx);
    tpk_h5out_attr_int(h, "/", "fit_min_width",
                       o.fit_min_width == SIZE_MAX ? -1 : (long long)o.fit_min_width, &ctx);
    tpk_h5out_attr_double(h, "/", "limit_kernel_error", kerr, &ctx);
    tpk_h5out_attr_str(h, "/", "layout",
                       "per_seed/khat[w][s] = tpk_netsor_run(program, inputs, widths[w], "
                       "seed_base + s) empirical kernel (sigma_v2 included); per_seed/outputs "
                       "sampled readouts; errors relative Frobenius; fits: log-log OLS of the "
                       "per-width statistic with paired bootstrap-over-seeds 95% percentile "
                       "intervals (theory.md §7.4)", &ctx);
    write_vec(h, "/widths", nw, r.W, &ctx);
    write_vec(h, "/input_rows", rows, N, &ctx);
    tpk_h5out_write(h, "/inputs", x, &ctx);
    tpk_h5out_write(h, "/kernel_limit", K, &ctx);
    {
        tpk_array a4 = {4, {r.W, r.S, r.N, r.N}, r.khat}, a3 = {3, {r.W, r.S, r.N, 0}, r.y};
        tpk_h5out_write(h, "/per_seed/khat", &a4, &ctx);
        tpk_h5out_write(h, "/per_seed/outputs", &a3, &ctx);
    }
    summary sm;
    memset(&sm, 0, sizeof sm);
    if (ctx.status || analyse(&r, &o, nw, K, h, &sm, &ctx)) {
        tpk_h5out_abort(h);
        goto fail;
    }
    if (tpk_h5out_commit(h, &ctx))
        goto fail;
    remove(r.partial);
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "gplimits: %s (%s)\n", ctx.msg[0] ? ctx.msg : "error",
            tpk_strerror(ctx.status ? ctx.status : TPK_EINVAL));
    rc = 1;
out:
    free(r.khat);
    free(r.y);
    free(r.done);
    free(rows);
    tpk_array_free(K);
    tpk_array_free(x);
    tpk_array_free(xall);
    tpk_program_free(prog);
    tpk_phi_registry_free(reg);
    for (int i = 0; i < argc; i++)
        free(av[i]);
    free(av);
    return rc;
}
