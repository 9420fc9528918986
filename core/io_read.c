/* Input readers: "file.h5:/dataset", "file.npy", "file.npz:name" and "file.csv" into a float64
 * tpk_array. */
#include "io_impl.h"
#include "tpk/alloc.h"
#include "tpk/io.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <zlib.h>

/* Shape policy, the same for every format: rank 2..4 is taken as is; rank 1 (a vector of N
 * scalar inputs, as np.save(x) of a 1-D x gives) is read as N×1 because every consumer treats
 * axis 0 as the sample axis; rank 0 and rank >= 5 are rejected; an array with no values is
 * rejected (there is no kernel of zero inputs). */
#define READ_MAXDIM 8 /* how many dims we parse before rejecting: enough to say "rank 5" */

/* A .npy header is a few hundred bytes; anything past this is not a NumPy file we wrote. */
#define NPY_MAX_HEADER (1u << 20)

/* ------------------------------------------------------------------------------------------ */
/* Common helpers                                                                             */


/* "4096x784" for messages; beyond READ_MAXDIM dims (all a header parse keeps) "x...". */
static void shape_str(int ndim, const size_t *dims, char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < ndim && used < n; i++) {
        int w = i < READ_MAXDIM ? snprintf(buf + used, n - used, i ? "x%zu" : "%zu", dims[i])
                                : snprintf(buf + used, n - used, "x...");
        if (w < 0 || i >= READ_MAXDIM)
            break;
        used += (size_t)w;
    }
}

/* Check the file can be opened before handing it to a library, so a missing file reads
 * "X: No such file or directory" rather than a library's own wording. */
static FILE *open_input(const char *path, tpk_ctx *ctx)
{
    char eb[128];
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        TPK_ERROR(ctx, TPK_EIO, "%s: %s", path, tpk_io_errstr(errno, eb, sizeof eb));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        TPK_ERROR(ctx, TPK_EIO, "%s: %s", path, tpk_io_errstr(EISDIR, eb, sizeof eb));
        return NULL;
    }
    return f;
}

char *tpk_io_read_text(const char *path, size_t *len, tpk_ctx *ctx)
{
    char eb[128];
    if (len)
        *len = 0;
    FILE *f = path ? open_input(path, ctx) : NULL;
    if (f == NULL) {
        if (!path)
            TPK_ERROR(ctx, TPK_EINVAL, "tpk_io_read_text: NULL path");
        return NULL;
    }
    char *buf = NULL, chunk[4096];
    size_t cap = 0, n = 0, got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (n + got + 1 > cap) {
            cap = 2 * (n + got + 1);
            char *nb = tpk_realloc(ctx, buf, cap);
            if (!nb) { /* part of a file would be taken for the whole */
                tpk_free(ctx, buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        memcpy(buf + n, chunk, got);
        n += got;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        tpk_free(ctx, buf);
        TPK_ERROR(ctx, TPK_EIO, "%s: %s", path, tpk_io_errstr(EIO, eb, sizeof eb));
        return NULL;
    }
    if (!buf && !(buf = tpk_malloc(ctx, 1)))
        return NULL;
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

/* Turn a parsed shape into an array, applying the shape policy above. */
static tpk_array *alloc_shaped(const char *path, int ndim, const size_t *dims, tpk_ctx *ctx)
{
    char sb[160];
    shape_str(ndim, dims, sb, sizeof sb);
    if (ndim < 1) {
        TPK_ERROR(ctx, TPK_EFORMAT, "%s: scalar (rank 0) data; expected an array of rank 1..4",
                  path);
        return NULL;
    }
    if (ndim > TPK_ARRAY_MAXDIM) {
        TPK_ERROR(ctx, TPK_EFORMAT, "%s: rank %d (shape %s) not supported; expected rank 1..%d",
                  path, ndim, sb, TPK_ARRAY_MAXDIM);
        return NULL;
    }
    size_t d[TPK_ARRAY_MAXDIM];
    int nd = ndim;
    for (int i = 0; i < ndim; i++) {
        d[i] = dims[i];
        if (dims[i] == 0) {
            TPK_ERROR(ctx, TPK_EFORMAT, "%s: array of shape %s has no values", path, sb);
            return NULL;
        }
    }
    if (ndim == 1) {
        d[1] = 1;
        nd = 2;
        /* said, not silent (issue 18): a vector could as well be one item of n values */
        tpk_note(ctx, "%s: a rank-1 array of %zu values, read as %zu items of one value each "
                 "(N×1)", path, dims[0], dims[0]);
    }
    size_t n = 1;
    for (int i = 0; i < nd; i++) {
        if (n > SIZE_MAX / sizeof(double) / d[i]) {
            TPK_ERROR(ctx, TPK_EFORMAT, "%s: shape %s is too large for memory (more than %zu "
                      "values); a corrupt header?", path, sb, SIZE_MAX / sizeof(double));
            return NULL;
        }
        n *= d[i];
    }
    if (tpk_array_check_memory(n, path, ctx)) /* a corrupt header's shape, named by its file */
        return NULL;
    return tpk_array_alloc(nd, d, ctx);
}

/* Reject NaN/Inf, naming the first one by its 0-based index in the stored shape. */
static int check_finite(const char *path, const tpk_array *a, tpk_ctx *ctx)
{
    char idx[160], sb[160];
    size_t i = tpk_array_first_nonfinite(a, idx, sizeof idx);
    if (i < tpk_array_size(a)) {
        shape_str(a->ndim, a->dims, sb, sizeof sb);
        return TPK_ERROR(ctx, TPK_EDOM,
                         "%s: non-finite value %g at index [%s] (0-based) of shape %s", path,
                         a->data[i], idx, sb);
    }
    return TPK_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* HDF5                                                                                       */

typedef struct ds_list {
    char buf[512];
    size_t used;
    int count;
    int truncated;
} ds_list;

/* H5Lvisit callback: collect the names of datasets (hard links only: a soft link to a missing
 * target would make H5Oopen fail, and listing it twice helps nobody). */
static herr_t list_visit(hid_t group, const char *name, const H5L_info_t *li, void *op)
{
    ds_list *l = op;
    if (li->type != H5L_TYPE_HARD)
        return 0;
    hid_t o = H5Oopen(group, name, H5P_DEFAULT);
    if (o < 0)
        return 0;
    int is_ds = H5Iget_type(o) == H5I_DATASET;
    H5Oclose(o);
    if (!is_ds)
        return 0;
    size_t need = strlen(name) + 3;
    if (l->truncated || l->used + need + 8 >= sizeof l->buf) {
        l->truncated = 1;
        return 0;
    }
    l->used += (size_t)snprintf(l->buf + l->used, sizeof l->buf - l->used, "%s/%s",
                                l->count ? ", " : "", name);
    l->count++;
    return 0;
}

static void list_datasets(hid_t file, ds_list *l)
{
    memset(l, 0, sizeof *l);
    H5Lvisit(file, H5_INDEX_NAME, H5_ITER_INC, list_visit, l);
    if (l->count == 0)
        snprintf(l->buf, sizeof l->buf, "none");
    else if (l->truncated)
        snprintf(l->buf + l->used, sizeof l->buf - l->used, ", ...");
}

static tpk_array *read_h5(const char *path, const char *dsname, tpk_ctx *ctx)
{
    FILE *probe = open_input(path, ctx);
    if (probe == NULL)
        return NULL;
    fclose(probe);

    tpk_h5_quiet q;
    tpk_h5_quiet_begin(&q);
    tpk_array *a = NULL;
    hid_t file = -1, obj = -1, space = -1, type = -1;
    ds_list l;

    if (H5Fis_hdf5(path) <= 0) {
        TPK_ERROR(ctx, TPK_EFORMAT, "%s: not an HDF5 file", path);
        goto done;
    }
    file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0) {
        TPK_ERROR(ctx, TPK_EIO, "%s: cannot open HDF5 file", path);
        goto done;
    }
    if (dsname[0] == '\0') {
        list_datasets(file, &l);
        TPK_ERROR(ctx, TPK_EINVAL, "%s: no dataset given; use %s:/name (datasets: %s)", path,
                  path, l.buf);
        goto done;
    }
    obj = H5Oopen(file, dsname, H5P_DEFAULT);
    if (obj < 0) {
        list_datasets(file, &l);
        TPK_ERROR(ctx, TPK_ENOTFOUND, "%s: no dataset '%s' (datasets: %s)", path, dsname, l.buf);
        goto done;
    }
    if (H5Iget_type(obj) != H5I_DATASET) {
        list_datasets(file, &l);
        TPK_ERROR(ctx, TPK_ENOTFOUND, "%s: '%s' is a group, not a dataset (datasets: %s)", path,
                  dsname, l.buf);
        goto done;
    }
    type = H5Dget_type(obj);
    H5T_class_t cls = type < 0 ? H5T_NO_CLASS : H5Tget_class(type);
    if (cls != H5T_FLOAT && cls != H5T_INTEGER) {
        TPK_ERROR(ctx, TPK_EFORMAT, "%s:%s: unsupported datatype (expected float or integer)",
                  path, dsname);
        goto done;
    }
    space = H5Dget_space(obj);
    int nd = space < 0 ? -1 : H5Sget_simple_extent_ndims(space);
    if (nd < 0) {
        TPK_ERROR(ctx, TPK_EFORMAT, "%s:%s: cannot read dataspace", path, dsname);
        goto done;
    }
    hsize_t hd[H5S_MAX_RANK];
    size_t dims[H5S_MAX_RANK];
    H5Sget_simple_extent_dims(space, hd, NULL);
    for (int i = 0; i < nd; i++) {
        dims[i] = (size_t)hd[i];
        if ((hsize_t)dims[i] != hd[i]) {
            TPK_ERROR(ctx, TPK_ENOMEM, "%s:%s: dataset too large", path, dsname);
            goto done;
        }
    }
    char where[1300];
    snprintf(where, sizeof where, "%s:%s", path, dsname);
    a = alloc_shaped(where, nd, dims, ctx);
    if (a == NULL)
        goto done;
    /* HDF5 converts any integer or float file type to native double on the way in. */
    if (H5Dread(obj, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, a->data) < 0) {
        TPK_ERROR(ctx, TPK_EIO, "%s: read failed", where);
        tpk_array_free(a);
        a = NULL;
        goto done;
    }
    if (check_finite(where, a, ctx) != TPK_OK) {
        tpk_array_free(a);
        a = NULL;
    }
done:
    if (type >= 0)
        H5Tclose(type);
    if (space >= 0)
        H5Sclose(space);
    if (obj >= 0)
        H5Oclose(obj);
    if (file >= 0)
        H5Fclose(file);
    tpk_h5_quiet_end(&q);
    return a;
}

int tpk_io_read_attr_str(const char *path, const char *obj, const char *key, char *buf,
                         size_t cap, tpk_ctx *ctx)
{
    if (path == NULL || key == NULL || buf == NULL || cap == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_io_read_attr_str: NULL argument or empty buffer");
    buf[0] = '\0';
    if (obj == NULL || obj[0] == '\0')
        obj = "/";
    FILE *probe = open_input(path, ctx);
    if (probe == NULL)
        return TPK_EIO;
    fclose(probe);

    tpk_h5_quiet q;
    tpk_h5_quiet_begin(&q);
    int st = TPK_OK;
    hid_t file = -1, at = -1, type = -1, mtype = -1;
    char *vl = NULL;
    if (H5Fis_hdf5(path) <= 0) {
        st = TPK_ERROR(ctx, TPK_EFORMAT, "%s: not an HDF5 file", path);
        goto done;
    }
    file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0) {
        st = TPK_ERROR(ctx, TPK_EIO, "%s: cannot open HDF5 file", path);
        goto done;
    }
    if (strcmp(obj, "/") != 0 && H5Lexists(file, obj, H5P_DEFAULT) <= 0) {
        st = TPK_ERROR(ctx, TPK_ENOTFOUND, "%s: no object '%s'", path, obj);
        goto done;
    }
    if (H5Aexists_by_name(file, obj, key, H5P_DEFAULT) <= 0) {
        st = TPK_ERROR(ctx, TPK_ENOTFOUND, "%s: no attribute '%s' on '%s'", path, key, obj);
        goto done;
    }
    at = H5Aopen_by_name(file, obj, key, H5P_DEFAULT, H5P_DEFAULT);
    type = at < 0 ? -1 : H5Aget_type(at);
    if (type < 0 || H5Tget_class(type) != H5T_STRING) {
        st = TPK_ERROR(ctx, TPK_EFORMAT, "%s: attribute '%s' on '%s' is not a string", path, key,
                       obj);
        goto done;
    }
    htri_t var = H5Tis_variable_str(type);
    size_t len = 0;
    if (var > 0) {
        mtype = H5Tcopy(H5T_C_S1);
        if (mtype < 0 || H5Tset_size(mtype, H5T_VARIABLE) < 0 ||
            H5Tset_cset(mtype, H5Tget_cset(type)) < 0 || H5Aread(at, mtype, &vl) < 0) {
            st = TPK_ERROR(ctx, TPK_EIO, "%s: cannot read attribute '%s'", path, key);
            goto done;
        }
        len = vl ? strlen(vl) : 0;
        if (len >= cap) {
            st = TPK_ERROR(ctx, TPK_EINVAL, "%s: attribute '%s' has %zu bytes, more than %zu",
                           path, key, len, cap - 1);
            goto done;
        }
        if (len)
            memcpy(buf, vl, len);
    } else {
        /* Fixed length: the stored size, NUL-padded or not, plus our own terminator. */
        size_t fixed = H5Tget_size(type);
        if (fixed >= cap) {
            st = TPK_ERROR(ctx, TPK_EINVAL, "%s: attribute '%s' has %zu bytes, more than %zu",
                           path, key, fixed, cap - 1);
            goto done;
        }
        mtype = H5Tcopy(type);
        if (mtype < 0 || H5Aread(at, mtype, buf) < 0) {
            st = TPK_ERROR(ctx, TPK_EIO, "%s: cannot read attribute '%s'", path, key);
            goto done;
        }
        buf[fixed] = '\0';
        len = strlen(buf);
    }
    buf[len] = '\0';
done:
    if (vl != NULL)
        H5free_memory(vl);
    if (mtype >= 0)
        H5Tclose(mtype);
    if (type >= 0)
        H5Tclose(type);
    if (at >= 0)
        H5Aclose(at);
    if (file >= 0)
        H5Fclose(file);
    tpk_h5_quiet_end(&q);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* NumPy .npy (format spec: numpy/lib/format.py, versions 1.0, 2.0, 3.0)                      */

typedef struct npy_header {
    char descr[32];
    int have_descr, have_order, have_shape;
    int fortran;
    int ndim;
    size_t dims[READ_MAXDIM];
} npy_header;

typedef struct npy_lex {
    const char *p, *end;
} npy_lex;

static void npy_ws(npy_lex *lx)
{
    while (lx->p < lx->end && isspace((unsigned char)*lx->p))
        lx->p++;
}

static int npy_accept(npy_lex *lx, char c)
{
    npy_ws(lx);
    if (lx->p < lx->end && *lx->p == c) {
        lx->p++;
        return 1;
    }
    return 0;
}

/* string := "'" chars "'" | '"' chars '"' */
static int npy_string(npy_lex *lx, char *out, size_t n)
{
    npy_ws(lx);
    if (lx->p >= lx->end || (*lx->p != '\'' && *lx->p != '"'))
        return -1;
    char q = *lx->p++;
    size_t k = 0;
    while (lx->p < lx->end && *lx->p != q) {
        if (k + 1 >= n)
            return -1;
        out[k++] = *lx->p++;
    }
    if (lx->p >= lx->end)
        return -1;
    lx->p++;
    out[k] = '\0';
    return 0;
}

/* bool := 'True' | 'False' */
static int npy_bool(npy_lex *lx, int *v)
{
    npy_ws(lx);
    size_t left = (size_t)(lx->end - lx->p);
    if (left >= 4 && strncmp(lx->p, "True", 4) == 0) {
        lx->p += 4;
        *v = 1;
        return 0;
    }
    if (left >= 5 && strncmp(lx->p, "False", 5) == 0) {
        lx->p += 5;
        *v = 0;
        return 0;
    }
    return -1;
}

/* tuple := '(' [ int { ',' int } [ ',' ] ] ')'   (Python writes (3,) for a 1-tuple) */
static int npy_shape(npy_lex *lx, npy_header *h)
{
    if (!npy_accept(lx, '('))
        return -1;
    h->ndim = 0;
    for (;;) {
        if (npy_accept(lx, ')'))
            return 0;
        npy_ws(lx);
        if (lx->p >= lx->end || !isdigit((unsigned char)*lx->p))
            return -1;
        unsigned long long v = 0;
        while (lx->p < lx->end && isdigit((unsigned char)*lx->p)) {
            unsigned d = (unsigned)(*lx->p++ - '0');
            if (v > (SIZE_MAX - d) / 10)
                return -1;
            v = v * 10 + d;
        }
        /* Count every dim so "rank 7" is reported, but store only what fits. */
        if (h->ndim < READ_MAXDIM)
            h->dims[h->ndim] = (size_t)v;
        h->ndim++;
        if (!npy_accept(lx, ',')) {
            if (npy_accept(lx, ')'))
                return 0;
            return -1;
        }
    }
}

/* header := '{' { string ':' value ',' } '}'   keys: 'descr', 'fortran_order', 'shape' */
static int npy_parse_header(const char *path, const char *text, size_t len, npy_header *h,
                            tpk_ctx *ctx)
{
    npy_lex lx = {text, text + len};
    memset(h, 0, sizeof *h);
    if (!npy_accept(&lx, '{'))
        return TPK_ERROR(ctx, TPK_EFORMAT, "%s: malformed .npy header (no '{')", path);
    while (!npy_accept(&lx, '}')) {
        char key[32];
        if (npy_string(&lx, key, sizeof key) != 0 || !npy_accept(&lx, ':'))
            return TPK_ERROR(ctx, TPK_EFORMAT, "%s: malformed .npy header", path);
        int bad;
        if (strcmp(key, "descr") == 0) {
            npy_ws(&lx);
            if (lx.p < lx.end && *lx.p == '[')
                return TPK_ERROR(ctx, TPK_EFORMAT,
                                 "%s: structured dtype not supported (expected '<f8' or '<f4')",
                                 path);
            bad = npy_string(&lx, h->descr, sizeof h->descr);
            h->have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0) {
            bad = npy_bool(&lx, &h->fortran);
            h->have_order = 1;
        } else if (strcmp(key, "shape") == 0) {
            bad = npy_shape(&lx, h);
            h->have_shape = 1;
        } else {
            return TPK_ERROR(ctx, TPK_EFORMAT, "%s: unexpected key '%s' in .npy header", path,
                             key);
        }
        if (bad)
            return TPK_ERROR(ctx, TPK_EFORMAT, "%s: malformed '%s' in .npy header", path, key);
        if (!npy_accept(&lx, ',')) {
            if (npy_accept(&lx, '}'))
                break;
            return TPK_ERROR(ctx, TPK_EFORMAT, "%s: malformed .npy header", path);
        }
    }
    if (!h->have_descr || !h->have_order || !h->have_shape)
        return TPK_ERROR(ctx, TPK_EFORMAT, "%s: .npy header lacks '%s'", path,
                         !h->have_descr ? "descr" : !h->have_order ? "fortran_order" : "shape");
    return TPK_OK;
}

/* ---- byte sources: a .npy file, or one member of a .npz (ZIP) archive, stored or deflated ---- */

#define NPZ_CHUNK (1u << 16)

typedef struct npy_src {
    FILE *f;
    int deflated;            /* a deflated .npz member (else the bytes are read as they are) */
    uint64_t left;           /* bytes of the member (compressed) not yet read from f */
    z_stream z;
    int z_live;
    unsigned char *zin;      /* NPZ_CHUNK bytes of compressed input */
    uint32_t crc;            /* CRC-32 of what was handed out (.npz members carry one) */
    int corrupt;             /* inflate failed */
} npy_src;

/* n bytes into dst: 0, or -1 when the source ends first (or is corrupt: src->corrupt). */
static int src_read(npy_src *src, void *dst, size_t n)
{
    unsigned char *out = dst;
    if (!src->deflated) {
        if (src->left != UINT64_MAX && (uint64_t)n > src->left)
            return -1;
        if (fread(out, 1, n, src->f) != n)
            return -1;
        if (src->left != UINT64_MAX)
            src->left -= n;
        src->crc = (uint32_t)crc32(src->crc, out, (uInt)n);
        return 0;
    }
    size_t got = 0;
    while (got < n) {
        if (src->z.avail_in == 0 && src->left > 0) {
            size_t k = src->left < NPZ_CHUNK ? (size_t)src->left : NPZ_CHUNK;
            if (fread(src->zin, 1, k, src->f) != k)
                return -1;
            src->left -= k;
            src->z.next_in = src->zin;
            src->z.avail_in = (uInt)k;
        }
        size_t want = n - got > (1u << 30) ? (1u << 30) : n - got;
        src->z.next_out = out + got;
        src->z.avail_out = (uInt)want;
        int zr = inflate(&src->z, Z_NO_FLUSH);
        size_t made = want - src->z.avail_out;
        src->crc = (uint32_t)crc32(src->crc, out + got, (uInt)made);
        got += made;
        if (zr == Z_STREAM_END && got < n)
            return -1;
        if (zr != Z_OK && zr != Z_STREAM_END && !(zr == Z_BUF_ERROR && made > 0)) {
            src->corrupt = 1;
            return -1;
        }
        if (made == 0 && src->z.avail_in == 0 && src->left == 0)
            return -1;
    }
    return 0;
}

/* ---- dtypes ------------------------------------------------------------------------------------ */

/* descr := byteorder kind size: byteorder '<' '>' '|' '=' (np.save writes '<', '>' or '|'),
 * kind 'f' (2, 4, 8 bytes), 'i' / 'u' (1, 2, 4, 8), 'b' (1: bool). */
typedef struct npy_dtype {
    char kind;
    size_t size;
    int big;
} npy_dtype;

static int npy_dtype_parse(const char *d, npy_dtype *t)
{
    if (!strchr("<>|=", d[0]) || !d[1] || !strchr("fiub", d[1]))
        return -1;
    char *end;
    long n = strtol(d + 2, &end, 10);
    if (*end != '\0' || end == d + 2)
        return -1;
    t->kind = d[1];
    t->size = (size_t)n;
    t->big = d[0] == '>';
    if (t->kind == 'f')
        return n == 2 || n == 4 || n == 8 ? 0 : -1;
    if (t->kind == 'b')
        return n == 1 ? 0 : -1;
    return n == 1 || n == 2 || n == 4 || n == 8 ? 0 : -1;
}

static uint64_t load_un(const unsigned char *b, size_t n, int big)
{
    uint64_t u = 0;
    for (size_t i = 0; i < n; i++)
        u |= (uint64_t)b[big ? n - 1 - i : i] << (8 * i);
    return u;
}

static uint32_t load_u32(const unsigned char *b, int big)
{
    return (uint32_t)load_un(b, 4, big);
}

/* IEEE binary16 to double: sign, 5-bit exponent, 10-bit mantissa (subnormals, inf, NaN). */
static double half_to_double(uint16_t h)
{
    int e = (h >> 10) & 0x1f;
    double m = (double)(h & 0x3ff), v;
    if (e == 0)
        v = ldexp(m, -24);
    else if (e == 31)
        v = m == 0 ? INFINITY : NAN;
    else
        v = ldexp(m + 1024.0, e - 25);
    return h & 0x8000 ? -v : v;
}

/* One element of dtype t at b as a double (64-bit integers beyond 2^53 round). */
static double npy_value(const unsigned char *b, const npy_dtype *t)
{
    uint64_t u = load_un(b, t->size, t->big);
    switch (t->kind) {
    case 'f':
        if (t->size == 8) {
            double x;
            memcpy(&x, &u, 8);
            return x;
        }
        if (t->size == 4) {
            uint32_t w = (uint32_t)u;
            float x;
            memcpy(&x, &w, 4);
            return (double)x;
        }
        return half_to_double((uint16_t)u);
    case 'i': {
        if (t->size < 8 && (u >> (8 * t->size - 1)) & 1)
            u |= ~(uint64_t)0 << (8 * t->size); /* sign-extend */
        int64_t x;
        memcpy(&x, &u, 8);
        return (double)x;
    }
    case 'u':
        return (double)u;
    default: /* 'b' */
        return u != 0;
    }
}

/* Fortran (column-major) order in `in` to C (row-major) order in `out`, both of shape dims. */
static void fortran_to_c(const double *in, double *out, int ndim, const size_t *dims)
{
    size_t stride[READ_MAXDIM], idx[READ_MAXDIM] = {0}, n = 1;
    for (int k = ndim - 1; k >= 0; k--) {
        stride[k] = n;
        n *= dims[k];
    }
    size_t off = 0; /* C offset of the current Fortran-order element */
    for (size_t i = 0; i < n; i++) {
        out[off] = in[i];
        for (int k = 0; k < ndim; k++) { /* the first axis varies fastest */
            if (++idx[k] < dims[k]) {
                off += stride[k];
                break;
            }
            off -= (dims[k] - 1) * stride[k];
            idx[k] = 0;
        }
    }
}

/* A .npy stream from src: `total` bytes in all (UINT64_MAX: unknown). `what` names it in
 * messages ("x.npy", "d.npz:x"). */
static tpk_array *npy_decode(const char *what, npy_src *src, uint64_t total, tpk_ctx *ctx)
{
    tpk_array *a = NULL;
    char *text = NULL;
    unsigned char *raw = NULL;
    double *tmp = NULL;
    unsigned char pre[12];
    size_t prelen;

    if (src_read(src, pre, 10) != 0 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        TPK_ERROR(ctx, TPK_EFORMAT, "%s: not a .npy file (bad magic)", what);
        goto done;
    }
    /* v1 has a 2-byte header length, v2/v3 a 4-byte one; v3 only adds UTF-8 in the header. */
    unsigned major = pre[6], minor = pre[7];
    size_t hlen;
    if (major == 1) {
        hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
        prelen = 10;
    } else if (major == 2 || major == 3) {
        if (src_read(src, pre + 10, 2) != 0) {
            TPK_ERROR(ctx, TPK_EFORMAT, "%s: truncated .npy header", what);
            goto done;
        }
        hlen = load_u32(pre + 8, 0);
        prelen = 12;
    } else {
        TPK_ERROR(ctx, TPK_EFORMAT, "%s: unsupported .npy format version %u.%u", what, major,
                  minor);
        goto done;
    }
    if (hlen > NPY_MAX_HEADER) {
        TPK_ERROR(ctx, TPK_EFORMAT, "%s: .npy header of %zu bytes is implausibly long", what,
                  hlen);
        goto done;
    }
    text = tpk_malloc(ctx, hlen + 1);
    if (text == NULL) {
        TPK_ERROR(ctx, TPK_ENOMEM, "%s: out of memory", what);
        goto done;
    }
    if (src_read(src, text, hlen) != 0) {
        TPK_ERROR(ctx, TPK_EFORMAT, "%s: truncated .npy header", what);
        goto done;
    }
    text[hlen] = '\0';
    npy_header h;
    if (npy_parse_header(what, text, hlen, &h, ctx) != TPK_OK)
        goto done;
    npy_dtype t;
    if (npy_dtype_parse(h.descr, &t) != 0) {
        TPK_ERROR(ctx, TPK_EFORMAT, "%s: unsupported dtype '%s' (expected real numbers: float16, "
                  "float32, float64, signed or unsigned integers, bool; not complex, strings or "
                  "records)", what, h.descr);
        goto done;
    }
    /* The data the header announces must be what the file (or archive member) holds: checked
     * before allocating, so a corrupt shape is a format error, not a huge allocation. */
    uint64_t want = t.size;
    for (int i = 0; i < h.ndim && i < READ_MAXDIM; i++)
        want = h.dims[i] && want > UINT64_MAX / 16 / h.dims[i] ? UINT64_MAX / 16 : want * h.dims[i];
    if (total != UINT64_MAX && h.ndim >= 1 && h.ndim <= TPK_ARRAY_MAXDIM && want > 0 &&
        total - (prelen + hlen) != want) {
        char sb[160];
        shape_str(h.ndim, h.dims, sb, sizeof sb);
        TPK_ERROR(ctx, TPK_EFORMAT, "%s: expected %llu bytes of data for %s shape %s, found %lld",
                  what, (unsigned long long)want, h.descr, sb,
                  (long long)(total - (prelen + hlen)));
        goto done;
    }
    a = alloc_shaped(what, h.ndim, h.dims, ctx);
    if (a == NULL)
        goto done;
    size_t n = tpk_array_size(a);
    /* Fortran order: read in file order into a scratch buffer, then transpose into C order. */
    double *dst = a->data;
    if (h.fortran && h.ndim > 1) {
        if (!(tmp = tpk_malloc(ctx, n * sizeof *tmp))) {
            TPK_ERROR(ctx, TPK_ENOMEM, "%s: out of memory", what);
            goto fail;
        }
        dst = tmp;
    }
    if (t.kind == 'f' && t.size == 8 && !t.big) {
        if (src_read(src, dst, n * 8) != 0) /* little-endian float64: straight in */
            goto short_data;
        if (1 != *(const unsigned char *)&(const uint16_t){1}) { /* a big-endian host */
            unsigned char *b = (unsigned char *)dst;
            for (size_t i = 0; i < n; i++) {
                uint64_t u = load_un(b + 8 * i, 8, 0);
                memcpy(&dst[i], &u, 8);
            }
        }
    } else {
        const size_t per = NPZ_CHUNK / t.size;
        if (!(raw = tpk_malloc(ctx, per * t.size))) {
            TPK_ERROR(ctx, TPK_ENOMEM, "%s: out of memory", what);
            goto fail;
        }
        for (size_t i = 0; i < n; i += per) {
            size_t k = n - i < per ? n - i : per;
            if (src_read(src, raw, k * t.size) != 0)
                goto short_data;
            for (size_t j = 0; j < k; j++)
                dst[i + j] = npy_value(raw + j * t.size, &t);
        }
    }
    if (dst != a->data)
        fortran_to_c(dst, a->data, h.ndim, h.dims);
    if (check_finite(what, a, ctx) != TPK_OK)
        goto fail;
    goto done;
short_data:
    TPK_ERROR(ctx, TPK_EFORMAT, src->corrupt ? "%s: corrupt compressed data" :
              "%s: truncated .npy data", what);
fail:
    tpk_array_free(a);
    a = NULL;
done:
    tpk_free(ctx, tmp);
    tpk_free(ctx, raw);
    tpk_free(ctx, text);
    return a;
}

static tpk_array *read_npy(const char *path, tpk_ctx *ctx)
{
    FILE *f = open_input(path, ctx);
    if (f == NULL)
        return NULL;
    struct stat st;
    npy_src src = {.f = f, .left = UINT64_MAX};
    uint64_t total = fstat(fileno(f), &st) == 0 ? (uint64_t)st.st_size : UINT64_MAX;
    tpk_array *a = npy_decode(path, &src, total, ctx);
    fclose(f);
    return a;
}

/* ---- .npz: a ZIP archive of NAME.npy members (np.savez stores, np.savez_compressed deflates) --
 * Read from the central directory (APPNOTE.TXT 4.3.12; ZIP64 sizes and offsets from the extra
 * field 0x0001, 4.5.3), each member checked against its CRC-32. */

#define ZIP_EOCD_MAX (22 + 65535) /* end record plus the longest archive comment */

typedef struct zip_entry {
    char name[256];
    int method;              /* 0 stored, 8 deflated */
    int flags;
    uint32_t crc;
    uint64_t csize, usize, local;
} zip_entry;

static uint64_t le(const unsigned char *b, size_t n)
{
    return load_un(b, n, 0);
}

/* The central directory: its offset and entry count, from the end record (or the ZIP64 one). */
static int zip_directory(FILE *f, const char *path, uint64_t *off, uint64_t *count, tpk_ctx *ctx)
{
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size < 22)
        return TPK_ERROR(ctx, TPK_EFORMAT, "%s: not a .npz file (too short for a ZIP archive)",
                         path);
    uint64_t size = (uint64_t)st.st_size, k = size < ZIP_EOCD_MAX ? size : ZIP_EOCD_MAX;
    unsigned char *b = tpk_malloc(ctx, k);
    if (!b)
        return TPK_ERROR(ctx, TPK_ENOMEM, "%s: out of memory", path);
    int st2 = TPK_EFORMAT;
    if (fseeko(f, (off_t)(size - k), SEEK_SET) == 0 && fread(b, 1, k, f) == k) {
        for (uint64_t i = k - 22 + 1; i-- > 0;) {
            if (le(b + i, 4) != 0x06054b50)
                continue;
            *count = le(b + i + 10, 2);
            *off = le(b + i + 16, 4);
            st2 = TPK_OK;
            if ((*off == 0xffffffffu || *count == 0xffff) && i >= 20 &&
                le(b + i - 20, 4) == 0x07064b50) { /* ZIP64 end locator, then record */
                unsigned char r[56];
                uint64_t roff = le(b + i - 20 + 8, 8);
                if (fseeko(f, (off_t)roff, SEEK_SET) != 0 || fread(r, 1, 56, f) != 56 ||
                    le(r, 4) != 0x06064b50)
                    st2 = TPK_EFORMAT;
                else {
                    *count = le(r + 32, 8);
                    *off = le(r + 48, 8);
                }
            }
            break;
        }
    }
    tpk_free(ctx, b);
    if (st2)
        return TPK_ERROR(ctx, TPK_EFORMAT, "%s: not a .npz file (no ZIP end-of-directory record)",
                         path);
    return TPK_OK;
}

/* Every entry of the directory; *names gets "a, b, c" for messages. Returns the entry called
 * `want` ("" and only one entry: that one) in *hit, or hit->name[0] = '\0'. */
static int zip_find(FILE *f, const char *path, const char *want, zip_entry *hit, char *names,
                    size_t nlen, size_t *nentries, tpk_ctx *ctx)
{
    uint64_t off = 0, count = 0;
    if (zip_directory(f, path, &off, &count, ctx))
        return ctx->status;
    hit->name[0] = '\0';
    names[0] = '\0';
    *nentries = 0;
    if (fseeko(f, (off_t)off, SEEK_SET) != 0)
        return TPK_ERROR(ctx, TPK_EFORMAT, "%s: corrupt ZIP directory", path);
    size_t used = 0;
    /* names and extra fields are at most 65535 bytes each (16-bit lengths) */
    char *name = tpk_malloc(ctx, 65536);
    unsigned char *extra = tpk_malloc(ctx, 65536);
    int st = TPK_OK;
    if (!name || !extra)
        st = TPK_ERROR(ctx, TPK_ENOMEM, "%s: out of memory", path);
    for (uint64_t e = 0; e < count && !st; e++) {
        unsigned char c[46];
        if (fread(c, 1, 46, f) != 46 || le(c, 4) != 0x02014b50) {
            st = TPK_ERROR(ctx, TPK_EFORMAT, "%s: corrupt ZIP directory (entry %llu)", path,
                           (unsigned long long)e);
            break;
        }
        zip_entry z = {.flags = (int)le(c + 8, 2), .method = (int)le(c + 10, 2),
                       .crc = (uint32_t)le(c + 16, 4), .csize = le(c + 20, 4),
                       .usize = le(c + 24, 4), .local = le(c + 42, 4)};
        size_t fn = le(c + 28, 2), xn = le(c + 30, 2), cn = le(c + 32, 2);
        if (fread(name, 1, fn, f) != fn || fread(extra, 1, xn, f) != xn ||
            fseeko(f, (off_t)cn, SEEK_CUR) != 0) {
            st = TPK_ERROR(ctx, TPK_EFORMAT, "%s: corrupt ZIP directory", path);
            break;
        }
        name[fn] = '\0';
        for (size_t x = 0; x + 4 <= xn;) { /* ZIP64: the 8-byte values that did not fit */
            size_t id = le(extra + x, 2), len = le(extra + x + 2, 2), q = x + 4;
            if (id == 0x0001) {
                if (z.usize == 0xffffffffu && q + 8 <= x + 4 + len)
                    z.usize = le(extra + q, 8), q += 8;
                if (z.csize == 0xffffffffu && q + 8 <= x + 4 + len)
                    z.csize = le(extra + q, 8), q += 8;
                if (z.local == 0xffffffffu && q + 8 <= x + 4 + len)
                    z.local = le(extra + q, 8);
            }
            x += 4 + len;
        }
        /* the array name is the member name less ".npy" (np.savez's convention) */
        if (fn > 4 && strcmp(name + fn - 4, ".npy") == 0)
            name[fn - 4] = '\0';
        if (used < nlen)
            used += (size_t)snprintf(names + used, nlen - used, "%s%s", e ? ", " : "", name);
        (*nentries)++;
        if ((want[0] && strcmp(name, want) == 0) || (!want[0] && count == 1)) {
            *hit = z;
            snprintf(hit->name, sizeof hit->name, "%s", name);
        }
    }
    tpk_free(ctx, name);
    tpk_free(ctx, extra);
    return st;
}

static tpk_array *read_npz(const char *path, const char *member, tpk_ctx *ctx)
{
    FILE *f = open_input(path, ctx);
    if (f == NULL)
        return NULL;
    tpk_array *a = NULL;
    zip_entry z;
    char names[512], what[1400];
    size_t n = 0;
    npy_src src = {.f = f};
    if (zip_find(f, path, member, &z, names, sizeof names, &n, ctx))
        goto done;
    if (!z.name[0]) {
        if (!member[0])
            TPK_ERROR(ctx, TPK_EINVAL, "%s: %zu arrays in the archive: name one as %s:NAME "
                      "(arrays: %s)", path, n, path, names);
        else
            TPK_ERROR(ctx, TPK_ENOTFOUND, "%s: no array '%s' in the archive (arrays: %s)", path,
                      member, n ? names : "none");
        goto done;
    }
    snprintf(what, sizeof what, "%s:%s", path, z.name);
    if (z.flags & 1) {
        TPK_ERROR(ctx, TPK_EUNSUPPORTED, "%s: the member is encrypted", what);
        goto done;
    }
    if (z.method != 0 && z.method != 8) {
        TPK_ERROR(ctx, TPK_EUNSUPPORTED, "%s: ZIP compression method %d is not supported "
                  "(np.savez stores, np.savez_compressed deflates)", what, z.method);
        goto done;
    }
    unsigned char lh[30];
    if (fseeko(f, (off_t)z.local, SEEK_SET) != 0 || fread(lh, 1, 30, f) != 30 ||
        le(lh, 4) != 0x04034b50 ||
        fseeko(f, (off_t)(le(lh + 26, 2) + le(lh + 28, 2)), SEEK_CUR) != 0) {
        TPK_ERROR(ctx, TPK_EFORMAT, "%s: corrupt ZIP member header", what);
        goto done;
    }
    src.left = z.csize;
    src.deflated = z.method == 8;
    if (src.deflated) {
        if (!(src.zin = tpk_malloc(ctx, NPZ_CHUNK))) {
            TPK_ERROR(ctx, TPK_ENOMEM, "%s: out of memory", what);
            goto done;
        }
        if (inflateInit2(&src.z, -MAX_WBITS) != Z_OK) { /* raw deflate, as ZIP stores it */
            TPK_ERROR(ctx, TPK_ENOMEM, "%s: cannot start inflating", what);
            goto done;
        }
        src.z_live = 1;
    }
    a = npy_decode(what, &src, z.usize, ctx);
    if (a && src.crc != z.crc) {
        TPK_ERROR(ctx, TPK_EFORMAT, "%s: CRC-32 mismatch (the archive is corrupt)", what);
        tpk_array_free(a);
        a = NULL;
    }
done:
    if (src.z_live)
        inflateEnd(&src.z);
    tpk_free(ctx, src.zin);
    fclose(f);
    return a;
}

/* ------------------------------------------------------------------------------------------ */
/* CSV: numbers separated by commas, one row per line; an optional header line is skipped.    */

/* Parse one field [s, e) as a double. strtod follows LC_NUMERIC; tpk never calls setlocale,
 * so unless the embedding program does, '.' is the decimal point. */
static int parse_field(const char *s, const char *e, double *v)
{
    while (s < e && isspace((unsigned char)*s))
        s++;
    while (e > s && isspace((unsigned char)e[-1]))
        e--;
    if (s == e)
        return -1;
    char tmp[128];
    size_t k = (size_t)(e - s);
    if (k >= sizeof tmp)
        return -1;
    memcpy(tmp, s, k);
    tmp[k] = '\0';
    char *end;
    errno = 0;
    *v = strtod(tmp, &end);
    /* ERANGE underflow (denormals) is fine: strtod still returns the nearest value. Overflow
     * returns ±HUGE_VAL, which the finiteness check below reports. */
    return *end == '\0' ? 0 : -1;
}

/* The end of the field that starts at s: the next ',' or the end of the line. */
static const char *field_end(const char *s)
{
    const char *e = strchr(s, ',');
    return e ? e : s + strlen(s);
}

/* Whether none of the line's fields parses as a number. */
static int is_header(const char *line)
{
    double v;
    for (const char *s = line, *e = field_end(s);; s = e + 1, e = field_end(s))
        if (parse_field(s, e, &v) == 0)
            return 0;
        else if (*e != ',')
            return 1;
}

static size_t count_fields(const char *line)
{
    size_t n = 1;
    for (const char *p = line; *p; p++)
        n += *p == ',';
    return n;
}

static int is_blank(const char *s)
{
    for (; *s; s++)
        if (!isspace((unsigned char)*s))
            return 0;
    return 1;
}

/* getline(3) with the line from ctx's allocator (tpk/alloc.h): the length read, NUL bytes
 * included; -1 at the end of the file or on a read error (ferror tells); -2 when out of memory
 * (ctx has the error). */
static ssize_t read_line(FILE *f, char **line, size_t *cap, tpk_ctx *ctx)
{
    size_t len = 0;
    int c = EOF;
    for (;;) {
        if (*line == NULL || *cap - len < 2) {
            size_t ncap = *cap ? *cap * 2 : 256;
            char *nl = ncap > *cap ? tpk_realloc(ctx, *line, ncap) : NULL;
            if (nl == NULL) {
                TPK_ERROR(ctx, TPK_ENOMEM, "out of memory (a line of %zu bytes)", len);
                return -2;
            }
            *line = nl;
            *cap = ncap;
        }
        if ((c = getc_unlocked(f)) == EOF)
            break;
        (*line)[len++] = (char)c;
        if (c == '\n')
            break;
    }
    (*line)[len] = '\0';
    return len == 0 && c == EOF ? -1 : (ssize_t)len;
}

static tpk_array *read_csv(const char *path, tpk_ctx *ctx)
{
    FILE *f = open_input(path, ctx);
    if (f == NULL)
        return NULL;
    char *line = NULL;
    size_t cap = 0;
    double *vals = NULL;
    size_t nvals = 0, vcap = 0, ncols = 0, nrows = 0, lineno = 0, blank_at = 0;
    int seen_content = 0, ok = 0;
    ssize_t len;
    tpk_array *a = NULL;

    while ((len = read_line(f, &line, &cap, ctx)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (is_blank(line)) {
            if (nrows > 0 && blank_at == 0)
                blank_at = lineno;
            continue;
        }
        if (blank_at != 0) {
            /* Blank lines are fine at the end; in the middle they usually mean two files were
             * concatenated, which would silently shift rows. */
            TPK_ERROR(ctx, TPK_EFORMAT, "%s:%zu: blank line inside the data", path, blank_at);
            goto done;
        }
        size_t nf = count_fields(line);
        if (nrows > 0 && nf != ncols) {
            TPK_ERROR(ctx, TPK_EFORMAT, "%s:%zu: expected %zu columns, found %zu", path, lineno,
                      ncols, nf);
            goto done;
        }
        if (nvals + nf > vcap) {
            size_t nc = vcap ? vcap : 1024;
            while (nc < nvals + nf) {
                if (nc > SIZE_MAX / 2 / sizeof(double))
                    break;
                nc *= 2;
            }
            double *nv = nc >= nvals + nf ? tpk_realloc(ctx, vals, nc * sizeof *vals) : NULL;
            if (nv == NULL) {
                TPK_ERROR(ctx, TPK_ENOMEM, "%s:%zu: out of memory", path, lineno);
                goto done;
            }
            vals = nv;
            vcap = nc;
        }
        /* The first non-blank line is a header only when none of its fields is a number, and
         * that is said (issue 18: "1,2,abc" was taken as a header, silently dropping a row). */
        if (!seen_content && is_header(line)) {
            seen_content = 1;
            tpk_note(ctx, "%s:%zu: taken as a header line, not data (none of its fields is a "
                     "number): '%.60s'", path, lineno, line);
            continue;
        }
        const char *s = line;
        for (size_t c = 0; c < nf; c++) {
            const char *e = field_end(s);
            double v;
            if (parse_field(s, e, &v) != 0) {
                int w = (int)(e - s);
                TPK_ERROR(ctx, TPK_EFORMAT, "%s:%zu: column %zu: '%.*s' is not a number%s", path,
                          lineno, c + 1, w > 40 ? 40 : w, s,
                          seen_content ? "" : " (a header line has no numbers)");
                goto done;
            }
            if (!isfinite(v)) {
                TPK_ERROR(ctx, TPK_EDOM, "%s:%zu: non-finite value at row %zu, column %zu", path,
                          lineno, nrows + 1, c + 1);
                goto done;
            }
            vals[nvals + c] = v;
            s = e + (*e == ',');
        }
        seen_content = 1;
        if (nrows == 0)
            ncols = nf;
        nvals += nf;
        nrows++;
    }
    if (len == -2)
        goto done;
    if (ferror(f)) {
        char eb[128];
        TPK_ERROR(ctx, TPK_EIO, "%s: %s", path, tpk_io_errstr(errno, eb, sizeof eb));
        goto done;
    }
    if (nrows == 0) {
        TPK_ERROR(ctx, TPK_EFORMAT, "%s: no data rows", path);
        goto done;
    }
    ok = 1;
done:
    tpk_free(ctx, line);
    fclose(f);
    if (ok) {
        /* Always rank 2: a CSV has no way to say more. */
        a = tpk_array_alloc2(nrows, ncols, ctx);
        if (a != NULL)
            memcpy(a->data, vals, nvals * sizeof *vals);
    }
    tpk_free(ctx, vals);
    return a;
}

/* ------------------------------------------------------------------------------------------ */
/* Entry point                                                                                */

tpk_array *tpk_io_read(const char *spec, tpk_input_info *info, tpk_ctx *ctx)
{
    if (info != NULL)
        memset(info, 0, sizeof *info);
    if (spec == NULL || spec[0] == '\0') {
        TPK_ERROR(ctx, TPK_EINVAL, "empty input specification");
        return NULL;
    }
    const char *dataset;
    size_t plen = tpk__io_spec_split(spec, &dataset);
    char path[sizeof info->path];
    char ds[sizeof info->dataset];
    if (plen >= sizeof path) {
        TPK_ERROR(ctx, TPK_EINVAL, "input path too long (%zu bytes, at most %zu)", plen,
                  sizeof path - 1);
        return NULL;
    }
    memcpy(path, spec, plen);
    path[plen] = '\0';
    /* "file.h5:x" means "/x": HDF5 resolves relative names from the root anyway, but the
     * recorded provenance should be one spelling. A .npz member keeps its name. */
    const int npz = tpk__io_ends_with_ci(path, plen, ".npz");
    int need_slash = !npz && dataset[0] != '\0' && dataset[0] != '/';
    if (strlen(dataset) + (size_t)need_slash >= sizeof ds) {
        TPK_ERROR(ctx, TPK_EINVAL, "%s: dataset name too long", path);
        return NULL;
    }
    /* the length was checked above: copy rather than snprintf (GCC cannot see the check) */
    ds[0] = '/';
    memcpy(ds + need_slash, dataset, strlen(dataset) + 1);

    const char *format;
    tpk_array *a;
    if (tpk__io_ends_with_ci(path, plen, ".h5") || tpk__io_ends_with_ci(path, plen, ".hdf5")) {
        format = "hdf5";
        a = read_h5(path, ds, ctx);
    } else if (tpk__io_ends_with_ci(path, plen, ".npy")) {
        format = "npy";
        a = read_npy(path, ctx);
    } else if (npz) {
        format = "npz";
        a = read_npz(path, ds + need_slash, ctx);
    } else if (tpk__io_ends_with_ci(path, plen, ".csv")) {
        format = "csv";
        a = read_csv(path, ctx);
    } else {
        TPK_ERROR(ctx, TPK_EINVAL,
                  "%s: unrecognised input format (expected file.h5:/dataset, file.npy, "
                  "file.npz:name or file.csv)",
                  spec);
        return NULL;
    }
    if (a == NULL)
        return NULL;
    if (info != NULL) {
        memcpy(info->path, path, plen + 1);
        snprintf(info->dataset, sizeof info->dataset, "%s", ds);
        snprintf(info->format, sizeof info->format, "%s", format);
        tpk_sha256_array_hex(a, info->sha256);
    }
    return a;
}
