#!/usr/bin/env python3
"""Resident memory of kvserve around big non-streamed responses (issue 10's amplification):
starts BIN (default build/server/kvserve) on stories260K with an 8 MiB KV pool (touched in
full early, so what grows is response memory), sends ROUNDS chat requests of n=16 x 400
tokens with 20 top logprobs each (8.5 MB of JSON), and prints RSS before and after each.
  bench/response_memory.py [--bin PATH] [--rounds 4]"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "e2e"))
import kvs_e2e as e2e  # noqa: E402


def rss_kb(pid):
    for line in open("/proc/%d/status" % pid):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/server/kvserve")
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args()
    e2e.BIN = a.bin
    srv = e2e.Server("--max-num-seqs", "32", "--max-response-mb", "16", "--kv-cache-mb", "8")
    body = {"messages": [{"role": "user", "content": "Once upon a time"}], "n": 16,
            "max_tokens": 400, "ignore_eos": True, "logprobs": True, "top_logprobs": 20}
    print("start: RSS %d kB" % rss_kb(srv.proc.pid))
    for i in range(a.rounds):
        st, _, data = srv.request("POST", "/v1/chat/completions", body)
        time.sleep(0.2)
        print("after response %d (status %d, %d bytes): RSS %d kB"
              % (i + 1, st, len(data), rss_kb(srv.proc.pid)))
    srv.stop()


if __name__ == "__main__":
    main()
