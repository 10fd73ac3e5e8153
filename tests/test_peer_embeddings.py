"""meson test 'peer_embeddings': POST /v1/embeddings against llama.cpp's llama-server
--embeddings on the same file. A 110m-shape qwen3 file from kvs-mkmodel written as an embedding
model is (<arch>.pooling_type 3, last; tokenizer.ggml.add_eos_token, as Qwen3-Embedding's GGUF
files say), F32 weights, and both servers keep an F32 cache (llama-server with flash attention
off), so both compute in F32 and what is left between them is summation order: each vector,
L2-normalized by both, must be within TOL of llama-server's in every dimension (measured here
7.8e-7). Pooled by the file's type (last), then with --pooling mean and cls on both; the inputs'
token counts (BOS and the EOS both add) must agree too.
Exits 77 (meson's skip) with the reason when llama-server or the vocabulary is absent.
Environment: KVSERVE_BIN, KVS_MKMODEL, KVS_PEER, KVS_SHARED_MODELS, TOL."""
import os
import subprocess
import sys
import tempfile
import time

import peer_util

TOL = float(os.environ.get("TOL", "1e-5"))
SHARED = os.environ.get("KVS_SHARED_MODELS",
                        os.path.join(peer_util.HERE, "..", "..", "shared", "models"))
VOCAB = os.path.join(SHARED, "vocab", "ggml-vocab-llama-spm.gguf")
INPUTS = ["Once upon a time there was a dog.", "Hello world",
          "The quick brown fox jumps over the lazy dog", "a", "Ünïcödé and emoji 🦙, tabs\tand\nlines"]


def embeddings(url, inputs):
    st, r = peer_util.post_json(url + "/v1/embeddings", {"input": inputs})
    if st != 200:
        raise RuntimeError("HTTP %d: %s" % (st, str(r)[:300]))
    return [d["embedding"] for d in sorted(r["data"], key=lambda d: d["index"])], r["usage"]


def compare(name, model, pooling, kvserve, bindir, tmp):
    extra_peer = ["--pooling", pooling] if pooling else []
    extra_kvs = ["--pooling", pooling] if pooling else []
    port = peer_util.free_port()
    peer, peer_url = peer_util.start_server(
        [os.path.join(bindir, "llama-server"), "-m", model, "--host", "127.0.0.1", "--port",
         str(port), "-t", "2", "-c", "512", "-np", "1", "-ctk", "f32", "-ctv", "f32",
         "--embeddings"] + extra_peer + peer_util.PEER_ARGS,
        os.path.join(tmp, name + "-peer.log"), port=port)
    try:
        want, want_usage = embeddings(peer_url, INPUTS)
    finally:
        peer_util.stop_server(peer)
    kvs, kvs_url = peer_util.start_server(
        [kvserve, "serve", "-m", model, "--host", "127.0.0.1", "--port", "0", "--ctx-size",
         "512", "--threads", "2", "--kv-cache-type", "f32"] + extra_kvs + peer_util.KVS_ARGS,
        os.path.join(tmp, name + "-kvs.log"))
    try:
        got, got_usage = embeddings(kvs_url, INPUTS)
    finally:
        peer_util.stop_server(kvs)
    fails = []
    if got_usage["prompt_tokens"] != want_usage["prompt_tokens"]:
        fails.append("prompt_tokens %d, llama-server %d" % (got_usage["prompt_tokens"],
                                                             want_usage["prompt_tokens"]))
    worst = 0.0
    for k, (g, w) in enumerate(zip(got, want)):
        if len(g) != len(w):
            fails.append("input %d: %d dimensions, llama-server %d" % (k, len(g), len(w)))
            continue
        d = max(abs(a - b) for a, b in zip(g, w))
        worst = max(worst, d)
        if d > TOL:
            fails.append("input %d: max |diff| %.3g" % (k, d))
    print("%-6s %d inputs of %d dimensions: max |diff| %.2e (tolerance %.0e)"
          % (name, len(got), len(got[0]) if got else 0, worst, TOL))
    return fails


def main():
    kvserve, mkmodel, bindir = peer_util.tools()
    if not os.path.isfile(VOCAB):
        peer_util.skip("no vocabulary %s (see MODELS.md)" % VOCAB)
    t0 = time.monotonic()
    failed = []
    with tempfile.TemporaryDirectory(prefix="kvs-peer-embeddings-") as tmp:
        model = os.path.join(tmp, "qwen3-embed-f32.gguf")
        subprocess.run([mkmodel, "--shape", "110m", "--arch", "qwen3", "--head-dim", "64",
                        "--type", "f32", "--vocab", VOCAB, "--weight-std", "0.05", "--pooling",
                        "3", "--add-eos", "-o", model], check=True, capture_output=True)
        for name, pooling in [("file", None), ("mean", "mean"), ("cls", "cls")]:
            try:
                fails = compare(name, model, pooling, kvserve, bindir, tmp)
            except RuntimeError as e:
                fails = [str(e)]
            for f in fails:
                print("%-6s %s" % (name, f))
            if fails:
                failed.append(name)
    print("%.0f s" % (time.monotonic() - t0))
    if failed:
        print("FAILED: " + ", ".join(failed))
        sys.exit(1)
    print("kvserve's embeddings are llama-server's within %.0e" % TOL)


if __name__ == "__main__":
    main()
