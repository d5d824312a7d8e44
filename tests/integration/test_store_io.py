"""Session store I/O runs off the event loop.

Forks, exports, imports and the writes at the end of a request serialize,
write and fsync whole states; on the loop thread they stopped every other
connection (/health took up to 616 ms under 20 forks + exports). Here 20
forks and 20 exports of a large exact-attention session run at once while
/health is probed; the median probe must answer within 50 ms (the median of
many probes, so that one unlucky scheduling slice on a loaded machine does
not decide). Behaviour check with a generous bound, asked for by the issue.
"""
import statistics
import threading
import time

from ds_server import MODEL

# a long exact-attention history makes a large state (its KV cache)
TEXT = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(60))


def test_health_answers_while_large_sessions_fork_and_export(servers):
    s = servers(model=MODEL, attn="exact", args=["--max-sessions", "64"])
    st, obj, _ = s.post("/v1/sessions", {"system": TEXT})
    assert st == 201, obj
    sid = obj["id"]
    st, info, _ = s.json("GET", f"/v1/sessions/{sid}")
    assert st == 200, info
    assert info["state_bytes"] > 20_000_000, info  # large enough to matter

    results = []
    lock = threading.Lock()

    def fork():
        r = s.post(f"/v1/sessions/{sid}/fork", {})
        with lock:
            results.append(("fork", r[0]))

    def export():
        st_, _, body = s.request("GET", f"/v1/sessions/{sid}/state")
        with lock:
            results.append(("export", st_, len(body)))

    workers = [threading.Thread(target=f) for _ in range(20) for f in (fork, export)]
    lat = []
    done = threading.Event()

    def probe():
        while not done.is_set():
            c = s.conn(timeout=30)
            t0 = time.monotonic()
            c.request("GET", "/health")
            r = c.getresponse()
            r.read()
            lat.append(time.monotonic() - t0)
            c.close()
            assert r.status == 200
            time.sleep(0.02)

    prober = threading.Thread(target=probe)
    prober.start()
    time.sleep(0.2)
    n0 = len(lat)
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    n1 = len(lat)
    done.set()
    prober.join()

    assert len(results) == 40
    # one after the other in the store: none is refused as busy
    assert all(r[1] == 201 for r in results if r[0] == "fork"), results
    exports = [r for r in results if r[0] == "export"]
    assert all(r[1] == 200 and r[2] == info["state_bytes"] for r in exports), exports
    during = lat[n0:n1]
    assert len(during) >= 5, f"too few probes during the burst: {len(during)}"
    med = statistics.median(during)
    assert med < 0.050, f"/health median {med * 1e3:.0f} ms over {len(during)} probes " \
                        f"(max {max(during) * 1e3:.0f} ms) while sessions were forked and exported"


def _proc_bytes(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"{key} not in /proc/{pid}/status")


def test_export_makes_no_copy_of_the_state(servers):
    """GET .../state answers with the serialized blob itself: the server's
    peak memory grows by one state, not by two or three copies of it
   . The peak is reset through /proc/PID/clear_refs before each
    export."""
    s = servers(model=MODEL, attn="exact")
    st, obj, _ = s.post("/v1/sessions", {"system": TEXT})
    assert st == 201, obj
    sid = obj["id"]
    st, info, _ = s.json("GET", f"/v1/sessions/{sid}")
    n = info["state_bytes"]
    assert n > 20_000_000, info
    growth = []
    for _ in range(3):
        with open(f"/proc/{s.proc.pid}/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        base = _proc_bytes(s.proc.pid, "VmRSS")
        st, _, body = s.request("GET", f"/v1/sessions/{sid}/state")
        assert st == 200 and len(body) == n
        growth.append((_proc_bytes(s.proc.pid, "VmHWM") - base) / n)
    # one copy is 1.0 (measured 1.00; 2.00 when the blob was copied twice)
    assert min(growth) < 1.5, f"peak memory grew by {growth} states per export"
