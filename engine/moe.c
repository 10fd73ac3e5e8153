/* The mixture-of-experts MLP (Qwen3-30B-A3B's qwen3moe, Mixtral's llama layout): a router
 * (ffn_gate_inp) scores every expert for each token, the token goes through the n_expert_used
 * most probable experts' SwiGLU MLPs (ffn_{gate,up,down}_exps: each expert a matrix of the
 * stack), and their outputs, weighted by the selected probabilities renormalized to sum to 1,
 * are summed. As llama.cpp's build_moe_ffn with softmax gating and normalized weights: the
 * experts in descending order of probability (ties: the lower index), each output times its
 * weight, then summed from the first in that order, so the sum is what llama.cpp adds up.
 * ernie4_5-moe picks its experts on the probabilities plus a per-expert bias (exp_probs_b), the
 * weights still the unbiased probabilities renormalized; lfm2moe the same on sigmoid gating
 * (each score's sigmoid in place of the softmax).
 * gpt-oss (arch_gpt_oss.c) routes and activates its own way (engine_arch.moe_route, moe_act):
 * the router's bias added, the k highest logits weighed by a softmax over them, the experts'
 * biases added, its clamped SwiGLU.
 *
 * A step groups its rows by expert and runs each expert's products over its rows together (a
 * prompt's 512 rows give an expert of 128 about 32 rows). On the integer path (--activations q8
 * and quantized experts, what users run) every expert's gate and up are one pool job and every
 * down another: a decode step's 8 experts in 2 hand-offs instead of 16, each with enough work
 * items for both threads. Other weights take each expert's products in turn (forward.c's
 * engine__matmuls). A row's products do not depend on the rows beside it (the kernels'
 * property), and its routing and sum read only that row, so a row gives the same bits in any
 * batch: cached = recomputed holds. */
#include "engine/arch.h"

#include "common/status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct engine_moe_buf {
    float *logits;   /* (max_tokens, n_expert) the router's scores, then probabilities */
    float *scratch;  /* (n_expert) a row's probabilities plus a selection bias */
    int32_t *sel;    /* (max_tokens, n_used) each row's experts, most probable first */
    float *weight;   /* (max_tokens, n_used) their weights */
    uint32_t *first; /* (n_expert + 1) where each expert's rows begin in order */
    uint32_t *order; /* (max_tokens * n_used) row * n_used + k, grouped by expert */
    uint32_t *act;   /* (n_expert) the experts with rows this step */
    uint32_t *item0; /* (n_expert + 1) the first work item of each of them */
    float *in;       /* (max_tokens * n_used, n_embd) the rows of each expert, in order */
    float *gate;     /* (max_tokens * n_used, n_ff_exp) the experts' SwiGLU, rows in order */
    float *up;       /* (max_tokens * n_used, n_ff_exp) */
    float *y;        /* (max_tokens, n_used, n_embd) each row's weighted expert outputs */
    void *xq[2];     /* (max_tokens * n_used) rows quantized, KERN_QX_32 and KERN_QX_256 */
};

engine_moe_buf *engine__moe_buf_create(const engine_model *m, uint32_t max_tokens)
{
    const engine_hparams *hp = &m->hp;
    size_t T = max_tokens, E = hp->n_embd, X = hp->n_expert, K = hp->n_expert_used,
           F = hp->n_ff_exp, max_in = E > F ? E : F;
    engine_moe_buf *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->logits = malloc(T * X * sizeof *b->logits);
    b->scratch = malloc(X * sizeof *b->scratch);
    b->sel = malloc(T * K * sizeof *b->sel);
    b->weight = malloc(T * K * sizeof *b->weight);
    b->first = malloc((X + 1) * sizeof *b->first);
    b->order = malloc(T * K * sizeof *b->order);
    b->act = malloc(X * sizeof *b->act);
    b->item0 = malloc((X + 1) * sizeof *b->item0);
    b->in = malloc(T * K * E * sizeof *b->in);
    b->gate = malloc(T * K * F * sizeof *b->gate);
    b->up = malloc(T * K * F * sizeof *b->up);
    b->y = malloc(T * K * E * sizeof *b->y);
    bool ok = b->logits && b->scratch && b->sel && b->weight && b->first && b->order && b->act &&
              b->item0 && b->in && b->gate && b->up && b->y;
    /* bytes per input of either format < 40 / 32 (kern_qx_row_bytes), as forward.c's */
    for (int f = 0; f < 2 && m->n_qdot; f++)
        ok = ok && (b->xq[f] = malloc(T * K * (max_in / 32 + 1) * 40));
    if (!ok) {
        engine__moe_buf_destroy(b);
        return NULL;
    }
    return b;
}

void engine__moe_buf_destroy(engine_moe_buf *b)
{
    if (!b)
        return;
    free(b->logits);
    free(b->scratch);
    free(b->sel);
    free(b->weight);
    free(b->first);
    free(b->order);
    free(b->act);
    free(b->item0);
    free(b->in);
    free(b->gate);
    free(b->up);
    free(b->y);
    free(b->xq[0]);
    free(b->xq[1]);
    free(b);
}

bool engine__layer_moe(const engine_model *m, uint32_t l)
{
    return m->hp.n_expert && (!m->moe_dense || (l >= m->moe_lead && (l + 1) % m->moe_step == 0));
}

int engine__load_moe(engine_model *m, uint32_t l, char *err, size_t err_len)
{
    const engine_hparams *hp = &m->hp;
    uint64_t E = hp->n_embd, F = hp->n_ff_exp, X = hp->n_expert;
    layer_weights *w = &m->layers[l];
    int rc =
        engine__load_layer_mat(m, l, "ffn_gate_inp.weight", E, X, true, &w->router, err, err_len);
    if (rc)
        return rc;
    /* Mixtral files converted before llama.cpp stacked the experts (early 2024) hold one tensor
     * per expert; llama.cpp no longer reads them either. */
    char name[96];
    snprintf(name, sizeof name, "blk.%u.ffn_gate.0.weight", l);
    if (gguf_find_tensor(m->file, name) >= 0)
        return status_set_err(err, err_len, KVS_EUNSUPPORTED,
                              "%s: experts stored one tensor each (an old conversion) are not "
                              "supported; convert the model again with llama.cpp's "
                              "convert_hf_to_gguf.py, which stacks them in ffn_*_exps",
                              name);
    w->experts = calloc(X * 3, sizeof *w->experts);
    if (!w->experts)
        return status_set_err(err, err_len, KVS_ENOMEM, "out of memory");
    static const char *const names[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight",
                                         "ffn_down_exps.weight"};
    for (int i = 0; i < 3; i++) {
        uint64_t params = m->n_params, bytes = m->weight_bytes;
        if ((rc = engine__load_layer_experts(m, l, names[i], i < 2 ? E : F, i < 2 ? F : E,
                                             (uint32_t)X, w->experts + i, 3, err, err_len)))
            return rc;
        m->expert_params += m->n_params - params;
        m->expert_bytes += m->weight_bytes - bytes;
    }
    /* a shared expert (granitemoeshared, ernie4_5-moe: expert_shared_feed_forward_length) */
    uint64_t S = hp->n_ff_shexp;
    if (S && ((rc = engine__load_layer_mat(m, l, "ffn_gate_shexp.weight", E, S, true, &w->sh_gate,
                                           err, err_len)) ||
              (rc = engine__load_layer_mat(m, l, "ffn_up_shexp.weight", E, S, true, &w->sh_up, err,
                                           err_len)) ||
              (rc = engine__load_layer_mat(m, l, "ffn_down_shexp.weight", S, E, true, &w->sh_down,
                                           err, err_len))))
        return rc;
    return 0;
}

/* The k largest of p[0..n) into sel, largest first, and their values into val: repeated
 * arg-max, so ties go to the lower index (and a NaN score cannot index out of range). */
static void top_k(const float *p, uint32_t n, uint32_t k, int32_t *sel, float *val)
{
    for (uint32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (uint32_t e = 0; e < n; e++) {
            bool taken = false;
            for (uint32_t i = 0; i < j && !taken; i++)
                taken = sel[i] == (int32_t)e;
            if (!taken && (best < 0 || p[e] > p[best]))
                best = (int32_t)e;
        }
        sel[j] = best;
        val[j] = p[best];
    }
}

/* Row t's experts and weights from its router scores p (n_expert, overwritten with the
 * probabilities): softmax (or with sigmoid, each score's sigmoid: lfm2moe), the k largest (repeated
 * arg-max, so ties go to the lower index), and their probabilities over their sum (at least 2^-14,
 * as llama.cpp clamps it). With a selection bias sb (n_expert; ernie4_5-moe's exp_probs_b, NULL:
 * none) the k largest of p + sb are picked, their weights still their unbiased probabilities
 * (llama.cpp's build_moe_ffn with probs_b); scratch (n_expert) holds the biased ones. */
static void route_row(float *p, uint32_t n, uint32_t k, bool sigmoid, const float *sb,
                      float *scratch, int32_t *sel, float *weight)
{
    if (sigmoid) { /* ggml's sigmoid gating: each expert's probability on its own */
        for (uint32_t e = 0; e < n; e++)
            p[e] = 1.0f / (1.0f + expf(-p[e]));
    } else {
        float mx = p[0];
        for (uint32_t e = 1; e < n; e++)
            mx = p[e] > mx ? p[e] : mx;
        double sum = 0;
        for (uint32_t e = 0; e < n; e++) {
            p[e] = expf(p[e] - mx);
            sum += p[e];
        }
        float inv = (float)(1.0 / sum);
        for (uint32_t e = 0; e < n; e++)
            p[e] *= inv;
    }
    if (sb) {
        for (uint32_t e = 0; e < n; e++)
            scratch[e] = p[e] + sb[e];
        top_k(scratch, n, k, sel, weight);
        for (uint32_t j = 0; j < k; j++)
            weight[j] = p[sel[j]];
    } else {
        top_k(p, n, k, sel, weight);
    }
    float wsum = 0;
    for (uint32_t j = 0; j < k; j++)
        wsum += weight[j];
    wsum = wsum > 6.103515625e-5f ? wsum : 6.103515625e-5f;
    for (uint32_t j = 0; j < k; j++)
        weight[j] /= wsum;
}

/* Row t's experts and weights from its router scores p (n_expert) as gpt-oss routes: the k
 * highest scores (repeated arg-max, ties to the lower index), weighed by a softmax over those k
 * (llama.cpp's softmax_weight gating). */
static void route_row_topk(const float *p, uint32_t n, uint32_t k, int32_t *sel, float *weight)
{
    top_k(p, n, k, sel, weight);
    float mx = weight[0], sum = 0; /* the first is the largest */
    for (uint32_t j = 0; j < k; j++) {
        weight[j] = expf(weight[j] - mx);
        sum += weight[j];
    }
    for (uint32_t j = 0; j < k; j++)
        weight[j] *= 1.0f / sum;
}

/* Expert e's activation over rows [0, rows) (ld floats apart) of its gate and up outputs,
 * columns [n0, n1): its biases added first where the layer has them, the result in gate. */
static void expert_act(const engine_ctx *c, const layer_weights *w, uint32_t e, float *gate,
                       float *up, size_t ld, size_t rows, size_t n0, size_t n1)
{
    size_t F = c->m->hp.n_ff_exp;
    for (size_t t = 0; t < rows; t++) {
        float *g = gate + t * ld + n0, *u = up + t * ld + n0;
        if (w->exp_b[0]) {
            kern_add(g, w->exp_b[0] + (size_t)e * F + n0, n1 - n0);
            kern_add(u, w->exp_b[1] + (size_t)e * F + n0, n1 - n0);
        }
        if (c->m->arch->moe_act == ENGINE_MOE_SILU) {
            c->kern->silu_mul(g, u, n1 - n0);
            continue;
        }
        for (size_t i = 0; i < n1 - n0; i++) { /* ggml's swiglu_oai, alpha 1.702, limit 7 */
            float x = g[i] < 7.0f ? g[i] : 7.0f;
            float y = u[i] < -7.0f ? -7.0f : u[i] > 7.0f ? 7.0f : u[i];
            g[i] = x / (1.0f + expf(-1.702f * x)) * (y + 1.0f);
        }
    }
}

/* Work items of 64 output columns, as forward.c's products; a gate-and-up item takes its
 * expert's rows 64 at a time through both products and the SiLU (forward.c's GLU_ROWS). */
#define EXP_CHUNK 64
#define EXP_ROWS 64

/* The experts' products on the integer path over every expert's rows (b->first) at once: mat 0
 * the gate and up with the SiLU (into b->gate), mat 2 the down (into b->in). */
typedef struct expert_job {
    engine_ctx *c;
    const layer_weights *w;
    const engine_moe_buf *b;
    uint32_t mat, n_act;
    size_t ldo; /* floats per output row */
} expert_job;

/* Input rows r of matrix a's product: the quantized rows of its format. */
static const uint8_t *expert_xq(const expert_job *j, const kern_mat *a, size_t r)
{
    kern_qx fmt = kern_qdot_act(a);
    return (const uint8_t *)j->b->xq[fmt == KERN_QX_256] + r * kern_qx_row_bytes(fmt, a->n_in);
}

static void expert_qmatmul(const expert_job *j, const kern_mat *a, size_t r, size_t n, float *out,
                           size_t n0, size_t n1)
{
    (j->c->kern->qmatmul ? j->c->kern->qmatmul : kern_qmatmul_ref)(a, expert_xq(j, a, r), n, out,
                                                                   j->ldo, n0, n1);
}

static void expert_item(void *arg, uint32_t i, uint32_t ith)
{
    (void)ith;
    const expert_job *j = arg;
    const engine_moe_buf *b = j->b;
    uint32_t lo = 0, hi = j->n_act; /* the active expert whose items hold i */
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (b->item0[mid] <= i)
            lo = mid;
        else
            hi = mid;
    }
    uint32_t e = b->act[lo];
    size_t r0 = b->first[e], n = b->first[e + 1] - r0;
    const kern_mat *a = &j->w->experts[e * 3 + j->mat];
    size_t n0 = (size_t)(i - b->item0[lo]) * EXP_CHUNK;
    size_t n1 = a->n_out - n0 < EXP_CHUNK ? a->n_out : n0 + EXP_CHUNK;
    if (j->mat == 2) {
        expert_qmatmul(j, a, r0, n, b->in + r0 * j->ldo, n0, n1);
        return;
    }
    const kern_mat *u = &j->w->experts[e * 3 + 1];
    for (size_t t0 = 0; t0 < n; t0 += EXP_ROWS) {
        size_t t1 = n - t0 < EXP_ROWS ? n : t0 + EXP_ROWS;
        expert_qmatmul(j, a, r0 + t0, t1 - t0, b->gate + (r0 + t0) * j->ldo, n0, n1);
        expert_qmatmul(j, u, r0 + t0, t1 - t0, b->up + (r0 + t0) * j->ldo, n0, n1);
        expert_act(j->c, j->w, e, b->gate + (r0 + t0) * j->ldo, b->up + (r0 + t0) * j->ldo, j->ldo,
                   t1 - t0, n0, n1);
    }
}

/* Rows [0, rows) of x quantized for the product of a, unless done[its format] already. */
static void quantize_for(engine_ctx *c, const kern_mat *a, const float *x, size_t rows, bool *done)
{
    kern_qx fmt = kern_qdot_act(a);
    if (done[fmt == KERN_QX_256])
        return;
    done[fmt == KERN_QX_256] = true;
    engine__quantize_rows(c, fmt, x, rows, a->n_in, c->moe->xq[fmt == KERN_QX_256]);
}

/* Runs matrix mat (0: gate and up, 2: down) of every active expert as one job. */
static void run_experts(engine_ctx *c, const layer_weights *w, uint32_t mat, uint32_t n_act,
                        size_t ldo)
{
    engine_moe_buf *b = c->moe;
    uint64_t macs = 0;
    for (uint32_t a = 0; a < n_act; a++) {
        const kern_mat *m = &w->experts[b->act[a] * 3 + mat];
        b->item0[a + 1] = b->item0[a] + (uint32_t)((m->n_out + EXP_CHUNK - 1) / EXP_CHUNK);
        macs += (uint64_t)(b->first[b->act[a] + 1] - b->first[b->act[a]]) * m->n_out * m->n_in *
                (mat == 0 ? 2 : 1);
    }
    expert_job j = {c, w, b, mat, n_act, ldo};
    engine__run_items(c, b->item0[n_act], expert_item, &j, macs);
}

void engine__moe_ffn(engine_ctx *c, const layer_weights *w, float *xn, size_t rows)
{
    const engine_hparams *hp = &c->m->hp;
    engine_moe_buf *b = c->moe;
    size_t E = hp->n_embd, X = hp->n_expert, K = hp->n_expert_used, F = hp->n_ff_exp;

    engine__matmul(c, b->logits, xn, &w->router, rows);
    memset(b->first, 0, (X + 1) * sizeof *b->first);
    for (size_t t = 0; t < rows; t++) {
        float *p = b->logits + t * X;
        if (w->router_b)
            kern_add(p, w->router_b, X);
        if (c->m->arch->moe_route == ENGINE_MOE_TOPK_SOFTMAX)
            route_row_topk(p, (uint32_t)X, (uint32_t)K, b->sel + t * K, b->weight + t * K);
        else
            route_row(p, (uint32_t)X, (uint32_t)K, c->m->arch->moe_route == ENGINE_MOE_SIGMOID_NORM,
                      w->exp_probs_b, b->scratch, b->sel + t * K, b->weight + t * K);
        for (size_t j = 0; j < K; j++)
            b->first[b->sel[t * K + j] + 1]++;
    }
    /* Counting sort of (row, k) by expert, rows ascending within each; the active experts. */
    uint32_t n_act = 0;
    for (size_t e = 0; e < X; e++) {
        if (b->first[e + 1])
            b->act[n_act++] = (uint32_t)e;
        b->first[e + 1] += b->first[e];
    }
    for (size_t t = 0; t < rows; t++)
        for (size_t j = 0; j < K; j++) {
            uint32_t e = (uint32_t)b->sel[t * K + j];
            b->order[b->first[e]++] = (uint32_t)(t * K + j);
        }
    for (size_t e = X; e > 0; e--) /* first[e] was moved to the end of e's rows */
        b->first[e] = b->first[e - 1];
    b->first[0] = 0;
    size_t n_rows = rows * K;
    for (size_t i = 0; i < n_rows; i++)
        memcpy(b->in + i * E, xn + (b->order[i] / K) * E, E * sizeof *xn);

    const kern_mat *e0 = w->experts;
    if (b->xq[0] && kern_qdot_act(&e0[0]) != KERN_QX_NONE &&
        kern_qdot_act(&e0[1]) != KERN_QX_NONE && kern_qdot_act(&e0[2]) != KERN_QX_NONE) {
        bool done[2] = {false, false};
        quantize_for(c, &e0[0], b->in, n_rows, done);
        quantize_for(c, &e0[1], b->in, n_rows, done);
        b->item0[0] = 0;
        run_experts(c, w, 0, n_act, F);
        done[0] = done[1] = false;
        quantize_for(c, &e0[2], b->gate, n_rows, done);
        run_experts(c, w, 2, n_act, E); /* into b->in: its rows are quantized already */
    } else {
        for (uint32_t a = 0; a < n_act; a++) {
            uint32_t e = b->act[a];
            size_t r0 = b->first[e], n = b->first[e + 1] - r0;
            const kern_mat *gate_up[2] = {&w->experts[e * 3], &w->experts[e * 3 + 1]};
            float *gate_up_out[2] = {c->gate, c->up};
            if (!w->exp_b[0] && c->m->arch->moe_act == ENGINE_MOE_SILU) {
                engine__matmuls(c, b->in + r0 * E, n, 2, gate_up, gate_up_out, ENGINE_GLU_SILU);
            } else {
                engine__matmuls(c, b->in + r0 * E, n, 2, gate_up, gate_up_out, ENGINE_GLU_NONE);
                expert_act(c, w, e, c->gate, c->up, F, n, 0, F);
            }
            /* over its input rows, which the products above have read */
            engine__matmul(c, b->in + r0 * E, c->gate, &w->experts[e * 3 + 2], n);
        }
    }
    for (uint32_t a = 0; w->exp_b[2] && a < n_act; a++) /* the down biases */
        for (size_t i = b->first[b->act[a]]; i < b->first[b->act[a] + 1]; i++)
            kern_add(b->in + i * E, w->exp_b[2] + (size_t)b->act[a] * E, E);
    for (size_t i = 0; i < n_rows; i++) {
        float *y = b->y + (size_t)b->order[i] * E, wt = b->weight[b->order[i]];
        const float *o = b->in + i * E;
        for (size_t d = 0; d < E; d++)
            y[d] = o[d] * wt;
    }
    /* A shared expert runs on the same rows (xn, still the input), into b->in, whose outputs
     * are in y now; added to the routed sum, moe_out + shexp as llama.cpp adds them. */
    bool shared = w->sh_down.data != NULL;
    if (shared) {
        const kern_mat *gate_up[2] = {&w->sh_gate, &w->sh_up};
        float *gate_up_out[2] = {c->gate, c->up};
        engine__matmuls(c, xn, rows, 2, gate_up, gate_up_out, ENGINE_GLU_SILU);
        engine__matmul(c, b->in, c->gate, &w->sh_down, rows);
    }
    for (size_t t = 0; t < rows; t++) {
        float *dst = xn + t * E;
        memcpy(dst, b->y + t * K * E, E * sizeof *dst);
        for (size_t j = 1; j < K; j++)
            kern_add(dst, b->y + (t * K + j) * E, E);
        if (shared)
            kern_add(dst, b->in + t * E, E);
    }
}
