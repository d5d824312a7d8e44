"""The pieces `make bench` is built from (scripts/bench.py), checked for what
they print and compute, never for how fast anything is:

- build/tools/bench_bw on a small buffer: the lines bench.py parses, positive
  figures, and the weight bytes of a decode token equal to the sum the GGUF
  file gives (untied output head: the tiny model; tied: SmolLM2);
- build/tools/bench_decode with a list of contexts (one state per context;
  linear kinds filled once through the list);
- loadgen's percentile helper and per-level summary on known data;
- bench.py's report: the speed and memory targets met or not from given figures;
- build/tools/bench_amx_overlap: its lines and its overlap arithmetic;
  tools/batch_ablation.sh --check: its patches still fit the kernels they
  cut (and fail loudly when they do not).
"""
import importlib.util
import os
import re
import subprocess
import sys

import gguf
import pytest

from ds_server import BIN, BUILD, MODEL, ROOT, TINY

sys.path.insert(0, os.path.dirname(__file__))
import loadgen  # noqa: E402


def load_bench():
    spec = importlib.util.spec_from_file_location("bench", os.path.join(ROOT, "scripts",
                                                                        "bench.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bench = load_bench()
BENCH_BW = os.path.join(BUILD, "tools", "bench_bw")
BENCH_DECODE = os.path.join(BUILD, "tools", "bench_decode")
BENCH_OVERLAP = os.path.join(BUILD, "tools", "bench_amx_overlap")
ABLATION = os.path.join(ROOT, "tools", "batch_ablation.sh")


def tool(args, check=True):
    assert os.access(args[0], os.X_OK), f"{args[0]} missing: build it first (make)"
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def expected_weight_bytes(path):
    """What a decode step reads, from the gguf package's own reader: every
    tensor but token_embd, plus token_embd whole when there is no output.weight
    (tied) or one row of it when there is."""
    r = gguf.GGUFReader(path)
    t = {x.name: x for x in r.tensors}
    rest = sum(int(x.n_bytes) for n, x in t.items() if n != "token_embd.weight")
    embd = t["token_embd.weight"]
    if "output.weight" in t:
        return rest + int(embd.n_bytes) // int(embd.shape[1])
    return rest + int(embd.n_bytes)


@pytest.mark.parametrize("kernel", ["c", None])
def test_bench_bw_small_buffer(kernel):
    args = [BENCH_BW, "--mb", "8", "--passes", "3", "--threads", "2", "--model", TINY]
    if kernel:
        args += ["--kernel", kernel]
    out = tool(args).stdout
    r = bench.parse_bench_bw(out)
    assert r["buffer_mib"] == 8 and r["passes"] == 3, out
    if kernel:
        assert r["read_kernel"] == kernel
    got = {(x["op"], x["threads"], x["note"] != "") for x in r["rows"]}
    assert got == {("read", 1, False), ("read", 2, False), ("copy", 1, False),
                   ("copy", 2, False), ("read", 2, True)}, out
    for x in r["rows"]:
        assert 0 < x["min"] <= x["gbs"] <= x["max"], x
    assert r["weight_bytes"] == expected_weight_bytes(TINY), out
    assert "output.weight" in r["weight_detail"]


def test_bench_bw_tied_head_counts_the_whole_table():
    out = tool([BENCH_BW, "--mb", "2", "--passes", "1", "--threads", "1", "--model",
                MODEL]).stdout
    r = bench.parse_bench_bw(out)
    assert r["weight_bytes"] == expected_weight_bytes(MODEL), out
    assert "tied" in r["weight_detail"]
    # the tied table is most of what is not a block matrix: a decode token
    # reads far more than the matrices alone
    assert r["weight_bytes"] > 90_000_000


@pytest.mark.parametrize("args", [["--mb", "0"], ["--passes", "x"], ["--kernel", "sse9"],
                                  ["--bogus", "1"], ["--mb"]])
def test_bench_bw_refuses_bad_options(args):
    p = tool([BENCH_BW] + args, check=False)
    assert p.returncode == 2 and "bench_bw" in p.stderr


def test_bench_bw_unreadable_model_fails():
    p = tool([BENCH_BW, "--mb", "2", "--passes", "1", "--model", "/nonexistent.gguf"],
             check=False)
    assert p.returncode == 1 and "/nonexistent.gguf" in p.stderr


@pytest.mark.parametrize("attn", ["exact", "performer"])
def test_bench_decode_context_list(attn):
    out = tool([BENCH_DECODE, "--model", TINY, "--attn", attn, "--ctx", "160,16",
                "--vs", "64", "--tokens", "2", "--runs", "3", "--threads", "1"]).stdout
    rows = list(bench.RE_DECODE.finditer(out))
    assert [int(m.group(2)) for m in rows] == [160, 16, 64], out  # the order given
    for m in rows:
        assert m.group(1) == attn
        assert len(m.group(7).split()) == 3 and float(m.group(8)) > 0
    states = [int(m.group(5)) for m in rows]
    if attn == "exact":
        assert states[0] > states[2] > states[1], out  # a KV cache grows with the context
    else:
        assert len(set(states)) == 1, out  # a linear state does not
    assert "ratio of the medians" not in out  # only for exactly two contexts


def test_bench_decode_batch():
    """--batch B: B copies of each state decode in one forward per step;
    the line keeps the format scripts/bench.py reads and says the batch."""
    out = tool([BENCH_DECODE, "--model", TINY, "--attn", "performer", "--ctx", "40",
                "--tokens", "2", "--runs", "2", "--threads", "1", "--batch", "3"]).stdout
    rows = list(bench.RE_DECODE.finditer(out))
    assert len(rows) == 1 and float(rows[0].group(8)) > 0, out
    assert "batch 3: the tokens/s above count all 3 sequences" in out, out
    for bad in ["0", "65", "x"]:
        p = tool([BENCH_DECODE, "--model", TINY, "--ctx", "8", "--batch", bad], check=False)
        assert p.returncode == 2, (bad, p.stdout)


def test_bench_decode_amx_switch():
    """--amx on|off|auto puts the packed kernel's batches on Intel AMX tiles
    or off them; the line's isa says "+amx" when this batch runs on them.
    Where the CPU or OS has no tiles, "on" is refused (exit 2, a message)."""
    args = [BENCH_DECODE, "--model", TINY, "--attn", "performer", "--ctx", "40", "--tokens",
            "2", "--runs", "1", "--threads", "1", "--batch", "9"]
    off = tool(args + ["--amx", "off"]).stdout
    rows = list(bench.RE_DECODE.finditer(off))
    assert len(rows) == 1 and not rows[0].group(4).endswith("+amx"), off
    on = tool(args + ["--amx", "on"], check=False)
    if on.returncode == 2:
        assert "cannot run" in on.stderr, on.stderr
    else:
        assert on.returncode == 0, on.stderr
        rows = list(bench.RE_DECODE.finditer(on.stdout))
        assert len(rows) == 1 and rows[0].group(4).endswith("+amx"), on.stdout
    for bad in ["yes", ""]:
        p = tool(args + ["--amx", bad], check=False)
        assert p.returncode == 2 and "--amx" in p.stderr, (bad, p.stderr)


def test_bench_decode_bad_context_list():
    for ctx in ["", "1,,x", ",".join(["8"] * 9)]:
        p = tool([BENCH_DECODE, "--model", TINY, "--ctx", ctx], check=False)
        assert p.returncode == 2, (ctx, p.stdout)


def test_percentile_known_data():
    p = loadgen.percentile
    assert p([], 50) is None
    assert p([7.0], 50) == 7.0 and p([7.0], 99) == 7.0
    assert p([4, 1, 3, 2], 50) == 2.5  # unsorted input
    assert p([1, 2, 3, 4], 0) == 1 and p([1, 2, 3, 4], 100) == 4
    assert p(list(range(1, 101)), 99) == pytest.approx(99.01)
    assert p([10, 20], 90) == pytest.approx(19.0)


def test_summarize_levels():
    def stream(t0, ttft, tokens, t_end):
        return {"ttft_s": ttft, "tokens": tokens, "decode_tps": 10.0, "cached_tokens": 0,
                "t0": t0, "t_end": t_end}
    runs = [[stream(0, 0.1, 64, 2.0), stream(0, 0.3, 64, 4.0)],      # 128 tokens / 4 s
            [stream(10, 0.2, 64, 12.0), {"error": 429, "body": ""}],  # 64 / 2 s
            [stream(20, 0.4, 32, 21.0), stream(20, 0.5, 32, 21.0)]]   # 64 / 1 s
    s = loadgen.summarize(2, 64, runs)
    assert (s["runs"], s["streams"], s["errors"]) == (3, 6, 1)
    assert s["ttft_p50_s"] == 0.3 and s["ttft_median_s"] == 0.3
    assert s["ttft_p99_s"] == pytest.approx(0.496)
    assert s["aggregate_tps_runs"] == [32.0, 32.0, 64.0] and s["aggregate_tps"] == 32.0
    assert s["completion_tokens"] == 256


def test_decompose_levels():
    """decompose on known levels: one stream 64 tokens at 0.05 s + 63 steps
    of 4 ms (aggregate 200); 16 streams 0.5 s + 63 steps of 16 ms."""
    lv = {1: {"aggregate_tps": 200.0, "ttft_p50_s": 0.05, "stream_decode_tps_median": 250.0},
          16: {"aggregate_tps": 680.0, "ttft_p50_s": 0.5, "stream_decode_tps_median": 62.5},
          4: {"aggregate_tps": 400.0, "ttft_p50_s": 0.1, "stream_decode_tps_median": None}}
    d = loadgen.decompose(lv, 64)
    assert list(d) == ["16"]  # level 4 lacks a decode rate, level 1 is the reference
    x = d["16"]
    assert (x["ttft_s"], x["ttft_vs_1"], x["step_ms"], x["step_vs_1"]) == (0.5, 10.0, 16.0, 4.0)
    assert x["model_tps"] == pytest.approx(16 * 64 / (0.5 + 63 * 0.016), abs=0.05)
    # 4x 200 = 800 tokens/s: 1024 tokens in 1.28 s, 0.78 s for 63 steps
    assert x["step_ms_for_target"] == pytest.approx(1e3 * (1.28 - 0.5) / 63, abs=0.005)
    assert loadgen.decompose(lv, 64, target=2.0)["16"]["step_ms_for_target"] == \
        pytest.approx(1e3 * (2.56 - 0.5) / 63, abs=0.005)
    lv[16]["ttft_p50_s"] = 1.5  # the first tokens alone past the 1.28 s budget
    assert loadgen.decompose(lv, 64)["16"]["step_ms_for_target"] is None
    assert loadgen.decompose({16: lv[16]}, 64) == {}  # no level of 1
    assert loadgen.decompose(lv, 1) == {}  # no steps to speak of


def test_decomposition_line_renders():
    d = {"ttft_s": 0.5, "ttft_vs_1": 10.0, "step_ms": 16.0, "step_vs_1": 4.0,
         "model_tps": 677.2, "step_ms_for_target": 12.38}
    line = bench.decomposition_line(d, {"ttft_p50_s": 0.05})
    assert "after 0.50 s, 10.0× one stream's 0.050 s" in line and "every 16.0 ms, 4.0×" in line
    assert "predict 677 tokens/s" in line and "a step of at most 12.4 ms" in line
    d["step_ms_for_target"] = None
    assert "cannot be had" in bench.decomposition_line(d, {"ttft_p50_s": 0.05})
    r = fake_results([60.0, 55.0], 450.0, 50.0, 190.0, 100_000, 300_000)
    assert "decomposition" not in bench.render(r, markdown=True)  # none measured: no line
    r["http"]["decomposition"] = {"16": dict(d, step_ms_for_target=9.9)}
    assert "a step of at most 9.9 ms" in bench.render(r, markdown=True)


def fake_results(decode_tps, prefill_tps, agg1, agg16, idle_kb, hwm16_kb):
    bw = {"rows": [{"op": "read", "threads": 2, "note": "", "gbs": 10.0, "min": 9.0,
                    "max": 11.0}],
          "buffer_mib": 1200, "llc_mib": 300, "passes": 9, "read_kernel": "avx512",
          "qdot": "avx512vnni", "weight_bytes": 100_000_000, "weight_detail": "test"}
    bw["read_all"] = bw["rows"][0]
    bw["bound_tps"] = 100.0  # 10 GB/s over 100 MB
    dec = [{"attn": a, "ctx": c, "threads": 2, "isa": "x", "state_bytes": 15_000_000,
            "fill_s": 1.0, "runs": [t], "median": t, "tokens": 32}
           for a, c, t in [("exact", 512, 40.0)] +
           [("darkformer", c, t) for c, t in zip([512, 4096], decode_tps)]]
    level = lambda c, a, hwm: {  # noqa: E731
        "concurrency": c, "runs": 3, "streams": 3 * c, "errors": 0, "ttft_p50_s": 0.2,
        "ttft_p99_s": 0.9, "stream_decode_tps_median": 30.0, "aggregate_tps": a,
        "aggregate_tps_runs": [a], "cached_tokens_median": 0, "hwm_kb": hwm,
        "hwm_reset": True}
    return {"date": "2026-01-01 00:00 UTC", "load_start": (1.0, 1.0, 1.0),
            "load_end": (2.0, 2.0, 2.0), "quick": True, "errors": {}, "wall_s": 60.0,
            "machine": {"cpu": "test cpu", "online": 2, "usable": 2, "mem_gib": 1.0,
                        "openblas": "X", "version": "v", "kernel": "k", "commit": "abc1234",
                        "dirty": []},
            "bw": bw, "prefill": {"tokens": 512, "exact": [500.0], "auto": [prefill_tps]},
            "decode": dec, "skipped_note": "Not run: test.",
            "http": {"levels": [level(1, agg1, 150_000), level(16, agg16, hwm16_kb)],
                     "rss_idle_kb": idle_kb, "rss_after_kb": 200_000}}


def verdicts(r):
    return [g[3] for g in bench.goals(r)]


def test_goals_met_and_not_met():
    good = fake_results([60.0, 55.0], 450.0, 50.0, 220.0, 100_000, 300_000)
    assert verdicts(good) == ["met"] * 4
    bad = fake_results([60.0, 45.0], 399.0, 50.0, 190.0, 250_000, 300_000)
    assert verdicts(bad) == ["not met"] * 4  # 45%, 399 tokens/s, 3.8x, idle 256 MB
    assert verdicts(fake_results([60.0, 55.0], 450.0, 50.0, 220.0, 100_000, 400_000)) == \
        ["met", "met", "met", "not met"]  # 409.6 MB during 16 streams


def test_report_renders_every_figure():
    r = fake_results([60.0, 55.0], 450.0, 50.0, 220.0, 100_000, 300_000)
    md, text = bench.render(r, markdown=True), bench.render(r, markdown=False)
    assert md.startswith("## `make bench` on abc1234 (2026-01-01 00:00 UTC)")
    assert "**100 tokens/s**" in md  # the bound
    assert re.search(r"\| 4K \| default .*\| \*\*55\.0\*\* \|.*\| 55% \|", md), md
    assert "16 streams 4.40×" in md and "16 streams 4.40×" in text
    assert "|" not in text.split("Speed and memory targets")[1]  # the terminal table has no pipes
    for s in (md, text):
        assert "test cpu" in s and "avx512vnni" in s and "2.00 / 2.00 / 2.00" in s


def test_side_by_side_ratio_is_its_own_goal_row():
    r = fake_results([60.0, 55.0], 450.0, 50.0, 220.0, 100_000, 300_000)
    rounds = [{"gbs": g, "bound_tps": g * 10.0, "decode_tps": t, "ratio": t / (g * 10.0)}
              for g, t in [(10.0, 60.0), (20.0, 80.0), (12.0, 48.0)]]  # 60%, 40%, 40%
    r["side"] = {"ctx": 1024, "rounds": rounds, "ratio": bench.median([x["ratio"]
                                                                      for x in rounds])}
    g = bench.goals(r)
    assert g[0][0].startswith("1. single-stream decode, default configuration at 1K, side")
    assert g[0][3] == "not met" and "40% (median of 3 rounds: 60%, 40%, 40%)" in g[0][2]
    assert [x[3] for x in g[1:]] == ["met"] * 4  # the separate-runs row and goals 2-4
    md = bench.render(r, markdown=True)
    assert "60.0 / 100 = 60%; 80.0 / 200 = 40%; 48.0 / 120 = 40%; median **40%**" in md
    r["side"]["rounds"][1]["ratio"] = r["side"]["ratio"] = 0.6
    assert bench.goals(r)[0][3] == "met"


def test_int8_prompt_figures_are_their_own_rows():
    """The --prompt-precision int8 server's 16 ÷ 1 is a goal row of its own
    (labelled not the default), its prefill joins the prefill line, and a
    report without them renders as before."""
    r = fake_results([60.0, 55.0], 450.0, 50.0, 190.0, 100_000, 300_000)  # default 3.8x
    assert len(bench.goals(r)) == 4
    r["prefill"]["int8"] = [777.0]
    level = lambda c, a: {"concurrency": c, "runs": 3, "streams": 3 * c, "errors": 0,  # noqa
                          "ttft_p50_s": 0.25, "ttft_p99_s": 0.5, "aggregate_tps": a,
                          "aggregate_tps_runs": [a, a + 1.0]}
    r["http_int8"] = {"levels": [level(1, 50.0), level(16, 205.0)]}
    g = bench.goals(r)
    assert [x[3] for x in g if x[0].startswith("3.")] == ["not met", "met"]
    assert "--prompt-precision int8" in g[3][0] and "not the default" in g[3][0]
    assert g[3][2] == "4.10×"
    md = bench.render(r, markdown=True)
    assert "default with --prompt-precision int8 **777.0** (777.0)" in md, md
    assert "16 ÷ 1: 4.10×" in md and "16 streams: aggregate 205.0 tokens/s" in md
    r["http_int8"]["levels"][1]["aggregate_tps"] = 150.0
    assert bench.goals(r)[3][3] == "not met"


RE_OVERLAP = re.compile(r"^(tiles|float zmm|tiles\+float zmm|float ymm|tiles\+float ymm)\s+"
                        r"([0-9.]+) ns a block$", re.M)


def test_bench_amx_overlap_lines_and_arithmetic():
    """Where the tiles run: five timings, each positive, and each overlap
    line equal to (tiles + float - both) / min(tiles, float) of the printed
    figures; elsewhere the one line that says there is nothing to measure."""
    out = tool([BENCH_OVERLAP, "--reps", "2", "--groups", "3"]).stdout
    if "no AMX tiles" in out:
        assert out.strip() == "no AMX tiles on this CPU or OS: nothing to measure", out
        return
    t = {m.group(1): float(m.group(2)) for m in RE_OVERLAP.finditer(out)}
    assert sorted(t) == sorted(["tiles", "float zmm", "tiles+float zmm", "float ymm",
                                "tiles+float ymm"]), out
    assert all(v > 0 for v in t.values()), out
    assert "3 groups x 18 blocks, fastest of 2 passes" in out, out
    for isa in ["zmm", "ymm"]:
        m = re.search(rf"^overlap {isa}\s+(-?[0-9.]+) ", out, re.M)
        assert m, out
        f, b = t[f"float {isa}"], t[f"tiles+float {isa}"]
        want = (t["tiles"] + f - b) / min(t["tiles"], f)
        # the printed ns have two decimals: allow their rounding
        slack = 0.015 / min(t["tiles"], f) + 0.006
        assert abs(float(m.group(1)) - want) <= slack, (isa, m.group(1), want, out)


@pytest.mark.parametrize("args", [["--reps", "0"], ["--reps", "x"], ["--groups", "0"],
                                  ["--groups", "5000"], ["--bogus"], ["--reps"]])
def test_bench_amx_overlap_refuses_bad_options(args):
    p = tool([BENCH_OVERLAP] + args, check=False)
    assert p.returncode == 2 and "usage: bench_amx_overlap" in p.stderr, (args, p.stderr)


def test_batch_ablation_patches_fit():
    p = subprocess.run([ABLATION, "--check"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    for v in ["no-float", "no-tiles", "no-window", "half-window"]:
        assert f"batch_ablation: {v}: the patch fits" in p.stdout, p.stdout
    bad = subprocess.run([ABLATION, "x"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_batch_ablation_fails_when_a_kernel_changed(tmp_path):
    """A patch whose code is gone stops the script with the file and the
    text it looked for, so the ablation never silently measures nothing."""
    (tmp_path / "tools").mkdir()
    (tmp_path / "core" / "kernels").mkdir(parents=True)
    (tmp_path / "core" / "attn").mkdir()
    script = tmp_path / "tools" / "batch_ablation.sh"
    script.write_text(open(ABLATION).read())
    script.chmod(0o755)
    src = open(os.path.join(ROOT, "core", "kernels", "qdot_pack.c")).read()
    assert "amx_scale(R, gp" in src
    (tmp_path / "core" / "kernels" / "qdot_pack.c").write_text(
        src.replace("amx_scale(R, gp", "amx_scale2(R, gp"))
    for name in ["kernels/blas.c", "attn/attn_linear.c"]:
        (tmp_path / "core" / name).write_text(open(os.path.join(ROOT, "core", name)).read())
    p = subprocess.run([str(script), "--check"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "no-float: core/kernels/qdot_pack.c no longer has" in p.stderr, p.stderr
