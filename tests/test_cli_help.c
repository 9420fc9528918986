/* The command-line conventions, the same in every program (issue 17, item 4): -h and --help
 * (exit 0, the usage with the exit statuses), --version (exit 0), usage errors exit 2 and run
 * errors 1, --opt=VALUE and --opt VALUE alike, --output=- refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "support/testutil.h"

static const char *const tools[] = {"gpkernel", "netsor", "gplimits", "gpregress", "gpattention",
                                    "tptune"};

static int setup(void **state) { return tu_setup_tagged(state, "help"); }

static void test_help(void **state)
{
    const tu_env *e = *state;
    for (size_t i = 0; i < sizeof tools / sizeof tools[0]; i++) {
        int h = tu_run_tool(e, tools[i], "-h"), help = tu_run_tool(e, tools[i], "--help");
        if (h != 0 || help != 0)
            print_error("%s: -h exit %d, --help exit %d\n", tools[i], h, help);
        assert_int_equal(h, 0);
        assert_int_equal(help, 0);
    }
}

/* The tool's stdout (at most cap − 1 bytes) and its exit status. */
static int run_capture(const tu_env *e, const char *tool, const char *args, char *out, size_t cap)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s/%s' %s 2>/dev/null", e->bindir, tool, args);
    return tu_capture(cmd, out, cap);
}

static void test_help_states_exit_statuses(void **state)
{
    const tu_env *e = *state;
    for (size_t i = 0; i < sizeof tools / sizeof tools[0]; i++) {
        char out[32768];
        assert_int_equal(run_capture(e, tools[i], "--help", out, sizeof out), 0);
        if (!strstr(out, "Exit status: 0 success, 1 error") || !strstr(out, "2 usage error") ||
            !strstr(out, "--opt VALUE"))
            fail_msg("%s --help does not state the exit statuses and option forms", tools[i]);
    }
}

static void test_version(void **state)
{
    const tu_env *e = *state;
    for (size_t i = 0; i < sizeof tools / sizeof tools[0]; i++) {
        char out[256];
        assert_int_equal(run_capture(e, tools[i], "--version", out, sizeof out), 0);
        char want[64];
        snprintf(want, sizeof want, "%s (tpk) %s", tools[i], TPK_VERSION);
        if (!strstr(out, want))
            fail_msg("%s --version printed '%s', want '%s'", tools[i], out, want);
    }
}

/* Usage errors (unknown option, a bad value, a missing required option) exit 2; an error of the
 * run (a missing input file) exits 1. */
static void test_exit_statuses(void **state)
{
    const tu_env *e = *state;
    static const struct { const char *tool, *args; int rc; } cases[] = {
        {"gpkernel", "--bogus", 2}, {"gpkernel", "--arch=mlp --depth=x --output=o.h5", 2},
        {"gpkernel", "--arch=mlp", 2}, {"gpkernel", "--arch=nope --output=o.h5", 2},
        {"netsor", "run", 2}, {"netsor", "check --bogus x.nsr", 2}, {"netsor", "nocommand", 2},
        {"gplimits", "--bogus", 2}, {"gplimits", "--arch=mlp --seeds=2 --output=o.h5", 2},
        {"gpregress", "--bogus", 2}, {"gpregress", "--arch=mlp --output=o.h5", 2},
        {"gpattention", "--bogus", 2}, {"gpattention", "--widths=x --output=o.h5", 2},
        {"tptune", "--bogus", 2}, {"tptune", "gemm --m=8", 2}, {"tptune", "nocommand", 2},
        /* errors of the run: a missing input */
        {"gpkernel", "--arch=mlp --input=missing.npy --output=o.h5", 1},
        {"netsor", "check missing.nsr", 1},
        {"gplimits", "--arch=mlp --input=missing.npy --output=o.h5", 1},
        {"gpregress", "--arch=mlp --train=missing.npy --labels=missing.npy --output=o.h5", 1},
        {"gpattention", "--input=missing.npy --output=o.h5", 1},
        {"tptune", "show missing.jsonl", 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = tu_run_tool(e, cases[i].tool, cases[i].args);
        if (rc != cases[i].rc)
            fail_msg("%s %s: exit %d, want %d", cases[i].tool, cases[i].args, rc, cases[i].rc);
    }
}

/* --opt VALUE is --opt=VALUE, architecture flags included: the same file either way. */
static void test_separate_values(void **state)
{
    const tu_env *e = *state;
    const char *r = getenv("TPK_ROOT");
    r = r ? r : ".";
    char a[4096], b[4096], fa[512], fb[512];
    tu_path(e, fa, sizeof fa, "a.h5");
    tu_path(e, fb, sizeof fb, "b.h5");
    snprintf(a, sizeof a, "--arch=mlp --depth=2 --sigma-b2=0.125 --input=%s/data/demo-inputs.csv "
             "--output=%s --quiet", r, fa);
    snprintf(b, sizeof b, "--arch mlp --depth 2 --sigma-b2 0.125 --input %s/data/demo-inputs.csv "
             "--output %s --quiet", r, fb);
    assert_int_equal(tu_run_tool(e, "gpkernel", a), 0);
    assert_int_equal(tu_run_tool(e, "gpkernel", b), 0);
    size_t na, nb;
    double *ka = tu_h5_read(fa, "/kernel", &na), *kb = tu_h5_read(fb, "/kernel", &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(ka, kb, na * sizeof *ka);
    free(ka);
    free(kb);
    snprintf(b, sizeof b, "run %s/programs/mlp.nsr --input %s/data/demo-inputs.csv --width 8 "
             "--seed 3 --set L=2 --output %s --quiet", r, r, fb);
    assert_int_equal(tu_run_tool(e, "netsor", b), 0);
    snprintf(b, sizeof b, "--arch mlp --depth 2 --widths 8,16 --seeds 4 --boot 60 --max-inputs 3 "
             "--output %s --quiet", fb);
    assert_int_equal(tu_run_tool(e, "gplimits", b), 0);
    snprintf(b, sizeof b, "--arch rbf --train %s/data/demo-inputs.csv --labels "
             "%s/data/demo-inputs.csv --noise 0.1 --output %s --quiet", r, r, fb);
    assert_int_equal(tu_run_tool(e, "gpregress", b), 0);
    snprintf(b, sizeof b, "--widths 4,8 --networks 8 --score-samples 8 --heads-list 1 --output %s "
             "--quiet", fb);
    assert_int_equal(tu_run_tool(e, "gpattention", b), 0);
    assert_int_equal(tu_run_tool(e, "tptune", "emit --m 16 --n 16 --k 16"), 0);
}

/* scripts/tpk-completion.bash, as bash runs it: options from --help, --arch names, commands. */
static void test_bash_completion(void **state)
{
    const tu_env *e = *state;
    if (system("command -v bash >/dev/null 2>&1") != 0) {
        print_message("no bash: the completion check is skipped\n");
        return;
    }
    const char *r = getenv("TPK_ROOT");
    char script[4096], out[4096];
    snprintf(script, sizeof script, "%s/c.sh", e->tmpdir);
    FILE *f = fopen(script, "w");
    assert_non_null(f);
    fprintf(f, "PATH='%s':$PATH\n. '%s/scripts/tpk-completion.bash'\n"
            "t() { COMP_LINE=$1; COMP_POINT=${#1}; read -ra COMP_WORDS <<< \"$1\"\n"
            "  COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); COMPREPLY=(); _tpk \"${COMP_WORDS[0]}\"\n"
            "  echo \"$1 => ${COMPREPLY[*]}\"; }\n"
            "t 'gpkernel --list-a'; t 'gplimits --wid'; t 'gpkernel --arch=ml'; t 'netsor ke'; "
            "t 'tptune rep'\n", e->bindir, r ? r : ".");
    fclose(f);
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "bash '%s'", script);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    assert_int_equal(pclose(p), 0);
    static const char *const want[] = {"gpkernel --list-a => --list-archs",
                                       "gplimits --wid => --widths", "gpkernel --arch=ml => mlp",
                                       "netsor ke => kernel", "tptune rep => replay"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(out, want[i]))
            fail_msg("completion: want '%s' in:\n%s", want[i], out);
}

/* -h is the only short option: any other one is an error naming it (not taken for help). */
static void test_unknown_short_option(void **state)
{
    const tu_env *e = *state;
    static const char *const with_getopt[] = {"gpkernel", "gplimits", "gpregress", "gpattention"};
    for (size_t i = 0; i < sizeof with_getopt / sizeof with_getopt[0]; i++) {
        char err[2048];
        assert_int_not_equal(tu_run_tool(e, with_getopt[i], "-x"), 0);
        tu_stderr(e, err, sizeof err);
        assert_non_null(strstr(err, "-x"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_unknown_short_option),
        cmocka_unit_test(test_help_states_exit_statuses),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_exit_statuses),
        cmocka_unit_test(test_separate_values),
        cmocka_unit_test(test_bash_completion),
    };
    return cmocka_run_group_tests_name("cli_help", tests, setup, tu_teardown);
}
