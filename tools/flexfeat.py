"""Flexformer in jax for the training tools (tools/convert.py train2 --kind,
tools/distill.py): the signed trigonometric features of core/attn/features.c and
the hybrid mixing of core/attn/attn_linear.c with its signed-denominator rule.

Notation as in DESIGN.md §3 and core/attn/features.h: x̂ = x·Hd^(-1/4), m = M/2
frequencies, M state rows (cosine half, then sine half).

  flexformer-s: φ(x) = e^(|x̂|²/2) [cos(ω_i·x̂), sin(ω_i·x̂)] / √m
  flexformer-n: φ(x) = e^(ν|x̂|²) [cos ω_1i·x̂ + cos ω_2i·x̂, sin … + sin …] / (2√m),
                ν = √Hd/τ, τ = 2√Hd·e^ρ (ρ is what is trained; 0 at the start)

Parameters per KV head: omega [m][Hd] (-s) or [2][m][Hd] (-n); the decay
logit θ, and for -n ρ beside it (th [..][2]); β per query head as for
DARKFormer. At the Performer draws (ω_2 = ω_1, ρ = 0) both kinds are
Performer's trigonometric estimator of exp(q̂·k̂).
"""
import numpy as np

KINDS = ("flexformer-s", "flexformer-n")


def is_trig(kind):
    return kind in KINDS


def init_omega(eps_head, m, kind, rng=None, jitter=1e-2):
    """Starting frequencies from the Performer draws ε [..][>=m][Hd] (the
    first m rows, as core_features_init_trig draws them): -s ω = ε; -n
    (ω_1, ω_2) = (ε, ε + jitter·N(0, 1)). The jitter breaks the symmetry
    between ω_1 and ω_2 (at ω_2 = ω_1 their gradients are equal, so they would
    stay equal); at 1e-2 the start is Performer's estimator to ~1e-2."""
    e = np.asarray(eps_head[..., :m, :], dtype=np.float32)
    if kind == "flexformer-s":
        return e
    rng = rng or np.random.default_rng(0)
    e2 = e + jitter * rng.standard_normal(e.shape).astype(np.float32)
    return np.stack([e, e2], axis=-3)


def omega_through(om, mats):
    """Frequencies drawn through DARKFormer's learned geometry: each ω ↦ Mᵀω
    (om [L][Hkv][..][m][Hd], mats [L][Hkv][Hd][Hd] with DARKFormer's y = M·x̂).
    Then ω·x̂ = ε·(M x̂) and E cos(ω·(q̂ − k̂)) = e^(−|M(q̂ − k̂)|²/2): the
    Gaussian kernel in DARKFormer's metric Σ = MᵀM instead of the identity."""
    om = np.asarray(om, dtype=np.float32)
    mats = np.asarray(mats, dtype=np.float32)
    if om.ndim == 5:  # -n: [L][Hkv][2][m][Hd], one M for both of a pair
        return np.einsum("lhpmd,lhde->lhpme", om, mats).astype(np.float32)
    return np.einsum("lhmd,lhde->lhme", om, mats).astype(np.float32)


PRES = ("none", "norm", "scale", "normenv")


def feats(jnp, kind, om, rho, x, hd, pre="none", lsc=0.0):
    """Signed values [..][2m] and log-magnitudes [..] of raw rows x [..][Hd].

    pre (the input map before the features, a variant under measurement):
    "none" ŷ = x̂; "norm" ŷ = e^lsc·x̂/|x̂| (every row on a sphere of learned
    radius, so the envelope e^(ν|ŷ|²) is one constant per head); "scale"
    ŷ = e^lsc·x̂ (a learned temperature: the kernel becomes e^(e^(2lsc) q̂·k̂));
    "normenv" the features of "norm" under the envelope e^(ν|x̂|²) of the raw
    row (-n's learned ν: a positive weight per key by its norm)."""
    y = x * hd ** -0.25
    n2 = jnp.sum(y * y, axis=-1)
    if pre in ("norm", "normenv"):
        y = jnp.exp(lsc) * y / jnp.sqrt(n2[..., None] + 1e-12)
    elif pre == "scale":
        y = jnp.exp(lsc) * y
    if kind == "flexformer-s":
        u = y @ om.T
        m = om.shape[0]
        vals = jnp.concatenate([jnp.cos(u), jnp.sin(u)], axis=-1) / np.sqrt(m)
        nu = 0.5
    else:
        u1, u2 = y @ om[0].T, y @ om[1].T
        m = om.shape[1]
        vals = jnp.concatenate([jnp.cos(u1) + jnp.cos(u2), jnp.sin(u1) + jnp.sin(u2)],
                               axis=-1) / (2 * np.sqrt(m))
        nu = 0.5 * jnp.exp(-rho)
    if pre == "normenv":  # the envelope of the raw norm, the features of the direction
        return vals, nu * n2
    return vals, nu * jnp.sum(y * y, axis=-1)


DENS = ("rule", "drop", "off")


def mix(jax, jnp, s, exa, lin, lmag, dots, neg=-1e30, den_mode="rule"):
    """One normalization over exact and linear terms, as core/attn/attn_linear.c
    computes a Flexformer row: the exact scores s (visible where exa) give
    E = Σ e^(s − s*), s* their max; the linear terms (where lin) weigh
    e^(lmag − s*)·dots, D their sum; where D < −E/2 both the linear weights
    and D are scaled by λ = (E/2)/|D|.
    s, exa, lin, lmag (log-magnitudes lnq + lnk + decay + β), dots (the
    values' inner products): [..][T] over keys. Returns (normalized weights
    [..][T], signed, to contract with the values; the linear share of the
    mass λD/(E + λD) [..]).

    den_mode (variants under measurement): "rule" the rule above; "drop"
    λ = 0 where D ≤ 0 (such a row falls back to its exact keys alone); the
    denominator is then ≥ E by construction, biased only on those rows);
    "off" λ = 0 everywhere (the linear branch off: the ablation)."""
    se = jnp.where(exa, s, neg)
    mx = jax.lax.stop_gradient(se.max(axis=-1, keepdims=True))
    pe = jnp.where(exa, jnp.exp(se - mx), 0.0)
    lw = jnp.clip(jnp.where(lin, lmag - mx, 0.0), -80.0, 80.0)
    pl = jnp.where(lin, jnp.exp(lw) * dots, 0.0)
    E = pe.sum(-1)
    D = pl.sum(-1)
    if den_mode == "drop":
        lam = jnp.where(D > 0, 1.0, 0.0)
    elif den_mode == "off":
        lam = jnp.zeros_like(D)
    else:
        lam = jnp.where(D < -0.5 * E, 0.5 * E / jnp.where(D < 0, -D, 1.0), 1.0)
    den = E + lam * D
    return (pe + lam[..., None] * pl) / den[..., None], lam * D / den
