"""Tool calling on /v1/chat/completions: `tools`,
`tool_choice`, `parallel_tool_calls`. A forced call (tool_choice "required"
or a named function) is grammar-constrained to `<tool_call>` + {"name",
"arguments"} + `</tool_call>` (docs/API.md, "Tool calling"), so every
finished answer carries tool_calls whose arguments parse as JSON and
validate against the function's parameters (the PyPI `jsonschema`
package). On the tiny model: streamed and not, several tools, one call
without parallel calls, the 400s, tool results in the history and in a
session's turns, the official openai client. On the real model
(SmolLM2-135M): forced calls at temperature 1 whose arguments validate."""
import json
import re

import jsonschema
import openai
import pytest

from ds_server import TINY, Server, sse_json

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99},
                                        "b": {"type": "integer", "minimum": -99, "maximum": 99}},
       "required": ["a", "b"], "additionalProperties": False}
# $ref/$defs resolve inside each function's own parameters
MOVE = {"type": "object", "$defs": {"pt": {"type": "object", "properties": {
    "x": {"type": "integer", "minimum": 0, "maximum": 9},
    "y": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x", "y"],
    "additionalProperties": False}},
    "properties": {"to": {"$ref": "#/$defs/pt"}, "fast": {"type": "boolean"}},
    "required": ["to", "fast"], "additionalProperties": False}
SCHEMAS = {"get_weather": WEATHER, "add": ADD, "move": MOVE, "ping": None}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny model with linear attention: its exact attention stops at 512
    tokens of context, less than the tools block (the tiny tokenizer spends
    about a token per byte)."""
    s = Server(tmp_path_factory.mktemp("tiny"), TINY, name="tiny", attn="performer")
    yield s
    s.kill()


def tool(name, schema, desc=None):
    f = {"name": name}
    if desc:
        f["description"] = desc
    if schema is not None:
        f["parameters"] = schema
    return {"type": "function", "function": f}


TOOLS = [tool("get_weather", WEATHER, "Weather of a city"), tool("add", ADD, "a + b"),
         tool("move", MOVE), tool("ping", None, "no arguments")]
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
ID_RE = re.compile(r"^call_[A-Za-z0-9]{24}$")


def named(name):
    return {"type": "function", "function": {"name": name}}


def check_call(call, allowed):
    """One tool_calls entry of a message: shape, name, arguments valid."""
    assert ID_RE.match(call["id"]), call
    assert call["type"] == "function"
    name = call["function"]["name"]
    assert name in allowed, call
    args = json.loads(call["function"]["arguments"])
    schema = SCHEMAS[name]
    if schema is None:
        assert args == {}, call
    else:
        jsonschema.validate(args, schema)
    return name, args


def test_validation_is_not_vacuous():
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"city": "Paris", "unit": "kelvin"}, WEATHER)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"to": {"x": 1}, "fast": True}, MOVE)
    with pytest.raises(AssertionError):
        check_call({"id": "call_x", "type": "function",
                    "function": {"name": "add", "arguments": "{}"}}, ["add"])


# ----------------------------------------------------------------- tiny model


def test_forced_named_function(tiny):
    for seed in range(4):
        st, r, _ = tiny.post("/v1/chat/completions", {
            "messages": USER, "tools": TOOLS, "tool_choice": named("get_weather"),
            "seed": seed, "temperature": 1, "max_tokens": 200, "n": 2})
        assert st == 200, r
        for c in r["choices"]:
            assert c["finish_reason"] == "tool_calls", c
            m = c["message"]
            assert m["content"] is None and m["role"] == "assistant", m
            assert 1 <= len(m["tool_calls"]) <= 8
            for call in m["tool_calls"]:
                assert check_call(call, ["get_weather"])[0] == "get_weather"
        assert r["usage"]["completion_tokens"] > 0


def test_forced_named_function_streamed(tiny):
    done = 0
    for seed in range(4):
        st, _, raw = tiny.request("POST", "/v1/chat/completions", {
            "messages": USER, "tools": TOOLS, "tool_choice": named("move"), "stream": True,
            "seed": seed, "max_tokens": 200, "stream_options": {"include_usage": True}})
        assert st == 200
        evs, fin = sse_json(raw)
        assert fin
        calls, content, finish = {}, "", None
        for e in evs:
            if not e["choices"]:
                assert e["usage"]["completion_tokens"] > 0
                continue
            ch = e["choices"][0]
            d = ch["delta"]
            content += d.get("content") or ""
            for tc in d.get("tool_calls") or []:
                i = tc["index"]
                if i not in calls:
                    # the first chunk of a call: id, type, name, empty arguments
                    assert ID_RE.match(tc["id"]) and tc["type"] == "function", tc
                    assert tc["function"]["arguments"] == ""
                    calls[i] = {"id": tc["id"], "type": "function",
                                "function": {"name": tc["function"]["name"], "arguments": ""}}
                else:
                    assert "id" not in tc and "name" not in tc["function"], tc
                    calls[i]["function"]["arguments"] += tc["function"]["arguments"]
            finish = ch["finish_reason"] or finish
        assert content == "" and "<tool_call>" not in raw.decode(), raw
        assert sorted(calls) == list(range(len(calls))) and calls
        if finish == "tool_calls":
            done += 1
            for c in calls.values():
                check_call(c, ["move"])
        else:
            assert finish == "length"
    assert done >= 3


def test_required_with_several_tools(tiny):
    seen = set()
    for seed in range(6):
        st, r, _ = tiny.post("/v1/chat/completions", {
            "messages": USER, "tools": TOOLS, "tool_choice": "required", "seed": seed,
            "max_tokens": 300})
        assert st == 200, r
        c = r["choices"][0]
        assert c["finish_reason"] == "tool_calls", c
        for call in c["message"]["tool_calls"]:
            seen.add(check_call(call, list(SCHEMAS))[0])
        ids = [t["id"] for t in c["message"]["tool_calls"]]
        assert len(set(ids)) == len(ids)
    assert len(seen) >= 2, seen


def test_parallel_tool_calls_false_gives_one_call(tiny):
    for seed in range(5):
        for choice in ("required", named("add")):
            st, r, _ = tiny.post("/v1/chat/completions", {
                "messages": USER, "tools": TOOLS, "tool_choice": choice, "seed": seed,
                "parallel_tool_calls": False, "max_tokens": 300})
            assert st == 200, r
            c = r["choices"][0]
            assert c["finish_reason"] == "tool_calls", c
            assert len(c["message"]["tool_calls"]) == 1, c
            check_call(c["message"]["tool_calls"][0], list(SCHEMAS))


DIGIT = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
         "required": ["a"], "additionalProperties": False}


@pytest.mark.parametrize("n", [37, 128])
@pytest.mark.parametrize("parallel", [True, False])
def test_forced_calls_over_many_tools(tiny, n, parallel):
    """A forced call over 37 or more tools: the grammar's list of the
    functions was cut at 256 bytes, so the grammar broke (400 'line 38');
    128 is the most 'tools' takes."""
    tools = [tool(f"fn_{i}", DIGIT) for i in range(n)]
    st, r, _ = tiny.post("/v1/chat/completions", {
        "messages": USER, "tools": tools, "tool_choice": "required", "seed": 3,
        "parallel_tool_calls": parallel, "max_tokens": 120})
    assert st == 200, r
    c = r["choices"][0]
    for call in c["message"].get("tool_calls") or []:
        assert re.fullmatch(r"fn_\d+", call["function"]["name"]), call
        if c["finish_reason"] == "tool_calls":
            jsonschema.validate(json.loads(call["function"]["arguments"]), DIGIT)
    if not parallel:
        assert len(c["message"].get("tool_calls") or []) <= 1, c


def test_auto_and_none_give_content(tiny):
    # the tiny model does not write <tool_call> of its own: its answer is content
    for choice in ("auto", "none", None):
        body = {"messages": USER, "tools": TOOLS, "max_tokens": 12, "seed": 1}
        if choice:
            body["tool_choice"] = choice
        st, r, _ = tiny.post("/v1/chat/completions", body)
        assert st == 200, r
        c = r["choices"][0]
        assert c["finish_reason"] in ("stop", "length") and "tool_calls" not in c["message"]
        assert isinstance(c["message"]["content"], str)
    # "none": the tools are not shown to the model; "auto": they are
    st, rn, _ = tiny.post("/v1/chat/completions", {"messages": USER, "tools": TOOLS,
                                                   "tool_choice": "none", "max_tokens": 1})
    st2, ra, _ = tiny.post("/v1/chat/completions", {"messages": USER, "tools": TOOLS,
                                                    "max_tokens": 1})
    st3, rp, _ = tiny.post("/v1/chat/completions", {"messages": USER, "max_tokens": 1})
    assert st == st2 == st3 == 200
    assert rn["usage"]["prompt_tokens"] == rp["usage"]["prompt_tokens"]
    assert ra["usage"]["prompt_tokens"] > rp["usage"]["prompt_tokens"] + 100


def test_tool_messages_in_history(tiny):
    history = USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}},
            {"id": "call_2", "type": "function", "function": {"name": "ping", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "pong"}]
    st, r, _ = tiny.post("/v1/chat/completions", {"messages": history, "tools": TOOLS,
                                                  "max_tokens": 5, "seed": 3})
    assert st == 200, r
    # the results are in the prompt: more tokens than without them
    st, r0, _ = tiny.post("/v1/chat/completions", {"messages": USER, "tools": TOOLS,
                                                   "max_tokens": 5, "seed": 3})
    assert r["usage"]["prompt_tokens"] > r0["usage"]["prompt_tokens"] + 20
    # then a forced call after the results still validates
    st, r, _ = tiny.post("/v1/chat/completions", {
        "messages": history, "tools": TOOLS, "tool_choice": named("add"), "max_tokens": 200})
    assert st == 200 and r["choices"][0]["finish_reason"] == "tool_calls", r
    check_call(r["choices"][0]["message"]["tool_calls"][0], ["add"])


def test_tool_messages_in_session_turns(tiny):
    st, s, _ = tiny.post("/v1/sessions", {})
    assert st == 201
    sid = s["id"]
    st, r, _ = tiny.post(f"/v1/sessions/{sid}/generate", {
        "messages": USER, "stream": False, "max_tokens": 4, "seed": 1})
    assert st == 200, r
    t0 = r["session"]["tokens"]
    st, r, _ = tiny.post(f"/v1/sessions/{sid}/generate", {
        "messages": [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "ping", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "pong"}],
        "stream": False, "max_tokens": 4, "seed": 1})
    assert st == 200, r
    assert r["session"]["tokens"] > t0 + 10
    # chat completions continuing the session, with a forced call
    st, r, _ = tiny.post("/v1/chat/completions", {
        "session": sid, "messages": [{"role": "tool", "tool_call_id": "c", "content": "ok"}],
        "tools": TOOLS, "tool_choice": named("add"), "max_tokens": 200})
    assert st == 200 and r["choices"][0]["finish_reason"] == "tool_calls", r
    check_call(r["choices"][0]["message"]["tool_calls"][0], ["add"])


BAD = [
    ({"tools": [tool("bad name", ADD)]}, "tools[0].function.name", "must be 1 to 64"),
    ({"tools": [tool("x" * 65, ADD)]}, "tools[0].function.name", "must be 1 to 64"),
    ({"tools": [tool("add", ADD), tool("add", WEATHER)]}, "tools[1].function.name",
     "names must be unique"),
    ({"tools": TOOLS, "tool_choice": named("nope")}, "tool_choice.function.name",
     "is not one of 'tools'"),
    ({"tools": [tool("f", {"type": "object", "properties": {"a": {"not": {}}}})]},
     "tools[0].function.parameters", "tools[0].function.parameters.properties.a: 'not' is "
     "not supported"),
    ({"tools": [tool("ok", ADD), tool("f", {"type": "integer", "multipleOf": 3})]},
     "tools[1].function.parameters", "'multipleOf' is not supported"),
    ({"tool_choice": "required"}, "tool_choice", "requires 'tools'"),
    ({"tool_choice": named("add")}, "tool_choice", "requires 'tools'"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "must be 'none'"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type", "only 'function' tools"),
    ({"tools": {"a": 1}}, "tools", "must be an array"),
    ({"tools": [tool("f", None)] * 129}, "tools", "at most 128"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls", "boolean"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice", "cannot be combined with 'response_format'"),
    ({"functions": [{"name": "f"}]}, "functions", "legacy"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [{"id": "a"}]}]},
     "messages[0].tool_calls", "only allowed in 'assistant' messages"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": 5}}]}]},
     "messages[0].tool_calls[0].function.arguments", "must be a string"),
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": 5}]},
     "messages[0].tool_call_id", "must be a string"),
    ({"messages": [{"role": "tool", "tool_call_id": "a"}]}, "messages[0].content", "required"),
]


@pytest.mark.parametrize("extra,param,msg", BAD, ids=[b[1] + "-" + str(i) for i, b in enumerate(BAD)])
def test_bad_requests_400(tiny, extra, param, msg):
    body = {"messages": USER, "max_tokens": 4}
    body.update(extra)
    st, r, _ = tiny.post("/v1/chat/completions", body)
    assert st == 400, r
    assert r["error"]["param"] == param, r
    assert msg in r["error"]["message"], r


def client_stream(chunks):
    """An openai client's streamed chat chunks reassembled: the tool calls by
    index ({id, type, function: {name, arguments}}), the content text and
    the finish reason."""
    calls, text, finish = {}, "", None
    for chunk in chunks:
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        text += d.content or ""
        for tc in d.tool_calls or []:
            e = calls.setdefault(tc.index, {"id": None, "type": "function",
                                            "function": {"name": None, "arguments": ""}})
            if tc.id:
                e["id"] = tc.id
                e["function"]["name"] = tc.function.name
            e["function"]["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return calls, text, finish


def test_openai_client(tiny):
    c = openai.OpenAI(base_url=tiny.url("/v1"), api_key="unused", max_retries=0, timeout=300)
    model = c.models.list().data[0].id
    r = c.chat.completions.create(model=model, messages=USER, tools=TOOLS,
                                  tool_choice=named("get_weather"), seed=2, max_tokens=200)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    for call in ch.message.tool_calls:
        check_call(call.model_dump(), ["get_weather"])
    # streamed: the client's chunks reassembled by index
    done = 0
    for seed in range(3):
        calls, text, finish = client_stream(c.chat.completions.create(
            model=model, messages=USER, tools=TOOLS, tool_choice="required", seed=seed,
            max_tokens=300, stream=True))
        assert text == ""
        if finish == "tool_calls":
            done += 1
            assert calls
            for e in calls.values():
                check_call(e, list(SCHEMAS))
    assert done >= 2
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=model, messages=USER, tools=TOOLS,
                                  tool_choice=named("missing"))
    assert "is not one of 'tools'" in str(e.value)


def test_openai_client_automatic_call(tiny):
    # tool_choice "auto" leaves the output free; the model's own text decides.
    # A `grammar` (extra_body) makes this model write a call so that the
    # parsing of a free answer is what is tested: tool_calls, not content,
    # streamed and not, and a malformed call stays content.
    c = openai.OpenAI(base_url=tiny.url("/v1"), api_key="unused", max_retries=0, timeout=300)
    model = c.models.list().data[0].id
    call_text = ('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": -3}}\n</tool_call>')
    gbnf = "root ::= " + json.dumps(call_text)
    r = c.chat.completions.create(model=model, messages=USER, tools=TOOLS, tool_choice="auto",
                                  max_tokens=200, extra_body={"grammar": gbnf})
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    assert len(ch.message.tool_calls) == 1
    assert check_call(ch.message.tool_calls[0].model_dump(), ["add"]) == ("add", {"a": 2, "b": -3})
    calls, text, finish = client_stream(c.chat.completions.create(
        model=model, messages=USER, tools=TOOLS, max_tokens=200, stream=True,
        extra_body={"grammar": gbnf}))
    assert finish == "tool_calls" and text == "" and len(calls) == 1
    assert check_call(calls[0], ["add"]) == ("add", {"a": 2, "b": -3})
    # a call of a function that is not listed is no call: the text comes back as content
    bad = call_text.replace('"add"', '"sub"')
    r = c.chat.completions.create(model=model, messages=USER, tools=TOOLS, max_tokens=200,
                                  extra_body={"grammar": "root ::= " + json.dumps(bad)})
    ch = r.choices[0]
    assert ch.finish_reason == "stop" and not ch.message.tool_calls
    assert ch.message.content == bad


# ----------------------------------------------------------------- real model


def test_real_model_forced_calls(real):
    prompt = [{"role": "system", "content": "You are a helpful assistant."},
              {"role": "user", "content": "What's the weather like in Berlin this week, in "
                                          "celsius? Also add 2 and 40."}]
    # the model often repeats a call: up to 8 with parallel calls, hence the
    # room in max_tokens
    for choice, allowed, parallel in ((named("get_weather"), ["get_weather"], False),
                                      ("required", list(SCHEMAS), True),
                                      (named("move"), ["move"], False)):
        st, r, _ = real.post("/v1/chat/completions", {
            "messages": prompt, "tools": TOOLS, "tool_choice": choice, "n": 5,
            "parallel_tool_calls": parallel, "temperature": 1, "seed": 11,
            "max_tokens": 1200 if parallel else 300})
        assert st == 200, r
        assert len(r["choices"]) == 5
        for c in r["choices"]:
            # a choice cut by max_tokens would be a fault of this test's sizing
            assert c["finish_reason"] == "tool_calls", (choice, c)
            assert c["message"]["content"] is None
            assert parallel or len(c["message"]["tool_calls"]) == 1
            for call in c["message"]["tool_calls"]:
                check_call(call, allowed)
