/* OpenAI request parsing and validation for /v1/completions and /v1/chat/completions, and the
 * error body every failure uses. Pure functions over JSON text: no tokenizer, no scheduler, so
 * they are unit-tested without a model. A failed parse fills srv_error (status, message,
 * param, code) exactly as the HTTP response must carry it. */
#ifndef KVS_SERVER_API_H
#define KVS_SERVER_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "engine/grammar.h"
#include "engine/sampler.h"
#include "server/chat_template.h"

#define SRV_MAX_N 128           /* choices per request, as OpenAI */
#define SRV_MAX_LOGIT_BIAS 1024 /* logit_bias entries (OpenAI documents no limit; 300 is seen) */

typedef struct srv_logit_bias {
    int32_t id; /* >= 0; the route checks it against the vocabulary */
    float bias; /* [-100, 100] */
} srv_logit_bias;

typedef struct srv_error {
    int status;       /* HTTP status */
    const char *type; /* invalid_request_error, ... (static) */
    char param[48];   /* field name, "" = null */
    const char *code; /* e.g. "context_length_exceeded", NULL = null */
    char message[256];
} srv_error;

/* Fills e and returns -1 (so callers can `return srv_error_set(...)`). type is derived from
 * status as in API.md. */
int srv_error_set(srv_error *e, int status, const char *param, const char *code, const char *fmt,
                  ...) __attribute__((format(printf, 5, 6)));
/* The {"error":{...}} body, malloc'd (NULL on OOM). */
char *srv_error_json(const srv_error *e);

#define SRV_MAX_PROMPTS 64 /* prompts of one /v1/completions request */
/* Stop strings of one request: OpenAI takes 4; vLLM and llama.cpp any number, and
 * lm-evaluation-harness sends a task's `until` list and the EOS text, which can be more. */
#define SRV_MAX_STOP 16

/* One more prompt of a /v1/completions prompt array: text, or token ids. */
typedef struct srv_prompt {
    char *text;
    int32_t *ids;
    size_t n_ids;
} srv_prompt;

typedef struct srv_request {
    bool chat;
    char *model;         /* as given, or NULL */
    char *prompt_text;   /* string prompt (completions) or the rendered chat; NULL if ids */
    int32_t *prompt_ids; /* token-id prompt (completions only) */
    size_t n_prompt_ids;
    /* A completions prompt array of k > 1 prompts: the first is prompt_text / prompt_ids
     * above, the other k - 1 here. Choices are numbered prompt by prompt (prompt i's j-th
     * choice is index i * n + j), as OpenAI does. */
    srv_prompt *more;
    size_t n_more;
    bool has_max_tokens;
    uint32_t max_tokens;
    uint32_t n;
    sampler_params sampling;
    bool has_seed;
    bool ignore_eos;
    char *stop[SRV_MAX_STOP];
    int n_stop;
    int n_top_logprobs; /* -1 = no logprobs */
    /* completions: each choice's text begins with its prompt's, and with logprobs they cover
     * the prompt's tokens too (the first with none); max_tokens may then be 0 */
    bool echo;
    bool stream;
    bool include_usage;
    srv_logit_bias *logit_bias;
    size_t n_logit_bias;
    /* response_format json_object / json_schema, compiled; NULL: free text. Whoever submits it
     * takes it (and sets this to NULL); otherwise srv_request_free destroys it. */
    grammar_def *grammar;
    const char *format_type; /* "text", "json_object" or "json_schema" (static) */
    /* chat: tools (a copy of the request's array; NULL: none or []), tool_choice, and the
     * named function; a forced choice (REQUIRED, NAMED) also sets grammar. */
    cJSON *tools;
    enum { SRV_TOOLS_NONE = 0, SRV_TOOLS_AUTO, SRV_TOOLS_REQUIRED, SRV_TOOLS_NAMED } tool_choice;
    char *tool_name;
    bool parallel_tool_calls;
    /* a forced call is written in the family's own call syntax (Granite's <|tool_call|> list,
     * gpt-oss's commentary message) and read back as an unforced call; false: the bare
     * {"name", "arguments"} object of srv_json_schema_compile_tools */
    bool tool_native;
} srv_request;

/* Parses a request body that must be exactly one JSON value: trailing data after it, and
 * strings holding \u0000 (which cJSON would cut short), are 400s like a syntax error (the
 * error names the top-level member the NUL is in). Returns 0 and *out (free with
 * cJSON_Delete), or -1 with e filled. */
int srv_json_parse(const char *body, size_t len, cJSON **out, srv_error *e);
/* srv_json_parse of a body that must be a JSON object (every POST route's): anything else is
 * a 400 saying so. */
int srv_json_parse_object(const char *body, size_t len, cJSON **out, srv_error *e);

/* A body's "model": absent or null leaves *out NULL; a string is copied (malloc'd); anything
 * else is a 400 naming it. 0, or -1 with e filled. */
int srv_json_model(const cJSON *root, char **out, srv_error *e);

/* What a response can hold in memory, estimated from the request: n choices x max_tokens x
 * (text + one entry per logprob). A request whose bound exceeds --max-response-mb is refused
 * with 400 before it runs, so one small request cannot make the server build a response of
 * hundreds of megabytes (building it as JSON takes several times that). */
#define SRV_BOUND_TEXT_BYTES 16    /* per token of text, JSON-escaped, on average and more */
#define SRV_BOUND_LOGPROB_BYTES 96 /* per logprob entry: token, logprob, bytes, keys */
uint64_t srv_response_bound(uint32_t n, uint32_t max_tokens, int n_top_logprobs);

/* Parses and validates body. chat selects the endpoint's schema; fmt renders messages;
 * sampling fields not in the body keep defaults (sampler_default_params()).
 * Returns 0, or -1 with e filled (400 for everything the client got wrong, 500 on OOM). */
int srv_request_parse(const char *body, size_t len, bool chat, const srv_chat_fmt *fmt,
                      const sampler_params *defaults, srv_request *r, srv_error *e);
/* The body of POST /apply-template: srv_request_parse of a chat request that may hold only the
 * members the rendering reads (messages, tools, tool_choice, chat_template_kwargs); any other
 * member, sampling and stream included, is a 400 unsupported_parameter naming it, since it would
 * have no effect. r->prompt_text is the rendered prompt. Returns 0, or -1 with e filled. */
int srv_template_parse(const char *body, size_t len, const srv_chat_fmt *fmt, srv_request *r,
                       srv_error *e);
/* Whether name is one of those members (also POST /tokenize's with messages) */
bool srv_template_field(const char *name);
void srv_request_free(srv_request *r);

#endif
