#!/usr/bin/env python3
"""Pulls plain English text out of Debian packages for the calibration and
evaluation texts of the DARKFormer conversion. Standard library only, except
`count`, which uses the HF `tokenizers` and `gguf` packages of the project's
.venv when they are there.

    extract_text.py jargon JARGON_TXT_GZ OUTDIR
        (also the old form: extract_text.py JARGON_TXT_GZ OUTDIR)
        The Jargon File (Debian package jargon-text, public domain) into
        OUTDIR/heldout.txt (Appendix B "A Portrait of J. Random Hacker":
        evaluation text, never used for calibration) and OUTDIR/calibration.txt
        (Chapters 1-12 and Appendix A "Hacker Folklore"; the small calibration
        text of the first adapters).
            apt-get install jargon-text
            python3 tools/extract_text.py /usr/share/doc/jargon-text/jargon.txt.gz tests/data

    extract_text.py corpus ROOT OUTDIR [--exclude FILE]...
        The calibration corpus (see tools/make_corpus.sh, which calls it):
        ROOT holds one directory per Debian package, each the output of
        `dpkg-deb -x`. Writes OUTDIR/parts/<source>.txt (one file per source)
        and OUTDIR/calibration.txt, all sources' documents interleaved (each
        source spread evenly over the file, so any prefix of it is a mix).
        Any paragraph that shares a line longer than 60 characters or a run
        of 13 words with an --exclude file (the held-out texts) is dropped.

    extract_text.py gnu-standards ROOT OUT
        The second long held-out text (tests/data/long/make_long.sh calls it):
        "GNU Coding Standards" and "Information for Maintainers of GNU
        Software" from ROOT/gnu-standards (Debian package gnu-standards,
        GFDL 1.3+ without invariant sections), tables of contents, the GFDL
        appendix and the indices dropped, prose paragraphs reflowed.

    extract_text.py count FILE...
        SmolLM2 token counts (vocabulary of models/SmolLM2-135M-Instruct.Q4_1.gguf
        through HF `tokenizers`, as tests/reference/test_tokenizer.py builds
        it); without those packages, bytes/4.2, and it says so.

    extract_text.py overlap CALIBRATION HELDOUT...
        Lines longer than 60 characters, and runs of 13 words (case and
        punctuation ignored), that a held-out text shares with the
        calibration text; exits 1 if any.

In all outputs paragraphs are separated by one blank line; a prose paragraph
is one line; verse, code and dialogue keep their line breaks.
"""
import gzip
import html.parser
import os
import re
import struct
import subprocess
import sys
import unicodedata
import zlib

# ---------------------------------------------------------------- common


def normalize(text):
    """Light whitespace normalization: NFC, no CR/tabs/control characters,
    no trailing spaces, at most one blank line in a row."""
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    text = text.expandtabs(8)
    text = "".join(c for c in text if c == "\n" or unicodedata.category(c) != "Cc")
    text = text.replace("\u00ad", "").replace("\ufeff", "")
    lines = [ln.rstrip() for ln in text.split("\n")]
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip("\n")


def blocks(text):
    """Blank-line separated blocks of a text, as lists of lines."""
    out, cur = [], []
    for ln in text.split("\n"):
        if ln.strip():
            cur.append(ln.rstrip())
        elif cur:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def dedent(lines):
    ind = min(len(ln) - len(ln.lstrip()) for ln in lines)
    return [ln[ind:] for ln in lines]


def reflow(text, keep=None):
    """Reflows each block whose lines after the first start at the left
    margin of the block (a prose paragraph) into one line; other blocks
    (verse, code, tables, lists) keep their lines, dedented, and so do the
    blocks for which keep(lines) is true."""
    paras = []
    for raw in blocks(text):
        b = dedent(raw)
        flat = all(not ln[:1].isspace() for ln in b[1:])
        if keep and keep(raw):
            flat = False
        if flat:
            paras.append(" ".join(ln.strip() for ln in b))
        else:
            paras.append("\n".join(b))
    return "\n\n".join(paras)


def read_text(path):
    opener = gzip.open if path.endswith((".gz", ".dz")) else open
    with opener(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def chunk(paras, size=40000):
    """Groups paragraphs into documents of about `size` bytes."""
    docs, cur, n = [], [], 0
    for p in paras:
        cur.append(p)
        n += len(p) + 2
        if n >= size:
            docs.append("\n\n".join(cur))
            cur, n = [], 0
    if cur:
        docs.append("\n\n".join(cur))
    return docs


# ---------------------------------------------------------------- jargon-text


def jargon_reflow(lines):
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


def jargon_section(lines, start, end):
    i = next(n for n, l in enumerate(lines) if re.match(start, l))
    j = next(n for n, l in enumerate(lines) if n > i and re.match(end, l)) if end else len(lines)
    body = lines[i + 1:j]
    # Skip a leading "Table of Contents" block: everything up to its first prose paragraph.
    if any(l.strip() == "Table of Contents" for l in body[:5]):
        k = next(n for n, l in enumerate(body) if re.match(r"^   \S.{60,}", l))
        body = body[k:]
    return jargon_reflow(body)


def cmd_jargon(src, out):
    with gzip.open(src, "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")
    held = jargon_section(lines, r"Appendix\s+B\.", r"Appendix\s+C\.")
    calib = (jargon_section(lines, r"Chapter\s+1\.", r"Glossary")
             + jargon_section(lines, r"Appendix\s+A\.", r"Appendix\s+B\."))
    for name, paras in (("heldout.txt", held), ("calibration.txt", calib)):
        with open(f"{out}/{name}", "w", encoding="utf-8") as f:
            f.write("\n\n".join(paras) + "\n")


# ---------------------------------------------------------------- R data (janeaustenr)


class RReader:
    """Reader of R's XDR serialization format, enough for the character
    vectors of an R data package and the index of its lazy-load database."""

    NOTHING = {254, 253, 252, 251, 246, 242, 241}  # NULL, environments, markers

    def __init__(self, data):
        self.d, self.p, self.refs = data, 0, []

    def int(self):
        v = struct.unpack_from(">i", self.d, self.p)[0]
        self.p += 4
        return v

    def length(self):
        n = self.int()
        if n == -1:
            hi, lo = self.int(), self.int()
            n = (hi << 32) + lo
        return n

    def read(self):
        if self.d[:2] != b"X\n":
            raise ValueError("not R XDR serialization")
        self.p = 2
        version = self.int()
        self.int()
        self.int()
        if version == 3:
            n = self.int()
            self.p += n
        return self.item()

    def item(self):
        flags = self.int()
        t = flags & 0xFF
        has_attr, has_tag = flags & (1 << 9), flags & (1 << 10)
        if t in self.NOTHING:
            return None
        if t == 255:  # REFSXP
            i = flags >> 8 or self.int()
            return self.refs[i - 1]
        if t == 247:  # PERSISTSXP
            self.item()
            self.refs.append(None)
            return None
        if t == 1:  # SYMSXP
            s = ("sym", self.item())
            self.refs.append(s)
            return s
        if t == 4:  # ENVSXP
            self.int()
            self.refs.append(None)
            for _ in range(4):
                self.item()
            return None
        if t in (2, 3, 5, 6, 17):  # pairlists, closures, promises, calls
            if has_attr:
                self.item()
            tag = self.item() if has_tag else None
            car, cdr = self.item(), self.item()
            out = [(tag[1] if tag else None, car)]
            return out + cdr if isinstance(cdr, list) else out
        if t == 9:  # CHARSXP
            n = self.int()
            if n == -1:
                return None
            s = self.d[self.p:self.p + n].decode("utf-8", "replace")
            self.p += n
            return s
        if t in (10, 13):
            n = self.length()
            v = list(struct.unpack_from(f">{n}i", self.d, self.p))
            self.p += 4 * n
        elif t == 14:
            n = self.length()
            v = list(struct.unpack_from(f">{n}d", self.d, self.p))
            self.p += 8 * n
        elif t in (16, 19, 20):  # character vector, list, expression
            v = [self.item() for _ in range(self.length())]
        elif t == 238:  # ALTREP: class info, state, attributes
            self.item()
            v = self.item()
            self.item()
        else:
            raise ValueError(f"R SEXP type {t} not supported")
        if has_attr:
            attrs = dict(a for a in (self.item() or []) if a[0])
            names = attrs.get("names")
            if names and isinstance(v, list) and len(names) == len(v):
                return dict(zip(names, v))
        return v


def r_lazyload(prefix):
    """The objects of an R lazy-load database (PREFIX.rdx + PREFIX.rdb)."""
    with gzip.open(prefix + ".rdx", "rb") as f:
        index = RReader(f.read()).read()
    with open(prefix + ".rdb", "rb") as f:
        db = f.read()
    out = {}
    for name, (off, ln) in index["variables"].items():
        # A 4-byte big-endian length, then a zlib stream (R's default
        # compression, "type 1"; types 2 and 3 put a type byte first).
        blob = db[off:off + ln]
        if blob[4:5] in (b"Z", b"2", b"X", b"0"):
            raise ValueError(f"{prefix}: compression type {blob[4:5]!r} not supported")
        out[name] = RReader(zlib.decompress(blob[4:])).read()
    return out


AUSTEN = [("prideprejudice", "Pride and Prejudice"), ("persuasion", "Persuasion"),
          ("northangerabbey", "Northanger Abbey"), ("sensesensibility", "Sense and Sensibility"),
          ("emma", "Emma"), ("mansfieldpark", "Mansfield Park")]


def src_austen(root, novels):
    data = r_lazyload(f"{root}/r-cran-janeaustenr/usr/lib/R/site-library/janeaustenr/data/Rdata")
    docs = []
    for key, _title in AUSTEN[:novels]:
        text = normalize("\n".join(x or "" for x in data[key]))
        # One document per chapter; the title page goes with the first one.
        parts = re.split(r"\n(?=(?:CHAPTER|Chapter) [0-9IVXLC]+\.?\n)", text)
        docs += [reflow(p) for p in parts]
    return docs


# ---------------------------------------------------------------- HTML


class HTMLText(html.parser.HTMLParser):
    BLOCK = {"p", "div", "section", "article", "h1", "h2", "h3", "h4", "h5", "h6", "li", "dt",
             "dd", "pre", "blockquote", "br", "tr", "table", "ul", "ol", "dl", "hr", "title",
             "figure", "caption", "td", "th"}
    SKIP_TAGS = {"script", "style", "head", "nav", "form", "button"}
    SKIP_CLASSES = {"navheader", "navfooter", "toc", "table", "informaltable", "list-of-tables",
                    "headerlink", "sphinxsidebar", "related", "footer", "breadcrumbs",
                    "searchformwrapper", "footnote-reference", "fn-backref", "tocsect1",
                    "list-of-figures", "list-of-examples", "toc-backref"}
    VOID = {"br", "img", "hr", "meta", "link", "input", "area", "base", "col", "embed",
            "source", "track", "wbr", "param"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.paras, self.cur, self.skip, self.pre = [], [], [], 0

    def flush(self):
        s = "".join(self.cur)
        self.cur = []
        if self.pre:
            s = s.strip("\n")
        else:
            s = re.sub(r"\s+", " ", s).strip()
        if s:
            self.paras.append(s)

    def handle_starttag(self, tag, attrs):
        if tag in self.VOID:
            if tag in ("br", "hr") and not self.skip:
                self.cur.append("\n") if self.pre else self.flush()
            return
        if self.skip:
            self.skip.append(tag)
            return
        cls = set((dict(attrs).get("class") or "").split())
        if tag in self.SKIP_TAGS or cls & self.SKIP_CLASSES:
            self.skip.append(tag)
            return
        if tag in self.BLOCK:
            self.flush()
        if tag == "pre":
            self.pre += 1

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if self.skip:
            self.skip.pop()
            return
        if tag in self.BLOCK:
            self.flush()
        if tag == "pre" and self.pre:
            self.pre -= 1

    def handle_data(self, data):
        if not self.skip:
            self.cur.append(data)


def html_text(path):
    p = HTMLText()
    p.feed(read_text(path))
    p.close()
    p.flush()
    return normalize("\n\n".join(p.paras))


def src_debian_reference(root):
    d = f"{root}/debian-reference-en/usr/share/debian-reference"
    files = sorted(f for f in os.listdir(d) if re.match(r"(ch\d\d|pr\d\d|ap\d\d)\.en\.html$", f))
    return [html_text(f"{d}/{f}") for f in files]


def src_debian_policy(root):
    d = f"{root}/debian-policy/usr/share/doc/debian-policy"
    files = [f"policy.html/{f}" for f in sorted(os.listdir(f"{d}/policy.html"))
             if re.match(r"(ch|ap)-.*\.html$", f) and f != "ap-license.html"]
    files += [f"policy.html/upgrading-checklist.html"]
    for sub in ("perl-policy.html", "menu-policy.html"):
        files += [f"{sub}/{f}" for f in sorted(os.listdir(f"{d}/{sub}"))
                  if f.endswith(".html") and f != "index.html"]
    files += ["debconf_specification.html", "copyright-format-1.0.html"]
    return [html_text(f"{d}/{f}") for f in files]


# ---------------------------------------------------------------- man pages


def man_text(path):
    raw = read_text(path)
    if re.match(r"\.so\s", raw.lstrip()):
        return ""
    r = subprocess.run(["groff", "-k", "-Kutf-8", "-t", "-man", "-Tutf8", "-rLL=5000n",
                        "-rcR=1", "-P-cbou"], input=raw.encode("utf-8"), capture_output=True)
    text = r.stdout.decode("utf-8", "replace")
    # Table rules go; vertical bars become ASCII ones.
    lines = [ln.replace("│", "|") for ln in text.split("\n")
             if not re.fullmatch(r"[\s─━═┌┐└┘├┤┬┴┼╭╮╯╰|+]*[─━═┌┐└┘├┤┬┴┼][\s─━═┌┐└┘├┤┬┴┼|+]*", ln)]
    # Drop the running header and footer (first and last non-empty lines).
    nonempty = [i for i, ln in enumerate(lines) if ln.strip()]
    if len(nonempty) >= 2:
        lines = lines[nonempty[0] + 1:nonempty[-1]]
    # groff ran with a line length of 5000 ens, so a paragraph is one line
    # already; only the base indentation of 7 is taken away.
    lines = [ln[7:] if ln.startswith(" " * 7) else ln for ln in lines]
    return normalize("\n".join(lines))


# Pages that are code tables of character sets, not text.
MAN_SKIP = re.compile(r"(armscii-8|ascii|cp125\d|iso_8859-\d+|koi8-[ru]|tis-620)\.7\.gz$")


def src_manpages(root, sections):
    d = f"{root}/manpages/usr/share/man"
    docs = []
    for sec in sections:
        for f in sorted(os.listdir(f"{d}/man{sec}")):
            p = f"{d}/man{sec}/{f}"
            if os.path.islink(p) or MAN_SKIP.match(f):
                continue
            t = man_text(p)
            if len(t) > 200:
                docs.append(t)
    return docs


# ---------------------------------------------------------------- fortunes

# Left out: ASCII art; long verbatim excerpts from copyrighted novels and
# scripts (pratchett, startrek); ethnic jokes and Zippy's non-sequiturs.
FORTUNE_SKIP = {"art", "ascii-art", "pratchett", "startrek", "ethnic", "zippy"}


def src_fortunes(root, pkgs):
    docs = []
    for pkg in pkgs:
        d = f"{root}/{pkg}/usr/share/games/fortunes"
        for f in sorted(os.listdir(d)):
            p = f"{d}/{f}"
            if "." in f or f in FORTUNE_SKIP or os.path.islink(p):
                continue
            cookies = [normalize(c) for c in re.split(r"\n%\n", "\n" + read_text(p) + "\n")]
            # A few cookies are mis-encoded ("donÃ¢ÂÂt"): left out.
            cookies = ["\n".join(dedent(c.split("\n"))) for c in cookies
                       if c.strip() and not re.search("[ÃÂ]", c)]
            docs += chunk(cookies, 30000)
    return docs


# ---------------------------------------------------------------- C comments

LICENCE_WORDS = ("Copyright", "copyright", "SPDX-License", "WITHOUT ANY WARRANTY",
                 "General Public License", "This file is part of", "Permission is hereby",
                 "Redistribution and use", "All rights reserved", "licen")


def c_comments(src):
    """The comments of a C file, in order, `//` runs merged."""
    out, i, n = [], 0, len(src)
    line_run, last_line_end = [], -1
    while i < n:
        c = src[i]
        if c == '"' or c == "'":
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            i = j + 1
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j
            out.append(("block", src[i + 2:j]))
            i = j + 2
        elif src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            body = src[i + 2:j]
            if line_run and src[last_line_end:i].strip() == "":
                line_run.append(body)
            else:
                if line_run:
                    out.append(("line", "\n".join(line_run)))
                line_run = [body]
            last_line_end = j
            i = j
        else:
            i += 1
    if line_run:
        out.append(("line", "\n".join(line_run)))
    return [clean_comment(body) for _, body in out]


def clean_comment(body):
    lines = [re.sub(r"^\s*\*+ ?", "", ln) if re.match(r"^\s*\*", ln) else ln
             for ln in body.split("\n")]
    lines = [ln.rstrip().rstrip("*").rstrip() for ln in lines]
    text = "\n".join(lines).strip("\n")
    if not text.strip():
        return ""
    # Keep what comes before a licence notice; drop a comment that is one.
    for w in LICENCE_WORDS:
        k = text.find(w)
        if k >= 0:
            text = text[:k]
            text = text[:text.rfind("\n") + 1] if "\n" in text else ""
    text = normalize("\n".join(dedent([ln for ln in text.split("\n")])) if text.strip() else "")
    words = re.findall(r"[A-Za-z]{2,}", text)
    if len(words) < 3 or sum(map(len, words)) < 0.5 * len(text.replace(" ", "")):
        return ""  # too short, or mostly symbols (commented-out code, ASCII art)
    return reflow(text, keep=lambda b: any(LIST_ITEM.match(ln) for ln in b[1:]))


LIST_ITEM = re.compile(r"\s*(@|[-*+•#]\s|\d+[.)]\s|[A-Za-z_][A-Za-z0-9_]*\s*(:|-\s))")


def src_comments(root, pkgs):
    seen, docs, cur = set(), [], []
    for pkg in pkgs:
        base = f"{root}/{pkg}/usr/include"
        for dirpath, dirnames, files in os.walk(base):
            dirnames.sort()
            for f in sorted(files):
                p = f"{dirpath}/{f}"
                if not f.endswith(".h") or os.path.islink(p):
                    continue
                for c in c_comments(read_text(p)):
                    key = re.sub(r"\W+", " ", c).strip().lower()
                    if c and key not in seen:
                        seen.add(key)
                        cur.append(c)
        docs += chunk(cur, 30000)
        cur = []
    return docs


# ---------------------------------------------------------------- corpus

# name, Debian package(s), kind, extractor
SOURCES = [
    ("austen", ["r-cran-janeaustenr"], "prose: Jane Austen's six novels",
     lambda r: src_austen(r, 6)),
    ("debian-reference", ["debian-reference-en"], "technical documentation",
     src_debian_reference),
    ("debian-policy", ["debian-policy"], "technical documentation", src_debian_policy),
    ("manpages", ["manpages"], "technical documentation: man pages, sections 1 4 5 7",
     lambda r: src_manpages(r, "1457")),
    ("fortunes", ["fortunes", "fortunes-min"], "dialogue, quotations, jokes",
     lambda r: src_fortunes(r, ["fortunes-min", "fortunes"])),
    ("c-comments", ["libc6-dev", "linux-libc-dev"], "code comments of C headers",
     lambda r: src_comments(r, ["libc6-dev", "linux-libc-dev"])),
]


def long_lines(text, minlen=60):
    return {ln.strip() for ln in text.split("\n") if len(ln.strip()) > minlen}


def ngrams(text, n=13):
    """Runs of n words (case-folded, punctuation and line breaks ignored)."""
    w = re.findall(r"\w+", text.lower())
    return {" ".join(w[i:i + n]) for i in range(len(w) - n + 1)}


def cmd_corpus(root, out, excludes):
    banned, banned_grams = set(), set()
    for e in excludes:
        banned |= long_lines(read_text(e))
        banned_grams |= ngrams(read_text(e))
    os.makedirs(f"{out}/parts", exist_ok=True)
    allsrc, dropped = [], 0
    for name, pkgs, kind, fn in SOURCES:
        docs = []
        for d in fn(root):
            paras = d.split("\n\n")
            keep = [p for p in paras
                    if not (long_lines(p) & banned) and not (ngrams(p) & banned_grams)]
            dropped += len(paras) - len(keep)
            d = normalize("\n\n".join(keep))
            if d:
                docs.append(d)
        with open(f"{out}/parts/{name}.txt", "w", encoding="utf-8") as f:
            f.write("\n\n".join(docs) + "\n")
        allsrc.append((name, docs))
        print(f"{name}\t{len(docs)} documents\t{sum(len(d.encode()) + 2 for d in docs)} bytes",
              file=sys.stderr)
    # Interleave: each document is placed at the relative position of its
    # middle within its own source, so every source is spread over the file.
    keyed = []
    for si, (name, docs) in enumerate(allsrc):
        total = sum(len(d) for d in docs)
        acc = 0
        for d in docs:
            keyed.append(((acc + len(d) / 2) / total, si, d))
            acc += len(d)
    keyed.sort(key=lambda k: (k[0], k[1]))
    with open(f"{out}/calibration.txt", "w", encoding="utf-8") as f:
        f.write("\n\n".join(k[2] for k in keyed) + "\n")
    print(f"dropped {dropped} paragraphs that share a line longer than 60 characters or "
          f"a run of 13 words with an --exclude file", file=sys.stderr)


# ---------------------------------------------------------------- gnu-standards


def texinfo_text(path):
    """The body of a makeinfo --plaintext manual: from its title (the line
    underlined with '*') to the GFDL appendix, headings kept."""
    lines = normalize(read_text(path)).split("\n")
    start = next(i for i in range(1, len(lines)) if re.match(r"^\*{5,}$", lines[i])) - 1
    end = next(i for i in range(start, len(lines))
               if re.match(r"^Appendix [A-Z] GNU Free Documentation License$", lines[i]))
    body = [ln for ln in lines[start:end] if not re.match(r"^[*=\-.]{3,}$", ln)]
    if body[0] == "Version":  # maintain.texi's top node has no title of its own
        body = body[1:]
    text = "\n".join(body)
    # Menus ("* Menu:" blocks) are tables of contents of the info version.
    text = re.sub(r"\n\* Menu:\n(?:.*\S.*\n)*", "\n", text + "\n")

    def is_heading(b):
        return len(b) == 1 or re.match(r"^(\d+(\.\d+)*|Appendix [A-Z])\s", b[0]) is not None

    # Examples are indented by 5 spaces, prose by at most 3 (first line).
    return reflow(normalize(text), keep=lambda b: (len(b) > 1 and is_heading(b))
                  or all(ln.startswith("     ") for ln in b))


def cmd_gnu_standards(root, out):
    d = f"{root}/gnu-standards/usr/share/doc/gnu-standards"
    text = texinfo_text(f"{d}/standards.text.gz") + "\n\n" + texinfo_text(f"{d}/maintain.text.gz")
    with open(out, "w", encoding="utf-8") as f:
        f.write(normalize(text) + "\n")


# ---------------------------------------------------------------- count / overlap


def smollm_tokenizer():
    here = os.path.dirname(os.path.abspath(__file__))
    model = os.environ.get("MODEL", os.path.join(here, "..", "models",
                                                 "SmolLM2-135M-Instruct.Q4_1.gguf"))
    try:
        import gguf
        from tokenizers import Tokenizer, models, pre_tokenizers
    except ImportError:
        return None
    if not os.path.exists(model):
        return None
    f = gguf.GGUFReader(model).fields
    tokens = f["tokenizer.ggml.tokens"].contents()
    merges = [tuple(m.split(" ")) for m in f["tokenizer.ggml.merges"].contents()]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    return tok


def cmd_count(files):
    tok = smollm_tokenizer()
    if tok is None:
        print("# tokenizers/gguf or the model missing: tokens approximated as bytes/4.2",
              file=sys.stderr)
    for path in files:
        text = read_text(path)
        nbytes = len(text.encode("utf-8"))
        if tok is None:
            n = round(nbytes / 4.2)
        else:
            # Encoded in pieces cut inside a "\n\n" that a letter follows:
            # the pre-tokenizer splits such a "\n\n" into "\n" "\n" anyway,
            # so the ids are those of the whole text.
            pieces = re.split(r"(?<=\n)(?=\n[A-Za-z])", text)
            n = sum(len(e.ids) for e in tok.encode_batch(pieces))
        print(f"{path}\t{nbytes}\t{n}")


def cmd_overlap(calib, held):
    text = read_text(calib)
    c, cg = long_lines(text), ngrams(text)
    bad = 0
    for h in held:
        text = read_text(h)
        hl, hg = long_lines(text), ngrams(text)
        common, cgrams = hl & c, hg & cg
        bad += len(common) + len(cgrams)
        print(f"{h}: {len(common)} of its {len(hl)} lines > 60 characters and "
              f"{len(cgrams)} of its {len(hg)} 13-word runs are in {calib}")
        for ln in sorted(common)[:5] + sorted(cgrams)[:5]:
            print(f"    {ln[:100]}")
    return 1 if bad else 0


def main():
    a = sys.argv[1:]
    if not a or a[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    cmd = a[0]
    if cmd == "jargon":
        cmd_jargon(a[1], a[2])
    elif cmd == "corpus":
        ex = [a[i + 1] for i in range(3, len(a)) if a[i] == "--exclude"]
        cmd_corpus(a[1], a[2], ex)
    elif cmd == "gnu-standards":
        cmd_gnu_standards(a[1], a[2])
    elif cmd == "count":
        cmd_count(a[1:])
    elif cmd == "overlap":
        return cmd_overlap(a[1], a[2:])
    elif len(a) == 2 and a[0].endswith(".gz"):
        cmd_jargon(a[0], a[1])  # the old form
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
