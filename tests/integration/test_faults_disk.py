"""Fault injection: a full disk, a read-only session directory and
kill -9 in the middle of a state write.

The faults come from the server's test seam (server/api/api_faults.c): with
DARKSERVE_TEST_FAULT_FILE=PATH, the word in PATH makes the session store's
writes fail with ENOSPC ("enospc"), its creates, renames and deletes fail
with EROFS ("erofs"), or each write stop half way until the word changes
("stall"). This works the same as root (where chmod does not stop writes)
and without a mountable tmpfs.

What must hold: the client gets a clear error (507 insufficient_storage
naming the cause; an error event at the end of a stream), no request that
failed leaves a session behind, every session whose create or append was
acknowledged loads after a restart with what was acknowledged, and a
half-written file is never taken for a session.
"""
import os
import threading

from ds_server import wait_for


def _create(srv, body):
    st, obj, _ = srv.post("/v1/sessions", body)
    assert st == 201, obj
    return obj


def _ids(srv):
    st, obj, _ = srv.json("GET", "/v1/sessions?limit=100")
    assert st == 200, obj
    return {s["id"] for s in obj["data"]}


def _tokens(srv, sid):
    st, obj, _ = srv.json("GET", f"/v1/sessions/{sid}")
    assert st == 200, obj
    return obj["tokens"]


def _assert_507(st, obj, why):
    assert st == 507, (st, obj)
    err = obj["error"]
    assert err["code"] == "insufficient_storage", obj
    assert why in err["message"], obj


def _fault_server(servers, tmp_path, name="a"):
    fault = tmp_path / "fault"
    fault.write_text("none")
    srv = servers(name=name, session_dir=str(tmp_path / "sess"),
                  env={"DARKSERVE_TEST_FAULT_FILE": str(fault)})
    assert "DARKSERVE_TEST_FAULT_FILE" in srv.log_text()
    return srv, fault


def test_disk_full(servers, tmp_path):
    srv, fault = _fault_server(servers, tmp_path)
    a = _create(srv, {"system": "the first session"})
    sid = a["id"]
    st, blob_hdr, blob = srv.request("GET", f"/v1/sessions/{sid}/state")
    assert st == 200
    path = os.path.join(srv.session_dir, sid)
    on_disk = open(path, "rb").read()

    fault.write_text("enospc")
    why = "No space left on device"
    for body in ({"system": "a second one"}, {}):
        st, obj, _ = srv.post("/v1/sessions", body)
        _assert_507(st, obj, why)
    st, obj, _ = srv.post(f"/v1/sessions/{sid}/append", {"text": " more"})
    _assert_507(st, obj, why)
    st, obj, _ = srv.post(f"/v1/sessions/{sid}/generate",
                          {"text": " go", "max_tokens": 2, "stream": False})
    _assert_507(st, obj, why)
    st, _, raw = srv.request("POST", f"/v1/sessions/{sid}/generate",
                             {"text": " go", "max_tokens": 2})
    assert st == 200  # the stream had begun: its last line is the error
    last = [l for l in raw.decode().split("\n") if l.strip()][-1]
    assert "insufficient_storage" in last and why in last, last
    st, obj, _ = srv.post(f"/v1/sessions/{sid}/fork", {})
    _assert_507(st, obj, why)
    st, _, raw = srv.request("PUT", f"/v1/sessions/{sid}/state", blob,
                             {"Content-Type": "application/octet-stream"})
    assert st == 507 and why.encode() in raw, raw
    # nothing that failed left a session behind; the file is the acknowledged one
    assert _ids(srv) == {sid}
    assert open(path, "rb").read() == on_disk
    assert not [f for f in os.listdir(srv.session_dir) if f.endswith(".tmp")]
    assert srv.request("GET", "/health")[0] == 200
    m = srv.metrics()
    assert m.get("darkserve_session_persist_errors_total", 0) >= 3, m

    # room again: saves work, and a restart finds what was acknowledged
    fault.write_text("none")
    st, obj, _ = srv.post(f"/v1/sessions/{sid}/append", {"text": " again"})
    assert st == 200, obj
    acked = obj["tokens"]
    assert srv.stop() == 0
    srv.start()
    assert _ids(srv) == {sid}
    assert _tokens(srv, sid) == acked
    st, obj, _ = srv.post(f"/v1/sessions/{sid}/generate",
                          {"text": " hi", "max_tokens": 2, "stream": False})
    assert st == 200, obj


def test_read_only_directory(servers, tmp_path):
    srv, fault = _fault_server(servers, tmp_path)
    sid = _create(srv, {"system": "kept"})["id"]
    acked = _tokens(srv, sid)
    fault.write_text("erofs")
    why = "Read-only file system"
    st, obj, _ = srv.post("/v1/sessions", {"system": "not kept"})
    _assert_507(st, obj, why)
    st, obj, _ = srv.post(f"/v1/sessions/{sid}/append", {"text": " more"})
    _assert_507(st, obj, why)
    st, obj, _ = srv.post(f"/v1/sessions/{sid}/fork", {})
    _assert_507(st, obj, why)
    # a delete that cannot remove the file fails and keeps the session
    st, obj, _ = srv.json("DELETE", f"/v1/sessions/{sid}")
    _assert_507(st, obj, why)
    assert _ids(srv) == {sid}
    assert os.path.isfile(os.path.join(srv.session_dir, sid))

    # writable again; a restart loads the session as last acknowledged
    fault.write_text("none")
    assert srv.stop() == 0
    srv.start()
    assert _ids(srv) == {sid}
    assert _tokens(srv, sid) == acked
    st, obj, _ = srv.json("DELETE", f"/v1/sessions/{sid}")
    assert st == 200, obj
    assert _ids(srv) == set()


def test_kill_during_state_write(servers, tmp_path):
    srv, fault = _fault_server(servers, tmp_path)
    acked = {}
    for i in range(4):
        obj = _create(srv, {"system": f"session number {i}"})
        acked[obj["id"]] = obj["tokens"]
    first = sorted(acked)[0]
    for sid in sorted(acked)[:2]:
        st, obj, _ = srv.post(f"/v1/sessions/{sid}/append", {"text": f" appended to {sid}"})
        assert st == 200, obj
        acked[sid] = obj["tokens"]

    # the next writes stop half way: a create and an append to `first`
    fault.write_text("stall")
    answers = []

    def call(path, body):
        try:
            answers.append(srv.post(path, body, timeout=60)[0])
        except OSError as e:  # the server is killed under it
            answers.append(e)

    ts = [threading.Thread(target=call, args=a) for a in
          (("/v1/sessions", {"system": "never acknowledged"}),
           (f"/v1/sessions/{first}/append", {"text": " never acknowledged"}))]
    for t in ts:
        t.start()
    tmp_files = lambda: [f for f in os.listdir(srv.session_dir) if f.endswith(".tmp")]
    assert wait_for(tmp_files, 60), "no state write began"
    half = os.path.join(srv.session_dir, tmp_files()[0])
    assert wait_for(lambda: os.path.getsize(half) > 0, 10), "the stalled write wrote nothing"
    srv.proc.kill()
    srv.proc.wait()
    for t in ts:
        t.join(60)
    assert all(not isinstance(a, int) or a >= 500 for a in answers), answers  # none acknowledged

    fault.write_text("none")
    srv.start()
    # the temp file is gone, every acknowledged session loads as acknowledged,
    # and nothing else is there
    assert not tmp_files()
    assert _ids(srv) == set(acked)
    for sid, tokens in acked.items():
        assert _tokens(srv, sid) == tokens, sid
        st, _, blob = srv.request("GET", f"/v1/sessions/{sid}/state")
        assert st == 200 and blob[:4] == b"DSST", (sid, st)
        st, obj, _ = srv.post(f"/v1/sessions/{sid}/generate",
                              {"text": " ok", "max_tokens": 1, "stream": False})
        assert st == 200, (sid, obj)
