"""OpenAI's Responses API (POST /v1/responses, GET and DELETE
/v1/responses/{id}) against a real `darkserve serve`, through the official
`openai` client (responses.create streamed and not, responses.stream,
previous_response_id, retrieve, delete) and raw HTTP for the event
sequence and the refusals. Expected texts come from darkserve's own chat
route with the same messages and greedy decoding, never from hard-coded
model outputs."""
import json

import jsonschema
import openai
import pytest

from ds_server import TINY, Server


@pytest.fixture(scope="module")
def lin(tmp_path_factory):
    """The tiny model with linear attention (the tools block is longer than
    its exact attention's 512 tokens)."""
    s = Server(tmp_path_factory.mktemp("lin"), TINY, name="lin", attn="performer")
    yield s
    s.kill()


def client(srv):
    return openai.OpenAI(base_url=srv.url("/v1"), api_key="unused", max_retries=0, timeout=300)


def chat(srv, msgs, **kw):
    st, r, _ = srv.post("/v1/chat/completions", dict(messages=msgs, temperature=0, **kw))
    assert st == 200, r
    return r


def sse_named(raw):
    out = []
    for block in raw.decode("utf-8").split("\n\n"):
        lines = block.split("\n")
        ev = [l[len("event: "):] for l in lines if l.startswith("event: ")]
        data = [l[len("data: "):] for l in lines if l.startswith("data: ")]
        if data:
            out.append((ev[0] if ev else None, json.loads("\n".join(data))))
    return out


def stream_raw(srv, body):
    c = srv.conn(300)
    c.request("POST", "/v1/responses", body=json.dumps(dict(body, stream=True)).encode(),
              headers={"Content-Type": "application/json"})
    resp = c.getresponse()
    assert resp.status == 200
    return sse_named(resp.read())


def test_create_is_the_chat_answer(lin):
    c = client(lin)
    r = c.responses.create(model="m", instructions="Be brief.", input="Hi",
                           max_output_tokens=12, temperature=0, store=False)
    want = chat(lin, [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "Hi"}], max_tokens=12)
    assert r.id.startswith("resp_") and r.object == "response"
    assert r.output_text == want["choices"][0]["message"]["content"]
    assert r.usage.input_tokens == want["usage"]["prompt_tokens"]
    assert r.usage.output_tokens == want["usage"]["completion_tokens"]
    fin = want["choices"][0]["finish_reason"]
    assert r.status == {"length": "incomplete", "stop": "completed"}[fin]
    if fin == "length":
        assert r.incomplete_details.reason == "max_output_tokens"
    assert r.max_output_tokens == 12 and r.instructions == "Be brief." and r.store is False
    # input as message items with input_text parts is the same request
    r2 = c.responses.create(model="m", max_output_tokens=12, temperature=0, store=False, input=[
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "H"},
                                                        {"type": "input_text", "text": "i"}]}])
    assert r2.output_text == r.output_text


def test_stream_events_numbered_in_order(lin):
    body = {"model": "m", "input": "Hi", "max_output_tokens": 10, "temperature": 0,
            "store": False}
    st, whole, _ = lin.post("/v1/responses", body)
    assert st == 200, whole
    evs = stream_raw(lin, body)
    assert all(e == d["type"] for e, d in evs), evs
    assert [d["sequence_number"] for _, d in evs] == list(range(len(evs)))
    names = [e for e, _ in evs]
    assert names[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"], names
    assert names[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"], names
    assert names[-1] == ("response.incomplete" if whole["status"] == "incomplete"
                         else "response.completed")
    assert evs[0][1]["response"]["status"] == "in_progress"
    deltas = "".join(d["delta"] for e, d in evs if e == "response.output_text.delta")
    text = whole["output"][0]["content"][0]["text"]
    assert deltas == text
    assert evs[-4][1]["text"] == text
    final = evs[-1][1]["response"]
    assert final["output"][0]["content"][0]["text"] == text
    assert final["usage"] == whole["usage"]
    item_id = evs[2][1]["item"]["id"]
    assert all(d.get("item_id", item_id) == item_id for _, d in evs[3:-1])


def test_client_stream_and_final_response(real_smollm2):
    # SmolLM2: an instruction-tuned model that ends its reply within the
    # budget (the base Gemma runs on to max_output_tokens: "incomplete")
    real = real_smollm2
    c = client(real)
    kw = dict(model="m", input="Say hello.", max_output_tokens=60, temperature=0, store=False)
    whole = c.responses.create(**kw)
    assert whole.status == "completed", whole
    with c.responses.stream(**kw) as s:
        pieces = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(pieces) == whole.output_text == final.output_text
    types = [e.type for e in c.responses.create(stream=True, **kw)]
    assert types[0] == "response.created" and types[-1] == "response.completed"


def test_previous_response_id_continues_the_session(real_smollm2):
    """store (the default): the next response sends only its new input,
    and answers what the whole conversation sent to the chat route gives."""
    # SmolLM2: an instruction-tuned model that ends its replies, whose
    # generated tokens re-tokenize to themselves; the base Gemma runs on to
    # max_tokens, and SentencePiece need not give a cut reply's tokens back
    real = real_smollm2
    c = client(real)
    r1 = c.responses.create(model="m", instructions="Be brief.", input="Name a color.",
                            max_output_tokens=24, temperature=0)
    assert r1.store is True and r1.status == "completed", r1
    r2 = c.responses.create(model="m", input="And another one?", previous_response_id=r1.id,
                            max_output_tokens=24, temperature=0)
    assert r2.previous_response_id == r1.id
    want = chat(real, [{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": "Name a color."},
                       {"role": "assistant", "content": r1.output_text},
                       {"role": "user", "content": "And another one?"}], max_tokens=24)
    assert r2.output_text == want["choices"][0]["message"]["content"]
    # the history was not read again: only the new turn's tokens
    assert r2.usage.input_tokens < want["usage"]["prompt_tokens"] - r1.usage.input_tokens
    # stored: retrieved as answered
    got = c.responses.retrieve(r2.id)
    assert got.output_text == r2.output_text and got.id == r2.id
    # every response keeps its own state: r1 continued again is a second
    # branch from r1's state (the same greedy answer), and r2 still continues
    r2b = c.responses.create(model="m", input="And another one?", previous_response_id=r1.id,
                             max_output_tokens=24, temperature=0)
    assert r2b.id != r2.id and r2b.output_text == r2.output_text
    assert r2b.usage.input_tokens == r2.usage.input_tokens
    r3 = c.responses.create(model="m", input="Thanks.", previous_response_id=r2.id,
                            max_output_tokens=8, temperature=0)
    assert r3.status in ("completed", "incomplete")
    # delete: gone (and its session), the others stay
    n = len(real.json("GET", "/v1/sessions")[1]["data"])
    c.responses.delete(r2.id)
    assert len(real.json("GET", "/v1/sessions")[1]["data"]) == n - 1
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r2.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model="m", input="x", previous_response_id=r2.id, max_output_tokens=2)
    assert c.responses.retrieve(r3.id).output_text == r3.output_text
    c.responses.create(model="m", input="x", previous_response_id=r3.id, max_output_tokens=2)


def test_store_false_keeps_nothing(lin):
    c = client(lin)
    before = lin.json("GET", "/v1/sessions")[1]["data"]
    r = c.responses.create(model="m", input="Hi", max_output_tokens=2, store=False)
    assert lin.json("GET", "/v1/sessions")[1]["data"] == before
    with pytest.raises(openai.NotFoundError) as ei:
        c.responses.create(model="m", input="x", previous_response_id=r.id, max_output_tokens=2)
    assert ei.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve("resp_nope")
    # a stored one is a session of the store
    r = c.responses.create(model="m", input="Hi", max_output_tokens=2)
    assert len(lin.json("GET", "/v1/sessions")[1]["data"]) == len(before) + 1
    with pytest.raises(openai.BadRequestError) as ei:
        c.responses.create(model="m", input="x", previous_response_id=r.id, store=False,
                           max_output_tokens=2)
    assert ei.value.body["param"] == "store"


WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 8},
    "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
          "parameters": WEATHER}]


def test_function_calls_streamed_and_not(lin):
    c = client(lin)
    kw = dict(model="m", input="Weather in Paris?", tools=TOOLS, tool_choice="required",
              parallel_tool_calls=False, max_output_tokens=200, temperature=0, store=False)
    r = c.responses.create(**kw)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather", r.output
    assert calls[0].call_id.startswith("call_") and calls[0].id.startswith("fc_")
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    evs = stream_raw(lin, kw)
    names = [e for e, _ in evs]
    added = [d for e, d in evs if e == "response.output_item.added"]
    assert added[0]["item"]["type"] == "function_call"
    args = "".join(d["delta"] for e, d in evs if e == "response.function_call_arguments.delta")
    done = [d for e, d in evs if e == "response.function_call_arguments.done"]
    assert args == done[0]["arguments"] == calls[0].arguments
    assert "response.output_text.delta" not in names
    assert evs[-1][1]["response"]["output"][-1]["arguments"] == calls[0].arguments
    # the call and its output as input items render as the chat route's
    # tool_calls and tool message
    items = [{"role": "user", "content": "Weather in Paris?"},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather",
              "arguments": '{"city": "Paris", "unit": "celsius"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "18 C"}]
    r = c.responses.create(model="m", input=items, tools=TOOLS, max_output_tokens=6,
                           temperature=0, store=False)
    want = chat(lin, [{"role": "user", "content": "Weather in Paris?"},
                      {"role": "assistant", "content": None, "tool_calls": [
                          {"id": "call_1", "type": "function", "function": {
                              "name": "get_weather",
                              "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
                      {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}],
                max_tokens=6, tools=[{"type": "function", "function": {
                    "name": "get_weather", "description": "Weather of a city",
                    "parameters": WEATHER}}])
    assert r.usage.input_tokens == want["usage"]["prompt_tokens"]
    assert r.output_text == (want["choices"][0]["message"]["content"] or "")


def test_text_format_json_schema(lin):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                     "maximum": 99}},
              "required": ["n"], "additionalProperties": False}
    r = client(lin).responses.create(
        model="m", input="A number", max_output_tokens=40, store=False,
        text={"format": {"type": "json_schema", "name": "num", "schema": schema,
                         "strict": True}})
    assert r.status == "completed", r
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"


def test_refusals_name_the_field(lin):
    def refused(body, param, status=400):
        st, r, _ = lin.post("/v1/responses", body)
        assert st == status, r
        assert r["error"]["param"] == param and r["error"]["message"], r
        return r["error"]
    base = {"model": "m", "input": "Hi", "max_output_tokens": 2}
    refused(dict(base, background=True), "background")
    refused(dict(base, tools=[{"type": "web_search"}]), "tools[0].type")
    refused(dict(base, tools=[{"type": "file_search", "vector_store_ids": []}]), "tools[0].type")
    assert "Unknown parameter" in refused(dict(base, frobnicate=1), "frobnicate")["message"]
    refused(dict(base, input=[{"role": "user", "content": [
        {"type": "input_image", "image_url": "http://x/y.png"}]}]), "input[0].content[0]")
    refused(dict(base, input=[{"role": "user", "content": "Hi", "name": "me"}]), "input[0].name")
    refused(dict(base, reasoning={"effort": "high"}), "reasoning")
    refused(dict(base, include=["reasoning.encrypted_content"]), "include")
    refused(dict(base, text={"format": {"type": "json_schema", "name": "s", "schema": {
        "type": "object", "properties": {"n": {"type": "number", "multipleOf": 2}}}}}),
        "text.format.schema")
    refused(dict(base, max_output_tokens=-1), "max_output_tokens")
    refused(dict(base, temperature=3), "temperature")
    refused(dict(base, input=[]), "input")
    refused({"model": "m"}, "input")
    st, r, _ = lin.json("POST", "/v1/responses", b"{not json",
                        headers={"Content-Type": "application/json"})
    assert st == 400 and r["error"]["message"]
    with pytest.raises(openai.BadRequestError):
        client(lin).responses.create(model="m", input="Hi", background=True)


def test_continuations_under_the_session_limits(servers):
    """Each stored response is a session: with --max-sessions 2 the older
    ones go to disk and are read back (and forked) when continued; with 1
    a continuation (the response's session and its copy at once) is a 503
    that says why."""
    s = servers(model=TINY, attn="performer", args=["--max-sessions", "2"])
    c = client(s)
    r1 = c.responses.create(model="m", input="Hi", max_output_tokens=3, temperature=0)
    ids, texts = [r1.id], []
    for i in range(6):
        prev = ids[-1] if i % 2 else r1.id
        r = c.responses.create(model="m", input="More", previous_response_id=prev,
                               max_output_tokens=3, temperature=0)
        ids.append(r.id)
        if prev == r1.id:
            texts.append(r.output_text)
    assert len(set(texts)) == 1  # r1's state, whatever was evicted since
    assert len(s.json("GET", "/v1/sessions")[1]["data"]) == len(ids)
    one = servers(model=TINY, attn="performer", args=["--max-sessions", "1"])
    c = client(one)
    r1 = c.responses.create(model="m", input="Hi", max_output_tokens=3)
    with pytest.raises(openai.InternalServerError) as ei:
        c.responses.create(model="m", input="More", previous_response_id=r1.id,
                           max_output_tokens=3)
    assert ei.value.status_code == 503 and ei.value.body["code"] == "session_store_full"


def test_responses_belong_to_their_key(servers, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("key-a\nkey-b\n")
    s = servers(model=TINY, attn="performer", args=["--api-key-file", str(keys)])
    a = openai.OpenAI(base_url=s.url("/v1"), api_key="key-a", max_retries=0)
    b = openai.OpenAI(base_url=s.url("/v1"), api_key="key-b", max_retries=0)
    r = a.responses.create(model="m", input="Hi", max_output_tokens=2)
    for call in (lambda: b.responses.retrieve(r.id), lambda: b.responses.delete(r.id),
                 lambda: b.responses.create(model="m", input="x", previous_response_id=r.id,
                                            max_output_tokens=2)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert a.responses.retrieve(r.id).id == r.id
    a.responses.create(model="m", input="x", previous_response_id=r.id, max_output_tokens=2)
