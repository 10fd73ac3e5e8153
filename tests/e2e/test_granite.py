"""IBM Granite 3.x end to end, on a random-weight granite file whose vocabulary is GPT-2's with
Granite's special tokens appended as control tokens (<|end_of_text|> as EOS, <|start_of_role|>,
<|end_of_role|>, <|tool_call|>, as llama.cpp's converter stores Granite's special added tokens)
and whose template is Granite 3.1's official one (tests/data/chat_templates/granite3.1.jinja):
the template is detected; the role markers tokenize to their tokens; <|end_of_text|> ends a
generation; <|tool_call|> is printed in the output (a Granite vocabulary's call marker is made
user-defined at load, engine/tokenizer.c fix_granite) and reaches the call reader (which reads
<|tool_call|>[...] back as calls: tests/test_server.c); a forced call (tool_choice required or
named) is written in Granite's own syntax, <|tool_call|> then a JSON list of the calls (the raw
text seen through logprobs; the marker as its one token when favoured), and comes back as
tool_calls, whole and streamed. Granite 3.3's
template (granite3.3.jinja) on the same vocabulary with <think> and </think> appended as
user-defined tokens, a test device (Granite 3.3 writes them as text): chat_template_kwargs.thinking
adds its reasoning system text, enable_thinking and documents are 400s naming them, and an
answer opening with <think> comes back as reasoning_content (the splitting itself:
tests/test_server.c), whole and streamed alike. Granite 4.0's template (granite4.0.jinja,
class Granite40): detected, its prompts, its call tags printed, and forced calls written as
"<tool_call>\n" then one call (the block left open) and read back, whole and streamed."""
import json
import os
import unittest

from kvs_e2e import (ADD_MUL_TOOLS, MODELS, Server, forced_first, forced_marker_calls, marker_model)

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "..", "data", "chat_templates", "granite3.1.jinja")
VOCAB = os.path.join(MODELS, "vocab", "ggml-vocab-gpt-2.gguf")
SPECIALS = ["<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>", "<|tool_call|>"]
TOOLS = ADD_MUL_TOOLS
MSGS = [{"role": "user", "content": "Hi"}]
GRANITE = ("--shape", "tiny", "--arch", "granite")


def template_path(name):
    return os.path.join(HERE, "..", "data", "chat_templates", name + ".jinja")


class Granite(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        path = marker_model(cls, VOCAB, "granite", SPECIALS, eos="<|end_of_text|>",
                            template=TEMPLATE, mkmodel_args=GRANITE)
        cls.srv = Server(ctx=2048, model=path)

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        cls.dir.cleanup()

    def test_detected(self):
        self.assertIn("chat template granite", self.srv.stderr())

    def test_markers_are_tokens(self):
        text = "<|start_of_role|>user<|end_of_role|>Hi<|end_of_text|><|tool_call|>"
        st, out = self.srv.post("/tokenize", {"prompt": text, "add_special_tokens": False})
        self.assertEqual(st, 200, out)
        toks = out["tokens"]
        self.assertEqual(toks[0], self.ids["<|start_of_role|>"])
        self.assertIn(self.ids["<|end_of_role|>"], toks)
        self.assertEqual(toks[-2:], [self.ids["<|end_of_text|>"], self.ids["<|tool_call|>"]])

    def first(self, name, max_tokens=3):
        return forced_first(self, self.srv, self.ids[name], max_tokens)

    def test_end_tokens(self):
        # <|end_of_text|> (Granite's EOS) ends the generation and prints nothing
        self.assertEqual(self.first("<|end_of_text|>"), ("stop", 1, ""))
        # the call marker is printed; the role markers stay control tokens (printing nothing)
        self.assertEqual(self.first("<|tool_call|>"), ("length", 3, "<|tool_call|>" * 3))
        self.assertEqual(self.first("<|start_of_role|>"), ("length", 3, ""))

    def test_marker_reaches_call_reader(self):
        # tools on (auto), the model made to open with the marker: its text reaches the call
        # reader, which holds back what follows it (no valid list follows from a random model,
        # so the text stays content, marker included), the same streamed and whole
        body = {"messages": MSGS, "tools": TOOLS, "max_tokens": 2, "temperature": 0,
                "logit_bias": {str(self.ids["<|tool_call|>"]): 100}}
        st, out = self.srv.post("/v1/chat/completions", body)
        self.assertEqual(st, 200, out)
        msg = out["choices"][0]["message"]
        self.assertEqual(msg["content"], "<|tool_call|>" * 2, out)
        st, events, done = self.srv.stream("/v1/chat/completions", dict(body, stream=True))
        self.assertEqual(st, 200, events)
        self.assertTrue(done)
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                       if e.get("choices"))
        self.assertEqual(text, msg["content"])

    def forced(self, choice, **extra):
        """A forced call in Granite's own syntax, <|tool_call|> then the JSON list of the calls
        (kvs_e2e.forced_marker_calls)."""
        return forced_marker_calls(self, self.srv, "<|tool_call|>", MSGS, choice, **extra)

    def test_required(self):
        # one call or more (parallel_tool_calls defaults to true), each one of the tools'
        self.assertGreaterEqual(len(self.forced("required")), 1)
        # parallel_tool_calls false: the grammar's list holds exactly one
        self.assertEqual(len(self.forced("required", parallel_tool_calls=False)), 1)

    def test_named(self):
        calls = self.forced({"type": "function", "function": {"name": "mul"}})
        self.assertEqual([t["function"]["name"] for t in calls], ["mul"])

    def test_marker_token(self):
        # <|tool_call|> is a special token whose text the grammar matches: favoured, the model
        # writes it as that one token, and the call still reads back
        calls = self.forced("required", logit_bias={str(self.ids["<|tool_call|>"]): 30})
        self.assertGreaterEqual(len(calls), 1)
        body = {"messages": MSGS, "tools": TOOLS, "tool_choice": "required", "max_tokens": 64,
                "temperature": 0, "logprobs": True,
                "logit_bias": {str(self.ids["<|tool_call|>"]): 30}}
        st, out = self.srv.post("/v1/chat/completions", body)
        self.assertEqual(st, 200, out)
        self.assertEqual(out["choices"][0]["logprobs"]["content"][0]["token"], "<|tool_call|>")


class Granite33(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        path = marker_model(cls, VOCAB, "granite33", SPECIALS, ["<think>", "</think>"],
                            eos="<|end_of_text|>", template=template_path("granite3.3"),
                            mkmodel_args=GRANITE)
        cls.srv = Server(ctx=2048, model=path)
        cls.none = Server("--reasoning-format", "none", ctx=2048, model=path)

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        cls.none.stop()
        cls.dir.cleanup()

    def test_detected(self):
        self.assertIn("chat template granite3.3", self.srv.stderr())

    def test_thinking_switch(self):
        prompts = {}
        for kw in (None, {"thinking": False}, {"thinking": True}):
            body = {"messages": MSGS}
            if kw is not None:
                body["chat_template_kwargs"] = kw
            st, out = self.srv.post("/apply-template", body)
            self.assertEqual(st, 200, out)
            prompts[json.dumps(kw)] = out["prompt"]
        self.assertEqual(prompts["null"], prompts['{"thinking": false}'])
        self.assertNotIn("<think>", prompts["null"])
        self.assertIn("Write your thoughts between <think></think> and write your response "
                      "between <response></response> for each user query.<|end_of_text|>",
                      prompts['{"thinking": true}'])
        for body, param, why in (
                ({"chat_template_kwargs": {"enable_thinking": True}}, "chat_template_kwargs",
                 "chat_template_kwargs.thinking"),
                ({"chat_template_kwargs": {"thinking": "yes"}}, "chat_template_kwargs",
                 "must be a boolean"),
                ({"chat_template_kwargs": {"documents": []}}, "chat_template_kwargs",
                 "documents is not supported"),
                ({"documents": [{"doc_id": 1, "text": "x"}]}, "documents", "not supported")):
            st, out = self.srv.post("/v1/chat/completions",
                                    dict(body, messages=MSGS, max_tokens=1))
            self.assertEqual(st, 400, out)
            self.assertEqual(out["error"]["param"], param, out)
            self.assertIn(why, out["error"]["message"])

    def chat(self, srv, stream=False):
        body = {"messages": MSGS, "max_tokens": 3, "temperature": 0,
                "logit_bias": {str(self.ids["<think>"]): 100}}
        if not stream:
            st, out = srv.post("/v1/chat/completions", body)
            self.assertEqual(st, 200, out)
            m = out["choices"][0]["message"]
            return m.get("content") or None, m.get("reasoning_content")
        st, events, done = srv.stream("/v1/chat/completions", dict(body, stream=True))
        self.assertEqual(st, 200, events)
        self.assertTrue(done)
        d = [e["choices"][0]["delta"] for e in events if e.get("choices")]
        return ("".join(x.get("content") or "" for x in d) or None,
                "".join(x.get("reasoning_content") or "" for x in d) or None)

    def test_split_wiring(self):
        # <think> three times: a think block never closed, all reasoning; with none, content
        self.assertEqual(self.chat(self.srv), (None, "<think><think>"))
        self.assertEqual(self.chat(self.srv, stream=True), (None, "<think><think>"))
        self.assertEqual(self.chat(self.none), ("<think>" * 3, None))


class Granite40(unittest.TestCase):
    """Granite 4.0 (granite4.0.jinja) on GPT-2's vocabulary with Granite 4.0's role markers and
    <tools>, </tools> appended as control tokens, and its call tags <tool_call>, </tool_call>
    as control tokens too: its own vocabulary holds the tags as plain added tokens (printed
    anyway); as control tokens they show fix_granite prints them (the test fails without it)."""

    @classmethod
    def setUpClass(cls):
        path = marker_model(
            cls, VOCAB, "granite4", ["<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>",
                                     "<tools>", "</tools>", "<tool_call>", "</tool_call>"],
            ["<tool_response>", "</tool_response>"], eos="<|end_of_text|>",
            template=template_path("granite4.0"), mkmodel_args=GRANITE)
        cls.srv = Server(ctx=2048, model=path)

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        cls.dir.cleanup()

    def test_detected(self):
        self.assertIn("chat template granite4.0", self.srv.stderr())

    def test_prompt(self):
        # no system message: the template's default; tools: in <tools> in the system turn
        st, out = self.srv.post("/apply-template", {"messages": MSGS})
        self.assertEqual(st, 200, out)
        self.assertEqual(out["prompt"], "<|start_of_role|>system<|end_of_role|>You are a helpful "
                         "assistant. Please ensure responses are professional, accurate, and "
                         "safe.<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Hi"
                         "<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>")
        st, out = self.srv.post("/apply-template", {"messages": MSGS, "tools": TOOLS})
        self.assertEqual(st, 200, out)
        self.assertTrue(out["prompt"].startswith(
            "<|start_of_role|>system<|end_of_role|>You are a helpful assistant with access to "
            "the following tools."), out)
        self.assertIn("<tools>\n" + json.dumps(TOOLS[0]) + "\n", out["prompt"])
        # no switches: the template reads none
        st, out = self.srv.post("/v1/chat/completions", {
            "messages": MSGS, "max_tokens": 1, "chat_template_kwargs": {"thinking": True}})
        self.assertEqual(st, 400, out)

    def test_tokens(self):
        text = "<|start_of_role|>user<|end_of_role|>Hi<|end_of_text|><tool_call></tool_call>"
        st, out = self.srv.post("/tokenize", {"prompt": text, "add_special_tokens": False})
        self.assertEqual(st, 200, out)
        toks = out["tokens"]
        self.assertEqual(toks[0], self.ids["<|start_of_role|>"])
        self.assertEqual(toks[-3:], [self.ids["<|end_of_text|>"], self.ids["<tool_call>"],
                                     self.ids["</tool_call>"]])
        # the call tags print; <|end_of_text|> ends a generation; <tools> prints nothing
        self.assertEqual(forced_first(self, self.srv, self.ids["<|end_of_text|>"]),
                         ("stop", 1, ""))
        self.assertEqual(forced_first(self, self.srv, self.ids["<tool_call>"]),
                         ("length", 3, "<tool_call>" * 3))
        self.assertEqual(forced_first(self, self.srv, self.ids["</tool_call>"]),
                         ("length", 3, "</tool_call>" * 3))
        self.assertEqual(forced_first(self, self.srv, self.ids["<tools>"]), ("length", 3, ""))

    def forced(self, choice, **extra):
        """A forced call, whole and streamed: the raw text (the tokens' logprobs view) is
        "<tool_call>\n" then the one call returned, the block left open (the grammar ends it
        there); finish_reason tool_calls, no content."""
        body = {"messages": MSGS, "tools": TOOLS, "tool_choice": choice, "max_tokens": 64,
                "temperature": 0}
        body.update(extra)
        st, out = self.srv.post("/v1/chat/completions", dict(body, logprobs=True))
        self.assertEqual(st, 200, out)
        c = out["choices"][0]
        if c["finish_reason"] == "length":
            self.skipTest("this random model's call did not end in 64 tokens")
        self.assertEqual(c["finish_reason"], "tool_calls", out)
        self.assertIsNone(c["message"]["content"], out)
        calls = c["message"]["tool_calls"]
        self.assertEqual(len(calls), 1, out)
        raw = "".join(t["token"] for t in c["logprobs"]["content"])
        self.assertTrue(raw.startswith("<tool_call>\n{"), raw)
        f = calls[0]["function"]
        self.assertEqual(json.loads(raw[len("<tool_call>\n"):]),
                         {"name": f["name"], "arguments": json.loads(f["arguments"])})
        st, events, done = self.srv.stream("/v1/chat/completions", dict(body, stream=True))
        self.assertEqual(st, 200, events)
        self.assertTrue(done)
        deltas = [e["choices"][0] for e in events if e.get("choices")]
        streamed = [t for d in deltas for t in d["delta"].get("tool_calls") or []]
        self.assertEqual([(t["function"]["name"], t["function"]["arguments"]) for t in streamed],
                         [(f["name"], f["arguments"])])
        self.assertFalse("".join(d["delta"].get("content") or "" for d in deltas))
        self.assertEqual(deltas[-1]["finish_reason"], "tool_calls")
        return calls

    def test_required(self):
        self.forced("required")
        self.forced("required", parallel_tool_calls=False)

    def test_named(self):
        calls = self.forced({"type": "function", "function": {"name": "mul"}})
        self.assertEqual(calls[0]["function"]["name"], "mul")

    def test_tag_token(self):
        # favoured, the model writes the opening tag as its one token, and the call reads back
        self.forced("required", logit_bias={str(self.ids["<tool_call>"]): 30})
        body = {"messages": MSGS, "tools": TOOLS, "tool_choice": "required", "max_tokens": 64,
                "temperature": 0, "logprobs": True,
                "logit_bias": {str(self.ids["<tool_call>"]): 30}}
        st, out = self.srv.post("/v1/chat/completions", body)
        self.assertEqual(st, 200, out)
        self.assertEqual(out["choices"][0]["logprobs"]["content"][0]["token"], "<tool_call>")

    def test_tag_reaches_call_reader(self):
        # tools on (auto), the model made to open with the tag: the reader holds back what
        # follows it, and with no call after it (a random model's) the text stays content,
        # the same streamed and whole
        body = {"messages": MSGS, "tools": TOOLS, "max_tokens": 2, "temperature": 0,
                "logit_bias": {str(self.ids["<tool_call>"]): 100}}
        st, out = self.srv.post("/v1/chat/completions", body)
        self.assertEqual(st, 200, out)
        msg = out["choices"][0]["message"]
        self.assertEqual(msg["content"], "<tool_call>" * 2, out)
        st, events, done = self.srv.stream("/v1/chat/completions", dict(body, stream=True))
        self.assertEqual(st, 200, events)
        self.assertTrue(done)
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                       if e.get("choices"))
        self.assertEqual(text, msg["content"])


if __name__ == "__main__":
    unittest.main()
