"""Ollama's API against a real `darkserve serve`, through the
official `ollama` Python client where it can go, and raw HTTP for the shapes
and errors the client hides.

Expected texts come from darkserve itself under another route (the OpenAI
endpoints with the same sampling settings and seed, /v1/completions with the
same token ids), never from hard-coded model outputs.
"""
import json
import os
import subprocess
from datetime import datetime

import ollama
import pytest

from ds_server import BIN, MODEL, TINY, TINY_GEMMA

MAX_CONTEXT = 65536  # PROTO_OLLAMA_MAX_CONTEXT


def client(srv):
    return ollama.Client(host=srv.url(), timeout=300)


@pytest.fixture(scope="module")
def model(tiny):
    return client(tiny).list().models[0].model


def ndjson(raw):
    return [json.loads(l) for l in raw.decode().split("\n") if l.strip()]


def is_ollama_error(st, r, status):
    """{"error": "<message>"} and nothing else, with this status."""
    return st == status and isinstance(r, dict) and set(r) == {"error"} and \
        isinstance(r["error"], str) and r["error"]


# ------------------------------------------------------------ generate, chat


def test_generate_streamed_and_not(tiny, model):
    c = client(tiny)
    opts = {"temperature": 0.9, "seed": 7, "num_predict": 12}
    r = c.generate(model=model, prompt="Once upon a time", options=opts)
    assert r.done and r.done_reason in ("stop", "length")
    assert r.model == model
    assert datetime.fromisoformat(r.created_at.replace("Z", "+00:00").split(".")[0] + "+00:00")
    assert 1 <= r.eval_count <= 12 and r.prompt_eval_count > 0
    assert r.total_duration > 0 and r.eval_duration >= 0
    assert isinstance(r.response, str)
    assert r.context and all(isinstance(t, int) for t in r.context)
    # the context is the prompt as fed, then the reply's tokens
    assert len(r.context) == r.prompt_eval_count + r.eval_count - (r.done_reason == "stop")

    parts = list(c.generate(model=model, prompt="Once upon a time", options=opts, stream=True))
    assert parts[-1].done and all(not p.done for p in parts[:-1])
    assert "".join(p.response for p in parts) == r.response
    assert parts[-1].context == r.context
    assert parts[-1].eval_count == r.eval_count
    assert parts[-1].done_reason == r.done_reason


def test_chat_streamed_and_not(tiny, model):
    c = client(tiny)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    opts = {"temperature": 0.8, "seed": 3, "num_predict": 10}
    r = c.chat(model=model, messages=msgs, options=opts)
    assert r.message.role == "assistant" and isinstance(r.message.content, str)
    assert r.done and r.done_reason in ("stop", "length") and 1 <= r.eval_count <= 10
    parts = list(c.chat(model=model, messages=msgs, options=opts, stream=True))
    assert parts[-1].done and parts[-1].message.content == ""
    assert "".join(p.message.content for p in parts) == r.message.content
    assert all(p.message.role == "assistant" for p in parts)


def test_stream_is_the_default_and_ndjson(tiny, model):
    body = {"model": model, "prompt": "Hello", "options": {"num_predict": 6, "seed": 1}}
    st, hd, raw = tiny.request("POST", "/api/generate", body)
    assert st == 200 and hd["content-type"].startswith("application/x-ndjson")
    lines = ndjson(raw)
    assert lines[-1]["done"] is True and all(l["done"] is False for l in lines[:-1])
    st, hd, raw = tiny.request("POST", "/api/generate", dict(body, stream=False))
    assert st == 200 and hd["content-type"].startswith("application/json")
    one = json.loads(raw)
    assert one["done"] is True
    assert one["response"] == "".join(l["response"] for l in lines)
    # Ollama takes any content type: curl -d sends a form type
    st, _, raw = tiny.request("POST", "/api/generate", json.dumps(dict(body, stream=False)),
                              headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert st == 200 and json.loads(raw)["response"] == one["response"]


def test_nothing_to_generate_loads(tiny, model):
    st, r, _ = tiny.post("/api/generate", {"model": model})
    assert st == 200 and r["done"] is True and r["done_reason"] == "load" and r["response"] == ""
    st, r, _ = tiny.post("/api/chat", {"model": model, "messages": []})
    assert st == 200 and r["done_reason"] == "load" and r["message"]["content"] == ""


# ------------------------------------------------------------------ options


def openai_chat(srv, msgs, **kw):
    st, r, _ = srv.post("/v1/chat/completions", dict(messages=msgs, **kw))
    assert st == 200, r
    return r["choices"][0]["message"]["content"]


@pytest.mark.parametrize("opts", [
    {"temperature": 0, "seed": 42},
    {"temperature": 0.7, "seed": 42, "top_k": 40, "top_p": 0.9, "repeat_penalty": 1.1},
    {"temperature": 1.3, "seed": 9, "top_k": 5, "top_p": 0.8, "min_p": 0.05,
     "repeat_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.3},
])
def test_options_match_the_openai_route(tiny, model, opts):
    """Options reach the sampler as the OpenAI fields do: the same settings
    and seed give the same text on both routes."""
    c = client(tiny)
    msgs = [{"role": "user", "content": "Tell me a story"}]
    # Ollama's own defaults differ (top_k 40, top_p 0.9, repeat_penalty
    # 1.1): give every field on both sides
    full = {"top_k": 0, "top_p": 1.0, "repeat_penalty": 1.0, "min_p": 0.0, **opts}
    got = c.chat(model=model, messages=msgs, options=dict(full, num_predict=16))
    want = openai_chat(tiny, msgs, max_tokens=16, **full)
    assert got.message.content == want
    # /api/generate renders the prompt as one user turn
    gen = c.generate(model=model, prompt="Tell me a story", options=dict(full, num_predict=16))
    assert gen.response == want
    # raw: the prompt as it is, like /v1/completions
    raw = c.generate(model=model, prompt="Once upon", raw=True, options=dict(full, num_predict=16))
    st, r, _ = tiny.post("/v1/completions", dict(prompt="Once upon", max_tokens=16, **full))
    assert st == 200 and raw.response == r["choices"][0]["text"]
    assert raw.context is None  # as Ollama: no context in raw mode


def test_ollama_defaults_are_applied(tiny, model):
    """Without options: temperature 0.8, top_k 40, top_p 0.9,
    repeat_penalty 1.1 (Ollama's defaults), not the OpenAI route's."""
    c = client(tiny)
    msgs = [{"role": "user", "content": "Go on"}]
    got = c.chat(model=model, messages=msgs, options={"seed": 5, "num_predict": 16})
    want = openai_chat(tiny, msgs, max_tokens=16, seed=5, temperature=0.8, top_k=40, top_p=0.9,
                       repeat_penalty=1.1)
    assert got.message.content == want


def test_num_predict_and_stop(tiny, model):
    c = client(tiny)
    base = {"temperature": 0, "seed": 1}
    r = c.generate(model=model, prompt="abc", raw=True, options=dict(base, num_predict=5))
    assert r.eval_count <= 5 and (r.done_reason == "length") == (r.eval_count == 5)
    long = c.generate(model=model, prompt="abc", raw=True, options=dict(base, num_predict=40))
    text = long.response
    assert len(text) >= 8, text
    stop = text[4:6]
    cut = c.generate(model=model, prompt="abc", raw=True,
                     options=dict(base, num_predict=40, stop=[stop]))
    assert cut.response == text[:text.index(stop)]
    assert cut.done_reason == "stop"


def test_unknown_options_are_ignored_and_logged(tiny, model):
    st, r, _ = tiny.post("/api/generate", {
        "model": model, "prompt": "x", "stream": False,
        "options": {"num_predict": 2, "num_ctx": 4096, "mirostat": 2, "no_such_option": True}})
    assert st == 200 and r["done"] is True, r
    log = tiny.log_text()
    line = [l for l in log.splitlines() if "ollama options ignored" in l]
    assert line and "num_ctx" in line[-1] and "mirostat" in line[-1] and \
        "no_such_option" in line[-1], log[-2000:]


def test_logprobs(tiny, model):
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "stream": False,
            "logprobs": True, "top_logprobs": 2, "options": {"seed": 4, "num_predict": 6}}
    st, r, _ = tiny.post("/api/chat", body)
    assert st == 200, r
    lps = r["logprobs"]
    assert 1 <= len(lps) <= r["eval_count"]
    for e in lps:
        assert isinstance(e["token"], str) and e["logprob"] <= 0 and len(e["top_logprobs"]) == 2
    st, _, raw = tiny.request("POST", "/api/chat", dict(body, stream=True))
    streamed = [e for l in ndjson(raw) for e in l.get("logprobs", [])]
    assert [(e["token"], e["logprob"]) for e in streamed] == \
        [(e["token"], e["logprob"]) for e in lps]


# ------------------------------------------------------------------ context


def test_context_continues_a_generation(tiny, model):
    """context = prompt tokens + reply tokens; sent back, it is fed again in
    front of the next turn, which the template opens after closing the
    previous reply."""
    c = client(tiny)
    opts = {"temperature": 0, "num_predict": 8}
    r1 = c.generate(model=model, prompt="First question", options=opts)
    r2 = c.generate(model=model, prompt="Second question", context=r1.context, options=opts)
    assert r2.context[:len(r1.context)] == r1.context
    assert r2.prompt_eval_count > len(r1.context)
    cont = r2.context[len(r1.context):r2.prompt_eval_count]
    st, d, _ = tiny.post("/detokenize", {"tokens": cont})
    assert st == 200 and "Second question" in d["text"]
    assert "First question" not in d["text"]  # no fresh conversation: a continuation
    # the reply is what the model gives for exactly those tokens
    st, t, _ = tiny.post("/v1/completions", {"prompt": r2.context[:r2.prompt_eval_count],
                                             "max_tokens": 8, "temperature": 0})
    assert st == 200 and t["choices"][0]["text"] == r2.response


def test_context_bounds(tiny, model):
    st, r, _ = tiny.post("/api/generate", {"model": model, "prompt": "x",
                                           "context": [1] * (MAX_CONTEXT + 1)})
    assert is_ollama_error(st, r, 400) and str(MAX_CONTEXT) in r["error"]
    st, r, _ = tiny.post("/api/generate", {"model": model, "prompt": "x", "stream": False,
                                           "context": [], "options": {"num_predict": 1}})
    assert st == 200 and r["done"] is True


# ------------------------------------------------------- list, show, ps, version


def test_list_show_ps_version(tiny, model):
    c = client(tiny)
    models = c.list().models
    assert len(models) == 1 and model.endswith(":latest")
    m = models[0]
    arch = "gemma3" if tiny.model == TINY_GEMMA else "llama"
    assert m.size == os.path.getsize(tiny.model) and m.digest and m.modified_at is not None
    assert m.details.format == "gguf" and m.details.family == arch
    assert m.details.parameter_size and m.details.quantization_level

    s = c.show(model)
    assert s.modelinfo["general.architecture"] == arch
    assert s.modelinfo[f"{arch}.block_count"] >= 1 and s.capabilities == ["completion"]
    assert s.details.family == arch and s.template
    assert c.show(model.split(":")[0]).modelinfo == s.modelinfo  # without the tag
    st, old, _ = tiny.post("/api/show", {"name": model})  # the older field name
    assert st == 200 and old["model_info"] == s.modelinfo

    ps = c.ps().models
    assert len(ps) == 1 and ps[0].model == model and ps[0].size == m.size
    assert ps[0].expires_at is not None and ps[0].context_length > 0  # exact attention

    st, v, _ = tiny.json("GET", "/api/version")
    out = subprocess.run([BIN, "version"], capture_output=True, text=True).stdout
    assert st == 200 and out.startswith(f"darkserve {v['version']}\n")


def test_unknown_model(tiny, model):
    c = client(tiny)
    for call in (lambda: c.show("llama3.2"),
                 lambda: c.generate(model="llama3.2", prompt="x"),
                 lambda: c.chat(model="llama3.2:latest", messages=[{"role": "user", "content": "x"}])):
        with pytest.raises(ollama.ResponseError) as ei:
            call()
        assert ei.value.status_code == 404 and "llama3.2" in ei.value.error
    st, r, _ = tiny.post("/api/chat", {"model": model.upper(),
                                       "messages": [{"role": "user", "content": "x"}],
                                       "stream": False, "options": {"num_predict": 1}})
    assert st == 200, r  # names match in any case, as Ollama's


def test_model_management_answers_a_clear_error(tiny, model):
    c = client(tiny)
    with pytest.raises(ollama.ResponseError) as ei:
        c.pull("llama3.2")
    assert ei.value.status_code == 501 and "does not pull" in ei.value.error
    for method, path, body in [("POST", "/api/push", {"model": model}),
                               ("POST", "/api/create", {"model": "x", "from": model}),
                               ("DELETE", "/api/delete", {"model": model}),
                               ("POST", "/api/copy", {"source": model, "destination": "y"}),
                               ("POST", "/api/blobs/sha256:00", None)]:
        st, r, _ = tiny.json(method, path, body)
        assert is_ollama_error(st, r, 501) and path in r["error"], (path, r)
    assert client(tiny).list().models[0].model == model  # nothing changed


# ---------------------------------------------------------------- bad input


BAD = [
    ("options", "temperature", "hot"), ("options", "temperature", 3),
    ("options", "temperature", -0.1), ("options", "top_k", 1.5), ("options", "top_k", -1),
    ("options", "top_p", 0), ("options", "top_p", 1.5), ("options", "min_p", 2),
    ("options", "repeat_penalty", 0), ("options", "repeat_last_n", 1000),
    ("options", "repeat_last_n", -2), ("options", "seed", "x"), ("options", "seed", 1.5),
    ("options", "num_predict", "10"), ("options", "num_predict", -3),
    ("options", "num_predict", 10 ** 9), ("options", "stop", 5), ("options", "stop", [""]),
    ("options", "stop", ["x"] * 17), ("options", "stop", ["y" * 257]),
    ("options", "presence_penalty", 3), ("options", "repeat_penalty", 1e-300),
    ("options", "top_p", 1e-300),
    ("top", "options", [1]), ("top", "stream", "yes"), ("top", "keep_alive", [1]),
    ("top", "format", "xml"), ("top", "format", {"not": {"type": "object"}}), ("top", "think", True),
    ("top", "think", 5), ("top", "logprobs", "yes"), ("top", "top_logprobs", 50),
    ("top", "top_logprobs", 3), ("top", "model", 5), ("top", "model", ""),
    ("top", "model", "m" * 300),
]
GEN_BAD = [("prompt", 5), ("system", ["x"]), ("raw", 1), ("context", "abc"),
           ("context", [1, -1]), ("context", [1, "a"]), ("context", [10 ** 9]),
           ("context", {"a": 1}), ("suffix", "tail"), ("template", "{{ .Prompt }}"),
           ("images", ["aGVsbG8="]), ("tools", 42), ("tools", "x"), ("tools", True),
           ("tools", [{"type": "function", "function": {"name": "f"}}]), ("tools", {"a": 1})]
CHAT_BAD = [("messages", "hi"), ("messages", [5]), ("messages", [{"content": "x"}]),
            ("messages", [{"role": "tool", "content": "x"}]),
            ("messages", [{"role": 5, "content": "x"}]),
            ("messages", [{"role": "wizard", "content": "x"}]),
            ("messages", [{"role": "user", "content": 5}]),
            ("messages", [{"role": "user", "content": "x", "images": ["aGVsbG8="]}]),
            ("messages", [{"role": "user", "content": "x", "tool_calls": [{"function": {}}]}]),
            ("messages", [{"role": "user", "content": "x"}] * 1025),
            ("tools", [{"type": "function", "function": {"name": "f"}}])]


def _bad_body(model, chat, where, key, value):
    body = {"model": model, "stream": False}
    if chat:
        body["messages"] = [{"role": "user", "content": "x"}]
    else:
        body["prompt"] = "x"
    if where == "options":
        body["options"] = {key: value}
    else:
        body[key] = value
    return body


@pytest.mark.parametrize("chat", [0, 1])
@pytest.mark.parametrize("where,key,value", BAD)
def test_bad_values(tiny, model, chat, where, key, value):
    body = _bad_body(model, chat, where, key, value)
    st, r, _ = tiny.post("/api/chat" if chat else "/api/generate", body)
    assert is_ollama_error(st, r, 400), (body, st, r)
    assert key in r["error"] or (key == "model" and "model" in r["error"]), r


@pytest.mark.parametrize("key,value", GEN_BAD)
def test_bad_generate_fields(tiny, model, key, value):
    st, r, _ = tiny.post("/api/generate", _bad_body(model, 0, "top", key, value))
    assert is_ollama_error(st, r, 400) and key in r["error"], r


@pytest.mark.parametrize("key,value", CHAT_BAD)
def test_bad_chat_fields(tiny, model, key, value):
    st, r, _ = tiny.post("/api/chat", _bad_body(model, 1, "top", key, value))
    assert is_ollama_error(st, r, 400) and key in r["error"], r


@pytest.mark.parametrize("path", ["/api/generate", "/api/chat", "/api/show"])
@pytest.mark.parametrize("raw", [b"", b"{", b"[1]", b"\"x\"", b"{\"model\": \"a\", \"model\": \"b\"}",
                                 b"[" * 100 + b"]" * 100, b"{\"model\": \"\xff\"}"])
def test_malformed_json(tiny, path, raw):
    st, _, data = tiny.request("POST", path, raw, headers={"Content-Type": "application/json"})
    assert is_ollama_error(st, json.loads(data), 400), data


@pytest.mark.parametrize("body", [{}, {"model": ""}, {"model": 5}, {"name": None}])
def test_show_needs_a_model(tiny, body):
    st, r, _ = tiny.post("/api/show", body)
    assert is_ollama_error(st, r, 400) and "model" in r["error"], r


def test_server_survives_bad_input(tiny, model):
    """After every kind of refusal above, the server still generates."""
    r = client(tiny).generate(model=model, prompt="still here", options={"num_predict": 2})
    assert r.done


def test_real_model_chat_matches_openai(real):
    """The default model through the ollama client: greedy with a seed gives
    the OpenAI route's reply, streamed or not, and a real sentence."""
    c = client(real)
    name = c.list().models[0].model
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    opts = {"temperature": 0, "seed": 1, "num_predict": 24, "repeat_penalty": 1.0}
    r = c.chat(model=name, messages=msgs, options=opts)
    want = openai_chat(real, msgs, max_tokens=24, temperature=0, seed=1)
    assert r.message.content == want and len(want.split()) >= 3, want
    parts = list(c.chat(model=name, messages=msgs, options=opts, stream=True))
    assert "".join(p.message.content for p in parts) == want
    s = c.show(name)
    quant = "Q4_1" if real.model == MODEL else "Q4_K_M"  # SmolLM2's, Gemma's file
    assert s.details.quantization_level == quant and s.details.parameter_size.endswith("M")


def _pfx_hits(srv):
    return srv.metrics().get("darkserve_prefix_cache_hits_total", 0)


def test_ollama_routes_use_the_prefix_cache(servers):
    """/api/chat and /api/generate plan the conversation's boundaries as the
    OpenAI route does: they insert them, hit them, and share them with
    /v1/chat/completions (same messages, same keys)."""
    srv = servers(model=TINY)
    c = client(srv)
    name = c.list().models[0].model
    system = "You are a careful assistant who answers briefly. " * 4
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "Hello."}]
    opts = {"temperature": 0, "num_predict": 4}
    h0 = _pfx_hits(srv)
    a = c.chat(model=name, messages=msgs, options=opts)
    assert _pfx_hits(srv) == h0  # the first one inserts
    b = c.chat(model=name, messages=msgs, options=opts)
    assert _pfx_hits(srv) == h0 + 1 and b.message.content == a.message.content
    st, r, _ = srv.post("/v1/chat/completions",
                        {"messages": msgs, "max_tokens": 4, "temperature": 0})
    assert st == 200 and r["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, r
    # /api/generate with a system prompt renders the same conversation
    g = c.generate(model=name, system=system, prompt="Hello.", options=opts)
    assert _pfx_hits(srv) == h0 + 3 and g.response == a.message.content
    # raw prompts and continued contexts have no boundaries; they still
    # start from a cached prefix when one matches (here none does)
    c.generate(model=name, prompt="plain text", raw=True, options=opts)
    assert _pfx_hits(srv) == h0 + 3


def test_real_model_int8_prompts_agree_across_routes(servers):
    """With --prompt-precision int8, where prompt rows are 8-bit and a last-bit
    difference can change a greedy token, the two routes still answer alike:
    both prefill the conversation in the same pieces (exact attention, whose
    reply to this question was the case that differed before)."""
    srv = servers(model=MODEL, attn="exact", args=["--prompt-precision", "int8"])
    c = client(srv)
    name = c.list().models[0].model
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = c.chat(model=name, messages=msgs,
               options={"temperature": 0, "seed": 1, "num_predict": 24, "repeat_penalty": 1.0})
    want = openai_chat(srv, msgs, max_tokens=24, temperature=0, seed=1)
    assert r.message.content == want and len(want.split()) >= 3, (r.message.content, want)


@pytest.mark.parametrize("path", ["/api/generate", "/api/chat"])
def test_refusals_show_the_value_given(tiny, model, path):
    """A refused value is quoted in the message: 'tools' on /api/generate
    (once 200: the field was not checked there), a sampler number that is
    0 as a 32-bit float."""
    body = _bad_body(model, path == "/api/chat", "top", "tools", 42)
    st, r, _ = tiny.post(path, body)
    assert is_ollama_error(st, r, 400) and "'tools' is not supported" in r["error"], r
    assert "got 42" in r["error"], r
    body = _bad_body(model, path == "/api/chat", "options", "repeat_penalty", 1e-300)
    st, r, _ = tiny.post(path, body)
    assert is_ollama_error(st, r, 400), r
    assert "'options.repeat_penalty'" in r["error"] and "got 1e-300" in r["error"], r
