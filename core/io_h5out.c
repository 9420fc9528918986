/* Atomic, self-describing HDF5 output: write to a hidden temp file, fsync, rename into place. */
#include "io_impl.h"
#include "signal_impl.h"
#include "tpk/alloc.h"
#include "tpk/io.h"

#include <hdf5_hl.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef TPK_VERSION
#define TPK_VERSION "unknown"
#endif

/* How many temp names to try before giving up: each name carries 64 random-ish bits, so a
 * second try is already unlikely; the loop only guards against a stale file by bad luck. */
#define TMP_TRIES 16


/* ---- temp files and signals (issue 18) ------------------------------------------------------
 * A SIGINT, SIGTERM or SIGHUP while a temp file exists must not leave it behind. The live temp
 * names sit in a small process-wide table that the handler walks with unlink() only (async-signal-
 * safe); then it says why on stderr and exits 128 + signal, as a shell reports it. The table
 * and the handler are the one piece of process state here (style.md §6 allows none else): a
 * signal cannot be given a context. The handler is installed only where those signals still
 * have their default action, so a program with handlers of its own (gplimits checkpoints on
 * SIGINT) keeps them and calls tpk_h5out_remove_temps (or tpk_h5out_abort) itself. */
#define LIVE_MAX 16
#define LIVE_PATH 4096
static char live_path[LIVE_MAX][LIVE_PATH];
static volatile sig_atomic_t live_used[LIVE_MAX];
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t live_once = PTHREAD_ONCE_INIT;

void tpk_h5out_remove_temps(void)
{
    for (int i = 0; i < LIVE_MAX; i++)
        if (live_used[i])
            unlink(live_path[i]);
}

static void on_signal(int sig)
{
    tpk_h5out_remove_temps();
    tpk__signal_say("", sig, ": no output written\n");
    _exit(128 + sig);
}

static void install_handlers(void)
{
    /* SIGHUP too: a closed terminal or a dropped ssh session left the temp file (issue 18) */
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    tpk__signals_default_to(sigs, 3, on_signal);
    /* A file size limit (RLIMIT_FSIZE) is a write error like a full disk: with SIGXFSZ at its
     * default the process would be killed mid-write instead of failing the write with EFBIG
     * and reporting it. */
    struct sigaction old;
    if (sigaction(SIGXFSZ, NULL, &old) == 0 && old.sa_handler == SIG_DFL &&
        !(old.sa_flags & SA_SIGINFO))
        signal(SIGXFSZ, SIG_IGN);
}

/* Slot of a registered temp path, or -1 (full table or too long a path: only the signal
 * clean-up is lost, the file is still removed by commit and abort). */
static int live_add(const char *tmp)
{
    pthread_once(&live_once, install_handlers);
    if (strlen(tmp) >= LIVE_PATH)
        return -1;
    int slot = -1;
    pthread_mutex_lock(&live_lock);
    for (int i = 0; i < LIVE_MAX && slot < 0; i++)
        if (!live_used[i]) {
            memcpy(live_path[i], tmp, strlen(tmp) + 1);
            live_used[i] = 1;
            slot = i;
        }
    pthread_mutex_unlock(&live_lock);
    return slot;
}

static void live_remove(int slot)
{
    if (slot < 0)
        return;
    pthread_mutex_lock(&live_lock);
    live_used[slot] = 0;
    pthread_mutex_unlock(&live_lock);
}

/* Temp files of this destination left by processes that no longer exist (SIGKILL, a crash):
 * ".<base>.tmp.<pid>.<16 hex>" in its folder with <pid> not alive. Only that exact pattern is
 * touched, and only when kill(pid, 0) says there is no such process. */
static void remove_stale(const char *path, size_t dlen, const char *base)
{
    char dir[LIVE_PATH];
    if (dlen >= sizeof dir)
        return;
    if (dlen == 0)
        memcpy(dir, ".", 2);
    else {
        memcpy(dir, path, dlen);
        dir[dlen] = '\0';
    }
    DIR *d = opendir(dir);
    if (!d)
        return;
    size_t blen = strlen(base);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *n = de->d_name;
        if (n[0] != '.' || strncmp(n + 1, base, blen) != 0 || strncmp(n + 1 + blen, ".tmp.", 5) != 0)
            continue;
        const char *p = n + 1 + blen + 5;
        char *end;
        long pid = strtol(p, &end, 10);
        if (end == p || *end != '.' || pid <= 0 || strlen(end + 1) != 16 ||
            strspn(end + 1, "0123456789abcdef") != 16)
            continue;
        if (pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        char full[2 * LIVE_PATH];
        snprintf(full, sizeof full, "%s/%s", dir, n);
        unlink(full);
    }
    closedir(d);
}

struct tpk_h5out {
    hid_t file;
    char *path;   /* final destination */
    char *tmp;    /* ".<basename>.tmp.<pid>.<hex>" beside it, so rename() stays on one filesystem */
    int failed;   /* an operation failed: commit must not publish a partial file */
    int live;     /* slot in the signal clean-up table, or -1 */
    int adopted;  /* tmp is the caller's (tpk_h5out_adopt): kept by abort and a failed commit */
    tpk_allocator alloc; /* of the tpk_h5out_open call: this struct, path and tmp */
};

/* splitmix64 (Steele, Lea, Flood 2014): spreads clock and address bits over the whole word. */
static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int mark_failed(tpk_h5out *out, tpk_ctx *ctx, int status, const char *what,
                       const char *name)
{
    int e = errno; /* as the failed HDF5 call left it: name a full disk or a size limit */
    out->failed = 1;
    if (e == ENOSPC || e == EFBIG || e == EDQUOT) {
        char eb[128];
        return TPK_ERROR(ctx, status, "%s: %s '%s': %s (nothing was written to %s; an earlier "
                         "file there is unchanged)", out->path, what, name,
                         tpk_io_errstr(e, eb, sizeof eb), out->path);
    }
    return TPK_ERROR(ctx, status, "%s: %s '%s'", out->path, what, name);
}

int tpk_h5out_check_replace(const char *path, int force, tpk_ctx *ctx)
{
    char eb[128], ver[64];
    struct stat st;
    if (path == NULL || path[0] == '\0' || strcmp(path, "-") == 0 || stat(path, &st) != 0)
        return TPK_OK; /* nothing there (tpk_h5out_open names an empty or "-" path) */
    if (S_ISDIR(st.st_mode))
        return TPK_ERROR(ctx, TPK_EIO, "%s: %s", path, tpk_io_errstr(EISDIR, eb, sizeof eb));
    if (force)
        return TPK_OK;
    const char *what = "an HDF5 file";
    if (!S_ISREG(st.st_mode)) {
        what = "not a regular file";
    } else {
        tpk_ctx lc;
        tpk_ctx_init(&lc);
        int rs = tpk_io_read_attr_str(path, "/", "toolkit_version", ver, sizeof ver, &lc);
        if (rs == TPK_OK)
            return TPK_OK; /* an output of this toolkit: replaced as before */
        what = rs == TPK_EFORMAT && strstr(lc.msg, "attribute") == NULL ? "not an HDF5 file"
             : rs == TPK_EIO ? "a file that cannot be read"
                             : "an HDF5 file this toolkit did not write (no toolkit_version "
                               "attribute)";
    }
    return TPK_ERROR(ctx, TPK_EINVAL, "%s exists and is %s: refusing to replace it (nothing was "
                     "written); give another --output, or --force to overwrite it", path, what);
}

int tpk_h5out_program_attrs(tpk_h5out *out, const char *path, const char *text, tpk_ctx *ctx)
{
    char sha[65], *owned = NULL;
    size_t len = text ? strlen(text) : 0;
    if (!text && !(text = owned = tpk_io_read_text(path, &len, ctx)))
        return ctx->status;
    tpk_sha256_hex(text, len, sha);
    int st = tpk_h5out_attr_str(out, "/", "program_text", text, ctx);
    if (!st)
        st = tpk_h5out_attr_str(out, "/", "program_sha256", sha, ctx);
    tpk_free(ctx, owned);
    return st;
}

tpk_h5out *tpk_h5out_open(const char *path, tpk_ctx *ctx)
{
    char eb[128];
    if (path == NULL || path[0] == '\0') {
        TPK_ERROR(ctx, TPK_EINVAL, "empty output path");
        return NULL;
    }
    if (strcmp(path, "-") == 0) {
        TPK_ERROR(ctx, TPK_EINVAL, TPK_IO_NO_STDOUT);
        return NULL;
    }
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        TPK_ERROR(ctx, TPK_EIO, "%s: %s", path, tpk_io_errstr(EISDIR, eb, sizeof eb));
        return NULL;
    }
    tpk_h5out *out = tpk_calloc(ctx, 1, sizeof *out);
    size_t plen = strlen(path);
    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) + 1 : 0; /* directory part, with its '/' */
    const char *base = slash ? slash + 1 : path;
    size_t tcap = plen + 64;
    if (out != NULL)
        out->alloc = tpk_ctx_allocator(ctx);
    if (out == NULL || (out->path = tpk_malloc(ctx, plen + 1)) == NULL ||
        (out->tmp = tpk_malloc(ctx, tcap)) == NULL) {
        TPK_ERROR(ctx, TPK_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    out->file = -1;
    out->live = -1;
    memcpy(out->path, path, plen + 1);
    if (base[0] == '\0') {
        TPK_ERROR(ctx, TPK_EINVAL, "%s: output path names a directory, not a file", path);
        goto fail;
    }

    /* Create the temp file ourselves with O_EXCL, so two processes (or two writers in one
     * process) can never share one, and with mode 0666 so the umask applies as it would to
     * any new file (mkstemp would force 0600). This is also the early check the callers rely
     * on: a missing or unwritable directory fails here, before any computation. */
    remove_stale(path, dlen, base);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t seed = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    seed ^= (uint64_t)(uintptr_t)out;
    int fd = -1, err = 0;
    for (int t = 0; t < TMP_TRIES && fd < 0; t++) {
        snprintf(out->tmp, tcap, "%.*s.%s.tmp.%ld.%016llx", (int)dlen, path, base,
                 (long)getpid(), (unsigned long long)mix64(seed + (uint64_t)t));
        /* registered first, so that a signal right after the open still removes it */
        out->live = live_add(out->tmp);
        fd = open(out->tmp, O_WRONLY | O_CREAT | O_EXCL, 0666);
        err = errno;
        if (fd < 0) {
            live_remove(out->live);
            out->live = -1;
        }
        if (fd < 0 && err != EEXIST)
            break;
    }
    if (fd < 0) {
        if (dlen > 0)
            TPK_ERROR(ctx, TPK_EIO, "%s: cannot create output in '%.*s': %s", path, (int)dlen,
                      path, tpk_io_errstr(err, eb, sizeof eb));
        else
            TPK_ERROR(ctx, TPK_EIO, "%s: cannot create output in the current directory: %s",
                      path, tpk_io_errstr(err, eb, sizeof eb));
        goto fail;
    }
    close(fd);

    tpk_h5_quiet q;
    tpk_h5_quiet_begin(&q);
    /* CLOSE_STRONG: H5Fclose really closes the file even if some handle leaked, so commit
     * never renames a file HDF5 is still writing. */
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl >= 0)
        H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG);
    out->file = H5Fcreate(out->tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl >= 0 ? fapl : H5P_DEFAULT);
    if (fapl >= 0)
        H5Pclose(fapl);
    tpk_h5_quiet_end(&q);
    if (out->file < 0) {
        unlink(out->tmp);
        TPK_ERROR(ctx, TPK_EIO, "%s: cannot create HDF5 file '%s'", path, out->tmp);
        goto fail;
    }
    return out;
fail:
    if (out != NULL) {
        live_remove(out->live);
        tpk_free(ctx, out->path);
        tpk_free(ctx, out->tmp);
        tpk_free(ctx, out);
    }
    return NULL;
}

static int check_out(const tpk_h5out *out, const char *name, tpk_ctx *ctx)
{
    if (out == NULL || out->file < 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "HDF5 output is not open");
    if (name == NULL || name[0] != '/' || name[1] == '\0' || name[strlen(name) - 1] == '/' ||
        strstr(name, "//") != NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: dataset name '%s' must be an absolute path like "
                         "\"/kernel\" or \"/group/x\"", out->path, name ? name : "(null)");
    return TPK_OK;
}

/* Create and fill one contiguous dataset (no chunking, no compression: kernels are dense and
 * read whole, and contiguous layout keeps the file readable by anything). */
static int write_dataset(tpk_h5out *out, const char *name, int rank, const hsize_t *dims,
                         hid_t file_type, hid_t mem_type, const void *buf, tpk_ctx *ctx)
{
    tpk_h5_quiet q;
    tpk_h5_quiet_begin(&q);
    int st = TPK_OK;
    hid_t lcpl = -1, space = -1, ds = -1;
    if (H5Lexists(out->file, name, H5P_DEFAULT) > 0) {
        st = mark_failed(out, ctx, TPK_EINVAL, "already has an object named", name);
        goto done;
    }
    lcpl = H5Pcreate(H5P_LINK_CREATE);
    if (lcpl < 0 || H5Pset_create_intermediate_group(lcpl, 1) < 0) {
        st = mark_failed(out, ctx, TPK_EIO, "cannot prepare dataset", name);
        goto done;
    }
    space = H5Screate_simple(rank, dims, NULL);
    if (space < 0) {
        st = mark_failed(out, ctx, TPK_EIO, "cannot make dataspace for", name);
        goto done;
    }
    ds = H5Dcreate2(out->file, name, file_type, space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    if (ds < 0) {
        st = mark_failed(out, ctx, TPK_EIO, "cannot create dataset", name);
        goto done;
    }
    if (H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0)
        st = mark_failed(out, ctx, TPK_EIO, "cannot write dataset", name);
done:
    if (ds >= 0)
        H5Dclose(ds);
    if (space >= 0)
        H5Sclose(space);
    if (lcpl >= 0)
        H5Pclose(lcpl);
    tpk_h5_quiet_end(&q);
    return st;
}

/* Every float result passes here: a NaN or infinity is a failed computation, never a result
 * (issue 18: runs wrote all-NaN kernels and NaN kurtoses with exit 0). The file is failed, so
 * commit refuses it and the destination stays as it was. */
static const char *nonfinite_name(double v)
{
    return isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf";
}

static int check_finite(tpk_h5out *out, const char *name, const tpk_array *a, tpk_ctx *ctx)
{
    char idx[128];
    size_t n = tpk_array_size(a), i = tpk_array_first_nonfinite(a, idx, sizeof idx);
    if (i == n)
        return TPK_OK;
    out->failed = 1;
    return TPK_ERROR(ctx, TPK_EDOM, "%s: refusing to write a non-finite result: dataset '%s' "
                     "entry [%s] is %s (the computation failed there; nothing was written)",
                     out->path, name, idx, nonfinite_name(a->data[i]));
}

int tpk_h5out_write(tpk_h5out *out, const char *name, const tpk_array *a, tpk_ctx *ctx)
{
    int st = check_out(out, name, ctx);
    if (st != TPK_OK)
        return st;
    if (a == NULL || a->ndim < 1 || a->ndim > TPK_ARRAY_MAXDIM) {
        out->failed = 1;
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: '%s': array missing or of rank outside 1..%d",
                         out->path, name, TPK_ARRAY_MAXDIM);
    }
    hsize_t dims[TPK_ARRAY_MAXDIM];
    for (int i = 0; i < a->ndim; i++)
        dims[i] = (hsize_t)a->dims[i];
    if ((st = check_finite(out, name, a, ctx)))
        return st;
    return write_dataset(out, name, a->ndim, dims, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, a->data,
                         ctx);
}

/* A rank-1 dataset of n values of one type. */
static int write_rank1(tpk_h5out *out, const char *name, const void *v, size_t n,
                       hid_t file_type, hid_t mem_type, tpk_ctx *ctx)
{
    int st = check_out(out, name, ctx);
    if (st != TPK_OK)
        return st;
    if (v == NULL && n > 0) {
        out->failed = 1;
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: '%s': NULL data", out->path, name);
    }
    hsize_t dims[1] = {(hsize_t)n};
    return write_dataset(out, name, 1, dims, file_type, mem_type, v, ctx);
}

int tpk_h5out_write_vector(tpk_h5out *out, const char *name, const double *v, size_t n,
                           tpk_ctx *ctx)
{
    int st = check_out(out, name, ctx);
    if (st != TPK_OK || v == NULL)
        return st ? st : write_rank1(out, name, v, n, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, ctx);
    tpk_array a = {.ndim = 1, .dims = {n, 0, 0, 0}, .data = (double *)v};
    if ((st = check_finite(out, name, &a, ctx)))
        return st;
    return write_rank1(out, name, v, n, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, ctx);
}

int tpk_h5out_write_ints(tpk_h5out *out, const char *name, const long long *v, size_t n,
                         tpk_ctx *ctx)
{
    return write_rank1(out, name, v, n, H5T_STD_I64LE, H5T_NATIVE_LLONG, ctx);
}

static int dim_name_ok(const char *s)
{
    if (!s || !((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || *s == '_'))
        return 0;
    for (; *s; s++)
        if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') ||
              *s == '_'))
            return 0;
    return strlen(s) < 64;
}

/* The dimension scale "/NAME" of length n: opened, or created as 0 .. n−1 (int64). */
static hid_t dim_scale(tpk_h5out *out, const char *dname, hsize_t n, tpk_ctx *ctx)
{
    char path[72];
    snprintf(path, sizeof path, "/%s", dname);
    if (H5Lexists(out->file, path, H5P_DEFAULT) <= 0) {
        long long *v = tpk_malloc(ctx, (n ? n : 1) * sizeof *v);
        if (!v) {
            out->failed = 1;
            TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
            return -1;
        }
        for (hsize_t i = 0; i < n; i++)
            v[i] = (long long)i;
        int st = write_dataset(out, path, 1, &n, H5T_STD_I64LE, H5T_NATIVE_LLONG, v, ctx);
        tpk_free(ctx, v);
        if (st)
            return -1;
        hid_t ds = H5Dopen2(out->file, path, H5P_DEFAULT);
        if (ds < 0 || H5DSset_scale(ds, dname) < 0) {
            if (ds >= 0)
                H5Dclose(ds);
            mark_failed(out, ctx, TPK_EIO, "cannot make a dimension scale of", path);
            return -1;
        }
        return ds;
    }
    hid_t ds = H5Oopen(out->file, path, H5P_DEFAULT);
    if (ds < 0 || H5Iget_type(ds) != H5I_DATASET || H5DSis_scale(ds) <= 0) {
        if (ds >= 0)
            H5Oclose(ds);
        mark_failed(out, ctx, TPK_EINVAL, "has an object that is not a dimension scale at", path);
        return -1;
    }
    hid_t sp = H5Dget_space(ds);
    hsize_t len = 0;
    int rank = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
    if (rank == 1)
        H5Sget_simple_extent_dims(sp, &len, NULL);
    if (sp >= 0)
        H5Sclose(sp);
    if (rank != 1 || len != n) {
        H5Dclose(ds);
        out->failed = 1;
        TPK_ERROR(ctx, TPK_EINVAL, "%s: dimension '%s' has length %llu, not %llu", out->path,
                  dname, (unsigned long long)len, (unsigned long long)n);
        return -1;
    }
    return ds;
}

int tpk_h5out_has(tpk_h5out *out, const char *name)
{
    tpk_ctx lc;
    tpk_ctx_init(&lc);
    if (check_out(out, name, &lc) != TPK_OK)
        return 0;
    tpk_h5_quiet q;
    tpk_h5_quiet_begin(&q);
    /* every parent must exist before H5Lexists may be asked about the child */
    int found = 1;
    char part[1024];
    size_t len = strlen(name);
    for (size_t i = 1; i <= len && found; i++)
        if (name[i] == '/' || name[i] == '\0') {
            if (i >= sizeof part) {
                found = 0;
                break;
            }
            memcpy(part, name, i);
            part[i] = '\0';
            found = H5Lexists(out->file, part, H5P_DEFAULT) > 0;
        }
    tpk_h5_quiet_end(&q);
    return found;
}

/* A new root dimension scale "/NAME" of n values of file_type (from buf in mem_type). */
static int coord_scale(tpk_h5out *out, const char *dname, size_t n, hid_t file_type,
                       hid_t mem_type, const void *buf, tpk_ctx *ctx)
{
    int st = TPK_OK;
    if (out == NULL || out->file < 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "HDF5 output is not open");
    if (!dim_name_ok(dname)) {
        out->failed = 1;
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: dimension name '%s' is not an identifier",
                         out->path, dname ? dname : "(null)");
    }
    if (n == 0 || buf == NULL) {
        out->failed = 1;
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: dimension '%s': no coordinate values", out->path,
                         dname);
    }
    char path[72];
    snprintf(path, sizeof path, "/%s", dname);
    tpk_h5_quiet q;
    tpk_h5_quiet_begin(&q);
    int exists = H5Lexists(out->file, path, H5P_DEFAULT) > 0;
    tpk_h5_quiet_end(&q);
    if (exists) {
        out->failed = 1;
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: dimension '%s' exists already (coordinates are "
                         "given once, before any dataset names it)", out->path, dname);
    }
    hsize_t len = (hsize_t)n;
    if ((st = write_dataset(out, path, 1, &len, file_type, mem_type, buf, ctx)))
        return st;
    tpk_h5_quiet_begin(&q);
    hid_t ds = H5Dopen2(out->file, path, H5P_DEFAULT);
    if (ds < 0 || H5DSset_scale(ds, dname) < 0)
        st = mark_failed(out, ctx, TPK_EIO, "cannot make a dimension scale of", path);
    if (ds >= 0)
        H5Dclose(ds);
    tpk_h5_quiet_end(&q);
    return st;
}

int tpk_h5out_coord_ints(tpk_h5out *out, const char *name, const long long *v, size_t n,
                         tpk_ctx *ctx)
{
    return coord_scale(out, name, n, H5T_STD_I64LE, H5T_NATIVE_LLONG, v, ctx);
}

int tpk_h5out_coord_doubles(tpk_h5out *out, const char *name, const double *v, size_t n,
                            tpk_ctx *ctx)
{
    for (size_t i = 0; v && i < n; i++)
        if (!isfinite(v[i])) {
            if (out)
                out->failed = 1;
            return TPK_ERROR(ctx, TPK_EDOM, "%s: dimension '%s': coordinate %zu is %s",
                             out ? out->path : "", name ? name : "", i, nonfinite_name(v[i]));
        }
    return coord_scale(out, name, n, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, v, ctx);
}

int tpk_h5out_coord_labels(tpk_h5out *out, const char *name, const char *const *labels,
                           size_t n, tpk_ctx *ctx)
{
    for (size_t i = 0; labels && i < n; i++)
        if (labels[i] == NULL) {
            if (out)
                out->failed = 1;
            return TPK_ERROR(ctx, TPK_EINVAL, "dimension '%s': label %zu is NULL",
                             name ? name : "", i);
        }
    /* variable-length UTF-8, as the string attributes: h5py / xarray read str */
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t < 0 || H5Tset_size(t, H5T_VARIABLE) < 0 || H5Tset_cset(t, H5T_CSET_UTF8) < 0) {
        if (t >= 0)
            H5Tclose(t);
        if (out)
            out->failed = 1;
        return TPK_ERROR(ctx, TPK_EIO, "cannot make string type for dimension '%s'",
                         name ? name : "");
    }
    int st = coord_scale(out, name, n, t, t, labels, ctx);
    H5Tclose(t);
    return st;
}

int tpk_h5out_dims(tpk_h5out *out, const char *name, const char *const *names, int ndims,
                   tpk_ctx *ctx)
{
    int st = check_out(out, name, ctx);
    if (st != TPK_OK) {
        if (out)
            out->failed = 1; /* a file with an axis left unnamed is not the file asked for */
        return st;
    }
    for (int k = 0; k < ndims; k++)
        if (!names || !dim_name_ok(names[k])) {
            out->failed = 1;
            return TPK_ERROR(ctx, TPK_EINVAL, "%s: '%s': dimension name '%s' is not an identifier",
                             out->path, name, names && names[k] ? names[k] : "(null)");
        }
    tpk_h5_quiet q;
    tpk_h5_quiet_begin(&q);
    hid_t ds = -1, sp = -1;
    hsize_t dims[H5S_MAX_RANK];
    if (H5Lexists(out->file, name, H5P_DEFAULT) <= 0 ||
        (ds = H5Dopen2(out->file, name, H5P_DEFAULT)) < 0) {
        out->failed = 1;
        st = TPK_ERROR(ctx, TPK_ENOTFOUND, "%s: no dataset '%s' to name the dimensions of",
                       out->path, name);
        goto done;
    }
    sp = H5Dget_space(ds);
    int rank = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
    if (rank != ndims || rank < 1 || H5Sget_simple_extent_dims(sp, dims, NULL) < 0) {
        out->failed = 1;
        st = TPK_ERROR(ctx, TPK_EINVAL, "%s: '%s' has rank %d but %d dimension names were given",
                       out->path, name, rank, ndims);
        goto done;
    }
    for (int k = 0; k < ndims && !st; k++) {
        hid_t sc = dim_scale(out, names[k], dims[k], ctx);
        if (sc < 0) {
            st = ctx->status ? ctx->status : TPK_EIO;
            break;
        }
        if (H5DSattach_scale(ds, sc, (unsigned)k) < 0)
            st = mark_failed(out, ctx, TPK_EIO, "cannot attach a dimension scale to", name);
        H5Dclose(sc);
    }
done:
    if (sp >= 0)
        H5Sclose(sp);
    if (ds >= 0)
        H5Dclose(ds);
    tpk_h5_quiet_end(&q);
    return st;
}

/* Write (or replace) one attribute on `obj` ("/" when NULL). Replacing rather than failing lets
 * a caller set a default early and refine it later. */
static int write_attr(tpk_h5out *out, const char *obj, const char *key, hid_t file_type,
                      hid_t mem_type, int rank, const hsize_t *dims, const void *buf,
                      tpk_ctx *ctx)
{
    if (out == NULL || out->file < 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "HDF5 output is not open");
    if (obj == NULL)
        obj = "/";
    if (key == NULL || key[0] == '\0') {
        out->failed = 1;
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: empty attribute name on '%s'", out->path, obj);
    }
    tpk_h5_quiet q;
    tpk_h5_quiet_begin(&q);
    int st = TPK_OK;
    hid_t o = -1, space = -1, at = -1;
    o = H5Oopen(out->file, obj, H5P_DEFAULT);
    if (o < 0) {
        out->failed = 1;
        st = TPK_ERROR(ctx, TPK_ENOTFOUND, "%s: no object '%s' to put attribute '%s' on",
                       out->path, obj, key);
        goto done;
    }
    if (H5Aexists(o, key) > 0 && H5Adelete(o, key) < 0) {
        st = mark_failed(out, ctx, TPK_EIO, "cannot replace attribute", key);
        goto done;
    }
    space = rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rank, dims, NULL);
    if (space < 0) {
        st = mark_failed(out, ctx, TPK_EIO, "cannot make dataspace for attribute", key);
        goto done;
    }
    at = H5Acreate2(o, key, file_type, space, H5P_DEFAULT, H5P_DEFAULT);
    if (at < 0 || H5Awrite(at, mem_type, buf) < 0)
        st = mark_failed(out, ctx, TPK_EIO, "cannot write attribute", key);
done:
    if (at >= 0)
        H5Aclose(at);
    if (space >= 0)
        H5Sclose(space);
    if (o >= 0)
        H5Oclose(o);
    tpk_h5_quiet_end(&q);
    return st;
}

int tpk_h5out_attr_str(tpk_h5out *out, const char *obj, const char *key, const char *val,
                       tpk_ctx *ctx)
{
    /* Variable-length UTF-8: h5py hands these back as str (fixed-length ones come back as
     * bytes), and any length fits. */
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t < 0 || H5Tset_size(t, H5T_VARIABLE) < 0 || H5Tset_cset(t, H5T_CSET_UTF8) < 0) {
        if (t >= 0)
            H5Tclose(t);
        if (out != NULL)
            out->failed = 1;
        return TPK_ERROR(ctx, TPK_EIO, "cannot make string type for attribute '%s'",
                         key ? key : "");
    }
    const char *v = val ? val : "";
    int st = write_attr(out, obj, key, t, t, 0, NULL, &v, ctx);
    H5Tclose(t);
    return st;
}

int tpk_h5out_attr_double(tpk_h5out *out, const char *obj, const char *key, double val,
                          tpk_ctx *ctx)
{
    if (out != NULL && out->file >= 0 && !isfinite(val)) {
        out->failed = 1;
        return TPK_ERROR(ctx, TPK_EDOM, "%s: refusing to write a non-finite result: attribute "
                         "'%s' of '%s' is %s (the computation failed there; nothing was "
                         "written)", out->path, key ? key : "", obj ? obj : "/",
                         nonfinite_name(val));
    }
    return write_attr(out, obj, key, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 0, NULL, &val, ctx);
}

int tpk_h5out_attr_int(tpk_h5out *out, const char *obj, const char *key, long long val,
                       tpk_ctx *ctx)
{
    return write_attr(out, obj, key, H5T_STD_I64LE, H5T_NATIVE_LLONG, 0, NULL, &val, ctx);
}

/* Characters that never need quoting in a POSIX shell word. */
static int shell_safe(const char *s)
{
    if (*s == '\0')
        return 0;
    for (; *s; s++)
        if (!strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_@%+=:,./-",
                     *s))
            return 0;
    return 1;
}

/* argv joined so that pasting it into sh re-runs the same command: unsafe words go in single
 * quotes, and a ' inside becomes '\'' (close, escaped quote, reopen). */
static char *join_argv(int argc, char **argv, tpk_ctx *ctx)
{
    size_t n = 1;
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i] ? argv[i] : "";
        n += 3 + 4 * strlen(s); /* worst case: every char a ' */
    }
    char *buf = tpk_malloc(ctx, n), *p = buf;
    if (buf == NULL)
        return NULL;
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i] ? argv[i] : "";
        if (i > 0)
            *p++ = ' ';
        if (shell_safe(s)) {
            size_t k = strlen(s);
            memcpy(p, s, k);
            p += k;
            continue;
        }
        *p++ = '\'';
        for (; *s; s++) {
            if (*s == '\'') {
                memcpy(p, "'\\''", 4);
                p += 4;
            } else {
                *p++ = *s;
            }
        }
        *p++ = '\'';
    }
    *p = '\0';
    return buf;
}

int tpk_h5out_provenance(tpk_h5out *out, int argc, char **argv, tpk_ctx *ctx)
{
    if (argc < 0 || (argc > 0 && argv == NULL))
        return TPK_ERROR(ctx, TPK_EINVAL, "provenance: bad argc/argv");
    char *cmd = join_argv(argc, argv, ctx);
    if (cmd == NULL) {
        if (out != NULL)
            out->failed = 1;
        return TPK_ERROR(ctx, TPK_ENOMEM, "provenance: out of memory");
    }
    char created[32] = "";
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm) != NULL)
        strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", &tm);
    int st = tpk_h5out_attr_str(out, "/", "toolkit_version", TPK_VERSION, ctx);
    if (st == TPK_OK)
        st = tpk_h5out_attr_str(out, "/", "command_line", cmd, ctx);
    if (st == TPK_OK)
        st = tpk_h5out_attr_str(out, "/", "created", created, ctx);
    tpk_free(ctx, cmd);
    return st;
}

int tpk_h5out_input_attrs(tpk_h5out *out, const char *prefix, const tpk_input_info *info,
                          const tpk_array *a, tpk_ctx *ctx)
{
    if (prefix == NULL || prefix[0] == '\0' || strlen(prefix) > 64 || info == NULL || a == NULL ||
        a->ndim < 1 || a->ndim > TPK_ARRAY_MAXDIM) {
        if (out != NULL)
            out->failed = 1;
        return TPK_ERROR(ctx, TPK_EINVAL, "input attributes: bad prefix, info or array");
    }
    char key[96];
    int st;
    snprintf(key, sizeof key, "%s_file", prefix);
    st = tpk_h5out_attr_str(out, "/", key, info->path, ctx);
    if (st == TPK_OK) {
        snprintf(key, sizeof key, "%s_dataset", prefix);
        st = tpk_h5out_attr_str(out, "/", key, info->dataset, ctx);
    }
    if (st == TPK_OK) {
        snprintf(key, sizeof key, "%s_format", prefix);
        st = tpk_h5out_attr_str(out, "/", key, info->format, ctx);
    }
    if (st == TPK_OK) {
        snprintf(key, sizeof key, "%s_sha256", prefix);
        st = tpk_h5out_attr_str(out, "/", key, info->sha256, ctx);
    }
    if (st == TPK_OK) {
        /* An int64 array rather than "4096x784": readers get numbers without parsing. */
        long long shape[TPK_ARRAY_MAXDIM];
        hsize_t n = (hsize_t)a->ndim;
        for (int i = 0; i < a->ndim; i++)
            shape[i] = (long long)a->dims[i];
        snprintf(key, sizeof key, "%s_shape", prefix);
        st = write_attr(out, "/", key, H5T_STD_I64LE, H5T_NATIVE_LLONG, 1, &n, shape, ctx);
    }
    return st;
}

/* fsync a path (file or directory). Directories: EINVAL means the filesystem cannot sync
 * them, which is not an error we can act on. */
static int sync_path(const char *p, int dir)
{
    int fd = open(p, dir ? O_RDONLY | O_DIRECTORY : O_RDONLY);
    if (fd < 0)
        return -1;
    int r = fsync(fd);
    if (r != 0 && dir && errno == EINVAL)
        r = 0;
    close(fd);
    return r;
}

static void out_free(tpk_h5out *out)
{
    tpk_allocator al = out->alloc;
    live_remove(out->live);
    tpk_mem_free(&al, out->path);
    tpk_mem_free(&al, out->tmp);
    tpk_mem_free(&al, out);
}

int tpk_h5out_commit(tpk_h5out *out, tpk_ctx *ctx)
{
    char eb[128];
    if (out == NULL)
        return TPK_ERROR(ctx, TPK_EINVAL, "commit of a NULL HDF5 output");
    int st = TPK_OK;
    if (out->failed) {
        st = TPK_ERROR(ctx, TPK_EIO, "%s: not written, an earlier write to it failed",
                       out->path);
        tpk_h5out_abort(out);
        return st;
    }
    tpk_h5_quiet q;
    tpk_h5_quiet_begin(&q);
    errno = 0;
    herr_t hf = H5Fflush(out->file, H5F_SCOPE_GLOBAL);
    int ef = errno;
    herr_t hc = H5Fclose(out->file);
    int ec = ef ? ef : errno;
    tpk_h5_quiet_end(&q);
    out->file = -1;
    /* Data must be on disk before the rename makes it visible: otherwise a crash can leave a
     * renamed but empty file where the old good one was. */
    if (hf < 0 || hc < 0) {
        /* the cause as the failed write left it, as a write's own failure says (mark_failed):
         * most data reach the disk only here (issue 18: "flush/close failed" named no cause) */
        errno = ec;
        st = mark_failed(out, ctx, TPK_EIO, "HDF5 flush/close of", out->tmp);
    } else if (sync_path(out->tmp, 0) != 0) {
        st = TPK_ERROR(ctx, TPK_EIO, "%s: fsync of '%s' failed: %s", out->path, out->tmp,
                       tpk_io_errstr(errno, eb, sizeof eb));
    } else if (rename(out->tmp, out->path) != 0) {
        st = TPK_ERROR(ctx, TPK_EIO, "%s: cannot rename '%s' into place: %s", out->path,
                       out->tmp, tpk_io_errstr(errno, eb, sizeof eb));
    } else {
        /* Make the rename itself durable. Failure here leaves the new file in place and
         * readable, so it is not reported. */
        const char *slash = strrchr(out->path, '/');
        if (slash == NULL) {
            sync_path(".", 1);
        } else if (slash == out->path) {
            sync_path("/", 1);
        } else {
            char *cut = out->path + (slash - out->path); /* the folder: path up to the slash */
            *cut = '\0';
            sync_path(out->path, 1);
            *cut = '/';
        }
        out_free(out);
        return TPK_OK;
    }
    if (!out->adopted)
        unlink(out->tmp);
    out_free(out);
    return st;
}

void tpk_h5out_abort(tpk_h5out *out)
{
    if (out == NULL)
        return;
    if (out->file >= 0) {
        tpk_h5_quiet q;
        tpk_h5_quiet_begin(&q);
        H5Fclose(out->file);
        tpk_h5_quiet_end(&q);
    }
    if (!out->adopted)
        unlink(out->tmp);
    out_free(out);
}

tpk_h5out *tpk_h5out_adopt(const char *path, const char *tmp, tpk_ctx *ctx)
{
    char eb[128];
    if (path == NULL || path[0] == '\0' || tmp == NULL || tmp[0] == '\0') {
        TPK_ERROR(ctx, TPK_EINVAL, "empty output or temporary path");
        return NULL;
    }
    /* rename() must stay on one filesystem: the temporary lives in the destination's folder */
    const char *ps = strrchr(path, '/'), *ts = strrchr(tmp, '/');
    size_t pd = ps ? (size_t)(ps - path) : 0, td = ts ? (size_t)(ts - tmp) : 0;
    if (pd != td || strncmp(path, tmp, pd) != 0) {
        TPK_ERROR(ctx, TPK_EINVAL, "%s: the temporary '%s' is not in the output's folder", path,
                  tmp);
        return NULL;
    }
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        TPK_ERROR(ctx, TPK_EIO, "%s: %s", path, tpk_io_errstr(EISDIR, eb, sizeof eb));
        return NULL;
    }
    tpk_h5out *out = tpk_calloc(ctx, 1, sizeof *out);
    if (out != NULL)
        out->alloc = tpk_ctx_allocator(ctx);
    if (out == NULL || (out->path = tpk_strdup(ctx, path)) == NULL ||
        (out->tmp = tpk_strdup(ctx, tmp)) == NULL) {
        if (out) {
            out->live = -1;
            out_free(out);
        }
        return NULL;
    }
    out->live = -1;
    out->adopted = 1;
    tpk_h5_quiet q;
    tpk_h5_quiet_begin(&q);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl >= 0)
        H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG);
    out->file = H5Fopen(tmp, H5F_ACC_RDWR, fapl >= 0 ? fapl : H5P_DEFAULT);
    if (fapl >= 0)
        H5Pclose(fapl);
    tpk_h5_quiet_end(&q);
    if (out->file < 0) {
        TPK_ERROR(ctx, access(tmp, F_OK) == 0 ? TPK_EFORMAT : TPK_EIO,
                  "%s: cannot open '%s' as an HDF5 file to finish", path, tmp);
        out_free(out);
        return NULL;
    }
    return out;
}

int tpk_h5out_remove(tpk_h5out *out, const char *name, tpk_ctx *ctx)
{
    int st = check_out(out, name, ctx);
    if (st)
        return st;
    tpk_h5_quiet q;
    tpk_h5_quiet_begin(&q);
    htri_t have = H5Lexists(out->file, name, H5P_DEFAULT);
    herr_t del = have > 0 ? H5Ldelete(out->file, name, H5P_DEFAULT) : -1;
    tpk_h5_quiet_end(&q);
    if (have <= 0)
        return TPK_ERROR(ctx, TPK_ENOTFOUND, "%s: no object '%s' to remove", out->path, name);
    if (del < 0)
        return mark_failed(out, ctx, TPK_EIO, "cannot remove", name);
    return TPK_OK;
}

int tpk_h5out_attr_auto(tpk_h5out *out, const char *obj, const char *key, const char *value,
                        tpk_ctx *ctx)
{
    char *end;
    errno = 0;
    double v = strtod(value, &end);
    if (end != value && *end == '\0' && errno == 0 && isfinite(v)) /* text like "nan" stays text */
        return tpk_h5out_attr_double(out, obj, key, v, ctx);
    return tpk_h5out_attr_str(out, obj, key, value, ctx);
}
