/* Where the shipped files (programs/NAME.nsr, data/demo-...) are found from any program: the
 * environment's override, the build tree, an installed prefix (compiled in by `make install`,
 * and beside the tool or the shared library), the working directory (include/tpk/job.h). */
#define _GNU_SOURCE /* dladdr: the shared library's own path */
#include "tpk/job.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The install data directory, PREFIX/share/tpk, compiled in by `make install` (the Makefile
 * builds the installed libraries' copy of this file with it); the build tree's library has none,
 * since nothing has been installed for it. */
#ifdef TPK_DATADIR_INSTALLED
static const char installed_datadir[] = TPK_DATADIR_INSTALLED;
#endif

const char *tpk_datadir(void)
{
#ifdef TPK_DATADIR_INSTALLED
    return installed_datadir;
#else
    return NULL;
#endif
}

/* The folder of a file path (its last '/' cut), into buf; 0 if it has none. */
static int dir_of(const char *path, char *buf, size_t len)
{
    const char *slash = strrchr(path, '/');
    if (!slash || (size_t)(slash - path) >= len)
        return 0;
    memcpy(buf, path, (size_t)(slash - path));
    buf[slash - path] = '\0';
    return 1;
}

/* a + b into buf; 0 when it does not fit (the place is then skipped, never cut short) */
static int join(char *buf, size_t len, const char *a, const char *b)
{
    int w = snprintf(buf, len, "%s%s", a, b);
    return w >= 0 && (size_t)w < len;
}

/* The places tpk_shipped_find tries, in order (job.h says why this order). Each is a folder that
 * holds programs/ and data/, with a label for the message; n places at most. */
typedef struct place {
    char dir[PATH_MAX];
    const char *why;
} place;

static int places(place *pl, int n)
{
    int k = 0;
    const char *env = getenv("TPK_DATADIR");
    if (env && *env && k < n && join(pl[k].dir, sizeof pl[k].dir, env, ""))
        pl[k++].why = "TPK_DATADIR";
    char exe[PATH_MAX] = "", dir[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = '\0';
        if (dir_of(exe, dir, sizeof dir)) {
            if (k < n && join(pl[k].dir, sizeof pl[k].dir, dir, "/../.."))
                pl[k++].why = "the build tree above the program";
            if (k < n && join(pl[k].dir, sizeof pl[k].dir, dir, "/../share/tpk"))
                pl[k++].why = "beside the program's prefix";
        }
    }
    if (tpk_datadir() && k < n && join(pl[k].dir, sizeof pl[k].dir, tpk_datadir(), ""))
        pl[k++].why = "the install data directory compiled in";
    /* libtpk.so's own folder: LIBDIR/../share/tpk (a prefix moved after installing). In a static
     * program this is the program itself, already tried. */
    Dl_info info;
    char lib[PATH_MAX];
    if (dladdr((void *)&tpk_shipped_find, &info) && info.dli_fname &&
        realpath(info.dli_fname, lib) && strcmp(lib, exe) != 0 && dir_of(lib, dir, sizeof dir) &&
        k < n && join(pl[k].dir, sizeof pl[k].dir, dir, "/../share/tpk"))
        pl[k++].why = "beside the shared library";
    if (k < n && join(pl[k].dir, sizeof pl[k].dir, ".", ""))
        pl[k++].why = "the working directory";
    return k;
}

int tpk_shipped_find(const char *rel, char *buf, size_t len, tpk_ctx *ctx)
{
    if (!rel || !buf || !len)
        return TPK_ERROR(ctx, TPK_EINVAL, "tpk_shipped_find: no file name or no buffer");
    place pl[8];
    int n = places(pl, 8);
    char tried[TPK_MSG_MAX] = "";
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        char path[PATH_MAX], real[PATH_MAX];
        int w = snprintf(path, sizeof path, "%s/%s", pl[i].dir, rel);
        if (w < 0 || (size_t)w >= sizeof path)
            continue;
        if (access(path, R_OK) == 0) {
            /* clean "bin/../../" out of messages and attributes */
            const char *p = realpath(path, real) ? real : path;
            if (strlen(p) >= len)
                return TPK_ERROR(ctx, TPK_EINVAL, "%s: the path is longer than %zu bytes", p,
                                 len - 1);
            memcpy(buf, p, strlen(p) + 1);
            return TPK_OK;
        }
        if (used < sizeof tried) {
            w = snprintf(tried + used, sizeof tried - used, "%s%s (%s)", i ? ", " : "", path,
                             pl[i].why);
            used += w > 0 ? (size_t)w : 0;
        }
    }
    snprintf(buf, len, "%s", rel);
    /* the advice first: a long list of places is what the message's length cuts */
    return TPK_ERROR(ctx, TPK_ENOTFOUND, "shipped file %s not found: set TPK_DATADIR, or "
                     "tpk_arch_opts.root (tpk_study_opts.root), to the folder holding programs/ "
                     "and data/ (`pkg-config --variable=datadir tpk` names the installed one); "
                     "tried %s", rel, tried);
}

const char *tpk_shipped_path(const char *rel, char *buf, size_t len)
{
    tpk_ctx quiet; /* not found: REL itself, which names the file in the caller's open error */
    tpk_ctx_init(&quiet);
    tpk_shipped_find(rel, buf, len, &quiet);
    return buf;
}
