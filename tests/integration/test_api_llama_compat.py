"""What clients of llama.cpp's server, and browsers, rely on, against a real
`darkserve serve`: the top-level "json_schema" and response_format's schema
honoured (never dropped), CORS preflights that allow the headers an SDK asks
for, an unknown route's 404 type, /detokenize's "content".

Constrained outputs are checked by parsing and validating what came back
(the random tiny model writes arbitrary values wherever the schema leaves
room), never against a hard-coded text.
"""
import json
import os

import jsonschema

from ds_server import TINY, TINY_GEMMA, read_text, sse_json

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


# ---------------------------------------- llama.cpp's native /completion


def native(srv, body, path="/completion"):
    st, r, _ = srv.post(path, body)
    assert st == 200, r
    return r


def native_stream(srv, body, path="/completion"):
    st, _, raw = srv.request("POST", path, dict(body, stream=True))
    assert st == 200, raw
    evs, done = sse_json(raw)
    assert done
    return evs


def test_n_predict_bounds_the_tokens_and_content_is_the_text(tiny):
    for n in (1, 8, 21):
        r = native(tiny, {"prompt": "I believe the meaning of life is", "n_predict": n,
                          "ignore_eos": True, "seed": 4})
        assert r["tokens_predicted"] == n and r["usage"]["completion_tokens"] == n, r
        assert r["stop"] is True and r["stop_type"] == "limit"
        assert r["content"] == r["choices"][0]["text"]
        assert r["tokens_evaluated"] == len(tokens_of(tiny, "I believe the meaning of life is"))
        assert r["timings"]["predicted_n"] == n
        assert r["generation_settings"]["n_predict"] == n
        assert r["generation_settings"]["seed"] == 4
    # the same text as /v1/completions with the same settings
    body = {"prompt": "Once upon", "seed": 9, "temperature": 0.7}
    a = native(tiny, dict(body, n_predict=12))
    b = tiny.post("/v1/completions", dict(body, max_tokens=12))[1]
    assert a["content"] == b["choices"][0]["text"]
    # /completions is the same native endpoint
    c = native(tiny, dict(body, n_predict=12), path="/completions")
    assert c["content"] == a["content"] and c["object"] == "text_completion"


def tokens_of(srv, text, special=True):
    st, r, _ = srv.post("/tokenize", {"text": text, "add_special": special})
    assert st == 200
    return r["tokens"]


def test_stream_concatenates_to_the_answer(tiny):
    body = {"prompt": "The weather", "n_predict": 16, "seed": 11, "temperature": 0.9,
            "return_tokens": True}
    whole = native(tiny, body)
    evs = native_stream(tiny, body)
    assert all(e["stop"] is False for e in evs[:-1]) and evs[-1]["stop"] is True
    assert "".join(e["content"] for e in evs) == whole["content"]
    assert [t for e in evs[:-1] for t in e["tokens"]] == whole["tokens"]
    last = evs[-1]
    assert last["tokens_predicted"] == whole["tokens_predicted"]
    assert last["stop_type"] == whole["stop_type"]
    # token ids of the text are its ids
    st, d, _ = tiny.post("/detokenize", {"tokens": whole["tokens"]})
    assert d["content"] == whole["content"]
    # streamed chunks carry their token's id without return_tokens too (as
    # llama.cpp's do); the answer does not
    body.pop("return_tokens")
    assert native(tiny, body)["tokens"] == []
    evs = native_stream(tiny, body)
    assert [t for e in evs[:-1] for t in e["tokens"]] == whole["tokens"]


def test_prompt_as_tokens_and_mixed(tiny):
    body = {"n_predict": 10, "seed": 2}
    text = native(tiny, dict(body, prompt="Hello there"))
    ids = native(tiny, dict(body, prompt=tokens_of(tiny, "Hello there")))
    assert ids["content"] == text["content"]
    mid = tokens_of(tiny, " my", special=False)
    mixed = native(tiny, dict(body, prompt=["Hello", *mid, " friend"]))
    flat = tokens_of(tiny, "Hello") + mid + tokens_of(tiny, " friend", special=False)
    assert mixed["tokens_evaluated"] == len(flat)
    assert mixed["content"] == native(tiny, dict(body, prompt=flat))["content"]


def test_n_probs_stop_and_grammar(tiny):
    r = native(tiny, {"prompt": "a b c", "n_predict": 6, "n_probs": 3, "seed": 1,
                      "ignore_eos": True})
    probs = r["completion_probabilities"]
    assert len(probs) == 6
    for p in probs:
        assert set(p) >= {"id", "token", "logprob", "bytes", "top_logprobs"}
        assert len(p["top_logprobs"]) == 3
        assert all("id" in t for t in p["top_logprobs"])
    assert "".join(p["token"] for p in probs) == r["content"]
    # a stop string ends the text before it
    free = native(tiny, {"prompt": "a b c", "n_predict": 40, "seed": 5, "ignore_eos": True})
    word = free["content"][5:8]
    assert len(word) == 3
    s = native(tiny, {"prompt": "a b c", "n_predict": 40, "seed": 5, "ignore_eos": True,
                      "stop": [word]})
    assert s["stop_type"] == "word" and s["stopping_word"] == word
    assert s["content"] == free["content"][:free["content"].index(word)]
    g = native(tiny, {"prompt": "x", "n_predict": 20, "grammar": 'root ::= "yes" | "no"'})
    assert g["content"] in ("yes", "no")
    j = native(tiny, {"prompt": "x", "n_predict": 64, "json_schema": SCHEMA})
    jsonschema.validate(json.loads(j["content"]), SCHEMA)


def test_native_refusals(tiny):
    def refused(body, param, code="unsupported_parameter"):
        st, r, _ = tiny.post("/completion", dict({"prompt": "x"}, **body))
        assert st == 400, r
        assert r["error"]["param"] == param and r["error"]["code"] == code, r
    refused({"mirostat": 2}, "mirostat")
    refused({"typical_p": 0.5}, "typical_p")
    refused({"dry_multiplier": 0.8}, "dry_multiplier")
    refused({"samplers": ["top_k"]}, "samplers")
    refused({"n_predict": 0}, "n_predict")
    refused({"n_predict": 4, "max_tokens": 5}, "n_predict", "invalid_value")
    refused({"n_probs": 21}, "n_probs", "invalid_value")
    refused({"n_probs": 2, "logprobs": 2}, "n_probs", "invalid_value")
    refused({"id_slot": 3}, "id_slot", "invalid_value")
    refused({"n": 2}, "n")
    refused({"prompt": ["a", "b"]}, "prompt")
    refused({"prompt": [1, "a", {}]}, "prompt[2]", "invalid_value")
    # their off values are accepted
    st, r, _ = tiny.post("/completion", {"prompt": "x", "n_predict": 2, "mirostat": 0,
                                         "typical_p": 1.0, "cache_prompt": False,
                                         "n_keep": -1, "id_slot": -1})
    assert st == 200, r


# ----------------------------------------------- /infill, /props, templates


def fim_model(path):
    """A copy of the tiny model whose last three vocabulary entries are the
    fill-in-the-middle markers (control tokens; the merges that made the old
    entries dropped), so /infill has a vocabulary to run on."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata
    r = gguf.GGUFReader(TINY)
    toks = list(r.get_field("tokenizer.ggml.tokens").contents())
    types = list(r.get_field("tokenizer.ggml.token_type").contents())
    merges = list(r.get_field("tokenizer.ggml.merges").contents())
    old = set(toks[-3:])
    merges = [m for m in merges if m.replace(" ", "") not in old]
    toks[-3:] = ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"]
    types[-3:] = [3, 3, 3]
    A, S, I = gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING, gguf.GGUFValueType.INT32
    w = gguf.GGUFWriter(str(path), "llama")
    copy_with_new_metadata(r, w, {
        "tokenizer.ggml.tokens": MetadataDetails(A, toks, sub_type=S),
        "tokenizer.ggml.token_type": MetadataDetails(A, types, sub_type=I),
        "tokenizer.ggml.merges": MetadataDetails(A, merges, sub_type=S)}, [])
    return [len(toks) - 3, len(toks) - 2, len(toks) - 1]


def test_infill_runs_between_prefix_and_suffix(servers, tmp_path):
    path = tmp_path / "fim.gguf"
    pre, suf, mid = fim_model(path)
    srv = servers(model=str(path))
    body = {"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n\nprint(add(1, 2))\n",
            "prompt": "a", "n_predict": 12, "seed": 8, "temperature": 0.5, "ignore_eos": True}
    r = native(srv, body, path="/infill")
    assert r["tokens_predicted"] == 12 and r["content"] == r["choices"][0]["text"]
    # exactly the completion of <fim_prefix>prefix<fim_suffix>suffix<fim_middle>prompt
    ids = ([pre] + tokens_of(srv, body["input_prefix"], special=False) + [suf]
           + tokens_of(srv, body["input_suffix"], special=False) + [mid]
           + tokens_of(srv, "a", special=False))
    assert r["tokens_evaluated"] == len(ids)
    same = native(srv, {"prompt": ids, "n_predict": 12, "seed": 8, "temperature": 0.5,
                        "ignore_eos": True})
    assert same["content"] == r["content"]
    # marker texts inside the prefix are text, not markers
    r2 = native(srv, dict(body, input_prefix="<fim_suffix>"), path="/infill")
    assert r2["tokens_evaluated"] > 3 + 1
    st, p, _ = srv.json("GET", "/props")
    assert st == 200 and p["infill"] is True
    st, e, _ = srv.post("/infill", dict(body, input_extra=[{"filename": "a.py", "text": "x"}]))
    assert st == 400 and e["error"]["param"] == "input_extra", e


def test_infill_refused_without_fim_tokens(tiny, real):
    for srv in (tiny, real):  # SmolLM2's vocabulary has no FIM markers either
        st, r, _ = srv.post("/infill", {"input_prefix": "a", "input_suffix": "b"})
        assert st == 400 and "fill-in-the-middle" in r["error"]["message"], r
        st, p, _ = srv.json("GET", "/props")
        assert st == 200 and p["infill"] is False


def test_props(tiny):
    st, p, _ = tiny.json("GET", "/props")
    assert st == 200
    st, m, _ = tiny.json("GET", "/v1/models")
    assert p["model_alias"] == m["data"][0]["id"]
    assert p["model_path"] == tiny.model
    # exact attention: the fixture's context (make_tiny_model.py, make_tiny_gemma3.py)
    n_ctx = 512 if tiny.model == TINY else 256
    assert p["default_generation_settings"]["n_ctx"] == n_ctx
    assert p["default_generation_settings"]["params"]["n_predict"] == 256
    assert p["total_slots"] >= 1 and p["modalities"] == {"vision": False, "audio": False}
    if tiny.model == TINY:
        assert "<|im_start|>" in p["chat_template"]
        assert p["eos_token"] == "<|im_end|>"
    else:  # no template in the GGUF: Gemma's turn format
        assert p["chat_template"] == "gemma", p["chat_template"]


def test_apply_template_is_what_chat_reads(tiny_llama):
    tiny = tiny_llama  # ChatML, the tiny Llama's template
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|im_end|>"}]
    st, r, _ = tiny.post("/apply-template", {"messages": msgs})
    assert st == 200
    assert r["prompt"] == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
                           "Hi <|im_end|><|im_end|>\n<|im_start|>assistant\n")
    st, c, _ = tiny.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 1})
    # the chat read as many tokens as the text has, its markers special and the
    # content's marker text plain
    plain = tokens_of(tiny, "Hi <|im_end|>", special=False)
    assert c["usage"]["prompt_tokens"] > len(plain)
    st, e, _ = tiny.post("/apply-template", {"messages": msgs, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]})
    assert st == 400 and e["error"]["param"] == "tools", e
    st, e, _ = tiny.post("/apply-template", {})
    assert st == 400 and e["error"]["param"] == "messages", e


def test_gemma_without_a_template_chats_in_gemma_turns(servers):
    """A Gemma 3 GGUF with no chat template (the base model) is prompted in
    Gemma's turn format, and says so; --chat-template still chooses."""
    assert os.path.exists(TINY_GEMMA), f"{TINY_GEMMA} missing (make builds it)"
    msgs = [{"role": "user", "content": "Hi"}]
    g = servers(model=TINY_GEMMA, name="gemma")
    st, r, _ = g.post("/apply-template", {"messages": msgs})
    assert st == 200, r
    assert "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n" in r["prompt"], r
    assert "Gemma's turn format" in read_text(g.log)
    c = servers(model=TINY_GEMMA, name="gemma_chatml", args=["--chat-template", "chatml"])
    st, r, _ = c.post("/apply-template", {"messages": msgs})
    assert st == 200 and "<|im_start|>user" in r["prompt"], r
