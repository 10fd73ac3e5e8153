"""Model support end to end: kvserve serves GGUFs that kvs-mkmodel writes in each family's
layout (llama, qwen2, qwen3, gemma2, gemma3 with sliding windows, phi3, qwen3moe, gpt-oss,
smollm3), picks the chat template family from the file's tokenizer.chat_template, and
refuses at start a model it cannot run, naming what is unsupported. Needs KVSERVE_BIN and
KVS_MKMODEL (not the shared models)."""
import json
import os
import shutil
import struct
import subprocess
import tempfile
import unittest

import kvs_e2e as e2e

# The templates as they ship in the official GGUF conversions (Qwen2-0.5B-Instruct,
# Meta-Llama-3-8B-Instruct).
QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}")

# Characteristic parts of the official Gemma and Phi-3 templates (what detection keys on).
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + message['role'] + '\n' "
    "+ message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")
PHI3_TEMPLATE = (
    "{% for message in messages %}{{'<|' + message['role'] + '|>' + '\n' + message['content'] "
    "+ '<|end|>\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}"
    "{% endif %}")

TMP = None


def setUpModule():
    global TMP
    if not e2e.BIN or not os.access(e2e.BIN, os.X_OK):
        raise unittest.SkipTest("KVSERVE_BIN not set or not executable")
    if not e2e.MKMODEL or not os.access(e2e.MKMODEL, os.X_OK):
        raise unittest.SkipTest("KVS_MKMODEL not set or not executable")
    TMP = tempfile.mkdtemp(prefix="kvs-e2e-models-")


def tearDownModule():
    if TMP:
        shutil.rmtree(TMP, ignore_errors=True)


def mkmodel(name, *args):
    path = os.path.join(TMP, name)
    subprocess.run([e2e.MKMODEL, "--shape", "tiny", "--ctx", "512", "-o", path] + list(args),
                   check=True, capture_output=True)
    return path


def kv_string_offset(data, key):
    """Offset of the value bytes of GGUF string metadata `key` (length-prefixed key, type 8)."""
    k = key.encode()
    needle = struct.pack("<Q", len(k)) + k + struct.pack("<I", 8)
    i = data.index(needle) + len(needle)
    n = struct.unpack_from("<Q", data, i)[0]
    return i + 8, n


def tensor_type_offset(data, name):
    """Offset of the ggml type field in the tensor info of `name`."""
    k = name.encode()
    i = data.index(struct.pack("<Q", len(k)) + k) + 8 + len(k)
    n_dims = struct.unpack_from("<I", data, i)[0]
    return i + 4 + 8 * n_dims


def patch(path, fn):
    """Rewrites the file at path with fn applied to its bytes (a bytearray, edited in place)."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    fn(data)
    with open(path, "wb") as f:
        f.write(data)


def serve_refused(path):
    p = subprocess.run([e2e.BIN, "serve", "-m", path, "--host", "127.0.0.1", "--port", "0"],
                       capture_output=True, text=True, timeout=30)
    e2e.check_sanitizer_report(p.stderr)
    return p.returncode, p.stderr


class ServeFamilies(unittest.TestCase):
    def serve(self, path, family, arch, template):
        srv = e2e.Server(model=path, ctx=256)
        try:
            log = srv.stderr()
            self.assertIn(": %s, 2 layers" % arch, log)
            self.assertIn("chat template %s" % family, log)
            body = {"prompt": "once upon a time", "max_tokens": 6, "temperature": 0}
            st, r = srv.post("/v1/completions", body)
            self.assertEqual(st, 200, r)
            self.assertGreater(r["usage"]["completion_tokens"], 0)
            self.assertIsInstance(r["choices"][0]["text"], str)
            # Greedy is deterministic: the cached second run gives the same text.
            st2, r2 = srv.post("/v1/completions", body)
            self.assertEqual(st2, 200)
            self.assertEqual(r2["choices"][0]["text"], r["choices"][0]["text"])
            st, c = srv.post("/v1/chat/completions", {
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                "temperature": 0})
            self.assertEqual(st, 200, c)
            self.assertEqual(c["choices"][0]["message"]["role"], "assistant")
            # the file's template, as the server uses it, for clients that render it themselves
            st, _, data = srv.request("GET", "/tokenizer_info")
            self.assertEqual(st, 200)
            self.assertEqual(json.loads(data)["chat_template"], template)
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_qwen2_chatml(self):
        path = mkmodel("qwen2.gguf", "--arch", "qwen2", "--type", "q8_0", "--tied",
                       "--rope-base", "1000000", "--chat-template", QWEN2_TEMPLATE)
        self.serve(path, "chatml", "qwen2", QWEN2_TEMPLATE)

    def test_qwen3(self):
        path = mkmodel("qwen3.gguf", "--arch", "qwen3", "--head-dim", "32", "--type", "f16",
                       "--chat-template", QWEN2_TEMPLATE)
        self.serve(path, "chatml", "qwen3", QWEN2_TEMPLATE)

    def test_qwen3moe(self):
        path = mkmodel("qwen3moe.gguf", "--arch", "qwen3moe", "--head-dim", "32", "--type",
                       "q8_0", "--chat-template", QWEN2_TEMPLATE)
        self.serve(path, "chatml", "qwen3moe", QWEN2_TEMPLATE)

    def test_gemma3_windowed(self):
        path = mkmodel("gemma3.gguf", "--arch", "gemma3", "--head-dim", "32",
                       "--sliding-window", "4", "--chat-template", GEMMA_TEMPLATE)
        self.serve(path, "gemma", "gemma3", GEMMA_TEMPLATE)

    def test_gemma2(self):
        path = mkmodel("gemma2.gguf", "--arch", "gemma2", "--sliding-window", "4",
                       "--chat-template", GEMMA_TEMPLATE)
        self.serve(path, "gemma", "gemma2", GEMMA_TEMPLATE)

    def test_phi3_fused(self):
        path = mkmodel("phi3.gguf", "--arch", "phi3", "--type", "q8_0",
                       "--chat-template", PHI3_TEMPLATE)
        self.serve(path, "phi3", "phi3", PHI3_TEMPLATE)

    def test_llama3_template_and_rope_freqs(self):
        path = mkmodel("llama3.gguf", "--type", "f16", "--rope-base", "500000", "--rope-freqs",
                       "--chat-template", LLAMA3_TEMPLATE)
        self.serve(path, "llama3", "llama", LLAMA3_TEMPLATE)
        # another format forced: the file's Jinja text is not what is served, so none is given
        srv = e2e.Server("--chat-template", "chatml", model=path, ctx=256)
        try:
            st, _, data = srv.request("GET", "/tokenizer_info")
            self.assertEqual(st, 200)
            self.assertIsNone(json.loads(data)["chat_template"])
        finally:
            self.assertEqual(srv.stop(), 0)


class MixtureOfExperts(unittest.TestCase):
    def batched_equals_alone(self, path, log_line):
        """Eight prompts in one request run as eight sequences admitted together, so every step
        routes rows of all of them and each expert runs over rows of several at once (the
        integer path: Q8_0, --activations q8); each gives exactly what it gives alone: text and
        every logprob."""
        srv = e2e.Server("--no-prefix-cache", model=path, ctx=256)
        try:
            self.assertIn(log_line, srv.stderr())
            prompts = ["the %s tale number %d" % ("long " * i, i) for i in range(8)]

            def complete(prompt):
                st, r = srv.post("/v1/completions", {
                    "prompt": prompt, "max_tokens": 16, "temperature": 0, "logprobs": 1,
                    "ignore_eos": True})
                self.assertEqual(st, 200, r)
                return [(c["text"], c["logprobs"]["token_logprobs"]) for c in r["choices"]]

            alone = [complete(p)[0] for p in prompts]
            self.assertEqual(complete(prompts), alone)
            self.assertGreater(len({text for text, _ in alone}), 1)
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_batched_equals_alone(self):
        path = mkmodel("moe-batch.gguf", "--arch", "qwen3moe", "--head-dim", "32", "--type",
                       "q8_0", "--experts", "8", "--experts-used", "3", "--weight-std", "0.15")
        self.batched_equals_alone(path, "experts: 8 per layer of ffn 128, Q8_0, 3 used per token")

    def test_ernie4_5_moe_batched_equals_alone(self):
        """ernie4_5-moe's dense layers among the expert ones (a lead of 1, then every second
        layer), its selection bias (exp_probs_b) and its shared expert keep a row's bits
        whatever shares its steps."""
        path = mkmodel("ernie4_5-moe-batch.gguf", "--shape", "swa7", "--arch", "ernie4_5-moe",
                       "--type", "q8_0", "--experts", "8", "--experts-used", "3",
                       "--expert-ffn", "64", "--moe-step", "2", "--weight-std", "0.15",
                       "--shared-expert-ffn", "64")
        self.batched_equals_alone(path, "experts: 8 per layer of ffn 64, Q8_0, 3 used per token")

    def test_gpt_oss_batched_equals_alone(self):
        """gpt-oss's parts (biases, sinks, the windowed layers' own arena, top-k softmax
        routing) keep a row's bits whatever shares its steps; windows of 4 positions."""
        path = mkmodel("gpt-oss-batch.gguf", "--arch", "gpt-oss", "--head-dim", "32", "--type",
                       "q8_0", "--experts", "8", "--experts-used", "3", "--expert-ffn", "64",
                       "--sliding-window", "4", "--weight-std", "0.15")
        self.batched_equals_alone(path, "experts: 8 per layer of ffn 64, Q8_0, 3 used per token")

    def test_granitemoe_batched_equals_alone(self):
        """granitemoe's scalars (embedding, attention, residual and logit scales), Mixtral's
        routing over experts of feed_forward_length and granitemoeshared's shared expert keep a
        row's bits whatever shares its steps."""
        path = mkmodel("granitemoe-batch.gguf", "--arch", "granitemoe", "--type", "q8_0",
                       "--experts", "8", "--experts-used", "3", "--weight-std", "0.15",
                       "--shared-expert-ffn", "64")
        self.batched_equals_alone(path, "experts: 8 per layer of ffn 128, Q8_0, 3 used per token")


class NoPE(unittest.TestCase):
    def test_smollm3_batched_equals_alone(self):
        """smollm3's unrotated layers (3 of seven) keep a row's bits whatever shares its steps,
        as the rotated ones do (Q8_0, the integer path)."""
        path = mkmodel("smollm3-batch.gguf", "--shape", "swa7", "--arch", "smollm3", "--type",
                       "q8_0", "--tied", "--weight-std", "0.15")
        MixtureOfExperts.batched_equals_alone(self, path, ": smollm3, 7 layers")


class ShortConvolutions(unittest.TestCase):
    def test_lfm2_batched_equals_alone(self):
        """lfm2's convolution layers read the B*x rows of a row's last 3 positions back from
        the windowed group's blocks: eight sequences in one step each read their own (Q8_0, the
        integer path), with every bit of what each gives alone."""
        path = mkmodel("lfm2-batch.gguf", "--shape", "swa7", "--arch", "lfm2", "--type", "q8_0",
                       "--weight-std", "0.15")
        MixtureOfExperts.batched_equals_alone(self, path, ": lfm2, 7 layers")


class EmbeddingModel(unittest.TestCase):
    def test_pooling_and_eos_from_the_file(self):
        """A qwen3 file written as an embedding model (pooling last, add_eos_token): its inputs
        end with EOS, in /tokenize's add_special_tokens as in /v1/embeddings (as llama.cpp), and
        /tokenizer_info says so; the file's pooling is the one used (mean gives another vector)."""
        path = mkmodel("qwen3-embed.gguf", "--arch", "qwen3", "--head-dim", "32", "--pooling", "3",
                       "--add-eos")
        vecs = {}
        for pooling in ("auto", "last", "mean"):
            srv = e2e.Server("--pooling", pooling, model=path, ctx=256)
            try:
                st, tok = srv.post("/tokenize", {"prompt": "once upon"})
                self.assertEqual(st, 200, tok)
                self.assertEqual(tok["tokens"][0], 1)
                self.assertEqual(tok["tokens"][-1], 2)  # the byte vocabulary's BOS and EOS
                st, plain = srv.post("/tokenize", {"prompt": "once upon",
                                                   "add_special_tokens": False})
                self.assertEqual(plain["tokens"], tok["tokens"][1:-1])
                st, _, data = srv.request("GET", "/tokenizer_info")
                self.assertTrue(json.loads(data)["add_eos_token"])
                st, r = srv.post("/v1/embeddings", {"input": "once upon"})
                self.assertEqual(st, 200, r)
                self.assertEqual(r["usage"]["prompt_tokens"], len(tok["tokens"]))
                vecs[pooling] = r["data"][0]["embedding"]
            finally:
                self.assertEqual(srv.stop(), 0)
        self.assertEqual(vecs["auto"], vecs["last"])
        self.assertNotEqual(vecs["auto"], vecs["mean"])


class Refusals(unittest.TestCase):
    def test_unsupported_architecture(self):
        path = mkmodel("mamba.gguf")

        def to_mamba(data):
            off, n = kv_string_offset(data, "general.architecture")
            self.assertEqual(bytes(data[off:off + n]), b"llama")
            data[off:off + n] = b"mamba"
        patch(path, to_mamba)
        rc, err = serve_refused(path)
        self.assertNotEqual(rc, 0)
        self.assertIn("architecture 'mamba' is not supported (supported: llama, qwen2, qwen3, "
                      "qwen3moe, gemma2, gemma3, phi3, gpt-oss, smollm3, granite, granitemoe, "
                      "ernie4_5, ernie4_5-moe, lfm2, lfm2moe, olmo2, mistral3, gemma3n)", err)

    def test_unsupported_tensor_type(self):
        path = mkmodel("q4.gguf")

        def to_q8_1(data):
            off = tensor_type_offset(data, "blk.1.ffn_up.weight")
            self.assertEqual(struct.unpack_from("<I", data, off)[0], 0)  # F32
            struct.pack_into("<I", data, off, 9)  # Q8_1: smaller, so it still fits its slot
        patch(path, to_q8_1)
        rc, err = serve_refused(path)
        self.assertNotEqual(rc, 0)
        self.assertIn("tensor blk.1.ffn_up.weight has type Q8_1; supported: F32, F16, BF16, Q8_0, "
                      "Q4_0", err)


if __name__ == "__main__":
    unittest.main()
