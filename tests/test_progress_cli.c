/* The progress line of the tools (tools/cli.c, issue 17): with --progress it is on stderr (plain
 * lines off a terminal, one line rewritten with "\r" on one), never on stdout; --quiet and
 * --no-progress silence it, and so does a run shorter than the threshold; stdout and the output
 * file are the same with it and without (every dataset and attribute but the creation time).
 * The thresholds are set through TPK_PROGRESS_AFTER / TPK_PROGRESS_EVERY so that runs of a
 * fraction of a second draw lines. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <math.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "support/testutil.h"

#define BIG (1 << 16)

static int setup(void **state) { return tu_setup_tagged(state, "progcli"); }

static const char *root(void)
{
    const char *r = getenv("TPK_ROOT");
    return r ? r : ".";
}

/* The contents of TMPDIR/name ("" when missing), malloc'd. */
static char *slurp(const tu_env *e, const char *name)
{
    char p[512];
    char *buf = calloc(1, BIG);
    assert_non_null(buf);
    FILE *f = fopen(tu_path(e, p, sizeof p, name), "rb");
    if (f) {
        size_t k = fread(buf, 1, BIG - 1, f);
        buf[k] = '\0';
        fclose(f);
    }
    return buf;
}

/* Run `ENV BINDIR/TOOL ARGS` in the folder TMPDIR/TAG (made when missing; the command line, as
 * the file records it, is then the same for every TAG) with stdout to TAG.out and stderr to
 * TAG.err in TMPDIR (not a terminal); the thresholds unset first, so only env sets them.
 * Returns the exit status. */
static int run(const tu_env *e, const char *env, const char *tool, const char *args,
               const char *tag)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && mkdir -p '%s' && cd '%s' && env -u TPK_PROGRESS_AFTER "
             "-u TPK_PROGRESS_EVERY %s '%s/%s' %s >'../%s.out' 2>'../%s.err'", e->tmpdir, tag,
             tag, env, e->bindir, tool, args, tag, tag);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* Timings (a number right before " s" or "s)") as '#': the rest of stdout must not change. */
static void mask_timings(char *s)
{
    char *w = s;
    for (const char *r = s; *r;) {
        size_t k = strspn(r, "0123456789.");
        if (k > 0 && (strncmp(r + k, " s", 2) == 0 || strncmp(r + k, "s)", 2) == 0)) {
            *w++ = '#';
            r += k;
        } else if (k > 0) {
            memmove(w, r, k);
            w += k;
            r += k;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
}

/* ---- two HDF5 files alike: the same objects, datasets and attributes, "created" aside ---------- */

typedef struct walk {
    hid_t other;
    int n;
    const char *file;
} walk;

/* Values of attribute or dataset `what` (type t, n elements) of both files, equal. */
static void same_values(hid_t ta, const void *a, const void *b, hsize_t n, size_t size,
                        const char *what)
{
    if (H5Tis_variable_str(ta) > 0) {
        for (hsize_t i = 0; i < n; i++)
            if (strcmp(((char *const *)a)[i], ((char *const *)b)[i]) != 0)
                fail_msg("%s differs: '%s' vs '%s'", what, ((char *const *)a)[i],
                         ((char *const *)b)[i]);
        return;
    }
    if (memcmp(a, b, (size_t)n * size) != 0)
        fail_msg("%s differs", what);
}

typedef struct attr_walk {
    const char *obj;  /* the object's path in both files */
    hid_t other;      /* file b */
} attr_walk;

static herr_t attr_cb(hid_t loc, const char *name, const H5A_info_t *info, void *data)
{
    (void)info;
    const attr_walk *aw = data;
    const char *obj = aw->obj;
    /* the creation time differs by design; the dimension-scale bookkeeping holds references
     * and pointers, and the dimensions themselves are compared as datasets */
    if (strcmp(name, "created") == 0 || strcmp(name, "DIMENSION_LIST") == 0 ||
        strcmp(name, "REFERENCE_LIST") == 0)
        return 0;
    hid_t aa = H5Aopen(loc, name, H5P_DEFAULT);
    hid_t ab = H5Aexists_by_name(aw->other, obj, name, H5P_DEFAULT) > 0
                   ? H5Aopen_by_name(aw->other, obj, name, H5P_DEFAULT, H5P_DEFAULT)
                   : -1;
    if (ab < 0)
        fail_msg("attribute %s of %s only in one file", name, obj);
    hid_t ta = H5Aget_type(aa), tb = H5Aget_type(ab);
    hid_t ma = H5Tget_native_type(ta, H5T_DIR_ASCEND);
    hid_t sa = H5Aget_space(aa);
    hssize_t n = H5Sget_simple_extent_npoints(sa);
    if (H5Tequal(ta, tb) <= 0)
        fail_msg("attribute %s of %s: types differ", name, obj);
    size_t size = H5Tget_size(ma);
    void *va = calloc((size_t)n + 1, size), *vb = calloc((size_t)n + 1, size);
    assert_true(H5Aread(aa, ma, va) >= 0 && H5Aread(ab, ma, vb) >= 0);
    char what[1024];
    snprintf(what, sizeof what, "attribute %s of %s", name, obj);
    same_values(ta, va, vb, (hsize_t)n, size, what);
    if (H5Tis_variable_str(ta) > 0) {
        H5Dvlen_reclaim(ma, sa, H5P_DEFAULT, va);
        H5Dvlen_reclaim(ma, sa, H5P_DEFAULT, vb);
    }
    free(va);
    free(vb);
    H5Sclose(sa);
    H5Tclose(ma);
    H5Tclose(ta);
    H5Tclose(tb);
    H5Aclose(aa);
    H5Aclose(ab);
    return 0;
}

/* The attributes of object `name` in file a against file b. */
static void same_attrs(hid_t fa, hid_t fb, const char *name)
{
    attr_walk aw = {name, fb};
    hid_t oa = H5Oopen(fa, name, H5P_DEFAULT);
    hsize_t idx = 0;
    H5Aiterate2(oa, H5_INDEX_NAME, H5_ITER_INC, &idx, attr_cb, &aw);
    H5O_info_t ia, ib;
    hid_t ob = H5Oopen(fb, name, H5P_DEFAULT);
    H5Oget_info2(oa, &ia, H5O_INFO_NUM_ATTRS);
    H5Oget_info2(ob, &ib, H5O_INFO_NUM_ATTRS);
    if (ia.num_attrs != ib.num_attrs)
        fail_msg("%s: %llu vs %llu attributes", name, (unsigned long long)ia.num_attrs,
                 (unsigned long long)ib.num_attrs);
    H5Oclose(oa);
    H5Oclose(ob);
}

static herr_t visit_cb(hid_t fa, const char *name, const H5O_info_t *info, void *data)
{
    walk *w = data;
    w->n++;
    if (H5Oexists_by_name(w->other, name, H5P_DEFAULT) <= 0)
        fail_msg("%s: object %s only in one file", w->file, name);
    same_attrs(fa, w->other, name);
    /* gpregress's timings (units "s") differ from run to run by nature */
    if (info->type != H5O_TYPE_DATASET || strcmp(name, "seconds") == 0)
        return 0;
    hid_t da = H5Dopen2(fa, name, H5P_DEFAULT), db = H5Dopen2(w->other, name, H5P_DEFAULT);
    hid_t ta = H5Dget_type(da), tb = H5Dget_type(db);
    if (H5Tequal(ta, tb) <= 0)
        fail_msg("dataset %s: types differ", name);
    hid_t ma = H5Tget_native_type(ta, H5T_DIR_ASCEND);
    hid_t sa = H5Dget_space(da), sb = H5Dget_space(db);
    hssize_t n = H5Sget_simple_extent_npoints(sa);
    if (n != H5Sget_simple_extent_npoints(sb))
        fail_msg("dataset %s: shapes differ", name);
    size_t size = H5Tget_size(ma);
    void *va = calloc((size_t)n + 1, size), *vb = calloc((size_t)n + 1, size);
    assert_true(H5Dread(da, ma, H5S_ALL, H5S_ALL, H5P_DEFAULT, va) >= 0);
    assert_true(H5Dread(db, ma, H5S_ALL, H5S_ALL, H5P_DEFAULT, vb) >= 0);
    char what[600];
    snprintf(what, sizeof what, "dataset %s", name);
    same_values(ta, va, vb, (hsize_t)n, size, what);
    if (H5Tis_variable_str(ta) > 0) {
        H5Dvlen_reclaim(ma, sa, H5P_DEFAULT, va);
        H5Dvlen_reclaim(ma, sb, H5P_DEFAULT, vb);
    }
    free(va);
    free(vb);
    H5Sclose(sa);
    H5Sclose(sb);
    H5Tclose(ma);
    H5Tclose(ta);
    H5Tclose(tb);
    H5Dclose(da);
    H5Dclose(db);
    return 0;
}

/* The progress lines of PROG ("PROG: ... ETA ..." and the stage's last line) taken out of s. */
static void strip_progress(char *s, const char *prog)
{
    char *w = s, *line = s;
    size_t plen = strlen(prog);
    while (*line) {
        char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) + 1 : strlen(line);
        char keep = line[len - (end ? 1 : 0)];
        line[len - (end ? 1 : 0)] = '\0';
        int progress = strncmp(line, prog, plen) == 0 && line[plen] == ':' &&
                       (strstr(line, ", ETA ") || strstr(line, ", done in "));
        line[len - (end ? 1 : 0)] = keep;
        if (!progress) {
            memmove(w, line, len);
            w += len;
        }
        line += len;
    }
    *w = '\0';
}

static void assert_same_h5(const tu_env *e, const char *a, const char *b)
{
    char pa[512], pb[512];
    tu_path(e, pa, sizeof pa, a);
    tu_path(e, pb, sizeof pb, b);
    hid_t fa = H5Fopen(pa, H5F_ACC_RDONLY, H5P_DEFAULT), fb = H5Fopen(pb, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (fa < 0 || fb < 0)
        fail_msg("cannot open %s or %s", a, b);
    walk wa = {fb, 0, a}, wb = {fa, 0, b};
    H5Ovisit2(fa, H5_INDEX_NAME, H5_ITER_INC, visit_cb, &wa, H5O_INFO_BASIC);
    H5Ovisit2(fb, H5_INDEX_NAME, H5_ITER_INC, visit_cb, &wb, H5O_INFO_BASIC);
    assert_int_equal(wa.n, wb.n);
    assert_true(wa.n > 1);
    H5Fclose(fa);
    H5Fclose(fb);
}

/* ---- each tool -------------------------------------------------------------------------------- */

/* Lines drawn at every report, from the start: a run of a fraction of a second shows them. */
#define SHOW_ALL "TPK_PROGRESS_AFTER=0 TPK_PROGRESS_EVERY=0"

/* TOOL ARGS (PROG: how it names itself) with --progress, plain and with --quiet --progress,
 * each in a folder of its own (p/, n/, q/) writing o.h5 there: the line on stderr only with
 * --progress (plain lines, the stage named, the last "done in"), stderr otherwise the same,
 * stdout the same (timings aside) and the same files. */
static void check_tool(const tu_env *e, const char *tool, const char *prog, const char *args,
                       const char *stage)
{
    char a[4096];
    snprintf(a, sizeof a, "%s --output=o.h5 --progress", args);
    assert_int_equal(run(e, SHOW_ALL, tool, a, "p"), 0);
    snprintf(a, sizeof a, "%s --output=o.h5", args);
    assert_int_equal(run(e, SHOW_ALL, tool, a, "n"), 0);
    snprintf(a, sizeof a, "%s --output=o.h5 --quiet --progress", args);
    assert_int_equal(run(e, SHOW_ALL, tool, a, "q"), 0);
    char *perr = slurp(e, "p.err"), *pout = slurp(e, "p.out"), *nerr = slurp(e, "n.err"),
         *nout = slurp(e, "n.out"), *qerr = slurp(e, "q.err"), *qout = slurp(e, "q.out");
    char prefix[128];
    snprintf(prefix, sizeof prefix, "%s: %s", prog, stage);
    if (!strstr(perr, prefix) || !strstr(perr, "(100%), done in ") || !strstr(perr, ", ETA "))
        fail_msg("%s: no progress line on stderr with --progress:\n%s", tool, perr);
    assert_null(strchr(perr, '\r')); /* not a terminal: plain lines */
    assert_null(strstr(pout, "ETA"));
    assert_null(strstr(pout, "done in"));
    strip_progress(perr, prog);
    assert_string_equal(perr, nerr); /* warnings, if any, are the same */
    assert_null(strstr(nerr, "ETA"));
    assert_string_equal(qerr, "");
    assert_string_equal(qout, "");
    mask_timings(pout);
    mask_timings(nout);
    assert_string_equal(pout, nout);
    assert_true(strlen(nout) > 0);
    assert_same_h5(e, "p/o.h5", "n/o.h5");
    assert_same_h5(e, "p/o.h5", "q/o.h5");
    free(perr);
    free(pout);
    free(nerr);
    free(nout);
    free(qerr);
    free(qout);
}

static void test_gpkernel(void **state)
{
    const tu_env *e = *state;
    check_tool(e, "gpkernel", "gpkernel", "--arch=mlp --depth=3",
               "limit kernel: family instructions");
    /* a recurrent architecture through the unrolled evaluator */
    char args[1024];
    snprintf(args, sizeof args, "--arch=rnn --input='%s/data/demo-sequences.npy'", root());
    check_tool(e, "gpkernel", "gpkernel", args, "limit kernel:");
}

static void test_netsor(void **state)
{
    const tu_env *e = *state;
    char args[2048];
    snprintf(args, sizeof args, "kernel '%s/programs/mlp.nsr' --input='%s/data/demo-inputs.csv'",
             root(), root());
    check_tool(e, "netsor", "netsor kernel", args, "limit kernel: family instructions");
    snprintf(args, sizeof args, "run '%s/programs/mlp.nsr' --input='%s/data/demo-inputs.csv' "
             "--width=256 --seed=3", root(), root());
    check_tool(e, "netsor", "netsor run", args, "finite-width run: family instructions");
}

static void test_gpregress(void **state)
{
    const tu_env *e = *state;
    double X[40 * 3], Y[40], Xt[10 * 3];
    for (int i = 0; i < 120; i++)
        X[i] = sin(0.731 * i + 0.37);
    for (int i = 0; i < 40; i++)
        Y[i] = X[3 * i] - 0.385 * X[3 * i + 2];
    for (int i = 0; i < 30; i++)
        Xt[i] = cos(0.913 * i + 0.57);
    char p[512];
    tu_write_npy(tu_path(e, p, sizeof p, "x.npy"), X, 2, (size_t[]){40, 3});
    tu_write_npy(tu_path(e, p, sizeof p, "y.npy"), Y, 1, (size_t[]){40});
    tu_write_npy(tu_path(e, p, sizeof p, "xt.npy"), Xt, 2, (size_t[]){10, 3});
    check_tool(e, "gpregress", "gpregress",
               "--arch=mlp --train=../x.npy --labels=../y.npy --test=../xt.npy --depth=1-3", "steps");
}

static void test_gplimits_gpattention(void **state)
{
    const tu_env *e = *state;
    check_tool(e, "gplimits", "gplimits", "--arch=mlp --depth=2 --widths=16,32 --seeds=4 "
               "--boot=50 --max-inputs=3", "limit kernel: family instructions");
    char *perr = slurp(e, "p.err");
    assert_non_null(strstr(perr, "gplimits: (width, seed) runs 8/8 (100%), widths 2/2, done in"));
    free(perr);
    check_tool(e, "gpattention", "gpattention", "--tokens=2 --widths=16,32 --networks=8 "
               "--score-samples=8 --heads-list=1,2", "widths and head counts");
}

/* Without the environment's thresholds: a run shorter than 2 s draws nothing even with
 * --progress; with a long interval off a terminal, one line when due and the final one. */
static void test_thresholds(void **state)
{
    const tu_env *e = *state;
    assert_int_equal(run(e, "", "gpkernel", "--arch=mlp --output=t.h5 --progress", "t"), 0);
    char *err = slurp(e, "t.err");
    assert_string_equal(err, "");
    free(err);
    assert_int_equal(run(e, "TPK_PROGRESS_AFTER=0 TPK_PROGRESS_EVERY=1000", "gpkernel",
                         "--arch=mlp --output=t.h5 --progress", "t"), 0);
    err = slurp(e, "t.err");
    int lines = 0;
    for (const char *c = err; *c; c++)
        lines += *c == '\n';
    if (lines != 2 || !strstr(err, " 0/") || !strstr(err, "done in"))
        fail_msg("expected the first and the final line:\n%s", err);
    free(err);
    /* --no-progress wins over the environment */
    assert_int_equal(run(e, SHOW_ALL, "gpkernel", "--arch=mlp --output=t.h5 --no-progress", "t"), 0);
    err = slurp(e, "t.err");
    assert_string_equal(err, "");
    free(err);
}

/* Run the tool with stderr on a pseudo-terminal (stdout to TAG.out): what the terminal got. */
static char *run_on_tty(const tu_env *e, const char *env_after, const char *args, const char *tag)
{
    int m = posix_openpt(O_RDWR | O_NOCTTY);
    assert_true(m >= 0 && grantpt(m) == 0 && unlockpt(m) == 0);
    char slave[256];
    snprintf(slave, sizeof slave, "%s", ptsname(m));
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd '%s' && mkdir -p '%s' && cd '%s' && env -u TPK_PROGRESS_EVERY "
             "TPK_PROGRESS_AFTER=%s '%s/gpkernel' %s >'../%s.out' 2>'%s'", e->tmpdir, tag, tag,
             env_after, e->bindir, args, tag, slave);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(m);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    char *buf = calloc(1, BIG);
    size_t len = 0;
    int status = 0, done = 0;
    /* read until the child has ended and nothing is left (EIO once no slave is open) */
    int fl = fcntl(m, F_GETFL);
    fcntl(m, F_SETFL, fl | O_NONBLOCK);
    for (;;) {
        ssize_t k = read(m, buf + len, BIG - 1 - len);
        if (k > 0) {
            len += (size_t)k;
            continue;
        }
        if (done)
            break;
        if (waitpid(pid, &status, WNOHANG) == pid)
            done = 1;
        else
            nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    close(m);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    buf[len] = '\0';
    return buf;
}

/* On a terminal the line is the default, rewritten in place, ended by one newline. */
static void test_terminal(void **state)
{
    const tu_env *e = *state;
    char args[1024];
    snprintf(args, sizeof args, "--arch=rnn --input='%s/data/demo-sequences.npy' --output=o.h5",
             root());
    char *tty = run_on_tty(e, "0", args, "y");
    if (!strstr(tty, "\rgpkernel: limit kernel: ") || !strstr(tty, "(100%), done in "))
        fail_msg("no line rewritten in place on the terminal:\n%s", tty);
    /* every line of this one stage is the same line: the only newline ends it (a terminal
     * writes it as \r\n) */
    const char *nl = strchr(tty, '\n');
    assert_non_null(nl);
    assert_null(strchr(nl + 1, '\n'));
    free(tty);
    char *out = slurp(e, "y.out");
    assert_non_null(strstr(out, "kernel: rnn"));
    assert_null(strstr(out, "ETA"));
    free(out);
    snprintf(args, sizeof args, "--arch=rnn --input='%s/data/demo-sequences.npy' --output=o.h5 "
             "--no-progress", root());
    tty = run_on_tty(e, "0", args, "z");
    assert_string_equal(tty, "");
    free(tty);
    assert_same_h5(e, "y/o.h5", "z/o.h5");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpkernel),
        cmocka_unit_test(test_netsor),
        cmocka_unit_test(test_gpregress),
        cmocka_unit_test(test_gplimits_gpattention),
        cmocka_unit_test(test_thresholds),
        cmocka_unit_test(test_terminal),
    };
    return cmocka_run_group_tests(tests, setup, tu_teardown);
}
