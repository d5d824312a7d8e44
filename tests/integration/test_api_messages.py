"""Anthropic's Messages API (POST /v1/messages) against a real `darkserve
serve`, through the official `anthropic` client (create, stream, tools),
and raw HTTP for the event sequence and the error shape. Expected texts come from darkserve's own chat
route with the same messages and greedy decoding, never from hard-coded
model outputs.
"""
import json
import re

import anthropic
import jsonschema
import pytest

from ds_server import TINY, Server


# the client (2.17) has no sampling arguments any more; the API field still works
GREEDY = {"temperature": 0}


def client(srv):
    return anthropic.Anthropic(base_url=srv.url(), api_key="unused", max_retries=0, timeout=300)


def chat(srv, msgs, **kw):
    st, r, _ = srv.post("/v1/chat/completions", dict(messages=msgs, temperature=0, **kw))
    assert st == 200, r
    return r


def test_messages_create_is_the_chat_answer(tiny):
    c = client(tiny)
    m = c.messages.create(model="tiny", max_tokens=12, extra_body=GREEDY,
                          system="Be brief.", messages=[{"role": "user", "content": "Hi"}])
    want = chat(tiny, [{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": "Hi"}], max_tokens=12)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert len(m.content) == 1 and m.content[0].type == "text"
    assert m.content[0].text == want["choices"][0]["message"]["content"]
    assert m.usage.input_tokens == want["usage"]["prompt_tokens"]
    assert m.usage.output_tokens == want["usage"]["completion_tokens"]
    fin = want["choices"][0]["finish_reason"]
    assert m.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[fin]
    # text blocks, a system as blocks and a conversation of several turns
    m2 = c.messages.create(model="tiny", max_tokens=12, extra_body=GREEDY,
                           system=[{"type": "text", "text": "Be brief."}],
                           messages=[{"role": "user", "content": [{"type": "text", "text": "H"},
                                                                  {"type": "text", "text": "i"}]}])
    assert m2.content[0].text == m.content[0].text


def test_stop_sequence(tiny):
    c = client(tiny)
    msgs = [{"role": "user", "content": "Count"}]
    free = c.messages.create(model="tiny", max_tokens=40, extra_body=GREEDY, messages=msgs)
    text = free.content[0].text
    assert len(text) > 8
    word = text[4:7]
    m = c.messages.create(model="tiny", max_tokens=40, extra_body=GREEDY, messages=msgs,
                          stop_sequences=[word])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == word
    assert m.content[0].text == text[:text.index(word)]


def test_refusals_in_anthropics_shape(tiny):
    def refused(body, status=400):
        st, r, _ = tiny.post("/v1/messages", body)
        assert st == status, r
        assert r["type"] == "error" and set(r["error"]) == {"type", "message"}, r
        assert r["error"]["type"] == "invalid_request_error" and r["error"]["message"], r
        return r["error"]["message"]
    base = {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    assert "Extra inputs" in refused(dict(base, frequency_penalty=1))
    assert "max_tokens" in refused({k: v for k, v in base.items() if k != "max_tokens"})
    assert "tools" in refused(dict(base, tools=[{"type": "bash_20250124", "name": "bash"}]))
    assert "stream" in refused(dict(base, stream="yes"))
    assert "image" in refused(dict(base, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]))
    refused(dict(base, messages=[{"role": "system", "content": "x"}]))
    refused(dict(base, temperature=1.5))
    refused(dict(base, messages=[]))
    with pytest.raises(anthropic.BadRequestError):
        client(tiny).messages.create(model="tiny", max_tokens=8, messages=base["messages"],
                                     extra_body={"unknown_field": 1})


# ---------------------------------------------------------------- streaming


def sse_named(raw):
    """A named-event SSE body -> [(event, data as JSON)]; comments dropped."""
    out = []
    for block in raw.decode("utf-8").split("\n\n"):
        lines = block.split("\n")
        ev = [l[len("event: "):] for l in lines if l.startswith("event: ")]
        data = [l[len("data: "):] for l in lines if l.startswith("data: ")]
        if data:
            out.append((ev[0] if ev else None, json.loads("\n".join(data))))
    return out


def test_stream_events_in_anthropics_order(tiny):
    body = {"model": "tiny", "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "user", "content": "Hi"}]}
    st, whole, _ = tiny.post("/v1/messages", body)
    assert st == 200, whole
    c = tiny.conn(300)
    c.request("POST", "/v1/messages", body=json.dumps(dict(body, stream=True)).encode(),
              headers={"Content-Type": "application/json"})
    resp = c.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type").startswith("text/event-stream")
    evs = sse_named(resp.read())
    names = [e for e, _ in evs]
    # every event names its type twice (the SSE event and the data's "type")
    assert all(e == d["type"] for e, d in evs), evs
    assert names[:3] == ["message_start", "content_block_start", "ping"], names
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"], names
    assert set(names[3:-3]) <= {"content_block_delta"}, names
    start = evs[0][1]["message"]
    assert start["id"].startswith("msg_") and start["content"] == []
    assert start["usage"]["input_tokens"] == whole["usage"]["input_tokens"]
    text = "".join(d["delta"]["text"] for e, d in evs if e == "content_block_delta")
    assert text == whole["content"][0]["text"]
    end = evs[-2][1]
    assert end["delta"]["stop_reason"] == whole["stop_reason"]
    assert end["usage"]["output_tokens"] == whole["usage"]["output_tokens"]


def test_client_stream_is_the_answer(tiny):
    c = client(tiny)
    kw = dict(model="tiny", max_tokens=16, extra_body=GREEDY, system="Be brief.",
              messages=[{"role": "user", "content": "Count"}], stop_sequences=["zz"])
    whole = c.messages.create(**kw)
    with c.messages.stream(**kw) as s:
        pieces = list(s.text_stream)
        final = s.get_final_message()
    assert "".join(pieces) == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    # the raw events through the client too
    with c.messages.stream(**kw) as s:
        types = [e.type for e in s]
    assert types[0] == "message_start" and types[-1] == "message_stop"


# -------------------------------------------------------------------- tools

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 8},
    "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"name": "get_weather", "description": "Weather of a city", "input_schema": WEATHER},
         {"name": "ping", "input_schema": {"type": "object", "properties": {}}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def lin(tmp_path_factory):
    """The tiny model with linear attention: the tools block is longer than
    its exact attention's 512 tokens."""
    s = Server(tmp_path_factory.mktemp("lin"), TINY, name="lin", attn="performer")
    yield s
    s.kill()


def test_forced_tool_use_streamed_and_not(lin):
    c = client(lin)
    kw = dict(model="tiny", max_tokens=200, tools=TOOLS, messages=ASK,
              tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY)
    m = c.messages.create(**kw)
    assert m.stop_reason == "tool_use", m
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) >= 1 and all(u.name == "get_weather" for u in uses)
    assert re.match(r"^toolu_[A-Za-z0-9]{24}$", uses[0].id)
    jsonschema.validate(uses[0].input, WEATHER)
    with c.messages.stream(**kw) as s:
        evs = list(s)
        final = s.get_final_message()
    assert final.stop_reason == "tool_use"
    suses = [b for b in final.content if b.type == "tool_use"]
    assert [u.input for u in suses] == [u.input for u in uses]
    starts = [e for e in evs if e.type == "content_block_start"]
    assert starts[0].content_block.type == "tool_use" and starts[0].index == 0
    assert any(e.type == "content_block_delta" and e.delta.type == "input_json_delta"
               for e in evs)
    # "any": some tool; one call only with disable_parallel_tool_use
    m = c.messages.create(**dict(kw, tool_choice={"type": "any",
                                                  "disable_parallel_tool_use": True}))
    assert m.stop_reason == "tool_use"
    assert len([b for b in m.content if b.type == "tool_use"]) == 1


def test_tool_result_turns_are_the_chat_prompt(lin):
    """tool_use blocks in an assistant turn and tool_result blocks in a user
    turn render as the chat route's tool_calls and tool messages: the same
    prompt (input tokens) and the same greedy answer."""
    msgs = ASK + [
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Paris", "unit": "celsius"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C, sunny"},
            {"type": "text", "text": "Thanks."}]}]
    chat_msgs = ASK + [
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {
                "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C, sunny"},
        {"role": "user", "content": "Thanks."}]
    m = client(lin).messages.create(model="tiny", max_tokens=8, tools=TOOLS, messages=msgs,
                                     extra_body=GREEDY)
    want = chat(lin, chat_msgs, max_tokens=8, tools=[
        {"type": "function", "function": {"name": t["name"], **(
            {"description": t["description"]} if "description" in t else {}),
            "parameters": t["input_schema"]}} for t in TOOLS])
    assert m.usage.input_tokens == want["usage"]["prompt_tokens"]
    assert m.content[0].text == want["choices"][0]["message"]["content"]
    # is_error: the model reads that the call failed (another prompt)
    msgs[2]["content"][0]["is_error"] = True
    m2 = client(lin).messages.create(model="tiny", max_tokens=1, tools=TOOLS, messages=msgs)
    assert m2.usage.input_tokens > m.usage.input_tokens


def test_tool_refusals(tiny):
    base = {"model": "tiny", "max_tokens": 8, "messages": ASK}

    def refused(body, part):
        st, r, _ = tiny.post("/v1/messages", body)
        assert st == 400, r
        assert r["type"] == "error" and r["error"]["type"] == "invalid_request_error", r
        assert part in r["error"]["message"], r
    refused(dict(base, tools=[{"type": "web_search_20250305", "name": "web_search"}]),
            "tools[0].type")
    refused(dict(base, tools=[{"name": "f"}]), "tools[0].input_schema")
    refused(dict(base, tools=[{"name": "f", "input_schema": {}, "strict": True}]),
            "tools[0].strict")
    refused(dict(base, tools=[{"name": "f", "input_schema": {"type": "object", "properties": {
        "n": {"type": "number", "multipleOf": 3}}}}]), "tools[0].input_schema")
    refused(dict(base, tools=[{"name": "bad name", "input_schema": {}}]), "name")
    refused(dict(base, tools=TOOLS, tool_choice={"type": "tool", "name": "nope"}), "nope")
    refused(dict(base, tools=TOOLS, tool_choice={"type": "tool"}), "tool_choice.name")
    refused(dict(base, tools=TOOLS, tool_choice={"type": "sometimes"}), "tool_choice")
    refused(dict(base, tools=TOOLS, tool_choice={"type": "auto", "x": 1}), "tool_choice.x")
    refused(dict(base, tool_choice={"type": "any"}), "tool_choice")
    refused(dict(base, thinking={"type": "enabled", "budget_tokens": 1024}), "thinking")
    refused(dict(base, messages=[{"role": "user", "content": [
        {"type": "tool_result", "content": "x"}]}]), "tool_use_id")
    refused(dict(base, messages=[{"role": "user", "content": [
        {"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]), "messages[0].content[0]")
    refused(dict(base, messages=ASK + [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "a", "name": "f", "input": "{}"}]}]), "input")
    refused(dict(base, messages=[{"role": "user", "content": [
        {"type": "text", "text": "a", "extra": 1}]}]), "messages[0].content[0].extra")
    refused(dict(base, messages=[{"role": "user", "content": "a", "name": "x"}]),
            "messages[0].name")
    # thinking disabled is what the API does anyway
    st, r, _ = tiny.post("/v1/messages", dict(base, thinking={"type": "disabled"}))
    assert st == 200, r


def test_every_refusal_in_anthropics_shape(tiny, servers):
    # a prompt over the server's budget, a streamed request, an unknown model route's
    # neighbours keep their shapes
    st, r, _ = tiny.post("/v1/messages", {"model": "tiny", "max_tokens": 8, "stream": True,
                                          "messages": [{"role": "user", "content": 5}]})
    assert st == 400 and r["type"] == "error", r
    s = servers(model=TINY, args=["--max-prompt-tokens", "16"])
    st, r, _ = s.post("/v1/messages", {"model": "tiny", "max_tokens": 8,
                                       "messages": [{"role": "user", "content": "word " * 40}]})
    assert st == 400 and r["type"] == "error" and "error" in r and "16" in r["error"]["message"]


def test_count_tokens_is_the_prompt(lin):
    c = client(lin)
    kw = dict(model="tiny", system="Be brief.", messages=ASK)
    m = c.messages.create(max_tokens=1, **kw)
    assert c.messages.count_tokens(**kw).input_tokens == m.usage.input_tokens
    m = c.messages.create(max_tokens=1, tools=TOOLS, **kw)
    n = c.messages.count_tokens(tools=TOOLS, **kw).input_tokens
    assert n == m.usage.input_tokens and n > 100
    st, r, _ = lin.post("/v1/messages/count_tokens", dict(kw, max_tokens=4))
    assert st == 400 and r["type"] == "error" and "max_tokens" in r["error"]["message"], r
    st, r, _ = lin.post("/v1/messages/count_tokens", {"model": "tiny"})
    assert st == 400 and r["type"] == "error" and "messages" in r["error"]["message"], r


def test_http_layer_refusals_in_anthropics_shape(servers):
    """What the HTTP layer answers before the route runs (the API key, the
    method, the media type, an unknown path under /v1/messages) has
    Anthropic's shape there too, and OpenAI's elsewhere."""
    s = servers(model=TINY, args=["--api-key", "k"])
    body = json.dumps({"model": "tiny", "max_tokens": 2, "messages": ASK}).encode()

    def shape(method, path, headers, status, etype):
        st, hd, data = s.request(method, path, body, headers)
        assert st == status, data
        r = json.loads(data)
        assert r["type"] == "error" and r["error"]["type"] == etype and r["error"]["message"], r
    js = {"Content-Type": "application/json"}
    shape("POST", "/v1/messages", js, 401, "authentication_error")
    shape("POST", "/v1/messages/count_tokens", js, 401, "authentication_error")
    auth = dict(js, **{"X-Api-Key": "k"})
    shape("GET", "/v1/messages", auth, 405, "invalid_request_error")
    shape("POST", "/v1/messages", {"X-Api-Key": "k", "Content-Type": "text/plain"}, 415,
          "invalid_request_error")
    shape("POST", "/v1/messages/nope", auth, 404, "not_found_error")
    st, hd, data = s.request("POST", "/v1/messagesx", body, js)
    assert st == 401 and "type" not in json.loads(data), data
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=s.url(), api_key="wrong", max_retries=0).messages.create(
            model="tiny", max_tokens=2, messages=ASK)
    m = anthropic.Anthropic(base_url=s.url(), api_key="k", max_retries=0).messages.create(
        model="tiny", max_tokens=2, messages=ASK)
    assert m.usage.output_tokens >= 1
