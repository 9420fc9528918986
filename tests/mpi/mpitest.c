/* Helpers of the MPI programs' tests (tests/mpi/mpitest.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "mpitest.h"

#include <dirent.h>
#include <hdf5.h>
#include <signal.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

/* ---- runs in the background, checkpoints ------------------------------------------------ */

/* The same in the background: the pid of mpirun itself (exec'd by the shell). */
pid_t mt_spawn_mpi(const tu_env *e, const char *tool, const char *args)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "exec %s '%s/%s' %s >/dev/null 2>'%s/err.txt'", mt_mpirun(),
             e->bindir, tool, args, e->tmpdir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

void mt_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int mt_wait_exit(pid_t pid)
{
    int status;
    for (int i = 0; i < MT_WAIT_LIMIT_S * 10; i++) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        mt_sleep_ms(100);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    fail_msg("mpirun did not end within %d s", MT_WAIT_LIMIT_S);
    return -1;
}

/* The children of pid (mpirun's ranks), by /proc; their count. */
int mt_children(pid_t parent, pid_t *kids, int cap)
{
    DIR *d = opendir("/proc");
    assert_non_null(d);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d)) != NULL && n < cap) {
        char *end;
        long pid = strtol(de->d_name, &end, 10);
        if (*end || pid <= 0)
            continue;
        char p[64], buf[512];
        snprintf(p, sizeof p, "/proc/%ld/stat", pid);
        FILE *f = fopen(p, "r");
        if (!f)
            continue;
        size_t k = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[k] = '\0';
        const char *rp = strrchr(buf, ')'); /* "pid (comm) S ppid ..." */
        char state;
        long ppid;
        if (rp && sscanf(rp + 1, " %c %ld", &state, &ppid) == 2 && ppid == parent && state != 'Z')
            kids[n++] = (pid_t)pid;
    }
    closedir(d);
    return n;
}

/* The dataset's raw bytes are the same in both files (same type, same values). */
void mt_assert_same_bytes(const char *a, const char *b, const char *dset)
{
    size_t na, nb;
    double *x = tu_h5_read(a, dset, &na), *y = tu_h5_read(b, dset, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(x, y, na * sizeof *x);
    free(x);
    free(y);
}

/* Tiles the checkpoint marks done (read while the run writes it: its metadata is fixed and on
 * disk before the first tile), and in all; -1 while it cannot be read. */
long mt_done_tiles(const char *ck, long *total)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(ck, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0)
        return -1;
    hid_t d = H5Dopen2(f, "/tpk_checkpoint/done", H5P_DEFAULT);
    long k = -1;
    if (d >= 0) {
        hid_t sp = H5Dget_space(d);
        hssize_t n = H5Sget_simple_extent_npoints(sp);
        unsigned char *b = malloc(n > 0 ? (size_t)n : 1);
        if (b && H5Dread(d, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, b) >= 0) {
            k = 0;
            for (hssize_t i = 0; i < n; i++)
                k += b[i] != 0;
            if (total)
                *total = (long)n;
        }
        free(b);
        H5Sclose(sp);
        H5Dclose(d);
    }
    H5Fclose(f);
    return k;
}

/* Wait until none of the processes lives (a zombie counts as ended). */
void mt_wait_gone(const pid_t *pids, int n)
{
    for (int t = 0; t < MT_WAIT_LIMIT_S * 10; t++) {
        int alive = 0;
        for (int i = 0; i < n; i++) {
            char p[64], buf[512];
            snprintf(p, sizeof p, "/proc/%ld/stat", (long)pids[i]);
            FILE *f = fopen(p, "r");
            if (!f)
                continue;
            size_t k = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[k] = '\0';
            const char *rp = strrchr(buf, ')');
            alive |= rp && rp[1] == ' ' && rp[2] != 'Z';
        }
        if (!alive)
            return;
        mt_sleep_ms(100);
    }
    fail_msg("ranks of a killed run still alive after %d s", MT_WAIT_LIMIT_S);
}

/* Wait until the run has finished at least `want` tiles (or it ended, or the limit passed). */
void mt_wait_for_tiles(pid_t mp, const char *ck, long want)
{
    for (int i = 0; i < MT_WAIT_LIMIT_S * 50; i++) {
        if (mt_done_tiles(ck, NULL) >= want || waitpid(mp, NULL, WNOHANG) == mp)
            return;
        mt_sleep_ms(20);
    }
}
