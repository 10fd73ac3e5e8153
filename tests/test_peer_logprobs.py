"""meson test 'peer_logprobs': the prompt logprobs kvserve's /v1/completions gives with echo (what
lm-evaluation-harness scores a continuation by) against llama.cpp's llama-server on the same file.
llama-server scores no prompt, so each position i is asked of it as a generation: the prompt's
first i tokens, one token to predict, its 20 most likely with their logprobs over the whole
vocabulary (n_probs, before sampling). kvserve's logprob of prompt token i, and of its most
likely token there, must be llama-server's within TOL nats.

Two F32 files: the trained stories260K (../shared/models; the prompt a reference prompt and 40
tokens of its greedy continuation), and a 110m-shape file from kvs-mkmodel (the prompt
peer_util.PROMPT and llama-server's 32 greedy tokens after it). Both servers keep an F32 KV cache
and llama-server runs with flash attention off (peer_util.PEER_ARGS): so both compute in F32
throughout, and what is left between them is summation order (measured here: 2.7e-6 and 2.2e-5
nats at most; a wrong row or token is off by tenths). With F16 (a cache, or weights) llama.cpp
rounds the other operand of its products to F16 too, kvserve keeps it F32: 3e-3 and 1.3e-2 nats
apart, llama.cpp's rounding rather than either's error.
Exits 77 (meson's skip) with the reason when llama-server or the models are absent.
A third file is the same shape as granite (kvs-mkmodel's four scalars: logit_scale 3 divides
the logits, which greedy tokens do not show but logprobs do).
Environment: KVSERVE_BIN, KVS_MKMODEL, KVS_PEER, KVS_SHARED_MODELS, TOL; by hand:
test_peer_logprobs.py [stories260K|110m-f32|granite-f32 ...]."""
import json
import os
import subprocess
import sys
import tempfile
import time

import peer_util

TOL = float(os.environ.get("TOL", "2e-4"))
SHARED = os.environ.get("KVS_SHARED_MODELS",
                        os.path.join(peer_util.HERE, "..", "..", "shared", "models"))
VOCAB = os.path.join(SHARED, "vocab", "ggml-vocab-llama-spm.gguf")


def peer_position(url, ids, i):
    """llama-server's 20 most likely tokens after ids[:i]: {id: logprob}, in its order."""
    st, r = peer_util.post_json(url + "/completion", {
        "prompt": ids[:i], "n_predict": 1, "n_probs": 20, "temperature": 0,
        "samplers": ["top_k"], "top_k": 1, "return_tokens": True, "cache_prompt": True})
    if st != 200:
        raise RuntimeError("llama-server: HTTP %d %s" % (st, json.dumps(r)[:300]))
    tops = r["completion_probabilities"][0]["top_logprobs"]
    return [(t["id"], t["logprob"]) for t in tops]


def compare(name, kvs_url, peer_url, ids):
    """Prints the largest differences; returns the failures (position, what)."""
    st, r = peer_util.post_json(kvs_url + "/v1/completions", {
        "prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 5, "temperature": 0})
    if st != 200:
        return [(0, "kvserve: HTTP %d %s" % (st, json.dumps(r)[:300]))]
    lp = r["choices"][0]["logprobs"]
    fails, worst_tok, worst_top, checked = [], 0.0, 0.0, 0
    for i in range(1, len(ids)):
        peer = peer_position(peer_url, ids, i)
        ours_top = max(lp["top_logprobs"][i].values())
        d = abs(ours_top - peer[0][1])
        worst_top = max(worst_top, d)
        if d > TOL:
            fails.append((i, "top-1 logprob %.6f, llama-server %.6f" % (ours_top, peer[0][1])))
        theirs = dict(peer).get(ids[i])
        if theirs is None:
            continue  # not among its 20 likeliest: nothing to compare
        checked += 1
        d = abs(lp["token_logprobs"][i] - theirs)
        worst_tok = max(worst_tok, d)
        if d > TOL:
            fails.append((i, "token %d logprob %.6f, llama-server %.6f" %
                          (ids[i], lp["token_logprobs"][i], theirs)))
    print("%-11s %d positions: prompt token's logprob compared at %d, max |diff| %.2e; top-1's "
          "max |diff| %.2e (tolerance %.0e)" % (name, len(ids) - 1, checked, worst_tok,
                                                 worst_top, TOL))
    if checked < (len(ids) - 1) // 2:
        fails.append((0, "only %d of %d positions had the prompt token in llama-server's top 20"
                      % (checked, len(ids) - 1)))
    return fails


def run(name, model, ids_fn, kvserve, bindir, tmp):
    port = peer_util.free_port()
    peer, peer_url = peer_util.start_server(
        [os.path.join(bindir, "llama-server"), "-m", model, "--host", "127.0.0.1", "--port",
         str(port), "-t", "2", "-c", "256", "-np", "1", "-ctk", "f32", "-ctv", "f32"] +
        peer_util.PEER_ARGS,
        os.path.join(tmp, name + "-peer.log"), port=port)
    try:
        ids = ids_fn(peer_url)
        kvs, kvs_url = peer_util.start_server(
            [kvserve, "serve", "-m", model, "--host", "127.0.0.1", "--port", "0", "--ctx-size",
             "256", "--threads", "2", "--kv-cache-type", "f32"] + peer_util.KVS_ARGS,
            os.path.join(tmp, name + "-kvs.log"))
        try:
            return compare(name, kvs_url, peer_url, ids)
        finally:
            peer_util.stop_server(kvs)
    finally:
        peer_util.stop_server(peer)


def main():
    kvserve, mkmodel, bindir = peer_util.tools()
    stories = os.path.join(SHARED, "stories260K.gguf")
    ref = os.path.join(SHARED, "reference", "stories260K-greedy.json")
    if not os.path.isfile(stories) or not os.path.isfile(ref) or not os.path.isfile(VOCAB):
        peer_util.skip("no stories260K, its reference or the llama-spm vocabulary under %s "
                       "(see MODELS.md)" % SHARED)
    case = json.load(open(ref))["cases"][1]
    stories_ids = case["prompt_ids"] + case["completion_ids"][:40]

    def greedy_after_prompt(url):
        st, r = peer_util.post_json(url + "/completion", {
            "prompt": peer_util.PROMPT, "n_predict": peer_util.N_GEN, "temperature": 0,
            "samplers": ["top_k"], "top_k": 1, "ignore_eos": True, "return_tokens": True})
        if st != 200:
            raise RuntimeError("llama-server: HTTP %d" % st)
        return peer_util.PROMPT + r["tokens"]

    t0 = time.monotonic()
    fails = []
    with tempfile.TemporaryDirectory(prefix="kvs-peer-logprobs-") as tmp:
        f32 = os.path.join(tmp, "110m-f32.gguf")
        subprocess.run([mkmodel, "--shape", "110m", "--type", "f32", "--vocab", VOCAB,
                        "--weight-std", "0.05", "--seed", "1", "-o", f32], check=True,
                       capture_output=True)
        # granite: its logit_scale divides the logits, so the logprobs show it where greedy
        # tokens cannot; and its embedding, attention and residual scales
        granite = os.path.join(tmp, "granite-f32.gguf")
        subprocess.run([mkmodel, "--shape", "110m", "--type", "f32", "--vocab", VOCAB,
                        "--arch", "granite", "--weight-std", "0.05", "--seed", "1", "-o",
                        granite], check=True, capture_output=True)
        only = sys.argv[1:]
        for name, model, ids_fn in [("stories260K", stories, lambda url: stories_ids),
                                    ("110m-f32", f32, greedy_after_prompt),
                                    ("granite-f32", granite, greedy_after_prompt)]:
            if only and name not in only:
                continue
            try:
                got = run(name, model, ids_fn, kvserve, bindir, tmp)
            except RuntimeError as e:
                got = [(0, str(e))]
            for i, what in got:
                print("%-11s position %d: %s" % (name, i, what))
            fails += [name] if got else []
    print("%.0f s" % (time.monotonic() - t0))
    if fails:
        print("FAILED: " + ", ".join(fails))
        sys.exit(1)
    print("kvserve's prompt logprobs are llama-server's within %.0e nats" % TOL)


if __name__ == "__main__":
    main()
