/* libFuzzer target: request JSON -> validated parameters (srv_request_parse), the path every
 * /v1/completions and /v1/chat/completions body takes before it reaches the tokenizer, and the
 * same body as /v1/embeddings (srv_embed_parse).
 * The first input byte picks the endpoint (bit 0) and the chat template (bits 1-3); the rest
 * is the body. Checks invariants, not just crashes: a parse either succeeds with every field
 * inside its documented range, or fails with a 4xx/500 whose error body is valid JSON. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "engine/sampler.h"
#include "server/api.h"
#include "server/embeddings.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "fuzz_api: invariant failed: %s\n", #x);                               \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    bool chat = data[0] & 1;
    /* the family, and for ChatML a default system turn (Qwen 2.5's form) half the time */
    srv_chat_fmt fmt = {.tmpl = (enum srv_chat_tmpl)((data[0] >> 1) % SRV_CHAT_COUNT),
                        .default_system = (data[0] & 0x80) ? (char *)"You are a test." : NULL};
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    sampler_params defaults = sampler_default_params();
    srv_request r;
    srv_error e;
    memset(&e, 0, sizeof e);
    if (srv_request_parse(body, len, chat, &fmt, &defaults, &r, &e) == 0) {
        CHECK(r.chat == chat);
        CHECK(r.n >= 1 && r.n <= SRV_MAX_N);
        CHECK(r.max_tokens >= 1 || (r.echo && !chat)); /* 0: a completion's prompt scored */
        CHECK(r.n_stop >= 0 && r.n_stop <= SRV_MAX_STOP);
        for (int i = 0; i < r.n_stop; i++)
            CHECK(r.stop[i] && r.stop[i][0]);
        CHECK(r.n_top_logprobs >= -1 && r.n_top_logprobs <= 20);
        CHECK((r.prompt_text != NULL) != (r.prompt_ids != NULL));
        CHECK(!chat || r.prompt_text);
        for (size_t i = 0; i < r.n_prompt_ids; i++)
            CHECK(r.prompt_ids[i] >= 0);
        const sampler_params *s = &r.sampling;
        CHECK(isfinite(s->temperature) && s->temperature >= 0 && s->temperature <= 2);
        CHECK(isfinite(s->top_p) && s->top_p > 0 && s->top_p <= 1);
        CHECK(isfinite(s->min_p) && s->min_p >= 0 && s->min_p <= 1);
        CHECK(isfinite(s->repetition_penalty) && s->repetition_penalty > 0);
        CHECK(isfinite(s->presence_penalty) && isfinite(s->frequency_penalty));
        srv_request_free(&r);
    } else {
        CHECK((e.status >= 400 && e.status < 500) || e.status == 500);
        CHECK(memchr(e.message, '\0', sizeof e.message) && memchr(e.param, '\0', sizeof e.param));
        /* The request must have been left empty (nothing to free, nothing leaked). */
        CHECK(!r.prompt_text && !r.prompt_ids && !r.model && r.n_stop == 0);
        char *j = srv_error_json(&e);
        if (j) {
            cJSON *back = cJSON_Parse(j);
            CHECK(back != NULL);
            cJSON_Delete(back);
            free(j);
        }
    }
    /* the same body as POST /v1/embeddings */
    srv_embed_request er;
    if (srv_embed_parse(body, len, &er, &e) == 0) {
        CHECK(er.n_inputs >= 1 && er.n_inputs <= SRV_MAX_EMBED_INPUTS);
        for (size_t k = 0; k < er.n_inputs; k++) {
            const srv_embed_input *in = &er.inputs[k];
            CHECK((in->text != NULL) != (in->ids != NULL));
            CHECK(in->text ? in->text[0] != '\0' : in->n_ids >= 1);
            for (size_t i = 0; in->ids && i < in->n_ids; i++)
                CHECK(in->ids[i] >= 0);
        }
        CHECK(er.dimensions == -1 || er.dimensions >= 1);
        srv_embed_request_free(&er);
    } else {
        CHECK((e.status >= 400 && e.status < 500) || e.status == 500);
        CHECK(!er.inputs && !er.model && er.n_inputs == 0);
    }
    return 0;
}
