/* kvs-bench-machine: the limits the engine is chasing, measured on this machine, now.
 *   kvs-bench-machine read-bw THREADS [MiB]   memory read bandwidth (GB/s): THREADS threads
 *                                            each sum their share of a buffer far larger than
 *                                            the caches (default 1024 MiB), best of 5 passes
 *                                            of an SSE2 and 5 of an AVX2 loop (where the CPU
 *                                            has it), alternating; the line names the loop
 *   kvs-bench-machine fma THREADS             the FMA peak (GFLOP/s) of each instruction set the
 *                                            CPU has (AVX2+FMA, AVX-512F): independent FMA
 *                                            chains on registers, no memory traffic
 * Prints one CSV line per figure: what,isa,threads,value. Built for generic x86-64; the
 * kernels carry their own target attributes and run only where CPUID says they can. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <immintrin.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

typedef struct job {
    const uint64_t *p;
    size_t n;
    int isa; /* 0 read: scalar/SSE2, 1 fma AVX2, 2 fma AVX-512 */
    long iters;
    uint64_t sink;
    double flops;
    pthread_barrier_t *bar;
} job;

/* Eight independent accumulators: enough loads in flight to saturate the memory system
 * (the compiler vectorises this with SSE2 at -O3 on any x86-64). */
static uint64_t read_sum(const uint64_t *p, size_t n)
{
    uint64_t a[8] = {0};
    for (size_t i = 0; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            a[k] += p[i + k];
    return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

/* The same with 32-byte loads, four 4-lane accumulators: on Zen 5 the SSE2 loop above left a
 * third of the bandwidth unread (38.6 GB/s where a decode step streamed its weights at 51). */
__attribute__((target("avx2"))) static uint64_t read_sum_avx2(const uint64_t *p, size_t n)
{
    __m256i a[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                    _mm256_setzero_si256()};
    for (size_t i = 0; i + 16 <= n; i += 16) {
        _mm_prefetch((const char *)(p + i) + 4096, _MM_HINT_T0);
        _mm_prefetch((const char *)(p + i) + 4096 + 64, _MM_HINT_T0);
        for (int k = 0; k < 4; k++)
            a[k] = _mm256_add_epi64(a[k], _mm256_loadu_si256((const __m256i *)(p + i + 4 * k)));
    }
    uint64_t l[4], s = 0;
    for (int k = 0; k < 4; k++) {
        _mm256_storeu_si256((__m256i *)l, a[k]);
        s += l[0] + l[1] + l[2] + l[3];
    }
    return s;
}

static void *read_main(void *arg)
{
    job *j = arg;
    pthread_barrier_wait(j->bar);
    j->sink = j->isa ? read_sum_avx2(j->p, j->n) : read_sum(j->p, j->n);
    pthread_barrier_wait(j->bar);
    return NULL;
}

/* 12 chains of 8-wide FMAs: more than the FMA latency x throughput of any current core. */
__attribute__((target("avx2,fma"))) static double fma_avx2(long iters)
{
    __m256 a[12], b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.001f);
    for (int k = 0; k < 12; k++)
        a[k] = _mm256_set1_ps((float)k);
    for (long i = 0; i < iters; i++)
        for (int k = 0; k < 12; k++)
            a[k] = _mm256_fmadd_ps(a[k], b, c);
    float out[8], s = 0;
    for (int k = 0; k < 12; k++) {
        _mm256_storeu_ps(out, a[k]);
        s += out[0];
    }
    __asm__ volatile("" ::"x"(s));
    return 12.0 * 8 * 2 * (double)iters;
}

__attribute__((target("avx512f"))) static double fma_avx512(long iters)
{
    __m512 a[16], b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(0.001f);
    for (int k = 0; k < 16; k++)
        a[k] = _mm512_set1_ps((float)k);
    for (long i = 0; i < iters; i++)
        for (int k = 0; k < 16; k++)
            a[k] = _mm512_fmadd_ps(a[k], b, c);
    float s = 0;
    for (int k = 0; k < 16; k++)
        s += _mm512_reduce_add_ps(a[k]);
    __asm__ volatile("" ::"x"(s));
    return 16.0 * 16 * 2 * (double)iters;
}

static void *fma_main(void *arg)
{
    job *j = arg;
    pthread_barrier_wait(j->bar);
    j->flops = j->isa == 2 ? fma_avx512(j->iters) : fma_avx2(j->iters);
    pthread_barrier_wait(j->bar);
    return NULL;
}

/* Runs THREADS copies of fn between two barriers; returns the seconds between them. */
static double run_threads(int threads, job *jobs, void *(*fn)(void *))
{
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)threads + 1);
    pthread_t *t = calloc((size_t)threads, sizeof *t);
    for (int i = 0; i < threads; i++) {
        jobs[i].bar = &bar;
        pthread_create(&t[i], NULL, fn, &jobs[i]);
    }
    pthread_barrier_wait(&bar);
    double t0 = now_s();
    pthread_barrier_wait(&bar);
    double dt = now_s() - t0;
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&bar);
    free(t);
    return dt;
}

static int read_bw(int threads, size_t mib)
{
    size_t n = mib * 1024 * 1024 / sizeof(uint64_t);
    uint64_t *buf = malloc(n * sizeof *buf);
    if (!buf)
        return 1;
    for (size_t i = 0; i < n; i++)
        buf[i] = i; /* fault every page in before timing */
    job *jobs = calloc((size_t)threads, sizeof *jobs);
    size_t per = n / (size_t)threads;
    double best = 0;
    int best_isa = 0, isas = __builtin_cpu_supports("avx2") ? 2 : 1;
    uint64_t sink = 0;
    for (int pass = 0; pass < 5 * isas; pass++) { /* the loops alternate: the best of either */
        for (int i = 0; i < threads; i++) {
            jobs[i].p = buf + (size_t)i * per;
            jobs[i].n = per;
            jobs[i].isa = pass % isas;
        }
        double dt = run_threads(threads, jobs, read_main);
        double gbs = (double)per * threads * sizeof(uint64_t) / dt / 1e9;
        if (gbs > best) {
            best = gbs;
            best_isa = pass % isas;
        }
        for (int i = 0; i < threads; i++)
            sink += jobs[i].sink;
    }
    printf("read_bw_gbs,%s,%d,%.2f\n", best_isa ? "avx2" : "scalar", threads, best);
    fprintf(stderr, "(checksum %llu)\n", (unsigned long long)sink);
    free(jobs);
    free(buf);
    return 0;
}

static int fma_peak(int threads)
{
    __builtin_cpu_init();
    int isas[2], n_isa = 0;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        isas[n_isa++] = 1;
    if (__builtin_cpu_supports("avx512f"))
        isas[n_isa++] = 2;
    job *jobs = calloc((size_t)threads, sizeof *jobs);
    for (int k = 0; k < n_isa; k++) {
        double best = 0;
        for (int pass = 0; pass < 3; pass++) {
            for (int i = 0; i < threads; i++) {
                jobs[i].isa = isas[k];
                jobs[i].iters = 20 * 1000 * 1000;
            }
            double dt = run_threads(threads, jobs, fma_main);
            double f = 0;
            for (int i = 0; i < threads; i++)
                f += jobs[i].flops;
            if (f / dt / 1e9 > best)
                best = f / dt / 1e9;
        }
        printf("fma_peak_gflops,%s,%d,%.1f\n", isas[k] == 2 ? "avx512" : "avx2", threads, best);
    }
    free(jobs);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[1], "read-bw"))
        return read_bw(atoi(argv[2]) > 0 ? atoi(argv[2]) : 1,
                       argc > 3 ? (size_t)atol(argv[3]) : 1024);
    if (argc >= 3 && !strcmp(argv[1], "fma"))
        return fma_peak(atoi(argv[2]) > 0 ? atoi(argv[2]) : 1);
    fprintf(stderr, "usage: kvs-bench-machine read-bw THREADS [MiB] | fma THREADS\n");
    return 2;
}
