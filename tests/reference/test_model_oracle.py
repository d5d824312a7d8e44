"""The C Llama forward (core/model.c, exact attention) against the numpy oracle.

For the real default model and the tiny fixture model, on three prompts each
(short, ~200 tokens, chat-formatted): logits at every position agree within
1e-3 of the largest |logit| at that position, the argmax agrees everywhere, and
a 64-token greedy continuation is identical. Token ids come from an HF
`tokenizers` tokenizer built from the GGUF vocabulary (llama_ref.hf_tokenizer),
not from the C tokenizer.

Drives $DARKSERVE_BUILD/tests/helpers/logits_dump; a missing binary or model
is a failure, not a skip.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_ref import LlamaRef, hf_tokenizer  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("DARKSERVE_BUILD", os.path.join(ROOT, "build"))
HELPER = os.path.join(BUILD, "tests", "helpers", "logits_dump")
MODEL = os.environ.get("DARKSERVE_MODEL",
                       os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
TINY = os.environ.get("DARKSERVE_TINY_MODEL", os.path.join(BUILD, "fixtures", "tiny.gguf"))
DATA = os.environ.get("DARKSERVE_DATA", os.path.join(ROOT, "tests", "data"))

REL_TOL = 1e-3
N_GREEDY = 64
CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France? Answer in one "
        "sentence.<|im_end|>\n<|im_start|>assistant\n")


def require(path, what):
    assert os.path.exists(path), f"{what} not found at {path} (build it first)"


def run_c(model, ids, tmp_path, greedy=0, chunk=0):
    """Runs logits_dump; returns (logits [T][V] float32, greedy ids)."""
    require(HELPER, "logits_dump helper")
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text(" ".join(str(i) for i in ids))
    out = tmp_path / "logits.bin"
    cmd = [HELPER, model, "--tokens-file", str(ids_file), "--logits", str(out)]
    if greedy:
        cmd += ["--greedy", str(greedy)]
    if chunk:
        cmd += ["--chunk", str(chunk)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"logits_dump failed: {p.stderr}"
    logits = np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)
    gen = []
    for line in p.stdout.splitlines():
        if line.startswith("greedy:"):
            gen = [int(t) for t in line.split()[1:]]
    return logits, gen


def compare(c_logits, ref_logits, label):
    """Max over positions of max|c - ref| / max|ref|; asserts the tolerance and argmax."""
    assert c_logits.shape == ref_logits.shape, (c_logits.shape, ref_logits.shape)
    err = np.abs(c_logits.astype(np.float64) - ref_logits).max(axis=1)
    scale = np.abs(ref_logits).max(axis=1)
    rel = err / scale
    worst = float(rel.max())
    print(f"{label}: {len(rel)} positions, max relative logit difference {worst:.3e}")
    assert worst <= REL_TOL, f"{label}: position {int(rel.argmax())} differs by {worst:.3e}"
    c_arg = c_logits.argmax(axis=1)
    r_arg = ref_logits.argmax(axis=1)
    bad = np.nonzero(c_arg != r_arg)[0]
    assert len(bad) == 0, f"{label}: argmax differs at positions {bad[:10].tolist()}"
    return worst


_oracle_logits = {}


def oracle_logits(ref, label, ids):
    """ref.forward(ids), computed once per module (the NLL test reuses it)."""
    key = (id(ref), label)
    if key not in _oracle_logits:
        _oracle_logits[key] = ref.forward(ids)
    return _oracle_logits[key]


@pytest.fixture(scope="module")
def real():
    require(MODEL, "default model")
    return LlamaRef(MODEL), hf_tokenizer(MODEL)


@pytest.fixture(scope="module")
def tiny():
    require(TINY, "tiny fixture model")
    return LlamaRef(TINY), hf_tokenizer(TINY)


def long_text():
    with open(os.path.join(DATA, "heldout.txt"), encoding="utf-8") as f:
        return f.read()[:2000]


def prompts(tok):
    long_ids = tok.encode(long_text()).ids[:200]
    assert len(long_ids) == 200
    return {
        "short": tok.encode("The capital of France is").ids,
        "long": long_ids,
        "chat": tok.encode(CHAT).ids,
    }


@pytest.mark.parametrize("which", ["short", "long", "chat"])
def test_real_model_matches_oracle(real, which, tmp_path):
    ref, tok = real
    ids = prompts(tok)[which]
    # The long prompt is prefilled in uneven chunks: chunked prefill must match
    # the oracle's single pass too.
    c_logits, c_gen = run_c(MODEL, ids, tmp_path, greedy=N_GREEDY,
                            chunk=47 if which == "long" else 0)
    compare(c_logits, oracle_logits(ref, which, ids), f"real/{which}")
    r_gen = ref.greedy(ids, N_GREEDY)
    assert c_gen == r_gen, (f"greedy continuation differs:\nC:      {tok.decode(c_gen)!r}\n"
                            f"oracle: {tok.decode(r_gen)!r}")
    if which == "short":
        text = tok.decode(c_gen)
        print(f"greedy after 'The capital of France is': {text!r}")
        assert "Paris" in text


def test_real_model_rope_convention(real):
    """Independent of the C code: the 'normal' pairwise RoPE the C model uses is
    the one these GGUF weights were converted for — held-out text is far more
    likely under it than under the NeoX (halves) rotation."""
    ref, tok = real
    ids = prompts(tok)["long"]

    def nll(rope):
        if rope == "normal":
            lg = oracle_logits(ref, "long", ids)
        else:
            ref.rope = rope
            try:
                lg = ref.forward(ids)
            finally:
                ref.rope = "normal"
        lg = lg - lg.max(axis=1, keepdims=True)
        lp = lg - np.log(np.exp(lg).sum(axis=1, keepdims=True))
        return -lp[np.arange(len(ids) - 1), ids[1:]].mean()

    normal, neox = nll("normal"), nll("neox")
    print(f"held-out NLL per token: normal {normal:.3f}, neox {neox:.3f}")
    assert normal < neox - 1.0


@pytest.mark.parametrize("which", ["short", "long", "chat"])
def test_tiny_model_matches_oracle(tiny, which, tmp_path):
    ref, tok = tiny
    ids = prompts(tok)[which]
    c_logits, c_gen = run_c(TINY, ids, tmp_path, greedy=N_GREEDY,
                            chunk=13 if which == "long" else 0)
    compare(c_logits, ref.forward(ids), f"tiny/{which}")
    assert c_gen == ref.greedy(ids, N_GREEDY)
