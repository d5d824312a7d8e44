"""A crash at any step of a session store change leaves the previous or the
new session, checkpoints included, never a mix (docs/API.md "Persistence").

Each change (an import with checkpoints into a session that has its own,
one into a new session, fork, rollback, a turn that links a checkpoint and
prunes the oldest, delete) runs on a copy of one prepared
session directory, with the fault seam (server/api/api_faults.c) set to
"kill-at N": the server kills itself (SIGKILL) right before the Nth create,
write, link, rename or unlink of the session directory. N goes 1, 2, ...
until the change completes without reaching it; that run is killed -9 after
its answer (an acknowledged change must survive that too). After every run
the server is started again on the directory and its sessions are read
back: each session's info and its export (state and every checkpoint, the
owner sections without their timestamps and the directory's checkpoint
generation), plus the files in the directory. Every run must read back
exactly the sessions as they were before the change, or exactly as the
completed change left them; no temp file or stray checkpoint may remain.
A run that reads back the sessions as they were must also leave every file
byte for byte as it was.

The number of fault points per change and what each crash left are printed
(pytest -s)."""
import os
import re
import shutil
import signal
import struct

import pytest

from ds_server import TINY, Server

FAULT = "DARKSERVE_TEST_FAULT_FILE"
CKPTS = 3
ARGS = ["--checkpoints", str(CKPTS)]
MAX_POINTS = 80  # a change with more fault points than this is a bug of its own


# ---- reading state blobs (docs/DESIGN.md section 5) ----

def _u32(b, o):
    return struct.unpack_from("<I", b, o)[0]


def _u64(b, o):
    return struct.unpack_from("<Q", b, o)[0]


def norm_owner(ob):
    """The store's owner section without what a crash may rightly change:
    its version, the creation and last-use times, and the checkpoint
    generation (version 5's last 8 bytes), which only names files."""
    if len(ob) < 24:
        return ob
    rest = ob[4:8] + ob[24:]
    return rest[:-8] if _u32(ob, 0) >= 5 else rest


def norm_blob(b):
    """A state blob as (header fields, owner, pending + sampler + attention,
    checkpoints), each checkpoint likewise."""
    assert b[:4] == b"DSST", b[:16]
    own, pend, smp, attn, n_ck = _u32(b, 128), _u32(b, 124), _u32(b, 120), _u64(b, 112), \
        _u32(b, 132)
    off = 136
    owner = b[off:off + own]
    off += own
    body = b[off:off + 4 * pend + smp + attn]
    off += 4 * pend + smp + attn
    cks = []
    for _ in range(n_ck):
        n = _u64(b, off)
        cks.append(norm_blob(b[off + 8:off + 8 + n]))
        off += 8 + n
    assert off + 4 == len(b), (off, len(b))
    return (b[16:128], norm_owner(owner), body, tuple(cks))


def norm_info(i):
    return tuple(sorted((k, repr(v)) for k, v in i.items()
                        if k not in ("id", "created", "last_used")))


# ---- runs ----

def gen_turn(srv, sid, text):
    st, r, _ = srv.post(f"/v1/sessions/{sid}/generate",
                        {"text": text, "max_tokens": 3, "temperature": 0, "seed": 1,
                         "stream": False})
    assert st == 200, r
    return r


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A session directory with a target session T (3 turns, so checkpoints
    after 0, 1 and 2), a source S whose export (3 checkpoints) is the blob an
    import brings, and a new session N (no turn yet)."""
    tmp = tmp_path_factory.mktemp("crash")
    d = str(tmp / "template")
    srv = Server(tmp, TINY, name="prep", args=ARGS, session_dir=d)
    try:
        ids = {}
        for name, words in (("T", ["one", "two", "three"]), ("S", ["red", "green", "blue"])):
            st, r, _ = srv.post("/v1/sessions", {"system": f"session {name}"})
            assert st == 201, r
            ids[name] = r["id"]
            for w in words:
                gen_turn(srv, r["id"], f" {w}")
        st, r, _ = srv.post("/v1/sessions", {"system": "session N"})
        assert st == 201, r
        ids["N"] = r["id"]
        st, _, blob = srv.request("GET", f"/v1/sessions/{ids['S']}/state")
        assert st == 200 and _u32(blob, 132) == 3, st
        assert srv.stop() == 0
    finally:
        srv.kill()
    return dict(ids, dir=d, blob=blob, tmp=tmp)


def op_import(srv, t):
    return srv.request("PUT", f"/v1/sessions/{t['T']}/state", t["blob"],
                       {"Content-Type": "application/octet-stream"})[0], 200


def op_import_new(srv, t):
    return srv.request("PUT", f"/v1/sessions/{t['N']}/state", t["blob"],
                       {"Content-Type": "application/octet-stream"})[0], 200


def op_fork(srv, t):
    return srv.post(f"/v1/sessions/{t['T']}/fork", {})[0], 201


def op_rollback(srv, t):
    return srv.post(f"/v1/sessions/{t['T']}/rollback", {"turns": 2})[0], 200


def op_turn(srv, t):
    # the fourth turn: links checkpoint 3, and the oldest (0) goes
    return srv.post(f"/v1/sessions/{t['T']}/generate",
                    {"text": " four", "max_tokens": 3, "temperature": 0, "seed": 1,
                     "stream": False})[0], 200


def op_delete(srv, t):
    return srv.json("DELETE", f"/v1/sessions/{t['T']}")[0], 200


CKPT_NAME = re.compile(r"^([0-9a-f]{32})\.(\d+)(?:\.(\d+))?$")


def files_of(d):
    """{name: bytes} of the session and checkpoint files in d."""
    out = {}
    for f in os.listdir(d):
        if CKPT_NAME.match(f) or re.fullmatch(r"[0-9a-f]{32}", f):
            with open(os.path.join(d, f), "rb") as fh:
                out[f] = fh.read()
    return out


def snapshot(srv, t):
    """Every session as a restarted server reads it back, ids of sessions
    a change made replaced by "new"; and the directory holds nothing else."""
    st, lst, _ = srv.json("GET", "/v1/sessions?limit=100")
    assert st == 200, lst
    out, want_files = [], {".lock"}
    for s in lst["data"]:
        sid = s["id"]
        st, inf, _ = srv.json("GET", f"/v1/sessions/{sid}")
        assert st == 200, inf
        st, _, blob = srv.request("GET", f"/v1/sessions/{sid}/state")
        assert st == 200, blob[:200]
        name = sid if sid in (t["T"], t["S"], t["N"]) else "new"
        out.append((name, norm_info(inf), norm_blob(blob)))
        want_files.add(sid)
        turns = {c["turn"] for c in inf["checkpoints"]}
        for f in os.listdir(srv.session_dir):
            m = CKPT_NAME.match(f)
            if m and m.group(1) == sid and int(m.group(2)) in turns:
                want_files.add(f)
        assert len([f for f in want_files if f.startswith(sid + ".")]) == len(turns), \
            (sid, inf["checkpoints"], sorted(os.listdir(srv.session_dir)))
    files = set(os.listdir(srv.session_dir))
    assert files == want_files, f"left behind: {sorted(files - want_files)}"
    return sorted(out)


def run(t, label, op, kill_at):
    """One run of op on a fresh copy of the template, killed at fault point
    kill_at -> (answered, what the log says was killed, the snapshot after
    a restart); op None: the snapshot of the copy as it is."""
    base = t["tmp"] / f"{label}-{kill_at}"
    sess = str(base / "sess")
    shutil.copytree(t["dir"], sess)
    fault = base / "fault"
    fault.write_text("none")
    srv = Server(base, TINY, name="srv", args=ARGS, session_dir=sess, env={FAULT: str(fault)})
    try:
        if op is None:  # the sessions before any change
            return None, None, (snapshot(srv, t), files_of(sess))
        if kill_at:
            fault.write_text(f"kill-at {kill_at}")
        try:
            status, ok = op(srv, t)
        except OSError:  # killed under the request
            status, ok = None, None
        if status is None:
            assert srv.proc.wait(timeout=60) == -signal.SIGKILL
        else:
            assert status == ok, (label, kill_at, status)
            srv.proc.kill()  # an acknowledged change survives kill -9
            srv.proc.wait()
        m = re.search(r"killing the process before store operation \d+ \((\w+)\)", srv.log_text())
        fault.write_text("none")
        srv.start()
        snap = snapshot(srv, t)
        return status is not None, m.group(1) if m else None, (snap, files_of(sess))
    finally:
        srv.kill()


@pytest.mark.parametrize("label,op", [("import", op_import), ("import-new", op_import_new),
                                      ("fork", op_fork),
                                      ("rollback", op_rollback), ("turn", op_turn),
                                      ("delete", op_delete)])
def test_a_crash_at_every_step_leaves_the_old_or_the_new_sessions(template, label, op):
    _, _, (old, old_files) = run(template, label, None, 0)
    assert old_files == files_of(template["dir"])
    crashed = []
    for n in range(1, MAX_POINTS + 1):
        answered, what, snap = run(template, label, op, n)
        if answered:
            new = snap[0]
            break
        crashed.append((n, what, snap))
    else:
        raise AssertionError(f"{label}: still crashing after {MAX_POINTS} fault points")
    assert new != old, f"{label}: the completed change changed nothing"
    outcome = []
    for n, what, (snap, files) in crashed:
        assert snap in (old, new), f"{label}: a crash at point {n} ({what}) left a mix"
        if snap == old:
            assert files == old_files, f"{label}: a crash at point {n} ({what}) changed a file"
        outcome.append(f"{n}:{what}->{'old' if snap == old else 'new'}")
    assert crashed, f"{label}: no fault point"
    print(f"\n{label}: {len(crashed)} fault points, 1 run each: {' '.join(outcome)}")
