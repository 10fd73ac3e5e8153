/* The JSON behind the web page's KV grid (GET /kv-cache): a scheduler snapshot folded into at
 * most max_cells cells, so the answer stays small however large the pool. Pure: no I/O, no
 * locks; unit-tested without a model. */
#ifndef KVS_SERVER_KV_VIEW_H
#define KVS_SERVER_KV_VIEW_H

#include <stdint.h>

#include "scheduler/scheduler.h"

typedef struct srv_kv_model {
    const char *id;           /* the served model name */
    const char *architecture; /* general.architecture */
    const char *weights;      /* the weight type, e.g. "F16" */
    const char *kernels;      /* the kernel table in use, e.g. "avx2" */
    uint32_t context;         /* tokens */
} srv_kv_model;

#define SRV_KV_MAX_CELLS 65536

/* {"model":{...},"n_blocks","block_size","blocks_per_cell","cells":".cus…","owners":[…],
 *  "blocks":{"used","shared","cached","free"},"seqs":[{"request","choice","tokens","blocks"}],
 *  "running","waiting","steps","snapshot_us" (the engine thread's cost of taking it),
 *  "generation_tokens"}, malloc'd (NULL on OOM).
 * A cell covers ceil(n_blocks / max_cells) consecutive blocks and shows the busiest of them:
 * 's' shared (held by more than one block table), 'u' used, 'c' cached, '.' free; its owner
 * is the index in seqs of that block's oldest holder, or -1. max_cells is clamped to
 * 1..SRV_KV_MAX_CELLS. */
char *srv_kv_json(const sched_kv_snapshot *k, const srv_kv_model *m, uint64_t generation_tokens,
                  uint32_t max_cells);

#endif
