#!/usr/bin/env python3
"""DARKFormer conversion: Λ for DARKFormer-IS and the learned matrices M of
DARKFormer (attention transfer), from recordings of tools/record_qkv.

    convert.py lambda --rec DIR --out LAMBDA.f32 [--log LOG.json]
    convert.py train  --rec DIR --features M --window W --out MAT.f32 --log LOG.json
                      [--steps 300] [--lr 0.01] [--val-seqs 8] [--batch 4]
                      [--queries 128] [--layers 0-29] [--seed 1]

Outputs are raw little-endian float32 [L][Hkv][Hd][Hd], what
build/tools/write_adapter reads (tools/convert.sh runs the whole pipeline).
`train2 --kind flexformer-s|flexformer-n` trains Flexformer's frequencies
(from the Performer draws, or with `--flex-init darkformer` those draws
through a DARKFormer adapter's learned M; tools/flexfeat.py) in M's place
and writes OUT.omega.f32 (-n: OUT.omega2.f32, OUT.tau.f32). `gate` turns the
Flexformer linear branch off (β = −30) in the (layer, KV head) pairs where
that gives a lower output error than the trained parameters on a selection
recording (two --eval-only logs). `train2 --eval-only`
trains nothing: it prints (and logs to --log) the loss terms, output error
and mass KL per layer and KV head, of the parameters in --ckpt (all layers,
done or not; without --ckpt the starting ones, e.g. Performer with
--kind darkformer --gamma0 1) on every sequence of --rec, such as a
recording of held-out text.

Λ (DESIGN.md §3: q̂, k̂ ~ N(0, Λ)): per layer and KV head the *uncentered*
second moment E[x̂ x̂ᵀ] pooled over the keys and the queries of the heads that
share the KV head, each side weighted one half. Pooled because the proposal
is shared by both feature maps (φ(q) and φ(k) must use the same ω) and the
variance of φ(q)·φ(k) grows with q̂ + k̂; uncentered because the estimator's
variance depends on the raw vectors, means included (a mean is not removed
by the kernels).

Attention transfer (LoLCATs stage 1 in spirit): per layer and KV head, M
starts at the identity (= Performer) and Adam minimizes the relative squared
error ‖O − O*‖² / ‖O*‖² between the linear (W = 0) or hybrid (exact window W)
attention output O over the recorded q, k, v and the exact softmax output O*,
with the feature draws ε the C kernels use (eps.npy of the recording, first
M rows). Each step takes `batch` training sequences and `queries` random
query positions (≥ W: earlier positions are exact whatever M is); the last
`val-seqs` recorded sequences are held out, the validation loss (all
positions ≥ W) is evaluated every 25 steps and the best M is kept (early
stopping). Needs jax (tools/requirements-convert.txt).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dfeat  # noqa: E402
import flexfeat  # noqa: E402


def parse_layers(s, n):
    if not s:
        return list(range(n))
    out = []
    for part in s.split(","):
        if "-" in part:
            a, b = part.split("-")
            out += list(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def cmd_lambda(a):
    meta = dfeat.load_meta(a.rec)
    L, H, Hkv, Hd = meta["n_layer"], meta["n_head"], meta["n_head_kv"], meta["head_dim"]
    gs = H // Hkv
    lam = np.zeros((L, Hkv, Hd, Hd), dtype=np.float32)
    log = []
    for layer in range(L):
        q, k, _ = dfeat.load_layer(a.rec, layer)
        for h in range(Hkv):
            qh = np.asarray(q[:, :, h * gs:(h + 1) * gs, :], dtype=np.float64).reshape(-1, Hd)
            kh = np.asarray(k[:, :, h, :], dtype=np.float64).reshape(-1, Hd)
            s = Hd ** -0.5  # x̂ x̂ᵀ = x xᵀ · Hd^(-1/2)
            l2 = 0.5 * (qh.T @ qh / len(qh) + kh.T @ kh / len(kh)) * s
            lam[layer, h] = l2
            w = np.linalg.eigvalsh(l2)
            log.append({"layer": layer, "kv_head": h, "eig_max": float(w[-1]),
                        "eig_min": float(w[0]), "trace": float(w.sum()),
                        "n_clamped": int(np.sum(w > dfeat.LAMBDA_MAX) + np.sum(w < 0))})
    lam.tofile(a.out)
    if a.log:
        with open(a.log, "w") as f:
            json.dump({"rec": a.rec, "per_head": log}, f, indent=1)
    print("lambda: wrote %s; eigenvalues clamped per head: median %d of %d" %
          (a.out, int(np.median([r["n_clamped"] for r in log])), Hd))


def cmd_train(a):
    import jax
    import jax.numpy as jnp

    meta = dfeat.load_meta(a.rec)
    L, H, Hkv, Hd = meta["n_layer"], meta["n_head"], meta["n_head_kv"], meta["head_dim"]
    N, T = meta["n_seq"], meta["len"]
    gs, m, W = H // Hkv, a.features, a.window
    n_val = a.val_seqs
    n_tr = N - n_val
    if n_tr < a.batch or n_val < 1 or W >= T - 1:
        sys.exit("convert: not enough recorded sequences or window too large")
    eps_all = dfeat.load_eps(a.rec)
    if eps_all.shape[2] < m:
        sys.exit("convert: recording has %d draws, need %d" % (eps_all.shape[2], m))
    bias = -0.5 * np.log(m)
    sc = Hd ** -0.25
    NEG = -1e30

    def feat_logits(Mt, om, x):
        y = (x * sc) @ Mt.T
        return y @ om.T - 0.5 * jnp.sum(y * y, axis=-1, keepdims=True) + bias

    def head_out(Mt, om, q, k, v, tau):
        """q [B][P][gs][Hd] at positions tau [P]; k, v [B][T][Hd] -> [B][P][gs][Hd]."""
        aq = feat_logits(Mt, om, q)
        ak = feat_logits(Mt, om, k)
        mq = jax.lax.stop_gradient(aq.max(axis=-1, keepdims=True))
        mk = jax.lax.stop_gradient(ak.max(axis=-1, keepdims=True))
        p = jnp.einsum("bpgi,bji->bpgj", jnp.exp(aq - mq), jnp.exp(ak - mk))
        lk = jnp.log(jnp.maximum(p, 1e-30)) + mq + jnp.swapaxes(mk, 1, 2)[:, None, :, :]
        s = jnp.einsum("bpgd,bjd->bpgj", q, k) / np.sqrt(Hd)
        j = jnp.arange(k.shape[1])[None, :]
        t = tau[:, None]
        lin = (j <= t - W)[None, :, None, :]
        win = ((j > t - W) & (j <= t))[None, :, None, :]
        lw = jnp.where(lin, lk, jnp.where(win, s, NEG))
        pr = jax.nn.softmax(lw, axis=-1)
        return jnp.einsum("bpgj,bjd->bpgd", pr, v)

    def loss_fn(Ms, oms, q, k, v, tgt, tau):
        """Sum over the KV heads of each head's relative squared error."""
        def one(Mt, om, qh, kh, vh, th):
            o = head_out(Mt, om, qh, kh, vh, tau)
            return jnp.sum((o - th) ** 2) / jnp.sum(th * th)
        return jnp.sum(jax.vmap(one)(Ms, oms, q, k, v, tgt))

    per_head_loss = jax.jit(lambda Ms, oms, q, k, v, tgt, tau: jax.vmap(
        lambda Mt, om, qh, kh, vh, th: jnp.sum((head_out(Mt, om, qh, kh, vh, tau) - th) ** 2)
        / jnp.sum(th * th))(Ms, oms, q, k, v, tgt))
    grad_fn = jax.jit(jax.value_and_grad(loss_fn))

    @jax.jit
    def exact_all(q, k, v):
        """Exact causal outputs, q [Hkv][N][T][gs][Hd], k, v [Hkv][N][T][Hd]."""
        s = jnp.einsum("hntgd,hnud->hntgu", q, k) / np.sqrt(Hd)
        mask = jnp.tril(jnp.ones((T, T), dtype=bool))[None, None, :, None, :]
        s = jnp.where(mask, s, NEG)
        return jnp.einsum("hntgu,hnud->hntgd", jax.nn.softmax(s, axis=-1), v)

    rng = np.random.default_rng(a.seed)
    tau_val = np.arange(W, T) if W > 0 else np.arange(T)
    layers = parse_layers(a.layers, L)
    mats = np.tile(np.eye(Hd, dtype=np.float32), (L, Hkv, 1, 1))
    if a.init:
        mats = np.fromfile(a.init, dtype=np.float32).reshape(L, Hkv, Hd, Hd)
    log = {"rec": a.rec, "features": m, "window": W, "steps": a.steps, "lr": a.lr,
           "batch": a.batch, "queries": a.queries, "train_seqs": n_tr, "val_seqs": n_val,
           "seq_len": T, "seed": a.seed, "layers": []}
    t_start = time.time()
    for layer in layers:
        t0 = time.time()
        q, k, v = dfeat.load_layer(a.rec, layer, mmap=False)
        # [Hkv][N][T][gs][Hd] and [Hkv][N][T][Hd]
        qh = jnp.asarray(np.ascontiguousarray(
            q.reshape(N, T, Hkv, gs, Hd).transpose(2, 0, 1, 3, 4)))
        kh = jnp.asarray(np.ascontiguousarray(k.transpose(2, 0, 1, 3)))
        vh = jnp.asarray(np.ascontiguousarray(v.transpose(2, 0, 1, 3)))
        tgt = jnp.concatenate([exact_all(qh[:, i:i + 4], kh[:, i:i + 4], vh[:, i:i + 4])
                               for i in range(0, N, 4)], axis=1)
        oms = jnp.asarray(np.asarray(eps_all[layer, :, :m, :], dtype=np.float32))
        Ms = jnp.asarray(mats[layer])
        vq, vk, vv, vt = (qh[:, n_tr:, tau_val], kh[:, n_tr:], vh[:, n_tr:],
                          tgt[:, n_tr:, tau_val])
        tv = jnp.asarray(tau_val)

        def val_loss(Mx):
            return np.asarray(per_head_loss(Mx, oms, vq, vk, vv, vt, tv))

        init_val = val_loss(Ms)
        id_val = val_loss(jnp.asarray(np.tile(np.eye(Hd, dtype=np.float32), (Hkv, 1, 1))))
        best, best_M, best_step = init_val.copy(), np.asarray(Ms).copy(), np.zeros(Hkv, int)
        mom = jnp.zeros_like(Ms)
        sec = jnp.zeros_like(Ms)
        b1, b2 = 0.9, 0.999
        tr_hist = []
        for step in range(1, a.steps + 1):
            seqs = rng.choice(n_tr, size=a.batch, replace=False)
            lo = W if W > 0 else 0
            tau = np.sort(rng.choice(np.arange(lo, T), size=min(a.queries, T - lo), replace=False))
            lr = a.lr * (0.5 * (1 + np.cos(np.pi * (step - 1) / a.steps)))
            val, g = grad_fn(Ms, oms, qh[:, seqs][:, :, tau], kh[:, seqs], vh[:, seqs],
                             tgt[:, seqs][:, :, tau], jnp.asarray(tau))
            g = jnp.where(jnp.isfinite(g), g, 0.0)
            mom = b1 * mom + (1 - b1) * g
            sec = b2 * sec + (1 - b2) * g * g
            Ms = Ms - lr * (mom / (1 - b1 ** step)) / (jnp.sqrt(sec / (1 - b2 ** step)) + 1e-8)
            tr_hist.append(float(val) / Hkv)
            if step % 25 == 0 or step == a.steps:
                vl = val_loss(Ms)
                Mn = np.asarray(Ms)
                for h in range(Hkv):
                    if vl[h] < best[h]:
                        best[h], best_M[h], best_step[h] = vl[h], Mn[h], step
        mats[layer] = best_M
        ent = {"layer": layer, "val_loss_identity": [float(x) for x in id_val],
               "val_loss_init": [float(x) for x in init_val],
               "val_loss_best": [float(x) for x in best], "best_step": [int(x) for x in best_step],
               "train_loss_first25": float(np.mean(tr_hist[:25])),
               "train_loss_last25": float(np.mean(tr_hist[-25:])),
               "seconds": round(time.time() - t0, 1)}
        log["layers"].append(ent)
        print("layer %2d: val rel. sq. error identity %s -> best %s (steps %s) %.0fs" % (
            layer, np.array2string(id_val, precision=4), np.array2string(best, precision=4),
            best_step.tolist(), time.time() - t0), flush=True)
        mats.tofile(a.out)  # checkpoint after every layer
        log["seconds"] = round(time.time() - t_start, 1)
        with open(a.log, "w") as f:
            json.dump(log, f, indent=1)


def unrope(x, n_rot, base, pos0=0):
    """x [N][T][..][Hd] rotated by RoPE at positions pos0 + t (pairs 2i, 2i+1
    of the first n_rot dims by pos·base^(-2i/n_rot)) -> x before RoPE, as
    core/attn/attn_linear.c's unrope does in double."""
    x = np.asarray(x, dtype=np.float64)
    T = x.shape[1]
    inv = base ** (-2.0 * np.arange(n_rot // 2) / n_rot)
    ang = (pos0 + np.arange(T))[:, None] * inv[None, :]  # [T][n_rot/2]
    shape = [1, T] + [1] * (x.ndim - 3) + [n_rot // 2]
    c, s = np.cos(ang).reshape(shape), np.sin(ang).reshape(shape)
    out = x.copy()
    a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
    out[..., 0:n_rot:2] = a * c + b * s
    out[..., 1:n_rot:2] = b * c - a * s
    return out.astype(np.float32)


def write_trig(out, kind, om, rho, hd):
    """Flexformer frequencies as write_adapter reads them: OUT.omega.f32
    [L][Hkv][m][Hd], and for -n OUT.omega2.f32 the same and OUT.tau.f32
    [L][Hkv] τ = 2√Hd·e^ρ."""
    om = np.asarray(om, dtype=np.float32)
    if kind == "flexformer-s":
        om.tofile(out + ".omega.f32")
        return
    np.ascontiguousarray(om[:, :, 0]).tofile(out + ".omega.f32")
    np.ascontiguousarray(om[:, :, 1]).tofile(out + ".omega2.f32")
    (2 * np.sqrt(hd) * np.exp(np.asarray(rho, dtype=np.float64))).astype(np.float32).tofile(
        out + ".tau.f32")


def cmd_gate(a):
    """Flexformer's linear branch kept only where it helps: per (layer, KV
    head), the output error of the trained parameters (train2 --eval-only
    log) against the linear branch off (--flex-den off log), both on a
    selection recording; where off is lower (or not lower by --margin, a
    fraction of the trained error), the head's query heads get
    β = −30 (CORE_FEATURES_MIX_MAX: the linear part weighs e^−30)."""
    with open(a.trained) as f:
        tr = {e["layer"]: np.asarray(e["err"]) for e in json.load(f)["layers"]}
    with open(a.off) as f:
        off = {e["layer"]: np.asarray(e["err"]) for e in json.load(f)["layers"]}
    ck = dict(np.load(a.ckpt))
    mix = ck["mix"].copy()
    hkv = ck["decay"].shape[1]
    gs = mix.shape[1] // hkv
    gated = []
    for layer in sorted(tr):
        for h in range(hkv):
            if off[layer][h] < tr[layer][h] * (1.0 + a.margin):
                mix[layer, h * gs:(h + 1) * gs] = -30.0
                gated.append([layer, h])
    ck["mix"] = mix
    np.savez(a.out, **ck)
    print("gate: linear branch off in %d of %d (layer, KV head) pairs: %s" % (
        len(gated), len(tr) * hkv, gated), flush=True)
    if a.log:
        with open(a.log, "w") as f:
            json.dump({"gated": gated, "trained": {k: v.tolist() for k, v in tr.items()},
                       "off": {k: v.tolist() for k, v in off.items()}}, f, indent=1)


def darkformer_m(a, meta):
    """[L][Hkv][Hd][Hd] M of the DARKFormer adapter --flex-init-from, refused
    unless its features see q, k on the same side of RoPE as --prerope."""
    import gguf
    try:
        fields = gguf.GGUFReader(a.flex_init_from).fields.values()
    except (OSError, ValueError) as e:
        sys.exit("convert: %s: %s" % (a.flex_init_from, e))
    kind = [f.parts[f.data[0]] for f in fields if f.name == "darkformer.kind"]
    if not kind or bytes(kind[0]).decode() != "darkformer":
        sys.exit("convert: %s is not a darkformer adapter (no M to draw through)" %
                 a.flex_init_from)
    mats, keys = dfeat.read_adapter(a.flex_init_from, "M", meta["n_layer"], meta["n_head_kv"],
                                    meta["head_dim"])
    if keys.get("darkformer.prerope", 0) != a.prerope:
        sys.exit("convert: %s has prerope %d, --prerope is %d" % (
            a.flex_init_from, keys.get("darkformer.prerope", 0), a.prerope))
    return mats


def cmd_train2(a):
    """DARKFormer v2 stage 1: per layer, all KV heads at once, learn M (on
    q, k before RoPE with --prerope), the decay γ per KV head and the mixing
    log-weight β per query head, against exact softmax attention on long
    recorded sequences, with S sinks and the exact window W, the way
    core/attn/attn_linear.c combines them. Loss per head: relative squared error
    of the output plus KL between the exact and the converted attention mass
    on the keys older than the window (so the linear branch cannot be
    switched off to fit the window alone). Resumable: every finished layer is
    in the checkpoint (--ckpt .npz); a rerun skips those layers."""
    import jax
    import jax.numpy as jnp

    meta = dfeat.load_meta(a.rec)
    L, H, Hkv, Hd = meta["n_layer"], meta["n_head"], meta["n_head_kv"], meta["head_dim"]
    N, T = meta["n_seq"], meta["len"]
    gs, m, W, S = H // Hkv, a.features, a.window, a.sinks
    trig, nst = flexfeat.is_trig(a.kind), a.kind == "flexformer-n"
    pre = trig and a.flex_pre != "none"
    if trig and (m % 2 or a.commute):
        sys.exit("convert: %s needs an even --features and no --commute" % a.kind)
    if a.flex_init != "isotropic" and not trig:
        sys.exit("convert: --flex-init is for the Flexformer kinds, not %s" % a.kind)
    mf = m // 2 if trig else m  # frequencies (Flexformer: a cosine and a sine row each)
    n_val = N if a.eval_only else a.val_seqs
    n_tr = N - n_val
    lo = W + S
    if (n_tr < a.batch and not a.eval_only) or n_val < 1 or lo >= T - a.queries:
        sys.exit("convert: not enough recorded sequences, or W + S too large for the length")
    eps_all = dfeat.load_eps(a.rec)
    if eps_all.shape[2] < m:
        sys.exit("convert: recording has %d draws, need %d" % (eps_all.shape[2], m))
    bias = -0.5 * np.log(m)
    sc = Hd ** -0.25
    NEG = -1e30

    def feat_logits(Mt, om, x):
        y = (x * sc) @ Mt.T
        return y @ om.T - 0.5 * jnp.sum(y * y, axis=-1, keepdims=True) + bias

    def rot_blocks(ab):
        """ab [Hd/2][2] -> M [Hd][Hd] with the 2x2 blocks [[a, -b], [b, a]] on the
        pairs (2i, 2i+1) that RoPE rotates: M commutes with every rotation, so
        Σ = MᵀM does too and exp(qᵀR_mᵀΣR_nk) depends on n - m only."""
        blk = jnp.stack([jnp.stack([ab[:, 0], -ab[:, 1]], -1),
                         jnp.stack([ab[:, 1], ab[:, 0]], -1)], -2)  # [Hd/2][2][2]
        return jax.scipy.linalg.block_diag(*[blk[i] for i in range(Hd // 2)])

    def head(params, om, qf, kf, q, k, v, qp, ks, tau):
        """One KV head. qf, q [B][P][gs][Hd] (features' input, raw); kf, k, v
        [B][T][Hd]; qp [B][P][gs][Hd] q before RoPE; ks [B][S][Hd] the sinks'
        keys rotated by 1 - W - S (every query here is past W + S - 1, so
        each sink sits just before the window, as core/attn/attn_linear.c
        places it); tau [P]. Returns (loss, rel. sq. error, mass KL)."""
        Mt, th, beta = params
        if a.commute:
            Mt = rot_blocks(Mt)
        if trig:
            return head_trig(Mt, th, beta, qf, kf, q, k, v, qp, ks, tau)
        lg = jnp.log(0.5 + 0.5 * jax.nn.sigmoid(th))
        aq = feat_logits(Mt, om, qf)
        ak = feat_logits(Mt, om, kf)
        mq = jax.lax.stop_gradient(aq.max(axis=-1, keepdims=True))
        mk = jax.lax.stop_gradient(ak.max(axis=-1, keepdims=True))
        p = jnp.einsum("bpgi,bji->bpgj", jnp.exp(aq - mq), jnp.exp(ak - mk))
        lk = jnp.log(jnp.maximum(p, 1e-30)) + mq + jnp.swapaxes(mk, 1, 2)[:, None, :, :]
        s_ex = jnp.einsum("bpgd,bjd->bpgj", q, k) / np.sqrt(Hd)  # the exact model's own
        s = s_ex
        if S > 0:
            s = jnp.concatenate([jnp.einsum("bpgd,bjd->bpgj", qp, ks) / np.sqrt(Hd),
                                 s_ex[..., S:]], axis=-1)
        j = jnp.arange(k.shape[1])[None, :]
        t = tau[:, None]
        lin = ((j <= t - W) & (j >= S))[None, :, None, :]
        exa = (((j > t - W) | (j < S)) & (j <= t))[None, :, None, :]
        vis = (j <= t)[None, :, None, :]
        dec = ((t - W - j) * lg)[None, :, None, :]
        lw = jnp.where(lin, lk + beta[None, None, :, None] + dec, jnp.where(exa, s, NEG))
        pr = jax.nn.softmax(lw, axis=-1)
        o = jnp.einsum("bpgj,bjd->bpgd", pr, v)
        pe = jax.nn.softmax(jnp.where(vis, s_ex, NEG), axis=-1)
        oe = jnp.einsum("bpgj,bjd->bpgd", pe, v)
        err = jnp.sum((o - oe) ** 2) / jnp.sum(oe * oe)
        me = jnp.clip(jnp.sum(jnp.where(lin, pe, 0.0), axis=-1), 1e-6, 1 - 1e-6)
        ml = jnp.clip(jnp.sum(jnp.where(lin, pr, 0.0), axis=-1), 1e-6, 1 - 1e-6)
        kl = jnp.mean(me * jnp.log(me / ml) + (1 - me) * jnp.log((1 - me) / (1 - ml)))
        return err + a.mass_weight * kl, err, kl

    def head_trig(om, th, beta, qf, kf, q, k, v, qp, ks, tau):
        """head() for the Flexformer kinds: om is the head's frequencies
        (the parameter that is M for DARKFormer), th its decay logit (-n: and
        ρ of τ = 2√Hd·e^ρ); the mixing is tools/flexfeat.py's, which follows
        core/attn/attn_linear.c (signed-denominator rule included)."""
        if pre:  # the input map's log-scale rides last
            thd, rho, lsc = (th[0], th[1], th[2]) if nst else (th[0], 0.0, th[1])
        else:
            thd, rho, lsc = (th[0], th[1], 0.0) if nst else (th, 0.0, 0.0)
        lg = jnp.log(0.5 + 0.5 * jax.nn.sigmoid(thd))
        fa = dict(pre=a.flex_pre, lsc=lsc)
        vq, lnq = flexfeat.feats(jnp, a.kind, om, rho, qf, Hd, **fa)  # [B][P][gs][M], [B][P][gs]
        vk, lnk = flexfeat.feats(jnp, a.kind, om, rho, kf, Hd, **fa)  # [B][T][M], [B][T]
        dots = jnp.einsum("bpgi,bji->bpgj", vq, vk)
        s_ex = jnp.einsum("bpgd,bjd->bpgj", q, k) / np.sqrt(Hd)
        s = s_ex
        if S > 0:
            s = jnp.concatenate([jnp.einsum("bpgd,bjd->bpgj", qp, ks) / np.sqrt(Hd),
                                 s_ex[..., S:]], axis=-1)
        j = jnp.arange(k.shape[1])[None, :]
        t = tau[:, None]
        lin = ((j <= t - W) & (j >= S))[None, :, None, :]
        exa = (((j > t - W) | (j < S)) & (j <= t))[None, :, None, :]
        vis = (j <= t)[None, :, None, :]
        dec = ((t - W - j) * lg)[None, :, None, :]
        lmag = lnq[..., None] + lnk[:, None, None, :] + beta[None, None, :, None] + dec
        pr, share = flexfeat.mix(jax, jnp, s, exa, lin, lmag, dots, den_mode=a.flex_den)
        o = jnp.einsum("bpgj,bjd->bpgd", pr, v)
        pe = jax.nn.softmax(jnp.where(vis, s_ex, NEG), axis=-1)
        oe = jnp.einsum("bpgj,bjd->bpgd", pe, v)
        err = jnp.sum((o - oe) ** 2) / jnp.sum(oe * oe)
        me = jnp.clip(jnp.sum(jnp.where(lin, pe, 0.0), axis=-1), 1e-6, 1 - 1e-6)
        ml = jnp.clip(share, 1e-6, 1 - 1e-6)
        kl = jnp.mean(me * jnp.log(me / ml) + (1 - me) * jnp.log((1 - me) / (1 - ml)))
        return err + a.mass_weight * kl, err, kl

    def all_heads(params, oms, qf, kf, q, k, v, qp, ks, tau):
        return jax.vmap(lambda p0, p1, p2, om, a0, a1, a2, a3, a4, a5, a6: head(
            (p0, p1, p2), om, a0, a1, a2, a3, a4, a5, a6, tau))(*params, oms, qf, kf, q, k, v,
                                                               qp, ks)

    def loss_fn(params, oms, qf, kf, q, k, v, qp, ks, tau):
        return jnp.sum(all_heads(params, oms, qf, kf, q, k, v, qp, ks, tau)[0])

    grad_fn = jax.jit(jax.value_and_grad(loss_fn))
    eval_fn = jax.jit(all_heads)

    ck = dict(np.load(a.ckpt)) if a.ckpt and os.path.exists(a.ckpt) else {}
    if trig:  # the frequencies take M's place, from the Performer draws
        mats = ck.get("mat", np.stack([flexfeat.init_omega(eps_all[x], mf, a.kind,
                                                           np.random.default_rng(100 + x))
                                       for x in range(L)]))
        if a.flex_init == "darkformer" and "mat" not in ck:
            mats = flexfeat.omega_through(mats, darkformer_m(a, meta))
    else:
        mats = ck.get("mat", np.tile(a.init_scale * np.eye(Hd, dtype=np.float32),
                                     (L, Hkv, 1, 1)))
    rho = ck.get("rho", np.full((L, Hkv), a.flex_rho0, dtype=np.float32))
    lscs = ck.get("lsc", np.full((L, Hkv), np.log(a.flex_scale0), dtype=np.float32))
    if a.init and "mat" not in ck:
        mats = np.fromfile(a.init, dtype=np.float32).reshape(L, Hkv, Hd, Hd)
    gam = ck.get("decay", np.full((L, Hkv), a.gamma0, dtype=np.float32))
    mix = ck.get("mix", np.zeros((L, H), dtype=np.float32))
    done = set(int(x) for x in ck.get("done", []))
    rng = np.random.default_rng(a.seed)
    layers = [x for x in parse_layers(a.layers, L) if a.eval_only or x not in done]
    if done and not a.eval_only:
        print("train2: resuming from %s, %d layers done" % (a.ckpt, len(done)), flush=True)
    if a.commute and (a.prerope or meta.get("n_rot", Hd) != Hd):
        sys.exit("convert: --commute 1 needs --prerope 0 and RoPE on every dimension")
    log = {"rec": a.rec, "kind": a.kind, "features": m, "window": W, "sinks": S,
           "prerope": a.prerope, "flex_pre": a.flex_pre, "flex_scale0": a.flex_scale0,
           "flex_den": a.flex_den, "flex_init": a.flex_init,
           "commute": a.commute,
           "steps": a.steps, "lr": a.lr, "batch": a.batch, "queries": a.queries,
           "mass_weight": a.mass_weight, "train_seqs": n_tr, "val_seqs": n_val, "seq_len": T,
           "layers": []}
    if a.log and os.path.exists(a.log) and done and not a.eval_only:
        with open(a.log) as f:
            log["layers"] = [e for e in json.load(f).get("layers", []) if e["layer"] in done]
    tv = np.sort(rng.choice(np.arange(lo, T), size=min(2 * a.queries, T - lo), replace=False))
    t_start = time.time()
    for li, layer in enumerate(layers):
        t0 = time.time()
        q, k, v = dfeat.load_layer(a.rec, layer, mmap=False)
        q = q.reshape(N, T, Hkv, gs, Hd)
        n_rot, base = meta.get("n_rot", Hd), meta["rope_base"]
        qp_np = unrope(q, n_rot, base)
        ks_np = np.concatenate([unrope(k[:, j:j + 1], n_rot, base, pos0=W + S - 1)
                                for j in range(S)], axis=1) if S > 0 else k[:, :1]
        if a.prerope:
            qf_np, kf_np = qp_np, unrope(k, n_rot, base)
        else:
            qf_np, kf_np = q, k
        # [Hkv][N][T][gs][Hd] and [Hkv][N][T][Hd]
        qh = jnp.asarray(np.ascontiguousarray(q.transpose(2, 0, 1, 3, 4)))
        qfh = jnp.asarray(np.ascontiguousarray(qf_np.transpose(2, 0, 1, 3, 4)))
        kh = jnp.asarray(np.ascontiguousarray(k.transpose(2, 0, 1, 3)))
        kfh = jnp.asarray(np.ascontiguousarray(kf_np.transpose(2, 0, 1, 3)))
        vh = jnp.asarray(np.ascontiguousarray(v.transpose(2, 0, 1, 3)))
        qph = jnp.asarray(np.ascontiguousarray(qp_np.transpose(2, 0, 1, 3, 4)))
        ksh = jnp.asarray(np.ascontiguousarray(ks_np.transpose(2, 0, 1, 3)))
        oms = jnp.asarray(np.asarray(eps_all[layer, :, :m, :], dtype=np.float32))
        g0 = np.clip(gam[layer].astype(np.float64), 0.5 + 1e-6, 1 - 1e-7)
        th0 = np.log((2 * g0 - 1) / (2 - 2 * g0)).astype(np.float32)
        p0 = mats[layer]
        if a.commute:  # the blocks' (a, b) = (M[2i][2i], M[2i+1][2i])
            p0 = np.stack([np.stack([np.diagonal(x)[0::2], np.diagonal(x, -1)[0::2]], -1)
                           for x in p0])
        if nst:  # ρ of τ = 2√Hd·e^ρ rides beside θ
            th0 = np.stack([th0, rho[layer]], axis=-1).astype(np.float32)
        if pre:  # and the input map's log-scale after them
            th0 = np.concatenate([th0.reshape(Hkv, -1), lscs[layer][:, None]],
                                 axis=-1).astype(np.float32)
        params = (jnp.asarray(p0), jnp.asarray(th0),
                  jnp.asarray(mix[layer].reshape(Hkv, gs)))
        tvj = jnp.asarray(tv)

        def val(pp):
            r = eval_fn(pp, oms, qfh[:, n_tr:, tv], kfh[:, n_tr:], qh[:, n_tr:, tv], kh[:, n_tr:],
                        vh[:, n_tr:], qph[:, n_tr:, tv], ksh[:, n_tr:], tvj)
            return [np.asarray(x) for x in r]

        v0 = val(params)
        if a.eval_only:
            ent = {"layer": layer, "err": v0[1].tolist(), "kl": v0[2].tolist(),
                   "decay": gam[layer].tolist(), "trained": layer in done}
            log["layers"].append(ent)
            print("layer %2d: err %s, mass KL %s%s" % (
                layer, np.array2string(v0[1], precision=4), np.array2string(v0[2], precision=3),
                "" if layer in done else " (untrained)"), flush=True)
            continue
        best = v0[0].copy()
        best_p = [np.asarray(x).copy() for x in params]
        mom = [jnp.zeros_like(x) for x in params]
        sec = [jnp.zeros_like(x) for x in params]
        b1, b2 = 0.9, 0.999
        lrs = [a.lr if a.train_mat else 0.0, a.lr_small, a.lr_small]
        tr_loss, nonfinite = [], 0
        for step in range(1, a.steps + 1):
            seqs = rng.choice(n_tr, size=a.batch, replace=False)
            tau = np.sort(rng.choice(np.arange(lo, T), size=a.queries, replace=False))
            cos = 0.5 * (1 + np.cos(np.pi * (step - 1) / a.steps))
            lval, g = grad_fn(params, oms, qfh[:, seqs][:, :, tau], kfh[:, seqs],
                              qh[:, seqs][:, :, tau], kh[:, seqs], vh[:, seqs],
                              qph[:, seqs][:, :, tau], ksh[:, seqs], jnp.asarray(tau))
            newp = []
            tr_loss.append(float(lval))
            nonfinite += int(sum(int(jnp.sum(~jnp.isfinite(x))) for x in g))
            for i in range(3):
                gi = jnp.where(jnp.isfinite(g[i]), g[i], 0.0)
                mom[i] = b1 * mom[i] + (1 - b1) * gi
                sec[i] = b2 * sec[i] + (1 - b2) * gi * gi
                upd = (mom[i] / (1 - b1 ** step)) / (jnp.sqrt(sec[i] / (1 - b2 ** step)) + 1e-8)
                newp.append(params[i] - lrs[i] * cos * upd)
            params = tuple(newp)
            if step % a.val_every == 0 or step == a.steps:
                vl = val(params)[0]
                print("  layer %2d step %3d: train loss %.4g, val loss %s" % (
                    layer, step, float(np.mean(tr_loss[-a.val_every:])),
                    np.array2string(vl, precision=4)), flush=True)
                for h in range(Hkv):
                    if vl[h] < best[h]:
                        best[h] = vl[h]
                        for i in range(3):
                            best_p[i][h] = np.asarray(params[i])[h]
        vb = val(tuple(jnp.asarray(x) for x in best_p))
        mats[layer] = np.stack([np.asarray(rot_blocks(jnp.asarray(x))) for x in best_p[0]]) \
            if a.commute else best_p[0]
        th_b = best_p[1][..., 0] if (nst or pre) else best_p[1]
        if nst:
            rho[layer] = best_p[1][..., 1]
        if pre:
            lscs[layer] = best_p[1][..., -1]
        gam[layer] = (0.5 + 0.5 / (1 + np.exp(-th_b.astype(np.float64)))).astype(np.float32)
        mix[layer] = best_p[2].reshape(H)
        done.add(layer)
        ent = {"layer": layer, "val_loss_init": v0[0].tolist(), "val_err_init": v0[1].tolist(),
               "val_kl_init": v0[2].tolist(), "val_loss_best": vb[0].tolist(),
               "val_err_best": vb[1].tolist(), "val_kl_best": vb[2].tolist(),
               "decay": gam[layer].tolist(), "mix": mix[layer].tolist(),
               "lsc": lscs[layer].tolist(), "rho": rho[layer].tolist(),
               "train_loss_first": float(np.mean(tr_loss[:10])) if tr_loss else None,
               "train_loss_last": float(np.mean(tr_loss[-10:])) if tr_loss else None,
               "nonfinite_grads": nonfinite,
               "seconds": round(time.time() - t0, 1)}
        log["layers"].append(ent)
        el = time.time() - t_start
        eta = el / (li + 1) * (len(layers) - li - 1)
        print("layer %2d: val err %s -> %s, mass KL %s -> %s, decay %s, train loss %.4g -> %.4g "
              "(%d non-finite gradient entries), %.0fs, ETA %.0fs" % (
                  layer, np.array2string(v0[1], precision=3), np.array2string(vb[1], precision=3),
                  np.array2string(v0[2], precision=3), np.array2string(vb[2], precision=3),
                  np.array2string(gam[layer], precision=4), ent["train_loss_first"] or 0.0,
                  ent["train_loss_last"] or 0.0, nonfinite, time.time() - t0, eta), flush=True)
        if a.ckpt:
            tmp = a.ckpt + ".tmp.npz"
            np.savez(tmp, mat=mats, decay=gam, mix=mix, rho=rho, lsc=lscs,
                     done=np.array(sorted(done)))
            os.replace(tmp, a.ckpt)
        if a.log:
            with open(a.log, "w") as f:
                json.dump(log, f, indent=1)
    if a.eval_only:
        if a.log:
            with open(a.log, "w") as f:
                json.dump(log, f, indent=1)
        return
    if trig:  # write_adapter --omega [--omega2 --tau]
        write_trig(a.out, a.kind, mats, rho, Hd)
        if pre:  # the input map's scale e^lsc [L][Hkv]
            np.exp(lscs.astype(np.float64)).astype(np.float32).tofile(a.out + ".scale.f32")
    else:
        mats.tofile(a.out + ".mat.f32")
    gam.tofile(a.out + ".decay.f32")
    mix.tofile(a.out + ".mix.f32")
    print("train2: wrote %s.{mat,decay,mix}.f32 (%d of %d layers trained)" % (
        a.out, len(done), L), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    pl = sub.add_parser("lambda")
    pl.add_argument("--rec", required=True)
    pl.add_argument("--out", required=True)
    pl.add_argument("--log")
    pt = sub.add_parser("train")
    pt.add_argument("--rec", required=True)
    pt.add_argument("--features", type=int, required=True)
    pt.add_argument("--window", type=int, required=True)
    pt.add_argument("--out", required=True)
    pt.add_argument("--log", required=True)
    pt.add_argument("--init", help="start from this MAT.f32 instead of the identity")
    pt.add_argument("--steps", type=int, default=300)
    pt.add_argument("--lr", type=float, default=0.01)
    pt.add_argument("--val-seqs", type=int, default=8)
    pt.add_argument("--batch", type=int, default=4)
    pt.add_argument("--queries", type=int, default=128)
    pt.add_argument("--layers", default="")
    pt.add_argument("--seed", type=int, default=1)
    p2 = sub.add_parser("train2")
    p2.add_argument("--rec", required=True)
    p2.add_argument("--features", type=int, required=True)
    p2.add_argument("--window", type=int, required=True)
    p2.add_argument("--kind", default="darkformer",
                    choices=("darkformer",) + flexfeat.KINDS,
                    help="darkformer (M), or Flexformer (learned frequencies from the Performer "
                         "draws; --features counts state rows, a cosine and a sine per frequency)")
    p2.add_argument("--sinks", type=int, default=4)
    p2.add_argument("--prerope", type=int, default=1)
    p2.add_argument("--commute", type=int, default=0,
                    help="1: M of 2x2 scaled rotations (Σ commutes with RoPE; needs --prerope 0)")
    p2.add_argument("--train-mat", type=int, default=1)
    p2.add_argument("--flex-pre", choices=flexfeat.PRES, default="none",
                    help="Flexformer's input map before the features (tools/flexfeat.py)")
    p2.add_argument("--flex-scale0", type=float, default=1.0,
                    help="its starting scale e^lsc (norm: the radius)")
    p2.add_argument("--flex-rho0", type=float, default=0.0,
                    help="flexformer-n's starting ρ (τ = 2√Hd·e^ρ, ν = ½e^-ρ)")
    p2.add_argument("--flex-den", choices=flexfeat.DENS, default="rule",
                    help="Flexformer's denominator treatment (tools/flexfeat.py mix)")
    p2.add_argument("--flex-init", choices=("isotropic", "darkformer"), default="isotropic",
                    help="Flexformer's starting frequencies: the Performer draws ε, or ε drawn "
                         "through DARKFormer's learned M (ω = Mᵀε, --flex-init-from)")
    p2.add_argument("--flex-init-from",
                    default="models/adapters/SmolLM2-135M-Instruct.Q4_1.darkformer-stage1.gguf",
                    help="the DARKFormer adapter whose M --flex-init darkformer uses")
    p2.add_argument("--out", required=True, help="prefix of the .mat/.decay/.mix.f32 outputs")
    p2.add_argument("--ckpt", help="resumable checkpoint (.npz)")
    p2.add_argument("--log")
    p2.add_argument("--init", help="start M from this MAT.f32 instead of the identity")
    p2.add_argument("--gamma0", type=float, default=0.998)
    p2.add_argument("--init-scale", type=float, default=1.0,
                    help="M starts at this multiple of the identity (Gemma's global keys have "
                         "norms near 100: at 1 every feature product underflows and nothing "
                         "trains)")
    p2.add_argument("--steps", type=int, default=100)
    p2.add_argument("--lr", type=float, default=0.01)
    p2.add_argument("--lr-small", type=float, default=0.05)
    p2.add_argument("--mass-weight", type=float, default=0.1)
    p2.add_argument("--val-seqs", type=int, default=2)
    p2.add_argument("--val-every", type=int, default=25)
    p2.add_argument("--batch", type=int, default=2)
    p2.add_argument("--queries", type=int, default=128)
    p2.add_argument("--layers", default="")
    p2.add_argument("--seed", type=int, default=1)
    p2.add_argument("--eval-only", action="store_true",
                    help="no training: the loss terms of the parameters in --ckpt (or the "
                         "starting ones) on every sequence of --rec, e.g. a held-out recording; "
                         "per layer to stdout and --log, the checkpoint untouched")
    pg = sub.add_parser("gate")
    pg.add_argument("--ckpt", required=True, help="train2's checkpoint (.npz)")
    pg.add_argument("--trained", required=True, help="train2 --eval-only log of it")
    pg.add_argument("--off", required=True, help="the same with --flex-den off")
    pg.add_argument("--out", required=True, help="the gated checkpoint (.npz)")
    pg.add_argument("--margin", type=float, default=0.0,
                    help="keep a head's branch only if its error is below off's by this "
                         "fraction (0: any amount)")
    pg.add_argument("--log")
    a = p.parse_args()
    if a.cmd == "gate":
        cmd_gate(a)
    elif a.cmd == "lambda":
        cmd_lambda(a)
    elif a.cmd == "train2":
        cmd_train2(a)
    else:
        cmd_train(a)


if __name__ == "__main__":
    main()
