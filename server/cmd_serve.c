/* kvserve serve: configuration, model load, scheduler, HTTP daemon, and the shutdown sequence
 * SIGINT/SIGTERM -> drain (503 for new requests) -> wait for in-flight requests up to
 * --shutdown-timeout -> abort the rest (their streams get an error event) -> stop -> exit 0.
 * Signals are blocked in every thread and taken synchronously with sigwait on the main thread,
 * so no code runs in signal context. */
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/status.h"
#include "common/timeutil.h"
#include "engine/model.h"
#include "scheduler/scheduler.h"
#include "server/chat_template.h"
#include "server/commands.h"
#include "server/config.h"
#include "server/http.h"

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int parse_level(const char *s, enum log_level *out)
{
    static const char *names[] = {"debug", "info", "warn", "error", "off"};
    for (int i = 0; i < 5; i++)
        if (!strcmp(s, names[i])) {
            *out = (enum log_level)i;
            return 0;
        }
    return -1;
}

/* Waits (polling the counters only during shutdown) until no generation request is in
 * flight or the deadline passes. */
static bool wait_idle(srv_server *srv, double deadline)
{
    while (srv_n_active(srv) > 0) {
        if (time_now_s() >= deadline)
            return false;
        sleep_ms(20);
    }
    return true;
}

int cmd_serve(int argc, char **argv)
{
    srv_config cfg;
    srv_config_defaults(&cfg);
    char err[512] = "";
    int exit_code = 1;
    engine_model *model = NULL;
    sched *sc = NULL;
    srv_chat_fmt chat = {.tmpl = SRV_CHAT_PLAIN};
    srv_server *srv = NULL;

    if (srv_config_parse(&cfg, argc, argv, err, sizeof err)) {
        fprintf(stderr, "kvserve serve: %s\n", err);
        srv_config_free(&cfg);
        return 2;
    }
    if (cfg.help) {
        srv_config_usage(stdout);
        srv_config_free(&cfg);
        return 0;
    }
    enum log_level lvl;
    if (parse_level(cfg.log_level ? cfg.log_level : "info", &lvl)) {
        fprintf(stderr, "kvserve serve: invalid --log-level '%s' (debug|info|warn|error)\n",
                cfg.log_level);
        srv_config_free(&cfg);
        return 2;
    }
    log_set_level(lvl);
    int forced_tmpl = -1;
    if (cfg.chat_template && (forced_tmpl = srv_chat_from_name(cfg.chat_template)) < 0) {
        fprintf(stderr,
                "kvserve serve: unknown --chat-template '%s' "
                "(chatml|qwen3|llama2|llama3|llama3.1|llama3.2|zephyr|mistral|gemma|phi3|harmony|"
                "granite|granite3.0|granite3.2|granite3.3|granite4.0|ernie4.5|lfm2|lfm2.5|lfm2.5-"
                "8b|olmo2|mistral3|mistral3-think|plain)\n",
                cfg.chat_template);
        srv_config_free(&cfg);
        return 2;
    }
    int kv_type = engine_kv_type_parse(cfg.kv_cache_type ? cfg.kv_cache_type : "f16");
    if (kv_type < 0) {
        fprintf(stderr, "kvserve serve: invalid --kv-cache-type '%s' (f16|f32)\n",
                cfg.kv_cache_type);
        srv_config_free(&cfg);
        return 2;
    }
    if (cfg.pooling && strcmp(cfg.pooling, "auto") && strcmp(cfg.pooling, "mean") &&
        strcmp(cfg.pooling, "cls") && strcmp(cfg.pooling, "last")) {
        fprintf(stderr, "kvserve serve: unknown --pooling '%s' (auto|mean|cls|last)\n",
                cfg.pooling);
        srv_config_free(&cfg);
        return 2;
    }
    if (cfg.reasoning_format && strcmp(cfg.reasoning_format, "auto") &&
        strcmp(cfg.reasoning_format, "none")) {
        fprintf(stderr, "kvserve serve: unknown --reasoning-format '%s' (auto|none)\n",
                cfg.reasoning_format);
        srv_config_free(&cfg);
        return 2;
    }
    /* A table this CPU cannot run (or this build lacks) fails here, before anything starts. */
    if (engine_kernels_check(cfg.kernels, err, sizeof err) ||
        engine_activations_check(cfg.activations, err, sizeof err)) {
        fprintf(stderr, "kvserve serve: %s\n", err);
        srv_config_free(&cfg);
        return 2;
    }
    if (!cfg.model) {
        fprintf(stderr, "kvserve serve: no model given (-m MODEL.gguf; see --help)\n");
        srv_config_free(&cfg);
        return 2;
    }
    if (access(cfg.model, R_OK) != 0) {
        fprintf(stderr, "kvserve serve: cannot read model %s: %s\n", cfg.model, strerror(errno));
        srv_config_free(&cfg);
        return 1;
    }
    if (cfg.block_size == 0 || cfg.max_num_seqs == 0 || cfg.max_batched_tokens == 0 ||
        cfg.max_body_bytes == 0 || cfg.max_response_mb == 0 || cfg.max_connections == 0 ||
        cfg.connection_memory_kb < 4 || cfg.connection_memory_kb > 1024 * 1024) {
        fprintf(stderr, "kvserve serve: --block-size, --max-num-seqs, --max-batched-tokens, "
                        "--max-body-bytes and --max-connections must be positive; "
                        "--connection-memory-kb must be 4..1048576\n");
        srv_config_free(&cfg);
        return 2;
    }

    /* Buffers of 1 MiB and more (response bodies, their copies) are mapped and unmapped on
     * their own. glibc's default raises this threshold to the size of each mapped block
     * freed, after which every later response of that size lives in a heap arena that
     * fragments and is never given back. */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);

    /* Block the signals before any thread starts so every thread inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* Listen first, so a port in use fails fast and /health says 503 while loading. */
    if (srv_start(&cfg, &srv, err, sizeof err)) {
        fprintf(stderr, "kvserve serve: %s\n", err);
        goto out;
    }
    log_info("listening on http://%s:%u", cfg.host, (unsigned)srv_port(srv));

    engine_load_params lp = {
        .verbose = true, .kernels = cfg.kernels, .activations = cfg.activations};
    if (engine_model_load(cfg.model, &lp, &model, err, sizeof err)) {
        fprintf(stderr, "kvserve serve: cannot load %s: %s\n", cfg.model, err);
        goto out;
    }
    sched_params sp = sched_default_params();
    sp.max_num_seqs = cfg.max_num_seqs;
    sp.max_queue = cfg.max_queue;
    sp.max_batched_tokens = cfg.max_batched_tokens;
    sp.kv_cache_mb = cfg.kv_cache_mb;
    sp.kv_type = (engine_kv_type)kv_type;
    sp.block_size = cfg.block_size;
    sp.prefix_cache = !cfg.no_prefix_cache;
    sp.window_reclaim = !cfg.no_window_reclaim;
    if (cfg.threads)
        sp.n_threads = cfg.threads;
    sp.n_ctx = cfg.ctx_size;
    /* Fault injection for the end-to-end tests of the 500 path; never set in production. */
    const char *fail = getenv("KVSERVE_TEST_FAIL_STEP");
    if (fail && *fail)
        sp.fail_step = strtoull(fail, NULL, 10);
    int rc = sched_create(&sp, model, &sc);
    if (rc) {
        fprintf(stderr, "kvserve serve: cannot start the scheduler: %s\n", status_str(rc));
        goto out;
    }
    uint32_t n_ctx = sched_n_ctx(sc); /* --ctx-size, the model's, or what fits (--kv-cache-mb 0) */
    /* A family named by --chat-template is rendered in its plain form: what else the model's
     * own template writes (a default system turn) is detection's, not the override's. */
    if (forced_tmpl >= 0)
        chat.tmpl = (enum srv_chat_tmpl)forced_tmpl;
    else if (srv_chat_fmt_detect(engine_model_chat_template(model), &chat)) {
        fprintf(stderr, "kvserve serve: out of memory\n");
        goto out;
    }
    const tok_vocab *vocab = engine_model_vocab(model);
    int32_t eos = tok_eos(vocab);
    if (srv_chat_fmt_set_eos(&chat, eos >= 0 ? tok_token_text(vocab, eos) : NULL)) {
        fprintf(stderr, "kvserve serve: out of memory\n");
        goto out;
    }
    const char *name = cfg.served_model_name ? cfg.served_model_name : engine_model_name(model);
    srv_set_ready(srv, model, sc, name, &chat, n_ctx);
    log_info("serving model '%s' (context %u, chat template %s%s) on http://%s:%u", name, n_ctx,
             srv_chat_name(chat.tmpl), chat.default_system ? ", with its default system turn" : "",
             cfg.host, (unsigned)srv_port(srv));

    int sig = 0;
    while (sigwait(&sigs, &sig) != 0) {
    }
    log_info("received %s: draining (up to %.0f s for %u requests in flight)",
             sig == SIGINT ? "SIGINT" : "SIGTERM", cfg.shutdown_timeout, srv_n_active(srv));
    srv_begin_drain(srv);
    sched_drain(sc);
    if (!wait_idle(srv, time_now_s() + cfg.shutdown_timeout)) {
        log_warn("shutdown timeout: aborting %u requests", srv_n_active(srv));
        sched_abort_all(sc);
        /* Aborted streams still have to write their error event. */
        wait_idle(srv, time_now_s() + 2.0);
    }
    exit_code = 0;
out:
    srv_stop(srv);     /* releases requests still held: needs the scheduler alive */
    sched_destroy(sc); /* no notify after this */
    srv_destroy(srv);
    engine_model_destroy(model);
    srv_chat_fmt_free(&chat);
    if (exit_code == 0)
        log_info("stopped");
    srv_config_free(&cfg);
    return exit_code;
}
