"""--reasoning-format on a model whose chat template thinks (Qwen 3's official template, and
SmolLM3's, on a random tiny model). A random model does not write <think> blocks, so this checks the wiring
around the splitter (tests/test_server.c test_reasoning_split checks the splitting itself,
whole and streamed at every cut): with auto, an answer without a think block is unchanged, has
no reasoning_content, and streams to the same text; the template's switch and a bad value
of the flag are refused."""
import os
import subprocess
import tempfile
import unittest

from kvs_e2e import BIN, MKMODEL, Server, require_server

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "..", "data", "chat_templates")


class Reasoning(unittest.TestCase):
    FAMILY = "qwen3"  # the template file's name and the family kvserve must detect
    NO_THINK_TAIL = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # enable_thinking false
    CTX = 512

    @classmethod
    def setUpClass(cls):
        require_server()
        if not MKMODEL or not os.access(MKMODEL, os.X_OK):
            raise unittest.SkipTest("KVS_MKMODEL missing")
        cls.dir = tempfile.TemporaryDirectory()
        cls.path = os.path.join(cls.dir.name, cls.FAMILY + "-template.gguf")
        with open(os.path.join(TEMPLATES, cls.FAMILY + ".jinja")) as f:
            template = f.read()
        subprocess.run([MKMODEL, "--shape", "tiny", "-o", cls.path, "--chat-template", template],
                       check=True, capture_output=True)
        cls.auto = Server(model=cls.path, ctx=cls.CTX)
        cls.none = Server("--reasoning-format", "none", model=cls.path, ctx=cls.CTX)

    @classmethod
    def tearDownClass(cls):
        cls.auto.stop()
        cls.none.stop()
        cls.dir.cleanup()

    BODY = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "temperature": 0}

    def test_detected(self):
        self.assertIn("chat template " + self.FAMILY, self.auto.stderr())

    def test_plain_answer_unchanged(self):
        st, a = self.auto.post("/v1/chat/completions", self.BODY)
        self.assertEqual(st, 200, a)
        st, b = self.none.post("/v1/chat/completions", self.BODY)
        self.assertEqual(st, 200, b)
        text = b["choices"][0]["message"]["content"]
        if text.startswith("<think>"):
            self.skipTest("this random model happens to think")
        self.assertEqual(a["choices"][0]["message"]["content"], text)
        self.assertNotIn("reasoning_content", a["choices"][0]["message"])
        st, events, done = self.auto.stream("/v1/chat/completions", dict(self.BODY, stream=True))
        self.assertEqual(st, 200)
        self.assertTrue(done)
        streamed = "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                           if e.get("choices"))
        self.assertEqual(streamed, text)
        self.assertFalse(any("reasoning_content" in e["choices"][0]["delta"] for e in events
                             if e.get("choices")))

    def test_thinking_switch(self):
        body = dict(self.BODY, chat_template_kwargs={"enable_thinking": False})
        # /apply-template takes only what its rendering reads
        tmpl = {k: body[k] for k in ("messages", "chat_template_kwargs")}
        st, out = self.auto.post("/apply-template", tmpl)
        self.assertEqual(st, 200, out)
        self.assertTrue(out["prompt"].endswith(self.NO_THINK_TAIL), out)
        st, out = self.auto.post("/v1/chat/completions", body)
        self.assertEqual(st, 200, out)

    def test_bad_flag(self):
        r = subprocess.run([BIN, "serve", "-m", self.path,
                            "--reasoning-format", "deepseek-r1"], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown --reasoning-format 'deepseek-r1' (auto|none)", r.stderr)


class SmolLM3Reasoning(Reasoning):
    """The same wiring with SmolLM3's template, whose system message switches too."""
    FAMILY = "smollm3"
    NO_THINK_TAIL = "<|im_start|>assistant\n<think>\n\n</think>\n"
    CTX = 2048  # its default /think instructions are 1.1k tokens of the byte vocabulary

    def test_system_switch(self):
        for sys_text, mode in (("Be brief. /no_think", "/no_think"), ("/think", "/think")):
            st, out = self.auto.post("/apply-template", {
                "messages": [{"role": "system", "content": sys_text},
                             {"role": "user", "content": "Hi"}],
                "chat_template_kwargs": {"enable_thinking": mode == "/think"}})
            self.assertEqual(st, 200, out)
            self.assertIn("Reasoning Mode: " + mode + "\n", out["prompt"])
            self.assertEqual(out["prompt"].endswith(self.NO_THINK_TAIL), mode == "/no_think")


if __name__ == "__main__":
    unittest.main()
