/* How many OpenMP threads the toolkit's work runs on, on a machine it shares (a laptop, a
 * shared node, a cluster job): what the process may use, and what other processes leave free. */
#ifndef TPK_THREADS_H
#define TPK_THREADS_H

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Choose the calling thread's OpenMP team size for the work that follows (omp_set_num_threads,
 * which OpenBLAS's OpenMP build follows too) and return it:
 *   - at most the CPUs the process may use: its affinity mask, and a CPU quota (cgroup v2
 *     cpu.max on its cgroup path, or v1 cpu.cfs_quota_us) where that allows fewer — a container
 *     limited to 2 CPUs on a 64-core node runs 2 threads, not 64 time-sliced ones;
 *   - less the threads of other processes running right now (/proc/loadavg), at least 1: beside
 *     another busy job a team whose members wait for each other at every barrier waits for
 *     descheduled members (the MLP kernel of 500 inputs took 6.2 s instead of 0.05 s beside
 *     another multi-threaded job; docs/architecture.md "Threads on a shared machine").
 * The library never calls it by itself: the toolkit's programs call it as they start, the
 * Python package before each call; a C program of your own calls it before its work where it
 * may share the machine. OMP_NUM_THREADS set in the environment is the user's choice and is
 * kept (the function returns it); TPK_THREADS=fixed keeps the OpenMP default. Results do not
 * depend on the team size beyond rounding (LAPACK's factorisations, reductions): set
 * OMP_NUM_THREADS or TPK_THREADS=fixed where runs must agree bit for bit. */
TPK_API int tpk_threads_adapt(void);

#ifdef __cplusplus
}
#endif
#endif
