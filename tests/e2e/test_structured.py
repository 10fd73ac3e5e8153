"""Structured outputs and sampling controls over HTTP with stories260K: response_format
json_schema / json_object (sampled, streamed, n > 1), the 400s naming what is wrong, logit_bias,
and logprobs streamed with their own text. One server for the whole module."""
import json
import unittest

import kvs_e2e as e2e

srv = None

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "mood": {"enum": ["happy", "sad", "angry"]},
        "age": {"type": "integer"},
        "good": {"type": "boolean"},
        "pet": {"anyOf": [{"type": "null"}, {"type": "string", "enum": ["cat", "dog"]}]},
    },
    "required": ["name", "mood", "age", "good", "pet"],
    "additionalProperties": False,
}


def setUpModule():
    global srv
    e2e.require_server()
    srv = e2e.Server("--served-model-name", "stories260K")


def tearDownModule():
    if srv:
        rc = srv.stop()
        if rc != 0:
            raise AssertionError("kvserve exited with %d after SIGTERM" % rc)


def validate(schema, v, path="#"):
    """The strict subset's meaning, enough for the schemas here; raises AssertionError."""
    if "anyOf" in schema:
        errs = []
        for alt in schema["anyOf"]:
            try:
                return validate(alt, v, path)
            except AssertionError as e:
                errs.append(str(e))
        raise AssertionError("%s: no anyOf alternative matches %r (%s)" % (path, v, errs))
    if "enum" in schema:
        assert v in schema["enum"], "%s: %r not in %r" % (path, v, schema["enum"])
    t = schema.get("type")
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool,
             "null": type(None)}
    if t in kinds:
        assert isinstance(v, kinds[t]), "%s: %r is not %s" % (path, v, t)
    elif t == "integer":
        assert isinstance(v, int) and not isinstance(v, bool), "%s: %r is not an integer" % (path, v)
    elif t == "number":
        assert isinstance(v, (int, float)) and not isinstance(v, bool), "%s: %r" % (path, v)
    if t == "object":
        props = schema.get("properties", {})
        for k in schema.get("required", []):
            assert k in v, "%s: required %r missing" % (path, k)
        if schema.get("additionalProperties") is False:
            extra = set(v) - set(props)
            assert not extra, "%s: extra keys %r" % (path, extra)
        for k, sub in props.items():
            if k in v:
                validate(sub, v[k], path + "/" + k)
    if t == "array" and "items" in schema:
        for i, x in enumerate(v):
            validate(schema["items"], x, "%s/%d" % (path, i))


def schema_format(schema, name="person"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def chat(content="Tell me about Lily.", **extra):
    body = {"model": "stories260K", "messages": [{"role": "user", "content": content}],
            "max_tokens": 400}
    body.update(extra)
    return body


class JsonSchema(unittest.TestCase):
    def test_ten_sampled_answers_validate(self):
        for seed in range(10):
            with self.subTest(seed=seed):
                st, r = srv.post("/v1/chat/completions",
                                 chat(temperature=0.7, seed=seed,
                                      response_format=schema_format(PERSON)))
                self.assertEqual(st, 200, r)
                c = r["choices"][0]
                self.assertEqual(c["finish_reason"], "stop", c)
                validate(PERSON, json.loads(c["message"]["content"]))

    def test_unconstrained_is_not_json(self):
        """The same prompts without response_format are stories: the grammar is what makes
        the answers above JSON."""
        st, r = srv.post("/v1/chat/completions", chat(temperature=0.7, seed=0))
        self.assertEqual(st, 200, r)
        with self.assertRaises(ValueError):
            json.loads(r["choices"][0]["message"]["content"])

    def test_n_choices_each_validate(self):
        """n > 1: the forks clone the first choice's grammar."""
        st, r = srv.post("/v1/chat/completions",
                         chat(temperature=1.0, seed=3, n=4, response_format=schema_format(PERSON)))
        self.assertEqual(st, 200, r)
        self.assertEqual(len(r["choices"]), 4)
        texts = set()
        for c in r["choices"]:
            self.assertEqual(c["finish_reason"], "stop", c)
            validate(PERSON, json.loads(c["message"]["content"]))
            texts.add(c["message"]["content"])
        self.assertGreater(len(texts), 1, "four identical draws")

    def test_streaming_validates(self):
        for seed in range(3):
            with self.subTest(seed=seed):
                st, events, done = srv.stream("/v1/chat/completions",
                                              chat(temperature=0.7, seed=seed, stream=True,
                                                   response_format=schema_format(PERSON)))
                self.assertEqual(st, 200, events)
                self.assertTrue(done)
                text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                               if e["choices"])
                finish = [e["choices"][0]["finish_reason"] for e in events
                          if e["choices"] and e["choices"][0]["finish_reason"]]
                self.assertEqual(finish, ["stop"])
                validate(PERSON, json.loads(text))

    def test_completions_endpoint(self):
        st, r = srv.post("/v1/completions",
                         {"prompt": "Once upon a time", "max_tokens": 300, "temperature": 0.7,
                          "seed": 5, "response_format": schema_format(PERSON)})
        self.assertEqual(st, 200, r)
        self.assertEqual(r["choices"][0]["finish_reason"], "stop")
        validate(PERSON, json.loads(r["choices"][0]["text"]))

    def test_json_object(self):
        """Any object: the text is one (when it ends with stop) or the start of one."""
        st, r = srv.post("/v1/chat/completions",
                         chat(temperature=0.7, seed=1, n=3, max_tokens=120,
                              response_format={"type": "json_object"}))
        self.assertEqual(st, 200, r)
        for c in r["choices"]:
            text = c["message"]["content"]
            self.assertEqual(text.lstrip()[:1], "{", text)
            if c["finish_reason"] == "stop":
                self.assertIsInstance(json.loads(text), dict)
            else:
                self.assertEqual(c["finish_reason"], "length")

    def test_logprobs_under_a_grammar_are_finite(self):
        st, r = srv.post("/v1/chat/completions",
                         chat(temperature=0.7, seed=2, logprobs=True, top_logprobs=5,
                              response_format=schema_format(PERSON)))
        self.assertEqual(st, 200, r)
        content = r["choices"][0]["logprobs"]["content"]
        self.assertTrue(content)
        for t in content:
            self.assertIsInstance(t["logprob"], (int, float))
            for top in t["top_logprobs"]:
                self.assertIsInstance(top["logprob"], (int, float), t)

    def test_errors_name_the_field(self):
        cases = [
            ({"type": "sound"}, "response_format.type"),
            ("json", "response_format.type"),
            ({"type": "json_object", "schema": {}}, "response_format.schema"),
            ({"type": "json_schema"}, "response_format.json_schema"),
            ({"type": "json_schema", "json_schema": {"schema": PERSON}},
             "response_format.json_schema.name"),
            ({"type": "json_schema", "json_schema": {"name": "x", "schema": PERSON, "strict": 1}},
             "response_format.json_schema.strict"),
            ({"type": "json_schema", "json_schema": {"name": "x", "schema": PERSON, "extra": 1}},
             "response_format.json_schema.extra"),
            (schema_format({"type": "string", "pattern": "^a+$"}),
             "response_format.json_schema.schema"),
            (schema_format({"type": "object", "required": ["a"]}),
             "response_format.json_schema.schema"),
        ]
        for rf, param in cases:
            with self.subTest(rf=rf):
                st, r = srv.post("/v1/chat/completions", chat(response_format=rf))
                self.assertEqual(st, 400, r)
                self.assertEqual(r["error"]["param"], param, r)
                self.assertEqual(r["error"]["type"], "invalid_request_error")
        st, r = srv.post("/v1/chat/completions",
                         chat(response_format=schema_format({"type": "string",
                                                             "pattern": "^a+$"})))
        self.assertIn("pattern", r["error"]["message"])
        st, r = srv.post("/v1/chat/completions",
                         chat(ignore_eos=True, response_format={"type": "json_object"}))
        self.assertEqual(st, 400, r)
        self.assertEqual(r["error"]["param"], "ignore_eos")


class LogitBias(unittest.TestCase):
    def test_forces_a_token(self):
        st, r = srv.post("/tokenize", {"prompt": " was", "add_special_tokens": False})
        self.assertEqual(st, 200, r)
        tok = r["tokens"][-1]
        st, r = srv.post("/v1/completions",
                         {"prompt": "Once", "max_tokens": 6, "temperature": 0, "ignore_eos": True,
                          "logit_bias": {str(tok): 100}})
        self.assertEqual(st, 200, r)
        self.assertEqual(r["choices"][0]["text"], " was" * 6)
        base = {"prompt": "Once upon a time,", "max_tokens": 12, "temperature": 0,
                "ignore_eos": True, "logprobs": 0}
        st, r1 = srv.post("/v1/completions", base)
        self.assertIn(" was", r1["choices"][0]["logprobs"]["tokens"])  # the greedy text has it
        st, r2 = srv.post("/v1/completions", dict(base, logit_bias={str(tok): -100}))
        self.assertEqual(st, 200, r2)
        self.assertNotIn(" was", r2["choices"][0]["logprobs"]["tokens"])

    def test_refused(self):
        for lb in [{"100000": 1}, {"5": 101}, {"5": -100.5}, {"x": 1}, {"-1": 1}, {"5": "1"},
                   [1, 2], {"05x": 1}]:
            with self.subTest(lb=lb):
                st, r = srv.post("/v1/completions", {"prompt": "Once", "logit_bias": lb})
                self.assertEqual(st, 400, r)
                self.assertEqual(r["error"]["param"], "logit_bias")


class StreamedLogprobs(unittest.TestCase):
    def test_each_token_with_its_text(self):
        """Ending on max_tokens used to send the last token's logprobs with empty content and
        its text in the next chunk with logprobs null."""
        for path, body in [
            ("/v1/chat/completions", chat("Once", max_tokens=7, temperature=0, stream=True,
                                          logprobs=True, top_logprobs=2)),
            ("/v1/completions", {"prompt": "Once upon", "max_tokens": 7, "temperature": 0,
                                 "stream": True, "logprobs": 2}),
        ]:
            with self.subTest(path=path):
                st, events, done = srv.stream(path, body)
                self.assertEqual(st, 200, events)
                n = 0
                for e in events:
                    c = e["choices"][0]
                    if path.endswith("chat/completions"):
                        text = c["delta"].get("content")
                        lp = c.get("logprobs")
                        toks = lp["content"] if lp else []
                        joined = "".join(t["token"] for t in toks)
                    else:
                        text = c["text"]
                        lp = c.get("logprobs")
                        toks = lp["tokens"] if lp else []
                        joined = "".join(toks)
                    if c.get("finish_reason"):
                        self.assertFalse(text, c)
                        continue
                    if not text and not toks:
                        continue  # the chat opening chunk (role only)
                    self.assertTrue(text, c)
                    self.assertEqual(joined, text, c)
                    n += len(toks)
                self.assertEqual(n, 7)


if __name__ == "__main__":
    raise SystemExit(e2e.run_standalone())
