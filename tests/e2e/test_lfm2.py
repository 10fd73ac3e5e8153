"""Liquid AI's LFM2.5 chat side end to end, on a random-weight lfm2 file (kvs-mkmodel's swa7
shape: short convolutions and attention layers) whose vocabulary is GPT-2's under the lfm2 pre-tokenizer
with LFM2's special tokens appended as control tokens (<|im_end|> as EOS, <|im_start|>, the tool
list, call and response markers, <think> and </think>, as its GGUF files hold them) and whose
template is LFM2.5-1.2B-Instruct's (tests/data/chat_templates/lfm2.5.jinja): the template is
detected; the markers tokenize to their tokens; <|im_end|> ends a generation; <|tool_call_start|>,
<|tool_call_end|>, <think> and </think> are printed (engine/tokenizer.c fix_lfm2), the list and
role markers not. Two user-defined tokens are test devices, so that a random model can be made to
write a whole answer in one token: a call block, <|tool_call_start|>[add(a=1, b='x'), mul(b=2)]
<|tool_call_end|> after some text (and a stop string after it), comes back as two tool_calls whole and streamed (the reading
itself: tests/test_server.c), and <think>plan</think>Done as reasoning_content and content;
enable_thinking is a 400 (no such switch), keep_past_thinking keeps earlier think blocks.
A forced call (tool_choice required or named) is generated in llama.cpp's LFM2 form,
<|tool_call_start|> then a JSON list of {"name", "arguments"} objects, and comes back as
tool_calls."""
import os
import unittest

from kvs_e2e import (ADD_MUL_TOOLS, MODELS, OneTokenAnswers, Server, forced_marker_calls,
                     marker_model)

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "..", "data", "chat_templates", "lfm2.5.jinja")
VOCAB = os.path.join(MODELS, "vocab", "ggml-vocab-gpt-2.gguf")
SPECIALS = ["<|startoftext|>", "<|im_start|>", "<|im_end|>", "<|tool_list_start|>",
            "<|tool_list_end|>", "<|tool_call_start|>", "<|tool_call_end|>",
            "<|tool_response_start|>", "<|tool_response_end|>", "<think>", "</think>"]
CALL = "Calling.<|tool_call_start|>[add(a=1, b='x'), mul(b=2)]<|tool_call_end|>"
STOP = "#END"  # ends the one-token answer as a stop string (a call cut by max_tokens is not read)
THINK = "<think>plan</think>Done"
TOOLS = ADD_MUL_TOOLS
MSGS = [{"role": "user", "content": "Hi"}]


class Lfm25(OneTokenAnswers, unittest.TestCase):
    MSGS, TOOLS, CALL, STOP, THINK = MSGS, TOOLS, CALL, STOP, THINK

    @classmethod
    def setUpClass(cls):
        path = marker_model(cls, VOCAB, "lfm25", SPECIALS, [CALL + STOP, THINK], eos="<|im_end|>",
                            pre="lfm2", template=TEMPLATE,
                            mkmodel_args=("--shape", "swa7", "--arch", "lfm2"))
        cls.srv = Server(ctx=2048, model=path)

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        cls.dir.cleanup()

    def test_detected(self):
        self.assertIn("chat template lfm2.5", self.srv.stderr())

    def test_markers_are_tokens(self):
        text = "<|im_start|>user\nHi<|im_end|><|tool_call_start|>"
        st, out = self.srv.post("/tokenize", {"prompt": text, "add_special_tokens": False})
        self.assertEqual(st, 200, out)
        toks = out["tokens"]
        self.assertEqual(toks[0], self.ids["<|im_start|>"])
        self.assertEqual(toks[-2:], [self.ids["<|im_end|>"], self.ids["<|tool_call_start|>"]])

    def test_end_tokens(self):
        self.assertEqual(self.first("<|im_end|>"), ("stop", 1, ""))
        # the call and think markers are printed; the list and role markers print nothing
        for shown in ("<|tool_call_start|>", "<|tool_call_end|>", "<think>", "</think>"):
            self.assertEqual(self.first(shown), ("length", 3, shown * 3))
        for hidden in ("<|tool_list_start|>", "<|im_start|>", "<|tool_response_start|>"):
            self.assertEqual(self.first(hidden), ("length", 3, ""))

    def test_no_switch(self):
        body = {"messages": MSGS, "max_tokens": 1,
                "chat_template_kwargs": {"enable_thinking": False}}
        st, out = self.srv.post("/v1/chat/completions", body)
        self.assertEqual(st, 400, out)
        self.assertIn("no thinking switch", out["error"]["message"])
        # its own switch keeps earlier answers' think blocks; 8B's name for it is not its own
        st, out = self.srv.post("/apply-template", {
            "messages": [{"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "<think>a</think>b"},
                         {"role": "user", "content": "Bye"}],
            "chat_template_kwargs": {"keep_past_thinking": True}})
        self.assertEqual(st, 200, out)
        self.assertIn("<think>a</think>b<|im_end|>", out["prompt"])
        body["chat_template_kwargs"] = {"preserve_thinking": True}
        st, out = self.srv.post("/v1/chat/completions", body)
        self.assertEqual(st, 400, out)
        self.assertIn("keep_past_thinking (LFM2.5)", out["error"]["message"])

    def forced(self, choice):
        """A forced call in llama.cpp's LFM2 form, <|tool_call_start|> then the JSON list of the
        calls (kvs_e2e.forced_marker_calls); parallel_tool_calls false makes it one."""
        calls = forced_marker_calls(self, self.srv, "<|tool_call_start|>", MSGS, choice,
                                    parallel_tool_calls=False)
        self.assertEqual(len(calls), 1, calls)
        return calls[0]["function"]

    def test_required(self):
        self.forced("required")

    def test_named(self):
        self.assertEqual(self.forced({"type": "function", "function": {"name": "mul"}})["name"],
                         "mul")


if __name__ == "__main__":
    unittest.main()
