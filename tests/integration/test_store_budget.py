"""The session folder's budget (docs/API.md "Disk"): --max-session-disk and
--max-session-files count every session file and every checkpoint file, and
after each request that wrote a session the folder holds no more than they
allow, what /metrics reports is what the folder holds, and the defaults the
server runs with are the figures the documents state."""
import os
import re

import subprocess

from ds_server import BIN, ROOT, TINY, Server

CKPT = re.compile(r"^[0-9a-f]{32}(\.\d+(\.\d+)?)?$")


def folder(srv):
    """(bytes, files) of the session and checkpoint files in the folder."""
    names = [f for f in os.listdir(srv.session_dir) if CKPT.match(f)]
    return sum(os.path.getsize(os.path.join(srv.session_dir, f)) for f in names), len(names)


def turn(srv, sid, text):
    st, r, _ = srv.post(f"/v1/sessions/{sid}/generate",
                        {"text": text, "max_tokens": 4, "temperature": 0, "stream": False})
    assert st == 200, r
    return r


def test_the_budget_holds_after_every_write(servers, tmp_path):
    # one session with two turns: what a session with checkpoints takes
    probe = Server(tmp_path / "probe", TINY, name="probe", args=["--checkpoints", "2"])
    try:
        st, r, _ = probe.post("/v1/sessions", {"system": "measure"})
        for w in ("a", "b"):
            turn(probe, r["id"], f" {w}")
        one, _ = folder(probe)
    finally:
        probe.kill()
    budget = 4 * one  # room for about four such sessions, checkpoints included
    srv = servers(args=["--checkpoints", "2", "--max-session-disk", str(budget),
                        "--max-session-files", "11"])
    kept = []
    for i in range(12):
        st, r, _ = srv.post("/v1/sessions", {"system": f"session {i}"})
        assert st == 201, r
        kept.append(r["id"])
        for w in ("a", "b", "c"):
            turn(srv, r["id"], f" {w}{i}")
            size, files = folder(srv)
            assert size <= budget and files <= 11, (i, size, budget, files)
            assert srv.metrics()["darkserve_session_disk_bytes"] == size
    # the oldest sessions went (the unit tests check that checkpoints go first)
    m = srv.metrics()
    assert m["darkserve_session_disk_evictions_total"] > 0
    st, lst, _ = srv.json("GET", "/v1/sessions?limit=100")
    left = [s["id"] for s in lst["data"]]
    assert kept[-1] in left and kept[0] not in left
    for sid in left:  # what is listed loads
        st, _, blob = srv.request("GET", f"/v1/sessions/{sid}/state")
        assert st == 200 and blob[:4] == b"DSST", sid


def test_the_documented_defaults_are_the_servers(tmp_path):
    out = subprocess.run([BIN, "serve", "--print-config"], capture_output=True, text=True,
                         check=True, cwd=tmp_path).stdout
    disk = re.search(r"^max-session-disk\s+(\S+)\s+\(default\)", out, re.M).group(1)
    files = re.search(r"^max-session-files\s+(\S+)\s+\(default\)", out, re.M).group(1)
    def words(name):
        with open(os.path.join(ROOT, "docs", name), encoding="utf-8") as f:
            return " ".join(f.read().split())

    api, deploy = words("API.md"), words("DEPLOY.md")
    assert f"`--max-session-disk` (default {disk})" in api, disk
    assert f"`--max-session-files` (default {files})" in api, files
    assert f"`DARKSERVE_MAX_SESSION_DISK` (default {disk})" in deploy, disk
    assert f"`DARKSERVE_MAX_SESSION_FILES` (default {files})" in deploy, files
