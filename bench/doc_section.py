#!/usr/bin/env python3
"""Writes one benchmark script's section of a markdown file (docs/BENCHMARKS.md).

  bench/doc_section.py DOC NAME < SECTION

SECTION (standard input) is the new text, its markers included. The old section runs from
"<!-- NAME begin" or "<!-- NAME:begin" to the matching "<!-- NAME end -->" or
"<!-- NAME:end -->" and is replaced; a DOC without one gets SECTION appended."""
import re
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    path, name = sys.argv[1], re.escape(sys.argv[2])
    section = sys.stdin.read().rstrip("\n")
    try:
        doc = open(path).read()
    except FileNotFoundError:
        doc = "# Benchmarks\n"
    pat = re.compile(r"<!-- %s[: ]begin.*?<!-- %s[: ]end -->" % (name, name), re.S)
    if pat.search(doc):
        doc = pat.sub(lambda m: section, doc, count=1)
    else:
        doc = doc.rstrip("\n") + "\n\n" + section + "\n"
    open(path, "w").write(doc)


if __name__ == "__main__":
    main()
