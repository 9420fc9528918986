/* Paths of inputs and outputs: the "file:dataset" split of an input spec, and the check that an
 * output is none of the inputs (issue 18). No HDF5 here: the tuner's generator links this alone. */
#include "io_impl.h"
#include "tpk/io.h"

#include <string.h>
#include <strings.h>
#include <sys/stat.h>

int tpk__io_ends_with_ci(const char *s, size_t n, const char *suffix)
{
    size_t k = strlen(suffix);
    return n >= k && strncasecmp(s + n - k, suffix, k) == 0;
}

/* spec := path [ ':' dataset ]; the dataset part is recognised only after an HDF5 or .npz
 * extension, so any other path containing ':' is taken literally. Returns the path's length. */
size_t tpk__io_spec_split(const char *spec, const char **dataset)
{
    *dataset = "";
    for (const char *c = strchr(spec, ':'); c != NULL; c = strchr(c + 1, ':')) {
        size_t k = (size_t)(c - spec);
        if (tpk__io_ends_with_ci(spec, k, ".h5") || tpk__io_ends_with_ci(spec, k, ".hdf5") ||
            tpk__io_ends_with_ci(spec, k, ".npz")) {
            *dataset = c + 1;
            return k;
        }
    }
    return strlen(spec);
}

/* Output = input would destroy the input (issue 18): compared as files (device and inode), so a
 * symlink, a hard link or another spelling of the same path is caught too. */
int tpk_io_check_output(const char *output, const char *const *inputs, size_t n, tpk_ctx *ctx)
{
    if (output != NULL && strcmp(output, "-") == 0)
        return TPK_ERROR(ctx, TPK_EINVAL, TPK_IO_NO_STDOUT);
    struct stat so;
    if (output == NULL || stat(output, &so) != 0)
        return TPK_OK; /* a file that does not exist yet is no input */
    for (size_t i = 0; i < n; i++) {
        if (inputs[i] == NULL || inputs[i][0] == '\0')
            continue;
        const char *ds;
        size_t len = tpk__io_spec_split(inputs[i], &ds);
        char path[4096];
        if (len >= sizeof path)
            continue;
        memcpy(path, inputs[i], len);
        path[len] = '\0';
        struct stat si;
        if (stat(path, &si) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino)
            return TPK_ERROR(ctx, TPK_EINVAL,
                             "%s is the input %s: writing the output would destroy it (choose another "
                             "output file)", output, path);
    }
    return TPK_OK;
}
