/* kvs-bench-qmatmul: one kernel table's product over quantized panels, timed alone on one
 * thread in CPU time (CLOCK_THREAD_CPUTIME_ID), so that a shared, loaded machine disturbs it far
 * less than a whole decode step's wall time.
 *   kvs-bench-qmatmul TYPE N_OUT N_IN [ROWS] [MATS] [REPS] [ISA] [ACT]
 * TYPE a ggml type name with quantized panels (Q4_0, Q4_K, Q6_K, ...), or F16 / F32 (their
 * panels; n_out a multiple of 16, ACT f32; twice gweights_per_s is the GFLOP/s); ROWS rows of x (1:
 * one client decoding); MATS matrices of random valid blocks multiplied in turn (8 of 5632 x 2048
 * exceed a 32 MiB L3, so the panels stream from memory; 1 small matrix stays in the caches: the
 * kernel's own speed); the best and the mean of REPS passes (the first one not counted); ISA
 * avx2 (default where the CPU has it), avx512 or generic; ACT f32 (default: the exact panels;
 * for F16 / F32 x laid out by the table's pack_x inside the timed pass, where the engine would) or
 * q8 (the integer path: the weights laid out as the engine does, the file's rows or, for Q4_K
 * with a table's own kernels, kern/qdot_pack.c's interleaved groups; x quantized per row inside
 * the timed pass by the table's qx_quantize, as the engine does once per product; Q8_0, Q4_0 ..
 * Q5_1, Q2_K .. Q6_K) or q8rows (the file's rows whatever the type). KVS_BENCH_INNER=N (default 1)
 * repeats each integer product N times on the same quantized x inside the timed pass, the figures
 * per product: a small matrix in the caches then times the kernel alone, not the quantization and
 * the two clock reads around each pass (one Zen 5 core: 2.5 us a pass, a quarter of a 256 x 2048
 * Q4_K product at one row). Prints one CSV line:
 *   type,n_out,n_in,rows,mats,isa,act,cpu_ms_min,cpu_ms_mean,wall_ms_min,gweights_per_s,gb_per_s
 * (per matrix; the rates from the best CPU time). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/dtype.h"
#include "engine/kern/kern.h"
#include "tools/quant_rows.h"

static double now_s(clockid_t clock)
{
    struct timespec t;
    clock_gettime(clock, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static uint32_t g_rng = 12345;

/* Rows of random valid blocks (tools/quant_rows.h, as tests/test_kernels.c draws them), packed
 * into panels (or, q8, kept as rows). */
static void *make_panels(uint32_t id, size_t n_out, size_t n_in, kern_mat *pm, bool q8, bool x8)
{
    uint8_t *data = id <= 1 ? malloc(n_out * n_in * (id ? 2 : 4))
                            : quant_rows_random(id, n_out, n_in, &g_rng, NULL);
    if (!data)
        return NULL;
    kern_mat m;
    if (id <= 1) { /* F32 / F16: values in [-1, 1) */
        for (size_t i = 0; i < n_out * n_in; i++) {
            g_rng = g_rng * 1664525u + 1013904223u;
            float v = (float)(g_rng >> 8) / (float)(1u << 23) - 1.0f;
            uint16_t h = dtype_f32_to_f16(v);
            memcpy(data + i * (id ? 2 : 4), id ? (const void *)&h : (const void *)&v, id ? 2 : 4);
        }
        kern_mat_init(&m, id ? KERN_F16 : KERN_F32, data, n_out, n_in);
    } else if (id == 8)
        kern_mat_init(&m, KERN_Q8_0, data, n_out, n_in);
    else
        kern_mat_init_quant(&m, KERN_QUANT, id, data, n_out, n_in);
    if (q8 && x8 && kern_qdot_x8_bytes(&m)) { /* as engine/model.c lays them out */
        void *xd = aligned_alloc(64, (kern_qdot_x8_bytes(&m) + 63) / 64 * 64);
        if (xd)
            kern_qdot_to_x8(&m, xd, pm);
        free(data);
        return xd;
    }
    if (q8) {
        *pm = m;
        return data;
    }
    size_t bytes = (kern_panel_bytes(&m) + 63) / 64 * 64;
    void *pd = aligned_alloc(64, bytes);
    if (pd)
        kern_mat_to_panels(&m, pd, pm);
    free(data);
    return pd;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: kvs-bench-qmatmul TYPE N_OUT N_IN [ROWS] [MATS] [REPS] [ISA]\n");
        return 2;
    }
    uint32_t id = 0;
    while (id < 64 && !(dtype_get(id) && !strcmp(dtype_name(id), argv[1])))
        id++;
    size_t n_out = strtoul(argv[2], NULL, 10), n_in = strtoul(argv[3], NULL, 10);
    size_t rows = argc > 4 ? strtoul(argv[4], NULL, 10) : 1;
    int mats = argc > 5 ? atoi(argv[5]) : 8, reps = argc > 6 ? atoi(argv[6]) : 20;
    const char *isa = argc > 7 ? argv[7] : NULL;
    bool rows_only = argc > 8 && !strcmp(argv[8], "q8rows");
    bool q8 = argc > 8 && (!strcmp(argv[8], "q8") || rows_only);
    if (argc > 8 && !q8 && strcmp(argv[8], "f32")) {
        fprintf(stderr, "kvs-bench-qmatmul: ACT is f32, q8 or q8rows\n");
        return 2;
    }
    if (id <= 1 && !q8 && n_out % 16 == 0 && rows && mats >= 1 && mats <= 64 && reps >= 2) {
        /* F32 / F16: the panels every float product takes */
    } else if (id == 8 && q8) {
        /* Q8_0 rows: the integer path only (its panels are not kern/quant.h's) */
    } else if (id == 64 || !kern_quant_block(id) || n_in % kern_quant_block(id) || !n_out ||
               !rows || mats < 1 || mats > 64 || reps < 2) {
        fprintf(stderr, "kvs-bench-qmatmul: a type with quantized panels, n_in a multiple of "
                        "its block, 1..64 matrices, 2 or more passes\n");
        return 2;
    }
    const kern_ops *k = &kern_ref_ops;
#ifdef KERN_HAVE_AVX2
    if (!isa || !strcmp(isa, "avx2"))
        k = &kern_avx2_ops;
#endif
#ifdef KERN_HAVE_AVX512
    char err[256];
    if (isa && !strcmp(isa, "avx512") && kern_select("avx512", &k, err, sizeof err)) {
        fprintf(stderr, "kvs-bench-qmatmul: %s\n", err); /* the zmm table --kernels takes */
        return 2;
    }
#endif
    if (isa && strcmp(isa, k->name)) {
        fprintf(stderr, "kvs-bench-qmatmul: no kernel table %s here\n", isa);
        return 2;
    }
    kern_mat pm[64];
    void *pd[64];
    for (int i = 0; i < mats; i++)
        if (!(pd[i] = make_panels(id, n_out, n_in, &pm[i], q8, !rows_only && k->qmatmul))) {
            fprintf(stderr, "kvs-bench-qmatmul: out of memory\n");
            return 1;
        }
    kern_qx fmt = kern_qdot_act(&pm[0]);
    if (q8 && fmt == KERN_QX_NONE) {
        fprintf(stderr, "kvs-bench-qmatmul: %s has no integer kernel\n", argv[1]);
        return 2;
    }
    float *x = malloc(rows * n_in * sizeof(float)), *out = malloc(rows * n_out * sizeof(float));
    void *xq = malloc(rows * (n_in / 32 + 1) * 40);
    float *xp = k->pack_x ? malloc(rows * n_in * sizeof(float)) : NULL;
    /* the engine's per-thread scratch, in which panels several row tiles read are widened once */
    float *scratch = malloc(KERN_PANEL * n_in * sizeof(float));
    if (!x || !out || !xq || (k->pack_x && !xp) || !scratch)
        return 1;
    for (size_t i = 0; i < rows * n_in; i++)
        x[i] = (float)(i % 7) * 0.1f - 0.3f;
    const char *in_env = getenv("KVS_BENCH_INNER");
    int inner = in_env ? atoi(in_env) : 1;
    if (inner < 1 || inner > 100000 || (inner > 1 && !q8)) {
        fprintf(stderr, "kvs-bench-qmatmul: KVS_BENCH_INNER is 1 .. 100000, and more than 1 "
                        "only for the integer path (ACT q8 or q8rows)\n");
        return 2;
    }
    double best = INFINITY, wbest = INFINITY, sum = 0, check = 0;
    for (int r = 0; r < reps; r++) {
        double c0 = now_s(CLOCK_THREAD_CPUTIME_ID), w0 = now_s(CLOCK_MONOTONIC);
        for (int i = 0; i < mats; i++) {
            if (!q8) { /* x packed where the engine packs it, here once per product (the
                          engine: once per step's input, for Q, K and V together) */
                bool px = xp && rows >= k->pack_min_rows &&
                          (pm[i].type == KERN_F16_PANEL || pm[i].type == KERN_F32_PANEL);
                if (px)
                    k->pack_x(x, rows, n_in, n_in, 0, n_in, xp);
                k->matmul(&pm[i], x, rows, n_in, px ? xp : NULL, out, n_out, 0, n_out, scratch);
                continue;
            }
            (k->qx_quantize ? k->qx_quantize : kern_qx_quantize)(fmt, x, rows, n_in, n_in, xq);
            for (int n = 0; n < inner; n++)
                if (k->qmatmul)
                    k->qmatmul(&pm[i], xq, rows, out, n_out, 0, n_out);
                else
                    kern_qmatmul_ref(&pm[i], xq, rows, out, n_out, 0, n_out);
        }
        double c = (now_s(CLOCK_THREAD_CPUTIME_ID) - c0) / mats / inner;
        double w = (now_s(CLOCK_MONOTONIC) - w0) / mats / inner;
        check += out[0];
        if (r == 0)
            continue;
        best = c < best ? c : best;
        wbest = w < wbest ? w : wbest;
        sum += c;
    }
    double weights = (double)n_out * (double)n_in * (double)rows;
    double bytes = (double)n_out * (double)dtype_nbytes(id, n_in);
    printf("type,n_out,n_in,rows,mats,isa,act,cpu_ms_min,cpu_ms_mean,wall_ms_min,gweights_per_s,"
           "gb_per_s\n");
    printf("%s,%zu,%zu,%zu,%d,%s,%s,%.4f,%.4f,%.4f,%.2f,%.2f\n", argv[1], n_out, n_in, rows, mats,
           k->name, q8 ? "q8" : "f32", best * 1e3, sum / (reps - 1) * 1e3, wbest * 1e3,
           weights / best / 1e9, bytes / best / 1e9);
    fprintf(stderr, "(checksum %g)\n", check);
    for (int i = 0; i < mats; i++)
        free(pd[i]);
    free(x);
    free(xq);
    free(xp);
    free(scratch);
    free(out);
    return 0;
}
