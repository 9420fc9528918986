/* An output that is an input destroys nothing (issue 18): tpk_io_check_output against the same
 * path, another spelling, a hard link, a symlink and an HDF5 dataset spec; and every program that
 * writes, run with its output on one of its inputs, exits non-zero with the message and leaves
 * the input byte for byte as it was. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static int setup(void **state)
{
    return tu_setup_tagged(state, "clobber");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_output),
        cmocka_unit_test(test_programs_refuse),
    };
    return cmocka_run_group_tests(tests, setup, tu_teardown);
}
