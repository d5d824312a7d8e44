"""The prefix-state cache (docs/API.md "Prefix cache"): chat requests insert
the state at their message boundaries and later requests that start with one
prefill only the rest (usage.prompt_tokens_details.cached_tokens); the
longest cached prefix wins; session creation shares the keys; the cache is
bounded by --prefix-cache-mb with LRU eviction; POST/GET/DELETE /v1/prefixes
pin, list and unpin, with their errors; /metrics counts hits, misses,
evictions, bytes and entries; and greedy outputs are the same token for token
with and without the cache for every attention kind the server offers.

Runs on the tiny fixture model; the DARKFormer kinds load adapters written
for it (test_attn_default.write_adapter: M = I, Λ = 0.1·I)."""
import json

import pytest

from ds_server import MODEL, TINY
from test_attn_default import tiny_info, write_adapter

SYSTEM = "You are a careful assistant who answers briefly. " * 6
OTHER = "You are a pirate who answers in rhymes and riddles. " * 6


def chat(srv, msgs, max_tokens=8, **kw):
    body = {"messages": msgs, "max_tokens": max_tokens, "temperature": 0, "logprobs": True}
    body.update(kw)
    st, r, _ = srv.json("POST", "/v1/chat/completions", body)
    assert st == 200, r
    return r


def cached(r):
    return r["usage"]["prompt_tokens_details"]["cached_tokens"]


def tokens_of(r):
    return [t["token"] for t in r["choices"][0]["logprobs"]["content"]]


def sys_user(system, user):
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def pfx_metrics(srv):
    m = srv.metrics()
    return {k.replace("darkserve_prefix_cache_", ""): v for k, v in m.items()
            if k.startswith("darkserve_prefix_cache_")}


def session_tokens(srv, system):
    """Tokens of `system` rendered as a session's first message (the
    session keeps the last one pending: the cache key is one shorter)."""
    st, s, _ = srv.json("POST", "/v1/sessions", {"system": system})
    assert st == 201, s
    return s


def test_hits_misses_and_cached_tokens(servers):
    srv = servers(model=TINY)
    m0 = pfx_metrics(srv)
    assert m0["hits_total"] == 0 and m0["misses_total"] == 0 and m0["entries"] == 0
    a = chat(srv, sys_user(SYSTEM, "What is two plus two?"))
    assert cached(a) == 0
    m1 = pfx_metrics(srv)
    assert m1["misses_total"] == 1 and m1["hits_total"] == 0
    # the boundaries after the system message and after the user message
    assert m1["entries"] == 2 and m1["inserts_total"] == 2 and m1["bytes"] > 0
    st, lst, _ = srv.json("GET", "/v1/prefixes")
    assert st == 200 and len(lst["data"]) == 2
    assert lst["bytes"] == m1["bytes"] == sum(e["bytes"] for e in lst["data"])
    assert not any(e["pinned"] for e in lst["data"])
    sys_key = min(e["tokens"] for e in lst["data"])
    # another question after the same system prompt: the system prefix hits
    b = chat(srv, sys_user(SYSTEM, "Name a fruit."))
    assert cached(b) == sys_key
    assert b["usage"]["prompt_tokens"] > sys_key
    m2 = pfx_metrics(srv)
    assert m2["hits_total"] == 1 and m2["misses_total"] == 1
    # a session created with the same system prompt uses the same key: it
    # feeds all but its last token, exactly the cached prefix
    s = session_tokens(srv, SYSTEM)
    assert s["tokens"] == sys_key + 1 and s["cached_tokens"] == sys_key
    assert pfx_metrics(srv)["hits_total"] == 2
    # a different system prompt misses
    c = chat(srv, sys_user(OTHER, "Name a fruit."))
    assert cached(c) == 0
    assert pfx_metrics(srv)["misses_total"] == 2
    # a session created first seeds the cache for chats
    s2 = session_tokens(srv, OTHER + " Second.")
    assert s2["cached_tokens"] == 0
    d = chat(srv, sys_user(OTHER + " Second.", "Hi"))
    assert cached(d) == s2["tokens"] - 1


def test_longest_prefix_wins(servers):
    srv = servers(model=TINY)
    first = sys_user(SYSTEM, "Tell me about the sea.")
    chat(srv, first)
    st, lst, _ = srv.json("GET", "/v1/prefixes")
    keys = sorted(e["tokens"] for e in lst["data"])
    assert len(keys) == 2
    # the conversation continues: both cached prefixes start it, the
    # longer one (after the user message) is used
    follow = first + [{"role": "assistant", "content": "It is large."},
                      {"role": "user", "content": "And the sky?"}]
    r = chat(srv, follow)
    assert cached(r) == keys[1]
    # a sibling question shares only the system prefix
    r2 = chat(srv, sys_user(SYSTEM, "Tell me about trees."))
    assert cached(r2) == keys[0]


def outputs(srv, with_session=True):
    """A fixed sequence of greedy requests -> their token lists."""
    out = []
    for q in ["Say something.", "Count to five.", "Say something."]:
        r = chat(srv, sys_user(SYSTEM, q), max_tokens=12)
        out.append((tokens_of(r), r["choices"][0]["message"]["content"]))
    st, r, _ = srv.json("POST", "/v1/completions",
                        {"prompt": SYSTEM + " The end", "max_tokens": 12, "temperature": 0})
    assert st == 200, r
    out.append(r["choices"][0]["text"])
    if with_session:
        s = session_tokens(srv, SYSTEM)
        st, g, _ = srv.json("POST", f"/v1/sessions/{s['id']}/generate",
                            {"messages": [{"role": "user", "content": "Say something."}],
                             "max_tokens": 12, "temperature": 0, "stream": False})
        assert st == 200, g
        out.append(g["tokens"])
    return out


def kind_args(kind, tmp_path):
    if kind in ("darkformer", "darkformer-is"):  # M = I; Λ = 0.1·I
        adapter = write_adapter(str(tmp_path / f"{kind}.gguf"), tiny_info()["fingerprint"],
                                scale=1.0 if kind == "darkformer" else 0.1, kind=kind)
        return kind, ["--adapter", adapter]
    if kind == "hybrid":  # performer with exact sinks + window
        return "performer", ["--window", "8", "--sinks", "2"]
    return kind, []


@pytest.mark.parametrize("kind", ["exact", "performer", "hybrid", "darkformer", "darkformer-is"])
def test_same_outputs_with_and_without_cache(servers, tmp_path, kind):
    attn, args = kind_args(kind, tmp_path)
    warm = servers(model=TINY, attn=attn, args=args)
    cold = servers(model=TINY, attn=attn, args=args + ["--prefix-cache-mb", "0"])
    a, b = outputs(warm), outputs(cold)
    assert a == b
    m = pfx_metrics(warm)
    # the second and third chats and the session hit (the plain-text
    # completion shares no message boundary with them)
    assert m["hits_total"] == 3, m
    assert pfx_metrics(cold)["hits_total"] == 0
    # the repeated question was served from its own boundary: all of its
    # prompt but the generation prompt came from the cache
    r = chat(warm, sys_user(SYSTEM, "Say something."), max_tokens=12)
    assert tokens_of(r) == a[0][0]
    assert cached(r) > 0


def test_eviction_under_a_small_budget(servers):
    srv = servers(model=TINY, attn="performer", args=["--prefix-cache-mb", "1"])
    chat(srv, sys_user("System zero. " * 8, "q"))
    st, lst, _ = srv.json("GET", "/v1/prefixes")
    one = lst["data"][0]["bytes"]
    assert lst["budget_bytes"] == 1 << 20
    fits = (1 << 20) // one
    for i in range(1, fits):  # two entries per request: far past the budget
        chat(srv, sys_user(f"System {i}. " * 8, "q"))
    m = pfx_metrics(srv)
    assert m["evictions_total"] > 0
    assert m["bytes"] <= 1 << 20 and m["entries"] <= fits
    # the oldest prefix went first: its system prompt misses now
    r = chat(srv, sys_user("System zero. " * 8, "another"))
    assert cached(r) == 0
    # the newest is still there
    r = chat(srv, sys_user(f"System {fits - 1}. " * 8, "another"))
    assert cached(r) > 0


def test_pinned_prefixes_and_errors(servers):
    srv = servers(model=TINY)
    for body, status in [("{", 400), ("{}", 400), ('{"text": 5}', 400),
                         ('{"text": "a", "messages": []}', 400), ('{"text": "a"}', 400)]:
        st, r, _ = srv.json("POST", "/v1/prefixes", body.encode(),
                            headers={"Content-Type": "application/json"})
        assert st == status, (body, r)
        assert "error" in r
    st, p, _ = srv.json("POST", "/v1/prefixes", {"messages": [{"role": "system",
                                                              "content": SYSTEM}]})
    assert st == 201, p
    assert p["id"].startswith("pfx_") and len(p["id"]) == 28 and p["pinned"] is True
    assert p["tokens"] > 16 and p["bytes"] > 0
    # pinning it again gives the same entry (200: it was pinned already)
    st, p2, _ = srv.json("POST", "/v1/prefixes", {"messages": [{"role": "system",
                                                               "content": SYSTEM}]})
    assert st == 200 and p2["id"] == p["id"]
    st, lst, _ = srv.json("GET", "/v1/prefixes")
    assert [e["id"] for e in lst["data"] if e["pinned"]] == [p["id"]]
    assert lst["pinned_bytes"] == p["bytes"]
    # a request naming it starts from it
    r = chat(srv, sys_user(SYSTEM, "Hello"), prefix=p["id"])
    assert cached(r) == p["tokens"]
    # ... also a session
    st, s, _ = srv.json("POST", "/v1/sessions", {"system": SYSTEM, "prefix": p["id"]})
    assert st == 201 and s["cached_tokens"] == p["tokens"]
    # errors: a prompt that does not start with it, an unknown id, a
    # malformed one, together with a session
    st, e, _ = srv.json("POST", "/v1/chat/completions",
                        {"messages": sys_user(OTHER, "Hello"), "max_tokens": 2,
                         "prefix": p["id"]})
    assert st == 400 and e["error"]["param"] == "prefix", e
    st, e, _ = srv.json("POST", "/v1/sessions", {"system": OTHER, "prefix": p["id"]})
    assert st == 400 and e["error"]["param"] == "prefix", e
    st, e, _ = srv.json("POST", "/v1/completions",
                        {"prompt": "x", "max_tokens": 2, "prefix": "pfx_" + "0" * 24})
    assert st == 404 and e["error"]["code"] == "prefix_not_found", e
    st, e, _ = srv.json("POST", "/v1/completions",
                        {"prompt": "x", "max_tokens": 2, "prefix": "nope"})
    assert st == 400 and e["error"]["param"] == "prefix", e
    st, sess, _ = srv.json("POST", "/v1/sessions", {})
    st, e, _ = srv.json("POST", "/v1/chat/completions",
                        {"messages": sys_user(SYSTEM, "Hi"), "max_tokens": 2,
                         "prefix": p["id"], "session": sess["id"]})
    assert st == 400 and e["error"]["param"] == "prefix", e
    # a text prefix on /v1/completions
    st, t, _ = srv.json("POST", "/v1/prefixes", {"text": OTHER})
    assert st == 201, t
    st, r, _ = srv.json("POST", "/v1/completions",
                        {"prompt": OTHER + " And so", "max_tokens": 4, "temperature": 0,
                         "prefix": t["id"]})
    assert st == 200 and cached(r) == t["tokens"], r
    # unpin: 200 once, then 404; the entry stays (unpinned, evictable)
    st, d, _ = srv.json("DELETE", f"/v1/prefixes/{p['id']}")
    assert st == 200 and d["pinned"] is False and d["id"] == p["id"]
    st, d, _ = srv.json("DELETE", f"/v1/prefixes/{p['id']}")
    assert st == 404 and d["error"]["code"] == "prefix_not_found"
    st, d, _ = srv.json("DELETE", "/v1/prefixes/pfx_" + "1" * 24)
    assert st == 404
    st, lst, _ = srv.json("GET", "/v1/prefixes")
    assert p["id"] in [e["id"] for e in lst["data"]]
    assert lst["pinned_bytes"] == t["bytes"]


def test_pinned_bytes_are_bounded(servers):
    """Pins fill the budget, then the next one is refused with 507 and
    nothing pinned before is lost; unpinned entries never push pins out."""
    srv = servers(model=TINY, attn="performer", args=["--prefix-cache-mb", "1"])
    pinned = []
    for i in range(200):
        st, p, _ = srv.json("POST", "/v1/prefixes", {"text": f"Document number {i}. " * 4})
        if st != 201:
            assert st == 507 and p["error"]["code"] == "prefix_cache_full", p
            break
        pinned.append(p)
    else:
        pytest.fail("never refused")
    assert len(pinned) >= 1
    assert sum(p["bytes"] for p in pinned) <= 1 << 20
    # chats cannot insert next to a full pinned budget, nor evict the pins
    chat(srv, sys_user(SYSTEM, "q"))
    st, lst, _ = srv.json("GET", "/v1/prefixes")
    assert sorted(e["id"] for e in lst["data"] if e["pinned"]) == sorted(p["id"] for p in pinned)
    assert lst["bytes"] <= 1 << 20
    # unpinning one makes room again
    st, _, _ = srv.json("DELETE", f"/v1/prefixes/{pinned[0]['id']}")
    assert st == 200
    st, p, _ = srv.json("POST", "/v1/prefixes", {"text": "A new document. " * 4})
    assert st == 201, p


def test_disabled_cache(servers):
    srv = servers(model=TINY, args=["--prefix-cache-mb", "0"])
    for _ in range(2):
        r = chat(srv, sys_user(SYSTEM, "Hello"))
        assert cached(r) == 0
    st, s, _ = srv.json("POST", "/v1/sessions", {"system": SYSTEM})
    assert st == 201 and s["cached_tokens"] == 0
    st, lst, _ = srv.json("GET", "/v1/prefixes")
    assert st == 200 and lst["data"] == [] and lst["budget_bytes"] == 0
    st, e, _ = srv.json("POST", "/v1/prefixes", {"text": SYSTEM})
    assert st == 507 and e["error"]["code"] == "prefix_cache_full"
    st, e, _ = srv.json("POST", "/v1/chat/completions",
                        {"messages": sys_user(SYSTEM, "Hi"), "max_tokens": 2,
                         "prefix": "pfx_" + "0" * 24})
    assert st == 404
    m = pfx_metrics(srv)
    assert m["hits_total"] == 0 and m["entries"] == 0 and m["bytes"] == 0


def test_streamed_usage_reports_cached_tokens(servers):
    srv = servers(model=TINY)
    chat(srv, sys_user(SYSTEM, "One"))
    st, _, raw = srv.request("POST", "/v1/chat/completions", json.dumps(
        {"messages": sys_user(SYSTEM, "Two"), "max_tokens": 4, "stream": True,
         "stream_options": {"include_usage": True}}).encode(),
        headers={"Content-Type": "application/json"})
    assert st == 200
    chunks = [json.loads(l[6:]) for l in raw.decode().splitlines()
              if l.startswith("data: {")]
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert len(usage) == 1 and usage[0]["prompt_tokens_details"]["cached_tokens"] > 0


SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def test_default_system_prompt_is_shared(servers):
    """A chat without a system message is rendered with the template's
    default one (the real model's: SmolLM2's), the same for every such
    request: its end is a boundary, so another conversation starts from it
    (that block's tokens less the last). The prefill of a cold request ends
    a chunk at the same boundary, so its reply and logprobs are, bit for
    bit, those of the same request served from the cache."""
    srv = servers(model=MODEL, name="real-warm")
    cold = servers(model=MODEL, name="real-cold")
    first = chat(srv, [{"role": "user", "content": "What is 2+2?"}])
    assert cached(first) == 0
    st, tk, _ = srv.json("POST", "/tokenize", {
        "text": f"<|im_start|>system\n{SMOLLM2_DEFAULT_SYSTEM}<|im_end|>\n"})
    assert st == 200, tk
    block = len(tk["tokens"])
    assert block >= 16, tk
    msgs = [{"role": "user", "content": "Say hello."}]
    r, c = chat(srv, msgs, max_tokens=16), chat(cold, msgs, max_tokens=16)
    assert cached(r) == block - 1 and cached(c) == 0, (r["usage"], c["usage"], block)
    assert r["choices"][0]["logprobs"] == c["choices"][0]["logprobs"]
    assert cached(chat(cold, [{"role": "user", "content": "Name a color."}])) == block - 1
    # a conversation with its own system message does not start with it
    r = chat(srv, sys_user("You are terse.", "Name a color."))
    assert cached(r) == 0, r["usage"]


def wait_for(pred, timeout=30.0):
    import time
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def test_snapshots_in_flight_are_bounded_and_given_back(servers):
    """Snapshots reserve their size in the cache while in flight and give it
    back when they go in; eight requests at once sharing a system prompt
    copy it once (one insert, the others hit it afterwards); a client that
    disconnects mid-prompt gives its reservation back too."""
    import socket
    import threading
    srv = servers(model=TINY)
    out = [None] * 8

    def one(i):
        out[i] = chat(srv, sys_user(SYSTEM, f"question number {i} " * 3))

    ts = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert all(out)
    m = pfx_metrics(srv)
    assert m["reserved_bytes"] == 0, m
    # the shared system boundary went in once; each request's whole prompt too
    sys_only = srv.json("POST", "/v1/chat/completions", {
        "messages": sys_user(SYSTEM, "another question"), "max_tokens": 1})[1]
    assert cached(sys_only) > 0
    assert m["inserts_total"] <= 1 + 8, m
    # a client gone before its prompt is absorbed: nothing stays reserved
    body = json.dumps({"messages": sys_user(OTHER, "x " * 1500), "max_tokens": 4,
                       "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    s.close()
    assert wait_for(lambda: pfx_metrics(srv)["reserved_bytes"] == 0), pfx_metrics(srv)
    r = chat(srv, sys_user(OTHER, "y"))
    assert r["choices"][0]["message"]["content"] is not None


def test_entries_count_the_bytes_their_states_hold(servers):
    """The cache counts an entry at the bytes its state has written
    (core_attn_state_bytes_held), not at the state's capacity: with the
    default model and attention, a short chat's system-prompt snapshot holds
    ~2 of its 9.4 MB, so the default 64 MiB keeps over 20 of them where it
    kept 7 at capacity, and never more bytes than its budget."""
    srv = servers(model=MODEL, attn=None)
    for i in range(40):
        chat(srv, sys_user(f"You are assistant number {i}. Answer briefly.", "Hi."),
             max_tokens=2)
    st, lst, _ = srv.json("GET", "/v1/prefixes")
    assert st == 200, lst
    sizes = [e["bytes"] for e in lst["data"]]
    budget = lst["budget_bytes"]
    assert budget == 64 << 20 and sum(sizes) == lst["bytes"] <= budget, lst
    # the whole state is ~9.4 MB; a ~20-token snapshot holds under 4 MB
    assert sizes and max(sizes) < 4_000_000, sizes
    m = pfx_metrics(srv)
    assert m["evictions_total"] > 0, m  # 40 snapshots: the budget binds
    assert len(sizes) > 20, (len(sizes), sizes)
    assert m["entries"] == len(sizes) and m["bytes"] == lst["bytes"], m
