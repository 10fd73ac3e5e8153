/* HTTP routing, request handling and streaming over libmicrohttpd.
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
 * socket and hands over a connection once its first request head is whole and valid; later
 * requests on a kept-alive connection are checked here (framing, path) as the front door
 * checked the first.
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
#include "server/kv_view.h"
#include "server/frontdoor.h"
#include "server/http_head.h"
#include "server/metrics.h"
#include "server/response.h"

/* The web page (server/webui/index.html through tools/embed.py). */
extern const unsigned char srv_webui_page[];
extern const unsigned long srv_webui_page_len;

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
    enum srv_chat_tmpl tmpl;
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
    R_MODELS,
    R_MODEL_ONE,
    R_HEALTH,
    R_METRICS,
    R_TOKENIZE,
    R_DETOKENIZE,
    R_PAGE,
    R_KV
};

enum phase { PH_BODY = 0, PH_WAIT, PH_STREAM, PH_DONE };
enum stream_state { SS_START = 0, SS_EVENTS, SS_END };

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
    bool checked; /* answer_early has run */
    int status;   /* HTTP status sent */
    bool client_gone;

    char *body;
    size_t body_len, body_cap;
    bool too_large;
    uint64_t discarded; /* body bytes dropped after too_large (bounded, see on_request) */

    /* generation */
    srv_request rq;
    sched_req *req;
    srv_wake *wake;
    srv_resp_ctx rx;
    char id[48];
    srv_choice *choices;
    uint32_t n_choices;
    uint32_t prompt_tokens, cached_tokens, completion_tokens;
    uint32_t delta_tokens; /* tokens seen in deltas: what a cancelled request had generated */
    int fail_status;       /* a choice finished with an error: its status */

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
static _Thread_local bool tl_client_gone;

/* ---------- wake slots ---------- */

static srv_wake *wake_get(srv_server *s, struct MHD_Connection *mc)
{
    pthread_mutex_lock(&s->wake_mu);
    srv_wake *w = s->wake_free;
    if (w)
        s->wake_free = w->next_free;
    pthread_mutex_unlock(&s->wake_mu);
    if (!w) {
        w = calloc(1, sizeof *w);
        if (!w)
            return NULL;
        pthread_mutex_init(&w->mu, NULL);
        pthread_mutex_lock(&s->wake_mu);
        w->next_all = s->wake_all;
        s->wake_all = w;
        pthread_mutex_unlock(&s->wake_mu);
    }
    pthread_mutex_lock(&w->mu);
    w->mc = mc;
    w->suspended = false;
    w->peer_gone = false;
    pthread_mutex_unlock(&w->mu);
    return w;
}

static void wake_put(srv_server *s, srv_wake *w)
{
    pthread_mutex_lock(&w->mu);
    w->mc = NULL;
    w->suspended = false;
    w->peer_gone = false;
    pthread_mutex_unlock(&w->mu);
    pthread_mutex_lock(&s->wake_mu);
    w->next_free = s->wake_free;
    s->wake_free = w;
    pthread_mutex_unlock(&s->wake_mu);
}

/* Engine thread: new events for the request behind ud. */
static void on_notify(void *ud)
{
    srv_wake *w = ud;
    pthread_mutex_lock(&w->mu);
    if (w->mc && w->suspended) {
        w->suspended = false;
        MHD_resume_connection(w->mc);
    }
    pthread_mutex_unlock(&w->mu);
}

/* Takes the next event, or suspends the connection when none is queued (returns 0 then).
 * Returns -2 when the reaper found the client gone: the caller closes the connection, and
 * on_completed releases (cancels) the request. */
static int next_or_suspend(srv_conn *c, sched_event *ev)
{
    srv_wake *w = c->wake;
    pthread_mutex_lock(&w->mu);
    if (w->peer_gone) {
        pthread_mutex_unlock(&w->mu);
        tl_client_gone = true;
        return -2;
    }
    int r = sched_req_next(c->req, ev);
    if (r == 0) {
        w->suspended = true;
        MHD_suspend_connection(c->mc);
    }
    pthread_mutex_unlock(&w->mu);
    return r;
}

/* The reaper. A suspended connection is not polled by MHD, and MHD also misses a client's
 * end of stream when it arrives together with data (it takes a short read for a drained
 * socket and waits for an edge that never comes), so a vanished client would keep its slot,
 * its queue place and later its KV blocks until the connection timeout, or forever with
 * --connection-timeout 0. Every REAPER_PERIOD_MS this thread polls every open connection's
 * socket for POLLRDHUP: the peer closed or half-closed (a half-close counts as gone, as
 * clients do not half-close an HTTP request), or a socket error. A suspended connection is
 * marked peer_gone and resumed, and its handler closes it, which cancels the request; any
 * other is shut down (both directions), which MHD's next I/O on it sees and closes. One
 * poll() over the open sockets per period: cheap, and the kernel keeps the flag until then. */
#define REAPER_PERIOD_MS 200

static void *reaper_main(void *arg)
{
    srv_server *s = arg;
    struct pollfd *pfd = NULL;
    size_t cap = 0;
    pthread_mutex_lock(&s->reaper_mu);
    while (!s->reaper_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += REAPER_PERIOD_MS * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&s->reaper_cv, &s->reaper_mu, &ts);
        if (s->reaper_stop)
            break;
        pthread_mutex_unlock(&s->reaper_mu);
        /* Under sock_mu a listed connection's fd is open: MHD reports a connection closed
         * (on_connection, which takes sock_mu) before it closes the socket. */
        pthread_mutex_lock(&s->sock_mu);
        size_t n = 0;
        for (srv_sock *k = s->socks; k; k = k->next)
            n++;
        if (n > cap) {
            struct pollfd *np = realloc(pfd, n * 2 * sizeof *np);
            if (np) {
                pfd = np;
                cap = n * 2;
            }
        }
        if (n > cap)
            n = cap;
        size_t i = 0;
        for (srv_sock *k = s->socks; k && i < n; k = k->next, i++)
            pfd[i] = (struct pollfd){.fd = k->nudged ? -1 : k->fd, .events = POLLRDHUP};
        if (n && poll(pfd, n, 0) > 0) {
            i = 0;
            for (srv_sock *k = s->socks; k && i < n; k = k->next, i++) {
                if (!(pfd[i].revents & (POLLRDHUP | POLLHUP | POLLERR)))
                    continue;
                srv_wake *w = k->wake;
                bool resumed = false;
                if (w) {
                    pthread_mutex_lock(&w->mu);
                    /* Under w->mu a suspended slot's connection is alive and stays suspended. */
                    if (w->mc && w->suspended) {
                        w->peer_gone = true;
                        w->suspended = false;
                        MHD_resume_connection(w->mc);
                        resumed = true;
                    }
                    pthread_mutex_unlock(&w->mu);
                }
                if (!resumed) {
                    k->nudged = true;
                    shutdown(k->fd, SHUT_RDWR);
                }
            }
        }
        pthread_mutex_unlock(&s->sock_mu);
        pthread_mutex_lock(&s->reaper_mu);
    }
    pthread_mutex_unlock(&s->reaper_mu);
    free(pfd);
    return NULL;
}

/* MHD's notice of a connection opened or closed: keeps the reaper's list and the count the
 * front door enforces --max-connections with. MHD pairs the two notices (a connection it
 * fails to set up is reported closed too), so the count is exact once MHD_add_connection's
 * work is done; a hand-off still in MHD's queue is missed for that moment, which MHD's own
 * limit, set higher (srv_start), absorbs. */
static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    srv_server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        atomic_fetch_add(&s->n_conns, 1);
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        srv_sock *k = ci ? calloc(1, sizeof *k) : NULL;
        *socket_context = k;
        if (!k)
            return; /* unwatched: it still times out */
        k->fd = ci->connect_fd;
        pthread_mutex_lock(&s->sock_mu);
        k->next = s->socks;
        if (s->socks)
            s->socks->prev = k;
        s->socks = k;
        pthread_mutex_unlock(&s->sock_mu);
        return;
    }
    srv_sock *k = *socket_context;
    *socket_context = NULL;
    atomic_fetch_sub(&s->n_conns, 1);
    if (!k)
        return;
    pthread_mutex_lock(&s->sock_mu);
    if (k->prev)
        k->prev->next = k->next;
    else
        s->socks = k->next;
    if (k->next)
        k->next->prev = k->prev;
    pthread_mutex_unlock(&s->sock_mu);
    free(k);
}

static srv_sock *sock_of(struct MHD_Connection *mc)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* Tells the reaper which wake slot (or none) the connection's request uses. */
static void sock_set_wake(srv_server *s, struct MHD_Connection *mc, srv_wake *w)
{
    srv_sock *k = sock_of(mc);
    if (!k)
        return;
    pthread_mutex_lock(&s->sock_mu);
    k->wake = w;
    pthread_mutex_unlock(&s->sock_mu);
}

/* ---------- responses ---------- */

static void count_status(srv_server *s, int status)
{
    atomic_fetch_add(&s->status_counts[srv_status_index(status)], 1);
}

static enum MHD_Result send_body(srv_conn *c, int status, const char *ctype, const char *body,
                                 size_t len)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (status == 405) {
        bool post = c->route == R_COMPLETIONS || c->route == R_CHAT || c->route == R_TOKENIZE ||
                    c->route == R_DETOKENIZE;
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, post ? "POST" : "GET");
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

static enum MHD_Result send_json(srv_conn *c, int status, const char *json)
{
    if (!json)
        return MHD_NO;
    return send_body(c, status, "application/json", json, strlen(json));
}

static enum MHD_Result send_cjson(srv_conn *c, int status, cJSON *j)
{
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    enum MHD_Result r = send_json(c, status, s);
    free(s);
    return r;
}

static enum MHD_Result send_error(srv_conn *c, const srv_error *e)
{
    if (e->status >= 500)
        log_error("request %s: %d %s", c->reqid, e->status, e->message);
    char *s = srv_error_json(e);
    enum MHD_Result r = send_json(c, e->status, s);
    free(s);
    return r;
}

static enum MHD_Result fail(srv_conn *c, int status, const char *param, const char *code,
                            const char *msg)
{
    srv_error e;
    srv_error_set(&e, status, param, code, "%s", msg);
    return send_error(c, &e);
}

/* ---------- routing ---------- */

static enum route route_of(const char *url, bool *post)
{
    static const struct {
        const char *path;
        enum route r;
        bool post;
    } k[] = {
        {"/v1/completions", R_COMPLETIONS, true},
        {"/v1/chat/completions", R_CHAT, true},
        {"/v1/models", R_MODELS, false},
        {"/health", R_HEALTH, false},
        {"/metrics", R_METRICS, false},
        {"/tokenize", R_TOKENIZE, true},
        {"/detokenize", R_DETOKENIZE, true},
        {"/", R_PAGE, false},
        {"/kv-cache", R_KV, false},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
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

/* ---------- simple routes ---------- */

static enum MHD_Result do_models(srv_conn *c, const char *url)
{
    srv_server *s = c->srv;
    if (c->route == R_MODEL_ONE && strcmp(url + 11, s->served_name))
        return fail(c, 404, "model", "model_not_found", "The model does not exist");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->served_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->started);
    cJSON_AddStringToObject(m, "owned_by", "kvserve");
    cJSON_AddNumberToObject(m, "max_model_len", s->n_ctx);
    if (c->route == R_MODEL_ONE)
        return send_cjson(c, 200, m);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON_AddItemToArray(data, m);
    return send_cjson(c, 200, root);
}

static enum MHD_Result do_metrics(srv_conn *c)
{
    srv_server *s = c->srv;
    uint64_t counts[SRV_N_STATUS];
    for (int i = 0; i < SRV_N_STATUS; i++)
        counts[i] = atomic_load(&s->status_counts[i]);
    sched_metrics m;
    bool have = atomic_load(&s->state) >= ST_READY && s->sched;
    if (have)
        sched_get_metrics(s->sched, &m);
    char *text =
        srv_metrics_format(have ? &m : NULL, counts, have ? engine_model_kernels(s->model) : NULL);
    if (!text)
        return fail(c, 500, NULL, NULL, "out of memory");
    enum MHD_Result r =
        send_body(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, strlen(text));
    free(text);
    return r;
}

/* GET /kv-cache[?cells=N]: a snapshot of the KV pool taken between two engine steps, folded
 * into at most N cells (default 4096) for the page's grid. */
static enum MHD_Result do_kv(srv_conn *c)
{
    srv_server *s = c->srv;
    const char *q = MHD_lookup_connection_value(c->mc, MHD_GET_ARGUMENT_KIND, "cells");
    unsigned long cells = 4096;
    if (q) {
        char *end;
        errno = 0;
        cells = strtoul(q, &end, 10);
        if (errno || end == q || *end || cells < 1 || cells > SRV_KV_MAX_CELLS)
            return fail(c, 400, "cells", NULL, "'cells' must be an integer from 1 to 65536");
    }
    sched_kv_snapshot k;
    int rc = sched_kv_snapshot_take(s->sched, &k, 5000);
    if (rc)
        return fail(c, 503, NULL, NULL, "the engine is busy or stopping; no KV snapshot");
    sched_metrics m;
    sched_get_metrics(s->sched, &m);
    const engine_hparams *hp = engine_model_hparams(s->model);
    srv_kv_model info = {s->served_name, hp->arch, engine_model_weight_type(s->model),
                         engine_model_kernels(s->model), s->n_ctx};
    char *body = srv_kv_json(&k, &info, m.generation_tokens_total, (uint32_t)cells);
    sched_kv_snapshot_free(&k);
    if (!body)
        return fail(c, 500, NULL, NULL, "out of memory");
    enum MHD_Result r = send_json(c, 200, body);
    free(body);
    return r;
}

/* Tokenizes text into a malloc'd array. */
static int tokenize(const tok_vocab *v, const char *text, bool add_bos, int32_t **ids, size_t *n)
{
    size_t len = strlen(text);
    size_t cap = len + 8;
    for (int attempt = 0; attempt < 2; attempt++) {
        int32_t *buf = malloc(cap * sizeof *buf);
        if (!buf)
            return KVS_ENOMEM;
        size_t got = 0;
        int rc = tok_encode(v, text, len, add_bos, true, buf, cap, &got);
        if (rc == 0) {
            *ids = buf;
            *n = got;
            return 0;
        }
        free(buf);
        if (rc != KVS_ENOSPC)
            return rc;
        cap = got;
    }
    return KVS_ENOSPC;
}

static enum MHD_Result do_tokenize(srv_conn *c)
{
    srv_server *s = c->srv;
    cJSON *root;
    srv_error e;
    if (srv_json_parse(c->body ? c->body : "", c->body_len, &root, &e))
        return send_error(c, &e);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return fail(c, 400, NULL, NULL, "request body must be a JSON object");
    }
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!p)
        p = cJSON_GetObjectItemCaseSensitive(root, "text");
    const cJSON *as = cJSON_GetObjectItemCaseSensitive(root, "add_special_tokens");
    if (!cJSON_IsString(p) || (as && !cJSON_IsBool(as) && !cJSON_IsNull(as))) {
        cJSON_Delete(root);
        return fail(c, 400, cJSON_IsString(p) ? "add_special_tokens" : "prompt", NULL,
                    cJSON_IsString(p) ? "'add_special_tokens' must be a boolean"
                                      : "'prompt' must be a string");
    }
    bool add_bos = (as && cJSON_IsBool(as)) ? cJSON_IsTrue(as) : tok_add_bos(s->vocab);
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = tokenize(s->vocab, p->valuestring, add_bos, &ids, &n);
    cJSON_Delete(root);
    if (rc)
        return fail(c, 500, NULL, NULL, "tokenization failed");
    cJSON *out = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(out, "tokens");
    for (size_t i = 0; arr && i < n; i++)
        cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
    cJSON_AddNumberToObject(out, "count", (double)n);
    cJSON_AddNumberToObject(out, "max_model_len", s->n_ctx);
    free(ids);
    return send_cjson(c, 200, out);
}

static enum MHD_Result do_detokenize(srv_conn *c)
{
    srv_server *s = c->srv;
    cJSON *root;
    srv_error e;
    if (srv_json_parse(c->body ? c->body : "", c->body_len, &root, &e))
        return send_error(c, &e);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return fail(c, 400, NULL, NULL, "request body must be a JSON object");
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    int n = cJSON_IsArray(t) ? cJSON_GetArraySize(t) : -1;
    int32_t *ids = n > 0 ? malloc((size_t)n * sizeof *ids) : NULL;
    bool ok = n >= 0 && (n == 0 || ids);
    int i = 0;
    const cJSON *it;
    if (ok)
        cJSON_ArrayForEach(it, t)
        {
            if (!cJSON_IsNumber(it) || it->valuedouble < 0 ||
                it->valuedouble >= tok_n_vocab(s->vocab) ||
                it->valuedouble != (double)(int32_t)it->valuedouble) {
                ok = false;
                break;
            }
            ids[i++] = (int32_t)it->valuedouble;
        }
    cJSON_Delete(root);
    if (!ok) {
        free(ids);
        return fail(c, 400, "tokens", NULL, "'tokens' must be an array of valid token ids");
    }
    size_t need = 0;
    char probe[1];
    tok_decode(s->vocab, ids, (size_t)i, true, probe, 0, &need);
    char *text = malloc(need + 1);
    size_t got = 0;
    if (!text || tok_decode(s->vocab, ids, (size_t)i, true, text, need + 1, &got)) {
        free(ids);
        free(text);
        return fail(c, 500, NULL, NULL, "detokenization failed");
    }
    text[got] = '\0';
    free(ids);
    cJSON *out = cJSON_CreateObject();
    cJSON_AddItemToObject(out, "prompt", srv_json_string_n(text, got));
    free(text);
    return send_cjson(c, 200, out);
}

/* ---------- generation ---------- */

static enum MHD_Result finish_full(srv_conn *c);

static void note_event(srv_conn *c, const sched_event *ev)
{
    if (c->t_first == 0 && (ev->text_len || ev->n_tokens))
        c->t_first = time_now_s();
    /* The scheduler queues one delta per token that produced text or logprobs. */
    if (ev->finish == SCHED_FINISH_NONE)
        c->delta_tokens += ev->n_tokens ? ev->n_tokens : (ev->text_len ? 1 : 0);
    if (ev->finish != SCHED_FINISH_NONE) {
        c->prompt_tokens = ev->prompt_tokens;
        c->cached_tokens = ev->cached_tokens;
        c->completion_tokens += ev->completion_tokens;
        if (ev->finish == SCHED_FINISH_ERROR && !c->fail_status)
            c->fail_status = ev->status ? ev->status : KVS_EINVAL;
    }
}

static void error_of_status(int st, srv_error *e)
{
    if (st == KVS_ECANCELED || st == KVS_EBUSY)
        srv_error_set(e, 503, NULL, NULL, "the server is shutting down; request aborted");
    else
        srv_error_set(e, 500, NULL, NULL, "generation failed: %s", status_str(st));
}

/* Non-streaming: drain events until every choice finished, suspending in between. */
static enum MHD_Result pump_full(srv_conn *c)
{
    for (;;) {
        sched_event ev;
        int r = next_or_suspend(c, &ev);
        if (r == 0)
            return MHD_YES;
        if (r == -2)
            return MHD_NO; /* client gone */
        if (r < 0)
            return finish_full(c);
        note_event(c, &ev);
        if (ev.choice < c->n_choices && srv_choice_add(&c->choices[ev.choice], &ev))
            c->fail_status = KVS_ENOMEM;
        sched_event_free(&ev);
    }
}

static enum MHD_Result finish_full(srv_conn *c)
{
    if (c->fail_status) {
        srv_error e;
        error_of_status(c->fail_status, &e);
        return send_error(c, &e);
    }
    char *body =
        srv_resp_full(&c->rx, c->choices, c->n_choices, c->prompt_tokens, c->cached_tokens);
    if (!body)
        return fail(c, 500, NULL, NULL, "out of memory");
    c->resp_bytes = strlen(body);
    enum MHD_Result r = send_json(c, 200, body);
    free(body);
    return r;
}

static bool out_append(srv_conn *c, char *s)
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

/* Formats one event as SSE: its text delta (if any, or if it carries logprobs), then the
 * finish chunk, or the error event that ends the stream. */
static bool format_event(srv_conn *c, const sched_event *ev)
{
    if (ev->choice >= c->n_choices)
        return true;
    srv_choice *ch = &c->choices[ev->choice];
    if (ev->finish == SCHED_FINISH_ERROR) {
        srv_error e;
        error_of_status(ev->status, &e);
        char *j = srv_error_json(&e);
        bool ok = out_append(c, srv_sse_wrap(j));
        free(j);
        c->ss = SS_END;
        return ok;
    }
    bool ok = true;
    if (ev->text_len || ev->n_tokens)
        ok = out_append(c, srv_resp_chunk(&c->rx, ev->choice, ev->text, ev->text_len, ev->tokens,
                                          ev->n_tokens, SCHED_FINISH_NONE, false, ch->len));
    ch->len += ev->text_len; /* only the offset is tracked: streams keep no text */
    if (ok && ev->finish != SCHED_FINISH_NONE)
        ok = out_append(
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
            if (c->rx.chat)
                for (uint32_t i = 0; i < c->n_choices; i++)
                    if (!out_append(c, srv_resp_chunk(&c->rx, i, "", 0, NULL, 0, SCHED_FINISH_NONE,
                                                      true, 0)))
                        return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        sched_event ev;
        int r = next_or_suspend(c, &ev);
        if (r == 0)
            return 0;
        if (r == -2)
            return MHD_CONTENT_READER_END_WITH_ERROR; /* client gone */
        if (r < 0) {
            if (c->rq.include_usage && !out_append(c, srv_resp_usage_chunk(&c->rx, c->prompt_tokens,
                                                                           c->completion_tokens)))
                return MHD_CONTENT_READER_END_WITH_ERROR;
            if (!out_append(c, strdup("data: [DONE]\n\n")))
                return MHD_CONTENT_READER_END_WITH_ERROR;
            c->ss = SS_END;
            continue;
        }
        note_event(c, &ev);
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
    c->phase = PH_STREAM;
    c->status = 200;
    enum MHD_Result ret = MHD_queue_response(c->mc, 200, r);
    MHD_destroy_response(r);
    return ret;
}

static void make_id(srv_server *s, const char *prefix, char *out, size_t cap)
{
    /* splitmix64 of a per-process salt and a counter: unique and not guessable in sequence. */
    uint64_t z = s->id_salt + atomic_fetch_add(&s->n_requests, 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    snprintf(out, cap, "%s%016llx", prefix, (unsigned long long)z);
}

static enum MHD_Result do_generate(srv_conn *c)
{
    srv_server *s = c->srv;
    bool chat = c->route == R_CHAT;
    srv_error e;
    sampler_params defaults = sampler_default_params();
    if (srv_request_parse(c->body ? c->body : "", c->body_len, chat, s->tmpl, &defaults, &c->rq,
                          &e))
        return send_error(c, &e);
    srv_request *rq = &c->rq;
    if (rq->model && strcmp(rq->model, s->served_name)) {
        srv_error_set(&e, 404, "model", "model_not_found", "The model '%s' does not exist",
                      rq->model);
        return send_error(c, &e);
    }
    const char *pparam = chat ? "messages" : "prompt";
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (rq->prompt_text) {
        if (tokenize(s->vocab, rq->prompt_text, tok_add_bos(s->vocab), &ids, &n_ids))
            return fail(c, 500, NULL, NULL, "tokenization failed");
    } else {
        int32_t nv = tok_n_vocab(s->vocab);
        for (size_t i = 0; i < rq->n_prompt_ids; i++)
            if (rq->prompt_ids[i] >= nv) {
                srv_error_set(&e, 400, "prompt", NULL, "token id %d is outside the vocabulary",
                              rq->prompt_ids[i]);
                return send_error(c, &e);
            }
        ids = rq->prompt_ids;
        n_ids = rq->n_prompt_ids;
        rq->prompt_ids = NULL;
        rq->n_prompt_ids = 0;
    }
    enum MHD_Result ret;
    if (n_ids == 0) {
        ret = fail(c, 400, pparam, NULL, "the prompt is empty");
        goto out;
    }
    if (n_ids >= s->n_ctx) {
        srv_error_set(&e, 400, pparam, "context_length_exceeded",
                      "This model's maximum context length is %u tokens; the prompt has %zu",
                      s->n_ctx, n_ids);
        ret = send_error(c, &e);
        goto out;
    }
    uint32_t max_tokens = rq->max_tokens;
    if (chat && !rq->has_max_tokens)
        max_tokens = s->n_ctx - (uint32_t)n_ids;
    if (n_ids + max_tokens > s->n_ctx) {
        srv_error_set(&e, 400, "max_tokens", "context_length_exceeded",
                      "This model's maximum context length is %u tokens; you requested %zu "
                      "(%zu in the prompt, %u to generate)",
                      s->n_ctx, n_ids + max_tokens, n_ids, max_tokens);
        ret = send_error(c, &e);
        goto out;
    }
    if (rq->n > s->cfg->max_num_seqs) {
        srv_error_set(&e, 400, "n", NULL,
                      "'n' is %u, but this server runs at most %u sequences at once "
                      "(--max-num-seqs), and each choice is one",
                      rq->n, s->cfg->max_num_seqs);
        ret = send_error(c, &e);
        goto out;
    }
    uint64_t bound = srv_response_bound(rq->n, max_tokens, rq->n_top_logprobs);
    if (bound > (uint64_t)s->cfg->max_response_mb << 20) {
        srv_error_set(&e, 400, rq->n_top_logprobs > 0 ? "top_logprobs" : "max_tokens", NULL,
                      "this request could make a response of %.0f MB (n = %u x %u tokens%s); "
                      "the limit is %u MB (--max-response-mb): lower n, max_tokens or the "
                      "logprobs asked for",
                      (double)bound / (1 << 20), rq->n, max_tokens,
                      rq->n_top_logprobs >= 0 ? " with logprobs" : "", s->cfg->max_response_mb);
        ret = send_error(c, &e);
        goto out;
    }
    if (!rq->has_seed) {
        uint64_t z = s->id_salt ^ ((uint64_t)time(NULL) << 20) ^
                     atomic_load(&s->n_requests) * 0x9E3779B97F4A7C15ull;
        rq->sampling.seed = z;
    }

    c->n_choices = rq->n;
    c->choices = calloc(rq->n, sizeof *c->choices);
    c->wake = wake_get(s, c->mc);
    if (!c->choices || !c->wake) {
        ret = fail(c, 500, NULL, NULL, "out of memory");
        goto out;
    }
    sock_set_wake(s, c->mc, c->wake);
    sched_request_params p = {0};
    p.prompt = ids;
    p.n_prompt = (uint32_t)n_ids;
    p.max_tokens = max_tokens;
    p.n = rq->n;
    p.sampling = rq->sampling;
    p.ignore_eos = rq->ignore_eos;
    for (int i = 0; i < rq->n_stop && i < SCHED_MAX_STOP; i++)
        p.stop[i] = rq->stop[i];
    p.n_top_logprobs = rq->n_top_logprobs;
    p.notify_on_finish_only = !rq->stream; /* the whole body is built at the end */

    make_id(s, chat ? "chatcmpl-" : "cmpl-", c->id, sizeof c->id);
    c->rx.chat = chat;
    c->rx.id = c->id;
    c->rx.created = (long long)time(NULL);
    c->rx.model = s->served_name;
    c->rx.vocab = s->vocab;
    c->rx.n_top_logprobs = rq->n_top_logprobs;
    c->prompt_tokens = (uint32_t)n_ids;

    int rc = sched_submit(s->sched, &p, on_notify, c->wake, &c->req);
    if (rc) {
        c->req = NULL;
        switch (rc) {
        case KVS_ENOSPC:
            ret = fail(c, 429, NULL, NULL, "too many requests waiting; retry later");
            break;
        case KVS_EBUSY: ret = fail(c, 503, NULL, NULL, "the server is shutting down"); break;
        case KVS_ERANGE:
            ret = fail(c, 400, "max_tokens", "context_length_exceeded",
                       "the prompt and max_tokens do not fit the context");
            break;
        case KVS_EINVAL:
            ret = fail(c, 400, NULL, NULL, "the scheduler rejected the request parameters");
            break;
        default:
            srv_error_set(&e, 500, NULL, NULL, "submit failed: %s", status_str(rc));
            ret = send_error(c, &e);
        }
        goto out;
    }
    atomic_fetch_add(&s->n_active, 1);
    if (rq->stream)
        ret = start_stream(c);
    else {
        c->phase = PH_WAIT;
        ret = pump_full(c);
    }
out:
    free(ids);
    return ret;
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
    make_id(s, "", c->reqid, sizeof c->reqid);
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

/* The checks the front door made on the connection's first request, for every request: a
 * kept-alive connection's later requests reach MHD without passing the front door. */
static bool request_is_sound(srv_conn *c, const char *version, srv_error *e)
{
    if (c->bad_target) {
        *e = c->bad_error;
        return false;
    }
    head_tally t = {0};
    MHD_get_connection_values(c->mc, MHD_HEADER_KIND | MHD_GET_ARGUMENT_KIND, tally_field, &t);
    /* The front door's head limits, for requests it did not see (MHD's pool is larger). */
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
    if (c->route == R_HEALTH) {
        if (st == ST_READY)
            *r = send_json(c, 200, "{\"status\":\"ok\"}");
        else
            *r = fail(c, 503, NULL, NULL,
                      st == ST_LOADING ? "the model is loading" : "the server is shutting down");
        return true;
    }
    if (c->route == R_PAGE) {
        /* the page holds no data (it asks /kv-cache and the API, which check the key) */
        if (s->cfg->no_webui)
            *r = fail(c, 404, NULL, NULL, "Not found (the web page is off: --no-webui)");
        else
            *r = send_body(c, 200, "text/html; charset=utf-8", (const char *)srv_webui_page,
                           (size_t)srv_webui_page_len);
        return true;
    }
    if (c->route != R_METRICS && !authorized(c)) {
        *r = fail(c, 401, NULL, "invalid_api_key", "Invalid or missing API key");
        return true;
    }
    if (st != ST_READY && c->route != R_METRICS) {
        *r = fail(c, 503, NULL, NULL,
                  st == ST_LOADING ? "the model is loading" : "the server is shutting down");
        return true;
    }
    switch (c->route) {
    case R_MODELS:
    case R_MODEL_ONE: *r = do_models(c, c->path); return true;
    case R_METRICS: *r = do_metrics(c); return true;
    case R_KV: *r = do_kv(c); return true;
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
            return send_error(c, &e);
        }
        bool post = false;
        c->route = route_of(c->path, &post);
        if (c->route == R_NONE)
            return fail(c, 404, NULL, NULL, "Not found");
        if (strcmp(method, post ? "POST" : "GET") && !(strcmp(method, "HEAD") == 0 && !post))
            return fail(c, 405, NULL, NULL, "Method not allowed");
        if (post) {
            /* Refuse an oversized body before reading any of it (the connection then closes,
             * which is what we want for a client that would send 100 MB). */
            const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Content-Length");
            if (cl) {
                char *end;
                unsigned long long n = strtoull(cl, &end, 10);
                if (n > s->cfg->max_body_bytes)
                    return fail(c, 413, NULL, NULL, "request body is too large");
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
        return pump_full(c);
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
        return fail(c, 413, NULL, NULL, "request body is too large");
    switch (c->route) {
    case R_COMPLETIONS:
    case R_CHAT: return do_generate(c);
    case R_TOKENIZE: return do_tokenize(c);
    case R_DETOKENIZE: return do_detokenize(c);
    default: return fail(c, 404, NULL, NULL, "Not found");
    }
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    srv_server *s = cls;
    srv_conn *c = *con_cls;
    tl_client_gone = false;
    if (!c)
        return;
    *con_cls = NULL;
    if (c->wake) {
        sock_set_wake(s, mc, NULL);
        wake_put(s, c->wake);
    }
    /* A client that left mid-generation is logged and counted as 499 (client closed). */
    c->client_gone = toe != MHD_REQUEST_TERMINATED_COMPLETED_OK &&
                     (c->phase == PH_WAIT || (c->phase == PH_STREAM && c->ss != SS_END));
    if (c->req) {
        /* What was generated and not yet taken still counts for the log line. */
        sched_event ev;
        while (c->client_gone && sched_req_next(c->req, &ev) > 0) {
            note_event(c, &ev);
            sched_event_free(&ev);
        }
        /* exact, also counting tokens whose text was still held back (a stop-string prefix,
         * a partial UTF-8 character) */
        uint32_t gen = sched_req_generated(c->req);
        if (gen > c->delta_tokens)
            c->delta_tokens = gen;
        sched_req_release(c->req); /* cancels it if unfinished: blocks go back to the pool */
        atomic_fetch_sub(&s->n_active, 1);
    }
    int status = c->client_gone || !c->status ? 499 : c->status;
    count_status(s, status);
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
             c->req ? c->prompt_tokens : 0, completion,
             c->t_first > 0 ? c->t_first - c->t_start : -1.0, now - c->t_start,
             c->client_gone ? " client_closed=1" : "");
    for (uint32_t i = 0; c->choices && i < c->n_choices; i++)
        srv_choice_free(&c->choices[i]);
    free(c->choices);
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
    /* The close that follows a cancel (see tl_client_gone), or MHD finding the peer gone
     * while it writes: how a client cancels, not a failure. */
    if (tl_client_gone || strstr(line, "by remote peer") || strstr(line, "reset by peer") ||
        strstr(line, "Broken pipe")) {
        tl_client_gone = false;
        log_debug("http: %s (the client had gone)", line);
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
    count_status(s, status);
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
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
        s, MHD_OPTION_URI_LOG_CALLBACK, on_uri, s,
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
    s->reaper_started = pthread_create(&s->reaper, NULL, reaper_main, s) == 0;
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
                   enum srv_chat_tmpl tmpl, uint32_t n_ctx)
{
    s->model = m;
    s->vocab = engine_model_vocab(m);
    s->sched = sc;
    free(s->served_name);
    s->served_name = strdup(served_name);
    s->tmpl = tmpl;
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
    /* No new connection from now on; those still reading their head are closed. */
    srv_frontdoor_stop(s->door);
    s->door = NULL;
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
