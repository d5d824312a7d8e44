"""tools/recall.py, the recall benchmark, checked for its mechanics on the
tiny random model (which answers garbage: nothing here is about accuracy):

- the Wilson interval against known values, the answer parser, the run
  order (small cells first);
- prompts sized with the server's /tokenize to within 2% of the target, for
  chat prompts (passkey, multikey) and sessions (multiturn), and the
  needles where they should be;
- filler taken from the calibration corpus (every line of a prompt's filler
  is in it), never from a path under /usr/share/doc/python3*;
- the same --seed gives the same prompts to two server configurations;
- resume: a second run with the same --out runs no trial, a run missing
  trials runs exactly those (and gets the same prompts and answers), a larger
  --trials runs only the new ones; --max-seconds stops cleanly;
- --compare prints both files' cells, rates, intervals and differences;
- bad arguments exit 2 with the usage line.
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from ds_server import BIN, ROOT, TINY

TOOL = os.path.join(ROOT, "tools", "recall.py")


def load_recall():
    spec = importlib.util.spec_from_file_location("recall", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


recall = load_recall()


def run_tool(args, timeout=600):
    return subprocess.run([sys.executable, TOOL] + args, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("recall-cache"))


@pytest.fixture(scope="module")
def corpus_text(cache):
    return recall.load_corpus(recall.DEFAULT_CORPUS, cache)


def tool_args(cache, out, extra=()):
    """A small grid on the tiny model, linear attention (no context limit)."""
    return ["--bin", BIN, "--model", TINY, "--cache", cache, "--out", str(out),
            "--tasks", "passkey,multikey,multiturn", "--lengths", "300,1200",
            "--depths", "0.1,0.9", "--turn-tokens", "600,2500", "--trials", "2",
            "--keys", "4", "--quiet"] + list(extra) + ["--", "--attn", "performer"]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, cache):
    """One full small run; its result file and stdout, shared by the tests."""
    out = tmp_path_factory.mktemp("recall-run") / "r.json"
    p = run_tool(tool_args(cache, out))
    assert p.returncode == 0, p.stderr
    with open(out) as f:
        return out, json.load(f), p


# ---------------------------------------------------------------- unit-level

@pytest.mark.parametrize("k,n,lo,hi", [
    (0, 20, 0.0, 0.161), (20, 20, 0.839, 1.0), (10, 20, 0.299, 0.701),
    (1, 10, 0.018, 0.404), (18, 20, 0.699, 0.972), (0, 1, 0.0, 0.793)])
def test_wilson_known_values(k, n, lo, hi):
    got = recall.wilson(k, n)
    assert got[0] == pytest.approx(lo, abs=6e-4) and got[1] == pytest.approx(hi, abs=6e-4), got


def test_wilson_is_symmetric_and_contains_the_rate():
    for n in (1, 7, 20, 60):
        for k in range(n + 1):
            lo, hi = recall.wilson(k, n)
            assert 0 <= lo <= k / n <= hi <= 1
            lo2, hi2 = recall.wilson(n - k, n)
            assert lo == pytest.approx(1 - hi2) and hi == pytest.approx(1 - lo2)


@pytest.mark.parametrize("text,want", [
    ("The pass key is 71432.", 71432),
    ("71432", 71432),
    ("It is 12345, not 54321.", 12345),
    ("123456 then 98765", 98765),          # six digits are not a 5-digit number
    ("1234 and 12,345", None),
    ("a7143b", None),
    ("key:07143!", 7143),                  # a leading zero is still five digits
    ("The pass key is a secret.", None),
    ("", None),
    (None, None),
])
def test_parse_answer(text, want):
    assert recall.parse_answer(text) == want


def test_run_order_puts_small_cells_first():
    a, _ = recall.parse_args(["--tasks", "multiturn,passkey,multikey", "--lengths",
                              "4096,1024", "--depths", "0.5,0.1", "--turn-tokens", "2048",
                              "--trials", "3"])
    plan = recall.plan_trials(a)
    assert len(plan) == 3 * (2 * 2 * 2 + 1)
    sizes = [p[1] for p in plan]
    assert sizes == sorted(sizes)
    assert plan[:6] == [("passkey", 1024, 0.1, i) for i in range(3)] + \
        [("passkey", 1024, 0.5, i) for i in range(3)]
    assert plan[12] == ("multiturn", 2048, None, 0)


def test_insert_needles_at_depths_on_boundaries():
    text = "".join("Sentence number %d is here. " % i for i in range(100))
    offs = list(range(len(text) + 1))
    body, pos = recall.insert_needles(text, offs, len(text), [(0.5, "MID."), (0.0, "TOP."),
                                                              (1.0, "END.")])
    assert body.startswith("TOP.\n\nSentence number 0 ")      # a paragraph of its own
    assert body.endswith("Sentence number 99 is here. END.\n\n")
    assert body[pos[0]:].startswith("MID. Sentence number ")   # between two sentences
    assert body[pos[0] - 7:pos[0]] == " here. "
    assert abs(pos[0] - len(body) / 2) < 60
    assert body[pos[1]:].startswith("TOP.") and body[pos[2]:] == "END.\n\n"
    # nothing of the text is lost or moved
    assert " ".join(body.replace("MID.", "").replace("TOP.", "").replace("END.", "").split()) \
        == " ".join(text.split())


# ---------------------------------------------------------------- the corpus

def test_filler_is_never_from_python_docs(tmp_path, cache):
    docs = "/usr/share/doc/python3.11-doc/html/library/os.html"
    p = run_tool(["--corpus", docs, "--trials", "1"])
    assert p.returncode == 2 and "usage:" in p.stderr and "reserved" in p.stderr, p.stderr
    # a link to them is refused the same way
    link = tmp_path / "innocent.txt"
    os.symlink("/usr/share/doc/python3-doc/whatsnew.txt", link)
    p = run_tool(["--corpus", str(link), "--trials", "1"])
    assert p.returncode == 2 and "reserved" in p.stderr, p.stderr
    with pytest.raises(recall.Usage):
        recall.load_corpus(docs, cache)
    # the default is the calibration corpus
    assert recall.DEFAULT_CORPUS == os.path.join(ROOT, "models", "corpus", "calibration.txt.xz")


def test_results_name_the_calibration_corpus(first_run):
    _, res, _ = first_run
    assert res["config"]["corpus"] == "models/corpus/calibration.txt.xz"
    assert res["config"]["corpus_sha256"] == recall.sha256_file(recall.DEFAULT_CORPUS)


def test_decompressed_corpus_is_cached(cache, corpus_text):
    files = [f for f in os.listdir(cache) if f.endswith(".txt")]
    assert len(files) == 1
    assert os.path.getsize(os.path.join(cache, files[0])) > 10_000_000
    assert corpus_text.startswith(open(os.path.join(cache, files[0]), encoding="utf-8")
                                  .read(1000))


# ---------------------------------------------------------------- against a tiny server

@pytest.fixture(scope="module")
def tiny_linear(tmp_path_factory):
    from ds_server import Server
    s = Server(tmp_path_factory.mktemp("tiny-linear"), TINY, name="tiny-linear",
               attn="performer")
    yield s
    s.kill()


def make_runner(server, cache, args=()):
    a, _ = recall.parse_args(["--url", server.url()] + list(args))
    c = recall.Client(a.url)
    return recall.Runner(c, recall.Filler(recall.load_corpus(a.corpus, cache), c), a), c


@pytest.mark.parametrize("target", [200, 1000, 4000])
def test_prompt_sizing_via_tokenize(tiny_linear, cache, corpus_text, target):
    runner, c = make_runner(tiny_linear, cache)
    rng = recall.trial_rng(7, "passkey", target, 0.5, 0)
    needles = [(0.5, recall.PASSKEY_NEEDLE.format(key=48213))]
    p = runner.sized_prompt(target, recall.PASSKEY_INTRO, needles, recall.PASSKEY_QUESTION,
                            rng)
    content = p["content"]
    # the server's own count of the chat prompt, template included
    _, prompt_tokens, _ = c.chat(content, 1)
    assert abs(prompt_tokens - target) <= 0.02 * target, (prompt_tokens, target)
    assert len(c.tokenize(content)) + runner.chat_overhead() == prompt_tokens
    # the needle is about halfway, counted in tokens
    back = runner.tokens_back(content, content.index(needles[0][1]))
    assert 0.35 * target < back < 0.65 * target, back
    # every filler line is text of the calibration corpus
    filler = content[len(recall.PASSKEY_INTRO):-len(recall.PASSKEY_QUESTION)]
    lines = [l for l in filler.replace(needles[0][1], "\n").split("\n") if len(l) > 20]
    assert lines
    for l in lines:
        assert l.strip() in corpus_text, l


def test_trials_are_sized_and_recorded(first_run):
    out, res, p = first_run
    trials = res["trials"]
    cells = {(t["task"], t["size"], t["depth"]) for t in trials}
    assert cells == {(t, n, d) for t in ("passkey", "multikey") for n in (300, 1200)
                     for d in (0.1, 0.9)} | {("multiturn", 600, None), ("multiturn", 2500, None)}
    assert len(trials) == 2 * len(cells)
    for t in trials:
        assert set(t) >= {"task", "size", "depth", "trial", "key", "answer", "parsed",
                          "correct", "prompt_tokens", "prompt_sha256", "tokens_back"}
        assert 10000 <= t["key"] <= 99999
        assert t["correct"] == (recall.parse_answer(t["answer"]) == t["key"])
        size = t["size"] - (16 if t["task"] == "multiturn" else 0)  # the answer fits in K
        assert abs(t["prompt_tokens"] - size) <= 0.02 * size, t
        if t["task"] == "multiturn":
            assert t["filler_turns"] >= 1
            assert t["tokens_back"] > 0.9 * size
        elif t["size"] >= 1200:
            # the intro, question and template (and multikey's other pairs) are
            # outside the filler the depth is a fraction of: a short prompt's
            # needle is further from its depth
            frac = t["tokens_back"] / t["prompt_tokens"]
            assert abs(frac - (1 - t["depth"])) < (0.1 if t["task"] == "passkey" else 0.15), t
    back = {(t["task"], t["size"], t["depth"], t["trial"]): t["tokens_back"] for t in trials}
    for (task, size, depth, i), b in back.items():
        if depth == 0.1:
            assert b > back[(task, size, 0.9, i)] + size // 3
        if t["task"] == "multikey":
            assert len(t["keys"]) == 4 and t["keys"][t["asked"]] == t["key"]
    # the table: one row per cell with k/n, rate and the Wilson interval
    rows = [l for l in p.stdout.splitlines() if l.startswith("| passkey ")]
    assert len(rows) == 4
    for l in p.stdout.splitlines():
        if l.startswith("| multiturn | 600 "):
            k = sum(t["correct"] for t in trials if t["size"] == 600)
            lo, hi = recall.wilson(k, 2)
            assert "%d/2" % k in l and "[%.3f, %.3f]" % (lo, hi) in l, l
            break
    else:
        raise AssertionError(p.stdout)
    # keys differ between trials (seeded, not constant)
    assert len({t["key"] for t in trials}) > len(trials) // 2


def test_second_run_does_no_new_trial(first_run, cache):
    out, res, _ = first_run
    before = open(out, "rb").read()
    p = run_tool(tool_args(cache, out))
    assert p.returncode == 0, p.stderr
    assert "recall: 0 new trials" in p.stderr, p.stderr
    assert open(out, "rb").read() == before
    assert "| passkey " in p.stdout


def test_resume_runs_exactly_the_missing_trials(first_run, cache, tmp_path):
    out, res, _ = first_run
    part = dict(res, trials=res["trials"][:-3])
    path = tmp_path / "partial.json"
    path.write_text(json.dumps(part))
    p = run_tool(tool_args(cache, path))
    assert p.returncode == 0, p.stderr
    assert "recall: 3 new trials" in p.stderr, p.stderr
    again = json.loads(path.read_text())["trials"]
    assert len(again) == len(res["trials"])
    key = lambda t: (t["task"], t["size"], t["depth"], t["trial"])
    old = {key(t): t for t in res["trials"]}
    for t in again:
        o = old[key(t)]
        # same prompt, and the greedy answer to it
        assert (t["prompt_sha256"], t["key"], t["answer"]) == \
            (o["prompt_sha256"], o["key"], o["answer"]), key(t)


def test_more_trials_run_only_the_new_ones(first_run, cache, tmp_path):
    out, res, _ = first_run
    path = tmp_path / "grow.json"
    path.write_text(out.read_text())
    args = tool_args(cache, path)
    args[args.index("--trials") + 1] = "3"
    args[args.index("--tasks") + 1] = "passkey"
    args[args.index("--lengths") + 1] = "300"
    p = run_tool(args)
    assert p.returncode == 0, p.stderr
    assert "recall: 2 new trials" in p.stderr, p.stderr
    got = json.loads(path.read_text())["trials"]
    assert [(t["depth"], t["trial"]) for t in got[len(res["trials"]):]] == [(0.1, 2), (0.9, 2)]


def test_max_seconds_stops_cleanly(cache, tmp_path):
    path = tmp_path / "short.json"
    p = run_tool(tool_args(cache, path, ["--max-seconds", "0.001"]))
    assert p.returncode == 0, p.stderr
    assert "left (--max-seconds)" in p.stderr, p.stderr
    n = len(json.loads(path.read_text())["trials"]) if path.exists() else 0
    assert n < 16


def test_resume_refuses_other_settings(first_run, cache):
    out, _, _ = first_run
    p = run_tool(tool_args(cache, out, ["--seed", "99"]))
    assert p.returncode == 2 and "seed" in p.stderr and "usage:" in p.stderr, p.stderr
    args = tool_args(cache, out, ["--trials", "3"]) + ["--window", "64"]
    p = run_tool(args)             # another server configuration, same file
    assert p.returncode == 2 and "another --out" in p.stderr, p.stderr


def test_same_seed_same_prompts_across_configurations(tiny_linear, cache, tmp_path, first_run):
    """--url of a running server (here the tiny model, linear attention with
    other flags than first_run's) sees the prompts of first_run, trial for trial."""
    path = tmp_path / "url.json"
    p = run_tool(["--url", tiny_linear.url(), "--cache", cache, "--out", str(path),
                  "--tasks", "passkey,multiturn", "--lengths", "300", "--depths", "0.9",
                  "--turn-tokens", "600", "--trials", "2", "--keys", "4", "--quiet"])
    assert p.returncode == 0, p.stderr
    res = json.loads(path.read_text())
    assert res["server"]["flags"] is None and res["server"]["url"] == tiny_linear.url()
    old = {(t["task"], t["size"], t["depth"], t["trial"]): t for t in first_run[1]["trials"]}
    for t in res["trials"]:
        o = old[(t["task"], t["size"], t["depth"], t["trial"])]
        assert (t["prompt_sha256"], t["key"], t["prompt_tokens"]) == \
            (o["prompt_sha256"], o["key"], o["prompt_tokens"])
    # the sessions of multiturn trials were deleted afterwards
    st, body, _ = tiny_linear.json("GET", "/v1/sessions")
    assert st == 200 and body["data"] == [], body
    # another seed: other prompts
    p = run_tool(["--url", tiny_linear.url(), "--cache", cache, "--out", str(tmp_path / "s.json"),
                  "--tasks", "passkey", "--lengths", "300", "--depths", "0.9", "--trials", "2",
                  "--seed", "99", "--quiet"])
    assert p.returncode == 0, p.stderr
    other = json.loads((tmp_path / "s.json").read_text())["trials"]
    assert {t["prompt_sha256"] for t in other}.isdisjoint(
        {t["prompt_sha256"] for t in res["trials"]})


# ---------------------------------------------------------------- --compare

def fake_results(path, flags, cells):
    trials = []
    for (task, size, depth), (k, n) in cells.items():
        for i in range(n):
            trials.append({"task": task, "size": size, "depth": depth, "trial": i,
                           "key": 10000 + i, "answer": "", "parsed": None, "correct": i < k,
                           "prompt_tokens": size, "tokens_back": size // 2,
                           "prompt_sha256": "%s%d%s%d" % (task, size, depth, i)})
    path.write_text(json.dumps({"format": recall.FORMAT, "config": {"seed": 1234},
                                "server": {"flags": flags}, "trials": trials}))


def test_compare_prints_both_rates_and_the_difference(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    fake_results(a, [], {("passkey", 1024, 0.5): (0, 20), ("passkey", 1024, 0.9): (18, 20),
                         ("multiturn", 2048, None): (10, 20)})
    fake_results(b, ["--attn", "exact"], {("passkey", 1024, 0.5): (20, 20),
                                          ("passkey", 1024, 0.9): (18, 20),
                                          ("passkey", 4096, 0.5): (9, 20)})
    p = run_tool(["--compare", str(a), str(b)])
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "A: a.json (serve no flags)" in out and "B: b.json (serve --attn exact)" in out
    assert "trials in both: 40, with identical prompts: 40" in out
    rows = {tuple(c.strip() for c in l.strip("|").split("|")[:3]): l
            for l in out.splitlines() if l.startswith("| passkey") or l.startswith("| multiturn")}
    r = rows[("passkey", "1024", "0.5")]
    assert "0/20 0% [0.000, 0.161]" in r and "20/20 100% [0.839, 1.000]" in r and "+100 pp" in r
    assert "+0 pp" in rows[("passkey", "1024", "0.9")]
    r = rows[("passkey", "4096", "0.5")]                  # only in B
    assert "9/20 45%" in r and r.rstrip(" |").endswith("-")
    r = rows[("multiturn", "2048", "-")]                  # only in A
    assert "10/20 50% [0.299, 0.701]" in r


def test_compare_of_real_runs(first_run, tmp_path):
    out, res, _ = first_run
    p = run_tool(["--compare", str(out), str(out)])
    assert p.returncode == 0, p.stderr
    n = len(res["trials"])
    assert "trials in both: %d, with identical prompts: %d" % (n, n) in p.stdout
    assert p.stdout.count("+0 pp") == 10


# ---------------------------------------------------------------- bad arguments

@pytest.mark.parametrize("args", [
    ["--trials", "0"],
    ["--depths", "0.5,1.5"],
    ["--lengths", "1k"],
    ["--lengths", ""],
    ["--tasks", "passkey,recall"],
    ["--turn-tokens", "100"],
    ["--keys", "0"],
    ["--max-tokens", "2"],
    ["--max-seconds", "-1"],
    ["--no-such-flag"],
    ["--compare", "only-one.json"],
    ["--compare", "/nonexistent/a.json", "/nonexistent/b.json"],
    ["--url", "ftp://x"],
    ["--url", "http://127.0.0.1:1", "--", "--attn", "exact"],
    ["--corpus", "/nonexistent/corpus.txt"],
])
def test_bad_arguments_exit_2_with_usage(args):
    p = run_tool(args, timeout=60)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "usage: recall.py" in p.stderr, p.stderr
    assert p.stdout == ""


def test_compare_refuses_a_file_that_is_not_results(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    p = run_tool(["--compare", str(bad), str(bad)])
    assert p.returncode == 2 and "not a recall.py result file" in p.stderr, p.stderr


def test_sigterm_stops_the_run_and_its_server(cache, tmp_path):
    """A run stopped with SIGTERM keeps its finished trials, stops the server
    it started and removes that server's temporary folder."""
    import signal
    import time
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "term.json"
    args = tool_args(cache, out)
    args[args.index("--trials") + 1] = "50"
    p = subprocess.Popen([sys.executable, TOOL] + args, cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=dict(os.environ, TMPDIR=str(tmp)))

    def servers():
        found = []
        for pid in os.listdir("/proc"):
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    cmd = f.read().decode(errors="replace")
            except OSError:
                continue
            if "serve" in cmd and str(tmp) in cmd:
                found.append(int(pid))
        return found

    try:
        end = time.monotonic() + 120
        while time.monotonic() < end and not (out.exists() and servers()):
            time.sleep(0.1)
        assert out.exists() and servers(), p.communicate(timeout=60)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=120)
        assert p.returncode == 130, err
        assert servers() == []
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for pid in servers():     # what a failed run left behind
            os.kill(pid, signal.SIGKILL)
    assert [x for x in os.listdir(tmp) if x.startswith("recall-serve-")] == []
    assert len(json.loads(out.read_text())["trials"]) >= 1


def test_passkey_py_is_recall_passkey(cache, tmp_path):
    out = tmp_path / "pk.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "passkey.py"), "--bin", BIN,
                        "--model", TINY, "--cache", cache, "--lengths", "300", "--depths", "0.5",
                        "--trials", "2", "--out", str(out), "--quiet", "--", "--attn",
                        "performer"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    trials = json.loads(out.read_text())["trials"]
    assert [(t["task"], t["size"], t["depth"], t["trial"]) for t in trials] == \
        [("passkey", 300, 0.5, 0), ("passkey", 300, 0.5, 1)]
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "passkey.py"), "--trials",
                        "0"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2 and "usage:" in p.stderr
