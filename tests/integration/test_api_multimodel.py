"""Several models in one server (`serve --model A --model B`, docs/API.md
"Several models"): every API picks its model by the request's "model" field,
the lists name every model, an unknown model is a 404 in the API's own
error shape, a session stays bound to the model it was made on.

Routing is checked by outcome: what the two-model server answers for a model
is what a server of that model alone answers (greedy decoding, tokenization,
embeddings), so a request that reached the wrong model cannot pass. The
tiny random Llama and Gemma 3 fixtures keep it fast; the last test loads the
real SmolLM2 and Gemma 3 270M together when both files are there."""
import json
import os

import pytest

from ds_server import GEMMA, MODEL, TINY, TINY_GEMMA, Server, read_text

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OCT = {"Content-Type": "application/octet-stream"}
NAMES = {"tiny": TINY, "tiny_gemma3": TINY_GEMMA}


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """tiny (the default, first) and tiny_gemma3 in one server."""
    assert os.path.exists(TINY_GEMMA), f"{TINY_GEMMA} missing (make builds it)"
    s = Server(tmp_path_factory.mktemp("both"), TINY, name="both",
               args=["--model", TINY_GEMMA])
    yield s
    s.kill()


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """One single-model server per fixture model: the reference answers."""
    made = {n: Server(tmp_path_factory.mktemp(n), p, name=n) for n, p in NAMES.items()}
    yield made
    for s in made.values():
        s.kill()


def greedy(srv, path, body):
    if path.startswith("/api/"):
        body = dict(body, options=dict(body.get("options", {}), temperature=0))
    else:
        body = dict(body, temperature=0)
    st, j, _ = srv.post(path, body)
    assert st == 200, j
    return j


# ---- lists ----

def test_every_list_names_every_model(both):
    st, j, _ = both.json("GET", "/v1/models")
    assert st == 200 and [m["id"] for m in j["data"]] == ["tiny", "tiny_gemma3"], j
    st, j, _ = both.json("GET", "/models")
    assert [m["id"] for m in j["data"]] == ["tiny", "tiny_gemma3"], j
    st, j, _ = both.json("GET", "/api/tags")
    assert st == 200, j
    assert [m["name"] for m in j["models"]] == ["tiny:latest", "tiny_gemma3:latest"], j
    assert [m["details"]["family"] for m in j["models"]] == ["llama", "gemma3"], j
    st, j, _ = both.json("GET", "/api/ps")
    assert [m["name"] for m in j["models"]] == ["tiny:latest", "tiny_gemma3:latest"], j
    st, j, _ = both.json("GET", "/health")
    assert st == 200 and j["status"] == "ok", j
    assert j["model"] == "tiny" and j["models"] == ["tiny", "tiny_gemma3"], j


def test_one_model_has_no_models_list_in_health(alone):
    st, j, _ = alone["tiny"].json("GET", "/health")
    assert st == 200 and "models" not in j, j


# ---- routing on every API ----

GEN_ROUTES = [
    ("/v1/completions", {"prompt": "hello there", "max_tokens": 6},
     lambda j: j["choices"][0]["text"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6},
     lambda j: j["choices"][0]["message"]["content"]),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 6},
     lambda j: j["output"][0]["content"][0]["text"]),
    ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6},
     lambda j: j["content"][0]["text"]),
    ("/completion", {"prompt": "hello there", "n_predict": 6}, lambda j: j["content"]),
    ("/api/generate", {"prompt": "hello there", "stream": False, "options": {"num_predict": 6}},
     lambda j: j["response"]),
    ("/api/chat", {"messages": [{"role": "user", "content": "hi"}], "stream": False,
                   "options": {"num_predict": 6}},
     lambda j: j["message"]["content"]),
]


@pytest.mark.parametrize("name", ["tiny", "tiny_gemma3"])
@pytest.mark.parametrize("path,body,text", GEN_ROUTES, ids=[r[0] for r in GEN_ROUTES])
def test_generation_goes_to_the_named_model(both, alone, name, path, body, text):
    want = text(greedy(alone[name], path, dict(body, model=name)))
    got = greedy(both, path, dict(body, model=name))
    assert text(got) == want, (got, want)
    if path in ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages"):
        assert got["model"] == name, got


def test_the_other_routes_follow_the_model(both, alone):
    for name, ref in alone.items():
        for path, body in [("/tokenize", {"content": "hello wörld 123"}),
                           ("/v1/messages/count_tokens",
                            {"messages": [{"role": "user", "content": "hello wörld"}]}),
                           ("/v1/embeddings", {"input": "hello"}),
                           ("/embedding", {"content": "hello"}),
                           ("/api/embed", {"input": "hello"}),
                           ("/apply-template", {"messages": [{"role": "user", "content": "x"}]})]:
            st, want, _ = ref.post(path, dict(body, model=name))
            assert st == 200, (path, want)
            st, got, _ = both.post(path, dict(body, model=name))
            assert st == 200, (path, got)
            if path == "/v1/embeddings":
                got, want = got["data"][0]["embedding"], want["data"][0]["embedding"]
            if path == "/api/embed":
                got, want = got["embeddings"], want["embeddings"]
            assert got == want, (name, path)
        st, want, _ = ref.post("/api/show", {"model": name})
        st, got, _ = both.post("/api/show", {"name": name})  # Ollama's older key
        assert st == 200 and got["model_info"] == want["model_info"], got
        st, got, _ = both.json("GET", f"/props?model={name}")
        assert st == 200 and got["model_alias"] == name, got


def test_no_model_named_is_the_first_model(both, alone):
    body = {"prompt": "hello there", "max_tokens": 6}
    want = greedy(alone["tiny"], "/v1/completions", body)["choices"][0]["text"]
    got = greedy(both, "/v1/completions", body)
    assert got["model"] == "tiny" and got["choices"][0]["text"] == want, got
    st, j, _ = both.json("GET", "/props")
    assert st == 200 and j["model_alias"] == "tiny", j


def test_names_match_as_ollama_matches_them(both):
    for name in ["TINY_GEMMA3", "tiny_gemma3:latest", "Tiny_Gemma3:LATEST"]:
        st, j, _ = both.post("/v1/completions", {"model": name, "prompt": "a", "max_tokens": 1})
        assert st == 200 and j["model"] == "tiny_gemma3", (name, j)


# ---- unknown models ----

UNKNOWN = [
    ("/v1/completions", {"prompt": "a"}, "openai"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}]}, "openai"),
    ("/v1/responses", {"input": "a"}, "openai"),
    ("/v1/embeddings", {"input": "a"}, "openai"),
    ("/completion", {"prompt": "a"}, "openai"),
    ("/tokenize", {"content": "a"}, "openai"),
    ("/v1/sessions", {}, "openai"),
    ("/v1/prefixes", {"text": "a"}, "openai"),
    ("/v1/messages", {"messages": [{"role": "user", "content": "a"}], "max_tokens": 4},
     "anthropic"),
    ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "a"}]}, "anthropic"),
    ("/api/generate", {"prompt": "a"}, "ollama"),
    ("/api/chat", {"messages": [{"role": "user", "content": "a"}]}, "ollama"),
    ("/api/embed", {"input": "a"}, "ollama"),
    ("/api/show", {}, "ollama"),
]


@pytest.mark.parametrize("path,body,shape", UNKNOWN, ids=[u[0] for u in UNKNOWN])
def test_an_unknown_model_is_a_404_in_the_apis_shape(both, path, body, shape):
    st, j, _ = both.post(path, dict(body, model="llama3:8b"))
    assert st == 404, (path, j)
    if shape == "openai":
        assert j["error"]["code"] == "model_not_found" and j["error"]["param"] == "model", j
        msg = j["error"]["message"]
    elif shape == "anthropic":
        assert j["type"] == "error" and j["error"]["type"] == "not_found_error", j
        msg = j["error"]["message"]
    else:
        assert set(j) == {"error"} and isinstance(j["error"], str), j
        msg = j["error"]
    assert "llama3:8b" in msg and "'tiny', 'tiny_gemma3'" in msg, msg


def test_an_unknown_model_in_the_query_and_too_long_names(both):
    st, j, _ = both.json("GET", "/props?model=nope")
    assert st == 404 and j["error"]["code"] == "model_not_found", j
    st, j, _ = both.post("/v1/completions", {"model": "x" * 300, "prompt": "a"})
    assert st in (400, 404), j  # never routed, never a 5xx


def test_one_model_keeps_todays_openai_behaviour(alone):
    """With one model an OpenAI request's "model" is echoed, not checked
    (as before several models existed); Ollama's is checked, as before."""
    st, j, _ = alone["tiny"].post("/v1/completions",
                                  {"model": "anything", "prompt": "a", "max_tokens": 1})
    assert st == 200 and j["model"] == "tiny", j
    st, j, _ = alone["tiny"].post("/api/generate", {"model": "nope", "prompt": "a"})
    assert st == 404 and "error" in j, j


# ---- sessions ----

def new_session(srv, model=None, text="hello there"):
    body = {"messages": [{"role": "user", "content": text}]}
    if model:
        body["model"] = model
    st, j, _ = srv.post("/v1/sessions", body)
    assert st in (200, 201), j
    return j["id"]


def test_a_session_is_bound_to_its_model(both, alone):
    sid = new_session(both, "tiny_gemma3")
    st, j, _ = both.json("GET", f"/v1/sessions/{sid}")
    assert st == 200 and j["model"] == "tiny_gemma3", j
    # generate on it: the Gemma model answers, as a Gemma-only server does
    ref = new_session(alone["tiny_gemma3"])
    body = {"text": " and", "max_tokens": 5, "temperature": 0, "stream": False}
    st, got, _ = both.post(f"/v1/sessions/{sid}/generate", body)
    assert st == 200, got
    st, want, _ = alone["tiny_gemma3"].post(f"/v1/sessions/{ref}/generate", body)
    assert st == 200 and got["text"] == want["text"], (got, want)
    # naming another model on it is refused; naming its own is fine
    st, j, _ = both.post(f"/v1/sessions/{sid}/generate", dict(body, model="tiny"))
    assert st == 400 and j["error"]["param"] == "model", j
    assert "bound to model 'tiny_gemma3'" in j["error"]["message"], j
    st, j, _ = both.post(f"/v1/sessions/{sid}/append", {"text": "x", "model": "tiny_gemma3"})
    assert st == 200, j
    # a fork stays on the model
    st, f, _ = both.post(f"/v1/sessions/{sid}/fork", {})
    assert st in (200, 201), f
    st, j, _ = both.json("GET", f"/v1/sessions/{f['id']}")
    assert j["model"] == "tiny_gemma3", j
    # the default model's sessions say so too
    sid2 = new_session(both)
    st, j, _ = both.json("GET", f"/v1/sessions/{sid2}")
    assert j["model"] == "tiny", j
    # the list has both models' sessions, ordered by id
    st, j, _ = both.json("GET", "/v1/sessions?limit=100")
    ids = [s["id"] for s in j["data"]]
    assert sid in ids and sid2 in ids and f["id"] in ids and ids == sorted(ids), j
    models = {s["id"]: s["model"] for s in j["data"]}
    assert models[sid] == "tiny_gemma3" and models[sid2] == "tiny", models
    # paging across the models' stores
    st, p1, _ = both.json("GET", "/v1/sessions?limit=1")
    assert len(p1["data"]) == 1 and p1["has_more"], p1
    st, p2, _ = both.json("GET", f"/v1/sessions?limit=100&after={p1['data'][0]['id']}")
    assert [s["id"] for s in p2["data"]] == ids[1:], (p2, ids)


def test_what_a_request_continues_picks_its_model(both):
    """A chat request on a session, and a response continuing a stored one,
    go to the model that holds them; naming another model is refused."""
    sid = new_session(both, "tiny_gemma3")
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
            "temperature": 0, "session": sid}
    st, r, _ = both.post("/v1/chat/completions", body)  # no model: the session's
    assert st == 200 and r["model"] == "tiny_gemma3", r
    st, r, _ = both.post("/v1/chat/completions", dict(body, model="tiny_gemma3"))
    assert st == 200 and r["model"] == "tiny_gemma3", r
    st, r, _ = both.post("/v1/chat/completions", dict(body, model="tiny"))
    assert st == 400 and r["error"]["param"] == "model", r
    assert f"session '{sid}' is bound to model 'tiny_gemma3'" in r["error"]["message"], r
    st, r1, _ = both.post("/v1/responses", {"model": "tiny_gemma3", "input": "hi",
                                            "max_output_tokens": 3, "temperature": 0})
    assert st == 200 and r1["model"] == "tiny_gemma3", r1
    st, r2, _ = both.post("/v1/responses", {"input": "more", "previous_response_id": r1["id"],
                                            "max_output_tokens": 3, "temperature": 0})
    assert st == 200 and r2["model"] == "tiny_gemma3", r2
    st, r3, _ = both.post("/v1/responses", {"model": "tiny", "input": "more",
                                            "previous_response_id": r1["id"],
                                            "max_output_tokens": 3})
    assert st == 400 and "bound to model 'tiny_gemma3'" in r3["error"]["message"], r3
    st, g, _ = both.json("GET", f"/v1/responses/{r1['id']}")
    assert st == 200 and g["model"] == "tiny_gemma3", g


def test_pinned_prefixes_stay_with_their_model(both):
    text = "You are a careful assistant who answers in one short sentence. " * 3
    msgs = [{"role": "user", "content": text}]
    st, p, _ = both.post("/v1/prefixes", {"model": "tiny_gemma3", "messages": msgs})
    assert st == 201, p
    st, q, _ = both.post("/v1/prefixes", {"messages": msgs})  # the default model's
    assert st == 201 and q["id"] != p["id"], q
    st, lst, _ = both.json("GET", "/v1/prefixes")
    pinned = [e["id"] for e in lst["data"] if e["pinned"]]
    assert p["id"] in pinned and q["id"] in pinned, lst
    # a request naming the prefix runs on its model; naming another is refused
    body = {"messages": msgs + [{"role": "assistant", "content": "ok"},
                                {"role": "user", "content": "go"}],
            "max_tokens": 2, "prefix": p["id"]}
    st, r, _ = both.post("/v1/chat/completions", body)
    assert st == 200 and r["model"] == "tiny_gemma3", r
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == p["tokens"], r
    st, r, _ = both.post("/v1/chat/completions", dict(body, model="tiny"))
    assert st == 400 and "prefix" in r["error"]["message"], r
    st, d, _ = both.json("DELETE", f"/v1/prefixes/{p['id']}")
    assert st == 200 and d["id"] == p["id"], d
    st, d, _ = both.json("DELETE", f"/v1/prefixes/{q['id']}")
    assert st == 200 and d["id"] == q["id"], d


def test_a_state_cannot_move_to_another_model(both):
    g = new_session(both, "tiny_gemma3")
    t = new_session(both, "tiny")
    st, hd, blob = both.request("GET", f"/v1/sessions/{g}/state")
    assert st == 200 and len(blob) > 0
    st, hd, data = both.request("PUT", f"/v1/sessions/{t}/state", body=blob, headers=OCT)
    assert st == 400, (st, data)
    j = json.loads(data)
    assert j["error"]["code"] == "state_model_mismatch", j
    assert "belongs to model 'tiny_gemma3'" in j["error"]["message"], j
    assert "bound to model 'tiny'" in j["error"]["message"], j
    # the tiny session is unchanged and still works; the blob goes back home
    st, j, _ = both.json("GET", f"/v1/sessions/{t}")
    assert st == 200 and j["model"] == "tiny", j
    g2 = new_session(both, "tiny_gemma3", text="other")
    st, hd, data = both.request("PUT", f"/v1/sessions/{g2}/state", body=blob, headers=OCT)
    assert st == 200, data


def test_sessions_of_each_model_survive_a_restart(tmp_path):
    s = Server(tmp_path, TINY, name="rs", args=["--model", TINY_GEMMA])
    try:
        g = new_session(s, "tiny_gemma3")
        t = new_session(s, "tiny")
        s.stop()
        # each model keeps its sessions in its own directory
        assert os.path.isdir(os.path.join(s.session_dir, "tiny_gemma3"))
        assert os.path.isdir(os.path.join(s.session_dir, "tiny"))
        s.start()
        for sid, model in [(g, "tiny_gemma3"), (t, "tiny")]:
            st, j, _ = s.json("GET", f"/v1/sessions/{sid}")
            assert st == 200 and j["model"] == model, j
            st, j, _ = s.post(f"/v1/sessions/{sid}/generate", {"text": "x", "max_tokens": 2,
                                                             "stream": False})
            assert st == 200, j
    finally:
        s.kill()


def test_metrics_count_every_model(both):
    before = both.metrics().get("darkserve_engine_generated_tokens_total", 0)
    for name in NAMES:
        st, j, _ = both.post("/v1/completions", {"model": name, "prompt": "a", "max_tokens": 3,
                                                 "ignore_eos": True})
        assert st == 200, j
    after = both.metrics()["darkserve_engine_generated_tokens_total"]
    assert after - before == 6, (before, after)


# ---- start-up refusals ----

def test_two_models_with_one_name_are_refused(tmp_path):
    os.symlink(TINY, tmp_path / "tiny.gguf")
    with pytest.raises(AssertionError) as e:
        Server(tmp_path, TINY, name="dup", args=["--model", str(tmp_path / "tiny.gguf")])
    assert "the same name 'tiny.gguf'" in str(e.value)


def test_an_adapter_for_several_models_is_refused(tmp_path):
    with pytest.raises(AssertionError) as e:
        Server(tmp_path, TINY, name="ad", args=["--model", TINY_GEMMA, "--adapter", TINY])
    assert "--adapter names one model's adapter" in str(e.value)


# ---- the real models together ----

def test_real_smollm2_and_gemma_together(tmp_path):
    """The two real models in one server, by their short names: Gemma's
    greedy continuation is llama.cpp's for this GGUF; SmolLM2 still answers
    as the default."""
    for p in (MODEL, GEMMA):
        assert os.path.exists(p), f"{p} missing (make model; make gemma-model)"
    s = Server(tmp_path, MODEL, name="real2", args=["--model", GEMMA], attn=None)
    try:
        st, j, _ = s.json("GET", "/v1/models")
        assert [m["id"] for m in j["data"]] == ["SmolLM2-135M-Instruct.Q4_1",
                                                "gemma-3-270m-q4_k_m"], j
        st, j, _ = s.post("/v1/completions", {"model": "gemma3-270m",
                                              "prompt": "The capital of France is",
                                              "max_tokens": 9, "temperature": 0})
        assert st == 200, j
        assert j["choices"][0]["text"].startswith(" the capital of the country of France."), j
        assert j["model"] == "gemma-3-270m-q4_k_m", j
        st, j, _ = s.post("/api/chat", {"model": "smollm2-135m", "stream": False,
                                        "messages": [{"role": "user", "content": "Hi"}],
                                        "options": {"num_predict": 4}})
        assert st == 200 and j["message"]["content"], j
        log = read_text(s.log)
        assert "ready (2 models)" in log, log
    finally:
        s.kill()


# ---- make run ----

def run_sh(model, env=None, **kw):
    import subprocess
    from ds_server import BIN
    return subprocess.run([os.path.join(ROOT, "scripts", "run.sh"), BIN, model, "0"], cwd=ROOT,
                          env=dict(os.environ, **(env or {})), capture_output=True, text=True,
                          **kw)


def test_make_run_resolves_short_names_and_lists():
    dry = {"RUN_DRY": "1"}
    r = run_sh("gemma3-270m", dry)
    assert r.returncode == 0 and "--model models/gemma-3-270m-q4_k_m.gguf --port 0" in r.stdout
    r = run_sh("smollm2-135m, GEMMA3-270M", dry)
    assert r.returncode == 0, r.stderr
    assert ("--model models/SmolLM2-135M-Instruct.Q4_1.gguf "
            "--model models/gemma-3-270m-q4_k_m.gguf") in r.stdout, r.stdout
    r = run_sh("models/SmolLM2-135M-Instruct.Q4_1.gguf", dry)  # make run's default
    assert "--model models/SmolLM2-135M-Instruct.Q4_1.gguf --port 0" in r.stdout, r.stdout
    r = run_sh(" , ", dry)
    assert r.returncode == 2 and "names no model" in r.stderr, r
    r = run_sh("no-such-model.gguf")
    assert r.returncode == 2 and "no model 'no-such-model.gguf'" in r.stderr, r


def test_make_run_checks_and_serves_gemma(tmp_path):
    """scripts/run.sh gemma3-270m: the file's SHA-256 is checked
    (scripts/fetch_gemma.sh: present and right, nothing is downloaded), then
    the server starts on it."""
    import subprocess
    from ds_server import wait_for
    assert os.path.exists(GEMMA), f"{GEMMA} missing (make gemma-model)"
    log = tmp_path / "run.log"
    with open(log, "w") as f:
        p = subprocess.Popen([os.path.join(ROOT, "scripts", "run.sh"),
                              os.environ.get("DARKSERVE_BIN", os.path.join(ROOT, "build",
                                                                           "darkserve")),
                              "gemma3-270m", "0"], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                             env=dict(os.environ, DARKSERVE_SESSION_DIR=str(tmp_path / "s")))
    try:
        ok = wait_for(lambda: "ready" in read_text(str(log)) or p.poll() is not None, 120)
        text = read_text(str(log))
        assert ok and p.poll() is None, text
        assert "gemma-3-270m-q4_k_m.gguf present (sha256 ok)" in text, text
        assert "model gemma-3-270m-q4_k_m (gemma3" in text, text
    finally:
        p.kill()
        p.wait()


def test_attention_flags_a_model_cannot_take_are_refused(tmp_path):
    """Attention flags apply to every model: one that cannot run them stops
    the start, naming the model and what to do (a memory head list names
    layers, which a sliding-window model's global kind numbers otherwise)."""
    with pytest.raises(AssertionError) as e:
        Server(tmp_path, TINY, name="attn", attn="performer",
               args=["--model", TINY_GEMMA, "--memory", "8", "--memory-heads", "0.0"])
    msg = str(e.value)
    assert "cannot load the model" in msg and "tiny_gemma3.gguf" in msg, msg
    assert "--attn auto picks each model's own" in msg, msg


def test_a_models_folder_serves_every_gguf_in_it(tmp_path):
    """--models-dir: its .gguf files join --model's (in name order; without
    --model they replace the default: test_srv_config.c)."""
    d = tmp_path / "models"
    d.mkdir()
    os.symlink(TINY_GEMMA, d / "tiny_gemma3.gguf")
    (d / "README.txt").write_text("not a model")
    s = Server(tmp_path, TINY, name="dir", args=["--models-dir", str(d)])
    try:
        st, j, _ = s.json("GET", "/v1/models")
        assert st == 200 and [m["id"] for m in j["data"]] == ["tiny", "tiny_gemma3"], j
        st, r, _ = s.post("/v1/completions", {"model": "tiny_gemma3", "prompt": "a",
                                              "max_tokens": 1})
        assert st == 200 and r["model"] == "tiny_gemma3", r
    finally:
        s.kill()
    # the same model twice (by --model and in the folder) is refused
    os.symlink(TINY, d / "tiny.gguf")
    with pytest.raises(AssertionError) as e:
        Server(tmp_path, TINY, name="dir2", args=["--models-dir", str(d)])
    assert "the same name 'tiny.gguf'" in str(e.value)
