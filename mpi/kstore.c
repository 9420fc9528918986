/* Kernel matrices in tiles over the process grid (mpi/kstore.h). */
#include "kstore.h"

#include <cblas.h>

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void descinit_(int *desc, const int *m, const int *n, const int *mb, const int *nb,
               const int *irsrc, const int *icsrc, const int *ictxt, const int *lld, int *info);

size_t mpi_numroc(size_t n, size_t nb, int p, int np)
{
    size_t nblocks = n / nb, num = nblocks / (size_t)np * nb, extra = nblocks % (size_t)np;
    if ((size_t)p < extra)
        num += nb;
    else if ((size_t)p == extra)
        num += n % nb;
    return num;
}

/* Tiles of the store on process (prow, pcol): training ids 0 .. ntrain-1, test ids after. */
static size_t id_lo(const mpi_tiles *t, int test) { return test ? t->ntrain : 0; }
static size_t id_hi(const mpi_tiles *t, int test) { return test ? t->ntiles : t->ntrain; }

static size_t tile_entries(const mpi_tiles *t, size_t id)
{
    size_t r0, nr, c0, nc;
    mpi_tiles_extent(t, mpi_tiles_tile(t, id), &r0, &nr, &c0, &nc);
    return nr * nc;
}

size_t mpi_kstore_bytes(const mpi_tiles *t, int test, int layout, int f32, int prow, int pcol)
{
    if (layout == MPI_KSTORE_SCALAPACK)
        return mpi_numroc(test ? t->m : t->n, t->b, prow, t->nprow) *
               mpi_numroc(t->n, t->b, pcol, t->npcol) * sizeof(double);
    size_t e = 0;
    for (size_t id = mpi_tiles_next(t, prow, pcol, id_lo(t, test)); id < id_hi(t, test);
         id = mpi_tiles_next(t, prow, pcol, id + 1))
        e += tile_entries(t, id);
    return e * (f32 ? sizeof(float) : sizeof(double));
}

void mpi_kstore_free(mpi_kstore *s)
{
    free(s->ids);
    free(s->off);
    free(s->a);
    free(s->af);
    free(s->conv);
    memset(s, 0, sizeof *s);
}

int mpi_kstore_alloc(mpi_kstore *s, const mpi_tiles *t, const mpi_grid *g, int test, int layout,
                     int f32, tpk_ctx *ctx)
{
    memset(s, 0, sizeof *s);
    *s = (mpi_kstore){.t = t, .test = test, .layout = layout, .f32 = f32 && layout ==
                      MPI_KSTORE_PACKED, .myrow = g->myrow, .mycol = g->mycol,
                      .rows = test ? t->m : t->n, .cols = t->n};
    for (size_t id = mpi_tiles_next(t, s->myrow, s->mycol, id_lo(t, test)); id < id_hi(t, test);
         id = mpi_tiles_next(t, s->myrow, s->mycol, id + 1))
        s->ntiles++;
    s->ids = malloc((s->ntiles + 1) * sizeof *s->ids);
    s->off = malloc((s->ntiles + 1) * sizeof *s->off);
    if (!s->ids || !s->off)
        goto nomem;
    size_t k = 0, e = 0;
    for (size_t id = mpi_tiles_next(t, s->myrow, s->mycol, id_lo(t, test)); id < id_hi(t, test);
         id = mpi_tiles_next(t, s->myrow, s->mycol, id + 1)) {
        s->ids[k] = id;
        s->off[k++] = e;
        e += tile_entries(t, id);
    }
    s->off[k] = e;
    if (layout == MPI_KSTORE_SCALAPACK) {
        s->mloc = mpi_numroc(s->rows, t->b, s->myrow, t->nprow);
        s->nloc = mpi_numroc(s->cols, t->b, s->mycol, t->npcol);
        s->lld = s->mloc > 1 ? s->mloc : 1;
        if (s->rows > INT_MAX || s->cols > INT_MAX || t->b > INT_MAX || s->lld > INT_MAX)
            return TPK_ERROR(ctx, TPK_EINVAL, "a %zu x %zu kernel exceeds ScaLAPACK's int "
                             "indexing", s->rows, s->cols);
        s->bytes = s->lld * (s->nloc ? s->nloc : 1) * sizeof(double);
        if (!(s->a = calloc(s->lld * (s->nloc ? s->nloc : 1), sizeof(double))))
            goto nomem;
        int m = (int)s->rows, n = (int)s->cols, nb = (int)t->b, zero = 0, lld = (int)s->lld,
            info = 0;
        descinit_(s->desc, &m, &n, &nb, &nb, &zero, &zero, &g->ctxt, &lld, &info);
        if (info)
            return TPK_ERROR(ctx, TPK_EINVAL, "descinit rejected argument %d (internal error)",
                             -info);
        return TPK_OK;
    }
    s->bytes = e * (s->f32 ? sizeof(float) : sizeof(double));
    if (s->f32 ? !(s->af = calloc(e ? e : 1, sizeof(float))) ||
                     !(s->conv = malloc(t->b * t->b * sizeof(double)))
               : !(s->a = calloc(e ? e : 1, sizeof(double))))
        goto nomem;
    return TPK_OK;
nomem:
    mpi_kstore_free(s);
    return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory for the kernel's tiles on this rank");
}

/* Where tile k starts in the scalapack local array: the local row and column of its corner. */
static size_t local_offset(const mpi_kstore *s, mpi_tile tile)
{
    const mpi_tiles *t = s->t;
    size_t lr = tile.i / (size_t)t->nprow * t->b, lc = tile.j / (size_t)t->npcol * t->b;
    return lr + lc * s->lld;
}

mpi_tile mpi_kstore_tile(mpi_kstore *s, size_t k, size_t *r0, size_t *nr, size_t *c0, size_t *nc,
                         const double **p, size_t *ld)
{
    mpi_tile tile = mpi_tiles_tile(s->t, s->ids[k]);
    mpi_tiles_extent(s->t, tile, r0, nr, c0, nc);
    if (s->layout == MPI_KSTORE_SCALAPACK) {
        *p = s->a + local_offset(s, tile);
        *ld = s->lld;
    } else if (s->f32) {
        const float *f = s->af + s->off[k];
        for (size_t q = 0; q < *nr * *nc; q++)
            s->conv[q] = f[q];
        *p = s->conv;
        *ld = *nr;
    } else {
        *p = s->a + s->off[k];
        *ld = *nr;
    }
    return tile;
}

int mpi_kstore_put(mpi_kstore *s, size_t k, const double *T, size_t ldT, const char *what,
                   tpk_ctx *ctx)
{
    size_t r0, nr, c0, nc;
    mpi_tile tile = mpi_tiles_tile(s->t, s->ids[k]);
    mpi_tiles_extent(s->t, tile, &r0, &nr, &c0, &nc);
    for (size_t i = 0; i < nr; i++)
        for (size_t j = 0; j < nc; j++)
            if (!isfinite(T[i * ldT + j]))
                return TPK_ERROR(ctx, TPK_EDOM, "%s: non-finite kernel entry %g at [%zu, %zu]",
                                 what, T[i * ldT + j], r0 + i, c0 + j);
    if (s->layout == MPI_KSTORE_SCALAPACK) {
        double *a = s->a + local_offset(s, tile);
        for (size_t j = 0; j < nc; j++)
            for (size_t i = 0; i < nr; i++)
                a[i + j * s->lld] = T[i * ldT + j];
    } else if (s->f32) {
        float *a = s->af + s->off[k];
        for (size_t j = 0; j < nc; j++)
            for (size_t i = 0; i < nr; i++)
                a[i + j * nr] = (float)T[i * ldT + j];
    } else {
        double *a = s->a + s->off[k];
        for (size_t j = 0; j < nc; j++)
            for (size_t i = 0; i < nr; i++)
                a[i + j * nr] = T[i * ldT + j];
    }
    return TPK_OK;
}

void mpi_kstore_shift_diag(mpi_kstore *s, double noise)
{
    for (size_t k = 0; k < s->ntiles; k++) {
        mpi_tile tile = mpi_tiles_tile(s->t, s->ids[k]);
        if (s->test || tile.i != tile.j)
            continue;
        size_t r0, nr, c0, nc;
        mpi_tiles_extent(s->t, tile, &r0, &nr, &c0, &nc);
        if (s->layout == MPI_KSTORE_SCALAPACK) {
            double *a = s->a + local_offset(s, tile);
            for (size_t i = 0; i < nr; i++)
                a[i + i * s->lld] += noise;
        } else if (s->f32) {
            float *a = s->af + s->off[k];
            for (size_t i = 0; i < nr; i++)
                a[i + i * nr] = (float)((double)a[i + i * nr] + noise);
        } else {
            double *a = s->a + s->off[k];
            for (size_t i = 0; i < nr; i++)
                a[i + i * nr] += noise;
        }
    }
}

void mpi_kstore_mul(mpi_kstore *s, const double *x, size_t k, double *y)
{
    const size_t N = s->cols, M = s->rows;
    for (size_t q = 0; q < s->ntiles; q++) {
        size_t r0, nr, c0, nc, ld;
        const double *T;
        mpi_tile tile = mpi_kstore_tile(s, q, &r0, &nr, &c0, &nc, &T, &ld);
        cblas_dgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, (int)nr, (int)k, (int)nc, 1.0, T,
                    (int)ld, x + c0, (int)N, 1.0, y + r0, (int)M);
        if (!s->test && tile.i != tile.j) /* the tile above the diagonal, not stored */
            cblas_dgemm(CblasColMajor, CblasTrans, CblasNoTrans, (int)nc, (int)k, (int)nr, 1.0,
                        T, (int)ld, x + r0, (int)N, 1.0, y + c0, (int)N);
    }
}

void mpi_kstore_diag(mpi_kstore *s, double *d)
{
    memset(d, 0, s->rows * sizeof *d);
    for (size_t q = 0; q < s->ntiles; q++) {
        size_t r0, nr, c0, nc, ld;
        const double *T;
        mpi_tile tile = mpi_kstore_tile(s, q, &r0, &nr, &c0, &nc, &T, &ld);
        if (tile.i == tile.j)
            for (size_t i = 0; i < nr; i++)
                d[r0 + i] = T[i + i * ld];
    }
}

void mpi_kstore_column(mpi_kstore *s, size_t p, double *col)
{
    memset(col, 0, s->rows * sizeof *col);
    const size_t bp = p / s->t->b;
    for (size_t q = 0; q < s->ntiles; q++) {
        mpi_tile tile = mpi_tiles_tile(s->t, s->ids[q]);
        if (tile.j != bp && tile.i != bp)
            continue;
        size_t r0, nr, c0, nc, ld;
        mpi_tiles_extent(s->t, tile, &r0, &nr, &c0, &nc);
        /* the entries in place, not the whole tile converted (mpi_kstore_tile): a column of
         * the pivoted Cholesky reads N entries, not N·b */
        const double *T = NULL;
        const float *F = NULL;
        if (s->layout == MPI_KSTORE_SCALAPACK) {
            T = s->a + local_offset(s, tile);
            ld = s->lld;
        } else {
            ld = nr;
            if (s->f32)
                F = s->af + s->off[q];
            else
                T = s->a + s->off[q];
        }
#define AT(i, j) (F ? (double)F[(i) + (j) * ld] : T[(i) + (j) * ld])
        if (tile.j == bp) /* column p of the tile: rows r0 .. */
            for (size_t i = 0; i < nr; i++)
                col[r0 + i] = AT(i, p - c0);
        if (tile.i == bp && tile.i != tile.j) /* row p of a tile left of the diagonal */
            for (size_t j = 0; j < nc; j++)
                col[c0 + j] = AT(p - r0, j);
#undef AT
    }
}

/* Tile q when it meets rows rlo .. rhi-1 and columns 0 .. chi-1 (its entries as
 * mpi_kstore_tile gives them), else NULL without converting it. */
static const double *tile_meeting(mpi_kstore *s, size_t q, size_t rlo, size_t rhi, size_t chi,
                                  mpi_tile *tile, size_t *r0, size_t *nr, size_t *c0,
                                  size_t *nc, size_t *ld)
{
    *tile = mpi_tiles_tile(s->t, s->ids[q]);
    mpi_tiles_extent(s->t, *tile, r0, nr, c0, nc);
    if (*r0 + *nr <= rlo || *r0 >= rhi || *c0 >= chi)
        return NULL;
    const double *T;
    mpi_kstore_tile(s, q, r0, nr, c0, nc, &T, ld);
    return T;
}

void mpi_kstore_lead(mpi_kstore *s, size_t k, double *Kk)
{
    memset(Kk, 0, k * k * sizeof *Kk);
    for (size_t q = 0; q < s->ntiles; q++) {
        size_t r0, nr, c0, nc, ld;
        mpi_tile tile;
        const double *T = tile_meeting(s, q, 0, k, k, &tile, &r0, &nr, &c0, &nc, &ld);
        if (!T)
            continue;
        /* the lower triangle and its mirror: exactly symmetric whatever the diagonal tiles'
         * upper halves hold */
        for (size_t j = 0; j < nc && c0 + j < k; j++)
            for (size_t i = tile.i == tile.j ? j : 0; i < nr && r0 + i < k; i++) {
                Kk[(r0 + i) * k + c0 + j] = T[i + j * ld];
                Kk[(c0 + j) * k + r0 + i] = T[i + j * ld];
            }
    }
}

void mpi_kstore_abs_colsums(mpi_kstore *s, double shift, double *sums)
{
    memset(sums, 0, s->rows * sizeof *sums);
    for (size_t q = 0; q < s->ntiles; q++) {
        size_t r0, nr, c0, nc, ld;
        const double *T;
        mpi_tile tile = mpi_kstore_tile(s, q, &r0, &nr, &c0, &nc, &T, &ld);
        const int diagonal = tile.i == tile.j;
        for (size_t j = 0; j < nc; j++)
            for (size_t i = diagonal ? j : 0; i < nr; i++) {
                double v = T[i + j * ld];
                if (diagonal && i == j) {
                    sums[c0 + j] += fabs(v + shift);
                    continue;
                }
                sums[c0 + j] += fabs(v);   /* column c0 + j, row r0 + i */
                sums[r0 + i] += fabs(v);   /* its mirror: column r0 + i */
            }
    }
}

void mpi_kstore_rows_t(mpi_kstore *s, size_t i0, size_t q, double *R)
{
    const size_t N = s->cols;
    memset(R, 0, N * q * sizeof *R);
    for (size_t u = 0; u < s->ntiles; u++) {
        size_t r0, nr, c0, nc, ld;
        mpi_tile tile;
        const double *T = tile_meeting(s, u, i0, i0 + q, N, &tile, &r0, &nr, &c0, &nc, &ld);
        if (!T)
            continue;
        for (size_t i = 0; i < nr; i++) {
            if (r0 + i < i0 || r0 + i >= i0 + q)
                continue;
            double *r = R + (r0 + i - i0) * N + c0;
            for (size_t j = 0; j < nc; j++)
                r[j] = T[i + j * ld];
        }
    }
}
