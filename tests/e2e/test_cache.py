"""The paged KV cache seen from outside: continuous batching shows in /metrics, a small pool
forces preemption without changing any text, 50 vanishing clients give every block back,
prefix reuse returns exactly what a cache-less server returns, and n > 1 choices share their
prompt's blocks instead of copying them."""
import json
import socket
import threading
import time
import unittest

import kvs_e2e as e2e


def max_tokens(case):
    return len(case["completion_ids"]) + (1 if case["stop"] == "bos" else 0)


def wait_blocks_free(testcase, srv, timeout=1.0):
    deadline = time.time() + timeout
    m = srv.metrics()
    while m["kvserve_kv_blocks_used"] != 0 and time.time() < deadline:
        time.sleep(0.02)
        m = srv.metrics()
    testcase.assertEqual(m["kvserve_kv_blocks_used"], 0, "blocks still held")


def run_parallel(fn, n):
    results = [None] * n

    def run(i):
        results[i] = fn(i)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def text_of(events):
    return "".join(c.get("text", "") for e in events for c in e.get("choices", []))


class PoolPressure(unittest.TestCase):
    """stories260K blocks of 16 tokens take 20 KiB in an F32 cache: --kv-cache-mb 1 holds 51
    blocks, enough for one 512-token context but far from 32 concurrent ~260-token stories (~550
    blocks)."""

    @classmethod
    def setUpClass(cls):
        e2e.require_server()
        cls.srv = e2e.Server("--kv-cache-mb", "1", "--kv-cache-type", "f32", "--max-num-seqs", "32")

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def test_32_requests_preempted_still_exact(self):
        cases = e2e.load_reference()

        def one(i):
            c = cases[i % len(cases)]
            return self.srv.post("/v1/completions", {"prompt": c["prompt"], "temperature": 0,
                                                     "max_tokens": max_tokens(c)})
        results = run_parallel(one, 32)
        for i, (st, r) in enumerate(results):
            self.assertEqual(st, 200, r)
            self.assertEqual(r["choices"][0]["text"], cases[i % len(cases)]["completion_text"],
                             "request %d" % i)
        m = self.srv.metrics()
        self.assertGreater(m["kvserve_preemptions_total"], 0)
        wait_blocks_free(self, self.srv)


class Batching(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        e2e.require_server()
        cls.srv = e2e.Server()
        cls.nocache = e2e.Server("--no-prefix-cache")

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        cls.nocache.stop()

    def test_steps_carry_many_sequences(self):
        before = self.srv.metrics()
        body = {"prompt": "Once upon a time", "max_tokens": 60, "ignore_eos": True}
        results = run_parallel(lambda i: self.srv.post("/v1/completions", body), 8)
        self.assertTrue(all(st == 200 for st, _ in results))
        after = self.srv.metrics()
        # batch_size histogram: steps that carried at most one sequence are in le="1"
        multi = lambda m: m["kvserve_batch_size_count"] - m['kvserve_batch_size_bucket{le="1"}']
        self.assertGreater(multi(after) - multi(before), 0, "no step carried two sequences")

    def test_50_vanishing_stream_clients(self):
        def one(i):
            s = socket.create_connection(("127.0.0.1", self.srv.port))
            body = json.dumps({"prompt": "Once upon a time", "max_tokens": 400,
                               "ignore_eos": True, "stream": True}).encode()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            got = b""
            while got.count(b"data: ") < 2:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
            s.close()
            return got.count(b"data: ")
        got = run_parallel(one, 50)
        self.assertTrue(all(n >= 2 for n in got), got)
        wait_blocks_free(self, self.srv, timeout=1.0)

    def test_prefix_reuse_same_text_as_no_cache(self):
        # A 100+-token prefix: a reference prompt followed by its own reference continuation.
        case = e2e.load_reference()[0]
        st, tok = self.srv.post("/tokenize", {"prompt": case["prompt"]})
        self.assertEqual(st, 200)
        prefix = tok["tokens"] + case["completion_ids"][:100]
        body = {"prompt": prefix, "temperature": 0, "max_tokens": 30}
        st, first = self.srv.post("/v1/completions", body)
        self.assertEqual(st, 200)
        mid = self.srv.metrics()["kvserve_prefix_cache_hits_total"]
        # a second request sharing the prefix, with a different tail
        body2 = dict(body, prompt=prefix + case["completion_ids"][100:103])
        st, second = self.srv.post("/v1/completions", body2)
        self.assertEqual(st, 200)
        after = self.srv.metrics()["kvserve_prefix_cache_hits_total"]
        self.assertGreaterEqual(after - mid, 100 // 16, "second request reused no blocks")
        for b, r in ((body, first), (body2, second)):
            st, ref = self.nocache.post("/v1/completions", b)
            self.assertEqual(st, 200)
            self.assertEqual(r["choices"][0]["text"], ref["choices"][0]["text"])
        self.assertEqual(self.nocache.metrics()["kvserve_prefix_cache_hits_total"], 0)


class ForkShares(unittest.TestCase):
    """n = 3 over a 480-token prompt: shared, the prompt takes 30 blocks plus a few per
    choice; copied, it would take 3 x 31 = 93. The pool holds 51 blocks, so the request runs
    without a single preemption only if the choices share the prompt's blocks (F32 cache: in
    F16 the same MiB holds twice the blocks and three copies would fit)."""

    @classmethod
    def setUpClass(cls):
        e2e.require_server()
        cls.srv = e2e.Server("--kv-cache-mb", "1", "--kv-cache-type", "f32")

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def test_n3_shares_prompt_blocks(self):
        case = e2e.load_reference()[0]
        st, tok = self.srv.post("/tokenize", {"prompt": case["prompt"]})
        prompt = (tok["tokens"] + case["completion_ids"]) * 2
        prompt = prompt[:480]
        st, r = self.srv.post("/v1/completions", {"prompt": prompt, "n": 3, "temperature": 0.8,
                                                  "seed": 7, "max_tokens": 16,
                                                  "ignore_eos": True})
        self.assertEqual(st, 200, r)
        self.assertEqual(sorted(c["index"] for c in r["choices"]), [0, 1, 2])
        self.assertEqual(r["usage"]["prompt_tokens"], 480)
        self.assertEqual(self.srv.metrics()["kvserve_preemptions_total"], 0)
        wait_blocks_free(self, self.srv)


if __name__ == "__main__":
    unittest.main()
