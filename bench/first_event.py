#!/usr/bin/env python3
"""A stream's first event against a non-streamed request of one token, one client, standard
library only.

Interleaves a non-streamed request for 1 token (time to its whole response) with a streamed
one for 4 (time to its first and second text events), --requests of each, and prints the p50s.
Both send the same prompt of --input-len token ids, so after the warm-up every prompt is found
whole in the cache (--uncached changes its first id each time). With --keep-alive every request
goes on one connection, as serve_bench's clients and browsers send them; without, each opens
its own. A first event later than the non-streamed token on a kept-alive connection only is
the sign of a small send held back for the client's delayed ACK (docs/BENCHMARKS.md, "Why the
stream's first event waited").

  bench/first_event.py --url http://127.0.0.1:8080 --requests 10 --keep-alive
"""
import argparse
import http.client
import json
import random
import statistics
import time
from urllib.parse import urlparse


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--requests", type=int, default=10, help="of each kind")
    ap.add_argument("--input-len", type=int, default=32, help="prompt token ids")
    ap.add_argument("--vocab", type=int, default=30000, help="ids are drawn from 300 .. this")
    ap.add_argument("--ban-tokens", default="", metavar="LO-HI",
                    help="logit_bias -100 on these ids (as serve_bench's)")
    ap.add_argument("--keep-alive", action="store_true", help="one connection for all")
    ap.add_argument("--uncached", action="store_true", help="a new prompt for each request")
    args = ap.parse_args()
    u = urlparse(args.url)
    rng = random.Random(7)
    prompt = [rng.randrange(300, args.vocab) for _ in range(args.input_len)]
    bias = {}
    if args.ban_tokens:
        lo, hi = (int(v) for v in args.ban_tokens.split("-"))
        bias = {str(t): -100 for t in range(lo, hi + 1)}
    conn = None
    count = 0

    def one(stream, max_tokens):
        nonlocal conn, count
        count += 1
        ids = list(prompt)
        if args.uncached:
            ids[0] = 300 + (count * 7919) % (args.vocab - 300)
        body = {"prompt": ids, "max_tokens": max_tokens, "temperature": 0, "stream": stream,
                "ignore_eos": True}
        if bias:
            body["logit_bias"] = bias
        if conn is None or not args.keep_alive:
            if conn is not None:
                conn.close()
            conn = http.client.HTTPConnection(u.hostname, u.port or 80)
            conn.connect()
        t0 = time.perf_counter()
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raise SystemExit(f"status {r.status}: {r.read()[:200]!r}")
        if not stream:
            r.read()
            return [(time.perf_counter() - t0) * 1e3]
        times = []
        while True:
            line = r.readline()
            if not line or line.startswith(b"data: [DONE]"):
                break
            if line.startswith(b"data:"):
                times.append((time.perf_counter() - t0) * 1e3)
        r.read()
        return times

    for _ in range(2):  # warm-up: the prompt into the cache, the connection open
        one(False, 1)
        one(True, 4)
    full, first, second = [], [], []
    for _ in range(args.requests):
        full.append(one(False, 1)[0])
        t = one(True, 4)
        first.append(t[0])
        second.append(t[1])
    med = statistics.median
    print(f"{'kept-alive' if args.keep_alive else 'new connections'}, "
          f"{'uncached' if args.uncached else 'cached'} {args.input_len}-token prompt, "
          f"p50 of {args.requests}: non-streamed 1 token {med(full):.1f} ms | "
          f"stream first event {med(first):.1f} ms, second {med(second):.1f} ms")


if __name__ == "__main__":
    main()
