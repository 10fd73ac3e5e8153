/* Response bodies of the generation endpoints: whole completions, SSE chunks, the usage chunk,
 * and OpenAI-shaped logprobs. Strings returned are malloc'd (NULL on OOM). Any thread. */
#ifndef KVS_SERVER_RESPONSE_H
#define KVS_SERVER_RESPONSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "engine/tokenizer.h"
#include "scheduler/scheduler.h"
#include "server/reasoning.h"

typedef struct srv_resp_ctx {
    bool chat;
    const char *id;    /* cmpl-… / chatcmpl-… shared by every chunk */
    long long created; /* unix seconds, shared by every chunk */
    const char *model; /* served name */
    const tok_vocab *vocab;
    int n_top_logprobs; /* -1: no logprobs */
} srv_resp_ctx;

/* What one choice produced, accumulated from its events. */
typedef struct srv_choice {
    char *text;
    size_t len, cap;
    sched_token_info *toks; /* when logprobs were asked for */
    size_t n_toks, cap_toks;
    /* With echo (completions): the first echo_toks tokens and echo_len bytes of text are the
     * prompt's; the generated tokens' text_offset counts from echo_len. */
    size_t echo_toks, echo_len;
    enum sched_finish finish;
    int status;
    uint32_t completion_tokens;
    cJSON *tool_calls; /* the calls read out of text (which then holds the rest), or NULL */
    char *reasoning;   /* the think block read out of text (message.reasoning_content), or NULL */
    srv_think think;   /* a stream's splitter state */
    /* a thinking model's output through a splitter of its own (srv__count_reasoning): the
     * tokens generated up to the last one that placed reasoning text */
    srv_think count;
    uint32_t reasoning_tokens;
    size_t sent; /* a stream with tools: bytes of text already sent as content */
} srv_choice;

/* Appends an event's text and tokens to c; KVS_ENOMEM. */
int srv_choice_add(srv_choice *c, const sched_event *ev);
void srv_choice_free(srv_choice *c);

const char *srv_finish_str(enum sched_finish f); /* "stop", "length", NULL */

/* The non-streaming body. */
char *srv_resp_full(const srv_resp_ctx *x, const srv_choice *ch, uint32_t n, uint32_t prompt_tokens,
                    uint32_t cached_tokens);
/* One "data: {…}\n\n" SSE event for a delta of choice idx (role_only: the chat opening chunk
 * with role "assistant" and empty content). finish NONE gives finish_reason null. text_offset
 * is the choice's text length before this delta (completions logprobs). */
char *srv_resp_chunk(const srv_resp_ctx *x, uint32_t idx, const char *text, size_t len,
                     const sched_token_info *toks, uint32_t n_toks, enum sched_finish finish,
                     bool role_only, size_t text_offset);
/* A chat delta of reasoning text (delta.reasoning_content), with the tokens' logprobs if any. */
char *srv_resp_reasoning_chunk(const srv_resp_ctx *x, uint32_t idx, const char *text, size_t len,
                               const sched_token_info *toks, uint32_t n_toks);
/* Moves c's think block (reasoning.h, in chat template tmpl's format: harmony's analysis
 * channel, the text keeping the final channel and calls; Granite 3.2's thought process) out of
 * its text into c->reasoning; KVS_ENOMEM. */
int srv_choice_split_reasoning(srv_choice *c, enum srv_chat_tmpl tmpl);
/* A chat delta carrying choice idx's tool calls whole (an OpenAI tool_calls array; each
 * entry gets its "index"). */
char *srv_resp_tool_calls_chunk(const srv_resp_ctx *x, uint32_t idx, const cJSON *calls);
/* The finishing chunk of a choice that ended in tool calls (finish_reason "tool_calls"). */
char *srv_resp_tool_calls_finish(const srv_resp_ctx *x, uint32_t idx);
/* The final usage chunk (choices: []), as an SSE event; reasoning_tokens 0: no
 * completion_tokens_details. */
char *srv_resp_usage_chunk(const srv_resp_ctx *x, uint32_t prompt_tokens,
                           uint32_t completion_tokens, uint32_t reasoning_tokens);
/* "data: {json}\n\n" around an error body. */
char *srv_sse_wrap(const char *json);
/* A JSON string of n bytes of text (NUL bytes included, as \u0000); NULL on OOM. */
cJSON *srv_json_string_n(const char *s, size_t n);

#endif
