"""The exact memory (--memory N; docs/DESIGN.md §3 "Exact memory") through
the real server: a session with a memory exports, imports into another
server with the same setting and continues identically; a server with
another setting refuses the blob with a 400 that names the memory; the
option is checked at startup. Quality and recall are measured, not tested
here (tools/recall.py, docs/QUALITY.md)."""
import json
import subprocess

from ds_server import BIN, TINY

# the tiny model, linear attention with a window small enough that a few
# hundred tokens pass through several block boundaries of the memory
ARGS = ["--window", "16", "--sinks", "2", "--features", "16"]
TEXT = " ".join("word%d is %d." % (i, i * 7 % 13) for i in range(120))


def create(srv):
    st, r, _ = srv.post("/v1/sessions", {})
    assert st == 201, r
    return r["id"]


def gen(srv, sid, text, n=6):
    st, r, _ = srv.post(f"/v1/sessions/{sid}/generate",
                        {"text": text, "max_tokens": n, "temperature": 0, "stream": False})
    assert st == 200, r
    return r


def test_memory_session_exports_imports_and_continues(servers, tmp_path):
    a = servers(name="a", attn="performer", args=ARGS + ["--memory", "8"])
    sid = create(a)
    gen(a, sid, TEXT)
    st, info, _ = a.json("GET", f"/v1/sessions/{sid}")
    assert st == 200 and info["attention"]["memory"] == 8, info
    assert info["tokens"] > 300
    st, _, blob = a.request("GET", f"/v1/sessions/{sid}/state")
    assert st == 200

    b = servers(name="b", attn="performer", args=ARGS + ["--memory", "8"],
                session_dir=str(tmp_path / "b"))
    tid = create(b)
    st, _, data = b.request("PUT", f"/v1/sessions/{tid}/state", blob,
                            {"Content-Type": "application/octet-stream"})
    assert st == 200, data
    x = gen(a, sid, " and then", 12)
    y = gen(b, tid, " and then", 12)
    assert x["text"] == y["text"] and x["tokens"] == y["tokens"]

    # another memory setting (or none) cannot continue it: a clear 400
    for mem in ("0", "16"):
        c = servers(name="c" + mem, attn="performer", args=ARGS + ["--memory", mem],
                    session_dir=str(tmp_path / ("c" + mem)))
        cid = create(c)
        st, _, data = c.request("PUT", f"/v1/sessions/{cid}/state", blob,
                                {"Content-Type": "application/octet-stream"})
        e = json.loads(data)["error"]
        assert st == 400 and "memory" in e["message"], (st, e)


def test_memory_changes_what_a_long_session_says(servers, tmp_path):
    """Past the window the memory is attended to: the same session text
    gives other logits with a memory than without (the tiny model's
    greedy text may agree; its logprobs do not)."""
    out = []
    for mem in ("0", "8"):
        s = servers(name="m" + mem, attn="performer", args=ARGS + ["--memory", mem],
                    session_dir=str(tmp_path / mem))
        sid = create(s)
        st, r, _ = s.post(f"/v1/sessions/{sid}/generate",
                          {"text": TEXT, "max_tokens": 1, "temperature": 0, "stream": False,
                           "logprobs": 3})
        assert st == 200, r
        out.append(json.dumps(r.get("logprobs")))
    assert out[0] != out[1]


def test_memory_option_checked_at_startup(tmp_path):
    base = [BIN, "serve", "--port", "0", "--model", TINY, "--session-dir", str(tmp_path / "s")]
    r = subprocess.run(base + ["--memory", "-2"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--memory" in r.stderr, r.stderr
    r = subprocess.run(base + ["--memory", "5000"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--memory" in r.stderr, r.stderr
    # asked for where it cannot run: refused with the reason, not ignored
    r = subprocess.run(base + ["--attn", "exact", "--memory", "8"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "memory" in r.stderr, r.stderr


def test_recent_memory_on_some_heads(servers, tmp_path):
    """--memory-keep recent --memory-heads: the session says so, its state
    is smaller than with every head, it round-trips into a server with the
    same setting and is refused (400 naming the memory) by one whose heads
    differ; bad values stop the server at startup with the reason."""
    heads = ["--memory-keep", "recent", "--memory-heads", "0.0"]
    a = servers(name="ra", attn="performer", args=ARGS + ["--memory", "8"] + heads)
    full = servers(name="rf", attn="performer", args=ARGS + ["--memory", "8"],
                   session_dir=str(tmp_path / "rf"))
    sid, fid = create(a), create(full)
    gen(a, sid, TEXT)
    gen(full, fid, TEXT)
    st, info, _ = a.json("GET", f"/v1/sessions/{sid}")
    assert st == 200, info
    att = info["attention"]
    assert att["memory"] == 8 and att["memory_keep"] == "recent" and att["memory_heads"] == 1, att
    st, finfo, _ = full.json("GET", f"/v1/sessions/{fid}")
    assert finfo["attention"]["memory_keep"] == "recall", finfo
    assert finfo["attention"]["memory_heads"] > 1, finfo
    assert info["state_bytes"] < finfo["state_bytes"], (info, finfo)
    st, _, blob = a.request("GET", f"/v1/sessions/{sid}/state")
    assert st == 200
    b = servers(name="rb", attn="performer", args=ARGS + ["--memory", "8"] + heads,
                session_dir=str(tmp_path / "rb"))
    tid = create(b)
    st, _, data = b.request("PUT", f"/v1/sessions/{tid}/state", blob,
                            {"Content-Type": "application/octet-stream"})
    assert st == 200, data
    assert gen(a, sid, " and then", 12)["text"] == gen(b, tid, " and then", 12)["text"]
    c = servers(name="rc", attn="performer",
                args=ARGS + ["--memory", "8", "--memory-keep", "recent", "--memory-heads", "0.1"],
                session_dir=str(tmp_path / "rc"))
    cid = create(c)
    st, _, data = c.request("PUT", f"/v1/sessions/{cid}/state", blob,
                            {"Content-Type": "application/octet-stream"})
    e = json.loads(data)["error"]
    assert st == 400 and "memory" in e["message"], (st, e)
    base = [BIN, "serve", "--port", "0", "--model", TINY, "--session-dir", str(tmp_path / "s"),
            "--attn", "performer"] + ARGS
    for extra, why in [(["--memory", "8", "--memory-heads", "0.9"], "past the model"),
                       (["--memory", "8", "--memory-keep", "first"], "recall or recent"),
                       (["--memory-heads", "0.0"], "needs the exact memory")]:
        r = subprocess.run(base + extra, capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and why in r.stderr, (extra, r.stderr)
