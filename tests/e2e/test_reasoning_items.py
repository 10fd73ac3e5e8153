"""A thinking model's reasoning through the chat and Responses routes, whole and streamed, on a
random-weight file whose vocabulary has Qwen 3's <think> as a token (GPT-2's, made by
harmony_vocab.py) and whose template is Qwen 3's: logit_bias makes every generated token
<think>, so the answer opens a think block it never closes: all reasoning, no content.
Chat gives it as reasoning_content; /v1/responses as a reasoning item (reasoning_text content)
before the message, and streamed as that item's events (a delta per token, as they come)
before the message's, the message at output_index 1."""
import json
import os
import subprocess
import tempfile
import unittest

import harmony_vocab
from kvs_e2e import MKMODEL, MODELS, Server, require_mkmodel

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "..", "data", "chat_templates", "qwen3.jinja")
VOCAB = os.path.join(MODELS, "vocab", "ggml-vocab-gpt-2.gguf")


class ReasoningItems(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        require_mkmodel(VOCAB)
        cls.dir = tempfile.TemporaryDirectory()
        vocab = os.path.join(cls.dir.name, "think-vocab.gguf")
        cls.think = harmony_vocab.make(VOCAB, vocab, extra=["<think>", "</think>"])["<think>"]
        path = os.path.join(cls.dir.name, "think.gguf")
        with open(TEMPLATE) as f:
            template = f.read()
        subprocess.run([MKMODEL, "--shape", "tiny", "--vocab", vocab, "-o", path,
                        "--chat-template", template], check=True, capture_output=True)
        cls.srv = Server(model=path)

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        cls.dir.cleanup()

    def bias(self):
        return {str(self.think): 100}

    def events(self, body):
        """A streamed response's events (each "event: T" line's data, whose type is T)."""
        c = self.srv.conn()
        try:
            c.request("POST", "/v1/responses", body=json.dumps(body),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            self.assertEqual(r.status, 200)
            out = []
            for block in r.read().decode().split("\n\n"):
                if block.strip():
                    name, data = block.split("\n")
                    out.append(json.loads(data[len("data: "):]))
                    self.assertEqual(out[-1]["type"], name[len("event: "):])
            return out
        finally:
            c.close()

    def test_chat(self):
        st, out = self.srv.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
            "logit_bias": self.bias()})
        self.assertEqual(st, 200, out)
        m = out["choices"][0]["message"]
        self.assertEqual(m["reasoning_content"], "<think><think>")
        self.assertEqual(m["content"], "")
        # every token went to reasoning: the opening tag and the two that are its text
        self.assertEqual(out["usage"]["completion_tokens_details"], {"reasoning_tokens": 3})

    def test_responses(self):
        body = {"input": "Hi", "max_output_tokens": 3, "logit_bias": self.bias()}
        st, out = self.srv.post("/v1/responses", body)
        self.assertEqual(st, 200, out)
        items = out["output"]
        self.assertEqual([i["type"] for i in items], ["reasoning", "message"], out)
        self.assertEqual(items[0]["content"], [{"type": "reasoning_text",
                                                "text": "<think><think>"}])
        self.assertEqual(items[0]["summary"], [])
        self.assertEqual(items[1]["content"][0]["text"], "")
        self.assertEqual(out["usage"]["output_tokens_details"], {"reasoning_tokens": 3})
        events = self.events(dict(body, stream=True))
        names = [e["type"] for e in events]
        self.assertEqual(names[-1], "response.incomplete")
        added = [e for e in events if e["type"] == "response.output_item.added"]
        self.assertEqual([(e["output_index"], e["item"]["type"]) for e in added],
                         [(0, "reasoning"), (1, "message")])
        text = [e for e in events if e["type"] == "response.reasoning_text.done"]
        self.assertEqual(text[0]["text"], "<think><think>")
        # streamed as it comes (a delta per token), not held to the end of the output
        deltas = [e["delta"] for e in events if e["type"] == "response.reasoning_text.delta"]
        self.assertEqual(deltas, ["<think>", "<think>"])
        self.assertTrue(all(e["output_index"] == 1 for e in events
                            if e["type"].startswith("response.output_text")
                            or e["type"].startswith("response.content_part")))
        # the final object holds the same items as the whole answer (ids are per response)
        def strip(item):
            return {k: v for k, v in item.items() if k != "id"}
        self.assertEqual([strip(i) for i in events[-1]["response"]["output"]],
                         [strip(i) for i in items])


if __name__ == "__main__":
    unittest.main()
