#!/usr/bin/env python3
"""Writes one benchmark script's section of a markdown file (docs/BENCHMARKS.md).

  bench/doc_section.py DOC NAME < SECTION

SECTION (standard input) is the new text, its markers included. The old section runs from
"<!-- NAME begin" or "<!-- NAME:begin" to the matching "<!-- NAME end -->" or
"<!-- NAME:end -->" and is replaced; a DOC without one gets SECTION appended.

With --per-cpu, NAME becomes NAME-intel, NAME-amd (AMD without AVX-512: Zen 3 and older),
NAME-amd-avx512 (Zen 4: AVX-512 on 256-bit units) or NAME-amd-zen5 (CPU family 26 on: full-width
AVX-512 units), from /proc/cpuinfo's vendor_id, cpu family and flags, in the markers
SECTION holds too: figures from the CPU kinds the project runs on stand side by side instead of
the last run replacing another kind's."""
import re
import sys


def cpu_family():
    vendor, flags, family = "cpu", set(), 0
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("cpu family"):
                family = int(line.split(":", 1)[1])
            elif line.startswith("vendor_id"):
                v = line.split(":", 1)[1].strip()
                vendor = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(v, v.lower())
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    # Zen 4's AVX-512 runs 512-bit work on 256-bit units: a kind of its own; Zen 5 (family 26)
    # has full-width units, twice Zen 4's FMA peak per core: another
    if vendor == "amd" and "avx512f" in flags:
        return "amd-zen5" if family >= 26 else "amd-avx512"
    return vendor


def main():
    args = sys.argv[1:]
    per_cpu = "--per-cpu" in args
    args = [a for a in args if a != "--per-cpu"]
    if len(args) != 2:
        sys.exit(__doc__)
    path, raw = args
    section = sys.stdin.read().rstrip("\n")
    if per_cpu:
        tagged = "%s-%s" % (raw, cpu_family())
        section = re.sub(r"<!-- %s([: ])(begin|end)" % re.escape(raw),
                         lambda m: "<!-- %s%s%s" % (tagged, m.group(1), m.group(2)), section)
        raw = tagged
    name = re.escape(raw)
    try:
        doc = open(path).read()
    except FileNotFoundError:
        doc = "# Benchmarks\n"
    pat = re.compile(r"<!-- %s[: ]begin.*?<!-- %s[: ]end -->" % (name, name), re.S)
    sibling = re.compile(r"<!-- %s-[a-z0-9-]+[: ]end -->" % re.escape(args[1])) if per_cpu else None
    if pat.search(doc):
        doc = pat.sub(lambda m: section, doc, count=1)
    elif sibling and sibling.search(doc):  # after the other CPU kinds' sections
        m = list(sibling.finditer(doc))[-1]
        doc = doc[:m.end()] + "\n\n" + section + doc[m.end():]
    else:
        doc = doc.rstrip("\n") + "\n\n" + section + "\n"
    open(path, "w").write(doc)


if __name__ == "__main__":
    main()
