/* gpkernel-mpi's checkpoint file (mpi/ckpt.h): parallel HDF5, one chunk per tile, done bytes. */
#include "ckpt.h"

#include <hdf5.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

struct mpi_ckpt {
    const mpi_tiles *t;
    int f32;
    char ds[3][32];                        /* /kernel, /kernel_test_train, /kernel_test_diag (or
                                            * the NTK's) */
    hid_t file, kernel, cross, diag, done; /* cross, diag: -1 without a test set */
    unsigned char *bits;                   /* done bytes as known here */
    int fd;                                /* the same file through POSIX, for fdatasync */
    char *path;
    void *buf, *tbuf;                      /* one tile in the storage type, and its transpose */
};

/* HDF5 prints its error stack by default; the messages here go through tpk_ctx. */
static void quiet(void)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

static hid_t file_access(MPI_Comm comm)
{
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl >= 0 && H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL) < 0) {
        H5Pclose(fapl);
        return -1;
    }
    return fapl;
}

static void ckpt_free(mpi_ckpt *c)
{
    if (!c)
        return;
    hid_t ids[] = {c->kernel, c->cross, c->diag, c->done};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if (ids[i] >= 0)
            H5Dclose(ids[i]);
    if (c->file >= 0)
        H5Fclose(c->file);
    if (c->fd >= 0)
        close(c->fd);
    free(c->bits);
    free(c->path);
    free(c->buf);
    free(c->tbuf);
    free(c);
}

static mpi_ckpt *ckpt_new(const mpi_ckpt_spec *s, tpk_ctx *ctx)
{
    mpi_ckpt *c = calloc(1, sizeof *c);
    size_t side = s->t->b * s->t->readouts, esz = s->f32 ? sizeof(float) : sizeof(double);
    if (c) {
        c->file = c->kernel = c->cross = c->diag = c->done = -1;
        c->fd = -1;
        c->t = s->t;
        c->f32 = s->f32;
        const char *base = s->name ? s->name : "kernel";
        snprintf(c->ds[0], sizeof c->ds[0], "/%s", base);
        snprintf(c->ds[1], sizeof c->ds[1], "/%s_test_train", base);
        snprintf(c->ds[2], sizeof c->ds[2], "/%s_test_diag", base);
        c->bits = calloc(s->t->ntiles, 1);
        c->path = strdup(s->path);
        c->buf = malloc(side * side * esz);
        c->tbuf = malloc(side * side * esz);
    }
    if (!c || !c->bits || !c->path || !c->buf || !c->tbuf) {
        ckpt_free(c);
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory for the checkpoint's tile buffers");
        return NULL;
    }
    return c;
}

/* A chunked dataset of the storage type, every chunk allocated now (parallel HDF5 writes raw
 * data independently only into allocated space) and never filled: a tile is written whole
 * before it counts. */
static hid_t tiled_dataset(hid_t file, const char *name, int rank, const hsize_t *dims,
                           const hsize_t *chunk, int f32)
{
    hid_t space = H5Screate_simple(rank, dims, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hid_t ds = -1;
    if (space >= 0 && dcpl >= 0 && H5Pset_chunk(dcpl, rank, chunk) >= 0 &&
        H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY) >= 0 &&
        H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) >= 0)
        ds = H5Dcreate2(file, name, f32 ? H5T_IEEE_F32LE : H5T_IEEE_F64LE, space, H5P_DEFAULT,
                        dcpl, H5P_DEFAULT);
    if (dcpl >= 0)
        H5Pclose(dcpl);
    if (space >= 0)
        H5Sclose(space);
    return ds;
}

static int attr_str(hid_t obj, const char *key, const char *val)
{
    hid_t type = H5Tcopy(H5T_C_S1), space = H5Screate(H5S_SCALAR), a = -1;
    int ok = type >= 0 && space >= 0 && H5Tset_size(type, H5T_VARIABLE) >= 0 &&
             H5Tset_cset(type, H5T_CSET_UTF8) >= 0 &&
             (a = H5Acreate2(obj, key, type, space, H5P_DEFAULT, H5P_DEFAULT)) >= 0 &&
             H5Awrite(a, type, &val) >= 0;
    if (a >= 0)
        H5Aclose(a);
    if (space >= 0)
        H5Sclose(space);
    if (type >= 0)
        H5Tclose(type);
    return ok ? 0 : -1;
}

static int attr_int(hid_t obj, const char *key, long long v)
{
    hid_t space = H5Screate(H5S_SCALAR), a = -1;
    int ok = space >= 0 &&
             (a = H5Acreate2(obj, key, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT)) >= 0 &&
             H5Awrite(a, H5T_NATIVE_LLONG, &v) >= 0;
    if (a >= 0)
        H5Aclose(a);
    if (space >= 0)
        H5Sclose(space);
    return ok ? 0 : -1;
}

/* The variable-length string attribute key of obj (malloc'd), NULL if there is none. */
static char *attr_read_str(hid_t obj, const char *key)
{
    if (H5Aexists(obj, key) <= 0)
        return NULL;
    hid_t a = H5Aopen(obj, key, H5P_DEFAULT), type = H5Tcopy(H5T_C_S1);
    char *v = NULL, *copy = NULL;
    if (a >= 0 && type >= 0 && H5Tset_size(type, H5T_VARIABLE) >= 0 &&
        H5Tset_cset(type, H5T_CSET_UTF8) >= 0 && H5Aread(a, type, &v) >= 0 && v) {
        copy = strdup(v);
        H5free_memory(v);
    }
    if (type >= 0)
        H5Tclose(type);
    if (a >= 0)
        H5Aclose(a);
    return copy;
}

/* Open the same file through POSIX for fdatasync (MPI_File_sync would be collective), and hold
 * a shared lock on it while this process may write: mpi_ckpt_claim waits for every one. */
static int open_fd(mpi_ckpt *c, tpk_ctx *ctx)
{
    c->fd = open(c->path, O_RDWR);
    if (c->fd < 0)
        return TPK_ERROR(ctx, TPK_EIO, "%s: cannot open for syncing: %s", c->path, strerror(errno));
    if (flock(c->fd, LOCK_SH | LOCK_NB) != 0)
        return TPK_ERROR(ctx, TPK_EIO, "%s: cannot lock the checkpoint: %s", c->path,
                         strerror(errno));
    return TPK_OK;
}

int mpi_ckpt_claim(const char *path, double wait_s, FILE *note, tpk_ctx *ctx)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return errno == ENOENT ? TPK_OK
                               : TPK_ERROR(ctx, TPK_EIO, "%s: %s", path, strerror(errno));
    struct timespec t0, now, nap = {0, 100000000L};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int noted = 0;
    for (;;) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
            flock(fd, LOCK_UN);
            close(fd);
            return TPK_OK;
        }
        if (errno != EWOULDBLOCK) {
            int e = errno;
            close(fd);
            return TPK_ERROR(ctx, TPK_EIO, "%s: cannot lock: %s", path, strerror(e));
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        double dt = (double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec);
        if (dt > wait_s) {
            close(fd);
            return TPK_ERROR(ctx, TPK_EIO, "%s: still held by processes of another run after "
                             "%.0f s (a job writing it, or ranks of a killed one): end them first",
                             path, wait_s);
        }
        if (note && !noted && dt > 1.0) {
            fprintf(note, "gpkernel-mpi: waiting for the processes that still hold %s\n", path);
            noted = 1;
        }
        nanosleep(&nap, NULL);
    }
}

int mpi_ckpt_create(MPI_Comm comm, const mpi_ckpt_spec *s, mpi_ckpt **out, tpk_ctx *ctx)
{
    quiet();
    *out = NULL;
    mpi_ckpt *c = ckpt_new(s, ctx);
    if (!c)
        return ctx->status;
    const mpi_tiles *t = s->t;
    const hsize_t R = t->readouts, side = t->b * R, n = t->n * R, m = t->m * R;
    hid_t fapl = file_access(comm), g = -1;
    if (fapl >= 0) {
        c->file = H5Fcreate(s->path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
        H5Pclose(fapl);
    }
    if (c->file < 0) {
        ckpt_free(c);
        return TPK_ERROR(ctx, TPK_EIO, "%s: cannot create the checkpoint (parallel HDF5)", s->path);
    }
    /* chunks of one tile, clipped to the kernel (HDF5 wants chunks no larger than fixed dims) */
    hsize_t kd[2] = {n, n}, kc[2] = {side < n ? side : n, side < n ? side : n};
    int ok = (c->kernel = tiled_dataset(c->file, c->ds[0], 2, kd, kc, s->f32)) >= 0;
    if (ok && m) {
        hsize_t xd[2] = {m, n}, xc[2] = {side < m ? side : m, kc[1]}, dd[1] = {m}, dc[1] = {xc[0]};
        ok = (c->cross = tiled_dataset(c->file, c->ds[1], 2, xd, xc, s->f32)) >= 0 &&
             (c->diag = tiled_dataset(c->file, c->ds[2], 1, dd, dc, s->f32)) >= 0;
    }
    if (ok) {
        /* the done bytes: contiguous, zero-filled when allocated (now) */
        hsize_t nd[1] = {t->ntiles};
        unsigned char zero = 0;
        hid_t space = H5Screate_simple(1, nd, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
        ok = space >= 0 && dcpl >= 0 &&
             H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY) >= 0 &&
             H5Pset_fill_value(dcpl, H5T_NATIVE_UCHAR, &zero) >= 0 &&
             H5Pset_fill_time(dcpl, H5D_FILL_TIME_ALLOC) >= 0 &&
             (g = H5Gcreate2(c->file, MPI_CKPT_GROUP, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)) >= 0 &&
             (c->done = H5Dcreate2(g, "done", H5T_STD_U8LE, space, H5P_DEFAULT, dcpl,
                                   H5P_DEFAULT)) >= 0 &&
             attr_str(g, "config", s->config) == 0 &&
             attr_int(g, "tile_items", (long long)t->b) == 0 &&
             attr_int(g, "tiles", (long long)t->ntiles) == 0;
        if (dcpl >= 0)
            H5Pclose(dcpl);
        if (space >= 0)
            H5Sclose(space);
    }
    if (g >= 0)
        H5Gclose(g);
    /* the metadata on disk before any tile: a checkpoint killed later is readable */
    if (ok)
        ok = H5Fflush(c->file, H5F_SCOPE_GLOBAL) >= 0;
    int st = ok ? open_fd(c, ctx)
                : TPK_ERROR(ctx, TPK_EIO, "%s: cannot lay out the checkpoint's datasets", s->path);
    if (!st && fdatasync(c->fd) != 0)
        st = TPK_ERROR(ctx, TPK_EIO, "%s: fdatasync failed: %s", s->path, strerror(errno));
    if (st) {
        ckpt_free(c);
        return st;
    }
    *out = c;
    return TPK_OK;
}

/* The first line where two configs differ, as "'A'" and "'B'" into a, b. */
static void first_difference(const char *x, const char *y, char *a, char *b, size_t cap)
{
    while (*x && *y) {
        size_t lx = strcspn(x, "\n"), ly = strcspn(y, "\n");
        if (lx != ly || strncmp(x, y, lx) != 0)
            break;
        x += lx + (x[lx] == '\n');
        y += ly + (y[ly] == '\n');
    }
    snprintf(a, cap, "%.*s", (int)strcspn(x, "\n"), x);
    snprintf(b, cap, "%.*s", (int)strcspn(y, "\n"), y);
}

int mpi_ckpt_open(MPI_Comm comm, const mpi_ckpt_spec *s, mpi_ckpt **out, tpk_ctx *ctx)
{
    quiet();
    *out = NULL;
    mpi_ckpt *c = ckpt_new(s, ctx);
    if (!c)
        return ctx->status;
    hid_t fapl = file_access(comm), g = -1;
    if (fapl >= 0) {
        c->file = H5Fopen(s->path, H5F_ACC_RDWR, fapl);
        H5Pclose(fapl);
    }
    if (c->file < 0 || H5Lexists(c->file, MPI_CKPT_GROUP, H5P_DEFAULT) <= 0 ||
        (g = H5Gopen2(c->file, MPI_CKPT_GROUP, H5P_DEFAULT)) < 0) {
        ckpt_free(c);
        return TPK_ERROR(ctx, TPK_EFORMAT, "%s: not a readable checkpoint of gpkernel-mpi",
                         s->path);
    }
    char *config = attr_read_str(g, "config");
    int st = TPK_OK;
    if (!config) {
        st = TPK_ERROR(ctx, TPK_EFORMAT, "%s: the checkpoint has no config", s->path);
    } else if (strcmp(config, s->config) != 0) {
        char a[256], b[256];
        first_difference(config, s->config, a, b, sizeof a);
        st = TPK_ERROR(ctx, TPK_EINVAL,
                       "%s: the checkpoint was made by another job (it has '%s' where this one "
                       "has '%s'): resume with the same options and inputs, or remove it to "
                       "start again", s->path, a, b);
    }
    free(config);
    if (!st) {
        const mpi_tiles *t = s->t;
        c->kernel = H5Dopen2(c->file, c->ds[0], H5P_DEFAULT);
        if (t->m) {
            c->cross = H5Dopen2(c->file, c->ds[1], H5P_DEFAULT);
            c->diag = H5Dopen2(c->file, c->ds[2], H5P_DEFAULT);
        }
        c->done = H5Dopen2(g, "done", H5P_DEFAULT);
        hid_t space = c->done >= 0 ? H5Dget_space(c->done) : -1;
        hssize_t np = space >= 0 ? H5Sget_simple_extent_npoints(space) : -1;
        if (space >= 0)
            H5Sclose(space);
        if (c->kernel < 0 || (t->m && (c->cross < 0 || c->diag < 0)) || c->done < 0 ||
            np != (hssize_t)t->ntiles ||
            H5Dread(c->done, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, c->bits) < 0)
            st = TPK_ERROR(ctx, TPK_EFORMAT, "%s: the checkpoint's datasets are not those of "
                           "this job", s->path);
    }
    H5Gclose(g);
    if (!st)
        st = open_fd(c, ctx);
    if (st) {
        ckpt_free(c);
        return st;
    }
    *out = c;
    return TPK_OK;
}

int mpi_ckpt_done(const mpi_ckpt *c, size_t id)
{
    return c->bits[id] != 0;
}

size_t mpi_ckpt_done_count(const mpi_ckpt *c)
{
    size_t k = 0;
    for (size_t i = 0; i < c->t->ntiles; i++)
        k += c->bits[i] != 0;
    return k;
}

/* rows × cols of src (stride ld) into dst in the storage type, transposed if asked. */
static void store(const mpi_ckpt *c, const double *src, size_t ld, size_t rows, size_t cols,
                  int transpose, void *dst)
{
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++) {
            size_t k = transpose ? j * rows + i : i * cols + j;
            if (c->f32)
                ((float *)dst)[k] = (float)src[i * ld + j];
            else
                ((double *)dst)[k] = src[i * ld + j];
        }
}

/* rank-dimensional block at start of size count from buf (packed, the storage type). */
static int write_block(const mpi_ckpt *c, hid_t ds, int rank, const hsize_t *start,
                       const hsize_t *count, const void *buf)
{
    hid_t fs = H5Dget_space(ds), ms = H5Screate_simple(rank, count, NULL);
    int ok = fs >= 0 && ms >= 0 &&
             H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL) >= 0 &&
             H5Dwrite(ds, c->f32 ? H5T_NATIVE_FLOAT : H5T_NATIVE_DOUBLE, ms, fs, H5P_DEFAULT,
                      buf) >= 0;
    if (ms >= 0)
        H5Sclose(ms);
    if (fs >= 0)
        H5Sclose(fs);
    return ok ? 0 : -1;
}

/* The first non-finite entry of rows × cols (stride ld), as its index; -1 if none. */
static long long first_nonfinite(const double *v, size_t ld, size_t rows, size_t cols)
{
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++)
            if (!isfinite(v[i * ld + j]))
                return (long long)(i * cols + j);
    return -1;
}

int mpi_ckpt_write_tile(mpi_ckpt *c, mpi_tile tile, const double *K, size_t ld,
                        const double *diag, tpk_ctx *ctx)
{
    const mpi_tiles *t = c->t;
    const size_t R = t->readouts;
    size_t r0, nr, c0, nc;
    mpi_tiles_extent(t, tile, &r0, &nr, &c0, &nc);
    const size_t rows = nr * R, cols = nc * R, row0 = r0 * R, col0 = c0 * R;
    const char *name = tile.test ? c->ds[1] : c->ds[0];
    long long bad = first_nonfinite(K, ld, rows, cols);
    if (bad >= 0)
        return TPK_ERROR(ctx, TPK_EDOM, "%s: non-finite entry (%zu, %zu): a failed computation, "
                         "not written", name, row0 + (size_t)bad / cols, col0 + (size_t)bad % cols);
    if (diag && (bad = first_nonfinite(diag, 1, rows, 1)) >= 0)
        return TPK_ERROR(ctx, TPK_EDOM, "%s: non-finite entry (%zu): a failed computation, not "
                         "written", c->ds[2], row0 + (size_t)bad);
    hsize_t start[2] = {row0, col0}, count[2] = {rows, cols};
    store(c, K, ld, rows, cols, 0, c->buf);
    int ok = write_block(c, tile.test ? c->cross : c->kernel, 2, start, count, c->buf) == 0;
    if (ok && !tile.test && tile.i != tile.j) { /* the mirror above the diagonal */
        hsize_t ts[2] = {col0, row0}, tc[2] = {cols, rows};
        store(c, K, ld, rows, cols, 1, c->tbuf);
        ok = write_block(c, c->kernel, 2, ts, tc, c->tbuf) == 0;
    }
    if (ok && diag) {
        hsize_t ds[1] = {row0}, dc[1] = {rows};
        store(c, diag, 1, rows, 1, 0, c->buf);
        ok = write_block(c, c->diag, 1, ds, dc, c->buf) == 0;
    }
    if (!ok)
        return TPK_ERROR(ctx, TPK_EIO, "%s: cannot write tile (%zu, %zu) of %s", c->path, tile.i,
                         tile.j, name);
    /* the tile's bytes on disk before its done byte says so */
    if (fdatasync(c->fd) != 0)
        return TPK_ERROR(ctx, TPK_EIO, "%s: fdatasync failed: %s", c->path, strerror(errno));
    size_t id = mpi_tiles_id(t, tile);
    unsigned char one = 1;
    hsize_t bs[1] = {id}, bc[1] = {1};
    hid_t fs = H5Dget_space(c->done), ms = H5Screate_simple(1, bc, NULL);
    ok = fs >= 0 && ms >= 0 && H5Sselect_hyperslab(fs, H5S_SELECT_SET, bs, NULL, bc, NULL) >= 0 &&
         H5Dwrite(c->done, H5T_NATIVE_UCHAR, ms, fs, H5P_DEFAULT, &one) >= 0;
    if (ms >= 0)
        H5Sclose(ms);
    if (fs >= 0)
        H5Sclose(fs);
    if (!ok)
        return TPK_ERROR(ctx, TPK_EIO, "%s: cannot mark tile %zu done", c->path, id);
    c->bits[id] = 1;
    return TPK_OK;
}

int mpi_ckpt_close(mpi_ckpt *c, tpk_ctx *ctx)
{
    if (!c)
        return TPK_OK;
    hid_t ids[] = {c->kernel, c->cross, c->diag, c->done};
    int ok = 1;
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if (ids[i] >= 0)
            ok &= H5Dclose(ids[i]) >= 0;
    c->kernel = c->cross = c->diag = c->done = -1;
    ok &= H5Fclose(c->file) >= 0;
    c->file = -1;
    ok &= fdatasync(c->fd) == 0;
    char path[4096];
    snprintf(path, sizeof path, "%s", c->path);
    ckpt_free(c);
    return ok ? TPK_OK : TPK_ERROR(ctx, TPK_EIO, "%s: closing the checkpoint failed", path);
}
