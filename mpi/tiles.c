/* Tiles of a kernel job over a block-cyclic process grid (mpi/tiles.h). */
#include "tiles.h"
#include "tpk/array.h"

#include <stdint.h>

int mpi_tiles_init(mpi_tiles *t, size_t n, size_t m, size_t b, size_t readouts, int nprow,
                   int npcol)
{
    if (n == 0 || b == 0 || readouts == 0 || nprow < 1 || npcol < 1)
        return -1;
    size_t tn = (n + b - 1) / b, tm = (m + b - 1) / b;
    if (tn > SIZE_MAX / (tn + 1) || (tm && tm > SIZE_MAX / tn))
        return -1;
    size_t ntrain = tn * (tn + 1) / 2;
    if (tm * tn > SIZE_MAX - ntrain)
        return -1;
    *t = (mpi_tiles){.n = n, .m = m, .b = b, .readouts = readouts, .tn = tn, .tm = tm,
                     .ntrain = ntrain, .ntiles = ntrain + tm * tn, .nprow = nprow,
                     .npcol = npcol};
    return 0;
}

size_t mpi_tiles_id(const mpi_tiles *t, mpi_tile tile)
{
    return tile.test ? t->ntrain + tile.i * t->tn + tile.j : tile.i * (tile.i + 1) / 2 + tile.j;
}

mpi_tile mpi_tiles_tile(const mpi_tiles *t, size_t id)
{
    if (id >= t->ntrain) {
        id -= t->ntrain;
        return (mpi_tile){1, id / t->tn, id % t->tn};
    }
    size_t i, j;
    tpk_lower_index(id, &i, &j);
    return (mpi_tile){0, i, j};
}

void mpi_tiles_extent(const mpi_tiles *t, mpi_tile tile, size_t *r0, size_t *nr, size_t *c0,
                      size_t *nc)
{
    size_t rows = tile.test ? t->m : t->n;
    *r0 = tile.i * t->b;
    *nr = rows - *r0 < t->b ? rows - *r0 : t->b;
    *c0 = tile.j * t->b;
    *nc = t->n - *c0 < t->b ? t->n - *c0 : t->b;
}

void mpi_tiles_owner(const mpi_tiles *t, mpi_tile tile, int *prow, int *pcol)
{
    *prow = (int)(tile.i % (size_t)t->nprow);
    *pcol = (int)(tile.j % (size_t)t->npcol);
}

size_t mpi_tiles_next(const mpi_tiles *t, int prow, int pcol, size_t id)
{
    for (; id < t->ntiles; id++) {
        int pr, pc;
        mpi_tiles_owner(t, mpi_tiles_tile(t, id), &pr, &pc);
        if (pr == prow && pc == pcol)
            return id;
    }
    return t->ntiles;
}

size_t mpi_tiles_count(const mpi_tiles *t, int prow, int pcol)
{
    size_t k = 0;
    for (size_t i = (size_t)prow; i < t->tn; i += (size_t)t->nprow) /* training: j <= i */
        for (size_t j = (size_t)pcol; j <= i; j += (size_t)t->npcol)
            k++;
    for (size_t i = (size_t)prow; i < t->tm; i += (size_t)t->nprow)
        for (size_t j = (size_t)pcol; j < t->tn; j += (size_t)t->npcol)
            k++;
    return k;
}
