/* Block preconditioned CG and stochastic Lanczos quadrature for gpregress-mpi (mpi/pcg.h). */
#include "pcg.h"
#include "rank.h"

#include "tpk/rng.h"

#include <cblas.h>
#include <lapacke.h>
#include <mpi.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Pivoted Cholesky stops early when the diagonal left over is below this share of the trace
 * (the kernel is then that low-rank matrix to rounding). */
#define PIVCHOL_TRACE_TOL 1e-12
/* Test items whose variances one block solve computes. */
#define VAR_BLOCK 64

struct mpi_pcg {
    mpi_kstore *K;
    const tpk_array *Y;
    mpi_pcg_opts o;
    size_t n, c, t, wmax;
    int rank;
    double noise;
    /* pivoted Cholesky L = U·diag(s)·Wᵀ: U (n×r, column-major), s2 = s² */
    double *U, *s2;
    size_t r;
    /* block Jacobi: the diagonal tiles held here, K_ii = Q·diag(lam)·Qᵀ */
    size_t nd, *dr0, *dnr, *qoff;
    double *Q, *lam;
    /* replicated n×wmax work, column-major */
    double *V, *B, *X, *R, *Z, *P, *AP, *tmp;
    double *la, *lb;       /* CG coefficients of the probes: t × maxiter */
    double *rz, *bn;
    int *flag, *steps;
    double *alpha;
    double logdet_se, resid;
    int iters;
};

void mpi_pcg_free(mpi_pcg *p)
{
    if (!p)
        return;
    double *d[] = {p->U, p->s2, p->Q, p->lam, p->V, p->B, p->X, p->R, p->Z, p->P, p->AP,
                   p->tmp, p->la, p->lb, p->rz, p->bn, p->alpha};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
        free(d[i]);
    free(p->dr0);
    free(p->dnr);
    free(p->qoff);
    free(p->flag);
    free(p->steps);
    free(p);
}

/* Every rank's allocations succeeded (collective). */
static int all_ok(int ok, tpk_ctx *ctx)
{
    int all;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all ? TPK_OK
               : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory for the CG vectors on %s rank",
                           ok ? "another" : "this");
}

/* ---- preconditioners ------------------------------------------------------------------------- */

/* Rank 0 factors, the others contribute the columns it asks for: the pivots are rank 0's
 * choices, broadcast, so every rank adds the same column. Then rank 0's thin SVD, broadcast. */
static int build_pivchol(mpi_pcg *p, tpk_ctx *ctx)
{
    const size_t n = p->n, rmax = p->o.rank < n ? p->o.rank : n;
    double *d = malloc(n * sizeof *d), *col = malloc(n * sizeof *col);
    double *L = p->rank == 0 ? calloc(n * (rmax ? rmax : 1), sizeof *L) : NULL;
    int st = all_ok(d && col && (p->rank != 0 || L), ctx);
    if (st)
        goto done;
    mpi_kstore_diag(p->K, d);
    mpi_sum_all(d, n);
    double trace = 0;
    for (size_t i = 0; i < n; i++)
        trace += d[i];
    size_t k = 0;
    for (; k < rmax; k++) {
        long long piv = -1;
        if (p->rank == 0) {
            size_t b = 0;
            for (size_t i = 1; i < n; i++)
                if (d[i] > d[b])
                    b = i;
            piv = d[b] > PIVCHOL_TRACE_TOL * trace ? (long long)b : -1;
        }
        MPI_Bcast(&piv, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
        if (piv < 0)
            break;
        mpi_kstore_column(p->K, (size_t)piv, col);
        mpi_sum_root(col, n);
        if (p->rank != 0)
            continue;
        /* l = (K[:, piv] − L[:, :k] L[piv, :k]ᵀ) / sqrt(d[piv]) */
        if (k)
            cblas_dgemv(CblasColMajor, CblasNoTrans, (int)n, (int)k, -1.0, L, (int)n,
                        L + piv, (int)n, 1.0, col, 1);
        const double sq = sqrt(d[piv]);
        double *l = L + k * n;
        for (size_t i = 0; i < n; i++) {
            l[i] = col[i] / sq;
            d[i] -= l[i] * l[i];
        }
        d[piv] = 0;
    }
    p->r = k;
    if (!k)
        goto done;
    p->U = malloc(n * k * sizeof *p->U);
    p->s2 = malloc(k * sizeof *p->s2);
    double *vt = p->rank == 0 ? malloc(k * k * sizeof *vt) : NULL;
    st = all_ok(p->U && p->s2 && (p->rank != 0 || vt), ctx);
    int info = 0;
    if (!st && p->rank == 0)
        info = LAPACKE_dgesdd(LAPACK_COL_MAJOR, 'S', (lapack_int)n, (lapack_int)k, L,
                              (lapack_int)n, p->s2, p->U, (lapack_int)n, vt, (lapack_int)k);
    free(vt);
    if (!st) {
        MPI_Bcast(&info, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (info)
            st = TPK_ERROR(ctx, TPK_ENUMERIC, "the SVD of the pivoted Cholesky factor failed "
                           "(dgesdd info %d)", info);
    }
    if (!st) {
        mpi_bcast_doubles(p->U, n * k);
        mpi_bcast_doubles(p->s2, k);
        for (size_t i = 0; i < k; i++)
            p->s2[i] *= p->s2[i];
    }
done:
    free(d);
    free(col);
    free(L);
    return st;
}

/* The diagonal tiles held here, eigendecomposed (noise-free). */
static int build_jacobi(mpi_pcg *p, tpk_ctx *ctx)
{
    mpi_kstore *K = p->K;
    size_t total = 0, nd = 0;
    for (size_t k = 0; k < K->ntiles; k++) {
        mpi_tile tile = mpi_tiles_tile(K->t, K->ids[k]);
        size_t r0, nr, c0, nc;
        mpi_tiles_extent(K->t, tile, &r0, &nr, &c0, &nc);
        if (tile.i == tile.j) {
            nd++;
            total += nr * nr;
        }
    }
    p->dr0 = malloc((nd + 1) * sizeof *p->dr0);
    p->dnr = malloc((nd + 1) * sizeof *p->dnr);
    p->qoff = malloc((nd + 1) * sizeof *p->qoff);
    p->Q = malloc((total + 1) * sizeof *p->Q);
    p->lam = malloc((p->n + 1) * sizeof *p->lam);
    int st = all_ok(p->dr0 && p->dnr && p->qoff && p->Q && p->lam, ctx);
    if (st)
        return st;
    int info = 0;
    size_t off = 0;
    for (size_t k = 0; k < K->ntiles && !info; k++) {
        size_t r0, nr, c0, nc, ld;
        const double *T;
        mpi_tile tile = mpi_kstore_tile(K, k, &r0, &nr, &c0, &nc, &T, &ld);
        if (tile.i != tile.j)
            continue;
        double *q = p->Q + off;
        for (size_t j = 0; j < nr; j++)
            memcpy(q + j * nr, T + j * ld, nr * sizeof *q);
        info = LAPACKE_dsyevd(LAPACK_COL_MAJOR, 'V', 'L', (lapack_int)nr, q, (lapack_int)nr,
                              p->lam + r0);
        p->dr0[p->nd] = r0;
        p->dnr[p->nd] = nr;
        p->qoff[p->nd++] = off;
        off += nr * nr;
    }
    int bad = info != 0, any;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return any ? TPK_ERROR(ctx, TPK_ENUMERIC, "the eigendecomposition of a diagonal tile failed "
                           "(block-Jacobi preconditioner)")
               : TPK_OK;
}

/* out = P^e · in (w columns; e = −1 or 1/2) with P the preconditioner at the current noise.
 * in and out may not overlap. Collective (block Jacobi sums its blocks over the ranks). */
static void precond_pow(mpi_pcg *p, double e, const double *in, double *out, size_t w)
{
    const size_t n = p->n;
    const double s2 = p->noise;
    if (p->o.precond == MPI_PRECOND_PIVCHOL && p->r) {
        /* P = U diag(s²) Uᵀ + σ²I: P^e = σ^{2e} I + U diag((s² + σ²)^e − σ^{2e}) Uᵀ */
        const double base = pow(s2, e);
        for (size_t q = 0; q < n * w; q++)
            out[q] = base * in[q];
        cblas_dgemm(CblasColMajor, CblasTrans, CblasNoTrans, (int)p->r, (int)w, (int)n, 1.0,
                    p->U, (int)n, in, (int)n, 0.0, p->tmp, (int)p->r);
        for (size_t j = 0; j < w; j++)
            for (size_t i = 0; i < p->r; i++)
                p->tmp[i + j * p->r] *= pow(p->s2[i] + s2, e) - base;
        cblas_dgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)w, (int)p->r, 1.0,
                    p->U, (int)n, p->tmp, (int)p->r, 1.0, out, (int)n);
        return;
    }
    if (p->o.precond == MPI_PRECOND_JACOBI) {
        memset(out, 0, n * w * sizeof *out);
        for (size_t k = 0; k < p->nd; k++) {
            const size_t r0 = p->dr0[k], nr = p->dnr[k];
            const double *Q = p->Q + p->qoff[k];
            cblas_dgemm(CblasColMajor, CblasTrans, CblasNoTrans, (int)nr, (int)w, (int)nr, 1.0,
                        Q, (int)nr, in + r0, (int)n, 0.0, p->tmp, (int)nr);
            for (size_t j = 0; j < w; j++)
                for (size_t i = 0; i < nr; i++)
                    p->tmp[i + j * nr] *= pow(p->lam[r0 + i] + s2, e);
            cblas_dgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, (int)nr, (int)w, (int)nr, 1.0,
                        Q, (int)nr, p->tmp, (int)nr, 0.0, out + r0, (int)n);
        }
        mpi_sum_all(out, n * w);
        return;
    }
    memcpy(out, in, n * w * sizeof *out);
}

/* log det P at the current noise (collective). */
static double precond_logdet(mpi_pcg *p)
{
    const double s2 = p->noise;
    if (p->o.precond == MPI_PRECOND_PIVCHOL && p->r) {
        double s = (double)(p->n - p->r) * log(s2);
        for (size_t i = 0; i < p->r; i++)
            s += log(p->s2[i] + s2);
        return s;
    }
    if (p->o.precond == MPI_PRECOND_JACOBI) {
        double s[1] = {0};
        for (size_t k = 0; k < p->nd; k++)
            for (size_t i = 0; i < p->dnr[k]; i++)
                s[0] += log(p->lam[p->dr0[k] + i] + s2);
        mpi_sum_all(s, 1);
        return s[0];
    }
    return 0;
}

int mpi_pcg_alloc(mpi_kstore *K, const tpk_array *Y, const mpi_pcg_opts *o, mpi_pcg **out,
                  tpk_ctx *ctx)
{
    *out = NULL;
    mpi_pcg *p = calloc(1, sizeof *p);
    int st = all_ok(p != NULL, ctx);
    if (st)
        return st;
    MPI_Comm_rank(MPI_COMM_WORLD, &p->rank);
    p->K = K;
    p->Y = Y;
    p->o = *o;
    p->n = K->t->n;
    p->c = Y->dims[1];
    p->t = (size_t)o->probes;
    p->wmax = p->c + p->t > VAR_BLOCK ? p->c + p->t : VAR_BLOCK;
    const size_t n = p->n, w = p->wmax, tr = o->rank > K->t->b ? o->rank : K->t->b;
    double **vec[] = {&p->B, &p->X, &p->R, &p->Z, &p->P, &p->AP};
    int ok = 1;
    for (size_t i = 0; i < sizeof vec / sizeof vec[0]; i++)
        ok &= (*vec[i] = malloc(n * w * sizeof(double))) != NULL;
    p->V = malloc(n * (p->t ? p->t : 1) * sizeof *p->V);
    p->tmp = malloc(tr * w * sizeof *p->tmp);
    p->la = malloc((p->t ? p->t : 1) * (size_t)o->maxiter * sizeof *p->la);
    p->lb = malloc((p->t ? p->t : 1) * (size_t)o->maxiter * sizeof *p->lb);
    p->rz = malloc(w * sizeof *p->rz);
    p->bn = malloc(w * sizeof *p->bn);
    p->flag = malloc(w * sizeof *p->flag);
    p->steps = malloc(w * sizeof *p->steps);
    p->alpha = malloc(n * p->c * sizeof *p->alpha);
    ok &= p->V && p->tmp && p->la && p->lb && p->rz && p->bn && p->flag && p->steps && p->alpha;
    if (!(st = all_ok(ok, ctx))) {
        /* Rademacher probes: ±1 from the counter-based generator, the same on every rank */
        const uint64_t stream = tpk_rng_stream_named(TPK_RNG_MC, "gpregress-mpi slq probes");
        for (size_t j = 0; j < p->t; j++)
            for (size_t i = 0; i < n; i++)
                p->V[i + j * n] =
                    tpk_rng_uniform_at(o->seed, stream, (uint32_t)i, (uint32_t)j) < 0.5 ? -1 : 1;
        if (o->precond == MPI_PRECOND_PIVCHOL)
            st = build_pivchol(p, ctx);
        else if (o->precond == MPI_PRECOND_JACOBI)
            st = build_jacobi(p, ctx);
    }
    if (st) {
        mpi_pcg_free(p);
        return st;
    }
    *out = p;
    return TPK_OK;
}

/* ---- the block solve ------------------------------------------------------------------------- */

static double dot(const double *a, const double *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* (K + σ²I) X = B for the w columns of p->B, the last `probes` of which record their
 * coefficients (p->la, p->lb; steps in p->steps). Every column runs its own recurrence; a
 * column stops when its relative residual reaches the tolerance. The decisions (stop,
 * breakdown) are rank 0's, broadcast, so that every rank iterates alike. */
static int solve(mpi_pcg *p, size_t w, size_t probes, tpk_ctx *ctx)
{
    const size_t n = p->n, y0 = w - probes, maxit = (size_t)p->o.maxiter;
    memset(p->X, 0, n * w * sizeof *p->X);
    memcpy(p->R, p->B, n * w * sizeof *p->R);
    precond_pow(p, -1.0, p->R, p->Z, w);
    memcpy(p->P, p->Z, n * w * sizeof *p->P);
    for (size_t j = 0; j < w; j++) {
        p->rz[j] = dot(p->R + j * n, p->Z + j * n, n);
        p->bn[j] = sqrt(dot(p->B + j * n, p->B + j * n, n));
        p->flag[j] = p->bn[j] > 0;
        p->steps[j] = 0;
    }
    size_t it = 0;
    int active = 1, broke = 0;
    cli_progress *pr = p->o.prog;
    const size_t decades = (size_t)ceil(10 * -log10(p->o.tol)); /* ≥ 1: tol is in (0, 1) */
    if (pr)
        cli_progress_start(pr, pr->prog, "CG residual (tenths of decades)", decades, pr->on);
    for (; active && it < maxit; it++) {
        double worst = 0;
        memset(p->AP, 0, n * w * sizeof *p->AP);
        mpi_kstore_mul(p->K, p->P, w, p->AP);
        mpi_sum_all(p->AP, n * w);
        for (size_t j = 0; j < w; j++) {
            if (p->flag[j] != 1)
                continue;
            double *pj = p->P + j * n, *apj = p->AP + j * n, *xj = p->X + j * n,
                   *rj = p->R + j * n;
            for (size_t i = 0; i < n; i++)
                apj[i] += p->noise * pj[i];
            double pq = dot(pj, apj, n);
            if (!(pq > 0)) { /* not positive definite (or a breakdown) */
                p->flag[j] = -1;
                continue;
            }
            double a = p->rz[j] / pq;
            for (size_t i = 0; i < n; i++) {
                xj[i] += a * pj[i];
                rj[i] -= a * apj[i];
            }
            if (j >= y0)
                p->la[(j - y0) * maxit + it] = a;
        }
        precond_pow(p, -1.0, p->R, p->Z, w);
        active = 0;
        for (size_t j = 0; j < w; j++) {
            if (p->flag[j] != 1)
                continue;
            double *pj = p->P + j * n, *zj = p->Z + j * n, *rj = p->R + j * n;
            double rzn = dot(rj, zj, n), b = rzn / p->rz[j];
            p->rz[j] = rzn;
            if (j >= y0)
                p->lb[(j - y0) * maxit + it] = b;
            for (size_t i = 0; i < n; i++)
                pj[i] = zj[i] + b * pj[i];
            p->steps[j] = (int)it + 1;
            double rel = sqrt(dot(rj, rj, n)) / p->bn[j];
            worst = fmax(worst, rel);
            if (rel <= p->o.tol)
                p->flag[j] = 0;
            else
                active = 1;
        }
        if (pr) {
            snprintf(pr->note, sizeof pr->note, "iteration %zu, residual %.2g", it + 1, worst);
            double got = worst > 0 ? 10 * -log10(worst) : (double)decades;
            cli_progress_update(pr, got <= 0 ? 0 : got >= (double)decades ? decades - 1 : (size_t)got);
        }
        MPI_Bcast(p->flag, (int)w, MPI_INT, 0, MPI_COMM_WORLD);
        MPI_Bcast(&active, 1, MPI_INT, 0, MPI_COMM_WORLD);
    }
    if (pr)
        cli_progress_end(pr, 1);
    p->iters = (int)it;
    p->resid = 0;
    for (size_t j = 0; j < w; j++) {
        broke |= p->flag[j] < 0;
        if (j < y0 && p->bn[j] > 0) {
            const double *rj = p->R + j * n;
            p->resid = fmax(p->resid, sqrt(dot(rj, rj, n)) / p->bn[j]);
        }
    }
    if (broke)
        return TPK_ERROR(ctx, TPK_ENUMERIC, "conjugate gradients broke down (p'Ap <= 0 at "
                         "noise %.4g): the kernel + noise*I is not positive definite", p->noise);
    return TPK_OK;
}

/* e1ᵀ log(T) e1 of the Lanczos tridiagonal of probe q (m steps), from its CG coefficients:
 * T_kk = 1/a_k + b_{k−1}/a_{k−1}, T_k,k+1 = sqrt(b_k)/a_k (Saad, Iterative Methods §6.7.3). */
static int lanczos_log(const mpi_pcg *p, size_t q, double *val)
{
    const size_t m = (size_t)p->steps[p->c + q], maxit = (size_t)p->o.maxiter;
    const double *a = p->la + q * maxit, *b = p->lb + q * maxit;
    double *d = malloc((m + 1) * sizeof *d), *e = malloc((m + 1) * sizeof *e),
           *z = malloc((m * m + 1) * sizeof *z);
    int st = d && e && z ? 0 : -1;
    for (size_t k = 0; !st && k < m; k++) {
        d[k] = 1 / a[k] + (k ? b[k - 1] / a[k - 1] : 0);
        if (k + 1 < m)
            e[k] = sqrt(b[k]) / a[k];
    }
    if (!st && m)
        st = LAPACKE_dstev(LAPACK_COL_MAJOR, 'V', (lapack_int)m, d, e, z, (lapack_int)m);
    double s = 0;
    for (size_t k = 0; !st && k < m; k++)
        s += z[k * m] * z[k * m] * log(d[k]);
    *val = s;
    free(d);
    free(e);
    free(z);
    return st;
}

int mpi_pcg_fit(double noise, void *data, tpk_gp_info *info, tpk_ctx *ctx)
{
    mpi_pcg *p = data;
    const size_t n = p->n, c = p->c, t = p->t, w = c + t;
    p->noise = noise;
    for (size_t j = 0; j < c; j++)
        for (size_t i = 0; i < n; i++)
            p->B[i + j * n] = p->Y->data[i * c + j];
    /* probes z = P^{1/2} v: CG on z runs the Lanczos process of P^{-1/2} A P^{-1/2} from v */
    precond_pow(p, 0.5, p->V, p->B + c * n, t);
    int st = solve(p, w, t, ctx);
    if (st)
        return st;
    memcpy(p->alpha, p->X, n * c * sizeof *p->alpha);
    double quad = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < c; j++)
            quad += p->alpha[i + j * n] * p->Y->data[i * c + j];
    /* Hutchinson over the probes: vᵀ log(M) v ≈ ‖v‖² e1ᵀ log(T) e1, ‖v‖² = N */
    double mean = 0, m2 = 0;
    for (size_t q = 0; q < t; q++) {
        double v;
        if (lanczos_log(p, q, &v))
            return TPK_ERROR(ctx, TPK_ENUMERIC, "the Lanczos tridiagonal of probe %zu has no "
                             "eigendecomposition (dstev)", q);
        v *= (double)n;
        double dlt = v - mean;
        mean += dlt / (double)(q + 1);
        m2 += dlt * (v - mean);
    }
    p->logdet_se = t > 1 ? sqrt(m2 / (double)(t - 1) / (double)t) : NAN;
    /* rank 0's numbers everywhere: the noise walk compares them, and every rank must walk alike
     * (the replicated vectors may differ in their last bits where BLAS runs other threads) */
    double keep[4] = {quad, precond_logdet(p) + mean, p->logdet_se, p->resid};
    mpi_bcast_doubles(keep, 4);
    mpi_bcast_doubles(p->alpha, n * c);
    p->logdet_se = keep[2];
    p->resid = keep[3];
    *info = (tpk_gp_info){.n = n, .c = c, .noise = noise, .rcond = NAN, .quad = keep[0],
                          .logdet = keep[1]};
    info->lml = -0.5 * info->quad - 0.5 * (double)c * info->logdet -
                0.5 * (double)(n * c) * log(2 * M_PI);
    return TPK_OK;
}

const double *mpi_pcg_alpha(const mpi_pcg *p) { return p->alpha; }

void mpi_pcg_stats(const mpi_pcg *p, double *logdet_se, int *iters, double *residual,
                   size_t *pc_rank)
{
    *logdet_se = p->logdet_se;
    *iters = p->iters;
    *residual = p->resid;
    *pc_rank = p->o.precond == MPI_PRECOND_PIVCHOL ? p->r : 0;
}

int mpi_pcg_var(mpi_pcg *p, mpi_kstore *Kx, size_t mv, const double *kdiag, double *var,
                tpk_ctx *ctx)
{
    const size_t n = p->n;
    /* keep the fit's statistics: the variance solves are reported apart */
    const double se = p->logdet_se, res = p->resid;
    const int its = p->iters;
    int st = TPK_OK;
    for (size_t i0 = 0; i0 < mv && !st; i0 += VAR_BLOCK) {
        size_t q = mv - i0 < VAR_BLOCK ? mv - i0 : VAR_BLOCK;
        mpi_kstore_rows_t(Kx, i0, q, p->B);
        mpi_sum_all(p->B, n * q);
        st = solve(p, q, 0, ctx);
        for (size_t j = 0; !st && j < q; j++)
            var[i0 + j] = fmax(kdiag[i0 + j] - dot(p->B + j * n, p->X + j * n, n), 0.0);
    }
    p->logdet_se = se;
    p->resid = res;
    p->iters = its;
    return st;
}
