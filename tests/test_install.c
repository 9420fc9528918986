/* `make install` / `make uninstall` into a staging folder (DESTDIR, PREFIX, LIBDIR) as a
 * packager runs them, and programs built against the result with pkg-config, shared and static
 * (scripts/check-install.sh; fully static too); that libtpk.a defines no global name without the
 * tpk_ prefix; what `make debug` compiles with; which OpenBLAS the build runs on; and what a fresh
 * machine shows first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <glob.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/testutil.h"

static int setup(void **state) { return tu_setup_tagged(state, "install"); }

static void test_staged_install(void **state)
{
    const tu_env *e = *state;
    const char *r = getenv("TPK_ROOT");
    char root[1024], build[1100], cmd[4096];
    snprintf(root, sizeof root, "%s", r && *r ? r : ".");
    snprintf(build, sizeof build, "%s", e->bindir);
    char *b = dirname(build); /* TPK_BIN is BUILD/bin */
    snprintf(cmd, sizeof cmd, "sh '%s/scripts/check-install.sh' '%s' '%s' '%s' >'%s/out.txt' "
             "2>&1", root, root, b, e->tmpdir, e->tmpdir);
    int rc = system(cmd);
    if (rc != 0) {
        snprintf(cmd, sizeof cmd, "cat '%s/out.txt' >&2", e->tmpdir);
        if (system(cmd) != 0)
            print_error("(no output)\n");
        fail_msg("scripts/check-install.sh failed");
    }
}

/* Every global symbol that libtpk.a defines carries the prefix (issue 40, item 3): a user's
 * static link meets no nsr_*, orch_* or other internal name of the library. The archive is one
 * partial link whose other globals were made local (the Makefile's public_archive). */
static void test_archive_prefix(void **state)
{
    const tu_env *e = *state;
    char build[1100], cmd[1400], out[4096];
    snprintf(build, sizeof build, "%s", e->bindir);
    char *b = dirname(build);
    snprintf(cmd, sizeof cmd, "nm -g --defined-only '%s/lib/libtpk.a' | awk 'NF == 3 { n++; "
             "if ($3 !~ /^tpk_/) print $3 } END { print \"defined:\", n + 0 }'", b);
    assert_int_equal(tu_capture(cmd, out, sizeof out), 0);
    print_message("%s", out);
    /* only the count line: no name without the prefix */
    assert_int_equal(strncmp(out, "defined: ", 9), 0);
    assert_true(atoi(out + 9) > 300); /* the public API is there, not an empty archive */
}

/* `make debug` (issue 40, item 4) builds for valgrind and gdb: a dry run (make -n -B, nothing
 * built) shows every kernel object compiled -O1 -g for x86-64-v2 (no AVX-512, on which valgrind
 * 3.19 stops with SIGILL), nothing for -march=native, and the examples linked. */
static void test_debug_build_flags(void **state)
{
    const tu_env *e = *state;
    const char *r = getenv("TPK_ROOT");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -n -B -C '%s' "
             "DEBUG_BUILD='%s/dbg' debug >'%s/debug.txt' 2>&1", r && *r ? r : ".", e->tmpdir,
             e->tmpdir);
    assert_int_equal(system(cmd), 0);
    char out[64];
    /* kernel objects: all of them -O1 -g for x86-64-v2 */
    snprintf(cmd, sizeof cmd, "grep -E -- '-c kernels/[a-z_]+\\.c' '%s/debug.txt' | "
             "awk '/-O1 -g/ && /-march=x86-64-v2/ { ok++ } { n++ } END { print n + 0, ok + 0 }'",
             e->tmpdir);
    assert_int_equal(tu_capture(cmd, out, sizeof out), 0);
    int n = 0, ok = -1;
    assert_int_equal(sscanf(out, "%d %d", &n, &ok), 2);
    print_message("make debug: %d kernel objects, %d of them -O1 -g -march=x86-64-v2\n", n, ok);
    assert_true(n >= 10);
    assert_int_equal(ok, n);
    snprintf(cmd, sizeof cmd, "grep -c -- '-march=native' '%s/debug.txt'", e->tmpdir);
    tu_capture(cmd, out, sizeof out);
    assert_int_equal(atoi(out), 0);
    snprintf(cmd, sizeof cmd, "grep -c -- '-o %s/dbg/examples/gp_mlp ' '%s/debug.txt'", e->tmpdir,
             e->tmpdir);
    assert_int_equal(tu_capture(cmd, out, sizeof out), 0);
}

/* Where Debian's OpenMP build of OpenBLAS is installed, the programs run on it (the Makefile's
 * run path; without it libopenblas.so.0 resolves to the pthread alternative, whose spinning
 * workers slow the OpenMP loops beside them): this test program's own mapping says which. */
static void test_openblas_build(void **state)
{
    (void)state;
    glob_t g;
    int have = glob("/usr/lib/*/openblas-openmp/libopenblas.so.0", 0, NULL, &g) == 0;
    if (have)
        globfree(&g);
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        skip();
    char line[4096];
    int openmp = 0, other = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "libopenblas")) {
            openmp += strstr(line, "openblas-openmp") != NULL;
            other += strstr(line, "openblas-openmp") == NULL;
        }
    fclose(f);
    print_message("OpenBLAS mappings: %d of the OpenMP build, %d of another (OpenMP build %s)\n",
                  openmp, other, have ? "installed" : "not installed");
    assert_true(openmp + other > 0);
    if (have)
        assert_true(openmp > 0 && other == 0);
}

/* A file of the given text, executable. */
static void put_script(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "chmod +x '%s'", path);
    assert_int_equal(system(cmd), 0);
}

/* A fresh machine (issue 39, item 12): pkg-config knows none of the libraries. `make run` must
 * not print pkg-config's complaints before scripts/install-deps.sh runs (make -n: the commands in
 * order, the install not run), and install-deps says in one line what it installs, apt-get's
 * own chatter kept in a log (a stand-in apt-get here, which prints as dpkg does). */
static void test_fresh_machine_first_screen(void **state)
{
    const tu_env *e = *state;
    const char *r = getenv("TPK_ROOT");
    char root[1024], bin[600], p[700], cmd[4096], out[16384];
    snprintf(root, sizeof root, "%s", r && *r ? r : ".");
    snprintf(bin, sizeof bin, "%s/fakebin", e->tmpdir);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", bin);
    assert_int_equal(system(cmd), 0);
    snprintf(p, sizeof p, "%s/pkg-config", bin);
    put_script(p, "#!/bin/sh\n"
                  "case \"$1\" in --exists) exit 1;; esac\n"
                  "for m in \"$@\"; do case $m in -*) ;; *) echo \"Package $m was not found in "
                  "the pkg-config search path.\" >&2;; esac; done\nexit 1\n");
    snprintf(p, sizeof p, "%s/apt-get", bin);
    put_script(p, "#!/bin/sh\nfor i in 1 2 3; do echo \"Selecting previously unselected package "
                  "x$i.\"; echo \"Setting up x$i ...\" >&2; done\nexit 0\n");
    snprintf(p, sizeof p, "%s/sudo", bin);
    put_script(p, "#!/bin/sh\nexec \"$@\"\n");
    /* what make prints up to the line that runs install-deps */
    snprintf(cmd, sizeof cmd, "cd '%s' && PATH='%s':\"$PATH\" make -n BUILD='%s/fresh' run 2>&1 | "
             "sed '/install-deps/q'", root, bin, e->tmpdir);
    assert_int_equal(tu_capture(cmd, out, sizeof out), 0);
    if (!strstr(out, "install-deps") || strstr(out, "not found") || strstr(out, "No such file"))
        fail_msg("make's first screen on a fresh machine:\n%s", out);
    /* install-deps itself: one line, naming what it installs */
    snprintf(cmd, sizeof cmd, "PATH='%s':\"$PATH\" TMPDIR='%s' sh '%s/scripts/install-deps.sh' 2>&1",
             bin, e->tmpdir, root);
    assert_int_equal(tu_capture(cmd, out, sizeof out), 0);
    char *nl = strchr(out, '\n');
    if (strncmp(out, "install-deps: installing ", 25) != 0 || !strstr(out, "libhdf5-dev") ||
        !nl || nl[1] != '\0')
        fail_msg("install-deps on a fresh machine printed:\n%s", out);
    assert_int_equal(tu_count_prefix(e->tmpdir, "tpk-install-deps."), 0); /* log removed */
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_staged_install),
                                       cmocka_unit_test(test_archive_prefix),
                                       cmocka_unit_test(test_debug_build_flags),
                                       cmocka_unit_test(test_openblas_build),
                                       cmocka_unit_test(test_fresh_machine_first_screen)};
    return cmocka_run_group_tests_name("install", tests, setup, tu_teardown);
}
