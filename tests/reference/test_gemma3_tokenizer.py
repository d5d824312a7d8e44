"""core/text/tokenizer.c on Gemma 3's vocabulary against Google's sentencepiece.

The oracle (gemma3_ref.SpmTokenizer) is PyPI `sentencepiece` running a BPE
ModelProto built from the GGUF's pieces, scores and types (byte fallback, no
dummy prefix, whitespace escaped to U+2581); control tokens are cut out of
the text first, as llama.cpp and HF do with special-token parsing. The C side
is tests/helpers/tokenize_dump. Over the shared tokenizer corpus
(tests/data/tokenizer_corpus.jsonl) plus the strings below (Gemma's turn
markers, its USER_DEFINED whitespace runs and HTML tags, byte-fallback
characters, emoji, code, numbers), every string must give identical ids with
BOS and special parsing, and without either; decode(encode(s)) must give s
back (but for the one string with a literal "▁", which decodes to a space
in sentencepiece too) and equal sentencepiece's decode.

Needs the Gemma 3 270M GGUF ($DARKSERVE_GEMMA_MODEL, default
models/gemma-3-270m-q4_k_m.gguf; scripts/fetch_gemma.sh fetches it): skipped
when it is absent.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
CORPUS = ROOT / "tests" / "data" / "tokenizer_corpus.jsonl"
GEMMA = Path(os.environ.get("DARKSERVE_GEMMA_MODEL",
                            ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"))

pytestmark = pytest.mark.skipif(not GEMMA.is_file(),
                                reason=f"{GEMMA} absent (scripts/fetch_gemma.sh)")

EXTRA = [
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\nhi<end_of_turn>",
    "<start_of_turn><end_of_turn><start_of_turn>",
    "text<start_of_turn>text",
    "<start_of_turn",
    "start_of_turn>",
    "<<start_of_turn>>",
    "<unused0><unused1> <unused98>",
    "<eos>",
    "<pad><mask><unk>",
    "<start_of_image> an image <end_of_image>",
    "[multimodal] marker",
    "<table><tr><td>1</td><td>2</td></tr></table>",
    "<h1>Title</h1><p>para</p>",
    "<strong>bold</strong> and <em>em</em> <code>x = 1</code>",
    "<div><span>nested</span></div>",
    "<s>not bos</s>",
    "  ",
    "   ",
    "    x",
    " " * 31,
    " " * 40 + "deep",
    "\t\t\ttabs",
    "\t" * 35,
    "\n" * 33,
    "a\n\n\nb\n\n\n\nc",
    "\r\n\r\nwindows",
    "trailing   ",
    " \t \n mixed \u00a0 nbsp \u3000 ideographic",
    "\u2581already escaped \u2581\u2581",
    "😀😃😄😁😆😅😂🤣",
    "👩‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 👍🏽 tone",
    "🇫🇷🇯🇵🇺🇸",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙",
    "\U0001F9EC\U0001FAE0\U0001FAE8 new emoji",
    "\U000E0041 tag char",
    "\ufeffBOM at start",
    "zero\u200bwidth\u200cjoin\u200d",
    "control \x01\x02\x1f chars",
    "\x7f del",
    "한국어 텍스트입니다",
    "日本語のテキストと漢字",
    "中文文本，标点符号。",
    "ไทย ภาษา",
    "हिन्दी पाठ",
    "עברית מימין לשמאל",
    "ꦲꦏ꧀ꦱꦫ ꦗꦮ Javanese",
    "ᚠᚢᚦᚨᚱᚲ runes",
    "0123456789",
    "3.14159265358979323846",
    "1,000,000 and 1.000.000 and 1 000 000",
    "-42 +17 1e-9 0x1F 0b1010 0o777",
    "2026-12-07T15:00:00Z",
    "$12.50 €9,99 £3 ¥500",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "def f(x):\n\treturn {'a': [1, 2, 3], \"b\": None}\n",
    "SELECT * FROM t WHERE a >= 10 AND b <> 'x';",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); }",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
    "<?xml version=\"1.0\"?><root attr='v'/>",
    "https://example.com/path?q=1&r=two#frag",
    "user@example.org, +1 (555) 010-9999",
    "C:\\Program Files\\App\\app.exe",
    "a" * 300,
    "ab" * 150,
    "The quick brown fox jumps over the lazy dog. " * 5,
    "λx. x + 1 ∀ε>0 ∃δ>0 ∑ ∫ √ ∞ ≠ ≤ ≥",
    "→ ← ↑ ↓ ⇒ ⇔ ✓ ✗ ★ ☆ ♠ ♣ ♥ ♦",
    "«quotes» „German“ “curly” ‘single’",
    "ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３",
    "ﬁ ﬂ ﬀ ligature and é vs é",
    "Ǆ ǅ ǆ İ ı ß ẞ",
    "\u0301 combining at start",
    "\ud7ff\ue000\uffff edge code points",
    "mixed 中文 English العربية русский 😀",
]


def corpus():
    with open(CORPUS, encoding="utf-8") as f:
        base = [json.loads(line) for line in f.read().split("\n") if line]
    return base + EXTRA


@pytest.fixture(scope="module")
def oracle():
    from gemma3_ref import SpmTokenizer
    return SpmTokenizer(str(GEMMA))


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    strings = corpus()
    path = tmp_path_factory.mktemp("gemma_tok") / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(s) for s in strings) + "\n", encoding="utf-8")
    return strings, path


def dump(build_dir, corpus_path, *args):
    p = build_dir / "tests" / "helpers" / "tokenize_dump"
    assert p.is_file(), f"{p} is missing: build it (make all)"
    r = subprocess.run([str(p), str(GEMMA), str(corpus_path), *args], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, f"tokenize_dump {args}: {r.stderr}"
    return [json.loads(line) for line in r.stdout.splitlines()]


def agree(strings, rows, want, label):
    assert len(rows) == len(strings)
    bad = [(s, r["ids"], w) for s, r, w in zip(strings, rows, want) if r["ids"] != w]
    print(f"\n{label}: {len(strings) - len(bad)} of {len(strings)} strings identical")
    for s, got, w in bad[:5]:
        print(f"  {s[:60]!r}\n    C  {got[:24]}\n    sp {w[:24]}")
    assert not bad, f"{label}: {len(bad)} strings differ"


def test_ids_identical_with_bos_and_specials(build_dir, oracle, texts):
    strings, path = texts
    assert len(strings) >= 400
    rows = dump(build_dir, path, "--add-special")
    agree(strings, rows, [oracle.encode(s, add_bos=True) for s in strings],
          "gemma3, add_bos + parse_special")
    flat = [i for r in rows for i in r["ids"]]
    # the corpus must exercise what is Gemma's: turn markers, USER_DEFINED
    # whitespace runs and tags, byte fallback, long merges
    assert 105 in flat and 106 in flat, "no <start_of_turn> / <end_of_turn>"
    assert 138 in flat and 140 in flat, "no whitespace-run token"
    assert any(oracle.tokens[i].startswith("<0x") for i in flat), "no byte-fallback token"
    assert any(oracle.tokens[i] == "<table>" for i in flat)


def test_ids_identical_plain_and_round_trip(build_dir, oracle, texts):
    strings, path = texts
    rows = dump(build_dir, path, "--no-parse-special")
    agree(strings, rows, [oracle.encode(s, parse_special=False) for s in strings],
          "gemma3, plain")
    n_rt = 0
    for s, row in zip(strings, rows):
        # a literal U+2581 decodes to a space (sentencepiece's too): no round trip
        if "\u2581" not in s:
            assert row["rt"], f"round trip failed for {s!r}"
            n_rt += 1
        assert bytes.fromhex(row["dec"]).decode("utf-8") == oracle.decode(row["ids"]), s
        assert row["stream"] == row["dec"], f"streamed decode differs for {s!r}"
    print(f"round trip: {n_rt} of {len(strings)} strings")
    assert n_rt == len(strings) - 1
