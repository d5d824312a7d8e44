/* core/kernels/cpu.c — the CPU-feature probe and the ISA path choice (see
 * cpu.h).
 *
 * __builtin_cpu_supports answers for the extensions it knows and checks that
 * the OS saves their registers; CPUID is read directly for the rest, each
 * only after the family it belongs to was found (F16C after AVX2, VNNI and
 * BF16 after AVX-512F, the AMX units after the OS granted the tile state).
 * The probe also reads DARKSERVE_ISA, once: the environment of a process
 * does not change what its kernels are.
 * On aarch64 Linux the kernel says what the cores have in the auxiliary
 * vector's HWCAP bits (getauxval): ASIMD (NEON) and ASIMDDP (SDOT/UDOT). The
 * binary is built for armv8-a, so it starts on any 64-bit ARM core, and
 * the dotprod kernels run only where the bit is set.
 */
#include "core/kernels/cpu.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define CPU_X86 1
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define CPU_AMX 1
#define AMX_REQ_XCOMP_PERM 0x1023 /* arch_prctl: ask for an XSAVE feature */
#define AMX_XTILEDATA 18          /* the tile data state component */
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#define CPU_ARM_LINUX 1
#define ARM_HWCAP_ASIMD (1ul << 1)    /* Linux's HWCAP_ASIMD (asm/hwcap.h) */
#define ARM_HWCAP_ASIMDDP (1ul << 20) /* Linux's HWCAP_ASIMDDP */
#endif

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static unsigned features;
static core_qdot_isa_t default_isa; /* DARKSERVE_ISA's path, else the best */
static char env_error[160];  /* why DARKSERVE_ISA was refused, "" when it was not */

static core_qdot_isa_t best_of(unsigned f);

static void probe(void)
{
    unsigned f = 0;
#ifdef CPU_X86
    unsigned a = 0, b = 0, c = 0, d = 0;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2"))
        f |= CORE_CPU_AVX2;
    if (__builtin_cpu_supports("fma"))
        f |= CORE_CPU_FMA;
    /* F16C: CPUID.(EAX=1):ECX bit 29 (its registers are AVX's) */
    if ((f & CORE_CPU_AVX2) && __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1u))
        f |= CORE_CPU_F16C;
    if (__builtin_cpu_supports("avx512f")) {
        f |= CORE_CPU_AVX512F;
        if (__builtin_cpu_supports("avx512bw"))
            f |= CORE_CPU_AVX512BW;
        if (__builtin_cpu_supports("avx512vl"))
            f |= CORE_CPU_AVX512VL;
        if (__builtin_cpu_supports("avx512dq"))
            f |= CORE_CPU_AVX512DQ;
        /* CPUID.(EAX=7, ECX=0):ECX bit 11 AVX-512 VNNI; (EAX=7, ECX=1):EAX
         * bit 5 AVX512-BF16 */
        if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (c >> 11 & 1u))
            f |= CORE_CPU_AVX512VNNI;
        if (__get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 5 & 1u))
            f |= CORE_CPU_AVX512BF16;
    }
#endif
#ifdef CPU_AMX
    /* CPUID.(EAX=7, ECX=0):EDX bit 24 AMX-TILE, 25 AMX-INT8, 22 AMX-BF16; the
     * tile data is an XSAVE component a process must ask Linux for. */
    if ((f & CORE_CPU_AVX512F) && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 1u) &&
        syscall(SYS_arch_prctl, AMX_REQ_XCOMP_PERM, AMX_XTILEDATA) == 0) {
        f |= CORE_CPU_AMX_TILE;
        if (d >> 25 & 1u)
            f |= CORE_CPU_AMX_INT8;
        if (d >> 22 & 1u)
            f |= CORE_CPU_AMX_BF16;
    }
#endif
#ifdef CPU_ARM_LINUX
    const unsigned long hw = getauxval(AT_HWCAP);
    if (hw & ARM_HWCAP_ASIMD) {
        f |= CORE_CPU_NEON;
        if (hw & ARM_HWCAP_ASIMDDP)
            f |= CORE_CPU_DOTPROD;
    }
#endif
    features = f;
    /* on a refusal (env_error set) isa is the best */
    (void)core_qdot_isa_choose(getenv("DARKSERVE_ISA"), best_of(f), &default_isa, env_error,
                               sizeof env_error);
}

unsigned core_cpu_features(void)
{
    (void)pthread_once(&probe_once, probe);
    return features;
}

int core_cpu_has(unsigned mask)
{
    return (core_cpu_features() & mask) == mask;
}

static core_qdot_isa_t best_of(unsigned f)
{
    if (f & CORE_CPU_NEON)
        return (f & CORE_CPU_DOTPROD) ? CORE_QDOT_NEON_DOTPROD : CORE_QDOT_NEON;
    const unsigned avx2 = CORE_CPU_AVX2 | CORE_CPU_FMA | CORE_CPU_F16C;
    const unsigned avx512 =
        CORE_CPU_AVX512F | CORE_CPU_AVX512BW | CORE_CPU_AVX512VL | CORE_CPU_AVX512VNNI;
    if ((f & avx2) != avx2)
        return CORE_QDOT_GENERIC;
    if ((f & avx512) == avx512)
        return CORE_QDOT_AVX512VNNI;
    return CORE_QDOT_AVX2;
}

int core_qdot_isa_runs_on(core_qdot_isa_t isa, core_qdot_isa_t best)
{
    if (isa == CORE_QDOT_GENERIC)
        return 1;
    if (best >= CORE_QDOT_NEON) /* aarch64 */
        return isa >= CORE_QDOT_NEON && isa <= best;
    return isa > CORE_QDOT_GENERIC && isa <= best;
}

int core_qdot_isa_runs(core_qdot_isa_t isa)
{
    return core_qdot_isa_runs_on(isa, core_qdot_best_isa());
}

core_qdot_isa_t core_qdot_best_isa(void)
{
    return best_of(core_cpu_features());
}

int core_qdot_isa_choose(const char *name, core_qdot_isa_t best, core_qdot_isa_t *isa, char *msg,
                         size_t n)
{
    if (n > 0)
        msg[0] = '\0';
    *isa = best;
    if (!name || !*name)
        return 1;
    for (int i = 0; i < CORE_QDOT_ISA_COUNT_; i++) {
        if (strcmp(name, core_qdot_isa_name((core_qdot_isa_t)i)) != 0)
            continue;
        if (!core_qdot_isa_runs_on((core_qdot_isa_t)i, best)) {
            snprintf(msg, n, "DARKSERVE_ISA=%s: this CPU does not run it (its best path is %s)",
                     name, core_qdot_isa_name(best));
            return CORE_EUNSUPPORTED;
        }
        *isa = (core_qdot_isa_t)i;
        return 0;
    }
    snprintf(msg, n, "DARKSERVE_ISA=%.40s: unknown path (generic, avx2, avx512vnni, neon or neon-dotprod)", name);
    return CORE_EINVAL;
}

core_qdot_isa_t core_qdot_default_isa(void)
{
    (void)pthread_once(&probe_once, probe);
    return default_isa;
}

const char *core_qdot_env_error(void)
{
    (void)pthread_once(&probe_once, probe);
    return env_error[0] ? env_error : NULL;
}

/* core_qdot_force_isa's choice, -1 for none. Atomic so that a product running
 * on another thread reads the old or the new ISA, never a torn value; which
 * one is the caller's business (the header says: while no product runs). */
static _Atomic int forced_isa = -1;

core_qdot_isa_t core_qdot_isa(void)
{
    const int f = atomic_load_explicit(&forced_isa, memory_order_relaxed);
    return f >= 0 ? (core_qdot_isa_t)f : core_qdot_default_isa();
}

int core_qdot_force_isa(core_qdot_isa_t isa)
{
    if (isa == CORE_QDOT_ISA_COUNT_) {
        atomic_store_explicit(&forced_isa, -1, memory_order_relaxed);
        return 0;
    }
    if (!core_qdot_isa_runs(isa))
        return CORE_EUNSUPPORTED;
    atomic_store_explicit(&forced_isa, (int)isa, memory_order_relaxed);
    return 0;
}

const char *core_qdot_isa_name(core_qdot_isa_t isa)
{
    switch (isa) {
    case CORE_QDOT_GENERIC: return "generic";
    case CORE_QDOT_AVX2: return "avx2";
    case CORE_QDOT_AVX512VNNI: return "avx512vnni";
    case CORE_QDOT_NEON: return "neon";
    case CORE_QDOT_NEON_DOTPROD: return "neon-dotprod";
    default: return NULL;
    }
}
