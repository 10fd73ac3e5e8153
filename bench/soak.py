#!/usr/bin/env python3
"""Soak test: a mixed workload against one kvserve for --duration seconds (default 600):
plain and streaming completions, chat, clients that disconnect mid-stream, long prompts near
the context limit and over it. The server's RSS and open fds (and KV blocks in use, requests
running/waiting) are sampled every second into --csv; --png plots them with gnuplot.

Passes (exit 0) when every response had an expected status, nothing crashed, and after the
run the fds are back to their baseline and 0 KV blocks are used.

Usage: nice -n 10 bench/soak.py --duration 600 --csv docs/soak.csv --png docs/soak.png
Environment: KVSERVE_BIN (default build/server/kvserve), KVS_SHARED_MODELS."""
import argparse
import collections
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
os.environ.setdefault("KVSERVE_BIN", os.path.join(ROOT, "build", "server", "kvserve"))
import kvs_e2e as e2e  # noqa: E402
from load_test import fd_count, rss_kb  # noqa: E402

EXPECTED = {  # scenario -> statuses that are correct for it
    "plain": {200, 429}, "stream": {200, 429}, "chat": {200, 429}, "disconnect": {200, 429},
    "long_prompt": {200, 429}, "too_long": {400},
}


def scenario_request(kind, rng):
    if kind == "plain":
        return "/v1/completions", {"prompt": "Once upon a time", "max_tokens": rng.randint(4, 64),
                                   "temperature": rng.choice([0, 0.8])}
    if kind in ("stream", "disconnect"):
        return "/v1/completions", {"prompt": rng.choice(["Once upon a time", "The cat", "Lily"]),
                                   "max_tokens": rng.randint(16, 200), "stream": True,
                                   "ignore_eos": kind == "disconnect", "n": rng.randint(1, 3)}
    if kind == "chat":
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": "A dog"}],
                                        "max_tokens": rng.randint(4, 64), "stream": rng.random() < .5}
    if kind == "long_prompt":  # ~400 prompt tokens of a 512 context
        return "/v1/completions", {"prompt": [1] + [rng.randint(3, 500) for _ in range(400)],
                                   "max_tokens": 32}
    return "/v1/completions", {"prompt": [1] * 600, "max_tokens": 4}  # too_long


def run_one(port, kind, rng):
    """Returns the HTTP status (0 for a client-side failure)."""
    path, body = scenario_request(kind, rng)
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                  % (path.encode(), len(data), data))
        buf = b""
        while b"\r\n" not in buf:
            chunk = s.recv(4096)
            if not chunk:
                return 0
            buf += chunk
        status = int(buf.split(b" ", 2)[1])
        if kind == "disconnect" and status == 200:
            while buf.count(b"data: ") < rng.randint(1, 5):
                chunk = s.recv(4096)
                if not chunk:
                    break
                buf += chunk
            return status  # closing now cuts the stream
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
        if body.get("stream") and status == 200 and b"data: [DONE]" not in buf:
            return 0
        return status
    except OSError:
        return 0
    finally:
        s.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=int, default=600)
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--csv", default="soak.csv")
    ap.add_argument("--png")
    args = ap.parse_args()
    e2e.require_server()
    srv = e2e.Server("--max-queue", "64")
    pid = srv.proc.pid
    srv.post("/v1/completions", {"prompt": "Once", "max_tokens": 4})
    time.sleep(0.2)
    fd_base = fd_count(pid)
    counts = collections.Counter()
    lock = threading.Lock()
    stop = threading.Event()
    kinds = ["plain"] * 3 + ["stream"] * 3 + ["chat"] * 2 + ["disconnect"] * 2 + \
            ["long_prompt", "too_long"]

    def worker(seed):
        rng = random.Random(seed)
        while not stop.is_set():
            kind = rng.choice(kinds)
            st = run_one(srv.port, kind, rng)
            with lock:
                counts[(kind, st)] += 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True)
               for i in range(args.workers)]
    t0 = time.time()
    for t in threads:
        t.start()
    rows = []
    with open(args.csv, "w") as f:
        f.write("t,rss_kb,fds,kv_blocks_used,running,waiting,requests\n")
        while time.time() - t0 < args.duration:
            m = srv.metrics()
            with lock:
                done = sum(counts.values())
            row = (round(time.time() - t0, 1), rss_kb(pid), fd_count(pid),
                   int(m["kvserve_kv_blocks_used"]), int(m["kvserve_num_requests_running"]),
                   int(m["kvserve_num_requests_waiting"]), done)
            rows.append(row)
            f.write("%s,%d,%d,%d,%d,%d,%d\n" % row)
            f.flush()
            time.sleep(max(0.0, 1.0 - (time.time() - t0 - row[0])))
    stop.set()
    for t in threads:
        t.join(120)
    failures = []
    deadline = time.time() + 15
    while time.time() < deadline:
        m = srv.metrics()
        if fd_count(pid) <= fd_base and m["kvserve_kv_blocks_used"] == 0:
            break
        time.sleep(0.2)
    fd_after, blocks = fd_count(pid), srv.metrics()["kvserve_kv_blocks_used"]
    rc = srv.stop()
    for (kind, st), n in sorted(counts.items()):
        print("%-12s %3d %7d%s" % (kind, st, n, "" if st in EXPECTED[kind] else "  UNEXPECTED"))
        if st not in EXPECTED[kind]:
            failures.append("%d x %s -> %d" % (n, kind, st))
    rss = [r[1] for r in rows]
    after60 = [r[1] for r in rows if r[0] >= 60] or rss
    print("summary: %d requests in %ds; RSS kB start %d, max %d, from 60 s %d..%d; fds baseline "
          "%d, max %d, after %d; kv_blocks_used after %d; exit %d"
          % (sum(counts.values()), args.duration, rss[0], max(rss), min(after60), max(after60),
             fd_base, max(r[2] for r in rows), fd_after, blocks, rc))
    if fd_after > fd_base:
        failures.append("fds %d > baseline %d" % (fd_after, fd_base))
    if blocks:
        failures.append("%d KV blocks still used" % blocks)
    if rc != 0:
        failures.append("kvserve exited with %d" % rc)
    if args.png:
        plot(args.csv, args.png)
    for f in failures:
        print("FAIL:", f)
    print("soak:", "FAILED" if failures else "ok")
    return 1 if failures else 0


def plot(csv, png):
    script = """
set datafile separator ','
set terminal pngcairo size 1000,600
set output '%s'
set title 'kvserve soak: RSS and open fds, sampled every second'
set xlabel 'seconds'
set ylabel 'RSS (MiB)'
set y2label 'open fds / KV blocks used'
set ytics nomirror
set y2tics
set key outside bottom center horizontal
plot '%s' using 1:($2/1024) every ::1 with lines lw 2 title 'RSS (MiB)', \\
     '' using 1:3 every ::1 axes x1y2 with lines title 'open fds', \\
     '' using 1:4 every ::1 axes x1y2 with lines title 'KV blocks used'
""" % (png, csv)
    subprocess.run(["gnuplot"], input=script, text=True, check=False)


if __name__ == "__main__":
    sys.exit(main())
