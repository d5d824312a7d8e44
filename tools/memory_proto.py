#!/usr/bin/env python3
"""A research model of the exact memory beside DARKFormer's linear state:
the whole model in jax (as tools/distill.py's student), with λ exact key/value
rows per KV head kept by a retention score, so that variants of the design
can be compared on recall and perplexity before they are built in C.

    memory_proto.py --model M.gguf --adapter A.gguf --eps EPS.npy --corpus TXT
                    [--lengths 1024] [--depths 0.1,0.5,0.9] [--trials 10]
                    [--mem 64] [--block 64] [--score recall|refresh|vnorm|random]
                    [--pos true|fixed|cap] [--cap 1024] [--attn darkformer|exact]
                    [--window W] [--relative] [--seed 1] [--out RESULTS.json]
                    [--force] [--diag F] [--scores F] [--beta B] [--decay G]
                    [--update masked|additive|delta|deltanet] [--eta E]
                    [--rows f32|row8|row4|g32|chan4|had4] [--features N]

The attention it models (docs/DESIGN.md §3, "Version 2", plus the memory):
keys leave the exact span in blocks of B tokens at absolute positions b = B,
2B, ...: a query at t in the block [b, b + B) sees exactly the sinks, the
memory rows and every key from b − W on, and linearly the older keys, each
decayed by γ^(t − W − j). At each boundary the keys leaving the exact span
[b − B − W, b − W) compete with the memory's rows on the score; the top λ
stay exact, the others go to the linear state with the decay their age
implies. B = 1 is per-token selection with the plain window.

Scores: recall = the self-recall error ‖φ(k)ᵀS / φ(k)ᵀz − v‖² against the
linear state at the boundary (a row keeps the score it entered with); full
= the same against the linear state plus the memory's rows taken as linear
terms (so the first rows are not scored against an empty state);
refresh = the same, every row rescored at each boundary; vnorm = ‖v‖²;
random. Positions of memory rows: true (their RoPE distance), fixed (scored
as if W + S tokens back, as the sinks are), cap (true up to --cap tokens,
then fixed at that distance).

Recall is measured teacher-forced: the chat prompt with a 5-digit key hidden
at a depth of calibration-corpus filler, then "The pass key is " and the key;
a trial is correct when every digit is the argmax given the ones before.
Also prints the mean NLL of the filler's last quarter (a perplexity check).
Research only: nothing in darkserve runs this file. Needs jax
(tools/requirements-convert.txt) and build/darkserve for tokenizing.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import distill  # noqa: E402

NEG = -1e30
FORCED = set()  # positions always kept by the memory (--force needle)
PROBE_HOOK = None  # with --attn exact: called per layer (l, q, k, v, probs(), x) (memory_probe.py)
KV = []  # per layer with --scores: (layer, k, v, key feature logits, log decay, attention
#          received inside the window: [c][2][T], sum and max over the next W queries)
DIAG = []  # per layer: (layer, probabilities of the last 8 rows, their memory membership)


def tokenize(binary, model, text):
    out = subprocess.run([binary, "tokenize", "--model", model, "--no-bos", "--ids", text],
                         capture_output=True, text=True, check=True).stdout
    return [int(x) for x in out.split()]


def make_trial(rng, corpus, binary, model, n_tokens, depth):
    """Token ids of one passkey prompt, the answer's digit ids and where they start."""
    key = int(rng.integers(10000, 100000))
    off = int(rng.integers(0, len(corpus) - 8 * n_tokens))
    filler = corpus[off:off + 6 * n_tokens]
    filler = filler[filler.find(" ") + 1:]
    head = ("<|im_start|>user\nThere is a pass key hidden in the text below. Find it and "
            "remember it.\n\n")
    needle = " The pass key is %d. Remember it: %d is the pass key. " % (key, key)
    tail = "\n\nWhat is the pass key?<|im_end|>\n<|im_start|>assistant\nThe pass key is "
    ids_f = tokenize(binary, model, filler)
    budget = n_tokens - len(tokenize(binary, model, head + needle + tail)) - 6
    ids_f = ids_f[:max(budget, 16)]
    at = int(len(ids_f) * depth)
    pre = tokenize(binary, model, head)
    ids = pre + ids_f[:at] + tokenize(binary, model, needle) + ids_f[at:] + \
        tokenize(binary, model, tail)
    digits = tokenize(binary, model, str(key))
    n0 = len(pre) + at
    return {"key": key, "ids": ids + digits, "ans": len(ids), "digits": digits,
            "filler": (len(pre), len(pre) + len(ids_f)),
            "needle": (n0, n0 + len(tokenize(binary, model, needle)))}


def build(hp, cfg, lw, emb, onorm, mats, dec, mix, lora, oms, args):
    import jax
    import jax.numpy as jnp

    L, H, Hkv, Hd, nr = hp["L"], hp["H"], hp["Hkv"], hp["Hd"], hp["n_rot"]
    gs, m, W, S = H // Hkv, cfg["n_features"], args.window, cfg["sinks"]
    inv = hp["base"] ** (-2.0 * np.arange(nr // 2) / nr)
    sc, bias = Hd ** -0.25, -0.5 * np.log(m)

    def cs(pos):
        ang = np.asarray(pos, dtype=np.float64)[:, None] * inv[None, :]
        return jnp.asarray(np.cos(ang), jnp.float32), jnp.asarray(np.sin(ang), jnp.float32)

    def rope(x, c, s):
        a, b = x[..., 0:nr:2], x[..., 1:nr:2]
        y = jnp.stack([a * c - b * s, a * s + b * c], axis=-1).reshape(x.shape[:-1] + (nr,))
        return jnp.concatenate([y, x[..., nr:]], axis=-1)

    def rms(x, w):
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + hp["eps"]) * w

    def lo(x, lol, name):
        if lol is None:
            return 0.0
        return (x @ lol[name + "_a"].T) @ lol[name + "_b"].T

    def lora_of(l):
        if lora is None:
            return None
        return {n: jnp.asarray(lora[i][l]) for i, n in enumerate(distill.LORA_NAMES)}

    @jax.jit
    def qkv(x, ly, l, use_lora):
        xn = rms(x, ly["attn_norm"])
        T = x.shape[0]
        f = lambda n: lo(xn, l, n) * use_lora  # noqa: E731
        q = (xn @ ly["attn_q"].T + f("q")).reshape(T, Hkv, gs, Hd).transpose(1, 2, 0, 3)
        k = (xn @ ly["attn_k"].T + f("k")).reshape(T, Hkv, Hd).transpose(1, 0, 2)
        v = (xn @ ly["attn_v"].T + f("v")).reshape(T, Hkv, Hd).transpose(1, 0, 2)
        return q, k, v

    @jax.jit
    def rest(x, o, ly, l, use_lora):  # l: this layer's LoRA (lora_of)
        T = x.shape[0]
        o = o.transpose(2, 0, 1, 3).reshape(T, H * Hd)
        x = x + o @ ly["attn_output"].T + lo(o, l, "o") * use_lora
        xn = rms(x, ly["ffn_norm"])
        return x + (jax.nn.silu(xn @ ly["ffn_gate"].T) * (xn @ ly["ffn_up"].T)) @ ly["ffn_down"].T

    @jax.jit
    def feats(Mt, om, x):
        y = jnp.einsum("...d,ed->...e", x * sc, Mt)
        return jnp.einsum("...e,me->...m", y, om) - 0.5 * jnp.sum(y * y, -1, keepdims=True) + bias

    @jax.jit
    def exact_attn(q, k, v):
        T = q.shape[2]
        c, s = cs(np.arange(T))
        sc_ = jnp.einsum("cgtd,csd->cgts", rope(q, c, s), rope(k, c, s)) / np.sqrt(Hd)
        vis = jnp.asarray(np.arange(T)[None, :] <= np.arange(T)[:, None])
        p = jax.nn.softmax(jnp.where(vis, sc_, NEG), axis=-1)
        return jnp.einsum("cgts,csd->cgtd", p, v), p[:, :, -8:, :]

    @jax.jit
    def exact_probs(q, k):
        T = q.shape[2]
        c, s = cs(np.arange(T))
        sc_ = jnp.einsum("cgtd,csd->cgts", rope(q, c, s), rope(k, c, s)) / np.sqrt(Hd)
        vis = jnp.asarray(np.arange(T)[None, :] <= np.arange(T)[:, None])
        return jax.nn.softmax(jnp.where(vis, sc_, NEG), axis=-1)

    def quant(x, keys):
        """--rows: the window's rows as darkserve could store them, rounded
        (x [c][T][Hd] after RoPE for keys). row8: 8-bit, a scale per row (the
        shipped rows); row4 / g32: 4-bit (±7), a scale per row / per 32
        elements; chan4: 4-bit with a scale per channel over the sequence
        for keys (per RoPE pair: its largest magnitude), per row for values;
        had4: 4-bit, a scale per row, after a Walsh-Hadamard rotation of
        the row (which spreads a channel's outliers over all of them)."""
        if args.rows == "f32" or args.rows_of not in ("kv", "k" if keys else "v"):
            return x
        return jnp.concatenate([x[:, :S], quant_rows(x[:, S:], keys)], axis=1)  # sinks kept

    def quant_rows(x, keys):
        if args.rows.startswith("had"):  # rounded after a Walsh-Hadamard rotation, then back
            h = np.array([[1.0]])
            while h.shape[0] < Hd:
                h = np.block([[h, h], [h, -h]])
            hm = jnp.asarray(h / np.sqrt(Hd), jnp.float32)
            y = x @ hm
            d = jnp.maximum(jnp.abs(y).max(-1, keepdims=True), 1e-30) / 7.0
            return (jnp.round(y / d) * d) @ hm
        lv = 127.0 if args.rows == "row8" else 7.0
        if args.rows == "g32":
            g = x.reshape(x.shape[:-1] + (Hd // 32, 32))
            d = jnp.maximum(jnp.abs(g).max(-1, keepdims=True), 1e-30) / lv
            return (jnp.round(g / d) * d).reshape(x.shape)
        if args.rows == "chan4" and keys:
            pr = x.reshape(x.shape[:-1] + (Hd // 2, 2))
            mag = jnp.sqrt((pr * pr).sum(-1)).max(axis=1, keepdims=True)  # [c][1][Hd/2]
            d = jnp.maximum(jnp.repeat(mag, 2, axis=-1), 1e-30) / lv
            return jnp.clip(jnp.round(x / d), -lv, lv) * d
        d = jnp.maximum(jnp.abs(x).max(-1, keepdims=True), 1e-30) / lv
        return jnp.round(x / d) * d

    def window_scores(q, k):
        """Exact logits [c][g][T][T], the sinks scored as if next to the window
        once t ≥ W + S − 1 (docs/DESIGN.md §3)."""
        T = q.shape[2]
        c, s = cs(np.arange(T))
        qr, kr = rope(q, c, s), quant(rope(k, c, s), True)
        st = jnp.einsum("cgtd,csd->cgts", qr, kr) / np.sqrt(Hd)
        tt = np.arange(T)[:, None]
        if S > 0:
            ck, sk = cs(np.arange(S) + 1 - W - S)
            ss = jnp.einsum("cgtd,csd->cgts", q, rope(k[:, :S], ck, sk)) / np.sqrt(Hd)
            shifted = jnp.asarray(tt >= W + S - 1)
            st = jnp.concatenate([jnp.where(shifted, ss, st[..., :S]), st[..., S:]], axis=-1)
        return st

    @jax.jit
    def exact_part(q, k, v, exact_m):
        """The exact terms unnormalized: numerator, denominator and the row max."""
        st = jnp.where(exact_m[:, None], window_scores(q, k), NEG)
        mx = st.max(axis=-1, keepdims=True)
        e = jnp.exp(st - mx)
        return jnp.einsum("cgts,csd->cgtd", e, v), e.sum(-1), mx[..., 0]

    @jax.jit
    def hybrid_attn(q, k, v, aq, ak, beta, lg, exact_m, lin_m, mem_m, dist, sm_fixed_pos):
        """exact_m [c][T][T] window+sinks, lin_m linear, mem_m memory (exact at its positions)."""
        T = q.shape[2]
        c, s = cs(np.arange(T))
        st = window_scores(q, k)
        tt = np.arange(T)[:, None]
        # memory rows scored at a fixed distance D (sm_fixed_pos[t][j] = D, or −1: true)
        D = sm_fixed_pos
        cf, sf = cs(np.zeros(1))
        # q_pre · R(−D) k_pre  ==  rope(q, D) · k_pre  (one distance for all rows here)
        sm = st
        if args.pos != "true":
            cd, sd = cs(np.array([args.cap if args.pos == "cap" else W + S]))
            sfix = jnp.einsum("cgtd,csd->cgts", rope(q, cd, sd), k) / np.sqrt(Hd)
            far = jnp.asarray((tt - np.arange(T)[None, :]) > (args.cap if args.pos == "cap" else 0))
            sm = jnp.where(far, sfix, st)
        mq = jax.lax.stop_gradient(aq.max(axis=-1, keepdims=True))
        mk = jax.lax.stop_gradient(ak.max(axis=-1, keepdims=True))
        p = jnp.einsum("cgtm,csm->cgts", jnp.exp(aq - mq), jnp.exp(ak - mk))
        lk = jnp.log(jnp.maximum(p, 1e-30)) + mq + jnp.swapaxes(mk, 1, 2)[:, None]
        lk = lk + beta[:, :, None, None] + dist[None, None] * lg[:, None, None, None]
        logits = jnp.where(lin_m[:, None], lk,
                           jnp.where(mem_m[:, None], sm, jnp.where(exact_m[:, None], st, NEG)))
        pr = jax.nn.softmax(logits, axis=-1)
        return jnp.einsum("cgts,csd->cgtd", pr, v), pr[:, :, -8:, :]

    def window_received(q, k):
        """Per KV head and key u: the exact attention it receives from the queries
        t in (u, u + W] (all query heads of its group), summed and at most: the
        scores H2O-style eviction would use when u leaves the window."""
        p = np.asarray(exact_probs(q, k)).sum(1)  # [c][t][u]
        T = p.shape[-1]
        cu = np.cumsum(p, axis=1)
        u = np.arange(T)
        top = np.minimum(u + W, T - 1)
        tot = cu[:, top, u] - cu[:, u, u]
        band = (u[:, None] > u[None, :]) & (u[:, None] <= u[None, :] + W)  # [t][u]
        mx = np.where(band[None], p, 0.0).max(axis=1)
        return np.stack([tot, mx], axis=1)

    def recurrent_linear(q, k, v, aq, ak, beta, lg, T):
        """The linear branch run as the C kernels run it: a state (S, z) per KV
        head, keys absorbed in blocks at the boundaries b = B, 2B, ... with the
        weight γ^(b − W − j), queries of [b, b + B) reading it times γ^(t − b).
        --update additive: S += f φ(k) vᵀ (the shipped rule); delta: the value
        written is r + κ(v − r), r = φ(k)ᵀS / φ(k)ᵀz the state's present
        answer for the key, κ chosen so that the answer moves a share η
        (--eta) of the way to v (κ ≥ 1: never less than the additive write);
        z stays additive. deltanet: the values come from a second state, a
        gated delta rule on the unit pre-RoPE keys (D ← γD + η k̂(v − Dᵀk̂)ᵀ,
        read with the unit query: v̂ = Dᵀq̂), weighted by the random features'
        mass φ(q)ᵀz. Returns the numerator [c][g][T][Hd], denominator
        [c][g][T] and their log scale [c][g][T] (float64)."""
        B = args.block
        gs_ = aq.shape[1]
        num = np.zeros((Hkv, gs_, T, Hd))
        den = np.zeros((Hkv, gs_, T))
        lsc = np.full((Hkv, gs_, T), -np.inf)
        for c in range(Hkv):
            a = ak[c].astype(np.float64)
            A = a.max()
            w = np.exp(a - A)
            qa = aq[c].astype(np.float64)
            mq = qa.max(-1)
            wq = np.exp(qa - mq[..., None])
            V = v[c].astype(np.float64)
            gam = np.exp(lg[c])
            Sx = np.zeros((m, Hd))
            z = np.zeros(m)
            Dm = np.zeros((Hd, Hd))
            K = k[c].astype(np.float64)
            K /= np.linalg.norm(K, axis=-1, keepdims=True)
            Qn = q[c].astype(np.float64)
            Qn /= np.linalg.norm(Qn, axis=-1, keepdims=True)
            for b in range(B, T, B):
                Sx *= gam ** B
                z *= gam ** B
                for u in range(max(S, b - B - W), max(S, min(b - W, T))):
                    if args.update == "deltanet":
                        Dm = gam * Dm + args.eta * np.outer(K[u], V[u] - Dm.T @ K[u])
                    f = gam ** (b - W - u)
                    val = V[u]
                    if args.update == "delta":
                        du = w[u] @ z
                        pp = f * (w[u] @ w[u])
                        if du > 0 and pp > 0:
                            r = (w[u] @ Sx) / du
                            kap = max(1.0, args.eta * (du + pp) / pp)
                            val = r + kap * (V[u] - r)
                    Sx += f * np.outer(w[u], val)
                    z += f * w[u]
                t1 = min(b + B, T)
                den[c, :, b:t1] = wq[:, b:t1] @ z
                if args.update == "deltanet":
                    num[c, :, b:t1] = (Qn[:, b:t1] @ Dm) * den[c, :, b:t1][..., None]
                else:
                    num[c, :, b:t1] = wq[:, b:t1] @ Sx
                lsc[c, :, b:t1] = (beta[c][:, None] + (np.arange(b, t1) - b)[None] * lg[c]
                                   + mq[:, b:t1] + A)
        return num, den, lsc

    def select(k, v, ak_np, lg, T):
        """Memory membership [c][T][T] by the block-boundary competition."""
        B, lam = args.block, args.mem
        mem = np.zeros((Hkv, T, T), dtype=bool)
        if lam == 0:
            return mem
        rs = np.random.default_rng(args.seed + 7)
        for c in range(Hkv):
            a = ak_np[c].astype(np.float64)  # [T][m] key logits
            A = a.max()
            w = np.exp(a - A)  # φ up to one constant
            gam = np.exp(lg[c])
            Sx = np.zeros((m, Hd))
            z = np.zeros(m)
            V = v[c].astype(np.float64)
            rows, scores = [], []  # memory: positions and their scores
            sb = 0  # boundary the state is at

            def recall_err(u, with_rows=False):
                num = w[u] @ Sx
                den = w[u] @ z
                if with_rows:  # the memory's rows counted as if linear too
                    for r in rows:
                        f = gam ** (sb - W - r) * (w[u] @ w[r])
                        num = num + f * V[r]
                        den = den + f
                est = num / den if den > 1e-300 else np.zeros(Hd)
                return float(np.sum((est - V[u]) ** 2))

            def absorb(u, b):
                # weight at boundary b: γ^(b − W − u) (queries multiply γ^(t − b))
                f = gam ** (b - W - u)
                Sx[:] += f * np.outer(w[u], V[u])
                z[:] += f * w[u]

            for b in range(B, T + B, B):
                # advance the state's time to b
                if sb:
                    Sx *= gam ** (b - sb)
                    z *= gam ** (b - sb)
                sb = b
                lo_, hi = max(S, b - B - W), min(b - W, T)
                if hi <= lo_:
                    continue
                cand = list(range(lo_, hi))
                if args.score == "full":
                    cs_ = [recall_err(u, True) for u in cand]
                elif args.score in ("recall", "refresh"):
                    cs_ = [recall_err(u) for u in cand]
                    if args.score == "refresh":
                        scores = [recall_err(u) for u in rows]
                elif args.score == "vnorm":
                    cs_ = [float(np.sum(V[u] ** 2)) for u in cand]
                else:
                    cs_ = list(rs.random(len(cand)))
                if args.relative and cs_:  # over the block's median (the C rule)
                    med = float(np.median(cs_))
                    cs_ = [e / med if med > 0 else e for e in cs_]
                if args.force:
                    cs_ = [1e300 if u in FORCED else e for u, e in zip(cand, cs_)]
                allr = rows + cand
                alls = scores + cs_
                order = sorted(range(len(allr)), key=lambda i: (-alls[i], allr[i]))
                keep = set(order[:lam])
                nrows, nsc = [], []
                for i, u in enumerate(allr):
                    if i in keep:
                        nrows.append(u)
                        nsc.append(alls[i])
                    else:
                        absorb(u, b)
                rows, scores = nrows, nsc
                t1 = min(b + B, T)
                if b < T:
                    mem[c, b:t1][:, rows] = True
        return mem

    def forward(ids, attn):
        import jax.numpy as jnp
        T = len(ids)
        x = jnp.asarray(emb)[jnp.asarray(ids)]
        B = args.block
        tt = np.arange(T)[:, None]
        jj = np.arange(T)[None, :]
        bt = (tt // B) * B  # each query's block start
        vis = jj <= tt
        lin_base = (jj < bt - W) & (jj >= S) & vis
        dist = jnp.asarray(np.maximum(tt - W - jj, 0).astype(np.float32))
        for l in range(L):
            ly = {n: jnp.asarray(lw[n][l]) for n in lw}
            lol = lora_of(l)
            if attn == "exact":
                q, k, v = qkv(x, ly, lol, 0.0)
                o, pl = exact_attn(q, k, v)
                DIAG.append((l, np.asarray(pl), None))
                if PROBE_HOOK is not None:
                    PROBE_HOOK(l, q, k, v, lambda: exact_probs(q, k), x)
                if args.scores:
                    Mt = jnp.asarray(mats[l])
                    ak = jax.vmap(feats)(Mt, jnp.asarray(oms[l]), k)
                    KV.append((l, np.asarray(k), np.asarray(v), np.asarray(ak),
                               np.log(dec[l].astype(np.float64)), window_received(q, k)))
                x = rest(x, o, ly, lol, 0.0)
                continue
            q, k, v = qkv(x, ly, lol, 1.0)
            v = quant(v, False)
            Mt = jnp.asarray(mats[l])
            aq = jax.vmap(feats)(Mt, jnp.asarray(oms[l]), q)
            ak = jax.vmap(feats)(Mt, jnp.asarray(oms[l]), k)
            lg = np.log(dec[l].astype(np.float64))
            if args.update != "masked":
                en, ed, emx = (np.asarray(x_, np.float64) for x_ in exact_part(
                    q, k, v, jnp.asarray(vis[None] & ~lin_base[None])))
                ln, ld, lsc = recurrent_linear(np.asarray(q), np.asarray(k), np.asarray(v), np.asarray(aq),
                                               np.asarray(ak), mix[l].reshape(Hkv, gs), lg, T)
                top = np.maximum(emx, np.where(ld > 0, lsc + np.log(np.maximum(ld, 1e-300)), -np.inf))
                fe, fl = np.exp(emx - top), np.exp(lsc - top)
                o = (en * fe[..., None] + ln * fl[..., None]) / (ed * fe + ld * fl)[..., None]
                DIAG.append((l, None, None))
                x = rest(x, jnp.asarray(o, jnp.float32), ly, lol, 1.0)
                continue
            mem = select(np.asarray(k), np.asarray(v), np.asarray(ak), lg, T)
            lin = lin_base[None] & ~mem
            exact = vis[None] & ~lin & ~mem
            o, pl = hybrid_attn(q, k, v, aq, ak, jnp.asarray(mix[l].reshape(Hkv, gs)),
                                jnp.asarray(lg, jnp.float32), jnp.asarray(exact), jnp.asarray(lin),
                                jnp.asarray(mem), dist, None)
            DIAG.append((l, np.asarray(pl), mem[:, -8:, :]))
            x = rest(x, o, ly, lol, 1.0)
        return np.asarray(jax.nn.log_softmax(rms(x, jnp.asarray(onorm)) @ jnp.asarray(emb).T, axis=-1))

    return forward


def write_diag(path, tr, good, T):
    """Answer rows (predicting the digits) against the needle's columns: per
    layer and head the attention mass, and per layer and KV head how many of
    the needle's rows the memory holds at the first answer row."""
    a = tr["ans"]
    n0, n1 = tr["needle"]
    rows = [a - 1 + j - (T - 8) for j in range(len(tr["digits"]))]
    out = {"key": tr["key"], "correct": bool(good), "needle": [n0, n1], "layers": []}
    for l, p, mem in DIAG:
        mass = p[:, :, rows, n0:n1].sum(-1).mean(-1)  # [Hkv][gs]
        ent = {"l": l, "mass": np.round(mass, 4).tolist()}
        if mem is not None:
            ent["kept"] = mem[:, rows[0], n0:n1].sum(-1).tolist()
        out["layers"].append(ent)
    with open(path, "a") as f:
        f.write(json.dumps(out) + "\n")


def write_scores(path, tr, lp, W, S):
    """Percentile ranks (1 = the top) of the needle's digit rows among the
    rows old enough to have left the window, under several scores."""
    ids = tr["ids"]
    T = len(ids)
    n0, n1 = tr["needle"]
    dig = set(tr["digits"])
    drows = [u for u in range(n0, n1) if ids[u] in dig]
    hi = tr["ans"] - W  # rows that left the window before the answer
    surpr = np.zeros(T)
    for u in range(1, T):
        surpr[u] = -lp[u - 1][ids[u]]
    out = {"key": tr["key"], "T": T, "drows": drows, "layers": []}
    a = tr["ans"]
    rows = [a - 1 + j - (T - 8) for j in range(len(tr["digits"]))]
    for (l, k, v, ak, lg, recv), (_, p, _) in zip(KV, DIAG):
        mass = p[:, :, rows][..., drows].sum(-1).mean(-1).max(-1)  # [Hkv]
        ent = {"l": l, "mass": np.round(mass, 3).tolist(), "pct": {}}
        for c in range(k.shape[0]):
            A = ak[c].astype(np.float64)
            w = np.exp(A - A.max())
            V = v[c].astype(np.float64)
            gam = np.exp(lg[c])
            Sx = np.zeros((w.shape[1], V.shape[1]))
            z = np.zeros(w.shape[1])
            sc = {n: np.full(T, np.nan) for n in ("recall", "relrecall", "novelty", "vnorm",
                                                   "knorm", "surprisal", "surprisal_prev", "h2o", "h2omax")}
            for u in range(S, hi):
                den = w[u] @ z
                if u > S and den > 0:
                    est = (w[u] @ Sx) / den
                    e = float(np.sum((est - V[u]) ** 2))
                    sc["recall"][u] = e
                    sc["relrecall"][u] = e / float(np.sum(V[u] ** 2))
                    sc["novelty"][u] = -np.log(den) + np.log(np.sum(w[u]))
                sc["vnorm"][u] = float(np.sum(V[u] ** 2))
                sc["knorm"][u] = float(np.sum(k[c][u].astype(np.float64) ** 2))
                sc["surprisal"][u] = surpr[u]
                sc["surprisal_prev"][u] = surpr[u - 1] if u else 0.0
                sc["h2o"][u] = recv[c, 0, u]
                sc["h2omax"][u] = recv[c, 1, u]
                Sx = gam * Sx + np.outer(w[u], V[u])
                z = gam * z + w[u]
            # how well the exact rows before it (all of them, or the window
            # only) give back its value, the key as the query
            K = k[c].astype(np.float64)
            lgt = K @ K.T / np.sqrt(K.shape[1])
            for name, lo_w in (("exactrecall", None), ("exactrecall_w", W)):
                sc[name] = np.full(T, np.nan)
                for u in range(S + 1, hi):
                    j0 = S if lo_w is None else max(S, u - lo_w)
                    z_ = lgt[u, j0:u]
                    pz = np.exp(z_ - z_.max())
                    est = pz @ V[j0:u] / pz.sum()
                    sc[name][u] = float(np.sum((est - V[u]) ** 2))
            pc = {}
            for n, x in sc.items():
                ok = ~np.isnan(x)
                vals = x[ok]
                pc[n] = [float(np.mean(vals >= x[u])) for u in drows if ok[u]]
            ent["pct"][c] = pc
        out["layers"].append(ent)
    with open(path, "a") as f:
        f.write(json.dumps(out) + "\n")


def wilson(k, n, z=1.96):
    if n == 0:
        return 0.0, 1.0
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--adapter", default="models/adapters/SmolLM2-135M-Instruct.Q4_1.darkformer.gguf")
    ap.add_argument("--eps", default="build/memproto/eps.npy")
    ap.add_argument("--corpus", default="build/memproto/calibration.txt")
    ap.add_argument("--bin", default="build/darkserve")
    ap.add_argument("--lengths", default="1024")
    ap.add_argument("--depths", default="0.1,0.5,0.9")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--mem", type=int, default=64)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--score", default="recall",
                    choices=["recall", "refresh", "full", "vnorm", "random"])
    ap.add_argument("--pos", default="fixed", choices=["true", "fixed", "cap"])
    ap.add_argument("--cap", type=int, default=1024)
    ap.add_argument("--window", type=int, default=-1)
    ap.add_argument("--attn", default="darkformer", choices=["darkformer", "exact"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--relative", action="store_true",
                    help="each block's scores over their median (darkserve's rule is --score "
                    "full --relative --pos cap --cap 4096)")
    ap.add_argument("--force", action="store_true",
                    help="the needle's tokens always win the memory's contest (a diagnosis)")
    ap.add_argument("--diag", help="per layer and head: the answer rows' attention mass on the "
                    "needle and the needle rows kept, appended to this file as JSON lines")
    ap.add_argument("--scores", help="with --attn exact: where the needle's digit rows rank "
                    "under candidate retention scores, per layer and KV head, as JSON lines")
    ap.add_argument("--beta", type=float, help="override the linear branch's log weight (diagnosis)")
    ap.add_argument("--decay", type=float, help="override every head's decay (diagnosis)")
    ap.add_argument("--update", default="masked", choices=["masked", "additive", "delta", "deltanet"],
                    help="the linear branch: masked = per-key weights in one softmax (with "
                    "the memory); additive / delta = run as a recurrent state (no memory)")
    ap.add_argument("--eta", type=float, default=1.0,
                    help="with --update delta: the share of the way to v a key's answer moves")
    ap.add_argument("--features", type=int, default=0,
                    help="fresh N(0, 1) draws of this many features instead of the adapter's")
    ap.add_argument("--rows", default="f32", choices=["f32", "row8", "row4", "g32", "chan4", "had4"],
                    help="window rows rounded as stored (keys after RoPE, values)")
    ap.add_argument("--rows-of", default="kv", choices=["kv", "k", "v"],
                    help="which rows --rows rounds (the sinks are never rounded)")
    ap.add_argument("--out")
    ap.add_argument("--nll-ids", help="score these token ids (int32 .npy or text ids) instead")
    ap.add_argument("--nll-out", help="with --nll-ids: per-token NLL, float32 (NaN at 0)")
    args = ap.parse_args()
    hp, emb, onorm, lw = distill.load_model(args.model)
    cfg, mats, dec, mix, lora, _, _ = distill.load_adapter(args.adapter)
    if args.beta is not None:  # a diagnosis: the linear branch's log weight, every head
        mix = np.full_like(np.asarray(mix), args.beta)
    if args.decay is not None:  # a diagnosis: every head's decay per token
        dec = np.full_like(np.asarray(dec), args.decay)
    if args.window < 0:
        args.window = cfg["window"]
    args.sinks_ = cfg["sinks"]
    if args.features:  # more draws of the same distribution: a finer estimate of one kernel
        cfg["n_features"] = args.features
        eps = np.random.default_rng(args.seed + 11).standard_normal(
            (len(mats), mats.shape[1], args.features, mats.shape[2])).astype(np.float32)
    else:
        eps = np.load(args.eps)[:, :, :cfg["n_features"], :].astype(np.float32)
    corpus = open(args.corpus, encoding="utf-8").read()
    fwd = build(hp, cfg, lw, emb, onorm, mats, dec, mix, lora, eps, args)
    if args.nll_ids:
        ids = [int(v) for v in open(args.nll_ids).read().split()]
        lp = fwd(ids, args.attn)
        nll = np.full(len(ids), np.nan, dtype=np.float32)
        for t_ in range(1, len(ids)):
            nll[t_] = -lp[t_ - 1][ids[t_]]
        print("mean NLL %.6f over %d tokens" % (np.nanmean(nll), len(ids) - 1))
        if args.nll_out:
            nll.tofile(args.nll_out)
        return
    rng = np.random.default_rng(args.seed)
    res = []
    for n in [int(x) for x in args.lengths.split(",")]:
        for d in [float(x) for x in args.depths.split(",")]:
            ok = 0
            nll = []
            t0 = time.time()
            for i in range(args.trials):
                tr = make_trial(rng, corpus, args.bin, args.model, n, d)
                FORCED.clear()
                if args.force:
                    FORCED.update(range(*tr["needle"]))
                DIAG.clear()
                KV.clear()
                lp = fwd(tr["ids"], args.attn)
                if args.scores:
                    write_scores(args.scores, tr, lp, args.window, args.sinks_)
                a = tr["ans"]
                good = all(int(np.argmax(lp[a - 1 + j])) == tr["digits"][j]
                           for j in range(len(tr["digits"])))
                ok += good
                f0, f1 = tr["filler"]
                q0 = f0 + 3 * (f1 - f0) // 4
                ids = tr["ids"]
                nll.append(float(-np.mean([lp[t - 1][ids[t]] for t in range(q0, f1)])))
                res.append({"len": n, "depth": d, "key": tr["key"], "correct": bool(good),
                            "T": len(ids), "nll_tail": nll[-1]})
                if args.diag:
                    write_diag(args.diag, tr, good, len(ids))
            lo_, hi = wilson(ok, args.trials)
            print(f"len {n} depth {d}: {ok}/{args.trials} [{lo_:.2f}, {hi:.2f}]  "
                  f"tail NLL {np.mean(nll):.4f}  ({time.time() - t0:.0f} s)", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "trials": res}, f, indent=1)


if __name__ == "__main__":
    main()
