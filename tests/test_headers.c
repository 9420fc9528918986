/* The public headers as a packager sees them (issue 17, item 5): the umbrella tpk/tpk.h includes
 * every header of libtpk (all of include/tpk/ but the tuner's tune.h), compiles alone in C11 and
 * C++, and the version macros agree with tpk_version() and the Makefile's VERSION. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "support/testutil.h"
#include "tpk/tpk.h"

static int setup(void **state) { return tu_setup_tagged(state, "headers"); }

static const char *root(void)
{
    const char *r = getenv("TPK_ROOT");
    return r && *r ? r : ".";
}

/* The whole file, NUL-terminated (the caller frees it); a fixed buffer had cut the change log
 * once it grew past 64 KiB, and its newest release heading with it. */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot read %s", path);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    for (size_t got; (got = fread(buf + n, 1, cap - 1 - n, f)) > 0;) {
        n += got;
        if (n == cap - 1) {
            char *nb = realloc(buf, 2 * cap);
            assert_non_null(nb);
            buf = nb;
            cap *= 2;
        }
    }
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void test_umbrella_lists_every_header(void **state)
{
    (void)state;
    char dir[1100], path[1200];
    snprintf(dir, sizeof dir, "%s/include/tpk", root());
    snprintf(path, sizeof path, "%s/tpk.h", dir);
    char *umbrella = slurp(path);
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name);
        if (len < 3 || strcmp(de->d_name + len - 2, ".h") != 0 || !strcmp(de->d_name, "tpk.h") ||
            !strcmp(de->d_name, "tune.h"))
            continue;
        char inc[300];
        snprintf(inc, sizeof inc, "#include \"%s\"", de->d_name);
        if (!strstr(umbrella, inc))
            fail_msg("include/tpk/tpk.h does not include %s", de->d_name);
        n++;
    }
    closedir(d);
    assert_true(n >= 20);
    assert_null(strstr(umbrella, "\"tune.h\""));
    free(umbrella);
}

/* The umbrella alone (no other include first) with the strictest warnings, as C11 and C++. */
static void test_umbrella_compiles_alone(void **state)
{
    const tu_env *e = *state;
    char src[512], cmd[4096];
    tu_path(e, src, sizeof src, "u.c");
    FILE *f = fopen(src, "w");
    assert_non_null(f);
    fputs("#include <tpk/tpk.h>\nint main(void) { return tpk_version_number() == "
          "TPK_VERSION_NUMBER ? 0 : 1; }\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "cc -std=c11 -Wall -Wextra -Werror -Wstrict-prototypes "
             "-fsyntax-only -I'%s/include' $(pkg-config --cflags hdf5 2>/dev/null) '%s' "
             ">'%s/cc.txt' 2>&1", root(), src, e->tmpdir);
    if (system(cmd) != 0)
        fail_msg("tpk/tpk.h does not compile alone as C11 (see %s/cc.txt)", e->tmpdir);
    if (system("command -v c++ >/dev/null 2>&1") != 0) {
        print_message("no C++ compiler: the C++ check is skipped\n");
        return;
    }
    snprintf(cmd, sizeof cmd, "c++ -x c++ -Wall -Wextra -Werror -fsyntax-only -I'%s/include' "
             "'%s' >'%s/cxx.txt' 2>&1", root(), src, e->tmpdir);
    if (system(cmd) != 0)
        fail_msg("tpk/tpk.h does not compile alone as C++ (see %s/cxx.txt)", e->tmpdir);
}

static void test_version(void **state)
{
    (void)state;
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", TPK_VERSION_MAJOR, TPK_VERSION_MINOR,
             TPK_VERSION_PATCH);
    assert_string_equal(TPK_VERSION_STRING, want);
    assert_string_equal(tpk_version(), TPK_VERSION_STRING);
    assert_int_equal(tpk_version_number(),
                     TPK_VERSION_MAJOR * 10000 + TPK_VERSION_MINOR * 100 + TPK_VERSION_PATCH);
    /* what the tools print and the output files record (-DTPK_VERSION from the Makefile) */
    assert_string_equal(TPK_VERSION, TPK_VERSION_STRING);
    /* the newest release in the change log is this version or older */
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", root(), "CHANGELOG" ".md");
    char *cl = slurp(path);
    const char *rel = strstr(cl, "\n## [0");
    assert_non_null(rel);
    int ma, mi, pa;
    assert_int_equal(sscanf(rel, "\n## [%d.%d.%d]", &ma, &mi, &pa), 3);
    assert_true(ma * 10000 + mi * 100 + pa <= TPK_VERSION_NUMBER);
    free(cl);
    /* the Python package's metadata carries the same version (tpk.__version__ asks the library) */
    snprintf(path, sizeof path, "%s/python/pyproject.toml", root());
    char *toml = slurp(path);
    const char *py = strstr(toml, "\nversion = \"");
    assert_non_null(py);
    char pv[32] = "";
    assert_int_equal(sscanf(py, "\nversion = \"%31[^\"]", pv), 1);
    free(toml);
    assert_string_equal(pv, TPK_VERSION_STRING);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_umbrella_lists_every_header),
        cmocka_unit_test(test_umbrella_compiles_alone),
        cmocka_unit_test(test_version),
    };
    return cmocka_run_group_tests_name("headers", tests, setup, tu_teardown);
}
