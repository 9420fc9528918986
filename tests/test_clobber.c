/* Nothing a run is given or told is lost (issue 18): an output that is an input, tpk_io_check_output against the same
 * path, another spelling, a hard link, a symlink and an HDF5 dataset spec; and every program that
 * writes, run with its output on one of its inputs, exits non-zero with the message and leaves
 * the input byte for byte as it was; a signal leaves no temp file and the previous output intact;
 * stale temp files of dead processes go at the next run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "support/testutil.h"
#include "tpk/io.h"

/* The whole file, malloc'd (len set); NULL if it cannot be read. */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    *len = fread(b, 1, (size_t)n, f);
    fclose(f);
    return b;
}

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static void test_check_output(void **state)
{
    tu_env *e = *state;
    char a[512], b[512], hard[512], sym[512], other[512], spec[600], dotted[600];
    tu_path(e, a, sizeof a, "a.csv");
    tu_path(e, b, sizeof b, "b.csv");
    tu_path(e, hard, sizeof hard, "hard.csv");
    tu_path(e, sym, sizeof sym, "sym.csv");
    tu_path(e, other, sizeof other, "other.h5");
    put(a, "1.5,2.25\n3.125,4.0\n");
    put(b, "0.5,0.75\n");
    put(other, "not really hdf5");
    assert_int_equal(link(a, hard), 0);
    assert_int_equal(symlink(a, sym), 0);
    snprintf(spec, sizeof spec, "%s:/kernel", other);
    snprintf(dotted, sizeof dotted, "%s/./a.csv", e->tmpdir);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    const char *ins[] = {NULL, "", b, sym};
    /* a is reached through the symlink; b is another file */
    assert_int_equal(tpk_io_check_output(a, ins, 4, &ctx), TPK_EINVAL);
    assert_non_null(strstr(ctx.msg, "would destroy it"));
    tpk_ctx_clear(&ctx);
    assert_int_equal(tpk_io_check_output(hard, ins, 4, &ctx), TPK_EINVAL); /* hard link */
    tpk_ctx_clear(&ctx);
    assert_int_equal(tpk_io_check_output(dotted, ins, 4, &ctx), TPK_EINVAL); /* another spelling */
    tpk_ctx_clear(&ctx);
    assert_int_equal(tpk_io_check_output(b, ins, 3, &ctx), TPK_EINVAL);
    tpk_ctx_clear(&ctx);
    assert_int_equal(tpk_io_check_output(other, ins, 4, &ctx), TPK_OK);
    const char *h5[] = {spec};
    assert_int_equal(tpk_io_check_output(other, h5, 1, &ctx), TPK_EINVAL); /* file of f.h5:/ds */
    tpk_ctx_clear(&ctx);
    char fresh[512];
    tu_path(e, fresh, sizeof fresh, "new.h5");
    assert_int_equal(tpk_io_check_output(fresh, ins, 4, &ctx), TPK_OK); /* does not exist yet */
    assert_int_equal(tpk_io_check_output(NULL, ins, 4, &ctx), TPK_OK);
}

/* Each program with its output on one of its inputs: exit 1, the message, the input unchanged,
 * no temporary file left beside it. */
static void test_programs_refuse(void **state)
{
    tu_env *e = *state;
    const char *root = getenv("TPK_ROOT") ? getenv("TPK_ROOT") : ".";
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cp '%s/data/demo-inputs.csv' '%s/x.csv' && cp '%s/programs/mlp.nsr' '%s/p.nsr'",
             root, e->tmpdir, root, e->tmpdir);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "--arch=mlp --input=%s/x.csv --output=%s/k.h5", e->tmpdir, e->tmpdir);
    if (tu_run_tool(e, "gpkernel", cmd) != 0) {
        char err[2048];
        tu_stderr(e, err, sizeof err);
        fail_msg("gpkernel %s: %s", cmd, err);
    }
    snprintf(cmd, sizeof cmd, "ln '%s/x.csv' '%s/hardx.csv'", e->tmpdir, e->tmpdir);
    assert_int_equal(system(cmd), 0);
    static const struct { const char *tool, *args, *victim; } cases[] = {
        {"gpkernel", "--arch=mlp --input=D/x.csv --output=D/x.csv", "x.csv"},
        {"gpkernel", "--arch=mlp --input=D/x.csv --output=D/hardx.csv", "x.csv"},
        {"gpkernel", "--arch=mlp --input=D/k.h5:/kernel --output=D/k.h5", "k.h5"},
        {"gpkernel", "--program=D/p.nsr --input=D/x.csv --output=D/p.nsr", "p.nsr"},
        {"netsor", "kernel D/p.nsr --input=D/x.csv --output=D/p.nsr", "p.nsr"},
        {"netsor", "run D/p.nsr --input=D/x.csv --width=8 --output=D/x.csv", "x.csv"},
        {"gpregress", "--kernel=D/k.h5 --labels=D/x.csv --output=D/k.h5", "k.h5"},
        {"gplimits", "--arch=mlp --input=D/x.csv --widths=8..16 --seeds=4 --output=D/x.csv", "x.csv"},
        {"gpattention", "--input=D/x.csv --output=D/x.csv", "x.csv"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[2048] = "", victim[600];
        for (const char *p = cases[i].args; *p; p++) {
            size_t n = strlen(args);
            if (*p == 'D' && (p == cases[i].args || p[-1] == '=' || p[-1] == ' ') && p[1] == '/')
                snprintf(args + n, sizeof args - n, "%s", e->tmpdir);
            else
                snprintf(args + n, sizeof args - n, "%c", *p);
        }
        snprintf(victim, sizeof victim, "%s/%s", e->tmpdir, cases[i].victim);
        size_t before_len, after_len;
        char *before = slurp(victim, &before_len);
        assert_non_null(before);
        int rc = tu_run_tool(e, cases[i].tool, args);
        char err[4096];
        tu_stderr(e, err, sizeof err);
        char *after = slurp(victim, &after_len);
        if (rc != 1 || !strstr(err, "would destroy it") || !after || after_len != before_len ||
            memcmp(before, after, before_len) != 0)
            fail_msg("%s %s: rc %d, '%s'%s", cases[i].tool, args, rc, err,
                     after && after_len == before_len && !memcmp(before, after, before_len) ? ""
                                                                                           : " and the input changed");
        free(before), free(after);
    }
    /* nothing but the files made here: no temporary or partial file left */
    snprintf(cmd, sizeof cmd, "test $(ls -A '%s' | grep -v -x -e x.csv -e p.nsr -e k.h5 -e hardx.csv -e err.txt -e a.csv -e b.csv -e other.h5 -e hard.csv -e sym.csv | wc -l) = 0",
             e->tmpdir);
    assert_int_equal(system(cmd), 0);
}

/* Number of "<dir>/.<base>.tmp.*" files. */
static int temps(const char *dir, const char *base)
{
    char pre[256];
    snprintf(pre, sizeof pre, ".%s.tmp.", base);
    return tu_count_prefix(dir, pre);
}

/* SIGINT, SIGTERM and SIGHUP while the output's temp file exists: exit 130 / 143 / 129, no temp
 * file left, the previous output intact. A stale temp file of a dead process is removed by the
 * next run into the same path; one of a live process (pid 1) is not. */
static void test_signals_and_stale_temps(void **state)
{
    tu_env *e = *state;
    char out[600], stale[700], live[700], bin[1200];
    snprintf(out, sizeof out, "%s/sig.h5", e->tmpdir);
    snprintf(bin, sizeof bin, "%s/gpkernel", e->bindir);
    /* the previous good output: a file of this toolkit (another file is refused outright) */
    char prev[1400];
    snprintf(prev, sizeof prev, "--arch=mlp --depth=2 --quiet --output='%s'", out);
    assert_int_equal(tu_run_tool(e, "gpkernel", prev), 0);
    size_t good_len;
    char *good = slurp(out, &good_len);
    assert_non_null(good);
    /* 400 inputs through 30000 layers (mlp's deepest): seconds of work after the output is
     * opened */
    char in[600], inarg[700];
    snprintf(in, sizeof in, "%s/many.csv", e->tmpdir);
    FILE *f = fopen(in, "w");
    assert_non_null(f);
    for (int r = 0; r < 400; r++)
        fprintf(f, "%.3f,%.3f,%.3f\n", 0.5 + 0.013 * r, 1.25 - 0.007 * r, 0.001 * r * r);
    fclose(f);
    snprintf(inarg, sizeof inarg, "--input=%s", in);
    const int sigs[3] = {SIGINT, SIGTERM, SIGHUP}; /* SIGHUP: a closed terminal (issue 18) */
    for (int i = 0; i < 3; i++) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            signal(SIGINT, SIG_DFL); /* a test runner may start us with SIGINT ignored */
            signal(SIGTERM, SIG_DFL);
            signal(SIGHUP, SIG_DFL);
            int fd = open("/dev/null", O_WRONLY);
            dup2(fd, 1);
            dup2(fd, 2);
            char o[700];
            snprintf(o, sizeof o, "--output=%s", out);
            execl(bin, bin, "--arch=mlp", "--depth=30000", inarg, o, (char *)NULL);
            _exit(127);
        }
        int seen = 0;
        for (int k = 0; k < 2000 && !seen; k++) { /* up to 20 s for the temp file to appear */
            seen = temps(e->tmpdir, "sig.h5") > 0;
            if (!seen)
                nanosleep(&(struct timespec){0, 10000000}, NULL);
        }
        assert_true(seen);
        kill(pid, sigs[i]);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 128 + sigs[i]);
        assert_int_equal(temps(e->tmpdir, "sig.h5"), 0);
        size_t len;
        char *was = slurp(out, &len);
        assert_true(was && len == good_len && !memcmp(was, good, len));
        free(was);
    }
    /* stale temp files: pid 4194303 + 1 cannot exist (above Linux's pid_max limit); pid 1 does */
    snprintf(stale, sizeof stale, "%s/.sig.h5.tmp.4194305.0123456789abcdef", e->tmpdir);
    snprintf(live, sizeof live, "%s/.sig.h5.tmp.1.0123456789abcdef", e->tmpdir);
    put(stale, "");
    put(live, "");
    char args[1400];
    snprintf(args, sizeof args, "--arch=mlp --depth=2 --output=%s", out);
    assert_int_equal(tu_run_tool(e, "gpkernel", args), 0);
    assert_int_equal(access(stale, F_OK), -1);
    assert_int_equal(access(live, F_OK), 0);
    unlink(live);
    free(good);
}

/* An output path that holds something else (issue 39, item 4: --output=notes.txt replaced a text
 * file with HDF5 without a word): tpk_h5out_check_replace says what it is and names --force. */
static void test_check_replace(void **state)
{
    tu_env *e = *state;
    char text[512], foreign[512], ours[512], none[512], args[1400];
    tu_path(e, text, sizeof text, "notes.txt");
    tu_path(e, foreign, sizeof foreign, "foreign.h5");
    tu_path(e, ours, sizeof ours, "ours.h5");
    tu_path(e, none, sizeof none, "none.h5");
    put(text, "my notes\n");
    const double v[4] = {1.5, 2.25, -0.75, 3.125};
    tu_h5_write(foreign, "/kernel", v, 2, 2); /* HDF5, but not this toolkit's */
    snprintf(args, sizeof args, "--arch=mlp --depth=2 --quiet --output='%s'", ours);
    assert_int_equal(tu_run_tool(e, "gpkernel", args), 0);
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    assert_int_equal(tpk_h5out_check_replace(none, 0, &ctx), TPK_OK);
    assert_int_equal(tpk_h5out_check_replace(ours, 0, &ctx), TPK_OK);
    assert_int_equal(tpk_h5out_check_replace(text, 1, &ctx), TPK_OK);
    assert_int_equal(tpk_h5out_check_replace(foreign, 1, &ctx), TPK_OK);
    assert_int_equal(tpk_h5out_check_replace(text, 0, &ctx), TPK_EINVAL);
    assert_non_null(strstr(ctx.msg, "notes.txt exists and is not an HDF5 file"));
    assert_non_null(strstr(ctx.msg, "--force"));
    tpk_ctx_clear(&ctx);
    assert_int_equal(tpk_h5out_check_replace(foreign, 0, &ctx), TPK_EINVAL);
    assert_non_null(strstr(ctx.msg, "this toolkit did not write"));
    tpk_ctx_clear(&ctx);
    assert_int_equal(tpk_h5out_check_replace(e->tmpdir, 1, &ctx), TPK_EIO); /* a folder, ever */
    tpk_ctx_clear(&ctx);
    assert_int_equal(tpk_h5out_check_replace("/dev/null", 0, &ctx), TPK_EINVAL);
    assert_non_null(strstr(ctx.msg, "not a regular file"));
}

/* Every program that writes an output, aimed at a text file and at an HDF5 file another program
 * wrote: exit 1, the message names --force, the file byte for byte as it was, no temporary left;
 * with --force it is replaced by the program's own file, which a rerun replaces without it. */
static void test_programs_keep_foreign_files(void **state)
{
    tu_env *e = *state;
    const char *root = getenv("TPK_ROOT") ? getenv("TPK_ROOT") : ".";
    char text[512], foreign[512];
    tu_path(e, text, sizeof text, "notes.txt");
    tu_path(e, foreign, sizeof foreign, "foreign.h5");
    const double v[6] = {0.5, -1.25, 2.0, 0.125, 3.5, -0.625};
    static const struct { const char *tool, *args; } cases[] = {
        {"gpkernel", "--arch=mlp --depth=2"},
        {"netsor", "kernel R/programs/mlp.nsr --input=R/data/demo-inputs.csv"},
        {"netsor", "run R/programs/mlp.nsr --input=R/data/demo-inputs.csv --width=8"},
        {"gplimits", "--arch=mlp --depth=1 --widths=8,16 --seeds=4 --boot=50 --max-inputs=3"},
        {"gpregress", "--arch=rbf --train=R/data/demo-inputs.csv --labels=R/data/demo-inputs.csv"},
        {"gpattention", "--widths=4,8 --networks=8 --score-samples=8 --heads-list=1,2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char base[1024] = "";
        for (const char *p = cases[i].args; *p; p++) { /* R/ is TPK_ROOT */
            size_t n = strlen(base);
            if (*p == 'R' && p[1] == '/' && (p == cases[i].args || p[-1] == '=' || p[-1] == ' '))
                snprintf(base + n, sizeof base - n, "%s", root);
            else
                snprintf(base + n, sizeof base - n, "%c", *p);
        }
        for (int k = 0; k < 2; k++) {
            const char *victim = k ? foreign : text;
            unlink(victim);
            if (k)
                tu_h5_write(foreign, "/x", v, 3, 2);
            else
                put(text, "my notes: not a kernel\n");
            size_t before_len, after_len;
            char *before = slurp(victim, &before_len), args[2400], err[4096];
            snprintf(args, sizeof args, "%s --quiet --output='%s'", base, victim);
            int rc = tu_run_tool(e, cases[i].tool, args);
            tu_stderr(e, err, sizeof err);
            char *after = slurp(victim, &after_len);
            if (rc != 1 || !strstr(err, "--force") || !strstr(err, "refusing to replace") ||
                !after || after_len != before_len || memcmp(before, after, before_len) != 0)
                fail_msg("%s %s: rc %d, '%s'", cases[i].tool, args, rc, err);
            free(before), free(after);
            assert_int_equal(tu_count_prefix(e->tmpdir, k ? ".foreign.h5.tmp." : ".notes.txt.tmp."),
                             0);
            snprintf(args, sizeof args, "%s --quiet --force --output='%s'", base, victim);
            if (tu_run_tool(e, cases[i].tool, args) != 0) {
                tu_stderr(e, err, sizeof err);
                fail_msg("%s %s: %s", cases[i].tool, args, err);
            }
            assert_true(tu_h5_has_attr(victim, "toolkit_version"));
            snprintf(args, sizeof args, "%s --quiet --output='%s'", base, victim);
            assert_int_equal(tu_run_tool(e, cases[i].tool, args), 0); /* our own file: replaced */
        }
    }
    unlink(text);
    unlink(foreign);
}

static int setup(void **state)
{
    return tu_setup_tagged(state, "clobber");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_output),
        cmocka_unit_test(test_programs_refuse),
        cmocka_unit_test(test_signals_and_stale_temps),
        cmocka_unit_test(test_check_replace),
        cmocka_unit_test(test_programs_keep_foreign_files),
    };
    return cmocka_run_group_tests(tests, setup, tu_teardown);
}
