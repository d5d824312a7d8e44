"""DARKSERVE_ISA (core/kernels/cpu.h): a whole process on one kernel path.

`darkserve version` names the path in force and every path this CPU runs;
each runnable name is honoured by darkserve and by the tools; an unknown
name, or a path this CPU lacks, is refused (exit 2, a message naming the
value) by darkserve's commands, bench_decode, bench_bw and scripts/bench.py
before they do anything: a figure or a reply never comes silently from
another path than the one asked for.
"""
import os
import subprocess
import sys

import pytest

from ds_server import BIN, BUILD, ROOT, TINY

ALL_PATHS = ["generic", "avx2", "avx512vnni"]


def run(args, isa, timeout=120):
    env = dict(os.environ)
    if isa is None:
        env.pop("DARKSERVE_ISA", None)
    else:
        env["DARKSERVE_ISA"] = isa
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=ROOT)


def version(isa=None):
    p = run([BIN, "version"], isa)
    fields = dict(ln.split(": ", 1) for ln in p.stdout.splitlines() if ": " in ln)
    return p, fields


def runnable():
    _, f = version()
    return f["qdot paths"].split()


def test_version_names_the_path_and_the_paths():
    p, f = version()
    assert p.returncode == 0, p.stderr
    paths = f["qdot paths"].split()
    assert paths and paths[0] == "generic" and set(paths) <= set(ALL_PATHS), paths
    assert f["qdot"] == paths[-1]  # the best one, unless told otherwise


def test_every_runnable_path_is_honoured():
    for isa in runnable():
        p, f = version(isa)
        assert p.returncode == 0, p.stderr
        assert f["qdot"] == isa
        g = run([BIN, "generate", "--model", TINY, "--prompt", "hello", "--max-tokens", "3",
                 "--seed", "1"], isa)
        assert g.returncode == 0, (isa, g.stderr)
        assert "generated: 3 tokens" in g.stderr, g.stderr


TOOLS = [
    [BIN, "version"],
    [BIN, "serve", "--model", TINY, "--port", "0"],
    [BIN, "generate", "--model", TINY, "--prompt", "hi", "--max-tokens", "1"],
    [os.path.join(BUILD, "tools", "bench_decode"), "--model", TINY, "--ctx", "8"],
    [os.path.join(BUILD, "tools", "bench_bw"), "--mb", "4", "--passes", "1"],
]


@pytest.mark.parametrize("name", ["bogus", "AVX2", "avx512", " avx2"])
@pytest.mark.parametrize("args", TOOLS, ids=["version", "serve", "generate", "bench_decode",
                                             "bench_bw"])
def test_unknown_path_is_refused(args, name):
    p = run(args, name, timeout=30)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert f"DARKSERVE_ISA={name}: unknown path" in p.stderr, p.stderr


def test_a_path_this_cpu_lacks_is_refused():
    lacking = [x for x in ALL_PATHS if x not in runnable()]
    if not lacking:
        pytest.skip("this CPU runs every path")
    for args in TOOLS:
        p = run(args, lacking[0], timeout=30)
        assert p.returncode == 2, (args, p.stderr)
        assert "this CPU does not run it" in p.stderr, p.stderr


def test_bench_refuses_before_running():
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench.py"), "--build",
                        BUILD, "--isa", "bogus"], capture_output=True, text=True, timeout=60,
                       cwd=ROOT)
    assert p.returncode != 0
    assert "DARKSERVE_ISA=bogus: unknown path" in p.stderr, p.stderr
    assert "bandwidth probe" not in p.stderr  # nothing was measured
