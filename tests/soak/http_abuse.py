#!/usr/bin/env python3
"""Abusive HTTP clients against one real server on loopback, each bounded in
time and connections, reporting what the server did. Not part of `make
test` (each run takes seconds to a minute); the numbers go into the report
of the change that needs them. Only 127.0.0.0/8 is ever contacted.

    .venv/bin/python tests/soak/http_abuse.py flood   [--conns 300] [--seconds 20]
    .venv/bin/python tests/soak/http_abuse.py clients [--clients 64] [--requests 20]
    .venv/bin/python tests/soak/http_abuse.py upload  [--mb 300] [--model PATH] [--attn auto]
    .venv/bin/python tests/soak/http_abuse.py uploads [--parallel 4]

flood:   --conns half-open connections from 127.0.0.2..6 (each sends half a
         request head, then nothing; one that is cut reconnects at once)
         while a client on 127.0.0.1 polls /health every 0.2 s with a new
         connection: the poll's latencies (max, median) and failures.
clients: --clients threads on 127.0.0.1, each --requests sequential POSTs
         with a new connection per request, the previous one closed only
         after the next answer (as requests.post leaves it to the garbage
         collector): the failures by kind, and the server's refusal counter.
upload:  one chunked PUT /v1/sessions/{id}/state of --mb MB (past the
         route's limit): the status, how much was sent before the answer,
         and the server's peak RSS (VmHWM) before and after.
uploads: --parallel slow chunked uploads at once: how many were refused
         with 429 (--max-uploads, 2 by default).

The mixed-load soak (chats, streams, sessions, forks, export/import,
cancels; fds and RSS after) is tests/soak/soak.py.

Starts `darkserve serve` (DARKSERVE_BIN, else build/darkserve) on a free
loopback port with the tiny model unless --model is given, and stops it.
Exit status 1 when a goal is missed (flood: a poll over 1 s or failed;
clients: any failure; upload: not refused, or peak RSS grew by more than
32 MB; uploads: none refused with 429 or a 5xx).
"""
import argparse
import collections
import http.client
import json
import os
import socket
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from ds_server import TINY, Server  # noqa: E402


def proc_kb(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def refused(srv):
    m = srv.metrics()
    return {k: v for k, v in m.items() if k.startswith("darkserve_http_connections_refused_total")}


# ---- flood ----

def flooder(port, src, stop, counts):
    """Holds one half-open connection from src; reconnects when it is cut."""
    while not stop.is_set():
        s = socket.socket()
        try:
            s.bind((src, 0))
            s.settimeout(1)
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Half: ")
            counts["connects"] += 1
            while not stop.is_set():
                try:
                    if not s.recv(4096):
                        break  # cut: reconnect
                except socket.timeout:
                    continue
        except OSError:
            counts["cut"] += 1  # reset by the server (shed), or refused: reconnect
            time.sleep(0.01)
        finally:
            s.close()


def cmd_flood(a):
    srv = Server(a.tmp, TINY, name="flood", args=a.server_args)
    stop = threading.Event()
    counts = collections.Counter()
    ths = [threading.Thread(target=flooder, args=(srv.port, f"127.0.0.{2 + i % 5}", stop, counts),
                            daemon=True) for i in range(a.conns)]
    for t in ths:
        t.start()
    time.sleep(2)  # let the flood fill up
    lat, fails = [], 0
    end = time.monotonic() + a.seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        try:
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
            c.request("GET", "/health")
            ok = c.getresponse().status == 200
            c.close()
        except OSError:
            ok = False
        dt = time.monotonic() - t0
        lat.append(dt)
        fails += not ok
        time.sleep(0.2)
    stop.set()
    for t in ths:
        t.join(5)
    ref = refused(srv)
    srv.kill()
    print(f"flood: {a.conns} half-open connections from 127.0.0.2-6 for {a.seconds}s, "
          f"{counts['connects']} connects, {counts['cut']} cut by a reset or refused")
    print(f"  /health polls: {len(lat)}, failed {fails}, latency max {max(lat) * 1000:.1f} ms, "
          f"median {statistics.median(lat) * 1000:.1f} ms")
    print(f"  refusals: {ref}")
    return 0 if fails == 0 and max(lat) < 1.0 else 1


# ---- clients ----

def client(port, n, errs, ok):
    """n sequential requests, a new connection each; the previous one is
    closed only after the next request (requests.post leaves its socket to
    the garbage collector, so a client holds two for a while)."""
    old = None
    for _ in range(n):
        c = None
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            c.request("POST", "/tokenize", body=json.dumps({"text": "hello world"}),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            if r.status == 200:
                ok["n"] += 1
            else:
                errs[f"status {r.status}"] += 1
        except OSError as e:
            errs[type(e).__name__] += 1
        if old:
            old.close()
        old = c
    if old:
        old.close()


def cmd_clients(a):
    srv = Server(a.tmp, TINY, name="clients", args=a.server_args)
    errs, ok = collections.Counter(), collections.Counter()
    ths = [threading.Thread(target=client, args=(srv.port, a.requests, errs, ok))
           for _ in range(a.clients)]
    t0 = time.monotonic()
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    dt = time.monotonic() - t0
    ref = refused(srv)
    srv.kill()
    total = a.clients * a.requests
    print(f"clients: {a.clients} threads x {a.requests} sequential requests on one address "
          f"(new connection each): {ok['n']}/{total} ok in {dt:.1f}s, failures {dict(errs)}")
    print(f"  refusals: {ref}")
    return 0 if not errs else 1


# ---- upload ----

def chunked_put(port, path, total, chunk=1 << 20, delay=0.0):
    """Sends a chunked PUT of total bytes; -> (status or None, bytes sent,
    the answer's error message or "")."""
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(60)
    s.sendall(f"PUT {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
              "Content-Type: application/octet-stream\r\n\r\n".encode())
    block = f"{chunk:x}\r\n".encode() + b"\x00" * chunk + b"\r\n"
    sent = 0
    try:
        while sent < total:
            s.sendall(block)
            sent += chunk
            if delay:
                time.sleep(delay)
        s.sendall(b"0\r\n\r\n")
    except OSError:
        pass  # the server answered and closed: read the answer
    data = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
    except OSError:
        pass
    s.close()
    try:
        status = int(data.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None, sent, ""
    try:
        msg = json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]["message"]
    except (IndexError, ValueError, KeyError, TypeError):
        msg = ""
    return status, sent, msg


def cmd_upload(a):
    srv = Server(a.tmp, a.model or TINY, name="upload", args=a.server_args, attn=a.attn)
    st, obj, _ = srv.post("/v1/sessions", {})
    assert st == 201, obj
    path = f"/v1/sessions/{obj['id']}/state"
    hwm0, rss0 = proc_kb(srv.proc.pid, "VmHWM"), proc_kb(srv.proc.pid, "VmRSS")
    t0 = time.monotonic()
    status, sent, msg = chunked_put(srv.port, path, a.mb << 20)
    dt = time.monotonic() - t0
    hwm1, rss1 = proc_kb(srv.proc.pid, "VmHWM"), proc_kb(srv.proc.pid, "VmRSS")
    alive = srv.json("GET", "/health")[0] == 200
    srv.kill()
    grow = (hwm1 - hwm0) / 1024
    print(f"upload: chunked PUT of {a.mb} MB: status {status} after {sent / 2**20:.0f} MB sent, "
          f"{dt:.1f}s; peak RSS {hwm0 / 1024:.1f} -> {hwm1 / 1024:.1f} MB "
          f"(+{grow:.1f} MB), RSS now {rss1 / 1024:.1f} MB (was {rss0 / 1024:.1f}); "
          f"server {'alive' if alive else 'DEAD'}")
    print(f"  answer: {msg}")
    return 0 if status == 413 and grow <= 32 and alive else 1


def cmd_uploads(a):
    srv = Server(a.tmp, TINY, name="uploads", args=a.server_args)
    st, obj, _ = srv.post("/v1/sessions", {})
    assert st == 201, obj
    path = f"/v1/sessions/{obj['id']}/state"
    res = []
    lock = threading.Lock()

    def one():
        r = chunked_put(srv.port, path, 8 << 20, chunk=64 << 10, delay=0.02)
        with lock:
            res.append(r[0])

    ths = [threading.Thread(target=one) for _ in range(a.parallel)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    srv.kill()
    c = collections.Counter(res)
    print(f"uploads: {a.parallel} slow chunked uploads at once: statuses {dict(c)}")
    return 0 if c[429] > 0 and not any(s is None or s >= 500 for s in res) else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cmd", choices=["flood", "clients", "upload", "uploads"])
    ap.add_argument("--conns", type=int, default=300)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--mb", type=int, default=300)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--model", default=None)
    ap.add_argument("--attn", default="exact")
    ap.add_argument("--tmp", default=None)
    ap.add_argument("server_args", nargs="*", help="after --: extra `serve` options")
    a = ap.parse_args()
    if a.tmp is None:
        import tempfile
        a.tmp = tempfile.mkdtemp(prefix="darkserve-abuse-")
    return {"flood": cmd_flood, "clients": cmd_clients, "upload": cmd_upload,
            "uploads": cmd_uploads}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
