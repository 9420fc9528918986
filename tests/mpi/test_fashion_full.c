/* make fashion-full's pipeline (scripts/fashion-full.sh, issue 16 item 5) end to end at toy size
 * under mpirun -np 2 (make check-mpi): toy images and labels in place of the dataset, two depths;
 * it ends with exit 0, prints the chosen depth, the memory per rank and the time, and writes its
 * result file. The full run (all 60 000 images) is `make fashion-full`. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "mpitest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static int setup(void **state) { return tu_setup_tagged(state, "fashion-full"); }

/* n labels in 0..2 by a rule on the first entries of n items of per values (seed as the items') */
static void write_labels(const char *path, size_t n, size_t per, uint64_t seed)
{
    double *v = mt_values(n * per, seed), *y = malloc(n * sizeof *y);
    assert_non_null(y);
    for (size_t i = 0; i < n; i++)
        y[i] = (double)((v[i * per] > 0) + (v[i * per + 1] > 0));
    const size_t dims[1] = {n};
    tu_write_npy(path, y, 1, dims);
    free(v);
    free(y);
}

static void test_toy_run(void **state)
{
    tu_env *e = *state;
    char tr[512], lb[512], te[512], tl[512], out[512], cmd[8192], log[512];
    tu_path(e, tr, sizeof tr, "train.npy");
    tu_path(e, lb, sizeof lb, "labels.npy");
    tu_path(e, te, sizeof te, "test.npy");
    tu_path(e, tl, sizeof tl, "test-labels.npy");
    tu_path(e, out, sizeof out, "out");
    tu_path(e, log, sizeof log, "log.txt");
    const size_t shape[3] = {0, 4, 5};
    mt_write_inputs(tr, 300, shape, 3, 5);
    mt_write_inputs(te, 60, shape, 3, 6);
    write_labels(lb, 300, 20, 5);
    write_labels(tl, 60, 20, 6);
    snprintf(cmd, sizeof cmd,
             "FASHION_TRAIN='%s' FASHION_LABELS='%s' FASHION_TEST='%s' FASHION_TEST_LABELS='%s' "
             "FASHION_N_TRAIN=300 FASHION_N_TEST=60 FASHION_DEPTHS=1-2 FASHION_VAR_N=10 "
             "sh '%s/scripts/fashion-full.sh' '%s' '%s' > '%s' 2>&1",
             tr, lb, te, tl, getenv("TPK_ROOT") ? getenv("TPK_ROOT") : ".", e->bindir, out, log);
    int rc = system(cmd);
    FILE *f = fopen(log, "r");
    assert_non_null(f);
    char text[16384];
    size_t k = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[k] = '\0';
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0)
        fail_msg("fashion-full.sh failed:\n%s", text);
    assert_non_null(strstr(text, "depth chosen by training LML"));
    assert_non_null(strstr(text, "memory per rank: "));
    assert_non_null(strstr(text, "time: "));
    char res[600];
    snprintf(res, sizeof res, "%s/relu.h5", out);
    assert_true(tu_exists(res));
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_toy_run)};
    return cmocka_run_group_tests_name("fashion-full toy run", tests, setup, tu_teardown);
}
