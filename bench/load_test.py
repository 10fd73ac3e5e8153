#!/usr/bin/env python3
"""Load test: wrk against POST /v1/completions (short outputs, bench/load.lua) on a fresh
kvserve, sampling the server's RSS and open fds every second.

The KV pool's memory is faulted in as blocks are first used, so RSS climbs until every block
has been touched once (256 MiB by default) and is flat from then on; a short run therefore
uses a small pool (--server-args '--kv-cache-mb 16').

Passes (exit 0) when: no response other than 200 or 429 and no socket errors; RSS flat
within --rss-tolerance from --flat-from seconds on; after the run the server's fds are back
to their baseline and 0 KV blocks are used. Exit 77 (meson's "skipped") without wrk or the
model. Writes the samples to --csv (t, rss_kb, fds) when given.

Usage: bench/load_test.py [--duration 60] [--connections 256] [--threads 2] [--csv F]
Environment: KVSERVE_BIN (default build/server/kvserve), KVS_SHARED_MODELS."""
import argparse
import os
import re
import shutil
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
os.environ.setdefault("KVSERVE_BIN", os.path.join(ROOT, "build", "server", "kvserve"))
import kvs_e2e as e2e  # noqa: E402


def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Sampler(threading.Thread):
    """Samples (t, rss_kb, fds) of pid every second until stopped."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.rows, self.stop = pid, [], threading.Event()

    def run(self):
        t0 = time.time()
        while not self.stop.is_set():
            try:
                self.rows.append((round(time.time() - t0, 1), rss_kb(self.pid),
                                  fd_count(self.pid)))
            except OSError:
                return
            self.stop.wait(1.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=int, default=60)
    ap.add_argument("--connections", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--flat-from", type=float, default=10.0,
                    help="seconds after which RSS must stay flat")
    ap.add_argument("--rss-tolerance", type=float, default=0.10)
    ap.add_argument("--no-rss-check", action="store_true",
                    help="sanitizer builds: ASan's quarantine grows RSS by design")
    ap.add_argument("--csv")
    ap.add_argument("--server-args", default="",
                    help="extra kvserve serve flags, e.g. '--kv-cache-mb 16'")
    args = ap.parse_args()

    wrk = shutil.which("wrk")
    if not wrk:
        print("SKIP: wrk not installed")
        return 77
    try:
        e2e.require_server()
    except Exception as e:  # unittest.SkipTest
        print("SKIP:", e)
        return 77

    srv = e2e.Server(*args.server_args.split())
    pid = srv.proc.pid
    failures = []
    try:
        # Warm up (first request maps the model pages), then take the baseline.
        srv.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8})
        time.sleep(0.2)
        fd_base = fd_count(pid)
        sampler = Sampler(pid)
        sampler.start()
        cmd = [wrk, "-t%d" % args.threads, "-c%d" % args.connections, "-d%ds" % args.duration,
               "--timeout", "10s", "-s", os.path.join(ROOT, "bench", "load.lua"),
               "http://127.0.0.1:%d/v1/completions" % srv.port]
        print("$", " ".join(cmd), flush=True)
        out = subprocess.run(cmd, capture_output=True, text=True,
                             timeout=args.duration + 60).stdout
        sampler.stop.set()
        sampler.join()
        print(out)

        statuses = {int(c): int(n) for c, n in re.findall(r"^status (\d+) (\d+)$", out, re.M)}
        m = re.search(r"errors connect (\d+) read (\d+) write (\d+) timeout (\d+)", out)
        errors = sum(int(x) for x in m.groups()) if m else -1
        rps = re.search(r"Requests/sec:\s*([\d.]+)", out)
        bad = {c: n for c, n in statuses.items() if c not in (200, 429)}
        if bad:
            failures.append("unexpected statuses %s" % bad)
        if errors != 0:
            failures.append("socket errors: %s" % (m.group(0) if m else "unparsed"))
        if statuses.get(200, 0) == 0:
            failures.append("no request succeeded")

        rows = sampler.rows
        flat = [r for r in rows if r[0] >= args.flat_from]
        if flat and not args.no_rss_check:
            ref, top = flat[0][1], max(r[1] for r in flat)
            if top > ref * (1 + args.rss_tolerance):
                failures.append("RSS grew from %d to %d kB after %gs" % (ref, top,
                                                                          args.flat_from))
        # Afterwards: every connection closed, every block back.
        # Count the fds before asking /metrics: that request's own connection is open on the
        # server side until the server sees the close, which a slow (sanitized) build may not
        # have done yet when the count is taken right after it.
        deadline = time.time() + 10
        while time.time() < deadline:
            time.sleep(0.1)
            fd_after = fd_count(pid)
            mt = srv.metrics()
            if fd_after <= fd_base and mt["kvserve_kv_blocks_used"] == 0:
                break
        if fd_after > fd_base:
            failures.append("fds %d after the run, baseline %d" % (fd_after, fd_base))
        if mt["kvserve_kv_blocks_used"] != 0:
            failures.append("%d KV blocks still used" % mt["kvserve_kv_blocks_used"])
        print("summary: requests/s %s, statuses %s, socket errors %d, RSS kB first/min/max "
              "%d/%d/%d (from %gs: %s), fds baseline %d peak %d after %d, kv_blocks_used %d"
              % (rps.group(1) if rps else "?", dict(sorted(statuses.items())), errors,
                 rows[0][1] if rows else 0, min(r[1] for r in rows) if rows else 0,
                 max(r[1] for r in rows) if rows else 0, args.flat_from,
                 "%d..%d" % (min(r[1] for r in flat), max(r[1] for r in flat)) if flat else "-",
                 fd_base, max(r[2] for r in rows) if rows else 0, fd_after,
                 mt["kvserve_kv_blocks_used"]))
        if args.csv:
            with open(args.csv, "w") as f:
                f.write("t,rss_kb,fds\n")
                for r in rows:
                    f.write("%s,%d,%d\n" % r)
    finally:
        rc = srv.stop()
        if rc != 0:
            failures.append("kvserve exited with %d" % rc)
    for f in failures:
        print("FAIL:", f)
    print("load test:", "FAILED" if failures else "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
