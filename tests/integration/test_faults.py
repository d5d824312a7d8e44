"""Fault injection: damaged session files and a truncated model.

A session file that was bit-flipped or truncated behind the server's back
gives a clear JSON error for that session only, never a crash, and the other
sessions keep working; a truncated model file stops the server at startup
with a message naming the problem. (A failed write is covered in
test_api_sessions.py: test_persist_failure_is_reported.)
"""
import os
import subprocess

from ds_server import BIN, TINY, read_text, wait_for


def _make(srv, text):
    st, obj, _ = srv.post("/v1/sessions", {"system": text})
    assert st == 201, obj
    return obj["id"]


def test_damaged_session_files(servers, tmp_path):
    d = str(tmp_path / "sess")
    a = servers(name="a", session_dir=d)
    good, flipped, cut = (_make(a, f"session {i}") for i in range(3))
    assert a.stop() == 0
    p = os.path.join(d, flipped)
    b = bytearray(open(p, "rb").read())
    b[len(b) // 2] ^= 0x40  # inside the attention payload: the checksum catches it
    open(p, "wb").write(bytes(b))
    p = os.path.join(d, cut)
    with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) - 100)

    s = servers(name="b", session_dir=d)
    for sid, why in ((flipped, "checksum mismatch"), (cut, "truncated")):
        for method, path, body in (("POST", f"/v1/sessions/{sid}/generate",
                                    {"text": " hi", "max_tokens": 2, "stream": False}),
                                   ("GET", f"/v1/sessions/{sid}/state", None)):
            st, obj, _ = s.json(method, path, body)
            assert st == 500, (sid, path, st, obj)
            msg = obj["error"]["message"]
            assert sid in msg and why in msg, obj
    # the undamaged one is untouched, the server still serves
    st, obj, _ = s.post(f"/v1/sessions/{good}/generate",
                        {"text": " hi", "max_tokens": 2, "stream": False})
    assert st == 200, obj
    assert s.request("GET", "/health")[0] == 200
    assert s.proc.poll() is None


def test_truncated_model_is_refused_at_startup(tmp_path):
    data = open(TINY, "rb").read()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[: len(data) // 2])
    log = tmp_path / "srv.log"
    p = subprocess.Popen([BIN, "serve", "--port", "0", "--model", str(bad), "--log-file",
                          str(log), "--session-dir", str(tmp_path / "s")],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        rc = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    err = p.stderr.read().decode() + read_text(str(log))
    assert rc != 0, err
    assert "cannot load the model" in err, err
    assert "cut.gguf" in err, err
