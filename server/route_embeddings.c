/* POST /v1/embeddings: each input tokenized (BOS, and EOS where the file says so, as llama.cpp
 * does for an embedding model), run as a scheduler request that pools its hidden states
 * (sched_request_params.embed: the file's pooling or --pooling) and comes back L2-normalized,
 * as vLLM and llama-server return them. The inputs share the batch with everything else; a
 * request of many inputs keeps at most --max-num-seqs of them in the scheduler at once, so a
 * batch of 2048 does not meet the queue bound (429) that 2048 clients would. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "server/embeddings.h"
#include "server/http_impl.h"

struct srv_embed_state {
    srv_embed_request rq;
    int32_t **ids; /* [n_inputs] tokenized */
    size_t *n_ids;
    float *vecs; /* [n_inputs][n_embd] */
    bool *have;
    uint32_t next;     /* inputs submitted */
    uint32_t inflight; /* submitted and not finished */
    engine_pooling pooling;
};

void srv__embed_free(srv_conn *c)
{
    struct srv_embed_state *e = c->emb;
    if (!e)
        return;
    for (size_t k = 0; e->ids && k < e->rq.n_inputs; k++)
        free(e->ids[k]);
    free(e->ids);
    free(e->n_ids);
    free(e->vecs);
    free(e->have);
    srv_embed_request_free(&e->rq);
    free(e);
    c->emb = NULL;
}

/* --pooling, or the file's, or last (a decoder-only model's last position has read them all) */
static engine_pooling pooling_of(const srv_server *s)
{
    const char *p = s->cfg->pooling;
    if (p && !strcmp(p, "mean"))
        return ENGINE_POOLING_MEAN;
    if (p && !strcmp(p, "cls"))
        return ENGINE_POOLING_CLS;
    if (p && !strcmp(p, "last"))
        return ENGINE_POOLING_LAST;
    engine_pooling f = engine_model_pooling(s->model);
    return f != ENGINE_POOLING_NONE ? f : ENGINE_POOLING_LAST;
}

static enum MHD_Result embed_finish(srv_conn *c)
{
    struct srv_embed_state *e = c->emb;
    if (c->fail_status) {
        srv_error err;
        srv__error_of_status(c->fail_status, &err);
        return srv__send_error(c, &err);
    }
    for (size_t k = 0; k < e->rq.n_inputs; k++)
        if (!e->have[k])
            return srv__fail(c, 500, NULL, NULL, "an input has no embedding");
    return srv__send_built(c, srv_embed_response(c->srv->served_name, e->vecs, e->rq.n_inputs,
                                                 engine_model_hparams(c->srv->model)->n_embd,
                                                 e->rq.base64, c->prompt_tokens));
}

enum MHD_Result srv__embed_pump(srv_conn *c)
{
    srv_server *s = c->srv;
    struct srv_embed_state *e = c->emb;
    uint32_t n = (uint32_t)e->rq.n_inputs, E = engine_model_hparams(s->model)->n_embd;
    for (;;) {
        while (e->next < n && e->inflight < s->cfg->max_num_seqs && !c->fail_status) {
            sched_request_params p = {0};
            p.prompt = e->ids[e->next];
            p.n_prompt = (uint32_t)e->n_ids[e->next];
            p.n = 1;
            p.sampling = sampler_default_params();
            p.n_top_logprobs = -1;
            p.embed = e->pooling;
            p.notify_on_finish_only = true;
            int rc = sched_submit(s->sched, &p, srv__on_notify, c->wake, &c->reqs[e->next]);
            if (rc == KVS_ENOSPC && e->inflight)
                break; /* the queue is full of others': ours make room as they finish */
            if (rc == KVS_ENOSPC)
                return srv__fail(c, 429, NULL, NULL, "too many requests waiting; retry later");
            if (rc == KVS_EBUSY)
                return srv__fail(c, 503, NULL, NULL, "the server is shutting down");
            if (rc) {
                srv_error err;
                srv_error_set(&err, 500, NULL, NULL, "submit failed: %s", status_str(rc));
                return srv__send_error(c, &err);
            }
            if (!c->n_reqs)
                atomic_fetch_add(&s->n_active, 1);
            c->n_reqs++;
            e->next++;
            e->inflight++;
        }
        sched_event ev;
        int r = srv__next_or_suspend(c, &ev);
        if (r == 0)
            return MHD_YES;
        if (r == -2)
            return MHD_NO; /* client gone */
        if (r < 0) {
            if (e->next < n && !c->fail_status)
                continue; /* every input submitted so far is done: the next ones */
            return embed_finish(c);
        }
        srv__note_event(c, &ev);
        uint32_t k = ev.choice; /* one choice per input */
        if (ev.embedding && ev.n_embedding == E && k < n) {
            double ss = 0;
            for (uint32_t i = 0; i < E; i++)
                ss += (double)ev.embedding[i] * ev.embedding[i];
            float inv = ss > 0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
            for (uint32_t i = 0; i < E; i++)
                e->vecs[(size_t)k * E + i] = ev.embedding[i] * inv;
            e->have[k] = true;
        }
        if (ev.finish != SCHED_FINISH_NONE)
            e->inflight--;
        sched_event_free(&ev);
    }
}

enum MHD_Result srv__route_embeddings(srv_conn *c)
{
    srv_server *s = c->srv;
    srv_error err;
    struct srv_embed_state *e = calloc(1, sizeof *e);
    if (!e)
        return srv__fail(c, 500, NULL, NULL, "out of memory");
    c->emb = e;
    if (srv_embed_parse(c->body ? c->body : "", c->body_len, &e->rq, &err))
        return srv__send_error(c, &err);
    if (e->rq.model && strcmp(e->rq.model, s->served_name)) {
        srv_error_set(&err, 404, "model", "model_not_found", "The model '%s' does not exist",
                      e->rq.model);
        return srv__send_error(c, &err);
    }
    uint32_t E = engine_model_hparams(s->model)->n_embd;
    if (e->rq.dimensions >= 0 && e->rq.dimensions != E) {
        srv_error_set(&err, 400, "dimensions", NULL,
                      "this model's embeddings have %u dimensions; 'dimensions' %lld cannot "
                      "change that",
                      E, (long long)e->rq.dimensions);
        return srv__send_error(c, &err);
    }
    size_t n = e->rq.n_inputs;
    uint64_t bound = (uint64_t)n * E * (e->rq.base64 ? 6 : 16);
    if (bound > (uint64_t)s->cfg->max_response_mb << 20) {
        srv_error_set(&err, 400, "input", NULL,
                      "%zu embeddings of %u dimensions could make a response of %.0f MB; the "
                      "limit is %u MB (--max-response-mb): send fewer inputs at a time",
                      n, E, (double)bound / (1 << 20), s->cfg->max_response_mb);
        return srv__send_error(c, &err);
    }
    e->ids = calloc(n, sizeof *e->ids);
    e->n_ids = calloc(n, sizeof *e->n_ids);
    e->vecs = malloc(n * E * sizeof *e->vecs);
    e->have = calloc(n, sizeof *e->have);
    c->reqs = calloc(n, sizeof *c->reqs);
    if (!e->ids || !e->n_ids || !e->vecs || !e->have || !c->reqs)
        return srv__fail(c, 500, NULL, NULL, "out of memory");
    int32_t nv = tok_n_vocab(s->vocab);
    uint64_t total = 0;
    for (size_t k = 0; k < n; k++) {
        srv_embed_input *in = &e->rq.inputs[k];
        if (in->text) {
            if (srv__tokenize_special(s->vocab, in->text, true, &e->ids[k], &e->n_ids[k]))
                return srv__fail(c, 500, NULL, NULL, "tokenization failed");
        } else {
            for (size_t i = 0; i < in->n_ids; i++)
                if (in->ids[i] >= nv) {
                    srv_error_set(&err, 400, "input", NULL,
                                  "token id %d is outside the vocabulary (input %zu)", in->ids[i],
                                  k);
                    return srv__send_error(c, &err);
                }
            e->ids[k] = in->ids;
            e->n_ids[k] = in->n_ids;
            in->ids = NULL;
        }
        if (e->n_ids[k] == 0 || e->n_ids[k] > s->n_ctx) {
            srv_error_set(&err, 400, "input", e->n_ids[k] ? "context_length_exceeded" : NULL,
                          "input %zu has %zu tokens; this model takes 1 to %u", k, e->n_ids[k],
                          s->n_ctx);
            return srv__send_error(c, &err);
        }
        total += e->n_ids[k];
    }
    c->prompt_tokens = (uint32_t)(total > UINT32_MAX ? UINT32_MAX : total);
    c->n_per = 1;
    e->pooling = pooling_of(s);
    c->wake = srv__wake_get(s, c->mc);
    if (!c->wake)
        return srv__fail(c, 500, NULL, NULL, "out of memory");
    srv__sock_set_wake(s, c->mc, c->wake);
    c->phase = PH_WAIT;
    return srv__embed_pump(c);
}
