/* POST /v1/completions and /v1/chat/completions: parse (server/api.c), tokenize, submit to the
 * scheduler, then a whole response at the end or an SSE stream event by event. */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "common/log.h"
#include "common/status.h"
#include "common/timeutil.h"
#include "server/api.h"
#include "server/http_impl.h"
#include "server/tool_calls.h"

static enum MHD_Result finish_full(srv_conn *c);

void srv__note_event(srv_conn *c, const sched_event *ev)
{
    if (ev->prompt)
        return; /* the prompt's logprobs: no generated token */
    if (c->t_first == 0 && (ev->text_len || ev->n_tokens))
        c->t_first = time_now_s();
    /* The scheduler queues one delta per token that produced text or logprobs. */
    if (ev->finish == SCHED_FINISH_NONE)
        c->delta_tokens += ev->n_tokens ? ev->n_tokens : (ev->text_len ? 1 : 0);
    if (ev->finish != SCHED_FINISH_NONE) {
        /* prompt_tokens is the prompts' sum, set at submit; each prompt's cached tokens
         * count once, from its first choice */
        if (c->n_per && ev->choice % c->n_per == 0)
            c->cached_tokens += ev->cached_tokens;
        c->completion_tokens += ev->completion_tokens;
        if (ev->finish == SCHED_FINISH_ERROR && !c->fail_status)
            c->fail_status = ev->status ? ev->status : KVS_EINVAL;
    }
}

void srv__error_of_status(int st, srv_error *e)
{
    if (st == KVS_ECANCELED || st == KVS_EBUSY)
        srv_error_set(e, 503, NULL, NULL, "the server is shutting down; request aborted");
    else
        srv_error_set(e, 500, NULL, NULL, "generation failed: %s", status_str(st));
}

/* Non-streaming: drain events until every choice finished, suspending in between. */
enum MHD_Result srv__pump_full(srv_conn *c)
{
    for (;;) {
        sched_event ev;
        int r = srv__next_or_suspend(c, &ev);
        if (r == 0)
            return MHD_YES;
        if (r == -2)
            return MHD_NO; /* client gone */
        if (r < 0)
            return finish_full(c);
        srv__note_event(c, &ev);
        bool consumed = false;
        if (!srv__echo_event(c, &ev, &consumed))
            c->fail_status = KVS_ENOMEM;
        if (!consumed)
            srv__count_reasoning(c, &ev);
        if (!consumed && ev.choice < c->n_choices && srv_choice_add(&c->choices[ev.choice], &ev))
            c->fail_status = KVS_ENOMEM;
        sched_event_free(&ev);
    }
}

/* With tools on, reads choice ch's calls out of its text (ending with "stop": a call cut by
 * max_tokens is left as text); ch->text keeps what is not a call. KVS_ENOMEM. */
int srv__read_tool_calls(srv_conn *c, uint32_t idx, srv_choice *ch)
{
    srv_request *rq = &c->rq;
    if (!rq->tools || rq->tool_choice == SRV_TOOLS_NONE || ch->finish != SCHED_FINISH_STOP)
        return 0;
    /* a forced call in the family's own syntax is read as an unforced one */
    bool forced = (rq->tool_choice == SRV_TOOLS_REQUIRED || rq->tool_choice == SRV_TOOLS_NAMED) &&
                  !rq->tool_native;
    char base[48];
    size_t idl = strlen(c->id);
    snprintf(base, sizeof base, "%s_%u", c->id + (idl > 16 ? idl - 16 : 0), idx);
    cJSON *calls;
    char *rest;
    const char *text = ch->text ? ch->text : "";
    size_t len = ch->len, kept = 0;
    kvs_buf call = {0}, none = {0};
    if (rq->tool_native && c->srv->chat.tmpl == SRV_CHAT_HARMONY && !srv__splits_reasoning(c)) {
        /* gpt-oss's forced call with --reasoning-format none: the text is as the model wrote
         * it, which the harmony splitter turns into the form the call reader takes
         * (reasoning.h). The analysis message the grammar lets come first (its body ends at
         * the first <|end|>) stays content as written, as llama-server's none leaves it. */
        static const char an[] = "<|channel|>analysis<|message|>", end[] = "<|end|>";
        const char *e = strncmp(text, an, sizeof an - 1) ? NULL : strstr(text, end);
        kept = e ? (size_t)(e - text) + sizeof end - 1 : 0;
        srv_think t = {.harmony = true};
        srv_think_feed(&t, text, len, &none, &call);
        srv_think_end(&t, &none, &call);
        bool failed = call.oom || none.oom;
        kvs_buf_free(&none);
        if (failed) {
            kvs_buf_free(&call);
            return KVS_ENOMEM;
        }
        text = call.p ? call.p : "";
        len = call.len;
    }
    int n = srv_tools_parse(c->srv->chat.tmpl, text, len, forced, rq->tools, base, &calls, &rest);
    kvs_buf_free(&call);
    if (n > 0 && kept) {
        kvs_buf b = {0};
        kvs_buf_addn(&b, ch->text, kept);
        kvs_buf_add(&b, rest);
        free(rest);
        rest = NULL;
        if (kvs_buf_take(&b, &rest)) {
            cJSON_Delete(calls);
            return KVS_ENOMEM;
        }
    }
    if (n <= 0)
        return n;
    if (!rq->parallel_tool_calls)
        while (cJSON_GetArraySize(calls) > 1)
            cJSON_DeleteItemFromArray(calls, cJSON_GetArraySize(calls) - 1);
    free(ch->text);
    ch->text = rest;
    ch->len = strlen(rest);
    ch->cap = ch->len + 1;
    ch->tool_calls = calls;
    return 0;
}

bool srv__splits_reasoning(const srv_conn *c)
{
    const char *f = c->srv->cfg->reasoning_format;
    enum srv_chat_tmpl t = c->srv->chat.tmpl;
    return (c->route == R_CHAT || c->route == R_RESPONSES) &&
           (srv_chat_may_think(t) || t == SRV_CHAT_HARMONY) && !(f && !strcmp(f, "none"));
}

void srv__split_event(const srv_conn *c, srv_think *th, const sched_event *ev, kvs_buf *r,
                      kvs_buf *t)
{
    srv_think_set_format(th, c->srv->chat.tmpl);
    srv_think_feed(th, ev->text ? ev->text : "", ev->text_len, r, t);
    if (ev->finish != SCHED_FINISH_NONE)
        srv_think_end(th, r, t);
}

void srv__count_reasoning(srv_conn *c, const sched_event *ev)
{
    if (ev->choice >= c->n_choices || ev->prompt || ev->finish == SCHED_FINISH_ERROR ||
        !srv__splits_reasoning(c))
        return;
    srv_choice *ch = &c->choices[ev->choice];
    kvs_buf r = {0}, t = {0};
    srv__split_event(c, &ch->count, ev, &r, &t);
    if (r.len)
        ch->reasoning_tokens = ev->generated;
    kvs_buf_free(&r);
    kvs_buf_free(&t);
}

/* A chat answer's split (reasoning.h); responses split theirs in route_responses.c. */
static bool splits_reasoning(const srv_conn *c)
{
    return c->route == R_CHAT && srv__splits_reasoning(c);
}

static enum MHD_Result finish_full(srv_conn *c)
{
    if (c->fail_status) {
        srv_error e;
        srv__error_of_status(c->fail_status, &e);
        return srv__send_error(c, &e);
    }
    bool split = srv__splits_reasoning(c);
    for (uint32_t i = 0; i < c->n_choices; i++)
        if ((split && srv_choice_split_reasoning(&c->choices[i], c->srv->chat.tmpl)) ||
            srv__read_tool_calls(c, i, &c->choices[i]))
            return srv__fail(c, 500, NULL, NULL, "out of memory");
    return srv__send_built(c, c->route == R_RESPONSES
                                  ? srv__responses_full(c)
                                  : srv_resp_full(&c->rx, c->choices, c->n_choices,
                                                  c->prompt_tokens, c->cached_tokens));
}

bool srv__out_append(srv_conn *c, char *s)
{
    if (!s)
        return false;
    size_t n = strlen(s);
    if (c->out_len + n > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 1024;
        while (cap < c->out_len + n)
            cap *= 2;
        char *np = realloc(c->out, cap);
        if (!np) {
            free(s);
            return false;
        }
        c->out = np;
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, s, n);
    c->out_len += n;
    free(s);
    return true;
}

/* Sends choice ch's finish: the content not sent yet, then its calls or its finish_reason. */
static bool stream_tools_end(srv_conn *c, srv_choice *ch, uint32_t idx, enum sched_finish finish)
{
    bool ok = true;
    if (ch->len > ch->sent)
        ok = srv__out_append(c, srv_resp_chunk(&c->rx, idx, ch->text + ch->sent, ch->len - ch->sent,
                                               NULL, 0, SCHED_FINISH_NONE, false, 0));
    if (ok && ch->tool_calls)
        return srv__out_append(c, srv_resp_tool_calls_chunk(&c->rx, idx, ch->tool_calls)) &&
               srv__out_append(c, srv_resp_tool_calls_finish(&c->rx, idx));
    return ok && srv__out_append(c, srv_resp_chunk(&c->rx, idx, "", 0, NULL, 0, finish, false, 0));
}

/* A streamed event with tool_choice auto: reasoning (if the template thinks) goes out as it
 * comes; content goes out as far as it cannot be the start of a call (srv_tools_stream_safe),
 * the rest at the end, when the calls are read out of the whole answer. Logprobs take the
 * held path below instead, where every token is sent with the text it made. */
static bool stream_tools_auto(srv_conn *c, srv_choice *ch, const sched_event *ev, bool split)
{
    kvs_buf r = {0}, t = {0};
    if (split) {
        srv__split_event(c, &ch->think, ev, &r, &t);
    } else {
        kvs_buf_addn(&t, ev->text, ev->text_len);
    }
    sched_event content = *ev;
    content.text = t.p ? t.p : "";
    content.text_len = t.len;
    content.n_tokens = 0;
    bool ok = !r.oom && !t.oom && !srv_choice_add(ch, &content);
    if (ok && r.len)
        ok = srv__out_append(c, srv_resp_reasoning_chunk(&c->rx, ev->choice, r.p, r.len, NULL, 0));
    kvs_buf_free(&r);
    kvs_buf_free(&t);
    if (!ok)
        return false;
    if (ev->finish == SCHED_FINISH_NONE) {
        size_t safe = srv_tools_stream_safe(c->srv->chat.tmpl, ch->text ? ch->text : "", ch->len);
        if (safe <= ch->sent)
            return true;
        ok = srv__out_append(c,
                             srv_resp_chunk(&c->rx, ev->choice, ch->text + ch->sent,
                                            safe - ch->sent, NULL, 0, SCHED_FINISH_NONE, false, 0));
        ch->sent = safe;
        return ok;
    }
    if (srv__read_tool_calls(c, ev->choice, ch))
        return false;
    return stream_tools_end(c, ch, ev->choice, ev->finish);
}

/* A streamed chat event of a thinking model: its text through the choice's splitter, sent as
 * a reasoning delta and/or a content delta as far as it is placed (a tag cut between two
 * tokens waits for the next). The tokens' logprobs ride on the last delta sent, or on an empty
 * content delta when all their text is held. */
static bool stream_split(srv_conn *c, srv_choice *ch, const sched_event *ev)
{
    kvs_buf r = {0}, t = {0};
    srv__split_event(c, &ch->think, ev, &r, &t);
    bool ok = !r.oom && !t.oom;
    const sched_token_info *toks = ev->tokens;
    uint32_t nt = c->rx.n_top_logprobs >= 0 ? ev->n_tokens : 0;
    if (ok && r.len)
        ok = srv__out_append(c, srv_resp_reasoning_chunk(&c->rx, ev->choice, r.p, r.len,
                                                         t.len ? NULL : toks, t.len ? 0 : nt));
    if (ok && (t.len || (!r.len && nt)))
        ok = srv__out_append(c, srv_resp_chunk(&c->rx, ev->choice, t.p ? t.p : "", t.len, toks, nt,
                                               SCHED_FINISH_NONE, false, 0));
    kvs_buf_free(&r);
    kvs_buf_free(&t);
    if (ok && ev->finish != SCHED_FINISH_NONE)
        ok = srv__out_append(
            c, srv_resp_chunk(&c->rx, ev->choice, "", 0, NULL, 0, ev->finish, false, 0));
    return ok;
}

/* Formats one event as SSE: its text delta (if any, or if it carries logprobs), then the
 * finish chunk, or the error event that ends the stream. */
static bool format_event(srv_conn *c, const sched_event *ev)
{
    if (ev->choice >= c->n_choices)
        return true;
    srv_choice *ch = &c->choices[ev->choice];
    srv__count_reasoning(c, ev);
    if (c->route == R_RESPONSES)
        return srv__responses_event(c, ev);
    bool consumed;
    if (!srv__echo_event(c, ev, &consumed))
        return false;
    if (consumed)
        return true;
    if (ev->finish == SCHED_FINISH_ERROR) {
        srv_error e;
        srv__error_of_status(ev->status, &e);
        char *j = srv_error_json(&e);
        bool ok = srv__out_append(c, srv_sse_wrap(j));
        free(j);
        c->ss = SS_END;
        return ok;
    }
    bool ok = true;
    bool split = splits_reasoning(c);
    if (c->rq.tools && c->rq.tool_choice == SRV_TOOLS_AUTO && c->rx.n_top_logprobs < 0)
        return stream_tools_auto(c, ch, ev, split);
    if (c->rq.tools && c->rq.tool_choice != SRV_TOOLS_NONE) {
        /* Whether the text is a call is known at its end: it is held until then, and sent
         * as one content delta or as the calls (after one reasoning delta, if it thought). */
        if (srv_choice_add(ch, ev))
            return false;
        if (ev->finish == SCHED_FINISH_NONE)
            return true;
        if (split && srv_choice_split_reasoning(ch, c->srv->chat.tmpl))
            return false;
        if (ch->reasoning &&
            !srv__out_append(c, srv_resp_reasoning_chunk(&c->rx, ev->choice, ch->reasoning,
                                                         strlen(ch->reasoning), NULL, 0)))
            return false;
        if (srv__read_tool_calls(c, ev->choice, ch))
            return false;
        if (ch->len || (!ch->tool_calls && ch->n_toks))
            ok = srv__out_append(c, srv_resp_chunk(&c->rx, ev->choice, ch->text, ch->len,
                                                   ch->tool_calls ? NULL : ch->toks,
                                                   ch->tool_calls ? 0 : (uint32_t)ch->n_toks,
                                                   SCHED_FINISH_NONE, false, 0));
        if (ok && ch->tool_calls)
            ok =
                srv__out_append(c, srv_resp_tool_calls_chunk(&c->rx, ev->choice, ch->tool_calls)) &&
                srv__out_append(c, srv_resp_tool_calls_finish(&c->rx, ev->choice));
        else if (ok)
            ok = srv__out_append(
                c, srv_resp_chunk(&c->rx, ev->choice, "", 0, NULL, 0, ev->finish, false, ch->len));
        return ok;
    }
    if (split)
        return stream_split(c, ch, ev);
    if (ev->text_len || ev->n_tokens)
        ok = srv__out_append(c,
                             srv_resp_chunk(&c->rx, ev->choice, ev->text, ev->text_len, ev->tokens,
                                            ev->n_tokens, SCHED_FINISH_NONE, false, ch->len));
    ch->len += ev->text_len; /* only the offset is tracked: streams keep no text */
    if (ok && ev->finish != SCHED_FINISH_NONE)
        ok = srv__out_append(
            c, srv_resp_chunk(&c->rx, ev->choice, "", 0, NULL, 0, ev->finish, false, ch->len));
    return ok;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    srv_conn *c = cls;
    for (;;) {
        if (c->out_pos < c->out_len) {
            size_t n = c->out_len - c->out_pos;
            if (n > max)
                n = max;
            memcpy(buf, c->out + c->out_pos, n);
            c->out_pos += n;
            return (ssize_t)n;
        }
        c->out_len = c->out_pos = 0;
        if (c->ss == SS_END)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (atomic_load(&c->srv->state) == ST_STOPPING)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (c->ss == SS_START) {
            c->ss = SS_EVENTS;
            if (c->route == R_RESPONSES) {
                if (!srv__responses_start(c))
                    return MHD_CONTENT_READER_END_WITH_ERROR;
                continue;
            }
            if (c->rx.chat)
                for (uint32_t i = 0; i < c->n_choices; i++)
                    if (!srv__out_append(c, srv_resp_chunk(&c->rx, i, "", 0, NULL, 0,
                                                           SCHED_FINISH_NONE, true, 0)))
                        return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        sched_event ev;
        int r = srv__next_or_suspend(c, &ev);
        if (r == 0)
            return 0;
        if (r == -2)
            return MHD_CONTENT_READER_END_WITH_ERROR; /* client gone */
        if (r < 0 && c->route == R_RESPONSES) {
            if (!srv__responses_end(c))
                return MHD_CONTENT_READER_END_WITH_ERROR;
            c->ss = SS_END;
            continue;
        }
        if (r < 0) {
            uint32_t reasoning = 0;
            for (uint32_t i = 0; i < c->n_choices; i++)
                reasoning += c->choices[i].reasoning_tokens;
            if (c->rq.include_usage &&
                !srv__out_append(c, srv_resp_usage_chunk(&c->rx, c->prompt_tokens,
                                                         c->completion_tokens, reasoning)))
                return MHD_CONTENT_READER_END_WITH_ERROR;
            if (!srv__out_append(c, strdup("data: [DONE]\n\n")))
                return MHD_CONTENT_READER_END_WITH_ERROR;
            c->ss = SS_END;
            continue;
        }
        srv__note_event(c, &ev);
        bool ok = format_event(c, &ev);
        sched_event_free(&ev);
        if (!ok)
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static enum MHD_Result start_stream(srv_conn *c)
{
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_reader, c, NULL);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    srv__add_common_headers(c, r, 200);
    c->phase = PH_STREAM;
    c->status = 200;
    enum MHD_Result ret = MHD_queue_response(c->mc, 200, r);
    MHD_destroy_response(r);
    return ret;
}

void srv__make_id(srv_server *s, const char *prefix, char *out, size_t cap)
{
    /* splitmix64 of a per-process salt and a counter: unique and not guessable in sequence. */
    uint64_t z = s->id_salt + atomic_fetch_add(&s->n_requests, 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    snprintf(out, cap, "%s%016llx", prefix, (unsigned long long)z);
}

enum MHD_Result srv__route_generate(srv_conn *c)
{
    srv_error e;
    sampler_params defaults = sampler_default_params();
    if (srv_request_parse(c->body ? c->body : "", c->body_len, c->route == R_CHAT, &c->srv->chat,
                          &defaults, &c->rq, &e))
        return srv__send_error(c, &e);
    return srv__generate(c);
}

enum MHD_Result srv__generate(srv_conn *c)
{
    srv_server *s = c->srv;
    bool chat = c->route != R_COMPLETIONS;
    srv_error e;
    srv_request *rq = &c->rq;
    if (rq->model && strcmp(rq->model, s->served_name)) {
        srv_error_set(&e, 404, "model", "model_not_found", "The model '%s' does not exist",
                      rq->model);
        return srv__send_error(c, &e);
    }
    const char *pparam = chat ? "messages" : "prompt";
    /* Prompt k's tokens: tokenized text, or the ids as given (checked here). */
    uint32_t n_prompts = (uint32_t)(1 + rq->n_more);
    int32_t **pids = calloc(n_prompts, sizeof *pids);
    size_t *plen = calloc(n_prompts, sizeof *plen);
    enum MHD_Result ret;
    uint32_t max_tokens = rq->max_tokens;
    size_t total_ids = 0;
    if (!pids || !plen) {
        ret = srv__fail(c, 500, NULL, NULL, "out of memory");
        goto out;
    }
    for (uint32_t k = 0; k < n_prompts; k++) {
        char *text = k ? rq->more[k - 1].text : rq->prompt_text;
        int32_t **given = k ? &rq->more[k - 1].ids : &rq->prompt_ids;
        size_t *n_given = k ? &rq->more[k - 1].n_ids : &rq->n_prompt_ids;
        char which[32] = "";
        if (n_prompts > 1)
            snprintf(which, sizeof which, " (prompt %u)", k);
        if (text) {
            if (srv__tokenize(s->vocab, text, tok_add_bos(s->vocab), &pids[k], &plen[k])) {
                ret = srv__fail(c, 500, NULL, NULL, "tokenization failed");
                goto out;
            }
        } else {
            int32_t nv = tok_n_vocab(s->vocab);
            for (size_t i = 0; i < *n_given; i++)
                if ((*given)[i] >= nv) {
                    srv_error_set(&e, 400, "prompt", NULL,
                                  "token id %d is outside the vocabulary%s", (*given)[i], which);
                    ret = srv__send_error(c, &e);
                    goto out;
                }
            pids[k] = *given;
            plen[k] = *n_given;
            *given = NULL;
            *n_given = 0;
        }
        size_t n_ids = plen[k];
        if (n_ids == 0) {
            srv_error_set(&e, 400, pparam, NULL, "the prompt is empty%s", which);
            ret = srv__send_error(c, &e);
            goto out;
        }
        if (n_ids >= s->n_ctx) {
            srv_error_set(&e, 400, pparam, "context_length_exceeded",
                          "This model's maximum context length is %u tokens; the prompt%s has "
                          "%zu",
                          s->n_ctx, which, n_ids);
            ret = srv__send_error(c, &e);
            goto out;
        }
        if (chat && !rq->has_max_tokens)
            max_tokens = s->n_ctx - (uint32_t)n_ids;
        if (n_ids + max_tokens > s->n_ctx) {
            srv_error_set(&e, 400, "max_tokens", "context_length_exceeded",
                          "This model's maximum context length is %u tokens; you requested %zu "
                          "(%zu in the prompt%s, %u to generate)",
                          s->n_ctx, n_ids + max_tokens, n_ids, which, max_tokens);
            ret = srv__send_error(c, &e);
            goto out;
        }
        total_ids += n_ids;
    }
    if (rq->n > s->cfg->max_num_seqs) {
        srv_error_set(&e, 400, "n", NULL,
                      "'n' is %u, but this server runs at most %u sequences at once "
                      "(--max-num-seqs), and each choice is one",
                      rq->n, s->cfg->max_num_seqs);
        ret = srv__send_error(c, &e);
        goto out;
    }
    /* with echo, each choice also holds its prompt: the longest counts for all */
    size_t echo_ids = 0;
    for (uint32_t k = 0; rq->echo && k < n_prompts; k++)
        echo_ids = plen[k] > echo_ids ? plen[k] : echo_ids;
    uint64_t bound =
        srv_response_bound(rq->n * n_prompts, max_tokens + (uint32_t)echo_ids, rq->n_top_logprobs);
    if (bound > (uint64_t)s->cfg->max_response_mb << 20) {
        srv_error_set(&e, 400, rq->n_top_logprobs > 0 ? "top_logprobs" : "max_tokens", NULL,
                      "this request could make a response of %.0f MB (n = %u x %u prompts x %u "
                      "tokens%s); the limit is %u MB (--max-response-mb): lower n, max_tokens "
                      "or the logprobs asked for",
                      (double)bound / (1 << 20), rq->n, n_prompts, max_tokens,
                      rq->n_top_logprobs >= 0 ? " with logprobs" : "", s->cfg->max_response_mb);
        ret = srv__send_error(c, &e);
        goto out;
    }
    if (!rq->has_seed) {
        uint64_t z = s->id_salt ^ ((uint64_t)time(NULL) << 20) ^
                     atomic_load(&s->n_requests) * 0x9E3779B97F4A7C15ull;
        rq->sampling.seed = z;
    }

    c->n_choices = rq->n * n_prompts;
    c->n_per = rq->n;
    c->choices = calloc(c->n_choices, sizeof *c->choices);
    c->reqs = calloc(n_prompts, sizeof *c->reqs);
    c->wake = srv__wake_get(s, c->mc);
    bool echo_ok = !rq->echo || srv__echo_setup(c, n_prompts) == 0;
    for (uint32_t k = 0; rq->echo && echo_ok && k < n_prompts; k++)
        echo_ok = srv__echo_prompt(c, k, k ? rq->more[k - 1].text : rq->prompt_text, pids[k],
                                   plen[k]) == 0;
    if (!c->choices || !c->reqs || !c->wake || !echo_ok) {
        ret = srv__fail(c, 500, NULL, NULL, "out of memory");
        goto out;
    }
    srv__sock_set_wake(s, c->mc, c->wake);
    sched_request_params p = {0};
    p.max_tokens = max_tokens;
    p.n = rq->n;
    p.sampling = rq->sampling;
    p.ignore_eos = rq->ignore_eos;
    for (int i = 0; i < rq->n_stop && i < SCHED_MAX_STOP; i++)
        p.stop[i] = rq->stop[i];
    p.n_top_logprobs = rq->n_top_logprobs;
    p.prompt_logprobs = rq->echo && rq->n_top_logprobs >= 0;
    p.notify_on_finish_only = !rq->stream; /* the whole body is built at the end */
    sched_logit_bias bias[SRV_MAX_LOGIT_BIAS];
    for (size_t i = 0; i < rq->n_logit_bias; i++) {
        if (rq->logit_bias[i].id >= tok_n_vocab(s->vocab)) {
            srv_error_set(&e, 400, "logit_bias", NULL,
                          "logit_bias: token id %d is outside the vocabulary (%d tokens)",
                          rq->logit_bias[i].id, tok_n_vocab(s->vocab));
            ret = srv__send_error(c, &e);
            goto out;
        }
        bias[i].id = rq->logit_bias[i].id;
        bias[i].bias = rq->logit_bias[i].bias;
    }
    p.logit_bias = bias;
    p.n_logit_bias = (uint32_t)rq->n_logit_bias;
    p.grammar = rq->grammar;

    srv__make_id(s,
                 c->route == R_RESPONSES ? "resp_"
                 : chat                  ? "chatcmpl-"
                                         : "cmpl-",
                 c->id, sizeof c->id);
    c->rx.chat = chat;
    c->rx.id = c->id;
    c->rx.created = (long long)time(NULL);
    c->rx.model = s->served_name;
    c->rx.vocab = s->vocab;
    c->rx.n_top_logprobs = rq->n_top_logprobs;
    c->prompt_tokens = (uint32_t)total_ids;

    /* One scheduler request per prompt: they share the batch like any others. */
    int rc = 0;
    for (uint32_t k = 0; k < n_prompts && !rc; k++) {
        p.prompt = pids[k];
        p.n_prompt = (uint32_t)plen[k];
        rc = sched_submit(s->sched, &p, srv__on_notify, c->wake, &c->reqs[k]);
        if (rc == 0) {
            c->n_reqs++;
            rq->grammar = NULL; /* the scheduler's now (one prompt only, see api.c) */
        }
    }
    if (rc) {
        /* all or nothing: the prompts already queued are cancelled */
        for (uint32_t k = 0; k < c->n_reqs; k++)
            sched_req_release(c->reqs[k]);
        c->n_reqs = 0;
        switch (rc) {
        case KVS_ENOSPC:
            ret = srv__fail(c, 429, NULL, NULL, "too many requests waiting; retry later");
            break;
        case KVS_EBUSY: ret = srv__fail(c, 503, NULL, NULL, "the server is shutting down"); break;
        case KVS_ERANGE:
            ret = srv__fail(c, 400, "max_tokens", "context_length_exceeded",
                            "the prompt and max_tokens do not fit the context");
            break;
        case KVS_EINVAL:
            ret = srv__fail(c, 400, NULL, NULL, "the scheduler rejected the request parameters");
            break;
        default:
            srv_error_set(&e, 500, NULL, NULL, "submit failed: %s", status_str(rc));
            ret = srv__send_error(c, &e);
        }
        goto out;
    }
    atomic_fetch_add(&s->n_active, 1);
    if (rq->stream)
        ret = start_stream(c);
    else {
        c->phase = PH_WAIT;
        ret = srv__pump_full(c);
    }
out:
    for (uint32_t k = 0; pids && k < n_prompts; k++)
        free(pids[k]);
    free(pids);
    free(plen);
    return ret;
}
