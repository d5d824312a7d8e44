"""The adapter's LoRA (core/lora.c, applied by core/model.c) against the
numpy oracle.

On the tiny model, DARKFormer attention whose exact window is longer than
the prompt is exact attention on keys and values rounded to half precision
(test_core_attn_linear checks that equivalence; the oracle rounds them the
same way: LlamaRef.forward(kv_half=True)), so logits_dump with an adapter
carrying a random rank-3 LoRA must give the logits of llama_ref.LlamaRef for
the network whose q, k, v and o weights are W + B·A. The same adapter without the LoRA must not (so
the comparison could not pass with the update ignored). Needs
build/tools/write_adapter and build/tests/helpers/logits_dump.
"""
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_ref import LlamaRef  # noqa: E402
from test_model_oracle import BUILD, REL_TOL_Q8, TINY, compare, require  # noqa: E402

WRITE = os.path.join(BUILD, "tools", "write_adapter")
DUMP = os.path.join(BUILD, "tests", "helpers", "logits_dump")
RANK = 3
PARTS = ("q", "k", "v", "o")


def write_adapter(ref, tmp_path, lora):
    L, H, Hkv, Hd, D = ref.n_layer, ref.n_head, ref.n_head_kv, ref.hd, ref.d
    mat = tmp_path / "mat.f32"
    np.tile(np.eye(Hd, dtype=np.float32), (L, Hkv, 1, 1)).tofile(mat)
    out = tmp_path / ("lora.gguf" if lora else "plain.gguf")
    cmd = [WRITE, "--model", TINY, "--kind", "darkformer", "--features", "16", "--window", "64",
           "--mat", str(mat), "--out", str(out)]
    if lora:
        for n, arrs in lora.items():
            arrs[0].astype(np.float32).tofile(tmp_path / f"lo.{n}_a.f32")
            arrs[1].astype(np.float32).tofile(tmp_path / f"lo.{n}_b.f32")
        cmd += ["--lora", str(tmp_path / "lo"), "--lora-rank", str(RANK)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return out


def dump(adapter, ids, tmp_path, chunk=0, with_mode=False):
    (tmp_path / "ids.txt").write_text(" ".join(map(str, ids)))
    out = tmp_path / "logits.bin"
    cmd = [DUMP, TINY, "--tokens-file", str(tmp_path / "ids.txt"), "--logits", str(out),
           "--adapter", str(adapter)]
    if chunk:
        cmd += ["--chunk", str(chunk)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    logits = np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)
    if not with_mode:
        return logits
    mode = next((ln.split()[1] for ln in p.stdout.splitlines() if ln.startswith("prompt: ")), None)
    assert mode in ("int8", "bf16t", "f32"), p.stdout[:200]
    return logits, mode


def test_lora_matches_merged_weights(tmp_path):
    for path, what in ((TINY, "tiny model"), (WRITE, "write_adapter"), (DUMP, "logits_dump")):
        require(path, what)
    ref = LlamaRef(TINY)
    L, D = ref.n_layer, ref.d
    qd, kvd = ref.n_head * ref.hd, ref.n_head_kv * ref.hd
    dims = {"q": (D, qd), "k": (D, kvd), "v": (D, kvd), "o": (qd, D)}
    rng = np.random.default_rng(5)
    lora = {}
    for n in PARTS:
        i, o = dims[n]
        w = np.stack([ref.layers[l]["attn_" + ("output" if n == "o" else n)] for l in range(L)])
        scale = 0.3 * np.abs(w).mean()  # B·A about a third of the weights' size
        lora[n] = (rng.standard_normal((L, RANK, i)) / np.sqrt(i),
                   rng.standard_normal((L, o, RANK)) * scale)
    ids = rng.integers(3, ref.n_vocab, size=40).tolist()
    with_lora = write_adapter(ref, tmp_path, lora)
    plain = write_adapter(ref, tmp_path, None)

    base = ref.forward(ids, kv_half=True)
    for n in PARTS:
        a, b = lora[n]
        key = "attn_" + ("output" if n == "o" else n)
        for l in range(L):
            ref.layers[l][key] = ref.layers[l][key] + b[l].astype(np.float32).astype(np.float64) \
                @ a[l].astype(np.float32).astype(np.float64)
    merged = ref.forward(ids, kv_half=True)
    assert np.abs(merged - base).max() > 0.05 * np.abs(base).max(), "the LoRA changes too little"

    c_lora, mode = dump(with_lora, ids, tmp_path, with_mode=True)
    compare(c_lora, merged, f"LoRA prefill vs merged oracle ({mode})", tiles=mode == "bf16t")
    # decode rows (one token per call) multiply 8-bit activations: the
    # model-oracle tolerance for them; no argmax check (the tiny model's
    # random logits have near-ties that 8-bit rounding flips)
    dec = dump(with_lora, ids, tmp_path, chunk=1).astype(np.float64)
    rel = (np.abs(dec - merged).max(axis=1) / np.abs(merged).max(axis=1)).max()
    print(f"LoRA decode rows vs merged oracle: max relative logit difference {rel:.3e}")
    assert rel <= REL_TOL_Q8
    c_plain = dump(plain, ids, tmp_path)
    compare(c_plain, base, "no LoRA vs plain oracle", tiles=mode == "bf16t")
    rel = np.abs(c_plain.astype(np.float64) - merged).max() / np.abs(merged).max()
    assert rel > 10 * 1e-3, f"without the LoRA the C logits are within {rel:.2e} of the merged oracle"
