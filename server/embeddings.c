/* POST /v1/embeddings: parsing and the response body (see embeddings.h). */
#include "server/embeddings.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/buf.h"

static int oom(srv_error *e)
{
    return srv_error_set(e, 500, NULL, NULL, "out of memory");
}

/* An array of token ids: non-negative integers (the route checks them against the
 * vocabulary). */
static int parse_ids(const cJSON *arr, srv_embed_input *in, srv_error *e)
{
    int n = cJSON_GetArraySize(arr);
    if (n == 0)
        return srv_error_set(e, 400, "input", NULL, "'input' must not hold an empty array");
    in->ids = malloc((size_t)n * sizeof *in->ids);
    if (!in->ids)
        return oom(e);
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        double d = it->valuedouble;
        if (!cJSON_IsNumber(it) || !(d >= 0 && d <= INT32_MAX) || d != floor(d))
            return srv_error_set(e, 400, "input", NULL,
                                 "'input' token ids must be non-negative integers");
        in->ids[in->n_ids++] = (int32_t)d;
    }
    return 0;
}

static int parse_text(const cJSON *s, srv_embed_input *in, srv_error *e)
{
    if (!s->valuestring[0])
        return srv_error_set(e, 400, "input", NULL, "'input' must not hold an empty string");
    in->text = strdup(s->valuestring);
    return in->text ? 0 : oom(e);
}

static int parse_input(const cJSON *root, srv_embed_request *r, srv_error *e)
{
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(root, "input");
    if (!in || cJSON_IsNull(in))
        return srv_error_set(e, 400, "input", NULL, "'input' is required");
    bool one = cJSON_IsString(in) ||
               (cJSON_IsArray(in) && cJSON_GetArraySize(in) > 0 && cJSON_IsNumber(in->child));
    if (!one && !cJSON_IsArray(in))
        return srv_error_set(e, 400, "input", NULL,
                             "'input' must be a string, an array of strings, an array of token "
                             "ids or an array of arrays of token ids");
    size_t n = one ? 1 : (size_t)cJSON_GetArraySize(in);
    if (n == 0)
        return srv_error_set(e, 400, "input", NULL, "'input' must not be empty");
    if (n > SRV_MAX_EMBED_INPUTS)
        return srv_error_set(e, 400, "input", NULL, "'input' holds %zu inputs; at most %d", n,
                             SRV_MAX_EMBED_INPUTS);
    r->inputs = calloc(n, sizeof *r->inputs);
    if (!r->inputs)
        return oom(e);
    r->n_inputs = n;
    if (one)
        return cJSON_IsString(in) ? parse_text(in, &r->inputs[0], e)
                                  : parse_ids(in, &r->inputs[0], e);
    size_t k = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, in)
    {
        int rc;
        if (cJSON_IsString(it))
            rc = parse_text(it, &r->inputs[k], e);
        else if (cJSON_IsArray(it))
            rc = parse_ids(it, &r->inputs[k], e);
        else
            rc = srv_error_set(e, 400, "input", NULL,
                               "'input' array entries must be strings or arrays of token ids");
        if (rc)
            return rc;
        k++;
    }
    return 0;
}

int srv_embed_parse(const char *body, size_t len, srv_embed_request *r, srv_error *e)
{
    memset(r, 0, sizeof *r);
    r->dimensions = -1;
    cJSON *root;
    if (srv_json_parse_object(body, len, &root, e))
        return -1;
    int rc = -1;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "encoding_format");
    const cJSON *dims = cJSON_GetObjectItemCaseSensitive(root, "dimensions");
    const cJSON *user = cJSON_GetObjectItemCaseSensitive(root, "user");
    if (srv_json_model(root, &r->model, e))
        goto out;
    if (fmt && !cJSON_IsNull(fmt)) {
        if (!cJSON_IsString(fmt) ||
            (strcmp(fmt->valuestring, "float") && strcmp(fmt->valuestring, "base64"))) {
            srv_error_set(e, 400, "encoding_format", NULL,
                          "'encoding_format' must be \"float\" or \"base64\"");
            goto out;
        }
        r->base64 = !strcmp(fmt->valuestring, "base64");
    }
    if (dims && !cJSON_IsNull(dims)) {
        double d = dims->valuedouble;
        if (!cJSON_IsNumber(dims) || !(d >= 1 && d <= 1e9) || d != floor(d)) {
            srv_error_set(e, 400, "dimensions", NULL, "'dimensions' must be a positive integer");
            goto out;
        }
        r->dimensions = (int64_t)d;
    }
    if (user && !cJSON_IsNull(user) && !cJSON_IsString(user)) {
        srv_error_set(e, 400, "user", NULL, "'user' must be a string");
        goto out;
    }
    if (parse_input(root, r, e))
        goto out;
    rc = 0;
out:
    cJSON_Delete(root);
    if (rc)
        srv_embed_request_free(r);
    return rc;
}

void srv_embed_request_free(srv_embed_request *r)
{
    for (size_t k = 0; k < r->n_inputs; k++) {
        free(r->inputs[k].text);
        free(r->inputs[k].ids);
    }
    free(r->inputs);
    free(r->model);
    memset(r, 0, sizeof *r);
    r->dimensions = -1;
}

/* Standard base64 (RFC 4648, padded) of n bytes onto b. */
static void add_base64(kvs_buf *b, const unsigned char *p, size_t n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char q[4];
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16;
        if (i + 1 < n)
            v |= (uint32_t)p[i + 1] << 8;
        if (i + 2 < n)
            v |= p[i + 2];
        q[0] = tab[v >> 18 & 63];
        q[1] = tab[v >> 12 & 63];
        q[2] = i + 1 < n ? tab[v >> 6 & 63] : '=';
        q[3] = i + 2 < n ? tab[v & 63] : '=';
        kvs_buf_addn(b, q, 4);
    }
}

char *srv_embed_response(const char *model, const float *vecs, size_t n, uint32_t dim, bool base64,
                         uint64_t prompt_tokens)
{
    /* Written as text, not a cJSON tree: 2048 inputs of 4096 floats would be 8 M nodes. */
    cJSON *name = cJSON_CreateString(model);
    char *qname = name ? cJSON_PrintUnformatted(name) : NULL;
    cJSON_Delete(name);
    if (!qname)
        return NULL;
    kvs_buf b = {0};
    char num[32];
    kvs_buf_add(&b, "{\"object\":\"list\",\"data\":[");
    for (size_t k = 0; k < n; k++) {
        snprintf(num, sizeof num, "%zu", k);
        kvs_buf_add(&b, k ? ",{\"object\":\"embedding\",\"index\":"
                          : "{\"object\":\"embedding\",\"index\":");
        kvs_buf_add(&b, num);
        kvs_buf_add(&b, ",\"embedding\":");
        const float *v = vecs + k * dim;
        if (base64) {
            /* little-endian float32, what the OpenAI SDKs decode (x86 is little-endian) */
            kvs_buf_add(&b, "\"");
            add_base64(&b, (const unsigned char *)v, (size_t)dim * sizeof(float));
            kvs_buf_add(&b, "\"}");
            continue;
        }
        kvs_buf_add(&b, "[");
        for (uint32_t i = 0; i < dim; i++) {
            /* 9 significant digits give the float back exactly */
            int w = snprintf(num, sizeof num, i ? ",%.9g" : "%.9g", (double)v[i]);
            kvs_buf_addn(&b, num, (size_t)w);
        }
        kvs_buf_add(&b, "]}");
    }
    kvs_buf_add(&b, "],\"model\":");
    kvs_buf_add(&b, qname);
    snprintf(num, sizeof num, "%llu", (unsigned long long)prompt_tokens);
    kvs_buf_add(&b, ",\"usage\":{\"prompt_tokens\":");
    kvs_buf_add(&b, num);
    kvs_buf_add(&b, ",\"total_tokens\":");
    kvs_buf_add(&b, num);
    kvs_buf_add(&b, "}}");
    free(qname);
    char *out;
    return kvs_buf_take(&b, &out) ? NULL : out;
}
