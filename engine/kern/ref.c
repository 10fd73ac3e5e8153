/* The portable kernels: plain C for every CPU, the fallback, and the definition of the bits
 * every other table (avx2.c, ...) must reproduce; the tests hold each of them to this file.
 *
 * Why fmaf and the odd-looking orders: the vector kernels accumulate with fused multiply-adds
 * (one rounding per step) in a fixed order, so for their results to equal these bit for bit
 * this file must round the same way at the same points. A plain `s += x * w` rounds twice and
 * would differ in the last bits. So:
 *   matmul   each output is one chain s = fmaf(x[k], w[k], s), k = 0, 1, ..., from s = +0;
 *            a Q8_0 weight is first rounded as d * (float)q
 *   dot      16 partial sums (sum j takes the products i with i % 16 == j, the last 8..15
 *            inputs to sums 0..7), folded as ((v0+v4)+(v2+v6))+((v1+v5)+(v3+v7)) with
 *            v[j] = sum[j] + sum[j+8], then the tail of fewer than 8 chained on with fmaf: the
 *            order two 8-lane accumulators and a horizontal add give
 *   axpy     y[i] = fmaf(a, x[i], y[i])
 * Where the CPU has no FMA unit, fmaf is computed in software by libm: slow but exact. The
 * project compiles with -ffp-contract=off so no compiler fuses anything else behind our back.
 *
 * REF_FMA_CLONE: gcc also compiles the fmaf loops for the FMA extension and runs that copy on
 * CPUs that have it (target_clones, chosen at load by the dynamic linker): fmaf becomes one
 * instruction instead of a libm call, with the same bits (fmaf is exactly rounded either way),
 * so the oracle and fallback stays usable on big models and in the tests. The code is still
 * this file's plain C; the hand-written vector kernels remain separate and checked against it. */
#include "engine/kern/kern.h"

#include "engine/dtype.h"
#include "engine/kern/kexp.h"
#include "engine/kern/quant.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

/* Not under ThreadSanitizer: target_clones resolves through an ifunc, which runs before
 * TSan's runtime is up and crashes every program at start. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__FMA__) &&        \
    !defined(__SANITIZE_THREAD__)
#define REF_FMA_CLONE __attribute__((target_clones("fma", "default")))
#else
#define REF_FMA_CLONE
#endif

#define Q8P_QUANTS (2 * KERN_PANEL)
#define Q8P_BLOCK_BYTES (KERN_PANEL * (2 + KERN_QK8_0))

/* Every half's float value (256 KiB), filled once: the conversion's branches cost more than
 * the multiply-add they feed. */
static float g_f16[65536];
static pthread_once_t g_f16_once = PTHREAD_ONCE_INIT;

static void f16_fill(void)
{
    for (uint32_t h = 0; h < 65536; h++)
        g_f16[h] = dtype_f16_to_f32((uint16_t)h);
}

static const float *f16_table(void)
{
    pthread_once(&g_f16_once, f16_fill);
    return g_f16;
}

static inline float f16_at(const float *tab, const uint8_t *p, size_t i)
{
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return tab[h];
}

/* Line k of a panel (the 16 rows' weights at input k) as floats. */
static inline void panel_line(const float *tab, kern_type pt, const uint8_t *wp, size_t k,
                              float w[KERN_PANEL])
{
    if (pt == KERN_F32_PANEL) {
        memcpy(w, wp + k * KERN_PANEL * 4, KERN_PANEL * 4);
    } else if (pt == KERN_F16_PANEL) {
        for (size_t c = 0; c < KERN_PANEL; c++)
            w[c] = f16_at(tab, wp, k * KERN_PANEL + c);
    } else {
        const uint8_t *blk = wp + k / KERN_QK8_0 * Q8P_BLOCK_BYTES;
        const uint8_t *q = blk + Q8P_QUANTS + k % KERN_QK8_0 * KERN_PANEL;
        for (size_t c = 0; c < KERN_PANEL; c++)
            w[c] = f16_at(tab, blk, c) * (float)(int8_t)q[c];
    }
}

REF_FMA_CLONE static void ref_matmul(const kern_mat *m, const float *x, size_t T, size_t ldx,
                                     const float *xp, float *out, size_t ldo, size_t n0, size_t n1,
                                     float *scratch)
{
    (void)xp; /* no pack_x here: always NULL */
    (void)scratch;
    if (m->type == KERN_QUANT_PANEL) {
        kern__quant_matmul_ref(m, x, T, ldx, out, ldo, n0, n1);
        return;
    }
    const float *tab = f16_table();
    size_t K = m->n_in, pbytes = KERN_PANEL * m->row_bytes;
    for (size_t p = n0 / KERN_PANEL; p * KERN_PANEL < n1; p++) {
        const uint8_t *wp = (const uint8_t *)m->data + p * pbytes;
        size_t base = p * KERN_PANEL;
        size_t c0 = n0 > base ? n0 - base : 0;
        size_t c1 = n1 - base < KERN_PANEL ? n1 - base : KERN_PANEL;
        for (size_t t = 0; t < T; t++) {
            float acc[KERN_PANEL] = {0}, w[KERN_PANEL];
            for (size_t k = 0; k < K; k++) {
                panel_line(tab, m->type, wp, k, w);
                float xv = x[t * ldx + k];
                for (size_t c = c0; c < c1; c++)
                    acc[c] = fmaf(xv, w[c], acc[c]);
            }
            for (size_t c = c0; c < c1; c++)
                out[t * ldo + base + c] = acc[c];
        }
    }
}

/* The dot order described at the top, over b's values as floats (bf: F32 or F16 input). */
REF_FMA_CLONE static float dot_any(const float *a, const void *b, int f16, size_t n)
{
    const float *bf = b, *tab = f16_table();
    const uint8_t *bh = b;
#define B_AT(i) (f16 ? f16_at(tab, bh, (i)) : bf[(i)])
    float acc[16] = {0};
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (size_t j = 0; j < 16; j++)
            acc[j] = fmaf(a[i + j], B_AT(i + j), acc[j]);
    for (; i + 8 <= n; i += 8)
        for (size_t j = 0; j < 8; j++)
            acc[j] = fmaf(a[i + j], B_AT(i + j), acc[j]);
    float v[8];
    for (size_t j = 0; j < 8; j++)
        v[j] = acc[j] + acc[j + 8];
    float s = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
    for (; i < n; i++)
        s = fmaf(a[i], B_AT(i), s);
#undef B_AT
    return s;
}

static float ref_dot(const float *a, const float *b, size_t n)
{
    return dot_any(a, b, 0, n);
}

static float ref_dot_f16(const float *a, const uint16_t *b, size_t n)
{
    return dot_any(a, b, 1, n);
}

REF_FMA_CLONE static void ref_axpy(float *y, float a, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = fmaf(a, x[i], y[i]);
}

REF_FMA_CLONE static void ref_axpy_f16(float *y, float a, const uint16_t *x, size_t n)
{
    const float *tab = f16_table();
    for (size_t i = 0; i < n; i++)
        y[i] = fmaf(a, tab[x[i]], y[i]);
}

static void ref_to_f16(uint16_t *dst, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = dtype_f32_to_f16(x[i]);
}

static void ref_rmsnorm(float *out, const float *x, const float *w, size_t n, float eps)
{
    float scale = 1.0f / sqrtf(ref_dot(x, x, n) / (float)n + eps);
    for (size_t i = 0; i < n; i++)
        out[i] = x[i] * scale * w[i];
}

REF_FMA_CLONE static float ref_softmax(float *sc, size_t n, float *max)
{
    float lanes[16];
    for (int j = 0; j < 16; j++)
        lanes[j] = -INFINITY;
    float m = kexp_max_tail(lanes, sc, 0, n);
    for (int j = 0; j < 16; j++)
        lanes[j] = 0.0f;
    *max = m;
    return kexp_sum_tail(lanes, sc, 0, n, m);
}

REF_FMA_CLONE static void ref_silu_mul(float *g, const float *u, size_t n)
{
    for (size_t i = 0; i < n; i++)
        g[i] = kern_silu(g[i]) * u[i];
}

REF_FMA_CLONE static void ref_gelu_mul(float *g, const float *u, size_t n)
{
    for (size_t i = 0; i < n; i++)
        g[i] = kern_gelu(g[i]) * u[i];
}

REF_FMA_CLONE static void ref_softcap(float *x, size_t n, float scale, float cap)
{
    for (size_t i = 0; i < n; i++)
        x[i] = kern_softcap(x[i], scale, cap);
}

const kern_ops kern_ref_ops = {
    .name = "generic",
    .matmul = ref_matmul,
    .dot = ref_dot,
    .dot_f16 = ref_dot_f16,
    .axpy = ref_axpy,
    .axpy_f16 = ref_axpy_f16,
    .to_f16 = ref_to_f16,
    .rmsnorm = ref_rmsnorm,
    .qmatmul = kern_qmatmul_ref,
    .softmax = ref_softmax,
    .silu_mul = ref_silu_mul,
    .gelu_mul = ref_gelu_mul,
    .softcap = ref_softcap,
    .qx_quantize = kern_qx_quantize,
};

void kern_add(float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] += x[i];
}
