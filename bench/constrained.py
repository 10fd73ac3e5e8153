#!/usr/bin/env python3
"""What constrained decoding costs a loaded server: N concurrent streams (default 16) with
response_format json_schema against the same N unconstrained, closed loop, on one kvserve.

  bench/constrained.py [--model MODEL.gguf | SHAPE-TYPE] [--clients 16] [--seconds 20]
                       [--rounds 2] [--max-tokens 128] [--doc docs/BENCHMARKS.md]

SHAPE-TYPE (e.g. 110m-f16, the default) is generated with build/tools/kvs-mkmodel on the
llama-spm vocabulary (32 000 tokens: the mask walks a realistic trie). Rounds alternate
unconstrained / constrained so a neighbour's load on a shared machine hits both alike. The
figure is tokens generated per second within each round's window (the server's
kvserve_generation_tokens_total; clients hang up when it closes; prefill time included); a constrained request may end early when its JSON value
closes ("stop"), starting a new one with its prefill, so finished requests are counted too.
With --doc, rewrites the "constrained.py" section of that file (bench/doc_section.py)."""
import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "mood": {"enum": ["happy", "sad", "angry"]},
        "lines": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["title", "mood", "lines"],
    "additionalProperties": False,
}


def start_server(model, args, port):
    log = tempfile.NamedTemporaryFile(prefix="kvserve-constrained-", suffix=".log", delete=False)
    cmd = [os.path.join(ROOT, "build/server/kvserve"), "serve", "-m", model, "--host",
           "127.0.0.1", "--port", str(port), "--max-num-seqs", "64"] + args
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit("kvserve exited:\n" + open(log.name).read())
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return proc, log.name
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    sys.exit("kvserve did not become ready")


def one_request(port, body, stop_at, counted):
    """Streams one chat completion, adding to counted[0] each token delta that arrives before
    stop_at (then it hangs up: the server cancels the rest). Returns the finish reason."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, r.read()[:300]))
    finish = None
    for raw in r:
        if time.time() >= stop_at:
            break
        line = raw.decode().strip()
        if not line.startswith("data: {"):
            continue
        for ch in json.loads(line[6:]).get("choices", []):
            if ch["delta"].get("content"):
                counted[0] += 1  # one delta per token (the scheduler sends one per token)
            finish = ch.get("finish_reason") or finish
    c.close()
    return finish


def generated_total(port):
    """kvserve_generation_tokens_total from /metrics: every token the engine sampled."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    for line in text.splitlines():
        if line.startswith("kvserve_generation_tokens_total "):
            return float(line.split()[1])
    raise RuntimeError("no kvserve_generation_tokens_total in /metrics")


def run_round(port, clients, seconds, max_tokens, constrained):
    """Tokens the engine generated per second within the round's window (from /metrics): no
    request is waited for past it, so the figure does not depend on where the last requests
    were when time ran out."""
    t0 = time.time()
    stop_at = t0 + seconds
    counts = [[0] for _ in range(clients)]
    finishes = []
    lock = threading.Lock()

    def client(i):
        n = 0
        while time.time() < stop_at:
            body = {"messages": [{"role": "user", "content": "Write a short poem, client %d" % i}],
                    "max_tokens": max_tokens, "temperature": 0.7, "seed": i * 1000 + n,
                    "stream": True}
            if constrained:
                body["response_format"] = {"type": "json_schema",
                                           "json_schema": {"name": "poem", "schema": SCHEMA}}
            else:
                body["ignore_eos"] = True
            fin = one_request(port, body, stop_at, counts[i])
            n += 1
            with lock:
                finishes.append(fin)

    g0 = generated_total(port)
    th = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in th:
        t.start()
    time.sleep(max(0.0, stop_at - time.time()))
    g1 = generated_total(port)  # the engine's own count over the window
    for t in th:
        t.join()
    time.sleep(0.5)  # the hung-up requests are cancelled before the next round
    done = [f for f in finishes if f]
    return {"tok_s": (g1 - g0) / seconds, "requests": len(done),
            "tok_per_req": sum(c[0] for c in counts) / max(1, len(finishes)),
            "stops": done.count("stop"), "wall": seconds}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="110m-f16")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--port", type=int, default=18097)
    ap.add_argument("--doc")
    a = ap.parse_args()
    gen = None
    model = a.model
    if not model.endswith(".gguf"):
        gen = tempfile.mkdtemp()
        shape, typ = model.rsplit("-", 1)
        path = os.path.join(gen, model + ".gguf")
        subprocess.run([os.path.join(ROOT, "build/tools/kvs-mkmodel"), "--shape", shape, "--type",
                        typ, "--vocab",
                        os.path.join(ROOT, "../shared/models/vocab/ggml-vocab-llama-spm.gguf"),
                        "-o", path], check=True, stdout=subprocess.DEVNULL)
        model = path
    server_args = ["--log-level", "warn"] + (["--threads", str(a.threads)] if a.threads else [])
    port = a.port
    proc, log = start_server(model, server_args, port)
    load_before = open("/proc/loadavg").read().split()[:3]
    rows = []
    try:
        for r in range(a.rounds):
            for constrained in (False, True):
                res = run_round(port, a.clients, a.seconds, a.max_tokens, constrained)
                res["constrained"] = constrained
                res["round"] = r + 1
                rows.append(res)
                print("round %d %-13s %7.1f tok/s  %4d requests  %6.1f tok/request  %d stop" %
                      (r + 1, "constrained" if constrained else "unconstrained", res["tok_s"],
                       res["requests"], res["tok_per_req"], res["stops"]), flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
        os.unlink(log)
        if gen:
            for f in os.listdir(gen):
                os.unlink(os.path.join(gen, f))
            os.rmdir(gen)
    load_after = open("/proc/loadavg").read().split()[:3]
    free = sum(x["tok_s"] for x in rows if not x["constrained"]) / a.rounds
    cons = sum(x["tok_s"] for x in rows if x["constrained"]) / a.rounds
    loss = 100.0 * (1 - cons / free)
    print("mean: unconstrained %.1f tok/s, constrained %.1f tok/s: %.1f%% loss" % (free, cons, loss))
    if not a.doc:
        return
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "?")
    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip() or "unknown"
    cmd = "bench/constrained.py --model %s --clients %d --seconds %g --rounds %d --max-tokens %d" % (
        a.model, a.clients, a.seconds, a.rounds, a.max_tokens)
    lines = ["<!-- constrained.py begin -->",
             "## Constrained decoding under load (bench/constrained.py)", "",
             "%d concurrent streaming chat requests, closed loop, temperature 0.7, max_tokens %d: "
             "unconstrained (`ignore_eos`) against `response_format` json_schema (an object with "
             "a string, an enum and an array of strings), rounds alternating on one server. "
             "Tokens generated per second within each round's window (the server's "
             "`kvserve_generation_tokens_total`; clients hang up when it closes), prefill "
             "included; a constrained request ends early when its value closes "
             "(\"stop\") and the next one pays its prefill." % (a.clients, a.max_tokens), "",
             "```", cmd, "```", "",
             "Model `%s`, commit %s, %s; load average %s before, %s after (2 cores shared with "
             "other work)." % (a.model, rev, cpu, " ".join(load_before), " ".join(load_after)), "",
             "| round | kind | tokens/s | requests finished | content deltas/request | ended with stop |",
             "|---|---|---|---|---|---|"]
    for x in rows:
        lines.append("| %d | %s | %.1f | %d | %.1f | %d |" % (
            x["round"], "json_schema" if x["constrained"] else "unconstrained", x["tok_s"],
            x["requests"], x["tok_per_req"], x["stops"]))
    per_round = ", ".join("%.1f%%" % (100.0 * (1 - rows[2 * r + 1]["tok_s"] / rows[2 * r]["tok_s"]))
                          for r in range(a.rounds))
    lines += ["", "Mean: unconstrained %.1f tokens/s, constrained %.1f tokens/s: **%.1f%% "
              "throughput loss** (target ≤ 15%%); round by round (a neighbour's load moves both "
              "alike): %s." % (free, cons, loss, per_round), "<!-- constrained.py end -->"]
    subprocess.run([os.path.join(ROOT, "bench/doc_section.py"), a.doc, "constrained.py"],
                   input="\n".join(lines) + "\n", text=True, check=True)


if __name__ == "__main__":
    main()
