/* RFC 9112 checks of a request head, as pure functions over bytes, so the front door (raw
 * sockets) and the libmicrohttpd handlers (parsed fields) apply the same rules and unit tests
 * need no server. A failure fills srv_error exactly as the JSON response must carry it. */
#ifndef KVS_SERVER_HTTP_HEAD_H
#define KVS_SERVER_HTTP_HEAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/api.h"

/* Message framing gathered field by field (Content-Length, Transfer-Encoding; others are
 * ignored). Zero-initialise, add every field of one request, then check. */
typedef struct srv_framing {
    unsigned n_length;   /* Content-Length values (list members count one each) */
    uint64_t length;     /* the first value, saturated at UINT64_MAX */
    bool length_bad;     /* a value that is not 1*DIGIT */
    bool length_differs; /* two values differ */
    unsigned n_codings;  /* transfer codings over every Transfer-Encoding field */
    unsigned n_chunked;
    bool chunked_last;   /* the last coding seen is chunked */
    bool unknown_coding; /* a coding other than chunked */
} srv_framing;

void srv_framing_add(srv_framing *f, const char *name, size_t name_len, const char *value,
                     size_t value_len);
/* 0 if the body's framing is unambiguous; else -1 with e: 400 (Content-Length with
 * Transfer-Encoding, a bad or conflicting length, chunked not exactly once and last, or any
 * transfer coding in HTTP/1.0) or 501 (a transfer coding other than chunked). */
int srv_framing_check(const srv_framing *f, bool http10, srv_error *e);

typedef struct srv_head {
    size_t len;         /* bytes of the head, through its empty line */
    const char *method; /* not terminated: method_len bytes inside the buffer */
    size_t method_len;
    const char *target; /* the request target as sent, target_len bytes inside the buffer */
    size_t target_len;
    bool http10;
    unsigned n_fields; /* header fields plus query parameters */
    srv_framing framing;
} srv_head;

/* Looks for one request head at the start of buf[0, len). Returns 1 with *h (pointers into
 * buf) when a complete head is valid; 0 when it is incomplete and could still fit (len <
 * limit); -1 with e otherwise: 400 (malformed request line or field, bad framing), 431 (the
 * head is over limit bytes or has more than max_fields fields and query parameters), 501,
 * 505 (an HTTP version other than 1.0 and 1.1). Empty lines before the request line are
 * skipped, as RFC 9112 section 2.2 allows; they count towards len. */
int srv_head_parse(const char *buf, size_t len, size_t limit, unsigned max_fields, srv_head *h,
                   srv_error *e);

/* A chunk-size line (RFC 9112 section 7.1) at the start of buf[0, len): 1*HEXDIG, an optional
 * chunk extension (";" and no control character but HTAB), CRLF. Returns 1 with *size and
 * *line_len (through the CRLF); 0 when no LF is within len and len < SRV_CHUNK_LINE_MAX; -1
 * with a 400 in e otherwise (no digits, more than 16 digits, a bare LF, a control byte, or a
 * line of SRV_CHUNK_LINE_MAX bytes or more). Stricter than libmicrohttpd so that nothing it
 * would answer itself reaches it. */
#define SRV_CHUNK_LINE_MAX 1024
int srv_chunk_line_parse(const char *buf, size_t len, uint64_t *size, size_t *line_len,
                         srv_error *e);

/* One line of a chunked body's trailer section at buf[0, len): a header field or the empty
 * line that ends the body, either ending in CRLF. Returns 1 with *line_len and *last (the
 * empty line); 0 when no LF is within len and len < limit; -1 with e: 400 (a malformed field,
 * a bare LF), 431 (no line end within limit bytes). */
int srv_trailer_line_parse(const char *buf, size_t len, size_t limit, size_t *line_len, bool *last,
                           srv_error *e);

/* The whole response a refused request gets: status line, a JSON error body for e,
 * "Connection: close" (and Retry-After on 503). Written into out (at most cap - 1 bytes);
 * returns the length. */
size_t srv_refusal_format(const srv_error *e, char *out, size_t cap);

/* The path of a request target (origin-form, or absolute-form "http://host/path", whose
 * authority is dropped), without its query, percent-decoded into path (NUL-terminated,
 * truncated to cap - 1 bytes). -1 with a 400 in e if the target or a decoded byte is a
 * control character (%00-%1F, %7F) or a percent escape is malformed. */
int srv_target_path(const char *target, size_t len, char *path, size_t cap, srv_error *e);

/* Copies s[0, len) for a log line into out (NUL-terminated, truncated to fit cap): bytes
 * outside printable ASCII, space, backslash and '"' become \xHH, so no client text can end a
 * log line or forge a field. Returns the length written. */
size_t srv_log_escape(const char *s, size_t len, char *out, size_t cap);

#endif
