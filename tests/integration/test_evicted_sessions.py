"""Evicted sessions: reading a session back from disk happens on
the store's I/O thread, never on the event loop, and the state it brings
back (like an imported or forked one) is admitted against
--max-state-memory first: 429 state_memory_full with Retry-After when it
does not fit next to what is held now. A session pushed back to disk again
before its request could use it is read again on the I/O thread a few times,
then refused with 503 session_store_busy, never read on the loop; so is one
evicted between the moment its handler could have seen it in memory and its
acquire (the loop acquires without reading, and goes round on "not in
memory").

The disk is made slow with the server's fault seam (server/api/api_faults.c,
DARKSERVE_TEST_FAULT_FILE): "stall" holds every session-file read before it
starts, and every write half way, until the word changes; "evict-after-read"
moves a session back to disk right after the I/O thread read it;
"evict-before-acquire" drops it from memory right before a handler acquires
it on the loop ("evict-before-acquire-stall" also holds the read). The tiny model
with exact attention makes the state sizes easy to reason about: a state
that may grow to the whole 512-token context is bounded by
4096 + 3 x (16 + 512 x 256) = 397,456 bytes (api_state_bound).
"""
import json
import os
import threading
import time

from ds_server import wait_for

WORDS = " ".join(f"w{i}" for i in range(100))  # ~350 tokens


def _create(srv, body):
    st, obj, _ = srv.post("/v1/sessions", body)
    assert st == 201, obj
    return obj["id"]


def _in_memory(srv):
    return srv.metrics()['darkserve_sessions{where="memory"}']


def _stalled_write(srv):
    """A state write has begun and stopped half way (a .tmp file with bytes)."""
    def half():
        tmp = [f for f in os.listdir(srv.session_dir) if f.endswith(".tmp")]
        return tmp and os.path.getsize(os.path.join(srv.session_dir, tmp[0])) > 0
    return wait_for(half, 60)


def _post_in_thread(srv, path, body, out):
    def run():
        out.append(srv.post(path, body, timeout=120))
    t = threading.Thread(target=run)
    t.start()
    return t


def _uses(a):
    """(path, body) of each request that continues session a."""
    return (
        (f"/v1/sessions/{a}/generate",
         {"text": " go on", "max_tokens": 2, "stream": False, "temperature": 0}),
        (f"/v1/sessions/{a}/append", {"text": " more"}),
        ("/v1/completions", {"prompt": " p", "max_tokens": 1, "session": a}),
        ("/v1/chat/completions",
         {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "session": a}))


class _HealthProbe:
    """GET /health every 20 ms in a thread while the block runs: .answers
    [(status, seconds)] (a request the loop left waiting times out at 5 s)."""

    def __init__(self, srv):
        self.srv, self.answers, self.done = srv, [], threading.Event()
        self.t = threading.Thread(target=self._run)

    def _run(self):
        while not self.done.is_set():
            t0 = time.monotonic()
            try:
                st = self.srv.request("GET", "/health", timeout=5)[0]
            except OSError:
                st = None
            self.answers.append((st, time.monotonic() - t0))
            time.sleep(0.02)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.t.join()

    def all_quick(self):
        return self.answers and all(st == 200 and dt < 2.0 for st, dt in self.answers)


def _with_fault(servers, tmp_path, args=()):
    """A server with the fault file (no fault yet): (srv, fault)."""
    fault = tmp_path / "fault"
    fault.write_text("none")
    return servers(args=list(args), env={"DARKSERVE_TEST_FAULT_FILE": str(fault)}), fault


def _first_on_disk(servers, tmp_path):
    """A server with --max-sessions 1 and the fault file (no fault yet), and
    the id of a session that a second one pushed to disk: (srv, fault, id)."""
    srv, fault = _with_fault(servers, tmp_path, ["--max-sessions", "1"])
    a = _create(srv, {"system": "the first session"})
    _create(srv, {"system": "the second one pushes the first to disk"})
    assert wait_for(lambda: _in_memory(srv) == 1, 30)
    return srv, fault, a


def test_evicted_session_is_read_off_the_loop(servers, tmp_path):
    srv, fault, a = _first_on_disk(servers, tmp_path)
    st, before, _ = srv.json("GET", f"/v1/sessions/{a}")

    fault.write_text("stall")  # reading a back now waits
    out = []
    t = _post_in_thread(srv, f"/v1/sessions/{a}/generate",
                        {"text": " go on", "max_tokens": 2, "stream": False, "temperature": 0},
                        out)
    time.sleep(0.5)
    assert not out, out  # waiting for the disk
    # the loop is free meanwhile: other requests are answered at once
    for _ in range(3):
        t0 = time.monotonic()
        assert srv.request("GET", "/health", timeout=5)[0] == 200
        st, obj, _ = srv.json("GET", f"/v1/sessions/{a}", timeout=5)
        assert st == 200 and obj["tokens"] == before["tokens"], obj
        assert time.monotonic() - t0 < 2.0
    fault.write_text("none")
    t.join(120)
    st, obj, _ = out[0]
    assert st == 200, obj  # read back, then the generation ran
    assert obj["usage"]["completion_tokens"] == 2, obj


def test_evicted_reads_and_imports_are_admitted(servers, tmp_path):
    srv, fault = _with_fault(servers, tmp_path,
                             ["--max-state-memory", "600K", "--max-sessions", "2"])
    b = _create(srv, {"system": WORDS})  # past 256 tokens: may grow to the whole context
    st, _, blob = srv.request("GET", f"/v1/sessions/{b}/state")
    assert st == 200
    _create(srv, {})
    a = _create(srv, {"system": "short"})  # three sessions, two in memory: b went to disk
    assert wait_for(lambda: _in_memory(srv) == 2, 30)

    # a's generation reserves ~400 KB (its state may reach 512 tokens) and
    # holds it, busy, while its state write is stalled
    fault.write_text("stall")
    out = []
    t = _post_in_thread(srv, f"/v1/sessions/{a}/generate",
                        {"text": " go", "max_tokens": 300, "stream": False, "temperature": 0},
                        out)
    assert _stalled_write(srv), "a's state write never began"
    # b's ~400 KB do not fit next to it: refused before anything is read
    st, hd, raw = srv.request("POST", f"/v1/sessions/{b}/generate",
                              {"text": " x", "max_tokens": 1, "stream": False}, timeout=10)
    assert st == 429, raw
    assert hd.get("retry-after") == "1" and b"state_memory_full" in raw, (hd, raw)
    st, obj, _ = srv.post(f"/v1/sessions/{b}/append", {"text": " y"}, timeout=10)
    assert st == 429 and obj["error"]["code"] == "state_memory_full", obj
    st, obj, _ = srv.post("/v1/completions", {"prompt": "p", "max_tokens": 1, "session": b},
                          timeout=10)
    assert st == 429, obj
    # an import of that size, and a fork of b, likewise
    st, hd, raw = srv.request("PUT", f"/v1/sessions/{b}/state", blob,
                              {"Content-Type": "application/octet-stream"}, timeout=10)
    assert st == 429 and b"state_memory_full" in raw, raw
    st, obj, _ = srv.post(f"/v1/sessions/{b}/fork", {}, timeout=10)
    assert st == 429, obj
    assert not out  # a is still being written

    fault.write_text("none")
    t.join(120)
    assert out[0][0] == 200, out[0]
    # the memory came back: b loads, imports and forks
    st, obj, _ = srv.post(f"/v1/sessions/{b}/generate",
                          {"text": " x", "max_tokens": 1, "stream": False})
    assert st == 200, obj
    st, _, raw = srv.request("PUT", f"/v1/sessions/{b}/state", blob,
                             {"Content-Type": "application/octet-stream"})
    assert st == 200, raw
    st, obj, _ = srv.post(f"/v1/sessions/{b}/fork", {})
    assert st == 201, obj


def test_session_evicted_again_is_refused_not_read_on_the_loop(servers, tmp_path):
    # every read of a on the I/O thread is undone before its handler runs
    # again: each request that needs it goes round a few times, then is
    # refused; the loop answers everyone else meanwhile
    _refused_while(*_first_on_disk(servers, tmp_path), "evict-after-read")


def _refused_while(srv, fault, a, mode):
    """With fault mode `mode`, each request continuing a is answered 503
    session_store_busy (not 200 from a read on the loop) while the loop
    answers /health at once; with the fault gone, a has its state from
    before and generates."""
    st, _, before = srv.request("GET", f"/v1/sessions/{a}/state")
    assert st == 200
    fault.write_text(mode)
    with _HealthProbe(srv) as health:
        for path, body in _uses(a):
            st, hd, raw = srv.request("POST", path, body, timeout=30)
            assert st == 503, (path, st, raw)  # not 200 from a read on the loop
            assert hd.get("retry-after") == "1", (path, hd)
            err = json.loads(raw)["error"]
            assert err["code"] == "session_store_busy" and a in err["message"], (path, err)
    assert health.all_quick(), health.answers

    fault.write_text("none")
    st, _, after = srv.request("GET", f"/v1/sessions/{a}/state")
    assert st == 200 and after == before
    st, obj, _ = srv.post(f"/v1/sessions/{a}/generate",
                          {"text": " go on", "max_tokens": 2, "stream": False, "temperature": 0})
    assert st == 200, obj
    assert obj["usage"]["completion_tokens"] == 2, obj


def _in_memory_with_fault(servers, tmp_path):
    """A server with the fault file (no fault yet) and the id of a session
    in memory whose file is current: (srv, fault, id)."""
    srv, fault = _with_fault(servers, tmp_path)
    a = _create(srv, {"system": "a session in memory"})  # written, so its file is current
    assert _in_memory(srv) == 1
    return srv, fault, a


def test_session_evicted_before_its_acquire_is_not_read_on_the_loop(servers, tmp_path):
    # a is in memory when each request's handler starts, and dropped from
    # memory right before the handler acquires it (every time): the loop
    # must not read it then, but go round through the I/O thread, and
    # after 3 reads refuse it
    _refused_while(*_in_memory_with_fault(servers, tmp_path), "evict-before-acquire")


def test_session_evicted_before_its_acquire_is_read_on_the_io_thread(servers, tmp_path):
    # the same race once per request, with the read held: the request waits
    # for the I/O thread while the loop answers everyone else, then runs
    srv, fault, a = _in_memory_with_fault(servers, tmp_path)
    for path, body in _uses(a):
        assert wait_for(lambda: _in_memory(srv) == 1, 30)  # a, the only session
        fault.write_text("evict-before-acquire-stall")
        out = []
        try:
            t = _post_in_thread(srv, path, body, out)
            time.sleep(0.5)
            assert not out, (path, out)  # waiting for the disk
            with _HealthProbe(srv) as health:
                time.sleep(0.3)
                st, obj, _ = srv.json("GET", f"/v1/sessions/{a}", timeout=5)
                assert st == 200, obj
            assert health.all_quick(), (path, health.answers)
        finally:
            fault.write_text("none")
        t.join(120)
        st, obj, _ = out[0]
        assert st == 200, (path, obj)  # read back on the I/O thread, then it ran
