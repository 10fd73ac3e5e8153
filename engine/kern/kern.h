/* The forward pass's CPU kernels as one table of operations (struct kern_ops), one table per
 * instruction set, chosen once at start from CPUID (kern_select). Every table computes the same
 * bits as the portable one (ref.c), which defines the arithmetic: the order of every sum and
 * where a multiply-add is fused (see ref.c's top comment). So the kernels chosen never change a
 * result, and the reference is the oracle the tests hold every other table to.
 *
 * Weight matrices are kept in one layout, panels (panel.c): rows in panels of KERN_PANEL, each
 * panel stored k-major ([n_in][KERN_PANEL]: the panel's k-th values side by side, one contiguous
 * stream; for Q8_0, per block of 32 inputs the 16 rows' f16 scales, then the [32][16] int8
 * values), the last panel padded with zero rows. Panel products are batch-invariant: an output is
 * one in-order FMA chain over k, whatever the batch and the column range, so a row's bits do not
 * depend on the rows it is batched with (what makes a cached step equal a recomputation).
 * Weights are multiplied exactly as widened F32 values (an F16 value, or scale * int8 rounded to
 * float; the block-quantized types Q4_0 .. Q6_K, IQ4_NL, IQ4_XS, MXFP4 have panels of their own,
 * kern/quant.h, whose values are engine/dtype's to_f32 bit for bit). Every operation is
 * single-threaded; the engine splits columns between its threads.
 *
 * Adding an instruction set: a file kern/<isa>.c compiled with its own flags (engine/meson.build),
 * its table declared below, a row in kern.c's list with its CPUID test. */
#ifndef KVS_ENGINE_KERN_KERN_H
#define KVS_ENGINE_KERN_KERN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What a weight matrix holds. The row types describe a file's rows, the input of packing; every
 * product takes the panel types only. */
typedef enum kern_type {
    KERN_F32,
    KERN_F16,
    KERN_Q8_0,
    KERN_QUANT, /* rows of the blocks of a ggml quantized type (kern_mat.qtype) */
    KERN_F32_PANEL,
    KERN_F16_PANEL,
    KERN_Q8_0_PANEL,
    KERN_QUANT_PANEL, /* kern/quant.h */
    KERN_QUANT_X8     /* the integer path's rows 8 at a time, interleaved (kern/qdot_pack.c;
                         Q4_0 .. Q5_1, Q8_0, Q2_K .. Q6_K, IQ4_NL, IQ4_XS, MXFP4) */
} kern_type;

#define KERN_PANEL 16
#define KERN_QK8_0 32 /* inputs per Q8_0 block: an f16 scale and 32 int8 */

static inline int kern_is_panel(kern_type t)
{
    return t == KERN_F32_PANEL || t == KERN_F16_PANEL || t == KERN_Q8_0_PANEL ||
           t == KERN_QUANT_PANEL;
}

/* A weight matrix of n_out rows of n_in inputs. Row types: row-major, F32/F16 rows of n_in
 * values, Q8_0 rows of n_in / 32 blocks (n_in % 32 == 0). Panel types: see above. */
typedef struct kern_mat {
    kern_type type;
    const void *data;
    size_t n_out, n_in;
    size_t row_bytes; /* bytes of one row's values, in either layout */
    uint32_t qtype;   /* KERN_QUANT / KERN_QUANT_PANEL: the ggml type id; else 0 */
} kern_mat;

/* ---- panel.c: layout (the same in every table) ---- */

/* Fills m from its parts; row_bytes from type and n_in (for panel types the data holds
 * ceil(n_out / KERN_PANEL) * KERN_PANEL rows). */
void kern_mat_init(kern_mat *m, kern_type type, const void *data, size_t n_out, size_t n_in);
/* Values per block of ggml type id if it has quantized panels here (Q4_0, Q4_1, Q5_0, Q5_1,
 * Q2_K .. Q6_K, IQ4_NL, IQ4_XS, MXFP4: 32 or 256), else 0. */
size_t kern_quant_block(uint32_t ggml_type);
/* kern_mat_init for KERN_QUANT rows or KERN_QUANT_PANEL of a type kern_quant_block knows
 * (n_in a multiple of its block). */
void kern_mat_init_quant(kern_mat *m, kern_type type, uint32_t ggml_type, const void *data,
                         size_t n_out, size_t n_in);
/* Bytes kern_mat_to_panels writes for src (F32, F16, Q8_0 or KERN_QUANT rows); 0 for panel
 * types. */
size_t kern_panel_bytes(const kern_mat *src);
/* Copies F32 / F16 / Q8_0 / KERN_QUANT rows src into dst (kern_panel_bytes(src), any alignment)
 * as the matching panel type, described in out. Values are kept bit for bit. */
void kern_mat_to_panels(const kern_mat *src, void *dst, kern_mat *out);
/* Widens rows r0..r0+nr-1 of a panel matrix, or of F32 / F16 / Q8_0 / KERN_QUANT rows, to F32
 * into dst ([nr][n_in]): exact values (llama.cpp's dequantizer's). */
void kern_rows_to_f32(const kern_mat *w, size_t r0, size_t nr, float *dst);

/* ---- the operations ---- */

/* The integer path's activation formats (kern/qdot_ref.c, below) */
typedef enum kern_qx {
    KERN_QX_NONE, /* no integer kernel for this weight type: it keeps its F32 panels */
    KERN_QX_32,   /* per 32 inputs a float d, the int16 sum and int8 q[32] (Q8_0, Q4_0 .. Q5_1,
                     IQ4_NL, MXFP4) */
    KERN_QX_256   /* per 256: float d, int16 sums of each 16 q, int8 q[256] (Q2_K .. Q6_K,
                     IQ4_XS) */
} kern_qx;

/* A run of F16 cache rows as attention reads it: m rows (a KV block's positions) stride bytes
 * apart, n values each, for g heads; head h's rows start at b + h * bh (bh = 0: every head reads
 * the same rows, the query heads of one kv head under grouped-query attention). */
typedef struct kern_run {
    const void *b;
    size_t bh, stride;
    size_t g, m, n;
} kern_run;

typedef struct kern_ops {
    const char *name; /* "generic", "avx2", "avx512": what --kernels takes and /metrics shows */
    /* NULL, or how this copy of a table differs from the one --kernels NAME forces (the
     * start-up log line prints it) */
    const char *note;
    /* out[t * ldo + n] = sum_k x[t * ldx + k] * W[n][k] for t < T and n0 <= n < n1, W of a panel
     * type. xp: NULL, or x as this table's pack_x laid it out (T * n_in floats), which its F16 /
     * F32 row tiles then read. scratch: KERN_PANEL * n_in floats or NULL, in which a Q8_0 panel
     * read by several row tiles may be widened once (also a quantized one). The bits are the
     * same with or without either. */
    void (*matmul)(const kern_mat *w, const float *x, size_t T, size_t ldx, const float *xp,
                   float *out, size_t ldo, size_t n0, size_t n1, float *scratch);
    /* NULL, or: copies values [k0, k1) of rows t < T of x (ldx apart, K values each) into xp
     * (T * K floats) in the order matmul's row tiles read them, for matmul's xp; calls for
     * ranges that cover [0, K) lay out all of it (threads may take a range each). A caller packs
     * a step's input once and every product of it (Q, K and V; gate and up) reads the copy. */
    void (*pack_x)(const float *x, size_t T, size_t ldx, size_t K, size_t k0, size_t k1, float *xp);
    /* The fewest rows of x for which pack_x pays for its pass (below, the row tiles are short
     * enough to read x's rows as fast) */
    size_t pack_min_rows;
    float (*dot)(const float *a, const float *b, size_t n);
    /* b in F16 (the KV cache's F16 type) */
    float (*dot_f16)(const float *a, const uint16_t *b, size_t n);
    /* y += a * x, one fused multiply-add per element */
    void (*axpy)(float *y, float a, const float *x, size_t n);
    void (*axpy_f16)(float *y, float a, const uint16_t *x, size_t n);
    /* dst = x rounded to F16 (to nearest even, as ggml_fp32_to_fp16) */
    void (*to_f16)(uint16_t *dst, const float *x, size_t n);
    /* out = x / rms(x) * w, the sum of squares as dot(x, x) */
    void (*rmsnorm)(float *out, const float *x, const float *w, size_t n, float eps);
    /* The integer path (kern/qdot_ref.c): out[t * ldo + n] for t < T, n0 <= n < n1, of file rows
     * w (kern_qdot_act(w) != KERN_QX_NONE) times activations xq quantized by kern_qx_quantize.
     * NULL: kern_qmatmul_ref (the same bits). */
    void (*qmatmul)(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo, size_t n0,
                    size_t n1);
    /* Attention's runs of cache rows (kern_run) for r->g heads at once: for h < g,
     * out[h * ldo + i] = dot_f16(a + h * lda, row i of head h, n) for i < m, and
     * axpy_f16(y + h * ldy, w[h * ldw + i], row i of head h, n) for i = 0, 1, ..., m - 1 in
     * turn; the bits of those calls, without a call and a horizontal sum per row, and where the
     * heads share their rows (GQA: bh = 0) each row widened once for all of them. NULL:
     * kern_dot_f16_n / kern_axpy_f16_n below make the calls. */
    void (*dot_f16_n)(const kern_run *r, const float *a, size_t lda, float *out, size_t ldo);
    void (*axpy_f16_n)(const kern_run *r, float *y, size_t ldy, const float *w, size_t ldw);
    /* Attention's softmax of sc[0 .. n) in place (kern/kexp.h: the order and the exp): each
     * value becomes kern_exp(value - max); returns their sum, the max in *max. */
    float (*softmax)(float *sc, size_t n, float *max);
    /* g[i] = kern_silu(g[i]) * u[i] (kern/kexp.h), the gated MLP's activation */
    void (*silu_mul)(float *g, const float *u, size_t n);
    /* g[i] = kern_gelu(g[i]) * u[i], Gemma's gated MLP */
    void (*gelu_mul)(float *g, const float *u, size_t n);
    /* x[i] = kern_softcap(x[i], scale, cap): Gemma 2's scores (scale the attention's) and
     * logits (scale 1) */
    void (*softcap)(float *x, size_t n, float scale, float cap);
    /* kern_qx_quantize's bytes (kern/qx_quant.h, vectorized by the table's flags). NULL:
     * kern_qx_quantize. */
    void (*qx_quantize)(kern_qx fmt, const float *x, size_t T, size_t ldx, size_t n_in, void *dst);
} kern_ops;

/* Row i of head h of a run. */
static inline const uint16_t *kern_run_row(const kern_run *r, size_t h, size_t i)
{
    return (const uint16_t *)(const void *)((const uint8_t *)r->b + h * r->bh + i * r->stride);
}

/* k's dot_f16_n, or its dot_f16 g x m times (the same bits). */
static inline void kern_dot_f16_n(const kern_ops *k, const kern_run *r, const float *a, size_t lda,
                                  float *out, size_t ldo)
{
    if (k->dot_f16_n) {
        k->dot_f16_n(r, a, lda, out, ldo);
        return;
    }
    for (size_t h = 0; h < r->g; h++)
        for (size_t i = 0; i < r->m; i++)
            out[h * ldo + i] = k->dot_f16(a + h * lda, kern_run_row(r, h, i), r->n);
}

/* k's axpy_f16_n, or its axpy_f16 m times in order for each head (the same bits). */
static inline void kern_axpy_f16_n(const kern_ops *k, const kern_run *r, float *y, size_t ldy,
                                   const float *w, size_t ldw)
{
    if (k->axpy_f16_n) {
        k->axpy_f16_n(r, y, ldy, w, ldw);
        return;
    }
    for (size_t h = 0; h < r->g; h++)
        for (size_t i = 0; i < r->m; i++)
            k->axpy_f16(y + h * ldy, w[h * ldw + i], kern_run_row(r, h, i), r->n);
}

/* ---- kern/qdot_ref.c: the integer path (activations quantized per row) ----
 * Each row of x (one token) is quantized alone to int8 blocks with a float scale, so a row's
 * result never depends on the batch; weights stay the file's rows (read in place). A block's
 * integer sums are exact; the float combination is one fixed order, written out in qdot_ref.c,
 * which every table's qmatmul equals bit for bit. Results differ from the F32 panels' (the
 * activations are rounded to 8 bits), hence the --activations switch (engine_load_params). */

/* The activation format the integer product of rows w takes (w of row type KERN_Q8_0 or
 * KERN_QUANT): Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K .. Q6_K, IQ4_NL, IQ4_XS, MXFP4 have one; the
 * unquantized types KERN_QX_NONE. */
kern_qx kern_qdot_act(const kern_mat *w);
/* Bytes of one quantized row of n_in inputs (n_in a multiple of the format's block). */
size_t kern_qx_row_bytes(kern_qx fmt, size_t n_in);
/* Quantizes rows t < T of x (ldx apart) into dst (T rows of kern_qx_row_bytes): per block,
 * d = max|x| / 127, q = x * (127 / max|x|) rounded to nearest even (all zero if max|x| is 0 or
 * below 127 / FLT_MAX, whose reciprocal would overflow); a NaN input gets q = 0. */
void kern_qx_quantize(kern_qx fmt, const float *x, size_t T, size_t ldx, size_t n_in, void *dst);
/* Bytes kern_qdot_to_x8 writes for src: KERN_QUANT rows of a type with an integer product, or
 * KERN_Q8_0 rows, with n_out a multiple of 8 (the integer path's interleaved layout,
 * kern/qdot_pack.c); 0 for any other matrix. */
size_t kern_qdot_x8_bytes(const kern_mat *src);
/* Copies src (kern_qdot_x8_bytes(src) > 0) into dst (that many bytes) as KERN_QUANT_X8, described
 * in out (which may be src): the same values, every table's qmatmul the same bits. */
void kern_qdot_to_x8(const kern_mat *src, void *dst, kern_mat *out);

/* 1 where the avx512 table's integer products over the interleaved groups run from 32 rows of x
 * on the AMX tile unit (kern/qdot_amx.c; every type but IQ4_XS): the CPU has AMX-INT8 and the OS
 * granted it to this process (asked once). */
int kern_amx(void);
/* The portable integer product: the oracle of every table's qmatmul. */
void kern_qmatmul_ref(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo,
                      size_t n0, size_t n1);

/* The portable table: plain C, for every CPU; the tests' oracle. */
extern const kern_ops kern_ref_ops;
#ifdef KERN_HAVE_AVX2
/* AVX2 + FMA + F16C (kern/avx2.c). */
extern const kern_ops kern_avx2_ops;
#endif
#ifdef KERN_HAVE_AVX512
/* AVX-512 F+BW+VL+DQ + FMA + F16C (kern/avx512.c, kern/quant_avx512.c). */
extern const kern_ops kern_avx512_ops;
/* The same with the AVX2 table's F16 / F32 / Q8_0 panel products (kern/avx512.c): what "auto"
 * picks where kern_cpu_avx512_halves(). */
extern const kern_ops kern_avx512_halves_ops;
/* The same with F16 pair tiles that convert their own halves in every pass (kern/avx512.c):
 * what "auto" picks where kern_cpu_cvtph_free(). */
extern const kern_ops kern_avx512_cvt_ops;
/* The AVX2 table's matmul (kern/avx2.c), for kern_avx512_halves_ops. */
void kern__avx2_matmul(const kern_mat *w, const float *x, size_t T, size_t ldx, const float *xp,
                       float *out, size_t ldo, size_t n0, size_t n1, float *scratch);
#endif
#ifdef KERN_HAVE_AVX512_EMU
/* The same sources over simde on AVX2 + FMA ("avx512-emulated"): linked into tests only, so the
 * AVX-512 kernels are held to the reference on CPUs without AVX-512; never a --kernels choice. */
extern const kern_ops kern_avx512_emu_ops;
#endif

/* y += x: a plain loop whose bits do not depend on the instruction set, shared by every table. */
void kern_add(float *y, const float *x, size_t n);

/* ---- kern.c: the choice ---- */

/* Instruction sets by name, in order of preference. */
#define KERN_ISA_NAMES "auto|avx512|avx2|generic"

/* Whether this CPU (and its OS, which must save the wider registers) can run the named table:
 * 1 yes, 0 no; -1 if kvserve has no such table (unknown name, or not built into this one). */
int kern_cpu_can(const char *name);
/* The table for name: NULL or "auto" picks the best this CPU runs (avx512 > avx2 > generic;
 * avx512 needs AVX512F+BW+VL+DQ, FMA, F16C and an OS saving the ZMM and opmask state; where
 * kern_cpu_avx512_halves(), kern_avx512_halves_ops; where kern_cpu_cvtph_free(),
 * kern_avx512_cvt_ops);
 * "avx512" / "avx2" / "generic" force one. Returns 0 and *out, or KVS_EINVAL (unknown name),
 * KVS_EUNSUPPORTED (not built into this kvserve, or the CPU lacks it) with one line in err. */
int kern_select(const char *name, const kern_ops **out, char *err, size_t err_len);
/* Whether this CPU runs AVX-512 as two 256-bit halves (AMD family 19h: Zen 4), where "auto"
 * picks kern_avx512_halves_ops over kern_avx512_ops; false elsewhere and off x86. */
bool kern_cpu_avx512_halves(void);
/* Whether this CPU's vcvtph2ps (16 halves to floats) issues beside its FMAs rather than on
 * their ports, so that the F16 pair tiles convert for free (AMD family 1Ah on: Zen 5), where
 * "auto" picks kern_avx512_cvt_ops; false elsewhere (Intel: two uops on the FMA ports). */
bool kern_cpu_cvtph_free(void);
/* The CPU's vector features as one short line ("avx2 fma f16c; no avx512f avx512bw ..."; the
 * AVX-512 ones: f, bw, vl, dq, vnni, bf16), for logs. */
const char *kern_cpu_features(void);

#endif
