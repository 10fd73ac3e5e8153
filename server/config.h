/* kvserve serve configuration: defaults, a JSON config file (--config) and command-line flags,
 * applied in that order (flags override the file). Pure parsing: no I/O besides reading the
 * config file, no exit; errors come back as a status and one line in err. */
#ifndef KVS_SERVER_CONFIG_H
#define KVS_SERVER_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct srv_config {
    char *model;                   /* -m/--model: GGUF path (required) */
    char *host;                    /* --host: listen address (127.0.0.1) */
    uint32_t port;                 /* --port: 0 = ephemeral, the bound port is logged (8080) */
    uint32_t threads;              /* --threads: engine compute threads, 0 = all cores */
    uint32_t kv_cache_mb;          /* --kv-cache-mb (256) */
    char *kv_cache_type;           /* --kv-cache-type f16|f32 (f16) */
    char *kernels;                 /* --kernels auto|avx2|generic: NULL = auto (CPUID) */
    char *activations;             /* --activations q8|f32 (q8) */
    uint32_t block_size;           /* --block-size (16) */
    uint32_t max_num_seqs;         /* --max-num-seqs (64) */
    uint32_t max_batched_tokens;   /* --max-batched-tokens (512) */
    uint32_t max_queue;            /* --max-queue (256) */
    uint32_t ctx_size;             /* --ctx-size: 0 = the model's */
    char *served_model_name;       /* --served-model-name: NULL = the model's name */
    char *api_key;                 /* --api-key: NULL = no auth */
    uint64_t max_body_bytes;       /* --max-body-bytes (1 MiB) */
    uint32_t max_response_mb;      /* --max-response-mb: bound of a response's size (32) */
    double shutdown_timeout;       /* --shutdown-timeout seconds (30) */
    char *chat_template;           /* --chat-template NAME: NULL = detect from the model */
    char *reasoning_format;        /* --reasoning-format auto|none (auto) */
    char *pooling;                 /* --pooling auto|mean|cls|last (auto) */
    bool no_prefix_cache;          /* --no-prefix-cache */
    bool no_window_reclaim;        /* --no-window-reclaim */
    bool no_webui;                 /* --no-webui: no page at / */
    char *log_level;               /* --log-level debug|info|warn|error (info) */
    uint32_t http_threads;         /* --http-threads: libmicrohttpd polling threads (2) */
    uint32_t connection_timeout;   /* --connection-timeout: idle seconds, 0 = never (60) */
    uint32_t max_connections;      /* --max-connections: open connections at most (1024) */
    uint32_t connection_memory_kb; /* --connection-memory-kb: MHD per-connection pool (32) */
    char *cors_origins;            /* --cors-origin ORIGIN, repeatable: the origins browsers may
                                      call from, one per line ("*" = any); NULL = CORS off */
    bool help;                     /* --help was given */
} srv_config;

/* Fills c with the defaults (strings are heap copies or NULL). */
void srv_config_defaults(srv_config *c);
/* Parses argv (argv[0] is the subcommand name). --config FILE is read first, wherever it
 * appears, then every other flag overrides it. Returns 0, or KVS_EINVAL with one line in err
 * (unknown flag or key, bad value, unreadable file). */
int srv_config_parse(srv_config *c, int argc, char **argv, char *err, size_t err_len);
/* Applies one JSON config document (keys as long flags, dashes or underscores). */
int srv_config_apply_json(srv_config *c, const char *json, char *err, size_t err_len);
/* Writes the --help text (every flag with its default). */
void srv_config_usage(FILE *out);
void srv_config_free(srv_config *c);

#endif
