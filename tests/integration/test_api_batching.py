"""Concurrency against the real server and the real model: continuous
batching is real (steps with 8 sequences, outputs equal to single-stream
runs), a client that disconnects mid-stream stops its sequence, a full
queue answers 429 with Retry-After."""
import threading

from ds_server import MODEL, sse_json, wait_for

PROMPTS = [
    "Once upon a time, in a small village,",
    "The best way to learn a new language is",
    "In the year 2050, cities will",
    "A recipe for chocolate cake starts with",
    "The history of the Roman Empire",
    "My favourite thing about the ocean is",
    "To build a wooden table, first",
    "Scientists recently discovered that",
]


def stream_tokens(srv, prompt, max_tokens, out, i):
    st, hd, raw = srv.request("POST", "/v1/completions",
                              {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                               "stream": True})
    assert st == 200, raw
    evs, done = sse_json(raw)
    assert done
    out[i] = "".join(e["choices"][0]["text"] for e in evs if e["choices"])


def test_eight_concurrent_streams_share_steps(servers):
    srv = servers(model=MODEL, args=["--max-batch", "8"])
    n_tok = 16
    out = [None] * 8
    threads = [threading.Thread(target=stream_tokens, args=(srv, p, n_tok, out, i))
               for i, p in enumerate(PROMPTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert all(o is not None for o in out), out
    m = srv.metrics()
    eight = m.get('darkserve_engine_steps_by_batch_total{sequences="8"}', 0)
    assert eight > 0, {k: v for k, v in m.items() if "batch" in k}
    # the histogram shows steps above 4 sequences too
    assert m['darkserve_engine_batch_sequences_bucket{le="8"}'] > \
        m['darkserve_engine_batch_sequences_bucket{le="4"}']
    # each stream's text equals its single-stream result
    for i, p in enumerate(PROMPTS):
        single = [None]
        stream_tokens(srv, p, n_tok, single, 0)
        assert single[0] == out[i], (p, single[0], out[i])


def test_disconnect_stops_the_sequence(real):
    m0 = real.metrics()
    cancelled0 = m0.get('darkserve_engine_sequences_finished_total{reason="cancelled"}', 0)
    gen0 = m0.get("darkserve_engine_generated_tokens_total", 0)
    c, resp = real.open_stream("/v1/completions",
                               {"prompt": "Write a very long essay about rivers.",
                                "max_tokens": 400, "temperature": 0, "stream": True})
    assert resp.status == 200
    line = resp.readline()
    while not line.startswith(b"data: "):
        line = resp.readline()
    c.sock.close()  # drop the connection without reading further
    c.close()

    def cancelled():
        m = real.metrics()
        return m.get('darkserve_engine_sequences_finished_total{reason="cancelled"}', 0) > \
            cancelled0 and m.get("darkserve_engine_running_sequences", 1) == 0

    assert wait_for(cancelled, 120, 0.2)
    m = real.metrics()
    # it ended early: far fewer than max_tokens were generated
    assert m["darkserve_engine_generated_tokens_total"] - gen0 < 400
    assert m["darkserve_http_stream_cancels_total"] >= 1


def test_queue_full_429_with_retry_after(servers):
    srv = servers(model=MODEL, args=["--max-batch", "1", "--max-queue", "1"])
    body = {"prompt": "Tell me everything about mountains.", "max_tokens": 300,
            "temperature": 0, "stream": True}
    # one running ...
    c1, r1 = srv.open_stream("/v1/completions", body)
    assert r1.status == 200
    r1.readline()
    # ... one waiting (its headers come at once: the stream opens before the queue moves)
    c2, r2 = srv.open_stream("/v1/completions", body)
    assert r2.status == 200
    # ... the next ones are refused
    try:
        for _ in range(2):
            st, r, hd = srv.post("/v1/completions", dict(body, stream=False))
            assert st == 429, r
            assert r["error"]["type"] == "rate_limit_error"
            assert int(hd["retry-after"]) >= 1
        m = srv.metrics()
        assert m['darkserve_engine_rejected_total{reason="queue_full"}'] >= 2
    finally:
        c1.close()
        c2.close()
    # once the clients are gone the server accepts work again
    assert wait_for(lambda: srv.post("/v1/completions",
                                     {"prompt": "hi", "max_tokens": 1})[0] == 200, 120, 0.5)
