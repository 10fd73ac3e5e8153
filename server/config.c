/* Configuration parsing. One table describes every setting (flag name, type, field, default
 * text, help), so --help, the JSON file and the flags can never disagree. */
#include "server/config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/status.h"

enum opt_type { OPT_STR, OPT_U32, OPT_U64, OPT_DBL, OPT_FLAG, OPT_LIST };

typedef struct opt {
    const char *name; /* long flag without "--" */
    char short_name;  /* 0 = none */
    enum opt_type type;
    size_t off;         /* offsetof(srv_config, field) */
    const char *defval; /* shown by --help and written to configs/default.json */
    const char *help;
} opt;

#define OFF(f) offsetof(srv_config, f)
static const opt k_opts[] = {
    {"model", 'm', OPT_STR, OFF(model), "", "GGUF model file (required)"},
    {"host", 0, OPT_STR, OFF(host), "127.0.0.1", "address to listen on"},
    {"port", 0, OPT_U32, OFF(port), "8080", "TCP port (0 = any free port, logged at start)"},
    {"threads", 0, OPT_U32, OFF(threads), "0", "engine compute threads (0 = all cores)"},
    {"kv-cache-mb", 0, OPT_U32, OFF(kv_cache_mb), "0",
     "KV cache pool size in MiB (0 = one whole context of the model and at least 256 MiB, in "
     "the memory left less a quarter of it, at most 1 GiB: a model's context too long for it "
     "is shortened, not below 4096 tokens; a model with sliding-window layers: the windowed "
     "layers' group takes what its sequences' windows can hold, the global layers the rest)"},
    {"kv-cache-type", 0, OPT_STR, OFF(kv_cache_type), "f16",
     "f16|f32: what cached keys and values are stored as"},
    {"kernels", 0, OPT_STR, OFF(kernels), "auto",
     "auto|avx512|avx2|generic: the engine's kernels (auto: the best this CPU runs; every "
     "choice gives the same results)"},
    {"activations", 0, OPT_STR, OFF(activations), "q8",
     "q8|f32: q8 quantizes each row of activations to int8 blocks for the weight types with an "
     "integer kernel (Q8_0, Q4_0 .. Q5_1, Q2_K .. Q6_K: faster, logits within a stated tolerance "
     "of "
     "f32); "
     "f32 multiplies every weight exactly as F32"},
    {"block-size", 0, OPT_U32, OFF(block_size), "16", "tokens per KV cache block"},
    {"max-num-seqs", 0, OPT_U32, OFF(max_num_seqs), "64", "sequences running at once"},
    {"max-batched-tokens", 0, OPT_U32, OFF(max_batched_tokens), "512", "tokens per engine step"},
    {"max-queue", 0, OPT_U32, OFF(max_queue), "256", "waiting requests before 429"},
    {"ctx-size", 0, OPT_U32, OFF(ctx_size), "0", "context length (0 = the model's)"},
    {"served-model-name", 0, OPT_STR, OFF(served_model_name), "",
     "model id in the API (default: the model file's name without .gguf)"},
    {"api-key", 0, OPT_STR, OFF(api_key), "",
     "require 'Authorization: Bearer KEY' (empty = no auth; /health stays open)"},
    {"max-body-bytes", 0, OPT_U64, OFF(max_body_bytes), "1048576",
     "largest request body accepted (larger: 413)"},
    {"max-response-mb", 0, OPT_U32, OFF(max_response_mb), "32",
     "largest response a request may make, MiB, estimated before it runs from n x max_tokens "
     "x logprobs (larger: 400)"},
    {"shutdown-timeout", 0, OPT_DBL, OFF(shutdown_timeout), "30",
     "seconds to let in-flight requests finish after SIGINT/SIGTERM"},
    {"chat-template", 0, OPT_STR, OFF(chat_template), "",
     "chatml|qwen3|llama2|llama3|llama3.1|llama3.2|zephyr|mistral|gemma|phi3|harmony|granite|"
     "granite3.0|granite3.2|granite3.3|granite4.0|ernie4.5|lfm2|lfm2.5|lfm2.5-8b|olmo2|mistral3|"
     "mistral3-think|plain "
     "(default: "
     "detect from the model)"},
    {"reasoning-format", 0, OPT_STR, OFF(reasoning_format), "auto",
     "auto|none: with a thinking chat template (Qwen 3, SmolLM3, Granite 3.2/3.3, LFM2.5, "
     "Ministral 3 Reasoning and Magistral's [THINK]), auto returns the <think> block as "
     "reasoning_content beside content; none leaves it in content"},
    {"pooling", 0, OPT_STR, OFF(pooling), "auto",
     "auto|mean|cls|last: how /v1/embeddings pools an input's hidden states (auto: the file's "
     "<arch>.pooling_type, else last, as vLLM pools a decoder-only model)"},
    {"no-prefix-cache", 0, OPT_FLAG, OFF(no_prefix_cache), "false",
     "do not reuse cached prompt blocks"},
    {"no-window-reclaim", 0, OPT_FLAG, OFF(no_window_reclaim), "false",
     "keep every layer's K/V for the whole context, sliding-window layers included (one "
     "block pool for all layers)"},
    {"no-webui", 0, OPT_FLAG, OFF(no_webui), "false",
     "do not serve the web page (chat and the live KV cache) at /"},
    {"log-level", 0, OPT_STR, OFF(log_level), "info", "debug|info|warn|error"},
    {"http-threads", 0, OPT_U32, OFF(http_threads), "2", "HTTP polling threads"},
    /* Per-connection bounds. The inactivity timeout closes idle and stalled connections
     * (slowloris headers, a client that stopped reading); connections waiting for generation
     * are suspended and never time out. */
    {"connection-timeout", 0, OPT_U32, OFF(connection_timeout), "60",
     "seconds without any I/O before a connection is closed (0 = never)"},
    {"max-connections", 0, OPT_U32, OFF(max_connections), "1024",
     "open HTTP connections at most (more are refused at accept)"},
    {"connection-memory-kb", 0, OPT_U32, OFF(connection_memory_kb), "32",
     "per-connection buffer for request line, headers and reads, KiB (larger headers: 431)"},
    {"cors-origin", 0, OPT_LIST, OFF(cors_origins), "",
     "repeatable: an origin (scheme://host[:port]) browsers may call the API from, or * for "
     "any; answers preflight OPTIONS (default: CORS off)"},
};
#define N_OPTS (sizeof k_opts / sizeof k_opts[0])

static int set_str(char **dst, const char *v)
{
    char *s = NULL;
    if (v && *v) {
        s = strdup(v);
        if (!s)
            return KVS_ENOMEM;
    }
    free(*dst);
    *dst = s;
    return 0;
}

/* A CORS origin as browsers send it: "*", or http(s)://host[:port] (no path, no spaces). */
static bool valid_origin(const char *v)
{
    if (!strcmp(v, "*"))
        return true;
    const char *h = !strncmp(v, "http://", 7) ? v + 7 : !strncmp(v, "https://", 8) ? v + 8 : NULL;
    if (!h || !*h)
        return false;
    for (; *h; h++)
        if (!((*h >= 'a' && *h <= 'z') || (*h >= 'A' && *h <= 'Z') || (*h >= '0' && *h <= '9') ||
              strchr(".-:[]", *h)))
            return false;
    return true;
}

/* Applies text value v to option o; 0 or KVS_EINVAL with err set. */
static int opt_set(srv_config *c, const opt *o, const char *v, char *err, size_t err_len)
{
    void *field = (char *)c + o->off;
    char *end = NULL;
    errno = 0;
    switch (o->type) {
    case OPT_STR: return set_str((char **)field, v);
    case OPT_LIST: {
        char **list = (char **)field;
        if (!*v) { /* the default (and "" in a file): none */
            free(*list);
            *list = NULL;
            return 0;
        }
        if (!valid_origin(v))
            goto bad;
        size_t old = *list ? strlen(*list) : 0, n = strlen(v);
        char *s = realloc(*list, old + n + 2);
        if (!s)
            return KVS_ENOMEM;
        if (old)
            s[old++] = '\n';
        memcpy(s + old, v, n + 1);
        *list = s;
        return 0;
    }
    case OPT_U32:
    case OPT_U64: {
        if (!*v || *v == '-')
            goto bad;
        unsigned long long x = strtoull(v, &end, 10);
        if (errno || *end || (o->type == OPT_U32 && x > UINT32_MAX))
            goto bad;
        if (o->type == OPT_U32)
            *(uint32_t *)field = (uint32_t)x;
        else
            *(uint64_t *)field = x;
        return 0;
    }
    case OPT_DBL: {
        double x = strtod(v, &end);
        if (!*v || errno || *end || !(x >= 0))
            goto bad;
        *(double *)field = x;
        return 0;
    }
    case OPT_FLAG:
        if (!strcmp(v, "true") || !strcmp(v, "1"))
            *(bool *)field = true;
        else if (!strcmp(v, "false") || !strcmp(v, "0"))
            *(bool *)field = false;
        else
            goto bad;
        return 0;
    }
bad:
    snprintf(err, err_len, "invalid value '%s' for --%s", v, o->name);
    return KVS_EINVAL;
}

void srv_config_defaults(srv_config *c)
{
    memset(c, 0, sizeof *c);
    char err[64];
    for (size_t i = 0; i < N_OPTS; i++)
        opt_set(c, &k_opts[i], k_opts[i].defval, err, sizeof err);
}

void srv_config_free(srv_config *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < N_OPTS; i++)
        if (k_opts[i].type == OPT_STR || k_opts[i].type == OPT_LIST) {
            char **p = (char **)((char *)c + k_opts[i].off);
            free(*p);
            *p = NULL;
        }
}

/* Finds an option by key, treating '_' and '-' alike. */
static const opt *opt_find(const char *key, size_t len)
{
    for (size_t i = 0; i < N_OPTS; i++) {
        const char *n = k_opts[i].name;
        if (strlen(n) != len)
            continue;
        size_t j = 0;
        for (; j < len; j++) {
            char a = key[j] == '_' ? '-' : key[j];
            if (a != n[j])
                break;
        }
        if (j == len)
            return &k_opts[i];
    }
    return NULL;
}

int srv_config_apply_json(srv_config *c, const char *json, char *err, size_t err_len)
{
    cJSON *root = cJSON_Parse(json);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        snprintf(err, err_len, "config file is not a JSON object");
        return KVS_EINVAL;
    }
    int rc = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, root)
    {
        const opt *o = opt_find(it->string, strlen(it->string));
        if (!o || !strcmp(o->name, "config")) {
            snprintf(err, err_len, "config file: unknown key \"%s\"", it->string);
            rc = KVS_EINVAL;
            break;
        }
        char buf[64];
        const char *v = NULL;
        if (o->type == OPT_LIST && (cJSON_IsArray(it) || cJSON_IsString(it) || cJSON_IsNull(it))) {
            /* a string or an array of strings: replaces what the defaults held */
            opt_set(c, o, "", err, err_len);
            const cJSON *e = cJSON_IsArray(it) ? it->child : it;
            for (; e && !rc; e = cJSON_IsArray(it) ? e->next : NULL) {
                if (cJSON_IsNull(e))
                    break;
                if (!cJSON_IsString(e)) {
                    snprintf(err, err_len, "config file: key \"%s\" has the wrong type",
                             it->string);
                    rc = KVS_EINVAL;
                } else {
                    rc = opt_set(c, o, e->valuestring, err, err_len);
                }
            }
            if (rc)
                break;
            continue;
        }
        if (cJSON_IsString(it) && (o->type == OPT_STR))
            v = it->valuestring;
        else if (cJSON_IsNull(it) && o->type == OPT_STR)
            v = "";
        else if (cJSON_IsBool(it) && o->type == OPT_FLAG)
            v = cJSON_IsTrue(it) ? "true" : "false";
        else if (cJSON_IsNumber(it) && o->type != OPT_STR && o->type != OPT_FLAG) {
            double d = it->valuedouble;
            if (o->type == OPT_DBL)
                snprintf(buf, sizeof buf, "%.17g", d);
            else if (d >= 0 && d == (double)(uint64_t)d)
                snprintf(buf, sizeof buf, "%llu", (unsigned long long)d);
            else
                snprintf(buf, sizeof buf, "%g", d);
            v = buf;
        }
        if (!v) {
            snprintf(err, err_len, "config file: key \"%s\" has the wrong type", it->string);
            rc = KVS_EINVAL;
            break;
        }
        if ((rc = opt_set(c, o, v, err, err_len)) != 0)
            break;
    }
    cJSON_Delete(root);
    return rc;
}

static int read_file(const char *path, char **out, char *err, size_t err_len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_len, "cannot open config file %s: %s", path, strerror(errno));
        return KVS_EIO;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1)
            break;
        if (cap > (1u << 24)) {
            free(buf);
            buf = NULL;
            break;
        }
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
        }
        buf = nb;
        cap *= 2;
    }
    fclose(f);
    if (!buf) {
        snprintf(err, err_len, "config file %s is too large", path);
        return KVS_ENOMEM;
    }
    buf[n] = '\0';
    *out = buf;
    return 0;
}

int srv_config_parse(srv_config *c, int argc, char **argv, char *err, size_t err_len)
{
    /* The file first, so that flags given anywhere override it. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *path = NULL;
        if (!strcmp(a, "--config")) {
            if (i + 1 >= argc) {
                snprintf(err, err_len, "--config needs a value");
                return KVS_EINVAL;
            }
            path = argv[++i];
        } else if (!strncmp(a, "--config=", 9)) {
            path = a + 9;
        }
        if (path) {
            char *text = NULL;
            int rc = read_file(path, &text, err, err_len);
            if (rc)
                return KVS_EINVAL;
            rc = srv_config_apply_json(c, text, err, err_len);
            free(text);
            if (rc)
                return rc;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            c->help = true;
            continue;
        }
        if (!strcmp(a, "--config")) {
            i++;
            continue;
        }
        if (!strncmp(a, "--config=", 9))
            continue;
        const opt *o = NULL;
        const char *val = NULL;
        if (a[0] == '-' && a[1] == '-') {
            const char *name = a + 2;
            const char *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            o = opt_find(name, len);
            if (eq)
                val = eq + 1;
        } else if (a[0] == '-' && a[1] && !a[2]) {
            for (size_t k = 0; k < N_OPTS; k++)
                if (k_opts[k].short_name == a[1])
                    o = &k_opts[k];
        }
        if (!o) {
            snprintf(err, err_len, "unknown option '%s' (see kvserve serve --help)", a);
            return KVS_EINVAL;
        }
        if (!val) {
            if (o->type == OPT_FLAG) {
                val = "true";
            } else {
                if (i + 1 >= argc) {
                    snprintf(err, err_len, "--%s needs a value", o->name);
                    return KVS_EINVAL;
                }
                val = argv[++i];
            }
        }
        int rc = opt_set(c, o, val, err, err_len);
        if (rc)
            return rc;
    }
    return 0;
}

void srv_config_usage(FILE *out)
{
    fprintf(out, "usage: kvserve serve -m MODEL.gguf [options]\n\n"
                 "Serves the OpenAI-compatible HTTP API (see docs). Options (default in []):\n");
    fprintf(out, "  %-28s %s\n", "--config FILE",
            "JSON file with any of these settings (keys as below, '-' or '_'); flags override it");
    for (size_t i = 0; i < N_OPTS; i++) {
        const opt *o = &k_opts[i];
        char flag[64];
        const char *arg = o->type == OPT_FLAG   ? ""
                          : o->type == OPT_STR  ? " STR"
                          : o->type == OPT_LIST ? " ORIGIN"
                                                : " N";
        if (o->short_name)
            snprintf(flag, sizeof flag, "-%c, --%s%s", o->short_name, o->name, arg);
        else
            snprintf(flag, sizeof flag, "--%s%s", o->name, arg);
        fprintf(out, "  %-28s %s [%s]\n", flag, o->help, o->defval);
    }
    fprintf(out, "  %-28s %s\n", "-h, --help", "show this help");
}
