"""Independent numpy reference of the Gemma 3 text decoder (the oracle).

Reads and dequantizes the GGUF with the `gguf` Python package only
(gguf.GGUFReader + gguf.quants.dequantize) and computes in float64; nothing
from darkserve is used. Written from Gemma 3's published description (the
Gemma 3 technical report and the Hugging Face Gemma3 text model):

  x = embed(tokens) * sqrt(D)
  per layer:
    h = attention(RMSNorm_in(x));  x = x + RMSNorm_post_attn(h)
    h = FFN(RMSNorm_pre_ffn(x));   x = x + RMSNorm_post_ffn(h)
  logits = RMSNorm_final(x) @ embed^T     (tied head; soft-capped if the file says so)

  attention: grouped-query, q and k RMS-normalized per head over the head
    dimension, rotated by RoPE (NeoX halves: x[i] pairs with x[i + Hd/2]),
    scores scaled by query_pre_attn_scalar^-1/2 (= head dim unless the file
    carries gemma3.attention.scale); local layers (all but every sixth,
    layer % 6 != 5) see the last sliding_window positions only and use RoPE
    base 10,000, global layers see everything with the file's base (1e6).
  FFN: GeGLU, down(gelu_tanh(gate(x)) * up(x)).
  RMSNorm(x) = x / sqrt(mean(x^2) + eps) * (1 + w) in Gemma's checkpoints;
    llama.cpp's converter stores 1 + w, so the file's weights are used as
    they are (norm_offset = 0; norm_offset = 1 shows the other reading is
    wrong: test_gemma3_oracle.py).

Also builds a `sentencepiece` BPE model from the GGUF vocabulary (pieces,
scores, types, byte fallback, no dummy prefix, whitespace escaped to U+2581)
so tests get token ids from Google's own implementation, not the C one.
"""
import numpy as np
import gguf


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


class Gemma3Ref:
    def __init__(self, path, norm_offset=0.0):
        r = gguf.GGUFReader(path)
        arch = _field(r, "general.architecture")
        if arch != "gemma3":
            raise ValueError(f"not a gemma3 model: {arch}")
        k = lambda name, d=None: _field(r, "gemma3." + name, d)  # noqa: E731
        self.n_layer = int(k("block_count"))
        self.d = int(k("embedding_length"))
        self.n_head = int(k("attention.head_count"))
        self.n_head_kv = int(k("attention.head_count_kv", self.n_head))
        self.hd = int(k("attention.key_length", self.d // self.n_head))
        self.eps = float(k("attention.layer_norm_rms_epsilon", 1e-6))
        self.window = int(k("attention.sliding_window"))
        self.period = int(k("attention.sliding_window_pattern", 6))
        self.base_global = float(k("rope.freq_base", 1e6))
        self.base_local = float(k("rope.freq_base_swa", 10000.0))
        self.scale = float(k("attention.scale", self.hd ** -0.5))
        self.softcap = float(k("final_logit_softcapping", 0.0) or 0.0)
        self.norm_offset = norm_offset
        self.reader = r
        tensors = {t.name: t for t in r.tensors}

        def w(name, dtype=np.float64):
            t = tensors[name]
            return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=dtype)

        # [V][D] kept in float32 (262,144 x 640 in float64 would be 1.3 GB);
        # every product with it is done in float64 a block of rows at a time.
        self.tok_embd = w("token_embd.weight", np.float32)
        self.n_vocab = self.tok_embd.shape[0]
        self.output = w("output.weight", np.float32) if "output.weight" in tensors else self.tok_embd
        self.out_norm = w("output_norm.weight")
        names = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm",
                 "attn_output", "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up",
                 "ffn_down", "post_ffw_norm")
        self.layers = [{n: w(f"blk.{l}.{n}.weight") for n in names} for l in range(self.n_layer)]

    def is_local(self, l):
        return l % self.period != self.period - 1

    def _rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * (w + self.norm_offset)

    def _rope(self, x, pos, base):
        """NeoX rotation of x: [T][nh][hd] at positions pos [T]."""
        half = self.hd // 2
        inv = base ** (-2.0 * np.arange(half, dtype=np.float64) / self.hd)
        ang = pos[:, None].astype(np.float64) * inv[None, :]
        c = np.cos(ang)[:, None, :]
        s = np.sin(ang)[:, None, :]
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)

    @staticmethod
    def _gelu_tanh(x):
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))

    def new_cache(self):
        return {"pos": 0, "k": [None] * self.n_layer, "v": [None] * self.n_layer}

    def head(self, h):
        """Logits of final-norm rows h [n][D] (float64), a block of the head at a time."""
        out = np.empty((h.shape[0], self.n_vocab))
        for v0 in range(0, self.n_vocab, 16384):
            out[:, v0:v0 + 16384] = h @ self.output[v0:v0 + 16384].astype(np.float64).T
        if self.softcap > 0:
            out = self.softcap * np.tanh(out / self.softcap)
        return out

    def forward(self, tokens, cache=None, rows=None):
        """Runs tokens after what cache holds; returns the logits [len(rows)][V]
        of the new tokens at indices rows (default: all)."""
        if cache is None:
            cache = self.new_cache()
        tokens = np.asarray(tokens, dtype=np.int64)
        T = len(tokens)
        P = cache["pos"]
        pos = np.arange(P, P + T)
        H, Hkv, Hd = self.n_head, self.n_head_kv, self.hd
        group = H // Hkv
        x = self.tok_embd[tokens].astype(np.float64) * np.sqrt(self.d)
        for l, ly in enumerate(self.layers):
            local = self.is_local(l)
            base = self.base_local if local else self.base_global
            xn = self._rms(x, ly["attn_norm"])
            q = (xn @ ly["attn_q"].T).reshape(T, H, Hd)
            k = (xn @ ly["attn_k"].T).reshape(T, Hkv, Hd)
            v = (xn @ ly["attn_v"].T).reshape(T, Hkv, Hd)
            q = self._rope(self._rms(q, ly["attn_q_norm"]), pos, base)
            k = self._rope(self._rms(k, ly["attn_k_norm"]), pos, base)
            K = k if cache["k"][l] is None else np.concatenate([cache["k"][l], k], axis=0)
            V = v if cache["v"][l] is None else np.concatenate([cache["v"][l], v], axis=0)
            cache["k"][l], cache["v"][l] = K, V
            kpos = np.arange(P + T)
            mask = kpos[None, :] <= pos[:, None]
            if local:
                mask &= pos[:, None] - kpos[None, :] < self.window
            out = np.empty((T, H, Hd))
            for h in range(H):
                hk = h // group
                s = (q[:, h, :] @ K[:, hk, :].T) * self.scale
                s = np.where(mask, s, -np.inf)
                s = s - s.max(axis=1, keepdims=True)
                p = np.exp(s)
                p /= p.sum(axis=1, keepdims=True)
                out[:, h, :] = p @ V[:, hk, :]
            a = out.reshape(T, H * Hd) @ ly["attn_output"].T
            x = x + self._rms(a, ly["post_attention_norm"])
            xn = self._rms(x, ly["ffn_norm"])
            f = (self._gelu_tanh(xn @ ly["ffn_gate"].T) * (xn @ ly["ffn_up"].T)) @ ly["ffn_down"].T
            x = x + self._rms(f, ly["post_ffw_norm"])
        cache["pos"] = P + T
        sel = np.arange(T) if rows is None else np.asarray(rows)
        return self.head(self._rms(x[sel], self.out_norm))

    def greedy(self, tokens, n):
        """Greedy continuation of n tokens with a KV cache."""
        cache = self.new_cache()
        last = self.forward(tokens, cache, rows=[len(tokens) - 1])[0]
        out = []
        for _ in range(n):
            t = int(np.argmax(last))
            out.append(t)
            last = self.forward([t], cache)[0]
        return out


class SpmTokenizer:
    """Google's sentencepiece (BPE) over a SentencePiece-style GGUF vocabulary
    (tokenizer.ggml.model == "llama"). encode(text) gives what llama.cpp and
    HF give with special-token parsing: the text is cut at CONTROL token
    texts (leftmost, longest), each stretch encoded by sentencepiece, the
    control ids put between, BOS first when add_bos_token (add_bos=True)."""

    def __init__(self, path):
        import sentencepiece as spm
        from sentencepiece import sentencepiece_model_pb2 as pb

        r = gguf.GGUFReader(path)
        if _field(r, "tokenizer.ggml.model") != "llama":
            raise ValueError("not a SentencePiece-style vocabulary")
        self.tokens = _field(r, "tokenizer.ggml.tokens")
        scores = _field(r, "tokenizer.ggml.scores")
        types = _field(r, "tokenizer.ggml.token_type")
        self.bos = int(_field(r, "tokenizer.ggml.bos_token_id", 1))
        self.eos = int(_field(r, "tokenizer.ggml.eos_token_id", 2))
        unk = int(_field(r, "tokenizer.ggml.unknown_token_id", 0))
        self.add_bos = bool(_field(r, "tokenizer.ggml.add_bos_token", True))
        prefix = bool(_field(r, "tokenizer.ggml.add_space_prefix", True))
        P = pb.ModelProto.SentencePiece
        kind = {1: P.NORMAL, 2: P.UNKNOWN, 3: P.CONTROL, 4: P.USER_DEFINED, 5: P.UNUSED,
                6: P.BYTE}
        mp = pb.ModelProto()
        for i, (t, s, ty) in enumerate(zip(self.tokens, scores, types)):
            p = mp.pieces.add()
            # llama.cpp's converter writes the spaces of USER_DEFINED pieces
            # as " " (it matches them before escaping); the original
            # tokenizer.model has them escaped, as sentencepiece matches them
            p.piece = t.replace(" ", "\u2581") if int(ty) == 4 else t
            p.score = float(s)
            # sentencepiece wants its unknown piece typed UNKNOWN (the GGUF
            # may call it CONTROL)
            p.type = P.UNKNOWN if i == unk else kind[int(ty)]
        ts = mp.trainer_spec
        ts.model_type = pb.TrainerSpec.BPE
        ts.vocab_size = len(self.tokens)
        ts.byte_fallback = True
        ts.unk_id, ts.bos_id, ts.eos_id = unk, self.bos, self.eos
        ts.pad_id = int(_field(r, "tokenizer.ggml.padding_token_id", -1))
        ns = mp.normalizer_spec
        ns.name = "identity"
        ns.add_dummy_prefix = prefix
        ns.remove_extra_whitespaces = False
        ns.escape_whitespaces = True
        self.sp = spm.SentencePieceProcessor(model_proto=mp.SerializeToString())
        self.control = sorted(((t, i) for i, (t, ty) in enumerate(zip(self.tokens, types))
                               if int(ty) == 3 and t), key=lambda p: -len(p[0]))

    def _split_special(self, text):
        """[(str, None) | (None, id)], control texts matched leftmost-longest."""
        out, i, start = [], 0, 0
        while i < len(text):
            hit = None
            if text[i] == "<":
                for t, tid in self.control:
                    if text.startswith(t, i):
                        hit = (t, tid)
                        break
            if hit:
                if i > start:
                    out.append((text[start:i], None))
                out.append((None, hit[1]))
                i += len(hit[0])
                start = i
            else:
                i += 1
        if start < len(text):
            out.append((text[start:], None))
        return out

    def encode(self, text, add_bos=False, parse_special=True):
        ids = [self.bos] if add_bos and self.add_bos else []
        parts = self._split_special(text) if parse_special else [(text, None)]
        for s, tid in parts:
            ids += [tid] if s is None else self.sp.encode(s)
        return ids

    def decode(self, ids):
        return self.sp.decode(list(ids))
