/* The bad-input catalogue (issue 18, "deliver beyond the list" 1): table-driven cases over every
 * program and every reader — .npy, .npz, CSV, HDF5, IDX, NETSOR programs, tuning logs, option
 * values. Each case must end in a clear error: a non-zero exit that is not a crash (no signal, no
 * sanitizer report), a first stderr line that names what is wrong (the file, option or position
 * the case is about), no output file created, and no file of the scratch directory changed,
 * added or removed (content checksums before and after). The cases are the cross product of bad
 * files and the places a tool reads them, plus bad option values and malformed programs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "support/testutil.h"

static int setup(void **state) { return tu_setup_tagged(state, "catalogue"); }

/* ---- the scratch directory's state -------------------------------------------------------- */

typedef struct snap {
    int n;
    char name[128][64];
    uint64_t sum[128];
} snap;

static uint64_t file_sum(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return 0;
    uint64_t h = 14695981039346656037u;
    int c;
    while ((c = getc(f)) != EOF)
        h = (h ^ (uint64_t)c) * 1099511628211u;
    fclose(f);
    return h;
}

/* Every file of the scratch directory but err.txt, sorted by name, with its checksum. */
static void take(const tu_env *e, snap *s)
{
    s->n = 0;
    DIR *d = opendir(e->tmpdir);
    assert_non_null(d);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' && (de->d_name[1] == 0 || de->d_name[1] == '.'))
            continue;
        if (strcmp(de->d_name, "err.txt") == 0)
            continue;
        size_t len = strlen(de->d_name);
        assert_true(s->n < 128 && len < sizeof s->name[0]);
        memcpy(s->name[s->n], de->d_name, len + 1);
        s->n++;
    }
    closedir(d);
    for (int i = 1; i < s->n; i++) /* insertion sort: few files */
        for (int j = i; j > 0 && strcmp(s->name[j - 1], s->name[j]) > 0; j--) {
            char t[64];
            memcpy(t, s->name[j], sizeof t);
            memcpy(s->name[j], s->name[j - 1], sizeof t);
            memcpy(s->name[j - 1], t, sizeof t);
        }
    for (int i = 0; i < s->n; i++) {
        char p[512];
        s->sum[i] = file_sum(tu_path(e, p, sizeof p, s->name[i]));
    }
}

/* ---- bad files ------------------------------------------------------------------------------ */

static void put_bytes(const tu_env *e, const char *name, const void *b, size_t n)
{
    char p[512];
    FILE *f = fopen(tu_path(e, p, sizeof p, name), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* A string literal's bytes (its NUL excluded). */
#define PUT_LIT(e, name, lit) put_bytes((e), (name), (lit), sizeof(lit) - 1)

static void put_text(const tu_env *e, const char *name, const char *text)
{
    put_bytes(e, name, text, strlen(text));
}

/* A .npy file with the given header dictionary and `nbytes` payload bytes of value v (as f8). */
static void put_npy(const tu_env *e, const char *name, const char *dict, size_t nvals, double v)
{
    char head[256];
    int hl = snprintf(head, sizeof head, "%s", dict);
    int pad = 64 - (10 + hl + 1) % 64;
    size_t total = 10 + (size_t)hl + (size_t)pad + 1 + nvals * 8;
    unsigned char *b = calloc(1, total);
    assert_non_null(b);
    memcpy(b, "\x93NUMPY\x01\x00", 8);
    unsigned hlen = (unsigned)(hl + pad + 1);
    b[8] = (unsigned char)(hlen & 255);
    b[9] = (unsigned char)(hlen >> 8);
    memcpy(b + 10, head, (size_t)hl);
    memset(b + 10 + hl, ' ', (size_t)pad);
    b[10 + hl + pad] = '\n';
    for (size_t i = 0; i < nvals; i++)
        memcpy(b + 10 + hlen + i * 8, &v, 8);
    put_bytes(e, name, b, total);
    free(b);
}

typedef struct badfile {
    const char *name;   /* in the scratch directory */
    const char *kind;   /* which readers take its extension: npy, csv, h5, idx, any */
} badfile;

static const badfile BAD[] = {
    /* .npy */
    {"empty.npy", "npy"},
    {"text.npy", "npy"},
    {"magic.npy", "npy"},
    {"cut_header.npy", "npy"},
    {"no_descr.npy", "npy"},
    {"complex.npy", "npy"},
    {"string.npy", "npy"},
    {"object.npy", "npy"},
    {"zero_rows.npy", "npy"},
    {"short_data.npy", "npy"},
    {"nan.npy", "npy"},
    {"inf.npy", "npy"},
    {"rank5.npy", "npy"},
    {"bad_shape.npy", "npy"},
    {"huge_shape.npy", "npy"},
    {"hlen_past_end.npy", "npy"},
    /* CSV */
    {"empty.csv", "csv"},
    {"ragged.csv", "csv"},
    {"word.csv", "csv"},
    {"nan.csv", "csv"},
    {"inf.csv", "csv"},
    {"overflow.csv", "csv"},
    {"binary.csv", "csv"},
    {"blank_line_only.csv", "csv"},
    {"trailing_comma.csv", "csv"},
    {"header_only.csv", "csv"},
    {"numhead.csv", "csv"},  /* "1,2,abc": was taken as a header (issue 18) */
    {"mixhead.csv", "csv"},
    /* HDF5 */
    {"text.h5:/x", "h5"},
    {"good.h5:/nosuch", "h5"},
    {"good.h5:/grp", "h5"},
    {"good.h5:/nan", "h5"},
    {"good.h5:/empty", "h5"},
    {"missing.h5:/x", "h5"},
    /* IDX */
    {"magic.idx", "idx"},
    {"type.idx", "idx"},
    {"rank0.idx", "idx"},
    {"cut.idx", "idx"},
    {"gzip-garbage-ubyte.gz", "idx"},
    /* any format: missing files, directories */
    {"nosuch.npy", "any"},
    {"nosuch.csv", "any"},
    {"adir.npy", "any"},
};

static void make_bad_files(const tu_env *e)
{
    PUT_LIT(e, "empty.npy", "");
    put_text(e, "text.npy", "this is not a numpy file\n");
    PUT_LIT(e, "magic.npy", "\x93NUMPX\x01\x00\x10\x00{}              \n");
    PUT_LIT(e, "cut_header.npy", "\x93NUMPY\x01\x00\x40\x00{'descr': '<f8', ");
    put_npy(e, "no_descr.npy", "{'fortran_order': False, 'shape': (4, 3), }", 12, 1.0);
    put_npy(e, "complex.npy", "{'descr': '<c16', 'fortran_order': False, 'shape': (4, 3), }", 24, 1.0);
    put_npy(e, "string.npy", "{'descr': '|S8', 'fortran_order': False, 'shape': (4, 3), }", 12, 1.0);
    put_npy(e, "object.npy", "{'descr': '|O', 'fortran_order': False, 'shape': (4, 3), }", 12, 1.0);
    put_npy(e, "zero_rows.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (0, 3), }", 0, 1.0);
    put_npy(e, "short_data.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (4, 3), }", 7, 1.0);
    put_npy(e, "nan.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (4, 3), }", 12, NAN);
    put_npy(e, "inf.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (4, 3), }", 12, INFINITY);
    put_npy(e, "rank5.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 1, 1, 2, 3), }",
            6, 1.0);
    put_npy(e, "bad_shape.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (4, -3), }", 12,
            1.0);
    put_npy(e, "huge_shape.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': "
            "(4000000000, 4000000000), }", 12, 1.0);
    PUT_LIT(e, "hlen_past_end.npy", "\x93NUMPY\x01\x00\xff\x7f{'descr': '<f8'}\n");
    PUT_LIT(e, "empty.csv", "");
    put_text(e, "ragged.csv", "1,2,3\n4,5\n6,7,8\n9,1,2\n");
    put_text(e, "word.csv", "1,2,3\n4,five,6\n7,8,9\n1,2,3\n");
    put_text(e, "nan.csv", "1,2,3\n4,nan,6\n7,8,9\n1,2,3\n");
    put_text(e, "inf.csv", "1,2,3\n4,5,6\n7,-inf,9\n1,2,3\n");
    put_text(e, "overflow.csv", "1,2,3\n4,5,6\n7,1e999,9\n1,2,3\n");
    PUT_LIT(e, "binary.csv", "\x01\x02\x00\xff\xfe\x00\x10");
    put_text(e, "blank_line_only.csv", "\n");
    put_text(e, "trailing_comma.csv", "1,2,3,\n4,5,6,\n7,8,9,\n1,2,3,\n");
    put_text(e, "header_only.csv", "a,b,c\n");
    put_text(e, "numhead.csv", "1,2,abc\n4,5,6\n7,8,9\n1,2,3\n0.5,0.25,0.125\n");
    put_text(e, "mixhead.csv", "x,1,2\n4,5,6\n7,8,9\n1,2,3\n0.5,0.25,0.125\n");
    put_text(e, "text.h5", "not an HDF5 file\n");
    /* IDX: magic 00 00 TYPE RANK, big-endian dims, data */
    PUT_LIT(e, "magic.idx", "\x01\x00\x08\x02\x00\x00\x00\x04\x00\x00\x00\x03"
              "abcdefghijkl");
    PUT_LIT(e, "type.idx", "\x00\x00\x07\x02\x00\x00\x00\x04\x00\x00\x00\x03"
              "abcdefghijkl");
    PUT_LIT(e, "rank0.idx", "\x00\x00\x08\x00");
    PUT_LIT(e, "cut.idx", "\x00\x00\x08\x02\x00\x00\x00\x04\x00\x00\x00\x03" "abc");
    PUT_LIT(e, "gzip-garbage-ubyte.gz", "\x1f\x8b\x08\x00" "garbage");
    char p[512];
    const double v[12] = {0.1, 0.2, 0.3, -0.4, 0.5, 0.6, 0.7, 0.8, -0.9, 1.0, 1.1, 1.2};
    double vn[12];
    memcpy(vn, v, sizeof vn);
    vn[5] = NAN;
    /* good.h5: /x (4×3), /nan (a NaN), /grp (a group), /empty (0×3) */
    hid_t f = H5Fcreate(tu_path(e, p, sizeof p, "good.h5"), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(f >= 0);
    hid_t g = H5Gcreate2(f, "/grp", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(g >= 0);
    H5Gclose(g);
    const struct {
        const char *name;
        const double *v;
        hsize_t rows;
    } ds[] = {{"/x", v, 4}, {"/nan", vn, 4}, {"/grp/y", v, 4}, {"/empty", v, 0}};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
        hsize_t dims[2] = {ds[i].rows, 3};
        hid_t sp = H5Screate_simple(2, dims, NULL);
        hid_t d = H5Dcreate2(f, ds[i].name, H5T_IEEE_F64LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        assert_true(d >= 0);
        if (ds[i].rows)
            assert_true(H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, ds[i].v) >= 0);
        H5Dclose(d);
        H5Sclose(sp);
    }
    H5Fclose(f);
    mkdir(tu_path(e, p, sizeof p, "adir.npy"), 0755);
}

/* ---- good files the slots need ---------------------------------------------------------------- */

/* The first `lines` lines of the repository's file src ($TPK_ROOT) as the scratch file dst. */
static void copy_head(const tu_env *e, const char *src, const char *dst, int lines)
{
    const char *root = getenv("TPK_ROOT");
    char p[1024], q[512], line[8192];
    snprintf(p, sizeof p, "%s/%s", root ? root : ".", src);
    FILE *in = fopen(p, "r"), *out = fopen(tu_path(e, q, sizeof q, dst), "w");
    assert_non_null(in);
    assert_non_null(out);
    for (int i = 0; i < lines && fgets(line, sizeof line, in); i++)
        fputs(line, out);
    fclose(in);
    assert_int_equal(fclose(out), 0);
}

static void make_good_files(const tu_env *e)
{
    put_text(e, "good.csv", "0.1,0.2,0.3\n-0.4,0.5,0.6\n0.7,0.8,-0.9\n1.0,1.1,1.2\n");
    put_text(e, "labels.csv", "0\n1\n0\n1\n");
    double img[2 * 4 * 4];
    for (size_t i = 0; i < sizeof img / sizeof img[0]; i++)
        img[i] = 0.1 * (double)((i * 7) % 11) - 0.5;
    char p[512];
    tu_write_npy(tu_path(e, p, sizeof p, "img.npy"), img, 3, (size_t[]){2, 4, 4});
    put_text(e, "prog.nsr", "param L = 2\nwidth n\ninput x : d\nA U : (n, d) ~ 1\n"
                            "A W : (n, n) ~ 2\ng = U x\nh = W relu(g)\n"
                            "output y = readout(relu(h), 1)\n");
    /* a tuning log (two records of a shipped one) and a machine class, for tptune's outputs */
    copy_head(e, "data/tuning/cpu-avx512-intel-map.jsonl", "log.jsonl", 2);
    copy_head(e, "data/machines/avx512-intel.conf", "cls.conf", 1000);
}

/* ---- running one case -------------------------------------------------------------------------- */

static int ncases, nfailed;

/* Run `tool args` (with @DIR@ replaced by the scratch directory); it must fail cleanly and the
 * first stderr line must contain `want`. */
static void run_case(const tu_env *e, const char *tool, const char *fmt, const char *bad,
                     const char *want)
{
    char args[2048], out[512];
    tu_path(e, out, sizeof out, "out.h5");
    snprintf(args, sizeof args, fmt, e->tmpdir, bad ? bad : "");
    snap before, after;
    take(e, &before);
    int rc = tu_run_tool(e, tool, args);
    take(e, &after);
    char err[4096];
    tu_stderr(e, err, sizeof err);
    char *nl = strchr(err, '\n');
    if (nl)
        *nl = 0;
    const char *why = NULL;
    if (rc == 0)
        why = "exit 0";
    else if (rc < 0 || rc >= 128)
        why = "crashed (signal)";
    else if (rc != 1 && rc != 2)
        why = "exit code other than 1 (error) or 2 (usage)";
    else if (err[0] == 0)
        why = "no message";
    else if (strstr(err, "AddressSanitizer") || strstr(err, "runtime error"))
        why = "sanitizer report";
    else if (want && strstr(err, want) == NULL)
        why = "the message does not name the culprit";
    else if (tu_exists(out))
        why = "left an output file";
    else if (before.n != after.n)
        why = "added or removed a file";
    for (int i = 0; why == NULL && i < before.n; i++)
        if (strcmp(before.name[i], after.name[i]) != 0 || before.sum[i] != after.sum[i])
            why = "changed a file";
    ncases++;
    if (why != NULL) {
        nfailed++;
        print_message("FAIL %s %s: %s (exit %d): %s\n", tool, args, why, rc, err);
    }
    remove(out);
}

/* The culprit a bad file's message must name: its base name (without ":/dataset"), or the
 * dataset for a dataset that is not there. */
static const char *culprit(const char *bad, char *buf, size_t len)
{
    snprintf(buf, len, "%s", bad);
    char *c = strchr(buf, ':');
    if (c && strstr(bad, "good.h5:") == bad)
        return c + 1; /* the dataset path */
    if (c)
        *c = 0;
    return buf;
}

/* ---- the catalogue --------------------------------------------------------------------------------- */

/* Where a tool reads a data file (fmt: %1$s the scratch dir, %2$s the bad file). */
static const struct {
    const char *tool, *fmt;
} FILE_SLOTS[] = {
    {"gpkernel", "--arch=mlp --input='%1$s/%2$s' --output='%1$s/out.h5' --quiet"},
    {"gpkernel", "--arch=mlp --input='%1$s/good.csv' --test='%1$s/%2$s' --output='%1$s/out.h5' "
                 "--quiet"},
    {"netsor", "kernel '%1$s/prog.nsr' --input='%1$s/%2$s' --output='%1$s/out.h5' --quiet"},
    {"netsor", "run '%1$s/prog.nsr' --input='%1$s/%2$s' --width=8 --output='%1$s/out.h5' --quiet"},
    {"gpregress", "--arch=mlp --train='%1$s/%2$s' --labels='%1$s/labels.csv' "
                  "--output='%1$s/out.h5' --quiet"},
    {"gpregress", "--arch=mlp --train='%1$s/good.csv' --labels='%1$s/%2$s' "
                  "--output='%1$s/out.h5' --quiet"},
    {"gpregress", "--arch=rbf --train='%1$s/good.csv' --labels='%1$s/labels.csv' "
                  "--test='%1$s/%2$s' --output='%1$s/out.h5' --quiet"},
    {"gpregress", "--arch=mlp --train='%1$s/good.csv' --labels='%1$s/labels.csv' "
                  "--test='%1$s/good.csv' --test-labels='%1$s/%2$s' --output='%1$s/out.h5' --quiet"},
    {"gplimits", "--arch=mlp --input='%1$s/%2$s' --widths=8,16 --seeds=4 --boot=50 "
                 "--output='%1$s/out.h5' --quiet"},
};

static void test_bad_files(void **state)
{
    const tu_env *e = *state;
    make_good_files(e);
    make_bad_files(e);
    int n0 = ncases;
    for (size_t s = 0; s < sizeof FILE_SLOTS / sizeof FILE_SLOTS[0]; s++)
        for (size_t b = 0; b < sizeof BAD / sizeof BAD[0]; b++) {
            char buf[128];
            run_case(e, FILE_SLOTS[s].tool, FILE_SLOTS[s].fmt, BAD[b].name,
                     culprit(BAD[b].name, buf, sizeof buf));
        }
    print_message("bad files: %d cases\n", ncases - n0);
}

/* Bad option values, unknown options, missing and unwritable outputs (fmt: %1$s the scratch
 * dir; the culprit is the option's name). */
static const struct {
    const char *tool, *args, *want;
} OPTION_CASES[] = {
#define GK "--input='%1$s/good.csv' --output='%1$s/out.h5' --quiet "
#define GI "--input='%1$s/img.npy' --output='%1$s/out.h5' --quiet "
    {"gpkernel", GK "--arch=mlp --depth=-1", "depth"},
    {"gpkernel", GK "--arch=mlp --depth=abc", "depth"},
    {"gpkernel", GK "--arch=mlp --depth=1e9", "depth"},
    {"gpkernel", GK "--arch=mlp --sigma-w2=-2", "sigma-w2"},
    {"gpkernel", GK "--arch=mlp --sigma-w2=nan", "sigma-w2"},
    {"gpkernel", GK "--arch=mlp --sigma-w2=inf", "sigma-w2"},
    {"gpkernel", GK "--arch=mlp --sigma-b2=-1", "sigma-b2"},
    {"gpkernel", GK "--arch=mlp --sigma-w2=", "sigma-w2"},
    {"gpkernel", GK "--arch=mlp --phi=nosuch", "nosuch"},
    {"gpkernel", GK "--arch=mlp --phi=", "phi"},
    {"gpkernel", GK "--arch=nosuch", "nosuch"},
    {"gpkernel", GK "--arch=", "arch"},
    {"gpkernel", GK "--arch=mlp --frobnicate", "frobnicate"},
    {"gpkernel", GK "--arch=mlp --set L=abc", "L"},
    {"gpkernel", GK "--arch=mlp --set nosuch=1", "nosuch"},
    {"gpkernel", GK "--arch=mlp --set L", "L"},
    {"gpkernel", GK "--arch=mlp --residual=abc", "residual"},
    {"gpkernel", GK "--arch=mlp --layernorm --ln-eps=-1", "eps"},
    {"gpkernel", GK "--arch=transformer --depth=0", "depth"},
    {"gpkernel", GI "--arch=cnn2d --filter=0", "filter"},
    {"gpkernel", GI "--arch=cnn2d --padding=sideways", "padding"},
    {"gpkernel", GI "--arch=cnn2d --depth=-1", "depth"},
    {"gpkernel", GI "--arch=cnn2d --readout=nosuch", "nosuch"},
    {"gpkernel", GK "--arch=cnn2d", "good.csv"},
    {"gpkernel", GK "--arch=mlp --quad-degree=0", "quad-degree"},
    {"gpkernel", "--arch=mlp --input='%1$s/good.csv' --quiet", "output"},
    {"gpkernel", "--arch=mlp --output='%1$s/out.h5' --quiet --input=", "input"},
    {"gpkernel", "--arch=mlp --input='%1$s/good.csv' --output='%1$s/nodir/out.h5' --quiet", "nodir"},
    {"gpkernel", "--arch=mlp --input='%1$s/good.csv' --output='%1$s/adir.npy' --quiet", "adir.npy"},
    {"gpkernel", "--arch=mlp --input='%1$s/good.csv' --output='%1$s/good.csv' --quiet", "good.csv"},
#define NK "kernel '%1$s/prog.nsr' --input='%1$s/good.csv' --output='%1$s/out.h5' --quiet "
#define NR "run '%1$s/prog.nsr' --input='%1$s/good.csv' --output='%1$s/out.h5' --quiet "
    {"netsor", NK "--set L=abc", "L"},
    {"netsor", NK "--set nosuch=1", "nosuch"},
    {"netsor", NK "--set =1", "set"},
    {"netsor", NK "--bogus", "bogus"},
    {"netsor", NR "--width=0", "width"},
    {"netsor", NR "--width=-5", "width"},
    {"netsor", NR "--width=abc", "width"},
    {"netsor", NR "--width=99999999999", "width"},
    {"netsor", NR "--width=8 --seed=abc", "seed"},
    {"netsor", NR "--seed=1", "width"},
    {"netsor", NR "--width=8 --seed=-1", "seed"},
    {"netsor", "frobnicate '%1$s/prog.nsr'", "frobnicate"},
    {"netsor", "kernel '%1$s/prog.nsr' --input='%1$s/good.csv' --quiet", "output"},
    {"netsor", "kernel '%1$s/prog.nsr' --output='%1$s/out.h5' --quiet", "input"},
    {"netsor", "kernel --input='%1$s/good.csv' --output='%1$s/out.h5' --quiet", "PROGRAM"},
    {"netsor", "kernel '%1$s/prog.nsr' --input='%1$s/good.csv' --output='%1$s/prog.nsr' --quiet",
     "prog.nsr"},
    {"netsor", "kernel '%1$s/nosuch.nsr' --input='%1$s/good.csv' --output='%1$s/out.h5' --quiet",
     "nosuch.nsr"},
    {"netsor", "check '%1$s/adir.npy'", "adir.npy"},
#define GR "--train='%1$s/good.csv' --labels='%1$s/labels.csv' --output='%1$s/out.h5' --quiet "
    {"gpregress", GR "--arch=mlp --noise=-1", "noise"},
    {"gpregress", GR "--arch=mlp --noise=abc", "noise"},
    {"gpregress", GR "--arch=mlp --noise=nan", "noise"},
    {"gpregress", GR "--arch=mlp --depth=-2", "depth"},
    {"gpregress", GR "--arch=mlp --depth=5-2", "depth"},
    {"gpregress", GR "--arch=mlp --depth=x-y", "depth"},
    {"gpregress", GR "--arch=rbf --lengthscale2=0", "lengthscale2"},
    {"gpregress", GR "--arch=rbf --lengthscale2=-1", "lengthscale2"},
    {"gpregress", GR "--arch=rbf --amplitude=-1", "amplitude"},
    {"gpregress", GR "--arch=mlp --select-n=0", "select-n"},
    {"gpregress", GR "--arch=mlp --n-train=0", "n-train"},
    {"gpregress", GR "--arch=mlp --n-train=abc", "n-train"},
    {"gpregress", GR "--arch=mlp --n-train=99", "99"},
    {"gpregress", GR "--arch=mlp --fix=nosuch --fit-hyper", "nosuch"},
    {"gpregress", GR "--arch=nosuch", "nosuch"},
    {"gpregress", GR "--arch=mlp --phi=nosuch", "nosuch"},
    {"gpregress", GR "--arch=mlp --quad-degree=-3", "quad-degree"},
    {"gpregress", GR "--arch=mlp --frobnicate", "frobnicate"},
    {"gpregress", "--arch=mlp --train='%1$s/good.csv' --output='%1$s/out.h5' --quiet", "labels"},
    {"gpregress", "--arch=mlp --labels='%1$s/labels.csv' --output='%1$s/out.h5' --quiet", "train"},
    {"gpregress", "--arch=mlp --train='%1$s/good.csv' --labels='%1$s/labels.csv' --quiet", "output"},
    {"gpregress", "--arch=mlp --train='%1$s/good.csv' --labels='%1$s/labels.csv' "
                  "--output='%1$s/labels.csv' --quiet", "labels.csv"},
    {"gpregress", "--kernel='%1$s/good.h5' --labels='%1$s/labels.csv' --output='%1$s/out.h5' "
                  "--quiet", "good.h5"},
    {"gpregress", "--kernel='%1$s/text.h5' --labels='%1$s/labels.csv' --output='%1$s/out.h5' "
                  "--quiet", "text.h5"},
    {"gpregress", "--kernel='%1$s/good.h5' --arch=mlp --train='%1$s/good.csv' "
                  "--labels='%1$s/labels.csv' --output='%1$s/out.h5' --quiet", "kernel"},
#define GL "--arch=mlp --input='%1$s/good.csv' --output='%1$s/out.h5' --quiet --boot=50 "
    {"gplimits", GL "--widths=0,8 --seeds=2", "widths"},
    {"gplimits", GL "--widths=abc --seeds=2", "widths"},
    {"gplimits", GL "--widths=16..8 --seeds=2", "widths"},
    {"gplimits", GL "--widths=8,16 --seeds=0", "seeds"},
    {"gplimits", GL "--widths=8,16 --seeds=abc", "seeds"},
    {"gplimits", GL "--widths=8,16 --seeds=4 --max-inputs=-1", "max-inputs"},
    {"gplimits", GL "--widths=8,16 --seeds=4 --boot=-5", "boot"},
    {"gplimits", GL "--widths=8,16 --seeds=2", "seeds"},
    {"gplimits", GL "--widths=8,16 --seeds=4 --slices=-1", "slices"},
    {"gplimits", GL "--widths=8,16 --seeds=4 --fit-ratio=-1", "fit-ratio"},
    {"gplimits", GL "--widths=8,16 --seeds=4 --w1-input=99", "w1-input"},
    {"gplimits", GL "--widths=8,16 --seeds=4 --depth=-1", "depth"},
    {"gplimits", GL "--widths=8,16 --seeds=4 --frobnicate", "frobnicate"},
    {"gplimits", "--arch=mlp --input='%1$s/good.csv' --widths=8,16 --seeds=4 --quiet", "output"},
    {"gplimits", "--program='%1$s/nosuch.nsr' --input='%1$s/good.csv' --widths=8,16 --seeds=4 "
                 "--output='%1$s/out.h5' --quiet", "nosuch.nsr"},
#define GA "--output='%1$s/out.h5' --quiet --networks=50 --score-samples=50 "
    {"gpattention", GA "--tokens=0", "tokens"},
    {"gpattention", GA "--tokens=abc", "tokens"},
    {"gpattention", GA "--heads=0", "heads"},
    {"gpattention", GA "--heads=-2", "heads"},
    {"gpattention", GA "--widths=0", "widths"},
    {"gpattention", GA "--widths=8..4", "widths"},
    {"gpattention", "--output='%1$s/out.h5' --quiet --networks=0", "networks"},
    {"gpattention", "--output='%1$s/out.h5' --quiet --score-samples=0", "score-samples"},
    {"gpattention", GA "--heads-list=0", "heads-list"},
    {"gpattention", GA "--input='%1$s/word.csv'", "word.csv"},
    {"gpattention", GA "--input='%1$s/nan.npy'", "nan.npy"},
    {"gpattention", GA "--input='%1$s/nosuch.npy'", "nosuch.npy"},
    {"gpattention", GA "--frobnicate", "frobnicate"},
    {"gpattention", "--quiet --tokens=3", "output"},
    {"tptune", "gemm --m=-1 --n=8 --k=8 --trials=2 --log='%1$s/out.h5'", "-1"},
    {"tptune", "gemm --m=abc --n=8 --k=8 --trials=2 --log='%1$s/out.h5'", "abc"},
    {"tptune", "gemm --m=8 --n=0 --k=8 --trials=2 --log='%1$s/out.h5'", "n"},
    {"tptune", "gemm --m=8 --n=8 --k=8 --trials=0 --log='%1$s/out.h5'", "trials"},
    {"tptune", "gemm --m=8 --n=8 --k=8 --trials=2 --frobnicate --log='%1$s/out.h5'", "frobnicate"},
    {"tptune", "gemm --m=8 --n=8 --k=8 --dtype=f16 --trials=2 --log='%1$s/out.h5'", "f16"},
    {"tptune", "gemm --m=8 --n=8 --k=8 --target=tpu --trials=2 --log='%1$s/out.h5'", "tpu"},
    {"tptune", "gemm --m=8 --n=8 --k=8 --model=nosuch --trials=2 --log='%1$s/out.h5'", "nosuch"},
    {"tptune", "gemm --m=8 --n=8 --k=8 --trials=2", "log"},
    {"tptune", "frobnicate --m=8", "frobnicate"},
    {"tptune", "replay --log='%1$s/text.npy'", "text.npy"},
    {"tptune", "replay --log='%1$s/nosuch.log'", "nosuch.log"},
    {"tptune", "show '%1$s/text.npy'", "text.npy"},
    {"tptune", "show '%1$s/ragged.csv'", "ragged.csv"},
    {"tptune", "measure '%1$s/text.npy' --log='%1$s/out.h5'", "text.npy"},
    {"tptune", "emit --m=8 --n=8 --k=8 --knobs=nosuch=1", "nosuch"},
    {"tptune", "emit --m=8 --n=8 --k=8 --knobs=garbage", "garbage"},
    {"tptune", "gen --class='%1$s/text.npy' --out='%1$s/out.h5' '%1$s/text.npy'", "text.npy"},
    /* A repeated option is an error in every tool (issue 18: the later silently won, and a second
     * --input escaped the output-is-an-input check, so good.csv was replaced). */
    {"gpkernel", "--arch=mlp --input='%1$s/good.csv' --input='%1$s/labels.csv' "
                 "--output='%1$s/good.csv' --quiet", "--input given twice"},
    {"gpkernel", GK "--arch=mlp --depth=2 --depth=3", "--depth given twice"},
    {"gpkernel", GK "--arch=mlp --phi relu --phi erf", "--phi given twice"},
    {"gpkernel", GK "--arch=mlp --set L=2 --set L=3", "--set L given twice"},
    {"gpkernel", GK "--arch=mlp --output='%1$s/out2.h5'", "--output given twice"},
    {"netsor", NR "--width=8 --width=16", "--width given twice"},
    {"netsor", NK "--set L=2 --set L=4", "--set L given twice"},
    {"gpregress", GR "--arch=mlp --noise=0.1 --noise auto", "--noise given twice"},
    {"gpregress", GR "--arch=mlp --train='%1$s/img.npy'", "--train given twice"},
    {"gplimits", GL "--widths=8,16 --widths=32 --seeds=4", "--widths given twice"},
    {"gplimits", GL "--widths=8,16 --seeds=4 --sigma-w2=1 --sigma-w2 2", "--sigma-w2 given twice"},
    {"gpattention", GA "--heads=2 --heads=4", "--heads given twice"},
    {"tptune", "gemm --m=8 --m=16 --n=8 --k=8 --trials=2 --log='%1$s/out.h5'", "--m given twice"},
    {"tptune", "gemm --m=8 --n=8 --k=8 --seed=-1 --trials=2 --log='%1$s/out.h5'", "seed"},
    /* An option the others make meaningless is refused, not ignored (issue 18: --tokens with
     * --input) */
    {"gpattention", GA "--tokens=3 --input='%1$s/img.npy'", "--tokens does not apply"},
    {"gpregress", GR "--arch=rbf --sigma-w2=3", "--sigma-w2 does not apply"},
    {"gpregress", GR "--arch=rbf --depth=2", "--depth does not apply"},
    {"gpregress", GR "--arch=mlp --amplitude=2", "--amplitude does not apply"},
    {"gpregress", GR "--arch=mlp --fix=noise", "--fix does not apply"},
    {"gpregress", GR "--arch=mlp --noise=0.1 --no-scale", "--no-scale does not apply"},
    {"gpregress", GR "--arch=mlp --noise=0.1 --select-n=3", "--select-n does not apply"},
    {"netsor", NK "--width=8", "--width does not apply"},
    {"netsor", NK "--seed=3", "--seed does not apply"},
    {"netsor", "check '%1$s/prog.nsr' --input='%1$s/good.csv'", "--input does not apply"},
    /* tptune's outputs on its inputs (issue 18: gen and port replaced the log they read) */
    {"tptune", "gen --op=map --class='%1$s/cls.conf' --out='%1$s/log.jsonl' '%1$s/log.jsonl'",
     "log.jsonl is the input"},
    {"tptune", "gen --class='%1$s/cls.conf' --out='%1$s/cls.conf' '%1$s/log.jsonl'",
     "cls.conf is the input"},
    {"tptune", "port --from='%1$s/cls.conf' --to='%1$s/cls.conf' --verify=0 "
               "--out='%1$s/log.jsonl' '%1$s/log.jsonl'", "log.jsonl is the input"},
    {"tptune", "measure '%1$s/log.jsonl' --log='%1$s/./log.jsonl' --repeat=1 --min-ms=1",
     "log.jsonl is the input"},
};

static void test_bad_options(void **state)
{
    const tu_env *e = *state;
    make_good_files(e);
    make_bad_files(e);
    int n0 = ncases;
    for (size_t c = 0; c < sizeof OPTION_CASES / sizeof OPTION_CASES[0]; c++)
        run_case(e, OPTION_CASES[c].tool, OPTION_CASES[c].args, NULL, OPTION_CASES[c].want);
    print_message("bad options: %d cases\n", ncases - n0);
}

/* Malformed programs: each through check, kernel and run; the message names file:line:. */
static const struct {
    const char *name, *src, *want;
} PROGRAMS[] = {
    {"p_empty.nsr", "", "p_empty.nsr"},
    {"p_noout.nsr", "width n\ninput x : d\nA U : (n, d) ~ 1\ng = U x\n", "p_noout.nsr"},
    {"p_undef.nsr", "width n\ninput x : d\noutput y = readout(h, 1)\n", "p_undef.nsr:3:"},
    {"p_syntax.nsr", "width n\ninput x : d\nA U : (n, d) ~ 1\ng = U x +\noutput y = readout(g, 1)\n",
     "p_syntax.nsr:5:"},
    {"p_width.nsr", "width n, m\ninput x : d\nA U : (n, d) ~ 1\nA W : (m, m) ~ 1\ng = U x\n"
                    "h = W g\noutput y = readout(h, 1)\n", "p_width.nsr:6:"},
    {"p_divzero.nsr", "width n\ninput x : d\nA U : (n, d) ~ 1\ng = U x / 0\n"
                      "output y = readout(g, 1)\n", "p_divzero.nsr:4:"},
    {"p_badvar.nsr", "width n\ninput x : d\nA U : (n, d) ~ -1\ng = U x\n"
                     "output y = readout(g, 1)\n", "p_badvar.nsr:3:"},
    {"p_moment.nsr", "width n\ninput x : d\nA U : (n, d) ~ 1\ng = U x\nscalar m = mean(g * g)\n"
                     "output y = readout(g, 1)\n", "p_moment.nsr:5:"},
    {"p_transpose.nsr", "width n\ninput x : d\nA U : (n, d) ~ 1\nA W : (n, n) ~ 1\ng = U x\n"
                        "h = W' g\noutput y = readout(h, 1)\n", "p_transpose.nsr:6:"},
    {"p_range.nsr", "param T = 3\nwidth n\ninput x[t in 1..T] : d\nA U : (n, d) ~ 1\n"
                    "g[i in 1..T] = U x[i + 1]\noutput y = readout(g[T], 1)\n", "p_range.nsr:5:"},
    {"p_redef.nsr", "width n\ninput x : d\nA U : (n, d) ~ 1\ng = U x\ng = U x\n"
                    "output y = readout(g, 1)\n", "p_redef.nsr:5:"},
    {"p_badphi.nsr", "width n\ninput x : d\nA U : (n, d) ~ 1\ng = U x\nh = nosuch(g)\n"
                     "output y = readout(h, 1)\n", "p_badphi.nsr:5:"},
    {"p_scalarmat.nsr", "use netsor+\nwidth n\ninput x : d\nA U : (n, d) ~ 1\nA W : (n, n) ~ 1\n"
                        "g = U x\nscalar s = mean(g * g)\nh = W s\noutput y = readout(g, 1)\n",
     "p_scalarmat.nsr:8:"},
    {"p_binary.nsr", "\x01\x02\x03\xff\xfe", "p_binary.nsr"},
    {"p_unterminated.nsr", "param L = 2\nfor l in 1..L {\nwidth n\n", "p_unterminated.nsr"},
    {"p_readoutneg.nsr", "width n\ninput x : d\nA U : (n, d) ~ 1\ng = U x\n"
                         "output y = readout(g, -1)\n", "p_readoutneg.nsr:5:"},
};

static void test_bad_programs(void **state)
{
    const tu_env *e = *state;
    make_good_files(e);
    int n0 = ncases;
    static const char *modes[] = {
        "check '%1$s/%2$s'",
        "kernel '%1$s/%2$s' --input='%1$s/good.csv' --output='%1$s/out.h5' --quiet",
        "run '%1$s/%2$s' --input='%1$s/good.csv' --width=8 --output='%1$s/out.h5' --quiet",
    };
    for (size_t c = 0; c < sizeof PROGRAMS / sizeof PROGRAMS[0]; c++) {
        put_text(e, PROGRAMS[c].name, PROGRAMS[c].src);
        for (size_t m = 0; m < 3; m++)
            run_case(e, "netsor", modes[m], PROGRAMS[c].name, PROGRAMS[c].want);
        /* gplimits (like gpkernel --program) allows NETSOR+ without `use netsor+` */
        if (strcmp(PROGRAMS[c].name, "p_moment.nsr") != 0)
            run_case(e, "gplimits", "--program='%1$s/%2$s' --input='%1$s/good.csv' --widths=8,16 "
                     "--seeds=4 --boot=50 --output='%1$s/out.h5' --quiet", PROGRAMS[c].name,
                     PROGRAMS[c].name);
        char p[512];
        remove(tu_path(e, p, sizeof p, PROGRAMS[c].name));
    }
    print_message("bad programs: %d cases\n", ncases - n0);
}

static void test_total(void **state)
{
    (void)state;
    print_message("catalogue: %d cases, %d failed\n", ncases, nfailed);
    assert_true(ncases >= 400);
    assert_int_equal(nfailed, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_bad_programs),
        cmocka_unit_test(test_total),
    };
    return cmocka_run_group_tests(tests, setup, tu_teardown);
}
