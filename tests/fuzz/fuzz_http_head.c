/* libFuzzer target: the request framing checks every client byte meets (server/http_head.h):
 * request heads, chunk-size lines and trailer lines, as the relay applies them. Checks
 * invariants, not just crashes: a parsed unit lies inside the input and ends in its line end,
 * a refusal carries one of the documented statuses, and nothing is refused that is merely
 * incomplete. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/http_head.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "invariant failed: %s (%s:%d)\n", #x, __FILE__, __LINE__);             \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *buf = (const char *)data;
    srv_error e;
    srv_head h;
    int st = srv_head_parse(buf, size, 4096, 64, &h, &e);
    if (st == 1) {
        CHECK(h.len <= size && h.len >= 2 && buf[h.len - 1] == '\n');
        CHECK(h.method >= buf && h.method + h.method_len <= buf + h.len);
        CHECK(h.target >= buf && h.target + h.target_len <= buf + h.len);
    } else if (st < 0) {
        CHECK(e.status == 400 || e.status == 431 || e.status == 501 || e.status == 505);
    } else {
        CHECK(st == 0 && size < 4096);
    }

    uint64_t csize;
    size_t n;
    st = srv_chunk_line_parse(buf, size, &csize, &n, &e);
    if (st == 1) {
        CHECK(n >= 3 && n <= size && n <= SRV_CHUNK_LINE_MAX && !memcmp(buf + n - 2, "\r\n", 2));
        CHECK(!memchr(buf, '\n', n - 1));
    } else if (st < 0) {
        CHECK(e.status == 400);
    } else {
        CHECK(st == 0 && size < SRV_CHUNK_LINE_MAX && !memchr(buf, '\n', size));
    }

    bool last;
    st = srv_trailer_line_parse(buf, size, 1024, &n, &last, &e);
    if (st == 1) {
        CHECK(n >= 2 && n <= size && !memcmp(buf + n - 2, "\r\n", 2));
        CHECK(last == (n == 2));
    } else if (st < 0) {
        CHECK(e.status == 400 || e.status == 431);
    } else {
        CHECK(st == 0 && size < 1024 && !memchr(buf, '\n', size));
    }
    return 0;
}
