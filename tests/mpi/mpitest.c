/* Helpers of the MPI programs' tests (tests/mpi/mpitest.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "mpitest.h"

#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

const char *mt_mpirun(void)
{
    const char *m = getenv("TPK_MPIRUN");
    return m && *m ? m : "mpirun -np 2 --allow-run-as-root --oversubscribe";
}

int mt_run_mpi(const tu_env *e, const char *tool, const char *args)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s '%s/%s' %s >/dev/null 2>'%s/err.txt'", mt_mpirun(), e->bindir,
             tool, args, e->tmpdir);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

double *mt_values(size_t count, uint64_t seed)
{
    double *x = malloc((count ? count : 1) * sizeof *x);
    assert_non_null(x);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < count; i++) { /* xorshift64 */
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        x[i] = 2.385 * ((double)(s >> 11) / 9007199254740992.0 - 0.5);
    }
    return x;
}

void mt_write_inputs(const char *path, size_t n, const size_t *shape, int ndim, uint64_t seed)
{
    size_t per = 1;
    for (int k = 1; k < ndim; k++)
        per *= shape[k];
    double *x = mt_values(n * per, seed);
    size_t dims[4];
    memcpy(dims, shape, (size_t)ndim * sizeof *dims);
    dims[0] = n;
    tu_write_npy(path, x, ndim, dims);
    free(x);
}

double mt_max_abs_diff(const char *a, const char *b, const char *dset)
{
    size_t na, nb;
    double *x = tu_h5_read(a, dset, &na), *y = tu_h5_read(b, dset, &nb), m = 0;
    assert_int_equal(na, nb);
    for (size_t i = 0; i < na; i++)
        m = fmax(m, fabs(x[i] - y[i]));
    free(x);
    free(y);
    return m;
}

double mt_max_abs(const char *file, const char *dset)
{
    size_t n;
    double *x = tu_h5_read(file, dset, &n), m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(x[i]));
    free(x);
    return m;
}

static herr_t attr_in_other(hid_t loc, const char *name, const H5A_info_t *info, void *other)
{
    (void)loc;
    (void)info;
    if (H5Aexists(*(hid_t *)other, name) <= 0)
        fail_msg("attribute %s of the serial tool's file is missing from the MPI one's", name);
    return 0;
}

void mt_assert_attrs_superset(const char *serial, const char *mpi, const char *const *own,
                              size_t nown)
{
    hid_t fs = H5Fopen(serial, H5F_ACC_RDONLY, H5P_DEFAULT),
          fm = H5Fopen(mpi, H5F_ACC_RDONLY, H5P_DEFAULT);
    assert_true(fs >= 0 && fm >= 0);
    hsize_t idx = 0;
    H5Aiterate2(fs, H5_INDEX_NAME, H5_ITER_INC, &idx, attr_in_other, &fm);
    H5Fclose(fs);
    H5Fclose(fm);
    for (size_t i = 0; i < nown; i++)
        if (!tu_h5_has_attr(mpi, own[i]))
            fail_msg("%s lacks the attribute %s", mpi, own[i]);
}

void mt_assert_stderr_has(const tu_env *e, const char *what)
{
    char err[8192];
    tu_stderr(e, err, sizeof err);
    if (!strstr(err, what))
        fail_msg("stderr lacks '%s':\n%s", what, err);
}
