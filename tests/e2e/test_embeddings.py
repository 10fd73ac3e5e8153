"""POST /v1/embeddings on stories260K: the OpenAI shape (float and base64), vectors of unit
length that do not depend on what shares the batch nor on how many inputs came together (one
request of 300 inputs, more than the queue bound, answers as 300 requests of one), token ids as
input, usage, and every 400. The values themselves are checked against llama-server in the
peer_embeddings suite and against the reference forward in tests/test_models.c."""
import base64
import math
import struct
import unittest

import kvs_e2e as e2e

srv = None


def setUpModule():
    global srv
    e2e.require_server()
    srv = e2e.Server("--served-model-name", "stories260K", "--max-queue", "64",
                     "--max-num-seqs", "8")


def tearDownModule():
    if srv:
        rc = srv.stop()
        if rc != 0:
            raise AssertionError("kvserve exited with %d after SIGTERM" % rc)


def embed(**body):
    st, r = srv.post("/v1/embeddings", body)
    assert st == 200, r
    return r


class Embeddings(unittest.TestCase):
    def test_shape_and_norm(self):
        r = embed(input=["Once upon a time", "Hello"], model="stories260K")
        self.assertEqual(r["object"], "list")
        self.assertEqual(r["model"], "stories260K")
        self.assertEqual([d["index"] for d in r["data"]], [0, 1])
        for d in r["data"]:
            self.assertEqual(d["object"], "embedding")
            self.assertEqual(len(d["embedding"]), 64)  # stories260K's n_embd
            self.assertAlmostEqual(math.sqrt(sum(x * x for x in d["embedding"])), 1.0, delta=1e-5)
        self.assertNotEqual(r["data"][0]["embedding"], r["data"][1]["embedding"])
        st, tok = srv.post("/tokenize", {"prompt": "Once upon a time"})
        st, tok2 = srv.post("/tokenize", {"prompt": "Hello"})
        self.assertEqual(r["usage"], {"prompt_tokens": tok["count"] + tok2["count"],
                                      "total_tokens": tok["count"] + tok2["count"]})

    def test_base64_is_the_floats(self):
        f = embed(input="Once upon a time")["data"][0]["embedding"]
        b = embed(input="Once upon a time", encoding_format="base64")["data"][0]["embedding"]
        raw = base64.b64decode(b)
        self.assertEqual(len(raw), 4 * len(f))
        # the JSON's 9 digits give each float32 back exactly
        self.assertEqual(raw, struct.pack("<%df" % len(f), *f))

    def test_ids_and_text_agree(self):
        st, tok = srv.post("/tokenize", {"prompt": "Tom and Sue went to the beach"})
        a = embed(input="Tom and Sue went to the beach")["data"][0]["embedding"]
        b = embed(input=tok["tokens"])["data"][0]["embedding"]
        c = embed(input=[tok["tokens"], tok["tokens"][:3]])["data"]
        self.assertEqual(a, b)
        self.assertEqual(c[0]["embedding"], a)

    def test_many_inputs_as_one_each(self):
        texts = ["story %d: a cat and a dog %s" % (i, "went home" if i % 2 else "ran")
                 for i in range(300)]
        r = embed(input=texts)
        self.assertEqual([d["index"] for d in r["data"]], list(range(300)))
        for i in (0, 1, 150, 299):
            alone = embed(input=texts[i])["data"][0]["embedding"]
            self.assertEqual(r["data"][i]["embedding"], alone, i)

    def test_errors(self):
        cases = [({}, "input"), ({"input": ""}, "input"), ({"input": []}, "input"),
                 ({"input": [[]]}, "input"), ({"input": ["a", 5]}, "input"),
                 ({"input": [1, -2]}, "input"), ({"input": [1, 99999]}, "input"),
                 ({"input": "a", "encoding_format": "binary"}, "encoding_format"),
                 ({"input": "a", "dimensions": 32}, "dimensions"),
                 ({"input": "a", "user": 3}, "user"), ({"input": ["a"] * 2049}, "input")]
        for body, param in cases:
            with self.subTest(body=str(body)[:60]):
                st, r = srv.post("/v1/embeddings", body)
                self.assertEqual(st, 400, r)
                self.assertEqual(r["error"]["param"], param)
        st, r = srv.post("/v1/embeddings", {"input": "a", "model": "gpt-4"})
        self.assertEqual(st, 404, r)
        st, r = srv.post("/v1/embeddings", {"input": "a " * 600})
        self.assertEqual(st, 400, r)
        self.assertEqual(r["error"]["code"], "context_length_exceeded")
        # the model's own size is fine
        embed(input="a", dimensions=64)

    def tearDown(self):
        m = srv.metrics()
        self.assertEqual(m["kvserve_num_requests_running"], 0)


if __name__ == "__main__":
    unittest.main()
