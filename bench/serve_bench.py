#!/usr/bin/env python3
"""Serving benchmark for kvserve (or any OpenAI-compatible server), standard library only.

Drives POST /v1/completions or /v1/chat/completions, streaming or not, either closed-loop (a
fixed number of clients, each sending its next request when the last one ends) or open-loop
(Poisson arrivals at a given rate), and reports the metrics of vLLM's serving benchmark:
requests/s, output tokens/s, TTFT, TPOT and inter-token latency (mean, p50, p90, p99), as a
table and as JSON.

  bench/serve_bench.py --url http://127.0.0.1:8080 --concurrency 16 --num-requests 200 \
      --input-len 32 --output-len 128 [--stream] [--endpoint chat] [--rate 20] [--json out.json]

Prompts are token-id arrays for completions (exact input lengths) and text for chat; with
--same-prompt every request sends the first one's (a server's whole-prompt cache hits).
Output length is forced with ignore_eos unless --allow-eos is given.
"""
import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from urllib.parse import urlparse


def pct(values, p):
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


class Result:
    __slots__ = ("ok", "status", "ttft", "e2e", "itls", "out_tokens", "in_tokens", "error")

    def __init__(self):
        self.ok = False
        self.status = 0
        self.ttft = None
        self.e2e = 0.0
        self.itls = []
        self.out_tokens = 0
        self.in_tokens = 0
        self.error = ""


async def read_response_head(reader):
    line = await reader.readline()
    if not line:
        raise ConnectionError("connection closed")
    status = int(line.split()[1])
    headers = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        k, _, v = line.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers


async def body_chunks(reader, headers):
    """Yields the body in pieces as they arrive (chunked or Content-Length)."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size_line = await reader.readline()
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return
            data = await reader.readexactly(size)
            await reader.readexactly(2)
            yield data
    elif "content-length" in headers:
        n = int(headers["content-length"])
        if n:
            yield await reader.readexactly(n)
    else:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data


class Client:
    def __init__(self, host, port, api_key):
        self.host, self.port, self.api_key = host, port, api_key
        self.reader = self.writer = None

    async def request(self, path, payload, stream):
        res = Result()
        body = json.dumps(payload).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n")
        if self.api_key:
            head += f"Authorization: Bearer {self.api_key}\r\n"
        head += "\r\n"
        t0 = time.perf_counter()
        for attempt in range(2):  # a kept-alive connection may have been closed: retry once
            try:
                if self.writer is None:
                    self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
                self.writer.write(head.encode() + body)
                await self.writer.drain()
                status, headers = await read_response_head(self.reader)
                break
            except (ConnectionError, OSError, asyncio.IncompleteReadError, IndexError) as e:
                self.close()
                if attempt == 1:
                    res.error = str(e)
                    res.e2e = time.perf_counter() - t0
                    return res
        res.status = status
        last = None
        buf = b""
        text_chunks = 0
        try:
            async for piece in body_chunks(self.reader, headers):
                if not stream or status != 200:
                    buf += piece
                    continue
                buf += piece
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    if not event.startswith(b"data: "):
                        continue
                    data = event[6:]
                    if data == b"[DONE]":
                        continue
                    obj = json.loads(data)
                    if "error" in obj:
                        res.error = obj["error"].get("message", "error")
                        continue
                    if obj.get("usage"):
                        res.out_tokens = obj["usage"]["completion_tokens"]
                        res.in_tokens = obj["usage"]["prompt_tokens"]
                    for ch in obj.get("choices", []):
                        delta = ch.get("text")
                        if delta is None:
                            delta = ch.get("delta", {}).get("content")
                        if delta:
                            now = time.perf_counter()
                            if res.ttft is None:
                                res.ttft = now - t0
                            else:
                                res.itls.append(now - last)
                            last = now
                            text_chunks += 1
        except (ConnectionError, OSError, asyncio.IncompleteReadError) as e:
            res.error = str(e)
            self.close()
        res.e2e = time.perf_counter() - t0
        if headers.get("connection", "").lower() == "close":
            self.close()
        if status != 200:
            res.error = res.error or buf[:200].decode("utf-8", "replace")
            return res
        if not stream:
            obj = json.loads(buf)
            res.out_tokens = obj["usage"]["completion_tokens"]
            res.in_tokens = obj["usage"]["prompt_tokens"]
            res.ttft = res.e2e
        elif not res.out_tokens:
            res.out_tokens = text_chunks
        res.ok = not res.error
        return res

    def close(self):
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def make_payload(args, rng, model):
    in_len = args.input_len
    out_len = args.output_len
    if args.range_ratio < 1.0:
        in_len = rng.randint(max(1, int(in_len * args.range_ratio)), in_len)
        out_len = rng.randint(max(1, int(out_len * args.range_ratio)), out_len)
    p = {"max_tokens": out_len, "temperature": args.temperature, "stream": args.stream}
    if model:
        p["model"] = model
    if not args.allow_eos:
        p["ignore_eos"] = True
    if args.ban_tokens:
        lo, hi = (int(v) for v in args.ban_tokens.split("-"))
        p["logit_bias"] = {str(t): -100 for t in range(lo, hi + 1)}
    if args.stream:
        p["stream_options"] = {"include_usage": True}
    if args.endpoint == "completions":
        # token ids 3.. keep clear of BOS/EOS; vocabularies are far larger than 300
        p["prompt"] = [rng.randint(3, 300) for _ in range(in_len)]
        return "/v1/completions", p
    words = " ".join(rng.choice(["the", "little", "dog", "ran", "to", "a", "big", "park",
                                 "and", "she", "was", "happy"]) for _ in range(in_len))
    p["messages"] = [{"role": "user", "content": words}]
    return "/v1/chat/completions", p


async def run(args):
    u = urlparse(args.url)
    host, port = u.hostname, u.port or 80
    rng = random.Random(args.seed)
    results = []
    payloads = [make_payload(args, rng, args.model) for _ in range(args.num_requests)]
    if args.same_prompt:  # every request the first one's: whole-prompt cache hits after it
        payloads = [payloads[0]] * args.num_requests
    start = time.perf_counter()
    if args.rate > 0:  # open loop: Poisson arrivals, one connection per in-flight request
        async def one(path, p):
            c = Client(host, port, args.api_key)
            r = await c.request(path, p, args.stream)
            c.close()
            results.append(r)
        tasks = []
        for path, p in payloads:
            tasks.append(asyncio.create_task(one(path, p)))
            await asyncio.sleep(rng.expovariate(args.rate))
        await asyncio.gather(*tasks)
    else:  # closed loop
        queue = list(reversed(payloads))

        async def worker():
            c = Client(host, port, args.api_key)
            while queue:
                path, p = queue.pop()
                results.append(await c.request(path, p, args.stream))
            c.close()
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    duration = time.perf_counter() - start
    return results, duration


def summarize(args, results, duration):
    ok = [r for r in results if r.ok]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    tpot = [(r.e2e - r.ttft) / (r.out_tokens - 1) for r in ok
            if r.ttft is not None and r.out_tokens > 1]
    itl = [x for r in ok for x in r.itls]
    e2e = [r.e2e for r in ok]
    out_tok = sum(r.out_tokens for r in ok)
    in_tok = sum(r.in_tokens for r in ok)
    statuses = {}
    for r in results:
        statuses[str(r.status)] = statuses.get(str(r.status), 0) + 1

    def dist(v):
        return {"mean": statistics.fmean(v) * 1e3 if v else float("nan"),
                "p50": pct(v, 50) * 1e3, "p90": pct(v, 90) * 1e3, "p99": pct(v, 99) * 1e3}
    return {
        "endpoint": args.endpoint, "stream": args.stream,
        "mode": f"poisson {args.rate}/s" if args.rate > 0 else f"closed {args.concurrency}",
        "num_requests": len(results), "completed": len(ok), "failed": len(results) - len(ok),
        "statuses": statuses, "duration_s": duration,
        "request_throughput": len(ok) / duration, "output_throughput": out_tok / duration,
        "total_token_throughput": (in_tok + out_tok) / duration,
        "input_tokens": in_tok, "output_tokens": out_tok,
        "ttft_ms": dist(ttft), "tpot_ms": dist(tpot), "itl_ms": dist(itl), "e2e_ms": dist(e2e),
        "errors": sorted({r.error for r in results if r.error})[:5],
    }


def print_table(s):
    print(f"{'mode':<28}{s['mode']}")
    print(f"{'endpoint / stream':<28}{s['endpoint']} / {s['stream']}")
    print(f"{'completed / failed':<28}{s['completed']} / {s['failed']}  {s['statuses']}")
    print(f"{'duration (s)':<28}{s['duration_s']:.2f}")
    print(f"{'requests/s':<28}{s['request_throughput']:.2f}")
    print(f"{'output tokens/s':<28}{s['output_throughput']:.1f}")
    print(f"{'total tokens/s':<28}{s['total_token_throughput']:.1f}")
    for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        d = s[k]
        print(f"{k + ' mean/p50/p90/p99':<28}{d['mean']:.2f} / {d['p50']:.2f} / "
              f"{d['p90']:.2f} / {d['p99']:.2f}")
    for e in s["errors"]:
        print("error:", e)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--concurrency", type=int, default=1, help="closed-loop clients")
    ap.add_argument("--rate", type=float, default=0.0, help="open-loop Poisson requests/s")
    ap.add_argument("--num-requests", type=int, default=100)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--range-ratio", type=float, default=1.0,
                    help="< 1: draw lengths uniformly from [ratio*len, len]")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--allow-eos", action="store_true", help="do not send ignore_eos")
    ap.add_argument("--model", default="")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ban-tokens", default="", metavar="LO-HI",
                    help="logit_bias -100 on token ids LO..HI (e.g. 3-258, llama-spm's byte "
                         "tokens: a random-weights model's stray bytes are invalid UTF-8, "
                         "which llama-server answers with a 500)")
    ap.add_argument("--same-prompt", action="store_true",
                    help="every request sends the first request's prompt (prefix cache hits)")
    ap.add_argument("--json", default="", help="also write the summary as JSON here")
    args = ap.parse_args()
    results, duration = asyncio.run(run(args))
    s = summarize(args, results, duration)
    print_table(s)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(s, fh, indent=2)
    return 0 if s["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
