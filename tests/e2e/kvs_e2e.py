"""Helpers for kvserve end-to-end tests: start the real server on an ephemeral loopback port,
talk to it with the standard library only, and stop it.

Environment: KVSERVE_BIN (the built kvserve), KVS_SHARED_MODELS (folder with stories260K.gguf
and reference/), KVS_MKMODEL (the built kvs-mkmodel, for tests that write their own GGUFs).
Tests skip with a message when one they need is missing."""
import http.client
import json
import os
import re
import signal
import subprocess
import tempfile
import time
import unittest

BIN = os.environ.get("KVSERVE_BIN", "")
MODELS = os.environ.get("KVS_SHARED_MODELS") or os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "shared", "models")
MODEL = os.path.join(MODELS, "stories260K.gguf")
REFERENCE = os.path.join(MODELS, "reference", "stories260K-greedy.json")
MKMODEL = os.environ.get("KVS_MKMODEL", "")
# A client's read timeout: 60 s, four times that under a sanitizer, whose build runs a step
# 10-30x slower (ThreadSanitizer instruments every vector load), so that 32 requests queued
# behind preemptions still finish: the tests check answers, never speed.
SANITIZED = os.environ.get("KVS_SANITIZE", "none") not in ("", "none")
CLIENT_TIMEOUT = 240 if SANITIZED else 60


def require_server(testcase=None):
    """Raises SkipTest unless the binary and the model are present."""
    if not BIN or not os.access(BIN, os.X_OK):
        raise unittest.SkipTest("KVSERVE_BIN not set or not executable")
    if not os.path.exists(MODEL):
        raise unittest.SkipTest(MODEL + " not found (tests read ../shared/models; see MODELS.md)")


def require_mkmodel(vocab):
    """For tests that write a random-weight model on a real vocabulary: raises SkipTest unless
    the server, kvs-mkmodel (KVS_MKMODEL) and the vocabulary file vocab are all present."""
    require_server()
    if not MKMODEL or not os.access(MKMODEL, os.X_OK) or not os.path.exists(vocab):
        raise unittest.SkipTest("KVS_MKMODEL or " + vocab + " missing")


def forced_first(test, srv, token, max_tokens=3, **extra):
    """A completion of "Hello" whose every token is pushed to token id `token` (logit_bias +100):
    (finish_reason, completion_tokens, text), for tests of how a special token ends or prints."""
    body = {"prompt": "Hello", "max_tokens": max_tokens, "logit_bias": {str(token): 100}}
    body.update(extra)
    st, out = srv.post("/v1/completions", body)
    test.assertEqual(st, 200, out)
    c = out["choices"][0]
    return c["finish_reason"], out["usage"]["completion_tokens"], c["text"]


# Two tools for the tool-call tests of the families' own syntaxes (test_granite, test_lfm2):
# add(a: number), mul(b: integer)
ADD_MUL_TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Adds two numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"}},
                   "required": ["a"]}}},
    {"type": "function", "function": {
        "name": "mul", "parameters": {"type": "object", "properties": {
            "b": {"type": "integer"}}, "required": ["b"]}}}]


def forced_marker_calls(test, srv, mark, messages, choice, **extra):
    """A forced call (tool_choice choice, ADD_MUL_TOOLS) in a family's marker syntax, whole and
    streamed (greedy, so the same): finish_reason tool_calls, no content, and the raw text (the
    tokens' logprobs view) is mark then the JSON list of the calls returned, each with its
    tool's argument as a number. Skips when the random model's call does not end in 64 tokens.
    Returns the calls."""
    body = {"messages": messages, "tools": ADD_MUL_TOOLS, "tool_choice": choice,
            "max_tokens": 64, "temperature": 0}
    body.update(extra)
    st, out = srv.post("/v1/chat/completions", dict(body, logprobs=True))
    test.assertEqual(st, 200, out)
    c = out["choices"][0]
    if c["finish_reason"] == "length":
        test.skipTest("this random model's call did not end in 64 tokens")
    test.assertEqual(c["finish_reason"], "tool_calls", out)
    test.assertIsNone(c["message"]["content"], out)
    calls = c["message"]["tool_calls"]
    raw = "".join(t["token"] for t in c["logprobs"]["content"])
    test.assertTrue(raw.startswith(mark + "["), raw)
    test.assertEqual(json.loads(raw[len(mark):]),
                     [{"name": t["function"]["name"],
                       "arguments": json.loads(t["function"]["arguments"])} for t in calls])
    for t in calls:
        key = {"add": "a", "mul": "b"}[t["function"]["name"]]
        test.assertIsInstance(json.loads(t["function"]["arguments"])[key], (int, float))
    st, events, done = srv.stream("/v1/chat/completions", dict(body, stream=True))
    test.assertEqual(st, 200, events)
    test.assertTrue(done)
    deltas = [e["choices"][0] for e in events if e.get("choices")]
    streamed = [t for d in deltas for t in d["delta"].get("tool_calls") or []]
    test.assertEqual([(t["function"]["name"], t["function"]["arguments"]) for t in streamed],
                     [(t["function"]["name"], t["function"]["arguments"]) for t in calls])
    test.assertEqual(deltas[-1]["finish_reason"], "tool_calls")
    test.assertFalse("".join(d["delta"].get("content") or "" for d in deltas))
    return calls


def marker_model(cls, vocab_base, name, control, user=(), eos=None, pre=None, template=None,
                 mkmodel_args=("--shape", "tiny")):
    """A test class's model on vocab_base's vocabulary with a family's marker tokens appended
    (harmony_vocab.append: control as control tokens, user as user-defined ones, EOS and the
    pre-tokenizer where given; cls.ids their ids) and the chat template at path template, in
    cls.dir (a TemporaryDirectory the class cleans up). Skips without kvs-mkmodel or the
    vocabulary. Returns the model's path."""
    import harmony_vocab  # beside this file
    require_mkmodel(vocab_base)
    cls.dir = tempfile.TemporaryDirectory()
    vocab = os.path.join(cls.dir.name, name + "-vocab.gguf")
    cls.ids = harmony_vocab.append(vocab_base, vocab, control, list(user), eos=eos, pre=pre)
    path = os.path.join(cls.dir.name, name + ".gguf")
    args = [MKMODEL, *mkmodel_args, "--vocab", vocab, "-o", path]
    if template:
        with open(template) as f:
            args += ["--chat-template", f.read()]
    subprocess.run(args, check=True, capture_output=True)
    return path


class OneTokenAnswers:
    """A mixin for the tests of a family's chat markers on a vocabulary with test devices
    (harmony_vocab.append): self.srv, self.ids (text -> token id), and the class's MSGS, TOOLS,
    CALL (a whole call answer as one token, read back with STOP as a stop string) and THINK
    ("<think>plan</think>Done" in the family's markers)."""

    def first(self, name, max_tokens=3):
        return forced_first(self, self.srv, self.ids[name], max_tokens)

    def answer(self, token, **extra):
        """A chat answer of one token pushed to token: (whole message, finish_reason, streamed
        events' choices)."""
        body = {"messages": self.MSGS, "max_tokens": 1, "temperature": 0,
                "logit_bias": {str(self.ids[token]): 100}}
        body.update(extra)
        st, out = self.srv.post("/v1/chat/completions", body)
        self.assertEqual(st, 200, out)
        st, events, done = self.srv.stream("/v1/chat/completions", dict(body, stream=True))
        self.assertEqual(st, 200, events)
        self.assertTrue(done)
        c = out["choices"][0]
        return c["message"], c["finish_reason"], [e["choices"][0] for e in events
                                                  if e.get("choices")]

    def test_calls_read_back(self):
        """CALL's "Calling." then add(a=1, b="x") and mul(b=2): two tool_calls, whole and
        streamed; without tools the calls are content."""
        msg, finish, deltas = self.answer(self.CALL + self.STOP, tools=self.TOOLS,
                                          stop=[self.STOP])
        self.assertEqual(finish, "tool_calls", msg)
        self.assertEqual(msg["content"], "Calling.")
        got = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
               for c in msg["tool_calls"]]
        self.assertEqual(got, [("add", {"a": 1, "b": "x"}), ("mul", {"b": 2})])
        streamed = [t for d in deltas for t in d["delta"].get("tool_calls") or []]
        self.assertEqual([(t["function"]["name"], json.loads(t["function"]["arguments"]))
                          for t in streamed], got)
        self.assertEqual("".join(d["delta"].get("content") or "" for d in deltas), "Calling.")
        self.assertEqual(deltas[-1]["finish_reason"], "tool_calls")
        msg, finish, _ = self.answer(self.CALL + self.STOP, stop=[self.STOP])
        self.assertEqual(msg["content"], self.CALL)
        self.assertNotIn("tool_calls", msg)

    def test_think_split(self):
        msg, _, deltas = self.answer(self.THINK)
        self.assertEqual((msg.get("reasoning_content"), msg["content"]), ("plan", "Done"), msg)
        self.assertEqual("".join(d["delta"].get("reasoning_content") or "" for d in deltas), "plan")
        self.assertEqual("".join(d["delta"].get("content") or "" for d in deltas), "Done")


def load_reference():
    with open(REFERENCE) as f:
        return json.load(f)["cases"]


class Server:
    """A kvserve serve process on 127.0.0.1 with --port 0; stderr goes to a temp file."""

    def __init__(self, *extra, ctx=512, wait=True, model=None):
        self.log = tempfile.NamedTemporaryFile(prefix="kvserve-e2e-", suffix=".log", delete=False)
        args = [BIN, "serve", "-m", model or MODEL, "--host", "127.0.0.1", "--port", "0",
                "--ctx-size", str(ctx), "--threads", "1", "--http-threads", "2"] + list(extra)
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self.log)
        self.port = None
        if wait:
            self.wait_ready()

    def stderr(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def wait_ready(self, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("kvserve exited with %d:\n%s" % (self.proc.returncode, self.stderr()))
            if self.port is None:
                m = re.search(r"listening on http://[^:]+:(\d+)", self.stderr())
                if m:
                    self.port = int(m.group(1))
            if self.port is not None:
                try:
                    st, _, _ = self.request("GET", "/health")
                    if st == 200:
                        return
                except OSError:
                    pass
            time.sleep(0.05)
        raise RuntimeError("kvserve did not become ready:\n" + self.stderr())

    def conn(self, timeout=CLIENT_TIMEOUT):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, raw=None):
        """Returns (status, headers dict, body bytes). body is JSON-encoded unless raw is given."""
        c = self.conn()
        try:
            h = dict(headers or {})
            data = raw
            if body is not None:
                data = json.dumps(body).encode()
                h.setdefault("Content-Type", "application/json")
            c.request(method, path, body=data, headers=h)
            r = c.getresponse()
            return r.status, dict((k.lower(), v) for k, v in r.getheaders()), r.read()
        finally:
            c.close()

    def post(self, path, body, headers=None):
        st, h, data = self.request("POST", path, body, headers)
        return st, json.loads(data) if data else None

    def stream(self, path, body, headers=None):
        """POSTs a streaming request; returns (status, list of parsed events, saw_done)."""
        c = self.conn()
        try:
            h = {"Content-Type": "application/json"}
            h.update(headers or {})
            c.request("POST", path, body=json.dumps(body).encode(), headers=h)
            r = c.getresponse()
            if r.status != 200:
                return r.status, [json.loads(r.read())], False
            assert r.getheader("Content-Type", "").startswith("text/event-stream")
            return 200, *parse_sse(r.read().decode())
        finally:
            c.close()

    def stream_typed(self, path, body):
        """POSTs a streaming request whose events are typed (the Responses API's "event: T"
        before each data line); returns (status, list of data objects, each checked to carry
        "type": T)."""
        st, _, data = self.request("POST", path, body)
        if st != 200:
            return st, [json.loads(data)]
        out = []
        for block in data.decode().split("\n\n"):
            if block.strip():
                name, line = block.split("\n")
                assert name.startswith("event: ") and line.startswith("data: "), block
                out.append(json.loads(line[len("data: "):]))
                assert out[-1].get("type") == name[len("event: "):], block
        return st, out

    def metrics(self):
        st, _, data = self.request("GET", "/metrics")
        assert st == 200
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        text = self.stderr()
        os.unlink(self.log.name)
        check_sanitizer_report(text)
        return self.proc.returncode


# What ASan, LSan, UBSan and TSan print when they find something. In a sanitized build
# (KVSERVE_BIN from build-asan / build-tsan) any of them fails the test that ran the server.
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                     "WARNING: ThreadSanitizer", "ERROR: ThreadSanitizer")


def check_sanitizer_report(text):
    for marker in SANITIZER_MARKERS:
        if marker in text:
            raise AssertionError("kvserve sanitizer report (%s):\n%s" % (marker, text[-20000:]))


def parse_sse(text):
    """Splits an SSE body into parsed JSON events; returns (events, saw_done)."""
    events, done = [], False
    for block in text.split("\n\n"):
        block = block.strip("\n")
        if not block:
            continue
        assert block.startswith("data: "), block
        payload = block[6:]
        if payload == "[DONE]":
            done = True
            continue
        assert not done, "event after [DONE]"
        events.append(json.loads(payload))
    return events, done


def run_standalone(*requirements):
    """main() of a test file run as its own meson suite: exits 77 (meson's "skipped") with the
    reason when a (reason, missing) requirement, the binary or the model is missing, else
    runs the file's tests and returns 0 or 1."""
    checks = list(requirements) + [
        ("KVSERVE_BIN not set or not executable", not BIN or not os.access(BIN, os.X_OK)),
        (MODEL + " not found (see MODELS.md)", not os.path.exists(MODEL))]
    for why, missing in checks:
        if missing:
            print("SKIP: " + why)
            return 77
    prog = unittest.main(exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1
