"""A session's pending grammar (docs/API.md "Continuing a constrained
reply"), against the real server on the tiny model: a generate under a JSON
Schema cut short by max_tokens leaves the grammar and the reply so far on
the session; `continue_grammar` finishes the reply under the same grammar,
also on a fork, after an export and import, and after a rollback to the turn
that left it; the whole reply then validates against the schema. Misuse
gets a 400 naming the field, and any other generate clears it."""
import json

import jsonschema

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "n", "tags"],
    "additionalProperties": False,
}
RF = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}}


def create(srv):
    st, r, _ = srv.post("/v1/sessions", {})
    assert st == 201, r
    return r["id"]


def info(srv, sid):
    st, r, _ = srv.json("GET", f"/v1/sessions/{sid}")
    assert st == 200, r
    return r


def generate(srv, sid, status=200, **body):
    body.setdefault("stream", False)
    st, r, _ = srv.post(f"/v1/sessions/{sid}/generate", body)
    assert st == status, r
    return r


def cut(srv, sid, seed=1, stream=False):
    """A constrained reply stopped by max_tokens -> its text."""
    body = {"text": "A thing as JSON:", "response_format": RF, "max_tokens": 4,
            "temperature": 1, "seed": seed}
    if not stream:
        r = generate(srv, sid, **body)
        assert r["finish_reason"] == "length", r
        assert r["session"]["pending_grammar"] == {"bytes": len(r["text"].encode())}, r
        return r["text"]
    st, _, raw = srv.request("POST", f"/v1/sessions/{sid}/generate", dict(body, stream=True))
    assert st == 200
    lines = [json.loads(l) for l in raw.decode().splitlines() if l]
    assert lines[-1]["done"] and lines[-1]["finish_reason"] == "length", lines[-1]
    return "".join(l.get("text", "") for l in lines[:-1])


def finish(srv, sid, seed=2):
    """continue_grammar until the grammar is complete -> the added text."""
    out = ""
    for k in range(20):
        r = generate(srv, sid, continue_grammar=True, max_tokens=24, temperature=1,
                     seed=seed + k)
        out += r["text"]
        if r["finish_reason"] == "stop":
            assert "pending_grammar" not in r["session"], r
            return out
        assert r["finish_reason"] == "length", r
        assert "pending_grammar" in r["session"], r
    raise AssertionError(f"not finished after 20 continues: {out!r}")


def valid(text):
    jsonschema.validate(json.loads(text), SCHEMA)


def test_continue_finishes_the_reply_under_its_grammar(tiny):
    sid = create(tiny)
    head = cut(tiny, sid)
    assert info(tiny, sid)["pending_grammar"] == {"bytes": len(head.encode())}
    valid(head + finish(tiny, sid))
    assert "pending_grammar" not in info(tiny, sid)
    # finished: nothing to continue
    r = generate(tiny, sid, 400, continue_grammar=True)
    assert r["error"]["param"] == "continue_grammar", r


def test_a_fork_continues_the_pending_reply(tiny):
    sid = create(tiny)
    head = cut(tiny, sid, seed=5, stream=True)
    st, f, _ = tiny.post(f"/v1/sessions/{sid}/fork", {})
    assert st in (200, 201), f
    assert info(tiny, f["id"])["pending_grammar"] == {"bytes": len(head.encode())}
    valid(head + finish(tiny, f["id"], seed=7))
    # the source keeps its own, and finishes it too
    assert info(tiny, sid)["pending_grammar"] == {"bytes": len(head.encode())}
    valid(head + finish(tiny, sid, seed=9))


def test_export_import_carries_the_pending_reply(tiny):
    sid = create(tiny)
    head = cut(tiny, sid, seed=11)
    st, hd, blob = tiny.request("GET", f"/v1/sessions/{sid}/state")
    assert st == 200
    tid = create(tiny)
    assert "pending_grammar" not in info(tiny, tid)
    st, _, data = tiny.request("PUT", f"/v1/sessions/{tid}/state", blob,
                               {"Content-Type": "application/octet-stream"})
    assert st == 200, data
    assert info(tiny, tid)["pending_grammar"] == {"bytes": len(head.encode())}
    valid(head + finish(tiny, tid, seed=13))


def test_other_generates_clear_it_and_a_rollback_brings_it_back(tiny):
    sid = create(tiny)
    head = cut(tiny, sid, seed=17)
    generate(tiny, sid, text=" Never mind.", max_tokens=3)
    assert "pending_grammar" not in info(tiny, sid)
    r = generate(tiny, sid, 400, continue_grammar=True)
    assert r["error"]["param"] == "continue_grammar", r
    # the checkpoint after the cut turn has it
    st, r, _ = tiny.post(f"/v1/sessions/{sid}/rollback", {"turns": 1})
    assert st == 200, r
    assert info(tiny, sid)["pending_grammar"] == {"bytes": len(head.encode())}
    valid(head + finish(tiny, sid, seed=19))
    # a regenerate of the cut turn replaces it by its own outcome
    sid = create(tiny)
    cut(tiny, sid, seed=23)
    st, r, _ = tiny.post(f"/v1/sessions/{sid}/regenerate", {"stream": False, "max_tokens": 2})
    assert st == 200, r
    assert "pending_grammar" not in info(tiny, sid)


def test_continue_grammar_misuse_is_400(tiny):
    sid = create(tiny)
    generate(tiny, sid, text="Plain:", max_tokens=2)
    r = generate(tiny, sid, 400, continue_grammar=True)
    assert r["error"]["param"] == "continue_grammar", r
    assert "no pending grammar" in r["error"]["message"], r
    cut(tiny, sid, seed=29)
    for extra, param in (({"text": " more"}, "text"),
                         ({"messages": [{"role": "user", "content": "hi"}]}, "messages"),
                         ({"grammar": 'root ::= "x"'}, "grammar"),
                         ({"response_format": {"type": "json_object"}}, "response_format"),
                         ({"response_format": RF}, "response_format")):
        r = generate(tiny, sid, 400, continue_grammar=True, **extra)
        assert r["error"]["param"] == param, r
    r = generate(tiny, sid, 400, continue_grammar="yes")
    assert r["error"]["param"] == "continue_grammar", r
    st, r, _ = tiny.post(f"/v1/sessions/{sid}/regenerate", {"continue_grammar": True})
    assert st == 400 and r["error"]["param"] == "continue_grammar", r
    # none of them touched it
    assert "pending_grammar" in info(tiny, sid)


def test_the_pending_reply_survives_a_restart(servers):
    """Kept in the session's file: listed after a restart (from the file's
    head) and continued once the session is read back."""
    srv = servers(name="restart")
    sid = create(srv)
    head = cut(srv, sid, seed=31)
    assert srv.stop() == 0
    srv.start()
    assert info(srv, sid)["pending_grammar"] == {"bytes": len(head.encode())}
    valid(head + finish(srv, sid, seed=37))
