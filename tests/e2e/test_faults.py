"""Hostile clients and faults against the real kvserve: clients killed mid-stream or while
queued, slow readers, slowloris headers, oversized and deeply nested bodies, huge prompts,
invalid UTF-8, non-finite numbers, absurd `n`, an exhausted pool, SIGTERM under load.

Every case checks three things: the right status (or a clean close), that other clients are
unaffected (a concurrent normal request still returns the reference text), and that nothing
leaked (kv_blocks_used back to 0 in /metrics, the server's open fds back to their baseline in
/proc/PID/fd). One server (short --connection-timeout) serves most cases; cases that need
other limits start their own."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

import kvs_e2e as e2e

srv = None
CASE = None  # the first reference case: a normal request whose exact text is known
TIMEOUT = 2  # --connection-timeout of the shared server, seconds


def setUpModule():
    global srv, CASE
    e2e.require_server()
    srv = e2e.Server("--connection-timeout", str(TIMEOUT), "--max-body-bytes", "1048576")
    CASE = e2e.load_reference()[0]


def tearDownModule():
    if srv:
        rc = srv.stop()
        if rc != 0:
            raise AssertionError("kvserve exited with %d after SIGTERM" % rc)


def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def ref_body():
    n = len(CASE["completion_ids"]) + (1 if CASE["stop"] == "bos" else 0)
    return {"prompt": CASE["prompt"], "max_tokens": n, "temperature": 0}


def raw_post(port, path, body, rcvbuf=None, extra_headers=b""):
    """Sends a POST on a raw socket and returns the socket without reading."""
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", port))
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s"
              b"Content-Length: %d\r\n\r\n%s" % (path.encode(), extra_headers, len(data), data))
    return s


def read_response(s, timeout=10):
    """Reads one HTTP response (Content-Length bodies only) from a raw socket."""
    s.settimeout(timeout)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    if not buf:
        return None, b""  # closed without a response
    head, _, rest = buf.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    while len(rest) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, rest


class Fault(unittest.TestCase):
    """Base: records the server's fd baseline and checks the no-leak conditions after."""
    server = None

    def s(self):
        return self.server or srv

    def setUp(self):
        self.wait_quiet()
        self.fd_base = fd_count(self.s().proc.pid)

    def wait_quiet(self, timeout=10.0):
        """Until no request runs or waits and no KV block is held."""
        deadline = time.time() + timeout
        while True:
            m = self.s().metrics()
            if (m["kvserve_kv_blocks_used"] == 0 and m["kvserve_num_requests_running"] == 0
                    and m["kvserve_num_requests_waiting"] == 0):
                return m
            if time.time() > deadline:
                return m
            time.sleep(0.05)

    def assert_no_leak(self, timeout=10.0):
        m = self.wait_quiet(timeout)
        self.assertEqual(m["kvserve_kv_blocks_used"], 0, "KV blocks still held")
        self.assertEqual(m["kvserve_num_requests_waiting"], 0, "requests still waiting")
        self.assertEqual(m["kvserve_num_requests_running"], 0, "requests still running")
        deadline = time.time() + timeout
        pid = self.s().proc.pid
        while fd_count(pid) > self.fd_base and time.time() < deadline:
            time.sleep(0.05)
        self.assertLessEqual(fd_count(pid), self.fd_base, "server fds above baseline")

    def assert_reference(self):
        st, r = self.s().post("/v1/completions", ref_body())
        self.assertEqual(st, 200, r)
        self.assertEqual(r["choices"][0]["text"], CASE["completion_text"])

    def reference_concurrently(self):
        """Starts a normal request in a thread; join() the returned thread, then check .result."""
        t = threading.Thread(target=lambda: setattr(t, "result", self.s().post(
            "/v1/completions", ref_body())))
        t.result = None
        t.start()
        return t

    def check_reference_thread(self, t):
        t.join(60)
        self.assertIsNotNone(t.result, "the concurrent request did not finish")
        st, r = t.result
        self.assertEqual(st, 200, r)
        self.assertEqual(r["choices"][0]["text"], CASE["completion_text"])

    def check_error(self, st, r, status, param=None, code=None):
        self.assertEqual(st, status, r)
        self.assertEqual(set(r["error"]), {"message", "type", "param", "code"})
        if param is not None:
            self.assertEqual(r["error"]["param"], param)
        if code is not None:
            self.assertEqual(r["error"]["code"], code)


CLIENT = r"""
import json, socket, sys, time
port, stream = int(sys.argv[1]), sys.argv[2] == "1"
s = socket.create_connection(("127.0.0.1", port))
body = json.dumps({"prompt": "Once upon a time", "max_tokens": 400, "n": 4, "logprobs": 5,
                   "ignore_eos": True, "stream": stream}).encode()
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
if stream and len(sys.argv) < 4:
    got = b""
    while got.count(b"data: ") < 3:
        got += s.recv(4096)
print("ready", flush=True)
time.sleep(120)
"""


class VanishingClients(Fault):
    def spawn(self, port, stream, queued=False):
        """A client process with one request in flight (a stream has received 3 events unless
        queued: a queued request gets none)."""
        args = [sys.executable, "-c", CLIENT, str(port), "1" if stream else "0"]
        p = subprocess.Popen(args + (["queued"] if queued else []),
                             stdout=subprocess.PIPE, text=True)
        self.assertEqual(p.stdout.readline().strip(), "ready")
        return p

    def test_sigkill_mid_stream(self):
        clients = [self.spawn(srv.port, True) for _ in range(3)]
        t = self.reference_concurrently()
        for p in clients:
            p.send_signal(signal.SIGKILL)
            p.wait()
            p.stdout.close()
        self.check_reference_thread(t)
        self.assert_no_leak(timeout=3)

    def test_sigkill_while_queued(self):
        """A request still waiting in the queue gets no event until admitted; its vanished
        client must still cancel it promptly (not only after the running ones finish)."""
        # A long context makes the running request take seconds even on this tiny model; the
        # queued ones have n = 4 choices, which wait for all of the 4 sequences to be free.
        own = e2e.Server("--max-num-seqs", "4", "--connection-timeout", "0", ctx=4096)
        self.server = own
        try:
            self.setUp()
            running = raw_post(own.port, "/v1/completions", {
                "prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True,
                "stream": True})
            deadline = time.time() + 10
            while own.metrics()["kvserve_num_requests_running"] < 1 and time.time() < deadline:
                time.sleep(0.01)
            queued = [self.spawn(own.port, stream, True) for stream in (False, True)]
            deadline = time.time() + 5
            while own.metrics()["kvserve_num_requests_waiting"] < 2 and time.time() < deadline:
                time.sleep(0.01)
            self.assertEqual(own.metrics()["kvserve_num_requests_waiting"], 2)
            for p in queued:
                p.send_signal(signal.SIGKILL)
                p.wait()
                p.stdout.close()
            # Cancelled while the first request still runs.
            deadline = time.time() + 2
            while own.metrics()["kvserve_num_requests_waiting"] > 0 and time.time() < deadline:
                time.sleep(0.02)
            m = own.metrics()
            self.assertEqual(m["kvserve_num_requests_waiting"], 0, "queued requests not cancelled")
            self.assertEqual(m["kvserve_num_requests_running"], 1, "the running one finished first")
            running.close()
            self.assert_reference()
            self.assert_no_leak()
        finally:
            self.assertEqual(own.stop(), 0)


class SlowClients(Fault):
    def test_slow_reader(self):
        """A client reading one byte a second: others keep being served, the server's memory
        does not grow with what that client has not read."""
        rss0 = rss_kb(srv.proc.pid)
        s = raw_post(srv.port, "/v1/completions", {
            "prompt": "Once upon a time", "max_tokens": 400, "n": 8, "logprobs": 5,
            "ignore_eos": True, "stream": True}, rcvbuf=4096)
        s.settimeout(TIMEOUT + 3)
        got, closed = s.recv(12), False
        t = self.reference_concurrently()
        for _ in range(4):
            try:
                b = s.recv(1)
            except (socket.timeout, ConnectionResetError):
                b = b""
            if not b:
                closed = True
                break
            got += b
            time.sleep(1)
        self.check_reference_thread(t)
        self.assertTrue(got.startswith(b"HTTP/1.1 200"), got)
        # Everything the engine produced for 8 choices x 400 tokens with logprobs sits at most
        # in the request's event queue: a few MB, never unbounded.
        self.assertLess(rss_kb(srv.proc.pid) - rss0, 64 * 1024, "RSS grew by more than 64 MiB")
        s.close()
        self.assert_no_leak()
        self.assertFalse(closed and len(got) == 0)

    def test_slowloris_headers(self):
        """Connections that send headers a byte at a time hold no thread; once they stall they
        are closed after --connection-timeout; others are served throughout."""
        socks = []
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        t = self.reference_concurrently()
        for i in range(3):  # keep them alive for a while: one byte each, well within the timeout
            for s in socks:
                s.sendall(b"X-Slow-%d: y\r\n" % i)
            time.sleep(TIMEOUT / 3)
        self.check_reference_thread(t)
        # Now they stall: the server must close every one of them.
        t0 = time.time()
        for s in socks:
            s.settimeout(TIMEOUT + 5)
            try:
                data = s.recv(4096)
            except ConnectionResetError:
                data = b""
            self.assertEqual(data, b"", "the server answered an incomplete request")
        self.assertLess(time.time() - t0, TIMEOUT + 5)
        for s in socks:
            s.close()
        self.assert_no_leak()

    def test_idle_connection_times_out(self):
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.settimeout(TIMEOUT + 5)
        t0 = time.time()
        self.assertEqual(s.recv(10), b"")
        self.assertGreaterEqual(time.time() - t0, TIMEOUT - 1)
        s.close()
        self.assert_no_leak()


class HostileBodies(Fault):
    def test_100mb_body_content_length(self):
        """Content-Length of 100 MB: 413 right after the headers, and the body is not read."""
        rss0 = rss_kb(srv.proc.pid)
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: %d\r\n\r\n" % (100 << 20))
        s.sendall(b"{\"prompt\": \"" + b"x" * 65536)
        st, body = read_response(s)
        self.check_error(st, json.loads(body), 413)
        sent = self.send_until_refused(s, 100 << 20)
        self.assertLess(sent, 100 << 20, "the server read the whole 100 MB body")
        s.close()
        self.assertLess(rss_kb(srv.proc.pid) - rss0, 16 * 1024)
        self.assert_reference()
        self.assert_no_leak()

    def test_100mb_body_chunked(self):
        """Chunked upload without a length: MHD cannot answer in the middle of a body, so the
        server drops up to another --max-body-bytes (to answer 413 at the end of a moderately
        large body) and then closes the connection; it never swallows the remaining 99 MB."""
        rss0 = rss_kb(srv.proc.pid)
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nTransfer-Encoding: chunked\r\n\r\n")
        part = b"x" * 65536
        chunk = b"%x\r\n%s\r\n" % (len(part), part)
        result = {}

        def reader():
            try:
                result["resp"] = read_response(s, timeout=30)
            except OSError as e:
                result["err"] = e

        rt = threading.Thread(target=reader)
        rt.start()
        sent = 0
        try:
            while sent < (100 << 20) and rt.is_alive():
                s.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        rt.join(30)
        self.assertFalse(rt.is_alive())
        if "resp" in result and result["resp"][0] is not None:
            st, body = result["resp"]
            self.check_error(st, json.loads(body), 413)
        sent += self.send_until_refused(s, (100 << 20) - sent)
        self.assertLess(sent, 100 << 20, "the server read the whole 100 MB body")
        s.close()
        self.assertLess(rss_kb(srv.proc.pid) - rss0, 16 * 1024)
        self.assert_reference()
        self.assert_no_leak()

    @staticmethod
    def send_until_refused(s, limit):
        """Keeps sending (up to limit bytes); returns how many were accepted before the peer
        closed. A server that reads everything lets all of them through."""
        s.settimeout(5)
        sent, block = 0, b"y" * 65536
        try:
            while sent < limit:
                s.sendall(block)
                sent += len(block)
        except OSError:
            pass
        return sent

    def test_deep_json_nesting(self):
        """10,000-deep arrays and objects: a clean 400 (cJSON stops at CJSON_NESTING_LIMIT,
        1000), no stack overflow."""
        for body in [b"[" * 10000 + b"]" * 10000,
                     b"{\"prompt\": " + b"[" * 10000 + b"]" * 10000 + b"}",
                     b"{\"a\":" * 10000 + b"1" + b"}" * 10000]:
            for path in ["/v1/completions", "/v1/chat/completions", "/tokenize"]:
                st, _, data = srv.request("POST", path, raw=body,
                                          headers={"Content-Type": "application/json"})
                self.check_error(st, json.loads(data), 400)
        # Just under cJSON's limit the body parses; the prompt then has the wrong type.
        st, _, data = srv.request("POST", "/v1/completions",
                                  raw=b"{\"prompt\": " + b"[" * 900 + b"]" * 900 + b"}")
        self.check_error(st, json.loads(data), 400, "prompt")
        self.assert_reference()
        self.assert_no_leak()

    def test_1mb_prompt(self):
        """A prompt just under the body limit: tokenized, then 400 context_length_exceeded,
        in well under the time a client would wait."""
        t0 = time.time()
        st, r = srv.post("/v1/completions", {"prompt": "Once upon a time " * 61000,
                                             "max_tokens": 4})
        self.check_error(st, r, 400, "prompt", "context_length_exceeded")
        self.assertLess(time.time() - t0, 10)
        st, r = srv.post("/v1/chat/completions", {"messages": [
            {"role": "user", "content": "ab " * 340000}]})
        self.check_error(st, r, 400, "messages", "context_length_exceeded")
        # Over the body limit: 413 before any tokenizing.
        s = socket.create_connection(("127.0.0.1", srv.port))
        data = json.dumps({"prompt": "x" * (1 << 20)}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                  % len(data))
        try:
            s.sendall(data)  # the server may close its read side as soon as it answered
        except OSError:
            pass
        st, body = read_response(s)
        s.close()
        self.check_error(st, json.loads(body), 413)
        self.assert_reference()
        self.assert_no_leak()

    def test_invalid_utf8(self):
        bad = [b"\xff\xfe", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"a\x00b",
               b"\xe2\x82", b"\x80\x80\x80"]
        for b in bad:
            for path, body in [
                    ("/v1/completions", b'{"prompt": "Once ' + b + b'", "max_tokens": 4}'),
                    ("/v1/chat/completions",
                     b'{"messages": [{"role": "user", "content": "' + b + b'"}],'
                     b' "max_tokens": 4}'),
                    ("/v1/completions", b'{"prompt": "Once", "stop": "' + b + b'",'
                     b' "max_tokens": 4}'),
                    ("/tokenize", b'{"prompt": "' + b + b'"}')]:
                with self.subTest(bytes=b, path=path):
                    st, _, data = srv.request("POST", path, raw=body,
                                              headers={"Content-Type": "application/json"})
                    self.assertIn(st, (200, 400), data)
                    r = json.loads(data)  # the response itself is valid JSON (and UTF-8)
                    if st == 400:
                        self.check_error(st, r, 400)
        # Escaped lone surrogates are valid JSON text but not valid Unicode.
        st, r = srv.post("/v1/completions", {"prompt": "Once \ud800 upon", "max_tokens": 4})
        self.assertIn(st, (200, 400), r)
        self.assert_reference()
        self.assert_no_leak()

    def test_non_finite_and_huge_numbers(self):
        for field in ["temperature", "top_p", "top_k", "max_tokens", "n", "seed",
                      "presence_penalty", "frequency_penalty", "min_p", "logprobs"]:
            for lit in [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999", b"1e308",
                        b"18446744073709551617", b"nan", b"inf"]:
                with self.subTest(field=field, value=lit):
                    body = b'{"prompt": "Once", "%s": %s}' % (field.encode(), lit)
                    st, _, data = srv.request("POST", "/v1/completions", raw=body,
                                              headers={"Content-Type": "application/json"})
                    self.check_error(st, json.loads(data), 400, field)
        self.assert_reference()
        self.assert_no_leak()

    def test_n_10000(self):
        st, r = srv.post("/v1/completions", {"prompt": "Once", "n": 10000, "max_tokens": 2})
        self.check_error(st, r, 400, "n")
        st, r = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}],
                                                  "n": 10000, "max_tokens": 2})
        self.check_error(st, r, 400, "n")
        self.assert_reference()
        self.assert_no_leak()

    def test_many_messages_and_stops(self):
        msgs = [{"role": "user", "content": "a"}] * 20000
        st, r = srv.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 2})
        self.check_error(st, r, 400, "messages", "context_length_exceeded")
        st, r = srv.post("/v1/completions", {"prompt": "a", "stop": ["x"] * 10000})
        self.check_error(st, r, 400, "stop")
        st, r = srv.post("/v1/completions", {"prompt": [1] * 200000})
        self.check_error(st, r, 400, "prompt", "context_length_exceeded")
        self.assert_no_leak()

    def test_huge_header(self):
        """Headers beyond --connection-memory-kb: MHD answers 431 (or closes); no crash."""
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (256 << 10) + b"\r\n\r\n")
        s.settimeout(10)
        try:
            data = s.recv(4096)
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        self.assertTrue(data == b"" or data.startswith(b"HTTP/1.1 431"), data[:100])
        s.close()
        self.assert_reference()
        self.assert_no_leak()


class Exhaustion(Fault):
    def test_pool_exhausted(self):
        """A 51-block pool (1 MiB of F32 cache) and 4 running sequences of 200+ tokens (13+
        blocks each): many long requests queue, then complete (or get 429 once the queue is
        full); none crash, and the pool empties afterwards."""
        own = e2e.Server("--kv-cache-mb", "1", "--kv-cache-type", "f32", "--max-num-seqs", "4",
                         "--max-queue", "8", "--block-size", "16")
        self.server = own
        try:
            self.setUp()
            results, lock = [], threading.Lock()

            def go(i):
                body = {"prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": True,
                        "stream": i % 2 == 0}
                if body["stream"]:
                    st, ev, done = own.stream("/v1/completions", body)
                    ok = st != 200 or done
                else:
                    st, r = own.post("/v1/completions", body)
                    ok = True
                with lock:
                    results.append((st, ok))

            threads = [threading.Thread(target=go, args=(i,)) for i in range(24)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            statuses = sorted(st for st, _ in results)
            self.assertEqual(len(results), 24)
            self.assertTrue(set(statuses) <= {200, 429}, statuses)
            self.assertIn(200, statuses)
            self.assertTrue(all(ok for _, ok in results))
            self.assert_reference()
            self.assert_no_leak()
        finally:
            self.assertEqual(own.stop(), 0)

    def test_sigterm_under_load(self):
        """SIGTERM with streams and plain requests running and queued: exit 0; every stream
        either ends with [DONE] or with one error event; plain requests get 200 or 503."""
        own = e2e.Server("--shutdown-timeout", "1", "--max-num-seqs", "4")
        results, lock = [], threading.Lock()

        def go(i):
            body = {"prompt": "Once upon a time", "max_tokens": 480, "ignore_eos": True,
                    "stream": i % 2 == 0}
            try:
                if body["stream"]:
                    c = own.conn()
                    c.request("POST", "/v1/completions", body=json.dumps(body),
                              headers={"Content-Type": "application/json"})
                    r = c.getresponse()
                    data = r.read()
                    c.close()
                    if r.status == 200:
                        ev, done = e2e.parse_sse(data.decode())
                        res = ("stream", done or (ev and set(ev[-1]) == {"error"}))
                    else:
                        res = ("stream-status", r.status)
                else:
                    st, r = own.post("/v1/completions", body)
                    res = ("plain", st)
            except (OSError, ValueError) as e:
                res = ("exception", repr(e))
            with lock:
                results.append(res)

        threads = [threading.Thread(target=go, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        own.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        self.assertEqual(own.proc.wait(30), 0, own.stderr())
        self.assertEqual(len(results), 16)
        for kind, v in results:
            if kind == "stream":
                self.assertTrue(v, "a stream ended with neither [DONE] nor an error event")
            elif kind in ("plain", "stream-status"):
                self.assertIn(v, (200, 503))
            else:
                self.fail("client error: %s" % v)
        self.assertEqual(own.stop(), 0)


class SanitizerGate(unittest.TestCase):
    """In the ASan/UBSan and TSan builds the e2e suites run that build's kvserve; a report in
    its log must fail the test, not just be printed."""

    def test_reports_fail(self):
        for text in ["==1==ERROR: AddressSanitizer: heap-use-after-free on address",
                     "==1==ERROR: LeakSanitizer: detected memory leaks",
                     "server/http.c:10:5: runtime error: signed integer overflow",
                     "WARNING: ThreadSanitizer: data race (pid=1)"]:
            with self.assertRaises(AssertionError):
                e2e.check_sanitizer_report("log line\n" + text + "\n")
        e2e.check_sanitizer_report("info: listening on http://127.0.0.1:1\n")

    def test_binary_under_test(self):
        """The suite runs the kvserve of the build it belongs to (meson sets KVSERVE_BIN)."""
        self.assertTrue(os.path.isabs(e2e.BIN) or os.path.exists(e2e.BIN), e2e.BIN)


if __name__ == "__main__":
    unittest.main()
