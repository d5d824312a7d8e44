"""RSS follows the live attention state.

After a soak the RSS stayed 1 GB above what was live, also after every
session was deleted: not a leak but glibc's dynamic mmap threshold, which
rises to a state's size once such a block is freed, so that later states
come from the heap, where one live block pins every freed one below it.
darkserve fixes the threshold (server/main.c). Here 30 DARKFormer sessions
(each with a system message long enough to fill its state: ~11 MB resident,
341 MB for the 30) are made, with a few n=2 completions between them, and
all but the last deleted: the RSS must come back to the start plus what is
still held, sessions and prefix cache (measured: 454 MB above that before
the threshold was fixed, 18 MB after; 11 MB with the long messages).

The resident set counted is the anonymous one (RssAnon): the weights are
read in place from the model file's mapping, and its pages become resident
as requests touch them (~100 MB file-backed that were not there at the
start), which says nothing about the allocator.
"""
import time

from ds_server import MODEL


def _rss(pid):
    """Anonymous resident bytes of pid (not the model file's pages)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon")


# A state's memory becomes resident as it is used (core/attn/attn_linear.c,
# lin_state_t): a system message past the window and the sinks (~300 tokens,
# W + S = 272) fills each one; the prefix cache makes the 29 after the first
# a copy of the shared part rather than a prefill.
LONG = " ".join(f"Rule {i}: answer the question that was asked, in plain words, and stop."
                for i in range(20))


def test_rss_comes_back_after_sessions_are_deleted(servers):
    s = servers(model=MODEL, attn=None)  # the default: DARKFormer, constant-size states
    r0 = _rss(s.proc.pid)
    ids = []
    for k in range(30):
        st, obj, _ = s.post("/v1/sessions", {"system": f"{LONG} You are helper number {k}."})
        assert st == 201, obj
        ids.append(obj["id"])
        if k % 3 == 0:
            st, obj, _ = s.post("/v1/completions", {"prompt": "Hi", "n": 2, "max_tokens": 2})
            assert st == 200, obj
    r1 = _rss(s.proc.pid)
    assert r1 - r0 > 200 << 20, (r0, r1)  # the sessions took memory
    for sid in ids[:-1]:
        st, _, _ = s.request("DELETE", f"/v1/sessions/{sid}")
        assert st == 200
    time.sleep(0.5)
    m = s.metrics()
    # the prefix cache keeps states of the shared system message
    held = m["darkserve_session_state_bytes"] + m["darkserve_prefix_cache_bytes"]
    r2 = _rss(s.proc.pid)
    excess = r2 - r0 - held
    assert excess < 64 << 20, \
        f"anonymous RSS {r2 >> 20} MB after deleting 29 of 30 sessions: {excess / 2**20:.0f} MB above " \
        f"the start ({r0 >> 20} MB) plus the states still held ({held / 2**20:.0f} MB)"
