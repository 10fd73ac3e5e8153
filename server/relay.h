/* The relay: every connection the front door accepts goes through it, so that every request
 * head and every chunked body on a connection, not only the first head, is checked by
 * server/http_head.h before libmicrohttpd sees it (libmicrohttpd 0.9.75 answers what it
 * cannot parse with its own HTML, with no hook to change that).
 *
 * The client's socket stays here; the daemon gets one end of a socketpair (with the client's
 * address, for logs). One thread copies bytes both ways through bounded buffers, parsing the
 * client's stream as HTTP/1.1 requests: heads are forwarded as sent once they pass, bodies by
 * Content-Length, chunked bodies decoded and re-chunked with clean size lines and no trailer
 * fields. What the daemon writes goes to the client as soon as it is read, with Nagle off (a
 * stream's events must not wait for the client's delayed ACKs). A bad head or chunk gets the
 * same JSON error as a bad first head, with "Connection: close", once the responses to the
 * requests before it were relayed whole: the daemon reports each finished response
 * (srv_relay_done), which is how the relay knows. A client that closes, half-closes or resets
 * is passed on at once (the daemon's end sees it, so the reaper does).
 *
 * Threads: start/stop/destroy from the main thread; srv_relay_add from the front door's
 * thread; srv_relay_done from any thread (the daemon's); callbacks on the caller of
 * srv_relay_add (handoff) or on the relay's thread (refused). */
#ifndef KVS_SERVER_RELAY_H
#define KVS_SERVER_RELAY_H

#include <stddef.h>
#include <sys/socket.h>

typedef struct srv_relay srv_relay;

typedef struct srv_relay_params {
    size_t head_limit;   /* bytes of a request head (and of a trailer section) at most: 431 */
    unsigned max_fields; /* header fields plus query parameters at most: 431 */
    unsigned timeout_s;  /* after the daemon closed a connection, how long its client may take
                          * to read what is left (0 = no limit) */
    /* Gives the daemon fd (its end of the pair): returns 0, or -1 when the daemon refused it
     * and closed fd. */
    int (*handoff)(void *ud, int fd, const struct sockaddr *addr, socklen_t addr_len);
    /* As srv_frontdoor_params.refused. */
    void (*refused)(void *ud, int status, const char *method, size_t method_len, const char *target,
                    size_t target_len, const char *message);
    void *ud;
} srv_relay_params;

/* Starts the thread. KVS_ENOMEM, KVS_EIO; *out untouched on failure. */
int srv_relay_start(const srv_relay_params *p, srv_relay **out);
/* Takes fd (a client whose first head is valid and unread, non-blocking) in every case: 0, or
 * -1 when no pair could be made or the daemon refused its end (fd closed). */
int srv_relay_add(srv_relay *r, int fd, const struct sockaddr *addr, socklen_t addr_len);
/* The daemon sent a whole response on its socket daemon_fd (call before it closes that fd). */
void srv_relay_done(srv_relay *r, int daemon_fd);
/* Call after the daemon stopped: delivers what its closed ends still hold (for up to 2 s),
 * then joins the thread and closes every socket it holds; srv_relay_done stays safe to call until
 * srv_relay_destroy. NULL: no-op. */
void srv_relay_stop(srv_relay *r);
/* Stops if needed and frees. NULL: no-op. */
void srv_relay_destroy(srv_relay *r);

#endif
