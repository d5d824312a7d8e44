"""One byte budget for all attention state (--max-state-memory).

Sessions in memory and the states requests in flight may grow to (n copies
for n choices) share the budget; a request that does not fit is refused
before anything is allocated: 429 with Retry-After while others hold the
memory, 400 when it could never fit. The tiny model with exact attention
makes the sizes easy to reason about: a full 512-token KV cache is 3 layers
x 512 x 2 KV heads x 16 x 2 (K, V) x 4 bytes = 393 KB.
"""
from ds_server import MODEL, TINY, wait_for

TEXT = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(60))

BUDGET = ["--max-state-memory", "1M"]
WORDS = " ".join(f"w{i}" for i in range(300))


def test_a_request_larger_than_the_whole_budget_is_400(servers):
    s = servers(model=TINY, args=BUDGET)
    # 16 choices that may each grow to the full context: ~6 MB > 1 MB
    st, obj, _ = s.post("/v1/completions",
                        {"prompt": "hello", "n": 16, "max_tokens": 400})
    assert st == 400, obj
    assert obj["error"]["code"] == "state_memory_exceeded", obj
    assert "--max-state-memory" in obj["error"]["message"]
    # a small one runs
    st, obj, _ = s.post("/v1/completions", {"prompt": "hello", "n": 2, "max_tokens": 8})
    assert st == 200, obj
    assert len(obj["choices"]) == 2


def test_requests_in_flight_and_sessions_share_the_budget(servers):
    """Real model, exact attention: a state that may grow to 400+ tokens is
    bounded by 2 x 826 tokens x 46 KB = 38 MB (the cache doubles). With
    100 MB, one streamed request with n=2 holds ~76 MB while it runs; a
    second one gets 429 until the first ends. An idle session in memory
    does not block a request: it is moved to disk to make way."""
    s = servers(model=MODEL, attn="exact", args=["--max-state-memory", "100M"])
    st, obj, _ = s.post("/v1/sessions", {"system": TEXT})
    assert st == 201, obj
    sid = obj["id"]
    assert s.metrics()['darkserve_sessions{where="memory"}'] == 1
    body = {"prompt": "Once upon a time", "n": 2, "max_tokens": 400, "stream": True,
            "temperature": 1.0, "seed": 1}
    c, r = s.open_stream("/v1/completions", body)
    try:
        assert r.status == 200
        r.readline()  # the first bytes: the request is admitted and running
        st, hd, raw = s.request("POST", "/v1/completions", dict(body, stream=False))
        assert st == 429, raw
        assert hd.get("retry-after") == "1", hd
        assert b"state_memory_full" in raw, raw
        # the idle session made way for the running request (written, freed)
        assert wait_for(lambda: s.metrics()['darkserve_sessions{where="memory"}'] == 0, 30)
    finally:
        c.close()
    # the first request's memory comes back once it ends (cancelled here):
    # 2 x 2 x 305 tokens (~57 MB) fit only then
    ok = wait_for(lambda: s.request("POST", "/v1/completions",
                                    dict(body, stream=False, max_tokens=300))[0] == 200, 120, 0.2)
    assert ok
    st, obj, _ = s.json("GET", f"/v1/sessions/{sid}")  # still there, from disk
    assert st == 200, obj
