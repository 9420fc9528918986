/* `make install` / `make uninstall` into a staging folder (DESTDIR, PREFIX, LIBDIR) as a
 * packager runs them, and programs built against the result with pkg-config, shared and static
 * (scripts/check-install.sh; issue 17, item 5). */
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

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_staged_install)};
    return cmocka_run_group_tests_name("install", tests, setup, tu_teardown);
}
