#!/usr/bin/env python3
"""One scoring request, timed: bench/score.sh's client (standard library only).

  bench/score_client.py --url URL --mode MODE --prompts B --len P --seed S

Sends B prompts of P random token ids (BOS first; ids 300 .. 30000, so none is a special or
byte token; the seed makes every request's prompts new, so no prefix cache serves them) in one
request and prints its wall time in seconds. MODE:
  score   kvserve /v1/completions, echo, logprobs 1, max_tokens 0: every prompt token after
          the first scored (lm-evaluation-harness's loglikelihood request); checks each choice
          holds P entries
  plain   /v1/completions, max_tokens 1: the prompts computed, one token generated
  peer    llama-server's /completion, n_predict 1, cache_prompt false: the same, on llama.cpp
          (which scores no prompt)
Exits 1 on any error."""
import argparse
import json
import random
import sys
import time
import urllib.request


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--mode", choices=("score", "plain", "peer"), required=True)
    ap.add_argument("--prompts", type=int, default=1)
    ap.add_argument("--len", type=int, default=512)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    prompts = [[1] + [rng.randrange(300, 30000) for _ in range(a.len - 1)]
               for _ in range(a.prompts)]
    if a.mode == "peer":
        path, body = "/completion", {"prompt": prompts if a.prompts > 1 else prompts[0],
                                     "n_predict": 1, "temperature": 0, "cache_prompt": False}
    else:
        path = "/v1/completions"
        body = {"prompt": prompts, "temperature": 0, "max_tokens": 1}
        if a.mode == "score":
            body.update(echo=True, logprobs=1, max_tokens=0)
    req = urllib.request.Request(a.url + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=3600) as r:
        answer = json.load(r)
    dt = time.monotonic() - t0
    if a.mode == "score":
        for c in answer["choices"]:
            if len(c["logprobs"]["token_logprobs"]) != a.len:
                sys.exit("choice %d: %d logprobs, want %d" % (
                    c["index"], len(c["logprobs"]["token_logprobs"]), a.len))
    print("%.4f" % dt)


if __name__ == "__main__":
    main()
