/* Shared helpers of the test programs (see testutil.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "testutil.h"
#include "tpk/job.h"
#include "tpk/tpk.h"

#include <dirent.h>
#include <math.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

int tu_setup_tagged(void **state, const char *tag)
{
    tu_env *e = calloc(1, sizeof *e);
    if (!e)
        return -1;
    snprintf(e->tmpdir, sizeof e->tmpdir, "/tmp/tpk-%s-XXXXXX", tag);
    if (!mkdtemp(e->tmpdir)) {
        free(e);
        return -1;
    }
    const char *b = getenv("TPK_BIN");
    snprintf(e->bindir, sizeof e->bindir, "%s", b ? b : "build/bin");
    *state = e;
    return 0;
}

int tu_teardown(void **state)
{
    tu_env *e = *state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", e->tmpdir);
    int rc = system(cmd);
    free(e);
    return rc == 0 ? 0 : -1;
}

char *tu_path(const tu_env *e, char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", e->tmpdir, name);
    return buf;
}

int tu_capture(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    while (fgetc(p) != EOF) {
    }
    int rc = pclose(p);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

int tu_run_tool(const tu_env *e, const char *tool, const char *args)
{
    size_t len = strlen(args) + 2 * sizeof e->bindir + 64;
    char *cmd = malloc(len);
    assert_non_null(cmd);
    snprintf(cmd, len, "'%s/%s' %s >/dev/null 2>'%s/err.txt'", e->bindir, tool, args, e->tmpdir);
    int rc = system(cmd);
    free(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

void tu_stderr(const tu_env *e, char *buf, size_t len)
{
    char p[512];
    FILE *f = fopen(tu_path(e, p, sizeof p, "err.txt"), "r");
    assert_non_null(f);
    size_t k = fread(buf, 1, len - 1, f);
    buf[k] = '\0';
    fclose(f);
}

int tu_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

int tu_count_prefix(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        n += strncmp(de->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

void tu_h5_write(const char *file, const char *dset, const double *v, size_t r, size_t c)
{
    hid_t f = H5Fcreate(file, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(f >= 0);
    hsize_t dims[2] = {r, c};
    hid_t sp = H5Screate_simple(2, dims, NULL);
    hid_t d = H5Dcreate2(f, dset, H5T_NATIVE_DOUBLE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0);
    H5Dclose(d);
    H5Sclose(sp);
    H5Fclose(f);
}

double *tu_h5_read(const char *file, const char *dset, size_t *count)
{
    hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0)
        fail_msg("cannot open %s", file);
    hid_t d = H5Dopen2(f, dset, H5P_DEFAULT);
    if (d < 0)
        fail_msg("%s: no dataset %s", file, dset);
    hid_t sp = H5Dget_space(d);
    *count = (size_t)H5Sget_simple_extent_npoints(sp);
    double *v = malloc((*count ? *count : 1) * sizeof *v);
    assert_non_null(v);
    assert_true(H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0);
    H5Sclose(sp);
    H5Dclose(d);
    H5Fclose(f);
    return v;
}

int tu_h5_has_attr(const char *file, const char *name)
{
    hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    assert_true(f >= 0);
    int r = H5Aexists(f, name) > 0;
    H5Fclose(f);
    return r;
}

void tu_write_npy(const char *path, const double *x, int ndim, const size_t *dims)
{
    /* shape tuple: "(a, b, c)", and "(a,)" for rank 1 */
    char shape[128] = "", hdr[256];
    size_t n = 1, k = 0;
    for (int i = 0; i < ndim; i++) {
        k += (size_t)snprintf(shape + k, sizeof shape - k, "%s%zu", i ? ", " : "", dims[i]);
        n *= dims[i];
    }
    int len = snprintf(hdr, sizeof hdr, "{'descr': '<f8', 'fortran_order': False, 'shape': (%s%s), }",
                       shape, ndim == 1 ? "," : "");
    int pad = 64 - (10 + len + 1) % 64;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    unsigned short hl = (unsigned short)(len + pad + 1);
    fputc(hl & 0xff, f);
    fputc(hl >> 8, f);
    fwrite(hdr, 1, (size_t)len, f);
    for (int i = 0; i < pad; i++)
        fputc(' ', f);
    fputc('\n', f);
    fwrite(x, sizeof(double), n, f);
    fclose(f);
}

int tu_phis_setup(void **state)
{
    tu_phis *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    *state = f;
    f->reg = tpk_job_registry(NULL);
    if (!f->reg)
        return -1;
    f->relu = tpk_phi_alloc(f->reg, "relu", NULL);
    f->tanh_ = tpk_phi_alloc(f->reg, "tanh", NULL);
    f->erf_ = tpk_phi_alloc(f->reg, "erf", NULL);
    return f->relu && f->tanh_ && f->erf_ ? 0 : -1;
}

int tu_phis_teardown(void **state)
{
    tu_phis *f = *state;
    tpk_phi_free(f->relu);
    tpk_phi_free(f->tanh_);
    tpk_phi_free(f->erf_);
    tpk_phi_registry_free(f->reg);
    free(f);
    return 0;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double tu_normal(uint64_t *state)
{
    double u1 = ((double)(splitmix(state) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = ((double)(splitmix(state) >> 11) + 0.5) / 9007199254740992.0;
    return sqrt(-2 * log(u1)) * cos(2 * 3.14159265358979323846 * u2);
}

tpk_array *tu_normal_inputs(size_t N, size_t T, size_t d, uint64_t seed)
{
    size_t dims[3] = {N, T, d};
    tpk_array *x = T > 1 ? tpk_array_alloc(3, dims, NULL) : tpk_array_alloc2(N, d, NULL);
    assert_non_null(x);
    for (size_t i = 0; i < tpk_array_size(x); i++)
        x->data[i] = tu_normal(&seed);
    return x;
}

tpk_program *tu_load_shipped(const tpk_phi_registry *reg, const char *rel,
                             const tpk_param_set *sets, int nsets)
{
    char path[1024];
    const char *root = getenv("TPK_ROOT");
    snprintf(path, sizeof path, "%s/%s", root ? root : ".", rel);
    tpk_netsor_opts o = {.sets = sets, .nsets = nsets, .netsor_plus = 1};
    tpk_ctx ctx;
    tpk_ctx_init(&ctx);
    tpk_program *p = tpk_netsor_load_file(path, &o, reg, &ctx);
    if (p == NULL)
        print_message("%s: %s\n", path, ctx.msg);
    assert_non_null(p);
    return p;
}

double tu_max_rel(const double *a, const double *b, size_t n)
{
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs(a[i] - b[i]));
        s = fmax(s, fabs(b[i]));
    }
    return s > 0 ? d / s : d;
}
