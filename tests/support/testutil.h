/* Shared helpers of the test programs: a scratch directory, running the command-line tools, and
 * reading/writing files with the raw HDF5 / .npy formats — independent of the toolkit's own I/O,
 * so tests check the toolkit against something it did not write itself. */
#ifndef TPK_TESTUTIL_H
#define TPK_TESTUTIL_H

#include <stddef.h>

/* Scratch directory for one test program: created by tu_setup, removed by tu_teardown. */
typedef struct tu_env {
    char tmpdir[256];
    char bindir[1024]; /* $TPK_BIN, else build/bin */
} tu_env;

/* cmocka group fixtures: *state becomes a tu_env (tag names the directory /tmp/tpk-TAG-XXXXXX). */
int tu_setup_tagged(void **state, const char *tag);
int tu_teardown(void **state);

/* TMPDIR/name into buf; returns buf. */
char *tu_path(const tu_env *e, char *buf, size_t len, const char *name);
/* Run BINDIR/tool with shell-ready arguments, stdout discarded, stderr to TMPDIR/err.txt.
 * Returns the exit status (-1 if it did not exit normally). */
int tu_run_tool(const tu_env *e, const char *tool, const char *args);
/* Run a shell command line: its stdout (at most cap − 1 bytes, the rest read and dropped) into
 * out, and its exit status (-1 if it did not exit normally). */
int tu_capture(const char *cmd, char *out, size_t cap);
/* What the last tu_run_tool printed on stderr. */
void tu_stderr(const tu_env *e, char *buf, size_t len);
int tu_exists(const char *path);
/* Entries of folder dir whose names start with prefix (temp files left behind, scratch folders). */
int tu_count_prefix(const char *dir, const char *prefix);

/* Raw HDF5: write an r×c float64 dataset (new file), read any float64 dataset (malloc'd, count
 * values), test a root attribute. Failures abort the test. */
void tu_h5_write(const char *file, const char *dset, const double *v, size_t r, size_t c);
double *tu_h5_read(const char *file, const char *dset, size_t *count);
int tu_h5_has_attr(const char *file, const char *name);

/* A little-endian float64 C-order .npy file (format 1.0) of rank 1..4, written by hand. */
void tu_write_npy(const char *path, const double *x, int ndim, const size_t *dims);

/* A registry (the job registry: built-ins plus sqrt for layernorm programs) with three
 * instantiated nonlinearities, as a cmocka group fixture: *state becomes a tu_phis. */
typedef struct tpk_phi_registry tpk_phi_registry;
typedef struct tpk_phi tpk_phi;
typedef struct tu_phis {
    tpk_phi_registry *reg;
    tpk_phi *relu, *tanh_, *erf_;
} tu_phis;
int tu_phis_setup(void **state);
int tu_phis_teardown(void **state);

/* Test inputs: standard normals by Box–Muller over splitmix64 (state advanced), and an N×d
 * (T = 1) or N×T×d array of them from `seed`. */
#include <stdint.h>
double tu_normal(uint64_t *state);
typedef struct tpk_array tpk_array;
tpk_array *tu_normal_inputs(size_t N, size_t T, size_t d, uint64_t seed);
/* max|a − b| / max|b| over n entries (max|a − b| when b is 0): the tests' relative error. */
double tu_max_rel(const double *a, const double *b, size_t n);
/* A shipped program (rel to $TPK_ROOT, else .) through the front end, NETSOR+ allowed, with the
 * overrides; a failure prints the message and fails the test. */
typedef struct tpk_program tpk_program;
typedef struct tpk_param_set tpk_param_set;
tpk_program *tu_load_shipped(const tpk_phi_registry *reg, const char *rel,
                             const tpk_param_set *sets, int nsets);

#endif
