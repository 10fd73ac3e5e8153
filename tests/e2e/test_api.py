"""kvserve over HTTP with stories260K: reference outputs (plain and streaming), chat, every
error row of API.md, concurrency and cancellation. One server for the whole module."""
import json
import socket
import threading
import time
import unittest

import kvs_e2e as e2e

srv = None


def setUpModule():
    global srv
    e2e.require_server()
    srv = e2e.Server("--max-body-bytes", "65536", "--served-model-name", "stories260K")


def tearDownModule():
    if srv:
        rc = srv.stop()
        if rc != 0:
            raise AssertionError("kvserve exited with %d after SIGTERM" % rc)


def max_tokens(case):
    """The reference's completion_ids stop before the story-ending BOS: allow one more token
    so the server sees that BOS and finishes with "stop" (kvserve stops at BOS for models
    whose BOS differs from EOS, see the scheduler)."""
    return len(case["completion_ids"]) + (1 if case["stop"] == "bos" else 0)


def wait_blocks_free(testcase, timeout=1.0):
    deadline = time.time() + timeout
    m = srv.metrics()
    while m["kvserve_kv_blocks_used"] != 0 and time.time() < deadline:
        time.sleep(0.02)
        m = srv.metrics()
    testcase.assertEqual(m["kvserve_kv_blocks_used"], 0, "blocks still held")


class Reference(unittest.TestCase):
    def setUp(self):
        self.cases = e2e.load_reference()

    def completion(self, case, **extra):
        body = {"model": "stories260K", "prompt": case["prompt"], "temperature": 0,
                "max_tokens": max_tokens(case)}
        body.update(extra)
        return srv.post("/v1/completions", body)

    def test_completions(self):
        for case in self.cases:
            with self.subTest(prompt=case["prompt"]):
                st, r = self.completion(case)
                self.assertEqual(st, 200, r)
                self.assertEqual(r["object"], "text_completion")
                self.assertTrue(r["id"].startswith("cmpl-"))
                self.assertIsInstance(r["created"], int)
                self.assertEqual(r["model"], "stories260K")
                ch = r["choices"][0]
                self.assertEqual(ch["index"], 0)
                self.assertEqual(ch["text"], case["completion_text"])
                self.assertIsNone(ch["logprobs"])
                want = "stop" if case["stop"] == "bos" else "length"
                self.assertEqual(ch["finish_reason"], want)
                u = r["usage"]
                self.assertEqual(u["prompt_tokens"], len(case["prompt_ids"]))
                self.assertEqual(u["total_tokens"], u["prompt_tokens"] + u["completion_tokens"])
                if case["stop"] != "bos":
                    self.assertEqual(u["completion_tokens"], len(case["completion_ids"]))

    def test_token_id_prompt(self):
        case = self.cases[0]
        st, r = srv.post("/v1/completions", {"prompt": case["prompt_ids"], "temperature": 0,
                                             "max_tokens": 20})
        self.assertEqual(st, 200, r)
        self.assertTrue(case["completion_text"].startswith(r["choices"][0]["text"]))
        self.assertEqual(r["usage"]["completion_tokens"], 20)

    def test_streaming(self):
        for case in self.cases:
            with self.subTest(prompt=case["prompt"]):
                st, events, done = srv.stream("/v1/completions", {
                    "prompt": case["prompt"], "temperature": 0, "stream": True,
                    "max_tokens": max_tokens(case),
                    "stream_options": {"include_usage": True}})
                self.assertEqual(st, 200)
                self.assertTrue(done, "no data: [DONE]")
                ids = {e["id"] for e in events}
                created = {e["created"] for e in events}
                self.assertEqual(len(ids), 1)
                self.assertEqual(len(created), 1)
                self.assertTrue(events[0]["id"].startswith("cmpl-"))
                text = "".join(c["text"] for e in events for c in e["choices"])
                self.assertEqual(text, case["completion_text"])
                finishes = [c["finish_reason"] for e in events for c in e["choices"]
                            if c["finish_reason"]]
                self.assertEqual(finishes, ["stop" if case["stop"] == "bos" else "length"])
                usage = events[-1]
                self.assertEqual(usage["choices"], [])
                self.assertEqual(usage["usage"]["prompt_tokens"], len(case["prompt_ids"]))
                self.assertGreater(len(events), 3, "deltas were not streamed one by one")

    def test_stop_string(self):
        case = self.cases[0]
        text = case["completion_text"]
        stop = "named"
        cut = text.index(stop)
        st, r = self.completion(case, stop=[stop, "zzzz"])
        self.assertEqual(st, 200, r)
        self.assertEqual(r["choices"][0]["text"], text[:cut])
        self.assertEqual(r["choices"][0]["finish_reason"], "stop")
        # more than OpenAI's 4, as vLLM and llama.cpp take (lm-evaluation-harness sends a
        # task's whole `until` list): the 16th stops it as the first would
        st, r = self.completion(case, stop=["zz%d" % i for i in range(15)] + [stop])
        self.assertEqual(st, 200, r)
        self.assertEqual(r["choices"][0]["text"], text[:cut])
        self.assertEqual(r["choices"][0]["finish_reason"], "stop")

    def test_logprobs(self):
        case = self.cases[0]
        st, r = srv.post("/v1/completions", {"prompt": case["prompt"], "temperature": 0,
                                             "max_tokens": 4, "logprobs": 2})
        self.assertEqual(st, 200, r)
        lp = r["choices"][0]["logprobs"]
        self.assertEqual(len(lp["tokens"]), 4)
        self.assertEqual("".join(lp["tokens"]), r["choices"][0]["text"])
        self.assertEqual(len(lp["token_logprobs"]), 4)
        self.assertTrue(all(x <= 0 for x in lp["token_logprobs"]))
        self.assertEqual(len(lp["top_logprobs"]), 4)
        self.assertEqual(len(lp["top_logprobs"][0]), 2)
        # Greedy: the chosen token is the best of the tops.
        self.assertAlmostEqual(max(lp["top_logprobs"][0].values()), lp["token_logprobs"][0],
                               places=4)
        st, r = srv.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": case["prompt"]}], "temperature": 0,
            "max_tokens": 3, "logprobs": True, "top_logprobs": 3})
        self.assertEqual(st, 200, r)
        content = r["choices"][0]["logprobs"]["content"]
        self.assertEqual(len(content), 3)
        self.assertEqual(len(content[0]["top_logprobs"]), 3)
        self.assertEqual(bytes(content[0]["bytes"]).decode(), content[0]["token"])

    def test_n_choices(self):
        st, r = srv.post("/v1/completions", {"prompt": "Once upon a time", "n": 3,
                                             "max_tokens": 8, "seed": 5})
        self.assertEqual(st, 200, r)
        self.assertEqual(sorted(c["index"] for c in r["choices"]), [0, 1, 2])
        self.assertEqual(r["usage"]["completion_tokens"],
                         sum(8 if c["finish_reason"] == "length" else 0 for c in r["choices"])
                         or r["usage"]["completion_tokens"])


class Chat(unittest.TestCase):
    def test_chat_plain_template(self):
        case = e2e.load_reference()[0]
        st, r = srv.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": case["prompt"]}], "temperature": 0,
            "max_tokens": 30})
        self.assertEqual(st, 200, r)
        self.assertEqual(r["object"], "chat.completion")
        self.assertTrue(r["id"].startswith("chatcmpl-"))
        msg = r["choices"][0]["message"]
        self.assertEqual(msg["role"], "assistant")
        self.assertTrue(case["completion_text"].startswith(msg["content"]), msg["content"])
        self.assertEqual(r["usage"]["completion_tokens"], 30)

    def test_chat_default_max_tokens_fills_context(self):
        case = e2e.load_reference()[2]  # ends with BOS before the context does
        st, r = srv.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": case["prompt"]}], "temperature": 0})
        self.assertEqual(st, 200, r)
        self.assertEqual(r["choices"][0]["message"]["content"], case["completion_text"])
        self.assertEqual(r["choices"][0]["finish_reason"], "stop")

    def test_chat_stream(self):
        case = e2e.load_reference()[1]
        st, events, done = srv.stream("/v1/chat/completions", {
            "messages": [{"role": "user", "content": case["prompt"]}], "temperature": 0,
            "max_tokens": len(case["completion_ids"]), "stream": True,
            "stream_options": {"include_usage": True}})
        self.assertEqual(st, 200)
        self.assertTrue(done)
        self.assertEqual(events[0]["object"], "chat.completion.chunk")
        self.assertEqual(events[0]["choices"][0]["delta"], {"role": "assistant", "content": ""})
        self.assertEqual(len({e["id"] for e in events}), 1)
        self.assertTrue(events[0]["id"].startswith("chatcmpl-"))
        text = "".join(c["delta"].get("content", "") for e in events for c in e["choices"])
        self.assertEqual(text, case["completion_text"])
        last_choice = [e for e in events if e["choices"]][-1]["choices"][0]
        self.assertEqual(last_choice["delta"], {})
        self.assertEqual(last_choice["finish_reason"], "length")
        self.assertEqual(events[-1]["usage"]["completion_tokens"], len(case["completion_ids"]))


class Misc(unittest.TestCase):
    def test_models_health(self):
        st, h, data = srv.request("GET", "/v1/models")
        self.assertEqual(st, 200)
        r = json.loads(data)
        self.assertEqual(r["object"], "list")
        self.assertEqual([m["id"] for m in r["data"]], ["stories260K"])
        st, _, data = srv.request("GET", "/health")
        self.assertEqual((st, json.loads(data)), (200, {"status": "ok"}))

    def test_tokenize_messages(self):
        # vLLM's chat form: the ids /v1/chat/completions runs for the messages (its usage counts
        # them), /apply-template's text tokenized with BOS
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        st, r = srv.post("/tokenize", {"messages": msgs, "add_special_tokens": False,
                                       "add_generation_prompt": True, "model": "stories260K"})
        self.assertEqual(st, 200, r)
        st, chat = srv.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 1})
        self.assertEqual(st, 200, chat)
        self.assertEqual(r["count"], chat["usage"]["prompt_tokens"])
        st, text = srv.post("/apply-template", {"messages": msgs})
        self.assertEqual(st, 200, text)
        st, want = srv.post("/tokenize", {"prompt": text["prompt"]})
        self.assertEqual(r["tokens"], want["tokens"])
        # null is the default (a client that writes every field, unset ones as null)
        st, r2 = srv.post("/tokenize", {"messages": msgs, "add_special_tokens": None,
                                        "add_generation_prompt": None})
        self.assertEqual((st, r2["tokens"]), (200, r["tokens"]))
        st, r = srv.post("/tokenize", {"messages": msgs, "return_token_strs": True})
        self.assertEqual(r["tokens"], want["tokens"])
        self.assertEqual(len(r["token_strs"]), len(r["tokens"]))
        for body, param in [({"messages": msgs, "add_generation_prompt": False},
                             "add_generation_prompt"),
                            ({"messages": msgs, "add_special_tokens": True}, "add_special_tokens"),
                            ({"messages": msgs, "stream": True}, "stream"),
                            ({"messages": msgs, "prompt": "Hi"}, "messages"),
                            ({"messages": "Hi"}, "messages")]:
            st, r = srv.post("/tokenize", body)
            self.assertEqual(st, 400, body)
            self.assertEqual(r["error"]["param"], param, r)

    def test_tokenize_roundtrip(self):
        case = e2e.load_reference()[0]
        st, r = srv.post("/tokenize", {"prompt": case["prompt"]})
        self.assertEqual(st, 200, r)
        self.assertEqual(r["tokens"], case["prompt_ids"])
        # without BOS the text itself; with it BOS's text first ("<s>"), as vLLM (Hugging Face's
        # decode) and llama.cpp's /detokenize write special tokens
        # vLLM's return_token_strs: each token's vocabulary entry
        st, r = srv.post("/tokenize", {"prompt": case["prompt"], "return_token_strs": True})
        self.assertEqual(r["tokens"], case["prompt_ids"])
        self.assertEqual(r["token_strs"][0], "<s>")
        self.assertEqual("".join(r["token_strs"][1:]).replace("\u2581", " ").strip(),
                         case["prompt"].strip())
        st, r = srv.post("/tokenize", {"prompt": "x", "return_token_strs": 1})
        self.assertEqual((st, r["error"]["param"]), (400, "return_token_strs"))
        st, r = srv.post("/detokenize", {"tokens": case["prompt_ids"][1:]})
        self.assertEqual(st, 200, r)
        self.assertEqual(r["prompt"], case["prompt"])
        st, r = srv.post("/detokenize", {"tokens": case["prompt_ids"]})
        self.assertEqual(st, 200, r)
        self.assertEqual(r["prompt"], "<s> " + case["prompt"])

    def test_apply_template(self):
        # stories260K has no chat template: contents joined by newlines, as chat renders them
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        st, r = srv.post("/apply-template", {"messages": msgs})
        self.assertEqual(st, 200, r)
        self.assertEqual(r, {"prompt": "Be brief.\nHi"})
        st, r = srv.post("/apply-template", {"messages": []})
        self.assertEqual((st, r["error"]["param"]), (400, "messages"), r)
        # what the rendering reads is taken (tools with tool_choice none: rendered as none)
        tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
        st, r = srv.post("/apply-template", {"messages": msgs, "tools": tools,
                                             "tool_choice": "none", "chat_template_kwargs": {}})
        self.assertEqual((st, r), (200, {"prompt": "Be brief.\nHi"}), r)
        # anything else would have no effect on a rendering: a 400 naming it, checked as well
        # as valid
        for field, value in (("stream", True), ("temperature", 0.5), ("max_tokens", 4),
                             ("model", "stories260K"), ("parallel_tool_calls", False),
                             ("add_generation_prompt", True), ("seed", 1)):
            st, r = srv.post("/apply-template", {"messages": msgs, field: value})
            self.assertEqual(st, 400, (field, r))
            self.assertEqual((r["error"]["param"], r["error"]["code"], r["error"]["type"]),
                             (field, "unsupported_parameter", "invalid_request_error"), r)
            self.assertIn("/apply-template", r["error"]["message"])

    def test_chat_template_kwargs(self):
        msgs = [{"role": "user", "content": "Hi"}]
        for kw, why in (({"enable_thinking": False}, "no thinking switch"),
                        ({"enable_thinking": 1}, "must be a boolean"),
                        ({"add_vision_id": True}, "add_vision_id is not supported"),
                        ([], "must be an object")):
            st, r = srv.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 1,
                                                      "chat_template_kwargs": kw})
            self.assertEqual(st, 400, r)
            self.assertEqual(r["error"]["param"], "chat_template_kwargs", r)
            self.assertIn(why, r["error"]["message"])
        st, r = srv.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 1,
                                                  "chat_template_kwargs": {}})
        self.assertEqual(st, 200, r)

    def test_metrics(self):
        srv.post("/v1/completions", {"prompt": "Once", "max_tokens": 2})
        st, h, data = srv.request("GET", "/metrics")
        self.assertEqual(st, 200)
        self.assertTrue(h["content-type"].startswith("text/plain"))
        text = data.decode()
        for name in ["num_requests_running", "num_requests_waiting", "kv_blocks_capacity",
                     "kv_blocks_used", "kv_blocks_cached", "kv_cache_usage_ratio",
                     "requests_total", "prompt_tokens_total", "generation_tokens_total",
                     "prefix_cache_queries_total", "prefix_cache_hits_total", "preemptions_total",
                     "time_to_first_token_seconds", "inter_token_latency_seconds",
                     "e2e_request_latency_seconds", "batch_size"]:
            self.assertIn("# TYPE kvserve_" + name + " ", text)
            self.assertIn("# HELP kvserve_" + name + " ", text)
        m = srv.metrics()
        self.assertGreater(m['kvserve_requests_total{status="200"}'], 0)
        self.assertGreater(m["kvserve_generation_tokens_total"], 0)
        self.assertGreater(m["kvserve_kv_blocks_capacity"], 0)
        b = [v for k, v in m.items() if k.startswith("kvserve_e2e_request_latency_seconds_bucket")]
        self.assertEqual(b, sorted(b), "buckets are not cumulative")
        self.assertEqual(m['kvserve_e2e_request_latency_seconds_bucket{le="+Inf"}'],
                         m["kvserve_e2e_request_latency_seconds_count"])


class Errors(unittest.TestCase):
    def check(self, st, r, status, etype, param=None, code=None):
        self.assertEqual(st, status, r)
        self.assertEqual(set(r), {"error"})
        e = r["error"]
        self.assertEqual(set(e), {"message", "type", "param", "code"})
        self.assertEqual(e["type"], etype)
        self.assertIsInstance(e["message"], str)
        if param is not None:
            self.assertEqual(e["param"], param)
        if code is not None:
            self.assertEqual(e["code"], code)

    def raw(self, method, path, raw=None, headers=None):
        st, h, data = srv.request(method, path, raw=raw, headers=headers)
        return st, json.loads(data)

    def test_400(self):
        st, r = self.raw("POST", "/v1/completions", raw=b'{"prompt": ')
        self.check(st, r, 400, "invalid_request_error")
        for body, param in [({"prompt": "a", "max_tokens": "x"}, "max_tokens"),
                            ({"prompt": "a", "temperature": 5}, "temperature"),
                            ({"prompt": "a", "top_p": 0}, "top_p"),
                            ({"prompt": "a", "n": 0}, "n"),
                            ({"prompt": "a", "stop": [str(i) for i in range(17)]}, "stop"),
                            ({"prompt": "a", "logprobs": 9}, "logprobs"),
                            ({"prompt": 7}, "prompt"),
                            ({"prompt": [1, 99999]}, "prompt")]:
            with self.subTest(body=body):
                st, r = srv.post("/v1/completions", body)
                self.check(st, r, 400, "invalid_request_error", param)
        st, r = srv.post("/v1/chat/completions", {"messages": "hi"})
        self.check(st, r, 400, "invalid_request_error", "messages")

    def test_context_length(self):
        st, r = srv.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 600})
        self.check(st, r, 400, "invalid_request_error", code="context_length_exceeded")
        st, r = srv.post("/v1/completions", {"prompt": [1] * 600})
        self.check(st, r, 400, "invalid_request_error", code="context_length_exceeded")

    def test_404(self):
        st, r = self.raw("GET", "/v1/nothing")
        self.check(st, r, 404, "not_found_error")
        st, r = srv.post("/v1/completions", {"model": "gpt-9", "prompt": "a"})
        self.check(st, r, 404, "not_found_error", "model")

    def test_405(self):
        st, r = self.raw("GET", "/v1/completions")
        self.check(st, r, 405, "invalid_request_error")
        st, r = self.raw("POST", "/v1/models", raw=b"{}")
        self.check(st, r, 405, "invalid_request_error")

    def test_413(self):
        big = json.dumps({"prompt": "x" * 70000}).encode()
        st, r = self.raw("POST", "/v1/completions", raw=big)
        self.check(st, r, 413, "invalid_request_error")
        # Chunked upload (no Content-Length): detected while uploading.
        c = srv.conn()
        c.putrequest("POST", "/v1/completions")
        c.putheader("Transfer-Encoding", "chunked")
        c.endheaders()
        for i in range(0, len(big), 8192):
            part = big[i:i + 8192]
            c.send(b"%x\r\n%s\r\n" % (len(part), part))
        c.send(b"0\r\n\r\n")
        resp = c.getresponse()
        self.check(resp.status, json.loads(resp.read()), 413, "invalid_request_error")
        c.close()


class Concurrency(unittest.TestCase):
    def test_16_streams_match_solo(self):
        prompts = [c["prompt"] for c in e2e.load_reference()] * 4
        body = lambda p: {"prompt": p, "temperature": 0, "max_tokens": 40, "stream": True}
        solo = {}
        for p in set(prompts):
            st, ev, done = srv.stream("/v1/completions", body(p))
            solo[p] = "".join(c["text"] for e in ev for c in e["choices"])
        results = [None] * len(prompts)

        def run(i):
            st, ev, done = srv.stream("/v1/completions", body(prompts[i]))
            results[i] = (st, done, "".join(c["text"] for e in ev for c in e["choices"]))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for i, p in enumerate(prompts):
            self.assertEqual(results[i], (200, True, solo[p]), "stream %d" % i)
        wait_blocks_free(self)

    def test_disconnect_frees_blocks(self):
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", srv.port))
            body = json.dumps({"prompt": "Once upon a time", "max_tokens": 400, "n": 8,
                               "logprobs": 5, "ignore_eos": True, "stream": True}).encode()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            got = b""
            while got.count(b"data: ") < 3:
                chunk = s.recv(4096)
                self.assertTrue(chunk)
                got += chunk
            s.close()
        wait_blocks_free(self, timeout=1.0)
        self.assertIn("client_closed=1", srv.stderr(), "no stream was cut mid-generation")
        st, r = srv.post("/v1/completions", {"prompt": "Once", "max_tokens": 2})
        self.assertEqual(st, 200)


if __name__ == "__main__":
    unittest.main()
