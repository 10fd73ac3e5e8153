"""A gpt-oss-like vocabulary for tests: GPT-2's (../shared/models/vocab) with harmony's special
tokens appended as control tokens (<|start|>, <|end|>, <|message|>, <|channel|>, <|constrain|>,
<|return|>, <|call|>), EOS set to <|return|> as gpt-oss's files set it, and the gpt-4o
pre-tokenizer. A GGUF vocabulary file holds metadata only, so it is read and written here
whole, key by key."""
import struct

SPECIALS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>",
            "<|call|>"]
CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
        11: "<q", 12: "<d"}


def _read_value(d, i, t):
    if t == 8:
        n = struct.unpack_from("<Q", d, i)[0]
        return d[i + 8:i + 8 + n].decode("utf-8", "surrogateescape"), i + 8 + n
    if t == 9:
        et, n = struct.unpack_from("<IQ", d, i)
        i += 12
        out = []
        for _ in range(n):
            v, i = _read_value(d, i, et)
            out.append(v)
        return (et, out), i
    return struct.unpack_from(_FMT[t], d, i)[0], i + _SIZES[t]


def _write_value(t, v):
    if t == 8:
        b = v.encode("utf-8", "surrogateescape")
        return struct.pack("<Q", len(b)) + b
    if t == 9:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(_write_value(et, x) for x in items)
    return struct.pack(_FMT[t], v)


def make(src, dst, extra=()):
    """Writes the harmony vocabulary made from src (a metadata-only GGUF) to dst, with the
    texts of extra appended after SPECIALS as user-defined tokens (as Qwen 3's <think>);
    returns the ids of SPECIALS and extra."""
    return append(src, dst, SPECIALS, extra, eos="<|return|>", pre="gpt-4o")


def append(src, dst, control, user=(), eos=None, pre=None):
    """Writes src's vocabulary (a metadata-only GGUF) to dst with the texts of control appended
    as control tokens, then those of user as user-defined ones; EOS becomes the token of text
    eos and the pre-tokenizer pre where given. Returns the appended texts' ids."""
    with open(src, "rb") as f:
        d = f.read()
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", d, 4)
    assert d[:4] == b"GGUF" and n_tensors == 0, src
    i, kvs = 24, []
    for _ in range(n_kv):
        n = struct.unpack_from("<Q", d, i)[0]
        key = d[i + 8:i + 8 + n].decode()
        t = struct.unpack_from("<I", d, i + 8 + n)[0]
        v, i = _read_value(d, i + 12 + n, t)
        kvs.append([key, t, v])
    kv = {k: e for e in kvs for k in [e[0]]}
    tokens = kv["tokenizer.ggml.tokens"][2][1]
    added = list(control) + list(user)
    ids = list(range(len(tokens), len(tokens) + len(added)))
    tokens += added
    if "tokenizer.ggml.token_type" in kv:
        kv["tokenizer.ggml.token_type"][2][1].extend([CONTROL] * len(control) +
                                                     [USER_DEFINED] * len(user))
    if "tokenizer.ggml.scores" in kv:
        kv["tokenizer.ggml.scores"][2][1].extend([0.0] * len(added))
    if pre is not None:
        kv["tokenizer.ggml.pre"][2] = pre
    if eos is not None:
        e = [x for x in kvs if x[0] == "tokenizer.ggml.eos_token_id"]
        if not e:
            e = [["tokenizer.ggml.eos_token_id", 4, 0]]
            kvs.append(e[0])
        e[0][1:] = [4, ids[added.index(eos)]]
    out = [b"GGUF", struct.pack("<IQQ", version, 0, len(kvs))]
    for key, t, v in kvs:
        k = key.encode()
        out.append(struct.pack("<Q", len(k)) + k + struct.pack("<I", t) + _write_value(t, v))
    with open(dst, "wb") as f:
        f.write(b"".join(out))
    return dict(zip(added, ids))
