"""Every 4xx the API gives, against the real server: the status, the OpenAI
error object {"error": {"message", "type", "param", "code"}}, and a message
that names the offending field. (429 is in test_api_batching.py, 409 and the
session 404s in test_api_sessions.py, 503 while draining in
test_api_shutdown.py.)"""
import json
import os
import re
import socket
import time

import pytest

from ds_server import JSON, ROOT, wait_for


def check_error(st, body, status, param=None, code=None):
    assert st == status, body
    e = body["error"]
    assert set(e) == {"message", "type", "param", "code"}
    assert isinstance(e["message"], str) and e["message"]
    if param is not None:
        assert e["param"] == param, e
        # the message names the field (its last component at least)
        assert param.split(".")[-1].split("[")[0] in e["message"], e
    if code is not None:
        assert e["code"] == code, e
    return e


BAD_COMPLETIONS = [
    ({"prompt": 5}, "prompt"),
    ({"prompt": "x", "max_tokens": "5"}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 16.0}, "max_tokens"),
    ({"prompt": "x", "temperature": -0.5}, "temperature"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": "x", "stop": [1]}, "stop[0]"),
    ({"prompt": "x", "logprobs": 50}, "logprobs"),
    ({"prompt": "x", "session": "not-a-session-id"}, "session"),
    ({"max_tokens": 3}, "prompt"),
]


@pytest.mark.parametrize("body,param", BAD_COMPLETIONS)
def test_completions_400_names_the_field(tiny, body, param):
    st, r, _ = tiny.post("/v1/completions", body)
    check_error(st, r, 400, param)


BAD_CHAT = [
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": 2.5}, "temperature"),
]


@pytest.mark.parametrize("body,param", BAD_CHAT)
def test_chat_400_names_the_field(tiny, body, param):
    st, r, _ = tiny.post("/v1/chat/completions", body)
    check_error(st, r, 400, param)


def test_malformed_json(tiny):
    for raw in (b"{", b"[1,2]", b"nul", b'{"prompt": "a", "prompt": "b"}', b"\xff\xfe"):
        st, hd, data = tiny.request("POST", "/v1/completions", raw, JSON)
        check_error(st, json.loads(data), 400, code="invalid_json")


def test_max_tokens_above_the_limit(servers):
    srv = servers(args=["--max-tokens-limit", "64"])
    st, r, _ = srv.post("/v1/completions", {"prompt": "x", "max_tokens": 65})
    e = check_error(st, r, 400, "max_tokens")
    assert "64" in e["message"]
    st, r, _ = srv.post("/v1/completions", {"prompt": "x", "max_tokens": 64, "temperature": 0})
    assert st == 200, r
    st, r, _ = srv.post(f"/v1/sessions", {})
    st, r, _ = srv.post(f"/v1/sessions/{r['id']}/generate", {"text": "x", "max_tokens": 100})
    check_error(st, r, 400, "max_tokens")


def test_documented_max_tokens_limit_is_the_default(tiny):
    """docs/API.md's max_tokens range is what a server with default options
    accepts: the documented maximum passes validation, one more is 400."""
    with open(os.path.join(ROOT, "docs", "API.md"), encoding="utf-8") as f:
        row = [l for l in f if l.startswith("| `max_tokens` | 1 to ")]
    assert len(row) == 1, row
    m = re.search(r"1 to ([0-9][0-9 ,]*[0-9])", row[0])
    assert m, row[0]
    limit = int(re.sub(r"[ ,]", "", m.group(1)))
    st, r, _ = tiny.post("/v1/completions", {"prompt": "x", "max_tokens": limit + 1})
    e = check_error(st, r, 400, "max_tokens")
    assert str(limit) in e["message"]
    # the documented maximum itself is accepted (the tiny model's exact
    # context ends the generation long before it)
    st, r, _ = tiny.post("/v1/completions", {"prompt": "x", "max_tokens": limit,
                                             "temperature": 0})
    assert st == 200, r


def test_sessions_400(tiny):
    st, r, _ = tiny.post("/v1/sessions", {"system": "a", "messages": [
        {"role": "user", "content": "b"}]})
    check_error(st, r, 400)
    st, s, _ = tiny.post("/v1/sessions", {})
    sid = s["id"]
    st, r, _ = tiny.post(f"/v1/sessions/{sid}/append", {})
    check_error(st, r, 400)
    st, r, _ = tiny.post(f"/v1/sessions/{sid}/append", {"text": 5})
    check_error(st, r, 400, "text")
    st, r, _ = tiny.post(f"/v1/sessions/{sid}/generate", {"stream_format": "xml"})
    check_error(st, r, 400, "stream_format")
    # an empty session with nothing to generate from
    st, r, _ = tiny.post(f"/v1/sessions/{sid}/generate", {"max_tokens": 3})
    check_error(st, r, 400)
    st, r, _ = tiny.json("GET", "/v1/sessions?limit=0")
    check_error(st, r, 400, "limit")
    st, r, _ = tiny.json("GET", "/v1/sessions?after=xyz")
    check_error(st, r, 400, "after")
    # a state import that is not a state blob
    st, hd, data = tiny.request("PUT", f"/v1/sessions/{sid}/state", b"garbage bytes",
                                {"Content-Type": "application/octet-stream"})
    check_error(st, json.loads(data), 400)


def test_tokenize_400(tiny):
    st, r, _ = tiny.post("/tokenize", {})
    check_error(st, r, 400, "text")
    st, r, _ = tiny.post("/detokenize", {"tokens": [10 ** 9]})
    check_error(st, r, 400)
    st, r, _ = tiny.post("/detokenize", {"tokens": "abc"})
    check_error(st, r, 400, "tokens")


def test_404(tiny):
    st, r, _ = tiny.json("GET", "/v1/nothing")
    check_error(st, r, 404, code="not_found")
    st, r, _ = tiny.json("GET", "/v1/sessions/" + "0" * 32)
    check_error(st, r, 404, code="session_not_found")
    st, r, _ = tiny.json("GET", "/v1/sessions/NOT-AN-ID")
    check_error(st, r, 404, code="session_not_found")
    for method, path, body in (("POST", "/append", {"text": "x"}),
                               ("POST", "/generate", {"text": "x"}),
                               ("POST", "/fork", {}),
                               ("GET", "/state", None),
                               ("DELETE", "", None)):
        st, r, _ = tiny.json(method, "/v1/sessions/" + "a" * 32 + path, body)
        check_error(st, r, 404, code="session_not_found")
    st, r, _ = tiny.post("/v1/completions", {"prompt": "x", "session": "b" * 32})
    check_error(st, r, 404, code="session_not_found")


def test_405_with_allow(tiny):
    st, r, hd = tiny.json("GET", "/v1/completions")
    check_error(st, r, 405, code="method_not_allowed")
    assert "POST" in hd["allow"]
    st, r, hd = tiny.json("POST", "/v1/models", {})
    check_error(st, r, 405)
    assert "GET" in hd["allow"]


def test_415_non_json(tiny):
    st, hd, data = tiny.request("POST", "/v1/completions", b"prompt=x",
                                {"Content-Type": "application/x-www-form-urlencoded"})
    check_error(st, json.loads(data), 415, code="unsupported_media_type")
    st, hd, data = tiny.request("POST", "/v1/chat/completions", b'{"messages": []}',
                                {"Content-Type": "text/plain"})
    check_error(st, json.loads(data), 415)


def test_401_api_key(servers):
    srv = servers(args=["--api-key", "sekrit-1"])
    st, r, _ = srv.post("/v1/completions", {"prompt": "x", "max_tokens": 1})
    check_error(st, r, 401, code="invalid_api_key")
    st, r, _ = srv.post("/v1/completions", {"prompt": "x", "max_tokens": 1},
                        headers={"Authorization": "Bearer wrong"})
    check_error(st, r, 401)
    st, r, _ = srv.post("/v1/completions", {"prompt": "x", "max_tokens": 1},
                        headers={"Authorization": "Bearer sekrit-1"})
    assert st == 200, r
    st, r, _ = srv.json("GET", "/v1/sessions")
    check_error(st, r, 401)
    st, r, _ = srv.json("GET", "/health")  # public
    assert st == 200 and r["status"] == "ok"
    # unknown paths and methods: 401 before 404/405, so that a client without
    # a key learns nothing about the routes
    st, r, _ = srv.json("GET", "/v1/nothing")
    check_error(st, r, 401, code="invalid_api_key")
    st, r, hd = srv.json("GET", "/v1/completions")
    check_error(st, r, 401, code="invalid_api_key")
    assert "allow" not in hd
    key = {"Authorization": "Bearer sekrit-1"}
    st, r, _ = srv.json("GET", "/v1/nothing", headers=key)
    check_error(st, r, 404, code="not_found")
    st, r, _ = srv.json("GET", "/v1/completions", headers=key)
    check_error(st, r, 405, code="method_not_allowed")


def test_413_body_too_large(servers):
    srv = servers(args=["--max-body", "1K"])
    big = {"prompt": "x" * 4000}
    st, r, _ = srv.post("/v1/completions", big)
    check_error(st, r, 413, code="request_too_large")
    st, r, _ = srv.post("/v1/completions", {"prompt": "small", "max_tokens": 1})
    assert st == 200, r


def test_slow_loris_is_cut(servers):
    """A client that trickles its request is cut by --request-timeout."""
    srv = servers(args=["--request-timeout", "2s", "--idle-timeout", "30s"])
    before = srv.metrics().get("darkserve_http_request_timeouts_total", 0)
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    req = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    closed = False
    t_end = time.monotonic() + 60
    try:
        for i in range(10 ** 6):
            if time.monotonic() > t_end:
                break
            try:
                s.sendall(req[i % len(req):i % len(req) + 1])
                s.settimeout(0.5)
                data = s.recv(4096)
                if data == b"":
                    closed = True
                    break
            except socket.timeout:
                continue
            except (ConnectionResetError, BrokenPipeError):
                closed = True
                break
    finally:
        s.close()
    assert closed, "the server kept a trickling client past --request-timeout"
    assert wait_for(lambda: srv.metrics().get("darkserve_http_request_timeouts_total", 0)
                    > before, 30)
    # the server still serves
    assert srv.json("GET", "/health")[0] == 200


def test_linear_attention_without_adapter_says_so(tmp_path):
    import subprocess
    from ds_server import BIN, TINY
    r = subprocess.run([BIN, "serve", "--port", "0", "--model", TINY, "--attn", "darkformer",
                        "--session-dir", str(tmp_path / "s")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "--adapter" in r.stderr and "darkformer" in r.stderr, r.stderr


def test_one_address_cannot_starve_the_server(servers):
    """300 connections that send half a request header from one address do
    not keep /health (from another address) waiting: past
    --max-connections-per-address the server closes that address's new
    connections at once, and --header-timeout cuts the ones it holds
   ."""
    srv = servers(args=["--request-timeout", "300s", "--idle-timeout", "300s",
                        "--header-timeout", "2s"])
    before = srv.metrics().get("darkserve_http_request_timeouts_total", 0)
    socks = []
    try:
        for _ in range(300):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.settimeout(60)
            s.bind(("127.0.0.2", 0))
            s.connect(("127.0.0.1", srv.port))
            try:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Half: ")
            except OSError:
                pass  # already closed by the server: that is the point
            socks.append(s)
        # a client from another address is served (the 300 hold no more than
        # the per-address limit of the server's connections)
        st, r, _ = srv.json("GET", "/health", timeout=60)
        assert st == 200 and r["status"] == "ok"
        # and the half-sent headers are cut by the header timeout
        assert wait_for(lambda: srv.metrics().get("darkserve_http_request_timeouts_total", 0)
                        > before, 60)
    finally:
        for s in socks:
            s.close()
