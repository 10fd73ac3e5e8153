"""gpt-oss's harmony format end to end, on a random-weight gpt-oss file whose vocabulary is
GPT-2's with harmony's special tokens (harmony_vocab.py) and whose template is gpt-oss's
official one (tests/data/chat_templates/gpt-oss.jinja): the template is detected; the markers
tokenize to their tokens; a generation ends at <|return|> or <|call|> but not at <|end|>, which
closes one message of several and is written out (as llama.cpp loads that vocabulary); the
reasoning effort reaches the system message, a bad one is a 400 naming it. A random model does
not write channels, so the splitting itself is checked in tests/test_server.c
(test_harmony_split, whole and at every cut); here its wiring: output that never reaches a
<|message|> is header only (no content, no reasoning) with --reasoning-format auto, the raw
text with none, the same streamed and not. A forced call (test_required, test_named) makes it
write channels: an optional analysis message, then the call in gpt-oss's format."""
import json
import os
import subprocess
import tempfile
import unittest

import harmony_vocab
from kvs_e2e import MKMODEL, MODELS, Server, forced_first, require_mkmodel

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "..", "data", "chat_templates", "gpt-oss.jinja")
VOCAB = os.path.join(MODELS, "vocab", "ggml-vocab-gpt-2.gguf")
TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Adds two numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"}},
                   "required": ["a"]}}}]


class Harmony(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        require_mkmodel(VOCAB)
        cls.dir = tempfile.TemporaryDirectory()
        vocab = os.path.join(cls.dir.name, "harmony-vocab.gguf")
        cls.ids = harmony_vocab.make(VOCAB, vocab)
        path = os.path.join(cls.dir.name, "harmony.gguf")
        with open(TEMPLATE) as f:
            template = f.read()
        subprocess.run([MKMODEL, "--shape", "tiny", "--arch", "gpt-oss", "--vocab", vocab,
                        "-o", path, "--chat-template", template], check=True,
                       capture_output=True)
        cls.auto = Server(model=path)
        cls.none = Server("--reasoning-format", "none", model=path)

    @classmethod
    def tearDownClass(cls):
        cls.auto.stop()
        cls.none.stop()
        cls.dir.cleanup()

    def test_detected(self):
        self.assertIn("chat template harmony", self.auto.stderr())

    def test_markers_are_tokens(self):
        st, out = self.auto.post("/tokenize", {"prompt": "<|start|>user<|message|>Hi<|end|>",
                                               "add_special_tokens": False})
        self.assertEqual(st, 200, out)
        toks = out["tokens"]
        self.assertEqual(toks[0], self.ids["<|start|>"])
        self.assertEqual(toks[-1], self.ids["<|end|>"])
        self.assertIn(self.ids["<|message|>"], toks)

    def first(self, name, max_tokens=3):
        return forced_first(self, self.auto, self.ids[name], max_tokens)

    def test_end_tokens(self):
        self.assertEqual(self.first("<|return|>"), ("stop", 1, ""))
        self.assertEqual(self.first("<|call|>"), ("stop", 1, ""))
        # <|end|> closes a message, not the generation, and is text the splitter reads
        self.assertEqual(self.first("<|end|>"), ("length", 3, "<|end|>" * 3))
        self.assertEqual(self.first("<|channel|>"), ("length", 3, "<|channel|>" * 3))

    def test_reasoning_effort(self):
        msgs = [{"role": "user", "content": "Hi"}]
        for body, effort in (({}, "medium"), ({"reasoning_effort": "low"}, "low"),
                             ({"chat_template_kwargs": {"reasoning_effort": "high"}}, "high"),
                             ({"reasoning_effort": "high",
                               "chat_template_kwargs": {"reasoning_effort": "high"}}, "high"),
                             ({"chat_template_kwargs": {"model_identity": "You are T."}},
                              "medium")):
            st, out = self.auto.post("/apply-template", dict(body, messages=msgs))
            self.assertEqual(st, 200, out)
            self.assertIn("\n\nReasoning: %s\n\n" % effort, out["prompt"])
            ident = body.get("chat_template_kwargs", {}).get("model_identity")
            self.assertTrue(out["prompt"].startswith("<|start|>system<|message|>%s\n" % (
                ident or "You are ChatGPT, a large language model trained by OpenAI.")))
        for body, param in (({"reasoning_effort": "max"}, "reasoning_effort"),
                            ({"reasoning_effort": 1}, "reasoning_effort"),
                            ({"chat_template_kwargs": {"reasoning_effort": "none"}},
                             "chat_template_kwargs"),
                            ({"reasoning_effort": "low",
                              "chat_template_kwargs": {"reasoning_effort": "high"}},
                             "reasoning_effort"),
                            ({"chat_template_kwargs": {"enable_thinking": False}},
                             "chat_template_kwargs"),
                            ({"chat_template_kwargs": {"model_identity": 3}},
                             "chat_template_kwargs"),
                            ({"chat_template_kwargs": {"builtin_tools": ["python"]}},
                             "chat_template_kwargs")):
            st, out = self.auto.post("/v1/chat/completions",
                                     dict(body, messages=msgs, max_tokens=2))
            self.assertEqual(st, 400, (body, out))
            self.assertEqual(out["error"]["param"], param, out)
        st, out = self.auto.post("/v1/chat/completions",
                                 {"messages": msgs, "max_tokens": 2, "reasoning_effort": "low"})
        self.assertEqual(st, 200, out)

    def test_responses_reasoning(self):
        # /v1/responses renders through the same template: reasoning.effort is its effort
        st, out = self.auto.post("/v1/responses", {"input": "Hi", "max_output_tokens": 2,
                                                   "reasoning": {"effort": "high"}})
        self.assertEqual(st, 200, out)
        for body, param in (({"effort": "max"}, "reasoning.effort"),
                            ({"summary": "auto"}, "reasoning"), ("low", "reasoning")):
            st, out = self.auto.post("/v1/responses", {"input": "Hi", "max_output_tokens": 2,
                                                       "reasoning": body})
            self.assertEqual(st, 400, out)
            self.assertEqual(out["error"]["param"], param, out)

    def chat(self, srv, stream=False, **extra):
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                "temperature": 0}
        body.update(extra)
        if not stream:
            st, out = srv.post("/v1/chat/completions", body)
            self.assertEqual(st, 200, out)
            m = out["choices"][0]["message"]
            return m.get("content"), m.get("reasoning_content")
        st, events, done = srv.stream("/v1/chat/completions", dict(body, stream=True))
        self.assertEqual(st, 200)
        self.assertTrue(done)
        deltas = [e["choices"][0]["delta"] for e in events if e.get("choices")]
        return ("".join(d.get("content") or "" for d in deltas),
                "".join(d.get("reasoning_content") or "" for d in deltas) or None)

    def test_split_wiring(self):
        header_only = {"logit_bias": {str(self.ids["<|channel|>"]): 100}}
        self.assertEqual(self.chat(self.none, **header_only), ("<|channel|>" * 4, None))
        self.assertIn(self.chat(self.auto, **header_only), (("", None), (None, None)))
        self.assertEqual(self.chat(self.auto, stream=True, **header_only), ("", None))
        # output that does not open with a channel is all content, as it came
        plain, _ = self.chat(self.none)
        if plain.startswith("<|channel|>") or plain.startswith(" to="):
            self.skipTest("this random model happens to write a header")
        self.assertEqual(self.chat(self.auto), (plain, None))
        self.assertEqual(self.chat(self.auto, stream=True), (plain, None))

    def test_tools(self):
        st, out = self.auto.post("/apply-template", {"messages": [{"role": "user", "content": "Hi"}],
                                                     "tools": TOOLS})
        self.assertEqual(st, 200, out)
        self.assertIn("<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace "
                      "functions {\n\n// Adds two numbers.\ntype add = (_: {\na: number,\n}) => "
                      "any;\n\n} // namespace functions<|end|>", out["prompt"])
        st, out = self.auto.post("/v1/chat/completions",
                                 {"messages": [{"role": "user", "content": "Hi"}], "tools": TOOLS,
                                  "max_tokens": 3})
        self.assertEqual(st, 200, out)
        # tool_choice required and a named function: see test_required, test_named
        # a result with no call before it: the template raises, kvserve refuses
        st, out = self.auto.post("/v1/chat/completions", {"messages": [
            {"role": "user", "content": "Hi"},
            {"role": "tool", "tool_call_id": "c1", "content": "5"}], "max_tokens": 3})
        self.assertEqual(st, 400, out)
        self.assertEqual(out["error"]["param"], "messages")


    def test_responses_tools_stream(self):
        # tools (auto) on gpt-oss's template: the answer streams through the channel splitter
        # and the call-marker check as it comes, and adds up to the whole response's text
        body = {"input": "Hi", "tools": [dict(t["function"], type="function") for t in TOOLS],
                "max_output_tokens": 8, "temperature": 0}
        st, whole = self.auto.post("/v1/responses", body)
        self.assertEqual(st, 200, whole)
        msgs = [o for o in whole["output"] if o["type"] == "message"]
        if len(msgs) != 1 or "<" in msgs[0]["content"][0]["text"]:
            self.skipTest("this random model wrote a header or a marker")
        text = msgs[0]["content"][0]["text"]
        st, events = self.auto.stream_typed("/v1/responses", dict(body, stream=True))
        self.assertEqual(st, 200, events)
        deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
        self.assertEqual("".join(deltas), text)
        self.assertGreater(len(deltas), 1)

    MUL = {"type": "function", "function": {"name": "mul", "parameters": {
        "type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}}}
    ANALYSIS = "<|channel|>analysis<|message|>"

    def call_text(self, name, args):
        return "<|channel|>commentary to=functions.%s <|constrain|>json<|message|>%s" % (name, args)

    def check_call(self, c, raw_analysis, names=("add", "mul")):
        """Choice c (asked with logprobs) is one call of one of names, and its raw text (the
        tokens' logprobs view) is the analysis message raw_analysis (its text, or None for
        none), then the call in gpt-oss's format. Returns the call's function."""
        self.assertEqual(c["finish_reason"], "tool_calls", c)
        calls = c["message"]["tool_calls"]
        self.assertEqual(len(calls), 1, calls)
        fn = calls[0]["function"]
        self.assertIn(fn["name"], names)
        key = {"add": "a", "mul": "b"}[fn["name"]]
        self.assertIsInstance(json.loads(fn["arguments"])[key], (int, float))
        raw = "".join(t["token"] for t in c["logprobs"]["content"])
        args = raw[raw.rindex("<|message|>") + len("<|message|>"):]
        self.assertEqual(json.loads(args), json.loads(fn["arguments"]))
        head = "" if raw_analysis is None else (
            self.ANALYSIS + raw_analysis + "<|end|><|start|>assistant")
        self.assertEqual(raw, head + self.call_text(fn["name"], args))
        return fn

    def test_required(self):
        """tool_choice "required": the prompt ends where the assistant's turn begins, as
        unforced, and the output is constrained to an optional analysis message, then a call of
        one of the tools in gpt-oss's format (<|channel|>commentary to=functions.NAME
        <|constrain|>json<|message|>ARGS), read back as the call: chat whole and streamed, with
        --reasoning-format none too, and /v1/responses' function_call item. A random model's
        greedy analysis runs on, so <|end|> is favoured here (an empty analysis message, the
        form the grammar allows before the call); test_required_reasoning has a longer one. One
        call, as gpt-oss ends its generation at a call's <|call|>."""
        tools = TOOLS + [self.MUL]
        end = {str(self.ids["<|end|>"]): 100}
        req = {"messages": [{"role": "user", "content": "Hi"}], "tools": tools,
               "tool_choice": "required"}
        st, out = self.auto.post("/apply-template", req)
        self.assertEqual(st, 200, out)
        self.assertTrue(out["prompt"].endswith("<|end|><|start|>assistant"), out["prompt"][-120:])
        body = dict(req, max_tokens=64, parallel_tool_calls=True, temperature=0, logprobs=True,
                    logit_bias=end)
        st, out = self.auto.post("/v1/chat/completions", body)
        self.assertEqual(st, 200, out)
        c = out["choices"][0]
        if c["finish_reason"] == "length":
            self.skipTest("this random model's call did not end in 64 tokens")
        whole = self.check_call(c, "")
        self.assertIsNone(c["message"]["content"], out)
        self.assertIsNone(c["message"].get("reasoning_content"), out)
        # --reasoning-format none: the analysis message stays content, as written
        st, out = self.none.post("/v1/chat/completions", body)
        self.assertEqual(st, 200, out)
        c = out["choices"][0]
        self.assertEqual(self.check_call(c, ""), whole)
        self.assertEqual(c["message"]["content"], self.ANALYSIS + "<|end|>")
        # streamed: the same call (greedy), as delta.tool_calls
        st, events, done = self.auto.stream("/v1/chat/completions", dict(body, stream=True))
        self.assertEqual(st, 200, events)
        self.assertTrue(done)
        deltas = [e["choices"][0] for e in events if e.get("choices")]
        streamed = [t for d in deltas for t in d["delta"].get("tool_calls") or []]
        self.assertEqual(len(streamed), 1, deltas)
        self.assertEqual(streamed[0]["function"]["name"], whole["name"])
        self.assertEqual(streamed[0]["function"]["arguments"], whole["arguments"])
        self.assertEqual(deltas[-1]["finish_reason"], "tool_calls")
        self.assertFalse("".join(d["delta"].get("content") or "" for d in deltas))
        # /v1/responses: a function_call item, whole and streamed
        rbody = {"input": "Hi", "tools": [dict(t["function"], type="function") for t in tools],
                 "tool_choice": "required", "max_output_tokens": 64, "temperature": 0,
                 "logit_bias": end}
        st, r = self.auto.post("/v1/responses", rbody)
        self.assertEqual(st, 200, r)
        calls = [o for o in r["output"] if o["type"] == "function_call"]
        self.assertEqual(len(calls), 1, r["output"])
        self.assertEqual((calls[0]["name"], calls[0]["arguments"]),
                         (whole["name"], whole["arguments"]))
        st, events = self.auto.stream_typed("/v1/responses", dict(rbody, stream=True))
        self.assertEqual(st, 200, events)
        args = [e["arguments"] for e in events
                if e.get("type") == "response.function_call_arguments.done"]
        self.assertEqual(args, [whole["arguments"]])
        # <|constrain|> is a special token whose text the grammar matches: with " <" (GPT-2's
        # token) barred, the model writes it as that one token, and the call still reads back
        st, tk = self.auto.post("/tokenize", {"prompt": " <", "add_special_tokens": False})
        self.assertEqual(st, 200, tk)
        st, out = self.auto.post("/v1/chat/completions", dict(
            body, logit_bias=dict(end, **{str(tk["tokens"][0]): -100,
                                          str(self.ids["<|constrain|>"]): 30})))
        self.assertEqual(st, 200, out)
        c = out["choices"][0]
        if c["finish_reason"] == "length":
            self.skipTest("this random model's call did not end in 64 tokens")
        self.assertIn("<|constrain|>", [t["token"] for t in c["logprobs"]["content"]])
        self.check_call(c, "")
        # a name gpt-oss's header cannot carry is a 400 naming tools
        bad = dict(req, tools=[{"type": "function", "function": {"name": "two words"}}])
        st, out = self.auto.post("/v1/chat/completions", bad)
        self.assertEqual(st, 400, out)
        self.assertEqual(out["error"]["param"], "tools", out)

    def test_required_reasoning(self):
        """tool_choice "required" with an analysis message of some length before the call
        (sampled, <|end|> favoured a little: the first seed that writes one is taken): the raw
        text is that message then the call; the analysis comes back as reasoning_content (one
        reasoning delta before the calls streamed; the reasoning item of /v1/responses) and
        counts as reasoning tokens, and with --reasoning-format none stays content as written."""
        tools = TOOLS + [self.MUL]
        body = {"messages": [{"role": "user", "content": "Hi"}], "tools": tools,
                "tool_choice": "required", "max_tokens": 64, "temperature": 1, "logprobs": True,
                "logit_bias": {str(self.ids["<|end|>"]): 10}}
        for seed in range(1, 17):
            st, out = self.auto.post("/v1/chat/completions", dict(body, seed=seed))
            self.assertEqual(st, 200, out)
            c = out["choices"][0]
            if c["finish_reason"] == "tool_calls" and c["message"].get("reasoning_content"):
                break
        else:
            self.skipTest("no seed gave this random model an analysis message and a call")
        body["seed"] = seed
        thought = c["message"]["reasoning_content"]
        fn = self.check_call(c, thought)
        self.assertIsNone(c["message"]["content"], out)
        self.assertGreater(out["usage"]["completion_tokens_details"]["reasoning_tokens"], 0)
        st, out = self.none.post("/v1/chat/completions", body)
        self.assertEqual(st, 200, out)
        c = out["choices"][0]
        self.assertEqual(self.check_call(c, thought), fn)
        self.assertEqual(c["message"]["content"], self.ANALYSIS + thought + "<|end|>")
        self.assertIsNone(c["message"].get("reasoning_content"))
        st, events, done = self.auto.stream("/v1/chat/completions",
                                            dict(body, stream=True, logprobs=False))
        self.assertEqual(st, 200, events)
        self.assertTrue(done)
        deltas = [e["choices"][0]["delta"] for e in events if e.get("choices")]
        self.assertEqual("".join(d.get("reasoning_content") or "" for d in deltas), thought)
        streamed = [t["function"] for d in deltas for t in d.get("tool_calls") or []]
        self.assertEqual([(t["name"], t["arguments"]) for t in streamed],
                         [(fn["name"], fn["arguments"])])
        rbody = {"input": "Hi", "tools": [dict(t["function"], type="function") for t in tools],
                 "tool_choice": "required", "max_output_tokens": 64, "temperature": 1,
                 "seed": seed, "logit_bias": body["logit_bias"]}
        st, r = self.auto.post("/v1/responses", rbody)
        self.assertEqual(st, 200, r)
        self.assertEqual([o["type"] for o in r["output"]], ["reasoning", "function_call"])
        self.assertEqual(r["output"][0]["content"][0]["text"], thought)
        self.assertEqual((r["output"][1]["name"], r["output"][1]["arguments"]),
                         (fn["name"], fn["arguments"]))

    def test_named(self):
        """A named function: the prompt ends where the assistant's turn begins, as for
        "required", and the output is an optional analysis message then that function's call
        (no other), read back as the call."""
        named = {"messages": [{"role": "user", "content": "Hi"}], "tools": TOOLS + [self.MUL],
                 "tool_choice": {"type": "function", "function": {"name": "mul"}}}
        st, out = self.auto.post("/apply-template", named)
        self.assertEqual(st, 200, out)
        self.assertTrue(out["prompt"].endswith("<|end|><|start|>assistant"), out["prompt"][-120:])
        for bias in (100, 10):  # an empty analysis message; sampled, maybe a longer one
            st, out = self.auto.post("/v1/chat/completions", dict(
                named, max_tokens=64, temperature=0 if bias == 100 else 1, seed=3,
                logprobs=True, logit_bias={str(self.ids["<|end|>"]): bias}))
            self.assertEqual(st, 200, out)
            c = out["choices"][0]
            if c["finish_reason"] == "length":
                self.skipTest("this random model's call did not end in 64 tokens")
            thought = c["message"].get("reasoning_content")
            self.check_call(c, "" if bias == 100 else thought, names=("mul",))
            self.assertIsNone(c["message"]["content"])


if __name__ == "__main__":
    unittest.main()
