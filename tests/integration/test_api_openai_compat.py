"""OpenAI compatibility details that clients of other servers rely on
: the routes without the /v1 prefix, and system_fingerprint.

The official `openai` client is pointed at a base URL without /v1; answers
on the aliases are compared with the /v1 routes' answers for the same seed.
"""
import re

import openai

from ds_server import TINY, sse_json

FP = re.compile(r"^fp_[0-9a-f]{16}$")


def client(srv, base):
    return openai.OpenAI(base_url=srv.url(base), api_key="unused", max_retries=0, timeout=300)


# ---------------------------------------------------------------- aliases


def test_openai_client_without_v1(tiny):
    c = client(tiny, "")
    ids = [m.id for m in c.models.list().data]
    assert ids == [m.id for m in client(tiny, "/v1").models.list().data]
    kw = dict(model=ids[0], max_tokens=8, temperature=0.9, seed=5)
    r = c.chat.completions.create(messages=[{"role": "user", "content": "Hi"}], **kw)
    r1 = client(tiny, "/v1").chat.completions.create(
        messages=[{"role": "user", "content": "Hi"}], **kw)
    assert r.object == "chat.completion"
    assert r.choices[0].message.content == r1.choices[0].message.content
    assert r.usage.completion_tokens == r1.usage.completion_tokens
    t = c.completions.create(prompt="Once upon a time", **kw)
    t1 = client(tiny, "/v1").completions.create(prompt="Once upon a time", **kw)
    assert t.object == "text_completion"
    assert t.choices[0].text == t1.choices[0].text
    streamed = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        messages=[{"role": "user", "content": "Hi"}], stream=True, **kw) if ch.choices)
    assert streamed == r.choices[0].message.content


def test_aliases_share_validation_and_methods(tiny):
    st, r, _ = tiny.post("/chat/completions", {"messages": []})
    assert st == 400 and r["error"]["param"] == "messages"
    st, r, _ = tiny.post("/completions", {"prompt": "x", "temperature": 5})
    assert st == 400 and r["error"]["param"] == "temperature"
    st, hd, _ = tiny.request("GET", "/chat/completions")
    assert st == 405 and "POST" in hd["allow"]
    st, hd, _ = tiny.request("POST", "/models", {})
    assert st == 405 and "GET" in hd["allow"]
    assert tiny.json("GET", "/models")[1] == tiny.json("GET", "/v1/models")[1]


# ------------------------------------------------------ system_fingerprint


def test_system_fingerprint_everywhere(tiny):
    c = client(tiny, "/v1")
    model = c.models.list().data[0].id
    r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                  max_tokens=4)
    fp = r.system_fingerprint
    assert FP.match(fp), fp
    t = c.completions.create(model=model, prompt="Hello", max_tokens=4)
    assert t.system_fingerprint == fp
    chunks = list(c.chat.completions.create(model=model, max_tokens=4, stream=True,
                                            stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": "Hi"}]))
    assert chunks and all(ch.system_fingerprint == fp for ch in chunks)
    st, hd, raw = tiny.request("POST", "/v1/completions",
                               {"prompt": "Hello", "max_tokens": 4, "stream": True})
    evs, done = sse_json(raw)
    assert st == 200 and done and evs
    assert all(e["system_fingerprint"] == fp for e in evs)


def _fp(srv):
    st, r, _ = srv.post("/v1/completions", {"prompt": "a", "max_tokens": 1})
    assert st == 200, r
    return r["system_fingerprint"]


def test_system_fingerprint_follows_the_configuration(servers):
    """Same binary, model and attention configuration: the same value, also
    after a restart; another attention configuration: another value."""
    a = servers(model=TINY, attn="performer", args=["--features", "32"])
    fa = _fp(a)
    a.stop()
    a.start()
    assert _fp(a) == fa
    b = servers(model=TINY, attn="performer", args=["--features", "64"])
    c = servers(model=TINY, attn="exact")
    fb, fc = _fp(b), _fp(c)
    assert FP.match(fa) and FP.match(fb) and FP.match(fc)
    assert len({fa, fb, fc}) == 3
