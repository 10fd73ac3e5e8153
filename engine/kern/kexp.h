/* Attention's softmax, as one fixed sequence of float operations that every kernel table
 * repeats lane by lane, so its bits are the same whichever table runs (libm's expf is one
 * call per value and has no vector form of the same bits). Header-only: ref.c compiles it
 * plainly, the vector files with their own flags for their tails.
 *
 *   kern_exp(x), x <= 0: k = round(x log2 e) (by adding and subtracting 1.5 * 2^23), the
 *   remainder r = x - k ln 2 in two fused steps (ln 2 split into a high and a low part), e^r
 *   by a degree-7 Taylor polynomial in Horner form with fmaf (|r| <= ln 2 / 2: within 2 ulp of
 *   the true value), times 2^k built in the exponent bits. Below -87 (2^k would not be a normal
 *   float) the result is 0; a NaN stays NaN. Callers pass x = score - max, never above 0.
 *   softmax: the largest value (NaNs passed over; -inf if none; a zero maximum is +0), each
 *   value replaced by kern_exp(value - max), and their sum as 16 partial sums (sum j takes
 *   the values i with i % 16 == j, in order) folded as ((v0+v4)+(v2+v6))+((v1+v5)+(v3+v7))
 *   with v[j] = sum[j] + sum[j+8]: the order of one zmm or two ymm accumulators.
 *   silu_mul: g = kern_silu(g) * u, element by element.
 *   kern_expm1(x), x <= 0: kern_exp's k, r and polynomial but for its last step: q = p * r is
 *   e^r - 1, and the result fmaf(2^k, q, 2^k - 1), so that for |x| < ln 2 / 2 (k = 0) it is q
 *   itself, precise where 1 - e^x would cancel; below -87, -1.
 *   kern_tanh(y) = copysign(-m / (2 + m), y), m = kern_expm1(-2|y|): within a few ulp of tanh.
 *   kern_gelu(x), GELU's tanh approximation 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715
 *   x^3), written as x * sigmoid(2u) (the same function) through kern_exp(-|2u|) as kern_silu:
 *   no 1 + tanh(u) cancelling for negative x. gelu_mul: g = kern_gelu(g) * u.
 *   softcap: x = cap * kern_tanh(x * scale / cap), Gemma 2's soft-capping of scores and logits.
 * glibc's tanhf (through expm1f) has no vector form: one call per value was a fifth of a Gemma 2
 * prefill (perf, TinyLlama's shape, 512 tokens). */
#ifndef KVS_ENGINE_KERN_KEXP_H
#define KVS_ENGINE_KERN_KEXP_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define KEXP_MIN (-87.0f)
#define KEXP_LOG2E 0x1.715476p+0f
#define KEXP_SHIFT 0x1.8p23f
#define KEXP_LN2_HI 0x1.62e43p-1f
#define KEXP_LN2_LO (-0x1.05c61p-29f)
/* 1/7!, 1/6!, ..., 1/1!, 1/0! */
#define KEXP_C7 0x1.a01a02p-13f
#define KEXP_C6 0x1.6c16c2p-10f
#define KEXP_C5 0x1.111112p-7f
#define KEXP_C4 0x1.555556p-5f
#define KEXP_C3 0x1.555556p-3f
#define KEXP_C2 0x1p-1f

/* kern_exp's and kern_expm1's common steps for x in [-87, 0]: returns p = (e^r - 1) / r, the
 * remainder r in *r and 2^k in *s */
static inline float kexp_poly(float x, float *r_out, float *s)
{
    float k = fmaf(x, KEXP_LOG2E, KEXP_SHIFT) - KEXP_SHIFT;
    float r = fmaf(k, -KEXP_LN2_HI, x);
    r = fmaf(k, -KEXP_LN2_LO, r);
    float p = fmaf(KEXP_C7, r, KEXP_C6);
    p = fmaf(p, r, KEXP_C5);
    p = fmaf(p, r, KEXP_C4);
    p = fmaf(p, r, KEXP_C3);
    p = fmaf(p, r, KEXP_C2);
    p = fmaf(p, r, 1.0f);
    uint32_t bits = (uint32_t)((int32_t)k + 127) << 23;
    memcpy(s, &bits, sizeof *s);
    *r_out = r;
    return p;
}

static inline float kern_exp(float x)
{
    if (!(x >= KEXP_MIN))
        return x != x ? x : 0.0f;
    float r, s, p = kexp_poly(x, &r, &s);
    return fmaf(p, r, 1.0f) * s;
}

/* The MLP's SiLU, x / (1 + e^-x), through kern_exp of -|x| only: x / (1 + e) for x >= 0 and
 * (x * e) / (1 + e) below, e = kern_exp(-|x|). */
static inline float kern_silu(float x)
{
    float e = kern_exp(-fabsf(x));
    return (x >= 0.0f ? x : x * e) / (1.0f + e);
}

/* GELU's constants: 2 sqrt(2 / pi) (2u's factor) and the cubic's */
#define KGELU_2K 0x1.988454p+0f
#define KGELU_A 0.044715f

static inline float kern_expm1(float x)
{
    if (!(x >= KEXP_MIN))
        return x != x ? x : -1.0f;
    float r, s, p = kexp_poly(x, &r, &s);
    return fmaf(s, p * r, s - 1.0f);
}

static inline float kern_tanh(float y)
{
    float m = kern_expm1(-2.0f * fabsf(y));
    return copysignf(-m / (2.0f + m), y);
}

/* 2u = KGELU_2K * (x + KGELU_A x^3), the cubic as fmaf(KGELU_A * (x * x), x, x) */
static inline float kern_gelu(float x)
{
    float v = KGELU_2K * fmaf(KGELU_A * (x * x), x, x);
    float e = kern_exp(-fabsf(v));
    return (v >= 0.0f ? x : x * e) / (1.0f + e);
}

static inline float kern_softcap(float x, float scale, float cap)
{
    return cap * kern_tanh(x * scale / cap);
}

/* The max fold: a > m replaces m (so NaNs are passed over). */
static inline float kexp_max(float m, float a)
{
    return a > m ? a : m;
}

/* The sum's final fold of 16 partial sums. */
static inline float kexp_fold16(const float s[16])
{
    float v[8];
    for (int j = 0; j < 8; j++)
        v[j] = s[j] + s[j + 8];
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

/* The softmax's scalar part, after a vector kernel did sc[0 .. i0) (i0 a multiple of 16; the
 * reference: i0 = 0) into its lanes: the maximum of the lanes' maxima and the tail's (zero as
 * +0), then */
static inline float kexp_max_tail(const float lane_max[16], const float *sc, size_t i0, size_t n)
{
    float m = -INFINITY;
    for (int j = 0; j < 16; j++)
        m = kexp_max(m, lane_max[j]);
    for (size_t i = i0; i < n; i++)
        m = kexp_max(m, sc[i]);
    return m == 0.0f ? 0.0f : m;
}

/* the tail's values replaced by kern_exp(value - m) and added to their lanes' sums, whose fold
 * is returned. */
static inline float kexp_sum_tail(float lane_sum[16], float *sc, size_t i0, size_t n, float m)
{
    for (size_t i = i0; i < n; i++) {
        sc[i] = kern_exp(sc[i] - m);
        lane_sum[i % 16] += sc[i];
    }
    return kexp_fold16(lane_sum);
}

#endif
