/* The small routes: /v1/models, /metrics, /kv-cache, /tokenizer_info, /tokenize (a prompt, or
 * vLLM's messages), /detokenize, /apply-template. */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "common/log.h"
#include "common/status.h"
#include "common/timeutil.h"
#include "server/api.h"
#include "server/http_impl.h"
#include "server/kv_view.h"

enum MHD_Result srv__route_models(srv_conn *c, const char *url)
{
    srv_server *s = c->srv;
    if (c->route == R_MODEL_ONE && strcmp(url + 11, s->served_name))
        return srv__fail(c, 404, "model", "model_not_found", "The model does not exist");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->served_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->started);
    cJSON_AddStringToObject(m, "owned_by", "kvserve");
    cJSON_AddNumberToObject(m, "max_model_len", s->n_ctx);
    if (c->route == R_MODEL_ONE)
        return srv__send_cjson(c, 200, m);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON_AddItemToArray(data, m);
    return srv__send_cjson(c, 200, root);
}

enum MHD_Result srv__route_metrics(srv_conn *c)
{
    srv_server *s = c->srv;
    uint64_t counts[SRV_N_STATUS];
    for (int i = 0; i < SRV_N_STATUS; i++)
        counts[i] = atomic_load(&s->status_counts[i]);
    sched_metrics m;
    bool have = atomic_load(&s->state) >= ST_READY && s->sched;
    if (have)
        sched_get_metrics(s->sched, &m);
    char *text =
        srv_metrics_format(have ? &m : NULL, counts, have ? engine_model_kernels(s->model) : NULL);
    if (!text)
        return srv__fail(c, 500, NULL, NULL, "out of memory");
    enum MHD_Result r =
        srv__send_body(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, strlen(text));
    free(text);
    return r;
}

/* A token's text for /tokenizer_info, or null when the vocabulary has none. */
static cJSON *token_or_null(const tok_vocab *v, int32_t id)
{
    const char *t = id >= 0 ? tok_token_text(v, id) : NULL;
    return t ? cJSON_CreateString(t) : cJSON_CreateNull();
}

/* GET /tokenizer_info: the tokenizer's configuration as vLLM gives it (the members of Hugging
 * Face's tokenizer_config.json that a GGUF file holds), for clients that tokenize through the
 * server: lm-evaluation-harness's remote tokenizer reads its special tokens here, then
 * /tokenize and /detokenize. chat_template is the file's when it is the one served (no
 * --chat-template), else null: the Jinja text of a built-in format is not kept. */
enum MHD_Result srv__route_tokenizer_info(srv_conn *c)
{
    srv_server *s = c->srv;
    const tok_vocab *v = s->vocab;
    cJSON *r = cJSON_CreateObject();
    /* the Hugging Face class such a tokenizer loads as */
    cJSON_AddStringToObject(r, "tokenizer_class",
                            tok_family(v) == TOK_FAMILY_SPM ? "LlamaTokenizerFast"
                                                            : "PreTrainedTokenizerFast");
    cJSON_AddItemToObject(r, "bos_token", token_or_null(v, tok_bos(v)));
    cJSON_AddItemToObject(r, "eos_token", token_or_null(v, tok_eos(v)));
    cJSON_AddItemToObject(r, "unk_token", token_or_null(v, tok_unk(v)));
    cJSON_AddItemToObject(r, "pad_token", token_or_null(v, tok_pad(v)));
    cJSON_AddBoolToObject(r, "add_bos_token", tok_add_bos(v));
    cJSON_AddBoolToObject(r, "add_eos_token", tok_add_eos(v));
    cJSON_AddNumberToObject(r, "model_max_length", s->n_ctx);
    cJSON_AddNumberToObject(r, "vocab_size", tok_n_vocab(v));
    const char *tmpl = s->cfg->chat_template ? NULL : engine_model_chat_template(s->model);
    if (tmpl)
        cJSON_AddStringToObject(r, "chat_template", tmpl);
    else
        cJSON_AddNullToObject(r, "chat_template");
    return srv__send_cjson(c, 200, r);
}

/* GET /kv-cache[?cells=N]: a snapshot of the KV pool taken between two engine steps, folded
 * into at most N cells (default 4096) for the page's grid. */
enum MHD_Result srv__route_kv(srv_conn *c)
{
    srv_server *s = c->srv;
    const char *q = MHD_lookup_connection_value(c->mc, MHD_GET_ARGUMENT_KIND, "cells");
    unsigned long cells = 4096;
    if (q) {
        char *end;
        errno = 0;
        cells = strtoul(q, &end, 10);
        if (errno || end == q || *end || cells < 1 || cells > SRV_KV_MAX_CELLS)
            return srv__fail(c, 400, "cells", NULL, "'cells' must be an integer from 1 to 65536");
    }
    sched_kv_snapshot k;
    int rc = sched_kv_snapshot_take(s->sched, &k, 5000);
    if (rc)
        return srv__fail(c, 503, NULL, NULL, "the engine is busy or stopping; no KV snapshot");
    sched_metrics m;
    sched_get_metrics(s->sched, &m);
    const engine_hparams *hp = engine_model_hparams(s->model);
    srv_kv_model info = {s->served_name, hp->arch, engine_model_weight_type(s->model),
                         engine_model_kernels(s->model), s->n_ctx};
    char *body = srv_kv_json(&k, &info, m.generation_tokens_total, (uint32_t)cells);
    sched_kv_snapshot_free(&k);
    if (!body)
        return srv__fail(c, 500, NULL, NULL, "out of memory");
    enum MHD_Result r = srv__send_json(c, 200, body);
    free(body);
    return r;
}

/* Tokenizes text into a malloc'd array. */
int srv__tokenize(const tok_vocab *v, const char *text, bool add_bos, int32_t **ids, size_t *n)
{
    size_t len = strlen(text);
    size_t cap = len + 8;
    for (int attempt = 0; attempt < 2; attempt++) {
        int32_t *buf = malloc(cap * sizeof *buf);
        if (!buf)
            return KVS_ENOMEM;
        size_t got = 0;
        int rc = tok_encode(v, text, len, add_bos, true, buf, cap, &got);
        if (rc == 0) {
            *ids = buf;
            *n = got;
            return 0;
        }
        free(buf);
        if (rc != KVS_ENOSPC)
            return rc;
        cap = got;
    }
    return KVS_ENOSPC;
}

int srv__tokenize_special(const tok_vocab *v, const char *text, bool add_special, int32_t **ids,
                          size_t *n)
{
    int rc = srv__tokenize(v, text, add_special && tok_add_bos(v), ids, n);
    if (rc || !add_special || !tok_add_eos(v))
        return rc;
    int32_t *grown = realloc(*ids, (*n + 1) * sizeof **ids);
    if (!grown) {
        free(*ids);
        *ids = NULL;
        return KVS_ENOMEM;
    }
    grown[(*n)++] = tok_eos(v);
    *ids = grown;
    return 0;
}

/* {"tokens": ids, "count": n, "max_model_len": ...}, vLLM's answer, with "token_strs" (each
 * token's vocabulary entry, "▁the" or "Ġthe", as vLLM's return_token_strs) when strs; frees
 * ids */
static enum MHD_Result send_tokens(srv_conn *c, int32_t *ids, size_t n, bool strs)
{
    cJSON *out = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(out, "tokens");
    for (size_t i = 0; arr && i < n; i++)
        cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
    cJSON *txt = strs ? cJSON_AddArrayToObject(out, "token_strs") : NULL;
    for (size_t i = 0; txt && i < n; i++) {
        const char *t = tok_token_text(c->srv->vocab, ids[i]);
        cJSON_AddItemToArray(txt, srv_json_string_n(t, strlen(t)));
    }
    cJSON_AddNumberToObject(out, "count", (double)n);
    cJSON_AddNumberToObject(out, "max_model_len", c->srv->n_ctx);
    free(ids);
    return srv__send_cjson(c, 200, out);
}

/* POST /tokenize with messages (vLLM's chat form): the ids /v1/chat/completions runs for them,
 * as a client counting a conversation's tokens wants: /apply-template's rendering (messages,
 * tools, tool_choice, chat_template_kwargs) tokenized with the vocabulary's BOS, as the chat
 * route does. add_generation_prompt true and add_special_tokens false are vLLM's defaults there
 * and what this renders (the assistant's turn opened; BOS stands for the text a template writes
 * first, so true would add a second); other values, and any other member but model, are 400s
 * naming them rather than fields accepted and ignored. */
static enum MHD_Result tokenize_chat(srv_conn *c, const cJSON *root, bool strs)
{
    srv_server *s = c->srv;
    cJSON *body = cJSON_CreateObject();
    const cJSON *it;
    const char *bad = NULL, *why = NULL;
    cJSON_ArrayForEach(it, root)
    {
        if (!strcmp(it->string, "model") || !strcmp(it->string, "return_token_strs"))
            continue;
        /* null is the default, as a client that sends every field unset writes it */
        if ((!strcmp(it->string, "add_generation_prompt") ||
             !strcmp(it->string, "add_special_tokens")) &&
            cJSON_IsNull(it))
            continue;
        if (!strcmp(it->string, "add_generation_prompt") && !cJSON_IsTrue(it))
            why = "only true is rendered: the assistant's turn opened, as /v1/chat/completions "
                  "runs it";
        else if (!strcmp(it->string, "add_special_tokens") && !cJSON_IsFalse(it))
            why = "only false with messages: BOS already stands for the text a chat template "
                  "writes first";
        else if (!strcmp(it->string, "add_generation_prompt") ||
                 !strcmp(it->string, "add_special_tokens"))
            continue;
        else if (!srv_template_field(it->string))
            why = "it has no effect on /tokenize with messages, which takes messages, tools, "
                  "tool_choice, chat_template_kwargs, reasoning_effort, add_generation_prompt, "
                  "add_special_tokens and return_token_strs only";
        else if (body)
            cJSON_AddItemToObject(body, it->string, cJSON_Duplicate(it, 1));
        if (why) {
            bad = it->string;
            break;
        }
    }
    char *text = body && !why ? cJSON_PrintUnformatted(body) : NULL;
    cJSON_Delete(body);
    if (why) {
        srv_error e;
        srv_error_set(&e, 400, bad, "unsupported_parameter", "'%.64s': %s", bad, why);
        free(text);
        return srv__send_error(c, &e);
    }
    if (!text)
        return srv__fail(c, 500, NULL, NULL, "out of memory");
    srv_error e;
    srv_request rq;
    int rc = srv_template_parse(text, strlen(text), &s->chat, &rq, &e);
    free(text);
    if (rc)
        return srv__send_error(c, &e);
    int32_t *ids = NULL;
    size_t n = 0;
    rc = srv__tokenize(s->vocab, rq.prompt_text, tok_add_bos(s->vocab), &ids, &n);
    srv_request_free(&rq);
    if (rc)
        return srv__fail(c, 500, NULL, NULL, "tokenization failed");
    return send_tokens(c, ids, n, strs);
}

enum MHD_Result srv__route_tokenize(srv_conn *c)
{
    srv_server *s = c->srv;
    cJSON *root;
    srv_error e;
    if (srv_json_parse_object(c->body ? c->body : "", c->body_len, &root, &e))
        return srv__send_error(c, &e);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!p)
        p = cJSON_GetObjectItemCaseSensitive(root, "text");
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(root, "return_token_strs");
    if (ts && !cJSON_IsBool(ts) && !cJSON_IsNull(ts)) {
        cJSON_Delete(root);
        return srv__fail(c, 400, "return_token_strs", NULL,
                         "'return_token_strs' must be a boolean");
    }
    bool strs = cJSON_IsTrue(ts);
    if (cJSON_GetObjectItemCaseSensitive(root, "messages")) {
        enum MHD_Result r =
            p ? srv__fail(c, 400, "messages", NULL, "give either 'prompt' or 'messages', not both")
              : tokenize_chat(c, root, strs);
        cJSON_Delete(root);
        return r;
    }
    const cJSON *as = cJSON_GetObjectItemCaseSensitive(root, "add_special_tokens");
    if (!cJSON_IsString(p) || (as && !cJSON_IsBool(as) && !cJSON_IsNull(as))) {
        cJSON_Delete(root);
        return srv__fail(c, 400, cJSON_IsString(p) ? "add_special_tokens" : "prompt", NULL,
                         cJSON_IsString(p) ? "'add_special_tokens' must be a boolean"
                                           : "'prompt' must be a string");
    }
    /* add_special_tokens (vLLM's, default true; llama.cpp's add_special): true adds the special
     * tokens the vocabulary asks for (BOS where it adds one; a vocabulary without, as Qwen's or
     * GPT-2's, gets none; EOS at the end where tokenizer.ggml.add_eos_token says, as an
     * embedding model's: as vLLM and llama.cpp give it), false none */
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = srv__tokenize_special(s->vocab, p->valuestring, !(as && cJSON_IsFalse(as)), &ids, &n);
    cJSON_Delete(root);
    if (rc)
        return srv__fail(c, 500, NULL, NULL, "tokenization failed");
    return send_tokens(c, ids, n, strs);
}

enum MHD_Result srv__route_detokenize(srv_conn *c)
{
    srv_server *s = c->srv;
    cJSON *root;
    srv_error e;
    if (srv_json_parse_object(c->body ? c->body : "", c->body_len, &root, &e))
        return srv__send_error(c, &e);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    int n = cJSON_IsArray(t) ? cJSON_GetArraySize(t) : -1;
    int32_t *ids = n > 0 ? malloc((size_t)n * sizeof *ids) : NULL;
    bool ok = n >= 0 && (n == 0 || ids);
    int i = 0;
    const cJSON *it;
    if (ok)
        cJSON_ArrayForEach(it, t)
        {
            if (!cJSON_IsNumber(it) || it->valuedouble < 0 ||
                it->valuedouble >= tok_n_vocab(s->vocab) ||
                it->valuedouble != (double)(int32_t)it->valuedouble) {
                ok = false;
                break;
            }
            ids[i++] = (int32_t)it->valuedouble;
        }
    cJSON_Delete(root);
    if (!ok) {
        free(ids);
        return srv__fail(c, 400, "tokens", NULL, "'tokens' must be an array of valid token ids");
    }
    size_t need = 0;
    char probe[1];
    tok_decode(s->vocab, ids, (size_t)i, TOK_DECODE_STRIP_SPACE | TOK_DECODE_SPECIAL, probe, 0,
               &need);
    char *text = malloc(need + 1);
    size_t got = 0;
    if (!text || tok_decode(s->vocab, ids, (size_t)i, TOK_DECODE_STRIP_SPACE | TOK_DECODE_SPECIAL,
                            text, need + 1, &got)) {
        free(ids);
        free(text);
        return srv__fail(c, 500, NULL, NULL, "detokenization failed");
    }
    text[got] = '\0';
    free(ids);
    cJSON *out = cJSON_CreateObject();
    cJSON_AddItemToObject(out, "prompt", srv_json_string_n(text, got));
    free(text);
    return srv__send_cjson(c, 200, out);
}

enum MHD_Result srv__route_apply_template(srv_conn *c)
{
    srv_error e;
    srv_request rq;
    if (srv_template_parse(c->body ? c->body : "", c->body_len, &c->srv->chat, &rq, &e))
        return srv__send_error(c, &e);
    cJSON *out = cJSON_CreateObject();
    cJSON_AddItemToObject(out, "prompt", srv_json_string_n(rq.prompt_text, strlen(rq.prompt_text)));
    srv_request_free(&rq);
    return srv__send_cjson(c, 200, out);
}
