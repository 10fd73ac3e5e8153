"""Every end-of-generation token the vocabulary marks ends a choice with finish_reason "stop",
not only EOS: on a random-weight model with phi-3's vocabulary, logit_bias forces the first
generated token to <|end|> (an end-of-turn marker, not the EOS), to <|endoftext|> (the EOS), or
to a plain token. The ids are phi-3's (tests/test_tokenizer.c test_eog_tokens checks that
this vocabulary marks both as end of generation)."""
import os
import subprocess
import tempfile
import unittest

from kvs_e2e import MKMODEL, MODELS, Server, forced_first, require_mkmodel

VOCAB = os.path.join(MODELS, "vocab", "ggml-vocab-phi-3.gguf")
END, ENDOFTEXT, PLAIN = 32007, 32000, 1000  # <|end|>, <|endoftext|> (EOS), a word piece


class EndTokens(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        require_mkmodel(VOCAB)
        cls.dir = tempfile.TemporaryDirectory()
        path = os.path.join(cls.dir.name, "phi3-vocab.gguf")
        subprocess.run([MKMODEL, "--shape", "tiny", "--vocab", VOCAB, "-o", path], check=True,
                       capture_output=True)
        cls.srv = Server(model=path)

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        cls.dir.cleanup()

    def first(self, token, **extra):
        return forced_first(self, self.srv, token, 4, **extra)[:2]

    def test_end_of_turn_marker_stops(self):
        self.assertEqual(self.first(END), ("stop", 1))

    def test_eos_stops(self):
        self.assertEqual(self.first(ENDOFTEXT), ("stop", 1))

    def test_plain_token_runs_to_length(self):
        self.assertEqual(self.first(PLAIN), ("length", 4))

    def test_ignore_eos_runs_past_the_marker(self):
        self.assertEqual(self.first(END, ignore_eos=True), ("length", 4))


if __name__ == "__main__":
    unittest.main()
