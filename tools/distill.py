#!/usr/bin/env python3
"""DARKFormer v2 stage 2: end-to-end distillation of the adapter's small
parameters against the exact model's next-token distribution.

    distill.py --model M.gguf --adapter IN.gguf --ids IDS.npy --eps EPS.npy
               --out PREFIX [--ckpt CKPT.npz] [--log LOG.json]
               [--steps 200] [--len 1024] [--batch 1] [--lr 0.0002]
               [--lr-small 0.005] [--lora R] [--lr-lora 0.001] [--val-seqs 4]
               [--val-every 20] [--seed 1] [--lr-gate 0] [--lr-draws 0]

Stage 1 (convert.py train2) fits every layer alone to the exact layer's
output on recorded q, k, v. Errors then compound through 30 layers, and a
small output error in one head can matter more for the next token than a
large one elsewhere. Stage 2 runs the whole model: the student is the model
with the converted attention exactly as core/attn/attn_linear.c computes it
(the first S tokens exact as sinks, moved next to the window once t ≥
W + S − 1; the last W keys exact; the older keys through the positive
random features of M applied to q and k before RoPE, decayed by γ per KV
head, weighted by e^β per query head, all under one softmax
normalization), the teacher is the same weights with exact attention over
the whole sequence (what `--attn exact --chunk LEN` scores). The loss is
KL(teacher ‖ student) of the next-token distributions, averaged over the
positions t ≥ W + S (earlier positions are exact in both). M, γ and β are
trained, and with --lora R a rank-R update B·A of the q, k, v and o
projections of every layer (A random, B zero at the start; core/lora.h
applies it with the adapter); the model's weights themselves stay as they
are (tied embeddings untouched).

IN.gguf gives the starting parameters and the settings (features m, window
W, sinks S, pre-RoPE; only pre-RoPE adapters are supported). IDS.npy is the
token ids of a calibration text (tools/record_qkv --ids-out; never a
held-out text); training sequences are random LEN-token spans of it except
its last val-seqs × LEN tokens, which are the validation set: its mean KL
is evaluated every val-every steps and the best parameters are kept (early
stopping). EPS.npy holds the feature draws ε of the adapter's seed
(tools/record_qkv --draws m). Outputs PREFIX.{mat,decay,mix}.f32 (and with
--lora R PREFIX.lora.{q,k,v,o}_{a,b}.f32) for build/tools/write_adapter,
from the best parameters by validation KL; --write-each also writes
PREFIX.stepN.* at every validated step N (the shipped default was chosen
among those by perplexity on a calibration slice, models/adapters/README.md).
--lr-gate and --lr-draws are probes of two variants the C runtime does not
implement (docs/journal/quality-log.md, "What was tried"): a data-dependent decay gate
γ_t = 0.5 + 0.5 σ(θ + u·k_t/√Hd) from each token's pre-RoPE key (u per KV
head, from 0), and the feature draws ε trained as parameters; they write
PREFIX.gate.f32 / PREFIX.draws.f32, which write_adapter does not take.
Resumable: CKPT holds the parameters, Adam's moments, the best parameters
and the step; a rerun continues from it.
Flexformer (--adapter of kind flexformer-s or flexformer-n, written by
write_adapter from convert.py train2 --kind): the same recipe with the
learned frequencies ω (and -n's ω_2 and τ) in M's place, trained with
--lr's step, and the student's mixing as core/attn/attn_linear.c computes it for
signed features (tools/flexfeat.py); outputs PREFIX.omega.f32 (-n: also
PREFIX.omega2.f32, PREFIX.tau.f32) instead of PREFIX.mat.f32.
Needs jax (tools/requirements-convert.txt).

    distill.py --model M.gguf --adapter A.gguf --eps EPS.npy --check IDS.npy \
               --nll-exact EX.f32 --nll-converted DF.f32 [--len 1024]

checks this student and teacher against the C kernels: their mean NLL on
the first LEN tokens of IDS (positions past W + S) must equal what
`darkserve perplexity --chunk LEN --nll-out` wrote for the same text with
`--attn exact` (EX) and with the adapter (DF), to 1e-4.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flexfeat  # noqa: E402


def field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def load_model(path):
    """Dequantized float32 weights, stacked per layer, and the hyperparameters."""
    import gguf
    r = gguf.GGUFReader(path)
    k = lambda n, d=None: field(r, "llama." + n, d)  # noqa: E731
    hp = {"L": int(k("block_count")), "D": int(k("embedding_length")),
          "H": int(k("attention.head_count")), "base": float(k("rope.freq_base", 10000.0)),
          "eps": float(k("attention.layer_norm_rms_epsilon", 1e-5))}
    hp["Hkv"] = int(k("attention.head_count_kv", hp["H"]))
    hp["Hd"] = int(k("attention.key_length", hp["D"] // hp["H"]))
    hp["n_rot"] = int(k("rope.dimension_count", hp["Hd"]))
    if k("rope.scaling.type") not in (None, "none"):
        sys.exit("distill: RoPE scaling is not supported")
    t = {x.name: x for x in r.tensors}

    def w(name):
        x = t[name]
        return np.asarray(gguf.quants.dequantize(x.data, x.tensor_type), dtype=np.float32)

    if "output.weight" in t:
        sys.exit("distill: only models with tied embeddings are supported")
    names = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
             "ffn_up", "ffn_down")
    lw = {n: np.stack([w("blk.%d.%s.weight" % (i, n)) for i in range(hp["L"])]) for n in names}
    return hp, w("token_embd.weight"), w("output_norm.weight"), lw


def load_adapter(path):
    import gguf
    r = gguf.GGUFReader(path)
    kind = field(r, "darkformer.kind")
    if kind not in ("darkformer",) + flexfeat.KINDS or int(field(r, "darkformer.format_version")) != 2:
        sys.exit("distill: %s is not a format-2 DARKFormer or Flexformer adapter" % path)
    cfg = {x: int(field(r, "darkformer." + x, 0)) for x in
           ("n_features", "window", "sinks", "prerope", "seed")}
    cfg["kind"] = kind
    if not cfg["prerope"]:
        sys.exit("distill: only pre-RoPE adapters are supported")
    cfg["fingerprint"] = field(r, "darkformer.base_fingerprint")
    t = {x.name: np.asarray(x.data, dtype=np.float32) for x in r.tensors}
    L = 1 + max(int(n.split(".")[2]) for n in t)
    if flexfeat.is_trig(kind):  # the frequencies take M's place (tools/flexfeat.py)
        hd = t["darkformer.blk.0.omega"].shape[-1]
        mats = np.stack([t["darkformer.blk.%d.omega" % i] for i in range(L)])
        rho = np.zeros(mats.shape[:2], dtype=np.float32)
        if kind == "flexformer-n":
            mats = np.stack([mats, np.stack([t["darkformer.blk.%d.omega2" % i]
                                             for i in range(L)])], axis=2)
            rho = np.log(np.stack([t["darkformer.blk.%d.tau" % i] for i in range(L)])
                         / (2 * np.sqrt(hd))).astype(np.float32)
        cfg["rho"] = rho
    else:
        mats = np.stack([t["darkformer.blk.%d.M" % i] for i in range(L)])
    dec = np.stack([t["darkformer.blk.%d.decay" % i] for i in range(L)])
    mix = np.stack([t["darkformer.blk.%d.mix" % i] for i in range(L)])
    lora = None
    if "darkformer.blk.0.lora_q_a" in t:  # core/lora.h: A [r][in], B [out][r] per layer
        lora = [np.stack([t["darkformer.blk.%d.lora_%s" % (i, n)] for i in range(L)])
                for n in LORA_NAMES]
    gate = None  # a data-dependent decay gate (docs/ADAPTER.md)
    if "darkformer.blk.0.gate" in t:
        gate = np.stack([t["darkformer.blk.%d.gate" % i].reshape(-1, mats.shape[-1])
                         for i in range(L)])
    draws = None  # trained feature draws replace the seed's (docs/ADAPTER.md)
    if "darkformer.blk.0.draws" in t:
        draws = np.stack([t["darkformer.blk.%d.draws" % i].reshape(-1, cfg["n_features"], mats.shape[-1])
                          for i in range(L)])
    return cfg, mats, dec, mix, lora, gate, draws


LORA_NAMES = ("q_a", "q_b", "k_a", "k_b", "v_a", "v_b", "o_a", "o_b")


def lora_init(hp, r, rng):
    """A [L][r][in] small random, B [L][out][r] zero: the update starts at 0."""
    L, D, qd, kvd = hp["L"], hp["D"], hp["H"] * hp["Hd"], hp["Hkv"] * hp["Hd"]
    shapes = {"q": (D, qd), "k": (D, kvd), "v": (D, kvd), "o": (qd, D)}
    out = []
    for n in ("q", "k", "v", "o"):
        i, o = shapes[n]
        out += [(rng.standard_normal((L, r, i)) / np.sqrt(i)).astype(np.float32),
                np.zeros((L, o, r), dtype=np.float32)]
    return out


def build(hp, cfg, T):
    """Returns jitted (loss_and_grad, val_loss) over params (M, θ, β[, LoRA][, ε])."""
    import jax
    import jax.numpy as jnp

    L, H, Hkv, Hd, nr = hp["L"], hp["H"], hp["Hkv"], hp["Hd"], hp["n_rot"]
    gs, m, W, S = H // Hkv, cfg["n_features"], cfg["window"], cfg["sinks"]
    learn_draws = int(cfg.get("learn_draws", 0))
    learn_gate = int(cfg.get("learn_gate", 0))
    jw = np.minimum(np.arange(T) + W, T - 1)  # where key j left the window
    inv = hp["base"] ** (-2.0 * np.arange(nr // 2) / nr)
    bias, sc, NEG = -0.5 * np.log(m), Hd ** -0.25, -1e30

    def cs(pos):
        ang = np.asarray(pos, dtype=np.float64)[:, None] * inv[None, :]
        return jnp.asarray(np.cos(ang), jnp.float32), jnp.asarray(np.sin(ang), jnp.float32)

    def rope(x, c, s):
        """x [..][T][Hd] rotated in consecutive pairs of the first n_rot dims."""
        a, b = x[..., 0:nr:2], x[..., 1:nr:2]
        y = jnp.stack([a * c - b * s, a * s + b * c], axis=-1).reshape(x.shape[:-1] + (nr,))
        return jnp.concatenate([y, x[..., nr:]], axis=-1)

    c_t, s_t = cs(np.arange(T))
    c_k, s_k = cs(np.arange(S) + 1 - W - S)  # sinks moved next to the window
    tt = np.arange(T)[:, None]
    jj = np.arange(T)[None, :]
    vis = jnp.asarray(jj <= tt)
    lin = jnp.asarray((jj <= tt - W) & (jj >= S))
    shifted = jnp.asarray(tt >= W + S - 1)
    dist = jnp.asarray(np.maximum(tt - W - jj, 0).astype(np.float32))

    def rms(x, w):
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + hp["eps"]) * w

    def lora(x, lo, name):
        """x (A x)ᵀBᵀ: the low-rank update of projection name, 0 without LoRA."""
        return 0.0 if lo is None else (x @ lo[name + "_a"].T) @ lo[name + "_b"].T

    def qkv(x, ly, lo=None):
        xn = rms(x, ly["attn_norm"])
        q = (xn @ ly["attn_q"].T + lora(xn, lo, "q")).reshape(T, Hkv, gs, Hd).transpose(1, 2, 0, 3)  # [c][g][T][Hd]
        k = (xn @ ly["attn_k"].T + lora(xn, lo, "k")).reshape(T, Hkv, Hd).transpose(1, 0, 2)  # [c][T][Hd]
        v = (xn @ ly["attn_v"].T + lora(xn, lo, "v")).reshape(T, Hkv, Hd).transpose(1, 0, 2)
        return q, k, v

    def rest(x, o, ly, lo=None):
        o = o.transpose(2, 0, 1, 3).reshape(T, H * Hd)
        x = x + o @ ly["attn_output"].T + lora(o, lo, "o")
        xn = rms(x, ly["ffn_norm"])
        g = xn @ ly["ffn_gate"].T
        return x + (jax.nn.silu(g) * (xn @ ly["ffn_up"].T)) @ ly["ffn_down"].T

    def exact_layer(x, ly):
        q, k, v = qkv(x, ly)
        s = jnp.einsum("cgtd,csd->cgts", rope(q, c_t, s_t), rope(k, c_t, s_t)) / np.sqrt(Hd)
        p = jax.nn.softmax(jnp.where(vis, s, NEG), axis=-1)
        return rest(x, jnp.einsum("cgts,csd->cgtd", p, v), ly), None

    def feat(Mt, om, x):
        """Feature log-weights, as core/attn/features.c: ŷ = Hd^-1/4 M x."""
        y = jnp.einsum("...d,ed->...e", x * sc, Mt)
        return jnp.einsum("...e,me->...m", y, om) - 0.5 * jnp.sum(y * y, -1, keepdims=True) + bias

    kind = cfg.get("kind", "darkformer")
    trig, nst = flexfeat.is_trig(kind), kind == "flexformer-n"
    tfeat = jax.vmap(lambda o, r, x: flexfeat.feats(jnp, kind, o, r, x, Hd))

    def hybrid_layer(x, lp):
        ly, Mt, th, beta, om, lo, gu = lp
        q, k, v = qkv(x, ly, lo)
        qr, kr = rope(q, c_t, s_t), rope(k, c_t, s_t)
        s = jnp.einsum("cgtd,csd->cgts", qr, kr) / np.sqrt(Hd)
        if S > 0:
            ss = jnp.einsum("cgtd,csd->cgts", q, rope(k[:, :S], c_k, s_k)) / np.sqrt(Hd)
            s = jnp.concatenate([jnp.where(shifted, ss, s[..., :S]), s[..., S:]], axis=-1)
        if trig:  # Mt: the frequencies; th: θ (and ρ of τ for -n)
            thd, rho = (th[:, 0], th[:, 1]) if nst else (th, jnp.zeros_like(th))
            lg = jnp.log(0.5 + 0.5 * jax.nn.sigmoid(thd))  # [c]
            vq, lnq = tfeat(Mt, rho, q)  # [c][g][T][M], [c][g][T]
            vk, lnk = tfeat(Mt, rho, k)  # [c][T][M], [c][T]
            dots = jnp.einsum("cgtm,csm->cgts", vq, vk)
            lmag = (lnq[..., None] + lnk[:, None, None, :] + beta[:, :, None, None]
                    + dist * lg[:, None, None, None])
            pr, _ = flexfeat.mix(jax, jnp, s, vis & ~lin, lin, lmag, dots)
            return rest(x, jnp.einsum("cgts,csd->cgtd", pr, v), ly, lo), None
        aq = jax.vmap(feat)(Mt, om, q)  # [c][g][T][m]
        ak = jax.vmap(feat)(Mt, om, k)  # [c][T][m]
        mq = jax.lax.stop_gradient(aq.max(axis=-1, keepdims=True))
        mk = jax.lax.stop_gradient(ak.max(axis=-1, keepdims=True))
        p = jnp.einsum("cgtm,csm->cgts", jnp.exp(aq - mq), jnp.exp(ak - mk))
        lk = jnp.log(jnp.maximum(p, 1e-30)) + mq + jnp.swapaxes(mk, 1, 2)[:, None]
        lg = jnp.log(0.5 + 0.5 * jax.nn.sigmoid(th))  # [c]
        if gu is None:
            lk = lk + beta[:, :, None, None] + dist * lg[:, None, None, None]
        else:  # data-dependent gate: log γ_t of the token at t from its own (pre-RoPE) key
            lgt = jnp.log(0.5 + 0.5 * jax.nn.sigmoid(
                th[:, None] + jnp.einsum("ctd,cd->ct", k, gu) / np.sqrt(Hd)))  # [c][T]
            G = jnp.cumsum(lgt, axis=-1)  # key j decays by exp(G[t] - G[j + W]) at query t
            lk = lk + beta[:, :, None, None] + (G[:, :, None] - G[:, jw][:, None, :])[:, None]
        pr = jax.nn.softmax(jnp.where(lin, lk, jnp.where(vis, s, NEG)), axis=-1)
        return rest(x, jnp.einsum("cgts,csd->cgtd", pr, v), ly, lo), None

    def logp(x, emb, onorm):
        return jax.nn.log_softmax(rms(x, onorm) @ emb.T, axis=-1)

    def kl(params, weights, tokens):
        emb, onorm, lw, oms = weights
        x0 = emb[tokens]
        xt, _ = jax.lax.scan(exact_layer, x0, lw)
        lt = jax.lax.stop_gradient(logp(xt, emb, onorm)[W + S:])
        Mt, th, beta = params[:3]
        n_lo = len(params) - 3 - learn_draws - learn_gate
        lo = dict(zip(LORA_NAMES, params[3:3 + n_lo])) if n_lo else None
        gu = params[3 + n_lo] if learn_gate else None  # the gate's weights [L][Hkv][Hd]
        if learn_draws:  # the draws themselves trained: the last parameter
            oms = params[-1]
        xs, _ = jax.lax.scan(jax.checkpoint(hybrid_layer), x0,
                             (lw, Mt, th, beta.reshape(L, Hkv, gs), oms, lo, gu))
        ls = logp(xs, emb, onorm)[W + S:]
        nxt = tokens[W + S + 1:]
        nll_t = -jnp.take_along_axis(lt[:-1], nxt[:, None], axis=-1).mean()
        nll_s = -jnp.take_along_axis(ls[:-1], nxt[:, None], axis=-1).mean()
        return jnp.mean(jnp.sum(jnp.exp(lt) * (lt - ls), axis=-1)), (nll_t, nll_s)

    def batch_kl(params, weights, toks):
        r = jax.vmap(lambda t: kl(params, weights, t))(toks) if toks.shape[0] > 1 else \
            jax.tree_util.tree_map(lambda a: a[None], kl(params, weights, toks[0]))
        return jnp.mean(r[0]), (jnp.mean(r[1][0]), jnp.mean(r[1][1]))

    return (jax.jit(jax.value_and_grad(batch_kl, has_aux=True)),
            jax.jit(lambda p, w, t: kl(p, w, t)))


def check(a, hp, cfg, init, weights):
    """--check: this file's forward passes against the C kernels' NLLs."""
    import jax.numpy as jnp
    T, lo = a.len, cfg["window"] + cfg["sinks"]
    ids = np.load(a.check).astype(np.int32)[:T]
    if len(ids) < T or not (a.nll_exact and a.nll_converted):
        return "distill: --check needs %d ids, --nll-exact and --nll-converted" % T
    _, val_fn = build(hp, cfg, T)
    _, (nt, ns) = val_fn([jnp.asarray(x) for x in init], weights, jnp.asarray(ids))
    bad = 0
    for name, mine, path in (("exact", float(nt), a.nll_exact), ("converted", float(ns),
                                                                  a.nll_converted)):
        ref = float(np.mean(np.fromfile(path, dtype=np.float32)[lo + 1:T]))
        ok = abs(mine - ref) <= 1e-4
        bad += not ok
        print("distill: %s mean NLL of tokens %d..%d: jax %.6f, C %.6f %s" % (
            name, lo + 1, T - 1, mine, ref, "ok" if ok else "MISMATCH"))
    return 1 if bad else 0


def write_params(out, p, lora, learn_gate, learn_draws, kind="darkformer"):
    """Writes parameters p as out.{mat,decay,mix}.f32 (and out.lora.*,
    out.gate, out.draws) for build/tools/write_adapter; the decays as
    0.5 + 0.5 σ(logit). Flexformer: out.omega.f32 (-n: out.omega2.f32,
    out.tau.f32) in place of out.mat.f32."""
    th = p[1]
    if flexfeat.is_trig(kind):
        import convert
        rho = p[1][..., 1] if kind == "flexformer-n" else np.zeros(p[1].shape, np.float32)
        th = p[1][..., 0] if kind == "flexformer-n" else p[1]
        convert.write_trig(out, kind, p[0], rho, p[0].shape[-1])
    else:
        p[0].astype(np.float32).tofile(out + ".mat.f32")
    gam = 0.5 + 0.5 / (1 + np.exp(-th.astype(np.float64)))
    gam.astype(np.float32).tofile(out + ".decay.f32")
    p[2].astype(np.float32).tofile(out + ".mix.f32")
    for i, n in enumerate(LORA_NAMES if lora else ()):  # write_adapter --lora PREFIX.lora
        p[3 + i].astype(np.float32).tofile("%s.lora.%s.f32" % (out, n))
    if learn_gate:  # write_adapter --gate
        p[3 + 8 * bool(lora)].astype(np.float32).tofile(out + ".gate.f32")
    if learn_draws:  # write_adapter --draws
        p[-1].astype(np.float32).tofile(out + ".draws.f32")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--adapter", required=True,
                   help="starting adapter (format 2, pre-RoPE): darkformer, or flexformer-s/-n "
                        "(the kind is the adapter's darkformer.kind; written by write_adapter "
                        "from convert.py train2 --kind)")
    p.add_argument("--ids", help="calibration token ids (record_qkv --ids-out)")
    p.add_argument("--check", help="token ids of a text to check the forward passes on")
    p.add_argument("--nll-exact", help="--check: darkserve perplexity --nll-out, --attn exact")
    p.add_argument("--nll-converted", help="--check: the same with the adapter")
    p.add_argument("--eps", required=True, help="feature draws (record_qkv --draws)")
    p.add_argument("--out", help="prefix of the .mat/.decay/.mix.f32 outputs")
    p.add_argument("--ckpt")
    p.add_argument("--log")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--len", type=int, default=1024)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.0002, help="Adam step for M")
    p.add_argument("--lr-small", type=float, default=0.005, help="Adam step for γ's logit and β")
    p.add_argument("--lora", type=int, default=0, help="rank of LoRA on q, k, v, o (0: none)")
    p.add_argument("--lr-lora", type=float, default=0.001)
    p.add_argument("--lr-gate", type=float, default=0.0,
                   help="Adam step for a data-dependent decay gate (0: none): γ_t = 0.5 + "
                        "0.5 σ(θ + u·k_t/√Hd) from each token's pre-RoPE key")
    p.add_argument("--lr-draws", type=float, default=0.0,
                   help="Adam step for the feature draws ε themselves (0: they stay fixed)")
    p.add_argument("--val-seqs", type=int, default=4)
    p.add_argument("--val-every", type=int, default=20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--write-each", action="store_true",
                   help="also write PREFIX.stepN.* with the parameters of every validated step")
    a = p.parse_args()

    import jax.numpy as jnp

    t_start = time.time()
    hp, emb, onorm, lw = load_model(a.model)
    cfg, mats, dec, mix, lora0, gate0, draws0 = load_adapter(a.adapter)
    L, H, Hkv, Hd = hp["L"], hp["H"], hp["Hkv"], hp["Hd"]
    m, W, S, T = cfg["n_features"], cfg["window"], cfg["sinks"], a.len
    kind = cfg["kind"]
    want = {"darkformer": (L, Hkv, Hd, Hd), "flexformer-s": (L, Hkv, m // 2, Hd),
            "flexformer-n": (L, Hkv, 2, m // 2, Hd)}[kind]
    if mats.shape != want or mix.shape != (L, H) or dec.shape != (L, Hkv):
        sys.exit("distill: adapter shapes do not match the model")
    if T <= W + S + 1:
        sys.exit("distill: --len must exceed window + sinks + 1")
    eps = np.load(a.eps)
    if eps.shape[:2] != (L, Hkv) or eps.shape[2] < m or eps.shape[3] != Hd:
        sys.exit("distill: %s has shape %s, need [%d][%d][>=%d][%d]" % (
            a.eps, eps.shape, L, Hkv, m, Hd))
    g0 = np.clip(dec.astype(np.float64), 0.5 + 1e-6, 1 - 1e-7)
    th0 = np.log((2 * g0 - 1) / (2 - 2 * g0)).astype(np.float32)
    if kind == "flexformer-n":  # ρ of τ = 2√Hd·e^ρ rides beside θ
        th0 = np.stack([th0, cfg["rho"]], axis=-1).astype(np.float32)
    init = [mats, th0, mix]
    if lora0 is not None:  # the adapter's own LoRA, trained further
        if a.lora and a.lora != lora0[0].shape[1]:
            sys.exit("distill: the adapter's LoRA has rank %d, not %d" % (lora0[0].shape[1], a.lora))
        a.lora = lora0[0].shape[1]
        init += lora0
    elif a.lora:
        init += lora_init(hp, a.lora, np.random.default_rng(a.seed))
    learn_gate = cfg["learn_gate"] = int(a.lr_gate > 0 or gate0 is not None)
    if gate0 is not None:  # the adapter's own gate
        init.append(gate0)
    elif learn_gate:  # from 0: the gate starts as the constant decay
        init.append(np.zeros((L, Hkv, Hd), dtype=np.float32))
    learn_draws = cfg["learn_draws"] = int(a.lr_draws > 0 or draws0 is not None)
    if draws0 is not None:  # the adapter's own trained draws
        init.append(draws0)
    elif learn_draws:
        init.append(eps[:, :, :m, :].astype(np.float32))
    weights = (jnp.asarray(emb), jnp.asarray(onorm), {n: jnp.asarray(x) for n, x in lw.items()},
               jnp.asarray(eps[:, :, :m, :].astype(np.float32)))
    del lw
    if a.check:
        sys.exit(check(a, hp, cfg, init, weights))
    if not (a.ids and a.out):
        sys.exit("distill: --ids and --out are required")
    ids = np.load(a.ids).astype(np.int32)
    n_val = a.val_seqs * T
    if len(ids) < n_val + 4 * T:
        sys.exit("distill: %s has too few tokens" % a.ids)
    val = ids[len(ids) - n_val:].reshape(a.val_seqs, T)
    n_train = len(ids) - n_val - T

    ck = dict(np.load(a.ckpt)) if a.ckpt and os.path.exists(a.ckpt) else {}
    params = [ck.get("p%d" % i, x) for i, x in enumerate(init)]
    mom = [ck.get("m%d" % i, np.zeros_like(x)) for i, x in enumerate(init)]
    sec = [ck.get("v%d" % i, np.zeros_like(x)) for i, x in enumerate(init)]
    best_p = [ck.get("b%d" % i, x) for i, x in enumerate(init)]
    step0 = int(ck.get("step", 0))
    hist = json.load(open(a.log)) if a.log and os.path.exists(a.log) and step0 else {
        "model": a.model, "adapter": a.adapter, "ids": a.ids, "len": T, "batch": a.batch,
        "lr": a.lr, "lr_small": a.lr_small, "steps": a.steps, "val_seqs": a.val_seqs,
        "train": [], "val": []}
    rng = np.random.default_rng(a.seed + step0)
    grad_fn, val_fn = build(hp, cfg, T)
    print("distill: model and adapter loaded, m=%d W=%d S=%d, %d-token sequences, "
          "%d training tokens (%.0fs)" % (m, W, S, T, n_train + T, time.time() - t_start),
          flush=True)

    def evaluate(pp):
        pj = [jnp.asarray(x) for x in pp]
        r = [val_fn(pj, weights, jnp.asarray(v)) for v in val]
        return (float(np.mean([float(x[0]) for x in r])), float(np.mean([float(x[1][0]) for x in r])),
                float(np.mean([float(x[1][1]) for x in r])))

    def save(step):
        if a.ckpt:
            d = {"step": step}
            for i in range(len(params)):
                d["p%d" % i], d["m%d" % i], d["v%d" % i], d["b%d" % i] = (
                    np.asarray(params[i]), np.asarray(mom[i]), np.asarray(sec[i]), best_p[i])
            tmp = a.ckpt + ".tmp.npz"
            np.savez(tmp, **d)
            os.replace(tmp, a.ckpt)
        if a.log:
            with open(a.log, "w") as f:
                json.dump(hist, f, indent=1)

    if step0 == 0:
        v = evaluate(params)
        hist["val"].append({"step": 0, "kl": v[0], "nll_exact": v[1], "nll": v[2]})
        print("distill: step 0 val KL %.5f, nll exact %.4f, converted %.4f" % v, flush=True)
    best = min((x["kl"] for x in hist["val"]), default=float("inf"))
    lrs = [a.lr, a.lr_small, a.lr_small] + \
        [a.lr_lora] * (len(params) - 3 - learn_draws - learn_gate) + \
        [a.lr_gate] * learn_gate + [a.lr_draws] * learn_draws
    b1, b2 = 0.9, 0.999
    t0 = time.time()
    for step in range(step0 + 1, a.steps + 1):
        starts = rng.integers(0, n_train, size=a.batch)
        toks = np.stack([ids[s:s + T] for s in starts])
        (lval, (nt, ns)), g = grad_fn([jnp.asarray(x) for x in params], weights, jnp.asarray(toks))
        cos = 0.5 * (1 + np.cos(np.pi * (step - 1) / a.steps))
        for i in range(len(params)):
            gi = np.nan_to_num(np.asarray(g[i]), nan=0.0, posinf=0.0, neginf=0.0)
            mom[i] = b1 * np.asarray(mom[i]) + (1 - b1) * gi
            sec[i] = b2 * np.asarray(sec[i]) + (1 - b2) * gi * gi
            upd = (mom[i] / (1 - b1 ** step)) / (np.sqrt(sec[i] / (1 - b2 ** step)) + 1e-8)
            params[i] = (np.asarray(params[i]) - lrs[i] * cos * upd).astype(np.float32)
        hist["train"].append({"step": step, "kl": float(lval), "nll_exact": float(nt),
                              "nll": float(ns)})
        el = time.time() - t0
        rate = (step - step0) * a.batch * T / el
        print("distill: step %d/%d KL %.5f (nll exact %.3f, converted %.3f) %.0f tok/s, ETA %.0fs"
              % (step, a.steps, float(lval), float(nt), float(ns), rate,
                 (a.steps - step) * a.batch * T / rate), flush=True)
        if step % a.val_every == 0 or step == a.steps:
            v = evaluate(params)
            hist["val"].append({"step": step, "kl": v[0], "nll_exact": v[1], "nll": v[2]})
            if v[0] < best:
                best = v[0]
                best_p = [np.asarray(x).copy() for x in params]
            print("distill: step %d val KL %.5f (best %.5f), nll exact %.4f, converted %.4f" % (
                step, v[0], best, v[1], v[2]), flush=True)
            if a.write_each:  # every validated point, for a selection on another measure
                write_params("%s.step%d" % (a.out, step), [np.asarray(x) for x in params],
                             a.lora, learn_gate, learn_draws, kind)
            save(step)
    write_params(a.out, best_p, a.lora, learn_gate, learn_draws, kind)
    print("distill: wrote %s.{mat,decay,mix}.f32 (best val KL %.5f; %.0fs)" % (
        a.out, best, time.time() - t_start), flush=True)


if __name__ == "__main__":
    main()
