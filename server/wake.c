/* Waiting for events costs nothing: suspend/resume of connections through srv_wake slots, and
 * the reaper that notices clients gone while suspended. The race and lock order are written at
 * the top of http.c. */
#define _GNU_SOURCE /* POLLRDHUP */
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>

#include "server/http_impl.h"

srv_wake *srv__wake_get(srv_server *s, struct MHD_Connection *mc)
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

void srv__wake_put(srv_server *s, srv_wake *w)
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
void srv__on_notify(void *ud)
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
int srv__next_or_suspend(srv_conn *c, sched_event *ev)
{
    srv_wake *w = c->wake;
    pthread_mutex_lock(&w->mu);
    if (w->peer_gone) {
        pthread_mutex_unlock(&w->mu);
        srv__tl_client_gone = true;
        return -2;
    }
    /* Every prompt's request is looked at under w->mu: an event queued after its check
     * notifies through the same slot and finds `suspended` set. */
    bool pending = false;
    for (uint32_t j = 0; j < c->n_reqs; j++) {
        uint32_t k = (c->next_req + j) % c->n_reqs;
        int r = sched_req_next(c->reqs[k], ev);
        if (r == 1) {
            ev->choice += k * c->n_per;
            c->next_req = (k + 1) % c->n_reqs;
            pthread_mutex_unlock(&w->mu);
            return 1;
        }
        pending = pending || r == 0;
    }
    if (pending) {
        w->suspended = true;
        MHD_suspend_connection(c->mc);
    }
    pthread_mutex_unlock(&w->mu);
    return pending ? 0 : -1;
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

void *srv__reaper_main(void *arg)
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
         * (srv__on_connection, which takes sock_mu) before it closes the socket. */
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
void srv__on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
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
void srv__sock_set_wake(srv_server *s, struct MHD_Connection *mc, srv_wake *w)
{
    srv_sock *k = sock_of(mc);
    if (!k)
        return;
    pthread_mutex_lock(&s->sock_mu);
    k->wake = w;
    pthread_mutex_unlock(&s->sock_mu);
}
