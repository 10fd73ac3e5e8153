/* AVX2 integer products (kern/qdot.h) over the file's rows: the type's entry point, each in
 * the file of its family (kern/qdot_rows8.h says how the kernels work), and the interleaved
 * layout handed to kern/qdot_x8_avx2.c. A new type is a file of its kernels, its QROWS8_DEFINE
 * and a line in rows8_for. Built twice, as those files (kern/qdot_rows8.h). */
#include "engine/kern/qdot_rows8.h"

#ifdef KERN_QDOT_VNNI
#define QMATMUL kern__qmatmul_avx2_vnni
#define QMATMUL_X8 kern__qmatmul_x8_avx2_vnni
#else
#define QMATMUL kern__qmatmul_avx2
#define QMATMUL_X8 kern__qmatmul_x8_avx2
#endif

/* The entry point of w's type (kern_qdot_act admits only these) */
static kern_qrows8_fn rows8_for(const kern_mat *w)
{
    if (w->type == KERN_Q8_0)
        return QROWS8(q8_0);
    switch (w->qtype) {
    case KERN_GGML_Q4_0: return QROWS8(q4_0);
    case KERN_GGML_Q4_1: return QROWS8(q4_1);
    case KERN_GGML_Q5_0: return QROWS8(q5_0);
    case KERN_GGML_Q5_1: return QROWS8(q5_1);
    case KERN_GGML_Q2_K: return QROWS8(q2_k);
    case KERN_GGML_Q3_K: return QROWS8(q3_k);
    case KERN_GGML_Q4_K: return QROWS8(q4_k);
    case KERN_GGML_Q5_K: return QROWS8(q5_k);
    case KERN_GGML_IQ4_NL: return QROWS8(iq4_nl);
    case KERN_GGML_IQ4_XS: return QROWS8(iq4_xs);
    case KERN_GGML_MXFP4: return QROWS8(mxfp4);
    default: return QROWS8(q6_k);
    }
}

void QMATMUL(const kern_mat *w, const void *xq, size_t T, float *out, size_t ldo, size_t n0,
             size_t n1)
{
    if (w->type == KERN_QUANT_X8) {
        QMATMUL_X8(w, xq, T, out, ldo, n0, n1);
        return;
    }
    rows8_for(w)(w, xq, T, out, ldo, n0, n1);
}
