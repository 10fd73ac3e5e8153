#!/usr/bin/env python3
"""One /v1/embeddings request, timed: bench/embed.sh's client (standard library only).

  bench/embed_client.py --url URL --inputs N --len L --seed S

Sends N inputs of L random token ids each (ids 300 .. 30000: no special or byte token; the
seed makes every request's inputs new, so no prefix cache serves them) as one request, checks
N vectors came back, and prints the wall time in seconds. Exits 1 on any error."""
import argparse
import json
import random
import sys
import time
import urllib.request


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--inputs", type=int, default=1)
    ap.add_argument("--len", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    inputs = [[rng.randrange(300, 30000) for _ in range(a.len)] for _ in range(a.inputs)]
    req = urllib.request.Request(a.url + "/v1/embeddings",
                                 json.dumps({"input": inputs}).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=3600) as r:
        answer = json.load(r)
    dt = time.monotonic() - t0
    if len(answer["data"]) != a.inputs:
        sys.exit("%d vectors, want %d" % (len(answer["data"]), a.inputs))
    print("%.4f" % dt)


if __name__ == "__main__":
    main()
