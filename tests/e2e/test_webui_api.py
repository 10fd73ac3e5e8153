"""The web page's routes over HTTP (the browser side is tests/webui): GET / is the embedded
page (text/html, no other host) and --no-webui turns it off; GET /kv-cache is a consistent
snapshot, folded to ?cells=N, validated, and behind --api-key like the API."""
import json
import re
import threading
import unittest

import kvs_e2e as e2e


class Page(unittest.TestCase):
    def test_page_and_no_webui(self):
        srv = e2e.Server()
        try:
            st, h, body = srv.request("GET", "/")
            self.assertEqual(st, 200)
            self.assertTrue(h["content-type"].startswith("text/html"))
            html = body.decode()
            self.assertIn("<canvas id=\"grid\"", html)
            self.assertIsNone(re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", html, re.I))
        finally:
            self.assertEqual(srv.stop(), 0)
        srv = e2e.Server("--no-webui")
        try:
            st, h, body = srv.request("GET", "/")
            self.assertEqual(st, 404)
            self.assertIn("--no-webui", json.loads(body)["error"]["message"])
        finally:
            self.assertEqual(srv.stop(), 0)


class KvCache(unittest.TestCase):
    def test_snapshot_during_a_request(self):
        srv = e2e.Server("--kv-cache-mb", "8")
        try:
            st, h, body = srv.request("GET", "/kv-cache")
            self.assertEqual(st, 200)
            k = json.loads(body)
            self.assertEqual(k["blocks"]["used"], 0)
            self.assertEqual(len(k["cells"]), k["n_blocks"])
            self.assertEqual(k["model"]["architecture"], "llama")
            self.assertIn(k["model"]["kernels"], ("avx512", "avx2", "generic"))
            done = threading.Event()

            def run():
                # a prompt of several full blocks, which the forks share
                srv.post("/v1/completions", {"prompt": "Once upon a time, " * 12, "n": 4,
                                             "max_tokens": 400, "ignore_eos": True})
                done.set()

            t = threading.Thread(target=run)
            t.start()
            seen_shared = False
            while not done.is_set():
                st, _, body = srv.request("GET", "/kv-cache?cells=64")
                self.assertEqual(st, 200)
                k = json.loads(body)
                self.assertLessEqual(len(k["cells"]), 64)
                self.assertEqual(len(k["owners"]), len(k["cells"]))
                b = k["blocks"]
                self.assertEqual(b["used"] + b["cached"] + b["free"], k["n_blocks"])
                for o in k["owners"]:
                    self.assertTrue(-1 <= o < len(k["seqs"]))
                seen_shared |= b["shared"] > 0
            t.join()
            self.assertTrue(seen_shared, "n = 4 choices never shared a block")
            for bad in ("0", "65537", "x", "-1", "5x"):
                st, _, body = srv.request("GET", "/kv-cache?cells=" + bad)
                self.assertEqual(st, 400, bad)
                self.assertEqual(json.loads(body)["error"]["param"], "cells")
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_behind_api_key(self):
        srv = e2e.Server("--api-key", "sekrit")
        try:
            st, _, _ = srv.request("GET", "/kv-cache")
            self.assertEqual(st, 401)
            st, _, _ = srv.request("GET", "/kv-cache", headers={"Authorization": "Bearer sekrit"})
            self.assertEqual(st, 200)
            st, _, _ = srv.request("GET", "/")  # the page holds no data
            self.assertEqual(st, 200)
        finally:
            self.assertEqual(srv.stop(), 0)


if __name__ == "__main__":
    unittest.main()
