"""The embedding endpoints against a real `darkserve serve`: OpenAI's
/v1/embeddings through the official `openai` client, Ollama's /api/embed
through the official `ollama` client, llama.cpp's /embedding and Ollama's
older /api/embeddings over raw HTTP.

What is checked, and against what:
- the vectors are the model's final hidden states after the final norm: on
  the real model with exact attention, every token's row equals the numpy
  oracle's (tests/reference/llama_ref.py, hidden=True), a reference that
  shares no code with the server;
- pooling and normalization against numpy over the per-token rows
  (pooling "none", no normalization) of the same input;
- an input's vector does not depend on what it was batched with;
- a document far longer than the attention window is embedded whole and in
  constant memory through a linear kind's recurrent state: its per-token
  rows equal, token for token, those of its prefixes (causality through
  the state, chunk by chunk), its first token still moves its last vector,
  and the server's peak memory does not grow with its length;
- every refusal (a field recognized but not honoured, bad values) is a 400
  in the API's own error shape.
"""
import base64
import json
import os
import random
import sys
import threading

import numpy as np
import ollama
import openai
import pytest

from ds_server import MODEL, TINY, Server

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from llama_ref import LlamaRef  # noqa: E402

TINY_D = 64  # the tiny fixture's width (tests/fixtures/make_tiny_model.py)


def oa(srv):
    return openai.OpenAI(base_url=srv.url("/v1"), api_key="unused", max_retries=0, timeout=300)


def rows(srv, content, norm=-1, pooling="none"):
    """/embedding's vectors of one input as a [rows][D] array."""
    st, r, _ = srv.post("/embedding", {"content": content, "pooling": pooling,
                                       "embd_normalize": norm})
    assert st == 200, r
    assert isinstance(r, list) and len(r) == 1 and r[0]["index"] == 0, r
    return np.array(r[0]["embedding"], dtype=np.float64)


def f32(v):
    return np.asarray(v, dtype=np.float32).tolist()


def tokens(srv, text):
    st, r, _ = srv.post("/tokenize", {"text": text, "add_special": True})
    assert st == 200, r
    return r["tokens"]


def openai_error(st, r, status, code, param):
    assert st == status, r
    assert set(r) == {"error"}, r
    assert r["error"]["code"] == code and r["error"]["param"] == param, r
    assert r["error"]["message"], r


# ------------------------------------------------------------ OpenAI shape


def test_openai_client_embeddings_create(tiny):
    c = oa(tiny)
    texts = ["The cat sat on the mat.", "Stock markets fell today.", "hello"]
    # the client asks for base64 unless told otherwise and decodes it
    got = c.embeddings.create(model="tiny", input=texts)
    assert got.object == "list" and got.model == "tiny"
    assert [d.index for d in got.data] == [0, 1, 2]
    n_tok = sum(len(tokens(tiny, t)) for t in texts)
    assert got.usage.prompt_tokens == n_tok and got.usage.total_tokens == n_tok
    flt = c.embeddings.create(model="tiny", input=texts, encoding_format="float")
    for a, b in zip(got.data, flt.data):
        assert len(a.embedding) == TINY_D
        # base64 carries the same float32 values the 9 digits of text give
        assert f32(a.embedding) == f32(b.embedding)
        assert abs(np.linalg.norm(b.embedding) - 1.0) < 1e-5
    # raw base64: little-endian float32
    st, r, _ = tiny.post("/v1/embeddings", {"input": "hello", "encoding_format": "base64"})
    assert st == 200
    v = np.frombuffer(base64.b64decode(r["data"][0]["embedding"]), dtype="<f4")
    assert v.tolist() == f32(flt.data[2].embedding)
    # token ids, one list or several, give what their text gives
    ids = [tokens(tiny, t) for t in texts]
    one = c.embeddings.create(model="tiny", input=ids[0], encoding_format="float")
    assert one.data[0].embedding == flt.data[0].embedding
    many = c.embeddings.create(model="tiny", input=ids, encoding_format="float")
    assert [d.embedding for d in many.data] == [d.embedding for d in flt.data]


def test_batch_does_not_change_a_vector(tiny):
    texts = [f"sentence number {i} about {w}" for i, w in
             enumerate(["rivers", "mountains", "a long afternoon of rain", "x"])]
    alone = [tiny.post("/v1/embeddings", {"input": t})[1]["data"][0]["embedding"]
             for t in texts]
    together = tiny.post("/v1/embeddings", {"input": texts})[1]
    assert [d["embedding"] for d in together["data"]] == alone
    # and requests in flight at once, batched by the engine with each other
    out = [None] * len(texts)

    def run(i):
        out[i] = tiny.post("/v1/embeddings", {"input": texts[i]})[1]["data"][0]["embedding"]
    th = [threading.Thread(target=run, args=(i,)) for i in range(len(texts))]
    for t in th:
        t.start()
    for t in th:
        t.join()
    assert out == alone


# ------------------------------------------------------ pooling, normalizing


def test_pooling_against_the_token_rows(tiny):
    text = "Pooling turns the hidden state of every token into one vector."
    r = rows(tiny, text)  # every token's row, not normalized
    assert r.shape == (len(tokens(tiny, text)), TINY_D)
    mean = rows(tiny, text, pooling="mean")
    last = rows(tiny, text, pooling="last")
    assert mean.shape == last.shape == (1, TINY_D)
    np.testing.assert_allclose(mean[0], r.mean(axis=0), rtol=1e-5, atol=1e-6)
    assert last[0].tolist() == r[-1].tolist()
    # the default is the mean, normalized (Euclidean)
    dflt = np.array(tiny.post("/v1/embeddings", {"input": text})[1]["data"][0]["embedding"])
    np.testing.assert_allclose(dflt, mean[0] / np.linalg.norm(mean[0]), rtol=1e-5, atol=1e-6)
    st, lr, _ = tiny.post("/v1/embeddings", {"input": text, "pooling": "last"})
    np.testing.assert_allclose(lr["data"][0]["embedding"], r[-1] / np.linalg.norm(r[-1]),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("norm", [0, 1, 2, 3, 7])
def test_normalization_modes(tiny, norm):
    text = "normalize me"
    raw = rows(tiny, text, pooling="mean")[0]
    got = rows(tiny, text, norm=norm, pooling="mean")[0]
    if norm == 0:
        want = raw / np.abs(raw).max() * 32760.0
    else:
        want = raw / (np.abs(raw) ** norm).sum() ** (1.0 / norm)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    # pooling none normalizes each token's row on its own
    per = rows(tiny, text, norm=norm)
    raw_rows = rows(tiny, text)
    for g, r in zip(per, raw_rows):
        w = r / np.abs(r).max() * 32760.0 if norm == 0 else \
            r / (np.abs(r) ** norm).sum() ** (1.0 / norm)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6 * np.abs(w).max())


# ---------------------------------------------------------------- Ollama


def test_ollama_client_embed(tiny):
    c = ollama.Client(host=tiny.url(), timeout=300)
    name = c.list().models[0].model
    texts = ["why is the sky blue?", "why is the grass green?"]
    r = c.embed(model=name, input=texts)
    want = tiny.post("/v1/embeddings", {"input": texts})[1]
    assert r.embeddings == [d["embedding"] for d in want["data"]]
    assert r.prompt_eval_count == want["usage"]["prompt_tokens"]
    assert r.model == name
    one = c.embed(model=name, input=texts[0])
    assert one.embeddings == r.embeddings[:1]
    # the older /api/embeddings: one prompt, the vector as it is (no normalization)
    old = c.embeddings(model=name, prompt=texts[0])
    assert old.embedding == rows(tiny, texts[0], pooling="mean")[0].tolist()


def test_ollama_errors(tiny):
    def ollama_error(st, r, status):
        assert st == status and set(r) == {"error"} and r["error"], (st, r)
    ollama_error(*tiny.post("/api/embed", {"model": "nope", "input": "hi"})[:2], 404)
    ollama_error(*tiny.post("/api/embed", {"input": "hi"})[:2], 400)
    ollama_error(*tiny.post("/api/embed", {"model": tiny.model_id})[:2], 400)
    ollama_error(*tiny.post("/api/embed", {"model": tiny.model_id, "input": [1, 2]})[:2], 400)
    ollama_error(*tiny.post("/api/embed", {"model": tiny.model_id, "input": "a",
                                           "dimensions": 8})[:2], 400)
    ollama_error(*tiny.post("/api/embed", {"model": tiny.model_id, "input": "a",
                                           "pooling": "none"})[:2], 400)
    ollama_error(*tiny.post("/api/embed", {"model": tiny.model_id, "input": "a",
                                           "truncate": "yes"})[:2], 400)
    ollama_error(*tiny.post("/api/embeddings", {"model": tiny.model_id, "prompt": ["a"]})[:2], 400)
    # the Ollama routes take any content type, as Ollama does
    st, _, body = tiny.request("POST", "/api/embed",
                               json.dumps({"model": tiny.model_id, "input": "a"}).encode(),
                               {"Content-Type": "application/x-www-form-urlencoded"})
    assert st == 200 and len(json.loads(body)["embeddings"][0]) == TINY_D


# ----------------------------------------------------------------- refusals


def test_refusals(tiny):
    p = tiny.post
    openai_error(*p("/v1/embeddings", {"input": "a", "dimensions": 8})[:2], 400,
                 "unsupported_parameter", "dimensions")
    st, r, _ = p("/v1/embeddings", {"input": "a", "dimensions": TINY_D})
    assert st == 200 and len(r["data"][0]["embedding"]) == TINY_D
    openai_error(*p("/v1/embeddings", {"input": "a", "pooling": "none"})[:2], 400,
                 "unsupported_parameter", "pooling")
    openai_error(*p("/v1/embeddings", {"input": "a", "pooling": "max"})[:2], 400,
                 "invalid_value", "pooling")
    openai_error(*p("/v1/embeddings", {"input": "a", "encoding_format": "int8"})[:2], 400,
                 "invalid_value", "encoding_format")
    openai_error(*p("/v1/embeddings", {"input": "a", "embd_normalize": 65})[:2], 400,
                 "invalid_value", "embd_normalize")
    openai_error(*p("/v1/embeddings", {})[:2], 400, "missing_required_parameter", "input")
    openai_error(*p("/v1/embeddings", {"input": []})[:2], 400, "invalid_value", "input")
    openai_error(*p("/v1/embeddings", {"input": ""})[:2], 400, "invalid_value", "input")
    openai_error(*p("/v1/embeddings", {"input": ["a", ""]})[:2], 400, "invalid_value",
                 "input[1]")
    openai_error(*p("/v1/embeddings", {"input": ["a"] * 65})[:2], 400, "invalid_value", "input")
    openai_error(*p("/v1/embeddings", {"input": [5, 100000]})[:2], 400, "invalid_value",
                 "input[1]")
    openai_error(*p("/v1/embeddings", {"input": [["a"]]})[:2], 400, "invalid_value",
                 "input[0][0]")
    openai_error(*p("/v1/embeddings", {"input": {"a": 1}})[:2], 400, "invalid_value", "input")
    openai_error(*p("/embedding", {"content": "a", "input": "b"})[:2], 400, "invalid_value",
                 "content")
    # pooling none answers at most 8192 token rows
    openai_error(*p("/embedding", {"content": [7] * 8193, "pooling": "none"})[:2], 400,
                 "invalid_value", "pooling")
    # exact attention: the tiny model's 512-token context bounds an input
    st, r, _ = p("/v1/embeddings", {"input": [7] * 600})
    openai_error(st, r, 400, "context_length_exceeded", None)


def test_llama_cpp_shape(tiny):
    st, r, _ = tiny.post("/embeddings", {"content": ["one", [5, 6, 7]]})
    assert st == 200 and [e["index"] for e in r] == [0, 1]
    assert all(len(e["embedding"]) == 1 and len(e["embedding"][0]) == TINY_D for e in r)
    st, r, _ = tiny.post("/embedding", {"input": [5, 6, 7], "pooling": "none"})
    assert st == 200 and len(r[0]["embedding"]) == 3
    # embd_normalize 2 is the default
    assert abs(np.linalg.norm(r[0]["embedding"][0]) - 1.0) < 1e-5


def test_budget_flag(servers):
    srv = servers(model=TINY, args=["--max-prompt-tokens", "16"])
    st, r, _ = srv.post("/v1/embeddings", {"input": ["one", [7] * 17]})
    openai_error(st, r, 400, "context_length_exceeded", "input")


# ------------------------------------------------------- against the oracle


def test_hidden_states_match_the_oracle(servers):
    """Every token's vector on the real model (exact attention, prompt rows
    in f32 or bf16 tiles) against the float64 numpy forward: within 1e-3 of
    the row's largest magnitude, the tolerance of the logits oracle's prompt
    rows (tests/reference/test_model_oracle.py)."""
    srv = servers(model=MODEL)
    text = ("Embeddings of a causal decoder: each token's final hidden state, "
            "after the final norm, sees only the tokens before it.")
    ids = tokens(srv, text)
    got = rows(srv, ids)
    want = LlamaRef(MODEL).forward(ids, hidden=True)
    assert got.shape == want.shape
    err = np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)
    assert err.max() < 1e-3, err
    mean = rows(srv, ids, pooling="mean")[0]
    m = want.mean(axis=0)
    assert np.abs(mean - m).max() / np.abs(m).max() < 1e-3


# ------------------------------------------- long documents, constant memory


def _peak_kb(srv):
    with open(f"/proc/{srv.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_long_document_through_the_recurrent_state(servers):
    """A linear kind (performer, window 16) with 64-token prefill chunks: a
    document hundreds of windows long is read whole, chunk after chunk,
    through the constant-size state."""
    srv = servers(model=TINY, attn="performer", args=["--window", "16", "--prefill-chunk", "64"])
    rng = random.Random(7)
    doc = [rng.randrange(1, 700) for _ in range(3000)]
    full = rows(srv, doc)
    assert full.shape == (3000, TINY_D)
    # token for token the same rows as the prefix alone (the same chunks):
    # each row is the state streamed through everything before it
    for k in (64, 1024, 2944):
        assert rows(srv, doc[:k]).tolist() == full[:k].tolist()
    # the mean and the last token over the whole document, not a window of it
    np.testing.assert_allclose(rows(srv, doc, pooling="mean")[0], full.mean(axis=0),
                               rtol=1e-5, atol=1e-6)
    assert rows(srv, doc, pooling="last")[0].tolist() == full[-1].tolist()
    # not truncated: the first token, ~3000 tokens back (far outside the
    # 16-token window), still moves the last token's vector
    other = [doc[0] % 699 + 1] + doc[1:]
    assert rows(srv, other, pooling="last")[0].tolist() != full[-1].tolist()

    # constant memory: the peak after a 100 000-token document is within a
    # few MiB of the peak after a 10 000-token one (what grows is the
    # request's body and its token list, ~4 bytes of ids a token plus the
    # JSON tree); an exact KV cache of 100 000 tokens would be 73 MiB here
    small = [rng.randrange(1, 700) for _ in range(10000)]
    big = [rng.randrange(1, 700) for _ in range(100000)]
    st, r, _ = srv.post("/v1/embeddings", {"input": small})
    assert st == 200, r
    p1 = _peak_kb(srv)
    st, r, _ = srv.post("/v1/embeddings", {"input": big})
    assert st == 200 and r["usage"]["prompt_tokens"] == 100000, r
    p2 = _peak_kb(srv)
    assert p2 - p1 < 16 * 1024, (p1, p2)
