"""Hostile HTTP clients against the real kvserve (issue 10): clients that vanish in every state
of a connection, errors libmicrohttpd would answer itself (431, 505, a bad Content-Length),
many small headers, the connection limit, request framing (RFC 9112: Content-Length with
Transfer-Encoding, conflicting lengths, unknown codings, absolute-form targets, control bytes
in paths), and how cancels are logged.

Raw sockets on 127.0.0.1 only; every wait is bounded. Each server is started for its class,
so a case that leaves connections behind cannot starve the next one."""
import json
import os
import re
import socket
import time
import unittest

import kvs_e2e as e2e


def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def wait_fds(pid, base, timeout):
    """Until the server's fds are back to base; returns the last count."""
    deadline = time.time() + timeout
    n = fd_count(pid)
    while n > base and time.time() < deadline:
        time.sleep(0.05)
        n = fd_count(pid)
    return n


def exchange(port, data, timeout=5.0, half_close=False):
    """Sends data on a fresh connection and reads until the server closes (or timeout).
    Returns (bytes, closed): closed is False if the server kept the connection open."""
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(timeout)
    out, closed = b"", False
    try:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        while True:
            b = s.recv(65536)
            if not b:
                closed = True
                break
            out += b
    except ConnectionResetError:
        closed = True
    except socket.timeout:
        pass
    finally:
        s.close()
    return out, closed


def read_one(s, timeout=5.0):
    """Reads one response with a Content-Length body from s: (status, headers, body)."""
    s.settimeout(timeout)
    buf = b""
    while b"\r\n\r\n" not in buf:
        b = s.recv(65536)
        if not b:
            return None, {}, buf
        buf += b
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length", "0"))
    while len(rest) < n:
        b = s.recv(65536)
        if not b:
            break
        rest += b
    return int(lines[0].split(" ")[1]), headers, rest[:n]


def read_response(s, buf=b"", timeout=10.0):
    """Reads one whole response from s, framed by Content-Length or chunked: returns (status,
    headers, body, rest) where rest is what followed it; status None if s closed first."""
    s.settimeout(timeout)

    def more():
        b = s.recv(65536)
        if not b:
            raise EOFError
        return b
    try:
        while b"\r\n\r\n" not in buf:
            buf += more()
        head, _, buf = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        body = b""
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                while b"\r\n" not in buf:
                    buf += more()
                size_line, _, buf = buf.partition(b"\r\n")
                n = int(size_line.split(b";")[0], 16)
                while len(buf) < n + 2:
                    buf += more()
                body += buf[:n]
                buf = buf[n + 2:]
                if n == 0:
                    break
        else:
            n = int(headers.get("content-length", "0"))
            while len(buf) < n:
                buf += more()
            body, buf = buf[:n], buf[n:]
        return int(lines[0].split(" ")[1]), headers, body, buf
    except EOFError:
        return None, {}, buf, b""


def read_to_close(s, buf=b"", timeout=5.0):
    """Reads s until the server closes it: (bytes, closed)."""
    s.settimeout(timeout)
    try:
        while True:
            b = s.recv(65536)
            if not b:
                return buf, True
            buf += b
    except ConnectionResetError:
        return buf, True
    except socket.timeout:
        return buf, False


HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"

# Every head the front door refuses on a first request: (name, head, status).
BAD_HEADS = [
    ("over 32 KiB", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (40 << 10) +
     b"\r\n\r\n", 431),
    ("too many fields", b"GET /health HTTP/1.1\r\nHost: x\r\n" +
     b"".join(b"X-%d:\r\n" % i for i in range(1100)) + b"\r\n", 431),
    ("bad version", b"GET /health HTTP/2.5\r\nHost: x\r\n\r\n", 505),
    ("malformed version", b"GET /health HTTP/1.x\r\nHost: x\r\n\r\n", 400),
    ("malformed request line", b"GET  /health HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    ("negative Content-Length", b"POST /tokenize HTTP/1.1\r\nHost: x\r\n"
     b"Content-Length: -1\r\n\r\n", 400),
    ("Content-Length not a number", b"POST /tokenize HTTP/1.1\r\nHost: x\r\n"
     b"Content-Length: 1x\r\n\r\n", 400),
    ("Content-Length with Transfer-Encoding", b"POST /tokenize HTTP/1.1\r\nHost: x\r\n"
     b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    ("conflicting Content-Lengths", b"POST /tokenize HTTP/1.1\r\nHost: x\r\n"
     b"Content-Length: 15\r\nContent-Length: 2\r\n\r\n{\"prompt\":\"ab\"}", 400),
    ("gzip transfer coding", b"POST /tokenize HTTP/1.1\r\nHost: x\r\n"
     b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501),
    ("chunked twice", b"POST /tokenize HTTP/1.1\r\nHost: x\r\n"
     b"Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", 400),
    ("obs-fold", b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: b\r\n c\r\n\r\n", 400),
    ("control byte in a field", b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: b\x01c\r\n\r\n",
     400),
    ("%00 in the path", b"GET /health%00x HTTP/1.1\r\nHost: x\r\n\r\n", 400),
]

CHUNKED_HEAD = (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")
TOKENIZE_BODY = b'{"prompt": "Once upon a time"}'

# Chunked bodies with a bad size line, chunk end or trailer: (name, body, status).
BAD_CHUNKS = [
    ("not hex", b"zz\r\n" + TOKENIZE_BODY + b"\r\n0\r\n\r\n", 400),
    ("empty size line", b"\r\n" + TOKENIZE_BODY + b"\r\n0\r\n\r\n", 400),
    ("negative size", b"-1e\r\n" + TOKENIZE_BODY + b"\r\n0\r\n\r\n", 400),
    ("space before the size", b" 1e\r\n" + TOKENIZE_BODY + b"\r\n0\r\n\r\n", 400),
    ("bare LF", b"1e\n" + TOKENIZE_BODY + b"\r\n0\r\n\r\n", 400),
    ("17 digits", b"0000000000000001e\r\n" + TOKENIZE_BODY + b"\r\n0\r\n\r\n", 400),
    ("size over 64 bits", b"fffffffffffffffff\r\n" + TOKENIZE_BODY, 400),
    ("size line over 1 KiB", b"1e;" + b"a" * 2000 + b"\r\n" + TOKENIZE_BODY +
     b"\r\n0\r\n\r\n", 400),
    ("control byte in an extension", b"1e;a=\x01\r\n" + TOKENIZE_BODY + b"\r\n0\r\n\r\n",
     400),
    ("data longer than its size", b"1d\r\n" + TOKENIZE_BODY + b"\r\n0\r\n\r\n", 400),
    ("malformed trailer", b"1e\r\n" + TOKENIZE_BODY + b"\r\n0\r\nno colon\r\n\r\n", 400),
    ("trailer with bare LF", b"1e\r\n" + TOKENIZE_BODY + b"\r\n0\r\nX-A: b\n\r\n", 400),
    ("trailer over 32 KiB", b"1e\r\n" + TOKENIZE_BODY + b"\r\n0\r\nX-Big: " +
     b"a" * (40 << 10) + b"\r\n\r\n", 431),
]


class HostileBase(unittest.TestCase):
    ARGS = ()
    srv = None

    @classmethod
    def setUpClass(cls):
        e2e.require_server()
        cls.srv = e2e.Server(*cls.ARGS)

    @classmethod
    def tearDownClass(cls):
        if cls.srv:
            # SIGKILL if SIGTERM hangs: a failing case may have left it unable to stop.
            rc = cls.srv.stop(timeout=15)
            cls.srv = None
            if rc != 0:
                raise AssertionError("kvserve exited with %d after SIGTERM" % rc)

    def health(self, timeout=2.0):
        """GET /health on a fresh connection; returns the status or None (no answer in time)."""
        out, _ = exchange(self.srv.port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: "
                          b"close\r\n\r\n", timeout=timeout)
        m = re.match(rb"HTTP/1\.1 (\d+)", out)
        return int(m.group(1)) if m else None

    def health_within(self, seconds):
        """Retries /health until it answers 200 or seconds pass; returns the last status."""
        deadline = time.time() + seconds
        st = self.health()
        while st != 200 and time.time() < deadline:
            time.sleep(0.05)
            st = self.health()
        return st

    def check_json_error(self, out, status):
        """out is exactly one response: the status, well-formed headers, a JSON error body of
        the OpenAI shape and the length it declares."""
        self.assertEqual(out.count(b"HTTP/1.1 "), 1, out[:400])
        head, sep, body = out.partition(b"\r\n\r\n")
        self.assertTrue(sep, out[:400])
        lines = head.decode("latin-1").split("\r\n")
        self.assertTrue(lines[0].startswith("HTTP/1.1 %d " % status), lines[0])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        self.assertTrue(headers.get("content-type", "").startswith("application/json"), headers)
        self.assertEqual(int(headers["content-length"]), len(body), out[:400])
        err = json.loads(body)["error"]
        self.assertEqual(set(err), {"message", "type", "param", "code"})
        return headers, err


class VanishedClients(HostileBase):
    """Item 2: a closed or half-closed client frees its slot promptly in every state, even with
    --connection-timeout 0 (no timeout would ever free it)."""
    ARGS = ("--connection-timeout", "0", "--max-connections", "64", "--max-num-seqs", "1")

    def setUp(self):
        self.base = wait_fds(self.srv.proc.pid, 0, 0)

    def test_partial_heads_then_close(self):
        """1,100 x (connect, part of a request head, close) with 64 slots: /health answers
        within seconds and every socket is released."""
        for i in range(1100):
            s = socket.create_connection(("127.0.0.1", self.srv.port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
            s.close()
        self.assertEqual(self.health_within(3), 200)
        self.assertLessEqual(wait_fds(self.srv.proc.pid, self.base, 3), self.base)

    def test_partial_bodies_then_close(self):
        """Whole heads, part of the body, then close (data and FIN arrive together)."""
        for i in range(100):
            s = socket.create_connection(("127.0.0.1", self.srv.port))
            s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{\"prompt\": \"on")
            s.close()
        self.assertEqual(self.health_within(3), 200)
        self.assertLessEqual(wait_fds(self.srv.proc.pid, self.base, 3), self.base)

    def test_half_close_kept_alive(self):
        """Connections kept alive after a response, whose clients then send part of a second
        request and half-close (past the front door: MHD reads these)."""
        socks = []
        for i in range(40):
            s = socket.create_connection(("127.0.0.1", self.srv.port))
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            self.assertEqual(read_one(s)[0], 200)
            socks.append(s)
        for s in socks:
            s.sendall(b"GET /health HTTP/1.1\r\nHo")
            s.shutdown(socket.SHUT_WR)
        try:
            self.assertLessEqual(wait_fds(self.srv.proc.pid, self.base, 3), self.base)
        finally:
            for s in socks:
                s.close()

    def gen_request(self, stream):
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 480, "ignore_eos": True,
                           "stream": stream, "n": 1}).encode()
        s = socket.create_connection(("127.0.0.1", self.srv.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        return s

    def test_half_close_streaming_and_queued(self):
        """A stream whose client half-closes after a few events, and a request queued behind
        it (--max-num-seqs 1) whose client half-closes: both are cancelled and their sockets
        released while nothing else would end them."""
        running = self.gen_request(True)
        got = b""
        running.settimeout(10)
        while got.count(b"data: ") < 3:
            got += running.recv(4096)
        queued = self.gen_request(False)
        deadline = time.time() + 5
        while self.srv.metrics()["kvserve_num_requests_waiting"] < 1 and time.time() < deadline:
            time.sleep(0.02)
        queued.shutdown(socket.SHUT_WR)
        running.shutdown(socket.SHUT_WR)
        try:
            deadline = time.time() + 3
            m = self.srv.metrics()
            while (m["kvserve_num_requests_running"] + m["kvserve_num_requests_waiting"] > 0
                   and time.time() < deadline):
                time.sleep(0.05)
                m = self.srv.metrics()
            self.assertEqual(m["kvserve_num_requests_waiting"], 0, "queued request not cancelled")
            self.assertEqual(m["kvserve_num_requests_running"], 0, "stream not cancelled")
            # with --connection-timeout 0 nothing but the cancel frees them, however long we
            # wait: 3 s, or 15 under a sanitizer (a ThreadSanitizer run beside another suite
            # once took longer than 3 s for one socket; alone it passed 7 of 7)
            wait = 15 if e2e.SANITIZED else 3
            self.assertLessEqual(wait_fds(self.srv.proc.pid, self.base, wait), self.base)
        finally:
            running.close()
            queued.close()


class MhdErrorsAreJson(HostileBase):
    """Item 6 and 7: errors libmicrohttpd used to answer in HTML, and heads well under the
    documented 32 KiB that it used to refuse or drop."""
    ARGS = ("--connection-timeout", "5")

    def test_head_over_32k_is_431_json(self):
        out, closed = exchange(self.srv.port, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " +
                               b"a" * (40 << 10) + b"\r\n\r\n")
        self.check_json_error(out, 431)
        self.assertTrue(closed)

    def test_too_many_fields_is_431_json(self):
        fields = b"".join(b"X-%d:\r\n" % i for i in range(1100))  # 1,100 fields in 8 KiB
        out, closed = exchange(self.srv.port, b"GET /health HTTP/1.1\r\nHost: x\r\n" + fields +
                               b"\r\n")
        self.check_json_error(out, 431)

    def test_bad_version_is_505_json(self):
        out, closed = exchange(self.srv.port, b"GET /health HTTP/2.5\r\nHost: x\r\n\r\n")
        self.check_json_error(out, 505)
        self.assertTrue(closed)

    def test_negative_content_length_is_one_400(self):
        """Content-Length: -1 used to get the status line and headers twice."""
        out, closed = exchange(self.srv.port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\n"
                               b"Content-Length: -1\r\n\r\n")
        self.check_json_error(out, 400)
        self.assertTrue(closed)

    def test_malformed_request_line_is_400_json(self):
        out, closed = exchange(self.srv.port, b"GET  /health HTTP/1.1\r\nHost: x\r\n\r\n")
        self.check_json_error(out, 400)

    def test_many_small_headers_and_long_query(self):
        """448 small headers (3.9 KB), a 1.9 KB query of 380 parameters, and a head at both
        limits (1,000 fields in just under 32 KiB) are served."""
        many = b"".join(b"X-H%03d: v\r\n" % i for i in range(448))
        query = b"&".join(b"a%d=b" % i for i in range(380))
        self.assertGreater(len(query), 1900)
        big = b"".join(b"X-F%04d: %s\r\n" % (i, b"v" * 21) for i in range(1000))
        self.assertLess(len(big), (32 << 10) - 100)
        for head in [b"GET /health HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n",
                     b"GET /health?" + query + b" HTTP/1.1\r\nHost: x\r\n\r\n",
                     b"GET /health HTTP/1.1\r\nHost: x\r\n" + big + b"\r\n"]:
            s = socket.create_connection(("127.0.0.1", self.srv.port))
            try:
                s.sendall(head)
                st, _, body = read_one(s)
                self.assertEqual(st, 200, head[:60])
                self.assertEqual(json.loads(body), {"status": "ok"})
            finally:
                s.close()


class LaterRequests(HostileBase):
    """Issue 10, last item: every error is JSON, also those libmicrohttpd would make itself on
    a kept-alive connection's later requests and inside chunked bodies (the relay sees every
    request; see server/relay.c)."""
    ARGS = ("--connection-timeout", "10")

    def refused_after(self, n_good, bad, status, what):
        """n_good /health requests on one connection, then bad: n_good 200s, then exactly one
        JSON error with the status and Connection: close, then the close."""
        s = socket.create_connection(("127.0.0.1", self.srv.port))
        try:
            for i in range(n_good):
                s.sendall(HEALTH)
                st, _, body, rest = read_response(s)
                self.assertEqual(st, 200, what)
                self.assertEqual(rest, b"", what)
            s.sendall(bad)
            out, closed = read_to_close(s)
        finally:
            s.close()
        headers, err = self.check_json_error(out, status)
        self.assertEqual(headers.get("connection", "").lower(), "close", what)
        self.assertTrue(closed, what)
        return err

    def test_bad_heads_on_a_kept_alive_connection(self):
        for name, head, status in BAD_HEADS:
            with self.subTest(name):
                self.refused_after(2, head, status, name)

    def test_bad_chunks_first_and_kept_alive(self):
        for name, body, status in BAD_CHUNKS:
            for n_good in (0, 1):
                with self.subTest(name, n_good=n_good):
                    self.refused_after(n_good, CHUNKED_HEAD + body, status, name)

    def test_refusals_are_logged_and_counted(self):
        before = self.srv.metrics()
        self.refused_after(1, b"GET /metrics HTTP/9.9\r\nHost: x\r\n\r\n", 505, "505")
        self.refused_after(1, CHUNKED_HEAD + b"zz\r\n", 400, "400")
        time.sleep(0.2)
        text = self.srv.stderr()
        self.assertRegex(text, r"access id=- method=GET route=/metrics status=505 .*refused=")
        self.assertRegex(text, r"access id=- method=POST route=/tokenize status=400 .*"
                         r"refused=\"malformed chunk-size line\"")
        after = self.srv.metrics()
        for st, n in (("400", 1), ("other", 1)):
            k = 'kvserve_requests_total{status="%s"}' % st
            self.assertEqual(after[k] - before.get(k, 0), n, k)

    def test_good_chunked_bodies(self):
        """Chunked bodies in pieces of every size, with extensions and trailer fields, split
        across writes: the same answer as the Content-Length body."""
        s = socket.create_connection(("127.0.0.1", self.srv.port))
        try:
            s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                      b"\r\nContent-Length: %d\r\n\r\n%s" % (len(TOKENIZE_BODY), TOKENIZE_BODY))
            st, _, want, _ = read_response(s)
            self.assertEqual(st, 200)
            pieces = [b"%x;ext=1\r\n%s\r\n" % (1, TOKENIZE_BODY[:1]),
                      b"%X\r\n%s\r\n" % (9, TOKENIZE_BODY[1:10]),
                      b"%x ; a=\"b c\"\r\n%s\r\n" % (20, TOKENIZE_BODY[10:]),
                      b"0\r\nX-Trailer: yes\r\n\r\n"]
            for split in (False, True):
                req = CHUNKED_HEAD + b"".join(pieces)
                if split:
                    for i in range(0, len(req), 7):
                        s.sendall(req[i:i + 7])
                        time.sleep(0.002)
                else:
                    s.sendall(req)
                st, _, body, rest = read_response(s)
                self.assertEqual(st, 200, body)
                self.assertEqual(json.loads(body), json.loads(want))
                self.assertEqual(rest, b"")
        finally:
            s.close()

    def test_pipelined_good_requests(self):
        """Twelve requests in one write: twelve responses, in order, each whole."""
        prompts = ["Once upon a time %d" % i for i in range(6)]
        want = {}
        for p in prompts:
            st, body = self.srv.post("/tokenize", {"prompt": p})
            self.assertEqual(st, 200)
            want[p] = body
        reqs = b""
        order = []
        for p in prompts:
            b = json.dumps({"prompt": p}).encode()
            reqs += (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nContent-Length: %d\r\n\r\n%s" % (len(b), b))
            reqs += HEALTH
            order += [p, None]
        s = socket.create_connection(("127.0.0.1", self.srv.port))
        try:
            s.sendall(reqs)
            buf = b""
            for p in order:
                st, _, body, buf = read_response(s, buf)
                self.assertEqual(st, 200, p)
                if p is None:
                    self.assertEqual(json.loads(body), {"status": "ok"})
                else:
                    self.assertEqual(json.loads(body), want[p], p)
            s.sendall(HEALTH)
            st, _, _, buf = read_response(s, buf)
            self.assertEqual((st, buf), (200, b""))
        finally:
            s.close()

    def gen_body(self, stream, max_tokens=200):
        b = json.dumps({"prompt": "Once upon a time", "max_tokens": max_tokens,
                        "ignore_eos": True, "stream": stream, "temperature": 0}).encode()
        return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                b"\r\nContent-Length: %d\r\n\r\n%s" % (len(b), b))

    def test_bad_request_behind_a_slow_good_one(self):
        """A generation and a bad head in one write: the whole completion (plain, then
        streamed) comes first, then the JSON error, then the close."""
        for stream in (False, True):
            with self.subTest(stream=stream):
                s = socket.create_connection(("127.0.0.1", self.srv.port))
                try:
                    s.sendall(self.gen_body(stream) + b"GET /health HTTP/2.5\r\nHost: x\r\n\r\n")
                    st, headers, body, rest = read_response(s, timeout=60)
                    self.assertEqual(st, 200, body[:200])
                    if stream:
                        events, done = e2e.parse_sse(body.decode())
                        self.assertTrue(done)
                        self.assertGreater(len(events), 100)
                    else:
                        self.assertEqual(json.loads(body)["usage"]["completion_tokens"], 200)
                    out, closed = read_to_close(s, rest)
                finally:
                    s.close()
                self.check_json_error(out, 505)
                self.assertTrue(closed)

    def test_bad_chunk_behind_a_slow_good_one(self):
        s = socket.create_connection(("127.0.0.1", self.srv.port))
        try:
            s.sendall(self.gen_body(False) + CHUNKED_HEAD + b"1e\n")
            st, _, body, rest = read_response(s, timeout=60)
            self.assertEqual(st, 200, body[:200])
            self.assertEqual(json.loads(body)["usage"]["completion_tokens"], 200)
            out, closed = read_to_close(s, rest)
        finally:
            s.close()
        _, err = self.check_json_error(out, 400)
        self.assertIn("CRLF", err["message"])

    def test_stream_to_a_client_that_stops_reading(self):
        """A client that reads nothing of a long stream for a while: the server goes on
        answering others, and the stream is whole once the client reads again."""
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", self.srv.port))
        try:
            s.sendall(self.gen_body(True, max_tokens=480))
            time.sleep(0.5)
            for i in range(5):
                # a generous bound: sanitizer builds on a loaded machine are slow
                self.assertEqual(self.health(timeout=30), 200)
                st, body = self.srv.post("/v1/completions", {"prompt": "Once", "max_tokens": 8})
                self.assertEqual(st, 200, body)
                time.sleep(0.2)
            st, _, body, rest = read_response(s, timeout=60)
            self.assertEqual(st, 200)
            events, done = e2e.parse_sse(body.decode())
            self.assertTrue(done)
            text = "".join(ev["choices"][0]["text"] for ev in events if ev.get("choices"))
            st, whole = self.srv.post("/v1/completions", {
                "prompt": "Once upon a time", "max_tokens": 480, "ignore_eos": True,
                "temperature": 0})
            self.assertEqual(text, whole["choices"][0]["text"])
            self.assertEqual(rest, b"")
        finally:
            s.close()

    def test_http10_and_keep_alive(self):
        out, closed = exchange(self.srv.port, b"GET /health HTTP/1.0\r\n\r\n")
        self.assertTrue(out.startswith(b"HTTP/1."), out[:100])
        self.assertTrue(out.endswith(b'{"status":"ok"}'), out[-100:])
        self.assertTrue(closed)
        s = socket.create_connection(("127.0.0.1", self.srv.port))
        try:
            for i in range(20):
                s.sendall(HEALTH)
                self.assertEqual(read_response(s)[0], 200)
        finally:
            s.close()


class ConnectionLimit(HostileBase):
    """Item 8: at --max-connections a new client gets a 503 JSON error and a close at once,
    instead of waiting in the listen queue."""
    ARGS = ("--max-connections", "8", "--connection-timeout", "30")

    def test_refused_fast_with_json(self):
        held = []
        try:
            for i in range(8):
                s = socket.create_connection(("127.0.0.1", self.srv.port))
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                self.assertEqual(read_one(s)[0], 200)
                held.append(s)
            t0 = time.time()
            out, closed = exchange(self.srv.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
                                   timeout=3)
            self.assertLess(time.time() - t0, 3)
            headers, err = self.check_json_error(out, 503)
            self.assertTrue(closed)
            self.assertIn("retry-after", headers)
        finally:
            for s in held:
                s.close()
        self.assertEqual(self.health_within(3), 200)


class Framing(HostileBase):
    """Item 10: RFC 9112 request framing and targets."""
    ARGS = ("--connection-timeout", "5")

    def test_content_length_with_transfer_encoding(self):
        """400 and close; the request smuggled after the chunked body is never answered."""
        out, closed = exchange(self.srv.port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\n"
                               b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
                               b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", timeout=3)
        self.check_json_error(out, 400)
        self.assertTrue(closed)

    def test_on_a_kept_alive_connection(self):
        """The same checks on a connection's second request (past the front door)."""
        s = socket.create_connection(("127.0.0.1", self.srv.port))
        try:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            self.assertEqual(read_one(s)[0], 200)
            s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
                      b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            st, _, body = read_one(s)
            self.assertEqual(st, 400, body)
            self.assertEqual(set(json.loads(body)["error"]), {"message", "type", "param", "code"})
            s.settimeout(3)
            rest = b""
            try:
                while True:
                    b = s.recv(4096)
                    if not b:
                        break
                    rest += b
            except (socket.timeout, ConnectionResetError):
                pass
            self.assertEqual(rest, b"", "the smuggled request was answered")
        finally:
            s.close()
        s = socket.create_connection(("127.0.0.1", self.srv.port))
        try:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            self.assertEqual(read_one(s)[0], 200)
            s.sendall(b"GET /health%00x HTTP/1.1\r\nHost: x\r\n\r\n")
            self.assertIn(read_one(s)[0], (400, 404))
        finally:
            s.close()

    def test_conflicting_content_lengths(self):
        """Two lengths: 400 (the first of them used to win, here a valid /tokenize body)."""
        out, _ = exchange(self.srv.port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Length: 15\r\nContent-Length: 2\r\n\r\n"
                          b'{"prompt":"ab"}', timeout=3)
        _, err = self.check_json_error(out, 400)
        self.assertIn("Content-Length", err["message"])

    def test_unknown_transfer_coding(self):
        t0 = time.time()
        out, _ = exchange(self.srv.port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\n"
                          b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", timeout=4)
        self.assertLess(time.time() - t0, 4)
        self.check_json_error(out, 501)

    def test_absolute_form_target(self):
        out, _ = exchange(self.srv.port, b"GET http://127.0.0.1:8080/health HTTP/1.1\r\nHost: x"
                          b"\r\nConnection: close\r\n\r\n")
        self.assertTrue(out.startswith(b"HTTP/1.1 200 "), out[:200])
        self.assertTrue(out.endswith(b'{"status":"ok"}'), out[-100:])

    def test_control_bytes_in_path(self):
        for target in [b"/health%00x", b"/health%0ax", b"/health%7f", b"/v1/models%00"]:
            out, _ = exchange(self.srv.port, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n"
                              b"Connection: close\r\n\r\n")
            m = re.match(rb"HTTP/1\.1 (\d+)", out)
            self.assertTrue(m, out[:200])
            self.assertIn(int(m.group(1)), (400, 404), target)

    def test_log_lines_escape_client_bytes(self):
        """A %0a or raw bytes in a target cannot start a log line of their own."""
        forged = b"2026-01-01T00:00:00.000Z info  access id=forged"
        exchange(self.srv.port, b"GET /x%0a" + forged.replace(b" ", b"%20") +
                 b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        exchange(self.srv.port, b"GET /y\"\\\xff HTTP/1.1\r\nHost: x\r\nConnection: close"
                 b"\r\n\r\n")
        time.sleep(0.2)
        for line in self.srv.stderr().splitlines():
            self.assertNotIn("id=forged", line.split("route=")[0], line)


class CancelLogging(HostileBase):
    """Item 11: a client that cancels mid-generation is logged with the tokens generated, and
    as a cancel, not as an internal error."""
    ARGS = ("--connection-timeout", "5")

    def test_cancel_is_logged_cleanly(self):
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True,
                           "stream": True}).encode()
        s = socket.create_connection(("127.0.0.1", self.srv.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        got = b""
        s.settimeout(10)
        while got.count(b"data: ") < 12:
            got += s.recv(4096)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()  # a reset, as a killed client's kernel sends with unread data
        deadline = time.time() + 5
        line = None
        while time.time() < deadline and line is None:
            for ln in self.srv.stderr().splitlines():
                if "access" in ln and "status=499" in ln:
                    line = ln
            time.sleep(0.05)
        self.assertIsNotNone(line, "no access line for the cancelled stream")
        n = int(re.search(r"completion_tokens=(\d+)", line).group(1))
        self.assertGreaterEqual(n, 10, line)
        text = self.srv.stderr()
        self.assertNotIn("internal error", text)
        self.assertNotIn("warn  http", text)


if __name__ == "__main__":
    unittest.main()
