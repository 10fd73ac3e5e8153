/* The KV arena: block_size-token slots of K and V for every layer, in the cache type (F16 or
 * F32), allocated once; kvpool's block ids index it. A single arena gives every layer the same
 * n_blocks. A split one gives the windowed layers (sliding-window attention) blocks of their
 * own, n_wblocks of them, addressed by a second block table: a sequence only needs its last
 * window there, so that group can be far smaller than the global one. */
#include "engine/model_impl.h"

#include "common/hugemem.h"
#include "common/status.h"

#include <stdlib.h>
#include <string.h>

int engine_kv_type_parse(const char *s)
{
    return !strcmp(s, "f16") ? ENGINE_KV_F16 : !strcmp(s, "f32") ? ENGINE_KV_F32 : -1;
}

const char *engine_kv_type_name(engine_kv_type t)
{
    return t == ENGINE_KV_F16 ? "f16" : "f32";
}

static size_t kv_esz(engine_kv_type type)
{
    return type == ENGINE_KV_F16 ? 2 : 4;
}

static uint32_t layers_windowed(const engine_model *m)
{
    uint32_t n = 0;
    for (uint32_t l = 0; l < m->hp.n_layer; l++)
        n += m->layers[l].window > 0;
    return n;
}

uint32_t engine_model_window(const engine_model *m)
{
    uint32_t w = 0;
    for (uint32_t l = 0; l < m->hp.n_layer; l++)
        w = m->layers[l].window > w ? m->layers[l].window : w;
    return w;
}

/* Bytes of layer l's K and of its V per token slot: none for a layer that reads another's
 * (gemma3n's shared KV). A short-convolution layer (lfm2) keeps the
 * product B*x of each position (n_embd values) in its K rows and has no V: F32 whatever the
 * cache type, as llama.cpp keeps its convolution states, and the window its layer holds is a
 * few positions per sequence. */
static void slot_bytes(const engine_model *m, engine_kv_type type, uint32_t l, size_t *k, size_t *v)
{
    const engine_hparams *hp = &m->hp;
    if (m->layers[l].kv_shared) { /* reads an earlier layer's rows (gemma3n) */
        *k = *v = 0;
        return;
    }
    if (m->layers[l].conv_len) {
        *k = (size_t)hp->n_embd * sizeof(float);
        *v = 0;
        return;
    }
    *k = *v = (size_t)hp->n_head_kv * hp->head_dim * kv_esz(type);
}

static size_t group_bytes(const engine_model *m, engine_kv_type type, uint32_t block_size,
                          int group)
{
    size_t total = 0;
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        int g = m->layers[l].window > 0 ? ENGINE_KV_WINDOWED : ENGINE_KV_GLOBAL;
        size_t k, v;
        slot_bytes(m, type, l, &k, &v);
        total += group < 0 || g == group ? (k + v) * block_size : 0;
    }
    return total;
}

size_t engine_kv_block_bytes(const engine_model *m, engine_kv_type type, uint32_t block_size)
{
    return group_bytes(m, type, block_size, -1);
}

size_t engine_kv_group_block_bytes(const engine_model *m, engine_kv_type type, uint32_t block_size,
                                   int group)
{
    return group_bytes(m, type, block_size, group);
}

static int kv_create(const engine_model *m, engine_kv_type type, uint32_t n_blocks,
                     uint32_t n_wblocks, uint32_t block_size, engine_kv **out)
{
    *out = NULL;
    if (n_blocks == 0 || block_size == 0 || (uint64_t)n_blocks * block_size > (1ull << 32) ||
        (uint64_t)n_wblocks * block_size > (1ull << 32) ||
        (type != ENGINE_KV_F16 && type != ENGINE_KV_F32))
        return KVS_EINVAL;
    engine_kv *kv = calloc(1, sizeof *kv);
    if (!kv)
        return KVS_ENOMEM;
    kv->type = type;
    kv->esz = kv_esz(type);
    kv->n_blocks = n_blocks;
    kv->n_wblocks = n_wblocks;
    kv->block_size = block_size;
    kv->n_layer = m->hp.n_layer;
    kv->kv_dim = m->hp.n_head_kv * m->hp.head_dim;
    kv->layer_off = malloc(kv->n_layer * sizeof *kv->layer_off);
    kv->v_off = malloc(kv->n_layer * sizeof *kv->v_off);
    kv->k_row = malloc(kv->n_layer * sizeof *kv->k_row);
    kv->v_row = malloc(kv->n_layer * sizeof *kv->v_row);
    kv->group = malloc(kv->n_layer);
    if (!kv->layer_off || !kv->v_off || !kv->k_row || !kv->v_row || !kv->group) {
        engine_kv_destroy(kv);
        return KVS_ENOMEM;
    }
    size_t k_total = 0, v_total = 0;
    for (uint32_t l = 0; l < kv->n_layer; l++) {
        bool w = n_wblocks && m->layers[l].window > 0;
        size_t k_row, v_row, slots = (size_t)(w ? n_wblocks : n_blocks) * block_size;
        slot_bytes(m, type, l, &k_row, &v_row);
        kv->group[l] = w ? ENGINE_KV_WINDOWED : ENGINE_KV_GLOBAL;
        kv->k_row[l] = k_row;
        kv->v_row[l] = v_row;
        kv->layer_off[l] = k_total;
        kv->v_off[l] = v_total;
        k_total += slots * k_row;
        v_total += slots * v_row;
    }
    /* A shared-KV layer reads its source's rows: the same offsets and group, no rows of its
     * own (k_row 0: copying a block copies nothing for it). */
    for (uint32_t l = 0; l < kv->n_layer; l++) {
        uint32_t src = m->layers[l].kv_layer;
        if (!m->layers[l].kv_shared)
            continue;
        kv->layer_off[l] = kv->layer_off[src];
        kv->v_off[l] = kv->v_off[src];
        kv->group[l] = kv->group[src];
    }
    /* faulted in now, as llama.cpp clears its KV buffer at start: a block's first use never
     * pays page faults in the middle of a step (4-5 % of a 16-client 110m benchmark, which
     * touched most of a fresh 256 MiB pool), and RSS is flat from the start */
    kv->k = kvs_huge_alloc(k_total, true);
    kv->v = kvs_huge_alloc(v_total ? v_total : 1, true);
    if (!kv->k || !kv->v) {
        engine_kv_destroy(kv);
        return KVS_ENOMEM;
    }
    *out = kv;
    return 0;
}

int engine_kv_create(const engine_model *m, engine_kv_type type, uint32_t n_blocks,
                     uint32_t block_size, engine_kv **out)
{
    return kv_create(m, type, n_blocks, 0, block_size, out);
}

int engine_kv_create_split(const engine_model *m, engine_kv_type type, uint32_t n_blocks,
                           uint32_t n_wblocks, uint32_t block_size, engine_kv **out)
{
    uint32_t nw = layers_windowed(m);
    *out = NULL;
    if (n_wblocks == 0 || nw == 0 || nw == m->hp.n_layer)
        return KVS_EINVAL;
    return kv_create(m, type, n_blocks, n_wblocks, block_size, out);
}

void engine_kv_destroy(engine_kv *kv)
{
    if (!kv)
        return;
    kvs_huge_free(kv->k);
    kvs_huge_free(kv->v);
    free(kv->layer_off);
    free(kv->v_off);
    free(kv->k_row);
    free(kv->v_row);
    free(kv->group);
    free(kv);
}

void engine_kv_copy_block(engine_kv *kv, int group, int32_t src, int32_t dst)
{
    for (uint32_t l = 0; l < kv->n_layer; l++) {
        if (kv->n_wblocks && kv->group[l] != group)
            continue;
        size_t kblk = (size_t)kv->block_size * kv->k_row[l], kb = kv->layer_off[l];
        size_t vblk = (size_t)kv->block_size * kv->v_row[l], vb = kv->v_off[l];
        memcpy(kv->k + kb + (size_t)dst * kblk, kv->k + kb + (size_t)src * kblk, kblk);
        memcpy(kv->v + vb + (size_t)dst * vblk, kv->v + vb + (size_t)src * vblk, vblk);
    }
}
