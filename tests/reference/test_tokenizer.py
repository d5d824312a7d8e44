"""core/text/tokenizer.c against HF `tokenizers`, built from the same vocabulary.

Drives tests/helpers/tokenize_dump over tests/data/tokenizer_corpus.jsonl.

Byte-level BPE: the HF tokenizer is constructed from the tokens and merges
read out of the default model's GGUF (gguf-py), with SmolLM2's pipeline
(tokenizer.json of HuggingFaceTB/SmolLM2-*: no normalizer,
Sequence[Digits(individual_digits), ByteLevel(add_prefix_space=False,
use_regex=True)], BPE without unk/dropout/ignore_merges, ByteLevel decoder,
the control tokens as special added tokens). Every corpus string must give
identical ids, with and without special-token parsing; the C round trip
decode(encode(s)) == s must hold for every string whose bytes all have a
byte-level symbol in the vocabulary; the C decode must equal HF's decode; the
streaming detokenizer must reproduce the decode. The same vocabulary is also
run through the gpt2, llama3 and qwen2 pre-tokenizers against HF pipelines
built from those tokenizer.json regexes.

SentencePiece-style: tests/fixtures/make_spm_fixture.py trains a small
vocabulary, writes it as a llama-model GGUF, and builds its HF twin (the
shape HF's converter gives SentencePiece vocabularies). Same requirements.
"""
import json
import subprocess
import sys
from pathlib import Path

import gguf
import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "data" / "tokenizer_corpus.jsonl"
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
import make_spm_fixture  # noqa: E402

# Regexes as the HF tokenizer.json files of these families write them.
RE_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
RE_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
RE_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def load_corpus():
    with open(CORPUS, encoding="utf-8") as f:
        return [json.loads(line) for line in f.read().split("\n") if line]


@pytest.fixture(scope="module")
def corpus():
    c = load_corpus()
    assert len(c) >= 300
    return c


@pytest.fixture(scope="module")
def dump(build_dir):
    p = build_dir / "tests" / "helpers" / "tokenize_dump"
    assert p.is_file(), f"{p} is missing: build it (make all)"

    def run(model, *args):
        r = subprocess.run([str(p), str(model), str(CORPUS), *args], capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, f"tokenize_dump {args}: {r.stderr}"
        rows = [json.loads(line) for line in r.stdout.splitlines()]
        return rows

    return run


@pytest.fixture(scope="module")
def vocab(model_path):
    r = gguf.GGUFReader(str(model_path))
    f = r.fields
    assert f["tokenizer.ggml.model"].contents() == "gpt2"
    assert f["tokenizer.ggml.pre"].contents() == "smollm"
    tokens = f["tokenizer.ggml.tokens"].contents()
    types = f["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ")) for m in f["tokenizer.ggml.merges"].contents()]
    return tokens, types, merges


def gpt2_bytes_to_unicode():
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1))
          + list(range(ord("\u00ae"), ord("\u00ff") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def hf_bytelevel(vocab, pre, parse_special=True):
    tokens, types, merges = vocab
    ids = {t: i for i, t in enumerate(tokens)}
    ignore_merges = pre == "llama3"
    tok = Tokenizer(models.BPE(vocab=ids, merges=merges, ignore_merges=ignore_merges))
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)
    if pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    elif pre == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                                     use_regex=True)
    else:
        regex = {"llama3": RE_LLAMA3, "qwen2": RE_QWEN2}[pre]
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False), bl])
    tok.decoder = decoders.ByteLevel()
    if parse_special:
        tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                for i in range(len(tokens)) if types[i] == 3])
    return tok


def compare(corpus, rows, hf, label):
    assert len(rows) == len(corpus), f"{label}: {len(rows)} outputs for {len(corpus)} strings"
    bad = []
    for s, row in zip(corpus, rows):
        want = hf.encode(s).ids
        if row["ids"] != want:
            bad.append((s, want, row["ids"]))
    agree = len(corpus) - len(bad)
    print(f"\n{label}: {agree}/{len(corpus)} identical")
    msg = "\n".join(f"  {s!r:.60}\n    hf {w[:24]}\n    c  {c[:24]}" for s, w, c in bad[:10])
    assert not bad, f"{label}: {len(bad)} strings differ\n{msg}"


def check_decode(s, row, hf_text):
    """C decode is raw bytes; HF's decoders replace invalid UTF-8 with U+FFFD
    per maximal invalid subpart, like Python's errors="replace", which is also
    what the streaming detokenizer must emit."""
    dec = bytes.fromhex(row["dec"])
    assert dec.decode("utf-8", errors="replace") == hf_text, f"decode differs for {s!r}"
    stream = bytes.fromhex(row["stream"])
    assert stream == dec.decode("utf-8", errors="replace").encode("utf-8"), \
        f"streaming detokenizer output differs for {s!r}: {stream!r} vs {dec!r}"


def test_smollm_ids_identical_to_hf(corpus, dump, vocab, model_path):
    rows = dump(model_path)
    compare(corpus, rows, hf_bytelevel(vocab, "smollm"), "smollm, parse_special=1")


def test_smollm_ids_identical_without_special_parsing(corpus, dump, vocab, model_path):
    rows = dump(model_path, "--no-parse-special")
    compare(corpus, rows, hf_bytelevel(vocab, "smollm", parse_special=False), "smollm, parse_special=0")
    # control-token texts really were split into ordinary pieces
    i = corpus.index("<|im_start|>")
    assert rows[i]["ids"] != [1] and len(rows[i]["ids"]) > 1


def test_smollm_round_trip_decode_and_stream(corpus, dump, vocab, model_path):
    tokens = set(vocab[0])
    b2u = gpt2_bytes_to_unicode()
    representable = {b for b in range(256) if b2u[b] in tokens}
    hf = hf_bytelevel(vocab, "smollm")
    rows = dump(model_path)
    n_rt = n_expected = 0
    for s, row in zip(corpus, rows):
        data = s.encode("utf-8")
        if all(b in representable for b in data):
            n_expected += 1
            assert row["rt"], f"round trip failed for {s!r}"
            n_rt += 1
        else:
            # a byte without a symbol is dropped (as HF does), so the text cannot come back
            assert not row["rt"], f"{s!r} has unrepresentable bytes but round-tripped"
        check_decode(s, row, hf.decode(row["ids"], skip_special_tokens=False))
    print(f"\nsmollm round trip: {n_rt}/{n_expected} (of {len(corpus)}; the rest hold bytes "
          f"the vocabulary cannot represent)")
    assert n_expected >= len(corpus) - 5


@pytest.mark.parametrize("pre", ["gpt2", "llama3", "qwen2"])
def test_other_pre_tokenizers_identical_to_hf(corpus, dump, vocab, model_path, pre):
    rows = dump(model_path, "--pre", pre)
    compare(corpus, rows, hf_bytelevel(vocab, pre), f"{pre} pre-tokenizer on the SmolLM2 vocabulary")


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    path = tmp_path_factory.mktemp("spm") / "spm.gguf"
    tokens, scores, types = make_spm_fixture.build(str(path))
    return path, tokens, scores, types


def test_spm_ids_identical_to_hf(corpus, dump, spm):
    path, tokens, scores, types = spm
    rows = dump(path, "--add-special")
    compare(corpus, rows, make_spm_fixture.hf_twin(tokens, scores, types), "spm fixture, add_bos + parse_special")
    # the fixture must exercise byte fallback and merges, or the comparison proves little
    flat = [i for r in rows for i in r["ids"]]
    assert any(3 <= i < 259 for i in flat), "no byte-fallback token in the corpus encoding"
    assert any(i >= 259 and len(tokens[i]) > 2 for i in flat)


def test_spm_no_special_round_trip_and_decode(corpus, dump, spm):
    path, tokens, scores, types = spm
    rows = dump(path, "--no-parse-special")
    hf = make_spm_fixture.hf_twin(tokens, scores, types, add_bos=False, parse_special=False)
    compare(corpus, rows, hf, "spm fixture, plain")
    for s, row in zip(corpus, rows):
        assert row["rt"], f"spm round trip failed for {s!r}"
        check_decode(s, row, hf.decode(row["ids"]))
    print(f"\nspm round trip: {len(corpus)}/{len(corpus)}")
