/* gpregress-mpi's kernel tiles: computed by the library or read with parallel HDF5 (mpi/ksrc.h). */
#include "ksrc.h"

#include <hdf5.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { SRC_RBF, SRC_MLP, SRC_FILE };

struct mpi_ksrc {
    int kind;
    double theta[2];             /* SRC_RBF */
    tpk_mlp_params mlp;          /* SRC_MLP: with every layer's diagonal of the training and */
    tpk_phi_registry *reg;       /* test items, (depth + 1) × N and (depth + 1) × M, so that a */
    tpk_gauss_ws *ws;            /* tile costs its own entries only (tpk_mlp_kernel_cross) */
    double *q, *qt, *qtile;
    const tpk_array *X, *Xt;
    hid_t file, dk, dx, dd;      /* SRC_FILE: /kernel, /kernel_test_train, /kernel_test_diag */
    char ds[3][40];              /* ... their names, of base "kernel" or "ntk" */
    MPI_Comm comm;
    char *path;
    size_t m;
};

static mpi_ksrc *src_new(int kind, tpk_ctx *ctx)
{
    mpi_ksrc *s = calloc(1, sizeof *s);
    if (!s) {
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        return NULL;
    }
    s->kind = kind;
    s->file = s->dk = s->dx = s->dd = -1;
    return s;
}

mpi_ksrc *mpi_ksrc_rbf(const double theta[2], const tpk_array *X, const tpk_array *Xt,
                       tpk_ctx *ctx)
{
    mpi_ksrc *s = src_new(SRC_RBF, ctx);
    if (s) {
        memcpy(s->theta, theta, sizeof s->theta);
        s->X = X;
        s->Xt = Xt;
    }
    return s;
}

mpi_ksrc *mpi_ksrc_mlp(const char *phi, int quad_degree, int depth, double sigma_w2,
                       double sigma_b2, const tpk_array *X, const tpk_array *Xt, tpk_ctx *ctx)
{
    mpi_ksrc *s = src_new(SRC_MLP, ctx);
    if (!s)
        return NULL;
    s->X = X;
    s->Xt = Xt;
    const size_t L1 = (size_t)(depth > 0 ? depth : 0) + 1, n = X->dims[0], m = Xt ? Xt->dims[0] : 0;
    int st = TPK_OK;
    if (!(s->reg = tpk_phi_registry_alloc(ctx)) ||
        !(s->mlp.phi = tpk_phi_alloc(s->reg, phi, ctx)) ||
        !(s->ws = tpk_gauss_ws_alloc((size_t)quad_degree, ctx)))
        st = ctx->status ? ctx->status : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    s->mlp.depth = depth;
    s->mlp.sigma_w2 = sigma_w2;
    s->mlp.sigma_b2 = sigma_b2;
    if (!st && (!(s->q = malloc(L1 * n * sizeof *s->q)) ||
                !(s->qt = malloc((L1 * m + 1) * sizeof *s->qt)) ||
                !(s->qtile = malloc(2 * L1 * (n > m ? n : m) * sizeof *s->qtile))))
        st = TPK_ERROR(ctx, TPK_ENOMEM, "out of memory for the layer diagonals");
    if (!st)
        st = tpk_mlp_diag(&s->mlp, X, s->ws, s->q, NULL, ctx);
    if (!st && Xt)
        st = tpk_mlp_diag(&s->mlp, Xt, s->ws, s->qt, NULL, ctx);
    if (st) {
        mpi_ksrc_free(s);
        return NULL;
    }
    return s;
}

void mpi_ksrc_free(mpi_ksrc *s)
{
    if (!s)
        return;
    free(s->q);
    free(s->qt);
    free(s->qtile);
    tpk_gauss_ws_free(s->ws);
    tpk_phi_free((tpk_phi *)s->mlp.phi);
    tpk_phi_registry_free(s->reg);
    hid_t d[] = {s->dk, s->dx, s->dd};
    for (size_t i = 0; i < 3; i++)
        if (d[i] >= 0)
            H5Dclose(d[i]);
    if (s->file >= 0)
        H5Fclose(s->file);
    free(s->path);
    free(s);
}

/* The dimensions of a dataset (rank 1 or 2; *rank 0 when it is neither). */
static void dims_of(hid_t d, int *rank, hsize_t dims[2])
{
    hid_t sp = H5Dget_space(d);
    int r = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
    *rank = r == 1 || r == 2 ? r : 0;
    dims[0] = dims[1] = 1;
    if (*rank)
        H5Sget_simple_extent_dims(sp, dims, NULL);
    if (sp >= 0)
        H5Sclose(sp);
}

int mpi_ksrc_file(MPI_Comm comm, const char *path, const char *base, size_t *n, size_t *m,
                  mpi_ksrc **out, tpk_ctx *ctx)
{
    *out = NULL;
    mpi_ksrc *s = src_new(SRC_FILE, ctx);
    if (!s || !(s->path = strdup(path))) {
        mpi_ksrc_free(s);
        return TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
    }
    snprintf(s->ds[0], sizeof s->ds[0], "/%s", base);
    snprintf(s->ds[1], sizeof s->ds[1], "/%s_test_train", base);
    snprintf(s->ds[2], sizeof s->ds[2], "/%s_test_diag", base);
    const char *D0 = s->ds[0], *D1 = s->ds[1], *D2 = s->ds[2];
    s->comm = comm;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* the messages go through tpk_ctx */
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl >= 0 && H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL) >= 0)
        s->file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    if (fapl >= 0)
        H5Pclose(fapl);
    int st = TPK_OK;
    if (s->file < 0)
        st = TPK_ERROR(ctx, TPK_EIO, "%s: cannot open it as an HDF5 file (parallel HDF5)", path);
    if (!st && H5Lexists(s->file, D0, H5P_DEFAULT) <= 0)
        st = TPK_ERROR(ctx, TPK_EFORMAT, "%s has no %s dataset", path, D0);
    if (!st && (s->dk = H5Dopen2(s->file, D0, H5P_DEFAULT)) < 0)
        st = TPK_ERROR(ctx, TPK_EIO, "%s: cannot open %s", path, D0);
    int rk = 0, rx = 0, rd = 0;
    hsize_t dk[2], dx[2] = {0, 0}, dd[2] = {0, 0};
    if (!st) {
        dims_of(s->dk, &rk, dk);
        if (rk != 2 || dk[0] != dk[1] || dk[0] == 0)
            st = TPK_ERROR(ctx, TPK_EINVAL, "%s: %s must be N×N (got %llu×%llu)", path, D0,
                           (unsigned long long)dk[0], (unsigned long long)dk[1]);
    }
    if (!st && H5Lexists(s->file, D1, H5P_DEFAULT) > 0) {
        if ((s->dx = H5Dopen2(s->file, D1, H5P_DEFAULT)) < 0 ||
            H5Lexists(s->file, D2, H5P_DEFAULT) <= 0 ||
            (s->dd = H5Dopen2(s->file, D2, H5P_DEFAULT)) < 0)
            st = TPK_ERROR(ctx, TPK_EINVAL, "%s: %s needs %s", path, D1, D2);
        if (!st) {
            dims_of(s->dx, &rx, dx);
            dims_of(s->dd, &rd, dd);
            if (rx != 2 || dx[1] != dk[0] || dx[0] == 0 || rd == 0 || dd[0] * dd[1] != dx[0])
                st = TPK_ERROR(ctx, TPK_EINVAL, "%s: %s is %llu×%llu and %s has %llu entries, "
                               "but %s is %llu×%llu", path, D1, (unsigned long long)dx[0],
                               (unsigned long long)dx[1], D2, (unsigned long long)(dd[0] * dd[1]),
                               D0, (unsigned long long)dk[0], (unsigned long long)dk[0]);
        }
    }
    if (st) {
        mpi_ksrc_free(s);
        return st;
    }
    *n = dk[0];
    *m = s->m = s->dx >= 0 ? dx[0] : 0;
    *out = s;
    return TPK_OK;
}

/* ---- filling the stores ---------------------------------------------------------------------- */

/* A view of items i0 .. i0+k-1 of A (no copy, not to be freed). */
static tpk_array items(const tpk_array *A, size_t i0, size_t k)
{
    tpk_array v = *A;
    v.data = A->data + i0 * tpk_array_item_size(A);
    v.dims[0] = k;
    memset(&v.alloc, 0, sizeof v.alloc);
    return v;
}

/* Rows [i0, i0 + k) of every layer of q (L1 rows of n) into dst (L1 rows of k). */
static void layer_rows(const double *q, size_t n, size_t L1, size_t i0, size_t k, double *dst)
{
    for (size_t l = 0; l < L1; l++)
        memcpy(dst + l * k, q + l * n + i0, k * sizeof *dst);
}

/* One tile of the MLP kernel: a diagonal tile is the kernel of its items (tpk_mlp_kernel, as
 * gpregress computes the whole one); any other is the cross block alone. */
static int mlp_tile(mpi_ksrc *s, mpi_tile tile, size_t r0, size_t nr, size_t c0, size_t nc,
                    double *T, double *dg, double *err, tpk_ctx *ctx)
{
    const size_t L1 = (size_t)s->mlp.depth + 1, n = s->X->dims[0];
    tpk_array Xc = items(s->X, c0, nc);
    if (!tile.test && tile.i == tile.j) {
        tpk_array Tb = {.ndim = 2, .dims = {nc, nc}, .data = T};
        return tpk_mlp_kernel(&s->mlp, &Xc, NULL, s->ws, &Tb, NULL, NULL, err, ctx);
    }
    const tpk_array *R = tile.test ? s->Xt : s->X;
    const double *qR = tile.test ? s->qt : s->q;
    tpk_array Xr = items(R, r0, nr);
    double *qr = s->qtile, *qc = s->qtile + L1 * nr;
    layer_rows(qR, R->dims[0], L1, r0, nr, qr);
    layer_rows(s->q, n, L1, c0, nc, qc);
    int st = tpk_mlp_kernel_cross(&s->mlp, &Xr, qr, &Xc, qc, s->ws, T, err, ctx);
    if (!st && dg)
        memcpy(dg, qr + (L1 - 1) * nr, nr * sizeof *dg);
    return st;
}

/* The tiles of one store by computation: this rank's own, no communication. */
static int compute_store(mpi_ksrc *s, mpi_kstore *S, double *T, double *kdiag, double *dg,
                         double *err, cli_progress *prog, size_t *done, tpk_ctx *ctx)
{
    for (size_t k = 0; k < S->ntiles; k++) {
        mpi_tile tile = mpi_tiles_tile(S->t, S->ids[k]);
        size_t r0, nr, c0, nc;
        mpi_tiles_extent(S->t, tile, &r0, &nr, &c0, &nc);
        int want_diag = tile.test && tile.j == 0;
        double e = 0;
        int st;
        if (s->kind == SRC_MLP) {
            st = mlp_tile(s, tile, r0, nr, c0, nc, T, want_diag ? dg : NULL, &e, ctx);
        } else {
            tpk_array Xc = items(s->X, c0, nc), Xr = items(tile.test ? s->Xt : s->X, r0, nr);
            tpk_array Tb = {.ndim = 2, .dims = {nr, nc}, .data = T};
            tpk_array db = {.ndim = 1, .dims = {nr}, .data = dg};
            int diagonal = !tile.test && tile.i == tile.j;
            st = diagonal ? tpk_gp_rbf_kernel(s->theta, &Xc, NULL, &Tb, NULL, NULL, ctx)
                          : tpk_gp_rbf_kernel(s->theta, &Xc, &Xr, NULL, &Tb, &db, ctx);
        }
        if (!st)
            st = mpi_kstore_put(S, k, T, nc, tile.test ? "/kernel_test_train" : "/kernel", ctx);
        if (st)
            return st;
        if (want_diag)
            memcpy(kdiag + r0, dg, nr * sizeof *dg);
        if (err && e > *err)
            *err = e;
        if (prog)
            cli_progress_update(prog, ++*done);
    }
    return TPK_OK;
}

/* The tiles of one store from the file, in collective rounds: in round q every rank reads its
 * q-th tile (or nothing), so that the reads can be collective (one MPI-IO call for all ranks).
 * A rank that failed goes on taking part, reading nothing. */
static int read_store(mpi_ksrc *s, mpi_kstore *S, hid_t dset, double *T, tpk_ctx *ctx)
{
    unsigned long long mine = S->ntiles, rounds = 0;
    MPI_Allreduce(&mine, &rounds, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, s->comm);
    hid_t dxpl = H5Pcreate(H5P_DATASET_XFER), fs = H5Dget_space(dset);
    int st = TPK_OK;
    if (dxpl < 0 || fs < 0 || H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE) < 0)
        st = TPK_ERROR(ctx, TPK_EIO, "%s: cannot set up collective reads", s->path);
    const char *name = S->test ? s->ds[1] : s->ds[0];
    for (unsigned long long q = 0; q < rounds; q++) {
        size_t r0 = 0, nr = 1, c0 = 0, nc = 1;
        int take = !st && q < S->ntiles;
        if (take)
            mpi_tiles_extent(S->t, mpi_tiles_tile(S->t, S->ids[q]), &r0, &nr, &c0, &nc);
        hsize_t start[2] = {r0, c0}, count[2] = {nr, nc};
        hid_t ms = H5Screate_simple(2, count, NULL);
        if (take)
            H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
        else {
            H5Sselect_none(fs);
            H5Sselect_none(ms);
        }
        herr_t rc = ms >= 0 && fs >= 0 && dxpl >= 0
                        ? H5Dread(dset, H5T_NATIVE_DOUBLE, ms, fs, dxpl, T)
                        : -1;
        if (ms >= 0)
            H5Sclose(ms);
        if (!st && rc < 0)
            st = TPK_ERROR(ctx, TPK_EIO, "%s: reading %s rows %zu..%zu, columns %zu..%zu "
                           "failed", s->path, name, r0, r0 + nr - 1, c0, c0 + nc - 1);
        if (take && !st)
            st = mpi_kstore_put(S, q, T, nc, name, ctx);
    }
    if (fs >= 0)
        H5Sclose(fs);
    if (dxpl >= 0)
        H5Pclose(dxpl);
    return st;
}

/* Rank 0 reads /kernel_test_diag (or /ntk_test_diag) whole (every rank takes part in the collective read). */
static int read_diag(mpi_ksrc *s, double *kdiag, tpk_ctx *ctx)
{
    int rank;
    MPI_Comm_rank(s->comm, &rank);
    hid_t dxpl = H5Pcreate(H5P_DATASET_XFER), fs = H5Dget_space(s->dd);
    hsize_t cnt = rank == 0 ? s->m : 1;
    hid_t ms = H5Screate_simple(1, &cnt, NULL);
    if (rank != 0) {
        H5Sselect_none(fs);
        H5Sselect_none(ms);
    }
    herr_t rc = dxpl >= 0 && fs >= 0 && ms >= 0 &&
                H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE) >= 0
                    ? H5Dread(s->dd, H5T_NATIVE_DOUBLE, ms, fs, dxpl, kdiag)
                    : -1;
    if (ms >= 0)
        H5Sclose(ms);
    if (fs >= 0)
        H5Sclose(fs);
    if (dxpl >= 0)
        H5Pclose(dxpl);
    if (rc < 0)
        return TPK_ERROR(ctx, TPK_EIO, "%s: cannot read %s", s->path, s->ds[2]);
    for (size_t i = 0; rank == 0 && i < s->m; i++)
        if (!isfinite(kdiag[i]))
            return TPK_ERROR(ctx, TPK_EDOM, "%s: non-finite entry %g of %s at [%zu]", s->path,
                             kdiag[i], s->ds[2], i);
    return TPK_OK;
}

int mpi_ksrc_fill(mpi_ksrc *s, mpi_kstore *K, mpi_kstore *Kx, double *kdiag, double *err,
                  cli_progress *prog, tpk_ctx *ctx)
{
    const size_t b = K->t->b;
    double *T = malloc(b * b * sizeof *T), *dg = malloc(b * sizeof *dg);
    int st = T && dg ? TPK_OK : TPK_ERROR(ctx, TPK_ENOMEM, "out of memory for a kernel tile");
    if (Kx)
        memset(kdiag, 0, Kx->rows * sizeof *kdiag);
    if (err)
        *err = 0;
    if (s->kind == SRC_FILE) {
        /* collective: every rank goes through every read, whatever failed before */
        int st2 = read_store(s, K, s->dk, T ? T : dg, st ? &(tpk_ctx){0} : ctx);
        if (!st)
            st = st2;
        if (Kx && s->dx >= 0) {
            st2 = read_store(s, Kx, s->dx, T ? T : dg, st ? &(tpk_ctx){0} : ctx);
            if (!st)
                st = st2;
            st2 = read_diag(s, kdiag, st ? &(tpk_ctx){0} : ctx);
            if (!st)
                st = st2;
        }
    } else if (!st) {
        size_t done = 0;
        if (prog)
            cli_progress_start(prog, prog->prog, "kernel tiles (rank 0's)",
                               K->ntiles + (Kx ? Kx->ntiles : 0), prog->on);
        st = compute_store(s, K, T, kdiag, dg, err, prog, &done, ctx);
        if (!st && Kx)
            st = compute_store(s, Kx, T, kdiag, dg, err, prog, &done, ctx);
        if (prog)
            cli_progress_end(prog, st == TPK_OK);
    }
    free(T);
    free(dg);
    return st;
}
