#!/usr/bin/env python3
"""Recall benchmark against a running darkserve (docs/QUALITY.md, "Recall").

    recall.py [--tasks passkey,multikey,multiturn] [--lengths 1024,4096,16384,65536]
              [--depths 0.1,0.5,0.9] [--turn-tokens 2048,8192,32768] [--trials 20]
              [--keys 6] [--seed 1234] [--max-tokens 16] [--out results.json]
              [--max-seconds S] [--url URL | --bin BIN --model GGUF] [-- serve flags...]
    recall.py --compare A.json B.json

Starts `darkserve serve` itself (a free 127.0.0.1 port, a temporary session
directory, every flag after `--` passed on, e.g. `-- --attn exact`) or talks
to the server at --url, and runs three tasks, all greedy (temperature 0):

  passkey    a random 5-digit key ("The pass key is K. Remember it. K is the
             pass key.") hidden at --depths of a filler text; the whole chat
             prompt (template included) is --lengths tokens; asked as one chat
             turn (/v1/chat/completions).
  multikey   --keys pairs "The code for NAME is K." spread over the filler; the
             one asked for sits at the depth, the others at random depths.
  multiturn  a sessions-API conversation (POST /v1/sessions, /append,
             /generate): the first turn says "My locker code is K.", filler
             turns (user and assistant, appended) follow, and the last turn
             asks for it. --turn-tokens is the whole conversation with the
             answer's --max-tokens: so K=8192 fits an 8,192-token context.

A trial is correct when the first number of exactly five digits in the answer
is the key. Filler comes from the calibration corpus
(models/corpus/calibration.txt.xz, decompressed once into --cache) at random
offsets; every key, name, depth and offset comes from --seed and the trial's
cell and index, so two configurations see identical prompts. Prompts are
sized with the server's /tokenize to within 2% of the target (the real
length, `usage.prompt_tokens`, is recorded).

Every trial is written to --out as it ends; a run with an existing --out
skips the trials it holds (cells are run smallest first, so a partial run has
complete small cells). --max-seconds stops before a trial that would start
after that many seconds. The table printed has, per cell, correct/trials, the
rate and its Wilson 95% interval. --compare prints two result files side by
side. Bad arguments exit 2.
"""
import argparse
import hashlib
import http.client
import json
import lzma
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
DEFAULT_CORPUS = os.path.join(ROOT, "models", "corpus", "calibration.txt.xz")
DEFAULT_MODEL = os.environ.get("DARKSERVE_MODEL", os.path.join(
    ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
DEFAULT_BIN = os.environ.get("DARKSERVE_BIN", os.path.join(ROOT, "build", "darkserve"))
# Debian's python3.*-doc packages are reserved for an independent evaluation
# (models/corpus/README.md): filler must never come from there.
FORBIDDEN_DOCS = "/usr/share/doc/python3"
TASKS = ("passkey", "multikey", "multiturn")
TOLERANCE = 0.02
Z95 = 1.959963984540054  # the 97.5% quantile of the standard normal
FORMAT = 1

PASSKEY_INTRO = ("There is an important piece of information hidden inside a lot of irrelevant "
                 "text. Find it and memorize it. I will quiz you about the important "
                 "information there.")
PASSKEY_NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
PASSKEY_QUESTION = "What is the pass key?"
MULTIKEY_INTRO = ("Several codes are hidden inside a lot of irrelevant text. Find them and "
                  "memorize them. I will ask you for one of them.")
MULTIKEY_NEEDLE = "The code for {name} is {key}."
MULTIKEY_QUESTION = "What is the code for {name}?"
NAMES = ("Alice", "Bruno", "Clara", "Dmitri", "Farid", "Greta", "Hiro", "Ingrid", "Jonas",
         "Kiran", "Lucia", "Mateo", "Nadia", "Oskar", "Priya", "Tomas")
FACT_USER = "My locker code is {key}. Please remember it, I will ask you for it later."
FACT_ASSISTANT = "Sure, I will remember your locker code."
FACT_QUESTION = "What is my locker code?"
TURN_USER_TOKENS = 384       # content tokens of one filler user turn
TURN_ASSISTANT_TOKENS = 128  # and of the assistant's reply to it
APPEND_TOKENS = 2048         # filler tokens sent per /append request


class Usage(Exception):
    """A bad argument or a result file that does not fit: exit 2."""


class ServerError(Exception):
    def __init__(self, status, body, what):
        self.status = status
        try:
            err = json.loads(body)["error"]
            msg = "%s: %s" % (err.get("code"), err.get("message"))
        except (ValueError, KeyError, TypeError):
            msg = body[:300].decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
        super().__init__("%s: HTTP %d %s" % (what, status, msg))


# ---------------------------------------------------------------- statistics

def wilson(k, n, z=Z95):
    """Wilson score interval of k successes in n trials -> (low, high)."""
    if n <= 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z / d * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # at k = 0 and k = n one end is exactly 0 or 1 (not a rounding away from it)
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return (lo, hi)


ANSWER_RE = re.compile(r"(?<!\d)\d{5}(?!\d)")


def parse_answer(text):
    """The first number of exactly five digits in text, as an int, or None."""
    m = ANSWER_RE.search(text or "")
    return int(m.group(0)) if m else None


# ---------------------------------------------------------------- arguments

def parse_list(s, conv, name, check):
    try:
        out = [conv(x) for x in s.split(",") if x.strip() != ""]
    except ValueError:
        raise Usage("--%s: %r is not a comma-separated list" % (name, s))
    if not out:
        raise Usage("--%s is empty" % name)
    for v in out:
        if not check(v):
            raise Usage("--%s: %r is out of range" % (name, v))
    if len(set(out)) != len(out):
        raise Usage("--%s: %r repeats a value" % (name, s))
    return out


def build_parser():
    ap = argparse.ArgumentParser(
        prog="recall.py", description="Recall benchmark (passkey, multikey, multiturn) "
        "against darkserve; flags after -- go to `darkserve serve`.",
        usage="%(prog)s [options] [-- serve flags...] | %(prog)s --compare A.json B.json")
    ap.add_argument("--tasks", default=",".join(TASKS), help="default: all three")
    ap.add_argument("--lengths", default="1024,4096,16384,65536",
                    help="passkey and multikey prompt tokens")
    ap.add_argument("--depths", default="0.1,0.5,0.9", help="where the key sits, 0..1")
    ap.add_argument("--turn-tokens", default="2048,8192,32768",
                    help="multiturn conversation tokens (answer included)")
    ap.add_argument("--trials", type=int, default=20, help="per cell (default 20)")
    ap.add_argument("--keys", type=int, default=6, help="multikey pairs per prompt (default 6)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--max-tokens", type=int, default=16, help="answer tokens (default 16)")
    ap.add_argument("--out", help="results JSON; trials it holds are not run again")
    ap.add_argument("--max-seconds", type=float, default=0,
                    help="start no trial after this many seconds (0: no limit)")
    ap.add_argument("--url", help="a running server instead of starting one")
    ap.add_argument("--bin", default=DEFAULT_BIN, help="darkserve binary (default build/darkserve)")
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--corpus", default=DEFAULT_CORPUS,
                    help="filler source (.xz or text; default the calibration corpus)")
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "darkserve-recall"),
                    help="where the decompressed corpus is kept")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per HTTP request")
    ap.add_argument("--quiet", action="store_true", help="no line per trial")
    ap.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"))
    return ap


def parse_args(argv):
    """-> (namespace, serve flags). Raises Usage on a bad value (argparse itself
    exits 2 for unknown options)."""
    argv = list(argv)
    flags = []
    if "--" in argv:
        i = argv.index("--")
        argv, flags = argv[:i], argv[i + 1:]
    ap = build_parser()
    a = ap.parse_args(argv)
    a.parser = ap
    if a.compare:
        return a, flags
    a.task_list = parse_list(a.tasks, str, "tasks", lambda t: t in TASKS)
    a.length_list = sorted(parse_list(a.lengths, int, "lengths", lambda v: 64 <= v <= 1 << 20))
    a.depth_list = parse_list(a.depths, float, "depths", lambda v: 0.0 <= v <= 1.0)
    a.turn_list = sorted(parse_list(a.turn_tokens, int, "turn-tokens",
                                    lambda v: 256 <= v <= 1 << 20))
    if a.trials < 1:
        raise Usage("--trials must be at least 1")
    if not 1 <= a.keys <= len(NAMES):
        raise Usage("--keys must be 1 to %d" % len(NAMES))
    if not 8 <= a.max_tokens <= 4096:
        raise Usage("--max-tokens must be 8 to 4096")
    if a.max_seconds < 0:
        raise Usage("--max-seconds must be >= 0")
    if a.url:
        u = urllib.parse.urlparse(a.url)
        if u.scheme != "http" or not u.hostname:
            raise Usage("--url must be http://HOST:PORT")
        if flags:
            raise Usage("server flags after -- need a server this tool starts, not --url")
    check_corpus_path(a.corpus)
    return a, flags


def check_corpus_path(path):
    real = os.path.realpath(path)
    if real.startswith(FORBIDDEN_DOCS) or os.path.abspath(path).startswith(FORBIDDEN_DOCS):
        raise Usage("--corpus %s: Debian's python3.*-doc texts are reserved for evaluation; "
                    "filler comes from the calibration corpus" % path)
    if not os.path.isfile(real):
        raise Usage("--corpus %s: no such file" % path)


# ---------------------------------------------------------------- server

class Client:
    """JSON over HTTP/1.1 to one darkserve."""

    def __init__(self, url, timeout=3600):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port or 80
        self.url = "http://%s:%d" % (self.host, self.port)
        self.timeout = timeout

    def call(self, method, path, body=None, ok=(200, 201)):
        c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            data = json.dumps(body).encode() if body is not None else None
            hdr = {"Content-Type": "application/json"} if data is not None else {}
            c.request(method, path, body=data, headers=hdr)
            r = c.getresponse()
            raw = r.read()
        finally:
            c.close()
        if r.status not in ok:
            raise ServerError(r.status, raw, "%s %s" % (method, path))
        return json.loads(raw) if raw else None

    def tokenize(self, text, pieces=False):
        r = self.call("POST", "/tokenize", {"text": text, "with_pieces": pieces})
        return r["tokens"]

    def count(self, text):
        return len(self.tokenize(text)) if text else 0

    def detokenize(self, ids):
        return self.call("POST", "/detokenize", {"tokens": list(ids)})["text"]

    def chat(self, content, max_tokens):
        r = self.call("POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0, "stream": False})
        ch = r["choices"][0]
        return ch["message"].get("content") or "", r["usage"]["prompt_tokens"], ch["finish_reason"]


class ServerProcess:
    """`darkserve serve` on a free loopback port, with its own session
    directory and log in a temporary folder; stop() kills it."""

    def __init__(self, binary, model, flags):
        if not os.access(binary, os.X_OK):
            raise Usage("--bin %s: not an executable (build it: make)" % binary)
        if not os.path.isfile(model):
            raise Usage("--model %s: no such file" % model)
        self.tmp = tempfile.mkdtemp(prefix="recall-serve-")
        self.log = os.path.join(self.tmp, "serve.log")
        cmd = [binary, "serve", "--host", "127.0.0.1", "--port", "0", "--model", model,
               "--log-file", self.log, "--session-dir", os.path.join(self.tmp, "sessions"),
               "--generation-timeout", "0", "--max-body", "64M"] + list(flags)
        self.cmd = cmd
        self.err = open(os.path.join(self.tmp, "serve.stderr"), "wb")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.err,
                                     start_new_session=True)
        pat = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")
        end = time.monotonic() + 300
        port = None
        while time.monotonic() < end:
            m = pat.search(self._read(self.log))
            if m:
                port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        if port is None:
            msg = self._read(os.path.join(self.tmp, "serve.stderr")) + self._read(self.log)
            self.stop()
            raise RuntimeError("darkserve serve did not start:\n" + msg[-2000:])
        self.url = "http://127.0.0.1:%d" % port
        client = Client(self.url, 10)
        while time.monotonic() < end:
            try:
                client.call("GET", "/health")
                return
            except (OSError, ServerError):
                if self.proc.poll() is not None:
                    break
                time.sleep(0.1)
        msg = self._read(self.log)
        self.stop()
        raise RuntimeError("darkserve serve never became healthy:\n" + msg[-2000:])

    @staticmethod
    def _read(path):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def attention_line(self):
        for line in self._read(self.log).splitlines():
            if " loaded in " in line and "attention" in line:
                return line.split(" info ", 1)[-1]
        return None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.err.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


# ---------------------------------------------------------------- filler

def load_corpus(path, cache_dir):
    """The corpus text; an .xz file is decompressed once into cache_dir (a
    file named by the .xz's size and mtime)."""
    check_corpus_path(path)
    if not path.endswith(".xz"):
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().replace("\0", "")
    st = os.stat(path)
    os.makedirs(cache_dir, exist_ok=True)
    cached = os.path.join(cache_dir, "%s.%d.%d.txt" % (
        os.path.basename(path)[:-3].replace(".txt", ""), st.st_size, int(st.st_mtime)))
    if not os.path.exists(cached):
        with lzma.open(path, "rt", encoding="utf-8", errors="replace") as f:
            text = f.read()
        fd, tmp = tempfile.mkstemp(dir=cache_dir)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, cached)
    with open(cached, encoding="utf-8") as f:
        return f.read().replace("\0", "")


def sha256_text(text):
    """A short hash of a prompt: equal in two result files = the same prompt."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


class Filler:
    """Passages of the corpus of an exact token count, from seeded offsets."""

    def __init__(self, text, client):
        self.text = text
        self.client = client

    def offset(self, rng, n_tokens):
        """A paragraph start at a random place with room for n_tokens after it."""
        room = len(self.text) - (n_tokens * 8 + 4096)
        if room <= 0:
            raise Usage("the corpus is too short for %d filler tokens" % n_tokens)
        at = rng.randrange(room)
        nl = self.text.find("\n\n", at)
        return at if nl < 0 or nl > at + 20000 else nl + 2

    def ids(self, offset, n_tokens):
        """Token ids and pieces of the corpus from offset, at least n_tokens of
        them (-> list of {"id", "piece"})."""
        span = max(256, int(n_tokens * 4.5) + 256)
        while True:
            chunk = self.text[offset:offset + span]
            toks = self.client.tokenize(chunk, pieces=True)
            if len(toks) > n_tokens + 8 or offset + span >= len(self.text):
                return toks[:n_tokens + 8] if len(toks) > n_tokens + 8 else toks
            span = int(span * 1.5) + 256

    def passage(self, toks, n_tokens):
        """The text of the first n_tokens tokens and each token's character
        offset in it (by the pieces; exact for ASCII text)."""
        if n_tokens <= 0:
            return "", [0]
        text = self.client.detokenize([t["id"] for t in toks[:n_tokens]])
        offs, c = [], 0
        for t in toks[:n_tokens]:
            offs.append(c)
            c += len(t["piece"])
        offs.append(c)
        return text, offs


BOUNDARIES = (  # where a needle may go, best first: pattern, reach (share of the text)
    (re.compile(r"\n\n"), 1 / 25),
    (re.compile(r"[.!?][\"')]?[ \n]"), 1 / 50),
    (re.compile(r"\n"), 1 / 50),
    (re.compile(r" "), 1 / 50),
)


def snap(text, at):
    """The boundary nearest character `at` where a sentence fits: a paragraph
    break within 4% of the text (300 characters at most), else a sentence
    end, a line break or a space within 2% (120 at most). -> (index just
    after the boundary, separator to put after the sentence)."""
    n = len(text)
    if at <= 0:
        return 0, "\n\n"
    if at >= n:
        return n, "\n\n"
    for pat, share in BOUNDARIES:
        reach = max(8, min(300 if share > 0.03 else 120, int(n * share)))
        lo, hi = max(0, at - reach), min(n, at + reach)
        best = None
        for m in pat.finditer(text, lo, hi):
            if best is None or abs(m.end() - at) < abs(best.end() - at):
                best = m
        if best is not None:
            sep = "\n\n" if best.group(0) == "\n\n" else (
                "\n" if best.group(0).endswith("\n") else " ")
            return best.end(), sep
    return at, " "


def insert_needles(text, offs, n_tokens, needles):
    """Puts each (depth, sentence) into text at that fraction of its tokens
    (moved to the nearest paragraph, line or sentence boundary). -> the text
    with the needles, each needle's character position in it (in the order
    given)."""
    places = []
    for j, (depth, sentence) in enumerate(needles):
        k = min(n_tokens, max(0, int(round(depth * n_tokens))))
        i, sep = snap(text, offs[min(k, len(offs) - 1)])
        places.append((i, j, sep, sentence))
    places.sort()
    out, last, n = [], 0, 0
    pos = [0] * len(needles)
    for i, j, sep, sentence in places:
        seg = text[last:i]
        if i > 0 and not (out and not seg and out[-1] == sep) and not seg.endswith((" ", "\n")):
            seg += sep
        out.append(seg)
        n += len(seg)
        pos[j] = n
        out += [sentence, sep]
        n += len(sentence) + len(sep)
        last = i
    out.append(text[last:])
    return "".join(out), pos


# ---------------------------------------------------------------- tasks

def trial_rng(seed, task, size, depth, idx):
    return random.Random("recall:%d:%s:%d:%s:%d" % (seed, task, size, depth, idx))


class Runner:
    def __init__(self, client, filler, a):
        self.client = client
        self.filler = filler
        self.a = a
        self._chat_overhead = None
        self._turn_overhead = None

    def chat_overhead(self):
        """Tokens the chat template adds around one user message (the default
        system prompt, the turn markers, the opened assistant turn)."""
        if self._chat_overhead is None:
            content = "Hello there."
            _, prompt, _ = self.client.chat(content, 1)
            self._chat_overhead = prompt - self.client.count(content)
        return self._chat_overhead

    def sized_prompt(self, target, intro, needles, question, rng):
        """A chat prompt of `target` tokens (template included): intro,
        filler with the needles at their depths, question. -> dict."""
        fixed = self.client.count(intro) + self.client.count(question) + sum(
            self.client.count(s) for _, s in needles) + 4 * len(needles) + 4
        want = target - self.chat_overhead() - fixed
        if want < 16:
            raise Usage("length %d is too short for this task's prompt" % target)
        off = self.filler.offset(rng, want)
        toks = self.filler.ids(off, want + 256)
        n = want
        for _ in range(4):
            passage, offs = self.filler.passage(toks, min(n, len(toks)))
            body, _ = insert_needles(passage, offs, n, needles)
            content = intro + "\n\n" + body.strip("\n") + "\n\n" + question
            total = self.client.count(content) + self.chat_overhead()
            if abs(total - target) <= max(2, target // 400):
                break
            n += target - total
        return {"content": content, "estimated_tokens": total, "offset": off,
                "filler_tokens": n}

    def tokens_back(self, content, char_pos):
        """Tokens from a needle's start to the end of the prompt (template
        included)."""
        return self.client.count(content[char_pos:]) + self.chat_overhead()

    def ask(self, prompt, key):
        t0 = time.monotonic()
        answer, ptoks, finish = self.client.chat(prompt["content"], self.a.max_tokens)
        got = parse_answer(answer)
        return {"answer": answer, "parsed": got, "correct": got == key,
                "prompt_sha256": sha256_text(prompt["content"]), "prompt_tokens": ptoks, "finish_reason": finish,
                "seconds": round(time.monotonic() - t0, 3)}

    def passkey(self, size, depth, idx):
        rng = trial_rng(self.a.seed, "passkey", size, depth, idx)
        key = rng.randint(10000, 99999)
        needle = PASSKEY_NEEDLE.format(key=key)
        p = self.sized_prompt(size, PASSKEY_INTRO, [(depth, needle)], PASSKEY_QUESTION, rng)
        r = {"key": key, "offset": p["offset"],
             "tokens_back": self.tokens_back(p["content"], p["content"].index(needle))}
        r.update(self.ask(p, key))
        return r

    def multikey(self, size, depth, idx):
        rng = trial_rng(self.a.seed, "multikey", size, depth, idx)
        names = rng.sample(NAMES, self.a.keys)
        keys = rng.sample(range(10000, 100000), self.a.keys)
        depths = [depth] + [rng.uniform(0.02, 0.98) for _ in names[1:]]
        needles = [(d, MULTIKEY_NEEDLE.format(name=nm, key=k))
                   for d, nm, k in zip(depths, names, keys)]
        asked, key = names[0], keys[0]
        p = self.sized_prompt(size, MULTIKEY_INTRO, needles,
                              MULTIKEY_QUESTION.format(name=asked), rng)
        at = p["content"].index(needles[0][1])
        r = {"key": key, "asked": asked, "keys": dict(zip(names, keys)),
             "depths": [round(d, 4) for d in depths], "offset": p["offset"],
             "tokens_back": self.tokens_back(p["content"], at)}
        r.update(self.ask(p, key))
        r["other_key"] = r["parsed"] in keys[1:]
        return r

    def turn_overhead(self):
        """Template tokens of one appended user+assistant pair in a session
        that has turns already, and of the last (question) turn."""
        if self._turn_overhead is None:
            c = self.client
            sid = c.call("POST", "/v1/sessions", {})["id"]
            try:
                u, v = "A short question.", "A short answer."
                t1 = c.call("POST", "/v1/sessions/%s/append" % sid, {"messages": [
                    {"role": "user", "content": u}, {"role": "assistant", "content": v}]})
                t2 = c.call("POST", "/v1/sessions/%s/append" % sid, {"messages": [
                    {"role": "user", "content": u}, {"role": "assistant", "content": v}]})
                pair = t2["tokens"] - t1["tokens"] - c.count(u) - c.count(v)
                g = c.call("POST", "/v1/sessions/%s/generate" % sid, {
                    "messages": [{"role": "user", "content": u}], "max_tokens": 1,
                    "temperature": 0, "stream": False})
                q = g["usage"]["prompt_tokens"] - c.count(u)
            finally:
                c.call("DELETE", "/v1/sessions/%s" % sid)
            self._turn_overhead = (pair, q)
        return self._turn_overhead

    def filler_pairs(self, rng, budget, pair_overhead):
        """User/assistant content token counts summing, with the template,
        to about budget tokens."""
        full = TURN_USER_TOKENS + TURN_ASSISTANT_TOKENS + pair_overhead
        pairs = []
        while budget >= full + full // 2:
            pairs.append((TURN_USER_TOKENS, TURN_ASSISTANT_TOKENS))
            budget -= full
        rest = budget - pair_overhead
        if rest >= 16:
            u = max(8, rest * 3 // 4)
            pairs.append((u, max(8, rest - u)))
        return pairs

    def filler_text(self, rng, n):
        toks = self.filler.ids(self.filler.offset(rng, n), n)
        return self.filler.passage(toks, min(n, len(toks)))[0].strip() or "..."

    def multiturn(self, size, depth, idx):
        rng = trial_rng(self.a.seed, "multiturn", size, 0.0, idx)
        key = rng.randint(10000, 99999)
        c = self.client
        pair_ov, q_ov = self.turn_overhead()
        question = FACT_QUESTION
        target = size - self.a.max_tokens     # tokens before the answer
        sid = c.call("POST", "/v1/sessions", {})["id"]
        try:
            fact = FACT_USER.format(key=key)
            s = c.call("POST", "/v1/sessions/%s/append" % sid, {"messages": [
                {"role": "user", "content": fact},
                {"role": "assistant", "content": FACT_ASSISTANT}]})
            fact_end = s["tokens"]
            tokens = fact_end
            sent = [fact, FACT_ASSISTANT]
            q_tokens = c.count(question) + q_ov
            turns = 0
            while True:
                left = target - q_tokens - tokens
                if left < pair_ov + 16:
                    break
                last = left <= APPEND_TOKENS * 3 // 2
                plan = self.filler_pairs(rng, left if last else APPEND_TOKENS, pair_ov)
                if not plan:
                    break
                msgs = []
                for u, v in plan:
                    msgs.append({"role": "user", "content": self.filler_text(rng, u)})
                    msgs.append({"role": "assistant", "content": self.filler_text(rng, v)})
                s = c.call("POST", "/v1/sessions/%s/append" % sid, {"messages": msgs})
                sent += [m["content"] for m in msgs]
                tokens = s["tokens"]
                turns += len(plan)
                if last:
                    # one more short pair only if the template count was off by a lot
                    if target - q_tokens - tokens < max(64, size // 100):
                        break
            t0 = time.monotonic()
            g = c.call("POST", "/v1/sessions/%s/generate" % sid, {
                "messages": [{"role": "user", "content": question}],
                "max_tokens": self.a.max_tokens, "temperature": 0, "stream": False})
            answer = g.get("text") or ""
            got = parse_answer(answer)
            prompt_total = tokens + g["usage"]["prompt_tokens"]
            return {"key": key, "answer": answer, "parsed": got, "correct": got == key,
                    "prompt_sha256": sha256_text("\0".join(sent + [question])),
                    "prompt_tokens": prompt_total, "fact_end": fact_end,
                    "tokens_back": prompt_total - fact_end + pair_ov + c.count(
                        FACT_ASSISTANT) + c.count(fact[fact.index(str(key)):]),
                    "filler_turns": turns,
                    "finish_reason": g.get("finish_reason"),
                    "seconds": round(time.monotonic() - t0, 3)}
        finally:
            try:
                c.call("DELETE", "/v1/sessions/%s" % sid)
            except (OSError, ServerError):
                pass

    def run(self, task, size, depth, idx):
        if task == "passkey":
            return self.passkey(size, depth, idx)
        if task == "multikey":
            return self.multikey(size, depth, idx)
        return self.multiturn(size, depth, idx)


# ---------------------------------------------------------------- results

def cell_key(task, size, depth):
    return (task, int(size), None if depth is None else round(float(depth), 6))


def trial_key(t):
    return cell_key(t["task"], t["size"], t.get("depth")) + (int(t["trial"]),)


def plan_trials(a):
    """Every (task, size, depth, trial) in run order: cells by size, then task,
    then depth, each cell's trials together."""
    cells = []
    for t in a.task_list:
        if t == "multiturn":
            cells += [(s, TASKS.index(t), t, None) for s in a.turn_list]
        else:
            cells += [(s, TASKS.index(t), t, d) for s in a.length_list for d in a.depth_list]
    cells.sort(key=lambda c: (c[0], c[1], -1 if c[3] is None else c[3]))
    return [(t, s, d, i) for s, _, t, d in cells for i in range(a.trials)]


def load_results(path):
    with open(path, encoding="utf-8") as f:
        r = json.load(f)
    if not isinstance(r, dict) or "trials" not in r or r.get("format") != FORMAT:
        raise Usage("%s is not a recall.py result file" % path)
    return r


def save_results(path, res):
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".recall-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def summarize(trials):
    """-> {cell key: {"k", "n", "tokens", "back"}} in the order cells appear."""
    cells = {}
    for t in trials:
        c = cells.setdefault(cell_key(t["task"], t["size"], t.get("depth")),
                             {"k": 0, "n": 0, "tokens": [], "back": []})
        c["n"] += 1
        c["k"] += bool(t["correct"])
        c["tokens"].append(t.get("prompt_tokens") or 0)
        if t.get("tokens_back") is not None:
            c["back"].append(t["tokens_back"])
    return dict(sorted(cells.items(), key=lambda kv: (
        TASKS.index(kv[0][0]), kv[0][1], -1 if kv[0][2] is None else kv[0][2])))


def fmt_rate(c):
    lo, hi = wilson(c["k"], c["n"])
    return "%d/%d" % (c["k"], c["n"]), "%.0f%%" % (100.0 * c["k"] / c["n"]), \
        "[%.3f, %.3f]" % (lo, hi)


def fmt_depth(d):
    return "-" if d is None else ("%g" % d)


def md_table(header, rows):
    w = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda r: "| " + " | ".join(str(x).ljust(n) for x, n in zip(r, w)) + " |"
    return "\n".join([line(header), "|" + "|".join("-" * (n + 2) for n in w) + "|"] +
                     [line(r) for r in rows])


def table(trials):
    rows = []
    for (task, size, depth), c in summarize(trials).items():
        frac, pct, ci = fmt_rate(c)
        back = "%d" % round(sum(c["back"]) / len(c["back"])) if c["back"] else "-"
        rows.append([task, size, fmt_depth(depth), frac, pct, ci,
                     "%d" % round(sum(c["tokens"]) / len(c["tokens"])), back])
    return md_table(["task", "tokens", "depth", "correct", "rate", "Wilson 95%",
                     "prompt tokens (mean)", "tokens back (mean)"], rows)


def label(res, path):
    s = res.get("server") or {}
    if s.get("flags") is not None:
        return "%s (serve %s)" % (os.path.basename(path), " ".join(s["flags"]) or "no flags")
    return "%s (%s)" % (os.path.basename(path), s.get("url", "?"))


def compare(path_a, path_b):
    ra, rb = load_results(path_a), load_results(path_b)
    ca, cb = summarize(ra["trials"]), summarize(rb["trials"])
    keys = list(ca) + [k for k in cb if k not in ca]
    keys.sort(key=lambda k: (TASKS.index(k[0]), k[1], -1 if k[2] is None else k[2]))
    rows = []
    for k in keys:
        a, b = ca.get(k), cb.get(k)
        cell = lambda c: "-" if c is None else "%s %s %s" % fmt_rate(c)
        diff = "-" if a is None or b is None else "%+.0f pp" % (
            100.0 * (b["k"] / b["n"] - a["k"] / a["n"]))
        rows.append([k[0], k[1], fmt_depth(k[2]), cell(a), cell(b), diff])
    out = ["A: " + label(ra, path_a), "B: " + label(rb, path_b)]
    ha = {trial_key(t): t.get("prompt_sha256") for t in ra["trials"]}
    both = [(ha[trial_key(t)], t.get("prompt_sha256")) for t in rb["trials"]
            if trial_key(t) in ha]
    same = sum(1 for x, y in both if x and x == y)
    out.append("trials in both: %d, with identical prompts: %d" % (len(both), same))
    for r, p in ((ra, "A"), (rb, "B")):
        if (r.get("config") or {}).get("seed") != (ra.get("config") or {}).get("seed"):
            out.append("note: %s has another --seed: its prompts differ" % p)
    out.append(md_table(["task", "tokens", "depth", "A correct, rate, Wilson 95%",
                         "B correct, rate, Wilson 95%", "B - A"], rows))
    return "\n".join(out)


def git_commit():
    try:
        r = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                           capture_output=True, text=True, timeout=10)
        return r.stdout.strip() or None
    except OSError:
        return None


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


# ---------------------------------------------------------------- main

def run(a, flags):
    config = {"seed": a.seed, "max_tokens": a.max_tokens, "keys": a.keys,
              "corpus": os.path.relpath(os.path.realpath(a.corpus), ROOT)
              if os.path.realpath(a.corpus).startswith(ROOT) else os.path.realpath(a.corpus),
              "corpus_sha256": sha256_file(a.corpus)}
    res = None
    if a.out and os.path.exists(a.out):
        res = load_results(a.out)
        old = res.get("config") or {}
        for k in ("seed", "max_tokens", "keys", "corpus_sha256"):
            if old.get(k) != config[k]:
                raise Usage("%s was made with %s=%r, this run has %r: use another --out"
                            % (a.out, k, old.get(k), config[k]))
    if res is None:
        res = {"format": FORMAT, "tool": "tools/recall.py", "config": config,
               "server": None, "trials": []}
    done = {trial_key(t) for t in res["trials"]}
    todo = [p for p in plan_trials(a) if cell_key(*p[:3]) + (p[3],) not in done]
    print("recall: %d trials planned, %d already in %s" % (
        len(plan_trials(a)), len(plan_trials(a)) - len(todo), a.out or "(no --out)"),
        file=sys.stderr, flush=True)
    start = time.monotonic()
    ran = 0
    stopped = False
    server = None
    try:
        if todo:
            if a.url:
                url = a.url
            else:
                server = ServerProcess(a.bin, a.model, flags)
                url = server.url
            client = Client(url, a.timeout)
            health = client.call("GET", "/health")
            sid = client.call("POST", "/v1/sessions", {})["id"]
            attention = client.call("GET", "/v1/sessions/%s" % sid).get("attention")
            client.call("DELETE", "/v1/sessions/%s" % sid)
            info = {"model": health.get("model"), "attention": attention,
                    "flags": None if a.url else list(flags),
                    "url": a.url, "attention_log": server.attention_line() if server else None,
                    "commit": git_commit(), "cpu": cpu_model()}
            prev = res.get("server")
            if prev:
                if prev.get("model") != info["model"] or prev.get("attention") != info["attention"]:
                    raise Usage("%s was made on %s %s; this server is %s %s: use another --out"
                                % (a.out, prev.get("model"), prev.get("attention"),
                                   info["model"], info["attention"]))
                if prev.get("flags") is not None and info["flags"] is not None and \
                        prev["flags"] != info["flags"]:
                    raise Usage("%s was made with serve flags %r, this run has %r: use "
                                "another --out" % (a.out, prev["flags"], info["flags"]))
                res.setdefault("runs", []).append(info)
            else:
                res["server"] = info
            runner = Runner(client, Filler(load_corpus(a.corpus, a.cache), client), a)
            for task, size, depth, idx in todo:
                if a.max_seconds and time.monotonic() - start >= a.max_seconds:
                    stopped = True
                    break
                t0 = time.monotonic()
                r = runner.run(task, size, depth, idx)
                t = {"task": task, "size": size, "depth": depth, "trial": idx}
                t.update(r)
                t["answer_seconds"] = t.pop("seconds")
                t["seconds"] = round(time.monotonic() - t0, 3)
                res["trials"].append(t)
                ran += 1
                if a.out:
                    save_results(a.out, res)
                if not a.quiet:
                    print("%-9s %6d %-4s #%-3d key %05d -> %-7s %s  (%d tokens, %.1fs)" % (
                        task, size, fmt_depth(depth), idx, t["key"],
                        "" if t["parsed"] is None else "%05d" % t["parsed"],
                        "ok" if t["correct"] else "--", t["prompt_tokens"], t["seconds"]),
                        file=sys.stderr, flush=True)
    finally:
        if server:
            server.stop()
    print(table(res["trials"]))
    left = len(todo) - ran
    print("recall: %d new trials%s" % (ran, ", %d left (--max-seconds)" % left if stopped
                                       else ""), file=sys.stderr)
    return 0


def on_term(signum, frame):
    raise KeyboardInterrupt


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    # SIGTERM (and SIGINT, unless ignored as in a background job) stop the run
    # between requests' bytes: the server this tool started is stopped too
    signal.signal(signal.SIGTERM, on_term)
    try:
        a, flags = parse_args(argv)
        if a.compare:
            for p in a.compare:
                if not os.path.isfile(p):
                    raise Usage("--compare: %s: no such file" % p)
            print(compare(*a.compare))
            return 0
        return run(a, flags)
    except Usage as e:
        build_parser().print_usage(sys.stderr)
        print("recall.py: error: %s" % e, file=sys.stderr)
        return 2
    except (ServerError, RuntimeError, OSError) as e:
        print("recall.py: %s" % e, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("recall.py: interrupted (finished trials are in --out)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
