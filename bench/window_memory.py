#!/usr/bin/env python3
"""One long conversation turn against kvserve, sampling what its KV cache holds.

Sends one non-streaming completion (a token-id prompt of --tokens ids, --out generated with
ignore_eos) and meanwhile polls GET /kv-cache (the engine's own snapshot between two steps:
bytes held by every layer group, the sequence's length and its blocks per group). Prints one
JSON line: the sample taken at the longest sequence seen (its tokens, bytes_used, blocks,
windowed-group blocks), the most bytes seen, and the request's wall time.

  bench/window_memory.py --url http://127.0.0.1:8080 --tokens 32768 --out 16
"""
import argparse
import json
import threading
import time
import urllib.error
import urllib.request


def get(url):
    with urllib.request.urlopen(url, timeout=600) as r:
        return json.loads(r.read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--out", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=512)
    a = ap.parse_args()
    # ids 3.. (past BOS/EOS/unknown of kvs-mkmodel's byte vocabulary), a fixed pattern
    prompt = [3 + (i * 37 + 11) % (a.vocab - 3) for i in range(a.tokens)]
    body = json.dumps({"prompt": prompt, "max_tokens": a.out, "temperature": 0,
                       "ignore_eos": True}).encode()
    result = {}

    def send():
        req = urllib.request.Request(a.url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        t0 = time.time()
        with urllib.request.urlopen(req, timeout=3600) as r:
            result["response"] = json.loads(r.read())
        result["seconds"] = time.time() - t0

    t = threading.Thread(target=send)
    t.start()
    best, most = None, 0
    while t.is_alive():
        try:
            k = get(a.url + "/kv-cache")
        except urllib.error.HTTPError as e:
            if e.code != 503:  # 503: a step outlasted the snapshot's wait; try again
                raise
            continue
        most = max(most, k.get("bytes_used", 0))
        for s in k.get("seqs", []):
            if best is None or s["tokens"] > best["tokens"] or (
                    s["tokens"] == best["tokens"] and k["bytes_used"] > best["bytes_used"]):
                best = {"tokens": s["tokens"], "bytes_used": k["bytes_used"],
                        "blocks": s["blocks"], "window_blocks": s.get("window_blocks", 0),
                        "window_group": k.get("window_group")}
        time.sleep(0.05)
    t.join()
    usage = result["response"]["usage"]
    print(json.dumps({"longest": best, "max_bytes_used": most, "seconds": result["seconds"],
                      "prompt_tokens": usage["prompt_tokens"],
                      "completion_tokens": usage["completion_tokens"]}))


if __name__ == "__main__":
    main()
