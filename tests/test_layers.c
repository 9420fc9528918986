/* The layering check (scripts/check-layers.sh over mk/layers.txt): the real tree passes, includes
 * and calls, and a tree with one upward include, one upward call or one file cycle fails with the
 * offending place named. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "support/testutil.h"

static const char *root(void)
{
    const char *r = getenv("TPK_ROOT");
    return r && *r ? r : ".";
}

/* Runs the checker on ROOT [OBJ]; its output goes to TMPDIR/layers.txt and into out. */
static int run_check(const tu_env *e, const char *tree, const char *obj, char *out, size_t cap)
{
    char log[512], cmd[4096];
    tu_path(e, log, sizeof log, "layers.out");
    snprintf(cmd, sizeof cmd, "sh '%s/scripts/check-layers.sh' '%s' %s%s%s > '%s' 2>&1", root(), tree,
             obj ? "'" : "", obj ? obj : "", obj ? "'" : "", log);
    int rc = system(cmd);
    FILE *f = fopen(log, "r");
    size_t n = f ? fread(out, 1, cap - 1, f) : 0;
    out[n] = '\0';
    if (f)
        fclose(f);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static void sh(const char *cmd)
{
    assert_int_equal(system(cmd), 0);
}

static void test_real_tree_passes(void **state)
{
    tu_env *e = *state;
    char out[8192], obj[1100];
    /* The objects of this very build: TPK_BIN is BUILD/bin. */
    snprintf(obj, sizeof obj, "%s/../obj", e->bindir);
    struct stat st;
    int rc = run_check(e, root(), stat(obj, &st) == 0 ? obj : NULL, out, sizeof out);
    if (rc != 0)
        fprintf(stderr, "%s", out);
    assert_int_equal(rc, 0);
    assert_string_equal(out, "");
}

/* A copy of mk/layers.txt and a small tree of its folders in TMPDIR/tree. */
static void make_tree(const tu_env *e, char *tree, size_t cap)
{
    char cmd[2048];
    tu_path(e, tree, cap, "tree");
    snprintf(cmd, sizeof cmd,
             "rm -rf '%s' && mkdir -p '%s/mk' '%s/core' '%s/netsor' '%s/include/tpk' && "
             "cp '%s/mk/layers.txt' '%s/mk/' && cp '%s/include/tpk/error.h' '%s/include/tpk/netsor.h' "
             "'%s/include/tpk/'",
             tree, tree, tree, tree, tree, root(), tree, root(), root(), tree);
    sh(cmd);
}

static void test_upward_include_fails(void **state)
{
    tu_env *e = *state;
    char tree[512], p[700], out[8192];
    make_tree(e, tree, sizeof tree);
    snprintf(p, sizeof p, "%s/core/ok.c", tree);
    write_file(p, "#include \"tpk/error.h\"\nint tpk_ok(void);\nint tpk_ok(void) { return 0; }\n");
    assert_int_equal(run_check(e, tree, NULL, out, sizeof out), 0);
    /* core sits below netsor: including netsor's public header from core runs upward. */
    snprintf(p, sizeof p, "%s/core/bad.c", tree);
    write_file(p, "#include \"tpk/error.h\"\n\n#include \"tpk/netsor.h\"\n");
    assert_int_equal(run_check(e, tree, NULL, out, sizeof out), 1);
    assert_non_null(strstr(out, "core/bad.c:3: core includes tpk/netsor.h (netsor)"));
    /* So does a relative include into a higher folder, and a header no layer owns. */
    write_file(p, "#include \"../netsor/netsor-impl.h\"\n#include \"tpk/nowhere.h\"\n");
    assert_int_equal(run_check(e, tree, NULL, out, sizeof out), 1);
    assert_non_null(strstr(out, "core/bad.c:1: core includes ../netsor/netsor-impl.h (netsor)"));
    assert_non_null(strstr(out, "core/bad.c:2: includes tpk/nowhere.h, owned by no layer"));
}

static void test_upward_call_and_cycle_fail(void **state)
{
    tu_env *e = *state;
    char tree[512], cmd[4096], out[8192];
    make_tree(e, tree, sizeof tree);
    /* Objects: core/low.o calls netsor's tpk_high (upward); netsor/a.o and b.o call each other. */
    snprintf(cmd, sizeof cmd,
             "cd '%s' && mkdir -p obj/core obj/netsor && "
             "printf 'int tpk_high(void);\\nint tpk_low(void);\\nint tpk_low(void) { return tpk_high(); }\\n' > core/low.c && "
             "printf 'int tpk_low(void);\\nint tpk_b(void);\\nint tpk_high(void);\\nint tpk_high(void) { return tpk_low() + tpk_b(); }\\n' > netsor/a.c && "
             "printf 'int tpk_high(void);\\nint tpk_b(void);\\nint tpk_b(void) { return tpk_high(); }\\n' > netsor/b.c && "
             "cc -c core/low.c -o obj/core/low.o && cc -c netsor/a.c -o obj/netsor/a.o && "
             "cc -c netsor/b.c -o obj/netsor/b.o",
             tree);
    sh(cmd);
    char obj[600];
    snprintf(obj, sizeof obj, "%s/obj", tree);
    assert_int_equal(run_check(e, tree, obj, out, sizeof out), 1);
    assert_non_null(strstr(out, "core/low.o: calls tpk_high of netsor/a.o: not below core"));
    assert_non_null(strstr(out, "files that call each other in a cycle"));
    assert_non_null(strstr(out, "netsor/a.o"));
    assert_non_null(strstr(out, "netsor/b.o"));
    /* Without the upward call and the cycle the same tree passes: the failures were those two. */
    snprintf(cmd, sizeof cmd,
             "cd '%s' && printf 'int tpk_low(void);\\nint tpk_low(void) { return 1; }\\n' > core/low.c && "
             "printf 'int tpk_b(void);\\nint tpk_b(void) { return 2; }\\n' > netsor/b.c && "
             "cc -c core/low.c -o obj/core/low.o && cc -c netsor/b.c -o obj/netsor/b.o",
             tree);
    sh(cmd);
    assert_int_equal(run_check(e, tree, obj, out, sizeof out), 0);
}

static int setup(void **state)
{
    return tu_setup_tagged(state, "layers");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_tree_passes),
        cmocka_unit_test(test_upward_include_fails),
        cmocka_unit_test(test_upward_call_and_cycle_fail),
    };
    return cmocka_run_group_tests(tests, setup, tu_teardown);
}
