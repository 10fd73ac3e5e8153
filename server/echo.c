/* /v1/completions with echo: each choice's text begins with its prompt's, and with logprobs
 * its logprobs begin with the prompt's tokens (the first with none, as OpenAI and vLLM give
 * it: nothing comes before it to predict it). The scheduler computes the prompt's logprobs
 * (sched_request_params.prompt_logprobs) and sends them in one event before the first
 * generated token; here they become each choice's first text and tokens, in a whole response
 * and in a stream alike. */
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "server/http_impl.h"

int srv__echo_setup(srv_conn *c, uint32_t n_prompts)
{
    c->echo = calloc(n_prompts, sizeof *c->echo);
    c->n_echo = c->echo ? n_prompts : 0;
    return c->echo ? 0 : KVS_ENOMEM;
}

int srv__echo_prompt(srv_conn *c, uint32_t k, const char *text, const int32_t *ids, size_t n)
{
    srv_echo *e = &c->echo[k];
    e->first = ids[0];
    if (text) {
        e->len = strlen(text);
        e->text = strdup(text);
        return e->text ? 0 : KVS_ENOMEM;
    }
    /* token ids: their text as a full decode gives it (no control tokens' text, no SPM
     * leading space), what a client that tokenized a text gets back */
    size_t need = 0;
    char probe[1];
    tok_decode(c->srv->vocab, ids, n, TOK_DECODE_STRIP_SPACE, probe, 0, &need);
    e->text = malloc(need + 1);
    if (!e->text)
        return KVS_ENOMEM;
    int rc = tok_decode(c->srv->vocab, ids, n, TOK_DECODE_STRIP_SPACE, e->text, need + 1, &e->len);
    return rc;
}

void srv__echo_free(srv_conn *c)
{
    for (uint32_t k = 0; k < c->n_echo; k++)
        free(c->echo[k].text);
    free(c->echo);
    c->echo = NULL;
    c->n_echo = 0;
}

/* Prompt k's echo for each of its choices: its text, with the prompt event's tokens after
 * the first token's empty entry when logprobs were asked for. */
static bool echo_prompt_out(srv_conn *c, uint32_t k, const sched_event *pev)
{
    srv_echo *e = &c->echo[k];
    e->sent = true;
    sched_token_info *toks = NULL;
    uint32_t n_toks = 0;
    if (c->rx.n_top_logprobs >= 0) {
        n_toks = 1 + (pev ? pev->n_tokens : 0);
        toks = calloc(n_toks, sizeof *toks);
        if (!toks)
            return false;
        toks[0].id = e->first;
        toks[0].n_top = -1; /* logprob and tops null */
        if (pev && pev->n_tokens)
            memcpy(toks + 1, pev->tokens, pev->n_tokens * sizeof *toks);
    }
    bool ok = true;
    for (uint32_t j = 0; ok && j < c->n_per; j++) {
        uint32_t idx = k * c->n_per + j;
        if (idx >= c->n_choices)
            break;
        srv_choice *ch = &c->choices[idx];
        if (c->rq.stream) {
            ok = srv__out_append(c, srv_resp_chunk(&c->rx, idx, e->text, e->len, toks, n_toks,
                                                   SCHED_FINISH_NONE, false, ch->len));
            ch->len += e->len; /* a stream tracks only the text offset */
        } else {
            sched_event add = {
                .text = e->text, .text_len = e->len, .tokens = toks, .n_tokens = n_toks};
            ok = srv_choice_add(ch, &add) == 0;
            ch->echo_toks = n_toks;
            ch->echo_len = e->len;
        }
    }
    free(toks);
    return ok;
}

bool srv__echo_event(srv_conn *c, const sched_event *ev, bool *consumed)
{
    *consumed = false;
    if (!c->echo || !c->n_per)
        return true;
    uint32_t k = ev->choice / c->n_per;
    if (ev->prompt)
        *consumed = true;
    if (c->echo[k].sent)
        return true;
    /* The prompt's echo goes out before anything else of its choices: with logprobs the
     * prompt event comes first; without, the first event of any choice brings it. */
    return echo_prompt_out(c, k, ev->prompt ? ev : NULL);
}
