/* The relay (see relay.h): one epoll thread copying bytes between each client and the
 * daemon's end of its socketpair, checking and re-framing the client's requests on the way.
 *
 * Buffers are fixed per connection (in: head_limit, at least IN_MIN; up: in's size plus a
 * size line; down: DOWN_CAP plus room for one refusal), and a side is only read while its
 * buffer has room: a client that stops reading stops the relay reading the daemon, whose
 * writes then queue as they would on a TCP socket. Level-triggered epoll; interest is
 * recomputed after each step. Connections are freed only between epoll batches, so an event
 * never points at freed memory. Only the relay thread touches a connection, except n_done
 * and waiting, which the daemon's threads update under mu. */
#define _GNU_SOURCE /* EPOLLRDHUP */
#include "server/relay.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "common/status.h"
#include "common/timeutil.h"
#include "server/api.h"
#include "server/http_head.h"

#define IN_MIN (16u << 10)
#define DOWN_CAP (16u << 10)
#define REFUSAL_MAX 1024
/* A refused client gets this long to take its response before the socket closes, as at the
 * front door: closing with its unread request still queued would reset the connection and
 * can destroy the response in flight. */
#define LINGER_S 1.0
/* ... but a client still sending (a body the daemon refused to read) is not read for long:
 * the server must never swallow an unbounded upload. At most LINGER_MAX connections linger. */
#define LINGER_BYTES (64u << 10)
#define LINGER_MAX 256
#define EVENTS 64
/* At stop (the daemon has stopped), how long the relay may go on delivering what the daemon
 * wrote: a stream that finished during the drain must reach its client whole. */
#define STOP_FLUSH_S 2.0

enum parse_state { P_HEAD = 0, P_BODY, P_CSIZE, P_CDATA, P_CCRLF, P_TRAILER, P_STOP };

typedef struct rconn rconn;

typedef struct rside {
    rconn *c;
    int fd;        /* -1 once closed */
    uint32_t mask; /* events registered; 0 with registered = false: not in the epoll set */
    bool registered;
} rside;

struct rconn {
    rside cli, dmn;
    int daemon_fd; /* the daemon's end: the key srv_relay_done names this connection by */

    /* client -> daemon: raw bytes in `in`, the canonical stream in `up` */
    char *in;
    size_t in_len, in_cap;
    char *up;
    size_t up_off, up_len, up_cap;
    enum parse_state ps;
    uint64_t remain;      /* P_BODY, P_CDATA: bytes still to copy */
    size_t trailer_bytes; /* P_TRAILER: of the trailer section so far */
    unsigned n_good;      /* requests forwarded whole */
    char method[32], target[200];
    size_t method_len, target_len; /* of the request being forwarded (for a refusal's log) */

    /* daemon -> client */
    char *down;
    size_t down_off, down_len;

    bool cli_eof;  /* the client sent its FIN (or reset): nothing more is read from it */
    bool dmn_eof;  /* the daemon's end is closed or shut: nothing more comes from it */
    bool dmn_hup;  /* its end hung up: read it without epoll (reads never block then) */
    bool up_shut;  /* shutdown(SHUT_WR) on the daemon's end was done */
    bool refusing; /* a bad request was seen: err waits for the earlier responses */
    bool refusal_queued;
    srv_error err;
    bool lingering;
    double linger_until;
    size_t linger_bytes; /* read and dropped while lingering */
    double deliver_by;   /* the daemon's end is closed with bytes left: the client has until
                          * then to take them (0: no deadline) */
    bool dead;

    unsigned n_done; /* responses the daemon finished (relay mu) */
    bool waiting;    /* refusing: srv_relay_done must wake the thread (relay mu) */
    rconn *prev, *next;
    rconn *next_dead;
};

struct srv_relay {
    srv_relay_params p;
    pthread_t thread;
    bool started;
    int ep;
    int wake; /* eventfd: the inbox, a done() for a waiting connection, or stop */

    pthread_mutex_t mu; /* guards by_fd, inbox, stop and each rconn's n_done and waiting */
    rconn **by_fd;      /* indexed by the daemon's fd */
    size_t n_by_fd;
    rconn *inbox;
    bool stop;

    unsigned n_added; /* srv_relay_add's thread only */

    rconn *all; /* relay thread only */
    size_t n_linger;
    size_t n_deliver; /* connections with a deliver_by */
    rconn *dead;
};

static void wake_thread(srv_relay *r)
{
    uint64_t one = 1;
    while (write(r->wake, &one, sizeof one) < 0 && errno == EINTR) {
    }
}

static void conn_free(rconn *c)
{
    if (!c)
        return;
    free(c->in);
    free(c->up);
    free(c->down);
    free(c);
}

static void set_interest(srv_relay *r, rside *s, uint32_t want)
{
    if (s->fd < 0)
        return;
    if (s->registered && s->mask == want)
        return;
    struct epoll_event ev = {.events = want, .data.ptr = s};
    if (!s->registered) {
        if (epoll_ctl(r->ep, EPOLL_CTL_ADD, s->fd, &ev) == 0)
            s->registered = true;
    } else {
        epoll_ctl(r->ep, EPOLL_CTL_MOD, s->fd, &ev);
    }
    s->mask = want;
}

static void side_close(srv_relay *r, rside *s)
{
    if (s->fd < 0)
        return;
    if (s->registered)
        epoll_ctl(r->ep, EPOLL_CTL_DEL, s->fd, NULL);
    close(s->fd);
    s->fd = -1;
    s->registered = false;
}

/* The daemon's end goes away: it sees a hang-up (its reads end, the reaper's poll fires). */
static void close_daemon(srv_relay *r, rconn *c)
{
    side_close(r, &c->dmn);
    c->dmn_eof = true;
    pthread_mutex_lock(&r->mu);
    if (c->daemon_fd >= 0 && (size_t)c->daemon_fd < r->n_by_fd && r->by_fd[c->daemon_fd] == c)
        r->by_fd[c->daemon_fd] = NULL;
    c->waiting = false;
    pthread_mutex_unlock(&r->mu);
}

static void kill_conn(srv_relay *r, rconn *c)
{
    if (c->dead)
        return;
    close_daemon(r, c);
    side_close(r, &c->cli);
    if (c->lingering)
        r->n_linger--;
    if (c->deliver_by > 0)
        r->n_deliver--;
    c->lingering = false;
    c->deliver_by = 0;
    c->dead = true;
    if (c->prev)
        c->prev->next = c->next;
    else
        r->all = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->next_dead = r->dead;
    r->dead = c;
}

/* Everything was relayed: the client gets a FIN and, unless it already sent its own, a
 * moment to read before the close. */
static void finish(srv_relay *r, rconn *c)
{
    close_daemon(r, c);
    if (c->deliver_by > 0)
        r->n_deliver--;
    c->deliver_by = 0;
    if (c->cli_eof || r->n_linger >= LINGER_MAX) {
        kill_conn(r, c);
        return;
    }
    shutdown(c->cli.fd, SHUT_WR);
    c->lingering = true;
    c->linger_until = time_now_s() + LINGER_S;
    r->n_linger++;
    free(c->in);
    free(c->up);
    free(c->down);
    c->in = c->up = c->down = NULL;
}

static void copy_bytes(char *dst, size_t n, size_t *field, const char *field_src, size_t cap)
{
    *field = n < cap ? n : cap;
    if (*field)
        memcpy(dst, field_src, *field);
}

/* A refusal for the request now being parsed; the bytes after it are never forwarded. */
static void refuse(rconn *c, const srv_error *e)
{
    c->err = *e;
    c->refusing = true;
    c->ps = P_STOP;
}

static bool up_room(const rconn *c, size_t n)
{
    return c->up_cap - (c->up_off + c->up_len) >= n;
}

static void up_put(rconn *c, const char *b, size_t n)
{
    memcpy(c->up + c->up_off + c->up_len, b, n);
    c->up_len += n;
}

/* Moves what can be checked from `in` to `up`. Stops at a refusal, when `in` holds no whole
 * unit (head, size line, trailer line), or when `up` is full. */
static void parse(srv_relay *r, rconn *c)
{
    size_t pos = 0;
    if (c->up_len == 0)
        c->up_off = 0;
    else if (c->up_off > c->up_cap / 2) {
        memmove(c->up, c->up + c->up_off, c->up_len);
        c->up_off = 0;
    }
    for (;;) {
        const char *b = c->in + pos;
        size_t avail = c->in_len - pos;
        srv_error e;
        if (c->ps == P_STOP)
            break;
        if (c->ps == P_HEAD) {
            if (!avail)
                break;
            srv_head h;
            int st = srv_head_parse(b, avail, r->p.head_limit, r->p.max_fields, &h, &e);
            if (st == 0)
                break;
            if (st < 0) {
                c->method_len = c->target_len = 0;
                if (h.method_len) {
                    copy_bytes(c->method, h.method_len, &c->method_len, h.method, sizeof c->method);
                    copy_bytes(c->target, h.target_len, &c->target_len, h.target, sizeof c->target);
                }
                refuse(c, &e);
                break;
            }
            /* From the request line on: empty lines before it are not the daemon's to see. */
            size_t skip = (size_t)(h.method - b), n = h.len - skip;
            if (!up_room(c, n))
                break;
            up_put(c, h.method, n);
            copy_bytes(c->method, h.method_len, &c->method_len, h.method, sizeof c->method);
            copy_bytes(c->target, h.target_len, &c->target_len, h.target, sizeof c->target);
            pos += h.len;
            if (h.framing.n_chunked) {
                c->ps = P_CSIZE;
            } else if (h.framing.n_length && h.framing.length) {
                c->ps = P_BODY;
                c->remain = h.framing.length;
            } else {
                c->n_good++;
            }
        } else if (c->ps == P_BODY || c->ps == P_CDATA) {
            size_t room = c->up_cap - (c->up_off + c->up_len);
            size_t n = avail < room ? avail : room;
            if (n > c->remain)
                n = (size_t)c->remain;
            if (!n)
                break;
            up_put(c, b, n);
            pos += n;
            c->remain -= n;
            if (!c->remain) {
                if (c->ps == P_BODY) {
                    c->ps = P_HEAD;
                    c->n_good++;
                } else {
                    c->ps = P_CCRLF;
                }
            }
        } else if (c->ps == P_CCRLF) {
            if (avail >= 1 && b[0] != '\r') {
                srv_error_set(&e, 400, NULL, NULL, "chunk data is not followed by CRLF");
                refuse(c, &e);
                break;
            }
            if (avail < 2)
                break;
            if (b[1] != '\n') {
                srv_error_set(&e, 400, NULL, NULL, "chunk data is not followed by CRLF");
                refuse(c, &e);
                break;
            }
            if (!up_room(c, 2))
                break;
            up_put(c, "\r\n", 2);
            pos += 2;
            c->ps = P_CSIZE;
        } else if (c->ps == P_CSIZE) {
            uint64_t size;
            size_t len;
            int st = srv_chunk_line_parse(b, avail, &size, &len, &e);
            if (st == 0)
                break;
            if (st < 0) {
                refuse(c, &e);
                break;
            }
            char line[24];
            int n = size ? snprintf(line, sizeof line, "%" PRIx64 "\r\n", size) : 0;
            if (!up_room(c, (size_t)n))
                break;
            up_put(c, line, (size_t)n);
            pos += len;
            if (size) {
                c->ps = P_CDATA;
                c->remain = size;
            } else {
                c->ps = P_TRAILER;
                c->trailer_bytes = 0;
            }
        } else if (c->ps == P_TRAILER) {
            size_t len;
            bool last;
            size_t limit = r->p.head_limit - c->trailer_bytes;
            int st = srv_trailer_line_parse(b, avail, limit, &len, &last, &e);
            if (st == 0)
                break;
            if (st < 0) {
                refuse(c, &e);
                break;
            }
            if (last) {
                /* Trailer fields are checked and dropped: no route reads one. */
                if (!up_room(c, 5))
                    break;
                up_put(c, "0\r\n\r\n", 5);
                c->ps = P_HEAD;
                c->n_good++;
            }
            c->trailer_bytes += len;
            pos += len;
        }
    }
    if (pos) {
        memmove(c->in, c->in + pos, c->in_len - pos);
        c->in_len -= pos;
    }
}

/* Reads the daemon while `down` has room (its refusal reserve excluded). Returns true when
 * its socket is drained (EAGAIN) or closed, false when `down` filled first. */
static bool read_daemon(rconn *c)
{
    if (c->dmn_eof || c->dmn.fd < 0)
        return true;
    if (c->down_len == 0)
        c->down_off = 0;
    else if (c->down_off > DOWN_CAP / 2) {
        memmove(c->down, c->down + c->down_off, c->down_len);
        c->down_off = 0;
    }
    for (;;) {
        size_t room = DOWN_CAP - (c->down_off + c->down_len);
        if (!room)
            return false;
        ssize_t n = recv(c->dmn.fd, c->down + c->down_off + c->down_len, room, MSG_DONTWAIT);
        if (n > 0) {
            c->down_len += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return true;
        c->dmn_eof = true; /* closed or shut down by the daemon (or the reaper), or an error */
        return true;
    }
}

/* After a refusal: once the daemon finished every request forwarded before it and all it
 * wrote is here, the refusal follows that and the daemon's end closes. */
static void try_refusal(srv_relay *r, rconn *c)
{
    if (!c->refusing || c->refusal_queued)
        return;
    pthread_mutex_lock(&r->mu);
    unsigned done = c->n_done;
    c->waiting = done < c->n_good;
    pthread_mutex_unlock(&r->mu);
    if (done < c->n_good) {
        if (!c->dmn_eof)
            return;
        /* The daemon closed before answering them all (it answers "Connection: close"
         * requests and then closes): the connection ends with what it sent. */
        c->refusal_queued = true;
        return;
    }
    /* The daemon wrote each finished response before reporting it, so reading until EAGAIN
     * after seeing the count gets all of them. */
    if (!read_daemon(c))
        return;
    c->refusal_queued = true;
    /* More than n_good done: the daemon answered the refused request itself already (a
     * response it may queue before a body is whole, such as 401), so that is the last. */
    if (done == c->n_good) {
        if (c->down_len == 0)
            c->down_off = 0;
        size_t n = srv_refusal_format(&c->err, c->down + c->down_off + c->down_len,
                                      DOWN_CAP + REFUSAL_MAX - (c->down_off + c->down_len));
        c->down_len += n;
        r->p.refused(r->p.ud, c->err.status, c->method, c->method_len, c->target, c->target_len,
                     c->err.message);
    }
    close_daemon(r, c);
}

static void update_interest(srv_relay *r, rconn *c)
{
    if (c->dead)
        return;
    uint32_t cw = 0, dw = 0;
    if (c->lingering) {
        cw = EPOLLIN | EPOLLRDHUP;
    } else {
        if (!c->cli_eof) {
            cw |= EPOLLRDHUP;
            if (!c->refusing && c->in_len < c->in_cap)
                cw |= EPOLLIN;
        }
        if (c->down_len)
            cw |= EPOLLOUT;
        if (!c->dmn_eof && !c->dmn_hup) {
            if (c->down_off + c->down_len < DOWN_CAP)
                dw |= EPOLLIN | EPOLLRDHUP;
            if (c->up_len)
                dw |= EPOLLOUT;
        }
    }
    set_interest(r, &c->cli, cw);
    if (c->dmn.fd >= 0) {
        if (c->dmn_hup) {
            /* A hung-up socket reports EPOLLHUP whatever the mask: out of the set, it is read
             * at each step instead, as `down` has room. */
            if (c->dmn.registered) {
                epoll_ctl(r->ep, EPOLL_CTL_DEL, c->dmn.fd, NULL);
                c->dmn.registered = false;
            }
        } else {
            set_interest(r, &c->dmn, dw);
        }
    }
}

/* All progress the sockets allow for c; cev and dev are the events just seen on each side. */
static void step(srv_relay *r, rconn *c, uint32_t cev, uint32_t dev)
{
    if (c->lingering) {
        char sink[4096];
        ssize_t n = recv(c->cli.fd, sink, sizeof sink, MSG_DONTWAIT);
        if (n > 0)
            c->linger_bytes += (size_t)n;
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) ||
            (cev & (EPOLLHUP | EPOLLERR)) || c->linger_bytes > LINGER_BYTES)
            kill_conn(r, c);
        return;
    }
    if (cev & (EPOLLERR | EPOLLHUP)) {
        kill_conn(r, c); /* a reset, or a full close */
        return;
    }
    if (!c->cli_eof && (cev & (EPOLLIN | EPOLLRDHUP)) && !c->refusing) {
        for (;;) {
            size_t room = c->in_cap - c->in_len;
            if (!room)
                break;
            ssize_t n = recv(c->cli.fd, c->in + c->in_len, room, MSG_DONTWAIT);
            if (n > 0) {
                c->in_len += (size_t)n;
                continue;
            }
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                break;
            if (n < 0) {
                kill_conn(r, c);
                return;
            }
            c->cli_eof = true;
            break;
        }
    }
    /* A half-close is how the daemon's reaper tells a client gone (clients do not half-close
     * an HTTP request), so it is one even when the relay cannot read the rest just now. */
    if (cev & EPOLLRDHUP) {
        c->cli_eof = true;
        if (c->refusing && !c->refusal_queued) {
            kill_conn(r, c);
            return;
        }
    }
    parse(r, c);
    parse(r, c); /* `up` may have been compacted: the rest of a big head fits now */
    if (c->up_len && c->dmn.fd >= 0 && !c->up_shut) {
        ssize_t n = send(c->dmn.fd, c->up + c->up_off, c->up_len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            c->up_off += (size_t)n;
            c->up_len -= (size_t)n;
        } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            c->up_len = 0; /* the daemon closed: its reads are over */
        }
        if (c->up_len == 0)
            c->up_off = 0;
        parse(r, c);
    }
    if (c->cli_eof && !c->up_len && !c->up_shut && c->dmn.fd >= 0) {
        shutdown(c->dmn.fd, SHUT_WR);
        c->up_shut = true;
    }
    if (dev & (EPOLLHUP | EPOLLERR))
        c->dmn_hup = true;
    if ((dev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) || c->dmn_hup)
        read_daemon(c);
    try_refusal(r, c);
    if (c->down_len) {
        ssize_t n =
            send(c->cli.fd, c->down + c->down_off, c->down_len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            c->down_off += (size_t)n;
            c->down_len -= (size_t)n;
        } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            kill_conn(r, c);
            return;
        }
        if (c->down_len == 0)
            c->down_off = 0;
        /* Room again: what the daemon still has may fit (a hung-up end is read only here). */
        if (c->dmn_hup || c->refusing)
            read_daemon(c);
        try_refusal(r, c);
    }
    /* A client that half-closed is gone (as the reaper sees it) and may never read again:
     * once the daemon's end is closed too, what it did not take yet is dropped, as the
     * daemon's own close of a TCP socket would. */
    if (c->cli_eof && (c->dmn_eof || c->dmn_hup) && c->down_len) {
        kill_conn(r, c);
        return;
    }
    if (!c->down_len && (c->refusal_queued || (c->dmn_eof && !c->refusing))) {
        finish(r, c);
        return;
    }
    if (c->dmn_eof && c->refusing && !c->refusal_queued)
        try_refusal(r, c);
    /* The daemon no longer counts this connection (nor times it out): a client that does not
     * take what is left gets the daemon's idle timeout for it, then is dropped. */
    if (c->dmn_eof && c->down_len && c->deliver_by == 0 && r->p.timeout_s) {
        c->deliver_by = time_now_s() + r->p.timeout_s;
        r->n_deliver++;
    }
}

static void take_inbox(srv_relay *r)
{
    pthread_mutex_lock(&r->mu);
    rconn *list = r->inbox;
    r->inbox = NULL;
    pthread_mutex_unlock(&r->mu);
    while (list) {
        rconn *c = list;
        list = c->next;
        c->prev = NULL;
        c->next = r->all;
        if (r->all)
            r->all->prev = c;
        r->all = c;
        /* The daemon may have written already (nothing is forwarded yet, but a step costs
         * nothing): start as if both sides were readable. */
        step(r, c, EPOLLIN, EPOLLIN);
        update_interest(r, c);
    }
}

/* True when no connection has anything left to deliver (lingering ones have not). */
static bool all_delivered(srv_relay *r)
{
    for (rconn *c = r->all; c; c = c->next)
        if (!c->lingering)
            return false;
    return true;
}

static void *relay_main(void *arg)
{
    srv_relay *r = arg;
    struct epoll_event evs[EVENTS];
    bool stopping = false;
    double stop_by = 0;
    for (;;) {
        double now = time_now_s();
        int ms = -1;
        if (stopping) {
            if (now >= stop_by || all_delivered(r))
                break;
            ms = (int)((stop_by - now) * 1000.0) + 1;
        }
        if (r->n_linger || r->n_deliver) {
            double next = now + 3600.0;
            for (rconn *c = r->all, *nx; c; c = nx) {
                nx = c->next;
                double until = c->lingering ? c->linger_until : c->deliver_by;
                if (until <= 0)
                    continue;
                if (until <= now) {
                    kill_conn(r, c);
                    continue;
                }
                if (until < next)
                    next = until;
            }
            int lms = (int)((next - now) * 1000.0) + 1;
            if ((r->n_linger || r->n_deliver) && (ms < 0 || lms < ms))
                ms = lms;
        }
        while (r->dead) {
            rconn *c = r->dead;
            r->dead = c->next_dead;
            conn_free(c);
        }
        int n = epoll_wait(r->ep, evs, EVENTS, ms);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            log_error("http: relay epoll_wait failed: %s", strerror(errno));
            break;
        }
        bool woken = false;
        for (int i = 0; i < n; i++) {
            rside *s = evs[i].data.ptr;
            if (!s) {
                woken = true;
                continue;
            }
            rconn *c = s->c;
            if (c->dead)
                continue;
            if (s == &c->cli)
                step(r, c, evs[i].events, 0);
            else
                step(r, c, 0, evs[i].events);
            update_interest(r, c);
        }
        if (woken) {
            uint64_t v;
            while (read(r->wake, &v, sizeof v) < 0 && errno == EINTR) {
            }
            pthread_mutex_lock(&r->mu);
            bool stop = r->stop;
            pthread_mutex_unlock(&r->mu);
            take_inbox(r);
            if (stop && !stopping) {
                /* The daemon's ends are closed now: deliver what they hold, then end. */
                stopping = true;
                stop_by = time_now_s() + STOP_FLUSH_S;
                for (rconn *c = r->all, *nx; c; c = nx) {
                    nx = c->next;
                    if (c->lingering)
                        continue;
                    c->dmn_hup = true;
                    step(r, c, 0, 0);
                    update_interest(r, c);
                }
            }
            /* A done() for a connection waiting to send its refusal. */
            for (rconn *c = r->all, *nx; c; c = nx) {
                nx = c->next;
                if (c->refusing && !c->refusal_queued) {
                    step(r, c, 0, 0);
                    update_interest(r, c);
                }
            }
        }
    }
    return NULL;
}

int srv_relay_start(const srv_relay_params *p, srv_relay **out)
{
    srv_relay *r = calloc(1, sizeof *r);
    if (!r)
        return KVS_ENOMEM;
    r->p = *p;
    r->ep = epoll_create1(EPOLL_CLOEXEC);
    r->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (r->ep < 0 || r->wake < 0 || epoll_ctl(r->ep, EPOLL_CTL_ADD, r->wake, &ev)) {
        if (r->ep >= 0)
            close(r->ep);
        if (r->wake >= 0)
            close(r->wake);
        free(r);
        return KVS_EIO;
    }
    pthread_mutex_init(&r->mu, NULL);
    if (pthread_create(&r->thread, NULL, relay_main, r)) {
        pthread_mutex_destroy(&r->mu);
        close(r->ep);
        close(r->wake);
        free(r);
        return KVS_EIO;
    }
    r->started = true;
    *out = r;
    return 0;
}

int srv_relay_add(srv_relay *r, int fd, const struct sockaddr *addr, socklen_t addr_len)
{
    rconn *c = calloc(1, sizeof *c);
    size_t in_cap = r->p.head_limit > IN_MIN ? r->p.head_limit : IN_MIN;
    int sv[2] = {-1, -1};
    if (c) {
        c->in_cap = in_cap;
        c->up_cap = in_cap + 64; /* a whole head, or a size line more than a body piece */
        c->in = malloc(c->in_cap);
        c->up = malloc(c->up_cap);
        c->down = malloc(DOWN_CAP + REFUSAL_MAX);
    }
    if (!c || !c->in || !c->up || !c->down ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv)) {
        log_warn("http: cannot relay a connection (%s)", strerror(errno));
        conn_free(c);
        close(fd);
        return -1;
    }
    /* libmicrohttpd picks a pool thread by its socket's number modulo the pool size; the two
     * ends of a pair are consecutive numbers and, with three per connection, the same end
     * would land on one thread every time. Alternating ends spreads them again. */
    if (r->n_added++ & 1) {
        int t = sv[0];
        sv[0] = sv[1];
        sv[1] = t;
    }
    /* What the daemon wrote is sent as soon as it arrives, and Nagle must not hold a small
     * send back until the client acknowledges the one before: a client that has just sent a
     * request on a kept-alive connection delays that ACK (about 40 ms on Linux), so a stream's
     * first event, however soon its token was ready, waited for the ACK of the response head.
     * libmicrohttpd set TCP_NODELAY itself on the sockets it owned; its end of the pair takes
     * no TCP option. A client socket that is not TCP refuses it, and needs none. */
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->cli = (rside){.c = c, .fd = fd};
    c->dmn = (rside){.c = c, .fd = sv[0]};
    c->daemon_fd = sv[1];
    pthread_mutex_lock(&r->mu);
    if ((size_t)sv[1] >= r->n_by_fd) {
        size_t n = (size_t)sv[1] * 2 + 64;
        rconn **nb = realloc(r->by_fd, n * sizeof *nb);
        if (nb) {
            memset(nb + r->n_by_fd, 0, (n - r->n_by_fd) * sizeof *nb);
            r->by_fd = nb;
            r->n_by_fd = n;
        }
    }
    bool indexed = (size_t)sv[1] < r->n_by_fd;
    if (indexed)
        r->by_fd[sv[1]] = c; /* a stale entry for a closed fd of that number is replaced */
    pthread_mutex_unlock(&r->mu);
    /* Registered before the daemon has it: its first done() must find this connection. */
    if (!indexed || r->p.handoff(r->p.ud, sv[1], addr, addr_len)) {
        if (!indexed)
            close(sv[1]);
        pthread_mutex_lock(&r->mu);
        if (indexed && r->by_fd[sv[1]] == c)
            r->by_fd[sv[1]] = NULL;
        pthread_mutex_unlock(&r->mu);
        close(sv[0]);
        close(fd);
        conn_free(c);
        return -1;
    }
    pthread_mutex_lock(&r->mu);
    c->next = r->inbox;
    r->inbox = c;
    pthread_mutex_unlock(&r->mu);
    wake_thread(r);
    return 0;
}

void srv_relay_done(srv_relay *r, int daemon_fd)
{
    if (!r || daemon_fd < 0)
        return;
    bool wake = false;
    pthread_mutex_lock(&r->mu);
    rconn *c = (size_t)daemon_fd < r->n_by_fd ? r->by_fd[daemon_fd] : NULL;
    if (c) {
        c->n_done++;
        wake = c->waiting;
    }
    pthread_mutex_unlock(&r->mu);
    if (wake)
        wake_thread(r);
}

void srv_relay_stop(srv_relay *r)
{
    if (!r || !r->started)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_mutex_unlock(&r->mu);
    wake_thread(r);
    pthread_join(r->thread, NULL);
    r->started = false;
    while (r->all)
        kill_conn(r, r->all);
    while (r->dead) {
        rconn *c = r->dead;
        r->dead = c->next_dead;
        conn_free(c);
    }
    pthread_mutex_lock(&r->mu);
    rconn *list = r->inbox;
    r->inbox = NULL;
    for (size_t i = 0; i < r->n_by_fd; i++)
        r->by_fd[i] = NULL;
    pthread_mutex_unlock(&r->mu);
    while (list) {
        rconn *c = list;
        list = c->next;
        close(c->cli.fd);
        close(c->dmn.fd);
        conn_free(c);
    }
}

void srv_relay_destroy(srv_relay *r)
{
    if (!r)
        return;
    srv_relay_stop(r);
    pthread_mutex_destroy(&r->mu);
    close(r->ep);
    close(r->wake);
    free(r->by_fd);
    free(r);
}
