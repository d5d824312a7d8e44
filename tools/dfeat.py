"""Shared numpy code of the conversion tools (tools/convert.py,
tools/attn_error.py): loading recordings of tools/record_qkv, the exact
attention they came from, the three feature maps of core/attn/features.h and the
(hybrid) linear attention output, evaluated in float64 in the log domain.

Notation as in DESIGN.md §3: Hd head dim, x̂ = x·Hd^(-1/4), M features,
W hybrid window. Shapes: q [N][T][H][Hd], k and v [N][T][Hkv][Hd].
"""
import json
import os

import numpy as np


def load_meta(rec):
    with open(os.path.join(rec, "meta.json")) as f:
        return json.load(f)


def load_layer(rec, layer, mmap=True):
    mode = "r" if mmap else None
    q = np.load(os.path.join(rec, "q_%02d.npy" % layer), mmap_mode=mode)
    k = np.load(os.path.join(rec, "k_%02d.npy" % layer), mmap_mode=mode)
    v = np.load(os.path.join(rec, "v_%02d.npy" % layer), mmap_mode=mode)
    return q, k, v


def load_eps(rec):
    return np.load(os.path.join(rec, "eps.npy"), mmap_mode="r")


def head_split(q, k, v, h, gs):
    """Queries of the gs heads that share KV head h: [N][T][gs][Hd]; k, v [N][T][Hd]."""
    return (np.asarray(q[:, :, h * gs:(h + 1) * gs, :], dtype=np.float64),
            np.asarray(k[:, :, h, :], dtype=np.float64),
            np.asarray(v[:, :, h, :], dtype=np.float64))


def exact_out(qh, kh, vh):
    """Causal softmax attention of one KV head's query group: [N][T][gs][Hd]."""
    n, t, gs, hd = qh.shape
    out = np.empty_like(qh)
    mask = np.tril(np.ones((t, t), dtype=bool))
    for s in range(n):
        sc = np.einsum("tgd,ud->tgu", qh[s], kh[s]) / np.sqrt(hd)
        sc = np.where(mask[:, None, :], sc, -np.inf)
        sc -= sc.max(axis=-1, keepdims=True)
        p = np.exp(sc)
        p /= p.sum(axis=-1, keepdims=True)
        out[s] = np.einsum("tgu,ud->tgd", p, vh[s])
    return out


# ---- feature maps (float64 mirrors of core/attn/features.c) ----

class FeatureMap:
    """φ_i(x) = exp(ω_i·ŷ − |ŷ|²/2 + b_i), ŷ = mat·x̂ (mat None: ŷ = x̂)."""

    def __init__(self, omega, bias, mat=None):
        self.omega = np.asarray(omega, dtype=np.float64)  # [M][Hd]
        self.bias = np.asarray(bias, dtype=np.float64)    # [M]
        self.mat = None if mat is None else np.asarray(mat, dtype=np.float64)  # [Hd][Hd]

    def logits(self, x):
        """Full feature logits of rows x [..][Hd]: [..][M]."""
        hd = x.shape[-1]
        y = x * hd ** -0.25
        if self.mat is not None:
            y = y @ self.mat.T
        return y @ self.omega.T - 0.5 * np.sum(y * y, axis=-1, keepdims=True) + self.bias


def performer(eps, m):
    e = np.asarray(eps[:m], dtype=np.float64)
    return FeatureMap(e, np.full(m, -0.5 * np.log(m)))


def darkformer(eps, m, mat):
    e = np.asarray(eps[:m], dtype=np.float64)
    return FeatureMap(e, np.full(m, -0.5 * np.log(m)), mat)


LAMBDA_MAX = 0.49  # CORE_FEATURES_LAMBDA_MAX


def is_proposal(lam):
    """A = Σ*^(1/2) and log|Σ*| for Σ* = (I+2Λ)(I−2Λ)⁻¹, eigenvalues of Λ
    clamped into [0, LAMBDA_MAX] as core_features_is_proposal does."""
    lam = 0.5 * (np.asarray(lam, dtype=np.float64) + np.asarray(lam, dtype=np.float64).T)
    w, u = np.linalg.eigh(lam)
    w = np.clip(w, 0.0, LAMBDA_MAX)
    sig = (1 + 2 * w) / (1 - 2 * w)
    return (u * np.sqrt(sig)) @ u.T, float(np.sum(np.log(sig)))


def darkformer_is(eps, m, lam):
    a, logdet = is_proposal(lam)
    e = np.asarray(eps[:m], dtype=np.float64)
    om = e @ a.T
    b = 0.25 * logdet - 0.25 * np.sum(om * om, axis=1) + 0.25 * np.sum(e * e, axis=1)
    return FeatureMap(om, b - 0.5 * np.log(m))


def lse_pair(aq, ak):
    """log Σ_i exp(aq[r,i] + ak[j,i]) for rows r of aq [R][M], j of ak [T][M]: [R][T]."""
    mq = aq.max(axis=1, keepdims=True)
    mk = ak.max(axis=1, keepdims=True)
    p = np.exp(aq - mq) @ np.exp(ak - mk).T
    with np.errstate(divide="ignore"):
        return np.log(p) + mq + mk.T


def linear_out(fm, qh, kh, vh, window):
    """(Hybrid) linear attention output of one query group [N][T][gs][Hd]: the
    query at τ weighs keys j ≤ τ−W by κ̂ = φ(q)·φ(k) and keys τ−W < j ≤ τ by
    exp(q̂·k̂), one normalization (core/attn/attn_linear.c)."""
    n, t, gs, hd = qh.shape
    out = np.empty_like(qh)
    tau = np.arange(t)[:, None]
    j = np.arange(t)[None, :]
    lin = j <= tau - window            # [T][T]
    win = (j > tau - window) & (j <= tau)
    for s in range(n):
        aq = fm.logits(qh[s].reshape(t * gs, hd))
        ak = fm.logits(kh[s])
        lk = lse_pair(aq, ak).reshape(t, gs, t)
        sc = np.einsum("tgd,ud->tgu", qh[s], kh[s]) / np.sqrt(hd)
        lw = np.where(lin[:, None, :], lk, np.where(win[:, None, :], sc, -np.inf))
        mx = lw.max(axis=-1, keepdims=True)
        mx = np.where(np.isfinite(mx), mx, 0.0)
        p = np.exp(lw - mx)
        den = p.sum(axis=-1, keepdims=True)
        out[s] = np.einsum("tgu,ud->tgd", p, vh[s]) / np.where(den > 0, den, 1.0)
    return out


def rel_err(o, ref, skip=0):
    """‖o − ref‖_F / ‖ref‖_F over positions ≥ skip."""
    d = o[:, skip:] - ref[:, skip:]
    return float(np.sqrt(np.sum(d * d) / np.sum(ref[:, skip:] ** 2)))


def read_adapter(path, what, n_layer, n_kv, hd):
    """[L][Hkv][Hd][Hd] float32 of darkformer.blk.N.<what> from an adapter GGUF,
    plus its darkformer.* keys."""
    import gguf
    r = gguf.GGUFReader(path)
    keys = {}
    for f in r.fields.values():
        if f.name.startswith("darkformer."):
            val = f.parts[f.data[0]]
            keys[f.name] = (bytes(val).decode() if f.types[0] == gguf.GGUFValueType.STRING
                            else int(val[0]))
    out = np.zeros((n_layer, n_kv, hd, hd), dtype=np.float32)
    names = {t.name: t for t in r.tensors}
    for layer in range(n_layer):
        t = names["darkformer.blk.%d.%s" % (layer, what)]
        out[layer] = np.asarray(t.data, dtype=np.float32).reshape(n_kv, hd, hd)
    return out, keys
