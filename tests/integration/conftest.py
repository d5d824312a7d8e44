"""Fixtures that run the real `darkserve serve` binary (see ds_server.py):
each server starts on a free loopback port, is waited for until /health
answers 200, and is always killed at the end of its fixture."""
import pytest

from ds_server import GEMMA, MODEL, TINY, TINY_GEMMA, Server


@pytest.fixture
def servers(tmp_path):
    """Factory: servers(model=..., args=[...], session_dir=..., name=...) ->
    Server; every server it made is killed at the end of the test."""
    made = []

    def start(**kw):
        kw.setdefault("name", f"srv{len(made)}")
        s = Server(tmp_path, **kw)
        made.append(s)
        return s

    yield start
    for s in made:
        s.kill()


@pytest.fixture(scope="module", params=["llama", "gemma"])
def tiny(request, tmp_path_factory):
    """A tiny-model server shared by a module's tests, once per model family
    (the tiny random Llama and the tiny random Gemma 3): every test that
    takes it runs on both. Tests about one model's specifics take
    tiny_llama."""
    path = TINY if request.param == "llama" else TINY_GEMMA
    s = Server(tmp_path_factory.mktemp("tiny"), path, name="tiny")
    yield s
    s.kill()


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """The tiny random Llama alone, for tests about its vocabulary or
    template (ChatML, SmolLM2's special tokens)."""
    s = Server(tmp_path_factory.mktemp("tiny_llama"), TINY, name="tiny")
    yield s
    s.kill()


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m"])
def real(request, tmp_path_factory):
    """A real-model server shared by a module's tests, once per real model:
    SmolLM2-135M-Instruct and Gemma 3 270M (DARKSERVE_GEMMA_MODEL; make
    gemma-model fetches it). Tests about SmolLM2's template or outputs take
    real_smollm2."""
    path = MODEL if request.param == "smollm2-135m" else GEMMA
    s = Server(tmp_path_factory.mktemp("real"), path, name="real")
    yield s
    s.kill()


@pytest.fixture(scope="module")
def real_smollm2(tmp_path_factory):
    """The real SmolLM2 alone."""
    s = Server(tmp_path_factory.mktemp("real_smollm2"), MODEL, name="real")
    yield s
    s.kill()
