/* gpregress-mpi: gpregress's GP regression over MPI ranks (issue 16, docs/scale-out.md
 * "gpregress-mpi"). The kernel lies in tiles on a BLACS process grid, computed in place by the
 * library (gpkernel's evaluator block by block, or gpregress's RBF) or read from a kernel file
 * with parallel HDF5; it is solved by ScaLAPACK's Cholesky (mpi/chol.c) or by block
 * preconditioned CG with the LML by stochastic Lanczos quadrature (mpi/pcg.c). The data, the
 * noise choice and the output file are gpregress's (the experiment's parts, tpk/gp.h). */
#include "../tools/cli_gpregress.h"
#include "chol.h"
#include "grid.h"
#include "ksrc.h"
#include "kstore.h"
#include "pcg.h"
#include "rank.h"
#include "tiles.h"

#include "tpk/tpk.h"

#include <mpi.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOOL "gpregress-mpi"
/* Items per tile side: ScaLAPACK's block size too (pdpotrf runs well with 64..512). */
#define DEFAULT_TILE 256
/* --solver=auto takes Cholesky when the kernel, its factor and the test block take at most this
 * share of a rank's memory (the rest: inputs, vectors, the library's workspaces). */
#define MEM_SHARE 0.7
/* CG defaults: the relative residual per column (the posterior mean's error is about the
 * condition number times it), the iteration cap, the pivoted-Cholesky rank, the probes. */
#define DEFAULT_CG_TOL 1e-10
#define DEFAULT_CG_MAXITER 5000
#define DEFAULT_PRECOND_RANK 100
#define DEFAULT_PROBES 30

static const char *const help[2] = {
    "Usage: mpirun -np P gpregress-mpi (--arch=mlp|rbf --train=SPEC | --kernel=FILE.h5)\n"
    "                 --labels=SPEC [--test=SPEC] [--test-labels=SPEC] [options] --output=FILE.h5\n"
    "gpregress's Gaussian-process regression on P MPI ranks: the kernel in tiles over a process\n"
    "grid, solved by ScaLAPACK's Cholesky or by preconditioned conjugate gradients; the same\n"
    "options, datasets and attributes as gpregress, plus mpi_ranks, mpi_grid and solver.\n"
    "\n",
    "MPI:\n"
    "  --solver=S         cholesky (ScaLAPACK pdpotrf/pdpotrs, exact LML), cg (block\n"
    "                     preconditioned CG, LML by stochastic Lanczos quadrature with an error\n"
    "                     bar) or auto (default: cholesky when the kernel and its factor fit in\n"
    "                     the ranks' memory, else cg)\n"
    "  --tile=B           items per tile side, ScaLAPACK's block size (default 256)\n"
    "  --grid=PxQ         process grid rows x columns, P*Q = ranks (default auto)\n"
    "  --dtype=T          kernel storage float64 (default) or float32 (cg only: half the memory,\n"
    "                     products accumulated in float64)\n"
    "  --memory=SIZE      memory per rank for --solver=auto (default: available / ranks per node;\n"
    "                     suffixes K, M, G)\n"
    "  --cg-tol=T         stop a right-hand side at relative residual T (default 1e-10)\n"
    "  --cg-maxiter=K     iteration cap (default 5000)\n"
    "  --precond=P        pivchol (pivoted Cholesky of the kernel, default), jacobi (the diagonal\n"
    "                     tiles) or none\n"
    "  --precond-rank=R   pivoted Cholesky rank (default 100)\n"
    "  --slq-probes=T     Rademacher probes of the log-determinant (default 30, >= 2)\n"
    "  --seed=S           seed of the probes (default 0)\n"
    "Not here (gpregress has them): --fit-hyper, --full-cov, --noise=0.\n"
    "CG variances cost one solve per test item: --var-n or --no-var at scale.\n"};

enum { SOLVER_AUTO, SOLVER_CHOLESKY, SOLVER_CG };
enum { OPT_LAYOUT = CLI_GPREGRESS_OWN, OPT_SOLVER = OPT_LAYOUT + 3, OPT_MEMORY, OPT_CGTOL,
       OPT_CGMAX, OPT_PRECOND, OPT_PRANK, OPT_PROBES, OPT_SEED };

static const struct option own_opts[] = {
    MPI_LAYOUT_OPTIONS(OPT_LAYOUT),
    {"solver", required_argument, NULL, OPT_SOLVER},
    {"memory", required_argument, NULL, OPT_MEMORY},
    {"cg-tol", required_argument, NULL, OPT_CGTOL},
    {"cg-maxiter", required_argument, NULL, OPT_CGMAX},
    {"precond", required_argument, NULL, OPT_PRECOND},
    {"precond-rank", required_argument, NULL, OPT_PRANK},
    {"slq-probes", required_argument, NULL, OPT_PROBES},
    {"seed", required_argument, NULL, OPT_SEED},
    {NULL, 0, NULL, 0}};

typedef struct mpi_opts {
    mpi_layout l;
    int solver;
    double memory;           /* bytes per rank, 0: from the system */
    mpi_pcg_opts cg;
} mpi_opts;

static const char *const precond_names[] = {"none", "pivchol", "jacobi"};

static int pick(const char *opt, const char *arg, const char *const *names, int n, int *out,
                tpk_ctx *ctx)
{
    for (int i = 0; i < n; i++)
        if (strcmp(arg, names[i]) == 0) {
            *out = i;
            return TPK_OK;
        }
    return TPK_ERROR(ctx, TPK_EINVAL, "--%s: '%s' is not one of %s%s%s%s%s", opt, arg, names[0],
                     n > 1 ? ", " : "", n > 1 ? names[1] : "", n > 2 ? ", " : "",
                     n > 2 ? names[2] : "");
}

/* "N[K|M|G]" bytes. */
static int parse_bytes(const char *arg, double *out, tpk_ctx *ctx)
{
    char *end;
    errno = 0;
    double v = strtod(arg, &end);
    double mult = *end == 'K' || *end == 'k' ? 1024.0 : *end == 'M' || *end == 'm' ? 1048576.0
                  : *end == 'G' || *end == 'g' ? 1073741824.0 : 1.0;
    if (mult > 1)
        end++;
    if (end == arg || *end || errno || !(v > 0) || !isfinite(v))
        return TPK_ERROR(ctx, TPK_EINVAL, "--memory: '%s' is not a size (e.g. 8G)", arg);
    *out = v * mult;
    return TPK_OK;
}

static int own_option(int val, const char *arg, void *user, tpk_ctx *ctx)
{
    mpi_opts *o = user;
    static const char *const solvers[] = {"auto", "cholesky", "cg"};
    size_t v;
    if (val < OPT_LAYOUT + 3) /* ScaLAPACK indexes in int: tiles far below that */
        return mpi_layout_option(val - OPT_LAYOUT, arg, (size_t)1 << 16, &o->l, ctx);
    switch (val) {
    case OPT_SOLVER: return pick("solver", arg, solvers, 3, &o->solver, ctx);
    case OPT_MEMORY: return parse_bytes(arg, &o->memory, ctx);
    case OPT_CGTOL:
        if (cli_parse_double("cg-tol", arg, &o->cg.tol, ctx))
            return ctx->status;
        return o->cg.tol > 0 && o->cg.tol < 1
                   ? TPK_OK
                   : TPK_ERROR(ctx, TPK_EINVAL, "--cg-tol must be in (0, 1) (got %s)", arg);
    case OPT_CGMAX: return cli_parse_int("cg-maxiter", arg, 1, 100000, &o->cg.maxiter, ctx);
    case OPT_PRECOND: return pick("precond", arg, precond_names, 3, &o->cg.precond, ctx);
    case OPT_PRANK: return cli_parse_size("precond-rank", arg, 1, 100000, &o->cg.rank, ctx);
    case OPT_PROBES: return cli_parse_int("slq-probes", arg, 2, 10000, &o->cg.probes, ctx);
    case OPT_SEED:
        if (cli_parse_size("seed", arg, 0, SIZE_MAX, &v, ctx))
            return ctx->status;
        o->cg.seed = v;
        return TPK_OK;
    default: return TPK_ERROR(ctx, TPK_EINVAL, "unknown option");
    }
}

/* What gpregress has and this program does not. */
static int check_supported(const tpk_gp_experiment_opts *e, const mpi_opts *o, tpk_ctx *ctx)
{
    if (tpk_gp_experiment_table_kernel(e) && !tpk_gp_experiment_own_mlp(e))
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED, "--%s=%s is gpregress's: compute the kernel with "
                         "gpkernel-mpi --test and give it here as --kernel=FILE.h5",
                         e->program ? "program" : "arch", e->program ? e->program : e->kernel);
    if (e->predict_gd)
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED, "--predict=gd is gpregress's (the t = inf mean "
                         "is the NTK-GP's: --kernel-type=ntk with a gpkernel-mpi --kernel=ntk "
                         "file)");
    if (e->kernel_type == TPK_GP_KERNEL_NTK && !e->kernel_file)
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED, "--kernel-type=ntk reads the NTK from a kernel "
                         "file: give gpkernel-mpi --kernel=ntk's (or gpkernel --kernel=both's) "
                         "file as --kernel=FILE.h5");
    if (e->fit_hyper)
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED, "--fit-hyper is gpregress's (it fits on a "
                         "subsample): run it there and give the fitted parameters here");
    if (e->full_cov)
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED, "--full-cov (an M×M covariance) is gpregress's");
    if (!e->noise_auto && e->noise == 0)
        return TPK_ERROR(ctx, TPK_EUNSUPPORTED, "--noise=0 (interpolation) is gpregress's: give "
                         "--noise > 0 or --noise=auto");
    if (o->l.f32 && o->solver == SOLVER_CHOLESKY)
        return TPK_ERROR(ctx, TPK_EINVAL, "--dtype=float32 is a storage of the cg solver: "
                         "ScaLAPACK's Cholesky factors in float64");
    return TPK_OK;
}

/* Bytes available to this rank: MemAvailable shared by the node's ranks. */
static double rank_memory(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024.0 / mpi_local_ranks();
}

/* ---- the run ---------------------------------------------------------------------------------- */

typedef struct run_state {
    cli_gpregress cg;
    mpi_opts o;
    mpi_grid g;
    tpk_gp_data *d;
    tpk_gp_report *rep;      /* rank 0 */
    mpi_ksrc *file;          /* --kernel */
    mpi_ksrc *src;
    mpi_tiles t;
    mpi_kstore K, Kx;
    double *kdiag, *diag, *mean_c;
    tpk_array *mean, *varr;
    int solver;              /* SOLVER_CHOLESKY or SOLVER_CG */
    double store_bytes;      /* the kernel's storage on the busiest rank */
    mpi_chol ch;
    mpi_pcg *pc;
    tpk_gp_info last;        /* the fit in place */
    cli_progress prog;       /* rank 0's line: kernel tiles, then each CG solve */
} run_state;

/* The walk's evaluation: either solver; the last fit kept. */
static int fit_eval(double noise, void *data, tpk_gp_info *info, tpk_ctx *ctx)
{
    run_state *r = data;
    int st = r->solver == SOLVER_CG ? mpi_pcg_fit(noise, r->pc, info, ctx)
                                    : mpi_chol_fit(noise, &r->ch, info, ctx);
    if (!st)
        r->last = *info;
    return st;
}

/* Storage per rank of each solver (the largest over the ranks), and the choice. */
static void choose_solver(run_state *r)
{
    const mpi_tiles *t = &r->t;
    const int me_r = r->g.myrow, me_c = r->g.mycol;
    double chol = 2.0 * (double)mpi_kstore_bytes(t, 0, MPI_KSTORE_SCALAPACK, 0, me_r, me_c) +
                  (t->m ? (double)mpi_kstore_bytes(t, 1, MPI_KSTORE_SCALAPACK, 0, me_r, me_c) : 0);
    double cg = (double)mpi_kstore_bytes(t, 0, MPI_KSTORE_PACKED, r->o.l.f32, me_r, me_c) +
                (t->m ? (double)mpi_kstore_bytes(t, 1, MPI_KSTORE_PACKED, r->o.l.f32, me_r, me_c)
                      : 0);
    double mine[2] = {chol, cg}, most[2];
    MPI_Allreduce(mine, most, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    double mem = r->o.memory > 0 ? r->o.memory : rank_memory(), have;
    MPI_Allreduce(&mem, &have, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    r->solver = r->o.solver != SOLVER_AUTO ? r->o.solver
                : !r->o.l.f32 && most[0] <= MEM_SHARE * have ? SOLVER_CHOLESKY
                                                           : SOLVER_CG;
    r->store_bytes = r->solver == SOLVER_CG ? most[1] : most[0];
    if (r->g.rank == 0 && r->cg.o.summary)
        fprintf(r->cg.o.summary, "  mpi: %d ranks, grid %dx%d, tiles of %zu items; solver %s%s "
                "(kernel storage %.1f MiB per rank%s, %.0f MiB available)\n", r->g.size,
                r->g.nprow, r->g.npcol, t->b, r->solver == SOLVER_CG ? "cg" : "cholesky",
                r->o.solver == SOLVER_AUTO ? " by memory" : "", r->store_bytes / 1048576.0,
                r->solver == SOLVER_CG && r->o.l.f32 ? ", float32" : "", have / 1048576.0);
}

/* The kernel of one depth (0: the only kernel) from its source into the stores. */
static int fill_kernel(run_state *r, int depth, double *err, tpk_ctx *ctx)
{
    const tpk_gp_experiment_opts *e = &r->cg.o;
    if (r->file) /* collective: every rank reads, none fails before */
        return mpi_ksrc_fill(r->file, &r->K, r->t.m ? &r->Kx : NULL, r->kdiag, err, NULL, ctx);
    mpi_ksrc_free(r->src);
    r->src = NULL;
    if (strcmp(e->kernel, "rbf") == 0) {
        const double th[2] = {e->lengthscale2, e->amplitude};
        r->src = mpi_ksrc_rbf(th, r->d->X, r->d->Xt, ctx);
    } else { /* mlp: gpregress's kernel (tpk_mlp_kernel), every item read as one vector */
        r->src = mpi_ksrc_mlp(e->phi, e->quad_degree, depth, e->sigma_w2, e->sigma_b2, r->d->X,
                              r->d->Xt, ctx);
    }
    if (!r->src)
        return ctx->status;
    return mpi_ksrc_fill(r->src, &r->K, r->t.m ? &r->Kx : NULL, r->kdiag, err, &r->prog, ctx);
}

/* Checks of a precomputed kernel (gpregress's check_psd where it can be done in tiles: the
 * diagonal, and with Cholesky the factor of K + N·tol·md·I). */
static int check_file_kernel(run_state *r, double md, tpk_ctx *ctx)
{
    const char *f = r->cg.o.kernel_file;
    for (size_t i = 0; i < r->t.n; i++)
        if (!(r->diag[i] >= 0))
            return TPK_ERROR(ctx, TPK_EDOM, "%s: /kernel is not a covariance: diagonal entry "
                             "[%zu, %zu] = %g is negative", f, i, i, r->diag[i]);
    if (!(md > 0))
        return TPK_ERROR(ctx, TPK_EDOM, "%s: /kernel is zero on its diagonal: no covariance to "
                         "regress with", f);
    if (r->solver != SOLVER_CHOLESKY)
        return TPK_OK;
    const double shift = (double)r->t.n * TPK_GP_PSD_REL_TOL * md;
    int col = mpi_chol_factors(&r->ch, shift, ctx);
    if (col < 0)
        return ctx->status;
    if (col > 0)
        return TPK_ERROR(ctx, TPK_EDOM, "%s: /kernel is not positive semidefinite: Cholesky of "
                         "/kernel + %.3g I fails at column %d: not a covariance", f, shift, col);
    return TPK_OK;
}

/* The subsample's noise, as gpregress starts: its kernel gathered on rank 0 and
 * eigendecomposed there (got: ratio, scale, the subsample's LML; rank 0's status). */
static int noise_guess(run_state *r, double got[3], tpk_ctx *ctx)
{
    const size_t k = tpk_gp_select_size(&r->cg.o, r->t.n);
    double *Kk = malloc(k * k * sizeof *Kk);
    int ok = Kk != NULL, all, st = TPK_OK;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (all) {
        mpi_kstore_lead(&r->K, k, Kk);
        mpi_sum_root(Kk, k * k);
        tpk_array Ks = {.ndim = 2, .dims = {k, k}, .data = Kk};
        if (r->g.rank == 0)
            st = tpk_gp_report_noise_guess(r->rep, &Ks, &got[0], &got[1], &got[2], ctx);
    } else {
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory for the %zu×%zu subsample", k, k);
    }
    free(Kk);
    return st;
}

/* The fit at the noise gpregress would take: the given one (got NULL), the subsample's (got:
 * ratio, scale, its LML), or the walk's from it at full size (every rank walks alike: the LMLs
 * it compares are the same bits everywhere). The fit at the chosen noise is left in place
 * (r->last). */
static int noise_and_fit(run_state *r, const double *got, tpk_gp_result *res, double *scale,
                         tpk_ctx *ctx)
{
    const tpk_gp_experiment_opts *e = &r->cg.o;
    double ratio = got ? got[0] : e->noise;
    *scale = got ? got[1] : 1.0;
    if (got)
        res->lml_select = got[2];
    if (got && tpk_gp_select_size(e, r->t.n) < r->t.n && e->noise_fits > 0) {
        double plan[2] = {0, 0};
        if (r->g.rank == 0)
            tpk_gp_report_noise_start(r->rep, ratio, &plan[0], &plan[1]);
        mpi_bcast_doubles(plan, 2);
        tpk_gp_noise_choice ch = {0};
        int st = tpk_gp_noise_walk(fit_eval, r, plan[0], plan[1], e->noise_fits, e->fit_scale,
                                   &ch, ctx);
        if (!st) {
            if (r->g.rank == 0)
                tpk_gp_report_noise_end(r->rep, ratio, &ch);
            *scale = ch.scale;
            res->fits = ch.fits;
        }
        return st;
    }
    tpk_gp_info info;
    return fit_eval(ratio, r, &info, ctx);
}

/* Mean (M×C) and variances of the first items on every rank, from the fit in place. */
static int predict(run_state *r, const double *alpha, double scale, tpk_ctx *ctx)
{
    const tpk_gp_experiment_opts *e = &r->cg.o;
    const size_t m = r->t.m, c = r->d->c;
    memset(r->mean_c, 0, m * c * sizeof *r->mean_c);
    mpi_kstore_mul(&r->Kx, alpha, c, r->mean_c);
    mpi_sum_all(r->mean_c, m * c);
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < c; j++)
            r->mean->data[i * c + j] = r->mean_c[i + j * m];
    if (!r->varr)
        return TPK_OK;
    const size_t mv = r->varr->dims[0];
    int st = r->solver == SOLVER_CG ? mpi_pcg_var(r->pc, &r->Kx, mv, r->kdiag, r->varr->data, ctx)
                                    : mpi_chol_var(&r->ch, &r->Kx, mv, r->kdiag, r->varr->data,
                                                   ctx);
    for (size_t i = 0; !st && i < mv; i++)
        r->varr->data[i] *= scale;
    (void)e;
    return st;
}

/* One kernel: fill, check, noise, fit, predict, report (rank 0). Returns an exit status. */
static int one_kernel(run_state *r, int depth, tpk_ctx *ctx)
{
    const tpk_gp_experiment_opts *e = &r->cg.o;
    const size_t n = r->t.n, c = r->d->c;
    const double t0 = tpk_wall_seconds();
    double err = 0;
    int rc, st = fill_kernel(r, depth, &err, ctx);
    if ((rc = mpi_settle(st, 0, ctx, TOOL)))
        return rc;
    if (r->t.m)
        mpi_sum_all(r->kdiag, r->t.m);
    mpi_kstore_diag(&r->K, r->diag);
    mpi_sum_all(r->diag, n);
    double md = 0;
    for (size_t i = 0; i < n; i++)
        md += r->diag[i];
    md /= (double)n;
    const double t1 = tpk_wall_seconds();
    if (r->solver == SOLVER_CG) {
        r->o.cg.rank = r->o.cg.rank < n ? r->o.cg.rank : n;
        st = mpi_pcg_alloc(&r->K, r->d->Y, &r->o.cg, &r->pc, ctx);
    } else {
        st = mpi_chol_alloc(&r->ch, &r->K, r->d->Y, md, ctx);
    }
    if ((rc = mpi_settle(st, 0, ctx, TOOL)))
        return rc;
    if (r->file && (rc = mpi_settle(check_file_kernel(r, md, ctx), 0, ctx, TOOL)))
        return rc;
    const double t1a = tpk_wall_seconds();
    tpk_gp_result res;
    tpk_gp_result_init(&res, depth);
    double scale, got[3] = {0, 0, 0};
    if (e->noise_auto) {
        if ((rc = mpi_settle(noise_guess(r, got, ctx), 0, ctx, TOOL)))
            return rc;
        mpi_bcast_doubles(got, 3);
    }
    const double t1b = tpk_wall_seconds();
    st = noise_and_fit(r, e->noise_auto ? got : NULL, &res, &scale, ctx);
    if ((rc = mpi_settle(st, 0, ctx, TOOL)))
        return rc;
    const double t2 = tpk_wall_seconds();
    const tpk_gp_info *in = &r->last;
    const double ratio = in->noise;
    res.noise = ratio * scale;
    res.scale = scale;
    res.lml = -0.5 * in->quad / scale - 0.5 * (double)c * (in->logdet + (double)n * log(scale)) -
              0.5 * (double)(n * c) * log(2 * M_PI);
    const double *alpha;
    if (r->solver == SOLVER_CG) {
        double se, resid;
        int its;
        size_t used;
        mpi_pcg_stats(r->pc, &se, &its, &resid, &used);
        res.jitter = 0;
        res.lml_error = 0.5 * (double)c * se; /* d LML / d logdet = −C/2 (s depends on quad) */
        res.cg_iterations = its;
        res.cg_residual = resid;
        alpha = mpi_pcg_alpha(r->pc);
        if (resid > r->o.cg.tol && r->g.rank == 0 && e->warnings)
            fprintf(e->warnings, TOOL ": warning: CG stopped at --cg-maxiter=%d with relative "
                    "residual %.3g > --cg-tol=%.3g\n", r->o.cg.maxiter, resid, r->o.cg.tol);
    } else {
        res.jitter = r->ch.jitter * scale;
        st = mpi_chol_rcond(&r->ch, &res.rcond, ctx);
        if ((rc = mpi_settle(st, 0, ctx, TOOL)))
            return rc;
        alpha = r->ch.alpha;
    }
    if (r->t.m && (rc = mpi_settle(predict(r, alpha, scale, ctx), 0, ctx, TOOL)))
        return rc;
    const double t3 = tpk_wall_seconds();
    res.seconds = t3 - t0;
    st = TPK_OK;
    if (r->g.rank == 0) {
        st = tpk_gp_report_kernel(r->rep, &res, r->t.m ? r->mean : NULL, r->varr, NULL, ctx);
        if (!st && e->summary)
            fprintf(e->summary, "    stages: kernel %.2f s, %s %.2f s, subsample noise %.2f s, "
                    "fit%s %.2f s, predictions %.2f s\n", t1 - t0,
                    r->solver == SOLVER_CG ? "preconditioner" : "setup", t1a - t1, t1b - t1a,
                    res.fits > 1 ? "s" : "", t2 - t1b, t3 - t2);
    }
    mpi_pcg_free(r->pc);
    r->pc = NULL;
    mpi_chol_free(&r->ch);
    return mpi_settle(st, 0, ctx, TOOL);
}

/* Rank 0: the program's own attributes, then the file. */
static int finish(run_state *r, tpk_ctx *ctx)
{
    tpk_h5out *out = tpk_gp_report_output(r->rep);
    char grid[64];
    snprintf(grid, sizeof grid, "%dx%d", r->g.nprow, r->g.npcol);
    const int cg = r->solver == SOLVER_CG;
    int st = tpk_h5out_attr_int(out, "/", "mpi_ranks", r->g.size, ctx);
    if (!st) st = tpk_h5out_attr_str(out, "/", "mpi_grid", grid, ctx);
    if (!st) st = tpk_h5out_attr_str(out, "/", "solver",
                                     cg ? "cg: block preconditioned conjugate gradients, LML by "
                                          "stochastic Lanczos quadrature"
                                        : "cholesky: ScaLAPACK pdpotrf/pdpotrs", ctx);
    if (!st) st = tpk_h5out_attr_int(out, "/", "tile_items", (long long)r->t.b, ctx);
    if (!st) st = tpk_h5out_attr_str(out, "/", "dtype", cg && r->o.l.f32 ? "float32" : "float64",
                                     ctx);
    if (cg) {
        if (!st) st = tpk_h5out_attr_double(out, "/", "cg_tol", r->o.cg.tol, ctx);
        if (!st) st = tpk_h5out_attr_int(out, "/", "cg_maxiter", r->o.cg.maxiter, ctx);
        if (!st) st = tpk_h5out_attr_str(out, "/", "preconditioner",
                                         precond_names[r->o.cg.precond], ctx);
        if (!st) st = tpk_h5out_attr_int(out, "/", "precond_rank", (long long)r->o.cg.rank, ctx);
        if (!st) st = tpk_h5out_attr_int(out, "/", "slq_probes", r->o.cg.probes, ctx);
        if (!st) st = tpk_h5out_attr_int(out, "/", "slq_seed", (long long)r->o.cg.seed, ctx);
    }
    return st ? st : tpk_gp_report_commit(r->rep, ctx);
}

static int alloc_stores(run_state *r, tpk_ctx *ctx)
{
    const int layout = r->solver == SOLVER_CG ? MPI_KSTORE_PACKED : MPI_KSTORE_SCALAPACK;
    const size_t n = r->t.n, m = r->t.m, c = r->d->c;
    int st = mpi_kstore_alloc(&r->K, &r->t, &r->g, 0, layout, r->o.l.f32, ctx);
    if (!st && m)
        st = mpi_kstore_alloc(&r->Kx, &r->t, &r->g, 1, layout, r->o.l.f32, ctx);
    if (st)
        return st;
    const tpk_gp_experiment_opts *e = &r->cg.o;
    const size_t mv = e->var_n > 0 && e->var_n < m ? e->var_n : m;
    r->diag = malloc(n * sizeof *r->diag);
    if (m) {
        r->kdiag = malloc(m * sizeof *r->kdiag);
        r->mean_c = malloc(m * c * sizeof *r->mean_c);
        r->mean = tpk_array_alloc2(m, c, ctx);
        if (!e->no_var)
            r->varr = tpk_array_alloc(1, (size_t[]){mv}, ctx);
    }
    if (!r->diag || (m && (!r->kdiag || !r->mean_c || !r->mean || (!e->no_var && !r->varr))))
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    return TPK_OK;
}

static int run(run_state *r, int argc, char **argv, double t0, tpk_ctx *ctx)
{
    mpi_grid *g = &r->g;
    r->o = (mpi_opts){.l = {.tile = DEFAULT_TILE}, .cg = {.tol = DEFAULT_CG_TOL,
                      .maxiter = DEFAULT_CG_MAXITER, .precond = MPI_PRECOND_PIVCHOL,
                      .rank = DEFAULT_PRECOND_RANK, .probes = DEFAULT_PROBES}};
    int st = cli_gpregress_parse(argc, argv, TOOL, help, own_opts, own_option, &r->o, &r->cg,
                                 ctx), rc;
    if (st == CLI_GPREGRESS_DONE)
        return 0;
    tpk_gp_experiment_opts *e = &r->cg.o;
    if (!st)
        st = check_supported(e, &r->o, ctx);
    if ((rc = mpi_settle(st, st != TPK_ENOMEM, ctx, TOOL)))
        return rc;
    st = mpi_grid_init(g, r->o.l.nprow, r->o.l.npcol, ctx);
    if ((rc = mpi_settle(st, 1, ctx, TOOL)))
        return rc;
    /* what a person reads comes from rank 0 */
    e->summary = g->rank == 0 && !r->cg.quiet ? stdout : NULL;
    e->warnings = g->rank == 0 && !r->cg.quiet ? stderr : NULL;
    memset(&r->prog, 0, sizeof r->prog);
    r->prog.prog = TOOL;
    r->prog.on = g->rank == 0 && !r->cg.quiet && cli_progress_wanted(r->cg.progress);
    r->o.cg.prog = &r->prog;
    size_t n = 0, m = 0;
    if (e->kernel_file)
        st = mpi_ksrc_file(MPI_COMM_WORLD, e->kernel_file,
                           e->kernel_type == TPK_GP_KERNEL_NTK ? "ntk" : "kernel", &n, &m,
                           &r->file, ctx);
    if ((rc = mpi_settle(st, 0, ctx, TOOL)))
        return rc;
    /* every rank reads the inputs and targets (small beside the kernel) */
    st = (r->d = tpk_gp_data_read(e, n, m, ctx)) ? TPK_OK : ctx->status;
    if ((rc = mpi_settle(st, 0, ctx, TOOL)))
        return rc;
    if (g->rank == 0) /* the output opened before the heavy work: a bad path fails now */
        st = (r->rep = tpk_gp_report_open(e, r->d, ctx)) ? TPK_OK : ctx->status;
    if ((rc = mpi_settle(st, 0, ctx, TOOL)))
        return rc;
    if (mpi_tiles_init(&r->t, r->d->n, r->d->m, r->o.l.tile, 1, g->nprow, g->npcol))
        st = TPK_ERROR(ctx, TPK_EINVAL, "--tile=%zu: no tile layout for %zu items", r->o.l.tile,
                       r->d->n);
    if ((rc = mpi_settle(st, 1, ctx, TOOL)))
        return rc;
    choose_solver(r);
    st = alloc_stores(r, ctx);
    if ((rc = mpi_settle(st, 0, ctx, TOOL)))
        return rc;
    const int mlp = e->kernel && strcmp(e->kernel, "mlp") == 0;
    for (int depth = mlp ? e->depth_lo : 0; depth <= (mlp ? e->depth_hi : 0); depth++)
        if ((rc = one_kernel(r, depth, ctx)))
            return rc;
    st = g->rank == 0 ? finish(r, ctx) : TPK_OK;
    if ((rc = mpi_settle(st, 0, ctx, TOOL)))
        return rc;
    if (e->summary)
        printf("  wrote %s in %.1f s\n", e->output, tpk_wall_seconds() - t0);
    return 0;
}

static void run_free(run_state *r)
{
    tpk_gp_report_free(r->rep); /* uncommitted: no output file */
    mpi_pcg_free(r->pc);
    mpi_chol_free(&r->ch);
    mpi_ksrc_free(r->src);
    mpi_ksrc_free(r->file);
    mpi_kstore_free(&r->K);
    mpi_kstore_free(&r->Kx);
    free(r->kdiag);
    free(r->diag);
    free(r->mean_c);
    tpk_array_free(r->mean);
    tpk_array_free(r->varr);
    tpk_gp_data_free(r->d);
    mpi_grid_free(&r->g);
    cli_gpregress_free(&r->cg);
}

int main(int argc, char **argv)
{
    double t0 = tpk_wall_seconds();
    int rank = mpi_start(&argc, &argv);
    if (rank < 0)
        return 1;
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    run_state r = {.g = {.rank = rank, .ctxt = -1}};
    int rc = run(&r, argc, argv, t0, &ctx);
    run_free(&r);
    MPI_Finalize();
    return rc;
}
