/* POST /v1/embeddings, the pure parts: the request parsed and validated, and the response body
 * (float arrays or OpenAI's base64 of little-endian float32). No tokenizer or scheduler, so
 * unit tests need no model; server/route_embeddings.c runs them. */
#ifndef KVS_SERVER_EMBEDDINGS_H
#define KVS_SERVER_EMBEDDINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/api.h"

#define SRV_MAX_EMBED_INPUTS 2048 /* inputs of one request, as OpenAI */

/* One input: text, or token ids (used as given). */
typedef struct srv_embed_input {
    char *text;
    int32_t *ids;
    size_t n_ids;
} srv_embed_input;

typedef struct srv_embed_request {
    char *model; /* as given, or NULL */
    srv_embed_input *inputs;
    size_t n_inputs;
    bool base64;        /* encoding_format "base64" (else "float") */
    int64_t dimensions; /* as given, or -1: the route refuses any but the model's */
} srv_embed_request;

/* Parses body: input (a string, an array of strings, an array of token ids, or an array of
 * arrays of token ids; none empty, at most SRV_MAX_EMBED_INPUTS), model, encoding_format,
 * dimensions, user. Returns 0, or -1 with e filled (400s; 500 on OOM). */
int srv_embed_parse(const char *body, size_t len, srv_embed_request *r, srv_error *e);
void srv_embed_request_free(srv_embed_request *r);

/* The response body, malloc'd (NULL on OOM): n vectors of dim floats each (vecs, row after
 * row), as OpenAI's {"object":"list","data":[{"object":"embedding","index",...}],"model",
 * "usage"}. */
char *srv_embed_response(const char *model, const float *vecs, size_t n, uint32_t dim, bool base64,
                         uint64_t prompt_tokens);

#endif
