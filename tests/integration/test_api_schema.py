"""`response_format` (json_object, json_schema) and Ollama's `format` (issue
15, part 2): the server turns a JSON Schema into a grammar (proto/schema.c),
so every finished answer parses as JSON and validates against the schema
(the PyPI `jsonschema` package, formats checked too). On the tiny model:
every route, streamed and not, the official openai client, and the 400s of
unsupported schema features. On the real model (SmolLM2-135M): each schema
of tests/data/schemas, 5 choices at temperature 1, all finished and valid."""
import datetime
import glob
import ipaddress
import json
import os
import re
import uuid

import jsonschema
import openai
import pytest

from ds_server import sse_json

DATA = os.environ.get("DARKSERVE_DATA", os.path.join(os.path.dirname(__file__), "..", "data"))
CORPUS = sorted(glob.glob(os.path.join(DATA, "schemas", "*.json")))

FORMATS = jsonschema.FormatChecker()
TIME_RE = re.compile(r"^([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)$")


# jsonschema checks "time" and "date-time" only with optional packages: check
# them here (RFC 3339), so a wrong format cannot pass silently
@FORMATS.checks("time")
def _time(v):
    return not isinstance(v, str) or bool(TIME_RE.match(v))


@FORMATS.checks("date-time")
def _date_time(v):
    if not isinstance(v, str):
        return True
    d, sep, t = v.partition("T")
    return sep == "T" and _date(d) and _time(t)


@FORMATS.checks("date")
def _date(v):
    try:
        return not isinstance(v, str) or (len(v) == 10 and bool(datetime.date.fromisoformat(v)))
    except ValueError:
        return False


@FORMATS.checks("uuid")
def _uuid(v):
    try:
        return not isinstance(v, str) or (len(v) == 36 and bool(uuid.UUID(v)))
    except ValueError:
        return False


@FORMATS.checks("ipv4")
def _ipv4(v):
    try:
        return not isinstance(v, str) or bool(ipaddress.IPv4Address(v))
    except ValueError:
        return False


def validate(text, schema):
    """The JSON text parses and validates against schema (formats included)."""
    value = json.loads(text)
    cls = jsonschema.validators.validator_for(schema)
    cls(schema, format_checker=FORMATS).validate(value)
    return value


def rf(schema, name="out"):
    return {"type": "json_schema", "json_schema": {"name": name, "strict": True, "schema": schema}}


SMALL = {"type": "object", "properties": {
    "ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": -5, "maximum": 40},
    "tag": {"enum": ["a", "b"]}, "v": {"type": ["null", "number"], "minimum": 0, "maximum": 2}},
    "required": ["ok", "n"], "additionalProperties": False}


def test_validator_catches_wrong_values():
    """The checker the corpus relies on refuses what it must (not vacuous)."""
    for text, schema in [("{\"ok\": true}", SMALL), ("\"2023-02-30\"", {"format": "date"}),
                         ("\"24:00:00Z\"", {"format": "time"}), ("\"1.2.3\"", {"format": "ipv4"}),
                         ("\"0000\"", {"format": "uuid"}), ("7", {"maximum": 5})]:
        with pytest.raises(jsonschema.ValidationError):
            validate(text, schema)


# ----------------------------------------------------------------- tiny model


def test_chat_completions_and_session_generate_follow_the_schema(tiny):
    for seed in range(4):
        st, r, _ = tiny.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "JSON please"}], "response_format": rf(SMALL),
            "n": 2, "seed": seed, "temperature": 1, "max_tokens": 200})
        assert st == 200, r
        for c in r["choices"]:
            assert c["finish_reason"] == "stop", c
            validate(c["message"]["content"], SMALL)
        st, r, _ = tiny.post("/v1/completions", {
            "prompt": "JSON:", "response_format": rf({"enum": [1, "two", None]}), "seed": seed})
        assert st == 200 and r["choices"][0]["text"] in ("1", "\"two\"", "null"), r
    st, s, _ = tiny.post("/v1/sessions", {})
    assert st == 201
    st, r, _ = tiny.post(f"/v1/sessions/{s['id']}/generate", {
        "text": " data:", "response_format": rf(SMALL), "stream": False, "seed": 2,
        "max_tokens": 200})
    assert st == 200 and r["finish_reason"] == "stop", r
    validate(r["text"], SMALL)


def test_streamed_json_object(tiny):
    # any JSON object: the tiny model's strings can run long, so only the
    # finished answers are judged
    done = 0
    for seed in range(6):
        st, _, raw = tiny.request("POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "obj"}], "stream": True, "seed": seed,
            "response_format": {"type": "json_object"}, "max_tokens": 120})
        assert st == 200
        evs, fin = sse_json(raw)
        assert fin
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in evs if e["choices"])
        assert text.startswith("{"), text
        if evs[-1]["choices"][0]["finish_reason"] == "stop":
            assert isinstance(json.loads(text), dict)
            done += 1
    assert done >= 1


def test_openai_client_response_format(tiny):
    c = openai.OpenAI(base_url=tiny.url("/v1"), api_key="unused", max_retries=0, timeout=300)
    model = c.models.list().data[0].id
    r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "?"}],
                                  response_format=rf(SMALL, "small"), n=3, seed=4,
                                  max_tokens=200)
    for ch in r.choices:
        assert ch.finish_reason == "stop"
        validate(ch.message.content, SMALL)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=model, messages=[{"role": "user", "content": "?"}],
                                  response_format=rf({"type": "integer", "multipleOf": 3}))
    assert "'multipleOf' is not supported" in str(e.value)


def test_openai_client_pydantic_model(tiny):
    pydantic = pytest.importorskip("pydantic")

    class Point(pydantic.BaseModel):
        x: bool
        label: str = pydantic.Field(max_length=4)
        tags: list[bool] = pydantic.Field(max_length=2)

    c = openai.OpenAI(base_url=tiny.url("/v1"), api_key="unused", max_retries=0, timeout=300)
    model = c.models.list().data[0].id
    parse = getattr(c.chat.completions, "parse", None) or c.beta.chat.completions.parse
    r = parse(model=model, messages=[{"role": "user", "content": "a point"}],
              response_format=Point, seed=1, max_tokens=200)
    ch = r.choices[0]
    assert ch.finish_reason == "stop", ch
    assert isinstance(ch.message.parsed, Point)
    validate(ch.message.content, Point.model_json_schema())


def test_ollama_format(tiny):
    model = tiny.json("GET", "/v1/models")[1]["data"][0]["id"]
    schema = {"type": "object", "properties": {"yes": {"type": "boolean"}}, "required": ["yes"]}
    st, r, _ = tiny.post("/api/chat", {"model": model, "stream": False, "format": schema,
                                       "messages": [{"role": "user", "content": "x"}],
                                       "options": {"seed": 1, "num_predict": 60}})
    assert st == 200 and r["done_reason"] == "stop", r
    validate(r["message"]["content"], schema)
    st, r, _ = tiny.post("/api/generate", {"model": model, "stream": False, "format": "json",
                                           "prompt": "x", "options": {"seed": 3, "num_predict": 60}})
    assert st == 200 and r["response"].startswith("{"), r
    if r["done_reason"] == "stop":
        assert isinstance(json.loads(r["response"]), dict)
    st, r, _ = tiny.post("/api/generate", {"model": model, "stream": False, "prompt": "x",
                                           "format": {"type": "string", "format": "uri"}})
    assert st == 400 and "'format' 'uri' is not supported" in r["error"], r


UNSUPPORTED = [
    ({"type": "integer", "multipleOf": 2}, "S: 'multipleOf' is not supported"),
    ({"type": "object", "properties": {"a": {"not": {"type": "null"}}}},
     "S.properties.a: 'not' is not supported"),
    ({"if": {"type": "string"}, "then": {"maxLength": 2}}, "S: 'if' is not supported"),
    ({"type": "object", "patternProperties": {"^x": {}}}, "'patternProperties' is not supported"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
     "'uniqueItems': true is not supported"),
    ({"type": "string", "pattern": "^(?!no)"}, "a lookaround"),
    ({"type": "string", "format": "hostname"}, "'format' 'hostname' is not supported"),
    ({"allOf": [{"type": "string"}, {"maxLength": 2}]}, "'allOf' of more than one schema"),
    ({"$ref": "#/$defs/nope"}, "names nothing in the schema"),
    ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "refers back to itself"),
    # counts above 1000 (1001 once passed: an off-by-one)
    ({"type": "array", "maxItems": 1001}, "S: 'maxItems' is 1001; above 1000 is not supported"),
    ({"type": "array", "minItems": 1001}, "S: 'minItems' is 1001; above 1000 is not supported"),
]


@pytest.mark.parametrize("schema,msg", UNSUPPORTED)
def test_unsupported_schema_features_400(tiny, schema, msg):
    msg = msg.replace("S", "response_format.json_schema.schema", 1) if msg.startswith("S") else msg
    for path in ("/v1/chat/completions", "/v1/completions"):
        body = {"response_format": rf(schema), "max_tokens": 4}
        body.update({"messages": [{"role": "user", "content": "x"}]} if "chat" in path
                    else {"prompt": "x"})
        st, r, _ = tiny.post(path, body)
        assert st == 400, r
        assert msg in r["error"]["message"], r
        assert r["error"]["param"] == "response_format.json_schema.schema"


def test_other_refusals(tiny):
    m = [{"role": "user", "content": "x"}]
    st, r, _ = tiny.post("/v1/chat/completions", {"messages": m, "grammar": 'root ::= "a"',
                                                  "response_format": {"type": "json_object"}})
    assert st == 400 and r["error"]["param"] == "grammar", r
    st, r, _ = tiny.post("/v1/chat/completions", {"messages": m,
                                                  "response_format": {"type": "json_schema"}})
    assert st == 400 and r["error"]["param"] == "response_format.json_schema", r
    # a schema no finite value satisfies: the grammar can never end
    st, r, _ = tiny.post("/v1/chat/completions", {"messages": m, "response_format": rf(
        {"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]})})
    assert st == 400 and r["error"]["param"] == "response_format", r
    assert "the grammar of its schema is invalid" in r["error"]["message"], r
    # text is no constraint
    st, r, _ = tiny.post("/v1/chat/completions", {"messages": m, "max_tokens": 3,
                                                  "response_format": {"type": "text"}})
    assert st == 200, r


def test_many_optional_properties(tiny):
    """256 optional properties, the documented bound: the grammar keeps a
    parse stack per property that can come next (259 after "{"), within
    the stack bound; it was refused while generating (500 'too
    ambiguous')."""
    schema = {"type": "object", "additionalProperties": False,
              "properties": {f"p{i}": {"type": "integer"} for i in range(256)}}
    for seed in range(3):
        st, r, _ = tiny.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "JSON please"}],
            "response_format": rf(schema), "seed": seed, "temperature": 1, "max_tokens": 60})
        assert st == 200, r
        c = r["choices"][0]
        if c["finish_reason"] == "stop":
            validate(c["message"]["content"], schema)


@pytest.mark.parametrize("stream", [False, True])
def test_ambiguous_schema_refused_when_it_arrives(tiny, stream):
    """A pattern whose repetition of a repetition reads every split of its
    x's many ways: refused with 400 naming the ambiguity before any answer
    starts (it was a 500 at generation, or an error inside a 200 stream)."""
    schema = {"type": "string", "pattern": "^(x{0,1000}){0,1000}$"}
    for path in ("/v1/chat/completions", "/v1/completions"):
        body = {"response_format": rf(schema), "max_tokens": 8, "stream": stream}
        body.update({"messages": [{"role": "user", "content": "x"}]} if "chat" in path
                    else {"prompt": "x"})
        st, r, _ = tiny.post(path, body)
        assert st == 400, r
        e = r["error"]
        assert e["param"] == "response_format" and e["code"] == "invalid_value", e
        assert "too ambiguous" in e["message"] and "after the text" in e["message"], e
    st, r, _ = tiny.post("/api/chat", {"model": tiny.model_id, "stream": stream, "format": schema,
                                       "messages": [{"role": "user", "content": "x"}]})
    assert st == 400 and "too ambiguous" in r["error"], r


# ----------------------------------------------------------------- real model


def test_corpus_is_large_and_well_formed():
    assert len(CORPUS) >= 30
    for f in CORPUS:
        with open(f) as fh:
            s = json.load(fh)
        jsonschema.validators.validator_for(s).check_schema(s)


@pytest.mark.parametrize("path", CORPUS, ids=[os.path.basename(p)[:-5] for p in CORPUS])
def test_corpus_real_model(real, path):
    with open(path) as fh:
        schema = json.load(fh)
    st, r, _ = real.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Reply with a short JSON value for this "
                      "schema:\n" + json.dumps(schema)}],
        "response_format": rf(schema), "n": 5, "temperature": 1, "seed": 7,
        "max_tokens": 400})
    assert st == 200, r
    assert len(r["choices"]) == 5
    for c in r["choices"]:
        # a choice cut by max_tokens would be a fault of this test's sizing
        assert c["finish_reason"] == "stop", (path, c)
        validate(c["message"]["content"], schema)
