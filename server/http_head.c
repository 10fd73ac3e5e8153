/* Request-head checks after RFC 9112 (message syntax and framing) and RFC 9110 (field
 * syntax). Stricter than libmicrohttpd where leniency lets two parsers disagree about where a
 * request ends (request smuggling): every framing ambiguity is an error, never a guess. */
#include "server/http_head.h"

#include "common/hex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool is_tchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

static bool name_is(const char *name, size_t len, const char *want)
{
    size_t n = strlen(want);
    if (len != n)
        return false;
    for (size_t i = 0; i < n; i++) {
        char a = name[i];
        if (a >= 'A' && a <= 'Z')
            a = (char)(a - 'A' + 'a');
        if (a != want[i])
            return false;
    }
    return true;
}

/* Calls fn on each member of a comma-separated list with optional whitespace trimmed; empty
 * members are skipped (RFC 9110 section 5.6.1). */
static void each_member(const char *v, size_t len, void (*fn)(srv_framing *, const char *, size_t),
                        srv_framing *f)
{
    size_t i = 0;
    while (i <= len) {
        size_t j = i;
        while (j < len && v[j] != ',')
            j++;
        size_t a = i, b = j;
        while (a < b && (v[a] == ' ' || v[a] == '\t'))
            a++;
        while (b > a && (v[b - 1] == ' ' || v[b - 1] == '\t'))
            b--;
        if (b > a)
            fn(f, v + a, b - a);
        i = j + 1;
    }
}

static void add_length(srv_framing *f, const char *v, size_t len)
{
    uint64_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (v[i] < '0' || v[i] > '9') {
            f->length_bad = true;
            return;
        }
        unsigned d = (unsigned)(v[i] - '0');
        n = n > (UINT64_MAX - d) / 10 ? UINT64_MAX : n * 10 + d;
    }
    if (f->n_length++ == 0)
        f->length = n;
    else if (f->length != n)
        f->length_differs = true;
}

static void add_coding(srv_framing *f, const char *v, size_t len)
{
    /* A coding's parameters (";q=...") do not change which coding it is. */
    size_t n = 0;
    while (n < len && v[n] != ';' && v[n] != ' ' && v[n] != '\t')
        n++;
    f->n_codings++;
    f->chunked_last = name_is(v, n, "chunked");
    if (f->chunked_last)
        f->n_chunked++;
    else
        f->unknown_coding = true;
}

void srv_framing_add(srv_framing *f, const char *name, size_t name_len, const char *value,
                     size_t value_len)
{
    if (name_is(name, name_len, "content-length")) {
        size_t before = f->n_length;
        each_member(value, value_len, add_length, f);
        if (f->n_length == before)
            f->length_bad = true; /* an empty Content-Length */
    } else if (name_is(name, name_len, "transfer-encoding")) {
        size_t before = f->n_codings;
        each_member(value, value_len, add_coding, f);
        if (f->n_codings == before) {
            f->n_codings++; /* an empty Transfer-Encoding still claims a coding */
            f->chunked_last = false;
        }
    }
}

int srv_framing_check(const srv_framing *f, bool http10, srv_error *e)
{
    if (f->n_codings && f->n_length)
        return srv_error_set(e, 400, NULL, NULL,
                             "a request must not have both Content-Length and Transfer-Encoding");
    if (f->length_bad)
        return srv_error_set(e, 400, NULL, NULL, "Content-Length is not a decimal number");
    if (f->length_differs)
        return srv_error_set(e, 400, NULL, NULL, "conflicting Content-Length values");
    if (f->n_codings && http10)
        return srv_error_set(e, 400, NULL, NULL, "Transfer-Encoding is not allowed in HTTP/1.0");
    if (f->unknown_coding)
        return srv_error_set(e, 501, NULL, NULL,
                             "unsupported transfer coding (only chunked is implemented)");
    if (f->n_codings && (f->n_chunked != 1 || !f->chunked_last))
        return srv_error_set(e, 400, NULL, NULL, "chunked must be the last transfer coding, once");
    return 0;
}

/* One line of buf from *pos: [*line, *line + *n) without its CRLF or LF; advances *pos past
 * it. False if no LF follows within len. */
static bool next_line(const char *buf, size_t len, size_t *pos, const char **line, size_t *n)
{
    const char *lf = memchr(buf + *pos, '\n', len - *pos);
    if (!lf)
        return false;
    size_t end = (size_t)(lf - buf);
    *line = buf + *pos;
    *n = end - *pos;
    if (*n && (*line)[*n - 1] == '\r')
        (*n)--;
    *pos = end + 1;
    return true;
}

static int parse_request_line(const char *l, size_t n, srv_head *h, srv_error *e)
{
    size_t i = 0;
    while (i < n && is_tchar((unsigned char)l[i]))
        i++;
    if (i == 0 || i >= n || l[i] != ' ')
        return srv_error_set(e, 400, NULL, NULL, "malformed request line");
    h->method = l;
    h->method_len = i;
    size_t t = ++i;
    while (i < n && (unsigned char)l[i] > 0x20 && (unsigned char)l[i] < 0x7f)
        i++;
    if (i == t || i >= n || l[i] != ' ')
        return srv_error_set(e, 400, NULL, NULL, "malformed request target");
    h->target = l + t;
    h->target_len = i - t;
    const char *v = l + i + 1;
    size_t vn = n - i - 1;
    if (vn != 8 || memcmp(v, "HTTP/", 5) || v[5] < '0' || v[5] > '9' || v[6] != '.' || v[7] < '0' ||
        v[7] > '9')
        return srv_error_set(e, 400, NULL, NULL, "malformed HTTP version");
    if (!memcmp(v + 5, "1.1", 3))
        h->http10 = false;
    else if (!memcmp(v + 5, "1.0", 3))
        h->http10 = true;
    else
        return srv_error_set(e, 505, NULL, NULL, "HTTP version not supported (1.0 and 1.1 are)");
    /* Each query parameter costs libmicrohttpd a parsed record, as a header field does. */
    const char *q = memchr(h->target, '?', h->target_len);
    if (q && q + 1 < h->target + h->target_len) {
        h->n_fields++;
        for (const char *p = q + 1; p < h->target + h->target_len; p++)
            h->n_fields += *p == '&';
    }
    return 0;
}

static int parse_field(const char *l, size_t n, srv_head *h, srv_error *e)
{
    size_t i = 0;
    while (i < n && is_tchar((unsigned char)l[i]))
        i++;
    /* No whitespace before the colon, no obs-fold continuation lines (RFC 9112 5.1, 5.2). */
    if (i == 0 || i >= n || l[i] != ':')
        return srv_error_set(e, 400, NULL, NULL, "malformed header field");
    size_t a = i + 1, b = n;
    for (size_t k = a; k < b; k++) {
        unsigned char c = (unsigned char)l[k];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return srv_error_set(e, 400, NULL, NULL, "control character in a header field");
    }
    while (a < b && (l[a] == ' ' || l[a] == '\t'))
        a++;
    while (b > a && (l[b - 1] == ' ' || l[b - 1] == '\t'))
        b--;
    h->n_fields++;
    srv_framing_add(&h->framing, l, i, l + a, b - a);
    return 0;
}

int srv_head_parse(const char *buf, size_t len, size_t limit, unsigned max_fields, srv_head *h,
                   srv_error *e)
{
    memset(h, 0, sizeof *h);
    size_t scan = len < limit ? len : limit;
    size_t pos = 0;
    const char *l;
    size_t n;
    bool first = true;
    for (;;) {
        if (!next_line(buf, scan, &pos, &l, &n)) {
            if (len >= limit)
                return srv_error_set(e, 431, NULL, NULL,
                                     "request line and headers are over %zu KiB", limit / 1024);
            return 0;
        }
        if (first) {
            if (n == 0)
                continue; /* empty lines before the request line */
            if (parse_request_line(l, n, h, e))
                return -1;
            first = false;
            continue;
        }
        if (n == 0)
            break;
        if (parse_field(l, n, h, e))
            return -1;
    }
    h->len = pos;
    if (h->n_fields > max_fields)
        return srv_error_set(e, 431, NULL, NULL, "more than %u header fields and query parameters",
                             max_fields);
    return srv_framing_check(&h->framing, h->http10, e) ? -1 : 1;
}

int srv_chunk_line_parse(const char *buf, size_t len, uint64_t *size, size_t *line_len,
                         srv_error *e)
{
    size_t scan = len < SRV_CHUNK_LINE_MAX ? len : SRV_CHUNK_LINE_MAX;
    const char *lf = memchr(buf, '\n', scan);
    if (!lf) {
        if (len >= SRV_CHUNK_LINE_MAX)
            return srv_error_set(e, 400, NULL, NULL, "chunk-size line is over %d bytes",
                                 SRV_CHUNK_LINE_MAX);
        return 0;
    }
    size_t n = (size_t)(lf - buf);
    if (n == 0 || buf[n - 1] != '\r')
        return srv_error_set(e, 400, NULL, NULL, "chunk-size line does not end in CRLF");
    n--;
    size_t i = 0;
    uint64_t v = 0;
    while (i < n && hex_digit(buf[i]) >= 0) {
        if (i == 16)
            return srv_error_set(e, 400, NULL, NULL, "chunk size is too large");
        v = v * 16 + (uint64_t)hex_digit(buf[i]);
        i++;
    }
    if (i == 0)
        return srv_error_set(e, 400, NULL, NULL, "malformed chunk-size line");
    /* chunk-ext = *( BWS ";" BWS name [ BWS "=" BWS value ] ): what follows the digits is
     * whitespace then ';', or nothing. Its contents are dropped, so only control bytes are
     * refused in it. */
    size_t k = i;
    while (k < n && (buf[k] == ' ' || buf[k] == '\t'))
        k++;
    if (k < n && buf[k] != ';')
        return srv_error_set(e, 400, NULL, NULL, "malformed chunk-size line");
    if (k == n && k > i)
        return srv_error_set(e, 400, NULL, NULL, "malformed chunk-size line");
    for (; k < n; k++) {
        unsigned char c = (unsigned char)buf[k];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return srv_error_set(e, 400, NULL, NULL, "control character in a chunk extension");
    }
    *size = v;
    *line_len = n + 2;
    return 1;
}

int srv_trailer_line_parse(const char *buf, size_t len, size_t limit, size_t *line_len, bool *last,
                           srv_error *e)
{
    size_t scan = len < limit ? len : limit;
    const char *lf = memchr(buf, '\n', scan);
    if (!lf) {
        if (len >= limit)
            return srv_error_set(e, 431, NULL, NULL, "trailer fields are over %zu KiB",
                                 limit / 1024);
        return 0;
    }
    size_t n = (size_t)(lf - buf);
    if (n == 0 || buf[n - 1] != '\r')
        return srv_error_set(e, 400, NULL, NULL, "trailer line does not end in CRLF");
    n--;
    *line_len = n + 2;
    *last = n == 0;
    if (n == 0)
        return 1;
    srv_head h;
    memset(&h, 0, sizeof h);
    if (parse_field(buf, n, &h, e))
        return -1;
    return 1;
}

static const char *reason(int status)
{
    switch (status) {
    case 400: return "Bad Request";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
    }
}

size_t srv_refusal_format(const srv_error *e, char *out, size_t cap)
{
    if (!cap)
        return 0;
    char *json = srv_error_json(e);
    int n = snprintf(out, cap,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n%s\r\n%s",
                     e->status, reason(e->status), json ? strlen(json) : 0,
                     e->status == 503 ? "Retry-After: 1\r\n" : "", json ? json : "");
    free(json);
    if (n < 0)
        return 0;
    return (size_t)n < cap ? (size_t)n : cap - 1;
}

int srv_target_path(const char *target, size_t len, char *path, size_t cap, srv_error *e)
{
    size_t i = 0;
    /* absolute-form (RFC 9112 3.2.2): a server must accept it; the authority is not ours to
     * route on, so only its path counts. */
    if (len >= 7 && (!strncmp(target, "http://", 7) || !strncmp(target, "HTTP://", 7))) {
        i = 7;
        while (i < len && target[i] != '/' && target[i] != '?')
            i++;
    }
    size_t o = 0;
    if (i >= len || target[i] != '/') {
        if (o + 1 < cap)
            path[o++] = '/'; /* "http://host" and "http://host?q" name the root */
    }
    for (; i < len && target[i] != '?' && target[i] != '#'; i++) {
        unsigned char c = (unsigned char)target[i];
        if (c == '%') {
            int hi = i + 2 < len ? hex_digit(target[i + 1]) : -1;
            int lo = hi >= 0 ? hex_digit(target[i + 2]) : -1;
            if (lo < 0)
                return srv_error_set(e, 400, NULL, NULL, "malformed percent escape in the path");
            c = (unsigned char)(hi * 16 + lo);
            i += 2;
        }
        if (c < 0x20 || c == 0x7f)
            return srv_error_set(e, 400, NULL, NULL, "control character in the path");
        if (o + 1 < cap)
            path[o++] = (char)c;
    }
    if (cap)
        path[o] = '\0';
    return 0;
}

size_t srv_log_escape(const char *s, size_t len, char *out, size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    if (!cap)
        return 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        bool plain = c > 0x20 && c < 0x7f && c != '\\' && c != '"';
        size_t need = plain ? 1 : 4;
        if (o + need >= cap)
            break;
        if (plain) {
            out[o++] = (char)c;
        } else {
            out[o++] = '\\';
            out[o++] = 'x';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        }
    }
    out[o] = '\0';
    return o;
}
