#!/usr/bin/env python3
"""The shared session store's figures (docs/DEPLOY.md "Scale-out with Redis").

Starts redis-server on a loopback port (its own folder, AOF on, fsynced on
every write, as deploy/ runs it), two darkserve replicas with
--session-store pointing at it and one darkserve with a session directory
(the default store), all on the given model with its default attention,
and measures:

  move   the time to move a session between replicas: a session is served
         alternately by the two replicas, so each turn starts with the
         replica reading the state another one saved (the lease script and
         an HMGET of the blob, then the state loaded into memory); the
         replica logs both parts
         ("read from the shared store ... ms to fetch, ... ms to load the
         state"), p50 / p99 over --moves reads;
  turn   the wall time of one turn as a client sees it (generate, max_tokens
         --gen, greedy; the session saved before the answer), interleaved
         over --turns rounds: the directory store, Redis on one replica (no
         move), Redis alternating replicas (a move every turn); medians;
  size   Redis memory per session (used_memory before and after --sessions
         sessions, and MEMORY USAGE of one), sessions per GiB, and the AOF
         bytes one turn appends.

Every session first gets a system prompt of about --prompt tokens, so its
state is at its full size (the window full).

  python3 tools/bench_store.py --bin build/darkserve \\
      --model models/SmolLM2-135M-Instruct.Q4_1.gguf [--moves 40] [--turns 20]
"""
import argparse
import http.client
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import tempfile
import time

TEXT = ("The archive holds letters written by merchants who sailed between distant ports. "
        "Each letter records prices, weather, and the names of ships that never returned. ")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def redis_cmd(port, *args):
    out = subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


def start_redis(tmp):
    port = free_port()
    d = os.path.join(tmp, "redis")
    os.makedirs(d)
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--dir", d, "--appendonly", "yes", "--appendfsync", "always",
                             "--save", "", "--logfile", os.path.join(d, "redis.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            if redis_cmd(port, "PING") == "PONG":
                return proc, port, d
        except subprocess.CalledProcessError:
            pass
        time.sleep(0.1)
    raise SystemExit("redis-server did not start")


def start(bin_path, model, tmp, name, extra):
    log = os.path.join(tmp, f"{name}.log")
    cmd = [bin_path, "serve", "--port", "0", "--model", model, "--log-file", log,
           "--session-dir", os.path.join(tmp, f"{name}-sessions")] + extra
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(1200):
        text = open(log).read() if os.path.exists(log) else ""
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", text)
        if m and "ready" in text:
            return proc, int(m.group(1)), log
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"{name} did not start:\n{open(log).read() if os.path.exists(log) else ''}")


def call(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request(method, path, body=json.dumps(body) if body is not None else None,
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data) if data else None


def create(port, prompt_tokens):
    st, r = call(port, "POST", "/tokenize", {"content": TEXT})
    per = max(1, len(r["tokens"]))
    st, r = call(port, "POST", "/v1/sessions",
                 {"system": TEXT * (prompt_tokens // per + 1)})
    assert st == 201, r
    return r["id"], r["state_bytes"]


def turn(port, sid, gen):
    t0 = time.perf_counter()
    st, r = call(port, "POST", f"/v1/sessions/{sid}/generate",
                 {"text": " And then?", "max_tokens": gen, "temperature": 0, "stream": False})
    dt = time.perf_counter() - t0
    assert st == 200, r
    return dt * 1e3, r["session"]["state_bytes"]


MOVE = re.compile(r"read from the shared store: version \d+, (\d+) bytes, ([\d.]+) ms "
                  r"\(([\d.]+) ms to fetch, ([\d.]+) ms to load the state\)")


def moves(log_paths):
    out = []
    for p in log_paths:
        out += [tuple(float(x) for x in m.groups()) for m in MOVE.finditer(open(p).read())]
    return out


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(q / 100 * (len(v) - 1))))]


def machine():
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem = int(line.split()[1]) // (1024 * 1024)
    except OSError:
        pass
    redis_v = subprocess.run(["redis-server", "--version"], capture_output=True,
                             text=True).stdout.split()[2]
    return (f"{cpu}, {os.cpu_count()} CPUs visible, {mem} GiB RAM, "
            f"{platform.system()} {platform.release()}, redis-server {redis_v}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="build/darkserve")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--moves", type=int, default=40, help="state reads for the move figure")
    ap.add_argument("--turns", type=int, default=20, help="rounds of the turn figure")
    ap.add_argument("--sessions", type=int, default=16, help="sessions for the size figure")
    ap.add_argument("--prompt", type=int, default=400, help="system prompt tokens (fills the window)")
    ap.add_argument("--gen", type=int, default=8, help="tokens generated per turn")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-store-")
    procs = []
    try:
        rproc, rport, rdir = start_redis(tmp)
        procs.append(rproc)
        url = ["--session-store", f"redis://127.0.0.1:{rport}/0"]
        pa, A, la = start(a.bin, a.model, tmp, "replica-a", url)
        pb, B, lb = start(a.bin, a.model, tmp, "replica-b", url)
        pd, D, ld = start(a.bin, a.model, tmp, "directory", [])
        procs += [pa, pb, pd]

        # move: alternate one session between the replicas
        sid, _ = create(A, a.prompt)
        for i in range(a.moves):
            turn((A, B)[(i + 1) % 2], sid, 1)
        mv = moves([la, lb])[-a.moves:]
        state_bytes = int(mv[-1][0]) if mv else 0

        # turn: directory, Redis on one replica, Redis alternating; interleaved
        sd, _ = create(D, a.prompt)
        s1, _ = create(A, a.prompt)
        s2, _ = create(A, a.prompt)
        lat = {"dir": [], "one": [], "alt": []}
        for i in range(a.turns):
            lat["dir"].append(turn(D, sd, a.gen)[0])
            lat["one"].append(turn(A, s1, a.gen)[0])
            lat["alt"].append(turn((B, A)[i % 2], s2, a.gen)[0])

        # size: Redis memory per session, AOF bytes per turn
        before = int(re.search(r"used_memory:(\d+)", redis_cmd(rport, "INFO", "memory"))[1])
        ids = [create(A, a.prompt)[0] for _ in range(a.sessions)]
        after = int(re.search(r"used_memory:(\d+)", redis_cmd(rport, "INFO", "memory"))[1])
        per = (after - before) / a.sessions
        keys = redis_cmd(rport, "KEYS", f"darkserve:*:s:{ids[0]}")
        usage = int(redis_cmd(rport, "MEMORY", "USAGE", keys.split()[0], "SAMPLES", "0"))
        aof = os.path.join(rdir, "appendonlydir")

        def aof_bytes():
            return sum(os.path.getsize(os.path.join(aof, f)) for f in os.listdir(aof))

        b0 = aof_bytes()
        turn(A, ids[0], 1)
        aof_turn = aof_bytes() - b0
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)

    tot, fetch, load = [m[1] for m in mv], [m[2] for m in mv], [m[3] for m in mv]
    print(f"machine: {machine()}")
    print(f"model: {os.path.basename(a.model)}, default attention; state {state_bytes:,} bytes "
          f"after a {a.prompt}-token system prompt")
    print()
    print(f"| move a session between replicas ({len(mv)} reads) | p50 | p99 |")
    print("|---|---|---|")
    print(f"| Redis: the lease (one script) and the state (HMGET) | "
          f"{pct(fetch, 50):.1f} ms | {pct(fetch, 99):.1f} ms |")
    print(f"| state load into memory | {pct(load, 50):.1f} ms | {pct(load, 99):.1f} ms |")
    print(f"| both (what the replica adds to the turn) | {pct(tot, 50):.1f} ms | "
          f"{pct(tot, 99):.1f} ms |")
    print()
    print(f"| one turn ({a.gen} tokens generated, saved before the answer), {a.turns} rounds "
          "interleaved | median | p90 |")
    print("|---|---|---|")
    for k, name in (("dir", "directory store (--session-dir, fsync)"),
                    ("one", "Redis, the same replica every turn"),
                    ("alt", "Redis, alternating replicas (a move every turn)")):
        print(f"| {name} | {statistics.median(lat[k]):.0f} ms | {pct(lat[k], 90):.0f} ms |")
    print()
    gib = 1 << 30
    print(f"Redis memory per session: {per / 1e6:.2f} MB (used_memory over {a.sessions} sessions; "
          f"MEMORY USAGE of one: {usage / 1e6:.2f} MB) -> {gib / per:.0f} sessions per GiB; "
          f"the AOF grows by {aof_turn / 1e6:.2f} MB per saved turn (until Redis rewrites it)")


if __name__ == "__main__":
    main()
