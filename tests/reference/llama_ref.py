"""Independent numpy reference of the Llama forward pass (the oracle).

Reads and dequantizes the GGUF with the `gguf` Python package only
(gguf.GGUFReader + gguf.quants.dequantize) and computes in float64; nothing
from darkserve is used, so agreement with the C model is evidence, not
tautology. Written from the Llama architecture description: pre-norm RMSNorm
blocks, rotary positions, grouped-query causal softmax attention, SwiGLU FFN,
final RMSNorm and a linear output head (tied to token_embd when output.weight
is absent).

RoPE: llama.cpp's converter permutes the Q/K rows of HF checkpoints so that
GGUF llama files use the "normal" rotation of consecutive pairs
(x[2i], x[2i+1]); rope="neox" (rotate halves (x[i], x[i+d/2])) is kept only
to show that the other convention is wrong for these files.

Also builds an HF `tokenizers` tokenizer from the GGUF vocabulary and merges,
so tests get token ids without the C tokenizer.
"""
import numpy as np
import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


class LlamaRef:
    def __init__(self, path, rope="normal"):
        r = gguf.GGUFReader(path)
        arch = _field(r, "general.architecture")
        if arch != "llama":
            raise ValueError(f"not a llama model: {arch}")
        k = lambda name, d=None: _field(r, "llama." + name, d)  # noqa: E731
        self.n_layer = int(k("block_count"))
        self.d = int(k("embedding_length"))
        self.n_head = int(k("attention.head_count"))
        self.n_head_kv = int(k("attention.head_count_kv", self.n_head))
        self.hd = int(k("attention.key_length", self.d // self.n_head))
        self.n_rot = int(k("rope.dimension_count", self.hd))
        self.base = float(k("rope.freq_base", 10000.0))
        self.eps = float(k("attention.layer_norm_rms_epsilon", 1e-5))
        scale = 1.0
        if k("rope.scaling.type") == "linear":
            scale = float(k("rope.scaling.factor", 1.0)) or 1.0
        self.rope_scale = scale
        self.rope = rope
        self.reader = r
        tensors = {t.name: t for t in r.tensors}

        def w(name):
            t = tensors[name]
            return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64)

        self.tok_embd = w("token_embd.weight")  # [V][D]
        self.n_vocab = self.tok_embd.shape[0]
        self.out_norm = w("output_norm.weight")
        self.output = w("output.weight") if "output.weight" in tensors else self.tok_embd
        self.layers = []
        for l in range(self.n_layer):
            p = f"blk.{l}."
            self.layers.append({n: w(p + n + ".weight") for n in (
                "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")})
        i = np.arange(self.n_rot // 2, dtype=np.float64)
        self.inv_freq = self.base ** (-2.0 * i / self.n_rot) / self.rope_scale

    def _rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def _rope(self, x, pos):
        """x: [T][nh][hd], pos: [T]."""
        ang = pos[:, None].astype(np.float64) * self.inv_freq[None, :]  # [T][n_rot/2]
        c = np.cos(ang)[:, None, :]
        s = np.sin(ang)[:, None, :]
        y = x.copy()
        if self.rope == "normal":
            a = x[..., 0:self.n_rot:2]
            b = x[..., 1:self.n_rot:2]
            y[..., 0:self.n_rot:2] = a * c - b * s
            y[..., 1:self.n_rot:2] = a * s + b * c
        else:
            h = self.n_rot // 2
            a = x[..., :h]
            b = x[..., h:self.n_rot]
            y[..., :h] = a * c - b * s
            y[..., h:self.n_rot] = a * s + b * c
        return y

    def new_cache(self):
        return {"pos": 0, "k": [None] * self.n_layer, "v": [None] * self.n_layer}

    def forward(self, tokens, cache=None, all_logits=True, kv_half=False, hidden=False):
        """Runs tokens after what cache holds; returns logits [T][V] (or [V]).
        kv_half: keys (after RoPE) and values rounded to IEEE half precision,
        as darkserve's linear attention kinds keep their window and sinks.
        hidden: returns every token's final hidden state instead, after the
        final norm ([T][D], the rows the output head multiplies: what the
        embedding endpoints pool)."""
        if cache is None:
            cache = self.new_cache()
        tokens = np.asarray(tokens, dtype=np.int64)
        T = len(tokens)
        P = cache["pos"]
        pos = np.arange(P, P + T)
        H, Hkv, Hd = self.n_head, self.n_head_kv, self.hd
        group = H // Hkv
        x = self.tok_embd[tokens]  # [T][D]
        for l, ly in enumerate(self.layers):
            xn = self._rms(x, ly["attn_norm"])
            q = (xn @ ly["attn_q"].T).reshape(T, H, Hd)
            k = (xn @ ly["attn_k"].T).reshape(T, Hkv, Hd)
            v = (xn @ ly["attn_v"].T).reshape(T, Hkv, Hd)
            q = self._rope(q, pos)
            k = self._rope(k, pos)
            if kv_half:  # float32 first, as the C model holds them, then half
                k = k.astype(np.float32).astype(np.float16).astype(np.float64)
                v = v.astype(np.float32).astype(np.float16).astype(np.float64)
            if cache["k"][l] is None:
                K, V = k, v
            else:
                K = np.concatenate([cache["k"][l], k], axis=0)
                V = np.concatenate([cache["v"][l], v], axis=0)
            cache["k"][l], cache["v"][l] = K, V
            n_ctx = P + T
            mask = np.arange(n_ctx)[None, :] <= pos[:, None]  # [T][ctx]
            out = np.empty((T, H, Hd))
            for h in range(H):
                hk = h // group
                s = (q[:, h, :] @ K[:, hk, :].T) / np.sqrt(Hd)  # [T][ctx]
                s = np.where(mask, s, -np.inf)
                s = s - s.max(axis=1, keepdims=True)
                p = np.exp(s)
                p /= p.sum(axis=1, keepdims=True)
                out[:, h, :] = p @ V[:, hk, :]
            x = x + out.reshape(T, H * Hd) @ ly["attn_output"].T
            xn = self._rms(x, ly["ffn_norm"])
            g = xn @ ly["ffn_gate"].T
            u = xn @ ly["ffn_up"].T
            x = x + (g / (1.0 + np.exp(-g)) * u) @ ly["ffn_down"].T
        cache["pos"] = P + T
        if hidden:
            return self._rms(x, self.out_norm)
        xs = x if all_logits else x[-1:]
        logits = self._rms(xs, self.out_norm) @ self.output.T
        return logits if all_logits else logits[0]

    def greedy(self, tokens, n):
        """Greedy continuation of n tokens with a KV cache."""
        cache = self.new_cache()
        last = self.forward(tokens, cache, all_logits=False)
        out = []
        for _ in range(n):
            t = int(np.argmax(last))
            out.append(t)
            last = self.forward([t], cache, all_logits=False)
        return out


def hf_tokenizer(path):
    """A `tokenizers` Tokenizer from a gpt2-style GGUF vocabulary."""
    r = gguf.GGUFReader(path)
    tokens = _field(r, "tokenizer.ggml.tokens")
    merges = _field(r, "tokenizer.ggml.merges")
    types = _field(r, "tokenizer.ggml.token_type", [1] * len(tokens))
    pre = _field(r, "tokenizer.ggml.pre", "gpt2")
    vocab = {t: i for i, t in enumerate(tokens)}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges]))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if pre == "smollm":
        # SmolLM's pre-tokenizer splits digits one by one before the byte-level regex.
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tk.pre_tokenizer = byte_level
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(tokens, types) if ty == 3])
    return tk
