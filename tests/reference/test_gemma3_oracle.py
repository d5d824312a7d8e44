"""The C Gemma 3 forward (core/model.c, exact attention) against the float64
numpy oracle (gemma3_ref.Gemma3Ref), on the real Gemma 3 270M GGUF.

The same checks and tolerances as the SmolLM2 oracle (test_model_oracle.py,
whose helpers run logits_dump and compare): logits at every compared
position within REL_TOL (f32 prompt rows) or REL_TOL_Q8 (8-bit decode rows)
of the largest |logit| there, the argmax the oracle's (or, at 8-bit
positions, a near-tie of it), and a greedy continuation checked by teacher
forcing. Three prompts: the short one, a chat turn with Gemma's turn
markers, and a 600-token text (past the 512-token sliding window, prefilled
in uneven chunks), whose logits are compared at every 8th position and at
every one of the last 96 (the oracle's head is costly on 262,144 rows).
The greedy continuation of "The capital of France is" must read " the
capital of the country of France." (llama.cpp's, for this file).

Two tests check the oracle's reading of the file without the C code: the
file's norm weights already hold Gemma's 1 + w (the other reading is far
worse on held-out text), and the sliding window matters past 512 tokens
(the same positions computed with every layer global differ).

Token ids come from sentencepiece (gemma3_ref.SpmTokenizer). The real-model
tests need the model ($DARKSERVE_GEMMA_MODEL, default
models/gemma-3-270m-q4_k_m.gguf, scripts/fetch_gemma.sh) and are skipped
when it is absent; the tiny fixture's test ($DARKSERVE_TINY_GEMMA, default
build/fixtures/tiny_gemma3.gguf, made by `make unit`) always runs.
"""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemma3_ref import Gemma3Ref, SpmTokenizer  # noqa: E402
from test_model_oracle import (DATA, GREEDY_TOL, MAX_TIE_STEPS, REL_TOL, compare,  # noqa: E402
                               q8_positions, run_c)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GEMMA = os.environ.get("DARKSERVE_GEMMA_MODEL",
                       os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf"))
TINY_GEMMA = os.environ.get("DARKSERVE_TINY_GEMMA",
                            os.path.join(os.environ.get("DARKSERVE_BUILD",
                                                        os.path.join(ROOT, "build")),
                                         "fixtures", "tiny_gemma3.gguf"))
needs_gemma = pytest.mark.skipif(not os.path.isfile(GEMMA),
                                 reason=f"{GEMMA} absent (scripts/fetch_gemma.sh)")

N_GREEDY = 24
LONG = 600
CHAT = ("<start_of_turn>user\nWhat is the capital of France? Answer in one sentence."
        "<end_of_turn>\n<start_of_turn>model\n")


@pytest.fixture(scope="module")
def tiny_gemma():
    assert os.path.isfile(TINY_GEMMA), f"tiny gemma3 fixture not found at {TINY_GEMMA} (make unit)"
    return Gemma3Ref(TINY_GEMMA)


@pytest.mark.parametrize("chunk", [0, 13, 1])
def test_tiny_gemma3_matches_oracle(tiny_gemma, chunk, tmp_path):
    """The tiny random-weight gemma3 (tests/fixtures/make_tiny_gemma3.py: a
    window of 8, seven layers) on 60 random tokens: one call, uneven chunks,
    one token at a time (8-bit rows); every position compared."""
    ref = tiny_gemma
    ids = [2] + [int(t) for t in np.random.default_rng(7).integers(7, ref.n_vocab, 59)]
    c_logits, gen, mode = run_c(TINY_GEMMA, ids, tmp_path, greedy=N_GREEDY, chunk=chunk)
    compare(c_logits, ref.forward(ids), f"tiny-gemma3/chunk {chunk}",
            q8_positions(len(ids), chunk, mode == "int8"), tiles=mode == "bf16t")
    check_greedy(ref, ids, gen, f"tiny-gemma3/chunk {chunk}")


@pytest.fixture(scope="module")
def gemma():
    return Gemma3Ref(GEMMA), SpmTokenizer(GEMMA)


def prompts(tok):
    with open(os.path.join(DATA, "heldout.txt"), encoding="utf-8") as f:
        text = f.read()
    long_ids = tok.encode(text, add_bos=True)[:LONG]
    assert len(long_ids) == LONG
    return {
        "short": tok.encode("The capital of France is", add_bos=True),
        "chat": tok.encode(CHAT, add_bos=True),
        "long": long_ids,
    }


def rows_of(which, n):
    if which != "long":
        return np.arange(n)
    return np.unique(np.concatenate([np.arange(0, n, 8), np.arange(n - 96, n)]))


_oracle = {}


def oracle_logits(ref, which, ids, rows):
    if which not in _oracle:
        _oracle[which] = ref.forward(ids, rows=rows)
    return _oracle[which]


def check_greedy(ref, ids, gen, label):
    """Teacher forcing: each C token is the oracle's argmax for the C prefix
    or within GREEDY_TOL of it, at most MAX_TIE_STEPS times."""
    assert len(gen) == N_GREEDY, f"{label}: {len(gen)} greedy tokens"
    seq = list(ids) + list(gen)
    lg = ref.forward(seq[:-1], rows=np.arange(len(ids) - 1, len(seq) - 1))
    scale = np.abs(lg).max(axis=1)
    gap = (lg.max(axis=1) - lg[np.arange(len(gen)), gen]) / scale
    ties = np.nonzero(gap > 0)[0]
    print(f"{label}: greedy steps off the oracle's argmax: {ties.tolist()}")
    assert gap.max() <= GREEDY_TOL, f"{label}: step {int(gap.argmax())} gap {gap.max():.3e}"
    assert len(ties) <= MAX_TIE_STEPS


@needs_gemma
@pytest.mark.parametrize("which", ["short", "chat", "long"])
def test_gemma3_matches_oracle(gemma, which, tmp_path):
    ref, tok = gemma
    ids = prompts(tok)[which]
    chunk = 97 if which == "long" else 0
    c_logits, gen, mode = run_c(GEMMA, ids, tmp_path, greedy=N_GREEDY, chunk=chunk)
    rows = rows_of(which, len(ids))
    q8 = q8_positions(len(ids), chunk, mode == "int8")[rows]
    worst = compare(c_logits[rows], oracle_logits(ref, which, ids, rows), f"gemma3/{which}/{mode}",
                    q8, tiles=mode == "bf16t")
    print(f"gemma3/{which}: max relative logit error {worst:.2e} "
          f"(max abs {np.abs(c_logits[rows] - oracle_logits(ref, which, ids, rows)).max():.3e})")
    check_greedy(ref, ids, gen, f"gemma3/{which}")
    if which == "short":
        text = tok.decode(gen)
        print(f"greedy after 'The capital of France is': {text!r}")
        assert text.startswith(" the capital of the country of France."), text


@needs_gemma
def test_gemma3_decode_path_logits(gemma, tmp_path):
    """The short prompt one token at a time: every position a decode row."""
    ref, tok = gemma
    ids = prompts(tok)["short"]
    c_logits, _, _ = run_c(GEMMA, ids, tmp_path, chunk=1)
    rows = rows_of("short", len(ids))
    compare(c_logits, oracle_logits(ref, "short", ids, rows), "gemma3/short one at a time",
            q8_positions(len(ids), 1))


def nll(logits, ids, rows):
    lg = logits - logits.max(axis=1, keepdims=True)
    lp = lg - np.log(np.exp(lg).sum(axis=1, keepdims=True))
    keep = rows < len(ids) - 1
    return -lp[np.nonzero(keep)[0], np.asarray(ids)[rows[keep] + 1]].mean()


@needs_gemma
def test_gemma3_norm_weights_hold_the_one(gemma):
    """Independent of the C code: the file's norm weights are Gemma's 1 + w
    already (llama.cpp's converter adds it); adding 1 again is far worse."""
    ref, tok = gemma
    ids = prompts(tok)["long"][:200]
    rows = np.arange(len(ids))
    as_stored = nll(ref.forward(ids, rows=rows), ids, rows)
    ref.norm_offset = 1.0
    try:
        plus_one = nll(ref.forward(ids, rows=rows), ids, rows)
    finally:
        ref.norm_offset = 0.0
    print(f"held-out NLL per token: weights as stored {as_stored:.3f}, plus one {plus_one:.3f}")
    assert as_stored < 5.0 and as_stored < plus_one - 1.0


@needs_gemma
def test_gemma3_window_matters_past_512(gemma):
    """The long prompt's last positions change when the local layers see
    the whole context: the comparison above does see the sliding window."""
    ref, tok = gemma
    ids = prompts(tok)["long"]
    rows = np.arange(len(ids) - 8, len(ids))
    windowed = ref.forward(ids, rows=rows)
    window = ref.window
    ref.window = 1 << 40  # local layers keep their RoPE base but see everything
    try:
        glob = ref.forward(ids, rows=rows)
    finally:
        ref.window = window
    rel = (np.abs(windowed - glob).max(axis=1) / np.abs(windowed).max(axis=1)).min()
    print(f"sliding window vs unbounded local layers, last 8 positions: smallest relative change {rel:.2e}")
    assert rel > 10 * REL_TOL
