/* GET /kv-cache's body from a snapshot: blocks folded into cells, counts, sequences. */
#include "server/kv_view.h"

#include <stdlib.h>

#include <cjson/cJSON.h>

/* busiest first: a cell shows the state of its busiest block */
static int rank_of(const sched_kv_snapshot *k, uint32_t b)
{
    if (k->state[b] == SCHED_BLOCK_USED)
        return k->refs[b] > 1 ? 3 : 2;
    return k->state[b] == SCHED_BLOCK_CACHED ? 1 : 0;
}

char *srv_kv_json(const sched_kv_snapshot *k, const srv_kv_model *m, uint64_t generation_tokens,
                  uint32_t max_cells)
{
    static const char glyph[4] = {'.', 'c', 'u', 's'};
    if (max_cells < 1)
        max_cells = 1;
    if (max_cells > SRV_KV_MAX_CELLS)
        max_cells = SRV_KV_MAX_CELLS;
    uint32_t per = k->n_blocks <= max_cells ? 1 : (k->n_blocks + max_cells - 1) / max_cells;
    uint32_t n_cells = per ? (k->n_blocks + per - 1) / per : 0;
    char *cells = malloc((size_t)n_cells + 1);
    cJSON *r = cJSON_CreateObject();
    cJSON *owners = cJSON_CreateArray();
    if (!cells || !r || !owners) {
        free(cells);
        cJSON_Delete(r);
        cJSON_Delete(owners);
        return NULL;
    }
    uint32_t count[4] = {0};
    for (uint32_t c = 0; c < n_cells; c++) {
        int best = -1;
        int32_t owner = -1;
        uint32_t end = (c + 1) * per < k->n_blocks ? (c + 1) * per : k->n_blocks;
        for (uint32_t b = c * per; b < end; b++) {
            int rk = rank_of(k, b);
            count[rk]++;
            if (rk > best) {
                best = rk;
                owner = k->owner[b];
            }
        }
        cells[c] = glyph[best < 0 ? 0 : best];
        cJSON_AddItemToArray(owners, cJSON_CreateNumber(owner));
    }
    cells[n_cells] = '\0';

    cJSON *mo = cJSON_AddObjectToObject(r, "model");
    cJSON_AddStringToObject(mo, "id", m->id ? m->id : "");
    cJSON_AddStringToObject(mo, "architecture", m->architecture ? m->architecture : "");
    cJSON_AddStringToObject(mo, "weights", m->weights ? m->weights : "");
    cJSON_AddStringToObject(mo, "kernels", m->kernels ? m->kernels : "");
    cJSON_AddNumberToObject(mo, "context", m->context);
    cJSON_AddNumberToObject(r, "n_blocks", k->n_blocks);
    cJSON_AddNumberToObject(r, "block_size", k->block_size);
    cJSON_AddNumberToObject(r, "blocks_per_cell", per);
    cJSON_AddStringToObject(r, "cells", cells);
    free(cells);
    cJSON_AddItemToObject(r, "owners", owners);
    cJSON *bl = cJSON_AddObjectToObject(r, "blocks");
    cJSON_AddNumberToObject(bl, "used", count[2] + count[3]);
    cJSON_AddNumberToObject(bl, "shared", count[3]);
    cJSON_AddNumberToObject(bl, "cached", count[1]);
    cJSON_AddNumberToObject(bl, "free", count[0]);
    cJSON_AddNumberToObject(r, "bytes_used", (double)k->bytes_used);
    /* The grid above is the global layers' group; a split cache's windowed group is summed. */
    if (k->window) {
        cJSON *wg = cJSON_AddObjectToObject(r, "window_group");
        cJSON_AddNumberToObject(wg, "window", k->window);
        cJSON_AddNumberToObject(wg, "n_blocks", k->n_window_blocks);
        cJSON_AddNumberToObject(wg, "used", k->window_used);
        cJSON_AddNumberToObject(wg, "cached", k->window_cached);
        cJSON_AddNumberToObject(wg, "free", k->n_window_blocks - k->window_used - k->window_cached);
    }
    cJSON *seqs = cJSON_AddArrayToObject(r, "seqs");
    for (uint32_t i = 0; seqs && i < k->n_seqs; i++) {
        cJSON *q = cJSON_CreateObject();
        cJSON_AddNumberToObject(q, "request", (double)k->seqs[i].request);
        cJSON_AddNumberToObject(q, "choice", k->seqs[i].choice);
        cJSON_AddNumberToObject(q, "tokens", k->seqs[i].n_tokens);
        cJSON_AddNumberToObject(q, "blocks", k->seqs[i].n_blocks);
        if (k->window)
            cJSON_AddNumberToObject(q, "window_blocks", k->seqs[i].n_window_blocks);
        cJSON_AddItemToArray(seqs, q);
    }
    cJSON_AddNumberToObject(r, "running", k->n_seqs);
    cJSON_AddNumberToObject(r, "waiting", k->n_waiting);
    cJSON_AddNumberToObject(r, "steps", (double)k->steps);
    cJSON_AddNumberToObject(r, "snapshot_us", (double)(long)(k->fill_seconds * 1e6 + 0.5));
    cJSON_AddNumberToObject(r, "generation_tokens", (double)generation_tokens);
    char *s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    return s;
}
