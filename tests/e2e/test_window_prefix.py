"""Prefix reuse on a hybrid (global + sliding-window) model through the real server, with the
window reclaim on: a conversation far longer than the windowed layers' pool, sent again with a
new turn, hits on every full block it shares (the windowed layers need only the window ending
at the hit), and the answer is the one a server without a prefix cache gives. Uses a gemma3
file from KVS_MKMODEL (swa7 shape: six windowed layers, one global; window 16), and an lfm2 one
(four short-convolution layers, whose B*x rows the windowed group holds for the 3 positions each
reads, beside three attention layers)."""
import os
import shutil
import subprocess
import tempfile
import unittest

import kvs_e2e as e2e

TMP = None
PATH = None
LFM2 = None
# One sequence of blocks of 4 with chunks of 16: the windowed pool holds
# 1 x (ceil((16 + 16) / 4) + 3) = 11 blocks, against the 40 of the first request.
ARGS = ("--block-size", "4", "--max-num-seqs", "1", "--max-batched-tokens", "16")


def setUpModule():
    global TMP, PATH, LFM2
    if not e2e.BIN or not os.access(e2e.BIN, os.X_OK):
        raise unittest.SkipTest("KVSERVE_BIN not set or not executable")
    if not e2e.MKMODEL or not os.access(e2e.MKMODEL, os.X_OK):
        raise unittest.SkipTest("KVS_MKMODEL not set or not executable")
    TMP = tempfile.mkdtemp(prefix="kvs-e2e-wprefix-")
    PATH = os.path.join(TMP, "gemma3-w16.gguf")
    subprocess.run([e2e.MKMODEL, "--shape", "swa7", "--arch", "gemma3", "--weight-std", "0.15",
                    "--sliding-window", "16", "--ctx", "512", "-o", PATH],
                   check=True, capture_output=True)
    LFM2 = os.path.join(TMP, "lfm2.gguf")
    subprocess.run([e2e.MKMODEL, "--shape", "swa7", "--arch", "lfm2", "--weight-std", "0.15",
                    "--ctx", "512", "-o", LFM2], check=True, capture_output=True)


def tearDownModule():
    if TMP:
        shutil.rmtree(TMP, ignore_errors=True)


def ids(n, salt):
    return [(i * 37 + salt * 101 + 11) % 200 + 3 for i in range(n)]


def complete(srv, prompt, max_tokens):
    st, r = srv.post("/v1/completions", {"prompt": prompt, "max_tokens": max_tokens,
                                         "temperature": 0, "ignore_eos": True})
    assert st == 200, r
    return r["choices"][0]["text"]


class WindowPrefix(unittest.TestCase):
    def test_resent_conversation_hits_whole(self):
        self.resent_hits_whole(PATH, 11)

    def test_lfm2_resent_conversation_hits_whole(self):
        # its window is the convolution's 3 taps: ceil((3 + 16) / 4) + 3 = 8 blocks
        self.resent_hits_whole(LFM2, 8)

    def resent_hits_whole(self, path, capacity):
        first = ids(150, 1)
        second = first + ids(10, 2)
        srv = e2e.Server(*ARGS, model=path, ctx=512)
        try:
            m = srv.metrics()
            self.assertEqual(m["kvserve_kv_window_blocks_capacity"], capacity)
            complete(srv, first, 8)
            m0 = srv.metrics()
            got = complete(srv, second, 16)
            m1 = srv.metrics()
        finally:
            self.assertEqual(srv.stop(), 0)
        # 150 shared tokens: 37 full blocks of 4, all hit with the reclaim on
        self.assertEqual(m1["kvserve_prefix_cache_hits_total"] -
                         m0["kvserve_prefix_cache_hits_total"], 150 // 4)
        ref = e2e.Server(*ARGS, "--no-prefix-cache", model=path, ctx=512)
        try:
            want = complete(ref, second, 16)
        finally:
            self.assertEqual(ref.stop(), 0)
        self.assertEqual(got, want)


if __name__ == "__main__":
    unittest.main()
