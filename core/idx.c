/* IDX reader over zlib's gz* stream (plain files read through unchanged). */
#include "tpk/idx.h"
#include "tpk/alloc.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

/* Bytes per gzread call: large enough to amortise the call, small enough for a stack-free loop. */
#define IDX_CHUNK (1u << 20)

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

int tpk_idx_name_matches(const char *path)
{
    return path && (ends_with(path, "-ubyte") || ends_with(path, "-ubyte.gz") ||
                    ends_with(path, ".idx") || ends_with(path, ".idx.gz"));
}

static size_t type_size(int t)
{
    switch (t) {
    case 0x08: case 0x09: return 1;
    case 0x0B: return 2;
    case 0x0C: case 0x0D: return 4;
    case 0x0E: return 8;
    default: return 0;
    }
}

static uint64_t be(const unsigned char *p, size_t k)
{
    uint64_t v = 0;
    for (size_t i = 0; i < k; i++)
        v = v << 8 | p[i];
    return v;
}

static double decode(const unsigned char *p, int t)
{
    switch (t) {
    case 0x08: return (double)p[0];
    case 0x09: return (double)(int8_t)p[0];
    case 0x0B: return (double)(int16_t)(uint16_t)be(p, 2);
    case 0x0C: return (double)(int32_t)(uint32_t)be(p, 4);
    case 0x0D: {
        uint32_t u = (uint32_t)be(p, 4);
        float f;
        memcpy(&f, &u, sizeof f);
        return (double)f;
    }
    default: {
        uint64_t u = be(p, 8);
        double d;
        memcpy(&d, &u, sizeof d);
        return d;
    }
    }
}

/* Read exactly len bytes; 0 on success, else the number actually read is in *got. */
static int read_full(gzFile g, unsigned char *buf, size_t len, size_t *got)
{
    size_t done = 0;
    while (done < len) {
        unsigned want = (unsigned)(len - done < IDX_CHUNK ? len - done : IDX_CHUNK);
        int k = gzread(g, buf + done, want);
        if (k <= 0)
            break;
        done += (size_t)k;
    }
    *got = done;
    return done == len ? 0 : -1;
}

static int read_error(gzFile g, const char *path, const char *what, size_t want, size_t got,
                      tpk_ctx *ctx)
{
    int zerr = Z_OK;
    const char *msg = gzerror(g, &zerr);
    if (zerr != Z_OK && zerr != Z_STREAM_END)
        return TPK_ERROR(ctx, TPK_EFORMAT, "%s: corrupt compressed data in the %s: %s", path, what,
                         zerr == Z_ERRNO ? strerror(errno) : msg);
    return TPK_ERROR(ctx, TPK_EFORMAT, "%s: truncated IDX file: the %s needs %zu bytes, found %zu",
                     path, what, want, got);
}

tpk_array *tpk_idx_read(const char *path, size_t max_items, tpk_ctx *ctx)
{
    if (!path || !*path) {
        TPK_ERROR(ctx, TPK_EINVAL, "no IDX file name given");
        return NULL;
    }
    gzFile g = gzopen(path, "rb");
    if (!g) {
        TPK_ERROR(ctx, TPK_EIO, "%s: cannot open: %s", path, errno ? strerror(errno) : "zlib error");
        return NULL;
    }
    gzbuffer(g, 1u << 18);
    tpk_array *a = NULL;
    unsigned char *buf = NULL;
    unsigned char hdr[4 + 4 * 255];
    size_t got = 0;
    if (read_full(g, hdr, 4, &got)) {
        read_error(g, path, "header", 4, got, ctx);
        goto done;
    }
    const int type = hdr[2], rank = hdr[3];
    const size_t es = type_size(type);
    if (hdr[0] != 0 || hdr[1] != 0 || es == 0) {
        TPK_ERROR(ctx, TPK_EFORMAT,
                  "%s: not an IDX file (magic bytes %02x %02x %02x %02x; expected 00 00 then a "
                  "type in {08,09,0B,0C,0D,0E})", path, hdr[0], hdr[1], hdr[2], hdr[3]);
        goto done;
    }
    if (rank < 1 || rank > TPK_ARRAY_MAXDIM) {
        TPK_ERROR(ctx, TPK_EFORMAT, "%s: IDX rank %d is outside the supported 1..%d", path, rank,
                  TPK_ARRAY_MAXDIM);
        goto done;
    }
    if (read_full(g, hdr + 4, 4 * (size_t)rank, &got)) {
        read_error(g, path, "dimension list", 4 * (size_t)rank, got, ctx);
        goto done;
    }
    size_t dims[TPK_ARRAY_MAXDIM], item = 1;
    for (int i = 0; i < rank; i++) {
        dims[i] = (size_t)be(hdr + 4 + 4 * i, 4);
        if (i > 0) {
            if (dims[i] != 0 && item > SIZE_MAX / 16 / dims[i]) {
                TPK_ERROR(ctx, TPK_EFORMAT, "%s: IDX dimensions overflow", path);
                goto done;
            }
            item *= dims[i];
        }
    }
    if (max_items > 0 && dims[0] > max_items)
        dims[0] = max_items;
    if (dims[0] != 0 && item > SIZE_MAX / 16 / dims[0]) {
        TPK_ERROR(ctx, TPK_EFORMAT, "%s: IDX dimensions overflow", path);
        goto done;
    }
    if (tpk_array_check_memory(dims[0] * item, path, ctx)) /* a corrupt header's dimensions */
        goto done;
    struct stat sb; /* an uncompressed file must hold the data its header announces */
    if (gzdirect(g) && stat(path, &sb) == 0 &&
        (uint64_t)sb.st_size < 4 + 4 * (uint64_t)rank + (uint64_t)dims[0] * item * es) {
        TPK_ERROR(ctx, TPK_EFORMAT, "%s: truncated IDX data: the header's dimensions need %llu "
                  "bytes, the file has %lld", path,
                  (unsigned long long)(4 + 4 * (uint64_t)rank + (uint64_t)dims[0] * item * es),
                  (long long)sb.st_size);
        goto done;
    }
    a = tpk_array_alloc(rank, dims, ctx);
    if (!a)
        goto done;
    const size_t total = tpk_array_size(a);
    const size_t per = IDX_CHUNK / es;
    buf = tpk_malloc(ctx, IDX_CHUNK);
    if (!buf) {
        TPK_ERROR(ctx, TPK_ENOMEM, "out of memory");
        goto fail;
    }
    for (size_t off = 0; off < total; off += per) {
        size_t k = total - off < per ? total - off : per;
        if (read_full(g, buf, k * es, &got)) {
            read_error(g, path, "data", total * es, off * es + got, ctx);
            goto fail;
        }
        for (size_t i = 0; i < k; i++)
            a->data[off + i] = decode(buf + i * es, type);
    }
    if (type == 0x0D || type == 0x0E)
        for (size_t i = 0; i < total; i++)
            if (!isfinite(a->data[i])) {
                TPK_ERROR(ctx, TPK_EDOM, "%s: non-finite value at flat index %zu", path, i);
                goto fail;
            }
    goto done;
fail:
    tpk_array_free(a);
    a = NULL;
done:
    tpk_free(ctx, buf);
    gzclose(g);
    return a;
}
