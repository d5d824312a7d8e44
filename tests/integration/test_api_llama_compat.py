"""What clients of llama.cpp's server, and browsers, rely on, against a real
`darkserve serve`: the top-level "json_schema" and response_format's schema
honoured (never dropped), CORS preflights that allow the headers an SDK asks
for, an unknown route's 404 type, /detokenize's "content".

Constrained outputs are checked by parsing and validating what came back
(the random tiny model writes arbitrary values wherever the schema leaves
room), never against a hard-coded text.
"""
import json

import jsonschema

from ds_server import TINY

SCHEMA = {"type": "object", "properties": {"a": {"const": 1}, "b": {"type": "boolean"}},
          "required": ["a", "b"], "additionalProperties": False}


def completion_text(srv, path, body):
    st, r, _ = srv.post(path, dict({"prompt": "Answer:", "max_tokens": 64, "seed": 3}, **body))
    assert st == 200, r
    return r["choices"][0]["text"]


def test_top_level_json_schema_is_honoured(tiny):
    for path in ("/v1/completions", "/v1/chat/completions"):
        body = {"json_schema": {"const": "42"}}
        if "chat" in path:
            st, r, _ = tiny.post(path, {"messages": [{"role": "user", "content": "x"}],
                                        "max_tokens": 16, "seed": 3, **body})
            assert st == 200, r
            text = r["choices"][0]["message"]["content"]
        else:
            text = completion_text(tiny, path, body)
        assert json.loads(text) == "42", text
    text = completion_text(tiny, "/v1/completions", {"json_schema": SCHEMA})
    jsonschema.validate(json.loads(text), SCHEMA)


def test_response_format_schema_beside_the_type(tiny):
    for t in ("json_object", "json_schema"):
        text = completion_text(tiny, "/v1/completions",
                               {"response_format": {"type": t, "schema": SCHEMA}})
        jsonschema.validate(json.loads(text), SCHEMA)


def test_schema_refusals(tiny):
    def err(body, param):
        st, r, _ = tiny.post("/v1/completions", dict({"prompt": "x"}, **body))
        assert st == 400 and r["error"]["param"] == param, r
        return r["error"]
    e = err({"json_schema": {"const": 1}, "grammar": "root ::= \"a\""}, "json_schema")
    assert "grammar" in e["message"]
    err({"json_schema": {"const": 1}, "response_format": {"type": "json_object"}}, "json_schema")
    e = err({"json_schema": {"type": "integer", "multipleOf": 3}}, "json_schema")
    assert e["code"] == "unsupported_parameter" and "multipleOf" in e["message"], e
    e = err({"response_format": {"type": "json_object", "schema": {"not": {}}}},
            "response_format.schema")
    assert e["code"] == "unsupported_parameter", e


# ------------------------------------------------------------------- CORS


def test_cors_preflight_allows_the_sdk_headers(servers):
    srv = servers(model=TINY, args=["--cors-origin", "https://app.example",
                                    "--api-key", "sk-test"])
    st, hd, _ = srv.request("OPTIONS", "/v1/chat/completions", headers={
        "Origin": "https://app.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers":
            "authorization,content-type,x-stainless-os,x-stainless-arch,x-stainless-lang"})
    assert st == 204
    assert hd["access-control-allow-origin"] == "https://app.example"
    allowed = [h.strip().lower() for h in hd["access-control-allow-headers"].split(",")]
    for h in ("authorization", "content-type", "x-stainless-os", "x-stainless-arch",
              "x-stainless-lang"):
        assert allowed.count(h) == 1, allowed
    assert "POST" in hd["access-control-allow-methods"]
    assert int(hd["access-control-max-age"]) > 0
    # another origin gets nothing to allow
    st, hd, _ = srv.request("OPTIONS", "/v1/chat/completions", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "x-stainless-os"})
    assert st == 204 and "access-control-allow-headers" not in hd
    assert "access-control-allow-origin" not in hd


# ------------------------------------------------------------ small routes


def test_unknown_route_is_not_found_error(tiny):
    st, r, _ = tiny.json("GET", "/no/such/route")
    assert st == 404
    assert r["error"]["type"] == "not_found_error" and r["error"]["code"] == "not_found", r


def test_detokenize_answers_content(tiny):
    st, t, _ = tiny.post("/tokenize", {"content": "hello world", "with_pieces": True})
    assert st == 200
    ids = [p["id"] for p in t["tokens"]]
    assert "".join(p["piece"] for p in t["tokens"]) == "hello world"
    st, r, _ = tiny.post("/detokenize", {"tokens": ids})
    assert st == 200 and r["content"] == r["text"] == "hello world", r
