/* The front door: one thread that owns the listen socket, accepts every client at once, and
 * hands a connection on (to server/relay.h, which gives the HTTP daemon a socketpair end and
 * checks every later request) only once its first request head has arrived whole and passed
 * server/http_head.h's checks. Before that it holds no daemon resource: a client
 * that closes (or half-closes, or resets) is dropped at once, one that stalls is dropped after
 * the timeout, one beyond the connection limit gets a 503 and one with a bad head the JSON
 * error for it, each with "Connection: close". The head is only peeked (MSG_PEEK): the relay
 * reads it again from the socket.
 *
 * Threads: srv_frontdoor_start/stop/destroy from the main thread, srv_frontdoor_done from the
 * daemon's; handoff runs on the front door's thread, refused on it or the relay's. */
#ifndef KVS_SERVER_FRONTDOOR_H
#define KVS_SERVER_FRONTDOOR_H

#include <stddef.h>
#include <sys/socket.h>

typedef struct srv_frontdoor srv_frontdoor;

typedef struct srv_frontdoor_params {
    int listen_fd;            /* bound, listening; stays the caller's (not closed) */
    unsigned max_connections; /* heads being read plus n_held() at most; more get 503 */
    size_t head_limit;        /* bytes of request line and headers at most (431 beyond) */
    unsigned max_fields;      /* header fields plus query parameters at most (431 beyond) */
    unsigned timeout_s;       /* a head with no new byte for this long is dropped; 0 = never */
    /* Takes fd (the daemon's end of a relay pair, non-blocking) in every case: returns 0, or
     * -1 when the daemon refused it (fd closed). */
    int (*handoff)(void *ud, int fd, const struct sockaddr *addr, socklen_t addr_len);
    /* Connections handed off and not yet closed by the daemon. */
    unsigned (*n_held)(void *ud);
    /* An error response was sent (for the access log and metrics); method and target are the
     * client's bytes, not terminated, possibly empty. */
    void (*refused)(void *ud, int status, const char *method, size_t method_len, const char *target,
                    size_t target_len, const char *message);
    void *ud;
} srv_frontdoor_params;

/* Starts the thread and the relay's. KVS_ENOMEM, KVS_EIO (no thread or pipe); *out is set
 * before the threads start and reset to NULL on failure. */
int srv_frontdoor_start(const srv_frontdoor_params *p, srv_frontdoor **out);
/* Stops accepting, joins the thread and closes every socket not handed off; relayed
 * connections go on until srv_frontdoor_destroy. NULL: no-op. */
void srv_frontdoor_stop(srv_frontdoor *f);
/* The daemon finished a response on daemon_fd (see srv_relay_done). Safe until destroy. */
void srv_frontdoor_done(srv_frontdoor *f, int daemon_fd);
/* Stops, closes every relayed connection and frees: after the daemon stopped. NULL: no-op. */
void srv_frontdoor_destroy(srv_frontdoor *f);

#endif
