/* The front door (see frontdoor.h): accept, enforce the connection limit, peek at each first
 * request head until it is whole, refuse bad ones with JSON, hand good ones to the relay.
 *
 * Why peek rather than read: a connection gets a relay pair and a daemon connection only once
 * its first head passed, and the relay parses every head from the socket's start, this one
 * too, so the head stays in the socket until then. A peek copies at most head_limit bytes
 * per arrival of new data, and the client paid a packet for each. Only this thread touches
 * the pending list, so it needs no lock. */
#define _GNU_SOURCE /* accept4, POLLRDHUP */
#include "server/frontdoor.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "common/status.h"
#include "common/timeutil.h"
#include "server/api.h"
#include "server/http_head.h"
#include "server/relay.h"

/* A refused client gets this long to take its response before the socket closes; closing
 * with its unread request in our receive buffer would send a reset that can destroy the
 * response in flight. At most LINGER_MAX sockets linger; beyond, they close at once. */
#define LINGER_S 1.0
#define LINGER_MAX 256
/* Accepts per wake-up, so a flood of connects cannot starve the heads being read. */
#define ACCEPT_BURST 64

enum pend_mode { PM_HEAD = 0, PM_LINGER };

typedef struct pending {
    int fd;
    enum pend_mode mode;
    double t_last; /* PM_HEAD: when the head last grew; PM_LINGER: when the response went */
    size_t seen;   /* bytes peeked so far */
    struct sockaddr_storage addr;
    socklen_t addr_len;
} pending;

struct srv_frontdoor {
    srv_frontdoor_params p;
    pthread_t thread;
    int wake[2]; /* a byte on wake[1] stops the thread */
    pending *pend;
    size_t n_pend, cap_pend;
    size_t n_heads, n_linger;
    char *buf;                 /* head_limit bytes: where heads are peeked */
    double accept_pause_until; /* out of fds: accepting resumes then */
    srv_relay *relay;          /* where good connections go: lives until srv_frontdoor_destroy */
    bool running;
};

static void drop(srv_frontdoor *f, size_t i)
{
    close(f->pend[i].fd);
    if (f->pend[i].mode == PM_HEAD)
        f->n_heads--;
    else
        f->n_linger--;
    f->pend[i] = f->pend[--f->n_pend];
}

/* Readable unread bytes keep a level-triggered poll firing, so a socket is only reported
 * again once more than what was peeked has arrived (or its peer closed, which poll reports
 * whatever the low-water mark). */
static void set_lowat(int fd, size_t bytes)
{
    int v = bytes > 0x7fffffff ? 0x7fffffff : (int)bytes;
    setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v);
}

/* Sends the JSON error for e with "Connection: close" and starts lingering (or closes). The
 * response is under 1 KiB, so a fresh socket's send buffer always takes it whole. */
static void refuse(srv_frontdoor *f, size_t i, const srv_error *e, const srv_head *h)
{
    pending *q = &f->pend[i];
    char out[1024];
    size_t n = srv_refusal_format(e, out, sizeof out);
    (void)send(q->fd, out, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    shutdown(q->fd, SHUT_WR);
    set_lowat(q->fd, 1);
    f->p.refused(f->p.ud, e->status, h ? h->method : "", h ? h->method_len : 0, h ? h->target : "",
                 h ? h->target_len : 0, e->message);
    if (q->mode == PM_HEAD) {
        f->n_heads--;
        f->n_linger++;
    }
    q->mode = PM_LINGER;
    q->t_last = time_now_s();
    if (f->n_linger > LINGER_MAX) {
        char sink[4096];
        while (recv(q->fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {
        }
        drop(f, i);
    }
}

/* New data (or an end) on a head being read: hand it off, refuse it, drop it, or wait. */
static void on_head(srv_frontdoor *f, size_t i, short revents, double now)
{
    pending *q = &f->pend[i];
    if (revents & (POLLERR | POLLHUP)) {
        drop(f, i); /* reset */
        return;
    }
    ssize_t r = recv(q->fd, f->buf, f->p.head_limit, MSG_PEEK | MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        drop(f, i);
        return;
    }
    if (r < 0 || ((size_t)r == q->seen && !(revents & POLLRDHUP)))
        return;
    q->seen = (size_t)r;
    q->t_last = now;
    srv_head h;
    srv_error e;
    int st = srv_head_parse(f->buf, (size_t)r, f->p.head_limit, f->p.max_fields, &h, &e);
    /* A client that closed or half-closed before its head was whole can get no answer; one
     * that half-closed after a whole head is served (and reaped after, as a gone client). */
    if (st == 0 && (revents & POLLRDHUP)) {
        drop(f, i);
        return;
    }
    if (st == 0) {
        set_lowat(q->fd, q->seen + 1);
        return;
    }
    if (st < 0) {
        refuse(f, i, &e, h.method_len ? &h : NULL);
        return;
    }
    pending moved = *q;
    f->pend[i] = f->pend[--f->n_pend];
    f->n_heads--;
    set_lowat(moved.fd, 1);
    srv_relay_add(f->relay, moved.fd, (struct sockaddr *)&moved.addr, moved.addr_len);
}

static void accept_some(srv_frontdoor *f, double now)
{
    for (int k = 0; k < ACCEPT_BURST; k++) {
        pending q = {0};
        q.addr_len = sizeof q.addr;
        int fd = accept4(f->p.listen_fd, (struct sockaddr *)&q.addr, &q.addr_len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                log_warn("http: cannot accept (%s); pausing 100 ms", strerror(errno));
                f->accept_pause_until = now + 0.1;
            }
            return; /* EAGAIN, or a connection that died in the queue */
        }
        if (f->n_pend == f->cap_pend) {
            size_t cap = f->cap_pend ? f->cap_pend * 2 : 64;
            pending *np = realloc(f->pend, cap * sizeof *np);
            if (!np) {
                close(fd);
                return;
            }
            f->pend = np;
            f->cap_pend = cap;
        }
        q.fd = fd;
        q.mode = PM_HEAD;
        q.t_last = now;
        f->pend[f->n_pend++] = q;
        f->n_heads++;
        if (f->n_heads - 1 + f->p.n_held(f->p.ud) >= f->p.max_connections) {
            srv_error e;
            srv_error_set(&e, 503, NULL, NULL, "too many open connections (--max-connections %u)",
                          f->p.max_connections);
            refuse(f, f->n_pend - 1, &e, NULL);
        }
    }
}

static void *door_main(void *arg)
{
    srv_frontdoor *f = arg;
    struct pollfd *pfd = NULL;
    size_t cap_pfd = 0;
    for (;;) {
        double now = time_now_s();
        /* Expire stalled heads and finished lingers; find the next deadline. */
        double next = now + 1.0;
        for (size_t i = 0; i < f->n_pend;) {
            pending *q = &f->pend[i];
            double until = q->mode == PM_LINGER ? q->t_last + LINGER_S
                           : f->p.timeout_s     ? q->t_last + f->p.timeout_s
                                                : now + 3600.0;
            if (until <= now) {
                drop(f, i);
                continue;
            }
            if (until < next)
                next = until;
            i++;
        }
        bool accepting = now >= f->accept_pause_until;
        if (!accepting && f->accept_pause_until < next)
            next = f->accept_pause_until;
        if (cap_pfd < f->n_pend + 2) {
            size_t cap = (f->n_pend + 2) * 2;
            struct pollfd *np = realloc(pfd, cap * sizeof *np);
            if (!np) {
                struct timespec ts = {0, 10 * 1000 * 1000};
                nanosleep(&ts, NULL);
                continue;
            }
            pfd = np;
            cap_pfd = cap;
        }
        pfd[0] = (struct pollfd){.fd = f->wake[0], .events = POLLIN};
        pfd[1] = (struct pollfd){.fd = accepting ? f->p.listen_fd : -1, .events = POLLIN};
        for (size_t i = 0; i < f->n_pend; i++)
            pfd[i + 2] = (struct pollfd){
                .fd = f->pend[i].fd,
                .events = (short)(POLLIN | (f->pend[i].mode == PM_HEAD ? POLLRDHUP : 0))};
        size_t n_polled = f->n_pend;
        int ms = (int)((next - now) * 1000.0) + 1;
        int rc = poll(pfd, n_polled + 2, ms);
        if (rc < 0) {
            if (errno == EINTR)
                continue;
            log_error("http: front door poll failed: %s", strerror(errno));
            break;
        }
        if (pfd[0].revents)
            break;
        now = time_now_s();
        /* Handle the polled sockets by fd: slots move as others are removed. */
        for (size_t k = 0; k < n_polled; k++) {
            short ev = pfd[k + 2].revents;
            if (!ev)
                continue;
            size_t i = 0;
            while (i < f->n_pend && f->pend[i].fd != pfd[k + 2].fd)
                i++;
            if (i == f->n_pend)
                continue;
            if (f->pend[i].mode == PM_HEAD) {
                on_head(f, i, ev, now);
            } else {
                char sink[4096];
                ssize_t r = recv(f->pend[i].fd, sink, sizeof sink, MSG_DONTWAIT);
                if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
                    drop(f, i);
            }
        }
        if (pfd[1].revents)
            accept_some(f, now);
    }
    free(pfd);
    return NULL;
}

int srv_frontdoor_start(const srv_frontdoor_params *p, srv_frontdoor **out)
{
    srv_frontdoor *f = calloc(1, sizeof *f);
    if (!f)
        return KVS_ENOMEM;
    f->p = *p;
    f->buf = malloc(p->head_limit ? p->head_limit : 1);
    if (!f->buf) {
        free(f);
        return KVS_ENOMEM;
    }
    srv_relay_params rp = {.head_limit = p->head_limit,
                           .max_fields = p->max_fields,
                           .timeout_s = p->timeout_s,
                           .handoff = p->handoff,
                           .refused = p->refused,
                           .ud = p->ud};
    int rc = srv_relay_start(&rp, &f->relay);
    if (rc) {
        free(f->buf);
        free(f);
        return rc;
    }
    if (pipe2(f->wake, O_CLOEXEC | O_NONBLOCK)) {
        srv_relay_destroy(f->relay);
        free(f->buf);
        free(f);
        return KVS_EIO;
    }
    /* *out is what the daemon's threads pass to srv_frontdoor_done: set before the first
     * connection can exist. */
    *out = f;
    if (pthread_create(&f->thread, NULL, door_main, f)) {
        *out = NULL;
        srv_relay_destroy(f->relay);
        close(f->wake[0]);
        close(f->wake[1]);
        free(f->buf);
        free(f);
        return KVS_EIO;
    }
    f->running = true;
    return 0;
}

void srv_frontdoor_stop(srv_frontdoor *f)
{
    if (!f || !f->running)
        return;
    char b = 1;
    while (write(f->wake[1], &b, 1) < 0 && errno == EINTR) {
    }
    pthread_join(f->thread, NULL);
    f->running = false;
    while (f->n_pend)
        drop(f, f->n_pend - 1);
}

void srv_frontdoor_done(srv_frontdoor *f, int daemon_fd)
{
    if (f)
        srv_relay_done(f->relay, daemon_fd);
}

void srv_frontdoor_destroy(srv_frontdoor *f)
{
    if (!f)
        return;
    srv_frontdoor_stop(f);
    srv_relay_destroy(f->relay);
    close(f->wake[0]);
    close(f->wake[1]);
    free(f->pend);
    free(f->buf);
    free(f);
}
