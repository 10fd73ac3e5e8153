#!/usr/bin/env python3
"""Writes small seed inputs for the fuzz targets into tests/fuzz/corpus/ (run once; the seeds
are committed). GGUF seeds are built here byte by byte, so they cover every metadata type and
a tensor without needing any model file."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "..", "tests", "fuzz", "corpus")


def s(text):
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, payload):
    return s(key) + struct.pack("<I", vtype) + payload


def gguf(kvs, tensors, version=3, align=32):
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kvs)
    infos, data, off = b"", b"", 0
    for name, dims, ttype, blob in tensors:
        infos += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", ttype, off)
        pad = (-len(blob)) % align
        data += blob + b"\0" * pad
        off += len(blob) + pad
    out = head + infos
    out += b"\0" * ((-len(out)) % align)
    return out + data


def main():
    os.makedirs(os.path.join(CORPUS, "gguf"), exist_ok=True)
    os.makedirs(os.path.join(CORPUS, "tokenizer"), exist_ok=True)
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % i for i in range(4)] + ["\u2581a", "b", "\u2581ab"]
    vocab = [
        kv("tokenizer.ggml.model", 8, s("llama")),
        kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, len(tokens)) + b"".join(s(t) for t in tokens)),
        kv("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, len(tokens)) + b"".join(struct.pack("<f", -i) for i in range(len(tokens)))),
        kv("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, len(tokens)) + b"".join(struct.pack("<i", 3 if i < 3 else 6 if i < 7 else 1) for i in range(len(tokens)))),
        kv("tokenizer.ggml.bos_token_id", 4, struct.pack("<I", 1)),
        kv("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", 2)),
    ]
    scalars = [
        kv("general.architecture", 8, s("llama")),
        kv("a.u8", 0, b"\x07"), kv("a.i8", 1, b"\xf9"), kv("a.u16", 2, b"\x01\x02"),
        kv("a.i16", 3, b"\xff\xff"), kv("a.u32", 4, struct.pack("<I", 7)),
        kv("a.i32", 5, struct.pack("<i", -7)), kv("a.f32", 6, struct.pack("<f", 1.5)),
        kv("a.bool", 7, b"\x01"), kv("a.u64", 10, struct.pack("<Q", 1 << 40)),
        kv("a.i64", 11, struct.pack("<q", -1)), kv("a.f64", 12, struct.pack("<d", 2.5)),
        kv("general.alignment", 4, struct.pack("<I", 32)),
    ]
    f32 = struct.pack("<8f", *[0.5 * i for i in range(8)])
    f16 = struct.pack("<8H", *[0x3C00] * 8)
    q8 = struct.pack("<H", 0x3C00) + bytes(range(32))
    seeds = {
        "vocab_spm.gguf": gguf(vocab, []),
        "all_types.gguf": gguf(scalars, [("t.f32", [8], 0, f32), ("t.f16", [4, 2], 1, f16),
                                         ("t.q8", [32], 8, q8)]),
        "v2.gguf": gguf(scalars[:3], [("w", [2, 2], 0, f32[:16])], version=2),
        "empty.gguf": gguf([], []),
    }
    for name, blob in seeds.items():
        with open(os.path.join(CORPUS, "gguf", name), "wb") as fh:
            fh.write(blob)
    texts = {
        "plain.txt": b"\x00Hello world",
        "spaces.txt": b"\x01  two  spaces\tand\ttabs\n\nnewlines",
        "unicode.txt": "\x02F\u00fchrer \u043d\u0435\u0449\u043e \U0001f999 \u4e2d\u6587".encode(),
        "special.txt": b"\x83<s>[INST] hi [/INST]</s><|im_start|>user",
        "digits.txt": b"\x04 3 33 333 3333 33333 1.5e10",
        "invalid.txt": b"\x05\xff\xfe\xc3(\xe2\x82\xf0\x9f\x98",
    }
    for name, blob in texts.items():
        with open(os.path.join(CORPUS, "tokenizer", name), "wb") as fh:
            fh.write(blob)

    # fuzz_api: byte 0 = endpoint (bit 0: chat) and template (bits 1-3), then the JSON body.
    api = {
        "completion.json": b"\x00" + b'{"model": "m", "prompt": "Once upon a time", "max_tokens": 16,'
                           b' "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05,'
                           b' "n": 2, "stop": ["\\n", "end"], "seed": 42, "logprobs": 3,'
                           b' "presence_penalty": 0.5, "frequency_penalty": -0.5,'
                           b' "repetition_penalty": 1.1, "ignore_eos": true, "user": "u"}',
        "ids.json": b"\x00" + b'{"prompt": [1, 403, 407, 261], "stream": true,'
                    b' "stream_options": {"include_usage": true}}',
        "batch.json": b"\x00" + b'{"prompt": [[1, 2, 3]], "max_completion_tokens": 4}',
        "chat.json": b"\x03" + b'{"messages": [{"role": "system", "content": "Be brief."},'
                     b' {"role": "user", "content": [{"type": "text", "text": "hi"}]},'
                     b' {"role": "assistant", "content": null},'
                     b' {"role": "developer", "content": "x"}], "logprobs": true,'
                     b' "top_logprobs": 2, "stop": "\\u0000"}',
        "nonfinite.json": b"\x00" + b'{"prompt": "a", "temperature": NaN, "top_p": -Infinity}',
        "nested.json": b"\x01" + b'{"messages": [[[[[{"role": "user"}]]]]]}',
        "escapes.json": b"\x05" + b'{"messages": [{"role": "user", "content": "\\ud800\\udc00'
                        b'\\u00e9\\"\\\\"}]}',
    }
    chat = {
        "chatml.bin": b"\x01u\x00hello\x00a\x00hi there\x00s\x00<|im_start|>",
        "llama2.bin": b"\x02\x00system prompt\x00\x01\x00[INST] user [/INST]\x00\x02\x00ok",
        "plain.bin": b"\x00\x01\x00Once upon a time",
        "gemma.bin": b"\x06\x01\x00<start_of_turn>user\x00\x02\x00",
        "detect.bin": b"\x03{% for m in messages %}<|start_header_id|>{{ m.role }}"
                      b"<|end_header_id|>{% endfor %}",
    }
    for folder, items in (("api", api), ("chat_template", chat)):
        os.makedirs(os.path.join(CORPUS, folder), exist_ok=True)
        for name, blob in items.items():
            with open(os.path.join(CORPUS, folder, name), "wb") as fh:
                fh.write(blob)


if __name__ == "__main__":
    main()
