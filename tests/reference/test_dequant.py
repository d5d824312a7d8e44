"""core/tensor.c and core/gguf.c against llama.cpp's Python reference (gguf-py).

Drives tests/helpers/dequant_dump. Dequantization must be bitwise equal to
gguf.quants.dequantize: for every tensor of the default model and for random
blocks of every implemented type. fp16/bf16 rounding is checked against numpy's
float16 cast and gguf-py's BF16 quantizer; core_dot_ref against an exact sum
(math.fsum). The GGUF writer is cross-checked with gguf.GGUFReader, and the
reader with files from gguf.GGUFWriter.
"""
import math
import subprocess

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT
from gguf.quants import dequantize, quantize

# Types core_dequantize implements, with the byte offsets of their fp16 scale
# fields inside one block (the rest of a block is free random bits).
SCALE_OFFSETS = {
    QT.Q4_0: [0], QT.Q4_1: [0, 2], QT.Q5_0: [0], QT.Q5_1: [0, 2], QT.Q8_0: [0],
    QT.Q2_K: [80, 82], QT.Q3_K: [108], QT.Q4_K: [0, 2], QT.Q5_K: [0, 2], QT.Q6_K: [208],
}


@pytest.fixture(scope="module")
def exe(build_dir):
    p = build_dir / "tests" / "helpers" / "dequant_dump"
    assert p.is_file(), f"{p} is missing: build it (make all)"
    return str(p)


def run(exe, *args):
    r = subprocess.run([exe, *map(str, args)], capture_output=True, timeout=120)
    assert r.returncode == 0, f"dequant_dump {args}: {r.stderr.decode()}"
    return r.stdout


def assert_bitwise(c, ref, what, nan_equal=False):
    assert c.shape == ref.shape, f"{what}: {c.shape} vs {ref.shape}"
    cb, rb = c.view(np.uint32), ref.view(np.uint32)
    bad = cb != rb
    if nan_equal:
        bad &= ~(np.isnan(c) & np.isnan(ref))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        with np.errstate(invalid="ignore"):
            md = float(np.nanmax(np.abs(c[bad].astype(np.float64) - ref[bad])))
        pytest.fail(f"{what}: {int(bad.sum())} values differ; first at {i}: "
                    f"C {c[i]!r} (0x{cb[i]:08x}) vs Python {ref[i]!r} (0x{rb[i]:08x}); "
                    f"max |diff| {md}")


def sane_halves(rng, n):
    """fp16 scale bit patterns: mostly ordinary magnitudes of both signs, plus
    zeros, subnormals and values near the fp16 maximum."""
    mag = np.exp2(rng.uniform(-14, 6, n)) * rng.choice([-1.0, 1.0], n)
    h = mag.astype(np.float16).view(np.uint16)
    kind = rng.random(n)
    h = np.where(kind < 0.03, rng.choice([0x0000, 0x8000], n), h)
    h = np.where((kind >= 0.03) & (kind < 0.08),
                 rng.integers(1, 0x400, n) | rng.choice([0, 0x8000], n), h)
    h = np.where((kind >= 0.08) & (kind < 0.10), rng.integers(0x7800, 0x7c00, n), h)
    return h.astype(np.uint16)


def random_blocks(rng, qtype, n_blocks, sane=True):
    _, bsize = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n_blocks, bsize), dtype=np.uint8)
    if sane:
        for off in SCALE_OFFSETS[qtype]:
            raw[:, off:off + 2] = sane_halves(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return raw


def c_blocks(exe, tmp_path, qtype, raw):
    src = tmp_path / "blocks.raw"
    raw.tofile(src)
    n_blocks = raw.shape[0]
    out = run(exe, "blocks", int(qtype), n_blocks, src, "-")
    return np.frombuffer(out, dtype=np.float32)


# ---- dequantization ----

def test_every_tensor_of_the_model_is_bitwise_equal(exe, model_path):
    reader = gguf.GGUFReader(model_path)
    listed = run(exe, "list", model_path).decode().splitlines()
    assert len(listed) == len(reader.tensors) == 272
    proc = subprocess.Popen([exe, "all", str(model_path), "-"], stdout=subprocess.PIPE)
    try:
        for line, t in zip(listed, reader.tensors):
            name, tname, n = line.split("\t")
            assert (name, tname, int(n)) == (t.name, t.tensor_type.name, int(t.n_elements))
            c = np.frombuffer(proc.stdout.read(4 * int(t.n_elements)), dtype=np.float32)
            ref = dequantize(t.data, t.tensor_type).reshape(-1)
            assert_bitwise(c, ref, f"tensor {t.name} ({t.tensor_type.name})")
        assert proc.stdout.read(1) == b""
    finally:
        proc.stdout.close()
        assert proc.wait(timeout=60) == 0


@pytest.mark.parametrize("qtype", list(SCALE_OFFSETS), ids=lambda q: q.name)
def test_random_blocks_bitwise_equal(exe, tmp_path, qtype):
    rng = np.random.default_rng(1000 + int(qtype))
    n_blocks = 8192 if gguf.GGML_QUANT_SIZES[qtype][0] == 32 else 2048
    raw = random_blocks(rng, qtype, n_blocks)
    assert_bitwise(c_blocks(exe, tmp_path, qtype, raw), dequantize(raw, qtype).reshape(-1),
                   f"{qtype.name} random blocks")


@pytest.mark.parametrize("qtype", list(SCALE_OFFSETS), ids=lambda q: q.name)
def test_random_bytes_including_inf_nan_scales(exe, tmp_path, qtype):
    # Whole blocks of random bytes: scales may be inf or NaN. NaN payloads are
    # not part of the contract, so NaN matches NaN; everything else bitwise.
    rng = np.random.default_rng(2000 + int(qtype))
    raw = random_blocks(rng, qtype, 1024, sane=False)
    with np.errstate(all="ignore"):
        ref = dequantize(raw, qtype).reshape(-1)
    assert_bitwise(c_blocks(exe, tmp_path, qtype, raw), ref, f"{qtype.name} random bytes",
                   nan_equal=True)


def test_f16_and_bf16_every_bit_pattern(exe, tmp_path):
    raw = np.arange(65536, dtype=np.uint16)
    for qtype in (QT.F16, QT.BF16):
        assert_bitwise(c_blocks(exe, tmp_path, qtype, raw.view(np.uint8).reshape(-1, 2)),
                       dequantize(raw.view(np.uint8), qtype).reshape(-1), qtype.name)


def test_f32_is_copied_bit_for_bit(exe, tmp_path):
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 2**32, 100000, dtype=np.uint64).astype(np.uint32)
    c = c_blocks(exe, tmp_path, QT.F32, raw.view(np.uint8).reshape(-1, 4))
    assert np.array_equal(c.view(np.uint32), raw)


# ---- fp32 -> fp16 / bf16 rounding ----

def rounding_inputs():
    rng = np.random.default_rng(11)
    finite = np.arange(0x10000, dtype=np.uint16).view(np.float16)
    finite = finite[np.isfinite(finite)].astype(np.float64)
    finite = np.unique(finite)
    mids = ((finite[1:] + finite[:-1]) / 2).astype(np.float32)  # exact in float32
    near = np.concatenate([mids, np.nextafter(mids, np.float32(np.inf)),
                           np.nextafter(mids, np.float32(-np.inf))])
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.996, 65520.0, 65536.0,
                        2.0**-24, 2.0**-25, 2.0**-26, 1.5 * 2.0**-25, 3 * 2.0**-25, 2.0**-14,
                        2.0**-14 - 2.0**-25, 1e-30, 1e30, 3.4e38], dtype=np.float32)
    rand = rng.integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    bits = np.concatenate([finite.astype(np.float32), near, special, -special, rand])
    nan_payloads = (np.uint32(0x7f800001) + rng.integers(0, 0x7fffff, 1000).astype(np.uint32))
    return np.concatenate([bits, nan_payloads.view(np.float32)]).astype(np.float32)


def test_fp32_to_fp16_matches_numpy(exe, tmp_path):
    x = rounding_inputs()
    x.tofile(tmp_path / "f.raw")
    c = np.frombuffer(run(exe, "f2h", tmp_path / "f.raw", "-"), dtype=np.uint16)
    with np.errstate(all="ignore"):
        ref = x.astype(np.float16)
    isnan = np.isnan(x)
    assert np.isnan(c.view(np.float16)[isnan]).all(), "NaN must stay NaN"
    bad = (c != ref.view(np.uint16)) & ~isnan
    assert not bad.any(), (f"{int(bad.sum())} differ, e.g. {x[bad][:5]!r}: "
                           f"C {c[bad][:5]} numpy {ref.view(np.uint16)[bad][:5]}")


def test_fp32_to_bf16_matches_gguf_py(exe, tmp_path):
    x = rounding_inputs()
    x.tofile(tmp_path / "f.raw")
    c = np.frombuffer(run(exe, "f2bf", tmp_path / "f.raw", "-"), dtype=np.uint16)
    ref = quantize(x, QT.BF16).view(np.uint16)
    assert np.array_equal(c, ref), f"{int((c != ref).sum())} bf16 values differ"


# ---- core_dot_ref ----

@pytest.mark.parametrize("qtype", [QT.F32, QT.F16, QT.BF16, *SCALE_OFFSETS], ids=lambda q: q.name)
def test_dot_ref_is_the_exact_sum_up_to_double_rounding(exe, tmp_path, qtype):
    rng = np.random.default_rng(3000 + int(qtype))
    be, bs = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = 4096 // be if be > 1 else 4096
    if qtype in SCALE_OFFSETS:
        raw = random_blocks(rng, qtype, n_blocks)
    else:
        vals = rng.standard_normal(n_blocks).astype(np.float32)
        raw = quantize(vals, qtype) if qtype != QT.F32 else vals
        raw = np.asarray(raw).view(np.uint8).reshape(n_blocks, bs)
    x = rng.standard_normal(n_blocks * be).astype(np.float32)
    raw.tofile(tmp_path / "row.raw")
    x.tofile(tmp_path / "x.raw")
    c = float(run(exe, "dot", int(qtype), n_blocks, tmp_path / "row.raw", tmp_path / "x.raw"))
    y = dequantize(raw, qtype).reshape(-1).astype(np.float64)
    terms = y * x.astype(np.float64)  # each product of two floats is exact in double
    exact = math.fsum(terms)
    bound = len(terms) * 2.0**-53 * float(np.abs(terms).sum())
    assert abs(c - exact) <= bound, f"{qtype.name}: C {c!r} exact {exact!r} bound {bound}"


# ---- GGUF writer <-> gguf-py ----

def fnv1a64(b: bytes) -> str:
    h = 1469598103934665603
    for ch in b:
        h = ((h ^ ch) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def test_our_writer_is_read_by_gguf_py(exe, tmp_path):
    path = tmp_path / "ours.gguf"
    run(exe, "write-sample", path)
    r = gguf.GGUFReader(path)
    f = r.fields
    expect = {
        "general.alignment": (VT.UINT32, 64),
        "general.architecture": (VT.STRING, "llama"),
        "t.u8": (VT.UINT8, 200), "t.i8": (VT.INT8, -100), "t.u16": (VT.UINT16, 60000),
        "t.i16": (VT.INT16, -30000), "t.u32": (VT.UINT32, 4000000000),
        "t.i32": (VT.INT32, -2000000000), "t.u64": (VT.UINT64, 9000000000000000000),
        "t.i64": (VT.INT64, -9000000000000000000), "t.f32": (VT.FLOAT32, float(np.float32(0.1))),
        "t.f64": (VT.FLOAT64, 0.1), "t.bool": (VT.BOOL, True), "t.str": (VT.STRING, 'h\u00e9llo "w"'),
    }
    for key, (vt, val) in expect.items():
        assert f[key].types == [vt], key
        assert f[key].contents() == val, key
    assert f["t.arr_i32"].types == [VT.ARRAY, VT.INT32] and f["t.arr_i32"].contents() == [-1, 0, 1]
    assert f["t.arr_f32"].contents() == [1.5, -2.25]
    assert f["t.arr_str"].contents() == ["a", "", "\u4e2d"]
    assert f["t.nested"].types[:2] == [VT.ARRAY, VT.ARRAY]
    assert r.alignment == 64
    t = {x.name: x for x in r.tensors}
    assert list(t) == ["f32", "q4_1"]
    assert t["f32"].tensor_type == QT.F32 and list(t["f32"].shape) == [3, 2]
    assert np.array_equal(t["f32"].data.reshape(-1), np.arange(6, dtype=np.float32) * 0.5 - 1.0)
    q = (np.arange(40) * 37 + 11).astype(np.uint8)
    q[0:4] = [0x00, 0x3C, 0x00, 0xBC]
    q[20:24] = [0x00, 0x38, 0x00, 0x00]
    assert t["q4_1"].tensor_type == QT.Q4_1 and list(t["q4_1"].shape) == [64]
    assert np.array_equal(np.asarray(t["q4_1"].data).view(np.uint8).reshape(-1), q)
    # And the data section is where we said: every offset a multiple of 64.
    assert all(x.data_offset % 64 == 0 for x in r.tensors)


def c_format(vt, v):
    """A value as dequant_dump's `dump` prints it."""
    if vt == VT.STRING:
        b = v.encode() if isinstance(v, str) else v
        out = []
        for ch in b:
            if ch in (0x22, 0x5C):
                out.append("\\" + chr(ch))
            elif ch < 0x20 or ch >= 0x7F:
                out.append(f"\\x{ch:02x}")
            else:
                out.append(chr(ch))
        return '"' + "".join(out) + '"'
    if vt in (VT.FLOAT32, VT.FLOAT64):
        return "%.17g" % v
    if vt == VT.BOOL:
        return "1" if v else "0"
    return str(int(v))


def c_format_arr(sub, vals):
    parts = []
    for v in vals:
        if isinstance(v, list):
            inner = VT.get_type(v[0]) if v else VT.INT32
            parts.append(c_format_arr(inner, v))
        else:
            parts.append(c_format(sub, v))
    return "[" + ",".join(parts) + "]"


def test_gguf_py_writer_is_read_by_us(exe, tmp_path):
    path = tmp_path / "theirs.gguf"
    w = gguf.GGUFWriter(path, arch="llama")
    scalars = [
        ("s.u8", VT.UINT8, 255), ("s.i8", VT.INT8, -128), ("s.u16", VT.UINT16, 65535),
        ("s.i16", VT.INT16, -32768), ("s.u32", VT.UINT32, 4294967295), ("s.i32", VT.INT32, -5),
        ("s.u64", VT.UINT64, 2**63 - 1), ("s.i64", VT.INT64, -(2**63)),
        ("s.f32", VT.FLOAT32, -0.25), ("s.f64", VT.FLOAT64, 1e300), ("s.bool", VT.BOOL, False),
        ("s.str", VT.STRING, "tab\there \u00fc\u20ac"),
    ]
    for key, vt, val in scalars:
        w.add_key_value(key, val, vt)
    arrays = [
        ("a.ints", VT.INT32, [1, -2, 3]),
        ("a.floats", VT.FLOAT32, [0.5, -1.0]),
        ("a.strs", VT.STRING, ["x", "yy", "\u00e9"]),
        ("a.bools", VT.BOOL, [True, False, True]),
        ("a.nested", VT.ARRAY, [[1, 2], [3]]),
        ("a.nested_str", VT.ARRAY, [["a", "b"], ["c"]]),
        ("a.deep", VT.ARRAY, [[[7]], [[8, 9]]]),
    ]
    for key, _, val in arrays:
        w.add_array(key, val)
    rng = np.random.default_rng(5)
    tensors = {
        "t.f32": (np.arange(12, dtype=np.float32).reshape(3, 4), None),
        "t.f16": (rng.standard_normal((2, 8)).astype(np.float16), None),
        "t.q8_0": (quantize(rng.standard_normal((2, 64)).astype(np.float32), QT.Q8_0), QT.Q8_0),
        "t.q4_0": (quantize(rng.standard_normal((1, 32)).astype(np.float32), QT.Q4_0), QT.Q4_0),
        "t.q6_k": (rng.integers(0, 256, (2, 210), dtype=np.uint8), QT.Q6_K),
    }
    for name, (arr, qt) in tensors.items():
        w.add_tensor(name, arr, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    lines = run(exe, "dump", path).decode().splitlines()
    assert lines[0] == "VERSION\t3" and lines[1] == "ALIGNMENT\t32"
    kv = {l.split("\t")[1]: l.split("\t", 3)[2:] for l in lines if l.startswith("KV\t")}
    assert kv["general.architecture"] == ["string", '"llama"']
    for key, vt, val in scalars:
        assert kv[key] == [vt.name.lower(), c_format(vt, val)], key
    for key, sub, val in arrays:
        assert kv[key][0] == "array"
        assert kv[key][1] == c_format_arr(sub, val), key
    got = [l.split("\t")[1:] for l in lines if l.startswith("TENSOR\t")]
    reader = gguf.GGUFReader(path)
    assert [g[0] for g in got] == list(tensors)
    for g, t in zip(got, reader.tensors):
        name, tname, dims, offset, h = g
        assert (name, tname) == (t.name, t.tensor_type.name)
        assert dims == ",".join(str(int(d)) for d in t.shape)
        assert int(offset) == t.data_offset - reader.data_offset
        assert h == fnv1a64(np.asarray(t.data).tobytes()), name
