/* Internal helpers shared by the readers and the HDF5 writer (not installed). */
#ifndef TPK_IO_IMPL_H
#define TPK_IO_IMPL_H

#include <hdf5.h>
#include <stdio.h>
#include <string.h>

/* HDF5 prints its whole error stack to stderr by default; we report through tpk_ctx instead.
 * The print hook is process-wide state, so it is switched off only around our own calls and the
 * caller's setting is restored afterwards (HDF5 serial is not thread-safe anyway: one thread at a
 * time may be inside HDF5, which makes save/restore sound). */
typedef struct tpk_h5_quiet {
    H5E_auto2_t func;
    void *data;
} tpk_h5_quiet;

static inline void tpk_h5_quiet_begin(tpk_h5_quiet *q)
{
    /* Before HDF5's first call initialises it (this is the toolkit's first call into HDF5): no
     * library shutdown at exit. After a write failed on a full disk or a file size limit,
     * H5Fclose cannot flush and leaves the file open, and HDF5 1.10's shutdown then crashes on
     * it; every file the toolkit writes is closed explicitly, so the shutdown has nothing to do.
     * Later calls only set the same flag again. */
    H5dont_atexit();
    q->func = NULL;
    q->data = NULL;
    if (H5Eget_auto2(H5E_DEFAULT, &q->func, &q->data) < 0) {
        q->func = NULL;
        q->data = NULL;
    }
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

static inline void tpk_h5_quiet_end(const tpk_h5_quiet *q)
{
    H5Eset_auto2(H5E_DEFAULT, q->func, q->data);
}

/* strerror without strerror's shared static buffer (the XSI strerror_r, which
 * -D_POSIX_C_SOURCE selects), so two threads reading files do not garble each other's message. */
static inline const char *tpk_io_errstr(int errnum, char *buf, size_t n)
{
    if (strerror_r(errnum, buf, n) != 0)
        snprintf(buf, n, "error %d", errnum);
    return buf;
}

/* --output=- (issue 17): HDF5 cannot be streamed, so '-' is refused rather than written to a
 * file named '-'. */
#define TPK_IO_NO_STDOUT "--output=-: HDF5 output cannot go to standard output (the format needs " \
                         "a seekable file); give a file name, e.g. --output=out.h5"

/* core/io_path.c: whether s[0..n) ends with suffix, ignoring case; the length of spec's file part
 * (*dataset: what follows ':' after an .h5, .hdf5 or .npz name, else ""). */
int tpk__io_ends_with_ci(const char *s, size_t n, const char *suffix);
size_t tpk__io_spec_split(const char *spec, const char **dataset);

#endif
