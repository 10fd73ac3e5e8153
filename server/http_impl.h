/* The HTTP front end's internals, shared by its files: http.c (libmicrohttpd lifecycle, body
 * limits, the route table, auth, CORS), wake.c (suspend/resume, the reaper), route_misc.c
 * (models, metrics, kv-cache, tokenize), route_completions.c (/v1/completions and
 * /v1/chat/completions), echo.c (completions' echo), route_embeddings.c (/v1/embeddings),
 * route_responses.c (/v1/responses, through the
 * chat path). Visible to server/'s HTTP files only. The lock rules are at the top of http.c. */
#ifndef KVS_SERVER_HTTP_IMPL_H
#define KVS_SERVER_HTTP_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "engine/model.h"
#include "scheduler/scheduler.h"
#include "server/api.h"
#include "server/config.h"
#include "server/frontdoor.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/response.h"

/* Responses or bodies at least this big give their memory back to the system when done. */
#define SRV_TRIM_BYTES (1u << 20)

enum srv_state { ST_LOADING = 0, ST_READY, ST_DRAINING, ST_STOPPING };

/* --connection-memory-kb bounds a request's head (request line and header fields); the front
 * door measures it. MHD's per-connection pool holds the head, one record of about 64 bytes
 * per header field and query parameter (measured with libmicrohttpd 0.9.75: 422 fields of
 * 12 bytes fill 32 KiB), and the response's headers. So the front door also allows at most
 * one field per 32 bytes of the limit (1024 for 32 KiB), and the pool is 4 x the limit: a
 * head at both limits needs about 3 x. The pool is touched whole, so it is resident memory
 * per open connection. */
#define SRV_HEAD_BYTES_PER_FIELD 32
#define SRV_POOL_PER_HEAD 4

typedef struct srv_wake {
    pthread_mutex_t mu;
    struct MHD_Connection *mc; /* NULL: no connection waits on this slot */
    bool suspended;
    bool peer_gone; /* the reaper saw the client close while suspended */
    struct srv_wake *next_free;
    struct srv_wake *next_all;
} srv_wake;

/* One open MHD connection (its socket context), so the reaper can watch every socket. */
typedef struct srv_sock {
    int fd;
    srv_wake *wake; /* the slot of the request on this connection, or NULL (sock_mu) */
    bool nudged;    /* the reaper shut the socket down already */
    struct srv_sock *prev, *next;
} srv_sock;

struct srv_server {
    const srv_config *cfg;
    struct MHD_Daemon *d;
    srv_frontdoor *door;
    int listen_fd;
    uint16_t port;
    _Atomic int state;
    /* Set once before state becomes ST_READY, read-only afterwards. */
    const engine_model *model;
    const tok_vocab *vocab;
    sched *sched;
    char *served_name;
    srv_chat_fmt chat; /* its default_system is the caller's (srv_set_ready) */
    uint32_t n_ctx;
    long long started;

    _Atomic uint32_t n_active;
    _Atomic uint64_t n_requests;
    uint64_t id_salt;
    _Atomic uint64_t status_counts[SRV_N_STATUS];

    pthread_mutex_t wake_mu; /* guards wake_free, wake_all */
    srv_wake *wake_free;
    srv_wake *wake_all;

    pthread_mutex_t sock_mu; /* guards socks and each srv_sock's wake and nudged */
    srv_sock *socks;
    _Atomic unsigned n_conns; /* handed to MHD by the front door and not yet closed */

    /* The reaper (see reaper_main): notices clients that closed or half-closed, on every
     * connection MHD holds, suspended or not. */
    pthread_t reaper;
    bool reaper_started;
    pthread_mutex_t reaper_mu; /* guards reaper_stop */
    pthread_cond_t reaper_cv;
    bool reaper_stop;
};

enum route {
    R_NONE = 0,
    R_COMPLETIONS,
    R_CHAT,
    R_RESPONSES,
    R_MODELS,
    R_MODEL_ONE,
    R_HEALTH,
    R_METRICS,
    R_TOKENIZE,
    R_DETOKENIZE,
    R_APPLY_TEMPLATE,
    R_PAGE,
    R_KV,
    R_TOKENIZER_INFO,
    R_EMBEDDINGS
};

enum phase { PH_BODY = 0, PH_WAIT, PH_STREAM, PH_DONE };
enum stream_state { SS_START = 0, SS_EVENTS, SS_END };

/* A prompt's echo (echo.c): its text, its first token (the one logprobs entry with no
 * logprob), and whether its choices have had it. */
typedef struct srv_echo {
    char *text;
    size_t len;
    int32_t first;
    bool sent;
} srv_echo;

typedef struct srv_conn {
    srv_server *srv;
    struct MHD_Connection *mc;
    enum route route;
    const char *method;   /* NULL until on_request's first call */
    char route_name[200]; /* the target as sent, escaped for the log (srv_log_escape) */
    char path[128];       /* the target's decoded path (srv_target_path), what routes match */
    bool bad_target;      /* srv_target_path refused it: bad_error says why */
    srv_error bad_error;
    bool close_after; /* the response says "Connection: close": its framing is not trusted */
    char reqid[32];
    double t_start, t_first;
    enum phase phase;
    bool checked;         /* answer_early has run */
    bool preflight;       /* an OPTIONS request with CORS on: answered by answer_early */
    cJSON *resp_echo;     /* /v1/responses: the request's fields the response object repeats */
    uint32_t resp_seq;    /* /v1/responses streaming: sequence_number of the next event */
    bool resp_msg_open;   /* /v1/responses streaming: the message item's events have begun */
    int resp_msg_index;   /* /v1/responses streaming: the message item's output_index */
    int resp_rs;          /* /v1/responses streaming: the reasoning item 0 none, 1 open, 2 done */
    kvs_buf resp_rs_text; /* /v1/responses streaming: the reasoning sent so far */
    int status;           /* HTTP status sent */
    bool client_gone;

    char *body;
    size_t body_len, body_cap;
    bool too_large;
    uint64_t discarded; /* body bytes dropped after too_large (bounded, see on_request) */

    /* generation */
    srv_request rq;
    sched_req **reqs;  /* one per prompt (a completions prompt array has several) */
    uint32_t n_reqs;   /* submitted */
    uint32_t n_per;    /* choices per prompt (n): prompt k's choice j is index k * n_per + j */
    uint32_t next_req; /* where the next event is looked for first (round robin) */
    srv_wake *wake;
    srv_resp_ctx rx;
    char id[48];
    srv_choice *choices;
    uint32_t n_choices;
    uint32_t prompt_tokens, cached_tokens, completion_tokens;
    uint32_t delta_tokens; /* tokens seen in deltas: what a cancelled request had generated */
    int fail_status;       /* a choice finished with an error: its status */

    srv_echo *echo;              /* completions with echo: one per prompt (echo.c), else NULL */
    struct srv_embed_state *emb; /* /v1/embeddings (route_embeddings.c), else NULL */
    uint32_t n_echo;

    /* streaming: bytes formatted and not yet handed to MHD (one event at a time: bounded) */
    enum stream_state ss;
    char *out;
    size_t out_len, out_pos, out_cap;
    size_t resp_bytes; /* size of a whole (non-streamed) response body */
} srv_conn;

/* A client that went away is the normal end of a cancelled request, but the only way to make
 * MHD close its connection is an error return, which MHD logs as "Application reported
 * internal error". The handler sets this just before such a return, on the thread MHD logs
 * from next, so mhd_log can tell a cancel from a real error. */
extern _Thread_local bool srv__tl_client_gone;

/* http.c: responses (each queues the response and marks the request done). */
void srv__count_status(srv_server *s, int status);
enum MHD_Result srv__send_body(srv_conn *c, int status, const char *ctype, const char *body,
                               size_t len);
enum MHD_Result srv__send_json(srv_conn *c, int status, const char *json);
/* A whole 200 response built by a route (taken over and freed; NULL: a 500 out of memory),
 * its size recorded in resp_bytes so a large one gives its memory back when done. */
enum MHD_Result srv__send_built(srv_conn *c, char *body);
/* Sends and deletes j. */
enum MHD_Result srv__send_cjson(srv_conn *c, int status, cJSON *j);
enum MHD_Result srv__send_error(srv_conn *c, const srv_error *e);
enum MHD_Result srv__fail(srv_conn *c, int status, const char *param, const char *code,
                          const char *msg);
/* Adds the CORS headers (Access-Control-Allow-Origin, Vary) a response to c needs: none when
 * CORS is off or the request's Origin is not allowed. Retry-After on 429 and 503. */
void srv__add_common_headers(srv_conn *c, struct MHD_Response *r, int status);
/* A fresh id: prefix + 16 hex digits, unique and not guessable in sequence. */
void srv__make_id(srv_server *s, const char *prefix, char *out, size_t cap);

/* wake.c. */
srv_wake *srv__wake_get(srv_server *s, struct MHD_Connection *mc);
void srv__wake_put(srv_server *s, srv_wake *w);
/* The scheduler's notify callback (engine thread); ud is the request's srv_wake. */
void srv__on_notify(void *ud);
/* Takes the next event, or suspends the connection when none is queued (returns 0 then);
 * -2 when the reaper found the client gone; otherwise as sched_req_next. */
int srv__next_or_suspend(srv_conn *c, sched_event *ev);
void *srv__reaper_main(void *arg);
void srv__on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                        enum MHD_ConnectionNotificationCode toe);
void srv__sock_set_wake(srv_server *s, struct MHD_Connection *mc, srv_wake *w);

/* route_misc.c. */
enum MHD_Result srv__route_models(srv_conn *c, const char *url);
enum MHD_Result srv__route_metrics(srv_conn *c);
enum MHD_Result srv__route_kv(srv_conn *c);
/* GET /tokenizer_info: vLLM's, what lm-evaluation-harness's remote tokenizer reads. */
enum MHD_Result srv__route_tokenizer_info(srv_conn *c);
enum MHD_Result srv__route_tokenize(srv_conn *c);
enum MHD_Result srv__route_detokenize(srv_conn *c);
/* POST /apply-template (as llama.cpp's server has it): a chat request's prompt text, rendered
 * as /v1/chat/completions would render it, without running it. Only the members the rendering
 * reads are taken (srv_template_parse); any other is a 400 naming it. */
enum MHD_Result srv__route_apply_template(srv_conn *c);
/* Tokenizes text into a malloc'd array (*ids, *n). KVS_ENOMEM, tokenizer errors. */
int srv__tokenize(const tok_vocab *v, const char *text, bool add_bos, int32_t **ids, size_t *n);
/* The same with the special tokens the vocabulary adds when add_special (BOS where it adds one,
 * EOS at the end where tokenizer.ggml.add_eos_token says), none otherwise: /tokenize's
 * add_special_tokens, and every embeddings input. */
int srv__tokenize_special(const tok_vocab *v, const char *text, bool add_special, int32_t **ids,
                          size_t *n);

/* route_completions.c. */
enum MHD_Result srv__route_generate(srv_conn *c);
/* Validates, tokenizes and submits c->rq (parsed already), then answers or streams. */
enum MHD_Result srv__generate(srv_conn *c);
/* With tools on, reads choice idx's calls out of its text (see route_completions.c). */
int srv__read_tool_calls(srv_conn *c, uint32_t idx, srv_choice *ch);
/* Whether c's answers are split into reasoning and content (a thinking template or harmony's
 * channels, unless --reasoning-format none): chat and responses. */
bool srv__splits_reasoning(const srv_conn *c);
/* Event ev's text through th (set to the model's template's format), its reasoning appended to
 * r and its content to t as far as they are placed; at the choice's end, what th held. */
void srv__split_event(const srv_conn *c, srv_think *th, const sched_event *ev, kvs_buf *r,
                      kvs_buf *t);
/* Where the output is split so: counts its choice's reasoning tokens (srv_choice.count), from
 * every event of the choice, streamed or not. */
void srv__count_reasoning(srv_conn *c, const sched_event *ev);
/* The error a choice that failed with status st gets (503 when cancelled by shutdown). */
void srv__error_of_status(int st, srv_error *e);
/* Appends a formatted SSE event (taken over; NULL = out of memory) to c's output. */
bool srv__out_append(srv_conn *c, char *s);

/* echo.c: /v1/completions with echo. Setup gives c one srv_echo per prompt; prompt sets
 * prompt k's (text as given, or ids decoded); both KVS_ENOMEM. */
int srv__echo_setup(srv_conn *c, uint32_t n_prompts);
int srv__echo_prompt(srv_conn *c, uint32_t k, const char *text, const int32_t *ids, size_t n);
void srv__echo_free(srv_conn *c);
/* Before an event of a choice of prompt k is used: the first of them brings the prompt's echo
 * (into every one of its choices, or their stream); *consumed when the event was the prompt
 * event, which has nothing more to give. false on OOM. */
bool srv__echo_event(srv_conn *c, const sched_event *ev, bool *consumed);

/* route_embeddings.c: POST /v1/embeddings. The pump drains (and tops up) the inputs'
 * requests, suspending in between, then answers; free releases c->emb. */
enum MHD_Result srv__route_embeddings(srv_conn *c);
enum MHD_Result srv__embed_pump(srv_conn *c);
void srv__embed_free(srv_conn *c);

/* route_responses.c: POST /v1/responses, through the chat path. */
enum MHD_Result srv__route_responses(srv_conn *c);
/* The response object once every choice finished (malloc'd, NULL on OOM). */
char *srv__responses_full(srv_conn *c);
/* Streaming: the opening events, one scheduler event, the closing events. false on OOM. */
bool srv__responses_start(srv_conn *c);
bool srv__responses_event(srv_conn *c, const sched_event *ev);
bool srv__responses_end(srv_conn *c);
/* Non-streaming: drains events until every choice finished, suspending in between. */
enum MHD_Result srv__pump_full(srv_conn *c);
/* Accounts an event (first-token time, token counts, failure) on c. */
void srv__note_event(srv_conn *c, const sched_event *ev);

#endif
