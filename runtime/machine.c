/* CPU detection (include/tpk/machine.h, tuner-notes §7): the ISA level, the host's class name,
 * and the host as a class profile for tuning. Nothing here reads gen/, so the generator of gen/
 * links it (mk/tuner.mk); the choice among the shipped classes is machine_select.c. */
#include "tpk/machine.h"

#include <unistd.h>

int tpk_machine_host_isa(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    /* The psABI levels: v4 needs AVX-512 F/BW/CD/DQ/VL and the OS saving their state, v3 AVX2,
     * FMA, BMI1/2, F16C, LZCNT, MOVBE: what -march=x86-64-v4 / -v3 code may use. */
    if (__builtin_cpu_supports("x86-64-v4"))
        return TPK_ISA_AVX512;
    if (__builtin_cpu_supports("x86-64-v3"))
        return TPK_ISA_AVX2;
#endif
    return TPK_ISA_GENERIC;
}

const char *tpk_machine_host_name(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    switch (tpk_machine_host_isa()) {
    case TPK_ISA_AVX512:
        /* AMD's AVX-512 parts are Zen 4 and later (512-bit ops on 256-bit pipes). */
        return __builtin_cpu_is("intel") ? "cpu/x86_64/avx512/intel"
               : __builtin_cpu_is("amd") ? "cpu/x86_64/avx512/zen4"
                                         : "cpu/x86_64/avx512";
    case TPK_ISA_AVX2:
        return "cpu/x86_64/avx2";
    default:
        return "cpu/x86_64/generic";
    }
#else
    return "cpu/generic";
#endif
}

const char *tpk_isa_name(int isa)
{
    return isa == TPK_ISA_AVX512 ? "avx512" : isa == TPK_ISA_AVX2 ? "avx2" : "generic";
}

void tpk_machine_host(tpk_machine *m)
{
    int isa = tpk_machine_host_isa();
    /* Fallbacks: a current server core (48 KiB L1d, 2 MiB L2, 32 MiB L3 share); VMs often
     * report nothing, or the socket's L3 as if it were one core's. */
    long l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    *m = (tpk_machine){
        .name = tpk_machine_host_name(),
        .id = "host",
        .isa = isa,
        .vector_bits = isa == TPK_ISA_AVX512 ? 512 : 256,
        .registers = isa == TPK_ISA_AVX512 ? 32 : 16,
        .l1 = l1 > 0 ? (double)l1 : 48.0 * 1024,
        .l2 = l2 > 0 ? (double)l2 : 2048.0 * 1024,
        .l3 = l3 > 0 ? (double)l3 : 32.0 * 1024 * 1024,
    };
    if (m->l3 > 64.0 * 1024 * 1024)
        m->l3 = 64.0 * 1024 * 1024;
}
