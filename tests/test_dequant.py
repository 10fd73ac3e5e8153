"""meson test 'dequant': kvserve's dequantizers (engine/dtype's to_f32, through
kvs-dequant-dump) give gguf-py's gguf.quants.dequantize bit for bit, on every tensor of real
llama-quantize output of the kquant shape for each legacy, K and IQ4 file type, and of a qwen3moe
file of that shape for MXFP4_MOE (MXFP4 expert stacks); on an MXFP4 tensor written by gguf-py with
every exponent byte 0 .. 255; and the loader takes every one of the llama-quantize files (a file
with another type is refused naming a tensor, its type and the supported list).
Also by hand, on another shape or a few types: test_dequant.py --shape 110m --ftypes Q4_K_M.
Exits 77 (meson's skip) when llama-quantize, gguf-py or numpy (Debian python3-numpy, run with
/usr/bin/python3) is missing. Environment: KVS_DEQUANT_DUMP, KVS_MKMODEL, KVS_PEER."""
import argparse
import os
import subprocess
import sys
import tempfile

# llama-quantize file types: each writes a mix of per-tensor types (output.weight in Q6_K,
# some attn_v / ffn_down one step up), so together they cover every type in WANT.
FTYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S",
          "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4_MOE"]
# file types that quantize only a mixture of experts' stacks: made from a qwen3moe file
MOE_FTYPES = {"MXFP4_MOE"}
MOE_ARGS = ["--arch", "qwen3moe", "--experts", "4", "--experts-used", "2"]
WANT = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
        "IQ4_NL", "IQ4_XS", "MXFP4", "F16", "F32"}
LOADABLE = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K",
            "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4"}
SUPPORTED = ("supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, "
             "Q6_K, IQ4_NL, IQ4_XS, MXFP4")


def skip(why):
    print("SKIP: " + why)
    sys.exit(77)


def read_dump(path, np):
    """{name: (ggml type id, float32 array)} from kvs-dequant-dump's output."""
    out, buf, off = {}, open(path, "rb").read(), 0
    while off < len(buf):
        n = int.from_bytes(buf[off:off + 4], "little")
        name = buf[off + 4:off + 4 + n].decode()
        off += 4 + n
        typ = int.from_bytes(buf[off:off + 4], "little")
        count = int.from_bytes(buf[off + 4:off + 12], "little")
        off += 12
        out[name] = (typ, np.frombuffer(buf, dtype=np.float32, count=count, offset=off))
        off += 4 * count
    return out


def compare(path, dump_exe, tmp, np, GGUFReader, dequantize):
    """(failures, type names seen, the loader's line, {tensor name: type name})."""
    bin_path = os.path.join(tmp, "dump.bin")
    r = subprocess.run([dump_exe, path, bin_path], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=600)
    if r.returncode:
        return ["kvs-dequant-dump failed: " + r.stderr.decode().strip()], set(), "", {}
    ours = read_dump(bin_path, np)
    fails, seen = [], set()
    tensors = GGUFReader(path).tensors
    if sorted(ours) != sorted(t.name for t in tensors):
        fails.append("tensor names differ")
    for t in tensors:
        seen.add(t.tensor_type.name)
        ref = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32).ravel()
        typ, got = ours.get(t.name, (None, np.zeros(0, np.float32)))
        if typ != int(t.tensor_type) or got.size != ref.size:
            fails.append("%s: type %s/%s, %d/%d values" % (t.name, typ, int(t.tensor_type),
                                                           got.size, ref.size))
            continue
        bad = np.nonzero(got.view(np.uint32) != ref.view(np.uint32))[0]
        if bad.size:
            i = int(bad[0])
            fails.append("%s (%s): %d of %d values differ, first at %d: %r (0x%08x) vs gguf-py %r "
                         "(0x%08x)" % (t.name, t.tensor_type.name, bad.size, ref.size, i,
                                       float(got[i]), int(got.view(np.uint32)[i]), float(ref[i]),
                                       int(ref.view(np.uint32)[i])))
    load = r.stdout.decode().strip()
    return fails, seen, load, {t.name: t.tensor_type.name for t in tensors}


def every_exponent(path, np, gguf):
    """An MXFP4 tensor (8 rows of 32 blocks) whose block i has the exponent byte i and random
    nibbles, written by gguf-py: the scales llama-quantize never writes (subnormal, overflowing
    and e = 255) compared with gguf-py's too."""
    rng = np.random.default_rng(5)
    blocks = np.empty((256, 17), np.uint8)
    blocks[:, 0] = np.arange(256)
    blocks[:, 1:] = rng.integers(0, 256, (256, 16), dtype=np.uint8)
    w = gguf.GGUFWriter(path, "mxfp4")
    w.add_tensor("mxfp4.every_exponent", blocks.reshape(8, 32 * 17),
                 raw_dtype=gguf.GGMLQuantizationType.MXFP4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="kquant", help="kvs-mkmodel shape (default kquant)")
    ap.add_argument("--ftypes", default=",".join(FTYPES),
                    help="comma-separated llama-quantize file types (default: all of FTYPES)")
    args = ap.parse_args()
    ftypes = args.ftypes.split(",")
    peer = os.environ.get("KVS_PEER", "")
    quantize = os.path.join(peer, "llama.cpp", "bin", "llama-quantize")
    gguf_py = os.path.join(peer, "gguf-py")
    if not os.access(quantize, os.X_OK):
        skip("llama-quantize not found at %s (see ../shared/peer/README.md)" % quantize)
    if not os.path.isfile(os.path.join(gguf_py, "gguf", "quants.py")):
        skip("gguf-py not found at %s" % gguf_py)
    try:
        import numpy as np
    except ImportError:
        skip("numpy not found for %s (Debian python3-numpy; tools/setup.sh)" % sys.executable)
    sys.path.insert(0, gguf_py)
    import gguf
    from gguf import GGUFReader
    from gguf.quants import dequantize

    dump_exe, mkmodel = os.environ["KVS_DEQUANT_DUMP"], os.environ["KVS_MKMODEL"]
    failures, covered = [], set()
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "f16.gguf")
        subprocess.run([mkmodel, "--shape", args.shape, "--type", "f16", "-o", base],
                       check=True, stdout=subprocess.DEVNULL, timeout=600)
        moe_base = os.path.join(tmp, "moe_f16.gguf")
        if MOE_FTYPES & set(ftypes):
            subprocess.run([mkmodel, "--shape", args.shape, "--type", "f16", "-o", moe_base]
                           + MOE_ARGS, check=True, stdout=subprocess.DEVNULL, timeout=600)
        for ftype in ["F16"] + ftypes:
            path = base
            if ftype != "F16":
                path = os.path.join(tmp, ftype + ".gguf")
                src = moe_base if ftype in MOE_FTYPES else base
                r = subprocess.run([quantize, src, path, ftype, "2"], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, timeout=600)
                if r.returncode:
                    failures.append("%s: llama-quantize failed:\n%s" % (ftype, r.stdout.decode()))
                    continue
            fails, seen, load, types = compare(path, dump_exe, tmp, np, GGUFReader, dequantize)
            covered |= seen
            # the first few per file type say enough; the count says the rest
            failures += ["%s: %s" % (ftype, f) for f in fails[:3]]
            if len(fails) > 3:
                failures.append("%s: ... and %d more tensors" % (ftype, len(fails) - 3))
            # Loadable files load; the others are refused by a tensor whose type is not loadable.
            if not seen - LOADABLE:
                ok = load == "load: OK"
            else:
                words = load.split()
                ok = (len(words) > 4 and words[1] == "tensor" and words[3:5] == ["has", "type"]
                      and load.endswith("; " + SUPPORTED)
                      and words[5].rstrip(";") == types.get(words[2])
                      and types.get(words[2]) not in LOADABLE)
            if not ok:
                failures.append("%s: unexpected loader result '%s'" % (ftype, load))
            print("%-7s %s; %s" % (ftype, " ".join(sorted(seen)), load))
        path = os.path.join(tmp, "mxfp4_every_exponent.gguf")
        every_exponent(path, np, gguf)
        fails, seen, load, types = compare(path, dump_exe, tmp, np, GGUFReader, dequantize)
        failures += ["every exponent: %s" % f for f in fails]  # not a model: the loader refuses
        print("MXFP4 every exponent: %s" % ("OK" if not fails else "%d failures" % len(fails)))
    if ftypes == FTYPES and not WANT <= covered:
        failures.append("types never written by llama-quantize here: %s" % sorted(WANT - covered))
    for f in failures:
        print("FAIL: " + f)
    print("%d file types, %d failures" % (len(ftypes) + 1, len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
