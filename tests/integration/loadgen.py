#!/usr/bin/env python3
"""A small load client for darkserve (for measurements, not run by the tests).

  loadgen.py streams --url http://127.0.0.1:8080 --concurrency 1,4,16 --max-tokens 64
             [--repeat R] [--min-streams N] [--pid PID]
      N concurrent streamed chat completions per level (each stream its own
      prompt, greedy, so every stream runs max_tokens unless it ends early);
      per level: median, p90 and p99 time to first token (request sent ->
      first content chunk), median per-stream decode rate (tokens after the
      first / time after the first), aggregate rate (all completion tokens /
      wall time). Every request's prompt is new to the server (a serial
      number in it), so the prefix cache serves at most the shared
      system-prompt part, as it would for distinct users; cached_tokens
      reports what it served.
      Each level runs max(R, ceil(N / concurrency)) times (default once):
      time-to-first-token percentiles are over every stream of every run, the
      aggregate rate is the median over the runs (all of them listed).
      With --pid (the server's process): the server's VmRSS after each level
      and its VmHWM during the level (the peak is reset before the level
      through /proc/PID/clear_refs; hwm_reset false means it could not be, and
      the figure is the process's peak so far).
      Last line: the aggregate of each level over that of one stream, when a
      level of 1 ran ("aggregate_vs_1"; the batching target is the 16-stream one),
      and its decomposition ("decomposition", see decompose()): each level's
      first-token time and decode step against one stream's, and the step
      that would give --target times one stream's aggregate (default 4).
  loadgen.py sessions --url ... --n 100 --system "You are terse." [--pid PID]
      creates n sessions with a short system message; prints state bytes per
      session and, with --pid, the server's VmRSS / VmHWM from /proc.

Standard library only. Prints one JSON object per level / run.
"""
import argparse
import http.client
import itertools
import json
import math
import random
import statistics
import sys
import threading
import time
import urllib.parse

TOPICS = ["rivers", "mountains", "the moon", "bread", "old clocks", "bicycles", "libraries",
          "volcanoes", "owls", "trains", "tea", "glaciers", "chess", "bridges", "bees",
          "lighthouses", "deserts", "violins", "coral reefs", "maps"]


# a tag per process and a number per request: no prompt repeats, within a run
# or across runs against the same server
_tag = f"{random.SystemRandom().randrange(16 ** 6):06x}"
_serial = itertools.count(1)


def percentile(xs, q):
    """The q-th percentile (0..100) of xs with linear interpolation between
    the two nearest ranks (numpy's default method): sorted xs at fractional
    index (len - 1) * q / 100. None for no data."""
    if not xs:
        return None
    v = sorted(xs)
    pos = (len(v) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def one_stream(host, port, i, max_tokens, out, barrier):
    serial = next(_serial)
    body = json.dumps({
        "messages": [{"role": "user",
                      "content": f"Request {_tag}-{serial}. "
                                 f"Write a long essay about {TOPICS[i % len(TOPICS)]}."}],
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
    cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
    out[i] = {"ttft_s": (t_first - t0) if t_first else None,
              "tokens": n, "cached_tokens": cached,
              "decode_tps": (n - 1) / (t_last - t_first) if t_first and t_last > t_first
              else None,
              "t0": t0, "t_end": t_end}


def one_run(host, port, concurrency, max_tokens):
    """concurrency streams started together -> their results (None or a dict
    with "error" for a failed one)."""
    out = [None] * concurrency
    barrier = threading.Barrier(concurrency)
    th = [threading.Thread(target=one_stream,
                           args=(host, port, i, max_tokens, out, barrier))
          for i in range(concurrency)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    return out


def summarize(concurrency, max_tokens, runs):
    """One level's figure from its runs (each a list of one_run results)."""
    streams = [o for run in runs for o in run]
    errs = [o for o in streams if not o or "error" in o]
    ok = [o for o in streams if o and "error" not in o]
    ttft = sorted(o["ttft_s"] for o in ok if o["ttft_s"] is not None)
    dec = [o["decode_tps"] for o in ok if o["decode_tps"]]
    cached = [o["cached_tokens"] for o in ok if o.get("cached_tokens") is not None]
    agg, walls, total = [], [], 0
    for run in runs:
        good = [o for o in run if o and "error" not in o]
        if not good:
            continue
        wall = max(o["t_end"] for o in good) - min(o["t0"] for o in good)
        tokens = sum(o["tokens"] for o in good)
        total += tokens
        walls.append(wall)
        if wall > 0:
            agg.append(tokens / wall)

    def r3(x):
        return round(x, 3) if x is not None else None
    return {
        "concurrency": concurrency, "max_tokens": max_tokens, "runs": len(runs),
        "streams": len(streams), "errors": len(errs),
        "ttft_median_s": r3(percentile(ttft, 50)),
        "ttft_p50_s": r3(percentile(ttft, 50)),
        "ttft_p90_s": r3(percentile(ttft, 90)),
        "ttft_p99_s": r3(percentile(ttft, 99)),
        "stream_decode_tps_median": round(statistics.median(dec), 2) if dec else None,
        "aggregate_tps": round(statistics.median(agg), 2) if agg else None,
        "aggregate_tps_runs": [round(a, 2) for a in agg],
        "cached_tokens_median": statistics.median(cached) if cached else None,
        "completion_tokens": total, "wall_s": round(sum(walls), 2),
    }


def decompose(levels, max_tokens, target=4.0):
    """Where each level's aggregate goes, against one stream's. levels:
    {concurrency: summary} (summarize()'s dicts), with a level of 1.

    A stream of level c takes about ttft_c + (T - 1) * step_c, T = max_tokens
    and step_c = 1 / its median decode rate, and the c streams run together,
    so the aggregate is about c T / (ttft_c + (T - 1) step_c) ("model_tps",
    beside the measured one). It reaches target times one stream's measured
    aggregate a_1 when step_c <= (c T / (target a_1) - ttft_c) / (T - 1)
    ("step_ms_for_target"); None when the first tokens alone take longer
    than that whole budget (no step would do). Per level c != 1:
    {"ttft_s", "ttft_vs_1", "step_ms", "step_vs_1", "model_tps",
    "step_ms_for_target"}; {} when a level lacks the figures."""
    one = levels.get(1) or {}
    a1, t1, r1 = one.get("aggregate_tps"), one.get("ttft_p50_s"), \
        one.get("stream_decode_tps_median")
    T = max_tokens
    out = {}
    if not (a1 and t1 and r1) or T < 2:
        return out
    for c, x in sorted(levels.items()):
        tc, rc = x.get("ttft_p50_s"), x.get("stream_decode_tps_median")
        if c == 1 or not (tc and rc):
            continue
        step = 1.0 / rc
        budget = c * T / (target * a1) - tc
        out[str(c)] = {"ttft_s": tc, "ttft_vs_1": round(tc / t1, 2),
                       "step_ms": round(1e3 * step, 2), "step_vs_1": round(r1 / rc, 2),
                       "model_tps": round(c * T / (tc + (T - 1) * step), 1),
                       "step_ms_for_target": round(1e3 * budget / (T - 1), 2)
                       if budget > 0 else None}
    return out


def run_streams(url, concurrency, max_tokens, repeat=1, min_streams=0, pid=0):
    """One level: max(repeat, ceil(min_streams / concurrency)) runs of
    concurrency streams; with pid, the server's memory during and after."""
    u = urllib.parse.urlparse(url)
    n_runs = max(repeat, math.ceil(min_streams / concurrency))
    hwm_reset = reset_hwm(pid) if pid else None
    runs = [one_run(u.hostname, u.port, concurrency, max_tokens) for _ in range(n_runs)]
    res = summarize(concurrency, max_tokens, runs)
    if pid:
        st = proc_status(pid)
        res.update({"rss_kb": kb(st.get("VmRSS")), "hwm_kb": kb(st.get("VmHWM")),
                    "hwm_reset": hwm_reset})
    return res


def kb(v):
    """"123 kB" -> 123 (None stays None)."""
    return int(v.split()[0]) if v else None


def reset_hwm(pid):
    """Resets the process's peak RSS (VmHWM) to its current RSS (Linux:
    "5" into /proc/PID/clear_refs); False if not allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


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
    a.add_argument("--repeat", type=int, default=1, help="runs of each level at least")
    a.add_argument("--min-streams", type=int, default=0,
                   help="repeat a level until this many streams ran")
    a.add_argument("--pid", type=int, default=0, help="the server's pid: RSS per level")
    a.add_argument("--target", type=float, default=4.0,
                   help="the ratio to one stream the decomposition's step is for")
    b = sub.add_parser("sessions")
    b.add_argument("--url", default="http://127.0.0.1:8080")
    b.add_argument("--n", type=int, default=100)
    b.add_argument("--system", default="You are a terse assistant.")
    b.add_argument("--pid", type=int, default=0)
    args = ap.parse_args(argv)
    if args.cmd == "streams":
        levels = {}
        for c in (int(x) for x in args.concurrency.split(",")):
            res = run_streams(args.url, c, args.max_tokens, args.repeat, args.min_streams,
                              args.pid)
            levels[c] = res
            print(json.dumps(res), flush=True)
        agg = {c: x["aggregate_tps"] for c, x in levels.items()}
        if agg.get(1):
            print(json.dumps({"aggregate_vs_1": {str(c): round(a / agg[1], 2)
                                                 for c, a in agg.items() if a},
                              "target": args.target,
                              "decomposition": decompose(levels, args.max_tokens,
                                                         args.target)}), flush=True)
    else:
        print(json.dumps(run_sessions(args.url, args.n, args.system, args.pid)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
