"""SIGTERM while streams are running, against the real server: new work gets
503 while draining, each open stream ends with a proper final event (its
normal end, or an error event when the drain deadline comes first), the
sessions are on disk for the next start, and the process exits 0."""
import http.client
import json
import signal

from ds_server import MODEL, sse_json, wait_for


def test_sigterm_during_active_streams(servers):
    srv = servers(model=MODEL, args=["--drain-timeout", "6s"])
    st, s, _ = srv.post("/v1/sessions", {"system": "You are a storyteller."})
    assert st == 201
    sid = s["id"]
    c1, ndj = srv.open_stream(f"/v1/sessions/{sid}/generate",
                              {"messages": [{"role": "user",
                                             "content": "Tell a very long story."}],
                               "max_tokens": 1000, "temperature": 0})
    c2, sse = srv.open_stream("/v1/chat/completions",
                              {"messages": [{"role": "user", "content": "Write an essay."}],
                               "max_tokens": 1000, "temperature": 0, "stream": True})
    try:
        assert ndj.status == 200 and sse.status == 200
        first = json.loads(ndj.readline())
        assert "token" in first
        srv.proc.send_signal(signal.SIGTERM)

        # draining: new requests get 503, /health says so. (A connection
        # that races the signal, accepted but not read yet, may be closed
        # instead: the drain closes idle connections. Retry those.)
        def answer(path):
            try:
                x = srv.json("GET", path, timeout=30)
            except (http.client.HTTPException, OSError):
                return None
            return x if x[0] == 503 else None

        st, r, _ = wait_for(lambda: answer("/v1/models"), 30, 0.1) or (None, None, None)
        assert st == 503 and r["error"]["type"] == "server_error"
        st, h, _ = wait_for(lambda: answer("/health"), 30, 0.1) or (None, None, None)
        assert st == 503 and h["status"] == "draining"

        # the streams end with a final event, not a cut
        lines = [json.loads(l) for l in ndj.read().decode().split("\n") if l.strip()]
        last = lines[-1]
        assert last.get("done") is True or last["error"]["code"] == "draining", last
        evs, done = sse_json(sse.read())
        assert done
        assert evs[-1].get("error", {}).get("code") == "draining" or \
            evs[-1]["choices"][0]["finish_reason"] in ("stop", "length"), evs[-1]
    finally:
        c1.close()
        c2.close()
    assert srv.proc.wait(timeout=120) == 0
    log = srv.log_text()
    assert "sessions saved" in log

    # the session is on disk with what it generated
    srv.start()
    st, info, _ = srv.json("GET", f"/v1/sessions/{sid}")
    assert st == 200
    assert info["tokens"] > s["tokens"] + 1
    st, r, _ = srv.post(f"/v1/sessions/{sid}/generate",
                        {"text": " The end.", "max_tokens": 2, "stream": False})
    assert st == 200, r
