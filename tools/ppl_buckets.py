#!/usr/bin/env python3
"""Perplexity per stream-position bucket from `darkserve perplexity --nll-out`
files, side by side, as a markdown table (docs/QUALITY.md).

    ppl_buckets.py --control NAME=FILE [NAME=FILE ...] [--max 65536]

Every file holds one float32 per token of the same text (NaN where the run
did not score the token: each chunk's first). A token's bucket is its
position in the *text*, not in a chunk, so an exact run with --chunk 1024
(the control: the original model with a 1K context) and a one-stream run
(--chunk 0) are compared on the same tokens. Only tokens that every run
scored count. Each cell is the bucket's perplexity, and for every run but
the control also its ratio to the control.
"""
import argparse
import math
import sys

import numpy as np

EDGES = [0, 1024, 4096, 8192, 16384, 32768, 65536, 1 << 62]
NAMES = ["0-1K", "1-4K", "4-8K", "8-16K", "16-32K", "32-64K", "64K+"]


def load(spec):
    if "=" not in spec:
        sys.exit("ppl_buckets: expected NAME=FILE, got %r" % spec)
    name, path = spec.rsplit("=", 1)  # a name may hold "=", a path here does not
    return name, np.fromfile(path, dtype="<f4").astype(np.float64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--control", required=True, help="NAME=FILE of the control run")
    ap.add_argument("runs", nargs="+", help="NAME=FILE of the other runs")
    ap.add_argument("--max", type=int, default=0, help="ignore tokens at or past this position")
    a = ap.parse_args()
    runs = [load(a.control)] + [load(s) for s in a.runs]
    n = min(len(x) for _, x in runs)
    if a.max:
        n = min(n, a.max)
    ok = np.ones(n, dtype=bool)
    for _, x in runs:
        ok &= np.isfinite(x[:n])
    pos = np.arange(n)
    buckets = [(NAMES[i], (pos >= EDGES[i]) & (pos < EDGES[i + 1]) & ok)
               for i in range(len(NAMES)) if np.any((pos >= EDGES[i]) & (pos < EDGES[i + 1]) & ok)]
    print("| run | " + " | ".join("%s (%d)" % (b, int(m.sum())) for b, m in buckets) + " | all |")
    print("|---" * (len(buckets) + 2) + "|")
    ctl = runs[0][1][:n]
    for i, (name, x) in enumerate(runs):
        x = x[:n]
        cells = []
        for _, m in buckets + [("all", ok)]:
            p = math.exp(x[m].mean())
            if i == 0:
                cells.append("%.2f" % p)
            else:
                cells.append("%.2f (%.2f)" % (p, p / math.exp(ctl[m].mean())))
        print("| %s | %s |" % (name, " | ".join(cells)))


if __name__ == "__main__":
    main()
