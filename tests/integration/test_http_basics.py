"""The real `darkserve serve` process: flags, bind errors, /health and
/metrics, the API key, SIGHUP log reopening, and the SIGTERM drain that
exits 0.

Needs the binary (DARKSERVE_BIN, default <build>/darkserve); a missing
binary fails the tests. Only the standard library is used for HTTP.
"""
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

BUILD = os.environ.get("DARKSERVE_BUILD", "/work/main/build")
BIN = os.environ.get("DARKSERVE_BIN", os.path.join(BUILD, "darkserve"))
WAIT_S = 20


def model_args():
    """A model the app (once plugged in) can load quickly: the tiny fixture
    when it was built, with exact attention (needs no adapter)."""
    tiny = os.environ.get("DARKSERVE_TINY_MODEL", os.path.join(BUILD, "fixtures", "tiny.gguf"))
    args = ["--attn", "exact"]
    if os.path.exists(tiny):
        args += ["--model", tiny]
    return args


def run(args, timeout=WAIT_S):
    return subprocess.run([BIN, "serve"] + args, capture_output=True, text=True,
                          timeout=timeout)


def wait_for(pred, timeout=WAIT_S, step=0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return None


def read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return ""


class Server:
    def __init__(self, tmp_path, extra=()):
        self.log = str(tmp_path / "darkserve.log")
        self.proc = subprocess.Popen(
            [BIN, "serve", "--port", "0", "--log-file", self.log] + model_args() + list(extra),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        m = wait_for(lambda: re.search(r"listening on http://127\.0\.0\.1:(\d+)",
                                       read(self.log)) or self.proc.poll() is not None)
        if not isinstance(m, re.Match):
            self.proc.kill()
            out, err = self.proc.communicate()
            raise AssertionError(f"server did not start: {err}\n{read(self.log)}")
        self.port = int(m.group(1))

    def get(self, path, headers=None):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                     headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=WAIT_S) as r:
                return r.status, dict(r.headers), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read().decode()

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=WAIT_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


def test_binary_exists():
    assert os.access(BIN, os.X_OK), f"{BIN} missing: build it first (make)"


def test_flags():
    r = run(["--help"])
    assert r.returncode == 0
    assert "--max-body SIZE" in r.stdout and "DARKSERVE_MAX_BODY" in r.stdout
    r = run(["--no-such-flag"])
    assert r.returncode == 2
    assert "--no-such-flag" in r.stderr
    r = run(["--port", "99999"])
    assert r.returncode == 2 and "--port" in r.stderr
    r = subprocess.run([BIN, "serve", "--print-config", "--api-key", "hunter2"],
                       capture_output=True, text=True, timeout=WAIT_S,
                       env=dict(os.environ, DARKSERVE_MAX_BODY="2M"))
    assert r.returncode == 0
    assert "hunter2" not in r.stdout
    assert re.search(r"^max-body\s+2M\s+\(env\)$", r.stdout, re.M)
    assert re.search(r"^api-key\s+<secret>\s+\(flag\)$", r.stdout, re.M)


def test_health_metrics_auth_and_drain(tmp_path):
    srv = Server(tmp_path, ["--api-key", "k-123", "--log-format", "json"])
    try:
        status, headers, body = srv.get("/health")
        assert status == 200 and json.loads(body)["status"] == "ok"
        assert re.fullmatch(r"[0-9a-f]{16}", headers["X-Request-Id"])
        status, _, body = srv.get("/metrics")
        assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
        status, headers, body = srv.get("/metrics", {"Authorization": "Bearer k-123"})
        assert status == 200
        assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert 'darkserve_http_requests_total{method="GET",route="/health",code="200"} 1' in body
        status, _, _ = srv.get("/nope", {"X-Api-Key": "k-123"})
        assert status == 404
    finally:
        rc = srv.stop(signal.SIGTERM)
    assert rc == 0
    lines = [json.loads(l) for l in read(srv.log).splitlines()]
    msgs = [l["msg"] for l in lines]
    assert any("draining" in m for m in msgs)
    assert msgs[-1] == "stopped"
    access = [l for l in lines if l["msg"] == "access"]
    assert [a["status"] for a in access] == [200, 401, 200, 404]
    assert all(re.fullmatch(r"[0-9a-f]{16}", a["rid"]) for a in access)


def test_sighup_reopens_log(tmp_path):
    srv = Server(tmp_path)
    try:
        assert srv.get("/health")[0] == 200
        rotated = srv.log + ".1"
        os.rename(srv.log, rotated)
        srv.proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: "reopened" in read(srv.log)), read(rotated)
        assert srv.get("/health")[0] == 200
        assert wait_for(lambda: 'path="/health"' in read(srv.log))
        assert read(rotated).count('path="/health"') == 1
    finally:
        assert srv.stop(signal.SIGINT) == 0


def test_port_in_use(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    try:
        r = run(["--port", str(port)] + model_args())
        assert r.returncode == 1
        assert f"127.0.0.1:{port}" in r.stderr and "in use" in r.stderr
    finally:
        s.close()
