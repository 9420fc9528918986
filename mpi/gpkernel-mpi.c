/* gpkernel-mpi: gpkernel's kernel over MPI ranks (issue 16, docs/scale-out.md). The kernel is
 * cut into tiles laid out block-cyclically over a BLACS process grid; each rank computes its
 * tiles with the library's block entry point (tpk_kernel_job_block, the evaluator gpkernel runs)
 * and writes them into one parallel HDF5 file, chunked by tile, that is its own checkpoint
 * (mpi/ckpt.c); rank 0 then finishes it with gpkernel's attributes and renames it into place. */
#include "../tools/cli_kernel.h"
#include "ckpt.h"
#include "grid.h"
#include "rank.h"
#include "tiles.h"

#include "tpk/tpk.h"

#include <mpi.h>

#include <errno.h>
#include <limits.h>
#include <signal.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TOOL "gpkernel-mpi"
/* How long a resume waits for processes of an earlier run that still hold the checkpoint: the
 * ranks of a killed mpirun end within a second or two (Open MPI 4.1, measured). */
#define CLAIM_WAIT_S 60.0
#define DEFAULT_TILE 512 /* items per tile side: a stacked block of 2·512 items is 8 MiB of kernel */

static const char *const help[3] = {
    "Usage: mpirun -np P gpkernel-mpi --arch=NAME [options] --output=FILE.h5\n"
    "       mpirun -np P gpkernel-mpi --program=FILE.nsr [--set NAME=VALUE]... [options] "
    "--output=FILE.h5\n"
    "gpkernel's kernel computed by P MPI ranks, tile by tile, into one HDF5 file (parallel HDF5):\n"
    "the same datasets, attributes and values as gpkernel, chunked by tile.\n"
    "\n",
    "MPI:\n"
    "  --tile=B           items per tile side (default 512); the tiles are laid out block-cyclically\n"
    "                     over the process grid (ScaLAPACK's layout) and are the checkpoint's unit\n"
    "  --grid=PxQ         process grid rows x columns, P*Q = ranks (default auto: most nearly square)\n"
    "  --dtype=T          storage of the kernel datasets: float64 (default) or float32 (half the\n"
    "                     memory and file; computed in float64, rounded when stored)\n"
    "  --resume           continue from FILE.h5.partial.h5, the checkpoint of an interrupted run:\n"
    "                     only the missing tiles are computed, the file is the uninterrupted one's\n",
    "Checkpoint: FILE.h5.partial.h5 holds every finished tile from the start; SIGINT/SIGTERM end at\n"
    "once, keeping it (exit 130/143), and so does a SIGKILL of any rank or of mpirun. A checkpoint\n"
    "is resumed only with --resume, with the same options and inputs (any rank count and grid).\n"
    "Threads: OpenMP threads per rank are the cores / ranks on the node unless OMP_NUM_THREADS is\n"
    "set. Batch-coupled programs (batchnorm) and attention's 1/sqrt(n) limit are refused.\n"
    CLI_EXIT_HELP};

enum { OPT_LAYOUT = CLI_KERNEL_OWN, OPT_RESUME = OPT_LAYOUT + 3 };

static const struct option own_opts[] = {
    MPI_LAYOUT_OPTIONS(OPT_LAYOUT),
    {"resume", no_argument, NULL, OPT_RESUME},
    {NULL, 0, NULL, 0}};

typedef struct mpi_opts {
    mpi_layout l;
    int resume;
} mpi_opts;

static int own_option(int val, const char *arg, void *user, tpk_ctx *ctx)
{
    mpi_opts *o = user;
    if (val == OPT_RESUME) {
        o->resume = 1;
        return TPK_OK;
    }
    return mpi_layout_option(val - OPT_LAYOUT, arg, (size_t)1 << 24, &o->l, ctx);
}

/* ---- signals ----------------------------------------------------------------------------------
 * The checkpoint is consistent at every moment of the tile phase (mpi/ckpt.h), so a SIGINT or
 * SIGTERM there ends the rank at once: rank 0 says so, every rank exits 128 + signal without
 * MPI_Finalize (which would wait for ranks still computing), and mpirun ends the rest. While
 * the checkpoint is laid out or the finished file is written, the signal is only noted and
 * acted on at the next safe point. The phase, the signal and the prepared messages are the one
 * process state here: a signal handler has no context. */
enum { PHASE_SETUP, PHASE_TILES, PHASE_FINAL };
static volatile sig_atomic_t phase = PHASE_SETUP, caught;
static int is_rank0;
static char msg_int[4400], msg_term[4400]; /* room for the checkpoint path */

static void leave_now(int sig)
{
    if (is_rank0) {
        const char *m = sig == SIGINT ? msg_int : msg_term;
        ssize_t w = write(STDERR_FILENO, m, strlen(m));
        (void)w;
    }
    _exit(128 + sig);
}

static void on_signal(int sig)
{
    caught = sig;
    if (phase == PHASE_TILES)
        leave_now(sig);
}

static void install_signals(const char *ckpt)
{
    snprintf(msg_int, sizeof msg_int, TOOL ": interrupted (SIGINT): the finished tiles are kept "
             "in %s; rerun with --resume to compute the rest\n", ckpt);
    snprintf(msg_term, sizeof msg_term, TOOL ": terminated (SIGTERM): the finished tiles are "
             "kept in %s; rerun with --resume to compute the rest\n", ckpt);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
#ifdef __linux__
    /* A rank whose launcher is SIGKILLed is orphaned and would compute on unseen (and finish a
     * file nobody asked for any more): its launcher's death is a SIGTERM to it, so it ends with
     * the checkpoint like the others. The parent checked afterwards: it may be gone already. */
    pid_t parent = getppid();
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) == 0 && getppid() != parent)
        raise(SIGTERM);
#endif
}

/* Enter the tile phase; a signal noted before acts now. */
static void enter_tiles(void)
{
    phase = PHASE_TILES;
    if (caught)
        leave_now(caught);
}

/* ---- what the tiles depend on ---------------------------------------------------------------- */

typedef struct strbuf {
    char *s;
    size_t n, cap;
    int failed; /* out of memory: the text is incomplete */
} strbuf;

static void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(strbuf *b, const char *fmt, ...)
{
    va_list ap;
    while (!b->failed) {
        va_start(ap, fmt);
        int w = b->s ? vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap) : -1;
        va_end(ap);
        if (w >= 0 && b->n + (size_t)w < b->cap) {
            b->n += (size_t)w;
            return;
        }
        size_t cap = b->cap ? 2 * b->cap : 4096;
        while (w >= 0 && cap <= b->n + (size_t)w)
            cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->failed = 1;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

static void sb_array(strbuf *b, const char *what, const tpk_array *a)
{
    char sha[65];
    tpk_sha256_array_hex(a, sha);
    sb_printf(b, "%s_shape=", what);
    for (int k = 0; k < a->ndim; k++)
        sb_printf(b, "%s%zu", k ? "x" : "", a->dims[k]);
    sb_printf(b, "\n%s_sha256=%s\n", what, sha);
}

/* The checkpoint's config: the job as it determines the tiles' bytes, one "key=value" a line
 * (not the command line: the same job spelt otherwise resumes, and --grid, --quiet do not
 * matter). The program enters by its text. */
static char *job_config(const tpk_job *job, const tpk_kernel_job *kj, const mpi_opts *o)
{
    strbuf b = {0};
    sb_printf(&b, "tpk gpkernel-mpi checkpoint 1\ntoolkit_version=%s\n", tpk_version());
    sb_printf(&b, "architecture=%s\nprogram=%s\n", job->label ? job->label : "program",
              job->program ? job->program : "");
    if (job->program) {
        FILE *f = fopen(job->program, "rb");
        char sha[65] = "unreadable";
        if (f) {
            strbuf t = {0};
            char chunk[4096];
            size_t k;
            sb_printf(&t, "%s", "");
            while ((k = fread(chunk, 1, sizeof chunk, f)) > 0)
                sb_printf(&t, "%.*s", (int)k, chunk);
            fclose(f);
            if (!t.failed)
                tpk_sha256_hex(t.s, t.n, sha);
            b.failed |= t.failed;
            free(t.s);
        }
        sb_printf(&b, "program_sha256=%s\n", sha);
    }
    for (int i = 0; i < job->nsets; i++)
        sb_printf(&b, "set %s=%s\n", job->sets[i].name, job->sets[i].value);
    for (int i = 0; i < job->nattrs; i++)
        sb_printf(&b, "flag %s=%s\n", job->attrs[i].name, job->attrs[i].value);
    sb_printf(&b, "all_outputs=%d\nnetsor_plus=%d\n", job->all_outputs, job->netsor_plus);
    if (job->kernel != TPK_JOB_NNGP) /* (an NNGP run's config reads as it always did) */
        sb_printf(&b, "kernel=ntk\nntk_parameterization=%s\nntk_width=%zu\n",
                  tpk_ntk_param_name(job->ntk_param), job->ntk_width);
    sb_array(&b, "input", tpk_kernel_job_input(kj, 0));
    if (tpk_kernel_job_input(kj, 1))
        sb_array(&b, "test", tpk_kernel_job_input(kj, 1));
    sb_printf(&b, "readouts=%zu\ntile_items=%zu\ndtype=%s\n", tpk_kernel_job_readouts(kj),
              o->l.tile, o->l.f32 ? "float32" : "float64");
    if (b.failed) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

/* ---- the run ---------------------------------------------------------------------------------- */

typedef struct run_state {
    cli_kernel k;
    mpi_opts o;
    mpi_grid g;
    tpk_kernel_job *kj;
    mpi_tiles t;
    mpi_ckpt *ck;
    char ckpt[4200];
    char **argv_rec;      /* the command line recorded: without --resume */
    char *config;
    double *K, *diag;     /* one tile and its row diagonal */
} run_state;

/* Rank 0: fresh or resumed (1), as the checkpoint on disk and --resume say. */
static int decide_resume(run_state *r, int *resume, tpk_ctx *ctx)
{
    const tpk_job *job = &r->k.job;
    const char *ins[] = {job->program, job->input, job->test};
    if (tpk_io_check_output(job->output, ins, 3, ctx) || tpk_io_check_output(r->ckpt, ins, 3, ctx) ||
        tpk_h5out_check_replace(job->output, job->force, ctx))
        return ctx->status;
    struct stat sb;
    int have = stat(r->ckpt, &sb) == 0;
    if (have && !r->o.resume)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: the checkpoint of an interrupted run is there: "
                         "--resume continues it, or remove it to start again", r->ckpt);
    if (!have && r->o.resume && !r->k.quiet)
        fprintf(stderr, TOOL ": no checkpoint %s, starting from scratch\n", r->ckpt);
    *resume = have;
    return have ? mpi_ckpt_claim(r->ckpt, CLAIM_WAIT_S, r->k.quiet ? NULL : stderr, ctx) : TPK_OK;
}

/* Rank 0: the finished checkpoint becomes the output: gpkernel's attributes, the grid's. */
static int finish(run_state *r, double err, tpk_ctx *ctx)
{
    tpk_h5out *out = tpk_h5out_adopt(r->k.job.output, r->ckpt, ctx);
    if (!out)
        return ctx->status;
    char grid[64];
    snprintf(grid, sizeof grid, "%dx%d", r->g.nprow, r->g.npcol);
    int st = tpk_kernel_job_describe(r->kj, out, ctx);
    if (!st) st = tpk_h5out_attr_double(out, "/", "error_estimate", err, ctx);
    if (!st) st = tpk_h5out_attr_int(out, "/", "mpi_ranks", r->g.size, ctx);
    if (!st) st = tpk_h5out_attr_str(out, "/", "mpi_grid", grid, ctx);
    if (!st) st = tpk_h5out_attr_int(out, "/", "tile_items", (long long)r->t.b, ctx);
    if (!st) st = tpk_h5out_attr_str(out, "/", "dtype", r->o.l.f32 ? "float32" : "float64", ctx);
    if (!st) st = tpk_h5out_remove(out, MPI_CKPT_GROUP, ctx);
    if (st) {
        tpk_h5out_abort(out); /* the checkpoint stays: its tiles are all there */
        return st;
    }
    return tpk_h5out_commit(out, ctx);
}

/* This rank's tiles that are not done, computed and written; stops at the first error. */
static int compute_tiles(run_state *r, size_t *ran, double *errmax, tpk_ctx *ctx)
{
    const mpi_tiles *t = &r->t;
    const int me_r = r->g.myrow, me_c = r->g.mycol;
    size_t left = 0;
    for (size_t id = mpi_tiles_next(t, me_r, me_c, 0); id < t->ntiles;
         id = mpi_tiles_next(t, me_r, me_c, id + 1))
        left += !mpi_ckpt_done(r->ck, id);
    cli_progress prog;
    cli_progress_start(&prog, TOOL, "rank 0 tiles", left,
                       r->g.rank == 0 && !r->k.quiet && cli_progress_wanted(-1));
    for (size_t id = mpi_tiles_next(t, me_r, me_c, 0); id < t->ntiles;
         id = mpi_tiles_next(t, me_r, me_c, id + 1)) {
        mpi_tile tile = mpi_tiles_tile(t, id);
        if (mpi_ckpt_done(r->ck, id))
            continue;
        size_t r0, nr, c0, nc;
        mpi_tiles_extent(t, tile, &r0, &nr, &c0, &nc);
        double e = 0;
        size_t ld = nc * t->readouts;
        double *diag = tile.test && tile.j == 0 ? r->diag : NULL;
        int st = tpk_kernel_job_block(r->kj, tile.test, r0, nr, c0, nc, r->K, ld, diag, &e, ctx);
        if (!st)
            st = mpi_ckpt_write_tile(r->ck, tile, r->K, ld, diag, ctx);
        if (st) {
            cli_progress_end(&prog, 0);
            return st;
        }
        if (e > *errmax)
            *errmax = e;
        ++*ran;
        cli_progress_update(&prog, *ran);
    }
    cli_progress_end(&prog, 1);
    return TPK_OK;
}

static int run(run_state *r, int argc, char **argv, double t0, tpk_ctx *ctx)
{
    int usage = 0, rc;
    mpi_grid *g = &r->g;
    r->o.l.tile = DEFAULT_TILE;
    int st = cli_kernel_parse(argc, argv, TOOL, help, own_opts, own_option, &r->o, &r->k, ctx);
    if (st == CLI_KERNEL_DONE)
        return 0;
    /* --resume is left out of the recorded command: a resumed run writes the same file */
    int pc = 0;
    r->argv_rec = malloc(((size_t)argc + 1) * sizeof *r->argv_rec);
    for (int i = 0; r->argv_rec && i < argc; i++)
        if (strcmp(argv[i], "--resume") != 0)
            r->argv_rec[pc++] = argv[i];
    if (!st && !r->argv_rec)
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    if ((rc = mpi_settle(st, 1, ctx, TOOL)))
        return rc;
    st = cli_kernel_job(&r->k, pc, r->argv_rec, &usage, ctx);
    if (!st && r->k.job.kernel == TPK_JOB_BOTH) { /* a tile is one kernel's block */
        st = TPK_ERROR(ctx, TPK_EINVAL, "--kernel=both: tiles hold one kernel; run --kernel=nngp "
                       "and --kernel=ntk into two files (or gpkernel --kernel=both)");
        usage = 1;
    }
    if ((rc = mpi_settle(st, usage, ctx, TOOL)))
        return rc;
    st = mpi_grid_init(g, r->o.l.nprow, r->o.l.npcol, ctx); /* a grid that is not the ranks': usage */
    if ((rc = mpi_settle(st, 1, ctx, TOOL)))
        return rc;

    /* every rank prepares the job: reads the inputs, loads the program */
    r->k.job.summary = NULL;
    r->kj = tpk_kernel_job_alloc(r->k.a, &r->k.job, ctx);
    st = r->kj ? TPK_OK : ctx->status;
    if (!st && mpi_tiles_init(&r->t, tpk_kernel_job_items(r->kj, 0), tpk_kernel_job_items(r->kj, 1),
                              r->o.l.tile, tpk_kernel_job_readouts(r->kj), g->nprow, g->npcol))
        st = TPK_ERROR(ctx, TPK_EINVAL, "--tile=%zu: no tile layout for %zu items", r->o.l.tile,
                       tpk_kernel_job_items(r->kj, 0));
    if (!st) {
        size_t side = r->t.b * r->t.readouts;
        r->K = malloc(side * side * sizeof *r->K);
        r->diag = malloc(side * sizeof *r->diag);
        if (!r->K || !r->diag)
            st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory for a tile of %zu x %zu", side, side);
    }
    if (!st && !(r->config = job_config(&r->k.job, r->kj, &r->o)))
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    snprintf(r->ckpt, sizeof r->ckpt, "%s.partial.h5", r->k.job.output);
    if ((rc = mpi_settle(st, 0, ctx, TOOL)))
        return rc;

    install_signals(r->ckpt);
    int resume = 0;
    st = g->rank == 0 ? decide_resume(r, &resume, ctx) : TPK_OK;
    MPI_Bcast(&resume, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if ((rc = mpi_settle(st, 0, ctx, TOOL)))
        return rc;
    mpi_ckpt_spec spec = {.path = r->ckpt, .t = &r->t, .f32 = r->o.l.f32, .config = r->config,
                          .name = r->k.job.kernel == TPK_JOB_NTK ? "ntk" : "kernel"};
    size_t before = 0;
    if (resume) {
        st = mpi_ckpt_open(MPI_COMM_WORLD, &spec, &r->ck, ctx);
        int unreadable = st == TPK_EFORMAT, any;
        MPI_Allreduce(&unreadable, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (any) { /* killed while it was laid out: no tile can be in it */
            if (g->rank == 0 && !r->k.quiet)
                fprintf(stderr, TOOL ": %s is not a usable checkpoint (%s); starting from "
                        "scratch\n", r->ckpt, ctx->msg);
            mpi_ckpt_close(r->ck, ctx);
            r->ck = NULL;
            tpk_ctx_clear(ctx);
            resume = 0;
        } else if (!st) {
            before = mpi_ckpt_done_count(r->ck);
        }
    }
    if (!resume)
        st = mpi_ckpt_create(MPI_COMM_WORLD, &spec, &r->ck, ctx);
    if ((rc = mpi_settle(st, 0, ctx, TOOL)))
        return rc;
    MPI_Barrier(MPI_COMM_WORLD); /* the checkpoint is laid out everywhere before any tile */

    enter_tiles();
    size_t ran = 0;
    double err = 0, errmax;
    st = compute_tiles(r, &ran, &err, ctx);
    /* a failing rank stops; the others finish their tiles (kept for a resume) and learn here */
    int failed = st != 0, anyfail;
    MPI_Allreduce(&failed, &anyfail, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&err, &errmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    unsigned long long mine = ran, all;
    MPI_Allreduce(&mine, &all, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    phase = PHASE_FINAL;
    tpk_ctx cctx;
    tpk_ctx_init(&cctx);
    int cst = mpi_ckpt_close(r->ck, &cctx);
    r->ck = NULL;
    if (anyfail) {
        rc = mpi_settle(st, 0, ctx, TOOL);
        if (g->rank == 0 && before + all == 0)
            unlink(r->ckpt); /* nothing in it to keep */
        else if (g->rank == 0)
            fprintf(stderr, TOOL ": %llu of %zu tiles are in %s: --resume continues once the "
                    "cause is fixed\n", (unsigned long long)before + all, r->t.ntiles, r->ckpt);
        return rc ? rc : 1;
    }
    if ((rc = mpi_settle(cst, 0, &cctx, TOOL)))
        return rc;
    if (before + all != r->t.ntiles) /* every tile has exactly one owner: our bug if not */
        st = TPK_ERROR(ctx, TPK_EINVAL, "%zu of %zu tiles done after the run", (size_t)(before + all),
                       r->t.ntiles);
    else if (g->rank == 0)
        st = finish(r, errmax, ctx);
    if ((rc = mpi_settle(st, 0, ctx, TOOL)))
        return rc;
    if (g->rank == 0 && !r->k.quiet) {
        const tpk_job *job = &r->k.job;
        size_t side = r->t.n * r->t.readouts;
        printf("kernel: %s (%s) on %d ranks, grid %dx%d, tiles of %zu items: %zu tiles, %llu "
               "computed now, %zu resumed\n", job->label, job->program ? job->program : "built-in",
               g->size, g->nprow, g->npcol, r->t.b, r->t.ntiles, all, before);
        printf("  input   %s (N=%zu)\n", job->input, r->t.n);
        if (r->t.m)
            printf("  test    %s (M=%zu)\n", job->test, r->t.m);
        printf("  kernel  %zux%zu %s, error estimate %.2e\n", side, side,
               r->o.l.f32 ? "float32" : "float64", errmax);
        printf("  wrote   %s in %.3f s\n", job->output, tpk_wall_seconds() - t0);
    }
    return 0;
}

static void run_free(run_state *r)
{
    mpi_ckpt_close(r->ck, &(tpk_ctx){0});
    tpk_kernel_job_free(r->kj);
    mpi_grid_free(&r->g);
    cli_kernel_free(&r->k);
    free(r->argv_rec);
    free(r->config);
    free(r->K);
    free(r->diag);
}

int main(int argc, char **argv)
{
    double t0 = tpk_wall_seconds();
    int rank = mpi_start(&argc, &argv);
    if (rank < 0)
        return 1;
    is_rank0 = rank == 0;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    run_state r = {.g = {.rank = rank, .ctxt = -1}};
    int rc = run(&r, argc, argv, t0, &ctx);
    run_free(&r);
    MPI_Finalize();
    return rc;
}
