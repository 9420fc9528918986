/* The OpenMP team size for a process that shares its machine (include/tpk/threads.h). */
#define _GNU_SOURCE
#include "tpk/threads.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The cgroup file system's root; TPK_CGROUP_ROOT moves it, with the process's cgroup list in
 * its file self.cgroup (the tests' fake hierarchies). */
static const char *cgroup_root(void)
{
    const char *r = getenv("TPK_CGROUP_ROOT");
    return r != NULL && r[0] != '\0' ? r : "/sys/fs/cgroup";
}

/* A cgroup v2 cpu.max ("max 100000" or "150000 100000") in CPUs; 0: no quota. */
static double quota_v2(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    char q[32] = "";
    double period = 0;
    int n = fscanf(f, "%31s %lf", q, &period);
    fclose(f);
    if (n != 2 || strcmp(q, "max") == 0 || !(period > 0))
        return 0;
    double quota = strtod(q, NULL);
    return quota > 0 ? quota / period : 0;
}

static double read_number(const char *path)
{
    FILE *f = fopen(path, "r");
    double v = 0;
    if (f == NULL)
        return 0;
    if (fscanf(f, "%lf", &v) != 1)
        v = 0;
    fclose(f);
    return v;
}

/* The tightest CPU quota on the process's cgroup path, in CPUs (0: none). v2: every level from
 * the process's cgroup up to the root (a parent's limit binds its children); v1: the cpu
 * controller's. */
static double cpu_quota(void)
{
    const char *root = cgroup_root();
    char line[2048], path[4096];
    double best = 0;
    snprintf(path, sizeof path, "%s/self.cgroup", root);
    FILE *f = fopen(getenv("TPK_CGROUP_ROOT") ? path : "/proc/self/cgroup", "r");
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        if (strncmp(line, "0::", 3) != 0)
            continue;
        for (char *rel = line + 3;;) {
            snprintf(path, sizeof path, "%s%s/cpu.max", root, strcmp(rel, "/") ? rel : "");
            double q = quota_v2(path);
            if (q > 0 && (best == 0 || q < best))
                best = q;
            char *slash = strrchr(rel, '/');
            if (slash == NULL || slash == rel)
                break;
            *slash = '\0';
        }
    }
    if (f != NULL)
        fclose(f);
    if (best == 0) {
        snprintf(path, sizeof path, "%s/cpu/cpu.cfs_quota_us", root);
        double quota = read_number(path);
        snprintf(path, sizeof path, "%s/cpu/cpu.cfs_period_us", root);
        double period = read_number(path);
        if (quota > 0 && period > 0)
            best = quota / period;
    }
    return best;
}

/* Threads running on the machine now, the caller included (/proc/loadavg's fourth field);
 * 0: unknown. */
static int running_now(void)
{
    const char *p = getenv("TPK_LOADAVG"); /* the tests' fake */
    FILE *f = fopen(p != NULL && p[0] ? p : "/proc/loadavg", "r");
    int run = 0, total = 0;
    if (f == NULL)
        return 0;
    if (fscanf(f, "%*f %*f %*f %d/%d", &run, &total) != 2)
        run = 0;
    fclose(f);
    return run;
}

int tpk_threads_adapt(void)
{
    const char *user = getenv("OMP_NUM_THREADS"), *mode = getenv("TPK_THREADS");
    if ((user != NULL && user[0] != '\0') || (mode != NULL && strcmp(mode, "fixed") == 0))
        return omp_get_max_threads();
    int avail = omp_get_num_procs(); /* the affinity mask */
    double q = cpu_quota();
    if (q > 0 && ceil(q) < avail)
        avail = (int)ceil(q);
    int run = running_now(), others = run > 1 ? run - 1 : 0;
    int k = avail - others;
    k = k < 1 ? 1 : k > avail ? avail : k;
    omp_set_num_threads(k);
    return k;
}
