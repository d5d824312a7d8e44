"""`grammar` and `logit_bias` on the generation routes, against
the real server on the tiny model: every answer under a grammar is a string
of its language (n choices, streamed and not, chat, completions, session
generate, the official openai client through extra_body), logit_bias forces
and bans tokens, and malformed values get a 400 that names the field (and,
for a grammar, the line and column of the fault)."""
import json
import re

import openai

from ds_server import sse_json

YESNO = 'root ::= "yes" | "no"'
# numbers in a bracketed list, at most three, no spaces
LIST = 'root ::= "[" ( num ( "," num ){0,2} )? "]"\nnum ::= "-"? [1-9] [0-9]{0,2}'
LIST_RE = re.compile(r"^\[(-?[1-9][0-9]{0,2}(,-?[1-9][0-9]{0,2}){0,2})?\]$")


def test_completions_and_chat_follow_the_grammar(tiny):
    for seed in range(6):
        st, r, _ = tiny.post("/v1/completions", {"prompt": "Answer:", "grammar": YESNO, "n": 3,
                                                 "temperature": 1, "seed": seed,
                                                 "max_tokens": 8})
        assert st == 200, r
        for c in r["choices"]:
            assert c["text"] in ("yes", "no") and c["finish_reason"] == "stop", c
        st, r, _ = tiny.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "A list?"}], "grammar": LIST,
            "temperature": 1, "top_k": 50, "seed": seed, "max_tokens": 40})
        assert st == 200, r
        c = r["choices"][0]
        assert c["finish_reason"] == "stop" and LIST_RE.match(c["message"]["content"]), c


def test_streamed_and_session_generate_follow_the_grammar(tiny):
    st, hd, raw = tiny.request("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "yes or no"}], "grammar": YESNO,
        "stream": True, "seed": 3, "temperature": 1})
    assert st == 200
    evs, done = sse_json(raw)
    assert done
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in evs if e["choices"])
    assert text in ("yes", "no")
    assert evs[-1]["choices"][0]["finish_reason"] == "stop"

    st, s, _ = tiny.post("/v1/sessions", {})
    assert st == 201
    for k in range(3):
        st, _, raw = tiny.request("POST", f"/v1/sessions/{s['id']}/generate", {
            "text": " Numbers:", "grammar": LIST, "temperature": 1, "seed": k,
            "max_tokens": 40})
        assert st == 200
        lines = [json.loads(l) for l in raw.decode().splitlines() if l]
        assert lines[-1]["done"] and lines[-1]["finish_reason"] == "stop", lines[-1]
        text = "".join(l.get("text", "") for l in lines[:-1])
        assert LIST_RE.match(text), text
    st, r, _ = tiny.post(f"/v1/sessions/{s['id']}/generate", {
        "text": " ok?", "grammar": YESNO, "stream": False, "seed": 1})
    assert st == 200 and r["text"] in ("yes", "no") and r["finish_reason"] == "stop", r


def test_openai_client_grammar_and_logit_bias(tiny):
    c = openai.OpenAI(base_url=tiny.url("/v1"), api_key="unused", max_retries=0, timeout=300)
    model = c.models.list().data[0].id
    r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "?"}],
                                  extra_body={"grammar": YESNO}, n=2, seed=9, max_tokens=8)
    assert all(ch.message.content in ("yes", "no") for ch in r.choices)
    # ban every token the grammar allows but one: the answer is forced
    no_ids = tiny.post("/tokenize", {"text": "no"})[1]["tokens"]
    r = c.completions.create(model=model, prompt="?", seed=9, max_tokens=8,
                             logit_bias={str(no_ids[0]): -100},
                             extra_body={"grammar": YESNO})
    assert r.choices[0].text == "yes"


def session_tokens(srv, body):
    """Token ids a fresh session generates for body (not streamed)."""
    st, sess, _ = srv.post("/v1/sessions", {})
    assert st == 201
    st, r, _ = srv.post(f"/v1/sessions/{sess['id']}/generate", dict(body, stream=False))
    assert st == 200, r
    return r["tokens"]


def test_logit_bias_forces_and_bans(tiny):
    tk = tiny.post("/tokenize", {"text": "hello", "with_pieces": True})[1]["tokens"][0]
    t, piece = tk["id"], tk["piece"]
    got = session_tokens(tiny, {"text": "Once", "max_tokens": 5, "seed": 4, "temperature": 1,
                                "logit_bias": {str(t): 100}})
    assert got == [t] * 5
    # greedy: banning the first token gives another first token
    body = {"text": "Once", "max_tokens": 1, "temperature": 0}
    first = session_tokens(tiny, body)[0]
    assert session_tokens(tiny, dict(body, logit_bias={str(first): -100}))[0] != first
    # the same on the OpenAI route
    st, r, _ = tiny.post("/v1/completions", {"prompt": "Once", "max_tokens": 3, "seed": 4,
                                             "logit_bias": {str(t): 100}})
    assert st == 200 and r["choices"][0]["text"] == piece * 3, r
    # with a grammar and a bias that favours a token the grammar forbids
    st, r, _ = tiny.post("/v1/completions", {"prompt": "x", "grammar": YESNO, "seed": 2,
                                             "logit_bias": {str(t): 100}})
    assert st == 200 and r["choices"][0]["text"] in ("yes", "no")


def check_400(resp, param, *says):
    st, r, _ = resp
    assert st == 400, r
    e = r["error"]
    assert e["param"] == param and e["code"] == "invalid_value", e
    for s in says:
        assert s in e["message"], e
    return e


def test_bad_grammar_400_names_the_position(tiny):
    routes = [("/v1/completions", {"prompt": "x"}),
              ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})]
    st, s, _ = tiny.post("/v1/sessions", {})
    routes.append((f"/v1/sessions/{s['id']}/generate", {"text": "x", "stream": False}))
    for path, base in routes:
        check_400(tiny.post(path, dict(base, grammar='root ::= "yes" | nope')), "grammar",
                  "line 1, column 18", "'nope' is not defined")
        check_400(tiny.post(path, dict(base, grammar='root ::= "a"\n  ( "b"')), "grammar",
                  "line 2, column 3")
        check_400(tiny.post(path, dict(base, grammar="root ::= root \"a\" | \"b\"")), "grammar",
                  "left recursion")
        check_400(tiny.post(path, dict(base, grammar="x ::= \"a\"")), "grammar",
                  "no rule named 'root'")
        check_400(tiny.post(path, dict(base, grammar="root ::= \"a\"{5000}")), "grammar",
                  "over a limit", "above 1000")
        check_400(tiny.post(path, dict(base, grammar=["root"])), "grammar", "must be a string")
    # the session is unchanged by the refused requests
    st, info, _ = tiny.json("GET", f"/v1/sessions/{s['id']}")
    assert info["tokens"] == 0
    # ambiguity blowing up before any text: refused up front
    amb = "root ::= " + " ".join(["x"] * 24) + ' "a"\nx ::= "" | ""'
    check_400(tiny.post("/v1/completions", {"prompt": "x", "grammar": amb}), "grammar",
              "over a limit", "ambiguous")


def test_refused_generate_leaves_the_session_free(tiny):
    # a refusal answered after the session was taken must give it back
    # before the answer goes out: the client's next request, sent at once,
    # finds it free (400 again), never 409 session_busy
    st, s, _ = tiny.post("/v1/sessions", {})
    path = f"/v1/sessions/{s['id']}/generate"
    for _ in range(100):
        check_400(tiny.post(path, {"text": "x", "grammar": "x ::= \"a\""}), "grammar",
                  "no rule named 'root'")
    st, out, _ = tiny.post(path, {"text": "x", "max_tokens": 2, "stream": False})
    assert st == 200, out


def test_bad_logit_bias_400(tiny):
    base = {"prompt": "x", "max_tokens": 2}
    check_400(tiny.post("/v1/completions", dict(base, logit_bias={"5": 101})),
              "logit_bias.5", "between -100 and 100")
    check_400(tiny.post("/v1/completions", dict(base, logit_bias={"5": "1"})),
              "logit_bias.5", "between -100 and 100")
    check_400(tiny.post("/v1/completions", dict(base, logit_bias={"abc": 1})),
              "logit_bias.abc", "not a token id")
    check_400(tiny.post("/v1/completions", dict(base, logit_bias={"99999999": 1})),
              "logit_bias.99999999", "not in the vocabulary")
    check_400(tiny.post("/v1/completions", dict(base, logit_bias=[1])), "logit_bias",
              "must be an object")
    check_400(tiny.post("/v1/completions",
                        dict(base, logit_bias={str(i): 1 for i in range(1025)})),
              "logit_bias", "at most 1024")
    st, r, _ = tiny.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "logit_bias": {}})
    assert st == 200, r
