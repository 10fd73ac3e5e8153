"""meson test 'peer_tokenizer': kvserve's tokenizers against llama.cpp's, text by text. The
vocabularies of ../shared/models/vocab as they are, and GPT-2's under the pre-tokenizers that
no shared vocabulary names (tokenizer.ggml.pre rewritten): llama-bpe (Llama 3, its digits in
threes, its case-blind contractions, BOS added and whole words taken before merges), lfm2
(Liquid AI's LFM2 and LFM2.5: llama-bpe's pre-tokenizer under its own name), qwen2
(Qwen 2 / 2.5 / 3: digits one by one), smaug-bpe (Llama 3's regex, merges as usual), default and
gpt-4o (o200k: gpt-oss, Llama 4; words split at case changes), tekken (Mistral's: o200k's words
without contractions, digits one by one, BOS added, whole words before merges), and harmony (gpt-4o with
gpt-oss's special tokens appended: tests/e2e/harmony_vocab.py).
Each rides in a tiny kvs-mkmodel file that both servers load; for every text (the test strings
of every vocabulary's .inp file, and the cases below) kvserve's POST /tokenize must give
llama-server's ids, with add_special_tokens true and false, and POST /detokenize of those ids
llama-server's text, special tokens written out (BOS as "<s>"), but for one documented
difference: for SentencePiece vocabularies kvserve removes the one space the tokenizer put in
front of the text where it begins the text, as Hugging Face's decoder (and so vLLM) does.
Exits 77 (meson's skip) with the reason when llama-server or the vocabularies are absent.
Environment: KVSERVE_BIN, KVS_MKMODEL, KVS_PEER, KVS_SHARED_MODELS; by hand:
test_peer_tokenizer.py [NAME ...] with names as below (a vocabulary, or gpt-2+PRE)."""
import os
import struct
import subprocess
import sys
import tempfile

import peer_util

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "e2e"))
import harmony_vocab  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
VOCABS = ["llama-spm", "phi-3", "gpt-2", "starcoder", "refact", "deepseek-coder",
          "deepseek-llm", "falcon", "mpt"]
SPM = ("llama-spm", "phi-3")
PRES = ["llama-bpe", "lfm2", "qwen2", "smaug-bpe", "default", "gpt-4o", "tekken"]  # on GPT-2's vocabulary
SEP = "\n__ggml_vocab_test__\n"  # between the texts of a .inp file (llama.cpp's test-tokenizer-0)

# Beyond the .inp files: what the Llama 3 and Qwen 2 regexes treat apart (digit runs, upper-case
# contractions, newlines after punctuation, whitespace before newlines), scripts and marks.
EXTRA = [
    "1234567890 3.14159 1,000,000 007 ٣٤٥٦ ①② ½",
    "I'M YOU'LL We'D they'RE it'S O'Neil 'tis",
    "a \n\n b\r\n\r\nc \t\n x\n",
    "!!!\n\n???  \n...\n...\n",
    "  leading and trailing  ",
    "日本語のテキスト、한국어 문장。中文句子！",
    "emoji 👍🏽 👨‍👩‍👧 🇫🇷",
    "naïve café résumé ÀÉÎÕÜ ǅ ǈ ß ſ",
    "tab\tsep\u00a0nbsp\u2003em\u200bzw",
    "\u0301\u0301 combining e\u0301",
    "'s 's's''' \\n literal backslash \"quoted\"",
    "foo.bar(baz)[0] = {'a': 1}; // comment\n\tif (x) {\n\t\treturn;\n\t}\n",
    "a" * 300,
    "<|endoftext|>hi<|endoftext|> x<|endoftext|> y <s> </s>",
    # Unicode classes where a regex engine's \\s, \\p{L} and \\p{N} may disagree with llama.cpp's
    # tables: other spaces and separators, letter-like numbers, modifier and titlecase letters.
    "a\u0085b\u2028c\u2029d\u3000e\u180ef\ufeffg\u000bh\u000ci\u001cj\u001fk",
    "Ⅻ ⅻ ² ³ ¼ ⁴₅ ０１２ ᛮ 𝟘𝟙 ᾈ ǲ ʰ ˆ ª º 〇 々",
    "x  \u00a0 \n\u00a0\n \t\r\n\u2003\n",
    "12345678901234567890 1٢3 ４５６７",
    "don't DON'T it'll IT'LL 're 'VE 'Ll",
    "\ud83d\ude00\ud83d\ude00!!?? \u2026\u2014\u00bf\u00a1 \u00ab\u00bb",
    # o200k (gpt-4o) splits words at case changes, keeps contractions on the word and slashes
    # and line breaks on punctuation: camel case, acronyms, non-ASCII capitals, paths.
    "CamelCaseWords HTTPServer iPhone XMLHttpRequest getHTTPResponseCode ABCdef aBC",
    "ÀbcÉdef ÉCOLE Ångström ǅungla İstanbul ΣΊΣΥΦΟΣ Straße I'M they'Re DON'T",
    "a/b//c */\n// comment\n http://x.org/a?b=1 ./run.sh ../..//\r\n",
    # gpt-oss's harmony markers (special tokens in the harmony vocabulary, text elsewhere)
    "<|start|>assistant<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant to=functions.f"
    "<|channel|>commentary <|constrain|>json<|message|>{\"a\": 1}<|call|> x<|return|>",
]


def texts(vocab_dir):
    out = []
    for name in VOCABS:
        with open(os.path.join(vocab_dir, "ggml-vocab-%s.gguf.inp" % name),
                  encoding="utf-8") as f:
            out += f.read().split(SEP)
    out += EXTRA
    seen = set()
    return [t for t in out if not (t in seen or seen.add(t))]


def with_pre(src, dst, pre):
    """src's GGUF with tokenizer.ggml.pre set to pre. A vocabulary file holds metadata only (no
    tensor data whose offsets a longer string would move), so the string is replaced in place."""
    with open(src, "rb") as f:
        data = f.read()
    key = b"tokenizer.ggml.pre"
    i = data.find(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    if i < 8 + len(key) or data[i:i + 4] != struct.pack("<I", 8):  # GGUF_TYPE_STRING
        raise RuntimeError("%s: no string tokenizer.ggml.pre" % src)
    n = struct.unpack("<Q", data[i + 4:i + 12])[0]
    v = pre.encode()
    with open(dst, "wb") as f:
        f.write(data[:i + 4] + struct.pack("<Q", len(v)) + v + data[i + 12 + n:])


def compare(name, spm, kurl, purl, corpus):
    """Failures (printed) for one vocabulary."""
    bad = 0
    for t in corpus:
        for special in (True, False):
            kst, k = peer_util.post_json(kurl + "/tokenize",
                                         {"prompt": t, "add_special_tokens": special})
            pst, p = peer_util.post_json(purl + "/tokenize", {"content": t, "add_special": special})
            if kst != 200 or pst != 200 or k.get("tokens") != p.get("tokens"):
                bad += 1
                print("%s: tokenize %r (add_special_tokens %s):\n  kvserve      %s %s\n"
                      "  llama-server %s %s" % (name, t[:60], special, kst, k.get("tokens"),
                                                pst, p.get("tokens")))
                continue
            ids = p["tokens"]
            kst, k = peer_util.post_json(kurl + "/detokenize", {"tokens": ids})
            pst, p = peer_util.post_json(purl + "/detokenize", {"tokens": ids})
            want = p.get("content")
            if spm and want and want.startswith(" "):
                want = want[1:]
            if kst != 200 or pst != 200 or k.get("prompt") != want:
                bad += 1
                print("%s: detokenize of %r's ids (add_special_tokens %s):\n  kvserve      %r\n"
                      "  llama-server %r" % (name, t[:60], special, k.get("prompt"),
                                             p.get("content")))
    return bad


def main():
    kvserve, mkmodel, bindir = peer_util.tools()
    vocab_dir = os.path.join(os.environ.get("KVS_SHARED_MODELS",
                                            os.path.join(HERE, "..", "..", "shared", "models")),
                             "vocab")
    if not os.path.exists(os.path.join(vocab_dir, "ggml-vocab-gpt-2.gguf")):
        peer_util.skip("no vocabularies in %s" % vocab_dir)
    every = VOCABS + ["gpt-2+" + p for p in PRES] + ["gpt-2+harmony"]
    names = sys.argv[1:] or every
    if any(n not in every for n in names):
        print("names: " + " ".join(every))
        return 2
    corpus = texts(vocab_dir)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="kvs-peer-tokenizer-") as tmp:
        for name in names:
            base, _, pre = name.partition("+")
            vocab = os.path.join(vocab_dir, "ggml-vocab-%s.gguf" % base)
            if pre == "harmony":  # gpt-4o's pre-tokenizer and harmony's special tokens
                vocab_pre = os.path.join(tmp, "vocab-harmony.gguf")
                harmony_vocab.make(vocab, vocab_pre)
                vocab = vocab_pre
            elif pre:
                vocab_pre = os.path.join(tmp, "vocab-%s.gguf" % pre)
                with_pre(vocab, vocab_pre, pre)
                vocab = vocab_pre
            model = os.path.join(tmp, name + ".gguf")
            subprocess.run([mkmodel, "--shape", "tiny", "--vocab", vocab, "-o", model],
                           check=True, capture_output=True)
            kproc, kurl = peer_util.start_server(
                [kvserve, "serve", "-m", model, "--host", "127.0.0.1", "--port", "0", "--threads",
                 "1", "--kv-cache-mb", "16"], os.path.join(tmp, name + ".kvs.log"))
            port = peer_util.free_port()
            pproc, purl = peer_util.start_server(
                [os.path.join(bindir, "llama-server"), "-m", model, "--host", "127.0.0.1", "--port",
                 str(port), "-t", "1", "-c", "256"], os.path.join(tmp, name + ".peer.log"), port)
            try:
                bad = compare(name, base in SPM, kurl, purl, corpus)
            finally:
                peer_util.stop_server(kproc)
                peer_util.stop_server(pproc)
            print("%-20s %d texts, %d differences" % (name, len(corpus), bad))
            failures += bad
    print("%d vocabularies, %d differences" % (len(names), failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
