"""The smaller OpenAI contract items over HTTP with stories260K: prompt arrays on
/v1/completions, Retry-After on 429, CORS (--cors-origin and preflight OPTIONS; off by
default), messages without content, and OpenAI fields this server does not implement (a 400
naming them instead of silence)."""
import json
import threading
import unittest

import kvs_e2e as e2e

srv = None


def setUpModule():
    global srv
    e2e.require_server()
    srv = e2e.Server("--cors-origin", "http://app.example", "--cors-origin",
                     "https://other.example:8443")


def tearDownModule():
    if srv:
        rc = srv.stop()
        if rc != 0:
            raise AssertionError("kvserve exited with %d after SIGTERM" % rc)


def greedy(prompt, **extra):
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0}
    body.update(extra)
    return body


class PromptArrays(unittest.TestCase):
    def test_choices_indexed_prompt_by_prompt(self):
        prompts = ["Once upon a time", "Lily and Tom", "The cat"]
        singles = []
        for p in prompts:
            st, r = srv.post("/v1/completions", greedy(p))
            self.assertEqual(st, 200, r)
            singles.append(r)
        st, r = srv.post("/v1/completions", greedy(prompts, n=2))
        self.assertEqual(st, 200, r)
        self.assertEqual([c["index"] for c in r["choices"]], list(range(6)))
        for k, single in enumerate(singles):
            for j in range(2):
                self.assertEqual(r["choices"][2 * k + j]["text"], single["choices"][0]["text"])
        self.assertEqual(r["usage"]["prompt_tokens"],
                         sum(s["usage"]["prompt_tokens"] for s in singles))
        self.assertEqual(r["usage"]["completion_tokens"],
                         2 * sum(s["usage"]["completion_tokens"] for s in singles))

    def test_token_id_prompts_and_streaming(self):
        st, tok = srv.post("/tokenize", {"prompt": "Once upon a time"})
        ids = tok["tokens"]
        st, one = srv.post("/v1/completions", greedy(ids))
        st, events, done = srv.stream("/v1/completions",
                                      greedy([ids, "The cat"], stream=True,
                                             stream_options={"include_usage": True}))
        self.assertEqual(st, 200, events)
        self.assertTrue(done)
        texts = {}
        for e in events:
            for c in e["choices"]:
                texts[c["index"]] = texts.get(c["index"], "") + c["text"]
        self.assertEqual(sorted(texts), [0, 1])
        self.assertEqual(texts[0], one["choices"][0]["text"])
        self.assertEqual(events[-1]["choices"], [])
        self.assertEqual(events[-1]["usage"]["completion_tokens"], 12)

    def test_bad_arrays(self):
        for prompt in [["a", 5], [[1, 2], []], ["ok", [99999]], ["x"] * 65, ["a", None]]:
            with self.subTest(prompt=str(prompt)[:40]):
                st, r = srv.post("/v1/completions", greedy(prompt))
                self.assertEqual(st, 400, r)
                self.assertEqual(r["error"]["param"], "prompt")
        st, r = srv.post("/v1/completions", greedy(["a", "b"], response_format={
            "type": "json_object"}))
        self.assertEqual(st, 400, r)
        self.assertEqual(r["error"]["param"], "response_format")


class Messages(unittest.TestCase):
    def test_content_required(self):
        for msg in [{"role": "user"}, {"role": "user", "content": None},
                    {"role": "system"}, {"role": "assistant"}]:
            with self.subTest(msg=msg):
                st, r = srv.post("/v1/chat/completions",
                                 {"messages": [{"role": "user", "content": "hi"}, msg]})
                self.assertEqual(st, 400, r)
                self.assertEqual(r["error"]["param"], "messages")
                self.assertIn("messages[1]", r["error"]["message"])


class UnsupportedFields(unittest.TestCase):
    def test_named_400(self):
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        cases = [
            ("/v1/chat/completions", chat, "tool_choice", "required"),  # and no tools
            ("/v1/completions", greedy("a"), "tools", [{"type": "function",
                                                        "function": {"name": "f"}}]),
            ("/v1/chat/completions", chat, "functions", [{"name": "f"}]),
            ("/v1/chat/completions", chat, "audio", {"voice": "alloy", "format": "wav"}),
            ("/v1/chat/completions", chat, "modalities", ["text", "audio"]),
            ("/v1/chat/completions", chat, "prediction", {"type": "content", "content": "x"}),
            ("/v1/chat/completions", chat, "store", True),
            ("/v1/chat/completions", chat, "reasoning_effort", "low"),
            ("/v1/chat/completions", chat, "service_tier", "flex"),
            ("/v1/completions", greedy("a"), "best_of", 3),
            ("/v1/completions", greedy("a"), "suffix", "end"),
        ]
        for path, base, field, value in cases:
            with self.subTest(field=field):
                st, r = srv.post(path, dict(base, **{field: value}))
                self.assertEqual(st, 400, r)
                self.assertEqual(r["error"]["param"], field)
                self.assertIn(field, r["error"]["message"])

    def test_neutral_values_pass(self):
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for field, value in [("tools", []), ("tool_choice", "none"), ("store", False),
                             ("modalities", ["text"]), ("service_tier", "auto"),
                             ("parallel_tool_calls", True), ("metadata", None)]:
            with self.subTest(field=field):
                st, r = srv.post("/v1/chat/completions", dict(chat, **{field: value}))
                self.assertEqual(st, 200, r)
        st, r = srv.post("/v1/completions", greedy("a", echo=False, best_of=1, suffix=None))
        self.assertEqual(st, 200, r)


class Cors(unittest.TestCase):
    def test_preflight(self):
        st, h, body = srv.request("OPTIONS", "/v1/chat/completions", headers={
            "Origin": "http://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        self.assertEqual(st, 204, body)
        self.assertEqual(h["access-control-allow-origin"], "http://app.example")
        self.assertIn("POST", h["access-control-allow-methods"])
        self.assertEqual(h["access-control-allow-headers"], "authorization, content-type")
        st, h, body = srv.request("OPTIONS", "/v1/models", headers={
            "Origin": "https://other.example:8443", "Access-Control-Request-Method": "GET"})
        self.assertEqual(st, 204, body)
        self.assertEqual(h["access-control-allow-origin"], "https://other.example:8443")
        st, h, body = srv.request("OPTIONS", "/v1/models", headers={
            "Origin": "http://evil.example", "Access-Control-Request-Method": "GET"})
        self.assertEqual(st, 403, body)
        self.assertNotIn("access-control-allow-origin", h)
        self.assertIn("error", json.loads(body))

    def test_responses_carry_the_origin(self):
        st, h, body = srv.request("POST", "/v1/completions", greedy("a"),
                                  headers={"Origin": "http://app.example"})
        self.assertEqual(st, 200, body)
        self.assertEqual(h["access-control-allow-origin"], "http://app.example")
        self.assertIn("Origin", h["vary"])
        st, h, body = srv.request("POST", "/v1/completions", greedy("a", stream=True),
                                  headers={"Origin": "http://app.example"})
        self.assertEqual(h["access-control-allow-origin"], "http://app.example")
        st, h, body = srv.request("GET", "/v1/models", headers={"Origin": "http://evil.example"})
        self.assertEqual(st, 200)
        self.assertNotIn("access-control-allow-origin", h)

    def test_off_by_default_and_wildcard(self):
        plain = e2e.Server()
        try:
            st, h, _ = plain.request("GET", "/v1/models", headers={"Origin": "http://app.example"})
            self.assertNotIn("access-control-allow-origin", h)
            st, h, body = plain.request("OPTIONS", "/v1/models",
                                        headers={"Origin": "http://app.example"})
            self.assertEqual(st, 405, body)
        finally:
            self.assertEqual(plain.stop(), 0)
        star = e2e.Server("--cors-origin", "*")
        try:
            st, h, _ = star.request("GET", "/v1/models", headers={"Origin": "http://x.example"})
            self.assertEqual(h["access-control-allow-origin"], "*")
        finally:
            self.assertEqual(star.stop(), 0)

    def test_bad_origin_flag(self):
        for bad in ["app.example", "http://", "http://a.example/path", "http://a b"]:
            with self.subTest(origin=bad):
                s = e2e.Server("--cors-origin", bad, wait=False)
                rc = s.proc.wait(30)
                self.assertNotEqual(rc, 0)
                self.assertIn("cors-origin", s.stderr())
                s.stop()


class RetryAfter(unittest.TestCase):
    def test_429_says_when(self):
        busy = e2e.Server("--max-num-seqs", "1", "--max-queue", "1")
        try:
            results = []
            lock = threading.Lock()

            def go():
                st, h, body = busy.request("POST", "/v1/completions",
                                           {"prompt": "Once upon a time", "max_tokens": 400,
                                            "ignore_eos": True})
                with lock:
                    results.append((st, h))

            threads = [threading.Thread(target=go) for _ in range(12)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            limited = [h for st, h in results if st == 429]
            self.assertTrue(limited, [st for st, _ in results])
            for h in limited:
                self.assertEqual(h.get("retry-after"), "1")
            for st, h in results:
                if st == 200:
                    self.assertNotIn("retry-after", h)
        finally:
            self.assertEqual(busy.stop(), 0)


if __name__ == "__main__":
    raise SystemExit(e2e.run_standalone())
