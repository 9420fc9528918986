/* ScaLAPACK Cholesky for gpregress-mpi (mpi/chol.h). */
#include "chol.h"
#include "rank.h"

#include <mpi.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ScaLAPACK (Fortran interface; the library ships no C header). */
void pdpotrf_(const char *uplo, const int *n, double *a, const int *ia, const int *ja,
              const int *desca, int *info);
void pdpotrs_(const char *uplo, const int *n, const int *nrhs, const double *a, const int *ia,
              const int *ja, const int *desca, double *b, const int *ib, const int *jb,
              const int *descb, int *info);
/* LAPACK's reverse-communication estimator of a 1-norm (what dpocon calls). */
void dlacn2_(const int *n, double *v, double *x, int *isgn, double *est, int *kase, int *isave);
void pdtrsm_(const char *side, const char *uplo, const char *transa, const char *diag,
             const int *m, const int *n, const double *alpha, const double *a, const int *ia,
             const int *ja, const int *desca, double *b, const int *ib, const int *jb,
             const int *descb);
void descinit_(int *desc, const int *m, const int *n, const int *mb, const int *nb,
               const int *irsrc, const int *icsrc, const int *ictxt, const int *lld, int *info);

static const int one = 1;

/* Global index of local index l in blocks of nb over np processes, this one p. */
static size_t global_of(size_t l, size_t nb, int p, int np)
{
    return (l / nb * (size_t)np + (size_t)p) * nb + l % nb;
}

int mpi_chol_alloc(mpi_chol *ch, mpi_kstore *K, const tpk_array *Y, double mean_diag,
                   tpk_ctx *ctx)
{
    memset(ch, 0, sizeof *ch);
    const mpi_tiles *t = K->t;
    ch->K = K;
    ch->Y = Y;
    ch->n = t->n;
    ch->c = Y->dims[1];
    ch->mean_diag = mean_diag;
    tpk_gp_options_default(&ch->opt);
    const size_t ymloc = K->mloc, b = t->b;
    ch->ynloc = mpi_numroc(ch->c, b, K->mycol, t->npcol);
    ch->ylld = ymloc > 1 ? ymloc : 1;
    ch->fac = malloc((K->bytes ? K->bytes : 1));
    ch->Yl = calloc(ch->ylld * (ch->ynloc ? ch->ynloc : 1), sizeof(double));
    ch->alpha = malloc(ch->n * ch->c * sizeof(double));
    if (!ch->fac || !ch->Yl || !ch->alpha) {
        mpi_chol_free(ch);
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory for the Cholesky factor (%zu bytes on "
                         "this rank)", K->bytes);
    }
    int n = (int)ch->n, c = (int)ch->c, nb = (int)b, zero = 0, lld = (int)ch->ylld, info = 0;
    descinit_(ch->descY, &n, &c, &nb, &nb, &zero, &zero, &K->desc[1], &lld, &info);
    if (info)
        return TPK_ERROR(ctx, TPK_EINVAL, "descinit (targets) rejected argument %d", -info);
    return TPK_OK;
}

void mpi_chol_free(mpi_chol *ch)
{
    free(ch->fac);
    free(ch->Yl);
    free(ch->alpha);
    memset(ch, 0, sizeof *ch);
}

/* The factor's diagonal on this process: Σ log L_ii, min and max L_ii. */
static void factor_diag(const mpi_chol *ch, double *logsum, double *lmin, double *lmax)
{
    const mpi_kstore *K = ch->K;
    *logsum = 0;
    *lmin = INFINITY;
    *lmax = 0;
    for (size_t k = 0; k < K->ntiles; k++) {
        mpi_tile tile = mpi_tiles_tile(K->t, K->ids[k]);
        if (tile.i != tile.j)
            continue;
        size_t r0, nr, c0, nc;
        mpi_tiles_extent(K->t, tile, &r0, &nr, &c0, &nc);
        size_t lr = tile.i / (size_t)K->t->nprow * K->t->b, lc = tile.j / (size_t)K->t->npcol *
                                                                  K->t->b;
        for (size_t i = 0; i < nr; i++) {
            double v = ch->fac[lr + i + (lc + i) * K->lld];
            *logsum += log(v);
            *lmin = fmin(*lmin, v);
            *lmax = fmax(*lmax, v);
        }
    }
}

/* K + s·I into the factor's storage, then pdpotrf: its info (0: factored). */
static int factor(mpi_chol *ch, double s)
{
    memcpy(ch->fac, ch->K->a, ch->K->bytes);
    double *keep = ch->K->a;
    ch->K->a = ch->fac; /* shift the copy's diagonal through the store's tile map */
    mpi_kstore_shift_diag(ch->K, s);
    ch->K->a = keep;
    int n = (int)ch->n, info = 0;
    pdpotrf_("L", &n, ch->fac, &one, &one, ch->K->desc, &info);
    return info;
}

int mpi_chol_factors(mpi_chol *ch, double shift, tpk_ctx *ctx)
{
    int info = factor(ch, shift);
    if (info < 0)
        return -TPK_ERROR(ctx, TPK_EINVAL, "pdpotrf rejected argument %d (internal error)",
                          -info);
    return info;
}

int mpi_chol_fit(double noise, void *data, tpk_gp_info *info, tpk_ctx *ctx)
{
    mpi_chol *ch = data;
    const tpk_gp_options *opt = &ch->opt;
    const double scale = ch->mean_diag > 0 ? ch->mean_diag : 1.0;
    double jit = 0, ratio = NAN, logsum = 0;
    int t = 0, last = 0;
    /* the policy of tpk_gp_fit (gp/fit.c): plain noise, then jitter_first·mean(diag K)·10^k
     * up to jitter_max; a factor counts when its pivots span a ratio >= pivot_ratio_min */
    for (;;) {
        t++;
        last = factor(ch, noise + jit);
        if (last < 0)
            return TPK_ERROR(ctx, TPK_EINVAL, "pdpotrf rejected argument %d (internal error)",
                             -last);
        if (last == 0) {
            double part[1], lmin, lmax, gmin, gmax;
            factor_diag(ch, &part[0], &lmin, &lmax);
            MPI_Allreduce(&lmin, &gmin, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
            MPI_Allreduce(&lmax, &gmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            mpi_sum_all(part, 1);
            logsum = part[0];
            ratio = gmin / gmax;
            if (ratio >= opt->pivot_ratio_min)
                break;
        }
        double next = jit == 0 ? opt->jitter_first * scale : jit * 10;
        if (!(opt->jitter_first > 0) || next > opt->jitter_max * scale * (1 + 1e-12)) {
            if (last > 0)
                return TPK_ERROR(ctx, TPK_ENUMERIC, "kernel + noise*I is not positive definite: "
                                 "Cholesky (pdpotrf) fails at column %d even with jitter %.3g "
                                 "(%.3g x mean diagonal, %d tries); raise the noise", last, jit,
                                 jit / scale, t);
            return TPK_ERROR(ctx, TPK_ENUMERIC, "kernel + noise*I is numerically singular: "
                             "Cholesky pivots span a ratio %.3g < %.3g even with jitter %.3g "
                             "(%.3g x mean diagonal, %d tries); raise the noise", ratio,
                             opt->pivot_ratio_min, jit, jit / scale, t);
        }
        jit = next;
    }
    ch->noise = noise;
    ch->jitter = jit;
    ch->tries = t;
    /* Y into ScaLAPACK's layout, solved in place, gathered back: α on every rank */
    const mpi_tiles *tl = ch->K->t;
    const size_t n = ch->n, c = ch->c, b = tl->b;
    for (size_t lc = 0; lc < ch->ynloc; lc++)
        for (size_t lr = 0; lr < ch->K->mloc; lr++)
            ch->Yl[lr + lc * ch->ylld] =
                ch->Y->data[global_of(lr, b, ch->K->myrow, tl->nprow) * c +
                            global_of(lc, b, ch->K->mycol, tl->npcol)];
    int in = (int)n, ic = (int)c, inf = 0;
    pdpotrs_("L", &in, &ic, ch->fac, &one, &one, ch->K->desc, ch->Yl, &one, &one, ch->descY,
             &inf);
    if (inf)
        return TPK_ERROR(ctx, TPK_EINVAL, "pdpotrs failed (info %d, internal error)", inf);
    memset(ch->alpha, 0, n * c * sizeof *ch->alpha);
    for (size_t lc = 0; lc < ch->ynloc; lc++)
        for (size_t lr = 0; lr < ch->K->mloc; lr++)
            ch->alpha[global_of(lc, b, ch->K->mycol, tl->npcol) * n +
                      global_of(lr, b, ch->K->myrow, tl->nprow)] = ch->Yl[lr + lc * ch->ylld];
    mpi_sum_all(ch->alpha, n * c); /* each entry from its one owner: exact */
    double q = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < c; k++)
            q += ch->alpha[k * n + i] * ch->Y->data[i * c + k];
    *info = (tpk_gp_info){.n = n, .c = c, .noise = noise, .jitter = jit, .tries = t,
                          .rcond = NAN, .logdet = 2 * logsum, .quad = q};
    info->lml = -0.5 * q - 0.5 * (double)c * info->logdet - 0.5 * (double)(n * c) * log(2 * M_PI);
    return TPK_OK;
}

/* x := A⁻¹x for one replicated vector, through the factor in place (the targets' buffer, which
 * the next fit fills again). */
static int solve_vector(mpi_chol *ch, double *x, tpk_ctx *ctx)
{
    const mpi_tiles *t = ch->K->t;
    const size_t n = ch->n, b = t->b;
    memset(ch->Yl, 0, ch->ylld * (ch->ynloc ? ch->ynloc : 1) * sizeof *ch->Yl);
    const int col0 = ch->K->mycol == 0; /* column 0 of the right-hand sides lives there */
    for (size_t lr = 0; col0 && lr < ch->K->mloc; lr++)
        ch->Yl[lr] = x[global_of(lr, b, ch->K->myrow, t->nprow)];
    int in = (int)n, inf = 0;
    pdpotrs_("L", &in, &one, ch->fac, &one, &one, ch->K->desc, ch->Yl, &one, &one, ch->descY,
             &inf);
    memset(x, 0, n * sizeof *x);
    for (size_t lr = 0; col0 && lr < ch->K->mloc; lr++)
        x[global_of(lr, b, ch->K->myrow, t->nprow)] = ch->Yl[lr];
    mpi_sum_all(x, n);
    return inf ? TPK_ERROR(ctx, TPK_EINVAL, "pdpotrs failed (info %d, internal error)", inf)
               : TPK_OK;
}

int mpi_chol_rcond(mpi_chol *ch, double *rcond, tpk_ctx *ctx)
{
    const size_t n = ch->n;
    double *sums = malloc(n * sizeof *sums), *v = malloc(n * sizeof *v);
    int *isgn = malloc(n * sizeof *isgn);
    int ok = sums && v && isgn, all;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    int st = all ? TPK_OK : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (condition estimate)");
    if (!st) {
        mpi_kstore_abs_colsums(ch->K, ch->noise + ch->jitter, v);
        mpi_sum_all(v, n);
        double anorm = 0;
        for (size_t i = 0; i < n; i++)
            anorm = fmax(anorm, v[i]);
        /* ‖A⁻¹‖₁ by LAPACK's estimator as dpocon runs it (Higham's dlacn2, reverse
         * communication: A⁻¹ applied to the vectors it asks for, A symmetric), the same
         * iterations on every rank (its vectors are the same bits everywhere) */
        int nn = (int)n, kase = 0, isave[3] = {0, 0, 0};
        double est = 0;
        do {
            dlacn2_(&nn, v, sums, isgn, &est, &kase, isave);
            if (kase)
                st = solve_vector(ch, sums, ctx);
        } while (kase && !st);
        *rcond = est > 0 && anorm > 0 ? 1.0 / est / anorm : 0;
    }
    free(sums);
    free(v);
    free(isgn);
    return st;
}

int mpi_chol_var(mpi_chol *ch, mpi_kstore *Kx, size_t mv, const double *kdiag, double *var,
                 tpk_ctx *ctx)
{
    int im = (int)mv, in = (int)ch->n;
    const double unit = 1.0;
    pdtrsm_("R", "L", "T", "N", &im, &in, &unit, ch->fac, &one, &one, ch->K->desc, Kx->a, &one,
            &one, Kx->desc);
    /* |L⁻¹ k_i|² from this process's columns, summed over the ranks */
    const mpi_tiles *t = Kx->t;
    memset(var, 0, mv * sizeof *var);
    for (size_t lr = 0; lr < Kx->mloc; lr++) {
        size_t i = global_of(lr, t->b, Kx->myrow, t->nprow);
        if (i >= mv)
            continue;
        double s = 0;
        for (size_t lc = 0; lc < Kx->nloc; lc++)
            s += Kx->a[lr + lc * Kx->lld] * Kx->a[lr + lc * Kx->lld];
        var[i] = s;
    }
    mpi_sum_all(var, mv);
    for (size_t i = 0; i < mv; i++) /* clipped as tpk_gp_predict clips rounding below 0 */
        var[i] = fmax(kdiag[i] - var[i], 0.0);
    (void)ctx;
    return TPK_OK;
}
