/* The mixture-of-experts MLP (Qwen3-30B-A3B's qwen3moe, Mixtral's llama layout): a router
 * (ffn_gate_inp) scores every expert for each token, the token goes through the n_expert_used
 * most probable experts' SwiGLU MLPs (ffn_{gate,up,down}_exps: each expert a matrix of the
 * stack), and their outputs, weighted by the selected probabilities renormalized to sum to 1,
 * are summed. As llama.cpp's build_moe_ffn with softmax gating and normalized weights: the
 * experts in descending order of probability (ties: the lower index), each output times its
 * weight, then summed from the first in that order, so the sum is what llama.cpp adds up.
 *
 * A step groups its rows by expert and runs each expert's products over its rows together (a
 * prompt's 512 rows give an expert of 128 about 32 rows). A row's products do not depend on the
 * rows beside it (the kernels' property), and its routing and sum read only that row, so a row
 * gives the same bits in any batch: cached = recomputed holds. */
#include "engine/arch.h"

#include "common/status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct engine_moe_buf {
    float *logits;   /* (max_tokens, n_expert) the router's scores, then probabilities */
    int32_t *sel;    /* (max_tokens, n_used) each row's experts, most probable first */
    float *weight;   /* (max_tokens, n_used) their weights */
    uint32_t *count; /* (n_expert + 1) rows per expert, then the first of each in order */
    uint32_t *order; /* (max_tokens * n_used) row * n_used + k, grouped by expert */
    float *in;       /* (max_tokens, n_embd) one expert's rows of the input */
    float *out;      /* (max_tokens, n_embd) the expert's output on them */
    float *y;        /* (max_tokens, n_used, n_embd) each row's weighted expert outputs */
};

engine_moe_buf *engine__moe_buf_create(const engine_model *m, uint32_t max_tokens)
{
    const engine_hparams *hp = &m->hp;
    size_t T = max_tokens, E = hp->n_embd, X = hp->n_expert, K = hp->n_expert_used;
    engine_moe_buf *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->logits = malloc(T * X * sizeof *b->logits);
    b->sel = malloc(T * K * sizeof *b->sel);
    b->weight = malloc(T * K * sizeof *b->weight);
    b->count = malloc((X + 1) * sizeof *b->count);
    b->order = malloc(T * K * sizeof *b->order);
    b->in = malloc(T * E * sizeof *b->in);
    b->out = malloc(T * E * sizeof *b->out);
    b->y = malloc(T * K * E * sizeof *b->y);
    if (!b->logits || !b->sel || !b->weight || !b->count || !b->order || !b->in || !b->out ||
        !b->y) {
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
    free(b->sel);
    free(b->weight);
    free(b->count);
    free(b->order);
    free(b->in);
    free(b->out);
    free(b->y);
    free(b);
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
    return 0;
}

/* Row t's experts and weights from its router scores p (n_expert, overwritten with the
 * probabilities): softmax, the k largest (repeated arg-max, so ties go to the lower index), and
 * their probabilities over their sum (at least 2^-14, as llama.cpp clamps it). */
static void route_row(float *p, uint32_t n, uint32_t k, int32_t *sel, float *weight)
{
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
    float wsum = 0;
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
        weight[j] = p[best];
        wsum += p[best];
    }
    wsum = wsum > 6.103515625e-5f ? wsum : 6.103515625e-5f;
    for (uint32_t j = 0; j < k; j++)
        weight[j] /= wsum;
}

void engine__moe_ffn(engine_ctx *c, const layer_weights *w, float *xn, size_t rows)
{
    const engine_hparams *hp = &c->m->hp;
    engine_moe_buf *b = c->moe;
    size_t E = hp->n_embd, X = hp->n_expert, K = hp->n_expert_used;

    engine__matmul(c, b->logits, xn, &w->router, rows);
    memset(b->count, 0, (X + 1) * sizeof *b->count);
    for (size_t t = 0; t < rows; t++) {
        route_row(b->logits + t * X, (uint32_t)X, (uint32_t)K, b->sel + t * K, b->weight + t * K);
        for (size_t j = 0; j < K; j++)
            b->count[b->sel[t * K + j] + 1]++;
    }
    /* Counting sort of (row, k) by expert, rows ascending within each. */
    for (size_t e = 0; e < X; e++)
        b->count[e + 1] += b->count[e];
    for (size_t t = 0; t < rows; t++)
        for (size_t j = 0; j < K; j++)
            b->order[b->count[b->sel[t * K + j]]++] = (uint32_t)(t * K + j);
    /* count[e] is now the end of expert e's run, which is where expert e + 1's begins. */
    for (size_t e = 0, first = 0; e < X; first = b->count[e], e++) {
        size_t n = b->count[e] - first;
        if (!n)
            continue;
        const uint32_t *ord = b->order + first;
        for (size_t i = 0; i < n; i++)
            memcpy(b->in + i * E, xn + (ord[i] / K) * E, E * sizeof *xn);
        const kern_mat *gate_up[2] = {&w->experts[e * 3], &w->experts[e * 3 + 1]};
        float *gate_up_out[2] = {c->gate, c->up};
        engine__matmuls(c, b->in, n, 2, gate_up, gate_up_out, ENGINE_GLU_SILU);
        engine__matmul(c, b->out, c->gate, &w->experts[e * 3 + 2], n);
        for (size_t i = 0; i < n; i++) {
            float *y = b->y + (size_t)ord[i] * E, wt = b->weight[ord[i]];
            const float *o = b->out + i * E;
            for (size_t d = 0; d < E; d++)
                y[d] = o[d] * wt;
        }
    }
    for (size_t t = 0; t < rows; t++) {
        float *dst = xn + t * E;
        memcpy(dst, b->y + t * K * E, E * sizeof *dst);
        for (size_t j = 1; j < K; j++)
            kern_add(dst, b->y + (t * K + j) * E, E);
    }
}
