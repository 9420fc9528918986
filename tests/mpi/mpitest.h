/* Helpers of the MPI programs' tests (tests/mpi/test_*.c, make check-mpi): running a program
 * under mpirun, inputs, comparing the files a serial tool and its MPI twin write. */
#ifndef TPK_TESTS_MPITEST_H
#define TPK_TESTS_MPITEST_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

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

/* How long the helpers below wait for a run or its ranks before they fail the test. */
#define MT_WAIT_LIMIT_S 600
/* BINDIR/tool under the launcher in the background, stderr to TMPDIR/err.txt: mpirun's pid. */
pid_t mt_spawn_mpi(const tu_env *e, const char *tool, const char *args);
void mt_sleep_ms(long ms);
/* Wait for pid: its exit status, 128 + signal when killed (fails the test after the limit). */
int mt_wait_exit(pid_t pid);
/* The live children of parent (mpirun's ranks), by /proc: their count (at most cap). */
int mt_children(pid_t parent, pid_t *kids, int cap);
/* Until none of pids lives (a zombie counts as ended); fails the test after the limit. */
void mt_wait_gone(const pid_t *pids, int n);
/* Tiles a checkpoint marks done (*total: all tiles, may be NULL); −1 while it cannot be read. */
long mt_done_tiles(const char *ck, long *total);
/* Until run mp has finished want tiles in ck, or ended, or the limit passed. */
void mt_wait_for_tiles(pid_t mp, const char *ck, long want);
/* The dataset's raw values are the same in both files. */
void mt_assert_same_bytes(const char *a, const char *b, const char *dset);

#endif
