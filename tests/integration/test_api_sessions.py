"""The native sessions API against the real server: lifecycle, append and
generate in every framing, `curl -N` streaming, continuation == full
history, fork, export/import across servers, persistence across kill -9,
409 for a busy session.

Expected outputs are always produced by the server itself through an
independent path (a fresh context fed the whole history, an uninterrupted
twin session), never hard-coded."""
import http.client
import json
import os
import signal
import socket
import subprocess

from ds_server import MODEL, wait_for


# a session's first message, in every model's format
OPENING = {"messages": [{"role": "user", "content": "sys"}]}


def create(srv, body=None):
    st, r, _ = srv.post("/v1/sessions", body or {})
    assert st == 201, r
    # cached_tokens: what the prefix-state cache gave the create
    assert set(r) == {"id", "tokens", "state_bytes", "model", "turns", "cached_tokens"}
    assert r["model"] == srv.model_id  # the model the session is bound to
    assert 0 <= r["cached_tokens"] < max(r["tokens"], 1)
    return r


def gen(srv, sid, **body):
    """Non-streamed generate -> the JSON answer."""
    body.setdefault("stream", False)
    body.setdefault("temperature", 0)
    st, r, _ = srv.post(f"/v1/sessions/{sid}/generate", body)
    assert st == 200, r
    return r


def ndjson(raw):
    return [json.loads(l) for l in raw.decode().split("\n") if l.strip()]


def test_lifecycle(tiny):
    s = create(tiny)
    assert len(s["id"]) == 32 and s["tokens"] == 0
    st, full, _ = tiny.json("GET", f"/v1/sessions/{s['id']}")
    assert st == 200
    assert set(full) >= {"id", "tokens", "state_bytes", "created", "last_used", "attention"}
    assert full["attention"]["kind"] == "exact"

    # (Gemma's turn format has no system role: the system prompt opens a
    # user turn that the session's next user message continues; see
    # test_system_prompt_session)
    s2 = create(tiny, {"system": "You are a terse assistant."})
    assert s2["tokens"] > 0
    s3 = create(tiny, {"messages": [{"role": "user", "content": "hi"},
                                    {"role": "assistant", "content": "hello"}]})
    assert s3["tokens"] > 0

    # append: text and messages both grow the session
    st, a, _ = tiny.post(f"/v1/sessions/{s['id']}/append", {"text": "The meeting moved."})
    assert st == 200 and a["id"] == s["id"] and a["tokens"] > 0
    st, b, _ = tiny.post(f"/v1/sessions/{s['id']}/append",
                         {"messages": [{"role": "user", "content": "When is it?"}]})
    assert st == 200 and b["tokens"] > a["tokens"]

    # list with paging, ordered by id
    ids = sorted(x["id"] for x in (s, s2, s3))
    seen, after = [], None
    for _ in range(100):
        q = "/v1/sessions?limit=2" + (f"&after={after}" if after else "")
        st, page, _ = tiny.json("GET", q)
        assert st == 200 and page["object"] == "list" and len(page["data"]) <= 2
        seen += [d["id"] for d in page["data"]]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert set(ids) <= set(seen) and seen == sorted(seen)

    # delete
    st, d, _ = tiny.json("DELETE", f"/v1/sessions/{s3['id']}")
    assert st == 200 and d["deleted"] is True
    assert tiny.json("GET", f"/v1/sessions/{s3['id']}")[0] == 404
    assert tiny.json("DELETE", f"/v1/sessions/{s3['id']}")[0] == 404


def test_system_prompt_session(tiny):
    """A session created with a system prompt alone, continued with a user
    message, is the conversation [system, user] rendered whole: in Gemma's
    format the system text opens the user turn the next message continues.
    On both models: the session and a twin given the whole conversation at
    once hold the same tokens and answer the same."""
    sysp, user = "You are a terse assistant.", "Name a colour."
    a = create(tiny, {"system": sysp})
    assert a["tokens"] > 0
    b = create(tiny)
    ra = gen(tiny, a["id"], messages=[{"role": "user", "content": user}], max_tokens=8)
    rb = gen(tiny, b["id"], messages=[{"role": "system", "content": sysp},
                                      {"role": "user", "content": user}], max_tokens=8)
    assert ra["tokens"] == rb["tokens"] and ra["text"] == rb["text"]
    st, ia, _ = tiny.json("GET", f"/v1/sessions/{a['id']}")
    st2, ib, _ = tiny.json("GET", f"/v1/sessions/{b['id']}")
    assert st == st2 == 200 and ia["tokens"] == ib["tokens"]
    # the next turn continues both alike (the assistant turn closed alike)
    ra = gen(tiny, a["id"], messages=[{"role": "user", "content": "Another."}], max_tokens=6)
    rb = gen(tiny, b["id"], messages=[{"role": "user", "content": "Another."}], max_tokens=6)
    assert ra["tokens"] == rb["tokens"]

    # appended system text goes on in the same open turn: [system] + append
    # [system] + generate [user] == [system, system, user]
    c, d = create(tiny, {"system": sysp}), create(tiny)
    st, _, _ = tiny.post(f"/v1/sessions/{c['id']}/append",
                         {"messages": [{"role": "system", "content": "Answer in French."}]})
    assert st == 200
    rc = gen(tiny, c["id"], messages=[{"role": "user", "content": user}], max_tokens=8)
    rd = gen(tiny, d["id"], messages=[{"role": "system", "content": sysp},
                                      {"role": "system", "content": "Answer in French."},
                                      {"role": "user", "content": user}], max_tokens=8)
    assert rc["tokens"] == rd["tokens"]
    st, ic, _ = tiny.json("GET", f"/v1/sessions/{c['id']}")
    st2, idd, _ = tiny.json("GET", f"/v1/sessions/{d['id']}")
    assert ic["tokens"] == idd["tokens"]


def test_system_prompt_rendering(tiny):
    """What the model is given for a lone system prompt and for several
    (/apply-template shows a chat request's text)."""
    one = [{"role": "system", "content": " Be brief. "}]
    two = one + [{"role": "system", "content": "Use French."},
                 {"role": "user", "content": "Hi"}]
    st, r1, _ = tiny.post("/apply-template", {"messages": one})
    st2, r2, _ = tiny.post("/apply-template", {"messages": two})
    assert st == st2 == 200, (r1, r2)
    if tiny.model_id == "tiny_gemma3":
        assert r1["prompt"].endswith(
            "<start_of_turn>user\nBe brief.<end_of_turn>\n<start_of_turn>model\n"), r1
        assert r2["prompt"].endswith(
            "<start_of_turn>user\nBe brief.\n\nUse French.\n\nHi<end_of_turn>\n"
            "<start_of_turn>model\n"), r2
    else:  # ChatML: a system role of its own, unchanged
        assert r1["prompt"].endswith(
            "<|im_start|>system\n Be brief. <|im_end|>\n<|im_start|>assistant\n"), r1
    # chat completions of a system message alone answer it
    st, r, _ = tiny.post("/v1/chat/completions",
                         {"model": tiny.model_id, "messages": one, "max_tokens": 3,
                          "temperature": 0})
    assert st == 200 and r["usage"]["prompt_tokens"] > 0, r
    st, r, _ = tiny.post("/v1/chat/completions",
                         {"model": tiny.model_id, "messages": two, "max_tokens": 3,
                          "temperature": 0})
    assert st == 200, r


def test_generate_framings(tiny):
    s = create(tiny, OPENING)
    sid = s["id"]
    body = {"text": "Hello", "max_tokens": 6, "temperature": 0}
    # NDJSON is the default
    st, hd, raw = tiny.request("POST", f"/v1/sessions/{sid}/generate", body)
    assert st == 200 and hd["content-type"].startswith("application/x-ndjson")
    lines = ndjson(raw)
    last = lines[-1]
    assert last["done"] is True and last["finish_reason"] in ("stop", "length")
    assert set(last["timings"]) >= {"queue_ms", "prompt_ms", "generation_ms"}
    toks = lines[:-1]
    assert len(toks) == last["usage"]["completion_tokens"]
    assert all(set(t) == {"text", "token"} for t in toks)
    # SSE on request, ends with [DONE]
    st, hd, raw = tiny.request("POST", f"/v1/sessions/{sid}/generate",
                               dict(body, stream_format="sse"))
    assert st == 200 and hd["content-type"].startswith("text/event-stream")
    evs = [e for e in raw.decode().split("\n\n") if e.startswith("data: ")]
    assert evs[-1] == "data: [DONE]"
    assert json.loads(evs[-2][6:])["done"] is True
    # not streamed; with logprobs
    r = gen(tiny, sid, text=" more", max_tokens=4, logprobs=2)
    assert r["id"] == sid and len(r["tokens"]) == r["usage"]["completion_tokens"]
    assert len(r["logprobs"]) == len(r["tokens"])
    assert [e["id"] for e in r["logprobs"]] == r["tokens"]
    assert all(len(e["top_logprobs"]) == 2 for e in r["logprobs"])
    # streamed and not streamed agree (twin sessions, same seed)
    t1, t2 = create(tiny)["id"], create(tiny)["id"]
    a = gen(tiny, t1, text="Once", max_tokens=10, temperature=0.9, seed=3)
    st, _, raw = tiny.request("POST", f"/v1/sessions/{t2}/generate",
                              {"text": "Once", "max_tokens": 10, "temperature": 0.9, "seed": 3})
    lines = ndjson(raw)
    assert [l["token"] for l in lines[:-1]] == a["tokens"]
    assert "".join(l["text"] for l in lines[:-1]) == a["text"]
    # generate with no new text continues what was appended
    st, _, _ = tiny.post(f"/v1/sessions/{t1}/append", {"text": " and then"})
    r = gen(tiny, t1, max_tokens=3)
    assert r["usage"]["prompt_tokens"] == 0 and len(r["tokens"]) >= 1


def full_history_tokens(srv, texts_and_outputs):
    """Token ids of a history: texts tokenized (the first with the model's
    special tokens, as a session's first text is) and generated ids as they
    were sampled."""
    ids = []
    for i, (kind, val) in enumerate(texts_and_outputs):
        if kind == "text":
            st, t, _ = srv.post("/tokenize", {"text": val, "add_special": not ids})
            assert st == 200
            ids += t["tokens"]
        else:
            ids += val
    return ids


def test_continuation_equals_full_history(tiny):
    """Greedy: the third turn of a session == a fresh one-shot context fed the
    whole history (text tokens + the ids sampled before)."""
    sid = create(tiny)["id"]
    hist = []
    outs = []
    for turn in ("The system of the", " program and the", " network in"):
        r = gen(tiny, sid, text=turn, max_tokens=5)
        hist.append(("text", turn))
        # an end-of-generation token is not part of the history
        toks = r["tokens"][:-1] if r["finish_reason"] == "stop" else r["tokens"]
        outs.append((list(hist), r))
        hist.append(("ids", toks))
    for h, r in outs:
        prompt = full_history_tokens(tiny, h)
        st, c, _ = tiny.post("/v1/completions", {"prompt": prompt, "max_tokens": 5,
                                                 "temperature": 0})
        assert st == 200, c
        assert c["choices"][0]["text"] == r["text"]
        assert c["usage"]["completion_tokens"] == r["usage"]["completion_tokens"]


def test_chat_session_equals_full_history(real_smollm2):
    """Real model, greedy: chat turns sent one at a time with "session" give
    the same reply as the whole conversation sent to a fresh context."""
    # SmolLM2: its replies' tokens re-tokenize to themselves; the base
    # Gemma's, cut at max_tokens, need not (SentencePiece), so the session
    # and the re-rendered history may read different tokens
    real = real_smollm2
    sid = create(real)["id"]
    q1 = [{"role": "user", "content": "Name a color."}]
    q2 = [{"role": "user", "content": "Name another one."}]
    body = {"max_tokens": 12, "temperature": 0}
    st, r1, _ = real.post("/v1/chat/completions", dict(body, messages=q1, session=sid))
    assert st == 200, r1
    a1 = r1["choices"][0]["message"]["content"]
    st, r2, _ = real.post("/v1/chat/completions", dict(body, messages=q2, session=sid))
    assert st == 200, r2
    hist = q1 + [{"role": "assistant", "content": a1}] + q2
    st, c, _ = real.post("/v1/chat/completions", dict(body, messages=hist))
    assert st == 200
    assert c["choices"][0]["message"]["content"] == r2["choices"][0]["message"]["content"]
    assert c["usage"]["prompt_tokens"] > r2["usage"]["prompt_tokens"]


def test_curl_streams_tokens_as_produced(real):
    """`curl -N` prints the first NDJSON line while the server is still
    generating the rest."""
    sid = create(real)["id"]
    body = json.dumps({"messages": [{"role": "user", "content": "Tell me a long story."}],
                       "max_tokens": 48, "temperature": 0})
    p = subprocess.Popen(["curl", "-sN", "--max-time", "300", "-H",
                          "Content-Type: application/json", "-d", body,
                          real.url(f"/v1/sessions/{sid}/generate")],
                         stdout=subprocess.PIPE)
    try:
        first = json.loads(p.stdout.readline())
        assert set(first) == {"text", "token"}
        # the first line is out, the sequence is still running in the engine
        m = real.metrics()
        assert m["darkserve_engine_running_sequences"] >= 1
        rest = ndjson(p.stdout.read())
    finally:
        p.kill()
        p.wait()
    done = rest[-1]
    assert done["done"] is True
    assert 1 + len(rest) - 1 == done["usage"]["completion_tokens"]
    assert done["timings"]["generation_ms"] > 0


def test_fork(tiny):
    sid = create(tiny, OPENING)["id"]
    gen(tiny, sid, text="Start of the story", max_tokens=4)
    st, f, _ = tiny.post(f"/v1/sessions/{sid}/fork", {})
    assert st == 201 and f["id"] != sid
    st, orig, _ = tiny.json("GET", f"/v1/sessions/{sid}")
    assert f["tokens"] == orig["tokens"]
    a = gen(tiny, sid, text=" next", max_tokens=6)
    b = gen(tiny, f["id"], text=" next", max_tokens=6)
    assert a["tokens"] == b["tokens"]
    # they are independent afterwards
    gen(tiny, f["id"], text=" only the fork", max_tokens=2)
    assert tiny.json("GET", f"/v1/sessions/{sid}")[1]["tokens"] < \
        tiny.json("GET", f"/v1/sessions/{f['id']}")[1]["tokens"]


def test_export_import_into_a_new_server(servers, tmp_path):
    a = servers(name="a")
    sid = create(a, {"system": "sys"})["id"]
    gen(a, sid, text="The first turn", max_tokens=4)
    st, hd, blob = a.request("GET", f"/v1/sessions/{sid}/state")
    assert st == 200 and hd["content-type"] == "application/octet-stream"
    st, info, _ = a.json("GET", f"/v1/sessions/{sid}")
    # the state, and its checkpoints (docs/API.md "Turns and checkpoints")
    assert len(blob) == info["state_bytes"] + sum(8 + c["bytes"] for c in info["checkpoints"])

    b = servers(name="b", session_dir=str(tmp_path / "fresh"))
    tid = create(b)["id"]
    st, hd, data = b.request("PUT", f"/v1/sessions/{tid}/state", blob,
                             {"Content-Type": "application/octet-stream"})
    assert st == 200, data
    assert json.loads(data)["tokens"] == info["tokens"]
    x = gen(a, sid, text=" second", max_tokens=8)
    y = gen(b, tid, text=" second", max_tokens=8)
    assert x["tokens"] == y["tokens"] and x["text"] == y["text"]

    # a damaged blob is refused and the session keeps its state
    bad = bytearray(blob)
    bad[len(bad) // 2] ^= 0xFF
    st, hd, data = b.request("PUT", f"/v1/sessions/{tid}/state", bytes(bad),
                             {"Content-Type": "application/octet-stream"})
    assert st == 400, data
    assert json.loads(data)["error"]["message"]
    z = gen(b, tid, text=" third", max_tokens=4)
    w = gen(a, sid, text=" third", max_tokens=4)
    assert z["tokens"] == w["tokens"]


def peak_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_state_import_body_is_bounded_by_the_model(servers):
    """PUT .../state: a body larger than any state this model makes is
    refused from its Content-Length before a byte of it is read, and a
    chunked one is never buffered past that bound."""
    srv = servers(args=["--request-timeout", "30s"])
    sid = create(srv)["id"]
    st, _, blob = srv.request("GET", f"/v1/sessions/{sid}/state")
    assert st == 200 and len(blob) < (4 << 20)  # the tiny model's states are small
    # 100 MiB announced: far above the model's bound; nothing of it is sent
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    try:
        s.sendall((f"PUT /v1/sessions/{sid}/state HTTP/1.1\r\nHost: t\r\n"
                   "Content-Type: application/octet-stream\r\n"
                   f"Content-Length: {100 << 20}\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            part = s.recv(4096)
            if not part:
                break
            head += part
    finally:
        s.close()
    assert head.startswith(b"HTTP/1.1 413"), head
    # 320 MiB chunked: refused with 413 at its end, and the server's peak
    # memory grows by about the bound (~64 MiB: a blob may carry up to 2^24
    # pending tokens; the growing buffer may be copied once), not by the body
    before = peak_rss_kib(srv.proc.pid)
    piece = b"\0" * (1 << 20)
    c = srv.conn()
    try:
        c.request("PUT", f"/v1/sessions/{sid}/state", body=(piece for _ in range(320)),
                  headers={"Content-Type": "application/octet-stream"}, encode_chunked=True)
        r = c.getresponse()
        data = r.read()
    finally:
        c.close()
    assert r.status == 413, data
    assert json.loads(data)["error"]["code"] == "request_too_large"
    grown = peak_rss_kib(srv.proc.pid) - before
    assert grown < 160 << 10, f"peak RSS grew by {grown} KiB for a refused 320 MiB body"
    # the session is untouched and a real state still imports
    st, hd, data = srv.request("PUT", f"/v1/sessions/{sid}/state", blob,
                               {"Content-Type": "application/octet-stream"})
    assert st == 200, data


def test_state_of_another_model_is_refused(servers, tmp_path):
    a = servers(name="tinysrv")
    sid = create(a, {"system": "sys"})["id"]
    st, _, blob = a.request("GET", f"/v1/sessions/{sid}/state")
    b = servers(name="realsrv", model=MODEL)
    tid = create(b)["id"]
    st, hd, data = b.request("PUT", f"/v1/sessions/{tid}/state", blob,
                             {"Content-Type": "application/octet-stream"})
    e = json.loads(data)["error"]
    assert st == 400 and "model" in e["message"], e


def test_persistence_across_kill_9(servers, tmp_path):
    d = str(tmp_path / "persist")
    turns = ["The first user turn.", " A second one here.", " And a third"]
    a = servers(name="a", session_dir=d)
    sid = create(a, {"system": "You are helpful."})["id"]
    gen(a, sid, text=turns[0], max_tokens=5)
    gen(a, sid, text=turns[1], max_tokens=5)
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait()
    a.start()  # same session dir
    third = gen(a, sid, text=turns[2], max_tokens=8)

    ctl = servers(name="control")
    cid = create(ctl, {"system": "You are helpful."})["id"]
    gen(ctl, cid, text=turns[0], max_tokens=5)
    gen(ctl, cid, text=turns[1], max_tokens=5)
    expect = gen(ctl, cid, text=turns[2], max_tokens=8)
    assert third["tokens"] == expect["tokens"]
    assert third["text"] == expect["text"]


def test_busy_session_409(real):
    sid = create(real)["id"]
    c, resp = real.open_stream(f"/v1/sessions/{sid}/generate",
                               {"messages": [{"role": "user",
                                              "content": "Tell a long story about a dragon."}],
                                "max_tokens": 200, "temperature": 0})
    try:
        assert resp.status == 200
        first = json.loads(resp.readline())
        assert "token" in first
        for path, body in (("append", {"text": "x"}), ("generate", {"text": "x"}),
                           ("fork", {})):
            st, r, _ = real.post(f"/v1/sessions/{sid}/{path}", body)
            assert st == 409, r
            assert r["error"]["code"] == "session_busy"
        st, r, _ = real.post("/v1/chat/completions",
                             {"messages": [{"role": "user", "content": "x"}], "session": sid})
        assert st == 409
        assert real.json("DELETE", f"/v1/sessions/{sid}")[0] == 409
        assert real.request("GET", f"/v1/sessions/{sid}/state")[0] == 409
        # reading its description does not need it
        assert real.json("GET", f"/v1/sessions/{sid}")[0] == 200
    finally:
        c.close()  # the client goes away: the generation is cancelled
    # the session becomes free again (bounded wait)
    ok = wait_for(lambda: real.post(f"/v1/sessions/{sid}/append",
                                    {"text": " The end."})[0] == 200, 60, 0.2)
    assert ok


def test_persist_failure_is_reported(tiny):
    """When the session file cannot be written the answer says so (500) and
    the session goes back to its saved state: the old file, left alone, is
    what the next request reads (here a directory in its place: a clear 500
    naming it), and once it is readable again the failed turn is not in it.
    (A full or read-only disk, and the error event of a stream:
    test_faults_disk.py.)"""
    sid = create(tiny, OPENING)["id"]
    gen(tiny, sid, text="First turn", max_tokens=3)
    st, saved, _ = tiny.json("GET", f"/v1/sessions/{sid}")
    assert st == 200
    path = os.path.join(tiny.session_dir, sid)
    assert os.path.isfile(path)
    good = open(path, "rb").read()
    # the atomic rename over <id> now fails, whoever runs the test (root too)
    os.unlink(path)
    os.mkdir(path)
    open(os.path.join(path, "block"), "w").close()
    try:
        st, r, _ = tiny.post(f"/v1/sessions/{sid}/generate",
                             {"text": " more", "max_tokens": 2, "stream": False})
        assert st == 500, r
        assert "could not be saved" in r["error"]["message"]
        assert "keeps its previous state" in r["error"]["message"]
        st, r, _ = tiny.post(f"/v1/sessions/{sid}/append", {"text": " x"})
        assert st == 500 and sid in r["error"]["message"], r
    finally:
        os.unlink(os.path.join(path, "block"))
        os.rmdir(path)
    with open(path, "wb") as f:
        f.write(good)
    # the failed turn is gone; writable again: saves succeed
    st, now, _ = tiny.json("GET", f"/v1/sessions/{sid}")
    assert now["tokens"] == saved["tokens"], (now, saved)
    gen(tiny, sid, text=" again", max_tokens=2)
    assert os.path.isfile(path)


def test_linear_attention_state_is_constant_size(servers):
    """With a linear attention kind the session state stops growing once the
    hybrid window is full, and export/import still continues exactly."""
    srv = servers(args=["--attn", "performer", "--features", "16", "--window", "4"])
    sid = create(srv, {"system": "sys"})["id"]
    g1 = gen(srv, sid, text="A first turn of text", max_tokens=6)
    st, a, _ = srv.json("GET", f"/v1/sessions/{sid}")
    assert a["attention"] == {"kind": "performer", "features": 16, "window": 4, "memory": 0, "memory_keep": None,
                               "memory_heads": 0, "kv_bits": 16}
    g2 = gen(srv, sid, text=" and a much longer second turn of text to read", max_tokens=20)
    st, b, _ = srv.json("GET", f"/v1/sessions/{sid}")
    assert b["tokens"] > a["tokens"] + 20
    # the same but for the last turn's input, kept for a regenerate (4 bytes a token)
    grown = 4 * (g2["usage"]["prompt_tokens"] - g1["usage"]["prompt_tokens"])
    assert b["state_bytes"] - a["state_bytes"] == grown
    st, _, blob = srv.request("GET", f"/v1/sessions/{sid}/state")
    tid = create(srv)["id"]
    st, _, data = srv.request("PUT", f"/v1/sessions/{tid}/state", blob,
                              {"Content-Type": "application/octet-stream"})
    assert st == 200, data
    x = gen(srv, sid, text=" third", max_tokens=8)
    y = gen(srv, tid, text=" third", max_tokens=8)
    assert x["tokens"] == y["tokens"]


def session_files(srv):
    return sorted(f for f in os.listdir(srv.session_dir)
                  if len(f) == 32 and all(c in "0123456789abcdef" for c in f))


def test_session_directory_budget(servers):
    """--max-session-files / --max-session-disk bound the session directory:
    past them the least recently used idle sessions are deleted (404
    afterwards), also at startup with a smaller budget."""
    srv = servers(args=["--max-session-files", "3"])
    ids = [create(srv)["id"] for _ in range(3)]
    gen(srv, ids[0], text="used again", max_tokens=2)  # ids[0] is now the most recent
    ids += [create(srv)["id"] for _ in range(2)]
    assert srv.json("GET", f"/v1/sessions/{ids[1]}")[0] == 404
    assert srv.json("GET", f"/v1/sessions/{ids[2]}")[0] == 404
    for sid in (ids[0], ids[3], ids[4]):
        assert srv.json("GET", f"/v1/sessions/{sid}")[0] == 200, sid
    assert session_files(srv) == sorted([ids[0], ids[3], ids[4]])
    m = srv.metrics()
    assert m["darkserve_session_disk_evictions_total"] == 2
    total = sum(os.path.getsize(os.path.join(srv.session_dir, f)) for f in session_files(srv))
    assert m["darkserve_session_disk_bytes"] == total
    assert srv.stop() == 0
    # restarted with a byte budget one byte short of what the files hold:
    # one goes at startup
    srv.args = [a for a in srv.args if a not in ("--max-session-files", "3")] + \
        ["--max-session-disk", str(total - 1)]
    srv.start()
    assert len(session_files(srv)) == 2
    st, listing, _ = srv.json("GET", "/v1/sessions")
    assert [s["id"] for s in listing["data"]] == session_files(srv)


def test_sessions_belong_to_their_api_key(servers, tmp_path):
    """With --api-key-file, a session belongs to the key that created it:
    other keys get 404 for it (every route) and do not list it; a key marked
    'admin' sees all; the owner survives a restart."""
    keys = tmp_path / "keys"
    keys.write_text("# tenants\nkey-a\nkey-b\nkey-root  admin\n")
    srv = servers(args=["--api-key-file", str(keys)])
    A = {"Authorization": "Bearer key-a"}
    B = {"X-Api-Key": "key-b"}
    ROOT = {"Authorization": "Bearer key-root"}

    def ids(hd):
        st, r, _ = srv.json("GET", "/v1/sessions", headers=hd)
        assert st == 200, r
        return sorted(s["id"] for s in r["data"])

    st, sa, _ = srv.post("/v1/sessions", {"system": "A's"}, headers=A)
    assert st == 201, sa
    sa = sa["id"]
    st, sb, _ = srv.post("/v1/sessions", {}, headers=B)
    sb = sb["id"]
    st, blob_b, _ = srv.request("GET", f"/v1/sessions/{sb}/state", headers=B)
    assert st == 200

    def others_get_404(sid, hd):
        for method, path, body in (("GET", "", None), ("DELETE", "", None),
                                   ("POST", "/append", {"text": "x"}),
                                   ("POST", "/generate", {"text": "x", "max_tokens": 1}),
                                   ("POST", "/fork", {}), ("GET", "/state", None)):
            st, r, _ = srv.json(method, f"/v1/sessions/{sid}{path}", body, headers=hd)
            assert st == 404 and r["error"]["code"] == "session_not_found", (method, path, r)
        st, _, data = srv.request("PUT", f"/v1/sessions/{sid}/state", blob_b,
                                  dict(hd, **{"Content-Type": "application/octet-stream"}))
        assert st == 404, data
        st, r, _ = srv.post("/v1/completions", {"prompt": "x", "max_tokens": 1, "session": sid},
                            headers=hd)
        assert st == 404 and r["error"]["code"] == "session_not_found", r
        st, r, _ = srv.post("/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
                             "session": sid}, headers=hd)
        assert st == 404, r

    others_get_404(sa, B)
    others_get_404(sb, A)
    assert ids(A) == [sa] and ids(B) == [sb]
    assert ids(ROOT) == sorted([sa, sb])
    # the owner uses it; the admin too
    assert srv.json("GET", f"/v1/sessions/{sa}", headers=A)[0] == 200
    st, r, _ = srv.post(f"/v1/sessions/{sa}/generate",
                        {"text": " hi", "max_tokens": 2, "stream": False}, headers=ROOT)
    assert st == 200, r
    # a fork belongs to the key that made it
    st, fb, _ = srv.post(f"/v1/sessions/{sb}/fork", {}, headers=B)
    assert st == 201, fb
    assert ids(B) == sorted([sb, fb["id"]]) and ids(A) == [sa]
    # and all of it after a restart: the owner is in the session file
    assert srv.stop() == 0
    srv.start()
    others_get_404(sa, B)
    assert ids(A) == [sa] and ids(B) == sorted([sb, fb["id"]])
    assert ids(ROOT) == sorted([sa, sb, fb["id"]])
    st, r, _ = srv.json("GET", f"/v1/sessions/{sa}", headers=A)
    assert st == 200 and r["tokens"] > 0
