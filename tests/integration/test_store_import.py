"""PUT /v1/sessions/{id}/state checks what later requests rely on, not only
the checksum: a blob whose pending grammar (docs/API.md "Continuing a
constrained reply") does not compile, or whose reply so far does not follow
it, in the state or in one of its checkpoints, is refused with 400 saying
which, and the session keeps what it had. Without the check such a blob
imported with 200 and the next generate with continue_grammar answered 500.

The blobs are the server's own exports with bytes of the owner section
changed and the CRC-32s sealed again (zlib's CRC-32 is the blob's)."""
import struct
import zlib

from test_session_grammar import RF, valid

OCT = {"Content-Type": "application/octet-stream"}


def _u32(b, o):
    return struct.unpack_from("<I", b, o)[0]


def _u64(b, o):
    return struct.unpack_from("<Q", b, o)[0]


def seal(b):
    """b with its trailing CRC-32 computed again."""
    return b[:-4] + struct.pack("<I", zlib.crc32(b[:-4]))


def pending_grammar_at(b):
    """(offset of the grammar text, its length, the reply's length) in the
    owner section of blob b (store owner section version >= 4)."""
    own = 136
    assert _u32(b, own) >= 4, _u32(b, own)
    end = own + 72 + 4 * _u32(b, own + 68)
    t, r = _u32(b, end), _u32(b, end + 4)
    assert t > 0, "no pending grammar"
    return end + 8, t, r


def checkpoint_at(b, i):
    """(offset, length) of checkpoint i of blob b."""
    off = 136 + _u32(b, 128) + 4 * _u32(b, 124) + _u32(b, 120) + _u64(b, 112)
    for _ in range(i):
        off += 8 + _u64(b, off)
    return off + 8, _u64(b, off)


def create(srv):
    st, r, _ = srv.post("/v1/sessions", {})
    assert st == 201, r
    return r["id"]


def generate(srv, sid, **body):
    body.setdefault("stream", False)
    st, r, _ = srv.post(f"/v1/sessions/{sid}/generate", body)
    assert st == 200, r
    return r


def cut(srv, sid):
    r = generate(srv, sid, text="A thing as JSON:", response_format=RF, max_tokens=4,
                 temperature=1, seed=1)
    assert r["finish_reason"] == "length" and "pending_grammar" in r["session"], r
    return r["text"]


def put(srv, sid, blob):
    st, _, data = srv.request("PUT", f"/v1/sessions/{sid}/state", blob, OCT)
    return st, data.decode()


def test_a_pending_grammar_that_cannot_continue_is_refused(tiny):
    src = create(tiny)
    text = cut(tiny, src)
    st, _, good = tiny.request("GET", f"/v1/sessions/{src}/state")
    assert st == 200
    off, t, r = pending_grammar_at(good)
    assert r == len(text.encode()) and r > 0
    dst = create(tiny)
    assert put(tiny, dst, good)[0] == 200
    before = tiny.json("GET", f"/v1/sessions/{dst}")[1]

    # the reply so far no longer follows the grammar (a JSON object starts with '{')
    bad = bytearray(good)
    bad[off + t:off + t + r] = b"x" * r
    st, msg = put(tiny, dst, seal(bytes(bad)))
    assert st == 400, msg
    assert "pending reply" in msg and "does not follow the pending grammar" in msg, msg
    # the grammar itself is no grammar
    bad = bytearray(good)
    bad[off:off + t] = b"(" * t
    st, msg = put(tiny, dst, seal(bytes(bad)))
    assert st == 400, msg
    assert "pending grammar" in msg and "not a valid grammar" in msg, msg

    # nothing changed: the session continues the reply it had, to a valid whole
    after = tiny.json("GET", f"/v1/sessions/{dst}")[1]
    assert {k: v for k, v in after.items() if k != "last_used"} == \
        {k: v for k, v in before.items() if k != "last_used"}
    out = text
    for k in range(20):
        g = generate(tiny, dst, continue_grammar=True, max_tokens=24, temperature=1, seed=2 + k)
        out += g["text"]
        if g["finish_reason"] == "stop":
            break
    valid(out)


def test_a_checkpoint_with_a_broken_pending_grammar_is_refused(tiny):
    """The state after turn 1 left a pending grammar; turn 2 cleared it. The
    export carries that state as checkpoint 1: a rollback to it would leave
    the broken reply to continue, so the import is refused."""
    src = create(tiny)
    cut(tiny, src)
    generate(tiny, src, text=" plain", max_tokens=2, temperature=0)
    st, _, good = tiny.request("GET", f"/v1/sessions/{src}/state")
    assert st == 200 and _u32(good, 132) == 2, _u32(good, 132)
    c_off, c_len = checkpoint_at(good, 1)
    ck = bytearray(good[c_off:c_off + c_len])
    off, t, r = pending_grammar_at(bytes(ck))
    ck[off + t:off + t + r] = b"x" * r
    bad = good[:c_off] + seal(bytes(ck)) + good[c_off + c_len:]
    dst = create(tiny)
    st, msg = put(tiny, dst, seal(bad))
    assert st == 400, msg
    assert "checkpoint 1" in msg and "does not follow the pending grammar" in msg, msg
    assert put(tiny, dst, good)[0] == 200
