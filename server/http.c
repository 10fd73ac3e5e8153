/* The HTTP front end: libmicrohttpd lifecycle, body limits, the route table, auth; the routes
 * are in route_*.c, suspend/resume and the reaper in wake.c (shared internals: http_impl.h).
 *
 * Waiting costs nothing: a connection whose request has no queued events is suspended
 * (MHD_suspend_connection) and the scheduler's notify callback resumes it. The race between
 * "reader found no event and suspends" and "engine queues an event and notifies" is closed by
 * srv_wake.mu: the reader checks sched_req_next and sets `suspended` under it, notify reads
 * `suspended` under it, so an event queued before the check is seen and one queued after it
 * finds the flag set. Notify targets are srv_wake slots, which live until srv_destroy (after
 * sched_destroy): a late notify for a finished request lands on a slot that is free or reused,
 * and at worst resumes a connection spuriously, which simply suspends again.
 *
 * Clients reach the daemon through the front door (server/frontdoor.c), which owns the listen
 * socket and, once a connection's first request head is whole and valid, hands it to the
 * relay (server/relay.c): the daemon's socket is one end of a socketpair, and the relay checks
 * every later head and chunked body as the first. request_is_sound repeats the framing and
 * path checks here all the same, so no request reaches a route unchecked.
 *
 * Locks: srv_server.sock_mu (the list of open connections and each one's wake slot; taken by
 * MHD threads and the reaper); srv_wake.mu (per slot: mc, suspended; taken by MHD threads and
 * the engine thread, and held around sched_req_next, which takes the request's own lock
 * inside it: the engine thread never holds that lock while notifying, so the order is fixed);
 * srv_server.wake_mu (the slot free list). Order: sock_mu before srv_wake.mu; wake_mu is
 * never held with either. */
#define _GNU_SOURCE /* POLLRDHUP */
#include "server/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <malloc.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "common/log.h"
#include "common/status.h"
#include "common/timeutil.h"
#include "server/api.h"
#include "server/http_impl.h"
#include "server/frontdoor.h"
#include "server/http_head.h"
#include "server/metrics.h"
#include "server/response.h"

/* The web page (server/webui/index.html through tools/embed.py). */
extern const unsigned char srv_webui_page[];
extern const unsigned long srv_webui_page_len;

/* A client that went away is the normal end of a cancelled request, but the only way to make
 * MHD close its connection is an error return, which MHD logs as "Application reported
 * internal error". The handler sets this just before such a return, on the thread MHD logs
 * from next, so mhd_log can tell a cancel from a real error. */
_Thread_local bool srv__tl_client_gone;

/* ---------- responses ---------- */

void srv__count_status(srv_server *s, int status)
{
    atomic_fetch_add(&s->status_counts[srv_status_index(status)], 1);
}

/* The Access-Control-Allow-Origin value for c's Origin: "*", the origin itself, or NULL. */
static const char *cors_allow(srv_conn *c)
{
    const char *list = c->srv->cfg->cors_origins;
    if (!list)
        return NULL;
    const char *origin = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Origin");
    if (!origin)
        return NULL;
    size_t n = strlen(origin);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 1 && *p == '*')
            return "*";
        if (len == n && !memcmp(p, origin, n))
            return origin;
        p += len + (end ? 1 : 0);
    }
    return NULL;
}

void srv__add_common_headers(srv_conn *c, struct MHD_Response *r, int status)
{
    if (status == 429 || status == 503)
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (!c->srv->cfg->cors_origins)
        return;
    const char *allow = cors_allow(c);
    if (allow) {
        MHD_add_response_header(r, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_ORIGIN, allow);
        MHD_add_response_header(r, "Access-Control-Expose-Headers", "Retry-After");
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_VARY, "Origin");
}

/* The routes with a fixed path: what they are called and whether they take POST (else GET). */
static const struct route_row {
    const char *path;
    enum route r;
    bool post;
} k_routes[] = {
    {"/v1/completions", R_COMPLETIONS, true},
    {"/v1/chat/completions", R_CHAT, true},
    {"/v1/responses", R_RESPONSES, true},
    {"/v1/models", R_MODELS, false},
    {"/health", R_HEALTH, false},
    {"/metrics", R_METRICS, false},
    {"/tokenize", R_TOKENIZE, true},
    {"/detokenize", R_DETOKENIZE, true},
    {"/apply-template", R_APPLY_TEMPLATE, true},
    {"/", R_PAGE, false},
    {"/kv-cache", R_KV, false},
    {"/tokenizer_info", R_TOKENIZER_INFO, false},
    {"/v1/embeddings", R_EMBEDDINGS, true},
};

static bool route_is_post(enum route r)
{
    for (size_t i = 0; i < sizeof k_routes / sizeof k_routes[0]; i++)
        if (k_routes[i].r == r)
            return k_routes[i].post;
    return false;
}

/* A CORS preflight (OPTIONS with CORS on): 204 with what the API takes, or 403 JSON for an
 * origin not allowed. No auth: browsers send preflights without credentials. */
static enum MHD_Result send_preflight(srv_conn *c)
{
    if (!cors_allow(c))
        return srv__fail(c, 403, NULL, NULL,
                         "this origin may not call the API (see --cors-origin)");
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    srv__add_common_headers(c, r, 204);
    bool post = route_is_post(c->route);
    MHD_add_response_header(r, "Access-Control-Allow-Methods",
                            post ? "POST, OPTIONS" : "GET, OPTIONS");
    const char *want =
        MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    MHD_add_response_header(r, "Access-Control-Allow-Headers",
                            want && *want ? want : "Authorization, Content-Type");
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    enum MHD_Result ret = MHD_queue_response(c->mc, 204, r);
    MHD_destroy_response(r);
    c->status = 204;
    c->phase = PH_DONE;
    return ret;
}

enum MHD_Result srv__send_body(srv_conn *c, int status, const char *ctype, const char *body,
                               size_t len)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    srv__add_common_headers(c, r, status);
    if (status == 405) {
        bool post = route_is_post(c->route);
        bool cors = c->srv->cfg->cors_origins != NULL;
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW,
                                post ? (cors ? "POST, OPTIONS" : "POST")
                                     : (cors ? "GET, OPTIONS" : "GET"));
    }
    if (status == 401)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (c->close_after)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = MHD_queue_response(c->mc, (unsigned)status, r);
    MHD_destroy_response(r);
    c->status = status;
    c->phase = PH_DONE;
    return ret;
}

enum MHD_Result srv__send_json(srv_conn *c, int status, const char *json)
{
    if (!json)
        return MHD_NO;
    return srv__send_body(c, status, "application/json", json, strlen(json));
}

enum MHD_Result srv__send_built(srv_conn *c, char *body)
{
    if (!body)
        return srv__fail(c, 500, NULL, NULL, "out of memory");
    c->resp_bytes = strlen(body);
    enum MHD_Result r = srv__send_json(c, 200, body);
    free(body);
    return r;
}

enum MHD_Result srv__send_cjson(srv_conn *c, int status, cJSON *j)
{
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    enum MHD_Result r = srv__send_json(c, status, s);
    free(s);
    return r;
}

enum MHD_Result srv__send_error(srv_conn *c, const srv_error *e)
{
    /* A fault is logged; /health's 503 (loading, shutting down) is the answer a readiness probe
     * polls for, several a second, and its access line records it already. */
    if (e->status >= 500 && c->route != R_HEALTH)
        log_error("request %s: %d %s", c->reqid, e->status, e->message);
    char *s = srv_error_json(e);
    enum MHD_Result r = srv__send_json(c, e->status, s);
    free(s);
    return r;
}

enum MHD_Result srv__fail(srv_conn *c, int status, const char *param, const char *code,
                          const char *msg)
{
    srv_error e;
    srv_error_set(&e, status, param, code, "%s", msg);
    return srv__send_error(c, &e);
}

/* ---------- routing ---------- */

static enum route route_of(const char *url, bool *post)
{
    const struct route_row *k = k_routes;
    for (size_t i = 0; i < sizeof k_routes / sizeof k_routes[0]; i++)
        if (!strcmp(url, k[i].path)) {
            *post = k[i].post;
            return k[i].r;
        }
    if (!strncmp(url, "/v1/models/", 11) && url[11]) {
        *post = false;
        return R_MODEL_ONE;
    }
    return R_NONE;
}

static bool authorized(srv_conn *c)
{
    const char *key = c->srv->cfg->api_key;
    if (!key || !*key)
        return true;
    const char *h = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7))
        return false;
    h += 7;
    /* Compare every byte so the time taken does not reveal the matching prefix. */
    size_t lk = strlen(key), lh = strlen(h);
    unsigned diff = (unsigned)(lk ^ lh);
    for (size_t i = 0; i < lh; i++)
        diff |= (unsigned char)h[i] ^ (unsigned char)key[i % (lk ? lk : 1)];
    return diff == 0;
}

/* ---------- MHD callbacks ---------- */

/* MHD's first sight of a request: the target as the client sent it, before MHD decodes it
 * (MHD would turn "/health%00x" into "/health"). What this returns is the request's con_cls.
 * MHD reports the request to on_completed from here on, even if it never reaches on_request. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *mc)
{
    srv_server *s = cls;
    srv_conn *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->srv = s;
    c->mc = mc;
    c->t_start = time_now_s();
    size_t len = strlen(uri);
    srv_log_escape(uri, len, c->route_name, sizeof c->route_name);
    c->bad_target = srv_target_path(uri, len, c->path, sizeof c->path, &c->bad_error) != 0;
    /* Request ids for logs: same generator as response ids, distinct counter draw. */
    srv__make_id(s, "", c->reqid, sizeof c->reqid);
    return c;
}

typedef struct head_tally {
    srv_framing framing;
    size_t bytes;      /* of the fields as sent, near enough: name, ": ", value, CRLF */
    unsigned n_fields; /* header fields and query parameters */
} head_tally;

static enum MHD_Result tally_field(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value)
{
    head_tally *t = cls;
    size_t kl = strlen(key), vl = value ? strlen(value) : 0;
    t->n_fields++;
    t->bytes += kl + vl + 4;
    if (kind == MHD_HEADER_KIND)
        srv_framing_add(&t->framing, key, kl, value ? value : "", vl);
    return MHD_YES;
}

/* The checks the front door and the relay make on every head, made again on what MHD parsed
 * (and the path, which only MHD decodes): a second line of defence, so that no request
 * reaches a route unchecked should the relay's view and MHD's ever differ. */
static bool request_is_sound(srv_conn *c, const char *version, srv_error *e)
{
    if (c->bad_target) {
        *e = c->bad_error;
        return false;
    }
    head_tally t = {0};
    MHD_get_connection_values(c->mc, MHD_HEADER_KIND | MHD_GET_ARGUMENT_KIND, tally_field, &t);
    /* The front door's head limits (MHD's pool is larger). */
    size_t limit = (size_t)c->srv->cfg->connection_memory_kb * 1024;
    if (t.bytes + strlen(c->route_name) > limit || t.n_fields > limit / SRV_HEAD_BYTES_PER_FIELD) {
        srv_error_set(e, 431, NULL, NULL, "request line and headers are over %zu KiB or %zu fields",
                      limit / 1024, limit / SRV_HEAD_BYTES_PER_FIELD);
        return false;
    }
    return srv_framing_check(&t.framing, !strcmp(version, MHD_HTTP_VERSION_1_0), e) == 0;
}

/* Second call of a request (MHD has its headers): health, auth, state, and the GET routes.
 * Returns true with *r set if a response was queued. */
static bool answer_early(srv_conn *c, enum MHD_Result *r)
{
    srv_server *s = c->srv;
    int st = atomic_load(&s->state);
    if (c->preflight) {
        *r = send_preflight(c);
        return true;
    }
    if (c->route == R_HEALTH) {
        if (st == ST_READY)
            *r = srv__send_json(c, 200, "{\"status\":\"ok\"}");
        else
            *r = srv__fail(c, 503, NULL, NULL,
                           st == ST_LOADING ? "the model is loading"
                                            : "the server is shutting down");
        return true;
    }
    if (c->route == R_PAGE) {
        /* the page holds no data (it asks /kv-cache and the API, which check the key) */
        if (s->cfg->no_webui)
            *r = srv__fail(c, 404, NULL, NULL, "Not found (the web page is off: --no-webui)");
        else
            *r = srv__send_body(c, 200, "text/html; charset=utf-8", (const char *)srv_webui_page,
                                (size_t)srv_webui_page_len);
        return true;
    }
    if (c->route != R_METRICS && !authorized(c)) {
        *r = srv__fail(c, 401, NULL, "invalid_api_key", "Invalid or missing API key");
        return true;
    }
    if (st != ST_READY && c->route != R_METRICS) {
        *r = srv__fail(c, 503, NULL, NULL,
                       st == ST_LOADING ? "the model is loading" : "the server is shutting down");
        return true;
    }
    switch (c->route) {
    case R_MODELS:
    case R_MODEL_ONE: *r = srv__route_models(c, c->path); return true;
    case R_METRICS: *r = srv__route_metrics(c); return true;
    case R_KV: *r = srv__route_kv(c); return true;
    case R_TOKENIZER_INFO: *r = srv__route_tokenizer_info(c); return true;
    default: return false; /* a POST route: read its body */
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    (void)url; /* decoded by MHD, NULs and all: c->path is the checked one */
    srv_server *s = cls;
    srv_conn *c = *con_cls;
    if (!c)
        return MHD_NO; /* on_uri ran out of memory */
    if (!c->method) {
        c->method = method;
        srv_error e;
        if (!request_is_sound(c, version, &e)) {
            /* The body's extent is in doubt, so nothing after it on this connection can be
             * trusted to be a request: answer and close. */
            c->close_after = true;
            return srv__send_error(c, &e);
        }
        bool post = false;
        c->route = route_of(c->path, &post);
        if (c->route == R_NONE)
            return srv__fail(c, 404, NULL, NULL, "Not found");
        if (!strcmp(method, "OPTIONS") && s->cfg->cors_origins) {
            /* answered from the next call, as a GET (see below) */
            c->preflight = true;
            return MHD_YES;
        }
        if (strcmp(method, post ? "POST" : "GET") && !(strcmp(method, "HEAD") == 0 && !post))
            return srv__fail(c, 405, NULL, NULL, "Method not allowed");
        if (post) {
            /* Refuse an oversized body before reading any of it (the connection then closes,
             * which is what we want for a client that would send 100 MB). */
            const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Content-Length");
            if (cl) {
                char *end;
                unsigned long long n = strtoull(cl, &end, 10);
                if (n > s->cfg->max_body_bytes)
                    return srv__fail(c, 413, NULL, NULL, "request body is too large");
            }
        }
        /* A POST's auth and state are checked before its body is read. A GET is answered
         * from the next call, once MHD has the whole request: a response queued on the first
         * call makes MHD close the connection, which would cost keep-alive clients (wrk,
         * SDKs) a new TCP connection per request. */
        if (post) {
            c->checked = true;
            enum MHD_Result r;
            if (answer_early(c, &r))
                return r;
        }
        return MHD_YES;
    }
    if (c->phase == PH_BODY && !c->checked) {
        c->checked = true;
        enum MHD_Result r;
        if (answer_early(c, &r)) {
            *upload_size = 0; /* answered: whatever body there is will not be read */
            return r;
        }
    }
    if (c->phase == PH_DONE || c->phase == PH_STREAM) {
        *upload_size = 0; /* a response is queued: the rest of the body is dropped */
        return MHD_YES;
    }
    if (c->phase == PH_WAIT) {
        if (atomic_load(&s->state) == ST_STOPPING)
            return MHD_NO;
        return c->route == R_EMBEDDINGS ? srv__embed_pump(c) : srv__pump_full(c);
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (c->too_large || c->body_len + n > s->cfg->max_body_bytes) {
            /* A body without Content-Length (chunked) crossed the limit. MHD cannot queue a
             * response in the middle of a body, so the rest is read and dropped (nothing is
             * stored) to answer 413 at its end, but only up to another max_body_bytes: a
             * larger upload is cut off by closing the connection, so the server never reads
             * an unbounded body. */
            if (!c->too_large) {
                free(c->body);
                c->body = NULL;
                c->body_len = c->body_cap = 0;
                c->too_large = true;
            }
            c->discarded += n;
            if (c->discarded > s->cfg->max_body_bytes) {
                log_warn("request %s: body over twice --max-body-bytes; connection closed",
                         c->reqid);
                c->status = 413;
                return MHD_NO;
            }
            return MHD_YES;
        }
        if (c->body_len + n + 1 > c->body_cap) {
            size_t cap = c->body_cap ? c->body_cap : 4096;
            while (cap < c->body_len + n + 1)
                cap *= 2;
            char *nb = realloc(c->body, cap);
            if (!nb)
                return MHD_NO;
            c->body = nb;
            c->body_cap = cap;
        }
        memcpy(c->body + c->body_len, upload, n);
        c->body_len += n;
        c->body[c->body_len] = '\0';
        return MHD_YES;
    }
    if (c->too_large)
        return srv__fail(c, 413, NULL, NULL, "request body is too large");
    switch (c->route) {
    case R_COMPLETIONS:
    case R_CHAT: return srv__route_generate(c);
    case R_RESPONSES: return srv__route_responses(c);
    case R_TOKENIZE: return srv__route_tokenize(c);
    case R_DETOKENIZE: return srv__route_detokenize(c);
    case R_APPLY_TEMPLATE: return srv__route_apply_template(c);
    case R_EMBEDDINGS: return srv__route_embeddings(c);
    default: return srv__fail(c, 404, NULL, NULL, "Not found");
    }
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    srv_server *s = cls;
    srv_conn *c = *con_cls;
    srv__tl_client_gone = false;
    /* The relay sends a refusal for a later request on this connection only after this. */
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci)
            srv_frontdoor_done(s->door, ci->connect_fd);
    }
    if (!c)
        return;
    *con_cls = NULL;
    if (c->wake) {
        srv__sock_set_wake(s, mc, NULL);
        srv__wake_put(s, c->wake);
    }
    /* A client that left mid-generation is logged and counted as 499 (client closed). */
    c->client_gone = toe != MHD_REQUEST_TERMINATED_COMPLETED_OK &&
                     (c->phase == PH_WAIT || (c->phase == PH_STREAM && c->ss != SS_END));
    if (c->n_reqs) {
        /* What was generated and not yet taken still counts for the log line. */
        sched_event ev;
        uint32_t gen = 0;
        for (uint32_t k = 0; k < c->n_reqs; k++) {
            while (c->client_gone && sched_req_next(c->reqs[k], &ev) > 0) {
                srv__note_event(c, &ev);
                sched_event_free(&ev);
            }
            gen += sched_req_generated(c->reqs[k]);
        }
        /* exact, also counting tokens whose text was still held back (a stop-string prefix,
         * a partial UTF-8 character) */
        if (gen > c->delta_tokens)
            c->delta_tokens = gen;
        for (uint32_t k = 0; k < c->n_reqs; k++)
            sched_req_release(c->reqs[k]); /* cancels it if unfinished: blocks go back */
        atomic_fetch_sub(&s->n_active, 1);
    }
    int status = c->client_gone || !c->status ? 499 : c->status;
    srv__count_status(s, status);
    double now = time_now_s();
    /* A cancel cuts the finishing events short: then the deltas seen are the count. */
    uint32_t completion =
        c->delta_tokens > c->completion_tokens ? c->delta_tokens : c->completion_tokens;
    if (c->client_gone)
        log_debug("request %s: the client closed its connection; cancelled after %u tokens",
                  c->reqid, completion);
    log_info("access id=%s method=%s route=%s status=%d prompt_tokens=%u completion_tokens=%u "
             "ttft=%.4f total=%.4f%s",
             c->reqid, c->method ? c->method : "-", c->route_name, status,
             c->n_reqs ? c->prompt_tokens : 0, completion,
             c->t_first > 0 ? c->t_first - c->t_start : -1.0, now - c->t_start,
             c->client_gone ? " client_closed=1" : "");
    for (uint32_t i = 0; c->choices && i < c->n_choices; i++)
        srv_choice_free(&c->choices[i]);
    free(c->choices);
    free(c->reqs);
    cJSON_Delete(c->resp_echo);
    kvs_buf_free(&c->resp_rs_text);
    srv__echo_free(c);
    srv__embed_free(c);
    srv_request_free(&c->rq);
    free(c->body);
    free(c->out);
    bool big = c->resp_bytes >= SRV_TRIM_BYTES || c->body_cap >= SRV_TRIM_BYTES;
    free(c);
    /* Building a large response takes many small allocations (its JSON tree is several times
     * its size); glibc keeps freed heap in the thread's arena, so without this one big
     * response would hold its peak for the life of the process. */
    if (big)
        malloc_trim(0);
}

/* ---------- lifecycle ---------- */

static int open_listener(const char *host, uint32_t port, int *fd_out, uint16_t *port_out,
                         char *err, size_t err_len)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t sl;
    int fam;
    if (port > 65535) {
        snprintf(err, err_len, "--port %u is out of range", port);
        return KVS_EINVAL;
    }
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    const char *h = !strcmp(host, "localhost") ? "127.0.0.1" : host;
    if (inet_pton(AF_INET, h, &a4->sin_addr) == 1) {
        fam = AF_INET;
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        sl = sizeof *a4;
    } else if (inet_pton(AF_INET6, h, &a6->sin6_addr) == 1) {
        fam = AF_INET6;
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        sl = sizeof *a6;
    } else {
        snprintf(err, err_len, "--host '%s' is not an IPv4 or IPv6 address", host);
        return KVS_EINVAL;
    }
    int fd = socket(fam, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK,
                    0); /* the front door accepts in bursts */
    if (fd < 0) {
        snprintf(err, err_len, "socket: %s", strerror(errno));
        return KVS_EIO;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, sl) != 0 || listen(fd, 512) != 0) {
        snprintf(err, err_len, "cannot listen on %s:%u: %s", host, port, strerror(errno));
        close(fd);
        return KVS_EIO;
    }
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    *port_out = ntohs(fam == AF_INET ? a4->sin_port : a6->sin6_port);
    *fd_out = fd;
    return 0;
}

static uint64_t random_salt(void)
{
    uint64_t v = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (f) {
        if (fread(&v, sizeof v, 1, f) != 1)
            v = 0;
        fclose(f);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return v ^ ((uint64_t)ts.tv_nsec << 32) ^ (uint64_t)ts.tv_sec ^ (uint64_t)getpid();
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = '\0';
    /* The close that follows a cancel (see srv__tl_client_gone), or MHD finding the peer gone
     * while it writes: how a client cancels, not a failure. */
    if (srv__tl_client_gone || strstr(line, "by remote peer") || strstr(line, "reset by peer") ||
        strstr(line, "Broken pipe") || strstr(line, "detected connection closure") ||
        strstr(line, "no longer available for sending")) {
        srv__tl_client_gone = false;
        log_debug("http: %s (the client had gone)", line);
        return;
    }
    /* The daemon's sockets are the relay's socketpair ends (server/relay.c), which it takes
     * for TCP by the client address it is given: TCP options fail there, and pushing data
     * needs no TCP option on a local pair (the relay turns Nagle off on the client's own
     * socket, srv_relay_add). */
    if (strstr(line, "TCP_NODELAY") || strstr(line, "TCP_CORK") ||
        strstr(line, "Failed to push the data from buffers")) {
        log_debug("http: %s (a relay socketpair)", line);
        return;
    }
    log_warn("http: %s", line);
}

/* ---------- front door callbacks (its thread) ---------- */

static int door_handoff(void *ud, int fd, const struct sockaddr *addr, socklen_t addr_len)
{
    srv_server *s = ud;
    /* MHD closes fd itself when it refuses it. */
    if (MHD_add_connection(s->d, fd, addr, addr_len) != MHD_YES) {
        log_warn("http: the daemon refused a connection (%s)", strerror(errno));
        return -1;
    }
    return 0;
}

static unsigned door_n_held(void *ud)
{
    srv_server *s = ud;
    return atomic_load(&s->n_conns);
}

static void door_refused(void *ud, int status, const char *method, size_t method_len,
                         const char *target, size_t target_len, const char *message)
{
    srv_server *s = ud;
    srv__count_status(s, status);
    char m[32], t[200];
    srv_log_escape(method, method_len, m, sizeof m);
    srv_log_escape(target, target_len, t, sizeof t);
    log_info("access id=- method=%s route=%s status=%d prompt_tokens=0 completion_tokens=0 "
             "ttft=-1.0000 total=0.0000 refused=\"%s\"",
             m[0] ? m : "-", t[0] ? t : "-", status, message);
}

int srv_start(const srv_config *cfg, srv_server **out, char *err, size_t err_len)
{
    srv_server *s = calloc(1, sizeof *s);
    if (!s)
        return KVS_ENOMEM;
    s->cfg = cfg;
    s->id_salt = random_salt();
    s->started = (long long)time(NULL);
    pthread_mutex_init(&s->wake_mu, NULL);
    int rc = open_listener(cfg->host ? cfg->host : "127.0.0.1", cfg->port, &s->listen_fd, &s->port,
                           err, err_len);
    if (rc) {
        pthread_mutex_destroy(&s->wake_mu);
        free(s);
        return rc;
    }
    /* The front door owns the listen socket and adds connections (MHD_add_connection, which
     * wakes the polling threads through MHD's inter-thread channel). */
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
                     MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC;
    unsigned pool = cfg->http_threads > 1 ? cfg->http_threads : 1;
    size_t head_limit = (size_t)cfg->connection_memory_kb * 1024;
    pthread_mutex_init(&s->sock_mu, NULL);
    s->d = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION,
        srv__on_connection, s, MHD_OPTION_URI_LOG_CALLBACK, on_uri, s,
        /* Bounds per connection (see README, "Resource bounds"): idle connections close. The
         * front door enforces the connection limit; MHD's is higher so that it never
         * refuses what the front door let in. */
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->connection_timeout,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections + 64,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, head_limit * SRV_POOL_PER_HEAD,
        pool > 1 ? MHD_OPTION_THREAD_POOL_SIZE : MHD_OPTION_END, pool, MHD_OPTION_END);
    if (!s->d) {
        snprintf(err, err_len, "cannot start the HTTP daemon on port %u", s->port);
        close(s->listen_fd);
        pthread_mutex_destroy(&s->sock_mu);
        pthread_mutex_destroy(&s->wake_mu);
        free(s);
        return KVS_EIO;
    }
    srv_frontdoor_params fp = {
        .listen_fd = s->listen_fd,
        .max_connections = cfg->max_connections,
        .head_limit = head_limit,
        .max_fields = (unsigned)(head_limit / SRV_HEAD_BYTES_PER_FIELD),
        .timeout_s = cfg->connection_timeout,
        .handoff = door_handoff,
        .n_held = door_n_held,
        .refused = door_refused,
        .ud = s,
    };
    rc = srv_frontdoor_start(&fp, &s->door);
    if (rc) {
        snprintf(err, err_len, "cannot start the HTTP front door: %s", status_str(rc));
        s->door = NULL;
        MHD_stop_daemon(s->d);
        close(s->listen_fd);
        pthread_mutex_destroy(&s->sock_mu);
        pthread_mutex_destroy(&s->wake_mu);
        free(s);
        return rc;
    }
    pthread_mutex_init(&s->reaper_mu, NULL);
    pthread_cond_init(&s->reaper_cv, NULL);
    /* Without the reaper vanished clients are still noticed at their next event: serve on. */
    s->reaper_started = pthread_create(&s->reaper, NULL, srv__reaper_main, s) == 0;
    if (!s->reaper_started)
        log_warn("cannot start the connection reaper thread; serving without it");
    *out = s;
    return 0;
}

uint16_t srv_port(const srv_server *s)
{
    return s->port;
}

void srv_set_ready(srv_server *s, const engine_model *m, sched *sc, const char *served_name,
                   const srv_chat_fmt *chat, uint32_t n_ctx)
{
    s->model = m;
    s->vocab = engine_model_vocab(m);
    s->sched = sc;
    free(s->served_name);
    s->served_name = strdup(served_name);
    s->chat = *chat;
    s->n_ctx = n_ctx;
    atomic_store(&s->state, ST_READY);
}

void srv_begin_drain(srv_server *s)
{
    atomic_store(&s->state, ST_DRAINING);
}

uint32_t srv_n_active(srv_server *s)
{
    return atomic_load(&s->n_active);
}

void srv_stop(srv_server *s)
{
    if (!s || !s->d)
        return;
    atomic_store(&s->state, ST_STOPPING);
    /* No new connection from now on; those still reading their head are closed. Relayed ones
     * go on until the daemon stops. */
    srv_frontdoor_stop(s->door);
    if (s->reaper_started) {
        pthread_mutex_lock(&s->reaper_mu);
        s->reaper_stop = true;
        pthread_cond_signal(&s->reaper_cv);
        pthread_mutex_unlock(&s->reaper_mu);
        pthread_join(s->reaper, NULL);
        s->reaper_started = false;
    }
    /* Suspended connections must be resumed before the daemon stops; once resumed they see
     * ST_STOPPING and close. A few rounds cover a connection that suspended just now. */
    for (int round = 0; round < 50; round++) {
        /* Slots are only ever prepended and live until srv_destroy, so the list can be walked
         * without wake_mu once its head is read (never hold wake_mu with a slot's mu). */
        pthread_mutex_lock(&s->wake_mu);
        srv_wake *head = s->wake_all;
        pthread_mutex_unlock(&s->wake_mu);
        int busy = 0;
        for (srv_wake *w = head; w; w = w->next_all) {
            pthread_mutex_lock(&w->mu);
            if (w->mc && w->suspended) {
                w->suspended = false;
                MHD_resume_connection(w->mc);
            }
            busy += w->mc != NULL;
            pthread_mutex_unlock(&w->mu);
        }
        if (!busy)
            break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    MHD_stop_daemon(s->d);
    s->d = NULL;
    srv_frontdoor_destroy(s->door);
    s->door = NULL;
    close(s->listen_fd);
}

void srv_destroy(srv_server *s)
{
    if (!s)
        return;
    srv_stop(s);
    srv_wake *w = s->wake_all;
    while (w) {
        srv_wake *next = w->next_all;
        pthread_mutex_destroy(&w->mu);
        free(w);
        w = next;
    }
    pthread_mutex_destroy(&s->wake_mu);
    pthread_mutex_destroy(&s->sock_mu);
    pthread_mutex_destroy(&s->reaper_mu);
    pthread_cond_destroy(&s->reaper_cv);
    free(s->served_name);
    free(s);
}
