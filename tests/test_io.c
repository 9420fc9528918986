/* Readers (.npy of every real dtype and order, .npz, CSV, HDF5), SHA-256 fingerprints and the atomic HDF5 writer, every error path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include "tpk/io.h"

/* ------------------------------------------------------------------------------------------ */
/* Fixture: a fresh temp directory per test, removed afterwards.                              */

typedef struct fixture {
    char dir[64];
    char buf[4][1200]; /* scratch paths */
    tpk_ctx ctx;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    if (f == NULL)
        return -1;
    snprintf(f->dir, sizeof f->dir, "/tmp/tpk_test_io_XXXXXX");
    if (mkdtemp(f->dir) == NULL) {
        free(f);
        return -1;
    }
    tpk_ctx_init(&f->ctx);
    *state = f;
    return 0;
}

static void rm_rf(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *e;
        while (d != NULL && (e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char sub[1200];
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            rm_rf(sub);
        }
        if (d != NULL)
            closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

static int teardown(void **state)
{
    fixture *f = *state;
    rm_rf(f->dir);
    free(f);
    return 0;
}

/* Path of `name` inside the test directory, in scratch slot `slot`. */
static const char *P(fixture *f, int slot, const char *name)
{
    /* Via a local buffer: GCC's -Wrestrict cannot tell f->dir and f->buf apart. */
    char tmp[sizeof f->buf[0]];
    snprintf(tmp, sizeof tmp, "%s/%s", f->dir, name);
    memcpy(f->buf[slot], tmp, sizeof tmp);
    return f->buf[slot];
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(data, 1, n, fp), n);
    assert_int_equal(fclose(fp), 0);
}

/* Whole file into a malloc'd buffer. */
static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    size_t cap = 4096, len = 0;
    unsigned char *b = malloc(cap);
    size_t r;
    while ((r = fread(b + len, 1, cap - len, fp)) > 0) {
        len += r;
        if (len == cap)
            b = realloc(b, cap *= 2);
    }
    fclose(fp);
    *n = len;
    return b;
}

/* Entries of a directory other than . and .., joined by '|' in readdir order, and a count. */
static int list_dir(const char *dir, char *out, size_t n)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    int count = 0;
    out[0] = '\0';
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        size_t used = strlen(out);
        snprintf(out + used, n - used, "%s%s", count ? "|" : "", e->d_name);
        count++;
    }
    closedir(d);
    return count;
}

#define expect_msg(ctx, sub)                                                                  \
    do {                                                                                      \
        if (strstr((ctx)->msg, (sub)) == NULL)                                                \
            fail_msg("message \"%s\" lacks \"%s\"", (ctx)->msg, (sub));                       \
    } while (0)

/* Read a spec that must fail with `status` and a message containing `sub`. */
static void read_fails(fixture *f, const char *spec, int status, const char *sub)
{
    tpk_ctx_init(&f->ctx);
    tpk_input_info info;
    tpk_array *a = tpk_io_read(spec, &info, &f->ctx);
    if (a != NULL)
        fail_msg("%s: read succeeded, expected %s", spec, tpk_strerror(status));
    if (f->ctx.status != status)
        fail_msg("%s: status %s (%s), expected %s", spec, tpk_strerror(f->ctx.status),
                 f->ctx.msg, tpk_strerror(status));
    expect_msg(&f->ctx, sub);
}

static tpk_array *read_ok(fixture *f, const char *spec, tpk_input_info *info)
{
    tpk_ctx_init(&f->ctx);
    tpk_array *a = tpk_io_read(spec, info, &f->ctx);
    if (a == NULL)
        fail_msg("%s: %s", spec, f->ctx.msg);
    return a;
}

/* ------------------------------------------------------------------------------------------ */
/* Test data: values with long mantissas and wide exponents, so any lossy path shows.         */

static const double X34[12] = {
    2.385,          -0.1734,           1.0e-300,          7.25e12,
    -3.14159265358979, 0.5772156649015329, 42.4242,       -1.234e-7,
    6.02214076e23,  -2.718281828459045, 0.001953125,       1.602176634e-19,
};

/* .npy bytes for tests: header padded so data starts at a multiple of 64 (as NumPy does); the
 * length in *len. */
static unsigned char *npy_bytes(int major, const char *descr, const char *fortran,
                                const char *shape, const void *data, size_t nbytes, size_t *len)
{
    char dict[256];
    int dl = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }",
                      descr, fortran, shape);
    size_t pre = major == 1 ? 10 : 12;
    size_t hlen = (size_t)dl + 1;
    hlen += (64 - (pre + hlen) % 64) % 64;
    unsigned char *b = calloc(1, pre + hlen + nbytes);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (unsigned char)major;
    b[7] = 0;
    if (major == 1) {
        b[8] = (unsigned char)(hlen & 255);
        b[9] = (unsigned char)(hlen >> 8);
    } else {
        for (int i = 0; i < 4; i++)
            b[8 + i] = (unsigned char)(hlen >> (8 * i));
    }
    memset(b + pre, ' ', hlen);
    memcpy(b + pre, dict, (size_t)dl);
    b[pre + hlen - 1] = '\n';
    if (nbytes)
        memcpy(b + pre + hlen, data, nbytes);
    *len = pre + hlen + nbytes;
    return b;
}

static void write_npy(const char *path, int major, const char *descr, const char *fortran,
                      const char *shape, const void *data, size_t nbytes)
{
    size_t len;
    unsigned char *b = npy_bytes(major, descr, fortran, shape, data, nbytes, &len);
    write_bytes(path, b, len);
    free(b);
}

/* float64 values as little- (big = 0) or big-endian (big = 1) bytes, independent of the host. */
static unsigned char *f8_bytes(const double *v, size_t n, int big)
{
    unsigned char *b = malloc(8 * n);
    for (size_t i = 0; i < n; i++) {
        uint64_t u;
        memcpy(&u, &v[i], 8);
        for (int k = 0; k < 8; k++)
            b[8 * i + (size_t)(big ? 7 - k : k)] = (unsigned char)(u >> (8 * k));
    }
    return b;
}

static unsigned char *f4_bytes(const double *v, size_t n)
{
    unsigned char *b = malloc(4 * n);
    for (size_t i = 0; i < n; i++) {
        float x = (float)v[i];
        uint32_t u;
        memcpy(&u, &x, 4);
        for (int k = 0; k < 4; k++)
            b[4 * i + (size_t)k] = (unsigned char)(u >> (8 * k));
    }
    return b;
}

static void write_npy_f8(const char *path, const char *shape, const double *v, size_t n)
{
    unsigned char *b = f8_bytes(v, n, 0);
    write_npy(path, 1, "<f8", "False", shape, b, 8 * n);
    free(b);
}

static void write_csv(const char *path, const char *text)
{
    write_bytes(path, text, strlen(text));
}

/* X34 as CSV text with a header, %.17g so every double round-trips exactly. */
static void write_csv_x34(const char *path)
{
    char text[2048];
    size_t used = (size_t)snprintf(text, sizeof text, "a,b,c,d\n");
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++)
            used += (size_t)snprintf(text + used, sizeof text - used, "%.17g%s", X34[4 * i + j],
                                     j == 3 ? "\n" : ",");
    write_csv(path, text);
}

static void assert_shape(const tpk_array *a, int ndim, size_t d0, size_t d1, size_t d2,
                         size_t d3)
{
    const size_t d[4] = {d0, d1, d2, d3};
    assert_int_equal(a->ndim, ndim);
    for (int i = 0; i < ndim; i++)
        assert_int_equal(a->dims[i], d[i]);
}

static void assert_values(const tpk_array *a, const double *v, size_t n)
{
    assert_int_equal(tpk_array_size(a), n);
    for (size_t i = 0; i < n; i++)
        if (a->data[i] != v[i])
            fail_msg("element %zu: got %.17g, want %.17g", i, a->data[i], v[i]);
}

/* HDF5 via its own API, for files our writer cannot make (rank 5, ints, strings, NaN). */
static void h5_raw(const char *path, const char *name, hid_t ftype, hid_t mtype, int rank,
                   const hsize_t *dims, const void *buf)
{
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(file >= 0);
    hid_t sp = H5Screate_simple(rank, dims, NULL);
    hid_t ds = H5Dcreate2(file, name, ftype, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(ds >= 0);
    assert_true(H5Dwrite(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0);
    H5Dclose(ds);
    H5Sclose(sp);
    H5Fclose(file);
}

/* Write the given arrays (names[i] ← arrays[i]) through the atomic writer and commit. */
static void h5_write(fixture *f, const char *path, int n, const char *const *names,
                     tpk_array *const *arrays)
{
    tpk_ctx_init(&f->ctx);
    tpk_h5out *out = tpk_h5out_open(path, &f->ctx);
    if (out == NULL)
        fail_msg("open %s: %s", path, f->ctx.msg);
    for (int i = 0; i < n; i++)
        if (tpk_h5out_write(out, names[i], arrays[i], &f->ctx) != TPK_OK)
            fail_msg("write %s: %s", names[i], f->ctx.msg);
    if (tpk_h5out_commit(out, &f->ctx) != TPK_OK)
        fail_msg("commit %s: %s", path, f->ctx.msg);
}

static tpk_array *array_from(int ndim, const size_t *dims, const double *v)
{
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_array *a = tpk_array_alloc(ndim, dims, &ctx);
    assert_non_null(a);
    size_t n = tpk_array_size(a);
    for (size_t i = 0; i < n; i++)
        a->data[i] = v ? v[i] : 0.25 * (double)i - 1.0 / 3.0;
    return a;
}

/* ------------------------------------------------------------------------------------------ */
/* SHA-256                                                                                    */

static void test_sha256_vectors(void **state)
{
    (void)state;
    char h[65];
    /* FIPS 180-2, appendix B.1 and B.2, and the empty message. */
    tpk_sha256_hex("abc", 3, h);
    assert_string_equal(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m2 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    tpk_sha256_hex(m2, strlen(m2), h);
    assert_string_equal(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    tpk_sha256_hex("", 0, h);
    assert_string_equal(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    /* B.3: one million 'a'. */
    char *mil = malloc(1000000);
    memset(mil, 'a', 1000000);
    tpk_sha256_hex(mil, 1000000, h);
    free(mil);
    assert_string_equal(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

/* The array fingerprint is SHA-256 of the little-endian float64 bytes, on any host. */
static void test_sha256_array(void **state)
{
    (void)state;
    const size_t d[2] = {3, 4};
    tpk_array *a = array_from(2, d, X34);
    unsigned char *le = f8_bytes(X34, 12, 0);
    char h1[65], h2[65];
    tpk_sha256_array_hex(a, h1);
    tpk_sha256_hex(le, 96, h2);
    assert_string_equal(h1, h2);
    free(le);
    tpk_array_free(a);
}

/* ------------------------------------------------------------------------------------------ */
/* .npy                                                                                       */

static void test_npy_f8(void **state)
{
    fixture *f = *state;
    const char *p = P(f, 0, "x.npy");
    write_npy_f8(p, "(3, 4)", X34, 12);
    tpk_input_info info;
    tpk_array *a = read_ok(f, p, &info);
    assert_shape(a, 2, 3, 4, 0, 0);
    assert_values(a, X34, 12);
    assert_string_equal(info.path, p);
    assert_string_equal(info.format, "npy");
    assert_string_equal(info.dataset, "");
    char h[65];
    tpk_sha256_array_hex(a, h);
    assert_string_equal(info.sha256, h);
    tpk_array_free(a);
    /* info may be NULL. */
    tpk_ctx_init(&f->ctx);
    a = tpk_io_read(p, NULL, &f->ctx);
    assert_non_null(a);
    tpk_array_free(a);
}

static void test_npy_f4(void **state)
{
    fixture *f = *state;
    const char *p = P(f, 0, "x4.npy");
    unsigned char *b = f4_bytes(X34, 12);
    write_npy(p, 1, "<f4", "False", "(4, 3)", b, 48);
    free(b);
    double want[12];
    for (int i = 0; i < 12; i++)
        want[i] = (double)(float)X34[i]; /* exact: every float is a double */
    tpk_array *a = read_ok(f, p, NULL);
    assert_shape(a, 2, 4, 3, 0, 0);
    assert_values(a, want, 12);
    tpk_array_free(a);
}

/* Header versions 2.0 and 3.0 (4-byte header length); ranks 3, 4 and 1 (read as N×1). */
static void test_npy_versions_and_ranks(void **state)
{
    fixture *f = *state;
    unsigned char *b = f8_bytes(X34, 12, 0);
    write_npy(P(f, 0, "v2.npy"), 2, "<f8", "False", "(2, 3, 2)", b, 96);
    tpk_array *a = read_ok(f, f->buf[0], NULL);
    assert_shape(a, 3, 2, 3, 2, 0);
    assert_values(a, X34, 12);
    tpk_array_free(a);

    write_npy(P(f, 0, "v3.npy"), 3, "<f8", "False", "(1, 2, 3, 2)", b, 96);
    a = read_ok(f, f->buf[0], NULL);
    assert_shape(a, 4, 1, 2, 3, 2);
    assert_values(a, X34, 12);
    tpk_array_free(a);

    write_npy(P(f, 0, "r1.npy"), 1, "<f8", "False", "(12,)", b, 96);
    a = read_ok(f, f->buf[0], NULL);
    assert_shape(a, 2, 12, 1, 0, 0);
    assert_values(a, X34, 12);
    tpk_array_free(a);
    free(b);
}

/* '>f8' is supported (byte-swapped on load), not rejected. */
static void test_npy_big_endian(void **state)
{
    fixture *f = *state;
    unsigned char *b = f8_bytes(X34, 12, 1);
    write_npy(P(f, 0, "be.npy"), 1, ">f8", "False", "(3, 4)", b, 96);
    free(b);
    tpk_input_info info;
    tpk_array *a = read_ok(f, f->buf[0], &info);
    assert_values(a, X34, 12);
    char h[65];
    tpk_sha256_array_hex(a, h);
    assert_string_equal(info.sha256, h); /* fingerprint of the values, not of the file bytes */
    tpk_array_free(a);
}

static void test_npy_errors(void **state)
{
    fixture *f = *state;
    unsigned char *b = f8_bytes(X34, 12, 0);

    write_npy(P(f, 0, "i3.npy"), 1, "<i3", "False", "(3, 4)", b, 96);
    read_fails(f, f->buf[0], TPK_EFORMAT, "unsupported dtype '<i3'");

    write_npy(P(f, 0, "U.npy"), 1, "<U2", "False", "(3, 4)", b, 96);
    read_fails(f, f->buf[0], TPK_EFORMAT, "unsupported dtype '<U2' (expected real numbers");

    write_npy(P(f, 0, "short2.npy"), 1, "<i2", "False", "(3, 4)", b, 23);
    read_fails(f, f->buf[0], TPK_EFORMAT, "expected 24 bytes of data for <i2 shape 3x4, found 23");

    write_npy(P(f, 0, "c16.npy"), 1, "<c16", "False", "(6,)", b, 96);
    read_fails(f, f->buf[0], TPK_EFORMAT, "unsupported dtype '<c16'");

    write_npy(P(f, 0, "rank5.npy"), 1, "<f8", "False", "(1, 2, 1, 3, 2)", b, 96);
    read_fails(f, f->buf[0], TPK_EFORMAT, "rank 5 (shape 1x2x1x3x2) not supported");

    write_npy(P(f, 0, "scalar.npy"), 1, "<f8", "False", "()", b, 8);
    read_fails(f, f->buf[0], TPK_EFORMAT, "rank 0");

    write_npy(P(f, 0, "empty.npy"), 1, "<f8", "False", "(0, 4)", b, 0);
    read_fails(f, f->buf[0], TPK_EFORMAT, "has no values");

    write_npy(P(f, 0, "short.npy"), 1, "<f8", "False", "(3, 4)", b, 95);
    read_fails(f, f->buf[0], TPK_EFORMAT, "expected 96 bytes of data");

    write_npy(P(f, 0, "long.npy"), 1, "<f8", "False", "(2, 4)", b, 96);
    read_fails(f, f->buf[0], TPK_EFORMAT, "expected 64 bytes of data");

    write_npy(P(f, 0, "v9.npy"), 9, "<f8", "False", "(3, 4)", b, 96);
    read_fails(f, f->buf[0], TPK_EFORMAT, "unsupported .npy format version 9.0");

    write_bytes(P(f, 0, "magic.npy"), "PK\x03\x04 not numpy at all", 22);
    read_fails(f, f->buf[0], TPK_EFORMAT, "magic.npy: not a .npy file");

    /* write_npy quotes descr; a structured header has a list there, so build it by hand. */
    P(f, 0, "struct.npy");
    {
        const char *hdr = "{'descr': [('a', '<f8')], 'fortran_order': False, 'shape': (3,), }";
        char h[128];
        size_t hl = 118;
        memset(h, ' ', sizeof h);
        memcpy(h, "\x93NUMPY\x01\x00", 8);
        h[8] = (char)hl;
        h[9] = 0;
        memcpy(h + 10, hdr, strlen(hdr));
        h[127] = '\n';
        unsigned char file[128 + 24];
        memcpy(file, h, 128);
        memcpy(file + 128, b, 24);
        write_bytes(f->buf[0], file, sizeof file);
    }
    read_fails(f, f->buf[0], TPK_EFORMAT, "structured dtype not supported");

    write_npy(P(f, 0, "garbled.npy"), 1, "<f8", "Maybe", "(3, 4)", b, 96);
    read_fails(f, f->buf[0], TPK_EFORMAT, "malformed 'fortran_order'");

    /* Inf at flat index 6 of a 3x4 array = [1, 2]. */
    double v[12];
    memcpy(v, X34, sizeof v);
    v[6] = INFINITY;
    write_npy_f8(P(f, 0, "inf.npy"), "(3, 4)", v, 12);
    read_fails(f, f->buf[0], TPK_EDOM, "inf.npy: non-finite value inf at index [1, 2]");
    v[6] = X34[6];
    v[11] = NAN;
    write_npy_f8(P(f, 0, "nan.npy"), "(3, 4)", v, 12);
    read_fails(f, f->buf[0], TPK_EDOM, "at index [2, 3] (0-based) of shape 3x4");

    /* float32 NaN goes through the same check. */
    unsigned char *b4 = f4_bytes(v, 12);
    write_npy(P(f, 0, "nan4.npy"), 1, "<f4", "False", "(12,)", b4, 48);
    free(b4);
    read_fails(f, f->buf[0], TPK_EDOM, "at index [11, 0]");
    free(b);
}

/* Every real dtype numpy writes, with values whose bytes are built here by hand (two's complement,
 * IEEE binary16), little- and big-endian. */
static void test_npy_dtypes(void **state)
{
    fixture *f = *state;
    /* int64 labels, including ones past 2^32 and negative */
    const int64_t iv[6] = {0, 2, -1, 7, (int64_t)1 << 40, -((int64_t)1 << 35)};
    unsigned char b[64];
    for (int i = 0; i < 6; i++)
        for (int k = 0; k < 8; k++)
            b[8 * i + k] = (unsigned char)((uint64_t)iv[i] >> (8 * k));
    write_npy(P(f, 0, "i8.npy"), 1, "<i8", "False", "(6,)", b, 48);
    tpk_input_info info;
    tpk_array *a = read_ok(f, f->buf[0], &info);
    assert_int_equal(a->ndim, 2);
    assert_int_equal(a->dims[0], 6);
    assert_int_equal(a->dims[1], 1);
    for (int i = 0; i < 6; i++)
        assert_true(a->data[i] == (double)iv[i]);
    tpk_array_free(a);
    /* big-endian int32, int16, int8, uint8, uint16, uint64, bool */
    const int32_t i4[3] = {-70000, 5, 123456789};
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++)
            b[4 * i + k] = (unsigned char)((uint32_t)i4[i] >> (8 * (3 - k)));
    write_npy(P(f, 0, "i4.npy"), 1, ">i4", "False", "(3,)", b, 12);
    a = read_ok(f, f->buf[0], NULL);
    for (int i = 0; i < 3; i++)
        assert_true(a->data[i] == (double)i4[i]);
    tpk_array_free(a);
    const unsigned char i2[4] = {0x18, 0xfc, 0xff, 0x7f}; /* -1000, 32767 little-endian */
    write_npy(P(f, 0, "i2.npy"), 1, "<i2", "False", "(2,)", i2, 4);
    a = read_ok(f, f->buf[0], NULL);
    assert_true(a->data[0] == -1000 && a->data[1] == 32767);
    tpk_array_free(a);
    const unsigned char by[4] = {0x00, 0x7f, 0x80, 0xff};
    write_npy(P(f, 0, "i1.npy"), 1, "|i1", "False", "(2, 2)", by, 4);
    a = read_ok(f, f->buf[0], NULL);
    assert_true(a->data[0] == 0 && a->data[1] == 127 && a->data[2] == -128 && a->data[3] == -1);
    tpk_array_free(a);
    write_npy(P(f, 0, "u1.npy"), 1, "|u1", "False", "(4,)", by, 4);
    a = read_ok(f, f->buf[0], NULL);
    assert_true(a->data[2] == 128 && a->data[3] == 255);
    tpk_array_free(a);
    const unsigned char u2[2] = {0xff, 0xfe}; /* 65534 big-endian */
    write_npy(P(f, 0, "u2.npy"), 1, ">u2", "False", "(1,)", u2, 2);
    a = read_ok(f, f->buf[0], NULL);
    assert_true(a->data[0] == 0xfffe);
    tpk_array_free(a);
    unsigned char u8[8];
    for (int k = 0; k < 8; k++)
        u8[k] = (unsigned char)(((uint64_t)3 << 60) >> (8 * k));
    write_npy(P(f, 0, "u8.npy"), 1, "<u8", "False", "(1,)", u8, 8);
    a = read_ok(f, f->buf[0], NULL);
    assert_true(a->data[0] == ldexp(3.0, 60));
    tpk_array_free(a);
    const unsigned char bo[3] = {1, 0, 1};
    write_npy(P(f, 0, "b1.npy"), 1, "|b1", "False", "(3,)", bo, 3);
    a = read_ok(f, f->buf[0], NULL);
    assert_true(a->data[0] == 1 && a->data[1] == 0 && a->data[2] == 1);
    tpk_array_free(a);
    /* float16: 1, -2, 65504 (largest), 2^-14 (smallest normal), 2^-24 (smallest subnormal),
     * 0x3555 = 1365/4096 ... = 0.333251953125, -0 */
    const uint16_t hv[7] = {0x3c00, 0xc000, 0x7bff, 0x0400, 0x0001, 0x3555, 0x8000};
    const double want[7] = {1, -2, 65504, 0x1p-14, 0x1p-24, 0.333251953125, -0.0};
    for (int i = 0; i < 7; i++) {
        b[2 * i] = (unsigned char)(hv[i] & 0xff);
        b[2 * i + 1] = (unsigned char)(hv[i] >> 8);
    }
    write_npy(P(f, 0, "f2.npy"), 1, "<f2", "False", "(7,)", b, 14);
    a = read_ok(f, f->buf[0], NULL);
    for (int i = 0; i < 7; i++)
        assert_true(a->data[i] == want[i]);
    assert_true(signbit(a->data[6]));
    tpk_array_free(a);
    const unsigned char hinf[2] = {0x00, 0x7c}; /* +inf */
    write_npy(P(f, 0, "f2inf.npy"), 1, "<f2", "False", "(1,)", hinf, 2);
    read_fails(f, f->buf[0], TPK_EDOM, "f2inf.npy: non-finite value inf at index [0, 0]");
}

/* Fortran order: the file holds the column-major sequence; the array is the same matrix. */
static void test_npy_fortran(void **state)
{
    fixture *f = *state;
    double colmajor[12];
    for (int i = 0; i < 3; i++) /* X34 is 3×4 row-major: entry (i, j) at j·3 + i in the file */
        for (int j = 0; j < 4; j++)
            colmajor[j * 3 + i] = X34[i * 4 + j];
    unsigned char *b = f8_bytes(colmajor, 12, 0);
    write_npy(P(f, 0, "F.npy"), 1, "<f8", "True", "(3, 4)", b, 96);
    tpk_array *a = read_ok(f, f->buf[0], NULL);
    assert_memory_equal(a->data, X34, sizeof X34);
    tpk_array_free(a);
    free(b);
    /* rank 3, 2×3×2 of int16: value 100i + 10j + k at Fortran position i + 2j + 6k */
    unsigned char c[24];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 2; k++) {
                int v = 100 * i + 10 * j + k, pos = i + 2 * j + 6 * k;
                c[2 * pos] = (unsigned char)(v & 0xff);
                c[2 * pos + 1] = (unsigned char)(v >> 8);
            }
    write_npy(P(f, 0, "F3.npy"), 1, "<i2", "True", "(2, 3, 2)", c, 24);
    a = read_ok(f, f->buf[0], NULL);
    assert_int_equal(a->ndim, 3);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 2; k++)
                assert_true(a->data[(i * 3 + j) * 2 + k] == 100 * i + 10 * j + k);
    tpk_array_free(a);
}

/* A ZIP archive of members (name, bytes), stored (method 0) or deflated (method 8) by zlib's own
 * deflate: the layout of APPNOTE.TXT, as Python's zipfile writes it for np.savez. */
typedef struct zmember {
    const char *name;
    const unsigned char *data;
    size_t len;
} zmember;

static size_t put(unsigned char *b, size_t at, uint64_t v, int n)
{
    for (int k = 0; k < n; k++)
        b[at + (size_t)k] = (unsigned char)(v >> (8 * k));
    return at + (size_t)n;
}

static void write_zip(const char *path, const zmember *m, int n, int deflated, int corrupt_crc)
{
    size_t cap = 1 << 16, at = 0;
    unsigned char *b = calloc(1, cap), *cd = calloc(1, cap);
    size_t cdl = 0, offs[8];
    assert_true(n <= 8);
    for (int i = 0; i < n; i++) {
        uLong crc = crc32(0, m[i].data, (uInt)m[i].len);
        unsigned char *z = malloc(m[i].len + 64);
        size_t zl = m[i].len;
        if (deflated) {
            z_stream s;
            memset(&s, 0, sizeof s);
            assert_int_equal(deflateInit2(&s, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY),
                             Z_OK);
            s.next_in = (unsigned char *)m[i].data;
            s.avail_in = (uInt)m[i].len;
            s.next_out = z;
            s.avail_out = (uInt)(m[i].len + 64);
            assert_int_equal(deflate(&s, Z_FINISH), Z_STREAM_END);
            zl = s.total_out;
            deflateEnd(&s);
        } else {
            memcpy(z, m[i].data, zl);
        }
        if (corrupt_crc)
            crc ^= 1;
        size_t nl = strlen(m[i].name);
        offs[i] = at;
        at = put(b, at, 0x04034b50, 4);
        at = put(b, at, 20, 2);
        at = put(b, at, 0, 2);
        at = put(b, at, deflated ? 8 : 0, 2);
        at = put(b, at, 0, 4); /* time, date */
        at = put(b, at, crc, 4);
        at = put(b, at, zl, 4);
        at = put(b, at, m[i].len, 4);
        at = put(b, at, nl, 2);
        at = put(b, at, 0, 2);
        memcpy(b + at, m[i].name, nl);
        at += nl;
        memcpy(b + at, z, zl);
        at += zl;
        cdl = put(cd, cdl, 0x02014b50, 4);
        cdl = put(cd, cdl, 20, 2);
        cdl = put(cd, cdl, 20, 2);
        cdl = put(cd, cdl, 0, 2);
        cdl = put(cd, cdl, deflated ? 8 : 0, 2);
        cdl = put(cd, cdl, 0, 4);
        cdl = put(cd, cdl, crc, 4);
        cdl = put(cd, cdl, zl, 4);
        cdl = put(cd, cdl, m[i].len, 4);
        cdl = put(cd, cdl, nl, 2);
        cdl = put(cd, cdl, 0, 2);
        cdl = put(cd, cdl, 0, 2);
        cdl = put(cd, cdl, 0, 2);
        cdl = put(cd, cdl, 0, 2);
        cdl = put(cd, cdl, 0, 4);
        cdl = put(cd, cdl, offs[i], 4);
        memcpy(cd + cdl, m[i].name, nl);
        cdl += nl;
        free(z);
    }
    size_t cdo = at;
    memcpy(b + at, cd, cdl);
    at += cdl;
    at = put(b, at, 0x06054b50, 4);
    at = put(b, at, 0, 4);
    at = put(b, at, (uint64_t)n, 2);
    at = put(b, at, (uint64_t)n, 2);
    at = put(b, at, cdl, 4);
    at = put(b, at, cdo, 4);
    at = put(b, at, 0, 2);
    write_bytes(path, b, at);
    free(b);
    free(cd);
}

static void test_npz(void **state)
{
    fixture *f = *state;
    unsigned char *x8 = f8_bytes(X34, 12, 0);
    size_t lx, ll;
    unsigned char *x = npy_bytes(1, "<f8", "False", "(3, 4)", x8, 96, &lx);
    const unsigned char lab[3] = {2, 0, 1};
    unsigned char *l = npy_bytes(1, "|u1", "False", "(3,)", lab, 3, &ll);
    const zmember two[2] = {{"x.npy", x, lx}, {"labels.npy", l, ll}};
    for (int deflated = 0; deflated < 2; deflated++) {
        const char *p = P(f, 0, deflated ? "dz.npz" : "d.npz");
        write_zip(p, two, 2, deflated, 0);
        char spec[1300];
        tpk_input_info info;
        snprintf(spec, sizeof spec, "%s:x", p);
        tpk_array *a = read_ok(f, spec, &info);
        assert_int_equal(a->dims[0], 3);
        assert_int_equal(a->dims[1], 4);
        assert_memory_equal(a->data, X34, sizeof X34);
        assert_string_equal(info.format, "npz");
        assert_string_equal(info.dataset, "x");
        tpk_array_free(a);
        snprintf(spec, sizeof spec, "%s:labels", p);
        a = read_ok(f, spec, NULL);
        assert_true(a->data[0] == 2 && a->data[1] == 0 && a->data[2] == 1);
        tpk_array_free(a);
        read_fails(f, p, TPK_EINVAL, "2 arrays in the archive: name one as");
        snprintf(spec, sizeof spec, "%s:y", p);
        read_fails(f, spec, TPK_ENOTFOUND, "no array 'y' in the archive (arrays: x, labels)");
    }
    /* one member: the name may be left out; the same fingerprint as the .npy */
    write_zip(P(f, 0, "one.npz"), two, 1, 1, 0);
    tpk_input_info i1, i2;
    tpk_array *a = read_ok(f, f->buf[0], &i1);
    tpk_array_free(a);
    write_npy_f8(P(f, 1, "x.npy"), "(3, 4)", X34, 12);
    a = read_ok(f, f->buf[1], &i2);
    tpk_array_free(a);
    assert_string_equal(i1.sha256, i2.sha256);
    /* corruption: a CRC that does not match, a truncated archive, not a ZIP at all */
    write_zip(P(f, 0, "crc.npz"), two, 1, 0, 1);
    read_fails(f, f->buf[0], TPK_EFORMAT, "crc.npz:x: CRC-32 mismatch");
    write_zip(P(f, 0, "crcz.npz"), two, 1, 1, 1);
    read_fails(f, f->buf[0], TPK_EFORMAT, "CRC-32 mismatch");
    write_bytes(P(f, 0, "junk.npz"), "PK\x03\x04 but nothing more of a ZIP archive",
                sizeof "PK\x03\x04 but nothing more of a ZIP archive" - 1);
    read_fails(f, f->buf[0], TPK_EFORMAT, "junk.npz: not a .npz file");
    write_bytes(P(f, 0, "tiny.npz"), "PK", 2);
    read_fails(f, f->buf[0], TPK_EFORMAT, "too short for a ZIP archive");
    free(x);
    free(l);
    free(x8);
}

/* ------------------------------------------------------------------------------------------ */
/* CSV                                                                                        */

static void test_csv(void **state)
{
    fixture *f = *state;
    const char *p = P(f, 0, "x.csv");
    write_csv_x34(p);
    tpk_input_info info;
    tpk_array *a = read_ok(f, p, &info);
    assert_shape(a, 2, 3, 4, 0, 0);
    assert_values(a, X34, 12);
    assert_string_equal(info.format, "csv");
    assert_string_equal(info.dataset, "");
    tpk_array_free(a);

    /* No header, CRLF line ends, spaces around fields, trailing blank lines. */
    write_csv(P(f, 0, "crlf.csv"), " 2.385 , -0.1734\r\n1e-300,7.25e12\r\n\r\n  \n\n");
    a = read_ok(f, f->buf[0], NULL);
    assert_shape(a, 2, 2, 2, 0, 0);
    assert_values(a, X34, 4);
    tpk_array_free(a);

    /* One column is still rank 2. */
    write_csv(P(f, 0, "col.csv"), "x\n2.385\n-0.1734\n1e-300");
    a = read_ok(f, f->buf[0], NULL);
    assert_shape(a, 2, 3, 1, 0, 0);
    assert_values(a, X34, 3);
    tpk_array_free(a);
}

static void test_csv_errors(void **state)
{
    fixture *f = *state;
    write_csv(P(f, 0, "ragged.csv"), "a,b,c,d,e\n"
                                     "1.5,2.5,3.5,4.5,5.5\n"
                                     "1.5,2.5,3.5,4.5,5.5\n"
                                     "1.5,2.5,3.5,4.5,5.5\n"
                                     "1.5,2.5,3.5,4.5,5.5\n"
                                     "1.5,2.5,3.5,4.5,5.5\n"
                                     "1.5,2.5,3.5,4.5\n");
    read_fails(f, f->buf[0], TPK_EFORMAT, "ragged.csv:7: expected 5 columns, found 4");

    write_csv(P(f, 0, "nan.csv"), "h1,h2\n0.25,1.5\n-2.75,3.125\n4.0625,nan\n");
    read_fails(f, f->buf[0], TPK_EDOM, "nan.csv:4: non-finite value at row 3, column 2");

    write_csv(P(f, 0, "inf.csv"), "0.25,-inf\n");
    read_fails(f, f->buf[0], TPK_EDOM, "non-finite value at row 1, column 2");

    write_csv(P(f, 0, "ovf.csv"), "0.25,1e400\n");
    read_fails(f, f->buf[0], TPK_EDOM, "non-finite value at row 1, column 2");

    write_csv(P(f, 0, "word.csv"), "0.25,1.5\n2.5,abc\n");
    read_fails(f, f->buf[0], TPK_EFORMAT, "word.csv:2: column 2: 'abc' is not a number");

    write_csv(P(f, 0, "emptyfield.csv"), "0.25,1.5\n2.5,\n");
    read_fails(f, f->buf[0], TPK_EFORMAT, "emptyfield.csv:2: column 2");

    write_csv(P(f, 0, "gap.csv"), "0.25,1.5\n\n2.5,3.5\n");
    read_fails(f, f->buf[0], TPK_EFORMAT, "gap.csv:2: blank line inside the data");

    write_csv(P(f, 0, "hdronly.csv"), "a,b,c\n\n");
    read_fails(f, f->buf[0], TPK_EFORMAT, "hdronly.csv: no data rows");

    write_csv(P(f, 0, "empty.csv"), "");
    read_fails(f, f->buf[0], TPK_EFORMAT, "no data rows");
}

/* ------------------------------------------------------------------------------------------ */
/* HDF5 input                                                                                 */

static void test_h5_read(void **state)
{
    fixture *f = *state;
    const size_t d2[2] = {3, 4}, d3[3] = {2, 3, 2}, d4[4] = {2, 1, 3, 2}, d1[1] = {12};
    tpk_array *arr[4] = {array_from(2, d2, X34), array_from(3, d3, X34), array_from(4, d4, X34),
                         array_from(1, d1, X34)};
    const char *names[4] = {"/x", "/grp/sub/y3", "/y4", "/v"};
    const char *p = P(f, 0, "in.h5");
    h5_write(f, p, 4, names, arr);

    tpk_input_info info;
    char spec[1300];
    snprintf(spec, sizeof spec, "%s:/x", p);
    tpk_array *a = read_ok(f, spec, &info);
    assert_shape(a, 2, 3, 4, 0, 0);
    assert_values(a, X34, 12);
    assert_string_equal(info.path, p);
    assert_string_equal(info.dataset, "/x");
    assert_string_equal(info.format, "hdf5");
    tpk_array_free(a);

    /* A relative dataset name is recorded in its absolute spelling. */
    snprintf(spec, sizeof spec, "%s:grp/sub/y3", p);
    a = read_ok(f, spec, &info);
    assert_shape(a, 3, 2, 3, 2, 0);
    assert_values(a, X34, 12);
    assert_string_equal(info.dataset, "/grp/sub/y3");
    tpk_array_free(a);

    snprintf(spec, sizeof spec, "%s:/y4", p);
    a = read_ok(f, spec, NULL);
    assert_shape(a, 4, 2, 1, 3, 2);
    tpk_array_free(a);

    snprintf(spec, sizeof spec, "%s:/v", p);
    a = read_ok(f, spec, NULL);
    assert_shape(a, 2, 12, 1, 0, 0);
    assert_values(a, X34, 12);
    tpk_array_free(a);

    /* The .hdf5 extension too. */
    rename(p, P(f, 1, "in.hdf5"));
    snprintf(spec, sizeof spec, "%s:/x", f->buf[1]);
    a = read_ok(f, spec, NULL);
    assert_values(a, X34, 12);
    tpk_array_free(a);
    for (int i = 0; i < 4; i++)
        tpk_array_free(arr[i]);
}

/* Integer and float32 datasets are converted to float64. */
static void test_h5_types(void **state)
{
    fixture *f = *state;
    const int iv[6] = {-7, 0, 3, 2147483647, -2147483647 - 1, 19};
    const hsize_t dims[2] = {2, 3};
    char spec[1300];
    h5_raw(P(f, 0, "i.h5"), "/ints", H5T_STD_I32BE, H5T_NATIVE_INT, 2, dims, iv);
    snprintf(spec, sizeof spec, "%s:/ints", f->buf[0]);
    tpk_array *a = read_ok(f, spec, NULL);
    for (int i = 0; i < 6; i++)
        assert_true(a->data[i] == (double)iv[i]);
    tpk_array_free(a);

    float fv[6];
    for (int i = 0; i < 6; i++)
        fv[i] = (float)X34[i];
    h5_raw(P(f, 0, "f.h5"), "/f", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 2, dims, fv);
    snprintf(spec, sizeof spec, "%s:/f", f->buf[0]);
    a = read_ok(f, spec, NULL);
    for (int i = 0; i < 6; i++)
        assert_true(a->data[i] == (double)fv[i]);
    tpk_array_free(a);
}

static void test_h5_errors(void **state)
{
    fixture *f = *state;
    const size_t d2[2] = {3, 4};
    tpk_array *x = array_from(2, d2, X34);
    tpk_array *const arr[2] = {x, x};
    const char *names[2] = {"/x", "/z"};
    const char *p = P(f, 0, "X.h5");
    h5_write(f, p, 2, names, arr);
    tpk_array_free(x);

    /* Keep whatever error printer the process had: the reader must restore it. */
    H5E_auto2_t fn0 = NULL, fn1 = NULL;
    void *data0 = NULL, *data1 = NULL;
    H5Eget_auto2(H5E_DEFAULT, &fn0, &data0);

    char spec[1300], want[1400];
    snprintf(spec, sizeof spec, "%s:/y", p);
    snprintf(want, sizeof want, "%s: no dataset '/y' (datasets: /x, /z)", p);
    read_fails(f, spec, TPK_ENOTFOUND, want);
    assert_string_equal(f->ctx.msg, want);

    snprintf(spec, sizeof spec, "%s:/nogroup/y", p);
    read_fails(f, spec, TPK_ENOTFOUND, "no dataset '/nogroup/y' (datasets: /x, /z)");

    /* No dataset named: say how to name one, and list them. */
    read_fails(f, p, TPK_EINVAL, "no dataset given");
    expect_msg(&f->ctx, "(datasets: /x, /z)");

    H5Eget_auto2(H5E_DEFAULT, &fn1, &data1);
    assert_true(fn0 == fn1 && data0 == data1);

    /* A group is not a dataset. */
    const size_t dg[2] = {2, 2};
    tpk_array *g = array_from(2, dg, NULL);
    tpk_array *const ga[1] = {g};
    const char *gn[1] = {"/grp/inner"};
    h5_write(f, P(f, 1, "G.h5"), 1, gn, ga);
    tpk_array_free(g);
    snprintf(spec, sizeof spec, "%s:/grp", f->buf[1]);
    read_fails(f, spec, TPK_ENOTFOUND, "'/grp' is a group, not a dataset (datasets: /grp/inner)");

    /* Rank 5, rank 0, string type, NaN, all via the raw API. */
    const hsize_t d5[5] = {1, 2, 1, 3, 2};
    h5_raw(P(f, 1, "r5.h5"), "/r5", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 5, d5, X34);
    snprintf(spec, sizeof spec, "%s:/r5", f->buf[1]);
    read_fails(f, spec, TPK_EFORMAT, "rank 5 (shape 1x2x1x3x2) not supported");

    hsize_t ds1[1] = {3};
    hid_t st = H5Tcopy(H5T_C_S1);
    H5Tset_size(st, 4);
    h5_raw(P(f, 1, "s.h5"), "/s", st, st, 1, ds1, "abcdefghijkl");
    H5Tclose(st);
    snprintf(spec, sizeof spec, "%s:/s", f->buf[1]);
    read_fails(f, spec, TPK_EFORMAT, "unsupported datatype");

    double v[12];
    memcpy(v, X34, sizeof v);
    v[9] = -INFINITY;
    const hsize_t d34[2] = {3, 4};
    h5_raw(P(f, 1, "nan.h5"), "/x", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 2, d34, v);
    snprintf(spec, sizeof spec, "%s:/x", f->buf[1]);
    read_fails(f, spec, TPK_EDOM, "nan.h5:/x: non-finite value -inf at index [2, 1]");

    const hsize_t d0[2] = {0, 4};
    h5_raw(P(f, 1, "e.h5"), "/x", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 2, d0, v);
    snprintf(spec, sizeof spec, "%s:/x", f->buf[1]);
    read_fails(f, spec, TPK_EFORMAT, "has no values");

    /* Not an HDF5 file despite the name. */
    write_csv(P(f, 1, "fake.h5"), "1,2\n");
    snprintf(spec, sizeof spec, "%s:/x", f->buf[1]);
    read_fails(f, spec, TPK_EFORMAT, "fake.h5: not an HDF5 file");

    H5Eget_auto2(H5E_DEFAULT, &fn1, &data1);
    assert_true(fn0 == fn1 && data0 == data1);
}

/* Generic errors: missing files in each format, unknown extension, NULL, directories. */
static void test_read_generic_errors(void **state)
{
    fixture *f = *state;
    char spec[1300], want[1300];
    const char *missing[3] = {"none.npy", "none.csv", "none.h5"};
    for (int i = 0; i < 3; i++) {
        snprintf(spec, sizeof spec, "%s%s", P(f, 0, missing[i]), i == 2 ? ":/x" : "");
        snprintf(want, sizeof want, "%s: No such file or directory", f->buf[0]);
        read_fails(f, spec, TPK_EIO, want);
        assert_string_equal(f->ctx.msg, want);
    }
    write_csv(P(f, 0, "x.txt"), "1,2\n");
    read_fails(f, f->buf[0], TPK_EINVAL, "unrecognised input format");
    read_fails(f, "", TPK_EINVAL, "empty input");
    tpk_ctx_init(&f->ctx);
    assert_null(tpk_io_read(NULL, NULL, &f->ctx));
    assert_int_equal(f->ctx.status, TPK_EINVAL);
    mkdir(P(f, 0, "d.csv"), 0700);
    read_fails(f, f->buf[0], TPK_EIO, "Is a directory");
    /* NULL ctx is allowed and must not crash. */
    assert_null(tpk_io_read(f->buf[0], NULL, NULL));
}

/* The same matrix in CSV, .npy and HDF5 has one fingerprint. */
static void test_sha_format_independent(void **state)
{
    fixture *f = *state;
    write_csv_x34(P(f, 0, "s.csv"));
    write_npy_f8(P(f, 1, "s.npy"), "(3, 4)", X34, 12);
    const size_t d2[2] = {3, 4};
    tpk_array *x = array_from(2, d2, X34);
    tpk_array *const arr[1] = {x};
    const char *names[1] = {"/data"};
    h5_write(f, P(f, 2, "s.h5"), 1, names, arr);
    char spec[1300];
    snprintf(spec, sizeof spec, "%s:/data", f->buf[2]);
    tpk_input_info i1, i2, i3;
    tpk_array_free(read_ok(f, f->buf[0], &i1));
    tpk_array_free(read_ok(f, f->buf[1], &i2));
    tpk_array_free(read_ok(f, spec, &i3));
    char h[65];
    tpk_sha256_array_hex(x, h);
    assert_string_equal(i1.sha256, h);
    assert_string_equal(i2.sha256, h);
    assert_string_equal(i3.sha256, h);
    /* And a different matrix hashes differently. */
    x->data[5] = nextafter(x->data[5], 1e308);
    char h2[65];
    tpk_sha256_array_hex(x, h2);
    assert_string_not_equal(h, h2);
    tpk_array_free(x);
}

/* ------------------------------------------------------------------------------------------ */
/* Atomic writer                                                                              */

static void test_writer_open_errors(void **state)
{
    fixture *f = *state;
    char want[1300];
    /* "-" is standard output, which HDF5 cannot write (refused, no file named "-"). */
    tpk_ctx_init(&f->ctx);
    assert_null(tpk_h5out_open("-", &f->ctx));
    assert_int_equal(f->ctx.status, TPK_EINVAL);
    expect_msg(&f->ctx, "HDF5 output cannot go to standard output");
    tpk_ctx_init(&f->ctx);
    assert_int_equal(tpk_io_check_output("-", NULL, 0, &f->ctx), TPK_EINVAL);
    expect_msg(&f->ctx, "give a file name");
    assert_false(access("-", F_OK) == 0);
    /* Nonexistent directory. */
    tpk_ctx_init(&f->ctx);
    assert_null(tpk_h5out_open(P(f, 0, "no/such/dir/K.h5"), &f->ctx));
    assert_int_equal(f->ctx.status, TPK_EIO);
    snprintf(want, sizeof want, "%s: cannot create output in", f->buf[0]);
    expect_msg(&f->ctx, want);
    expect_msg(&f->ctx, "No such file or directory");

    /* A regular file where the directory should be (tests run as root, so modes don't bite). */
    write_csv(P(f, 1, "somefile"), "x");
    tpk_ctx_init(&f->ctx);
    assert_null(tpk_h5out_open(P(f, 0, "somefile/K.h5"), &f->ctx));
    assert_int_equal(f->ctx.status, TPK_EIO);
    expect_msg(&f->ctx, "somefile/K.h5: cannot create output in");
    expect_msg(&f->ctx, "Not a directory");

    /* The destination is a directory. */
    mkdir(P(f, 0, "adir"), 0700);
    tpk_ctx_init(&f->ctx);
    assert_null(tpk_h5out_open(f->buf[0], &f->ctx));
    assert_int_equal(f->ctx.status, TPK_EIO);
    expect_msg(&f->ctx, "Is a directory");
    tpk_ctx_init(&f->ctx);
    assert_null(tpk_h5out_open(P(f, 0, "adir/"), &f->ctx));
    assert_int_not_equal(f->ctx.status, TPK_OK);

    tpk_ctx_init(&f->ctx);
    assert_null(tpk_h5out_open("", &f->ctx));
    assert_int_equal(f->ctx.status, TPK_EINVAL);

    /* Nothing left behind: only the two things this test made. */
    char names[512];
    assert_int_equal(list_dir(f->dir, names, sizeof names), 2);
    tpk_h5out_abort(NULL); /* no-op */
}

static void test_writer_commit(void **state)
{
    fixture *f = *state;
    const char *p = P(f, 0, "K.h5");
    tpk_ctx_init(&f->ctx);
    tpk_h5out *out = tpk_h5out_open(p, &f->ctx);
    assert_non_null(out);
    /* Before commit: only the hidden temp file, named after the target and this process. */
    char names[512], prefix[64];
    assert_int_equal(list_dir(f->dir, names, sizeof names), 1);
    snprintf(prefix, sizeof prefix, ".K.h5.tmp.%ld.", (long)getpid());
    if (strncmp(names, prefix, strlen(prefix)) != 0)
        fail_msg("temp file '%s' does not start with '%s'", names, prefix);

    /* A second writer to the same path gets its own temp file. */
    tpk_h5out *out2 = tpk_h5out_open(p, &f->ctx);
    assert_non_null(out2);
    assert_int_equal(list_dir(f->dir, names, sizeof names), 2);
    tpk_h5out_abort(out2);
    assert_int_equal(list_dir(f->dir, names, sizeof names), 1);

    const size_t d2[2] = {3, 4};
    tpk_array *x = array_from(2, d2, X34);
    assert_int_equal(tpk_h5out_write(out, "/kernel", x, &f->ctx), TPK_OK);
    assert_int_equal(tpk_h5out_commit(out, &f->ctx), TPK_OK);
    assert_int_equal(list_dir(f->dir, names, sizeof names), 1);
    assert_string_equal(names, "K.h5");

    /* Commit over an existing file replaces it. */
    out = tpk_h5out_open(p, &f->ctx);
    assert_non_null(out);
    x->data[0] = -9.875;
    assert_int_equal(tpk_h5out_write(out, "/kernel", x, &f->ctx), TPK_OK);
    assert_int_equal(tpk_h5out_commit(out, &f->ctx), TPK_OK);
    assert_int_equal(list_dir(f->dir, names, sizeof names), 1);
    char spec[1300];
    snprintf(spec, sizeof spec, "%s:/kernel", p);
    tpk_array *a = read_ok(f, spec, NULL);
    assert_values(a, x->data, 12);
    tpk_array_free(a);

    /* A bare file name goes to the current directory. */
    char cwd[1024];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(f->dir), 0);
    out = tpk_h5out_open("bare.h5", &f->ctx);
    assert_non_null(out);
    assert_int_equal(tpk_h5out_commit(out, &f->ctx), TPK_OK);
    assert_int_equal(chdir(cwd), 0);
    assert_int_equal(list_dir(f->dir, names, sizeof names), 2);
    tpk_array_free(x);
    assert_int_equal(f->ctx.status, TPK_OK);
}

/* abort, and a commit after a failed write, both leave a pre-existing file byte-identical. */
static void test_writer_abort_preserves(void **state)
{
    fixture *f = *state;
    const char *p = P(f, 0, "keep.h5");
    const char good[] = "previous good result \x01\x02\x03";
    write_bytes(p, good, sizeof good);
    const size_t d2[2] = {3, 4};
    tpk_array *x = array_from(2, d2, X34);

    tpk_ctx_init(&f->ctx);
    tpk_h5out *out = tpk_h5out_open(p, &f->ctx);
    assert_non_null(out);
    assert_int_equal(tpk_h5out_write(out, "/kernel", x, &f->ctx), TPK_OK);
    tpk_h5out_abort(out);
    size_t n;
    unsigned char *b = slurp(p, &n);
    assert_int_equal(n, sizeof good);
    assert_memory_equal(b, good, n);
    free(b);
    char names[512];
    assert_int_equal(list_dir(f->dir, names, sizeof names), 1);

    /* Bad names and a duplicate dataset fail; commit then refuses and cleans up. */
    out = tpk_h5out_open(p, &f->ctx);
    assert_non_null(out);
    assert_int_equal(tpk_h5out_write(out, "/kernel", x, &f->ctx), TPK_OK);
    assert_int_equal(tpk_h5out_write(out, "/kernel", x, &f->ctx), TPK_EINVAL);
    expect_msg(&f->ctx, "already has an object named '/kernel'");
    tpk_ctx_init(&f->ctx);
    assert_int_equal(tpk_h5out_write(out, "kernel", x, &f->ctx), TPK_EINVAL);
    expect_msg(&f->ctx, "must be an absolute path");
    tpk_ctx_init(&f->ctx);
    assert_int_equal(tpk_h5out_write(out, "/a//b", x, &f->ctx), TPK_EINVAL);
    tpk_ctx_init(&f->ctx);
    assert_int_equal(tpk_h5out_write(out, "/a/", x, &f->ctx), TPK_EINVAL);
    tpk_ctx_init(&f->ctx);
    assert_int_equal(tpk_h5out_commit(out, &f->ctx), TPK_EIO);
    expect_msg(&f->ctx, "an earlier write to it failed");
    b = slurp(p, &n);
    assert_int_equal(n, sizeof good);
    assert_memory_equal(b, good, n);
    free(b);
    assert_int_equal(list_dir(f->dir, names, sizeof names), 1);

    /* Attribute on a missing object also poisons the commit. */
    tpk_ctx_init(&f->ctx);
    out = tpk_h5out_open(p, &f->ctx);
    assert_non_null(out);
    assert_int_equal(tpk_h5out_attr_double(out, "/nope", "k", 1.5, &f->ctx), TPK_ENOTFOUND);
    expect_msg(&f->ctx, "no object '/nope'");
    assert_int_equal(tpk_h5out_commit(out, &f->ctx), TPK_EIO);
    assert_int_equal(list_dir(f->dir, names, sizeof names), 1);

    /* Writing through NULL is an error, not a crash. */
    tpk_ctx_init(&f->ctx);
    assert_int_equal(tpk_h5out_write(NULL, "/k", x, &f->ctx), TPK_EINVAL);
    assert_int_equal(tpk_h5out_commit(NULL, &f->ctx), TPK_EINVAL);
    tpk_array_free(x);
}

/* Read a scalar string attribute, checking it is variable-length UTF-8 (h5py gives str). */
static void attr_str(hid_t file, const char *obj, const char *key, char *out, size_t n)
{
    hid_t a = H5Aopen_by_name(file, obj, key, H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0)
        fail_msg("no attribute %s on %s", key, obj);
    hid_t t = H5Aget_type(a);
    assert_int_equal(H5Tget_class(t), H5T_STRING);
    assert_true(H5Tis_variable_str(t) > 0);
    assert_int_equal(H5Tget_cset(t), H5T_CSET_UTF8);
    hid_t mt = H5Tcopy(H5T_C_S1);
    H5Tset_size(mt, H5T_VARIABLE);
    H5Tset_cset(mt, H5T_CSET_UTF8);
    char *s = NULL;
    assert_true(H5Aread(a, mt, &s) >= 0);
    snprintf(out, n, "%s", s);
    H5free_memory(s);
    H5Tclose(mt);
    H5Tclose(t);
    H5Aclose(a);
}

static double attr_double(hid_t file, const char *obj, const char *key)
{
    double v = 0;
    hid_t a = H5Aopen_by_name(file, obj, key, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(a >= 0);
    hid_t t = H5Aget_type(a);
    assert_int_equal(H5Tget_class(t), H5T_FLOAT);
    assert_int_equal(H5Tget_size(t), 8);
    assert_true(H5Aread(a, H5T_NATIVE_DOUBLE, &v) >= 0);
    H5Tclose(t);
    H5Aclose(a);
    return v;
}

/* Read an int64 attribute (scalar or 1-D) into v[0..n); returns its element count. */
static int attr_ints(hid_t file, const char *obj, const char *key, long long *v, int n)
{
    hid_t a = H5Aopen_by_name(file, obj, key, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(a >= 0);
    hid_t t = H5Aget_type(a);
    assert_int_equal(H5Tget_class(t), H5T_INTEGER);
    assert_int_equal(H5Tget_size(t), 8);
    hid_t sp = H5Aget_space(a);
    hssize_t count = H5Sget_simple_extent_npoints(sp);
    assert_true(count >= 1 && count <= n);
    assert_true(H5Aread(a, H5T_NATIVE_LLONG, v) >= 0);
    H5Sclose(sp);
    H5Tclose(t);
    H5Aclose(a);
    return (int)count;
}

static void test_writer_attrs(void **state)
{
    fixture *f = *state;
    const char *p = P(f, 0, "attrs.h5");
    const char *csv = P(f, 1, "in.csv");
    write_csv_x34(csv);
    tpk_input_info info;
    tpk_array *x = read_ok(f, csv, &info);

    tpk_ctx_init(&f->ctx);
    tpk_h5out *out = tpk_h5out_open(p, &f->ctx);
    assert_non_null(out);
    char *argv[] = {"gpkernel", "--arch=mlp", "--phi=relu(x) * 2", "it's", "", "a\tb", NULL};
    assert_int_equal(tpk_h5out_provenance(out, 6, argv, &f->ctx), TPK_OK);
    assert_int_equal(tpk_h5out_write(out, "/kernel", x, &f->ctx), TPK_OK);
    const long long ints[4] = {-3, 0, 4096, 9007199254740993LL};
    assert_int_equal(tpk_h5out_write_ints(out, "/meta/ints", ints, 4, &f->ctx), TPK_OK);
    assert_int_equal(tpk_h5out_input_attrs(out, "input", &info, x, &f->ctx), TPK_OK);
    assert_int_equal(tpk_h5out_attr_str(out, "/", "phi", "σ²·relu", &f->ctx), TPK_OK);
    assert_int_equal(tpk_h5out_attr_str(out, NULL, "empty", "", &f->ctx), TPK_OK);
    assert_int_equal(tpk_h5out_attr_double(out, "/kernel", "sigma_w2", 1.7320508075688772,
                                           &f->ctx),
                     TPK_OK);
    assert_int_equal(tpk_h5out_attr_int(out, "/kernel", "depth", -123456789012LL, &f->ctx),
                     TPK_OK);
    /* Setting an attribute again replaces it. */
    assert_int_equal(tpk_h5out_attr_int(out, "/meta", "n", 7, &f->ctx), TPK_OK);
    assert_int_equal(tpk_h5out_attr_int(out, "/meta", "n", 8, &f->ctx), TPK_OK);
    assert_int_equal(tpk_h5out_attr_str(out, "/", "", "x", &f->ctx), TPK_EINVAL);
    tpk_ctx_init(&f->ctx);
    assert_int_equal(tpk_h5out_input_attrs(out, "", &info, x, &f->ctx), TPK_EINVAL);
    /* Those two errors poison the file; start over for the good one. */
    tpk_h5out_abort(out);

    tpk_ctx_init(&f->ctx);
    out = tpk_h5out_open(p, &f->ctx);
    assert_non_null(out);
    assert_int_equal(tpk_h5out_provenance(out, 6, argv, &f->ctx), TPK_OK);
    assert_int_equal(tpk_h5out_write(out, "/kernel", x, &f->ctx), TPK_OK);
    assert_int_equal(tpk_h5out_write_ints(out, "/meta/ints", ints, 4, &f->ctx), TPK_OK);
    assert_int_equal(tpk_h5out_write_ints(out, "/meta/none", NULL, 0, &f->ctx), TPK_OK);
    assert_int_equal(tpk_h5out_input_attrs(out, "input", &info, x, &f->ctx), TPK_OK);
    assert_int_equal(tpk_h5out_attr_str(out, "/", "phi", "σ²·relu", &f->ctx), TPK_OK);
    assert_int_equal(tpk_h5out_attr_double(out, "/kernel", "sigma_w2", 1.7320508075688772,
                                           &f->ctx),
                     TPK_OK);
    assert_int_equal(tpk_h5out_attr_int(out, "/kernel", "depth", -123456789012LL, &f->ctx),
                     TPK_OK);
    assert_int_equal(tpk_h5out_attr_int(out, "/meta", "n", 7, &f->ctx), TPK_OK);
    assert_int_equal(tpk_h5out_attr_int(out, "/meta", "n", 8, &f->ctx), TPK_OK);
    assert_int_equal(tpk_h5out_commit(out, &f->ctx), TPK_OK);

    hid_t file = H5Fopen(p, H5F_ACC_RDONLY, H5P_DEFAULT);
    assert_true(file >= 0);
    char s[1300];
    attr_str(file, "/", "toolkit_version", s, sizeof s);
    assert_string_equal(s, TPK_VERSION);
    attr_str(file, "/", "command_line", s, sizeof s);
    assert_string_equal(s, "gpkernel --arch=mlp '--phi=relu(x) * 2' 'it'\\''s' '' 'a\tb'");
    attr_str(file, "/", "created", s, sizeof s);
    /* ISO 8601 UTC: 2024-05-17T09:41:07Z */
    assert_int_equal(strlen(s), 20);
    const char *pat = "dddd-dd-ddTdd:dd:ddZ";
    for (int i = 0; i < 20; i++)
        assert_true(pat[i] == 'd' ? (s[i] >= '0' && s[i] <= '9') : s[i] == pat[i]);
    attr_str(file, "/", "phi", s, sizeof s);
    assert_string_equal(s, "σ²·relu");
    attr_str(file, "/", "input_file", s, sizeof s);
    assert_string_equal(s, csv);
    attr_str(file, "/", "input_dataset", s, sizeof s);
    assert_string_equal(s, "");
    attr_str(file, "/", "input_format", s, sizeof s);
    assert_string_equal(s, "csv");
    attr_str(file, "/", "input_sha256", s, sizeof s);
    assert_string_equal(s, info.sha256);
    long long shape[4];
    assert_int_equal(attr_ints(file, "/", "input_shape", shape, 4), 2);
    assert_true(shape[0] == 3 && shape[1] == 4);
    assert_true(attr_double(file, "/kernel", "sigma_w2") == 1.7320508075688772);
    long long v[4];
    assert_int_equal(attr_ints(file, "/kernel", "depth", v, 1), 1);
    assert_true(v[0] == -123456789012LL);
    assert_int_equal(attr_ints(file, "/meta", "n", v, 1), 1);
    assert_true(v[0] == 8);

    /* The int dataset: int64, exact beyond 2^53. */
    hid_t ds = H5Dopen2(file, "/meta/ints", H5P_DEFAULT);
    assert_true(ds >= 0);
    hid_t t = H5Dget_type(ds);
    assert_int_equal(H5Tget_class(t), H5T_INTEGER);
    assert_int_equal(H5Tget_size(t), 8);
    assert_true(H5Dread(ds, H5T_NATIVE_LLONG, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0);
    assert_memory_equal(v, ints, sizeof ints);
    H5Tclose(t);
    H5Dclose(ds);
    /* Plain contiguous layout, no filters. */
    ds = H5Dopen2(file, "/kernel", H5P_DEFAULT);
    hid_t dcpl = H5Dget_create_plist(ds);
    assert_int_equal(H5Pget_layout(dcpl), H5D_CONTIGUOUS);
    assert_int_equal(H5Pget_nfilters(dcpl), 0);
    H5Pclose(dcpl);
    H5Dclose(ds);
    H5Fclose(file);

    /* Provenance with no argv at all is an empty command line, not an error. */
    out = tpk_h5out_open(P(f, 2, "noargs.h5"), &f->ctx);
    assert_non_null(out);
    assert_int_equal(tpk_h5out_provenance(out, 0, NULL, &f->ctx), TPK_OK);
    assert_int_equal(tpk_h5out_provenance(out, -1, NULL, &f->ctx), TPK_EINVAL);
    tpk_h5out_abort(out);
    tpk_array_free(x);
}

/* tpk_io_read_attr_str reads back what tpk_h5out_attr_str wrote (variable-length UTF-8) and
 * fixed-length strings HDF5 itself wrote; tpk_h5out_write_vector is a rank-1 dataset. Every error
 * path: unreadable file, not HDF5, no object, no attribute, not a string, too small a buffer. */
static void test_attr_read_and_vector(void **state)
{
    fixture *f = *state;
    const char *p = P(f, 0, "a.h5");
    const double v[3] = {2.385, -0.125, 1e-300};
    tpk_ctx_init(&f->ctx);
    tpk_h5out *out = tpk_h5out_open(p, &f->ctx);
    assert_non_null(out);
    assert_int_equal(tpk_h5out_write_vector(out, "/g/v", v, 3, &f->ctx), TPK_OK);
    assert_int_equal(tpk_h5out_attr_str(out, "/", "cfg", "gplimits/1 seeds=24 \u00e9", &f->ctx),
                     TPK_OK);
    assert_int_equal(tpk_h5out_attr_str(out, "/g/v", "what", "", &f->ctx), TPK_OK);
    assert_int_equal(tpk_h5out_attr_double(out, "/", "num", 2.5, &f->ctx), TPK_OK);
    assert_int_equal(tpk_h5out_commit(out, &f->ctx), TPK_OK);
    char spec[1300];
    snprintf(spec, sizeof spec, "%s:/g/v", p);
    tpk_array *a = read_ok(f, spec, NULL);
    assert_int_equal(a->ndim, 2); /* rank 1 reads as N×1 */
    assert_int_equal(a->dims[0], 3);
    assert_values(a, v, 3);
    tpk_array_free(a);

    char buf[64];
    tpk_ctx_init(&f->ctx);
    assert_int_equal(tpk_io_read_attr_str(p, "/", "cfg", buf, sizeof buf, &f->ctx), TPK_OK);
    assert_string_equal(buf, "gplimits/1 seeds=24 \u00e9");
    assert_int_equal(tpk_io_read_attr_str(p, NULL, "cfg", buf, sizeof buf, &f->ctx), TPK_OK);
    assert_int_equal(tpk_io_read_attr_str(p, "/g/v", "what", buf, sizeof buf, &f->ctx), TPK_OK);
    assert_string_equal(buf, "");
    /* A fixed-length string written by HDF5 directly. */
    const char *q = P(f, 1, "fixed.h5");
    hid_t file = H5Fcreate(q, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t t = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR);
    H5Tset_size(t, 5);
    hid_t at = H5Acreate2(file, "fx", t, sp, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(H5Awrite(at, t, "abcde") >= 0);
    H5Aclose(at);
    H5Sclose(sp);
    H5Tclose(t);
    H5Fclose(file);
    assert_int_equal(tpk_io_read_attr_str(q, "/", "fx", buf, sizeof buf, &f->ctx), TPK_OK);
    assert_string_equal(buf, "abcde");

    struct { const char *path, *obj, *key; size_t cap; int status; const char *sub; } bad[] = {
        {P(f, 2, "missing.h5"), "/", "cfg", 64, TPK_EIO, "missing.h5"},
        {P(f, 3, "text.h5"), "/", "cfg", 64, TPK_EFORMAT, "not an HDF5 file"},
        {p, "/nope", "cfg", 64, TPK_ENOTFOUND, "no object"},
        {p, "/", "nokey", 64, TPK_ENOTFOUND, "no attribute"},
        {p, "/", "num", 64, TPK_EFORMAT, "not a string"},
        {p, "/", "cfg", 8, TPK_EINVAL, "more than 7"},
        {q, "/", "fx", 5, TPK_EINVAL, "more than 4"},
    };
    write_bytes(bad[1].path, "plain text", 10);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tpk_ctx_init(&f->ctx);
        int st = tpk_io_read_attr_str(bad[i].path, bad[i].obj, bad[i].key, buf, bad[i].cap,
                                      &f->ctx);
        if (st != bad[i].status || !strstr(f->ctx.msg, bad[i].sub))
            fail_msg("case %zu: status %d (want %d), '%s' (want '%s')", i, st, bad[i].status,
                     f->ctx.msg, bad[i].sub);
    }
    tpk_ctx_init(&f->ctx);
    assert_int_equal(tpk_io_read_attr_str(p, "/", "cfg", NULL, 8, &f->ctx), TPK_EINVAL);
    assert_int_equal(tpk_io_read_attr_str(NULL, "/", "cfg", buf, 8, &f->ctx), TPK_EINVAL);
    /* Vector errors: NULL data, and a failed write makes the commit refuse. */
    tpk_ctx_init(&f->ctx);
    out = tpk_h5out_open(P(f, 2, "v.h5"), &f->ctx);
    assert_non_null(out);
    assert_int_equal(tpk_h5out_write_vector(out, "/v", NULL, 2, &f->ctx), TPK_EINVAL);
    assert_int_equal(tpk_h5out_commit(out, &f->ctx), TPK_EIO);
    assert_int_equal(tpk_h5out_write_vector(NULL, "/v", v, 3, &f->ctx), TPK_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha256_vectors),
        cmocka_unit_test(test_sha256_array),
        cmocka_unit_test_setup_teardown(test_npy_f8, setup, teardown),
        cmocka_unit_test_setup_teardown(test_npy_f4, setup, teardown),
        cmocka_unit_test_setup_teardown(test_npy_dtypes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_npy_fortran, setup, teardown),
        cmocka_unit_test_setup_teardown(test_npz, setup, teardown),
        cmocka_unit_test_setup_teardown(test_npy_versions_and_ranks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_npy_big_endian, setup, teardown),
        cmocka_unit_test_setup_teardown(test_npy_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_csv, setup, teardown),
        cmocka_unit_test_setup_teardown(test_csv_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_h5_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_h5_types, setup, teardown),
        cmocka_unit_test_setup_teardown(test_h5_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_generic_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sha_format_independent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_writer_open_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_writer_commit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_writer_abort_preserves, setup, teardown),
        cmocka_unit_test_setup_teardown(test_writer_attrs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attr_read_and_vector, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
