"""Oracle for core/sample at the real vocabulary size (V = 49152): numpy,
float64, written from the pipeline definition in core/sample.h, against the C
sampler driven through tests/helpers/sample_dump. Also re-implements the RNG
(splitmix64 seeding, xoshiro256**, 53-bit uniforms, as core/rng.h specifies)
so the drawn token itself is checked, not only the distribution.
"""
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("DARKSERVE_BUILD", ROOT / "build"))
HELPER = BUILD / "tests" / "helpers" / "sample_dump"
HISTORY = 256
M64 = (1 << 64) - 1


def first_uniform(seed):
    x = seed & M64
    s = []
    for _ in range(4):
        x = (x + 0x9E3779B97F4A7C15) & M64
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        s.append(z ^ (z >> 31))
    rotl = lambda v, k: ((v << k) | (v >> (64 - k))) & M64
    result = (rotl((s[1] * 5) & M64, 7) * 9) & M64
    return (result >> 11) * 2.0 ** -53


def oracle(p, hist, logits):
    """Returns (ids, probs, margin, logprobs over V)."""
    V = logits.size
    z = logits.astype(np.float64)
    last = HISTORY if p["last_n"] < 0 else p["last_n"]
    window = hist[-HISTORY:]
    window = window[len(window) - min(last, len(window)):]
    ids_in, counts = np.unique(np.array(window, dtype=np.int64), return_counts=True)
    for t, c in zip(ids_in, counts):
        if t >= V:
            continue
        v = z[t]
        v = v / p["repeat"] if v > 0 else v * p["repeat"]
        v = v - c * p["frequency"] - p["presence"]
        z[t] = np.float32(v)
    t_eff = p["T"] if p["T"] > 0 else 1.0
    zmax = z.max()
    with np.errstate(invalid="ignore"):
        lp = (z - zmax) / t_eff
    lp = lp - np.log(np.exp(lp).sum())
    order = np.lexsort((np.arange(V), -z))  # logit descending, id ascending
    if p["T"] == 0:
        return np.array([order[0]]), np.array([1.0]), np.inf, lp
    margin = np.inf
    keep = order
    if 0 < p["top_k"] < V:
        keep = keep[:p["top_k"]]
    if p["top_p"] < 1:
        w = np.exp(z[keep] - zmax)
        cum = np.cumsum(w / w.sum())
        margin = min(margin, np.abs(cum - p["top_p"]).min())
        cut = int(np.argmax(cum >= p["top_p"])) + 1 if (cum >= p["top_p"]).any() else keep.size
        keep = keep[:cut]
    if p["min_p"] > 0:
        thr = zmax + np.log(p["min_p"])
        if keep.size > 1:
            margin = min(margin, np.abs(z[keep[1:]] - thr).min())
        keep = np.concatenate([keep[:1], keep[1:][z[keep[1:]] >= thr]])
    keep = np.sort(keep)
    keep = keep[np.isfinite(z[keep])]
    w = np.exp((z[keep] - zmax) / p["T"])
    return keep, w / w.sum(), margin, lp


def run_helper(p, hist, logits):
    if not HELPER.exists():
        pytest.fail(f"{HELPER} is missing: build it with `make BUILD=<dir> "
                    f"<dir>/tests/helpers/sample_dump` and set DARKSERVE_BUILD=<dir>")
    head = (f"{p['T']!r} {p['top_k']} {p['top_p']!r} {p['min_p']!r} {p['repeat']!r} "
            f"{p['last_n']} {p['presence']!r} {p['frequency']!r} {p['seed']} {p['n_logprobs']}\n")
    body = (f"{len(hist)} " + " ".join(map(str, hist)) + f"\n{logits.size}\n"
            + " ".join("%.9g" % x for x in logits) + "\n")
    proc = subprocess.run([str(HELPER), "run"], input=(head + body).encode(),
                          capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    lines = proc.stdout.decode().split("\n")
    n = int(lines[0].split()[1])
    dist = np.array([[float(v) for v in l.split()] for l in lines[1:1 + n]])
    tok = lines[1 + n].split()
    nt = int(lines[2 + n].split()[1])
    top = [(int(l.split()[0]), float(l.split()[1])) for l in lines[3 + n:3 + n + nt]]
    return dist[:, 0].astype(np.int64), dist[:, 1], int(tok[1]), float(tok[2]), top


BASE = dict(T=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat=1.0, last_n=64, presence=0.0,
            frequency=0.0, seed=11, n_logprobs=0)
CASES = [
    dict(),
    dict(T=0.0, n_logprobs=5),
    dict(T=0.7, top_k=40),
    dict(T=0.8, top_p=0.95),
    dict(T=1.0, top_p=0.5, n_logprobs=20),
    dict(T=1.3, top_p=0.99, min_p=0.02),
    dict(T=0.8, top_k=40, top_p=0.9, min_p=0.05),
    dict(T=0.9, min_p=0.1),
    dict(T=0.8, top_p=0.95, repeat=1.3, presence=0.5, frequency=0.4, last_n=-1, n_logprobs=3),
    dict(T=1.0, repeat=0.7, presence=-1.0, frequency=-0.5, last_n=16),
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("shape", ["peaked", "flat"])
def test_sampler_matches_numpy_oracle(case, shape):
    rng = np.random.default_rng(case * 10 + (shape == "flat"))
    V = 49152
    logits = (rng.standard_normal(V) * 2.0).astype(np.float32)
    if shape == "peaked":
        logits[rng.integers(0, V, 8)] += np.arange(14, 6, -1, dtype=np.float32)
    logits[rng.integers(0, V, 3)] = -np.inf
    p = dict(BASE, **CASES[case])
    p["seed"] = 1000 + case
    # History: random ids (some >= V, ignored), then the current top tokens
    # repeated, newest, so that penalties bite.
    top = np.argsort(-logits)[:6].tolist()
    hist = rng.integers(0, V + 100, 300).tolist() + [top[i % 6] for i in range(40)]

    ids, probs, margin, lp = oracle(p, hist, logits)
    c_ids, c_probs, tok, tok_lp, c_top = run_helper(p, hist, logits)
    if margin > 1e-7:
        assert np.array_equal(c_ids, ids), f"survivors differ: {c_ids.size} vs {ids.size}"
        assert np.abs(c_probs - probs).max() < 1e-6
    # The drawn token, from the same first uniform.
    if p["T"] == 0:
        want = ids[0]
    else:
        u = first_uniform(p["seed"])
        cum = np.cumsum(probs)
        want = ids[min(int(np.searchsorted(cum, u, side="right")), ids.size - 1)]
        if np.abs(cum - u).min() < 1e-7:
            want = tok  # too close to a boundary to call
    assert tok == want
    assert abs(tok_lp - lp[tok]) < 1e-4 * max(1.0, abs(lp[tok]))
    # Alternatives: the n most likely under the reported distribution.
    assert len(c_top) == p["n_logprobs"]
    order = np.lexsort((np.arange(V), -lp))[:p["n_logprobs"]]
    assert [t for t, _ in c_top] == order.tolist()
    for t, l in c_top:
        assert abs(l - lp[t]) < 1e-4 * max(1.0, abs(lp[t]))
