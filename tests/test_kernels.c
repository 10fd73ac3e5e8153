/* Engine kernels and thread pool: every matrix kernel, weight type, batch size 1..70 and odd
 * width agrees with a naive product over widened weights (only summation order may differ),
 * repeated calls give the same bits, and the pool runs every thread exactly once per job. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf.h"
#include "engine/kernels.h"
#include "engine/threadpool.h"

static uint32_t g_rng = 12345;
static float frand(void)
{
    g_rng = g_rng * 1664525u + 1013904223u;
    return (float)(g_rng >> 8) / (float)(1u << 24) * 2.0f - 1.0f;
}

/* Random weights of the type with their exact widened values in wide. */
static void *make_weights(kern_type type, size_t n_out, size_t n_in, float *wide)
{
    kern_mat tmp;
    kern_mat_init(&tmp, type, NULL, n_out, n_in);
    uint8_t *data = malloc(n_out * tmp.row_bytes);
    for (size_t r = 0; r < n_out; r++) {
        uint8_t *row = data + r * tmp.row_bytes;
        for (size_t k = 0; k < n_in; k++) {
            float v = frand();
            if (type == KERN_F32) {
                memcpy(row + 4 * k, &v, 4);
                wide[r * n_in + k] = v;
            } else if (type == KERN_F16) {
                uint16_t h = ggml_fp32_to_fp16(v);
                memcpy(row + 2 * k, &h, 2);
                wide[r * n_in + k] = ggml_fp16_to_fp32(h);
            }
        }
        if (type == KERN_Q8_0)
            for (size_t b = 0; b < n_in / QK8_0; b++) {
                uint8_t *blk = row + b * (2 + QK8_0);
                uint16_t h = ggml_fp32_to_fp16(0.01f + 0.02f * fabsf(frand()));
                memcpy(blk, &h, 2);
                float d = ggml_fp16_to_fp32(h);
                for (int i = 0; i < QK8_0; i++) {
                    int8_t q = (int8_t)(frand() * 127.0f);
                    blk[2 + i] = (uint8_t)q;
                    wide[r * n_in + b * QK8_0 + (size_t)i] = d * (float)q;
                }
            }
    }
    return data;
}

/* The packed GEMM path on x (T rows, ldx 2 * n_in + 3 so rows are not packed already):
 * near the naive product, the same bits for any column split and for a prefix of the rows. */
static void check_gemm(const kern_mat *m, const float *wide, const float *x_dense, size_t T,
                       float *scratch)
{
    size_t n_in = m->n_in, n_out = m->n_out, ldx = 2 * n_in + 3;
    float *x = malloc(T * ldx * sizeof(float));
    for (size_t t = 0; t < T; t++)
        memcpy(x + t * ldx, x_dense + t * n_in, n_in * sizeof(float));
    float *xp = malloc(kern_gemm_xp_floats(T, n_in) * sizeof(float));
    float *out = malloc(T * n_out * sizeof(float));
    kern_gemm_pack_x(x, T, ldx, n_in, xp);
    kern_gemm_packed(m, xp, T, out, n_out, 0, 5);
    kern_gemm_packed(m, xp, T, out, n_out, 5, n_out);
    for (size_t t = 0; t < T; t++)
        for (size_t n = 0; n < n_out; n++) {
            double ref = 0, mag = 0;
            for (size_t k = 0; k < n_in; k++) {
                ref += (double)x[t * ldx + k] * wide[n * n_in + k];
                mag += fabs((double)x[t * ldx + k] * wide[n * n_in + k]);
            }
            assert_true(fabs(out[t * n_out + n] - ref) <= 1e-5 * mag + 1e-6);
        }
    kern_gemm_packed(m, xp, T, scratch, n_out, 0, n_out);
    assert_memory_equal(out, scratch, T * n_out * sizeof(float));
    /* the first row alone gives the same bits as inside the batch */
    kern_gemm_pack_x(x, 1, ldx, n_in, xp);
    kern_gemm_packed(m, xp, 1, scratch, n_out, 0, n_out);
    assert_memory_equal(out, scratch, n_out * sizeof(float));
    free(out);
    free(xp);
    free(x);
}

/* kern_matmul_rows (and for row layouts the packed GEMM) against the naive product for batch
 * sizes 1..70, then kern_rows_to_f32 from an odd row on. */
static void check_mat(const kern_mat *mp, const float *wide)
{
    kern_mat m = *mp;
    size_t n_out = m.n_out, n_in = m.n_in, T_max = 70;
    bool panels = kern_is_panel(m.type);
    float *x = malloc(T_max * n_in * sizeof(float));
    for (size_t i = 0; i < T_max * n_in; i++)
        x[i] = frand();
    float *out = malloc(T_max * n_out * sizeof(float)), *out2 = malloc(T_max * n_out * 4);
    for (size_t T = 1; T <= T_max; T += T < 20 ? 1 : 7) {
        /* in two column ranges, the second starting off the kernels' column-group grid */
        kern_matmul_rows(&m, x, T, n_in, out, n_out, 0, 5);
        kern_matmul_rows(&m, x, T, n_in, out, n_out, 5, n_out);
        for (size_t t = 0; t < T; t++)
            for (size_t n = 0; n < n_out; n++) {
                double ref = 0, mag = 0;
                for (size_t k = 0; k < n_in; k++) {
                    ref += (double)x[t * n_in + k] * wide[n * n_in + k];
                    mag += fabs((double)x[t * n_in + k] * wide[n * n_in + k]);
                }
                assert_true(fabs(out[t * n_out + n] - ref) <= 1e-5 * mag + 1e-6);
            }
        kern_matmul_rows(&m, x, T, n_in, out2, n_out, 0, n_out);
        assert_memory_equal(out, out2, T * n_out * sizeof(float));
        if (!panels) {
            check_gemm(&m, wide, x, T, out2);
            continue;
        }
        /* with a scratch (Q8_0 panels widened once for several row tiles): the same bits */
        float *scratch = malloc(KERN_PANEL * n_in * sizeof(float));
        kern_matmul_panels(&m, x, T, n_in, out2, n_out, 0, n_out, scratch);
        assert_memory_equal(out, out2, T * n_out * sizeof(float));
        free(scratch);
        /* panel products are batch-invariant: each row alone gives the bits it had in the batch */
        for (size_t t = 0; t < T; t++) {
            kern_matmul_rows(&m, x + t * n_in, 1, n_in, out2, n_out, 0, n_out);
            assert_memory_equal(out + t * n_out, out2, n_out * sizeof(float));
        }
    }
    float *rows = malloc(n_out * n_in * sizeof(float));
    kern_rows_to_f32(&m, 3, n_out - 3, rows);
    assert_memory_equal(rows, wide + 3 * n_in, (n_out - 3) * n_in * sizeof(float));
    kern_rows_to_f32(&m, 16, 16, rows); /* one whole panel */
    assert_memory_equal(rows, wide + 16 * n_in, 16 * n_in * sizeof(float));
    free(rows);
    free(out);
    free(out2);
    free(x);
}

/* Every kernel of the type and of its panel layout, with 37 output rows (two whole panels and
 * a padded one). */
static void check_type(kern_type type, size_t n_in)
{
    size_t n_out = 37;
    float *wide = malloc(n_out * n_in * sizeof(float));
    void *data = make_weights(type, n_out, n_in, wide);
    kern_mat m;
    kern_mat_init(&m, type, data, n_out, n_in);
    check_mat(&m, wide);
    size_t bytes = kern_panel_bytes(&m);
    assert_int_equal(bytes, 48 * m.row_bytes);
    void *pdata = malloc(bytes);
    kern_mat pm;
    kern_mat_to_panels(&m, pdata, &pm);
    assert_int_equal(pm.type, type == KERN_F32   ? KERN_F32_PANEL
                              : type == KERN_F16 ? KERN_F16_PANEL
                                                 : KERN_Q8_0_PANEL);
    assert_int_equal(kern_panel_bytes(&pm), 0);
    check_mat(&pm, wide);
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

static void test_vector_helpers(void **state)
{
    (void)state;
    float a[77], b[77], y[77], y2[77], o[77];
    for (int i = 0; i < 77; i++) {
        a[i] = frand();
        b[i] = frand();
        y[i] = y2[i] = frand();
    }
    for (size_t n = 0; n <= 77; n += 11) {
        double ref = 0;
        for (size_t i = 0; i < n; i++)
            ref += (double)a[i] * b[i];
        assert_true(fabs(kern_dot(a, b, n) - ref) < 1e-5);
    }
    kern_axpy(y, 0.5f, a, 77);
    for (int i = 0; i < 77; i++)
        assert_true(fabsf(y[i] - (y2[i] + 0.5f * a[i])) < 1e-6f);
    kern_rmsnorm(o, a, b, 77, 1e-5f);
    double ss = 0;
    for (int i = 0; i < 77; i++)
        ss += (double)a[i] * a[i];
    double sc = 1.0 / sqrt(ss / 77 + 1e-5);
    for (int i = 0; i < 77; i++)
        assert_true(fabs(o[i] - a[i] * sc * b[i]) < 1e-5);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32),  cmocka_unit_test(test_f16),
        cmocka_unit_test(test_q8_0), cmocka_unit_test(test_vector_helpers),
        cmocka_unit_test(test_pool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
