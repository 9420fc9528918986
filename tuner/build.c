/* Building and running candidates: compiling a kernel source into a shared object with the
 * library's warning flags, the scratch directory, libgomp kept resident, and child processes with
 * a timeout whose stdout is captured (the measurer, tuner/measure.c, and the exact verifier's
 * mutation suite, tuner/mutate.c, run every candidate in a process of its own). */
#include "tune_impl.h"

#include "../core/signal_impl.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void tpk_tune_pin_openmp(void)
{
    static int done;
    if (!done) {
        done = 1;
        (void)dlopen("libgomp.so.1", RTLD_NOW | RTLD_GLOBAL | RTLD_NODELETE);
    }
}

extern char **environ;

/* Start path (or a name looked up in PATH) with arguments argv, with stdout to fd (stderr as ours), or
 * with fd −1 both to /dev/null, and NAME=VALUE set in its environment (NULL: none): posix_spawn, which glibc implements with
 * a vfork-like clone. A fork would mark every page of this process copy-on-write until the
 * child execs, and the first write to each afterwards faults: a process holding large blocks
 * (netsor plan --emitted, between its kernels) measured its next kernel 5× slower. −1 on failure. */
static pid_t spawn(const char *path, char *const argv[], int fd, const char *set)
{
    posix_spawn_file_actions_t fa;
    if (posix_spawn_file_actions_init(&fa) != 0)
        return -1;
    int bad = fd >= 0 ? posix_spawn_file_actions_adddup2(&fa, fd, 1)
                      : posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0) |
                            posix_spawn_file_actions_adddup2(&fa, 1, 2);
    size_t ne = 0;
    while (environ && environ[ne])
        ne++;
    char **env = malloc((ne + 2) * sizeof *env);
    pid_t pid = -1;
    if (!bad && env) {
        size_t k = 0, klen = set ? strcspn(set, "=") + 1 : 0;
        for (size_t i = 0; i < ne; i++)
            if (!set || strncmp(environ[i], set, klen) != 0)
                env[k++] = environ[i];
        if (set)
            env[k++] = (char *)set;
        env[k] = NULL;
        if (posix_spawnp(&pid, path, &fa, NULL, argv, env) != 0)
            pid = -1;
    }
    free(env);
    posix_spawn_file_actions_destroy(&fa);
    return pid;
}

/* Wait for pid up to timeout_s; kill it past that. Returns the wait status or -1 on timeout. */
static int wait_timeout(pid_t pid, double timeout_s)
{
    double t0 = tpk_wall_seconds();
    for (;;) {
        int ws;
        pid_t r = waitpid(pid, &ws, WNOHANG);
        if (r == pid)
            return ws;
        if (r < 0 && errno != EINTR)
            return -1;
        if (tpk_wall_seconds() - t0 > timeout_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &ws, 0);
            return -1;
        }
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
}

int tpk_tune_compile_cpu(const char *src, const char *so, const char *cc, double timeout_s,
                         double *seconds, tpk_ctx *ctx)
{
    return tpk__compile_cpu(src, so, cc, NULL, timeout_s, seconds, ctx);
}

int tpk__compile_cpu(const char *src, const char *so, const char *cc, const char *extra, double timeout_s,
                     double *seconds, tpk_ctx *ctx)
{
    double t0 = tpk_wall_seconds();
    /* Quiet unless it fails: the caller reports a failed compile as a result. The library's
     * warning flags: a candidate that would not build in gen/ (-Werror there) is rejected here,
     * not discovered by `make` after tuning. libmvec: the map template's vector acos / atan2. */
    char *argv[] = {(char *)(cc ? cc : "gcc"), "-std=gnu11", "-O3", "-march=native", "-ffp-contract=fast", "-fopenmp",
                    "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o", (char *)so, (char *)src, "-lmvec", "-lm",
                    (char *)extra, NULL};
    pid_t pid = spawn(argv[0], argv, -1, NULL);
    if (pid < 0)
        return TPK_ERROR(ctx, TPK_EIO, "tune: cannot start %s: %s", argv[0], strerror(errno));
    int ws = wait_timeout(pid, timeout_s > 0 ? timeout_s : 60);
    if (seconds)
        *seconds = tpk_wall_seconds() - t0;
    if (ws == -1 || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
        return TPK_ERROR(ctx, TPK_EIO, "tune: compiling %s failed", src);
    return TPK_OK;
}

const char *tpk__find_runner(const char *runner, char *buf, size_t cap)
{
    if (runner)
        return runner[0] ? runner : NULL;
    const char *e = getenv("TPK_TUNE_RUNNER");
    if (e && *e)
        return e;
    e = getenv("TPK_BIN");
    if (e && *e) {
        snprintf(buf, cap, "%s/tptune", e);
        if (access(buf, X_OK) == 0)
            return buf;
    }
    return NULL;
}

int tpk__run_capture(const char *runner, char *const argv[], int threads, double timeout_s,
                     void (*inproc)(void *arg, int fd), void *arg, char *buf, size_t cap)
{
    int fd[2];
    if (pipe(fd) != 0)
        return -1;
    fflush(NULL);
    /* OpenBLAS starts its worker threads at load and lets them spin before they sleep: with more
     * than the candidate's threads they would compete with it. */
    char nt[48];
    snprintf(nt, sizeof nt, "OPENBLAS_NUM_THREADS=%d", threads < 1 ? 1 : threads);
    fcntl(fd[0], F_SETFD, FD_CLOEXEC);
    pid_t pid = runner ? spawn(runner, argv, fd[1], nt) : fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        return -1;
    }
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 1);
        /* the parent's crash handlers (a test harness's, a tool's cleanup) are not the child's: a
         * crashing candidate dies of its signal, which is the parent's answer */
        static const int sig[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
        for (size_t i = 0; i < sizeof sig / sizeof sig[0]; i++)
            signal(sig[i], SIG_DFL);
        inproc(arg, 1);
        _exit(0);
    }
    close(fd[1]);
    size_t len = 0;
    double t0 = tpk_wall_seconds();
    int timed_out = 0;
    for (;;) {
        struct pollfd pf = {fd[0], POLLIN, 0};
        double left = timeout_s - (tpk_wall_seconds() - t0);
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        int pr = poll(&pf, 1, (int)(left * 1000) + 1);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0) {
            timed_out = pr == 0;
            break;
        }
        ssize_t got = read(fd[0], buf + len, cap - 1 - len);
        if (got <= 0)
            break;
        len += (size_t)got;
        if (len >= cap - 1)
            break;
    }
    buf[len] = '\0';
    close(fd[0]);
    if (timed_out)
        kill(pid, SIGKILL);
    int ws = wait_timeout(pid, 5);
    return timed_out || ws == -1 || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0 ? -1 : 0;
}

/* The scratch directory, "$TMPDIR/tptune.<pid>.XXXXXX", and the names of the latest scratch files
 * in it: a SIGINT, SIGTERM or SIGHUP (where those still have their default action) removes them
 * and the directory, says so and exits 128 + signal, and a directory left by a process that no
 * longer exists (SIGKILL, a crash) is removed by the next tptune (issue 18: interrupted searches
 * left kernel sources and shared objects in /tmp). Each scratch file is unlinked by its user
 * before the next is made, so a ring of the latest names covers the live ones; the handler only
 * calls unlink, rmdir, write and _exit (async-signal-safe). */
#define SCRATCH_RING 16
static char g_workdir[512];
static char g_scratch[SCRATCH_RING][600];
static volatile sig_atomic_t g_scratch_used[SCRATCH_RING];
static unsigned g_scratch_next;

static void remove_workdir(void)
{
    if (g_workdir[0])
        rmdir(g_workdir);
}

static void on_signal(int sig)
{
    for (int i = 0; i < SCRATCH_RING; i++)
        if (g_scratch_used[i])
            unlink(g_scratch[i]);
    remove_workdir();
    tpk__signal_say("tptune: ", sig, "; the records measured so far are in the log\n");
    _exit(128 + sig);
}

static void install_handlers(void)
{
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    tpk__signals_default_to(sigs, 3, on_signal);
}

static void scratch_note(const char *path)
{
    unsigned i = g_scratch_next++ % SCRATCH_RING;
    g_scratch_used[i] = 0;
    snprintf(g_scratch[i], sizeof g_scratch[i], "%s", path);
    g_scratch_used[i] = 1;
}

/* "tptune.<pid>.XXXXXX" folders of tmp whose process is gone: their files, then the folder. */
static void remove_stale_workdirs(const char *tmp)
{
    DIR *d = opendir(tmp);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        char *end;
        if (strncmp(de->d_name, "tptune.", 7) != 0)
            continue;
        long pid = strtol(de->d_name + 7, &end, 10);
        if (end == de->d_name + 7 || *end != '.' || strlen(end + 1) != 6 || pid <= 0 ||
            pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        char dir[1024], f[2048];
        snprintf(dir, sizeof dir, "%s/%s", tmp, de->d_name);
        DIR *sd = opendir(dir);
        struct dirent *fe;
        while (sd && (fe = readdir(sd)) != NULL)
            if (strcmp(fe->d_name, ".") != 0 && strcmp(fe->d_name, "..") != 0) {
                snprintf(f, sizeof f, "%s/%s", dir, fe->d_name);
                unlink(f);
            }
        if (sd)
            closedir(sd);
        rmdir(dir);
    }
    closedir(d);
}

int tpk__workdir(const char *o_dir, char *dir, size_t cap, tpk_ctx *ctx)
{
    if (o_dir) {
        mkdir(o_dir, 0755);
        snprintf(dir, cap, "%s", o_dir);
        return TPK_OK;
    }
    if (!g_workdir[0]) {
        const char *tmp = getenv("TMPDIR");
        tmp = tmp && *tmp ? tmp : "/tmp";
        remove_stale_workdirs(tmp);
        install_handlers();
        snprintf(g_workdir, sizeof g_workdir, "%s/tptune.%ld.XXXXXX", tmp, (long)getpid());
        if (!mkdtemp(g_workdir)) {
            g_workdir[0] = '\0';
            return TPK_ERROR(ctx, TPK_EIO, "tune: cannot create a scratch directory: %s", strerror(errno));
        }
        atexit(remove_workdir);
    }
    snprintf(dir, cap, "%s", g_workdir);
    return TPK_OK;
}

int tpk__scratch(const char *o_dir, const char *tag, char *src, char *so, size_t cap, tpk_ctx *ctx)
{
    char dir[512];
    int st = tpk__workdir(o_dir, dir, sizeof dir, ctx);
    if (st)
        return st;
    static unsigned counter;
    snprintf(src, cap, "%s/%s%ld_%u.c", dir, tag, (long)getpid(), counter);
    snprintf(so, cap, "%s/%s%ld_%u.so", dir, tag, (long)getpid(), counter++);
    scratch_note(src);
    scratch_note(so);
    return TPK_OK;
}
