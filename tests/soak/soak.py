#!/usr/bin/env python3
"""Soak test: many concurrent clients against one real server on
loopback, for a bounded time, mixing every kind of request and client
disconnects; reports requests served, errors by status, RSS and open fds at
the start and the end. Not part of `make test` (it takes minutes).

    .venv/bin/python tests/soak/soak.py [--clients 32] [--seconds 180] [--warmup 20]
        [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--attn auto]
        [-- extra serve options]

Starts `darkserve serve` (DARKSERVE_BIN, else build/darkserve) on a free
loopback port at its default limits (every client is 127.0.0.1, so the
per-address connection share is exercised too), with a fresh session and
upload directory, and stops it at the end. The start's RSS and fds are
read after a warm-up: a full batch, then --warmup seconds of the mix with
its sessions deleted. Mix per client iteration
(weights): streamed and non-streamed completions and chat (n=1..2), session
create / append / generate (NDJSON) / fork / export / import / delete, and a
streamed request the client abandons after its first bytes.

Exit status 1 when any request failed at the connection level or was
answered with a 5xx, the server died, or, once every session is deleted:
the open fds are not back at their start value, a session or spooled upload
file is left on disk, the RSS (less the prefix cache's states, bounded by
--prefix-cache-mb and kept by design: /metrics darkserve_prefix_cache_bytes)
is more than 10% above the same at the warmed-up start, or the prefix cache
still has room reserved for snapshots.

--trim (needs gdb, and the right to attach to the server): the server is
made to call malloc_trim(0) before the start's RSS is read and again after
the run, and the RSS is reported both ways, which tells what glibc keeps
free in its arenas apart from memory in use (a diagnosis: the pass rule
stays the same).
"""
import argparse
import collections
import http.client
import json
import os
import random
import re
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from ds_server import MODEL, Server, wait_for  # noqa: E402


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def prefix_mb(srv):
    """MB of state the prefix cache holds (its gauge on /metrics)."""
    return srv.metrics().get("darkserve_prefix_cache_bytes", 0.0) / 2 ** 20


def n_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_status = collections.Counter()
        self.by_op = collections.Counter()
        self.refusals = collections.Counter()
        self.errors = collections.Counter()

    def add(self, op, status):
        with self.lock:
            self.by_op[op] += 1
            self.by_status[status] += 1
            if status >= 400:
                self.refusals[(op, status)] += 1
            if status >= 500:
                self.errors[(op, status)] += 1


def client(srv, stats, end, seed):
    rnd = random.Random(seed)
    mine = []  # session ids this client made
    while time.monotonic() < end:
        op = rnd.choices(["completion", "chat_stream", "create", "append", "generate", "fork",
                          "export_import", "delete", "abandon"],
                         [3, 2, 2, 2, 2, 1, 1, 1, 1])[0]
        try:
            if op == "completion":
                st, _, _ = srv.request("POST", "/v1/completions",
                                       {"prompt": "Once upon a time", "max_tokens": 8,
                                        "n": rnd.choice([1, 2]), "stream": rnd.random() < 0.5})
            elif op == "chat_stream":
                st, _, _ = srv.request("POST", "/v1/chat/completions",
                                       {"messages": [{"role": "user", "content": "Hi there"}],
                                        "max_tokens": 8, "stream": True})
            elif op == "create" or not mine:
                st, _, raw = srv.request("POST", "/v1/sessions",
                                         {"system": f"You are assistant {seed}."})
                if st == 201:
                    mine.append(json.loads(raw)["id"])
                op = "create"
            elif op == "append":
                st, _, _ = srv.request("POST", f"/v1/sessions/{rnd.choice(mine)}/append",
                                       {"text": " and then"})
            elif op == "generate":
                st, _, _ = srv.request("POST", f"/v1/sessions/{rnd.choice(mine)}/generate",
                                       {"text": " Next:", "max_tokens": 6})
            elif op == "fork":
                st, _, raw = srv.request("POST", f"/v1/sessions/{rnd.choice(mine)}/fork", {})
                if st == 201:
                    mine.append(json.loads(raw)["id"])
            elif op == "export_import":
                sid = rnd.choice(mine)
                st, _, blob = srv.request("GET", f"/v1/sessions/{sid}/state")
                if st == 200:
                    st, _, _ = srv.request("PUT", f"/v1/sessions/{sid}/state", blob,
                                           {"Content-Type": "application/octet-stream"})
            elif op == "delete":
                sid = mine.pop(rnd.randrange(len(mine)))
                st, _, _ = srv.request("DELETE", f"/v1/sessions/{sid}")
            else:  # abandon a stream after its first bytes
                c, r = srv.open_stream("/v1/completions",
                                       {"prompt": "Tell a long story", "max_tokens": 200,
                                        "stream": True})
                st = r.status
                r.read(1)
                c.close()
        except (OSError, http.client.HTTPException):
            st = 0  # connection-level failure
        stats.add(op, st)
    for sid in mine:
        try:
            srv.request("DELETE", f"/v1/sessions/{sid}")
        except OSError:
            pass


def malloc_trim(pid):
    """Has the process pid call malloc_trim(0) (through gdb) -> True when
    the call ran."""
    try:
        r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "call (int)malloc_trim(0)"],
                           capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return re.search(r"^\$1 = [01]$", r.stdout, re.M) is not None


def files_in(d):
    """Names of the files under d (recursively) but the store's lock file,
    for the leftovers check."""
    out = []
    for root, _, names in os.walk(d):
        out += [os.path.relpath(os.path.join(root, n), d) for n in names if n != ".lock"]
    return sorted(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=180)
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--attn", default="auto")
    ap.add_argument("--workdir", default=None, help="default: a fresh temporary directory")
    ap.add_argument("--warmup", type=float, default=20,
                    help="seconds of the same mix before the start's RSS is read")
    ap.add_argument("--trim", action="store_true",
                    help="report the RSS again after malloc_trim(0) in the server (gdb)")
    ap.add_argument("server_args", nargs="*", help="after --: extra `serve` options")
    a = ap.parse_args()
    if a.workdir is None:
        import tempfile
        a.workdir = tempfile.mkdtemp(prefix="darkserve-soak-")
    os.makedirs(a.workdir, exist_ok=True)
    updir = os.path.join(a.workdir, f"uploads-{os.getpid()}")
    os.makedirs(updir, exist_ok=True)
    srv = Server(a.workdir, a.model, name=f"soak-{os.getpid()}", attn=a.attn,
                 args=["--upload-dir", updir] + a.server_args)
    try:
        pid = srv.proc.pid
        # warm up with a full batch (the engine's scratch for that many
        # sequences stays allocated: working memory, not state), then the
        # baseline
        warm = [threading.Thread(target=srv.request,
                                 args=("POST", "/v1/completions",
                                       {"prompt": "warm", "max_tokens": 4, "n": 2}))
                for _ in range(a.clients)]
        for t in warm:
            t.start()
        for t in warm:
            t.join()
        # then the mix itself for a while (its sessions deleted at the
        # end): what the engine and the allocator keep after their first
        # prefills of each kind belongs to the warmed-up start
        if a.warmup > 0:
            wend = time.monotonic() + a.warmup
            warm = [threading.Thread(target=client, args=(srv, Stats(), wend, 1000 + i))
                    for i in range(a.clients)]
            for t in warm:
                t.start()
            for t in warm:
                t.join()
        time.sleep(1)
        trim0 = None
        if a.trim:
            trim0 = rss_mb(pid)
            if not malloc_trim(pid):
                print("soak: malloc_trim(0) through gdb failed (--trim)")
                return 1
        rss0, fd0, pfx0 = rss_mb(pid), n_fds(pid), prefix_mb(srv)
        stats = Stats()
        end = time.monotonic() + a.seconds
        threads = [threading.Thread(target=client, args=(srv, stats, end, i))
                   for i in range(a.clients)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        alive = srv.proc.poll() is None
        # connections the clients closed last are reaped within moments
        fd1 = wait_for(lambda: n_fds(pid) <= fd0 and n_fds(pid), 10, 0.2) or n_fds(pid) \
            if alive else 0
        rss1 = rss_mb(pid) if alive else 0
        m = srv.metrics() if alive else {}
        pfx1 = m.get("darkserve_prefix_cache_bytes", 0.0) / 2 ** 20
        # snapshots on their way into the cache reserve its room: none left
        reserved = m.get("darkserve_prefix_cache_reserved_bytes", 0.0)
        sessions_left = files_in(srv.session_dir)
        uploads_left = files_in(updir)
        total = sum(stats.by_status.values())
        print(f"soak: {a.clients} clients, {wall:.0f} s, {total} requests "
              f"({total / wall:.1f}/s); server {'alive' if alive else 'DEAD'}")
        print("  by status: " + ", ".join(f"{k}: {v}" for k, v in sorted(stats.by_status.items())))
        print("  by op: " + ", ".join(f"{k}: {v}" for k, v in sorted(stats.by_op.items())))
        if stats.refusals:
            print("  4xx/5xx by op: " + ", ".join(f"{k}: {v}" for k, v in stats.refusals.items()))
        print(f"  RSS {rss0:.1f} -> {rss1:.1f} MB (prefix cache {pfx0:.1f} -> {pfx1:.1f} MB "
              f"of it), open fds {fd0} -> {fd1}, prefix cache reserved {reserved:.0f} bytes")
        if a.trim and alive:
            if malloc_trim(pid):
                rss2 = rss_mb(pid)
                print(f"  with malloc_trim(0): start {trim0:.1f} -> {rss0:.1f} MB, end "
                      f"{rss1:.1f} -> {rss2:.1f} MB ({rss1 - rss2:.1f} MB was free memory kept "
                      f"in glibc's arenas); end less the prefix cache "
                      f"{rss2 - pfx1:.1f} MB vs start {rss0 - pfx0:.1f} MB")
            else:
                print("  malloc_trim(0) through gdb failed")
        print(f"  left on disk: {len(sessions_left)} session file(s) {sessions_left[:5]}, "
              f"{len(uploads_left)} spooled upload(s) {uploads_left[:5]}")
        ok = alive and not stats.errors and stats.by_status.get(0, 0) == 0 \
            and rss1 - pfx1 <= (rss0 - pfx0) * 1.10 \
            and fd1 <= fd0 and reserved == 0 \
            and not sessions_left and not uploads_left
        print("soak: " + ("PASS" if ok else "FAIL"))
        return 0 if ok else 1
    finally:
        srv.kill()


if __name__ == "__main__":
    sys.exit(main())
