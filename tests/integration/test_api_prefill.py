"""The prefill of one request is bounded and cancellable (docs/API.md,
"Limits" and "Prefill"): what a request gives the model to read (its
prompts together, a session's pending tokens and new text, a prefix to
pin) is at most --max-prompt-tokens (default 131 072), else 400
context_length_exceeded before any work, on every route that prefills; and
a client that leaves while its prompt is being read cancels that work (a
900 KB POST /v1/prefixes once read for minutes). On the tiny model, whose
tokenizer spends about a token per byte of plain text."""
import json
import socket

import pytest

from ds_server import TINY, wait_for

CANCELLED = 'darkserve_engine_sequences_finished_total{reason="cancelled"}'
PROMPT_TOKENS = "darkserve_engine_prompt_tokens_total"
GENERATED_TOKENS = "darkserve_engine_generated_tokens_total"
BUDGET = 300


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A budget of 300 tokens: texts over it are a few hundred bytes."""
    from ds_server import Server
    s = Server(tmp_path_factory.mktemp("small"), TINY, name="small", attn="performer",
               args=["--max-prompt-tokens", str(BUDGET)])
    yield s
    s.kill()


def over(srv, text):
    """Tokens of text as the server counts them (no special tokens)."""
    st, r, _ = srv.post("/tokenize", {"text": text, "add_special": False})
    assert st == 200, r
    return len(r["tokens"])


def is_budget_error(st, r, param):
    e = r["error"]
    return (st == 400 and e["code"] == "context_length_exceeded" and e["param"] == param
            and "--max-prompt-tokens" in e["message"] and str(BUDGET) in e["message"])


LONG = "the river flows " * 80  # ~650 tokens of the tiny tokenizer
MSGS = [{"role": "user", "content": LONG}]


def test_long_text_is_over_the_budget(small):
    assert over(small, LONG) > BUDGET


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": LONG, "max_tokens": 2}, "prompt"),
    ("/v1/completions", {"prompt": list(range(3, 3 + BUDGET + 1)), "max_tokens": 2}, "prompt"),
    ("/v1/chat/completions", {"messages": MSGS, "max_tokens": 2}, "messages"),
    ("/v1/chat/completions", {"messages": MSGS, "max_tokens": 2, "stream": True}, "messages"),
    ("/v1/prefixes", {"text": LONG}, "text"),
    ("/v1/prefixes", {"messages": MSGS}, "messages"),
])
def test_routes_refuse_over_the_budget(small, path, body, param):
    st, r, _ = small.post(path, body)
    assert is_budget_error(st, r, param), (st, r)


def test_prompts_of_one_request_count_together(small):
    # each fits alone, the two together do not
    half = "the river flows " * 24
    assert BUDGET // 2 < over(small, half) < BUDGET
    st, r, _ = small.post("/v1/completions", {"prompt": half, "max_tokens": 2})
    assert st == 200, r
    st, r, _ = small.post("/v1/completions", {"prompt": [half, half], "max_tokens": 2})
    assert is_budget_error(st, r, "prompt"), r


def test_ollama_routes_refuse_over_the_budget(small):
    st, r, _ = small.post("/api/generate", {"model": "tiny", "prompt": LONG, "stream": False})
    assert st == 400 and "--max-prompt-tokens" in r["error"], r
    st, r, _ = small.post("/api/chat", {"model": "tiny", "messages": MSGS, "stream": False})
    assert st == 400 and "--max-prompt-tokens" in r["error"], r


def test_sessions_refuse_over_the_budget(small):
    st, s, _ = small.post("/v1/sessions", {})
    assert st in (200, 201), s
    sid = s["id"]
    for path, body in ((f"/v1/sessions/{sid}/append", {"text": LONG}),
                       (f"/v1/sessions/{sid}/generate",
                        {"messages": MSGS, "max_tokens": 2, "stream": False})):
        st, r, _ = small.post(path, body)
        assert st == 400 and r["error"]["code"] == "context_length_exceeded", (path, r)
        assert "--max-prompt-tokens" in r["error"]["message"], r
    # the session is as it was: a short append still works
    st, r, _ = small.post(f"/v1/sessions/{sid}/append", {"text": "a short one"})
    assert st == 200, r


def test_default_budget(servers):
    """The default, 131 072 tokens: a text just over it is refused, none
    of it read."""
    srv = servers(model=TINY, attn="performer")
    unit = "the river flows "
    per = over(srv, unit * 100) / 100
    text = unit * int(131072 / per * 1.05)
    assert 131072 < over(srv, text) < 150000
    before = srv.metrics().get(PROMPT_TOKENS, 0)
    st, r, _ = srv.post("/v1/prefixes", {"text": text})
    assert st == 400 and r["error"]["code"] == "context_length_exceeded", r
    assert r["error"]["param"] == "text" and "131072" in r["error"]["message"], r
    assert srv.metrics().get(PROMPT_TOKENS, 0) == before


def _post_and_leave(srv, path, body, started, version="1.1"):
    """Sends body as an HTTP/`version` request, waits until started() (the
    prompt is being read), then closes the socket without reading the
    answer."""
    raw = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    try:
        s.sendall(f"POST {path} HTTP/{version}\r\nHost: t\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
        assert wait_for(started, 120, 0.05), srv.log_text()[-2000:]
    finally:
        s.close()


@pytest.mark.parametrize("version", ["1.1", "1.0"])
@pytest.mark.parametrize("route", ["prefixes", "append", "chat"])
def test_client_that_leaves_cancels_the_prefill(servers, route, version):
    """One prompt token per step, so the prefill of ~60 000 tokens is long;
    the client leaves once it has begun, and the engine ends the job with
    most of the prompt unread (no timing: the counts say it). An HTTP/1.0
    client cannot be sent an interim answer to tell a close from a
    half-close: its hang-up before the answer is taken as leaving."""
    srv = servers(model=TINY, attn="performer", args=["--prefill-chunk", "1"])
    text = "ab " * 20000
    path, body = {
        "prefixes": ("/v1/prefixes", {"text": text}),
        "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}],
                                          "max_tokens": 2}),
    }.get(route, (None, None))
    if route == "append":
        st, s, _ = srv.post("/v1/sessions", {})
        path, body = f"/v1/sessions/{s['id']}/append", {"text": text}
    m0 = srv.metrics()
    c0, p0 = m0.get(CANCELLED, 0), m0.get(PROMPT_TOKENS, 0)
    _post_and_leave(srv, path, body, lambda: srv.metrics().get(PROMPT_TOKENS, 0) > p0, version)

    def ended():
        m = srv.metrics()
        return m.get(CANCELLED, 0) > c0 and m.get("darkserve_engine_running_sequences", 1) == 0
    assert wait_for(ended, 120, 0.2), srv.log_text()[-3000:]
    assert srv.metrics().get(PROMPT_TOKENS, 0) - p0 < 30000
    if route == "prefixes":
        st, r, _ = srv.json("GET", "/v1/prefixes")
        assert st == 200 and not [e for e in r["data"] if e.get("pinned")], r


@pytest.mark.parametrize("version", ["1.1", "1.0"])
def test_client_that_leaves_cancels_a_non_streamed_generation(servers, version):
    """A non-streamed completion of 100 000 tokens (one per step, the end
    of generation banned): the client leaves once tokens are being generated,
    and the engine ends the job long before max_tokens."""
    srv = servers(model=TINY, attn="performer", args=["--max-tokens-limit", "100000"])
    m0 = srv.metrics()
    c0, g0 = m0.get(CANCELLED, 0), m0.get(GENERATED_TOKENS, 0)
    # the tiny model's three special tokens (ids 0-2) all end a generation
    body = {"prompt": "Once upon a time", "max_tokens": 100000,
            "logit_bias": {"0": -100, "1": -100, "2": -100}}
    _post_and_leave(srv, "/v1/completions", body,
                    lambda: srv.metrics().get(GENERATED_TOKENS, 0) > g0, version)

    def ended():
        m = srv.metrics()
        return m.get(CANCELLED, 0) > c0 and m.get("darkserve_engine_running_sequences", 1) == 0
    assert wait_for(ended, 120, 0.2), srv.log_text()[-3000:]
    assert srv.metrics().get(GENERATED_TOKENS, 0) - g0 < 50000


def _half_closed_10(srv, body):
    """An HTTP/1.0 request whose client shuts down its sending side after
    it, then reads until the server closes -> the raw bytes."""
    raw = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=120)
    try:
        s.sendall(f"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
        s.shutdown(socket.SHUT_WR)
        data = b""
        while True:
            part = s.recv(65536)
            if not part:
                return data
            data += part
    finally:
        s.close()


def test_half_closed_http10_client(servers):
    """HTTP/1.0 has no interim answer to probe a FIN with: a half-closed 1.0
    client is taken as gone before its answer (its generation cancelled,
    nothing sent), but once its answer streams the SSE probe tells it apart
    and it gets the whole stream (docs/API.md, Back-pressure and
    disconnects)."""
    srv = servers(model=TINY, attn="performer", args=["--max-tokens-limit", "100000"])
    body = {"prompt": "Once upon a time", "max_tokens": 50, "stream": True}
    data = _half_closed_10(srv, body)
    assert data.startswith(b"HTTP/1.1 200 ") and data.rstrip().endswith(b"data: [DONE]"), data[-200:]
    c0 = srv.metrics().get(CANCELLED, 0)
    # long enough not to end before the FIN is seen
    body = {"prompt": "Once upon a time", "max_tokens": 100000,
            "logit_bias": {"0": -100, "1": -100, "2": -100}}
    assert _half_closed_10(srv, body) == b""
    assert wait_for(lambda: srv.metrics().get(CANCELLED, 0) > c0, 60, 0.1)
