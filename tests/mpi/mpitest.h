/* Helpers of the MPI programs' tests (tests/mpi/test_*.c, make check-mpi): running a program
 * under mpirun, inputs, comparing the files a serial tool and its MPI twin write. */
#ifndef TPK_TESTS_MPITEST_H
#define TPK_TESTS_MPITEST_H

#include <stddef.h>
#include <stdint.h>

#include "../support/testutil.h"

/* The launcher: $TPK_MPIRUN, else mpirun -np 2 as root here (--allow-run-as-root
 * --oversubscribe). */
const char *mt_mpirun(void);
/* BINDIR/tool under the launcher, stdout discarded, stderr to TMPDIR/err.txt: the exit status
 * (-1 when it did not exit normally). */
int mt_run_mpi(const tu_env *e, const char *tool, const char *args);
/* count deterministic high-entropy values (not 0, ±1) of a seed (malloc'd). */
double *mt_values(size_t count, uint64_t seed);
/* n items of shape[1..ndim-1] of mt_values(n·per, seed), as .npy. */
void mt_write_inputs(const char *path, size_t n, const size_t *shape, int ndim, uint64_t seed);
/* max |a − b| over a dataset both files hold (with equal sizes), and the largest |a|. */
double mt_max_abs_diff(const char *a, const char *b, const char *dset);
double mt_max_abs(const char *file, const char *dset);
/* Every root attribute of the serial file is in the MPI one, and so are the MPI one's own. */
void mt_assert_attrs_superset(const char *serial, const char *mpi, const char *const *own,
                              size_t nown);
/* The last run's stderr holds `what`. */
void mt_assert_stderr_has(const tu_env *e, const char *what);

#endif
