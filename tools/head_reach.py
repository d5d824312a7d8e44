#!/usr/bin/env python3
"""How far each attention head reaches (research): per layer and KV head,
the share of exact attention's probability mass that falls on keys more
than d tokens back, on calibration-corpus slices, for several d. A head
whose mass stays close is served well by a short exact window; one that
reaches far needs its exact rows kept longer. The table this writes is what
allocates the per-head exact spans (docs/QUALITY.md, "Per-head reach").

    head_reach.py --out REACH.json [--seqs 4] [--len 4096] [--dists 256,512,1024,2048]

Keys among the first --sinks tokens (kept exact by the state whatever the
window) are not counted. For each sequence the queries are the last half of its positions (so every
distance up to len/2 is available to each of them); a KV head's figure is
the mean over those queries and over its query heads, and "p99" is the
99th percentile over the queries of the per-query mass (the heads that
reach far only now and then, such as copying heads). The model is the
original one (exact attention, no adapter LoRA). Research only: nothing in
darkserve runs this file. Needs jax (tools/requirements-convert.txt) and
build/darkserve for tokenizing.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memory_probe  # noqa: E402
import memory_proto as mp  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    memory_probe.model_args(ap)
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--len", type=int, default=4096)
    ap.add_argument("--dists", default="256,512,1024,2048")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--sinks", type=int, default=16, help="first tokens not counted as far")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    _, _, fwd = memory_probe.load(a)
    dists = [int(v) for v in a.dists.split(",")]
    corpus = open(a.corpus, encoding="utf-8").read()
    rng = np.random.default_rng(a.seed)
    acc = {}  # (l, c, d) -> list of per-query masses

    def hook(l, q, k, v, probs, x):
        p = np.asarray(probs())  # [c][g][t][j]
        T = p.shape[-1]
        t0 = T // 2
        pq = p[:, :, t0:, :]
        # cumulative mass from the oldest key: mass on keys j <= t − d − 1
        # the sinks (the first S tokens, which the state keeps exact anyway
        # and which draw most of many heads' mass) do not count as far
        pq = pq.copy()
        pq[..., :a.sinks] = 0.0
        cum = np.cumsum(pq, axis=-1)
        tt = np.arange(t0, T)
        for d in dists:
            idx = tt - d - 1
            far = np.where(idx >= 0, np.take_along_axis(
                cum, np.broadcast_to(np.maximum(idx, 0)[None, None, :, None],
                                     cum.shape[:3] + (1,)), axis=-1)[..., 0], 0.0)
            for c in range(far.shape[0]):
                acc.setdefault((l, c, d), []).append(far[c].mean(axis=0))

    mp.PROBE_HOOK = hook
    for s in range(a.seqs):
        off = int(rng.integers(0, len(corpus) - 8 * a.len))
        txt = corpus[off:off + 6 * a.len]
        ids = mp.tokenize(a.bin, a.model, txt[txt.find(" ") + 1:])[:a.len]
        mp.DIAG.clear()
        fwd(ids, "exact")
        print("seq %d/%d: %d tokens" % (s + 1, a.seqs, len(ids)), flush=True)
    mp.PROBE_HOOK = None
    out = {"model": os.path.basename(a.model), "seqs": a.seqs, "len": a.len, "dists": dists,
           "heads": []}
    for (l, c, d), xs in sorted(acc.items()):
        x = np.concatenate(xs)
        out["heads"].append({"layer": l, "kv_head": c, "dist": d, "mean": float(x.mean()),
                             "p99": float(np.quantile(x, 0.99))})
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    for d in dists:
        m = sorted(((h["mean"], h["layer"], h["kv_head"]) for h in out["heads"] if h["dist"] == d),
                   reverse=True)
        print("d=%d: top heads %s" % (d, ", ".join("%d.%d %.3f" % (l, c, v) for v, l, c in m[:12])))


if __name__ == "__main__":
    main()
