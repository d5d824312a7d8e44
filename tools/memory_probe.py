#!/usr/bin/env python3
"""A learned retention score for the exact memory (research): per layer and
KV head, a linear probe on what a key's row already has (its key before
RoPE, its value, or the layer's input) that predicts how strongly any
query far in the future (beyond the window) will attend to it under exact
attention. Fit on calibration-corpus slices; judged by where the needle's
digit rows of passkey prompts rank among the rows that left the window
(the top λ/T is what a memory of λ rows keeps).

    memory_probe.py fit  --out PROBE.npz [--seqs 8] [--len 2048]
    memory_probe.py rank --probe PROBE.npz [--lengths 1024,4096] [--trials 6]

Research only: nothing in darkserve runs this file. Needs jax
(tools/requirements-convert.txt) and build/darkserve for tokenizing.
"""
import argparse
import json
import os
import sys
import types

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import distill  # noqa: E402
import memory_proto as mp  # noqa: E402

FEATS = ("kv", "x")  # probe inputs: [k, v, 1] of the KV head, or [x̂, 1] the layer's normalized input


def load(a):
    hp, emb, onorm, lw = distill.load_model(a.model)
    cfg, mats, dec, mix, lora, _, _ = distill.load_adapter(a.adapter)
    eps = np.load(a.eps)[:, :, :cfg["n_features"], :].astype(np.float32)
    pa = types.SimpleNamespace(window=cfg["window"], block=64, mem=0, score="full", pos="cap",
                               cap=4096, seed=1, scores=None, force=False, relative=False,
                               sinks_=cfg["sinks"])
    fwd = mp.build(hp, cfg, lw, emb, onorm, mats, dec, mix, lora, eps, pa)
    return hp, cfg, fwd


def inputs(k, v, x, c, kind):
    """The probe's input rows [T][F] for KV head c."""
    one = np.ones((k.shape[1], 1), np.float32)
    if kind == "kv":
        return np.concatenate([k[c], v[c], one], axis=1)
    xn = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + 1e-6)
    return np.concatenate([xn, one], axis=1)


def collect(fwd, ids, far, want_target=True):
    """Per layer: k, v, x (numpy) and the target log max far attention [Hkv][T]."""
    rec = {}

    def hook(l, q, k, v, probs, x):
        ent = {"k": np.asarray(k), "v": np.asarray(v), "x": np.asarray(x)}
        if want_target:
            p = np.asarray(probs()).max(axis=1)  # [c][t][j]
            T = p.shape[-1]
            d = np.arange(T)[:, None] - np.arange(T)[None, :]
            ent["y"] = np.log(np.where(d >= far, p, 0.0).max(axis=1) + 1e-6)  # [c][j]
        rec[l] = ent

    mp.PROBE_HOOK = hook
    mp.DIAG.clear()
    lp = fwd(ids, "exact")
    mp.PROBE_HOOK = None
    return rec, lp


def fit(a):
    hp, cfg, fwd = load(a)
    corpus = open(a.corpus, encoding="utf-8").read()
    rng = np.random.default_rng(a.seed)
    far = cfg["window"] + 64
    X = {kind: {} for kind in FEATS}
    Y = {}
    for s in range(a.seqs):
        off = int(rng.integers(0, len(corpus) - 8 * a.len))
        txt = corpus[off:off + 6 * a.len]
        ids = mp.tokenize(a.bin, a.model, txt[txt.find(" ") + 1:])[:a.len]
        rec, _ = collect(fwd, ids, far)
        n = len(ids) - far - 256  # keys with at least 256 far queries
        for l, e in rec.items():
            for c in range(e["k"].shape[0]):
                Y.setdefault((l, c), []).append(e["y"][c][cfg["sinks"]:n])
                for kind in FEATS:
                    X[kind].setdefault((l, c), []).append(
                        inputs(e["k"], e["v"], e["x"], c, kind)[cfg["sinks"]:n])
        print("seq %d/%d: %d tokens" % (s + 1, a.seqs, len(ids)), flush=True)
    out = {}
    for (l, c), ys in Y.items():
        y = np.concatenate(ys).astype(np.float64)
        nh = len(y) * 3 // 4  # the last quarter held out
        for kind in FEATS:
            x = np.concatenate(X[kind][(l, c)]).astype(np.float64)
            lam = a.ridge * np.eye(x.shape[1])
            lam[-1, -1] = 0
            w = np.linalg.solve(x[:nh].T @ x[:nh] + lam, x[:nh].T @ y[:nh])
            pr = x[nh:] @ w
            rho = spearman(pr, y[nh:])
            top = y[nh:] >= np.quantile(y[nh:], 0.98)
            hit = float(np.mean(pr[top] >= np.quantile(pr, 0.90)))
            out["%s_%d_%d" % (kind, l, c)] = w.astype(np.float32)
            out["rho_%s_%d_%d" % (kind, l, c)] = np.float32(rho)
            out["hit_%s_%d_%d" % (kind, l, c)] = np.float32(hit)
    np.savez(a.out, **out)
    for kind in FEATS:
        r = [float(out[k]) for k in out if k.startswith("rho_" + kind)]
        h = [float(out[k]) for k in out if k.startswith("hit_" + kind)]
        print("%s: held-out Spearman median %.3f, true top 2%% inside predicted top 10%%: %.2f"
              % (kind, np.median(r), np.median(h)))


def spearman(a, b):
    ra = np.argsort(np.argsort(a))
    rb = np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def rank(a):
    hp, cfg, fwd = load(a)
    pr = np.load(a.probe)
    corpus = open(a.corpus, encoding="utf-8").read()
    rng = np.random.default_rng(a.seed)
    W, S = cfg["window"], cfg["sinks"]
    for n in [int(v) for v in a.lengths.split(",")]:
        for d in [float(v) for v in a.depths.split(",")]:
            res = {kind: {"ret": [], "all": []} for kind in FEATS + ("oracle",)}
            for _ in range(a.trials):
                tr = mp.make_trial(rng, corpus, a.bin, a.model, n, d)
                ids = tr["ids"]
                rec, _ = collect(fwd, ids, W + 64, want_target=n <= 4096)
                n0, n1 = tr["needle"]
                dig = set(tr["digits"])
                drows = [u for u in range(n0, n1) if ids[u] in dig]
                hi = tr["ans"] - W
                rows = [tr["ans"] - 1 + j - (len(ids) - 8) for j in range(len(tr["digits"]))]
                for (l, e), (_, p, _) in zip(sorted(rec.items()), mp.DIAG):
                    mass = p[:, :, rows][..., drows].sum(-1).mean(-1).max(-1)
                    for c in range(e["k"].shape[0]):
                        for kind in FEATS + ("oracle",):
                            if kind == "oracle":
                                if "y" not in e:
                                    continue
                                sc = e["y"][c]
                            else:
                                w = pr["%s_%d_%d" % (kind, l, c)]
                                sc = inputs(e["k"], e["v"], e["x"], c, kind) @ w
                            cand = sc[S:hi]
                            pct = [float(np.mean(cand >= sc[u])) for u in drows]
                            res[kind]["all"] += pct
                            if mass[c] > 0.2:
                                res[kind]["ret"] += pct
            for kind, r in res.items():
                if not r["all"]:
                    continue
                ra, al = np.array(r["ret"]), np.array(r["all"])
                print("len %d depth %.1f %-6s retrieval heads: median pct %.3f, top 1%% %.2f, "
                      "top 5%% %.2f | all heads median %.3f, top 5%% %.2f"
                      % (n, d, kind, np.median(ra), np.mean(ra <= 0.01), np.mean(ra <= 0.05),
                         np.median(al), np.mean(al <= 0.05)), flush=True)


def model_args(ap):
    """The options that say which model, adapter, draws, corpus and binary
    load() and the corpus slices use (also tools/head_reach.py's)."""
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--adapter", default="models/adapters/SmolLM2-135M-Instruct.Q4_1.darkformer.gguf")
    ap.add_argument("--eps", default="build/memproto/eps/eps.npy")
    ap.add_argument("--corpus", default="build/memproto/calibration.txt")
    ap.add_argument("--bin", default="build/darkserve")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cmd", choices=["fit", "rank"])
    model_args(ap)
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--len", type=int, default=2048)
    ap.add_argument("--ridge", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--out")
    ap.add_argument("--probe")
    ap.add_argument("--lengths", default="1024")
    ap.add_argument("--depths", default="0.5")
    ap.add_argument("--trials", type=int, default=6)
    a = ap.parse_args()
    if a.cmd == "fit":
        fit(a)
    else:
        rank(a)


if __name__ == "__main__":
    main()
