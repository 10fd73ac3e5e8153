/* The software prefetch of the x86 integer kernels' weight streams (kern/qdot_x8_avx2.c,
 * kern/qdot_x8_avx512.c, kern/qdot_rows8.h, kern/qdot_tiles16.h). Header-only, SSE: every
 * x86-64 has it, whatever the file's target flags. Not a public header.
 *
 * Into L2, not L1 (_MM_HINT_T1), 8 KiB ahead (the likely reason, on Zen 4: a prefetch into L1
 * holds one of L1's few miss buffers for a whole DRAM access, which demand loads queue behind;
 * the L1 prefetcher follows a stream that L2 holds). One Zen 4
 * core streaming 64 matrices of 2048 x 2048 (kvs-bench-qmatmul TYPE 2048 2048 ROWS 64 N avx512
 * q8, pinned, medians of three interleaved runs), from T0 one to four blocks ahead to this, in
 * Gweights/s at one row: Q6_K 16.2 -> 31.0, IQ4_XS 19.4 -> 35.3, Q4_0 35.8 -> 46.1, Q8_0 17.1 ->
 * 21.4, Q4_K 40.0 -> 42.2, Q5_K 27.3 -> 28.5; at 16 rows Q6_K 72 -> 90, IQ4_XS 81 -> 101, the
 * others unchanged. 4 and 16 KiB ahead were no better than 8. The F16 / F32 panels (kern/avx2.c,
 * kern/avx512.c) keep T0: T1 measured the same there. */
#ifndef KVS_ENGINE_KERN_PREFETCH_H
#define KVS_ENGINE_KERN_PREFETCH_H

#include <stddef.h>
#include <xmmintrin.h>

/* bytes ahead of the one-stream kernels' read position */
#define KERN_PF_AHEAD 8192

/* bytes at p into L2 (past a matrix's end a prefetch is only a hint, which never faults) */
static inline __attribute__((always_inline)) void kern_prefetch_l2(const void *p, size_t bytes)
{
    for (size_t o = 0; o < bytes; o += 64)
        _mm_prefetch((const char *)p + o, _MM_HINT_T1);
}

#endif
