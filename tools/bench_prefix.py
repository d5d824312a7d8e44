#!/usr/bin/env python3
"""Time to first token with and without the prefix-state cache, and the memory
one cached prefix takes (docs/PERFORMANCE.md "Prefix-state cache").

Starts `darkserve serve` on the given model (default attention unless --attn),
builds a system prompt of about --tokens tokens, and measures, interleaved,
  cold: a chat request whose system prompt was never seen (a distinct first
        sentence per run, so no cached prefix starts it): the whole prompt is
        prefilled;
  warm: the same request after the system prompt was cached (one priming
        request first): only the user turn is prefilled.
TTFT is the time from sending the request to the first streamed content
chunk, median of --runs each. Then it pins prefixes of about 500 and 2,000
tokens (POST /v1/prefixes) and prints the bytes each one's state takes.

  python3 tools/bench_prefix.py --bin build/darkserve \\
      --model models/SmolLM2-135M-Instruct.Q4_1.gguf [--attn exact] [--runs 5]
"""
import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import tempfile
import time

SENTENCES = [
    "The archive holds letters written by merchants who sailed between distant ports.",
    "Each letter records prices, weather, and the names of ships that never returned.",
    "Scholars read them to learn how trade shaped the growth of coastal towns.",
    "Some pages are damaged by water, and parts of their lines can no longer be read.",
    "The assistant answers questions about this archive briefly and precisely.",
]


def start(bin_path, model, attn, tmp):
    log = os.path.join(tmp, "server.log")
    cmd = [bin_path, "serve", "--port", "0", "--model", model, "--log-file", log,
           "--session-dir", os.path.join(tmp, "sessions")]
    if attn:
        cmd += ["--attn", attn]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port = None
    for _ in range(600):
        if os.path.exists(log):
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(log).read())
            if m:
                port = int(m.group(1))
            if port and "ready" in open(log).read():
                return proc, port
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"server did not start:\n{open(log).read() if os.path.exists(log) else ''}")


def call(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request(method, path, body=json.dumps(body) if body is not None else None,
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data) if data else None


def n_tokens(port, text):
    st, r = call(port, "POST", "/tokenize", {"content": text})
    assert st == 200, r
    return len(r["tokens"])


def document(port, target, head=""):
    """head + sentences until the text has about `target` tokens."""
    parts, i = [head] if head else [], 0
    while True:
        parts.append(SENTENCES[i % len(SENTENCES)])
        i += 1
        if i % 10 == 0 and n_tokens(port, " ".join(parts)) >= target:
            return " ".join(parts)


def ttft(port, system, user="What do the letters record?"):
    """-> (seconds to the first content chunk, usage of the request)."""
    body = {"messages": [{"role": "system", "content": system},
                         {"role": "user", "content": user}],
            "max_tokens": 4, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body=json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    first, usage = None, None
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: {"):
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev.get("choices", []):
            if first is None and ch.get("delta", {}).get("content"):
                first = time.perf_counter() - t0
    c.close()
    return first, usage


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="build/darkserve")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--attn", default=None, help="--attn of the server (default: its own)")
    ap.add_argument("--tokens", type=int, default=2000, help="system prompt length")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start(a.bin, a.model, a.attn, tmp)
        try:
            warm_sys = document(port, a.tokens)
            ttft(port, warm_sys)  # primes the cache with the system prompt
            cold, warm = [], []
            for i in range(a.runs):
                cold_sys = document(port, a.tokens, head=f"Archive volume {i + 1000}.")
                t, u = ttft(port, cold_sys)
                assert u["prompt_tokens_details"]["cached_tokens"] == 0, u
                cold.append(t)
                t, u = ttft(port, warm_sys)
                assert u["prompt_tokens_details"]["cached_tokens"] > 0, u
                warm.append(t)
                prompt = u["prompt_tokens"]
                cached = u["prompt_tokens_details"]["cached_tokens"]
            mc, mw = statistics.median(cold), statistics.median(warm)
            print(f"prompt {prompt} tokens, {cached} from the cache when warm")
            print("cold ttft s: " + " ".join(f"{x:.3f}" for x in cold) + f"  median {mc:.3f}")
            print("warm ttft s: " + " ".join(f"{x:.3f}" for x in warm) + f"  median {mw:.3f}")
            print(f"speedup (median): {mc / mw:.1f}x")
            for size in (500, 2000):
                text = document(port, size, head=f"Pinned document of {size}.")
                st, p = call(port, "POST", "/v1/prefixes", {"text": text})
                if st not in (200, 201):
                    print(f"pin of ~{size} tokens: {st} {p}")
                    continue
                print(f"pinned prefix of {p['tokens']} tokens: {p['bytes']} bytes "
                      f"({p['bytes'] / 2**20:.2f} MiB)")
        finally:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
