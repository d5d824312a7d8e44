"""Replicas that share sessions through Redis, on one machine: Debian's
redis-server (AOF on, fsynced on every write) and nginx started here on
loopback ports, darkserve replicas with --session-store
redis://127.0.0.1:PORT/0 behind nginx. The nginx configuration written here
includes deploy/nginx-proxy.conf (the shipped proxy settings) in its
location. nginx runs from a temporary prefix (-p, -c; pid, logs and temp
files there, daemon off), as the unprivileged user that runs the tests (as
root: its workers as nobody).

Covered: a conversation that alternates replicas turn by turn equals the
same conversation on one server with a session directory, token for token;
kill -9 of the replica that served turn 2, turn 3 through nginx on the
other; one session driven on both replicas at once (exactly one 409
session_busy); Redis stopped (kill -9) in the middle of a run, with a turn
in flight: clear 503s for what needs a session, 200 for stateless
completions, /health "degraded" with the reason, no crash; Redis restarted
on its AOF directory: service resumes, every acknowledged turn is there and
the one in flight is not.

Skipped (with the reason) only when redis-server or nginx is not installed;
scripts/deps.sh installs both."""
import grp
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import pytest

from ds_server import MODEL, ROOT, TINY, read_text, wait_for

REDIS = shutil.which("redis-server")
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK)
                                  else None)
PROXY_CONF = os.path.join(ROOT, "deploy", "nginx-proxy.conf")

pytestmark = pytest.mark.skipif(
    not REDIS or not NGINX,
    reason="needs Debian's redis-server and nginx (scripts/deps.sh installs them): "
           f"redis-server {'found' if REDIS else 'missing'}, nginx {'found' if NGINX else 'missing'}")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def resp_command(port, *args, timeout=5):
    """One Redis command over a raw socket (RESP) -> the reply's first line."""
    req = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(req.encode())
        data = b""
        while not data.endswith(b"\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return data.decode(errors="replace").split("\r\n")[0]


class Redis:
    """redis-server on a loopback port with its own directory, AOF on and
    fsynced on every write (what an acknowledged turn relies on)."""

    def __init__(self, dirpath):
        self.dir = str(dirpath)
        os.makedirs(self.dir, exist_ok=True)
        self.port = free_port()
        self.log = os.path.join(self.dir, "redis.log")
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen(
            [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
             "--appendonly", "yes", "--appendfsync", "always", "--save", "",
             "--logfile", self.log],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ok = wait_for(lambda: self.ping() or self.proc.poll() is not None, 30)
        assert ok and self.proc.poll() is None, f"redis-server did not start:\n{read_text(self.log)}"

    def ping(self):
        try:
            return resp_command(self.port, "PING") == "+PONG"
        except OSError:
            return False

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def url(self):
        return f"redis://127.0.0.1:{self.port}/0"


class Nginx:
    """nginx in front of the replicas: its own prefix in a temporary folder,
    daemon off, the location including deploy/nginx-proxy.conf."""

    def __init__(self, upstreams):
        # a folder nginx's workers can reach when the tests run as root (they
        # then run as nobody); pytest's tmp_path is private to its user
        self.dir = tempfile.mkdtemp(prefix="ds-nginx-")
        os.chmod(self.dir, 0o755)
        self.port = free_port()
        user = ""
        if os.geteuid() == 0:
            group = "nogroup"
            try:
                grp.getgrnam(group)
            except KeyError:
                group = "nobody"
            user = f"user nobody {group};\n"
        d = self.dir
        servers = "".join(f"        server 127.0.0.1:{p};\n" for p in upstreams)
        conf = (f"{user}daemon off;\nworker_processes 1;\npid {d}/nginx.pid;\n"
                f"error_log {d}/error.log info;\n"
                "events { worker_connections 256; }\n"
                "http {\n"
                f"    access_log {d}/access.log;\n"
                f"    client_body_temp_path {d}/client_body;\n"
                f"    proxy_temp_path {d}/proxy;\n"
                f"    fastcgi_temp_path {d}/fastcgi;\n"
                f"    uwsgi_temp_path {d}/uwsgi;\n"
                f"    scgi_temp_path {d}/scgi;\n"
                "    upstream darkserve {\n" + servers + "        keepalive 8;\n    }\n"
                "    server {\n"
                f"        listen 127.0.0.1:{self.port};\n"
                "        location / {\n"
                "            proxy_pass http://darkserve;\n"
                f"            include {PROXY_CONF};\n"
                "        }\n"
                "    }\n"
                "}\n")
        self.conf = os.path.join(d, "nginx.conf")
        with open(self.conf, "w") as f:
            f.write(conf)
        t = subprocess.run([NGINX, "-t", "-p", d, "-c", self.conf], capture_output=True,
                           text=True)
        assert t.returncode == 0, f"nginx -t:\n{t.stderr}\n{conf}"
        self.proc = subprocess.Popen([NGINX, "-p", d, "-c", self.conf],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ok = wait_for(lambda: self._up() or self.proc.poll() is not None, 30)
        assert ok and self.proc.poll() is None, \
            f"nginx did not start:\n{read_text(os.path.join(d, 'error.log'))}"

    def _up(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def post(self, path, body, timeout=300):
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request("POST", path, body=json.dumps(body).encode(),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            return r.status, json.loads(r.read() or b"null")
        finally:
            c.close()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def redis(tmp_path):
    r = Redis(tmp_path / "redis")
    yield r
    r.kill()


@pytest.fixture
def proxies():
    made = []

    def start(upstreams):
        n = Nginx(upstreams)
        made.append(n)
        return n

    yield start
    for n in made:
        n.stop()


def store_ok(srv):
    """The replica reaches its session store (/health "ok", not "degraded")."""
    st, h, _ = srv.json("GET", "/health", timeout=10)
    return st == 200 and h["status"] == "ok"


def replicas(servers, redis, n=2, model=TINY, attn="performer"):
    out = []
    for i in range(n):
        s = servers(model=model, attn=attn, name=f"replica{i}",
                    args=["--session-store", redis.url()])
        assert wait_for(lambda: store_ok(s), 30, 0.1), s.log_text()
        out.append(s)
    return out


def create(srv, system):
    st, r, _ = srv.post("/v1/sessions", {"system": system})
    assert st == 201, r
    return r["id"]


def turn(srv, sid, text, max_tokens=12):
    st, r, _ = srv.post(f"/v1/sessions/{sid}/generate",
                        {"text": text, "max_tokens": max_tokens, "temperature": 0,
                         "stream": False})
    assert st == 200, r
    return r


def info(srv, sid):
    st, r, _ = srv.json("GET", f"/v1/sessions/{sid}")
    assert st == 200, r
    return r


TEXTS = ["Hello there.", " Tell me more.", " And then?", " What happened next?", " The end."]
SYSTEM = "You are a test assistant."


def test_alternating_replicas_equal_one_server(servers, redis):
    a, b = replicas(servers, redis)
    ctl = servers(model=TINY, attn="performer", name="control")  # a session directory
    sid, cid = create(a, SYSTEM), create(ctl, SYSTEM)
    for t, text in enumerate(TEXTS):
        rep = (a, b)[t % 2]
        got, want = turn(rep, sid, text), turn(ctl, cid, text)
        assert got["tokens"] == want["tokens"], f"turn {t + 1} on replica {t % 2}"
        assert got["session"]["turns"] == t + 1
        # the other replica sees the turn at once (not its old copy)
        other = info((b, a)[t % 2], sid)
        assert other["turns"] == t + 1 and other["tokens"] == got["session"]["tokens"]
    # the state itself: both replicas export the same bytes
    sa, _, blob_a = a.request("GET", f"/v1/sessions/{sid}/state")
    sb, _, blob_b = b.request("GET", f"/v1/sessions/{sid}/state")
    assert sa == sb == 200 and blob_a == blob_b
    # either replica lists it; a state moved between them was read from Redis
    for s in (a, b):
        st, lst, _ = s.json("GET", "/v1/sessions")
        assert st == 200 and [x["id"] for x in lst["data"]] == [sid]
    assert "read from the shared store" in b.log_text()
    # the shared store keeps no checkpoints: regenerate and rollback say so
    st, r, _ = a.post(f"/v1/sessions/{sid}/regenerate", {"max_tokens": 2})
    assert st == 409 and r["error"]["code"] == "checkpoint_not_found", r
    st, r, _ = b.post(f"/v1/sessions/{sid}/rollback", {"turns": 1})
    assert st == 409 and r["error"]["code"] == "checkpoint_not_found", r
    # fork on one, continue the fork on the other; delete on one is seen by both
    st, fk, _ = b.post(f"/v1/sessions/{sid}/fork", {})
    assert st == 201, fk
    assert turn(a, fk["id"], " More.")["session"]["turns"] == 1
    assert a.json("DELETE", f"/v1/sessions/{sid}")[0] == 200
    for s in (a, b):
        st, r, _ = s.post(f"/v1/sessions/{sid}/generate", {"text": "x", "max_tokens": 1})
        assert st == 404 and r["error"]["code"] == "session_not_found", r


def test_import_of_a_directory_store_export(servers, redis):
    """A session exported from a one-server deployment (with its checkpoints)
    moves into the shared store and continues on any replica."""
    a, b = replicas(servers, redis)
    ctl = servers(model=TINY, attn="performer", name="control")  # --checkpoints 8
    cid = create(ctl, SYSTEM)
    for text in TEXTS[:2]:
        turn(ctl, cid, text)
    assert len(info(ctl, cid)["checkpoints"]) == 2
    st, _, blob = ctl.request("GET", f"/v1/sessions/{cid}/state")
    assert st == 200
    sid = create(a, "placeholder")
    st, r, _ = a.json("PUT", f"/v1/sessions/{sid}/state", blob,
                      headers={"Content-Type": "application/octet-stream"})
    assert st == 200, r
    got = info(b, sid)
    assert got["turns"] == 2 and got["checkpoints"] == []  # the state, not its checkpoints
    assert turn(b, sid, TEXTS[2])["tokens"] == turn(ctl, cid, TEXTS[2])["tokens"]


def test_kill9_then_nginx_continues_on_the_other(servers, redis, proxies):
    a, b = replicas(servers, redis)
    ctl = servers(model=TINY, attn="performer", name="control")
    lb = proxies([a.port, b.port])
    sid, cid = create(a, SYSTEM), create(ctl, SYSTEM)
    want = [turn(ctl, cid, t)["tokens"] for t in TEXTS[:3]]
    assert turn(a, sid, TEXTS[0])["tokens"] == want[0]
    assert turn(b, sid, TEXTS[1])["tokens"] == want[1]  # b served turn 2
    b.proc.send_signal(signal.SIGKILL)
    b.proc.wait()
    st, r = lb.post(f"/v1/sessions/{sid}/generate",
                    {"text": TEXTS[2], "max_tokens": 12, "temperature": 0, "stream": False})
    assert st == 200, r
    assert r["tokens"] == want[2]
    assert r["session"]["turns"] == 3
    assert a.proc.poll() is None


def test_one_session_on_both_replicas_at_once(servers, redis):
    # the real model (DARKFormer, the default attention): a generation long
    # enough to overlap the four requests below (up to 400 tokens: ~2 s
    # here, more than 40 now that a token takes ~5 ms), and a 9.4 MB state
    # through Redis
    a, b = replicas(servers, redis, model=MODEL, attn=None)
    sid = create(a, "You are a storyteller.")
    # one replica generates; the other (and the same one) refuse meanwhile
    c, resp = a.open_stream(f"/v1/sessions/{sid}/generate",
                            {"text": "Once upon a time", "max_tokens": 400, "temperature": 0})
    try:
        assert resp.status == 200
        assert "token" in json.loads(resp.readline())
        for srv in (b, a):
            for path, body in (("generate", {"text": "x", "max_tokens": 1}),
                               ("append", {"text": "x"})):
                st, r, _ = srv.post(f"/v1/sessions/{sid}/{path}", body)
                assert st == 409 and r["error"]["code"] == "session_busy", r
        lines = [json.loads(l) for l in resp.read().decode().split("\n") if l.strip()]
        assert lines[-1].get("session", {}).get("turns") == 1, lines[-1]
    finally:
        c.close()
    # both at once: exactly one 409. The two requests leave a barrier
    # together but reach their replicas' lease checks up to tens of
    # milliseconds apart on a busy machine: the winner's generation must
    # outlast that (24 tokens, ~80 ms since decode reached ~300 tokens/s,
    # once let both run one after the other), so it is as long as above.
    go = threading.Barrier(2)
    res = {}

    def drive(name, srv):
        go.wait()
        res[name] = srv.post(f"/v1/sessions/{sid}/generate",
                             {"text": " And then", "max_tokens": 400, "temperature": 0,
                              "stream": False})

    ts = [threading.Thread(target=drive, args=(n, s)) for n, s in (("a", a), ("b", b))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    codes = sorted(r[0] for r in res.values())
    assert codes == [200, 409], res
    busy = [r[1] for r in res.values() if r[0] == 409][0]
    assert busy["error"]["code"] == "session_busy"
    assert info(a, sid)["turns"] == info(b, sid)["turns"] == 2


def test_redis_down_and_back(servers, redis):
    a, b = replicas(servers, redis)
    ctl = servers(model=TINY, attn="performer", name="control")
    sid, cid = create(a, SYSTEM), create(ctl, SYSTEM)
    for t, text in enumerate(TEXTS[:3]):
        assert turn((a, b)[t % 2], sid, text)["tokens"] == turn(ctl, cid, text)["tokens"]
    before = info(b, sid)
    redis.kill()  # abruptly: only what was fsynced to the AOF survives
    for srv in (a, b):
        assert wait_for(lambda: not store_ok(srv), 10, 0.1)
        st, h, _ = srv.json("GET", "/health")
        assert st == 200 and h["status"] == "degraded", h
        assert "unreachable" in h["reason"] and str(redis.port) in h["reason"], h
        for method, path, body in (("POST", f"/v1/sessions/{sid}/generate",
                                    {"text": "x", "max_tokens": 2}),
                                   ("POST", f"/v1/sessions/{sid}/append", {"text": "x"}),
                                   ("POST", "/v1/sessions", {"system": "new"}),
                                   ("GET", f"/v1/sessions/{sid}/state", None),
                                   ("POST", f"/v1/sessions/{sid}/fork", {}),
                                   ("DELETE", f"/v1/sessions/{sid}", None),
                                   ("GET", "/v1/sessions", None)):
            st, hd, raw = srv.request(method, path, body)
            r = json.loads(raw)
            assert st == 503, (method, path, r)
            assert r["error"]["code"] == "session_store_unavailable", r
            assert "unreachable" in r["error"]["message"], r
            assert hd.get("retry-after") == "1"
        # a session this replica has never seen: 503 too, not 404
        st, r, _ = srv.json("GET", "/v1/sessions/" + "ab" * 16)
        assert st == 503, r
        # what needs no session goes on
        st, r, _ = srv.post("/v1/completions", {"prompt": "Hello", "max_tokens": 4})
        assert st == 200, r
        st, r, _ = srv.post("/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
        assert st == 200, r
        assert srv.proc.poll() is None
    # back on the same AOF directory: every acknowledged turn is there
    redis.start()
    for srv in (a, b):
        assert wait_for(lambda: store_ok(srv), 30, 0.1), srv.log_text()
    after = info(a, sid)
    assert after["turns"] == before["turns"] == 3
    assert after["tokens"] == before["tokens"]
    for t, text in enumerate(TEXTS[3:]):
        assert turn((b, a)[t % 2], sid, text)["tokens"] == turn(ctl, cid, text)["tokens"]
    assert info(a, sid)["turns"] == 5
    assert "unreachable" in a.log_text() and "reachable again" in a.log_text()


def test_turn_in_flight_when_redis_dies_is_not_acknowledged(servers, redis):
    a, = replicas(servers, redis, n=1, model=MODEL, attn=None)
    sid = create(a, "You are a storyteller.")
    first = turn(a, sid, "Once upon a time", max_tokens=4)
    c, resp = a.open_stream(f"/v1/sessions/{sid}/generate",
                            {"text": " Then", "max_tokens": 40, "temperature": 0})
    try:
        assert resp.status == 200
        assert "token" in json.loads(resp.readline())
        redis.kill()
        lines = [json.loads(l) for l in resp.read().decode().split("\n") if l.strip()]
    finally:
        c.close()
    # the stream ends with an error event: the turn could not be saved
    last = lines[-1]
    assert "error" in last and last["error"]["code"] == "session_store_unavailable", last
    redis.start()
    assert wait_for(lambda: store_ok(a), 30, 0.1)
    # what was acknowledged is there, the turn in flight is not
    got = wait_for(lambda: a.json("GET", f"/v1/sessions/{sid}"), 20, 0.2)
    assert got[0] == 200 and got[1]["turns"] == 1, got
    assert got[1]["tokens"] == first["session"]["tokens"]
    # and the session goes on (its lease was given back when Redis returned)
    assert wait_for(lambda: a.post(f"/v1/sessions/{sid}/generate",
                                   {"text": " Then", "max_tokens": 2, "stream": False})[0] == 200,
                    30, 0.5)
