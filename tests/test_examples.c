/* examples/ as a user builds them from the installed library (issue 40, item 1): a real prefix,
 * pkg-config, each example shared and fully static, each run and its numbers checked against
 * closed forms computed by awk (scripts/check-examples.sh); the shipped programs found from a
 * user's program (compiled-in data directory, TPK_DATADIR, the error listing the places). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/testutil.h"

static int setup(void **state) { return tu_setup_tagged(state, "examples"); }

static void test_examples_installed(void **state)
{
    const tu_env *e = *state;
    const char *r = getenv("TPK_ROOT");
    char root[1024], build[1100], cmd[4096];
    snprintf(root, sizeof root, "%s", r && *r ? r : ".");
    snprintf(build, sizeof build, "%s", e->bindir);
    char *b = dirname(build); /* TPK_BIN is BUILD/bin */
    snprintf(cmd, sizeof cmd, "sh '%s/scripts/check-examples.sh' '%s' '%s' '%s' >'%s/out.txt' "
             "2>&1", root, root, b, e->tmpdir, e->tmpdir);
    int rc = system(cmd);
    snprintf(cmd, sizeof cmd, "tail -n 30 '%s/out.txt' >&2", e->tmpdir);
    if (system(cmd) != 0)
        print_error("(no output)\n");
    if (rc != 0)
        fail_msg("scripts/check-examples.sh failed");
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_examples_installed)};
    return cmocka_run_group_tests_name("examples", tests, setup, tu_teardown);
}
