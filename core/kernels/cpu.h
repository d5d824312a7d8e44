/* core/kernels/cpu.h — what this CPU can run: the one place that asks CPUID
 * on x86 (and the OS: XGETBV, arch_prctl; the auxiliary vector's HWCAP bits
 * on aarch64 Linux) for instruction-set extensions, and the choice of kernel set
 * (ISA path) every product in core/kernels/ dispatches on, with the override
 * tests and benchmarks use to force a path.
 *
 * Every kernel file asks here instead of probing for itself, so the paths a
 * test forces are the paths the product runs, and a new path (ARM) is added
 * in one place. The probe runs once (pthread_once); its results never change
 * afterwards. Thread-safe; core_qdot_force_isa is meant to be called while no
 * product runs (a product already running may use either path).
 *
 * DARKSERVE_ISA=generic|avx2|avx512vnni in the environment (read by the
 * probe) puts a whole process on that path, as core_qdot_force_isa does from
 * inside: `make unit` runs the kernel and model tests once per path the CPU
 * has, and a benchmark or a server can be run on a lower path than the
 * CPU's best. A name this CPU cannot run, or an unknown one, is not used
 * (the best path runs) and core_qdot_env_error says why; darkserve and the
 * tools refuse to start then.
 */
#ifndef DARKSERVE_CORE_CPU_H
#define DARKSERVE_CORE_CPU_H

#include <stddef.h>

/* One bit per extension; set only where the CPU has it and the OS saves its
 * registers (AVX, AVX-512 state through XGETBV, AMX tile data through
 * Linux's arch_prctl permission, asked for once by the probe). */
typedef enum core_cpu_feature {
    CORE_CPU_AVX2 = 1u << 0,
    CORE_CPU_FMA = 1u << 1,
    CORE_CPU_F16C = 1u << 2,
    CORE_CPU_AVX512F = 1u << 3,
    CORE_CPU_AVX512BW = 1u << 4,
    CORE_CPU_AVX512VL = 1u << 5,
    CORE_CPU_AVX512DQ = 1u << 6,
    CORE_CPU_AVX512VNNI = 1u << 7,
    CORE_CPU_AVX512BF16 = 1u << 8,
    CORE_CPU_AMX_TILE = 1u << 9, /* with the OS's permission to use the tiles */
    CORE_CPU_AMX_INT8 = 1u << 10,
    CORE_CPU_AMX_BF16 = 1u << 11,
    CORE_CPU_NEON = 1u << 12,    /* aarch64 Advanced SIMD (every armv8-a core) */
    CORE_CPU_DOTPROD = 1u << 13, /* aarch64 SDOT/UDOT (Linux HWCAP_ASIMDDP) */
} core_cpu_feature_t;

/* The bits of core_cpu_feature_t this CPU has (0 on a machine that is
 * neither x86 nor aarch64 Linux). */
unsigned core_cpu_features(void);
/* 1 when this CPU has every feature in mask, else 0. */
int core_cpu_has(unsigned mask);

/* Kernel sets of the quantized products. Every CPU runs GENERIC; past it
 * the sets are ordered within one architecture: a CPU that runs one runs
 * every lower one of its architecture (x86: AVX2 < AVX512VNNI; aarch64:
 * NEON < NEON_DOTPROD), none of the other's. */
typedef enum core_qdot_isa {
    CORE_QDOT_GENERIC = 0,      /* portable C (the reference kernels) */
    CORE_QDOT_AVX2 = 1,         /* AVX2 + FMA + F16C, chosen at run time */
    CORE_QDOT_AVX512VNNI = 2,   /* AVX-512 F/BW/VL + VNNI (integer path; f32 path = AVX2) */
    CORE_QDOT_NEON = 3,         /* aarch64 Advanced SIMD: integer path with widening multiplies */
    CORE_QDOT_NEON_DOTPROD = 4, /* NEON + SDOT (armv8.2-a dotprod), chosen at run time */
    CORE_QDOT_ISA_COUNT_
} core_qdot_isa_t;

/* 1 when this CPU runs isa, 0 otherwise (also for values out of range). */
int core_qdot_isa_runs(core_qdot_isa_t isa);
/* 1 when a CPU whose best level is best runs isa (pure: the rule
 * core_qdot_isa_runs applies to this CPU): generic everywhere, else a level
 * of best's architecture up to best. */
int core_qdot_isa_runs_on(core_qdot_isa_t isa, core_qdot_isa_t best);
/* The best ISA this CPU runs. */
core_qdot_isa_t core_qdot_best_isa(void);
/* The ISA DARKSERVE_ISA names where this CPU runs it, else the best. */
core_qdot_isa_t core_qdot_default_isa(void);
/* Why DARKSERVE_ISA was not used (a sentence naming the value; static
 * storage), or NULL when it is unset, empty or used. */
const char *core_qdot_env_error(void);
/* The choice DARKSERVE_ISA=name makes on a CPU whose best path is best
 * (pure; the probe's rule): 0 and *isa the path name names; 1 when name is
 * NULL or empty; CORE_EINVAL (unknown name) or CORE_EUNSUPPORTED (a path
 * above best), with a sentence in msg (n bytes, n > 0). *isa is best
 * except on 0. */
int core_qdot_isa_choose(const char *name, core_qdot_isa_t best, core_qdot_isa_t *isa, char *msg,
                         size_t n);
/* The ISA the default entries (core_qmatmul_nt, core_q8_*) use: the forced
 * one if any, else the default (DARKSERVE_ISA's, else the best). */
core_qdot_isa_t core_qdot_isa(void);
/* Forces the default entries onto isa (tests, benchmarks: the whole model on
 * one kernel set); CORE_QDOT_ISA_COUNT_ goes back to the default. Returns 0, or
 * CORE_EUNSUPPORTED when this CPU cannot run isa (core_qdot_isa_runs). Process-wide and not
 * synchronized: call it while no product runs. */
int core_qdot_force_isa(core_qdot_isa_t isa);
/* "generic", "avx2", "avx512vnni", "neon", "neon-dotprod"; NULL for another
 * value. */
const char *core_qdot_isa_name(core_qdot_isa_t isa);

#endif
