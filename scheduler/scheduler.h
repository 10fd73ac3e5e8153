/* Scheduler: continuous batching over the paged KV cache, on one engine thread.
 *
 * Every step the engine thread (1) drains the inbox and drops cancelled requests, freeing
 * their blocks; (2) plans a batch within max_batched_tokens: one decode token per running
 * sequence, then prefill chunks of waiting prompts, admitting a sequence only if the pool can
 * hold it (cached prefix blocks first) and preempting the newest sequence if the pool runs
 * dry mid-decode; (3) runs one engine_forward over the batch; (4) samples, detokenizes and
 * checks stop conditions; (5) publishes text deltas to each request's event queue.
 *
 * Threads: sched_submit / sched_req_* / sched_get_metrics may be called from any thread. The
 * engine thread never blocks on a client: events are queued and the request's notify callback
 * is called (from the engine thread, with no scheduler lock held) when new events arrive.
 * Locks: sched.inbox_mu guards the inbox and the draining flag; each request's mu guards its
 * event queue and the cancelled/released flags; sched.metrics_mu guards the metrics snapshot.
 * No two are ever held together. */
#ifndef KVS_SCHEDULER_SCHEDULER_H
#define KVS_SCHEDULER_SCHEDULER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/grammar.h"
#include "engine/model.h"
#include "engine/sampler.h"

typedef struct sched sched;
typedef struct sched_req sched_req;

struct sched_kv_snapshot; /* below */

typedef struct sched_params {
    uint32_t max_num_seqs;       /* running sequences at most (default 64) */
    uint32_t max_queue;          /* waiting requests at most; beyond: KVS_ENOSPC -> 429 (256) */
    uint32_t max_batched_tokens; /* tokens per step (default 512) */
    uint32_t kv_cache_mb;        /* KV pool budget in MiB; 0 (the default): one whole context,
                                    at least 256 MiB, in the memory the machine has left (see
                                    sched_create) */
    engine_kv_type kv_type;      /* what cached K/V are stored as (default ENGINE_KV_F16) */
    uint32_t kv_blocks;          /* if > 0: exactly this many blocks, ignoring kv_cache_mb */
    uint32_t block_size;         /* tokens per KV block (default 16) */
    bool prefix_cache;           /* reuse cached prompt blocks (default true) */
    bool window_reclaim;         /* a model with global and sliding-window layers: the windowed
                                    layers get blocks of their own, released once behind every
                                    sequence's window (default true; see sched_create) */
    uint32_t n_threads;          /* compute threads for the engine; 0 = the online cores */
    uint32_t n_ctx;              /* context length; 0 = the model's */
    uint64_t mem_avail;          /* tests only: if > 0, the bytes the machine has left, for
                                    kv_cache_mb 0 (else kvs_mem_available()) */
    uint64_t fail_step;          /* tests only: if > 0, step number fail_step fails as if the
                                    forward pass had (KVS_EIO), to exercise error paths */
    uint32_t plp_rows;           /* tests only: if > 0, the prompt-logprob rows one step
                                    computes at most (else as many as 64 MiB of logits hold) */
    /* tests only: if set, called on the engine thread after every step with a picture of the
     * pool as that step left it (what sched_kv_snapshot_take gives, valid during the call), so a
     * test sees every step however the threads are scheduled. The callback must not call back
     * into the scheduler. */
    void (*step_observer)(void *ud, const struct sched_kv_snapshot *snap);
    void *step_observer_ud;
} sched_params;

sched_params sched_default_params(void);

/* Builds the pool, KV arena and engine scratch for model (which must outlive the scheduler)
 * and starts the engine thread. KVS_EINVAL for bad params, KVS_ENOMEM.
 * With window_reclaim, a model having both global and windowed layers (and n_ctx longer than
 * its window) gets two layer groups, each a pool of blocks covering only its layers. The
 * windowed group is sized to what the sequences can hold at once, W = min(N, max_num_seqs *
 * (ceil((window + max_batched_tokens) / block_size) + 3)), N being the global group's blocks:
 * kv_blocks gives N exactly; kv_cache_mb is split as W windowed blocks first (W computed with
 * N as if the two groups had equal counts) and the rest of the budget to N. Without it (or
 * for other models) one group holds every layer, as before.
 * kv_cache_mb 0 chooses the budget: the least that holds one whole context (N at least its
 * blocks), and at least 256 MiB, within the memory the machine has left (kvs_mem_available
 * less a quarter of it, at most 1 GiB). If one context of the model's length (n_ctx 0) does not fit
 * there, the context is shortened to the longest that does (not below 4096 tokens, else
 * KVS_ENOMEM), as llama-server's --fit does, with a warning; sched_n_ctx gives the context chosen.
 */
int sched_create(const sched_params *p, const engine_model *model, sched **out);
/* The context length requests are held to: n_ctx, the model's, or what the fit chose */
uint32_t sched_n_ctx(const sched *s);
/* Stops the engine thread, ends every request with a KVS_ECANCELED error event, frees all.
 * Release every request first: sched_req_release wakes the engine thread through the
 * scheduler, so after this it would touch freed memory (the server releases its requests in
 * srv_stop, before this). NULL is a no-op. */
void sched_destroy(sched *s);

/* Stop admitting new requests (sched_submit returns KVS_EBUSY); running ones go on. */
void sched_drain(sched *s);
/* End every unfinished request now with an error event (code KVS_ECANCELED). */
void sched_abort_all(sched *s);
/* Requests submitted and not yet finished. */
uint32_t sched_n_unfinished(sched *s);

enum sched_finish {
    SCHED_FINISH_NONE = 0,
    SCHED_FINISH_STOP,   /* EOS / stop token / stop string */
    SCHED_FINISH_LENGTH, /* max_tokens or context end */
    SCHED_FINISH_ERROR,  /* see event.status */
};

#define SCHED_MAX_STOP 16
#define SCHED_MAX_TOP_LOGPROBS 20
#define SCHED_MAX_LOGIT_BIAS 1024

/* A value added to one token's logit before sampling (OpenAI logit_bias: -100 bans it, 100
 * makes it all but certain). */
typedef struct sched_logit_bias {
    int32_t id; /* < the model's vocabulary size */
    float bias;
} sched_logit_bias;

typedef struct sched_request_params {
    const int32_t *prompt; /* copied by sched_submit */
    uint32_t n_prompt;     /* >= 1; prompt + max_tokens must fit n_ctx (else KVS_ERANGE) */
    uint32_t max_tokens;   /* 0: the prompt is computed (its blocks join the prefix cache, its
                              prompt logprobs are sent) and every choice finishes with
                              SCHED_FINISH_LENGTH, nothing sampled */
    uint32_t n;            /* choices sharing the prompt's blocks, 1..max_num_seqs: each
                              choice is a running sequence, so the request is admitted only
                              when all n fit under max_num_seqs (else KVS_EINVAL) */
    sampler_params sampling;
    bool ignore_eos;
    const char *stop[SCHED_MAX_STOP]; /* stop strings (copied); NULL entries unused */
    int n_top_logprobs;               /* -1: no logprobs; 0..20: logprobs with that many tops */
    /* With n_top_logprobs >= 0: also every prompt token's logprob after the first (given the
     * tokens before it, with n_top_logprobs tops), over the model's logits as they are (no
     * logit_bias, no grammar), in one event (sched_event.prompt) before the first generated
     * token's. Those rows are computed, never taken from the prefix cache. */
    bool prompt_logprobs;
    /* Not NONE: an embedding. The prompt's hidden states (engine_forward_hidden) pooled so
     * arrive in one event (sched_event.embedding) before the finishing one; then max_tokens
     * must be 0, n 1, and no logprobs nor grammar asked (else KVS_EINVAL). MEAN and CLS rows
     * are computed, never taken from the prefix cache; LAST's may be. */
    engine_pooling embed;
    bool notify_on_finish_only;         /* call notify only for finishing events: a client that
                                           reads everything at the end (non-streaming) is then
                                           woken once per choice, not once per token */
    const sched_logit_bias *logit_bias; /* copied; n_logit_bias <= SCHED_MAX_LOGIT_BIAS */
    uint32_t n_logit_bias;
    /* Constrained decoding: every choice samples only tokens the grammar allows (its mask is
     * applied after logit_bias, before the sampler), forks clone the grammar, and a choice
     * ends with SCHED_FINISH_STOP once its value is complete and nothing may follow, or on an
     * end token (allowed only when the value is complete; ignore_eos does not apply).
     * Logprobs are then over the allowed tokens. On a successful sched_submit the scheduler
     * owns the def (destroyed with the request); on failure it is still the caller's.
     * NULL: unconstrained. */
    grammar_def *grammar;
} sched_request_params;

typedef struct sched_token_info {
    int32_t id;
    float logprob;
    int n_top; /* the server marks an echoed prompt's first token, which has no logprob, -1 */
    int32_t top_ids[SCHED_MAX_TOP_LOGPROBS];
    float top_logprobs[SCHED_MAX_TOP_LOGPROBS];
} sched_token_info;

/* One event of a request's output, owned by the caller after sched_req_next (free with
 * sched_event_free). */
typedef struct sched_event {
    uint32_t choice; /* which of the n choices */
    char *text;      /* UTF-8 delta (whole characters, stop strings held back), may be "" */
    size_t text_len;
    sched_token_info *tokens; /* the tokens of this delta, when logprobs were asked for */
    uint32_t n_tokens;
    uint32_t generated; /* tokens this choice has generated, this delta's included */
    /* The prompt's logprobs (sched_request_params.prompt_logprobs): tokens[i] is prompt token
     * i + 1's, n_tokens = n_prompt - 1; choice 0, no text, finish NONE. */
    bool prompt;
    /* An embedding request's (sched_request_params.embed): the pooled hidden state, n_embd
     * floats, not normalized; no text, finish NONE, just before the finishing event. */
    float *embedding;
    uint32_t n_embedding;
    enum sched_finish finish; /* != NONE: this choice is finished, this is its last event */
    int status;               /* with SCHED_FINISH_ERROR: KVS_ECANCELED, KVS_ENOMEM, ... */
    /* on a finishing event: */
    uint32_t prompt_tokens;
    uint32_t completion_tokens; /* of this choice */
    uint32_t cached_tokens;     /* prompt tokens served from the prefix cache */
} sched_event;

void sched_event_free(sched_event *ev);

/* Queues a request. notify(ud) is called from the engine thread whenever new events are
 * queued (it must not block nor call back into the scheduler except sched_req_next).
 * Returns 0 and *out, or KVS_ENOSPC (queue full), KVS_EBUSY (draining), KVS_ERANGE (does not
 * fit the context), KVS_EINVAL, KVS_ENOMEM. */
int sched_submit(sched *s, const sched_request_params *p, void (*notify)(void *ud), void *ud,
                 sched_req **out);

/* Takes the next queued event: returns 1 and fills *ev, 0 if none is queued now, or -1 when
 * every choice has finished and all events were taken. Never blocks. */
int sched_req_next(sched_req *r, sched_event *ev);

/* The client is done with r (finished, or gone: an unfinished request is cancelled and its
 * blocks return to the pool within one step). r must not be used afterwards. Waits for a
 * notify call in progress, so once this returns notify(ud) is never called again: do not
 * call it while holding a lock that notify takes. */
void sched_req_release(sched_req *r);

/* A snapshot of the scheduler's gauges, counters and histograms (Prometheus-ready). */
#define SCHED_HIST_BUCKETS 16
typedef struct sched_hist {
    double bounds[SCHED_HIST_BUCKETS]; /* upper bounds, ascending; +Inf implied after */
    int n_bounds;
    uint64_t counts[SCHED_HIST_BUCKETS + 1]; /* per bucket (not cumulative); last is +Inf */
    double sum;
    uint64_t count;
} sched_hist;

typedef struct sched_metrics {
    uint32_t num_requests_running;
    uint32_t num_requests_waiting;
    uint32_t kv_blocks_total;
    uint32_t kv_blocks_used;
    uint32_t kv_blocks_cached;
    double kv_cache_usage_ratio;
    /* The windowed layers' group (all 0 with one group). */
    uint32_t kv_window_blocks_total;
    uint32_t kv_window_blocks_used;
    uint32_t kv_window_blocks_cached;
    uint64_t kv_bytes_capacity; /* K/V bytes of every group's blocks */
    uint64_t kv_bytes_used;     /* K/V bytes of the blocks sequences hold, every group */
    uint64_t prompt_tokens_total;
    uint64_t generation_tokens_total;
    uint64_t prefix_cache_queries_total; /* blocks looked up */
    uint64_t prefix_cache_hits_total;    /* blocks found */
    uint64_t preemptions_total;
    uint64_t steps_total;
    uint64_t multi_seq_steps_total; /* steps that carried more than one sequence */
    sched_hist time_to_first_token_seconds;
    sched_hist inter_token_latency_seconds;
    sched_hist e2e_request_latency_seconds;
    sched_hist batch_size; /* sequences per step */
} sched_metrics;

void sched_get_metrics(sched *s, sched_metrics *m);

/* A consistent picture of the KV pool for people to look at (the web page's grid): every
 * block's state and holders, and the running sequences, taken by the engine thread between
 * two steps so nothing moves while it is copied. The copy is O(blocks + block-table
 * entries) on the engine thread (a 100k-block pool costs well under a millisecond); the
 * buffers are allocated by the caller. */
enum sched_block_state {
    SCHED_BLOCK_FREE = 0,   /* holds nothing findable */
    SCHED_BLOCK_CACHED = 1, /* no holder, kept for prefix reuse until evicted */
    SCHED_BLOCK_USED = 2,   /* in one or more block tables (refs says how many) */
};

typedef struct sched_kv_seq {
    uint64_t request;         /* the request's serial (sched_req_serial) */
    uint32_t choice;          /* which of its n choices */
    uint32_t n_tokens;        /* prompt + generated so far */
    uint32_t n_blocks;        /* length of its block table */
    uint32_t n_window_blocks; /* windowed-group blocks it holds now (0 with one group) */
} sched_kv_seq;

typedef struct sched_kv_snapshot {
    uint64_t steps;      /* engine steps run when it was taken */
    uint32_t block_size; /* tokens per block */
    uint32_t n_blocks;
    uint8_t *state;     /* [n_blocks] enum sched_block_state */
    uint16_t *refs;     /* [n_blocks] block tables holding the block (saturates at 65535) */
    int32_t *owner;     /* [n_blocks] index in seqs of the oldest sequence holding it, or -1 */
    uint32_t n_seqs;    /* running sequences, oldest first */
    sched_kv_seq *seqs; /* [max_num_seqs] */
    uint32_t n_waiting; /* sequences waiting for admission (they hold no blocks) */
    /* The block arrays picture the global group (every layer with one group); the windowed
     * group, when there is one, is summed here. */
    uint32_t window; /* the windowed layers' window, 0 with one group */
    uint32_t n_window_blocks, window_used, window_cached;
    uint64_t bytes_used; /* K/V bytes of the blocks sequences hold, every group */
    double fill_seconds; /* what taking it cost the engine thread */
} sched_kv_snapshot;

/* Takes a snapshot into *out (allocated here; free with sched_kv_snapshot_free; *out is
 * zeroed on failure). Waits for the engine thread to reach the end of its current step, at
 * most timeout_ms. Returns 0, KVS_EBUSY (the scheduler is stopping, or the step outlasted
 * timeout_ms), KVS_ENOMEM. Any thread; callers are served one at a time. */
int sched_kv_snapshot_take(sched *s, sched_kv_snapshot *out, int timeout_ms);
void sched_kv_snapshot_free(sched_kv_snapshot *snap);

/* Tokens generated so far over all of the request's choices, whether or not their events
 * were taken (a cancelled request's log line counts them). Any thread, before release. */
uint32_t sched_req_generated(sched_req *r);

/* The request's serial number: 1, 2, ... in submission order, the `request` of its
 * sequences in a snapshot. */
uint64_t sched_req_serial(const sched_req *r);

#endif
