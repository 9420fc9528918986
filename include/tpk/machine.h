/* Machine classes: an instruction set plus a cache and register profile (docs/tuner-notes.md §7).
 * Each shipped class is a data file, data/machines/ID.conf, beside the tuning logs whose records
 * name it; `make` generates the class table and one GEMM and one map table per class into gen/
 * from those files alone, so gen/ does not depend on the build host. At run time the library
 * detects the CPU and serves from the matching class (tpk_machine_select). */
#ifndef TPK_MACHINE_H
#define TPK_MACHINE_H

#include <stddef.h>

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Instruction sets, ordered: a CPU that runs one runs every lower one. */
enum tpk_isa {
    TPK_ISA_GENERIC = 0, /* x86-64 baseline, or another architecture */
    TPK_ISA_AVX2 = 1,    /* x86-64-v3: AVX2 + FMA, 16 vector registers of 256 bits */
    TPK_ISA_AVX512 = 2   /* x86-64-v4: AVX-512 F/BW/DQ/VL, 32 vector registers of 512 bits */
};

typedef struct tpk_machine {
    const char *name;   /* "cpu/x86_64/avx512/intel" (the "target" of tuning-log records) */
    const char *id;     /* "avx512-intel": the data file's and the generated tables' name */
    int isa;            /* enum tpk_isa */
    int vector_bits;    /* widest vector the kernels use */
    int registers;      /* vector registers */
    double l1, l2, l3;  /* data-cache bytes one core's blocking may count on (L3: its share) */
} tpk_machine;

/* The shipped classes (generated from data/machines/ into gen/tpk_classes.c). */
TPK_API const tpk_machine *tpk_machine_classes(size_t *count);
TPK_API const tpk_machine *tpk_machine_find(const char *name);

/* The ISA this CPU runs (CPUID, through the compiler's cpu builtins) and the name of its class,
 * shipped or not: "cpu/x86_64/avx512/intel", "cpu/x86_64/avx512/zen4", "cpu/x86_64/avx2",
 * "cpu/x86_64/generic", "cpu/generic". */
TPK_API int tpk_machine_host_isa(void);
TPK_API const char *tpk_machine_host_name(void);
TPK_API const char *tpk_isa_name(int isa);

/* How a class was chosen for this CPU. */
enum tpk_machine_how {
    TPK_MACHINE_EXACT = 0,   /* the CPU's own class is shipped */
    TPK_MACHINE_SAME_ISA = 1, /* another shipped class of the same ISA */
    TPK_MACHINE_LOWER_ISA = 2, /* a shipped class of a lower ISA this CPU runs */
    TPK_MACHINE_FORCED = 3,  /* TPK_CLASS=NAME in the environment (a class this CPU runs) */
    TPK_MACHINE_NONE = 4     /* no shipped class runs here: OpenBLAS / reference code serve */
};

/* The shipped class whose tables serve this CPU (NULL with TPK_MACHINE_NONE): TPK_CLASS names one
 * explicitly (ignored, with how = the detected choice, when this CPU cannot run it); else the
 * exact class, else the first of the same ISA, else the highest lower ISA. */
TPK_API const tpk_machine *tpk_machine_select(int *how);
TPK_API const char *tpk_machine_how_name(int how);

/* The host as a class description for tuning: its class name, the detected ISA's vector width
 * and registers, and sysconf cache sizes (fallbacks of a current server core; an L3 above 64 MiB,
 * a VM's socket-wide figure, counts as 64 MiB). Not for gen/: generation reads only the data
 * files of the classes. */
TPK_API void tpk_machine_host(tpk_machine *m);

#ifdef __cplusplus
}
#endif
#endif
