"""Mistral's current chat format end to end, on a random-weight mistral3 file (kvs-mkmodel's tiny
shape with the attention temperature) whose vocabulary is GPT-2's under the tekken pre-tokenizer
with Mistral's special tokens appended as control tokens (</s> as EOS, [INST], [/INST],
[SYSTEM_PROMPT], the tools, results, call and argument markers, [THINK] and [/THINK], as its GGUF
files hold them) and whose template is Ministral 3 Reasoning's
(tests/data/chat_templates/ministral3-reasoning.jinja): the template is detected; the markers
tokenize to their tokens; </s> ends a generation; [TOOL_CALLS], [ARGS], [THINK] and [/THINK] are
printed (engine/tokenizer.c fix_mistral), the turn markers not. Two user-defined tokens are test
devices, so that a random model can be made to write a whole answer in one token: two calls,
[TOOL_CALLS]add[ARGS]{...}[TOOL_CALLS]mul[ARGS]{...} after some text (and a stop string after
them), come back as two tool_calls whole and streamed (the reading itself: tests/test_server.c),
and [THINK]plan[/THINK]Done as reasoning_content and content; enable_thinking is a 400 (no such
switch); turns that do not alternate are a 400, as the template raises. A forced call
(tool_choice required or named) is generated in Mistral's own syntax, [TOOL_CALLS]NAME[ARGS]ARGS
(the markers as their one token each or as text), and comes back as tool_calls."""
import json
import os
import unittest

from kvs_e2e import (ADD_MUL_TOOLS, MODELS, OneTokenAnswers, Server, marker_model)

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "..", "data", "chat_templates", "ministral3-reasoning.jinja")
VOCAB = os.path.join(MODELS, "vocab", "ggml-vocab-gpt-2.gguf")
SPECIALS = ["</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
            "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]",
            "[TOOL_CALLS]", "[ARGS]", "[THINK]", "[/THINK]"]
CALL = 'Calling.[TOOL_CALLS]add[ARGS]{"a": 1, "b": "x"}[TOOL_CALLS]mul[ARGS]{"b": 2}'
STOP = "#END"  # ends the one-token answer as a stop string (a call cut by max_tokens is not read)
THINK = "[THINK]plan[/THINK]Done"
TOOLS = ADD_MUL_TOOLS
MSGS = [{"role": "user", "content": "Hi"}]


class Ministral3(OneTokenAnswers, unittest.TestCase):
    MSGS, TOOLS, CALL, STOP, THINK = MSGS, TOOLS, CALL, STOP, THINK

    @classmethod
    def setUpClass(cls):
        path = marker_model(cls, VOCAB, "mistral3", SPECIALS, [CALL + STOP, THINK], eos="</s>",
                            pre="tekken", template=TEMPLATE,
                            mkmodel_args=("--shape", "tiny", "--arch", "mistral3", "--orig-ctx",
                                          "16", "--attn-temp", "0.1"))
        cls.srv = Server(ctx=2048, model=path)

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        cls.dir.cleanup()

    def test_detected(self):
        self.assertIn("chat template mistral3-think", self.srv.stderr())

    def test_markers_are_tokens(self):
        text = "[INST]Hi[/INST][TOOL_CALLS]add[ARGS]"
        st, out = self.srv.post("/tokenize", {"prompt": text, "add_special_tokens": False})
        self.assertEqual(st, 200, out)
        toks = out["tokens"]
        self.assertEqual(toks[0], self.ids["[INST]"])
        self.assertIn(self.ids["[/INST]"], toks)
        self.assertEqual(toks[-1], self.ids["[ARGS]"])
        self.assertIn(self.ids["[TOOL_CALLS]"], toks)

    def test_end_tokens(self):
        self.assertEqual(self.first("</s>"), ("stop", 1, ""))
        # the call and think markers are printed; the turn markers print nothing
        for shown in ("[TOOL_CALLS]", "[ARGS]", "[THINK]", "[/THINK]"):
            self.assertEqual(self.first(shown), ("length", 3, shown * 3))
        for hidden in ("[INST]", "[SYSTEM_PROMPT]", "[TOOL_RESULTS]"):
            self.assertEqual(self.first(hidden), ("length", 3, ""))

    def test_refusals(self):
        body = {"messages": MSGS, "max_tokens": 1,
                "chat_template_kwargs": {"enable_thinking": False}}
        st, out = self.srv.post("/v1/chat/completions", body)
        self.assertEqual(st, 400, out)
        body = {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
                "max_tokens": 1}
        st, out = self.srv.post("/v1/chat/completions", body)
        self.assertEqual(st, 400, out)
        self.assertIn("alternate", out["error"]["message"])
        # an earlier answer's reasoning_content goes back in [THINK] tags
        st, out = self.srv.post("/apply-template", {"messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "b", "reasoning_content": "a"},
            {"role": "user", "content": "Bye"}]})
        self.assertEqual(st, 200, out)
        self.assertIn("[INST]Hi[/INST][THINK]a[/THINK]b</s>[INST]Bye[/INST]", out["prompt"])

    def forced(self, choice):
        body = {"messages": MSGS, "tools": TOOLS, "tool_choice": choice, "max_tokens": 64,
                "temperature": 0}
        st, out = self.srv.post("/v1/chat/completions", body)
        self.assertEqual(st, 200, out)
        c = out["choices"][0]
        if c["finish_reason"] == "length":
            self.skipTest("this random model's call did not end in 64 tokens")
        self.assertEqual(c["finish_reason"], "tool_calls", out)
        calls = c["message"]["tool_calls"]
        self.assertEqual(len(calls), 1, calls)
        fn = calls[0]["function"]
        key = {"add": "a", "mul": "b"}[fn["name"]]
        self.assertIsInstance(json.loads(fn["arguments"])[key], (int, float))
        st, events, done = self.srv.stream("/v1/chat/completions", dict(body, stream=True))
        self.assertEqual(st, 200, events)
        self.assertTrue(done)
        deltas = [e["choices"][0] for e in events if e.get("choices")]
        streamed = [t for d in deltas for t in d["delta"].get("tool_calls") or []]
        self.assertEqual(len(streamed), 1, deltas)
        self.assertEqual(streamed[0]["function"]["arguments"], fn["arguments"])
        return fn

    def test_required(self):
        self.forced("required")
        # the raw text, through logprobs: Mistral's syntax, not the generic object
        body = {"messages": MSGS, "tools": TOOLS, "tool_choice": "required", "max_tokens": 64,
                "temperature": 0, "logprobs": True}
        st, out = self.srv.post("/v1/chat/completions", body)
        self.assertEqual(st, 200, out)
        raw = "".join(t["token"] for t in out["choices"][0]["logprobs"]["content"])
        self.assertTrue(raw.startswith("[TOOL_CALLS]add[ARGS]{") or
                        raw.startswith("[TOOL_CALLS]mul[ARGS]{"), raw)

    def test_named(self):
        self.assertEqual(self.forced({"type": "function", "function": {"name": "mul"}})["name"],
                         "mul")


if __name__ == "__main__":
    unittest.main()
