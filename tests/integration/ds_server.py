"""Helpers that run the real `darkserve serve` binary (used by conftest.py
and the test_api_* modules).

A server starts on a free loopback port (--port 0; the port is read from the
"listening on http://HOST:PORT" log line), is waited for until /health
answers 200, and is always killed at the end of its fixture, even when a
test fails. Env (set by `make pytest`):
  DARKSERVE_BIN         the binary            (default <build>/darkserve)
  DARKSERVE_TINY_MODEL  the tiny random model (default <build>/fixtures/tiny.gguf)
  DARKSERVE_MODEL       the real default model (SmolLM2-135M-Instruct Q4_1)
  DARKSERVE_GEMMA_MODEL the real Gemma 3 270M (models/gemma-3-270m-q4_k_m.gguf)
A missing binary or model fails the tests that need it; nothing is skipped.

HTTP goes through the standard library (http.client), so the tests see the
bytes the server sends; the official `openai` client is used where the
tests are about it.
"""
import http.client
import json
import os
import re
import signal
import subprocess
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("DARKSERVE_BUILD", os.path.join(ROOT, "build"))
BIN = os.environ.get("DARKSERVE_BIN", os.path.join(BUILD, "darkserve"))
TINY = os.environ.get("DARKSERVE_TINY_MODEL", os.path.join(BUILD, "fixtures", "tiny.gguf"))
TINY_GEMMA = os.environ.get("DARKSERVE_TINY_GEMMA", os.path.join(BUILD, "fixtures", "tiny_gemma3.gguf"))
MODEL = os.environ.get("DARKSERVE_MODEL",
                       os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
GEMMA = os.environ.get("DARKSERVE_GEMMA_MODEL",
                       os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf"))

START_S = 120   # a loaded 2-core machine can be slow to load the real model
REQ_S = 300     # one request, generous
JSON = {"Content-Type": "application/json"}


def wait_for(pred, timeout, step=0.05):
    """Polls pred() until it is truthy or timeout seconds pass; returns its
    last value."""
    end = time.monotonic() + timeout
    v = pred()
    while not v and time.monotonic() < end:
        time.sleep(step)
        v = pred()
    return v


def read_text(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def parse_sse(raw):
    """SSE body -> list of event payloads ("data:" lines joined), comments
    (": ping") dropped."""
    events = []
    for block in raw.decode("utf-8").split("\n\n"):
        data = [l[len("data: "):] for l in block.split("\n") if l.startswith("data: ")]
        if data:
            events.append("\n".join(data))
    return events


def sse_json(raw):
    """SSE body -> (list of JSON events, saw_done)."""
    evs = parse_sse(raw)
    done = bool(evs) and evs[-1] == "[DONE]"
    return [json.loads(e) for e in evs if e != "[DONE]"], done


def parse_metrics(text):
    """Prometheus text -> {"name{labels}": value}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, val = line.rpartition(" ")
        try:
            out[key] = float(val)
        except ValueError:
            pass
    return out


class Server:
    """One `darkserve serve` process."""

    def __init__(self, tmp, model=None, args=(), session_dir=None, name="srv", attn="exact",
                 env=None):
        assert os.access(BIN, os.X_OK), f"{BIN} missing: build it first (make)"
        model = model or TINY
        assert os.path.exists(model), f"model {model} missing (make builds the tiny one; " \
                                      "make model fetches the real one)"
        os.makedirs(tmp, exist_ok=True)
        self.tmp = str(tmp)
        self.log = os.path.join(self.tmp, f"{name}.log")
        self.err = os.path.join(self.tmp, f"{name}.stderr")
        self.session_dir = session_dir or os.path.join(self.tmp, f"{name}-sessions")
        self.model = model
        # the name the server gives it (the file name without ".gguf")
        self.model_id = os.path.basename(model)[:-5] if model.endswith(".gguf") else \
            os.path.basename(model)
        # exact unless a test asks otherwise (None: no --attn, the default auto)
        self.args = (["--attn", attn] if attn else []) + list(args)
        self.env = dict(os.environ, **env) if env else None  # extra environment variables
        self.proc = None
        self.port = None
        self.start()

    def start(self):
        # the log file is appended to across restarts: remember where this run starts
        self.log_from = len(read_text(self.log))
        cmd = [BIN, "serve", "--port", "0", "--model", self.model,
               "--log-file", self.log, "--session-dir", self.session_dir] + self.args
        with open(self.err, "ab") as errf:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errf,
                                         env=self.env)
        pat = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")
        m = wait_for(lambda: pat.search(read_text(self.log)[self.log_from:])
                     or self.proc.poll() is not None, START_S)
        if not isinstance(m, re.Match):
            self.kill()
            raise AssertionError(f"server did not start (rc {self.proc.returncode}):\n"
                                 f"{read_text(self.err)}\n{read_text(self.log)}")
        self.port = int(m.group(1))
        ok = wait_for(lambda: self._health_ok(), START_S, 0.1)
        assert ok, f"/health never answered 200:\n{read_text(self.log)}"

    def _health_ok(self):
        try:
            return self.request("GET", "/health", timeout=5)[0] == 200
        except OSError:
            return False

    # ---- HTTP ----
    def conn(self, timeout=REQ_S):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, timeout=REQ_S):
        """-> (status, headers (lower-case keys), body bytes)."""
        c = self.conn(timeout)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
                headers = dict(JSON, **(headers or {}))
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            data = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        finally:
            c.close()

    def json(self, method, path, body=None, headers=None, timeout=REQ_S):
        """-> (status, parsed JSON body, headers)."""
        st, hd, data = self.request(method, path, body, headers, timeout)
        try:
            obj = json.loads(data) if data else None
        except ValueError:
            raise AssertionError(f"{method} {path}: {st} non-JSON body {data[:200]!r}")
        return st, obj, hd

    def post(self, path, body, **kw):
        return self.json("POST", path, body, **kw)

    def open_stream(self, path, body, timeout=REQ_S):
        """Starts a POST and returns (conn, response) to read incrementally."""
        c = self.conn(timeout)
        c.request("POST", path, body=json.dumps(body).encode(), headers=JSON)
        return c, c.getresponse()

    def metrics(self):
        st, _, data = self.request("GET", "/metrics", timeout=30)
        assert st == 200, data
        return parse_metrics(data.decode())

    def url(self, path=""):
        return f"http://127.0.0.1:{self.port}{path}"

    def log_text(self):
        return read_text(self.log)[self.log_from:]

    # ---- process ----
    def stop(self, sig=signal.SIGTERM, timeout=120):
        """Signals the server and waits; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.kill()

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
