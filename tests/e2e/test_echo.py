"""/v1/completions with echo on stories260K: the prompt's text first in every choice, and with
logprobs the prompt's tokens scored (what lm-evaluation-harness's loglikelihood requests send:
echo, logprobs 1, max_tokens 1 or 0, prompts as token ids). The scores are checked against the
other path that computes them: the reference continuation is greedy, so generating from the
first i tokens of it gives token i, with the logprob echo reports for it."""
import json
import unittest

import kvs_e2e as e2e

srv = None


def setUpModule():
    global srv
    e2e.require_server()
    srv = e2e.Server("--served-model-name", "stories260K")


def tearDownModule():
    if srv:
        rc = srv.stop()
        if rc != 0:
            raise AssertionError("kvserve exited with %d after SIGTERM" % rc)


def completion(**body):
    st, r = srv.post("/v1/completions", dict({"temperature": 0}, **body))
    assert st == 200, r
    return r


class Echo(unittest.TestCase):
    def setUp(self):
        self.case = e2e.load_reference()[1]
        # a reference prompt and the first 40 tokens of its greedy continuation, as ids
        self.ids = self.case["prompt_ids"] + self.case["completion_ids"][:40]

    def test_text_first(self):
        plain = completion(prompt="Once upon a time", max_tokens=8)
        r = completion(prompt="Once upon a time", max_tokens=8, echo=True)
        self.assertEqual(r["choices"][0]["text"], "Once upon a time" + plain["choices"][0]["text"])
        self.assertIsNone(r["choices"][0]["logprobs"])
        self.assertEqual(r["usage"]["completion_tokens"], 8)
        # token ids: their text, as /detokenize gives it without special tokens' text
        st, d = srv.post("/detokenize", {"tokens": self.ids[1:]})
        self.assertEqual(st, 200, d)
        r = completion(prompt=self.ids, max_tokens=0, echo=True)
        self.assertEqual(r["choices"][0]["text"], d["prompt"])
        self.assertEqual(r["choices"][0]["finish_reason"], "length")
        self.assertEqual(r["usage"]["prompt_tokens"], len(self.ids))
        self.assertEqual(r["usage"]["completion_tokens"], 0)

    def test_prompt_logprobs_match_generation(self):
        r = completion(prompt=self.ids, max_tokens=1, logprobs=1, echo=True)
        lp = r["choices"][0]["logprobs"]
        n = len(self.ids)
        self.assertEqual(len(lp["tokens"]), n + 1)
        self.assertIsNone(lp["token_logprobs"][0])
        self.assertIsNone(lp["top_logprobs"][0])
        self.assertEqual(lp["text_offset"], sorted(lp["text_offset"]))
        for i in range(1, n + 1):
            self.assertLess(lp["token_logprobs"][i], 0)
            self.assertEqual(len(lp["top_logprobs"][i]), 1)
        # lm-evaluation-harness's is_greedy: the continuation is greedy, so every token of it
        # is its position's top
        ctx = len(self.case["prompt_ids"])
        for i in range(ctx, n):
            tok = lp["token_logprobs"][i]
            self.assertEqual(tok, max(lp["top_logprobs"][i].values()), i)
        # each position against a generation from the tokens before it
        for i in range(ctx, n, 4):
            g = completion(prompt=self.ids[:i], max_tokens=1, logprobs=1)
            glp = g["choices"][0]["logprobs"]
            self.assertEqual(glp["tokens"][0], lp["tokens"][i])
            self.assertAlmostEqual(glp["token_logprobs"][0], lp["token_logprobs"][i], delta=1e-6)
        # the generated token rides after the prompt's, as without echo
        g = completion(prompt=self.ids, max_tokens=1, logprobs=1)
        self.assertEqual(r["choices"][0]["text"][-len(g["choices"][0]["text"]):],
                         g["choices"][0]["text"])
        self.assertAlmostEqual(lp["token_logprobs"][n], g["choices"][0]["logprobs"][
            "token_logprobs"][0], delta=1e-6)

    def test_scored_again_not_cached(self):
        """A prompt whose blocks are cached is still computed for its scores: the same."""
        a = completion(prompt=self.ids, max_tokens=0, logprobs=3, echo=True)
        completion(prompt=self.ids, max_tokens=2)
        b = completion(prompt=self.ids, max_tokens=0, logprobs=3, echo=True)
        self.assertEqual(a["choices"][0]["logprobs"], b["choices"][0]["logprobs"])
        self.assertEqual(b["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
        for top in a["choices"][0]["logprobs"]["top_logprobs"][1:]:
            self.assertEqual(len(top), 3)

    def test_batch_of_prompts_and_n(self):
        prompts = [self.ids[:20], self.ids[:33], "Once upon a time"]
        r = completion(prompt=prompts, max_tokens=2, logprobs=0, echo=True, n=2)
        self.assertEqual([c["index"] for c in r["choices"]], list(range(6)))
        alone = [completion(prompt=p, max_tokens=2, logprobs=0, echo=True) for p in prompts]
        for k, p in enumerate(prompts):
            want = alone[k]["choices"][0]
            for j in range(2):
                c = r["choices"][k * 2 + j]
                self.assertEqual(c["text"], want["text"])
                self.assertEqual(c["logprobs"], want["logprobs"])
        self.assertEqual(r["usage"]["prompt_tokens"], 20 + 33 + len(alone[2]["choices"][0][
            "logprobs"]["tokens"]) - 2)

    def test_stream_equals_whole(self):
        body = {"prompt": self.ids[:30], "max_tokens": 5, "logprobs": 2, "echo": True, "n": 2,
                "temperature": 0}
        whole = completion(**body)
        st, events, done = srv.stream("/v1/completions", dict(body, stream=True))
        self.assertEqual(st, 200)
        self.assertTrue(done)
        for j in range(2):
            chunks = [e["choices"][0] for e in events if e["choices"][0]["index"] == j]
            # the prompt first, whole, with its scores
            self.assertEqual(len(chunks[0]["logprobs"]["tokens"]), 30)
            text = "".join(c["text"] for c in chunks)
            self.assertEqual(text, whole["choices"][j]["text"])
            merged = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
            for c in chunks:
                for key in merged:
                    merged[key] += (c["logprobs"] or {}).get(key, [])
            self.assertEqual(merged, whole["choices"][j]["logprobs"])

    def test_errors(self):
        for body, param in [({"prompt": "a", "echo": "yes"}, "echo"),
                            ({"prompt": "a", "max_tokens": 0}, "max_tokens"),
                            ({"prompt": "a", "max_tokens": -1, "echo": True}, "max_tokens")]:
            with self.subTest(body=body):
                st, r = srv.post("/v1/completions", body)
                self.assertEqual(st, 400, r)
                self.assertEqual(r["error"]["param"], param)
        st, r = srv.post("/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0})
        self.assertEqual(st, 400, r)
        self.assertEqual(r["error"]["param"], "max_tokens")

    def tearDown(self):
        m = srv.metrics()
        self.assertEqual(m["kvserve_num_requests_running"], 0)


class LmEvalRemoteTokenizer(unittest.TestCase):
    """lm-evaluation-harness's local-completions with its remote tokenizer, step by step: it
    uses the server's tokenizer when GET /tokenizer_info names an eos_token and POST /tokenize
    answers tokens; the EOS id is the first id of eos_token's text tokenized; a loglikelihood
    request is context + continuation ids with echo, logprobs 1 and max_tokens 1, scored as the
    sum of token_logprobs[ctxlen:-1], greedy when each of those is its position's top."""

    def test_tokenizer_info(self):
        st, _, data = srv.request("GET", "/tokenizer_info")
        self.assertEqual(st, 200)
        info = json.loads(data)
        self.assertEqual(info["tokenizer_class"], "LlamaTokenizerFast")
        self.assertEqual((info["bos_token"], info["eos_token"], info["unk_token"]),
                         ("<s>", "</s>", "<unk>"))
        self.assertIsNone(info["pad_token"])
        self.assertEqual(info["add_bos_token"], True)
        self.assertEqual(info["model_max_length"], 512)
        self.assertEqual(info["vocab_size"], 512)
        self.assertIsNone(info["chat_template"])  # stories260K has none
        st, r = srv.post("/tokenize", {"prompt": info["eos_token"], "add_special_tokens": False})
        self.assertEqual((st, r["tokens"]), (200, [2]))

    def loglikelihood(self, pairs):
        def encode(text):
            st, r = srv.post("/tokenize", {"prompt": text, "add_special_tokens": False})
            self.assertEqual(st, 200, r)
            return r["tokens"]
        reqs = []
        for ctx, cont in pairs:  # as lm-eval's _encode_pair: the whole, split after the context
            whole, c = encode(ctx + cont), encode(ctx)
            reqs.append(([1] + c, whole[len(c):]))
        r = completion(model="stories260K", prompt=[c + k for c, k in reqs], max_tokens=1,
                       logprobs=1, echo=True, seed=1234)
        out = []
        for choice, (ctx, _) in zip(sorted(r["choices"], key=lambda c: c["index"]), reqs):
            lps = choice["logprobs"]["token_logprobs"][len(ctx):-1]
            tops = choice["logprobs"]["top_logprobs"][len(ctx):-1]
            out.append((sum(lps), all(t == max(top.values()) for t, top in zip(lps, tops))))
        return out

    def test_loglikelihood(self):
        case = e2e.load_reference()[0]
        ctx = case["prompt"]
        greedy = case["completion_text"][:60]
        other = " The purple engine sang loudly about taxes."
        (ll_g, is_g), (ll_o, is_o) = self.loglikelihood([(ctx, greedy), (ctx, other)])
        self.assertTrue(is_g)
        self.assertFalse(is_o)
        self.assertGreater(ll_g, ll_o)
        self.assertLess(ll_g, 0)


if __name__ == "__main__":
    unittest.main()
