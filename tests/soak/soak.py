#!/usr/bin/env python3
"""Soak test: many concurrent clients against one real server on
loopback, for a bounded time, mixing every kind of request and client
disconnects; reports requests served, errors by status, RSS and open fds at
the start and the end. Not part of `make test` (it takes minutes).

    .venv/bin/python tests/soak/soak.py [--clients 64] [--seconds 600]
        [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--attn auto]

Starts `darkserve serve` (DARKSERVE_BIN, else build/darkserve) on a free
loopback port with a fresh session directory, and stops it at the end.
Exit status 1 when any 5xx was answered, the server died, or the RSS after
the run (sessions deleted), less the prefix cache's states (bounded by
--prefix-cache-mb and kept by design: /metrics darkserve_prefix_cache_bytes),
is more than 10% above the same before it, the open fds grew by more
than 10%, or the prefix cache still has room reserved for snapshots. Mix per client iteration (weights): streamed
and non-streamed completions and chat (n=1..2), session create / append /
generate (NDJSON) / fork / export / import / delete, and a streamed request
the client abandons after its first bytes.
"""
import argparse
import collections
import json
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from ds_server import MODEL, Server  # noqa: E402


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
        self.errors = collections.Counter()

    def add(self, op, status):
        with self.lock:
            self.by_op[op] += 1
            self.by_status[status] += 1
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
        except OSError:
            st = 0  # connection-level failure
        stats.add(op, st)
    for sid in mine:
        try:
            srv.request("DELETE", f"/v1/sessions/{sid}")
        except OSError:
            pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--attn", default="auto")
    ap.add_argument("--workdir", default="/tmp/darkserve-soak")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    # every client is 127.0.0.1: the per-address share must hold them all
    conns = str(max(256, 4 * a.clients))
    srv = Server(a.workdir, a.model, name=f"soak-{os.getpid()}", attn=a.attn,
                 args=["--max-connections", conns, "--max-connections-per-address", conns])
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
        time.sleep(1)
        alive = srv.proc.poll() is None
        rss1, fd1 = (rss_mb(pid), n_fds(pid)) if alive else (0, 0)
        pfx1 = prefix_mb(srv) if alive else 0.0
        # snapshots on their way into the cache reserve its room: none left
        reserved = srv.metrics().get("darkserve_prefix_cache_reserved_bytes", 0.0) if alive else 0
        total = sum(stats.by_status.values())
        print(f"soak: {a.clients} clients, {wall:.0f} s, {total} requests "
              f"({total / wall:.1f}/s); server {'alive' if alive else 'DEAD'}")
        print("  by status: " + ", ".join(f"{k}: {v}" for k, v in sorted(stats.by_status.items())))
        print("  by op: " + ", ".join(f"{k}: {v}" for k, v in sorted(stats.by_op.items())))
        if stats.errors:
            print("  5xx: " + ", ".join(f"{k}: {v}" for k, v in stats.errors.items()))
        print(f"  RSS {rss0:.0f} -> {rss1:.0f} MB (prefix cache {pfx0:.0f} -> {pfx1:.0f} MB "
              f"of it), open fds {fd0} -> {fd1}, prefix cache reserved {reserved:.0f} bytes")
        ok = alive and not stats.errors and stats.by_status.get(0, 0) == 0 \
            and rss1 - pfx1 <= (rss0 - pfx0) * 1.10 and fd1 <= fd0 * 1.10 + 1 and reserved == 0
        print("soak: " + ("PASS" if ok else "FAIL"))
        return 0 if ok else 1
    finally:
        srv.kill()


if __name__ == "__main__":
    sys.exit(main())
