/* The BLACS process grid of the MPI programs (mpi/grid.h). */
#include "grid.h"

#include "../tools/cli.h"

#include <mpi.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* BLACS's C interface (ScaLAPACK ships no header for it). */
void Cblacs_pinfo(int *mypnum, int *nprocs);
void Cblacs_get(int icontxt, int what, int *val);
void Cblacs_gridinit(int *icontxt, char *order, int nprow, int npcol);
void Cblacs_gridinfo(int icontxt, int *nprow, int *npcol, int *myrow, int *mycol);
void Cblacs_gridexit(int icontxt);

int mpi_grid_parse(const char *s, int *p, int *q, tpk_ctx *ctx)
{
    if (strcmp(s, "auto") == 0) {
        *p = *q = 0;
        return TPK_OK;
    }
    char *x, *end;
    errno = 0;
    long a = strtol(s, &x, 10), b = 0;
    if (x != s && (*x == 'x' || *x == 'X'))
        b = strtol(x + 1, &end, 10);
    if (x == s || (*x != 'x' && *x != 'X') || end == x + 1 || *end != '\0' || errno || a < 1 ||
        b < 1 || a > 1 << 20 || b > 1 << 20)
        return TPK_ERROR(ctx, TPK_EINVAL, "--grid: '%s' is not PxQ (process rows x columns, "
                         "e.g. 2x4) or auto", s);
    *p = (int)a;
    *q = (int)b;
    return TPK_OK;
}

int mpi_layout_option(int which, const char *arg, size_t tile_max, mpi_layout *l, tpk_ctx *ctx)
{
    switch (which) {
    case 0: return cli_parse_size("tile", arg, 1, tile_max, &l->tile, ctx);
    case 1: return mpi_grid_parse(arg, &l->nprow, &l->npcol, ctx);
    case 2:
        if (strcmp(arg, "float64") != 0 && strcmp(arg, "float32") != 0)
            return TPK_ERROR(ctx, TPK_EINVAL, "--dtype must be float64 or float32 (got '%s')", arg);
        l->f32 = strcmp(arg, "float32") == 0;
        return TPK_OK;
    default: return TPK_ERROR(ctx, TPK_EINVAL, "unknown layout option");
    }
}

int mpi_grid_init(mpi_grid *g, int nprow, int npcol, tpk_ctx *ctx)
{
    memset(g, 0, sizeof *g);
    g->ctxt = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &g->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g->size);
    if (nprow == 0 && npcol == 0) {
        nprow = 1;
        for (int p = 1; p * p <= g->size; p++)
            if (g->size % p == 0)
                nprow = p;
        npcol = g->size / nprow;
    }
    if ((long)nprow * npcol != g->size)
        return TPK_ERROR(ctx, TPK_EINVAL, "--grid=%dx%d has %ld processes but %d ranks run: the "
                         "grid must use every rank", nprow, npcol, (long)nprow * npcol, g->size);
    int me, np;
    Cblacs_pinfo(&me, &np);
    Cblacs_get(-1, 0, &g->ctxt);
    Cblacs_gridinit(&g->ctxt, "Row", nprow, npcol);
    Cblacs_gridinfo(g->ctxt, &g->nprow, &g->npcol, &g->myrow, &g->mycol);
    if (g->myrow < 0 || g->mycol < 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "rank %d has no place in the %dx%d BLACS grid", g->rank,
                         nprow, npcol);
    return TPK_OK;
}

void mpi_grid_free(mpi_grid *g)
{
    if (g->ctxt >= 0 && g->myrow >= 0)
        Cblacs_gridexit(g->ctxt);
    g->ctxt = -1;
}
