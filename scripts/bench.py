#!/usr/bin/env python3
"""make bench: darkserve's benchmark of record (the speed and memory targets).

  scripts/bench.py [--build DIR] [--model M.gguf | NAME] [--adapter A.gguf] [--out FILE]
                   [--isa generic|avx2|avx512vnni] [--peer]

--model (make bench MODEL=...): a GGUF path, or the short name of a model
darkserve knows, as `make run` takes them (smollm2-135m, the default;
gemma3-270m): models/<its file>, which make model / make gemma-model fetch.
  BENCH_QUICK=1 scripts/bench.py ...   (or --quick)
  PEER=1 scripts/bench.py ...          (or --peer)

--isa (make bench ISA=...) runs every step on that kernel path
(DARKSERVE_ISA in the environment of every program it starts): an AVX-512
host measures the AVX2 path so. Refused, before anything runs, where this CPU
lacks the path. The report names the path that ran and whether it was forced.

One run measures, on the machine it runs on and in the same minutes:

1. the machine: CPU, cores, the kernels chosen (quantized dot products, OpenBLAS
   core type, the probe's read loop), last-level cache, load average at the
   start and at the end, the commit (and the uncommitted files compiled in);
2. memory bandwidth (build/tools/bench_bw: read on 1 thread and on every usable
   CPU, copy for comparison) and the weight bytes a decode token reads (from the
   model file); the decode bound = those bytes / the all-CPU read bandwidth;
3. single stream: prefill tokens/s on a 512-token prompt (`darkserve generate`,
   exact and default attention alternating, median of 5), decode tokens/s at
   contexts 512 / 4K / 16K / 64K (build/tools/bench_decode; exact attention up
   to 16K, the default configuration -- DARKFormer v2 with the adapter beside
   the model, what `--attn auto` picks -- at all four), each the median of 5
   runs alternating over the contexts in one process, with its ratio to the
   bound; and the ratio side by side: SIDE_ROUNDS rounds, each a bandwidth
   probe right before a decode of the default configuration at 1K, the
   ratio taken per round and its median reported (separate runs of the probe
   and the decode can land minutes apart on a host whose speed moves 2x);
4. HTTP: `darkserve serve` (default model and configuration) on a free loopback
   port, tests/integration/loadgen.py streams at 1, 4, 16 and 64 concurrent
   streams of 64 tokens (time to first token p50 / p99, aggregate tokens/s, the
   16-stream aggregate over the 1-stream one), and the server's RSS idle after
   loading, peak during the 16-stream level and idle after the load;
5. the same with `--prompt-precision int8` (prompt rows in 8 bits, not the
   default; docs/PERFORMANCE.md): prefill in the alternation of 3., and a
   second server at 1 and 16 streams with its 16 ÷ 1 ratio;
6. with --peer (make bench PEER=1), llama.cpp in the same run on the same
   GGUF and threads (scripts/bench_peer.py says how it is fetched, built for
   the kernel path measured -- AVX2 only for --isa avx2 -- and cached under
   BUILD/peer): llama-bench pp512 and tg128 at depths 0 and 512 right after
   darkserve's decode, llama-server with 16 slots under the same loadgen
   levels 1 and 16 right after darkserve's streams; the report puts them
   side by side with the ratios of the goals against llama.cpp. A peer that
   cannot be fetched or built stops the run before anything is measured.

The decode of the default configuration also runs at context 0 (an empty
context, beside llama-bench's tg128 at depth 0).

It prints a table on stdout and writes a markdown block (the same figures and
the speed and memory targets, met or not) to build/bench/report.md, to paste into
docs/PERFORMANCE.md. Progress goes to stderr. BENCH_QUICK=1 skips the 16K and
64K contexts and the 64-stream level (a few minutes instead of ~15).

The figures are medians; a machine shared with other work gives lower and
wider ones: the load averages printed with them say how busy it was. Exit
status 1 if a step failed (the others still run and are reported).
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_peer  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PREFILL_TOKENS = 512
PREFILL_RUNS = 5
DECODE_TOKENS, DECODE_RUNS = 32, 5
# exact attention at 16K reads a 0.75 GB KV cache per token (~2 tokens/s on the
# 2-core machine): fewer tokens per run there
EXACT_LONG_TOKENS = 8
MAX_TOKENS = 64
SIDE_ROUNDS, SIDE_CTX = 5, 1024  # rounds of probe + decode for the side-by-side ratio


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, env=None, timeout=3600):
    """-> (returncode, stdout, stderr) of cmd (text)."""
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def median(xs):
    return statistics.median(xs) if xs else None


# ---------------------------------------------------------------- machine
def machine(bin_path):
    cpu = re.search(r"^model name\s*:\s*(.+)$", read("/proc/cpuinfo"), re.M)
    mem = re.search(r"^MemTotal:\s*(\d+) kB", read("/proc/meminfo"), re.M)
    rc, out, _ = run([bin_path, "version"])
    coretype = re.search(r"^openblas: (\S+)", out, re.M) if rc == 0 else None
    version = out.splitlines()[0] if rc == 0 and out else "?"
    rc, commit, _ = run(["git", "rev-parse", "--short", "HEAD"])
    rc2, dirty, _ = run(["git", "status", "--porcelain", "--untracked-files=no"])
    dirty = [l[3:] for l in dirty.splitlines()] if rc2 == 0 else []
    return {
        "cpu": cpu.group(1).strip() if cpu else platform.processor() or "?",
        "online": os.cpu_count(),
        "usable": len(os.sched_getaffinity(0)),
        "mem_gib": int(mem.group(1)) / 2**20 if mem else None,
        "openblas": coretype.group(1) if coretype else "?",
        "version": version,
        "kernel": platform.release(),
        "commit": commit.strip() if rc == 0 else "?",
        "dirty": dirty,
        "isa_forced": os.environ.get("DARKSERVE_ISA") or None,
    }


def tool_env(m):
    """The tools are not darkserve: they do not re-execute themselves with the
    OpenBLAS core type it picks, so give it to them (as make test does)."""
    env = dict(os.environ)
    if m["openblas"] != "?" and "OPENBLAS_CORETYPE" not in env:
        env["OPENBLAS_CORETYPE"] = m["openblas"]
    return env


# ---------------------------------------------------------------- bandwidth
RE_BW = re.compile(r"^(read|copy) (\d+) threads?(.*?): median ([\d.]+) GB/s "
                   r"\(min ([\d.]+), max ([\d.]+)\)", re.M)


def parse_bench_bw(out):
    """bench_bw's output -> dict (see tools/bench_bw.c for the lines)."""
    r = {"rows": []}
    head = re.search(r"^bench_bw: buffer (\d+) MiB \(last-level cache (\d+) MiB\), (\d+) "
                     r"passes, read kernel (\S+), qdot kernels (\S+);", out, re.M)
    if head:
        r.update(buffer_mib=int(head.group(1)), llc_mib=int(head.group(2)),
                 passes=int(head.group(3)), read_kernel=head.group(4), qdot=head.group(5))
    for m in RE_BW.finditer(out):
        r["rows"].append({"op": m.group(1), "threads": int(m.group(2)),
                          "note": m.group(3).strip(), "gbs": float(m.group(4)),
                          "min": float(m.group(5)), "max": float(m.group(6))})
    w = re.search(r"^weights per decode token: (\d+) bytes \((.*)\)$", out, re.M)
    if w:
        r["weight_bytes"], r["weight_detail"] = int(w.group(1)), w.group(2)
    return r


def bandwidth(build, model, env, extra=()):
    rc, out, err = run([os.path.join(build, "tools", "bench_bw"), "--model", model] + list(extra),
                       env=env)
    if rc != 0:
        raise RuntimeError(f"bench_bw failed ({rc}): {err.strip()}")
    r = parse_bench_bw(out)
    big = [x for x in r["rows"] if x["op"] == "read" and not x["note"]]
    if not big or "weight_bytes" not in r:
        raise RuntimeError(f"bench_bw: unexpected output:\n{out}")
    r["read_all"] = max(big, key=lambda x: x["threads"])
    r["bound_tps"] = r["read_all"]["gbs"] * 1e9 / r["weight_bytes"]
    return r


# ---------------------------------------------------------------- prefill
def n_tokens(bin_path, model, text):
    rc, out, err = run([bin_path, "tokenize", "--model", model, "--ids", text])
    if rc != 0:
        raise RuntimeError(f"tokenize failed: {err.strip()}")
    return len(out.split())


def prompt_of(bin_path, model, n):
    """The shortest prefix of tests/data/heldout.txt of n tokens (or, where a
    merge skips n, of the nearest count below it) -> (text, tokens)."""
    text = read(os.path.join(ROOT, "tests", "data", "heldout.txt"))
    lo, hi = 1, len(text)
    if n_tokens(bin_path, model, text) < n:
        raise RuntimeError(f"tests/data/heldout.txt has fewer than {n} tokens")
    while lo < hi:  # smallest length with >= n tokens
        mid = (lo + hi) // 2
        if n_tokens(bin_path, model, text[:mid]) >= n:
            hi = mid
        else:
            lo = mid + 1
    for cut in range(lo, max(lo - 8, 0), -1):
        k = n_tokens(bin_path, model, text[:cut])
        if k <= n:
            return text[:cut], k
    return text[:lo], n_tokens(bin_path, model, text[:lo])


RE_PREFILL = re.compile(r"^prompt: (\d+) tokens in [\d.]+ s \(([\d.]+) tokens/s\)", re.M)


def prefill(bin_path, model):
    prompt, k = prompt_of(bin_path, model, PREFILL_TOKENS)
    res = {"tokens": k, "exact": [], "auto": [], "int8": []}
    for _ in range(PREFILL_RUNS):
        # alternating: the load falls on all alike; "int8": the default
        # attention with --prompt-precision int8
        for name in ("exact", "auto", "int8"):
            extra = (["--attn", "auto", "--prompt-precision", "int8"] if name == "int8"
                     else ["--attn", name])
            rc, _, err = run([bin_path, "generate", "--model", model] + extra +
                             ["--temperature", "0", "--max-tokens", "1", "--prompt", prompt])
            m = RE_PREFILL.search(err)
            if rc != 0 or not m:
                raise RuntimeError(f"generate {' '.join(extra)} failed ({rc}): "
                                   f"{err.strip()[-400:]}")
            res[name].append(float(m.group(2)))
    return res


# ---------------------------------------------------------------- decode
RE_DECODE = re.compile(r"^attn (\S+) .*? ctx (\d+) threads (\d+) isa (\S+): state (\d+) bytes; "
                       r"fill ([\d.]+) s; decode tokens/s:([\d. ]+); median ([\d.]+)$", re.M)


def decode(build, model, env, attn, ctxs, tokens, adapter=None):
    """One bench_decode process over ctxs -> list of per-context dicts."""
    cmd = [os.path.join(build, "tools", "bench_decode"), "--model", model, "--attn", attn,
           "--ctx", ",".join(str(c) for c in ctxs), "--tokens", str(tokens),
           "--runs", str(DECODE_RUNS)]
    if adapter:
        cmd += ["--adapter", adapter]
    t0 = time.monotonic()
    rc, out, err = run(cmd, env=env)
    if rc != 0:
        raise RuntimeError(f"{' '.join(cmd[1:])}: failed ({rc}): {err.strip()}")
    rows = [{"attn": m.group(1), "ctx": int(m.group(2)), "threads": int(m.group(3)),
             "isa": m.group(4), "state_bytes": int(m.group(5)), "fill_s": float(m.group(6)),
             "runs": [float(x) for x in m.group(7).split()], "median": float(m.group(8)),
             "tokens": tokens} for m in RE_DECODE.finditer(out)]
    if len(rows) != len(ctxs):
        raise RuntimeError(f"bench_decode: unexpected output:\n{out}")
    log(f"  decode {attn} {ctxs}: {time.monotonic() - t0:.0f} s")
    return rows


def side_by_side(build, model, env, adapter):
    """SIDE_ROUNDS rounds of (bandwidth probe, default decode at SIDE_CTX), each
    round's decode over its own probe's bound -> dict with the rounds."""
    rounds = []
    for _ in range(SIDE_ROUNDS):
        bw = bandwidth(build, model, env, ["--passes", "5"])
        d = decode(build, model, env, "darkformer", [SIDE_CTX], DECODE_TOKENS, adapter)[0]
        rounds.append({"gbs": bw["read_all"]["gbs"], "bound_tps": bw["bound_tps"],
                       "decode_tps": d["median"], "ratio": d["median"] / bw["bound_tps"]})
    return {"ctx": SIDE_CTX, "rounds": rounds,
            "ratio": median([x["ratio"] for x in rounds])}


# ---------------------------------------------------------------- HTTP
def proc_kb(pid, key):
    m = re.search(rf"^{key}:\s*(\d+) kB", read(f"/proc/{pid}/status"), re.M)
    return int(m.group(1)) if m else None


def loadgen_levels(python, url, pid, batches):
    """tests/integration/loadgen.py streams against url, one call per
    (levels, extra args) of batches -> (level summaries, decompositions)."""
    loadgen = os.path.join(ROOT, "tests", "integration", "loadgen.py")
    levels, decomposition = [], None
    for lv, extra in batches:
        cmd = [python, loadgen, "streams", "--url", url, "--concurrency", lv,
               "--max-tokens", str(MAX_TOKENS), "--pid", str(pid)] + extra
        t0 = time.monotonic()
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
        if p.returncode != 0:
            raise RuntimeError(f"loadgen failed ({p.returncode}): {p.stderr.strip()}")
        for line in p.stdout.splitlines():
            obj = json.loads(line)
            if "concurrency" in obj:
                levels.append(obj)
            elif obj.get("decomposition"):
                decomposition = obj["decomposition"]
        log(f"  streams {lv}: {time.monotonic() - t0:.0f} s")
    return levels, decomposition


# 1-16 streams: at least 16 streams and 3 runs per level (TTFT percentiles over
# >= 16 values, aggregate the median of >= 3 runs)
LEVEL_ARGS = ["--repeat", "3", "--min-streams", "16"]


def http_streams(build, bin_path, model, quick, python, args=(), levels_only=None):
    """serve with args; loadgen at 1, 4, 16 (and 64 unless quick), or at
    levels_only (a "1,16" string) alone."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
    os.environ["DARKSERVE_BIN"] = bin_path
    from ds_server import Server  # noqa: E402  (reads DARKSERVE_BIN at import)
    tmp = os.path.join(build, "bench", "serve")
    shutil.rmtree(tmp, ignore_errors=True)  # last run's log and session directory
    # attn None: no --attn flag, the default configuration (auto)
    srv = Server(tmp, model=model, attn=None, name="bench", args=list(args))
    res = {"levels": [], "port": srv.port}
    try:
        pid = srv.proc.pid
        time.sleep(2)
        res["rss_idle_kb"] = proc_kb(pid, "VmRSS")
        res["hwm_start_kb"] = proc_kb(pid, "VmHWM")
        # 64 streams once (64 TTFTs; it is past the batch of 16 and long)
        batches = [(levels_only or "1,4,16", LEVEL_ARGS)]
        if not quick and not levels_only:
            batches.append(("64", ["--repeat", "1"]))
        res["levels"], dec = loadgen_levels(python, srv.url(), pid, batches)
        if dec:
            res["decomposition"] = dec
        time.sleep(2)
        res["rss_after_kb"] = proc_kb(pid, "VmRSS")
        try:  # the prefix cache's share of that (it holds states of past prompts)
            mt = srv.metrics()
            res["prefix_cache_bytes"] = mt.get("darkserve_prefix_cache_bytes")
            res["prefix_cache_entries"] = mt.get("darkserve_prefix_cache_entries")
        except (AssertionError, OSError):
            pass
        res["server_alive"] = srv.proc.poll() is None
    finally:
        res["stop_rc"] = srv.stop(signal.SIGTERM, timeout=60)
    return res


# ---------------------------------------------------------------- llama.cpp
def peer_http(build, tools, model, threads, python):
    """llama-server with bench_peer.SERVER_SLOTS slots under loadgen at 1 and
    16 streams (the levels and runs of darkserve's own) -> dict like
    http_streams'."""
    srv = bench_peer.PeerServer(tools, model, threads,
                                os.path.join(build, "bench", "llama-server.log"))
    res = {}
    try:
        time.sleep(2)
        res["rss_idle_kb"] = proc_kb(srv.proc.pid, "VmRSS")
        res["levels"], _ = loadgen_levels(python, srv.url(), srv.proc.pid,
                                          [("1,16", LEVEL_ARGS)])
        res["server_alive"] = srv.proc.poll() is None
    finally:
        res["stop_rc"] = srv.stop()
    return res


# ---------------------------------------------------------------- report
def fmt(x, nd=1):
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def pct(q):
    """0.456 -> "46%", 0.0046 -> "0.5%"."""
    return f"{100 * q:.0f}%" if q >= 0.1 else f"{100 * q:.1f}%"


def table(header, rows, markdown):
    """Rows of strings -> lines: a markdown table, or columns padded with
    spaces for a terminal."""
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return out + ["| " + " | ".join(r) + " |" for r in rows]
    w = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = lambda r: "  ".join(str(c).ljust(n) for c, n in zip(r, w)).rstrip()  # noqa: E731
    return [line(header), line(["-" * n for n in w])] + [line(r) for r in rows]


def ctx_name(c):
    return f"{c // 1024}K" if c >= 1024 and c % 1024 == 0 else str(c)


def decomposition_line(d, one):
    """loadgen's decomposition of the 16-stream level (d) as a sentence;
    one: the 1-stream level's summary."""
    need = d.get("step_ms_for_target")
    return (f"Where 16 streams' time goes (loadgen.py's decomposition): the first tokens "
            f"after {d['ttft_s']:.2f} s, {d['ttft_vs_1']:.1f}× one stream's "
            f"{one['ttft_p50_s']:.3f} s (the prompts are prefilled together, and one "
            f"stream's prompt already keeps the cores busy), then a decode step every "
            f"{d['step_ms']:.1f} ms, {d['step_vs_1']:.1f}× one stream's; TTFT + "
            f"{MAX_TOKENS - 1} steps predict {d['model_tps']:.0f} tokens/s. 4× one stream "
            + (f"would need a step of at most {need:.1f} ms with those first tokens."
               if need is not None else
               "cannot be had with those first tokens, whatever the step."))


def goals(r):
    """The speed and memory targets -> rows (goal, target, measured, verdict)."""
    out = []
    bw, dec = r.get("bw"), r.get("decode") or []
    dflt = [d for d in dec if d["attn"] != "exact"]
    side = r.get("side")
    if side:
        q = side["ratio"]
        out.append((f"1. single-stream decode, default configuration at "
                    f"{ctx_name(side['ctx'])}, side by side with the probe",
                    "≥ 50% of the bound",
                    f"{100 * q:.0f}% (median of {len(side['rounds'])} rounds: " +
                    ", ".join(f"{100 * x['ratio']:.0f}%" for x in side["rounds"]) + ")",
                    "met" if q >= 0.5 else "not met"))
    if bw and dflt:
        ratios = [d["median"] / bw["bound_tps"] for d in dflt]
        out.append(("1. single-stream decode, default configuration", "≥ 50% of the bound",
                    ", ".join(f"{ctx_name(d['ctx'])} {100 * q:.0f}%" for d, q in zip(dflt, ratios)),
                    "met" if min(ratios) >= 0.5 else "not met"))
    else:
        out.append(("1. single-stream decode", "≥ 50% of the bound", "not measured", "—"))
    pre = r.get("prefill")
    if pre:
        p = median(pre["auto"])
        out.append((f"2. prefill, {pre['tokens']}-token prompt, default configuration",
                    "≥ 400 tokens/s", f"{p:.0f} tokens/s", "met" if p >= 400 else "not met"))
    else:
        out.append(("2. prefill", "≥ 400 tokens/s", "not measured", "—"))
    http = r.get("http")
    lv = {x["concurrency"]: x for x in (http or {}).get("levels", [])}
    if 1 in lv and 16 in lv and lv[1]["aggregate_tps"] and lv[16]["aggregate_tps"]:
        q = lv[16]["aggregate_tps"] / lv[1]["aggregate_tps"]
        out.append(("3. 16 HTTP streams, aggregate", "≥ 4× one stream", f"{q:.2f}×",
                    "met" if q >= 4 else "not met"))
    else:
        out.append(("3. 16 HTTP streams", "≥ 4× one stream", "not measured", "—"))
    lv8 = {x["concurrency"]: x for x in (r.get("http_int8") or {}).get("levels", [])}
    if 1 in lv8 and 16 in lv8 and lv8[1]["aggregate_tps"] and lv8[16]["aggregate_tps"]:
        q = lv8[16]["aggregate_tps"] / lv8[1]["aggregate_tps"]
        out.append(("3. the same, `--prompt-precision int8` (not the default)",
                    "≥ 4× one stream", f"{q:.2f}×", "met" if q >= 4 else "not met"))
    if http and http.get("rss_idle_kb") and 16 in lv and lv[16].get("hwm_kb"):
        idle, peak = http["rss_idle_kb"] * 1024 / 1e6, lv[16]["hwm_kb"] * 1024 / 1e6
        out.append(("4. `serve` RSS (MB = 10⁶ bytes)", "idle ≤ 250 MB, 16 streams ≤ 400 MB",
                    f"idle {idle:.0f} MB, 16 streams {peak:.0f} MB",
                    "met" if idle <= 250 and peak <= 400 else "not met"))
    else:
        out.append(("4. `serve` RSS", "≤ 250 / ≤ 400 MB", "not measured", "—"))
    return out


def _dflt_decode(r, ctx):
    return next((d["median"] for d in r.get("decode") or []
                 if d["attn"] != "exact" and d["ctx"] == ctx), None)


def _level(http, c):
    return next((x.get("aggregate_tps") for x in (http or {}).get("levels", [])
                 if x["concurrency"] == c), None)


def peer_rows(r):
    """darkserve beside llama.cpp, the figures the goals against it compare ->
    rows (measure, darkserve, llama.cpp, darkserve ÷ llama.cpp); [] without
    the peer's figures."""
    peer = r.get("peer") or {}
    pb, ph = peer.get("bench") or {}, peer.get("http") or {}
    pre = r.get("prefill") or {}
    g, p = bench_peer.BENCH_GEN, bench_peer.BENCH_PROMPT
    rows = []

    def row(name, ours, theirs):
        if ours is not None or theirs is not None:
            rows.append([name, fmt(ours), fmt(theirs),
                         f"{ours / theirs:.2f}×" if ours and theirs else "—"])
    for depth in bench_peer.BENCH_DEPTHS:
        t = pb.get(f"tg{g}@{depth}")
        row(f"decode at {'an empty context' if depth == 0 else f'{depth} tokens of context'} "
            f"(darkserve: bench_decode, default; llama.cpp: llama-bench tg{g} -d {depth})",
            _dflt_decode(r, depth), t["tps"] if t else None)
    t = pb.get(f"pp{p}@0")
    row(f"prefill, {p}-token prompt (darkserve: generate, default; llama.cpp: llama-bench "
        f"pp{p})", median(pre["auto"]) if pre.get("auto") else None, t["tps"] if t else None)
    row("prefill, the same, exact attention", median(pre["exact"]) if pre.get("exact") else None,
        t["tps"] if t else None)
    for c in (1, 16):
        row(f"HTTP, {c} stream{'s' if c > 1 else ''}, aggregate (loadgen; llama-server "
            f"-np {bench_peer.SERVER_SLOTS})", _level(r.get("http"), c), _level(ph, c))
    return rows if peer else []


# prefill against llama.cpp's pp512: SmolLM2's goal is 1.2x, Gemma 3 270M's
# the same speed (docs/PERFORMANCE.md states both)
PEER_PREFILL_GOAL = {"gemma-3-270m-q4_k_m.gguf": 1.0}


def peer_goals(r):
    """The goals of darkserve against llama.cpp and of its own paths against
    each other (same run, same GGUF) -> rows (goal, target, measured, verdict)."""
    peer = r.get("peer") or {}
    pb, ph = peer.get("bench") or {}, peer.get("http") or {}
    pre = r.get("prefill") or {}
    out = []

    def ratio(name, target, ours, theirs, what):
        if ours and theirs:
            q = ours / theirs
            out.append((name, f"≥ {target:.1f}× {what}", f"{q:.2f}× ({ours:.1f} ÷ {theirs:.1f})",
                        "met" if q >= target else "not met"))
        else:
            out.append((name, f"≥ {target:.1f}× {what}",
                        "not measured" + (" (PEER=1)" if "llama" in what and not peer
                                          else ""), "—"))
    g, p = bench_peer.BENCH_GEN, bench_peer.BENCH_PROMPT
    t0, t512, pp = pb.get(f"tg{g}@0"), pb.get(f"tg{g}@512"), pb.get(f"pp{p}@0")
    ratio("decode, default, empty context", 1.0, _dflt_decode(r, 0), t0 and t0["tps"],
          f"llama.cpp's tg{g}")
    ratio("decode, default, 512 tokens of context", 1.2, _dflt_decode(r, 512),
          t512 and t512["tps"], f"llama.cpp's tg{g} at depth 512")
    model = os.path.basename(r.get("model") or "")
    ratio(f"prefill, {p}-token prompt, default", PEER_PREFILL_GOAL.get(model, 1.2),
          median(pre["auto"]) if pre.get("auto") else None, pp and pp["tps"],
          f"llama.cpp's pp{p}")
    ratio("prefill, default against exact attention", 1.0,
          median(pre["auto"]) if pre.get("auto") else None,
          median(pre["exact"]) if pre.get("exact") else None, "exact's")
    ratio("16 HTTP streams, aggregate", 2.0, _level(r.get("http"), 16), _level(ph, 16),
          f"llama-server's with {bench_peer.SERVER_SLOTS} slots")
    ratio("16 HTTP streams against one", 3.0, _level(r.get("http"), 16),
          _level(r.get("http"), 1), "darkserve's one stream")
    return out


def peer_section(r, md):
    """The report's lines on llama.cpp beside darkserve."""
    b = (lambda s: f"**{s}**") if md else (lambda s: s)
    peer, L = r.get("peer"), []
    L.append(b("Side by side with llama.cpp") + (" (make bench PEER=1)" if md else ""))
    L.append("")
    if peer:
        pb = peer.get("bench") or {}
        one = next(iter(pb.values()), {})
        L.append(f"llama.cpp {bench_peer.PEER_VERSION} (PyPI sdist {bench_peer.PEER_PACKAGE}, "
                 f"build commit {one.get('commit', '?')}), flavor {b(peer['flavor'])} "
                 f"(cmake {' '.join(peer['cmake'])}), "
                 f"{'built in this run' if peer.get('built') else 'reused from an earlier run'}, "
                 f"run with " + " ".join(f"{k}={v}" for k, v in bench_peer.PEER_ENV.items()) +
                 " (scripts/bench_peer.py says why); "
                 f"llama-bench on {one.get('cpu', '?')} with {one.get('threads', '?')} threads, "
                 f"{bench_peer.BENCH_REPS} repetitions a test (its mean; runs: " +
                 "; ".join(f"{k} " + ", ".join(f"{x:.1f}" for x in v["samples"])
                           for k, v in pb.items()) + ").")
        L.append("")
        rows = peer_rows(r)
        if rows:
            L += table(["measure", "darkserve", "llama.cpp", "darkserve ÷ llama.cpp"], rows, md)
            L.append("")
        for k in ("peer_bench", "peer_http"):
            if r["errors"].get(k):
                L.append(f"{k.replace('_', ' ')} failed: {r['errors'][k]}")
                L.append("")
    else:
        L.append("not run (make bench PEER=1 runs it)")
        L.append("")
    L.append(b("Goals against llama.cpp and between darkserve's paths") +
             " (same run, same GGUF)")
    L.append("")
    L += table(["goal", "target", "measured", ""], [list(x) for x in peer_goals(r)], md)
    L.append("")
    return L


def render(r, markdown):
    m, L = r["machine"], []
    md = markdown
    b = (lambda s: f"**{s}**") if md else (lambda s: s)
    start, end = r["load_start"], r.get("load_end") or (None, None, None)
    dirty = m["dirty"]
    tree = m["commit"] + (f" with {len(dirty)} uncommitted file(s) compiled in "
                          f"({', '.join(dirty[:8])}{', …' if len(dirty) > 8 else ''})"
                          if dirty else " (clean tree)")
    bw = r.get("bw") or {}
    if md:
        L.append(f"## `make bench` on {m['commit']} ({r['date']})")
        L.append("")
    else:
        L.append(f"make bench — {r['date']}, commit {tree}")
    L.append(f"Machine: {m['cpu']}, {m['online']} online CPUs ({m['usable']} usable), "
             f"{fmt(m['mem_gib'])} GiB, Linux {m['kernel']}; last-level cache "
             f"{fmt(bw.get('llc_mib'))} MiB; kernels chosen: quantized dot products "
             f"{bw.get('qdot', '?')}"
             f"{' (batches of 8+ rows on Intel AMX tiles)' if bw.get('qdot', '').endswith('+amx') else ''}"
             f"{' (forced: DARKSERVE_ISA=' + m['isa_forced'] + ')' if m.get('isa_forced') else ''}"
             f", OpenBLAS {m['openblas']}, bandwidth probe "
             f"{bw.get('read_kernel', '?')}. Load average (1/5/15 min) at the start "
             f"{' / '.join(f'{x:.2f}' for x in start)}, at the end "
             f"{' / '.join(fmt(x, 2) for x in end)}. " +
             (f"Tree: {tree}. " if md else "") +
             f"{m['version']}; {'quick run (BENCH_QUICK=1)' if r['quick'] else 'full run'}, "
             f"wall time {r.get('wall_s', 0) / 60:.1f} min.")
    if r.get("model"):
        ad = r.get("adapter")
        L.append("")
        L.append(f"Model: {r['model']}; default attention: "
                 + (f"DARKFormer v2 with {ad}" if ad else "no adapter found (exact only)") + ".")
    L.append("")

    L.append(b("Memory bandwidth") + (" (build/tools/bench_bw)" if md else ""))
    if bw.get("rows"):
        rows = []
        for x in bw["rows"]:
            what = {"read": "read", "copy": "copy (read + write bytes counted)"}[x["op"]]
            size = x["note"].replace("at ", "").strip() or f"{bw['buffer_mib']} MiB"
            rows.append([what, str(x["threads"]), size, fmt(x["gbs"], 2),
                         f"{x['min']:.2f}–{x['max']:.2f}"])
        L.append("")
        L += table(["", "threads", "buffer", f"GB/s, median of {bw['passes']}", "min–max"],
                   rows, md)
        L.append("")
        L.append(f"Weights read per decode token: {bw['weight_bytes']:,} bytes "
                 f"({bw['weight_detail']}). Decode bound = "
                 f"{bw['read_all']['gbs']:.2f} GB/s ({bw['read_all']['threads']}-thread read, "
                 f"{bw['buffer_mib']} MiB) ÷ {bw['weight_bytes'] / 1e6:.1f} MB = "
                 + b(f"{bw['bound_tps']:.0f} tokens/s") + ".")
    else:
        L.append(f"not measured: {r['errors'].get('bw', '?')}")
    L.append("")

    L.append(b("Single stream"))
    L.append("")
    pre = r.get("prefill")
    if pre:
        names = [k for k in ("exact", "auto", "int8") if pre.get(k)]
        runs = {k: ", ".join(f"{x:.1f}" for x in pre[k]) for k in names}
        meds = {k: b(f"{median(pre[k]):.1f}") for k in names}
        label = {"exact": "exact", "auto": "default", "int8": "default with --prompt-precision int8"}
        L.append(f"Prefill, a {pre['tokens']}-token prompt (`darkserve generate --max-tokens 1`, "
                 f"{', '.join(label[k] for k in names)} alternating, median of "
                 f"{len(pre['exact'])}), tokens/s: " +
                 "; ".join(f"{label[k]} {meds[k]} ({runs[k]})" for k in names) + ".")
    else:
        L.append(f"Prefill not measured: {r['errors'].get('prefill', '?')}")
    L.append("")
    dec = r.get("decode") or []
    if dec:
        bound = bw.get("bound_tps")
        wb = bw.get("weight_bytes")
        rows = []
        for d in dec:
            name = "exact" if d["attn"] == "exact" else "default (DARKFormer v2 + adapter)"
            q1 = pct(d["median"] / bound) if bound else "—"
            q2 = (pct(d["median"] / (bw["read_all"]["gbs"] * 1e9 / (wb + d["state_bytes"])))
                  if bound else "—")
            rows.append([ctx_name(d["ctx"]), name, b(f"{d['median']:.1f}"),
                         ", ".join(f"{x:.1f}" for x in d["runs"]), str(d["tokens"]),
                         f"{d['state_bytes'] / 1e6:.1f}", q1, q2])
        L.append(f"Decode (build/tools/bench_decode, {dec[0]['threads']} threads, "
                 f"{DECODE_RUNS} runs per context alternating over the contexts of one "
                 f"process; synthetic context, real decode steps):")
        L.append("")
        L += table(["context", "attention", "tokens/s, median", "runs", "tokens/run",
                    "state MB", "of the bound", "of the bound with the state"], rows, md)
        L.append("")
        L.append("\"of the bound\": median ÷ (read bandwidth ÷ weight bytes), the targets' "
                 "measure; \"with the state\": the bytes of the whole attention state "
                 "(core_attn_state_bytes) added to those a token reads, an upper estimate.")
        L.append(r["skipped_note"])
    side = r.get("side")
    if side:
        L.append("")
        L.append(f"Side by side ({len(side['rounds'])} rounds, each a bandwidth probe right "
                 f"before a default-configuration decode at {ctx_name(side['ctx'])}; "
                 f"decode ÷ that round's bound): " +
                 "; ".join(f"{x['decode_tps']:.1f} / {x['bound_tps']:.0f} = "
                           f"{100 * x['ratio']:.0f}%" for x in side["rounds"]) +
                 f"; median " + b(f"{100 * side['ratio']:.0f}%") + ".")
    elif r["errors"].get("side"):
        L.append(f"Side by side not measured: {r['errors']['side']}")
    if r["errors"].get("decode"):
        L.append(f"Decode errors: {r['errors']['decode']}")
    L.append("")

    L.append(b("HTTP streams") + (" (tests/integration/loadgen.py against `darkserve serve`, "
                                   "default model and configuration)" if md else ""))
    L.append("")
    http = r.get("http")
    if http and http.get("levels"):
        rows = []
        for x in http["levels"]:
            rows.append([str(x["concurrency"]), f"{x['runs']} ({x['streams']} streams)",
                         fmt(x["ttft_p50_s"], 2), fmt(x["ttft_p99_s"], 2),
                         fmt(x["stream_decode_tps_median"]),
                         b(fmt(x["aggregate_tps"])),
                         (f"{min(x['aggregate_tps_runs']):.1f}–{max(x['aggregate_tps_runs']):.1f}"
                          if x["aggregate_tps_runs"] else "—"),
                         fmt(x.get("cached_tokens_median"), 0),
                         fmt(x["hwm_kb"] * 1024 / 1e6 if x.get("hwm_kb") else None, 0)
                         + ("" if x.get("hwm_reset", True) else " (peak so far)"),
                         str(x["errors"])])
        L += table(["streams", "runs", "TTFT p50 s", "TTFT p99 s", "per-stream tokens/s",
                    "aggregate tokens/s", "aggregate min–max", "cached prompt tokens",
                    "serve peak RSS MB", "errors"], rows, md)
        L.append("")
        lv = {x["concurrency"]: x for x in http["levels"]}
        if lv.get(1, {}).get("aggregate_tps"):
            L.append("Aggregate over one stream: " + ", ".join(
                f"{c} streams {x['aggregate_tps'] / lv[1]['aggregate_tps']:.2f}×"
                for c, x in lv.items() if c != 1 and x["aggregate_tps"]) + ".")
        dec16 = (http.get("decomposition") or {}).get("16")
        if dec16 and lv.get(1):
            L.append(decomposition_line(dec16, lv[1]))
        L.append(f"`serve` RSS: idle after loading the model "
                 f"{fmt((http.get('rss_idle_kb') or 0) * 1024 / 1e6, 0)} MB, idle after the "
                 f"streams {fmt((http.get('rss_after_kb') or 0) * 1024 / 1e6, 0)} MB (MB = 10⁶ "
                 f"bytes; peak = VmHWM, reset before each level)" +
                 (f"; the prefix cache held {http['prefix_cache_entries']:.0f} states, "
                  f"{http['prefix_cache_bytes'] / 1e6:.0f} MB, after the streams"
                  if http.get("prefix_cache_bytes") is not None else "") +
                 f". {MAX_TOKENS} tokens per stream, greedy, every prompt new to the server; "
                 f"TTFT percentiles over every stream of every run, aggregate the median of "
                 f"the runs.")
    else:
        L.append(f"not measured: {r['errors'].get('http', '?')}")
    L.append("")

    h8 = r.get("http_int8")
    if h8 and h8.get("levels"):
        lv8 = {x["concurrency"]: x for x in h8["levels"]}
        L.append(b("HTTP streams, `serve --prompt-precision int8`") + ": " + "; ".join(
            f"{c} stream{'s' if c > 1 else ''}: aggregate {fmt(x['aggregate_tps'])} tokens/s "
            f"(runs {', '.join(f'{v:.1f}' for v in x['aggregate_tps_runs'])}), TTFT p50 "
            f"{fmt(x['ttft_p50_s'], 2)} s, p99 {fmt(x['ttft_p99_s'], 2)} s"
            for c, x in lv8.items()) +
            (f"; 16 ÷ 1: {lv8[16]['aggregate_tps'] / lv8[1]['aggregate_tps']:.2f}×"
             if lv8.get(1, {}).get("aggregate_tps") and lv8.get(16, {}).get("aggregate_tps")
             else "") + ".")
        dec8 = (h8.get("decomposition") or {}).get("16")
        if dec8 and lv8.get(1):
            line = decomposition_line(dec8, lv8[1])
            L.append("With int8 prompts, w" + line[1:])
        L.append("")
    elif r["errors"].get("http_int8"):
        L.append(f"HTTP streams with --prompt-precision int8 not measured: "
                 f"{r['errors']['http_int8']}")
        L.append("")

    L += peer_section(r, md)

    L.append(b("Speed and memory targets"))
    L.append("")
    L += table(["goal", "target", "measured", ""], [list(g) for g in goals(r)], md)
    return "\n".join(L) + "\n"


# ---------------------------------------------------------------- main
# short name -> (file in models/, the make target that fetches it); the
# names of scripts/run.sh
SHORT_NAMES = {"smollm2-135m": ("SmolLM2-135M-Instruct.Q4_1.gguf", "make model"),
               "gemma3-270m": ("gemma-3-270m-q4_k_m.gguf", "make gemma-model")}


def model_path(name):
    """--model's value -> (the GGUF path, how to fetch it when it is missing)."""
    k = SHORT_NAMES.get(name.lower())
    if k:
        return os.path.join(ROOT, "models", k[0]), k[1]
    base = os.path.basename(name).lower()
    fetch = next((f for file, f in SHORT_NAMES.values() if file.lower() == base), "make model")
    return os.path.abspath(name), fetch


def adapter_beside(model):
    """Where `--attn auto` looks for the model's adapter (server --help)."""
    base = os.path.basename(model)
    stem = base[:-5] if base.endswith(".gguf") else base
    for p in (os.path.join(os.path.dirname(model), "adapters", f"{stem}.darkformer.gguf"),
              (model[:-5] if model.endswith(".gguf") else model) + ".darkformer.gguf"):
        if os.path.exists(p):
            return p
    return None


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="smollm2-135m",
                    help="a GGUF path or a short name: " + ", ".join(SHORT_NAMES))
    ap.add_argument("--adapter", default=None,
                    help="default: the one `--attn auto` finds beside the model")
    ap.add_argument("--out", default=None, help="default: BUILD/bench/report.md")
    ap.add_argument("--quick", action="store_true", default=os.environ.get("BENCH_QUICK") == "1")
    ap.add_argument("--isa", default=None,
                    help="kernel path for every step (DARKSERVE_ISA); default: the CPU's best")
    ap.add_argument("--peer", action="store_true", default=os.environ.get("PEER") == "1",
                    help="llama.cpp beside darkserve (make bench PEER=1): built from the "
                         f"{bench_peer.PEER_PACKAGE} sdist under BUILD/peer, or reused")
    args = ap.parse_args(argv)
    if args.isa:
        os.environ["DARKSERVE_ISA"] = args.isa
    build = os.path.abspath(args.build)
    model, fetch = model_path(args.model)
    bin_path = os.path.join(build, "darkserve")
    out_path = args.out or os.path.join(build, "bench", "report.md")
    adapter = args.adapter or adapter_beside(model)
    for p in (bin_path, os.path.join(build, "tools", "bench_bw"),
              os.path.join(build, "tools", "bench_decode"), model):
        if not os.path.exists(p):
            sys.exit(f"bench: {p} missing (make all; {fetch})")
    rc, _, err = run([bin_path, "version"])
    if rc != 0:  # an unknown DARKSERVE_ISA, or one this CPU does not run
        sys.exit(f"bench: {err.strip()}")

    peer = None
    if args.peer:  # before anything is measured: a peer that cannot be had stops the run
        flavor = bench_peer.flavor_of(os.environ.get("DARKSERVE_ISA") or None)
        log(f"llama.cpp ({flavor}): {bench_peer.PEER_PACKAGE} {bench_peer.PEER_VERSION} "
            f"under {os.path.relpath(os.path.join(build, 'peer'), ROOT)}")
        try:
            tools, built = bench_peer.build(os.path.join(build, "peer"), flavor, log=log)
        except bench_peer.PeerError as e:
            sys.exit(f"bench: PEER=1: {e}")
        peer = {"flavor": flavor, "built": built, "tools": tools,
                "cmake": bench_peer.FLAVORS[flavor]}
        log(f"  llama.cpp {'built' if built else 'reused'}: {tools['llama-bench']}")

    t_start = time.monotonic()
    r = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
         "load_start": os.getloadavg(), "quick": args.quick, "errors": {}, "peer": peer,
         "model": os.path.relpath(model, ROOT), "adapter": adapter and os.path.relpath(adapter, ROOT)}
    r["machine"] = machine(bin_path)
    env = tool_env(r["machine"])
    log(f"{'quick' if args.quick else 'full'} run; load average {r['load_start'][0]:.2f}")

    log("bandwidth probe")
    try:
        r["bw"] = bandwidth(build, model, env)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        r["errors"]["bw"] = str(e)

    log(f"prefill: {PREFILL_TOKENS}-token prompt, exact, default and int8 prompts, "
        f"{PREFILL_RUNS} runs each")
    try:
        r["prefill"] = prefill(bin_path, model)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        r["errors"]["prefill"] = str(e)

    short, long_ = [512, 4096], [16384, 65536]
    r["decode"], errs = [], []
    skipped = ["exact attention at 64K is not run: its KV cache grows with every token and "
               "every token reads all of it (SmolLM2-135M: 3.0 GB of f32, 6 GB while it is "
               "loaded, ~0.5 tokens/s here: minutes per median), and 64K is past the model's "
               "trained context (SmolLM2 8,192, Gemma 3 32,768)"]
    if args.quick:
        skipped.insert(0, "BENCH_QUICK=1: 16K and 64K contexts not run")
    plan = [("exact", short, DECODE_TOKENS, None)]
    if not args.quick:
        plan.append(("exact", [16384], EXACT_LONG_TOKENS, None))
    if adapter:
        plan.append(("darkformer", [0] + short + ([] if args.quick else long_),
                     DECODE_TOKENS, adapter))
    else:
        skipped.append(f"no adapter beside {args.model}: the default configuration "
                       "(DARKFormer v2) could not be measured")
    r["skipped_note"] = "Not run: " + "; ".join(skipped) + "."
    for attn, ctxs, tokens, ad in plan:
        log(f"decode {attn} at {', '.join(ctx_name(c) for c in ctxs)}")
        try:
            r["decode"] += decode(build, model, env, attn, ctxs, tokens, ad)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            errs.append(str(e))
    if errs:
        r["errors"]["decode"] = "; ".join(errs)

    if peer:
        log(f"llama-bench: pp{bench_peer.BENCH_PROMPT} and tg{bench_peer.BENCH_GEN} at depths "
            f"{', '.join(map(str, bench_peer.BENCH_DEPTHS))}, {r['machine']['usable']} threads")
        try:
            peer["bench"] = bench_peer.run_bench(peer["tools"], model, r["machine"]["usable"])
        except (bench_peer.PeerError, subprocess.TimeoutExpired) as e:
            r["errors"]["peer_bench"] = str(e)

    if adapter:
        log(f"side by side: {SIDE_ROUNDS} rounds of a bandwidth probe and a decode at "
            f"{ctx_name(SIDE_CTX)}")
        try:
            r["side"] = side_by_side(build, model, env, adapter)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            r["errors"]["side"] = str(e)

    log("HTTP streams: serve + loadgen")
    try:
        r["http"] = http_streams(build, bin_path, model, args.quick, sys.executable)
    except (RuntimeError, AssertionError, OSError, subprocess.TimeoutExpired) as e:
        r["errors"]["http"] = str(e)
    if peer:
        log(f"HTTP streams: llama-server -np {bench_peer.SERVER_SLOTS} + loadgen at 1 and 16")
        try:
            peer["http"] = peer_http(build, peer["tools"], model, r["machine"]["usable"],
                                     sys.executable)
        except (bench_peer.PeerError, RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            r["errors"]["peer_http"] = str(e)

    log("HTTP streams: serve --prompt-precision int8 + loadgen at 1 and 16")
    try:
        r["http_int8"] = http_streams(build, bin_path, model, True, sys.executable,
                                      args=["--prompt-precision", "int8"], levels_only="1,16")
    except (RuntimeError, AssertionError, OSError, subprocess.TimeoutExpired) as e:
        r["errors"]["http_int8"] = str(e)

    r["load_end"] = os.getloadavg()
    r["wall_s"] = time.monotonic() - t_start
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "w") as f:
        f.write(render(r, markdown=True))
    with open(os.path.splitext(out_path)[0] + ".json", "w") as f:
        json.dump(r, f, indent=1, default=str)
    sys.stdout.write(render(r, markdown=False))
    print(f"\nmarkdown: {os.path.relpath(out_path, ROOT)} (and .json beside it)")
    for k, v in r["errors"].items():
        print(f"bench: {k} failed: {v}", file=sys.stderr)
    return 1 if r["errors"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
