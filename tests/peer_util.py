"""What the llama.cpp peer tests (test_peer_families.py, test_peer_quants.py, test_peer_templates.py,
test_peer_tokenizer.py) share: the prompt, the tools' locations (skipping with meson's 77 when the
peer is absent), starting and stopping a server and posting JSON to it, llama-server's greedy
tokens from its /completion route and kvserve's from `kvserve generate --prompt-ids --ids`."""
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

PROMPT = [1, 306, 4966, 263, 931, 727, 471, 263]  # 8 ids, BOS first
N_GEN = 32
# llama.cpp's CPU flash attention accumulates the values of an F16 cache in F16; its other path
# (-fa off) keeps F32 sums, as kvserve does. With flash attention on, llama (std 0.05) parts at
# token 24 of 32. PEER_ARGS / KVS_ARGS add arguments to either side, for experiments by hand.
PEER_ARGS = ["-fa", "off"] + os.environ.get("PEER_ARGS", "").split()
KVS_ARGS = os.environ.get("KVS_ARGS", "").split()
HERE = os.path.dirname(os.path.abspath(__file__))


def skip(why):
    print("SKIP: " + why)
    sys.exit(77)


def tools():
    """(kvserve, kvs-mkmodel, the peer's llama.cpp/bin), or exit 77 with the reason."""
    kvserve, mkmodel = os.environ.get("KVSERVE_BIN"), os.environ.get("KVS_MKMODEL")
    peer = os.environ.get("KVS_PEER", os.path.join(HERE, "..", "..", "shared", "peer"))
    bindir = os.path.join(peer, "llama.cpp", "bin")
    if not kvserve or not mkmodel:
        skip("KVSERVE_BIN and KVS_MKMODEL must be set")
    if not os.access(os.path.join(bindir, "llama-server"), os.X_OK):
        skip("no llama-server in %s: nothing to compare against" % bindir)
    return kvserve, mkmodel, bindir


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_health(url, proc, who):
    """Waits (up to a minute) for url's /health to answer 200; RuntimeError when proc exits."""
    for _ in range(300):
        if proc.poll() is not None:
            raise RuntimeError("%s exited with %d" % (who, proc.returncode))
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("%s did not become healthy" % who)


def post_json(url, body):
    """(status, parsed JSON answer) of a POST of body to url."""
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def start_server(args, log, port=None):
    """Starts a server (its output to log) and waits for its /health: (process, base url).
    port None: kvserve --port 0, whose port is read from its log."""
    f = open(log, "w")
    proc = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT)
    if port is None:
        for _ in range(300):
            m = re.search(r"listening on http://[^:]+:(\d+)", open(log).read())
            if m:
                port = int(m.group(1))
                break
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    url = "http://127.0.0.1:%s" % port
    try:
        wait_health(url, proc, os.path.basename(args[0]))
    except RuntimeError as e:
        raise RuntimeError("%s:\n%s" % (e, open(log).read()[-800:])) from e
    return proc, url


def stop_server(proc):
    proc.terminate()
    proc.wait(timeout=30)


def peer_completion(server, model, log, extra=()):
    """llama-server's /completion answer on model: N_GEN greedy tokens after PROMPT (no BOS
    added), with each position's top 2 (n_probs) for diagnosing a difference; extra: more
    llama-server arguments."""
    port = free_port()
    proc = subprocess.Popen([server, "-m", model, "--host", "127.0.0.1", "--port", str(port),
                             "-t", "2", "-c", "256", "-np", "1"] + PEER_ARGS + list(extra),
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        url = "http://127.0.0.1:%d" % port
        wait_health(url, proc, "llama-server")
        body = json.dumps({"prompt": PROMPT, "n_predict": N_GEN, "temperature": 0,
                           "samplers": ["top_k"], "top_k": 1, "ignore_eos": True,
                           "return_tokens": True, "cache_prompt": False, "n_probs": 2,
                           "reasoning_format": "none"}).encode()
        req = urllib.request.Request(url + "/completion", body,
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            raise RuntimeError("HTTP %d: %s" % (e.code, e.read()[:500])) from e
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def peer_tokens(server, model, logpath, extra=()):
    """llama-server's answer on model (see peer_completion, extra its arguments), its output in
    logpath; None, after printing the error and the log's tail, when it fails."""
    with open(logpath, "w") as log:
        try:
            return peer_completion(server, model, log, extra)
        except Exception as e:  # noqa: BLE001 (report; the caller fails)
            log.flush()
            with open(logpath, errors="replace") as f:
                tail = f.read()[-800:]
            print("%s: llama-server: %s\n%s" % (os.path.basename(model), e, tail))
            return None


def top2(answer, i):
    """'id logprob, id logprob' of position i's two most likely tokens in llama-server's answer
    (either field layout: completion_probabilities' top_logprobs, or probs' top_probs)."""
    try:
        pos = answer["completion_probabilities"][i]
        tops = pos.get("top_logprobs") or pos.get("probs") or pos.get("top_probs")
        return ", ".join("%s %.4f" % (t.get("id", t.get("tok_str")),
                                      t.get("logprob", t.get("prob", 0.0))) for t in tops[:2])
    except (KeyError, IndexError, TypeError):
        return "(not in the answer)"


def kvserve_tokens(kvserve, model, extra=()):
    r = subprocess.run([kvserve, "generate", "-m", model, "--prompt-ids",
                        ",".join(map(str, PROMPT)), "-n", str(N_GEN), "--ids", "--ignore-eos",
                        "--threads", "2"] + list(extra) + KVS_ARGS,
                       capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise RuntimeError("kvserve generate failed: " + r.stderr.strip()[-500:])
    return [int(t) for t in r.stdout.split()]


def compare(name, got, answer):
    """Prints whether kvserve's tokens got equal llama-server's (answer); on a difference, the
    first differing position with llama-server's top 2 there. True when they are equal."""
    want = answer["tokens"]
    same = got == want
    print("%-7s %s  llama-server %s" % (name, "same" if same else "DIFFERENT", want))
    if not same:
        print("        kvserve      %s" % got)
        i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b),
                 min(len(got), len(want)))
        print("        first difference at token %d; llama-server's top 2 there (id logprob): "
              "%s" % (i, top2(answer, i)))
    return same
