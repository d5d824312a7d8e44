"""Turn checkpoints, rollback and regenerate (docs/API.md "Turns and
checkpoints") against the real server: a rollback then the same turn gives
the original reply token for token (greedy); a regenerate after 20 turns
feeds only the last turn's input again (usage.prompt_tokens, not time);
checkpoints survive kill -9 and export -> import; every refusal is a clear
4xx in the project's error format.

Expected replies are always the server's own, produced before the
operation under test, never hard-coded."""
import json
import os
import signal

from ds_server import MODEL


def create(srv, body=None):
    st, r, _ = srv.post("/v1/sessions", body or {})
    assert st == 201, r
    return r["id"]


def turn(srv, sid, content, max_tokens=6, **kw):
    """One chat turn, greedy, not streamed -> the answer."""
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "stream": False}
    body.update(kw)
    st, r, _ = srv.post(f"/v1/sessions/{sid}/generate", body)
    assert st == 200, r
    return r


def info(srv, sid):
    st, r, _ = srv.json("GET", f"/v1/sessions/{sid}")
    assert st == 200, r
    return r


def rollback(srv, sid, turns=None, status=200):
    st, r, _ = srv.post(f"/v1/sessions/{sid}/rollback", {} if turns is None else {"turns": turns})
    assert st == status, r
    return r


def regenerate(srv, sid, status=200, **body):
    body.setdefault("stream", False)
    st, r, _ = srv.post(f"/v1/sessions/{sid}/regenerate", body)
    assert st == status, r
    return r


def error(r, status_code, param=None):
    """The project's error object, with its code and param."""
    assert set(r) == {"error"} and set(r["error"]) == {"message", "type", "param", "code"}, r
    e = r["error"]
    assert e["code"] == status_code, e
    assert e["param"] == param, e
    assert e["message"], e
    return e


def ckpt_files(srv, sid):
    return sorted(int(f.split(".")[1]) for f in os.listdir(srv.session_dir)
                  if f.startswith(sid + ".") and f.split(".")[1].isdigit())


def test_turns_and_checkpoints_are_listed(tiny):
    """Every append or generate is a turn; the session keeps its state
    before each one, listed by GET with the tokens it held."""
    sid = create(tiny, {"messages": [{"role": "user", "content": "You are terse."}]})
    s0 = info(tiny, sid)
    assert s0["turns"] == 0 and s0["checkpoints"] == []
    history = [s0["tokens"]]
    for i in range(3):
        r = turn(tiny, sid, f"question {i}")
        assert r["session"]["turns"] == i + 1
        history.append(r["session"]["tokens"])
    st, a, _ = tiny.post(f"/v1/sessions/{sid}/append", {"text": " more context"})
    assert st == 200 and a["turns"] == 4
    history.append(a["tokens"])
    # an append that adds nothing is no turn
    st, a2, _ = tiny.post(f"/v1/sessions/{sid}/append", {"text": ""})
    assert st == 200 and a2["turns"] == 4
    s = info(tiny, sid)
    assert s["turns"] == 4 and s["tokens"] == history[4]
    assert [(c["turn"], c["tokens"]) for c in s["checkpoints"]] == \
        [(t, history[t]) for t in range(4)]
    for c in s["checkpoints"]:  # each the file the session had after that turn
        assert c["bytes"] == os.path.getsize(os.path.join(tiny.session_dir,
                                                          f"{sid}.{c['turn']}"))
    assert ckpt_files(tiny, sid) == [0, 1, 2, 3]
    # the list shows them too
    st, lst, _ = tiny.json("GET", "/v1/sessions?limit=1000")
    mine = [x for x in lst["data"] if x["id"] == sid][0]
    assert mine["checkpoints"] == s["checkpoints"] and mine["turns"] == 4


def test_rollback_then_the_same_turn_gives_the_same_reply(servers):
    """Greedy, on the default attention of the real model: back one turn
    and the same turn again is the original reply token for token; back
    two turns likewise; nothing of the history is read again (the prompt
    of the repeated turn is its own tokens)."""
    srv = servers(model=MODEL, attn=None, name="real")
    sid = create(srv, {"system": "You are a helpful assistant."})
    s0 = info(srv, sid)
    assert s0["attention"]["kind"] == "darkformer"
    r1 = turn(srv, sid, "Name a color.", max_tokens=12)
    r2 = turn(srv, sid, "Name an animal.", max_tokens=12)
    r3 = turn(srv, sid, "Name a city.", max_tokens=12)
    back = rollback(srv, sid, 1)
    assert back["turns"] == 2 and back["tokens"] == r2["session"]["tokens"]
    assert [c["turn"] for c in back["checkpoints"]] == [0, 1]
    again = turn(srv, sid, "Name a city.", max_tokens=12)
    assert again["tokens"] == r3["tokens"] and again["text"] == r3["text"]
    assert again["usage"]["prompt_tokens"] == r3["usage"]["prompt_tokens"]
    back = rollback(srv, sid, 2)
    assert back["turns"] == 1 and back["tokens"] == r1["session"]["tokens"]
    a2 = turn(srv, sid, "Name an animal.", max_tokens=12)
    a3 = turn(srv, sid, "Name a city.", max_tokens=12)
    assert (a2["tokens"], a3["tokens"]) == (r2["tokens"], r3["tokens"])
    # a checkpoint is the file the session had after that turn: its bytes
    # are that state's (the window fills up to 256 tokens, then constant)
    assert ckpt_files(srv, sid) == [0, 1, 2]
    had = {0: s0["state_bytes"], 1: r1["session"]["state_bytes"],
           2: a2["session"]["state_bytes"]}
    sizes = {t: os.path.getsize(os.path.join(srv.session_dir, f"{sid}.{t}")) for t in had}
    assert sizes == had
    print(f"\nbytes per checkpoint (default attention of the real model): {sizes}, "
          f"state now {a3['session']['state_bytes']}")


def test_regenerate_after_20_turns_costs_one_reply(servers):
    """A regenerate feeds the last turn's input again, never the history:
    its prompt_tokens are the last turn's; the turn count stays; greedy with
    the same parameters gives the same reply, another seed another one.
    (A constant-size state: the tiny model's exact context would end
    before 20 turns.)"""
    tiny = servers(attn="performer", name="perf")
    sid = create(tiny, {"messages": [{"role": "user", "content": "You are terse."}]})
    last = None
    for i in range(20):
        last = turn(tiny, sid, f"turn number {i}", max_tokens=5)
    total = last["session"]["tokens"]
    same = regenerate(tiny, sid, max_tokens=5, temperature=0)
    assert same["usage"]["prompt_tokens"] == last["usage"]["prompt_tokens"]
    assert same["usage"]["prompt_tokens"] * 10 < total
    assert same["tokens"] == last["tokens"]
    assert same["session"]["turns"] == 20 and same["session"]["tokens"] == total
    assert same["session"]["checkpoints"] == last["session"]["checkpoints"]
    other = regenerate(tiny, sid, max_tokens=9, temperature=1.5, seed=7)
    assert other["usage"]["prompt_tokens"] == last["usage"]["prompt_tokens"]
    assert other["usage"]["completion_tokens"] == 9
    assert other["session"]["turns"] == 20
    # the session continues from the regenerated reply
    assert info(tiny, sid)["tokens"] == total - 5 + 9


def test_regenerate_streams(tiny):
    """Streamed like generate (NDJSON by default, SSE on request); the last
    line carries the session."""
    sid = create(tiny)
    turn(tiny, sid, "hello", max_tokens=4)
    st, _, raw = tiny.request("POST", f"/v1/sessions/{sid}/regenerate",
                              {"max_tokens": 4, "temperature": 0})
    lines = [json.loads(l) for l in raw.decode().split("\n") if l.strip()]
    assert st == 200 and lines[-1]["done"] is True
    assert lines[-1]["session"]["turns"] == 1 and len(lines) == 5
    st, hd, raw = tiny.request("POST", f"/v1/sessions/{sid}/regenerate",
                               {"max_tokens": 4, "stream_format": "sse"})
    assert st == 200 and hd["content-type"].startswith("text/event-stream")
    assert raw.decode().rstrip().endswith("data: [DONE]")


def test_chat_completions_with_a_session_are_turns(tiny):
    sid = create(tiny)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "temperature": 0, "session": sid}
    st, r, _ = tiny.post("/v1/chat/completions", body)
    assert st == 200, r
    assert info(tiny, sid)["turns"] == 1
    again = regenerate(tiny, sid, max_tokens=4, temperature=0)
    assert again["usage"]["prompt_tokens"] == r["usage"]["prompt_tokens"]
    assert again["text"] == r["choices"][0]["message"]["content"]
    assert rollback(tiny, sid, 1)["turns"] == 0


def test_checkpoints_survive_kill_9(servers, tmp_path):
    d = str(tmp_path / "sessions")
    a = servers(name="a", session_dir=d)
    sid = create(a, {"system": "sys"})
    replies = [turn(a, sid, f"q{i}") for i in range(3)]
    before = info(a, sid)
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait()
    a.start()
    after = info(a, sid)
    assert after["turns"] == 3 and after["checkpoints"] == before["checkpoints"]
    assert rollback(a, sid, 1)["tokens"] == replies[1]["session"]["tokens"]
    assert turn(a, sid, "q2")["tokens"] == replies[2]["tokens"]
    # and a regenerate after another restart
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait()
    a.start()
    assert regenerate(a, sid, max_tokens=6, temperature=0)["tokens"] == replies[2]["tokens"]


def test_checkpoints_survive_export_import(servers):
    a = servers(name="a")
    sid = create(a, {"system": "sys"})
    replies = [turn(a, sid, f"q{i}") for i in range(3)]
    st, hd, blob = a.request("GET", f"/v1/sessions/{sid}/state")
    assert st == 200 and blob[:4] == b"DSST" and blob[4] == 2  # version 2: with checkpoints
    b = servers(name="b")
    tid = create(b)
    st, hd, data = b.request("PUT", f"/v1/sessions/{tid}/state", blob,
                             {"Content-Type": "application/octet-stream"})
    assert st == 200, data
    got = info(b, tid)
    want = info(a, sid)
    assert (got["turns"], got["checkpoints"]) == (want["turns"], want["checkpoints"])
    assert rollback(b, tid, 2)["tokens"] == replies[0]["session"]["tokens"]
    assert turn(b, tid, "q1")["tokens"] == replies[1]["tokens"]
    assert regenerate(b, tid, max_tokens=6, temperature=0)["tokens"] == replies[1]["tokens"]
    # a server keeping fewer checkpoints keeps the newest
    c = servers(name="c", args=["--checkpoints", "1"])
    uid = create(c)
    st, _, data = c.request("PUT", f"/v1/sessions/{uid}/state", blob,
                            {"Content-Type": "application/octet-stream"})
    assert st == 200, data
    assert [x["turn"] for x in info(c, uid)["checkpoints"]] == [2]


def test_evicted_sessions_roll_back_and_regenerate(servers):
    """With one session in memory, the other is on disk: rollback and
    regenerate read what they need on the I/O thread."""
    srv = servers(args=["--max-sessions", "1"])
    x = create(srv, {"system": "x"})
    rx = [turn(srv, x, f"x{i}") for i in range(2)]
    y = create(srv, {"system": "y"})
    turn(srv, y, "y0")  # x is on disk now
    assert regenerate(srv, x, max_tokens=6, temperature=0)["tokens"] == rx[1]["tokens"]
    turn(srv, y, "y1")
    assert rollback(srv, x, 1)["tokens"] == rx[0]["session"]["tokens"]
    assert turn(srv, x, "x1")["tokens"] == rx[1]["tokens"]


def test_refusals(servers):
    srv = servers(args=["--max-tokens-limit", "64"])
    sid = create(srv)
    # nothing to go back to, nothing to regenerate
    e = error(rollback(srv, sid, 1, status=409), "checkpoint_not_found", "turns")
    assert "has had 0 turns" in e["message"] and e["type"] == "conflict_error"
    e = error(regenerate(srv, sid, status=409), "checkpoint_not_found")
    assert "no turn to regenerate" in e["message"]
    srv.post(f"/v1/sessions/{sid}/append", {"text": "only input"})
    e = error(regenerate(srv, sid, status=409), "checkpoint_not_found")
    assert "generated no reply" in e["message"]
    turn(srv, sid, "q")
    e = error(rollback(srv, sid, 3, status=409), "checkpoint_not_found", "turns")
    assert "has had 2 turns" in e["message"] and "after 0 to 1 turns" in e["message"]
    # bad bodies: 400, naming the field
    for body, param in (({"turns": 0}, "turns"), ({"turns": "1"}, "turns"),
                        ({"turns": 1.5}, "turns"), ([1], None)):
        st, r, _ = srv.post(f"/v1/sessions/{sid}/rollback", body)
        assert st == 400, r
        assert r["error"]["param"] == param, r
    st, _, data = srv.request("POST", f"/v1/sessions/{sid}/rollback", b"{turns",
                              {"Content-Type": "application/json"})
    assert st == 400 and json.loads(data)["error"]["code"] == "invalid_json"
    for body, param in (({"text": "x"}, "text"),
                        ({"messages": [{"role": "user", "content": "x"}]}, "messages"),
                        ({"temperature": 9}, "temperature"), ({"max_tokens": 65}, "max_tokens")):
        e = error(regenerate(srv, sid, status=400, **body),
                  "invalid_value" if param != "max_tokens" else "invalid_value", param)
    # unknown and malformed sessions: 404; wrong method: 405
    error(rollback(srv, "0" * 32, 1, status=404), "session_not_found")
    error(regenerate(srv, "0" * 32, status=404), "session_not_found")
    error(rollback(srv, "nope", 1, status=404), "session_not_found")
    st, r, hd = srv.json("GET", f"/v1/sessions/{sid}/rollback")
    assert st == 405 and "POST" in hd["allow"]
    # the session is untouched by all of that
    s = info(srv, sid)
    assert s["turns"] == 2 and [c["turn"] for c in s["checkpoints"]] == [0, 1]


def test_busy_session_is_409(servers):
    srv = servers(model=MODEL, name="real")
    sid = create(srv, {"system": "You are a storyteller."})
    turn(srv, sid, "Hi.", max_tokens=2)
    c, resp = srv.open_stream(f"/v1/sessions/{sid}/generate",
                              {"messages": [{"role": "user", "content": "Tell a long story."}],
                               "max_tokens": 200})
    try:
        resp.readline()  # generating now
        error(rollback(srv, sid, 1, status=409), "session_busy")
        error(regenerate(srv, sid, status=409), "session_busy")
    finally:
        c.close()


def test_no_checkpoints(servers):
    srv = servers(args=["--checkpoints", "0"])
    sid = create(srv)
    turn(srv, sid, "q")
    assert info(srv, sid)["checkpoints"] == [] and ckpt_files(srv, sid) == []
    e = error(rollback(srv, sid, 1, status=409), "checkpoint_not_found", "turns")
    assert "keeps none" in e["message"]
    error(regenerate(srv, sid, status=409), "checkpoint_not_found")


def test_a_turn_the_disk_refuses_leaves_the_checkpoints_as_they_were(servers, tmp_path):
    """A full or read-only disk (server/api/api_faults.c): the turn is 507 and
    not in the session, its checkpoint is not made, a rollback that cannot
    rename is 507 and changes nothing, a regenerate whose reply cannot be
    saved leaves the previous reply; all works again when the disk does."""
    fault = tmp_path / "fault"
    fault.write_text("none")
    srv = servers(name="f", session_dir=str(tmp_path / "sess"),
                  env={"DARKSERVE_TEST_FAULT_FILE": str(fault)})
    sid = create(srv, {"system": "sys"})
    r = [turn(srv, sid, f"q{i}") for i in range(2)]
    before = info(srv, sid)
    for mode in ("enospc", "erofs"):
        fault.write_text(mode)
        st, e, _ = srv.post(f"/v1/sessions/{sid}/generate",
                            {"messages": [{"role": "user", "content": "q2"}], "max_tokens": 4,
                             "stream": False})
        assert st == 507, e
        error(e, "insufficient_storage")
        fault.write_text("none")
        assert info(srv, sid)["checkpoints"] == before["checkpoints"]
        assert info(srv, sid)["turns"] == 2 and ckpt_files(srv, sid) == [0, 1]
    fault.write_text("erofs")
    error(rollback(srv, sid, 1, status=507), "insufficient_storage")
    fault.write_text("enospc")
    st, e, _ = srv.post(f"/v1/sessions/{sid}/regenerate", {"max_tokens": 6, "seed": 3,
                                                           "temperature": 1.5, "stream": False})
    assert st == 507, e
    fault.write_text("none")
    assert info(srv, sid) == dict(before, last_used=info(srv, sid)["last_used"])
    assert regenerate(srv, sid, max_tokens=6, temperature=0)["tokens"] == r[1]["tokens"]
    assert rollback(srv, sid, 1)["tokens"] == r[0]["session"]["tokens"]
