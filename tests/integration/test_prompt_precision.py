"""--prompt-precision (serve and the CLI commands that load a model): auto,
the default, multiplies prompt rows on Intel AMX-BF16 tiles where the CPU
has them (two bf16 parts a value, within 2^-16 of f32) and says so, in f32
elsewhere; f32 always multiplies them in f32; int8 quantizes them to 8 bits
like decode rows where every matrix has the packed kernel, AVX2 or AVX-512 VNNI (the
default model, Q4_1 and Q8_0, on such a CPU), and says so; elsewhere it
warns that prompts stay f32. Any other word is refused.
"""
import os
import re
import subprocess

import pytest

from ds_server import BIN, MODEL, ROOT, TINY, Server, wait_for

DATA = os.environ.get("DARKSERVE_DATA", os.path.join(ROOT, "tests", "data"))

RUN_S = 300


def vnni_cpu():
    with open("/proc/cpuinfo") as f:
        flags = next((ln for ln in f if ln.startswith("flags")), "").split()
    return "avx512_vnni" in flags and "avx512bw" in flags and "avx512vl" in flags


def packs():
    """Whether darkserve runs the packed kernels here: AVX2 + FMA + F16C (or
    more), and no DARKSERVE_ISA=generic in the environment it inherits."""
    with open("/proc/cpuinfo") as f:
        flags = next((ln for ln in f if ln.startswith("flags")), "").split()
    return ("avx2" in flags and "fma" in flags and "f16c" in flags
            and os.environ.get("DARKSERVE_ISA") != "generic")


def amx_bf16_cpu():
    with open("/proc/cpuinfo") as f:
        flags = next((ln for ln in f if ln.startswith("flags")), "").split()
    return vnni_cpu() and "amx_bf16" in flags and "avx512_bf16" in flags


def perplexity(model, *args):
    assert os.access(BIN, os.X_OK), f"{BIN} missing: build it first (make)"
    assert os.path.exists(model), f"{model} missing"
    p = subprocess.run([BIN, "perplexity", "--model", model, "--file",
                        os.path.join(DATA, "heldout.txt"), "--limit", "300", "--chunk", "150",
                        "--threads", "2"] + list(args),
                       capture_output=True, text=True, timeout=RUN_S)
    return p


def ppl(p):
    assert p.returncode == 0, p.stderr
    m = re.search(r"^perplexity: ([0-9.]+) tokens: \d+$", p.stdout, re.M)
    assert m, p.stdout
    return float(m.group(1))


def test_cli_precisions():
    base = perplexity(MODEL)
    auto = perplexity(MODEL, "--prompt-precision", "auto")
    f32 = perplexity(MODEL, "--prompt-precision", "f32")
    assert ppl(base) == ppl(auto)  # the default is auto
    tiles = "prompt rows on Intel AMX-BF16 tiles"
    assert (tiles in base.stderr) == amx_bf16_cpu(), base.stderr
    assert tiles not in f32.stderr, f32.stderr
    if amx_bf16_cpu():  # within 2^-16 of f32 a product: the same to a few 1e-5
        assert abs(ppl(base) / ppl(f32) - 1) < 1e-4, (ppl(base), ppl(f32))
    else:
        assert ppl(base) == ppl(f32)
    assert "prompt rows in 8 bits" not in base.stderr + f32.stderr
    i8 = perplexity(MODEL, "--prompt-precision", "int8")
    if packs():
        assert "prompt rows in 8 bits" in i8.stderr, i8.stderr
        assert tiles not in i8.stderr, i8.stderr
        # other numbers, close ones (h1 at 1K chunks: +0.37%)
        assert ppl(i8) != ppl(f32)
        assert abs(ppl(i8) / ppl(f32) - 1) < 0.03, (ppl(i8), ppl(f32))
    else:
        assert "prompt rows stay f32" in i8.stderr, i8.stderr
        assert ppl(i8) == ppl(base)


def test_cli_int8_on_a_model_it_cannot_pack_warns():
    p = perplexity(TINY, "--prompt-precision", "int8", "--attn", "exact")
    assert p.returncode == 0, p.stderr
    # the tiny model has F16 matrices beside packed ones: its prompt rows
    # stay where they run without the option, and the warning says where
    want = "prompt rows stay on the Intel AMX-BF16 tiles" if amx_bf16_cpu() else \
        "prompt rows stay f32"
    assert want in p.stderr, p.stderr


@pytest.mark.parametrize("word", ["f16", "INT8", "bf16", ""])
def test_cli_refuses_other_words(word):
    p = perplexity(TINY, "--prompt-precision", word)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "--prompt-precision takes auto, f32 or int8" in p.stderr, p.stderr


def test_serve_refuses_other_words(tmp_path):
    p = subprocess.run([BIN, "serve", "--model", TINY, "--port", "0", "--prompt-precision",
                        "bf16"], capture_output=True, text=True, timeout=RUN_S)
    assert p.returncode != 0
    assert "prompt-precision" in p.stderr and "f32" in p.stderr and "bf16" in p.stderr, p.stderr


def test_serve_int8_answers_and_says_so(tmp_path):
    srv = Server(tmp_path, MODEL, name="int8", args=["--prompt-precision", "int8"])
    try:
        st, r, _ = srv.post("/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "Name a colour."}],
                             "max_tokens": 8, "temperature": 0})
        assert st == 200, r
        assert r["usage"]["completion_tokens"] >= 1
        want = "prompt rows in 8 bits" if packs() else "prompt rows stay f32"
        assert wait_for(lambda: want in srv.log_text(), 10), srv.log_text()
        assert "AMX-BF16" not in srv.log_text()
    finally:
        srv.kill()


def test_serve_default_says_where_prompt_rows_run(tmp_path):
    """The default server logs the AMX-BF16 tiles where it runs them, not
    with --prompt-precision f32; both answer."""
    for name, args in (("auto", []), ("f32", ["--prompt-precision", "f32"])):
        srv = Server(tmp_path / name, MODEL, name=name, args=args)
        try:
            st, r, _ = srv.post("/v1/chat/completions",
                                {"messages": [{"role": "user", "content": "Name a colour."}],
                                 "max_tokens": 8, "temperature": 0})
            assert st == 200, r
            assert wait_for(lambda: "ready" in srv.log_text(), 10), srv.log_text()
            said = "prompt rows on Intel AMX-BF16 tiles" in srv.log_text()
            assert said == (name == "auto" and amx_bf16_cpu()), srv.log_text()
        finally:
            srv.kill()
