/* The scheduler's internal structs and sched__ functions, shared by its files: scheduler.c
 * (lifecycle), request.c (submit, event queues), plan.c (step plans), output.c (sampling and
 * events), loop.c (the engine thread), metrics.c and snapshot.c (pictures of the KV pool).
 * Visible to the scheduler's own files only: nothing outside scheduler/ includes it. Lock rules
 * are written at each struct. */
#ifndef KVS_SCHEDULER_SCHED_IMPL_H
#define KVS_SCHEDULER_SCHED_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/grammar.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"
#include "kvpool/kvpool.h"
#include "scheduler/scheduler.h"

/* ------------------------------------------------------------------ requests and events */

typedef struct event_node {
    sched_event ev;
    struct event_node *next;
} event_node;

struct sched_req {
    /* fixed after submit */
    sched *owner;
    int32_t *prompt;
    uint32_t n_prompt;
    uint32_t max_tokens;
    uint32_t n;
    sampler_params sampling;
    bool ignore_eos;
    char *stop[SCHED_MAX_STOP];
    size_t stop_len[SCHED_MAX_STOP];
    int n_stop;
    size_t max_stop_len;
    int n_top_logprobs;
    bool prompt_logprobs;
    engine_pooling embed;
    bool notify_on_finish_only;
    sched_logit_bias *bias;
    uint32_t n_bias;
    grammar_def *gdef; /* NULL: unconstrained; owned, outlives every seq's grammar */
    void (*notify)(void *ud);
    void *ud;
    double t_submit;

    /* mu guards the event queue, the flags, refs and notifying (see scheduler.h) */
    pthread_mutex_t mu;
    pthread_cond_t notify_done; /* signalled when a notify call returns */
    int notifying;              /* notify calls in progress: release waits for them */
    event_node *head, *tail;
    uint32_t n_finished_taken;  /* finishing events handed to the client */
    int refs;                   /* client + engine */
    atomic_bool released;       /* client gone: cancel (read lock-free by the engine thread) */
    _Atomic uint32_t generated; /* tokens sampled over all choices (engine thread adds) */

    uint64_t serial; /* 1, 2, ... in submission order (set under the inbox lock) */

    /* engine thread only */
    struct sched_req *inbox_next;
    uint32_t n_done; /* choices finished */
    bool first_token_seen;
    uint32_t cached_tokens;
};

enum seq_state { SEQ_WAITING, SEQ_RUNNING };

typedef struct seq {
    sched_req *req;
    uint32_t choice;
    bool fork_pending;  /* first choice of an n > 1 request whose prompt is not computed yet */
    bool ever_admitted; /* has left the queue once (the 429 bound counts queued requests) */
    enum seq_state state;
    uint64_t admit_order; /* larger = admitted later = first to be preempted */
    kvpool_seq *kv;       /* the global layers' table (every layer's with one group) */
    kvpool_seq *wkv;      /* the windowed layers' table, NULL with one group (see seq_kv.c) */
    int32_t *tokens; /* prompt + generated; the last one may be sampled but not yet forwarded */
    uint32_t n_tokens, cap;
    uint32_t n_computed; /* positions whose K/V are in the arena */
    uint32_t n_generated;
    sampler *smp;
    grammar *gram; /* with req->gdef: this choice's position in it */
    tok_decoder dec;
    char *held; /* decoded text not yet emitted: could be the start of a stop string */
    size_t held_len, held_cap;
    double t_last_token;
    /* The prompt's logprobs (req->prompt_logprobs), first choice only: plp[i] is token i + 1's,
     * set for i < plp_done; handed to the prompt event once the prompt is computed (plp_sent).
     * A preempted sequence keeps them and computes only the rows still missing. */
    sched_token_info *plp;
    uint32_t plp_done;
    bool plp_sent;
    /* An embedding's pooling (req->embed): the sum of the pooled rows' hidden states so far,
     * in position order, and how many; a preempted sequence starts them over. */
    double *pool;
    uint32_t pool_n;
    /* this step */
    uint32_t chunk;         /* rows in the batch */
    int logits_row;         /* index into the logits buffer, -1 if none */
    int plp_row;            /* logits row of this step's first prompt-logprob row */
    uint32_t plp_lo, plp_n; /* its positions: plp_lo .. plp_lo + plp_n - 1 */
    int hid_row;            /* an embedding: hidden-state row of this step's first pooled row */
    uint32_t hid_n;         /* its pooled rows this step */
    struct seq *prev, *next;
} seq;

typedef struct seq_list {
    seq *head, *tail;
    uint32_t n;
} seq_list;

/* ------------------------------------------------------------------ the scheduler */

struct sched {
    sched_params p;
    const engine_model *model;
    const tok_vocab *vocab;
    uint32_t n_vocab;
    int32_t stop_ids[TOK_MAX_EOG + 1]; /* the vocabulary's end-of-generation set, then BOS */
    int n_stop_ids;
    grammar_vocab *gvocab; /* the vocabulary's trie for grammar masks, end tokens = stop_ids */
    int32_t n_gtokens;     /* logits the mask covers: min(trie tokens, n_vocab); beyond: none */
    uint32_t *gmask;       /* (grammar_mask_words(trie tokens)) engine thread's scratch */

    kvpool *pool;
    uint32_t n_blocks; /* the pool's size, fixed at create (read by any thread) */
    kvpool *wpool;     /* the windowed layers' pool of a split arena, else NULL (seq_kv.c) */
    uint32_t n_wblocks;
    uint32_t window;                  /* the windowed layers' window, with wpool */
    size_t block_bytes, wblock_bytes; /* bytes of a block of pool, of wpool */
    engine_kv *kv;
    engine_ctx *ctx;
    /* (logits_rows + 1, n_vocab): the rows engine_forward writes, then the sampler's scratch.
     * logits_rows is max_num_seqs, grown by plp_rows the first time a request asks for prompt
     * logprobs. */
    float *logits;
    uint32_t logits_rows;
    uint32_t plp_rows;      /* prompt-logprob rows one step computes at most (plan.c) */
    uint32_t plp_rows_left; /* this step's */
    bool *b_hidden;         /* (max_batched_tokens) rows whose hidden state an embedding pools */
    float *hidden;          /* (max_batched_tokens, n_embd) once an embedding was asked for */
    uint32_t n_embd;
    /* batch arrays, (max_batched_tokens) */
    int32_t *b_token, *b_pos, *b_seq;
    bool *b_logits;
    engine_seq_view *b_views; /* (max_num_seqs) */
    seq **b_seqs;             /* (max_num_seqs) */
    kvpool_copy *copies;      /* (2 * max_num_seqs) */
    int *copy_group;          /* (2 * max_num_seqs) ENGINE_KV_GLOBAL / _WINDOWED of each copy */
    int n_copies;

    pthread_t thread;
    bool thread_started;

    /* inbox_mu guards everything in this group */
    pthread_mutex_t inbox_mu;
    pthread_cond_t inbox_cv;
    sched_req *inbox_head, *inbox_tail;
    uint32_t n_queued; /* submitted and not yet admitted-or-finished: the 429 bound */
    uint32_t n_unfinished;
    bool stop;
    bool draining;
    bool abort_all;
    bool wake; /* something changed (release, abort) that the engine thread should look at */
    uint64_t next_serial;
    /* A KV snapshot asked for (see snapshot.c): posted by a taker (snap_want, SNAP_POSTED);
     * the engine thread takes it between two steps (SNAP_TAKEN), fills it without the lock,
     * then sets SNAP_DONE and broadcasts snap_cv. A taker whose wait times out may withdraw
     * a snapshot still POSTED, never a TAKEN one (the engine is writing into it). snap_mu
     * (taken before inbox_mu, never by the engine thread) serves one taker at a time. */
    sched_kv_snapshot *snap_want;
    enum { SNAP_IDLE, SNAP_POSTED, SNAP_TAKEN, SNAP_DONE } snap_state;
    pthread_cond_t snap_cv;
    pthread_mutex_t snap_mu;

    /* engine thread only */
    sched_kv_snapshot obs; /* p.step_observer's picture, buffers allocated at create */
    seq_list waiting;
    seq_list running;
    uint64_t admit_counter;

    /* metrics_mu guards m */
    pthread_mutex_t metrics_mu;
    sched_metrics m;
};

/* ------------------------------------------------------------------ shared by the files */

static inline void sched__list_push_back(seq_list *l, seq *s)
{
    s->next = NULL;
    s->prev = l->tail;
    if (l->tail)
        l->tail->next = s;
    else
        l->head = s;
    l->tail = s;
    l->n++;
}

static inline void sched__list_push_front(seq_list *l, seq *s)
{
    s->prev = NULL;
    s->next = l->head;
    if (l->head)
        l->head->prev = s;
    else
        l->tail = s;
    l->head = s;
    l->n++;
}

static inline void sched__list_remove(seq_list *l, seq *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        l->head = s->next;
    if (s->next)
        s->next->prev = s->prev;
    else
        l->tail = s->prev;
    s->prev = s->next = NULL;
    l->n--;
}

/* request.c. Drops a reference; the last one frees the request. */
void sched__req_unref(sched_req *r);
/* Queues an event (taking ownership of its buffers) and tells the client. Engine thread. */
void sched__push_event(sched_req *r, sched_event *ev);

/* Whether q still has prompt logprobs to compute (its positions' rows are marked for logits). */
static inline bool sched__plp_pending(const seq *q)
{
    return q->req->prompt_logprobs && !q->plp_sent;
}

/* plan.c (engine thread). Plans one step into the batch arrays; returns sequences planned. */
uint32_t sched__plan_step(sched *s, uint32_t *n_rows_out);
/* Frees a running sequence's blocks and requeues it at the head of the waiting queue. */
void sched__preempt(sched *s, seq *q);

/* output.c (engine thread). A request's first sequence (NULL on OOM). */
seq *sched__seq_new(sched *s, sched_req *r);
/* Sends the choice's last event and retires (frees) the sequence, removing it from `from`. */
void sched__finish_seq(sched *s, seq_list *from, seq *q, enum sched_finish why, int status);
/* The same, its event also carrying the last token's info (tokens, n_tokens; taken over), so
 * a choice's last text and its logprobs arrive together. */
void sched__finish_seq_tokens(sched *s, seq_list *from, seq *q, enum sched_finish why, int status,
                              sched_token_info *tokens, uint32_t n_tokens);
/* The hidden-state buffer embeddings need (once); KVS_ENOMEM. */
int sched__embed_buffers(sched *s);
/* Adds q's pooled rows of this step (hidden states from row q->hid_row) to its sums, and once
 * the prompt is computed sends the embedding event and finishes q. */
void sched__embed_collect(sched *s, seq *q);
/* Grows s->logits for prompt logprobs (once); KVS_ENOMEM. */
int sched__plp_buffers(sched *s);
/* Turns q's prompt-logprob rows of this step (logits from row q->plp_row) into q->plp, and
 * sends the prompt event once the prompt is computed. */
void sched__plp_collect(sched *s, seq *q, const float *logits);
/* Samples q's next token from its logits row and publishes it; true if q finished (freed). */
bool sched__sample_and_emit(sched *s, seq *q, const float *row_in, float *scratch);
/* Creates the other n - 1 choices of q's request, sharing q's blocks. */
void sched__fork_choices(sched *s, seq *q);

/* seq_kv.c (engine thread): a sequence's tables in every layer group. */
int sched__kv_create(sched *s, seq *q);
/* Releases both tables' blocks; q->kv and q->wkv become NULL. */
void sched__kv_free(sched *s, seq *q);
/* For fresh tables: attaches the longest prefix hit every group can use (see seq_kv.c) into
 * *covered. KVS_ENOMEM only (then q holds no tables). */
int sched__kv_match_prefix(sched *s, seq *q, uint32_t *covered);
/* Whether the pools can hold n_left more tokens of q (the windowed group: its window's worth). */
bool sched__kv_fits(const sched *s, const seq *q, uint32_t n_left);
/* The most windowed blocks one sequence holds at once. */
uint32_t sched__kv_window_blocks(const sched *s);
/* Reserves q's next chunk in every group, queueing the copy-on-writes. 0; KVS_ENOSPC or
 * KVS_ENOMEM with nothing changed; KVS_EIO when the groups now disagree (the caller must
 * free q's tables). */
int sched__kv_reserve(sched *s, seq *q, uint32_t chunk);
/* After a step computed q up to q->n_computed: commits every group and releases the
 * windowed blocks before q's window. */
void sched__kv_commit(sched *s, seq *q);
/* f's tables share every block of q's. */
int sched__kv_fork(sched *s, const seq *q, seq *f);
void sched__kv_view(const sched *s, const seq *q, engine_seq_view *v);

/* loop.c: the engine thread's body. */
void *sched__engine_main(void *arg);

/* metrics.c. */
void sched__init_metrics(sched_metrics *m);
void sched__hist_add(sched_hist *h, double v);
/* Copies the pool's gauges into the metrics (engine thread, or before it starts). */
void sched__update_gauges(sched *s);

/* snapshot.c. Fills snap (buffers sized by sched_kv_snapshot) from the pool and the running
 * list. Engine thread, between steps. */
void sched__fill_snapshot(sched *s, sched_kv_snapshot *snap);

#endif
