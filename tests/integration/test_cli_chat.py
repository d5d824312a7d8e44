"""`darkserve chat` (server/cli/cli_chat.c, docs/CLI.md) driven through a
pseudo-terminal, as a person would use it: a turn streams the reply the
server gives, /stats reports the session growing, /rollback and /regenerate
act on the server's checkpoints, /save then /load round-trips the state into
a new session, /system starts afresh, Ctrl-C stops a reply without leaving,
Ctrl-D leaves with status 0; an unreachable --url is a clear error; with
--model (or the server's default model) chat starts its own server and
stops it on exit.

Expected replies are always the server's own (greedy, the same request sent
through the API), never hard-coded."""
import fcntl
import http.server
import json
import os
import pty  # noqa: F401  (os.openpty is the pty module's primitive)
import re
import select
import socket
import subprocess
import termios
import threading
import time

from ds_server import BIN, TINY, parse_metrics, wait_for

PROMPT = "\r\n> "
SID = re.compile(r"session ([0-9a-f]{32})")


class Chat:
    """One `darkserve chat` process on the slave side of a new pty (its
    controlling terminal, so Ctrl-C written to the master is a SIGINT)."""

    def __init__(self, args, env=None):
        master, slave = os.openpty()
        self.proc = subprocess.Popen(
            [BIN, "chat"] + list(args), stdin=slave, stdout=slave, stderr=slave,
            start_new_session=True, env=dict(os.environ, **(env or {})),
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
        os.close(slave)
        self.fd = master
        self.raw = b""

    @property
    def out(self):
        return self.raw.decode("utf-8", "replace")

    def _pump(self, timeout):
        r, _, _ = select.select([self.fd], [], [], timeout)
        if not r:
            return False
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: the slave side is closed (the process ended)
            return None
        if not data:
            return None
        self.raw += data
        return True

    def wait(self, pred, timeout=120, what="output"):
        """Reads until pred(out) is true; fails with the output so far."""
        end = time.monotonic() + timeout
        while not pred(self.out):
            left = end - time.monotonic()
            assert left > 0, f"timed out waiting for {what}; output:\n{self.out[-3000:]}"
            if self._pump(min(left, 0.5)) is None:
                assert pred(self.out), f"chat ended before {what}; output:\n{self.out[-3000:]}"
        return self.out

    def start(self, timeout=120):
        """Waits for the banner and the first prompt; returns the session id."""
        out = self.wait(lambda o: "Ctrl-D quits." in o and o.endswith(PROMPT), timeout,
                        "the banner")
        return SID.search(out).group(1)

    def command(self, line, timeout=120):
        """Types line, waits for the next prompt, returns what was printed
        between the echoed line and that prompt (without its last line end)."""
        mark = len(self.out)
        os.write(self.fd, line.encode() + b"\n")
        echo = line + "\r\n"

        def rest(o):
            i = o.find(echo, mark)
            return None if i < 0 else o[i + len(echo):]

        def done(o):
            r = rest(o)
            return r is not None and (r == "> " or r.endswith(PROMPT))

        r = rest(self.wait(done, timeout, line))[:-2]
        return r[:-2] if r.endswith("\r\n") else r

    def stats(self):
        s = self.command("/stats")
        m = re.search(r"^tokens\s+(\d+)", s, re.M)
        assert m, s
        return int(m.group(1)), s

    def eof(self, timeout=60):
        """Ctrl-D at the prompt; returns the exit status."""
        os.write(self.fd, b"\x04")
        try:
            rc = self.proc.wait(timeout=timeout)
        finally:
            while self._pump(0.1):
                pass
        return rc

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.fd)


def api_reply(srv, messages_per_turn, max_tokens):
    """The server's own greedy replies to these user turns in a fresh session."""
    st, s, _ = srv.post("/v1/sessions", {})
    assert st == 201, s
    replies = []
    for content in messages_per_turn:
        st, r, _ = srv.post(f"/v1/sessions/{s['id']}/generate",
                            {"messages": [{"role": "user", "content": content}],
                             "max_tokens": max_tokens, "temperature": 0, "stream": False})
        assert st == 200, r
        replies.append(r["text"])
    return replies


def shown(text):
    """A reply as command() returns it: \n shown as \r\n by the terminal
    (ONLCR), without a last line end."""
    t = text.replace("\n", "\r\n")
    return t[:-2] if t.endswith("\r\n") else t


def test_chat_session_commands(tiny_llama, tmp_path):
    # its /system command makes a session of a system prompt alone, which
    # Gemma's turn format cannot hold (a system message must be followed by a
    # user message): the tiny Llama
    tiny = tiny_llama
    want = api_reply(tiny, ["Hello there", "And then?"], 8)
    chat = Chat(["--url", tiny.url(), "--max-tokens", "8", "--temperature", "0"])
    try:
        sid = chat.start()
        t0, _ = chat.stats()
        assert t0 == 0
        # a turn prints the server's reply (streamed: SSE events, as they come)
        reply1 = chat.command("Hello there")
        assert want[0] and reply1 == shown(want[0])
        t1, s1 = chat.stats()
        assert t1 > t0
        assert re.search(r"^turns\s+1 ", s1, re.M), s1
        assert re.search(r"^last reply\s+\d+ tokens in", s1, re.M), s1
        reply2 = chat.command("And then?")
        assert reply2 == shown(want[1])
        t2, _ = chat.stats()
        assert t2 > t1
        # /rollback 1: back to the tokens after the first turn
        out = chat.command("/rollback 1")
        assert f"rolled back 1 turn: {t1} tokens, 1 turns" in out, out
        assert chat.stats()[0] == t1
        # /regenerate: the first turn's reply again (greedy: the same text)
        assert chat.command("/regenerate") == reply1
        assert chat.stats()[0] == t1
        # /save then /load: a new session with the saved token count
        blob = tmp_path / "s.dsst"
        out = chat.command(f"/save {blob}")
        assert f"saved session {sid} to {blob}: {blob.stat().st_size} bytes, {t1} tokens" in out, out
        assert blob.stat().st_size > 0
        out = chat.command(f"/load {blob}")
        m = re.search(r"loaded .* into session ([0-9a-f]{32}): (\d+) tokens, 1 turns", out)
        assert m, out
        assert m.group(1) != sid and int(m.group(2)) == t1
        tl, sl = chat.stats()
        assert tl == t1 and m.group(1) in sl
        # the loaded session goes on as the saved one would
        assert chat.command("And then?") == reply2
        # /system: a fresh session holding only the system prompt
        out = chat.command("/system You are terse.")
        m = re.search(r"new session ([0-9a-f]{32}) with that system prompt: (\d+) tokens", out)
        assert m, out
        ts, ss = chat.stats()
        assert ts == int(m.group(2)) > 0 and re.search(r"^turns\s+0 ", ss, re.M), ss
        # errors are said and the chat goes on
        assert "unknown command '/bogus'" in chat.command("/bogus")
        assert "usage: /rollback" in chat.command("/rollback x")
        out = chat.command("/rollback 5")
        assert "error:" in out and "(HTTP 409)" in out, out
        out = chat.command(f"/load {tmp_path / 'missing.dsst'}")
        assert "cannot read" in out, out
        assert chat.eof() == 0
    finally:
        chat.close()
    # the session stays on the server, and the chat said how to continue it
    assert "--session " in chat.out


def test_chat_ctrl_c_stops_a_reply(servers):
    """Ctrl-C while a (very long) reply streams closes that stream: the
    server cancels the generation, the chat prints [stopped] and goes on."""
    srv = servers(model=TINY, attn="performer", args=["--max-tokens-limit", "1000000"])
    # the end-of-sequence token banned (--options): the reply cannot end by itself
    info = subprocess.run([BIN, "info", TINY], capture_output=True, check=True).stdout.decode()
    eos = re.search(r"^eos id\s+(\d+)", info, re.M).group(1)
    chat = Chat(["--url", srv.url(), "--max-tokens", "1000000", "--temperature", "0",
                 "--options", json.dumps({"logit_bias": {eos: -100}})])
    try:
        chat.start()
        mark = len(chat.out)
        os.write(chat.fd, b"Tell me everything\n")
        echo = "Tell me everything\r\n"
        # some of the reply has arrived
        chat.wait(lambda o: echo in o[mark:] and len(o) > o.index(echo, mark) + len(echo) + 8,
                  what="the reply's first text")
        os.write(chat.fd, b"\x03")
        chat.wait(lambda o: o.endswith(PROMPT) and "[stopped]\r\n> " in o[mark:],
                  what="[stopped]")
        assert chat.proc.poll() is None

        finished = {}

        def cancelled():
            text = srv.request("GET", "/metrics")[2].decode()
            finished.clear()
            finished.update({k: v for k, v in parse_metrics(text).items()
                             if k.startswith("darkserve_engine_sequences_finished_total")})
            key = 'darkserve_engine_sequences_finished_total{reason="cancelled"}'
            return finished.get(key, 0) >= 1
        assert wait_for(cancelled, 60, 0.2), (finished, chat.out[-2000:], srv.log_text()[-3000:])
        # what was generated stays in the session, once the server saved it
        got = []
        assert wait_for(lambda: got.append(chat.stats()[0]) or got[-1] > 0, 60, 0.2), got
        assert got[-1] < 1000000
        # the session goes on (the chat waits while the server ends the job)
        out = chat.command("/rollback 1")
        assert "rolled back 1 turn: 0 tokens, 0 turns" in out, out
        assert chat.eof() == 0
    finally:
        chat.close()


def test_chat_unreachable_url_is_an_error():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nobody listens there now
    r = subprocess.run([BIN, "chat", "--url", f"http://127.0.0.1:{port}"], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=60)
    assert r.returncode == 1, r
    err = r.stderr.decode()
    assert f"cannot reach the server at http://127.0.0.1:{port}" in err, err
    assert "Connection refused" in err, err
    # usage errors are status 2
    r = subprocess.run([BIN, "chat", "--url", "ftp://x"], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=60)
    assert r.returncode == 2 and b"only http:// URLs" in r.stderr, r
    r = subprocess.run([BIN, "chat", "--url", "http://127.0.0.1:1", "--model", TINY],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    assert r.returncode == 2 and b"--url talks to a running server" in r.stderr, r


class Scripted(http.server.BaseHTTPRequestHandler):
    """A fake server with the answers a real one gives in rare cases: text
    with a NUL (sent as \\u0000), pings, chunks split inside events, an
    error event after the first byte, an HTTP error with its JSON message."""
    protocol_version = "HTTP/1.1"
    SID = "ab" * 16

    def log_message(self, *a):
        pass

    def answer(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self.answer(200, {"status": "ok"})
        else:
            self.answer(404, {"error": {"message": "no such route", "type": "not_found_error",
                                        "param": None, "code": "not_found"}})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/v1/sessions":
            self.answer(201, {"id": self.SID, "tokens": 0, "state_bytes": 8, "turns": 0})
        elif self.path.endswith("/generate"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            events = (b": ping\n\n"
                      b'data: {"text": "nul[\\u0000]", "token": 1}\n\n'
                      b'data: {"text": " and more", "token": 2}\n\n'
                      b'data: {"error": {"message": "generation failed: boom", '
                      b'"type": "server_error", "param": null, "code": "internal_error"}}\n\n'
                      b"data: [DONE]\n\n")
            for i in range(0, len(events), 5):  # chunks cut inside lines
                piece = events[i:i + 5]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.answer(409, {"error": {"message": "session has no checkpoint 3 turns back",
                                        "type": "conflict_error", "param": "turns",
                                        "code": "checkpoint_not_found"}})


def test_chat_against_a_scripted_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    chat = Chat(["--url", f"http://127.0.0.1:{srv.server_port}"])
    try:
        assert chat.start() == Scripted.SID
        out = chat.command("hi")
        assert "nul[\x00] and more" in out, repr(out)
        assert "error: generation failed: boom" in out, out
        out = chat.command("/rollback 3")
        assert "error: session has no checkpoint 3 turns back (HTTP 409)" in out, out
        assert chat.eof() == 0
    finally:
        chat.close()
        srv.shutdown()
        srv.server_close()


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def run_own_server(args, env=None):
    chat = Chat(args + ["--max-tokens", "4", "--temperature", "0", "--", "--attn", "exact"],
                env=env)
    try:
        chat.start()
        log = re.search(r"\(log: (\S+)\)", chat.out).group(1)
        url = re.search(r"on (http://127\.0\.0\.1:(\d+))", chat.out)
        port = int(url.group(2))
        with open(log) as f:
            pid = int(re.search(r"listening on http://127\.0\.0\.1:\d+ \(pid (\d+)\)",
                                f.read()).group(1))
        assert pid_alive(pid) and pid != chat.proc.pid
        assert chat.command("Hi")  # a reply from the model
        assert chat.stats()[0] > 0
        assert chat.eof() == 0
    finally:
        chat.close()
    # the server is gone (reaped by chat), its folder too, the port closed
    assert not pid_alive(pid)
    assert not os.path.exists(os.path.dirname(log))
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_chat_model_starts_its_own_server():
    run_own_server(["--model", TINY])


def test_chat_default_model_starts_its_own_server():
    """Neither --url nor --model: the server's default model
    ($DARKSERVE_MODEL here, as `darkserve serve` takes it)."""
    run_own_server([], env={"DARKSERVE_MODEL": TINY})
