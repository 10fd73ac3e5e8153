/* Choosing the kernel table: what this kvserve was built with, what the CPU and OS run, and the
 * --kernels override. CPUID is read at each call (cheap; the engine asks once per model load). */
#include "engine/kern/kern.h"

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

static bool cpu_has_avx512(void)
{
#ifdef KERN_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
#else
    return false;
#endif
}

const char *kern_cpu_features(void)
{
#ifdef KERN_X86
    __builtin_cpu_init();
    static const char *const names[] = {"avx2", "fma", "f16c", "avx512f"};
    bool has[4] = {__builtin_cpu_supports("avx2"), __builtin_cpu_supports("fma"), cpu_f16c(),
                   __builtin_cpu_supports("avx512f")};
    static _Thread_local char line[128];
    size_t n = 0;
    line[0] = '\0';
    for (int i = 0; i < 4; i++) /* "avx2 fma f16c", then "; no avx512f" */
        if (has[i])
            n += (size_t)snprintf(line + n, sizeof line - n, "%s%s", n ? " " : "", names[i]);
    bool first_missing = true;
    for (int i = 0; i < 4; i++)
        if (!has[i]) {
            n += (size_t)snprintf(line + n, sizeof line - n, "%s%s",
                                  first_missing ? (n ? "; no " : "no ") : " ", names[i]);
            first_missing = false;
        }
    if (!os_saves_ymm())
        snprintf(line + n, sizeof line - n, "; the OS does not save YMM state");
    return line;
#else
    return "not an x86 CPU";
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
    (void)cpu_has_avx512;
    return -1;
}

int kern_select(const char *name, const kern_ops **out, char *err, size_t err_len)
{
    *out = NULL;
    if (!name || !*name || !strcmp(name, "auto")) {
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
    if (!strcmp(name, "avx512"))
        return status_set_err(
            err, err_len, KVS_EUNSUPPORTED,
            "--kernels avx512: reserved, not built into this kvserve yet (this CPU "
            "%s AVX-512F); use auto, avx2 or generic",
            cpu_has_avx512() ? "has" : "lacks");
    return status_set_err(err, err_len, KVS_EINVAL, "--kernels '%s': unknown (auto|avx2|generic)",
                          name);
}
