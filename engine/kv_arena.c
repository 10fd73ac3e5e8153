/* The KV arena: n_blocks * block_size token slots of K and V for every layer, in the cache
 * type (F16 or F32), allocated once; kvpool's block ids index it. */
#include "engine/model_impl.h"

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

size_t engine_kv_block_bytes(const engine_model *m, engine_kv_type type, uint32_t block_size)
{
    const engine_hparams *hp = &m->hp;
    return (size_t)2 * hp->n_layer * block_size * hp->n_head_kv * hp->head_dim * kv_esz(type);
}

int engine_kv_create(const engine_model *m, engine_kv_type type, uint32_t n_blocks,
                     uint32_t block_size, engine_kv **out)
{
    *out = NULL;
    if (n_blocks == 0 || block_size == 0 || (uint64_t)n_blocks * block_size > (1ull << 32) ||
        (type != ENGINE_KV_F16 && type != ENGINE_KV_F32))
        return KVS_EINVAL;
    engine_kv *kv = calloc(1, sizeof *kv);
    if (!kv)
        return KVS_ENOMEM;
    kv->type = type;
    kv->esz = kv_esz(type);
    kv->n_blocks = n_blocks;
    kv->block_size = block_size;
    kv->n_layer = m->hp.n_layer;
    kv->kv_dim = m->hp.n_head_kv * m->hp.head_dim;
    kv->layer_stride = (size_t)n_blocks * block_size * kv->kv_dim;
    size_t total = kv->layer_stride * kv->n_layer;
    kv->k = calloc(total, kv->esz);
    kv->v = calloc(total, kv->esz);
    if (!kv->k || !kv->v) {
        engine_kv_destroy(kv);
        return KVS_ENOMEM;
    }
    *out = kv;
    return 0;
}

void engine_kv_destroy(engine_kv *kv)
{
    if (!kv)
        return;
    free(kv->k);
    free(kv->v);
    free(kv);
}

void engine_kv_copy_block(engine_kv *kv, int32_t src, int32_t dst)
{
    size_t blk = (size_t)kv->block_size * kv->kv_dim * kv->esz;
    for (uint32_t l = 0; l < kv->n_layer; l++) {
        size_t base = l * kv->layer_stride * kv->esz;
        memcpy(kv->k + base + (size_t)dst * blk, kv->k + base + (size_t)src * blk, blk);
        memcpy(kv->v + base + (size_t)dst * blk, kv->v + base + (size_t)src * blk, blk);
    }
}
