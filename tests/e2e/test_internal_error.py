"""The 500 row of API.md: an internal failure (a forward pass that fails, injected with
KVSERVE_TEST_FAIL_STEP) answers an OpenAI-shaped server_error before a stream starts, one
in-stream error event after it has started, and leaves no KV block behind."""
import json
import os
import time
import unittest

import kvs_e2e as e2e


def start_failing_at(step):
    os.environ["KVSERVE_TEST_FAIL_STEP"] = str(step)
    try:
        return e2e.Server()
    finally:
        del os.environ["KVSERVE_TEST_FAIL_STEP"]


class InternalError(unittest.TestCase):
    def setUp(self):
        e2e.require_server()

    def wait_free(self, srv):
        deadline = time.time() + 1.0
        while srv.metrics()["kvserve_kv_blocks_used"] != 0 and time.time() < deadline:
            time.sleep(0.02)
        self.assertEqual(srv.metrics()["kvserve_kv_blocks_used"], 0)

    def test_500_before_stream(self):
        srv = start_failing_at(1)
        try:
            st, r = srv.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8})
            self.assertEqual(st, 500, r)
            self.assertEqual(r["error"]["type"], "server_error")
            self.assertIn("message", r["error"])
            self.wait_free(srv)
            # the failure was one step: the server goes on serving
            st, r = srv.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8})
            self.assertEqual(st, 200)
            m = srv.metrics()
            self.assertEqual(m['kvserve_requests_total{status="500"}'], 1)
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_error_event_after_stream_started(self):
        srv = start_failing_at(6)
        try:
            st, events, done = srv.stream("/v1/chat/completions", {
                "messages": [{"role": "user", "content": "Once upon a time"}],
                "max_tokens": 50, "stream": True})
            self.assertEqual(st, 200)
            self.assertTrue(any("choices" in e for e in events), "no delta before the failure")
            self.assertIn("error", events[-1])
            self.assertEqual(events[-1]["error"]["type"], "server_error")
            self.wait_free(srv)
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_responses_error_event(self):
        """/v1/responses ends a failed stream with its own "error" event."""
        srv = start_failing_at(6)
        try:
            c = srv.conn()
            c.request("POST", "/v1/responses", body=json.dumps(
                {"input": "Once upon a time", "max_output_tokens": 50, "stream": True}),
                headers={"Content-Type": "application/json"})
            r = c.getresponse()
            self.assertEqual(r.status, 200)
            blocks = [b for b in r.read().decode().split("\n\n") if b.strip()]
            c.close()
            self.assertTrue(any("response.output_text.delta" in b for b in blocks))
            last = blocks[-1].split("\n")
            self.assertEqual(last[0], "event: error")
            err = json.loads(last[1][6:])
            self.assertEqual(err["type"], "error")
            self.assertEqual(err["code"], "server_error")
            self.wait_free(srv)
        finally:
            self.assertEqual(srv.stop(), 0)


if __name__ == "__main__":
    unittest.main()
