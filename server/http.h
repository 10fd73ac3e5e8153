/* The HTTP front end: a libmicrohttpd daemon (epoll, internal polling threads, suspend/resume)
 * serving the routes of API.md. Lifecycle: srv_start binds and serves 503 while loading;
 * srv_set_ready switches to serving; srv_begin_drain makes new requests (and /health) 503 while
 * in-flight ones continue; srv_stop closes every connection and frees.
 *
 * Threads: srv_* lifecycle calls come from the main thread. Request handling runs on the MHD
 * threads; the scheduler's notify callback (engine thread) only resumes a connection. */
#ifndef KVS_SERVER_HTTP_H
#define KVS_SERVER_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model.h"
#include "scheduler/scheduler.h"
#include "server/chat_template.h"
#include "server/config.h"

typedef struct srv_server srv_server;

/* Binds cfg->host:cfg->port and starts the daemon (all requests 503 until ready). cfg must
 * outlive the server. KVS_EIO with a one-line reason (port in use, bad address). */
int srv_start(const srv_config *cfg, srv_server **out, char *err, size_t err_len);
/* The bound port (useful with --port 0). */
uint16_t srv_port(const srv_server *s);
/* Starts serving with model m and scheduler sc (both outlive the server until srv_stop). */
void srv_set_ready(srv_server *s, const engine_model *m, sched *sc, const char *served_name,
                   const srv_chat_fmt *chat, uint32_t n_ctx);
/* New requests and /health get 503 from now on. */
void srv_begin_drain(srv_server *s);
/* Generation requests accepted and not yet completed (response sent or client gone). */
uint32_t srv_n_active(srv_server *s);
/* Closes all connections (suspended streams included) and stops the daemon; requests still
 * held are released (sched_req_release), so the scheduler must still exist. NULL: no-op. */
void srv_stop(srv_server *s);
/* Frees the notify slots; call after sched_destroy, since the engine thread may still call
 * a request's notify until then. */
void srv_destroy(srv_server *s);

#endif
