"""--attn auto, the default of `darkserve serve` and of the CLI commands that
load a model: DARKFormer with the adapter found beside the model
(<dir>/adapters/<name>.darkformer.gguf, then <model without .gguf>.darkformer.gguf),
else the training-free fallback (performer kind, sinks + window only) and a
message saying so; an explicit --attn exact still runs exact attention; an
adapter made for another model is refused.

Runs on a copy of the tiny fixture model in a temporary folder, with and
without an adapter beside it. The adapter is written here with the `gguf`
package (docs/ADAPTER.md: Mat = I per layer and KV head), for the
fingerprint the logits_dump helper reports for the tiny model.
"""
import os
import re
import shutil
import subprocess

import numpy as np
import gguf
import pytest

from ds_server import BIN, BUILD, TINY, Server, read_text

HELPER = os.path.join(BUILD, "tests", "helpers", "logits_dump")
RUN_S = 120
TEXT = ("The quick brown fox jumps over the lazy dog. " * 20).strip()


def tiny_info():
    assert os.access(HELPER, os.X_OK), f"{HELPER} missing: build it first (make)"
    p = subprocess.run([HELPER, TINY, "--tokens", "1", "--info"], capture_output=True,
                       text=True, timeout=RUN_S)
    assert p.returncode == 0, p.stderr
    return dict(l.split(" ", 1) for l in p.stdout.splitlines() if " " in l)


def write_adapter(path, fingerprint, window=8, sinks=2, scale=1.0, kind="darkformer"):
    """kind "darkformer": M = scale·I; "darkformer-is": Λ = scale·I."""
    info = tiny_info()
    L, hkv, hd = int(info["n_layer"]), int(info["n_head_kv"]), int(info["head_dim"])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    w = gguf.GGUFWriter(path, "darkformer-adapter")
    w.add_uint32("darkformer.format_version", 2)
    w.add_string("darkformer.kind", kind)
    w.add_uint32("darkformer.n_features", 16)
    w.add_uint32("darkformer.window", window)
    w.add_uint32("darkformer.sinks", sinks)
    w.add_uint32("darkformer.prerope", 0)
    w.add_uint64("darkformer.seed", 5)
    w.add_string("darkformer.base_fingerprint", fingerprint)
    eye = np.broadcast_to(np.float32(scale) * np.eye(hd, dtype=np.float32), (hkv, hd, hd)).copy()
    for l in range(L):
        w.add_tensor(f"darkformer.blk.{l}.{'lambda' if kind == 'darkformer-is' else 'M'}",
                     eye)  # GGUF ne [Hd, Hd, Hkv]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def model_dir(tmp_path):
    """A folder with a copy of the tiny model, m.gguf, and a text to score."""
    assert os.path.exists(TINY), f"{TINY} missing (make builds it)"
    shutil.copy(TINY, tmp_path / "m.gguf")
    (tmp_path / "text.txt").write_text(TEXT)
    return tmp_path


def cli(d, *args):
    """darkserve perplexity on d/m.gguf -> CompletedProcess."""
    assert os.access(BIN, os.X_OK), f"{BIN} missing: build it first (make)"
    return subprocess.run([BIN, "perplexity", "--model", str(d / "m.gguf"),
                           "--file", str(d / "text.txt"), "--limit", "64"] + list(args),
                          capture_output=True, text=True, timeout=RUN_S)


def attention_line(stderr):
    m = re.search(r"^darkserve \w+: attention (.*)$", stderr, re.M)
    assert m, f"no attention line in:\n{stderr}"
    return m.group(1)


def session_attention(srv):
    st, obj, _ = srv.post("/v1/sessions", {})
    assert st == 201, obj
    st, full, _ = srv.json("GET", f"/v1/sessions/{obj['id']}")
    assert st == 200, full
    return full["attention"]


@pytest.mark.parametrize("where", ["adapters/m.darkformer.gguf", "m.darkformer.gguf"])
def test_cli_picks_darkformer_with_the_adapter_beside_the_model(model_dir, where):
    adapter = write_adapter(str(model_dir / where), tiny_info()["fingerprint"])
    r = cli(model_dir)
    assert r.returncode == 0, r.stderr
    line = attention_line(r.stderr)
    assert line.startswith("darkformer (features 16, window 8, sinks 2,"), line
    assert line.endswith(f"adapter {adapter})"), line
    assert "no DARKFormer adapter" not in r.stderr
    assert re.search(r"^perplexity: [0-9.]+ tokens: 64$", r.stdout, re.M), r.stdout
    # generate loads the same way; flags still win over the adapter's values
    g = subprocess.run([BIN, "generate", "--model", str(model_dir / "m.gguf"), "--prompt",
                        "hello", "--max-tokens", "2", "--temperature", "0", "--quiet",
                        "--window", "16"],
                       capture_output=True, text=True, timeout=RUN_S)
    assert g.returncode == 0, g.stderr
    assert attention_line(g.stderr).startswith("darkformer (features 16, window 16, sinks 2,")


def test_adapters_folder_comes_first(model_dir):
    fp = tiny_info()["fingerprint"]
    first = write_adapter(str(model_dir / "adapters" / "m.darkformer.gguf"), fp, window=8)
    write_adapter(str(model_dir / "m.darkformer.gguf"), fp, window=12)
    line = attention_line(cli(model_dir).stderr)
    assert "window 8," in line and line.endswith(f"adapter {first})"), line


def test_cli_falls_back_without_adapter_and_says_so(model_dir):
    r = cli(model_dir)
    assert r.returncode == 0, r.stderr
    m = str(model_dir / "m.gguf")
    want = (f"darkserve: no DARKFormer adapter for {m} (looked for "
            f"{model_dir}/adapters/m.darkformer.gguf, {model_dir}/m.darkformer.gguf); using "
            "performer with sinks + window only (training-free); pass --adapter PATH or "
            "--attn KIND")
    assert want in r.stderr.splitlines(), r.stderr
    line = attention_line(r.stderr)
    assert line.startswith("performer (features 128, window 256, sinks 4, linear branch off,"), line
    assert line.endswith("adapter none)"), line
    # --window is honoured by the fallback too
    line = attention_line(cli(model_dir, "--window", "32").stderr)
    assert line.startswith("performer (features 128, window 32, sinks 4, linear branch off,"), line


def test_cli_explicit_kinds_keep_their_behaviour(model_dir):
    write_adapter(str(model_dir / "m.darkformer.gguf"), tiny_info()["fingerprint"])
    r = cli(model_dir, "--attn", "exact")
    assert r.returncode == 0, r.stderr
    assert attention_line(r.stderr).startswith("exact ("), r.stderr
    assert "no DARKFormer adapter" not in r.stderr
    # performer does not look for an adapter: its own defaults, linear branch on
    line = attention_line(cli(model_dir, "--attn", "performer").stderr)
    assert line.startswith("performer (features 128, window 64, sinks 4, exact"), line
    assert line.endswith("adapter none)"), line
    # auto spelled out is the default
    line = attention_line(cli(model_dir, "--attn", "auto").stderr)
    assert line.startswith("darkformer ("), line
    r = cli(model_dir, "--attn", "softmax")
    assert r.returncode == 2 and "--attn must be auto, exact" in r.stderr, r.stderr


def test_adapter_of_another_model_is_refused(model_dir):
    adapter = write_adapter(str(model_dir / "m.darkformer.gguf"), "0123456789abcdef")
    fp = tiny_info()["fingerprint"]
    r = cli(model_dir)
    assert r.returncode == 1, r.stderr
    assert adapter in r.stderr and "0123456789abcdef" in r.stderr and fp in r.stderr, r.stderr
    assert "found beside the model by --attn auto" in r.stderr, r.stderr
    # exact attention does not need it
    assert cli(model_dir, "--attn", "exact").returncode == 0


def test_serve_defaults_to_darkformer_with_the_adapter(model_dir):
    adapter = write_adapter(str(model_dir / "adapters" / "m.darkformer.gguf"),
                            tiny_info()["fingerprint"])
    srv = Server(model_dir / "srv", str(model_dir / "m.gguf"), attn=None)
    try:
        assert session_attention(srv) == {"kind": "darkformer", "features": 16, "window": 8, "memory": 0, "memory_keep": None,
                                          "memory_heads": 0, "kv_bits": 16}
        log = srv.log_text()
        assert re.search(r"attention darkformer \(features 16, window 8, sinks 2, .*adapter "
                         + re.escape(adapter) + r"\)", log), log
        assert "no DARKFormer adapter" not in log
    finally:
        srv.kill()


def test_serve_falls_back_with_a_warning(model_dir):
    srv = Server(model_dir / "srv", str(model_dir / "m.gguf"), attn=None)
    try:
        assert session_attention(srv) == {"kind": "performer", "features": 128, "window": 256, "memory": 0, "memory_keep": None,
                                          "memory_heads": 0, "kv_bits": 16}
        log = srv.log_text()
        warn = [l for l in log.splitlines() if "no DARKFormer adapter for" in l]
        assert len(warn) == 1 and "WARN" in warn[0].upper(), log
        assert "using performer with sinks + window only (training-free)" in warn[0]
        assert re.search(r"attention performer \(features 128, window 256, sinks 4, "
                         r"linear branch off,", log), log
    finally:
        srv.kill()


def test_serve_attn_exact_is_exact(model_dir):
    write_adapter(str(model_dir / "m.darkformer.gguf"), tiny_info()["fingerprint"])
    srv = Server(model_dir / "srv", str(model_dir / "m.gguf"), attn="exact")
    try:
        assert session_attention(srv)["kind"] == "exact"
        assert "attention exact (" in srv.log_text()
    finally:
        srv.kill()


def test_serve_refuses_an_adapter_of_another_model(model_dir):
    adapter = write_adapter(str(model_dir / "m.darkformer.gguf"), "0123456789abcdef")
    r = subprocess.run([BIN, "serve", "--port", "0", "--model", str(model_dir / "m.gguf"),
                        "--session-dir", str(model_dir / "s")],
                       capture_output=True, text=True, timeout=RUN_S)
    assert r.returncode == 1
    assert adapter in r.stderr and "0123456789abcdef" in r.stderr, r.stderr
    assert tiny_info()["fingerprint"] in r.stderr, r.stderr


def test_system_fingerprint_follows_the_adapter_weights(model_dir):
    """Two adapters with the same settings and seed but another M: another
    system_fingerprint (the learned parameters are hashed, docs/API.md);
    the same adapter again: the same value."""
    path = str(model_dir / "adapters" / "m.darkformer.gguf")
    fps = []
    for i, scale in enumerate([1.0, 0.5, 1.0]):
        write_adapter(path, tiny_info()["fingerprint"], scale=scale)
        srv = Server(model_dir / f"srv{i}", str(model_dir / "m.gguf"), attn=None)
        try:
            st, r, _ = srv.post("/v1/completions", {"prompt": "a", "max_tokens": 1})
            assert st == 200, r
            fps.append(r["system_fingerprint"])
        finally:
            srv.kill()
    assert fps[0] != fps[1] and fps[0] == fps[2], fps


def test_adapter_serving_defaults(model_dir):
    """write_adapter --from adds the serving defaults (darkformer.serve_window,
    darkformer.kv_bits) to a copy of an adapter: darkserve then runs that
    window with 8-bit rows where no flag says otherwise, flags still win,
    and the copy's tensors and other keys are the original's."""
    tool = os.path.join(BUILD, "tools", "write_adapter")
    assert os.access(tool, os.X_OK), f"{tool} missing: build it first (make)"
    src = write_adapter(str(model_dir / "src.gguf"), tiny_info()["fingerprint"], window=8)
    dst = model_dir / "m.darkformer.gguf"
    p = subprocess.run([tool, "--model", str(model_dir / "m.gguf"), "--from", src,
                        "--serve-window", "12", "--kv-bits", "8", "--out", str(dst)],
                       capture_output=True, text=True, timeout=RUN_S)
    assert p.returncode == 0, p.stderr
    r = cli(model_dir)
    assert r.returncode == 0, r.stderr
    line = attention_line(r.stderr)
    assert line.startswith("darkformer (features 16, window 12, sinks 2, 8-bit rows,"), line
    r = cli(model_dir, "--window", "8", "--kv-bits", "16")
    assert r.returncode == 0, r.stderr
    line = attention_line(r.stderr)
    assert line.startswith("darkformer (features 16, window 8, sinks 2,") and "8-bit" not in line
    a, b = gguf.GGUFReader(src), gguf.GGUFReader(str(dst))
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
    for ta, tb in zip(a.tensors, b.tensors):
        assert np.array_equal(np.asarray(ta.data), np.asarray(tb.data)), ta.name
    keys = {f.name for f in b.fields.values()}
    assert {"darkformer.serve_window", "darkformer.kv_bits", "darkformer.window"} <= keys
    # the same numbers as the flags on the original adapter
    os.replace(dst, model_dir / "copy.gguf")
    shutil.copy(src, model_dir / "m.darkformer.gguf")
    flags = cli(model_dir, "--window", "12", "--kv-bits", "8")
    os.replace(model_dir / "copy.gguf", model_dir / "m.darkformer.gguf")
    keys_run = cli(model_dir)
    ppl = lambda out: re.search(r"^perplexity: (\S+)", out, re.M).group(1)
    assert ppl(flags.stdout) == ppl(keys_run.stdout), (flags.stdout, keys_run.stdout)


def test_adapter_serving_memory(model_dir):
    """write_adapter --from --memory N --memory-keep K --memory-heads H: the
    adapter is served with that exact memory where no flag says otherwise
    (the same numbers as the flags), --memory 0 still turns it off, and the
    memory flags are refused where they cannot be honoured."""
    tool = os.path.join(BUILD, "tools", "write_adapter")
    src = write_adapter(str(model_dir / "src.gguf"), tiny_info()["fingerprint"], window=8)
    dst = model_dir / "m.darkformer.gguf"
    p = subprocess.run([tool, "--model", str(model_dir / "m.gguf"), "--from", src,
                        "--memory", "16", "--memory-keep", "recent", "--memory-heads", "0.0",
                        "--out", str(dst)], capture_output=True, text=True, timeout=RUN_S)
    assert p.returncode == 0, p.stderr
    keys_run = cli(model_dir)
    assert keys_run.returncode == 0, keys_run.stderr
    line = attention_line(keys_run.stderr)
    assert "memory 16 (recent, 1 of " in line, line
    r = cli(model_dir, "--memory", "0")
    assert r.returncode == 0 and "memory 16" not in attention_line(r.stderr), r.stderr
    os.replace(dst, model_dir / "copy.gguf")
    shutil.copy(src, model_dir / "m.darkformer.gguf")
    flags = cli(model_dir, "--memory", "16", "--memory-keep", "recent", "--memory-heads", "0.0")
    assert flags.returncode == 0, flags.stderr
    ppl = lambda out: re.search(r"^perplexity: (\S+)", out, re.M).group(1)
    assert ppl(flags.stdout) == ppl(keys_run.stdout), (flags.stdout, keys_run.stdout)
    for args, why in [(["--memory-heads", "0.0"], "needs the exact memory"),
                      (["--memory-keep", "recent"], "needs the exact memory"),
                      (["--memory", "4", "--memory-keep", "oldest"], "recall or recent"),
                      (["--memory", "4", "--memory-heads", "99.0"], "past the model"),
                      (["--memory", "4", "--memory-heads", "0.0,0.0"], "twice")]:
        r = cli(model_dir, *args)
        assert r.returncode != 0 and why in r.stderr, (args, r.stderr)


@pytest.mark.parametrize("args", [
    [],                                        # no serving key to set
    ["--memory", "16"],                        # the memory's keys come together
    ["--memory", "16", "--memory-keep", "oldest", "--memory-heads", "all"],
    ["--serve-window", "12", "--kind", "darkformer"],
    ["--kv-bits", "12"],
    ["--serve-window", "0"],
])
def test_write_adapter_from_refuses(model_dir, args):
    tool = os.path.join(BUILD, "tools", "write_adapter")
    src = write_adapter(str(model_dir / "src.gguf"), tiny_info()["fingerprint"])
    p = subprocess.run([tool, "--model", str(model_dir / "m.gguf"), "--from", src,
                        "--out", str(model_dir / "o.gguf")] + args,
                       capture_output=True, text=True, timeout=RUN_S)
    assert p.returncode == 2 and "usage" in p.stderr, (args, p.stderr)
    assert not (model_dir / "o.gguf").exists()


def test_kv_bits_refused_for_exact_and_bad_values(model_dir):
    write_adapter(str(model_dir / "m.darkformer.gguf"), tiny_info()["fingerprint"])
    r = cli(model_dir, "--attn", "exact", "--kv-bits", "8")
    assert r.returncode != 0 and "8-bit rows" in r.stderr, r.stderr
    r = cli(model_dir, "--kv-bits", "12")
    assert r.returncode != 0 and "bits" in r.stderr, r.stderr


def test_gemma_runs_the_kind_on_its_global_layers(tmp_path):
    """A gemma3 model (the tiny fixture: 7 layers, window 8, layer 5 global):
    without an adapter auto runs exact attention and says why; with one
    written by tools/write_adapter for its global layer beside it, auto runs
    DARKFormer there, and the startup line says the local layers stay exact."""
    from ds_server import TINY_GEMMA
    assert os.path.exists(TINY_GEMMA), f"{TINY_GEMMA} missing (make builds it)"
    shutil.copy(TINY_GEMMA, tmp_path / "m.gguf")
    (tmp_path / "text.txt").write_text(TEXT)
    r = cli(tmp_path)
    assert r.returncode == 0, r.stderr
    line = attention_line(r.stderr)
    assert line.startswith("exact (") and line.endswith(
        "on the 1 global layer, the 6 local ones exact in a ring of their 8-token window)"), line
    assert "sliding-window model" in r.stderr
    # the adapter: M = I for the one global layer (1 KV head, head dim 64)
    mat = tmp_path / "mat.f32"
    np.eye(64, dtype="<f4").tofile(mat)
    os.makedirs(tmp_path / "adapters")
    tool = os.path.join(BUILD, "tools", "write_adapter")

    def write(out, *extra):
        return subprocess.run([tool, "--model", str(tmp_path / "m.gguf"), "--kind", "darkformer",
                               "--features", "16", "--window", "4", "--seed", "0",
                               "--mat", str(mat), "--out", str(out)] + list(extra),
                              capture_output=True, text=True, timeout=RUN_S)

    w = write(tmp_path / "adapters" / "m.darkformer.gguf", "--sinks", "2", "--prerope", "1")
    assert w.returncode == 0, w.stderr
    r = cli(tmp_path)
    assert r.returncode == 0, r.stderr
    line = attention_line(r.stderr)
    assert line.startswith("darkformer (features 16, window 4, sinks 2, pre-RoPE,"), line
    assert line.endswith("on the 1 global layer, the 6 local ones exact in a ring of their "
                         "8-token window)"), line
    assert re.search(r"^perplexity: [0-9.]+ tokens: 64$", r.stdout, re.M), r.stdout
    # a matrix for every layer (what a Llama adapter would carry) is refused
    np.tile(np.eye(64, dtype="<f4"), (7, 1)).tofile(mat)
    w = write(tmp_path / "x.gguf")
    assert w.returncode != 0 and "exactly 4096 float32 values" in w.stderr, w.stderr
