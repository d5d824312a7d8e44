#!/usr/bin/env python3
"""A small load client for darkserve (for measurements, not run by the tests).

  loadgen.py streams --url http://127.0.0.1:8080 --concurrency 1,4,16 --max-tokens 64
      N concurrent streamed chat completions per level (each stream its own
      prompt, greedy, so every stream runs max_tokens unless it ends early);
      per level: median and p90 time to first token (request sent -> first
      content chunk), median per-stream decode rate (tokens after the first /
      time after the first), aggregate rate (all completion tokens / wall time).
  loadgen.py sessions --url ... --n 100 --system "You are terse." [--pid PID]
      creates n sessions with a short system message; prints state bytes per
      session and, with --pid, the server's VmRSS / VmHWM from /proc.

Standard library only. Prints one JSON object per level / run.
"""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse

TOPICS = ["rivers", "mountains", "the moon", "bread", "old clocks", "bicycles", "libraries",
          "volcanoes", "owls", "trains", "tea", "glaciers", "chess", "bridges", "bees",
          "lighthouses", "deserts", "violins", "coral reefs", "maps"]


def one_stream(host, port, i, max_tokens, out, barrier):
    body = json.dumps({
        "messages": [{"role": "user",
                      "content": f"Write a long essay about {TOPICS[i % len(TOPICS)]}."}],
        "max_tokens": max_tokens, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}}).encode()
    c = http.client.HTTPConnection(host, port, timeout=600)
    barrier.wait()
    t0 = time.monotonic()
    c.request("POST", "/v1/chat/completions", body=body,
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        out[i] = {"error": r.status, "body": r.read()[:200].decode(errors="replace")}
        return
    t_first = t_last = None
    usage = None
    while True:
        line = r.readline()
        if not line:
            break
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            break
        ev = json.loads(data)
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev.get("choices", []):
            if ch["delta"].get("content"):
                now = time.monotonic()
                if t_first is None:
                    t_first = now
                t_last = now
    t_end = time.monotonic()
    c.close()
    n = usage["completion_tokens"] if usage else 0
    out[i] = {"ttft_s": (t_first - t0) if t_first else None,
              "tokens": n,
              "decode_tps": (n - 1) / (t_last - t_first) if t_first and t_last > t_first
              else None,
              "t0": t0, "t_end": t_end}


def run_streams(url, concurrency, max_tokens):
    u = urllib.parse.urlparse(url)
    out = [None] * concurrency
    barrier = threading.Barrier(concurrency)
    th = [threading.Thread(target=one_stream,
                           args=(u.hostname, u.port, i, max_tokens, out, barrier))
          for i in range(concurrency)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    errs = [o for o in out if not o or "error" in o]
    ok = [o for o in out if o and "error" not in o]
    ttft = sorted(o["ttft_s"] for o in ok if o["ttft_s"] is not None)
    dec = [o["decode_tps"] for o in ok if o["decode_tps"]]
    wall = max(o["t_end"] for o in ok) - min(o["t0"] for o in ok) if ok else 0
    total = sum(o["tokens"] for o in ok)
    return {
        "concurrency": concurrency, "max_tokens": max_tokens, "errors": len(errs),
        "ttft_median_s": round(statistics.median(ttft), 3) if ttft else None,
        "ttft_p90_s": round(ttft[min(len(ttft) - 1, int(0.9 * len(ttft)))], 3) if ttft else None,
        "stream_decode_tps_median": round(statistics.median(dec), 2) if dec else None,
        "aggregate_tps": round(total / wall, 2) if wall > 0 else None,
        "completion_tokens": total, "wall_s": round(wall, 2),
    }


def proc_status(pid):
    vals = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                vals[k] = v.strip()
    return vals


def run_sessions(url, n, system, pid):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    before = proc_status(pid) if pid else None
    ids, sizes, tokens = [], [], []
    t0 = time.monotonic()
    for _ in range(n):
        c.request("POST", "/v1/sessions", body=json.dumps({"system": system}).encode(),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        s = json.loads(r.read())
        if r.status != 201:
            raise SystemExit(f"create failed: {r.status} {s}")
        ids.append(s["id"])
    dt = time.monotonic() - t0
    for sid in ids:
        c.request("GET", f"/v1/sessions/{sid}")
        r = c.getresponse()
        s = json.loads(r.read())
        sizes.append(s["state_bytes"])
        tokens.append(s["tokens"])
    c.request("GET", "/metrics")
    metrics = {l.rsplit(" ", 1)[0]: l.rsplit(" ", 1)[1]
               for l in c.getresponse().read().decode().splitlines()
               if l.startswith("darkserve_session")}
    c.close()
    return {"sessions": n, "create_s": round(dt, 2), "tokens_per_session": tokens[0],
            "state_bytes_per_session": statistics.median(sizes),
            "proc_before": before, "proc_after": proc_status(pid) if pid else None,
            "metrics": metrics}


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("streams")
    a.add_argument("--url", default="http://127.0.0.1:8080")
    a.add_argument("--concurrency", default="1,4,16")
    a.add_argument("--max-tokens", type=int, default=64)
    b = sub.add_parser("sessions")
    b.add_argument("--url", default="http://127.0.0.1:8080")
    b.add_argument("--n", type=int, default=100)
    b.add_argument("--system", default="You are a terse assistant.")
    b.add_argument("--pid", type=int, default=0)
    args = ap.parse_args(argv)
    if args.cmd == "streams":
        for c in (int(x) for x in args.concurrency.split(",")):
            print(json.dumps(run_streams(args.url, c, args.max_tokens)), flush=True)
    else:
        print(json.dumps(run_sessions(args.url, args.n, args.system, args.pid)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
