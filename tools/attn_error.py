#!/usr/bin/env python3
"""Attention-output relative error of the random-feature estimators against
exact softmax attention, per layer, on recorded q, k, v (tools/record_qkv over
held-out text: the exact model's activations, never the calibration text).

    attn_error.py --rec DIR --eps EPS.npy --is-adapter IS.gguf
                  [--df m=W:ADAPTER.gguf ...] [--features 64,128,256]
                  [--windows 0,64] [--seqs 4] [--skip 64] [--kinds K,...] [--json OUT.json]

For every layer, KV head and recorded sequence it computes the exact causal
softmax output O* of the heads sharing the KV head and, for each estimator,
m and W, the (hybrid) linear attention output O with the feature draws ε of
the C kernels (EPS.npy from `record_qkv --draws`), in float64; the error is
‖O − O*‖_F / ‖O*‖_F pooled over heads, sequences and query positions ≥ skip
(positions < W are exact in the hybrid: skip = 64 compares W = 0 and W = 64
on the same queries). Estimators: performer (ω = ε), darkformer-is (Λ from
IS.gguf), darkformer (M from the adapter trained for that (m, W), given as
--df 128=64:path.gguf; missing pairs are reported as absent). Prints a
markdown table per W (rows: layers, then the mean over layers).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dfeat  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rec", required=True)
    p.add_argument("--eps", required=True)
    p.add_argument("--is-adapter", required=True)
    p.add_argument("--df", action="append", default=[], help="m=W:adapter.gguf")
    p.add_argument("--features", default="64,128,256")
    p.add_argument("--windows", default="0,64")
    p.add_argument("--seqs", type=int, default=4)
    p.add_argument("--skip", type=int, default=64)
    p.add_argument("--layers", default="")
    p.add_argument("--kinds", default="performer,darkformer-is,darkformer",
                   help="estimators to evaluate (comma-separated)")
    p.add_argument("--json")
    a = p.parse_args()

    meta = dfeat.load_meta(a.rec)
    L, H, Hkv, Hd = meta["n_layer"], meta["n_head"], meta["n_head_kv"], meta["head_dim"]
    gs = H // Hkv
    ms = [int(x) for x in a.features.split(",")]
    ws = [int(x) for x in a.windows.split(",")]
    layers = [int(x) for x in a.layers.split(",")] if a.layers else list(range(L))
    eps = np.load(a.eps, mmap_mode="r")
    lam, _ = dfeat.read_adapter(a.is_adapter, "lambda", L, Hkv, Hd)
    dfs = {}
    for spec in a.df:
        mw, path = spec.split(":", 1)
        m, w = (int(x) for x in mw.split("="))
        dfs[(m, w)] = dfeat.read_adapter(path, "M", L, Hkv, Hd)[0]

    kinds = [kd for kd in ("performer", "darkformer-is", "darkformer") if kd in a.kinds.split(",")]
    # sums of squared errors and of squared references per (kind, m, W, layer)
    res = {}
    t0 = time.time()
    for layer in layers:
        q, k, v = dfeat.load_layer(a.rec, layer)
        q, k, v = q[:a.seqs], k[:a.seqs], v[:a.seqs]
        num = {}
        den = 0.0
        for h in range(Hkv):
            qh, kh, vh = dfeat.head_split(q, k, v, h, gs)
            ref = dfeat.exact_out(qh, kh, vh)
            den += float(np.sum(ref[:, a.skip:] ** 2))
            e = eps[layer, h]
            for m in ms:
                maps = {"performer": dfeat.performer(e, m),
                        "darkformer-is": dfeat.darkformer_is(e, m, lam[layer, h])}
                for w in ws:
                    for kind in kinds:
                        if kind == "darkformer":
                            if (m, w) not in dfs:
                                continue
                            fm = dfeat.darkformer(e, m, dfs[(m, w)][layer, h])
                        else:
                            fm = maps[kind]
                        o = dfeat.linear_out(fm, qh, kh, vh, w)
                        d = o[:, a.skip:] - ref[:, a.skip:]
                        key = (kind, m, w)
                        num[key] = num.get(key, 0.0) + float(np.sum(d * d))
        for key, s in num.items():
            res[key + (layer,)] = float(np.sqrt(s / den))
        print("layer %d done (%.0fs)" % (layer, time.time() - t0), file=sys.stderr, flush=True)

    cols = [(kind, m) for kind in kinds for m in ms]
    short = {"performer": "Performer", "darkformer-is": "DF-IS", "darkformer": "DARKFormer"}
    out = {"rec": a.rec, "seqs": a.seqs, "skip": a.skip, "results": []}
    for w in ws:
        print("\nW = %d: relative error ||O - O*||_F / ||O*||_F (positions >= %d, %d sequences "
              "of %d tokens)\n" % (w, a.skip, a.seqs, meta["len"]))
        print("| layer | " + " | ".join("%s m=%d" % (short[kd], m) for kd, m in cols) + " |")
        print("|---" * (len(cols) + 1) + "|")
        sums = {c: [] for c in cols}
        for layer in layers:
            row = []
            for kd, m in cols:
                r = res.get((kd, m, w, layer))
                row.append("—" if r is None else "%.3f" % r)
                if r is not None:
                    sums[(kd, m)].append(r)
                    out["results"].append({"kind": kd, "m": m, "window": w, "layer": layer,
                                           "rel_err": r})
            print("| %d | %s |" % (layer, " | ".join(row)))
        print("| mean | %s |" % " | ".join(
            "**%.3f**" % np.mean(sums[c]) if sums[c] else "—" for c in cols))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
