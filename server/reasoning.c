/* The think-block splitter and harmony's channel splitter (see reasoning.h). */
#include "server/reasoning.h"

#include <string.h>

enum { ST_START = 0, ST_IN, ST_OUT };

static const char k_think_open[] = "<think>", k_think_close[] = "</think>";
static const char k_g32_open[] = "Here is my thought process:",
                  k_g32_close[] = "Here is my response:";
static const char k_m3_open[] = "[THINK]", k_m3_close[] = "[/THINK]";

void srv_think_set_format(srv_think *t, enum srv_chat_tmpl tmpl)
{
    t->harmony = tmpl == SRV_CHAT_HARMONY;
    t->granite32 = tmpl == SRV_CHAT_GRANITE32;
    t->mistral = tmpl == SRV_CHAT_MISTRAL3_THINK;
}

/* The length of the longest suffix of s[0..n) that is a proper prefix of tag. */
static size_t partial_tag(const char *s, size_t n, const char *tag, size_t tag_n)
{
    for (size_t k = n < tag_n - 1 ? n : tag_n - 1; k > 0; k--)
        if (!memcmp(s + n - k, tag, k))
            return k;
    return 0;
}

/* ---- harmony ---- */

enum { H_START = 0, H_HEADER, H_BODY, H_RAW };
enum { CH_REASONING, CH_CONTENT, CH_CALL };

static const char k_msg[] = "<|message|>", k_end[] = "<|end|>", k_chan[] = "<|channel|>",
                  k_to[] = " to=";

static const char *find(const char *s, size_t n, const char *tag)
{
    size_t k = strlen(tag);
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(s + i, tag, k))
            return s + i;
    return NULL;
}

/* The word after tag in a header (up to a space or a marker), or NULL; *len its length. */
static const char *header_word(const char *h, size_t n, const char *tag, size_t *len)
{
    const char *p = find(h, n, tag);
    if (!p)
        return NULL;
    p += strlen(tag);
    const char *e = p;
    while (e < h + n && *e != ' ' && *e != '<')
        e++;
    *len = (size_t)(e - p);
    return p;
}

/* Reads a message header (the text before <|message|>): where its body goes. */
static void open_message(srv_think *t, const char *h, size_t n)
{
    size_t cl = 0, rl = 0;
    const char *ch = header_word(h, n, k_chan, &cl);
    const char *to = header_word(h, n, "to=", &rl);
    if (to && rl > 10 && !memcmp(to, "functions.", 10)) {
        t->channel = CH_CALL;
        kvs_buf_add(&t->call, "<|start|>assistant to=");
        kvs_buf_addn(&t->call, to, rl);
        kvs_buf_add(&t->call, "<|channel|>commentary json<|message|>");
    } else if (ch && cl == 8 && !memcmp(ch, "analysis", 8)) {
        t->channel = CH_REASONING;
    } else {
        t->channel = CH_CONTENT;
    }
}

static void close_message(srv_think *t, kvs_buf *content)
{
    if (t->channel == CH_CALL) {
        kvs_buf_add(&t->call, "<|call|>");
        kvs_buf_addn(content, t->call.p, t->call.len);
        if (t->call.oom)
            content->oom = true;
        kvs_buf_free(&t->call);
    }
    t->channel = CH_CONTENT;
}

static void body_out(srv_think *t, const char *p, size_t n, kvs_buf *reasoning, kvs_buf *content)
{
    kvs_buf_addn(t->channel == CH_REASONING ? reasoning
                 : t->channel == CH_CALL    ? &t->call
                                            : content,
                 p, n);
}

static size_t harmony_feed(srv_think *t, const char *b, size_t len, kvs_buf *reasoning,
                           kvs_buf *content)
{
    size_t i = 0;
    while (i < len) {
        const char *p = b + i;
        size_t rest = len - i;
        if (t->state == H_START) {
            size_t kc = rest < sizeof k_chan - 1 ? rest : sizeof k_chan - 1;
            size_t kt = rest < sizeof k_to - 1 ? rest : sizeof k_to - 1;
            bool chan = !memcmp(p, k_chan, kc), to = !memcmp(p, k_to, kt);
            if ((chan && kc < sizeof k_chan - 1) || (to && kt < sizeof k_to - 1))
                break; /* "<|chan": may still open a header */
            t->state = chan || to ? H_HEADER : H_RAW;
            continue;
        }
        if (t->state == H_RAW) {
            kvs_buf_addn(content, p, rest);
            return len;
        }
        if (t->state == H_HEADER) {
            const char *m = find(p, rest, k_msg);
            if (!m)
                break; /* the header is held until its <|message|> */
            open_message(t, p, (size_t)(m - p));
            i += (size_t)(m - p) + sizeof k_msg - 1;
            t->state = H_BODY;
            continue;
        }
        const char *e = find(p, rest, k_end);
        if (e) {
            body_out(t, p, (size_t)(e - p), reasoning, content);
            close_message(t, content);
            i += (size_t)(e - p) + sizeof k_end - 1;
            t->state = H_HEADER; /* "<|start|>assistant<|channel|>..." */
            continue;
        }
        size_t k = rest - partial_tag(p, rest, k_end, sizeof k_end - 1);
        body_out(t, p, k, reasoning, content);
        i += k;
        break;
    }
    return i;
}

static void harmony_end(srv_think *t, kvs_buf *reasoning, kvs_buf *content)
{
    const char *p = t->held.p;
    size_t n = t->held.len;
    if (t->state == H_START || t->state == H_RAW)
        kvs_buf_addn(content, p, n); /* a partial "<|chan" that never opened anything */
    else if (t->state == H_BODY)
        body_out(t, p, n, reasoning, content); /* a partial "<|en" is text after all */
    if (t->state == H_BODY)
        close_message(t, content); /* a call ended by <|call|>, or cut */
}

void srv_think_feed(srv_think *t, const char *s, size_t n, kvs_buf *reasoning, kvs_buf *content)
{
    kvs_buf_addn(&t->held, s, n);
    if (!t->held.p)
        return; /* nothing fed, nothing held */
    if (t->held.oom) {
        reasoning->oom = content->oom = true;
        return;
    }
    const char *b = t->held.p;
    size_t len = t->held.len, i = 0;
    const char *k_open = t->granite32 ? k_g32_open : t->mistral ? k_m3_open : k_think_open;
    const char *k_close = t->granite32 ? k_g32_close : t->mistral ? k_m3_close : k_think_close;
    const size_t open_n = strlen(k_open), close_n = strlen(k_close);
    if (t->harmony)
        i = harmony_feed(t, b, len, reasoning, content);
    while (!t->harmony && i < len) {
        const char *p = b + i;
        size_t rest = len - i;
        if (t->state == ST_START) {
            if (rest < open_n && !memcmp(p, k_open, rest))
                break; /* "<thi": may still open the block */
            if (rest >= open_n && !memcmp(p, k_open, open_n)) {
                i += open_n;
                t->state = ST_IN;
                t->drop_nl = true;
            } else {
                t->state = ST_OUT; /* no think block: all content, newlines kept */
            }
            continue;
        }
        if (t->drop_nl) {
            if (*p == '\n') {
                i++;
                continue;
            }
            t->drop_nl = false;
        }
        if (t->state == ST_OUT) {
            kvs_buf_addn(content, p, rest);
            i = len;
            break;
        }
        const char *close = NULL;
        for (size_t k = 0; k + close_n <= rest && !close; k++)
            if (!memcmp(p + k, k_close, close_n))
                close = p + k;
        if (close) {
            size_t r = (size_t)(close - p);
            while (r && p[r - 1] == '\n')
                r--;
            kvs_buf_addn(reasoning, p, r);
            i += (size_t)(close - p) + close_n;
            t->state = ST_OUT;
            t->drop_nl = true;
            continue;
        }
        /* Hold what may be the start of </think> and the newlines before it. */
        size_t k = rest - partial_tag(p, rest, k_close, close_n);
        while (k && p[k - 1] == '\n')
            k--;
        kvs_buf_addn(reasoning, p, k);
        i += k;
        break;
    }
    /* keep the unplaced tail */
    memmove(t->held.p, b + i, len - i);
    t->held.len = len - i;
    t->held.p[t->held.len] = '\0';
}

void srv_think_end(srv_think *t, kvs_buf *reasoning, kvs_buf *content)
{
    const char *p = t->held.p;
    size_t n = t->held.len;
    if (t->harmony)
        harmony_end(t, reasoning, content);
    else if (n && t->state == ST_START)
        kvs_buf_addn(content, p, n); /* a partial "<thi" that never opened anything */
    else if (n && t->state == ST_IN) {
        while (n && p[n - 1] == '\n')
            n--;
        kvs_buf_addn(reasoning, p, n); /* unclosed: the rest of the block */
    }
    srv_think_free(t);
}

void srv_think_free(srv_think *t)
{
    kvs_buf_free(&t->held);
    kvs_buf_free(&t->call);
    t->state = ST_START;
    t->drop_nl = false;
    t->channel = 0;
}
