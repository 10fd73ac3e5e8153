"""kvserve generate: the command-line path through the same scheduler as serve.

Against llama2.c's greedy references on stories260K (the ids exactly, cached and recomputed),
a random-weight 110m-shape model (cached == recomputed at a real width), and its refusals.
"""
import os
import subprocess
import tempfile
import unittest

from kvs_e2e import BIN, MKMODEL, MODEL, MODELS, load_reference, require_server  # noqa: F401

VOCAB = os.path.join(MODELS, "vocab", "ggml-vocab-llama-spm.gguf")


def generate(*args, model=None, check=True):
    """Runs kvserve generate; returns (exit code, stdout, stderr)."""
    p = subprocess.run([BIN, "generate", "-m", model or MODEL, "--threads", "1"] + list(args),
                       capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError("kvserve generate exited %d:\n%s" % (p.returncode, p.stderr))
    return p.returncode, p.stdout, p.stderr


def ids_of(out):
    return [int(t) for t in out.split()]


class GenerateReference(unittest.TestCase):
    def setUp(self):
        require_server()

    def test_greedy_ids_equal_llama2c(self):
        for case in load_reference():
            full = len(case["completion_ids"])
            # recomputing is quadratic: its first 48 tokens are enough to compare
            for mode, n in (([], full), (["--no-cache"], min(48, full))):
                want = case["completion_ids"][:n]
                with self.subTest(prompt=case["prompt"], mode=mode):
                    _, out, err = generate("-p", case["prompt"], "-n", str(n), "--ids",
                                           "--ctx-size", "512", *mode)
                    self.assertEqual(ids_of(out), want, err)
                    self.assertIn("generated %d tokens" % len(want), err)

    def test_text_is_the_reference_text(self):
        case = load_reference()[0]
        _, out, _ = generate("-p", case["prompt"], "-n", str(len(case["completion_ids"])),
                             "--ctx-size", "512")
        self.assertEqual(out, case["completion_text"] + "\n")

    def test_stops_at_the_models_end_token(self):
        # The reference stories end at BOS before 600 tokens; generate stops there too.
        case = load_reference()[0]
        _, out, _ = generate("-p", case["prompt"], "-n", "600", "--ids", "--ctx-size", "1024")
        ids = ids_of(out)
        self.assertEqual(ids[:len(case["completion_ids"])], case["completion_ids"])
        self.assertLess(len(ids), 600)
        self.assertNotIn(1, ids)

    def test_refusals(self):
        rc, _, err = generate("-p", "Once", "-n", "600", "--ctx-size", "64", check=False)
        self.assertEqual(rc, 2)
        self.assertIn("do not fit the context of 64 tokens", err)
        rc, _, err = generate("-p", "Once", "--no-cache", "--temp", "0.7", check=False)
        self.assertEqual(rc, 2)
        self.assertIn("--no-cache is greedy only", err)
        rc, _, err = generate("-p", "Once", "--kernels", "sse9", check=False)
        self.assertEqual(rc, 2)
        rc, _, err = generate("-p", "Once", "--activations", "q4", check=False)
        self.assertEqual(rc, 2)
        self.assertIn("--activations 'q4': unknown (q8|f32)", err)

    def test_sampling_follows_the_seed(self):
        a = generate("-p", "Once upon a time", "-n", "48", "--ids", "--temp", "0.9", "--seed", "7")[1]
        b = generate("-p", "Once upon a time", "-n", "48", "--ids", "--temp", "0.9", "--seed", "7")[1]
        c = generate("-p", "Once upon a time", "-n", "48", "--ids", "--temp", "0.9", "--seed", "8")[1]
        self.assertEqual(a, b)
        self.assertNotEqual(a, c)


class GenerateWide(unittest.TestCase):
    def test_cached_equals_recomputed_110m(self):
        require_server()
        if os.environ.get("KVS_SANITIZE", "none") not in ("", "none"):
            self.skipTest("a 110m model is too slow under sanitizers; the release build runs it")
        if not MKMODEL or not os.access(MKMODEL, os.X_OK) or not os.path.exists(VOCAB):
            self.skipTest("KVS_MKMODEL or " + VOCAB + " missing")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "110m-f16.gguf")
            subprocess.run([MKMODEL, "--shape", "110m", "--type", "f16", "--vocab", VOCAB,
                            "-o", path], check=True, capture_output=True)
            args = ["-p", "The quick brown fox", "-n", "12", "--ids", "--ignore-eos",
                    "--block-size", "4"]
            cached = ids_of(generate(*args, model=path)[1])
            recomputed = ids_of(generate(*args, "--no-cache", model=path)[1])
            self.assertEqual(len(cached), 12)
            self.assertEqual(cached, recomputed)


if __name__ == "__main__":
    unittest.main()
