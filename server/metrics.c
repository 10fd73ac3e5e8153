/* Prometheus text output. Histograms come from the scheduler per bucket and are summed here
 * into the cumulative counts Prometheus expects. */
#include "server/metrics.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const int srv_status_codes[SRV_N_STATUS] = {200, 400, 401, 404, 405, 413, 429, 500, 503, 499, 0};

int srv_status_index(int status)
{
    for (int i = 0; i < SRV_N_STATUS - 1; i++)
        if (srv_status_codes[i] == status)
            return i;
    return SRV_N_STATUS - 1;
}

typedef struct obuf {
    char *p;
    size_t len, cap;
    bool oom;
} obuf;

static void ob_printf(obuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void ob_printf(obuf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if (b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n + 1;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
}

/* Writes v with the fewest significant digits that read back as the same double, so bucket
 * bounds print as le="0.005" rather than le="0.0050000000000000001" (both parse to the same
 * value; the short form is what people grep for and what other exporters print). */
static void ob_double(obuf *b, double v)
{
    char s[40];
    if (isnan(v) || isinf(v)) { /* the exposition format's spellings */
        ob_printf(b, "%s", isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf");
        return;
    }
    if (v > -1e15 && v < 1e15 && v == (double)(long long)v) { /* range first: NaN, inf */
        /* Whole numbers (gauges, counts, batch-size bounds) without %g's 1e+02. */
        ob_printf(b, "%lld", (long long)v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(s, sizeof s, "%.*g", prec, v);
        if (strtod(s, NULL) == v)
            break;
    }
    ob_printf(b, "%s", s);
}

static void head(obuf *b, const char *name, const char *type, const char *help)
{
    ob_printf(b, "# HELP kvserve_%s %s\n# TYPE kvserve_%s %s\n", name, help, name, type);
}

static void gauge(obuf *b, const char *name, const char *help, double v)
{
    head(b, name, "gauge", help);
    ob_printf(b, "kvserve_%s ", name);
    ob_double(b, v);
    ob_printf(b, "\n");
}

static void counter(obuf *b, const char *name, const char *help, uint64_t v)
{
    head(b, name, "counter", help);
    ob_printf(b, "kvserve_%s %llu\n", name, (unsigned long long)v);
}

static void hist(obuf *b, const char *name, const char *help, const sched_hist *h)
{
    head(b, name, "histogram", help);
    uint64_t cum = 0;
    int nb = h->n_bounds < 0                    ? 0
             : h->n_bounds > SCHED_HIST_BUCKETS ? SCHED_HIST_BUCKETS
                                                : h->n_bounds;
    for (int i = 0; i < nb; i++) {
        cum += h->counts[i];
        ob_printf(b, "kvserve_%s_bucket{le=\"", name);
        ob_double(b, h->bounds[i]);
        ob_printf(b, "\"} %llu\n", (unsigned long long)cum);
    }
    /* The +Inf bucket equals _count by definition, whatever the per-bucket tail says. */
    ob_printf(b, "kvserve_%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)h->count);
    ob_printf(b, "kvserve_%s_sum ", name);
    ob_double(b, h->sum);
    ob_printf(b, "\n");
    ob_printf(b, "kvserve_%s_count %llu\n", name, (unsigned long long)h->count);
}

char *srv_metrics_format(const sched_metrics *m, const uint64_t requests[SRV_N_STATUS],
                         const char *kernels)
{
    obuf b = {malloc(4096), 0, 4096, false};
    if (!b.p)
        return NULL;
    b.p[0] = '\0';
    if (kernels) {
        head(&b, "build_info", "gauge",
             "Always 1; the labels name the version and the kernel table the engine runs "
             "(chosen at start from CPUID, or by --kernels).");
        ob_printf(&b, "kvserve_build_info{version=\"%s\",kernels=\"%s\"} 1\n", KVS_VERSION,
                  kernels);
    }
    head(&b, "requests_total", "counter", "HTTP requests answered, by status code.");
    for (int i = 0; i < SRV_N_STATUS; i++) {
        if (srv_status_codes[i])
            ob_printf(&b, "kvserve_requests_total{status=\"%d\"} %llu\n", srv_status_codes[i],
                      (unsigned long long)requests[i]);
        else
            ob_printf(&b, "kvserve_requests_total{status=\"other\"} %llu\n",
                      (unsigned long long)requests[i]);
    }
    if (m) {
        gauge(&b, "num_requests_running", "Sequences currently in the running batch.",
              m->num_requests_running);
        gauge(&b, "num_requests_waiting", "Requests waiting for admission.",
              m->num_requests_waiting);
        /* Not kv_blocks_total: promtool rejects a _total suffix on anything but a counter. */
        gauge(&b, "kv_blocks_capacity",
              "KV cache blocks in the pool (the global layers' group when split).",
              m->kv_blocks_total);
        gauge(&b, "kv_blocks_used", "KV cache blocks held by sequences.", m->kv_blocks_used);
        gauge(&b, "kv_blocks_cached", "Free KV cache blocks still findable by prefix hash.",
              m->kv_blocks_cached);
        gauge(&b, "kv_window_blocks_capacity",
              "Blocks of the sliding-window layers' own group (0: one group for all layers).",
              m->kv_window_blocks_total);
        gauge(&b, "kv_window_blocks_used", "Windowed-group blocks held by sequences.",
              m->kv_window_blocks_used);
        gauge(&b, "kv_window_blocks_cached", "Free windowed-group blocks findable by prefix.",
              m->kv_window_blocks_cached);
        gauge(&b, "kv_bytes_capacity", "K/V bytes of every group's blocks.",
              (double)m->kv_bytes_capacity);
        gauge(&b, "kv_bytes_used", "K/V bytes of the blocks sequences hold, every group.",
              (double)m->kv_bytes_used);
        gauge(&b, "kv_cache_usage_ratio", "Fraction of KV cache blocks in use (0..1).",
              m->kv_cache_usage_ratio);
        counter(&b, "prompt_tokens_total", "Prompt tokens processed.", m->prompt_tokens_total);
        counter(&b, "generation_tokens_total", "Tokens generated.", m->generation_tokens_total);
        counter(&b, "prefix_cache_queries_total", "Prompt blocks looked up in the prefix cache.",
                m->prefix_cache_queries_total);
        counter(&b, "prefix_cache_hits_total", "Prompt blocks found in the prefix cache.",
                m->prefix_cache_hits_total);
        counter(&b, "preemptions_total", "Sequences preempted because the pool ran dry.",
                m->preemptions_total);
        counter(&b, "steps_total", "Engine steps run.", m->steps_total);
        counter(&b, "multi_seq_steps_total", "Engine steps that carried more than one sequence.",
                m->multi_seq_steps_total);
        hist(&b, "time_to_first_token_seconds", "Time from arrival to the first token.",
             &m->time_to_first_token_seconds);
        hist(&b, "inter_token_latency_seconds", "Time between consecutive tokens of a sequence.",
             &m->inter_token_latency_seconds);
        hist(&b, "e2e_request_latency_seconds", "Time from arrival to the last token.",
             &m->e2e_request_latency_seconds);
        hist(&b, "batch_size", "Sequences per engine step.", &m->batch_size);
    }
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
