/* Machine-class data files (data/machines/ID.conf, tuner-notes §7): "key value" lines with '#'
 * comments, read by the generator of gen/ so that the generated tables depend on these files and
 * the logs alone, never on the build host. */
#include "tune_impl.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int number(const char *path, int line, const char *key, const char *v, double lo, double hi,
                  double *out, tpk_ctx *ctx)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    while (*end && isspace((unsigned char)*end))
        end++;
    if (errno || end == v || *end || !(x >= lo && x <= hi) || x != (double)(long long)x)
        return TPK_ERROR(ctx, TPK_EINVAL, "%s:%d: %s must be an integer in [%g, %g], not '%s'", path,
                         line, key, lo, hi, v);
    *out = x;
    return TPK_OK;
}

int tpk_tune_class_read(const char *path, tpk_tune_class *c, tpk_ctx *ctx)
{
    memset(c, 0, sizeof *c);
    FILE *f = fopen(path, "r");
    if (!f)
        return TPK_ERROR(ctx, TPK_EIO, "%s: cannot open: %s", path, strerror(errno));
    /* The id is the file's base name without ".conf": the generated tables are named by it. */
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t blen = strlen(base);
    if (blen > 5 && !strcmp(base + blen - 5, ".conf"))
        blen -= 5;
    if (blen == 0 || blen >= sizeof c->id) {
        fclose(f);
        return TPK_ERROR(ctx, TPK_EINVAL, "%s: a class file is named ID.conf", path);
    }
    for (size_t i = 0; i < blen; i++)
        if (!isalnum((unsigned char)base[i]) && base[i] != '-' && base[i] != '_') {
            fclose(f);
            return TPK_ERROR(ctx, TPK_EINVAL, "%s: a class id has letters, digits, '-' and '_' only", path);
        }
    memcpy(c->id, base, blen);
    enum { HAVE_NAME = 1, HAVE_ISA = 2, HAVE_VB = 4, HAVE_REG = 8, HAVE_L1 = 16, HAVE_L2 = 32, HAVE_L3 = 64, ALL = 127 };
    int have = 0, st = TPK_OK, line = 0;
    char buf[512];
    while (!st && fgets(buf, sizeof buf, f)) {
        line++;
        char *h = strchr(buf, '#');
        if (h)
            *h = '\0';
        char *k = buf;
        while (isspace((unsigned char)*k))
            k++;
        size_t len = strlen(k);
        while (len && isspace((unsigned char)k[len - 1]))
            k[--len] = '\0';
        if (!*k)
            continue;
        char *v = k;
        while (*v && !isspace((unsigned char)*v))
            v++;
        if (*v)
            *v++ = '\0';
        while (isspace((unsigned char)*v))
            v++;
        double x = 0;
        if (!strcmp(k, "name")) {
            if (!*v || strlen(v) >= sizeof c->name)
                st = TPK_ERROR(ctx, TPK_EINVAL, "%s:%d: name: 1..%zu characters", path, line, sizeof c->name - 1);
            else
                memcpy(c->name, v, strlen(v) + 1), have |= HAVE_NAME;
        } else if (!strcmp(k, "isa")) {
            if (!strcmp(v, "avx512"))
                c->m.isa = TPK_ISA_AVX512;
            else if (!strcmp(v, "avx2"))
                c->m.isa = TPK_ISA_AVX2;
            else if (!strcmp(v, "generic"))
                c->m.isa = TPK_ISA_GENERIC;
            else
                st = TPK_ERROR(ctx, TPK_EINVAL, "%s:%d: isa must be avx512, avx2 or generic, not '%s'", path, line, v);
            have |= HAVE_ISA;
        } else if (!strcmp(k, "vector_bits")) {
            if (!(st = number(path, line, k, v, 128, 512, &x, ctx)))
                c->m.vector_bits = (int)x, have |= HAVE_VB;
        } else if (!strcmp(k, "registers")) {
            if (!(st = number(path, line, k, v, 8, 64, &x, ctx)))
                c->m.registers = (int)x, have |= HAVE_REG;
        } else if (!strcmp(k, "l1") || !strcmp(k, "l2") || !strcmp(k, "l3")) {
            if (!(st = number(path, line, k, v, 4096, 1024.0 * 1024 * 1024, &x, ctx))) {
                if (k[1] == '1')
                    c->m.l1 = x, have |= HAVE_L1;
                else if (k[1] == '2')
                    c->m.l2 = x, have |= HAVE_L2;
                else
                    c->m.l3 = x, have |= HAVE_L3;
            }
        } else if (!strcmp(k, "cflags")) {
            if (strlen(v) >= sizeof c->cflags)
                st = TPK_ERROR(ctx, TPK_EINVAL, "%s:%d: cflags too long", path, line);
            else
                memcpy(c->cflags, v, strlen(v) + 1);
        } else {
            st = TPK_ERROR(ctx, TPK_EINVAL, "%s:%d: unknown key '%s' (name, isa, vector_bits, registers, "
                           "l1, l2, l3, cflags)", path, line, k);
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!st && bad)
        st = TPK_ERROR(ctx, TPK_EIO, "%s: read error", path);
    if (!st && have != ALL)
        st = TPK_ERROR(ctx, TPK_EINVAL, "%s: needs name, isa, vector_bits, registers, l1, l2 and l3", path);
    c->m.name = c->name;
    c->m.id = c->id;
    return st;
}
