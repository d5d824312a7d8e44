#!/usr/bin/env python3
"""Extracts plain English prose from Debian's jargon-text package (the Jargon
File 4.4.x, which declares itself public domain: see
/usr/share/doc/jargon-text/copyright) into the text files under tests/data/.

    apt-get install jargon-text
    python3 tools/extract_text.py /usr/share/doc/jargon-text/jargon.txt.gz tests/data

Writes:
  heldout.txt      Appendix B "A Portrait of J. Random Hacker": evaluation text
                   (perplexity); never used for calibration.
  calibration.txt  Chapters 1-12 and Appendix A "Hacker Folklore": calibration
                   text for the DARKFormer conversion; disjoint from heldout.txt.
Paragraphs are reflowed to one line each; tables (box-drawing characters) and
tables of contents are dropped.
"""
import gzip
import re
import sys


def reflow(lines):
    paras, cur = [], []
    for ln in lines:
        if any(c in ln for c in "│├┌└┤┬┴┼─"):
            continue
        s = ln.strip()
        if not s:
            if cur:
                paras.append(" ".join(cur))
                cur = []
            continue
        cur.append(s)
    if cur:
        paras.append(" ".join(cur))
    # Headings and table-of-contents entries are short lines without a final stop.
    return [p for p in paras if len(p) > 60 or p.endswith((".", "!", "?", ":"))]


def section(lines, start, end):
    i = next(n for n, l in enumerate(lines) if re.match(start, l))
    j = next(n for n, l in enumerate(lines) if n > i and re.match(end, l)) if end else len(lines)
    body = lines[i + 1:j]
    # Skip a leading "Table of Contents" block: everything up to its first prose paragraph.
    if any(l.strip() == "Table of Contents" for l in body[:5]):
        k = next(n for n, l in enumerate(body) if re.match(r"^   \S.{60,}", l))
        body = body[k:]
    return reflow(body)


def main():
    src, out = sys.argv[1], sys.argv[2]
    with gzip.open(src, "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")
    held = section(lines, r"Appendix\s+B\.", r"Appendix\s+C\.")
    calib = section(lines, r"Chapter\s+1\.", r"Glossary") + section(lines, r"Appendix\s+A\.", r"Appendix\s+B\.")
    for name, paras in (("heldout.txt", held), ("calibration.txt", calib)):
        with open(f"{out}/{name}", "w", encoding="utf-8") as f:
            f.write("\n\n".join(paras) + "\n")


if __name__ == "__main__":
    main()
