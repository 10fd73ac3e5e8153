#!/usr/bin/env python3
"""bench/qfidelity.py: how far each path's logprobs are from llama.cpp's on the same weights
dequantized to F32 (llama-quantize --allow-requantize Q F32), the reference the issue names.
A 110m-shape file (kvs-mkmodel, seed SEED, weight std 0.05, llama-spm vocabulary, as
tests/test_peer_quants.py) quantized to each TYPE; llama-server on the F32 file gives 32 greedy
tokens after tests/peer_util.py's PROMPT and the logprob of each; then llama-server on the
quantized file (llama.cpp's own quantized path, Q8_K / Q8_0 activations), kvserve --activations
q8 and --activations f32 on it decode the same prompt greedily. Prints, per path, the max
|logprob - reference logprob| of the chosen token over the positions before its first token
differing from the reference, and that position. Usage: bench/qfidelity.py [TYPE ...]
(default Q8_0 Q4_0 Q4_K_M Q5_K_M Q6_K); BUILD (build), SEED (1: kvs-mkmodel's seed; the
IQ4_XS file of seed 1 decodes to invalid UTF-8, which llama-server refuses with a 500, as
tests/test_peer_quants.py says: use 2 there)."""
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import peer_util  # noqa: E402

BUILD = os.environ.get("BUILD", "build")
ROOT = os.path.join(HERE, "..")
KVSERVE = os.path.join(ROOT, BUILD, "server", "kvserve")
MKMODEL = os.path.join(ROOT, BUILD, "tools", "kvs-mkmodel")
BIN = os.path.join(ROOT, "..", "shared", "peer", "llama.cpp", "bin")
VOCAB = os.path.join(ROOT, "..", "shared", "models", "vocab", "ggml-vocab-llama-spm.gguf")


def wait(url, proc):
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError("server exited with %d" % proc.returncode)
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("server did not start")


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def llama(model, log):
    """(token strings, logprobs) of llama-server's greedy tokens on model."""
    a = peer_util.peer_completion(os.path.join(BIN, "llama-server"), model, log)
    probs = a["completion_probabilities"]
    return [p.get("token", "") for p in probs], [p["logprob"] for p in probs]


def kvserve(model, act, log):
    port = peer_util.free_port()
    proc = subprocess.Popen([KVSERVE, "serve", "-m", model, "--port", str(port), "--threads", "2",
                             "--activations", act, "--log-level", "warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        url = "http://127.0.0.1:%d" % port
        wait(url, proc)
        a = post(url + "/v1/completions",
                 {"prompt": peer_util.PROMPT, "max_tokens": peer_util.N_GEN, "temperature": 0,
                  "logprobs": 1, "ignore_eos": True})
        lp = a["choices"][0]["logprobs"]
        return lp["tokens"], lp["token_logprobs"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def diff(ref, got):
    """max |logprob diff| before the first differing token, and that token's index"""
    worst, n = 0.0, 0
    for (rt, rl), (gt, gl) in zip(zip(*ref), zip(*got)):
        if rt != gt:
            break
        worst = max(worst, abs(rl - gl))
        n += 1
    return worst, n


def main():
    types = sys.argv[1:] or ["Q8_0", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K"]
    q = os.path.join(BIN, "llama-quantize")
    print("| file type | path | max abs logprob diff vs llama.cpp F32 | tokens equal |")
    print("|---|---|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="kvs-qfid-") as tmp:
        base = os.path.join(tmp, "f16.gguf")
        subprocess.run([MKMODEL, "--shape", "110m", "--type", "f16", "--vocab", VOCAB,
                        "--weight-std", "0.05", "--seed", os.environ.get("SEED", "1"), "-o", base], check=True,
                       capture_output=True)
        log = open(os.path.join(tmp, "log"), "w")
        for t in types:
            qf, ff = os.path.join(tmp, t + ".gguf"), os.path.join(tmp, t + "-f32.gguf")
            subprocess.run([q, base, qf, t, "2"], check=True, capture_output=True)
            subprocess.run([q, "--allow-requantize", qf, ff, "F32", "2"], check=True,
                           capture_output=True)
            ref = llama(ff, log)
            for name, got in (("llama-server " + t, llama(qf, log)),
                              ("kvserve q8", kvserve(qf, "q8", log)),
                              ("kvserve f32", kvserve(qf, "f32", log))):
                w, n = diff(ref, got)
                print("| %s | %s | %.2e | %d of %d |" % (t, name, w, n, len(ref[0])))
                sys.stdout.flush()
            os.unlink(qf)
            os.unlink(ff)


if __name__ == "__main__":
    main()
