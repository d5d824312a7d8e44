#!/usr/bin/env python3
"""Writes tests/data/proto/utf8.json: UTF-8 repair vectors whose expected values
come from CPython's UTF-8 codec (an implementation independent of proto/):
bytes.decode('utf-8', 'replace') replaces maximal subparts by U+FFFD as Unicode
§3.9 recommends, and the incremental decoder's pending bytes give the
incomplete tail that proto_utf8_complete_prefix() must hold back.

Run: python3 tests/data/proto/gen_utf8.py   (deterministic: fixed seed)
"""
import codecs
import json
import os
import random

random.seed(1234)
vec = [
    b"", b"plain ascii", b"caf\xc3\xa9", b"\xe2\x82\xac", b"\xf0\x9f\x98\x80", b"a\x00b",
    b"\xe2\x82", b"ab\xe2\x82", b"\xf0\x9f\x98", b"\xf0\x9f", b"\xc3",
    b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xe0\x9f\xbf", b"\xed\xa0\x80", b"\xed\xbf\xbf",
    b"\xf0\x8f\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xff", b"\xfe\xff", b"\x80",
    b"\xbf\x80",
    b"\x61\xf1\x80\x80\xe1\x80\xc2\x62\x80\x63\x80\xbf\x64",  # Unicode 3.9, Table 3-8
    b"\xe2\x82\xe2\x82\xac", b"\xf4\x8f\xbf\xbf", b"\xef\xbf\xbd", b"\xe2\x28\xa1", b"\xc3\x28",
]
alphabet = [b"a", b"\x00", b"\xc3", b"\xa9", b"\xe2", b"\x82", b"\xac", b"\xf0", b"\x9f", b"\x98",
            b"\x80", b"\xed", b"\xa0", b"\xf4", b"\x90", b"\xc0", b"\xff", b"\xe0", b"\xbf"]
for _ in range(40):
    vec.append(b"".join(random.choice(alphabet) for _ in range(random.randint(1, 12))))

cases = []
for b in vec:
    out = b.decode("utf-8", "replace").encode("utf-8")
    try:
        b.decode("utf-8")
        valid = True
    except UnicodeDecodeError:
        valid = False
    d = codecs.getincrementaldecoder("utf-8")("replace")
    d.decode(b, final=False)
    pending = d.getstate()[0]
    cases.append({"name": "utf8 " + b.hex(), "hex": b.hex(),
                  "expect_ok": {"sanitized_hex": out.hex(), "valid": valid,
                                "complete_prefix": len(b) - len(pending)}})

source = ("expected values from CPython's UTF-8 codec: bytes.decode('utf-8', 'replace') "
          "(maximal subparts) and its incremental decoder's pending bytes; regenerate with "
          "tests/data/proto/gen_utf8.py")
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "utf8.json")
with open(path, "w") as f:
    f.write('{\n  "endpoint": "utf8",\n  "source": %s,\n  "cases": [\n' % json.dumps(source))
    f.write(",\n".join("    " + json.dumps(c) for c in cases))
    f.write("\n  ]\n}\n")
print(f"wrote {len(cases)} cases to {path}")
