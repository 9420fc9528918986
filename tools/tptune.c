/* tptune: tune, inspect and generate tensor-program kernels (issue 6; tuner/README.md).
 *   tptune gemm --m=M --n=N --k=K [--dtype=f64|f32] [--target=cpu|cuda] [--threads=T]
 *               [--trials=N] [--batch=16] [--model=xgb|reg|latent|xgb+latent|random] [--seed=S]
 *               [--transfer=LOG] [--repeat=5] [--min-ms=50] --log=FILE
 *   tptune syrk --n=N --k=K [same options]   lower triangle of A·Aᵀ (Gram / covariance update)
 *   tptune map --n=N [same options]          ReLU NNGP map over the lower triangle (rate: G entries/s)
 *   tptune gen --op=map --class=C.conf --out=FILE LOG...   class C's map file (gen/tpk_map_cpu_C.c)
 *   tptune gen --op=classes --out=FILE C.conf...          the class index (gen/tpk_classes.c)
 *   tptune show LOG...                       best record per workload
 *   tptune show                              this CPU's class and the kernels serving each tuned shape
 *   tptune measure LOG... --log=OUT [--reverse=1]   measure every configuration again (a new pass)
 *   tptune emit --m= --n= --k= [--dtype=] [--target=] [--knobs=mr=8,nv=3,...]   print source
 *   tptune gen --class=C.conf --out=FILE LOG...   class C's GEMM kernels + table (gen/tpk_gemm_cpu_C.c);
 *                                            without --class: this host's class and profile
 *   tptune replay --log=FILE [--seeds=21] [--seed0=1] [--transfer=LOG[,LOG]] [--model=rank|reg]
 *                 [--batch=B] [--first=F] [--eps=E] [--div=D] [--depth=N] [--eta=X] [--rounds=N]
 *                                            random vs model vs model+transfer over a recorded table
 *   tptune replay TABLE --models=random,xgb,latent[,xgb+latent] --seeds=A-B [--tau-train=64]
 *                 [--latent=hidden=16,epochs=300,...]   the same per model; Kendall tau on held-out
 *                                            configurations; last line `medians: random R xgb X latent Y`
 *   tptune gen --target=cuda --out=FILE LOG...            CUDA library file (gen/tpk_gemm_cuda.cu)
 *   tptune cuda-check --out=DIR [--trials=N] [--seed=S]   kernels.cu + harness.cu for a device
 *   tptune port --from=CLASS --to=CLASS [--out=FILE] [--verify=0|1] [--data=DIR] [LOG...]
 *                                            carry class CLASS's tuned configurations to another class
 *                                            (passes, repair, exact verification); --out: seeds for --init
 *   tptune verify [--mutants=N] [--kinds=K,K] [--seed=S] [--class=ID] [--data=DIR]   exact checks of every shipped
 *                                            kernel (gen/) and the mutation suite (last line caught K/N)
 *   tptune ew [--n=N] [--tune] [--mutants=K] [--cache=FILE] [--emit=c|twin|cuda] SIG... | -
 *                                            fused entrywise candidates: emitted, verified, timed, cached */
#include <errno.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tpk/gemm.h"
#include "tpk/io.h"
#include "tpk/tune.h"
#ifndef TPTUNE_GENERATOR
#include "../runtime/gemm_gen.h"
#include "../runtime/machine_gen.h"
#include "../runtime/map_gen.h"
#endif

/* The shipped machine classes live in gen/, which the generator build must not need. */
#ifdef TPTUNE_GENERATOR
#define CLASS_FIND NULL
#else
#define CLASS_FIND tpk_machine_find
#endif

#include "cli.h" /* the exit statuses only: tptune does not link cli.o */

#ifndef TPK_VERSION
#define TPK_VERSION "unknown"
#endif

static void usage(FILE *f)
{
    fputs("usage: tptune gemm --m=M --n=N --k=K [--dtype=f64|f32] [--target=cpu|cuda] [--threads=T]\n"
          "                   [--trials=N] [--batch=B] [--model=xgb|reg|latent|xgb+latent|random] [--seed=S]\n"
          "                   [--transfer=LOG] [--repeat=R] [--min-ms=MS] [--vendor=0|1] [--latent=K=V,...]\n"
          "                   [--init=PORTED.jsonl] --log=FILE\n"
          "       tptune syrk --n=N --k=K [options as for gemm]\n"
          "       tptune map --n=N [options as for gemm]   (ReLU NNGP map; rates in G entries/s)\n"
          "       tptune gen --op=map --class=CLASS.conf --out=FILE LOG...\n"
          "       tptune gen --op=classes --out=FILE CLASS.conf...\n"
          "       tptune show [LOG...]   (no LOG: this CPU's machine class and the kernels it serves)\n"
          "       tptune measure LOG... --log=OUT [--reverse=0|1] [--repeat=R] [--min-ms=MS] [--vendor=0|1]\n"
          "       tptune emit --m=M --n=N --k=K [--dtype=..] [--target=..] [--threads=T] [--knobs=a=1,b=2]\n"
          "                   [--twin=1] [--mutant=KIND[:SITE]]   (a map's Z_p twin; a mutant of tptune verify)\n"
          "       tptune gen --class=CLASS.conf --out=FILE LOG...\n"
          "       tptune replay --log=FILE [--seeds=S] [--seed0=S0] [--trials=N] [--transfer=LOG[,LOG...]]\n"
          "                     [--model=rank|reg] [--batch=B] [--first=F] [--eps=E] [--div=D] [--depth=N]\n"
          "                     [--eta=X] [--rounds=N]\n"
          "       tptune replay TABLE --models=random,xgb,latent[,xgb+latent] [--seeds=A-B] [--tau-train=N]\n"
          "                     [--init=PORTED.jsonl]   (each model also seeded by those configurations)\n"
          "                     [--latent=hidden=H,trans=M,head=G,epochs=E,refit=R,lr=X,aux=W,l2=X,unlab=U]\n"
          "           last line `medians: random R xgb X latent Y` (trials to 95% of the table's best)\n"
          "       tptune gen --target=cuda --out=FILE LOG...\n"
          "       tptune cuda-check --out=DIR [--trials=RANDOM_CONFIGS] [--seed=S] [--m= --n= --k=]\n"
          "       tptune port --from=CLASS --to=CLASS [--out=FILE] [--verify=0|1] [--data=DIR] [LOG...]\n"
          "           CLASS: an id of data/machines (avx512-intel) or a .conf path; --out: the ported configurations\n"
          "           as unmeasured records of the target class, measured first by tptune gemm --init=FILE\n"
          "       tptune port --from=CLASS --to=sm_90 --out=DIR   (the class's relu map schedules as CUDA map\n"
          "           kernels DIR/relu_map_*.cu: host emulation verified, nvcc sm_90 registers and spills)\n"
          "       tptune verify [--mutants=N] [--kinds=K,K] [--seed=S] [--class=ID] [--data=DIR]\n"
          "           every shipped kernel of the classes this CPU runs: GEMM/SYRK exactly on integers, maps by\n"
          "           their Z_p twin (and the kernel within tolerance); --mutants: N injected bugs, last line\n"
          "           `caught K/N`; exit 1 on any failure\n"
          "       tptune ew [--n=N] [--threads=T] [--lanes=4|8] [--chunk=C] [--pre=0|1] [--tune] [--repeat=R]\n"
          "                 [--cache=FILE|none]\n"
          "                 [--mutants=K] [--seed=S] [--emit=c|twin|cuda] SIG... | -\n"
          "           fused entrywise candidates (signatures, docs/orchestration.md §7.3; - reads them from stdin,\n"
          "           e.g. from `netsor plan --signatures`): each verified exactly (Z_p twin) and against libm, then\n"
          "           timed at n (cached per machine class, signature, n, threads and schedule); --tune: every\n"
          "           schedule; --mutants: K injected bugs per signature, last line `caught K/N`; --emit: the source\n"
          "       tptune --help | --version\n"
          "Options take their value as --opt=VALUE or --opt VALUE.\n"
          CLI_EXIT_HELP, f);
}

typedef struct args {
    tpk_tune_task task;
    int trials, batch, model, seeds, repeat, vendor, reverse;
    int first, depth, rounds, seed0; /* replay search settings; -1: the search's default */
    const char *models;              /* replay --models=random,xgb,latent */
    int tau_train;                   /* replay --tau-train: configurations the held-out tau fits on */
    tpk_tune_latent_opts latent;     /* --latent=K=V,...; seed 0: the run's seed */
    int unlabelled;                  /* --latent=unlab=U */
    const char *from, *to, *init;    /* port --from/--to; gemm --init: configurations measured first */
    int verify;                      /* port --verify */
    int mutants;                     /* verify --mutants */
    int twin;                        /* emit --twin: a map kernel's Z_p twin */
    const char *mutant;              /* emit --mutant=KIND[:SITE] */
    const char *kinds;               /* verify --kinds=K,K: the mutation kinds drawn from */
    const char *data;                /* verify --data: the folder of machines/ and tuning/ */
    double min_ms, eps, div, eta;
    unsigned long long seed;
    const char *log, *transfer, *knobs, *out, *cls;
    int classes; /* gen --op=classes */
    const char *files[64];
    int nfiles;
} args;

static int parse_size(const char *v, size_t *out)
{
    char *end;
    errno = 0;
    if (*v == '-' || *v == '+' || *v == ' ') /* strtoull would wrap "-1" to 2^64 - 1 */
        return -1;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || *end || end == v || x == 0)
        return -1;
    *out = (size_t)x;
    return 0;
}

/* A seed: any decimal integer >= 0 that fits 64 bits (strtoull alone would take "-1" as 2^64 - 1
 * and "abc" as 0). */
static int parse_seed(const char *v, unsigned long long *out)
{
    char *end;
    errno = 0;
    if (*v < '0' || *v > '9')
        return -1;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || *end)
        return -1;
    *out = x;
    return 0;
}

static int parse_int(const char *v, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < 0 || x > 1000000000)
        return -1;
    *out = (int)x;
    return 0;
}

static int parse_frac(const char *v, double *out, double max)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || *end || end == v || !(x >= 0 && x <= max))
        return -1;
    *out = x;
    return 0;
}

/* A model name: xgb (= rank, xgb-rank), reg (xgb-reg), latent, xgb+latent, random; -1 otherwise. */
static int model_kind(const char *v)
{
    if (!strcmp(v, "rank") || !strcmp(v, "xgb") || !strcmp(v, "xgb-rank"))
        return TPK_TUNE_MODEL_XGB_RANK;
    if (!strcmp(v, "reg") || !strcmp(v, "xgb-reg"))
        return TPK_TUNE_MODEL_XGB_REG;
    if (!strcmp(v, "latent"))
        return TPK_TUNE_MODEL_LATENT;
    if (!strcmp(v, "xgb+latent"))
        return TPK_TUNE_MODEL_XGB_LATENT;
    if (!strcmp(v, "random"))
        return TPK_TUNE_MODEL_RANDOM;
    return -1;
}

#define MAX_MODELS 8

/* Split "random,xgb,latent" into kinds and names (buf holds the names); the count, -1 if a name
 * is unknown or there are more than MAX_MODELS. */
static int models_split(const char *list, char *buf, size_t cap, int *kind, const char **name)
{
    snprintf(buf, cap, "%s", list);
    int n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == MAX_MODELS || (kind[n] = model_kind(tok)) < 0)
            return -1;
        name[n++] = tok;
    }
    return n;
}

static int models_check(const char *list)
{
    char buf[256];
    int kind[MAX_MODELS];
    const char *name[MAX_MODELS];
    return models_split(list, buf, sizeof buf, kind, name) < 1;
}

/* --seeds=N (seeds seed0 .. seed0 + N - 1) or --seeds=A-B. */
static int parse_seeds(const char *v, args *a)
{
    const char *dash = strchr(v, '-');
    if (!dash)
        return parse_int(v, &a->seeds) || a->seeds < 1;
    char lo[32];
    int b;
    if ((size_t)(dash - v) >= sizeof lo)
        return -1;
    memcpy(lo, v, (size_t)(dash - v));
    lo[dash - v] = '\0';
    if (parse_int(lo, &a->seed0) || parse_int(dash + 1, &b) || b < a->seed0)
        return -1;
    a->seeds = b - a->seed0 + 1;
    return 0;
}

/* --latent=hidden=16,trans=32,head=16,epochs=300,refit=100,lr=0.01,aux=1,l2=1e-4,unlab=128 */
static int parse_latent(const char *v, args *a)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", v);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq)
            return -1;
        *eq = '\0';
        const char *val = eq + 1;
        tpk_tune_latent_opts *l = &a->latent;
        int bad;
        if (!strcmp(tok, "hidden"))
            bad = parse_int(val, &l->hidden) || l->hidden < 1 || l->hidden > 256;
        else if (!strcmp(tok, "trans"))
            bad = parse_int(val, &l->trans_hidden) || l->trans_hidden < 1 || l->trans_hidden > 256;
        else if (!strcmp(tok, "head"))
            bad = parse_int(val, &l->head_hidden) || l->head_hidden < 1 || l->head_hidden > 256;
        else if (!strcmp(tok, "epochs"))
            bad = parse_int(val, &l->epochs);
        else if (!strcmp(tok, "refit"))
            bad = parse_int(val, &l->refit_epochs);
        else if (!strcmp(tok, "lr"))
            bad = parse_frac(val, &l->lr, 1) || l->lr == 0;
        else if (!strcmp(tok, "aux"))
            bad = parse_frac(val, &l->aux_weight, 1000);
        else if (!strcmp(tok, "l2"))
            bad = parse_frac(val, &l->l2, 1);
        else if (!strcmp(tok, "pw"))
            bad = parse_int(val, &l->pair_weight) || l->pair_weight > 1;
        else if (!strcmp(tok, "unlab"))
            bad = parse_int(val, &a->unlabelled);
        else
            bad = 1;
        if (bad)
            return -1;
    }
    return 0;
}

/* The search options of the command line's model settings (replay's and the tuner's). */
static void latent_into(const args *a, tpk_tune_opts *o, tpk_tune_latent_opts *lo)
{
    *lo = a->latent;
    if (lo->seed == 0)
        lo->seed = o->seed;
    o->latent = lo;
    if (a->unlabelled >= 0)
        o->latent_unlabelled = a->unlabelled;
}

static int parse_args(int argc, char **argv, args *a)
{
    memset(a, 0, sizeof *a);
    a->task.target = TPK_TUNE_CPU;
    a->task.dtype = TPK_TUNE_F64;
    a->task.threads = 1;
    a->trials = 64;
    a->batch = 16;
    a->model = TPK_TUNE_MODEL_XGB_RANK;
    a->seeds = 21;
    a->repeat = 5;
    a->vendor = 1;
    a->min_ms = 50;
    a->seed = 1;
    a->first = a->depth = a->rounds = -1;
    a->eps = a->div = a->eta = -1;
    a->seed0 = 1;
    a->tau_train = 64;
    tpk_tune_latent_opts_default(&a->latent);
    a->latent.seed = 0;
    a->unlabelled = -1;
    a->verify = 1;
    const char *given[64][2]; /* option names and values so far: each option at most once */
    int ngiven = 0;
    for (int i = 2; i < argc; i++) {
        char *s = argv[i];
        if (strncmp(s, "--", 2) != 0) {
            if (a->nfiles == 64)
                return -1;
            a->files[a->nfiles++] = s;
            continue;
        }
        char *eq = strchr(s, '=');
        const char *k = s + 2, *v;
        if (eq) {
            *eq = '\0';
            v = eq + 1;
        } else if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
            v = argv[++i]; /* --name value */
        } else {
            fprintf(stderr, "tptune: option %s needs a value (--name=value or --name value)\n", s);
            return -1;
        }
        for (int g = 0; g < ngiven; g++)
            if (!strcmp(given[g][0], k)) {
                fprintf(stderr, "tptune: --%s given twice ('%s', then '%s'): give it once\n", k,
                        given[g][1], v);
                return -1;
            }
        if (ngiven < 64) {
            given[ngiven][0] = k;
            given[ngiven++][1] = v;
        }
        int bad = 0;
        if (!strcmp(k, "m"))
            bad = parse_size(v, &a->task.m);
        else if (!strcmp(k, "n"))
            bad = parse_size(v, &a->task.n);
        else if (!strcmp(k, "k"))
            bad = parse_size(v, &a->task.k);
        else if (!strcmp(k, "dtype")) {
            if (!strcmp(v, "f64"))
                a->task.dtype = TPK_TUNE_F64;
            else if (!strcmp(v, "f32"))
                a->task.dtype = TPK_TUNE_F32;
            else
                bad = 1;
        } else if (!strcmp(k, "target")) {
            if (!strcmp(v, "cpu"))
                a->task.target = TPK_TUNE_CPU;
            else if (!strcmp(v, "cuda"))
                a->task.target = TPK_TUNE_CUDA;
            else
                bad = 1;
        } else if (!strcmp(k, "op")) {
            if (!strcmp(v, "gemm"))
                a->task.op = TPK_TUNE_GEMM;
            else if (!strcmp(v, "syrk"))
                a->task.op = TPK_TUNE_SYRK;
            else if (!strcmp(v, "map") || !strcmp(v, "relu_map"))
                a->task.op = TPK_TUNE_MAP;
            else if (!strcmp(v, "classes"))
                a->classes = 1;
            else
                bad = 1;
        } else if (!strcmp(k, "model"))
            bad = (a->model = model_kind(v)) < 0;
        else if (!strcmp(k, "models"))
            bad = models_check(a->models = v);
        else if (!strcmp(k, "latent"))
            bad = parse_latent(v, a);
        else if (!strcmp(k, "tau-train"))
            bad = parse_int(v, &a->tau_train) || a->tau_train < 2; else if (!strcmp(k, "threads"))
            bad = parse_int(v, &a->task.threads) || a->task.threads < 1;
        else if (!strcmp(k, "trials"))
            bad = parse_int(v, &a->trials) || a->trials < 1;
        else if (!strcmp(k, "batch"))
            bad = parse_int(v, &a->batch) || a->batch < 1;
        else if (!strcmp(k, "seeds"))
            bad = parse_seeds(v, a);
        else if (!strcmp(k, "repeat"))
            bad = parse_int(v, &a->repeat) || a->repeat < 1 || a->repeat > TPK_TUNE_MAX_REPEAT;
        else if (!strcmp(k, "vendor"))
            bad = parse_int(v, &a->vendor) || a->vendor > 1;
        else if (!strcmp(k, "reverse"))
            bad = parse_int(v, &a->reverse) || a->reverse > 1;
        else if (!strcmp(k, "min-ms"))
            bad = (a->min_ms = atof(v)) <= 0;
        else if (!strcmp(k, "seed"))
            bad = parse_seed(v, &a->seed);
        else if (!strcmp(k, "seed0"))
            bad = parse_int(v, &a->seed0);
        else if (!strcmp(k, "first"))
            bad = parse_int(v, &a->first);
        else if (!strcmp(k, "depth"))
            bad = parse_int(v, &a->depth) || a->depth < 1;
        else if (!strcmp(k, "rounds"))
            bad = parse_int(v, &a->rounds) || a->rounds < 1;
        else if (!strcmp(k, "eps"))
            bad = parse_frac(v, &a->eps, 1);
        else if (!strcmp(k, "div"))
            bad = parse_frac(v, &a->div, 64);
        else if (!strcmp(k, "eta"))
            bad = parse_frac(v, &a->eta, 1) || a->eta == 0;
        else if (!strcmp(k, "log"))
            a->log = v;
        else if (!strcmp(k, "transfer"))
            a->transfer = v;
        else if (!strcmp(k, "knobs"))
            a->knobs = v;
        else if (!strcmp(k, "out"))
            a->out = v;
        else if (!strcmp(k, "class"))
            a->cls = v;
        else if (!strcmp(k, "mutants"))
            bad = parse_int(v, &a->mutants) || a->mutants < 1;
        else if (!strcmp(k, "data"))
            a->data = v;
        else if (!strcmp(k, "twin"))
            bad = parse_int(v, &a->twin) || a->twin > 1;
        else if (!strcmp(k, "mutant"))
            a->mutant = v;
        else if (!strcmp(k, "kinds"))
            a->kinds = v;
        else if (!strcmp(k, "from"))
            a->from = v;
        else if (!strcmp(k, "to"))
            a->to = v;
        else if (!strcmp(k, "init"))
            a->init = v;
        else if (!strcmp(k, "verify"))
            bad = parse_int(v, &a->verify) || a->verify > 1;
        else {
            fprintf(stderr, "tptune: unknown option --%s\n", k);
            return -1;
        }
        if (bad) {
            fprintf(stderr, "tptune: bad value for --%s: '%s'\n", k, v);
            return -1;
        }
    }
    return 0;
}

/* An output that names one of the inputs (the LOG or class files, --class, --from, --to, or
 * `more`) would destroy it or mix the new records into it (issue 18: gen and port replaced their
 * own input log): refused, compared by device and inode (tpk_io_check_output). */
static int output_not_input(const char *out, const args *a, const char *const *more, int nmore,
                            tpk_ctx *ctx)
{
    const char *in[64 + 8];
    size_t n = 0;
    for (int i = 0; i < a->nfiles; i++)
        in[n++] = a->files[i];
    const char *named[] = {a->cls, a->from, a->to, a->init, a->transfer};
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
        in[n++] = named[i];
    for (int i = 0; i < nmore && n < sizeof in / sizeof in[0]; i++)
        in[n++] = more[i];
    return tpk_io_check_output(out, in, n, ctx) ? 1 : 0;
}

static int need_shape(const args *a)
{
    if (!a->task.m || !a->task.n || !a->task.k) {
        fprintf(stderr, "tptune: --m, --n and --k are required\n");
        return -1;
    }
    return 0;
}

static void progress(void *u, int batch, int trials, double best, const char *knobs, const tpk_tune_result *last)
{
    (void)u;
    printf("batch %3d  trials %4d  best %8.2f GFLOP/s (fastest repeat)  last: err %d cpu %.2f load %.2f  %s\n", batch,
           trials, best, last->err, last->cpu_ratio, last->load1, knobs);
    fflush(stdout);
}

/* A search's measurements, and how many trials failed with each enum tpk_tune_err code (the
 * message of a search whose trials all failed names them: issue 18). */
typedef struct measure_tally {
    tpk_tune_measure_opts *mo;
    int err[8];
} measure_tally;

static int measure_cb(void *u, const tpk_tune_space *s, const tpk_tune_config *c, tpk_tune_result *r, tpk_ctx *ctx)
{
    measure_tally *t = u;
    int st = tpk_tune_measure(s, c, t->mo, r, ctx);
    if (!st)
        t->err[r->err >= 0 && r->err < 8 ? r->err : 7]++;
    return st;
}

/* "2 crash or timeout (err 4), 1 compile (err 1)" into buf. */
static const char *tally_str(const measure_tally *t, char *buf, size_t cap)
{
    static const char *const what[8] = {"ok", "compile", "load", "wrong result",
                                        "crash or timeout", "no device", "invalid configuration",
                                        "other"};
    size_t k = 0;
    buf[0] = '\0';
    for (int e = 1; e < 8 && k < cap; e++)
        if (t->err[e])
            k += (size_t)snprintf(buf + k, cap - k, "%s%d %s (err %d)", k ? ", " : "", t->err[e],
                                  what[e], e);
    return buf;
}

/* Records of several logs into one array. */
static int read_files(const char *const *paths, int npaths, tpk_tune_record **out, size_t *nout, tpk_ctx *ctx)
{
    tpk_tune_record *all = NULL;
    size_t nall = 0;
    for (int i = 0; i < npaths; i++) {
        tpk_tune_record *r;
        size_t n;
        if (tpk_tune_log_read(paths[i], &r, &n, ctx)) {
            free(all);
            return 1;
        }
        tpk_tune_record *g = realloc(all, (nall + n + 1) * sizeof *g);
        if (!g) {
            free(r);
            free(all);
            TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
            return 1;
        }
        all = g;
        memcpy(all + nall, r, n * sizeof *r);
        nall += n;
        free(r);
    }
    *out = all;
    *nout = nall;
    return 0;
}

/* The same for a comma-separated list ("a.jsonl,b.jsonl"). */
static int read_logs(const char *list, tpk_tune_record **out, size_t *nout, tpk_ctx *ctx)
{
    char buf[4096];
    const char *paths[64];
    int np = 0;
    snprintf(buf, sizeof buf, "%s", list);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (np == 64)
            return TPK_ERROR(ctx, TPK_EINVAL, "more than 64 logs in '%.64s...'", list), 1;
        paths[np++] = tok;
    }
    return read_files(paths, np, out, nout, ctx);
}

#define INIT_MAX 8 /* configurations --init measures first: a first batch's worth */

/* The configurations of LOG (tptune port's output, or any log) that seed the search of space s:
 * those of this very workload first, then those of the other workloads of the same template, op,
 * dtype and threads, nearest shape first (tpk_gemm_shape_distance, the dispatcher's), up to INIT_MAX valid distinct ones. A
 * ported set holds one configuration per source workload, and a shape the source class never
 * tuned (the 512^3 replay table) still gets the neighbours' picks. */
static int init_configs(const char *path, const tpk_tune_space *s, tpk_tune_config **out, size_t *nout,
                        tpk_ctx *ctx)
{
    tpk_tune_record *r;
    size_t n;
    *out = NULL;
    *nout = 0;
    if (tpk_tune_log_read(path, &r, &n, ctx))
        return 1;
    tpk_tune_config *c = malloc((n + 1) * sizeof *c);
    double *dist = malloc((n + 1) * sizeof *dist);
    uint64_t *idx = malloc((n + 1) * sizeof *idx);
    if (!c || !dist || !idx) {
        free(r), free(c), free(dist), free(idx);
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        return 1;
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        const tpk_tune_task *t = &r[i].task;
        tpk_ctx q;
        tpk_ctx_init(&q);
        if (strcmp(r[i].template_name, s->template_name) || t->target != s->task.target || t->op != s->task.op ||
            t->dtype != s->task.dtype || t->threads != s->task.threads ||
            tpk_tune_record_config(s, &r[i], &c[m], &q) || !tpk_tune_space_valid(s, &c[m]))
            continue;
        uint64_t ii = tpk_tune_space_index(s, &c[m]);
        double d = tpk_gemm_shape_distance(t->m, t->n, t->k, s->task.m, s->task.n, s->task.k);
        size_t j = 0;
        while (j < m && idx[j] != ii)
            j++;
        if (j < m) { /* the same configuration twice: keep its nearest workload */
            dist[j] = d < dist[j] ? d : dist[j];
            continue;
        }
        idx[m] = ii;
        dist[m++] = d;
    }
    /* stable insertion sort by distance: the log's order breaks ties */
    for (size_t i = 1; i < m; i++)
        for (size_t j = i; j > 0 && dist[j] < dist[j - 1]; j--) {
            tpk_tune_config tc = c[j];
            double td = dist[j];
            uint64_t ti = idx[j];
            c[j] = c[j - 1], dist[j] = dist[j - 1], idx[j] = idx[j - 1];
            c[j - 1] = tc, dist[j - 1] = td, idx[j - 1] = ti;
        }
    size_t same = 0;
    while (same < m && dist[same] == 0)
        same++;
    *nout = m < INIT_MAX ? m : INIT_MAX;
    *out = c;
    printf("tptune: %zu configuration(s) from %s measured first (%zu of this workload, %zu of the nearest others)\n",
           *nout, path, same < *nout ? same : *nout, *nout > same ? *nout - same : 0);
    free(r), free(dist), free(idx);
    return 0;
}

/* Measuring options of the command line; candidates run in a fresh exec of this program
 * (tpk_tune_child_main), whose path goes to `self`. */
static void measure_opts(const args *a, tpk_tune_measure_opts *mo, char *self, size_t cap)
{
    tpk_tune_measure_opts_default(mo);
    mo->repeat = a->repeat;
    mo->min_repeat_ms = a->min_ms;
    mo->vendor = a->vendor; /* OpenBLAS side by side: the log then carries a load-robust ratio */
    ssize_t len = readlink("/proc/self/exe", self, cap - 1);
    if (len > 0) {
        self[len] = '\0';
        mo->runner = self;
    }
}

static int cmd_gemm(const args *a, tpk_ctx *ctx)
{
    if (need_shape(a))
        return 2;
    if (!a->log) {
        fprintf(stderr, "tptune: --log=FILE is required\n");
        return 2;
    }
    tpk_tune_space s;
    if (tpk_tune_space_init(&s, &a->task, ctx))
        return 1;
    tpk_tune_opts o;
    tpk_tune_opts_default(&o);
    o.trials = a->trials;
    o.plan_size = a->batch;
    o.model = a->model;
    o.seed = a->seed;
    tpk_tune_latent_opts lo;
    latent_into(a, &o, &lo);
    tpk_tune_record *hist = NULL;
    size_t nhist = 0;
    if (a->transfer) {
        if (tpk_tune_log_read(a->transfer, &hist, &nhist, ctx))
            return 1;
        o.history = hist;
        o.history_class = CLASS_FIND;
        o.nhistory = nhist;
    }
    /* --init: the ported (or any) log's configurations for this workload, measured first */
    tpk_tune_config *init = NULL;
    if (a->init) {
        if (init_configs(a->init, &s, &init, &o.ninitial, ctx)) {
            free(hist);
            return 1;
        }
        o.initial = init;
    }
    tpk_tune_measure_opts mo;
    char self[4096];
    measure_opts(a, &mo, self, sizeof self);
    FILE *log = fopen(a->log, "a");
    if (!log) {
        free(init);
        free(hist);
        TPK_ERROR(ctx, TPK_EIO, "%s: cannot open for appending: %s", a->log, strerror(errno));
        return 1;
    }
    printf("tptune: %s %s %s %zux%zux%zu, %d thread(s), space %llu points, %d trials in batches of %d\n",
           tpk_tune_target_class(a->task.target), tpk_tune_dtype_name(a->task.dtype), tpk_tune_op_name(a->task.op), a->task.m, a->task.n,
           a->task.k, s.task.threads, (unsigned long long)s.size, a->trials, a->batch);
    tpk_tune_outcome out;
    measure_tally tally = {.mo = &mo};
    int st = tpk_tune_run(&s, &o, measure_cb, &tally, log, progress, NULL, &out, ctx);
    fclose(log);
    free(hist);
    free(init);
    if (st)
        return 1;
    if (!(out.best_gflops > 0)) { /* every trial failed: no result, and say why */
        char why[256];
        TPK_ERROR(ctx, TPK_EIO, "all %d trials failed: %s%s (every record is in %s)", out.trials,
                  tally_str(&tally, why, sizeof why),
                  tally.err[TPK_TUNE_ENODEV] ? "; --target=cuda needs a CUDA device" : "",
                  a->log);
        return 1;
    }
    char buf[256];
    printf("best %.2f GFLOP/s after %d trials: %s\n", out.best_gflops, out.trials,
           tpk_tune_config_str(&s, &out.best, buf, sizeof buf));
    return 0;
}

/* Measure again every configuration of the given logs (first to last, or last to first), one
 * new record each appended to --log: a second pass over a replay table, or an old log on a new
 * machine. CPU records only; others are skipped with a count. */
static int cmd_measure(const args *a, tpk_ctx *ctx)
{
    if (a->nfiles == 0 || !a->log) {
        fprintf(stderr, "tptune measure: LOG... and --log=OUT are required\n");
        return 2;
    }
    if (output_not_input(a->log, a, NULL, 0, ctx))
        return 1;
    tpk_tune_record *r;
    size_t n;
    if (read_files(a->files, a->nfiles, &r, &n, ctx))
        return 1;
    tpk_tune_measure_opts mo;
    char self[4096];
    measure_opts(a, &mo, self, sizeof self);
    FILE *log = fopen(a->log, "a");
    if (!log) {
        free(r);
        TPK_ERROR(ctx, TPK_EIO, "%s: cannot open for appending: %s", a->log, strerror(errno));
        return 1;
    }
    int rc = 0;
    size_t done = 0, skipped = 0;
    for (size_t q = 0; q < n && !rc; q++) {
        const tpk_tune_record *rec = &r[a->reverse ? n - 1 - q : q];
        tpk_tune_space s;
        tpk_tune_config c;
        tpk_tune_result res;
        tpk_tune_record out;
        tpk_ctx quiet;
        tpk_ctx_init(&quiet);
        if (rec->task.target != TPK_TUNE_CPU || tpk_tune_space_init(&s, &rec->task, &quiet) ||
            tpk_tune_record_config(&s, rec, &c, &quiet)) {
            skipped++;
            continue;
        }
        if (tpk_tune_measure(&s, &c, &mo, &res, ctx)) {
            rc = 1;
            break;
        }
        tpk_tune_record_fill(&out, &s, &c, &res);
        if (tpk_tune_log_write(log, &out, ctx)) {
            rc = 1;
            break;
        }
        fflush(log);
        if (++done % 50 == 0 || q + 1 == n) {
            printf("measured %zu of %zu  last %.2f GFLOP/s (OpenBLAS beside it %.2f)  load %.2f\n", done, n,
                   tpk_tune_result_label(&res), res.vendor_gflops, res.load1);
            fflush(stdout);
        }
    }
    if (fclose(log) != 0 && !rc) {
        TPK_ERROR(ctx, TPK_EIO, "%s: write failed", a->log);
        rc = 1;
    }
    if (skipped)
        printf("skipped %zu records (not CPU, or not a configuration of their space)\n", skipped);
    free(r);
    return rc;
}

#ifndef TPTUNE_GENERATOR
/* tptune show without logs: which machine class serves this CPU and which kernel each shipped
 * workload shape gets (the generator build, which links no library, leaves this out). */
static void show_machine(void)
{
    int how;
    const tpk_machine *m = tpk_machine_select(&how);
    size_t nc;
    const tpk_machine *all = tpk_machine_classes(&nc);
    printf("cpu: %s (isa %s)\n", tpk_machine_host_name(), tpk_isa_name(tpk_machine_host_isa()));
    printf("shipped classes:");
    for (size_t i = 0; i < nc; i++)
        printf(" %s", all[i].name);
    printf("\nserving class: %s (%s)%s\n", m ? m->name : "none", tpk_machine_how_name(how),
           getenv("TPK_CLASS") && *getenv("TPK_CLASS") ? "  [TPK_CLASS is set]" : "");
    if (m)
        printf("  profile: %d-bit vectors, %d registers, L1 %.0f KiB, L2 %.0f KiB, L3 %.0f MiB\n",
               m->vector_bits, m->registers, m->l1 / 1024, m->l2 / 1024, m->l3 / 1048576);
    static const char *const hows[] = {"exact", "nearest", "default", "openblas"};
    static const char *const mhows[] = {"exact", "nearest", "default", "reference"};
    static const size_t shapes[][3] = {{1024, 1024, 1024}, {2048, 2048, 2048}, {4096, 4096, 4096},
                                       {2048, 64, 2048},   {4096, 64, 4096},   {500, 300, 200}};
    for (int op = 0; op < 2; op++)
        for (int d = 0; d < 2; d++)
            for (int t = 1; t <= 2; t++)
                for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
                    const char *name;
                    size_t mm = shapes[i][0], n = op ? mm : shapes[i][1], k = shapes[i][2];
                    int h = op ? tpk_syrk_tuned_choice(d, n, k, t, &name)
                               : tpk_gemm_tuned_choice(d, mm, n, k, t, &name);
                    printf("%s %s %5zux%5zux%5zu %d thr: %-8s %s\n", op ? "syrk" : "gemm", d ? "f32" : "f64",
                           mm, n, k, t, hows[h], name);
                }
    for (int d = 0; d < 2; d++)
        for (int t = 1; t <= 2; t++)
            for (size_t n = 1024; n <= 4096; n *= 4) {
                const char *name;
                int h = tpk_relu_map_tuned_choice(d, n, t, &name);
                printf("map  %s %5zu %d thr: %-8s %s\n", d ? "f32" : "f64", n, t, mhows[h], name);
            }
}
#endif

static int cmd_show(const args *a, tpk_ctx *ctx)
{
    if (a->nfiles == 0) {
#ifndef TPTUNE_GENERATOR
        show_machine();
        return 0;
#else
        usage(stderr);
        return 2;
#endif
    }
    for (int i = 0; i < a->nfiles; i++) {
        tpk_tune_record *r;
        size_t n;
        if (tpk_tune_log_read(a->files[i], &r, &n, ctx))
            return 1;
        printf("%s: %zu records\n", a->files[i], n);
        tpk_tune_log_show(r, n, stdout);
        free(r);
    }
    return 0;
}

static int cmd_emit(const args *a, tpk_ctx *ctx)
{
    if (need_shape(a))
        return 2;
    tpk_tune_space s;
    if (tpk_tune_space_init(&s, &a->task, ctx))
        return 1;
    tpk_tune_config c;
    tpk_tune_space_default(&s, &c);
    if (a->knobs && tpk_tune_config_parse(&s, &c, a->knobs, ctx))
        return 1;
    if (a->twin || a->mutant)
        return tpk_tune_emit_variant(&s, &c, a->twin, a->mutant, stdout, ctx) ? 1 : 0;
    return tpk_tune_emit(&s, &c, "tpk_kernel", 1, stdout, ctx) ? 1 : 0;
}

static int cmd_gen(const args *a, tpk_ctx *ctx)
{
    if (!a->out) {
        fprintf(stderr, "tptune gen: --out=FILE is required\n");
        return 2;
    }
    if (output_not_input(a->out, a, NULL, 0, ctx))
        return 1;
    int cpu = !a->classes && a->task.target == TPK_TUNE_CPU;
    /* Without --class: this host's class (its records, its sysconf profile), for a table tried by
     * hand; `make` always names a class file, so gen/ never depends on the host. */
    tpk_tune_class cls, *index = NULL;
    memset(&cls, 0, sizeof cls);
    tpk_machine_host(&cls.m);
    tpk_tune_record *all = NULL;
    size_t nall = 0;
    if (a->classes) {
        if (a->nfiles == 0) {
            fprintf(stderr, "tptune gen --op=classes: name the class files\n");
            return 2;
        }
        if (!(index = calloc((size_t)a->nfiles, sizeof *index))) {
            TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
            return 1;
        }
        for (int i = 0; i < a->nfiles; i++)
            if (tpk_tune_class_read(a->files[i], &index[i], ctx)) {
                free(index);
                return 1;
            }
    } else {
        if (cpu && a->cls && tpk_tune_class_read(a->cls, &cls, ctx))
            return 1;
        if (read_files(a->files, a->nfiles, &all, &nall, ctx))
            return 1;
    }
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", a->out);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        free(all);
        free(index);
        TPK_ERROR(ctx, TPK_EIO, "%s: cannot write: %s", tmp, strerror(errno));
        return 1;
    }
    int st = a->classes ? tpk_tune_gen_class_index(index, (size_t)a->nfiles, "tptune gen", f, ctx)
             : !cpu ? tpk_tune_gen_cuda_library(all, nall, "tptune gen", f, ctx)
             : a->task.op == TPK_TUNE_MAP ? tpk_tune_gen_map_library(all, nall, &cls.m, "tptune gen", f, ctx)
                                          : tpk_tune_gen_cpu_library(all, nall, &cls.m, "tptune gen", f, ctx);
    if (fclose(f) != 0 && !st)
        st = TPK_ERROR(ctx, TPK_EIO, "%s: write failed", tmp);
    free(all);
    free(index);
    if (st || rename(tmp, a->out) != 0) {
        remove(tmp);
        if (!st)
            TPK_ERROR(ctx, TPK_EIO, "%s: cannot rename: %s", a->out, strerror(errno));
        return 1;
    }
    return 0;
}

/* Replay: the recorded configurations of one workload are the whole universe; random search
 * and the model-guided search draw from it; trials to reach 95 % of its best, median over seeds. */
typedef struct table {
    uint64_t *idx;
    double *gf;
    size_t n;
} table;

static int table_measure(void *u, const tpk_tune_space *s, const tpk_tune_config *c, tpk_tune_result *r, tpk_ctx *ctx)
{
    (void)ctx;
    const table *t = u;
    uint64_t idx = tpk_tune_space_index(s, c);
    memset(r, 0, sizeof *r);
    r->err = TPK_TUNE_EINVALID;
    for (size_t i = 0; i < t->n; i++)
        if (t->idx[i] == idx) {
            r->err = t->gf[i] > 0 ? 0 : TPK_TUNE_ECRASH;
            r->gflops = t->gf[i];
            break;
        }
    return TPK_OK;
}

static int cmp_int(const void *a, const void *b)
{
    return *(const int *)a - *(const int *)b;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median over seeds of the trials one method needs to reach `target` on the table (trials + 1
 * when it never does). */
/* The search options of a replay run of `model` with seed `seed` (lo: room for the latent's). */
static void replay_opts(const args *a, int model, uint64_t seed, tpk_tune_opts *o, tpk_tune_latent_opts *lo)
{
    tpk_tune_opts_default(o);
    o->plan_size = a->batch;
    o->model = model;
    o->seed = seed;
    if (a->first >= 0)
        o->plan_first = a->first;
    if (a->eps >= 0)
        o->eps = a->eps;
    if (a->div >= 0)
        o->diversity = a->div;
    if (a->depth > 0)
        o->model_depth = a->depth;
    if (a->eta > 0)
        o->model_eta = a->eta;
    if (a->rounds > 0)
        o->rounds = a->rounds;
    latent_into(a, o, lo);
}

static int replay_median(const args *a, const tpk_tune_space *s, table *t, int trials, double target, int model,
                         const tpk_tune_record *hist, size_t nhist, const tpk_tune_config *init, size_t ninit,
                         int *lo, int *hi, tpk_ctx *ctx)
{
    int *need = malloc((size_t)a->seeds * sizeof *need);
    if (!need) {
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        return -1;
    }
    for (int sd = 0; sd < a->seeds; sd++) {
        tpk_tune_opts o;
        tpk_tune_latent_opts lopt;
        replay_opts(a, model, (uint64_t)(a->seed0 + sd), &o, &lopt);
        o.trials = trials;
        o.universe = t->idx;
        o.nuniverse = t->n;
        o.stop_at_gflops = target;
        o.history = hist;
        o.history_class = CLASS_FIND;
        o.nhistory = nhist;
        o.initial = init;
        o.ninitial = ninit;
        tpk_tune_outcome out;
        if (tpk_tune_run(s, &o, table_measure, t, NULL, NULL, NULL, &out, ctx)) {
            free(need);
            return -1;
        }
        need[sd] = out.trials_to_stop ? out.trials_to_stop : trials + 1;
    }
    qsort(need, (size_t)a->seeds, sizeof *need, cmp_int);
    int med = need[a->seeds / 2];
    *lo = need[0];
    *hi = need[a->seeds - 1];
    free(need);
    return med;
}

/* Median over the seeds of a model's Kendall tau on held-out configurations: fitted on a->tau_train
 * random configurations of the table (a different draw per seed), scored on the rest. */
static int replay_tau(const args *a, const tpk_tune_space *s, const table *t, int model, double *tau, tpk_ctx *ctx)
{
    double *v = malloc((size_t)a->seeds * sizeof *v);
    if (!v)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    int st = TPK_OK;
    for (int sd = 0; !st && sd < a->seeds; sd++) {
        tpk_tune_opts o;
        tpk_tune_latent_opts lopt;
        replay_opts(a, model, (uint64_t)(a->seed0 + sd), &o, &lopt);
        st = tpk_tune_model_tau(s, &o, t->idx, t->gf, t->n, (size_t)a->tau_train, &v[sd], ctx);
    }
    if (!st) {
        qsort(v, (size_t)a->seeds, sizeof *v, cmp_double);
        *tau = v[a->seeds / 2];
    }
    free(v);
    return st;
}

/* Exact median trials of random search without replacement when `hits` of `n` configurations
 * reach the target: the smallest t with P(no hit in t draws) = C(n−hits, t)/C(n, t) ≤ 1/2. */
static int random_median_exact(size_t n, size_t hits)
{
    double p = 1;
    for (size_t t = 0; t < n; t++) {
        p *= t + hits < n ? (double)(n - hits - t) / (double)(n - t) : 0.0;
        if (p <= 0.5)
            return (int)t + 1;
    }
    return (int)n;
}

/* Below this fraction of the table's median OpenBLAS rate, a record's OpenBLAS timing counts as
 * disturbed. The Zen 4 tables (recorded two at a time on the 2 cores) have 5-9 % of their records
 * below it, down to half the median; the Intel tables 1-2 %. */
#define REF_DISTURBED 0.9

static int ref_disturbed(const tpk_tune_result *res, double vmed)
{
    return vmed > 0 && res->vendor_gflops > 0 && res->vendor_gflops < REF_DISTURBED * vmed;
}

/* The table's labels. A configuration measured more than once (one record per pass) gets the
 * mean of its records: the best of them would select the passes' favourable noise. When every
 * successful record also timed OpenBLAS in the same child (--vendor=1), each record's rate is
 * taken relative to that vendor rate, times the table's median vendor rate (*vmed; 0 when the
 * labels are plain): the machine's drift between children, which moves both alike, cancels
 * (tuner/README.md "Search efficiency": raw labels of two idle passes differ by 6.5 % rms, the
 * relative ones by 3.9-5.4 %). A record with a disturbed OpenBLAS timing (ref_disturbed) is left
 * out of a configuration that has an undisturbed one. */
static int table_labels(const tpk_tune_record *r, size_t n, const tpk_tune_space *s, table *t, double *best,
                        int *passes, double *vmed, tpk_ctx *ctx)
{
    double *vend = malloc(n * sizeof *vend), *sum = calloc(n, sizeof *sum);
    int *cnt = calloc(n, sizeof *cnt), *slot = malloc(n * sizeof *slot);
    if (!vend || !sum || !cnt || !slot) {
        free(vend), free(sum), free(cnt), free(slot);
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        return 1;
    }
    size_t nvend = 0, nok = 0;
    for (size_t i = 0; i < n; i++) {
        tpk_tune_config c;
        tpk_ctx q;
        tpk_ctx_init(&q);
        slot[i] = -1;
        if (!tpk_tune_task_same(&r[i].task, &s->task) || tpk_tune_record_config(s, &r[i], &c, &q))
            continue;
        uint64_t idx = tpk_tune_space_index(s, &c);
        size_t j = 0;
        while (j < t->n && t->idx[j] != idx)
            j++;
        if (j == t->n)
            t->idx[t->n++] = idx;
        slot[i] = (int)j;
        if (tpk_tune_result_label(&r[i].result) > 0) {
            nok++;
            if (r[i].result.vendor_gflops > 0)
                vend[nvend++] = r[i].result.vendor_gflops;
        }
    }
    *vmed = 0;
    if (nok > 0 && nvend == nok) {
        qsort(vend, nvend, sizeof *vend, cmp_double);
        *vmed = vend[nvend / 2];
    }
    /* A record whose OpenBLAS timing fell well below the table's median was disturbed there
     * (other processes only slow a run down), and its relative label is inflated by it: it is
     * left out where the configuration has an undisturbed record (first pass: which have one). */
    int *clean = calloc(n, sizeof *clean);
    if (!clean) {
        free(vend), free(sum), free(cnt), free(slot);
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        if (slot[i] >= 0 && tpk_tune_result_label(&r[i].result) > 0 && !ref_disturbed(&r[i].result, *vmed))
            clean[slot[i]] = 1;
    for (size_t i = 0; i < n; i++) {
        if (slot[i] < 0 || (clean[slot[i]] && ref_disturbed(&r[i].result, *vmed)))
            continue;
        double g = tpk_tune_result_label_relative(&r[i].result, *vmed);
        if (g > 0) {
            sum[slot[i]] += g;
            cnt[slot[i]]++;
        }
    }
    free(clean);
    *best = 0;
    *passes = 0;
    for (size_t j = 0; j < t->n; j++) {
        t->gf[j] = cnt[j] ? sum[j] / cnt[j] : 0; /* failed in every record: 0 */
        *best = t->gf[j] > *best ? t->gf[j] : *best;
        *passes = cnt[j] > *passes ? cnt[j] : *passes;
    }
    free(vend), free(sum), free(cnt), free(slot);
    return 0;
}

static int cmd_replay(const args *a, tpk_ctx *ctx)
{
    const char *path = a->log ? a->log : a->nfiles == 1 ? a->files[0] : NULL;
    if (!path) {
        fprintf(stderr, "tptune replay: a table is required (TABLE or --log=FILE)\n");
        return 2;
    }
    /* The methods: --models, or the classic three (random, the --model, and it with transfer). */
    char mbuf[256];
    int kind[MAX_MODELS], nm;
    const char *mname[MAX_MODELS];
    if (a->models)
        nm = models_split(a->models, mbuf, sizeof mbuf, kind, mname);
    else {
        kind[0] = TPK_TUNE_MODEL_RANDOM;
        mname[0] = "random";
        kind[1] = a->model == TPK_TUNE_MODEL_RANDOM ? TPK_TUNE_MODEL_XGB_RANK : a->model;
        mname[1] = kind[1] == TPK_TUNE_MODEL_XGB_REG ? "xgb-reg" : kind[1] == TPK_TUNE_MODEL_XGB_RANK ? "xgb-rank"
                   : kind[1] == TPK_TUNE_MODEL_LATENT ? "latent" : "xgb+latent";
        nm = 2;
    }
    tpk_tune_record *r;
    size_t n;
    if (tpk_tune_log_read(path, &r, &n, ctx))
        return 1;
    if (n == 0) {
        free(r);
        TPK_ERROR(ctx, TPK_EINVAL, "%s: no records", path);
        return 1;
    }
    tpk_tune_space s;
    if (tpk_tune_space_init_record(&s, &r[0], CLASS_FIND, ctx)) {
        free(r);
        return 1;
    }
    table t = {malloc(n * sizeof(uint64_t)), malloc(n * sizeof(double)), 0};
    tpk_tune_record *hist = NULL;
    size_t nhist = 0, ninit = 0;
    tpk_tune_config *init = NULL;
    int rc = 1;
    if (!t.idx || !t.gf) {
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        goto done;
    }
    double best, vmed;
    int passes;
    if (table_labels(r, n, &s, &t, &best, &passes, &vmed, ctx))
        goto done;
    if (a->transfer && read_logs(a->transfer, &hist, &nhist, ctx))
        goto done;
    /* --init: the seeds a search measures first (tptune port's set); replay can label only those
     * the table holds, so a table meant for this is measured with them in it. */
    if (a->init) {
        if (init_configs(a->init, &s, &init, &ninit, ctx))
            goto done;
        size_t absent = 0;
        for (size_t i = 0; i < ninit; i++) {
            uint64_t ii = tpk_tune_space_index(&s, &init[i]);
            size_t j = 0;
            while (j < t.n && t.idx[j] != ii)
                j++;
            absent += j == t.n;
        }
        if (absent)
            printf("warning: %zu of the %zu --init configurations are not in the table (each counts as a failed trial)\n",
                   absent, ninit);
    }
    /* What transfer learns from: other workloads' records measured without competing load. */
    size_t nlearn = 0;
    for (size_t i = 0; i < nhist; i++)
        nlearn += !tpk_tune_task_same(&hist[i].task, &s.task) && tpk_tune_record_unloaded(&hist[i]);
    int trials = a->trials > 64 ? a->trials : (int)t.n;
    int near = 0;
    for (size_t i = 0; i < t.n; i++)
        near += t.gf[i] >= 0.95 * best;
    printf("replay: %zu distinct configurations of %zux%zux%zu %s, best %.2f GFLOP/s; target 95%% = %.2f "
           "(%d configurations reach it); seeds %d..%d\n",
           t.n, s.task.m, s.task.n, s.task.k, tpk_tune_dtype_name(s.task.dtype), best, 0.95 * best, near, a->seed0,
           a->seed0 + a->seeds - 1);
    if (vmed > 0)
        printf("labels: mean over up to %d records per configuration of the rate relative to OpenBLAS timed beside it, "
               "times its median %.2f GFLOP/s\n", passes, vmed);
    else
        printf("labels: mean over up to %d records per configuration of the fastest repeat's rate\n", passes);
    /* Each model cold, then (with --transfer) each but random with transfer, then (with --init)
     * each but random seeded: the classic run's third line is its model with transfer. */
    int med[3 * MAX_MODELS], lo, hi, exact = random_median_exact(t.n, (size_t)near), cold0 = -1;
    int nrun = 0, runk[3 * MAX_MODELS], runx[3 * MAX_MODELS];
    static const char *const variant[] = {"", "+transfer", "+init"};
    for (int x = 0; x < 3; x++)
        for (int i = 0; i < nm; i++)
            if (!x || (kind[i] != TPK_TUNE_MODEL_RANDOM && (x == 1 ? hist != NULL : init != NULL))) {
                runk[nrun] = i;
                runx[nrun++] = x;
            }
    for (int j = 0; j < nrun; j++) {
        int i = runk[j], k = kind[i];
        med[j] = replay_median(a, &s, &t, trials, 0.95 * best, k, runx[j] == 1 ? hist : NULL,
                               runx[j] == 1 ? nhist : 0, runx[j] == 2 ? init : NULL, runx[j] == 2 ? ninit : 0,
                               &lo, &hi, ctx);
        if (med[j] < 0)
            goto done;
        if (k == TPK_TUNE_MODEL_RANDOM && cold0 < 0)
            cold0 = med[j];
        char name[48];
        snprintf(name, sizeof name, "%s%s", mname[i], variant[runx[j]]);
        printf("%-19s trials to 95%% of best: median %4d (min %d, max %d) over %d seeds", name, med[j], lo, hi,
               a->seeds);
        if (k == TPK_TUNE_MODEL_RANDOM)
            printf("; exact median %d", exact);
        else if (cold0 > 0)
            printf("  ratio to random %.2f (to exact %.2f)", (double)med[j] / cold0, (double)med[j] / exact);
        else
            printf("  ratio to exact random %.2f", (double)med[j] / exact);
        if (runx[j]) {
            int c = 0; /* the same model's cold run */
            while (runk[c] != i || runx[c])
                c++;
            printf(", to cold %.2f", (double)med[j] / med[c]);
            if (runx[j] == 1)
                printf(" (%zu of %zu records: other workloads, measured without load)", nlearn, nhist);
            else
                printf(" (%zu seed configurations measured first)", ninit);
        }
        printf("\n");
    }
    if (a->models) {
        /* Held-out ranking quality of each model, then the medians, last. */
        printf("kendall tau on held-out configurations (fit on %d, scored on the other %zu; median over seeds):",
               a->tau_train, t.n > (size_t)a->tau_train ? t.n - (size_t)a->tau_train : 0);
        for (int i = 0; i < nm; i++) {
            double tau = 0;
            if (kind[i] != TPK_TUNE_MODEL_RANDOM && replay_tau(a, &s, &t, kind[i], &tau, ctx))
                goto done;
            printf(" %s %.3f", mname[i], tau);
        }
        printf("\nmedians:");
        for (int j = 0; j < nrun; j++)
            printf(" %s%s %d", mname[runk[j]], variant[runx[j]], med[j]);
        printf("\n");
    }
    rc = 0;
done:
    free(r);
    free(hist);
    free(init);
    free(t.idx);
    free(t.gf);
    return rc;
}

/* A machine class by id (DATA/machines/ID.conf) or as a .conf path. */
/* The class an id or a .conf path names; its file's path into path (cap bytes). */
static int read_class(const char *data, const char *spec, tpk_tune_class *c, char *path,
                      size_t cap, tpk_ctx *ctx)
{
    size_t len = strlen(spec);
    if (len > 5 && !strcmp(spec + len - 5, ".conf"))
        snprintf(path, cap, "%s", spec);
    else
        snprintf(path, cap, "%s/machines/%s.conf", data, spec);
    return tpk_tune_class_read(path, c, ctx);
}

/* The data folder: --data, else $TPK_ROOT/data, else ./data. */
static void data_dir(const args *a, char *data, size_t cap)
{
    const char *root = getenv("TPK_ROOT");
    if (a->data)
        snprintf(data, cap, "%s", a->data);
    else
        snprintf(data, cap, "%s/data", root && *root ? root : ".");
}

/* Port: class --from's tuned configurations to class --to, pass by pass, each verified. */
static int cmd_port(const args *a, tpk_ctx *ctx)
{
    if (!a->from || !a->to) {
        fprintf(stderr, "tptune port: --from=CLASS and --to=CLASS are required\n");
        return 2;
    }
    char data[4096], pat[4200];
    data_dir(a, data, sizeof data);
    tpk_tune_class from, to;
    char from_path[4400], to_path[4400];
    /* --to=sm_90: the class's relu map schedules as CUDA map kernels, --out a folder */
    const int cuda = !strcmp(a->to, "sm_90") || !strcmp(a->to, "cuda/sm_90");
    if (cuda && !a->out) {
        fprintf(stderr, "tptune port --to=sm_90: --out=DIR (a folder for the .cu files) is required\n");
        return 2;
    }
    if (read_class(data, a->from, &from, from_path, sizeof from_path, ctx) ||
        (!cuda && read_class(data, a->to, &to, to_path, sizeof to_path, ctx)))
        return 1;
    tpk_tune_record *recs;
    size_t nrec;
    const char *confs[2] = {from_path, to_path};
    if (!cuda && output_not_input(a->out, a, confs, 2, ctx))
        return 1;
    if (a->nfiles) {
        if (read_files(a->files, a->nfiles, &recs, &nrec, ctx))
            return 1;
    } else {
        snprintf(pat, sizeof pat, "%s/tuning/*.jsonl", data);
        glob_t g;
        if (glob(pat, 0, NULL, &g) != 0) {
            TPK_ERROR(ctx, TPK_EIO, "%s: no tuning logs (run from the repository, give LOG..., or --data=DIR)", pat);
            return 1;
        }
        if (output_not_input(a->out, a, (const char *const *)g.gl_pathv, (int)g.gl_pathc, ctx)) {
            globfree(&g);
            return 1;
        }
        int rc = read_files((const char *const *)g.gl_pathv, (int)g.gl_pathc, &recs, &nrec, ctx);
        globfree(&g);
        if (rc)
            return 1;
    }
    if (cuda) {
        struct stat sb;
        if (stat(a->out, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            free(recs);
            TPK_ERROR(ctx, TPK_EIO, "%s: not a folder", a->out);
            return 1;
        }
        char nvbuf[1024];
        const char *nv = tpk_tune_nvcc(nvbuf, sizeof nvbuf);
        printf("tptune port: %s (%s) relu map schedules -> CUDA sm_90 map kernels in %s; host emulation verified%s\n",
               from.m.name, from.id, a->out, nv ? ", compiled by nvcc (ptxas registers and spills)" : "; no nvcc found");
        int np = 0, nf = 0;
        int st = tpk_tune_port_map_cuda(recs, nrec, &from.m, a->out, nv, stdout, &np, &nf, ctx);
        free(recs);
        if (st)
            return 1;
        printf("ported %d of %d map schedules from %s to sm_90 (%d failed)\n", np, np + nf, from.id, nf);
        return nf ? 1 : 0;
    }
    FILE *out = NULL;
    if (a->out && !(out = fopen(a->out, "w"))) {
        free(recs);
        TPK_ERROR(ctx, TPK_EIO, "%s: cannot open for writing: %s", a->out, strerror(errno));
        return 1;
    }
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    self[len > 0 ? len : 0] = '\0';
    tpk_tune_mutant_opts vo = {.seed = a->seed, .runner = len > 0 ? self : NULL};
    printf("tptune port: %s (%s) -> %s (%s), %zu records%s\n", from.m.name, from.id, to.m.name, to.id, nrec,
           a->verify ? "; every changed kernel checked by the exact verifier" : "; not verified (--verify=0)");
    int np = 0, nf = 0;
    int st = tpk_tune_port(recs, nrec, &from.m, &to.m, a->verify ? &vo : NULL, stdout, out, &np, &nf, ctx);
    if (out && fclose(out) != 0 && !st)
        st = TPK_ERROR(ctx, TPK_EIO, "%s: write failed", a->out);
    free(recs);
    if (st)
        return 1;
    printf("ported %d of %d configurations from %s to %s (%d failed)\n", np, np + nf, from.id, to.id, nf);
    return nf ? 1 : 0;
}

/* Device-check bundle: kernels.cu + harness.cu for scripts/device-check.sh. */
static int cmd_cuda_check(const args *a, tpk_ctx *ctx)
{
    if (!a->out) {
        fprintf(stderr, "tptune cuda-check: --out=DIR is required\n");
        return 2;
    }
    size_t shapes[4][3] = {{4096, 4096, 4096}, {2048, 2048, 2048}, {8192, 64, 8192}, {4096, 64, 4096}};
    int nshape = 4;
    if (a->task.m && a->task.n && a->task.k) {
        shapes[0][0] = a->task.m, shapes[0][1] = a->task.n, shapes[0][2] = a->task.k;
        nshape = 1;
    }
    int nrand = a->trials == 64 ? 8 : a->trials; /* --trials: random configurations per dtype */
    return tpk_tune_emit_cuda_check(a->out, nrand, a->seed, (const size_t(*)[3])shapes, nshape, a->repeat, ctx) ? 1 : 0;
}

#ifndef TPTUNE_GENERATOR
/* tptune verify (issue 20 item 3): every kernel the library ships, for every class this CPU can
 * run. The kernels' configurations come from data/ exactly as the generator picks them
 * (tpk_tune_gen_kernels), matched by name with the compiled tables of gen/, so the check runs the
 * shipped code and knows its blocking; a table entry without its configuration is an error
 * (gen/ older than data/). */
typedef struct vlist {
    tpk_tune_space *s;
    tpk_tune_config *c;
    char (*name)[160];
    size_t n, cap;
} vlist;

static int vlist_add(vlist *l, const tpk_tune_space *s, const tpk_tune_config *c, const char *name)
{
    for (size_t i = 0; i < l->n; i++)
        if (!strcmp(l->name[i], name))
            return 0; /* one source, one mutant pool */
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        tpk_tune_space *ns = realloc(l->s, cap * sizeof *ns);
        if (ns)
            l->s = ns;
        tpk_tune_config *nc = realloc(l->c, cap * sizeof *nc);
        if (nc)
            l->c = nc;
        char(*nn)[160] = realloc(l->name, cap * sizeof *nn);
        if (nn)
            l->name = nn;
        if (!ns || !nc || !nn)
            return -1;
        l->cap = cap;
    }
    l->s[l->n] = *s;
    l->c[l->n] = *c;
    snprintf(l->name[l->n++], 160, "%s", name);
    return 0;
}

static void human(double x, char *buf, size_t cap)
{
    if (x >= 1e6)
        snprintf(buf, cap, "%.1fM", x / 1e6);
    else if (x >= 1e3)
        snprintf(buf, cap, "%.1fk", x / 1e3);
    else
        snprintf(buf, cap, "%.0f", x);
}

/* The shipped kernels of one class: *nok / *nbad verified / failed; the kernels join `all`. */
static int verify_class(size_t ci, const tpk_tune_record *recs, size_t nrec, const char *data, uint64_t seed,
                        vlist *all, int *nok, int *nbad, tpk_ctx *ctx)
{
    const tpk_machine *m = &tpk__machine_classes[ci];
    char path[4200];
    snprintf(path, sizeof path, "%s/machines/%s.conf", data, m->id);
    tpk_tune_class cls;
    if (tpk_tune_class_read(path, &cls, ctx))
        return 1;
    int rc = 0;
    for (int map = 0; map < 2 && !rc; map++) {
        tpk_tune_space *sp;
        tpk_tune_config *cf;
        char(*names)[160];
        size_t nk;
        if (tpk_tune_gen_kernels(recs, nrec, &cls.m, map, &sp, &cf, &names, &nk, ctx))
            return 1;
        const size_t len = map ? tpk__map_classes[ci]->len : tpk__gemm_classes[ci]->len, nd = map ? 2 : 4;
        char done[64][160];
        size_t ndone = 0;
        for (size_t e = 0; e < len + nd && !rc; e++) {
            const char *name;
            int threads;
            if (map) {
                const tpk__map_entry *me = e < len ? &tpk__map_classes[ci]->table[e] : &tpk__map_classes[ci]->defaults[e - len];
                name = me->dfn || me->sfn ? me->name : NULL;
                threads = me->threads;
            } else {
                const tpk__gemm_entry *ge =
                    e < len ? &tpk__gemm_classes[ci]->table[e] : &tpk__gemm_classes[ci]->defaults[e - len];
                name = ge->dfn || ge->sfn ? ge->name : NULL;
                threads = ge->threads;
            }
            int seen = !name;
            for (size_t q = 0; q < ndone && !seen; q++)
                seen = !strcmp(done[q], name);
            if (seen || ndone == 64)
                continue;
            snprintf(done[ndone++], 160, "%s", name);
            size_t ki = 0;
            while (ki < nk && strcmp(names[ki], name))
                ki++;
            if (ki == nk) {
                TPK_ERROR(ctx, TPK_EINVAL, "%s: gen/ ships %s, which data/ does not pick (regenerate gen/ with make)",
                          m->name, name);
                rc = 1;
                break;
            }
            tpk_tune_space s = sp[ki];
            if (threads > 0) /* the tuned thread count (defaults: the pick's, 2) */
                s.task.threads = threads;
            tpk_tune_verify_report r;
            char ent[32], line[256] = "";
            int st, ok;
            if (map) {
                const tpk__map_entry *me = e < len ? &tpk__map_classes[ci]->table[e] : &tpk__map_classes[ci]->defaults[e - len];
                double worst;
                st = tpk_tune_verify_map(&s, &cf[ki], seed, NULL, &r, ctx);
                const int tol = !st && tpk_tune_check_map(me->dfn, me->sfn, me->ws, s.task.threads, &worst);
                ok = !st && r.ok && tol;
                human((double)r.entries, ent, sizeof ent);
                snprintf(line, sizeof line, "Z_p twin: %d shapes, %d runs, %s elements, miss <= %.1e per wrong entry; "
                         "kernel within tolerance: %s (%.1e)", r.shapes, r.runs, ent, r.miss_bound, tol ? "yes" : "NO",
                         worst);
            } else {
                const tpk__gemm_entry *ge =
                    e < len ? &tpk__gemm_classes[ci]->table[e] : &tpk__gemm_classes[ci]->defaults[e - len];
                st = tpk_tune_verify_gemm(&s, &cf[ki], ge->dfn, ge->sfn, ge->ws, seed, &r, ctx);
                ok = !st && r.ok;
                human((double)r.entries, ent, sizeof ent);
                snprintf(line, sizeof line, "exact: %d shapes, %d runs, %s elements", r.shapes, r.runs, ent);
            }
            if (st) {
                rc = 1;
                break;
            }
            printf("  %-4s %s %d thr  %-58s %s  %s\n", map ? "map" : s.task.op == TPK_TUNE_SYRK ? "syrk" : "gemm",
                   tpk_tune_dtype_name(s.task.dtype), s.task.threads, name, line, ok ? "ok" : "FAILED");
            if (!r.ok)
                printf("      %s\n", r.what);
            *nok += ok;
            *nbad += !ok;
            if (vlist_add(all, &s, &cf[ki], name)) {
                TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
                rc = 1;
            }
            fflush(stdout);
        }
        free(sp);
        free(cf);
        free(names);
    }
    return rc;
}

static int cmd_verify(const args *a, tpk_ctx *ctx)
{
    char data[4096], pat[4200];
    const char *root = getenv("TPK_ROOT");
    snprintf(data, sizeof data, "%s", a->data ? a->data : root && *root ? root : ".");
    if (!a->data)
        strncat(data, "/data", sizeof data - strlen(data) - 1);
    snprintf(pat, sizeof pat, "%s/tuning/*.jsonl", data);
    glob_t g;
    if (glob(pat, 0, NULL, &g) != 0) {
        TPK_ERROR(ctx, TPK_EIO, "%s: no tuning logs (run from the repository, or --data=DIR)", pat);
        return 1;
    }
    tpk_tune_record *recs;
    size_t nrec;
    int rc = read_files((const char *const *)g.gl_pathv, (int)g.gl_pathc, &recs, &nrec, ctx);
    globfree(&g);
    if (rc)
        return 1;
    const uint64_t seed = a->seed;
    printf("tptune verify: the shipped kernels (gen/) against data/ (%zu records), seed %llu; this CPU: %s\n", nrec,
           (unsigned long long)seed, tpk_isa_name(tpk_machine_host_isa()));
    vlist all = {0};
    int nok = 0, nbad = 0, nclass = 0;
    for (size_t ci = 0; ci < tpk__machine_nclasses && !rc; ci++) {
        const tpk_machine *m = &tpk__machine_classes[ci];
        if (a->cls && strcmp(a->cls, m->id) && strcmp(a->cls, m->name))
            continue;
        nclass++;
        if (m->isa > tpk_machine_host_isa()) {
            printf("class %s: skipped (its kernels need %s; this CPU has %s)\n", m->name, tpk_isa_name(m->isa),
                   tpk_isa_name(tpk_machine_host_isa()));
            continue;
        }
        printf("class %s\n", m->name);
        rc = verify_class(ci, recs, nrec, data, seed, &all, &nok, &nbad, ctx);
    }
    free(recs);
    if (!rc && !nclass) {
        TPK_ERROR(ctx, TPK_EINVAL, "--class=%s: no such machine class", a->cls);
        rc = 1;
    }
    if (!rc)
        printf("verified %d kernels: %d passed, %d failed\n", nok + nbad, nok, nbad);
    if (!rc && a->mutants) {
        char self[4096];
        ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
        self[len > 0 ? len : 0] = '\0';
        tpk_tune_mutant_opts mo = {.n = a->mutants, .seed = seed, .runner = len > 0 ? self : NULL, .kinds = a->kinds};
        int caught;
        if (!all.n) {
            TPK_ERROR(ctx, TPK_EINVAL, "no kernels to mutate on this CPU");
            rc = 1;
        } else if (tpk_tune_verify_mutants(all.s, all.c, all.n, &mo, stdout, &caught, ctx))
            rc = 1;
        else if (caught < a->mutants)
            nbad++;
    }
    free(all.s), free(all.c), free(all.name);
    return rc ? 1 : nbad ? 1 : 0;
}
#endif

#ifndef TPTUNE_GENERATOR
/* tptune ew (issue 20 item 1; docs/orchestration.md §7.3): the evaluator's fused candidates from
 * their signatures — emitted, verified exactly and against libm, timed, cached per class. */
typedef struct ew_args {
    size_t n;
    int threads, repeat, tune, mutants, have_lanes, have_chunk, have_pre;
    tpk_tune_ew_cfg cfg;
    const char *cache, *emit;
    uint64_t seed;
    char **sig;
    int nsig;
} ew_args;

static int ew_value(const char *arg, const char *name, const char **val)
{
    size_t len = strlen(name);
    if (strncmp(arg, name, len) || arg[len] != '=')
        return 0;
    *val = arg + len + 1;
    return 1;
}

static int ew_int(const char *v, const char *name, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "tptune ew: %s must be an integer in [%ld, %ld], not '%s'\n", name, lo, hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

/* A line of `netsor plan --signatures` or a bare signature: the signature, NULL for other lines. */
static char *ew_line_sig(char *line)
{
    line[strcspn(line, "\r\n")] = '\0';
    while (*line == ' ' || *line == '\t')
        line++;
    if (!strncmp(line, "candidate ", 10))
        line += 10;
    if (!strncmp(line, "sig: ", 5))
        line += 5;
    return strncmp(line, "in=", 3) ? NULL : line;
}

static int ew_parse_args(int argc, char **argv, ew_args *a)
{
    memset(a, 0, sizeof *a);
    a->n = 2048;
    a->repeat = 5;
    a->seed = 1;
    tpk_tune_ew_default(&a->cfg);
    a->sig = calloc((size_t)argc + 1, sizeof *a->sig);
    if (!a->sig)
        return -1;
    for (int i = 2; i < argc; i++) {
        const char *v;
        long x;
        if (ew_value(argv[i], "--n", &v)) {
            if (ew_int(v, "--n", 1, 1L << 20, &x))
                return -1;
            a->n = (size_t)x;
        } else if (ew_value(argv[i], "--threads", &v)) {
            if (ew_int(v, "--threads", 1, 1024, &x))
                return -1;
            a->threads = (int)x;
        } else if (ew_value(argv[i], "--repeat", &v)) {
            if (ew_int(v, "--repeat", 1, TPK_TUNE_MAX_REPEAT, &x))
                return -1;
            a->repeat = (int)x;
        } else if (ew_value(argv[i], "--lanes", &v)) {
            if (ew_int(v, "--lanes", 4, 8, &x) || (x != 4 && x != 8)) {
                fprintf(stderr, "tptune ew: --lanes must be 4 or 8\n");
                return -1;
            }
            a->cfg.lanes = (int)x;
            a->have_lanes = 1;
        } else if (ew_value(argv[i], "--chunk", &v)) {
            if (ew_int(v, "--chunk", 1, 1024, &x))
                return -1;
            a->cfg.chunk = (int)x;
            a->have_chunk = 1;
        } else if (ew_value(argv[i], "--pre", &v)) {
            if (ew_int(v, "--pre", 0, 1, &x))
                return -1;
            a->cfg.pre = (int)x;
            a->have_pre = 1;
        } else if (ew_value(argv[i], "--mutants", &v)) {
            if (ew_int(v, "--mutants", 0, 100000, &x))
                return -1;
            a->mutants = (int)x;
        } else if (ew_value(argv[i], "--seed", &v)) {
            if (ew_int(v, "--seed", 0, 1L << 62, &x))
                return -1;
            a->seed = (uint64_t)x;
        } else if (ew_value(argv[i], "--cache", &v)) {
            a->cache = v;
        } else if (ew_value(argv[i], "--emit", &v)) {
            if (strcmp(v, "c") && strcmp(v, "twin") && strcmp(v, "cuda")) {
                fprintf(stderr, "tptune ew: --emit must be c, twin or cuda, not '%s'\n", v);
                return -1;
            }
            a->emit = v;
        } else if (!strcmp(argv[i], "--tune")) {
            a->tune = 1;
        } else if (!strcmp(argv[i], "-") || !strncmp(argv[i], "in=", 3)) {
            a->sig[a->nsig++] = argv[i];
        } else {
            fprintf(stderr, "tptune ew: unknown argument '%s'\n", argv[i]);
            return -1;
        }
    }
    if (a->nsig == 0) {
        fprintf(stderr, "tptune ew: no signature (give SIG... or - for stdin)\n");
        return -1;
    }
    if (a->cfg.lanes == 8 && tpk_machine_host_isa() < TPK_ISA_AVX512) {
        fprintf(stderr, "tptune ew: --lanes=8 needs AVX-512, which this CPU lacks\n");
        return -1;
    }
    return 0;
}

/* The signatures of the arguments, stdin's lines where "-" stands. */
static int ew_collect(const ew_args *a, char ***out, int *nout, tpk_ctx *ctx)
{
    int cap = 16, n = 0;
    char **v = malloc((size_t)cap * sizeof *v);
    for (int i = 0; v && i < a->nsig; i++) {
        char line[TPK_TUNE_EW_SIGLEN + 64];
        int from_stdin = !strcmp(a->sig[i], "-");
        const char *one = a->sig[i];
        while (v) {
            if (from_stdin) {
                if (!fgets(line, sizeof line, stdin))
                    break;
                one = ew_line_sig(line);
                if (!one)
                    continue;
            }
            int dup = 0; /* a plan's kernels may repeat a signature (every layer of an MLP) */
            for (int k = 0; k < n; k++)
                dup |= !strcmp(v[k], one);
            if (!dup) {
                if (n == cap) {
                    char **g = realloc(v, (size_t)(cap *= 2) * sizeof *v);
                    if (!g) {
                        for (int k = 0; k < n; k++)
                            free(v[k]);
                        free(v);
                        v = NULL;
                        break;
                    }
                    v = g;
                }
                if ((v[n] = strdup(one)) == NULL) {
                    for (int k = 0; k < n; k++)
                        free(v[k]);
                    free(v);
                    v = NULL;
                    break;
                }
                n++;
            }
            if (!from_stdin)
                break;
        }
    }
    if (!v)
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    *out = v;
    *nout = n;
    return TPK_OK;
}

static int cmd_ew(int argc, char **argv, tpk_ctx *ctx)
{
    ew_args a;
    if (ew_parse_args(argc, argv, &a)) {
        free(a.sig);
        return 2;
    }
    char **sigs = NULL;
    int nsig = 0, rc = 0;
    if (ew_collect(&a, &sigs, &nsig, ctx)) {
        free(a.sig);
        return 1;
    }
    char cache[4096];
    tpk_tune_ew_cache_path(a.cache, cache, sizeof cache);
    const char *cls = tpk_tune_target_class(TPK_TUNE_CPU);
    const int threads = a.threads > 0 ? a.threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    int tot_mut = 0, tot_caught = 0;
    for (int s = 0; s < nsig && !rc; s++) {
        tpk_tune_ew e;
        if (tpk_tune_ew_parse(sigs[s], &e, ctx)) {
            rc = 1;
            break;
        }
        char canon[TPK_TUNE_EW_SIGLEN];
        tpk_tune_ew_print(&e, canon, sizeof canon);
        if (a.emit) {
            char fn[32];
            snprintf(fn, sizeof fn, "tpk_ew_%d", s);
            rc = (!strcmp(a.emit, "cuda") ? tpk_tune_ew_emit_cuda(&e, fn, stdout, ctx)
                                          : tpk_tune_ew_emit(&e, &a.cfg, fn, !strcmp(a.emit, "twin"), stdout, ctx))
                     ? 1 : 0;
            continue;
        }
        /* the schedules: the default (or the options'), or every one with --tune */
        tpk_tune_ew_cfg cfgs[12];
        int ncfg = 0;
        if (a.tune) {
            static const int chunks[] = {1, 4, 16};
            for (int pre = 0; pre < 2; pre++)
                for (int l = 4; l <= 8; l += 4)
                    for (int c = 0; c < 3; c++)
                        if ((l == 4 || tpk_machine_host_isa() >= TPK_ISA_AVX512) && (!a.have_lanes || a.cfg.lanes == l) &&
                            (!a.have_chunk || a.cfg.chunk == chunks[c]) && (!a.have_pre || a.cfg.pre == pre))
                            cfgs[ncfg++] = (tpk_tune_ew_cfg){l, chunks[c], pre};
        } else
            cfgs[ncfg++] = a.cfg;
        printf("ew %d/%d %s\n", s + 1, nsig, canon);
        tpk_tune_ew_rec best = {0};
        int have_best = 0;
        for (int k = 0; k < ncfg && !rc; k++) {
            tpk_tune_ew_rec key = {0}, hit;
            snprintf(key.target_class, sizeof key.target_class, "%s", cls);
            snprintf(key.sig, sizeof key.sig, "%s", canon);
            key.n = a.n;
            key.threads = threads;
            key.cfg = cfgs[k];
            int found = 0;
            if (cache[0] && !a.mutants && tpk_tune_ew_cache_find(cache, &key, &cfgs[k], &hit, &found, ctx)) {
                rc = 1;
                break;
            }
            if (!found) {
                /* every schedule is verified before it is timed: the loop nest differs */
                tpk_tune_ew_report r;
                if (tpk_tune_ew_verify(&e, &cfgs[k], NULL, NULL, a.mutants, a.seed, stdout, &r, ctx)) {
                    rc = 1;
                    break;
                }
                printf("  lanes=%d chunk=%d pre=%d: exact %s over %ld entries (a wrong entry passes with p <= %.1e), "
                       "kernel vs libm %.2g %s, CUDA host emulation vs libm %.2g %s\n", cfgs[k].lanes, cfgs[k].chunk,
                       cfgs[k].pre, r.exact_ok ? "ok" : "FAILED", r.entries, r.miss_bound, r.max_rel_err,
                       r.real_ok ? "ok" : "FAILED", r.cuda_max_rel_err, r.cuda_ok ? "ok" : "FAILED");
                tot_mut += r.mutants;
                tot_caught += r.caught;
                if (!r.exact_ok || !r.real_ok || !r.cuda_ok) {
                    rc = 1;
                    break;
                }
                key.verified = 1;
                key.ts = (double)time(NULL);
                if (tpk_tune_ew_measure(&e, &cfgs[k], a.n, threads, a.repeat, NULL, NULL, &key.seconds, ctx) ||
                    (cache[0] && tpk_tune_ew_cache_add(cache, &key, ctx))) {
                    rc = 1;
                    break;
                }
                hit = key;
            }
            const double ent = (double)a.n * ((double)a.n + 1) / 2;
            printf("  lanes=%d chunk=%d pre=%d n=%zu threads=%d: %.6f s (%.3f G entries/s)%s\n", hit.cfg.lanes,
                   hit.cfg.chunk, hit.cfg.pre, a.n, threads, hit.seconds, ent / hit.seconds * 1e-9, found ? " cached (verified when measured)" : "");
            if (!have_best || hit.seconds < best.seconds)
                best = hit, have_best = 1;
        }
        if (!rc && ncfg > 1)
            printf("  best: lanes=%d chunk=%d pre=%d %.6f s\n", best.cfg.lanes, best.cfg.chunk, best.cfg.pre, best.seconds);
    }
    if (!rc && a.mutants && !a.emit) {
        printf("caught %d/%d\n", tot_caught, tot_mut);
        if (tot_caught < tot_mut)
            rc = 1;
    }
    for (int s = 0; s < nsig; s++)
        free(sigs[s]);
    free(sigs);
    free(a.sig);
    return rc;
}
#endif

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "__measure"))
        return tpk_tune_child_main(argc, argv);
    if (argc > 1 && !strcmp(argv[1], "__verify"))
        return tpk_tune_verify_child_main(argc, argv);
    if (argc > 1 && !strcmp(argv[1], "__ew"))
        return tpk_tune_ew_child_main(argc, argv);
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return CLI_EXIT_OK;
        }
        if (!strcmp(argv[i], "--version")) {
            printf("tptune (tpk) %s\n", TPK_VERSION);
            return CLI_EXIT_OK;
        }
    }
#ifndef TPTUNE_GENERATOR
    if (!strcmp(argv[1], "ew")) {
        tpk_ctx ectx;
        tpk_ctx_init(&ectx);
        int erc = cmd_ew(argc, argv, &ectx);
        fflush(stdout);
        if (erc == 1 && ectx.status)
            fprintf(stderr, "tptune: %s\n", ectx.msg[0] ? ectx.msg : tpk_strerror(ectx.status));
        return erc;
    }
#endif
    args a;
    if (parse_args(argc, argv, &a)) {
        usage(stderr);
        return 2;
    }
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    int rc;
    if (!strcmp(argv[1], "syrk")) {
        /* Lower triangle of C(n×n) = A·Aᵀ, A n×k: the gemm machinery with op = syrk, m = n. */
        a.task.op = TPK_TUNE_SYRK;
        if (!a.task.m)
            a.task.m = a.task.n;
        if (!a.task.n)
            a.task.n = a.task.m;
    }
    if (a.task.op == TPK_TUNE_SYRK && !a.task.m)
        a.task.m = a.task.n;
    if (!strcmp(argv[1], "map"))
        a.task.op = TPK_TUNE_MAP;
    if (a.task.op == TPK_TUNE_MAP) { /* the n×n map: m = n, no k */
        a.task.m = a.task.m ? a.task.m : a.task.n;
        a.task.n = a.task.m;
        a.task.k = 1;
    }
    if (!strcmp(argv[1], "gemm") || !strcmp(argv[1], "syrk") || !strcmp(argv[1], "map"))
        rc = cmd_gemm(&a, &ctx);
    else if (!strcmp(argv[1], "show"))
        rc = cmd_show(&a, &ctx);
    else if (!strcmp(argv[1], "measure"))
        rc = cmd_measure(&a, &ctx);
    else if (!strcmp(argv[1], "emit"))
        rc = cmd_emit(&a, &ctx);
    else if (!strcmp(argv[1], "gen"))
        rc = cmd_gen(&a, &ctx);
    else if (!strcmp(argv[1], "replay"))
        rc = cmd_replay(&a, &ctx);
    else if (!strcmp(argv[1], "cuda-check"))
        rc = cmd_cuda_check(&a, &ctx);
    else if (!strcmp(argv[1], "port"))
        rc = cmd_port(&a, &ctx);
#ifndef TPTUNE_GENERATOR
    else if (!strcmp(argv[1], "verify"))
        rc = cmd_verify(&a, &ctx);
#endif
    else {
        fprintf(stderr, "tptune: unknown command '%s'\n", argv[1]);
        usage(stderr);
        return 2;
    }
    if (rc == 1)
        fprintf(stderr, "tptune: %s\n", ctx.msg[0] ? ctx.msg : tpk_strerror(ctx.status));
    return rc;
}
