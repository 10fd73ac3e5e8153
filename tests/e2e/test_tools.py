"""Tools over HTTP with stories260K (template "plain": the generic <tool_call> form):
tool_choice required and a named function constrain the call to the function's parameter
schema, so it always parses (sampled, streamed, n > 1); history with assistant tool_calls and
role tool messages renders; bad tools and choices are 400s naming the field."""
import json
import unittest

import kvs_e2e as e2e
from test_structured import validate

srv = None

WEATHER = {"type": "object",
           "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "parameters": ADD}}]
PARAMS = {"get_weather": WEATHER, "add": ADD}
MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]


def setUpModule():
    global srv
    e2e.require_server()
    # The tools' system text takes ~600 of stories260K's tokens: a longer context than trained.
    srv = e2e.Server(ctx=2048)


def tearDownModule():
    if srv:
        rc = srv.stop()
        if rc != 0:
            raise AssertionError("kvserve exited with %d after SIGTERM" % rc)


def body(**extra):
    b = {"messages": MSGS, "tools": TOOLS, "temperature": 0.7, "max_tokens": 300}
    b.update(extra)
    return b


class Forced(unittest.TestCase):
    def check_call(self, call, name=None):
        self.assertEqual(call["type"], "function")
        self.assertTrue(call["id"].startswith("call_"))
        fn = call["function"]
        self.assertIn(fn["name"], PARAMS)
        if name:
            self.assertEqual(fn["name"], name)
        self.assertIsInstance(fn["arguments"], str)
        validate(PARAMS[fn["name"]], json.loads(fn["arguments"]))

    def test_required_always_a_valid_call(self):
        for seed in range(10):
            with self.subTest(seed=seed):
                st, r = srv.post("/v1/chat/completions", body(tool_choice="required", seed=seed))
                self.assertEqual(st, 200, r)
                c = r["choices"][0]
                self.assertEqual(c["finish_reason"], "tool_calls", c)
                self.assertIsNone(c["message"]["content"])
                self.assertEqual(len(c["message"]["tool_calls"]), 1)
                self.check_call(c["message"]["tool_calls"][0])

    def test_named_function(self):
        st, r = srv.post("/v1/chat/completions",
                         body(tool_choice={"type": "function", "function": {"name": "add"}},
                              n=3, seed=4))
        self.assertEqual(st, 200, r)
        ids = set()
        for c in r["choices"]:
            self.assertEqual(c["finish_reason"], "tool_calls", c)
            self.check_call(c["message"]["tool_calls"][0], "add")
            ids.add(c["message"]["tool_calls"][0]["id"])
        self.assertEqual(len(ids), 3, "call ids must be unique")

    def test_streaming(self):
        for tc in ["required", {"type": "function", "function": {"name": "get_weather"}}]:
            with self.subTest(tool_choice=tc):
                st, events, done = srv.stream("/v1/chat/completions",
                                              body(tool_choice=tc, stream=True, seed=9))
                self.assertEqual(st, 200, events)
                self.assertTrue(done)
                calls = [tcall for e in events for tcall in e["choices"][0]["delta"].get(
                    "tool_calls", [])]
                self.assertEqual(len(calls), 1)
                self.assertEqual(calls[0]["index"], 0)
                self.check_call(calls[0], None if tc == "required" else "get_weather")
                finish = [e["choices"][0]["finish_reason"] for e in events
                          if e["choices"][0]["finish_reason"]]
                self.assertEqual(finish, ["tool_calls"])
                text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
                self.assertEqual(text, "")


class Auto(unittest.TestCase):
    def test_plain_answer_when_no_call(self):
        """stories260K does not write <tool_call> tags on its own: auto gives text."""
        st, r = srv.post("/v1/chat/completions", body(seed=1, max_tokens=20))
        self.assertEqual(st, 200, r)
        c = r["choices"][0]
        self.assertIn(c["finish_reason"], ("stop", "length"))
        self.assertNotIn("tool_calls", c["message"])
        self.assertIsInstance(c["message"]["content"], str)

    def test_auto_streams_text_as_it_comes(self):
        """With tool_choice auto an answer that is no call is streamed token by token (what
        could be the start of a <tool_call> is held; tests/test_server.c checks that what is
        sent is never taken back), and adds up to the answer given whole."""
        st, whole = srv.post("/v1/chat/completions", body(temperature=0, max_tokens=24))
        self.assertEqual(st, 200, whole)
        st, events, done = srv.stream("/v1/chat/completions",
                                      body(temperature=0, max_tokens=24, stream=True))
        self.assertEqual(st, 200)
        self.assertTrue(done)
        deltas = [e["choices"][0]["delta"].get("content") for e in events if e.get("choices")]
        texts = [d for d in deltas if d]
        self.assertGreater(len(texts), 3, deltas)
        self.assertEqual("".join(texts), whole["choices"][0]["message"]["content"])
        self.assertEqual(events[-1]["choices"][0]["finish_reason"] if events[-1].get("choices")
                         else events[-2]["choices"][0]["finish_reason"],
                         whole["choices"][0]["finish_reason"])

    def test_none_does_not_render_tools(self):
        st, with_tools = srv.post("/v1/chat/completions", body(max_tokens=1))
        st, none = srv.post("/v1/chat/completions", body(max_tokens=1, tool_choice="none"))
        self.assertEqual(st, 200, none)
        self.assertGreater(with_tools["usage"]["prompt_tokens"],
                           none["usage"]["prompt_tokens"] + 100)


class History(unittest.TestCase):
    def test_calls_and_results_render(self):
        msgs = MSGS + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\",\"unit\":\"c\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"}]
        st, r = srv.post("/v1/chat/completions", body(messages=msgs, max_tokens=5))
        self.assertEqual(st, 200, r)
        st, short = srv.post("/v1/chat/completions", body(messages=MSGS, max_tokens=5))
        self.assertGreater(r["usage"]["prompt_tokens"], short["usage"]["prompt_tokens"])


class Errors(unittest.TestCase):
    def test_named_400s(self):
        bad_call = {"role": "assistant", "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "add", "arguments": "[1]"}}]}
        cases = [
            (body(tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
            (body(tool_choice="sometimes"), "tool_choice"),
            (body(tools=None, tool_choice="required"), "tool_choice"),
            (body(tools=[{"type": "retrieval"}]), "tools"),
            (body(tools=[{"type": "function", "function": {}}]), "tools"),
            (body(tools="add"), "tools"),
            (body(tools=[{"type": "function", "function": {"name": "f", "parameters": {
                "type": "object", "properties": {"e": {"type": "string", "format": "email"}}}}}],
                  tool_choice="required"), "tools"),
            (body(tool_choice="required", response_format={"type": "json_object"}),
             "response_format"),
            (body(parallel_tool_calls="yes"), "parallel_tool_calls"),
            (body(messages=MSGS + [{"role": "tool", "content": "x"}]), "messages"),
            (body(messages=MSGS + [bad_call]), "messages"),
            (body(messages=MSGS + [{"role": "user", "tool_calls": bad_call["tool_calls"]}]),
             "messages"),
        ]
        for b, param in cases:
            with self.subTest(param=param, b=json.dumps(b)[-120:]):
                st, r = srv.post("/v1/chat/completions", b)
                self.assertEqual(st, 400, r)
                self.assertEqual(r["error"]["param"], param, r)
        st, r = srv.post("/v1/completions", {"prompt": "a", "tools": TOOLS})
        self.assertEqual(st, 400, r)
        self.assertEqual(r["error"]["param"], "tools")
        st, r = srv.post("/v1/chat/completions",
                         body(tool_choice={"type": "function", "function": {"name": "nope"}}))
        self.assertIn("nope", r["error"]["message"])


if __name__ == "__main__":
    raise SystemExit(e2e.run_standalone())
