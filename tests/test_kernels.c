/* Engine kernels and thread pool. The portable table (kern/ref.c) is the oracle: it agrees with
 * a naive double-precision product over widened weights (only rounding differs), and every other
 * table this CPU can run (and the AVX-512 one emulated over simde, on any CPU) gives its bits
 * exactly, for every weight type, batch size 1..70, odd
 * width and column range; every panel product is batch-invariant (a row alone has the bits it
 * has inside a batch); the choice of table obeys --kernels; the pool runs every thread exactly
 * once per job. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/status.h"
#include "engine/dtype.h"
#include "engine/kern/kern.h"
#include "engine/kern/kexp.h"
#include "engine/kern/qdot.h"
#include "engine/threadpool.h"
#include "tools/quant_rows.h"

static uint32_t g_rng = 12345;
static float frand(void)
{
    g_rng = g_rng * 1664525u + 1013904223u;
    return (float)(g_rng >> 8) / (float)(1u << 24) * 2.0f - 1.0f;
}

/* The tables this CPU runs, the reference first; the emulated AVX-512 one (where simde was there
 * to build it) last, so test_select's "auto is the best this CPU runs" still reads the native
 * ones. */
static const kern_ops *g_isas[7];
static int g_n_native;
static int g_n_isas;

static int setup(void **state)
{
    (void)state;
    g_isas[g_n_isas++] = &kern_ref_ops;
#ifdef KERN_HAVE_AVX2
    if (kern_cpu_can("avx2") == 1)
        g_isas[g_n_isas++] = &kern_avx2_ops;
    else
        fprintf(stderr, "kernels: this CPU cannot run avx2 (%s): only the reference tested\n",
                kern_cpu_features());
#endif
#ifdef KERN_HAVE_AVX512
    if (kern_cpu_can("avx512") == 1) {
        /* The three AVX-512 tables run on any AVX-512 CPU (they differ in speed only): all
         * tested, the one auto picks here last of the native ones (test_select). */
        const kern_ops *pick = kern_cpu_avx512_halves() ? &kern_avx512_halves_ops
                               : kern_cpu_cvtph_free()  ? &kern_avx512_cvt_ops
                                                        : &kern_avx512_ops;
        const kern_ops *all[] = {&kern_avx512_ops, &kern_avx512_cvt_ops, &kern_avx512_halves_ops};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            if (all[i] != pick)
                g_isas[g_n_isas++] = all[i];
        g_isas[g_n_isas++] = pick;
    } else
        fprintf(stderr, "kernels: this CPU cannot run avx512 (%s): its emulation tested instead\n",
                kern_cpu_features());
#endif
    g_n_native = g_n_isas;
#ifdef KERN_HAVE_AVX512_EMU
    g_isas[g_n_isas++] = &kern_avx512_emu_ops;
#else
    fprintf(stderr, "kernels: no libsimde-dev at build time: avx512-emulated not tested\n");
#endif
    return 0;
}

/* Random rows of the type with their exact widened values in wide. */
static void *make_rows(kern_type type, size_t n_out, size_t n_in, float *wide)
{
    kern_mat tmp;
    kern_mat_init(&tmp, type, NULL, n_out, n_in);
    uint8_t *data = malloc(n_out * tmp.row_bytes);
    for (size_t r = 0; r < n_out; r++) {
        uint8_t *row = data + r * tmp.row_bytes;
        for (size_t k = 0; k < n_in && type != KERN_Q8_0; k++) {
            float v = frand();
            if (type == KERN_F32) {
                memcpy(row + 4 * k, &v, 4);
                wide[r * n_in + k] = v;
            } else {
                uint16_t h = dtype_f32_to_f16(v);
                memcpy(row + 2 * k, &h, 2);
                wide[r * n_in + k] = dtype_f16_to_f32(h);
            }
        }
        if (type == KERN_Q8_0)
            for (size_t b = 0; b < n_in / KERN_QK8_0; b++) {
                uint8_t *blk = row + b * (2 + KERN_QK8_0);
                uint16_t h = dtype_f32_to_f16(0.01f + 0.02f * fabsf(frand()));
                memcpy(blk, &h, 2);
                float d = dtype_f16_to_f32(h);
                for (int i = 0; i < KERN_QK8_0; i++) {
                    int8_t q = (int8_t)(frand() * 127.0f);
                    blk[2 + i] = (uint8_t)q;
                    wide[r * n_in + b * KERN_QK8_0 + (size_t)i] = d * (float)q;
                }
            }
    }
    return data;
}

/* out of the reference near the naive double product of x and the widened weights. */
static void expect_near_naive(const float *out, const float *x, const float *wide, size_t T,
                              size_t n_out, size_t n_in)
{
    for (size_t t = 0; t < T; t++)
        for (size_t n = 0; n < n_out; n++) {
            double ref = 0, mag = 0;
            for (size_t k = 0; k < n_in; k++) {
                ref += (double)x[t * n_in + k] * wide[n * n_in + k];
                mag += fabs((double)x[t * n_in + k] * wide[n * n_in + k]);
            }
            assert_true(fabs(out[t * n_out + n] - ref) <= 1e-5 * mag + 1e-6);
        }
}

/* Every table against the reference on one panel matrix, batch sizes 1..69 and 200 (two passes
 * of the panel loop, kern/panel_loop.h's PANEL_TC). bscale: NULL, or a factor for each 32 inputs
 * of x (mx_extreme's). */
static void check_panels(const kern_mat *m, const float *wide, const float *bscale)
{
    size_t n_out = m->n_out, n_in = m->n_in, T_max = 200;
    float *x = malloc(T_max * n_in * sizeof(float));
    for (size_t i = 0; i < T_max * n_in; i++)
        x[i] = frand() * (bscale ? bscale[i % n_in / 32] : 1.0f);
    float *want = malloc(T_max * n_out * sizeof(float)), *got = malloc(T_max * n_out * 4);
    float *scratch = malloc(KERN_PANEL * n_in * sizeof(float));
    float *xp = malloc(T_max * n_in * sizeof(float));
    for (size_t T = 1; T <= T_max; T += T < 20 ? 1 : T < 69 ? 7 : 131) {
        kern_ref_ops.matmul(m, x, T, n_in, NULL, want, n_out, 0, n_out, NULL);
        expect_near_naive(want, x, wide, T, n_out, n_in);
        for (int i = 0; i < g_n_isas; i++) {
            const kern_ops *k = g_isas[i];
            /* in two column ranges, the second starting off the panel grid */
            memset(got, 0xff, T * n_out * sizeof(float));
            k->matmul(m, x, T, n_in, NULL, got, n_out, 0, 5, NULL);
            k->matmul(m, x, T, n_in, NULL, got, n_out, 5, n_out, NULL);
            if (memcmp(want, got, T * n_out * sizeof(float)))
                fail_msg("%s matmul differs from the reference (T %zu, %zu x %zu, type %d)",
                         k->name, T, n_out, n_in, (int)m->type);
            /* with a scratch (Q8_0 panels widened once for several row tiles): the same bits */
            k->matmul(m, x, T, n_in, NULL, got, n_out, 0, n_out, scratch);
            assert_memory_equal(want, got, T * n_out * sizeof(float));
            /* from x packed for the table's row tiles: the same bits, also in column ranges */
            if (k->pack_x) {
                memset(xp, 0xff, T * n_in * sizeof(float));
                k->pack_x(x, T, n_in, n_in, 0, n_in / 3, xp); /* in two ranges, as threads */
                k->pack_x(x, T, n_in, n_in, n_in / 3, n_in, xp);
                for (int split = 0; split < 2; split++) { /* the pair tiles need whole panels */
                    memset(got, 0xff, T * n_out * sizeof(float));
                    k->matmul(m, x, T, n_in, xp, got, n_out, 0, split ? 5 : n_out,
                              split ? NULL : scratch);
                    if (split)
                        k->matmul(m, x, T, n_in, xp, got, n_out, 5, n_out, scratch);
                    if (memcmp(want, got, T * n_out * sizeof(float)))
                        fail_msg("%s matmul from packed x differs from the reference (T %zu, %zu "
                                 "x %zu, type %d)",
                                 k->name, T, n_out, n_in, (int)m->type);
                }
            }
            /* batch-invariant: each row alone gives the bits it had in the batch */
            for (size_t t = 0; t<T; t += T> 8 ? 5 : 1) {
                k->matmul(m, x + t * n_in, 1, n_in, NULL, got, n_out, 0, n_out, NULL);
                assert_memory_equal(want + t * n_out, got, n_out * sizeof(float));
            }
        }
    }
    free(scratch);
    free(xp);
    free(want);
    free(got);
    free(x);
}

/* Rows of the type with 37 outputs (two whole panels and a padded one), packed; every table's
 * products and the row gather. */
static void check_type(kern_type type, size_t n_in)
{
    size_t n_out = 37;
    float *wide = malloc(n_out * n_in * sizeof(float));
    void *data = make_rows(type, n_out, n_in, wide);
    kern_mat m;
    kern_mat_init(&m, type, data, n_out, n_in);
    size_t bytes = kern_panel_bytes(&m);
    assert_int_equal(bytes, 48 * m.row_bytes);
    void *pdata = malloc(bytes);
    kern_mat pm;
    kern_mat_to_panels(&m, pdata, &pm);
    assert_int_equal(pm.type, type == KERN_F32   ? KERN_F32_PANEL
                              : type == KERN_F16 ? KERN_F16_PANEL
                                                 : KERN_Q8_0_PANEL);
    assert_int_equal(kern_panel_bytes(&pm), 0);
    check_panels(&pm, wide, NULL);
    float *rows = malloc(n_out * n_in * sizeof(float));
    kern_rows_to_f32(&pm, 3, n_out - 3, rows);
    assert_memory_equal(rows, wide + 3 * n_in, (n_out - 3) * n_in * sizeof(float));
    kern_rows_to_f32(&m, 3, n_out - 3, rows); /* the file's rows (an embedding read in place) */
    assert_memory_equal(rows, wide + 3 * n_in, (n_out - 3) * n_in * sizeof(float));
    free(rows);
    free(pdata);
    free(data);
    free(wide);
}

static void test_f32(void **state)
{
    (void)state;
    check_type(KERN_F32, 172);
    check_type(KERN_F32, 5);
    check_type(KERN_F32, 64);
    check_type(KERN_F32, 300);
}

static void test_f16(void **state)
{
    (void)state;
    check_type(KERN_F16, 172);
    check_type(KERN_F16, 3);
    check_type(KERN_F16, 768);
    check_type(KERN_F16, 517);
}

static void test_q8_0(void **state)
{
    (void)state;
    check_type(KERN_Q8_0, 32);
    check_type(KERN_Q8_0, 160);
    check_type(KERN_Q8_0, 544);
}

/* Rows of ggml quantized type id (tools/quant_rows.h: random valid blocks with finite values,
 * drawn from g_rng); their exact widened values, engine/dtype's to_f32 (held to gguf-py by the
 * dtype and dequant suites), in wide. */
static void *make_quant_rows(uint32_t id, size_t n_out, size_t n_in, float *wide)
{
    uint8_t *data = quant_rows_random(id, n_out, n_in, &g_rng, wide);
    assert_non_null(data);
    return data;
}

/* MXFP4's exponents at their extremes (tools/quant_rows.h draws them in an f16 scale's range):
 * row n's block b gets e = MX_BASE[b % 9] + n % 5 - 2, clamped to 0 .. 255, so that the rows
 * have the subnormal scales of e = 0, 1, the smallest normal one (e = 2) and e = 251 .. 255 among
 * ordinary ones; where e > 250 the nibbles are cut to levels 0 and +-1 so that no weight
 * overflows. Each 32 inputs of x are to be scaled by bscale[b], 2^(128 - MX_BASE[b % 9]) kept
 * within 2^-118 .. 2^122 (check_qdot's outliers are 8 times larger), so that every product stays
 * near 1 on every path. */
static const int MX_BASE[9] = {1, 254, 127, 3, 252, 130, 60, 200, 110};

static void mx_extreme(uint8_t *data, float *wide, size_t n_out, size_t n_in, float *bscale)
{
    const dtype_info *dt = dtype_get(KERN_GGML_MXFP4);
    size_t nb = n_in / 32;
    for (size_t n = 0; n < n_out; n++)
        for (size_t b = 0; b < nb; b++) {
            uint8_t *blk = data + (n * nb + b) * 17;
            int e = MX_BASE[b % 9] + (int)(n % 5) - 2;
            e = e < 0 ? 0 : e > 255 ? 255 : e;
            blk[0] = (uint8_t)e;
            for (int j = 1; j < 17 && e > 250; j++)
                blk[j] &= 0x99;
            dt->to_f32(blk, wide + n * n_in + 32 * b, 32);
        }
    for (size_t b = 0; b < nb; b++) {
        int s = 128 - MX_BASE[b % 9];
        bscale[b] = ldexpf(1.0f, s < -118 ? -118 : s > 122 ? 122 : s);
    }
}

/* A quantized type: packed panels widen back to to_f32's bits (rows and the embedding gather),
 * every table's products equal the reference's, batch-invariant. 37 rows: two whole panels and
 * a padded one. extreme: MXFP4's rows made mx_extreme's. */
static void check_quant_ex(uint32_t id, size_t n_in, bool extreme)
{
    size_t n_out = 37;
    assert_int_equal(kern_quant_block(id), dtype_get(id)->block);
    float *wide = malloc(n_out * n_in * sizeof(float)), *bscale = NULL;
    void *data = make_quant_rows(id, n_out, n_in, wide);
    if (extreme) {
        bscale = malloc(n_in / 32 * sizeof(float));
        mx_extreme(data, wide, n_out, n_in, bscale);
    }
    kern_mat m;
    kern_mat_init_quant(&m, KERN_QUANT, id, data, n_out, n_in);
    assert_int_equal(m.row_bytes, dtype_nbytes(id, n_in));
    size_t bytes = kern_panel_bytes(&m);
    /* compact: at most 16 bytes a row per super-block more than the file (Q2_K's scales) */
    assert_true(bytes <= 48 * (m.row_bytes + n_in / kern_quant_block(id) * 16));
    void *pdata = malloc(bytes);
    kern_mat pm;
    kern_mat_to_panels(&m, pdata, &pm);
    assert_int_equal(pm.type, KERN_QUANT_PANEL);
    assert_int_equal(pm.qtype, id);
    assert_int_equal(kern_panel_bytes(&pm), 0);
    float *rows = malloc(n_out * n_in * sizeof(float));
    kern_rows_to_f32(&pm, 0, n_out, rows);
    if (memcmp(rows, wide, n_out * n_in * sizeof(float)))
        fail_msg("%s panel rows differ from to_f32 (n_in %zu)", dtype_name(id), n_in);
    kern_rows_to_f32(&pm, 5, 3, rows);
    assert_memory_equal(rows, wide + 5 * n_in, 3 * n_in * sizeof(float));
    kern_rows_to_f32(&m, 4, 5, rows); /* the file's rows (an embedding read in place) */
    if (memcmp(rows, wide + 4 * n_in, 5 * n_in * sizeof(float)))
        fail_msg("%s file rows differ from to_f32 (n_in %zu)", dtype_name(id), n_in);
    check_panels(&pm, wide, bscale);
    free(rows);
    free(pdata);
    free(data);
    free(wide);
    free(bscale);
}

static void check_quant(uint32_t id, size_t n_in)
{
    check_quant_ex(id, n_in, false);
}

static void test_quant_legacy(void **state)
{
    (void)state;
    static const uint32_t ids[] = {2, 3, 6, 7, 20, 39}; /* Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL MXFP4 */
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        check_quant(ids[i], 32);
        check_quant(ids[i], 96);
        check_quant(ids[i], 288); /* a widened chunk of 256 inputs and a short one */
    }
    check_quant_ex(KERN_GGML_MXFP4, 32, true);
    check_quant_ex(KERN_GGML_MXFP4, 288, true);
}

static void test_quant_k(void **state)
{
    (void)state;
    static const uint32_t ids[] = {10, 11, 12, 13, 14, 23}; /* Q2_K .. Q6_K, IQ4_XS */
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        check_quant(ids[i], 256);
        check_quant(ids[i], 512);
    }
}

/* The integer path (kern/qdot_ref.c): each row's quantized activations are within half a step
 * of x; the reference product is the exact product of the widened weights (to_f32) with the
 * dequantized activations, up to float rounding; every table's qmatmul gives its bits for batches
 * 1..70 and an odd column range, and a row alone has the bits it has inside a batch. The shapes
 * reach every path of the AVX2 and AVX-512 kernels: 37 rows end in a part group after 8- and
 * 16-row ones, columns 3..35 start off a group boundary; batch 1 takes the one-row kernels, 33 and
 * 70 end in tiles of 1 and 6 after 32-row ones. */
/* The first n rows of m (KERN_Q8_0 or KERN_QUANT rows), as engine__mat_rows takes them. */
static void first_rows(const kern_mat *m, size_t n, kern_mat *out)
{
    if (m->type == KERN_QUANT)
        kern_mat_init_quant(out, KERN_QUANT, m->qtype, m->data, n, m->n_in);
    else
        kern_mat_init(out, m->type, m->data, n, m->n_in);
}

static void check_qdot_ex(uint32_t id, size_t n_in, bool extreme)
{
    /* Q4_K and Q4_0 also at 300 rows: the AMX tiles (kern/qdot_amx.c) take x 256 rows at a time */
    size_t n_out = 37, T = id == KERN_GGML_Q4_K || id == KERN_GGML_Q4_0 ? 300 : 70;
    float *wide = malloc(n_out * n_in * sizeof(float));
    void *data = make_quant_rows(id, n_out, n_in, wide);
    if (id == KERN_GGML_Q6_K) { /* every int8 scale in turn: the AMX tiles split them in digits */
        const dtype_info *dt = dtype_get(id);
        size_t nb = n_in / 256;
        for (size_t i = 0; i < n_out * nb; i++) {
            uint8_t *blk = (uint8_t *)data + i * dt->block_bytes;
            for (int j = 0; j < 16; j++)
                blk[192 + j] = (uint8_t)(16 * i + (size_t)j);
            dt->to_f32(blk, wide + i * 256, 256);
        }
    }
    kern_mat m;
    if (id == KERN_GGML_Q8_0)
        kern_mat_init(&m, KERN_Q8_0, data, n_out, n_in);
    else
        kern_mat_init_quant(&m, KERN_QUANT, id, data, n_out, n_in);
    kern_qx fmt = kern_qdot_act(&m);
    assert_int_not_equal(fmt, KERN_QX_NONE);
    size_t blk = fmt == KERN_QX_32 ? 32 : 256, xrb = kern_qx_row_bytes(fmt, n_in);
    assert_int_equal(xrb, n_in / blk * (fmt == KERN_QX_32 ? 38 : 292));
    float *x = malloc(T * n_in * sizeof(float)), *xd = malloc(T * n_in * sizeof(float));
    for (size_t i = 0; i < T * n_in; i++)
        x[i] = frand() * (i % 97 == 0 ? 8.0f : 1.0f); /* an outlier now and then */
    for (size_t k = 0; k < n_in; k++)
        x[3 * n_in + k] = 0.0f; /* a zero row: d = 0, q = 0 */
    float *bscale = NULL;
    if (extreme) { /* MXFP4's extreme scales (mx_extreme), x scaled to match */
        bscale = malloc(n_in / 32 * sizeof(float));
        mx_extreme(data, wide, n_out, n_in, bscale);
        for (size_t i = 0; i < T * n_in; i++)
            x[i] *= bscale[i % n_in / 32];
    }
    uint8_t *xq = malloc(T * xrb);
    kern_qx_quantize(fmt, x, T, n_in, n_in, xq);
    for (size_t t = 0; t < T; t++)
        for (size_t b = 0; b < n_in / blk; b++) {
            /* KERN_QX_32: the row's scales, then its sums, then its quants; KERN_QX_256: whole
             * blocks */
            size_t nb = n_in / 32;
            const uint8_t *bp = xq + t * xrb + b * 292, *xr = xq + t * xrb;
            float d;
            memcpy(&d, fmt == KERN_QX_32 ? xr + 4 * b : bp, 4);
            const int8_t *q = (const int8_t *)(fmt == KERN_QX_32 ? xr + 6 * nb + 32 * b : bp + 36);
            for (size_t k = 0; k < blk; k++) {
                size_t i = t * n_in + b * blk + k;
                xd[i] = d * (float)q[k];
                assert_true(q[k] >= -127 && fabsf(x[i] - xd[i]) <= 0.5f * d * 1.0001f);
            }
            if (fmt == KERN_QX_32) {
                int16_t bs;
                memcpy(&bs, xr + 4 * nb + 2 * b, 2);
                int sum = 0;
                for (int k = 0; k < 32; k++)
                    sum += q[k];
                assert_int_equal(bs, sum);
            }
            if (fmt == KERN_QX_256)
                for (int s = 0; s < 16; s++) {
                    int16_t bs;
                    memcpy(&bs, bp + 4 + 2 * s, 2);
                    int sum = 0;
                    for (int k = 0; k < 16; k++)
                        sum += q[16 * s + k];
                    assert_int_equal(bs, sum);
                }
        }
    float *ref = malloc(T * n_out * sizeof(float)), *got = malloc(T * n_out * sizeof(float));
    kern_qmatmul_ref(&m, xq, T, ref, n_out, 0, n_out);
    for (size_t t = 0; t < T; t++)
        for (size_t n = 0; n < n_out; n++) {
            double e = 0, mag = 0;
            for (size_t k = 0; k < n_in; k++) {
                e += (double)wide[n * n_in + k] * xd[t * n_in + k];
                mag += fabs((double)wide[n * n_in + k] * xd[t * n_in + k]);
            }
            if (fabs(ref[t * n_out + n] - e) > 1e-5 * mag + 1e-30)
                fail_msg("%s qdot ref row %zu col %zu: %g, exact %g", dtype_name(id), t, n,
                         (double)ref[t * n_out + n], e);
        }
    static const size_t batches[] = {1, 2, 3, 4, 5, 6, 7, 8, 16, 31, 32, 33, 70, 300};
    for (int i = 0; i < g_n_isas; i++) {
        void (*qm)(const kern_mat *, const void *, size_t, float *, size_t, size_t, size_t) =
            g_isas[i]->qmatmul ? g_isas[i]->qmatmul : kern_qmatmul_ref;
        /* the portable table (the oracle itself, slow under the sanitizers): 1, 33 and 70 */
        bool oracle = qm == kern_qmatmul_ref;
        for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
            size_t bt = batches[bi], n0 = bt % 2 ? 3 : 0, n1 = bt % 2 ? n_out - 2 : n_out;
            if (bt > T || (oracle && bt != 1 && bt != 33 && bt != 70))
                continue;
            for (size_t j = 0; j < T * n_out; j++)
                got[j] = NAN;
            qm(&m, xq + (T - bt) * xrb, bt, got, n_out, n0, n1);
            for (size_t t = 0; t < bt; t++)
                for (size_t n = 0; n < n_out; n++) {
                    float want = ref[(T - bt + t) * n_out + n];
                    bool in = n >= n0 && n < n1;
                    if (in ? memcmp(&got[t * n_out + n], &want, 4) != 0
                           : !isnan(got[t * n_out + n]))
                        fail_msg("%s qmatmul %s, batch %zu, row %zu col %zu: %a, ref %a",
                                 dtype_name(id), g_isas[i]->name, bt, t, n,
                                 (double)got[t * n_out + n], (double)want);
                }
        }
    }
    /* The interleaved layout (kern/qdot_pack.c) of the first 32 rows, and of 24 (an odd number
     * of 8-row groups: AVX-512 takes two a zmm): the file's bytes come back exactly, and every
     * table's product over it (the portable one's included) has the reference's bits, columns
     * 3..nr - 3 and 0..nr. */
    for (size_t nr = 32; nr >= 24; nr -= 8) {
        kern_mat m32;
        first_rows(&m, nr, &m32);
        size_t x8_bytes = kern_qdot_x8_bytes(&m32);
        assert_true(x8_bytes > 0); /* every type */
        if (x8_bytes) {
            void *x8 = aligned_alloc(64, (x8_bytes + 63) / 64 * 64);
            uint8_t *row = malloc(m.row_bytes);
            kern_mat m8;
            kern_qdot_to_x8(&m32, x8, &m8);
            assert_int_equal(m8.type, KERN_QUANT_X8);
            kern_mat same = m32; /* in place, as engine/model.c converts */
            void *x8b = aligned_alloc(64, (x8_bytes + 63) / 64 * 64);
            kern_qdot_to_x8(&same, x8b, &same);
            assert_true(same.type == m8.type && same.data == x8b && same.n_out == m8.n_out &&
                        same.n_in == m8.n_in && same.qtype == m8.qtype);
            assert_memory_equal(x8b, x8, x8_bytes);
            free(x8b);
            assert_int_equal(kern_qdot_act(&m8), fmt);
            for (size_t n = 0; n < nr; n++) {
                kern__x8_row(&m8, n, row);
                assert_memory_equal(row, (const uint8_t *)data + n * m.row_bytes, m.row_bytes);
            }
            for (int i = -1; i < g_n_isas; i++) {
                void (*qm)(const kern_mat *, const void *, size_t, float *, size_t, size_t,
                           size_t) =
                    i < 0 || !g_isas[i]->qmatmul ? kern_qmatmul_ref : g_isas[i]->qmatmul;
                for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
                    size_t bt = batches[bi], n0 = bt % 2 ? 3 : 0, n1 = bt % 2 ? nr - 2 : nr;
                    if (bt > T)
                        continue;
                    for (size_t j = 0; j < T * n_out; j++)
                        got[j] = NAN;
                    qm(&m8, xq + (T - bt) * xrb, bt, got, n_out, n0, n1);
                    for (size_t t = 0; t < bt; t++)
                        for (size_t n = 0; n < nr; n++) {
                            float want = ref[(T - bt + t) * n_out + n];
                            bool in = n >= n0 && n < n1;
                            if (in ? memcmp(&got[t * n_out + n], &want, 4) != 0
                                   : !isnan(got[t * n_out + n]))
                                fail_msg("%s x8 qmatmul %s, batch %zu, row %zu col %zu: %a, ref %a",
                                         dtype_name(id), i < 0 ? "ref" : g_isas[i]->name, bt, t, n,
                                         (double)got[t * n_out + n], (double)want);
                        }
                }
            }
            free(row);
            free(x8);
        }
    }
    free(got);
    free(ref);
    free(xq);
    free(xd);
    free(x);
    free(data);
    free(wide);
    free(bscale);
}

static void check_qdot(uint32_t id, size_t n_in)
{
    check_qdot_ex(id, n_in, false);
}

static void test_qdot(void **state)
{
    (void)state;
    static const uint32_t legacy[] = {KERN_GGML_Q8_0, KERN_GGML_Q4_0, KERN_GGML_Q4_1,
                                      KERN_GGML_Q5_0, KERN_GGML_Q5_1, KERN_GGML_IQ4_NL,
                                      KERN_GGML_MXFP4};
    static const uint32_t kq[] = {KERN_GGML_Q2_K, KERN_GGML_Q3_K, KERN_GGML_Q4_K,
                                  KERN_GGML_Q5_K, KERN_GGML_Q6_K, KERN_GGML_IQ4_XS};
    for (size_t i = 0; i < sizeof legacy / sizeof legacy[0]; i++) {
        check_qdot(legacy[i], 32);
        check_qdot(legacy[i], 288); /* 9 blocks: an odd count past a power of 2 */
    }
    check_qdot(KERN_GGML_Q4_0, 1056); /* 33 blocks: past the AMX tiles' 32 built at once */
    check_qdot(KERN_GGML_Q8_0, 1056);
    check_qdot_ex(KERN_GGML_MXFP4, 32, true); /* its scales' extremes */
    check_qdot_ex(KERN_GGML_MXFP4, 288, true);
    for (size_t i = 0; i < sizeof kq / sizeof kq[0]; i++) {
        check_qdot(kq[i], 256);
        check_qdot(kq[i], 512);
        check_qdot(kq[i], 2304); /* 9 blocks */
    }
}

/* Activations the quantizer must not turn into an out-of-range float-to-int conversion: a NaN
 * (q = 0, the rest of its block as usual) and a block of subnormals (127 / max|x| overflows:
 * the block is all zero, d = 0). */
static void test_qx_quantize_edges(void **state)
{
    (void)state;
    float x[64];
    for (int k = 0; k < 32; k++)
        x[k] = (float)(k - 16) / 16.0f; /* max|x| 1: q = round(127 x) */
    x[5] = NAN;
    for (int k = 32; k < 64; k++)
        x[k] = (k % 3 ? 1e-40f : -3e-41f) * (float)(k - 31);
    uint8_t xq[2 * 38];
    kern_qx_quantize(KERN_QX_32, x, 1, 64, 64, xq);
    const int8_t *q = (const int8_t *)(xq + 6 * 2);
    for (int k = 0; k < 32; k++) {
        int want = k == 5 ? 0 : (int)nearbyintf(127.0f * (float)(k - 16) / 16.0f);
        if (q[k] != want)
            fail_msg("NaN block, value %d: q %d, want %d", k, q[k], want);
    }
    float d1;
    memcpy(&d1, xq + 4, 4);
    assert_true(d1 == 0.0f);
    for (int k = 32; k < 64; k++)
        if (q[k] != 0)
            fail_msg("subnormal block, value %d: q %d, want 0", k, q[k]);
}

/* Every table's qx_quantize writes kern_qx_quantize's bytes, both formats, on rows with
 * outliers, a NaN, an inf, a subnormal block and a zero block (each hits a branch of the
 * contract), and on rows of random values. */
static void test_qx_quantize_tables(void **state)
{
    (void)state;
    enum { T = 5, N = 768 };
    float *x = malloc(T * N * sizeof(float));
    size_t cap = T * kern_qx_row_bytes(KERN_QX_32, N); /* the larger format at this width */
    assert_true(cap >= T * kern_qx_row_bytes(KERN_QX_256, N));
    uint8_t *want = malloc(cap), *got = malloc(cap);
    assert_true(x && want && got);
    for (size_t i = 0; i < T * N; i++)
        x[i] = frand() * (i % 61 == 0 ? 50.0f : 1.0f);
    x[N + 7] = NAN;
    x[2 * N + 300] = INFINITY;
    x[2 * N + 301] = -INFINITY;
    for (size_t k = 0; k < 256; k++) {
        x[3 * N + k] = (k % 3 ? 1e-40f : -3e-41f) * (float)(k % 7);
        x[4 * N + 256 + k] = 0.0f;
    }
    for (int f = 0; f < 2; f++) {
        kern_qx fmt = f ? KERN_QX_256 : KERN_QX_32;
        size_t rb = kern_qx_row_bytes(fmt, N);
        memset(want, 0xa5, T * rb);
        kern_qx_quantize(fmt, x, T, N, N, want);
        for (int i = 0; i < g_n_isas; i++) {
            if (!g_isas[i]->qx_quantize)
                continue;
            memset(got, 0x5a, T * rb);
            g_isas[i]->qx_quantize(fmt, x, T, N, N, got);
            for (size_t b = 0; b < T * rb; b++)
                if (got[b] != want[b])
                    fail_msg("%s qx_quantize (format %d): byte %zu is %u, the reference's %u",
                             g_isas[i]->name, (int)fmt, b, got[b], want[b]);
        }
    }
    free(x);
    free(want);
    free(got);
}

/* The integer path's oracle fails when it should: a weight changed by one step changes the
 * reference's result (Q4_K, Q4_0, Q8_0, Q5_1, the IQ4 types and MXFP4 through their single
 * accumulator), value 0 meeting the only activation. */
static void test_qdot_is_sensitive(void **state)
{
    (void)state;
    static const uint32_t ids[] = {KERN_GGML_Q4_K, KERN_GGML_Q4_0,   KERN_GGML_Q8_0,
                                   KERN_GGML_Q5_1, KERN_GGML_IQ4_NL, KERN_GGML_IQ4_XS,
                                   KERN_GGML_MXFP4};
    static const size_t byte0[] = {16, 2, 2, 8, 2, 8, 1}; /* the lowest bit of value 0's quant */
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        size_t n_in = 256;
        float *wide = malloc(n_in * sizeof(float)), x[256];
        uint8_t *data = make_quant_rows(ids[i], 1, n_in, wide);
        /* x is value 0's activation alone: with random others the sum can be large enough
         * that a small block scale's step is below its rounding (seen for Q8_0 once the random
         * sequence shifted) */
        for (size_t k = 0; k < n_in; k++)
            x[k] = 0.0f;
        x[0] = 4.0f;
        kern_mat m;
        if (ids[i] == KERN_GGML_Q8_0)
            kern_mat_init(&m, KERN_Q8_0, data, 1, n_in);
        else
            kern_mat_init_quant(&m, KERN_QUANT, ids[i], data, 1, n_in);
        uint8_t xq[304];
        kern_qx_quantize(kern_qdot_act(&m), x, 1, n_in, n_in, xq);
        float a, b;
        kern_qmatmul_ref(&m, xq, 1, &a, 1, 0, 1);
        data[byte0[i]] ^= 1;
        kern_qmatmul_ref(&m, xq, 1, &b, 1, 0, 1);
        if (a == b)
            fail_msg("%s: a one-step change of value 0 left the product at %a", dtype_name(ids[i]),
                     (double)a);
        free(data);
        free(wide);
    }
}

/* dot, axpy (F32 and F16), to_f16 and rmsnorm: the reference near double precision, every
 * table equal to it bit for bit, at every length 0..77 (every tail of the 8- and 16-wide
 * loops). */
/* Attention's runs of cache rows (kern_dot_f16_n, kern_axpy_f16_n): every table, with its
 * batched forms or the loop over single calls, gives the bits of the reference's single calls;
 * head sizes with and without a fast path, runs of 1 to 33 rows, rows with padding between, 1 to
 * 12 heads at once (groups of 8, 4, 2 and the rest), sharing their rows (GQA) or each at its own
 * offset in them (one kv head per query head). */
static void test_row_runs(void **state)
{
    (void)state;
    static const size_t sizes[] = {64, 128, 256, 192, 96, 72, 16};
    static const size_t heads[] = {1, 2, 3, 4, 5, 7, 8, 9, 12};
    enum { M = 33, G = 12, STRIDE = 3200 }; /* uint16 per row: 12 heads of 256 values and padding */
    uint16_t *rows = malloc(M * STRIDE * sizeof(uint16_t));
    float *a = malloc(G * 256 * sizeof(float)), *y0 = malloc(G * 260 * sizeof(float));
    float *yr = malloc(G * 260 * sizeof(float)), *y = malloc(G * 260 * sizeof(float));
    float w[G][M + 3], want[G][M + 1], got[G][M + 1];
    for (size_t i = 0; i < M * STRIDE; i++)
        rows[i] = dtype_f32_to_f16(frand());
    for (int i = 0; i < G * 256; i++)
        a[i] = frand();
    for (int i = 0; i < G * 260; i++)
        y0[i] = frand();
    for (int h = 0; h < G; h++)
        for (int i = 0; i < M + 3; i++)
            w[h][i] = frand();
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (size_t gi = 0; gi < sizeof heads / sizeof heads[0]; gi++)
            for (int shared = 0; shared < 2; shared++) {
                size_t n = sizes[si], g = heads[gi], bh = shared ? 0 : n * sizeof(uint16_t);
                for (size_t m = 1; m <= M; m += m < 18 ? 1 : 15) {
                    kern_run r = {.b = rows + 7, /* rows need not be aligned */
                                  .bh = bh,
                                  .stride = STRIDE * sizeof(uint16_t),
                                  .g = g,
                                  .m = m,
                                  .n = n};
                    memcpy(yr, y0, G * 260 * sizeof(float));
                    for (size_t h = 0; h < g; h++)
                        for (size_t i = 0; i < m; i++) {
                            want[h][i] =
                                kern_ref_ops.dot_f16(a + h * 256, kern_run_row(&r, h, i), n);
                            kern_ref_ops.axpy_f16(yr + h * 260, w[h][i], kern_run_row(&r, h, i), n);
                        }
                    for (int k = 0; k < g_n_isas; k++) {
                        const kern_ops *ops = g_isas[k];
                        memset(got, 0xff, sizeof got);
                        kern_dot_f16_n(ops, &r, a, 256, &got[0][0], M + 1);
                        for (size_t h = 0; h < g; h++) {
                            if (memcmp(got[h], want[h], m * sizeof(float)))
                                fail_msg("%s dot_f16_n differs from the reference (n %zu, m %zu, "
                                         "head %zu of %zu, %s)",
                                         ops->name, n, m, h, g, shared ? "shared" : "own rows");
                            if (got[h][m] == got[h][m])
                                fail_msg(
                                    "%s dot_f16_n wrote past m (n %zu, m %zu, head %zu of %zu)",
                                    ops->name, n, m, h, g); /* nothing past m written */
                        }
                        memcpy(y, y0, G * 260 * sizeof(float));
                        kern_axpy_f16_n(ops, &r, y, 260, &w[0][0], M + 3);
                        if (memcmp(y, yr, G * 260 * sizeof(float)))
                            fail_msg("%s axpy_f16_n differs from the reference (n %zu, m %zu, %zu "
                                     "heads, %s)",
                                     ops->name, n, m, g, shared ? "shared" : "own rows");
                    }
                }
            }
    free(rows);
    free(a);
    free(y0);
    free(yr);
    free(y);
}

static void test_vector_helpers(void **state)
{
    (void)state;
    enum { N = 77 };
    float a[N], b[N], y0[N], y[N], yr[N], o[N], orf[N];
    uint16_t bh[N], h[N], hr[N];
    for (int i = 0; i < N; i++) {
        a[i] = frand();
        b[i] = frand();
        bh[i] = dtype_f32_to_f16(b[i]);
        y0[i] = frand();
    }
    for (size_t n = 0; n <= N; n++) {
        double dd = 0, dh = 0;
        for (size_t i = 0; i < n; i++) {
            dd += (double)a[i] * b[i];
            dh += (double)a[i] * dtype_f16_to_f32(bh[i]);
        }
        float rd = kern_ref_ops.dot(a, b, n), rh = kern_ref_ops.dot_f16(a, bh, n);
        assert_true(fabs(rd - dd) < 1e-5 && fabs(rh - dh) < 1e-5);
        for (int k = 0; k < g_n_isas; k++) {
            const kern_ops *ops = g_isas[k];
            float gd = ops->dot(a, b, n), gh = ops->dot_f16(a, bh, n);
            if (memcmp(&gd, &rd, 4) || memcmp(&gh, &rh, 4))
                fail_msg("%s dot differs from the reference at n = %zu", ops->name, n);
            memcpy(yr, y0, sizeof y0);
            memcpy(y, y0, sizeof y0);
            kern_ref_ops.axpy(yr, 0.37f, a, n);
            ops->axpy(y, 0.37f, a, n);
            assert_memory_equal(y, yr, sizeof y);
            kern_ref_ops.axpy_f16(yr, -1.3f, bh, n);
            ops->axpy_f16(y, -1.3f, bh, n);
            assert_memory_equal(y, yr, sizeof y);
            kern_ref_ops.to_f16(hr, a, n);
            ops->to_f16(h, a, n);
            assert_memory_equal(h, hr, n * sizeof(uint16_t));
            if (n == 0)
                continue;
            kern_ref_ops.rmsnorm(orf, a, b, n, 1e-5f);
            ops->rmsnorm(o, a, b, n, 1e-5f);
            assert_memory_equal(o, orf, n * sizeof(float));
        }
    }
    for (int i = 0; i < N; i++)
        assert_true(fabsf(yr[i] - (y0[i] + 0.37f * a[i] - 1.3f * dtype_f16_to_f32(bh[i]))) < 1e-5f);
    double ss = 0;
    for (int i = 0; i < N; i++)
        ss += (double)a[i] * a[i];
    double sc = 1.0 / sqrt(ss / N + 1e-5);
    for (int i = 0; i < N; i++)
        assert_true(fabs(orf[i] - a[i] * sc * b[i]) < 1e-5);
    /* F16 rounding at the edges: subnormals, ties, overflow to infinity */
    float edge[] = {0.0f,     -0.0f, 5.96e-8f, 2.98e-8f,      6.1e-5f,        65504.0f,
                    65520.0f, 1e9f,  -1e9f,    1.0009765625f, 1.00048828125f, 3.0517578125e-05f};
    size_t ne = sizeof edge / sizeof edge[0];
    for (int k = 0; k < g_n_isas; k++) {
        kern_ref_ops.to_f16(hr, edge, ne);
        g_isas[k]->to_f16(h, edge, ne);
        assert_memory_equal(h, hr, ne * sizeof(uint16_t));
    }
}

/* a and b bit for bit, except that any NaN equals any NaN (their sign and payload are not part of
 * the kernels' contract: which operand's NaN an instruction passes on is the compiler's pick). */
static bool same_floats(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(a + i, b + i, sizeof(float)) && !(isnan(a[i]) && isnan(b[i])))
            return false;
    return true;
}

/* kern_exp (kern/kexp.h) is e^x within 2 ulp on [-87, 0], and 0 below, NaN for NaN: attention's
 * weights as close as libm's expf makes them. */
static void test_exp(void **state)
{
    (void)state;
    double worst = 0;
    for (int i = 0; i <= 2000000; i++) {
        float x = -87.0f * (float)i / 2000000.0f;
        double want = exp((double)x), got = kern_exp(x);
        double ulp = nextafterf((float)want, INFINITY) - (float)want;
        double e = fabs(got - want) / ulp;
        worst = e > worst ? e : worst;
    }
    fprintf(stderr, "kern_exp: worst error %.2f ulp on [-87, 0]\n", worst);
    assert_true(worst <= 2.0);
    assert_true(kern_exp(0.0f) == 1.0f && kern_exp(-0.0f) == 1.0f);
    assert_true(kern_exp(-87.5f) == 0.0f && kern_exp(-INFINITY) == 0.0f);
    assert_true(isnan(kern_exp(NAN)));
}

/* Attention's softmax: every table the reference's bits (the values, the max, the sum) at every
 * length 0..140 with skips into the lanes, scores of a wide range, -inf (a masked score), NaN
 * and zeros of both signs; the reference near a double-precision softmax. */
static void test_softmax(void **state)
{
    (void)state;
    enum { N = 140 };
    float s0[N], want[N], got[N];
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < N; i++)
            s0[i] = frand() * (round == 0 ? 4.0f : 60.0f);
        if (round >= 2) {
            s0[3] = -INFINITY;
            s0[17] = -0.0f;
            s0[40] = 0.0f;
            s0[77] = -200.0f;
        }
        if (round == 3)
            s0[50] = NAN;
        for (size_t off = 0; off < 3; off++)
            for (size_t n = 0; n + off <= N; n++) {
                memcpy(want, s0 + off, n * sizeof(float));
                float mr, sr = kern_ref_ops.softmax(want, n, &mr);
                if (round < 3 && n > 0) { /* near the double softmax */
                    double m = -INFINITY, sum = 0;
                    for (size_t i = 0; i < n; i++)
                        m = s0[off + i] > m ? s0[off + i] : m;
                    assert_true(mr == (float)m);
                    for (size_t i = 0; i < n; i++)
                        sum += exp((double)s0[off + i] - m);
                    assert_true(fabs(sr - sum) <= 1e-6 * sum);
                    for (size_t i = 0; i < n; i++)
                        assert_true(fabs(want[i] - exp((double)s0[off + i] - m)) <= 3e-7);
                }
                for (int k = 0; k < g_n_isas; k++) {
                    memcpy(got, s0 + off, n * sizeof(float));
                    float mg, sg = g_isas[k]->softmax(got, n, &mg);
                    if (!same_floats(&sg, &sr, 1) || memcmp(&mg, &mr, 4) ||
                        !same_floats(got, want, n))
                        fail_msg("%s softmax differs from the reference (round %d, n %zu)",
                                 g_isas[k]->name, round, n);
                }
            }
    }
}

/* The MLP's SiLU: every table the reference's bits at every length 0..77 (vector bodies and
 * tails), on values of both signs, large ones, zeros, infinities and NaN; the reference near
 * x / (1 + e^-x) in double precision. */
static void test_silu(void **state)
{
    (void)state;
    enum { N = 77 };
    float g0[N], u[N], want[N], got[N];
    for (int i = 0; i < N; i++) {
        g0[i] = frand() * (i % 3 ? 8.0f : 120.0f);
        u[i] = frand();
    }
    g0[5] = -0.0f;
    g0[6] = 0.0f;
    g0[20] = INFINITY;
    g0[33] = NAN;
    for (size_t n = 0; n <= N; n++) {
        memcpy(want, g0, sizeof want);
        kern_ref_ops.silu_mul(want, u, n);
        for (size_t i = 0; i < n; i++) {
            if (i == 20 || i == 33 || n > N)
                continue;
            double x = g0[i], s = x / (1.0 + exp(-x)) * u[i];
            assert_true(fabs(want[i] - s) <= 1e-6 * fabs(s) + 1e-30);
        }
        for (int k = 0; k < g_n_isas; k++) {
            memcpy(got, g0, sizeof got);
            g_isas[k]->silu_mul(got, u, n);
            if (!same_floats(got, want, N))
                fail_msg("%s silu_mul differs from the reference at n = %zu", g_isas[k]->name, n);
        }
    }
}

/* kern_tanh (kern/kexp.h) within 4 ulp of tanh from 2^-20 to 10 (and +-1 beyond, odd, NaN for
 * NaN). kern_gelu against x / (1 + e^-2u), u = sqrt(2/pi) (x + 0.044715 x^3) (the same function
 * as 0.5 x (1 + tanh u), without that form's cancelling), in double: within 3 (2 + |2u|) ulp. The
 * |2u| is the conditioning: 2u rounded to float moves e^-2u by |2u| ulp, whatever the formula
 * (8 ulp at |x| = 1, 19 at x = -3.9). Where 2u < -87, kern_exp's 0: the value is below 1e-35. */
static void test_tanh_gelu(void **state)
{
    (void)state;
    double worst_t = 0, worst_g = 0;
    for (int i = 0; i <= 400000; i++) {
        float y = ldexpf(1.0f, -20) * powf(10.0f * 1048576.0f, (float)i / 400000.0f);
        double want = tanh((double)y), got = kern_tanh(y);
        double ulp = nextafterf((float)want, INFINITY) - (float)want;
        worst_t = fmax(worst_t, fabs(got - want) / ulp);
        assert_true(kern_tanh(-y) == -kern_tanh(y));
        for (int sg = -1; sg <= 1; sg += 2) {
            float x = (float)sg * y;
            double xd = x, u2 = 2 * 0.7978845608028654 * (xd + 0.044715 * xd * xd * xd);
            double gw = xd / (1 + exp(-u2)), gf = kern_gelu(x);
            if (u2 < -87) {
                assert_true(fabs(gw) < 1e-35 && fabs(gf) < 1e-35);
                continue;
            }
            if (fabs(gw) < 0x1p-126)
                continue;
            double gu = nextafterf((float)fabs(gw), INFINITY) - (float)fabs(gw);
            worst_g = fmax(worst_g, fabs(gf - gw) / gu / (2 + fabs(u2)));
        }
    }
    fprintf(stderr, "kern_tanh: worst error %.2f ulp; kern_gelu %.2f (2 + |2u|) ulp\n", worst_t,
            worst_g);
    assert_true(worst_t <= 4.0);
    assert_true(worst_g <= 3.0);
    assert_true(kern_tanh(0.0f) == 0.0f && signbit(kern_tanh(-0.0f)));
    assert_true(kern_tanh(INFINITY) == 1.0f && kern_tanh(-INFINITY) == -1.0f);
    assert_true(kern_tanh(50.0f) == 1.0f && isnan(kern_tanh(NAN)));
    assert_true(kern_gelu(0.0f) == 0.0f && kern_gelu(INFINITY) == INFINITY);
    assert_true(kern_gelu(-1e30f) == 0.0f && isnan(kern_gelu(NAN)));
}

/* Gemma's GELU-gated MLP and soft-capping: every table the reference's bits at every length
 * 0..77 (vector bodies and tails), on values of both signs, large ones, zeros, infinities and
 * NaN; the soft-cap with a scale (attention's scores) and without (logits). */
static void test_gelu_softcap(void **state)
{
    (void)state;
    enum { N = 77 };
    float g0[N], u[N], want[N], got[N];
    for (int i = 0; i < N; i++) {
        g0[i] = frand() * (i % 3 ? 6.0f : 200.0f);
        u[i] = frand();
    }
    g0[5] = -0.0f;
    g0[6] = 0.0f;
    g0[20] = INFINITY;
    g0[21] = -INFINITY;
    g0[33] = NAN;
    g0[40] = 1e-7f;
    for (size_t n = 0; n <= N; n++)
        for (int op = 0; op < 3; op++) {
            float scale = op == 1 ? 0.125f : 1.0f, cap = op == 1 ? 50.0f : 30.0f;
            memcpy(want, g0, sizeof want);
            if (op == 0)
                kern_ref_ops.gelu_mul(want, u, n);
            else
                kern_ref_ops.softcap(want, n, scale, cap);
            for (size_t i = 0; op && i < n; i++) {
                if (i == 33)
                    continue;
                double c = cap * tanh((double)g0[i] * scale / cap);
                assert_true(fabs(want[i] - c) <= 1e-6 * fabs(c) + 1e-30);
            }
            for (int k = 0; k < g_n_isas; k++) {
                memcpy(got, g0, sizeof got);
                if (op == 0)
                    g_isas[k]->gelu_mul(got, u, n);
                else
                    g_isas[k]->softcap(got, n, scale, cap);
                if (!same_floats(got, want, N))
                    fail_msg("%s %s differs from the reference at n = %zu", g_isas[k]->name,
                             op ? "softcap" : "gelu_mul", n);
            }
        }
}

/* The bit-for-bit comparisons above can fail: an unfused, sequential dot (what a plain C loop
 * computes) differs from the reference's on these inputs at some length. */
static void test_reference_is_sensitive(void **state)
{
    (void)state;
    float a[64], b[64];
    for (int i = 0; i < 64; i++) {
        a[i] = frand();
        b[i] = frand();
    }
    int differ = 0;
    for (size_t n = 1; n <= 64; n++) {
        float s = 0.0f;
        for (size_t i = 0; i < n; i++)
            s += a[i] * b[i];
        float r = kern_ref_ops.dot(a, b, n);
        differ += memcmp(&s, &r, 4) != 0;
    }
    assert_true(differ > 0);
}

static void test_select(void **state)
{
    (void)state;
    char err[256];
    const kern_ops *k;
    assert_int_equal(kern_select(NULL, &k, err, sizeof err), 0);
    assert_int_equal(kern_cpu_can(k->name), 1);
    assert_int_equal(kern_select("auto", &k, err, sizeof err), 0);
    assert_ptr_equal(k, g_isas[g_n_native - 1]); /* the best this CPU runs */
    assert_int_equal(kern_select("generic", &k, err, sizeof err), 0);
    assert_ptr_equal(k, &kern_ref_ops);
    int rc = kern_select("avx2", &k, err, sizeof err);
    if (kern_cpu_can("avx2") == 1) {
        assert_int_equal(rc, 0);
        assert_string_equal(k->name, "avx2");
    } else {
        assert_int_equal(rc, KVS_EUNSUPPORTED);
        assert_non_null(strstr(err, "avx2"));
        assert_null(k);
    }
    /* on a CPU without it, a clear refusal naming the missing feature, never a fallback */
    rc = kern_select("avx512", &k, err, sizeof err);
    int can = kern_cpu_can("avx512");
#ifdef KERN_HAVE_AVX512
    assert_int_not_equal(can, -1);
#else
    assert_int_equal(can, -1);
#endif
    if (can == 1) {
        assert_int_equal(rc, 0);
        assert_string_equal(k->name, "avx512");
        assert_string_equal(g_isas[g_n_native - 1]->name, "avx512"); /* auto prefers it */
    } else {
        assert_int_equal(rc, KVS_EUNSUPPORTED);
        assert_non_null(strstr(err, "avx512"));
        if (can == 0) /* built, the CPU lacks it: the feature named */
            assert_true(strstr(err, "no AVX512") || strstr(err, "no FMA") ||
                        strstr(err, "no F16C") || strstr(err, "no OS support"));
        assert_null(k);
    }
    /* the emulation is the tests' only: never a --kernels choice */
    assert_int_equal(kern_select("avx512-emulated", &k, err, sizeof err), KVS_EINVAL);
    assert_int_equal(kern_cpu_can("avx512-emulated"), -1);
    assert_int_equal(kern_select("sse9", &k, err, sizeof err), KVS_EINVAL);
    assert_non_null(strstr(err, "sse9"));
    assert_non_null(kern_cpu_features());
}

/* The type table: every id GGUF defines has a name; sizes as ggml's; the loadable types are
 * the ones the supported list names. */
static void test_dtype(void **state)
{
    (void)state;
    assert_string_equal(dtype_name(12), "Q4_K");
    assert_string_equal(dtype_name(30), "BF16");
    assert_string_equal(dtype_name(4), "unknown"); /* removed from ggml */
    assert_null(dtype_get(4));
    assert_int_equal(dtype_nbytes(8, 64), 68);
    assert_int_equal(dtype_nbytes(12, 512), 288);
    assert_int_equal(dtype_nbytes(12, 100), 0);
    char list[256] = "";
    for (uint32_t id = 0; id < 64; id++) {
        const dtype_info *t = dtype_get(id);
        if (t && t->loadable)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", *list ? ", " : "",
                     t->name);
    }
    /* the list's order is the table's; compare as sets of names */
    assert_int_equal(strlen(list), strlen(dtype_supported_list()));
    for (char *tok = strtok(list, ", "); tok; tok = strtok(NULL, ", "))
        assert_non_null(strstr(dtype_supported_list(), tok));
    /* BF16 and Q8_0 widening */
    uint16_t bf = 0x3fc0; /* 1.5 */
    float f;
    dtype_get(30)->to_f32(&bf, &f, 1);
    assert_true(f == 1.5f);
    uint8_t blk[34] = {0};
    uint16_t d = dtype_f32_to_f16(0.5f);
    memcpy(blk, &d, 2);
    blk[2] = (uint8_t)(int8_t)-3;
    float q[32];
    dtype_get(8)->to_f32(blk, q, 32);
    assert_true(q[0] == -1.5f && q[1] == 0.0f);
}

typedef struct pool_arg {
    atomic_uint calls[8];
    atomic_uint total;
} pool_arg;

static void pool_fn(void *arg, uint32_t ith, uint32_t nth)
{
    pool_arg *p = arg;
    assert_true(ith < nth);
    atomic_fetch_add(&p->calls[ith], 1);
    atomic_fetch_add(&p->total, 1);
}

static void test_pool(void **state)
{
    (void)state;
    for (uint32_t n = 1; n <= 4; n++) {
        tpool *tp;
        assert_int_equal(tpool_create(n, &tp), 0);
        assert_int_equal(tpool_n_threads(tp), n);
        pool_arg a;
        memset(&a, 0, sizeof a);
        for (int i = 0; i < 2000; i++)
            tpool_run(tp, pool_fn, &a);
        for (uint32_t i = 0; i < n; i++)
            assert_int_equal(atomic_load(&a.calls[i]), 2000);
        assert_int_equal(atomic_load(&a.total), 2000 * n);
        tpool_destroy(tp);
    }
    tpool_destroy(NULL);
}

typedef struct items_arg {
    atomic_uint hits[1000];
    atomic_uint by_thread[8];
    uint32_t n;
} items_arg;

static void items_fn(void *arg, uint32_t item, uint32_t ith)
{
    items_arg *a = arg;
    assert_true(ith < a->n);
    atomic_fetch_add(&a->hits[item], 1);
    atomic_fetch_add(&a->by_thread[ith], 1);
}

/* Every item exactly once, for counts below, at and above the thread count; with a thread
 * held up (the items of thread 1 sleep), the others take its items from the back. */
static void test_pool_items(void **state)
{
    (void)state;
    static const uint32_t counts[] = {0, 1, 2, 3, 7, 64, 1000};
    for (uint32_t n = 1; n <= 4; n++) {
        tpool *tp;
        assert_int_equal(tpool_create(n, &tp), 0);
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
            for (int rep = 0; rep < 50; rep++) {
                items_arg *a = calloc(1, sizeof *a);
                assert_non_null(a);
                a->n = n;
                tpool_run_items(tp, counts[c], items_fn, a);
                uint32_t total = 0;
                for (uint32_t i = 0; i < 1000; i++)
                    assert_int_equal(atomic_load(&a->hits[i]), i < counts[c] ? 1 : 0);
                for (uint32_t t = 0; t < n; t++)
                    total += atomic_load(&a->by_thread[t]);
                assert_int_equal(total, counts[c]);
                free(a);
            }
        tpool_destroy(tp);
    }
}

typedef struct slow_arg {
    atomic_uint hits[64];
    atomic_uint by_thread[2];
} slow_arg;

static void slow_fn(void *arg, uint32_t item, uint32_t ith)
{
    slow_arg *a = arg;
    /* Thread 1 is held in its first item until thread 0 has run 63 items (or 10 s have
     * passed): only taking the rest of thread 1's 32 from the back lets it get there. */
    for (int ms = 0; ith == 1 && atomic_load(&a->by_thread[1]) == 0 &&
                     atomic_load(&a->by_thread[0]) < 63 && ms < 10000;
         ms++) {
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    atomic_fetch_add(&a->hits[item], 1);
    atomic_fetch_add(&a->by_thread[ith], 1);
}

static void test_pool_items_steal(void **state)
{
    (void)state;
    tpool *tp;
    assert_int_equal(tpool_create(2, &tp), 0);
    slow_arg a;
    memset(&a, 0, sizeof a);
    tpool_run_items(tp, 64, slow_fn, &a);
    for (uint32_t i = 0; i < 64; i++)
        assert_int_equal(atomic_load(&a.hits[i]), 1);
    /* Thread 0 ran its 32 and then thread 1's from the back: all but the one thread 1 held
     * (or all 64, if thread 1 woke after they were gone). */
    assert_true(atomic_load(&a.by_thread[0]) >= 63);
    tpool_destroy(tp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32),
        cmocka_unit_test(test_f16),
        cmocka_unit_test(test_q8_0),
        cmocka_unit_test(test_quant_legacy),
        cmocka_unit_test(test_quant_k),
        cmocka_unit_test(test_qdot),
        cmocka_unit_test(test_qdot_is_sensitive),
        cmocka_unit_test(test_qx_quantize_edges),
        cmocka_unit_test(test_qx_quantize_tables),
        cmocka_unit_test(test_vector_helpers),
        cmocka_unit_test(test_exp),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_silu),
        cmocka_unit_test(test_tanh_gelu),
        cmocka_unit_test(test_gelu_softcap),
        cmocka_unit_test(test_row_runs),
        cmocka_unit_test(test_reference_is_sensitive),
        cmocka_unit_test(test_select),
        cmocka_unit_test(test_dtype),
        cmocka_unit_test(test_pool),
        cmocka_unit_test(test_pool_items),
        cmocka_unit_test(test_pool_items_steal),
    };
    return cmocka_run_group_tests_name("kernels", tests, setup, NULL);
}
