/* Every command-line program answers -h and --help with its usage and exit status 0, and an
 * unknown short option with an error (issue 17, item 2). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

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
    };
    return cmocka_run_group_tests_name("cli_help", tests, setup, tu_teardown);
}
