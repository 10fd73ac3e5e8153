/* Choosing the kernel table: what this kvserve was built with, what the CPU and OS run, and the
 * --kernels override. CPUID is read at each call (cheap; the engine asks once per model load). */
#include "engine/kern/kern.h"
#include "engine/kern/qdot.h"

#include "common/status.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define KERN_X86 1
#endif

#ifdef KERN_X86
/* The OS saves the YMM (bit 2) and XMM (bit 1) state on context switches: without that, using
 * the 256-bit registers would corrupt other threads' values even on a CPU that has them. */
static bool os_saves_ymm(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE))
        return false;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 6) == 6;
}

/* F16C from CPUID leaf 1 (clang's __builtin_cpu_supports does not know "f16c"). */
static bool cpu_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

static bool cpu_has_avx2(void)
{
#ifdef KERN_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_f16c() &&
           os_saves_ymm();
#else
    return false;
#endif
}

#ifdef KERN_X86
/* The OS saves the opmask (bit 5) and both halves of the 32 ZMM registers (bits 6, 7) besides
 * XMM/YMM: XCR0 & 0xe6 == 0xe6, which Intel's manual requires before any AVX-512 instruction. */
static bool os_saves_zmm(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE))
        return false;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 0xe6) == 0xe6;
}

/* CPUID leaf 7 sub-leaf sub, EAX EBX ECX (all 0 where the leaf is absent). */
static void cpuid7(unsigned sub, unsigned *a, unsigned *b, unsigned *c)
{
    unsigned d = 0;
    *a = *b = *c = 0;
    if (__get_cpuid_max(0, NULL) >= 7)
        __cpuid_count(7, sub, *a, *b, *c, d);
    (void)d;
}
#endif

/* The first feature the avx512 table needs that this CPU or OS lacks, or NULL. */
static const char *avx512_missing(void)
{
#ifdef KERN_X86
    unsigned a, b, c;
    cpuid7(0, &a, &b, &c);
    if (!(b & bit_AVX512F))
        return "AVX512F";
    if (!(b & bit_AVX512BW))
        return "AVX512BW";
    if (!(b & bit_AVX512VL))
        return "AVX512VL";
    if (!(b & bit_AVX512DQ))
        return "AVX512DQ";
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("fma"))
        return "FMA";
    if (!cpu_f16c())
        return "F16C";
    if (!os_saves_zmm())
        return "OS support for the ZMM and opmask state (XCR0 & 0xe6)";
    return NULL;
#else
    return "an x86 CPU";
#endif
}

/* An AMD CPU's family (CPUID 1's base plus extended family), 0 for any other vendor */
static unsigned amd_family(void)
{
#ifdef KERN_X86
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d))
        return 0;
    char vendor[13];
    memcpy(vendor, &b, 4);
    memcpy(vendor + 4, &d, 4);
    memcpy(vendor + 8, &c, 4);
    vendor[12] = '\0';
    if (strcmp(vendor, "AuthenticAMD") || !__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    unsigned family = (a >> 8) & 0xf;
    if (family == 0xf)
        family += (a >> 20) & 0xff;
    return family;
#else
    return 0;
#endif
}

bool kern_cpu_avx512_halves(void)
{
#ifdef KERN_X86
    /* family 19h is Zen 3 (no AVX-512) and Zen 4; Zen 5 (1Ah) has full-width units */
    unsigned a7, b7, c7;
    cpuid7(0, &a7, &b7, &c7);
    return amd_family() == 0x19 && (b7 & bit_AVX512F);
#else
    return false;
#endif
}

bool kern_cpu_cvtph_free(void)
{
    /* One Zen 5 core: 12 independent zmm FMAs 1.79 ns a round, with 2 vcvtph2ps among them
     * 1.82 ns. On Intel a zmm vcvtph2ps takes two uops on the FMA ports (kern/avx512.c). */
    return amd_family() >= 0x1a;
}

#ifdef KERN_HAVE_AVX512
static bool cpu_has_avx512(void)
{
    return avx512_missing() == NULL;
}
#endif

const char *kern_cpu_features(void)
{
#ifdef KERN_X86
    __builtin_cpu_init();
    unsigned a0, b0, c0, a1, b1, c1;
    cpuid7(0, &a0, &b0, &c0);
    cpuid7(1, &a1, &b1, &c1);
    static const char *const names[] = {"avx2",     "fma",        "f16c",
                                        "avx512f",  "avx512bw",   "avx512vl",
                                        "avx512dq", "avx512vnni", "avx512bf16"};
    enum { N_FEAT = sizeof names / sizeof names[0] };
    bool has[N_FEAT] = {
        __builtin_cpu_supports("avx2"), __builtin_cpu_supports("fma"), cpu_f16c(),
        (b0 & bit_AVX512F) != 0,        (b0 & bit_AVX512BW) != 0,      (b0 & bit_AVX512VL) != 0,
        (b0 & bit_AVX512DQ) != 0,       (c0 & bit_AVX512VNNI) != 0,    (a1 & bit_AVX512BF16) != 0};
    static _Thread_local char line[256];
    size_t n = 0;
    line[0] = '\0';
    for (int i = 0; i < N_FEAT; i++) /* "avx2 fma f16c", then "; no avx512f ..." */
        if (has[i])
            n += (size_t)snprintf(line + n, sizeof line - n, "%s%s", n ? " " : "", names[i]);
    bool first_missing = true;
    for (int i = 0; i < N_FEAT; i++)
        if (!has[i]) {
            n += (size_t)snprintf(line + n, sizeof line - n, "%s%s",
                                  first_missing ? (n ? "; no " : "no ") : " ", names[i]);
            first_missing = false;
        }
    if (!os_saves_ymm())
        snprintf(line + n, sizeof line - n, "; the OS does not save YMM state");
    else if (has[3] && !os_saves_zmm())
        snprintf(line + n, sizeof line - n, "; the OS does not save ZMM state");
    return line;
#else
    return "not an x86 CPU";
#endif
}

int kern_amx(void)
{
#if defined(KERN_HAVE_QDOT_AMX)
    return kern__amx_ready();
#else
    return 0;
#endif
}

int kern_cpu_can(const char *name)
{
    if (!strcmp(name, "generic"))
        return 1;
#ifdef KERN_HAVE_AVX2
    if (!strcmp(name, "avx2"))
        return cpu_has_avx2();
#endif
#ifdef KERN_HAVE_AVX512
    if (!strcmp(name, "avx512"))
        return cpu_has_avx512();
#endif
    return -1;
}

int kern_select(const char *name, const kern_ops **out, char *err, size_t err_len)
{
    *out = NULL;
    if (!name || !*name || !strcmp(name, "auto")) {
#ifdef KERN_HAVE_AVX512
        if (cpu_has_avx512()) {
            *out = kern_cpu_avx512_halves() ? &kern_avx512_halves_ops
                   : kern_cpu_cvtph_free()  ? &kern_avx512_cvt_ops
                                            : &kern_avx512_ops;
            return 0;
        }
#endif
#ifdef KERN_HAVE_AVX2
        if (cpu_has_avx2()) {
            *out = &kern_avx2_ops;
            return 0;
        }
#endif
        *out = &kern_ref_ops;
        return 0;
    }
    if (!strcmp(name, "generic")) {
        *out = &kern_ref_ops;
        return 0;
    }
    if (!strcmp(name, "avx2")) {
#ifdef KERN_HAVE_AVX2
        if (!cpu_has_avx2())
            return status_set_err(
                err, err_len, KVS_EUNSUPPORTED,
                "--kernels avx2: this CPU cannot run it (needs AVX2, FMA and F16C "
                "with OS support; it has: %s)",
                kern_cpu_features());
        *out = &kern_avx2_ops;
        return 0;
#else
        return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                              "--kernels avx2: not built into this kvserve (not an x86-64 build)");
#endif
    }
    if (!strcmp(name, "avx512")) {
#ifdef KERN_HAVE_AVX512
        const char *missing = avx512_missing();
        if (missing)
            return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                                  "--kernels avx512: this CPU cannot run it (no %s; it has: %s)",
                                  missing, kern_cpu_features());
        /* the zmm tiles, as auto takes them where it takes zmm ones */
        *out = kern_cpu_cvtph_free() ? &kern_avx512_cvt_ops : &kern_avx512_ops;
        return 0;
#else
        (void)avx512_missing;
        return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                              "--kernels avx512: not built into this kvserve (the compiler "
                              "lacked the AVX-512 flags, or not an x86-64 build)");
#endif
    }
    return status_set_err(err, err_len, KVS_EINVAL, "--kernels '%s': unknown (" KERN_ISA_NAMES ")",
                          name);
}
